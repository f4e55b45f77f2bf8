//! The transport and virtio-rng driven the way a driver drives them, and
//! the hostile-guest cases: each must end in `NEEDS_RESET`, with the
//! device still answering and a reset bringing it back.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Address, Bytes, GuestAddress};

use super::rng::Rng;
use super::{status, VirtioPci};
use crate::interrupt::testing::{RecordingMsi, RecordingNotify};
use crate::pci::PciDevice;

pub(super) const DESC: u64 = 0x1000;
pub(super) const AVAIL: u64 = 0x2000;
pub(super) const USED: u64 = 0x3000;
pub(super) const DATA: u64 = 0x10000;
pub(super) const MEM: u64 = 1 << 20;
pub(super) const F_NEXT: u16 = 1;
pub(super) const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// A virtio driver in a test: the transport's registers, guest memory and
/// the MSI-X vectors it raised.
pub(super) struct Driver {
    pub(super) dev: VirtioPci,
    pub(super) mem: super::Memory,
    pub(super) msi: Arc<RecordingMsi>,
    _keep: Option<tempfile::NamedTempFile>,
}

fn pattern() -> (tempfile::NamedTempFile, Vec<u8>) {
    let bytes: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&bytes).unwrap();
    (f, bytes)
}

impl Driver {
    /// `device` on the transport, 1 MiB of guest memory, 2 vectors.
    pub(super) fn with(device: Box<dyn super::VirtioDevice>) -> Self {
        let mem = super::Memory::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let msi = Arc::new(RecordingMsi::new(2));
        let dev = VirtioPci::new(
            "test",
            device,
            0xc000_0000,
            msi.clone(),
            Arc::new(RecordingNotify::default()),
            mem.clone(),
        )
        .unwrap();
        Self {
            dev,
            mem,
            msi,
            _keep: None,
        }
    }

