//! The specs of the devices whose host side is a Unix socket: virtio-vsock
//! (the VMM creates the socket) and virtio-fs (its vhost-user backend
//! listens on it). Checked before anything is built.

use std::path::PathBuf;

use vmm_devices::virtio::fs::{Fs, FsError};

use vmm_devices::virtio::fs::MAX_QUEUE_SIZE as FS_QUEUE_SIZE;
use vmm_devices::virtio::vsock::MIN_GUEST_CID as MIN_VSOCK_CID;

/// A virtio-vsock (Cloud Hypervisor's `--vsock` fields): stream sockets
/// to the guest through the Unix socket `socket` (hybrid vsock; see
/// `vmm_devices::virtio::vsock`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VsockSpec {
    /// `cid=`: the guest's CID, 3 or more.
    pub cid: u64,
    /// `socket=`: the Unix socket the VMM creates (it must not exist) and
    /// removes when the VM goes.
    pub socket: PathBuf,
    /// `pci_segment=S`.
    pub pci_segment: u16,
}

impl VsockSpec {
    pub(super) fn check(&self) -> Result<(), String> {
        if self.cid < MIN_VSOCK_CID || self.cid > u64::from(u32::MAX) {
            return Err(format!(
                "vsock cid={}: a guest CID must be 3 or more (0-2 are reserved) and fit 32 bits",
                self.cid
            ));
        }
        if self.socket.as_os_str().is_empty() {
            return Err(
                "vsock socket= is empty: give the path of the Unix socket to create".into(),
            );
        }
        if self.socket.symlink_metadata().is_ok() {
            return Err(format!(
                "vsock socket={}: the path exists; the VMM creates the socket itself \
                 (and removes it when the VM goes): remove the file or pick another path",
                self.socket.display()
            ));
        }
        Ok(())
    }
}

/// A virtio-fs device served by a vhost-user backend such as virtiofsd
/// (Cloud Hypervisor's `--fs` fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsSpec {
    /// The name the guest mounts it by (`mount -t virtiofs TAG`).
    pub tag: String,
    /// The backend's vhost-user socket.
    pub socket: PathBuf,
    /// Request queues (the device has one more, the high-priority one).
    pub num_queues: u16,
    /// Entries per queue (a power of two up to [`FS_QUEUE_SIZE`]).
    pub queue_size: u16,
    /// `pci_segment=S`.
    pub pci_segment: u16,
}

impl FsSpec {
    /// Refuses what cannot be built, naming the fix.
    pub(super) fn check(&self) -> Result<(), String> {
        let what = format!("fs tag={}", self.tag);
        vmm_devices::virtio::fs::tag_bytes(&self.tag).map_err(|e| format!("{what}: {e}"))?;
        let max = vmm_devices::virtio::fs::MAX_REQUEST_QUEUES;
        if self.num_queues == 0 || self.num_queues > max {
            return Err(format!(
                "{what}: num_queues={}; give 1 to {max} request queues",
                self.num_queues
            ));
        }
        if !self.queue_size.is_power_of_two() || !(2..=FS_QUEUE_SIZE).contains(&self.queue_size) {
            return Err(format!(
                "{what}: queue_size={}; give a power of two from 2 to {FS_QUEUE_SIZE}",
                self.queue_size
            ));
        }
        if self.socket.as_os_str().is_empty() {
            return Err(format!(
                "{what}: socket= is empty: give the vhost-user socket of its backend (virtiofsd)"
            ));
        }
        Ok(())
    }

    /// Connects to the backend (see [`Fs::connect`]).
    pub fn open(&self, name: &str) -> Result<Fs, FsError> {
        Fs::connect(
            name,
            &self.tag,
            &self.socket,
            self.num_queues,
            self.queue_size,
        )
    }
}
