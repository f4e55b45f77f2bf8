//! Per-CPU data: the runqueue (behind its lock), the hot fields that other
//! CPUs read without the lock, the wake list head that remote wakers write,
//! and the CPU's counters. Each is a named type on cache lines of its own,
//! because each has a different set of writers.

use crate::sync::shared::Mutex;
use crate::sync::shared::{AtomicBool, AtomicU32, AtomicU64};

use crate::fair_rq::FairRq;
use crate::rt_rq::RtRq;
use crate::stats::CpuStats;
use crate::task::PRI_IDLE;
use crate::wakelist::WakeList;

/// "No task" in atomics that hold a task id.
pub(crate) const NO_TASK: u32 = u32::MAX;

/// A runqueue. Only touched under [`RqLock`].
#[derive(Debug)]
pub(crate) struct Rq {
    pub(crate) cpu: u32,
    /// The current task; it is in no queue.
    pub(crate) curr: Option<u32>,
    /// The cpupri level this CPU is registered at.
    pub(crate) curr_pri: u32,
    pub(crate) rt: RtRq,
    pub(crate) fair: FairRq,
    /// When the current task's runtime was last charged.
    pub(crate) exec_start: u64,
    /// When the current task's slice began.
    pub(crate) slice_start: u64,
    /// Registered as RT-overloaded.
    pub(crate) overloaded: bool,
    /// Idle (no current task).
    pub(crate) idle: bool,
    /// In the idle tracker's set: entered when the CPU went idle, left at
    /// its first `schedule` after a tick found it busy (see
    /// [`crate::idle`]).
    pub(crate) in_idle_set: bool,
    /// `schedule` dropped the lock to balance; `curr` is already `None` but
    /// cpupri and idle still show the old state.
    pub(crate) in_balance: bool,
    /// The busy balance: since when this CPU has held at least two more
    /// CPU-bound tasks than a busy neighbour, and when it last saw that
    /// (a gap of two balance intervals starts the streak again).
    pub(crate) hog_excess_since: u64,
    pub(crate) hog_excess_seen: u64,
    pub(crate) clock: u64,
}

impl Rq {
    pub(crate) fn new(cpu: u32) -> Self {
        Self {
            cpu,
            curr: None,
            curr_pri: PRI_IDLE,
            rt: RtRq::new(),
            fair: FairRq::default(),
            exec_start: 0,
            slice_start: 0,
            overloaded: false,
            idle: true,
            in_idle_set: true,
            in_balance: false,
            hog_excess_since: 0,
            hog_excess_seen: 0,
            clock: 0,
        }
    }

    /// Waiting tasks.
    pub(crate) fn nr_queued(&self) -> u32 {
        self.rt.len() + self.fair.len() as u32
    }
}

/// The runqueue lock, alone on its lines (the lock word and the queues it
/// protects are written by whoever holds it).
#[repr(align(128))]
pub struct RqLock {
    pub(crate) lock: Mutex<Rq>,
}

