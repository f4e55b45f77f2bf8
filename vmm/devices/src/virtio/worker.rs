//! A device's I/O thread: waits on its queues' eventfds (which KVM
//! signals through ioeventfds when the driver notifies) and a stop
//! eventfd, and hands each notified queue to the device's
//! [`QueueHandler`].
//!
//! Each queue is served once when the thread starts too, in case the
//! driver made buffers available before `DRIVER_OK` (allowed; notifying
//! is not). When the handler reports a guest error the thread calls
//! [`VirtioInterrupt::fault`] and serves nothing more; it still drains
//! notifications until it is stopped, so the driver can reset the device.
//!
//! A device with a host side (a tap, a console's input) also names host
//! file descriptors ([`QueueHandler::host_fds`]). They are watched
//! edge-triggered: the handler reads each until it would block, or
//! remembers that it stopped early (no guest buffers) and goes on when
//! the driver next notifies the queue. Level-triggered, a tap with
//! packets and a guest with no buffers would spin the thread.

use std::cell::Cell;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use tracing::{debug, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::VirtioInterrupt;
use crate::DeviceError;

/// Wakeup stamps for the I/O path's breakdown (`vmm bench --breakdown`):
/// while on, every I/O thread notes when its `epoll_wait` last returned,
/// and code running on that thread (a device raising an interrupt, the
/// VMM's wake of the vCPU the interrupt is for) reads it back with
/// [`last_wakeup`]. Off (the default): no clock read, one relaxed load
/// per wakeup. Process-wide, as the breakdown is a benchmark's switch.
static STAMPS: AtomicBool = AtomicBool::new(false);

thread_local! {
    static WOKE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Turns the I/O threads' wakeup stamps on or off (see [`last_wakeup`]).
pub fn stamp_wakeups(on: bool) {
    STAMPS.store(on, Ordering::Relaxed);
}

/// On an I/O thread with stamps on: when its `epoll_wait` last returned,
/// that is when the thread was woken by what it now serves (a queue's
/// ioeventfd, or a host fd: a tap's packet, a block engine's
/// completions). `None` elsewhere, or with stamps off.
pub fn last_wakeup() -> Option<Instant> {
    WOKE.with(|w| w.get())
}

/// What a device does when a queue is notified.
pub trait QueueHandler: Send + 'static {
    /// Serves everything the driver made available on queue `index`.
    /// An `Err` is a guest error: the device needs a reset.
    fn process(&mut self, index: usize) -> Result<(), String>;

    /// Host file descriptors to watch too (asked once, at spawn).
    fn host_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Host fd `k` (of [`host_fds`](Self::host_fds)) became readable.
    /// An `Err` is a guest error, as for [`process`](Self::process).
    fn host_ready(&mut self, k: usize) -> Result<(), String> {
        let _ = k;
        Ok(())
    }
}

/// A running I/O thread.
#[derive(Debug)]
pub struct Worker {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

fn host_err(what: &str) -> impl FnOnce(std::io::Error) -> DeviceError + '_ {
    move |source| DeviceError::Host {
        what: what.to_string(),
        source,
    }
}

const STOP: u64 = u64::MAX;

impl Worker {
    /// Starts thread `name` serving `handler`; `events[i]` is queue
    /// `queues[i]`'s notification eventfd.
    pub fn spawn<H: QueueHandler>(
        name: &str,
        handler: H,
        queues: Vec<(usize, EventFd)>,
        interrupt: Arc<VirtioInterrupt>,
    ) -> Result<Self, DeviceError> {
        Self::spawn_on(name, handler, queues, interrupt, None)
    }

    /// As [`spawn`](Self::spawn), the thread restricted to host CPUs
    /// `cpus` (OS numbers) when given. A failed restriction is logged and
    /// the thread runs unrestricted (a CPU set the host no longer lets
    /// this process use must not stop the guest's I/O). Without `cpus`
    /// the thread may run on every CPU the process may (its main
    /// thread's set), not only on those of the thread that spawns it:
    /// that is the vCPU thread that wrote `DRIVER_OK`, often pinned to
    /// one host CPU (pinned vCPUs, or a `vcpu_sched` worker), whose
    /// affinity a new thread would otherwise inherit.
    pub fn spawn_on<H: QueueHandler>(
        name: &str,
        handler: H,
        queues: Vec<(usize, EventFd)>,
        interrupt: Arc<VirtioInterrupt>,
        cpus: Option<Arc<[usize]>>,
    ) -> Result<Self, DeviceError> {
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(host_err("creating an eventfd"))?;
        let epoll = Epoll::new().map_err(host_err("creating an epoll fd"))?;
        for (slot, (_, evt)) in queues.iter().enumerate() {
            epoll
                .ctl(
                    ControlOperation::Add,
                    evt.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, slot as u64),
                )
                .map_err(host_err("watching a queue eventfd"))?;
        }
        let host_fds = handler.host_fds();
        for (k, fd) in host_fds.iter().enumerate() {
            epoll
                .ctl(
                    ControlOperation::Add,
                    *fd,
                    EpollEvent::new(
                        EventSet::IN | EventSet::EDGE_TRIGGERED,
                        (queues.len() + k) as u64,
                    ),
                )
                .map_err(host_err("watching a host fd"))?;
        }
        epoll
            .ctl(
                ControlOperation::Add,
                stop.as_raw_fd(),
                EpollEvent::new(EventSet::IN, STOP),
            )
            .map_err(host_err("watching the stop eventfd"))?;
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || serve(handler, queues, host_fds, (epoll, interrupt, cpus)))
            .map_err(host_err("starting a virtio worker thread"))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.join();
    }

    fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            if let Err(e) = self.stop.write(1) {
                warn!("stopping a virtio worker: {e}");
            }
            if t.join().is_err() {
                warn!("a virtio worker thread panicked");
            }
        }
    }
}

