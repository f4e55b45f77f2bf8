//! virtio-blk's request engines: who executes a read, a write or a flush
//! once the worker has checked it.
//!
//! * `sync`: the worker itself, `pread`/`pwrite`/`fdatasync` through a
//!   bounce buffer (in `block.rs`; no engine object).
//! * `pool`: `Pool`, [`POOL_THREADS`] host threads; `preadv`/`pwritev`
//!   straight into guest memory, completions handed back through an
//!   eventfd the worker watches ([`QueueHandler::host_fds`]).
//! * `io_uring`: `Uring`, one ring per device; `readv`/`writev`/
//!   `fsync(DATASYNC)` straight into guest memory, the ring's registered
//!   eventfd given to the worker the same way.
//!
//! Every request reaches an engine already checked (chain shape, bounds,
//! read-only): an engine only moves bytes. The worker adds a used entry
//! when an engine reports the request done, so requests complete out of
//! order, which split virtqueues allow (virtio 1.2, 2.7.13).
//!
//! **Flushes.** The worker marks a write used only once its `pwritev` (or
//! its ring completion) has returned, that is once the data is in the
//! host's page cache. A flush the driver makes available after it saw a
//! write used therefore reaches its engine after that write completed,
//! and the `fdatasync` (or `IORING_OP_FSYNC` with `DATASYNC`) it runs
//! covers it. Writes still in flight when a flush is made available are
//! not covered, and need not be (the driver has not seen them complete);
//! so no engine orders requests (no `IOSQE_IO_DRAIN`).
//!
//! **Lifetime of guest memory.** An engine holds iovecs that point into
//! guest memory. Each engine keeps a clone of the guest memory (its
//! mappings are reference counted) and, when dropped (device reset, VMM
//! shutdown), waits for every request a host thread or the kernel is
//! executing; requests not yet started are dropped (cancelled) without
//! touching memory. Only then does the memory clone go.
//!
//! [`QueueHandler::host_fds`]: super::worker::QueueHandler::host_fds

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring};
use tracing::warn;
use vm_memory::{GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;

use super::chain::Buffer;
use super::disk::Disk;
use super::Memory;
use crate::DeviceError;

/// Host threads of a `pool` engine.
pub const POOL_THREADS: usize = 4;
/// Requests one io_uring may have in flight (its completion queue has
/// twice as many entries, so it never overflows).
pub(crate) const URING_DEPTH: u32 = 256;

/// Which engine serves a disk's reads, writes and flushes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// On the worker thread, synchronously.
    Sync,
    /// On a few host threads.
    Pool,
    /// Through io_uring (a thread pool if the host refuses io_uring).
    /// The default: the measured choice (docs/devices.md, "Block engine:
    /// measured choice": ahead of `sync` for writes at queue depth 32,
    /// behind it at depth 1, level on flushes and, within the noise, on
    /// reads; chosen for guests that keep requests in flight and for
    /// real disks, where `sync` overlaps nothing).
    #[default]
    IoUring,
    /// Tests only: holds requests until four are in flight, then executes
    /// them on the worker in reverse order (out-of-order completion, and
    /// requests still in flight at a reset, made deterministic).
    #[cfg(test)]
    Reverse,
}

impl EngineKind {
    /// The names an operator may give, for messages.
    pub const NAMES: &'static str = "sync, pool, io_uring";
    /// Every engine an operator may choose.
    pub const ALL: [EngineKind; 3] = [EngineKind::Sync, EngineKind::Pool, EngineKind::IoUring];
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineKind::Sync => "sync",
            EngineKind::Pool => "pool",
            EngineKind::IoUring => "io_uring",
            #[cfg(test)]
            EngineKind::Reverse => "reverse",
        })
    }
}

/// An engine name that is none of [`EngineKind::NAMES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("engine={0:?} is not a block engine: give one of {names}", names = EngineKind::NAMES)]
pub struct UnknownEngine(pub String);

