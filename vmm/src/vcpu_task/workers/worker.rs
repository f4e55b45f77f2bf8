//! A worker thread: the loop that schedules its CPU, parks it while idle
//! and runs the picked vCPU's `KVM_RUN` itself (see the module above for
//! the protocol with kickers).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use vcpu_sched::exec::{current_tid, pin_current_thread, CPU_OK};
use vcpu_sched::{CpuId, Pick, Prev, Scheduler, TaskId};

use super::super::{enter, resumed, Action, Resume, VcpuSlot, VcpuState, VmSet};
use super::{host_rt, Shared, TaskRt, WorkerCpu, WorkerStats, IDLE};

/// The body of CPU `cpu`'s worker thread.
pub(super) fn worker_main(sh: Arc<Shared>, sched: Arc<Scheduler>, cpu: CpuId) {
    enter_worker_thread(&sh, cpu);
    Worker {
        sh: &sh,
        sched: &sched,
        cpu,
        w: &sh.cpus[cpu as usize],
        stats: &sh.stats[cpu as usize],
        cur: None,
        prev: Prev::Keep,
        resched: true,
        local: BinaryHeap::new(),
        blocked_exit: 0,
        switch: None,
    }
    .run();
}

/// Makes the calling thread CPU `cpu`'s worker: records its thread id,
/// gives it host RT if asked and pins it to its host CPU.
fn enter_worker_thread(sh: &Shared, cpu: CpuId) {
    let w = &sh.cpus[cpu as usize];
    w.tid.store(current_tid(), Ordering::Release);
    host_rt(sh, 0);
    // its timed parks fire vCPUs' sleep timers: no 50 us timer slack
    let _ = vcpu_sched::os_thread::set_timer_slack(1);
    if sh.pin && pin_current_thread(w.host_cpu).is_err() {
        sh.pin_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// One worker's loop state.
struct Worker<'a> {
    sh: &'a Shared,
    sched: &'a Scheduler,
    cpu: CpuId,
    w: &'a WorkerCpu,
    stats: &'a WorkerStats,
    /// The task whose vCPU it runs (`None`: idle).
    cur: Option<TaskId>,
    /// What happens to `cur` at the next `schedule`.
    prev: Prev,
    /// Whether to call `schedule` before anything else.
    resched: bool,
    /// Sleep timers armed by vCPUs that ran here: (due, task, generation).
    /// The worker fires them itself, from a timed park or between two
    /// `KVM_RUN`s, so a timer wakeup is one host wakeup (this thread's)
    /// instead of two (the clock thread's, then its kick to this worker).
    /// The clock thread keeps every timer too, as a backstop for a worker
    /// that is busy; whichever fires first takes the generation.
    local: BinaryHeap<Reverse<(u64, u32, u64)>>,
    /// Breakdown, block path: when the `KVM_RUN` of the vCPU that blocks at
    /// the next `schedule` returned (0: none).
    blocked_exit: u64,
    /// Breakdown, block path: a block whose next pick is another vCPU that
    /// has not entered `KVM_RUN` yet: (exit, `schedule` called, returned).
    switch: Option<(u64, u64, u64)>,
}

impl Worker<'_> {
    /// The worker's loop: schedule when needed, park while idle, otherwise
    /// run the current vCPU; returns when the executor quits.
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
        self.sched.needs_attention(self.cpu).expect(CPU_OK)
    }

    /// Asks `resched` at the next round, telling the core `prev`.
    fn resched_with(&mut self, prev: Prev) {
        self.prev = prev;
        self.resched = true;
    }

    /// Calls `schedule`, retires a task that exited and publishes what was
    /// picked; false when the CPU needs attention again already.
    fn reschedule(&mut self) -> bool {
        let (sh, cpu) = (self.sh, self.cpu);
        let t0 = sh.now();
        let exiting = self.prev == Prev::Exit;
        let pick = self.sched.schedule(cpu, self.prev, t0).expect(CPU_OK);
        let t1 = sh.now();
        self.stats
            .sched_ns
            .fetch_add(t1.saturating_sub(t0), Ordering::Relaxed);
        // block path: a block followed by a switch waits for the next
        // KVM_RUN; idling ends it uncounted; a keep (the CPU schedules
        // again before running) leaves a pending one as it is
        let blocked = std::mem::take(&mut self.blocked_exit);
        match pick {
            Pick::Switch(_) if blocked != 0 => self.switch = Some((blocked, t0, t1)),
            Pick::Idle => self.switch = None,
            _ if blocked != 0 => self.switch = None,
            _ => {}
        }
        self.stats.sched_calls.fetch_add(1, Ordering::Relaxed);
        if exiting {
            if let Some(t) = self.cur.take() {
                finish_task(sh, self.sched, t);
            }
        }
        self.cur = match pick {
            Pick::Same => {
                if exiting {
                    sh.violation(format!("CPU {cpu}: schedule kept an exiting task"));
                }
                self.cur
            }
            Pick::Switch(n) => Some(n),
            Pick::Idle => None,
        };
        if let (Pick::Switch(t), true) = (pick, sh.breakdown.load(Ordering::Relaxed)) {
            if let Some(rt) = sh.rt(t) {
                if let Some(b) = rt.bound().as_ref() {
                    b.set.picked(&b.set.slots()[b.global]);
                }
            }
        }
        self.prev = Prev::Keep;
        self.resched = false;
        self.w
            .current
            .store(self.cur.map_or(IDLE, |t| t.0), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.needs_attention() {
            self.resched = true;
            return false;
        }
        true
    }

    /// Parks the idle worker until a kick's token; false when the executor
    /// quits.
    /// Fires the local timers that are due: claims each one's generation
    /// (the clock thread may have fired it already) and wakes its task
    /// from this CPU.
    fn fire_local(&mut self) {
        let now = self.sh.now();
        while let Some(&Reverse((due, t, gen))) = self.local.peek() {
            if due > now {
                break;
            }
            self.local.pop();
            if let Some(rt) = self.sh.rt(TaskId(t)) {
                if rt
                    .timer_gen
                    .compare_exchange(gen, gen + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    let _ = self.sched.wake(TaskId(t), Some(self.cpu), now);
                    if self.sh.breakdown.load(Ordering::Relaxed) {
                        if let Some(b) = rt.bound().as_ref() {
                            b.set.woken(&b.set.slots()[b.global]);
                        }
                    }
                }
            }
        }
    }

    fn park(&mut self) -> bool {
        let (w, sh) = (self.w, self.sh);
        // `parked` is cleared before the token is taken, so the checker
        // never sees this worker parked without a token once a kick has
        // landed. The token is taken with a swap (acquire): what the kick
        // it takes published before it (need_resched, the wake list) is
        // visible to the schedule() that follows; a token set after the
        // swap stays for the next round.
        let next_due = |l: &BinaryHeap<Reverse<(u64, u32, u64)>>| l.peek().map(|r| r.0 .0);
        // Poll a while first (see `idle_spin`): a kick that comes soon is
        // taken without a futex round trip.
        if sh.idle_spin_ns > 0 {
            let until = (sh.now() + sh.idle_spin_ns).min(next_due(&self.local).unwrap_or(u64::MAX));
            while !w.token.load(Ordering::Acquire)
                && !sh.quit.load(Ordering::Relaxed)
                && sh.now() < until
            {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            }
        }
        w.parked.store(true, Ordering::SeqCst);
        while !w.token.load(Ordering::SeqCst) {
            if sh.quit.load(Ordering::Acquire) {
                w.parked.store(false, Ordering::SeqCst);
                return false;
            }
            let now = sh.now();
            match next_due(&self.local) {
                // a local timer is due: fire it below (its wake kicks this
                // CPU, whose token the next round takes)
                Some(d) if d <= now => break,
                Some(d) => std::thread::park_timeout(std::time::Duration::from_nanos(d - now)),
                None => std::thread::park(),
            }
        }
        w.parked.store(false, Ordering::SeqCst);
        w.token.swap(false, Ordering::AcqRel);
        if !self.local.is_empty() {
            self.fire_local();
        }
        !sh.quit.load(Ordering::Acquire)
    }

    /// Runs task `t`'s vCPU once, unless it goes back to sleep or the CPU
    /// needs attention first, and acts on why it came back.
    fn run_task(&mut self, t: TaskId) {
        let (sh, cpu) = (self.sh, self.cpu);
        // Held while the vCPU runs: its binding cannot change before this
        // worker itself removes the task (see finish_task).
        let bound = sh.rt(t).map(|rt| (rt, rt.bound()));
        let Some((rt, Some(b))) = bound.as_ref().map(|(rt, g)| (*rt, g.as_ref())) else {
            sh.violation(format!("CPU {cpu} picked task {} that is no vCPU", t.0));
            self.resched_with(Prev::Exit);
            return;
        };
        let set: &VmSet = &b.set;
        let slot = &set.slots()[b.global];
        let vm = &set.vms()[slot.vm];
        let stopping = set.stopping() || vm.control.is_stopping();
        // A sleeper picked early (another wake) goes back to sleep.
        let due = rt.sleep_due.load(Ordering::Acquire);
        if due != 0 && !stopping && sh.now() < due {
            self.resched_with(Prev::Block);
            return;
        }
        let Some(mut st) = slot.try_lock() else {
            sh.violation(format!(
                "CPU {cpu}: vCPU {} is being run elsewhere",
                super::super::threads::task_name(set, slot)
            ));
            self.resched_with(Prev::Keep);
            std::thread::yield_now();
            return;
        };
        if sh.check {
            self.check_current(t);
        }
        // The check right before KVM_RUN (a later kick finds immediate_exit).
        if self.needs_attention() {
            self.resched = true;
            return;
        }
        deliver_resumes(set, slot, rt, due, &mut st);
        if let Some((exit, called, picked)) = self.switch.take() {
            set.switched_in(&mut st.m, exit, called, picked);
        }
        let action = enter(set, vm, &mut st);
        self.act(action, t, rt, set, slot, &mut st);
    }

    /// The checker's checks on a task about to run here: the core has it
    /// current on this CPU, and this CPU is inside its affinity.
    fn check_current(&self, t: TaskId) {
        let (sh, sched, cpu) = (self.sh, self.sched, self.cpu);
        if sched.current(cpu).expect(CPU_OK) != Some(t) {
            sh.violation(format!(
                "CPU {cpu} runs task {} but the core has {:?} current",
                t.0,
                sched.current(cpu).expect(CPU_OK)
            ));
        }
        // decided under the runqueue lock (see running_outside_affinity)
        if let Some(m) = sched.running_outside_affinity(cpu, t).expect(CPU_OK) {
            sh.violation(format!(
                "task {} runs on CPU {cpu} outside its affinity {m}",
                t.0
            ));
        }
    }

    /// Acts on why task `t`'s vCPU came back from `enter`: what the core
    /// hears at the next `schedule`, a sleep's timer, a doorbell's wake, an
    /// exit.
    fn act(
        &mut self,
        action: Action,
        t: TaskId,
        rt: &TaskRt,
        set: &VmSet,
        slot: &VcpuSlot,
        st: &mut VcpuState,
    ) {
        let (sh, sched, cpu) = (self.sh, self.sched, self.cpu);
        match action {
            Action::Continue => {}
            Action::Block => {
                rt.halt_at.store(set.now(), Ordering::Release);
                self.blocked_exit = if set.breakdown_on() { st.exit_at } else { 0 };
                self.resched_with(Prev::Block);
            }
            Action::Sleep(ns) => {
                self.blocked_exit = if set.breakdown_on() { st.exit_at } else { 0 };
                let now = set.now();
                let at = now + ns;
                rt.sleep_due.store(at, Ordering::Release);
                let gen = rt.timer_gen.fetch_add(1, Ordering::AcqRel) + 1;
                sh.timers.add(at, t.0 as usize, gen);
                self.local.push(Reverse((at, t.0, gen)));
                self.resched_with(Prev::Block);
            }
            Action::Yield => self.resched_with(Prev::Yield),
            Action::Wake(k) => {
                if let Some(s) = set.doorbell(slot.vm, k, set.now()) {
                    if let Some(&tk) = s.task.get() {
                        let _ = sched.wake(tk, Some(cpu), set.now());
                        set.woken(s);
                    }
                }
            }
            Action::Exit => {
                set.vcpu_exited(slot, st);
                self.resched_with(Prev::Exit);
            }
            Action::Fail(r) => {
                set.fail_vm(slot.vm, r, &|s: &VcpuSlot| {
                    if let Some(&tk) = s.task.get() {
                        let _ = sched.wake(tk, Some(cpu), set.now());
                    }
                });
                set.vcpu_exited(slot, st);
                self.resched_with(Prev::Exit);
            }
        }
    }
}

