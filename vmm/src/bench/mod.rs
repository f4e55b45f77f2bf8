//! `vmm bench`: the seeds' workloads as micro-guests on real KVM vCPUs,
//! scheduled by `vcpu_sched` (the `workers` or `threads` executor) or by
//! the host kernel (`host`, plain 1:1 threads), and the seeds'
//! comparison of mitigation sets.
//!
//! One run ([`run`]) builds `vms` micro-guests of `vcpus` vCPUs each,
//! every VM a task group, runs them for a warm-up and a measured window,
//! and returns a [`BenchReport`]: the headline metric, the scheduler's
//! counters and per-CPU overhead, and per-vCPU metrics. [`compare`] runs
//! the baseline and each fix alone (or any list of sets), interleaved and
//! repeated, plus the host 1:1 baseline, and returns
//! [`vcpu_sched::bench::Comparison`], whose table and JSON it shares with
//! `vmm sched-bench`.
//!
//! | workload | guest | metric |
//! |---|---|---|
//! | `cyclic` | every vCPU (FIFO) sleeps a period, computes a few us | p99 wakeup latency after the timer (lower is better); ops/s |
//! | `messaging` | sender/receiver pairs through 16-message pipes, a doorbell per message | seconds per 100k messages (hackbench's total time; lower is better) |
//! | `runq` | vCPU 0 rings all workers, each computes and answers (schbench) | requests/s; p99 doorbell-to-run latency |
//! | `transcode` | 8 FIFO-99 vCPUs per VM pinned to 4 cores / 8 CPUs, a frame is a burst on each | frames/s |

pub mod cli;
pub mod guests;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vcpu_sched::bench::{interleaved, Comparison, RunReport, TaskSummary};
use vcpu_sched::exec::{CheckConfig, CpuMapping};
use vcpu_sched::stats::Histogram;
use vcpu_sched::workload::Metric;
use vcpu_sched::{CpuMask, Mitigations, Policy, SchedConfig};
use vm_memory::GuestMemoryMmap;

use crate::micro::{read_u64, MicroError, MicroHost, MicroVm, MicroVmSpec, DATA_ADDR};
use crate::vcpu_task::{ExecOptions, ExecutorKind, Placement, Running, TaskError, VmSet};

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A bad request (exit status 2 in the CLI).
    #[error("{0}")]
    Input(String),
    /// The topology.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// The scheduler.
    #[error(transparent)]
    Sched(#[from] vcpu_sched::SchedError),
    /// Building a micro-guest.
    #[error(transparent)]
    Micro(#[from] MicroError),
    /// The executor.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The run went wrong: a VM failed, a vCPU made no progress, the
    /// checker found violations.
    #[error("{0}")]
    Failed(String),
}

impl BenchError {
    /// Is it the user's input?
    pub fn is_input(&self) -> bool {
        match self {
            BenchError::Input(_) => true,
            BenchError::Micro(MicroError::Input(_)) => true,
            BenchError::Task(TaskError::Input(_)) => true,
            BenchError::Topology(t) => !matches!(
                t,
                topology::TopologyError::Io { .. } | topology::TopologyError::Host(_)
            ),
            _ => false,
        }
    }
}

/// The four guest workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// RT vCPUs on periodic timers (stress-ng --cyclic).
    Cyclic,
    /// Pairs passing messages (hackbench, perf bench sched messaging).
    Messaging,
    /// Short bursts on many workers (schbench).
    Runq,
    /// Pinned FIFO-99 VMs in compute bursts (the 60-instance FFmpeg case).
    Transcode,
}

impl Workload {
    /// All four.
    pub const ALL: [Workload; 4] = [
        Workload::Cyclic,
        Workload::Messaging,
        Workload::Runq,
        Workload::Transcode,
    ];
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Cyclic => "cyclic",
            Workload::Messaging => "messaging",
            Workload::Runq => "runq",
            Workload::Transcode => "transcode",
        }
    }
}

impl FromStr for Workload {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                BenchError::Input(format!(
                    "unknown workload {s:?}; use cyclic, messaging, runq or transcode"
                ))
            })
    }
}

