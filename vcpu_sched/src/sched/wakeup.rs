//! Wakeups: claiming a blocked task, choosing its CPU, and sending it there
//! (directly under the target's lock, or through the target's wake list and
//! a kick), plus draining a wake list.

use std::sync::atomic::{fence, Ordering};

use super::{After, Scheduler};
use crate::cpumask::CpuMask;
use crate::error::Result;
use crate::fixes::l2wake::direct_wakeup_allowed;
use crate::rq::Rq;
use crate::rq::NO_TASK;
use crate::task::{CpuId, TaskId, PRI_FAIR, PRI_IDLE};
use crate::tasks::{lock, state_of, PENDING, ST_BLOCKED, ST_EXITED, ST_FREE, ST_MASK, ST_WAKING};
use crate::wakelist::WakeList;

impl Scheduler {
    /// Enqueues a woken task on `rq` if its affinity allows that CPU;
    /// false if not, and the caller forwards it.
    pub(super) fn enqueue_woken(&self, rq: &mut Rq, id: u32, now: u64) -> bool {
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
            self.count_migration(rq.cpu, from, rq.cpu);
        }
        let pol = t.policy();
        self.gload
            .add(t.group.load(Ordering::Relaxed), rq.cpu, pol.weight());
        if !pol.is_rt() && rq.curr.is_some() && !t.in_shared.swap(true, Ordering::AcqRel) {
            self.shared.push(rq.cpu, id);
        }
        true
    }

    /// Enqueues what this CPU's wake lists hold (the deferred one too,
    /// with lazy kicks on); returns how many tasks it took.
    pub(super) fn drain_wakelist(&self, rq: &mut Rq, now: u64) -> u64 {
        let pc = &self.cpus[rq.cpu as usize];
        let mut n = self.drain_list(rq, &pc.wake.list, now);
        if self.cfg.lazy_fair_kicks {
            n += self.drain_list(rq, &pc.wake.deferred, now);
        }
        n
    }

    fn drain_list(&self, rq: &mut Rq, list: &WakeList, now: u64) -> u64 {
        if list.is_empty() {
            return 0;
        }
        let mut n = 0;
        for id in list.take_all(|i| &self.tasks.slots[i as usize].wake_next) {
            n += 1;
            if !self.enqueue_woken(rq, id, now) {
                let mask = self.t(id).affinity();
                self.forward(id, &mask, Some(rq.cpu));
            }
        }
        self.cpus[rq.cpu as usize]
            .stats
            .wake_drained
            .fetch_add(n, Ordering::Relaxed);
        n
    }

    /// Sends a waking task to an allowed CPU's wake list.
    pub(super) fn forward(&self, id: u32, mask: &CpuMask, by: Option<CpuId>) {
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

    /// Wakes `id`. `waker` is the CPU the caller runs on, `None` for threads
    /// that are not managed CPUs (timers, I/O). Returns true if the task
    /// was blocked and is now on its way to a CPU; false if it was already
    /// awake, in which case the wake is remembered and its next block
    /// returns at once.
    pub fn wake(&self, id: TaskId, waker: Option<CpuId>, now: u64) -> Result<bool> {
        let t = self.task(id)?;
        if let Some(w) = waker {
            self.check_cpu(w)?;
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
        if self.cfg.sleeper_credit {
            self.credit_sleep(id.0, now);
        }
        t.acct.transition(ST_WAKING, now);
        t.acct.woken_at.store(now.max(1), Ordering::Relaxed);
        t.acct.wakeups.fetch_add(1, Ordering::Relaxed);
        self.place(id.0, waker, now);
        Ok(true)
    }

    /// Sleeper credit ([`SchedConfig::sleeper_credit`](crate::SchedConfig)):
    /// a fair task just claimed from blocked is credited the time it
    /// slept, up to half the latency, on its relative virtual runtime;
    /// `enqueue_task` then clamps it at the runqueue's `min_vruntime`
    /// less half the latency, as before. Linux's CFS keeps a sleeper's
    /// absolute virtual runtime and renormalizes it against its old
    /// runqueue's `min_vruntime` at the wakeup, so the credit there is how
    /// far that advanced during the sleep (capped the same way: its
    /// GENTLE_FAIR_SLEEPERS); with `n` equal tasks on that runqueue that is
    /// about `slept / n`, so this rule credits short sleeps more.
    fn credit_sleep(&self, id: u32, now: u64) {
        let t = self.t(id);
        if t.policy().is_rt() {
            return;
        }
        let slept = now
            .saturating_sub(t.acct.since.load(Ordering::Relaxed))
            .min(self.fair.latency_ns / 2);
        let rel = t.vruntime.load(Ordering::Relaxed) as i64;
        t.vruntime
            .store(rel.saturating_sub(slept as i64) as u64, Ordering::Relaxed);
    }

    /// Sends a claimed (waking) task to a runqueue.
    pub(super) fn place(&self, id: u32, waker: Option<CpuId>, now: u64) {
        let t = self.t(id);
        let aff = t.affinity();
        let target = self.select_cpu(id, &aff, waker);
        let st = self.stats_of(waker);
        match waker {
            Some(w) if direct_wakeup_allowed(&self.map, self.mit.l2wake, w, target) => {
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
                let w = &self.cpus[target as usize].wake;
                if self.cfg.lazy_fair_kicks && !self.may_preempt_remote(id, target) {
                    w.deferred.push(id, &t.wake_next);
                    // Pairs with the fence an idle CPU's own thread makes
                    // between going idle (`hot.idle`, set in `schedule`)
                    // and looking at its wake lists (`needs_attention`):
                    // either this waker sees the CPU idle and kicks it, or
                    // the CPU sees the task (store-buffer pattern).
                    fence(Ordering::SeqCst);
                    if self.is_idle_now(target) {
                        st.wake_kicks.fetch_add(1, Ordering::Relaxed);
                        self.kicker.kick(target);
                    } else {
                        st.wake_deferred.fetch_add(1, Ordering::Relaxed);
                    }
                } else if w.list.push(id, &t.wake_next) {
                    st.wake_kicks.fetch_add(1, Ordering::Relaxed);
                    self.kicker.kick(target);
                }
            }
        }
    }

    /// A remote waker's lock-free guess of [`Self::check_preempt`] for
    /// task `id` about to be queued on `target`: would it preempt what
    /// runs there? True for RT tasks, an idle CPU, or a CPU between
    /// tasks; false for a fair task against a running RT one; for two fair
    /// tasks, the woken one is placed as `enqueue_task` will place it
    /// (against the CPU's published `min_vruntime`, with the sleeper
    /// credit) and compared as `check_preempt` compares. Every input may
    /// be stale; each stale value errs towards true (a kick) except the
    /// running task's virtual runtime, which `check_preempt` reads as
    /// stale too (it is charged at ticks and schedules).
    pub(super) fn may_preempt_remote(&self, id: u32, target: CpuId) -> bool {
        let t = self.t(id);
        if t.policy().is_rt() {
            return true;
        }
        let h = &self.cpus[target as usize].hot;
        match h.curr_pri.load(Ordering::Relaxed) {
            PRI_FAIR if !self.cfg.fair_wakeup_preempt => return false,
            PRI_FAIR => {}
            p => return p == PRI_IDLE,
        }
        let c = h.curr.load(Ordering::Relaxed);
        if c == NO_TASK || c as usize >= self.tasks.slots.len() {
            return true;
        }
        // off a runqueue, a fair task's virtual runtime is relative to the
        // runqueue's min_vruntime (i64 bits)
        let rel =
            (t.vruntime.load(Ordering::Relaxed) as i64).max(-((self.fair.latency_ns / 2) as i64));
        let base = self.cpus[target as usize]
            .wake
            .min_vruntime
            .load(Ordering::Relaxed) as i64;
        let placed = base.saturating_add(rel).max(0) as u64;
        let cvr = self.t(c).vruntime.load(Ordering::Relaxed);
        cvr > placed.saturating_add(self.fair.wakeup_granularity_ns)
    }

    pub(super) fn run_after(&self, a: After, by: Option<CpuId>, now: u64) {
        if let Some(c) = a.resched {
            self.resched_cpu(c, by);
        }
        if let Some(c) = a.push {
            self.push_rt(c, now);
        }
    }

    /// Chooses a CPU for task `id` among `aff`: for RT, the previous CPU if
    /// the task would preempt what runs there, else the lowest-priority
    /// CPU cpupri finds (an idle one of the LLC, else the nearest); for fair, the previous CPU if idle,
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
                let first = self.rt_target(&m, home);
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
        let live = |c| self.is_idle_now(c);
        if let Some(c) = self.idle.find_in_llc(self.map.llc_of(home), aff, &live) {
            return c;
        }
        if !prev_ok {
            if let Some(c) = self.idle.find(aff, home, &live) {
                return c;
            }
        }
        home
    }

    /// Where in `m`, CPUs at the lowest level cpupri found, an RT task near
    /// `home` goes: an idle CPU of `home`'s LLC if the idle tracker knows
    /// one (cpupri files idle and fair CPUs together, so it cannot say),
    /// else the nearest CPU of `m`.
    pub(super) fn rt_target(&self, m: &CpuMask, home: CpuId) -> Option<CpuId> {
        self.idle
            .find_in_llc(self.map.llc_of(home), m, &|c| self.is_idle_now(c))
            .or_else(|| self.map.closest(m, home))
    }

    /// Is `cpu` idle now, by its own flag (the idle tracker's set can name
    /// CPUs that have become busy since; see [`crate::idle`]).
    #[inline]
    pub(super) fn is_idle_now(&self, cpu: CpuId) -> bool {
        self.cpus[cpu as usize].hot.idle.load(Ordering::Relaxed)
    }

    /// Whether an RT task at level `pri` woken onto `cpu` would run there
    /// at once: the CPU runs a lower level, has no RT task queued and no
    /// wakeup on its way in (lock-free reads; a hint: the push after the
    /// enqueue corrects a wrong guess).
    pub(super) fn rt_free(&self, cpu: CpuId, pri: u32) -> bool {
        let pc = &self.cpus[cpu as usize];
        pc.hot.curr_pri.load(Ordering::Relaxed) < pri
            && pc.hot.nr_rt_queued.load(Ordering::Relaxed) == 0
            && pc.wake.list.is_empty()
    }
}