    /// A virtio-rng reading a file of known bytes, and those bytes.
    fn new() -> (Self, Vec<u8>) {
        let (f, bytes) = pattern();
        let mut d = Self::with(Box::new(Rng::from_path(f.path()).unwrap()));
        d._keep = Some(f);
        (d, bytes)
    }
    pub(super) fn w(&mut self, off: u64, v: u64, len: usize) {
        self.dev.write_bar(0, off, &v.to_le_bytes()[..len]);
    }
    pub(super) fn r(&mut self, off: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        self.dev.read_bar(0, off, &mut b[..len]);
        u64::from_le_bytes(b)
    }
    pub(super) fn status(&mut self) -> u8 {
        self.r(0x14, 1) as u8
    }
    /// MSI-X on, vector 0 at APIC 0 and unmasked.
    pub(super) fn msix(&mut self) {
        let cap = (0..)
            .scan(self.dev.config().read(13) as usize & 0xff, |off, _| {
                let cur = *off;
                *off = self.dev.config().bytes(cur, 2)[1] as usize;
                (cur != 0).then_some(cur)
            })
            .find(|&off| self.dev.config().bytes(off, 1)[0] == 0x11)
            .unwrap();
        self.dev.write_config(cap + 3, &[0x80]);
        self.w(0x8000, 0xfee0_0000, 4);
        self.w(0x8008, 0x41, 4);
        self.w(0x800c, 0, 4);
    }
    /// Negotiates and sets up queue 0 (size `size`), without DRIVER_OK.
    pub(super) fn setup(&mut self, size: u16) {
        self.setup_features(size, 0);
    }
    /// As [`setup`](Self::setup), accepting the low feature bits `low` too.
    pub(super) fn setup_features(&mut self, size: u16, low: u32) {
        self.w(0x14, 0, 1);
        self.w(0x14, u64::from(status::ACKNOWLEDGE | status::DRIVER), 1);
        self.w(0x08, 0, 4);
        self.w(0x0c, u64::from(low), 4);
        self.w(0x08, 1, 4);
        self.w(0x0c, 1, 4); // VERSION_1
        self.w(
            0x14,
            u64::from(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK),
            1,
        );
        assert_ne!(self.status() & status::FEATURES_OK, 0);
        // Configuration changes (and NEEDS_RESET) on vector 0.
        self.w(0x10, 0, 2);
        assert_eq!(self.r(0x10, 2), 0);
        self.w(0x16, 0, 2);
        self.w(0x18, u64::from(size), 2);
        self.w(0x1a, 0, 2);
        assert_eq!(self.r(0x1a, 2), 0, "vector 0 accepted");
        self.w(0x20, DESC, 4);
        self.w(0x28, AVAIL, 4);
        self.w(0x30, USED, 4);
        self.w(0x1c, 1, 2);
    }
    pub(super) fn driver_ok(&mut self) {
        let s = self.status();
        self.w(0x14, u64::from(s | status::DRIVER_OK), 1);
    }
    pub(super) fn desc(&self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let a = GuestAddress(table + 16 * u64::from(i));
        self.mem.write_obj(addr, a).unwrap();
        self.mem.write_obj(len, a.unchecked_add(8)).unwrap();
        self.mem.write_obj(flags, a.unchecked_add(12)).unwrap();
        self.mem.write_obj(next, a.unchecked_add(14)).unwrap();
    }
    /// Makes head `head` available as entry `idx` and notifies.
    pub(super) fn post(&mut self, idx: u16, head: u16, size: u16) {
        self.mem
            .write_obj(head, GuestAddress(AVAIL + 4 + 2 * u64::from(idx % size)))
            .unwrap();
        self.mem
            .write_obj(idx + 1, GuestAddress(AVAIL + 2))
            .unwrap();
        self.w(0x3000, 0, 2);
    }
    /// Queue `index` at its own rings: descriptors at `base`, available
    /// ring at `base + 0x1000`, used ring at `base + 0x2000`.
    pub(super) fn queue_at(&mut self, index: u16, size: u16, base: u64) {
        self.w(0x16, u64::from(index), 2);
        self.w(0x18, u64::from(size), 2);
        self.w(0x1a, 0, 2);
        self.w(0x20, base, 4);
        self.w(0x28, base + 0x1000, 4);
        self.w(0x30, base + 0x2000, 4);
        self.w(0x1c, 1, 2);
    }
    /// Makes head `head` available as entry `idx` of the queue at `base`
    /// (set up by [`queue_at`](Self::queue_at)) and notifies it.
    pub(super) fn post_at(&mut self, index: u16, base: u64, idx: u16, head: u16) {
        self.mem
            .write_obj(head, GuestAddress(base + 0x1000 + 4 + 2 * u64::from(idx)))
            .unwrap();
        self.mem
            .write_obj(idx + 1, GuestAddress(base + 0x1000 + 2))
            .unwrap();
        self.w(0x3000 + 4 * u64::from(index), u64::from(index), 2);
    }
    /// The used index of the queue at `base`.
    pub(super) fn used_at(&self, base: u64) -> u16 {
        self.mem.read_obj(GuestAddress(base + 0x2002)).unwrap()
    }
    /// Used element `i` (head, length) of the queue at `base`.
    pub(super) fn used_elem(&self, base: u64, i: u16) -> (u32, u32) {
        let a = base + 0x2004 + 8 * u64::from(i);
        (
            self.mem.read_obj(GuestAddress(a)).unwrap(),
            self.mem.read_obj(GuestAddress(a + 4)).unwrap(),
        )
    }
    pub(super) fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }
    pub(super) fn wait<F: FnMut(&mut Self) -> bool>(&mut self, mut f: F) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if f(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
    pub(super) fn faulted(&mut self) -> bool {
        self.wait(|d| d.status() & status::NEEDS_RESET != 0)
    }
}

