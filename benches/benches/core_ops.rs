//! The scheduler core's three entry points, whole: what one `wake`, one
//! `schedule` and one `tick` cost, each fix on and off, and where each
//! call's time goes (the memory accesses it makes). Issue 27's fourth
//! target: "criterion medians of wake, schedule and tick, each fix on and
//! off"; `scripts/core-ops.sh` runs this bench and the Linux reference
//! next to it (docs/results-scheduler.md "Per operation").
//!
//! The per-fix benches time the data structure a fix changes, under
//! contention; this one times the core's calls as an executor makes
//! them, single-threaded (uncontended: the floor of each call), on a
//! modelled 2-socket EPYC 9654 (`genoa-2s`, 384 CPUs) so that every
//! mask, vector and node array has its real size.
//!
//! The cycle one round plays, on 4 CPUs of one LLC, each with its own L2
//! (the "targets"), and a waker CPU in the same LLC with another L2:
//!
//! * `wake`: the waker wakes 16 tasks (one group, affinity: the 4
//!   targets), so placement searches 4 CPUs (fair: the idle search, fix
//!   4's masks; RT: cpupri, fix 1) and the wake crosses L2s (fix 5: a
//!   queued wakeup instead of taking the target's lock). Timed: the 16
//!   calls as one batch.
//! * `schedule`: every target blocks its current task and picks the next
//!   until it goes idle (drains its wake list, fix 5; pulls, fixes 2/3;
//!   goes idle, fix 4). Timed: all the calls as one batch, per call.
//! * `tick`: with a task current on every target, each target ticks 16
//!   times, 1 ms apart (time accounting, group load: fix 6). Timed: the
//!   ticks as one batch, per call.
//!
//! Two classes: `fair` (nice 0) and `rt` (FIFO 50). Variants: `none`,
//! `none-aa` (the same, a second rig: the A/A row), each fix alone,
//! `all`. Where the time goes: the same calls through
//! `vcpu_sched_sim`, the build whose sync layer reports every shared
//! access, counted per call by kind (loads, stores, read-modify-writes,
//! lock acquisitions) and by distinct cache lines. Under contention each
//! read-modify-write and lock on a line another CPU wrote is a line
//! transfer (tens of ns within a socket, over 100 ns across; see the
//! simulator's cost tables): the counts say which calls grow with
//! contention and which stay flat.
//!
//! `cargo bench -p benches --bench core_ops`: criterion's groups
//! (`core_ops_<class>_<op>`), then two tables: the criterion medians with
//! their ratio to `none`, and the access counts.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};

/// Tasks woken per round.
const POOL: usize = 16;
/// Target CPUs per round.
const TARGETS: usize = 4;
/// The modelled host.
const TOPO: &str = "genoa-2s";
/// The tick period, as the executors tick.
const TICK_NS: u64 = 1_000_000;

/// The three calls.
const OPS: [&str; 3] = ["wake", "schedule", "tick"];
/// The two task classes.
const CLASSES: [&str; 2] = ["fair", "rt"];

/// What the recorder saw, summed over calls: loads, stores, RMWs, locks,
/// distinct lines per call (summed), calls.
type Counts = [u64; 6];