/// What to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchOptions {
    /// The workload.
    pub workload: Workload,
    /// Topology SPEC: `host` (the real CPUs) or anything `topology::load`
    /// takes, emulated onto the CPUs this process may use.
    pub topology: String,
    /// VMs.
    pub vms: usize,
    /// vCPUs per VM.
    pub vcpus: usize,
    /// Measured time.
    pub duration: Duration,
    /// Warm-up; `None`: a fifth of `duration`, at most 1 s.
    pub warmup: Option<Duration>,
    /// The fixes (scheduler executors).
    pub mitigations: Mitigations,
    /// The executor.
    pub executor: ExecutorKind,
    /// Invariant checker on; a violation, a failed VM or a vCPU without
    /// progress fails the run.
    pub check: bool,
    /// Compute per operation in microseconds (default per workload:
    /// cyclic 5, messaging 1, runq 20, transcode 500).
    pub burst_us: Option<u64>,
    /// cyclic: timer period in microseconds (default: 1 ms, stretched so
    /// that all vCPUs together wake about 16 times per millisecond).
    pub period_us: Option<u64>,
    /// RT priority of cyclic and transcode vCPUs (default 99).
    pub prio: u8,
    /// RT workloads on `workers`: run the worker threads at host
    /// `SCHED_FIFO` (as the host baseline's vCPU threads are). Default on.
    pub host_rt: bool,
}

impl BenchOptions {
    /// Defaults: 1 s, baseline, `workers`, checker off.
    pub fn new(workload: Workload, topology: &str, vms: usize, vcpus: usize) -> Self {
        Self {
            workload,
            topology: topology.into(),
            vms,
            vcpus,
            duration: Duration::from_secs(1),
            warmup: None,
            mitigations: Mitigations::none(),
            executor: ExecutorKind::Workers,
            check: false,
            burst_us: None,
            period_us: None,
            prio: 99,
            host_rt: true,
        }
    }
}

/// One vCPU's numbers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VcpuRow {
    /// `vm/vcpuN`.
    pub name: String,
    /// `KVM_RUN` entries.
    pub entries: u64,
    /// Exits from `KVM_RUN` inside the measured window.
    pub window_exits: u64,
    /// Halts, sleeps, doorbells rung, preemption kicks.
    pub blocks: u64,
    /// Sleeps.
    pub sleeps: u64,
    /// Doorbells rung.
    pub wakes_sent: u64,
    /// Returns from `KVM_RUN` forced by a preemption kick.
    pub preempt_kicks: u64,
    /// Scheduler: time runnable but not running (ns).
    pub run_delay_ns: u64,
    /// Scheduler: wakeup-to-running p50 / p99 (ns, log2 buckets).
    pub wake_to_run_p50_ns: u64,
    /// See `wake_to_run_p50_ns`.
    pub wake_to_run_p99_ns: u64,
    /// Scheduler: CPU changes.
    pub migrations: u64,
    /// Scheduler: time in each state (ns).
    pub running_ns: u64,
    /// See `running_ns`.
    pub queued_ns: u64,
    /// See `running_ns`.
    pub blocked_ns: u64,
    /// Host executor: time on a host CPU and waiting on a host run queue
    /// (ns, `/proc/thread-self/schedstat`).
    pub host_run_ns: u64,
    /// See `host_run_ns`.
    pub host_wait_ns: u64,
}

/// One run's result: the shared [`RunReport`] plus what is particular to
/// real vCPUs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    /// Workload, topology, metric, counters, per-CPU overhead, summaries.
    pub run: RunReport,
    /// Executor.
    pub executor: ExecutorKind,
    /// VMs.
    pub vms: usize,
    /// vCPUs per VM.
    pub vcpus: usize,
    /// Per vCPU.
    pub per_vcpu: Vec<VcpuRow>,
    /// Timer latency (cyclic) or doorbell latency (the others) of every
    /// vCPU inside the window, measured by the VMM from the timer's due
    /// time or the doorbell to the vCPU entering the guest again.
    pub guest_latency: Histogram,
    /// vCPUs that made no progress in the run (fewer than two entries
    /// into the guest: never came back after their first exit).
    pub stalled: Vec<String>,
}

