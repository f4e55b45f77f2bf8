//! The workload runner and the A/B comparison of mitigation sets.
//!
//! * [`run_workload`] runs one workload on one topology with one
//!   [`Mitigations`] value on the executor it names (by default the
//!   threads executor; `host` runs it on plain host threads) and returns a
//!   serialisable [`RunReport`].
//! * [`compare`] runs several mitigation sets (by default the seeds'
//!   set: baseline, each fix alone, all), interleaved, for several
//!   repetitions, and returns a [`Comparison`] that renders the seeds'
//!   table (baseline 100%, each variant's relative performance and spread)
//!   and serialises to JSON.
//!
//! A topology SPEC of `host` runs on the real CPUs, one logical CPU per
//! host CPU; anything else (a preset such as `genoa-2s`, an hwloc
//! synthetic string) is emulated onto the CPUs this process may use.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::comparison;
pub use crate::comparison::{
    interleaved, mean, stddev, Comparison, ComparisonHeader, RowKind, VariantRow, Verdict,
};
use crate::config::SchedConfig;
use crate::error::{Result, SchedError};
use crate::exec::{CheckConfig, CpuMapping, ExecConfig, Executor, ExecutorKind};
use crate::mitigations::Mitigations;
use crate::stats::{Histogram, SchedCounters, TaskStats};
use crate::workload::{self, Metric, WorkloadKind, WorkloadParams};

/// What to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunOptions {
    /// The workload.
    pub workload: WorkloadKind,
    /// Its knobs (defaults scale with the topology).
    pub params: WorkloadParams,
    /// Topology SPEC: `host`, a preset, or an hwloc synthetic string.
    pub topology: String,
    /// The fixes.
    pub mitigations: Mitigations,
    /// Measured time (after the warm-up).
    pub duration: Duration,
    /// Warm-up before measuring; `None`: a fifth of `duration`, at most 1 s.
    pub warmup: Option<Duration>,
    /// Run the invariant checker; its violations make the run fail.
    pub check: bool,
    /// Scheduler tunables.
    pub sched: SchedConfig,
    /// The executor that runs the tasks (runs recorded before there was a
    /// choice ran on `threads`).
    #[serde(default = "threads_executor")]
    pub executor: ExecutorKind,
}

fn threads_executor() -> ExecutorKind {
    ExecutorKind::Threads
}

impl RunOptions {
    /// Defaults for `workload` on `topology`: 5 s, checker off, baseline.
    pub fn new(workload: WorkloadKind, topology: &str) -> Self {
        Self {
            workload,
            params: WorkloadParams::default(),
            topology: topology.to_string(),
            mitigations: Mitigations::none(),
            duration: Duration::from_secs(5),
            warmup: None,
            check: false,
            sched: SchedConfig::default(),
            executor: ExecutorKind::Threads,
        }
    }
}

/// Per-task statistics, summed over a run's tasks.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TaskSummary {
    /// Tasks that ran.
    pub tasks: usize,
    /// Total time runnable but not running (ns).
    pub run_delay_ns: u64,
    /// Mean run delay per task (ns).
    pub run_delay_per_task_ns: f64,
    /// Wakeup-to-running latency of every wakeup.
    pub wake_to_run: Histogram,
    /// Its median (upper bucket bound, ns).
    pub wake_to_run_p50_ns: u64,
    /// Its 99th percentile (upper bucket bound, ns).
    pub wake_to_run_p99_ns: u64,
    /// CPU changes.
    pub migrations: u64,
    /// Involuntary switches.
    pub preemptions: u64,
    /// Time running (ns).
    pub running_ns: u64,
    /// Time queued (ns).
    pub queued_ns: u64,
    /// Time blocked (ns).
    pub blocked_ns: u64,
}

