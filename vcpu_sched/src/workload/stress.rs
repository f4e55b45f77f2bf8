//! `stress`: the invariant-checked stress mix. RT (FIFO and RR, priorities
//! 1..99) and fair tasks (several weights) in several groups, some pinned,
//! that compute, sleep on timers, wake each other, yield, and change their
//! own and each other's affinity; the runner adds and retires short-lived
//! tasks and reshuffles affinities from outside while it runs.
//!
//! Defaults: 3 tasks per CPU, at least 16 and at most 600 (so an emulated
//! `genoa-2s` runs 600). Metric: operations per second.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{Burst, Metric, Rng, Running, Tally, Window, WorkloadParams, WorkloadResult};
use crate::cpumask::CpuMask;
use crate::error::Result;
use crate::exec::{Action, Body, Cx, Spawner};
use crate::task::{GroupId, Policy, TaskId, TaskSpec};
use crate::tasks::lock;

struct Stress {
    w: Window,
    t: Tally,
    ids: Vec<AtomicU32>,
    ncpus: u32,
    period_ns: u64,
    burst_us: u64,
    groups: Vec<GroupId>,
    spawned: AtomicUsize,
    pokes: AtomicU64,
    extra: Mutex<Vec<TaskId>>,
    /// Operations of each long-lived body over the whole run.
    per_task_ops: Mutex<Vec<u64>>,
}

impl Running for Stress {
    fn window(&self) -> &Window {
        &self.w
    }

    fn poke(&self, ex: &dyn Spawner) {
        let k = self.pokes.fetch_add(1, Ordering::Relaxed);
        let mut rng = Rng::new(k + 77);
        // reshuffle a few affinities from outside the managed CPUs
        for _ in 0..8 {
            let i = rng.below(self.ids.len() as u64) as usize;
            let id = TaskId(self.ids[i].load(Ordering::Acquire));
            let _ = ex.set_affinity(id, &random_mask(&mut rng, self.ncpus));
        }
        // retire finished short-lived tasks, start new ones
        lock(&self.extra).retain(|id| ex.alive(*id));
        if lock(&self.extra).len() < 8 {
            let pol = random_policy(&mut rng);
            let g = self.groups[rng.below(self.groups.len() as u64) as usize];
            let n = self.spawned.fetch_add(1, Ordering::Relaxed);
            let body = ShortLived {
                burst_us: self.burst_us,
                rounds: 0,
                burst: None,
            };
            if let Ok(id) = ex.spawn(
                &TaskSpec::new(format!("short{n}")).policy(pol).group(g),
                Box::new(body),
            ) {
                lock(&self.extra).push(id);
            }
        }
    }

    fn finish(&self) -> WorkloadResult {
        let secs = self.w.len() as f64 / 1e9;
        let ops = self.t.count("ops") as f64;
        let mut extra = BTreeMap::new();
        for k in ["ops", "wakes", "affinity_changes", "yields", "sleeps"] {
            extra.insert(k.to_string(), self.t.count(k) as f64);
        }
        let per = lock(&self.per_task_ops);
        extra.insert(
            "tasks_without_progress".into(),
            per.iter().filter(|&&x| x == 0).count() as f64,
        );
        extra.insert("bodies_returned".into(), per.len() as f64);
        extra.insert(
            "min_task_ops".into(),
            per.iter().copied().min().unwrap_or(0) as f64,
        );
        drop(per);
        extra.insert(
            "short_lived_tasks".into(),
            self.spawned.load(Ordering::Relaxed) as f64,
        );
        WorkloadResult {
            metric: Metric {
                name: "ops_per_s".into(),
                unit: "ops/s".into(),
                value: if secs > 0.0 { ops / secs } else { 0.0 },
                higher_is_better: true,
            },
            extra,
            tasks: self.ids.len(),
        }
    }
}

fn random_policy(rng: &mut Rng) -> Policy {
    match rng.below(6) {
        0 => Policy::Fifo(rng.below(99) as u8 + 1),
        1 => Policy::Rr(rng.below(99) as u8 + 1),
        _ => Policy::Fair([256, 1024, 1024, 4096][rng.below(4) as usize]),
    }
}

fn random_mask(rng: &mut Rng, n: u32) -> CpuMask {
    match rng.below(4) {
        0 => CpuMask::first_n(n as usize),
        1 => CpuMask::single(rng.below(n as u64) as u32),
        _ => {
            let a = rng.below(n as u64) as u32;
            let len = 1 + rng.below(16.min(n as u64)) as u32;
            CpuMask::from_cpus((a..a + len).map(|c| c % n))
        }
    }
}

