//! Synthetic task programs shaped like the seeds' benchmarks, run on any
//! executor ([`Spawner`]): each task is a [`Body`](crate::exec::Body), a
//! small state machine that computes, blocks, sleeps and wakes its peers,
//! so the same workload runs on the M:N workers, on one thread per task,
//! and on plain host threads (the host kernel's scheduler as the peer).
//!
//! | workload    | like                                   | metric                      |
//! |-------------|----------------------------------------|-----------------------------|
//! | `cyclic`    | `stress-ng --cyclic` (RT FIFO timers)  | p99 wakeup latency (lower)  |
//! | `messaging` | `hackbench --threads --pipe`           | messages/s (higher)         |
//! | `runq`      | `schbench` (short bursts, many wakeups)| requests/s (higher)         |
//! | `pingpong`  | netperf UDP_RR between pairs of tasks  | transactions/s (higher)     |
//! | `transcode` | N FFmpeg instances, 8 FIFO-99 threads pinned to 4 cores / 8 CPUs | frames/s (higher) |
//! | `stress`    | the invariant stress mix               | operations/s (higher)       |
//!
//! Bodies measure only inside a [`Window`] the runner opens after a
//! warm-up and closes at the end; they keep their counts and latency
//! histograms locally and publish them when they return, so measuring adds
//! no shared hot counter.
//!
//! Each step's compute is drawn by the rule every runner shares
//! ([`defs::step`]: uniform within +-25% of the workload's mean), from a
//! generator of the task's own, seeded by its place in the workload.
//!
//! Compute bursts are a fixed amount of work (a `Burst`), not a
//! wall-clock wait: on an emulated topology, where many logical CPUs share
//! one host CPU, a burst then takes as long as the CPU time it really
//! gets. A burst checks [`Cx::should_yield`] after every unit of work and
//! hands the CPU back when it says so: the body's preemption checkpoint.

pub mod cyclic;
pub mod defs;
pub mod messaging;
pub mod pingpong;
pub mod runq;
pub mod stress;
pub mod transcode;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::error::{Result, SchedError};
use crate::exec::{Cx, Spawner};
pub(crate) use crate::rng::Rng;
use crate::stats::Histogram;
use crate::tasks::lock;

/// Which workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// RT FIFO tasks on periodic timers.
    Cyclic,
    /// Groups of senders and receivers.
    Messaging,
    /// Short bursts hammering the runqueues.
    Runq,
    /// Pinned groups of 8 FIFO-99 tasks in compute bursts.
    Transcode,
    /// Pairs of tasks handing one request back and forth.
    Pingpong,
    /// The invariant stress mix (RT and fair, blocking, waking, affinity).
    Stress,
}

impl WorkloadKind {
    /// The seeds' four workloads.
    pub const SEEDS: [WorkloadKind; 4] = [
        WorkloadKind::Cyclic,
        WorkloadKind::Messaging,
        WorkloadKind::Runq,
        WorkloadKind::Transcode,
    ];

    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Cyclic => "cyclic",
            WorkloadKind::Messaging => "messaging",
            WorkloadKind::Runq => "runq",
            WorkloadKind::Transcode => "transcode",
            WorkloadKind::Pingpong => "pingpong",
            WorkloadKind::Stress => "stress",
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WorkloadKind {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self> {
        [
            WorkloadKind::Cyclic,
            WorkloadKind::Messaging,
            WorkloadKind::Runq,
            WorkloadKind::Transcode,
            WorkloadKind::Pingpong,
            WorkloadKind::Stress,
        ]
        .into_iter()
        .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
        .ok_or_else(|| {
            SchedError::Workload(format!(
                "unknown workload {s:?}; use cyclic, messaging, runq, transcode, pingpong or stress"
            ))
        })
    }
}

/// Knobs; `None` picks a default scaled to the topology (see each
/// workload's module).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadParams {
    /// Number of tasks (cyclic, stress) or workers per message task (runq).
    pub tasks: Option<usize>,
    /// Groups (messaging, pingpong), message tasks (runq), VMs (transcode).
    pub groups: Option<usize>,
    /// Senders and receivers per group (messaging), tasks per VM
    /// (transcode), tasks per group (pingpong: pairs of them).
    pub group_size: Option<usize>,
    /// Timer period in microseconds (cyclic, stress sleeps).
    pub period_us: Option<u64>,
    /// Compute per operation in microseconds of work.
    pub burst_us: Option<u64>,
    /// RT priority (cyclic, transcode).
    pub prio: Option<u8>,
}

