//! `vmm plan`: pack N pinned VMs of one guest shape onto a host.
//!
//! WHAT: the `plan` subcommand's arguments (flags, or a TOML/JSON request
//! file with the same field names) and its runner, which prints the
//! placement as a table or as the `cpus.affinity` JSON that `vmm serve`'s
//! `vm.create` takes.
//! WHY: an operator sizes a host before starting VMs on it; the server uses
//! the same planner ([`vcpu_sched::placement::pack`]) when `vm.create` has no affinity.
//! HOW: thin glue; an impossible request is an input error (exit 2) whose
//! line names what did not fit and where.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use topology::GuestTopology;

use super::args::{self, InputError};
use vcpu_sched::placement::pack::{self as planner, Relax};

/// Output formats of `vmm plan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    /// One row per vCPU: host CPU, core, L2, LLC, node.
    Table,
    /// `[{"vm": i, "cpus": {"affinity": [{"vcpu", "host_cpus"}]}}]`.
    Json,
}

/// `vmm plan` arguments.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The host: `host`, a preset, an hwloc synthetic string, XML or dump.
    #[arg(long, short, default_value = "host", value_name = "SPEC")]
    pub topology: String,
    /// The guest shape (a preset or an hwloc synthetic string), e.g.
    /// "package:1 l3:1 l2:4 core:1 pu:2".
    #[arg(
        long,
        short,
        value_name = "SPEC",
        required_unless_present_any = ["request", "packages"],
        conflicts_with = "packages"
    )]
    pub guest: Option<String>,
    /// Or the guest shape in Cloud Hypervisor's terms: packages (sockets)...
    #[arg(long, value_name = "N", value_parser = shape_count)]
    pub packages: Option<u32>,
    /// ... dies per package (one LLC each) ...
    #[arg(long, value_name = "N", default_value = "1", value_parser = shape_count)]
    pub dies_per_package: u32,
    /// ... cores per die (an L2 each) ...
    #[arg(long, value_name = "N", default_value = "1", value_parser = shape_count)]
    pub cores_per_die: u32,
    /// ... threads per core ...
    #[arg(long, value_name = "N", default_value = "1", value_parser = shape_count)]
    pub threads_per_core: u32,
    /// ... and a guest NUMA node per package.
    #[arg(long)]
    pub numa: bool,
    /// How many VMs of that shape.
    #[arg(long, default_value = "1", value_name = "N", value_parser = args::vm_count)]
    pub vms: usize,
    /// The vCPUs will run SCHED_FIFO at this priority (1-99): recorded in
    /// the output; every plan already gives each vCPU a host CPU of its own.
    #[arg(long, value_name = "PRIO", value_parser = args::prio)]
    pub rt: Option<u8>,
    /// Alignment rules to give up: none, l2, llc or l2,llc.
    #[arg(long, default_value = "none", value_name = "LEVELS", value_parser = Relax::parse)]
    pub relax: Relax,
    /// A TOML or JSON request (fields: topology, guest, vms, rt, relax
    /// {l2, llc}); flags given too are overridden by it.
    #[arg(long, value_name = "FILE")]
    pub request: Option<PathBuf>,
    /// Output format.
    #[arg(long, short, value_enum, default_value = "table")]
    pub format: PlanFormat,
}

/// A request file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default = "host")]
    topology: String,
    guest: String,
    #[serde(default = "one")]
    vms: usize,
    #[serde(default)]
    rt: Option<u8>,
    #[serde(default)]
    relax: Relax,
}

/// A topology count: 1..=1024.
fn shape_count(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a count from 1 to 1024")),
    }
}

fn host() -> String {
    "host".into()
}
fn one() -> usize {
    1
}

fn load_request(a: &mut PlanArgs, path: &std::path::Path) -> Result<()> {
    let text = args::read_input(
        "--request",
        path,
        args::MAX_INPUT_BYTES,
        "a TOML or JSON request file",
    )?;
    let json = path.extension().is_some_and(|e| e == "json");
    let r: Request = if json {
        serde_json::from_str(&text)
            .map_err(|e| InputError(format!("--request {}: {e}", path.display())))?
    } else {
        toml::from_str(&text)
            .map_err(|e| InputError(format!("--request {}: {}", path.display(), e.message())))?
    };
    args::vm_count(&r.vms.to_string())
        .map_err(|e| InputError(format!("--request {}: vms: {e}", path.display())))?;
    if let Some(p) = r.rt {
        args::prio(&p.to_string())
            .map_err(|e| InputError(format!("--request {}: rt: {e}", path.display())))?;
    }
    a.topology = r.topology;
    a.guest = Some(r.guest);
    a.vms = r.vms;
    a.rt = r.rt;
    a.relax = r.relax;
    Ok(())
}

/// Runs `vmm plan`.
pub fn run(mut a: PlanArgs) -> Result<()> {
    if let Some(p) = a.request.clone() {
        load_request(&mut a, &p)?;
    }
    let host = topology::load(&a.topology).with_context(|| format!("--topology {}", a.topology))?;
    let gspec = match (a.guest.clone(), a.packages) {
        (Some(g), _) => g,
        (None, Some(p)) => vmm_api::api::ch_shape(
            p,
            a.dies_per_package,
            a.cores_per_die,
            a.threads_per_core,
            a.numa,
        ),
        (None, None) => String::new(),
    };
    let guest = GuestTopology::from_spec(&gspec).with_context(|| format!("--guest {gspec}"))?;
    let plans = planner::pack(&host, &guest, a.vms, a.relax).map_err(|e| InputError(e.0))?;
    let mut out = String::new();
    match a.format {
        PlanFormat::Json => {
            let v: Vec<serde_json::Value> = plans
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    serde_json::json!({
                        "vm": i,
                        "cpus": { "boot_vcpus": p.os.len(), "affinity": p.affinity() },
                        "x_vmm": { "rt_priority": a.rt },
                    })
                })
                .collect();
            out.push_str(&serde_json::to_string_pretty(&v)?);
            out.push('\n');
        }
        PlanFormat::Table => {
            let _ = writeln!(
                out,
                "{} VMs of {} vCPUs ({}) on {} ({} CPUs){}",
                a.vms,
                guest.num_vcpus(),
                gspec,
                a.topology,
                host.num_cpus(),
                a.rt.map(|p| format!(", SCHED_FIFO {p}"))
                    .unwrap_or_default()
            );
            let _ = writeln!(
                out,
                "{:>4} {:>5} {:>8} {:>5} {:>4} {:>4} {:>4}",
                "vm", "vcpu", "host_cpu", "core", "l2", "llc", "node"
            );
            for (i, p) in plans.iter().enumerate() {
                for (v, (&d, &os)) in p.dense.iter().zip(&p.os).enumerate() {
                    let _ = writeln!(
                        out,
                        "{i:>4} {v:>5} {os:>8} {:>5} {:>4} {:>4} {:>4}",
                        host.core_of(d),
                        host.l2_of(d),
                        host.llc_of(d),
                        host.node_of(d)
                    );
                }
            }
        }
    }
    // One write; a closed pipe (`| head`) is not an error.
    let mut so = std::io::stdout().lock();
    match so.write_all(out.as_bytes()).and_then(|()| so.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::from(e).context("writing the plan"))
        }
        _ => Ok(()),
    }
}
