//! Running a built Linux VM: on the host 1:1 runner ([`run_threads`],
//! `vmm run --sched host`, the default) or under `vcpu_sched`
//! ([`run_sched`], `vmm run --sched vcpu_sched`). Both go through the same
//! [`VmSet`](super::VmSet) and [`LinuxMapper`]; the host runner is
//! `vcpu_sched`'s `host` executor.
//!
//! # Under `vcpu_sched`
//!
//! A Linux guest has the in-kernel LAPIC, so `HLT` does not exit: KVM
//! blocks the calling thread inside `KVM_RUN` until an interrupt arrives
//! (and an AP the guest has not started yet blocks there until INIT and
//! SIPI). Under the scheduler that thread holds a run slot, so a waiting
//! vCPU would keep its CPU from every other vCPU. The [`HaltPoller`]
//! (the caller's thread, every `poll`, 1 ms by default) makes such vCPUs
//! give the slot up and gives it back when their wait is over:
//!
//! * it reads each vCPU's `blocking` stat from KVM's binary stats fd (1
//!   while the vCPU waits inside `KVM_RUN`) and kicks the ones that wait
//!   (`immediate_exit` + signal, so `KVM_RUN` returns `EINTR`); without a
//!   stats fd it kicks every vCPU;
//! * after any kick the runner asks `KVM_GET_MP_STATE`; a vCPU that waits
//!   (halted, or an unstarted AP) sleeps in the scheduler: a halted one
//!   for a [`HaltSleep`]: 1 ms, doubling while it is found waiting again
//!   without an exit in between, up to 256 ms (16 ms for a vCPU the
//!   poller cannot probe: [`UNPROBED_SLEEP_MAX_NS`]), and never past its armed
//!   TSC-deadline timer (so guest timers fire on time, give or take the
//!   1 ms floor); an AP that waits for INIT/SIPI until the probe below
//!   sees its SIPI ([`UNSTARTED_SLEEP_NS`], a safety net);
//! * while it sleeps, the poller probes it each round (an unstarted AP
//!   every [`UNSTARTED_PROBE_EVERY`]th: `KVM_GET_MP_STATE`, which also
//!   accepts a pending SIPI; a halted vCPU `KVM_GET_LAPIC` for an
//!   interrupt the LAPIC would deliver, and its MP state every
//!   [`UNSTARTED_PROBE_EVERY`]th round) and wakes it in the scheduler as
//!   soon as its wait is over, as KVM would wake a blocked thread.
//!
//! A running vCPU that the scheduler preempts (a kick that finds it not
//! waiting) is marked preempted in the guest's steal-time area
//! ([`crate::vcpu::steal`], [`LinuxMapper::with_preempt_marks`]), as KVM
//! marks a 1:1 vCPU thread the host preempts, so the guest's
//! `vcpu_is_preempted()` (paravirtual TLB flush, spinning on mutex
//! owners, idle-CPU choice) sees M:N descheduling too.
//!
//! Device interrupts do not wait for the poller: a virtio device raises
//! its MSI through an irqfd (KVM queues it in the target vCPU's LAPIC, in
//! or out of `KVM_RUN`) and then calls the VM's
//! [`msi_wake`](crate::vm::LinuxVm::msi_wake) hook with the destination
//! APIC ID. Under the scheduler that hook marks the vCPU ([`IrqWakeups`])
//! and unparks the poller's thread, which wakes it in the scheduler at
//! once: one unpark and one `Scheduler::wake`, not a poll period. (A wake
//! that finds the vCPU awake is remembered and cuts its next sleep short,
//! so an interrupt raised while the vCPU is on its way to sleep is not
//! lost.)
//!
//! Semantics and limits: an IPI for a sleeping vCPU reaches it within one
//! poll period (plus the time to get a slot) instead of at once; an event
//! the probe cannot see (an NMI) waits for the end of the sleep, 256 ms at
//! most. A vCPU that halts and is woken inside KVM before anyone sees
//! it simply keeps its slot, as on host threads. On the M:N workers a
//! vCPU that halts inside `KVM_RUN` is found as soon as its worker blocks
//! ([`BlockWatch`](crate::vcpu::block_watch::BlockWatch), from the host's
//! context-switch events); the poller's kick is the backstop. Per period
//! the poller costs one `pread` per vCPU in the guest and one ioctl per
//! sleeping halted vCPU (two every [`UNSTARTED_PROBE_EVERY`]th round),
//! and for a quiet VM (all asleep, none in the guest since the last
//! round: nothing but a legacy line can have raised an interrupt) only
//! every [`QUIET_PROBE_EVERY`]th round; each find costs a kick,
//! `KVM_GET_MP_STATE` and, for a halted vCPU, one `KVM_GET_MSRS`.
//! Measured effect on the 12-vCPU boot:
//! `docs/results-vcpus.md` ("Linux boot").

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use kvm_bindings::KVM_MP_STATE_HALTED;

use super::parker::{Parker, ASLEEP, IN_GUEST, PARKED, PARKED_SLEEP_NS, PROBED, RECLAIM};
use super::{Action, ExitMapper};
use crate::devices::Devices;
use crate::vcpu::probe::{waits_in_kvm, BlockingStat, Probe};
use crate::vcpu::{PortIo, Vcpu, VcpuExit};
use crate::vm::handle_exit;

/// How long a vCPU that waits inside `KVM_RUN` gives up its run slot.
///
/// The first sleep after the vCPU last did anything visible (an exit to
/// the VMM, or a kick that found it running) is `base`; each further find
/// in a row doubles it, up to `max`. A halted vCPU whose TSC-deadline
/// timer is armed sleeps no longer than until that deadline (but at least
/// `base`). Sleeps can be long because the [`HaltPoller`] wakes a
/// sleeping vCPU as soon as an interrupt or SIPI is pending for it; what
/// a re-entry costs is the slot, held by a vCPU that goes straight back to
/// waiting until the next poll round finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaltSleep {
    /// The first sleep.
    pub base: std::time::Duration,
    /// The longest sleep.
    pub max: std::time::Duration,
}

