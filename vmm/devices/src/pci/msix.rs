//! MSI-X: the capability, the vector table and the pending-bit array
//! (PCI Local Bus 3.0, section 6.8.2).
//!
//! The guest programs each vector's message (address, data) and mask bit
//! in the table; the capability's control word enables MSI-X and masks the
//! whole function. [`Msix`] keeps the hypervisor's route of each vector in
//! step with what the guest wrote ([`MsiVectors::route`], only when it
//! changes), and delivers [`Msix::raise`] at once when the vector is
//! deliverable or sets its pending bit when it is not; unmasking a vector
//! with its pending bit set delivers it then, as the specification asks.

use std::sync::Arc;

use tracing::warn;

use crate::interrupt::{MsiMessage, MsiVectors};

/// The MSI-X capability ID.
pub const MSIX_CAP_ID: u8 = 0x11;
/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
const CTRL_ENABLE: u16 = 1 << 15;
const CTRL_FUNCTION_MASK: u16 = 1 << 14;
const VECTOR_MASKED: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    control: u32,
}

impl Default for Entry {
    fn default() -> Self {
        // Every vector starts masked (6.8.2.9).
        Self {
            addr_lo: 0,
            addr_hi: 0,
            data: 0,
            control: VECTOR_MASKED,
        }
    }
}

/// The body of the MSI-X capability (after ID and next pointer) and its
/// writable bits: `count` vectors, the table in BAR `bar` at `table`, the
/// pending bits in the same BAR at `pba`.
pub fn capability(count: u16, bar: u8, table: u32, pba: u32) -> ([u8; 10], [u8; 10]) {
    let mut body = [0u8; 10];
    body[0..2].copy_from_slice(&(count - 1).to_le_bytes());
    body[2..6].copy_from_slice(&(table | u32::from(bar)).to_le_bytes());
    body[6..10].copy_from_slice(&(pba | u32::from(bar)).to_le_bytes());
    // Only enable and function mask are writable.
    let mut wmask = [0u8; 10];
    wmask[1] = 0xc0;
    (body, wmask)
}

/// MSI-X state of one function.
pub struct Msix {
    entries: Vec<Entry>,
    pending: Vec<bool>,
    routed: Vec<Option<MsiMessage>>,
    control: u16,
    vectors: Arc<dyn MsiVectors>,
}

impl std::fmt::Debug for Msix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Msix")
            .field("vectors", &self.entries.len())
            .field("control", &self.control)
            .finish()
    }
}

impl Msix {
    /// All of `vectors`' vectors, masked, MSI-X off.
    pub fn new(vectors: Arc<dyn MsiVectors>) -> Self {
        let n = vectors.count() as usize;
        Self {
            entries: vec![Entry::default(); n],
            pending: vec![false; n],
            routed: vec![None; n],
            control: 0,
            vectors,
        }
    }

    /// Number of vectors.
    pub fn count(&self) -> u16 {
        self.entries.len() as u16
    }

    /// Whether MSI-X is enabled (the driver turned it on).
    pub fn enabled(&self) -> bool {
        self.control & CTRL_ENABLE != 0
    }

    /// Back to the state at power-on (device reset): routes taken away.
    pub fn reset(&mut self) {
        self.control = 0;
        self.entries.fill(Entry::default());
        self.pending.fill(false);
        for v in 0..self.count() {
            self.sync(v);
        }
    }

    /// The guest wrote the capability's control word.
    pub fn set_control(&mut self, control: u16) {
        let control = control & (CTRL_ENABLE | CTRL_FUNCTION_MASK);
        if control == self.control {
            return;
        }
        self.control = control;
        for v in 0..self.count() {
            self.sync(v);
        }
    }

    fn deliverable(&self, v: usize) -> Option<MsiMessage> {
        let e = self.entries[v];
        let on = self.control & (CTRL_ENABLE | CTRL_FUNCTION_MASK) == CTRL_ENABLE
            && e.control & VECTOR_MASKED == 0;
        on.then(|| MsiMessage {
            addr: u64::from(e.addr_hi) << 32 | u64::from(e.addr_lo),
            data: e.data,
        })
    }

    /// Brings vector `v`'s route in line with the table, and delivers a
    /// pending interrupt it now can.
    fn sync(&mut self, v: u16) {
        let i = v as usize;
        let want = self.deliverable(i);
        if want != self.routed[i] {
            if let Err(e) = self.vectors.route(v, want) {
                warn!("MSI-X vector {v}: routing failed: {e}");
            }
            self.routed[i] = want;
        }
        if want.is_some() && std::mem::take(&mut self.pending[i]) {
            self.fire(v);
        }
    }

    fn fire(&self, v: u16) {
        if let Err(e) = self.vectors.trigger(v) {
            warn!("MSI-X vector {v}: trigger failed: {e}");
        }
    }

    /// The device raises vector `v`: delivered now if it can be, else
    /// left pending. A vector beyond the table is ignored (the driver
    /// chose it; virtio's "no vector" is 0xffff).
    pub fn raise(&mut self, v: u16) {
        let i = v as usize;
        if i >= self.entries.len() {
            return;
        }
        if self.routed[i].is_some() {
            self.fire(v);
        } else {
            self.pending[i] = true;
        }
    }

