//! The seeds' comparison on micro-guests: every mitigation set (or the
//! same set on another executor), the baseline's A/A row and the host 1:1
//! baseline, run repeatedly, interleaved.
//!
//! WHAT: [`compare`] and its options, progress and result types.
//! WHY: one run is noisy; a comparison needs repetitions that no slow
//! drift of the host can favour, and the table `vmm sched-bench` prints.
//! HOW: [`vcpu_sched::bench::interleaved`] orders the runs;
//! [`vcpu_sched::comparison::cells`] lays out the baseline, its A/A row and
//! the other sets; [`Comparison::assemble`] builds the table (noise band
//! and verdicts included) from every run's metric.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use vcpu_sched::bench::{interleaved, Comparison, ComparisonHeader, RowKind};
use vcpu_sched::comparison;
use vcpu_sched::Mitigations;

use super::{
    run, BenchError, BenchOptions, BenchReport, BusyBalance, IoCpus, Kicks, RtPull, TimerAdvance,
};
use vmm_machine::devices::BlockEngine;
use vmm_machine::vcpu_body::ExecutorKind;

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
    /// Scheduler executors to compare with the run's own: each runs the
    /// first set, as a row of its own (`SET on threads`), so that a table
    /// compares executors with everything else equal.
    pub executors: Vec<ExecutorKind>,
    /// blk only: compare virtio-blk request engines instead (the first is
    /// the baseline and gets the A/A row; the first set on the run's
    /// executor, any executor, host 1:1 included). With engines,
    /// `variants` past the first, `executors` and `host_baseline` must be
    /// empty or off.
    pub engines: Vec<BlockEngine>,
    /// blk and net: compare I/O thread placements instead
    /// ([`IoCpus`](super::IoCpus); the first is the baseline and gets the
    /// A/A row), with the same restrictions as `engines`, and not with
    /// them.
    pub io_cpus: Vec<IoCpus>,
    /// Compare wake-list kick protocols instead ([`Kicks`]; the first is
    /// the baseline and gets the A/A row), with the same restrictions as
    /// `engines`, and not with another axis.
    pub kicks: Vec<Kicks>,
    /// Compare RT pull protocols instead ([`RtPull`]; the first is the
    /// baseline and gets the A/A row), with the same restrictions.
    pub rt_pull: Vec<RtPull>,
    /// Compare the workers' timer advance off and on instead
    /// ([`TimerAdvance`]; the first is the baseline and gets the A/A
    /// row), with the same restrictions.
    pub timer_advance: Vec<TimerAdvance>,
    /// Compare the busy balance off and on instead ([`BusyBalance`]; the
    /// first is the baseline and gets the A/A row), with the same
    /// restrictions.
    pub busy_balance: Vec<BusyBalance>,
    /// Compare how the fair bounds scale with the CPUs instead
    /// ([`vcpu_sched::SliceScaling`]; the first is the baseline and gets
    /// the A/A row), with the same restrictions.
    pub fair_slice_scaling: Vec<vcpu_sched::SliceScaling>,
}

/// A row label of a fair slice scaling comparison.
#[derive(Clone, Copy)]
struct ScalingRow(vcpu_sched::SliceScaling);

impl std::fmt::Display for ScalingRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            vcpu_sched::SliceScaling::None => "unscaled slices",
            vcpu_sched::SliceScaling::Log => "log-scaled slices",
        })
    }
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
    /// The seeds' table (rows: the baseline, its A/A row, the other
    /// sets, then `host 1:1`), its fields at the top level of the JSON as
    /// in every comparison of the project.
    #[serde(flatten)]
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
    // at most one axis: each one given builds its rows (checking its
    // restrictions)
    let mut axes = Vec::new();
    if !opts.engines.is_empty() {
        axes.push(axis_cells(opts, "an engine", &opts.engines, |o, e| {
            o.blk.engine = e
        }));
    }
    if !opts.io_cpus.is_empty() {
        axes.push(axis_cells(
            opts,
            "an I/O thread placement",
            &opts.io_cpus,
            |o, p| o.io_cpus = p,
        ));
    }
    if !opts.kicks.is_empty() {
        axes.push(axis_cells(opts, "a kick protocol", &opts.kicks, |o, k| {
            o.kicks = k
        }));
    }
    if !opts.rt_pull.is_empty() {
        axes.push(axis_cells(
            opts,
            "an RT pull protocol",
            &opts.rt_pull,
            |o, p| o.rt_pull = p,
        ));
    }
    if !opts.timer_advance.is_empty() {
        axes.push(axis_cells(
            opts,
            "a timer advance setting",
            &opts.timer_advance,
            |o, t| o.timer_advance = t,
        ));
    }
    if !opts.busy_balance.is_empty() {
        axes.push(axis_cells(
            opts,
            "a busy balance setting",
            &opts.busy_balance,
            |o, b| o.busy_balance = b == BusyBalance::On,
        ));
    }
    if !opts.fair_slice_scaling.is_empty() {
        let rows: Vec<ScalingRow> = opts
            .fair_slice_scaling
            .iter()
            .map(|&s| ScalingRow(s))
            .collect();
        axes.push(axis_cells(opts, "a fair slice scaling", &rows, |o, r| {
            o.fair_slice_scaling = r.0
        }));
    }
    let cells = match axes.len() {
        0 => scheduler_cells(opts)?,
        1 => axes.pop().expect("one axis")?,
        _ => {
            return Err(BenchError::Input(
                "compare one of engines, I/O thread placements, kick protocols, RT pull \
                 protocols, timer advance, busy balance or fair slice scaling settings at a time"
                    .into(),
            ))
        }
    };
    run_cells(opts, cells, progress)
}