impl Default for HaltSleep {
    fn default() -> Self {
        Self {
            base: std::time::Duration::from_millis(1),
            max: std::time::Duration::from_millis(256),
        }
    }
}

/// The longest sleep of a halted vCPU the [`HaltPoller`] does not probe
/// (no probe could be made for it): only the end of its sleep lets it see
/// an interrupt, so it comes back at least this often whatever
/// [`HaltSleep::max`] says.
///
/// A probed vCPU sleeps up to [`HaltSleep::max`] (256 ms by default): the
/// poller wakes it within a round of an interrupt becoming pending and
/// its TSC-deadline timer caps the sleep, so the end of the sleep only
/// matters for what a probe cannot see (an NMI). With the old 16 ms bound
/// every idle vCPU came back 60 times a second just to halt again,
/// holding its CPU until the poller's next round each time: four
/// 12-vCPU guests booting on 2 host CPUs took 478 s with it, 235 s with
/// 256 ms (docs/results-vcpus.md, "Linux boot").
pub const UNPROBED_SLEEP_MAX_NS: u64 = 16_000_000;

/// [`HaltSleep`] at work: per-vCPU backoff and the guest's TSC rate.
struct HaltState {
    base_ns: u64,
    max_ns: u64,
    /// Finds in a row, per vCPU index (saturating).
    found: Box<[AtomicU8]>,
    /// Per vCPU index: [`IN_GUEST`], [`ASLEEP`] or [`PROBED`]. The halt
    /// poller may issue ioctls on a vCPU only while it holds it
    /// `PROBED`, which it can take only from `ASLEEP`; the thread that
    /// enters `KVM_RUN` next takes it back to `IN_GUEST` first, waiting
    /// out a probe in progress (KVM serialises a vCPU's ioctls on its
    /// mutex, so a probe of a vCPU inside `KVM_RUN` would wait for its
    /// next exit; this handshake keeps the poller from ever doing that).
    probe: Arc<[AtomicU8]>,
    /// The guest TSC rate; 0 until first read, `u32::MAX` if unreadable.
    tsc_khz: AtomicU32,
    /// Per vCPU index: the [`HaltPoller`] probes this vCPU while it
    /// sleeps (it holds a [`Probe`] for it), so an AP that waits for
    /// INIT/SIPI need not come back by itself ([`UNSTARTED_SLEEP_NS`]).
    probed: Box<[AtomicBool]>,
    /// Per vCPU index: its current sleep is an unstarted AP's
    /// ([`UNSTARTED_SLEEP_NS`]); the poller probes it every
    /// [`UNSTARTED_PROBE_EVERY`] rounds only.
    unstarted: Box<[AtomicBool]>,
    /// Per vCPU index: it was taken into `KVM_RUN` since the poller last
    /// looked ([`HaltState::quiet`]).
    entered: Box<[AtomicBool]>,
    /// Park threads (`--halt-park on`, [`super::parker`]): halted vCPUs
    /// wait inside KVM on them instead of being probed.
    parker: Option<Parker>,
}

/// An AP waiting for INIT/SIPI is probed every this many poll rounds: it
/// costs a `KVM_GET_MP_STATE` per probe, and before SMP bring-up 11 of 12
/// vCPUs wait so; a SIPI is seen at most 3 ms later at the default 1 ms
/// period (33 ms over the 11 APs of a 12-vCPU boot of 50 s or more here).
/// A halted vCPU's probe reads its LAPIC every round but its MP state (an
/// INIT or SIPI for it: a CPU brought online again) only this often: half
/// the ioctls, which with 4 guests of 12 mostly idle vCPUs were most of
/// the pollers' time.
pub const UNSTARTED_PROBE_EVERY: u64 = 4;

/// A quiet VM (every vCPU asleep in the scheduler, and none entered the
/// guest since the last round) is probed every this many rounds.
///
/// Only a vCPU in the guest can send an IPI; a device's MSI wakes its
/// vCPU at once through the VM's MSI hook ([`IrqWakeups`]); a halted
/// vCPU's own timer ends its sleep. What is left for the probes of a
/// quiet VM are the legacy lines (COM1, the hotplug controller's GED),
/// seen within this many rounds (8 ms at the default period). The first
/// quiet round after any activity is always probed, so an IPI sent by a
/// vCPU that has since gone back to sleep is seen as before. An idle VM
/// of 12 vCPUs otherwise costs the poller 12 `KVM_GET_LAPIC` a
/// millisecond, about 3% of a CPU here, whether or not anything happens.
pub const QUIET_PROBE_EVERY: u64 = 8;

/// How long an AP that waits for INIT/SIPI sleeps when the poller probes
/// it: KVM_GET_MP_STATE accepts its SIPI, and the poller wakes it then,
/// so the end of this sleep is only a safety net. A bounded sleep made
/// each unstarted AP re-enter `KVM_RUN` every 16 ms just to block again,
/// holding a run slot until the next poll round: with 4 VMs of 12 vCPUs
/// booting on 2 host CPUs those re-entries took most of the slots from
/// the boot CPUs (measured: the workers ran vCPUs blocked in KVM most of
/// the time; docs/results-vcpus.md, "Linux boot").
pub const UNSTARTED_SLEEP_NS: u64 = 1_000_000_000;

