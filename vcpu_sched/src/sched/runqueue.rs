//! Runqueue primitives: locking one or two runqueues, the reschedule
//! request, and what changes under a runqueue lock (enqueue, dequeue,
//! charging the current task, slices and preemption checks). The caller
//! holds the lock of every runqueue passed in.

use crate::sync::shared::MutexGuard;
use crate::sync::try_lock;
use std::sync::atomic::Ordering;

use super::Scheduler;
use crate::fair_rq::scale_delta;
use crate::rq::Rq;
use crate::stats::CpuStats;
use crate::task::{CpuId, Policy, PRI_FAIR};
use crate::tasks::{lock, state_of, ST_QUEUED};

impl Scheduler {
    #[inline]
    pub(super) fn stats_of(&self, cpu: Option<CpuId>) -> &CpuStats {
        match cpu {
            Some(c) => &self.cpus[c as usize].stats,
            None => &self.ext,
        }
    }

    #[inline]
    pub(crate) fn lock_rq(&self, cpu: CpuId) -> MutexGuard<'_, Rq> {
        lock(&self.cpus[cpu as usize].rq.lock)
    }

    /// Locks `cpu`'s runqueue if no other thread holds it.
    pub(super) fn try_lock_rq(&self, cpu: CpuId) -> Option<MutexGuard<'_, Rq>> {
        try_lock(&self.cpus[cpu as usize].rq.lock)
    }

    /// Locks two different runqueues in CPU order; returns (a, b).
    pub(super) fn lock2(&self, a: CpuId, b: CpuId) -> (MutexGuard<'_, Rq>, MutexGuard<'_, Rq>) {
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
    pub(super) fn resched_cpu(&self, cpu: CpuId, by: Option<CpuId>) {
        self.cpus[cpu as usize]
            .hot
            .need_resched
            .store(true, Ordering::SeqCst);
        self.stats_of(by)
            .resched_kicks
            .fetch_add(1, Ordering::Relaxed);
        self.kicker.kick(cpu);
    }

    /// With lazy kicks, publishes `rq`'s `min_vruntime` for remote wakers
    /// ([`Self::may_preempt_remote`]); written only when it moved.
    #[inline]
    pub(super) fn publish_min_vruntime(&self, rq: &Rq) {
        if self.cfg.lazy_fair_kicks {
            let w = &self.cpus[rq.cpu as usize].wake.min_vruntime;
            if w.load(Ordering::Relaxed) != rq.fair.min_vruntime {
                w.store(rq.fair.min_vruntime, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn sync_hot(&self, rq: &Rq) {
        self.publish_min_vruntime(rq);
        let h = &self.cpus[rq.cpu as usize].hot;
        h.nr_queued.store(rq.nr_queued(), Ordering::Relaxed);
        h.nr_fair_queued
            .store(rq.fair.len() as u32, Ordering::Relaxed);
        h.nr_rt_queued.store(rq.rt.len(), Ordering::Relaxed);
        let best = rq.rt.highest().map_or(0, |p| p as u32 + PRI_FAIR);
        if h.rt_queued_pri.load(Ordering::Relaxed) != best {
            h.rt_queued_pri.store(best, Ordering::Relaxed);
        }
        // A long queue is summed up as "anyone may": the hint stays O(1)
        // per change however many RT tasks wait.
        let fold = if rq.rt.len() > 8 {
            u64::MAX
        } else {
            rq.rt.iter_by_prio().fold(0, |a, (i, _)| {
                a | self.t(i).aff_fold.load(Ordering::Relaxed)
            })
        };
        if h.rt_queued_fold.load(Ordering::Relaxed) != fold {
            h.rt_queued_fold.store(fold, Ordering::Relaxed);
        }
    }

    /// Counts a migration of a task from `from` to `to` by distance, on
    /// `by`'s counters (the CPU whose code moves it).
    pub(super) fn count_migration(&self, by: CpuId, from: CpuId, to: CpuId) {
        let st = &self.cpus[by as usize].stats;
        let c = if self.map.share_l2(from, to) {
            &st.migrations_l2
        } else if self.map.share_llc(from, to) {
            &st.migrations_llc
        } else if self.map.node_of(from) == self.map.node_of(to) {
            &st.migrations_node
        } else {
            &st.migrations_remote
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn update_overload(&self, rq: &mut Rq) {
        let want = rq.rt.nr_pushable > 0;
        if want != rq.overloaded {
            rq.overloaded = want;
            self.cpus[rq.cpu as usize]
                .stats
                .rto_updates
                .fetch_add(1, Ordering::Relaxed);
            if want {
                self.rto.set(rq.cpu);
            } else {
                self.rto.clear(rq.cpu);
            }
        }
    }

    /// Puts a task on `rq`'s queues and marks it queued there.
    pub(super) fn enqueue_task(&self, rq: &mut Rq, id: u32, now: u64, wakeup: bool, head: bool) {
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
                    vr = vr.max(base - (self.fair.latency_ns / 2) as i64);
                }
                let vr = vr.max(0) as u64;
                t.vruntime.store(vr, Ordering::Relaxed);
                rq.fair.enqueue(id, vr, w);
                if self.cfg.slice_follows_load {
                    self.slice_follows_load(rq);
                }
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
    pub(super) fn dequeue_task(&self, rq: &mut Rq, id: u32) -> bool {
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
    pub(super) fn update_curr(&self, rq: &mut Rq, id: u32, now: u64) {
        let delta = now.saturating_sub(rq.exec_start);
        rq.exec_start = now.max(rq.exec_start);
        let t = self.t(id);
        if let Policy::Fair(w) = t.policy() {
            let vr = t.vruntime.load(Ordering::Relaxed) + scale_delta(delta, w);
            t.vruntime.store(vr, Ordering::Relaxed);
            rq.fair.update_min(Some(vr));
            self.publish_min_vruntime(rq);
        }
    }

    pub(super) fn fair_slice(&self, rq: &Rq, w: u32) -> u64 {
        let total = rq.fair.load + w as u64;
        let s = (self.fair.latency_ns as u128 * w as u128 / total.max(1) as u128) as u64;
        s.max(self.fair.min_granularity_ns)
    }

    /// A fair task joined `rq`: if a fair task runs there, its slice end
    /// moves in to its slice with the load queued now
    /// ([`SchedConfig::slice_follows_load`](crate::SchedConfig)), so the
    /// tick looks at it then rather than at the end of a slice sized for
    /// an emptier runqueue. Only ever earlier: a slice never grows here.
    fn slice_follows_load(&self, rq: &Rq) {
        let Some(c) = rq.curr else {
            return;
        };
        let Policy::Fair(w) = self.t(c).policy() else {
            return;
        };
        let end = rq.slice_start.saturating_add(self.fair_slice(rq, w));
        let h = &self.cpus[rq.cpu as usize].hot;
        if end < h.slice_end.load(Ordering::Relaxed) {
            h.slice_end.store(end, Ordering::Relaxed);
        }
    }

    /// When the tick should next look at the current task.
    pub(super) fn slice_end(&self, rq: &Rq, pol: Policy, now: u64) -> u64 {
        match pol {
            Policy::Fifo(_) => u64::MAX,
            Policy::Rr(_) => now + self.cfg.rr_timeslice_ns,
            Policy::Fair(w) => now + self.fair_slice(rq, w),
        }
    }

    /// Should the current task `id` give way?
    pub(super) fn should_switch(&self, rq: &Rq, id: u32, now: u64) -> bool {
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
                cvr > lvr.saturating_add(self.fair.wakeup_granularity_ns)
                    || (cvr > lvr && now.saturating_sub(rq.slice_start) >= self.fair_slice(rq, w))
            }
        }
    }

    /// Would task `id`, just queued on `rq`, preempt what runs there?
    pub(super) fn check_preempt(&self, rq: &Rq, id: u32) -> bool {
        let Some(c) = rq.curr else {
            return !rq.in_balance;
        };
        let t = self.t(id);
        let pri = t.policy().pri_idx();
        if pri != rq.curr_pri {
            return pri > rq.curr_pri;
        }
        if pri == PRI_FAIR {
            if !self.cfg.fair_wakeup_preempt {
                return false;
            }
            let cvr = self.t(c).vruntime.load(Ordering::Relaxed);
            let vr = t.vruntime.load(Ordering::Relaxed);
            return cvr > vr.saturating_add(self.fair.wakeup_granularity_ns);
        }
        false
    }
}
