//! virtio-blk (virtio 1.2, 5.2) backed by a raw image file.
//!
//! * Requests: read, write, flush, get-id, discard and write-zeroes; a
//!   read-only image (`readonly=on`) offers `VIRTIO_BLK_F_RO` and fails
//!   writes, discards and write-zeroes with `IOERR`.
//! * Several queues (`VIRTIO_BLK_F_MQ`), all served by one worker thread.
//! * Durability: a write is acknowledged once the host's write call
//!   returned (the data is in the host's page cache: it survives the VMM
//!   being killed, not the host losing power); a flush is acknowledged
//!   once `fdatasync` returned, and covers every write acknowledged before
//!   the driver made the flush available (each engine's argument is in
//!   [`super::block_engine`]). The device offers `VIRTIO_BLK_F_FLUSH`, so
//!   the guest's filesystem issues flushes where it needs durability.
//! * The image is opened once and locked with `flock` (exclusive, or
//!   shared when read-only), as QEMU and Cloud Hypervisor do: a second VM
//!   cannot write an image another one uses.
//! * Requests are checked on the worker (chain shape, bounds, read-only)
//!   and then executed by the disk's engine (`engine=`,
//!   [`EngineKind`]): `sync`, `pread`/`pwrite`/`fdatasync` on the worker
//!   through a bounce buffer of at most [`MAX_CHUNK`] bytes; `pool`, a
//!   few host threads with `preadv`/`pwritev` into guest memory; or
//!   `io_uring`. Get-id, discard and write-zeroes stay on the worker.
//!   The default ([`EngineKind::default`]) is the measured choice of
//!   docs/devices.md, "Block engine: measured choice".
//!
//! A request that does not fit the image, or whose data is not whole
//! sectors, gets `IOERR`: that is the guest's I/O error, not a broken
//! driver. A chain with no 16-byte header or no status byte is a broken
//! driver: the device needs a reset.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_BLK_S_IOERR,
    VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

pub use super::disk::{Disk, DiskError, SECTOR};

use super::block_engine::{self, Completion, Engine, EngineKind, Io, IoVecs, Op};
use super::chain::{self, Buffer, Chain};
use super::worker::{QueueHandler, Worker};
use super::{features, Activation, Memory, VirtioDevice, VirtioInterrupt};
use crate::DeviceError;

/// The bounce buffer's size: the most bytes one `pread`/`pwrite` moves.
pub const MAX_CHUNK: usize = 1 << 20;
/// Queue size of each queue, unless [`Block::with_queue_size`] says
/// otherwise.
pub const QUEUE_SIZE: u16 = 256;
/// The smallest queue size [`Block::with_queue_size`] takes.
pub const MIN_QUEUE_SIZE: u16 = 4;
/// The largest: Kata asks for 1024 (its hotplugged and initdata disks).
pub const MAX_QUEUE_SIZE: u16 = 1024;
/// Most discard / write-zeroes segments per request.
const MAX_RANGES: u32 = 32;
/// Most sectors per discard / write-zeroes segment.
const MAX_RANGE_SECTORS: u32 = u32::MAX / SECTOR as u32;

/// Counters of a block device, for logs and benchmarks.
#[derive(Debug, Default)]
pub struct BlockStats {
    /// Requests completed.
    pub requests: AtomicU64,
    /// Bytes read from the image.
    pub read_bytes: AtomicU64,
    /// Bytes written to the image.
    pub written_bytes: AtomicU64,
    /// Flushes (fdatasync calls).
    pub flushes: AtomicU64,
    /// Requests answered with IOERR or UNSUPP.
    pub errors: AtomicU64,
}

/// The virtio-blk device.
#[derive(Debug)]
pub struct Block {
    disk: Arc<Disk>,
    queues: u16,
    engine: EngineKind,
    queue_size: u16,
    worker: Option<Worker>,
    stats: Arc<BlockStats>,
    name: String,
}