impl HaltState {
    fn tsc_khz(&self, vcpu: &Vcpu) -> Option<u32> {
        let k = match self.tsc_khz.load(Ordering::Relaxed) {
            0 => {
                let k = vcpu.tsc_khz().ok().filter(|&k| k > 0).unwrap_or(u32::MAX);
                self.tsc_khz.store(k, Ordering::Relaxed);
                k
            }
            k => k,
        };
        (k != u32::MAX).then_some(k)
    }

    /// The longest sleep of vCPU `index`: [`HaltSleep::max`] when the
    /// poller probes it, else at most [`UNPROBED_SLEEP_MAX_NS`].
    fn max_ns_of(&self, index: usize) -> u64 {
        let probed = self
            .probed
            .get(index)
            .is_some_and(|p| p.load(Ordering::Relaxed));
        if probed {
            self.max_ns
        } else {
            self.max_ns.min(UNPROBED_SLEEP_MAX_NS.max(self.base_ns))
        }
    }

    /// The sleep of vCPU `index` found waiting for INIT/SIPI in
    /// `mp_state` while the poller probes it; `None` for a halted vCPU or
    /// one the poller cannot probe (those sleep as [`HaltSleep`] says).
    fn unstarted_sleep_ns(&self, index: usize, mp_state: u32) -> Option<u64> {
        let probed = self
            .probed
            .get(index)
            .is_some_and(|p| p.load(Ordering::Relaxed));
        let unstarted = mp_state != KVM_MP_STATE_HALTED && probed;
        if let Some(u) = self.unstarted.get(index) {
            u.store(unstarted, Ordering::Relaxed);
        }
        unstarted.then_some(UNSTARTED_SLEEP_NS.max(self.max_ns))
    }

    /// The sleep for a vCPU found waiting in `mp_state`; `None` when its
    /// timer is due (it goes straight back into `KVM_RUN`).
    fn sleep_ns(&self, vcpu: &Vcpu, mp_state: u32) -> Option<u64> {
        if let Some(ns) = self.unstarted_sleep_ns(vcpu.index(), mp_state) {
            return Some(ns);
        }
        let found = self.found.get(vcpu.index());
        let k = found.map_or(0, |f| f.load(Ordering::Relaxed));
        let mut ns = self
            .base_ns
            .checked_shl(u32::from(k))
            .unwrap_or(u64::MAX)
            .min(self.max_ns_of(vcpu.index()));
        if mp_state == KVM_MP_STATE_HALTED {
            if let Some(khz) = self.tsc_khz(vcpu) {
                if let Ok(Some(t)) = vcpu.tsc_deadline_in(khz) {
                    if t == 0 {
                        return None;
                    }
                    ns = ns.min(t.max(self.base_ns));
                }
            }
        }
        if let Some(f) = found {
            f.store(k.saturating_add(1).min(63), Ordering::Relaxed);
        }
        Some(ns.max(1))
    }

    /// The vCPU is going to sleep in the scheduler: the poller may probe
    /// it from now until it is entered again.
    fn asleep(&self, index: usize) {
        if let Some(p) = self.probe.get(index) {
            p.store(ASLEEP, Ordering::Release);
        }
    }

