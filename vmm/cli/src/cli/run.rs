//! `vmm run`: boot a Linux guest with a chosen CPU topology.
//!
//! WHAT: the `run` subcommand's flags ([`RunArgs`]) and the steps from
//! them to a stopped VM: resolve flags and `--config` into a
//! [`RunConfig`], build the guest topology, plan pinning and memory
//! binding, open the console, build the [`LinuxVm`](vmm_machine::vm::LinuxVm),
//! run it on the host 1:1 runner or under `vcpu_sched`, and turn why it
//! stopped into an exit status.
//! WHY: one file per subcommand; the library does the work, this module
//! only connects flags to it.
//! HOW: one small function per step; errors carry the flag they are
//! about, and [`crate::exit`] decides their exit status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use topology::{GuestTopology, HostTopology};
use tracing::{info, warn};

use super::args::{self, check_output_file, InputError};
use crate::config::{ConsoleTarget, FileConfig, RunConfig, RunFlags, SchedMode, VendorChoice};
use vcpu_sched::placement::pin::PinPlan;
use vmm_machine::vm::StopReason;

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
    /// `console=ttyS0 reboot=k` (and the kvm_pvm items, if any).
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub cmdline: Option<String>,
    /// Guest RAM, split equally across its NUMA nodes: 512M, 2G, ... (a
    /// bare number means MiB).
    #[arg(long, short, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Guest CPU topology: an hwloc synthetic string
    /// (`package:2 [numa] l3:1 l2:2 core:1 pu:2`), a preset, an hwloc XML
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
    /// Where the serial console goes: stdout (default), - (stdout), stderr,
    /// or a new file. An existing file is refused, never overwritten; add
    /// --console-append to append to it.
    #[arg(long, value_name = "stdout|stderr|-|PATH")]
    pub console: Option<String>,
    /// Append to the --console FILE (created if absent) instead of
    /// refusing an existing one.
    #[arg(long)]
    pub console_append: bool,
    /// Stop the VM cleanly (exit 0) once a console line matches this regex.
    #[arg(long, value_name = "REGEX")]
    pub until: Option<String>,
    /// Give up (exit 124) if the guest has not reset, powered off or
    /// matched --until by then, counted from the start of the command
    /// (setup included): 90s, 10m, 1h, 500ms or seconds (0.3); at most 7
    /// days.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
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
    /// With --sched vcpu_sched: its fixes, as for bench: none, all
    /// (default), only:FIX[,FIX..] or all-but:FIX[,..]. An error with
    /// --sched host, which would ignore it.
    #[arg(long, value_name = "SET")]
    pub mitigations: Option<String>,
    /// With --sched vcpu_sched: how its fair slices grow with the host
    /// CPUs, as Linux's sched_tunable_scaling: log (default; x(1 +
    /// log2(min(CPUs, 8)))) or none (the base 6 ms / 0.75 ms / 1 ms).
    #[arg(long, value_name = "log|none")]
    pub fair_slice_scaling: Option<String>,
    /// With --sched vcpu_sched: its tick period, how often each CPU's
    /// slice end and deferred wakeups are looked at (default 1000: 1 ms).
    /// 100..=100000
    #[arg(long, value_name = "US")]
    pub tick_us: Option<u64>,
    /// With --sched vcpu_sched: how often the halt poller probes the
    /// vCPUs asleep in the scheduler for an interrupt (an IPI from another
    /// vCPU is seen within this) and kicks out those halted inside
    /// KVM_RUN (default 1000: 1 ms). 100..=100000
    #[arg(long, value_name = "US")]
    pub halt_poll_us: Option<u64>,
    /// With --sched vcpu_sched: halted vCPUs wait inside KVM on a thread
    /// each, which KVM wakes (on), or sleep in the scheduler while the
    /// halt poller probes them every period (off, the default)
    #[arg(long, value_name = "on|off")]
    pub halt_park: Option<String>,
    /// A virtio-rng device fed from the host's /dev/urandom, on PCI
    /// segment S (0 by default): `--rng` or `--rng pci_segment=1`.
    #[arg(long, value_name = "[pci_segment=S]", num_args = 0..=1, default_missing_value = "")]
    pub rng: Option<String>,
    /// The guest platform, as Cloud Hypervisor writes it: the number of
    /// PCI segments (host bridges; segment s belongs to guest NUMA node
    /// s mod nodes).
    #[arg(long, value_name = "num_pci_segments=N")]
    pub platform: Option<String>,
    /// A virtio-blk disk backed by a raw image, as Cloud Hypervisor writes
    /// it: `path=IMG[,readonly=on][,num_queues=N][,pci_segment=S]`, plus
    /// this VMM's `engine=sync|pool|io_uring` (who executes the reads,
    /// writes and flushes; see docs/devices.md). The image is locked while
    /// the VM runs; num_queues defaults to one per vCPU. Repeat for more
    /// disks (vda, vdb, ...).
    #[arg(long, value_name = "path=IMG[,...]")]
    pub disk: Vec<String>,
    /// A virtio-net device on a host tap, as Cloud Hypervisor writes it:
    /// `tap=NAME|fd=N|fd=[N,M..][,mac=MAC][,num_queues=N][,pci_segment=S]`.
    /// The tap must exist (`ip tuntap add NAME mode tap multi_queue`);
    /// num_queues counts receive and transmit queues (2 per pair, default
    /// 2); mac defaults to a random local one. Repeat for more (eth0, eth1, ...).
    #[arg(long, value_name = "tap=NAME[,...]")]
    pub net: Vec<String>,
    /// A virtio-vsock device, as Cloud Hypervisor writes it:
    /// `cid=N,socket=PATH[,pci_segment=S]`. The guest's CID (3 or more);
    /// the VMM creates the Unix socket PATH (it must not exist) and
    /// removes it at the end. A host process connects to PATH and writes
    /// `CONNECT PORT\n` to reach guest port PORT (the answer is
    /// `OK HOSTPORT\n`); the guest's connections to host port P go to
    /// `PATH_P` (hybrid vsock, as Cloud Hypervisor and Firecracker).
    #[arg(long, value_name = "cid=N,socket=PATH")]
    pub vsock: Option<String>,
    /// A virtio-fs device served by a vhost-user backend (virtiofsd), as
    /// Cloud Hypervisor writes it:
    /// `tag=TAG,socket=PATH[,num_queues=N][,queue_size=N][,pci_segment=S]`.
    /// Start the backend first (`virtiofsd --socket-path=PATH -o
    /// source=DIR`); the guest mounts it by TAG (`mount -t virtiofs TAG
    /// /mnt`, or `rootfstype=virtiofs root=TAG`). num_queues counts request
    /// queues (default 1), queue_size defaults to 1024. Guest RAM becomes
    /// shared memory (memfd), which the backend maps. Repeat for more.
    #[arg(long, value_name = "tag=TAG,socket=PATH[,...]")]
    pub fs: Vec<String>,
}