impl std::str::FromStr for EngineKind {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(EngineKind::Sync),
            "pool" => Ok(EngineKind::Pool),
            "io_uring" => Ok(EngineKind::IoUring),
            _ => Err(UnknownEngine(s.to_string())),
        }
    }
}

/// Buffers in guest memory as the host's vectored I/O takes them.
pub(crate) struct IoVecs(Vec<libc::iovec>);

// SAFETY: the pointers lead into guest memory, which every engine keeps
// mapped (a clone of the `Memory`) until the request that holds them has
// completed. Guest memory is only ever accessed through volatile copies
// and the host's I/O calls, so a pointer moving to another thread creates
// no Rust reference that could alias.
unsafe impl Send for IoVecs {}

impl IoVecs {
    /// The host addresses of `bufs` (already checked to lie in guest
    /// memory; a buffer spanning two regions gives two iovecs).
    pub(crate) fn new(mem: &Memory, bufs: &[Buffer]) -> Option<Self> {
        let mut v = Vec::with_capacity(bufs.len());
        for b in bufs {
            for s in mem.get_slices(b.addr, b.len as usize) {
                let s = s.ok()?;
                v.push(libc::iovec {
                    iov_base: s.ptr_guard_mut().as_ptr().cast(),
                    iov_len: s.len(),
                });
            }
        }
        Some(Self(v))
    }

    /// Drops the first `n` bytes (after a short transfer), and the empty
    /// iovecs in front.
    fn advance(&mut self, mut n: usize) {
        let mut skip = 0;
        for v in &mut self.0 {
            let k = n.min(v.iov_len);
            v.iov_base = v.iov_base.cast::<u8>().wrapping_add(k).cast();
            v.iov_len -= k;
            n -= k;
            if v.iov_len > 0 {
                break;
            }
            skip += 1;
        }
        self.0.drain(..skip);
    }
}

/// What an engine executes.
pub(crate) enum Op {
    /// Image to guest.
    Read { off: u64, iov: IoVecs },
    /// Guest to image.
    Write { off: u64, iov: IoVecs },
    /// `fdatasync`.
    Flush,
}

/// A checked request handed to an engine.
pub(crate) struct Io {
    /// The queue's slot in the device's handler.
    pub(crate) slot: usize,
    /// The chain's head, for the used ring.
    pub(crate) head: u16,
    /// The status byte's guest address.
    pub(crate) status: GuestAddress,
    /// Data bytes moved when it succeeds.
    pub(crate) len: u32,
    pub(crate) op: Op,
}

/// A request an engine finished: `Ok` or the host's error.
pub(crate) struct Completion {
    pub(crate) io: Io,
    pub(crate) result: std::io::Result<()>,
}

/// What the device's worker needs of an engine. Dropping one waits for
/// every request it started (see the module docs).
pub(crate) trait Engine: Send {
    /// Takes `io` (started now, or queued).
    fn submit(&mut self, io: Io);
    /// Called once the worker has submitted what one notification
    /// brought: start anything batched.
    fn kick(&mut self) {}
    /// The eventfd that says completions are ready (edge-triggered: the
    /// worker calls [`reap`](Self::reap) until it has seen them all).
    fn fd(&self) -> RawFd;
    /// Moves every finished request to `out`.
    fn reap(&mut self, out: &mut Vec<Completion>);
}

/// Starts `kind`'s engine for `disk` (`None`: `sync`, the worker serves
/// itself). An io_uring the host refuses (the `io_uring_disabled` sysctl,
/// a seccomp filter, an old kernel) falls back to a thread pool, with a
/// warning. `uring_depth` is for tests (0 makes io_uring setup fail).
pub(crate) fn start(
    kind: EngineKind,
    name: &str,
    disk: &Arc<Disk>,
    mem: &Memory,
    uring_depth: u32,
) -> Result<Option<Box<dyn Engine>>, DeviceError> {
    Ok(match kind {
        EngineKind::Sync => None,
        EngineKind::Pool => Some(Box::new(Pool::new(name, disk, mem)?)),
        EngineKind::IoUring => match Uring::new(disk, mem, uring_depth) {
            Ok(u) => Some(Box::new(u)),
            Err(e) => {
                warn!(
                    device = name,
                    "io_uring unavailable ({e}); using the thread pool engine"
                );
                Some(Box::new(Pool::new(name, disk, mem)?))
            }
        },
        #[cfg(test)]
        EngineKind::Reverse => Some(Box::new(Reverse::new(disk)?)),
    })
}

