//! PCI, the way Linux and Cloud Hypervisor's guests expect it.
//!
//! * A [`PciSegment`] is one PCI domain with one bus (bus 0) of 32 device
//!   slots. Slot 0 is its host bridge. Its config space is reached through
//!   its ECAM window (1 MiB: bus 0 only, as the ACPI MCFG says); segment 0
//!   is also reached through ports 0xCF8/0xCFC, which Linux uses before it
//!   has read the MCFG.
//! * Each segment has its own 32-bit MMIO window for BARs, allocated with
//!   rust-vmm's `vm-allocator`, and may belong to a guest NUMA node (the
//!   DSDT gives its host bridge that node's `_PXM`, as Cloud Hypervisor's
//!   `pci_segment` does).
//! * [`PciRoot`] is every segment plus the 0xCF8 address latch: what the
//!   vCPU exit handler asks for port and MMIO accesses it does not own.
//!
//! Functions are single-function type-0 devices implementing
//! [`PciDevice`]; they interrupt through MSI-X only.

use std::sync::{Arc, Mutex, RwLock};

use tracing::trace;
use vm_allocator::{AddressAllocator, AllocPolicy};

use crate::DeviceError;

pub mod config;
pub mod msix;

pub use config::{ConfigChange, PciConfig, PciIds};

/// Config address port.
pub const CONFIG_ADDRESS_PORT: u16 = 0xcf8;
/// Config data ports (0xCFC-0xCFF).
pub const CONFIG_DATA_PORT: u16 = 0xcfc;
/// Device slots on a bus.
pub const SLOTS: usize = 32;
/// Bytes of ECAM per segment: bus 0 only (32 devices x 8 functions x 4 KiB).
pub const ECAM_SEGMENT_SIZE: u64 = 1 << 20;

/// A PCI function on a segment.
pub trait PciDevice: Send {
    /// Its configuration space.
    fn config(&self) -> &PciConfig;
    /// A guest write to config space at byte `offset`; the device applies
    /// it and acts on what changed (MSI-X control, BAR moves).
    fn write_config(&mut self, offset: usize, data: &[u8]) -> ConfigChange;
    /// A guest read of config register `reg` (a dword index); a device
    /// with a window into its BARs in config space answers it here.
    fn read_config(&mut self, reg: usize) -> u32 {
        self.config().read(reg)
    }
    /// A guest read of BAR `bar` at `offset`.
    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// A guest write to BAR `bar` at `offset`.
    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]);
}

/// The host bridge in slot 0 of every segment: a header and nothing else.
#[derive(Debug)]
pub struct HostBridge(PciConfig);

impl HostBridge {
    /// A host bridge (class 06/00). The IDs are those Cloud Hypervisor's
    /// bridge shows; Linux reads only the class.
    pub fn new() -> Self {
        Self(PciConfig::new(PciIds {
            vendor: 0x8086,
            device: 0x0d57,
            revision: 0,
            class: 0x06_00_00,
            subsystem_vendor: 0,
            subsystem: 0,
        }))
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciDevice for HostBridge {
    fn config(&self) -> &PciConfig {
        &self.0
    }
    fn write_config(&mut self, offset: usize, data: &[u8]) -> ConfigChange {
        self.0.write(offset, data)
    }
    fn read_bar(&mut self, _: usize, _: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write_bar(&mut self, _: usize, _: u64, _: &[u8]) {}
}

/// A shared function.
pub type SharedDevice = Arc<Mutex<dyn PciDevice>>;

#[derive(Clone, Copy, Debug)]
struct BarMapping {
    start: u64,
    end: u64,
    slot: usize,
    bar: usize,
}

/// Where a segment sits in guest physical address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLayout {
    /// The segment number (`_SEG`).
    pub id: u16,
    /// Its ECAM window.
    pub ecam: u64,
    /// Its 32-bit BAR window: start and size.
    pub mmio: (u64, u64),
    /// The guest NUMA node its host bridge belongs to (`_PXM`).
    pub node: Option<u32>,
}

/// What occupies a slot: the function, its name (for logs and the API's
/// device list) and the BAR space the VMM allocated for it (freed when
/// the function leaves; the guest may have moved the BAR since).
#[derive(Clone)]
struct Occupant {
    dev: SharedDevice,
    name: String,
    allocated: Option<(u64, u64)>,
}

/// One PCI segment (see the module docs). Functions come and go while the
/// guest runs (PCI hotplug), so the slots are behind a lock that every
/// config or BAR access takes for reading.
pub struct PciSegment {
    layout: SegmentLayout,
    slots: RwLock<Vec<Option<Occupant>>>,
    mmio: Mutex<AddressAllocator>,
    bars: RwLock<Vec<BarMapping>>,
}

impl std::fmt::Debug for PciSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciSegment")
            .field("layout", &self.layout)
            .field("devices", &self.devices().len())
            .finish()
    }
}

