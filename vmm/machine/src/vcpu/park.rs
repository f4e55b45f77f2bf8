//! Waiting inside KVM for a halted vCPU's wakeup, on a thread that is not
//! the one that runs the vCPU.
//!
//! WHAT: a [`ParkFd`] is a second handle on a vCPU (a duplicate of its fd
//! with its own mapping of the same `kvm_run` page). [`ParkFd::wait`]
//! enters `KVM_RUN` with single-step guest debugging on: KVM blocks the
//! calling thread for as long as the vCPU is halted (or an AP waits for
//! INIT/SIPI), exactly as it blocks a 1:1 vCPU thread, and when an
//! interrupt, a timer, an NMI or a SIPI makes the vCPU runnable it returns
//! `KVM_EXIT_DEBUG` after at most one guest instruction.
//!
//! WHY: under an M:N scheduler a halted vCPU must give its worker back,
//! and then nothing inside KVM watches it: the halt poller has to ask
//! KVM (`KVM_GET_LAPIC`) every period whether an interrupt is pending,
//! for every sleeping vCPU, and it sees an IPI one period late. A thread
//! parked in `KVM_RUN` costs nothing while the vCPU sleeps and is woken
//! by KVM itself, at once, for every event KVM would wake a vCPU for.
//! The single step keeps the guest off that thread: the scheduler, not
//! the host kernel, decides when the vCPU runs again.
//!
//! HOW: [`ParkFd::wait`] registers the calling thread as the vCPU's run
//! thread (so the vCPU's [`Kicker`](super::Kicker) interrupts it), clears
//! `immediate_exit`, checks that nobody asked for the vCPU back, and
//! enters `KVM_RUN` single-stepping with interrupts held back
//! (`KVM_GUESTDBG_BLOCKIRQ`). KVM still counts a pending interrupt as a
//! reason to wake a halted vCPU, so the wait ends when one arrives; the
//! vCPU then executes one instruction (the one after its `HLT`) with the
//! interrupt still pending, and the step's trap returns `KVM_EXIT_DEBUG`.
//! The single step is cleared before the wait returns; the interrupt is
//! taken on the vCPU's next `KVM_RUN`, on whichever worker the scheduler
//! runs it. Port and MMIO exits on the way (should that one instruction
//! be an access) go to the device side as in
//! [`Vcpu::run`](super::Vcpu::run); a kick or a
//! [`Kicker::nudge`](super::Kicker::nudge) ends the wait with `EINTR`.
//! Both behaviours are tested on this project's kvm_pvm host
//! (`vcpu::tests`); the halt, the step and the IRQ block are KVM's
//! generic x86 code, so hardware KVM should behave the same (not
//! measured: no such host here). Kernels before 5.16 refuse `BLOCKIRQ`: the wait then
//! reports an error and the caller keeps the halt poller.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use kvm_bindings::{
    kvm_guest_debug, KVM_GUESTDBG_BLOCKIRQ, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP,
};
use kvm_ioctls::{VcpuExit as KvmExit, VcpuFd, VmFd};

use super::kick::{KickShared, RunGuard};
use super::{step_of, PortIo, Step, Vcpu, VcpuError, VcpuExit, VcpuStats};

/// The guest debugging a park sets: single-step, with interrupts held
/// back (`KVM_GUESTDBG_BLOCKIRQ`, Linux 5.16): without it KVM injects the
/// interrupt that woke the vCPU under the step, and the FLAGS image the
/// interrupt pushes carries the step's TF, which the guest's `IRET`
/// restores once the step is off (a spurious debug trap in the guest).
const STEP: u32 = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP | KVM_GUESTDBG_BLOCKIRQ;

/// A second handle on one vCPU, for waiting on it ([module docs](self)).
pub struct ParkFd {
    fd: VcpuFd,
    kick: Arc<KickShared>,
    index: usize,
}

