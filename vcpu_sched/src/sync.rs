//! Atomics that loom can model.
//!
//! The lock-free parts that the loom tests check (the wake list and the idle
//! accounting, with the CPU masks they use) take their atomics from here:
//! `std` normally, `loom` under `--cfg loom`. Everything else uses `std`
//! directly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
