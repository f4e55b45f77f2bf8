//! `vmm bench WORKLOAD ...`: argument parsing, progress bar, tables and
//! JSON for [`vmm_lab::run`] and [`vmm_lab::compare`], and `vmm bench blk
//! --integrity` ([`vmm_lab::integrity`]): a line per completed flush on
//! stdout, the images verified at the end.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use vcpu_sched::Mitigations;

use super::args::{self, ignored, mitigation_sets, out, outln, progress_bar, InputError};
pub use super::bench_report::render_report;
use vmm_lab::{
    compare, integrity, run as run_bench, BenchOptions, BlkOptions, BusyBalance, CompareOptions,
    IntegrityOptions, IoCpus, Kicks, NetOptions, RtPull, TimerAdvance, Workload,
};
use vmm_machine::devices::{BlockEngine, UnknownEngine};
use vmm_machine::micro::net::NetMode;
use vmm_machine::vcpu_body::ExecutorKind;

/// `vmm bench WORKLOAD --topology SPEC --vms N --vcpus M --duration D ...`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// cyclic, messaging, runq, transcode, pingpong, blk (virtio-blk at a queue
    /// depth; needs --disk) or net (virtio-net on taps; needs --tap).
    pub workload: String,
    /// Scheduler topology: `host` (the real CPUs), a preset (gnr-2s,
    /// genoa-2s, ...) or an hwloc synthetic string, emulated onto the CPUs
    /// this process may use.
    #[arg(long, short, default_value = "host", value_name = "SPEC")]
    pub topology: String,
    /// Micro-guest VMs (each one a task group). At most 1024 vCPUs in
    /// all (--vms x --vcpus). Default 8; blk: one per --disk; net: one
    /// per --tap.
    #[arg(long, value_name = "N", value_parser = args::vm_count,
          allow_negative_numbers = true)]
    pub vms: Option<usize>,
    /// vCPUs per VM (1..=256). Default 8; blk and net: 1 (the only
    /// choice).
    #[arg(long, value_name = "M", value_parser = args::vm_count,
          allow_negative_numbers = true)]
    pub vcpus: Option<usize>,
    /// Measured time per run, after a warm-up: 2s, 500ms, 1m or seconds
    /// (0.3); 100ms to 1h.
    #[arg(long, short, default_value = "2s", value_name = "DURATION",
          value_parser = args::bench_duration, allow_hyphen_values = true)]
    pub duration: Duration,
    /// One mitigation set: none, all (default), only:FIX[,FIX..],
    /// all-but:FIX[,..]. Not with --executor host (no scheduler).
    #[arg(long, short, value_name = "SET", value_parser = args::mitigations)]
    pub mitigations: Option<Mitigations>,
    /// `seeds` (baseline, each fix alone, all) or `SET;SET;..` (the first
    /// is the baseline); the host 1:1 baseline is added as a last row.
    #[arg(long, value_name = "seeds|SET;SET..", conflicts_with = "mitigations")]
    pub compare: Option<String>,
    /// workers (M:N, a worker per CPU runs vCPU fds), threads (a thread per
    /// vCPU hands run slots over) or host (1:1 threads, the host kernel
    /// schedules).
    #[arg(long, default_value = "workers", value_name = "KIND")]
    pub executor: String,
    /// Repetitions of every set with --compare (1..=100, default 3).
    #[arg(long, value_name = "R", value_parser = args::reps,
          allow_negative_numbers = true)]
    pub reps: Option<usize>,
    /// Compare the executors instead of mitigation sets: the chosen
    /// --mitigations set (default all) on the --executor (the baseline and
    /// its A/A row), on the other scheduler executor, and the host 1:1
    /// baseline; the same repetitions, interleaved.
    #[arg(long, conflicts_with = "compare")]
    pub compare_executors: bool,
    /// Leave the host 1:1 baseline out of a --compare.
    #[arg(long)]
    pub no_host: bool,
    /// Run a comparison estimated over 2 h (otherwise refused as a
    /// likely slip in --duration, --reps or --compare).
    #[arg(long)]
    pub long: bool,
    /// Invariant checker on; a violation, a failed VM or a vCPU without
    /// progress fails the run (exit 1).
    #[arg(long)]
    pub check: bool,
    /// Compute per operation in microseconds (1..=1000000; default per
    /// workload: cyclic 5, messaging 1, runq 20, transcode 500, pingpong
    /// 5).
    #[arg(long, value_name = "US", value_parser = args::burst_us,
          allow_negative_numbers = true)]
    pub burst_us: Option<u64>,
    /// cyclic only: timer period in microseconds (1..=1000000).
    #[arg(long, value_name = "US", value_parser = args::period_us,
          allow_negative_numbers = true)]
    pub period_us: Option<u64>,
    /// cyclic and transcode only: RT priority of their vCPUs (1..=99,
    /// default 99).
    #[arg(long, value_name = "PRIO", value_parser = args::prio,
          allow_negative_numbers = true)]
    pub prio: Option<u8>,
    /// cyclic and transcode only: keep the executor's threads
    /// (workers, or the threads executor's vCPU and idle threads, and the
    /// clock) SCHED_OTHER on the host instead of SCHED_FIFO (the host
    /// baseline's RT vCPU threads are SCHED_FIFO either way).
    #[arg(long)]
    pub no_host_rt: bool,
    /// Print one line per vCPU (run delay, wake-to-run, migrations, time
    /// per state) after the summary.
    #[arg(long)]
    pub per_vcpu: bool,
    /// Time each stage of every wakeup in the window (exit or timer due ->
    /// the waker's call returned -> picked by the executor -> KVM_RUN
    /// entered, on the monotonic clock) and print p50/p99 per stage. A
    /// single run only
    #[arg(long)]
    pub breakdown: bool,
    /// Give every vCPU a CPU of its own (vCPU i of VM v on logical CPU
    /// v*vcpus+i), on every executor and the host 1:1 row: one vCPU per
    /// CPU, pinned. The vCPUs must fit the topology's CPUs
    #[arg(long)]
    pub pin: bool,
    /// How a fair wakeup queued on a busy CPU's wake list kicks it: lazy
    /// (only if it would preempt; the default) or eager (always, the
    /// protocol before lazy kicks). Scheduler executors only
    #[arg(long, value_name = "PROTOCOL", value_parser = kicks)]
    pub kicks: Option<Kicks>,
    /// Compare the kick protocols instead of mitigation sets: eager (the
    /// baseline, with its A/A row), then lazy; one mitigation set on one
    /// scheduler executor, no host row; --reps repetitions, interleaved
    #[arg(long, conflicts_with_all = ["compare", "compare_executors", "compare_engines", "compare_io_cpus", "kicks"])]
    pub compare_kicks: bool,
    /// Credit a woken fair vCPU the time it slept, up to half the fair
    /// latency (off by default; for its A/B: scripts/ab-bench.sh).
    /// Scheduler executors only
    #[arg(long)]
    pub sleeper_credit: bool,
    /// A woken fair vCPU never preempts a running fair vCPU: it waits
    /// for that one's slice to end (a tick) or for it to block, and with
    /// --sleeper-credit then goes first (off by default; for its A/B:
    /// scripts/ab-bench.sh). Scheduler executors only
    #[arg(long)]
    pub no_wakeup_preempt: bool,
    /// Move a running fair vCPU's slice end in as vCPUs join its
    /// runqueue, instead of sizing the slice once when it starts (off by
    /// default; for its A/B: scripts/ab-bench.sh). Scheduler executors
    /// only
    #[arg(long)]
    pub slices_follow_load: bool,
    /// The fair period a slice is cut from, shared by weight among a
    /// CPU's runnable fair vCPUs, before --fair-slice-scaling (default
    /// 6000: Linux's sched_latency before it scales it). 100..=1000000.
    /// Scheduler executors only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub fair_latency_us: Option<u64>,
    /// The shortest fair slice, before --fair-slice-scaling (default 750:
    /// Linux's sched_min_granularity before it scales it), at most
    /// --fair-latency-us. 100..=1000000. Scheduler executors only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub fair_min_granularity_us: Option<u64>,
    /// How the fair bounds (latency, min granularity, wakeup granularity)
    /// grow with the topology's CPUs: log, Linux's default, multiplies
    /// them by 1 + log2(min(CPUs, 8)) (2x on 2 CPUs, 4x from 8 on); none
    /// keeps them as given. The report's fair_slice_ns holds the result.
    /// Scheduler executors only
    #[arg(long, value_name = "log|none", value_parser = args::slice_scaling)]
    pub fair_slice_scaling: Option<vcpu_sched::SliceScaling>,
    /// The scheduler's tick period: how often each CPU's slice end, the
    /// wakeups deferred to a busy CPU and the balances are looked at
    /// (default 1000: 1 ms). 100..=100000. The report's tick_ns holds it.
    /// Scheduler executors only
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(100..=100_000))]
    pub tick_us: Option<u64>,
    /// Compare the fair bounds unscaled (none: the baseline, with its A/A
    /// row) and scaled (log); one mitigation set on one scheduler
    /// executor, no host row; --reps repetitions, interleaved
    #[arg(long, conflicts_with_all = ["compare", "compare_executors", "compare_engines", "compare_io_cpus", "compare_kicks", "compare_rt_pull", "compare_timer_advance", "compare_busy_balance", "fair_slice_scaling"])]
    pub compare_fair_slice_scaling: bool,
    /// Whether a busy CPU with fair vCPUs waiting hands one to a busy CPU
    /// with at least two more CPU-bound ones fewer, once that has lasted
    /// 100 ms (on; `vmm serve`'s default), or vCPUs move only into idle
    /// CPUs (off, the default here). Scheduler executors only
    #[arg(long, value_name = "on|off", value_parser = busy_balance)]
    pub busy_balance: Option<BusyBalance>,
    /// Compare the busy balance off (the baseline, with its A/A row) and
    /// on; one mitigation set on one scheduler executor, no host row;
    /// --reps repetitions, interleaved
    #[arg(long, conflicts_with_all = ["compare", "compare_executors", "compare_engines", "compare_io_cpus", "compare_kicks", "compare_rt_pull", "compare_timer_advance", "busy_balance"])]
    pub compare_busy_balance: bool,
    /// How an RT pull treats a source CPU whose runqueue lock another
    /// thread holds: bounded (pass it by and ask it to push; the default)
    /// or wait (wait for the lock, the protocol before bounded pulls).
    /// Scheduler executors only
    #[arg(long, value_name = "PROTOCOL", value_parser = rt_pull)]
    pub rt_pull: Option<RtPull>,
    /// Compare the RT pull protocols instead of mitigation sets: wait (the
    /// baseline, with its A/A row), then bounded; one mitigation set on
    /// one scheduler executor, no host row; --reps repetitions, interleaved
    #[arg(long, conflicts_with_all = ["compare", "compare_executors", "compare_engines", "compare_io_cpus", "compare_kicks", "rt_pull"])]
    pub compare_rt_pull: bool,
    /// Whether an idle worker parks ahead of a vCPU's sleep timer and
    /// polls the rest of the way (on, the default: the timer advance,
    /// learnt from how late its parks return; only where every worker has
    /// a host CPU of its own) or parks until the timer is due (off).
    /// Workers executor only
    #[arg(long, value_name = "on|off", value_parser = timer_advance)]
    pub timer_advance: Option<TimerAdvance>,
    /// Compare the timer advance off (the baseline, with its A/A row) and
    /// on; one mitigation set on the workers executor, no host row;
    /// --reps repetitions, interleaved
    #[arg(long, conflicts_with_all = ["compare", "compare_executors", "compare_engines", "compare_io_cpus", "compare_kicks", "compare_rt_pull", "timer_advance"])]
    pub compare_timer_advance: bool,
    /// blk and net only: where each VM's device I/O threads run: same
    /// (the host CPU its vCPU is pinned to), other (another host CPU: VM
    /// v's on CPU v+1) or any (not placed; the default). same and other
    /// need --pin and --topology host.
    #[arg(long, value_name = "WHERE", value_parser = io_cpus)]
    pub io_cpus: Option<IoCpus>,
    /// blk and net only: compare I/O thread placements, e.g.
    /// `any,same,other`: the first is the baseline and gets the A/A row;
    /// one mitigation set on one executor (host included), no host row;
    /// --reps repetitions, interleaved. same and other need --pin and
    /// --topology host.
    #[arg(long, value_name = "P,P..", value_parser = io_cpus_list,
          conflicts_with_all = ["compare", "compare_executors", "compare_engines", "io_cpus"])]
    pub compare_io_cpus: Option<IoCpusList>,
    /// Also write the full result as JSON here: a new file (one that
    /// exists is refused, never replaced; checked before the run starts).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// blk only: a raw image (`IMG` or `path=IMG`) for the VMs'
    /// virtio-blk; repeat it for more (VM v uses image v mod N). Opened
    /// read-only, shared, unless --write or --integrity, which overwrite
    /// it and need one per VM.
    #[arg(long, value_name = "IMG")]
    pub disk: Vec<String>,
    /// blk only: requests in flight per VM (1..=64; default 1, with
    /// --integrity 8).
    #[arg(long, value_name = "N", value_parser = qd, allow_negative_numbers = true)]
    pub qd: Option<u16>,
    /// blk only: random 4 KiB writes instead of reads.
    #[arg(long)]
    pub write: bool,
    /// blk only: instead of IOPS, the integrity writer: each VM writes
    /// generations of 4 KiB patterns over its --disk with a flush after
    /// each, prints `vmN flushed generation G` when a flush has completed,
    /// and its image is verified when it stops (after --gens, or
    /// --duration).
    #[arg(long)]
    pub integrity: bool,
    /// --integrity only: generations per VM, then a read-back in the guest
    /// (default: until --duration has passed).
    #[arg(long, value_name = "N", value_parser = gens, allow_negative_numbers = true)]
    pub gens: Option<u64>,
    /// --integrity only: writes per generation (1..=1048576, default 32).
    #[arg(long, value_name = "N", value_parser = per_gen, allow_negative_numbers = true)]
    pub per_gen: Option<u32>,
    /// net only: an existing tap (up) for a VM's virtio-net; repeat it,
    /// one per VM (VM v on the v-th). Make them in a network namespace of
    /// your own: ip tuntap add NAME mode tap; ip link set NAME up.
    #[arg(long, value_name = "NAME")]
    pub tap: Vec<String>,
    /// net only: the taps are PREFIX0, PREFIX1, .. (one per --vms).
    #[arg(long, value_name = "PREFIX", conflicts_with = "tap")]
    pub tap_prefix: Option<String>,
    /// net only: what the guests do: tx (send minimal UDP frames, the
    /// host counts them), rx (count frames the host injects) or echo
    /// (send each frame back; the host times round trips and checks
    /// every byte). Default echo.
    #[arg(long, value_name = "MODE", value_parser = net_mode)]
    pub mode: Option<NetMode>,
    /// net only: Ethernet bytes of the frames the host sends (rx, echo;
    /// 50..=1514, default 60).
    #[arg(long, value_name = "N", value_parser = frame_bytes, allow_negative_numbers = true)]
    pub frame_bytes: Option<usize>,
    /// blk only: who executes the device's reads, writes and flushes:
    /// sync (the device's worker), pool (a few host threads) or io_uring
    /// (default: the VMM's default engine).
    #[arg(long, value_name = "ENGINE", value_parser = engine)]
    pub engine: Option<BlockEngine>,
    /// blk only: compare engines instead of mitigation sets, e.g.
    /// `sync,pool,io_uring`: the first is the baseline and gets the A/A
    /// row; one mitigation set on one executor (host included), no host
    /// row; --reps repetitions, interleaved.
    #[arg(long, value_name = "E,E..", value_parser = engine_list,
          conflicts_with_all = ["compare", "compare_executors", "engine"])]
    pub compare_engines: Option<EngineList>,
}

