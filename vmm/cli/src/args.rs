//! The flag values every part of the binary parses: the subcommands in
//! [`crate::cli`] and the `vmm run` settings in [`crate::config`].
//!
//! WHAT: the user-input error type of the command line ([`InputError`]);
//! one parser per flag that more than one place takes (durations,
//! `--burst-us`, `--period-us`, `--tasks`-like counts, `--prio`, `--pin`,
//! `--rt`, `--mitigations`, `--compare`), each with one set of limits;
//! bounded reads of input files; the up-front checks of output paths; the
//! process's start time (the origin of `--timeout`); whether stderr may be
//! coloured; the progress bar.
//!
//! WHY: the same flag must follow the same rules in every subcommand and in
//! a `--config` file. A leaf beneath both the subcommands and the settings
//! keeps them from importing each other: the settings never reach up into
//! the command line, and the subcommands never into one another.
//!
//! HOW: a leaf module. It imports nothing from this crate. What `vmm-sim`
//! (`vmm sim`) needs too, the generic parsers, output checks, standard
//! output and the progress bar, lives in the `cli_common` crate and is
//! re-exported here, so both binaries follow one set of rules. The flag
//! parsers return `String` messages (clap's `value_parser` prefixes the
//! flag and exits 2; the `vmm run` settings wrap them in a
//! [`crate::config::ConfigError`], also exit 2). A message says what is
//! wrong with the value and what to give instead; it never repeats the
//! flag, which the caller adds. Limits are errors, never silent caps.
//! [`InputError`] is `cli_common`'s, which [`crate::exit`] classifies.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Result;
use cli_common::args::int_in;
use vmm_machine::devices::UnknownEngine;

pub use cli_common::args::{
    burst_us, check_output_dir, check_output_file, check_work, count, format_duration, ignored,
    os_message, parse_duration, period_us, prio, reps, write_new, MAX_COUNT, MAX_US,
};
pub use cli_common::exit::InputError;
pub use cli_common::term::{progress_bar, stderr_styled, write_stdout};
pub(crate) use cli_common::{out, outln};

// ---------------------------------------------------------------- limits

/// The shortest measured window of `bench` and `sched-bench`.
pub const MIN_BENCH_DURATION: Duration = Duration::from_millis(100);
/// The longest measured window of `bench` and `sched-bench` (1 hour).
pub const MAX_BENCH_DURATION: Duration = Duration::from_secs(3600);
/// The longest `vmm run --timeout` (7 days).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// `vmm bench --vcpus`: vCPUs per micro-guest VM.
pub const MAX_VCPUS_PER_VM: usize = 256;
/// `vmm bench --vms` x `--vcpus`: the scheduler's CPU limit
/// ([`vcpu_sched::MAX_CPUS`]); more vCPUs than that is oversubscription no
/// topology it supports can give a measurement for.
pub const MAX_TOTAL_VCPUS: usize = vcpu_sched::MAX_CPUS;

// ------------------------------------------------------------ start time

fn start_cell() -> &'static OnceLock<Instant> {
    static START: OnceLock<Instant> = OnceLock::new();
    &START
}

/// Records the process's start (the origin of `--timeout`); `main` calls
/// it first. Later calls change nothing.
pub fn mark_start() {
    start_cell().get_or_init(Instant::now);
}

/// When the process started ([`mark_start`]; the first call of this
/// function when nothing marked it).
pub fn started() -> Instant {
    *start_cell().get_or_init(Instant::now)
}

// ------------------------------------------------------------- durations

fn duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!(
            "{} is too short to measure anything: give at least {}",
            s.trim(),
            format_duration(min)
        ));
    }
    if d > max {
        return Err(format!(
            "{} is more than the limit of {}: give a shorter duration",
            s.trim(),
            format_duration(max)
        ));
    }
    Ok(d)
}

/// `bench` and `sched-bench --duration`: [`parse_duration`], then
/// [`MIN_BENCH_DURATION`]..=[`MAX_BENCH_DURATION`].
pub fn bench_duration(s: &str) -> Result<Duration, String> {
    duration_in(s, MIN_BENCH_DURATION, MAX_BENCH_DURATION)
}

