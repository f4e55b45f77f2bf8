//! The breakdown's stages of a wakeup ([`STAGES`]) and what a vCPU
//! records when it runs again after blocking ([`resumed`]): its doorbell
//! or timer latency and, with the set's breakdown on, the stages of the
//! wakeup (doorbell, timer or I/O path) from the stamps its slot holds.

use std::sync::atomic::Ordering;

use vcpu_sched::stats::Histogram;

use super::set::{VcpuMetrics, VcpuSlot, VmSet};

/// The stages of a wakeup, as `vmm bench --breakdown` reports them: for a
/// doorbell (another vCPU's port write, seen by the VMM when that vCPU's
/// `KVM_RUN` returns) and for a sleep's timer (due time), the time until
/// the waker's call into the executor returned (`wake`, for a timer
/// `fire`: the clock thread's lateness plus its wake call), until the
/// executor picked the vCPU to run (`dispatch`: the kick, the worker's
/// wakeup, the wait on its runqueue; for the host executor the futex wake
/// of the vCPU thread), and until `KVM_RUN` was entered (`enter`). The
/// `host` and `threads` executors have no pick separate from the vCPU's
/// thread running again, so for them "wake -> picked" runs to `KVM_RUN`
/// and "picked -> KVM_RUN" stays empty; their timers are the kernel's
/// (`host`) or the executor's own (`threads`), so "due -> wake returned"
/// is the whole time until the vCPU's thread runs again.
///
/// The last four are the **block path**: a vCPU's `KVM_RUN` returned with
/// an exit that blocks it (`HLT`, a sleep), and the same CPU enters
/// `KVM_RUN` next for another vCPU that was already waiting to run. On
/// `workers`: until the worker called the core's `schedule` (the exit's
/// handling), the `schedule` call itself (dequeue and pick), from the pick
/// until the next vCPU's `KVM_RUN`, and the total; a block after which the
/// CPU goes idle has no next vCPU and is not counted. On `host` the host
/// kernel does the switch, so only the total is seen: a vCPU thread about
/// to enter `KVM_RUN` that was woken (or due) before a vCPU last blocked
/// on the host CPU it now runs on records the time since that block.
///
/// The last five are the **I/O path**: a device's interrupt (an MSI)
/// that wakes a halted vCPU. From the moment the device's I/O thread was
/// woken by what it served (a queue's ioeventfd: the guest's notify, with
/// the `sync` block engine; a block engine's completion eventfd; a tap's
/// packet) until the device raised the interrupt (the request's
/// handling), until the VMM's wake of the vCPU returned (the scheduler's
/// wake and kick), until picked, until `KVM_RUN`, and the total. These
/// wakeups are not counted as doorbells. The leg before the I/O thread's
/// wakeup (the guest's MMIO write signalling the ioeventfd inside KVM,
/// and the host kernel waking the I/O thread) runs no VMM code and is
/// not stamped; the I/O threads are host threads under either executor.
pub const STAGES: [&str; 15] = [
    "doorbell: exit -> wake returned",
    "doorbell: wake -> picked",
    "doorbell: picked -> KVM_RUN",
    "timer: due -> wake returned",
    "timer: wake -> picked",
    "timer: picked -> KVM_RUN",
    "block: exit -> schedule called",
    "block: schedule (dequeue, pick)",
    "block: picked -> next KVM_RUN",
    "block: exit -> next vCPU's KVM_RUN",
    "io: device woken -> interrupt",
    "io: interrupt -> wake returned",
    "io: wake -> picked",
    "io: picked -> KVM_RUN",
    "io: device woken -> KVM_RUN",
];

/// Index of the first block-path stage in [`STAGES`].
pub(super) const BLOCK: usize = 6;
/// Index of the first I/O-path stage in [`STAGES`].
const IO: usize = BLOCK + 4;

/// One histogram per stage of [`STAGES`] (ns).
#[derive(Clone, Debug, Default)]
pub struct Stages(pub [Histogram; STAGES.len()]);

impl Stages {
    /// Adds `o`'s samples.
    pub fn merge(&mut self, o: &Stages) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            a.merge(b);
        }
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

/// Records the latency of a vCPU that runs again after `how` (called
/// right before its `KVM_RUN`), and with the breakdown on, its stages.
pub(crate) fn resumed(set: &VmSet, slot: &VcpuSlot, m: &mut VcpuMetrics, how: Resume) {
    let now = set.now();
    // breakdown off: no read-modify-write on the slot's line
    let (woken, picked, io) = if set.breakdown_on() {
        (
            slot.woken_at.swap(0, Ordering::AcqRel),
            slot.picked_at.swap(0, Ordering::AcqRel),
            slot.take_io_stamps(),
        )
    } else {
        (0, 0, None)
    };
    let inside = set.window.inside(now);
    let (from, base) = match how {
        Resume::Halt(blocked_at) => {
            let d = slot.doorbell_at.swap(0, Ordering::AcqRel);
            if d != 0 && inside {
                m.doorbell_latency
                    .record(now.saturating_sub(d.max(blocked_at)));
            }
            // a wake that came before the vCPU blocked is no wakeup of
            // a blocked vCPU: no stages
            if woken < blocked_at {
                return;
            }
            // an interrupt woke it; one raised before the block (just
            // before the HLT's exit, its wake racing it) is no clean
            // sample of either path: no stages
            if let Some((dev, irq)) = io {
                if irq >= blocked_at && inside {
                    io_stages(&mut m.stages, (dev, irq, woken, picked), now);
                }
                return;
            }
            (d.max(blocked_at), 0)
        }
        Resume::Timer(due) => {
            if inside {
                m.timer_latency.record(now.saturating_sub(due));
            }
            (due, 3)
        }
    };
    if woken != 0 && from != 0 && inside {
        let st = &mut m.stages.0;
        st[base].record(woken.saturating_sub(from));
        if picked >= woken {
            st[base + 1].record(picked - woken);
            st[base + 2].record(now.saturating_sub(picked));
        } else {
            // no pick stamp (threads, host): wake to KVM_RUN in one
            st[base + 1].record(now.saturating_sub(woken));
        }
    }
}

/// Records the I/O path's stages of one wakeup: the device's I/O thread
/// woken at `dev` (0: not stamped, the interrupt came from elsewhere),
/// the interrupt raised at `irq`, the wake returned at `woken`, picked
/// at `picked` (0: no pick stamp), `KVM_RUN` at `now`.
fn io_stages(stages: &mut Stages, (dev, irq, woken, picked): (u64, u64, u64, u64), now: u64) {
    let st = &mut stages.0;
    if dev != 0 && dev <= irq {
        st[IO].record(irq - dev);
        st[IO + 4].record(now.saturating_sub(dev));
    }
    st[IO + 1].record(woken.saturating_sub(irq));
    if picked >= woken {
        st[IO + 2].record(picked - woken);
        st[IO + 3].record(now.saturating_sub(picked));
    } else {
        st[IO + 2].record(now.saturating_sub(woken));
    }
}
