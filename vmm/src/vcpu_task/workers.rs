//! The M:N executor: one worker thread per logical CPU, pinned to that
//! CPU's host CPU, runs whichever vCPU the scheduler picks for its CPU by
//! calling `KVM_RUN` on that vCPU's fd itself.
//!
//! Compared with one thread per vCPU, switching from one vCPU to another
//! on a CPU is a function return and a call, not a hand-over between two
//! host threads (a futex wake, a park and two host context switches). The
//! price is that a vCPU's fd is entered from whichever worker runs it:
//! KVM loads the vCPU state on that thread, about 2 us the first time
//! (KVM-NOTES). Measured both ways in `docs/results-vcpus.md`.
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

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use vcpu_sched::exec::{
    current_tid, pin_current_thread, run_clock, runnable_thread, set_host_rt, ClockHost,
    ClockPeriods, TimerQueue, CPU_OK,
};
use vcpu_sched::sched::KickCpu;
use vcpu_sched::{
    CpuId, InvariantChecker, Liveness, Pick, Prev, SchedCounters, Scheduler, TaskId, TaskSpec,
    TaskStats,
};

use super::{enter, resumed, Action, ExecOptions, ExecOutcome, Resume, TaskError, VcpuSlot, VmSet};

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

impl Shared {
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
        let max = opts.sched.max_tasks;
        let nslots = set.slots().len();
        if nslots > max {
            return Err(TaskError::Input(format!(
                "{nslots} vCPUs, but the scheduler holds at most {max} tasks"
            )));
        }
        if opts.tick.is_zero() {
            return Err(TaskError::Input("the tick must be positive".into()));
        }
        let n = opts.topology.num_cpus();
        let sh = Arc::new(Shared {
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
            rt: (0..nslots).map(|_| TaskRt::default()).collect(),
            by_task: (0..max).map(|_| OnceLock::new()).collect(),
            timers: TimerQueue::new(),
            quit: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            violations: Mutex::new(Vec::new()),
            finished: Mutex::new(Vec::new()),
            pin: true,
            host_rt: opts.host_rt,
            pin_errors: AtomicU64::new(0),
            check: opts.check.is_some(),
        });
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
            sh: sh.clone(),
            sched: sched.clone(),
            threads: Vec::new(),
            checker: checker.clone(),
        };
        // Tasks first (blocked), then the threads, then wake them all.
        let mut ids = Vec::with_capacity(nslots);
        let r = (|| -> Result<(), TaskError> {
            for vm in set.vms() {
                let g = sched.create_group(&vm.name)?;
                let _ = vm.group.set(g);
            }
            for slot in set.slots() {
                let vm = &set.vms()[slot.vm];
                let mut spec = TaskSpec::new(super::threads::task_name(set, slot))
                    .policy(slot.placement.policy);
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
            for cpu in 0..n as u32 {
                let (sh2, s2) = (sh.clone(), sched.clone());
                let h = std::thread::Builder::new()
                    .name(format!("worker/{cpu}"))
                    .stack_size(256 << 10)
                    .spawn(move || worker_main(sh2, s2, cpu))
                    .map_err(|e| TaskError::Os {
                        context: format!("cannot start the worker of CPU {cpu}"),
                        source: e,
                    })?;
                let _ = sh.cpus[cpu as usize].thread.set(h.thread().clone());
                ex.threads.push(h);
            }
            let (sh2, s2, ck) = (sh.clone(), sched.clone(), checker.clone());
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
            sh.timers.set_clock_thread(h.thread().clone());
            ex.threads.push(h);
            Ok(())
        })();
        if let Err(e) = r {
            set.request_stop();
            let _ = ex.shutdown(Duration::from_secs(10));
            return Err(e);
        }
        set.mark_started();
        for id in ids {
            let _ = sched.wake(id, None, set.now());
        }
        Ok(ex)
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

fn worker_main(sh: Arc<Shared>, sched: Arc<Scheduler>, cpu: CpuId) {
    let w = &sh.cpus[cpu as usize];
    w.tid.store(current_tid(), Ordering::Release);
    host_rt(&sh, 0);
    if sh.pin && pin_current_thread(w.host_cpu).is_err() {
        sh.pin_errors.fetch_add(1, Ordering::Relaxed);
    }
    let set = sh.set.clone();
    let stats = &sh.stats[cpu as usize];
    let mut cur: Option<TaskId> = None;
    let mut prev = Prev::Keep;
    let mut resched = true;
    loop {
        if resched || sched.needs_attention(cpu).expect(CPU_OK) {
            let t0 = set.now();
            let exiting = prev == Prev::Exit;
            let pick = sched.schedule(cpu, prev, t0).expect(CPU_OK);
            stats
                .sched_ns
                .fetch_add(set.now().saturating_sub(t0), Ordering::Relaxed);
            stats.sched_calls.fetch_add(1, Ordering::Relaxed);
            if exiting {
                if let Some(t) = cur.take() {
                    finish_task(&sh, &sched, t);
                }
            }
            cur = match pick {
                Pick::Same => {
                    if exiting {
                        sh.violation(format!("CPU {cpu}: schedule kept an exiting task"));
                    }
                    cur
                }
                Pick::Switch(n) => Some(n),
                Pick::Idle => None,
            };
            prev = Prev::Keep;
            resched = false;
            w.current.store(cur.map_or(IDLE, |t| t.0), Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if sched.needs_attention(cpu).expect(CPU_OK) {
                resched = true;
                continue;
            }
        }
        let Some(t) = cur else {
            // Idle: park until kicked. `parked` is cleared before the
            // token is taken, so the checker never sees this worker parked
            // without a token once a kick has landed. The token is taken
            // with a swap (acquire): what the kick it takes published
            // before it (need_resched, the wake list) is visible to the
            // schedule() that follows; a token set after the swap stays
            // for the next round.
            w.parked.store(true, Ordering::SeqCst);
            while !w.token.load(Ordering::SeqCst) {
                if sh.quit.load(Ordering::Acquire) {
                    w.parked.store(false, Ordering::SeqCst);
                    return;
                }
                std::thread::park();
            }
            w.parked.store(false, Ordering::SeqCst);
            w.token.swap(false, Ordering::AcqRel);
            if sh.quit.load(Ordering::Acquire) {
                return;
            }
            resched = true;
            continue;
        };
        let Some(&g) = sh.by_task.get(t.0 as usize).and_then(|x| x.get()) else {
            sh.violation(format!("CPU {cpu} picked task {} that is no vCPU", t.0));
            prev = Prev::Exit;
            resched = true;
            continue;
        };
        let slot = &set.slots()[g];
        let vm = &set.vms()[slot.vm];
        let rt = &sh.rt[g];
        let stopping = set.stopping() || vm.control.is_stopping();
        // A sleeper picked early (another wake) goes back to sleep.
        let due = rt.sleep_due.load(Ordering::Acquire);
        if due != 0 && !stopping && set.now() < due {
            prev = Prev::Block;
            resched = true;
            continue;
        }
        let Some(mut st) = slot.try_lock() else {
            sh.violation(format!(
                "CPU {cpu}: vCPU {} is being run elsewhere",
                super::threads::task_name(&set, slot)
            ));
            prev = Prev::Keep;
            resched = true;
            std::thread::yield_now();
            continue;
        };
        if sh.check {
            if sched.current(cpu).expect(CPU_OK) != Some(t) {
                sh.violation(format!(
                    "CPU {cpu} runs task {} but the core has {:?} current",
                    t.0,
                    sched.current(cpu).expect(CPU_OK)
                ));
            }
            // decided under the runqueue lock (see running_outside_affinity)
            if let Some(m) = sched.running_outside_affinity(cpu, t).expect(CPU_OK) {
                sh.violation(format!(
                    "task {} runs on CPU {cpu} outside its affinity {m}",
                    t.0
                ));
            }
        }
        // The check right before KVM_RUN (a later kick finds immediate_exit).
        if sched.needs_attention(cpu).expect(CPU_OK) {
            resched = true;
            continue;
        }
        if due != 0 {
            rt.sleep_due.store(0, Ordering::Release);
            rt.timer_gen.fetch_add(1, Ordering::AcqRel);
            resumed(&set, slot, &mut st.m, Resume::Timer(due));
        }
        let h = rt.halt_at.swap(0, Ordering::AcqRel);
        if h != 0 {
            resumed(&set, slot, &mut st.m, Resume::Halt(h));
        }
        match enter(&set, vm, &mut st) {
            Action::Continue => {}
            Action::Block => {
                rt.halt_at.store(set.now(), Ordering::Release);
                prev = Prev::Block;
                resched = true;
            }
            Action::Sleep(ns) => {
                let now = set.now();
                let at = now + ns;
                rt.sleep_due.store(at, Ordering::Release);
                let gen = rt.timer_gen.fetch_add(1, Ordering::AcqRel) + 1;
                sh.timers.add(at, g, gen);
                prev = Prev::Block;
                resched = true;
            }
            Action::Yield => {
                prev = Prev::Yield;
                resched = true;
            }
            Action::Wake(k) => {
                if let Some(s) = set.doorbell(slot.vm, k, set.now()) {
                    if let Some(&tk) = s.task.get() {
                        let _ = sched.wake(tk, Some(cpu), set.now());
                    }
                }
            }
            Action::Exit => {
                set.vcpu_exited(slot, &mut st);
                prev = Prev::Exit;
                resched = true;
            }
            Action::Fail(r) => {
                set.fail_vm(slot.vm, r, &|s: &VcpuSlot| {
                    if let Some(&tk) = s.task.get() {
                        let _ = sched.wake(tk, Some(cpu), set.now());
                    }
                });
                set.vcpu_exited(slot, &mut st);
                prev = Prev::Exit;
                resched = true;
            }
        }
    }
}

fn finish_task(sh: &Shared, sched: &Scheduler, t: TaskId) {
    let g = sh.by_task.get(t.0 as usize).and_then(|x| x.get()).copied();
    if let Some(g) = g {
        sh.rt[g].timer_gen.fetch_add(1, Ordering::AcqRel);
    }
    match sched.remove_task(t) {
        Ok(st) => {
            if let Some(g) = g {
                lock(&sh.finished).push((g, st));
            }
        }
        Err(e) => sh.violation(format!("task {} could not be removed after exit: {e}", t.0)),
    }
    sh.live.fetch_sub(1, Ordering::AcqRel);
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
