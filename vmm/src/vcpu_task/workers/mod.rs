//! The M:N executor: one worker thread per logical CPU, pinned to that
//! CPU's host CPU, runs whichever vCPU the scheduler picks for its CPU by
//! calling `KVM_RUN` on that vCPU's fd itself.
//!
//! Compared with one thread per vCPU, switching from one vCPU to another
//! on a CPU is a function return and a call, not a hand-over between two
//! host threads (a futex wake, a park and two host context switches). The
//! price is that a vCPU's fd is entered from whichever worker runs it:
//! KVM loads the vCPU state on that thread, about 2 us the first time
//! (docs/kvm-notes.md). Measured both ways in `docs/results-vcpus.md`.
//!
//! It drives the same [`Scheduler`] core through the same calls as the
//! threads executor:
//! * a worker holds its CPU's run slot for good; whenever its vCPU blocks,
//!   sleeps, yields or ends, or the CPU needs attention, it calls
//!   `schedule(cpu, prev, now)` and runs what comes back, or parks when
//!   the CPU goes idle;
//! * the core's kicks land here: an idle worker is unparked; a busy one's
//!   current vCPU is kicked out of `KVM_RUN` (`immediate_exit` + signal);
//! * no lost kicks: a kicker sets the CPU's flag, fences, then reads the
//!   worker's `current`; a worker publishes `current`, fences, then checks
//!   `needs_attention`, and checks it again right before every `KVM_RUN`
//!   (a kick after that check finds `immediate_exit`);
//! * one clock thread ticks every CPU, fires sleep timers and, when asked,
//!   runs the invariant checker.

mod worker;

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use vcpu_sched::exec::{
    run_clock, runnable_thread, set_host_rt, ClockHost, ClockPeriods, TimerQueue,
};
use vcpu_sched::sched::KickCpu;
use vcpu_sched::{
    CpuId, InvariantChecker, Liveness, SchedCounters, Scheduler, TaskId, TaskSpec, TaskStats,
};

use super::{ExecOptions, ExecOutcome, TaskError, VcpuSlot, VmSet};
use worker::worker_main;

const IDLE: u32 = u32::MAX;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One CPU's worker, shared with kickers.
#[repr(align(128))]
struct WorkerCpu {
    /// The task whose vCPU this worker runs, or [`IDLE`].
    current: AtomicU32,
    /// Set by a kick to an idle worker.
    token: AtomicBool,
    /// Set while the worker sleeps for want of a kick (with `token`, it
    /// tells the checker a sleeping worker from a starved one).
    parked: AtomicBool,
    /// Its kernel thread id (0 until it starts), for its host CPU time.
    tid: AtomicU32,
    thread: OnceLock<Thread>,
    host_cpu: u32,
}

/// One CPU's counters, written by its worker only.
#[repr(align(128))]
#[derive(Default)]
struct WorkerStats {
    sched_ns: AtomicU64,
    sched_calls: AtomicU64,
}

/// Per-vCPU executor state.
#[repr(align(128))]
#[derive(Default)]
struct TaskRt {
    /// A sleep's due time (0: not sleeping).
    sleep_due: AtomicU64,
    /// When it halted (0: not halted), for the doorbell latency.
    halt_at: AtomicU64,
    timer_gen: AtomicU64,
}

struct Shared {
    set: Arc<VmSet>,
    cpus: Box<[WorkerCpu]>,
    stats: Box<[WorkerStats]>,
    rt: Box<[TaskRt]>,
    /// Task id -> global vCPU index.
    by_task: Box<[OnceLock<usize>]>,
    timers: TimerQueue,
    quit: AtomicBool,
    live: AtomicUsize,
    violations: Mutex<Vec<String>>,
    finished: Mutex<Vec<(usize, TaskStats)>>,
    pin: bool,
    host_rt: Option<u8>,
    pin_errors: AtomicU64,
    check: bool,
}

/// Refuses more vCPUs than the scheduler holds tasks, and a zero tick.
fn check_options(opts: &ExecOptions, nslots: usize) -> Result<(), TaskError> {
    let max = opts.sched.max_tasks;
    if nslots > max {
        return Err(TaskError::Input(format!(
            "{nslots} vCPUs, but the scheduler holds at most {max} tasks"
        )));
    }
    if opts.tick.is_zero() {
        return Err(TaskError::Input("the tick must be positive".into()));
    }
    Ok(())
}

impl Shared {
    /// The state of an executor for `set`, every worker idle.
    fn new(opts: &ExecOptions, set: &Arc<VmSet>) -> Self {
        let n = opts.topology.num_cpus();
        Shared {
            set: set.clone(),
            cpus: (0..n as u32)
                .map(|c| WorkerCpu {
                    current: AtomicU32::new(IDLE),
                    token: AtomicBool::new(false),
                    parked: AtomicBool::new(false),
                    tid: AtomicU32::new(0),
                    thread: OnceLock::new(),
                    host_cpu: opts.host_cpu(c),
                })
                .collect(),
            stats: (0..n).map(|_| WorkerStats::default()).collect(),
            rt: (0..set.slots().len()).map(|_| TaskRt::default()).collect(),
            by_task: (0..opts.sched.max_tasks).map(|_| OnceLock::new()).collect(),
            timers: TimerQueue::new(),
            quit: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            violations: Mutex::new(Vec::new()),
            finished: Mutex::new(Vec::new()),
            pin: true,
            host_rt: opts.host_rt,
            pin_errors: AtomicU64::new(0),
            check: opts.check.is_some(),
        }
    }

