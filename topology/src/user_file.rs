//! Files a user names as input: regular files of bounded size, opened
//! without ever blocking.
//!
//! WHAT: [`open`] (a regular file of at most `max` bytes, opened for
//! reading) and [`read`] (its bytes, never more than `max`), with the
//! problem in words ([`FileProblem`]) and [`kind`] ("a named pipe
//! (FIFO)", "a directory", ...).
//! WHY: a FIFO, a device such as `/dev/zero`, or a directory given where a
//! file belongs must be refused at once: opening a FIFO for reading
//! blocks until a writer comes, and `/dev/zero` never ends. Every input
//! file of the workspace (topology XML and CPUID dumps here; kernels and
//! initrds in `vmm_machine::boot`; `vmm run`, `vmm serve` and `vmm plan`
//! files in the CLI) goes through this one module.
//! HOW: `stat` first (it never blocks) and refuse what is not a regular
//! file or is larger than the limit; then open with `O_NONBLOCK` (a FIFO
//! swapped in since the `stat` opens at once instead of waiting for a
//! writer) and check the opened descriptor again with `fstat`; reading
//! stops one byte past the limit, so a file that grows is caught too.
//! This module imports only [`crate::text`], a leaf.

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use crate::text::human_bytes;

/// What is wrong with an input file, in words a user can act on (the
/// caller adds the flag and the path).
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// Nothing is at the path.
    #[error("no such file")]
    Missing,
    /// A directory, device, FIFO or socket.
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
    /// Larger than the limit.
    #[error("it is {len} bytes; the limit is {max} ({})", human_bytes(*max))]
    TooLarge {
        /// Its size.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// It grew past the limit while being read.
    #[error("it holds more than {max} bytes ({}), the limit", human_bytes(*max))]
    Grew {
        /// The limit.
        max: u64,
    },
    /// The OS refused (permissions, I/O error).
    #[error("cannot read it: {0}")]
    Io(String),
}

impl FileProblem {
    fn io(e: &std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound {
            return FileProblem::Missing;
        }
        FileProblem::Io(os_words(e))
    }
}

/// An OS error in words, without Rust's `(os error N)` suffix.
pub fn os_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// "a directory", "a character device", ... for messages.
pub fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let ft = meta.file_type();
    if ft.is_dir() {
        "a directory"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a named pipe (FIFO)"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Refuses what is not a regular file of at most `max` bytes.
fn check(meta: &std::fs::Metadata, max: u64) -> Result<u64, FileProblem> {
    if !meta.is_file() {
        return Err(FileProblem::NotRegular(kind(meta)));
    }
    if meta.len() > max {
        return Err(FileProblem::TooLarge {
            len: meta.len(),
            max,
        });
    }
    Ok(meta.len())
}

/// Opens `path` for reading if it is a regular file (following links) of
/// at most `max` bytes; returns the file and its size. Never blocks: see
/// the module doc.
pub fn open(path: &Path, max: u64) -> Result<(File, u64), FileProblem> {
    let meta = std::fs::metadata(path).map_err(|e| FileProblem::io(&e))?;
    check(&meta, max)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| FileProblem::io(&e))?;
    // The path may name something else by now: judge what was opened.
    let len = check(&f.metadata().map_err(|e| FileProblem::io(&e))?, max)?;
    Ok((f, len))
}

/// Reads all of `path`, a regular file of at most `max` bytes ([`open`]);
/// a file that grows past `max` while read is refused, not cut.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, FileProblem> {
    let (f, len) = open(path, max)?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| FileProblem::io(&e))?;
    if buf.len() as u64 > max {
        return Err(FileProblem::Grew { max });
    }
    Ok(buf)
}

/// [`read`] as UTF-8 text, with the problem in words ending in what to
/// give instead: `what` ("a TOML file") follows a file that is not
/// regular, too large, or not UTF-8.
pub fn read_text(path: &Path, max: u64, what: &str) -> Result<String, String> {
    let bytes = read(path, max).map_err(|e| match e {
        FileProblem::NotRegular(_) | FileProblem::TooLarge { .. } | FileProblem::Grew { .. } => {
            format!("{e}; give {what}")
        }
        FileProblem::Missing | FileProblem::Io(_) => e.to_string(),
    })?;
    String::from_utf8(bytes).map_err(|_| format!("it is not text (not UTF-8); give {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn only_bounded_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        assert_eq!(read(&f, 5).unwrap(), b"hello");
        assert_eq!(read_text(&f, 5, "a note").unwrap(), "hello");
        let e = read(&f, 4).unwrap_err().to_string();
        assert_eq!(e, "it is 5 bytes; the limit is 4 (4 B)");
        let fifo = dir.path().join("p");
        mkfifo(&fifo);
        // No writer: opening it for reading would block; it is refused.
        let e = read(&fifo, 1 << 20).unwrap_err().to_string();
        assert_eq!(e, "it is a named pipe (FIFO), not a regular file");
        let e = read(dir.path(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let e = read(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a character device"), "{e}");
        assert!(matches!(
            read(&dir.path().join("none"), 1),
            Err(FileProblem::Missing)
        ));
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_text(&f, 5, "a note").unwrap_err(),
            "it is not text (not UTF-8); give a note"
        );
        assert_eq!(
            read_text(dir.path(), 5, "a note").unwrap_err(),
            "it is a directory, not a regular file; give a note"
        );
        // A link to a FIFO is the FIFO.
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(matches!(
            open(&link, 10),
            Err(FileProblem::NotRegular("a named pipe (FIFO)"))
        ));
    }
}
