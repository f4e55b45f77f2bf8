//! `vmm bench`'s engine: the seeds' workloads as micro-guests on real KVM vCPUs,
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
//! | `blk` | one vCPU per VM drives virtio-blk over a raw image: random 4 KiB reads (or writes) at a queue depth, completions wake it through the executor | IOPS (higher is better); p50/p99 interrupt-to-run latency |
//! | `net` | one vCPU per VM drives virtio-net on a tap of its own, a host peer on the other side: `tx`, `rx` or `echo` ([`net`]) | packets/s (higher is better); echo: round-trip p50/p99 |
//!
//! `blk` and `net` can place the devices' I/O threads by the host CPU of
//! each VM's pinned vCPU ([`IoCpus`]), and [`compare`] can compare those
//! placements.
//!
//! [`integrity`] runs the virtio-blk integrity writer instead: one VM per
//! image writes generations of patterns with a flush after each, reports
//! each completed flush as it happens, and the images are verified when
//! it stops.

mod blk;
mod calibrate;
mod compare;
pub mod guests;
pub mod net;
mod place;
mod run;

pub use blk::{integrity, BlkOptions, IntegrityOptions, IntegrityVm, OnFlush};
pub use calibrate::iters_per_us;
pub use compare::{compare, BenchComparison, CompareOptions, CompareProgress};
pub use net::NetOptions;
pub use run::run;

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vcpu_sched::bench::RunReport;
use vcpu_sched::stats::Histogram;
use vcpu_sched::Mitigations;

use vmm_machine::micro::MicroError;
use vmm_machine::vcpu_body::{ExecutorKind, TaskError};

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A bad request (exit status 2 in the `vmm` binary).
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

/// The guest workloads.
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
    /// Pairs handing a token back and forth (the simulator's pingpong,
    /// netperf UDP_RR's shape).
    Pingpong,
    /// virtio-blk requests at a queue depth (IOPS); not one of the seeds'
    /// workloads, so not in [`Workload::ALL`].
    Blk,
    /// virtio-net packets (packets/s); not one of the seeds' workloads.
    Net,
}

impl Workload {
    /// The scheduler workloads (every one the simulator and `vmm
    /// sched-bench` also run).
    pub const ALL: [Workload; 5] = [
        Workload::Cyclic,
        Workload::Messaging,
        Workload::Runq,
        Workload::Transcode,
        Workload::Pingpong,
    ];
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Cyclic => "cyclic",
            Workload::Messaging => "messaging",
            Workload::Runq => "runq",
            Workload::Transcode => "transcode",
            Workload::Pingpong => "pingpong",
            Workload::Blk => "blk",
            Workload::Net => "net",
        }
    }
}

impl FromStr for Workload {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Workload::ALL
            .into_iter()
            .chain([Workload::Blk, Workload::Net])
            .find(|w| w.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                BenchError::Input(format!(
                    "unknown workload {s:?}; use cyclic, messaging, runq, transcode, pingpong, blk or net"
                ))
            })
    }
}

/// `blk` and `net`: where each VM's device I/O threads run, relative to
/// the host CPU its (pinned) vCPU runs on. The local stand-in for the
/// NUMA rule (`vmm_machine::devices::io_cpus`), which a one-node host
/// cannot exercise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoCpus {
    /// Not placed: wherever the host kernel puts them (what a one-node
    /// host does today).
    #[default]
    Any,
    /// The host CPU the VM's vCPU is pinned to.
    Same,
    /// Another host CPU: the next logical CPU's (VM `v`'s vCPU on CPU
    /// `v`, its I/O threads on CPU `v + 1` mod the CPUs).
    Other,
}

impl IoCpus {
    /// Every value, in the order the errors name them.
    pub const ALL: [IoCpus; 3] = [IoCpus::Same, IoCpus::Other, IoCpus::Any];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            IoCpus::Any => "any",
            IoCpus::Same => "same",
            IoCpus::Other => "other",
        }
    }
}