fn net_mode(s: &str) -> std::result::Result<NetMode, String> {
    s.parse()
        .map_err(|e: vmm_machine::micro::MicroError| e.to_string())
}

fn frame_bytes(s: &str) -> std::result::Result<usize, String> {
    let r = vmm_lab::net::FRAME_BYTES;
    match s.trim().parse::<usize>() {
        Ok(v) if r.contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: give {} to {} bytes", r.start(), r.end())),
    }
}

/// `--compare-engines`' list (a type of its own: clap takes a bare `Vec`
/// for a repeated flag).
#[derive(Clone, Debug)]
pub struct EngineList(pub Vec<BlockEngine>);

fn engine(s: &str) -> std::result::Result<BlockEngine, String> {
    s.trim().parse().map_err(|e: UnknownEngine| e.to_string())
}

fn engine_list(s: &str) -> std::result::Result<EngineList, String> {
    let v = s
        .split(',')
        .map(engine)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if v.len() < 2 {
        return Err(format!(
            "{s:?}: give two engines or more, e.g. sync,pool,io_uring"
        ));
    }
    Ok(EngineList(v))
}

fn kicks(s: &str) -> std::result::Result<Kicks, String> {
    match s.trim() {
        "lazy" => Ok(Kicks::Lazy),
        "eager" => Ok(Kicks::Eager),
        _ => Err(format!("{s:?}: give lazy or eager")),
    }
}

