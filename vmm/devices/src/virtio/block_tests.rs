//! virtio-blk driven through the transport the way Linux's driver drives
//! it, against an image file the test reads back with plain file I/O.

use std::io::Write;
use std::os::unix::fs::FileExt;

use vm_memory::{Bytes, GuestAddress};

use super::block::{Block, Disk, DiskError, SECTOR};
use super::status;
use super::tests::{Driver, DATA, DESC, F_NEXT, F_WRITE};

const HDR: u64 = 0x8000;
const STATUS: u64 = 0x8100;
const IMAGE: usize = 64 * 1024;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const T_DISCARD: u32 = 11;
const T_WRITE_ZEROES: u32 = 13;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;

fn image() -> (tempfile::NamedTempFile, Vec<u8>) {
    let bytes: Vec<u8> = (0..IMAGE as u32).map(|i| (i * 13 + 5) as u8).collect();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&bytes).unwrap();
    (f, bytes)
}

struct Blk {
    d: Driver,
    next: u16,
}

impl Blk {
    fn new(disk: Disk) -> Self {
        let mut d = Driver::with(Box::new(Block::new("blk-test", disk, 1)));
        d.msix();
        d.setup(16);
        d.driver_ok();
        assert_eq!(d.status() & status::NEEDS_RESET, 0);
        Self { d, next: 0 }
    }

    /// One request: header, then `len` data bytes at DATA (device-writable
    /// for reads and get-id), then the status byte. Returns the status and
    /// the used length.
    fn request(&mut self, kind: u32, sector: u64, len: u32) -> (u8, u32) {
        let m = self.d.mem.clone();
        m.write_obj(kind, GuestAddress(HDR)).unwrap();
        m.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
        m.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
        m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let data_flags = if matches!(kind, T_IN | T_GET_ID) {
            F_WRITE
        } else {
            0
        };
        if len > 0 {
            self.d.desc(DESC, 0, HDR, 16, F_NEXT, 1);
            self.d.desc(DESC, 1, DATA, len, data_flags | F_NEXT, 2);
            self.d.desc(DESC, 2, STATUS, 1, F_WRITE, 0);
        } else {
            self.d.desc(DESC, 0, HDR, 16, F_NEXT, 2);
            self.d.desc(DESC, 2, STATUS, 1, F_WRITE, 0);
        }
        let idx = self.next;
        self.next += 1;
        self.d.post(idx, 0, 16);
        assert!(self.d.wait(|d| d.used_idx() == idx + 1), "no completion");
        let slot = u64::from(idx % 16);
        let m = &self.d.mem;
        let used_len: u32 = m
            .read_obj(GuestAddress(super::tests::USED + 8 + 8 * slot))
            .unwrap();
        (m.read_obj(GuestAddress(STATUS)).unwrap(), used_len)
    }
}

#[test]
fn reads_writes_and_flushes_reach_the_file() {
    let (f, bytes) = image();
    let mut b = Blk::new(Disk::open(f.path(), false).unwrap());
    // Read sectors 2-3.
    assert_eq!(b.request(T_IN, 2, 1024), (S_OK, 1025));
    let mut got = vec![0u8; 1024];
    b.d.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(got, bytes[1024..2048]);
    // Write sector 5 with a pattern, then flush; the file has it.
    let pattern: Vec<u8> = (0..512u32).map(|i| (i ^ 0x5a) as u8).collect();
    b.d.mem.write_slice(&pattern, GuestAddress(DATA)).unwrap();
    assert_eq!(b.request(T_OUT, 5, 512), (S_OK, 1));
    assert_eq!(b.request(T_FLUSH, 0, 0), (S_OK, 1));
    let mut on_disk = vec![0u8; 512];
    f.as_file().read_exact_at(&mut on_disk, 5 * SECTOR).unwrap();
    assert_eq!(on_disk, pattern);
    // The ID: 20 bytes.
    assert_eq!(b.request(T_GET_ID, 0, 20), (S_OK, 21));
    // Out of range, and not whole sectors: the guest's I/O error.
    let last = (IMAGE as u64) / SECTOR;
    assert_eq!(b.request(T_IN, last - 1, 1024).0, S_IOERR);
    assert_eq!(b.request(T_IN, 0, 100).0, S_IOERR);
    assert_eq!(b.request(T_OUT, u64::MAX, 512).0, S_IOERR);
    assert_eq!(b.request(77, 0, 0).0, S_UNSUPP);
    // Nothing of that faulted the device.
    assert_eq!(b.d.status() & status::NEEDS_RESET, 0);
}

