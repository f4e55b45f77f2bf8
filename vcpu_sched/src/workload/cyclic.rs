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
    defs, latency_extras, work, Metric, Running, Tally, Window, WorkloadParams, WorkloadResult,
};
use crate::error::Result;
use crate::exec::ThreadsExecutor;
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

pub(super) fn start(p: &WorkloadParams, ex: &ThreadsExecutor) -> Result<Arc<dyn Running>> {
    let n = ex.scheduler().num_cpus();
    let tasks = p.tasks.unwrap_or(n.max(8));
    let period = p
        .period_us
        .unwrap_or_else(|| defs::CYCLIC_PERIOD_US.max(tasks as u64 * 1000 / 16))
        * 1000;
    let burst = p.burst_us.unwrap_or(defs::CYCLIC_BURST_US);
    let prio = p.prio.unwrap_or(defs::RT_PRIO);
    let me = Arc::new(Cyclic {
        w: Window::default(),
        t: Tally::default(),
        tasks,
    });
    for i in 0..tasks {
        let m = me.clone();
        let phase = period * i as u64 / tasks as u64;
        ex.spawn(
            &TaskSpec::new(format!("cyclic{i}")).policy(Policy::Fifo(prio)),
            move |ctx| {
                let mut h = Histogram::new();
                let mut overruns = 0u64;
                let mut next = ctx.now() + period + phase;
                while !ctx.stopping() {
                    ctx.sleep_until(next);
                    let now = ctx.now();
                    if ctx.stopping() {
                        break;
                    }
                    let inside = m.w.inside(now);
                    if inside {
                        h.record(now.saturating_sub(next));
                    }
                    work(ctx, burst);
                    next += period;
                    let after = ctx.now();
                    if next <= after {
                        if inside {
                            overruns += 1;
                        }
                        next = after + period;
                    }
                }
                m.t.publish(&[("overruns", overruns)], Some(&h));
            },
        )?;
    }
    Ok(me)
}
