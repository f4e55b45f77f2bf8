//! `pingpong`: pairs of tasks handing one request back and forth, like
//! netperf's UDP_RR between two threads, as the simulator's `pingpong`
//! defines it.
//!
//! Each group has `group_size` fair tasks (even; default 2), paired 2p
//! and 2p+1. One token per pair, starting at the even task: the task
//! holding it computes
//! ([`defs::PINGPONG_BURST_US`](super::defs::PINGPONG_BURST_US), or
//! `burst_us`), hands it to its partner, wakes it and blocks until the
//! token comes back. Every handoff is a wakeup of a blocked task, mostly
//! on another CPU. Defaults: one group (pair) per 2 CPUs, at least one;
//! `--groups 1 --group-size N` puts N/2 pairs in one group, as a
//! benchmark run in one cgroup.
//!
//! Metric: transactions (round trips, two handoffs) per second, higher is
//! better.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use super::{task_rng, Burst, Metric, Rng, Running, Tally, Window, WorkloadParams, WorkloadResult};
use crate::error::{Result, SchedError};
use crate::exec::{Action, Body, Cx, Spawner};
use crate::task::{GroupId, TaskId, TaskSpec};

struct Pingpong {
    w: Window,
    t: Tally,
    tasks: usize,
}

impl Running for Pingpong {
    fn window(&self) -> &Window {
        &self.w
    }
    fn finish(&self) -> WorkloadResult {
        let secs = self.w.len() as f64 / 1e9;
        let handoffs = self.t.count("handoffs") as f64;
        let mut extra = BTreeMap::new();
        extra.insert("handoffs".into(), handoffs);
        WorkloadResult {
            metric: Metric {
                name: "transactions_per_s".into(),
                unit: "trans/s".into(),
                value: if secs > 0.0 {
                    handoffs / 2.0 / secs
                } else {
                    0.0
                },
                higher_is_better: true,
            },
            extra,
            tasks: self.tasks,
        }
    }
}

/// One pair: whose turn it is (0: the even task, 1: the odd one) and
/// both tasks' ids.
struct Pair {
    turn: AtomicU8,
    ids: [OnceLock<TaskId>; 2],
}

/// One side of a pair.
struct Side {
    m: Arc<Pingpong>,
    pair: Arc<Pair>,
    me: u8,
    burst_us: u64,
    /// Draws each step's compute (`defs::step`).
    rng: Rng,
    /// The compute in progress while holding the token.
    burst: Option<Burst>,
    handoffs: u64,
}

impl Body for Side {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        loop {
            if cx.stopping() {
                self.m.t.publish(&[("handoffs", self.handoffs)], None);
                return Action::Exit;
            }
            if let Some(b) = self.burst.as_mut() {
                if !b.run(cx) {
                    return Action::Continue;
                }
                self.burst = None;
                let other = 1 - self.me;
                self.pair.turn.store(other, Ordering::Release);
                if self.m.w.inside(cx.now()) {
                    self.handoffs += 1;
                }
                // a partner not spawned yet is nudged by the spawner
                if let Some(&id) = self.pair.ids[other as usize].get() {
                    cx.wake(id);
                }
            }
            if self.pair.turn.load(Ordering::Acquire) != self.me {
                return Action::Block;
            }
            self.burst = Some(Burst::step(self.burst_us, &mut self.rng));
        }
    }
}

pub(super) fn start(p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    let n = ex.topology().num_cpus();
    let groups = p.groups.unwrap_or((n / 2).max(1));
    let size = p.group_size.unwrap_or(2);
    if size % 2 != 0 {
        return Err(SchedError::Workload(format!(
            "pingpong pairs a group's tasks: give an even group size (not {size})"
        )));
    }
    let burst_us = p.burst_us.unwrap_or(super::defs::PINGPONG_BURST_US);
    let me = Arc::new(Pingpong {
        w: Window::default(),
        t: Tally::default(),
        tasks: groups * size,
    });
    for g in 0..groups {
        let gid = ex.create_group(&format!("pp{g}"))?;
        for k in 0..size / 2 {
            let pair = Arc::new(Pair {
                turn: AtomicU8::new(0),
                ids: [OnceLock::new(), OnceLock::new()],
            });
            for side in [1u8, 0] {
                let body = Side {
                    m: me.clone(),
                    pair: pair.clone(),
                    me: side,
                    burst_us,
                    rng: task_rng(&[g as u64, k as u64, side as u64]),
                    burst: None,
                    handoffs: 0,
                };
                let name = format!("pp{g}t{}", 2 * k + side as usize);
                let id = ex.spawn(&spec(name, gid), Box::new(body))?;
                let _ = pair.ids[side as usize].set(id);
            }
            // either side may have handed the token on before the
            // other's id was known: both look again
            for id in pair.ids.iter().filter_map(|i| i.get()) {
                let _ = ex.wake(*id);
            }
        }
    }
    Ok(me)
}

fn spec(name: String, g: GroupId) -> TaskSpec {
    TaskSpec::new(name).group(g)
}
