//! Everything a Linux guest reaches through port I/O and MMIO exits, behind
//! one [`PortIo`]: the legacy devices ([`legacy`]) and the PCI segments
//! with their virtio devices (`vmm_devices`), wired to KVM by [`kvm`].
//!
//! # Guest physical layout of PCI
//!
//! ```text
//! 0xc000_0000 ─ 0xe000_0000  BAR windows: 512 MiB split equally per segment
//! 0xe000_0000 ─ +1 MiB each  ECAM of segment 0, 1, ... (bus 0 only)
//! ```
//!
//! Segment `s` belongs to guest NUMA node `s % nodes` unless told
//! otherwise; the DSDT gives its host bridge that `_PXM` (see
//! [`crate::acpi`]).

use std::sync::Arc;

use tracing::{info, trace};
use vmm_devices::pci::PciRoot;
use vmm_devices::virtio::console::ConsoleOut;
use vmm_devices::virtio::fs::BackendHealth;

use crate::layout::{CPU_HOTPLUG_PORT, CPU_HOTPLUG_PORTS, PCI_HOTPLUG_PORT, PCI_HOTPLUG_PORTS};
use crate::vcpu::{IoAction, PortIo};

mod build;
pub mod cpu_hotplug;
pub mod kvm;
pub mod legacy;
pub mod pci_hotplug;
mod socket_specs;
mod spec;

pub use build::{io_cpus, BuiltPci, PciBuilder};
pub use cpu_hotplug::{CpuHotplug, HotplugError};
pub use kvm::{GsiRoutes, KvmMsi, KvmNotify, MsiWake, MsiWakeSlot};
pub use legacy::{EventFdTrigger, LegacyDevices, ResetLine, SerialPort};
pub use pci_hotplug::PciHotplug;
pub use socket_specs::{FsSpec, VsockSpec};
pub use spec::{
    Backends, DeviceSpec, DiskSpec, NetSpec, SharedFds, TapSource, MAX_DISK_QUEUES, MAX_NET_PAIRS,
    MAX_PCI_SEGMENTS,
};
pub use vmm_devices::virtio::block::QUEUE_SIZE as DISK_QUEUE_SIZE;
pub use vmm_devices::virtio::block_engine::{EngineKind as BlockEngine, UnknownEngine};
pub use vmm_devices::virtio::fs::MAX_QUEUE_SIZE as FS_QUEUE_SIZE;
pub use vmm_devices::virtio::net::{Mac, QUEUE_SIZE as NET_QUEUE_SIZE};
pub use vmm_devices::virtio::vsock::MIN_GUEST_CID as MIN_VSOCK_CID;
pub use vmm_devices::DeviceError;

/// The guest's devices (see the module docs).
pub struct Devices {
    legacy: LegacyDevices,
    pci: PciRoot,
    console: Option<ConsoleOut>,
    health: std::sync::Mutex<Vec<(String, BackendHealth)>>,
    cpu_hotplug: Option<Arc<CpuHotplug>>,
    pci_hotplug: Option<Arc<PciHotplug>>,
    builder: PciBuilder,
}

/// Where a function sits on the guest's PCI buses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Its segment.
    pub segment: u16,
    /// Its slot on bus 0.
    pub slot: usize,
    /// The name it was built with (`virtio-blk0`, ...).
    pub name: String,
}

impl PciFunction {
    /// Its address as Cloud Hypervisor's API writes it (`PciDeviceInfo`'s
    /// `bdf`): `ssss:00:dd.0`.
    pub fn bdf(&self) -> String {
        bdf(self.segment, self.slot)
    }
}

/// A PCI address as Cloud Hypervisor's API writes it: `ssss:00:dd.0`.
pub fn bdf(segment: u16, slot: usize) -> String {
    format!("{segment:04x}:00:{slot:02x}.0")
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Devices").field("pci", &self.pci).finish()
    }
}

impl Devices {
    /// The legacy devices and the PCI devices.
    pub fn new(legacy: LegacyDevices, pci: BuiltPci) -> Self {
        Self {
            legacy,
            pci: pci.root,
            console: pci.console,
            health: std::sync::Mutex::new(pci.health),
            cpu_hotplug: None,
            pci_hotplug: None,
            builder: pci.builder,
        }
    }

    /// Adds the ACPI PCI hotplug controller's ports.
    pub fn with_pci_hotplug(mut self, hp: Arc<PciHotplug>) -> Self {
        self.pci_hotplug = Some(hp);
        self
    }

