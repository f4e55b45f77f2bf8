//! The set of VMs an executor runs, and one vCPU's trip into the guest.
//!
//! WHAT: [`VmSet`] (every VM and vCPU of a run, the clock, the stop flag
//! and the measurement window), its [`VmEntry`] and [`VcpuSlot`] rows,
//! per-vCPU [`VcpuMetrics`], and `enter`: one `KVM_RUN` mapped to an
//! [`Action`] (what a vCPU records when it runs again is the body's
//! `resumed`).
//! WHY: a vCPU's state and its trip into the guest are the same whichever
//! executor runs it (workers, threads, host); the executors are
//! `vcpu_sched`'s, and only the body ([`super::body`]) talks to them.
//! HOW: the set is built once, before any executor starts; afterwards
//! only atomics and the per-vCPU lock (taken by the vCPU's runner alone)
//! change. A set joins a running executor whole (`vmm serve` attaches one
//! set per VM to its shared worker pool) and leaves it whole; its clock is
//! the executor's (`new_on`), so every set an executor runs tells the
//! same time.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use vcpu_sched::exec::HostSchedstat;
use vcpu_sched::stats::Histogram;
pub use vcpu_sched::workload::Window;
use vcpu_sched::{GroupId, TaskId, TaskStats};

use super::stages::{Stages, BLOCK};
use super::{Action, ExitMapper, GuestVm, Placement, TaskError};
use crate::vcpu::block_watch::{BlockWatch, HaltTarget};
use crate::vcpu::probe::BlockingStat;
use crate::vcpu::{Kicker, Vcpu, VcpuExit};
use crate::vm::{StopReason, VmControl};

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
    /// The same two latencies split into stages ([`STAGES`](super::STAGES)), when the
    /// set's breakdown is on.
    pub stages: Stages,
}