fn host_err(what: &'static str) -> impl FnOnce(std::io::Error) -> DeviceError {
    move |source| DeviceError::Host {
        what: what.to_string(),
        source,
    }
}

/// Moves every byte of `iov` at `off` of `fd` (a short transfer goes on
/// where it stopped; end of file is an error: requests were checked to
/// fit the image).
fn transfer(fd: RawFd, write: bool, iov: &mut IoVecs, mut off: u64) -> std::io::Result<()> {
    loop {
        iov.advance(0);
        if iov.0.is_empty() {
            return Ok(());
        }
        let n = iov.0.len().min(libc::UIO_MAXIOV as usize) as libc::c_int;
        let at = off as libc::off_t;
        // SAFETY: `iov` holds `n` or more iovecs, each a range of guest
        // memory (checked when the chain was walked) that its engine keeps
        // mapped while the request runs; the kernel reads or writes only
        // those ranges.
        let r = unsafe {
            if write {
                libc::pwritev(fd, iov.0.as_ptr(), n, at)
            } else {
                libc::preadv(fd, iov.0.as_ptr(), n, at)
            }
        };
        match r {
            r if r < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            r => {
                iov.advance(r as usize);
                off += r as u64;
            }
        }
    }
}

/// Executes `op` on the calling thread.
fn execute(disk: &Disk, op: &mut Op) -> std::io::Result<()> {
    let fd = disk.file().as_raw_fd();
    match op {
        Op::Read { off, iov } => transfer(fd, false, iov, *off),
        Op::Write { off, iov } => transfer(fd, true, iov, *off),
        Op::Flush => disk.file().sync_data(),
    }
}

/// Jobs and the stop flag of a [`Pool`].
#[derive(Default)]
struct Jobs {
    queue: VecDeque<Io>,
    stop: bool,
}

struct PoolShared {
    jobs: Mutex<Jobs>,
    ready: Condvar,
    done: Mutex<Vec<Completion>>,
    event: EventFd,
    disk: Arc<Disk>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `pool` engine: [`POOL_THREADS`] threads take requests from one
/// queue and run them with `preadv`/`pwritev`/`fdatasync`.
pub(crate) struct Pool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
    /// Guest memory, mapped until every thread has been joined.
    _mem: Memory,
}

impl Pool {
    fn new(name: &str, disk: &Arc<Disk>, mem: &Memory) -> Result<Self, DeviceError> {
        let shared = Arc::new(PoolShared {
            jobs: Mutex::default(),
            ready: Condvar::new(),
            done: Mutex::default(),
            event: EventFd::new(libc::EFD_NONBLOCK).map_err(host_err("creating an eventfd"))?,
            disk: disk.clone(),
        });
        let mut pool = Self {
            shared,
            threads: Vec::new(),
            _mem: mem.clone(),
        };
        for i in 0..POOL_THREADS {
            let s = pool.shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-io{i}"))
                .spawn(move || pool_thread(&s))
                .map_err(host_err("starting a block I/O thread"))?;
            // On an error the threads started so far are joined by Drop.
            pool.threads.push(t);
        }
        Ok(pool)
    }
}