/// A workload's headline number.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// What it is (`p99_wakeup_latency`, `messages_per_s`, ...).
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// The value.
    pub value: f64,
    /// Is bigger better?
    pub higher_is_better: bool,
}

/// What a workload measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    /// The headline number.
    pub metric: Metric,
    /// Further numbers (percentiles, rates, counts).
    pub extra: BTreeMap<String, f64>,
    /// Tasks the workload ran.
    pub tasks: usize,
}

/// The measurement window, on the executor's clock.
#[derive(Debug)]
pub struct Window {
    start: AtomicU64,
    end: AtomicU64,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            start: AtomicU64::new(u64::MAX),
            end: AtomicU64::new(u64::MAX),
        }
    }
}

impl Window {
    /// Starts measuring at `now`.
    pub fn open(&self, now: u64) {
        self.start.store(now, Ordering::Release);
    }
    /// Stops measuring at `now`.
    pub fn close(&self, now: u64) {
        self.end.store(now, Ordering::Release);
    }
    /// Is `t` inside the window?
    #[inline]
    pub fn inside(&self, t: u64) -> bool {
        t >= self.start.load(Ordering::Relaxed) && t < self.end.load(Ordering::Relaxed)
    }
    /// Length in ns (0 if not closed).
    pub fn len(&self) -> u64 {
        let (s, e) = (
            self.start.load(Ordering::Acquire),
            self.end.load(Ordering::Acquire),
        );
        if s == u64::MAX || e == u64::MAX {
            0
        } else {
            e.saturating_sub(s)
        }
    }
    /// Not yet measured anything?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What every body publishes when it returns.
#[derive(Default)]
pub struct Tally {
    /// Operations counted inside the window, per kind.
    pub counts: Mutex<BTreeMap<&'static str, u64>>,
    /// Latencies recorded inside the window.
    pub latency: Mutex<Histogram>,
}

impl Tally {
    /// Adds a body's local results.
    pub fn publish(&self, counts: &[(&'static str, u64)], lat: Option<&Histogram>) {
        let mut c = lock(&self.counts);
        for (k, v) in counts {
            *c.entry(k).or_insert(0) += v;
        }
        drop(c);
        if let Some(l) = lat {
            lock(&self.latency).merge(l);
        }
    }
    /// A published count.
    pub fn count(&self, k: &str) -> u64 {
        lock(&self.counts).get(k).copied().unwrap_or(0)
    }
}

/// A started workload.
pub trait Running: Send + Sync {
    /// The window its bodies measure in.
    fn window(&self) -> &Window;
    /// Called by the runner during the run, now and then, from a thread
    /// that is not a managed CPU (the stress workload changes affinities
    /// and spawns tasks from here).
    fn poke(&self, _ex: &dyn Spawner) {}
    /// The result, once every body has returned.
    fn finish(&self) -> WorkloadResult;
}

/// Spawns a workload's tasks on `ex`.
pub fn start(kind: WorkloadKind, p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    if p.prio.is_some_and(|x| !(1..=99).contains(&x)) {
        return Err(SchedError::Workload(format!(
            "RT priority {} is outside 1..=99",
            p.prio.unwrap_or(0)
        )));
    }
    for (what, v) in [
        ("tasks", p.tasks),
        ("groups", p.groups),
        ("group_size", p.group_size),
    ] {
        if v == Some(0) {
            return Err(SchedError::Workload(format!("{what} must be at least 1")));
        }
    }
    if p.period_us == Some(0) {
        return Err(SchedError::Workload("period_us must be at least 1".into()));
    }
    match kind {
        WorkloadKind::Cyclic => cyclic::start(p, ex),
        WorkloadKind::Messaging => messaging::start(p, ex),
        WorkloadKind::Runq => runq::start(p, ex),
        WorkloadKind::Transcode => transcode::start(p, ex),
        WorkloadKind::Pingpong => pingpong::start(p, ex),
        WorkloadKind::Stress => stress::start(p, ex),
    }
}

/// Nanoseconds one unit of work takes on this host, measured once per
/// process.
pub fn work_unit_ns() -> f64 {
    static NS: OnceLock<f64> = OnceLock::new();
    *NS.get_or_init(|| {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..20_000 {
                unit();
            }
            best = best.min(t.elapsed().as_nanos() as f64 / 20_000.0);
        }
        best.max(1.0)
    })
}

/// How many [`work`] units make `us` microseconds on this host.
fn units_for(us: u64) -> u64 {
    ((us as f64 * 1000.0) / work_unit_ns()).ceil() as u64
}

#[inline(never)]
fn unit() {
    let mut x = 0x9E37_79B9u64;
    for i in 0..64u64 {
        x = std::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x100_0000_01B3);
    }
    std::hint::black_box(x);
}

/// A compute burst of a fixed amount of work, `us` microseconds as
/// measured alone on this host, in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Burst {
    left: u64,
}

