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
//!
//! # One pool, many sets
//! [`WorkerPool`] is the executor itself: the scheduler, the workers and
//! the clock, running with no vCPU at all until a [`VmSet`] is
//! [attached](WorkerPool::attach). Sets join and leave while others run
//! (`vmm serve` attaches one per booted VM, so every VM shares one
//! scheduler and its fixes). A task id names its vCPU through a binding
//! (set, index) that is written when the task is added and cleared when
//! it is removed, before its id can be reused. [`WorkerExecutor`] is a
//! pool with one set, for runs that start and stop together
//! (`vmm bench`, `vmm run`).

mod worker;

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use vcpu_sched::exec::{
    run_checker, run_clock, runnable_thread, set_host_rt, ClockHost, ClockPeriods, TimerQueue,
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

/// The vCPU a task id runs: its set and its index in that set.
struct Bound {
    set: Arc<VmSet>,
    global: usize,
}

/// Per task id: executor state, and the vCPU bound to the id.
#[repr(align(128))]
#[derive(Default)]
struct TaskRt {
    /// A sleep's due time (0: not sleeping).
    sleep_due: AtomicU64,
    /// When it halted (0: not halted), for the doorbell latency.
    halt_at: AtomicU64,
    timer_gen: AtomicU64,
    /// Written by `attach` (a free id) and by the task's removal; read by
    /// the worker that runs it and by kickers. `None`: a free id.
    bound: RwLock<Option<Bound>>,
}

impl TaskRt {
    fn bound(&self) -> RwLockReadGuard<'_, Option<Bound>> {
        self.bound.read().unwrap_or_else(|p| p.into_inner())
    }
    fn bind(&self, b: Option<Bound>) -> Option<Bound> {
        let mut w = self.bound.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *w, b)
    }
}

struct Shared {
    /// The clock every attached set runs on.
    epoch: Instant,
    cpus: Box<[WorkerCpu]>,
    stats: Box<[WorkerStats]>,
    /// By task id (the scheduler's `max_tasks`).
    rt: Box<[TaskRt]>,
    timers: TimerQueue,
    quit: AtomicBool,
    /// Sets being detached (their RT waits are expected, see `stopping`).
    detaching: AtomicUsize,
    /// Some attached set stamps wakeup stages (`VmSet::set_breakdown`).
    breakdown: AtomicBool,
    violations: Mutex<Vec<String>>,
    pin: bool,
    /// How long an idle worker polls for a kick before it parks (0: it
    /// parks at once). See `idle_spin`.
    idle_spin_ns: u64,
    host_rt: Option<u8>,
    pin_errors: AtomicU64,
    check: bool,
}

/// How long an idle worker polls before parking: the same idea as KVM's
/// halt polling (`halt_poll_ns`, 200 us by default), at a quarter of it.
/// A kick that lands while the worker polls is taken without the futex
/// wake of a parked thread (about 20 us here, the "wake -> picked" stage
/// of `vmm bench --breakdown`). Only where every worker has a host CPU of
/// its own: on an emulated topology (many workers per host CPU) a polling
/// worker would take the CPU the others need.
fn idle_spin(opts: &ExecOptions) -> u64 {
    let own_cpus = matches!(opts.mapping, vcpu_sched::exec::CpuMapping::Host);
    if own_cpus {
        IDLE_SPIN_NS
    } else {
        0
    }
}

/// See [`idle_spin`].
const IDLE_SPIN_NS: u64 = 50_000;

/// How late the clock thread fires a sleep timer that the parked worker
/// which armed it is due to fire itself (see `ClockHost::fire`).
const TIMER_BACKSTOP_NS: u64 = 100_000;

/// Refuses a zero tick.
fn check_options(opts: &ExecOptions) -> Result<(), TaskError> {
    if opts.tick.is_zero() {
        return Err(TaskError::Input("the tick must be positive".into()));
    }
    Ok(())
}

