//! Executors (threads executor arrives next).
