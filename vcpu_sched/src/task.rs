//! Task identities and scheduling policies.
//!
//! A task is what the scheduler places: for the VMM, one vCPU. Each task has
//! a policy (RT FIFO or RR with priority 1..99, or fair with a weight), an
//! affinity mask, and a group (for the VMM, its VM).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};

/// A dense CPU index of the scheduler's topology.
pub type CpuId = u32;

/// A task handle. Ids are small integers that index the task table; an id is
/// reused after its task has been [removed](crate::Scheduler::remove_task).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId(pub u32);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {}", self.0)
    }
}

/// A task group handle (for the VMM, one VM). Group 0 always exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The group every task without one belongs to.
    pub const ROOT: GroupId = GroupId(0);
}

/// The lowest and highest RT priority (as in Linux: bigger is more urgent).
pub const RT_PRIO_MIN: u8 = 1;
/// The highest RT priority.
pub const RT_PRIO_MAX: u8 = 99;
/// The weight of a default fair task (Linux's nice 0).
pub const NICE_0_WEIGHT: u32 = 1024;
/// The largest fair weight accepted (Linux's nice -20 is 88761).
pub const MAX_WEIGHT: u32 = 1 << 20;

/// A scheduling policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// RT first-in first-out: runs until it blocks, yields or a higher
    /// priority preempts it.
    Fifo(u8),
    /// RT round-robin: like FIFO, with a time slice among equal priorities.
    Rr(u8),
    /// Fair share by weight (CFS-style virtual runtime).
    Fair(u32),
}

impl Default for Policy {
    fn default() -> Self {
        Policy::Fair(NICE_0_WEIGHT)
    }
}

/// cpupri level of an idle CPU.
pub const PRI_IDLE: u32 = 0;
/// cpupri level of a CPU running a fair task.
pub const PRI_FAIR: u32 = 1;
/// Number of cpupri levels: idle, fair, RT 1..=99.
pub const NR_PRI: usize = 101;

impl Policy {
    /// Checks the ranges: RT priority 1..=99, weight 1..=2^20.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Policy::Fifo(p) | Policy::Rr(p) if !(RT_PRIO_MIN..=RT_PRIO_MAX).contains(&p) => Err(
                SchedError::Policy(format!("RT priority {p} is outside 1..=99")),
            ),
            Policy::Fair(w) if w == 0 || w > MAX_WEIGHT => Err(SchedError::Policy(format!(
                "fair weight {w} is outside 1..={MAX_WEIGHT} (1024 is the default)"
            ))),
            _ => Ok(()),
        }
    }

    /// Is this an RT policy?
    pub fn is_rt(&self) -> bool {
        !matches!(self, Policy::Fair(_))
    }

    /// The RT priority, or 0 for fair tasks.
    pub fn rt_prio(&self) -> u8 {
        match *self {
            Policy::Fifo(p) | Policy::Rr(p) => p,
            Policy::Fair(_) => 0,
        }
    }

    /// The fair weight ([`NICE_0_WEIGHT`] for RT tasks, for load tracking).
    pub fn weight(&self) -> u32 {
        match *self {
            Policy::Fair(w) => w,
            _ => NICE_0_WEIGHT,
        }
    }

    /// The cpupri level: 1 for fair, 1 + priority for RT (0 is idle).
    /// Bigger is more urgent.
    pub fn pri_idx(&self) -> u32 {
        match *self {
            Policy::Fair(_) => PRI_FAIR,
            Policy::Fifo(p) | Policy::Rr(p) => PRI_FAIR + p as u32,
        }
    }

    pub(crate) fn encode(&self) -> u64 {
        match *self {
            Policy::Fifo(p) => (1 << 32) | p as u64,
            Policy::Rr(p) => (2 << 32) | p as u64,
            Policy::Fair(w) => w as u64,
        }
    }

    pub(crate) fn decode(v: u64) -> Policy {
        match v >> 32 {
            1 => Policy::Fifo(v as u8),
            2 => Policy::Rr(v as u8),
            _ => Policy::Fair(v as u32),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Fifo(p) => write!(f, "fifo:{p}"),
            Policy::Rr(p) => write!(f, "rr:{p}"),
            Policy::Fair(w) => write!(f, "fair:{w}"),
        }
    }
}

/// What to create: a task's policy, affinity, group and name.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskSpec {
    /// A name for reports (`vm3/vcpu5`).
    pub name: String,
    /// The policy.
    pub policy: Policy,
    /// Allowed CPUs; `None` means every CPU of the scheduler.
    pub affinity: Option<CpuMask>,
    /// The group (VM).
    pub group: GroupId,
}

impl TaskSpec {
    /// A fair task with the default weight, any CPU, the root group.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            policy: Policy::default(),
            affinity: None,
            group: GroupId::ROOT,
        }
    }
    /// With this policy.
    pub fn policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// With this affinity.
    pub fn affinity(mut self, m: CpuMask) -> Self {
        self.affinity = Some(m);
        self
    }
    /// In this group.
    pub fn group(mut self, g: GroupId) -> Self {
        self.group = g;
        self
    }
}

/// Where a task is, as the invariant checker and reports see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Not runnable (new, or waiting to be woken).
    Blocked,
    /// Claimed by a waker, on its way to a runqueue (possibly on a wake list).
    Waking,
    /// Runnable, waiting on a runqueue.
    Queued,
    /// The current task of a CPU.
    Running,
    /// Finished.
    Exited,
}

impl TaskState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            TaskState::Blocked => "blocked",
            TaskState::Waking => "waking",
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Exited => "exited",
        }
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn policy_ranges() {
        assert!(Policy::Fifo(1).validate().is_ok());
        assert!(Policy::Rr(99).validate().is_ok());
        assert!(Policy::Fifo(0).validate().is_err());
        let e = Policy::Rr(100).validate().unwrap_err().to_string();
        assert!(e.contains("1..=99"), "{e}");
        assert!(Policy::Fair(0).validate().is_err());
        assert!(Policy::Fair(MAX_WEIGHT + 1).validate().is_err());
        assert!(Policy::Fair(1).validate().is_ok());
    }

    #[test]
    fn pri_idx_orders_classes() {
        assert!(Policy::Fifo(99).pri_idx() > Policy::Fifo(1).pri_idx());
        assert!(Policy::Fifo(1).pri_idx() > Policy::Fair(88761).pri_idx());
        assert_eq!(Policy::Fair(1).pri_idx(), PRI_FAIR);
        const { assert!(PRI_FAIR > PRI_IDLE) };
        assert_eq!(Policy::Rr(99).pri_idx() as usize, NR_PRI - 1);
        for p in [
            Policy::Fifo(7),
            Policy::Rr(99),
            Policy::Fair(1024),
            Policy::Fair(1),
        ] {
            assert_eq!(Policy::decode(p.encode()), p);
        }
    }
}
