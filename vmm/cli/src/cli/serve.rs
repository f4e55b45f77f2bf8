//! `vmm serve`: the REST API server's arguments and runner.
//!
//! WHAT: flags (and a `--config` TOML file with the same settings) for
//! [`vmm_api::serve`]; checks of the topology and the socket's
//! directory before anything starts, so that bad input is one line and
//! exit 2.
//! WHY: one file per subcommand.
//! HOW: a flag wins over the file, the file over the default; the server
//! itself lives in [`vmm_api`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde::Deserialize;

use super::args::{self, InputError};
use vmm_api::{serve, ServeOptions};
use vmm_machine::vcpu_body::ExecutorKind;

/// `vmm serve` arguments.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The Unix socket to listen on (removed again at shutdown).
    #[arg(long, value_name = "PATH")]
    pub api_socket: PathBuf,
    /// The topology the scheduler manages and the planner packs: `host`
    /// (the default), a preset or an hwloc spec (anything but `host` runs
    /// emulated on this host's CPUs).
    #[arg(long, short, value_name = "SPEC")]
    pub topology: Option<String>,
    /// The scheduler's fixes: none, all (the default), only:X, all-but:X.
    #[arg(long, short, value_name = "SET", value_parser = args::mitigations)]
    pub mitigations: Option<vcpu_sched::Mitigations>,
    /// Which executor runs the vCPUs: workers (M:N, the default: one
    /// scheduler shared by every VM) or host (1:1 threads named vcpuN, the
    /// host kernel schedules them; no vcpu_sched).
    #[arg(long, value_name = "KIND")]
    pub executor: Option<ExecutorKind>,
    /// Export KVM exits per vCPU on /metrics (one series per vCPU).
    #[arg(long)]
    pub metrics_per_vcpu: bool,
    /// The shared scheduler's busy balance: a busy CPU with vCPUs waiting
    /// hands one to a busy CPU with at least two fewer waiting (on, the
    /// default with the workers executor) or vCPUs move only into idle
    /// CPUs (off). Workers executor only
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub busy_balance: Option<bool>,
    /// Sleeper credit: a woken fair vCPU is credited the time it slept,
    /// up to half the fair latency, so that a mostly idle vCPU goes ahead
    /// of CPU-bound ones (on) or comes back with the virtual runtime it
    /// left with (off, the default). Workers executor only
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub sleeper_credit: Option<bool>,
    /// Fair wakeup preemption: a woken fair vCPU far enough behind the
    /// running one preempts it (on, the default) or waits for its slice
    /// to end or for it to block (off). Workers executor only
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub wakeup_preempt: Option<bool>,
    /// The fair period a slice is cut from: a fair vCPU's slice is this
    /// shared by weight among the runnable fair vCPUs of its CPU, at
    /// least --fair-min-granularity-us (Linux's sched_latency; default
    /// 6000), before --fair-slice-scaling. 100..=1000000. Workers
    /// executor only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub fair_latency_us: Option<u64>,
    /// The shortest fair slice (Linux's sched_min_granularity; default
    /// 750), before --fair-slice-scaling. 100..=1000000, at most
    /// --fair-latency-us. Workers executor only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub fair_min_granularity_us: Option<u64>,
    /// How the fair bounds (latency, min granularity, wakeup granularity)
    /// grow with the topology's CPUs: log (the default, as Linux)
    /// multiplies them by 1 + log2(min(CPUs, 8)), 2x on 2 CPUs and 4x
    /// from 8 on; none keeps them as given. /metrics'
    /// vmm_sched_fair_slice_seconds shows the bounds in force. Workers
    /// executor only
    #[arg(long, value_name = "log|none", value_parser = args::slice_scaling)]
    pub fair_slice_scaling: Option<vcpu_sched::SliceScaling>,
    /// The shared scheduler's tick period: how often each CPU's slice
    /// end, the wakeups deferred to a busy CPU and the balances are looked
    /// at (default 1000: 1 ms; Linux's is 4 ms at HZ=250). 100..=100000.
    /// /metrics' vmm_sched_tick_seconds shows it. Workers executor only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=100_000))]
    pub tick_us: Option<u64>,
    /// How often the halt poller probes the vCPUs of Linux VMs that are
    /// asleep in the scheduler for an interrupt (an IPI from another vCPU
    /// is seen within this) and kicks out those halted inside KVM_RUN
    /// (default 1000: 1 ms). 100..=100000. /metrics' vmm_halt_poll_seconds
    /// shows it. Workers executor only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=100_000))]
    pub halt_poll_us: Option<u64>,
    /// Halted vCPUs of Linux VMs wait inside KVM on a thread each, which
    /// KVM wakes (on), or sleep in the scheduler while the halt poller
    /// probes them every period (off, the default). Workers executor only
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub halt_park: Option<bool>,
    /// A TOML file with any of: topology, mitigations, executor,
    /// metrics_per_vcpu, busy_balance, sleeper_credit, wakeup_preempt,
    /// fair_latency_us, fair_min_granularity_us, fair_slice_scaling,
    /// tick_us, halt_poll_us, halt_park. Flags win over it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `--config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeFile {
    topology: Option<String>,
    mitigations: Option<String>,
    executor: Option<String>,
    #[serde(default)]
    metrics_per_vcpu: bool,
    busy_balance: Option<bool>,
    sleeper_credit: Option<bool>,
    wakeup_preempt: Option<bool>,
    fair_latency_us: Option<u64>,
    fair_min_granularity_us: Option<u64>,
    fair_slice_scaling: Option<String>,
    tick_us: Option<u64>,
    halt_poll_us: Option<u64>,
    halt_park: Option<bool>,
}

