//! The host executor: plain 1:1 threads scheduled by the host kernel, as
//! Cloud Hypervisor and Firecracker run vCPUs. No `vcpu_sched` at all:
//! it is the peer every result is set beside.
//!
//! WHAT: each task gets a thread. A task with an RT policy gets
//! `SCHED_FIFO` (or `SCHED_RR`) at its priority, a fair one stays
//! `SCHED_OTHER`; a task with an affinity is pinned to the host CPUs its
//! logical CPUs map to (or to host CPUs given outright). Without
//! permission for RT policies (`EPERM`) the threads stay `SCHED_OTHER`
//! with a warning, unless the caller asked for a strict setup.
//!
//! HOW the actions map: each task is blocked or awake, as in the
//! scheduler. `Action::Block` marks it blocked and parks the thread until a
//! wake marks it awake; a wake of an awake task (running, or woken and not
//! yet run) is remembered one deep, and its next block returns at once. A
//! task starts blocked: the wake that starts it is not also a wake for its
//! first block. A sleep is a timed park that a wake ends early; a yield is
//! `sched_yield`; a wake marks the target awake and unparks it.
//!
//! The block path (`vmm bench --breakdown`): the host kernel does the
//! switch, so only its total is seen. A task whose body stamped its exit
//! and then blocks records the stamp on the host CPU it blocked on; the
//! first task to enter its body on that host CPU afterwards, if it was
//! runnable since before the block, gets the stamp as its block path.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use topology::HostTopology;

use super::body::{apply, Action, Apply, BlockPath, Body, Cx, Engine, Hooks, Spawner, TaskEnd};
use super::clock::HostSchedstat;
use super::config::{CpuMapping, ExecConfig, ExecReport};
use super::shared::start_thread;
use super::threads::panic_message;
use crate::cpumask::CpuMask;
use crate::error::{Result, SchedError};
use crate::os_thread::{current_host_cpu, set_affinity, set_current_thread_policy};
use crate::task::{CpuId, GroupId, Policy, TaskId, TaskSpec};
use crate::tasks::lock;

/// How one task's thread is set up, beyond its [`TaskSpec`].
#[derive(Clone, Debug, Default)]
pub struct HostThread {
    /// The thread's name (`None`: `task/ID`).
    pub name: Option<String>,
    /// Host CPUs to pin it to, overriding the spec's affinity (`None`:
    /// the spec's affinity through the executor's mapping, if any).
    pub pins: Option<Vec<u32>>,
    /// A policy the host does not permit fails the task's creation
    /// instead of leaving its thread `SCHED_OTHER` with a warning.
    pub strict_policy: bool,
}

/// A task's state: blocked (or never started), parked or about to park.
const BLOCKED: u8 = 0;
/// Awake: running, or woken and not yet back from its park.
const AWAKE: u8 = 1;
/// Awake with a wake remembered for its next block.
const PENDING: u8 = 2;

/// One task: its state and thread.
#[repr(align(128))]
#[derive(Default)]
struct HostTask {
    /// [`BLOCKED`], [`AWAKE`] or [`PENDING`].
    state: AtomicU8,
    /// When the last wake made it awake (the block path's "runnable
    /// since").
    woken_at: AtomicU64,
    thread: OnceLock<Thread>,
    tid: AtomicU32,
    ended: AtomicBool,
    hooks: OnceLock<Arc<dyn Hooks>>,
}

/// One host CPU's block stamp, on lines of its own (threads on different
/// CPUs write their own).
#[repr(align(128))]
#[derive(Default)]
struct CpuBlock {
    at: AtomicU64,
    /// The task that blocked (its id + 1; 0: none).
    by: AtomicU32,
}

