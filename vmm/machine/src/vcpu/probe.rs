//! Looking at a vCPU from outside its run loop, as the Linux halt poller
//! does: KVM's binary stats (`blocking`), and the MP state and local APIC
//! of a vCPU that is out of `KVM_RUN`.
//!
//! kvm-ioctls has no wrapper for `KVM_GET_STATS_FD`, and its MP-state and
//! LAPIC calls need the `VcpuFd`, which the thread that runs the vCPU
//! owns; a [`Probe`] works on a duplicate of the fd instead. KVM
//! serialises a vCPU's ioctls on its mutex, so a probe of a vCPU inside
//! `KVM_RUN` would wait for its next exit: callers probe only vCPUs they
//! know are out of the guest.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use kvm_bindings::{
    KVM_MP_STATE_AP_RESET_HOLD, KVM_MP_STATE_HALTED, KVM_MP_STATE_INIT_RECEIVED,
    KVM_MP_STATE_UNINITIALIZED,
};

use super::Vcpu;

/// `KVM_GET_STATS_FD`, `_IO(KVMIO, 0xce)` (kvm-ioctls has no wrapper).
const KVM_GET_STATS_FD: libc::c_ulong = 0xae00 | 0xce;

/// A vCPU's `blocking` stat: the stats fd and where the value lives.
pub struct BlockingStat {
    fd: OwnedFd,
    offset: u64,
}

impl BlockingStat {
    /// Opens `vcpu`'s stats fd and finds `blocking`; `None` if KVM has
    /// no stats fd or no such stat.
    pub fn open(vcpu: &Vcpu) -> Option<Self> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd
        // (or -1); the vCPU fd is valid for the call.
        let raw = unsafe { libc::ioctl(vcpu.fd().as_raw_fd(), KVM_GET_STATS_FD as _, 0) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a new fd this process owns from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut hdr = [0u8; 24];
        pread(&fd, &mut hdr, 0)?;
        let u = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (name_size, num_desc, desc_offset, data_offset) =
            (u(&hdr, 4), u(&hdr, 8), u(&hdr, 16), u(&hdr, 20));
        let dsize = 16 + name_size as usize;
        if num_desc > 4096 || name_size > 4096 {
            return None;
        }
        let mut descs = vec![0u8; dsize * num_desc as usize];
        pread(&fd, &mut descs, desc_offset as u64)?;
        for d in descs.chunks_exact(dsize) {
            let name = &d[16..];
            let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            if &name[..end] == b"blocking" {
                return Some(Self {
                    fd,
                    offset: data_offset as u64 + u(d, 8) as u64,
                });
            }
        }
        None
    }

    /// Is the vCPU halted inside `KVM_RUN` right now?
    pub fn blocking(&self) -> bool {
        let mut v = [0u8; 8];
        pread(&self.fd, &mut v, self.offset).is_some() && u64::from_ne_bytes(v) != 0
    }
}

fn pread(fd: &OwnedFd, buf: &mut [u8], off: u64) -> Option<()> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writes; the fd is
    // open.
    let n = unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            off as libc::off_t,
        )
    };
    (n == buf.len() as isize).then_some(())
}

/// Would `KVM_RUN` block in this MP state until an event arrives? A
/// halted vCPU waits for an interrupt; an application processor that the
/// guest has not started yet (`UNINITIALIZED`, `INIT_RECEIVED`, or parked
/// in `AP_RESET_HOLD`) waits for INIT/SIPI from the boot CPU. All of them
/// would hold a run slot doing nothing, so they give it up alike. During
/// early boot that is 11 of 12 vCPUs: before the APs were counted here
/// the boot CPU ran about 6x slower under the scheduler than on host 1:1
/// threads (docs/data/boot-sched/).
pub fn waits_in_kvm(mp_state: u32) -> bool {
    matches!(
        mp_state,
        KVM_MP_STATE_HALTED
            | KVM_MP_STATE_UNINITIALIZED
            | KVM_MP_STATE_INIT_RECEIVED
            | KVM_MP_STATE_AP_RESET_HOLD
    )
}