/// `vmm run --timeout`: [`parse_duration`], at most [`MAX_TIMEOUT`].
pub fn timeout(s: &str) -> Result<Duration, String> {
    duration_in(s, Duration::from_nanos(1), MAX_TIMEOUT)
}

// ---------------------------------------------------------- numeric flags

/// `--vms`, `--vcpus` of `vmm bench`: 1..=[`MAX_TOTAL_VCPUS`] each; their
/// product is checked by [`check_vcpus`].
pub fn vm_count(s: &str) -> Result<usize, String> {
    int_in(s, 1, MAX_TOTAL_VCPUS as u64, "").map(|v| v as usize)
}

/// `vmm bench --vms N --vcpus M`: at most [`MAX_VCPUS_PER_VM`] per VM and
/// [`MAX_TOTAL_VCPUS`] in all.
pub fn check_vcpus(vms: usize, vcpus: usize) -> Result<(), InputError> {
    if vcpus > MAX_VCPUS_PER_VM {
        return Err(InputError(format!(
            "--vcpus {vcpus}: a micro-guest VM takes at most {MAX_VCPUS_PER_VM} vCPUs; \
             give fewer, or more --vms"
        )));
    }
    match vms.checked_mul(vcpus) {
        Some(n) if n <= MAX_TOTAL_VCPUS => Ok(()),
        _ => Err(InputError(format!(
            "--vms {vms} --vcpus {vcpus}: {} vCPUs in all; the scheduler takes at most \
             {MAX_TOTAL_VCPUS}: give fewer VMs or vCPUs",
            vms.saturating_mul(vcpus)
        ))),
    }
}

// ------------------------------------------------------- run's placement

/// `--pin`: `auto`, `none` or a host CPU list. Empty is an error.
pub fn pin(s: &str) -> Result<vcpu_sched::placement::pin::PinSpec, String> {
    if s.trim().is_empty() {
        return Err("empty: give auto, none or a host CPU list such as 0-7 or 0,2,4".into());
    }
    vcpu_sched::placement::pin::PinSpec::parse(s)
}

/// `--rt`: `fifo:PRIO`, `rr:PRIO` (PRIO 1..=99) or `none`. Empty is an
/// error.
pub fn rt(s: &str) -> Result<Option<vcpu_sched::placement::rt::RtPolicy>, String> {
    if s.trim().is_empty() {
        return Err("empty: give fifo:PRIO, rr:PRIO (PRIO 1 to 99) or none".into());
    }
    vcpu_sched::placement::rt::RtPolicy::parse(s)
}

// ----------------------------------------------------------- mitigations

/// `--mitigations SET`: none, all, only:FIX[,FIX..] or all-but:FIX[,..]
/// (`vcpu_sched::Mitigations`' `FromStr`, which refuses an empty one too).
pub fn mitigations(s: &str) -> Result<vcpu_sched::Mitigations, String> {
    s.parse::<vcpu_sched::Mitigations>()
        .map_err(|e| e.to_string())
}

/// Parses `--compare`: `seeds` (baseline, each fix alone, all) or
/// `SET;SET;..` whose first entry is the baseline
/// (`vcpu_sched::Mitigations::parse_sets`).
pub fn mitigation_sets(list: &str) -> Result<Vec<vcpu_sched::Mitigations>> {
    vcpu_sched::Mitigations::parse_sets(list)
        .map_err(|e| InputError(format!("--compare: {e}")).into())
}

/// Refuses a comparison of `runs` runs of `duration` each (plus warm-up
/// and set-up) estimated over the limit, unless `--long` ([`check_work`]).
pub fn check_compare_work(runs: usize, duration: Duration, long: bool) -> Result<(), InputError> {
    let each = duration + duration / 4 + Duration::from_secs(1);
    check_work(
        &format!(
            "the comparison ({runs} runs of {})",
            format_duration(duration)
        ),
        each * runs as u32,
        long,
        "give fewer --reps, a shorter --duration or fewer --compare sets",
    )
}

