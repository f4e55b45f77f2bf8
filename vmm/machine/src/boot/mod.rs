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

use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::{BzImage, Elf, KernelLoader};
use tracing::{debug, warn};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{CMDLINE_ADDR, CMDLINE_MAX, HIMEM_START, MIB, ZERO_PAGE};
use crate::memory::{E820Entry, HumanSize, MemoryPlan};

mod entry;
mod files;
mod kernel;

pub use entry::{enter_long_mode, setup_boot_vcpu, setup_vcpu, write_long_mode_tables, GDT};
pub use files::{open_initrd, open_kernel, MAX_INITRD_BYTES, MAX_KERNEL_BYTES};
pub use kernel::{describe, inspect_kernel, KernelFormat, KernelInfo};
use kernel::{ELF_BOOT_PROTOCOL, HDRS_MAGIC, KERNEL_HEADROOM};

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
    /// A kernel or initrd that is no regular file (a directory, device,
    /// FIFO or socket), is larger than the limit, or cannot be read
    /// ([`open_kernel`], [`open_initrd`]).
    #[error("{flag} {}: {problem}", path.display())]
    File {
        /// `--kernel` or `--initrd`.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong, and what to give instead.
        problem: String,
    },
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

/// Checks that `--initrd` names a readable regular file of at most
/// [`MAX_INITRD_BYTES`], before any work, without blocking on a FIFO:
/// missing is [`BootError::InitrdMissing`]; a directory, device, FIFO,
/// socket, a file too large or one `open` refuses is [`BootError::File`]
/// with the reason.
pub fn check_initrd(p: &Path) -> Result<(), BootError> {
    open_initrd(p).map(drop)
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
        Some(p) => open_initrd(p)?.1,
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
    let mut params = boot_params::default();
    let (entry, kernel_end) = load_kernel(mem, req.kernel, &info, &mut params)?;

    // Command line.
    let mut bytes = req.cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(mem_err("the command line"))?;

    let ramdisk = match req.initrd {
        Some(p) => load_initrd(mem, plan, &info, kernel_end, p, initrd_size)?,
        None => (0, 0),
    };

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
    write_long_mode_tables(mem).map_err(mem_err("the boot page tables and GDT"))?;
    Ok(BootEntry {
        entry,
        boot_params: ZERO_PAGE,
    })
}

/// The error for a failed write of `what` into guest memory.
fn mem_err(what: &'static str) -> impl FnOnce(vm_memory::GuestMemoryError) -> BootError {
    move |source| BootError::Memory { what, source }
}

/// Loads the kernel image with linux-loader and fills in the setup
/// header it has (a bzImage's) or needs (an ELF's); returns the entry
/// point and the image's end.
fn load_kernel(
    mem: &GuestMemoryMmap,
    kernel: &Path,
    info: &KernelInfo,
    params: &mut boot_params,
) -> Result<(u64, u64), BootError> {
    let load_err = |source| BootError::Load {
        path: kernel.to_path_buf(),
        source,
    };
    let (mut file, _) = open_kernel(kernel)?;
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
    Ok((entry, kernel_end))
}

/// Loads the initrd at the top of the RAM below the MMIO hole (and below
/// what the kernel accepts); returns its address and size.
fn load_initrd(
    mem: &GuestMemoryMmap,
    plan: &MemoryPlan,
    info: &KernelInfo,
    kernel_end: u64,
    p: &Path,
    initrd_size: u64,
) -> Result<(u64, u64), BootError> {
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
    let (mut f, len) = open_initrd(p)?;
    if len != initrd_size {
        return Err(BootError::File {
            flag: "--initrd",
            path: p.to_path_buf(),
            problem: format!(
                "it changed size while the VM was being built ({initrd_size} bytes, then {len})"
            ),
        });
    }
    mem.read_exact_volatile_from(GuestAddress(addr), &mut f, initrd_size as usize)
        .map_err(mem_err("the initrd"))?;
    debug!(
        addr = format_args!("{addr:#x}"),
        size = initrd_size,
        "initrd loaded"
    );
    Ok((addr, initrd_size))
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

#[cfg(test)]
mod tests {
    use super::entry::{segment, GDT};
    use super::kernel::{has_note, HDRS_MAGIC};
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