/// Runs `vmm run`: the exit status is the stop reason's
/// ([`crate::exit::for_stop`]). `--timeout` counts from the start of the
/// process and covers every phase: a `Watchdog` ends the process with
/// 124 if setup (topology, memory, boot) outlives it, and the guest runs
/// for what is left.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let cfg = resolve(args)?;
    check_console(&cfg)?;
    check_memory_fits(cfg.memory)?;
    // The user's files before the clock matters: a missing kernel is the
    // answer, not a timeout.
    vmm_machine::boot::inspect_kernel(&cfg.kernel).map_err(vmm_machine::Error::from)?;
    if let Some(p) = &cfg.initrd {
        vmm_machine::boot::check_initrd(p).map_err(vmm_machine::Error::from)?;
    }
    vmm_machine::boot::check_cmdline(&cfg.cmdline).map_err(vmm_machine::Error::from)?;
    let watchdog = cfg.timeout.map(Watchdog::start);
    let phase = |p: &'static str| {
        if let Some(w) = &watchdog {
            w.phase(p);
        }
    };
    phase("loading the guest topology");
    let guest = guest_topology(&cfg)?;
    phase("loading the host topology");
    let (host, pins) = host_and_pins(&cfg, &guest)?;
    warn_rt_oversubscribed(&cfg, &guest, host.as_ref(), pins.as_ref());
    phase("opening /dev/kvm");
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| {
        anyhow::anyhow!(
            "cannot open /dev/kvm: {e} (is KVM loaded, and may this user open /dev/kvm?)"
        )
    })?;
    let console = open_console(&cfg)?;
    let _socket = console.guard;
    let spec = vmm_machine::vm::LinuxVmSpec {
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
        console: console.out,
        until: until_regex(&cfg)?,
        devices: cfg.devices.clone(),
        shared_memory: false,
        console_input: console.input,
        serial: None,
        boot_vcpus: None,
        // no API to add a device through
        pci_hotplug: false,
    };
    phase("building the VM (guest memory, kernel, ACPI)");
    let vm = vmm_machine::vm::LinuxVm::build(&kvm, spec)?;
    // The guest gets what is left of --timeout; the watchdog now only
    // guards against vCPUs that do not stop.
    let left = watchdog.as_ref().map(Watchdog::guest_started);
    let reason = run_vm(vm, &cfg, pins.map(|p| p.os), left)?;
    let reason = match (reason, cfg.timeout) {
        (StopReason::Timeout(_), Some(t)) => StopReason::Timeout(t),
        (r, _) => r,
    };
    let status = crate::exit::for_stop(&reason);
    if status == crate::exit::SUCCESS {
        info!("stopped: {reason}");
    } else {
        eprintln!("error: {reason}");
    }
    Ok(ExitCode::from(status))
}

