//! `vmm sched-bench`: the scheduler alone, on synthetic tasks (no KVM).
//!
//! One command compares `none` against `all`, or any single fix, on any
//! workload and any topology (real CPUs, or a big preset emulated onto
//! them). It drives [`vcpu_sched::bench`], which owns the measurement
//! (calibration, warm-up, interleaved repetitions, the seeds' table); this
//! module only parses arguments, shows progress and writes the outputs.
//! For real KVM vCPUs under the scheduler, see `vmm bench`
//! ([`super::bench`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use vcpu_sched::bench::{compare, run_workload_with, CompareOptions, RunOptions};
use vcpu_sched::exec::ExecutorKind;
use vcpu_sched::workload::WorkloadKind;
use vcpu_sched::{Mitigations, SchedError};

use super::args::{self, ignored, mitigation_sets, outln, progress_bar, InputError};

/// `vmm sched-bench WORKLOAD ...`.
#[derive(Debug, Args)]
pub struct SchedBenchArgs {
    /// cyclic, messaging, runq, transcode, pingpong or stress.
    pub workload: String,
    /// Topology: `host` (the real CPUs), a preset (genoa-2s, gnr-2s, ...),
    /// an hwloc synthetic string or XML file. Anything but `host` is
    /// emulated onto the CPUs this process may use.
    #[arg(long, short, default_value = "host", value_name = "SPEC")]
    pub topology: String,
    /// One mitigation set: none, all (default), only:FIX[,FIX..] or
    /// all-but:FIX[,..] (fixes: cpupri, rto, shardrq, llcidle, l2wake,
    /// grpload).
    #[arg(long, short, value_name = "SET", value_parser = args::mitigations)]
    pub mitigations: Option<Mitigations>,
    /// Compare sets instead: `seeds` (baseline, each fix alone, all), or a
    /// list `none;all;only:l2wake` whose first entry is the baseline.
    #[arg(long, value_name = "seeds|SET;SET..", conflicts_with = "mitigations")]
    pub compare: Option<String>,
    /// Measured time per run, after a warm-up: 3s, 500ms, 1m or seconds
    /// (0.3); 100ms to 1h.
    #[arg(long, short, default_value = "3s", value_name = "DURATION",
          value_parser = args::bench_duration, allow_hyphen_values = true)]
    pub duration: Duration,
    /// Repetitions of every set with --compare (1..=100, default 3).
    #[arg(long, value_name = "N", value_parser = args::reps,
          allow_negative_numbers = true)]
    pub reps: Option<usize>,
    /// Run the invariant checker; a violation fails the run.
    #[arg(long)]
    pub check: bool,
    /// Run a comparison estimated over 2 h (otherwise refused as a
    /// likely slip in --duration, --reps or --compare).
    #[arg(long)]
    pub long: bool,
    /// Also write the full result as JSON here: a new file (one that
    /// exists is refused, never replaced; checked before the run starts).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Tasks (cyclic, stress) or workers per message task (runq); 1..=4096.
    #[arg(long, value_name = "N", value_parser = args::count,
          allow_negative_numbers = true)]
    pub tasks: Option<usize>,
    /// Groups (messaging, pingpong), message tasks (runq), VMs
    /// (transcode); 1..=4096.
    #[arg(long, value_name = "N", value_parser = args::count,
          allow_negative_numbers = true)]
    pub groups: Option<usize>,
    /// Senders and receivers per group (messaging), tasks per VM
    /// (transcode), tasks per group (pingpong, an even number: pairs);
    /// 1..=4096.
    #[arg(long, value_name = "N", value_parser = args::count,
          allow_negative_numbers = true)]
    pub group_size: Option<usize>,
    /// Timer period in microseconds (cyclic, stress sleeps); 1..=1000000.
    #[arg(long, value_name = "US", value_parser = args::period_us,
          allow_negative_numbers = true)]
    pub period_us: Option<u64>,
    /// Compute per operation in microseconds (cyclic, messaging, runq,
    /// transcode, pingpong, stress); 1..=1000000.
    #[arg(long, value_name = "US", value_parser = args::burst_us,
          allow_negative_numbers = true)]
    pub burst_us: Option<u64>,
    /// RT priority (cyclic, transcode), 1..=99.
    #[arg(long, value_name = "PRIO", value_parser = args::prio,
          allow_negative_numbers = true)]
    pub prio: Option<u8>,
    /// What runs the tasks: `threads` (a thread per task handing run slots
    /// over; the default), `workers` (M:N, a worker per CPU) or `host`
    /// (plain threads the host kernel schedules, no vcpu_sched: the peer).
    #[arg(long, short = 'e', default_value = "threads", value_name = "EXECUTOR",
          value_parser = |s: &str| s.parse::<ExecutorKind>())]
    pub executor: ExecutorKind,
}

/// The workloads that use each tunable; giving it to another is an error
/// (it would be ignored).
const USES: [(&str, &[WorkloadKind]); 6] = {
    use WorkloadKind::*;
    [
        ("--tasks", &[Cyclic, Runq, Stress]),
        ("--groups", &[Messaging, Runq, Transcode, Pingpong]),
        ("--group-size", &[Messaging, Transcode, Pingpong]),
        ("--period-us", &[Cyclic, Stress]),
        (
            "--burst-us",
            &[Cyclic, Messaging, Runq, Transcode, Pingpong, Stress],
        ),
        ("--prio", &[Cyclic, Transcode]),
    ]
};

