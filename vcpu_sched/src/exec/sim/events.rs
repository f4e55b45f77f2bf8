//! The events of the simulated CPUs: a burst's end, a kick, a tick, a
//! timer, a wakeup step, a check; and the core calls they make (`wake`,
//! `schedule`, `tick`), each started by [`Sim::begin`] with what follows
//! it ([`Then`]): run to completion, that follows at once; interleaved,
//! when the call returns in virtual time.

use super::calls::{AfterWake, Op, Out, Then};
use super::costs::INSTR;
use super::queue::Ev;
use super::state::{Sim, CHECK_NS, PERIOD_NS, TICK_NS};
use super::workload::SimWorkload;
use crate::{Pick, Prev, TaskId};

impl Sim<'_> {
    /// Handles the event `ev` (sequence number `seq`) at `t`.
    pub(super) fn handle(&mut self, t: u64, seq: u64, ev: Ev) {
        match ev {
            Ev::BurstEnd { cpu } | Ev::Kick { cpu } | Ev::Tick { cpu } | Ev::Step { cpu }
                if self.defer_if_busy(cpu, t, seq, ev) => {}
            Ev::BurstEnd { cpu } => self.burst_end(cpu, t, seq),
            Ev::Kick { cpu } => self.kick(cpu, t),
            Ev::Tick { cpu } => self.tick(cpu, t),
            Ev::Timer { task } => self.timer(task, t),
            Ev::Check => {
                self.check_at(t);
                self.push(t + CHECK_NS, Ev::Check);
            }
            Ev::Step { cpu } => {
                let at = t.max(self.cpus[cpu as usize].free_at);
                self.step(cpu, at);
            }
            Ev::Call { slot } => self.call_event(slot as usize, t),
            Ev::Grant { idx } => self.grant_event(idx, t),
        }
    }

    /// `cpu`'s task finished its step (unless the event is stale): the
    /// workload's model says what it does next ([`Sim::step_done`]).
    fn burst_end(&mut self, cpu: u32, t: u64, seq: u64) {
        let c = self.cpus[cpu as usize];
        if c.burst != seq {
            return;
        }
        let Some(id) = c.curr else { return };
        let n = self.task_of(id);
        self.tasks[n].remaining = 0;
        self.step_done(n, id, cpu, t);
    }

    /// `cpu`'s task stops running (per `prev`): `cpu` calls `schedule`.
    pub(super) fn then_schedule(&mut self, cpu: u32, prev: Prev, now: u64) {
        self.cpus[cpu as usize].burst = 0;
        self.schedule(cpu, prev, now);
    }

    /// A kick reaches `cpu`: it stops its task's clock and calls
    /// `schedule`, unless it is in the middle of a wakeup plan.
    fn kick(&mut self, cpu: u32, t: u64) {
        if self.stepping(cpu) {
            // the `schedule` that ends its wakeups does what the
            // kick asks (drain the wake list, pick again)
            return;
        }
        let at = t.max(self.cpus[cpu as usize].free_at);
        self.charge(cpu, at);
        self.schedule(cpu, Prev::Keep, at);
    }

    /// `cpu`'s tick: the core's `tick`, whose time delays the running
    /// task; the next tick one period later.
    fn tick(&mut self, cpu: u32, t: u64) {
        let at = t.max(self.cpus[cpu as usize].free_at);
        self.begin(cpu, at, INSTR.tick_ns, Op::Tick, Then::Tick { at }, true);
        self.push(t + TICK_NS, Ev::Tick { cpu });
    }

    /// `cpu`'s tick, which reached it at `at`, ended at `end`.
    fn ticked(&mut self, cpu: u32, at: u64, end: u64) {
        self.cpus[cpu as usize].free_at = end;
        if self.cpus[cpu as usize].curr.is_some() && !self.stepping(cpu) {
            // the tick's time delays the running task
            let c = self.cpus[cpu as usize];
            let n = self.task_of(c.curr.expect("checked"));
            let ran = at.saturating_sub(c.burst_start);
            let left = self.tasks[n].remaining.saturating_sub(ran).max(1);
            self.cpus[cpu as usize].burst_start = end;
            self.tasks[n].remaining = left;
            self.cpus[cpu as usize].burst = self.push(end + left, Ev::BurstEnd { cpu });
        }
    }

    /// A task's timer fires: cyclic's period (rearmed), or a task's first
    /// start; its CPU wakes it (without waiting for the call: a timer's
    /// wake has never occupied its CPU in this model).
    fn timer(&mut self, task: u32, t: u64) {
        let id = self.ids[task as usize];
        let waker = self.s.task_cpu(id).unwrap_or(0);
        if self.cfg.workload == SimWorkload::Cyclic {
            self.tasks[task as usize].fired_at = Some(t);
            self.push(t + PERIOD_NS, Ev::Timer { task });
        }
        // not counted as a delivered or absorbed wakeup
        self.begin(
            waker,
            t,
            INSTR.wake_ns,
            Op::Wake { id, waker },
            Then::Nothing,
            false,
        );
    }

    /// `waker` wakes task `n` at `now`; `next` says what it does then.
    pub(super) fn wake(&mut self, n: u32, waker: u32, now: u64, next: AfterWake) {
        let id = self.ids[n as usize];
        self.begin(
            waker,
            now,
            INSTR.wake_ns,
            Op::Wake { id, waker },
            Then::Woke { next },
            true,
        );
    }

    /// What follows a call of `cpu` that returned `out` at `t`.
    pub(super) fn cont(&mut self, cpu: u32, then: Then, out: Out, t: u64) {
        match (then, out) {
            (Then::Tick { at }, _) => self.ticked(cpu, at, t),
            (Then::Woke { next }, Out::Woke(r)) => {
                // pingpong counts a delivered token (a partner still on
                // its way to sleep, interleaved, takes it too: its block
                // returns at once); messaging counts reads and transcode
                // frames at their barrier instead
                if let (Ok(_), SimWorkload::Pingpong) = (&r, self.cfg.workload) {
                    self.done += 1;
                }
                match r {
                    Ok(true) if self.cfg.workload == SimWorkload::Pingpong => {}
                    Ok(false) if self.cfg.workload != SimWorkload::Transcode => self.absorbed += 1,
                    _ => {}
                }
                self.woke(cpu, next, t);
            }
            (Then::Scheduled, Out::Picked(r)) => self.scheduled(cpu, r, t),
            (Then::Nothing, _) => {}
            (then, _) => unreachable!("{then:?}: a call's continuation matches its kind"),
        }
    }

    /// `cpu`'s wake returned at `t`: what it does next.
    fn woke(&mut self, cpu: u32, next: AfterWake, t: u64) {
        match next {
            AfterWake::Continue(id) => {
                self.cpus[cpu as usize].free_at = t;
                self.start(cpu, id, t);
            }
            AfterWake::Schedule(prev) => self.then_schedule(cpu, prev, t),
            AfterWake::Step => {
                if !self.plans[cpu as usize].0.is_empty() {
                    self.cpus[cpu as usize].free_at = t;
                    self.push(t, Ev::Step { cpu });
                } else {
                    let then = self.plans[cpu as usize].1;
                    self.schedule(cpu, then, t);
                }
            }
        }
    }

    pub(super) fn start(&mut self, cpu: u32, id: TaskId, now: u64) {
        let n = self.task_of(id);
        if let Some(f) = self.tasks[n].fired_at.take() {
            self.lat.record(now.saturating_sub(f));
        }
        // runq's message task computes nothing between its wakeups
        let idle_step = self.cfg.workload == SimWorkload::Runq && self.tasks[n].idx == 0;
        if self.tasks[n].remaining == 0 && !idle_step {
            let w = self.cfg.work_ns.unwrap_or(self.cfg.workload.work_ns());
            self.tasks[n].remaining = self.jitter(w);
        }
        let c = &mut self.cpus[cpu as usize];
        c.curr = Some(id);
        c.burst_start = now;
        let end = now + self.tasks[n].remaining;
        self.cpus[cpu as usize].burst = self.push(end, Ev::BurstEnd { cpu });
    }

    /// Stops the current burst's clock at `now`.
    pub(super) fn charge(&mut self, cpu: u32, now: u64) {
        let c = &mut self.cpus[cpu as usize];
        c.burst = 0;
        if let Some(id) = c.curr {
            let ran = now.saturating_sub(c.burst_start);
            let n = self.task_of(id);
            let t = &mut self.tasks[n];
            t.remaining = t.remaining.saturating_sub(ran).max(1);
        }
    }

    /// `cpu`'s task, its burst over, wakes `tasks` in order and then calls
    /// `schedule` with `then`. Each wakeup after the first is an event at
    /// the end of the one before, so that what other CPUs do meanwhile
    /// (a kicked CPU draining its wake list) happens in between, as on
    /// hardware; in one handler, a CPU waking eight tasks would finish
    /// and go idle before any of them was seen anywhere.
    pub(super) fn plan(&mut self, cpu: u32, mut tasks: Vec<u32>, then: Prev, now: u64) {
        tasks.reverse();
        self.cpus[cpu as usize].burst = 0;
        self.plans[cpu as usize] = (tasks, then);
        self.step(cpu, now);
    }

    /// `cpu` is waking tasks one after another: its burst is over, and
    /// what remains is those wakeups and then a `schedule`.
    pub(super) fn stepping(&self, cpu: u32) -> bool {
        !self.plans[cpu as usize].0.is_empty()
    }

    /// The next wakeup of `cpu`'s plan; after the last, its `schedule`.
    pub(super) fn step(&mut self, cpu: u32, now: u64) {
        if let Some(w) = self.plans[cpu as usize].0.pop() {
            if self.cfg.workload == SimWorkload::Runq {
                // the request's stamp
                self.tasks[w as usize].fired_at = Some(now);
            }
            self.wake(w, cpu, now, AfterWake::Step);
            return;
        }
        let then = self.plans[cpu as usize].1;
        self.schedule(cpu, then, now);
    }

    pub(super) fn schedule(&mut self, cpu: u32, prev: Prev, now: u64) {
        self.begin(
            cpu,
            now,
            INSTR.schedule_ns,
            Op::Schedule { prev },
            Then::Scheduled,
            true,
        );
    }

    /// `cpu`'s `schedule` returned `r` at `t`: it runs what it picked.
    fn scheduled(&mut self, cpu: u32, r: crate::Result<Pick>, t: u64) {
        self.cpus[cpu as usize].free_at = t;
        match r.expect(crate::exec::CPU_OK) {
            Pick::Same => {
                if let Some(id) = self.cpus[cpu as usize].curr {
                    self.start(cpu, id, t);
                }
            }
            Pick::Switch(id) => {
                // an executor's switch (0 on the presets: see CostTable)
                let t = t + self.coh.cost().switch_ns;
                self.cpus[cpu as usize].free_at = t;
                self.start(cpu, id, t);
            }
            Pick::Idle => {
                let c = &mut self.cpus[cpu as usize];
                // a new idle period (after a task, or a kick that found
                // nothing: either way the CPU left its idle state)
                c.curr = None;
                c.idle_since = t;
                c.burst = 0;
            }
        }
    }
}
