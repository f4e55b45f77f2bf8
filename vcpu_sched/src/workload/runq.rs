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

use super::{latency_extras, work, Metric, Running, Tally, Window, WorkloadParams, WorkloadResult};
use crate::error::Result;
use crate::exec::ThreadsExecutor;
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

pub(super) fn start(p: &WorkloadParams, ex: &ThreadsExecutor) -> Result<Arc<dyn Running>> {
    let n = ex.scheduler().num_cpus();
    let teams = p.groups.unwrap_or((n / 8).max(1));
    let per = p.tasks.unwrap_or(8);
    let burst = p.burst_us.unwrap_or(super::defs::RUNQ_BURST_US);
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
            let (m, tm) = (me.clone(), team.clone());
            let id = ex.spawn(&TaskSpec::new(format!("rq{g}w{k}")), move |ctx| {
                let team = tm;
                let mut h = Histogram::new();
                let w = &team.workers[k];
                loop {
                    let r = w.req.swap(0, Ordering::AcqRel);
                    if r == 0 {
                        if ctx.stopping() {
                            break;
                        }
                        ctx.block();
                        continue;
                    }
                    let now = ctx.now();
                    if m.w.inside(now) {
                        h.record(now.saturating_sub(r));
                    }
                    work(ctx, burst);
                    if team.done.fetch_add(1, Ordering::AcqRel) + 1 == team.workers.len() as u32 {
                        if let Some(&mt) = team.master.get() {
                            ctx.wake(mt);
                        }
                    }
                }
                m.t.publish(&[], Some(&h));
            })?;
            let _ = team.workers[k].id.set(id);
        }
        let (m, t2) = (me.clone(), team.clone());
        let id = ex.spawn(&TaskSpec::new(format!("rq{g}m")), move |ctx| {
            let team = t2;
            let mut reqs = 0u64;
            while !ctx.stopping() {
                team.done.store(0, Ordering::Release);
                for w in &team.workers {
                    w.req.store(ctx.now(), Ordering::Release);
                    if let Some(&id) = w.id.get() {
                        ctx.wake(id);
                    }
                }
                while team.done.load(Ordering::Acquire) < team.workers.len() as u32 {
                    if ctx.stopping() {
                        break;
                    }
                    ctx.block();
                }
                if m.w.inside(ctx.now()) {
                    reqs += team.workers.len() as u64;
                }
            }
            m.t.publish(&[("requests", reqs)], None);
        })?;
        let _ = team.master.set(id);
        // the master may have started before its id was known to workers:
        // nudge it so it re-checks
        let _ = ex.wake(id);
    }
    Ok(me)
}