fn rt_pull(s: &str) -> std::result::Result<RtPull, String> {
    s.trim().parse()
}

fn timer_advance(s: &str) -> std::result::Result<TimerAdvance, String> {
    s.trim().parse()
}

fn busy_balance(s: &str) -> std::result::Result<BusyBalance, String> {
    s.trim().parse()
}

fn io_cpus(s: &str) -> std::result::Result<IoCpus, String> {
    s.parse().map_err(|e: vmm_lab::BenchError| e.to_string())
}

/// `--compare-io-cpus`' list.
#[derive(Clone, Debug)]
pub struct IoCpusList(pub Vec<IoCpus>);

fn io_cpus_list(s: &str) -> std::result::Result<IoCpusList, String> {
    let v = s
        .split(',')
        .map(io_cpus)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if v.len() < 2 {
        return Err(format!(
            "{s:?}: give two placements or more, e.g. any,same,other"
        ));
    }
    Ok(IoCpusList(v))
}

fn qd(s: &str) -> std::result::Result<u16, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number; give 1 to 64"))?;
    match u16::try_from(v) {
        Ok(q) if (1..=64).contains(&q) => Ok(q),
        _ => Err(format!("{v}: give 1 to 64 requests in flight")),
    }
}

fn gens(s: &str) -> std::result::Result<u64, String> {
    let max = vmm_machine::micro::blk::MAX_GENS;
    match s.trim().parse::<u64>() {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: give 1 to {max} generations")),
    }
}

