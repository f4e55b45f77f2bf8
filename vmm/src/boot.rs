//! Loading a Linux kernel and entering it at its 64-bit entry point.
//!
//! Two formats are accepted, told apart by their bytes, not their names:
//!
//! * an uncompressed ELF `vmlinux` (x86-64, `ET_EXEC`, with the "Linux"
//!   ELF note every kernel since 4.20 carries). It is loaded at its linked
//!   physical addresses by linux-loader and entered at `e_entry`
//!   (`startup_64`). Nothing decompresses, which matters on kvm_pvm where
//!   the bzImage decompressor alone takes minutes. An ELF has no setup
//!   header, so the boot_params header fields the kernel reads are filled
//!   in here, with boot protocol 2.15: Linux ignores `acpi_rsdp_addr` below
//!   2.14.
//! * a bzImage (the `HdrS` setup header at 0x202) with a 64-bit entry
//!   (`XLF_KERNEL_64`): the protected-mode part is loaded at 1 MiB and
//!   entered at +0x200; the setup header is copied into boot_params.
//!
//! Either way the boot vCPU starts in 64-bit mode as the x86 64-bit boot
//! protocol asks: paging on with an identity map of the first 1 GiB, `CS`
//! = 0x10 and data segments 0x18 from a flat GDT, interrupts off, and RSI
//! pointing at boot_params. The E820 map, the command line, the initrd and
//! the RSDP address go into boot_params.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use kvm_bindings::kvm_msr_entry;
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::{BzImage, Elf, KernelLoader};
use tracing::{debug, warn};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{
    BOOT_STACK, CMDLINE_ADDR, CMDLINE_MAX, GDT_ADDR, HIMEM_START, IDT_ADDR, LAPIC_ADDR, MIB,
    PDPT_ADDR, PD_ADDR, PML4_ADDR, ZERO_PAGE,
};
use crate::memory::{E820Entry, HumanSize, MemoryPlan};

/// Errors while loading and entering a kernel.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel file does not exist.
    #[error("--kernel {0}: no such file")]
    KernelMissing(PathBuf),
    /// The kernel file is not a kernel.
    #[error("--kernel {path}: not a Linux kernel: found {found}. Give an uncompressed vmlinux (ELF) or a bzImage")]
    NotAKernel {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        found: String,
    },
    /// The initrd file does not exist.
    #[error("--initrd {0}: no such file")]
    InitrdMissing(PathBuf),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Kernel, initrd and the kernel's working memory do not fit.
    #[error(
        "--memory {have} is too small for this kernel and initrd: they need at least {need} of RAM below 3 GiB \
         (kernel image up to {kernel_end:#x}, initrd {initrd}); use --memory {need} or more"
    )]
    TooSmall {
        /// RAM below the MMIO hole.
        have: HumanSize,
        /// What is needed.
        need: HumanSize,
        /// End of the kernel image.
        kernel_end: u64,
        /// Initrd size.
        initrd: HumanSize,
    },
    /// The command line is too long.
    #[error(
        "the kernel command line is {len} bytes long; Linux on x86 takes at most {CMDLINE_MAX}"
    )]
    CmdlineTooLong {
        /// Its length.
        len: usize,
    },
    /// The command line has a NUL byte.
    #[error("the kernel command line contains a NUL byte")]
    CmdlineNul,
    /// linux-loader failed.
    #[error("loading the kernel {path}: {source}")]
    Load {
        /// The file.
        path: PathBuf,
        /// linux-loader's error.
        source: linux_loader::loader::Error,
    },
    /// Writing to guest memory failed.
    #[error("writing {what} into guest memory: {source}")]
    Memory {
        /// What.
        what: &'static str,
        /// The error.
        source: vm_memory::GuestMemoryError,
    },
    /// A vCPU setup ioctl failed.
    #[error("setting up vCPU {vcpu} for boot: {op} failed: {source}")]
    Vcpu {
        /// vCPU.
        vcpu: usize,
        /// Operation.
        op: &'static str,
        /// Error.
        source: kvm_ioctls::Error,
    },
}

/// The kernel formats understood here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// Uncompressed ELF vmlinux.
    Elf,
    /// bzImage.
    BzImage,
}