    /// PCI hotplug: puts `device` in a free slot of `segment` and tells
    /// the guest. The guest's driver binds it once the guest has scanned
    /// the slot.
    pub fn hot_add(
        &self,
        segment: u16,
        name: &str,
        device: Box<dyn vmm_devices::virtio::VirtioDevice>,
    ) -> Result<PciFunction, DeviceError> {
        let hp = self.pci_hotplug.as_ref().ok_or_else(|| {
            DeviceError::Hotplug("this VM was built without its PCI hotplug controller".into())
        })?;
        let slot = self.builder.hot_add(&self.pci, segment, name, device)?;
        hp.announce_added(segment, slot);
        info!(device = name, segment, slot, "PCI hotplug: device added");
        Ok(PciFunction {
            segment,
            slot,
            name: name.into(),
        })
    }

    /// PCI hotplug: disk `d` (its image opened as `disk`) as a virtio-blk
    /// device called `name`, for a guest of `vcpus` vCPUs.
    pub fn hot_add_disk(
        &self,
        name: &str,
        d: &DiskSpec,
        disk: vmm_devices::virtio::block::Disk,
        vcpus: usize,
    ) -> Result<PciFunction, DeviceError> {
        let dev = build::block_device(name, d, disk, vcpus);
        self.hot_add(d.pci_segment, name, Box::new(dev))
    }

    /// PCI hotplug: net `n` over its opened `taps` as a virtio-net device
    /// called `name`.
    pub fn hot_add_net(
        &self,
        name: &str,
        n: &NetSpec,
        taps: Vec<vmm_devices::tap::Tap>,
    ) -> Result<PciFunction, DeviceError> {
        let dev = build::net_device(name, n, taps);
        self.hot_add(n.pci_segment, name, Box::new(dev))
    }

