//! Halted vCPUs of a Linux VM parked inside KVM, one thread each.
//!
//! WHAT: with parking on (`--halt-park on`), a vCPU that the scheduler
//! finds waiting inside `KVM_RUN` (halted, or an AP before its SIPI)
//! leaves its worker as before, and its park thread waits for it inside
//! `KVM_RUN` ([`ParkFd`]) instead of the halt poller asking KVM about it
//! every period. When KVM wakes it (an interrupt, its timer, an NMI, a
//! SIPI) the park thread hands it back and wakes its task in the
//! scheduler; the guest runs on a worker again, where the interrupt is
//! delivered.
//!
//! WHY: the poller's probes (`KVM_GET_LAPIC` for every sleeping vCPU
//! every period) and its one-period delay for an IPI were the measured
//! cost of booting four 12-vCPU guests on 2 CPUs (docs/results-vcpus.md,
//! "Linux boot"). A parked vCPU costs nothing while it sleeps and is seen
//! the moment KVM sees it.
//!
//! HOW: the vCPU's probe state ([`super::linux`]'s `IN_GUEST`, `ASLEEP`,
//! `PROBED`) gains `PARKED` (its park thread owns it; the poller neither
//! probes nor kicks it) and `RECLAIM` (its task was woken by someone else,
//! a device's MSI or the park's safety timer, and the thread that will run
//! it asked for it back). The worker that parks a vCPU stores `PARKED`
//! and signals the park thread; the park thread waits, then swaps the
//! state back to `ASLEEP` and, unless it was reclaimed, wakes the task.
//! A worker about to enter a vCPU that is `PARKED` swaps in `RECLAIM`,
//! nudges the park thread out of `KVM_RUN` and waits for `ASLEEP`. An
//! exit the device side or KVM returns while the vCPU steps its one
//! instruction (a reset, a power-off) is kept for the vCPU's own thread,
//! which a kick sends to it. A kernel that refuses the park's guest
//! debugging turns parking off for the VM; the poller takes over.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

use crate::devices::Devices;
use crate::vcpu::park::{ParkEnd, ParkFd};
use crate::vcpu::{Kicker, Vcpu, VcpuExit};

use super::VcpuWaker;

/// Probe states shared with [`super::linux`] (see there and the module
/// docs).
pub(super) const IN_GUEST: u8 = 0;
pub(super) const ASLEEP: u8 = 1;
pub(super) const PROBED: u8 = 2;
pub(super) const PARKED: u8 = 3;
pub(super) const RECLAIM: u8 = 4;

/// How long a parked vCPU's task sleeps if nothing wakes it: a safety
/// net only (the park thread wakes it when KVM does).
pub(super) const PARKED_SLEEP_NS: u64 = 1_000_000_000;

/// One vCPU's park thread's mailbox.
struct ParkSlot {
    /// Work for the thread: park the vCPU now.
    go: Mutex<bool>,
    cv: Condvar,
    kicker: Kicker,
    /// An exit that ended a park, for the vCPU's own thread.
    stash: Mutex<Option<VcpuExit>>,
}

struct Shared {
    /// Per vCPU: the probe state (shared with the halt poller).
    states: Arc<[AtomicU8]>,
    slots: Box<[ParkSlot]>,
    devices: Arc<Devices>,
    waker: OnceLock<VcpuWaker>,
    quit: AtomicBool,
    /// Parking works here (a park found the kernel refusing its guest
    /// debugging: off for good).
    enabled: AtomicBool,
    counts: [AtomicU64; 3],
}

/// What a VM's park threads did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParkCounts {
    /// vCPUs handed to their park thread.
    pub parked: u64,
    /// Parks that KVM ended (the vCPU became runnable) and whose task the
    /// park thread woke.
    pub woken: u64,
    /// Parks ended because the vCPU was wanted back first (its task woken
    /// by a device's interrupt or its safety timer, or a stop).
    pub reclaimed: u64,
}

/// The park threads of one VM (module docs). Dropping it stops them.
pub struct Parker {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Parker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parker")
            .field("vcpus", &self.shared.slots.len())
            .field("enabled", &self.shared.enabled.load(Ordering::Relaxed))
            .finish()
    }
}

