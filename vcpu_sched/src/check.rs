//! The invariant checker.
//!
//! [`Scheduler::snapshot_check`] locks every runqueue (in CPU order, so it
//! waits for operations in progress to reach a consistent point) and checks
//! what must hold whenever no runqueue lock is held:
//!
//! * no task lost: every task whose state says queued or running is on
//!   exactly one runqueue, as the current task or in a queue, and on the
//!   runqueue its `cpu` names; nothing else is on a runqueue;
//! * no task running on two CPUs;
//! * affinity respected: a queued task is on an allowed CPU; a running task
//!   is on an allowed CPU or its CPU has been told to reschedule;
//! * the bookkeeping agrees with the runqueues: cpupri levels and counts,
//!   RT overload mask and count, idle masks and counts (per LLC and the
//!   global count of LLCs with idle CPUs, with fix 4), group loads, and the
//!   lock-free queue lengths.
//!
//! It also lists every RT task that waits while a CPU it may use runs
//! something less urgent ([`RtWait`]). At a quiescent point (no wakeup,
//! kick or balance in flight, as in a simulator after it has delivered
//! every kick) there must be none: that is the "the highest-priority
//! runnable RT tasks are the ones running" invariant. A live system always
//! has some in flight, so [`InvariantChecker`] only reports an RT wait that
//! persists unchanged (same waiting period of the task, no context switch
//! on the CPU) for a grace period: a push or pull that never happens, or a
//! kick that is lost.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::cpumask::CpuMask;
use crate::rq::Rq;
use crate::sched::Scheduler;
use crate::task::{CpuId, TaskId, NR_PRI, PRI_FAIR, PRI_IDLE};
use crate::tasks::{lock, ST_FREE, ST_QUEUED, ST_RUNNING, ST_WAKING};

/// An RT task waiting while a CPU it may use runs something less urgent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RtWait {
    /// The waiting task.
    pub task: TaskId,
    /// Its cpupri level (RT priority + 1).
    pub task_pri: u32,
    /// Its enqueue sequence number (tells waiting periods apart).
    pub seq: u64,
    /// The CPU it waits on.
    pub on_cpu: CpuId,
    /// A CPU it may use that runs a lower level.
    pub cpu: CpuId,
    /// That CPU's level.
    pub cpu_pri: u32,
    /// That CPU's context-switch count.
    pub cpu_seq: u64,
    /// Whether that CPU has been told to reschedule.
    pub need_resched: bool,
}

/// What one snapshot found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SnapshotReport {
    /// Broken invariants, in words.
    pub violations: Vec<String>,
    /// RT tasks waiting while a lower-priority CPU they may use exists.
    pub rt_waits: Vec<RtWait>,
    /// Running tasks.
    pub running: u32,
    /// Queued tasks.
    pub queued: u32,
    /// Tasks on their way to a runqueue.
    pub waking: u32,
    /// Live tasks.
    pub live: u32,
    /// Idle CPUs.
    pub idle_cpus: u32,
}

/// What the pass over the runqueues gathers for the checks that follow it.
struct Tally {
    /// Where each task was seen, by task id: (CPU, running).
    seen: Vec<Option<(u32, bool)>>,
    /// Runqueues that say they are in the idle tracker's set.
    idle_set: u32,
    /// CPUs registered at each cpupri level, by the runqueues.
    pri_count: Vec<u32>,
    /// The same CPUs as masks.
    pri_mask: Vec<CpuMask>,
    /// The runqueues that say they are RT-overloaded.
    rto_mask: CpuMask,
}

impl Tally {
    fn new(tasks: usize) -> Self {
        Self {
            seen: vec![None; tasks],
            idle_set: 0,
            pri_count: vec![0; NR_PRI],
            pri_mask: vec![CpuMask::empty(); NR_PRI],
            rto_mask: CpuMask::empty(),
        }
    }

    /// Task `id` is on `cpu`, running or queued; a second sighting is a
    /// violation.
    fn note(&mut self, v: &mut Vec<String>, id: u32, cpu: u32, running: bool) {
        if let Some((c0, r0)) = self.seen[id as usize] {
            v.push(format!(
                "task {id} is on CPU {c0} ({}) and on CPU {cpu} ({})",
                if r0 { "running" } else { "queued" },
                if running { "running" } else { "queued" }
            ));
        } else {
            self.seen[id as usize] = Some((cpu, running));
        }
    }
}

