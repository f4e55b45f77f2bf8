//! The contract between a task body and the executor that runs it.
//!
//! WHAT: a task is a [`Body`] the executor enters again and again; each
//! [`Body::enter`] runs the task until it has something to say to the
//! scheduler and says it as an [`Action`]: go on, block until woken,
//! sleep, yield, wake another task, end, or fail. [`Hooks`] are the few
//! calls an executor makes on a task from other threads (preempt it; a
//! wake of it or a pick of it just happened). `apply` is the one place
//! where an action becomes executor work.
//!
//! WHY: one body runs on every executor. A KVM vCPU (its `enter` is one
//! `KVM_RUN` and the mapping of the exit) and a synthetic workload task
//! (its `enter` computes until it blocks) run unchanged on the M:N workers,
//! on one thread each with run slots, and on plain host threads, so an
//! executor comparison compares executors and nothing else. Before this,
//! the vCPU side carried its own copy of each executor's loop.
//!
//! HOW: an executor calls `enter` with a [`Cx`], through which the body
//! reads the clock, checks whether it should get out (`should_yield`),
//! and wakes other tasks. A body that computes for long polls
//! `should_yield` and returns [`Action::Continue`] when it says so: that is
//! the body's preemption checkpoint. A body blocked in a system call (a
//! vCPU in `KVM_RUN`) is preempted through [`Hooks::preempt`] instead.

use std::cell::Cell;

use crate::cpumask::CpuMask;
use crate::error::Result;
use crate::stats::TaskStats;
use crate::task::{CpuId, TaskId};

/// What the executor does after [`Body::enter`] returns.
///
/// The type parameters let a body's own layer speak the same vocabulary
/// with its own names for a wake target and a failure (a VM's exit mapper
/// says "wake vCPU 3" and "stop the VM for this reason"); executors take
/// `Action` with task ids and messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action<W = TaskId, F = String> {
    /// Enter again, after a preemption checkpoint if one is due.
    Continue,
    /// Wait until woken; returns at once if a wake came since the task
    /// last blocked (wakes are remembered one deep, like `unpark`).
    Block,
    /// Block for this many nanoseconds; other wakes in between are
    /// absorbed.
    Sleep(u64),
    /// Let runnable tasks of the same priority go first.
    Yield,
    /// Wake this task, then continue.
    Wake(W),
    /// The task has ended.
    Exit,
    /// The task has ended because something failed; the executor reports
    /// the reason.
    Fail(F),
}

impl<W, F> Action<W, F> {
    /// The same action with its wake target and failure translated;
    /// `wake` may drop a wake (`None`: there is nobody to wake, continue).
    pub fn map<W2, F2>(
        self,
        wake: impl FnOnce(W) -> Option<W2>,
        fail: impl FnOnce(F) -> F2,
    ) -> Action<W2, F2> {
        match self {
            Action::Continue => Action::Continue,
            Action::Block => Action::Block,
            Action::Sleep(ns) => Action::Sleep(ns),
            Action::Yield => Action::Yield,
            Action::Wake(w) => wake(w).map_or(Action::Continue, Action::Wake),
            Action::Exit => Action::Exit,
            Action::Fail(f) => Action::Fail(fail(f)),
        }
    }
}

/// A task's code. Entered by one executor thread at a time; between two
/// entries the task may move to another thread (M:N) or CPU.
pub trait Body: Send {
    /// Runs the task until it has something for the scheduler.
    fn enter(&mut self, cx: &Cx<'_>) -> Action;
    /// The task has ended and left the executor (called once, on the
    /// thread that retired it, right before the body is dropped).
    fn finished(&mut self, _end: &TaskEnd) {}
}

/// A closure is a body: handy for tests and small tasks.
impl<F> Body for F
where
    F: FnMut(&Cx<'_>) -> Action + Send,
{
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        self(cx)
    }
}

/// Calls an executor makes on a task from other threads. Each must be
/// quick and must not call back into the executor or the scheduler: they
/// may run with scheduler locks held.
pub trait Hooks: Send + Sync {
    /// The task's CPU wants it off: get [`Body::enter`] to return soon
    /// (for a vCPU in `KVM_RUN`: `immediate_exit` and a signal). The
    /// executor has already made [`Cx::should_yield`] true.
    fn preempt(&self) {}
    /// A wake of this task by the executor (an [`Action::Wake`], a timer,
    /// [`Spawner::wake`]) has just returned to the waker.
    fn woken(&self) {}
    /// The executor has just picked this task to run on a CPU (M:N
    /// workers only: the other executors have no pick apart from the
    /// task's thread running).
    fn picked(&self) {}
}

/// How a task ended, for [`Body::finished`].
#[derive(Clone, Debug, Default)]
pub struct TaskEnd {
    /// Its scheduler statistics (executors with a scheduler).
    pub stats: Option<TaskStats>,
    /// Its thread's host schedstat (executors with a thread per task).
    pub host_schedstat: Option<crate::exec::clock::HostSchedstat>,
    /// Why it failed ([`Action::Fail`], or a panic in the body).
    pub failure: Option<String>,
}

/// The block path, as the executor saw it on this CPU: the task that ran
/// here before this one blocked, and this one runs next. Handed to the
/// body that runs next (see [`Cx::block_path`]) when the blocking body
/// stamped its exit ([`Cx::stamp_exit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPath {
    /// When the blocking body's event happened (its stamp).
    pub exit: u64,
    /// When the executor called `schedule` for it, and when that returned
    /// (M:N workers; `None` where the host kernel switches threads).
    pub schedule: Option<(u64, u64)>,
}