impl Parker {
    /// Park threads for `vcpus` of the VM `vm`, sharing `states` with the
    /// VM's halt state (one per vCPU). Starts the threads now, from the
    /// caller's thread (so they take its CPU affinity and policy, not a
    /// worker's). Errors if a second handle or a thread cannot be made.
    pub(super) fn new(
        vm: &kvm_ioctls::VmFd,
        vcpus: &[Vcpu],
        devices: Arc<Devices>,
        states: Arc<[AtomicU8]>,
    ) -> Result<Self, String> {
        let mut fds = Vec::with_capacity(vcpus.len());
        for v in vcpus {
            fds.push(v.park_fd(vm).map_err(|e| e.to_string())?);
        }
        let shared = Arc::new(Shared {
            states,
            slots: vcpus
                .iter()
                .map(|v| ParkSlot {
                    go: Mutex::new(false),
                    cv: Condvar::new(),
                    kicker: v.kicker(),
                    stash: Mutex::new(None),
                })
                .collect(),
            devices,
            waker: OnceLock::new(),
            quit: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            counts: Default::default(),
        });
        let parker = Parker {
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
        };
        for fd in fds {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("park{}", fd.index()))
                .spawn(move || s.run(fd))
                .map_err(|e| format!("starting a park thread: {e}"))?;
            lock(&parker.threads).push(t);
        }
        Ok(parker)
    }

    /// The VM's vCPUs became tasks: `waker` wakes them.
    pub(super) fn attached(&self, waker: VcpuWaker) {
        let _ = self.shared.waker.set(waker);
    }

    /// Hands vCPU `k`, found waiting inside `KVM_RUN` by the thread that
    /// runs it (which holds it `IN_GUEST` and will issue no ioctl on it
    /// until it takes it back), to its park thread. False if parking is
    /// off here (the caller sleeps it as before).
    pub(super) fn park(&self, k: usize) -> bool {
        let s = &self.shared;
        let (Some(slot), Some(state)) = (s.slots.get(k), s.states.get(k)) else {
            return false;
        };
        if !s.enabled.load(Ordering::Acquire) || s.quit.load(Ordering::Acquire) {
            return false;
        }
        state.store(PARKED, Ordering::SeqCst);
        s.counts[0].fetch_add(1, Ordering::Relaxed);
        *lock(&slot.go) = true;
        slot.cv.notify_one();
        true
    }

    /// Asks the park thread of vCPU `k` (which the caller found `PARKED`
    /// and moved to `RECLAIM`) to give it back.
    pub(super) fn nudge(&self, k: usize) {
        if let Some(slot) = self.shared.slots.get(k) {
            slot.kicker.nudge();
        }
    }

    /// An exit that ended vCPU `k`'s last park, for its own thread.
    pub(super) fn take_stash(&self, k: usize) -> Option<VcpuExit> {
        let slot = self.shared.slots.get(k)?;
        lock(&slot.stash).take()
    }

    /// Is parking on here?
    pub fn enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Acquire)
    }

    /// What the park threads did so far.
    pub fn counts(&self) -> ParkCounts {
        let c = |i: usize| self.shared.counts[i].load(Ordering::Relaxed);
        ParkCounts {
            parked: c(0),
            woken: c(1),
            reclaimed: c(2),
        }
    }
}

impl Drop for Parker {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        for slot in self.shared.slots.iter() {
            *lock(&slot.go) = true;
            slot.cv.notify_one();
        }
        // The threads are in vCPU order. A nudge whose signal lands just
        // before its thread enters KVM_RUN is lost once the vCPU itself is
        // gone (no immediate_exit to set then): nudge until it has ended.
        for (slot, t) in self.shared.slots.iter().zip(lock(&self.threads).drain(..)) {
            while !t.is_finished() {
                slot.kicker.nudge();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let _ = t.join();
        }
    }
}

impl Shared {
    /// One park thread: waits for work, parks, hands back.
    fn run(&self, mut fd: ParkFd) {
        let k = fd.index();
        let slot = &self.slots[k];
        let state = &self.states[k];
        loop {
            {
                let mut go = lock(&slot.go);
                while !*go {
                    go = slot.cv.wait(go).unwrap_or_else(|p| p.into_inner());
                }
                *go = false;
            }
            if self.quit.load(Ordering::Acquire) {
                return;
            }
            let end = if state.load(Ordering::SeqCst) == PARKED {
                fd.wait(&*self.devices, &|| {
                    state.load(Ordering::SeqCst) != PARKED || self.quit.load(Ordering::SeqCst)
                })
            } else {
                ParkEnd::Interrupted
            };
            match end {
                ParkEnd::Woken | ParkEnd::Interrupted => {}
                ParkEnd::Unsupported(why) => {
                    if self.enabled.swap(false, Ordering::AcqRel) {
                        tracing::warn!(
                            "parking halted vCPUs inside KVM is not possible here ({why}): \
                             the halt poller watches them instead"
                        );
                    }
                }
                ParkEnd::Exit(e) => {
                    *lock(&slot.stash) = Some(e);
                    // its own thread's next KVM_RUN returns Kicked and
                    // finds the exit (LinuxMapper::on_kicked)
                    slot.kicker.kick();
                }
            }
            let prev = state.swap(ASLEEP, Ordering::SeqCst);
            if prev == PARKED {
                self.counts[1].fetch_add(1, Ordering::Relaxed);
                if let Some(w) = self.waker.get() {
                    w.wake_parked(k);
                }
            } else {
                self.counts[2].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
