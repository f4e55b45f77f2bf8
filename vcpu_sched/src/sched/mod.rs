//! The scheduler core: decisions and data, no threads.
//!
//! An executor drives it. Whoever holds CPU `c`'s run slot (its current
//! task's thread, or its idle context) calls [`Scheduler::schedule`] for
//! `c` when the current task blocks, yields, exits, or when
//! [`Scheduler::needs_attention`] says `c` has something to look at;
//! anybody may call [`Scheduler::wake`]; a timer calls
//! [`Scheduler::tick`] for every CPU now and then. The core tells the
//! executor that a CPU should look at its state through the [`KickCpu`]
//! given at construction. Time is whatever `now` (ns) the caller passes:
//! a monotonic clock for real threads, virtual time for a simulator.
//!
//! # Locks
//! Per-CPU runqueue locks, taken two at a time in CPU order; a task's
//! affinity lock and a shared-runqueue shard lock are leaves. The wake
//! list, cpupri, RT overload, idle tracking and group load are lock-free.
//!
//! # Flow of a wakeup
//! `wake` claims the blocked task (one CAS), selects a CPU (`select_cpu`)
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
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use crate::config::{FairBounds, SchedConfig};
use crate::cpumask::CpuMask;
use crate::cpupri::CpuPri;
use crate::error::{Result, SchedError};
use crate::group_load::GroupLoad;
use crate::idle::IdleTracker;
use crate::mitigations::Mitigations;
use crate::rq::{PerCpu, NO_TASK};
use crate::rto::RtOverload;
use crate::shared_rq::SharedRq;
use crate::stats::{CpuStats, SchedCounters, TaskStats};
use crate::task::{CpuId, GroupId, Policy, TaskId, TaskSpec, TaskState};
use crate::tasks::{
    lock, state_of, Task, TaskTable, PENDING, ST_BLOCKED, ST_EXITED, ST_FREE, ST_MASK,
};
use crate::topo::TopoMap;

mod affinity;
mod balance;
mod pick;
mod runqueue;
mod time;
mod wakeup;

/// How the core asks an executor to make a CPU look at its state.
///
/// Called after the core set the CPU's `need_resched` flag or made its wake
/// list non-empty. The executor must make whoever holds that CPU's run slot
/// call [`Scheduler::schedule`] soon: unpark an idle context, or preempt
/// the running task (a flag its body polls; for a vCPU, a signal plus
/// `immediate_exit`). It may be called with runqueue locks held and must not
/// call back into the scheduler.
pub trait KickCpu: Send + Sync {
    /// CPU `cpu` has work to look at.
    fn kick(&self, cpu: CpuId);
}

/// A [`KickCpu`] that does nothing (tests that poll).
pub struct NoKick;

