//! Command-line interface (clap) and the glue from arguments to the library.
//!
//! Errors leave as one line on stderr. Bad input (a malformed topology
//! string, a missing file, an impossible request) exits with status 2, other
//! failures with 1. Nothing here panics on user input.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use topology::{GuestTopology, TopologyError, Vendor};
use tracing::{info, warn};

use crate::config::{ConsoleTarget, FileConfig, RunConfig, RunFlags, VendorChoice};

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
    /// Boot a Linux guest with a chosen CPU topology.
    Run(Box<RunArgs>),
    /// Benchmark the vCPU scheduler alone on synthetic tasks: one
    /// mitigation set, or a comparison (`--compare seeds`: baseline, each
    /// fix alone, all).
    SchedBench(crate::sched_bench::SchedBenchArgs),
    /// Benchmark real KVM vCPUs (micro-guests) under the scheduler: one
    /// run, or the seeds' comparison with the host 1:1 baseline
    /// (`--compare seeds`).
    Bench(Box<crate::bench::cli::BenchArgs>),
}

/// `vmm run`: every flag can also come from `--config FILE` (TOML, same
/// names without the dashes); flags override the file.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// TOML file with the same settings (kernel = "...", memory = "1G", ...).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Kernel: an uncompressed vmlinux (ELF) or a bzImage.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Initramfs.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Extra kernel command line, after the VMM's own
    /// `console=ttyS0 reboot=k pci=off` (and the kvm_pvm items, if any).
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub cmdline: Option<String>,
    /// Guest RAM, split equally across its NUMA nodes: 512M, 2G, ... (a
    /// bare number means MiB).
    #[arg(long, short, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Guest CPU topology: an hwloc synthetic string
    /// ("package:2 [numa] l3:1 l2:2 core:1 pu:2"), a preset, an hwloc XML
    /// file or a CPUID dump directory.
    #[arg(long, short, value_name = "SPEC")]
    pub guest: Option<String>,
    /// Distance between different guest NUMA nodes (11..=254; SLIT).
    #[arg(long, value_name = "D")]
    pub numa_distance: Option<u32>,
    /// vCPU placement: auto (match the guest's shape onto host CPUs), none,
    /// or a host CPU list (vCPU i on the i-th CPU: 0-7, 0,2,4).
    #[arg(long, value_name = "auto|none|LIST")]
    pub pin: Option<String>,
    /// Real-time policy of the vCPU threads: fifo:PRIO, rr:PRIO or none.
    #[arg(long, value_name = "POLICY")]
    pub rt: Option<String>,
    /// Where the serial console goes: stdout or a file.
    #[arg(long, value_name = "stdout|PATH")]
    pub console: Option<String>,
    /// Stop the VM cleanly (exit 0) once a console line matches this regex.
    #[arg(long, value_name = "REGEX")]
    pub until: Option<String>,
    /// Give up (exit 124) if the guest has not reset, powered off or
    /// matched --until by then: 90s, 10m, 1h.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// CPUID vendor encoding of the topology: host, amd or intel.
    #[arg(long, value_name = "host|amd|intel")]
    pub vendor: Option<String>,
    /// kvm_pvm workarounds: auto (when /sys/module/kvm_pvm exists), pvm or
    /// none.
    #[arg(long, value_name = "auto|pvm|none")]
    pub compat: Option<String>,
    /// Who schedules the vCPUs: host (a thread per vCPU, the host kernel
    /// schedules; default) or vcpu_sched (vCPUs are tasks of the VMM's
    /// scheduler on one worker per host CPU; halted vCPUs give up their
    /// CPU; --pin becomes each vCPU's affinity, --rt its policy there).
    #[arg(long, value_name = "host|vcpu_sched")]
    pub sched: Option<String>,
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
        if let Some(v) = cause.downcast_ref::<crate::Error>() {
            return ExitCode::from(if v.is_input() { 2 } else { 1 });
        }
        if cause.downcast_ref::<crate::config::ConfigError>().is_some() {
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

/// The progress bar of long runs (`bench`, `sched-bench`); drawn on stderr
/// only when it is a terminal.
pub fn progress_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Parses `--compare`: `seeds` (baseline, each fix alone, all) or
/// `SET;SET;..` whose first entry is the baseline.
pub fn mitigation_sets(list: &str) -> Result<Vec<vcpu_sched::Mitigations>> {
    if list.trim() == "seeds" {
        return Ok(vcpu_sched::Mitigations::seeds_variants());
    }
    let sets = list
        .split(';')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.parse::<vcpu_sched::Mitigations>()
                .map_err(|e| InputError(format!("--compare: {e}")).into())
        })
        .collect::<Result<Vec<_>>>()?;
    if sets.is_empty() {
        return Err(InputError(format!(
            "--compare {list:?}: give seeds or sets such as \"none;all\""
        ))
        .into());
    }
    Ok(sets)
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Topology(cmd) => topology_cmd(cmd)?,
        Command::Demo => demo()?,
        Command::Run(args) => return run_vm(*args),
        Command::SchedBench(args) => crate::sched_bench::run(args)?,
        Command::Bench(args) => crate::bench::cli::run_cli(*args)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `vmm run`.
