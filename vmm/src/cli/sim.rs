//! `vmm sim`: the scheduler core on a big topology in deterministic virtual
//! time ([`vcpu_sched::exec::sim`]), with memory costs from a cited
//! per-preset table.
//!
//! One run prints the workload's metric and the share of simulated CPU
//! time inside the scheduler; `--compare` prints the same seeds' table and
//! JSON as `vmm bench --compare` ([`vcpu_sched::comparison`]), its A/A row
//! being the baseline with another seed; `--c2c` and `--lockstat` name the
//! hot structures and locks; `--sweep cpus=...` with `--plot` writes a
//! scaling curve (SVG and CSV). Ctrl-C stops a run cleanly and what is
//! printed is marked partial.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use vcpu_sched::comparison::{cells, Comparison, ComparisonHeader, RowKind};
use vcpu_sched::exec::sim::{self, CostTable, SimConfig, SimReport, SimWorkload};
use vcpu_sched::{Mitigations, SchedError};

use super::args::{self, ignored, mitigation_sets, out, outln, progress_bar, InputError};

/// `vmm sim WORKLOAD ...`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// messaging, cyclic, transcode, pingpong or runq.
    pub workload: String,
    /// Topology: a preset (gnr-2s, spr-2s, icx-2s, clx-2s, genoa-2s,
    /// milan-2s) or an hwloc synthetic string (then give --costs).
    #[arg(long, short, value_name = "PRESET|SPEC")]
    pub topology: String,
    /// The preset whose latency table to use (default: --topology's).
    #[arg(long, value_name = "PRESET")]
    pub costs: Option<String>,
    /// Scale every latency of the table (sensitivity: 0.5, 1.5); 0.1..=10.
    #[arg(long, value_name = "F", default_value_t = 1.0, value_parser = latency_scale)]
    pub latency_scale: f64,
    /// VMs (task groups); default: enough to fill the CPUs (twice for
    /// messaging; one per 8 CPUs for runq, as `sched-bench runq`); 1..=4096.
    #[arg(long, value_name = "N", value_parser = args::count, allow_negative_numbers = true)]
    pub vms: Option<usize>,
    /// vCPUs (tasks) per VM, 1..=4096 (default 8; 2 for pingpong, which
    /// pairs them and needs an even number; 9 for runq, a message task and
    /// 8 workers; messaging and runq need 2 or more).
    #[arg(long, value_name = "M", value_parser = args::count, allow_negative_numbers = true)]
    pub vcpus: Option<usize>,
    /// Mean compute per step in microseconds, 1..=1000000 (default: the
    /// workload's definition, `vcpu_sched::workload::defs`: messaging 1,
    /// cyclic 5, transcode 500, runq 20; pingpong 5).
    #[arg(long, value_name = "US", value_parser = args::burst_us)]
    pub burst_us: Option<u64>,
    /// Virtual time to simulate: 1s, 200ms, ...; 1ms to 1h.
    #[arg(long, short, default_value = "1s", value_name = "DURATION",
          value_parser = sim_duration, allow_hyphen_values = true)]
    pub duration: Duration,
    /// The workload's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One mitigation set: none, all (default), only:FIX[,FIX..] or
    /// all-but:FIX[,..].
    #[arg(long, short, value_name = "SET", value_parser = args::mitigations)]
    pub mitigations: Option<Mitigations>,
    /// Compare sets: `seeds` (baseline, each fix alone, all) or a list
    /// `none;all` whose first entry is the baseline. The A/A row is the
    /// baseline with another seed.
    #[arg(long, value_name = "seeds|SET;SET..", conflicts_with = "mitigations")]
    pub compare: Option<String>,
    /// Repetitions (seeds) of every set with --compare (1..=100, default 1).
    #[arg(long, value_name = "N", value_parser = args::reps, allow_negative_numbers = true)]
    pub reps: Option<usize>,
    /// Also write the result as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print cache-line transfers and their cost per structure and field.
    #[arg(long)]
    pub c2c: bool,
    /// Print contended acquisitions and wait time per lock class.
    #[arg(long)]
    pub lockstat: bool,
    /// A scaling sweep: `cpus=16,64,192` (the first N CPUs of the
    /// topology), each with every --compare set (or the one set).
    #[arg(long, value_name = "cpus=N,N..")]
    pub sweep: Option<String>,
    /// With --sweep: write the curve as SVG here and as CSV beside it.
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub plot: Option<PathBuf>,
}

fn latency_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.1..=10.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a scale from 0.1 to 10")),
    }
}

