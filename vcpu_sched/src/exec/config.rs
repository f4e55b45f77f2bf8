//! What every executor is built with and what it reports.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use crate::error::{Result, SchedError};
use crate::os_thread::allowed_host_cpus;
use crate::stats::{SchedCounters, TaskStats};
use crate::task::CpuId;

/// Which executor runs the tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// One OS thread per task, which runs only while it holds its CPU's run
    /// slot; switching hands the slot to the next thread
    /// ([`ThreadsExecutor`](super::ThreadsExecutor)).
    Threads,
    /// One worker thread per logical CPU that runs whichever task the
    /// scheduler picks by calling its body itself (M:N,
    /// [`WorkerPool`](super::WorkerPool)).
    Workers,
    /// Plain 1:1 threads scheduled by the host kernel, no `vcpu_sched` at
    /// all: what Cloud Hypervisor and Firecracker do with vCPUs, and the
    /// peer every result is set beside ([`HostExecutor`](super::HostExecutor)).
    Host,
}

impl ExecutorKind {
    /// Every kind, in the order the CLI lists them.
    pub const ALL: [ExecutorKind; 3] = [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ];

    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Threads => "threads",
            ExecutorKind::Workers => "workers",
            ExecutorKind::Host => "host",
        }
    }

    /// Does it run `vcpu_sched` (and so have mitigations, counters and a
    /// checker)?
    pub fn has_scheduler(self) -> bool {
        self != ExecutorKind::Host
    }
}

impl fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ExecutorKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "threads" => Ok(ExecutorKind::Threads),
            "workers" => Ok(ExecutorKind::Workers),
            "host" => Ok(ExecutorKind::Host),
            _ => Err(format!(
                "unknown executor {s:?}; use workers (M:N), threads (a thread per task) or host (the host kernel schedules)"
            )),
        }
    }
}

/// How logical CPUs map to host CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuMapping {
    /// Logical CPU `i` is the topology's CPU `i` (its `os_index`): use with
    /// the `host` topology.
    Host,
    /// Logical CPU `i` runs on host CPU `real[i % real.len()]`.
    Emulated {
        /// Host CPU numbers.
        real: Vec<u32>,
    },
}

impl CpuMapping {
    /// Emulation onto every CPU this process may run on.
    pub fn emulated_on_allowed() -> Result<Self> {
        Ok(CpuMapping::Emulated {
            real: allowed_host_cpus()?,
        })
    }

    /// The mapping for a topology SPEC: `host` runs on the real CPUs,
    /// anything else is emulated onto the CPUs this process may use.
    pub fn for_spec(spec: &str) -> Result<Self> {
        if spec.trim() == "host" {
            Ok(CpuMapping::Host)
        } else {
            Self::emulated_on_allowed()
        }
    }

    /// Is this an emulation (logical CPUs share host CPUs)?
    pub fn is_emulated(&self) -> bool {
        matches!(self, CpuMapping::Emulated { .. })
    }

    /// How many host CPUs a topology of `cpus` logical CPUs runs on.
    pub fn host_cpus(&self, cpus: usize) -> usize {
        match self {
            CpuMapping::Host => cpus,
            CpuMapping::Emulated { real } => real.len().min(cpus),
        }
    }

    /// The host CPU logical CPU `cpu` of `topo` runs on.
    pub fn host_cpu(&self, topo: &HostTopology, cpu: CpuId) -> u32 {
        match self {
            CpuMapping::Host => topo.os_index(cpu),
            CpuMapping::Emulated { real } if !real.is_empty() => real[cpu as usize % real.len()],
            CpuMapping::Emulated { .. } => 0,
        }
    }
}

/// Settings of the invariant checker.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckConfig {
    /// Time between snapshots.
    pub interval: Duration,
    /// How long an RT wait may persist before it is a violation.
    pub grace: Duration,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            grace: Duration::from_secs(2),
        }
    }
}