impl KickCpu for NoKick {
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

pub(crate) struct Groups {
    names: Mutex<Vec<Option<String>>>,
    pub(crate) ntasks: Box<[AtomicU32]>,
}

/// The scheduler core. Share it (`Arc`) between the threads that drive it.
pub struct Scheduler {
    pub(crate) map: TopoMap,
    topo: Arc<HostTopology>,
    pub(crate) mit: Mitigations,
    pub(crate) cfg: SchedConfig,
    pub(crate) cpus: Box<[PerCpu]>,
    pub(crate) tasks: TaskTable,
    pub(crate) groups: Groups,
    pub(crate) cpupri: CpuPri,
    pub(crate) rto: RtOverload,
    pub(crate) shared: SharedRq,
    pub(crate) idle: IdleTracker,
    pub(crate) gload: GroupLoad,
    kicker: Arc<dyn KickCpu>,
    /// `cfg`'s fair bounds scaled for this scheduler's CPUs.
    pub(crate) fair: FairBounds,
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
        kicker: Arc<dyn KickCpu>,
    ) -> Result<Self> {
        cfg.validate()?;
        let map = TopoMap::new(&topo)?;
        let n = map.ncpus();
        let mut names = vec![None; cfg.max_groups];
        names[0] = Some("root".to_string());
        Ok(Self {
            cpus: (0..n as u32).map(PerCpu::new).collect(),
            tasks: TaskTable::new(cfg.max_tasks, n),
            groups: Groups {
                names: Mutex::new(names),
                ntasks: (0..cfg.max_groups).map(|_| AtomicU32::new(0)).collect(),
            },
            cpupri: CpuPri::new(&map, mit.cpupri, cfg.cpupri_node_masks),
            rto: RtOverload::new(&map, mit.rto),
            shared: SharedRq::new(&map, mit.shardrq, cfg.shard_size),
            idle: IdleTracker::new(&map, mit.llcidle, true),
            gload: GroupLoad::new(&map, cfg.max_groups, mit.grpload),
            ext: CpuStats::default(),
            spread: AtomicU32::new(0),
            anomalies: Mutex::new(Vec::new()),
            fair: cfg.fair_bounds(n),
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

    /// The fair bounds in force: the configured ones scaled for this
    /// scheduler's CPUs ([`SchedConfig::fair_slice_scaling`]).
    pub fn fair_bounds(&self) -> FairBounds {
        self.fair
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

    pub(super) fn task(&self, id: TaskId) -> Result<&Task> {
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

    pub(super) fn check_mask(&self, m: &CpuMask) -> Result<CpuMask> {
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

    /// For diagnostics of a stuck task: its raw state (with a remembered
    /// wake), the CPU it is on or last ran on, how long ago (against `now`)
    /// its last wakeup was, and which CPU's wake list holds it, if any (a
    /// racy walk: a task in flight may be missed).
    pub fn explain_task(&self, id: TaskId, now: u64) -> Result<String> {
        let t = self.task(id)?;
        let code = t.state.load(Ordering::Acquire);
        let woken = t.acct.woken_at.load(Ordering::Relaxed);
        let on_list = self.wake_list_of(id);
        Ok(format!(
            "task {}: {}{}, cpu {}, last woken {}, on the wake list of {}",
            id.0,
            state_of(code).name(),
            if code & PENDING != 0 {
                " (wake remembered)"
            } else {
                ""
            },
            t.cpu.load(Ordering::Acquire),
            if woken == 0 {
                "never".to_string()
            } else {
                format!("{:.3} s ago", now.saturating_sub(woken) as f64 / 1e9)
            },
            on_list.map_or("no CPU".to_string(), |c| format!("CPU {c}")),
        ))
    }

    /// For diagnostics: the CPU whose wake list holds `id`, if any (a racy
    /// walk of every list: a task in flight may be missed).
    pub fn wake_list_of(&self, id: TaskId) -> Option<CpuId> {
        (0..self.cpus.len())
            .find(|&c| {
                let w = &self.cpus[c].wake;
                [&w.list, &w.deferred].into_iter().any(|l| {
                    l.holds(
                        id.0,
                        |i| &self.tasks.slots[i as usize].wake_next,
                        self.tasks.slots.len(),
                    )
                })
            })
            .map(|c| c as CpuId)
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

    /// `cpu` itself if this scheduler manages it, else
    /// [`SchedError::NoSuchCpu`]. Every public method that takes a CPU id
    /// checks it with this (one compare); past it, an out-of-range index is
    /// a broken internal invariant.
    #[inline]
    pub fn check_cpu(&self, cpu: CpuId) -> Result<CpuId> {
        if (cpu as usize) < self.cpus.len() {
            Ok(cpu)
        } else {
            Err(SchedError::NoSuchCpu {
                cpu,
                ncpus: self.cpus.len(),
            })
        }
    }

    /// The task `cpu` is running, as last published (racy).
    pub fn current(&self, cpu: CpuId) -> Result<Option<TaskId>> {
        let cpu = self.check_cpu(cpu)?;
        Ok(
            match self.cpus[cpu as usize].hot.curr.load(Ordering::Acquire) {
                NO_TASK => None,
                t => Some(TaskId(t)),
            },
        )
    }

    /// Should whoever holds `cpu`'s slot call [`schedule`](Self::schedule)?
    /// One load of the CPU's hot line and one or two of its wake list
    /// heads (one line): cheap enough for a preemption checkpoint. A body
    /// that checks it at each entry (a vCPU before `KVM_RUN`) also takes
    /// deferred wakeups there ([`SchedConfig::lazy_fair_kicks`](crate::SchedConfig::lazy_fair_kicks)).
    #[inline]
    pub fn needs_attention(&self, cpu: CpuId) -> Result<bool> {
        let pc = &self.cpus[self.check_cpu(cpu)? as usize];
        Ok(pc.hot.need_resched.load(Ordering::SeqCst)
            || !pc.wake.list.is_empty()
            || (self.cfg.lazy_fair_kicks && !pc.wake.deferred.is_empty()))
    }

    /// For checkers of the kick protocol: true if what makes `cpu` need
    /// attention is only fair wakeups deferred without a kick (lazy kicks,
    /// [`SchedConfig::lazy_fair_kicks`](crate::SchedConfig::lazy_fair_kicks))
    /// while it runs a task: no kick is owed, the CPU takes them at its
    /// next `schedule`, body entry or tick. A CPU id it does not manage is
    /// an error.
    pub fn only_deferred_wakeups(&self, cpu: CpuId) -> Result<bool> {
        let pc = &self.cpus[self.check_cpu(cpu)? as usize];
        Ok(self.cfg.lazy_fair_kicks
            && !pc.wake.deferred.is_empty()
            && pc.wake.list.is_empty()
            && !pc.hot.need_resched.load(Ordering::SeqCst)
            && pc.hot.curr.load(Ordering::Relaxed) != NO_TASK)
    }

    /// For checkers: `Some(mask)` if `id` is `cpu`'s current task although
    /// its affinity `mask` excludes `cpu` and no reschedule is pending there
    /// to move it. Decided under the runqueue lock, because
    /// [`Scheduler::set_affinity`] stores a new mask and requests the
    /// reschedule under that lock: read without it, the pair can be seen
    /// half-done, which is not a violation.
    /// A CPU id it does not manage is an error.
    pub fn running_outside_affinity(&self, cpu: CpuId, id: TaskId) -> Result<Option<CpuMask>> {
        let cpu = self.check_cpu(cpu)?;
        Ok(self.outside_affinity(cpu, id))
    }

    fn outside_affinity(&self, cpu: CpuId, id: TaskId) -> Option<CpuMask> {
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
    pub fn cpu_counters(&self, cpu: CpuId) -> Result<SchedCounters> {
        Ok(self.cpus[self.check_cpu(cpu)? as usize].stats.snapshot())
    }

    /// Records a state that must not exist; the invariant checker reports
    /// them.
    #[cold]
    pub(super) fn anomaly(&self, what: String) {
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
}
