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
    /// Fair scheduling period target (Linux `sched_latency`: 6 ms), before
    /// [`fair_slice_scaling`](Self::fair_slice_scaling).
    pub fair_latency_ns: u64,
    /// Shortest fair slice (Linux `sched_min_granularity`: 0.75 ms), before
    /// [`fair_slice_scaling`](Self::fair_slice_scaling).
    pub fair_min_granularity_ns: u64,
    /// A woken fair task preempts when its virtual runtime is this much
    /// behind the current one (Linux `sched_wakeup_granularity`: 1 ms),
    /// before [`fair_slice_scaling`](Self::fair_slice_scaling).
    pub wakeup_granularity_ns: u64,
    /// How the three fair bounds above grow with the number of CPUs the
    /// scheduler runs (Linux's `sched_tunable_scaling`). The default,
    /// [`SliceScaling::Log`], multiplies them by 1 + log2(min(CPUs, 8)), as
    /// Linux does at boot: 2x on 2 CPUs, 4x from 8 CPUs on. Measured at 4x
    /// overcommit on 2 CPUs, the unscaled bounds gave a pinged guest twice
    /// the host kernel's switches for the same CPU time (docs/results-vcpus.md,
    /// "Slice bounds that grow with the CPUs"). The simulator runs with
    /// [`SliceScaling::None`] (its recorded results).
    #[serde(default)]
    pub fair_slice_scaling: SliceScaling,
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

/// How the fair bounds of [`SchedConfig`] grow with the number of CPUs
/// (Linux's `sched_tunable_scaling`, without its linear mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SliceScaling {
    /// The bounds as configured, whatever the number of CPUs.
    None,
    /// The bounds times 1 + log2(min(CPUs, 8)) (Linux's default,
    /// `SCHED_TUNABLESCALING_LOG`).
    #[default]
    Log,
}

impl SliceScaling {
    /// What the bounds are multiplied by on `ncpus` CPUs.
    pub fn factor(self, ncpus: usize) -> u64 {
        match self {
            Self::None => 1,
            // ilog2 of 1..=8: 0..=3
            Self::Log => 1 + u64::from(ncpus.clamp(1, 8).ilog2()),
        }
    }

    /// `none` or `log`, as the command line and the reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Log => "log",
        }
    }
}

impl std::fmt::Display for SliceScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SliceScaling {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "log" => Ok(Self::Log),
            _ => Err(format!(
                "fair slice scaling {s:?}: give log (the bounds times 1 + log2(min(CPUs, 8)), \
                 Linux's default) or none (the bounds as given)"
            )),
        }
    }
}

/// The fair bounds a scheduler runs with: [`SchedConfig`]'s, scaled for its
/// CPUs ([`SchedConfig::fair_bounds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FairBounds {
    /// The period fair slices are cut from, ns.
    pub latency_ns: u64,
    /// The shortest fair slice, ns.
    pub min_granularity_ns: u64,
    /// How far behind in virtual runtime a woken task must be to preempt, ns.
    pub wakeup_granularity_ns: u64,
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
            fair_slice_scaling: SliceScaling::Log,
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
    /// The fair bounds on `ncpus` CPUs: the configured ones times
    /// [`fair_slice_scaling`](Self::fair_slice_scaling)'s factor.
    pub fn fair_bounds(&self, ncpus: usize) -> FairBounds {
        let f = self.fair_slice_scaling.factor(ncpus);
        FairBounds {
            latency_ns: self.fair_latency_ns.saturating_mul(f),
            min_granularity_ns: self.fair_min_granularity_ns.saturating_mul(f),
            wakeup_granularity_ns: self.wakeup_granularity_ns.saturating_mul(f),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_scaling_follows_linux_and_stops_at_eight_cpus() {
        let f: Vec<u64> = [1, 2, 3, 4, 7, 8, 9, 480]
            .iter()
            .map(|&n| SliceScaling::Log.factor(n))
            .collect();
        assert_eq!(f, [1, 2, 2, 3, 3, 4, 4, 4]);
        assert_eq!(SliceScaling::None.factor(480), 1);
        let c = SchedConfig::default();
        assert_eq!(
            c.fair_bounds(2),
            FairBounds {
                latency_ns: 12_000_000,
                min_granularity_ns: 1_500_000,
                wakeup_granularity_ns: 2_000_000
            }
        );
        let none = SchedConfig {
            fair_slice_scaling: SliceScaling::None,
            ..c
        };
        assert_eq!(none.fair_bounds(480).latency_ns, 6_000_000);
        assert_eq!("log".parse::<SliceScaling>(), Ok(SliceScaling::Log));
        assert!("linear"
            .parse::<SliceScaling>()
            .unwrap_err()
            .contains("give log"));
    }
}