/// What an executor offers a body during [`Body::enter`].
pub(crate) trait Engine: Sync {
    /// The executor's clock (ns, never 0).
    fn now(&self) -> u64;
    /// Is the executor stopping?
    fn stopping(&self) -> bool;
    /// Should task `id` on `cpu` get out of `enter`?
    fn should_yield(&self, id: TaskId, cpu: CpuId) -> bool;
    /// Wakes `t`, the waker being `id` on `cpu`.
    fn wake(&self, t: TaskId, cpu: CpuId) -> bool;
    /// Changes a task's affinity.
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()>;
}

/// A body's view of its executor during one [`Body::enter`].
pub struct Cx<'a> {
    id: TaskId,
    cpu: CpuId,
    engine: &'a dyn Engine,
    block_path: Option<BlockPath>,
    exit_stamp: Cell<u64>,
}

impl<'a> Cx<'a> {
    pub(crate) fn new(
        id: TaskId,
        cpu: CpuId,
        engine: &'a dyn Engine,
        block_path: Option<BlockPath>,
    ) -> Self {
        Self {
            id,
            cpu,
            engine,
            block_path,
            exit_stamp: Cell::new(0),
        }
    }

    /// This task.
    pub fn id(&self) -> TaskId {
        self.id
    }
    /// The logical CPU it runs on (the host executor: the host CPU its
    /// thread was on when it last blocked or started; informational).
    pub fn cpu(&self) -> CpuId {
        self.cpu
    }
    /// The executor's clock, ns since it started (never 0).
    pub fn now(&self) -> u64 {
        self.engine.now()
    }
    /// Is the executor shutting down? The body should return
    /// [`Action::Exit`] soon.
    pub fn stopping(&self) -> bool {
        self.engine.stopping()
    }
    /// Should the body return now? True when the task's CPU has something
    /// to look at (a wake for it, a task that preempts this one). A body
    /// that runs for long checks it every few microseconds and returns
    /// [`Action::Continue`] when it is true.
    #[inline]
    pub fn should_yield(&self) -> bool {
        self.engine.should_yield(self.id, self.cpu)
    }
    /// Wakes task `t` from this task's CPU; true if it was blocked. The
    /// same as returning [`Action::Wake`], for bodies that wake several.
    pub fn wake(&self, t: TaskId) -> bool {
        self.engine.wake(t, self.cpu)
    }
    /// Changes a task's affinity (a no-op for the host executor's
    /// unpinned threads; see [`Spawner::set_affinity`]).
    pub fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.engine.set_affinity(t, mask)
    }
    /// The block path that led to this entry, if the task that ran on
    /// this CPU before blocked with a stamp.
    pub fn block_path(&self) -> Option<BlockPath> {
        self.block_path
    }
    /// Stamps when the event that makes this entry return happened (for a
    /// vCPU: when `KVM_RUN` returned), on [`Cx::now`]'s clock. If the
    /// entry then blocks or sleeps, the executor hands the stamp to the
    /// task that runs next on the CPU ([`Cx::block_path`]). Unstamped
    /// entries (0) are not measured.
    pub fn stamp_exit(&self, at: u64) {
        self.exit_stamp.set(at);
    }
    pub(crate) fn exit_stamp(&self) -> u64 {
        self.exit_stamp.get()
    }
}

/// The executor primitives an [`Action`] turns into. Each executor has
/// its own (handing a run slot over, a flag for its worker loop, a futex
/// park); `apply` is the one place that says which action is which.
pub(crate) trait Apply {
    /// Block until woken.
    fn block(&mut self);
    /// Block until the executor's clock reaches `due`.
    fn sleep_until(&mut self, due: u64);
    /// Requeue behind equal priorities.
    fn yield_now(&mut self);
    /// Wake `t` from this task's CPU.
    fn wake(&mut self, t: TaskId);
    /// The task has ended (`failure`: why it failed).
    fn end(&mut self, failure: Option<String>);
    /// The executor's clock.
    fn now(&self) -> u64;
}