fn pool_thread(s: &PoolShared) {
    loop {
        let mut io = {
            let mut jobs = lock(&s.jobs);
            loop {
                if jobs.stop {
                    return;
                }
                if let Some(io) = jobs.queue.pop_front() {
                    break io;
                }
                jobs = s.ready.wait(jobs).unwrap_or_else(|e| e.into_inner());
            }
        };
        let result = execute(&s.disk, &mut io.op);
        lock(&s.done).push(Completion { io, result });
        if let Err(e) = s.event.write(1) {
            warn!("block I/O thread: signalling a completion: {e}");
        }
    }
}

impl Engine for Pool {
    fn submit(&mut self, io: Io) {
        lock(&self.shared.jobs).queue.push_back(io);
        self.shared.ready.notify_one();
    }
    fn fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }
    fn reap(&mut self, out: &mut Vec<Completion>) {
        // Read the counter first: a completion pushed after the swap below
        // writes it again, and the worker is woken again.
        let _ = self.shared.event.read();
        out.append(&mut lock(&self.shared.done));
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Requests not started are cancelled; those running finish before
        // their thread is joined, and only then does `_mem` go.
        let mut jobs = lock(&self.shared.jobs);
        jobs.stop = true;
        jobs.queue.clear();
        drop(jobs);
        self.shared.ready.notify_all();
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                warn!("a block I/O thread panicked");
            }
        }
    }
}

/// The `io_uring` engine: one ring, its completions signalled on an
/// eventfd registered with it.
pub(crate) struct Uring {
    ring: IoUring,
    event: EventFd,
    /// Requests in the ring, by `user_data`.
    slots: Vec<Option<Io>>,
    free: Vec<usize>,
    /// Requests waiting for a slot.
    backlog: VecDeque<Io>,
    /// Submission entries pushed since the last `io_uring_enter`.
    unsubmitted: usize,
    /// Requests run on the worker because the ring took no entry.
    inline: Vec<Completion>,
    disk: Arc<Disk>,
    /// Guest memory, mapped until the ring has no request left.
    mem: Memory,
}