fn per_gen(s: &str) -> std::result::Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(v) if (1..=1 << 20).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: give 1 to 1048576 writes per generation")),
    }
}

/// `--disk IMG` or `--disk path=IMG`.
fn disk_path(s: &str) -> Result<PathBuf> {
    let p = s.strip_prefix("path=").unwrap_or(s);
    if p.is_empty() || p.contains(",") {
        return Err(InputError(format!(
            "--disk {s:?}: give the image's path (IMG or path=IMG; no other options here)"
        ))
        .into());
    }
    Ok(PathBuf::from(p))
}

/// Flags the chosen workload, executor or mode would ignore are errors.
fn check_applicable(a: &BenchArgs, workload: Workload, executor: ExecutorKind) -> Result<()> {
    let rt = matches!(workload, Workload::Cyclic | Workload::Transcode);
    let here = format!("the {} workload", workload.name());
    check_blk_flags(a, workload, &here)?;
    check_net_flags(a, workload, &here)?;
    if !matches!(workload, Workload::Blk | Workload::Net) {
        if a.io_cpus.is_some() {
            return Err(ignored("--io-cpus", "the blk and net workloads", &here).into());
        }
        if a.compare_io_cpus.is_some() {
            return Err(ignored("--compare-io-cpus", "the blk and net workloads", &here).into());
        }
    }
    if a.period_us.is_some() && workload != Workload::Cyclic {
        return Err(ignored("--period-us", "cyclic", &here).into());
    }
    if a.prio.is_some() && !rt {
        return Err(ignored("--prio", "cyclic and transcode", &here).into());
    }
    if a.no_host_rt && !rt {
        return Err(ignored("--no-host-rt", "cyclic and transcode", &here).into());
    }
    if a.compare_executors && executor == ExecutorKind::Host {
        return Err(ignored(
            "--compare-executors",
            "the workers and threads executors (the host 1:1 row is added by itself)",
            "--executor host",
        )
        .into());
    }
    if (a.kicks.is_some()
        || a.compare_kicks
        || a.sleeper_credit
        || a.no_wakeup_preempt
        || a.slices_follow_load
        || a.busy_balance.is_some()
        || a.compare_busy_balance
        || a.rt_pull.is_some()
        || a.compare_rt_pull
        || a.compare_fair_slice_scaling)
        && executor == ExecutorKind::Host
    {
        return Err(ignored(
            if a.compare_kicks {
                "--compare-kicks"
            } else if a.compare_fair_slice_scaling {
                "--compare-fair-slice-scaling"
            } else if a.compare_rt_pull {
                "--compare-rt-pull"
            } else if a.kicks.is_some() {
                "--kicks"
            } else if a.sleeper_credit {
                "--sleeper-credit"
            } else if a.no_wakeup_preempt {
                "--no-wakeup-preempt"
            } else if a.slices_follow_load {
                "--slices-follow-load"
            } else if a.busy_balance.is_some() {
                "--busy-balance"
            } else if a.compare_busy_balance {
                "--compare-busy-balance"
            } else {
                "--rt-pull"
            },
            "the workers and threads executors",
            "--executor host (the host kernel schedules)",
        )
        .into());
    }
    args::fair_slices(
        a.fair_latency_us,
        a.fair_min_granularity_us,
        a.fair_slice_scaling,
        executor != ExecutorKind::Host,
    )?;
    args::tick(a.tick_us, executor != ExecutorKind::Host)?;
    if (a.timer_advance.is_some() || a.compare_timer_advance) && executor != ExecutorKind::Workers {
        return Err(ignored(
            if a.compare_timer_advance {
                "--compare-timer-advance"
            } else {
                "--timer-advance"
            },
            "the workers executor",
            &format!("--executor {executor}"),
        )
        .into());
    }
    if a.compare.is_none()
        && !a.compare_executors
        && a.compare_engines.is_none()
        && a.compare_io_cpus.is_none()
        && !a.compare_kicks
        && !a.compare_rt_pull
        && !a.compare_timer_advance
        && !a.compare_busy_balance
        && !a.compare_fair_slice_scaling
    {
        if a.reps.is_some() {
            return Err(ignored("--reps", "--compare", "a single run").into());
        }
        if a.long {
            return Err(ignored("--long", "a comparison", "a single run").into());
        }
        if a.no_host {
            return Err(ignored("--no-host", "--compare", "a single run").into());
        }
        if a.mitigations.is_some() && executor == ExecutorKind::Host {
            return Err(ignored(
                "--mitigations",
                "the workers and threads executors",
                "--executor host (the host kernel schedules)",
            )
            .into());
        }
    } else if a.per_vcpu {
        return Err(ignored("--per-vcpu", "a single run", "a comparison").into());
    } else if a.breakdown {
        return Err(ignored("--breakdown", "a single run", "a comparison").into());
    }
    Ok(())
}