impl std::fmt::Display for IoCpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IoCpus {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        IoCpus::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                BenchError::Input(format!(
                    "unknown I/O thread placement {s:?}; use same (the vCPU's host CPU), \
                     other (another host CPU) or any (not placed)"
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
    /// Refuse a result that cannot be a measurement (nothing counted, a
    /// non-finite metric, a saturated wake-to-run histogram) with an
    /// error. Default on. Correctness tests that oversubscribe on purpose
    /// (480 vCPUs on 2 CPUs) turn it off and check progress themselves.
    #[serde(default = "yes")]
    pub require_measurement: bool,
    /// Stamp the stages of every wakeup in the window and report them
    /// ([`BenchReport::breakdown`]).
    #[serde(default)]
    pub breakdown: bool,
    /// Give vCPU `i` of VM `v` logical CPU `v * vcpus + i` alone (its
    /// affinity), on every executor: one vCPU per CPU, pinned. The
    /// vCPUs must fit the topology's CPUs.
    #[serde(default)]
    pub pin: bool,
    /// `blk`: the images and the requests.
    #[serde(default)]
    pub blk: BlkOptions,
    /// `net`: the taps and the mode.
    #[serde(default)]
    pub net: NetOptions,
    /// `blk` and `net`: where the devices' I/O threads run; `same` and
    /// `other` need [`pin`](Self::pin) and `--topology host`.
    #[serde(default)]
    pub io_cpus: IoCpus,
    /// How a fair wakeup queued on a busy CPU's wake list kicks it
    /// ([`vcpu_sched::SchedConfig::lazy_fair_kicks`]).
    #[serde(default)]
    pub kicks: Kicks,
    /// Credit a woken fair vCPU the time it slept
    /// ([`vcpu_sched::SchedConfig::sleeper_credit`]).
    #[serde(default)]
    pub sleeper_credit: bool,
    /// A woken fair vCPU never preempts a running fair vCPU
    /// ([`vcpu_sched::SchedConfig::fair_wakeup_preempt`] off).
    #[serde(default)]
    pub no_wakeup_preempt: bool,
    /// A running fair vCPU's slice shrinks as vCPUs join its runqueue
    /// ([`vcpu_sched::SchedConfig::slice_follows_load`]).
    #[serde(default)]
    pub slices_follow_load: bool,
    /// The fair period slices are cut from, ns
    /// ([`vcpu_sched::SchedConfig::fair_latency_ns`]; `None`: its default).
    #[serde(default)]
    pub fair_latency_ns: Option<u64>,
    /// The shortest fair slice, ns
    /// ([`vcpu_sched::SchedConfig::fair_min_granularity_ns`]; `None`: its
    /// default).
    #[serde(default)]
    pub fair_min_granularity_ns: Option<u64>,
    /// How the fair bounds grow with the CPUs
    /// ([`vcpu_sched::SchedConfig::fair_slice_scaling`]).
    #[serde(default)]
    pub fair_slice_scaling: vcpu_sched::SliceScaling,
    /// A busy CPU hands a waiting fair vCPU to a less loaded busy CPU
    /// ([`vcpu_sched::SchedConfig::busy_balance`], off by default).
    #[serde(default)]
    pub busy_balance: bool,
    /// How the RT pull treats a source whose runqueue lock is held
    /// ([`vcpu_sched::SchedConfig::bounded_rt_pull`]).
    #[serde(default)]
    pub rt_pull: RtPull,
    /// The workers executor's timer advance
    /// ([`vcpu_sched::exec::ExecConfig::timer_advance`]).
    #[serde(default)]
    pub timer_advance: TimerAdvance,
    /// The scheduler executors' tick period, ns (`None`: the executor's
    /// default, [`vmm_machine::vcpu_body::DEFAULT_TICK`]).
    #[serde(default)]
    pub tick_ns: Option<u64>,
}

/// Whether an idle worker parks ahead of a sleep timer and polls the rest
/// of the way ([`vcpu_sched::exec::ExecConfig::timer_advance`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimerAdvance {
    /// Park ahead by the learnt advance and poll (the default).
    #[default]
    On,
    /// Park until the timer is due (the protocol before the advance).
    Off,
}

fn timer_advance_off() -> TimerAdvance {
    TimerAdvance::Off
}

impl std::fmt::Display for TimerAdvance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimerAdvance::On => "timer advance",
            TimerAdvance::Off => "no timer advance",
        })
    }
}