/// The rig, written once and built against both crates: `prod` (the
/// build `vmm` links, timed) and `sim` (the reporting build, counted).
macro_rules! rig {
    ($m:ident, $krate:ident, $start:path, $stop:path) => {
        mod $m {
            use std::hint::black_box;
            use std::sync::Arc;
            use std::time::{Duration, Instant};

            use super::{Counts, POOL, TARGETS, TICK_NS, TOPO};
            use $krate::{
                CpuMask, Fix, Mitigations, NoKick, Pick, Policy, Prev, SchedConfig, Scheduler,
                TaskId, TaskSpec, TopoMap,
            };

            /// The variants: none, its A/A twin (a second rig of the
            /// same build: the noise floor, placement in memory
            /// included), each fix alone, all.
            pub fn variants() -> Vec<(String, Mitigations)> {
                let mut v = vec![
                    ("none".to_string(), Mitigations::none()),
                    ("none-aa".to_string(), Mitigations::none()),
                ];
                for f in Fix::ALL {
                    v.push((f.name().to_string(), Mitigations::only(f)));
                }
                v.push(("all".to_string(), Mitigations::all()));
                v
            }

            pub struct Rig {
                s: Scheduler,
                tasks: Vec<TaskId>,
                targets: Vec<u32>,
                waker: u32,
                now: u64,
                /// Recorder totals per op (wake, schedule, tick).
                pub counts: [Counts; 3],
            }

            impl Rig {
                pub fn new(mit: Mitigations, rt: bool) -> Self {
                    let topo = Arc::new(::topology::load(TOPO).expect("preset"));
                    let map = TopoMap::new(&topo).expect("topology fits");
                    // 4 CPUs of LLC 0 on distinct L2s, and a waker on a fifth L2
                    let mut seen = Vec::new();
                    let mut cpus = Vec::new();
                    for &c in map.llc_cpus(0) {
                        if !seen.contains(&map.l2_of(c)) {
                            seen.push(map.l2_of(c));
                            cpus.push(c);
                        }
                    }
                    assert!(cpus.len() > TARGETS, "LLC 0 has too few L2s");
                    let targets = cpus[..TARGETS].to_vec();
                    let waker = cpus[TARGETS];
                    let s = Scheduler::new(topo, mit, SchedConfig::default(), Arc::new(NoKick))
                        .expect("scheduler");
                    let g = s.create_group("vm").expect("group");
                    let aff = CpuMask::from_cpus(targets.iter().copied());
                    let policy = if rt {
                        Policy::Fifo(50)
                    } else {
                        Policy::default()
                    };
                    let tasks = (0..POOL)
                        .map(|k| {
                            let spec = TaskSpec::new(format!("t{k}"))
                                .policy(policy)
                                .affinity(aff)
                                .group(g);
                            s.add_task(&spec, 0).expect("task")
                        })
                        .collect();
                    let mut r = Self {
                        s,
                        tasks,
                        targets,
                        waker,
                        now: 1_000,
                        counts: [[0; 6]; 3],
                    };
                    // warm-up: every line in this core's cache
                    for _ in 0..32 {
                        r.round(false);
                        r.tick_round(false, 4);
                    }
                    r.counts = [[0; 6]; 3];
                    r
                }

                fn step(&mut self) -> u64 {
                    self.now += 1_000;
                    self.now
                }

                fn rec<T>(&mut self, on: bool, op: usize, f: impl FnOnce(&Scheduler) -> T) -> T {
                    if on {
                        $start();
                    }
                    let v = f(&self.s);
                    if on {
                        let c = $stop();
                        for (t, x) in self.counts[op].iter_mut().zip(c) {
                            *t += x;
                        }
                    }
                    v
                }

                fn wake_all(&mut self, rec: bool) -> Duration {
                    let t0 = Instant::now();
                    for i in 0..POOL {
                        let (t, w, now) = (self.tasks[i], self.waker, self.step());
                        black_box(self.rec(rec, 0, |s| s.wake(t, Some(w), now).expect("wake")));
                    }
                    t0.elapsed()
                }

                /// Every target blocks and picks until idle: (time, calls).
                fn schedule_all(&mut self, rec: bool) -> (Duration, u64) {
                    let mut calls = 0;
                    let t0 = Instant::now();
                    for k in 0..TARGETS {
                        for _ in 0..=POOL {
                            let (cpu, now) = (self.targets[k], self.step());
                            calls += 1;
                            let p = self.rec(rec, 1, |s| {
                                s.schedule(cpu, Prev::Block, now).expect("schedule")
                            });
                            if black_box(p) == Pick::Idle {
                                break;
                            }
                        }
                    }
                    (t0.elapsed(), calls)
                }

                /// One round: wake all, schedule all. (wake time, schedule
                /// time, schedule calls).
                pub fn round(&mut self, rec: bool) -> (Duration, Duration, u64) {
                    let w = self.wake_all(rec);
                    let (s, n) = self.schedule_all(rec);
                    (w, s, n)
                }

                /// Wake all, make each target run a task, tick each target
                /// `per` times 1 ms apart (timed), then drain untimed.
                pub fn tick_round(&mut self, rec: bool, per: u64) -> (Duration, u64) {
                    self.wake_all(false);
                    for k in 0..TARGETS {
                        let (cpu, now) = (self.targets[k], self.step());
                        self.s.schedule(cpu, Prev::Keep, now).expect("schedule");
                    }
                    let base = self.now;
                    self.now += per * TICK_NS;
                    let t0 = Instant::now();
                    for i in 0..per {
                        for k in 0..TARGETS {
                            let cpu = self.targets[k];
                            let now = base + i * TICK_NS + k as u64;
                            self.rec(rec, 2, |s| s.tick(cpu, now).expect("tick"));
                        }
                    }
                    let d = t0.elapsed();
                    self.schedule_all(false);
                    (d, per * TARGETS as u64)
                }

                /// Time of `n` calls of `op` (0 wake, 1 schedule, 2 tick),
                /// in whole rounds, scaled to `n`. (The simulator's build
                /// is only counted, never timed.)
                #[allow(dead_code)]
                pub fn time(&mut self, op: usize, n: u64) -> Duration {
                    let (mut total, mut done) = (Duration::ZERO, 0u64);
                    while done < n.max(1) {
                        let (d, calls) = match op {
                            0 => (self.round(false).0, POOL as u64),
                            1 => {
                                let (_, d, c) = self.round(false);
                                (d, c)
                            }
                            _ => self.tick_round(false, POOL as u64),
                        };
                        total += d;
                        done += calls;
                    }
                    total.mul_f64(n as f64 / done as f64)
                }
            }
        }
    };
}

