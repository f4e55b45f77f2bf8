//! Virtio devices on a micro-guest: the platform side.
//!
//! A micro-guest has no PCI enumeration and no interrupt controller.
//! Each of its devices is a `vmm_devices` virtio device on the modern PCI
//! transport ([`VirtioPci`]), its 64 KiB BAR 0 at a fixed guest-physical
//! address: device `i` at [`DEVICE_BASE`]` + i * `[`DEVICE_STRIDE`], inside
//! the identity-mapped first GiB and above RAM. The guest's accesses there
//! exit to [`MicroIo`](super::MicroIo), which hands them to the
//! transport; queue notifications become ioeventfds at `DRIVER_OK`, as
//! for a Linux guest ([`KvmNotify`]).
//!
//! Interrupts: the platform turns MSI-X on (as firmware would; the guest
//! has no configuration space to do it) and the guest programs the
//! vector table in the BAR as on x86: an entry's address
//! `0xFEE0_0000 | k << 12` names vCPU `k` (the destination APIC ID is the
//! vCPU index), the data is ignored, and clearing the mask bit routes it.
//! Raising a routed vector rings vCPU `k`'s doorbell through the executor
//! that runs the VM ([`VcpuWaker`]): the scheduler's wake on `workers` and
//! `threads`, the vCPU thread's on `host`. A doorbell is remembered one
//! deep, so a driver that checks its used ring and then `HLT`s never
//! misses a completion. A destination the VM does not have drops the
//! interrupt, as a real MSI to an absent APIC.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use vm_memory::GuestMemoryMmap;
use vmm_devices::interrupt::{MsiMessage, MsiVectors};
use vmm_devices::pci::PciDevice;
use vmm_devices::tap::Tap;
use vmm_devices::virtio::block::{Block, Disk};
use vmm_devices::virtio::net::{Mac, Net};
use vmm_devices::virtio::transport::BAR_SIZE;
use vmm_devices::virtio::vsock::Vsock;
use vmm_devices::virtio::{VirtioDevice, VirtioPci};
use vmm_devices::DeviceError;

use super::MicroError;
use crate::devices::KvmNotify;
use crate::vcpu_body::VcpuWaker;

/// Guest-physical address of device 0's BAR.
pub const DEVICE_BASE: u64 = 0x3f00_0000;
/// Bytes between two devices' BARs (one BAR each).
pub const DEVICE_STRIDE: u64 = BAR_SIZE as u64;
/// The most devices a micro-guest may have.
pub const MAX_DEVICES: usize = 16;

/// A device to give a micro-guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MicroDevice {
    /// virtio-blk over a raw image (opened and locked when the VM is
    /// built; read-only with a shared lock if `readonly`), one queue.
    Block {
        /// The image.
        path: std::path::PathBuf,
        /// Open it read-only.
        readonly: bool,
        /// Who executes its reads, writes and flushes.
        engine: crate::devices::BlockEngine,
    },
    /// virtio-net on an existing tap (opened by name when the VM is
    /// built, one queue pair), a random MAC.
    Net {
        /// The tap's name.
        tap: String,
    },
    /// virtio-vsock for guest CID `cid`, its host side the Unix socket
    /// `socket` (created when the VM is built, removed when it goes; see
    /// `vmm_devices::virtio::vsock`).
    Vsock {
        /// The guest's CID (3 or more).
        cid: u64,
        /// The socket the VMM listens on (must not exist).
        socket: std::path::PathBuf,
    },
}

/// The vCPU waker of a running VM, shared by its devices' vectors;
/// empty before the VM runs and after it is torn down (so that no device
/// keeps the executor, and through it the VM, alive).
pub(crate) type WakerSlot = Arc<Mutex<Option<VcpuWaker>>>;

/// A device's MSI-X vectors on a machine without an irqchip (see the
/// module docs).
struct MicroMsi {
    count: u16,
    /// The vCPU each routed vector goes to.
    dest: Mutex<Vec<Option<usize>>>,
    waker: WakerSlot,
}

