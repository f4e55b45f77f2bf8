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
pub mod threads;
pub mod workers;

use std::any::Any;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use topology::HostTopology;
use vcpu_sched::exec::{CheckConfig, CpuMapping};
use vcpu_sched::stats::Histogram;
use vcpu_sched::{
    CpuMask, GroupId, Mitigations, Policy, SchedConfig, SchedCounters, TaskId, TaskStats,
};

use crate::vcpu::{Kicker, PortIo, Vcpu, VcpuExit};
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

/// Per-vCPU counters and latencies, written only by whoever runs the vCPU.
#[derive(Clone, Debug, Default)]
pub struct VcpuMetrics {
    /// `KVM_RUN` entries.
    pub entries: u64,
    /// Exits that blocked (HLT).
    pub blocks: u64,
    /// Sleeps.
    pub sleeps: u64,
    /// Yields.
    pub yields: u64,
    /// Doorbells rung.
    pub wakes_sent: u64,
    /// Returns from `KVM_RUN` caused by a preemption kick.
    pub preempt_kicks: u64,
    /// Sleep deadline to running again, inside the window.
    pub timer_latency: Histogram,
    /// Doorbell (or the HLT, if the doorbell came first) to running again,
    /// inside the window.
    pub doorbell_latency: Histogram,
}

/// State of a vCPU that only its runner touches.
pub struct VcpuState {
    /// The vCPU (`None` once it has ended).
    pub vcpu: Option<Vcpu>,
    /// Its metrics.
    pub m: VcpuMetrics,
}

/// One vCPU as the executors see it.
#[repr(align(128))]
pub struct VcpuSlot {
    /// VM id (index in the set).
    pub vm: usize,
    /// vCPU index in its VM.
    pub index: usize,
    /// Index over all vCPUs of the set.
    pub global: usize,
    /// Scheduling attributes.
    pub placement: Placement,
    state: Mutex<VcpuState>,
    kicker: Kicker,
    /// Its task, once created (scheduler executors).
    pub task: OnceLock<TaskId>,
    /// Set (first one wins) by a doorbell, taken when the vCPU runs again.
    doorbell_at: AtomicU64,
    exited: AtomicBool,
    /// Exits from `KVM_RUN` so far (readable while the vCPU runs).
    progress: AtomicU64,
    /// A wake not yet consumed (host executor).
    pub(crate) token: AtomicBool,
    /// The thread running it (host executor).
    pub(crate) thread: OnceLock<std::thread::Thread>,
}

impl VcpuSlot {
    /// Locks the runner state. Uncontended by design: only the vCPU's
    /// runner takes it.
    pub fn lock(&self) -> MutexGuard<'_, VcpuState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Tries to lock (executors detect a vCPU entered twice with it).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, VcpuState>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
    /// Its kicker.
    pub fn kicker(&self) -> &Kicker {
        &self.kicker
    }
    /// Has it ended?
    pub fn exited(&self) -> bool {
        self.exited.load(Ordering::Acquire)
    }
}

/// One VM of a set.
pub struct VmEntry {
    /// Index in the set.
    pub id: usize,
    /// Name.
    pub name: String,
    /// Stop requests.
    pub control: Arc<VmControl>,
    /// Exit mapping.
    pub mapper: Arc<dyn ExitMapper>,
    /// Global index of vCPU 0.
    pub first: usize,
    /// vCPUs.
    pub nvcpus: usize,
    /// Its task group (scheduler executors).
    pub group: OnceLock<GroupId>,
    live: AtomicUsize,
    finished_at: AtomicU64,
    keep: Mutex<Option<Box<dyn Any + Send>>>,
}

impl VmEntry {
    /// Set-clock time its last vCPU ended, if it has.
    pub fn finished_at(&self) -> Option<u64> {
        match self.finished_at.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }
    /// vCPUs still running.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }
    /// Why it stopped, if it failed.
    pub fn failure(&self) -> Option<StopReason> {
        self.control.reason()
    }
    /// Has its memory and fds been released?
    pub fn torn_down(&self) -> bool {
        self.keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

pub use vcpu_sched::workload::Window;

/// Every VM and vCPU of one run, the clock, and the stop flag. Shared by
/// the executor's threads and the code that drives the run.
pub struct VmSet {
    epoch: Instant,
    vms: Vec<Arc<VmEntry>>,
    slots: Vec<Arc<VcpuSlot>>,
    started: AtomicBool,
    started_at: AtomicU64,
    stopping: AtomicBool,
    /// Latencies are recorded inside this window only (on the set's
    /// clock).
    pub window: Window,
}

impl fmt::Debug for VmSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmSet")
            .field("vms", &self.vms.len())
            .field("vcpus", &self.slots.len())
            .finish()
    }
}