fn lock(d: &SharedDevice) -> std::sync::MutexGuard<'_, dyn PciDevice + 'static> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

impl PciSegment {
    /// An empty segment at `layout`, with its host bridge in slot 0.
    pub fn new(layout: SegmentLayout) -> Result<Self, DeviceError> {
        let mmio = AddressAllocator::new(layout.mmio.0, layout.mmio.1)
            .map_err(|e| DeviceError::Full(format!("PCI segment {}: {e}", layout.id)))?;
        let mut slots = vec![None; SLOTS];
        slots[0] = Some(Occupant {
            dev: Arc::new(Mutex::new(HostBridge::new())) as SharedDevice,
            name: "host bridge".into(),
            allocated: None,
        });
        Ok(Self {
            layout,
            slots: RwLock::new(slots),
            mmio: Mutex::new(mmio),
            bars: RwLock::new(Vec::new()),
        })
    }

    /// Where the segment sits.
    pub fn layout(&self) -> SegmentLayout {
        self.layout
    }

    fn slots(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Occupant>>> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `size` bytes (a power of two) of BAR space, aligned to
    /// its size.
    pub fn allocate_bar(&self, size: u64) -> Result<u32, DeviceError> {
        let r = self
            .mmio
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allocate(size, size.max(4096), AllocPolicy::FirstMatch)
            .map_err(|e| {
                DeviceError::Full(format!(
                    "PCI segment {}: no room for a {size:#x}-byte BAR in its {:#x}-byte window ({e})",
                    self.layout.id, self.layout.mmio.1
                ))
            })?;
        u32::try_from(r.start()).map_err(|_| DeviceError::Full("a 32-bit BAR above 4 GiB".into()))
    }

    /// Gives back BAR space from [`allocate_bar`](Self::allocate_bar).
    pub fn free_bar(&self, (start, size): (u64, u64)) {
        if let Ok(r) = vm_allocator::RangeInclusive::new(start, start + size - 1) {
            let _ = self.mmio.lock().unwrap_or_else(|e| e.into_inner()).free(&r);
        }
    }

    /// The first free slot.
    pub fn free_slot(&self) -> Result<usize, DeviceError> {
        self.slots()
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| {
                DeviceError::Full(format!(
                    "PCI segment {} has no free slot (32 per segment, slot 0 the host bridge); \
                 put the device on another segment",
                    self.layout.id
                ))
            })
    }

    /// Puts `dev`, called `name`, in `slot` (from
    /// [`free_slot`](Self::free_slot)), with the BAR space allocated for
    /// it (`(start, size)`, freed when it leaves). A slot that was taken
    /// meanwhile is refused.
    pub fn insert(
        &self,
        slot: usize,
        name: &str,
        dev: SharedDevice,
        allocated: Option<(u64, u64)>,
    ) -> Result<(), DeviceError> {
        {
            let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
            match slots.get_mut(slot) {
                Some(s @ None) => {
                    *s = Some(Occupant {
                        dev,
                        name: name.into(),
                        allocated,
                    })
                }
                _ => {
                    drop(slots);
                    if let Some(a) = allocated {
                        self.free_bar(a);
                    }
                    return Err(DeviceError::Full(format!(
                        "PCI segment {} slot {slot} is taken; try again",
                        self.layout.id
                    )));
                }
            }
        }
        self.remap();
        Ok(())
    }

    /// Takes the function out of `slot` (slot 0, the host bridge, stays)
    /// and frees its BAR space; returns it, or `None` if the slot was
    /// empty. Its accesses stop at once; dropping the last handle resets
    /// it (a virtio device stops its threads).
    pub fn remove(&self, slot: usize) -> Option<SharedDevice> {
        if slot == 0 {
            return None;
        }
        let gone = self
            .slots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(slot)?
            .take()?;
        self.remap();
        if let Some(a) = gone.allocated {
            self.free_bar(a);
        }
        Some(gone.dev)
    }