fn check_applicable(a: &SchedBenchArgs, w: WorkloadKind) -> Result<()> {
    let given = [
        a.tasks.is_some(),
        a.groups.is_some(),
        a.group_size.is_some(),
        a.period_us.is_some(),
        a.burst_us.is_some(),
        a.prio.is_some(),
    ];
    for ((flag, uses), given) in USES.iter().zip(given) {
        if given && !uses.contains(&w) {
            let names: Vec<String> = uses.iter().map(|u| u.to_string()).collect();
            return Err(ignored(flag, &names.join(", "), &format!("the {w} workload")).into());
        }
    }
    if a.compare.is_none() && a.reps.is_some() {
        return Err(ignored("--reps", "--compare", "a single run").into());
    }
    if a.compare.is_none() && a.long {
        return Err(ignored("--long", "--compare", "a single run").into());
    }
    if a.executor == ExecutorKind::Host {
        // the host kernel schedules: there is no vcpu_sched to set or check
        let here = "--executor host (the host kernel schedules)";
        let sched = "the threads and workers executors";
        for (flag, given) in [
            ("--mitigations", a.mitigations.is_some()),
            ("--compare", a.compare.is_some()),
            ("--check", a.check),
        ] {
            if given {
                return Err(ignored(flag, sched, here).into());
            }
        }
    }
    Ok(())
}

fn input<T>(r: std::result::Result<T, SchedError>, what: &str) -> Result<T> {
    r.map_err(|e| InputError(format!("{what}: {e}")).into())
}

/// Runs the command.
pub fn run(a: SchedBenchArgs) -> Result<()> {
    let workload: WorkloadKind = input(a.workload.parse(), "workload")?;
    check_applicable(&a, workload)?;
    if let Some(path) = &a.json {
        args::check_output_file("--json", path, false)?;
    }
    let mut run = RunOptions::new(workload, &a.topology);
    run.executor = a.executor;
    run.duration = a.duration;
    run.check = a.check;
    run.params.tasks = a.tasks;
    run.params.groups = a.groups;
    run.params.group_size = a.group_size;
    run.params.period_us = a.period_us;
    run.params.burst_us = a.burst_us;
    run.params.prio = a.prio;
    // Fail on a bad topology before any progress bar appears.
    topology::load(&a.topology)
        .map_err(SchedError::from)
        .with_context(|| format!("--topology {}", a.topology))?;

    let json = match &a.compare {
        Some(list) => run_compare(&a, list, run)?,
        None => {
            let bar = progress_bar();
            run.mitigations = a.mitigations.unwrap_or_else(Mitigations::all);
            bar.set_message(run.mitigations.to_string());
            let r = run_workload_with(&run, &mut |f| bar.set_position((f * 1000.0) as u64))?;
            bar.finish_and_clear();
            if !r.metric.value.is_finite() || r.metric.value <= 0.0 {
                return Err(anyhow::anyhow!(
                    "{} on {} measured nothing: {} came out as {} over {:.2} s; give a \
                     smaller --burst-us, fewer tasks or a longer --duration",
                    r.workload,
                    r.topology,
                    r.metric.name,
                    r.metric.value,
                    r.duration_s
                ));
            }
            let set = match r.executor {
                ExecutorKind::Host => "host 1:1".to_string(),
                ExecutorKind::Threads => r.mitigations.clone(),
                e => format!("{}, {e}", r.mitigations),
            };
            outln!(
                "{} on {} [{}]: {} = {:.3} {} ({} tasks on {} CPUs, {:.1} s, {:.0} ns per schedule call, {} migrations{})",
                r.workload,
                r.topology,
                set,
                r.metric.name,
                r.metric.value,
                r.metric.unit,
                r.tasks,
                r.cpus,
                r.duration_s,
                r.sched_ns_per_call,
                r.task_summary.migrations,
                if run.check {
                    format!(", {} checker snapshots clean", r.checks)
                } else {
                    String::new()
                }
            );
            serde_json::to_string_pretty(&r).context("serialising the report")?
        }
    };
    if let Some(path) = &a.json {
        args::write_new("--json", path, json.as_bytes())?;
        eprintln!("JSON written to {}", path.display());
    }
    Ok(())
}

/// `--compare LIST`: every set and the A/A row, interleaved; prints the
/// table and returns the JSON.
fn run_compare(a: &SchedBenchArgs, list: &str, run: RunOptions) -> Result<String> {
    let variants = mitigation_sets(list)?;
    if variants.len() < 2 {
        return Err(InputError(format!(
            "--compare {list:?}: give at least two sets, e.g. \"none;all\", or seeds"
        ))
        .into());
    }
    // every set and the A/A row, each repetition
    args::check_compare_work(
        (variants.len() + 1) * a.reps.unwrap_or(3),
        a.duration,
        a.long,
    )?;
    let bar = progress_bar();
    let c = compare(
        &CompareOptions {
            run,
            variants,
            repetitions: a.reps.unwrap_or(3),
        },
        &mut |p| {
            let f = (p.done as f64 + p.run_fraction) / p.total.max(1) as f64;
            bar.set_position((f * 1000.0) as u64);
            bar.set_message(format!("{} rep {}", p.variant, p.repetition + 1));
        },
    )?;
    bar.finish_and_clear();
    outln!("{}", c.table.render_paired_table());
    Ok(c.to_json())
}