impl TaskSummary {
    /// Sums per-task statistics; `tasks` is how many there were.
    pub fn from_tasks<'a>(tasks: impl IntoIterator<Item = &'a TaskStats>) -> Self {
        let mut ts = TaskSummary::default();
        for t in tasks {
            ts.tasks += 1;
            ts.run_delay_ns += t.run_delay_ns;
            ts.wake_to_run.merge(&t.wake_to_run);
            ts.migrations += t.migrations;
            ts.preemptions += t.preemptions;
            ts.running_ns += t.running_ns;
            ts.queued_ns += t.queued_ns;
            ts.blocked_ns += t.blocked_ns;
        }
        ts.run_delay_per_task_ns = ts.run_delay_ns as f64 / ts.tasks.max(1) as f64;
        ts.wake_to_run_p50_ns = ts.wake_to_run.quantile(0.5);
        ts.wake_to_run_p99_ns = ts.wake_to_run.quantile(0.99);
        ts
    }
}

/// The result of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    /// Workload name.
    pub workload: String,
    /// Topology SPEC.
    pub topology: String,
    /// The executor that ran it.
    #[serde(default = "threads_executor")]
    pub executor: ExecutorKind,
    /// Logical CPUs.
    pub cpus: usize,
    /// Host CPUs they ran on.
    pub host_cpus: usize,
    /// Emulated (true) or the real host (false).
    pub emulated: bool,
    /// Mitigation set, in its string form.
    pub mitigations: String,
    /// Measured seconds.
    pub duration_s: f64,
    /// The headline number.
    pub metric: Metric,
    /// Further numbers of the workload.
    pub extra: BTreeMap<String, f64>,
    /// Tasks the workload ran.
    pub tasks: usize,
    /// Scheduler counters during the measured window.
    pub counters: SchedCounters,
    /// Time inside the scheduler core, all CPUs, whole run (ns).
    pub sched_ns: u64,
    /// Calls into `schedule`, whole run.
    pub sched_calls: u64,
    /// Mean time per `schedule` call (ns).
    pub sched_ns_per_call: f64,
    /// Time inside the scheduler per CPU, whole run (ns).
    pub sched_ns_per_cpu: Vec<u64>,
    /// Per-task statistics, summed.
    pub task_summary: TaskSummary,
    /// Checker snapshots.
    pub checks: u64,
    /// Invariant violations (empty unless something is broken).
    pub violations: Vec<String>,
}

/// Runs the warm-up and the measured window of a started workload,
/// poking it now and then; returns the scheduler counters of the window
/// (zero for the host executor).
fn drive(
    opts: &RunOptions,
    ex: &Executor,
    w: &dyn workload::Running,
    progress: &mut dyn FnMut(f64),
) -> SchedCounters {
    let counters = || ex.scheduler().map(|s| s.counters()).unwrap_or_default();
    let sp = ex.spawner();
    let warmup = opts
        .warmup
        .unwrap_or_else(|| (opts.duration / 5).min(Duration::from_secs(1)));
    let total = warmup + opts.duration;
    let t0 = Instant::now();
    let mut c0 = None;
    let mut last_poke = Instant::now();
    loop {
        let el = t0.elapsed();
        if c0.is_none() && el >= warmup {
            w.window().open(sp.now());
            c0 = Some(counters());
        }
        if el >= total {
            break;
        }
        if last_poke.elapsed() >= Duration::from_millis(20) {
            w.poke(sp);
            last_poke = Instant::now();
        }
        progress(el.as_secs_f64() / total.as_secs_f64());
        std::thread::sleep(Duration::from_millis(10).min(total - el));
    }
    w.window().close(sp.now());
    counters().since(&c0.unwrap_or_default())
}

/// Runs one workload and reports. With `check` on, a violation makes it an
/// error ([`SchedError::Invariant`]).
pub fn run_workload(opts: &RunOptions) -> Result<RunReport> {
    run_workload_with(opts, &mut |_| {})
}