/// Loop iterations of the guest's compute loop per microsecond, measured
/// once per process.
pub fn iters_per_us(host: &MicroHost) -> Result<f64, BenchError> {
    static CAL: OnceLock<f64> = OnceLock::new();
    if let Some(v) = CAL.get() {
        return Ok(*v);
    }
    let time = |iters: u64| -> Result<f64, BenchError> {
        let mut vm = MicroVm::build(
            host,
            &MicroVmSpec::new("calibrate", 1, guests::compute_once(iters)?),
        )?;
        let mut v = vm.vcpus.remove(0);
        let io = vm.io.clone();
        let t0 = Instant::now();
        loop {
            match v.run(&*io).map_err(MicroError::from)? {
                crate::vcpu::VcpuExit::Io { .. } => break,
                crate::vcpu::VcpuExit::Kicked => continue,
                other => {
                    return Err(BenchError::Failed(format!(
                        "calibration guest stopped with {other:?}"
                    )))
                }
            }
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6)
    };
    // Grow the loop until it takes 20 ms (the guest may be emulated).
    let mut n: u64 = 10_000;
    while n < 1 << 40 && time(n)? < 20_000.0 {
        n *= 4;
    }
    let empty = time(1)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        best = best.min((time(n)? - empty).max(1.0));
    }
    let v = n as f64 / best;
    let _ = CAL.set(v);
    tracing::info!(
        "guest compute loop: {v:.3} iterations per us ({n} iterations took {best:.0} us)"
    );
    Ok(v)
}

struct Built {
    set: Arc<VmSet>,
    memories: Vec<GuestMemoryMmap>,
}

fn default_burst(w: Workload) -> u64 {
    match w {
        Workload::Cyclic => 5,
        Workload::Messaging => 1,
        Workload::Runq => 20,
        Workload::Transcode => 500,
    }
}

/// Logical CPUs of cores `first..first+n` (wrapping).
fn cores_mask(topo: &topology::HostTopology, first: usize, n: usize) -> CpuMask {
    let cores = topo.num_cores().max(1);
    CpuMask::from_cpus((0..n).flat_map(|k| {
        topo.cpus_of_core(((first + k) % cores) as u32)
            .iter()
            .copied()
    }))
}

fn build(
    opts: &BenchOptions,
    topo: &topology::HostTopology,
    host: &MicroHost,
) -> Result<Built, BenchError> {
    let ipu = iters_per_us(host)?;
    let burst = opts
        .burst_us
        .unwrap_or_else(|| default_burst(opts.workload));
    let iters = ((burst as f64 * ipu) as u64).max(1);
    let total = opts.vms * opts.vcpus;
    let code = match opts.workload {
        Workload::Cyclic => {
            let period_us = opts
                .period_us
                .unwrap_or_else(|| 1000u64.max(total as u64 * 1000 / 16));
            if period_us == 0 || period_us > u32::MAX as u64 / 1000 {
                return Err(BenchError::Input(format!(
                    "a period of {period_us} us; give 1 to {} us",
                    u32::MAX / 1000
                )));
            }
            guests::cyclic((period_us * 1000) as u32, iters)?
        }
        Workload::Messaging => {
            if opts.vcpus % 2 != 0 {
                return Err(BenchError::Input(format!(
                    "messaging pairs senders with receivers: give an even --vcpus (not {})",
                    opts.vcpus
                )));
            }
            guests::messaging(iters)?
        }
        Workload::Runq => {
            if opts.vcpus < 2 {
                return Err(BenchError::Input(
                    "runq needs a message vCPU and at least one worker: --vcpus 2 or more".into(),
                ));
            }
            guests::runq(iters)?
        }
        Workload::Transcode => guests::transcode(iters)?,
    };
    let mut vms = Vec::with_capacity(opts.vms);
    let mut memories = Vec::with_capacity(opts.vms);
    for v in 0..opts.vms {
        let spec = MicroVmSpec::new(format!("vm{v}"), opts.vcpus, code.clone());
        let vm = MicroVm::build(host, &spec)?;
        memories.push(vm.memory.clone());
        let placement = match opts.workload {
            Workload::Cyclic => Placement {
                policy: Policy::Fifo(opts.prio),
                affinity: None,
            },
            Workload::Transcode => Placement {
                policy: Policy::Fifo(opts.prio),
                affinity: Some(cores_mask(
                    topo,
                    v * opts.vcpus.div_ceil(2),
                    opts.vcpus.div_ceil(2),
                )),
            },
            _ => Placement::default(),
        };
        vms.push(vm.into_guest(vec![placement]));
    }
    Ok(Built {
        set: VmSet::new(vms)?,
        memories,
    })
}

/// Sum of the workload's progress counters in guest memory.
fn guest_count(w: Workload, b: &Built, vcpus: usize) -> u64 {
    let mut s = 0;
    for m in &b.memories {
        match w {
            Workload::Messaging => {
                for p in 0..vcpus as u64 / 2 {
                    s += read_u64(m, DATA_ADDR + guests::pipe_offset(p) + 64).unwrap_or(0);
                }
            }
            Workload::Runq => s += read_u64(m, DATA_ADDR + guests::RUNQ_ANSWERS).unwrap_or(0),
            Workload::Transcode => s += read_u64(m, DATA_ADDR + guests::FRAMES).unwrap_or(0),
            Workload::Cyclic => {}
        }
    }
    s
}