/// What the executor's threads share.
struct Shared {
    epoch: Instant,
    topo: Arc<HostTopology>,
    mapping: CpuMapping,
    tasks: Box<[HostTask]>,
    next_id: AtomicU32,
    next_group: AtomicU32,
    stopping: AtomicBool,
    /// Per host CPU (block path); indexed by the CPU number.
    blocks: Box<[CpuBlock]>,
    /// Some body has stamped an exit: the block path is measured.
    stamping: AtomicBool,
    live: AtomicUsize,
    failures: Mutex<Vec<String>>,
    schedstat: Mutex<Vec<Option<HostSchedstat>>>,
    stack: usize,
}

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn task(&self, t: TaskId) -> Option<&HostTask> {
        let n = self.next_id.load(Ordering::Acquire);
        (t.0 < n).then(|| self.tasks.get(t.0 as usize)).flatten()
    }

    /// Wakes `t`: a blocked task becomes awake and its thread is unparked
    /// (true); an awake one keeps the wake for its next block (false).
    /// Its hooks hear of it either way.
    fn wake(&self, t: TaskId) -> bool {
        let Some(h) = self.task(t) else {
            return false;
        };
        let mut s = h.state.load(Ordering::Acquire);
        let was_blocked = loop {
            let (to, blocked) = match s {
                BLOCKED => (AWAKE, true),
                AWAKE => (PENDING, false),
                _ => break false,
            };
            if blocked {
                // before the state: the woken thread reads it as "since"
                h.woken_at.store(self.now(), Ordering::Relaxed);
            }
            match h
                .state
                .compare_exchange_weak(s, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break blocked,
                Err(x) => s = x,
            }
        };
        if was_blocked {
            if let Some(th) = h.thread.get() {
                th.unpark();
            }
        }
        if let Some(k) = h.hooks.get() {
            k.woken();
        }
        was_blocked
    }

    /// The host CPUs logical CPUs `mask` run on.
    fn host_cpus(&self, mask: &CpuMask) -> Vec<u32> {
        let mut v: Vec<u32> = mask
            .iter()
            .map(|c| self.mapping.host_cpu(&self.topo, c))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The executor.
pub struct HostExecutor {
    sh: Arc<Shared>,
    topo: Arc<HostTopology>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl HostExecutor {
    /// An executor for up to `max_tasks` tasks (ids are not reused).
    pub fn new(topo: Arc<HostTopology>, cfg: &ExecConfig, max_tasks: usize) -> Result<Self> {
        cfg.validate()?;
        let host_cpus = crate::os_thread::allowed_host_cpus()
            .ok()
            .and_then(|v| v.iter().max().map(|&m| m as usize + 1))
            .unwrap_or(1)
            .max(topo.num_cpus());
        Ok(Self {
            sh: Arc::new(Shared {
                epoch: cfg.epoch.unwrap_or_else(Instant::now),
                topo: topo.clone(),
                mapping: cfg.mapping.clone(),
                tasks: (0..max_tasks).map(|_| HostTask::default()).collect(),
                next_id: AtomicU32::new(0),
                next_group: AtomicU32::new(1),
                stopping: AtomicBool::new(false),
                blocks: (0..host_cpus).map(|_| CpuBlock::default()).collect(),
                stamping: AtomicBool::new(false),
                live: AtomicUsize::new(0),
                failures: Mutex::new(Vec::new()),
                schedstat: Mutex::new(Vec::new()),
                stack: cfg.task_stack,
            }),
            topo,
            handles: Mutex::new(Vec::new()),
        })
    }

    /// The executor's clock (ns, never 0).
    pub fn now(&self) -> u64 {
        self.sh.now()
    }

    /// Creates a task running `body` on a thread of its own, set up as
    /// `spec` and `how` say; the thread waits until the task is first
    /// woken. A setup the host refuses (pinning, a strict policy) is an
    /// error, and no task is made.
    pub fn add(
        &self,
        spec: &TaskSpec,
        body: Box<dyn Body>,
        hooks: Option<Arc<dyn Hooks>>,
        how: &HostThread,
    ) -> Result<TaskId> {
        let sh = &self.sh;
        let id = sh.next_id.fetch_add(1, Ordering::AcqRel);
        if id as usize >= sh.tasks.len() {
            // ids are not reused: the counter stays past the table
            return Err(SchedError::TooManyTasks(sh.tasks.len()));
        }
        let t = TaskId(id);
        if let Some(h) = hooks {
            let _ = sh.tasks[id as usize].hooks.set(h);
        }
        let pins = how
            .pins
            .clone()
            .or_else(|| spec.affinity.as_ref().map(|m| sh.host_cpus(m)));
        let setup = Setup {
            what: spec.name.clone(),
            pins,
            policy: spec.policy,
            strict: how.strict_policy,
        };
        let (tx, rx) = mpsc::channel();
        let sh2 = sh.clone();
        let h = start_thread(
            how.name.clone().unwrap_or_else(|| format!("task/{id}")),
            Some(sh.stack),
            &format!("the thread of task {}", spec.name),
            move || thread_main(sh2, t, setup, tx, body),
        )?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = h.join();
                return Err(SchedError::ThreadSetup(e));
            }
            Err(_) => {
                let _ = h.join();
                return Err(SchedError::ThreadSetup(format!(
                    "the thread of task {} died during its setup",
                    spec.name
                )));
            }
        }
        sh.live.fetch_add(1, Ordering::AcqRel);
        lock(&self.handles).push(h);
        Ok(t)
    }

    /// Wakes a task; true if it had no wake pending.
    pub fn wake(&self, t: TaskId) -> bool {
        self.sh.wake(t)
    }

    /// [`HostExecutor::wake`] as an owned handle (see
    /// [`RemoteWaker`](super::RemoteWaker)).
    pub fn remote_waker(&self) -> super::RemoteWaker {
        let sh = self.sh.clone();
        super::RemoteWaker::new(move |t| sh.wake(t))
    }

    /// Tasks whose body has not ended.
    pub fn live_tasks(&self) -> usize {
        self.sh.live.load(Ordering::Acquire)
    }

    /// Asks every body to end ([`Cx::stopping`](super::Cx::stopping)) and
    /// keeps waking the tasks until they have. Fails, naming how many are
    /// left, after `timeout`.
    pub fn shutdown(&self, timeout: Duration) -> Result<ExecReport> {
        let sh = &self.sh;
        sh.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        loop {
            let mut hs = lock(&self.handles);
            let (done, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut *hs)
                .into_iter()
                .partition(|h| h.is_finished());
            *hs = rest;
            drop(hs);
            for h in done {
                let _ = h.join();
            }
            if lock(&self.handles).is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(SchedError::Workload(format!(
                    "{} task threads did not end within {timeout:?} of shutdown; \
                     bodies must return when Cx::stopping() is true",
                    lock(&self.handles).len()
                )));
            }
            let n = (sh.next_id.load(Ordering::Acquire) as usize).min(sh.tasks.len());
            for i in 0..n as u32 {
                if !sh.tasks[i as usize].ended.load(Ordering::Acquire) {
                    sh.wake(TaskId(i));
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(ExecReport {
            failures: lock(&sh.failures).clone(),
            host_schedstat: lock(&sh.schedstat).clone(),
            ..ExecReport::default()
        })
    }
}

impl HostExecutor {
    /// Task `t`'s host thread's schedstat so far: live, or as the thread
    /// left it when it ended. `None` for no such task, a thread not
    /// started yet, or a kernel without schedstat.
    pub fn task_schedstat(&self, t: TaskId) -> Option<HostSchedstat> {
        let h = self.sh.task(t)?;
        if h.ended.load(Ordering::Acquire) {
            return lock(&self.sh.schedstat)
                .get(t.0 as usize)
                .copied()
                .flatten();
        }
        match h.tid.load(Ordering::Acquire) {
            0 => None,
            tid => crate::exec::clock::schedstat_of(&format!("/proc/self/task/{tid}/schedstat")),
        }
    }
}

impl Spawner for HostExecutor {
    fn topology(&self) -> &Arc<HostTopology> {
        &self.topo
    }
    fn now(&self) -> u64 {
        self.sh.now()
    }
    fn create_group(&self, _name: &str) -> Result<GroupId> {
        Ok(GroupId(self.sh.next_group.fetch_add(1, Ordering::Relaxed)))
    }
    fn spawn(&self, spec: &TaskSpec, body: Box<dyn Body>) -> Result<TaskId> {
        let id = self.add(spec, body, None, &HostThread::default())?;
        self.sh.wake(id);
        Ok(id)
    }
    fn wake(&self, t: TaskId) -> bool {
        self.sh.wake(t)
    }
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        host_set_affinity(&self.sh, t, mask)
    }
    fn alive(&self, t: TaskId) -> bool {
        self.sh
            .task(t)
            .is_some_and(|h| !h.ended.load(Ordering::Acquire))
    }
}

/// Pins task `t`'s thread to the host CPUs `mask` maps to.
fn host_set_affinity(sh: &Shared, t: TaskId, mask: &CpuMask) -> Result<()> {
    let tid = sh
        .task(t)
        .map(|h| h.tid.load(Ordering::Acquire))
        .filter(|&tid| tid != 0)
        .ok_or(SchedError::NoSuch {
            what: "task",
            id: t.0,
        })?;
    let cpus = sh.host_cpus(mask);
    crate::os_thread::set_thread_affinity(tid, &cpus).map_err(|source| SchedError::Os {
        context: format!(
            "cannot pin the thread of task {} to host CPUs {cpus:?}",
            t.0
        ),
        source,
    })
}

/// A task thread's setup.
struct Setup {
    what: String,
    pins: Option<Vec<u32>>,
    policy: Policy,
    strict: bool,
}

impl Setup {
    /// Pins the calling thread and gives it its policy; `Err` is a message
    /// for the user.
    fn apply(&self) -> std::result::Result<(), String> {
        let what = &self.what;
        if let Some(p) = &self.pins {
            set_affinity(p)
                .map_err(|e| format!("cannot pin the thread of {what} to host CPUs {p:?}: {e}"))?;
        }
        let policy = self.policy;
        if let Err(e) = set_current_thread_policy(policy) {
            let eperm = matches!(&e, SchedError::Os { source, .. }
                if source.raw_os_error() == Some(libc::EPERM));
            const NEEDS: &str = "needs root, CAP_SYS_NICE or a high enough RLIMIT_RTPRIO";
            if !eperm {
                return Err(format!(
                    "cannot give the thread of {what} the policy {policy}: {e}"
                ));
            }
            if self.strict {
                return Err(format!(
                    "--rt {policy}: cannot set the policy of the thread of {what}: {e} ({NEEDS})"
                ));
            }
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!(
                    "task threads stay SCHED_OTHER: the policy {policy} is not permitted ({NEEDS})"
                )
            });
        }
        Ok(())
    }
}

