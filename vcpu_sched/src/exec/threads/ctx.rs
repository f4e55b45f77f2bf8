//! A task's thread: the loop that enters its body while the thread holds
//! a run slot, the [`Apply`] primitives (each a slot hand-over), and the
//! retirement of the task when its body ends.

use std::cell::Cell;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::handover::Shared;
use crate::exec::body::{apply, Apply, Body, Cx, TaskEnd};
use crate::exec::clock::current_tid;
use crate::exec::shared::{SchedEngine, IDLE, NONE};
use crate::exec::CPU_OK;
use crate::sched::{Pick, Prev, Scheduler};
use crate::task::{CpuId, TaskId};
use crate::tasks::lock;

/// A task thread's side of the executor. Lives on the task's thread only.
struct TaskCtx {
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    id: TaskId,
    cpu: Cell<CpuId>,
    /// Why the body ended, once it has.
    ended: Option<Option<String>>,
}

impl TaskCtx {
    fn stopping(&self) -> bool {
        self.sh.core.stopping.load(Ordering::Relaxed)
    }

    /// The task's preempt flag or its CPU's pending work.
    fn should_yield(&self) -> bool {
        self.sh.core.tasks[self.id.0 as usize]
            .preempt
            .load(Ordering::Acquire)
            || self.sched.needs_attention(self.cpu.get()).expect(CPU_OK)
    }

    /// A preemption checkpoint: if this CPU has something to look at, let
    /// the scheduler decide.
    fn checkpoint(&self) {
        if self.should_yield() {
            self.switch(Prev::Keep);
        }
    }

