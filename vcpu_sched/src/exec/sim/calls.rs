//! The interleaved simulator's calls and their state: what a simulated
//! CPU's core call is (`Op`), what it returned (`Out`), what follows it
//! (`Then`), and the calls in flight, their coroutines and the waits
//! (`Interleave`). The simulator's handling of them is in `interleave`.

use std::collections::{HashMap, VecDeque};

use corosensei::stack::DefaultStack;
use corosensei::Coroutine;

use super::queue::Ev;
use crate::sync::recorder::{Kind, Suspend};
use crate::{Pick, Prev, Scheduler, TaskId};

/// A coroutine's stack: the core's deepest call (a `schedule` that
/// balances) uses a few KiB; the rest is never touched (mmap'ed lazily).
pub(super) const STACK_BYTES: usize = 256 * 1024;

/// A core call a simulated CPU makes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    Wake {
        id: TaskId,
        waker: u32,
    },
    Schedule {
        prev: Prev,
    },
    Tick,
    /// A test's own code as a core call.
    #[cfg(test)]
    Probe(fn(&Scheduler, u32)),
}

/// What it returned.
pub(super) enum Out {
    Woke(crate::Result<bool>),
    Picked(crate::Result<Pick>),
    Ticked,
}

impl Op {
    pub(super) fn run(self, s: &Scheduler, cpu: u32, now: u64) -> Out {
        match self {
            Op::Wake { id, waker } => Out::Woke(s.wake(id, Some(waker), now)),
            Op::Schedule { prev } => Out::Picked(s.schedule(cpu, prev, now)),
            Op::Tick => {
                // a tick of a managed CPU cannot fail
                let _ = s.tick(cpu, now);
                Out::Ticked
            }
            #[cfg(test)]
            Op::Probe(f) => {
                f(s, cpu);
                Out::Ticked
            }
        }
    }
}

/// What the simulator does when a call returns.
#[derive(Clone, Copy, Debug)]
pub(super) enum Then {
    /// Nothing (a timer's wake).
    Nothing,
    /// The CPU's tick, which reached it at `at`: the running task is
    /// delayed by it.
    Tick { at: u64 },
    /// A wake: count it, then `next`.
    Woke { next: AfterWake },
    /// A `schedule`: run what it picked.
    Scheduled,
}

/// What the waking CPU does once its wake returned.
#[derive(Clone, Copy, Debug)]
pub(super) enum AfterWake {
    /// Its task goes on computing.
    Continue(TaskId),
    /// Its task blocks (or yields, per `Prev`): `schedule`.
    Schedule(Prev),
    /// The next wakeup of its plan.
    Step,
}

pub(super) type Co = Coroutine<(), Suspend, Out, DefaultStack>;

/// One call in flight.
pub(super) struct Slot {
    pub(super) co: Option<Co>,
    pub(super) cpu: u32,
    /// Whether the CPU waits for it (a timer's wake does not occupy its
    /// CPU, as when run to completion).
    pub(super) occupies: bool,
    pub(super) then: Then,
    pub(super) start: u64,
    /// The call's clock: when its next non-load may issue.
    pub(super) t: u64,
    /// When the loads of the current group are all back.
    pub(super) group_end: u64,
    /// When the plain stores in its store buffer have all reached their
    /// lines (a locked access waits for it).
    pub(super) drained: u64,
    pub(super) in_group: u32,
    /// An access waiting for virtual time to reach its issue: (model
    /// line, kind).
    pub(super) pending: Option<(u64, Kind)>,
    /// Its result, waiting for virtual time to reach its end.
    pub(super) done: Option<Out>,
    /// When it found a lock held.
    pub(super) blocked_at: u64,
    /// It was handed a lock and retries: if it finds it taken again (a
    /// caller barged in), it goes back to the head of the queue.
    pub(super) retrying: bool,
}

/// A call about to start: `cpu` makes core call `op` at `now` (`instr` ns
/// of instructions before its first access), `then` follows when it
/// returns, and `occupies` says whether the CPU waits for it. Kept in
/// `Interleave::parked` while the invariant checker waits for every call
/// to end.
#[derive(Clone, Copy, Debug)]
pub(super) struct CallStart {
    pub(super) cpu: u32,
    pub(super) now: u64,
    pub(super) instr: u64,
    pub(super) op: Op,
    pub(super) then: Then,
    pub(super) occupies: bool,
}

/// What interleaving did, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InterleaveStats {
    /// Accesses charged.
    pub accesses: u64,
    /// Times a call had to wait for another CPU's earlier event before an
    /// access could issue or its result be used (an event queued instead
    /// of going on at once).
    pub queued: u64,
    /// Writes that found their line in transfer or contended and waited
    /// for the line's arbitration.
    pub line_waits: u64,
    /// Lock attempts that found the lock held by another call.
    pub lock_blocks: u64,
    /// Of them, waits longer than the spin window (the waiter slept).
    pub lock_sleeps: u64,
    /// Virtual ns calls spent waiting for locks.
    pub lock_wait_ns: u64,
    /// Invariant checks delayed until every call in flight ended.
    pub checks_delayed: u64,
    /// Virtual ns new calls were held back for those checks.
    pub check_hold_ns: u64,
}

/// The interleaved simulator's state besides [`Sim`]'s.
pub(super) struct Interleave {
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<usize>,
    pub(super) stacks: Vec<DefaultStack>,
    /// Calls waiting for a lock, by its real address, in arrival order.
    pub(super) waiters: HashMap<u64, VecDeque<usize>>,
    /// Per CPU: a call it waits for is in flight.
    pub(super) busy: Vec<bool>,
    /// Per CPU: events that reached it while busy: (time, sequence
    /// number, event), handled in order when it is free again.
    pub(super) deferred: Vec<Vec<(u64, u64, Ev)>>,
    pub(super) in_flight: usize,
    /// A check is due: new calls park until every call in flight ends.
    pub(super) check_due: Option<u64>,
    pub(super) parked: Vec<CallStart>,
    /// The run is over: calls in flight finish, nothing follows them.
    pub(super) ending: bool,
    /// Lines whose arbitration is due (an `Ev::Grant` queued): line ->
    /// its index in `grant_lines`.
    pub(super) grant_due: HashMap<u64, u32>,
    pub(super) grant_lines: Vec<u64>,
    pub(super) grant_free: Vec<u32>,
    pub(super) stats: InterleaveStats,
}

impl Interleave {
    pub(super) fn new(cpus: usize) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            stacks: Vec::new(),
            waiters: HashMap::new(),
            busy: vec![false; cpus],
            deferred: vec![Vec::new(); cpus],
            in_flight: 0,
            check_due: None,
            parked: Vec::new(),
            ending: false,
            grant_due: HashMap::new(),
            grant_lines: Vec::new(),
            grant_free: Vec::new(),
            stats: InterleaveStats::default(),
        }
    }
}