/// (label, kind, options) of a comparison along one option of the run
/// (`what`, in the errors): `set` gives the run each value of `values`;
/// the first value, its A/A row, then the others.
fn axis_cells<T: Copy + std::fmt::Display>(
    opts: &CompareOptions,
    what: &str,
    values: &[T],
    set: impl Fn(&mut BenchOptions, T),
) -> Result<Vec<Cell>, BenchError> {
    if opts.variants.len() > 1 || !opts.executors.is_empty() || opts.host_baseline {
        return Err(BenchError::Input(format!(
            "{what} comparison runs one mitigation set on one executor, with no host row"
        )));
    }
    let mut cells = Vec::new();
    for (i, &e) in values.iter().enumerate() {
        let mut o = opts.run.clone();
        o.mitigations = opts.variants[0];
        set(&mut o, e);
        if i == 0 {
            cells.push((e.to_string(), RowKind::Baseline, o.clone()));
            cells.push((format!("{e}{}", comparison::AA_SUFFIX), RowKind::AA, o));
        } else {
            cells.push((e.to_string(), RowKind::Variant, o));
        }
    }
    Ok(cells)
}

/// A comparison's row: label, kind, the run's options.
type Cell = (String, RowKind, BenchOptions);

/// (label, kind, options) of a mitigation or executor comparison: the
/// baseline, its A/A row, the other sets, other executors, then the
/// host's 1:1 threads as a peer.
fn scheduler_cells(opts: &CompareOptions) -> Result<Vec<Cell>, BenchError> {
    if opts.run.executor == ExecutorKind::Host {
        return Err(BenchError::Input(
            "compare with --executor workers or threads; the host 1:1 baseline is added by itself"
                .into(),
        ));
    }
    let mut cells: Vec<Cell> = comparison::cells(&opts.variants)
        .map_err(|e| BenchError::Input(e.to_string()))?
        .into_iter()
        .map(|c| {
            let mut o = opts.run.clone();
            o.mitigations = c.mitigations;
            (c.label, c.kind, o)
        })
        .collect();
    for &e in &opts.executors {
        if !e.has_scheduler() || e == opts.run.executor {
            return Err(BenchError::Input(format!(
                "compare {} with another scheduler executor (workers or threads); \
                 the host 1:1 row is added by itself",
                opts.run.executor
            )));
        }
        let mut o = cells[0].2.clone();
        o.executor = e;
        cells.push((format!("{} on {e}", o.mitigations), RowKind::Variant, o));
    }
    if opts.host_baseline {
        let mut o = opts.run.clone();
        o.executor = ExecutorKind::Host;
        cells.push(("host 1:1".into(), RowKind::Peer, o));
    }
    Ok(cells)
}

/// Runs `cells` interleaved (one warm-up run first) and assembles the
/// table.
fn run_cells(
    opts: &CompareOptions,
    cells: Vec<Cell>,
    progress: &mut dyn FnMut(&CompareProgress),
) -> Result<BenchComparison, BenchError> {
    let nv = cells.len();
    let total = nv * opts.repetitions;
    {
        let mut w = cells[0].2.clone();
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
        let (label, _, o) = &cells[v];
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
    let labels: Vec<(String, RowKind)> = cells.iter().map(|(l, k, _)| (l.clone(), *k)).collect();
    let header = ComparisonHeader::from_run(&reports[0].run, opts.run.duration.as_secs_f64());
    let table = Comparison::assemble(header, &labels, &values, &per_call)?;
    Ok(BenchComparison {
        table,
        executor: opts.run.executor,
        vms: opts.run.vms,
        vcpus: opts.run.vcpus,
        reports,
    })
}
