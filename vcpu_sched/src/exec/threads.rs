//! The threads executor: one OS thread per task, one idle context per CPU,
//! and a run slot per CPU that exactly one of them holds at a time.
//!
//! * A task's thread runs its body only while it holds a CPU's run slot.
//!   When the body blocks, yields, exits or reaches a preemption
//!   checkpoint, the thread asks the core what runs next and hands the slot
//!   over: it publishes the new owner, gives the grant to the next thread
//!   and unparks it, then parks itself until it is granted a slot again.
//!   Parking is `std::thread::park` (a futex on Linux): nothing spins, which
//!   matters in a VM, where a spinning waiter can be burning the time slice
//!   of the very thread it waits for.
//! * A thread granted a different CPU than before moves its OS affinity to
//!   that CPU's host CPU first.
//! * Each managed CPU has an idle context, a thread pinned to that CPU's
//!   host CPU, which holds the slot while the CPU is idle and parks until
//!   it is kicked.
//! * The core's [`Kicker`] lands here: a kicked CPU's idle context is
//!   unparked, or its running task's preempt flag is raised and the user's
//!   [`KickHook`] is called (for a vCPU: a signal plus `immediate_exit`).
//! * One clock thread ticks every CPU, fires timers and, when asked,
//!   runs the invariant checker.
//!
//! Emulated topologies: logical CPU `i` of a big topology runs on host CPU
//! `real[i % real.len()]` ([`CpuMapping::Emulated`]), so a 384-CPU
//! `genoa-2s` runs, slowly but faithfully, on 2 CPUs.
//!
//! # No lost kicks
//! A kicker sets the CPU's `need_resched` (or fills its wake list), then
//! reads the slot's owner; a new owner is published before it is granted,
//! and a thread that receives a slot checks
//! [`Scheduler::needs_attention`] before it resumes its body. With a
//! sequentially consistent fence on both sides, either the kicker reaches
//! the new owner or the new owner sees the flag. A vCPU body must make the
//! same check (its [`TaskCtx::should_yield`]) right before `KVM_RUN`, and
//! its hook must set `immediate_exit`, so that a kick landing between the
//! check and the ioctl is not lost.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use super::clock::{current_tid, run_clock, runnable_thread, ClockHost, ClockPeriods, TimerQueue};
use crate::check::{InvariantChecker, Liveness};
use crate::config::SchedConfig;
use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};
use crate::mitigations::Mitigations;
use crate::sched::{Kicker, Pick, Prev, Scheduler};
use crate::stats::{SchedCounters, TaskStats};
use crate::task::{CpuId, Policy, TaskId, TaskSpec};
use crate::tasks::lock;

const NONE: u32 = u32::MAX;
const IDLE: u32 = u32::MAX - 1;

/// Preempts a running task's body. The executor has already raised the
/// task's preempt flag (which [`TaskCtx::should_yield`] and
/// [`TaskCtx::checkpoint`] read); a hook adds whatever gets the body out of
/// a blocking call: for a vCPU in `KVM_RUN`, set `immediate_exit` and
/// signal its thread. Called from any thread, possibly with scheduler locks
/// held: it must be quick and must not call back into the scheduler.
pub trait KickHook: Send + Sync {
    /// `task`, which holds `cpu`'s run slot, should reach a checkpoint.
    fn kick(&self, task: TaskId, cpu: CpuId);
}

/// The hook for synthetic tasks: the preempt flag alone is enough, because
/// their bodies poll it.
pub struct FlagKick;

impl KickHook for FlagKick {
    fn kick(&self, _task: TaskId, _cpu: CpuId) {}
}

/// How logical CPUs map to host CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuMapping {
    /// Logical CPU `i` is the topology's CPU `i` (its `os_index`): use with
    /// the `host` topology.
    Host,
    /// Logical CPU `i` runs on host CPU `real[i % real.len()]`.
    Emulated {
        /// Host CPU numbers.
        real: Vec<u32>,
    },
}

impl CpuMapping {
    /// Emulation onto every CPU this process may run on.
    pub fn emulated_on_allowed() -> Result<Self> {
        Ok(CpuMapping::Emulated {
            real: allowed_host_cpus()?,
        })
    }

    /// The mapping for a topology SPEC: `host` runs on the real CPUs,
    /// anything else is emulated onto the CPUs this process may use.
    pub fn for_spec(spec: &str) -> Result<Self> {
        if spec.trim() == "host" {
            Ok(CpuMapping::Host)
        } else {
            Self::emulated_on_allowed()
        }
    }

    /// Is this an emulation (logical CPUs share host CPUs)?
    pub fn is_emulated(&self) -> bool {
        matches!(self, CpuMapping::Emulated { .. })
    }

