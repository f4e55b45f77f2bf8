//! Running a [`VmSet`] on an executor: its vCPUs become tasks (a task
//! group per VM), they run until stopped, and they leave whole.
//!
//! [`Running`] is a set on an executor of its own (`vmm run`, `vmm
//! bench`); [`VcpuPool`] is one M:N executor that many sets join and
//! leave while the others run (`vmm serve`: one set per booted VM, all
//! sharing one scheduler and its fixes).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use topology::HostTopology;
use vcpu_sched::exec::{
    CheckConfig, CpuMapping, ExecConfig, ExecReport, Executor, ExecutorKind, HostSchedstat,
    HostThread,
};
use vcpu_sched::{Mitigations, SchedConfig, SchedCounters, Scheduler, TaskId, TaskSpec, TaskStats};

use super::body::{VcpuBody, VcpuHooks};
use super::poll_hub::PollHub;
use super::{TaskError, VcpuSlot, VmSet};
use crate::vcpu::block_watch::BlockWatch;

/// The scheduler executors' tick period unless told otherwise
/// ([`ExecOptions::tick`]).
pub const DEFAULT_TICK: Duration = Duration::from_millis(1);

/// How often the halt poller probes the vCPUs of Linux VMs unless told
/// otherwise ([`ExecOptions::halt_poll`]; `vcpu_body::linux`).
pub const DEFAULT_HALT_POLL: Duration = Duration::from_millis(1);

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
    /// `None`: `SCHED_OTHER`. Falls back to `SCHED_OTHER` with a warning
    /// where not permitted.
    pub host_rt: Option<u8>,
    /// `host`: each vCPU's thread pinned to these host CPUs, by global
    /// index (`None`: from its placement's affinity, if any).
    pub host_pins: Option<Vec<Vec<u32>>>,
    /// `host`: a policy the host refuses fails the start instead of
    /// leaving the thread `SCHED_OTHER` with a warning.
    pub strict_policy: bool,
    /// `workers`: the timer advance
    /// ([`ExecConfig::timer_advance`](vcpu_sched::exec::ExecConfig::timer_advance)).
    pub timer_advance: bool,
    /// A pool's Linux VMs: the period of the halt poller's rounds (its
    /// `halt-poll` thread), [`DEFAULT_HALT_POLL`] by default.
    pub halt_poll: Duration,
    /// A pool's Linux VMs: park their halted vCPUs inside KVM, a thread
    /// each ([`super::parker`]), instead of probing them (off by default).
    pub halt_park: bool,
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
            tick: DEFAULT_TICK,
            halt_poll: DEFAULT_HALT_POLL,
            halt_park: false,
            host_rt: None,
            host_pins: None,
            strict_policy: false,
            timer_advance: true,
        }
    }

    /// The host CPU logical CPU `cpu` runs on.
    pub fn host_cpu(&self, cpu: u32) -> u32 {
        self.mapping.host_cpu(&self.topology, cpu)
    }

    /// The executors' settings, on the clock that started at `epoch`.
    fn exec_config(&self, epoch: Instant, keep_task_stats: bool) -> ExecConfig {
        ExecConfig {
            mapping: self.mapping.clone(),
            tick: self.tick,
            check: self.check.clone(),
            host_rt: self.host_rt,
            epoch: Some(epoch),
            keep_task_stats,
            timer_advance: self.timer_advance,
            ..ExecConfig::default()
        }
    }

    fn start(&self, epoch: Instant, keep_task_stats: bool) -> Result<Executor, TaskError> {
        Ok(Executor::start(
            self.kind,
            self.topology.clone(),
            self.mitigations,
            self.sched.clone(),
            &self.exec_config(epoch, keep_task_stats),
        )?)
    }
}

/// What an executor reports when it stops.
#[derive(Clone, Debug, Default)]
pub struct ExecOutcome {
    /// The scheduler's per-task statistics, by global vCPU index (`None`
    /// for the host executor).
    pub tasks: Vec<Option<TaskStats>>,
    /// Host run-queue statistics per vCPU thread (host executor), from
    /// `/proc/thread-self/schedstat`.
    pub host_schedstat: Vec<Option<HostSchedstat>>,
    /// Scheduler counters, summed.
    pub counters: SchedCounters,
    /// Per CPU: ns inside `schedule`.
    pub sched_ns_per_cpu: Vec<u64>,
    /// Per CPU: `schedule` calls.
    pub sched_calls_per_cpu: Vec<u64>,
    /// Per CPU: ns its idle worker polled ahead of a sleep timer (the
    /// workers executor's timer advance; empty for the others).
    pub timer_spin_ns_per_cpu: Vec<u64>,
    /// Invariant violations (empty unless something is broken).
    pub violations: Vec<String>,
    /// Checker snapshots taken.
    pub checks: u64,
    /// Failed affinity changes.
    pub pin_errors: u64,
}