// ------------------------------------------------------------ input files

/// The largest request or settings file read (`vmm plan --request`,
/// `vmm serve --config`; `vmm run --config` has
/// [`crate::config::MAX_CONFIG_BYTES`], the same): a real one is a few
/// hundred bytes.
pub const MAX_INPUT_BYTES: u64 = 1 << 20;

/// Reads the text file `flag` names: a regular file of at most `max`
/// bytes, in UTF-8, opened without blocking on a FIFO and read no further
/// than the limit ([`topology::user_file`], the one implementation every
/// input file goes through). `what` says what to give instead ("a TOML
/// file").
pub fn read_input(
    flag: &str,
    path: &std::path::Path,
    max: u64,
    what: &str,
) -> Result<String, InputError> {
    topology::user_file::read_text(path, max, what)
        .map_err(|e| InputError(format!("{flag} {}: {e}", path.display())))
}

// ------------------------------------------------------------- messages

/// Bytes in GiB (or MiB below 1 GiB), for messages.
pub fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// Splits at the commas outside `[...]` (Cloud Hypervisor writes lists
/// as `fd=[3,4]`).
fn split_options(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Cloud Hypervisor's option syntax, `key=value,key=value`: each key one
/// of `keys`, at most once. An empty string has no options.
fn ch_options<'a>(s: &'a str, keys: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for item in split_options(s)
        .into_iter()
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not key=value (keys: {})", keys.join(", ")))?;
        if !keys.contains(&k) {
            return Err(format!("unknown option {k:?} (keys: {})", keys.join(", ")));
        }
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("{k} is given twice"));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn segment_number(v: &str) -> Result<u16, String> {
    v.parse()
        .map_err(|_| format!("pci_segment={v:?} is not a segment number (0, 1, ...)"))
}

/// `--rng [pci_segment=S]` (Cloud Hypervisor's syntax): a virtio-rng fed
/// from the host's /dev/urandom, on segment S (0 by default).
pub fn rng(s: &str) -> Result<u16, String> {
    let mut seg = 0;
    for (k, v) in ch_options(s, &["pci_segment"])? {
        if k == "pci_segment" {
            seg = segment_number(v)?;
        }
    }
    Ok(seg)
}

fn on_off(k: &str, v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{k}={v:?} is not on or off")),
    }
}

/// `--disk path=IMG[,readonly=on][,num_queues=N][,pci_segment=S][,engine=E]`
/// (Cloud Hypervisor's syntax, plus this VMM's `engine=sync|pool|io_uring`):
/// a virtio-blk disk backed by a raw image.
pub fn disk(s: &str) -> Result<vmm_machine::devices::DiskSpec, String> {
    let mut d = vmm_machine::devices::DiskSpec {
        path: Default::default(),
        readonly: false,
        num_queues: None,
        queue_size: None,
        pci_segment: 0,
        engine: Default::default(),
    };
    let mut path = None;
    let keys = ["path", "readonly", "num_queues", "pci_segment", "engine"];
    for (k, v) in ch_options(s, &keys)? {
        match k {
            "path" if v.is_empty() => return Err("path= is empty: give the image's path".into()),
            "path" => path = Some(v.into()),
            "readonly" => d.readonly = on_off(k, v)?,
            "engine" => d.engine = v.parse().map_err(|e: UnknownEngine| e.to_string())?,
            "num_queues" => {
                d.num_queues = Some(v.parse().map_err(|_| {
                    format!("num_queues={v:?} is not a number of queues (1, 2, ...)")
                })?)
            }
            _ => d.pci_segment = segment_number(v)?,
        }
    }
    d.path = path.ok_or("no path=IMG: give the raw image, e.g. path=disk.img")?;
    Ok(d)
}