fn run_vm(args: RunArgs) -> Result<ExitCode> {
    let file = match &args.config {
        Some(p) => Some((p.as_path(), FileConfig::load(p)?)),
        None => None,
    };
    let flags = RunFlags {
        kernel: args.kernel,
        initrd: args.initrd,
        cmdline: args.cmdline,
        memory: args.memory,
        guest: args.guest,
        numa_distance: args.numa_distance,
        pin: args.pin,
        rt: args.rt,
        console: args.console,
        until: args.until,
        timeout: args.timeout,
        vendor: args.vendor,
        compat: args.compat,
        sched: args.sched,
    };
    let cfg = RunConfig::resolve(flags, file)?;
    let mut guest =
        GuestTopology::from_spec(&cfg.guest).with_context(|| format!("--guest {:?}", cfg.guest))?;
    if let Some(d) = cfg.numa_distance {
        guest.set_remote_distance(d).context("--numa-distance")?;
    }
    let compat = cfg.compat.resolve();
    let host = match topology::load("host") {
        Ok(h) => Some(h),
        Err(e) if cfg.pin == crate::pin::PinSpec::None => {
            warn!("cannot read the host topology ({e}); guest memory will not be bound");
            None
        }
        Err(e) => return Err(e).context("--pin needs the host topology"),
    };
    let pins = match &host {
        Some(h) => crate::pin::plan(&cfg.pin, &guest, h).map_err(crate::Error::from)?,
        None => None,
    };
    if let Some(p) = &pins {
        info!(
            "vCPUs pinned to host CPUs {}",
            p.os.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    if let Some(rt) = cfg.rt {
        let allowed = host.as_ref().map(|h| h.num_cpus()).unwrap_or(1);
        if crate::rt::oversubscribed(guest.num_vcpus(), pins.as_ref().map(|p| &p.os[..]), allowed) {
            warn!(
                "--rt {rt}: {} vCPUs share fewer host CPUs; equal-priority SCHED_FIFO threads \
                 never time-slice, so a vCPU waiting for a preempted sibling can hang the guest. \
                 Give each vCPU its own host CPU, or use rr:PRIO",
                guest.num_vcpus()
            );
        }
    }
    let console: Box<dyn std::io::Write + Send> = match &cfg.console {
        ConsoleTarget::Stdout => Box::new(std::io::stdout()),
        ConsoleTarget::File(p) => Box::new(
            std::fs::File::create(p)
                .map_err(|e| crate::Error::Input(format!("--console {}: {e}", p.display())))?,
        ),
    };
    let until = match &cfg.until {
        Some(r) => Some(regex::Regex::new(r).context("--until")?),
        None => None,
    };
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| {
        anyhow::anyhow!(
            "cannot open /dev/kvm: {e} (is KVM loaded, and may this user open /dev/kvm?)"
        )
    })?;
    let spec = crate::vm::LinuxVmSpec {
        guest,
        memory: cfg.memory,
        kernel: cfg.kernel.clone(),
        initrd: cfg.initrd.clone(),
        cmdline: cfg.cmdline.clone(),
        vendor: match cfg.vendor {
            VendorChoice::Host => None,
            VendorChoice::Fixed(v) => Some(v),
        },
        compat,
        pins: pins.clone(),
        host,
        console,
        until,
    };
    let vm = crate::vm::LinuxVm::build(&kvm, spec)?;
    let opts = crate::vm::ThreadOptions {
        pins: pins.map(|p| p.os),
        rt: cfg.rt,
        timeout: cfg.timeout,
    };
    let reason = match cfg.sched {
        crate::config::SchedMode::Host => crate::vm::run_threads(vm, &opts)?,
        crate::config::SchedMode::VcpuSched => {
            let o = crate::vcpu_task::linux::LinuxSchedOptions {
                mitigations: vcpu_sched::Mitigations::all(),
                policy: match cfg.rt {
                    Some(crate::rt::RtPolicy::Fifo(p)) => vcpu_sched::Policy::Fifo(p),
                    Some(crate::rt::RtPolicy::Rr(p)) => vcpu_sched::Policy::Rr(p),
                    None => vcpu_sched::Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
                },
                pins: opts.pins.clone(),
                timeout: opts.timeout,
                poll: std::time::Duration::from_millis(1),
                halt: std::time::Duration::from_millis(1),
            };
            info!("vCPUs scheduled by vcpu_sched (workers executor, mitigations all)");
            crate::vcpu_task::linux::run_sched(vm, &o).map_err(|e| match e {
                crate::vcpu_task::TaskError::Input(m) => anyhow::Error::from(InputError(m)),
                other => anyhow::Error::new(other),
            })?
        }
    };
    let status = reason.exit_status();
    if status == 0 {
        info!("stopped: {reason}");
    } else {
        eprintln!("error: {reason}");
    }
    Ok(ExitCode::from(status))
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