/// The I/O thread's body: serve every queue once, then whatever its
/// eventfds and host fds signal, until the stop eventfd.
fn serve<H: QueueHandler>(
    mut handler: H,
    queues: Vec<(usize, EventFd)>,
    host_fds: Vec<RawFd>,
    (epoll, interrupt, cpus): (Epoll, Arc<VirtioInterrupt>, Option<Arc<[usize]>>),
) {
    match &cpus {
        Some(c) => {
            if let Err(e) = pin_current_thread(c) {
                warn!("virtio worker: keeping it on all CPUs: {e}");
            }
        }
        None => {
            if let Err(e) = unpin_current_thread() {
                debug!("virtio worker: keeping the spawning thread's CPUs: {e}");
            }
        }
    }
    let serve = |h: &mut H, index: usize| {
        if interrupt.faulted() {
            return;
        }
        if let Err(e) = h.process(index) {
            interrupt.fault(&format!("queue {index}: {e}"));
        }
    };
    for &(index, _) in &queues {
        serve(&mut handler, index);
    }
    let host_ready = |h: &mut H, k: usize| {
        if interrupt.faulted() {
            return;
        }
        if let Err(e) = h.host_ready(k) {
            interrupt.fault(&e);
        }
    };
    // Anything that arrived before the watch began.
    for k in 0..host_fds.len() {
        host_ready(&mut handler, k);
    }
    let mut events = vec![EpollEvent::default(); queues.len() + host_fds.len() + 1];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!("virtio worker: epoll_wait: {e}");
                return;
            }
        };
        if STAMPS.load(Ordering::Relaxed) {
            WOKE.with(|w| w.set(Some(Instant::now())));
        }
        for ev in &events[..n] {
            if ev.data() == STOP {
                debug!("virtio worker stopping");
                return;
            }
            let slot = ev.data() as usize;
            let Some((index, evt)) = queues.get(slot) else {
                host_ready(&mut handler, slot - queues.len());
                continue;
            };
            // Reading clears it; EAGAIN if another wakeup took it.
            let _ = evt.read();
            serve(&mut handler, *index);
        }
    }
}

/// Lets the calling thread run on the CPUs of the process's main thread
/// (the CPUs the process was started on, or its cgroup's).
fn unpin_current_thread() -> std::io::Result<()> {
    // SAFETY: sched_getaffinity fills the zeroed set (`size_of` bytes)
    // for the main thread (its tid is the pid); sched_setaffinity reads
    // it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(libc::getpid(), size, &mut set) != 0
            || libc::sched_setaffinity(0, size, &set) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Restricts the calling thread to `cpus` (OS CPU numbers).
fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside
    // it for numbers below CPU_SETSIZE (checked), and sched_setaffinity
    // reads `size_of` bytes of it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Reports the CPUs its thread may run on, each time it is asked.
    struct Affinity(mpsc::Sender<Vec<usize>>);

    impl QueueHandler for Affinity {
        fn process(&mut self, _index: usize) -> Result<(), String> {
            // SAFETY: sched_getaffinity fills the zeroed set for the
            // calling thread; CPU_ISSET reads inside it.
            let cpus = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect()
            };
            let _ = self.0.send(cpus);
            Ok(())
        }
    }

    #[test]
    fn an_io_thread_runs_on_the_cpus_it_is_given() {
        let (tx, rx) = mpsc::channel();
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let interrupt = Arc::new(VirtioInterrupt::standalone("affinity"));
        // Unrestricted first: whatever this process may use.
        let w = Worker::spawn(
            "t",
            Affinity(tx.clone()),
            vec![(0, evt.try_clone().unwrap())],
            interrupt.clone(),
        )
        .unwrap();
        let all = rx.recv().unwrap();
        w.stop();
        let one = *all.last().unwrap();
        let w = Worker::spawn_on(
            "t",
            Affinity(tx),
            vec![(0, evt)],
            interrupt,
            Some(vec![one].into()),
        )
        .unwrap();
        assert_eq!(rx.recv().unwrap(), vec![one]);
        w.stop();
    }

    /// Spawned from a thread pinned to one CPU (as a vCPU thread that
    /// writes `DRIVER_OK`), an unplaced I/O thread does not inherit that
    /// pin: it gets the process's CPUs.
    #[test]
    fn an_unplaced_io_thread_does_not_inherit_its_spawners_pin() {
        let (tx, rx) = mpsc::channel();
        let all = std::thread::spawn(|| {
            let (t, r) = mpsc::channel();
            Affinity(t).process(0).unwrap();
            r.recv().unwrap()
        })
        .join()
        .unwrap();
        let one = *all.last().unwrap();
        let w = std::thread::spawn(move || {
            pin_current_thread(&[one]).unwrap();
            let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            let interrupt = Arc::new(VirtioInterrupt::standalone("unplaced"));
            Worker::spawn("t", Affinity(tx), vec![(0, evt)], interrupt).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(rx.recv().unwrap(), all);
        w.stop();
    }
}
