//! KVM vCPUs as `vcpu_sched` tasks: the glue between a vCPU's exits and
//! the scheduler, and the executors that run many VMs' vCPUs in one
//! process.
//!
//! # The model
//! A vCPU is a task; a VM is a task group (so per-node group load, fix 6,
//! sees real VMs). Running a vCPU means entering `KVM_RUN`; what comes
//! back is turned into a scheduler [`Action`] by the VM's [`ExitMapper`]:
//!
//! | exit (micro-guests) | action | scheduler |
//! |---|---|---|
//! | `HLT` | [`Action::Block`] | block until woken; a wake that came first is remembered |
//! | doorbell port | [`Action::Wake`] | wake vCPU `k` of the same VM, keep running |
//! | sleep port | [`Action::Sleep`] | block, with a timer that wakes |
//! | yield port | [`Action::Yield`] | requeue behind equal priorities |
//! | kick (`EINTR`) | [`Action::Continue`] | a preemption checkpoint, then back in |
//! | done port | [`Action::Exit`] | the task ends; the VM goes on |
//! | triple fault, bad request, KVM error | [`Action::Fail`] | the VM is stopped, reported and torn down |
//!
//! The mapper is all a guest type has to provide. A Linux guest with the
//! in-kernel LAPIC maps `HLT` nowhere (it stays in KVM) and instead
//! answers a kick with [`Action::Block`] when it finds the vCPU halted
//! ([`ExitMapper::on_kicked`]); a thread outside the executor can wake a
//! blocked vCPU with [`Running::wake`].
//!
//! # Preemption
//! The scheduler preempts a running vCPU with its [`Kicker`](crate::vcpu::Kicker):
//! `immediate_exit` plus a signal, so `KVM_RUN` returns `EINTR` (see
//! [`crate::vcpu`]). Every executor checks for pending scheduler work
//! right before `KVM_RUN`; a kick that lands after the check is caught by
//! `immediate_exit`.
//!
//! # Executors ([`ExecutorKind`])
//! * `threads` — `vcpu_sched`'s [`ThreadsExecutor`](vcpu_sched::exec::ThreadsExecutor):
//!   one OS thread per vCPU that runs only while it holds its CPU's run
//!   slot; switching hands the slot to the next thread.
//! * `workers` — [`workers::WorkerExecutor`]: one worker thread per
//!   logical CPU that runs whichever vCPU the scheduler picks, calling
//!   `KVM_RUN` on that vCPU's fd itself (M:N). No host context switch
//!   between vCPUs of one CPU.
//! * `host` — plain 1:1 vCPU threads scheduled by the host kernel
//!   (`SCHED_OTHER`, or `SCHED_FIFO` for RT vCPUs): what Cloud Hypervisor
//!   and Firecracker do. The baseline; no `vcpu_sched` at all.
//!
//! Why `workers` is the default is measured in `docs/results-vcpus.md`.

pub mod host;
pub mod linux;
mod set;
pub mod threads;
pub mod workers;

pub(crate) use set::{enter, resumed, Resume, GATE_OPEN, GATE_WAITING};
pub use set::{Stages, VcpuMetrics, VcpuSlot, VcpuState, VmEntry, VmSet, Window, STAGES};

use std::any::Any;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use topology::HostTopology;
use vcpu_sched::exec::{CheckConfig, CpuMapping};
use vcpu_sched::{CpuMask, Mitigations, Policy, SchedConfig, SchedCounters, TaskStats};

use crate::vcpu::{PortIo, Vcpu, VcpuExit};
use crate::vm::{StopReason, VmControl};

/// What the executor does after a vCPU exit.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Back into the guest (after a preemption checkpoint if one is due).
    Continue,
    /// Wait until woken (returns at once if a wake is pending).
    Block,
    /// Block for this many nanoseconds.
    Sleep(u64),
    /// Let runnable tasks of the same priority go first.
    Yield,
    /// Wake vCPU `k` of the same VM, then continue.
    Wake(usize),
    /// This vCPU is finished; the rest of the VM goes on.
    Exit,
    /// Stop the whole VM: report the reason, end its vCPUs, tear it down.
    Fail(StopReason),
}