/// `--net tap=NAME|fd=N|fd=[N,M..][,mac=MAC][,num_queues=N][,pci_segment=S]`
/// (Cloud Hypervisor's syntax): a virtio-net on an existing tap, or on
/// tap descriptors this process was handed.
pub fn net(s: &str) -> Result<vmm_machine::devices::NetSpec, String> {
    use vmm_machine::devices::{NetSpec, TapSource};
    let mut tap = None;
    let mut n = NetSpec {
        tap: TapSource::Name(String::new()),
        mac: None,
        num_queues: None,
        pci_segment: 0,
    };
    for (k, v) in ch_options(s, &["tap", "fd", "mac", "num_queues", "pci_segment"])? {
        match k {
            "tap" | "fd" if tap.is_some() => {
                return Err(
                    "tap= and fd= are both given: give one (a tap's name, or its open fds)".into(),
                )
            }
            "tap" if v.is_empty() => return Err("tap= is empty: give the tap's name".into()),
            "tap" => tap = Some(TapSource::Name(v.to_string())),
            "fd" => {
                let list = v
                    .strip_prefix('[')
                    .and_then(|l| l.strip_suffix(']'))
                    .unwrap_or(v);
                let fds = list
                    .split(',')
                    .map(|f| f.trim().parse::<i32>())
                    .collect::<Result<Vec<_>, _>>()
                    .ok()
                    .filter(|f| !f.is_empty() && f.iter().all(|&x| x >= 0))
                    .ok_or_else(|| {
                        format!("fd={v:?} is not a descriptor number or a list like fd=[3,4]")
                    })?;
                tap = Some(TapSource::Fds(fds));
            }
            "mac" => n.mac = Some(v.parse()?),
            "num_queues" => {
                n.num_queues = Some(v.parse().map_err(|_| {
                    format!("num_queues={v:?} is not a number of queues (2, 4, ...)")
                })?)
            }
            _ => n.pci_segment = segment_number(v)?,
        }
    }
    n.tap = tap.ok_or("no tap=NAME or fd=N: give the tap, e.g. tap=tap0")?;
    Ok(n)
}

/// `--vsock cid=N,socket=PATH[,iommu=off][,id=ID][,pci_segment=S]`
/// (Cloud Hypervisor's syntax): a virtio-vsock whose host side is the
/// Unix socket PATH (hybrid vsock), created by the VMM.
pub fn vsock(s: &str) -> Result<vmm_machine::devices::VsockSpec, String> {
    let (mut cid, mut socket) = (None, None);
    let mut pci_segment = 0;
    for (k, v) in ch_options(s, &["cid", "socket", "iommu", "id", "pci_segment"])? {
        match k {
            "cid" => {
                cid = Some(v.parse::<u64>().map_err(|_| {
                    format!("cid={v:?} is not a number; give the guest's CID, 3 or more")
                })?)
            }
            "socket" if v.is_empty() => {
                return Err("socket= is empty: give the Unix socket's path".into())
            }
            "socket" => socket = Some(std::path::PathBuf::from(v)),
            "iommu" if on_off(k, v)? => return Err("iommu=on: this VMM has no IOMMU".into()),
            "iommu" | "id" => {}
            _ => pci_segment = segment_number(v)?,
        }
    }
    Ok(vmm_machine::devices::VsockSpec {
        cid: cid.ok_or("no cid=N: give the guest's CID (3 or more), e.g. cid=3")?,
        socket: socket
            .ok_or("no socket=PATH: give the Unix socket to create, e.g. socket=/tmp/vm.vsock")?,
        pci_segment,
    })
}

