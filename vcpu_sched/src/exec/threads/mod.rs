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
//! * The core's [`KickCpu`] lands here: a kicked CPU's idle context is
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

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use crate::check::{InvariantChecker, Liveness};
use crate::config::SchedConfig;
use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};
use crate::exec::clock::{run_clock, ClockHost, ClockPeriods, TimerQueue};
use crate::mitigations::Mitigations;
use crate::sched::Scheduler;
use crate::stats::{SchedCounters, TaskStats};
use crate::task::{CpuId, TaskId, TaskSpec};
use crate::tasks::lock;

mod ctx;
mod idle;
mod shared;

pub use crate::os_thread::{
    allowed_host_cpus, pin_current_thread, set_current_thread_policy, set_host_rt,
};
use ctx::task_main;
pub use ctx::TaskCtx;
use idle::idle_main;
use shared::{CpuExec, ExecKicker, Shared, Slot, TaskRt};

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
        let mut sys_threads = start_idle_contexts(&sh, &sched)?;
        sys_threads.push(start_clock(&sh, &sched, &checker, &cfg)?);
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
                let err = self.stuck(&threads, timeout);
                self.stop_system();
                return Err(err);
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
                s.current(cpu).ok().flatten(),
                self.sh.slots[cpu as usize].owner.load(Ordering::Relaxed),
                s.needs_attention(cpu).unwrap_or(false),
                grant,
                on,
                rt.preempt.load(Ordering::Relaxed)
            ),
            (Err(e), _) | (_, Err(e)) => format!("task {}: {e}", t.0),
        }
    }

    /// The error for task bodies still running at the shutdown deadline,
    /// with what is known about where they are (also logged).
    fn stuck(&self, threads: &[(TaskId, JoinHandle<()>)], timeout: Duration) -> SchedError {
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
        SchedError::Workload(format!(
            "{} task bodies did not return within {:?} of shutdown (tasks {}; {}); \
             bodies must return when TaskCtx::stopping() is true",
            threads.len(),
            timeout,
            names.join(","),
            detail.join("; ")
        ))
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

/// Starts one idle context per CPU; they hold the slots at first.
fn start_idle_contexts(sh: &Arc<Shared>, sched: &Arc<Scheduler>) -> Result<Vec<JoinHandle<()>>> {
    let mut sys_threads = Vec::new();
    for cpu in 0..sh.slots.len() as u32 {
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
    Ok(sys_threads)
}

/// Starts the clock thread: ticks, timers and the checker.
fn start_clock(
    sh: &Arc<Shared>,
    sched: &Arc<Scheduler>,
    checker: &Arc<Mutex<Option<InvariantChecker>>>,
    cfg: &ExecConfig,
) -> Result<JoinHandle<()>> {
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
    Ok(h)
}