/// How one VM's vCPU exits become scheduler actions. One per VM, shared
/// by its vCPUs (so `Send + Sync`). Called on the thread running the vCPU;
/// must not block.
pub trait ExitMapper: Send + Sync {
    /// The device side the vCPUs run against.
    fn io(&self) -> &dyn PortIo;
    /// Maps an exit of `vcpu` (never [`VcpuExit::Kicked`]).
    fn map_exit(&self, vcpu: &Vcpu, exit: VcpuExit) -> Action;
    /// `KVM_RUN` returned because of a kick. `Some` for a reason of the
    /// mapper's own (a fault its device side recorded; a halted vCPU found
    /// through `KVM_GET_MP_STATE` or the stats fd); `None` when it was the
    /// scheduler's preemption (the default).
    fn on_kicked(&self, _vcpu: &Vcpu) -> Option<Action> {
        None
    }
    /// Called on the thread about to enter `KVM_RUN` for `vcpu`, right
    /// before it does: a mapper whose other threads issue ioctls on a
    /// vCPU that is out of the guest (the Linux halt poller's probe) takes
    /// the vCPU back here. Wrapping mappers must forward it.
    fn before_entry(&self, _vcpu: &Vcpu) {}
}

/// Scheduling attributes of one vCPU task.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The scheduler policy (and, for the host executor, the thread's).
    pub policy: Policy,
    /// Logical CPUs it may run on (`None`: all).
    pub affinity: Option<CpuMask>,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            policy: Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
            affinity: None,
        }
    }
}

/// A VM handed to an executor.
pub struct GuestVm {
    /// Its name (reports, group name).
    pub name: String,
    /// The vCPUs, index order.
    pub vcpus: Vec<Vcpu>,
    /// Exit mapping and device side.
    pub mapper: Arc<dyn ExitMapper>,
    /// Stop requests (its vCPUs' kickers registered).
    pub control: Arc<VmControl>,
    /// One entry per vCPU, or a single entry for all.
    pub placement: Vec<Placement>,
    /// Dropped when the last vCPU has ended: the VM fd, memory, ...
    pub keep: Box<dyn Any + Send>,
}

/// The shutdown every executor shares: asks the set to stop, then every
/// 2 ms wakes (`wake`) and kicks each vCPU that has not ended, until
/// `done()` says the executor's vCPUs are all gone. After `timeout`, a
/// [`TaskError::Stuck`] names (`describe`) up to 8 of those left.
pub(crate) fn drain(
    set: &VmSet,
    timeout: Duration,
    wake: &dyn Fn(&VcpuSlot),
    describe: &dyn Fn(&VcpuSlot) -> String,
    done: &mut dyn FnMut() -> bool,
) -> Result<(), TaskError> {
    set.request_stop();
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return Ok(());
        }
        for s in set.slots().iter().filter(|s| !s.exited()) {
            wake(s);
            s.kicker().kick();
        }
        if Instant::now() > deadline {
            let left: Vec<&Arc<VcpuSlot>> = set.slots().iter().filter(|s| !s.exited()).collect();
            let names: Vec<String> = left.iter().take(8).map(|s| describe(s)).collect();
            return Err(TaskError::Stuck(format!(
                "{} vCPUs did not end within {timeout:?} of the stop: {}",
                left.len(),
                names.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Errors of the glue and its executors.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A bad request.
    #[error("{0}")]
    Input(String),
    /// The scheduler refused.
    #[error(transparent)]
    Sched(#[from] vcpu_sched::SchedError),
    /// An OS call failed.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// vCPUs did not end in time.
    #[error("{0}")]
    Stuck(String),
    /// The topology (reading the host's, or a spec).
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// A vCPU (the kick signal).
    #[error(transparent)]
    Vcpu(#[from] crate::vcpu::VcpuError),
}

/// Which executor runs the vCPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// One thread per vCPU handing run slots over (`vcpu_sched`'s
    /// threads executor).
    Threads,
    /// One worker thread per logical CPU running vCPU fds itself (M:N).
    Workers,
    /// Plain 1:1 vCPU threads scheduled by the host kernel.
    Host,
}

impl ExecutorKind {
    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Threads => "threads",
            ExecutorKind::Workers => "workers",
            ExecutorKind::Host => "host",
        }
    }
}

impl fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ExecutorKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "threads" => Ok(ExecutorKind::Threads),
            "workers" => Ok(ExecutorKind::Workers),
            "host" => Ok(ExecutorKind::Host),
            _ => Err(format!(
                "unknown executor {s:?}; use workers (M:N), threads (a thread per vCPU) or host (the host kernel schedules)"
            )),
        }
    }
}

