//! The task table: one fixed slot per task, preallocated, indexed by
//! [`TaskId`](crate::TaskId). Slots are reused after removal.
//!
//! A task's scheduling state is one atomic word (state plus a "wake
//! pending" bit), changed with compare-and-swap so that a waker can claim a
//! blocked task, or leave a pending wake on a runnable one, without any
//! lock. Which lock protects the rest depends on the state, as in Linux:
//! a queued or running task's placement is protected by its runqueue's
//! lock; a blocked task belongs to nobody; a waking task belongs to the
//! waker that claimed it until it reaches a runqueue. The affinity mask has
//! a leaf lock of its own, held across the check that a woken task may run
//! on the CPU it is being enqueued on, so that an affinity change never
//! slips between check and enqueue.

use crate::sync::shared::Mutex;
use crate::sync::shared::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::cpumask::CpuMask;
use crate::stats::{Histogram, TaskStats};
use crate::sync;
use crate::task::{Policy, TaskState};
use crate::wakelist::NIL;

pub(crate) const ST_BLOCKED: u32 = 0;
pub(crate) const ST_WAKING: u32 = 1;
pub(crate) const ST_QUEUED: u32 = 2;
pub(crate) const ST_RUNNING: u32 = 3;
pub(crate) const ST_EXITED: u32 = 4;
pub(crate) const ST_FREE: u32 = 5;
pub(crate) const ST_MASK: u32 = 0xff;
/// A wake arrived while the task was not blocked: its next block returns at once.
pub(crate) const PENDING: u32 = 1 << 8;

pub(crate) fn state_of(code: u32) -> TaskState {
    match code & ST_MASK {
        ST_BLOCKED => TaskState::Blocked,
        ST_WAKING => TaskState::Waking,
        ST_QUEUED => TaskState::Queued,
        ST_RUNNING => TaskState::Running,
        _ => TaskState::Exited,
    }
}

pub(crate) use crate::sync::lock;

/// Significant digits of a task's wake-to-run histogram (1%: see the
/// histogram module's docs for why not 3).
pub(crate) const TASK_DIGITS: u8 = 2;

/// Per-task accounting, written by whoever handles the task at the time.
pub(crate) struct TaskAcct {
    pub(crate) runs: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) migrations: AtomicU64,
    pub(crate) preemptions: AtomicU64,
    /// Time per state code (blocked, waking, queued, running).
    pub(crate) time: [AtomicU64; 4],
    pub(crate) acct_state: AtomicU32,
    pub(crate) since: AtomicU64,
    /// When the pending wakeup happened (0: none).
    pub(crate) woken_at: AtomicU64,
    /// Written by whoever runs the task (under its runqueue lock), at
    /// every switch to it: [`TASK_DIGITS`] digits keep it small enough that
    /// hundreds of tasks' histograms do not evict the scheduler's lines.
    pub(crate) wake_to_run: Mutex<Histogram>,
}

impl TaskAcct {
    fn new() -> Self {
        Self {
            runs: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            migrations: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            time: std::array::from_fn(|_| AtomicU64::new(0)),
            acct_state: AtomicU32::new(ST_BLOCKED),
            since: AtomicU64::new(0),
            woken_at: AtomicU64::new(0),
            wake_to_run: Mutex::new(Histogram::with_digits(TASK_DIGITS)),
        }
    }

    /// Charges the time since the last transition to the old state.
    #[inline]
    pub(crate) fn transition(&self, to: u32, now: u64) {
        let from = self.acct_state.swap(to, Ordering::Relaxed);
        let since = self.since.swap(now, Ordering::Relaxed);
        if (from as usize) < 4 {
            self.time[from as usize].fetch_add(now.saturating_sub(since), Ordering::Relaxed);
        }
    }

    fn reset(&self, now: u64) {
        for x in [
            &self.runs,
            &self.wakeups,
            &self.migrations,
            &self.preemptions,
        ] {
            x.store(0, Ordering::Relaxed);
        }
        for t in &self.time {
            t.store(0, Ordering::Relaxed);
        }
        self.acct_state.store(ST_BLOCKED, Ordering::Relaxed);
        self.since.store(now, Ordering::Relaxed);
        self.woken_at.store(0, Ordering::Relaxed);
        *lock(&self.wake_to_run) = Histogram::with_digits(TASK_DIGITS);
    }
}

/// Turns in a row that ended preempted, without a block between them,
/// from which a task counts as CPU-bound ([`Task::is_hog`]). One or two
/// are common for a task that wakes for a short job (an idle vCPU's tick)
/// and is preempted by another wakeup before it blocks again; a CPU hog
/// reaches three within a few slices.
pub(crate) const HOG_TURNS: u32 = 3;

/// One task slot.
#[repr(align(128))]
pub(crate) struct Task {
    pub(crate) state: AtomicU32,
    /// The runqueue the task is on (queued, running) or last ran on.
    pub(crate) cpu: AtomicU32,
    pub(crate) policy: AtomicU64,
    pub(crate) group: AtomicU32,
    pub(crate) nr_allowed: AtomicU32,
    /// The affinity mask folded onto 64 bits ([`CpuMask::fold64`]), kept
    /// with it: a lock-free hint of where the task may not run.
    pub(crate) aff_fold: AtomicU64,
    /// Absolute virtual runtime while on a runqueue; relative to the
    /// runqueue's `min_vruntime` (as i64 bits) while off one.
    pub(crate) vruntime: AtomicU64,
    /// Counted as pushable by its runqueue (set and cleared under its lock).
    pub(crate) pushable: AtomicBool,
    /// Its turns on a CPU since it last blocked that ended with it still
    /// runnable (preempted): from [`HOG_TURNS`] on it counts as CPU-bound.
    /// Written by the CPU that ran it, under that CPU's runqueue lock;
    /// read by the busy balance.
    pub(crate) preempted_turns: AtomicU32,
    /// Has an entry in a shared runqueue.
    pub(crate) in_shared: AtomicBool,
    /// Wake-list link.
    pub(crate) wake_next: sync::AtomicU32,
    /// Bumped on every enqueue (the checker tells waiting periods apart).
    pub(crate) enqueue_seq: AtomicU64,
    pub(crate) affinity: Mutex<CpuMask>,
    pub(crate) name: Mutex<String>,
    pub(crate) acct: TaskAcct,
}