/// Ends the process with exit status 124 when `--timeout` runs out before
/// the guest runs (setup took too long), or 10 s after it ran out while
/// the guest was running (the vCPUs did not stop).
struct Watchdog {
    state: std::sync::Arc<WatchState>,
}

struct WatchState {
    timeout: Duration,
    deadline: Instant,
    phase: Mutex<&'static str>,
    guest_started: AtomicBool,
}

/// How long after `--timeout` a running guest's vCPUs may take to stop.
const STOP_GRACE: Duration = Duration::from_secs(10);

impl Watchdog {
    fn start(timeout: Duration) -> Self {
        let state = std::sync::Arc::new(WatchState {
            timeout,
            deadline: args::started() + timeout,
            phase: Mutex::new("checking the request"),
            guest_started: AtomicBool::new(false),
        });
        let s = state.clone();
        std::thread::Builder::new()
            .name("timeout".into())
            .spawn(move || s.watch())
            .map(drop)
            .unwrap_or_else(|e| warn!("cannot start the --timeout watchdog: {e}"));
        Self { state }
    }

    fn phase(&self, p: &'static str) {
        *self.state.phase.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }

    /// The guest starts now; returns what is left of the time limit.
    fn guest_started(&self) -> Duration {
        self.state.guest_started.store(true, Ordering::SeqCst);
        self.state
            .deadline
            .saturating_duration_since(Instant::now())
    }
}

impl WatchState {
    fn watch(&self) {
        loop {
            let started = self.guest_started.load(Ordering::SeqCst);
            let until = if started {
                self.deadline + STOP_GRACE
            } else {
                self.deadline
            };
            let now = Instant::now();
            if now < until {
                std::thread::sleep((until - now).min(Duration::from_millis(50)));
                continue;
            }
            let t = crate::config::format_duration(self.timeout);
            if started {
                eprintln!(
                    "error: --timeout {t}: the guest's vCPUs did not stop within {} s after it \
                     ran out",
                    STOP_GRACE.as_secs()
                );
            } else {
                let phase = *self.phase.lock().unwrap_or_else(|e| e.into_inner());
                eprintln!(
                    "error: --timeout {t} ran out before the guest started (while {phase}); \
                     give a longer --timeout"
                );
            }
            std::process::exit(crate::exit::TIMEOUT.into());
        }
    }
}