/// How to run a set.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Which executor.
    pub kind: ExecutorKind,
    /// The topology the scheduler manages.
    pub topology: Arc<HostTopology>,
    /// Logical to host CPUs.
    pub mapping: CpuMapping,
    /// The fixes.
    pub mitigations: Mitigations,
    /// Scheduler tunables.
    pub sched: SchedConfig,
    /// Invariant checker (scheduler executors).
    pub check: Option<CheckConfig>,
    /// Tick period.
    pub tick: Duration,
    /// `workers` and `threads`: run the executor's threads (workers, or
    /// vCPU and idle threads) at host `SCHED_FIFO` with this priority (the
    /// clock thread one above), as the host baseline runs RT vCPU threads;
    /// `None`: `SCHED_OTHER`. Falls back to `SCHED_OTHER`
    /// with a warning where not permitted.
    pub host_rt: Option<u8>,
}

impl ExecOptions {
    /// Defaults: the `workers` executor, baseline mitigations, no checker.
    pub fn new(topology: Arc<HostTopology>, mapping: CpuMapping) -> Self {
        Self {
            kind: ExecutorKind::Workers,
            topology,
            mapping,
            mitigations: Mitigations::none(),
            sched: SchedConfig::default(),
            check: None,
            tick: Duration::from_millis(1),
            host_rt: None,
        }
    }

    /// The host CPU logical CPU `cpu` runs on.
    pub fn host_cpu(&self, cpu: u32) -> u32 {
        match &self.mapping {
            CpuMapping::Host => self.topology.os_index(cpu),
            CpuMapping::Emulated { real } => real[cpu as usize % real.len()],
        }
    }
}

/// What an executor reports when it stops.
#[derive(Clone, Debug, Default)]
pub struct ExecOutcome {
    /// The scheduler's per-task statistics, by global vCPU index (`None`
    /// for the host executor).
    pub tasks: Vec<Option<TaskStats>>,
    /// Host run-queue statistics per vCPU thread (host executor): time on
    /// CPU and time waiting, from `/proc/thread-self/schedstat`.
    pub host_schedstat: Vec<Option<(u64, u64)>>,
    /// Scheduler counters, summed.
    pub counters: SchedCounters,
    /// Per CPU: ns inside `schedule`.
    pub sched_ns_per_cpu: Vec<u64>,
    /// Per CPU: `schedule` calls.
    pub sched_calls_per_cpu: Vec<u64>,
    /// Invariant violations (empty unless something is broken).
    pub violations: Vec<String>,
    /// Checker snapshots taken.
    pub checks: u64,
    /// Failed affinity changes.
    pub pin_errors: u64,
}

/// A set running on an executor.
pub struct Running {
    set: Arc<VmSet>,
    inner: Inner,
}

enum Inner {
    Threads(threads::ThreadsRun),
    Workers(workers::WorkerExecutor),
    /// A set attached to a shared pool (other sets run on it too).
    Pooled(Arc<workers::WorkerPool>),
    Host(host::HostRun),
}