/// A task thread: set up, report, wait for the first wake, run the body
/// until it ends, retire.
fn thread_main(
    sh: Arc<Shared>,
    t: TaskId,
    setup: Setup,
    tx: mpsc::Sender<std::result::Result<(), String>>,
    mut body: Box<dyn Body>,
) {
    let me = &sh.tasks[t.0 as usize];
    me.tid
        .store(crate::exec::clock::current_tid(), Ordering::Release);
    let _ = me.thread.set(std::thread::current());
    let ok = setup.apply();
    let failed = ok.is_err();
    let _ = tx.send(ok);
    drop(tx);
    if failed {
        me.ended.store(true, Ordering::Release);
        return;
    }
    let mut run = HostRun {
        sh: &sh,
        t,
        since: 0,
        stamp: 0,
        failure: None,
        ended: false,
    };
    // the first wake lets it run (the task was made blocked)
    run.wait_awake(None);
    while !run.ended {
        let bp = run.block_path();
        let engine = HostEngine { sh: &sh };
        let cpu = current_host_cpu().unwrap_or(0);
        let cx = Cx::new(t, cpu, &engine, bp);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.enter(&cx)));
        let action = r
            .unwrap_or_else(|e| Action::Fail(format!("the body panicked: {}", panic_message(&*e))));
        run.stamp = cx.exit_stamp();
        apply(action, &mut run);
    }
    let schedstat = thread_schedstat();
    {
        let mut s = lock(&sh.schedstat);
        if s.len() <= t.0 as usize {
            s.resize(t.0 as usize + 1, None);
        }
        s[t.0 as usize] = schedstat;
    }
    if let Some(why) = &run.failure {
        lock(&sh.failures).push(format!("{}: {why}", setup.what));
    }
    body.finished(&TaskEnd {
        stats: None,
        host_schedstat: schedstat,
        failure: run.failure.take(),
    });
    me.ended.store(true, Ordering::Release);
    sh.live.fetch_sub(1, Ordering::AcqRel);
}

