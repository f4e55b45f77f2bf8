//! Command-line interface (clap) and the glue from arguments to the library.
//!
//! One module per subcommand ([`topology`], [`demo`], [`run`](mod@run),
//! [`sched_bench`], [`bench`](mod@bench), [`sim`], [`plan`], [`serve`]). What they
//! share (the input error, flag parsers, `--compare` lists, range checks,
//! the progress bar) is the crate's leaf [`crate::args`], re-exported here
//! as `args`. The subcommands import from it and from [`crate::config`],
//! never from each other or from this module, so the module graph has no
//! cycles.
//!
//! Errors leave as one line on stderr. Bad input (a malformed topology
//! string, a missing file, an impossible request) exits with status 2, other
//! failures with 1: [`crate::exit`] decides. Nothing here panics on user
//! input.

pub use crate::args;
pub mod bench;
mod bench_report;
pub mod demo;
pub mod plan;
pub mod run;
pub mod sched_bench;
pub mod serve;
pub mod sim;
pub mod topology;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

pub use self::topology::{ShowFormat, TopologyCmd, VendorArg};
pub use args::{mitigation_sets, progress_bar, InputError};
pub use run::RunArgs;

/// A KVM VMM with its own NUMA-aware vCPU scheduler.
///
/// `vmm --api-socket PATH [-v..] [--seccomp false|true|log]`, with no
/// subcommand, is Cloud Hypervisor's command line (the way Kata starts
/// its hypervisor): it serves the API as `vmm serve --api-socket PATH`
/// does, with the settings of the TOML file `$VMM_SERVE_CONFIG` names, if
/// any (docs/kata.md).
#[derive(Debug, Parser)]
#[command(name = "vmm", version, about, long_about = None)]
pub struct Cli {
    /// More logging (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Cloud Hypervisor's entry: serve the API on this Unix socket, as
    /// `vmm serve --api-socket PATH` (settings from $VMM_SERVE_CONFIG).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<std::path::PathBuf>,
    /// Cloud Hypervisor's seccomp switch: false, true or log. This VMM
    /// installs no seccomp filter: false says so; true and log are
    /// accepted with a warning that no filter is installed.
    #[arg(long, value_name = "false|true|log", value_parser = ["false", "true", "log"], requires = "api_socket")]
    pub seccomp: Option<String>,
    #[command(subcommand)]
    pub command: Option<Command>,
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
    /// Boot a Linux guest with a chosen CPU topology.
    Run(Box<RunArgs>),
    /// Benchmark the vCPU scheduler alone on synthetic tasks: one
    /// mitigation set, or a comparison (`--compare seeds`: baseline, each
    /// fix alone, all).
    SchedBench(sched_bench::SchedBenchArgs),
    /// Benchmark real KVM vCPUs (micro-guests) under the scheduler: one
    /// run, or the seeds' comparison with the host 1:1 baseline
    /// (`--compare seeds`).
    Bench(Box<bench::BenchArgs>),
    /// Pack N pinned VMs of one guest shape onto a host, aligned to core,
    /// L2, LLC and node; print a table or `cpus.affinity` JSON.
    Plan(plan::PlanArgs),
    /// Serve a Cloud Hypervisor-compatible REST API on a Unix socket: many
    /// VMs, one scheduler, Prometheus metrics at /metrics.
    Serve(serve::ServeArgs),
    /// Simulate the scheduler core on a big topology in deterministic
    /// virtual time, with cited cache-line transfer costs
    /// (`--compare seeds`, `--c2c`, `--lockstat`, `--sweep`).
    #[command(disable_help_flag = true)]
    Sim(sim::SimArgs),
}

/// Sets up `tracing` on stderr, coloured only when
/// [`args::stderr_styled`] (a terminal, `NO_COLOR` unset).
pub fn init_tracing(verbose: u8) {
    cli_common::term::init_tracing(verbose)
}

/// Parses the command line. A flag value its parser refuses (the
/// [`args`] parsers) is one line, `error: --flag: what is wrong and what to
/// give`, and exit status 2, like every other bad input; other usage
/// errors, `--help` and `--version` are clap's own.
pub fn parse() -> std::result::Result<Cli, ExitCode> {
    cli_common::term::parse()
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let verbose = cli.verbose;
    let Some(command) = cli.command else {
        let Some(socket) = cli.api_socket else {
            return Err(InputError(
                "no command: give a subcommand (vmm --help lists them), or --api-socket PATH \
                 to serve Cloud Hypervisor's API"
                    .into(),
            )
            .into());
        };
        serve::run_ch_entry(socket, cli.seccomp.as_deref())?;
        return Ok(ExitCode::SUCCESS);
    };
    if cli.api_socket.is_some() {
        return Err(InputError(
            "--api-socket before a subcommand: it is Cloud Hypervisor's entry, which takes no \
             subcommand; give vmm --api-socket PATH alone, or vmm serve --api-socket PATH"
                .into(),
        )
        .into());
    }
    match command {
        Command::Topology(cmd) => self::topology::run(cmd)?,
        Command::Demo => demo::run()?,
        Command::Run(args) => return run::run(*args),
        Command::SchedBench(args) => sched_bench::run(args)?,
        Command::Bench(args) => bench::run(*args)?,
        Command::Plan(args) => plan::run(args)?,
        Command::Serve(args) => serve::run(args)?,
        Command::Sim(args) => return sim::run(args, verbose),
    }
    Ok(ExitCode::SUCCESS)
}
