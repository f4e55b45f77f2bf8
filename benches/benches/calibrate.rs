//! Calibration of the simulator's instruction costs (`exec::sim::INSTR`):
//! the single-threaded, warm-cache time of each scheduler entry point the
//! simulator charges (`wake`, `schedule`, `tick`) on this machine, and the
//! accesses the simulator records for the same calls. The simulator
//! charges a call `instr + accesses x (L1 hit + per-access)` when every
//! line is a hit, so the instruction time that reproduces the measured
//! call is `measured - accesses x (L1 hit + per-access)`.
//!
//! The calls: CPU 0 of an 8-CPU, one-LLC topology, with every mitigation
//! set of the simulator's tables (none and all), a pool of tasks pinned
//! to CPU 0. One round wakes the pool's 32 tasks (`wake`) and then
//! schedules 32 times with `Prev::Block` (each blocks the running task
//! and picks the next queued one); `tick` runs with a task current, once
//! per 1 ms of virtual time as in the simulator. Virtual `now` advances
//! 1 us per wake or schedule. It links `vcpu_sched_sim`, the scheduler
//! built with the recorder: `cargo bench -p benches --bench calibrate`.
//! The criterion groups time each call kind; the table printed at the end
//! (medians of 200 rounds of the same calls) is what docs/simulator.md
//! quotes.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use vcpu_sched_sim::exec::sim::{CostTable, INSTR};
use vcpu_sched_sim::sync::recorder;
use vcpu_sched_sim::{
    CpuMask, Mitigations, NoKick, Prev, SchedConfig, Scheduler, TaskId, TaskSpec,
};

const POOL: usize = 32;
const TOPO: &str = "package:1 l3:1 l2:8 core:1 pu:1";
/// The simulator's tick period.
const TICK_NS: u64 = 1_000_000;

/// A scheduler with a pool of tasks pinned to CPU 0, and virtual time.
struct Rig {
    s: Scheduler,
    pool: Vec<TaskId>,
    now: u64,
}

impl Rig {
    fn new(mit: Mitigations) -> Self {
        let topo = Arc::new(topology::load(TOPO).expect("synthetic topology"));
        let s =
            Scheduler::new(topo, mit, SchedConfig::default(), Arc::new(NoKick)).expect("scheduler");
        let pool = (0..POOL)
            .map(|k| {
                s.add_task(
                    &TaskSpec::new(format!("t{k}")).affinity(CpuMask::single(0)),
                    0,
                )
                .expect("task")
            })
            .collect();
        let mut r = Self { s, pool, now: 1 };
        // warm up: a few rounds bring every line into this core's cache
        for _ in 0..64 {
            r.round();
        }
        r
    }

    /// Moves virtual time on by `ns`; returns where it was.
    fn advance(&mut self, ns: u64) -> u64 {
        let t = self.now;
        self.now += ns;
        t
    }

    fn tick_now(&mut self) -> u64 {
        self.now += 1_000;
        self.now
    }

    /// One round: 32 wakes, then 32 schedules. Returns the time of the
    /// 32 wakes and of the 32 schedules, each timed as one batch.
    fn round(&mut self) -> [Duration; 2] {
        let base = self.now;
        self.now += 2 * POOL as u64 * 1_000;
        let t0 = Instant::now();
        for (i, &t) in self.pool.iter().enumerate() {
            black_box(
                self.s
                    .wake(t, Some(0), base + i as u64 * 1_000)
                    .expect("wake"),
            );
        }
        let t1 = Instant::now();
        for i in 0..POOL as u64 {
            let now = base + (POOL as u64 + i) * 1_000;
            black_box(self.s.schedule(0, Prev::Block, now).expect("schedule"));
        }
        let t2 = Instant::now();
        [t1 - t0, t2 - t1]
    }