/// A task thread's state while it runs.
struct HostRun<'a> {
    sh: &'a Shared,
    t: TaskId,
    /// Block path: since when this thread waits to run again (0: it ran
    /// on).
    since: u64,
    /// The last entry's exit stamp.
    stamp: u64,
    failure: Option<String>,
    ended: bool,
}

impl HostRun<'_> {
    /// Blocks until a wake (or `due`, or the stop): a remembered wake
    /// returns at once. True if a wake ended it; false if `due` or the stop
    /// did, and the task is awake again either way.
    fn park_until(&mut self, due: Option<u64>) -> bool {
        let me = &self.sh.tasks[self.t.0 as usize];
        // awake -> blocked, or consume the remembered wake
        let mut s = me.state.load(Ordering::Acquire);
        loop {
            let to = if s == PENDING { AWAKE } else { BLOCKED };
            match me
                .state
                .compare_exchange_weak(s, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if s == PENDING => return true,
                Ok(_) => break,
                Err(x) => s = x,
            }
        }
        self.wait_awake(due)
    }

    /// Parks while the task is blocked: until a wake (true), or until
    /// `due` or the stop (false; the task is made awake).
    fn wait_awake(&mut self, due: Option<u64>) -> bool {
        let me = &self.sh.tasks[self.t.0 as usize];
        loop {
            if me.state.load(Ordering::Acquire) != BLOCKED {
                return true;
            }
            let out = self.sh.stopping.load(Ordering::Acquire)
                || match due {
                    None => {
                        std::thread::park();
                        false
                    }
                    Some(d) => {
                        let now = self.sh.now();
                        now >= d || {
                            std::thread::park_timeout(Duration::from_nanos(d - now));
                            false
                        }
                    }
                };
            if out {
                // wake ourselves unless a wake got there first
                return me
                    .state
                    .compare_exchange(BLOCKED, AWAKE, Ordering::AcqRel, Ordering::Acquire)
                    .is_err();
            }
        }
    }

    /// Records this thread's block on its host CPU, if its body stamped
    /// the exit.
    fn blocked(&self) {
        if self.stamp == 0 {
            return;
        }
        self.sh.stamping.store(true, Ordering::Relaxed);
        if let Some(b) = current_host_cpu().and_then(|c| self.sh.blocks.get(c as usize)) {
            b.by.store(self.t.0 + 1, Ordering::Relaxed);
            b.at.store(self.stamp, Ordering::Release);
        }
    }

    /// The block path this entry follows: the first entry after a block on
    /// this host CPU takes the block's stamp; if the blocked one was
    /// another task and this one waited since before the block, the host
    /// kernel switched it in for the blocked one.
    fn block_path(&mut self) -> Option<BlockPath> {
        let since = std::mem::take(&mut self.since);
        if !self.sh.stamping.load(Ordering::Relaxed) {
            return None;
        }
        let b = current_host_cpu().and_then(|c| self.sh.blocks.get(c as usize))?;
        if b.at.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let blocked = b.at.swap(0, Ordering::AcqRel);
        let by = b.by.load(Ordering::Relaxed);
        let now = self.sh.now();
        (since != 0 && by != self.t.0 + 1 && since <= blocked && blocked <= now).then_some(
            BlockPath {
                exit: blocked,
                schedule: None,
            },
        )
    }
}