impl Scheduler {
    /// Locks every runqueue and checks the invariants listed in
    /// [`crate::check`]. Stops the whole scheduler for the duration: for
    /// tests and debugging.
    pub fn snapshot_check(&self) -> SnapshotReport {
        let n = self.num_cpus();
        let guards: Vec<_> = (0..n as u32).map(|c| self.lock_rq(c)).collect();
        let rqs: Vec<&Rq> = guards.iter().map(|g| &**g).collect();
        let mut r = SnapshotReport::default();
        let mut v = Vec::new();
        let mut tally = Tally::new(self.tasks.capacity());
        for (cpu, rq) in rqs.iter().enumerate() {
            let cpu = cpu as u32;
            if let Some(c) = rq.curr {
                tally.note(&mut v, c, cpu, true);
            }
            for (id, _) in rq.rt.iter_by_prio() {
                tally.note(&mut v, id, cpu, false);
            }
            for (_, id) in rq.fair.iter() {
                tally.note(&mut v, id, cpu, false);
            }
            self.check_rq_levels(cpu, rq, &mut tally, &mut v);
            self.check_rq_idle(cpu, rq, &mut tally, &mut r, &mut v);
            self.check_rq_queues(cpu, rq, &mut tally, &mut v);
        }
        self.check_cpupri_rto_idle(&tally, r.idle_cpus, &mut v);
        let load = self.check_tasks(&tally, &mut r, &mut v);
        self.check_group_loads(&load, &mut v);
        r.rt_waits = self.rt_waits(&rqs);
        drop(rqs);
        drop(guards);
        r.violations = v;
        r
    }

    /// One runqueue's cpupri registration (made under its lock) and, unless
    /// it is balancing, its level and idle flag against its current task.
    fn check_rq_levels(&self, cpu: CpuId, rq: &Rq, tally: &mut Tally, v: &mut Vec<String>) {
        let reg = self.cpupri.get(cpu);
        if reg != crate::cpupri::level(rq.curr_pri) {
            v.push(format!(
                "CPU {cpu}: cpupri has level {reg}, the runqueue {}",
                rq.curr_pri
            ));
        }
        tally.pri_count[reg as usize] += 1;
        tally.pri_mask[reg as usize].set(cpu);
        if !rq.in_balance {
            let want = rq.curr.map_or(PRI_IDLE, |c| self.t(c).policy().pri_idx());
            if want != rq.curr_pri {
                v.push(format!(
                    "CPU {cpu} runs level {want} but is registered at {}",
                    rq.curr_pri
                ));
            }
            if rq.idle != rq.curr.is_none() {
                v.push(format!(
                    "CPU {cpu}: idle flag {} with current task {:?}",
                    rq.idle, rq.curr
                ));
            }
        }
    }

    /// One runqueue's idle flags against the idle tracker.
    fn check_rq_idle(
        &self,
        cpu: CpuId,
        rq: &Rq,
        tally: &mut Tally,
        r: &mut SnapshotReport,
        v: &mut Vec<String>,
    ) {
        // the set lags a CPU that became busy until it schedules after
        // a tick, never one that went idle
        if self.idle.is_idle(cpu) != rq.in_idle_set || (rq.idle && !rq.in_idle_set) {
            v.push(format!(
                "CPU {cpu}: idle tracker says {} but the runqueue idle {} (in the set {})",
                self.idle.is_idle(cpu),
                rq.idle,
                rq.in_idle_set
            ));
        }
        r.idle_cpus += rq.idle as u32;
        tally.idle_set += rq.in_idle_set as u32;
    }

