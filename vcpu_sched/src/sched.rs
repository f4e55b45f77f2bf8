//! The scheduler core: decisions and data, no threads.
//!
//! An executor drives it. Whoever holds CPU `c`'s run slot (its current
//! task's thread, or its idle context) calls [`Scheduler::schedule`] for
//! `c` when the current task blocks, yields, exits, or when
//! [`Scheduler::needs_attention`] says `c` has something to look at;
//! anybody may call [`Scheduler::wake`]; a timer calls
//! [`Scheduler::tick`] for every CPU now and then. The core tells the
//! executor that a CPU should look at its state through the [`Kicker`]
//! given at construction. Time is whatever `now` (ns) the caller passes:
//! a monotonic clock for real threads, virtual time for a simulator.
//!
//! # Locks
//! Per-CPU runqueue locks, taken two at a time in CPU order; a task's
//! affinity lock and a shared-runqueue shard lock are leaves. The wake
//! list, cpupri, RT overload, idle tracking and group load are lock-free.
//!
//! # Flow of a wakeup
//! `wake` claims the blocked task (one CAS), [selects a CPU](Self::select_cpu)
//! (cpupri for RT, idle tracking for fair), then either enqueues it directly
//! under the target's lock (waker shares an LLC with the target, or an L2
//! with fix 5) or pushes it onto the target's wake list and kicks the target.
//! An enqueue that should preempt sets the target's `need_resched` and kicks
//! it; an enqueue that overloads a CPU with RT tasks pushes them to CPUs
//! that cpupri says run lower priorities.
//!
//! # Flow of `schedule`
//! Charge the current task, handle it (block unless a wake is pending,
//! requeue, exit), drain the wake list, keep the current task if nothing
//! beats it, otherwise pull RT tasks if this CPU lowers its priority and
//! others are overloaded, pick the most urgent task, and if there is none
//! balance: pull RT, pop the LLC's shared runqueue, steal a waiting fair
//! task. Then register the new state (cpupri, idle, overload) and push
//! surplus RT tasks away.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use crate::config::SchedConfig;
use crate::cpumask::CpuMask;
use crate::cpupri::CpuPri;
use crate::error::{Result, SchedError};
use crate::fair_rq::scale_delta;
use crate::fixes::l2_wake::direct_wakeup_allowed;
use crate::group_load::GroupLoad;
use crate::idle::IdleTracker;
use crate::mitigations::Mitigations;
use crate::rq::{PerCpu, Rq, NO_TASK};
use crate::rto::RtOverload;
use crate::shared_rq::SharedRq;
use crate::stats::{CpuStats, SchedCounters, TaskStats};
use crate::task::{CpuId, GroupId, Policy, TaskId, TaskSpec, TaskState, PRI_FAIR, PRI_IDLE};
use crate::tasks::{
    lock, state_of, Task, TaskTable, PENDING, ST_BLOCKED, ST_EXITED, ST_FREE, ST_MASK, ST_QUEUED,
    ST_RUNNING, ST_WAKING,
};
use crate::topo::TopoMap;

/// How the core asks an executor to make a CPU look at its state.
///
/// Called after the core set the CPU's `need_resched` flag or made its wake
/// list non-empty. The executor must make whoever holds that CPU's run slot
/// call [`Scheduler::schedule`] soon: unpark an idle context, or preempt
/// the running task (a flag its body polls; for a vCPU, a signal plus
/// `immediate_exit`). It may be called with runqueue locks held and must not
/// call back into the scheduler.
pub trait Kicker: Send + Sync {
    /// CPU `cpu` has work to look at.
    fn kick(&self, cpu: CpuId);
}

/// A [`Kicker`] that does nothing (tests that poll).
pub struct NoKick;

impl Kicker for NoKick {
    fn kick(&self, _cpu: CpuId) {}
}

/// What happens to the current task when its CPU schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prev {
    /// It stays runnable; it keeps the CPU unless something should preempt
    /// it (also the idle context's call, when there is no current task).
    Keep,
    /// It waits to be woken, unless a wake is already pending.
    Block,
    /// It goes behind its peers.
    Yield,
    /// It is finished.
    Exit,
}

/// What the CPU runs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The current task keeps running (nothing beat it, or its block was
    /// cancelled by a pending wake).
    Same,
    /// A different task is now current: hand it the run slot.
    Switch(TaskId),
    /// Nothing to run: hand the slot to the idle context.
    Idle,
}

/// A group's description, for reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The id.
    pub id: GroupId,
    /// The name given at creation.
    pub name: String,
    /// Live tasks in it.
    pub tasks: u32,
    /// Summed weight of its runnable tasks.
    pub load: i64,
}

struct Groups {
    names: Mutex<Vec<Option<String>>>,
    ntasks: Box<[AtomicU32]>,
}

/// The scheduler core. Share it (`Arc`) between the threads that drive it.
pub struct Scheduler {
    pub(crate) map: TopoMap,
    topo: Arc<HostTopology>,
    pub(crate) mit: Mitigations,
    pub(crate) cfg: SchedConfig,
    pub(crate) cpus: Box<[PerCpu]>,
    pub(crate) tasks: TaskTable,
    groups: Groups,
    pub(crate) cpupri: CpuPri,
    pub(crate) rto: RtOverload,
    pub(crate) shared: SharedRq,
    pub(crate) idle: IdleTracker,
    pub(crate) gload: GroupLoad,
    kicker: Arc<dyn Kicker>,
    /// Counters of work done by callers that are not a managed CPU
    /// (timers, I/O threads, the ticker).
    ext: CpuStats,
    spread: AtomicU32,
    /// States the core found that must not exist (see [`Scheduler::anomalies`]).
    anomalies: Mutex<Vec<String>>,
}

/// What to do after a runqueue lock is dropped.
#[derive(Default)]
struct After {
    resched: Option<CpuId>,
    push: Option<CpuId>,
}

impl Scheduler {
    /// A scheduler for every CPU of `topo`, all idle, with no tasks but the
    /// root group.
    pub fn new(
        topo: Arc<HostTopology>,
        mit: Mitigations,
        cfg: SchedConfig,
        kicker: Arc<dyn Kicker>,
    ) -> Result<Self> {
        cfg.validate()?;
        let map = TopoMap::new(&topo)?;
        let n = map.ncpus();
        let mut names = vec![None; cfg.max_groups];
        names[0] = Some("root".to_string());
        Ok(Self {
            cpus: (0..n as u32).map(PerCpu::new).collect(),
            tasks: TaskTable::new(cfg.max_tasks),
            groups: Groups {
                names: Mutex::new(names),
                ntasks: (0..cfg.max_groups).map(|_| AtomicU32::new(0)).collect(),
            },
            cpupri: CpuPri::new(&map, mit.cpupri_split, cfg.cpupri_node_masks),
            rto: RtOverload::new(&map, mit.rto_per_node),
            shared: SharedRq::new(&map, mit.sharded_shared_rq, cfg.shard_size),
            idle: IdleTracker::new(&map, mit.llc_idle, true),
            gload: GroupLoad::new(&map, cfg.max_groups, mit.node_group_load),
            ext: CpuStats::default(),
            spread: AtomicU32::new(0),
            anomalies: Mutex::new(Vec::new()),
            map,
            topo,
            mit,
            cfg,
            kicker,
        })
    }