/// Fields of a CPU that others read without its lock: placement reads
/// `idle` and `curr_pri`, balancing reads the queue lengths, kickers write
/// `need_resched`. Mostly written by the CPU itself.
#[repr(align(128))]
pub struct CpuHot {
    pub(crate) need_resched: AtomicBool,
    pub(crate) idle: AtomicBool,
    pub(crate) curr_pri: AtomicU32,
    pub(crate) curr: AtomicU32,
    pub(crate) nr_queued: AtomicU32,
    pub(crate) nr_fair_queued: AtomicU32,
    pub(crate) nr_rt_queued: AtomicU32,
    /// The priority index of the most urgent waiting RT task (0: none),
    /// Linux's `rt.highest_prio.next`: pullers skip this CPU without its
    /// lock when it has nothing more urgent than what they run.
    pub(crate) rt_queued_pri: AtomicU32,
    /// The waiting RT tasks' affinity masks, each folded onto 64 bits and
    /// OR-ed ([`CpuMask::fold64`](crate::CpuMask::fold64)): a puller whose
    /// bit is clear is allowed to run none of them and skips this CPU
    /// without its lock (see `pull_rt`).
    pub(crate) rt_queued_fold: AtomicU64,
    /// A CPU is pulling (RT) or stealing (fair) from this one: at most one
    /// at a time; the others pass it by instead of queueing on its
    /// runqueue lock.
    pub(crate) pull_busy: AtomicBool,
    /// A puller that passed this CPU by (another was pulling from it) and
    /// found nothing elsewhere asks it to push its waiting RT tasks at its
    /// next `schedule` (Linux's RT_PUSH_IPI, for the contended case).
    pub(crate) push_request: AtomicBool,
    /// Busy, but still in the idle tracker's set (read lock-free by the
    /// CPU's tick).
    pub(crate) idle_set_stale: AtomicBool,
    /// A tick found this CPU busy and still in the idle tracker's set: its
    /// next `schedule`, under its runqueue lock, takes it out.
    pub(crate) idle_set_leave: AtomicBool,
    /// A busy CPU that kicked this idle one to take work.
    pub(crate) balance_hint: AtomicU32,
    /// When the tick next needs the slow path for the current task.
    pub(crate) slice_end: AtomicU64,
    pub(crate) next_balance: AtomicU64,
    /// Bumped on every change of the current task.
    pub(crate) switch_seq: AtomicU64,
}

impl CpuHot {
    fn new() -> Self {
        Self {
            need_resched: AtomicBool::new(false),
            idle: AtomicBool::new(true),
            curr_pri: AtomicU32::new(PRI_IDLE),
            curr: AtomicU32::new(NO_TASK),
            nr_queued: AtomicU32::new(0),
            nr_fair_queued: AtomicU32::new(0),
            nr_rt_queued: AtomicU32::new(0),
            rt_queued_pri: AtomicU32::new(0),
            rt_queued_fold: AtomicU64::new(0),
            pull_busy: AtomicBool::new(false),
            push_request: AtomicBool::new(false),
            idle_set_stale: AtomicBool::new(false),
            idle_set_leave: AtomicBool::new(false),
            balance_hint: AtomicU32::new(NO_TASK),
            slice_end: AtomicU64::new(u64::MAX),
            next_balance: AtomicU64::new(0),
            switch_seq: AtomicU64::new(0),
        }
    }
}

/// A CPU's wake lists, alone on their lines: remote wakers write them.
#[repr(align(128))]
pub struct WakeListHead {
    /// Woken tasks that came with a kick (the first push onto an empty
    /// list sends it).
    pub(crate) list: WakeList,
    /// Fair tasks woken onto this CPU while it was busy with a task they
    /// would not preempt: no kick; taken at the CPU's next schedule, body
    /// entry or tick ([`SchedConfig::lazy_fair_kicks`](crate::SchedConfig)).
    pub(crate) deferred: WakeList,
    /// The fair runqueue's `min_vruntime` as of the owner's last update
    /// (written under its runqueue lock, only with lazy kicks on): a
    /// remote waker places a woken task against it to guess whether it
    /// would preempt. Never ahead of the real one, so a stale value only
    /// errs towards a kick.
    pub(crate) min_vruntime: AtomicU64,
}

/// Everything one CPU has.
pub(crate) struct PerCpu {
    pub(crate) rq: RqLock,
    pub(crate) hot: CpuHot,
    pub(crate) wake: WakeListHead,
    pub(crate) stats: CpuStats,
}

impl PerCpu {
    pub(crate) fn new(cpu: u32) -> Self {
        Self {
            rq: RqLock {
                lock: Mutex::new(Rq::new(cpu)),
            },
            hot: CpuHot::new(),
            wake: WakeListHead {
                list: WakeList::new(),
                deferred: WakeList::new(),
                min_vruntime: AtomicU64::new(0),
            },
            stats: CpuStats::default(),
        }
    }
}
