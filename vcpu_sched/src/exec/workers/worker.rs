//! A worker thread: the loop that schedules its CPU, parks it while idle
//! and enters the picked task's body itself (see the module above for
//! the protocol with kickers).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::Pool;
use crate::exec::body::{apply, Action, Apply, BlockPath, Body, Cx};
use crate::exec::clock::current_tid;
use crate::exec::shared::{CpuCounters, CpuSlot, SchedEngine, IDLE};
use crate::exec::threads::panic_message;
use crate::exec::CPU_OK;
use crate::sched::{Pick, Prev};
use crate::task::{CpuId, TaskId};

/// A sleep timer a worker keeps for a task it ran: (due, task, generation).
type LocalTimer = Reverse<(u64, u32, u64)>;

/// The body of CPU `cpu`'s worker thread.
pub(super) fn worker_main(p: Arc<Pool>, cpu: CpuId) {
    let slot = &p.core.slots[cpu as usize];
    slot.tid.store(current_tid(), Ordering::Release);
    p.core.host_rt(0);
    // its timed parks fire tasks' sleep timers: no 50 us timer slack
    let _ = crate::os_thread::set_timer_slack(1);
    p.core.pin_to(slot.host_cpu);
    Worker {
        p: &p,
        cpu,
        slot,
        counters: &p.core.counters[cpu as usize],
        cur: None,
        prev: Prev::Keep,
        resched: true,
        local: BinaryHeap::new(),
        advance_ns: 0,
        blocked_exit: 0,
        switch: None,
        failure: None,
    }
    .run();
}

/// One worker's loop state.
struct Worker<'a> {
    p: &'a Pool,
    cpu: CpuId,
    slot: &'a CpuSlot,
    counters: &'a CpuCounters,
    /// The task whose body it runs (`None`: idle).
    cur: Option<TaskId>,
    /// What happens to `cur` at the next `schedule`.
    prev: Prev,
    /// Whether to call `schedule` before anything else.
    resched: bool,
    /// Sleep timers armed by tasks that ran here. The worker fires them
    /// itself, from a timed park or between two entries, so a timer
    /// wakeup is one host wakeup (this thread's) instead of two (the clock
    /// thread's, then its kick to this worker). The clock thread keeps
    /// every timer too, as a backstop for a worker that is busy;
    /// whichever fires first takes the generation.
    local: BinaryHeap<LocalTimer>,
    /// Timer advance: how far ahead of a local timer the worker parks
    /// (an average of how late its timed parks returned; see
    /// `timer_advance_max` in the module above).
    advance_ns: u64,
    /// Block path: when the event of the body that blocks at the next
    /// `schedule` happened (its stamp; 0: none).
    blocked_exit: u64,
    /// Block path: a block whose next pick is another task that has not
    /// been entered yet: (exit, `schedule` called, returned).
    switch: Option<(u64, u64, u64)>,
    /// Why the current task failed, for its retirement.
    failure: Option<String>,
}