impl Shared {
    /// The state of a pool with no vCPU, every worker idle.
    fn new(opts: &ExecOptions, epoch: Instant) -> Self {
        let n = opts.topology.num_cpus();
        Shared {
            epoch,
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
            rt: (0..opts.sched.max_tasks)
                .map(|_| TaskRt::default())
                .collect(),
            timers: TimerQueue::new(),
            quit: AtomicBool::new(false),
            detaching: AtomicUsize::new(0),
            breakdown: AtomicBool::new(false),
            violations: Mutex::new(Vec::new()),
            pin: true,
            idle_spin_ns: idle_spin(opts),
            host_rt: opts.host_rt,
            pin_errors: AtomicU64::new(0),
            check: opts.check.is_some(),
        }
    }

    /// ns since the pool's epoch (never 0), the same as every attached
    /// set's [`VmSet::now`].
    #[inline]
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn violation(&self, v: String) {
        tracing::error!("executor invariant violated: {v}");
        lock(&self.violations).push(v);
    }

    fn rt(&self, t: TaskId) -> Option<&TaskRt> {
        self.rt.get(t.0 as usize)
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
                // A task being removed has no binding any more; the worker
                // checks `needs_attention` after it publishes its next
                // `current`, so this kick is not lost.
                if let Some(rt) = sh.rt(TaskId(t)) {
                    if let Some(b) = rt.bound().as_ref() {
                        b.set.slots()[b.global].kicker().kick();
                    }
                }
            }
        }
    }
}

/// The M:N executor: the scheduler, one worker per CPU and the clock,
/// running whichever sets are attached.
pub struct WorkerPool {
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    checker: Arc<Mutex<Option<InvariantChecker>>>,
}

impl WorkerPool {
    /// Starts the scheduler, the workers and the clock, with no vCPU yet;
    /// sets attached later must be made on [`WorkerPool::epoch`].
    pub fn start(opts: &ExecOptions) -> Result<Self, TaskError> {
        Self::start_at(opts, Instant::now())
    }

    /// Like [`WorkerPool::start`], on a clock that started at `epoch`.
    pub(crate) fn start_at(opts: &ExecOptions, epoch: Instant) -> Result<Self, TaskError> {
        check_options(opts)?;
        let sh = Arc::new(Shared::new(opts, epoch));
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
        let pool = Self {
            sh,
            sched,
            threads: Mutex::new(Vec::new()),
            checker,
        };
        pool.spawn_workers()?;
        pool.spawn_clock(opts)?;
        Ok(pool)
    }

    /// The clock sets attached to this pool run on (`VmSet::new_on`).
    pub fn epoch(&self) -> Instant {
        self.sh.epoch
    }

    /// ns on the pool's clock.
    pub fn now(&self) -> u64 {
        self.sh.now()
    }

    /// Adds every vCPU of `set` as a task (a task group per VM), then lets
    /// them run. All or nothing: if the scheduler refuses one (full, a bad
    /// affinity), the tasks and groups added so far are removed again.
    pub fn attach(&self, set: &Arc<VmSet>) -> Result<(), TaskError> {
        if set.started() {
            return Err(TaskError::Input("this set has already run".into()));
        }
        if set.epoch() != self.sh.epoch {
            return Err(TaskError::Input(
                "this set runs on another clock; make it with VmSet::new_on(.., pool.epoch())"
                    .into(),
            ));
        }
        if self.sh.quit.load(Ordering::Acquire) {
            return Err(TaskError::Input("the executor has stopped".into()));
        }
        let mut ids = Vec::with_capacity(set.slots().len());
        if let Err(e) = self.add_tasks(set, &mut ids) {
            for &id in &ids {
                self.sh.rt[id.0 as usize].bind(None);
                let _ = self.sched.remove_task(id);
            }
            for vm in set.vms() {
                if let Some(g) = vm.group.get() {
                    let _ = self.sched.remove_group(*g);
                }
            }
            set.mark_started();
            return Err(e);
        }
        set.sched_tasks.fetch_add(ids.len(), Ordering::AcqRel);
        if set.breakdown_on() {
            self.sh.breakdown.store(true, Ordering::Relaxed);
        }
        set.mark_started();
        for id in ids {
            let _ = self.sched.wake(id, None, self.sh.now());
        }
        Ok(())
    }

