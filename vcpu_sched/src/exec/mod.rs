//! Executors: what drives the scheduler core.
//!
//! The core ([`crate::Scheduler`]) owns no threads. An executor holds, for
//! each CPU, a *run slot*; whoever holds it calls
//! [`Scheduler::schedule`](crate::Scheduler::schedule) when its task blocks,
//! yields, exits or is kicked, and hands the slot to the task the core
//! picks. [`threads`] is the one-OS-thread-per-task executor; a per-CPU
//! worker that runs several vCPU file descriptors itself (M:N), or a
//! deterministic simulator, drives the same core through the same calls.

/// The `expect` message of an executor's scheduler calls with its own CPU
/// ids: those come from the scheduler's topology, so a
/// [`NoSuchCpu`](crate::SchedError::NoSuchCpu) there is a broken invariant
/// of the executor, not a user error.
pub const CPU_OK: &str = "an executor's CPU ids are its scheduler's own";

pub mod clock;
#[cfg(all(not(loom), sim))]
pub mod sim;
pub mod threads;

pub use clock::{
    current_tid, run_checker, run_clock, runnable_thread, thread_cpu_ns, ClockHost, ClockPeriods,
    TimerQueue,
};
pub use threads::{
    allowed_host_cpus, pin_current_thread, set_current_thread_policy, set_host_rt, CheckConfig,
    CpuMapping, ExecConfig, ExecReport, FlagKick, KickHook, TaskCtx, ThreadsExecutor,
};
