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

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use tracing::{info, trace};
use vm_memory::GuestMemoryMmap;
use vmm_devices::pci::{PciRoot, PciSegment, SegmentLayout, ECAM_SEGMENT_SIZE};
use vmm_devices::virtio::rng::Rng;
use vmm_devices::virtio::transport::BAR_SIZE;
use vmm_devices::virtio::{VirtioDevice, VirtioPci};

use crate::layout::{MMIO_HOLE_START, PCI_ECAM_START};
use crate::vcpu::{IoAction, PortIo};

pub mod kvm;
pub mod legacy;

pub use kvm::{GsiRoutes, KvmMsi, KvmNotify, MsiWake, MsiWakeSlot};
pub use legacy::{EventFdTrigger, LegacyDevices, ResetLine, SerialPort};
pub use vmm_devices::DeviceError;

/// The most PCI segments a guest may have.
pub const MAX_PCI_SEGMENTS: u16 = 16;

/// The I/O devices a guest gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpec {
    /// PCI segments (at least 1, at most [`MAX_PCI_SEGMENTS`]).
    pub pci_segments: u16,
    /// A virtio-rng on this segment.
    pub rng: Option<u16>,
}

impl DeviceSpec {
    /// One segment and no devices.
    pub fn none() -> Self {
        Self {
            pci_segments: 1,
            rng: None,
        }
    }

    /// Refuses what cannot be built, naming the fix.
    pub fn check(&self) -> Result<(), String> {
        if self.pci_segments == 0 || self.pci_segments > MAX_PCI_SEGMENTS {
            return Err(format!(
                "num_pci_segments {} is out of range: give 1 to {MAX_PCI_SEGMENTS}",
                self.pci_segments
            ));
        }
        if let Some(s) = self.rng.filter(|&s| s >= self.pci_segments) {
            return Err(format!(
                "the rng's pci_segment={s} does not exist: the guest has {} segment(s) (0 to {}); \
                 raise num_pci_segments or pick a lower segment",
                self.pci_segments,
                self.pci_segments - 1
            ));
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

/// The guest's devices (see the module docs).
pub struct Devices {
    legacy: LegacyDevices,
    pci: PciRoot,
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Devices").field("pci", &self.pci).finish()
    }
}

/// What building the PCI devices needs from the VM.
pub struct PciBuilder {
    /// The VM.
    pub vm: Arc<VmFd>,
    /// Its GSI routes.
    pub routes: Arc<GsiRoutes>,
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// Called with an MSI's destination APIC ID after it is raised.
    pub wake: MsiWakeSlot,
}

impl PciBuilder {
    /// Puts `device` on `segment` behind the virtio PCI transport, with
    /// one MSI-X vector per queue and one for configuration changes.
    pub fn add_virtio(
        &self,
        segment: &mut PciSegment,
        name: &str,
        device: Box<dyn VirtioDevice>,
    ) -> Result<(), DeviceError> {
        let slot = segment.free_slot()?;
        let bar = segment.allocate_bar(u64::from(BAR_SIZE))?;
        let count = device.queue_max_sizes().len() as u16 + 1;
        let vectors = Arc::new(KvmMsi::new(self.routes.clone(), count, self.wake.clone())?);
        let notify = Arc::new(KvmNotify(self.vm.clone()));
        let dev = VirtioPci::new(name, device, bar, vectors, notify, self.mem.clone())?;
        info!(
            device = name,
            segment = segment.layout().id,
            slot,
            bar = format_args!("{bar:#x}"),
            node = ?segment.layout().node,
            "virtio device"
        );
        segment.insert(slot, Arc::new(Mutex::new(dev)));
        Ok(())
    }

    /// The segments of `spec` for a guest of `nodes` nodes, with its devices.
    pub fn build(&self, spec: &DeviceSpec, nodes: usize) -> Result<PciRoot, DeviceError> {
        let mut segments = spec
            .layouts(nodes)
            .into_iter()
            .map(PciSegment::new)
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(s) = spec.rng {
            self.add_virtio(
                &mut segments[usize::from(s)],
                "virtio-rng",
                Box::new(Rng::new()?),
            )?;
        }
        Ok(PciRoot::new(segments))
    }
}

impl Devices {
    /// The legacy devices and `pci`.
    pub fn new(legacy: LegacyDevices, pci: PciRoot) -> Self {
        Self { legacy, pci }
    }

    /// Flushes the console (at VM stop).
    pub fn flush_console(&self) {
        self.legacy.flush_console();
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
        } else {
            self.legacy.pio_read(vcpu, port, data);
        }
    }

    fn pio_write(&self, vcpu: usize, port: u16, data: &[u8]) -> IoAction {
        if PciRoot::owns_port(port, data.len()) {
            self.pci.pio_write(port, data);
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
mod tests {
    use super::*;

    #[test]
    fn layouts_split_the_hole_and_follow_nodes() {
        let spec = DeviceSpec {
            pci_segments: 3,
            rng: None,
        };
        let l = spec.layouts(2);
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].ecam, PCI_ECAM_START);
        assert_eq!(l[2].ecam, PCI_ECAM_START + 2 * ECAM_SEGMENT_SIZE);
        assert_eq!(l[0].mmio, (MMIO_HOLE_START, 128 << 20));
        assert_eq!(l[1].mmio.0, MMIO_HOLE_START + (128 << 20));
        assert!(l[2].mmio.0 + l[2].mmio.1 <= PCI_ECAM_START);
        assert_eq!(
            l.iter().map(|s| s.node).collect::<Vec<_>>(),
            [Some(0), Some(1), Some(0)]
        );
    }

    #[test]
    fn impossible_specs_name_the_fix() {
        let e = DeviceSpec {
            pci_segments: 2,
            rng: Some(2),
        }
        .check()
        .unwrap_err();
        assert!(
            e.contains("pci_segment=2") && e.contains("num_pci_segments"),
            "{e}"
        );
        let e = DeviceSpec {
            pci_segments: 0,
            rng: None,
        }
        .check()
        .unwrap_err();
        assert!(e.contains("1 to 16"), "{e}");
        DeviceSpec {
            pci_segments: 16,
            rng: Some(15),
        }
        .check()
        .unwrap();
    }
}