impl VmSet {
    /// Takes the VMs. Placement lists must have one entry, or one per vCPU.
    pub fn new(vms: Vec<GuestVm>) -> Result<Arc<Self>, TaskError> {
        let mut entries = Vec::with_capacity(vms.len());
        let mut slots = Vec::new();
        for (id, g) in vms.into_iter().enumerate() {
            let n = g.vcpus.len();
            if n == 0 {
                return Err(TaskError::Input(format!("VM {} has no vCPUs", g.name)));
            }
            if g.placement.len() != 1 && g.placement.len() != n {
                return Err(TaskError::Input(format!(
                    "VM {}: {} placements for {n} vCPUs (give 1 or {n})",
                    g.name,
                    g.placement.len()
                )));
            }
            let first = slots.len();
            for (i, v) in g.vcpus.into_iter().enumerate() {
                let placement = g.placement[if g.placement.len() == 1 { 0 } else { i }].clone();
                slots.push(Arc::new(VcpuSlot {
                    vm: id,
                    index: i,
                    global: first + i,
                    placement,
                    kicker: v.kicker(),
                    state: Mutex::new(VcpuState {
                        vcpu: Some(v),
                        m: VcpuMetrics::default(),
                    }),
                    task: OnceLock::new(),
                    doorbell_at: AtomicU64::new(0),
                    exited: AtomicBool::new(false),
                    progress: AtomicU64::new(0),
                    token: AtomicBool::new(false),
                    thread: OnceLock::new(),
                }));
            }
            entries.push(Arc::new(VmEntry {
                id,
                name: g.name,
                control: g.control,
                mapper: g.mapper,
                first,
                nvcpus: n,
                group: OnceLock::new(),
                live: AtomicUsize::new(n),
                finished_at: AtomicU64::new(0),
                keep: Mutex::new(Some(g.keep)),
            }));
        }
        Ok(Arc::new(Self {
            epoch: Instant::now(),
            vms: entries,
            slots,
            started: AtomicBool::new(false),
            started_at: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            window: Window::default(),
        }))
    }

    /// ns since the set was made (never 0).
    #[inline]
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }
    /// The VMs.
    pub fn vms(&self) -> &[Arc<VmEntry>] {
        &self.vms
    }
    /// Every vCPU, VM by VM.
    pub fn slots(&self) -> &[Arc<VcpuSlot>] {
        &self.slots
    }
    /// vCPU `k` of VM `vm`.
    pub fn slot(&self, vm: usize, k: usize) -> Option<&Arc<VcpuSlot>> {
        let e = self.vms.get(vm)?;
        if k >= e.nvcpus {
            return None;
        }
        self.slots.get(e.first + k)
    }
    /// Have the vCPUs been let go?
    #[inline]
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }
    /// When they were let go (set clock).
    pub fn started_at(&self) -> u64 {
        self.started_at.load(Ordering::Acquire)
    }
    pub(crate) fn mark_started(&self) {
        self.started_at.store(self.now(), Ordering::Release);
        self.started.store(true, Ordering::Release);
    }
    /// Is the whole set stopping?
    #[inline]
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
    /// Opens the measurement window now.
    pub fn open_window(&self) -> u64 {
        let t = self.now();
        self.window.open(t);
        t
    }
    /// Exits from `KVM_RUN` of every vCPU so far, by global index; read
    /// while the vCPUs run (progress checks).
    pub fn progress_snapshot(&self) -> Vec<u64> {
        self.slots
            .iter()
            .map(|s| s.progress.load(Ordering::Relaxed))
            .collect()
    }
    /// Closes it now.
    pub fn close_window(&self) -> u64 {
        let t = self.now();
        self.window.close(t);
        t
    }
    /// Asks every vCPU to end: sets the flag and kicks them all (blocked
    /// ones are woken by the executor's shutdown).
    pub fn request_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for s in &self.slots {
            s.kicker.kick();
        }
    }
    /// VMs whose every vCPU has ended.
    pub fn finished_vms(&self) -> usize {
        self.vms.iter().filter(|v| v.live() == 0).count()
    }
    /// VMs that failed, with their reasons.
    pub fn failures(&self) -> Vec<(String, StopReason)> {
        self.vms
            .iter()
            .filter_map(|v| v.failure().map(|r| (v.name.clone(), r)))
            .collect()
    }

    /// Records a doorbell to vCPU `k` of `vm` (for the latency), returning
    /// its slot if it exists and has not ended.
    fn doorbell(&self, vm: usize, k: usize, now: u64) -> Option<&Arc<VcpuSlot>> {
        let s = self.slot(vm, k)?;
        if s.exited() {
            return None;
        }
        let _ = s
            .doorbell_at
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        Some(s)
    }

    /// Stops VM `vm` for `reason`: records it (first reason wins), kicks
    /// its vCPUs, and wakes each through `wake` so that blocked ones end.
    fn fail_vm(&self, vm: usize, reason: StopReason, wake: &dyn Fn(&VcpuSlot)) {
        let e = &self.vms[vm];
        if e.control.request_stop(reason.clone()) {
            tracing::warn!(vm = %e.name, "VM stopped: {reason}");
        }
        for s in &self.slots[e.first..e.first + e.nvcpus] {
            wake(s);
        }
    }

    /// A vCPU's runner is done with it: drops the vCPU, and when it was
    /// the VM's last, tears the VM down.
    fn vcpu_exited(&self, slot: &VcpuSlot, st: &mut VcpuState) {
        st.vcpu = None;
        if slot.exited.swap(true, Ordering::AcqRel) {
            return;
        }
        let e = &self.vms[slot.vm];
        if e.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            e.finished_at.store(self.now(), Ordering::Release);
            let keep = e.keep.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(keep);
        }
    }

    /// Takes the metrics of every vCPU (after the executor has stopped).
    pub fn take_metrics(&self) -> Vec<VcpuMetrics> {
        self.slots
            .iter()
            .map(|s| std::mem::take(&mut s.lock().m))
            .collect()
    }
}

