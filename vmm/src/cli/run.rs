//! `vmm run`: boot a Linux guest with a chosen CPU topology.
//!
//! WHAT: the `run` subcommand's flags ([`RunArgs`]) and the steps from
//! them to a stopped VM: resolve flags and `--config` into a
//! [`RunConfig`], build the guest topology, plan pinning and memory
//! binding, open the console, build the [`LinuxVm`](crate::vm::LinuxVm),
//! run it on the host 1:1 runner or under `vcpu_sched`, and turn why it
//! stopped into an exit status.
//! WHY: one file per subcommand; the library does the work, this module
//! only connects flags to it.
//! HOW: one small function per step; errors carry the flag they are
//! about, and [`crate::exit`] decides their exit status.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use topology::{GuestTopology, HostTopology};
use tracing::{info, warn};

use crate::config::{ConsoleTarget, FileConfig, RunConfig, RunFlags, SchedMode, VendorChoice};
use crate::pin::PinPlan;
use crate::vm::StopReason;

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

/// Runs `vmm run`: the exit status is the stop reason's
/// ([`crate::exit::for_stop`]).
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let cfg = resolve(args)?;
    let guest = guest_topology(&cfg)?;
    let (host, pins) = host_and_pins(&cfg, &guest)?;
    warn_rt_oversubscribed(&cfg, &guest, host.as_ref(), pins.as_ref());
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
        compat: cfg.compat.resolve(),
        pins: pins.clone(),
        host,
        console: open_console(&cfg)?,
        until: until_regex(&cfg)?,
    };
    let vm = crate::vm::LinuxVm::build(&kvm, spec)?;
    let reason = run_vm(vm, &cfg, pins.map(|p| p.os))?;
    let status = crate::exit::for_stop(&reason);
    if status == crate::exit::SUCCESS {
        info!("stopped: {reason}");
    } else {
        eprintln!("error: {reason}");
    }
    Ok(ExitCode::from(status))
}

/// Flags over `--config`.
fn resolve(args: RunArgs) -> Result<RunConfig> {
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
    Ok(RunConfig::resolve(flags, file)?)
}

/// `--guest` and `--numa-distance`.
fn guest_topology(cfg: &RunConfig) -> Result<GuestTopology> {
    let mut guest =
        GuestTopology::from_spec(&cfg.guest).with_context(|| format!("--guest {:?}", cfg.guest))?;
    if let Some(d) = cfg.numa_distance {
        guest.set_remote_distance(d).context("--numa-distance")?;
    }
    Ok(guest)
}

/// The host model (for memory binding and `--pin`) and the pin plan.
fn host_and_pins(
    cfg: &RunConfig,
    guest: &GuestTopology,
) -> Result<(Option<HostTopology>, Option<PinPlan>)> {
    let host = match topology::load("host") {
        Ok(h) => Some(h),
        Err(e) if cfg.pin == crate::pin::PinSpec::None => {
            warn!("cannot read the host topology ({e}); guest memory will not be bound");
            None
        }
        Err(e) => return Err(e).context("--pin needs the host topology"),
    };
    let pins = match &host {
        Some(h) => crate::pin::plan(&cfg.pin, guest, h).map_err(crate::Error::from)?,
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
    Ok((host, pins))
}

/// Equal-priority SCHED_FIFO vCPU threads sharing host CPUs can hang a
/// guest; say so.
fn warn_rt_oversubscribed(
    cfg: &RunConfig,
    guest: &GuestTopology,
    host: Option<&HostTopology>,
    pins: Option<&PinPlan>,
) {
    let Some(rt) = cfg.rt else {
        return;
    };
    let allowed = host.map(|h| h.num_cpus()).unwrap_or(1);
    if crate::rt::oversubscribed(guest.num_vcpus(), pins.map(|p| &p.os[..]), allowed) {
        warn!(
            "--rt {rt}: {} vCPUs share fewer host CPUs; equal-priority SCHED_FIFO threads \
             never time-slice, so a vCPU waiting for a preempted sibling can hang the guest. \
             Give each vCPU its own host CPU, or use rr:PRIO",
            guest.num_vcpus()
        );
    }
}

/// `--console`.
fn open_console(cfg: &RunConfig) -> Result<Box<dyn std::io::Write + Send>> {
    Ok(match &cfg.console {
        ConsoleTarget::Stdout => Box::new(std::io::stdout()),
        ConsoleTarget::File(p) => Box::new(
            std::fs::File::create(p)
                .map_err(|e| crate::Error::Input(format!("--console {}: {e}", p.display())))?,
        ),
    })
}

/// `--until`.
fn until_regex(cfg: &RunConfig) -> Result<Option<regex::Regex>> {
    Ok(match &cfg.until {
        Some(r) => Some(regex::Regex::new(r).context("--until")?),
        None => None,
    })
}

/// Runs the built VM under `--sched` until it stops.
fn run_vm(vm: crate::vm::LinuxVm, cfg: &RunConfig, pins: Option<Vec<u32>>) -> Result<StopReason> {
    Ok(match cfg.sched {
        SchedMode::Host => {
            let opts = crate::vcpu_task::linux::ThreadOptions {
                pins,
                rt: cfg.rt,
                timeout: cfg.timeout,
            };
            crate::vcpu_task::linux::run_threads(vm, &opts)?
        }
        SchedMode::VcpuSched => {
            let o = crate::vcpu_task::linux::LinuxSchedOptions {
                mitigations: vcpu_sched::Mitigations::all(),
                policy: match cfg.rt {
                    Some(crate::rt::RtPolicy::Fifo(p)) => vcpu_sched::Policy::Fifo(p),
                    Some(crate::rt::RtPolicy::Rr(p)) => vcpu_sched::Policy::Rr(p),
                    None => vcpu_sched::Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
                },
                pins,
                timeout: cfg.timeout,
                poll: std::time::Duration::from_millis(1),
                halt: std::time::Duration::from_millis(1),
            };
            info!("vCPUs scheduled by vcpu_sched (workers executor, mitigations all)");
            crate::vcpu_task::linux::run_sched(vm, &o)?
        }
    })
}
