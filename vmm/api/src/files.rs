//! The files a request names: checked before they are opened, opened so
//! that none can block.
//!
//! WHAT: [`check_config_files`] (every path of a [`VmConfig`]: the kernel
//! and initramfs must be regular files of bounded size, the serial file a
//! new file in an existing directory), [`open_console`] (the serial file
//! at boot: made new, or the same file this VM made at an earlier boot,
//! known again by its (device, inode)).
//! WHY: a FIFO named as a kernel blocks the `open` that reads it for ever,
//! `/dev/zero` never ends, and a serial file that already exists is a
//! user's file that `File::create` would empty. An API request must never
//! block the server on a file, and the server writes only files it made.
//! HOW: `stat` before any `open` (a stat never blocks); what `open`s
//! remains (the kernel's header, an initramfs check) runs on tokio's
//! blocking pool with no lock held (the controller's job). Outputs are
//! opened `O_CREAT|O_EXCL`, or again by the (device, inode) the server
//! recorded when it made them, with `O_NONBLOCK|O_NOFOLLOW`, so a FIFO or
//! link swapped in later is refused instead of waited on. No HTTP types.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use topology::user_file::kind;

use super::api::{ApiError, VmConfig};

/// The largest kernel image a request may name: the machine's own limit
/// (a vmlinux with debug information is some hundreds of MiB).
pub const MAX_KERNEL_FILE: u64 = 2 << 30;

/// A file's identity: (device, inode).
pub type FileId = (u64, u64);

/// Checks, without opening it, that `path` (the request's `field`) is a
/// regular file of at most `max` bytes. A path that does not exist passes:
/// the machine's own check says so in its words.
pub fn check_input_file(field: &str, path: &str, max: u64) -> Result<(), ApiError> {
    if path.is_empty() {
        return Err(ApiError::bad(field, "empty: give a file path"));
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ApiError::bad(field, format!("{path}: {e}"))),
    };
    if !meta.is_file() {
        return Err(ApiError::bad(
            field,
            format!(
                "{path} is {}; give a regular file (the server never opens anything else)",
                kind(&meta)
            ),
        ));
    }
    if meta.len() > max {
        return Err(ApiError::bad(
            field,
            format!(
                "{path} is {} bytes, more than the {max} bytes this field takes",
                meta.len()
            ),
        ));
    }
    Ok(())
}

/// Checks that `path` (the request's `field`) can become a new file: that
/// nothing is there yet (the server never writes over a file it did not
/// make) and that its directory exists.
pub fn check_output_file(field: &str, path: &str) -> Result<(), ApiError> {
    if path.is_empty() {
        return Err(ApiError::bad(field, "empty: give a file path"));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) => {
            return Err(ApiError::bad(
                field,
                format!(
                    "{path} exists ({}); the server never writes over a file it did not make: \
                     give a new path, or remove it first",
                    kind(&m)
                ),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ApiError::bad(field, format!("{path}: {e}"))),
    }
    let dir = Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(ApiError::bad(
            field,
            format!("{path}: {} is not a directory", dir.display()),
        ));
    }
    Ok(())
}

/// Checks every file `cfg` names, as `vm.create` needs: the payload's
/// ([`check_payload_files`]), and the serial and console files, new ones,
/// and the console's socket, a free path. Opens and reads the kernel's
/// header: run it with no lock held.
pub fn check_config_files(cfg: &VmConfig) -> Result<(), ApiError> {
    check_payload_files(cfg)?;
    if let Some(f) = cfg.serial.as_ref().and_then(|s| s.file.as_deref()) {
        check_output_file("serial.file", f)?;
    }
    if let Some(f) = cfg.console.as_ref().and_then(|s| s.file.as_deref()) {
        check_output_file("console.file", f)?;
    }
    if let Some(f) = cfg.console.as_ref().and_then(|s| s.socket.as_deref()) {
        check_output_file("console.socket", f)?;
    }
    Ok(())
}

/// Checks the payload's files: the kernel and initramfs are regular files
/// of bounded size (the initramfs at most the guest's memory) that the
/// machine can boot. Opens and reads the kernel's header.
pub fn check_payload_files(cfg: &VmConfig) -> Result<(), ApiError> {
    if let Some(p) = &cfg.payload {
        if let Some(k) = &p.kernel {
            check_input_file("payload.kernel", k, MAX_KERNEL_FILE)?;
            vmm_machine::boot::inspect_kernel(Path::new(k))
                .map_err(|e| ApiError::bad("payload.kernel", e.to_string()))?;
        }
        if let Some(i) = &p.initramfs {
            check_input_file("payload.initramfs", i, cfg.memory_bytes())?;
            vmm_machine::boot::check_initrd(Path::new(i))
                .map_err(|e| ApiError::bad("payload.initramfs", e.to_string()))?;
        }
    }
    Ok(())
}