/// How a blocked vCPU came back, for the latency it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resume {
    /// From a HLT that started at this time.
    Halt(u64),
    /// From a sleep due at this time.
    Timer(u64),
}

/// Records the latency of a vCPU that runs again after `how`.
pub(crate) fn resumed(set: &VmSet, slot: &VcpuSlot, m: &mut VcpuMetrics, how: Resume) {
    let now = set.now();
    match how {
        Resume::Halt(blocked_at) => {
            let d = slot.doorbell_at.swap(0, Ordering::AcqRel);
            if d != 0 && set.window.inside(now) {
                m.doorbell_latency
                    .record(now.saturating_sub(d.max(blocked_at)));
            }
        }
        Resume::Timer(due) => {
            if set.window.inside(now) {
                m.timer_latency.record(now.saturating_sub(due));
            }
        }
    }
}

/// Enters the guest once and maps what comes back. The caller made its
/// preemption check right before.
pub(crate) fn enter(set: &VmSet, vm: &VmEntry, st: &mut VcpuState) -> Action {
    if set.stopping() || vm.control.is_stopping() {
        return Action::Exit;
    }
    let Some(vcpu) = st.vcpu.as_mut() else {
        return Action::Exit;
    };
    st.m.entries += 1;
    let r = vcpu.run(vm.mapper.io());
    set.slots[vm.first + vcpu.index()]
        .progress
        .fetch_add(1, Ordering::Relaxed);
    match r {
        Ok(VcpuExit::Kicked) => {
            if set.stopping() || vm.control.is_stopping() {
                return Action::Exit;
            }
            match vm.mapper.on_kicked(vcpu) {
                Some(a) => a,
                None => {
                    st.m.preempt_kicks += 1;
                    Action::Continue
                }
            }
        }
        Ok(exit) => {
            let a = vm.mapper.map_exit(vcpu, exit);
            match a {
                Action::Block => st.m.blocks += 1,
                Action::Sleep(_) => st.m.sleeps += 1,
                Action::Yield => st.m.yields += 1,
                Action::Wake(_) => st.m.wakes_sent += 1,
                _ => {}
            }
            a
        }
        Err(e) => Action::Fail(StopReason::VcpuFailed {
            vcpu: vcpu.index(),
            what: e.to_string(),
        }),
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
            ExecutorKind::Host => Inner::Host(host::HostRun::start(opts, &set)?),
        };
        Ok(Self { set, inner })
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
            Inner::Host(_) => None,
        }
    }

    /// Wakes vCPU `k` of VM `vm` from outside the executor (an I/O thread,
    /// a halt poller). False if there is no such live vCPU.
    pub fn wake(&self, vm: usize, k: usize) -> bool {
        let Some(s) = self.set.doorbell(vm, k, self.set.now()) else {
            return false;
        };
        match &self.inner {
            Inner::Threads(t) => t.wake_slot(s),
            Inner::Workers(w) => w.wake_slot(s, None),
            Inner::Host(_) => host::wake_slot(s),
        }
        true
    }

    /// Stops every vCPU and the executor; fails if vCPUs do not end within
    /// `timeout`.
    pub fn stop(self, timeout: Duration) -> Result<ExecOutcome, TaskError> {
        self.set.request_stop();
        match self.inner {
            Inner::Threads(t) => t.shutdown(timeout),
            Inner::Workers(w) => w.shutdown(timeout),
            Inner::Host(h) => h.shutdown(timeout),
        }
    }
}
