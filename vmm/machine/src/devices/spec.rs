//! What a guest's I/O devices are ([`DeviceSpec`]: Cloud Hypervisor's
//! `--disk`, `--net`, ... fields) and the host side opened for them
//! before the VM is built ([`Backends`]).

use std::path::PathBuf;
use std::sync::Arc;

use vmm_devices::pci::{SegmentLayout, ECAM_SEGMENT_SIZE};
use vmm_devices::tap::{Tap, TapError};
use vmm_devices::virtio::block::MAX_QUEUE_SIZE as MAX_DISK_QUEUE_SIZE;
use vmm_devices::virtio::block::{Disk, DiskError};
use vmm_devices::virtio::block_engine::EngineKind as BlockEngine;
use vmm_devices::virtio::fs::Fs;
use vmm_devices::virtio::net::Mac;

use super::socket_specs::{FsSpec, VsockSpec};
use crate::layout::{MMIO_HOLE_START, PCI_ECAM_START};

/// The most PCI segments a guest may have.
pub const MAX_PCI_SEGMENTS: u16 = 16;
/// The most queues of one disk (its default is one per vCPU, up to this).
pub const MAX_DISK_QUEUES: u16 = 64;
/// The most queue pairs of one virtio-net.
pub const MAX_NET_PAIRS: u16 = vmm_devices::virtio::net::MAX_PAIRS;

/// A virtio-blk disk (Cloud Hypervisor's `--disk` fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSpec {
    /// The raw image.
    pub path: PathBuf,
    /// `readonly=on`.
    pub readonly: bool,
    /// `num_queues=N`; `None`: one per vCPU.
    pub num_queues: Option<u16>,
    /// Entries per queue (a power of two, 4 to [`MAX_DISK_QUEUE_SIZE`]);
    /// `None`: [`super::DISK_QUEUE_SIZE`].
    pub queue_size: Option<u16>,
    /// `pci_segment=S`.
    pub pci_segment: u16,
    /// `engine=sync|pool|io_uring`: this VMM's extension (Cloud
    /// Hypervisor has no such key); the default where not given.
    pub engine: BlockEngine,
}

/// Descriptors of open taps that this process owns and keeps (the API
/// server's, received over its socket with `SCM_RIGHTS`): each boot opens
/// duplicates of them, so the VM can boot again, and they close when the
/// last holder lets go. Equal only to itself.
#[derive(Clone, Debug)]
pub struct SharedFds(pub Arc<Vec<std::os::fd::OwnedFd>>);

impl PartialEq for SharedFds {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedFds {}

impl SharedFds {
    fn raw(&self) -> Vec<i32> {
        use std::os::fd::AsRawFd;
        self.0.iter().map(AsRawFd::as_raw_fd).collect()
    }
}

/// Where a virtio-net's tap comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TapSource {
    /// `tap=NAME`: an existing tap, opened once per queue pair.
    Name(String),
    /// `fd=N` or `fd=[N,M,..]`: descriptors of an open tap, one per
    /// queue pair, handed to this process.
    Fds(Vec<i32>),
    /// Descriptors of an open tap that the caller keeps, one per queue
    /// pair (duplicated at each open).
    Shared(SharedFds),
}

/// A virtio-net (Cloud Hypervisor's `--net` fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetSpec {
    /// The tap.
    pub tap: TapSource,
    /// `mac=`; `None`: a random locally administered one.
    pub mac: Option<Mac>,
    /// `num_queues=N`: receive and transmit queues together (2 per pair);
    /// `None`: 2, or 2 per passed fd.
    pub num_queues: Option<u16>,
    /// `pci_segment=S`.
    pub pci_segment: u16,
}

impl NetSpec {
    /// Queue pairs.
    pub fn pairs(&self) -> u16 {
        match (self.num_queues, &self.tap) {
            (Some(n), _) => (n / 2).max(1),
            (None, TapSource::Fds(f)) => f.len().max(1) as u16,
            (None, TapSource::Shared(f)) => f.0.len().max(1) as u16,
            (None, TapSource::Name(_)) => 1,
        }
    }

    fn what(&self) -> String {
        match &self.tap {
            TapSource::Name(n) => format!("net tap={n}"),
            TapSource::Fds(f) => format!("net fd={f:?}"),
            TapSource::Shared(f) => format!("net fds {:?}", f.raw()),
        }
    }