#[test]
fn rng_fills_buffers_and_interrupts() {
    let (mut d, bytes) = Driver::new();
    d.msix();
    d.setup(16);
    d.driver_ok();
    assert_eq!(d.status() & status::NEEDS_RESET, 0);
    d.desc(DESC, 0, DATA, 32, F_WRITE, 0);
    d.post(0, 0, 16);
    assert!(d.wait(|d| d.used_idx() == 1));
    let len: u32 = d.mem.read_obj(GuestAddress(USED + 8)).unwrap();
    assert_eq!(len, 32);
    let mut got = [0u8; 32];
    d.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(&got[..], &bytes[..32]);
    assert!(d.wait(|d| d.msi.triggered(0) >= 1), "MSI-X vector 0 raised");
    // A buffer larger than the per-request cap gets the cap.
    d.desc(DESC, 1, DATA, 100_000, F_WRITE, 0);
    d.post(1, 1, 16);
    assert!(d.wait(|d| d.used_idx() == 2));
    let len: u32 = d.mem.read_obj(GuestAddress(USED + 16)).unwrap();
    assert_eq!(len as usize, super::rng::MAX_PER_REQUEST);
    // Reset stops it; status reads 0.
    d.w(0x14, 0, 1);
    assert_eq!(d.status(), 0);
}

#[test]
fn features_outside_the_offer_are_refused() {
    let (mut d, _) = Driver::new();
    d.w(0x14, u64::from(status::ACKNOWLEDGE | status::DRIVER), 1);
    d.w(0x08, 0, 4);
    d.w(0x0c, 1 << 5, 4); // not offered by virtio-rng
    d.w(0x08, 1, 4);
    d.w(0x0c, 1, 4);
    d.w(
        0x14,
        u64::from(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK),
        1,
    );
    assert_eq!(d.status() & status::FEATURES_OK, 0);
    // Without VERSION_1 too.
    d.w(0x14, 0, 1);
    d.w(
        0x14,
        u64::from(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK),
        1,
    );
    assert_eq!(d.status() & status::FEATURES_OK, 0);
}

/// Each hostile setup ends in NEEDS_RESET; a reset and a clean setup then
/// serve a request again.
fn hostile(case: impl FnOnce(&mut Driver)) {
    let (mut d, bytes) = Driver::new();
    d.msix();
    case(&mut d);
    assert!(d.faulted(), "device did not go to NEEDS_RESET");
    assert!(
        d.msi.triggered(0) >= 1,
        "the driver heard of it (config interrupt)"
    );
    d.w(0x14, 0, 1);
    assert_eq!(d.status(), 0, "reset clears NEEDS_RESET");
    // A fresh start for the rings, as a driver allocates new ones.
    d.mem.write_slice(&[0u8; 64], GuestAddress(USED)).unwrap();
    d.mem.write_slice(&[0u8; 64], GuestAddress(AVAIL)).unwrap();
    d.setup(16);
    d.driver_ok();
    d.desc(DESC, 0, DATA, 8, F_WRITE, 0);
    d.post(0, 0, 16);
    assert!(
        d.wait(|d| d.used_idx() == 1),
        "served again after the reset"
    );
    let mut got = [0u8; 8];
    d.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(&got[..], &bytes[..8]);
}

#[test]
fn queue_size_not_a_power_of_two() {
    hostile(|d| d.setup(3));
}

#[test]
fn notification_before_driver_ok() {
    hostile(|d| {
        d.setup(16);
        d.w(0x3000, 0, 2);
    });
}

#[test]
fn rings_outside_guest_memory() {
    hostile(|d| {
        d.setup(16);
        d.w(0x30, MEM + 0x1000, 4);
        d.driver_ok();
    });
}

#[test]
fn descriptor_loop() {
    hostile(|d| {
        d.setup(16);
        d.driver_ok();
        d.desc(DESC, 0, DATA, 8, F_WRITE | F_NEXT, 1);
        d.desc(DESC, 1, DATA, 8, F_WRITE | F_NEXT, 0);
        d.post(0, 0, 16);
    });
}