    /// How many host CPUs a topology of `cpus` logical CPUs runs on.
    pub fn host_cpus(&self, cpus: usize) -> usize {
        match self {
            CpuMapping::Host => cpus,
            CpuMapping::Emulated { real } => real.len().min(cpus),
        }
    }

    fn host_cpu(&self, topo: &HostTopology, cpu: CpuId) -> u32 {
        match self {
            CpuMapping::Host => topo.os_index(cpu),
            CpuMapping::Emulated { real } => real[cpu as usize % real.len()],
        }
    }
}

/// Settings of the invariant checker run by the clock thread.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckConfig {
    /// Time between snapshots.
    pub interval: Duration,
    /// How long an RT wait may persist before it is a violation.
    pub grace: Duration,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            grace: Duration::from_secs(2),
        }
    }
}

/// Executor settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecConfig {
    /// Where logical CPUs run.
    pub mapping: CpuMapping,
    /// Tick period.
    pub tick: Duration,
    /// Stack size of task threads.
    pub task_stack: usize,
    /// Run the invariant checker (and the executor's own checks).
    pub check: Option<CheckConfig>,
    /// Set host CPU affinity of threads (turn off only where the process may
    /// not change affinity).
    pub pin: bool,
    /// Run the executor's threads at host `SCHED_FIFO` this priority (task
    /// and idle threads; the clock one above), so that RT tasks are not
    /// preempted by ordinary host processes. Where that is not permitted
    /// the threads stay `SCHED_OTHER` and a warning is logged once.
    #[serde(default)]
    pub host_rt: Option<u8>,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            mapping: CpuMapping::Host,
            tick: Duration::from_millis(1),
            task_stack: 256 << 10,
            check: None,
            pin: true,
            host_rt: None,
        }
    }
}

/// One CPU's slot.
#[repr(align(128))]
struct Slot {
    /// The task holding the slot, or [`IDLE`].
    owner: AtomicU32,
    /// Who is inside the slot right now (double-run detection).
    active: AtomicU32,
    idle_token: AtomicBool,
    /// Set while the idle context sleeps for want of a kick (with
    /// `idle_token`, it tells the checker a sleeping idle context from a
    /// starved one).
    idle_parked: AtomicBool,
    /// The idle context's kernel thread id (0 until it starts).
    idle_tid: AtomicU32,
    idle_thread: OnceLock<Thread>,
    host_cpu: u32,
}

/// One CPU's executor counters, written by whoever holds its slot.
#[repr(align(128))]
#[derive(Default)]
struct CpuExec {
    sched_ns: AtomicU64,
    sched_calls: AtomicU64,
    grants: AtomicU64,
    idle_wakeups: AtomicU64,
}

/// Per-task executor state.
#[repr(align(128))]
struct TaskRt {
    thread: Mutex<Option<Thread>>,
    grant: AtomicU32,
    preempt: AtomicBool,
    running_on: AtomicU32,
    host_cpu: AtomicU32,
    timer_gen: AtomicU64,
    /// Its thread's kernel thread id (0 until it starts).
    tid: AtomicU32,
}

impl TaskRt {
    fn new() -> Self {
        Self {
            thread: Mutex::new(None),
            grant: AtomicU32::new(NONE),
            preempt: AtomicBool::new(false),
            running_on: AtomicU32::new(NONE),
            host_cpu: AtomicU32::new(NONE),
            timer_gen: AtomicU64::new(0),
            tid: AtomicU32::new(0),
        }
    }
}

/// The part of the executor the kicker and every thread share.
struct Shared {
    mapping: CpuMapping,
    slots: Box<[Slot]>,
    cpu_exec: Box<[CpuExec]>,
    trt: Box<[TaskRt]>,
    hook: Arc<dyn KickHook>,
    epoch: Instant,
    stopping: AtomicBool,
    idle_stop: AtomicBool,
    timers: TimerQueue,
    violations: Mutex<Vec<String>>,
    pin: bool,
    host_rt: Option<u8>,
    pin_errors: AtomicU64,
    check: bool,
    live: AtomicUsize,
    finished: Mutex<Vec<(TaskId, TaskStats)>>,
}

impl Shared {
    #[inline]
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn violation(&self, v: String) {
        tracing::error!("scheduler invariant violated: {v}");
        lock(&self.violations).push(v);
    }

    /// Host SCHED_FIFO for the calling thread at `host_rt + above`, if
    /// configured.
    fn host_rt(&self, above: u8) {
        if let Some(p) = self.host_rt {
            set_host_rt(p, above);
        }
    }

