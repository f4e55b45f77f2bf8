//! Finding a vCPU that has halted inside `KVM_RUN` the moment its worker
//! thread blocks, instead of at the halt poller's next round.
//!
//! WHAT: [`BlockWatch`] opens one software perf event per worker thread of
//! the M:N executor (`PERF_COUNT_SW_CONTEXT_SWITCHES`, a sample at every
//! switch-out, on a two-page ring) and runs one thread that waits on all
//! of them with `epoll`. When a worker leaves its CPU, the watcher looks
//! at the vCPU that worker has inside `KVM_RUN` ([`BlockWatch::entering`])
//! and, if KVM's `blocking` stat says the vCPU waits there (a guest `HLT`
//! with the in-kernel LAPIC), kicks it out, so the worker takes its
//! CPU back and runs another vCPU.
//!
//! WHY: a Linux guest's `HLT` does not exit to the VMM: KVM blocks the
//! thread in `KVM_RUN` until an interrupt comes. On 1:1 host threads that
//! is what should happen: the host kernel runs another vCPU thread on the
//! CPU within microseconds. Under M:N the blocked thread is the CPU's
//! worker, so the CPU sits idle until someone notices; the halt poller
//! notices within its period (1 ms), half a period on average. With four
//! 12-vCPU guests booting on two host CPUs the workers were idle a third
//! of the time while vCPUs waited for them, each halt holding a CPU for
//! about 0.5 ms (measured: `docs/results-vcpus.md`, "Linux boot").
//!
//! HOW: the host kernel says when a worker stops running: the context
//! switch event's sample wakes the watcher's `epoll_wait`. The watcher
//! runs at `SCHED_IDLE`, so its wakeups never preempt a worker (a worker
//! preempted would be one more switch-out to look at, and so on); it
//! runs when a CPU has nothing else to do, which is exactly when a
//! worker has blocked. A switch-out that was a preemption, a page fault
//! or a park finds the vCPU not blocking (or no vCPU inside) and costs a
//! `pread`. The halt poller keeps its rounds as the backstop (where perf
//! events are not permitted the watch is off and the poller does it all,
//! as before). Cf. KVM's own `halt_poll_ns`, which attacks the same cost
//! from the other side (spinning before blocking); the pool turns it off
//! for its VMs (a worker should run another vCPU, not spin).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::probe::BlockingStat;
use super::Kicker;

/// What the watcher needs of a vCPU inside `KVM_RUN`: whether it waits
/// there, and how to get it out.
pub struct HaltTarget {
    stat: BlockingStat,
    kicker: Kicker,
}

impl HaltTarget {
    /// For a vCPU with this `blocking` stat and kicker.
    pub fn new(stat: BlockingStat, kicker: Kicker) -> Self {
        Self { stat, kicker }
    }
}

/// One worker thread's event and the vCPU it runs, on lines of its own.
#[repr(align(128))]
struct Watched {
    ring: Option<SwitchRing>,
    /// The vCPU inside `KVM_RUN` on this worker (`None`: none).
    inside: Mutex<Option<Arc<HaltTarget>>>,
}

/// Counts of what the watch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchCounts {
    /// Worker switch-outs seen.
    pub switches: u64,
    /// vCPUs found waiting inside `KVM_RUN` and kicked.
    pub kicked: u64,
}

struct Shared {
    cpus: Box<[Watched]>,
    epoll: OwnedFd,
    /// Wakes the watcher to quit.
    quit_fd: OwnedFd,
    quit: AtomicBool,
    switches: AtomicU64,
    kicked: AtomicU64,
    /// The watcher's thread id (0 until it runs).
    watcher_tid: std::sync::atomic::AtomicU32,
}

/// See the module docs. Dropping it stops the watcher thread.
pub struct BlockWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for BlockWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockWatch")
            .field("workers", &self.shared.cpus.len())
            .finish()
    }
}