    fn violation(&self, v: String) {
        tracing::error!("executor invariant violated: {v}");
        lock(&self.violations).push(v);
    }

    fn slot_of(&self, t: TaskId) -> Option<&Arc<VcpuSlot>> {
        let g = *self.by_task.get(t.0 as usize)?.get()?;
        self.set.slots().get(g)
    }
}

struct WorkerKick(Arc<Shared>);

impl KickCpu for WorkerKick {
    fn kick(&self, cpu: CpuId) {
        let sh = &self.0;
        fence(Ordering::SeqCst);
        let w = &sh.cpus[cpu as usize];
        match w.current.load(Ordering::SeqCst) {
            IDLE => {
                w.token.store(true, Ordering::Release);
                if let Some(t) = w.thread.get() {
                    t.unpark();
                }
            }
            t => {
                if let Some(s) = sh.slot_of(TaskId(t)) {
                    s.kicker().kick();
                }
            }
        }
    }
}

/// The M:N executor.
pub struct WorkerExecutor {
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    threads: Vec<JoinHandle<()>>,
    checker: Arc<Mutex<Option<InvariantChecker>>>,
}

impl WorkerExecutor {
    pub(crate) fn start(opts: &ExecOptions, set: &Arc<VmSet>) -> Result<Self, TaskError> {
        check_options(opts, set.slots().len())?;
        let sh = Arc::new(Shared::new(opts, set));
        let sched = Arc::new(Scheduler::new(
            opts.topology.clone(),
            opts.mitigations,
            opts.sched.clone(),
            Arc::new(WorkerKick(sh.clone())),
        )?);
        let checker = Arc::new(Mutex::new(
            opts.check
                .as_ref()
                .map(|c| InvariantChecker::new(c.grace.as_nanos() as u64)),
        ));
        let mut ex = Self {
            sh,
            sched: sched.clone(),
            threads: Vec::new(),
            checker,
        };
        // Tasks first (blocked), then the threads, then wake them all.
        let ids = match ex.launch(opts, set) {
            Ok(ids) => ids,
            Err(e) => {
                set.request_stop();
                let _ = ex.shutdown(Duration::from_secs(10));
                return Err(e);
            }
        };
        set.mark_started();
        for id in ids {
            let _ = sched.wake(id, None, set.now());
        }
        Ok(ex)
    }

    /// Adds every vCPU as a (blocked) task, then starts the workers and the
    /// clock thread; returns the tasks to wake.
    fn launch(&mut self, opts: &ExecOptions, set: &VmSet) -> Result<Vec<TaskId>, TaskError> {
        let ids = self.add_tasks(set)?;
        self.spawn_workers()?;
        self.spawn_clock(opts)?;
        Ok(ids)
    }

    /// Creates a group per VM and a task per vCPU, in vCPU order.
    fn add_tasks(&self, set: &VmSet) -> Result<Vec<TaskId>, TaskError> {
        let (sh, sched) = (&self.sh, &self.sched);
        for vm in set.vms() {
            let g = sched.create_group(&vm.name)?;
            let _ = vm.group.set(g);
        }
        let mut ids = Vec::with_capacity(set.slots().len());
        for slot in set.slots() {
            let vm = &set.vms()[slot.vm];
            let mut spec =
                TaskSpec::new(super::threads::task_name(set, slot)).policy(slot.placement.policy);
            if let Some(g) = vm.group.get() {
                spec = spec.group(*g);
            }
            if let Some(m) = slot.placement.affinity {
                spec = spec.affinity(m);
            }
            let id = sched.add_task(&spec, set.now())?;
            let _ = sh.by_task[id.0 as usize].set(slot.global);
            let _ = slot.task.set(id);
            sh.live.fetch_add(1, Ordering::AcqRel);
            ids.push(id);
        }
        Ok(ids)
    }

    /// Starts one worker thread per CPU.
    fn spawn_workers(&mut self) -> Result<(), TaskError> {
        for cpu in 0..self.sh.cpus.len() as u32 {
            let (sh2, s2) = (self.sh.clone(), self.sched.clone());
            let h = std::thread::Builder::new()
                .name(format!("worker/{cpu}"))
                .stack_size(256 << 10)
                .spawn(move || worker_main(sh2, s2, cpu))
                .map_err(|e| TaskError::Os {
                    context: format!("cannot start the worker of CPU {cpu}"),
                    source: e,
                })?;
            let _ = self.sh.cpus[cpu as usize].thread.set(h.thread().clone());
            self.threads.push(h);
        }
        Ok(())
    }

