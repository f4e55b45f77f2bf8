//! `--sweep cpus=N,N..`: every set on the first N CPUs of the topology,
//! for each N; the CSV on stdout, and with `--plot` the curve as SVG (and
//! the CSV beside it).

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context, Result};
use cli_common::out;
use cli_common::outln;
use cli_common::term::progress_bar;
use vcpu_sched_sim::exec::sim;
use vcpu_sched_sim::SchedError;

use crate::args::{Plan, SimArgs};
use crate::plot::plot_svg;
use crate::stop::STOP;

/// One line of the curve: a set's name and its (CPUs, metric) points.
type Series = (String, Vec<(usize, f64)>);

/// Runs the sweep over `sizes` and prints (and plots) it.
pub fn run(a: &SimArgs, plan: &Plan, sizes: &[usize]) -> Result<()> {
    let (csv, points, partial) = measure(a, plan, sizes)?;
    if partial {
        outln!("PARTIAL: stopped by Ctrl-C");
    }
    out!("{csv}");
    if let Some(svg) = &a.plot {
        let (metric, unit, _) = plan.workload.metric();
        let title = format!(
            "vmm sim {} on {} ({} s virtual){}",
            plan.workload.name(),
            a.topology,
            a.duration.as_secs_f64(),
            if partial { " PARTIAL" } else { "" }
        );
        let drawn = plot_svg(&title, &format!("{metric} ({unit})"), &points)?;
        cli_common::args::write_new("--plot", svg, drawn.as_bytes())?;
        let csv_path = svg.with_extension("csv");
        cli_common::args::write_new("--plot", &csv_path, csv.as_bytes())?;
        eprintln!("written to {} and {}", svg.display(), csv_path.display());
    }
    Ok(())
}

/// The runs: the CSV, the points per set, and whether Ctrl-C cut them
/// short.
fn measure(a: &SimArgs, plan: &Plan, sizes: &[usize]) -> Result<(String, Vec<Series>, bool)> {
    let bar = progress_bar();
    let mut csv = String::from("cpus,mitigations,metric,sched_share\n");
    let mut points: Vec<Series> = plan
        .variants
        .iter()
        .map(|m| (m.to_string(), Vec::new()))
        .collect();
    let total = (sizes.len() * plan.variants.len()) as u64;
    let mut k = 0;
    let mut partial = false;
    'sizes: for &n in sizes {
        let ids: Vec<u32> = (0..n as u32).collect();
        let sub = Arc::new(
            plan.topo
                .restrict(&ids)
                .map_err(SchedError::from)
                .with_context(|| format!("restricting the topology to {n} CPUs"))?,
        );
        for (vi, &m) in plan.variants.iter().enumerate() {
            bar.set_message(format!("{n} CPUs {m}"));
            bar.set_position(k * 1000 / total);
            k += 1;
            let cfg = plan.config(n, a, a.seed, m);
            let r = sim::run(sub.clone(), &cfg, &STOP)?;
            let _ = writeln!(csv, "{n},{m},{},{:.5}", r.metric, r.sched_share);
            points[vi].1.push((n, r.metric));
            if r.partial {
                partial = true;
                break 'sizes;
            }
        }
    }
    bar.finish_and_clear();
    Ok((csv, points, partial))
}