pub(super) fn start(p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    let n = ex.topology().num_cpus();
    let tasks = p.tasks.unwrap_or((3 * n).clamp(16, 600));
    let groups: Vec<GroupId> = (0..4)
        .map(|g| ex.create_group(&format!("stress{g}")))
        .collect::<Result<_>>()?;
    let me = Arc::new(Stress {
        w: Window::default(),
        t: Tally::default(),
        ids: (0..tasks).map(|_| AtomicU32::new(0)).collect(),
        ncpus: n as u32,
        period_ns: p.period_us.unwrap_or(300) * 1000,
        burst_us: p.burst_us.unwrap_or(10),
        groups: groups.clone(),
        spawned: AtomicUsize::new(0),
        pokes: AtomicU64::new(0),
        extra: Mutex::new(Vec::new()),
        per_task_ops: Mutex::new(Vec::new()),
    });
    let mut rng = Rng::new(12345);
    for i in 0..tasks {
        let pol = random_policy(&mut rng);
        let mut spec = TaskSpec::new(format!("stress{i}"))
            .policy(pol)
            .group(groups[i % groups.len()]);
        if rng.below(5) == 0 {
            spec = spec.affinity(random_mask(&mut rng, n as u32));
        }
        let body = Mix {
            m: me.clone(),
            rng: Rng::new(i as u64 + 1),
            op: None,
            counts: Counts::default(),
        };
        let id = ex.spawn(&spec, Box::new(body))?;
        me.ids[i].store(id.0, Ordering::Release);
    }
    Ok(me)
}

/// A short-lived task: 20 rounds of a burst and a 50 us sleep.
struct ShortLived {
    burst_us: u64,
    rounds: u32,
    burst: Option<Burst>,
}

impl Body for ShortLived {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        if cx.stopping() || self.rounds >= 20 {
            return Action::Exit;
        }
        let b = self.burst.get_or_insert_with(|| Burst::of(self.burst_us));
        if !b.run(cx) {
            return Action::Continue;
        }
        self.burst = None;
        self.rounds += 1;
        Action::Sleep(50_000)
    }
}

/// An operation of the mix in progress.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// Computing.
    Work(Burst),
    /// Sleeping until this time (wakes in between are absorbed).
    Sleep(u64),
}

/// What a mix task counted inside the window (and `all` ops, for
/// progress).
#[derive(Default)]
struct Counts {
    ops: u64,
    wakes: u64,
    aff: u64,
    yields: u64,
    sleeps: u64,
    all: u64,
}

/// A task of the mix: picks a random operation at a time.
struct Mix {
    m: Arc<Stress>,
    rng: Rng,
    op: Option<Op>,
    counts: Counts,
}

impl Body for Mix {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        loop {
            if cx.stopping() {
                self.publish();
                return Action::Exit;
            }
            match self.op.take() {
                Some(Op::Work(mut b)) => {
                    if !b.run(cx) {
                        self.op = Some(Op::Work(b));
                        return Action::Continue;
                    }
                }
                Some(Op::Sleep(until)) => {
                    let now = cx.now();
                    if now < until {
                        self.op = Some(Op::Sleep(until));
                        return Action::Sleep(until - now);
                    }
                }
                None => {
                    if let Some(a) = self.next_op(cx) {
                        return a;
                    }
                }
            }
        }
    }
}

impl Mix {
    /// Starts a random operation: one that goes on across entries is left
    /// in `op`; one that hands the CPU back returns its action.
    fn next_op(&mut self, cx: &Cx<'_>) -> Option<Action> {
        let m = &*self.m;
        let c = &mut self.counts;
        let rng = &mut self.rng;
        c.all += 1;
        let inside = m.w.inside(cx.now()) as u64;
        c.ops += inside;
        match rng.below(10) {
            0..=2 => self.op = Some(Op::Work(Burst::of(1 + rng.below(m.burst_us)))),
            3..=5 => {
                let until = cx.now() + m.period_ns / 4 + rng.below(m.period_ns);
                self.op = Some(Op::Sleep(until));
                c.sleeps += inside;
            }
            6 | 7 => {
                let peer =
                    TaskId(m.ids[rng.below(m.ids.len() as u64) as usize].load(Ordering::Acquire));
                cx.wake(peer);
                c.wakes += inside;
                // and wait a little to be woken by someone (or the timer)
                return Some(Action::Sleep(m.period_ns / 2));
            }
            8 => {
                c.yields += inside;
                return Some(Action::Yield);
            }
            _ => {
                let target = if rng.below(2) == 0 {
                    cx.id()
                } else {
                    TaskId(m.ids[rng.below(m.ids.len() as u64) as usize].load(Ordering::Acquire))
                };
                let _ = cx.set_affinity(target, &random_mask(rng, m.ncpus));
                c.aff += inside;
            }
        }
        None
    }

    fn publish(&self) {
        let (m, c) = (&self.m, &self.counts);
        lock(&m.per_task_ops).push(c.all);
        m.t.publish(
            &[
                ("ops", c.ops),
                ("wakes", c.wakes),
                ("affinity_changes", c.aff),
                ("yields", c.yields),
                ("sleeps", c.sleeps),
            ],
            None,
        );
    }
}