fn validate(opts: &BenchOptions) -> Result<(), BenchError> {
    if opts.vms == 0 || opts.vcpus == 0 {
        return Err(BenchError::Input(
            "give at least one VM and one vCPU per VM".into(),
        ));
    }
    if opts.duration.is_zero() {
        return Err(BenchError::Input("the duration must be positive".into()));
    }
    if opts.prio == 0 || opts.prio > 99 {
        return Err(BenchError::Input(format!(
            "RT priority {}; give 1 to 99",
            opts.prio
        )));
    }
    if opts.burst_us == Some(0) {
        return Err(BenchError::Input("a burst must be at least 1 us".into()));
    }
    Ok(())
}

/// Runs one workload once. `progress` gets the fraction done (0..=1).
pub fn run(opts: &BenchOptions, progress: &mut dyn FnMut(f64)) -> Result<BenchReport, BenchError> {
    validate(opts)?;
    crate::vcpu::install_kick_signal().map_err(MicroError::from)?;
    let topo = Arc::new(topology::load(&opts.topology)?);
    let mapping = CpuMapping::for_spec(&opts.topology)?;
    let emulated = mapping.is_emulated();
    let host_cpus = mapping.host_cpus(topo.num_cpus());
    let host = MicroHost::open()?;
    let built = build(opts, &topo, &host)?;
    let set = built.set.clone();
    let mut eo = ExecOptions::new(topo.clone(), mapping);
    eo.kind = opts.executor;
    eo.mitigations = opts.mitigations;
    eo.sched = SchedConfig {
        max_tasks: SchedConfig::default().max_tasks.max(set.slots().len()),
        ..SchedConfig::default()
    };
    eo.check = opts.check.then(CheckConfig::default);
    // RT workloads: the host baseline runs its vCPU threads at SCHED_FIFO,
    // so the executor's threads (workers, or the threads executor's vCPU
    // and idle threads; the clock one above) run at it too; otherwise
    // any host process would preempt our RT vCPUs but not the baseline's.
    // Never on an emulated topology: hundreds of SCHED_FIFO workers on a
    // few host CPUs would starve everything else on the host.
    if opts.host_rt && !emulated && matches!(opts.workload, Workload::Cyclic | Workload::Transcode)
    {
        eo.host_rt = Some(opts.prio.min(98));
    }
    let running = Running::start(&eo, set.clone())?;
    let warmup = opts
        .warmup
        .unwrap_or_else(|| (opts.duration / 5).min(Duration::from_secs(1)));
    let total = warmup + opts.duration;
    let t0 = Instant::now();
    let mut opened = None;
    let mut failed_early = false;
    loop {
        let el = t0.elapsed();
        if opened.is_none() && el >= warmup {
            set.open_window();
            opened = Some((
                guest_count(opts.workload, &built, opts.vcpus),
                running.counters().unwrap_or_default(),
                set.progress_snapshot(),
            ));
        }
        if el >= total {
            // With the checker on, a vCPU that has not yet run again after
            // its first exit gets up to 30 s more (a loaded host, a big
            // emulated topology); one that still has not is reported.
            let slow = opts.check
                && el < total + Duration::from_secs(30)
                && set.progress_snapshot().iter().any(|&p| p < 2);
            if !slow {
                break;
            }
        }
        if opts.check && !set.failures().is_empty() {
            failed_early = true;
            break;
        }
        progress((el.as_secs_f64() / total.as_secs_f64()).min(1.0));
        std::thread::sleep(
            Duration::from_millis(10).min(total.saturating_sub(el).max(Duration::from_millis(1))),
        );
    }
    set.close_window();
    let (g0, c0, m0) = opened.unwrap_or_default();
    let g1 = guest_count(opts.workload, &built, opts.vcpus);
    let c1 = running.counters().unwrap_or_default();
    let m1 = set.progress_snapshot();
    let out = running.stop(Duration::from_secs(60))?;
    progress(1.0);
    let secs = set.window.len() as f64 / 1e9;
    let metrics = set.take_metrics();

    // Progress: every vCPU entered the guest again after the window opened.
    let mut stalled = Vec::new();
    let mut guest_latency = Histogram::new();
    let mut per_vcpu = Vec::with_capacity(metrics.len());
    for (i, m) in metrics.iter().enumerate() {
        let s = &set.slots()[i];
        let name = format!("{}/vcpu{}", set.vms()[s.vm].name, s.index);
        // Progress: the vCPU ran, came back to the VMM (halt, sleep,
        // doorbell, kick) and ran again. Per window it would be too strict
        // for short windows on emulated topologies, where one frame of a
        // pinned VM can take longer than the window.
        if !failed_early && m.entries < 2 {
            stalled.push(name.clone());
        }
        match opts.workload {
            Workload::Cyclic => guest_latency.merge(&m.timer_latency),
            _ => guest_latency.merge(&m.doorbell_latency),
        }
        let t = out.tasks.get(i).cloned().flatten().unwrap_or_default();
        let hs = out
            .host_schedstat
            .get(i)
            .copied()
            .flatten()
            .unwrap_or((0, 0));
        per_vcpu.push(VcpuRow {
            name,
            entries: m.entries,
            window_exits: m1
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(m0.get(i).copied().unwrap_or(0)),
            blocks: m.blocks,
            sleeps: m.sleeps,
            wakes_sent: m.wakes_sent,
            preempt_kicks: m.preempt_kicks,
            run_delay_ns: t.run_delay_ns,
            wake_to_run_p50_ns: t.wake_to_run.quantile(0.5),
            wake_to_run_p99_ns: t.wake_to_run.quantile(0.99),
            migrations: t.migrations,
            running_ns: t.running_ns,
            queued_ns: t.queued_ns,
            blocked_ns: t.blocked_ns,
            host_run_ns: hs.0,
            host_wait_ns: hs.1,
        });
    }
    let mut ts = TaskSummary::from_tasks(out.tasks.iter().flatten());
    // every vCPU counts, also one whose statistics the executor lacks
    ts.tasks = metrics.len();
    ts.run_delay_per_task_ns = ts.run_delay_ns as f64 / ts.tasks.max(1) as f64;

    let count = g1.saturating_sub(g0) as f64;
    let mut extra = BTreeMap::new();
    let lat = &guest_latency;
    for (k, q) in [("p50_ns", 0.5), ("p90_ns", 0.9), ("p99_ns", 0.99)] {
        extra.insert(k.to_string(), lat.quantile(q) as f64);
    }
    extra.insert("max_ns".into(), lat.max() as f64);
    extra.insert("wakeups".into(), lat.count() as f64);
    let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    let metric = match opts.workload {
        Workload::Cyclic => {
            extra.insert("ops_per_s".into(), per_s(lat.count() as f64));
            Metric {
                name: "p99_wakeup_latency".into(),
                unit: "ns".into(),
                value: lat.quantile(0.99) as f64,
                higher_is_better: false,
            }
        }
        Workload::Messaging => {
            extra.insert("messages".into(), count);
            extra.insert("messages_per_s".into(), per_s(count));
            Metric {
                name: "time_per_100k_messages".into(),
                unit: "s".into(),
                value: if count > 0.0 {
                    secs * 1e5 / count
                } else {
                    f64::INFINITY
                },
                higher_is_better: false,
            }
        }
        Workload::Runq => {
            extra.insert("requests".into(), count);
            Metric {
                name: "requests_per_s".into(),
                unit: "1/s".into(),
                value: per_s(count),
                higher_is_better: true,
            }
        }
        Workload::Transcode => {
            extra.insert("frames".into(), count);
            Metric {
                name: "frames_per_s".into(),
                unit: "1/s".into(),
                value: per_s(count),
                higher_is_better: true,
            }
        }
    };
    let counters = c1.since(&c0);
    let sched_ns: u64 = out.sched_ns_per_cpu.iter().sum();
    let sched_calls: u64 = out.sched_calls_per_cpu.iter().sum();
    let mut violations = out.violations.clone();
    for (vm, r) in set.failures() {
        violations.push(format!("VM {vm} failed: {r}"));
    }
    let report = BenchReport {
        run: RunReport {
            workload: opts.workload.name().into(),
            topology: opts.topology.clone(),
            cpus: topo.num_cpus(),
            host_cpus,
            emulated,
            mitigations: if opts.executor == ExecutorKind::Host {
                "host 1:1".into()
            } else {
                opts.mitigations.to_string()
            },
            duration_s: secs,
            metric,
            extra,
            tasks: metrics.len(),
            counters,
            sched_ns,
            sched_calls,
            sched_ns_per_call: sched_ns as f64 / sched_calls.max(1) as f64,
            sched_ns_per_cpu: out.sched_ns_per_cpu.clone(),
            task_summary: ts,
            checks: out.checks,
            violations,
        },
        executor: opts.executor,
        vms: opts.vms,
        vcpus: opts.vcpus,
        per_vcpu,
        guest_latency,
        stalled,
    };
    if opts.check {
        let mut problems = report.run.violations.clone();
        if !report.stalled.is_empty() {
            problems.push(format!(
                "{} vCPUs made no progress (never ran again after their first exit): {}",
                report.stalled.len(),
                report
                    .stalled
                    .iter()
                    .take(8)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !problems.is_empty() {
            return Err(BenchError::Failed(format!(
                "{} problem(s): {}",
                problems.len(),
                problems
                    .iter()
                    .take(6)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            )));
        }
    }
    Ok(report)
}

/// What to compare.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// The run; its `mitigations` is ignored, and its executor must be a
    /// scheduler executor.
    pub run: BenchOptions,
    /// The sets; the first is the baseline.
    pub variants: Vec<Mitigations>,
    /// Repetitions of each.
    pub repetitions: usize,
    /// Also run the host 1:1 baseline in every repetition.
    pub host_baseline: bool,
}

/// Where a comparison is.
#[derive(Clone, Debug)]
pub struct CompareProgress {
    /// Runs finished.
    pub done: usize,
    /// Runs in all.
    pub total: usize,
    /// The variant running.
    pub variant: String,
    /// Fraction of it done.
    pub run_fraction: f64,
}

/// A comparison and every run's full report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchComparison {
    /// The seeds' table (rows: the variants, then `host 1:1`).
    pub table: Comparison,
    /// Executor of the scheduler rows.
    pub executor: ExecutorKind,
    /// VMs x vCPUs.
    pub vms: usize,
    /// vCPUs per VM.
    pub vcpus: usize,
    /// Every run, in order.
    pub reports: Vec<BenchReport>,
}

/// Runs every variant (and the host baseline) `repetitions` times,
/// interleaved: repetition `r` starts `r` places further along the list,
/// so slow drift of the host favours no variant. One unrecorded warm-up
/// run comes first.
pub fn compare(
    opts: &CompareOptions,
    progress: &mut dyn FnMut(&CompareProgress),
) -> Result<BenchComparison, BenchError> {
    if opts.variants.is_empty() || opts.repetitions == 0 {
        return Err(BenchError::Input(
            "a comparison needs at least one mitigation set and one repetition".into(),
        ));
    }
    if opts.run.executor == ExecutorKind::Host {
        return Err(BenchError::Input(
            "compare with --executor workers or threads; the host 1:1 baseline is added by itself"
                .into(),
        ));
    }
    // (label, options)
    let mut cells: Vec<(String, BenchOptions)> = opts
        .variants
        .iter()
        .map(|m| {
            let mut o = opts.run.clone();
            o.mitigations = *m;
            (m.to_string(), o)
        })
        .collect();
    if opts.host_baseline {
        let mut o = opts.run.clone();
        o.executor = ExecutorKind::Host;
        cells.push(("host 1:1".into(), o));
    }
    let nv = cells.len();
    let total = nv * opts.repetitions;
    {
        let mut w = cells[0].1.clone();
        w.duration = w.duration.min(Duration::from_millis(500));
        w.check = false;
        run(&w, &mut |f| {
            progress(&CompareProgress {
                done: 0,
                total,
                variant: "warm-up".into(),
                run_fraction: f,
            })
        })?;
    }
    let mut values = vec![vec![f64::NAN; opts.repetitions]; nv];
    let mut per_call = vec![0.0; nv];
    let mut reports = Vec::with_capacity(total);
    for (done, (rep, v)) in interleaved(nv, opts.repetitions).enumerate() {
        let (label, o) = &cells[v];
        let r = run(o, &mut |f| {
            progress(&CompareProgress {
                done,
                total,
                variant: label.clone(),
                run_fraction: f,
            })
        })?;
        values[v][rep] = r.run.metric.value;
        per_call[v] += r.run.sched_ns_per_call / opts.repetitions as f64;
        reports.push(r);
    }
    let labels: Vec<String> = cells.iter().map(|(l, _)| l.clone()).collect();
    let table = Comparison::assemble(
        &labels,
        &values,
        &per_call,
        opts.run.duration.as_secs_f64(),
        reports.iter().map(|r| r.run.clone()).collect(),
    )?;
    Ok(BenchComparison {
        table,
        executor: opts.run.executor,
        vms: opts.run.vms,
        vcpus: opts.run.vcpus,
        reports,
    })
}