    /// Starts the clock thread (ticks, sleep timers, the checker).
    fn spawn_clock(&mut self, opts: &ExecOptions) -> Result<(), TaskError> {
        let (sh2, s2, ck) = (self.sh.clone(), self.sched.clone(), self.checker.clone());
        let periods = ClockPeriods {
            tick: opts.tick.as_nanos() as u64,
            check: opts.check.as_ref().map(|c| c.interval.as_nanos() as u64),
        };
        let h = std::thread::Builder::new()
            .name("worker-clock".into())
            .spawn(move || {
                host_rt(&sh2, 1);
                run_clock(&*sh2, &s2, &sh2.timers, periods, &ck)
            })
            .map_err(|e| TaskError::Os {
                context: "cannot start the clock thread".into(),
                source: e,
            })?;
        self.sh.timers.set_clock_thread(h.thread().clone());
        self.threads.push(h);
        Ok(())
    }

    pub(crate) fn counters(&self) -> SchedCounters {
        self.sched.counters()
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.sched
    }

    pub(crate) fn wake_slot(&self, s: &VcpuSlot, waker: Option<CpuId>) {
        if let Some(t) = s.task.get() {
            let _ = self.sched.wake(*t, waker, self.sh.set.now());
        }
    }

    pub(crate) fn shutdown(mut self, timeout: Duration) -> Result<ExecOutcome, TaskError> {
        let set = self.sh.set.clone();
        let stuck = super::drain(
            &set,
            timeout,
            &|s| self.wake_slot(s, None),
            &|s| {
                let t = s.task.get().copied();
                format!(
                    "{} ({:?}, {:?})",
                    super::threads::task_name(&set, s),
                    t.map(|t| self.sched.task_state(t)),
                    t.map(|t| self.sched.task_cpu(t))
                )
            },
            &mut || self.sh.live.load(Ordering::Acquire) == 0,
        )
        .err();
        if let Some(c) = lock(&self.checker).as_mut() {
            if stuck.is_none() {
                c.observe(&self.sched, set.now());
            }
        }
        self.stop_threads();
        if let Some(e) = stuck {
            return Err(e);
        }
        let n = self.sched.num_cpus();
        let st = &self.sh.stats;
        let mut tasks = vec![None; set.slots().len()];
        for (g, s) in std::mem::take(&mut *lock(&self.sh.finished)) {
            tasks[g] = Some(s);
        }
        let (checks, mut violations) = match lock(&self.checker).as_ref() {
            Some(c) => {
                if c.host_starved > 0 {
                    tracing::warn!(
                        "{} RT waits outlived the checker's grace period because the worker \
                         that had to act got no host CPU (more workers than host CPUs); \
                         not counted as scheduler faults",
                        c.host_starved
                    );
                }
                (c.checks, c.violations.clone())
            }
            None => (0, Vec::new()),
        };
        violations.extend(self.sched.anomalies());
        violations.extend(lock(&self.sh.violations).iter().cloned());
        Ok(ExecOutcome {
            tasks,
            host_schedstat: Vec::new(),
            counters: self.sched.counters(),
            sched_ns_per_cpu: (0..n)
                .map(|c| st[c].sched_ns.load(Ordering::Relaxed))
                .collect(),
            sched_calls_per_cpu: (0..n)
                .map(|c| st[c].sched_calls.load(Ordering::Relaxed))
                .collect(),
            violations,
            checks,
            pin_errors: self.sh.pin_errors.load(Ordering::Relaxed),
        })
    }

    fn stop_threads(&mut self) {
        self.sh.quit.store(true, Ordering::SeqCst);
        for w in self.sh.cpus.iter() {
            w.token.store(true, Ordering::Release);
            if let Some(t) = w.thread.get() {
                t.unpark();
            }
        }
        self.sh.timers.wake_clock();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for WorkerExecutor {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.sh.set.request_stop();
            self.stop_threads();
        }
    }
}

/// Gives the calling thread host `SCHED_FIFO` at `host_rt + above`, if
/// asked; warns once where that is not permitted.
fn host_rt(sh: &Shared, above: u8) {
    if let Some(p) = sh.host_rt {
        set_host_rt(p, above);
    }
}

impl ClockHost for Shared {
    fn now(&self) -> u64 {
        self.set.now()
    }

    fn quit(&self) -> bool {
        self.quit.load(Ordering::Acquire)
    }

    fn stopping(&self) -> bool {
        self.set.stopping()
    }

    fn fire(&self, sched: &Scheduler, slot: usize, gen: u64, now: u64) {
        if self.rt[slot].timer_gen.load(Ordering::Acquire) == gen {
            if let Some(&tk) = self.set.slots()[slot].task.get() {
                let _ = sched.wake(tk, None, now);
            }
        }
    }

    /// A worker is parked only between giving up its CPU and a kick's
    /// token; otherwise it is working or waiting for a host CPU, and its
    /// host CPU time says which.
    fn liveness(&self, cpu: CpuId) -> Liveness {
        let Some(w) = self.cpus.get(cpu as usize) else {
            return Liveness::Unknown;
        };
        if w.parked.load(Ordering::SeqCst) && !w.token.load(Ordering::SeqCst) {
            return Liveness::Parked;
        }
        runnable_thread(w.tid.load(Ordering::Acquire))
    }
}