/// The production build has no recorder.
fn no_start() {}
fn no_stop() -> Counts {
    [0; 6]
}

/// One recorded call of the simulator's build, summarised.
fn sim_start() {
    vcpu_sched_sim::sync::recorder::start();
}
fn sim_stop() -> Counts {
    use vcpu_sched_sim::sync::recorder::{self, Kind};
    let mut buf = Vec::new();
    recorder::stop_into(&mut buf);
    let mut c = [0u64; 6];
    let mut lines: Vec<u64> = buf.iter().map(|a| a.addr / 64).collect();
    lines.sort_unstable();
    lines.dedup();
    for a in &buf {
        match a.kind {
            Kind::Load => c[0] += 1,
            Kind::Store | Kind::StoreSeqCst => c[1] += 1,
            Kind::Rmw => c[2] += 1,
            Kind::Lock => c[3] += 1,
            Kind::Unlock => {}
        }
    }
    c[4] = lines.len() as u64;
    c[5] = 1;
    c
}

rig!(prod, vcpu_sched, crate::no_start, crate::no_stop);
rig!(sim, vcpu_sched_sim, crate::sim_start, crate::sim_stop);

fn bench(c: &mut Criterion) {
    for (ci, class) in CLASSES.iter().enumerate() {
        let variants = prod::variants();
        let mut rigs: Vec<_> = variants
            .iter()
            .map(|(_, m)| prod::Rig::new(*m, ci == 1))
            .collect();
        for (op, name) in OPS.iter().enumerate() {
            let mut g = c.benchmark_group(format!("core_ops_{class}_{name}"));
            for ((v, _), r) in variants.iter().zip(rigs.iter_mut()) {
                g.bench_function(BenchmarkId::from_parameter(v), |b| {
                    b.iter_custom(|iters| r.time(op, iters))
                });
            }
            g.finish();
        }
    }
    tables();
}

/// criterion's output directory: `CRITERION_HOME`, else
/// `$CARGO_TARGET_DIR/criterion`, else the one next to this executable's
/// profile directory (`target/release/deps/core_ops-*`).
fn criterion_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return Some(PathBuf::from(h));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(t).join("criterion"));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.join("criterion"))
}

/// criterion's median of one benchmark, with its 95% interval, in ns.
fn median(group: &str, variant: &str) -> Option<(f64, f64, f64)> {
    let p = criterion_dir()?
        .join(group)
        .join(variant)
        .join("new/estimates.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
    let m = &v["median"];
    Some((
        m["point_estimate"].as_f64()?,
        m["confidence_interval"]["lower_bound"].as_f64()?,
        m["confidence_interval"]["upper_bound"].as_f64()?,
    ))
}

/// The two tables: criterion's medians against `none`, and the accesses.
fn tables() {
    println!("\n### core_ops: criterion medians ({TOPO}, single-threaded, ns per call)\n");
    println!("| class | call | variant | median ns [95% CI] | vs none |");
    println!("|---|---|---|---:|---:|");
    for class in CLASSES {
        for op in OPS {
            let group = format!("core_ops_{class}_{op}");
            let base = median(&group, "none").map(|m| m.0);
            for (v, _) in prod::variants() {
                let Some((m, lo, hi)) = median(&group, &v) else {
                    continue;
                };
                let rel = base.map_or("-".into(), |b| format!("{:.2}x", m / b));
                println!("| {class} | {op} | {v} | {m:.0} [{lo:.0}-{hi:.0}] | {rel} |");
            }
        }
    }
    println!(
        "\n### core_ops: where each call goes (vcpu_sched_sim's recorder, mean accesses per call)\n"
    );
    println!("| class | call | variant | loads | stores | RMWs | locks | distinct lines |");
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    for (ci, class) in CLASSES.iter().enumerate() {
        for (v, m) in sim::variants() {
            let mut r = sim::Rig::new(m, ci == 1);
            for _ in 0..8 {
                r.round(true);
                r.tick_round(true, 4);
            }
            for (op, name) in OPS.iter().enumerate() {
                let c = r.counts[op];
                let n = c[5].max(1) as f64;
                let f = |x: u64| x as f64 / n;
                println!(
                    "| {class} | {name} | {v} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    f(c[0]),
                    f(c[1]),
                    f(c[2]),
                    f(c[3]),
                    f(c[4])
                );
            }
        }
    }
}

criterion::criterion_group! {
    name = suite;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion::criterion_main!(suite);