/// Opens a VM's serial or console file (`field`) for writing, never blocking and never writing
/// over a user's file: a new file when `made` is `None` (or the file this
/// VM made is gone), else the file this VM made at an earlier boot,
/// appended to. Returns the file and its identity.
pub fn open_console(
    field: &str,
    path: &str,
    made: Option<FileId>,
) -> Result<(File, FileId), String> {
    let id = |f: &File| {
        f.metadata()
            .map(|m| (m.is_file(), (m.dev(), m.ino())))
            .map_err(|e| format!("{field}.file {path}: {e}"))
    };
    if let Some(mine) = made {
        match OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => {
                return match id(&f)? {
                    (true, now) if now == mine => Ok((f, mine)),
                    _ => Err(format!(
                        "{field}.file {path}: no longer the file this VM made; the server \
                         never writes over a file it did not make: remove it, or vm.delete \
                         and vm.create the VM with another path"
                    )),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{field}.file {path}: {e}")),
        }
    }
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!(
                "{field}.file {path}: exists; the server never writes over a file it did not \
                 make: remove it, or vm.delete and vm.create the VM with another path"
            ),
            _ => format!("{field}.file {path}: {e}"),
        })?;
    let (_, made) = id(&f)?;
    Ok((f, made))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(dir: &Path) -> String {
        let p = dir.join("fifo");
        let ok = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap();
        assert!(ok.success());
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn inputs_must_be_regular_files_of_bounded_size() {
        let d = tempfile::tempdir().unwrap();
        let f = fifo(d.path());
        let e = check_input_file("payload.kernel", &f, 1 << 20).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("payload.kernel"));
        assert!(
            e.error.contains("a named pipe (FIFO)") && e.error.contains(&f),
            "{e:?}"
        );
        let dir = d.path().to_str().unwrap();
        let e = check_input_file("payload.initramfs", dir, 1 << 20).unwrap_err();
        assert!(e.error.contains("a directory"), "{e:?}");
        let e = check_input_file("payload.kernel", "/dev/zero", 1 << 20).unwrap_err();
        assert!(e.error.contains("a character device"), "{e:?}");
        let big = d.path().join("big");
        std::fs::write(&big, vec![0u8; 100]).unwrap();
        let e = check_input_file("payload.initramfs", big.to_str().unwrap(), 99).unwrap_err();
        assert!(e.error.contains("100 bytes"), "{e:?}");
        check_input_file("payload.initramfs", big.to_str().unwrap(), 100).unwrap();
        // Missing: left to the machine's check, which names it.
        check_input_file("payload.kernel", "/nonexistent/k", 1).unwrap();
        assert!(check_input_file("payload.kernel", "", 1).is_err());
    }

    #[test]
    fn a_fifo_kernel_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let cfg = VmConfig {
            payload: Some(crate::api::PayloadConfig {
                kernel: Some(fifo(d.path())),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = check_config_files(&cfg).unwrap_err();
        assert_eq!(
            (e.status, e.field.as_deref()),
            (400, Some("payload.kernel"))
        );
    }

    #[test]
    fn outputs_never_replace_a_file() {
        let d = tempfile::tempdir().unwrap();
        let old = d.path().join("old.log");
        std::fs::write(&old, "precious").unwrap();
        let e = check_output_file("serial.file", old.to_str().unwrap()).unwrap_err();
        assert!(e.error.contains("exists (a regular file)"), "{e:?}");
        let e = check_output_file("serial.file", &fifo(d.path())).unwrap_err();
        assert!(e.error.contains("a named pipe (FIFO)"), "{e:?}");
        let e = check_output_file("serial.file", "/nonexistent/dir/c.log").unwrap_err();
        assert!(e.error.contains("not a directory"), "{e:?}");
        assert!(open_console("serial", old.to_str().unwrap(), None).is_err());
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "precious");
        // A new file; a later boot appends to the same file.
        let new = d.path().join("new.log");
        let new = new.to_str().unwrap();
        check_output_file("serial.file", new).unwrap();
        let (mut f, id) = open_console("serial", new, None).unwrap();
        std::io::Write::write_all(&mut f, b"boot 1\n").unwrap();
        let (mut f, again) = open_console("serial", new, Some(id)).unwrap();
        assert_eq!(again, id);
        std::io::Write::write_all(&mut f, b"boot 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(new).unwrap(), "boot 1\nboot 2\n");
        // Replaced by someone else's file: refused, left alone.
        std::fs::remove_file(new).unwrap();
        std::fs::write(new, "theirs").unwrap();
        assert!(open_console("serial", new, Some(id)).is_err());
        assert_eq!(std::fs::read_to_string(new).unwrap(), "theirs");
    }
}