/// What [`inspect_kernel`] learned without loading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The format.
    pub format: KernelFormat,
    /// The highest guest physical address the kernel occupies while booting
    /// (image plus bss, or the bzImage's decompression footprint).
    pub end: u64,
    /// Boot protocol version (from the setup header; 0x20f for ELF).
    pub protocol: u16,
    /// Highest address the initrd may end at.
    pub initrd_addr_max: u64,
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const HDRS_MAGIC: u32 = 0x5372_6448;
/// Boot protocol version written for ELF kernels.
const ELF_BOOT_PROTOCOL: u16 = 0x020f;
/// Working memory a kernel needs beyond its image and initrd to get going.
const KERNEL_HEADROOM: u64 = 32 * MIB;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Describes a file that is not a kernel, from its first bytes.
pub fn describe(head: &[u8], len: u64) -> String {
    if len == 0 {
        return "an empty file".into();
    }
    let starts = |m: &[u8]| head.starts_with(m);
    if starts(b"\x1f\x8b") {
        return "gzip-compressed data (decompress it, or give the bzImage)".into();
    }
    if starts(b"\xfd7zXZ\0") {
        return "xz-compressed data".into();
    }
    if starts(b"\x28\xb5\x2f\xfd") {
        return "zstd-compressed data".into();
    }
    if starts(b"070701") || starts(b"070702") {
        return "a cpio archive (an initramfs? pass it with --initrd)".into();
    }
    if starts(b"MZ") {
        return "a PE/COFF executable without a Linux setup header".into();
    }
    if starts(b"#!") {
        return "a script".into();
    }
    if starts(b"!<arch>") {
        return "an ar archive (a .deb? extract the kernel from it)".into();
    }
    if starts(ELF_MAGIC) {
        return "an ELF file".into();
    }
    let sample = &head[..head.len().min(512)];
    if !sample.is_empty()
        && sample
            .iter()
            .all(|&b| b == b'\n' || b == b'\r' || b == b'\t' || (0x20..0x7f).contains(&b))
    {
        let first: String = String::from_utf8_lossy(sample)
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(40)
            .collect();
        return format!("a text file starting with {first:?}");
    }
    let hex: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!(
        "unrecognised data of {} bytes (starts with {})",
        len,
        hex.join(" ")
    )
}

fn read_head(path: &Path, n: usize) -> Result<(Vec<u8>, u64), BootError> {
    let read_err = |source| BootError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(read_err)?;
    let len = f.metadata().map_err(read_err)?.len();
    let mut buf = Vec::with_capacity(n);
    f.by_ref()
        .take(n as u64)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    Ok((buf, len))
}