    /// PCI hotplug: a virtio-fs device called `name` on a vhost-user
    /// backend `f` connects to now. Guest RAM must be shared (memfds,
    /// `memory.shared`): the backend maps it.
    pub fn hot_add_fs(&self, name: &str, f: &FsSpec) -> Result<PciFunction, DeviceError> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        let shared = self.builder.mem.iter().all(|r| r.file_offset().is_some());
        if !shared {
            return Err(DeviceError::Hotplug(
                "guest RAM is private: virtiofsd cannot map it; create the VM with \
                 memory.shared: true (or an fs) to add one later"
                    .into(),
            ));
        }
        let dev = f
            .open(name)
            .map_err(|e| DeviceError::Backend(e.to_string()))?;
        let health = dev.health();
        let at = self.hot_add(f.pci_segment, name, Box::new(dev))?;
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), health));
        Ok(at)
    }

    /// PCI hotplug: the virtio-vsock device of `v`, called `name`; its
    /// socket is made now.
    pub fn hot_add_vsock(&self, name: &str, v: &VsockSpec) -> Result<PciFunction, DeviceError> {
        let dev = vmm_devices::virtio::vsock::Vsock::new(name, v.cid, &v.socket)
            .map_err(|e| DeviceError::Hotplug(e.to_string()))?;
        self.hot_add(v.pci_segment, name, Box::new(dev))
    }

    /// PCI hotplug: asks the guest to give back the function at
    /// `segment`/`slot`; it leaves the bus when the guest ejects it.
    pub fn request_removal(&self, segment: u16, slot: usize) -> Result<(), DeviceError> {
        let hp = self.pci_hotplug.as_ref().ok_or_else(|| {
            DeviceError::Hotplug("this VM was built without its PCI hotplug controller".into())
        })?;
        if slot == 0
            || !self
                .pci_functions()
                .iter()
                .any(|f| (f.segment, f.slot) == (segment, slot))
        {
            return Err(DeviceError::Hotplug(format!(
                "no device at {}",
                bdf(segment, slot)
            )));
        }
        hp.request_removal(segment, slot);
        info!(segment, slot, "PCI hotplug: removal asked of the guest");
        Ok(())
    }

    /// Every function on the guest's PCI buses but the host bridges.
    pub fn pci_functions(&self) -> Vec<PciFunction> {
        self.pci
            .segments()
            .iter()
            .flat_map(|s| {
                let segment = s.layout().id;
                s.devices()
                    .into_iter()
                    .filter(|(slot, _, _)| *slot > 0)
                    .map(move |(slot, name, _)| PciFunction {
                        segment,
                        slot,
                        name,
                    })
            })
            .collect()
    }

    /// The guest ejected these slots: they leave the bus, and their
    /// devices stop.
    fn eject(&self, slots: Vec<(u16, usize)>) {
        for (segment, slot) in slots {
            let Some(seg) = self.pci.segments().get(usize::from(segment)) else {
                continue;
            };
            let name = seg
                .devices()
                .into_iter()
                .find(|(s, _, _)| *s == slot)
                .map(|(_, n, _)| n);
            match seg.remove(slot) {
                Some(dev) => {
                    drop(dev);
                    if let Some(n) = name {
                        self.health
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .retain(|(h, _)| *h != n);
                    }
                    info!(segment, slot, "PCI hotplug: the guest ejected the device");
                }
                None => info!(
                    segment,
                    slot, "PCI hotplug: the guest ejected an empty slot"
                ),
            }
        }
    }

    fn pci_hotplug_port(&self, port: u16) -> Option<(&PciHotplug, u16)> {
        let hp = self.pci_hotplug.as_deref()?;
        let off = port.checked_sub(PCI_HOTPLUG_PORT)?;
        (off < PCI_HOTPLUG_PORTS).then_some((hp, off))
    }

    /// The devices whose backend failed (a vhost-user backend that
    /// exited): each one's name and why.
    pub fn backend_failures(&self) -> Vec<(String, String)> {
        self.backend_health()
            .iter()
            .filter_map(|(n, h)| h.failure().map(|w| (n.clone(), w)))
            .collect()
    }

    /// Handles on the health of every device with an external backend.
    pub fn backend_health(&self) -> Vec<(String, BackendHealth)> {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Adds the ACPI CPU hotplug controller's ports.
    pub fn with_cpu_hotplug(mut self, hp: Arc<CpuHotplug>) -> Self {
        self.cpu_hotplug = Some(hp);
        self
    }

    /// The CPU hotplug controller, if the VM has one.
    pub fn cpu_hotplug(&self) -> Option<&Arc<CpuHotplug>> {
        self.cpu_hotplug.as_ref()
    }

    fn hotplug_port(&self, port: u16) -> Option<(&CpuHotplug, u16)> {
        let hp = self.cpu_hotplug.as_deref()?;
        let off = port.checked_sub(CPU_HOTPLUG_PORT)?;
        (off < CPU_HOTPLUG_PORTS).then_some((hp, off))
    }

    /// Flushes the consoles (at VM stop).
    pub fn flush_console(&self) {
        self.legacy.flush_console();
        if let Some(c) = &self.console {
            if let Err(e) = c.lock().unwrap_or_else(|e| e.into_inner()).flush() {
                tracing::warn!("flushing the virtio console failed: {e}");
            }
        }
    }

    /// The PCI segments.
    pub fn pci(&self) -> &PciRoot {
        &self.pci
    }
}

impl PortIo for Devices {
    fn pio_read(&self, vcpu: usize, port: u16, data: &mut [u8]) {
        if PciRoot::owns_port(port, data.len()) {
            self.pci.pio_read(port, data);
        } else if let Some((hp, off)) = self.hotplug_port(port) {
            hp.read(off, data);
        } else if let Some((hp, off)) = self.pci_hotplug_port(port) {
            hp.read(off, data);
        } else {
            self.legacy.pio_read(vcpu, port, data);
        }
    }

    fn pio_write(&self, vcpu: usize, port: u16, data: &[u8]) -> IoAction {
        if PciRoot::owns_port(port, data.len()) {
            self.pci.pio_write(port, data);
            IoAction::Continue
        } else if let Some((hp, off)) = self.hotplug_port(port) {
            hp.write(off, data);
            IoAction::Continue
        } else if let Some((hp, off)) = self.pci_hotplug_port(port) {
            self.eject(hp.write(off, data));
            IoAction::Continue
        } else {
            self.legacy.pio_write(vcpu, port, data)
        }
    }

    fn mmio_read(&self, _vcpu: usize, addr: u64, data: &mut [u8]) {
        if !self.pci.mmio_read(addr, data) {
            trace!(addr = format_args!("{addr:#x}"), "read of unmapped MMIO");
            data.fill(0xff);
        }
    }

    fn mmio_write(&self, _vcpu: usize, addr: u64, data: &[u8]) -> IoAction {
        if !self.pci.mmio_write(addr, data) {
            trace!(addr = format_args!("{addr:#x}"), "write to unmapped MMIO");
        }
        IoAction::Continue
    }
}

#[cfg(test)]
mod tests;