impl ExecOutcome {
    /// The set's vCPUs' ends, with the executor's totals.
    fn of(set: &VmSet, rep: ExecReport) -> Self {
        let n = set.slots().len();
        let mut tasks = vec![None; n];
        for (g, st) in std::mem::take(&mut *lock(&set.finished_stats)) {
            tasks[g] = Some(st);
        }
        let mut host_schedstat = vec![None; n];
        for (g, h) in std::mem::take(&mut *lock(&set.host_schedstat)) {
            host_schedstat[g] = Some(h);
        }
        Self {
            tasks,
            host_schedstat,
            counters: rep.counters,
            sched_ns_per_cpu: rep.sched_ns_per_cpu,
            sched_calls_per_cpu: rep.sched_calls_per_cpu,
            timer_spin_ns_per_cpu: rep.timer_spin_ns_per_cpu,
            violations: rep.violations,
            checks: rep.checks,
            pin_errors: rep.pin_errors,
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The task name of a vCPU.
pub(crate) fn task_name(set: &VmSet, s: &VcpuSlot) -> String {
    format!("{}/vcpu{}", set.vms()[s.vm].name, s.index)
}

/// Warns when more RT vCPU threads than host CPUs could starve each other
/// on the host executor.
fn warn_rt_oversubscribed(set: &VmSet) {
    let rt = set
        .slots()
        .iter()
        .filter(|s| !matches!(s.placement.policy, vcpu_sched::Policy::Fair(_)))
        .count();
    let host_cpus = vcpu_sched::exec::allowed_host_cpus().map_or(0, |v| v.len());
    if rt > host_cpus {
        // docs/kvm-notes.md: equal-priority FIFO threads never time-slice; a
        // vCPU that spins in the guest starves the others on its CPU.
        tracing::warn!(
            "{rt} RT vCPU threads on {host_cpus} host CPUs: a vCPU that does not block starves the others on its CPU"
        );
    }
}

/// Whether any VM of `set` halts inside `KVM_RUN` (a Linux guest).
fn needs_watch(set: &VmSet) -> bool {
    set.vms().iter().any(|vm| vm.mapper.halts_in_kvm())
}

/// The [`BlockWatch`] of an M:N executor's workers (`None` for the other
/// executors: a vCPU thread of its own blocks without holding anyone
/// else's CPU on `host`, and `threads` hands its slot over on the
/// poller's kick as before; or where the host refuses perf events, with
/// a warning once).
fn start_watch(ex: &Executor) -> Option<Arc<BlockWatch>> {
    let Executor::Workers(w) = ex else {
        return None;
    };
    match BlockWatch::start(&w.worker_tids()) {
        Ok(b) => Some(Arc::new(b)),
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    error = %e,
                    "cannot watch the workers' context switches (perf events; needs \
                     kernel.perf_event_paranoid <= 1 or CAP_PERFMON): a vCPU that halts \
                     inside KVM_RUN keeps its CPU until the halt poller's next round"
                )
            });
            None
        }
    }
}

/// Makes every vCPU of `set` a task of `ex` (a group per VM where the
/// executor has a scheduler), then lets them all run. All or nothing: if
/// one is refused, those added are dropped again.
fn attach(ex: &Executor, opts: &ExecOptions, set: &Arc<VmSet>) -> Result<(), TaskError> {
    if set.started() {
        return Err(TaskError::Input("this set has already run".into()));
    }
    set.mark_started();
    let mut ids = Vec::with_capacity(set.slots().len());
    if let Err(e) = add_tasks(ex, opts, set, &mut ids) {
        discard(ex, set, &ids);
        return Err(e);
    }
    // Before any vCPU runs: a device that wakes vCPUs has its waker
    // before the guest can ask it for anything.
    let remote = ex.remote_waker();
    for vm in set.vms() {
        vm.mapper.attached(VcpuWaker {
            slots: set.slots()[vm.first..vm.first + vm.nvcpus].into(),
            epoch: set.epoch(),
            wake: remote.clone(),
            breakdown: set.breakdown_flag(),
        });
    }
    for id in ids {
        ex.spawner().wake(id);
    }
    Ok(())
}