/// `--fs tag=TAG,socket=PATH[,num_queues=N][,queue_size=N][,pci_segment=S]`
/// (Cloud Hypervisor's syntax): a virtio-fs device whose vhost-user
/// backend (virtiofsd) listens on PATH.
pub fn fs(s: &str) -> Result<vmm_machine::devices::FsSpec, String> {
    let mut f = vmm_machine::devices::FsSpec {
        tag: String::new(),
        socket: Default::default(),
        num_queues: 1,
        queue_size: vmm_machine::devices::FS_QUEUE_SIZE,
        pci_segment: 0,
    };
    let (mut tag, mut socket) = (None, None);
    let keys = ["tag", "socket", "num_queues", "queue_size", "pci_segment"];
    let number = |k: &str, v: &str| {
        v.parse::<u16>()
            .map_err(|_| format!("{k}={v:?} is not a number (1, 2, ...)"))
    };
    for (k, v) in ch_options(s, &keys)? {
        match k {
            "tag" if v.is_empty() => {
                return Err("tag= is empty: give the name the guest mounts".into())
            }
            "tag" => tag = Some(v.to_string()),
            "socket" if v.is_empty() => {
                return Err("socket= is empty: give virtiofsd's vhost-user socket".into())
            }
            "socket" => socket = Some(v.into()),
            "num_queues" => f.num_queues = number(k, v)?,
            "queue_size" => f.queue_size = number(k, v)?,
            _ => f.pci_segment = segment_number(v)?,
        }
    }
    f.tag = tag.ok_or("no tag=TAG: give the name the guest mounts, e.g. tag=myfs")?;
    f.socket = socket.ok_or(
        "no socket=PATH: give the vhost-user socket of virtiofsd \
         (virtiofsd --socket-path=PATH -o source=DIR)",
    )?;
    Ok(f)
}

/// `--platform num_pci_segments=N` (Cloud Hypervisor's syntax).
pub fn platform(s: &str) -> Result<u16, String> {
    let mut n = 1;
    for (k, v) in ch_options(s, &["num_pci_segments"])? {
        if k == "num_pci_segments" {
            n = v.parse().map_err(|_| {
                format!(
                    "num_pci_segments={v:?} is not a number (1 to {})",
                    vmm_machine::devices::MAX_PCI_SEGMENTS
                )
            })?;
        }
    }
    Ok(n)
}

/// The fair slice bounds of `vmm serve` and `vmm bench`
/// (`--fair-latency-us`, `--fair-min-granularity-us`,
/// `--fair-slice-scaling`, or a config file's keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairSlices {
    /// The period slices are cut from, ns, before scaling.
    pub latency_ns: u64,
    /// The shortest slice, ns, before scaling.
    pub min_granularity_ns: u64,
    /// How the scheduler scales both (and the wakeup granularity) for its
    /// CPUs.
    pub scaling: vcpu_sched::SliceScaling,
}

/// [`FairSlices`] from the flags or a file's keys (µs): those given, else
/// the scheduler's defaults. Refused where no vcpu_sched runs (`sched`
/// false: the host executor), outside 100 µs..=1 s (a file bypasses
/// clap's range), and where the shortest slice exceeds the period it is
/// cut from.
pub fn fair_slices(
    latency_us: Option<u64>,
    min_us: Option<u64>,
    scaling: Option<vcpu_sched::SliceScaling>,
    sched: bool,
) -> Result<FairSlices, InputError> {
    let d = vcpu_sched::SchedConfig::default();
    if scaling.is_some() && !sched {
        return Err(host_refusal("fair_slice_scaling"));
    }
    for (name, v) in [
        ("fair_latency_us", latency_us),
        ("fair_min_granularity_us", min_us),
    ] {
        match v {
            Some(_) if !sched => return Err(host_refusal(name)),
            Some(us) if !(100..=1_000_000).contains(&us) => {
                return Err(InputError(format!(
                    "{name} = {us}: give 100..=1000000 (µs)"
                )))
            }
            _ => {}
        }
    }
    let latency = latency_us.map_or(d.fair_latency_ns, |us| us * 1_000);
    let min = min_us.map_or(d.fair_min_granularity_ns, |us| us * 1_000);
    if min > latency {
        return Err(InputError(format!(
            "fair_min_granularity_us = {} exceeds fair_latency_us = {}: the shortest slice is cut \
             from that period; give a smaller granularity or a longer latency",
            min / 1_000,
            latency / 1_000
        )));
    }
    Ok(FairSlices {
        latency_ns: latency,
        min_granularity_ns: min,
        scaling: scaling.unwrap_or(d.fair_slice_scaling),
    })
}