/// [`run_workload`] with a progress callback, called with the fraction of
/// the run done (0..=1) about ten times a second.
pub fn run_workload_with(opts: &RunOptions, progress: &mut dyn FnMut(f64)) -> Result<RunReport> {
    if opts.duration.is_zero() {
        return Err(SchedError::Workload("the duration must be positive".into()));
    }
    let topo = Arc::new(topology::load(&opts.topology)?);
    // Calibrate the unit of work here, on an otherwise quiet thread, not
    // inside the first body that needs it while other tasks run.
    workload::work_unit_ns();
    let mapping = CpuMapping::for_spec(&opts.topology)?;
    let emulated = mapping.is_emulated();
    let host_cpus = mapping.host_cpus(topo.num_cpus());
    let cfg = ExecConfig {
        mapping,
        check: opts.check.then(CheckConfig::default),
        ..ExecConfig::default()
    };
    let ex = Executor::start(
        opts.executor,
        topo.clone(),
        opts.mitigations,
        opts.sched.clone(),
        &cfg,
    )?;
    let w = match workload::start(opts.workload, &opts.params, ex.spawner()) {
        Ok(w) => w,
        Err(e) => {
            let _ = ex.shutdown(Duration::from_secs(30));
            return Err(e);
        }
    };
    let counters = drive(opts, &ex, &*w, progress);
    let rep = ex.shutdown(Duration::from_secs(60))?;
    progress(1.0);
    let res = w.finish();
    let ts = TaskSummary::from_tasks(&rep.tasks);
    let sched_ns: u64 = rep.sched_ns_per_cpu.iter().sum();
    let sched_calls: u64 = rep.sched_calls_per_cpu.iter().sum();
    let mut violations = rep.violations;
    violations.extend(rep.failures.iter().map(|f| format!("task failed: {f}")));
    let report = RunReport {
        workload: opts.workload.name().to_string(),
        topology: opts.topology.clone(),
        executor: opts.executor,
        cpus: topo.num_cpus(),
        host_cpus,
        emulated,
        mitigations: opts.mitigations.to_string(),
        duration_s: w.window().len() as f64 / 1e9,
        metric: res.metric,
        extra: res.extra,
        tasks: res.tasks,
        counters,
        sched_ns,
        sched_calls,
        sched_ns_per_call: sched_ns as f64 / sched_calls.max(1) as f64,
        sched_ns_per_cpu: rep.sched_ns_per_cpu,
        task_summary: ts,
        checks: rep.checks,
        violations,
    };
    if opts.check && !report.violations.is_empty() {
        return Err(SchedError::Invariant {
            count: report.violations.len(),
            first: report
                .violations
                .iter()
                .take(6)
                .cloned()
                .collect::<Vec<_>>()
                .join(" | "),
        });
    }
    Ok(report)
}

/// What to compare.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CompareOptions {
    /// The run; its `mitigations` field is ignored.
    pub run: RunOptions,
    /// The sets to compare; the first is the baseline (its A/A row is
    /// added by [`compare`]).
    pub variants: Vec<Mitigations>,
    /// Repetitions of every variant.
    pub repetitions: usize,
}

impl CompareOptions {
    /// The seeds' comparison: baseline, each fix alone, all; 3 repetitions.
    pub fn seeds(run: RunOptions) -> Self {
        Self {
            run,
            variants: Mitigations::seeds_variants(),
            repetitions: 3,
        }
    }
}

/// Where a comparison is.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CompareProgress {
    /// Runs finished.
    pub done: usize,
    /// Runs in all.
    pub total: usize,
    /// The variant about to run (or just run).
    pub variant: String,
    /// Its repetition (0-based).
    pub repetition: usize,
    /// The fraction of the current run done.
    pub run_fraction: f64,
}