/// blk's own flags on other workloads, and the seeds' flags on blk.
fn check_blk_flags(a: &BenchArgs, workload: Workload, here: &str) -> Result<()> {
    if workload != Workload::Blk {
        for (set, flag) in [
            (!a.disk.is_empty(), "--disk"),
            (a.qd.is_some(), "--qd"),
            (a.write, "--write"),
            (a.integrity, "--integrity"),
            (a.gens.is_some(), "--gens"),
            (a.per_gen.is_some(), "--per-gen"),
            (a.engine.is_some(), "--engine"),
            (a.compare_engines.is_some(), "--compare-engines"),
        ] {
            if set {
                return Err(ignored(flag, "the blk workload", here).into());
            }
        }
        return Ok(());
    }
    if a.burst_us.is_some() {
        return Err(ignored("--burst-us", "the seeds' workloads", here).into());
    }
    if a.breakdown && a.integrity {
        return Err(ignored("--breakdown", "a blk IOPS run", "--integrity").into());
    }
    if !a.integrity {
        if a.gens.is_some() {
            return Err(ignored("--gens", "--integrity", "an IOPS run").into());
        }
        if a.per_gen.is_some() {
            return Err(ignored("--per-gen", "--integrity", "an IOPS run").into());
        }
        return Ok(());
    }
    for (set, flag) in [
        (a.write, "--write"),
        (a.compare.is_some(), "--compare"),
        (a.compare_executors, "--compare-executors"),
        (a.compare_engines.is_some(), "--compare-engines"),
        (a.compare_io_cpus.is_some(), "--compare-io-cpus"),
        (a.io_cpus.is_some(), "--io-cpus"),
        (a.pin, "--pin"),
        (a.json.is_some(), "--json"),
        (a.per_vcpu, "--per-vcpu"),
    ] {
        if set {
            return Err(ignored(flag, "a blk IOPS run", "--integrity").into());
        }
    }
    Ok(())
}

