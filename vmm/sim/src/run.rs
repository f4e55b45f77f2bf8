//! `vmm sim`'s runs: the flags checked and resolved ([`Plan`]), then one
//! run, a comparison of mitigation sets, or a sweep ([`crate::sweep`]).

use anyhow::{Context, Result};
use cli_common::exit::InputError;
use cli_common::outln;
use cli_common::term::progress_bar;
use vcpu_sched_sim::comparison::{cells, Cell, Comparison, ComparisonHeader, RowKind};
use vcpu_sched_sim::exec::sim::{self, SimReport};

use crate::args::{parse_sweep, Plan, SimArgs};
use crate::report::{print_views, share_table, write};
use crate::stop::{catch_ctrl_c, STOP};

/// Runs the command.
pub fn run(a: SimArgs) -> Result<()> {
    let plan = Plan::from_args(&a)?;
    catch_ctrl_c();
    if let Some(sweep) = &a.sweep {
        let sizes = parse_sweep(sweep)?;
        if let Some(&n) = sizes.iter().find(|&&n| n > plan.topo.num_cpus()) {
            return Err(InputError(format!(
                "--sweep: {n} CPUs, but {} has {}",
                a.topology,
                plan.topo.num_cpus()
            ))
            .into());
        }
        crate::args::check_work(&a, &plan, &sizes)?;
        return crate::sweep::run(&a, &plan, &sizes);
    }
    crate::args::check_work(&a, &plan, &[plan.topo.num_cpus()])?;
    if a.compare.is_some() {
        compare(&a, &plan)
    } else {
        single(&a, &plan)
    }
}

/// What a comparison measured: per cell, every repetition's metric, the
/// mean ns per core call, and the first repetition's report.
struct Measured {
    values: Vec<Vec<f64>>,
    per_call: Vec<f64>,
    firsts: Vec<Option<SimReport>>,
    partial: bool,
}

/// Runs every cell `--reps` times, cells interleaved within a repetition;
/// the A/A cell runs the baseline with the next seed.
fn measure(a: &SimArgs, plan: &Plan, cells: &[Cell]) -> Result<Measured> {
    let bar = progress_bar();
    let reps = a.reps.unwrap_or(1);
    let cpus = plan.topo.num_cpus();
    let total = (cells.len() * reps) as u64;
    let mut m = Measured {
        values: vec![Vec::new(); cells.len()],
        per_call: vec![0.0; cells.len()],
        firsts: vec![None; cells.len()],
        partial: false,
    };
    'outer: for rep in 0..reps {
        for (i, c) in cells.iter().enumerate() {
            let seed = a.seed + 1000 * rep as u64 + u64::from(c.kind == RowKind::AA);
            bar.set_message(format!("{} rep {}", c.label, rep + 1));
            let cfg = plan.config(cpus, a, seed, c.mitigations);
            let done = (rep * cells.len() + i) as u64;
            let r = sim::run_with_progress(plan.topo.clone(), &cfg, &STOP, &mut |t| {
                let f = (done as f64 + t as f64 / cfg.duration_ns as f64) / total as f64;
                bar.set_position((f * 1000.0) as u64);
            })?;
            m.values[i].push(r.metric);
            m.per_call[i] += r.sched_ns_per_call / reps as f64;
            m.partial |= r.partial;
            if m.firsts[i].is_none() {
                m.firsts[i] = Some(r);
            }
            if m.partial {
                break 'outer;
            }
        }
    }
    bar.finish_and_clear();
    Ok(m)
}

