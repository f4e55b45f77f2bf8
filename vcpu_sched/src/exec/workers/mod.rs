//! The M:N executor: one worker thread per logical CPU, pinned to that
//! CPU's host CPU, runs whichever task the scheduler picks for its CPU by
//! entering that task's [`Body`] itself.
//!
//! Compared with one thread per task, switching from one task to another
//! on a CPU is a function return and a call, not a hand-over between two
//! host threads (a futex wake, a park and two host context switches). The
//! price, for a KVM vCPU, is that its fd is entered from whichever worker
//! runs it: KVM loads the vCPU state on that thread, about 2 us the first
//! time (docs/kvm-notes.md). Measured both ways in `docs/results-vcpus.md`.
//!
//! It drives the same [`Scheduler`] core through the same calls as the
//! threads executor, over the same run slots and kicks
//! (`exec::shared`):
//! * a worker holds its CPU's run slot for good; whenever its task blocks,
//!   sleeps, yields or ends, or the CPU needs attention, it calls
//!   `schedule(cpu, prev, now)` and runs what comes back, or parks when
//!   the CPU goes idle;
//! * the core's kicks land here: an idle worker is unparked; a busy one's
//!   current task is preempted ([`Hooks::preempt`]: for a vCPU,
//!   `immediate_exit` and a signal);
//! * no lost kicks: a worker publishes its task as the slot's owner,
//!   fences, then checks `needs_attention`, and checks it again right
//!   before every entry into a body;
//! * one clock thread ticks every CPU and backs up the sleep timers (a
//!   worker fires the timers of the tasks it ran itself, from a timed
//!   park); the invariant checker, when asked for, runs on its own thread.
//!
//! # One pool, many task sets
//! The pool runs with no task at all until tasks are [added](WorkerPool::add);
//! tasks join and leave while others run (`vmm serve` adds one VM's vCPUs
//! when it boots and they leave when it stops, so every VM shares one
//! scheduler and its fixes). A task id names its body from its creation
//! until its removal, before the id can be reused.

mod worker;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use topology::HostTopology;

use super::body::{Body, Hooks, Spawner, TaskEnd};
use super::clock::runnable_thread;
use super::config::{CpuMapping, ExecConfig, ExecReport};
use super::shared::{start_thread, Built, ExecCore, TimerStyle, IDLE};
use crate::check::InvariantChecker;
use crate::config::SchedConfig;
use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};
use crate::mitigations::Mitigations;
use crate::sched::Scheduler;
use crate::stats::{SchedCounters, TaskStats};
use crate::task::{CpuId, GroupId, TaskId, TaskSpec};
use crate::tasks::lock;
use worker::worker_main;

/// A task's body, by task id: taken by the worker that runs the task (a
/// second worker finding it taken is a broken invariant).
#[repr(align(128))]
#[derive(Default)]
struct BodySlot(Mutex<Option<Box<dyn Body>>>);

/// What the workers share.
struct Pool {
    core: Arc<ExecCore>,
    sched: Arc<Scheduler>,
    bodies: Box<[BodySlot]>,
    /// Tasks added and not yet retired.
    live: AtomicUsize,
    /// Keep ended tasks' statistics and failures for the report (off for a
    /// pool that runs for ever: `vmm serve`).
    keep: bool,
    finished: Mutex<Vec<(TaskId, TaskStats)>>,
    failures: Mutex<Vec<String>>,
    /// How long an idle worker polls for a kick before it parks (0: it
    /// parks at once). See [`idle_spin`].
    idle_spin_ns: u64,
    /// The most a worker arms its timed park ahead of a timer and polls
    /// the rest (0: no timer advance). See [`timer_advance_max`].
    timer_advance_max_ns: u64,
}

/// How long an idle worker polls before parking: the same idea as KVM's
/// halt polling (`halt_poll_ns`, 200 us by default), at a quarter of it.
/// A kick that lands while the worker polls is taken without the futex
/// wake of a parked thread (about 20 us here, the "wake -> picked" stage
/// of `vmm bench --breakdown`). Only where every worker has a host CPU of
/// its own: on an emulated topology (many workers per host CPU) a polling
/// worker would take the CPU the others need.
fn idle_spin(mapping: &CpuMapping) -> u64 {
    if matches!(mapping, CpuMapping::Host) {
        IDLE_SPIN_NS
    } else {
        0
    }
}

