//! Runs a workload, or compares mitigation sets, from the command line,
//! until the `vmm sched-bench` subcommand exists.
//!
//! ```text
//! cargo run -p vcpu_sched --release --example sched_bench -- \
//!     WORKLOAD [--topology SPEC] [--mitigations SET | --compare seeds|SET;SET..] \
//!     [--duration SECS] [--reps N] [--check] [--json FILE] \
//!     [--tasks N] [--groups N] [--group-size N] [--period-us N] [--burst-us N] [--prio N]
//! ```

use std::io::Write;
use std::time::Duration;

use vcpu_sched::bench::{compare, run_workload, CompareOptions, RunOptions};
use vcpu_sched::Mitigations;

fn main() {
    if let Err(e) = real_main() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(workload) = args.first() else {
        return Err("usage: sched_bench WORKLOAD [--topology SPEC] [--mitigations SET | --compare seeds|SET;SET..] [--duration SECS] [--reps N] [--check] [--json FILE]".into());
    };
    let mut run = RunOptions::new(workload.parse()?, "host");
    let mut cmp: Option<Vec<Mitigations>> = None;
    let mut reps = 3;
    let mut json: Option<String> = None;
    let mut i = 1;
    let val = |i: usize| -> Result<&String, String> {
        args.get(i + 1).ok_or(format!("{} needs a value", args[i]))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--topology" => run.topology = val(i)?.clone(),
            "--mitigations" => run.mitigations = val(i)?.parse()?,
            "--compare" => {
                let v = val(i)?;
                cmp = Some(if v == "seeds" {
                    Mitigations::seeds_variants()
                } else {
                    v.split(';').map(|s| s.parse()).collect::<Result<_, _>>()?
                });
            }
            "--duration" => run.duration = Duration::from_secs_f64(val(i)?.parse()?),
            "--reps" => reps = val(i)?.parse()?,
            "--json" => json = Some(val(i)?.clone()),
            "--tasks" => run.params.tasks = Some(val(i)?.parse()?),
            "--groups" => run.params.groups = Some(val(i)?.parse()?),
            "--group-size" => run.params.group_size = Some(val(i)?.parse()?),
            "--period-us" => run.params.period_us = Some(val(i)?.parse()?),
            "--burst-us" => run.params.burst_us = Some(val(i)?.parse()?),
            "--prio" => run.params.prio = Some(val(i)?.parse()?),
            "--check" => {
                run.check = true;
                i += 1;
                continue;
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
        i += 2;
    }
    let out = match cmp {
        Some(variants) => {
            let c = compare(
                &CompareOptions {
                    run,
                    variants,
                    repetitions: reps,
                },
                &mut |p| {
                    eprint!(
                        "\r[{}/{}] {} rep {} {:>3.0}%   ",
                        p.done + 1,
                        p.total,
                        p.variant,
                        p.repetition + 1,
                        p.run_fraction * 100.0
                    );
                    let _ = std::io::stderr().flush();
                },
            )?;
            eprintln!();
            println!("{}", c.render_table());
            c.to_json()
        }
        None => {
            let r = run_workload(&run)?;
            println!(
                "{} on {} [{}]: {} = {:.3} {} ({} tasks, {:.1} s, {:.0} ns/schedule)",
                r.workload,
                r.topology,
                r.mitigations,
                r.metric.name,
                r.metric.value,
                r.metric.unit,
                r.tasks,
                r.duration_s,
                r.sched_ns_per_call
            );
            serde_json::to_string_pretty(&r)?
        }
    };
    if let Some(path) = json {
        std::fs::write(&path, out)?;
        eprintln!("JSON written to {path}");
    }
    Ok(())
}