/// Looks at a kernel file and says what it is, or why it is not a kernel.
pub fn inspect_kernel(path: &Path) -> Result<KernelInfo, BootError> {
    if !path.exists() {
        return Err(BootError::KernelMissing(path.to_path_buf()));
    }
    let not_kernel = |found: String| BootError::NotAKernel {
        path: path.to_path_buf(),
        found,
    };
    if path.is_dir() {
        return Err(not_kernel("a directory".into()));
    }
    let (head, len) = read_head(path, 64 * 1024)?;
    if head.len() >= 0x264 && u32_at(&head, 0x202) == Some(HDRS_MAGIC) {
        let version = u16_at(&head, 0x206).unwrap_or(0);
        let xloadflags = u16_at(&head, 0x236).unwrap_or(0);
        if version < 0x020c || xloadflags & 1 == 0 {
            return Err(not_kernel(format!(
                "a bzImage (boot protocol {}.{:02}) without a 64-bit entry point",
                version >> 8,
                version & 0xff
            )));
        }
        let init_size = u32_at(&head, 0x260).unwrap_or(0) as u64;
        let pref = u64_at(&head, 0x258).unwrap_or(0).max(16 * MIB);
        let initrd_max = u32_at(&head, 0x22c).unwrap_or(0x37ff_ffff) as u64;
        return Ok(KernelInfo {
            format: KernelFormat::BzImage,
            end: pref + init_size,
            protocol: version,
            initrd_addr_max: initrd_max,
        });
    }
    if !head.starts_with(ELF_MAGIC) {
        return Err(not_kernel(describe(&head, len)));
    }
    // ELF: 64-bit, little endian, x86-64, ET_EXEC, loads above 1 MiB, and a
    // "Linux" note.
    if head.get(4) != Some(&2) {
        return Err(not_kernel("a 32-bit ELF file".into()));
    }
    if head.get(5) != Some(&1) {
        return Err(not_kernel("a big-endian ELF file".into()));
    }
    let machine = u16_at(&head, 18).unwrap_or(0);
    if machine != 62 {
        return Err(not_kernel(format!(
            "an ELF file for machine {machine} (not x86-64)"
        )));
    }
    let etype = u16_at(&head, 16).unwrap_or(0);
    if etype != 2 {
        let what = match etype {
            1 => "a relocatable object file (ET_REL)",
            3 => "a shared library or position-independent executable (ET_DYN)",
            4 => "a core dump",
            _ => "an ELF file that is not an executable",
        };
        return Err(not_kernel(format!("{what}, not a vmlinux")));
    }
    let entry = u64_at(&head, 24).unwrap_or(0);
    let phoff = u64_at(&head, 32).unwrap_or(0);
    let phentsize = u16_at(&head, 54).unwrap_or(0) as u64;
    let phnum = u16_at(&head, 56).unwrap_or(0) as u64;
    if phentsize != 56 || phnum == 0 || phnum > 64 {
        return Err(not_kernel(
            "an ELF executable with malformed program headers".into(),
        ));
    }
    let mut f = File::open(path).map_err(|source| BootError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    f.seek(SeekFrom::Start(phoff))
        .and_then(|_| f.read_exact(&mut ph))
        .map_err(|_| not_kernel("a truncated ELF executable".into()))?;
    let mut end = 0u64;
    let mut start = u64::MAX;
    let mut linux_note = false;
    for i in 0..phnum as usize {
        let p = &ph[i * 56..(i + 1) * 56];
        let ptype = u32_at(p, 0).unwrap_or(0);
        let offset = u64_at(p, 8).unwrap_or(0);
        let paddr = u64_at(p, 24).unwrap_or(0);
        let filesz = u64_at(p, 32).unwrap_or(0);
        let memsz = u64_at(p, 40).unwrap_or(0);
        match ptype {
            1 if filesz > 0 || memsz > 0 => {
                start = start.min(paddr);
                end = end.max(paddr.saturating_add(memsz));
            }
            4 if filesz < (1 << 20) => {
                let mut notes = vec![0u8; filesz as usize];
                if f.seek(SeekFrom::Start(offset))
                    .and_then(|_| f.read_exact(&mut notes))
                    .is_ok()
                {
                    linux_note |= has_note(&notes, b"Linux");
                }
            }
            _ => {}
        }
    }
    if start == u64::MAX {
        return Err(not_kernel("an ELF executable with nothing to load".into()));
    }
    if !linux_note {
        return Err(not_kernel(
            "an x86-64 ELF executable without the \"Linux\" ELF note every vmlinux carries".into(),
        ));
    }
    if start < HIMEM_START || entry < HIMEM_START {
        return Err(not_kernel(format!(
            "an ELF executable that loads at {start:#x}, below 1 MiB"
        )));
    }
    Ok(KernelInfo {
        format: KernelFormat::Elf,
        end,
        protocol: ELF_BOOT_PROTOCOL,
        initrd_addr_max: 0x7fff_ffff,
    })
}

/// Whether an ELF note segment has a note named `name`.
fn has_note(notes: &[u8], name: &[u8]) -> bool {
    let mut o = 0usize;
    while o + 12 <= notes.len() {
        let namesz = u32_at(notes, o).unwrap_or(0) as usize;
        let descsz = u32_at(notes, o + 4).unwrap_or(0) as usize;
        let n0 = o + 12;
        if n0 + namesz > notes.len() {
            return false;
        }
        let n = &notes[n0..n0 + namesz];
        if n.strip_suffix(b"\0").unwrap_or(n) == name {
            return true;
        }
        o = n0 + namesz.div_ceil(4) * 4 + descsz.div_ceil(4) * 4;
    }
    false
}

/// Everything the boot vCPU needs to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootEntry {
    /// 64-bit entry point.
    pub entry: u64,
    /// boot_params address (RSI).
    pub boot_params: u64,
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct BootRequest<'a> {
    /// Kernel file.
    pub kernel: &'a Path,
    /// Initrd file.
    pub initrd: Option<&'a Path>,
    /// Complete command line.
    pub cmdline: &'a str,
    /// RSDP address.
    pub rsdp: u64,
}

/// Checks the command line.
pub fn check_cmdline(cmdline: &str) -> Result<(), BootError> {
    if cmdline.len() > CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong { len: cmdline.len() });
    }
    if cmdline.contains('\0') {
        return Err(BootError::CmdlineNul);
    }
    Ok(())
}

/// Checks that a kernel and initrd fit the plan, before any memory is
/// mapped: the "memory too small" error names the minimum.
pub fn check_fit(
    info: &KernelInfo,
    initrd: Option<&Path>,
    plan: &MemoryPlan,
) -> Result<u64, BootError> {
    let initrd_size = match initrd {
        None => 0,
        Some(p) => {
            if !p.exists() {
                return Err(BootError::InitrdMissing(p.to_path_buf()));
            }
            std::fs::metadata(p)
                .map_err(|source| BootError::Read {
                    path: p.to_path_buf(),
                    source,
                })?
                .len()
        }
    };
    let need = (info.end + initrd_size + KERNEL_HEADROOM).div_ceil(MIB) * MIB;
    if need > plan.low_ram_end() {
        return Err(BootError::TooSmall {
            have: HumanSize(plan.total()),
            need: HumanSize(need.max(MemoryPlan::minimum(plan.num_nodes()))),
            kernel_end: info.end,
            initrd: HumanSize(initrd_size),
        });
    }
    Ok(initrd_size)
}

