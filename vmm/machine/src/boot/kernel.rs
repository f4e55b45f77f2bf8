//! Telling a kernel file from anything else, without loading it.
//!
//! WHAT: [`inspect_kernel`] (format, footprint, boot protocol of a vmlinux
//! or bzImage) and [`describe`] (what a file that is no kernel is).
//! WHY: a wrong `--kernel` is the most common mistake; it is reported
//! before anything is allocated, saying what the file is instead.
//! HOW: reads the first 64 KiB (and an ELF's program headers and notes)
//! and checks magic numbers, the setup header and the "Linux" ELF note.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::BootError;
use crate::layout::{HIMEM_START, MIB};

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

pub(super) const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
pub(super) const HDRS_MAGIC: u32 = 0x5372_6448;
/// Boot protocol version written for ELF kernels.
pub(super) const ELF_BOOT_PROTOCOL: u16 = 0x020f;
/// Working memory a kernel needs beyond its image and initrd to get going.
pub(super) const KERNEL_HEADROOM: u64 = 32 * MIB;

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

/// The first `n` bytes of the kernel file and its size; only a regular
/// file of a plausible size is opened ([`super::open_kernel`]).
fn read_head(path: &Path, n: usize) -> Result<(Vec<u8>, u64), BootError> {
    let read_err = |source| BootError::Read {
        path: path.to_path_buf(),
        source,
    };
    let (mut f, len) = super::open_kernel(path)?;
    let mut buf = Vec::with_capacity(n);
    f.by_ref()
        .take(n as u64)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    Ok((buf, len))
}

/// Looks at a kernel file and says what it is, or why it is not a kernel.
/// A path that is no regular file of at most [`super::MAX_KERNEL_BYTES`]
/// is refused before it is opened for reading (a FIFO never blocks).
pub fn inspect_kernel(path: &Path) -> Result<KernelInfo, BootError> {
    let (head, len) = read_head(path, 64 * 1024)?;
    if head.len() >= 0x264 && u32_at(&head, 0x202) == Some(HDRS_MAGIC) {
        return inspect_bzimage(&head).map_err(|found| not_kernel(path, found));
    }
    if !head.starts_with(ELF_MAGIC) {
        return Err(not_kernel(path, describe(&head, len)));
    }
    inspect_elf(path, &head)
}

/// The error for a `--kernel` that is `found` instead of a kernel.
fn not_kernel(path: &Path, found: String) -> BootError {
    BootError::NotAKernel {
        path: path.to_path_buf(),
        found,
    }
}

/// Reads a bzImage's setup header: it needs a 64-bit entry point; `Err`
/// says what the file is instead.
fn inspect_bzimage(head: &[u8]) -> Result<KernelInfo, String> {
    let version = u16_at(head, 0x206).unwrap_or(0);
    let xloadflags = u16_at(head, 0x236).unwrap_or(0);
    if version < 0x020c || xloadflags & 1 == 0 {
        return Err(format!(
            "a bzImage (boot protocol {}.{:02}) without a 64-bit entry point",
            version >> 8,
            version & 0xff
        ));
    }
    let init_size = u32_at(head, 0x260).unwrap_or(0) as u64;
    let pref = u64_at(head, 0x258).unwrap_or(0).max(16 * MIB);
    let initrd_max = u32_at(head, 0x22c).unwrap_or(0x37ff_ffff) as u64;
    Ok(KernelInfo {
        format: KernelFormat::BzImage,
        end: pref + init_size,
        protocol: version,
        initrd_addr_max: initrd_max,
    })
}

/// Checks an ELF file is a vmlinux: 64-bit, little endian, x86-64,
/// ET_EXEC, loads above 1 MiB, and a "Linux" note.
fn inspect_elf(path: &Path, head: &[u8]) -> Result<KernelInfo, BootError> {
    let h = elf_header(head).map_err(|found| not_kernel(path, found))?;
    let ElfLoad {
        start,
        end,
        linux_note,
    } = elf_load(path, &h)?;
    if start == u64::MAX {
        return Err(not_kernel(
            path,
            "an ELF executable with nothing to load".into(),
        ));
    }
    if !linux_note {
        return Err(not_kernel(
            path,
            "an x86-64 ELF executable without the \"Linux\" ELF note every vmlinux carries".into(),
        ));
    }
    if start < HIMEM_START || h.entry < HIMEM_START {
        return Err(not_kernel(
            path,
            format!("an ELF executable that loads at {start:#x}, below 1 MiB"),
        ));
    }
    Ok(KernelInfo {
        format: KernelFormat::Elf,
        end,
        protocol: ELF_BOOT_PROTOCOL,
        initrd_addr_max: 0x7fff_ffff,
    })
}

