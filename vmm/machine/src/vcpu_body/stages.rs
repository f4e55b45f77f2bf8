//! The breakdown's stages of a wakeup ([`STAGES`]): their names, one
//! histogram each ([`Stages`]), and how an I/O path wakeup's stamps are
//! recorded; the body (`super::body`, `resumed`) records them when a vCPU
//! runs again.

use vcpu_sched::stats::Histogram;

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

/// Records the I/O path's stages of one wakeup: the device's I/O thread
/// woken at `dev` (0: not stamped, the interrupt came from elsewhere),
/// the interrupt raised at `irq`, the wake returned at `woken`, picked
/// at `picked` (0: no pick stamp), `KVM_RUN` at `now`.
pub(super) fn io_stages(
    stages: &mut Stages,
    (dev, irq, woken, picked): (u64, u64, u64, u64),
    now: u64,
) {
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
