//! 64-bit entry state: what every guest of this VMM starts in, Linux or
//! micro-guest, and the reset state of every vCPU.
//!
//! WHAT: the identity-mapped page tables, the flat GDT and an empty IDT in
//! guest memory ([`write_long_mode_tables`]); the segments, control
//! registers and EFER of long mode ([`enter_long_mode`]); the registers
//! the x86 64-bit boot protocol asks for ([`setup_boot_vcpu`]); the MSRs
//! every vCPU starts with ([`setup_vcpu`]).
//! WHY: kept apart from loading: it is KVM register state, not files. One
//! GDT at one address for every guest type (the micro-guests used to build
//! a second one elsewhere).
//! HOW: written into guest memory at the fixed addresses of
//! [`crate::layout`] and set through the vCPU fd's ioctls.

use kvm_bindings::kvm_msr_entry;
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use tracing::{debug, warn};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{BootEntry, BootError};
use crate::layout::{BOOT_STACK, GDT_ADDR, IDT_ADDR, LAPIC_ADDR, PDPT_ADDR, PD_ADDR, PML4_ADDR};
/// Writes what 64-bit long mode needs in guest memory, at the addresses of
/// [`crate::layout`]: an identity map of the first GiB with 2 MiB pages
/// (RAM or not: an access past the end of RAM is then an MMIO exit the
/// VMM reports by address, not a page fault), the flat [`GDT`] and an
/// empty IDT (any exception ends in a triple fault).
pub fn write_long_mode_tables(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    write_page_tables(mem)?;
    write_gdt(mem)
}

/// Identity map of the first 1 GiB with 2 MiB pages.
fn write_page_tables(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    mem.write_obj(PDPT_ADDR | 0x3, GuestAddress(PML4_ADDR))?;
    mem.write_obj(PD_ADDR | 0x3, GuestAddress(PDPT_ADDR))?;
    for i in 0..512u64 {
        mem.write_obj((i << 21) | 0x83, GuestAddress(PD_ADDR + i * 8))?;
    }
    Ok(())
}

/// Flat GDT: null, null, 64-bit code (0x10), data (0x18), TSS (0x20).
pub const GDT: [u64; 5] = [
    0,
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x0080_8b00_0000_0000,
];

fn write_gdt(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    for (i, d) in GDT.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(GDT_ADDR + i as u64 * 8))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))
}

/// A KVM segment from a GDT descriptor.
pub(super) fn segment(selector: u16, desc: u64) -> kvm_segment {
    let base = ((desc >> 16) & 0xff_ffff) | ((desc >> 32) & 0xff00_0000);
    let limit = (desc & 0xffff) | ((desc >> 32) & 0xf_0000);
    let g = ((desc >> 55) & 1) as u8;
    kvm_segment {
        base,
        limit: if g == 1 {
            ((limit as u32) << 12) | 0xfff
        } else {
            limit as u32
        },
        selector,
        type_: ((desc >> 40) & 0xf) as u8,
        present: ((desc >> 47) & 1) as u8,
        dpl: ((desc >> 45) & 3) as u8,
        db: ((desc >> 54) & 1) as u8,
        s: ((desc >> 44) & 1) as u8,
        l: ((desc >> 53) & 1) as u8,
        g,
        avl: ((desc >> 52) & 1) as u8,
        unusable: if (desc >> 47) & 1 == 1 { 0 } else { 1 },
        padding: 0,
    }
}

