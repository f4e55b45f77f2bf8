//! `runq`: many short tasks hammering the runqueues, like `schbench`.
//!
//! M message tasks each own W workers. A message task stamps a request
//! for each of its workers and wakes them, then waits until all have
//! answered; a worker records its wakeup latency (request to running),
//! works for a short burst and answers. Every request is a wakeup, a run
//! of a few microseconds and a block: the runqueues, wake lists, idle
//! tracking and shared runqueues are the hot path. Defaults: one message
//! task per 8 CPUs (at least one), 8 workers each, 20 us bursts.
//!
//! Metric: requests per second, higher is better. Extras: wakeup latency
//! percentiles (`p99_ns` is schbench's headline).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{
    latency_extras, task_rng, Burst, Metric, Rng, Running, Tally, Window, WorkloadParams,
    WorkloadResult,
};
use crate::error::Result;
use crate::exec::{Action, Body, Cx, Spawner};
use crate::stats::Histogram;
use crate::task::{TaskId, TaskSpec};

struct Runq {
    w: Window,
    t: Tally,
    tasks: usize,
}

impl Running for Runq {
    fn window(&self) -> &Window {
        &self.w
    }
    fn finish(&self) -> WorkloadResult {
        let h = self
            .t
            .latency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let secs = self.w.len() as f64 / 1e9;
        let reqs = self.t.count("requests") as f64;
        let mut extra = BTreeMap::new();
        latency_extras(&h, "", &mut extra);
        extra.insert("requests".into(), reqs);
        WorkloadResult {
            metric: Metric {
                name: "requests_per_s".into(),
                unit: "req/s".into(),
                value: if secs > 0.0 { reqs / secs } else { 0.0 },
                higher_is_better: true,
            },
            extra,
            tasks: self.tasks,
        }
    }
}

#[repr(align(128))]
struct Worker {
    req: AtomicU64,
    id: OnceLock<TaskId>,
}

struct Team {
    workers: Vec<Worker>,
    done: AtomicU32,
    master: OnceLock<TaskId>,
}

/// A worker: waits for a request, records its wakeup latency, works a
/// burst and answers.
struct WorkerBody {
    m: Arc<Runq>,
    team: Arc<Team>,
    k: usize,
    burst_us: u64,
    /// Draws each step's compute (`defs::step`).
    rng: Rng,
    /// The request being served (`None`: waiting for one).
    burst: Option<Burst>,
    h: Histogram,
}

impl Body for WorkerBody {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        loop {
            if let Some(b) = self.burst.as_mut() {
                if !b.run(cx) {
                    return Action::Continue;
                }
                self.burst = None;
                let team = &self.team;
                if team.done.fetch_add(1, Ordering::AcqRel) + 1 == team.workers.len() as u32 {
                    if let Some(&mt) = team.master.get() {
                        cx.wake(mt);
                    }
                }
            }
            let r = self.team.workers[self.k].req.swap(0, Ordering::AcqRel);
            if r == 0 {
                if cx.stopping() {
                    self.m.t.publish(&[], Some(&self.h));
                    return Action::Exit;
                }
                return Action::Block;
            }
            let now = cx.now();
            if self.m.w.inside(now) {
                self.h.record(now.saturating_sub(r));
            }
            self.burst = Some(Burst::step(self.burst_us, &mut self.rng));
        }
    }
}

/// A message task: stamps a request for each of its workers and wakes
/// them, then waits until all have answered.
struct Master {
    m: Arc<Runq>,
    team: Arc<Team>,
    /// Requests are out, answers awaited.
    waiting: bool,
    reqs: u64,
}

impl Body for Master {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        let team = &self.team;
        loop {
            if cx.stopping() {
                self.m.t.publish(&[("requests", self.reqs)], None);
                return Action::Exit;
            }
            if !self.waiting {
                team.done.store(0, Ordering::Release);
                for w in &team.workers {
                    w.req.store(cx.now(), Ordering::Release);
                    if let Some(&id) = w.id.get() {
                        cx.wake(id);
                    }
                }
                self.waiting = true;
            }
            if team.done.load(Ordering::Acquire) < team.workers.len() as u32 {
                return Action::Block;
            }
            self.waiting = false;
            if self.m.w.inside(cx.now()) {
                self.reqs += team.workers.len() as u64;
            }
        }
    }
}

pub(super) fn start(p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    let n = ex.topology().num_cpus();
    let teams = p.groups.unwrap_or((n / 8).max(1));
    let per = p.tasks.unwrap_or(8);
    let burst_us = p.burst_us.unwrap_or(super::defs::RUNQ_BURST_US);
    let me = Arc::new(Runq {
        w: Window::default(),
        t: Tally::default(),
        tasks: teams * (per + 1),
    });
    for g in 0..teams {
        let team = Arc::new(Team {
            workers: (0..per)
                .map(|_| Worker {
                    req: AtomicU64::new(0),
                    id: OnceLock::new(),
                })
                .collect(),
            done: AtomicU32::new(0),
            master: OnceLock::new(),
        });
        for k in 0..per {
            let body = WorkerBody {
                m: me.clone(),
                team: team.clone(),
                k,
                burst_us,
                rng: task_rng(&[g as u64, k as u64]),
                burst: None,
                h: Histogram::new(),
            };
            let id = ex.spawn(&TaskSpec::new(format!("rq{g}w{k}")), Box::new(body))?;
            let _ = team.workers[k].id.set(id);
        }
        let body = Master {
            m: me.clone(),
            team: team.clone(),
            waiting: false,
            reqs: 0,
        };
        let id = ex.spawn(&TaskSpec::new(format!("rq{g}m")), Box::new(body))?;
        let _ = team.master.set(id);
        // the master may have started before its id was known to workers:
        // nudge it so it re-checks
        let _ = ex.wake(id);
    }
    Ok(me)
}