impl MsiVectors for MicroMsi {
    fn count(&self) -> u16 {
        self.count
    }
    fn route(&self, vector: u16, msg: Option<MsiMessage>) -> Result<(), DeviceError> {
        let mut d = self.dest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = d.get_mut(usize::from(vector)) {
            *slot = msg.map(|m| m.dest_apic_id() as usize);
        }
        Ok(())
    }
    fn trigger(&self, vector: u16) -> Result<(), DeviceError> {
        let dest = self
            .dest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(usize::from(vector))
            .copied()
            .flatten();
        if let Some(k) = dest {
            let w = self.waker.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(w) = w.as_ref() {
                if !w.wake(k) {
                    tracing::debug!(vector, vcpu = k, "MSI to a vCPU the VM does not have");
                }
            }
        }
        Ok(())
    }
}

/// One device of a micro-guest: its BAR's address and its transport
/// (`None` once the VM is torn down).
pub(crate) struct DeviceSlot {
    pub(crate) base: u64,
    pub(crate) pci: Mutex<Option<VirtioPci>>,
}

impl DeviceSlot {
    /// The transport, if `addr` is inside this device's BAR: the offset.
    pub(crate) fn offset(&self, addr: u64) -> Option<u64> {
        addr.checked_sub(self.base).filter(|&o| o < DEVICE_STRIDE)
    }
}

/// Builds device `i` of VM `vm_name` at its fixed address, MSI-X on,
/// its I/O threads on host CPUs `io_cpus` when given.
pub(crate) fn build_device(
    vm_name: &str,
    i: usize,
    spec: &MicroDevice,
    io_cpus: Option<Vec<usize>>,
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    waker: &WakerSlot,
) -> Result<DeviceSlot, MicroError> {
    let base = DEVICE_BASE + i as u64 * DEVICE_STRIDE;
    let (name, device): (String, Box<dyn VirtioDevice>) = match spec {
        MicroDevice::Block {
            path,
            readonly,
            engine,
        } => {
            let name = format!("{vm_name}-blk{i}");
            let disk = Disk::open(path, *readonly)?;
            let dev = Block::new(&name, disk, 1).with_engine(*engine);
            (name.clone(), Box::new(dev))
        }
        MicroDevice::Net { tap } => {
            let name = format!("{vm_name}-net{i}");
            let taps = Tap::open_named(tap, 1)?;
            (name.clone(), Box::new(Net::new(&name, taps, Mac::random())))
        }
        MicroDevice::Vsock { cid, socket } => {
            let name = format!("{vm_name}-vsock{i}");
            let dev = Vsock::new(&name, *cid, socket)?;
            (name.clone(), Box::new(dev))
        }
    };
    // A vector per queue and one for configuration changes.
    let count = device.queue_max_sizes().len() as u16 + 1;
    let msi = Arc::new(MicroMsi {
        count,
        dest: Mutex::new(vec![None; count.into()]),
        waker: waker.clone(),
    });
    let notify = Arc::new(KvmNotify(vm.clone()));
    let mut pci =
        VirtioPci::new(&name, device, base as u32, msi, notify, mem.clone())?.with_io_cpus(io_cpus);
    enable_msix(&mut pci);
    Ok(DeviceSlot {
        base,
        pci: Mutex::new(Some(pci)),
    })
}

/// Turns MSI-X on in the device's capability, as firmware would.
fn enable_msix(pci: &mut VirtioPci) {
    const MSIX_CAP_ID: u8 = 0x11;
    const ENABLE_HI: u8 = 0x80; // bit 15 of the message control word
    let mut off = pci.config().bytes(0x34, 1)[0] as usize;
    // A capability list is short; the bound keeps a broken one finite.
    for _ in 0..48 {
        if off == 0 {
            return;
        }
        let cap = pci.config().bytes(off, 2);
        if cap[0] == MSIX_CAP_ID {
            pci.write_config(off + 3, &[ENABLE_HI]);
            return;
        }
        off = cap[1] as usize;
    }
}