    /// The functions, by slot: (slot, name, function).
    pub fn devices(&self) -> Vec<(usize, String, SharedDevice)> {
        self.slots()
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.as_ref().map(|o| (i, o.name.clone(), o.dev.clone())))
            .collect()
    }

    fn device(&self, slot: usize) -> Option<SharedDevice> {
        self.slots().get(slot)?.as_ref().map(|o| o.dev.clone())
    }

    fn remap(&self) {
        let mut map = Vec::new();
        for (slot, _, d) in self.devices() {
            let d = lock(&d);
            for bar in 0..config::NUM_BARS {
                if let Some((start, size)) = d.config().bar(bar) {
                    map.push(BarMapping {
                        start,
                        end: start + size,
                        slot,
                        bar,
                    });
                }
            }
        }
        *self.bars.write().unwrap_or_else(|e| e.into_inner()) = map;
    }

    /// Reads config register `reg` of bus 0, `slot`, function `func`.
    /// An empty slot or function reads as all ones.
    pub fn read_config(&self, slot: usize, func: usize, reg: usize) -> u32 {
        match (func, self.device(slot)) {
            (0, Some(d)) => lock(&d).read_config(reg),
            _ => u32::MAX,
        }
    }

    /// Writes config space of bus 0, `slot`, function `func`, at byte
    /// `offset`.
    pub fn write_config(&self, slot: usize, func: usize, offset: usize, data: &[u8]) {
        let (0, Some(d)) = (func, self.device(slot)) else {
            return;
        };
        let change = lock(&d).write_config(offset, data);
        if change.mapping {
            self.remap();
        }
    }

    fn ecam_decode(&self, addr: u64) -> Option<(usize, usize, usize, usize)> {
        let off = addr.checked_sub(self.layout.ecam)?;
        (off < ECAM_SEGMENT_SIZE).then_some((
            ((off >> 15) & 0x1f) as usize,
            ((off >> 12) & 0x7) as usize,
            (off & 0xfff) as usize,
            0,
        ))
    }

    fn bar_at(&self, addr: u64) -> Option<(BarMapping, SharedDevice)> {
        let map = self.bars.read().unwrap_or_else(|e| e.into_inner());
        let m = *map.iter().find(|m| (m.start..m.end).contains(&addr))?;
        Some((m, self.device(m.slot)?))
    }

    /// A guest MMIO read: ECAM or a BAR of this segment. `false` if the
    /// address is neither.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        if let Some((slot, func, off, _)) = self.ecam_decode(addr) {
            let v = self.read_config(slot, func, off / 4);
            for (i, b) in data.iter_mut().enumerate() {
                *b = (v >> (8 * ((off % 4 + i) % 4))) as u8;
            }
            return true;
        }
        match self.bar_at(addr) {
            Some((m, d)) => {
                lock(&d).read_bar(m.bar, addr - m.start, data);
                true
            }
            None => false,
        }
    }

    /// A guest MMIO write: ECAM or a BAR of this segment. `false` if the
    /// address is neither.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool {
        if let Some((slot, func, off, _)) = self.ecam_decode(addr) {
            self.write_config(slot, func, off, data);
            return true;
        }
        match self.bar_at(addr) {
            Some((m, d)) => {
                lock(&d).write_bar(m.bar, addr - m.start, data);
                true
            }
            None => false,
        }
    }
}

/// Every segment, and the 0xCF8 latch of segment 0.
#[derive(Debug)]
pub struct PciRoot {
    segments: Vec<PciSegment>,
    config_address: Mutex<u32>,
}

impl PciRoot {
    /// The root over `segments` (segment 0 first).
    pub fn new(segments: Vec<PciSegment>) -> Self {
        Self {
            segments,
            config_address: Mutex::new(0),
        }
    }

    /// The segments.
    pub fn segments(&self) -> &[PciSegment] {
        &self.segments
    }

    /// Whether an access of `len` bytes at `port` is a config access:
    /// 0xCF8 as a dword (a byte at 0xCF9 is the reset control register,
    /// not PCI's), or the data ports 0xCFC-0xCFF.
    pub fn owns_port(port: u16, len: usize) -> bool {
        (port == CONFIG_ADDRESS_PORT && len == 4)
            || (CONFIG_DATA_PORT..CONFIG_DATA_PORT + 4).contains(&port)
    }