    /// One runqueue's pushable count and overloaded flag against its RT
    /// queue, and its lock-free queue length against its queues.
    fn check_rq_queues(&self, cpu: CpuId, rq: &Rq, tally: &mut Tally, v: &mut Vec<String>) {
        let pushable = rq
            .rt
            .iter_by_prio()
            .filter(|&(i, _)| self.t(i).pushable.load(Ordering::Relaxed))
            .count() as u32;
        if pushable != rq.rt.nr_pushable {
            v.push(format!(
                "CPU {cpu}: {pushable} pushable RT tasks queued, counted {}",
                rq.rt.nr_pushable
            ));
        }
        if rq.overloaded != (rq.rt.nr_pushable > 0) {
            v.push(format!(
                "CPU {cpu}: overloaded flag {} with {} pushable",
                rq.overloaded, rq.rt.nr_pushable
            ));
        }
        if rq.overloaded {
            tally.rto_mask.set(cpu);
        }
        let hq = self.cpus[cpu as usize]
            .hot
            .nr_queued
            .load(Ordering::Relaxed);
        if hq != rq.nr_queued() {
            v.push(format!(
                "CPU {cpu}: lock-free queue length {hq}, real {}",
                rq.nr_queued()
            ));
        }
    }

    /// The shared bookkeeping against what the runqueues said: cpupri
    /// counts and masks per level, the RT overload mask and count, and the
    /// idle tracker's own consistency and size (`idle_cpus` runqueues are
    /// idle).
    fn check_cpupri_rto_idle(&self, tally: &Tally, idle_cpus: u32, v: &mut Vec<String>) {
        for p in 0..NR_PRI as u32 {
            if self.cpupri.count(p) != tally.pri_count[p as usize] {
                v.push(format!(
                    "cpupri level {p}: count {} but {} CPUs registered",
                    self.cpupri.count(p),
                    tally.pri_count[p as usize]
                ));
            }
            if self.cpupri.mask(p) != tally.pri_mask[p as usize] {
                v.push(format!(
                    "cpupri level {p}: mask {} but registered CPUs {}",
                    self.cpupri.mask(p),
                    tally.pri_mask[p as usize]
                ));
            }
        }
        let rto_mask = tally.rto_mask;
        if self.rto.mask() != rto_mask || self.rto.count() != rto_mask.count() {
            v.push(format!(
                "RT overload mask {} count {}, runqueues say {}",
                self.rto.mask(),
                self.rto.count(),
                rto_mask
            ));
        }
        let idle_set = tally.idle_set;
        match self.idle.check_consistent() {
            Ok(k) if k != idle_set => v.push(format!(
                "idle tracker holds {k} CPUs, {idle_set} runqueues are in its set ({idle_cpus} idle)"
            )),
            Ok(_) => {}
            Err(e) => v.push(e),
        }
    }

    /// Every live task's state against where the runqueues hold it (on
    /// one, on the CPU it names, inside its affinity); counts the report's
    /// running, queued, waking and live tasks. Returns the weight of the
    /// runnable tasks per group.
    fn check_tasks(&self, tally: &Tally, r: &mut SnapshotReport, v: &mut Vec<String>) -> Vec<i64> {
        let mut load = vec![0i64; self.config().max_groups];
        for id in 0..tally.seen.len() as u32 {
            let t = self.t(id);
            let code = t.code();
            if code == ST_FREE {
                continue;
            }
            r.live += 1;
            let cpu = t.cpu.load(Ordering::Acquire);
            match (code, tally.seen[id as usize]) {
                (ST_RUNNING, Some((c, true))) | (ST_QUEUED, Some((c, false))) => {
                    if c != cpu {
                        v.push(format!("task {id} is on CPU {c} but says CPU {cpu}"));
                    }
                    load[t.group.load(Ordering::Relaxed) as usize] += t.policy().weight() as i64;
                    self.check_affinity(id, c, code == ST_QUEUED, v);
                    if code == ST_RUNNING {
                        r.running += 1;
                    } else {
                        r.queued += 1;
                    }
                }
                (ST_RUNNING, None) | (ST_QUEUED, None) => {
                    let state = if code == ST_RUNNING {
                        "running"
                    } else {
                        "queued"
                    };
                    v.push(format!(
                        "task {id} is lost: its state says {state} on CPU {cpu} \
                         but no runqueue holds it"
                    ));
                }
                (_, Some((c, run))) => v.push(format!(
                    "task {id} is {} on CPU {c} but its state is {}",
                    if run { "current" } else { "queued" },
                    crate::tasks::state_of(code).name()
                )),
                (ST_WAKING, None) => r.waking += 1,
                _ => {}
            }
        }
        load
    }

