//! Executors: what drives the scheduler core.
//!
//! The core ([`crate::Scheduler`]) owns no threads. An executor runs task
//! bodies ([`Body`]: `enter() -> Action`, with [`Hooks`] to preempt a
//! body from outside) and tells the core what they do. Every executor runs
//! every body, KVM vCPUs and synthetic workload tasks alike:
//!
//! | executor | threads | a switch between tasks on a CPU |
//! |---|---|---|
//! | [`WorkerPool`] (`workers`, M:N) | one worker per CPU | a return from one body and a call of the next |
//! | [`ThreadsExecutor`] (`threads`) | one per task, plus an idle context per CPU | a run-slot hand-over between two threads |
//! | [`HostExecutor`] (`host`) | one per task, scheduled by the host kernel | the host kernel's; no `vcpu_sched` |
//! | `sim` (simulator builds) | none: one event loop in virtual time | an event |
//!
//! The two threaded scheduler executors share one run-slot and kick
//! protocol (`exec::shared`) and one clock thread ([`clock`]); an
//! [`Action`] becomes executor work in one place ([`body`]).

/// The `expect` message of an executor's scheduler calls with its own CPU
/// ids: those come from the scheduler's topology, so a
/// [`NoSuchCpu`](crate::SchedError::NoSuchCpu) there is a broken invariant
/// of the executor, not a user error.
pub const CPU_OK: &str = "an executor's CPU ids are its scheduler's own";

pub mod body;
pub mod clock;
pub mod config;
pub mod host;
pub(crate) mod shared;
#[cfg(all(not(loom), sim))]
pub mod sim;
pub mod threads;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use topology::HostTopology;

pub use body::{Action, BlockPath, Body, Cx, Hooks, Spawner, TaskEnd};
pub use clock::{
    current_tid, run_checker, run_clock, runnable_thread, thread_cpu_ns, ClockHost, ClockPeriods,
    HostSchedstat, TimerQueue,
};
pub use config::{CheckConfig, CpuMapping, ExecConfig, ExecReport, ExecutorKind};
pub use host::{HostExecutor, HostThread};
pub use threads::ThreadsExecutor;
pub use workers::WorkerPool;

pub use crate::os_thread::{
    allowed_host_cpus, pin_current_thread, set_current_thread_policy, set_host_rt,
};

use crate::config::SchedConfig;
use crate::error::Result;
use crate::mitigations::Mitigations;
use crate::sched::Scheduler;

/// Any executor, for code that runs a workload on whichever one it is
/// given.
pub enum Executor {
    /// M:N workers.
    Workers(WorkerPool),
    /// One thread per task with run slots.
    Threads(ThreadsExecutor),
    /// Plain host threads.
    Host(HostExecutor),
}

impl Executor {
    /// Starts an executor of `kind` for `topo` (the host executor ignores
    /// `mit`; it has no scheduler).
    pub fn start(
        kind: ExecutorKind,
        topo: Arc<HostTopology>,
        mit: Mitigations,
        sched: SchedConfig,
        cfg: &ExecConfig,
    ) -> Result<Self> {
        Ok(match kind {
            ExecutorKind::Workers => Executor::Workers(WorkerPool::start(topo, mit, sched, cfg)?),
            ExecutorKind::Threads => {
                Executor::Threads(ThreadsExecutor::new(topo, mit, sched, cfg.clone())?)
            }
            ExecutorKind::Host => {
                let max = sched.max_tasks;
                Executor::Host(HostExecutor::new(topo, cfg, max)?)
            }
        })
    }

    /// Which kind it is.
    pub fn kind(&self) -> ExecutorKind {
        match self {
            Executor::Workers(_) => ExecutorKind::Workers,
            Executor::Threads(_) => ExecutorKind::Threads,
            Executor::Host(_) => ExecutorKind::Host,
        }
    }

    /// Its scheduler (`None`: the host executor).
    pub fn scheduler(&self) -> Option<&Arc<Scheduler>> {
        match self {
            Executor::Workers(w) => Some(w.scheduler()),
            Executor::Threads(t) => Some(t.scheduler()),
            Executor::Host(_) => None,
        }
    }

    /// The host kernel's schedstat of task `t`'s thread (the host
    /// executor; `None` for the others, whose tasks' times are the
    /// scheduler's `TaskStats`).
    pub fn host_schedstat(&self, t: crate::task::TaskId) -> Option<clock::HostSchedstat> {
        match self {
            Executor::Host(h) => h.task_schedstat(t),
            _ => None,
        }
    }

    /// A handle that wakes this executor's tasks from any thread, for as
    /// long as the holder likes (see [`RemoteWaker`]).
    pub fn remote_waker(&self) -> RemoteWaker {
        match self {
            Executor::Workers(w) => w.remote_waker(),
            Executor::Threads(t) => t.remote_waker(),
            Executor::Host(h) => h.remote_waker(),
        }
    }

    /// The executor as a task spawner.
    pub fn spawner(&self) -> &dyn Spawner {
        match self {
            Executor::Workers(w) => w,
            Executor::Threads(t) => t,
            Executor::Host(h) => h,
        }
    }

    /// Asks every body to end, waits (at most `timeout`) and stops.
    pub fn shutdown(self, timeout: Duration) -> Result<ExecReport> {
        match self {
            Executor::Workers(w) => w.shutdown(timeout),
            Executor::Threads(t) => t.shutdown(timeout),
            Executor::Host(h) => h.shutdown(timeout),
        }
    }
}

/// Wakes tasks of one executor from threads outside it (a device's I/O
/// thread raising an interrupt), as [`Spawner::wake`] does, but owned:
/// it can be cloned and kept where a borrow of the executor cannot (in a
/// device, for the VM's lifetime). It holds the executor's scheduler and
/// shared state, not its threads or task bodies; a wake after the
/// executor has shut down changes nothing that runs.
#[derive(Clone)]
pub struct RemoteWaker(Arc<dyn Fn(crate::task::TaskId) -> bool + Send + Sync>);

impl RemoteWaker {
    pub(crate) fn new(f: impl Fn(crate::task::TaskId) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Wakes task `t`: true if it was blocked. A task that is not
    /// blocked keeps the wake for its next block (one deep), as for every
    /// executor wake.
    pub fn wake(&self, t: crate::task::TaskId) -> bool {
        (self.0)(t)
    }
}

impl std::fmt::Debug for RemoteWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteWaker")
    }
}