/// Wakes the vCPUs of one VM from threads outside the executor (a
/// device's I/O thread raising an interrupt) through the executor's own
/// wake: the scheduler's on `workers` and `threads`, the vCPU thread's on
/// `host`. A wake of a vCPU that is not blocked is kept for its next
/// block, one deep (a doorbell). Handed to each VM's mapper when its set
/// starts ([`ExitMapper::attached`](super::ExitMapper::attached)).
#[derive(Clone)]
pub struct VcpuWaker {
    slots: Arc<[Arc<VcpuSlot>]>,
    epoch: Instant,
    wake: vcpu_sched::exec::RemoteWaker,
    /// The set's breakdown switch: stamp the I/O path's stages.
    breakdown: Arc<AtomicBool>,
}

impl std::fmt::Debug for VcpuWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuWaker")
            .field("vcpus", &self.slots.len())
            .finish()
    }
}

impl VcpuWaker {
    /// Rings vCPU `k`'s doorbell (stamped for the doorbell latency, as a
    /// guest's `WAKE` is). False if the VM has no such live vCPU.
    ///
    /// With the set's breakdown on, stamps the I/O path for it: when the
    /// calling I/O thread was woken (if it is one), now (the interrupt),
    /// and when the wake returned.
    pub fn wake(&self, k: usize) -> bool {
        let Some(s) = self.slots.get(k) else {
            return false;
        };
        let now = self.now();
        if !s.ring(now) {
            return false;
        }
        let stamps = self.breakdown.load(Ordering::Relaxed);
        if stamps {
            let dev = vmm_devices::virtio::worker::last_wakeup().map_or(0, |t| {
                t.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
            });
            s.stamp_irq(dev, now);
        }
        if let Some(t) = s.task.get() {
            self.wake.wake(*t);
        }
        if stamps {
            s.stamp_woken(self.now());
        }
        true
    }

    /// Wakes vCPU `k`, parked inside KVM until KVM woke it
    /// ([`super::parker`]): the scheduler's wake alone, no doorbell or
    /// I/O stamps (the breakdown's wake stamp only). False if the VM has
    /// no such live vCPU.
    pub fn wake_parked(&self, k: usize) -> bool {
        let Some(s) = self.slots.get(k) else {
            return false;
        };
        if s.exited() {
            return false;
        }
        if let Some(t) = s.task.get() {
            self.wake.wake(*t);
        }
        if self.breakdown.load(Ordering::Relaxed) {
            s.stamp_woken(self.now());
        }
        true
    }

    /// The set's clock.
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// The VM's vCPUs.
    pub fn vcpus(&self) -> usize {
        self.slots.len()
    }
}

/// Creates a group per VM and a task per vCPU, in vCPU order; pushes every
/// id made to `ids`.
fn add_tasks(
    ex: &Executor,
    opts: &ExecOptions,
    set: &Arc<VmSet>,
    ids: &mut Vec<TaskId>,
) -> Result<(), TaskError> {
    if let Some(sched) = ex.scheduler() {
        for vm in set.vms() {
            let g = sched.create_group(&vm.name)?;
            let _ = vm.group.set(g);
        }
    }
    // A set of one VM (`vmm serve` runs each VM as its own set) names its
    // threads `vcpuN`, as orchestrators such as Kata expect when they pin
    // vCPU threads by name.
    let one_vm = set.vms().len() == 1;
    for slot in set.slots() {
        let vm = &set.vms()[slot.vm];
        let mut spec = TaskSpec::new(task_name(set, slot)).policy(slot.placement.policy);
        if let Some(g) = vm.group.get() {
            spec = spec.group(*g);
        }
        if let Some(m) = slot.placement.affinity {
            spec = spec.affinity(m);
        }
        let body = Box::new(VcpuBody::new(set, slot));
        let hooks = Some(Arc::new(VcpuHooks::new(set, slot)) as Arc<dyn vcpu_sched::exec::Hooks>);
        let id = match ex {
            Executor::Workers(w) => w.add(&spec, body, hooks)?,
            Executor::Threads(t) => t.add(&spec, body, hooks)?,
            Executor::Host(h) => {
                let how = HostThread {
                    name: Some(if one_vm {
                        format!("vcpu{}", slot.index)
                    } else {
                        format!("v{}.{}", slot.vm, slot.index)
                    }),
                    pins: opts
                        .host_pins
                        .as_ref()
                        .and_then(|p| p.get(slot.global).cloned()),
                    strict_policy: opts.strict_policy,
                };
                h.add(&spec, body, hooks, &how).map_err(|e| match e {
                    vcpu_sched::SchedError::ThreadSetup(m) => TaskError::Input(m),
                    e => e.into(),
                })?
            }
        };
        set.live_bodies.fetch_add(1, Ordering::AcqRel);
        ids.push(id);
        let _ = slot.task.set(id);
    }
    Ok(())
}