    /// Creates a group per VM and a task per vCPU, in vCPU order, each
    /// bound to its slot; pushes every id made to `ids`.
    fn add_tasks(&self, set: &Arc<VmSet>, ids: &mut Vec<TaskId>) -> Result<(), TaskError> {
        let (sh, sched) = (&self.sh, &self.sched);
        for vm in set.vms() {
            let g = sched.create_group(&vm.name)?;
            let _ = vm.group.set(g);
        }
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
            let id = sched.add_task(&spec, sh.now())?;
            ids.push(id);
            let Some(rt) = sh.rt(id) else {
                return Err(TaskError::Input(format!(
                    "task id {} is beyond the executor's table",
                    id.0
                )));
            };
            rt.sleep_due.store(0, Ordering::Release);
            rt.halt_at.store(0, Ordering::Release);
            rt.timer_gen.fetch_add(1, Ordering::AcqRel);
            if rt
                .bind(Some(Bound {
                    set: set.clone(),
                    global: slot.global,
                }))
                .is_some()
            {
                sh.violation(format!("task id {} was handed out while still bound", id.0));
            }
            let _ = slot.task.set(id);
        }
        Ok(())
    }

    /// Stops every vCPU of `set` and waits until each task has left the
    /// scheduler (at most `timeout`), then removes its VMs' groups. The
    /// other sets run on. Returns each vCPU's final scheduler statistics,
    /// by global index.
    pub fn detach(
        &self,
        set: &Arc<VmSet>,
        timeout: Duration,
    ) -> Result<Vec<Option<TaskStats>>, TaskError> {
        self.sh.detaching.fetch_add(1, Ordering::AcqRel);
        let r = super::drain(
            set,
            timeout,
            &|s| self.wake_slot(s, None),
            &|s| {
                let t = s.task.get().copied();
                format!(
                    "{} ({:?}, {:?})",
                    super::threads::task_name(set, s),
                    t.map(|t| self.sched.task_state(t)),
                    t.map(|t| self.sched.task_cpu(t))
                )
            },
            &mut || set.sched_tasks.load(Ordering::Acquire) == 0,
        );
        self.sh.detaching.fetch_sub(1, Ordering::AcqRel);
        if let Err(e) = r {
            // Every vCPU may have ended while some of its tasks have not
            // left the scheduler yet: say how many, and in what state.
            let left: Vec<String> = set
                .slots()
                .iter()
                .filter_map(|s| s.task.get())
                .filter_map(|t| {
                    let b = self.sh.rt(*t)?.bound();
                    let mine = b.as_ref().is_some_and(|b| Arc::ptr_eq(&b.set, set));
                    mine.then(|| {
                        format!(
                            "task {} {:?} on CPU {:?}",
                            t.0,
                            self.sched.task_state(*t),
                            self.sched.task_cpu(*t)
                        )
                    })
                })
                .take(8)
                .collect();
            return Err(TaskError::Stuck(format!(
                "{e}; {} of its tasks still in the scheduler: {}",
                set.sched_tasks.load(Ordering::Acquire),
                left.join(", ")
            )));
        }
        for vm in set.vms() {
            if let Some(g) = vm.group.get() {
                if let Err(e) = self.sched.remove_group(*g) {
                    self.sh
                        .violation(format!("group of VM {} not removed: {e}", vm.name));
                }
            }
        }
        let mut tasks = vec![None; set.slots().len()];
        for (g, st) in std::mem::take(&mut *lock(&set.finished_stats)) {
            tasks[g] = Some(st);
        }
        Ok(tasks)
    }

    /// Starts one worker thread per CPU.
    fn spawn_workers(&self) -> Result<(), TaskError> {
        for cpu in 0..self.sh.cpus.len() as u32 {
            let (sh2, s2) = (self.sh.clone(), self.sched.clone());
            let h = std::thread::Builder::new()
                .name(format!("worker/{cpu}"))
                .stack_size(256 << 10)
                .spawn(move || worker_main(sh2, s2, cpu))
                .map_err(|e| TaskError::Os {
                    context: format!("cannot start the worker of CPU {cpu}"),
                    source: e,
                });
            let h = match h {
                Ok(h) => h,
                Err(e) => {
                    self.stop_threads();
                    return Err(e);
                }
            };
            let _ = self.sh.cpus[cpu as usize].thread.set(h.thread().clone());
            lock(&self.threads).push(h);
        }
        Ok(())
    }

    /// Starts the clock thread (ticks, sleep timers, the checker).
    fn spawn_clock(&self, opts: &ExecOptions) -> Result<(), TaskError> {
        let (sh2, s2, ck) = (self.sh.clone(), self.sched.clone(), self.checker.clone());
        // the checker's snapshots run on a thread of their own (see
        // run_checker), not on the clock's
        let periods = ClockPeriods {
            tick: opts.tick.as_nanos() as u64,
            check: None,
        };
        if let Some(iv) = opts.check.as_ref().map(|c| c.interval.as_nanos() as u64) {
            let (sh3, s3, ck3) = (self.sh.clone(), self.sched.clone(), self.checker.clone());
            let h = std::thread::Builder::new()
                .name("worker-check".into())
                .spawn(move || run_checker(&*sh3, &s3, iv, &ck3))
                .map_err(|e| TaskError::Os {
                    context: "cannot start the checker thread".into(),
                    source: e,
                });
            match h {
                Ok(h) => lock(&self.threads).push(h),
                Err(e) => {
                    self.stop_threads();
                    return Err(e);
                }
            }
        }
        let h = std::thread::Builder::new()
            .name("worker-clock".into())
            .spawn(move || {
                host_rt(&sh2, 1);
                run_clock(&*sh2, &s2, &sh2.timers, periods, &ck)
            })
            .map_err(|e| TaskError::Os {
                context: "cannot start the clock thread".into(),
                source: e,
            });
        let h = match h {
            Ok(h) => h,
            Err(e) => {
                self.stop_threads();
                return Err(e);
            }
        };
        self.sh.timers.set_clock_thread(h.thread().clone());
        lock(&self.threads).push(h);
        Ok(())
    }

    /// Scheduler counters so far, over every set it has run.
    pub fn counters(&self) -> SchedCounters {
        self.sched.counters()
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.sched
    }

    /// What CPU `cpu`'s worker is doing, for diagnostics: the task it
    /// published as current (or idle), whether it is parked, whether a
    /// kick is pending, and its thread's host CPU time so far.
    pub fn cpu_state(&self, cpu: CpuId) -> String {
        let Some(w) = self.sh.cpus.get(cpu as usize) else {
            return format!("no CPU {cpu}");
        };
        let cur = match w.current.load(Ordering::SeqCst) {
            IDLE => "idle".to_string(),
            t => format!("task {t}"),
        };
        format!(
            "CPU {cpu}: worker runs {cur}, parked {}, kick pending {}, core current {:?}, needs attention {:?}, host CPU {:?}, {}",
            w.parked.load(Ordering::SeqCst),
            w.token.load(Ordering::SeqCst),
            self.sched.current(cpu).ok().flatten().map(|t| t.0),
            self.sched.needs_attention(cpu).ok(),
            runnable_thread(w.tid.load(Ordering::Acquire)),
            vcpu_sched::os_thread::describe_thread(w.tid.load(Ordering::Acquire)),
        )
    }

    /// Per CPU: ns inside `schedule` and `schedule` calls, so far.
    pub fn sched_time_per_cpu(&self) -> (Vec<u64>, Vec<u64>) {
        let st = &self.sh.stats;
        (
            st.iter()
                .map(|s| s.sched_ns.load(Ordering::Relaxed))
                .collect(),
            st.iter()
                .map(|s| s.sched_calls.load(Ordering::Relaxed))
                .collect(),
        )
    }

    /// Executor invariant violations and scheduler anomalies so far.
    pub fn violations(&self) -> Vec<String> {
        let mut v = self.sched.anomalies();
        v.extend(lock(&self.sh.violations).iter().cloned());
        v
    }

    pub(crate) fn wake_slot(&self, s: &VcpuSlot, waker: Option<CpuId>) {
        if let Some(t) = s.task.get() {
            let _ = self.sched.wake(*t, waker, self.sh.now());
        }
    }

    /// Stops the workers and the clock. Sets still attached end with
    /// them: call [`WorkerPool::detach`] first for a clean stop.
    pub fn stop(&self) {
        self.stop_threads();
    }

    fn stop_threads(&self) {
        // A worker leaves its loop only while idle: sets still attached
        // are told to stop, so that every running vCPU comes back out.
        for rt in self.sh.rt.iter() {
            if let Some(b) = rt.bound().as_ref() {
                b.set.request_stop();
            }
        }
        self.sh.quit.store(true, Ordering::SeqCst);
        for w in self.sh.cpus.iter() {
            w.token.store(true, Ordering::Release);
            if let Some(t) = w.thread.get() {
                t.unpark();
            }
        }
        self.sh.timers.wake_clock();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for h in threads {
            let _ = h.join();
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// The M:N executor with one set, started and stopped together.
pub struct WorkerExecutor {
    pool: WorkerPool,
    set: Arc<VmSet>,
}

impl WorkerExecutor {
    pub(crate) fn start(opts: &ExecOptions, set: &Arc<VmSet>) -> Result<Self, TaskError> {
        let max = opts.sched.max_tasks;
        let n = set.slots().len();
        if n > max {
            return Err(TaskError::Input(format!(
                "{n} vCPUs, but the scheduler holds at most {max} tasks"
            )));
        }
        let pool = WorkerPool::start_at(opts, set.epoch())?;
        if let Err(e) = pool.attach(set) {
            set.request_stop();
            pool.stop();
            return Err(e);
        }
        Ok(Self {
            pool,
            set: set.clone(),
        })
    }

    pub(crate) fn counters(&self) -> SchedCounters {
        self.pool.counters()
    }

    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        self.pool.scheduler()
    }

    pub(crate) fn wake_slot(&self, s: &VcpuSlot, waker: Option<CpuId>) {
        self.pool.wake_slot(s, waker)
    }

    pub(crate) fn shutdown(self, timeout: Duration) -> Result<ExecOutcome, TaskError> {
        let pool = &self.pool;
        let detached = pool.detach(&self.set, timeout);
        if let Some(c) = lock(&pool.checker).as_mut() {
            if detached.is_ok() {
                c.observe(&pool.sched, pool.now());
            }
        }
        pool.stop();
        let tasks = detached?;
        let (checks, mut violations) = match lock(&pool.checker).as_ref() {
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
        violations.extend(pool.violations());
        let (sched_ns_per_cpu, sched_calls_per_cpu) = pool.sched_time_per_cpu();
        Ok(ExecOutcome {
            tasks,
            host_schedstat: Vec::new(),
            counters: pool.counters(),
            sched_ns_per_cpu,
            sched_calls_per_cpu,
            violations,
            checks,
            pin_errors: pool.sh.pin_errors.load(Ordering::Relaxed),
        })
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
        Shared::now(self)
    }

    fn quit(&self) -> bool {
        self.quit.load(Ordering::Acquire)
    }

    /// A set is leaving (its vCPUs are being torn down, so RT waits are
    /// expected) or the pool is stopping.
    fn stopping(&self) -> bool {
        self.detaching.load(Ordering::Acquire) > 0 || self.quit.load(Ordering::Acquire)
    }

    fn fire(&self, sched: &Scheduler, key: usize, gen: u64, now: u64) {
        if let Some(rt) = self.rt.get(key) {
            if rt.timer_gen.load(Ordering::Acquire) != gen {
                return;
            }
            // The worker that armed it keeps it too (its local timers).
            // Parked, that worker sleeps until this due time and fires it
            // itself, one host wakeup instead of this thread's plus a kick:
            // leave it to the worker, and come back once more in case it
            // does not.
            let t = TaskId(key as u32);
            let owner = sched
                .task_cpu(t)
                .ok()
                .and_then(|c| self.cpus.get(c as usize));
            if let Some(w) = owner {
                let fresh = now <= rt.sleep_due.load(Ordering::Acquire) + TIMER_BACKSTOP_NS;
                if fresh && w.parked.load(Ordering::SeqCst) && !w.token.load(Ordering::SeqCst) {
                    self.timers.add(now + TIMER_BACKSTOP_NS, key, gen);
                    return;
                }
            }
            // Whoever takes the generation wakes the task.
            if rt
                .timer_gen
                .compare_exchange(gen, gen + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let _ = sched.wake(TaskId(key as u32), None, now);
                if self.breakdown.load(Ordering::Relaxed) {
                    if let Some(b) = rt.bound().as_ref() {
                        b.set.woken(&b.set.slots()[b.global]);
                    }
                }
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
