//! What the threaded executors ([`threads`](super::threads) and
//! [`workers`](super::workers)) share: the per-CPU run slot, the per-task
//! run state, the one kick protocol, the clock thread's view of them, and
//! how their threads start.
//!
//! WHAT: [`CpuSlot`] is a CPU's run slot: who holds it ([`CpuSlot::owner`]:
//! a task, or [`IDLE`] for the CPU's own thread, which is the idle context
//! of the threads executor and the worker of the M:N one), and the token
//! that wakes the CPU's own thread. [`TaskRt`] is a task's executor state:
//! its preempt flag, its sleep timer, its [`Hooks`]. [`SlotKicker`] is the
//! [`KickCpu`] the core calls.
//!
//! WHY: both executors hand a CPU between "a task runs here" and "the
//! CPU's own thread waits for work", and the core kicks both the same way;
//! the protocol that makes a kick impossible to lose is subtle enough to
//! be written once.
//!
//! HOW (no lost kicks): a kicker sets the CPU's `need_resched` (or fills
//! its wake list), fences, then reads the slot's owner: the CPU's own
//! thread gets the token and an unpark; a task gets its preempt flag and
//! [`Hooks::preempt`]. Whoever takes a slot publishes itself as owner,
//! fences, and checks [`Scheduler::needs_attention`] before it runs
//! anything. With sequentially consistent fences on both sides, either
//! the kicker reaches the new owner or the new owner sees the flag. A body
//! blocked in a system call (a vCPU in `KVM_RUN`) makes the same check
//! right before the call, and its preempt hook must make the call return
//! (`immediate_exit`), so a kick between the check and the call is not
//! lost either.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};
use std::thread::{JoinHandle, Thread};
use std::time::Instant;

use topology::HostTopology;

use super::body::{Engine, Hooks};
use super::clock::{run_checker, run_clock, runnable_thread, ClockHost, ClockPeriods, TimerQueue};
use super::{CheckConfig, CpuMapping, ExecConfig, CPU_OK};
use crate::check::{InvariantChecker, Liveness};
use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};
use crate::os_thread::{pin_current_thread, set_host_rt};
use crate::sched::{KickCpu, Scheduler};
use crate::task::{CpuId, TaskId};
use crate::tasks::lock;

/// No task (a grant not made, a CPU not entered).
pub(crate) const NONE: u32 = u32::MAX;
/// The slot is held by the CPU's own thread (idle context, or the worker
/// between two tasks).
pub(crate) const IDLE: u32 = u32::MAX - 1;

/// One CPU's run slot.
#[repr(align(128))]
pub(crate) struct CpuSlot {
    /// The task holding the slot, or [`IDLE`].
    pub(crate) owner: AtomicU32,
    /// A kick for the CPU's own thread, not yet taken.
    pub(crate) token: AtomicBool,
    /// Set while the CPU's own thread sleeps for want of a kick (with
    /// `token`, it tells the checker a sleeping thread from a starved one).
    pub(crate) parked: AtomicBool,
    /// The CPU's own thread's kernel thread id (0 until it starts).
    pub(crate) tid: AtomicU32,
    pub(crate) thread: OnceLock<Thread>,
    /// The host CPU this logical CPU runs on.
    pub(crate) host_cpu: u32,
}

impl CpuSlot {
    fn new(host_cpu: u32) -> Self {
        Self {
            owner: AtomicU32::new(IDLE),
            token: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            tid: AtomicU32::new(0),
            thread: OnceLock::new(),
            host_cpu,
        }
    }

