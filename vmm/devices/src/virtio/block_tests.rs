//! virtio-blk driven through the transport the way Linux's driver drives
//! it, against an image file the test reads back with plain file I/O.
//! Every request case runs on every engine (`sync`, `pool`, `io_uring`;
//! the `on_every_engine!` list at the end), and the test engine `Reverse`
//! makes out-of-order completion and a reset with requests in flight
//! deterministic.

use std::io::Write;
use std::os::unix::fs::FileExt;

use vm_memory::{Bytes, GuestAddress};

use super::block::{Block, Disk, DiskError, SECTOR};
use super::block_engine::EngineKind;
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
    size: u16,
}

impl Blk {
    fn new(disk: Disk, engine: EngineKind) -> Self {
        Self::sized(disk, engine, 16)
    }

    /// A device on `engine` whose queue has `size` entries.
    fn sized(disk: Disk, engine: EngineKind, size: u16) -> Self {
        let dev = Block::new("blk-test", disk, 1).with_engine(engine);
        let mut d = Driver::with(Box::new(dev));
        d.msix();
        d.setup(size);
        d.driver_ok();
        assert_eq!(d.status() & status::NEEDS_RESET, 0);
        Self { d, next: 0, size }
    }

    /// Resets the device (status 0), clears its rings and sets it up
    /// again.
    fn reset(&mut self) {
        self.d.w(0x14, 0, 1);
        for ring in [super::tests::USED, super::tests::AVAIL] {
            self.d
                .mem
                .write_slice(&[0u8; 1024], GuestAddress(ring))
                .unwrap();
        }
        self.d.setup(self.size);
        self.d.driver_ok();
        self.next = 0;
    }

    /// Makes `n` reads available with one notification: read `i` takes
    /// 4 KiB from sector `8 * sector(i)` into DATA + 4 KiB * i, descriptors
    /// 3i..3i+2, status byte at STATUS + i.
    fn post_reads(&mut self, n: u16, sector: impl Fn(u16) -> u64) {
        let m = self.d.mem.clone();
        for i in 0..n {
            let hdr = HDR + 16 * u64::from(i);
            m.write_obj(T_IN, GuestAddress(hdr)).unwrap();
            m.write_obj(0u32, GuestAddress(hdr + 4)).unwrap();
            m.write_obj(8 * sector(i), GuestAddress(hdr + 8)).unwrap();
            m.write_obj(0xffu8, GuestAddress(STATUS + u64::from(i)))
                .unwrap();
            let (h, data) = (3 * i, DATA + 4096 * u64::from(i));
            self.d.desc(DESC, h, hdr, 16, F_NEXT, h + 1);
            self.d
                .desc(DESC, h + 1, data, 4096, F_WRITE | F_NEXT, h + 2);
            self.d
                .desc(DESC, h + 2, STATUS + u64::from(i), 1, F_WRITE, 0);
            let idx = self.next + i;
            let at = super::tests::AVAIL + 4 + 2 * u64::from(idx % self.size);
            m.write_obj(h, GuestAddress(at)).unwrap();
        }
        self.next += n;
        m.write_obj(self.next, GuestAddress(super::tests::AVAIL + 2))
            .unwrap();
        self.d.w(0x3000, 0, 2);
    }

    /// Used entry `i`: (head, length).
    fn used(&self, i: u16) -> (u32, u32) {
        self.d.used_elem(super::tests::USED - 0x2000, i % self.size)
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
        self.d.post(idx, 0, self.size);
        assert!(self.d.wait(|d| d.used_idx() == idx + 1), "no completion");
        let slot = u64::from(idx % self.size);
        let m = &self.d.mem;
        let used_len: u32 = m
            .read_obj(GuestAddress(super::tests::USED + 8 + 8 * slot))
            .unwrap();
        (m.read_obj(GuestAddress(STATUS)).unwrap(), used_len)
    }
}

