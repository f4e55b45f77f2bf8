//! The clock thread every threaded executor runs: it ticks every CPU,
//! fires sleep timers and, when asked, runs the invariant checker.
//!
//! The executors differ in what a timer wakes (a task thread, a vCPU slot)
//! and in what they can say about their CPUs' threads; they say it through
//! [`ClockHost`]. The loop itself, with its date bookkeeping, is here once.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crate::check::{InvariantChecker, Liveness};
use crate::sched::Scheduler;
use crate::task::CpuId;
use crate::tasks::lock;

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    /// Reversed for a min-heap.
    at: std::cmp::Reverse<u64>,
    key: usize,
    gen: u64,
}

/// Sleep timers, fired by the clock thread.
pub struct TimerQueue {
    heap: Mutex<BinaryHeap<Timer>>,
    /// The date the clock thread sleeps until.
    next: AtomicU64,
    thread: OnceLock<Thread>,
}

impl Default for TimerQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl TimerQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self {
            heap: Mutex::new(BinaryHeap::new()),
            next: AtomicU64::new(0),
            thread: OnceLock::new(),
        }
    }

    /// Names the clock thread (to wake it for an earlier timer).
    pub fn set_clock_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    /// Wakes the clock thread (to stop, or to look again).
    pub fn wake_clock(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Arms a timer: at `at` the clock calls [`ClockHost::fire`] with `key`
    /// and `gen` (the host tells a cancelled timer by its generation).
    pub fn add(&self, at: u64, key: usize, gen: u64) {
        lock(&self.heap).push(Timer {
            at: std::cmp::Reverse(at),
            key,
            gen,
        });
        if at < self.next.load(Ordering::Acquire) {
            self.wake_clock();
        }
    }

    fn pop_due(&self, now: u64) -> Option<(usize, u64)> {
        let mut q = lock(&self.heap);
        match q.peek() {
            Some(t) if t.at.0 <= now => q.pop().map(|t| (t.key, t.gen)),
            _ => None,
        }
    }

    fn first(&self) -> Option<u64> {
        lock(&self.heap).peek().map(|t| t.at.0)
    }
}

/// What the clock needs from its executor.
pub trait ClockHost: Send + Sync {
    /// The executor's clock (ns).
    fn now(&self) -> u64;
    /// The clock thread returns.
    fn quit(&self) -> bool;
    /// The executor is stopping: no more snapshots (tasks are being torn
    /// down, so RT waits are expected).
    fn stopping(&self) -> bool;
    /// A timer armed with `key` and `gen` is due.
    fn fire(&self, sched: &Scheduler, key: usize, gen: u64, now: u64);
    /// What the thread that runs `cpu` is doing, for the checker (see
    /// [`Liveness`]); `Unknown` makes no excuses.
    fn liveness(&self, _cpu: CpuId) -> Liveness {
        Liveness::Unknown
    }
}

/// The clock's periods.
#[derive(Clone, Copy, Debug)]
pub struct ClockPeriods {
    /// Scheduler tick (ns).
    pub tick: u64,
    /// Invariant snapshots (ns), if checking.
    pub check: Option<u64>,
}

/// Runs the clock until [`ClockHost::quit`].
pub fn run_clock(
    host: &dyn ClockHost,
    sched: &Scheduler,
    timers: &TimerQueue,
    periods: ClockPeriods,
    checker: &Mutex<Option<InvariantChecker>>,
) {
    let n = sched.num_cpus() as u32;
    let tick = periods.tick.max(1);
    let mut next_tick = host.now() + tick;
    let mut next_check = periods.check.map(|i| host.now() + i);
    loop {
        if host.quit() {
            return;
        }
        let now = host.now();
        if now >= next_tick {
            for c in 0..n {
                sched.tick(c, now);
            }
            next_tick += tick;
            if next_tick < now {
                next_tick = now + tick;
            }
        }
        while let Some((key, gen)) = timers.pop_due(now) {
            host.fire(sched, key, gen, now);
        }
        if let (Some(nc), Some(iv)) = (next_check, periods.check) {
            if now >= nc {
                // No snapshots while stopping, but the date moves on: one
                // left in the past would make this loop spin, and at host
                // SCHED_FIFO starve the CPU's worker.
                if !host.stopping() {
                    if let Some(c) = lock(checker).as_mut() {
                        c.observe_live(sched, host.now(), &|cpu| host.liveness(cpu));
                    }
                }
                next_check = Some(host.now() + iv);
            }
        }
        let mut wake_at = next_tick;
        if let Some(t) = timers.first() {
            wake_at = wake_at.min(t);
        }
        if let Some(nc) = next_check {
            wake_at = wake_at.min(nc);
        }
        timers.next.store(wake_at, Ordering::Release);
        // a timer added after the peek above, before `next` was published
        let now = host.now();
        if timers.first().is_some_and(|t| t <= now) {
            continue;
        }
        if wake_at > now {
            std::thread::park_timeout(Duration::from_nanos(wake_at - now));
        }
    }
}

/// The calling thread's kernel thread id.
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Host CPU time thread `tid` of this process has received so far (ns),
/// from `/proc/self/task/TID/schedstat`; `None` where the kernel does not
/// say (no schedstat, or the thread is gone).
pub fn thread_cpu_ns(tid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn timers_come_out_in_date_order_and_only_when_due() {
        let q = TimerQueue::new();
        q.add(30, 3, 0);
        q.add(10, 1, 7);
        q.add(20, 2, 0);
        assert_eq!(q.first(), Some(10));
        assert_eq!(q.pop_due(5), None);
        assert_eq!(q.pop_due(25), Some((1, 7)));
        assert_eq!(q.pop_due(25), Some((2, 0)));
        assert_eq!(q.pop_due(25), None);
        assert_eq!(q.first(), Some(30));
    }

    #[test]
    fn this_threads_cpu_time_is_readable_and_grows() {
        let tid = current_tid();
        let Some(a) = thread_cpu_ns(tid) else {
            // a kernel without schedstat: the checker then makes no excuses
            return;
        };
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = thread_cpu_ns(tid).expect("readable once, readable again");
        assert!(b > a, "{a} -> {b}");
        assert_eq!(thread_cpu_ns(u32::MAX), None);
    }
}