impl Block {
    /// A device over `disk` with `queues` queues (at least 1).
    pub fn new(name: &str, disk: Disk, queues: u16) -> Self {
        Self {
            disk: Arc::new(disk),
            queues: queues.max(1),
            engine: EngineKind::default(),
            queue_size: QUEUE_SIZE,
            worker: None,
            stats: Arc::default(),
            name: name.into(),
        }
    }

    /// The same device, its reads, writes and flushes served by `engine`.
    pub fn with_engine(mut self, engine: EngineKind) -> Self {
        self.engine = engine;
        self
    }

    /// The engine it was asked for.
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    /// The same device with queues of `size` entries (a power of two from
    /// [`MIN_QUEUE_SIZE`] to [`MAX_QUEUE_SIZE`]; anything else keeps
    /// [`QUEUE_SIZE`]: the caller checks what it was given).
    pub fn with_queue_size(mut self, size: u16) -> Self {
        if size.is_power_of_two() && (MIN_QUEUE_SIZE..=MAX_QUEUE_SIZE).contains(&size) {
            self.queue_size = size;
        }
        self
    }

    /// Most data segments per request (`seg_max`): a request's
    /// descriptors (header, segments, status) fit in one queue.
    fn seg_max(&self) -> u32 {
        u32::from(self.queue_size) - 2
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<BlockStats> {
        self.stats.clone()
    }

    /// The configuration space (struct virtio_blk_config), little endian.
    fn config(&self) -> [u8; 60] {
        let mut c = [0u8; 60];
        c[0..8].copy_from_slice(&self.disk.sectors().to_le_bytes());
        c[12..16].copy_from_slice(&self.seg_max().to_le_bytes());
        c[20..24].copy_from_slice(&(SECTOR as u32).to_le_bytes());
        c[34..36].copy_from_slice(&self.queues.to_le_bytes());
        c[36..40].copy_from_slice(&MAX_RANGE_SECTORS.to_le_bytes());
        c[40..44].copy_from_slice(&MAX_RANGES.to_le_bytes());
        c[44..48].copy_from_slice(&1u32.to_le_bytes());
        c[48..52].copy_from_slice(&MAX_RANGE_SECTORS.to_le_bytes());
        c[52..56].copy_from_slice(&MAX_RANGES.to_le_bytes());
        c[56] = 1; // write_zeroes_may_unmap
        c
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }
    fn pci_class(&self) -> u32 {
        // Mass storage, other.
        0x01_80_00
    }
    fn features(&self) -> u64 {
        let mut f = features::INDIRECT_DESC
            | features::EVENT_IDX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_MQ;
        if self.disk.readonly() {
            f |= 1 << VIRTIO_BLK_F_RO;
        } else {
            f |= 1 << VIRTIO_BLK_F_DISCARD | 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        }
        f
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![self.queue_size; self.queues.into()]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let c = self.config();
        for (i, b) in data.iter_mut().enumerate() {
            *b = c.get(offset as usize + i).copied().unwrap_or(0);
        }
    }
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.reset();
        let mut queues = Vec::new();
        let mut events = Vec::new();
        for q in a.queues {
            events.push((q.index, q.event));
            queues.push((q.index, q.queue, q.vector));
        }
        let engine = block_engine::start(
            self.engine,
            &self.name,
            &self.disk,
            &a.mem,
            block_engine::URING_DEPTH,
        )?;
        let handler = BlockQueues {
            disk: self.disk.clone(),
            mem: a.mem,
            queues,
            interrupt: a.interrupt.clone(),
            stats: self.stats.clone(),
            bounce: Vec::new(),
            engine,
            done: Vec::new(),
        };
        self.worker = Some(Worker::spawn_on(
            &self.name,
            handler,
            events,
            a.interrupt,
            a.io_cpus,
        )?);
        Ok(())
    }
    fn reset(&mut self) {
        if let Some(w) = self.worker.take() {
            w.stop();
        }
    }
}