impl Apply for HostRun<'_> {
    fn block(&mut self) {
        self.blocked();
        if self.park_until(None) {
            self.since = self.sh.tasks[self.t.0 as usize]
                .woken_at
                .load(Ordering::Relaxed);
        }
    }

    /// A timed park that a wake ends early. The kernel's timer woke this
    /// thread and it runs: the whole "due -> wake" stage (no pick after).
    fn sleep_until(&mut self, due: u64) {
        self.blocked();
        if self.park_until(Some(due)) {
            self.since = self.sh.tasks[self.t.0 as usize]
                .woken_at
                .load(Ordering::Relaxed);
        } else {
            self.since = due;
            if let Some(k) = self.sh.tasks[self.t.0 as usize].hooks.get() {
                k.woken();
            }
        }
    }

    fn yield_now(&mut self) {
        std::thread::yield_now();
    }

    fn wake(&mut self, t: TaskId) {
        self.sh.wake(t);
    }

    fn end(&mut self, failure: Option<String>) {
        self.failure = failure;
        self.ended = true;
    }

    fn now(&self) -> u64 {
        self.sh.now()
    }
}

/// A body's view of the host executor.
struct HostEngine<'a> {
    sh: &'a Shared,
}

impl Engine for HostEngine<'_> {
    fn now(&self) -> u64 {
        self.sh.now()
    }
    fn stopping(&self) -> bool {
        self.sh.stopping.load(Ordering::Relaxed)
    }
    /// The host kernel preempts threads itself: a body never has to get
    /// out for it.
    fn should_yield(&self, _id: TaskId, _cpu: CpuId) -> bool {
        false
    }
    fn wake(&self, t: TaskId, _cpu: CpuId) -> bool {
        self.sh.wake(t)
    }
    fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        host_set_affinity(self.sh, t, mask)
    }
}

/// The calling thread's schedstat.
fn thread_schedstat() -> Option<HostSchedstat> {
    crate::exec::clock::schedstat_of("/proc/thread-self/schedstat")
}