#[test]
fn write_zeroes_and_discard() {
    let (f, _) = image();
    let mut b = Blk::new(Disk::open(f.path(), false).unwrap());
    // One segment: sectors 8-15, flags 0 (zeroes, no unmap).
    let seg = |sector: u64, n: u32, flags: u32| {
        let mut v = sector.to_le_bytes().to_vec();
        v.extend(n.to_le_bytes());
        v.extend(flags.to_le_bytes());
        v
    };
    b.d.mem
        .write_slice(&seg(8, 8, 0), GuestAddress(DATA))
        .unwrap();
    assert_eq!(b.request(T_WRITE_ZEROES, 0, 16).0, S_OK);
    let mut z = vec![1u8; 8 * 512];
    f.as_file().read_exact_at(&mut z, 8 * SECTOR).unwrap();
    assert!(z.iter().all(|&x| x == 0));
    // Discard: a hint; the size stays.
    b.d.mem
        .write_slice(&seg(16, 8, 0), GuestAddress(DATA))
        .unwrap();
    assert_eq!(b.request(T_DISCARD, 0, 16).0, S_OK);
    assert_eq!(f.as_file().metadata().unwrap().len(), IMAGE as u64);
    // Beyond the image, or unknown flags.
    b.d.mem
        .write_slice(&seg(127, 2, 0), GuestAddress(DATA))
        .unwrap();
    assert_eq!(b.request(T_WRITE_ZEROES, 0, 16).0, S_IOERR);
    b.d.mem
        .write_slice(&seg(0, 1, 4), GuestAddress(DATA))
        .unwrap();
    assert_eq!(b.request(T_DISCARD, 0, 16).0, S_UNSUPP);
}

#[test]
fn read_only_images_refuse_writes() {
    let (f, bytes) = image();
    let mut b = Blk::new(Disk::open(f.path(), true).unwrap());
    // VIRTIO_BLK_F_RO (bit 5) offered.
    b.d.w(0x00, 0, 4);
    assert_ne!(b.d.r(0x04, 4) & (1 << 5), 0);
    b.d.mem
        .write_slice(&[0u8; 512], GuestAddress(DATA))
        .unwrap();
    assert_eq!(b.request(T_OUT, 0, 512).0, S_IOERR);
    assert_eq!(b.request(T_WRITE_ZEROES, 0, 16).0, S_IOERR);
    assert_eq!(b.request(T_IN, 0, 512).0, S_OK);
    let mut on_disk = vec![0u8; 512];
    f.as_file().read_exact_at(&mut on_disk, 0).unwrap();
    assert_eq!(on_disk, bytes[..512]);
}

#[test]
fn images_are_locked_and_checked() {
    let (f, _) = image();
    let a = Disk::open(f.path(), false).unwrap();
    assert!(matches!(
        Disk::open(f.path(), false),
        Err(DiskError::Locked(_))
    ));
    assert!(matches!(
        Disk::open(f.path(), true),
        Err(DiskError::Locked(_))
    ));
    drop(a);
    let r1 = Disk::open(f.path(), true).unwrap();
    let _r2 = Disk::open(f.path(), true).expect("readers share the image");
    assert!(matches!(
        Disk::open(f.path(), false),
        Err(DiskError::Locked(_))
    ));
    drop(r1);
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Disk::open(dir.path(), false),
        Err(DiskError::NotAFile(_))
    ));
    let missing = dir.path().join("none.img");
    let e = Disk::open(&missing, false).unwrap_err();
    assert!(matches!(e, DiskError::Missing(_)));
    assert!(!missing.exists(), "nothing created");
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        Disk::open(&empty, false),
        Err(DiskError::Empty(..))
    ));
    let msg = DiskError::Locked(f.path().into()).to_string();
    assert!(
        msg.contains("another VM") && msg.contains("readonly=on"),
        "{msg}"
    );
}

#[test]
fn a_request_without_header_or_status_needs_a_reset() {
    let (f, _) = image();
    let mut b = Blk::new(Disk::open(f.path(), false).unwrap());
    // Only a writable status byte: no header.
    b.d.desc(DESC, 0, STATUS, 1, F_WRITE, 0);
    b.d.post(0, 0, 16);
    assert!(b.d.faulted());
    // After a reset, the same device serves again.
    b.d.w(0x14, 0, 1);
    b.d.mem
        .write_slice(&[0u8; 64], GuestAddress(super::tests::USED))
        .unwrap();
    b.d.mem
        .write_slice(&[0u8; 64], GuestAddress(super::tests::AVAIL))
        .unwrap();
    b.d.setup(16);
    b.d.driver_ok();
    b.next = 0;
    assert_eq!(b.request(T_IN, 0, 512).0, S_OK);
    // Header but no writable status byte.
    b.d.desc(DESC, 0, HDR, 16, 0, 0);
    b.d.post(1, 0, 16);
    assert!(b.d.faulted());
}

/// `with_queue_size`: a power of two from 4 to 256 sizes every queue and
/// `seg_max` (two below it); anything else keeps 256.
#[test]
fn queue_size_sets_the_queues_and_seg_max() {
    use super::VirtioDevice;
    let (f, _) = image();
    let b = Block::new("q", Disk::open(f.path(), true).unwrap(), 2).with_queue_size(128);
    assert_eq!(b.queue_max_sizes(), vec![128, 128]);
    let mut seg_max = [0u8; 4];
    b.read_config(12, &mut seg_max);
    assert_eq!(u32::from_le_bytes(seg_max), 126);
    for bad in [0, 2, 100, 512] {
        let b = Block::new("q", Disk::open(f.path(), true).unwrap(), 1).with_queue_size(bad);
        assert_eq!(b.queue_max_sizes(), vec![super::block::QUEUE_SIZE], "{bad}");
    }
}