fn sim_duration(s: &str) -> Result<Duration, String> {
    let d = args::parse_duration(s)?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(3600) {
        return Err(format!("{s:?}: give 1ms to 1h of virtual time"));
    }
    Ok(d)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Ctrl-C sets [`STOP`]; the simulator checks it every 10 ms of virtual
/// time and returns what it has, marked partial.
fn catch_ctrl_c() {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; installing it changes no memory of ours.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}

fn parse_sweep(s: &str) -> Result<Vec<usize>, InputError> {
    let bad = || {
        InputError(format!(
            "--sweep {s:?}: give cpus=N,N.. such as cpus=16,64,192"
        ))
    };
    let list = s.strip_prefix("cpus=").ok_or_else(bad)?;
    let v: Vec<usize> = list
        .split(',')
        .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n >= 2))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if v.is_empty() {
        return Err(bad());
    }
    Ok(v)
}

struct Setup {
    workload: SimWorkload,
    cost: CostTable,
    vcpus: usize,
    vms: Option<usize>,
}

fn config(s: &Setup, cpus: usize, a: &SimArgs, seed: u64, mit: Mitigations) -> SimConfig {
    let per = if s.workload == SimWorkload::Messaging {
        2
    } else {
        1
    };
    let fill = if s.workload == SimWorkload::Runq {
        // one team per 8 CPUs, as the thread workload's default
        (cpus / 8).max(1)
    } else {
        (cpus * per / s.vcpus).max(1)
    };
    SimConfig {
        workload: s.workload,
        vms: s.vms.unwrap_or(fill),
        vcpus: s.vcpus,
        duration_ns: a.duration.as_nanos() as u64,
        work_ns: a.burst_us.map(|us| us * 1000),
        seed,
        mitigations: mit,
        cost: s.cost,
    }
}

fn load(spec: &str) -> Result<Arc<topology::HostTopology>> {
    Ok(Arc::new(
        topology::load(spec)
            .map_err(SchedError::from)
            .map_err(|e| InputError(format!("--topology {spec}: {e}")))?,
    ))
}

