//! Tunables of the scheduler core. Defaults follow Linux where it has an
//! equivalent.

use serde::{Deserialize, Serialize};

use crate::error::{Result, SchedError};

/// Scheduler tunables.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedConfig {
    /// Capacity of the task table.
    pub max_tasks: usize,
    /// Capacity of the group table.
    pub max_groups: usize,
    /// CPUs per shared-runqueue shard when fix 3 is on (default 6, as measured).
    pub shard_size: usize,
    /// With fix 1, also split each cpupri mask per NUMA node.
    pub cpupri_node_masks: bool,
    /// RR time slice (Linux: 100 ms).
    pub rr_timeslice_ns: u64,
    /// Fair scheduling period target (Linux `sched_latency`: 6 ms).
    pub fair_latency_ns: u64,
    /// Shortest fair slice (Linux `sched_min_granularity`: 0.75 ms).
    pub fair_min_granularity_ns: u64,
    /// A woken fair task preempts when its virtual runtime is this much
    /// behind the current one (Linux `sched_wakeup_granularity`: 1 ms).
    pub wakeup_granularity_ns: u64,
    /// How often a busy CPU with waiting tasks looks for an idle CPU to kick
    /// (idle load balancing).
    pub balance_interval_ns: u64,
    /// How many CPUs an idle CPU looks at when it steals work.
    pub steal_scan_limit: usize,
    /// A fair wakeup sent to a busy CPU that it would not preempt goes on
    /// that CPU's deferred wake list without a kick; the CPU takes it at
    /// its next schedule, the next entry of its body, or its next tick
    /// (see `fixes/l2wake.rs`). Off: every wake-list push that finds the
    /// list empty kicks, as Linux's remote wakeups send an IPI. The
    /// simulator runs with it off (the seeds' protocol, which its recorded
    /// results reproduce); the executors run with it on.
    #[serde(default = "yes")]
    pub lazy_fair_kicks: bool,
    /// A woken fair task is credited the time it slept, up to half of
    /// `fair_latency_ns`, before it is placed (so that a vCPU back from a
    /// short sleep can preempt a CPU hog). Off: it comes back with the
    /// virtual runtime it left with, relative to its new runqueue. Off
    /// by default: measured worse on messaging and runq at 4x overcommit
    /// (docs/results-vcpus.md, "Lazy kicks").
    #[serde(default)]
    pub sleeper_credit: bool,
    /// A woken fair task may preempt the fair task running on its CPU
    /// (when it is `wakeup_granularity_ns` behind it), as CFS's wakeup
    /// preemption. Off: a fair wakeup never preempts a fair task; the
    /// woken task waits until the running one's slice ends (a tick) or it
    /// blocks, and is then picked by virtual runtime, so that with
    /// `sleeper_credit` it goes first: the order EEVDF gives a woken task
    /// with lag, without the extra switch (Linux's RUN_TO_PARITY). An
    /// idle CPU and RT wakeups are unaffected. On by default: off, with
    /// sleeper credit, measured within noise on the x4 workloads
    /// (docs/results-vcpus.md, "Wake order").
    #[serde(default = "yes")]
    pub fair_wakeup_preempt: bool,
    /// The running fair task's slice follows its runqueue: when a fair
    /// task joins a runqueue whose current task is fair, that task's
    /// slice end moves in to what its slice is with the new load
    /// (`fair_latency_ns` shared by weight, at least
    /// `fair_min_granularity_ns`), as CFS recomputes `sched_slice` at
    /// every tick. Off: a slice is sized once, when it starts, by the
    /// load queued then, so a task that started alone keeps a whole
    /// `fair_latency_ns` while others wake up behind it. Off by default:
    /// measured with no effect on the x4 workloads' throughput nor on
    /// their "wake -> picked" tail (docs/results-vcpus.md, "Slices that
    /// follow the load").
    #[serde(default)]
    pub slice_follows_load: bool,
    /// The RT pull of a CPU that lowers its priority takes a source's
    /// runqueue lock only if it is free: a source whose lock another
    /// thread holds is passed by and asked to push instead (see
    /// `sched/balance.rs`, `pull_rt`). Off: the pull waits for the lock,
    /// as Linux's `pull_rt_task` spins on `double_lock_balance`. The
    /// simulator runs with it off (its recorded results were made that
    /// way); the executors run with it on.
    #[serde(default = "yes")]
    pub bounded_rt_pull: bool,
    /// A busy CPU with fair tasks waiting and no idle CPU to take one
    /// hands one, every `balance_interval_ns`, to a busy CPU of its LLC or
    /// node with at least two fewer waiting (see `sched/balance.rs`,
    /// `busy_push`; Linux's `load_balance` from busy CPUs). Off: a fair
    /// task moves only into an idle CPU, so tasks that never block can
    /// stay 3 to a CPU next to a CPU running 1. Off in these defaults:
    /// `vmm serve`, where VMs share the CPUs, turns it on (4 Linux VMs
    /// booting at once without it left one VM without a CPU for minutes);
    /// one VM alone (`vmm run`) boots faster without it (about 5% with
    /// the CPU-bound rule, 13% with the first rule; docs/results-vcpus.md,
    /// "Busy balance"). The simulator runs with it off (its recorded
    /// results).
    #[serde(default)]
    pub busy_balance: bool,
}

fn yes() -> bool {
    true
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            max_tasks: 4096,
            max_groups: 1024,
            shard_size: 6,
            cpupri_node_masks: true,
            rr_timeslice_ns: 100_000_000,
            fair_latency_ns: 6_000_000,
            fair_min_granularity_ns: 750_000,
            wakeup_granularity_ns: 1_000_000,
            balance_interval_ns: 4_000_000,
            steal_scan_limit: 64,
            lazy_fair_kicks: true,
            sleeper_credit: false,
            fair_wakeup_preempt: true,
            slice_follows_load: false,
            bounded_rt_pull: true,
            busy_balance: false,
        }
    }
}

impl SchedConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(SchedError::Config(s));
        if self.max_tasks == 0 || self.max_tasks > (u32::MAX / 2) as usize {
            return bad(format!("max_tasks {} must be 1..2^31", self.max_tasks));
        }
        if self.max_groups == 0 || self.max_groups > 1 << 20 {
            return bad(format!("max_groups {} must be 1..=2^20", self.max_groups));
        }
        if self.shard_size == 0 {
            return bad("shard_size must be at least 1 (default 6)".into());
        }
        if self.fair_min_granularity_ns == 0 || self.rr_timeslice_ns == 0 {
            return bad("time slices must be positive".into());
        }
        if self.steal_scan_limit == 0 {
            return bad("steal_scan_limit must be at least 1".into());
        }
        Ok(())
    }
}