    /// Reads a config port.
    pub fn pio_read(&self, port: u16, data: &mut [u8]) {
        let addr = *self
            .config_address
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let v = match port {
            CONFIG_ADDRESS_PORT if data.len() == 4 => addr,
            p if p >= CONFIG_DATA_PORT && addr & (1 << 31) != 0 => {
                let off = usize::from(p - CONFIG_DATA_PORT);
                self.cf8_target(addr)
                    .map_or(u32::MAX, |(seg, slot, func, reg)| {
                        seg.read_config(slot, func, reg)
                    })
                    >> (8 * off)
            }
            _ => u32::MAX,
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = (v >> (8 * i)) as u8;
        }
    }

    /// Writes a config port.
    pub fn pio_write(&self, port: u16, data: &[u8]) {
        let mut latch = self
            .config_address
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match port {
            CONFIG_ADDRESS_PORT if data.len() == 4 => {
                *latch = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            }
            p if p >= CONFIG_DATA_PORT && *latch & (1 << 31) != 0 => {
                let addr = *latch;
                drop(latch);
                if let Some((seg, slot, func, reg)) = self.cf8_target(addr) {
                    let off = reg * 4 + usize::from(p - CONFIG_DATA_PORT);
                    seg.write_config(slot, func, off, data);
                }
            }
            _ => trace!(port, "PCI config port write ignored"),
        }
    }

    /// Segment 0, bus 0 only: (segment, slot, function, register).
    fn cf8_target(&self, addr: u32) -> Option<(&PciSegment, usize, usize, usize)> {
        let bus = (addr >> 16) & 0xff;
        let seg = self.segments.first()?;
        (bus == 0).then_some((
            seg,
            ((addr >> 11) & 0x1f) as usize,
            ((addr >> 8) & 0x7) as usize,
            ((addr >> 2) & 0x3f) as usize,
        ))
    }

