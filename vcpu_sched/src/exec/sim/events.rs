//! The events of the simulated CPUs: a burst's end, a kick, a tick, a
//! timer, a wakeup step, a check; and the core calls they make (`wake`,
//! `schedule`, `tick`), each charged by [`Sim::call`].

use super::costs::INSTR;
use super::queue::Ev;
use super::state::{Sim, CHECK_NS, PERIOD_NS, TICK_NS};
use super::workload::SimWorkload;
use crate::{Pick, Prev, TaskId};

impl Sim<'_> {
    /// Handles the event `ev` (sequence number `seq`) at `t`.
    pub(super) fn handle(&mut self, t: u64, seq: u64, ev: Ev) {
        match ev {
            Ev::BurstEnd { cpu } => self.burst_end(cpu, t, seq),
            Ev::Kick { cpu } => self.kick(cpu, t),
            Ev::Tick { cpu } => self.tick(cpu, t),
            Ev::Timer { task } => self.timer(task, t),
            Ev::Check => {
                self.checker.observe(&self.s, t);
                self.push(t + CHECK_NS, Ev::Check);
            }
            Ev::Step { cpu } => {
                let at = t.max(self.cpus[cpu as usize].free_at);
                self.step(cpu, at);
            }
        }
    }

    /// `cpu`'s task finished its step (unless the event is stale): the
    /// workload's model says what it does next ([`Sim::step_done`]), and
    /// unless the model keeps the CPU busy, `cpu` calls `schedule`.
    fn burst_end(&mut self, cpu: u32, t: u64, seq: u64) {
        let c = self.cpus[cpu as usize];
        if c.burst != seq {
            return;
        }
        let Some(id) = c.curr else { return };
        let n = self.task_of(id);
        self.tasks[n].remaining = 0;
        let Some((prev, now)) = self.step_done(n, id, cpu, t) else {
            return;
        };
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
        let (_, end) = self.call(cpu, at, INSTR.tick_ns, |s, now| s.tick(cpu, now));
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
        self.push(t + TICK_NS, Ev::Tick { cpu });
    }

    /// A task's timer fires: cyclic's period (rearmed), or a task's first
    /// start; its CPU wakes it.
    fn timer(&mut self, task: u32, t: u64) {
        let id = self.ids[task as usize];
        let waker = self.s.task_cpu(id).unwrap_or(0);
        if self.cfg.workload == SimWorkload::Cyclic {
            self.tasks[task as usize].fired_at = Some(t);
            self.push(t + PERIOD_NS, Ev::Timer { task });
        }
        let (_, end) = self.call(waker, t, INSTR.wake_ns, |s, now| {
            s.wake(id, Some(waker), now)
        });
        let _ = end;
    }

    pub(super) fn wake(&mut self, n: u32, waker: u32, now: u64) -> u64 {
        let id = self.ids[n as usize];
        let (r, t) = self.call(waker, now, INSTR.wake_ns, |s, now| {
            s.wake(id, Some(waker), now)
        });
        // pingpong counts a delivered token; messaging counts reads and
        // transcode frames at their barrier instead
        match r {
            Ok(true) if self.cfg.workload == SimWorkload::Pingpong => self.done += 1,
            Ok(false) if self.cfg.workload != SimWorkload::Transcode => self.absorbed += 1,
            _ => {}
        }
        t
    }

    pub(super) fn start(&mut self, cpu: u32, id: TaskId, now: u64) {
        let n = self.task_of(id);
        if let Some(f) = self.tasks[n].fired_at.take() {
            let lat = now.saturating_sub(f);
            self.lat_sum += lat;
            self.lat_n += 1;
            self.lat_max = self.lat_max.max(lat);
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
        let mut now = now;
        if let Some(w) = self.plans[cpu as usize].0.pop() {
            if self.cfg.workload == SimWorkload::Runq {
                // the request's stamp
                self.tasks[w as usize].fired_at = Some(now);
            }
            now = self.wake(w, cpu, now);
            if !self.plans[cpu as usize].0.is_empty() {
                self.cpus[cpu as usize].free_at = now;
                self.push(now, Ev::Step { cpu });
                return;
            }
        }
        let then = self.plans[cpu as usize].1;
        self.schedule(cpu, then, now);
    }

    pub(super) fn schedule(&mut self, cpu: u32, prev: Prev, now: u64) {
        let (r, t) = self.call(cpu, now, INSTR.schedule_ns, |s, now| {
            s.schedule(cpu, prev, now)
        });
        self.cpus[cpu as usize].free_at = t;
        match r.expect(crate::exec::CPU_OK) {
            Pick::Same => {
                if let Some(id) = self.cpus[cpu as usize].curr {
                    self.start(cpu, id, t);
                }
            }
            Pick::Switch(id) => self.start(cpu, id, t),
            Pick::Idle => {
                let c = &mut self.cpus[cpu as usize];
                c.curr = None;
                c.burst = 0;
            }
        }
    }
}