    fn check(&self, vcpus: usize) -> Result<(), String> {
        let what = self.what();
        if let Some(n) = self.num_queues {
            if n < 2 || n % 2 != 0 {
                return Err(format!(
                    "{what}: num_queues={n}; give an even number, 2 or more \
                     (a receive and a transmit queue per pair)"
                ));
            }
        }
        let pairs = self.pairs();
        if pairs > MAX_NET_PAIRS {
            return Err(format!(
                "{what}: {pairs} queue pairs is more than this VMM's {MAX_NET_PAIRS}; \
                 give num_queues={} or less",
                2 * MAX_NET_PAIRS
            ));
        }
        if usize::from(pairs) > vcpus.max(1) {
            return Err(format!(
                "{what}: {pairs} queue pairs is more than the guest's {vcpus} vCPUs; \
                 give num_queues={} or less (one pair per vCPU at most)",
                2 * vcpus.max(1)
            ));
        }
        let fds = match &self.tap {
            TapSource::Fds(f) => Some(f.len()),
            TapSource::Shared(f) => Some(f.0.len()),
            TapSource::Name(_) => None,
        };
        if let Some(n) = fds.filter(|&n| n != usize::from(pairs)) {
            return Err(format!(
                "{what}: {n} fds for {pairs} queue pairs; give one fd per pair \
                 (num_queues = 2 x the number of fds)"
            ));
        }
        Ok(())
    }

    /// Opens the tap's files (one per pair); nothing is created.
    pub fn open(&self) -> Result<Vec<Tap>, TapError> {
        match &self.tap {
            TapSource::Name(n) => Tap::open_named(n, self.pairs()),
            TapSource::Shared(fds) => fds
                .0
                .iter()
                .map(|fd| {
                    use std::os::fd::AsRawFd;
                    let dup = fd.try_clone().map_err(|source| TapError::BadFd {
                        fd: fd.as_raw_fd(),
                        source,
                    })?;
                    Tap::from_fd(dup)
                })
                .collect(),
            TapSource::Fds(fds) => fds
                .iter()
                .map(|&fd| {
                    if fd < 3 {
                        return Err(TapError::BadFd {
                            fd,
                            source: std::io::Error::other(
                                "0, 1 and 2 are stdin, stdout and stderr",
                            ),
                        });
                    }
                    // SAFETY: F_GETFD on a number; no memory is passed.
                    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                        return Err(TapError::BadFd {
                            fd,
                            source: std::io::Error::last_os_error(),
                        });
                    }
                    // SAFETY: the user handed this process descriptor `fd`
                    // (open, checked above) for the tap (`fd=`); nothing else
                    // here uses or closes it.
                    unsafe { Tap::from_raw_fd(fd) }
                })
                .collect(),
        }
    }
}

/// The I/O devices a guest gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpec {
    /// PCI segments (at least 1, at most [`MAX_PCI_SEGMENTS`]).
    pub pci_segments: u16,
    /// A virtio-rng on this segment.
    pub rng: Option<u16>,
    /// virtio-blk disks, in the order the guest sees them (vda, vdb, ...).
    pub disks: Vec<DiskSpec>,
    /// virtio-net devices, in the order the guest sees them (eth0, ...).
    pub nets: Vec<NetSpec>,
    /// A virtio-console on this segment: the guest's console is `hvc0`.
    pub console: Option<u16>,
    /// virtio-fs devices (vhost-user), after the nets on their segments.
    /// Any of them makes guest RAM shared (memfd): their backends map it.
    pub fs: Vec<FsSpec>,
    /// A virtio-vsock (at most one, as in Cloud Hypervisor); built after
    /// the nets, so their addresses do not move.
    pub vsock: Option<VsockSpec>,
}

/// The host side of the devices, opened before the VM is built: the
/// disk images (locked) and the taps.
#[derive(Default)]
pub struct Backends {
    /// One per [`DeviceSpec::disks`].
    pub disks: Vec<Disk>,
    /// One list of tap files per [`DeviceSpec::nets`].
    pub taps: Vec<Vec<Tap>>,
    /// The virtio-console's output and input, with [`DeviceSpec::console`].
    pub console: Option<(Box<dyn std::io::Write + Send>, Option<std::os::fd::OwnedFd>)>,
    /// One connected vhost-user frontend per [`DeviceSpec::fs`].
    pub fs: Vec<Fs>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("disks", &self.disks)
            .field("taps", &self.taps)
            .field("console", &self.console.is_some())
            .field("fs", &self.fs)
            .finish()
    }
}

impl DeviceSpec {
    /// One segment and no devices.
    pub fn none() -> Self {
        Self {
            pci_segments: 1,
            ..Self::default()
        }
    }

    fn check_segment(&self, what: &str, s: u16) -> Result<(), String> {
        if s < self.pci_segments {
            return Ok(());
        }
        Err(format!(
            "the {what}'s pci_segment={s} does not exist: the guest has {} segment(s) (0 to {}); \
             raise num_pci_segments or pick a lower segment",
            self.pci_segments,
            self.pci_segments - 1
        ))
    }

    /// Queues of disk `d` for a guest of `vcpus` vCPUs.
    pub fn disk_queues(d: &DiskSpec, vcpus: usize) -> u16 {
        d.num_queues
            .unwrap_or_else(|| vcpus.clamp(1, usize::from(MAX_DISK_QUEUES)) as u16)
    }

