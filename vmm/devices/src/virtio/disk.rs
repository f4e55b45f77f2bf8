//! A virtio-blk disk image: opened once, checked, locked.
//!
//! Its own module so that the device ([`super::block`]) and its request
//! engines ([`super::block_engine`]) both use it without importing each
//! other.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES;

/// Bytes per sector, as virtio-blk counts.
pub const SECTOR: u64 = 512;

/// Why an image cannot be used. Each names the image and the fix.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// Missing.
    #[error("disk image {0}: no such file (give the path of an existing raw image)")]
    Missing(PathBuf),
    /// Not a regular file.
    #[error(
        "disk image {0}: not a regular file (give a raw image file, not a directory or device)"
    )]
    NotAFile(PathBuf),
    /// Locked by someone else.
    #[error(
        "disk image {0}: locked by another process or another disk of this VM \
         (another VM using it?); stop that VM, or give readonly=on if both only read it"
    )]
    Locked(PathBuf),
    /// Asked read-write, but only readable.
    #[error(
        "disk image {0}: cannot be opened read-write ({1}); give readonly=on to use it read-only"
    )]
    NotWritable(PathBuf, std::io::Error),
    /// Anything else the host refused.
    #[error("disk image {0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// Too small to hold one sector.
    #[error("disk image {0}: {1} bytes, less than one 512-byte sector")]
    Empty(PathBuf, u64),
}

/// An opened and locked image.
#[derive(Debug)]
pub struct Disk {
    file: File,
    path: PathBuf,
    readonly: bool,
    sectors: u64,
    id: [u8; VIRTIO_BLK_ID_BYTES as usize],
}

impl Disk {
    /// Opens `path` (read-only if `readonly`) and locks it. Nothing is
    /// created and nothing is written.
    pub fn open(path: &Path, readonly: bool) -> Result<Self, DiskError> {
        let p = path.to_path_buf();
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DiskError::Missing(p))
            }
            Err(e) => return Err(DiskError::Io(p, e)),
        };
        if !meta.is_file() {
            return Err(DiskError::NotAFile(p));
        }
        // O_NONBLOCK: a FIFO swapped in after the stat must not block the
        // open (it is refused below); a regular file ignores the flag.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!readonly)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM | libc::EROFS) if !readonly => {
                    DiskError::NotWritable(p.clone(), e)
                }
                _ => DiskError::Io(p.clone(), e),
            })?;
        // Re-check what was opened: the path may have changed in between.
        let meta = file.metadata().map_err(|e| DiskError::Io(p.clone(), e))?;
        if !meta.is_file() {
            return Err(DiskError::NotAFile(p));
        }
        let op = if readonly {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a file descriptor this function owns; no memory
        // is passed.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => DiskError::Locked(p),
                _ => DiskError::Io(p, e),
            });
        }
        let sectors = meta.len() / SECTOR;
        if sectors == 0 {
            return Err(DiskError::Empty(p, meta.len()));
        }
        // A stable ID for the guest (/dev/disk/by-id): the image's device
        // and inode, as Cloud Hypervisor derives its serial.
        let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
        let text = format!("{:x}{:x}", meta.dev(), meta.ino());
        let n = text.len().min(id.len());
        id[..n].copy_from_slice(&text.as_bytes()[..n]);
        Ok(Self {
            file,
            path: p,
            readonly,
            sectors,
            id,
        })
    }

    /// The image's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Capacity in 512-byte sectors (a partial last sector is not used).
    pub fn sectors(&self) -> u64 {
        self.sectors
    }
    /// Whether it is read-only.
    pub fn readonly(&self) -> bool {
        self.readonly
    }
    /// The ID the guest reads with `GET_ID` (`VIRTIO_BLK_ID_BYTES`, NUL
    /// padded).
    pub(crate) fn id(&self) -> &[u8] {
        &self.id
    }
    /// The open image, for the request engines.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }
}
