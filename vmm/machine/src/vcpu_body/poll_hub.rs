//! One halt-poll thread for every Linux VM on a shared pool.
//!
//! WHAT: [`PollHub`] runs the [`HaltPoller`] rounds and the device
//! interrupt wakeups ([`IrqWakeups`]) of every Linux VM attached to a
//! [`VcpuPool`](super::VcpuPool) (`vmm serve`) on one thread, instead of
//! one thread per VM.
//!
//! WHY: a poller thread wakes every poll period (1 ms) whether or not it
//! finds anything, and on a busy host each of those wakeups preempts a
//! worker in the middle of a vCPU (one more guest exit on this kvm_pvm
//! host, and one more host context switch everywhere). With 4 VMs
//! booting on 2 CPUs the four pollers cost about 10% of the machine;
//! with a hundred VMs one thread per VM would be a hundred thousand
//! wakeups a second. One thread makes one wakeup per period however many
//! VMs there are; what is left is the work of each round (a `pread` per
//! running vCPU, an ioctl per sleeping one).
//!
//! HOW: [`PollHub::add`] registers a VM (its poller, its interrupt marks,
//! and a weak handle of its running set); its MSI hook unparks the hub's
//! thread. Each pass wakes the marked vCPUs of every VM, and once per
//! period runs every VM's round. A VM leaves the hub when its set stops
//! or its last vCPU is gone, or when its `Running` is dropped (the handle
//! is weak: stopping a VM unwraps its `Running`, which a round holds for
//! that VM's few microseconds only).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::linux::{HaltPoller, IrqWakeups};
use super::Running;
use crate::devices::MsiWakeSlot;

/// One VM on the hub.
struct HubVm {
    /// The VM's name, for the closing line.
    name: String,
    poller: HaltPoller,
    irqs: Arc<IrqWakeups>,
    running: Weak<Running>,
}

struct HubShared {
    vms: Mutex<Vec<HubVm>>,
    quit: AtomicBool,
    period: Duration,
}

/// See the module docs. Dropping it stops the thread.
pub struct PollHub {
    shared: Arc<HubShared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PollHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollHub")
            .field("vms", &lock(&self.shared.vms).len())
            .finish()
    }
}

impl PollHub {
    /// Starts the thread, with rounds every `period`.
    pub fn start(period: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(HubShared {
            vms: Mutex::new(Vec::new()),
            quit: AtomicBool::new(false),
            period,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("halt-poll".into())
            .spawn(move || s.run())?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Polls a VM from now until it stops: `poller` made for its vCPUs,
    /// `apics` their APIC IDs (for the MSI hook in `msi_wake`, whose slot
    /// must be empty) and `running` its running set (one VM).
    pub fn add(
        &self,
        poller: HaltPoller,
        apics: &[u32],
        msi_wake: &MsiWakeSlot,
        running: &Arc<Running>,
    ) {
        let Some(t) = self.thread.as_ref().map(|t| t.thread().clone()) else {
            return;
        };
        let irqs = Arc::new(IrqWakeups::for_thread(apics, t.clone()));
        let hook = irqs.clone();
        let _ = msi_wake.set(Arc::new(move |apic| hook.note(apic)));
        lock(&self.shared.vms).push(HubVm {
            name: running.set().vms()[0].name.clone(),
            poller,
            irqs,
            running: Arc::downgrade(running),
        });
        t.unpark();
    }

    /// VMs it polls now.
    pub fn vms(&self) -> usize {
        lock(&self.shared.vms).len()
    }
}

impl Drop for PollHub {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl HubShared {
    fn run(&self) {
        let mut next = Instant::now();
        while !self.quit.load(Ordering::Acquire) {
            let due = Instant::now() >= next;
            lock(&self.vms).retain(|v| {
                let left = || {
                    let parks = v.poller.park_counts();
                    tracing::info!(
                        vm = %v.name,
                        preempt_marks = v.poller.preempt_marks(),
                        parked = parks.parked,
                        park_woken = parks.woken,
                        park_reclaimed = parks.reclaimed,
                        "left the halt-poll hub"
                    );
                    false
                };
                let Some(r) = v.running.upgrade() else {
                    return left();
                };
                let set = r.set();
                if set.stopping() || set.vms()[0].live() == 0 {
                    return left();
                }
                v.irqs.wake_marked(&|k| r.wake(0, k));
                if due {
                    v.poller.round(&|k| r.wake(0, k));
                }
                true
            });
            if due {
                next = Instant::now() + self.period;
            }
            // A device interrupt (or a new VM, or the drop) unparks it early.
            std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread starts with no VM, rounds on its period, and a drop
    /// stops it at once (it is parked between rounds, not sleeping).
    #[test]
    fn a_hub_starts_empty_and_stops_at_once_when_dropped() {
        let hub = PollHub::start(Duration::from_secs(3600)).expect("thread");
        assert_eq!(hub.vms(), 0);
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        drop(hub);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the drop waited {:?} for a parked thread",
            t0.elapsed()
        );
    }
}
