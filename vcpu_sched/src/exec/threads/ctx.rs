//! A task's side of the executor: [`TaskCtx`], which the body calls to
//! block, yield, wake and sleep, the slot hand-over it performs, and the
//! thread main that runs a body and retires the task.

use std::cell::Cell;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::shared::Shared;
use super::{IDLE, NONE};
use crate::cpumask::CpuMask;
use crate::error::Result;
use crate::exec::clock::current_tid;
use crate::exec::CPU_OK;
use crate::sched::{Pick, Prev, Scheduler};
use crate::task::{CpuId, TaskId};
use crate::tasks::lock;

/// What a task body gets: its identity, its CPU, and the calls into the
/// executor. Lives on the task's thread only.
pub struct TaskCtx {
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    id: TaskId,
    cpu: Cell<CpuId>,
}

impl TaskCtx {
    /// This task.
    pub fn id(&self) -> TaskId {
        self.id
    }
    /// The CPU whose slot this task holds.
    pub fn cpu(&self) -> CpuId {
        self.cpu.get()
    }
    /// The executor's clock, ns since it started.
    pub fn now(&self) -> u64 {
        self.sh.now()
    }
    /// The scheduler core.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.sched
    }
    /// Is the executor shutting down? Bodies should return soon.
    pub fn stopping(&self) -> bool {
        self.sh.stopping.load(Ordering::Relaxed)
    }

    /// Should the body get to a checkpoint? Cheap: the task's preempt flag,
    /// its CPU's need_resched and wake list head.
    #[inline]
    pub fn should_yield(&self) -> bool {
        self.sh.trt[self.id.0 as usize]
            .preempt
            .load(Ordering::Acquire)
            || self.sched.needs_attention(self.cpu.get()).expect(CPU_OK)
    }

    /// A preemption checkpoint: if this CPU has something to look at, let
    /// the scheduler decide; returns true if this task was switched out
    /// (and has now been switched back in, perhaps on another CPU).
    #[inline]
    pub fn checkpoint(&self) -> bool {
        if !self.should_yield() {
            return false;
        }
        self.switch(Prev::Keep)
    }

    /// Waits until woken. Returns at once if a wake arrived since the task
    /// last blocked (wakes are remembered, one deep, like `unpark`).
    pub fn block(&self) {
        self.switch(Prev::Block);
    }

    /// Lets equal-priority tasks run first.
    pub fn yield_now(&self) {
        self.switch(Prev::Yield);
    }

    /// Wakes `t` from this CPU. Returns true if it was blocked.
    pub fn wake(&self, t: TaskId) -> bool {
        self.sched
            .wake(t, Some(self.cpu.get()), self.sh.now())
            .unwrap_or(false)
    }

    /// Changes a task's affinity.
    pub fn set_affinity(&self, t: TaskId, mask: &CpuMask) -> Result<()> {
        self.sched.set_affinity(t, mask, self.sh.now())
    }

    /// Blocks until the clock reaches `deadline` (ns on [`now`](Self::now)'s
    /// clock). Other wakes in between are absorbed.
    pub fn sleep_until(&self, deadline: u64) {
        let rt = &self.sh.trt[self.id.0 as usize];
        let gen = rt.timer_gen.fetch_add(1, Ordering::Relaxed) + 1;
        self.sh.timers.add(deadline, self.id.0 as usize, gen);
        while self.sh.now() < deadline && !self.stopping() {
            self.block();
        }
        // cancel the timer if it has not fired
        rt.timer_gen.fetch_add(1, Ordering::Relaxed);
    }

    /// Busy work for `ns` nanoseconds of this thread's wall time, with a
    /// checkpoint every few microseconds (synthetic compute).
    pub fn compute_for(&self, ns: u64) {
        let end = self.sh.now() + ns;
        while self.sh.now() < end {
            for i in 0..200u32 {
                std::hint::black_box(i.wrapping_mul(2_654_435_761));
            }
            self.checkpoint();
        }
    }

    /// Asks the core what runs next on this CPU and hands the slot over if
    /// it is not this task; returns once this task holds a slot again and
    /// that CPU has nothing pending. True if the task was switched out.
    fn switch(&self, prev: Prev) -> bool {
        let mut prev = prev;
        let mut switched = false;
        loop {
            let cpu = self.cpu.get();
            self.check_holder(cpu, "switch");
            let t0 = self.sh.now();
            let pick = self.sched.schedule(cpu, prev, t0).expect(CPU_OK);
            let ce = &self.sh.cpu_exec[cpu as usize];
            ce.sched_ns.fetch_add(self.sh.now() - t0, Ordering::Relaxed);
            ce.sched_calls.fetch_add(1, Ordering::Relaxed);
            match pick {
                Pick::Same => {
                    self.sh.trt[self.id.0 as usize]
                        .preempt
                        .store(false, Ordering::Relaxed);
                    return switched;
                }
                Pick::Switch(n) => {
                    self.leave(cpu);
                    self.sh.grant(n.0, cpu);
                }
                Pick::Idle => {
                    self.leave(cpu);
                    self.sh.grant_idle(cpu);
                }
            }
            switched = true;
            if !self.wait_and_enter() {
                return true;
            }
            prev = Prev::Keep;
        }
    }

    /// The core must agree that this task is `cpu`'s current task whenever
    /// its thread holds `cpu`'s slot.
    fn check_holder(&self, cpu: CpuId, what: &str) {
        let cur = self.sched.current(cpu).expect(CPU_OK);
        if cur != Some(self.id) {
            self.sh.violation(format!(
                "task {} holds CPU {cpu}'s slot ({what}) but the core runs {:?} there; the core has it {:?} on CPU {:?}",
                self.id.0,
                cur,
                self.sched.task_state(self.id),
                self.sched.task_cpu(self.id)
            ));
        }
    }

    fn leave(&self, cpu: CpuId) {
        let rt = &self.sh.trt[self.id.0 as usize];
        rt.running_on.store(NONE, Ordering::Release);
        let _ = self.sh.slots[cpu as usize].active.compare_exchange(
            self.id.0,
            NONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Parks until granted a slot, then takes it over. Returns true if the
    /// CPU already has something to look at (a kick that went to the
    /// previous owner): the caller must schedule again before resuming.
    fn wait_and_enter(&self) -> bool {
        let rt = &self.sh.trt[self.id.0 as usize];
        let cpu = loop {
            let g = rt.grant.swap(NONE, Ordering::Acquire);
            if g != NONE {
                break g;
            }
            std::thread::park();
        };
        self.enter(cpu)
    }

    fn enter(&self, cpu: CpuId) -> bool {
        let sh = &self.sh;
        let rt = &sh.trt[self.id.0 as usize];
        self.cpu.set(cpu);
        if let Err(other) =
            rt.running_on
                .compare_exchange(NONE, cpu, Ordering::AcqRel, Ordering::Acquire)
        {
            sh.violation(format!(
                "task {} entered CPU {cpu} while running on CPU {other}",
                self.id.0
            ));
        }
        let slot = &sh.slots[cpu as usize];
        if let Err(other) =
            slot.active
                .compare_exchange(NONE, self.id.0, Ordering::AcqRel, Ordering::Acquire)
        {
            sh.violation(format!(
                "task {} entered CPU {cpu} while {} is inside it",
                self.id.0,
                if other == IDLE {
                    "the idle context".to_string()
                } else {
                    format!("task {other}")
                }
            ));
        }
        if sh.check {
            if let Some(m) = self
                .sched
                .running_outside_affinity(cpu, self.id)
                .expect(CPU_OK)
            {
                sh.violation(format!(
                    "task {} runs on CPU {cpu} outside its affinity {m}",
                    self.id.0
                ))
            }
        }
        let host = slot.host_cpu;
        if rt.host_cpu.swap(host, Ordering::Relaxed) != host {
            sh.pin_to(host);
        }
        rt.preempt.store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.sched.needs_attention(cpu).expect(CPU_OK)
    }
}

pub(super) fn task_main<F>(sh: Arc<Shared>, sched: Arc<Scheduler>, id: TaskId, body: F)
where
    F: FnOnce(&TaskCtx),
{
    sh.trt[id.0 as usize]
        .tid
        .store(current_tid(), Ordering::Release);
    sh.host_rt(0);
    let ctx = TaskCtx {
        sh: sh.clone(),
        sched: sched.clone(),
        id,
        cpu: Cell::new(NONE),
    };
    if ctx.wait_and_enter() {
        ctx.switch(Prev::Keep);
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&ctx)));
    let cpu = ctx.cpu.get();
    ctx.check_holder(cpu, "exit");
    let t0 = sh.now();
    let pick = sched.schedule(cpu, Prev::Exit, t0).expect(CPU_OK);
    ctx.leave(cpu);
    match pick {
        Pick::Switch(n) => sh.grant(n.0, cpu),
        _ => sh.grant_idle(cpu),
    }
    *lock(&sh.trt[id.0 as usize].thread) = None;
    match sched.remove_task(id) {
        Ok(st) => lock(&sh.finished).push((id, st)),
        Err(e) => sh.violation(format!(
            "task {} could not be removed after exit: {e}",
            id.0
        )),
    }
    sh.live.fetch_sub(1, Ordering::AcqRel);
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}
