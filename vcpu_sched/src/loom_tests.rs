//! loom model checks (filled in with the loom step).
