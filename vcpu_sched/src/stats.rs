//! Counters and histograms: per task (run delay, wake-to-run latency,
//! migrations, time in each state) and per CPU (what the scheduler did).
//!
//! Nothing here is a shared hot counter. A task's counters are written by
//! whichever CPU is handling that task at the time (under its runqueue lock
//! or its wake claim); a CPU's counters are written by code acting as that
//! CPU. Relaxed atomics only make the occasional concurrent reader sound.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

pub use crate::histogram::Histogram;

/// One task's scheduling statistics.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TaskStats {
    /// The task's name.
    pub name: String,
    /// Times it was picked to run after not running.
    pub runs: u64,
    /// Times it was woken from blocked.
    pub wakeups: u64,
    /// Times it changed CPU.
    pub migrations: u64,
    /// Times it was switched out while still runnable (preempted, time
    /// slice, affinity change).
    pub preemptions: u64,
    /// Time blocked.
    pub blocked_ns: u64,
    /// Time between being woken and reaching a runqueue (wake lists).
    pub waking_ns: u64,
    /// Time waiting on a runqueue.
    pub queued_ns: u64,
    /// Time running.
    pub running_ns: u64,
    /// Time runnable but not running: `waking_ns + queued_ns` (Linux's
    /// schedstat run delay).
    pub run_delay_ns: u64,
    /// From wakeup to running, per wakeup.
    pub wake_to_run: Histogram,
}

macro_rules! cpu_counters {
    ($( $(#[$m:meta])* $f:ident ),* $(,)?) => {
        /// One CPU's counters of scheduler activity, alone on its lines,
        /// written by code acting as that CPU.
        #[repr(align(128))]
        #[derive(Default)]
        pub struct CpuStats {
            $( $(#[$m])* pub(crate) $f: AtomicU64, )*
        }

        /// Scheduler counters, summed over CPUs (or of one CPU).
        /// A report written before a counter existed reads it as 0.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct SchedCounters {
            $( $(#[$m])* pub $f: u64, )*
        }

        impl CpuStats {
            /// A snapshot.
            pub fn snapshot(&self) -> SchedCounters {
                SchedCounters { $( $f: self.$f.load(Ordering::Relaxed), )* }
            }
        }

        impl SchedCounters {
            /// Adds `o` field by field.
            pub fn add(&mut self, o: &SchedCounters) {
                $( self.$f += o.$f; )*
            }
            /// `self - o` field by field (saturating), for intervals.
            pub fn since(&self, o: &SchedCounters) -> SchedCounters {
                SchedCounters { $( $f: self.$f.saturating_sub(o.$f), )* }
            }
            /// (name, value) pairs, for tables.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($f), self.$f), )*]
            }
        }
    };
}

cpu_counters! {
    /// Context switches (a different task, or idle, became current).
    switches,
    /// Times the CPU went idle.
    idle_entries,
    /// Wakeups the waker enqueued directly.
    wake_direct,
    /// Wakeups the waker queued on the target's wake list.
    wake_queued,
    /// Kicks sent because a wake list went from empty to non-empty (or,
    /// with lazy kicks, because a deferred wakeup's target was idle).
    wake_kicks,
    /// Fair wakeups queued on a busy CPU's deferred wake list without a
    /// kick (lazy kicks: they would not have preempted).
    wake_deferred,
    /// Tasks taken off this CPU's wake list.
    wake_drained,
    /// Woken tasks forwarded because their affinity changed in flight.
    wake_forwarded,
    /// RT tasks pushed away from this CPU.
    rt_pushes,
    /// RT tasks pulled to this CPU.
    rt_pulls,
    /// RT pull sources passed by because another thread held their
    /// runqueue lock (bounded RT pull).
    rt_pull_busy,
    /// Balancing sources (RT pull, idle steal) passed by because another
    /// CPU held their claim (`pull_busy`): the pass-by path.
    balance_passed_by,
    /// Pushes asked of a source by a puller that passed it by or found its
    /// lock held (`push_request` set where it was clear).
    push_requests,
    /// Fair tasks taken from the shared runqueue.
    shared_pops,
    /// Stale shared-runqueue entries dropped.
    shared_stale,
    /// Fair tasks stolen from a busy CPU while idle.
    steals,
    /// Idle CPUs kicked to balance (nohz-style).
    balance_kicks,
    /// Preemption requests sent (need_resched plus a kick).
    resched_kicks,
    /// Group-load migrations that wrote a shared counter.
    group_load_writes,
    /// Group-load migrations that wrote nothing (fix 6, same node).
    group_load_skips,
    /// Ticks that took the slow path.
    ticks_slow,
    /// RT overload updates (a CPU's pushable RT tasks appeared or went):
    /// each writes the overload counter, the root domain's one (baseline)
    /// or its node's (fix 2).
    rto_updates,
    /// Task migrations between CPUs that share an L2.
    migrations_l2,
    /// ... that share an LLC but not an L2.
    migrations_llc,
    /// ... on one NUMA node, not sharing an LLC.
    migrations_node,
    /// ... across NUMA nodes.
    migrations_remote,
    /// Waiting fair tasks a busy CPU handed to a less loaded busy CPU
    /// (`SchedConfig::busy_balance`).
    busy_pushes,
}