impl Burst {
    /// A burst of `us` microseconds of work.
    pub(crate) fn of(us: u64) -> Self {
        Self {
            left: units_for(us),
        }
    }

    /// One step of a workload whose steps compute `us` microseconds on
    /// average: drawn by the workloads' shared rule
    /// ([`defs::step`](defs::step)) from the task's generator `rng`.
    pub(crate) fn step(us: u64, rng: &mut Rng) -> Self {
        Self {
            left: defs::step(units_for(us), |n| rng.below(n)).max(1),
        }
    }

    /// Works until the burst is done (true) or the body should hand the
    /// CPU back first (false: return [`Action::Continue`](crate::exec::Action::Continue)
    /// and call again when entered next).
    pub(crate) fn run(&mut self, cx: &Cx<'_>) -> bool {
        while self.left > 0 {
            unit();
            self.left -= 1;
            if self.left > 0 && cx.should_yield() {
                return false;
            }
        }
        true
    }
}

/// A task's generator for its steps' compute ([`Burst::step`]), seeded
/// by where the task sits in its workload (`parts`: group, index, ...), so
/// that every task draws its own sequence, the same one every run.
pub(crate) fn task_rng(parts: &[u64]) -> Rng {
    Rng::new(parts.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &p| {
        (h ^ p).wrapping_mul(0x100_0000_01B3)
    }))
}

/// Latency extras (`p50_ns` ...) of a histogram.
pub(crate) fn latency_extras(h: &Histogram, prefix: &str, out: &mut BTreeMap<String, f64>) {
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)] {
        out.insert(format!("{prefix}{name}_ns"), h.quantile(q) as f64);
    }
    out.insert(format!("{prefix}max_ns"), h.max() as f64);
    out.insert(format!("{prefix}mean_ns"), h.mean());
    out.insert(format!("{prefix}samples"), h.count() as f64);
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        for k in WorkloadKind::SEEDS {
            assert_eq!(k.name().parse::<WorkloadKind>().unwrap(), k);
        }
        let e = "hackbench".parse::<WorkloadKind>().unwrap_err().to_string();
        assert!(
            e.contains("cyclic, messaging, runq, transcode, pingpong"),
            "{e}"
        );
    }

    #[test]
    fn window() {
        let w = Window::default();
        assert!(!w.inside(5));
        assert!(w.is_empty());
        w.open(10);
        assert!(w.inside(10) && w.inside(1 << 40));
        w.close(20);
        assert!(w.inside(19) && !w.inside(20) && !w.inside(9));
        assert_eq!(w.len(), 10);
    }

    #[test]
    fn work_unit_is_calibrated() {
        // The claim: `work(us)` runs `units_for(us)` units, which take `us`
        // microseconds alone on this host. Time them directly, best of ten
        // (noise only ever adds time), and allow a wide factor: the host is
        // shared and its clock speed varies; a wrong calibration (units of
        // the wrong size, ns taken for us) is off by 1000x.
        let ns = work_unit_ns();
        assert!(ns >= 1.0 && ns.is_finite(), "{ns}");
        let us = 2_000;
        let units = units_for(us);
        assert_eq!(units, (us as f64 * 1000.0 / ns).ceil() as u64);
        // Under a loaded host a whole round can be slowed down; a few
        // rounds, and a factor of 10 either way (the calibration itself may
        // have run slow), still catch a unit of the wrong size.
        let mut ratios = Vec::new();
        for _ in 0..3 {
            let best = (0..10)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..units {
                        unit();
                    }
                    t.elapsed().as_nanos() as f64
                })
                .fold(f64::MAX, f64::min);
            let ratio = best / (us as f64 * 1000.0);
            if (0.1..=10.0).contains(&ratio) {
                return;
            }
            ratios.push(ratio);
        }
        panic!("{units} units of {ns:.1} ns missed a {us} us target: time/target {ratios:?}");
    }
}
