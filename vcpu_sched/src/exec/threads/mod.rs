//! The threads executor: one OS thread per task, one idle context per CPU,
//! and a run slot per CPU that exactly one of them holds at a time.
//!
//! * A task's thread enters its [`Body`] only while it holds a CPU's run
//!   slot. When the body blocks, yields, ends or reaches a preemption
//!   checkpoint, the thread asks the core what runs next and hands the
//!   slot over: it publishes the new owner, gives the grant to the next
//!   thread and unparks it, then parks itself until it is granted a slot
//!   again. Parking is `std::thread::park` (a futex on Linux): nothing
//!   spins, which matters in a VM, where a spinning waiter can be burning
//!   the time slice of the very thread it waits for.
//! * A thread granted a different CPU than before moves its OS affinity to
//!   that CPU's host CPU first.
//! * Each managed CPU has an idle context, a thread pinned to that CPU's
//!   host CPU, which holds the slot while the CPU is idle and parks until
//!   it is kicked.
//! * The core's kicks land on the run slots (`exec::shared`): a kicked
//!   CPU's idle context is unparked, or its running task's preempt flag is
//!   raised and its [`Hooks::preempt`] called.
//! * One clock thread ticks every CPU and fires timers; the invariant
//!   checker, when asked for, runs on a thread of its own.
//!
//! Emulated topologies: logical CPU `i` of a big topology runs on host CPU
//! `real[i % real.len()]` ([`CpuMapping::Emulated`]), so a 384-CPU
//! `genoa-2s` runs, slowly but faithfully, on 2 CPUs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use topology::HostTopology;

use super::body::{Body, Hooks, Spawner};
use super::config::{CpuMapping, ExecConfig, ExecReport};
use super::shared::{start_thread, Built, CpuCounters, ExecCore, TimerStyle, IDLE};
use crate::check::{InvariantChecker, Liveness};
use crate::config::SchedConfig;
use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};
use crate::exec::clock::ClockHost;
use crate::mitigations::Mitigations;
use crate::sched::Scheduler;
use crate::stats::TaskStats;
use crate::task::{CpuId, GroupId, TaskId, TaskSpec};
use crate::tasks::lock;

mod ctx;
mod handover;
mod idle;