#[test]
fn buffer_outside_guest_memory() {
    hostile(|d| {
        d.setup(16);
        d.driver_ok();
        d.desc(DESC, 0, MEM - 4, 8, F_WRITE, 0);
        d.post(0, 0, 16);
    });
}

#[test]
fn four_gib_length() {
    hostile(|d| {
        d.setup(16);
        d.driver_ok();
        d.desc(DESC, 0, DATA, u32::MAX, F_WRITE, 0);
        d.post(0, 0, 16);
    });
}

#[test]
fn indirect_table_pointing_at_itself() {
    hostile(|d| {
        d.setup(16);
        d.driver_ok();
        let table = 0x5000;
        d.desc(DESC, 0, table, 32, F_INDIRECT, 0);
        d.desc(table, 0, table, 32, F_INDIRECT, 0);
        d.post(0, 0, 16);
    });
}

#[test]
fn available_index_overruns_the_queue() {
    hostile(|d| {
        d.setup(16);
        d.driver_ok();
        d.desc(DESC, 0, DATA, 8, F_WRITE, 0);
        d.mem.write_obj(40u16, GuestAddress(AVAIL + 2)).unwrap();
        d.w(0x3000, 0, 2);
    });
}

#[test]
fn event_idx_rearms_the_drivers_notifications() {
    let (mut d, _) = Driver::new();
    d.msix();
    d.setup_features(16, 1 << 29);
    d.driver_ok();
    for i in 0..3u16 {
        d.desc(DESC, i, DATA + 64 * u64::from(i), 8, F_WRITE, 0);
        d.post(i, i, 16);
        assert!(d.wait(|d| d.used_idx() == i + 1));
        // avail_event (the used ring's last field, after its 16 entries)
        // tells the driver to notify for the next buffer: without it a
        // driver that uses EVENT_IDX stops notifying after its first one.
        let ev = GuestAddress(USED + 4 + 8 * 16);
        assert!(
            d.wait(|d| d.mem.read_obj::<u16>(ev).unwrap() == i + 1),
            "avail_event not re-armed after buffer {i}"
        );
    }
}

#[test]
fn the_pci_cfg_capability_reaches_bar_0_through_config_space() {
    let (mut d, _) = Driver::new();
    // Walk the capability list for the vendor capability of type 5.
    let mut off = d.dev.config().read(13) as usize & 0xff;
    let mut cap = None;
    while off != 0 {
        let b = d.dev.config().bytes(off, 4);
        if b[0] == 0x09 && b[3] == 5 {
            cap = Some(off);
        }
        off = b[1] as usize;
    }
    let cap = cap.expect("a VIRTIO_PCI_CAP_PCI_CFG capability");
    assert_eq!(d.dev.config().bytes(cap + 2, 1)[0], 20, "cap_len");
    // Point it at device_status (common config + 0x14), one byte.
    d.dev.write_config(cap + 4, &[0]);
    d.dev.write_config(cap + 8, &0x14u32.to_le_bytes());
    d.dev.write_config(cap + 12, &1u32.to_le_bytes());
    d.dev
        .write_config(cap + 16, &[status::ACKNOWLEDGE | status::DRIVER]);
    assert_eq!(
        d.status(),
        status::ACKNOWLEDGE | status::DRIVER,
        "written through the window"
    );
    let v = d.dev.read_config((cap + 16) / 4);
    assert_eq!(
        v & 0xff,
        u32::from(status::ACKNOWLEDGE | status::DRIVER),
        "read through it"
    );
    // A length the specification does not allow moves nothing.
    d.dev.write_config(cap + 12, &3u32.to_le_bytes());
    d.dev.write_config(cap + 16, &[0]);
    assert_eq!(d.status(), status::ACKNOWLEDGE | status::DRIVER);
}
