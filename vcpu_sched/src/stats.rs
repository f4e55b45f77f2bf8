//! Counters and histograms: per task (run delay, wake-to-run latency,
//! migrations, time in each state) and per CPU (what the scheduler did).
//!
//! Nothing here is a shared hot counter. A task's counters are written by
//! whichever CPU is handling that task at the time (under its runqueue lock
//! or its wake claim); a CPU's counters are written by code acting as that
//! CPU. Relaxed atomics only make the occasional concurrent reader sound.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Number of buckets of a [`Histogram`]: bucket `i` holds values in
/// `[2^i, 2^(i+1))` nanoseconds (bucket 0 holds 0 and 1), up to ~3 days.
pub const HIST_BUCKETS: usize = 48;

#[inline]
fn bucket_of(v: u64) -> usize {
    if v < 2 {
        0
    } else {
        (63 - v.leading_zeros() as usize).min(HIST_BUCKETS - 1)
    }
}

/// A log2 histogram of nanosecond values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Counts per bucket (see [`HIST_BUCKETS`]); may be shorter when the
    /// tail is empty.
    pub buckets: Vec<u64>,
}

impl Histogram {
    /// Adds one value.
    pub fn record(&mut self, v: u64) {
        let b = bucket_of(v);
        if self.buckets.len() <= b {
            self.buckets.resize(b + 1, 0);
        }
        self.buckets[b] += 1;
    }

    /// Adds every count of `o`.
    pub fn merge(&mut self, o: &Histogram) {
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize(o.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper bound of the bucket holding the `q` quantile (0..=1), so
    /// within a factor of 2 above the true value; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut acc = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            acc += c;
            if acc >= rank {
                return Some(if i == 0 { 1 } else { (1u64 << (i + 1)) - 1 });
            }
        }
        None
    }
}

/// A [`Histogram`] that one writer at a time updates while others may read.
pub(crate) struct AtomicHistogram {
    b: [AtomicU64; HIST_BUCKETS],
}