/// Serves every request the driver made available on `queue` at once,
/// on the calling thread, with no worker and no interrupt: the request
/// path as the fuzz targets drive it over arbitrary guest memory. `Err`
/// is what makes the device need a reset.
pub fn serve_once(disk: &Arc<Disk>, mem: &Memory, queue: Queue) -> Result<(), String> {
    let mut h = BlockQueues {
        disk: disk.clone(),
        mem: mem.clone(),
        queues: vec![(0, queue, super::NO_VECTOR)],
        interrupt: Arc::new(VirtioInterrupt::standalone("blk-serve-once")),
        stats: Arc::default(),
        bounce: Vec::new(),
        engine: None,
        done: Vec::new(),
    };
    h.process(0)
}

struct BlockQueues {
    disk: Arc<Disk>,
    mem: Memory,
    queues: Vec<(usize, Queue, u16)>,
    interrupt: Arc<VirtioInterrupt>,
    stats: Arc<BlockStats>,
    bounce: Vec<u8>,
    /// Reads, writes and flushes go here when given (`pool`, `io_uring`);
    /// `None`: served on this thread (`sync`). Dropped with the handler,
    /// when the worker stops: that waits for its requests in flight.
    engine: Option<Box<dyn Engine>>,
    /// Completions being turned into used entries.
    done: Vec<Completion>,
}

/// A request's outcome: the status byte and the bytes written to the
/// guest (data and status).
struct Done {
    head: u16,
    status: u8,
    written: u32,
}

impl QueueHandler for BlockQueues {
    fn process(&mut self, index: usize) -> Result<(), String> {
        let Some(slot) = self.queues.iter().position(|q| q.0 == index) else {
            return Ok(());
        };
        // The queue leaves its slot while its requests are served (they
        // need the rest of `self`), and goes back whatever happens.
        let mut q = std::mem::take(&mut self.queues[slot].1);
        let mem = self.mem.clone();
        let r = chain::drain_some(&mut q, &mem, |c| {
            let Some(done) = self.request(slot, c)? else {
                return Ok(None);
            };
            self.count(&done);
            Ok(Some(done.written))
        });
        if let Some(e) = self.engine.as_mut() {
            e.kick();
        }
        let notify =
            r.and_then(|used| Ok(used && q.needs_notification(&mem).map_err(|e| e.to_string())?));
        self.queues[slot].1 = q;
        if notify? {
            self.interrupt.signal_queue(self.queues[slot].2);
        }
        Ok(())
    }

    fn host_fds(&self) -> Vec<RawFd> {
        self.engine.iter().map(|e| e.fd()).collect()
    }

    /// The engine has completions: each gets its status byte and its
    /// used entry, in the order they finished; then each queue that got
    /// some is signalled once.
    fn host_ready(&mut self, _k: usize) -> Result<(), String> {
        let Some(engine) = self.engine.as_mut() else {
            return Ok(());
        };
        let mut done = std::mem::take(&mut self.done);
        engine.reap(&mut done);
        let mut touched = vec![false; self.queues.len()];
        for c in done.drain(..) {
            let slot = c.io.slot;
            let d = self.complete(c)?;
            self.count(&d);
            let (_, q, _) = &mut self.queues[slot];
            q.add_used(&self.mem, d.head, d.written)
                .map_err(|e| e.to_string())?;
            touched[slot] = true;
        }
        self.done = done;
        for (slot, _) in touched.iter().enumerate().filter(|t| *t.1) {
            let (_, q, vector) = &mut self.queues[slot];
            self.interrupt.signal_used(q, &self.mem, *vector)?;
        }
        Ok(())
    }
}

/// The request header (struct virtio_blk_outhdr).
struct Header {
    kind: u32,
    sector: u64,
}

