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
//! (this module's tests); the halt, the step and the IRQ block are KVM's
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvm_ioctls::VmFd;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    use super::ParkEnd;
    use crate::vcpu::{IoAction, PortIo, Vcpu, VcpuExit};

    /// Port 0x99 hands the value back; everything else goes on.
    struct TestIo;
    impl PortIo for TestIo {
        fn pio_read(&self, _: usize, _: u16, data: &mut [u8]) {
            data.fill(0xff);
        }
        fn pio_write(&self, _: usize, port: u16, _: &[u8]) -> IoAction {
            if port == 0x99 {
                IoAction::Exit
            } else {
                IoAction::Continue
            }
        }
    }

    /// A real-mode VM with the in-kernel irqchip and an enabled LAPIC,
    /// running `sti; hlt; out 0x99, al; jmp $` at 0x1000, whose handler
    /// for vector 0x30 writes 0x55 at 0x3000 and returns.
    fn halting_vm() -> Option<(VmFd, GuestMemoryMmap, Vcpu)> {
        let kvm = crate::test_kvm::kvm()?;
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let host = mem.get_host_address(GuestAddress(0)).unwrap();
        // SAFETY: `mem` is returned with the VM and outlives its use.
        unsafe {
            vm.set_user_memory_region(kvm_bindings::kvm_userspace_memory_region {
                slot: 0,
                flags: 0,
                guest_phys_addr: 0,
                memory_size: 0x10000,
                userspace_addr: host as u64,
            })
            .unwrap();
        }
        let code = [0xfb, 0xf4, 0xb0, 0x01, 0xe6, 0x99, 0xeb, 0xfe];
        mem.write_slice(&code, GuestAddress(0x1000)).unwrap();
        // IVT entry 0x30 -> 0000:2000: mov byte [0x3000], 0x55; iret
        mem.write_slice(&[0x00, 0x20, 0x00, 0x00], GuestAddress(0x30 * 4))
            .unwrap();
        mem.write_slice(&[0xc6, 0x06, 0x00, 0x30, 0x55, 0xcf], GuestAddress(0x2000))
            .unwrap();
        let v = Vcpu::new(&vm, 0, 0).unwrap();
        let mut s = v.fd().get_sregs().unwrap();
        s.cs.base = 0;
        s.cs.selector = 0;
        v.fd().set_sregs(&s).unwrap();
        v.fd()
            .set_regs(&kvm_bindings::kvm_regs {
                rip: 0x1000,
                rflags: 2,
                ..Default::default()
            })
            .unwrap();
        // the LAPIC software-enabled (spurious vector register)
        let mut l = v.fd().get_lapic().unwrap();
        for (i, b) in 0x1ffu32.to_le_bytes().iter().enumerate() {
            l.regs[0xf0 + i] = *b as _;
        }
        v.fd().set_lapic(&l).unwrap();
        Some((vm, mem, v))
    }

    /// Runs the halting VM's vCPU until it waits inside KVM (halted),
    /// kicks it out and hands it back.
    fn halted(v: Vcpu) -> Vcpu {
        let k = v.kicker();
        let t = std::thread::spawn(move || {
            let mut v = v;
            let e = v.run(&TestIo).unwrap();
            (e, v)
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        k.kick();
        let (e, v) = t.join().unwrap();
        assert_eq!(e, VcpuExit::Kicked);
        assert_eq!(
            v.fd().get_mp_state().unwrap().mp_state,
            kvm_bindings::KVM_MP_STATE_HALTED
        );
        v
    }

    /// A halted vCPU parked on another thread stays parked until an
    /// interrupt comes, then comes back without running its handler
    /// there (kvm_pvm: at the instruction after the HLT; see park.rs),
    /// and the guest takes the interrupt on its own thread's next run.
    #[test]
    fn a_parked_vcpu_comes_back_when_an_interrupt_wakes_it() {
        let Some((vm, mem, v)) = halting_vm() else {
            return;
        };
        let v = halted(v);
        let mut park = v.park_fd(&vm).unwrap();
        let t = std::thread::spawn(move || {
            let end = park.wait(&TestIo, &|| false);
            (end, park)
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!t.is_finished(), "a halted vCPU's park returned by itself");
        vm.signal_msi(kvm_bindings::kvm_msi {
            address_lo: 0xfee0_0000,
            data: 0x30,
            ..Default::default()
        })
        .unwrap();
        let (end, _park) = t.join().unwrap();
        assert_eq!(end, ParkEnd::Woken);
        // at most the one instruction after the HLT ran there, with the
        // interrupt held back (KVM_GUESTDBG_BLOCKIRQ)
        let rip = v.fd().get_regs().unwrap().rip;
        assert!((0x1002..=0x1004).contains(&rip), "rip {rip:#x}");
        let mut marker = [0u8];
        mem.read_slice(&mut marker, GuestAddress(0x3000)).unwrap();
        assert_eq!(marker, [0], "the handler ran on the parking thread");
        let mut v = v;
        let exit = v.run(&TestIo).unwrap();
        assert_eq!(
            exit,
            VcpuExit::Io {
                port: 0x99,
                value: 1,
                size: 1
            }
        );
        let mut marker = [0u8];
        mem.read_slice(&mut marker, GuestAddress(0x3000)).unwrap();
        assert_eq!(marker, [0x55], "the guest did not take the interrupt");
    }

    /// A park ends when its vCPU is wanted back: at once when asked before
    /// it begins (`stop`, or a kick waiting to be reported), and from
    /// inside `KVM_RUN` on a nudge (nothing for the vCPU's own thread to
    /// report) or a kick (reported by the vCPU's next run).
    #[test]
    fn a_park_ends_on_stop_nudge_or_kick() {
        let Some((vm, _mem, v)) = halting_vm() else {
            return;
        };
        let mut v = halted(v);
        let mut park = v.park_fd(&vm).unwrap();
        let io = TestIo;
        assert_eq!(park.wait(&io, &|| true), ParkEnd::Interrupted);
        let wanted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for kick in [false, true] {
            let w = wanted.clone();
            wanted.store(false, std::sync::atomic::Ordering::SeqCst);
            let t = std::thread::spawn(move || {
                let end = park.wait(&TestIo, &|| w.load(std::sync::atomic::Ordering::SeqCst));
                (end, park)
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!t.is_finished());
            if kick {
                v.kicker().kick();
            } else {
                wanted.store(true, std::sync::atomic::Ordering::SeqCst);
                v.kicker().nudge();
            }
            let (end, p) = t.join().unwrap();
            park = p;
            assert_eq!(end, ParkEnd::Interrupted, "kick {kick}");
        }
        // the kick is the vCPU's to report; the nudge left nothing
        assert_eq!(v.run(&io).unwrap(), VcpuExit::Kicked);
        // and a kick before the park began ends it at once
        v.kicker().kick();
        assert_eq!(park.wait(&io, &|| false), ParkEnd::Interrupted);
    }
}