pub(crate) use ctx::panic_message;
use ctx::task_main;
use handover::Shared;
use idle::idle_main;

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
    /// Builds a scheduler for `topo` and starts the idle contexts, the
    /// clock thread and, if asked, the checker.
    pub fn new(
        topo: Arc<HostTopology>,
        mit: Mitigations,
        sched_cfg: SchedConfig,
        cfg: ExecConfig,
    ) -> Result<Self> {
        let Built {
            core,
            sched,
            checker,
        } = ExecCore::build(topo, mit, sched_cfg, &cfg, TimerStyle::Clock)?;
        let sh = Arc::new(Shared::new(core.clone()));
        let mut ex = Self {
            sh,
            sched,
            task_threads: Mutex::new(Vec::new()),
            sys_threads: Vec::new(),
            checker,
            stack: cfg.task_stack,
        };
        ex.start_idle_contexts()?;
        let clock = core.start_clock(
            &ex.sched,
            &ex.checker,
            cfg.tick.as_nanos() as u64,
            cfg.check.as_ref(),
            "sched",
        )?;
        ex.sys_threads.extend(clock);
        Ok(ex)
    }

    /// Starts one idle context per CPU; they hold the slots at first.
    fn start_idle_contexts(&mut self) -> Result<()> {
        for cpu in 0..self.sh.core.slots.len() as u32 {
            let (sh, s) = (self.sh.clone(), self.sched.clone());
            let h = start_thread(
                format!("idle/{cpu}"),
                Some(64 << 10),
                &format!("the idle context of CPU {cpu}"),
                move || idle_main(sh, s, cpu),
            )?;
            let _ = self.sh.core.slots[cpu as usize]
                .thread
                .set(h.thread().clone());
            self.sys_threads.push(h);
        }
        Ok(())
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.sched
    }

    /// What the thread acting for `cpu` is doing, as the checker sees it
    /// (parked without a kick, or runnable with its host CPU time).
    pub fn liveness(&self, cpu: CpuId) -> Liveness {
        ClockHost::liveness(&*self.sh.core, cpu)
    }

    /// The executor's clock, ns since it started.
    pub fn now(&self) -> u64 {
        self.sh.core.now()
    }

    /// The host CPU logical CPU `cpu` runs on.
    pub fn host_cpu(&self, cpu: CpuId) -> u32 {
        self.sh.core.slots[cpu as usize].host_cpu
    }

    /// The mapping in use.
    pub fn mapping(&self) -> &CpuMapping {
        &self.sh.core.mapping
    }

    /// Creates a task running `body` on a thread of its own, which waits
    /// until the task is first woken ([`ThreadsExecutor::wake`]).
    pub fn add(
        &self,
        spec: &TaskSpec,
        body: Box<dyn Body>,
        hooks: Option<Arc<dyn Hooks>>,
    ) -> Result<TaskId> {
        let core = &self.sh.core;
        let id = self.sched.add_task(spec, core.now())?;
        let (rt, trt) = (&core.tasks[id.0 as usize], &self.sh.trt[id.0 as usize]);
        rt.reset(hooks);
        trt.grant.store(super::shared::NONE, Ordering::Relaxed);
        trt.running_on.store(super::shared::NONE, Ordering::Relaxed);
        trt.host_cpu.store(super::shared::NONE, Ordering::Relaxed);
        let (sh, sched) = (self.sh.clone(), self.sched.clone());
        let h = start_thread(
            format!("task/{}", id.0),
            Some(self.stack),
            &format!("the thread of task {}", spec.name),
            move || task_main(sh, sched, id, body),
        );
        let h = match h {
            Ok(h) => h,
            Err(e) => {
                rt.clear();
                let _ = self.sched.remove_task(id);
                return Err(e);
            }
        };
        *lock(&trt.thread) = Some(h.thread().clone());
        self.sh.live.fetch_add(1, Ordering::AcqRel);
        lock(&self.task_threads).push((id, h));
        Ok(id)
    }

    /// Wakes a task from a thread that is not a managed CPU (its first
    /// wake lets a task made with [`ThreadsExecutor::add`] run).
    pub fn wake(&self, t: TaskId) -> Result<bool> {
        let r = self.sched.wake(t, None, self.sh.core.now());
        self.sh.core.woken(t);
        r
    }

    /// [`ThreadsExecutor::wake`] as an owned handle (see
    /// [`RemoteWaker`](super::RemoteWaker)); a task the scheduler does not
    /// know is not woken.
    pub fn remote_waker(&self) -> super::RemoteWaker {
        let (sh, sched) = (self.sh.clone(), self.sched.clone());
        super::RemoteWaker::new(move |t| {
            let r = sched.wake(t, None, sh.core.now());
            sh.core.woken(t);
            r.unwrap_or(false)
        })
    }

    /// Changes a task's affinity.
    pub fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.sched.set_affinity(t, mask, self.sh.core.now())
    }

    /// Tasks whose body has not returned yet.
    pub fn live_tasks(&self) -> usize {
        self.sh.live.load(Ordering::Acquire)
    }

    /// Violations found so far.
    pub fn violations(&self) -> Vec<String> {
        let mut v = self.sh.core.violations();
        match lock(&self.checker).as_ref() {
            // the checker reports the core's anomalies with its own findings
            Some(c) => v.extend(c.violations.iter().cloned()),
            None => v.extend(self.sched.anomalies()),
        }
        v
    }

    /// Asks every body to return ([`Cx::stopping`](super::Cx::stopping)),
    /// keeps waking them until they have, then stops the idle contexts and
    /// the clock. Fails, naming them, if bodies are still running after
    /// `timeout`.
    pub fn shutdown(mut self, timeout: Duration) -> Result<ExecReport> {
        self.sh.core.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        let mut threads = std::mem::take(&mut *lock(&self.task_threads));
        while !threads.is_empty() {
            for (id, h) in threads.iter() {
                if !h.is_finished() {
                    let _ = self.sched.wake(*id, None, self.sh.core.now());
                }
            }
            let (done, rest): (Vec<_>, Vec<_>) =
                threads.into_iter().partition(|(_, h)| h.is_finished());
            for (_, h) in done {
                if h.join().is_err() {
                    self.sh.core.violation("a task thread panicked".into());
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
            c.observe(&self.sched, self.sh.core.now());
        }
        self.stop_system();
        Ok(self.report())
    }

    /// The totals, after the threads have stopped.
    fn report(&self) -> ExecReport {
        let n = self.sched.num_cpus();
        let ce = &self.sh.core.counters;
        let load = |f: fn(&CpuCounters) -> &AtomicU64| -> Vec<u64> {
            (0..n).map(|c| f(&ce[c]).load(Ordering::Relaxed)).collect()
        };
        let (checks, rt_waits_seen) = lock(&self.checker)
            .as_ref()
            .map_or((0, 0), |c| (c.checks, c.rt_waits_seen));
        let mut tasks: Vec<(TaskId, TaskStats)> = std::mem::take(&mut *lock(&self.sh.finished));
        tasks.sort_by_key(|(i, _)| *i);
        ExecReport {
            counters: self.sched.counters(),
            sched_ns_per_cpu: load(|c| &c.sched_ns),
            sched_calls_per_cpu: load(|c| &c.sched_calls),
            grants_per_cpu: load(|c| &c.grants),
            idle_wakeups_per_cpu: load(|c| &c.idle_wakeups),
            timer_spin_ns_per_cpu: Vec::new(),
            tasks: tasks.into_iter().map(|(_, s)| s).collect(),
            failures: std::mem::take(&mut *lock(&self.sh.failures)),
            violations: self.violations(),
            checks,
            rt_waits_seen,
            pin_errors: self.sh.core.pin_errors.load(Ordering::Relaxed),
            host_schedstat: Vec::new(),
        }
    }

    /// Where a task is, in words (for diagnostics).
    pub fn describe(&self, t: TaskId) -> String {
        let s = &self.sched;
        let Some(trt) = self.sh.trt.get(t.0 as usize) else {
            return format!("task {}: no such task id", t.0);
        };
        let grant = trt.grant.load(Ordering::Relaxed);
        let on = trt.running_on.load(Ordering::Relaxed);
        let preempt = self.sh.core.tasks[t.0 as usize]
            .preempt
            .load(Ordering::Relaxed);
        match (s.task_state(t), s.task_cpu(t)) {
            (Ok(st), Ok(cpu)) => format!(
                "task {} {:?} cpu {cpu} (cpu curr {:?}, owner {}, needs attention {}), grant {}, running_on {}, preempt {}",
                t.0,
                st,
                s.current(cpu).ok().flatten(),
                self.sh.core.slots[cpu as usize].owner.load(Ordering::Relaxed),
                s.needs_attention(cpu).unwrap_or(false),
                grant,
                on,
                preempt
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
                let owner = self.sh.core.slots[cpu as usize]
                    .owner
                    .load(Ordering::Relaxed);
                if owner < IDLE {
                    detail.push(format!("owner: {}", self.describe(TaskId(owner))));
                }
            }
        }
        detail.extend(self.sched.anomalies().into_iter().take(4));
        detail.extend(self.sh.core.violations().into_iter().take(8));
        tracing::error!(
            "stuck task bodies at shutdown: {}\n{}",
            detail.join("; "),
            self.sched.dump()
        );
        SchedError::Workload(format!(
            "{} task bodies did not return within {:?} of shutdown (tasks {}; {}); \
             bodies must return when Cx::stopping() is true",
            threads.len(),
            timeout,
            names.join(","),
            detail.join("; ")
        ))
    }

    fn stop_system(&mut self) {
        let core = &self.sh.core;
        core.quit.store(true, Ordering::SeqCst);
        for s in core.slots.iter() {
            if let Some(t) = s.thread.get() {
                t.unpark();
            }
        }
        core.timers.wake_clock();
        for h in self.sys_threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for ThreadsExecutor {
    fn drop(&mut self) {
        if !self.sys_threads.is_empty() {
            self.sh.core.stopping.store(true, Ordering::SeqCst);
            self.stop_system();
        }
    }
}

impl Spawner for ThreadsExecutor {
    fn topology(&self) -> &Arc<HostTopology> {
        self.sched.topology()
    }
    fn now(&self) -> u64 {
        self.sh.core.now()
    }
    fn create_group(&self, name: &str) -> Result<GroupId> {
        self.sched.create_group(name)
    }
    fn spawn(&self, spec: &TaskSpec, body: Box<dyn Body>) -> Result<TaskId> {
        let id = self.add(spec, body, None)?;
        ThreadsExecutor::wake(self, id)?;
        Ok(id)
    }
    fn wake(&self, t: TaskId) -> bool {
        ThreadsExecutor::wake(self, t).unwrap_or(false)
    }
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        ThreadsExecutor::set_affinity(self, t, mask)
    }
    fn alive(&self, t: TaskId) -> bool {
        self.sched.task_state(t).is_ok()
    }
}