impl Task {
    fn new() -> Self {
        Self {
            state: AtomicU32::new(ST_FREE),
            cpu: AtomicU32::new(0),
            policy: AtomicU64::new(Policy::default().encode()),
            group: AtomicU32::new(0),
            nr_allowed: AtomicU32::new(0),
            aff_fold: AtomicU64::new(u64::MAX),
            vruntime: AtomicU64::new(0),
            pushable: AtomicBool::new(false),
            preempted_turns: AtomicU32::new(0),
            in_shared: AtomicBool::new(false),
            wake_next: sync::AtomicU32::new(NIL),
            enqueue_seq: AtomicU64::new(0),
            affinity: Mutex::new(CpuMask::empty()),
            name: Mutex::new(String::new()),
            acct: TaskAcct::new(),
        }
    }

    /// CPU-bound for now: fair, and its last [`HOG_TURNS`] turns or more
    /// ended preempted, with no block between them.
    #[inline]
    pub(crate) fn is_hog(&self) -> bool {
        self.preempted_turns.load(Ordering::Relaxed) >= HOG_TURNS
            && matches!(self.policy(), Policy::Fair(_))
    }

    #[inline]
    pub(crate) fn policy(&self) -> Policy {
        Policy::decode(self.policy.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn code(&self) -> u32 {
        self.state.load(Ordering::Acquire) & ST_MASK
    }

    /// Moves to `to`, keeping the pending bit (or dropping it if `clear_pending`).
    #[inline]
    pub(crate) fn set_state(&self, to: u32, clear_pending: bool) {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            let keep = if clear_pending { 0 } else { s & PENDING };
            match self.state.compare_exchange_weak(
                s,
                to | keep,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(x) => s = x,
            }
        }
    }

    #[inline]
    pub(crate) fn allowed(&self, cpu: u32) -> bool {
        lock(&self.affinity).contains(cpu)
    }

    #[inline]
    pub(crate) fn affinity(&self) -> CpuMask {
        *lock(&self.affinity)
    }

    pub(crate) fn stats(&self) -> TaskStats {
        let t = |i: usize| self.acct.time[i].load(Ordering::Relaxed);
        TaskStats {
            name: lock(&self.name).clone(),
            runs: self.acct.runs.load(Ordering::Relaxed),
            wakeups: self.acct.wakeups.load(Ordering::Relaxed),
            migrations: self.acct.migrations.load(Ordering::Relaxed),
            preemptions: self.acct.preemptions.load(Ordering::Relaxed),
            blocked_ns: t(0),
            waking_ns: t(1),
            queued_ns: t(2),
            running_ns: t(3),
            run_delay_ns: t(1) + t(2),
            wake_to_run: lock(&self.acct.wake_to_run).clone(),
        }
    }
}

/// The table.
pub(crate) struct TaskTable {
    pub(crate) slots: Box<[Task]>,
    free: Mutex<Vec<u32>>,
    /// How affinity masks fold onto `aff_fold` ([`CpuMask::fold_shift`]
    /// of the number of CPUs).
    pub(crate) fold_shift: u32,
}

impl TaskTable {
    pub(crate) fn new(cap: usize, ncpus: usize) -> Self {
        Self {
            slots: (0..cap).map(|_| Task::new()).collect(),
            free: Mutex::new((0..cap as u32).rev().collect()),
            fold_shift: CpuMask::fold_shift(ncpus),
        }
    }

    /// Takes a free slot and initialises it as blocked.
    pub(crate) fn alloc(
        &self,
        name: &str,
        policy: Policy,
        group: u32,
        affinity: CpuMask,
        cpu: u32,
        now: u64,
    ) -> Option<u32> {
        let id = lock(&self.free).pop()?;
        let t = &self.slots[id as usize];
        t.cpu.store(cpu, Ordering::Relaxed);
        t.policy.store(policy.encode(), Ordering::Relaxed);
        t.group.store(group, Ordering::Relaxed);
        t.nr_allowed.store(affinity.count(), Ordering::Relaxed);
        t.aff_fold
            .store(affinity.fold64(self.fold_shift), Ordering::Relaxed);
        t.vruntime.store(0, Ordering::Relaxed);
        t.pushable.store(false, Ordering::Relaxed);
        t.preempted_turns.store(0, Ordering::Relaxed);
        t.in_shared.store(false, Ordering::Relaxed);
        t.wake_next.store(NIL, sync::Ordering::Relaxed);
        *lock(&t.affinity) = affinity;
        *lock(&t.name) = name.to_string();
        t.acct.reset(now);
        t.state.store(ST_BLOCKED, Ordering::Release);
        Some(id)
    }

    pub(crate) fn release(&self, id: u32) {
        lock(&self.free).push(id);
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&Task> {
        self.slots.get(id as usize)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }
}