fn reads_writes_and_flushes_reach_the_file(engine: EngineKind) {
    let (f, bytes) = image();
    let mut b = Blk::new(Disk::open(f.path(), false).unwrap(), engine);
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

fn write_zeroes_and_discard(engine: EngineKind) {
    let (f, _) = image();
    let mut b = Blk::new(Disk::open(f.path(), false).unwrap(), engine);
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

fn read_only_images_refuse_writes(engine: EngineKind) {
    let (f, bytes) = image();
    let mut b = Blk::new(Disk::open(f.path(), true).unwrap(), engine);
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

fn a_request_without_header_or_status_needs_a_reset(engine: EngineKind) {
    let (f, _) = image();
    let mut b = Blk::new(Disk::open(f.path(), false).unwrap(), engine);
    // Only a writable status byte: no header.
    b.d.desc(DESC, 0, STATUS, 1, F_WRITE, 0);
    b.d.post(0, 0, 16);
    assert!(b.d.faulted());
    // After a reset, the same device serves again.
    b.reset();
    assert_eq!(b.request(T_IN, 0, 512).0, S_OK);
    // Header but no writable status byte.
    b.d.desc(DESC, 0, HDR, 16, 0, 0);
    b.d.post(1, 0, 16);
    assert!(b.d.faulted());
}

/// Many reads in flight at once, each landing where its chain says, each
/// head used exactly once.
fn many_requests_in_flight(engine: EngineKind) {
    let (f, bytes) = image();
    let mut b = Blk::sized(Disk::open(f.path(), false).unwrap(), engine, 64);
    let n = 16;
    // Image block 15 - i into buffer i.
    b.post_reads(n, |i| u64::from(15 - i));
    assert!(b.d.wait(|d| d.used_idx() == n), "not all completed");
    let mut heads: Vec<u32> = (0..n).map(|i| b.used(i).0).collect();
    heads.sort_unstable();
    assert_eq!(heads, (0..n).map(|i| 3 * u32::from(i)).collect::<Vec<_>>());
    for i in 0..n {
        assert_eq!(b.used(i).1, 4097);
        let mut got = vec![0u8; 4096];
        let at = DATA + 4096 * u64::from(i);
        b.d.mem.read_slice(&mut got, GuestAddress(at)).unwrap();
        let block = 15 - usize::from(i);
        assert!(got == bytes[block * 4096..][..4096], "read {i}");
        let st: u8 =
            b.d.mem
                .read_obj(GuestAddress(STATUS + u64::from(i)))
                .unwrap();
        assert_eq!(st, S_OK);
    }
}

/// A reset while reads are in flight (or queued in the engine) stops
/// cleanly, and the device serves again after it.
fn reset_with_requests_in_flight(engine: EngineKind) {
    let (f, bytes) = image();
    let mut b = Blk::sized(Disk::open(f.path(), false).unwrap(), engine, 64);
    b.post_reads(16, u64::from);
    b.reset();
    assert_eq!(b.d.status() & status::NEEDS_RESET, 0);
    assert_eq!(b.request(T_IN, 8, 4096), (S_OK, 4097));
    let mut got = vec![0u8; 4096];
    b.d.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got == bytes[4096..8192]);
}

#[test]
fn completions_out_of_order_reach_the_used_ring_as_they_finish() {
    let (f, bytes) = image();
    let mut b = Blk::sized(
        Disk::open(f.path(), false).unwrap(),
        EngineKind::Reverse,
        64,
    );
    b.post_reads(4, u64::from);
    assert!(b.d.wait(|d| d.used_idx() == 4));
    // The engine finished them last first: heads 9, 6, 3, 0.
    let used: Vec<(u32, u32)> = (0..4).map(|i| b.used(i)).collect();
    assert_eq!(used, vec![(9, 4097), (6, 4097), (3, 4097), (0, 4097)]);
    for i in 0..4u64 {
        let mut got = vec![0u8; 4096];
        b.d.mem
            .read_slice(&mut got, GuestAddress(DATA + 4096 * i))
            .unwrap();
        assert!(got == bytes[4096 * i as usize..][..4096], "read {i}");
    }
}

#[test]
fn a_reset_drops_requests_the_engine_still_holds() {
    let (f, _) = image();
    let mut b = Blk::sized(
        Disk::open(f.path(), false).unwrap(),
        EngineKind::Reverse,
        64,
    );
    // Three reads: the test engine holds them (it runs at four).
    b.post_reads(3, u64::from);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(b.d.used_idx(), 0);
    b.reset();
    assert_eq!(b.d.used_idx(), 0, "nothing used after the reset");
    b.post_reads(4, u64::from);
    assert!(b.d.wait(|d| d.used_idx() == 4));
}

#[test]
fn an_io_uring_the_host_refuses_falls_back_to_the_pool() {
    let (f, _) = image();
    let disk = std::sync::Arc::new(Disk::open(f.path(), false).unwrap());
    let mem = super::Memory::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap();
    // A ring of 0 entries: io_uring_setup refuses it (EINVAL), as it
    // refuses everything when disabled.
    let e = super::block_engine::start(EngineKind::IoUring, "t", &disk, &mem, 0).unwrap();
    assert!(e.is_some(), "an engine, not a panic");
}

#[test]
fn engine_names_parse_and_print() {
    for e in EngineKind::ALL {
        assert_eq!(e.to_string().parse::<EngineKind>(), Ok(e));
    }
    let err = "aio".parse::<EngineKind>().unwrap_err().to_string();
    assert!(err.contains("sync, pool, io_uring"), "{err}");
}

/// `#[test]`s running each case on every engine an operator can pick.
macro_rules! on_every_engine {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                use super::EngineKind;
                #[test]
                fn sync() {
                    super::$case(EngineKind::Sync);
                }
                #[test]
                fn pool() {
                    super::$case(EngineKind::Pool);
                }
                #[test]
                fn io_uring() {
                    super::$case(EngineKind::IoUring);
                }
            }
        )*
    };
}

on_every_engine!(
    reads_writes_and_flushes_reach_the_file,
    write_zeroes_and_discard,
    read_only_images_refuse_writes,
    a_request_without_header_or_status_needs_a_reset,
    many_requests_in_flight,
    reset_with_requests_in_flight,
);

/// `with_queue_size`: a power of two from 4 to 1024 (Kata asks for 1024)
/// sizes every queue and `seg_max` (two below it); anything else keeps 256.
#[test]
fn queue_size_sets_the_queues_and_seg_max() {
    use super::VirtioDevice;
    let (f, _) = image();
    let b = Block::new("q", Disk::open(f.path(), true).unwrap(), 2).with_queue_size(128);
    assert_eq!(b.queue_max_sizes(), vec![128, 128]);
    let mut seg_max = [0u8; 4];
    b.read_config(12, &mut seg_max);
    assert_eq!(u32::from_le_bytes(seg_max), 126);
    let b = Block::new("q", Disk::open(f.path(), true).unwrap(), 1).with_queue_size(1024);
    assert_eq!(b.queue_max_sizes(), vec![1024]);
    b.read_config(12, &mut seg_max);
    assert_eq!(u32::from_le_bytes(seg_max), 1022);
    for bad in [0, 2, 100, 2048] {
        let b = Block::new("q", Disk::open(f.path(), true).unwrap(), 1).with_queue_size(bad);
        assert_eq!(b.queue_max_sizes(), vec![super::block::QUEUE_SIZE], "{bad}");
    }
}