/// Carries out `action` with the executor's primitives; false when the
/// task has ended.
pub(crate) fn apply(action: Action, e: &mut impl Apply) -> bool {
    match action {
        Action::Continue => {}
        Action::Block => e.block(),
        Action::Sleep(ns) => {
            let due = e.now().saturating_add(ns);
            e.sleep_until(due)
        }
        Action::Yield => e.yield_now(),
        Action::Wake(t) => e.wake(t),
        Action::Exit => {
            e.end(None);
            return false;
        }
        Action::Fail(why) => {
            e.end(Some(why));
            return false;
        }
    }
    true
}

/// What a workload needs from the executor that runs it; every executor
/// ([`ThreadsExecutor`](super::ThreadsExecutor),
/// [`WorkerPool`](super::WorkerPool), [`HostExecutor`](super::HostExecutor))
/// is one.
pub trait Spawner: Send + Sync {
    /// The topology its tasks' CPUs come from.
    fn topology(&self) -> &std::sync::Arc<topology::HostTopology>;
    /// The executor's clock (ns, never 0).
    fn now(&self) -> u64;
    /// A task group for tasks made later (the host executor has no
    /// groups: it hands out ids and ignores them).
    fn create_group(&self, name: &str) -> Result<crate::task::GroupId>;
    /// Adds a task running `body` and lets it run.
    fn spawn(&self, spec: &crate::task::TaskSpec, body: Box<dyn Body>) -> Result<TaskId>;
    /// Wakes a task from outside the executor; true if it was blocked.
    fn wake(&self, t: TaskId) -> bool;
    /// Changes a task's affinity (the host executor pins its thread).
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()>;
    /// Has the task not ended yet?
    fn alive(&self, t: TaskId) -> bool;
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Rec(Vec<String>, u64);
    impl Apply for Rec {
        fn block(&mut self) {
            self.0.push("block".into());
        }
        fn sleep_until(&mut self, due: u64) {
            self.0.push(format!("sleep until {due}"));
        }
        fn yield_now(&mut self) {
            self.0.push("yield".into());
        }
        fn wake(&mut self, t: TaskId) {
            self.0.push(format!("wake {}", t.0));
        }
        fn end(&mut self, failure: Option<String>) {
            self.0.push(format!("end {failure:?}"));
        }
        fn now(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn each_action_is_one_primitive_and_only_the_last_two_end_the_task() {
        let mut r = Rec(Vec::new(), 1000);
        assert!(apply(Action::Continue, &mut r));
        assert!(apply(Action::Block, &mut r));
        assert!(apply(Action::Sleep(50), &mut r));
        assert!(apply(Action::Yield, &mut r));
        assert!(apply(Action::Wake(TaskId(7)), &mut r));
        assert!(!apply(Action::Exit, &mut r));
        assert!(!apply(Action::Fail("bad".into()), &mut r));
        assert_eq!(
            r.0,
            [
                "block",
                "sleep until 1050",
                "yield",
                "wake 7",
                "end None",
                "end Some(\"bad\")"
            ]
        );
        // a sleep past the end of time saturates
        let mut r = Rec(Vec::new(), u64::MAX - 1);
        apply(Action::Sleep(10), &mut r);
        assert_eq!(r.0, [format!("sleep until {}", u64::MAX)]);
    }

    #[test]
    fn map_translates_targets_and_failures_and_drops_wakes_to_nobody() {
        let a: Action<usize, u8> = Action::Wake(3);
        assert_eq!(
            a.map(|k| Some(TaskId(k as u32 + 10)), |f| f.to_string()),
            Action::<TaskId, String>::Wake(TaskId(13))
        );
        let a: Action<usize, u8> = Action::Wake(3);
        assert_eq!(
            a.map(|_| None::<TaskId>, |f| f.to_string()),
            Action::<TaskId, String>::Continue
        );
        let a: Action<usize, u8> = Action::Fail(9);
        assert_eq!(
            a.map(|k| Some(TaskId(k as u32)), |f| format!("f{f}")),
            Action::<TaskId, String>::Fail("f9".into())
        );
        let a: Action<usize, u8> = Action::Sleep(5);
        assert_eq!(
            a.map(|k| Some(TaskId(k as u32)), |f| f.to_string()),
            Action::<TaskId, String>::Sleep(5)
        );
    }
}