/// How [`ParkFd::wait`] ended.
#[derive(Debug, PartialEq)]
pub enum ParkEnd {
    /// The vCPU became runnable (`KVM_EXIT_DEBUG`).
    Woken,
    /// A kick, a nudge, or a request to stop waiting (`stop` said so
    /// before the wait began).
    Interrupted,
    /// The device side or KVM ended the vCPU's run while it stepped: the
    /// exit as [`Vcpu::run`](super::Vcpu::run) would have returned it.
    Exit(VcpuExit),
    /// KVM refused the park's guest debugging (a kernel before 5.16 has
    /// no `KVM_GUESTDBG_BLOCKIRQ`); nothing ran.
    Unsupported(String),
}

impl Vcpu {
    /// A [`ParkFd`] for this vCPU of `vm`.
    pub fn park_fd(&self, vm: &VmFd) -> Result<ParkFd, VcpuError> {
        let err = |op| {
            let index = self.index;
            move |source| VcpuError::Kvm {
                vcpu: index,
                op,
                source,
            }
        };
        // SAFETY: dup has no memory preconditions; the vCPU fd is valid.
        let dup = unsafe { libc::dup(self.fd.as_raw_fd()) };
        if dup < 0 {
            return Err(err("dup")(kvm_ioctls::Error::last()));
        }
        // SAFETY: `dup` is a new fd of this vCPU that nothing else owns;
        // the VcpuFd made from it owns and closes it, and maps its own
        // view of the vCPU's kvm_run page.
        let fd = unsafe { vm.create_vcpu_from_rawfd(dup) }.map_err(err("KVM_CREATE_VCPU (dup)"))?;
        Ok(ParkFd {
            fd,
            kick: self.kick.clone(),
            index: self.index,
        })
    }
}

impl ParkFd {
    /// The vCPU's index in its VM.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Waits inside `KVM_RUN` until the vCPU becomes runnable, or a kick
    /// or nudge comes, or `stop()` (asked once the thread is registered
    /// for kicks) is true. The caller must be the only one to use the
    /// vCPU meanwhile: its own thread stays out of `KVM_RUN` and every
    /// other ioctl until this returns.
    pub fn wait(&mut self, io: &dyn PortIo, stop: &dyn Fn() -> bool) -> ParkEnd {
        let _guard = RunGuard::enter(&self.kick);
        // A kick or nudge from now on sets immediate_exit after this and
        // signals this thread; one before it is in `pending` or in
        // `stop()` (the nudger's flag), both read after it.
        self.kick.set_immediate_exit(0);
        if self.kick.is_pending() || stop() {
            return ParkEnd::Interrupted;
        }
        if let Err(e) = self.debug(STEP) {
            return ParkEnd::Unsupported(format!("KVM_SET_GUEST_DEBUG: {e}"));
        }
        let mut stats = VcpuStats::default();
        let end = loop {
            let step = match self.fd.run() {
                Ok(KvmExit::Debug(_)) => break ParkEnd::Woken,
                Ok(exit) => step_of(exit, self.index, &mut stats, io),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    break ParkEnd::Interrupted
                }
                Err(e) => {
                    break ParkEnd::Exit(VcpuExit::Unexpected(format!("KVM_RUN while parked: {e}")))
                }
            };
            match step {
                Step::Continue => {}
                Step::Return(exit) => break ParkEnd::Exit(exit),
                Step::Interrupted => break ParkEnd::Interrupted,
                Step::Internal => {
                    break ParkEnd::Exit(VcpuExit::Unexpected(
                        "KVM internal error while parked".into(),
                    ))
                }
            }
        };
        if let Err(e) = self.debug(0) {
            return ParkEnd::Exit(VcpuExit::Unexpected(format!(
                "unparking a vCPU (KVM_SET_GUEST_DEBUG off): {e}"
            )));
        }
        end
    }

    fn debug(&self, control: u32) -> Result<(), kvm_ioctls::Error> {
        self.fd.set_guest_debug(&kvm_guest_debug {
            control,
            ..Default::default()
        })
    }
}