impl Uring {
    fn new(disk: &Arc<Disk>, mem: &Memory, depth: u32) -> std::io::Result<Self> {
        let ring = IoUring::builder().setup_cqsize(depth * 2).build(depth)?;
        let event = EventFd::new(libc::EFD_NONBLOCK)?;
        ring.submitter().register_eventfd(event.as_raw_fd())?;
        Ok(Self {
            ring,
            event,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth as usize).rev().collect(),
            backlog: VecDeque::new(),
            unsubmitted: 0,
            inline: Vec::new(),
            disk: disk.clone(),
            mem: mem.clone(),
        })
    }

    /// Puts `io` into the ring as `slot`'s entry.
    fn push(&mut self, slot: usize, io: Io) {
        let fd = types::Fd(self.disk.file().as_raw_fd());
        let entry = match &io.op {
            Op::Read { off, iov } => opcode::Readv::new(fd, iov.0.as_ptr(), iov.0.len() as u32)
                .offset(*off)
                .build(),
            Op::Write { off, iov } => opcode::Writev::new(fd, iov.0.as_ptr(), iov.0.len() as u32)
                .offset(*off)
                .build(),
            Op::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        }
        .user_data(slot as u64);
        // The iovec array moves with `io` into its slot: its heap buffer
        // stays where the entry points until the completion.
        self.slots[slot] = Some(io);
        for attempt in 0..2 {
            // SAFETY: the entry's iovecs (and the guest memory they point
            // into) live in `self.slots[slot]` and `self.mem` until its
            // completion is reaped, or until Drop has waited for it.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.unsubmitted += 1;
                return;
            }
            if attempt == 0 {
                // The submission queue is full: hand it to the kernel.
                self.enter(0);
            }
        }
        // Still full (the kernel refuses entries): this one runs here.
        self.free.push(slot);
        if let Some(mut io) = self.slots[slot].take() {
            let result = execute(&self.disk, &mut io.op);
            self.inline.push(Completion { io, result });
            let _ = self.event.write(1);
        }
    }

    /// `io_uring_enter`: submits what was pushed, waiting for `want`
    /// completions. On an error the entries stay in the submission queue
    /// (`unsubmitted` too): the next kick, after the next completion or
    /// notification, tries again.
    fn enter(&mut self, want: usize) {
        loop {
            match self.ring.submitter().submit_and_wait(want) {
                Ok(_) => {
                    self.unsubmitted = 0;
                    return;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // The completion queue is full (cannot happen at this
                // ring's sizes): the worker reaps, then kicks again.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return,
                Err(e) => {
                    warn!("io_uring_enter: {e}");
                    return;
                }
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Takes every completion from the ring.
    fn take_completions(&mut self, out: &mut Vec<Completion>) {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, res) in cqes {
            let Some(mut io) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
                continue;
            };
            self.free.push(slot as usize);
            let result = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else {
                finish_short(&self.disk, &mut io, res as usize)
            };
            out.push(Completion { io, result });
        }
    }
}

/// A read or write the ring moved `n` bytes of: the rest, if any, on
/// this thread.
fn finish_short(disk: &Disk, io: &mut Io, n: usize) -> std::io::Result<()> {
    if matches!(io.op, Op::Flush) || n >= io.len as usize {
        return Ok(());
    }
    match &mut io.op {
        Op::Read { off, iov } | Op::Write { off, iov } => {
            iov.advance(n);
            *off += n as u64;
        }
        Op::Flush => {}
    }
    execute(disk, &mut io.op)
}

impl Engine for Uring {
    fn submit(&mut self, io: Io) {
        match self.free.pop() {
            Some(slot) => self.push(slot, io),
            None => self.backlog.push_back(io),
        }
    }
    fn kick(&mut self) {
        if self.unsubmitted > 0 {
            self.enter(0);
        }
    }
    fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }
    fn reap(&mut self, out: &mut Vec<Completion>) {
        let _ = self.event.read();
        out.append(&mut self.inline);
        self.take_completions(out);
        while let Some(slot) = self.free.last().copied() {
            let Some(io) = self.backlog.pop_front() else {
                break;
            };
            self.free.pop();
            self.push(slot, io);
        }
        self.kick();
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // Queued requests are cancelled; those in the ring are waited for
        // (the kernel may still write guest memory until it posts them).
        self.backlog.clear();
        let mut sink = Vec::new();
        while self.in_flight() > 0 {
            if let Err(e) = self.ring.submitter().submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // Cannot wait: keep guest memory mapped for ever rather
                // than let the kernel write into freed memory.
                warn!("io_uring: cannot wait for in-flight requests ({e}); keeping guest memory");
                std::mem::forget(self.mem.clone());
                return;
            }
            self.take_completions(&mut sink);
            sink.clear();
        }
    }
}

/// The test engine (see [`EngineKind::Reverse`]).
#[cfg(test)]
struct Reverse {
    held: Vec<Io>,
    done: Vec<Completion>,
    event: EventFd,
    disk: Arc<Disk>,
}

#[cfg(test)]
impl Reverse {
    fn new(disk: &Arc<Disk>) -> Result<Self, DeviceError> {
        Ok(Self {
            held: Vec::new(),
            done: Vec::new(),
            event: EventFd::new(libc::EFD_NONBLOCK).map_err(host_err("creating an eventfd"))?,
            disk: disk.clone(),
        })
    }
}

#[cfg(test)]
impl Engine for Reverse {
    fn submit(&mut self, io: Io) {
        self.held.push(io);
    }
    fn kick(&mut self) {
        if self.held.len() < 4 {
            return;
        }
        while let Some(mut io) = self.held.pop() {
            let result = execute(&self.disk, &mut io.op);
            self.done.push(Completion { io, result });
        }
        let _ = self.event.write(1);
    }
    fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }
    fn reap(&mut self, out: &mut Vec<Completion>) {
        let _ = self.event.read();
        out.append(&mut self.done);
    }
}