impl Worker<'_> {
    /// The worker's loop: schedule when needed, park while idle, otherwise
    /// run the current task; returns when the executor quits.
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
            if !self.local.is_empty() {
                self.fire_local();
            }
            self.run_task(t);
        }
    }

    /// Whether the core wants this CPU to schedule.
    fn needs_attention(&self) -> bool {
        self.p.sched.needs_attention(self.cpu).expect(CPU_OK)
    }

    /// Asks `schedule` at the next round, telling the core `prev`.
    fn resched_with(&mut self, prev: Prev) {
        self.prev = prev;
        self.resched = true;
    }

    /// Calls `schedule`, retires a task that exited and publishes what was
    /// picked; false when the CPU needs attention again already.
    fn reschedule(&mut self) -> bool {
        let (p, cpu) = (self.p, self.cpu);
        let t0 = p.core.now();
        let exiting = self.prev == Prev::Exit;
        let pick = p.sched.schedule(cpu, self.prev, t0).expect(CPU_OK);
        let t1 = p.core.now();
        self.counters
            .sched_ns
            .fetch_add(t1.saturating_sub(t0), Ordering::Relaxed);
        self.counters.sched_calls.fetch_add(1, Ordering::Relaxed);
        // block path: a block followed by a switch waits for the next
        // entry; idling ends it uncounted; a keep (the CPU schedules again
        // before running) leaves a pending one as it is
        let blocked = std::mem::take(&mut self.blocked_exit);
        match pick {
            Pick::Switch(_) if blocked != 0 => self.switch = Some((blocked, t0, t1)),
            Pick::Idle => self.switch = None,
            _ if blocked != 0 => self.switch = None,
            _ => {}
        }
        if exiting {
            if let Some(t) = self.cur.take() {
                p.retire(t, self.failure.take());
            }
        }
        self.cur = match pick {
            Pick::Same => {
                if exiting {
                    p.core
                        .violation(format!("CPU {cpu}: schedule kept an exiting task"));
                }
                self.cur
            }
            Pick::Switch(n) => {
                p.core.picked(n);
                Some(n)
            }
            Pick::Idle => None,
        };
        self.prev = Prev::Keep;
        self.resched = false;
        if let Some(t) = self.cur.and_then(|t| p.core.task(t)) {
            t.preempt.store(false, Ordering::Relaxed);
        }
        self.slot
            .owner
            .store(self.cur.map_or(IDLE, |t| t.0), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.needs_attention() {
            self.resched = true;
            return false;
        }
        true
    }

    /// Fires the local timers that are due: claims each one's generation
    /// (the clock thread may have fired it already) and wakes its task
    /// from this CPU.
    fn fire_local(&mut self) {
        let now = self.p.core.now();
        while let Some(&Reverse((due, t, gen))) = self.local.peek() {
            if due > now {
                break;
            }
            self.local.pop();
            self.p
                .core
                .fire_timer(&self.p.sched, TaskId(t), gen, Some(self.cpu));
        }
    }

    /// Parks the idle worker until a kick's token; false when the executor
    /// quits.
    fn park(&mut self) -> bool {
        let (w, core) = (self.slot, &*self.p.core);
        // `parked` is cleared before the token is taken, so the checker
        // never sees this worker parked without a token once a kick has
        // landed.
        let next_due = |l: &BinaryHeap<LocalTimer>| l.peek().map(|r| r.0 .0);
        // Poll a while first (see `idle_spin`): a kick that comes soon is
        // taken without a futex round trip.
        if self.p.idle_spin_ns > 0 {
            let until =
                (core.now() + self.p.idle_spin_ns).min(next_due(&self.local).unwrap_or(u64::MAX));
            while !w.token.load(Ordering::Acquire)
                && !core.quit.load(Ordering::Relaxed)
                && core.now() < until
            {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            }
        }
        w.parked.store(true, Ordering::SeqCst);
        while !w.token.load(Ordering::SeqCst) {
            if core.quit.load(Ordering::Acquire) {
                w.parked.store(false, Ordering::SeqCst);
                return false;
            }
            let now = core.now();
            match self.local.peek().map(|r| r.0) {
                // a local timer is due: fire it below (its wake kicks this
                // CPU, whose token the next round takes)
                Some((d, _, _)) if d <= now => break,
                Some((d, t, gen)) => {
                    let ahead = self.advances(TaskId(t), gen);
                    if ahead && d - now <= self.advance_ns {
                        // within the advance: poll the rest of the way
                        self.poll_until(d);
                    } else {
                        self.park_ahead_of(d, now, ahead);
                    }
                }
                None => std::thread::park(),
            }
        }
        w.parked.store(false, Ordering::SeqCst);
        if w.take_token() {
            self.counters.idle_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        if !self.local.is_empty() {
            self.fire_local();
        }
        !core.quit.load(Ordering::Acquire)
    }

    /// Whether the worker parks ahead of task `t`'s timer of generation
    /// `gen`: with the timer advance on, while the timer is live (a wake
    /// that ended the sleep early leaves a stale timer in the heap, not
    /// worth a poll), and for RT tasks only. Their wakeup latency is what
    /// they are there for (cyclic, RT transcoding vCPUs); a fair task's
    /// timer is not worth the idle CPU's polling (a Linux guest's halted
    /// fair vCPUs sleep to their next timer tick, hundreds of times a
    /// second each, and under kvm_pvm the host CPUs the polling would take
    /// are what a booting guest runs short of).
    fn advances(&self, t: TaskId, gen: u64) -> bool {
        self.p.timer_advance_max_ns > 0
            && self
                .p
                .core
                .task(t)
                .is_some_and(|rt| rt.timer_gen.load(Ordering::Acquire) == gen)
            && self.p.sched.task_policy(t).is_ok_and(|p| p.is_rt())
    }

    /// Parks until the local timer due at `d`, or `advance_ns` before it
    /// when `ahead` (`now` being earlier than that), and with the timer
    /// advance on learns from how late the park returned.
    fn park_ahead_of(&mut self, d: u64, now: u64, ahead: bool) {
        let target = if ahead { d - self.advance_ns } else { d };
        std::thread::park_timeout(std::time::Duration::from_nanos(target - now));
        let max = self.p.timer_advance_max_ns;
        if max == 0 {
            return;
        }
        let woke = self.p.core.now();
        // only a park that ran out: a kick's unpark (token) or a spurious
        // return before the target says nothing of the timer's lateness
        if woke >= target && !self.slot.token.load(Ordering::Acquire) {
            let late = (woke - target).min(max);
            // an average of the lateness, each sample 1/8 of the way
            self.advance_ns = if late >= self.advance_ns {
                self.advance_ns + (late - self.advance_ns) / 8
            } else {
                self.advance_ns - (self.advance_ns - late) / 8
            };
        }
    }

    /// Polls until `d`, a kick's token or the quit, whichever is first;
    /// counts the time polled.
    fn poll_until(&mut self, d: u64) {
        let core = &*self.p.core;
        let start = core.now();
        while core.now() < d
            && !self.slot.token.load(Ordering::Acquire)
            && !core.quit.load(Ordering::Relaxed)
        {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
        self.counters
            .timer_spin_ns
            .fetch_add(core.now().saturating_sub(start), Ordering::Relaxed);
    }

    /// Enters task `t`'s body once, unless the CPU needs attention first,
    /// and acts on what it returns.
    fn run_task(&mut self, t: TaskId) {
        let (p, cpu) = (self.p, self.cpu);
        let Some(slot) = p.bodies.get(t.0 as usize) else {
            p.core
                .violation(format!("CPU {cpu} picked task {} beyond the table", t.0));
            self.resched_with(Prev::Exit);
            return;
        };
        // Held while the body runs: a second worker finding it taken is
        // running the same task twice.
        let Ok(mut guard) = slot.0.try_lock() else {
            p.core
                .violation(format!("CPU {cpu}: task {} is being run elsewhere", t.0));
            self.resched_with(Prev::Keep);
            std::thread::yield_now();
            return;
        };
        let Some(body) = guard.as_mut() else {
            p.core
                .violation(format!("CPU {cpu} picked task {} that has no body", t.0));
            self.resched_with(Prev::Exit);
            return;
        };
        if p.core.check {
            self.check_current(t);
        }
        // running again ends a sleep, early or not: its timer is void
        if let Some(rt) = p.core.task(t) {
            if rt.sleep_due.swap(0, Ordering::AcqRel) != 0 {
                rt.timer_gen.fetch_add(1, Ordering::AcqRel);
            }
        }
        // The check right before entering (a later kick reaches the body
        // through its preempt flag and hook).
        if self.needs_attention() {
            self.resched = true;
            return;
        }
        let (action, stamp) = self.enter(t, &mut **body);
        drop(guard);
        let mut a = Applier { w: self, t, stamp };
        apply(action, &mut a);
    }

    /// Enters `body` (task `t`) with its block path, containing a panic as
    /// a failure; returns its action and exit stamp.
    fn enter(&mut self, t: TaskId, body: &mut dyn Body) -> (Action, u64) {
        let p = self.p;
        let engine = SchedEngine {
            core: &p.core,
            sched: &p.sched,
        };
        let bp = self.switch.take().map(|(exit, called, picked)| BlockPath {
            exit,
            schedule: Some((called, picked)),
        });
        let cx = Cx::new(t, self.cpu, &engine, bp);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.enter(&cx)));
        let action = r.unwrap_or_else(|e| {
            let msg = panic_message(&*e);
            p.core
                .violation(format!("the body of task {} panicked: {msg}", t.0));
            Action::Fail(format!("the body panicked: {msg}"))
        });
        (action, cx.exit_stamp())
    }

    /// The checker's checks on a task about to run here: the core has it
    /// current on this CPU, and this CPU is inside its affinity.
    fn check_current(&self, t: TaskId) {
        let (p, cpu) = (self.p, self.cpu);
        let cur = p.sched.current(cpu).expect(CPU_OK);
        if cur != Some(t) {
            p.core.violation(format!(
                "CPU {cpu} runs task {} but the core has {cur:?} current",
                t.0
            ));
        }
        // decided under the runqueue lock (see running_outside_affinity)
        if let Some(m) = p.sched.running_outside_affinity(cpu, t).expect(CPU_OK) {
            p.core.violation(format!(
                "task {} runs on CPU {cpu} outside its affinity {m}",
                t.0
            ));
        }
    }
}

/// A worker's [`Apply`]: what the core hears at the next `schedule`, a
/// sleep's timer, a wake from this CPU.
struct Applier<'w, 'a> {
    w: &'w mut Worker<'a>,
    t: TaskId,
    /// The body's exit stamp (block path).
    stamp: u64,
}

impl Apply for Applier<'_, '_> {
    fn block(&mut self) {
        self.w.blocked_exit = self.stamp;
        self.w.resched_with(Prev::Block);
    }

    fn sleep_until(&mut self, due: u64) {
        self.w.blocked_exit = self.stamp;
        let gen = self.w.p.core.arm_sleep(self.t, due);
        self.w.local.push(Reverse((due, self.t.0, gen)));
        self.w.resched_with(Prev::Block);
    }

    fn yield_now(&mut self) {
        self.w.resched_with(Prev::Yield);
    }

    fn wake(&mut self, t: TaskId) {
        let p = self.w.p;
        p.core.wake(&p.sched, t, Some(self.w.cpu));
    }

    fn end(&mut self, failure: Option<String>) {
        self.w.failure = failure;
        self.w.resched_with(Prev::Exit);
    }

    fn now(&self) -> u64 {
        self.w.p.core.now()
    }
}