    fn pin_to(&self, host_cpu: u32) {
        if self.pin && pin_current_thread(host_cpu).is_err() {
            self.pin_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives `cpu`'s slot to task `n`.
    fn grant(&self, n: u32, cpu: CpuId) {
        self.slots[cpu as usize].owner.store(n, Ordering::SeqCst);
        self.cpu_exec[cpu as usize]
            .grants
            .fetch_add(1, Ordering::Relaxed);
        let t = &self.trt[n as usize];
        let old = t.grant.swap(cpu, Ordering::AcqRel);
        if old != NONE {
            self.violation(format!(
                "task {n} granted CPU {cpu} while its grant of CPU {old} is still pending"
            ));
        }
        if let Some(th) = lock(&t.thread).as_ref() {
            th.unpark();
        }
    }

    /// Gives `cpu`'s slot to its idle context.
    fn grant_idle(&self, cpu: CpuId) {
        let s = &self.slots[cpu as usize];
        s.owner.store(IDLE, Ordering::SeqCst);
        s.idle_token.store(true, Ordering::Release);
        if let Some(th) = s.idle_thread.get() {
            th.unpark();
        }
    }
}

struct ExecKicker(Arc<Shared>);

impl Kicker for ExecKicker {
    fn kick(&self, cpu: CpuId) {
        let sh = &self.0;
        fence(Ordering::SeqCst);
        let s = &sh.slots[cpu as usize];
        match s.owner.load(Ordering::SeqCst) {
            IDLE => {
                s.idle_token.store(true, Ordering::Release);
                if let Some(th) = s.idle_thread.get() {
                    th.unpark();
                }
            }
            NONE => {}
            t => {
                sh.trt[t as usize].preempt.store(true, Ordering::Release);
                sh.hook.kick(TaskId(t), cpu);
            }
        }
    }
}

/// What a task body gets: its identity, its CPU, and the calls into the
/// executor. Lives on the task's thread only.
pub struct TaskCtx {
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    id: TaskId,
    cpu: Cell<CpuId>,
}

impl TaskCtx {
    /// This task.
    pub fn id(&self) -> TaskId {
        self.id
    }
    /// The CPU whose slot this task holds.
    pub fn cpu(&self) -> CpuId {
        self.cpu.get()
    }
    /// The executor's clock, ns since it started.
    pub fn now(&self) -> u64 {
        self.sh.now()
    }
    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.sched
    }
    /// Is the executor shutting down? Bodies should return soon.
    pub fn stopping(&self) -> bool {
        self.sh.stopping.load(Ordering::Relaxed)
    }

    /// Should the body get to a checkpoint? Cheap: the task's preempt flag,
    /// its CPU's need_resched and wake list head.
    #[inline]
    pub fn should_yield(&self) -> bool {
        self.sh.trt[self.id.0 as usize]
            .preempt
            .load(Ordering::Acquire)
            || self.sched.needs_attention(self.cpu.get())
    }

    /// A preemption checkpoint: if this CPU has something to look at, let
    /// the scheduler decide; returns true if this task was switched out
    /// (and has now been switched back in, perhaps on another CPU).
    #[inline]
    pub fn checkpoint(&self) -> bool {
        if !self.should_yield() {
            return false;
        }
        self.switch(Prev::Keep)
    }

    /// Waits until woken. Returns at once if a wake arrived since the task
    /// last blocked (wakes are remembered, one deep, like `unpark`).
    pub fn block(&self) {
        self.switch(Prev::Block);
    }

    /// Lets equal-priority tasks run first.
    pub fn yield_now(&self) {
        self.switch(Prev::Yield);
    }

    /// Wakes `t` from this CPU. Returns true if it was blocked.
    pub fn wake(&self, t: TaskId) -> bool {
        self.sched
            .wake(t, Some(self.cpu.get()), self.sh.now())
            .unwrap_or(false)
    }

    /// Changes a task's affinity.
    pub fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.sched.set_affinity(t, mask, self.sh.now())
    }

    /// Blocks until the clock reaches `deadline` (ns on [`now`](Self::now)'s
    /// clock). Other wakes in between are absorbed.
    pub fn sleep_until(&self, deadline: u64) {
        let rt = &self.sh.trt[self.id.0 as usize];
        let gen = rt.timer_gen.fetch_add(1, Ordering::Relaxed) + 1;
        self.sh.timers.add(deadline, self.id.0 as usize, gen);
        while self.sh.now() < deadline && !self.stopping() {
            self.block();
        }
        // cancel the timer if it has not fired
        rt.timer_gen.fetch_add(1, Ordering::Relaxed);
    }

    /// Busy work for `ns` nanoseconds of this thread's wall time, with a
    /// checkpoint every few microseconds (synthetic compute).
    pub fn compute_for(&self, ns: u64) {
        let end = self.sh.now() + ns;
        while self.sh.now() < end {
            for i in 0..200u32 {
                std::hint::black_box(i.wrapping_mul(2_654_435_761));
            }
            self.checkpoint();
        }
    }