/// net's own flags on other workloads, and the seeds' flags on net.
fn check_net_flags(a: &BenchArgs, workload: Workload, here: &str) -> Result<()> {
    if workload != Workload::Net {
        for (set, flag) in [
            (!a.tap.is_empty(), "--tap"),
            (a.tap_prefix.is_some(), "--tap-prefix"),
            (a.mode.is_some(), "--mode"),
            (a.frame_bytes.is_some(), "--frame-bytes"),
        ] {
            if set {
                return Err(ignored(flag, "the net workload", here).into());
            }
        }
        return Ok(());
    }
    if a.burst_us.is_some() {
        return Err(ignored("--burst-us", "the seeds' workloads", here).into());
    }
    if a.frame_bytes.is_some() && a.mode == Some(NetMode::Tx) {
        return Err(ignored("--frame-bytes", "--mode rx and echo", "--mode tx").into());
    }
    Ok(())
}

/// net's taps: the --tap list, or PREFIX0.. for `vms` VMs.
fn net_taps(a: &BenchArgs, vms: usize) -> Vec<String> {
    match &a.tap_prefix {
        Some(p) => (0..vms).map(|v| format!("{p}{v}")).collect(),
        None => a.tap.clone(),
    }
}

/// The run's options from the flags.
fn bench_options(
    a: &BenchArgs,
    (workload, executor): (Workload, ExecutorKind),
    disks: Vec<std::path::PathBuf>,
    (vms, vcpus): (usize, usize),
) -> BenchOptions {
    let mut o = BenchOptions::new(workload, &a.topology, vms, vcpus);
    o.blk = BlkOptions {
        disks,
        qd: a.qd.unwrap_or(1),
        write: a.write,
        engine: a.engine.unwrap_or_default(),
    };
    o.net = NetOptions {
        taps: net_taps(a, vms),
        mode: a.mode.unwrap_or(NetMode::Echo),
        frame_bytes: a.frame_bytes.unwrap_or(60),
    };
    o.duration = a.duration;
    o.executor = executor;
    o.check = a.check;
    o.burst_us = a.burst_us;
    o.period_us = a.period_us;
    o.prio = a.prio.unwrap_or(vcpu_sched::workload::defs::RT_PRIO);
    o.host_rt = !a.no_host_rt;
    o.breakdown = a.breakdown;
    o.pin = a.pin;
    o.kicks = a.kicks.unwrap_or_default();
    o.sleeper_credit = a.sleeper_credit;
    o.no_wakeup_preempt = a.no_wakeup_preempt;
    o.slices_follow_load = a.slices_follow_load;
    // checked by check_applicable (fair_slices)
    o.fair_latency_ns = a.fair_latency_us.map(|us| us * 1_000);
    o.fair_min_granularity_ns = a.fair_min_granularity_us.map(|us| us * 1_000);
    o.fair_slice_scaling = a.fair_slice_scaling.unwrap_or_default();
    // checked by check_applicable (tick)
    o.tick_ns = a.tick_us.map(|us| us * 1_000);
    o.busy_balance = a.busy_balance == Some(BusyBalance::On);
    o.rt_pull = a.rt_pull.unwrap_or_default();
    o.timer_advance = a.timer_advance.unwrap_or_default();
    o.io_cpus = a.io_cpus.unwrap_or_default();
    o
}

/// A comparison's mitigation sets and other executors, `None` for a
/// single run; `axis`: the values of an engine or I/O placement
/// comparison.
type CompareList = Option<(Vec<Mitigations>, Vec<ExecutorKind>)>;

