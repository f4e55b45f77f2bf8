//! The seeds' comparison on micro-guests: every mitigation set (and the
//! host 1:1 baseline) run repeatedly, interleaved.
//!
//! WHAT: [`compare`] and its options, progress and result types.
//! WHY: one run is noisy; a comparison needs repetitions that no slow
//! drift of the host can favour, and the table `vmm sched-bench` prints.
//! HOW: [`vcpu_sched::bench::interleaved`] orders the runs;
//! [`Comparison::assemble`] builds the table from every run's report.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use vcpu_sched::bench::{interleaved, Comparison};
use vcpu_sched::Mitigations;

use super::{run, BenchError, BenchOptions, BenchReport};
use crate::vcpu_task::ExecutorKind;

/// What to compare.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// The run; its `mitigations` is ignored, and its executor must be a
    /// scheduler executor.
    pub run: BenchOptions,
    /// The sets; the first is the baseline.
    pub variants: Vec<Mitigations>,
    /// Repetitions of each.
    pub repetitions: usize,
    /// Also run the host 1:1 baseline in every repetition.
    pub host_baseline: bool,
}

/// Where a comparison is.
#[derive(Clone, Debug)]
pub struct CompareProgress {
    /// Runs finished.
    pub done: usize,
    /// Runs in all.
    pub total: usize,
    /// The variant running.
    pub variant: String,
    /// Fraction of it done.
    pub run_fraction: f64,
}

/// A comparison and every run's full report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchComparison {
    /// The seeds' table (rows: the variants, then `host 1:1`).
    pub table: Comparison,
    /// Executor of the scheduler rows.
    pub executor: ExecutorKind,
    /// VMs x vCPUs.
    pub vms: usize,
    /// vCPUs per VM.
    pub vcpus: usize,
    /// Every run, in order.
    pub reports: Vec<BenchReport>,
}

/// Runs every variant (and the host baseline) `repetitions` times,
/// interleaved: repetition `r` starts `r` places further along the list,
/// so slow drift of the host favours no variant. One unrecorded warm-up
/// run comes first.
pub fn compare(
    opts: &CompareOptions,
    progress: &mut dyn FnMut(&CompareProgress),
) -> Result<BenchComparison, BenchError> {
    if opts.variants.is_empty() || opts.repetitions == 0 {
        return Err(BenchError::Input(
            "a comparison needs at least one mitigation set and one repetition".into(),
        ));
    }
    if opts.run.executor == ExecutorKind::Host {
        return Err(BenchError::Input(
            "compare with --executor workers or threads; the host 1:1 baseline is added by itself"
                .into(),
        ));
    }
    // (label, options)
    let mut cells: Vec<(String, BenchOptions)> = opts
        .variants
        .iter()
        .map(|m| {
            let mut o = opts.run.clone();
            o.mitigations = *m;
            (m.to_string(), o)
        })
        .collect();
    if opts.host_baseline {
        let mut o = opts.run.clone();
        o.executor = ExecutorKind::Host;
        cells.push(("host 1:1".into(), o));
    }
    let nv = cells.len();
    let total = nv * opts.repetitions;
    {
        let mut w = cells[0].1.clone();
        w.duration = w.duration.min(Duration::from_millis(500));
        w.check = false;
        run(&w, &mut |f| {
            progress(&CompareProgress {
                done: 0,
                total,
                variant: "warm-up".into(),
                run_fraction: f,
            })
        })?;
    }
    let mut values = vec![vec![f64::NAN; opts.repetitions]; nv];
    let mut per_call = vec![0.0; nv];
    let mut reports = Vec::with_capacity(total);
    for (done, (rep, v)) in interleaved(nv, opts.repetitions).enumerate() {
        let (label, o) = &cells[v];
        let r = run(o, &mut |f| {
            progress(&CompareProgress {
                done,
                total,
                variant: label.clone(),
                run_fraction: f,
            })
        })?;
        values[v][rep] = r.run.metric.value;
        per_call[v] += r.run.sched_ns_per_call / opts.repetitions as f64;
        reports.push(r);
    }
    let labels: Vec<String> = cells.iter().map(|(l, _)| l.clone()).collect();
    let table = Comparison::assemble(
        &labels,
        &values,
        &per_call,
        opts.run.duration.as_secs_f64(),
        reports.iter().map(|r| r.run.clone()).collect(),
    )?;
    Ok(BenchComparison {
        table,
        executor: opts.run.executor,
        vms: opts.run.vms,
        vcpus: opts.run.vcpus,
        reports,
    })
}