    /// Asks the core what runs next on this CPU and hands the slot over if
    /// it is not this task; returns once this task holds a slot again and
    /// that CPU has nothing pending. True if the task was switched out.
    fn switch(&self, prev: Prev) -> bool {
        let mut prev = prev;
        let mut switched = false;
        loop {
            let cpu = self.cpu.get();
            self.check_holder(cpu, "switch");
            let t0 = self.sh.now();
            let pick = self.sched.schedule(cpu, prev, t0);
            let ce = &self.sh.cpu_exec[cpu as usize];
            ce.sched_ns.fetch_add(self.sh.now() - t0, Ordering::Relaxed);
            ce.sched_calls.fetch_add(1, Ordering::Relaxed);
            match pick {
                Pick::Same => {
                    self.sh.trt[self.id.0 as usize]
                        .preempt
                        .store(false, Ordering::Relaxed);
                    return switched;
                }
                Pick::Switch(n) => {
                    self.leave(cpu);
                    self.sh.grant(n.0, cpu);
                }
                Pick::Idle => {
                    self.leave(cpu);
                    self.sh.grant_idle(cpu);
                }
            }
            switched = true;
            if !self.wait_and_enter() {
                return true;
            }
            prev = Prev::Keep;
        }
    }

    /// The core must agree that this task is `cpu`'s current task whenever
    /// its thread holds `cpu`'s slot.
    fn check_holder(&self, cpu: CpuId, what: &str) {
        let cur = self.sched.current(cpu);
        if cur != Some(self.id) {
            self.sh.violation(format!(
                "task {} holds CPU {cpu}'s slot ({what}) but the core runs {:?} there; the core has it {:?} on CPU {:?}",
                self.id.0,
                cur,
                self.sched.task_state(self.id),
                self.sched.task_cpu(self.id)
            ));
        }
    }