/// `--memory` more than the host's RAM can never run: refuse it before
/// reserving anything (exit 2). More than what is available now is
/// allowed (the guest touches its RAM lazily) with a warning.
fn check_memory_fits(bytes: u64) -> Result<()> {
    use vmm_machine::memory::{host_mem_available, host_mem_total};
    if let Some(total) = host_mem_total() {
        if bytes > total {
            return Err(InputError(format!(
                "--memory {}: more than this host's {} of RAM; give at most {} (what is \
                 available now)",
                args::gib(bytes),
                args::gib(total),
                args::gib(host_mem_available().unwrap_or(total).min(total))
            ))
            .into());
        }
    }
    if let Some(avail) = host_mem_available() {
        if bytes > avail {
            warn!(
                "--memory {}: more than the {} the host has available now; the guest may be \
                 killed when it touches it",
                args::gib(bytes),
                args::gib(avail)
            );
        }
    }
    Ok(())
}

/// `--console FILE` before any work: its directory is writable and, unless
/// `--console-append`, no file is there yet (never clobbered).
fn check_console(cfg: &RunConfig) -> Result<()> {
    match &cfg.console {
        ConsoleTarget::Stdout
        | ConsoleTarget::Stderr
        | ConsoleTarget::Null
        | ConsoleTarget::Pty => Ok(()),
        ConsoleTarget::Socket(p) if std::fs::symlink_metadata(p).is_ok() => {
            Err(InputError(format!(
                "--console virtio,socket={}: something is already there; give a new path \
                 (the socket is created, and removed when the VM ends)",
                p.display()
            ))
            .into())
        }
        ConsoleTarget::Socket(p) => Ok(check_output_file("--console", p, false)?),
        ConsoleTarget::File(p) if !p.is_dir() && std::fs::symlink_metadata(p).is_ok() => {
            Err(InputError(format!(
                "--console {}: the file exists and would be overwritten; remove it, give \
                 another path, or add --console-append to append to it",
                p.display()
            ))
            .into())
        }
        ConsoleTarget::File(p) => Ok(check_output_file("--console", p, false)?),
        ConsoleTarget::Append(p) => Ok(check_output_file("--console", p, true)?),
    }
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
        console_append: args.console_append,
        until: args.until,
        timeout: args.timeout,
        vendor: args.vendor,
        compat: args.compat,
        sched: args.sched,
        mitigations: args.mitigations,
        fair_slice_scaling: args.fair_slice_scaling,
        tick_us: args.tick_us,
        halt_poll_us: args.halt_poll_us,
        halt_park: args.halt_park,
        rng: args.rng,
        platform: args.platform,
        disk: args.disk,
        net: args.net,
        vsock: args.vsock,
        fs: args.fs,
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
        Err(e) if cfg.pin == vcpu_sched::placement::pin::PinSpec::None => {
            warn!("cannot read the host topology ({e}); guest memory will not be bound");
            None
        }
        Err(e) => return Err(e).context("--pin needs the host topology"),
    };
    let pins = match &host {
        Some(h) => vcpu_sched::placement::pin::plan(&cfg.pin, guest, h)
            .map_err(vmm_machine::Error::from)?,
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
    if vcpu_sched::placement::rt::oversubscribed(
        guest.num_vcpus(),
        pins.map(|p| &p.os[..]),
        allowed,
    ) {
        warn!(
            "--rt {rt}: {} vCPUs share fewer host CPUs; equal-priority SCHED_FIFO threads \
             never time-slice, so a vCPU waiting for a preempted sibling can hang the guest. \
             Give each vCPU its own host CPU, or use rr:PRIO",
            guest.num_vcpus()
        );
    }
}

