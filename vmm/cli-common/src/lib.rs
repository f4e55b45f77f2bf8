//! # cli_common
//!
//! What the two binaries of this workspace share on their command lines:
//! `vmm` (the VMM, its benches and its server) and `vmm-sim` (the
//! simulator, which `vmm sim` runs). Nothing here knows a scheduler or a
//! VM type, so both can link it whatever `vcpu_sched` build they link.
//!
//! | module | what |
//! |---|---|
//! | [`exit`] | exit statuses 0, 1, 2, whose fault an error is, the user-input error, the one-line error message |
//! | [`args`] | flag parsers with one set of limits (durations, counts, microseconds, repetitions), output-path checks, the ignored-flag error |
//! | [`term`] | standard output that survives a closed pipe ([`out!`], [`outln!`]), colour only on a terminal, the progress bar, logging set-up, clap parsing with one-line flag errors |

pub mod args;
pub mod exit;
pub mod term;