fn on_off(s: &str) -> std::result::Result<bool, String> {
    match s.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}': give on or off")),
    }
}

fn load_file(path: &Path) -> Result<ServeFile> {
    let text = args::read_input("--config", path, args::MAX_INPUT_BYTES, "a TOML file")?;
    Ok(toml::from_str(&text)
        .map_err(|e| InputError(format!("--config {}: {}", path.display(), e.message())))?)
}

/// The environment variable naming the settings file of Cloud
/// Hypervisor's entry (`vmm --api-socket PATH`), whose command line Kata
/// fixes: the same TOML as `vmm serve --config`.
pub const CONFIG_ENV: &str = "VMM_SERVE_CONFIG";

/// `vmm --api-socket PATH [--seccomp X]`: Cloud Hypervisor's command line,
/// as Kata starts its hypervisor. Serves as `vmm serve --api-socket PATH`
/// with the settings of the file `$VMM_SERVE_CONFIG` names (none: the
/// defaults). This VMM installs no seccomp filter: `--seccomp false` is
/// the truth; `true` (CH's default) and `log` warn that none is installed.
pub fn run_ch_entry(api_socket: PathBuf, seccomp: Option<&str>) -> Result<()> {
    if let Some(mode @ ("true" | "log")) = seccomp {
        tracing::warn!(seccomp = mode, "no seccomp filter is installed");
        eprintln!(
            "vmm: warning: --seccomp {mode}: this VMM installs no seccomp filter; it runs \
             unfiltered, as with --seccomp false"
        );
    }
    let config = std::env::var_os(CONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let named = config.clone();
    let r = run(ServeArgs {
        api_socket,
        topology: None,
        mitigations: None,
        executor: None,
        metrics_per_vcpu: false,
        busy_balance: None,
        sleeper_credit: None,
        wakeup_preempt: None,
        fair_latency_us: None,
        fair_min_granularity_us: None,
        fair_slice_scaling: None,
        tick_us: None,
        halt_poll_us: None,
        halt_park: None,
        config,
    });
    match named {
        Some(p) => r.with_context(|| format!("{CONFIG_ENV}={}", p.display())),
        None => r,
    }
}

/// A setting of the shared scheduler (`name`, as the config file spells
/// it): the flag's or the file's value, else `default`. With the host
/// executor (`workers` false), which runs no vcpu_sched, any value but
/// `inert` (what the host executor does anyway) is refused: it would
/// silently do nothing.
fn sched_setting(
    name: &str,
    asked: Option<bool>,
    default: bool,
    inert: bool,
    workers: bool,
) -> Result<bool> {
    match asked {
        Some(v) if !workers && v != inert => Err(InputError(format!(
            "{name}: a setting of vcpu_sched, which the host executor does not run (the host \
             kernel schedules its vCPU threads); use --executor workers or leave it out"
        ))
        .into()),
        Some(v) => Ok(v),
        None if workers => Ok(default),
        None => Ok(inert),
    }
}

/// Runs `vmm serve` until `vmm.shutdown` or SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    let file = match &a.config {
        Some(p) => load_file(p)?,
        None => ServeFile::default(),
    };
    let at = |what: &str| {
        a.config
            .as_ref()
            .map(|p| format!("--config {}: {what}", p.display()))
    };
    let topology = a
        .topology
        .clone()
        .or(file.topology)
        .unwrap_or_else(|| "host".into());
    let mitigations = match (a.mitigations, &file.mitigations) {
        (Some(m), _) => m,
        (None, Some(s)) => args::mitigations(s)
            .map_err(|e| InputError(format!("{}: {e}", at("mitigations").unwrap_or_default())))?,
        (None, None) => vcpu_sched::Mitigations::all(),
    };
    let executor = match (a.executor, &file.executor) {
        (Some(e), _) => e,
        (None, Some(s)) => s
            .parse()
            .map_err(|e| InputError(format!("{}: {e}", at("executor").unwrap_or_default())))?,
        (None, None) => ExecutorKind::Workers,
    };
    // Bad input before anything starts: exit 2, one line.
    if executor == ExecutorKind::Threads {
        return Err(InputError(
            "executor threads: vmm serve runs every VM on one shared scheduler, which the \
             threads executor cannot take VMs into while it runs; use workers (the default) \
             or host (1:1 threads, no vcpu_sched)"
                .into(),
        )
        .into());
    }
    // the shared scheduler's settings: asked for with the host executor,
    // which runs no vcpu_sched, a value it cannot honour is refused
    let workers = executor == ExecutorKind::Workers;
    let busy_balance = sched_setting(
        "busy_balance",
        a.busy_balance.or(file.busy_balance),
        true,
        false,
        workers,
    )?;
    let sleeper_credit = sched_setting(
        "sleeper_credit",
        a.sleeper_credit.or(file.sleeper_credit),
        false,
        false,
        workers,
    )?;
    let wakeup_preempt = sched_setting(
        "wakeup_preempt",
        a.wakeup_preempt.or(file.wakeup_preempt),
        true,
        true,
        workers,
    )?;
    let file_scaling = file
        .fair_slice_scaling
        .as_deref()
        .map(args::slice_scaling)
        .transpose()
        .map_err(|e| InputError(format!("--config: fair_slice_scaling: {e}")))?;
    let fair = args::fair_slices(
        a.fair_latency_us.or(file.fair_latency_us),
        a.fair_min_granularity_us.or(file.fair_min_granularity_us),
        a.fair_slice_scaling.or(file_scaling),
        workers,
    )?;
    let tick_ns = args::tick(a.tick_us.or(file.tick_us), workers)?;
    let halt_poll_ns = args::halt_poll(a.halt_poll_us.or(file.halt_poll_us), workers)?;
    let halt_park = sched_setting(
        "halt_park",
        a.halt_park.or(file.halt_park),
        false,
        false,
        workers,
    )?;
    topology::load(&topology).with_context(|| format!("--topology {topology}"))?;
    let dir = a
        .api_socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(InputError(format!(
            "--api-socket {}: {} is not a directory",
            a.api_socket.display(),
            dir.display()
        ))
        .into());
    }
    let opts = ServeOptions {
        socket: a.api_socket.clone(),
        topology,
        mitigations,
        executor,
        per_vcpu_metrics: a.metrics_per_vcpu || file.metrics_per_vcpu,
        busy_balance,
        sleeper_credit,
        wakeup_preempt,
        fair_latency_ns: fair.latency_ns,
        fair_min_granularity_ns: fair.min_granularity_ns,
        fair_slice_scaling: fair.scaling,
        tick_ns,
        halt_poll_ns,
        halt_park,
    };
    serve(opts).map_err(|e| {
        if e.is_user_fault() {
            // the message names --api-socket (or the executor) itself
            InputError(e.to_string()).into()
        } else {
            anyhow::Error::from(e)
                .context(format!("vmm serve --api-socket {}", a.api_socket.display()))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::sched_setting;

    #[test]
    fn a_scheduler_setting_takes_what_is_asked_else_its_executors_default() {
        // workers: the asked value, else the scheduler's default
        assert!(sched_setting("busy_balance", None, true, false, true).unwrap());
        assert!(!sched_setting("busy_balance", Some(false), true, false, true).unwrap());
        assert!(sched_setting("sleeper_credit", Some(true), false, false, true).unwrap());
        assert!(!sched_setting("wakeup_preempt", Some(false), true, true, true).unwrap());
        // host: what it does anyway, asked or not
        assert!(!sched_setting("busy_balance", None, true, false, false).unwrap());
        assert!(!sched_setting("busy_balance", Some(false), true, false, false).unwrap());
        assert!(sched_setting("wakeup_preempt", Some(true), true, true, false).unwrap());
        // host: anything else is refused, by name
        let e = sched_setting("sleeper_credit", Some(true), false, false, false).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("sleeper_credit: a setting of vcpu_sched"),
            "{e}"
        );
        let e = sched_setting("wakeup_preempt", Some(false), true, true, false).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("wakeup_preempt: a setting of vcpu_sched"),
            "{e}"
        );
    }
}