/// `--console`: a new file is created exclusively (a file that appeared
/// since [`check_console`] is still not overwritten).
/// The console's host end: where output goes, where input (if any)
/// comes from, and the socket file to remove at the end.
struct OpenConsole {
    out: Box<dyn std::io::Write + Send>,
    input: Option<std::os::fd::OwnedFd>,
    guard: Option<vmm_machine::console_host::SocketGuard>,
}

fn open_console(cfg: &RunConfig) -> Result<OpenConsole> {
    use vmm_machine::console_host;
    let host = |c: console_host::HostConsole| OpenConsole {
        out: c.out,
        input: Some(c.input),
        guard: c.guard,
    };
    let out = |out: Box<dyn std::io::Write + Send>| OpenConsole {
        out,
        input: None,
        guard: None,
    };
    let open = |p: &std::path::Path, append: bool| {
        let mut o = std::fs::OpenOptions::new();
        if append {
            o.append(true).create(true);
        } else {
            o.write(true).create_new(true);
        }
        o.open(p).map_err(|e| {
            vmm_machine::Error::Input(format!(
                "--console {}: cannot open it: {}",
                p.display(),
                args::os_message(&e)
            ))
        })
    };
    Ok(match &cfg.console {
        ConsoleTarget::Stdout => out(Box::new(std::io::stdout())),
        ConsoleTarget::Stderr => out(Box::new(std::io::stderr())),
        ConsoleTarget::File(p) => out(Box::new(open(p, false)?)),
        ConsoleTarget::Append(p) => out(Box::new(open(p, true)?)),
        ConsoleTarget::Null => out(Box::new(std::io::sink())),
        ConsoleTarget::Pty => host(console_host::pty().map_err(|e| {
            vmm_machine::Error::Input(format!("--console virtio,pty: cannot open a pty: {e}"))
        })?),
        ConsoleTarget::Socket(p) => host(console_host::socket(p).map_err(|e| {
            vmm_machine::Error::Input(format!(
                "--console virtio,socket={}: cannot listen there: {}",
                p.display(),
                args::os_message(&e)
            ))
        })?),
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
/// `timeout`: what is left of `--timeout`.
fn run_vm(
    vm: vmm_machine::vm::LinuxVm,
    cfg: &RunConfig,
    pins: Option<Vec<u32>>,
    timeout: Option<Duration>,
) -> Result<StopReason> {
    Ok(match cfg.sched {
        SchedMode::Host => {
            let opts = vmm_machine::vcpu_body::linux::ThreadOptions {
                pins,
                rt: cfg.rt,
                timeout,
            };
            vmm_machine::vcpu_body::linux::run_threads(vm, &opts)?
        }
        SchedMode::VcpuSched => {
            let o = vmm_machine::vcpu_body::linux::LinuxSchedOptions {
                mitigations: cfg.mitigations,
                fair_slice_scaling: cfg.fair_slice_scaling,
                tick: cfg.tick,
                policy: match cfg.rt {
                    Some(vcpu_sched::placement::rt::RtPolicy::Fifo(p)) => {
                        vcpu_sched::Policy::Fifo(p)
                    }
                    Some(vcpu_sched::placement::rt::RtPolicy::Rr(p)) => vcpu_sched::Policy::Rr(p),
                    None => vcpu_sched::Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
                },
                pins,
                timeout,
                poll: cfg.halt_poll,
                halt: vmm_machine::vcpu_body::linux::HaltSleep::default(),
                park: cfg.halt_park,
            };
            info!(
                "vCPUs scheduled by vcpu_sched (workers executor, mitigations {}, fair slice \
                 scaling {}, tick {:?}, halt poll {:?}, halt park {})",
                cfg.mitigations,
                cfg.fair_slice_scaling,
                cfg.tick,
                cfg.halt_poll,
                if cfg.halt_park { "on" } else { "off" }
            );
            vmm_machine::vcpu_body::linux::run_sched(vm, &o)?
        }
    })
}