    /// Reads the table at byte `offset` (4- or 8-byte accesses; others
    /// read as zeros).
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let (i, field) = ((offset / ENTRY_SIZE) as usize, offset % ENTRY_SIZE);
        let Some(e) = self.entries.get(i) else { return };
        let words = [e.addr_lo, e.addr_hi, e.data, e.control];
        match (data.len(), field) {
            (4, f) if f % 4 == 0 => {
                data.copy_from_slice(&words[(f / 4) as usize].to_le_bytes());
            }
            (8, f) if f % 8 == 0 => {
                let w = (f / 4) as usize;
                data[..4].copy_from_slice(&words[w].to_le_bytes());
                data[4..].copy_from_slice(&words[w + 1].to_le_bytes());
            }
            _ => {}
        }
    }

    /// Writes the table at byte `offset` (4- or 8-byte accesses; others
    /// are dropped).
    pub fn write_table(&mut self, offset: u64, data: &[u8]) {
        let (i, field) = ((offset / ENTRY_SIZE) as usize, offset % ENTRY_SIZE);
        if i >= self.entries.len() {
            return;
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let writes: Vec<(u64, u32)> = match (data.len(), field) {
            (4, f) if f % 4 == 0 => vec![(f / 4, word(data))],
            (8, f) if f % 8 == 0 => vec![(f / 4, word(&data[..4])), (f / 4 + 1, word(&data[4..]))],
            _ => return,
        };
        let e = &mut self.entries[i];
        for (w, v) in writes {
            match w {
                0 => e.addr_lo = v,
                1 => e.addr_hi = v,
                2 => e.data = v,
                _ => e.control = v & VECTOR_MASKED,
            }
        }
        self.sync(i as u16);
    }

    /// Reads the pending-bit array at byte `offset`.
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        for (k, b) in data.iter_mut().enumerate() {
            let first = (offset as usize + k) * 8;
            *b = (0..8)
                .filter(|bit| self.pending.get(first + bit).copied().unwrap_or(false))
                .fold(0u8, |acc, bit| acc | 1 << bit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::testing::RecordingMsi;

    fn program(m: &mut Msix, v: u64, apic: u32, vector: u32) {
        m.write_table(v * 16, &(0xfee0_0000u32 | apic << 12).to_le_bytes());
        m.write_table(v * 16 + 4, &0u32.to_le_bytes());
        m.write_table(v * 16 + 8, &vector.to_le_bytes());
    }

    #[test]
    fn routes_follow_enable_and_masks() {
        let rec = Arc::new(RecordingMsi::new(2));
        let mut m = Msix::new(rec.clone());
        program(&mut m, 0, 3, 0x41);
        assert_eq!(rec.route_of(0), None, "masked at reset");
        m.set_control(CTRL_ENABLE);
        assert_eq!(rec.route_of(0), None, "vector still masked");
        m.write_table(12, &0u32.to_le_bytes());
        let r = rec.route_of(0).unwrap();
        assert_eq!((r.dest_apic_id(), r.data), (3, 0x41));
        m.set_control(CTRL_ENABLE | CTRL_FUNCTION_MASK);
        assert_eq!(rec.route_of(0), None, "function mask");
        m.set_control(0);
        assert_eq!(rec.route_of(0), None);
    }

    #[test]
    fn masked_raise_is_pending_until_unmasked() {
        let rec = Arc::new(RecordingMsi::new(2));
        let mut m = Msix::new(rec.clone());
        m.set_control(CTRL_ENABLE);
        program(&mut m, 1, 0, 0x42);
        m.raise(1);
        assert_eq!(rec.triggered(1), 0);
        let mut pba = [0u8; 1];
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0b10);
        m.write_table(16 + 12, &0u32.to_le_bytes());
        assert_eq!(rec.triggered(1), 1, "delivered at unmask");
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0);
        m.raise(1);
        assert_eq!(rec.triggered(1), 2);
        // Out of range and odd-sized accesses are ignored.
        m.raise(0xffff);
        m.write_table(32 * 16, &[0; 4]);
        m.write_table(0, &[1, 2]);
        let mut d = [0xaa; 4];
        m.read_table(2, &mut d);
        assert_eq!(d, [0; 4]);
    }

    #[test]
    fn table_reads_back_and_reset_masks() {
        let rec = Arc::new(RecordingMsi::new(1));
        let mut m = Msix::new(rec.clone());
        program(&mut m, 0, 1, 0x50);
        let mut d = [0u8; 8];
        m.read_table(8, &mut d);
        assert_eq!(d, [0x50, 0, 0, 0, 1, 0, 0, 0]);
        m.set_control(CTRL_ENABLE);
        m.write_table(12, &0u32.to_le_bytes());
        assert!(rec.route_of(0).is_some());
        m.reset();
        assert_eq!(rec.route_of(0), None);
        assert!(!m.enabled());
        let (body, wmask) = capability(3, 0, 0x8000, 0x9000);
        assert_eq!(&body[..2], &[2, 0]);
        assert_eq!(wmask[1], 0xc0);
    }
}