fn compare_list(a: &BenchArgs, executor: ExecutorKind, axis: usize) -> Result<CompareList> {
    let set = || vec![a.mitigations.unwrap_or_else(Mitigations::all)];
    Ok(match (&a.compare, a.compare_executors) {
        (Some(list), _) => Some((mitigation_sets(list)?, Vec::new())),
        (None, false) if axis > 0 => Some((set(), Vec::new())),
        (None, true) => {
            let other = match executor {
                ExecutorKind::Workers => ExecutorKind::Threads,
                _ => ExecutorKind::Workers,
            };
            Some((set(), vec![other]))
        }
        (None, false) => None,
    })
}

/// Runs `vmm bench`.
/// The values of the one option a comparison may run along instead of
/// mitigation sets (at most one list is not empty).
struct Axes {
    engines: Vec<BlockEngine>,
    io_cpus: Vec<IoCpus>,
    kicks: Vec<Kicks>,
    rt_pull: Vec<RtPull>,
    timer_advance: Vec<TimerAdvance>,
    busy_balance: Vec<BusyBalance>,
    fair_slice_scaling: Vec<vcpu_sched::SliceScaling>,
}

impl Axes {
    fn of(a: &BenchArgs) -> Self {
        Axes {
            engines: a.compare_engines.clone().map(|l| l.0).unwrap_or_default(),
            io_cpus: a.compare_io_cpus.clone().map(|l| l.0).unwrap_or_default(),
            kicks: if a.compare_kicks {
                vec![Kicks::Eager, Kicks::Lazy]
            } else {
                Vec::new()
            },
            rt_pull: if a.compare_rt_pull {
                vec![RtPull::Wait, RtPull::Bounded]
            } else {
                Vec::new()
            },
            timer_advance: if a.compare_timer_advance {
                vec![TimerAdvance::Off, TimerAdvance::On]
            } else {
                Vec::new()
            },
            busy_balance: if a.compare_busy_balance {
                vec![BusyBalance::Off, BusyBalance::On]
            } else {
                Vec::new()
            },
            fair_slice_scaling: if a.compare_fair_slice_scaling {
                vec![
                    vcpu_sched::SliceScaling::None,
                    vcpu_sched::SliceScaling::Log,
                ]
            } else {
                Vec::new()
            },
        }
    }

