//! A type-0 PCI configuration space: the header, 32-bit memory BARs and a
//! capability list, with a write mask per bit so that a guest can change
//! only what a real device lets it change.
//!
//! BAR sizing works the way the PCI specification has it: the BAR's
//! writable bits are its address bits above its size, so the guest's
//! write of all ones reads back as `!(size - 1)` and the guest learns the
//! size. Everything else (IDs, class, the capability pointer) is read-only.

/// Bytes of conventional config space; the extended space (to 4 KiB
/// through ECAM) reads as zeros: these devices have no PCI Express
/// capability, so the guest does not look there.
pub const CONFIG_SPACE_SIZE: usize = 256;
const REGS: usize = CONFIG_SPACE_SIZE / 4;
/// Number of BARs of a type-0 header.
pub const NUM_BARS: usize = 6;
const BAR0_REG: usize = 4;
const COMMAND_REG: usize = 1;
const CAP_PTR_REG: usize = 13;
const INTERRUPT_REG: usize = 15;
const FIRST_CAP: usize = 0x40;

/// Command register: memory space decoding.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: bus mastering (DMA, and MSI writes).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
const STATUS_CAP_LIST: u32 = 1 << 4;

/// What identifies a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciIds {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Revision.
    pub revision: u8,
    /// Class code, subclass and programming interface (24 bits).
    pub class: u32,
    /// Subsystem vendor ID.
    pub subsystem_vendor: u16,
    /// Subsystem ID.
    pub subsystem: u16,
}

/// What a config write changed, for the segment to act on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigChange {
    /// A BAR or the command register changed: the address map may have.
    pub mapping: bool,
    /// The write touched the capability at this byte offset.
    pub capability: Option<usize>,
}

/// A type-0 configuration space.
#[derive(Clone, Debug)]
pub struct PciConfig {
    regs: [u32; REGS],
    wmask: [u32; REGS],
    bar_sizes: [u64; NUM_BARS],
    /// Byte offsets of the capabilities, in list order.
    caps: Vec<(usize, usize)>,
    next_cap: usize,
}

impl PciConfig {
    /// A header with `ids`, no BARs, no capabilities and no INTx pin
    /// (these devices interrupt through MSI-X only).
    pub fn new(ids: PciIds) -> Self {
        let mut regs = [0u32; REGS];
        let mut wmask = [0u32; REGS];
        regs[0] = u32::from(ids.device) << 16 | u32::from(ids.vendor);
        regs[2] = ids.class << 8 | u32::from(ids.revision);
        regs[11] = u32::from(ids.subsystem) << 16 | u32::from(ids.subsystem_vendor);
        // Command: I/O, memory, bus master, INTx disable.
        wmask[COMMAND_REG] = 0x0000_0407;
        // Interrupt line: scratch for the OS; pin 0: no INTx.
        wmask[INTERRUPT_REG] = 0xff;
        Self {
            regs,
            wmask,
            bar_sizes: [0; NUM_BARS],
            caps: Vec::new(),
            next_cap: FIRST_CAP,
        }
    }

    /// Makes BAR `bar` a 32-bit non-prefetchable memory BAR of `size`
    /// bytes (a power of two, at least 16) at `addr` (aligned to `size`).
    pub fn set_bar(&mut self, bar: usize, addr: u32, size: u32) {
        debug_assert!(size.is_power_of_two() && size >= 16 && addr % size == 0);
        self.bar_sizes[bar] = u64::from(size);
        self.wmask[BAR0_REG + bar] = !(size - 1) & !0xf;
        self.regs[BAR0_REG + bar] = addr & !(size - 1);
    }

    /// Appends a capability with ID `id` whose bytes after the ID and
    /// next pointer are `body`; `writable` masks the body's bits the guest
    /// may change (same length as `body`). Returns its byte offset.
    ///
    /// # Panics
    /// If the capabilities no longer fit in the 256-byte space: a device
    /// is built with a fixed set, so this is a programming error.
    pub fn add_capability(&mut self, id: u8, body: &[u8], writable: &[u8]) -> usize {
        assert_eq!(body.len(), writable.len());
        let off = self.next_cap;
        let len = 2 + body.len();
        assert!(off + len <= CONFIG_SPACE_SIZE, "PCI capabilities overflow");
        self.put(off, id);
        self.put(off + 1, 0);
        for (i, (&b, &w)) in body.iter().zip(writable).enumerate() {
            self.put(off + 2 + i, b);
            self.wmask[(off + 2 + i) / 4] |= u32::from(w) << (8 * ((off + 2 + i) % 4));
        }
        match self.caps.last() {
            Some(&(prev, _)) => self.put(prev + 1, off as u8),
            None => {
                self.regs[CAP_PTR_REG] = off as u32;
                self.regs[COMMAND_REG] |= STATUS_CAP_LIST << 16;
            }
        }
        self.caps.push((off, len));
        self.next_cap = (off + len).next_multiple_of(4);
        off
    }

    fn put(&mut self, off: usize, b: u8) {
        let shift = 8 * (off % 4);
        let r = &mut self.regs[off / 4];
        *r = (*r & !(0xff << shift)) | (u32::from(b) << shift);
    }