impl std::str::FromStr for TimerAdvance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" => Ok(TimerAdvance::On),
            "off" => Ok(TimerAdvance::Off),
            _ => Err(format!(
                "'{s}' is not a timer advance setting: use on (park ahead of a timer and poll \
                 the rest, the default) or off"
            )),
        }
    }
}

/// Whether a busy CPU hands a waiting fair vCPU to a less loaded busy CPU
/// ([`vcpu_sched::SchedConfig::busy_balance`]): the values of a
/// `--compare-busy-balance` comparison (a run's own setting is
/// [`BenchOptions::busy_balance`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusyBalance {
    /// Fair vCPUs move only into idle CPUs.
    Off,
    /// A busy CPU also pushes to a busier-by-two busy CPU.
    On,
}

impl std::fmt::Display for BusyBalance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BusyBalance::On => "busy balance",
            BusyBalance::Off => "no busy balance",
        })
    }
}

impl std::str::FromStr for BusyBalance {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" => Ok(BusyBalance::On),
            "off" => Ok(BusyBalance::Off),
            _ => Err(format!(
                "'{s}' is not a busy balance setting: use on (a busy CPU also hands a waiting \
                 vCPU to a less loaded busy CPU) or off (the default)"
            )),
        }
    }
}

/// The RT pull's protocol for a source whose runqueue lock is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RtPull {
    /// Pass it by and ask it to push (the default).
    #[default]
    Bounded,
    /// Wait for its lock, as Linux's `pull_rt_task` does (the protocol
    /// before bounded pulls).
    Wait,
}

fn rt_pull_wait() -> RtPull {
    RtPull::Wait
}

impl std::fmt::Display for RtPull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RtPull::Bounded => "bounded RT pull",
            RtPull::Wait => "waiting RT pull",
        })
    }
}

impl std::str::FromStr for RtPull {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bounded" => Ok(RtPull::Bounded),
            "wait" => Ok(RtPull::Wait),
            _ => Err(format!(
                "'{s}' is not an RT pull protocol: use bounded (pass a busy source by, the default) or wait"
            )),
        }
    }
}

/// The wake-list kick protocol of the scheduler executors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kicks {
    /// Only when the wakeup would preempt what runs there (or the CPU is
    /// idle); otherwise the CPU takes it at its next schedule, entry or
    /// tick.
    #[default]
    Lazy,
    /// For every wakeup that finds the list empty, as Linux's remote
    /// wakeups send an IPI (the protocol before lazy kicks).
    Eager,
}

fn eager() -> Kicks {
    Kicks::Eager
}

impl std::fmt::Display for Kicks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kicks::Lazy => "lazy kicks",
            Kicks::Eager => "eager kicks",
        })
    }
}

fn yes() -> bool {
    true
}

impl BenchOptions {
    /// The fair slice bounds as configured, ns: `[latency, min
    /// granularity]`, the scheduler's defaults where not given, before
    /// [`fair_slice_scaling`](Self::fair_slice_scaling).
    pub fn fair_slice_ns(&self) -> [u64; 2] {
        let d = vcpu_sched::SchedConfig::default();
        [
            self.fair_latency_ns.unwrap_or(d.fair_latency_ns),
            self.fair_min_granularity_ns
                .unwrap_or(d.fair_min_granularity_ns),
        ]
    }