/// A setting of vcpu_sched given with the host executor, which runs none.
fn host_refusal(name: &str) -> InputError {
    InputError(format!(
        "{name}: a setting of vcpu_sched, which the host executor does not run (the host \
         kernel schedules its vCPU threads); use --executor workers or leave it out"
    ))
}

/// A period of the workers executor in µs (`name`, as a config file
/// spells it: `tick_us`, `halt_poll_us`), ns: `default` when not given;
/// 100 µs to 100 ms; refused with the host executor (`workers` false),
/// which runs no vcpu_sched.
fn workers_period(
    name: &str,
    us: Option<u64>,
    workers: bool,
    default: std::time::Duration,
) -> Result<u64, InputError> {
    match us {
        Some(_) if !workers => Err(host_refusal(name)),
        Some(us) if !(100..=100_000).contains(&us) => Err(InputError(format!(
            "{name} = {us}: give 100..=100000 (microseconds; the default is {})",
            default.as_micros()
        ))),
        Some(us) => Ok(us * 1_000),
        None => Ok(default.as_nanos() as u64),
    }
}

/// `--halt-park` or a file's `halt-park`: on or off.
pub fn halt_park(s: &str) -> Result<bool, String> {
    match s.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: give on or off")),
    }
}

/// A period of 100..=100000 µs given as text (`vmm run --tick-us`,
/// `--halt-poll-us`, or their keys in a run file).
pub fn period_micros(s: &str) -> Result<std::time::Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(us) if (100..=100_000).contains(&us) => Ok(std::time::Duration::from_micros(us)),
        _ => Err(format!("{s:?}: give 100..=100000 (microseconds)")),
    }
}

/// The scheduler's tick period, ns, from `--tick-us` or a file's
/// `tick_us`: 1 ms by default; 100 µs to 100 ms; refused with the host
/// executor (`workers` false), which runs no vcpu_sched.
pub fn tick(us: Option<u64>, workers: bool) -> Result<u64, InputError> {
    workers_period("tick_us", us, workers, vmm_machine::vcpu_body::DEFAULT_TICK)
}

/// The halt poller's period, ns, from `--halt-poll-us` or a file's
/// `halt_poll_us`: 1 ms by default; 100 µs to 100 ms; refused with the
/// host executor (`workers` false).
pub fn halt_poll(us: Option<u64>, workers: bool) -> Result<u64, InputError> {
    workers_period(
        "halt_poll_us",
        us,
        workers,
        vmm_machine::vcpu_body::DEFAULT_HALT_POLL,
    )
}