/// A finished comparison of mitigation sets on synthetic tasks: the
/// shared [`Comparison`] table (its fields at the top level of the JSON,
/// as in every comparison of the project) and every run's full report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadComparison {
    /// The table, A/A row and verdicts included.
    #[serde(flatten)]
    pub table: Comparison,
    /// Every run, in the order they ran.
    pub runs: Vec<RunReport>,
}

impl WorkloadComparison {
    /// The seeds' table.
    pub fn render_table(&self) -> String {
        self.table.render_table()
    }

    /// The comparison, every run included, as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl ComparisonHeader {
    /// The header of a comparison whose first run is `first`.
    pub fn from_run(first: &RunReport, duration_s: f64) -> Self {
        ComparisonHeader {
            workload: first.workload.clone(),
            topology: first.topology.clone(),
            cpus: first.cpus,
            host_cpus: first.host_cpus,
            metric: first.metric.name.clone(),
            unit: first.metric.unit.clone(),
            higher_is_better: first.metric.higher_is_better,
            duration_s,
        }
    }
}

/// Runs the baseline, its A/A row and every other variant `repetitions`
/// times, [`interleaved`], after one unrecorded warm-up run of the
/// baseline (at most 1 s).
pub fn compare(
    opts: &CompareOptions,
    progress: &mut dyn FnMut(&CompareProgress),
) -> Result<WorkloadComparison> {
    let cells = comparison::cells(&opts.variants)?;
    if opts.repetitions == 0 {
        return Err(SchedError::Workload(
            "repetitions must be at least 1".into(),
        ));
    }
    let nv = cells.len();
    let total = nv * opts.repetitions;
    // One unrecorded run first, so that no variant pays for the process
    // warming up (thread stacks, page faults, calibration).
    {
        let mut warm = opts.run.clone();
        warm.mitigations = cells[0].mitigations;
        warm.duration = warm.duration.min(Duration::from_secs(1));
        warm.check = false;
        let name = format!("warm-up ({})", warm.mitigations);
        run_workload_with(&warm, &mut |f| {
            progress(&CompareProgress {
                done: 0,
                total,
                variant: name.clone(),
                repetition: 0,
                run_fraction: f,
            })
        })?;
    }
    let mut values = vec![vec![f64::NAN; opts.repetitions]; nv];
    let mut per_call = vec![0.0; nv];
    let mut runs = Vec::with_capacity(total);
    for (done, (rep, v)) in interleaved(nv, opts.repetitions).enumerate() {
        let mut run = opts.run.clone();
        run.mitigations = cells[v].mitigations;
        let name = cells[v].label.clone();
        let mut cb = |f: f64| {
            progress(&CompareProgress {
                done,
                total,
                variant: name.clone(),
                repetition: rep,
                run_fraction: f,
            })
        };
        let r = run_workload_with(&run, &mut cb)?;
        values[v][rep] = r.metric.value;
        per_call[v] += r.sched_ns_per_call / opts.repetitions as f64;
        runs.push(r);
    }
    let header = ComparisonHeader::from_run(&runs[0], opts.run.duration.as_secs_f64());
    let labels: Vec<(String, RowKind)> = cells.iter().map(|c| (c.label.clone(), c.kind)).collect();
    let table = Comparison::assemble(header, &labels, &values, &per_call)?;
    Ok(WorkloadComparison { table, runs })
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_are_errors() {
        let mut o = RunOptions::new(WorkloadKind::Cyclic, "package:1 l3:1 l2:1 core:1 pu:1");
        o.duration = Duration::ZERO;
        assert!(run_workload(&o)
            .unwrap_err()
            .to_string()
            .contains("positive"));
        o.duration = Duration::from_millis(10);
        o.topology = "no-such-machine".into();
        assert!(run_workload(&o).unwrap_err().to_string().contains("preset"));
        let c = CompareOptions {
            run: RunOptions::new(WorkloadKind::Cyclic, "host"),
            variants: vec![],
            repetitions: 1,
        };
        assert!(compare(&c, &mut |_| {}).is_err());
    }
}