/// `--compare`: the seeds' table, the scheduler's share per set, the
/// views, and the comparison's JSON.
fn compare(a: &SimArgs, plan: &Plan) -> Result<()> {
    let cells = cells(&plan.variants)?;
    let mut m = measure(a, plan, &cells)?;
    if m.partial {
        outln!("PARTIAL: stopped by Ctrl-C; the table covers what finished");
        for v in m.values.iter_mut() {
            if v.is_empty() {
                v.push(f64::NAN);
            }
        }
    }
    let cpus = plan.topo.num_cpus();
    let (metric, unit, higher) = plan.workload.metric();
    let header = ComparisonHeader {
        workload: format!("sim {}", plan.workload.name()),
        topology: a.topology.clone(),
        cpus,
        host_cpus: cpus,
        metric: metric.to_string(),
        unit: unit.to_string(),
        higher_is_better: higher,
        duration_s: a.duration.as_secs_f64(),
    };
    let labels: Vec<(String, RowKind)> = cells.iter().map(|c| (c.label.clone(), c.kind)).collect();
    let c = Comparison::assemble(header, &labels, &m.values, &m.per_call)
        .context("assembling the comparison")?;
    outln!("{}", c.render_table());
    outln!("{}", share_table(&cells, &m.firsts));
    for (cell, r) in cells.iter().zip(&m.firsts) {
        if let Some(line) = r.as_ref().and_then(interleave_line) {
            outln!("interleaved [{}]: {line}", cell.label);
        }
    }
    for (cell, r) in cells.iter().zip(&m.firsts) {
        if let Some(r) = r {
            print_views(a, &cell.label, r);
        }
    }
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(&c).context("serialising the comparison")?;
        write(path, &json)?;
    }
    Ok(())
}

/// One run of the one set: its line, its counters, the views and the
/// report's JSON; invariant violations fail it (exit 1).
fn single(a: &SimArgs, plan: &Plan) -> Result<()> {
    let bar = progress_bar();
    let set = plan.variants[0];
    let cfg = plan.config(plan.topo.num_cpus(), a, a.seed, set);
    bar.set_message(set.to_string());
    let r = sim::run_with_progress(plan.topo.clone(), &cfg, &STOP, &mut |t| {
        bar.set_position(t * 1000 / cfg.duration_ns)
    })?;
    bar.finish_and_clear();
    outln!(
        "{}sim {} on {} [{}]: {} = {:.1} {} ({} VMs x {} vCPUs on {} CPUs, {:.3} s virtual, \
         {:.1}% of CPU time in the scheduler, {:.0} ns per core call{})",
        if r.partial { "PARTIAL: " } else { "" },
        r.workload,
        a.topology,
        r.mitigations,
        r.metric_name,
        r.metric,
        plan.workload.metric().1,
        cfg.vms,
        cfg.vcpus,
        r.cpus,
        r.simulated_ns as f64 / 1e9,
        100.0 * r.sched_share,
        r.sched_ns_per_call,
        if r.violations.is_empty() {
            String::new()
        } else {
            format!(", {} INVARIANT VIOLATIONS", r.violations.len())
        }
    );
    let counters: Vec<String> = r
        .counters
        .fields()
        .into_iter()
        .filter(|&(_, v)| v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    outln!("  counters: {}", counters.join(", "));
    if plan.workload == sim::SimWorkload::Cyclic {
        outln!(
            "  timer -> running: p99 {:.0} ns (the metric), mean {:.0} ns, max {} ns",
            r.metric,
            r.mean_latency_ns,
            r.max_latency_ns
        );
    }
    if r.absorbed_wakes > 0 && r.interleave.is_none() {
        outln!(
            "  absorbed wakes: {} (the task was awake; their tokens merged)",
            r.absorbed_wakes
        );
    }
    if let Some(line) = interleave_line(&r) {
        outln!("  interleaved: {line}");
    }
    print_views(a, &r.mitigations, &r);
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(&r).context("serialising the report")?;
        write(path, &json)?;
    }
    if !r.violations.is_empty() {
        return Err(anyhow::anyhow!(
            "invariant violations: {}",
            r.violations.join("; ")
        ));
    }
    Ok(())
}

/// What interleaving did in run `r` (its first repetition in a
/// comparison), or `None` if each call ran to completion.
fn interleave_line(r: &SimReport) -> Option<String> {
    let il = r.interleave.as_ref()?;
    Some(format!(
        "{} accesses, {} waits for another CPU's earlier event, {} wakes reached a task still on its way to sleep; locks: {} waits ({} slept), {:.0} ns mean; {} checks waited {:.0} ns mean for calls in flight; pass-bys {}, push requests {}",
        il.accesses,
        il.queued,
        r.absorbed_wakes,
        il.lock_blocks,
        il.lock_sleeps,
        il.lock_wait_ns as f64 / il.lock_blocks.max(1) as f64,
        il.checks_delayed,
        il.check_hold_ns as f64 / il.checks_delayed.max(1) as f64,
        r.counters.balance_passed_by,
        r.counters.push_requests,
    ))
}