vmm_sys_util::ioctl_ior_nr!(KVM_GET_MP_STATE, 0xae, 0x98, kvm_bindings::kvm_mp_state);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_LAPIC, 0xae, 0x8e, kvm_bindings::kvm_lapic_state);

/// Would the local APIC in `regs` (a `KVM_GET_LAPIC` image) deliver an
/// interrupt now? Its highest requested vector (IRR) must be of a higher
/// priority class than the processor priority: the larger of the task
/// priority (TPR) and the highest vector in service (ISR), as the SDM's
/// "Interrupt, Task, and Processor Priority" section defines it.
pub fn lapic_has_deliverable(regs: &[u8]) -> bool {
    let reg = |off: usize| {
        regs.get(off..off + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let highest = |base: usize| {
        (0..8usize).rev().find_map(|i| {
            let v = reg(base + 0x10 * i);
            (v != 0).then(|| i as u32 * 32 + 31 - v.leading_zeros())
        })
    };
    let Some(irr) = highest(0x200) else {
        return false;
    };
    let tpr_class = (reg(0x80) >> 4) & 0xf;
    let isr_class = highest(0x100).map_or(0, |v| v >> 4);
    irr >> 4 > tpr_class.max(isr_class)
}

/// A duplicate of a vCPU's fd, for the ioctls of a prober.
pub struct Probe {
    fd: OwnedFd,
}

impl Probe {
    /// A probe of `vcpu` (`None` if the process is out of fds).
    pub fn new(vcpu: &Vcpu) -> Option<Self> {
        dup_fd(vcpu.fd().as_raw_fd()).map(|fd| Self { fd })
    }

    /// Is the wait of this vCPU, which is out of `KVM_RUN`, over? (See
    /// `wait_is_over`.)
    pub fn wait_is_over(&self) -> bool {
        wait_is_over(&self.fd)
    }

    /// For a vCPU last seen `HALTED`: does its LAPIC hold an interrupt it
    /// would take? One ioctl where [`Probe::wait_is_over`] makes two: it
    /// does not see an INIT or SIPI (KVM accepts those in
    /// `KVM_GET_MP_STATE`), so a caller still makes a full probe now and
    /// then. An error reads as "pending" (see `wait_is_over`).
    pub fn interrupt_pending(&self) -> bool {
        lapic_pending(&self.fd)
    }
}

/// Is the wait of a vCPU that is out of `KVM_RUN` over? `KVM_GET_MP_STATE`
/// first (KVM accepts a pending INIT/SIPI there, so a started AP reads
/// runnable), then, for a halted vCPU, its LAPIC (`KVM_GET_LAPIC` moves
/// posted interrupts into the IRR first). An error reads as "over": the
/// vCPU re-enters and KVM reports the problem on its own thread.
fn wait_is_over(fd: &OwnedFd) -> bool {
    let mut mp = kvm_bindings::kvm_mp_state::default();
    // SAFETY: KVM_GET_MP_STATE writes one kvm_mp_state into `mp`, which
    // lives for the call; the fd is a vCPU fd no thread is running.
    let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(fd, KVM_GET_MP_STATE(), &mut mp) };
    if rc < 0 || !waits_in_kvm(mp.mp_state) {
        return true;
    }
    if mp.mp_state != KVM_MP_STATE_HALTED {
        return false;
    }
    lapic_pending(fd)
}

/// Does the LAPIC of a vCPU out of `KVM_RUN` hold a deliverable
/// interrupt? (`KVM_GET_LAPIC` moves posted interrupts into the IRR
/// first.) An error reads as "yes".
fn lapic_pending(fd: &OwnedFd) -> bool {
    let mut lapic = kvm_bindings::kvm_lapic_state::default();
    // SAFETY: KVM_GET_LAPIC writes one kvm_lapic_state into `lapic`,
    // which lives for the call; the fd is a vCPU fd no thread is running.
    let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(fd, KVM_GET_LAPIC(), &mut lapic) };
    if rc < 0 {
        return true;
    }
    lapic_has_deliverable(&lapic.regs.map(|b| b as u8))
}

