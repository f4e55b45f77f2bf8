//! Helpers shared by the integration tests in `tests/tests/`.
//!
//! The tests drive the real `vmm` binary as a user would, and judge what it
//! produces with third-party tools (hwloc's CPUID parser, the guest kernel).

use std::path::PathBuf;
use std::process::{Command, Output};

/// Path of the `vmm` binary built for this workspace.
pub fn vmm_bin() -> PathBuf {
    if let Ok(p) = std::env::var("VMM_BIN") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("vmm");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "vmm binary not found under {}; run `cargo build -p vmm` first (the test command does)",
        target.display()
    );
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `shared/topologies` directory with the real machines' CPUID dumps.
pub fn shared_topologies() -> Option<PathBuf> {
    let root = workspace_root();
    [
        root.join("shared/topologies"),
        root.join("../shared/topologies"),
        root.join("tests/data/topologies"),
    ]
    .into_iter()
    .find(|p| p.join("cpuid").is_dir())
}

/// Runs `vmm ARGS` and returns its output.
pub fn vmm(args: &[&str]) -> Output {
    Command::new(vmm_bin())
        .args(args)
        .output()
        .expect("running vmm")
}

pub mod bench;
pub mod comparison;
pub mod disk;
pub mod guest;
pub mod guest_check;
pub mod netns;
pub mod run_bounded;
pub mod serve;
pub mod tools;
pub mod user_error;
pub mod virtiofsd;

pub use run_bounded::{run_bounded, BoundedOutput};
pub use tools::{require_kvm, require_tool, skip_or_fail};

/// A tiny "kernel" for the VMM's error paths: an x86-64 ELF executable
/// with the "Linux" ELF note, whose 64-bit entry at 0x100_0000 runs `code`.
/// The VMM enters it in long mode with paging on, as it would a vmlinux.
pub fn tiny_kernel(code: &[u8]) -> Vec<u8> {
    const LOAD: u64 = 0x100_0000;
    let ehdr = 64u64;
    let phdr = 56u64;
    let note_off = ehdr + 2 * phdr;
    // Note: namesz=6 ("Linux\0"), descsz=4, type=0x100.
    let mut note = Vec::new();
    note.extend_from_slice(&6u32.to_le_bytes());
    note.extend_from_slice(&4u32.to_le_bytes());
    note.extend_from_slice(&0x100u32.to_le_bytes());
    note.extend_from_slice(b"Linux\0\0\0");
    note.extend_from_slice(&0u32.to_le_bytes());
    let code_off = (note_off + note.len() as u64).div_ceil(16) * 16;
    let mut f = Vec::new();
    // ELF header.
    f.extend_from_slice(b"\x7fELF");
    f.extend_from_slice(&[2, 1, 1, 0]); // 64-bit, LE, version 1, SysV
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f.extend_from_slice(&62u16.to_le_bytes()); // x86-64
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&LOAD.to_le_bytes()); // entry
    f.extend_from_slice(&ehdr.to_le_bytes()); // phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // shoff
    f.extend_from_slice(&0u32.to_le_bytes()); // flags
    f.extend_from_slice(&(ehdr as u16).to_le_bytes());
    f.extend_from_slice(&(phdr as u16).to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes()); // phnum
    f.extend_from_slice(&[0; 6]); // shentsize, shnum, shstrndx
    let ph = |f: &mut Vec<u8>, ty: u32, off: u64, addr: u64, size: u64| {
        f.extend_from_slice(&ty.to_le_bytes());
        f.extend_from_slice(&5u32.to_le_bytes()); // R+X
        f.extend_from_slice(&off.to_le_bytes());
        f.extend_from_slice(&addr.to_le_bytes()); // vaddr
        f.extend_from_slice(&addr.to_le_bytes()); // paddr
        f.extend_from_slice(&size.to_le_bytes());
        f.extend_from_slice(&size.to_le_bytes());
        f.extend_from_slice(&16u64.to_le_bytes());
    };
    ph(&mut f, 1, code_off, LOAD, code.len() as u64);
    ph(&mut f, 4, note_off, 0, note.len() as u64);
    f.extend_from_slice(&note);
    f.resize(code_off as usize, 0);
    f.extend_from_slice(code);
    f
}