fn vcpu_err(vcpu: usize, op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> BootError {
    move |source| BootError::Vcpu { vcpu, op, source }
}

const MSR_IA32_APICBASE: u32 = 0x1b;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;

/// Setup every vCPU needs: FPU defaults, the LAPIC's LINT0 as ExtINT and
/// LINT1 as NMI (what firmware does, and what the MADT's NMI entry says),
/// fast strings, and write-back as the default memory type.
pub fn setup_vcpu(fd: &VcpuFd, index: usize) -> Result<(), BootError> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    fd.set_fpu(&fpu).map_err(vcpu_err(index, "KVM_SET_FPU"))?;
    let mut lapic = fd.get_lapic().map_err(vcpu_err(index, "KVM_GET_LAPIC"))?;
    let set_lvt = |regs: &mut [std::os::raw::c_char], off: usize, mode: u32| {
        let mut v = [0u8; 4];
        for (i, b) in v.iter_mut().enumerate() {
            *b = regs[off + i] as u8;
        }
        let val = (u32::from_le_bytes(v) & !0x700) | (mode << 8);
        for (i, b) in val.to_le_bytes().iter().enumerate() {
            regs[off + i] = *b as std::os::raw::c_char;
        }
    };
    set_lvt(&mut lapic.regs, 0x350, 7); // LINT0: ExtINT
    set_lvt(&mut lapic.regs, 0x360, 4); // LINT1: NMI
    fd.set_lapic(&lapic)
        .map_err(vcpu_err(index, "KVM_SET_LAPIC"))?;
    let entries = [
        kvm_msr_entry {
            index: MSR_IA32_MISC_ENABLE,
            data: 1, // fast strings
            ..Default::default()
        },
        kvm_msr_entry {
            index: MSR_MTRR_DEF_TYPE,
            data: (1 << 11) | 6, // MTRRs enabled, default write-back
            ..Default::default()
        },
    ];
    let msrs = Msrs::from_entries(&entries).expect("two MSR entries fit");
    match fd.set_msrs(&msrs) {
        Ok(n) if n == entries.len() => {}
        Ok(n) => debug!(
            vcpu = index,
            "KVM accepted {n} of {} boot MSRs",
            entries.len()
        ),
        Err(e) => warn!(vcpu = index, "setting boot MSRs failed: {e}"),
    }
    Ok(())
}

/// Puts vCPU `vcpu` in 64-bit long mode over the tables of
/// [`write_long_mode_tables`]: flat code (selector 0x10), data (0x18) and
/// TSS (0x20) segments, paging with PAE, `EFER.LME|LMA`. Its general
/// registers are left to the caller.
pub fn enter_long_mode(fd: &VcpuFd, vcpu: usize) -> Result<(), BootError> {
    let mut sregs: kvm_sregs = fd.get_sregs().map_err(vcpu_err(vcpu, "KVM_GET_SREGS"))?;
    let code = segment(0x10, GDT[2]);
    let data = segment(0x18, GDT[3]);
    let tss = segment(0x20, GDT[4]);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    sregs.cr0 = 0x8000_0011; // PG | ET | PE
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = 0x20; // PAE
    sregs.efer = 0x500; // LMA | LME
    fd.set_sregs(&sregs)
        .map_err(vcpu_err(vcpu, "KVM_SET_SREGS"))
}

/// Puts the boot vCPU at the kernel's 64-bit entry point. With
/// `x2apic`, its LAPIC starts in x2APIC mode, as firmware leaves it when
/// APIC IDs exceed 254, so that Linux picks its x2APIC driver before it
/// parses the MADT.
pub fn setup_boot_vcpu(fd: &VcpuFd, boot: &BootEntry, x2apic: bool) -> Result<(), BootError> {
    enter_long_mode(fd, 0)?;
    let regs = kvm_regs {
        rflags: 0x2,
        rip: boot.entry,
        rsp: BOOT_STACK,
        rbp: BOOT_STACK,
        rsi: boot.boot_params,
        ..Default::default()
    };
    fd.set_regs(&regs).map_err(vcpu_err(0, "KVM_SET_REGS"))?;
    if x2apic {
        let base = LAPIC_ADDR as u64 | (1 << 11) | (1 << 10) | (1 << 8);
        let msrs = Msrs::from_entries(&[kvm_msr_entry {
            index: MSR_IA32_APICBASE,
            data: base,
            ..Default::default()
        }])
        .expect("one MSR entry fits");
        let n = fd
            .set_msrs(&msrs)
            .map_err(vcpu_err(0, "KVM_SET_MSRS(APIC_BASE)"))?;
        if n != 1 {
            warn!("KVM refused to start the boot vCPU in x2APIC mode");
        }
    }
    Ok(())
}