/// A duplicate of `fd` (`None` if the process is out of fds).
fn dup_fd(fd: std::os::fd::RawFd) -> Option<OwnedFd> {
    // SAFETY: dup on an fd this process holds open; it returns a new fd
    // or -1.
    let raw = unsafe { libc::dup(fd) };
    // SAFETY: `raw` is a fresh fd that nothing else owns.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LAPIC register page with `vectors` requested, `in_service`
    /// being serviced and task priority `tpr`.
    fn lapic(vectors: &[u8], in_service: &[u8], tpr: u32) -> Vec<u8> {
        let mut regs = vec![0u8; 1024];
        let mut set = |base: usize, v: u8| {
            let off = base + 0x10 * usize::from(v / 32);
            let mut r = u32::from_le_bytes(regs[off..off + 4].try_into().unwrap());
            r |= 1 << (v % 32);
            regs[off..off + 4].copy_from_slice(&r.to_le_bytes());
        };
        for &v in vectors {
            set(0x200, v);
        }
        for &v in in_service {
            set(0x100, v);
        }
        regs[0x80..0x84].copy_from_slice(&tpr.to_le_bytes());
        regs
    }

    #[test]
    fn nothing_requested_is_nothing_to_deliver() {
        assert!(!lapic_has_deliverable(&lapic(&[], &[], 0)));
        assert!(!lapic_has_deliverable(&lapic(&[], &[0xec], 0)));
    }

    #[test]
    fn a_requested_vector_above_the_priorities_is_deliverable() {
        // Linux's reschedule IPI (0xfd) and local timer (0xec) vectors
        assert!(lapic_has_deliverable(&lapic(&[0xfd], &[], 0)));
        assert!(lapic_has_deliverable(&lapic(&[0xec], &[], 0)));
        // the highest request counts, in any of the eight IRR words
        assert!(lapic_has_deliverable(&lapic(&[0x31, 0xec], &[0x40], 0)));
    }

    #[test]
    fn the_task_priority_masks_its_class_and_below() {
        assert!(!lapic_has_deliverable(&lapic(&[0x41], &[], 0x40)));
        assert!(!lapic_has_deliverable(&lapic(&[0x41], &[], 0x4f)));
        assert!(lapic_has_deliverable(&lapic(&[0x51], &[], 0x40)));
    }

    #[test]
    fn a_vector_in_service_masks_its_class_and_below() {
        assert!(!lapic_has_deliverable(&lapic(&[0xe1], &[0xec], 0)));
        assert!(!lapic_has_deliverable(&lapic(&[0x30], &[0xec], 0)));
        assert!(lapic_has_deliverable(&lapic(&[0xfd], &[0xec], 0)));
        // the larger of TPR and ISR decides
        assert!(!lapic_has_deliverable(&lapic(&[0xfd], &[0x30], 0xf0)));
    }

    #[test]
    fn a_short_register_page_reads_as_nothing_pending() {
        assert!(!lapic_has_deliverable(&[0u8; 16]));
    }

    #[test]
    fn waiting_states_are_the_ones_kvm_blocks_in() {
        use kvm_bindings::{KVM_MP_STATE_RUNNABLE, KVM_MP_STATE_SIPI_RECEIVED};
        for s in [
            KVM_MP_STATE_HALTED,
            KVM_MP_STATE_UNINITIALIZED,
            KVM_MP_STATE_INIT_RECEIVED,
            KVM_MP_STATE_AP_RESET_HOLD,
        ] {
            assert!(waits_in_kvm(s), "{s}");
        }
        assert!(!waits_in_kvm(KVM_MP_STATE_RUNNABLE));
        assert!(!waits_in_kvm(KVM_MP_STATE_SIPI_RECEIVED));
    }
}