/// `--fair-slice-scaling` and the config file's `fair_slice_scaling`.
pub fn slice_scaling(s: &str) -> Result<vcpu_sched::SliceScaling, String> {
    s.trim().parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_lists() {
        assert!(mitigation_sets("seeds").unwrap().len() > 2);
        assert_eq!(mitigation_sets("none;all").unwrap().len(), 2);
        assert!(mitigation_sets(";;").is_err());
        assert!(mitigation_sets("bogus").is_err());
    }

    #[test]
    fn durations() {
        assert!(bench_duration("0.3").is_ok());
        assert!(bench_duration("1ms")
            .unwrap_err()
            .contains("at least 100ms"));
        assert!(bench_duration("2h").unwrap_err().contains("limit of 1h"));
        assert!(timeout("0.3").is_ok());
        assert!(timeout("8d").is_err());
        assert!(timeout("200h").unwrap_err().contains("168h"));
    }

    #[test]
    fn numbers() {
        assert!(vm_count("0").is_err());
        assert!(vm_count("1024").is_ok());
        assert!(check_vcpus(4, 1024).unwrap_err().0.contains("at most 256"));
        assert!(check_vcpus(8, 256).unwrap_err().0.contains("2048 vCPUs"));
        assert!(check_vcpus(usize::MAX, 2).is_err());
        assert!(check_vcpus(60, 8).is_ok());
    }

    #[test]
    fn placement_flags() {
        assert!(pin("").unwrap_err().contains("empty"));
        assert!(pin("  ").is_err());
        assert!(pin("auto").is_ok());
        assert!(rt("").unwrap_err().contains("empty"));
        assert!(rt("fifo:100").unwrap_err().contains("1 to 99"));
        assert_eq!(rt("none").unwrap(), None);
        assert!(mitigations("").unwrap_err().contains("empty"));
        assert!(mitigations("bogus").is_err());
        assert!(mitigations("only:l2wake").is_ok());
    }

    #[test]
    fn vsock_options() {
        let v = vsock("cid=3,socket=/tmp/v.sock,iommu=off,id=vsock0,pci_segment=1").unwrap();
        assert_eq!((v.cid, v.pci_segment), (3, 1));
        assert_eq!(v.socket, std::path::Path::new("/tmp/v.sock"));
        assert!(vsock("socket=/a").unwrap_err().contains("no cid="));
        assert!(vsock("cid=3").unwrap_err().contains("no socket="));
        assert!(vsock("cid=x,socket=/a")
            .unwrap_err()
            .contains("not a number"));
        assert!(vsock("cid=3,socket=/a,iommu=on")
            .unwrap_err()
            .contains("IOMMU"));
        assert!(vsock("cid=3,socket=").unwrap_err().contains("empty"));
        assert!(vsock("cid=3,sock=/a").unwrap_err().contains("keys: cid"));
    }

    #[test]
    fn cloud_hypervisor_device_options() {
        assert_eq!(rng(""), Ok(0));
        assert_eq!(rng("pci_segment=2"), Ok(2));
        assert!(rng("segment=2").unwrap_err().contains("keys: pci_segment"));
        assert!(rng("pci_segment=x")
            .unwrap_err()
            .contains("not a segment number"));
        assert!(rng("pci_segment=1,pci_segment=2")
            .unwrap_err()
            .contains("twice"));
        assert_eq!(platform("num_pci_segments=4"), Ok(4));
        assert!(platform("num_pci_segments")
            .unwrap_err()
            .contains("key=value"));
        let n = net("tap=tap0,mac=52:54:00:12:34:56,num_queues=4,pci_segment=1").unwrap();
        assert_eq!(n.tap, vmm_machine::devices::TapSource::Name("tap0".into()));
        assert_eq!(n.mac.unwrap().to_string(), "52:54:00:12:34:56");
        assert_eq!((n.num_queues, n.pci_segment, n.pairs()), (Some(4), 1, 2));
        let n = net("fd=[3,4],mac=02:00:00:00:00:01").unwrap();
        assert_eq!(n.tap, vmm_machine::devices::TapSource::Fds(vec![3, 4]));
        assert_eq!(n.pairs(), 2);
        assert!(net("mac=52:54:00:12:34:56")
            .unwrap_err()
            .contains("no tap=NAME"));
        assert!(net("tap=a,fd=3").unwrap_err().contains("both given"));
        assert!(net("fd=x").unwrap_err().contains("fd=[3,4]"));
        assert!(net("tap=a,mac=52:54:00:12:34")
            .unwrap_err()
            .contains("six hex bytes"));
        assert!(net("tap=a,mac=01:00:5e:00:00:01")
            .unwrap_err()
            .contains("multicast"));
        assert!(net("tap=a,num_queues=two")
            .unwrap_err()
            .contains("num_queues"));
        let f = fs("tag=kataShared,socket=/run/v.sock,num_queues=2,queue_size=512,pci_segment=1")
            .unwrap();
        assert_eq!(
            (f.tag.as_str(), f.socket.to_str(), f.num_queues),
            ("kataShared", Some("/run/v.sock"), 2)
        );
        assert_eq!((f.queue_size, f.pci_segment), (512, 1));
        let f = fs("tag=t,socket=s").unwrap();
        assert_eq!((f.num_queues, f.queue_size, f.pci_segment), (1, 1024, 0));
        assert!(fs("socket=s").unwrap_err().contains("no tag=TAG"));
        assert!(fs("tag=t").unwrap_err().contains("virtiofsd --socket-path"));
        assert!(fs("tag=t,socket=s,cache=none")
            .unwrap_err()
            .contains("unknown option"));
        assert!(fs("tag=t,socket=s,queue_size=big")
            .unwrap_err()
            .contains("queue_size"));
        let d = disk("path=a.img,readonly=on,num_queues=2,pci_segment=1").unwrap();
        assert_eq!(
            (d.path.to_str(), d.readonly, d.num_queues, d.pci_segment),
            (Some("a.img"), true, Some(2), 1)
        );
        assert!(disk("readonly=on").unwrap_err().contains("no path=IMG"));
        assert!(disk("path=a,readonly=yes")
            .unwrap_err()
            .contains("on or off"));
        assert!(disk("path=a,num_queues=x")
            .unwrap_err()
            .contains("num_queues"));
        let d = disk("path=a,engine=io_uring").unwrap();
        assert_eq!(d.engine, vmm_machine::devices::BlockEngine::IoUring);
        assert_eq!(disk("path=a").unwrap().engine, Default::default());
        let e = disk("path=a,engine=aio").unwrap_err();
        assert!(
            e.contains("\"aio\"") && e.contains("sync, pool, io_uring"),
            "{e}"
        );
        assert!(disk("path=a,queues=2")
            .unwrap_err()
            .contains("unknown option"));
    }

    #[test]
    fn fair_slices_default_check_and_refuse_the_host_executor() {
        use vcpu_sched::SliceScaling;
        let d = vcpu_sched::SchedConfig::default();
        let pair = |f: FairSlices| (f.latency_ns, f.min_granularity_ns);
        let all = fair_slices(None, None, None, true).unwrap();
        assert_eq!(pair(all), (d.fair_latency_ns, d.fair_min_granularity_ns));
        assert_eq!(all.scaling, SliceScaling::Log);
        assert_eq!(
            fair_slices(None, None, None, false).unwrap().latency_ns,
            d.fair_latency_ns
        );
        let given = fair_slices(Some(12_000), Some(1_500), Some(SliceScaling::None), true).unwrap();
        assert_eq!(pair(given), (12_000_000, 1_500_000));
        assert_eq!(given.scaling, SliceScaling::None);
        let msg = |r: Result<FairSlices, InputError>| r.unwrap_err().to_string();
        assert!(msg(fair_slices(Some(12_000), None, None, false))
            .starts_with("fair_latency_us: a setting of vcpu_sched"));
        assert!(msg(fair_slices(None, None, Some(SliceScaling::Log), false))
            .starts_with("fair_slice_scaling: a setting of vcpu_sched"));
        assert!(msg(fair_slices(None, Some(50), None, true)).contains("give 100..=1000000"));
        assert!(msg(fair_slices(Some(1_000), Some(2_000), None, true))
            .contains("exceeds fair_latency_us = 1000"));
        // the default period (6 ms) bounds a granularity given alone
        assert!(fair_slices(None, Some(7_000), None, true).is_err());
        assert_eq!(slice_scaling(" none"), Ok(SliceScaling::None));
        assert_eq!(tick(None, true).unwrap(), 1_000_000);
        assert_eq!(tick(None, false).unwrap(), 1_000_000);
        assert_eq!(tick(Some(4_000), true).unwrap(), 4_000_000);
        let e = |r: Result<u64, InputError>| r.unwrap_err().to_string();
        assert!(e(tick(Some(4_000), false)).starts_with("tick_us: a setting of vcpu_sched"));
        assert!(e(tick(Some(50), true)).contains("give 100..=100000"));
        assert_eq!(halt_poll(None, true).unwrap(), 1_000_000);
        assert_eq!(halt_poll(Some(2_000), true).unwrap(), 2_000_000);
        assert!(e(halt_poll(Some(2_000), false)).starts_with("halt_poll_us: a setting of"));
        assert!(e(halt_poll(Some(200_000), true)).contains("the default is 1000)"));
        assert!(slice_scaling("linear").unwrap_err().contains("give log"));
    }
}