/// Loads kernel, initrd and command line, and writes boot_params, page
/// tables and GDT. Returns where the boot vCPU starts.
pub fn load(
    mem: &GuestMemoryMmap,
    plan: &MemoryPlan,
    req: &BootRequest<'_>,
) -> Result<BootEntry, BootError> {
    let info = inspect_kernel(req.kernel)?;
    check_cmdline(req.cmdline)?;
    let initrd_size = check_fit(&info, req.initrd, plan)?;
    let load_err = |source| BootError::Load {
        path: req.kernel.to_path_buf(),
        source,
    };
    let mut file = File::open(req.kernel).map_err(|source| BootError::Read {
        path: req.kernel.to_path_buf(),
        source,
    })?;
    let mut params = boot_params::default();
    let (entry, kernel_end) = match info.format {
        KernelFormat::Elf => {
            let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let h = &mut params.hdr;
            h.boot_flag = 0xaa55;
            h.header = HDRS_MAGIC;
            h.version = ELF_BOOT_PROTOCOL;
            h.kernel_alignment = 0x0100_0000;
            h.initrd_addr_max = info.initrd_addr_max as u32;
            (r.kernel_load.0, r.kernel_end)
        }
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            if let Some(h) = r.setup_header {
                params.hdr = h;
            }
            (r.kernel_load.0 + 0x200, r.kernel_end)
        }
    };
    debug!(
        format = ?info.format,
        entry = format_args!("{entry:#x}"),
        end = format_args!("{kernel_end:#x}"),
        "kernel loaded"
    );
    let mem_err = |what| move |source| BootError::Memory { what, source };

    // Command line.
    let mut bytes = req.cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(mem_err("the command line"))?;

    // Initrd at the top of the RAM below the MMIO hole (and below what the
    // kernel accepts).
    let mut ramdisk = (0u64, 0u64);
    if let Some(p) = req.initrd {
        let top = plan.low_ram_end().min(info.initrd_addr_max + 1);
        let addr = (top - initrd_size) & !0xfff;
        if addr < kernel_end.max(info.end) {
            return Err(BootError::TooSmall {
                have: HumanSize(plan.total()),
                need: HumanSize((info.end + initrd_size + KERNEL_HEADROOM).div_ceil(MIB) * MIB),
                kernel_end: info.end,
                initrd: HumanSize(initrd_size),
            });
        }
        let mut f = File::open(p).map_err(|source| BootError::Read {
            path: p.to_path_buf(),
            source,
        })?;
        mem.read_exact_volatile_from(GuestAddress(addr), &mut f, initrd_size as usize)
            .map_err(mem_err("the initrd"))?;
        ramdisk = (addr, initrd_size);
        debug!(
            addr = format_args!("{addr:#x}"),
            size = initrd_size,
            "initrd loaded"
        );
    }

    let h = &mut params.hdr;
    h.type_of_loader = 0xff;
    h.loadflags |= 0x01; // LOADED_HIGH
    h.cmd_line_ptr = CMDLINE_ADDR as u32;
    h.cmdline_size = req.cmdline.len() as u32;
    h.ramdisk_image = ramdisk.0 as u32;
    h.ramdisk_size = ramdisk.1 as u32;
    params.ext_ramdisk_image = (ramdisk.0 >> 32) as u32;
    params.ext_ramdisk_size = (ramdisk.1 >> 32) as u32;
    params.acpi_rsdp_addr = req.rsdp;
    let e820 = plan.e820();
    write_e820(&mut params, &e820);
    mem.write_obj(params, GuestAddress(ZERO_PAGE))
        .map_err(mem_err("boot_params"))?;
    write_page_tables(mem).map_err(mem_err("the boot page tables"))?;
    write_gdt(mem).map_err(mem_err("the GDT"))?;
    Ok(BootEntry {
        entry,
        boot_params: ZERO_PAGE,
    })
}