    /// The topology.
    pub fn topology(&self) -> &Arc<HostTopology> {
        &self.topo
    }
    /// The precomputed per-CPU view of the topology.
    pub fn topo_map(&self) -> &TopoMap {
        &self.map
    }
    /// The fixes in force.
    pub fn mitigations(&self) -> Mitigations {
        self.mit
    }
    /// The tunables.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }
    /// Number of CPUs.
    pub fn num_cpus(&self) -> usize {
        self.map.ncpus()
    }

    // ----- groups and tasks -------------------------------------------

    /// Creates a group (a VM).
    pub fn create_group(&self, name: &str) -> Result<GroupId> {
        let mut names = lock(&self.groups.names);
        let i = names
            .iter()
            .position(|n| n.is_none())
            .ok_or(SchedError::TooManyGroups(self.cfg.max_groups))?;
        names[i] = Some(name.to_string());
        Ok(GroupId(i as u32))
    }

    /// Removes an empty group. The root group cannot be removed.
    pub fn remove_group(&self, g: GroupId) -> Result<()> {
        let mut names = lock(&self.groups.names);
        if g.0 == 0 || names.get(g.0 as usize).is_none_or(|n| n.is_none()) {
            return Err(SchedError::NoSuch {
                what: "group",
                id: g.0,
            });
        }
        let n = self.groups.ntasks[g.0 as usize].load(Ordering::Acquire);
        if n != 0 {
            return Err(SchedError::Config(format!(
                "group {} still has {n} tasks; remove them first",
                g.0
            )));
        }
        names[g.0 as usize] = None;
        Ok(())
    }