    /// The same round with the recorder on around each call: accesses per
    /// call, [wake, schedule].
    fn recorded_round(&mut self) -> [f64; 2] {
        let base = self.now;
        self.now += 2 * POOL as u64 * 1_000;
        let mut buf = Vec::new();
        let mut n = [0usize; 2];
        for (i, &t) in self.pool.iter().enumerate() {
            recorder::start();
            black_box(
                self.s
                    .wake(t, Some(0), base + i as u64 * 1_000)
                    .expect("wake"),
            );
            recorder::stop_into(&mut buf);
            n[0] += buf.len();
        }
        for i in 0..POOL as u64 {
            let now = base + (POOL as u64 + i) * 1_000;
            recorder::start();
            black_box(self.s.schedule(0, Prev::Block, now).expect("schedule"));
            recorder::stop_into(&mut buf);
            n[1] += buf.len();
        }
        n.map(|x| x as f64 / POOL as f64)
    }

    /// Makes a task current on CPU 0 for `tick`.
    fn with_current(&mut self) {
        let now = self.tick_now();
        let _ = self.s.wake(self.pool[0], Some(0), now);
        let now = self.tick_now();
        let _ = self.s.schedule(0, Prev::Keep, now);
    }
}

const KINDS: [&str; 3] = ["wake", "schedule", "tick"];

/// Time of `n` calls of kind `k` (0 wake, 1 schedule, 2 tick), run in
/// batches of 32 (whole rounds), scaled to `n`.
fn time_calls(r: &mut Rig, k: usize, n: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0u64;
    if k == 2 {
        r.with_current();
    }
    while done < n.max(1) {
        total += if k == 2 {
            // one tick per simulated tick period (1 ms), as the simulator
            // calls it: a tick that sees no time pass does next to nothing
            let now = r.advance(POOL as u64 * TICK_NS);
            let t0 = Instant::now();
            for i in 0..POOL as u64 {
                r.s.tick(0, now + i * TICK_NS).expect("tick");
            }
            t0.elapsed()
        } else {
            r.round()[k]
        };
        done += POOL as u64;
    }
    total.mul_f64(n as f64 / done as f64)
}

/// Accesses the recorder sees per call, [wake, schedule, tick].
fn accesses(r: &mut Rig) -> [f64; 3] {
    let [w, s] = r.recorded_round();
    r.with_current();
    let mut buf = Vec::new();
    let mut n = 0usize;
    let base = r.advance(POOL as u64 * TICK_NS);
    for i in 0..POOL as u64 {
        let now = base + i * TICK_NS;
        recorder::start();
        r.s.tick(0, now).expect("tick");
        recorder::stop_into(&mut buf);
        n += buf.len();
    }
    [w, s, n as f64 / POOL as f64]
}

fn bench(c: &mut Criterion) {
    let sets = [("none", Mitigations::none()), ("all", Mitigations::all())];
    let mut g = c.benchmark_group("calibrate");
    for (name, mit) in sets {
        let mut r = Rig::new(mit);
        for (k, kind) in KINDS.iter().enumerate() {
            g.bench_function(BenchmarkId::new(*kind, name), |b| {
                b.iter_custom(|iters| time_calls(&mut r, k, iters))
            });
        }
    }
    g.finish();

    // The derived table: medians of 200 rounds per call kind.
    let l1 = CostTable::for_preset("genoa-2s").map_or(1, |t| t.l1_hit_ns);
    println!(
        "\ninstruction-cost calibration ({TOPO}, CPU 0; L1 hit {l1} ns and {} ns per access \
         as in the simulator)",
        INSTR.per_access_ns
    );
    println!("| set | call | measured ns (median, p10-p90 of 200 rounds) | accesses per call | derived instr ns | INSTR now |");
    println!("|---|---|---|---|---|---|");
    for (name, mit) in sets {
        let mut r = Rig::new(mit);
        let acc = accesses(&mut r);
        for (k, kind) in KINDS.iter().enumerate() {
            let mut per: Vec<f64> = (0..200)
                .map(|_| time_calls(&mut r, k, POOL as u64).as_nanos() as f64 / POOL as f64)
                .collect();
            per.sort_by(f64::total_cmp);
            let (p10, med, p90) = (per[20], per[100], per[180]);
            let derived = med - acc[k] * (l1 + INSTR.per_access_ns) as f64;
            let now = [INSTR.wake_ns, INSTR.schedule_ns, INSTR.tick_ns][k];
            println!(
                "| {name} | {kind} | {med:.0} ({p10:.0}-{p90:.0}) | {:.1} | {derived:.0} | {now} |",
                acc[k]
            );
        }
    }
}

benches::bench_main!(bench);