impl BlockWatch {
    /// Watches the worker threads `tids` (index = the executor's CPU).
    /// Fails (with the OS error) where the host does not let this process
    /// open perf events on its threads (`perf_event_paranoid` above 1
    /// without `CAP_PERFMON`) or has no software events.
    pub fn start(tids: &[u32]) -> std::io::Result<Self> {
        // SAFETY: epoll_create1 takes a flag and returns a new fd or -1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `ep` is a new fd owned from here on.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        // SAFETY: eventfd takes a count and flags and returns a new fd or -1.
        let q = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if q < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `q` is a new fd owned from here on.
        let quit_fd = unsafe { OwnedFd::from_raw_fd(q) };
        epoll_add(&epoll, quit_fd.as_raw_fd(), u64::MAX)?;
        let mut cpus = Vec::with_capacity(tids.len());
        for (i, &tid) in tids.iter().enumerate() {
            let ring = SwitchRing::open(tid)?;
            epoll_add(&epoll, ring.fd.as_raw_fd(), i as u64)?;
            cpus.push(Watched {
                ring: Some(ring),
                inside: Mutex::new(None),
            });
        }
        let shared = Arc::new(Shared {
            cpus: cpus.into(),
            epoll,
            quit_fd,
            quit: AtomicBool::new(false),
            switches: AtomicU64::new(0),
            kicked: AtomicU64::new(0),
            watcher_tid: std::sync::atomic::AtomicU32::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("block-watch".into())
            .spawn(move || s.run())?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The worker of CPU `cpu` is about to enter `KVM_RUN` for `target`.
    pub fn entering(&self, cpu: usize, target: &Arc<HaltTarget>) {
        if let Some(w) = self.shared.cpus.get(cpu) {
            *lock(&w.inside) = Some(target.clone());
        }
    }

    /// The worker of CPU `cpu` is out of `KVM_RUN` again.
    pub fn left(&self, cpu: usize) {
        if let Some(w) = self.shared.cpus.get(cpu) {
            lock(&w.inside).take();
        }
    }

    /// What it did so far.
    pub fn counts(&self) -> WatchCounts {
        WatchCounts {
            switches: self.shared.switches.load(Ordering::Relaxed),
            kicked: self.shared.kicked.load(Ordering::Relaxed),
        }
    }
}

impl Drop for BlockWatch {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        let _ = unsafe { libc::write(self.shared.quit_fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn run(&self) {
        self.watcher_tid
            .store(vcpu_sched::exec::current_tid(), Ordering::Release);
        // Never preempt a worker (see the module docs); a host that
        // refuses leaves it SCHED_OTHER, which still works.
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is this thread; `param` outlives the call.
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        while !self.quit.load(Ordering::Acquire) {
            // SAFETY: `events` is valid for 64 entries for the call.
            let n =
                unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), 64, 1000) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("block watch: epoll_wait failed; the halt poller carries on alone");
                return;
            }
            for e in &events[..n as usize] {
                let Some(w) = self.cpus.get(e.u64 as usize) else {
                    continue;
                };
                let Some(r) = &w.ring else {
                    continue;
                };
                if e.events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    // the worker thread has exited (its executor stopped
                    // before this watch was dropped): stop listening to
                    // it, or epoll would report the hang-up for ever
                    // SAFETY: removes an fd this watch registered.
                    unsafe {
                        libc::epoll_ctl(
                            self.epoll.as_raw_fd(),
                            libc::EPOLL_CTL_DEL,
                            r.fd.as_raw_fd(),
                            std::ptr::null_mut(),
                        );
                    }
                    continue;
                }
                r.drain();
                self.switches.fetch_add(1, Ordering::Relaxed);
                let t = lock(&w.inside).clone();
                if let Some(t) = t {
                    if t.stat.blocking() {
                        t.kicker.kick();
                        self.kicked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn epoll_add(ep: &OwnedFd, fd: i32, data: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: data,
    };
    // SAFETY: `ev` is valid for the call; both fds are open.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64
/// bytes), which is all a software counting event needs.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// The bit field (`disabled`, `inherit`, ... `exclude_kernel` ...).
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PAGE: usize = 4096;
/// The ring: the metadata page and one data page (512 eight-byte
/// sample headers; the watcher empties it at every wakeup).
const RING_BYTES: usize = 2 * PAGE;
/// Offsets of `data_head` and `data_tail` in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;

/// One thread's context-switch event with its sample ring.
struct SwitchRing {
    fd: OwnedFd,
    base: *mut u8,
}

// SAFETY: the mapping is shared memory owned by this value; only the
// watcher thread touches it (through `&self`, with atomics on the two
// words the kernel shares).
unsafe impl Send for SwitchRing {}
// SAFETY: as above.
unsafe impl Sync for SwitchRing {}

impl SwitchRing {
    fn open(tid: u32) -> std::io::Result<Self> {
        let attr = PerfEventAttr {
            type_: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_CONTEXT_SWITCHES,
            // a sample (a bare header: sample_type 0) at every switch,
            // and a wakeup for each
            sample_period: 1,
            wakeup_events: 1,
            ..Default::default()
        };
        // SAFETY: `attr` is a valid perf_event_attr of the size it says,
        // alive for the call; the kernel returns a new fd or -1.
        let raw = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                tid as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new fd owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // SAFETY: maps the event's ring (a fresh shared mapping of the fd);
        // checked for MAP_FAILED below and unmapped in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            base: base.cast(),
        })
    }

    /// Marks every sample read (the watcher needs only the wakeup).
    fn drain(&self) {
        // SAFETY: both words lie inside the mapped metadata page, 8-byte
        // aligned; the kernel writes data_head and reads data_tail
        // concurrently, hence atomics (acquire the head, release the tail,
        // as the perf ABI asks).
        unsafe {
            let head = &*self.base.add(DATA_HEAD).cast::<AtomicU64>();
            let tail = &*self.base.add(DATA_TAIL).cast::<AtomicU64>();
            tail.store(head.load(Ordering::Acquire), Ordering::Release);
        }
    }
}

impl Drop for SwitchRing {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping made in `open`, of RING_BYTES, not
        // used after this.
        unsafe {
            libc::munmap(self.base.cast(), RING_BYTES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attr_is_the_kernels_first_layout() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 64);
    }

    /// A thread that blocks is seen switching out (where this host lets
    /// us open the event; otherwise the error is what `start` returns).
    #[test]
    fn a_blocking_thread_wakes_the_watch() {
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(vcpu_sched::exec::current_tid()).unwrap();
            for _ in 0..20 {
                if go_rx.recv().is_err() {
                    break;
                }
            }
        });
        let tid = rx.recv().unwrap();
        let w = match BlockWatch::start(&[tid]) {
            Ok(w) => w,
            Err(e) => {
                // CI runs as root: there the watch must work
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "perf events refused under CI ({e}): the block watch cannot be tested"
                );
                eprintln!("perf events not permitted here ({e}): the watch stays off");
                drop(go_tx);
                t.join().unwrap();
                return;
            }
        };
        for _ in 0..20 {
            go_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while w.counts().switches < 10 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            w.counts().switches >= 10,
            "20 blocks of the thread, {} switch-outs seen",
            w.counts().switches
        );
        assert_eq!(w.counts().kicked, 0, "no vCPU inside: nothing to kick");
        drop(go_tx);
        t.join().unwrap();
        // the watched thread is gone: the watcher stops listening to it
        // instead of spinning on the hang-up
        let cpu0 = watcher_cpu_ns(&w);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let spent = watcher_cpu_ns(&w).saturating_sub(cpu0);
        assert!(
            spent < 100_000_000,
            "the watcher used {spent} ns of CPU in 300 ms after its thread exited"
        );
    }

    /// The watcher thread's CPU time so far (ns).
    fn watcher_cpu_ns(w: &BlockWatch) -> u64 {
        let tid = w.shared.watcher_tid.load(Ordering::Acquire);
        vcpu_sched::exec::thread_cpu_ns(tid).unwrap_or(0)
    }
}