/// See [`idle_spin`].
const IDLE_SPIN_NS: u64 = 50_000;

/// Timer advance: WHAT: an idle worker whose next event is an RT task's
/// sleep timer parks until a little before it is due and polls the rest
/// of the way, instead of parking until the due time (fair tasks' timers:
/// see `Worker::advances`).
/// WHY: a timed park returns late by the host's timer and wakeup latency
/// (under kvm_pvm here 37-43 us at the median, 67-83 us at p99: the
/// "due -> wake" stage of `vmm bench --breakdown`), and an RT vCPU's
/// wakeup latency is that lateness plus the pick. KVM has the same
/// problem for the guest's LAPIC timer and answers it the same way:
/// `lapic_timer_advance_ns` arms the host timer early by an amount that
/// adapts to the measured lateness, then waits out the remainder (its
/// idea, not its code).
/// HOW: each worker keeps an advance, an average of how late its timed
/// parks returned (each new lateness moves it 1/8 of the way), capped at
/// this maximum; it parks until `due - advance` and polls to `due` (a
/// kick or the quit ends the poll). The poll burns only the idle worker's
/// own host CPU, so only where every worker has a host CPU of its own, as
/// [`idle_spin`]; the time polled is counted per CPU
/// (`ExecReport::timer_spin_ns_per_cpu`).
fn timer_advance_max(mapping: &CpuMapping) -> u64 {
    if matches!(mapping, CpuMapping::Host) {
        TIMER_ADVANCE_MAX_NS
    } else {
        0
    }
}

/// See [`timer_advance_max`].
const TIMER_ADVANCE_MAX_NS: u64 = 100_000;

