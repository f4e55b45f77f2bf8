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
use crate::exec::CPU_OK;
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

/// How many independently locked heaps the timers are spread over.
const TIMER_SHARDS: usize = 16;

/// One shard of the timer heap, on lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct TimerShard(Mutex<BinaryHeap<Timer>>);

/// Sleep timers, fired by the clock thread.
///
/// Sharded by key: every worker arms a timer each time one of its vCPUs
/// sleeps, and with one lock for all of them the 1,000-vCPU soak found 67
/// of 480 workers asleep on it at once (a holder the host preempted held
/// up every other). The clock drains the due timers of every shard in one
/// pass and fires them in date order.
pub struct TimerQueue {
    shards: Box<[TimerShard]>,
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
            shards: (0..TIMER_SHARDS).map(|_| TimerShard::default()).collect(),
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
        lock(&self.shards[key % TIMER_SHARDS].0).push(Timer {
            at: std::cmp::Reverse(at),
            key,
            gen,
        });
        if at < self.next.load(Ordering::Acquire) {
            self.wake_clock();
        }
    }

    /// Moves every timer due at `now` into `out` as (date, key, gen),
    /// earliest first.
    fn drain_due(&self, now: u64, out: &mut Vec<(u64, usize, u64)>) {
        out.clear();
        for sh in self.shards.iter() {
            let mut q = lock(&sh.0);
            while q.peek().is_some_and(|t| t.at.0 <= now) {
                if let Some(t) = q.pop() {
                    out.push((t.at.0, t.key, t.gen));
                }
            }
        }
        out.sort_unstable();
    }

    fn first(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter_map(|sh| lock(&sh.0).peek().map(|t| t.at.0))
            .min()
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
    // Sleep timers are due at exact times: without this, a SCHED_OTHER
    // clock thread's park_timeout ends up to 50 us late (the default
    // timer slack), which `vmm bench --breakdown` showed as most of a
    // timer wakeup ("timer: due -> wake returned", p50 79 us).
    let _ = crate::os_thread::set_timer_slack(1);
    let tick = periods.tick.max(1);
    let mut next_tick = host.now() + tick;
    let mut next_check = periods.check.map(|i| host.now() + i);
    let mut due = Vec::new();
    loop {
        if host.quit() {
            return;
        }
        let now = host.now();
        if now >= next_tick {
            for c in 0..n {
                sched.tick(c, now).expect(CPU_OK);
            }
            next_tick += tick;
            if next_tick < now {
                next_tick = now + tick;
            }
        }
        timers.drain_due(now, &mut due);
        for &(_, key, gen) in due.iter() {
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

/// Runs the invariant checker every `interval` ns until
/// [`ClockHost::quit`], on the calling thread: its own thread, not the
/// clock's. A snapshot locks every runqueue; taken on the clock thread, the
/// ticks and sleep timers of every CPU waited for it, and with hundreds of
/// CPUs on a few host CPUs that took seconds (the 1,000-vCPU soak's
/// stalls). Here only the CPUs whose locks it holds wait.
pub fn run_checker(
    host: &dyn ClockHost,
    sched: &Scheduler,
    interval: u64,
    checker: &Mutex<Option<InvariantChecker>>,
) {
    let step = Duration::from_millis(10).min(Duration::from_nanos(interval.max(1)));
    let mut next = host.now() + interval;
    while !host.quit() {
        let now = host.now();
        if now < next {
            // short naps, so that a quit is seen soon
            std::thread::sleep(step.min(Duration::from_nanos(next - now)));
            continue;
        }
        if !host.stopping() {
            if let Some(c) = lock(checker).as_mut() {
                c.observe_live(sched, host.now(), &|cpu| host.liveness(cpu));
            }
        }
        next = host.now() + interval;
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
    schedstat_of(&format!("/proc/self/task/{tid}/schedstat")).map(|s| s.running_ns)
}

/// One host thread's scheduling as the host kernel's schedstat gives it:
/// the three fields of `/proc/.../schedstat` (Linux's
/// `Documentation/scheduler/sched-stats.rst`). What vcpu_sched's
/// `TaskStats` `running_ns`, `run_delay_ns` and `runs` are for its tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HostSchedstat {
    /// Time on a CPU, ns.
    pub running_ns: u64,
    /// Time runnable on a run queue, not running, ns.
    pub run_delay_ns: u64,
    /// Times it was switched in (the kernel's `pcount`: "timeslices run
    /// on this cpu"), after a wakeup or after a preemption.
    pub runs: u64,
}

/// A schedstat file (`/proc/thread-self/schedstat`,
/// `/proc/self/task/TID/schedstat`); `None` if it cannot be read.
pub(crate) fn schedstat_of(path: &str) -> Option<HostSchedstat> {
    let s = std::fs::read_to_string(path).ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some(HostSchedstat {
        running_ns: it.next()??,
        run_delay_ns: it.next()??,
        runs: it.next()??,
    })
}

/// The liveness of a runnable thread with kernel thread id `tid` (0: not
/// started yet, so it has had no host CPU); `Unknown` where its CPU time
/// cannot be read.
pub fn runnable_thread(tid: u32) -> Liveness {
    match tid {
        0 => Liveness::Runnable { cpu_ns: 0 },
        tid => thread_cpu_ns(tid).map_or(Liveness::Unknown, |cpu_ns| Liveness::Runnable { cpu_ns }),
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn timers_come_out_in_date_order_and_only_when_due() {
        let q = TimerQueue::new();
        q.add(30, 3, 0);
        q.add(10, 1, 7);
        q.add(20, 2, 0);
        // keys 1 and 17 share a shard, 2 and 3 have their own
        q.add(15, 17, 1);
        assert_eq!(q.first(), Some(10));
        let mut due = Vec::new();
        q.drain_due(5, &mut due);
        assert!(due.is_empty());
        q.drain_due(25, &mut due);
        assert_eq!(due, vec![(10, 1, 7), (15, 17, 1), (20, 2, 0)]);
        q.drain_due(25, &mut due);
        assert!(due.is_empty());
        assert_eq!(q.first(), Some(30));
    }

    /// A host whose clock counts how often it is read.
    struct Counting {
        epoch: std::time::Instant,
        reads: std::sync::atomic::AtomicU64,
        quit: std::sync::atomic::AtomicBool,
        stopping: bool,
        fired: Mutex<Vec<(usize, u64)>>,
    }

    impl ClockHost for Counting {
        fn now(&self) -> u64 {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.epoch.elapsed().as_nanos() as u64
        }
        fn quit(&self) -> bool {
            self.quit.load(Ordering::Acquire)
        }
        fn stopping(&self) -> bool {
            self.stopping
        }
        fn fire(&self, _: &Scheduler, key: usize, gen: u64, _: u64) {
            lock(&self.fired).push((key, gen));
        }
    }

    fn run_for(stopping: bool, ms: u64, timers: &TimerQueue) -> (u64, Vec<(usize, u64)>) {
        let topo = crate::topo::tests::hand_topo(1, 1, 2, 1);
        let sched = Scheduler::new(
            std::sync::Arc::new(topo),
            crate::Mitigations::none(),
            crate::SchedConfig::default(),
            std::sync::Arc::new(crate::sched::NoKick),
        )
        .unwrap();
        let host = Counting {
            epoch: std::time::Instant::now(),
            reads: Default::default(),
            quit: Default::default(),
            stopping,
            fired: Mutex::new(Vec::new()),
        };
        let checker = Mutex::new(Some(InvariantChecker::new(1_000_000_000)));
        let periods = ClockPeriods {
            tick: 1_000_000,
            check: Some(2_000_000),
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                timers.set_clock_thread(std::thread::current());
                run_clock(&host, &sched, timers, periods, &checker)
            });
            std::thread::sleep(Duration::from_millis(ms));
            host.quit.store(true, Ordering::Release);
            timers.wake_clock();
        });
        let fired = std::mem::take(&mut *lock(&host.fired));
        (host.reads.load(Ordering::Relaxed), fired)
    }

    /// The clock sleeps between dates, also while the executor stops (the
    /// check date once stayed in the past then, and the loop spun: at host
    /// SCHED_FIFO it starved its CPU's worker). Counts clock reads, not
    /// time: a 1 ms tick over 200 ms is a few hundred passes; a spinning
    /// loop makes hundreds of thousands.
    #[test]
    fn the_clock_sleeps_between_dates_also_while_stopping() {
        for stopping in [false, true] {
            let (reads, _) = run_for(stopping, 200, &TimerQueue::new());
            assert!(
                reads < 20_000,
                "stopping={stopping}: {reads} clock reads in 200 ms: the loop spins"
            );
        }
    }

    #[test]
    fn due_timers_fire_once_each_in_date_order() {
        let q = TimerQueue::new();
        q.add(30_000_000, 2, 9);
        q.add(5_000_000, 1, 3);
        let (_, fired) = run_for(false, 100, &q);
        assert_eq!(fired, vec![(1, 3), (2, 9)]);
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