    fn leave(&self, cpu: CpuId) {
        let rt = &self.sh.trt[self.id.0 as usize];
        rt.running_on.store(NONE, Ordering::Release);
        let _ = self.sh.slots[cpu as usize].active.compare_exchange(
            self.id.0,
            NONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Parks until granted a slot, then takes it over. Returns true if the
    /// CPU already has something to look at (a kick that went to the
    /// previous owner): the caller must schedule again before resuming.
    fn wait_and_enter(&self) -> bool {
        let rt = &self.sh.trt[self.id.0 as usize];
        let cpu = loop {
            let g = rt.grant.swap(NONE, Ordering::Acquire);
            if g != NONE {
                break g;
            }
            std::thread::park();
        };
        self.enter(cpu)
    }

    fn enter(&self, cpu: CpuId) -> bool {
        let sh = &self.sh;
        let rt = &sh.trt[self.id.0 as usize];
        self.cpu.set(cpu);
        if let Err(other) =
            rt.running_on
                .compare_exchange(NONE, cpu, Ordering::AcqRel, Ordering::Acquire)
        {
            sh.violation(format!(
                "task {} entered CPU {cpu} while running on CPU {other}",
                self.id.0
            ));
        }
        let slot = &sh.slots[cpu as usize];
        if let Err(other) =
            slot.active
                .compare_exchange(NONE, self.id.0, Ordering::AcqRel, Ordering::Acquire)
        {
            sh.violation(format!(
                "task {} entered CPU {cpu} while {} is inside it",
                self.id.0,
                if other == IDLE {
                    "the idle context".to_string()
                } else {
                    format!("task {other}")
                }
            ));
        }
        if sh.check {
            if let Some(m) = self.sched.running_outside_affinity(cpu, self.id) {
                sh.violation(format!(
                    "task {} runs on CPU {cpu} outside its affinity {m}",
                    self.id.0
                ))
            }
        }
        let host = slot.host_cpu;
        if rt.host_cpu.swap(host, Ordering::Relaxed) != host {
            sh.pin_to(host);
        }
        rt.preempt.store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.sched.needs_attention(cpu)
    }
}

/// Totals of one run of the executor.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExecReport {
    /// Scheduler counters, summed.
    pub counters: SchedCounters,
    /// Per CPU: time spent inside the scheduler core (ns).
    pub sched_ns_per_cpu: Vec<u64>,
    /// Per CPU: calls into `schedule`.
    pub sched_calls_per_cpu: Vec<u64>,
    /// Per CPU: slot grants.
    pub grants_per_cpu: Vec<u64>,
    /// Per CPU: times the idle context was woken.
    pub idle_wakeups_per_cpu: Vec<u64>,
    /// Statistics of every task that exited.
    pub tasks: Vec<TaskStats>,
    /// Invariant violations (executor checks and the checker).
    pub violations: Vec<String>,
    /// Checker snapshots taken.
    pub checks: u64,
    /// RT waits the checker saw (transient ones included).
    pub rt_waits_seen: u64,
    /// Failed attempts to set a thread's host CPU affinity.
    pub pin_errors: u64,
}

/// The executor.
pub struct ThreadsExecutor {
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    task_threads: Mutex<Vec<(TaskId, JoinHandle<()>)>>,
    sys_threads: Vec<JoinHandle<()>>,
    checker: Arc<Mutex<Option<InvariantChecker>>>,
    stack: usize,
}

impl ThreadsExecutor {
    /// Builds a scheduler for `topo` and starts the idle contexts and the
    /// clock thread.
    pub fn new(
        topo: Arc<HostTopology>,
        mit: Mitigations,
        sched_cfg: SchedConfig,
        cfg: ExecConfig,
        hook: Arc<dyn KickHook>,
    ) -> Result<Self> {
        if let CpuMapping::Emulated { real } = &cfg.mapping {
            if real.is_empty() {
                return Err(SchedError::Config(
                    "emulated mapping with no host CPUs".into(),
                ));
            }
        }
        if cfg.tick.is_zero() {
            return Err(SchedError::Config("the tick must be positive".into()));
        }
        let n = topo.num_cpus();
        let sh = Arc::new(Shared {
            slots: (0..n as u32)
                .map(|c| Slot {
                    owner: AtomicU32::new(IDLE),
                    active: AtomicU32::new(NONE),
                    idle_token: AtomicBool::new(false),
                    idle_parked: AtomicBool::new(false),
                    idle_tid: AtomicU32::new(0),
                    idle_thread: OnceLock::new(),
                    host_cpu: cfg.mapping.host_cpu(&topo, c),
                })
                .collect(),
            cpu_exec: (0..n).map(|_| CpuExec::default()).collect(),
            trt: (0..sched_cfg.max_tasks).map(|_| TaskRt::new()).collect(),
            hook,
            epoch: Instant::now(),
            stopping: AtomicBool::new(false),
            idle_stop: AtomicBool::new(false),
            timers: TimerQueue::new(),
            violations: Mutex::new(Vec::new()),
            pin: cfg.pin,
            host_rt: cfg.host_rt,
            pin_errors: AtomicU64::new(0),
            check: cfg.check.is_some(),
            live: AtomicUsize::new(0),
            finished: Mutex::new(Vec::new()),
            mapping: cfg.mapping.clone(),
        });
        let sched = Arc::new(Scheduler::new(
            topo,
            mit,
            sched_cfg,
            Arc::new(ExecKicker(sh.clone())),
        )?);
        let checker = Arc::new(Mutex::new(
            cfg.check
                .as_ref()
                .map(|c| InvariantChecker::new(c.grace.as_nanos() as u64)),
        ));
        let mut sys_threads = Vec::new();
        for cpu in 0..n as u32 {
            let (sh2, s2) = (sh.clone(), sched.clone());
            let h = std::thread::Builder::new()
                .name(format!("idle/{cpu}"))
                .stack_size(64 << 10)
                .spawn(move || idle_main(sh2, s2, cpu))
                .map_err(|e| SchedError::Os {
                    context: format!("cannot start the idle context of CPU {cpu}"),
                    source: e,
                })?;
            let _ = sh.slots[cpu as usize].idle_thread.set(h.thread().clone());
            sys_threads.push(h);
        }
        {
            let (sh2, s2, ck) = (sh.clone(), sched.clone(), checker.clone());
            let periods = ClockPeriods {
                tick: cfg.tick.as_nanos() as u64,
                check: cfg.check.as_ref().map(|c| c.interval.as_nanos() as u64),
            };
            let h = std::thread::Builder::new()
                .name("sched-clock".into())
                .spawn(move || {
                    sh2.host_rt(1);
                    run_clock(&*sh2, &s2, &sh2.timers, periods, &ck)
                })
                .map_err(|e| SchedError::Os {
                    context: "cannot start the clock thread".into(),
                    source: e,
                })?;
            sh.timers.set_clock_thread(h.thread().clone());
            sys_threads.push(h);
        }
        Ok(Self {
            sh,
            sched,
            task_threads: Mutex::new(Vec::new()),
            sys_threads,
            checker,
            stack: cfg.task_stack,
        })
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.sched
    }

    /// What the thread acting for `cpu` is doing, as the checker sees it
    /// (parked without a kick, or runnable with its host CPU time).
    pub fn liveness(&self, cpu: CpuId) -> Liveness {
        ClockHost::liveness(&*self.sh, cpu)
    }

    /// The executor's clock, ns since it started.
    pub fn now(&self) -> u64 {
        self.sh.now()
    }

    /// The host CPU logical CPU `cpu` runs on.
    pub fn host_cpu(&self, cpu: CpuId) -> u32 {
        self.sh.slots[cpu as usize].host_cpu
    }

    /// The mapping in use.
    pub fn mapping(&self) -> &CpuMapping {
        &self.sh.mapping
    }