impl Pool {
    /// Retires task `t`, which has exited: takes its body, removes it from
    /// the core and tells the body how it ended. The hooks and the body
    /// leave before the core frees the id (a task added next under the id
    /// finds it empty); the body hears last, so whoever waits for it sees
    /// the task gone.
    fn retire(&self, t: TaskId, failure: Option<String>) {
        let Some(slot) = self.bodies.get(t.0 as usize) else {
            self.core
                .violation(format!("task {} is beyond the executor's table", t.0));
            return;
        };
        let body = lock(&slot.0).take();
        if let Some(rt) = self.core.task(t) {
            rt.clear();
        }
        let stats = match self.sched.remove_task(t) {
            Ok(st) => Some(st),
            Err(e) => {
                self.core
                    .violation(format!("task {} could not be removed after exit: {e}", t.0));
                None
            }
        };
        if self.keep {
            if let Some(why) = &failure {
                let name = stats
                    .as_ref()
                    .map_or_else(|| t.0.to_string(), |s| s.name.clone());
                lock(&self.failures).push(format!("{name}: {why}"));
            }
            if let Some(st) = &stats {
                lock(&self.finished).push((t, st.clone()));
            }
        }
        match body {
            Some(mut b) => b.finished(&TaskEnd {
                stats,
                host_schedstat: None,
                failure,
            }),
            None => self
                .core
                .violation(format!("exited task {} had no body", t.0)),
        }
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The M:N executor: the scheduler, one worker per CPU, the clock, and
/// whichever tasks are added.
pub struct WorkerPool {
    pool: Arc<Pool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    checker: Arc<Mutex<Option<InvariantChecker>>>,
}

impl WorkerPool {
    /// Starts the scheduler, the workers and the clock, with no task yet.
    pub fn start(
        topo: Arc<HostTopology>,
        mit: Mitigations,
        sched_cfg: SchedConfig,
        cfg: &ExecConfig,
    ) -> Result<Self> {
        let max = sched_cfg.max_tasks;
        let Built {
            core,
            sched,
            checker,
        } = ExecCore::build(topo, mit, sched_cfg, cfg, TimerStyle::Local)?;
        let pool = Arc::new(Pool {
            idle_spin_ns: idle_spin(&cfg.mapping),
            timer_advance_max_ns: if cfg.timer_advance {
                timer_advance_max(&cfg.mapping)
            } else {
                0
            },
            core,
            sched,
            bodies: (0..max).map(|_| BodySlot::default()).collect(),
            live: AtomicUsize::new(0),
            keep: cfg.keep_task_stats,
            finished: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
        });
        let wp = Self {
            pool,
            threads: Mutex::new(Vec::new()),
            checker,
        };
        wp.spawn_workers(cfg.task_stack)?;
        let clock = wp.pool.core.start_clock(
            &wp.pool.sched,
            &wp.checker,
            cfg.tick.as_nanos() as u64,
            cfg.check.as_ref(),
            "worker",
        );
        match clock {
            Ok(hs) => lock(&wp.threads).extend(hs),
            Err(e) => {
                wp.stop();
                return Err(e);
            }
        }
        Ok(wp)
    }

    /// Starts one worker thread per CPU.
    fn spawn_workers(&self, stack: usize) -> Result<()> {
        for cpu in 0..self.pool.core.slots.len() as u32 {
            let p = self.pool.clone();
            let h = start_thread(
                format!("worker/{cpu}"),
                Some(stack),
                &format!("the worker of CPU {cpu}"),
                move || worker_main(p, cpu),
            );
            let h = match h {
                Ok(h) => h,
                Err(e) => {
                    self.stop();
                    return Err(e);
                }
            };
            let _ = self.pool.core.slots[cpu as usize]
                .thread
                .set(h.thread().clone());
            lock(&self.threads).push(h);
        }
        Ok(())
    }

    /// The clock every task of this pool runs on.
    pub fn epoch(&self) -> Instant {
        self.pool.core.epoch
    }

    /// ns on the pool's clock (never 0).
    pub fn now(&self) -> u64 {
        self.pool.core.now()
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.pool.sched
    }

    /// Each CPU's worker thread id, by CPU (waits, up to a second, for a
    /// worker that has not started yet; 0 for one that never did).
    pub fn worker_tids(&self) -> Vec<u32> {
        let until = Instant::now() + Duration::from_secs(1);
        self.pool
            .core
            .slots
            .iter()
            .map(|w| loop {
                let t = w.tid.load(Ordering::Acquire);
                if t != 0 || Instant::now() >= until {
                    break t;
                }
                std::thread::sleep(Duration::from_micros(100));
            })
            .collect()
    }

    /// Adds a task running `body`. It does not run until it is first
    /// woken ([`WorkerPool::wake`]), so that a set of tasks can be added
    /// whole (or [discarded](WorkerPool::discard)) before any of them runs.
    pub fn add(
        &self,
        spec: &TaskSpec,
        body: Box<dyn Body>,
        hooks: Option<Arc<dyn Hooks>>,
    ) -> Result<TaskId> {
        let p = &self.pool;
        if p.core.quit.load(Ordering::Acquire) {
            return Err(SchedError::Config("the executor has stopped".into()));
        }
        let id = p.sched.add_task(spec, p.core.now())?;
        let (Some(rt), Some(slot)) = (p.core.task(id), p.bodies.get(id.0 as usize)) else {
            let _ = p.sched.remove_task(id);
            return Err(SchedError::Config(format!(
                "task id {} is beyond the executor's table",
                id.0
            )));
        };
        rt.reset(hooks);
        if lock(&slot.0).replace(body).is_some() {
            p.core
                .violation(format!("task id {} was handed out while still bound", id.0));
        }
        p.live.fetch_add(1, Ordering::AcqRel);
        Ok(id)
    }

    /// Removes a task that was added and never woken (undoing a set that
    /// could not be added whole). Its body is dropped unentered.
    pub fn discard(&self, id: TaskId) {
        let p = &self.pool;
        if let Some(slot) = p.bodies.get(id.0 as usize) {
            if lock(&slot.0).take().is_some() {
                p.live.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if let Some(rt) = p.core.task(id) {
            rt.clear();
        }
        let _ = p.sched.remove_task(id);
    }

    /// Wakes a task from a thread that is not a managed CPU (its first
    /// wake lets a task made with [`WorkerPool::add`] run); true if it was
    /// blocked.
    pub fn wake(&self, t: TaskId) -> bool {
        self.pool.core.wake(&self.pool.sched, t, None)
    }

    /// [`WorkerPool::wake`] as an owned handle (see
    /// [`RemoteWaker`](super::RemoteWaker)).
    pub fn remote_waker(&self) -> super::RemoteWaker {
        let (core, sched) = (self.pool.core.clone(), self.pool.sched.clone());
        super::RemoteWaker::new(move |t| core.wake(&sched, t, None))
    }

    /// What the thread acting for `cpu` is doing, as the checker sees it
    /// (parked without a kick, or runnable with its host CPU time).
    pub fn liveness(&self, cpu: CpuId) -> crate::check::Liveness {
        super::clock::ClockHost::liveness(&*self.pool.core, cpu)
    }

    /// Tasks added and not retired yet.
    pub fn live_tasks(&self) -> usize {
        self.pool.live.load(Ordering::Acquire)
    }

    /// While the guard lives, tasks are being torn down (RT waits are
    /// expected): the checker takes no snapshots.
    pub fn quiesce(&self) -> Quiesced<'_> {
        self.pool.core.detaching.fetch_add(1, Ordering::AcqRel);
        Quiesced(self)
    }

    /// Scheduler counters so far.
    pub fn counters(&self) -> SchedCounters {
        self.pool.sched.counters()
    }

    /// What CPU `cpu`'s worker is doing, for diagnostics: the task it
    /// published as current (or idle), whether it is parked, whether a
    /// kick is pending, and its thread's host CPU time so far.
    pub fn cpu_state(&self, cpu: CpuId) -> String {
        let (core, sched) = (&self.pool.core, &self.pool.sched);
        let Some(w) = core.slots.get(cpu as usize) else {
            return format!("no CPU {cpu}");
        };
        let cur = match w.owner.load(Ordering::SeqCst) {
            IDLE => "idle".to_string(),
            t => format!("task {t}"),
        };
        let tid = w.tid.load(Ordering::Acquire);
        format!(
            "CPU {cpu}: worker runs {cur}, parked {}, kick pending {}, core current {:?}, needs attention {:?}, host CPU {:?}, {}",
            w.parked.load(Ordering::SeqCst),
            w.token.load(Ordering::SeqCst),
            sched.current(cpu).ok().flatten().map(|t| t.0),
            sched.needs_attention(cpu).ok(),
            runnable_thread(tid),
            crate::os_thread::describe_thread(tid),
        )
    }

    /// Per CPU: ns inside `schedule` and `schedule` calls, so far.
    pub fn sched_time_per_cpu(&self) -> (Vec<u64>, Vec<u64>) {
        let c = &self.pool.core.counters;
        (
            c.iter()
                .map(|s| s.sched_ns.load(Ordering::Relaxed))
                .collect(),
            c.iter()
                .map(|s| s.sched_calls.load(Ordering::Relaxed))
                .collect(),
        )
    }

    /// Executor invariant violations and scheduler anomalies so far (and
    /// the checker's findings).
    pub fn violations(&self) -> Vec<String> {
        let mut v = self.pool.sched.anomalies();
        v.extend(self.pool.core.violations());
        if let Some(c) = lock(&self.checker).as_ref() {
            v.extend(c.violations.iter().cloned());
        }
        v
    }

    /// Asks every body to end ([`Cx::stopping`](super::Cx::stopping)) and
    /// keeps waking and preempting the tasks until all have, then stops
    /// the workers and the clock. Fails, naming some, if tasks are left
    /// after `timeout`.
    pub fn shutdown(&self, timeout: Duration) -> Result<ExecReport> {
        let (core, sched) = (&self.pool.core, &self.pool.sched);
        core.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        while self.live_tasks() > 0 {
            for t in sched.live_tasks() {
                let _ = sched.wake(t, None, core.now());
                if let Some(rt) = core.task(t) {
                    rt.preempt.store(true, Ordering::Release);
                    if let Some(h) = rt.hooks().as_ref() {
                        h.preempt();
                    }
                }
            }
            if Instant::now() > deadline {
                let left: Vec<String> = sched
                    .live_tasks()
                    .into_iter()
                    .take(8)
                    .map(|t| format!("task {} {:?}", t.0, sched.task_state(t)))
                    .collect();
                let n = self.live_tasks();
                self.stop();
                return Err(SchedError::Workload(format!(
                    "{n} tasks did not end within {timeout:?} of shutdown: {}; \
                     bodies must return when Cx::stopping() is true",
                    left.join(", ")
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some(c) = lock(&self.checker).as_mut() {
            c.observe(sched, core.now());
        }
        self.stop();
        Ok(self.report())
    }

    /// The totals so far.
    pub fn report(&self) -> ExecReport {
        let (core, sched) = (&self.pool.core, &self.pool.sched);
        let (sched_ns_per_cpu, sched_calls_per_cpu) = self.sched_time_per_cpu();
        let (checks, rt_waits_seen) = match lock(&self.checker).as_ref() {
            Some(c) => {
                if c.host_starved > 0 {
                    tracing::warn!(
                        "{} RT waits outlived the checker's grace period because the worker \
                         that had to act got no host CPU (more workers than host CPUs); \
                         not counted as scheduler faults",
                        c.host_starved
                    );
                }
                (c.checks, c.rt_waits_seen)
            }
            None => (0, 0),
        };
        let mut tasks = lock(&self.pool.finished).clone();
        tasks.sort_by_key(|(i, _)| *i);
        ExecReport {
            counters: sched.counters(),
            sched_ns_per_cpu,
            sched_calls_per_cpu,
            grants_per_cpu: Vec::new(),
            idle_wakeups_per_cpu: core
                .counters
                .iter()
                .map(|c| c.idle_wakeups.load(Ordering::Relaxed))
                .collect(),
            timer_spin_ns_per_cpu: core
                .counters
                .iter()
                .map(|c| c.timer_spin_ns.load(Ordering::Relaxed))
                .collect(),
            tasks: tasks.into_iter().map(|(_, s)| s).collect(),
            failures: lock(&self.pool.failures).clone(),
            violations: self.violations(),
            checks,
            rt_waits_seen,
            pin_errors: core.pin_errors.load(Ordering::Relaxed),
            host_schedstat: Vec::new(),
        }
    }

    /// Stops the workers and the clock. Tasks still running are asked to
    /// end first (a worker leaves its loop only when its CPU is idle).
    pub fn stop(&self) {
        let core = &self.pool.core;
        core.stopping.store(true, Ordering::SeqCst);
        core.quit.store(true, Ordering::SeqCst);
        for t in self.pool.sched.live_tasks() {
            let _ = self.pool.sched.wake(t, None, core.now());
            if let Some(rt) = core.task(t) {
                if let Some(h) = rt.hooks().as_ref() {
                    h.preempt();
                }
            }
        }
        for w in core.slots.iter() {
            w.kick_own();
        }
        core.timers.wake_clock();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for h in threads {
            let _ = h.join();
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// See [`WorkerPool::quiesce`].
pub struct Quiesced<'a>(&'a WorkerPool);

impl Drop for Quiesced<'_> {
    fn drop(&mut self) {
        self.0.pool.core.detaching.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Spawner for WorkerPool {
    fn topology(&self) -> &Arc<HostTopology> {
        self.pool.sched.topology()
    }
    fn now(&self) -> u64 {
        self.pool.core.now()
    }
    fn create_group(&self, name: &str) -> Result<GroupId> {
        self.pool.sched.create_group(name)
    }
    fn spawn(&self, spec: &TaskSpec, body: Box<dyn Body>) -> Result<TaskId> {
        let id = self.add(spec, body, None)?;
        WorkerPool::wake(self, id);
        Ok(id)
    }
    fn wake(&self, t: TaskId) -> bool {
        WorkerPool::wake(self, t)
    }
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.pool.sched.set_affinity(t, mask, self.pool.core.now())
    }
    fn alive(&self, t: TaskId) -> bool {
        self.pool.sched.task_state(t).is_ok()
    }
}