fn write_e820(params: &mut boot_params, e820: &[E820Entry]) {
    let max = params.e820_table.len();
    if e820.len() > max {
        warn!(
            "{} E820 entries, boot_params holds {max}: the rest are dropped",
            e820.len()
        );
    }
    let mut table = params.e820_table;
    for (i, e) in e820.iter().take(max).enumerate() {
        table[i] = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind as u32,
        };
    }
    params.e820_table = table;
    params.e820_entries = e820.len().min(max) as u8;
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
const GDT: [u64; 5] = [
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
fn segment(selector: u16, desc: u64) -> kvm_segment {
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

/// Puts the boot vCPU at the kernel's 64-bit entry point. With
/// `x2apic`, its LAPIC starts in x2APIC mode, as firmware leaves it when
/// APIC IDs exceed 254, so that Linux picks its x2APIC driver before it
/// parses the MADT.
pub fn setup_boot_vcpu(fd: &VcpuFd, boot: &BootEntry, x2apic: bool) -> Result<(), BootError> {
    let mut sregs: kvm_sregs = fd.get_sregs().map_err(vcpu_err(0, "KVM_GET_SREGS"))?;
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
    fd.set_sregs(&sregs).map_err(vcpu_err(0, "KVM_SET_SREGS"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_non_kernels() {
        assert_eq!(describe(b"", 0), "an empty file");
        assert!(describe(b"\x1f\x8b\x08", 100).starts_with("gzip"));
        assert!(describe(b"070701000", 100).contains("cpio"));
        assert!(describe(b"hello world\n", 12).contains("text file starting with \"hello world\""));
        assert!(describe(&[0, 1, 2, 0xff], 4).contains("00 01 02 ff"));
    }

    #[test]
    fn inspects_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(
            inspect_kernel(&missing),
            Err(BootError::KernelMissing(_))
        ));
        let text = dir.path().join("t");
        std::fs::write(&text, "just text\n").unwrap();
        let e = inspect_kernel(&text).unwrap_err().to_string();
        assert!(e.contains("not a Linux kernel: found a text file"), "{e}");
        assert!(inspect_kernel(dir.path())
            .unwrap_err()
            .to_string()
            .contains("a directory"));
        // This test binary is an x86-64 ELF, but a PIE, not a vmlinux.
        let me = std::env::current_exe().unwrap();
        let e = inspect_kernel(&me).unwrap_err().to_string();
        assert!(
            e.contains("ET_DYN") || e.contains("\"Linux\" ELF note"),
            "{e}"
        );
        // A fake bzImage header without a 64-bit entry.
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(&HDRS_MAGIC.to_le_bytes());
        bz[0x206..0x208].copy_from_slice(&0x020bu16.to_le_bytes());
        let p = dir.path().join("bz");
        std::fs::write(&p, &bz).unwrap();
        let e = inspect_kernel(&p).unwrap_err().to_string();
        assert!(e.contains("without a 64-bit entry"), "{e}");
        // ... and with one.
        bz[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        bz[0x236..0x238].copy_from_slice(&1u16.to_le_bytes());
        bz[0x260..0x264].copy_from_slice(&(40u32 << 20).to_le_bytes());
        std::fs::write(&p, &bz).unwrap();
        let k = inspect_kernel(&p).unwrap();
        assert_eq!(k.format, KernelFormat::BzImage);
        assert_eq!(k.end, 56 * MIB);
        let plan = MemoryPlan::new(64 * MIB, 1).unwrap();
        let e = check_fit(&k, None, &plan).unwrap_err().to_string();
        assert!(e.contains("need at least 88M"), "{e}");
        let plan = MemoryPlan::new(128 * MIB, 1).unwrap();
        assert_eq!(check_fit(&k, None, &plan).unwrap(), 0);
    }

    #[test]
    fn notes() {
        let mut n = Vec::new();
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(b"GNU\0");
        n.extend_from_slice(&[1, 2, 3, 4]);
        n.extend_from_slice(&6u32.to_le_bytes());
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&0x100u32.to_le_bytes());
        n.extend_from_slice(b"Linux\0\0\0");
        n.extend_from_slice(&[0; 4]);
        assert!(has_note(&n, b"Linux"));
        assert!(has_note(&n, b"GNU"));
        assert!(!has_note(&n, b"Xen"));
        assert!(!has_note(&n[..10], b"Linux"));
    }

    #[test]
    fn segments_decode() {
        let cs = segment(0x10, GDT[2]);
        assert_eq!((cs.l, cs.db, cs.type_, cs.present, cs.s), (1, 0, 0xb, 1, 1));
        assert_eq!(cs.limit, 0xffff_ffff);
        let ds = segment(0x18, GDT[3]);
        assert_eq!((ds.l, ds.db, ds.type_), (0, 1, 3));
        let tr = segment(0x20, GDT[4]);
        assert_eq!((tr.s, tr.type_, tr.present), (0, 0xb, 1));
    }
}