impl BlockQueues {
    fn count(&self, d: &Done) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if d.status != VIRTIO_BLK_S_OK as u8 {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Serves one chain of queue `slot`, or hands it to the engine
    /// (`None`: it completes later). `Err` only for a chain no driver
    /// would send.
    fn request(&mut self, slot: usize, c: &Chain) -> Result<Option<Done>, String> {
        let (hdr, data_in, data_out, status_buf) = split(c, &self.mem)?;
        if self.engine.is_some() {
            match self.prepare(&hdr, &data_in, &data_out) {
                Ok(Some(op)) => {
                    let io = Io {
                        slot,
                        head: c.head,
                        status: status_addr(status_buf),
                        len: op.1,
                        op: op.0,
                    };
                    if let Some(e) = self.engine.as_mut() {
                        e.submit(io);
                    }
                    return Ok(None);
                }
                Ok(None) => {}
                Err(st) => {
                    return self
                        .finish(c.head, status_addr(status_buf), Err(st))
                        .map(Some)
                }
            }
        }
        let s = match hdr.kind {
            VIRTIO_BLK_T_IN => self.read(hdr.sector, &data_out),
            VIRTIO_BLK_T_OUT => self.write(hdr.sector, &data_in),
            VIRTIO_BLK_T_FLUSH => self.flush(),
            VIRTIO_BLK_T_GET_ID => self.get_id(&data_out),
            VIRTIO_BLK_T_DISCARD => self.ranges(&data_in, false),
            VIRTIO_BLK_T_WRITE_ZEROES => self.ranges(&data_in, true),
            _ => Err(VIRTIO_BLK_S_UNSUPP),
        };
        self.finish(c.head, status_addr(status_buf), s).map(Some)
    }

    /// Writes the status byte of the request at `head`: `s` is the data
    /// bytes written to the guest, or the error status.
    fn finish(
        &self,
        head: u16,
        status_at: GuestAddress,
        s: Result<u32, u32>,
    ) -> Result<Done, String> {
        let (status, data_written) = match s {
            Ok(n) => (VIRTIO_BLK_S_OK as u8, n),
            Err(st) => (st as u8, 0),
        };
        self.mem
            .write_obj(status, status_at)
            .map_err(|e| format!("writing the status byte: {e}"))?;
        Ok(Done {
            head,
            status,
            written: data_written.saturating_add(1),
        })
    }

    /// The engine's part of a request, checked exactly as the `sync` path
    /// checks it: `Some((op, data bytes))` for a read, a write or a flush
    /// of a writable image, `None` for what this thread serves itself,
    /// `Err(status)` for a request that fails before any I/O.
    fn prepare(
        &self,
        hdr: &Header,
        data_in: &[Buffer],
        data_out: &[Buffer],
    ) -> Result<Option<(Op, u32)>, u32> {
        let off = hdr.sector.wrapping_mul(SECTOR);
        let iov = |bufs: &[Buffer]| IoVecs::new(&self.mem, bufs).ok_or(VIRTIO_BLK_S_IOERR);
        Ok(match hdr.kind {
            VIRTIO_BLK_T_IN => {
                let len = self.extent(hdr.sector, data_out)?;
                Some((
                    Op::Read {
                        off,
                        iov: iov(data_out)?,
                    },
                    len as u32,
                ))
            }
            VIRTIO_BLK_T_OUT => {
                if self.disk.readonly() {
                    return Err(VIRTIO_BLK_S_IOERR);
                }
                let len = self.extent(hdr.sector, data_in)?;
                Some((
                    Op::Write {
                        off,
                        iov: iov(data_in)?,
                    },
                    len as u32,
                ))
            }
            VIRTIO_BLK_T_FLUSH if !self.disk.readonly() => Some((Op::Flush, 0)),
            _ => None,
        })
    }

    /// A request the engine finished: its status byte, stats and used
    /// length.
    fn complete(&mut self, c: Completion) -> Result<Done, String> {
        let io = c.io;
        let s = match (c.result, &io.op) {
            (Err(_), _) => Err(VIRTIO_BLK_S_IOERR),
            (Ok(()), Op::Read { .. }) => {
                self.stats
                    .read_bytes
                    .fetch_add(io.len.into(), Ordering::Relaxed);
                Ok(io.len)
            }
            (Ok(()), Op::Write { .. }) => {
                self.stats
                    .written_bytes
                    .fetch_add(io.len.into(), Ordering::Relaxed);
                Ok(0)
            }
            (Ok(()), Op::Flush) => {
                self.stats.flushes.fetch_add(1, Ordering::Relaxed);
                Ok(0)
            }
        };
        self.finish(io.head, io.status, s)
    }

    /// Checks that `bufs` hold whole sectors inside the image from
    /// `sector`; their total length.
    fn extent(&self, sector: u64, bufs: &[Buffer]) -> Result<u64, u32> {
        let len: u64 = bufs.iter().map(|b| u64::from(b.len)).sum();
        if len % SECTOR != 0 {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let end = sector.checked_add(len / SECTOR).ok_or(VIRTIO_BLK_S_IOERR)?;
        if end > self.disk.sectors() {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        Ok(len)
    }

    fn read(&mut self, sector: u64, bufs: &[Buffer]) -> Result<u32, u32> {
        let len = self.extent(sector, bufs)?;
        for (off, addr, n) in chunks(sector, bufs) {
            self.bounce.resize(n, 0);
            self.disk
                .file()
                .read_exact_at(&mut self.bounce, off)
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
            self.mem
                .write_slice(&self.bounce, addr)
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
        }
        self.stats.read_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(len as u32)
    }

    fn write(&mut self, sector: u64, bufs: &[Buffer]) -> Result<u32, u32> {
        if self.disk.readonly() {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let len = self.extent(sector, bufs)?;
        for (off, addr, n) in chunks(sector, bufs) {
            self.bounce.resize(n, 0);
            self.mem
                .read_slice(&mut self.bounce, addr)
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
            self.disk
                .file()
                .write_all_at(&self.bounce, off)
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
        }
        self.stats.written_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(0)
    }

    fn flush(&mut self) -> Result<u32, u32> {
        if !self.disk.readonly() {
            self.disk
                .file()
                .sync_data()
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
        }
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }

    fn get_id(&mut self, bufs: &[Buffer]) -> Result<u32, u32> {
        let Some(b) = bufs.first() else {
            return Err(VIRTIO_BLK_S_IOERR);
        };
        let n = (b.len as usize).min(self.disk.id().len());
        self.mem
            .write_slice(&self.disk.id()[..n], b.addr)
            .map_err(|_| VIRTIO_BLK_S_IOERR)?;
        Ok(n as u32)
    }

    /// Discard (`zero` false) or write zeroes over the segments in `bufs`
    /// (struct virtio_blk_discard_write_zeroes, 16 bytes each).
    fn ranges(&mut self, bufs: &[Buffer], zero: bool) -> Result<u32, u32> {
        if self.disk.readonly() {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let mut raw = Vec::new();
        for b in bufs {
            if raw.len() + b.len as usize > (MAX_RANGES as usize) * 16 {
                return Err(VIRTIO_BLK_S_IOERR);
            }
            let mut v = vec![0u8; b.len as usize];
            self.mem
                .read_slice(&mut v, b.addr)
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
            raw.extend(v);
        }
        if raw.is_empty() || raw.len() % 16 != 0 {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        for seg in raw.chunks_exact(16) {
            let sector = u64::from_le_bytes(seg[0..8].try_into().unwrap_or_default());
            let count = u32::from_le_bytes(seg[8..12].try_into().unwrap_or_default());
            let flags = u32::from_le_bytes(seg[12..16].try_into().unwrap_or_default());
            let end = sector
                .checked_add(u64::from(count))
                .filter(|&e| e <= self.disk.sectors())
                .ok_or(VIRTIO_BLK_S_IOERR)?;
            // Discard takes no flags; write-zeroes only "unmap" (bit 0).
            if (!zero && flags != 0) || (zero && flags & !1 != 0) {
                return Err(VIRTIO_BLK_S_UNSUPP);
            }
            let mode = if zero && flags & 1 == 0 {
                libc::FALLOC_FL_ZERO_RANGE
            } else {
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
            };
            let (off, len) = (
                (sector * SECTOR) as libc::off_t,
                ((end - sector) * SECTOR) as libc::off_t,
            );
            // SAFETY: fallocate on the image's descriptor, with a range
            // checked against the image's size above; no memory is passed.
            let r = unsafe { libc::fallocate(self.disk.file().as_raw_fd(), mode, off, len) };
            if r != 0 {
                if !zero {
                    // Discard is a hint: a filesystem without hole punching
                    // loses nothing by ignoring it.
                    continue;
                }
                self.zero_by_writing(off as u64, len as u64)?;
            }
        }
        Ok(0)
    }

    /// Write-zeroes where the host filesystem cannot zero a range itself.
    fn zero_by_writing(&mut self, mut off: u64, len: u64) -> Result<(), u32> {
        let end = off + len;
        self.bounce.clear();
        self.bounce.resize(MAX_CHUNK, 0);
        while off < end {
            let n = (end - off).min(MAX_CHUNK as u64) as usize;
            self.disk
                .file()
                .write_all_at(&self.bounce[..n], off)
                .map_err(|_| VIRTIO_BLK_S_IOERR)?;
            off += n as u64;
        }
        Ok(())
    }
}

fn status_addr(b: Buffer) -> GuestAddress {
    GuestAddress(b.addr.0 + u64::from(b.len) - 1)
}

/// The image offset, guest address and length of each piece of at most
/// [`MAX_CHUNK`] bytes that `bufs`, read or written from `sector` on, move.
fn chunks(sector: u64, bufs: &[Buffer]) -> impl Iterator<Item = (u64, GuestAddress, usize)> + '_ {
    let mut off = sector * SECTOR;
    bufs.iter().flat_map(move |b| {
        let start = off;
        off += u64::from(b.len);
        (0..u64::from(b.len)).step_by(MAX_CHUNK).map(move |done| {
            let n = (u64::from(b.len) - done).min(MAX_CHUNK as u64) as usize;
            (start + done, GuestAddress(b.addr.0 + done), n)
        })
    })
}

/// Splits a chain into header, device-readable data, device-writable data
/// and the status byte. The header is the first 16 readable bytes (in the
/// first buffer: Linux never splits it) and the status byte is the last
/// writable byte.
#[allow(clippy::type_complexity)]
fn split(c: &Chain, mem: &Memory) -> Result<(Header, Vec<Buffer>, Vec<Buffer>, Buffer), String> {
    let first = c
        .readable
        .first()
        .filter(|b| b.len >= 16)
        .ok_or("a request without a 16-byte header")?;
    let mut h = [0u8; 16];
    mem.read_slice(&mut h, first.addr)
        .map_err(|e| format!("reading the header: {e}"))?;
    let header = Header {
        kind: u32::from_le_bytes(h[0..4].try_into().unwrap_or_default()),
        sector: u64::from_le_bytes(h[8..16].try_into().unwrap_or_default()),
    };
    let status = *c
        .writable
        .last()
        .filter(|b| b.len >= 1)
        .ok_or("a request without a status byte")?;
    let mut data_in: Vec<Buffer> = Vec::new();
    if first.len > 16 {
        data_in.push(Buffer {
            addr: GuestAddress(first.addr.0 + 16),
            len: first.len - 16,
        });
    }
    data_in.extend_from_slice(&c.readable[1..]);
    let mut data_out: Vec<Buffer> = c.writable[..c.writable.len() - 1].to_vec();
    if status.len > 1 {
        data_out.push(Buffer {
            addr: status.addr,
            len: status.len - 1,
        });
    }
    Ok((header, data_in, data_out, status))
}