/// Drops tasks added by a failed [`attach`]: the pool removes them unrun;
/// an executor of the set's own is shut down by the caller, which ends
/// them (the set is stopping).
fn discard(ex: &Executor, set: &VmSet, ids: &[TaskId]) {
    set.request_stop();
    if let Executor::Workers(w) = ex {
        for &id in ids {
            w.discard(id);
            set.live_bodies.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(sched) = ex.scheduler() {
            for vm in set.vms() {
                if let Some(g) = vm.group.get() {
                    let _ = sched.remove_group(*g);
                }
            }
        }
    }
}

/// Stops the set's vCPUs: asks them to end, then every 2 ms wakes
/// (through `wake`) and kicks each that has not, until the executor has
/// retired every body. After `timeout`, [`TaskError::Stuck`] names up to 8
/// of those left.
fn drain(
    set: &VmSet,
    timeout: Duration,
    wake: &dyn Fn(TaskId),
    describe: &dyn Fn(&VcpuSlot) -> String,
) -> Result<(), TaskError> {
    set.request_stop();
    let deadline = Instant::now() + timeout;
    loop {
        if set.live_bodies.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        for s in set.slots().iter().filter(|s| !s.exited()) {
            if let Some(t) = s.task.get() {
                wake(*t);
            }
            s.kicker().kick();
        }
        if Instant::now() > deadline {
            let left: Vec<&Arc<VcpuSlot>> = set.slots().iter().filter(|s| !s.exited()).collect();
            let names: Vec<String> = left.iter().take(8).map(|s| describe(s)).collect();
            return Err(TaskError::Stuck(format!(
                "{} vCPUs did not end within {timeout:?} of the stop ({} bodies not retired): {}",
                left.len(),
                set.live_bodies.load(Ordering::Acquire),
                names.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Where a vCPU's task is, for a stuck stop.
fn describe(sched: Option<&Arc<Scheduler>>, set: &VmSet, s: &VcpuSlot) -> String {
    let t = s.task.get().copied();
    match sched {
        Some(sched) => format!(
            "{} ({:?}, {:?})",
            task_name(set, s),
            t.map(|t| sched.task_state(t)),
            t.map(|t| sched.task_cpu(t))
        ),
        None => task_name(set, s),
    }
}

/// A set running on an executor.
pub struct Running {
    set: Arc<VmSet>,
    inner: Inner,
}

enum Inner {
    /// An executor of the set's own.
    Own(Executor),
    /// A set attached to a shared pool (other sets run on it too).
    Pooled(Arc<VcpuPool>),
}

impl Running {
    /// Makes a task of every vCPU on an executor of the set's own and lets
    /// them go.
    pub fn start(opts: &ExecOptions, set: Arc<VmSet>) -> Result<Self, TaskError> {
        let max = opts.sched.max_tasks;
        if set.slots().len() > max {
            return Err(TaskError::Input(format!(
                "{} vCPUs, but the scheduler holds at most {max} tasks",
                set.slots().len()
            )));
        }
        if opts.kind == ExecutorKind::Host {
            warn_rt_oversubscribed(&set);
        }
        let ex = opts.start(set.epoch(), true)?;
        if needs_watch(&set) {
            if let Some(w) = start_watch(&ex) {
                let _ = set.watch.set(w);
            }
        }
        if let Err(e) = attach(&ex, opts, &set) {
            set.request_stop();
            let _ = ex.shutdown(Duration::from_secs(30));
            return Err(e);
        }
        Ok(Self {
            set,
            inner: Inner::Own(ex),
        })
    }

    /// Attaches the set's vCPUs to a running shared pool (made with
    /// `VmSet::new_on(.., pool.epoch())`); [`Running::stop`] detaches it
    /// again and leaves the pool running.
    pub fn start_on(pool: &Arc<VcpuPool>, set: Arc<VmSet>) -> Result<Self, TaskError> {
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

    fn executor(&self) -> &Executor {
        match &self.inner {
            Inner::Own(ex) => ex,
            Inner::Pooled(p) => &p.ex,
        }
    }

    /// Scheduler counters so far (`None` for the host executor).
    pub fn counters(&self) -> Option<SchedCounters> {
        self.executor().scheduler().map(|s| s.counters())
    }

    /// Each vCPU's scheduler statistics so far (run delay, wake-to-run
    /// latency, migrations), by global index; read while the set runs.
    /// `None` for the host executor, or a vCPU without a task.
    pub fn task_stats(&self) -> Vec<Option<TaskStats>> {
        let Some(sched) = self.executor().scheduler() else {
            return vec![None; self.set.slots().len()];
        };
        self.set
            .slots()
            .iter()
            .map(|s| s.task.get().and_then(|t| sched.task_stats(*t).ok()))
            .collect()
    }

    /// Each vCPU thread's host schedstat so far, by global index: the
    /// host executor's live counterpart of [`Self::task_stats`]' running
    /// time, run delay and runs. `None` for the other executors (their vCPUs share
    /// worker threads), a thread not started yet, or a kernel without
    /// schedstat.
    pub fn host_schedstat(&self) -> Vec<Option<HostSchedstat>> {
        let ex = self.executor();
        self.set
            .slots()
            .iter()
            .map(|s| s.task.get().and_then(|t| ex.host_schedstat(*t)))
            .collect()
    }

    /// Wakes vCPU `k` of VM `vm` from outside the executor (an I/O thread,
    /// a halt poller). False if there is no such live vCPU.
    pub fn wake(&self, vm: usize, k: usize) -> bool {
        let Some(s) = self.set.doorbell(vm, k, self.set.now()) else {
            return false;
        };
        self.wake_slot(s);
        true
    }

    fn wake_slot(&self, s: &VcpuSlot) {
        if let Some(t) = s.task.get() {
            self.executor().spawner().wake(*t);
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
        match self.inner {
            Inner::Pooled(p) => {
                let tasks = p.detach(&self.set, timeout)?;
                let rep = p.report();
                Ok(ExecOutcome {
                    tasks,
                    counters: rep.counters,
                    violations: rep.violations,
                    ..ExecOutcome::default()
                })
            }
            Inner::Own(ex) => {
                let sched = ex.scheduler().cloned();
                let drained = drain(
                    &self.set,
                    timeout,
                    &|t| {
                        ex.spawner().wake(t);
                    },
                    &|s| describe(sched.as_ref(), &self.set, s),
                );
                let rep = ex.shutdown(Duration::from_secs(10));
                drained?;
                Ok(ExecOutcome::of(&self.set, rep?))
            }
        }
    }
}

/// One M:N executor that sets of VMs join and leave while others run:
/// the scheduler, one worker per CPU, the clock.
pub struct VcpuPool {
    ex: Executor,
    opts: ExecOptions,
    /// Made when the first set whose vCPUs halt inside `KVM_RUN` joins
    /// (`None` inside: the host does not permit it).
    watch: OnceLock<Option<Arc<BlockWatch>>>,
    /// The halt-poll thread of its Linux VMs, made at the first one.
    hub: OnceLock<Option<PollHub>>,
}

impl VcpuPool {
    /// Starts the pool with no vCPU yet; sets attached later must be made
    /// on [`VcpuPool::epoch`].
    pub fn start(opts: &ExecOptions) -> Result<Self, TaskError> {
        let mut opts = opts.clone();
        opts.kind = ExecutorKind::Workers;
        // it runs for ever: ended tasks are reported to their sets only
        let ex = opts.start(Instant::now(), false)?;
        Ok(Self {
            ex,
            opts,
            watch: OnceLock::new(),
            hub: OnceLock::new(),
        })
    }

    /// The pool's periods: its executor's tick and its halt poller's
    /// rounds (what it was started with, [`ExecOptions::tick`] and
    /// [`ExecOptions::halt_poll`]).
    pub fn periods(&self) -> (Duration, Duration) {
        (self.opts.tick, self.opts.halt_poll)
    }

    /// Do Linux VMs on this pool park their halted vCPUs inside KVM
    /// ([`ExecOptions::halt_park`])?
    pub fn halt_park(&self) -> bool {
        self.opts.halt_park
    }

    /// The one thread that polls the halted vCPUs of every Linux VM on
    /// this pool ([`PollHub`]), started at the first call; `None` if the
    /// thread could not be started (said once in the log).
    pub fn poll_hub(&self) -> Option<&PollHub> {
        self.hub
            .get_or_init(|| match PollHub::start(self.opts.halt_poll) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the halt-poll thread");
                    None
                }
            })
            .as_ref()
    }

    fn pool(&self) -> &vcpu_sched::exec::WorkerPool {
        match &self.ex {
            Executor::Workers(w) => w,
            _ => unreachable!("a VcpuPool is always the workers executor"),
        }
    }

    /// The clock every attached set runs on.
    pub fn epoch(&self) -> Instant {
        self.pool().epoch()
    }

    /// ns on the pool's clock.
    pub fn now(&self) -> u64 {
        self.pool().now()
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        self.pool().scheduler()
    }

    /// Scheduler counters so far, over every set it has run.
    pub fn counters(&self) -> SchedCounters {
        self.pool().counters()
    }

    /// Executor invariant violations and scheduler anomalies so far.
    pub fn violations(&self) -> Vec<String> {
        self.pool().violations()
    }

    /// The executor's totals so far.
    pub fn report(&self) -> ExecReport {
        self.pool().report()
    }

    /// What CPU `cpu`'s worker is doing, for diagnostics.
    pub fn cpu_state(&self, cpu: vcpu_sched::CpuId) -> String {
        self.pool().cpu_state(cpu)
    }

    /// Per CPU: ns inside `schedule` and `schedule` calls, so far.
    pub fn sched_time_per_cpu(&self) -> (Vec<u64>, Vec<u64>) {
        self.pool().sched_time_per_cpu()
    }

    /// Adds every vCPU of `set` as a task (a task group per VM), then lets
    /// them run. All or nothing.
    pub fn attach(&self, set: &Arc<VmSet>) -> Result<(), TaskError> {
        if set.epoch() != self.epoch() {
            return Err(TaskError::Input(
                "this set runs on another clock; make it with VmSet::new_on(.., pool.epoch())"
                    .into(),
            ));
        }
        if needs_watch(set) {
            if let Some(w) = self.watch.get_or_init(|| start_watch(&self.ex)) {
                let _ = set.watch.set(w.clone());
            }
        }
        attach(&self.ex, &self.opts, set)
    }

    /// Stops every vCPU of `set` and waits until each task has left the
    /// scheduler (at most `timeout`), then removes its VMs' groups. The
    /// other sets run on. Returns each vCPU's final scheduler statistics,
    /// by global index.
    pub fn detach(
        &self,
        set: &Arc<VmSet>,
        timeout: Duration,
    ) -> Result<Vec<Option<TaskStats>>, TaskError> {
        let pool = self.pool();
        let quiet = pool.quiesce();
        let r = drain(
            set,
            timeout,
            &|t| {
                pool.wake(t);
            },
            &|s| describe(Some(pool.scheduler()), set, s),
        );
        drop(quiet);
        r?;
        for vm in set.vms() {
            if let Some(g) = vm.group.get() {
                if let Err(e) = pool.scheduler().remove_group(*g) {
                    tracing::error!("group of VM {} not removed: {e}", vm.name);
                }
            }
        }
        let mut tasks = vec![None; set.slots().len()];
        for (g, st) in std::mem::take(&mut *lock(&set.finished_stats)) {
            tasks[g] = Some(st);
        }
        // give back the pages the VMs destroyed before this one freed
        // (memory::release_freed)
        crate::memory::release_freed();
        Ok(tasks)
    }

    /// Stops the workers and the clock. Sets still attached end with
    /// them: detach them first for a clean stop.
    pub fn stop(&self) {
        self.pool().stop();
    }
}