    /// Task `id`, queued or running on CPU `c`, is inside its affinity; a
    /// running task outside it is allowed while `c` has been told to
    /// reschedule.
    fn check_affinity(&self, id: u32, c: CpuId, queued: bool, v: &mut Vec<String>) {
        let aff = self.t(id).affinity();
        if aff.contains(c) {
            return;
        }
        let pending = self.cpus[c as usize]
            .hot
            .need_resched
            .load(Ordering::SeqCst);
        if queued || !pending {
            v.push(format!(
                "task {id} is {} on CPU {c} outside its affinity {aff}",
                if queued { "queued" } else { "running" }
            ));
        }
    }

    /// Each group's load against the weight of its runnable tasks.
    fn check_group_loads(&self, load: &[i64], v: &mut Vec<String>) {
        for (g, &want) in load.iter().enumerate() {
            let got = self.gload.total(g as u32);
            if got != want {
                v.push(format!(
                    "group {g}: load {got} but its runnable tasks weigh {want}"
                ));
            }
        }
    }

    /// The RT tasks queued on `rqs` (every runqueue, locked) that wait
    /// while a CPU they may use, not balancing, runs a lower level (and,
    /// for another CPU, queues nothing at their level or above): the first
    /// such CPU of each task's affinity.
    fn rt_waits(&self, rqs: &[&Rq]) -> Vec<RtWait> {
        let mut waits = Vec::new();
        for (cpu, rq) in rqs.iter().enumerate() {
            for (id, p) in rq.rt.iter_by_prio() {
                let tp = p as u32 + PRI_FAIR;
                let t = self.t(id);
                let aff = *lock(&t.affinity);
                let seq = t.enqueue_seq.load(Ordering::Relaxed);
                for c in aff.iter() {
                    let o = rqs[c as usize];
                    if o.in_balance {
                        continue;
                    }
                    let lower = if c as usize == cpu {
                        o.curr_pri < tp
                    } else {
                        let queued_best = o.rt.highest().map_or(0, |x| x as u32 + PRI_FAIR);
                        o.curr_pri < tp && queued_best < tp
                    };
                    if lower {
                        let hot = &self.cpus[c as usize].hot;
                        waits.push(RtWait {
                            task: TaskId(id),
                            task_pri: tp,
                            seq,
                            on_cpu: cpu as u32,
                            cpu: c,
                            cpu_pri: o.curr_pri,
                            cpu_seq: hot.switch_seq.load(Ordering::Relaxed),
                            need_resched: hot.need_resched.load(Ordering::SeqCst),
                        });
                        break;
                    }
                }
            }
        }
        waits
    }
}

