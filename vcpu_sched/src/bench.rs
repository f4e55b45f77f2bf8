//! The workload runner and the A/B comparison of mitigation sets.
//!
//! * [`run_workload`] runs one workload on one topology with one
//!   [`Mitigations`] value on the threads executor and returns a
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
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::SchedConfig;
use crate::error::{Result, SchedError};
use crate::exec::{CheckConfig, CpuMapping, ExecConfig, FlagKick, ThreadsExecutor};
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
    let ex = ThreadsExecutor::new(
        topo.clone(),
        opts.mitigations,
        opts.sched.clone(),
        cfg,
        Arc::new(FlagKick),
    )?;
    let w = match workload::start(opts.workload, &opts.params, &ex) {
        Ok(w) => w,
        Err(e) => {
            let _ = ex.shutdown(Duration::from_secs(30));
            return Err(e);
        }
    };
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
            w.window().open(ex.now());
            c0 = Some(ex.scheduler().counters());
        }
        if el >= total {
            break;
        }
        if last_poke.elapsed() >= Duration::from_millis(20) {
            w.poke(&ex);
            last_poke = Instant::now();
        }
        progress(el.as_secs_f64() / total.as_secs_f64());
        std::thread::sleep(Duration::from_millis(10).min(total - el));
    }
    w.window().close(ex.now());
    let c1 = ex.scheduler().counters();
    let counters = c1.since(&c0.unwrap_or_default());
    let rep = ex.shutdown(Duration::from_secs(60))?;
    progress(1.0);
    let res = w.finish();
    let ts = TaskSummary::from_tasks(&rep.tasks);
    let sched_ns: u64 = rep.sched_ns_per_cpu.iter().sum();
    let sched_calls: u64 = rep.sched_calls_per_cpu.iter().sum();
    let report = RunReport {
        workload: opts.workload.name().to_string(),
        topology: opts.topology.clone(),
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
        violations: rep.violations,
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
    /// The sets to compare; the first is the baseline.
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

/// One variant's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VariantRow {
    /// The mitigation set.
    pub mitigations: String,
    /// The metric of each repetition.
    pub values: Vec<f64>,
    /// Their mean.
    pub mean: f64,
    /// Their standard deviation.
    pub stddev: f64,
    /// Relative performance against the baseline, in percent: mean over
    /// baseline mean for higher-is-better metrics, baseline over mean for
    /// lower-is-better ones, so that above 100 is always better.
    pub relative_pct: f64,
    /// The lowest and highest per-repetition relative performance (each
    /// repetition against the baseline run of the same repetition).
    pub relative_min_pct: f64,
    /// See `relative_min_pct`.
    pub relative_max_pct: f64,
    /// Mean time per `schedule` call (ns), averaged over repetitions.
    pub sched_ns_per_call: f64,
}

/// A finished comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    /// Workload name.
    pub workload: String,
    /// Topology SPEC.
    pub topology: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Host CPUs.
    pub host_cpus: usize,
    /// The metric's name.
    pub metric: String,
    /// Its unit.
    pub unit: String,
    /// Is bigger better?
    pub higher_is_better: bool,
    /// Measured seconds per run.
    pub duration_s: f64,
    /// Repetitions.
    pub repetitions: usize,
    /// One row per variant, the baseline first.
    pub rows: Vec<VariantRow>,
    /// Every run, in the order they ran.
    pub runs: Vec<RunReport>,
}

/// Runs every variant `repetitions` times, interleaved (each repetition
/// runs every variant once, starting one further along the list each
/// time, so that slow drift of the host does not favour a variant), after
/// one unrecorded warm-up run of the baseline (at most 1 s).
pub fn compare(
    opts: &CompareOptions,
    progress: &mut dyn FnMut(&CompareProgress),
) -> Result<Comparison> {
    if opts.variants.is_empty() {
        return Err(SchedError::Workload("no variants to compare".into()));
    }
    if opts.repetitions == 0 {
        return Err(SchedError::Workload(
            "repetitions must be at least 1".into(),
        ));
    }
    let nv = opts.variants.len();
    let total = nv * opts.repetitions;
    // One unrecorded run first, so that no variant pays for the process
    // warming up (thread stacks, page faults, calibration).
    {
        let mut warm = opts.run.clone();
        warm.mitigations = opts.variants[0];
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
        run.mitigations = opts.variants[v];
        let name = run.mitigations.to_string();
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
    let labels: Vec<String> = opts.variants.iter().map(|m| m.to_string()).collect();
    Comparison::assemble(
        &labels,
        &values,
        &per_call,
        opts.run.duration.as_secs_f64(),
        runs,
    )
}

/// The order of an interleaved comparison of `variants` sets over
/// `repetitions`: `(repetition, variant)` pairs, repetition `r` starting
/// `r` places further along the list, so that slow drift of the host
/// favours no variant.
pub fn interleaved(variants: usize, repetitions: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..repetitions).flat_map(move |rep| (0..variants).map(move |k| (rep, (k + rep) % variants)))
}