/// What a vmlinux's ELF header says.
struct ElfHeader {
    entry: u64,
    phoff: u64,
    phentsize: u64,
    phnum: u64,
}

/// Reads an ELF header that must be a 64-bit little-endian x86-64
/// executable's with sane program headers; `Err` says what it is instead.
fn elf_header(head: &[u8]) -> Result<ElfHeader, String> {
    if head.get(4) != Some(&2) {
        return Err("a 32-bit ELF file".into());
    }
    if head.get(5) != Some(&1) {
        return Err("a big-endian ELF file".into());
    }
    let machine = u16_at(head, 18).unwrap_or(0);
    if machine != 62 {
        return Err(format!("an ELF file for machine {machine} (not x86-64)"));
    }
    let etype = u16_at(head, 16).unwrap_or(0);
    if etype != 2 {
        let what = match etype {
            1 => "a relocatable object file (ET_REL)",
            3 => "a shared library or position-independent executable (ET_DYN)",
            4 => "a core dump",
            _ => "an ELF file that is not an executable",
        };
        return Err(format!("{what}, not a vmlinux"));
    }
    let h = ElfHeader {
        entry: u64_at(head, 24).unwrap_or(0),
        phoff: u64_at(head, 32).unwrap_or(0),
        phentsize: u16_at(head, 54).unwrap_or(0) as u64,
        phnum: u16_at(head, 56).unwrap_or(0) as u64,
    };
    if h.phentsize != 56 || h.phnum == 0 || h.phnum > 64 {
        return Err("an ELF executable with malformed program headers".into());
    }
    Ok(h)
}

/// What an ELF's program headers load (`start` is `u64::MAX` when
/// nothing), and whether a note segment has the "Linux" note.
struct ElfLoad {
    start: u64,
    end: u64,
    linux_note: bool,
}

/// Reads the program headers, and the note segments they name, of the
/// ELF at `path`.
fn elf_load(path: &Path, h: &ElfHeader) -> Result<ElfLoad, BootError> {
    let (mut f, _) = super::open_kernel(path)?;
    let mut ph = vec![0u8; (h.phentsize * h.phnum) as usize];
    f.seek(SeekFrom::Start(h.phoff))
        .and_then(|_| f.read_exact(&mut ph))
        .map_err(|_| not_kernel(path, "a truncated ELF executable".into()))?;
    let mut load = ElfLoad {
        start: u64::MAX,
        end: 0,
        linux_note: false,
    };
    for i in 0..h.phnum as usize {
        let p = &ph[i * 56..(i + 1) * 56];
        let ptype = u32_at(p, 0).unwrap_or(0);
        let offset = u64_at(p, 8).unwrap_or(0);
        let paddr = u64_at(p, 24).unwrap_or(0);
        let filesz = u64_at(p, 32).unwrap_or(0);
        let memsz = u64_at(p, 40).unwrap_or(0);
        match ptype {
            1 if filesz > 0 || memsz > 0 => {
                load.start = load.start.min(paddr);
                load.end = load.end.max(paddr.saturating_add(memsz));
            }
            4 if filesz < (1 << 20) => {
                let mut notes = vec![0u8; filesz as usize];
                if f.seek(SeekFrom::Start(offset))
                    .and_then(|_| f.read_exact(&mut notes))
                    .is_ok()
                {
                    load.linux_note |= has_note(&notes, b"Linux");
                }
            }
            _ => {}
        }
    }
    Ok(load)
}

/// Whether an ELF note segment has a note named `name`.
pub(super) fn has_note(notes: &[u8], name: &[u8]) -> bool {
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