    /// Gives the CPU's own thread a token and wakes it.
    pub(crate) fn kick_own(&self) {
        self.token.store(true, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Takes the token, if any: acquire, so that what the kick that set it
    /// published before it (need_resched, the wake list, a grant) is
    /// visible to what follows; a token set after the swap stays for the
    /// next round.
    pub(crate) fn take_token(&self) -> bool {
        self.token.swap(false, Ordering::AcqRel)
    }
}

/// One CPU's executor counters, written by whoever holds its slot.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct CpuCounters {
    pub(crate) sched_ns: AtomicU64,
    pub(crate) sched_calls: AtomicU64,
    /// Slot hand-overs to a task (threads executor).
    pub(crate) grants: AtomicU64,
    /// Times the CPU's own thread woke to schedule.
    pub(crate) idle_wakeups: AtomicU64,
    /// ns the idle worker polled for a timer it parked ahead of (workers'
    /// timer advance).
    pub(crate) timer_spin_ns: AtomicU64,
}

/// A task's executor state, by task id.
#[repr(align(128))]
pub(crate) struct TaskRt {
    /// Raised by a kick of the CPU running it; [`Cx::should_yield`]
    /// (super::Cx::should_yield) reads it.
    pub(crate) preempt: AtomicBool,
    /// A sleep's timer generation: a timer fires only if it still
    /// matches, and whoever fires it bumps it.
    pub(crate) timer_gen: AtomicU64,
    /// A sleep's due time (0: not sleeping).
    pub(crate) sleep_due: AtomicU64,
    /// The task's own thread's kernel thread id (threads executor; 0
    /// where the task has no thread).
    pub(crate) tid: AtomicU32,
    /// Its hooks, from its creation until its removal.
    hooks: RwLock<Option<Arc<dyn Hooks>>>,
}

impl TaskRt {
    fn new() -> Self {
        Self {
            preempt: AtomicBool::new(false),
            timer_gen: AtomicU64::new(0),
            sleep_due: AtomicU64::new(0),
            tid: AtomicU32::new(0),
            hooks: RwLock::new(None),
        }
    }

    /// Resets the state for a new task under this id.
    pub(crate) fn reset(&self, hooks: Option<Arc<dyn Hooks>>) {
        self.preempt.store(false, Ordering::Relaxed);
        self.sleep_due.store(0, Ordering::Relaxed);
        self.tid.store(0, Ordering::Relaxed);
        self.timer_gen.fetch_add(1, Ordering::AcqRel);
        *self.hooks.write().unwrap_or_else(|p| p.into_inner()) = hooks;
    }