/// State of a vCPU that only its runner touches.
pub struct VcpuState {
    /// The vCPU (`None` once it has ended).
    pub vcpu: Option<Vcpu>,
    /// Its metrics.
    pub m: VcpuMetrics,
    /// When its last `KVM_RUN` returned (set's clock), stamped only while
    /// the set's breakdown is on (0 otherwise).
    pub exit_at: u64,
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
    pub(super) doorbell_at: AtomicU64,
    exited: AtomicBool,
    /// Exits from `KVM_RUN` so far (readable while the vCPU runs).
    progress: AtomicU64,
    /// Nanoseconds it held the thread that ran it, inside `KVM_RUN` and
    /// its exit handling (in the guest, or halted inside KVM until a
    /// kick), so far.
    held_ns: AtomicU64,
    /// Breakdown stamps (set clock, 0: none): when the waker's call
    /// returned, and when the executor picked the vCPU after it.
    pub(super) woken_at: AtomicU64,
    pub(super) picked_at: AtomicU64,
    /// I/O path stamps (set clock, 0: none), first one wins: when the
    /// I/O thread that raised an interrupt for this vCPU was woken, and
    /// when it raised it.
    io_dev_at: AtomicU64,
    irq_at: AtomicU64,
    /// Blocked because its VM is paused: resume wakes it (and only it, so
    /// a guest halted for its own reasons is not woken by a resume).
    held: AtomicBool,
    /// For the executor's [`BlockWatch`]: a guest whose halts wait inside
    /// `KVM_RUN`, with KVM's `blocking` stat.
    halt_target: Option<Arc<HaltTarget>>,
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
    /// A doorbell at `now` (set clock): stamps it for the doorbell
    /// latency (first one wins until the vCPU runs). False if the vCPU
    /// has ended (nothing to wake).
    pub(crate) fn ring(&self, now: u64) -> bool {
        if self.exited() {
            return false;
        }
        let _ = self
            .doorbell_at
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
        true
    }
    /// Breakdown, I/O path: an interrupt for this vCPU raised at `irq` by
    /// an I/O thread woken at `dev` (0: unknown). First one wins until the
    /// vCPU runs.
    pub(crate) fn stamp_irq(&self, dev: u64, irq: u64) {
        if self
            .irq_at
            .compare_exchange(0, irq, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.io_dev_at.store(dev, Ordering::Release);
        }
    }
    /// Breakdown: the waker's call for this vCPU returned at `now` (first
    /// one wins until the vCPU runs).
    pub(crate) fn stamp_woken(&self, now: u64) {
        let _ = self
            .woken_at
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed);
    }
    /// Takes the I/O path stamps: `(device woken, interrupt)`, if an
    /// interrupt was stamped.
    pub(super) fn take_io_stamps(&self) -> Option<(u64, u64)> {
        let irq = self.irq_at.swap(0, Ordering::AcqRel);
        let dev = self.io_dev_at.swap(0, Ordering::AcqRel);
        (irq != 0).then_some((dev, irq))
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
    /// Paused (vm.pause): its vCPUs block instead of entering the guest.
    paused: AtomicBool,
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
    /// Is it paused?
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
    /// Has its memory and fds been released?
    pub fn torn_down(&self) -> bool {
        self.keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

/// Every VM and vCPU of one run, the clock, and the stop flag. Shared by
/// the executor's threads and the code that drives the run.
pub struct VmSet {
    epoch: Instant,
    vms: Vec<Arc<VmEntry>>,
    slots: Vec<Arc<VcpuSlot>>,
    started: AtomicBool,
    started_at: AtomicU64,
    stopping: AtomicBool,
    /// Stamp the stages of wakeups ([`STAGES`](super::STAGES))? Shared
    /// with the VMs' [`VcpuWaker`](super::VcpuWaker)s.
    breakdown: Arc<AtomicBool>,
    /// Its vCPUs whose bodies an executor holds and has not retired yet
    /// (the set may leave the executor at 0).
    pub(crate) live_bodies: AtomicUsize,
    /// Final scheduler statistics of its ended tasks, by global index.
    pub(crate) finished_stats: Mutex<Vec<(usize, TaskStats)>>,
    /// Host executor: each vCPU thread's `(time on CPU, time waiting)`,
    /// by global index.
    pub(crate) host_schedstat: Mutex<Vec<(usize, HostSchedstat)>>,
    /// Latencies are recorded inside this window only (on the set's
    /// clock).
    pub window: Window,
    /// The M:N executor's watch for vCPUs that halt inside `KVM_RUN`
    /// (set when the set is attached to a workers executor that has one).
    pub(crate) watch: OnceLock<Arc<BlockWatch>>,
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
        Self::new_on(vms, Instant::now())
    }

    /// Like [`VmSet::new`], on a clock that started at `epoch`: the
    /// executor's, for a set that joins a running executor (see
    /// `VcpuPool::attach`).
    pub fn new_on(vms: Vec<GuestVm>, epoch: Instant) -> Result<Arc<Self>, TaskError> {
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
                let halt_target = if g.mapper.halts_in_kvm() {
                    BlockingStat::open(&v).map(|st| Arc::new(HaltTarget::new(st, v.kicker())))
                } else {
                    None
                };
                slots.push(Arc::new(VcpuSlot {
                    halt_target,
                    vm: id,
                    index: i,
                    global: first + i,
                    placement,
                    kicker: v.kicker(),
                    state: Mutex::new(VcpuState {
                        vcpu: Some(v),
                        m: VcpuMetrics::default(),
                        exit_at: 0,
                    }),
                    task: OnceLock::new(),
                    doorbell_at: AtomicU64::new(0),
                    exited: AtomicBool::new(false),
                    progress: AtomicU64::new(0),
                    held_ns: AtomicU64::new(0),
                    held: AtomicBool::new(false),
                    woken_at: AtomicU64::new(0),
                    picked_at: AtomicU64::new(0),
                    io_dev_at: AtomicU64::new(0),
                    irq_at: AtomicU64::new(0),
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
                paused: AtomicBool::new(false),
            }));
        }
        Ok(Arc::new(Self {
            epoch,
            vms: entries,
            slots,
            started: AtomicBool::new(false),
            started_at: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            breakdown: Arc::new(AtomicBool::new(false)),
            live_bodies: AtomicUsize::new(0),
            finished_stats: Mutex::new(Vec::new()),
            host_schedstat: Mutex::new(Vec::new()),
            window: Window::default(),
            watch: OnceLock::new(),
        }))
    }

    /// What the executor's [`BlockWatch`] did so far (over every set on
    /// it), if it has one.
    pub fn watch_counts(&self) -> Option<crate::vcpu::block_watch::WatchCounts> {
        self.watch.get().map(|w| w.counts())
    }

    /// When its clock started.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }
    /// ns since its clock started (never 0).
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
    /// Per vCPU, by global index: milliseconds it held the thread that
    /// ran it (in `KVM_RUN` and exit handling) so far; read while the
    /// vCPUs run. Under M:N this is each vCPU's share of the workers.
    pub fn held_ms_snapshot(&self) -> Vec<u64> {
        self.slots
            .iter()
            .map(|s| s.held_ns.load(Ordering::Relaxed) / 1_000_000)
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
    /// Turns the wakeup breakdown ([`STAGES`](super::STAGES)) on or off: two clock reads
    /// per wakeup when on, one relaxed load when off.
    pub fn set_breakdown(&self, on: bool) {
        self.breakdown.store(on, Ordering::Relaxed);
        vmm_devices::virtio::worker::stamp_wakeups(on);
    }

    /// The breakdown's switch, for a [`VcpuWaker`](super::VcpuWaker).
    pub(crate) fn breakdown_flag(&self) -> Arc<AtomicBool> {
        self.breakdown.clone()
    }

    /// Block path, `host` executor: the vCPU in `m` enters `KVM_RUN` next
    /// on a host CPU where another vCPU blocked after its `KVM_RUN`
    /// returned at `exit`; the host kernel did the switch, so only the
    /// total is seen.
    pub(crate) fn host_switched_in(&self, m: &mut VcpuMetrics, exit: u64) {
        let now = self.now();
        if exit != 0 && exit <= now && self.window.inside(now) {
            m.stages.0[BLOCK + 3].record(now - exit);
        }
    }

    /// Block path, `workers` executor: the vCPU in `m` enters `KVM_RUN`
    /// next on a CPU where another vCPU's `KVM_RUN` returned at `exit`,
    /// after which the worker called `schedule` at `called` and it
    /// returned at `picked`.
    pub(crate) fn switched_in(&self, m: &mut VcpuMetrics, exit: u64, called: u64, picked: u64) {
        let now = self.now();
        if !self.window.inside(now) || exit == 0 || called < exit || picked < called {
            return;
        }
        let st = &mut m.stages.0;
        st[BLOCK].record(called - exit);
        st[BLOCK + 1].record(picked - called);
        st[BLOCK + 2].record(now.saturating_sub(picked));
        st[BLOCK + 3].record(now.saturating_sub(exit));
    }

    /// Is the breakdown on?
    pub fn breakdown_on(&self) -> bool {
        self.breakdown.load(Ordering::Relaxed)
    }

    /// The waker's call into the executor for `s` has returned (breakdown).
    #[inline]
    pub(crate) fn woken(&self, s: &VcpuSlot) {
        if self.breakdown.load(Ordering::Relaxed) {
            let _ = s
                .woken_at
                .compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The executor picked `s` to run (breakdown): the first pick after a
    /// wake.
    #[inline]
    pub(crate) fn picked(&self, s: &VcpuSlot) {
        if self.breakdown.load(Ordering::Relaxed) && s.woken_at.load(Ordering::Acquire) != 0 {
            let _ =
                s.picked_at
                    .compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Pauses VM `vm`: its vCPUs stop entering the guest (a running one is
    /// kicked out) and block until [`VmSet::resume_vm`]. False if it is
    /// already paused or has no such VM.
    pub fn pause_vm(&self, vm: usize) -> bool {
        let Some(e) = self.vms.get(vm) else {
            return false;
        };
        if e.paused.swap(true, Ordering::SeqCst) {
            return false;
        }
        for s in &self.slots[e.first..e.first + e.nvcpus] {
            s.kicker.kick();
        }
        true
    }

    /// Resumes VM `vm`: clears the pause, then wakes (through `wake`) each
    /// vCPU that blocked because of it. False if it was not paused.
    pub fn resume_vm(&self, vm: usize, wake: &dyn Fn(&VcpuSlot)) -> bool {
        let Some(e) = self.vms.get(vm) else {
            return false;
        };
        if !e.paused.swap(false, Ordering::SeqCst) {
            return false;
        }
        for s in &self.slots[e.first..e.first + e.nvcpus] {
            if s.held.swap(false, Ordering::SeqCst) {
                wake(s);
            }
        }
        true
    }

    /// Keeps what the executor said of ended vCPU `global`: its
    /// scheduler statistics, or its host thread's.
    pub(crate) fn keep_finished(
        &self,
        global: usize,
        st: Option<TaskStats>,
        host: Option<HostSchedstat>,
    ) {
        if let Some(st) = st {
            self.finished_stats
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((global, st));
        }
        if let Some(h) = host {
            self.host_schedstat
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((global, h));
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
    pub(crate) fn doorbell(&self, vm: usize, k: usize, now: u64) -> Option<&Arc<VcpuSlot>> {
        let s = self.slot(vm, k)?;
        s.ring(now).then_some(s)
    }

    /// Stops VM `vm` for `reason`: records it (first reason wins), kicks
    /// its vCPUs, and wakes each through `wake` so that blocked ones end.
    pub(crate) fn fail_vm(&self, vm: usize, reason: StopReason, wake: &dyn Fn(&VcpuSlot)) {
        let e = &self.vms[vm];
        let clean = matches!(
            reason,
            StopReason::Reset { .. }
                | StopReason::PowerOff { .. }
                | StopReason::UntilMatched { .. }
        );
        if e.control.request_stop(reason.clone()) {
            // The first line: the caller reports the whole reason (with
            // registers, for a fault) once.
            let what = reason.to_string();
            let what = what.lines().next().unwrap_or_default();
            if clean {
                tracing::info!(vm = %e.name, "VM stopped: {what}");
            } else {
                tracing::warn!(vm = %e.name, "VM stopped: {what}");
            }
        }
        for s in &self.slots[e.first..e.first + e.nvcpus] {
            wake(s);
        }
    }

    /// A vCPU's runner is done with it: drops the vCPU, and when it was
    /// the VM's last, tears the VM down.
    pub(crate) fn vcpu_exited(&self, slot: &VcpuSlot, st: &mut VcpuState) {
        if let Some(v) = st.vcpu.take() {
            let vm = &self.vms[slot.vm].name;
            tracing::debug!(%vm, vcpu = v.index(), stats = ?v.stats(), "vCPU done");
        }
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

/// Enters the guest once and maps what comes back. The caller made its
/// preemption check right before.
pub(crate) fn enter(set: &VmSet, vm: &VmEntry, st: &mut VcpuState, cpu: usize) -> Action {
    if set.stopping() || vm.control.is_stopping() {
        return Action::Exit;
    }
    let Some(vcpu) = st.vcpu.as_mut() else {
        return Action::Exit;
    };
    if vm.paused() {
        // Held first, then the pause checked again. A resume clears the
        // pause, then takes `held` and wakes: if the pause is gone and we
        // take `held` back ourselves, no wake is coming and we run; if the
        // resume took it, its wake is coming (or remembered) and we block
        // for it. No resume is lost, and no wake is left over.
        let slot = &set.slots[vm.first + vcpu.index()];
        slot.held.store(true, Ordering::SeqCst);
        if vm.paused() || !slot.held.swap(false, Ordering::SeqCst) {
            return Action::Block;
        }
    }
    st.m.entries += 1;
    let index = vcpu.index();
    // A panic in the run loop, a device or the exit mapping fails this VM
    // alone: the thread (a worker that runs other VMs' vCPUs too) goes on.
    // the executor's watch kicks this vCPU out if it halts inside KVM_RUN
    // (holding this CPU's worker)
    let watched = match (set.watch.get(), &set.slots[vm.first + index].halt_target) {
        (Some(w), Some(t)) => {
            w.entering(cpu, t);
            Some(w)
        }
        _ => None,
    };
    let t0 = set.now();
    let r = contain(index, || {
        vm.mapper.before_entry(vcpu);
        vcpu.run(vm.mapper.io())
    });
    if let Some(w) = watched {
        w.left(cpu);
    }
    let r = match r {
        Ok(r) => r,
        Err(fail) => return fail,
    };
    if set.breakdown_on() {
        st.exit_at = set.now();
    }
    let slot = &set.slots[vm.first + index];
    slot.progress.fetch_add(1, Ordering::Relaxed);
    slot.held_ns
        .fetch_add(set.now().saturating_sub(t0), Ordering::Relaxed);
    match r {
        Ok(VcpuExit::Kicked) => {
            if set.stopping() || vm.control.is_stopping() {
                return Action::Exit;
            }
            match contain(index, || vm.mapper.on_kicked(vcpu)) {
                Ok(Some(a)) => a,
                Ok(None) => {
                    st.m.preempt_kicks += 1;
                    Action::Continue
                }
                Err(fail) => fail,
            }
        }
        Ok(exit) => {
            let a = match contain(index, || vm.mapper.map_exit(vcpu, exit)) {
                Ok(a) => a,
                Err(fail) => return fail,
            };
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

/// Runs `f` for vCPU `index`; a panic becomes the [`Action::Fail`] that
/// stops the vCPU's VM, with the panic's message.
fn contain<T>(index: usize, f: impl FnOnce() -> T) -> Result<T, Action> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into());
        Action::Fail(StopReason::VcpuFailed {
            vcpu: index,
            what: format!("the thread running it panicked: {msg}"),
        })
    })
}