/// Tells vCPU `slot`'s metrics that it resumes from a sleep that was due
/// at `due` (0: none) and from a halt, if it was halted.
fn deliver_resumes(set: &VmSet, slot: &VcpuSlot, rt: &TaskRt, due: u64, st: &mut VcpuState) {
    if due != 0 {
        rt.sleep_due.store(0, Ordering::Release);
        rt.timer_gen.fetch_add(1, Ordering::AcqRel);
        resumed(set, slot, &mut st.m, Resume::Timer(due));
    }
    let h = rt.halt_at.swap(0, Ordering::AcqRel);
    if h != 0 {
        resumed(set, slot, &mut st.m, Resume::Halt(h));
    }
}

/// Removes exited task `t` from the core and hands its statistics to its
/// set. The binding is cleared before the core frees the id, so an
/// `attach` that gets the id next finds it unbound; the set learns last
/// (its task count), so a `detach` waiting for it sees the task gone.
fn finish_task(sh: &Shared, sched: &Scheduler, t: TaskId) {
    let Some(rt) = sh.rt(t) else {
        sh.violation(format!("task {} is beyond the executor's table", t.0));
        return;
    };
    rt.timer_gen.fetch_add(1, Ordering::AcqRel);
    let b = rt.bind(None);
    match sched.remove_task(t) {
        Ok(st) => {
            if let Some(b) = &b {
                b.set.keep_finished(b.global, st);
            }
        }
        Err(e) => sh.violation(format!("task {} could not be removed after exit: {e}", t.0)),
    }
    match b {
        Some(b) => {
            b.set.sched_tasks.fetch_sub(1, Ordering::AcqRel);
        }
        None => sh.violation(format!("exited task {} had no vCPU", t.0)),
    }
}