    /// The fair slice bounds the scheduler rows run with on `ncpus` CPUs,
    /// ns: `[latency, min granularity]`, scaled as the scheduler scales
    /// them ([`SchedConfig::fair_bounds`](vcpu_sched::SchedConfig::fair_bounds)).
    pub fn fair_slice_ns_on(&self, ncpus: usize) -> [u64; 2] {
        let [fair_latency_ns, fair_min_granularity_ns] = self.fair_slice_ns();
        let b = vcpu_sched::SchedConfig {
            fair_latency_ns,
            fair_min_granularity_ns,
            fair_slice_scaling: self.fair_slice_scaling,
            ..vcpu_sched::SchedConfig::default()
        }
        .fair_bounds(ncpus);
        [b.latency_ns, b.min_granularity_ns]
    }

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
            prio: vcpu_sched::workload::defs::RT_PRIO,
            host_rt: true,
            require_measurement: true,
            breakdown: false,
            pin: false,
            blk: BlkOptions::default(),
            net: NetOptions::default(),
            io_cpus: IoCpus::Any,
            kicks: Kicks::Lazy,
            sleeper_credit: false,
            no_wakeup_preempt: false,
            slices_follow_load: false,
            fair_latency_ns: None,
            fair_min_granularity_ns: None,
            fair_slice_scaling: vcpu_sched::SliceScaling::default(),
            busy_balance: false,
            rt_pull: RtPull::Bounded,
            timer_advance: TimerAdvance::On,
            tick_ns: None,
        }
    }

    /// The tick period the scheduler executors run with, ns.
    pub fn tick_ns_in_force(&self) -> u64 {
        self.tick_ns
            .unwrap_or(vmm_machine::vcpu_body::DEFAULT_TICK.as_nanos() as u64)
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
    /// The host policy the threads that ran vCPUs had: the executor's
    /// workers or vCPU threads (`SCHED_OTHER`, or `SCHED_FIFO P` when they
    /// ran at host RT), or for the host executor the vCPUs' own policy.
    /// Empty in reports written before it was recorded.
    #[serde(default)]
    pub thread_policy: String,
    /// The wake-list kick protocol of the scheduler rows (eager in reports
    /// written before it was recorded: it was the only one).
    #[serde(default = "eager")]
    pub kicks: Kicks,
    /// The RT pull protocol of the scheduler rows (`wait` in reports
    /// written before it was recorded: it was the only one).
    #[serde(default = "rt_pull_wait")]
    pub rt_pull: RtPull,
    /// The workers executor's timer advance (off in reports written before
    /// it was recorded: there was none).
    #[serde(default = "timer_advance_off")]
    pub timer_advance: TimerAdvance,
    /// Whether the scheduler rows ran the busy balance (off in reports
    /// written before it was recorded).
    #[serde(default)]
    pub busy_balance: bool,
    /// The scheduler rows' fair slice bounds in force, ns: `[latency, min
    /// granularity]`, scaled for the CPUs (`None` for the host executor,
    /// and in reports written before they were recorded, when they were
    /// always 6 ms and 0.75 ms).
    #[serde(default)]
    pub fair_slice_ns: Option<[u64; 2]>,
    /// How they were scaled from the configured ones (`None` for the host
    /// executor, and in reports written before the scaling existed, when
    /// there was none).
    #[serde(default)]
    pub fair_slice_scaling: Option<vcpu_sched::SliceScaling>,
    /// The scheduler rows' tick period, ns (`None` for the host executor,
    /// and in reports written before it was recorded, when it was always
    /// 1 ms).
    #[serde(default)]
    pub tick_ns: Option<u64>,
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
    /// With [`BenchOptions::breakdown`]: each stage of a wakeup
    /// ([`vmm_machine::vcpu_body::STAGES`]) over every vCPU, in the window.
    #[serde(default)]
    pub breakdown: Vec<StageRow>,
}

/// One stage of the wakeup breakdown.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageRow {
    /// Which stage.
    pub stage: String,
    /// Samples.
    pub count: u64,
    /// Median (ns).
    pub p50_ns: u64,
    /// 99th percentile (ns).
    pub p99_ns: u64,
    /// Mean (ns).
    pub mean_ns: f64,
}