impl Scheduler {
    /// Every runqueue in words (current task, level, waiting tasks), for
    /// failure messages.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for c in 0..self.num_cpus() as u32 {
            let rq = self.lock_rq(c);
            let rt: Vec<String> = rq
                .rt
                .iter_by_prio()
                .map(|(t, p)| {
                    format!(
                        "{t}@{p}{}",
                        if self.t(t).pushable.load(Ordering::Relaxed) {
                            "p"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            let fair: Vec<u32> = rq.fair.iter().map(|(_, t)| t).collect();
            out.push_str(&format!(
                "cpu {c}: curr {:?} level {} rt [{}] fair {:?} ovl {} nr {}\n",
                rq.curr,
                rq.curr_pri,
                rt.join(" "),
                fair,
                rq.overloaded,
                self.cpus[c as usize]
                    .hot
                    .need_resched
                    .load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// What an executor can say about the thread that runs a CPU, so that the
/// checker tells a scheduler fault from a host that has not run that
/// thread (hundreds of emulated CPUs on a few host CPUs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The executor cannot tell; no excuse is made.
    Unknown,
    /// Asleep waiting for a kick, and none is in flight: it will not act
    /// on its own.
    Parked,
    /// Working, or woken and waiting for a host CPU; `cpu_ns` is the host
    /// CPU time it has received so far.
    Runnable {
        /// Host CPU time received so far (ns).
        cpu_ns: u64,
    },
}

/// Host CPU time a CPU's thread must receive after an RT wait outlived the
/// grace period before the wait counts as the scheduler's fault: enough
/// for thousands of passes through its loop.
pub const HOST_RUN_NS: u64 = 20_000_000;

/// An RT wait being watched.
#[derive(Clone, Copy, Debug)]
struct Watch {
    first: u64,
    /// Past the grace period with a host-starved responsible thread: that
    /// thread's CPU time then.
    base: Option<u64>,
}

/// A stress-test companion: takes snapshots, keeps every violation, and
/// reports an RT wait only when it persists for `grace_ns`.
///
/// With [`observe_live`](Self::observe_live) it also asks the executor
/// about the one CPU that has to act: the CPU told to reschedule if it
/// was, else the CPU the task waits on (it must push it). If that CPU's
/// thread is runnable but has not had a host CPU since the grace period
/// ran out, the wait is the host's, not the scheduler's: it is counted in
/// [`host_starved`](Self::host_starved) and reported only once the thread
/// has run [`HOST_RUN_NS`] without resolving it, or after ten grace
/// periods in all. A parked thread gets no excuse: a CPU that must act and
/// sleeps is a lost kick.
#[derive(Debug)]
pub struct InvariantChecker {
    grace_ns: u64,
    watched: HashMap<(u32, u64, u32, u64), Watch>,
    /// Violations found so far (structural ones at once, RT waits after
    /// the grace period).
    pub violations: Vec<String>,
    /// Snapshots taken.
    pub checks: u64,
    /// RT waits seen in any snapshot (transient ones included).
    pub rt_waits_seen: u64,
    /// RT waits that outlived the grace period because the thread that had
    /// to act got no host CPU (see [`observe_live`](Self::observe_live)).
    pub host_starved: u64,
    anomalies_seen: usize,
}

impl InvariantChecker {
    /// A checker that tolerates an RT wait for `grace_ns`.
    pub fn new(grace_ns: u64) -> Self {
        Self {
            grace_ns,
            watched: HashMap::new(),
            violations: Vec::new(),
            checks: 0,
            rt_waits_seen: 0,
            host_starved: 0,
            anomalies_seen: 0,
        }
    }

    /// Takes one snapshot at time `now`; returns how many new violations it
    /// found. Makes no excuse for host starvation.
    pub fn observe(&mut self, s: &Scheduler, now: u64) -> usize {
        self.observe_live(s, now, &|_| Liveness::Unknown)
    }

    /// [`observe`](Self::observe), asking `live` about the CPU that has to
    /// act on an RT wait that outlived the grace period.
    pub fn observe_live(
        &mut self,
        s: &Scheduler,
        now: u64,
        live: &dyn Fn(CpuId) -> Liveness,
    ) -> usize {
        let r = s.snapshot_check();
        self.checks += 1;
        let before = self.violations.len();
        self.violations.extend(r.violations);
        let an = s.anomalies();
        self.violations
            .extend(an.iter().skip(self.anomalies_seen).cloned());
        self.anomalies_seen = an.len();
        self.rt_waits_seen += r.rt_waits.len() as u64;
        let mut keep = HashMap::new();
        for w in r.rt_waits {
            let key = (w.task.0, w.seq, w.cpu, w.cpu_seq);
            let mut watch = self.watched.get(&key).copied().unwrap_or(Watch {
                first: now,
                base: None,
            });
            let waited = now.saturating_sub(watch.first);
            if waited < self.grace_ns {
                keep.insert(key, watch);
                continue;
            }
            let actor = if w.need_resched { w.cpu } else { w.on_cpu };
            let mut why = String::new();
            if waited < self.grace_ns.saturating_mul(10) {
                match live(actor) {
                    Liveness::Unknown => {}
                    Liveness::Parked => {
                        why = format!("; CPU {actor}, which has to act, sleeps unkicked");
                    }
                    Liveness::Runnable { cpu_ns } => match watch.base {
                        None => {
                            self.host_starved += 1;
                            watch.base = Some(cpu_ns);
                            keep.insert(key, watch);
                            continue;
                        }
                        Some(b) if cpu_ns.saturating_sub(b) < HOST_RUN_NS => {
                            keep.insert(key, watch);
                            continue;
                        }
                        Some(b) => {
                            why = format!(
                                "; CPU {actor}, which has to act, ran {} ms on the host meanwhile",
                                (cpu_ns - b) / 1_000_000
                            );
                        }
                    },
                }
            } else if watch.base.is_some() {
                why = format!(
                    "; CPU {actor}, which has to act, got under {} ms of host CPU all along",
                    HOST_RUN_NS / 1_000_000
                );
            }
            self.violations.push(format!(
                "RT task {} (level {}) has waited on CPU {} for {} ms while CPU {} \
                 it may use runs level {} without switching (need_resched={}){why}",
                w.task.0,
                w.task_pri,
                w.on_cpu,
                waited / 1_000_000,
                w.cpu,
                w.cpu_pri,
                w.need_resched
            ));
        }
        self.watched = keep;
        self.violations.len() - before
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use crate::{CpuMask, Mitigations, NoKick, Prev, SchedConfig, Scheduler, TaskId, TaskSpec};

    /// 4 CPUs; two fair tasks pinned to CPU 0, one running and one queued
    /// behind it, returned in that order.
    fn busy() -> (Scheduler, TaskId, TaskId) {
        let topo = Arc::new(topology::load("package:1 l3:1 l2:2 core:2 pu:1").unwrap());
        let s = Scheduler::new(
            topo,
            Mitigations::all(),
            SchedConfig::default(),
            Arc::new(NoKick),
        )
        .unwrap();
        let spec = |n: &str| TaskSpec::new(n).affinity(CpuMask::single(0));
        let a = s.add_task(&spec("a"), 0).unwrap();
        let b = s.add_task(&spec("b"), 0).unwrap();
        s.wake(a, Some(0), 10).unwrap();
        s.wake(b, Some(0), 10).unwrap();
        s.schedule(0, Prev::Keep, 20).unwrap();
        let run = s.current(0).unwrap().expect("CPU 0 runs a task");
        (s, run, if run == a { b } else { a })
    }

    fn violations(s: &Scheduler) -> Vec<String> {
        s.snapshot_check().violations
    }

    #[test]
    fn a_consistent_state_passes_and_is_counted() {
        let (s, ..) = busy();
        let r = s.snapshot_check();
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert!(r.rt_waits.is_empty(), "{:?}", r.rt_waits);
        assert_eq!(
            (r.running, r.queued, r.waking, r.live, r.idle_cpus),
            (1, 1, 0, 2, 3)
        );
    }

    /// Each step of the check finds the break it looks for, in words.
    #[test]
    fn each_step_reports_its_broken_invariant() {
        let (s, ..) = busy();
        s.cpus[0].hot.nr_queued.fetch_add(5, Ordering::Relaxed);
        assert_eq!(violations(&s), ["CPU 0: lock-free queue length 6, real 1"]);

        let (s, _, queued) = busy();
        s.t(queued.0).cpu.store(2, Ordering::Release);
        assert_eq!(
            violations(&s),
            [format!("task {} is on CPU 0 but says CPU 2", queued.0)]
        );

        let (s, ..) = busy();
        s.lock_rq(1).overloaded = true;
        let v = violations(&s);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0], "CPU 1: overloaded flag true with 0 pushable");
        assert!(v[1].starts_with("RT overload mask "), "{v:?}");

        let (s, ..) = busy();
        s.gload.add(0, 0, 7);
        let v = violations(&s);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].starts_with("group 0: load ") && v[0].contains("but its runnable tasks weigh"),
            "{v:?}"
        );

        let (s, _, q) = busy();
        *crate::tasks::lock(&s.t(q.0).affinity) = CpuMask::single(3);
        let v = violations(&s);
        assert_eq!(
            v,
            [format!(
                "task {} is queued on CPU 0 outside its affinity {}",
                q.0,
                CpuMask::single(3)
            )]
        );
    }
}