/// The rows of the seeds' table from a variant-major table of metric
/// values (`values[variant][repetition]`; variant 0 is the baseline) and
/// each variant's mean time per `schedule` call.
pub fn variant_rows(
    labels: &[String],
    values: &[Vec<f64>],
    sched_ns_per_call: &[f64],
    higher_is_better: bool,
) -> Vec<VariantRow> {
    let rel = |v: f64, base: f64| -> f64 {
        // a zero throughput is 0%; a zero baseline or latency has no ratio
        let (num, den) = if higher_is_better {
            (v, base)
        } else {
            (base, v)
        };
        if den > 0.0 {
            100.0 * num / den
        } else {
            f64::NAN
        }
    };
    let empty = Vec::new();
    let base = values.first().unwrap_or(&empty);
    let base_mean = mean(base);
    labels
        .iter()
        .zip(values)
        .enumerate()
        .map(|(v, (label, vals))| {
            let m = mean(vals);
            let per_rep: Vec<f64> = vals.iter().zip(base).map(|(&x, &b)| rel(x, b)).collect();
            VariantRow {
                mitigations: label.clone(),
                values: vals.clone(),
                mean: m,
                stddev: stddev(vals),
                relative_pct: rel(m, base_mean),
                relative_min_pct: per_rep.iter().copied().fold(f64::INFINITY, f64::min),
                relative_max_pct: per_rep.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                sched_ns_per_call: sched_ns_per_call.get(v).copied().unwrap_or(f64::NAN),
            }
        })
        .collect()
}

/// The arithmetic mean (0 for no values).
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The sample standard deviation (0 for fewer than two values).
pub fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

impl Comparison {
    /// A comparison from its runs (in the order they ran; the first names
    /// the workload, topology and metric), the variant-major table of their
    /// metric values and each variant's mean time per `schedule` call.
    pub fn assemble(
        labels: &[String],
        values: &[Vec<f64>],
        sched_ns_per_call: &[f64],
        duration_s: f64,
        runs: Vec<RunReport>,
    ) -> Result<Self> {
        let Some(first) = runs.first() else {
            return Err(SchedError::Workload("a comparison needs runs".into()));
        };
        let hib = first.metric.higher_is_better;
        Ok(Comparison {
            workload: first.workload.clone(),
            topology: first.topology.clone(),
            cpus: first.cpus,
            host_cpus: first.host_cpus,
            metric: first.metric.name.clone(),
            unit: first.metric.unit.clone(),
            higher_is_better: hib,
            duration_s,
            repetitions: values.first().map_or(0, |v| v.len()),
            rows: variant_rows(labels, values, sched_ns_per_call, hib),
            runs,
        })
    }

    /// The seeds' table: one row per variant with its mean metric, its
    /// standard deviation, its relative performance (baseline 100%, above
    /// 100% better) and the min-max of the per-repetition ratios.
    pub fn render_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} on {} ({} CPUs{}), {} x {:.1} s per variant; metric {} [{}], {} is better",
            self.workload,
            self.topology,
            self.cpus,
            if self.host_cpus < self.cpus {
                format!(" emulated on {} host CPUs", self.host_cpus)
            } else {
                String::new()
            },
            self.repetitions,
            self.duration_s,
            self.metric,
            self.unit,
            if self.higher_is_better {
                "higher"
            } else {
                "lower"
            }
        );
        let _ = writeln!(
            s,
            "{:<28} {:>14} {:>10} {:>9} {:>17} {:>10}",
            "mitigations", "mean", "stddev", "relative", "min-max", "ns/sched"
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<28} {:>14.3} {:>10.3} {:>8.1}% {:>7.1}%-{:>6.1}% {:>10.0}",
                r.mitigations,
                r.mean,
                r.stddev,
                r.relative_pct,
                r.relative_min_pct,
                r.relative_max_pct,
                r.sched_ns_per_call
            );
        }
        s
    }

    /// The comparison, every run included, as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn stats_helpers() {
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
        assert!((stddev(&[1.0, 2.0, 3.0]) - 1.0).abs() < 1e-12);
        assert_eq!(stddev(&[5.0]), 0.0);
    }

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

    #[test]
    fn interleaving_rotates_the_start() {
        let order: Vec<_> = interleaved(3, 2).collect();
        assert_eq!(order, vec![(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0)]);
        assert_eq!(interleaved(0, 3).count(), 0);
    }

    #[test]
    fn rows_are_oriented_so_that_above_100_is_better() {
        let labels = vec!["none".to_string(), "all".to_string()];
        // latencies: the second set halves them
        let rows = variant_rows(
            &labels,
            &[vec![10.0, 20.0], vec![5.0, 10.0]],
            &[1.0, 2.0],
            false,
        );
        assert_eq!(rows[0].relative_pct, 100.0);
        assert_eq!(rows[1].relative_pct, 200.0);
        assert_eq!(
            (rows[1].relative_min_pct, rows[1].relative_max_pct),
            (200.0, 200.0)
        );
        assert_eq!(rows[1].sched_ns_per_call, 2.0);
        // throughputs: a zero is 0%, a zero baseline has no ratio
        let rows = variant_rows(&labels, &[vec![4.0, 0.0], vec![0.0, 3.0]], &[], true);
        assert_eq!(rows[1].relative_min_pct, 0.0);
        // (a repetition without a ratio does not count in the range)
        assert_eq!(rows[1].relative_max_pct, 0.0);
        assert_eq!(rows[1].relative_pct, 75.0);
    }
}