    /// Every live group with its load.
    pub fn groups(&self) -> Vec<GroupInfo> {
        let names = lock(&self.groups.names);
        names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                n.as_ref().map(|n| GroupInfo {
                    id: GroupId(i as u32),
                    name: n.clone(),
                    tasks: self.groups.ntasks[i].load(Ordering::Relaxed),
                    load: self.gload.total(i as u32),
                })
            })
            .collect()
    }

    /// Summed weight of the group's runnable tasks.
    pub fn group_load(&self, g: GroupId) -> i64 {
        if g.0 as usize >= self.cfg.max_groups {
            return 0;
        }
        self.gload.total(g.0)
    }

    /// Adds a task. It starts blocked: [`wake`](Self::wake) it to run it.
    pub fn add_task(&self, spec: &TaskSpec, now: u64) -> Result<TaskId> {
        spec.policy.validate()?;
        let aff = match spec.affinity {
            Some(m) => self.check_mask(&m)?,
            None => *self.map.all(),
        };
        {
            let names = lock(&self.groups.names);
            if names.get(spec.group.0 as usize).is_none_or(|n| n.is_none()) {
                return Err(SchedError::NoSuch {
                    what: "group",
                    id: spec.group.0,
                });
            }
            self.groups.ntasks[spec.group.0 as usize].fetch_add(1, Ordering::AcqRel);
        }
        let start = self.spread.fetch_add(1, Ordering::Relaxed) % self.map.ncpus() as u32;
        let cpu = aff.next_wrapping(start).unwrap_or(0);
        match self
            .tasks
            .alloc(&spec.name, spec.policy, spec.group.0, aff, cpu, now)
        {
            Some(id) => Ok(TaskId(id)),
            None => {
                self.groups.ntasks[spec.group.0 as usize].fetch_sub(1, Ordering::AcqRel);
                Err(SchedError::TooManyTasks(self.tasks.capacity()))
            }
        }
    }

    /// Removes a blocked or exited task and returns its final statistics.
    /// Its id may be reused afterwards.
    pub fn remove_task(&self, id: TaskId) -> Result<TaskStats> {
        let t = self.task(id)?;
        let s = t.state.load(Ordering::Acquire);
        let code = s & ST_MASK;
        if code != ST_EXITED && code != ST_BLOCKED {
            return Err(SchedError::BadState {
                task: id.0,
                op: "be removed",
                state: state_of(s).name(),
            });
        }
        if t.state
            .compare_exchange(s, ST_FREE, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(SchedError::BadState {
                task: id.0,
                op: "be removed",
                state: "being woken",
            });
        }
        let stats = t.stats();
        let g = t.group.load(Ordering::Relaxed);
        self.groups.ntasks[g as usize].fetch_sub(1, Ordering::AcqRel);
        self.tasks.release(id.0);
        Ok(stats)
    }

    fn task(&self, id: TaskId) -> Result<&Task> {
        match self.tasks.get(id.0) {
            Some(t) if t.state.load(Ordering::Acquire) & ST_MASK != ST_FREE => Ok(t),
            _ => Err(SchedError::NoSuch {
                what: "task",
                id: id.0,
            }),
        }
    }

    #[inline]
    pub(crate) fn t(&self, id: u32) -> &Task {
        &self.tasks.slots[id as usize]
    }

    fn check_mask(&self, m: &CpuMask) -> Result<CpuMask> {
        if m.is_empty() {
            return Err(SchedError::Affinity {
                mask: m.to_string(),
                reason: "it is empty; give at least one CPU".into(),
            });
        }
        if !m.is_subset(self.map.all()) {
            return Err(SchedError::Affinity {
                mask: m.to_string(),
                reason: format!(
                    "CPUs {} are not managed by this scheduler (it has {})",
                    m.and_not(self.map.all()),
                    self.map.all()
                ),
            });
        }
        Ok(*m)
    }

    /// A task's state.
    pub fn task_state(&self, id: TaskId) -> Result<TaskState> {
        Ok(state_of(self.task(id)?.state.load(Ordering::Acquire)))
    }
    /// The CPU a task is on, or last ran on.
    pub fn task_cpu(&self, id: TaskId) -> Result<CpuId> {
        Ok(self.task(id)?.cpu.load(Ordering::Acquire))
    }
    /// A task's policy.
    pub fn task_policy(&self, id: TaskId) -> Result<Policy> {
        Ok(self.task(id)?.policy())
    }
    /// A task's affinity.
    pub fn task_affinity(&self, id: TaskId) -> Result<CpuMask> {
        Ok(self.task(id)?.affinity())
    }
    /// A task's statistics so far.
    pub fn task_stats(&self, id: TaskId) -> Result<TaskStats> {
        Ok(self.task(id)?.stats())
    }
    /// Ids of every live task.
    pub fn live_tasks(&self) -> Vec<TaskId> {
        (0..self.tasks.capacity() as u32)
            .filter(|&i| self.t(i).code() != ST_FREE)
            .map(TaskId)
            .collect()
    }

    /// The task `cpu` is running, as last published (racy).
    pub fn current(&self, cpu: CpuId) -> Option<TaskId> {
        match self.cpus[cpu as usize].hot.curr.load(Ordering::Acquire) {
            NO_TASK => None,
            t => Some(TaskId(t)),
        }
    }

    /// Should whoever holds `cpu`'s slot call [`schedule`](Self::schedule)?
    /// One load of the CPU's hot line and one of its wake list head: cheap
    /// enough for a preemption checkpoint.
    #[inline]
    pub fn needs_attention(&self, cpu: CpuId) -> bool {
        let pc = &self.cpus[cpu as usize];
        pc.hot.need_resched.load(Ordering::SeqCst) || !pc.wake.list.is_empty()
    }

    /// For checkers: `Some(mask)` if `id` is `cpu`'s current task although
    /// its affinity `mask` excludes `cpu` and no reschedule is pending there
    /// to move it. Decided under the runqueue lock, because
    /// [`Scheduler::set_affinity`] stores a new mask and requests the
    /// reschedule under that lock: read without it, the pair can be seen
    /// half-done, which is not a violation.
    pub fn running_outside_affinity(&self, cpu: CpuId, id: TaskId) -> Option<CpuMask> {
        let t = self.task(id).ok()?;
        let rq = self.lock_rq(cpu);
        if rq.curr != Some(id.0) {
            return None;
        }
        let m = t.affinity();
        let pending = self.cpus[cpu as usize]
            .hot
            .need_resched
            .load(Ordering::SeqCst);
        drop(rq);
        (!m.contains(cpu) && !pending).then_some(m)
    }

    /// Counters summed over every CPU and external caller.
    pub fn counters(&self) -> SchedCounters {
        let mut c = self.ext.snapshot();
        for pc in self.cpus.iter() {
            c.add(&pc.stats.snapshot());
        }
        c
    }

    /// One CPU's counters.
    pub fn cpu_counters(&self, cpu: CpuId) -> SchedCounters {
        self.cpus[cpu as usize].stats.snapshot()
    }

    #[inline]
    fn stats_of(&self, cpu: Option<CpuId>) -> &CpuStats {
        match cpu {
            Some(c) => &self.cpus[c as usize].stats,
            None => &self.ext,
        }
    }

    #[inline]
    pub(crate) fn lock_rq(&self, cpu: CpuId) -> MutexGuard<'_, Rq> {
        lock(&self.cpus[cpu as usize].rq.lock)
    }

    /// Locks two different runqueues in CPU order; returns (a, b).
    fn lock2(&self, a: CpuId, b: CpuId) -> (MutexGuard<'_, Rq>, MutexGuard<'_, Rq>) {
        debug_assert_ne!(a, b);
        if a < b {
            let ga = self.lock_rq(a);
            let gb = self.lock_rq(b);
            (ga, gb)
        } else {
            let gb = self.lock_rq(b);
            let ga = self.lock_rq(a);
            (ga, gb)
        }
    }

    /// Sets `cpu`'s need_resched and kicks it.
    #[inline]
    fn resched_cpu(&self, cpu: CpuId, by: Option<CpuId>) {
        self.cpus[cpu as usize]
            .hot
            .need_resched
            .store(true, Ordering::SeqCst);
        self.stats_of(by)
            .resched_kicks
            .fetch_add(1, Ordering::Relaxed);
        self.kicker.kick(cpu);
    }

    // ----- runqueue primitives (caller holds the lock) ------------------

    fn sync_hot(&self, rq: &Rq) {
        let h = &self.cpus[rq.cpu as usize].hot;
        h.nr_queued.store(rq.nr_queued(), Ordering::Relaxed);
        h.nr_fair_queued
            .store(rq.fair.len() as u32, Ordering::Relaxed);
        h.nr_rt_queued.store(rq.rt.len(), Ordering::Relaxed);
    }

    fn update_overload(&self, rq: &mut Rq) {
        let want = rq.rt.nr_pushable > 0;
        if want != rq.overloaded {
            rq.overloaded = want;
            if want {
                self.rto.set(rq.cpu);
            } else {
                self.rto.clear(rq.cpu);
            }
        }
    }

    /// Puts a task on `rq`'s queues and marks it queued there.
    fn enqueue_task(&self, rq: &mut Rq, id: u32, now: u64, wakeup: bool, head: bool) {
        let t = self.t(id);
        let pol = t.policy();
        match pol {
            Policy::Fifo(p) | Policy::Rr(p) => {
                rq.rt.enqueue(id, p, head);
                if t.nr_allowed.load(Ordering::Relaxed) > 1 {
                    t.pushable.store(true, Ordering::Relaxed);
                    rq.rt.nr_pushable += 1;
                }
            }
            Policy::Fair(w) => {
                let rel = t.vruntime.load(Ordering::Relaxed) as i64;
                let base = rq.fair.min_vruntime as i64;
                let mut vr = base.saturating_add(rel);
                if wakeup {
                    // Sleeper credit, bounded: a long sleeper does not
                    // starve the others when it comes back.
                    vr = vr.max(base - (self.cfg.fair_latency_ns / 2) as i64);
                }
                let vr = vr.max(0) as u64;
                t.vruntime.store(vr, Ordering::Relaxed);
                rq.fair.enqueue(id, vr, w);
            }
        }
        t.cpu.store(rq.cpu, Ordering::Release);
        t.enqueue_seq.fetch_add(1, Ordering::Relaxed);
        t.set_state(ST_QUEUED, false);
        if wakeup {
            t.acct.transition(ST_QUEUED, now);
        }
        self.sync_hot(rq);
        self.update_overload(rq);
    }

    /// Takes a queued task off `rq`'s queues (its virtual runtime becomes
    /// relative). Its state is left to the caller.
    fn dequeue_task(&self, rq: &mut Rq, id: u32) -> bool {
        let t = self.t(id);
        let ok = match t.policy() {
            Policy::Fifo(p) | Policy::Rr(p) => {
                let ok = rq.rt.dequeue(id, p);
                if ok && t.pushable.swap(false, Ordering::Relaxed) {
                    rq.rt.nr_pushable -= 1;
                }
                ok
            }
            Policy::Fair(w) => {
                let vr = t.vruntime.load(Ordering::Relaxed);
                let ok = rq.fair.dequeue(id, vr, w);
                if ok {
                    let rel = vr as i64 - rq.fair.min_vruntime as i64;
                    t.vruntime.store(rel as u64, Ordering::Relaxed);
                }
                ok
            }
        };
        if !ok {
            let found: Vec<u64> = rq
                .fair
                .iter()
                .filter(|&(_, i)| i == id)
                .map(|(v, _)| v)
                .collect();
            self.anomaly(format!(
                "task {id} ({:?}) not found in CPU {}'s queues: state {} on CPU {}, vruntime {}, tree keys for it {:?}, rt {:?}",
                t.policy(),
                rq.cpu,
                state_of(t.code()).name(),
                t.cpu.load(Ordering::Relaxed),
                t.vruntime.load(Ordering::Relaxed),
                found,
                rq.rt.iter_by_prio().filter(|&(i, _)| i == id).count()
            ));
        }
        self.sync_hot(rq);
        self.update_overload(rq);
        ok
    }

    /// Charges the current task's runtime since `exec_start`.
    fn update_curr(&self, rq: &mut Rq, id: u32, now: u64) {
        let delta = now.saturating_sub(rq.exec_start);
        rq.exec_start = now.max(rq.exec_start);
        let t = self.t(id);
        if let Policy::Fair(w) = t.policy() {
            let vr = t.vruntime.load(Ordering::Relaxed) + scale_delta(delta, w);
            t.vruntime.store(vr, Ordering::Relaxed);
            rq.fair.update_min(Some(vr));
        }
    }

    fn fair_slice(&self, rq: &Rq, w: u32) -> u64 {
        let total = rq.fair.load + w as u64;
        let s = (self.cfg.fair_latency_ns as u128 * w as u128 / total.max(1) as u128) as u64;
        s.max(self.cfg.fair_min_granularity_ns)
    }

    /// When the tick should next look at the current task.
    fn slice_end(&self, rq: &Rq, pol: Policy, now: u64) -> u64 {
        match pol {
            Policy::Fifo(_) => u64::MAX,
            Policy::Rr(_) => now + self.cfg.rr_timeslice_ns,
            Policy::Fair(w) => now + self.fair_slice(rq, w),
        }
    }

    /// Should the current task `id` give way?
    fn should_switch(&self, rq: &Rq, id: u32, now: u64) -> bool {
        let t = self.t(id);
        let best_rt = rq.rt.highest();
        match t.policy() {
            Policy::Fifo(p) => best_rt.is_some_and(|b| b > p),
            Policy::Rr(p) => {
                best_rt.is_some_and(|b| b > p)
                    || (rq.rt.len_at(p) > 0
                        && now.saturating_sub(rq.slice_start) >= self.cfg.rr_timeslice_ns)
            }
            Policy::Fair(w) => {
                if best_rt.is_some() {
                    return true;
                }
                let Some((lvr, _)) = rq.fair.first() else {
                    return false;
                };
                let cvr = t.vruntime.load(Ordering::Relaxed);
                cvr > lvr.saturating_add(self.cfg.wakeup_granularity_ns)
                    || (cvr > lvr && now.saturating_sub(rq.slice_start) >= self.fair_slice(rq, w))
            }
        }
    }

    /// Would task `id`, just queued on `rq`, preempt what runs there?
    fn check_preempt(&self, rq: &Rq, id: u32) -> bool {
        let Some(c) = rq.curr else {
            return !rq.in_balance;
        };
        let t = self.t(id);
        let pri = t.policy().pri_idx();
        if pri != rq.curr_pri {
            return pri > rq.curr_pri;
        }
        if pri == PRI_FAIR {
            let cvr = self.t(c).vruntime.load(Ordering::Relaxed);
            let vr = t.vruntime.load(Ordering::Relaxed);
            return cvr > vr.saturating_add(self.cfg.wakeup_granularity_ns);
        }
        false
    }

    /// Makes `id` current on `rq`.
    fn set_curr(&self, rq: &mut Rq, id: u32, now: u64, was_curr: bool) {
        let pc = &self.cpus[rq.cpu as usize];
        let t = self.t(id);
        if t.code() != ST_QUEUED || t.cpu.load(Ordering::Relaxed) != rq.cpu {
            self.anomaly(format!(
                "task {id} picked on CPU {} in state {} on CPU {}",
                rq.cpu,
                state_of(t.code()).name(),
                t.cpu.load(Ordering::Relaxed)
            ));
        }
        let pol = t.policy();
        t.set_state(ST_RUNNING, false);
        rq.curr = Some(id);
        rq.exec_start = now;
        if !was_curr {
            rq.slice_start = now;
            t.acct.transition(ST_RUNNING, now);
            t.acct.runs.fetch_add(1, Ordering::Relaxed);
            let w = t.acct.woken_at.swap(0, Ordering::Relaxed);
            if w != 0 {
                t.acct.wake_to_run.record(now.saturating_sub(w));
            }
            pc.hot.curr.store(id, Ordering::Release);
            pc.hot.switch_seq.fetch_add(1, Ordering::Relaxed);
        }
        let pri = pol.pri_idx();
        if rq.curr_pri != pri {
            rq.curr_pri = pri;
            self.cpupri.set(rq.cpu, pri);
            pc.hot.curr_pri.store(pri, Ordering::Relaxed);
        }
        if rq.idle {
            rq.idle = false;
            pc.hot.idle.store(false, Ordering::Release);
            self.idle.exit(rq.cpu);
        }
        pc.hot
            .slice_end
            .store(self.slice_end(rq, pol, now), Ordering::Relaxed);
    }

    fn set_idle(&self, rq: &mut Rq) {
        let pc = &self.cpus[rq.cpu as usize];
        rq.curr = None;
        pc.hot.curr.store(NO_TASK, Ordering::Release);
        if rq.curr_pri != PRI_IDLE {
            rq.curr_pri = PRI_IDLE;
            self.cpupri.set(rq.cpu, PRI_IDLE);
            pc.hot.curr_pri.store(PRI_IDLE, Ordering::Relaxed);
        }
        if !rq.idle {
            rq.idle = true;
            pc.hot.idle.store(true, Ordering::Release);
            self.idle.enter(rq.cpu);
            pc.stats.idle_entries.fetch_add(1, Ordering::Relaxed);
            pc.hot.switch_seq.fetch_add(1, Ordering::Relaxed);
        }
        pc.hot.slice_end.store(u64::MAX, Ordering::Relaxed);
    }

    /// Takes the most urgent waiting task off the queues.
    fn pick_next(&self, rq: &mut Rq) -> Option<u32> {
        if let Some((id, _)) = rq.rt.peek() {
            self.dequeue_task(rq, id);
            return Some(id);
        }
        if let Some((_, id)) = rq.fair.first() {
            self.dequeue_task(rq, id);
            // picked tasks keep absolute virtual runtime while current
            let t = self.t(id);
            let rel = t.vruntime.load(Ordering::Relaxed) as i64;
            t.vruntime.store(
                (rq.fair.min_vruntime as i64 + rel).max(0) as u64,
                Ordering::Relaxed,
            );
            return Some(id);
        }
        None
    }

    /// The current task goes back to the queues, still runnable.
    fn put_prev(&self, rq: &mut Rq, id: u32, now: u64, yielded: bool) {
        let t = self.t(id);
        rq.curr = None;
        t.acct.transition(ST_QUEUED, now);
        t.acct
            .preemptions
            .fetch_add(!yielded as u64, Ordering::Relaxed);
        // absolute -> relative for enqueue_task's arithmetic
        if let Policy::Fair(_) = t.policy() {
            let mut vr = t.vruntime.load(Ordering::Relaxed);
            if yielded {
                if let Some((last, _)) = rq.fair.iter_rev().next() {
                    vr = vr.max(last + 1);
                }
            }
            let rel = vr as i64 - rq.fair.min_vruntime as i64;
            t.vruntime.store(rel as u64, Ordering::Relaxed);
        }
        let head = match t.policy() {
            // A preempted RT task resumes first among its peers; a yield or
            // an expired RR slice goes to the back.
            Policy::Fifo(_) => !yielded,
            Policy::Rr(_) => {
                !yielded && now.saturating_sub(rq.slice_start) < self.cfg.rr_timeslice_ns
            }
            Policy::Fair(_) => false,
        };
        self.enqueue_task(rq, id, now, false, head);
    }

    /// The current task leaves the CPU without staying runnable here
    /// (blocked, exited, or on its way elsewhere).
    fn put_gone(&self, rq: &mut Rq, id: u32, now: u64, to: u32) {
        let t = self.t(id);
        rq.curr = None;
        if let Policy::Fair(_) = t.policy() {
            let vr = t.vruntime.load(Ordering::Relaxed);
            let rel = vr as i64 - rq.fair.min_vruntime as i64;
            t.vruntime.store(rel as u64, Ordering::Relaxed);
        }
        self.gload
            .sub(t.group.load(Ordering::Relaxed), rq.cpu, t.policy().weight());
        t.acct.transition(to, now);
    }

    /// Consumes a pending wake of running task `id`; true if there was one
    /// (its block is cancelled).
    fn consume_pending(&self, id: u32) -> bool {
        let t = self.t(id);
        let mut s = t.state.load(Ordering::Acquire);
        while s & PENDING != 0 {
            match t.state.compare_exchange_weak(
                s,
                s & !PENDING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(x) => s = x,
            }
        }
        false
    }

    /// RUNNING -> BLOCKED, published only after the task is entirely off its
    /// runqueue: a blocked task can be claimed by a lock-free waker at once,
    /// and the waker must not meet runqueue bookkeeping still in progress
    /// (Linux waits on `on_cpu` for the same reason). False if a wake
    /// arrived in the meantime (the pending bit is left for the caller).
    fn publish_blocked(&self, id: u32) -> bool {
        let t = self.t(id);
        let mut s = t.state.load(Ordering::Acquire);
        loop {
            if s & PENDING != 0 {
                return false;
            }
            match t
                .state
                .compare_exchange_weak(s, ST_BLOCKED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(x) => s = x,
            }
        }
    }

    /// Records a state that must not exist; the invariant checker reports
    /// them.
    #[cold]
    fn anomaly(&self, what: String) {
        tracing::error!("scheduler anomaly: {what}");
        let mut a = lock(&self.anomalies);
        if a.len() < 100 {
            a.push(what);
        }
    }

    /// Impossible states the core ran into (and refused to act on).
    pub fn anomalies(&self) -> Vec<String> {
        lock(&self.anomalies).clone()
    }

    /// Enqueues a woken task on `rq` if its affinity allows that CPU;
    /// false if not, and the caller forwards it.
    fn enqueue_woken(&self, rq: &mut Rq, id: u32, now: u64) -> bool {
        let t = self.t(id);
        let code = t.code();
        if code != ST_WAKING {
            self.anomaly(format!(
                "task {id} reached CPU {}'s runqueue from a wakeup in state {}",
                rq.cpu,
                state_of(code).name()
            ));
            return true;
        }
        let aff = lock(&t.affinity);
        if !aff.contains(rq.cpu) {
            return false;
        }
        let from = t.cpu.load(Ordering::Relaxed);
        self.enqueue_task(rq, id, now, true, false);
        drop(aff);
        if from != rq.cpu {
            t.acct.migrations.fetch_add(1, Ordering::Relaxed);
        }
        let pol = t.policy();
        self.gload
            .add(t.group.load(Ordering::Relaxed), rq.cpu, pol.weight());
        if !pol.is_rt() && rq.curr.is_some() && !t.in_shared.swap(true, Ordering::AcqRel) {
            self.shared.push(rq.cpu, id);
        }
        true
    }

    fn drain_wakelist(&self, rq: &mut Rq, now: u64) {
        let pc = &self.cpus[rq.cpu as usize];
        if pc.wake.list.is_empty() {
            return;
        }
        let mut n = 0;
        for id in pc
            .wake
            .list
            .take_all(|i| &self.tasks.slots[i as usize].wake_next)
        {
            n += 1;
            if !self.enqueue_woken(rq, id, now) {
                let mask = self.t(id).affinity();
                self.forward(id, &mask, Some(rq.cpu));
            }
        }
        pc.stats.wake_drained.fetch_add(n, Ordering::Relaxed);
    }

    /// Sends a waking task to an allowed CPU's wake list.
    fn forward(&self, id: u32, mask: &CpuMask, by: Option<CpuId>) {
        let target = self.select_cpu(id, mask, by);
        let st = self.stats_of(by);
        st.wake_forwarded.fetch_add(1, Ordering::Relaxed);
        if self.cpus[target as usize]
            .wake
            .list
            .push(id, &self.t(id).wake_next)
        {
            st.wake_kicks.fetch_add(1, Ordering::Relaxed);
            self.kicker.kick(target);
        }
    }

    // ----- wakeup --------------------------------------------------------

    /// Wakes `id`. `waker` is the CPU the caller runs on, `None` for threads
    /// that are not managed CPUs (timers, I/O). Returns true if the task
    /// was blocked and is now on its way to a CPU; false if it was already
    /// awake, in which case the wake is remembered and its next block
    /// returns at once.
    pub fn wake(&self, id: TaskId, waker: Option<CpuId>, now: u64) -> Result<bool> {
        let t = self.task(id)?;
        if let Some(w) = waker {
            if w as usize >= self.cpus.len() {
                return Err(SchedError::Config(format!(
                    "waker CPU {w} does not exist ({} CPUs)",
                    self.cpus.len()
                )));
            }
        }
        let mut s = t.state.load(Ordering::Acquire);
        loop {
            match s & ST_MASK {
                ST_BLOCKED => match t.state.compare_exchange_weak(
                    s,
                    ST_WAKING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(x) => s = x,
                },
                ST_EXITED | ST_FREE => return Ok(false),
                _ if s & PENDING != 0 => return Ok(false),
                _ => match t.state.compare_exchange_weak(
                    s,
                    s | PENDING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(false),
                    Err(x) => s = x,
                },
            }
        }
        t.acct.transition(ST_WAKING, now);
        t.acct.woken_at.store(now.max(1), Ordering::Relaxed);
        t.acct.wakeups.fetch_add(1, Ordering::Relaxed);
        self.place(id.0, waker, now);
        Ok(true)
    }

    /// Sends a claimed (waking) task to a runqueue.
    fn place(&self, id: u32, waker: Option<CpuId>, now: u64) {
        let t = self.t(id);
        let aff = t.affinity();
        let target = self.select_cpu(id, &aff, waker);
        let st = self.stats_of(waker);
        match waker {
            Some(w) if direct_wakeup_allowed(&self.map, self.mit.l2_wakeup, w, target) => {
                let mut rq = self.lock_rq(target);
                match self.enqueue_woken(&mut rq, id, now) {
                    true => {
                        let mut after = After::default();
                        if self.check_preempt(&rq, id) {
                            after.resched = Some(target);
                        }
                        if rq.overloaded {
                            after.push = Some(target);
                        }
                        drop(rq);
                        st.wake_direct.fetch_add(1, Ordering::Relaxed);
                        self.run_after(after, waker, now);
                    }
                    false => {
                        drop(rq);
                        self.forward(id, &t.affinity(), waker);
                    }
                }
            }
            _ => {
                st.wake_queued.fetch_add(1, Ordering::Relaxed);
                if self.cpus[target as usize].wake.list.push(id, &t.wake_next) {
                    st.wake_kicks.fetch_add(1, Ordering::Relaxed);
                    self.kicker.kick(target);
                }
            }
        }
    }

    fn run_after(&self, a: After, by: Option<CpuId>, now: u64) {
        if let Some(c) = a.resched {
            self.resched_cpu(c, by);
        }
        if let Some(c) = a.push {
            self.push_rt(c, now);
        }
    }

    /// Chooses a CPU for task `id` among `aff`: for RT, the previous CPU if
    /// the task would preempt what runs there, else the lowest-priority
    /// CPU cpupri finds (nearest first); for fair, the previous CPU if idle,
    /// else an idle CPU of its LLC, else the previous CPU. A task whose
    /// previous CPU is no longer allowed goes to the nearest allowed idle
    /// (or lowest-priority) CPU.
    pub(crate) fn select_cpu(&self, id: u32, aff: &CpuMask, _waker: Option<CpuId>) -> CpuId {
        let t = self.t(id);
        let prev = t.cpu.load(Ordering::Relaxed);
        let prev_ok = aff.contains(prev);
        let home = if prev_ok {
            prev
        } else {
            self.map.closest(aff, prev).unwrap_or(prev)
        };
        let pol = t.policy();
        if pol.is_rt() {
            let pri = pol.pri_idx();
            if prev_ok && self.rt_free(prev, pri) {
                return prev;
            }
            if let Some(mut m) = self.cpupri.find(pri, aff, self.map.node_of(home)) {
                // cpupri registers what a CPU runs, not what waits there:
                // a CPU that already has an RT task queued (woken onto it,
                // its kick not yet answered) looks free to every waker.
                // Prefer a candidate without one, so that a burst of
                // wakeups spreads instead of piling onto the one CPU that
                // has not rescheduled yet. Bounded: a few tries, then the
                // nearest candidate.
                let first = self.map.closest(&m, home);
                let mut c = first;
                for _ in 0..4 {
                    match c {
                        Some(x) if !self.rt_free(x, pri) => {
                            m.clear(x);
                            c = self.map.closest(&m, home);
                        }
                        _ => break,
                    }
                }
                if let Some(x) = c.filter(|&x| self.rt_free(x, pri)).or(first) {
                    return x;
                }
            }
            return home;
        }
        if prev_ok && self.cpus[prev as usize].hot.idle.load(Ordering::Relaxed) {
            return prev;
        }
        if let Some(c) = self.idle.find_in_llc(self.map.llc_of(home), aff) {
            return c;
        }
        if !prev_ok {
            if let Some(c) = self.idle.find(aff, home) {
                return c;
            }
        }
        home
    }

    /// Whether an RT task at level `pri` woken onto `cpu` would run there
    /// at once: the CPU runs a lower level, has no RT task queued and no
    /// wakeup on its way in (lock-free reads; a hint: the push after the
    /// enqueue corrects a wrong guess).
    fn rt_free(&self, cpu: CpuId, pri: u32) -> bool {
        let pc = &self.cpus[cpu as usize];
        pc.hot.curr_pri.load(Ordering::Relaxed) < pri
            && pc.hot.nr_rt_queued.load(Ordering::Relaxed) == 0
            && pc.wake.list.is_empty()
    }

    // ----- schedule --------------------------------------------------------

    /// Decides what `cpu` runs next. Call it as whoever holds `cpu`'s run
    /// slot, with `prev` saying what happens to the current task (the idle
    /// context passes [`Prev::Keep`]).
    pub fn schedule(&self, cpu: CpuId, prev: Prev, now: u64) -> Pick {
        let pc = &self.cpus[cpu as usize];
        let mut rq = self.lock_rq(cpu);
        rq.clock = rq.clock.max(now);
        pc.hot.need_resched.store(false, Ordering::SeqCst);
        let prev_task = rq.curr;
        let prev_pri = rq.curr_pri;
        let mut keep = false;
        let mut forward: Option<(u32, CpuMask)> = None;
        if let Some(c) = prev_task {
            self.update_curr(&mut rq, c, now);
            let t = self.t(c);
            match prev {
                Prev::Keep | Prev::Yield => {
                    let aff = t.affinity();
                    if !aff.contains(cpu) {
                        // Its affinity changed while it ran: send it on.
                        t.set_state(ST_WAKING, false);
                        t.acct.preemptions.fetch_add(1, Ordering::Relaxed);
                        self.put_gone(&mut rq, c, now, ST_WAKING);
                        forward = Some((c, aff));
                    } else if prev == Prev::Yield {
                        self.put_prev(&mut rq, c, now, true);
                    } else {
                        keep = true;
                    }
                }
                Prev::Block => {
                    if !self.consume_pending(c) {
                        self.put_gone(&mut rq, c, now, ST_BLOCKED);
                        if !self.publish_blocked(c) {
                            // Woken while it was leaving: runnable again, and
                            // this CPU is the waker.
                            t.set_state(ST_WAKING, true);
                            t.acct.transition(ST_WAKING, now);
                            t.acct.wakeups.fetch_add(1, Ordering::Relaxed);
                            if !self.enqueue_woken(&mut rq, c, now) {
                                forward = Some((c, t.affinity()));
                            }
                        }
                    } else {
                        // A pending wake cancels the block; it runs on,
                        // unless its affinity changed meanwhile.
                        let aff = t.affinity();
                        if aff.contains(cpu) {
                            keep = true;
                        } else {
                            t.set_state(ST_WAKING, false);
                            t.acct.preemptions.fetch_add(1, Ordering::Relaxed);
                            self.put_gone(&mut rq, c, now, ST_WAKING);
                            forward = Some((c, aff));
                        }
                    }
                }
                Prev::Exit => {
                    // off the runqueue first, then final (see publish_blocked)
                    self.put_gone(&mut rq, c, now, ST_EXITED);
                    t.set_state(ST_EXITED, true);
                }
            }
        }
        self.drain_wakelist(&mut rq, now);
        if keep {
            let c = prev_task.expect("keep implies a current task");
            if !self.should_switch(&rq, c, now) {
                let pol = self.t(c).policy();
                if pc.hot.slice_end.load(Ordering::Relaxed) <= now {
                    pc.hot
                        .slice_end
                        .store(self.slice_end(&rq, pol, now), Ordering::Relaxed);
                }
                let push = rq.overloaded;
                drop(rq);
                if push {
                    self.push_rt(cpu, now);
                }
                return Pick::Same;
            }
            self.put_prev(&mut rq, c, now, false);
        }
        // This CPU is about to lower its priority: pull waiting RT tasks
        // that are more urgent than anything queued here.
        let best = rq
            .rt
            .highest()
            .map(|p| p as u32 + PRI_FAIR)
            .unwrap_or(if rq.fair.len() > 0 {
                PRI_FAIR
            } else {
                PRI_IDLE
            });
        if best < prev_pri && self.rto.overloaded() {
            rq.in_balance = true;
            drop(rq);
            self.pull_rt(cpu, now);
            rq = self.lock_rq(cpu);
            rq.in_balance = false;
            self.drain_wakelist(&mut rq, now);
        }
        let mut next = self.pick_next(&mut rq);
        if next.is_none() {
            rq.in_balance = true;
            drop(rq);
            self.newidle_balance(cpu, now);
            rq = self.lock_rq(cpu);
            rq.in_balance = false;
            self.drain_wakelist(&mut rq, now);
            next = self.pick_next(&mut rq);
        }
        let pick = match next {
            Some(n) => {
                let same = Some(n) == prev_task;
                self.set_curr(&mut rq, n, now, false);
                if same {
                    Pick::Same
                } else {
                    Pick::Switch(TaskId(n))
                }
            }
            None => {
                self.set_idle(&mut rq);
                Pick::Idle
            }
        };
        if pick != Pick::Same {
            pc.stats.switches.fetch_add(1, Ordering::Relaxed);
        }
        let push = rq.overloaded;
        drop(rq);
        if let Some((c, mask)) = forward {
            self.forward(c, &mask, Some(cpu));
        }
        if push {
            self.push_rt(cpu, now);
        }
        pick
    }

    /// Moves queued task `id` from `src` to `dst` (both locked).
    fn migrate_queued(&self, src: &mut Rq, dst: &mut Rq, id: u32, now: u64, by: CpuId) {
        let t = self.t(id);
        self.dequeue_task(src, id);
        let st = &self.cpus[by as usize].stats;
        if self.gload.migrate(
            t.group.load(Ordering::Relaxed),
            src.cpu,
            dst.cpu,
            t.policy().weight(),
        ) {
            st.group_load_writes.fetch_add(1, Ordering::Relaxed);
        } else {
            st.group_load_skips.fetch_add(1, Ordering::Relaxed);
        }
        self.enqueue_task(dst, id, now, false, false);
        t.acct.migrations.fetch_add(1, Ordering::Relaxed);
    }

    /// Pushes waiting RT tasks of `cpu` to CPUs running lower priorities.
    pub(crate) fn push_rt(&self, cpu: CpuId, now: u64) {
        // CPUs that turned out busier than cpupri said (busier for every
        // less urgent task too), and tasks that have nowhere to go, for the
        // rest of this call.
        let mut tried = CpuMask::single(cpu);
        let mut stuck: Vec<u32> = Vec::new();
        let mut told = false;
        for _ in 0..32 {
            let rq = self.lock_rq(cpu);
            if !rq.overloaded {
                return;
            }
            // The queue's head preempts what runs here: this CPU runs it
            // next (tell it once), and it stays. The tasks behind it wait
            // here whatever runs now, so they are pushed like any other;
            // otherwise a burst of wakeups onto a CPU slow to answer its
            // kick would all wait for it while other CPUs idle.
            let head = rq.rt.iter_by_prio().next();
            if let Some((h, hp)) = head {
                if hp as u32 + PRI_FAIR > rq.curr_pri && !stuck.contains(&h) {
                    stuck.push(h);
                    if !told && !rq.in_balance {
                        told = true;
                        drop(rq);
                        self.resched_cpu(cpu, Some(cpu));
                    }
                    continue;
                }
            }
            let Some((id, prio)) = rq
                .rt
                .iter_by_prio()
                .find(|&(i, _)| self.t(i).pushable.load(Ordering::Relaxed) && !stuck.contains(&i))
            else {
                return;
            };
            let tpri = prio as u32 + PRI_FAIR;
            drop(rq);
            let aff = self.t(id).affinity().and_not(&tried);
            let target = self
                .cpupri
                .find(tpri, &aff, self.map.node_of(cpu))
                .and_then(|m| self.map.closest(&m, cpu));
            let Some(target) = target else {
                stuck.push(id);
                continue;
            };
            let (mut a, mut b) = self.lock2(cpu, target);
            let t = self.t(id);
            if t.code() != ST_QUEUED || t.cpu.load(Ordering::Acquire) != cpu {
                continue;
            }
            let b_best =
                b.rt.highest()
                    .map(|p| p as u32 + PRI_FAIR)
                    .unwrap_or(0)
                    .max(b.curr_pri);
            if b_best >= tpri || !t.allowed(target) {
                tried.set(target);
                continue;
            }
            self.migrate_queued(&mut a, &mut b, id, now, cpu);
            let resched = !b.in_balance;
            drop(a);
            drop(b);
            self.cpus[cpu as usize]
                .stats
                .rt_pushes
                .fetch_add(1, Ordering::Relaxed);
            if resched {
                self.resched_cpu(target, Some(cpu));
            }
        }
    }

    /// Pulls waiting RT tasks from overloaded CPUs that are more urgent than
    /// anything queued on `cpu`. Returns whether it pulled any.
    fn pull_rt(&self, cpu: CpuId, now: u64) -> bool {
        if !self.rto.overloaded() {
            return false;
        }
        let mut pulled = false;
        let cands = self.rto.candidates(self.map.node_of(cpu));
        for src in cands.iter() {
            if src == cpu
                || self.cpus[src as usize]
                    .hot
                    .nr_rt_queued
                    .load(Ordering::Relaxed)
                    == 0
            {
                continue;
            }
            let (mut me, mut s) = self.lock2(cpu, src);
            let mut mine = me.rt.highest().map(|p| p as u32 + PRI_FAIR).unwrap_or(0);
            if let Some(c) = me.curr {
                mine = mine.max(self.t(c).policy().pri_idx());
            }
            let found = s.rt.iter_by_prio().find(|&(i, p)| {
                let tp = p as u32 + PRI_FAIR;
                // Only tasks more urgent than ours, and only those the source
                // will not run next itself.
                tp > mine
                    && (tp <= s.curr_pri || s.curr.is_none() && s.in_balance)
                    && self.t(i).pushable.load(Ordering::Relaxed)
                    && self.t(i).allowed(cpu)
            });
            if let Some((id, _)) = found {
                self.migrate_queued(&mut s, &mut me, id, now, cpu);
                pulled = true;
                self.cpus[cpu as usize]
                    .stats
                    .rt_pulls
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        pulled
    }

    /// Looks for work for idle `cpu`: RT pull, the LLC's shared runqueue,
    /// then stealing a waiting fair task from a busy CPU nearby.
    fn newidle_balance(&self, cpu: CpuId, now: u64) -> bool {
        if self.pull_rt(cpu, now) {
            return true;
        }
        let st = &self.cpus[cpu as usize].stats;
        for _ in 0..4 {
            let Some(id) = self.shared.pop(cpu) else {
                break;
            };
            self.t(id).in_shared.store(false, Ordering::Release);
            if self.try_pull_fair(cpu, id, now) {
                st.shared_pops.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            st.shared_stale.fetch_add(1, Ordering::Relaxed);
        }
        self.steal_fair(cpu, now)
    }

    /// Migrates fair task `id` to `cpu` if it is still waiting elsewhere
    /// and may run here.
    fn try_pull_fair(&self, cpu: CpuId, id: u32, now: u64) -> bool {
        let t = self.t(id);
        if t.code() != ST_QUEUED || t.policy().is_rt() {
            return false;
        }
        let src = t.cpu.load(Ordering::Acquire);
        if src == cpu {
            return true;
        }
        if !t.allowed(cpu) {
            return false;
        }
        let (mut me, mut s) = self.lock2(cpu, src);
        if t.code() != ST_QUEUED || t.cpu.load(Ordering::Acquire) != src || !t.allowed(cpu) {
            return false;
        }
        self.migrate_queued(&mut s, &mut me, id, now, cpu);
        true
    }

    /// Steals one waiting fair task from a busy CPU: the one that kicked
    /// us first, then our LLC, node, and the rest, looking at no more than
    /// `steal_scan_limit` CPUs.
    fn steal_fair(&self, cpu: CpuId, now: u64) -> bool {
        let hint = self.cpus[cpu as usize]
            .hot
            .balance_hint
            .swap(NO_TASK, Ordering::Relaxed);
        let llc = self.map.llc_span(self.map.llc_of(cpu));
        let node = self.map.node_span(self.map.node_of(cpu));
        let order = [
            if hint != NO_TASK && (hint as usize) < self.cpus.len() {
                CpuMask::single(hint)
            } else {
                CpuMask::empty()
            },
            *llc,
            node.and_not(llc),
            self.map.all().and_not(node),
        ];
        let mut budget = self.cfg.steal_scan_limit;
        for m in order.iter() {
            let mut m = *m;
            m.clear(cpu);
            let mut c = cpu;
            while let Some(src) = m.next_wrapping(c) {
                m.clear(src);
                c = src;
                if budget == 0 {
                    return false;
                }
                budget -= 1;
                if self.cpus[src as usize]
                    .hot
                    .nr_fair_queued
                    .load(Ordering::Relaxed)
                    == 0
                {
                    continue;
                }
                let (mut me, mut s) = self.lock2(cpu, src);
                let cand = s
                    .fair
                    .iter_rev()
                    .map(|(_, i)| i)
                    .find(|&i| self.t(i).allowed(cpu));
                if let Some(id) = cand {
                    self.migrate_queued(&mut s, &mut me, id, now, cpu);
                    self.cpus[cpu as usize]
                        .stats
                        .steals
                        .fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        false
    }

    // ----- time ---------------------------------------------------------

    /// The timer tick for `cpu`. Cheap when nothing is due (a few loads of
    /// the CPU's hot line): checks the current task's slice, and now and
    /// then, if tasks wait here while other CPUs idle, kicks an idle CPU
    /// to take one (idle load balancing).
    pub fn tick(&self, cpu: CpuId, now: u64) {
        let pc = &self.cpus[cpu as usize];
        let h = &pc.hot;
        if now >= h.slice_end.load(Ordering::Relaxed) {
            let mut rq = self.lock_rq(cpu);
            let mut resched = false;
            match rq.curr {
                Some(c) if !rq.in_balance => {
                    self.update_curr(&mut rq, c, now);
                    resched = self.should_switch(&rq, c, now);
                    let pol = self.t(c).policy();
                    h.slice_end
                        .store(self.slice_end(&rq, pol, now), Ordering::Relaxed);
                }
                Some(_) => {}
                None => h.slice_end.store(u64::MAX, Ordering::Relaxed),
            }
            drop(rq);
            pc.stats.ticks_slow.fetch_add(1, Ordering::Relaxed);
            if resched {
                self.resched_cpu(cpu, Some(cpu));
            }
        }
        if h.nr_queued.load(Ordering::Relaxed) > 0 && now >= h.next_balance.load(Ordering::Relaxed)
        {
            h.next_balance
                .store(now + self.cfg.balance_interval_ns, Ordering::Relaxed);
            if self.idle.any() {
                if let Some(i) = self.idle.find(self.map.all(), cpu) {
                    if i != cpu {
                        self.cpus[i as usize]
                            .hot
                            .balance_hint
                            .store(cpu, Ordering::Relaxed);
                        pc.stats.balance_kicks.fetch_add(1, Ordering::Relaxed);
                        self.resched_cpu(i, Some(cpu));
                    }
                }
            }
        }
    }

    // ----- affinity -------------------------------------------------------

    /// Changes a task's affinity. A waiting task on a CPU it may no longer
    /// use moves at once; a running one is preempted and moves when its CPU
    /// reschedules.
    pub fn set_affinity(&self, id: TaskId, mask: &CpuMask, now: u64) -> Result<()> {
        let mask = self.check_mask(mask)?;
        let t = self.task(id)?;
        let store = |t: &Task| {
            let mut a = lock(&t.affinity);
            *a = mask;
            t.nr_allowed.store(mask.count(), Ordering::Relaxed);
        };
        loop {
            let code = t.code();
            let cpu = t.cpu.load(Ordering::Acquire);
            match code {
                ST_QUEUED => {
                    // The mask changes under the runqueue lock, so that no
                    // push, pull or steal (which check the mask under the
                    // locks they hold) moves the task with the old one.
                    let mut rq = self.lock_rq(cpu);
                    if t.code() != ST_QUEUED || t.cpu.load(Ordering::Acquire) != cpu {
                        continue;
                    }
                    store(t);
                    if t.policy().is_rt() {
                        let want = mask.count() > 1;
                        if t.pushable.swap(want, Ordering::Relaxed) != want {
                            if want {
                                rq.rt.nr_pushable += 1;
                            } else {
                                rq.rt.nr_pushable -= 1;
                            }
                            self.update_overload(&mut rq);
                        }
                    }
                    if mask.contains(cpu) {
                        let push = rq.overloaded;
                        drop(rq);
                        if push {
                            self.push_rt(cpu, now);
                        }
                        return Ok(());
                    }
                    self.dequeue_task(&mut rq, id.0);
                    t.set_state(ST_WAKING, false);
                    t.acct.transition(ST_WAKING, now);
                    self.gload
                        .sub(t.group.load(Ordering::Relaxed), cpu, t.policy().weight());
                    drop(rq);
                    self.forward(id.0, &mask, None);
                    return Ok(());
                }
                ST_RUNNING => {
                    let rq = self.lock_rq(cpu);
                    if rq.curr != Some(id.0) {
                        continue;
                    }
                    store(t);
                    if !mask.contains(cpu) {
                        // Its CPU moves it on when it reschedules.
                        self.cpus[cpu as usize]
                            .hot
                            .need_resched
                            .store(true, Ordering::SeqCst);
                        drop(rq);
                        self.stats_of(None)
                            .resched_kicks
                            .fetch_add(1, Ordering::Relaxed);
                        self.kicker.kick(cpu);
                    }
                    return Ok(());
                }
                _ => {
                    // Blocked or waking: a waking task reaches a runqueue only
                    // after checking its mask under the affinity lock, so a
                    // mask stored while it is not queued is seen. If it got
                    // queued before we took the lock, go round again.
                    let mut a = lock(&t.affinity);
                    let c = t.code();
                    if c == ST_QUEUED || c == ST_RUNNING {
                        drop(a);
                        continue;
                    }
                    *a = mask;
                    t.nr_allowed.store(mask.count(), Ordering::Relaxed);
                    return Ok(());
                }
            }
        }
    }
}