    /// The values compared (0: no such axis).
    fn len(&self) -> usize {
        self.engines
            .len()
            .max(self.io_cpus.len())
            .max(self.kicks.len())
            .max(self.rt_pull.len())
            .max(self.timer_advance.len())
            .max(self.busy_balance.len())
            .max(self.fair_slice_scaling.len())
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    let workload: Workload = a.workload.parse().map_err(anyhow::Error::new)?;
    let executor: ExecutorKind = a.executor.parse().map_err(InputError)?;
    check_applicable(&a, workload, executor)?;
    let disks = a
        .disk
        .iter()
        .map(|d| disk_path(d))
        .collect::<Result<Vec<_>>>()?;
    let (vms, vcpus) = match workload {
        Workload::Blk => (a.vms.unwrap_or(disks.len().max(1)), a.vcpus.unwrap_or(1)),
        Workload::Net => (a.vms.unwrap_or(a.tap.len().max(1)), a.vcpus.unwrap_or(1)),
        _ => (a.vms.unwrap_or(8), a.vcpus.unwrap_or(8)),
    };
    args::check_vcpus(vms, vcpus)?;
    if a.integrity {
        return run_integrity(&a, executor, disks, vms, vcpus);
    }
    if let Some(path) = &a.json {
        args::check_output_file("--json", path, false)?;
    }
    let mut o = bench_options(&a, (workload, executor), disks, (vms, vcpus));
    topology::load(&a.topology).with_context(|| format!("--topology {}", a.topology))?;
    let bar = progress_bar();
    let axes = Axes::of(&a);
    let axis = axes.len();
    let compare_list = compare_list(&a, executor, axis)?;
    if let Some((variants, executors)) = &compare_list {
        // every set, the A/A row, other executors and the host row, each
        // repetition; a run is its window plus warm-up and set-up
        let host = usize::from(!a.no_host && axis == 0);
        let rows = variants.len() + 1 + executors.len() + host + axis.saturating_sub(1);
        args::check_compare_work(rows * a.reps.unwrap_or(3), a.duration, a.long)?;
    }
    let json = match compare_list {
        Some((variants, executors)) => {
            let c = compare(
                &CompareOptions {
                    run: o,
                    variants,
                    repetitions: a.reps.unwrap_or(3),
                    host_baseline: !a.no_host && axis == 0,
                    executors,
                    engines: axes.engines,
                    io_cpus: axes.io_cpus,
                    kicks: axes.kicks,
                    rt_pull: axes.rt_pull,
                    timer_advance: axes.timer_advance,
                    busy_balance: axes.busy_balance,
                    fair_slice_scaling: axes.fair_slice_scaling,
                },
                &mut |p| {
                    let f = (p.done as f64 + p.run_fraction) / p.total.max(1) as f64;
                    bar.set_position((f * 1000.0) as u64);
                    bar.set_message(format!("{} ({}/{})", p.variant, p.done + 1, p.total));
                },
            )
            .map_err(anyhow::Error::new)?;
            bar.finish_and_clear();
            outln!(
                "{} VMs x {} vCPUs{}, scheduler rows on the {} executor",
                c.vms,
                c.vcpus,
                match (
                    a.pin,
                    c.table.rows.iter().any(|r| r.mitigations == "host 1:1")
                ) {
                    (true, true) => ", each pinned to a CPU of its own (host row too)",
                    (true, false) => ", each pinned to a CPU of its own",
                    _ => "",
                },
                c.executor
            );
            outln!("{}", c.table.render_paired_table());
            serde_json::to_string_pretty(&c).context("serialising the comparison")?
        }
        None => {
            o.mitigations = a.mitigations.unwrap_or_else(Mitigations::all);
            bar.set_message(format!("{} {}", executor, o.mitigations));
            let r = run_bench(&o, &mut |f| bar.set_position((f * 1000.0) as u64))
                .map_err(anyhow::Error::new)?;
            bar.finish_and_clear();
            out!("{}", render_report(&r, a.per_vcpu));
            serde_json::to_string_pretty(&r).context("serialising the report")?
        }
    };
    if let Some(path) = &a.json {
        args::write_new("--json", path, json.as_bytes())?;
        eprintln!("JSON written to {}", path.display());
    }
    Ok(())
}

/// `vmm bench blk --integrity`: one VM per image; a line per completed
/// flush (stdout flushed at once, so a reader that kills the process knows
/// what was durable); every image verified at the end. A failed VM or
/// image fails the command (exit 1).
fn run_integrity(
    a: &BenchArgs,
    executor: ExecutorKind,
    disks: Vec<PathBuf>,
    vms: usize,
    vcpus: usize,
) -> Result<()> {
    use std::io::Write as _;
    use std::sync::Arc;

    if vcpus != 1 {
        return Err(InputError(format!(
            "--integrity drives its device from one vCPU per VM: give --vcpus 1 (not {vcpus})"
        ))
        .into());
    }
    if disks.is_empty() || vms != disks.len() {
        return Err(InputError(format!(
            "--integrity writes one image per VM: give one --disk per VM ({vms} VMs, {} images)",
            disks.len()
        ))
        .into());
    }
    if a.mitigations.is_some() && executor == ExecutorKind::Host {
        return Err(ignored(
            "--mitigations",
            "the workers and threads executors",
            "--executor host (the host kernel schedules)",
        )
        .into());
    }
    topology::load(&a.topology).with_context(|| format!("--topology {}", a.topology))?;
    let opts = IntegrityOptions {
        disks,
        topology: a.topology.clone(),
        executor,
        mitigations: a.mitigations.unwrap_or_else(Mitigations::all),
        qd: a.qd.unwrap_or(8),
        per_gen: a.per_gen.unwrap_or(32),
        gens: a.gens.unwrap_or(0),
        duration: a.duration,
        check: a.check,
        engine: a.engine.unwrap_or_default(),
    };
    outln!(
        "integrity: {} VMs on the {} executor, 4 KiB blocks, {} writes per generation, queue depth {}{}",
        opts.disks.len(),
        executor,
        opts.per_gen,
        opts.qd,
        match opts.gens {
            0 => format!(", for {:?}", opts.duration),
            g => format!(", {g} generations then a read-back"),
        }
    );
    let on_flush = Arc::new(|_: usize, name: &str, g: u64| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{name} flushed generation {g}");
        let _ = out.flush();
    });
    let result = integrity(&opts, on_flush).map_err(anyhow::Error::new)?;
    let mut bad = Vec::new();
    for vm in &result {
        match (&vm.failure, &vm.verified) {
            (None, Ok(v)) => outln!(
                "{}: {} generations flushed; {} verified: {} blocks hold their last flushed write ({} a later one), {} others",
                vm.name,
                vm.flushed,
                vm.disk.display(),
                v.flushed_blocks,
                v.newer,
                v.other
            ),
            (f, v) => {
                let what = match (f, v) {
                    (Some(f), Ok(_)) => f.clone(),
                    (None, Err(e)) => e.clone(),
                    (Some(f), Err(e)) => format!("{f}; {e}"),
                    (None, Ok(_)) => String::new(),
                };
                outln!("{}: FAILED after {} generations: {what}", vm.name, vm.flushed);
                bad.push(vm.name.clone());
            }
        }
    }
    if !bad.is_empty() {
        anyhow::bail!(vmm_lab::BenchError::Failed(format!(
            "integrity failed in {}",
            bad.join(", ")
        )));
    }
    Ok(())
}