    /// Creates a task running `body` on a thread of its own, and wakes it.
    pub fn spawn<F>(&self, spec: &TaskSpec, body: F) -> Result<TaskId>
    where
        F: FnOnce(&TaskCtx) + Send + 'static,
    {
        let id = self.sched.add_task(spec, self.sh.now())?;
        let rt = &self.sh.trt[id.0 as usize];
        rt.grant.store(NONE, Ordering::Relaxed);
        rt.preempt.store(false, Ordering::Relaxed);
        rt.running_on.store(NONE, Ordering::Relaxed);
        rt.host_cpu.store(NONE, Ordering::Relaxed);
        let (sh, sched) = (self.sh.clone(), self.sched.clone());
        let h = std::thread::Builder::new()
            .name(format!("task/{}", id.0))
            .stack_size(self.stack)
            .spawn(move || task_main(sh, sched, id, body));
        let h = match h {
            Ok(h) => h,
            Err(e) => {
                let _ = self.sched.remove_task(id);
                return Err(SchedError::Os {
                    context: format!("cannot start the thread of task {}", spec.name),
                    source: e,
                });
            }
        };
        *lock(&rt.thread) = Some(h.thread().clone());
        self.sh.live.fetch_add(1, Ordering::AcqRel);
        lock(&self.task_threads).push((id, h));
        self.sched.wake(id, None, self.sh.now())?;
        Ok(id)
    }

    /// Wakes a task from a thread that is not a managed CPU.
    pub fn wake(&self, t: TaskId) -> Result<bool> {
        self.sched.wake(t, None, self.sh.now())
    }

    /// Changes a task's affinity.
    pub fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.sched.set_affinity(t, mask, self.sh.now())
    }

    /// Tasks whose body has not returned yet.
    pub fn live_tasks(&self) -> usize {
        self.sh.live.load(Ordering::Acquire)
    }

    /// Violations found so far.
    pub fn violations(&self) -> Vec<String> {
        let mut v = lock(&self.sh.violations).clone();
        match lock(&self.checker).as_ref() {
            // the checker reports the core's anomalies with its own findings
            Some(c) => v.extend(c.violations.iter().cloned()),
            None => v.extend(self.sched.anomalies()),
        }
        v
    }