    /// The PCI address (segment, slot) virtio-net `i` gets at build time:
    /// [`super::PciBuilder::build`] fills each segment's slots from 1 (slot 0 is
    /// the host bridge) in the order rng, disks, console, nets; keep the
    /// two in step. `None`: no such net.
    pub fn net_address(&self, i: usize) -> Option<(u16, usize)> {
        let seg = self.nets.get(i)?.pci_segment;
        let on = |s: u16| usize::from(s == seg);
        let before = self.rng.map_or(0, on)
            + self.disks.iter().map(|d| on(d.pci_segment)).sum::<usize>()
            + self.console.map_or(0, on)
            + self.nets[..i]
                .iter()
                .map(|n| on(n.pci_segment))
                .sum::<usize>();
        Some((seg, 1 + before))
    }

    /// Opens and locks every disk image, in order; nothing is created.
    pub fn open_disks(&self) -> Result<Vec<Disk>, DiskError> {
        self.disks
            .iter()
            .map(|d| Disk::open(&d.path, d.readonly))
            .collect()
    }

    /// Opens every disk and tap and connects every fs backend, in
    /// order; nothing is created.
    pub fn open(&self) -> Result<Backends, crate::Error> {
        Ok(Backends {
            fs: self
                .fs
                .iter()
                .enumerate()
                .map(|(i, f)| f.open(&format!("virtio-fs{i}")))
                .collect::<Result<_, _>>()?,
            disks: self.open_disks()?,
            taps: self
                .nets
                .iter()
                .map(NetSpec::open)
                .collect::<Result<_, _>>()?,
            console: None,
        })
    }

    /// Refuses what cannot be built for a guest of `vcpus` vCPUs, naming
    /// the fix.
    pub fn check(&self, vcpus: usize) -> Result<(), String> {
        if self.pci_segments == 0 || self.pci_segments > MAX_PCI_SEGMENTS {
            return Err(format!(
                "num_pci_segments {} is out of range: give 1 to {MAX_PCI_SEGMENTS}",
                self.pci_segments
            ));
        }
        if let Some(s) = self.rng {
            self.check_segment("rng", s)?;
        }
        if let Some(s) = self.console {
            self.check_segment("virtio console", s)?;
        }
        for d in &self.disks {
            let what = format!("disk {}", d.path.display());
            self.check_segment(&what, d.pci_segment)?;
            if let Some(q) = d.queue_size.filter(|q| {
                !q.is_power_of_two()
                    || !(vmm_devices::virtio::block::MIN_QUEUE_SIZE..=MAX_DISK_QUEUE_SIZE)
                        .contains(q)
            }) {
                return Err(format!(
                    "{what}: queue_size={q}; give a power of two from {} to {MAX_DISK_QUEUE_SIZE}",
                    vmm_devices::virtio::block::MIN_QUEUE_SIZE
                ));
            }
            match d.num_queues {
                Some(0) => return Err(format!("{what}: num_queues=0; give 1 or more")),
                Some(n) if n > MAX_DISK_QUEUES => {
                    return Err(format!(
                    "{what}: num_queues={n} is more than this VMM's {MAX_DISK_QUEUES} per disk; \
                         give at most {MAX_DISK_QUEUES}"
                ))
                }
                Some(n) if usize::from(n) > vcpus.max(1) => {
                    return Err(format!(
                        "{what}: num_queues={n} is more than the guest's {vcpus} vCPUs; \
                         give at most {vcpus} (one per vCPU is the default)"
                    ))
                }
                _ => {}
            }
        }
        for n in &self.nets {
            self.check_segment(&n.what(), n.pci_segment)?;
            n.check(vcpus)?;
        }
        if let Some(v) = &self.vsock {
            self.check_segment("vsock", v.pci_segment)?;
            v.check()?;
        }
        for f in &self.fs {
            self.check_segment(&format!("fs tag={}", f.tag), f.pci_segment)?;
            f.check()?;
        }
        Ok(())
    }

    /// Where each segment sits, for a guest of `nodes` NUMA nodes.
    pub fn layouts(&self, nodes: usize) -> Vec<SegmentLayout> {
        let n = u64::from(self.pci_segments.max(1));
        let window = (PCI_ECAM_START - MMIO_HOLE_START) / n;
        // A power of two, so that 64 KiB BARs pack without holes.
        let window = 1u64 << (63 - window.leading_zeros());
        (0..self.pci_segments.max(1))
            .map(|s| SegmentLayout {
                id: s,
                ecam: PCI_ECAM_START + u64::from(s) * ECAM_SEGMENT_SIZE,
                mmio: (MMIO_HOLE_START + u64::from(s) * window, window),
                node: Some(u32::from(s) % nodes.max(1) as u32),
            })
            .collect()
    }
}
