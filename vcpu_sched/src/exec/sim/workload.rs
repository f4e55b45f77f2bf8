//! What to simulate: the workloads' behaviour models by name
//! ([`SimWorkload`]) and one run's configuration ([`SimConfig`]), with the
//! checks a configuration must pass before a run.

use serde::{Deserialize, Serialize};

use super::coherence::Arbitration;
use super::costs::CostTable;
use super::queue::{EV_IDX_BITS, EV_T_MAX};
use crate::workload::defs;
use crate::{Mitigations, SchedError};

/// The workloads, shaped like the seeds' benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimWorkload {
    /// hackbench-like, as the thread workload (`workload::messaging`)
    /// runs it: each VM's first half of tasks are senders, the rest
    /// receivers, one pipe of [`defs::MESSAGING_PIPE`] messages per
    /// receiver. A sender computes ([`defs::MESSAGING_BURST_US`]) and
    /// writes to every receiver's pipe in turn; a receiver reads its pipe
    /// and computes per message. A full pipe blocks its writer, an empty
    /// one its reader; each read wakes one waiting writer, a write wakes
    /// the waiting reader. Messages received per second.
    Messaging,
    /// cyclictest-like: one RT FIFO task ([`defs::RT_PRIO`]) per vCPU woken
    /// by a timer every [`defs::CYCLIC_PERIOD_US`], computing
    /// [`defs::CYCLIC_BURST_US`]. Mean latency timer -> running (ns, lower
    /// is better).
    Cyclic,
    /// Multi-instance transcode, as `vmm bench` and the thread workload run
    /// it: per VM, RT FIFO workers ([`defs::RT_PRIO`]) pinned to half as
    /// many cores as the VM has vCPUs ([`defs::transcode_cpus`]) compute a
    /// frame ([`defs::TRANSCODE_BURST_US`]) and meet at a barrier.
    /// Frames/s.
    Transcode,
    /// UDP_RR-like ping-pong pairs, as the thread workload
    /// (`workload::pingpong`) runs them: a VM's tasks 2p and 2p+1 hand one
    /// request back and forth, computing [`defs::PINGPONG_BURST_US`] per
    /// side. `--vcpus 2` gives a VM per pair; one VM of many
    /// pairs is a benchmark run in one cgroup. Transactions/s.
    Pingpong,
    /// schbench-like, as the thread workload (`workload::runq`) runs it:
    /// per VM, vCPU 0 is a message task and the others its workers. The
    /// message task stamps a request for every worker and wakes it, then
    /// waits; a worker computes the request ([`defs::RUNQ_BURST_US`]) and
    /// answers, and the last answer wakes the message task, which does no
    /// compute of its own besides its wakeups. Requests (worker answers)
    /// per second; the report's maximum latency is request to running.
    Runq,
}

impl SimWorkload {
    /// Parses a workload name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "messaging" => Self::Messaging,
            "cyclic" => Self::Cyclic,
            "transcode" => Self::Transcode,
            "pingpong" | "udp_rr" => Self::Pingpong,
            "runq" | "schbench" => Self::Runq,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Messaging => "messaging",
            Self::Cyclic => "cyclic",
            Self::Transcode => "transcode",
            Self::Pingpong => "pingpong",
            Self::Runq => "runq",
        }
    }

    /// (metric, unit, higher is better).
    pub fn metric(self) -> (&'static str, &'static str, bool) {
        match self {
            Self::Messaging => ("messages/s", "msg/s", true),
            Self::Cyclic => ("p99 wakeup latency", "ns", false),
            Self::Transcode => ("frames/s", "frames/s", true),
            Self::Pingpong => ("transactions/s", "trans/s", true),
            Self::Runq => ("requests/s", "req/s", true),
        }
    }

    /// Mean compute time of one step (ns): the workload's definition
    /// ([`defs`]), the same for every variant and topology.
    pub(super) fn work_ns(self) -> u64 {
        match self {
            Self::Messaging => defs::MESSAGING_BURST_US * 1000,
            Self::Cyclic => defs::CYCLIC_BURST_US * 1000,
            Self::Transcode => defs::TRANSCODE_BURST_US * 1000,
            Self::Pingpong => defs::PINGPONG_BURST_US * 1000,
            Self::Runq => defs::RUNQ_BURST_US * 1000,
        }
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The workload.
    pub workload: SimWorkload,
    /// VMs (task groups).
    pub vms: usize,
    /// vCPUs (tasks) per VM.
    pub vcpus: usize,
    /// Virtual time to simulate, ns.
    pub duration_ns: u64,
    /// Mean compute per step, ns (`None`: the workload's definition).
    pub work_ns: Option<u64>,
    /// The seed of the workload's jitter.
    pub seed: u64,
    /// The fixes.
    pub mitigations: Mitigations,
    /// The memory cost table.
    pub cost: CostTable,
    /// Interleave the CPUs' core calls at every shared access (see
    /// `interleave`) instead of running each call to completion.
    pub interleave: bool,
    /// Interleaved runs: who gets a contended line next.
    pub arbitration: Arbitration,
}

impl SimConfig {
    /// Refuses what the simulator cannot run: no VM, vCPU or time; a VM
    /// shape the workload cannot use; more tasks or time than the event
    /// keys hold.
    pub(super) fn check(&self) -> crate::Result<()> {
        if self.vms == 0 || self.vcpus == 0 || self.duration_ns == 0 {
            return Err(SchedError::Workload(
                "a simulation needs at least one VM, one vCPU and a duration".into(),
            ));
        }
        if self.workload == SimWorkload::Messaging && self.vcpus < 2 {
            return Err(SchedError::Workload(
                "messaging needs at least 2 vCPUs per VM (a sender and a receiver)".into(),
            ));
        }
        if self.workload == SimWorkload::Runq && self.vcpus < 2 {
            return Err(SchedError::Workload(
                "runq needs at least 2 vCPUs per VM (a message task and a worker)".into(),
            ));
        }
        if self.workload == SimWorkload::Pingpong && self.vcpus % 2 != 0 {
            return Err(SchedError::Workload(format!(
                "pingpong pairs a VM's vCPUs: give an even number (not {})",
                self.vcpus
            )));
        }
        let ntasks = self.vms.saturating_mul(self.vcpus);
        if ntasks >= 1 << EV_IDX_BITS || self.duration_ns > EV_T_MAX / 2 {
            return Err(SchedError::Workload(format!(
                "{ntasks} tasks for {} s: the simulator takes fewer than {} tasks and up to {} s",
                self.duration_ns / 1_000_000_000,
                1u64 << EV_IDX_BITS,
                EV_T_MAX / 2 / 1_000_000_000
            )));
        }
        Ok(())
    }
}