/// Runs the command.
pub fn run(a: SimArgs) -> Result<()> {
    let workload = SimWorkload::parse(&a.workload).ok_or_else(|| {
        InputError(format!(
            "workload {:?}: give messaging, cyclic, transcode, pingpong or runq",
            a.workload
        ))
    })?;
    if a.compare.is_none() && a.reps.is_some() {
        return Err(ignored("--reps", "--compare", "a single run").into());
    }
    if let Some(path) = &a.json {
        args::check_output_file("--json", path, true)?;
    }
    if let Some(path) = &a.plot {
        args::check_output_file("--plot", path, true)?;
    }
    let topo = load(&a.topology)?;
    let table_name = a.costs.clone().unwrap_or_else(|| a.topology.clone());
    let cost = CostTable::for_preset(&table_name)
        .filter(|_| table_name != "test")
        .ok_or_else(|| {
            InputError(format!(
                "no latency table for {table_name:?}: give --costs with one of gnr-2s, spr-2s, \
                 icx-2s, clx-2s, genoa-2s, milan-2s"
            ))
        })?
        .scaled(a.latency_scale);
    let variants = match &a.compare {
        Some(list) => {
            let v = mitigation_sets(list)?;
            if v.len() < 2 {
                return Err(InputError(format!(
                    "--compare {list:?}: give at least two sets, e.g. \"none;all\", or seeds"
                ))
                .into());
            }
            v
        }
        None => vec![a.mitigations.unwrap_or_else(Mitigations::all)],
    };
    let setup = Setup {
        workload,
        cost,
        vcpus: a.vcpus.unwrap_or(match workload {
            SimWorkload::Pingpong => 2,
            SimWorkload::Runq => 9,
            _ => 8,
        }),
        vms: a.vms,
    };
    if workload == SimWorkload::Pingpong && setup.vcpus % 2 != 0 {
        return Err(InputError(format!(
            "--vcpus {}: pingpong pairs a VM's vCPUs (2p with 2p+1); give an even number",
            setup.vcpus
        ))
        .into());
    }
    if workload == SimWorkload::Messaging && setup.vcpus < 2 {
        return Err(InputError(
            "--vcpus 1: messaging needs a sender and a receiver per VM; give 2 or more".into(),
        )
        .into());
    }
    if workload == SimWorkload::Runq && setup.vcpus < 2 {
        return Err(InputError(
            "--vcpus 1: runq needs a message task and a worker per VM; give 2 or more".into(),
        )
        .into());
    }
    catch_ctrl_c();
    if let Some(sweep) = &a.sweep {
        let sizes = parse_sweep(sweep)?;
        if let Some(&n) = sizes.iter().find(|&&n| n > topo.num_cpus()) {
            return Err(InputError(format!(
                "--sweep: {n} CPUs, but {} has {}",
                a.topology,
                topo.num_cpus()
            ))
            .into());
        }
        return sweep_run(&a, &setup, &topo, &sizes, &variants);
    }
    let bar = progress_bar();
    let reps = a.reps.unwrap_or(1);
    let cpus = topo.num_cpus();
    if a.compare.is_some() {
        let cells = cells(&variants)?;
        let total = (cells.len() * reps) as u64;
        let mut values = vec![Vec::new(); cells.len()];
        let mut per_call = vec![0.0; cells.len()];
        let mut firsts: Vec<Option<SimReport>> = vec![None; cells.len()];
        let mut partial = false;
        'outer: for rep in 0..reps {
            for (i, c) in cells.iter().enumerate() {
                let seed = a.seed + 1000 * rep as u64 + u64::from(c.kind == RowKind::AA);
                bar.set_message(format!("{} rep {}", c.label, rep + 1));
                let cfg = config(&setup, cpus, &a, seed, c.mitigations);
                let done = (rep * cells.len() + i) as u64;
                let r = sim::run_with_progress(topo.clone(), &cfg, &STOP, &mut |t| {
                    let f = (done as f64 + t as f64 / cfg.duration_ns as f64) / total as f64;
                    bar.set_position((f * 1000.0) as u64);
                })?;
                values[i].push(r.metric);
                per_call[i] += r.sched_ns_per_call / reps as f64;
                partial |= r.partial;
                if firsts[i].is_none() {
                    firsts[i] = Some(r);
                }
                if partial {
                    break 'outer;
                }
            }
        }
        bar.finish_and_clear();
        if partial {
            outln!("PARTIAL: stopped by Ctrl-C; the table covers what finished");
            for v in values.iter_mut() {
                if v.is_empty() {
                    v.push(f64::NAN);
                }
            }
        }
        let (metric, unit, higher) = workload.metric();
        let header = ComparisonHeader {
            workload: format!("sim {}", workload.name()),
            topology: a.topology.clone(),
            cpus,
            host_cpus: cpus,
            metric: metric.to_string(),
            unit: unit.to_string(),
            higher_is_better: higher,
            duration_s: a.duration.as_secs_f64(),
        };
        let labels: Vec<(String, RowKind)> =
            cells.iter().map(|c| (c.label.clone(), c.kind)).collect();
        let c = Comparison::assemble(header, &labels, &values, &per_call)
            .context("assembling the comparison")?;
        outln!("{}", c.render_table());
        outln!("{}", share_table(&cells, &firsts));
        for (cell, r) in cells.iter().zip(&firsts) {
            if let Some(r) = r {
                print_views(&a, &cell.label, r);
            }
        }
        if let Some(path) = &a.json {
            let json = serde_json::to_string_pretty(&c).context("serialising the comparison")?;
            write(path, &json)?;
        }
    } else {
        let cfg = config(&setup, cpus, &a, a.seed, variants[0]);
        bar.set_message(variants[0].to_string());
        let r = sim::run_with_progress(topo.clone(), &cfg, &STOP, &mut |t| {
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
            workload.metric().1,
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
        if r.absorbed_wakes > 0 {
            outln!(
                "  absorbed wakes: {} (the task was awake; their tokens merged)",
                r.absorbed_wakes
            );
        }
        print_views(&a, &r.mitigations, &r);
        if let Some(path) = &a.json {
            write(
                path,
                &serde_json::to_string_pretty(&r).context("serialising the report")?,
            )?;
        }
        if !r.violations.is_empty() {
            return Err(anyhow::anyhow!(
                "invariant violations: {}",
                r.violations.join("; ")
            ));
        }
    }
    Ok(())
}

fn write(path: &std::path::Path, s: &str) -> Result<()> {
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("written to {}", path.display());
    Ok(())
}

fn share_table(cells: &[vcpu_sched::comparison::Cell], firsts: &[Option<SimReport>]) -> String {
    let mut s = String::from("scheduler share of simulated CPU time (first repetition):\n");
    for (c, r) in cells.iter().zip(firsts) {
        if let Some(r) = r {
            let _ = writeln!(
                s,
                "  {:<28} {:>6.2}%  {:>7.0} ns/call{}",
                c.label,
                100.0 * r.sched_share,
                r.sched_ns_per_call,
                if r.violations.is_empty() {
                    String::new()
                } else {
                    format!("  {} INVARIANT VIOLATIONS", r.violations.len())
                }
            );
        }
    }
    s
}

fn print_views(a: &SimArgs, label: &str, r: &SimReport) {
    if a.c2c {
        outln!("c2c [{label}]: cache-line transfers per structure, hottest first");
        outln!(
            "  {:<40} {:>12} {:>14} {:>9}",
            "structure.field",
            "transfers",
            "cost ms",
            "ns/xfer"
        );
        for row in r.c2c.iter().take(12) {
            outln!(
                "  {:<40} {:>12} {:>14.3} {:>9.1}",
                row.name,
                row.transfers,
                row.cost_ns as f64 / 1e6,
                row.cost_ns as f64 / row.transfers.max(1) as f64
            );
        }
    }
    if a.lockstat {
        outln!("lockstat [{label}]: per lock class, most waited first");
        outln!(
            "  {:<40} {:>12} {:>12} {:>14}",
            "class",
            "acquisitions",
            "contended",
            "wait ms"
        );
        for row in &r.lockstat {
            outln!(
                "  {:<40} {:>12} {:>12} {:>14.3}",
                row.name,
                row.acquisitions,
                row.contended,
                row.wait_ns as f64 / 1e6
            );
        }
    }
}

fn sweep_run(
    a: &SimArgs,
    setup: &Setup,
    topo: &topology::HostTopology,
    sizes: &[usize],
    variants: &[Mitigations],
) -> Result<()> {
    let bar = progress_bar();
    let mut csv = String::from("cpus,mitigations,metric,sched_share\n");
    let mut points: Vec<(String, Vec<(usize, f64)>)> = variants
        .iter()
        .map(|m| (m.to_string(), Vec::new()))
        .collect();
    let total = (sizes.len() * variants.len()) as u64;
    let mut k = 0;
    let mut partial = false;
    for &n in sizes {
        let ids: Vec<u32> = (0..n as u32).collect();
        let sub = Arc::new(
            topo.restrict(&ids)
                .map_err(SchedError::from)
                .with_context(|| format!("restricting the topology to {n} CPUs"))?,
        );
        for (vi, &m) in variants.iter().enumerate() {
            bar.set_message(format!("{n} CPUs {m}"));
            bar.set_position(k * 1000 / total);
            k += 1;
            let cfg = config(setup, n, a, a.seed, m);
            let r = sim::run(sub.clone(), &cfg, &STOP)?;
            let _ = writeln!(csv, "{n},{m},{},{:.5}", r.metric, r.sched_share);
            points[vi].1.push((n, r.metric));
            if r.partial {
                partial = true;
                break;
            }
        }
        if partial {
            break;
        }
    }
    bar.finish_and_clear();
    if partial {
        outln!("PARTIAL: stopped by Ctrl-C");
    }
    out!("{csv}");
    if let Some(svg) = &a.plot {
        let (metric, unit, _) = setup.workload.metric();
        let title = format!(
            "vmm sim {} on {} ({} s virtual){}",
            setup.workload.name(),
            a.topology,
            a.duration.as_secs_f64(),
            if partial { " PARTIAL" } else { "" }
        );
        let drawn = plot_svg(&title, &format!("{metric} ({unit})"), &points)?;
        std::fs::write(svg, drawn).with_context(|| format!("writing {}", svg.display()))?;
        let csv_path = svg.with_extension("csv");
        std::fs::write(&csv_path, &csv)
            .with_context(|| format!("writing {}", csv_path.display()))?;
        eprintln!("written to {} and {}", svg.display(), csv_path.display());
    }
    Ok(())
}

/// A line chart with plotters: the metric against CPUs, one line (with
/// its points marked) per variant, and a legend.
fn plot_svg(title: &str, ylabel: &str, series: &[(String, Vec<(usize, f64)>)]) -> Result<String> {
    use plotters::prelude::*;

    let finite = |p: &&(usize, f64)| p.1.is_finite();
    let pts = series.iter().flat_map(|s| s.1.iter()).filter(finite);
    let xmax = pts.clone().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
    let ymax = pts.map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0 as f64))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (800, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(14)
            .x_label_area_size(42)
            .y_label_area_size(78)
            .build_cartesian_2d(0f64..xmax * 1.05, 0f64..ymax)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("CPUs")
            .y_desc(ylabel)
            .x_labels(xs.len().clamp(2, 12))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| short(*v))
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_err)?;
        for (i, (name, p)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line: Vec<(f64, f64)> = p
                .iter()
                .filter(finite)
                .map(|&(n, v)| (n as f64, v))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|&q| Circle::new(q, 3, color.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

/// plotters' errors carry the backend's error type; the message is what
/// a user needs.
fn plot_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
