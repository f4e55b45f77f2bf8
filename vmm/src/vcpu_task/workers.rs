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

use super::{
    enter, resumed, Action, ExecOptions, ExecOutcome, Resume, TaskError, VcpuSlot, VcpuState, VmSet,
};

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

fn worker_main(sh: Arc<Shared>, sched: Arc<Scheduler>, cpu: CpuId) {
    enter_worker_thread(&sh, cpu);
    let set = sh.set.clone();
    Worker {
        sh: &sh,
        sched: &sched,
        set: &set,
        cpu,
        w: &sh.cpus[cpu as usize],
        stats: &sh.stats[cpu as usize],
        cur: None,
        prev: Prev::Keep,
        resched: true,
    }
    .run();
}

/// Makes the calling thread CPU `cpu`'s worker: records its thread id,
/// gives it host RT if asked and pins it to its host CPU.
fn enter_worker_thread(sh: &Shared, cpu: CpuId) {
    let w = &sh.cpus[cpu as usize];
    w.tid.store(current_tid(), Ordering::Release);
    host_rt(sh, 0);
    if sh.pin && pin_current_thread(w.host_cpu).is_err() {
        sh.pin_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// One worker's loop state.
struct Worker<'a> {
    sh: &'a Shared,
    sched: &'a Scheduler,
    set: &'a VmSet,
    cpu: CpuId,
    w: &'a WorkerCpu,
    stats: &'a WorkerStats,
    /// The task whose vCPU it runs (`None`: idle).
    cur: Option<TaskId>,
    /// What happens to `cur` at the next `schedule`.
    prev: Prev,
    /// Whether to call `schedule` before anything else.
    resched: bool,
}

impl Worker<'_> {
    /// The worker's loop: schedule when needed, park while idle, otherwise
    /// run the current vCPU; returns when the executor quits.
    fn run(&mut self) {
        loop {
            if (self.resched || self.needs_attention()) && !self.reschedule() {
                continue;
            }
            let Some(t) = self.cur else {
                if !self.park() {
                    return;
                }
                self.resched = true;
                continue;
            };
            self.run_task(t);
        }
    }

    /// Whether the core wants this CPU to schedule.
    fn needs_attention(&self) -> bool {
        self.sched.needs_attention(self.cpu).expect(CPU_OK)
    }

    /// Asks `resched` at the next round, telling the core `prev`.
    fn resched_with(&mut self, prev: Prev) {
        self.prev = prev;
        self.resched = true;
    }

    /// Calls `schedule`, retires a task that exited and publishes what was
    /// picked; false when the CPU needs attention again already.
    fn reschedule(&mut self) -> bool {
        let (sh, set, cpu) = (self.sh, self.set, self.cpu);
        let t0 = set.now();
        let exiting = self.prev == Prev::Exit;
        let pick = self.sched.schedule(cpu, self.prev, t0).expect(CPU_OK);
        self.stats
            .sched_ns
            .fetch_add(set.now().saturating_sub(t0), Ordering::Relaxed);
        self.stats.sched_calls.fetch_add(1, Ordering::Relaxed);
        if exiting {
            if let Some(t) = self.cur.take() {
                finish_task(sh, self.sched, t);
            }
        }
        self.cur = match pick {
            Pick::Same => {
                if exiting {
                    sh.violation(format!("CPU {cpu}: schedule kept an exiting task"));
                }
                self.cur
            }
            Pick::Switch(n) => Some(n),
            Pick::Idle => None,
        };
        self.prev = Prev::Keep;
        self.resched = false;
        self.w
            .current
            .store(self.cur.map_or(IDLE, |t| t.0), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.needs_attention() {
            self.resched = true;
            return false;
        }
        true
    }

    /// Parks the idle worker until a kick's token; false when the executor
    /// quits.
    fn park(&self) -> bool {
        let (w, sh) = (self.w, self.sh);
        // `parked` is cleared before the token is taken, so the checker
        // never sees this worker parked without a token once a kick has
        // landed. The token is taken with a swap (acquire): what the kick
        // it takes published before it (need_resched, the wake list) is
        // visible to the schedule() that follows; a token set after the
        // swap stays for the next round.
        w.parked.store(true, Ordering::SeqCst);
        while !w.token.load(Ordering::SeqCst) {
            if sh.quit.load(Ordering::Acquire) {
                w.parked.store(false, Ordering::SeqCst);
                return false;
            }
            std::thread::park();
        }
        w.parked.store(false, Ordering::SeqCst);
        w.token.swap(false, Ordering::AcqRel);
        !sh.quit.load(Ordering::Acquire)
    }

    /// Runs task `t`'s vCPU once, unless it goes back to sleep or the CPU
    /// needs attention first, and acts on why it came back.
    fn run_task(&mut self, t: TaskId) {
        let (sh, set, cpu) = (self.sh, self.set, self.cpu);
        let Some(&g) = sh.by_task.get(t.0 as usize).and_then(|x| x.get()) else {
            sh.violation(format!("CPU {cpu} picked task {} that is no vCPU", t.0));
            self.resched_with(Prev::Exit);
            return;
        };
        let slot = &set.slots()[g];
        let vm = &set.vms()[slot.vm];
        let rt = &sh.rt[g];
        let stopping = set.stopping() || vm.control.is_stopping();
        // A sleeper picked early (another wake) goes back to sleep.
        let due = rt.sleep_due.load(Ordering::Acquire);
        if due != 0 && !stopping && set.now() < due {
            self.resched_with(Prev::Block);
            return;
        }
        let Some(mut st) = slot.try_lock() else {
            sh.violation(format!(
                "CPU {cpu}: vCPU {} is being run elsewhere",
                super::threads::task_name(set, slot)
            ));
            self.resched_with(Prev::Keep);
            std::thread::yield_now();
            return;
        };
        if sh.check {
            self.check_current(t);
        }
        // The check right before KVM_RUN (a later kick finds immediate_exit).
        if self.needs_attention() {
            self.resched = true;
            return;
        }
        deliver_resumes(set, slot, rt, due, &mut st);
        let action = enter(set, vm, &mut st);
        self.act(action, g, slot, &mut st);
    }

    /// The checker's checks on a task about to run here: the core has it
    /// current on this CPU, and this CPU is inside its affinity.
    fn check_current(&self, t: TaskId) {
        let (sh, sched, cpu) = (self.sh, self.sched, self.cpu);
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

    /// Acts on why vCPU `g` came back from `enter`: what the core hears at
    /// the next `schedule`, a sleep's timer, a doorbell's wake, an exit.
    fn act(&mut self, action: Action, g: usize, slot: &VcpuSlot, st: &mut VcpuState) {
        let (sh, sched, set, cpu) = (self.sh, self.sched, self.set, self.cpu);
        let rt = &sh.rt[g];
        match action {
            Action::Continue => {}
            Action::Block => {
                rt.halt_at.store(set.now(), Ordering::Release);
                self.resched_with(Prev::Block);
            }
            Action::Sleep(ns) => {
                let now = set.now();
                let at = now + ns;
                rt.sleep_due.store(at, Ordering::Release);
                let gen = rt.timer_gen.fetch_add(1, Ordering::AcqRel) + 1;
                sh.timers.add(at, g, gen);
                self.resched_with(Prev::Block);
            }
            Action::Yield => self.resched_with(Prev::Yield),
            Action::Wake(k) => {
                if let Some(s) = set.doorbell(slot.vm, k, set.now()) {
                    if let Some(&tk) = s.task.get() {
                        let _ = sched.wake(tk, Some(cpu), set.now());
                    }
                }
            }
            Action::Exit => {
                set.vcpu_exited(slot, st);
                self.resched_with(Prev::Exit);
            }
            Action::Fail(r) => {
                set.fail_vm(slot.vm, r, &|s: &VcpuSlot| {
                    if let Some(&tk) = s.task.get() {
                        let _ = sched.wake(tk, Some(cpu), set.now());
                    }
                });
                set.vcpu_exited(slot, st);
                self.resched_with(Prev::Exit);
            }
        }
    }
}

/// Tells vCPU `slot`'s metrics that it resumes from a sleep that was due
/// at `due` (0: none) and from a halt, if it was halted.
fn deliver_resumes(set: &VmSet, slot: &VcpuSlot, rt: &TaskRt, due: u64, st: &mut VcpuState) {
    if due != 0 {
        rt.sleep_due.store(0, Ordering::Release);
        rt.timer_gen.fetch_add(1, Ordering::AcqRel);
        resumed(set, slot, &mut st.m, Resume::Timer(due));
    }
    let h = rt.halt_at.swap(0, Ordering::AcqRel);
    if h != 0 {
        resumed(set, slot, &mut st.m, Resume::Halt(h));
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