/// Executor settings, the same for every kind (each takes what applies to
/// it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecConfig {
    /// Where logical CPUs run.
    pub mapping: CpuMapping,
    /// Tick period (scheduler executors).
    pub tick: Duration,
    /// Stack size of threads that run task bodies.
    pub task_stack: usize,
    /// Run the invariant checker (and the executor's own checks).
    pub check: Option<CheckConfig>,
    /// Set host CPU affinity of threads (turn off only where the process may
    /// not change affinity).
    pub pin: bool,
    /// Run the scheduler executors' threads at host `SCHED_FIFO` with this
    /// priority (the clock thread one above), so that RT tasks are not
    /// preempted by ordinary host processes, as the host executor runs RT
    /// tasks' threads. Where that is not permitted the threads stay
    /// `SCHED_OTHER` and a warning is logged once.
    #[serde(default)]
    pub host_rt: Option<u8>,
    /// The clock's start (`None`: when the executor starts). Give the
    /// epoch of the data the bodies stamp, so that both tell the same time.
    #[serde(skip)]
    pub epoch: Option<Instant>,
    /// Keep every ended task's statistics and failure for the report
    /// (turn off for an executor that runs for ever, such as `vmm
    /// serve`'s, where the list would only grow).
    #[serde(default = "on_by_default")]
    pub keep_task_stats: bool,
    /// Workers executor: an idle worker parks ahead of a sleep timer and
    /// polls the rest of the way, by an advance learnt from how late its
    /// parks return (the timer advance; only where every worker has a
    /// host CPU of its own).
    #[serde(default = "on_by_default")]
    pub timer_advance: bool,
}

fn on_by_default() -> bool {
    true
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            mapping: CpuMapping::Host,
            tick: Duration::from_millis(1),
            task_stack: 256 << 10,
            check: None,
            pin: true,
            host_rt: None,
            epoch: None,
            keep_task_stats: true,
            timer_advance: true,
        }
    }
}

impl ExecConfig {
    /// Refuses settings no executor can run with.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.tick.is_zero() {
            return Err(SchedError::Config("the tick must be positive".into()));
        }
        if let CpuMapping::Emulated { real } = &self.mapping {
            if real.is_empty() {
                return Err(SchedError::Config(
                    "emulated mapping with no host CPUs".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Totals of one run of an executor.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExecReport {
    /// Scheduler counters, summed (zero for the host executor).
    pub counters: SchedCounters,
    /// Per CPU: time spent inside the scheduler core (ns).
    pub sched_ns_per_cpu: Vec<u64>,
    /// Per CPU: calls into `schedule`.
    pub sched_calls_per_cpu: Vec<u64>,
    /// Per CPU: slot grants (threads executor).
    pub grants_per_cpu: Vec<u64>,
    /// Per CPU: times the CPU's own thread woke to schedule.
    pub idle_wakeups_per_cpu: Vec<u64>,
    /// Per CPU: ns its idle worker polled for a sleep timer it had parked
    /// ahead of (the workers executor's timer advance; empty elsewhere).
    #[serde(default)]
    pub timer_spin_ns_per_cpu: Vec<u64>,
    /// Statistics of every task that ended (scheduler executors), in task
    /// id order.
    pub tasks: Vec<TaskStats>,
    /// Tasks that ended with a failure: `name: why`.
    pub failures: Vec<String>,
    /// Host executor: each task thread's host schedstat, by task id.
    #[serde(default)]
    pub host_schedstat: Vec<Option<crate::exec::clock::HostSchedstat>>,
    /// Invariant violations (executor checks and the checker).
    pub violations: Vec<String>,
    /// Checker snapshots taken.
    pub checks: u64,
    /// RT waits the checker saw (transient ones included).
    pub rt_waits_seen: u64,
    /// Failed attempts to set a thread's host CPU affinity.
    pub pin_errors: u64,
}
