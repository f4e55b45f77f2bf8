//! What a run reports ([`SimReport`], with its per-structure [`C2cRow`]
//! and per-lock [`LockRow`] views), and how the simulator's state becomes
//! one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use super::calls::InterleaveStats;
use super::state::Sim;
use super::workload::SimWorkload;

/// One structure's coherence traffic.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct C2cRow {
    /// Structure and field.
    pub name: String,
    /// Transfers from another CPU's cache.
    pub transfers: u64,
    /// Virtual ns they cost, queueing included.
    pub cost_ns: u64,
    /// Interleaved runs: virtual ns writes waited in a line's queue
    /// before their transfer (0 run to completion, where a write books
    /// the first free gap instead: part of `cost_ns`).
    #[serde(default)]
    pub queued_ns: u64,
}

/// One lock class's contention.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LockRow {
    /// The lock class.
    pub name: String,
    /// Acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found it held.
    pub contended: u64,
    /// Virtual ns spent waiting.
    pub wait_ns: u64,
}

/// The result of one simulation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SimReport {
    /// Workload name.
    pub workload: String,
    /// CPUs simulated.
    pub cpus: usize,
    /// Fixes.
    pub mitigations: String,
    /// Seed.
    pub seed: u64,
    /// Virtual ns simulated (less than asked if stopped).
    pub simulated_ns: u64,
    /// The workload's metric.
    pub metric: f64,
    /// Its name.
    pub metric_name: String,
    /// Share of simulated CPU time inside the scheduler.
    pub sched_share: f64,
    /// Core calls made.
    pub calls: u64,
    /// Mean virtual ns per core call.
    pub sched_ns_per_call: f64,
    /// Worst timer -> running latency (cyclic; runq: a request's stamp ->
    /// its worker running), ns, to the histogram's 3 significant digits.
    pub max_latency_ns: u64,
    /// Mean of the same latencies, ns: cyclic's metric until 2026-11-29,
    /// when the p99 the thread workload reports replaced it.
    #[serde(default)]
    pub mean_latency_ns: f64,
    /// Invariant violations found.
    pub violations: Vec<String>,
    /// Per structure, hottest first.
    pub c2c: Vec<C2cRow>,
    /// Per lock class, most waited first.
    pub lockstat: Vec<LockRow>,
    /// Stopped early (Ctrl-C).
    pub partial: bool,
    /// The scheduler's counters over the whole run (placement, balancing,
    /// wake paths), as `vmm bench` reports them.
    #[serde(default)]
    pub counters: crate::SchedCounters,
    /// messaging, pingpong: wakes that found their task already awake.
    /// The workloads wake only a task that waits (a pipe's reader or
    /// writer, a pair's partner), so run to completion this stays 0;
    /// anything else is a flaw of the model (an earlier token-ring
    /// messaging model merged messages this way). Interleaved, a wake can
    /// reach a task whose blocking `schedule` is still in flight: the wake
    /// is remembered (pending) and that block returns at once, so the task
    /// goes on and nothing is lost; those are counted here.
    #[serde(default)]
    pub absorbed_wakes: u64,
    /// What interleaving did (`None`: each call ran to completion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interleave: Option<InterleaveStats>,
    /// Every task's wakeup -> running latencies over the whole run, from
    /// the core's own per-task tables (`Scheduler::task_stats`, as
    /// `vmm sched-bench` reports them in its `task_summary`): median and
    /// 99th percentile (upper bucket bounds) and mean, ns.
    #[serde(default)]
    pub wake_to_run_p50_ns: u64,
    /// See `wake_to_run_p50_ns`.
    #[serde(default)]
    pub wake_to_run_p99_ns: u64,
    /// See `wake_to_run_p50_ns`.
    #[serde(default)]
    pub wake_to_run_mean_ns: f64,
    /// Mean virtual ns per `schedule` call alone (`sched_ns_per_call`
    /// counts `wake` and `tick` too; the threaded executors of `vmm
    /// sched-bench` time only `schedule`).
    #[serde(default)]
    pub schedule_ns_per_call: f64,
}

impl Sim<'_> {
    pub(super) fn report(
        &mut self,
        topo: &HostTopology,
        simulated: u64,
        partial: bool,
    ) -> SimReport {
        let w = self.cfg.workload;
        let secs = simulated as f64 / 1e9;
        let metric = match w {
            // the thread workload's metric: the 99th percentile
            SimWorkload::Cyclic => {
                if self.lat.count() == 0 {
                    f64::NAN
                } else {
                    self.lat.quantile(0.99) as f64
                }
            }
            SimWorkload::Pingpong => self.done as f64 / 2.0 / secs,
            // messages read, frames, requests answered
            _ => self.done as f64 / secs,
        };
        let name = |l: u64| self.region_name(l);
        let mut c2c: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
        for (l, st) in self.coh.line_stats() {
            let e = c2c.entry(name(l)).or_default();
            e.0 += st.transfers;
            e.1 += st.cost_ns;
            e.2 += st.queued_ns;
        }
        let mut c2c: Vec<C2cRow> = c2c
            .into_iter()
            .map(|(n, (tr, c, q))| C2cRow {
                name: n.to_string(),
                transfers: tr,
                cost_ns: c,
                queued_ns: q,
            })
            .collect();
        c2c.sort_by(|a, b| b.cost_ns.cmp(&a.cost_ns).then(a.name.cmp(&b.name)));
        let mut locks: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
        for (l, st) in self.coh.lock_stats() {
            let e = locks.entry(name(l)).or_default();
            e.0 += st.acquisitions;
            e.1 += st.contended;
            e.2 += st.wait_ns;
        }
        let mut lockstat: Vec<LockRow> = locks
            .into_iter()
            .map(|(n, (a, c, w))| LockRow {
                name: n.to_string(),
                acquisitions: a,
                contended: c,
                wait_ns: w,
            })
            .collect();
        lockstat.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.name.cmp(&b.name)));
        let wake_to_run = crate::bench::TaskSummary::from_tasks(
            self.ids
                .iter()
                .filter_map(|&id| self.s.task_stats(id).ok())
                .collect::<Vec<_>>()
                .iter(),
        )
        .wake_to_run;
        let mut violations = self.checker.violations.clone();
        violations.extend(self.s.anomalies());
        violations.extend(self.pipe_violations());
        SimReport {
            workload: w.name().to_string(),
            cpus: topo.num_cpus(),
            mitigations: self.cfg.mitigations.to_string(),
            seed: self.cfg.seed,
            simulated_ns: simulated,
            metric,
            metric_name: w.metric().0.to_string(),
            sched_share: self.sched_ns as f64 / (self.cpus.len() as f64 * simulated as f64),
            calls: self.calls,
            sched_ns_per_call: self.sched_ns as f64 / self.calls.max(1) as f64,
            max_latency_ns: self.lat.max(),
            mean_latency_ns: self.lat.mean(),
            violations,
            c2c,
            lockstat,
            partial,
            counters: self.s.counters(),
            absorbed_wakes: self.absorbed,
            interleave: self.il.as_ref().map(|il| il.stats),
            wake_to_run_p50_ns: wake_to_run.quantile(0.5),
            wake_to_run_p99_ns: wake_to_run.quantile(0.99),
            wake_to_run_mean_ns: wake_to_run.mean(),
            schedule_ns_per_call: self.schedule_only.0 as f64 / self.schedule_only.1.max(1) as f64,
        }
    }
}
