//! Opening the kernel and initrd files: regular files of a plausible
//! size, opened without ever blocking.
//!
//! WHAT: [`open_kernel`] and [`open_initrd`], the only way this crate
//! opens either file, and their limits ([`MAX_KERNEL_BYTES`],
//! [`MAX_INITRD_BYTES`]).
//! WHY: a FIFO given as `--kernel` (or `payload.kernel` through the API)
//! would block the `open` for ever, before any `--timeout` runs; a device
//! such as `/dev/zero` never ends; a sparse file of a terabyte is no
//! kernel. Each is refused at once with a [`BootError`] that names the
//! flag and what to give instead.
//! HOW: [`topology::user_file::open`] (stat, then open with `O_NONBLOCK`
//! and check the opened descriptor again), shared with every other input
//! file of the workspace; this module only maps its problems to
//! [`BootError`]s.

use std::fs::File;
use std::path::Path;

use topology::user_file::{self, FileProblem};

use super::BootError;

/// The largest kernel file taken: a vmlinux with full debug information
/// is some hundreds of MiB; only its headers are read, and what it loads
/// must fit below 3 GiB of guest RAM anyway.
pub const MAX_KERNEL_BYTES: u64 = 2 << 30;

/// The largest initrd taken: the boot protocol places it below 2 GiB of
/// guest physical memory (`initrd_addr_max` of an ELF kernel), so a larger
/// one can never load.
pub const MAX_INITRD_BYTES: u64 = 2 << 30;

/// What each file must be, for messages.
const KERNEL_IS: &str = "give the kernel file: an uncompressed vmlinux (ELF) or a bzImage";
const INITRD_IS: &str = "give the initramfs file (a cpio archive, compressed or not)";

/// Opens the kernel at `path` for reading; returns it and its size.
pub fn open_kernel(path: &Path) -> Result<(File, u64), BootError> {
    user_file::open(path, MAX_KERNEL_BYTES).map_err(|p| problem("--kernel", path, p, KERNEL_IS))
}

/// Opens the initrd at `path` for reading; returns it and its size.
pub fn open_initrd(path: &Path) -> Result<(File, u64), BootError> {
    user_file::open(path, MAX_INITRD_BYTES).map_err(|p| problem("--initrd", path, p, INITRD_IS))
}

/// The [`BootError`] for a file `flag` names that cannot be used.
fn problem(flag: &'static str, path: &Path, p: FileProblem, is: &str) -> BootError {
    let path = path.to_path_buf();
    match (p, flag) {
        (FileProblem::Missing, "--kernel") => BootError::KernelMissing(path),
        (FileProblem::Missing, _) => BootError::InitrdMissing(path),
        (p @ (FileProblem::Io(_) | FileProblem::Grew { .. }), _) => BootError::File {
            flag,
            path,
            problem: p.to_string(),
        },
        (p, _) => BootError::File {
            flag,
            path,
            problem: format!("{p}; {is}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_blocks_and_says_what_to_give() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("k");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_kernel(&fifo).unwrap_err().to_string();
        assert!(
            e.contains("--kernel") && e.contains("a named pipe (FIFO), not a regular file"),
            "{e}"
        );
        assert!(e.contains("a bzImage"), "{e}");
        let e = open_initrd(&fifo).unwrap_err().to_string();
        assert!(e.starts_with("--initrd ") && e.contains("initramfs"), "{e}");
        let e = open_kernel(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("a character device"), "{e}");
        let big = dir.path().join("big");
        File::create(&big)
            .unwrap()
            .set_len(MAX_INITRD_BYTES + 1)
            .unwrap();
        let e = open_initrd(&big).unwrap_err().to_string();
        assert!(e.contains("the limit is 2147483648 (2 GiB)"), "{e}");
        assert!(matches!(
            open_kernel(&dir.path().join("none")),
            Err(BootError::KernelMissing(_))
        ));
        assert!(matches!(
            open_initrd(&dir.path().join("none")),
            Err(BootError::InitrdMissing(_))
        ));
    }
}