    /// A guest MMIO read; `false` if no segment owns `addr`.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        self.segments.iter().any(|s| s.mmio_read(addr, data))
    }

    /// A guest MMIO write; `false` if no segment owns `addr`.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool {
        self.segments.iter().any(|s| s.mmio_write(addr, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dummy(PciConfig, Vec<(usize, u64, Vec<u8>)>);
    impl PciDevice for Dummy {
        fn config(&self) -> &PciConfig {
            &self.0
        }
        fn write_config(&mut self, offset: usize, data: &[u8]) -> ConfigChange {
            self.0.write(offset, data)
        }
        fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill(bar as u8 + offset as u8);
        }
        fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.1.push((bar, offset, data.to_vec()));
        }
    }

    fn segment() -> (PciSegment, Arc<Mutex<Dummy>>) {
        let s = PciSegment::new(SegmentLayout {
            id: 0,
            ecam: 0xe000_0000,
            mmio: (0xc000_0000, 0x100_0000),
            node: None,
        })
        .unwrap();
        let mut c = PciConfig::new(PciIds {
            vendor: 0x1af4,
            device: 0x1044,
            revision: 1,
            class: 0xff00,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        });
        let addr = s.allocate_bar(0x1_0000).unwrap();
        assert_eq!(addr, 0xc000_0000);
        c.set_bar(0, addr, 0x1_0000);
        let d = Arc::new(Mutex::new(Dummy(c, Vec::new())));
        let slot = s.free_slot().unwrap();
        assert_eq!(slot, 1, "slot 0 is the host bridge");
        s.insert(slot, "dummy", d.clone(), Some((0xc000_0000, 0x1_0000)))
            .unwrap();
        (s, d)
    }

    #[test]
    fn the_reset_port_is_not_pci() {
        assert!(PciRoot::owns_port(0xcf8, 4));
        assert!(!PciRoot::owns_port(0xcf9, 1), "0xCF9 is reset control");
        assert!(!PciRoot::owns_port(0xcf8, 1));
        assert!(PciRoot::owns_port(0xcfe, 2));
        assert!(!PciRoot::owns_port(0xd00, 1));
    }

    #[test]
    fn cf8_and_ecam_reach_the_same_registers() {
        let (s, _) = segment();
        let root = PciRoot::new(vec![s]);
        let mut b = [0u8; 4];
        // Slot 1, register 0, through 0xCF8.
        root.pio_write(
            CONFIG_ADDRESS_PORT,
            &(0x8000_0000u32 | 1 << 11).to_le_bytes(),
        );
        root.pio_read(CONFIG_DATA_PORT, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x1044_1af4);
        // The device ID alone, a 2-byte read at 0xCFE.
        let mut w = [0u8; 2];
        root.pio_read(CONFIG_DATA_PORT + 2, &mut w);
        assert_eq!(u16::from_le_bytes(w), 0x1044);
        // The same through ECAM.
        assert!(root.mmio_read(0xe000_0000 + (1 << 15), &mut b));
        assert_eq!(u32::from_le_bytes(b), 0x1044_1af4);
        // The host bridge's class, and an empty slot.
        assert!(root.mmio_read(0xe000_0008, &mut b));
        assert_eq!(u32::from_le_bytes(b) >> 8, 0x06_00_00);
        assert!(root.mmio_read(0xe000_0000 + (5 << 15), &mut b));
        assert_eq!(b, [0xff; 4]);
        // Another bus, or the latch off, reads all ones.
        root.pio_write(CONFIG_ADDRESS_PORT, &(0x8001_0000u32).to_le_bytes());
        root.pio_read(CONFIG_DATA_PORT, &mut b);
        assert_eq!(b, [0xff; 4]);
    }

    #[test]
    fn bars_decode_only_when_memory_is_on_and_follow_moves() {
        let (s, d) = segment();
        let mut b = [0u8; 4];
        assert!(!s.mmio_read(0xc000_0010, &mut b), "decoding off");
        // Command: memory on, through ECAM.
        s.mmio_write(0xe000_0000 + (1 << 15) + 4, &[2, 0]);
        assert!(s.mmio_read(0xc000_0010, &mut b));
        assert_eq!(b, [0x10; 4]);
        // The guest moves the BAR.
        s.mmio_write(
            0xe000_0000 + (1 << 15) + 0x10,
            &0xc010_0000u32.to_le_bytes(),
        );
        assert!(!s.mmio_read(0xc000_0010, &mut b));
        assert!(s.mmio_write(0xc010_0004, &[7]));
        assert_eq!(d.lock().unwrap().1, vec![(0, 4, vec![7])]);
        assert!(!s.mmio_read(0xd000_0000, &mut b), "outside every BAR");
    }

    #[test]
    fn a_removed_function_is_gone_and_its_slot_and_bar_come_back() {
        let (s, d) = segment();
        s.mmio_write(0xe000_0000 + (1 << 15) + 4, &[2, 0]);
        let mut b = [0u8; 4];
        assert!(s.mmio_read(0xc000_0010, &mut b));
        assert_eq!(s.devices().len(), 2);
        assert!(s.remove(0).is_none(), "the host bridge stays");
        let gone = s.remove(1).expect("slot 1 held the dummy");
        assert!(Arc::ptr_eq(&gone, &(d.clone() as SharedDevice)));
        assert!(s.remove(1).is_none(), "already empty");
        // Its BAR no longer decodes, its config space reads all ones.
        assert!(!s.mmio_read(0xc000_0010, &mut b));
        assert!(s.mmio_read(0xe000_0000 + (1 << 15), &mut b));
        assert_eq!(b, [0xff; 4]);
        // The slot and the BAR space are free again.
        assert_eq!(s.free_slot().unwrap(), 1);
        assert_eq!(s.allocate_bar(0x1_0000).unwrap(), 0xc000_0000);
        // A taken slot is refused.
        let e = s
            .insert(0, "x", Arc::new(Mutex::new(HostBridge::new())), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("slot 0 is taken"), "{e}");
    }

    #[test]
    fn a_full_segment_names_the_fix() {
        let s = PciSegment::new(SegmentLayout {
            id: 2,
            ecam: 0xe020_0000,
            mmio: (0xc000_0000, 0x2_0000),
            node: Some(1),
        })
        .unwrap();
        s.allocate_bar(0x1_0000).unwrap();
        s.allocate_bar(0x1_0000).unwrap();
        let e = s.allocate_bar(0x1_0000).unwrap_err().to_string();
        assert!(e.contains("segment 2"), "{e}");
        for slot in 1..SLOTS {
            s.insert(
                slot,
                "bridge",
                Arc::new(Mutex::new(HostBridge::new())),
                None,
            )
            .unwrap();
        }
        let e = s.free_slot().unwrap_err().to_string();
        assert!(e.contains("another segment"), "{e}");
    }
}
