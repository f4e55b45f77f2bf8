//! Command-line interface (clap) and the glue from arguments to the library.
//!
//! Errors leave as one line on stderr. Bad input (a malformed topology
//! string, a missing file, an impossible request) exits with status 2, other
//! failures with 1. Nothing here panics on user input.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use topology::{GuestTopology, TopologyError, Vendor};

/// A KVM VMM with its own NUMA-aware vCPU scheduler.
#[derive(Debug, Parser)]
#[command(name = "vmm", version, about, long_about = None)]
pub struct Cli {
    /// More logging (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Inspect host and guest CPU topologies.
    #[command(subcommand)]
    Topology(TopologyCmd),
    /// The main job on an embedded default: show a preset host and what a
    /// guest placed on it would see.
    Demo,
}

/// Output formats of `topology show`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    /// An lstopo-like tree.
    Text,
    /// The dense model as JSON.
    Json,
    /// hwloc's synthetic description.
    Synthetic,
}

/// Vendor choice for guest CPUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VendorArg {
    /// The host's vendor.
    Host,
    /// AMD encoding.
    Amd,
    /// Intel encoding.
    Intel,
}

impl VendorArg {
    /// Resolves `host` against this machine's CPUID.
    pub fn resolve(self) -> Vendor {
        match self {
            VendorArg::Amd => Vendor::Amd,
            VendorArg::Intel => Vendor::Intel,
            VendorArg::Host => topology::cpuid::host_cpuid()
                .vendor()
                .unwrap_or(Vendor::Intel),
        }
    }
}

/// `vmm topology ...`
#[derive(Debug, Subcommand)]
pub enum TopologyCmd {
    /// Show a topology: `host`, a preset, a synthetic string, an hwloc XML
    /// file or a CPUID dump directory.
    Show {
        /// What to show (default: this host).
        #[arg(long, short, default_value = "host", value_name = "SPEC")]
        topology: String,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = ShowFormat::Text)]
        format: ShowFormat,
    },
    /// Show what a guest of this shape sees: APIC IDs, sharing, nodes.
    Guest {
        /// Guest shape (same SPEC language as `show`).
        #[arg(long, short, value_name = "SPEC")]
        guest: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write the guest's per-vCPU CPUID as an hwloc CPUID dump directory.
    CpuidDump {
        /// Guest shape.
        #[arg(long, short, value_name = "SPEC")]
        guest: String,
        /// Output directory (created; old puN files are removed).
        #[arg(long, short, value_name = "DIR")]
        out: PathBuf,
        /// CPUID vendor encoding.
        #[arg(long, value_enum, default_value_t = VendorArg::Host)]
        vendor: VendorArg,
    },
    /// List the named presets.
    Presets,
}

/// Sets up `tracing` on stderr.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// A user-input problem: exits with status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// Status 2 for bad input, 1 for everything else.
pub fn exit_code_for(e: &anyhow::Error) -> ExitCode {
    for cause in e.chain() {
        if cause.downcast_ref::<InputError>().is_some() {
            return ExitCode::from(2);
        }
        if let Some(t) = cause.downcast_ref::<TopologyError>() {
            return match t {
                TopologyError::Io { .. } | TopologyError::Host(_) => ExitCode::from(1),
                _ => ExitCode::from(2),
            };
        }
    }
    ExitCode::from(1)
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Topology(cmd) => topology_cmd(cmd)?,
        Command::Demo => demo()?,
    }
    Ok(ExitCode::SUCCESS)
}

fn topology_cmd(cmd: TopologyCmd) -> Result<()> {
    match cmd {
        TopologyCmd::Show {
            topology: spec,
            format,
        } => {
            let t = topology::load(&spec)?;
            match format {
                ShowFormat::Text => print!("{}", topology::render::host_tree(&t)),
                ShowFormat::Json => println!("{}", serde_json::to_string_pretty(&t)?),
                ShowFormat::Synthetic => println!("{}", t.synthetic()?),
            }
        }
        TopologyCmd::Guest { guest, json } => {
            let g = GuestTopology::from_spec(&guest)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&g)?);
            } else {
                print!("{}", topology::render::guest_table(&g));
            }
        }
        TopologyCmd::CpuidDump { guest, out, vendor } => {
            let g = GuestTopology::from_spec(&guest)?;
            let vendor = vendor.resolve();
            let base = topology::cpuid::host_cpuid();
            topology::dump::write_cpuid_dump(&g, &base, vendor, &out)
                .with_context(|| format!("writing the CPUID dump to {}", out.display()))?;
            println!(
                "wrote {} CPUs ({vendor} encoding) to {}",
                g.num_vcpus(),
                out.display()
            );
        }
        TopologyCmd::Presets => {
            for p in topology::presets::PRESETS {
                println!(
                    "{:<10} {}\n           {}",
                    p.name, p.description, p.synthetic
                );
            }
        }
    }
    Ok(())
}

/// The embedded default: a Genoa-like host and a 2-socket guest on it.
fn demo() -> Result<()> {
    let host = topology::load("genoa-2s")?;
    println!("== Host model: preset genoa-2s ==");
    println!("{}", host.shape());
    println!("hwloc synthetic: {}", host.synthetic()?);
    println!();
    // A guest mirroring 2 CCDs on each socket's first 2 cores: what `--pin
    // auto` would pick for 2 sockets x 2 LLCs x 2 cores x 2 threads.
    let mut slice = Vec::new();
    for pkg in 0..2u32 {
        for llc in 0..2u32 {
            let first_llc = host.llcs_of_node(pkg)[llc as usize];
            slice.extend_from_slice(&host.cpus_of_llc(first_llc)[..4]);
        }
    }
    let g = GuestTopology::from_host_cpus(&host, &slice)?;
    println!(
        "== A guest on host CPUs {} ==",
        topology::cpulist::format(&slice)
    );
    print!("{}", topology::render::guest_table(&g));
    Ok(())
}