    /// Drops the hooks (the task is being removed).
    pub(crate) fn clear(&self) {
        self.timer_gen.fetch_add(1, Ordering::AcqRel);
        *self.hooks.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Its hooks.
    pub(crate) fn hooks(&self) -> RwLockReadGuard<'_, Option<Arc<dyn Hooks>>> {
        self.hooks.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// How the CPU's own thread goes about a timer due for a task it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerStyle {
    /// The clock thread fires every timer; the task's own thread reports
    /// the wake once it runs again (threads executor).
    Clock,
    /// The worker that armed a timer fires it itself from its timed park;
    /// the clock thread only backs it up (M:N workers).
    Local,
}

/// The state a threaded executor's threads and its kicker share.
pub(crate) struct ExecCore {
    /// The clock every task and body of this executor sees.
    pub(crate) epoch: Instant,
    pub(crate) mapping: CpuMapping,
    pub(crate) slots: Box<[CpuSlot]>,
    pub(crate) counters: Box<[CpuCounters]>,
    /// By task id (the scheduler's `max_tasks`).
    pub(crate) tasks: Box<[TaskRt]>,
    pub(crate) timers: TimerQueue,
    pub(crate) timer_style: TimerStyle,
    /// Bodies should end ([`Cx::stopping`](super::Cx::stopping)).
    pub(crate) stopping: AtomicBool,
    /// The executor's own threads end.
    pub(crate) quit: AtomicBool,
    /// Task sets being removed while the executor runs on (their RT waits
    /// are expected: the checker takes no snapshot meanwhile).
    pub(crate) detaching: AtomicUsize,
    violations: Mutex<Vec<String>>,
    pin: bool,
    host_rt: Option<u8>,
    pub(crate) pin_errors: AtomicU64,
    /// The executor's own checks are on.
    pub(crate) check: bool,
}

/// A threaded executor's core, scheduler and checker, built together.
pub(crate) struct Built {
    pub(crate) core: Arc<ExecCore>,
    pub(crate) sched: Arc<Scheduler>,
    pub(crate) checker: Arc<Mutex<Option<InvariantChecker>>>,
}

impl ExecCore {
    /// Checks `cfg`, then builds the shared state for `topo`, a scheduler
    /// whose kicks land on its run slots, and the checker if asked for.
    pub(crate) fn build(
        topo: Arc<HostTopology>,
        mit: crate::mitigations::Mitigations,
        sched_cfg: crate::config::SchedConfig,
        cfg: &ExecConfig,
        timer_style: TimerStyle,
    ) -> Result<Built> {
        cfg.validate()?;
        let n = topo.num_cpus();
        let core = Arc::new(Self {
            epoch: cfg.epoch.unwrap_or_else(Instant::now),
            slots: (0..n as u32)
                .map(|cpu| CpuSlot::new(cfg.mapping.host_cpu(&topo, cpu)))
                .collect(),
            counters: (0..n).map(|_| CpuCounters::default()).collect(),
            tasks: (0..sched_cfg.max_tasks).map(|_| TaskRt::new()).collect(),
            timers: TimerQueue::new(),
            timer_style,
            stopping: AtomicBool::new(false),
            quit: AtomicBool::new(false),
            detaching: AtomicUsize::new(0),
            violations: Mutex::new(Vec::new()),
            pin: cfg.pin,
            host_rt: cfg.host_rt,
            pin_errors: AtomicU64::new(0),
            check: cfg.check.is_some(),
            mapping: cfg.mapping.clone(),
        });
        let sched = Arc::new(Scheduler::new(
            topo,
            mit,
            sched_cfg,
            Arc::new(SlotKicker(core.clone())),
        )?);
        let checker = Arc::new(Mutex::new(
            cfg.check
                .as_ref()
                .map(|c| InvariantChecker::new(c.grace.as_nanos() as u64)),
        ));
        Ok(Built {
            core,
            sched,
            checker,
        })
    }

    /// ns since the executor's epoch (never 0).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// A task's state; `None` for an id beyond the table (a broken
    /// invariant, reported by the caller).
    #[inline]
    pub(crate) fn task(&self, t: TaskId) -> Option<&TaskRt> {
        self.tasks.get(t.0 as usize)
    }

    /// Records an executor invariant violation.
    pub(crate) fn violation(&self, v: String) {
        tracing::error!("executor invariant violated: {v}");
        lock(&self.violations).push(v);
    }

    /// The violations recorded so far.
    pub(crate) fn violations(&self) -> Vec<String> {
        lock(&self.violations).clone()
    }

    /// Gives the calling thread host `SCHED_FIFO` at `host_rt + above`, if
    /// the executor was asked to.
    pub(crate) fn host_rt(&self, above: u8) {
        if let Some(p) = self.host_rt {
            set_host_rt(p, above);
        }
    }