    /// Asks every body to return ([`TaskCtx::stopping`]), keeps waking them
    /// until they have, then stops the idle contexts and the clock. Fails,
    /// naming them, if bodies are still running after `timeout`.
    pub fn shutdown(mut self, timeout: Duration) -> Result<ExecReport> {
        self.sh.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        let mut threads = std::mem::take(&mut *lock(&self.task_threads));
        while !threads.is_empty() {
            for (id, h) in threads.iter() {
                if !h.is_finished() {
                    let _ = self.sched.wake(*id, None, self.sh.now());
                }
            }
            let (done, rest): (Vec<_>, Vec<_>) =
                threads.into_iter().partition(|(_, h)| h.is_finished());
            for (_, h) in done {
                if h.join().is_err() {
                    self.sh.violation("a task body panicked".into());
                }
            }
            threads = rest;
            if threads.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let names: Vec<String> = threads.iter().map(|(i, _)| i.0.to_string()).collect();
                let mut detail: Vec<String> = threads
                    .iter()
                    .take(4)
                    .map(|(i, _)| self.describe(*i))
                    .collect();
                if let Some((i, _)) = threads.first() {
                    if let Ok(cpu) = self.sched.task_cpu(*i) {
                        let owner = self.sh.slots[cpu as usize].owner.load(Ordering::Relaxed);
                        if owner < IDLE {
                            detail.push(format!("owner: {}", self.describe(TaskId(owner))));
                        }
                    }
                }
                detail.extend(self.sched.anomalies().into_iter().take(4));
                detail.extend(lock(&self.sh.violations).iter().take(8).cloned());
                tracing::error!(
                    "stuck task bodies at shutdown: {}\n{}",
                    detail.join("; "),
                    self.sched.dump()
                );
                self.stop_system();
                return Err(SchedError::Workload(format!(
                    "{} task bodies did not return within {:?} of shutdown (tasks {}; {}); \
                     bodies must return when TaskCtx::stopping() is true",
                    threads.len(),
                    timeout,
                    names.join(","),
                    detail.join("; ")
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // a final snapshot with nothing left running
        if let Some(c) = lock(&self.checker).as_mut() {
            c.observe(&self.sched, self.sh.now());
        }
        self.stop_system();
        let n = self.sched.num_cpus();
        let ce = &self.sh.cpu_exec;
        let load = |f: fn(&CpuExec) -> &AtomicU64| -> Vec<u64> {
            (0..n).map(|c| f(&ce[c]).load(Ordering::Relaxed)).collect()
        };
        let (checks, rt_waits_seen) = lock(&self.checker)
            .as_ref()
            .map_or((0, 0), |c| (c.checks, c.rt_waits_seen));
        let mut tasks: Vec<(TaskId, TaskStats)> = std::mem::take(&mut *lock(&self.sh.finished));
        tasks.sort_by_key(|(i, _)| *i);
        Ok(ExecReport {
            counters: self.sched.counters(),
            sched_ns_per_cpu: load(|c| &c.sched_ns),
            sched_calls_per_cpu: load(|c| &c.sched_calls),
            grants_per_cpu: load(|c| &c.grants),
            idle_wakeups_per_cpu: load(|c| &c.idle_wakeups),
            tasks: tasks.into_iter().map(|(_, s)| s).collect(),
            violations: self.violations(),
            checks,
            rt_waits_seen,
            pin_errors: self.sh.pin_errors.load(Ordering::Relaxed),
        })
    }

    /// Where a task is, in words (for diagnostics).
    pub fn describe(&self, t: TaskId) -> String {
        let s = &self.sched;
        let rt = &self.sh.trt[t.0 as usize];
        let grant = rt.grant.load(Ordering::Relaxed);
        let on = rt.running_on.load(Ordering::Relaxed);
        match (s.task_state(t), s.task_cpu(t)) {
            (Ok(st), Ok(cpu)) => format!(
                "task {} {:?} cpu {cpu} (cpu curr {:?}, owner {}, needs attention {}), grant {}, running_on {}, preempt {}",
                t.0,
                st,
                s.current(cpu),
                self.sh.slots[cpu as usize].owner.load(Ordering::Relaxed),
                s.needs_attention(cpu),
                grant,
                on,
                rt.preempt.load(Ordering::Relaxed)
            ),
            (Err(e), _) | (_, Err(e)) => format!("task {}: {e}", t.0),
        }
    }

    fn stop_system(&mut self) {
        self.sh.idle_stop.store(true, Ordering::SeqCst);
        for s in self.sh.slots.iter() {
            if let Some(t) = s.idle_thread.get() {
                t.unpark();
            }
        }
        self.sh.timers.wake_clock();
        for h in self.sys_threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for ThreadsExecutor {
    fn drop(&mut self) {
        if !self.sys_threads.is_empty() {
            self.sh.stopping.store(true, Ordering::SeqCst);
            self.stop_system();
        }
    }
}

fn task_main<F>(sh: Arc<Shared>, sched: Arc<Scheduler>, id: TaskId, body: F)
where
    F: FnOnce(&TaskCtx),
{
    sh.trt[id.0 as usize]
        .tid
        .store(current_tid(), Ordering::Release);
    sh.host_rt(0);
    let ctx = TaskCtx {
        sh: sh.clone(),
        sched: sched.clone(),
        id,
        cpu: Cell::new(NONE),
    };
    if ctx.wait_and_enter() {
        ctx.switch(Prev::Keep);
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&ctx)));
    let cpu = ctx.cpu.get();
    ctx.check_holder(cpu, "exit");
    let t0 = sh.now();
    let pick = sched.schedule(cpu, Prev::Exit, t0);
    ctx.leave(cpu);
    match pick {
        Pick::Switch(n) => sh.grant(n.0, cpu),
        _ => sh.grant_idle(cpu),
    }
    *lock(&sh.trt[id.0 as usize].thread) = None;
    match sched.remove_task(id) {
        Ok(st) => lock(&sh.finished).push((id, st)),
        Err(e) => sh.violation(format!(
            "task {} could not be removed after exit: {e}",
            id.0
        )),
    }
    sh.live.fetch_sub(1, Ordering::AcqRel);
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

fn idle_main(sh: Arc<Shared>, sched: Arc<Scheduler>, cpu: CpuId) {
    let slot = &sh.slots[cpu as usize];
    slot.idle_tid.store(current_tid(), Ordering::Release);
    sh.pin_to(slot.host_cpu);
    sh.host_rt(0);
    // The idle context starts holding the slot; run one schedule for any
    // work queued before it started.
    slot.idle_token.store(true, Ordering::Release);
    loop {
        // `idle_parked` is cleared before the token is taken, so the
        // checker never sees this context parked without a token once a
        // kick has landed (see ClockHost::liveness).
        // The token is taken with a swap (acquire): whichever kick or
        // grant it takes, what that one published before its token (need
        // resched, the wake list, the owner) is visible below; a token
        // set after the swap stays for the next round.
        slot.idle_parked.store(true, Ordering::SeqCst);
        while !slot.idle_token.load(Ordering::SeqCst) {
            if sh.idle_stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::park();
        }
        slot.idle_parked.store(false, Ordering::SeqCst);
        slot.idle_token.swap(false, Ordering::AcqRel);
        if sh.idle_stop.load(Ordering::Acquire) {
            return;
        }
        if slot.owner.load(Ordering::SeqCst) != IDLE {
            continue;
        }
        sh.cpu_exec[cpu as usize]
            .idle_wakeups
            .fetch_add(1, Ordering::Relaxed);
        if let Err(other) =
            slot.active
                .compare_exchange(NONE, IDLE, Ordering::AcqRel, Ordering::Acquire)
        {
            sh.violation(format!(
                "the idle context of CPU {cpu} entered while task {other} is inside"
            ));
            continue;
        }
        let t0 = sh.now();
        let pick = sched.schedule(cpu, Prev::Keep, t0);
        let ce = &sh.cpu_exec[cpu as usize];
        ce.sched_ns.fetch_add(sh.now() - t0, Ordering::Relaxed);
        ce.sched_calls.fetch_add(1, Ordering::Relaxed);
        let _ = slot
            .active
            .compare_exchange(IDLE, NONE, Ordering::AcqRel, Ordering::Relaxed);
        if let Pick::Switch(n) = pick {
            sh.grant(n.0, cpu);
        } else {
            // Still idle: make sure a kick between schedule and here is seen.
            fence(Ordering::SeqCst);
            if sched.needs_attention(cpu) {
                slot.idle_token.store(true, Ordering::Release);
            }
        }
    }
}

impl ClockHost for Shared {
    fn now(&self) -> u64 {
        Shared::now(self)
    }

    fn quit(&self) -> bool {
        self.idle_stop.load(Ordering::Acquire)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    fn fire(&self, sched: &Scheduler, key: usize, gen: u64, now: u64) {
        if self.trt[key].timer_gen.load(Ordering::Relaxed) == gen {
            let _ = sched.wake(TaskId(key as u32), None, now);
        }
    }

    /// The thread that acts for a CPU is its slot holder: the idle context
    /// (parked only without a kick's token) or the granted task's thread
    /// (runnable: granted means woken). Its host CPU time tells a thread
    /// that had the chance to act from one the host has not run.
    fn liveness(&self, cpu: CpuId) -> Liveness {
        let Some(slot) = self.slots.get(cpu as usize) else {
            return Liveness::Unknown;
        };
        let owner = slot.owner.load(Ordering::SeqCst);
        let tid = if owner == IDLE {
            if slot.idle_parked.load(Ordering::SeqCst) && !slot.idle_token.load(Ordering::SeqCst) {
                return Liveness::Parked;
            }
            slot.idle_tid.load(Ordering::Acquire)
        } else {
            match self.trt.get(owner as usize) {
                Some(t) => t.tid.load(Ordering::Acquire),
                None => return Liveness::Unknown,
            }
        };
        runnable_thread(tid)
    }
}

/// The host CPUs this process may run on.
pub fn allowed_host_cpus() -> Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it, and pid 0 means this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(SchedError::Os {
                context: "sched_getaffinity".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok((0..libc::CPU_SETSIZE as u32)
            .filter(|&c| libc::CPU_ISSET(c as usize, &set))
            .collect())
    }
}

/// Sets the calling thread's host scheduling policy (`SCHED_FIFO` or
/// `SCHED_RR` at the task's priority; `Fair` leaves it as it is).
pub fn set_current_thread_policy(p: Policy) -> Result<()> {
    let (policy, prio) = match p {
        Policy::Fifo(x) => (libc::SCHED_FIFO, x),
        Policy::Rr(x) => (libc::SCHED_RR, x),
        Policy::Fair(_) => return Ok(()),
    };
    let param = libc::sched_param {
        sched_priority: prio as libc::c_int,
    };
    // SAFETY: pid 0 is the calling thread; `param` lives across the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(SchedError::Os {
            context: format!("cannot set host {p:?} (needs CAP_SYS_NICE or an RT rlimit)"),
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Gives the calling thread host `SCHED_FIFO` at `prio + above` (at most
/// 99); where that is not permitted, warns once per process and goes on.
pub fn set_host_rt(prio: u8, above: u8) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let p = prio.saturating_add(above).clamp(1, 99);
    if let Err(e) = set_current_thread_policy(Policy::Fifo(p)) {
        WARNED.call_once(|| tracing::warn!("executor threads stay SCHED_OTHER: {e}"));
    }
}

/// Pins the calling thread to host CPU `cpu`.
pub fn pin_current_thread(cpu: u32) -> Result<()> {
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(SchedError::Config(format!(
            "host CPU {cpu} is out of range"
        )));
    }
    // SAFETY: the set is zeroed plain data and CPU_SET writes inside it
    // (cpu is below CPU_SETSIZE); sched_setaffinity only reads it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(SchedError::Os {
            context: format!("cannot pin a thread to host CPU {cpu}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
