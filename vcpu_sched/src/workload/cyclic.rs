//! `cyclic`: RT FIFO tasks on periodic timers, like `stress-ng --cyclic`.
//!
//! Each task sleeps until its next deadline, records how late it runs
//! (wakeup latency: timer, wakeup path, placement, preemption), does a few
//! microseconds of work and sleeps again. Defaults: one task per CPU (at
//! least 8, for enough samples on small hosts) at FIFO 99, a 1 ms period
//! stretched on big topologies so that the total wakeup rate stays near 16
//! per millisecond (a 2-CPU host emulating 384 CPUs cannot deliver more),
//! 5 us of work.
//!
//! Metric: p99 wakeup latency, lower is better. Extras: other percentiles,
//! cycles per second, overruns (a deadline already past when the previous
//! cycle ended).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{
    defs, latency_extras, task_rng, Burst, Metric, Rng, Running, Tally, Window, WorkloadParams,
    WorkloadResult,
};
use crate::error::Result;
use crate::exec::{Action, Body, Cx, Spawner};
use crate::stats::Histogram;
use crate::task::{Policy, TaskSpec};

struct Cyclic {
    w: Window,
    t: Tally,
    tasks: usize,
}

impl Running for Cyclic {
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
        let mut extra = BTreeMap::new();
        latency_extras(&h, "", &mut extra);
        let secs = self.w.len() as f64 / 1e9;
        extra.insert(
            "cycles_per_s".into(),
            if secs > 0.0 {
                h.count() as f64 / secs
            } else {
                0.0
            },
        );
        extra.insert("overruns".into(), self.t.count("overruns") as f64);
        WorkloadResult {
            metric: Metric {
                name: "p99_wakeup_latency".into(),
                unit: "us".into(),
                value: h.quantile(0.99) as f64 / 1000.0,
                higher_is_better: false,
            },
            extra,
            tasks: self.tasks,
        }
    }
}

/// One cyclic task: sleeps until its deadline, records how late it ran,
/// works a burst, and sleeps again.
struct Task {
    m: Arc<Cyclic>,
    period: u64,
    burst_us: u64,
    /// Draws each step's compute (`defs::step`).
    rng: Rng,
    /// The next deadline (0: not started).
    next: u64,
    /// The first deadline's offset, so that tasks do not all wake at once.
    phase: u64,
    /// The burst of the current cycle (`None`: sleeping).
    burst: Option<Burst>,
    /// Whether the current cycle started inside the window.
    inside: bool,
    h: Histogram,
    overruns: u64,
}

impl Body for Task {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        if cx.stopping() {
            self.m
                .t
                .publish(&[("overruns", self.overruns)], Some(&self.h));
            return Action::Exit;
        }
        if self.next == 0 {
            self.next = cx.now() + self.period + self.phase;
        }
        let Some(b) = self.burst.as_mut() else {
            let now = cx.now();
            if now < self.next {
                // not due (the first entry, or a wake that came early):
                // sleep the rest of the period
                return Action::Sleep(self.next - now);
            }
            self.inside = self.m.w.inside(now);
            if self.inside {
                self.h.record(now - self.next);
            }
            self.burst = Some(Burst::step(self.burst_us, &mut self.rng));
            return Action::Continue;
        };
        if !b.run(cx) {
            return Action::Continue;
        }
        self.burst = None;
        self.next += self.period;
        let after = cx.now();
        if self.next <= after {
            if self.inside {
                self.overruns += 1;
            }
            self.next = after + self.period;
        }
        Action::Sleep(self.next - after)
    }
}

pub(super) fn start(p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    let n = ex.topology().num_cpus();
    let tasks = p.tasks.unwrap_or(n.max(8));
    let period = p
        .period_us
        .unwrap_or_else(|| defs::CYCLIC_PERIOD_US.max(tasks as u64 * 1000 / 16))
        * 1000;
    let burst_us = p.burst_us.unwrap_or(defs::CYCLIC_BURST_US);
    let prio = p.prio.unwrap_or(defs::RT_PRIO);
    let me = Arc::new(Cyclic {
        w: Window::default(),
        t: Tally::default(),
        tasks,
    });
    for i in 0..tasks {
        let body = Task {
            m: me.clone(),
            period,
            burst_us,
            next: 0,
            phase: period * i as u64 / tasks as u64,
            burst: None,
            rng: task_rng(&[i as u64]),
            inside: false,
            h: Histogram::new(),
            overruns: 0,
        };
        ex.spawn(
            &TaskSpec::new(format!("cyclic{i}")).policy(Policy::Fifo(prio)),
            Box::new(body),
        )?;
    }
    Ok(me)
}
