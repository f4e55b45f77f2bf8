//! `schedule` and the steps of a switch: what happens to the current task
//! (keep, requeue, block, exit, forward), draining the wake list, the RT
//! pull when the CPU lowers its priority, the pick, the new-idle balance,
//! and publishing the new current task or idleness.

use std::sync::atomic::Ordering;

use crate::sync::shared::MutexGuard;

use super::{Pick, Prev, Scheduler};
use crate::cpumask::CpuMask;
use crate::cpupri;
use crate::error::Result;
use crate::rq::{Rq, NO_TASK};
use crate::task::{CpuId, Policy, TaskId, PRI_FAIR, PRI_IDLE};
use crate::tasks::{
    lock, state_of, PENDING, ST_BLOCKED, ST_EXITED, ST_QUEUED, ST_RUNNING, ST_WAKING,
};

impl Scheduler {
    /// Makes `id` current on `rq`.
    pub(super) fn set_curr(&self, rq: &mut Rq, id: u32, now: u64, was_curr: bool) {
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
                lock(&t.acct.wake_to_run).record(now.saturating_sub(w));
            }
            pc.hot.curr.store(id, Ordering::Release);
            pc.hot.switch_seq.fetch_add(1, Ordering::Relaxed);
        }
        let pri = pol.pri_idx();
        if rq.curr_pri != pri {
            self.set_curr_pri(rq, pri);
        }
        if rq.idle {
            rq.idle = false;
            pc.hot.idle.store(false, Ordering::Release);
            // it leaves the idle tracker's set at its first schedule after
            // a tick (lazily, as Linux's nohz idle set): a CPU that goes
            // idle again before then writes nothing shared
            pc.hot.idle_set_stale.store(true, Ordering::Relaxed);
        }
        pc.hot
            .slice_end
            .store(self.slice_end(rq, pol, now), Ordering::Relaxed);
    }

    /// Records that `rq` now runs at priority index `pri`. cpupri is
    /// written only when the registered level changes: idle and fair share
    /// one level ([`crate::cpupri::level`]), so a CPU that goes idle after
    /// a fair task, or back, leaves cpupri's shared lines alone.
    fn set_curr_pri(&self, rq: &mut Rq, pri: u32) {
        if cpupri::level(rq.curr_pri) != cpupri::level(pri) {
            self.cpupri.set(rq.cpu, pri);
        }
        rq.curr_pri = pri;
        self.cpus[rq.cpu as usize]
            .hot
            .curr_pri
            .store(pri, Ordering::Relaxed);
    }

    pub(super) fn set_idle(&self, rq: &mut Rq) {
        let pc = &self.cpus[rq.cpu as usize];
        rq.curr = None;
        pc.hot.curr.store(NO_TASK, Ordering::Release);
        if rq.curr_pri != PRI_IDLE {
            self.set_curr_pri(rq, PRI_IDLE);
        }
        if !rq.idle {
            rq.idle = true;
            pc.hot.idle.store(true, Ordering::Release);
            if rq.in_idle_set {
                pc.hot.idle_set_stale.store(false, Ordering::Relaxed);
                pc.hot.idle_set_leave.store(false, Ordering::Relaxed);
            } else {
                rq.in_idle_set = true;
                self.idle.enter(rq.cpu);
            }
            pc.stats.idle_entries.fetch_add(1, Ordering::Relaxed);
            pc.hot.switch_seq.fetch_add(1, Ordering::Relaxed);
        }
        pc.hot.slice_end.store(u64::MAX, Ordering::Relaxed);
    }

    /// Takes the most urgent waiting task off the queues.
    pub(super) fn pick_next(&self, rq: &mut Rq) -> Option<u32> {
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
    pub(super) fn put_prev(&self, rq: &mut Rq, id: u32, now: u64, yielded: bool) {
        let t = self.t(id);
        rq.curr = None;
        t.acct.transition(ST_QUEUED, now);
        t.acct
            .preemptions
            .fetch_add(!yielded as u64, Ordering::Relaxed);
        // (one writer: the CPU that ran it, under its runqueue lock)
        let turns = t.preempted_turns.load(Ordering::Relaxed);
        t.preempted_turns.store(
            if yielded { 0 } else { turns.saturating_add(1) },
            Ordering::Relaxed,
        );
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
    pub(super) fn put_gone(&self, rq: &mut Rq, id: u32, now: u64, to: u32) {
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
    pub(super) fn consume_pending(&self, id: u32) -> bool {
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
    pub(super) fn publish_blocked(&self, id: u32) -> bool {
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

    /// Decides what `cpu` runs next. Call it as whoever holds `cpu`'s run
    /// slot, with `prev` saying what happens to the current task (the idle
    /// context passes [`Prev::Keep`]).
    ///
    /// A CPU id it does not manage is an error ([`SchedError::NoSuchCpu`](crate::SchedError::NoSuchCpu)).
    pub fn schedule(&self, cpu: CpuId, prev: Prev, now: u64) -> Result<Pick> {
        let cpu = self.check_cpu(cpu)?;
        Ok(self.schedule_checked(cpu, prev, now))
    }

    fn schedule_checked(&self, cpu: CpuId, prev: Prev, now: u64) -> Pick {
        let pc = &self.cpus[cpu as usize];
        let mut rq = self.lock_rq(cpu);
        rq.clock = rq.clock.max(now);
        pc.hot.need_resched.store(false, Ordering::SeqCst);
        if pc.hot.idle_set_leave.load(Ordering::Relaxed) {
            // a tick found this CPU busy and still in the idle set
            pc.hot.idle_set_leave.store(false, Ordering::Relaxed);
            if rq.in_idle_set && !rq.idle {
                rq.in_idle_set = false;
                pc.hot.idle_set_stale.store(false, Ordering::Relaxed);
                self.idle.exit(cpu);
            }
        }
        // a puller asked this CPU to push (see pull_rt)
        let asked = pc.hot.push_request.swap(false, Ordering::AcqRel);
        let prev_task = rq.curr;
        let prev_pri = rq.curr_pri;
        let PrevOutcome { keep, forward } = match prev_task {
            Some(c) => self.handle_prev(&mut rq, c, prev, now),
            None => PrevOutcome::default(),
        };
        self.drain_wakelist(&mut rq, now);
        if keep {
            let c = prev_task.expect("keep implies a current task");
            if !self.should_switch(&rq, c, now) {
                self.keep_current(rq, c, now);
                if asked {
                    self.push_rt(cpu, now);
                }
                return Pick::Same;
            }
            self.put_prev(&mut rq, c, now, false);
        }
        let (mut rq, next) = self.balance_and_pick(rq, prev_pri, now);
        let pick = self.switch_to(&mut rq, next, prev_task, now);
        let push = rq.overloaded;
        drop(rq);
        if let Some((c, mask)) = forward {
            self.forward(c, &mask, Some(cpu));
        }
        if push || asked {
            self.push_rt(cpu, now);
        }
        pick
    }

    /// Applies `prev` to current task `c` (charged first): whether it keeps
    /// the CPU, and where it must be forwarded if its affinity moved it.
    fn handle_prev(&self, rq: &mut Rq, c: u32, prev: Prev, now: u64) -> PrevOutcome {
        self.update_curr(rq, c, now);
        let cpu = rq.cpu;
        let t = self.t(c);
        let mut out = PrevOutcome::default();
        match prev {
            Prev::Keep | Prev::Yield => {
                let aff = t.affinity();
                if !aff.contains(cpu) {
                    // Its affinity changed while it ran: send it on.
                    out.forward = Some(self.send_on(rq, c, aff, now));
                } else if prev == Prev::Yield {
                    self.put_prev(rq, c, now, true);
                } else {
                    out.keep = true;
                }
            }
            Prev::Block => {
                if !self.consume_pending(c) {
                    t.preempted_turns.store(0, Ordering::Relaxed);
                    self.put_gone(rq, c, now, ST_BLOCKED);
                    if !self.publish_blocked(c) {
                        // Woken while it was leaving: runnable again, and
                        // this CPU is the waker.
                        t.set_state(ST_WAKING, true);
                        t.acct.transition(ST_WAKING, now);
                        t.acct.wakeups.fetch_add(1, Ordering::Relaxed);
                        if !self.enqueue_woken(rq, c, now) {
                            out.forward = Some((c, t.affinity()));
                        }
                    }
                } else {
                    // A pending wake cancels the block; it runs on,
                    // unless its affinity changed meanwhile.
                    let aff = t.affinity();
                    if aff.contains(cpu) {
                        out.keep = true;
                    } else {
                        out.forward = Some(self.send_on(rq, c, aff, now));
                    }
                }
            }
            Prev::Exit => {
                // off the runqueue first, then final (see publish_blocked)
                self.put_gone(rq, c, now, ST_EXITED);
                t.set_state(ST_EXITED, true);
            }
        }
        out
    }

    /// Current task `c` may no longer run here: it leaves as waking, to be
    /// forwarded to a CPU of `aff` once the lock is dropped.
    fn send_on(&self, rq: &mut Rq, c: u32, aff: CpuMask, now: u64) -> (u32, CpuMask) {
        let t = self.t(c);
        t.set_state(ST_WAKING, false);
        t.acct.preemptions.fetch_add(1, Ordering::Relaxed);
        self.put_gone(rq, c, now, ST_WAKING);
        (c, aff)
    }

    /// Nothing beats current task `c`: renew its slice if it ran out, drop
    /// the lock, and push surplus RT tasks away.
    fn keep_current(&self, rq: MutexGuard<'_, Rq>, c: u32, now: u64) {
        let cpu = rq.cpu;
        let pc = &self.cpus[cpu as usize];
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
    }

    /// Pulls RT tasks if this CPU is about to lower its priority from
    /// `prev_pri`, picks, and if nothing is left balances and picks again.
    /// The lock is dropped around each balance (with `in_balance` set).
    fn balance_and_pick<'a>(
        &'a self,
        mut rq: MutexGuard<'a, Rq>,
        prev_pri: u32,
        now: u64,
    ) -> (MutexGuard<'a, Rq>, Option<u32>) {
        let cpu = rq.cpu;
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
        let rt_pulled = best < prev_pri && self.rto.overloaded();
        if rt_pulled {
            rq = self.unlocked_balance(rq, now, |s| {
                s.pull_rt(cpu, now);
            });
        }
        let mut next = self.pick_next(&mut rq);
        if next.is_none() {
            rq = self.unlocked_balance(rq, now, |s| {
                s.newidle_balance(cpu, now, rt_pulled);
            });
            next = self.pick_next(&mut rq);
        }
        (rq, next)
    }

    /// Runs `balance` with `rq`'s lock dropped and `in_balance` set, then
    /// retakes the lock and drains the wake list.
    fn unlocked_balance<'a>(
        &'a self,
        mut rq: MutexGuard<'a, Rq>,
        now: u64,
        balance: impl FnOnce(&Self),
    ) -> MutexGuard<'a, Rq> {
        let cpu = rq.cpu;
        rq.in_balance = true;
        drop(rq);
        balance(self);
        let mut rq = self.lock_rq(cpu);
        rq.in_balance = false;
        self.drain_wakelist(&mut rq, now);
        rq
    }

    /// Makes `next` current (or the CPU idle) and counts the switch.
    fn switch_to(&self, rq: &mut Rq, next: Option<u32>, prev_task: Option<u32>, now: u64) -> Pick {
        let pick = match next {
            Some(n) => {
                let same = Some(n) == prev_task;
                self.set_curr(rq, n, now, false);
                if same {
                    Pick::Same
                } else {
                    Pick::Switch(TaskId(n))
                }
            }
            None => {
                self.set_idle(rq);
                Pick::Idle
            }
        };
        if pick != Pick::Same {
            self.cpus[rq.cpu as usize]
                .stats
                .switches
                .fetch_add(1, Ordering::Relaxed);
        }
        pick
    }
}

/// What happened to the current task at the start of `schedule`.
#[derive(Default)]
struct PrevOutcome {
    /// It stays current unless something beats it.
    keep: bool,
    /// It left this CPU as waking and goes to a CPU of the mask.
    forward: Option<(u32, CpuMask)>,
}