impl Running {
    /// Creates the tasks (or threads) of every vCPU and lets them go.
    pub fn start(opts: &ExecOptions, set: Arc<VmSet>) -> Result<Self, TaskError> {
        if set.started() {
            return Err(TaskError::Input("this set has already run".into()));
        }
        let inner = match opts.kind {
            ExecutorKind::Threads => Inner::Threads(threads::ThreadsRun::start(opts, &set)?),
            ExecutorKind::Workers => Inner::Workers(workers::WorkerExecutor::start(opts, &set)?),
            ExecutorKind::Host => {
                host::warn_rt_oversubscribed(&set);
                let ho = host::HostOptions::for_executor(opts, &set);
                Inner::Host(host::HostRun::start(&ho, &set)?)
            }
        };
        Ok(Self { set, inner })
    }

    /// Attaches the set's vCPUs to a running shared pool (made with
    /// `VmSet::new_on(.., pool.epoch())`); [`Running::stop`] detaches it
    /// again and leaves the pool running.
    pub fn start_on(pool: &Arc<workers::WorkerPool>, set: Arc<VmSet>) -> Result<Self, TaskError> {
        pool.attach(&set)?;
        Ok(Self {
            set,
            inner: Inner::Pooled(pool.clone()),
        })
    }

    /// The set.
    pub fn set(&self) -> &Arc<VmSet> {
        &self.set
    }

    /// Scheduler counters so far (`None` for the host executor).
    pub fn counters(&self) -> Option<SchedCounters> {
        match &self.inner {
            Inner::Threads(t) => Some(t.counters()),
            Inner::Workers(w) => Some(w.counters()),
            Inner::Pooled(p) => Some(p.counters()),
            Inner::Host(_) => None,
        }
    }

    /// Each vCPU's scheduler statistics so far (run delay, wake-to-run
    /// latency, migrations), by global index; read while the set runs.
    /// `None` for the host executor, or a vCPU without a task.
    pub fn task_stats(&self) -> Vec<Option<TaskStats>> {
        let sched = match &self.inner {
            Inner::Threads(t) => t.scheduler(),
            Inner::Workers(w) => w.scheduler(),
            Inner::Pooled(p) => p.scheduler(),
            Inner::Host(_) => return vec![None; self.set.slots().len()],
        };
        self.set
            .slots()
            .iter()
            .map(|s| s.task.get().and_then(|t| sched.task_stats(*t).ok()))
            .collect()
    }

    /// Wakes vCPU `k` of VM `vm` from outside the executor (an I/O thread,
    /// a halt poller). False if there is no such live vCPU.
    pub fn wake(&self, vm: usize, k: usize) -> bool {
        let Some(s) = self.set.doorbell(vm, k, self.set.now()) else {
            return false;
        };
        self.wake_slot(s);
        self.set.woken(s);
        true
    }

    fn wake_slot(&self, s: &VcpuSlot) {
        match &self.inner {
            Inner::Threads(t) => t.wake_slot(s),
            Inner::Workers(w) => w.wake_slot(s, None),
            Inner::Pooled(p) => p.wake_slot(s, None),
            Inner::Host(_) => host::wake_slot(s),
        }
    }

    /// Pauses VM `vm` of the set: its vCPUs leave the guest at their next
    /// exit (running ones are kicked) and stay blocked, off every CPU,
    /// until [`Running::resume`]. False if it was already paused.
    pub fn pause(&self, vm: usize) -> bool {
        self.set.pause_vm(vm)
    }

    /// Resumes paused VM `vm`: wakes exactly the vCPUs the pause blocked.
    /// False if it was not paused.
    pub fn resume(&self, vm: usize) -> bool {
        self.set.resume_vm(vm, &|s| self.wake_slot(s))
    }

    /// Stops every vCPU and the executor; fails if vCPUs do not end within
    /// `timeout`.
    pub fn stop(self, timeout: Duration) -> Result<ExecOutcome, TaskError> {
        self.set.request_stop();
        match self.inner {
            Inner::Threads(t) => t.shutdown(timeout),
            Inner::Workers(w) => w.shutdown(timeout),
            Inner::Pooled(p) => {
                let tasks = p.detach(&self.set, timeout)?;
                Ok(ExecOutcome {
                    tasks,
                    counters: p.counters(),
                    violations: p.violations(),
                    ..ExecOutcome::default()
                })
            }
            Inner::Host(h) => h.shutdown(timeout),
        }
    }
}