    /// Register `reg` (dword index); beyond the header and capabilities,
    /// zero.
    pub fn read(&self, reg: usize) -> u32 {
        self.regs.get(reg).copied().unwrap_or(0)
    }

    /// Reads `data.len()` bytes at byte `offset` (one access: 1, 2 or 4
    /// bytes, not crossing a dword).
    pub fn read_bytes(&self, offset: usize, data: &mut [u8]) {
        let v = self.read(offset / 4);
        for (i, b) in data.iter_mut().enumerate() {
            *b = (v >> (8 * ((offset % 4 + i) % 4))) as u8;
        }
    }

    /// Writes `data` (1, 2 or 4 bytes) at byte `offset`, through the write
    /// mask. A write that crosses a dword, or beyond the space, is dropped
    /// (a guest cannot issue one on real hardware).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> ConfigChange {
        let reg = offset / 4;
        let shift = offset % 4;
        if reg >= REGS || data.is_empty() || shift + data.len() > 4 {
            return ConfigChange::default();
        }
        let mut value = 0u32;
        let mut bytes = 0u32;
        for (i, &b) in data.iter().enumerate() {
            value |= u32::from(b) << (8 * (shift + i));
            bytes |= 0xff << (8 * (shift + i));
        }
        let mask = self.wmask[reg] & bytes;
        self.regs[reg] = (self.regs[reg] & !mask) | (value & mask);
        ConfigChange {
            mapping: reg == COMMAND_REG || (BAR0_REG..BAR0_REG + NUM_BARS).contains(&reg),
            capability: self
                .caps
                .iter()
                .find(|&&(off, len)| offset < off + len && offset + data.len() > off)
                .map(|&(off, _)| off),
        }
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.regs[COMMAND_REG] as u16
    }

    /// BAR `bar`'s address and size while memory decoding is on, and the
    /// BAR is implemented and holds an address.
    pub fn bar(&self, bar: usize) -> Option<(u64, u64)> {
        let size = *self.bar_sizes.get(bar)?;
        if size == 0 || self.command() & COMMAND_MEMORY == 0 {
            return None;
        }
        let addr = u64::from(self.regs[BAR0_REG + bar] & !0xf);
        (addr != 0).then_some((addr, size))
    }

    /// BAR `bar`'s programmed address, whether or not decoding is on.
    pub fn bar_address(&self, bar: usize) -> u64 {
        u64::from(self.regs[BAR0_REG + bar] & !0xf)
    }

    /// The bytes of the capability at `off` (`len` bytes).
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        for (i, b) in out.iter_mut().enumerate() {
            let o = off + i;
            *b = (self.read(o / 4) >> (8 * (o % 4))) as u8;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> PciIds {
        PciIds {
            vendor: 0x1af4,
            device: 0x1044,
            revision: 1,
            class: 0x00ff00,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        }
    }

    #[test]
    fn header_is_read_only_but_for_command_and_line() {
        let mut c = PciConfig::new(ids());
        assert_eq!(c.read(0), 0x1044_1af4);
        c.write(0, &[0, 0, 0, 0]);
        assert_eq!(c.read(0), 0x1044_1af4);
        assert_eq!(c.read(2), 0x00ff_0001);
        c.write(4, &[0xff, 0xff]);
        assert_eq!(c.command(), 0x0407);
        c.write(0x3c, &[0xff, 0xff]);
        assert_eq!(c.read(15), 0xff, "line writable, pin stays 0");
    }

    #[test]
    fn bar_sizing_reads_back_the_size() {
        let mut c = PciConfig::new(ids());
        c.set_bar(0, 0xc000_0000, 0x1_0000);
        assert_eq!(c.read(4), 0xc000_0000);
        assert!(c.write(0x10, &[0xff; 4]).mapping);
        assert_eq!(c.read(4), 0xffff_0000, "all ones read back as the size");
        c.write(0x10, &0xc001_0000u32.to_le_bytes());
        assert_eq!(c.bar_address(0), 0xc001_0000);
        assert_eq!(c.bar(0), None, "no decoding before the command says so");
        c.write(4, &[COMMAND_MEMORY as u8]);
        assert_eq!(c.bar(0), Some((0xc001_0000, 0x1_0000)));
        // An unimplemented BAR stays zero.
        c.write(0x14, &[0xff; 4]);
        assert_eq!(c.read(5), 0);
    }

    #[test]
    fn capabilities_chain_and_mask() {
        let mut c = PciConfig::new(ids());
        let a = c.add_capability(0x09, &[1, 2, 3], &[0, 0xff, 0]);
        let b = c.add_capability(0x11, &[4, 5], &[0, 0]);
        assert_eq!(a, 0x40);
        assert_eq!(b, 0x48);
        assert_eq!(c.read(13) & 0xff, 0x40);
        assert_ne!(c.read(1) & (STATUS_CAP_LIST << 16), 0);
        assert_eq!(c.bytes(a, 5), vec![0x09, 0x48, 1, 2, 3]);
        let ch = c.write(a + 2, &[9, 9]);
        assert_eq!(ch.capability, Some(a));
        assert_eq!(c.bytes(a, 5), vec![0x09, 0x48, 1, 9, 3]);
        // A write crossing a dword is dropped.
        assert_eq!(c.write(0x3e, &[1, 2, 3, 4]), ConfigChange::default());
    }
}