impl AtomicHistogram {
    pub(crate) fn new() -> Self {
        Self {
            b: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
    #[inline]
    pub(crate) fn record(&self, v: u64) {
        self.b[bucket_of(v)].fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> Histogram {
        let mut v: Vec<u64> = self.b.iter().map(|x| x.load(Ordering::Relaxed)).collect();
        while v.last() == Some(&0) {
            v.pop();
        }
        Histogram { buckets: v }
    }
    pub(crate) fn reset(&self) {
        for x in &self.b {
            x.store(0, Ordering::Relaxed);
        }
    }
}

/// One task's scheduling statistics.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TaskStats {
    /// The task's name.
    pub name: String,
    /// Times it was picked to run after not running.
    pub runs: u64,
    /// Times it was woken from blocked.
    pub wakeups: u64,
    /// Times it changed CPU.
    pub migrations: u64,
    /// Times it was switched out while still runnable (preempted, time
    /// slice, affinity change).
    pub preemptions: u64,
    /// Time blocked.
    pub blocked_ns: u64,
    /// Time between being woken and reaching a runqueue (wake lists).
    pub waking_ns: u64,
    /// Time waiting on a runqueue.
    pub queued_ns: u64,
    /// Time running.
    pub running_ns: u64,
    /// Time runnable but not running: `waking_ns + queued_ns` (Linux's
    /// schedstat run delay).
    pub run_delay_ns: u64,
    /// From wakeup to running, per wakeup.
    pub wake_to_run: Histogram,
}

macro_rules! cpu_counters {
    ($( $(#[$m:meta])* $f:ident ),* $(,)?) => {
        /// One CPU's counters of scheduler activity, alone on its lines,
        /// written by code acting as that CPU.
        #[repr(align(128))]
        #[derive(Default)]
        pub struct CpuStats {
            $( $(#[$m])* pub(crate) $f: AtomicU64, )*
        }

        /// Scheduler counters, summed over CPUs (or of one CPU).
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct SchedCounters {
            $( $(#[$m])* pub $f: u64, )*
        }

        impl CpuStats {
            /// A snapshot.
            pub fn snapshot(&self) -> SchedCounters {
                SchedCounters { $( $f: self.$f.load(Ordering::Relaxed), )* }
            }
        }

        impl SchedCounters {
            /// Adds `o` field by field.
            pub fn add(&mut self, o: &SchedCounters) {
                $( self.$f += o.$f; )*
            }
            /// `self - o` field by field (saturating), for intervals.
            pub fn since(&self, o: &SchedCounters) -> SchedCounters {
                SchedCounters { $( $f: self.$f.saturating_sub(o.$f), )* }
            }
            /// (name, value) pairs, for tables.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($f), self.$f), )*]
            }
        }
    };
}

cpu_counters! {
    /// Context switches (a different task, or idle, became current).
    switches,
    /// Times the CPU went idle.
    idle_entries,
    /// Wakeups the waker enqueued directly.
    wake_direct,
    /// Wakeups the waker queued on the target's wake list.
    wake_queued,
    /// Kicks sent because a wake list went from empty to non-empty.
    wake_kicks,
    /// Tasks taken off this CPU's wake list.
    wake_drained,
    /// Woken tasks forwarded because their affinity changed in flight.
    wake_forwarded,
    /// RT tasks pushed away from this CPU.
    rt_pushes,
    /// RT tasks pulled to this CPU.
    rt_pulls,
    /// Fair tasks taken from the shared runqueue.
    shared_pops,
    /// Stale shared-runqueue entries dropped.
    shared_stale,
    /// Fair tasks stolen from a busy CPU while idle.
    steals,
    /// Idle CPUs kicked to balance (nohz-style).
    balance_kicks,
    /// Preemption requests sent (need_resched plus a kick).
    resched_kicks,
    /// Group-load migrations that wrote a shared counter.
    group_load_writes,
    /// Group-load migrations that wrote nothing (fix 6, same node).
    group_load_skips,
    /// Ticks that took the slow path.
    ticks_slow,
}

/// Sub-buckets per power of two in a [`LatencyHistogram`] (relative error
/// below 1/16).
const LAT_SUB: usize = 16;
const LAT_OCTAVES: usize = 40;

/// A log-linear histogram for workload latencies: 16 buckets per power of
/// two from 16 ns to ~18 minutes, so percentiles are within ~6%. Cheap to
/// record into, mergeable, serialisable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    counts: Vec<u32>,
    n: u64,
    max: u64,
    sum: u128,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// Empty.
    pub fn new() -> Self {
        Self {
            counts: vec![0; LAT_SUB * LAT_OCTAVES],
            n: 0,
            max: 0,
            sum: 0,
        }
    }

    #[inline]
    fn index(v: u64) -> usize {
        if v < LAT_SUB as u64 {
            return v as usize;
        }
        let oct = 63 - v.leading_zeros() as usize; // >= 4
        let sub = ((v >> (oct - 4)) as usize) & (LAT_SUB - 1);
        ((oct - 3) * LAT_SUB + sub).min(LAT_SUB * LAT_OCTAVES - 1)
    }

    /// The smallest value of bucket `i`.
    fn lower(i: usize) -> u64 {
        if i < LAT_SUB {
            return i as u64;
        }
        let oct = i / LAT_SUB + 3;
        let sub = (i % LAT_SUB) as u64;
        (1u64 << oct) + (sub << (oct - 4))
    }

    /// Records one value (ns).
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] = self.counts[Self::index(v)].saturating_add(1);
        self.n += 1;
        self.max = self.max.max(v);
        self.sum += v as u128;
    }

    /// Adds `o`.
    pub fn merge(&mut self, o: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.n += o.n;
        self.max = self.max.max(o.max);
        self.sum += o.sum;
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Largest value.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean, 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The `q` quantile (0..=1): the middle of the bucket holding it,
    /// capped at the maximum (the top rank is the maximum); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        if rank >= self.n {
            return self.max;
        }
        let mut acc = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            acc += c as u64;
            if acc >= rank {
                let lo = Self::lower(i);
                let hi = Self::lower(i + 1);
                return (lo + (hi - lo) / 2).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn log2_histogram() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        for v in [0, 1, 2, 3, 1000, 1023, 1024] {
            h.record(v);
        }
        assert_eq!(h.count(), 7);
        assert_eq!(h.buckets[0], 2);
        assert_eq!(h.buckets[1], 2);
        assert_eq!(h.buckets[9], 2);
        assert_eq!(h.buckets[10], 1);
        assert_eq!(h.quantile(1.0), Some(2047));
        assert_eq!(h.quantile(0.0), Some(1));
        let mut g = Histogram::default();
        g.merge(&h);
        g.merge(&h);
        assert_eq!(g.count(), 14);
        h.record(u64::MAX);
        assert_eq!(h.buckets.len(), HIST_BUCKETS);
    }

    #[test]
    fn latency_histogram_is_accurate_to_a_sixteenth() {
        let mut h = LatencyHistogram::new();
        assert_eq!(h.quantile(0.99), 0);
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, want) in [(0.5, 500_000.0), (0.9, 900_000.0), (0.99, 990_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.07, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.max(), 1_000_000);
        assert!((h.mean() - 500_005.0).abs() < 1.0);
        let mut small = LatencyHistogram::new();
        for v in 0..16 {
            small.record(v);
        }
        assert_eq!(small.quantile(1.0), 15);
        let mut m = LatencyHistogram::new();
        m.merge(&h);
        m.merge(&small);
        assert_eq!(m.count(), 100_016);
        for i in 0..LAT_SUB * LAT_OCTAVES - 1 {
            assert!(LatencyHistogram::lower(i) < LatencyHistogram::lower(i + 1));
            assert_eq!(LatencyHistogram::index(LatencyHistogram::lower(i)), i);
        }
    }
}