    /// Pins the calling thread to `host_cpu` (counted, not fatal, if the
    /// host refuses).
    pub(crate) fn pin_to(&self, host_cpu: u32) {
        if self.pin && pin_current_thread(host_cpu).is_err() {
            self.pin_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tells task `t`'s hooks that a wake of it has returned.
    #[inline]
    pub(crate) fn woken(&self, t: TaskId) {
        if let Some(rt) = self.task(t) {
            if let Some(h) = rt.hooks().as_ref() {
                h.woken();
            }
        }
    }

    /// Tells task `t`'s hooks that it was picked to run.
    #[inline]
    pub(crate) fn picked(&self, t: TaskId) {
        if let Some(rt) = self.task(t) {
            if let Some(h) = rt.hooks().as_ref() {
                h.picked();
            }
        }
    }

    /// Wakes `t` in the core (from `waker`, if a managed CPU), then its
    /// hooks hear of it.
    pub(crate) fn wake(&self, sched: &Scheduler, t: TaskId, waker: Option<CpuId>) -> bool {
        let r = sched.wake(t, waker, self.now()).unwrap_or(false);
        self.woken(t);
        r
    }

    /// Arms task `t`'s sleep timer for `due`; returns its generation.
    pub(crate) fn arm_sleep(&self, t: TaskId, due: u64) -> u64 {
        let Some(rt) = self.task(t) else {
            return 0;
        };
        rt.sleep_due.store(due, Ordering::Release);
        let gen = rt.timer_gen.fetch_add(1, Ordering::AcqRel) + 1;
        self.timers.add(due, t.0 as usize, gen);
        gen
    }

    /// Fires task `t`'s timer of generation `gen` if nobody did: wakes the
    /// task from `waker`. True if this call fired it.
    pub(crate) fn fire_timer(
        &self,
        sched: &Scheduler,
        t: TaskId,
        gen: u64,
        waker: Option<CpuId>,
    ) -> bool {
        let Some(rt) = self.task(t) else {
            return false;
        };
        if rt
            .timer_gen
            .compare_exchange(gen, gen + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let _ = sched.wake(t, waker, self.now());
        if self.timer_style == TimerStyle::Local {
            self.woken(t);
        }
        true
    }

    /// Starts the clock thread (ticks and sleep timers) and, when
    /// checking, the checker's own thread. `name` prefixes their names.
    pub(crate) fn start_clock(
        self: &Arc<Self>,
        sched: &Arc<Scheduler>,
        checker: &Arc<Mutex<Option<InvariantChecker>>>,
        tick_ns: u64,
        check: Option<&CheckConfig>,
        name: &str,
    ) -> Result<Vec<JoinHandle<()>>> {
        let mut out = Vec::new();
        if let Some(iv) = check.map(|c| c.interval.as_nanos() as u64) {
            let (core, s, ck) = (self.clone(), sched.clone(), checker.clone());
            out.push(start_thread(
                format!("{name}-check"),
                None,
                "the checker thread",
                move || run_checker(&*core, &s, iv, &ck),
            )?);
        }
        let (core, s, ck) = (self.clone(), sched.clone(), checker.clone());
        let periods = ClockPeriods {
            tick: tick_ns,
            // the checker's snapshots run on a thread of their own (see
            // run_checker), not on the clock's
            check: None,
        };
        let h = start_thread(
            format!("{name}-clock"),
            None,
            "the clock thread",
            move || {
                core.host_rt(1);
                run_clock(&*core, &s, &core.timers, periods, &ck)
            },
        );
        match h {
            Ok(h) => {
                self.timers.set_clock_thread(h.thread().clone());
                out.push(h);
                Ok(out)
            }
            Err(e) => {
                self.quit.store(true, Ordering::SeqCst);
                for h in out {
                    let _ = h.join();
                }
                Err(e)
            }
        }
    }
}

/// The one way an executor starts a thread: named, with an optional stack
/// size, and a failure that says which thread could not start.
pub(crate) fn start_thread<T, F>(
    name: String,
    stack: Option<usize>,
    what: &str,
    f: F,
) -> Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let mut b = std::thread::Builder::new().name(name);
    if let Some(s) = stack {
        b = b.stack_size(s);
    }
    b.spawn(f).map_err(|source| SchedError::Os {
        context: format!("cannot start {what}"),
        source,
    })
}

/// The [`KickCpu`] of both threaded executors (see the module docs).
pub(crate) struct SlotKicker(pub(crate) Arc<ExecCore>);

impl KickCpu for SlotKicker {
    fn kick(&self, cpu: CpuId) {
        let core = &self.0;
        fence(Ordering::SeqCst);
        let Some(s) = core.slots.get(cpu as usize) else {
            return;
        };
        match s.owner.load(Ordering::SeqCst) {
            IDLE => s.kick_own(),
            NONE => {}
            t => {
                // A task being removed has no hooks any more; whoever
                // takes the slot next checks `needs_attention` after it
                // publishes itself, so this kick is not lost.
                if let Some(rt) = core.task(TaskId(t)) {
                    rt.preempt.store(true, Ordering::Release);
                    if let Some(h) = rt.hooks().as_ref() {
                        h.preempt();
                    }
                }
            }
        }
    }
}

/// How long after its due time the clock thread fires a sleep timer that
/// the parked worker which armed it is due to fire itself (see
/// [`ClockHost::fire`] below).
const TIMER_BACKSTOP_NS: u64 = 100_000;

impl ClockHost for ExecCore {
    fn now(&self) -> u64 {
        ExecCore::now(self)
    }

    fn quit(&self) -> bool {
        self.quit.load(Ordering::Acquire)
    }

    /// Bodies are ending, a task set is leaving (its vCPUs are being torn
    /// down, so RT waits are expected), or the executor is stopping.
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
            || self.detaching.load(Ordering::Acquire) > 0
            || self.quit.load(Ordering::Acquire)
    }

    fn fire(&self, sched: &Scheduler, key: usize, gen: u64, now: u64) {
        let t = TaskId(key as u32);
        let Some(rt) = self.task(t) else {
            return;
        };
        if rt.timer_gen.load(Ordering::Acquire) != gen {
            return;
        }
        if self.timer_style == TimerStyle::Local {
            // The worker that armed it keeps it too (its local timers).
            // Parked, that worker sleeps until this due time and fires it
            // itself, one host wakeup instead of this thread's plus a
            // kick: leave it to the worker, and come back once more in
            // case it does not.
            let owner = sched
                .task_cpu(t)
                .ok()
                .and_then(|c| self.slots.get(c as usize));
            if let Some(w) = owner {
                let fresh = now <= rt.sleep_due.load(Ordering::Acquire) + TIMER_BACKSTOP_NS;
                if fresh && w.parked.load(Ordering::SeqCst) && !w.token.load(Ordering::SeqCst) {
                    self.timers.add(now + TIMER_BACKSTOP_NS, key, gen);
                    return;
                }
            }
        }
        self.fire_timer(sched, t, gen, None);
    }

    /// The thread that acts for a CPU: its own thread while it holds the
    /// slot (parked only between giving the CPU up and a kick's token), or
    /// the slot holder's thread (threads executor: granted means woken).
    /// Its host CPU time tells a thread that had the chance to act from
    /// one the host has not run.
    fn liveness(&self, cpu: CpuId) -> Liveness {
        let Some(slot) = self.slots.get(cpu as usize) else {
            return Liveness::Unknown;
        };
        let owner = slot.owner.load(Ordering::SeqCst);
        let own_thread = owner == IDLE
            || self
                .task(TaskId(owner))
                .is_none_or(|t| t.tid.load(Ordering::Acquire) == 0);
        if own_thread {
            if slot.parked.load(Ordering::SeqCst) && !slot.token.load(Ordering::SeqCst) {
                return Liveness::Parked;
            }
            return runnable_thread(slot.tid.load(Ordering::Acquire));
        }
        match self.task(TaskId(owner)) {
            Some(t) => runnable_thread(t.tid.load(Ordering::Acquire)),
            None => Liveness::Unknown,
        }
    }
}

/// A body's view of a threaded executor ([`Engine`] for its [`Cx`](super::Cx)).
pub(crate) struct SchedEngine<'a> {
    pub(crate) core: &'a ExecCore,
    pub(crate) sched: &'a Scheduler,
}

impl Engine for SchedEngine<'_> {
    fn now(&self) -> u64 {
        self.core.now()
    }
    fn stopping(&self) -> bool {
        self.core.stopping.load(Ordering::Relaxed)
    }
    #[inline]
    fn should_yield(&self, id: TaskId, cpu: CpuId) -> bool {
        self.core
            .task(id)
            .is_some_and(|t| t.preempt.load(Ordering::Acquire))
            || self.sched.needs_attention(cpu).expect(CPU_OK)
    }
    fn wake(&self, t: TaskId, cpu: CpuId) -> bool {
        self.core.wake(self.sched, t, Some(cpu))
    }
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.sched.set_affinity(t, mask, self.core.now())
    }
}