    /// Asks the core what runs next on this CPU and hands the slot over if
    /// it is not this task; returns once this task holds a slot again and
    /// that CPU has nothing pending.
    fn switch(&self, prev: Prev) {
        let mut prev = prev;
        loop {
            let cpu = self.cpu.get();
            self.check_holder(cpu, "switch");
            let core = &self.sh.core;
            let t0 = core.now();
            let pick = self.sched.schedule(cpu, prev, t0).expect(CPU_OK);
            let c = &core.counters[cpu as usize];
            c.sched_ns.fetch_add(core.now() - t0, Ordering::Relaxed);
            c.sched_calls.fetch_add(1, Ordering::Relaxed);
            match pick {
                Pick::Same => {
                    core.tasks[self.id.0 as usize]
                        .preempt
                        .store(false, Ordering::Relaxed);
                    return;
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
            if !self.wait_and_enter() {
                return;
            }
            prev = Prev::Keep;
        }
    }

    /// The core must agree that this task is `cpu`'s current task whenever
    /// its thread holds `cpu`'s slot.
    fn check_holder(&self, cpu: CpuId, what: &str) {
        let cur = self.sched.current(cpu).expect(CPU_OK);
        if cur != Some(self.id) {
            self.sh.core.violation(format!(
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
        let _ = self.sh.active[cpu as usize].compare_exchange(
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
        let (sh, core) = (&self.sh, &self.sh.core);
        let rt = &sh.trt[self.id.0 as usize];
        self.cpu.set(cpu);
        if let Err(other) =
            rt.running_on
                .compare_exchange(NONE, cpu, Ordering::AcqRel, Ordering::Acquire)
        {
            core.violation(format!(
                "task {} entered CPU {cpu} while running on CPU {other}",
                self.id.0
            ));
        }
        if let Err(other) = sh.active[cpu as usize].compare_exchange(
            NONE,
            self.id.0,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            core.violation(format!(
                "task {} entered CPU {cpu} while {} is inside it",
                self.id.0,
                if other == IDLE {
                    "the idle context".to_string()
                } else {
                    format!("task {other}")
                }
            ));
        }
        if core.check {
            if let Some(m) = self
                .sched
                .running_outside_affinity(cpu, self.id)
                .expect(CPU_OK)
            {
                core.violation(format!(
                    "task {} runs on CPU {cpu} outside its affinity {m}",
                    self.id.0
                ))
            }
        }
        let host = core.slots[cpu as usize].host_cpu;
        if rt.host_cpu.swap(host, Ordering::Relaxed) != host {
            core.pin_to(host);
        }
        core.tasks[self.id.0 as usize]
            .preempt
            .store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.sched.needs_attention(cpu).expect(CPU_OK)
    }

    /// Enters the body once, containing a panic as a failure of the task.
    fn enter_body(&self, body: &mut dyn Body) -> crate::exec::Action {
        let engine = SchedEngine {
            core: &self.sh.core,
            sched: &self.sched,
        };
        let cx = Cx::new(self.id, self.cpu.get(), &engine, None);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.enter(&cx))) {
            Ok(a) => a,
            Err(p) => {
                let msg = panic_message(&*p);
                self.sh
                    .core
                    .violation(format!("the body of task {} panicked: {msg}", self.id.0));
                crate::exec::Action::Fail(format!("the body panicked: {msg}"))
            }
        }
    }
}

impl Apply for TaskCtx {
    fn block(&mut self) {
        self.switch(Prev::Block);
    }

    /// Blocks until the clock reaches `due` or a wake comes first. The
    /// wake counts as returned only once its thread has the run slot again
    /// (for a timer, the whole "due -> wake" stage).
    fn sleep_until(&mut self, due: u64) {
        let core = self.sh.core.clone();
        core.arm_sleep(self.id, due);
        if core.now() < due && !self.stopping() {
            self.switch(Prev::Block);
        }
        let rt = &core.tasks[self.id.0 as usize];
        rt.sleep_due.store(0, Ordering::Release);
        // cancel the timer if it has not fired
        rt.timer_gen.fetch_add(1, Ordering::AcqRel);
        core.woken(self.id);
    }

    fn yield_now(&mut self) {
        self.switch(Prev::Yield);
    }

    fn wake(&mut self, t: TaskId) {
        self.sh.core.wake(&self.sched, t, Some(self.cpu.get()));
    }

    fn end(&mut self, failure: Option<String>) {
        self.ended = Some(failure);
    }

    fn now(&self) -> u64 {
        self.sh.core.now()
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The main of task `id`'s thread: waits for its first grant, runs the
/// body until it ends, hands the slot on and retires the task.
pub(super) fn task_main(
    sh: Arc<Shared>,
    sched: Arc<Scheduler>,
    id: TaskId,
    mut body: Box<dyn Body>,
) {
    sh.core.tasks[id.0 as usize]
        .tid
        .store(current_tid(), Ordering::Release);
    sh.core.host_rt(0);
    let mut ctx = TaskCtx {
        sh: sh.clone(),
        sched: sched.clone(),
        id,
        cpu: Cell::new(NONE),
        ended: None,
    };
    if ctx.wait_and_enter() {
        ctx.switch(Prev::Keep);
    }
    loop {
        ctx.checkpoint();
        let a = ctx.enter_body(&mut *body);
        if !apply(a, &mut ctx) {
            break;
        }
    }
    let failure = ctx.ended.take().flatten();
    let cpu = ctx.cpu.get();
    ctx.check_holder(cpu, "exit");
    let pick = sched
        .schedule(cpu, Prev::Exit, sh.core.now())
        .expect(CPU_OK);
    ctx.leave(cpu);
    match pick {
        Pick::Switch(n) => sh.grant(n.0, cpu),
        _ => sh.grant_idle(cpu),
    }
    *lock(&sh.trt[id.0 as usize].thread) = None;
    sh.core.tasks[id.0 as usize].clear();
    let stats = match sched.remove_task(id) {
        Ok(st) => Some(st),
        Err(e) => {
            sh.core.violation(format!(
                "task {} could not be removed after exit: {e}",
                id.0
            ));
            None
        }
    };
    if let Some(why) = &failure {
        let name = stats
            .as_ref()
            .map_or_else(|| id.0.to_string(), |s| s.name.clone());
        lock(&sh.failures).push(format!("{name}: {why}"));
    }
    body.finished(&TaskEnd {
        stats: stats.clone(),
        host_schedstat: None,
        failure,
    });
    if let Some(st) = stats {
        lock(&sh.finished).push((id, st));
    }
    sh.live.fetch_sub(1, Ordering::AcqRel);
}