    /// Takes the vCPU back from the poller before `KVM_RUN`.
    fn claim(&self, index: usize) {
        let Some(p) = self.probe.get(index) else {
            return;
        };
        // written at most once per poll round (the poller clears it), not
        // at every entry: the marks of a VM's vCPUs share cache lines
        if let Some(e) = self.entered.get(index) {
            if !e.load(Ordering::Relaxed) {
                e.store(true, Ordering::Release);
            }
        }
        let mut spins = 0u32;
        loop {
            match p.compare_exchange(ASLEEP, IN_GUEST, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) | Err(IN_GUEST) => return,
                Err(PARKED) => {
                    // its park thread has it: ask for it back (the park
                    // thread reads RECLAIM after clearing immediate_exit)
                    if p.compare_exchange(PARKED, RECLAIM, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        if let Some(parker) = &self.parker {
                            parker.nudge(index);
                        }
                    }
                }
                Err(_) => {
                    // a probe is running: two ioctls, microseconds
                    spins += 1;
                    if spins < 100 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    fn active(&self, vcpu: &Vcpu) {
        if let Some(f) = self.found.get(vcpu.index()) {
            f.store(0, Ordering::Relaxed);
        }
    }

    /// Is the VM quiet: no vCPU taken into the guest since the last call,
    /// and every vCPU asleep in the scheduler now? (Resets the "taken"
    /// marks: each vCPU's is read before its state, so one that enters
    /// in between is seen either way.)
    fn quiet(&self) -> bool {
        let mut quiet = true;
        for e in self.entered.iter() {
            quiet &= !e.swap(false, Ordering::AcqRel);
        }
        quiet
            && self
                .probe
                .iter()
                .all(|p| matches!(p.load(Ordering::Acquire), ASLEEP | PARKED | RECLAIM))
    }
}

/// The exit mapping of a Linux guest: devices as in `vmm run`; under the
/// scheduler, a kicked vCPU found waiting in `KVM_RUN` sleeps in the
/// scheduler as [`HaltSleep`] says.
pub struct LinuxMapper {
    devices: Arc<Devices>,
    /// `None`: halted vCPUs keep their thread (the host runner).
    halt: Option<HaltState>,
    /// Guest RAM, to mark preempted vCPUs in their steal-time areas
    /// ([`LinuxMapper::with_preempt_marks`]); `None`: no marks.
    memory: Option<vm_memory::GuestMemoryMmap>,
    /// Marks written so far.
    marks: AtomicU64,
}

impl LinuxMapper {
    /// For a VM's devices and `vcpus` vCPUs, under the scheduler.
    pub fn new(devices: Arc<Devices>, vcpus: usize, sleep: HaltSleep) -> Self {
        let base_ns = (sleep.base.as_nanos() as u64).max(1);
        Self {
            devices,
            halt: Some(HaltState {
                base_ns,
                max_ns: (sleep.max.as_nanos() as u64).max(base_ns),
                found: (0..vcpus).map(|_| AtomicU8::new(0)).collect(),
                probe: (0..vcpus).map(|_| AtomicU8::new(IN_GUEST)).collect(),
                tsc_khz: AtomicU32::new(0),
                probed: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
                unstarted: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
                entered: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
                parker: None,
            }),
            memory: None,
            marks: AtomicU64::new(0),
        }
    }

    /// Marks a vCPU that the scheduler preempts as preempted in the
    /// guest's steal-time area, as KVM does for a 1:1 vCPU thread the
    /// host preempts ([`crate::vcpu::steal`]): `memory` is the VM's RAM.
    /// For the M:N executors, where KVM never sees a vCPU descheduled.
    pub fn with_preempt_marks(mut self, memory: vm_memory::GuestMemoryMmap) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Parks halted vCPUs inside KVM, one thread each
    /// ([`super::parker`], `--halt-park on`), instead of having the halt
    /// poller probe them: `vm` is the VM of `vcpus`. Starts the threads
    /// from the calling thread. An error says why they could not be made;
    /// the host runner (no halt state) has nothing to park.
    pub fn with_parking(mut self, vm: &kvm_ioctls::VmFd, vcpus: &[Vcpu]) -> Result<Self, String> {
        if let Some(h) = &mut self.halt {
            h.parker = Some(Parker::new(
                vm,
                vcpus,
                self.devices.clone(),
                h.probe.clone(),
            )?);
        }
        Ok(self)
    }

    /// What its park threads did so far (zeros without parking).
    pub fn park_counts(&self) -> super::parker::ParkCounts {
        self.halt
            .as_ref()
            .and_then(|h| h.parker.as_ref())
            .map(Parker::counts)
            .unwrap_or_default()
    }

    /// Preempted marks written so far.
    pub fn preempt_marks(&self) -> u64 {
        self.marks.load(Ordering::Relaxed)
    }

    /// A running vCPU was kicked for the scheduler: tell the guest it is
    /// preempted, if it sits at an instruction boundary.
    fn mark_preempted(&self, vcpu: &Vcpu) {
        let Some(mem) = &self.memory else {
            return;
        };
        if !vcpu.kicked_at_boundary() {
            return;
        }
        match crate::vcpu::steal::mark_preempted(vcpu, mem) {
            Ok(true) => {
                self.marks.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => tracing::trace!("preempted mark: {e}"),
        }
    }

    /// For a VM's devices, on the host 1:1 runner: a halted vCPU waits in
    /// `KVM_RUN` on its own thread.
    pub fn host(devices: Arc<Devices>) -> Self {
        Self {
            devices,
            halt: None,
            memory: None,
            marks: AtomicU64::new(0),
        }
    }
}

impl ExitMapper for LinuxMapper {
    fn io(&self) -> &dyn PortIo {
        &*self.devices
    }

    fn map_exit(&self, vcpu: &Vcpu, exit: VcpuExit) -> Action {
        if let Some(h) = &self.halt {
            h.active(vcpu);
        }
        match handle_exit(vcpu, exit) {
            Some(r) => Action::Fail(r),
            None => Action::Continue,
        }
    }

    fn on_kicked(&self, vcpu: &Vcpu) -> Option<Action> {
        let h = self.halt.as_ref()?;
        if let Some(p) = &h.parker {
            // an exit its park thread got while the vCPU stepped
            if let Some(exit) = p.take_stash(vcpu.index()) {
                return Some(self.map_exit(vcpu, exit));
            }
        }
        match vcpu.mp_state() {
            Ok(s) if waits_in_kvm(s) => {
                if h.parker.as_ref().is_some_and(|p| p.park(vcpu.index())) {
                    // its park thread wakes it when KVM does
                    return Some(Action::Sleep(PARKED_SLEEP_NS));
                }
                let ns = h.sleep_ns(vcpu, s)?;
                h.asleep(vcpu.index());
                Some(Action::Sleep(ns))
            }
            _ => {
                h.active(vcpu);
                self.mark_preempted(vcpu);
                None
            }
        }
    }

    fn before_entry(&self, vcpu: &Vcpu) {
        if let Some(h) = &self.halt {
            h.claim(vcpu.index());
        }
    }

    /// The VMM put a halted vCPU to sleep in the scheduler; the poller
    /// wakes it as soon as its interrupt is pending.
    fn wake_ends_sleep(&self) -> bool {
        true
    }

    fn halts_in_kvm(&self) -> bool {
        self.halt.is_some()
    }

    fn attached(&self, waker: super::VcpuWaker) {
        if let Some(p) = self.halt.as_ref().and_then(|h| h.parker.as_ref()) {
            p.attached(waker);
        }
    }
}

/// Device interrupts for vCPUs that sleep in the scheduler: the VM's MSI
/// hook marks the destination vCPU and unparks the thread that runs the
/// poll loop, which wakes it (see the module docs).
pub struct IrqWakeups {
    by_apic: HashMap<u32, usize>,
    pending: Box<[AtomicBool]>,
    any: AtomicBool,
    waiter: std::thread::Thread,
}

impl IrqWakeups {
    /// For vCPUs with these APIC IDs (vCPU `i` has `apic_ids[i]`); the
    /// calling thread is the one a device interrupt unparks.
    pub fn new(apic_ids: &[u32]) -> Self {
        Self::for_thread(apic_ids, std::thread::current())
    }

    /// Like [`IrqWakeups::new`], unparking `waiter` (the thread that runs
    /// the poll loop: [`PollHub`](super::poll_hub::PollHub)'s).
    pub fn for_thread(apic_ids: &[u32], waiter: std::thread::Thread) -> Self {
        let n = apic_ids.len();
        Self {
            by_apic: apic_ids.iter().enumerate().map(|(i, &a)| (a, i)).collect(),
            pending: (0..n).map(|_| AtomicBool::new(false)).collect(),
            any: AtomicBool::new(false),
            waiter,
        }
    }

    /// An MSI for APIC ID `apic` was raised.
    pub fn note(&self, apic: u32) {
        if let Some(&k) = self.by_apic.get(&apic) {
            self.pending[k].store(true, Ordering::Release);
            self.any.store(true, Ordering::Release);
            self.waiter.unpark();
        }
    }

    /// Wakes every marked vCPU; returns how many.
    pub fn wake_marked(&self, wake: &dyn Fn(usize) -> bool) -> u64 {
        if !self.any.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let mut n = 0;
        for (k, p) in self.pending.iter().enumerate() {
            if p.swap(false, Ordering::AcqRel) && wake(k) {
                n += 1;
            }
        }
        n
    }
}

/// Each vCPU's APIC ID, in vCPU order.
pub fn apic_ids(vm: &crate::vm::LinuxVm) -> Vec<u32> {
    (0..vm.guest().num_vcpus())
        .map(|i| vm.guest().cpu(i).apic_id)
        .collect()
}

/// One vCPU as the halt poller sees it.
struct PolledVcpu {
    stat: Option<BlockingStat>,
    kicker: crate::vcpu::Kicker,
    /// For probes while it sleeps.
    probe: Option<Probe>,
}

/// The halt poller of one Linux VM under the scheduler (module docs). Each
/// [`HaltPoller::round`] kicks the vCPUs that wait inside `KVM_RUN`, and
/// probes the ones asleep in the scheduler: one whose wait is over (an
/// interrupt its LAPIC would deliver, or SIPI for an AP) is woken at
/// once instead of at the end of its sleep. That is what a thread
/// blocked in `KVM_RUN` gets from KVM itself on host 1:1 threads.
pub struct HaltPoller {
    mapper: Arc<LinuxMapper>,
    vcpus: Vec<PolledVcpu>,
    /// Rounds so far (unstarted APs are probed every
    /// [`UNSTARTED_PROBE_EVERY`]th).
    rounds: AtomicU64,
    /// Quiet rounds in a row ([`QUIET_PROBE_EVERY`]).
    quiet: AtomicU64,
}

/// What one [`HaltPoller::round`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollRound {
    /// vCPUs found waiting inside `KVM_RUN` and kicked.
    pub kicked: u64,
    /// Sleeping vCPUs probed.
    pub probed: u64,
    /// Sleeping vCPUs found with an event and woken.
    pub woken: u64,
    /// Rounds that skipped a quiet VM ([`QUIET_PROBE_EVERY`]).
    pub quiet: u64,
}

impl std::ops::AddAssign for PollRound {
    fn add_assign(&mut self, o: Self) {
        self.kicked += o.kicked;
        self.probed += o.probed;
        self.woken += o.woken;
        self.quiet += o.quiet;
    }
}

impl HaltPoller {
    /// Preempted marks its mapper wrote so far
    /// ([`LinuxMapper::with_preempt_marks`]).
    pub fn preempt_marks(&self) -> u64 {
        self.mapper.preempt_marks()
    }

    /// What its VM's park threads did so far ([`LinuxMapper::park_counts`]).
    pub fn park_counts(&self) -> super::parker::ParkCounts {
        self.mapper.park_counts()
    }

    /// For the vCPUs of a VM whose exits `mapper` maps (built with
    /// [`LinuxMapper::new`]). Call before handing the vCPUs over.
    pub fn new(mapper: Arc<LinuxMapper>, vcpus: &[Vcpu]) -> Self {
        let vcpus: Vec<PolledVcpu> = vcpus
            .iter()
            .map(|v| PolledVcpu {
                stat: BlockingStat::open(v),
                kicker: v.kicker(),
                probe: Probe::new(v),
            })
            .collect();
        if let Some(h) = &mapper.halt {
            for (p, v) in h.probed.iter().zip(&vcpus) {
                p.store(v.probe.is_some(), Ordering::Relaxed);
            }
        }
        if vcpus.iter().any(|v| v.stat.is_none()) {
            tracing::warn!(
                "no KVM stats fd with a `blocking` stat: the halt poller kicks every vCPU each period"
            );
        }
        Self {
            mapper,
            vcpus,
            rounds: AtomicU64::new(0),
            quiet: AtomicU64::new(0),
        }
    }

    /// One pass over the vCPUs; `wake(k)` wakes vCPU `k` in the scheduler.
    pub fn round(&self, wake: &dyn Fn(usize) -> bool) -> PollRound {
        let mut r = PollRound::default();
        let halt = self.mapper.halt.as_ref();
        if halt.is_some_and(HaltState::quiet) {
            if self.quiet.fetch_add(1, Ordering::Relaxed) % QUIET_PROBE_EVERY != 0 {
                r.quiet = 1;
                return r;
            }
        } else {
            self.quiet.store(0, Ordering::Relaxed);
        }
        let probe_unstarted =
            self.rounds.fetch_add(1, Ordering::Relaxed) % UNSTARTED_PROBE_EVERY == 0;
        for (k, v) in self.vcpus.iter().enumerate() {
            let slot = halt.and_then(|h| h.probe.get(k));
            if slot.is_some_and(|p| matches!(p.load(Ordering::Acquire), PARKED | RECLAIM)) {
                // waiting inside KVM on its park thread: KVM wakes it
                continue;
            }
            if let (Some(p), Some(probe)) = (slot, &v.probe) {
                if !probe_unstarted
                    && p.load(Ordering::Acquire) == ASLEEP
                    && halt.is_some_and(|h| h.unstarted[k].load(Ordering::Relaxed))
                {
                    // an AP waiting for SIPI, not due for a probe
                    continue;
                }
                if p.compare_exchange(ASLEEP, PROBED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // a halted vCPU: its LAPIC each round, its MP state
                    // (an INIT or SIPI) every UNSTARTED_PROBE_EVERY rounds
                    let halted = halt.is_some_and(|h| !h.unstarted[k].load(Ordering::Relaxed));
                    let ready = if halted && !probe_unstarted {
                        probe.interrupt_pending()
                    } else {
                        probe.wait_is_over()
                    };
                    p.store(ASLEEP, Ordering::Release);
                    r.probed += 1;
                    if ready && wake(k) {
                        r.woken += 1;
                    }
                    continue;
                }
            }
            if v.stat.as_ref().is_none_or(|s| s.blocking()) {
                r.kicked += 1;
                v.kicker.kick();
            }
        }
        r
    }
}

/// How `vmm run --sched vcpu_sched` runs a Linux VM.
#[derive(Clone, Debug)]
pub struct LinuxSchedOptions {
    /// The fixes.
    pub mitigations: vcpu_sched::Mitigations,
    /// How the fair slices scale with the CPUs.
    pub fair_slice_scaling: vcpu_sched::SliceScaling,
    /// The scheduler's tick period.
    pub tick: std::time::Duration,
    /// The vCPUs' policy in the scheduler (`--rt`: FIFO/RR; else fair).
    pub policy: vcpu_sched::Policy,
    /// vCPU `i` may run on host CPU `pins[i]` only (`--pin`).
    pub pins: Option<Vec<u32>>,
    /// Give up after this long.
    pub timeout: Option<std::time::Duration>,
    /// Halt poll period.
    pub poll: std::time::Duration,
    /// How long a waiting vCPU gives up its slot.
    pub halt: HaltSleep,
    /// Park halted vCPUs inside KVM, a thread each ([`super::parker`]).
    pub park: bool,
}

/// Each vCPU's placement: `opts.policy`, pinned to its `--pin` CPU if any.
fn placements(
    opts: &LinuxSchedOptions,
    topo: &topology::HostTopology,
) -> Result<Vec<super::Placement>, super::TaskError> {
    let Some(pins) = &opts.pins else {
        return Ok(vec![super::Placement {
            policy: opts.policy,
            affinity: None,
        }]);
    };
    pins.iter()
        .map(|&os| {
            let cpu = topo.cpu_by_os_index(os).ok_or_else(|| {
                super::TaskError::Input(format!("--pin: host CPU {os} is not available"))
            })?;
            Ok(super::Placement {
                policy: opts.policy,
                affinity: Some(vcpu_sched::CpuMask::from_cpus([cpu])),
            })
        })
        .collect()
}

/// Runs a built Linux VM with its vCPUs as `vcpu_sched` tasks (one task
/// group) on the M:N worker executor over the host's CPUs, until the VM
/// stops or the timeout passes. Returns why it stopped.
pub fn run_sched(
    mut vm: crate::vm::LinuxVm,
    opts: &LinuxSchedOptions,
) -> Result<crate::vm::StopReason, super::TaskError> {
    use std::time::{Duration, Instant};

    use super::{ExecOptions, ExecutorKind, GuestVm, Running, VmSet};
    use crate::vm::StopReason;

    crate::vcpu::install_kick_signal()?;
    let topo = Arc::new(topology::load("host")?);
    // a halted vCPU should free its worker at once, not spin on it
    if !vm.disable_halt_polling() {
        tracing::debug!("KVM has no KVM_CAP_HALT_POLL: its halt polling stays on");
    }
    let vcpus = vm.take_vcpus();
    let n = vcpus.len();
    let control = vm.control();
    let devices = vm.devices();
    let placement = placements(opts, &topo)?;
    let irqs = Arc::new(IrqWakeups::new(&apic_ids(&vm)));
    let msi_wake = vm.msi_wake();
    let mut mapper = LinuxMapper::new(devices.clone(), n, opts.halt)
        .with_preempt_marks(vm.ram().memory().clone());
    if opts.park {
        mapper = mapper
            .with_parking(vm.vm_fd(), &vcpus)
            .map_err(|e| super::TaskError::Input(format!("--halt-park on: {e}")))?;
    }
    let mapper = Arc::new(mapper);
    let poller = HaltPoller::new(mapper.clone(), &vcpus);
    let marks = mapper.clone();
    let guest = GuestVm {
        name: "vm0".into(),
        vcpus,
        mapper,
        control: control.clone(),
        placement,
        keep: Box::new(vm),
    };
    let set = VmSet::new(vec![guest])?;
    let mut eo = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    eo.kind = ExecutorKind::Workers;
    eo.mitigations = opts.mitigations;
    eo.sched.fair_slice_scaling = opts.fair_slice_scaling;
    eo.tick = opts.tick;
    control.mark_started();
    let running = Running::start(&eo, set.clone())?;
    let hook = irqs.clone();
    // The slot is empty: this VM was built for this run.
    let _ = msi_wake.set(Arc::new(move |apic| hook.note(apic)));
    let t0 = Instant::now();
    let mut polls = PollRound::default();
    let mut irq_wakes = 0u64;
    let wake = |k: usize| running.wake(0, k);
    let period = opts.poll.max(Duration::from_micros(100));
    let mut next_round = Instant::now();
    let reason = loop {
        if let Some(r) = control.reason() {
            break r;
        }
        if set.vms()[0].live() == 0 {
            break control.reason().unwrap_or(StopReason::VcpuFailed {
                vcpu: 0,
                what: "every vCPU ended".into(),
            });
        }
        if let Some(t) = opts.timeout {
            if t0.elapsed() >= t {
                control.request_stop(StopReason::Timeout(t));
                break control.reason().unwrap_or(StopReason::Timeout(t));
            }
        }
        irq_wakes += irqs.wake_marked(&wake);
        let now = Instant::now();
        if now >= next_round {
            polls += poller.round(&wake);
            next_round = now + period;
        }
        // A device interrupt unparks this thread early.
        std::thread::park_timeout(next_round.saturating_duration_since(Instant::now()));
    };
    let watch = running.set().watch_counts().unwrap_or_default();
    let parks = marks.park_counts();
    let out = running.stop(Duration::from_secs(10));
    devices.flush_console();
    match out {
        Ok(o) => tracing::info!(
            vcpus = n,
            watch_switches = watch.switches,
            watch_kicked = watch.kicked,
            preempt_marks = marks.preempt_marks(),
            parked = parks.parked,
            park_woken = parks.woken,
            park_reclaimed = parks.reclaimed,
            kicked = polls.kicked,
            probed = polls.probed,
            woken = polls.woken,
            quiet_rounds = polls.quiet,
            irq_wakes,
            switches = o.counters.switches,
            steals = o.counters.steals,
            busy_pushes = o.counters.busy_pushes,
            migrations = o.counters.migrations_l2
                + o.counters.migrations_llc
                + o.counters.migrations_node
                + o.counters.migrations_remote,
            violations = o.violations.len(),
            "vcpu_sched run done"
        ),
        Err(e) => tracing::warn!("stopping the vCPUs: {e}"),
    }
    Ok(reason)
}

/// How [`run_threads`] runs the vCPUs.
#[derive(Clone, Debug, Default)]
pub struct ThreadOptions {
    /// vCPU `i` is pinned to OS CPU `pins[i]`.
    pub pins: Option<Vec<u32>>,
    /// Real-time policy for the vCPU threads.
    pub rt: Option<vcpu_sched::placement::rt::RtPolicy>,
    /// Give up after this long.
    pub timeout: Option<std::time::Duration>,
}

/// Runs every vCPU on a thread of its own (`vcpu<N>`, the host executor)
/// until the VM stops or the timeout passes, and returns why it stopped.
/// Setup failures of a thread (pinning, an RT policy the host refuses)
/// are returned as input errors before the guest runs.
pub fn run_threads(
    mut vm: crate::vm::LinuxVm,
    opts: &ThreadOptions,
) -> Result<crate::vm::StopReason, crate::Error> {
    use std::time::Duration;

    use super::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};
    use crate::vm::StopReason;

    let topo = Arc::new(topology::load("host")?);
    let vcpus = vm.take_vcpus();
    let n = vcpus.len();
    let control = vm.control();
    let devices = vm.devices();
    let policy = match opts.rt {
        Some(vcpu_sched::placement::rt::RtPolicy::Fifo(p)) => vcpu_sched::Policy::Fifo(p),
        Some(vcpu_sched::placement::rt::RtPolicy::Rr(p)) => vcpu_sched::Policy::Rr(p),
        None => vcpu_sched::Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
    };
    let guest = GuestVm {
        name: "vm0".into(),
        vcpus,
        mapper: Arc::new(LinuxMapper::host(devices.clone())),
        control: control.clone(),
        placement: vec![Placement {
            policy,
            affinity: None,
        }],
        keep: Box::new(vm),
    };
    let set = VmSet::new(vec![guest]).map_err(task_err)?;
    let mut eo = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    eo.kind = ExecutorKind::Host;
    eo.host_pins = opts
        .pins
        .as_ref()
        .map(|p| (0..n).map(|i| vec![p[i]]).collect());
    eo.strict_policy = true;
    control.mark_started();
    let run = Running::start(&eo, set).map_err(task_err)?;
    let reason = match control.wait(opts.timeout) {
        Some(r) => r,
        None => {
            let t = opts.timeout.unwrap_or_default();
            control.request_stop(StopReason::Timeout(t));
            control.reason().unwrap_or(StopReason::Timeout(t))
        }
    };
    if let Err(e) = run.stop(Duration::from_secs(5)) {
        tracing::warn!("{e}; leaving them behind");
    }
    devices.flush_console();
    Ok(reason)
}

/// Executor errors of `vmm run`: a thread setup the user asked for and
/// the host refused is input; the rest is a runtime failure.
fn task_err(e: super::TaskError) -> crate::Error {
    match e {
        super::TaskError::Input(m) => crate::Error::Input(m),
        other => crate::Error::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(vcpus: usize) -> HaltState {
        HaltState {
            base_ns: 1_000_000,
            max_ns: 16_000_000,
            found: (0..vcpus).map(|_| AtomicU8::new(0)).collect(),
            probe: (0..vcpus).map(|_| AtomicU8::new(IN_GUEST)).collect(),
            tsc_khz: AtomicU32::new(0),
            probed: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
            unstarted: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
            entered: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
            parker: None,
        }
    }

    /// A VM is quiet only when every vCPU sleeps and none entered the
    /// guest since the last look; an entry between two looks makes the
    /// next look busy even if the vCPU is asleep again by then.
    #[test]
    fn a_vm_is_quiet_only_with_every_vcpu_asleep_and_no_entry_since() {
        let h = state(3);
        assert!(!h.quiet(), "vCPUs in the guest");
        for k in 0..3 {
            h.asleep(k);
        }
        assert!(h.quiet());
        assert!(h.quiet(), "still quiet");
        // vCPU 1 runs and goes back to sleep between two looks
        h.claim(1);
        h.asleep(1);
        assert!(!h.quiet(), "an entry since the last look");
        assert!(h.quiet(), "and quiet again after it");
        // vCPU 2 is in the guest at the look
        h.claim(2);
        assert!(!h.quiet());
        assert!(!h.quiet(), "still in the guest");
        h.asleep(2);
        assert!(h.quiet());
    }

    /// An AP waiting for INIT/SIPI sleeps until the poller's probe wakes
    /// it, but only when the poller probes it; a halted vCPU never does.
    #[test]
    fn an_unstarted_ap_sleeps_until_its_probe_only_when_probed() {
        use kvm_bindings::{KVM_MP_STATE_INIT_RECEIVED, KVM_MP_STATE_UNINITIALIZED};
        let h = state(2);
        assert_eq!(h.unstarted_sleep_ns(0, KVM_MP_STATE_UNINITIALIZED), None);
        h.probed[0].store(true, Ordering::Relaxed);
        assert_eq!(
            h.unstarted_sleep_ns(0, KVM_MP_STATE_UNINITIALIZED),
            Some(UNSTARTED_SLEEP_NS)
        );
        assert_eq!(
            h.unstarted_sleep_ns(0, KVM_MP_STATE_INIT_RECEIVED),
            Some(UNSTARTED_SLEEP_NS)
        );
        // the poller probes it every UNSTARTED_PROBE_EVERY rounds while so
        assert!(h.unstarted[0].load(Ordering::Relaxed));
        assert_eq!(h.unstarted_sleep_ns(0, KVM_MP_STATE_HALTED), None);
        assert!(!h.unstarted[0].load(Ordering::Relaxed));
        // vCPU 1 has no probe; an unknown index is not probed either
        assert_eq!(h.unstarted_sleep_ns(1, KVM_MP_STATE_UNINITIALIZED), None);
        assert_eq!(h.unstarted_sleep_ns(9, KVM_MP_STATE_UNINITIALIZED), None);
    }

    /// A halted vCPU the poller probes may sleep up to `HaltSleep::max`;
    /// one it cannot probe comes back within UNPROBED_SLEEP_MAX_NS (its
    /// interrupts reach it only then), and never below the base.
    #[test]
    fn only_a_probed_vcpu_sleeps_past_the_unprobed_bound() {
        let mut h = state(2);
        h.max_ns = 256_000_000;
        h.probed[0].store(true, Ordering::Relaxed);
        assert_eq!(h.max_ns_of(0), 256_000_000);
        assert_eq!(h.max_ns_of(1), UNPROBED_SLEEP_MAX_NS);
        assert_eq!(h.max_ns_of(7), UNPROBED_SLEEP_MAX_NS, "unknown index");
        h.max_ns = 4_000_000;
        assert_eq!(h.max_ns_of(1), 4_000_000, "a smaller max wins");
        h.base_ns = 32_000_000;
        h.max_ns = 64_000_000;
        assert_eq!(h.max_ns_of(1), 32_000_000, "never below the base");
    }

    /// The entering thread waits while the poller holds the vCPU, and the
    /// poller can take only a vCPU that sleeps: never one in `KVM_RUN`.
    #[test]
    fn entry_waits_out_a_probe_and_the_poller_never_takes_a_vcpu_in_the_guest() {
        let h = Arc::new(state(2));
        let take = |h: &HaltState, k: usize| {
            h.probe[k]
                .compare_exchange(ASLEEP, PROBED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        };
        // in the guest: the poller cannot take it
        assert!(!take(&h, 0));
        h.asleep(0);
        assert!(take(&h, 0));
        // entry now has to wait until the probe ends
        let entered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = {
            let (h, entered) = (h.clone(), entered.clone());
            std::thread::spawn(move || {
                h.claim(0);
                entered.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!entered.load(Ordering::SeqCst), "entered during a probe");
        h.probe[0].store(ASLEEP, Ordering::Release);
        t.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
        assert_eq!(h.probe[0].load(Ordering::SeqCst), IN_GUEST);
        assert!(!take(&h, 0));
        // the other vCPU was never touched; an unknown index is a no-op
        assert_eq!(h.probe[1].load(Ordering::SeqCst), IN_GUEST);
        h.claim(7);
        h.asleep(7);
    }

    /// Many entries and probes racing: no probe ever overlaps an entry.
    /// The entering side runs until the poller has probed many times (a
    /// loaded host may not run the poller at first), within 20 s.
    #[test]
    fn probes_and_entries_never_overlap_under_stress() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let h = Arc::new(state(1));
        let inside = Arc::new(AtomicU8::new(0)); // 1: in guest, 2: probing
        let stop = Arc::new(AtomicBool::new(false));
        let probes = Arc::new(AtomicU64::new(0));
        let poller = {
            let (h, inside, stop, probes) =
                (h.clone(), inside.clone(), stop.clone(), probes.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if h.probe[0]
                        .compare_exchange(ASLEEP, PROBED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        assert_eq!(
                            inside.swap(2, Ordering::SeqCst),
                            0,
                            "probe inside the guest"
                        );
                        std::hint::spin_loop();
                        assert_eq!(inside.swap(0, Ordering::SeqCst), 2);
                        h.probe[0].store(ASLEEP, Ordering::Release);
                        probes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        let t0 = std::time::Instant::now();
        let mut entries = 0u64;
        while (entries < 20_000 || probes.load(Ordering::Relaxed) < 1_000)
            && t0.elapsed() < std::time::Duration::from_secs(20)
        {
            h.claim(0);
            assert_eq!(inside.swap(1, Ordering::SeqCst), 0, "entry during a probe");
            std::hint::spin_loop();
            assert_eq!(inside.swap(0, Ordering::SeqCst), 1);
            h.asleep(0);
            if entries % 16 == 0 {
                // leave the poller a window even on one CPU
                std::thread::yield_now();
            }
            entries += 1;
        }
        stop.store(true, Ordering::Relaxed);
        poller.join().unwrap();
        assert!(
            probes.load(Ordering::Relaxed) > 0,
            "the poller never got a sleeping vCPU in 20 s"
        );
    }
}
