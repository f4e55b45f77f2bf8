//! vCPUs on `vcpu_sched`'s threads executor: one OS thread per vCPU, which
//! runs `KVM_RUN` only while it holds its CPU's run slot.
//!
//! The kick hook preempts a vCPU with its [`Kicker`]: `immediate_exit`
//! plus a signal, so `KVM_RUN` returns and the body reaches its
//! checkpoint. The body checks for pending scheduler work right before
//! every `KVM_RUN` (`TaskCtx::checkpoint`); a kick after that check is
//! caught by `immediate_exit`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use vcpu_sched::exec::{ExecConfig, KickHook, TaskCtx, ThreadsExecutor};
use vcpu_sched::{CpuId, SchedCounters, TaskId, TaskSpec};

use super::{
    enter, resumed, Action, ExecOptions, ExecOutcome, Resume, TaskError, VcpuSlot, VmSet,
    GATE_OPEN, GATE_WAITING,
};
use crate::vcpu::Kicker;

/// Kicks the vCPU behind a task.
struct VcpuKickHook {
    kickers: Box<[OnceLock<Kicker>]>,
}

impl KickHook for VcpuKickHook {
    fn kick(&self, task: TaskId, _cpu: CpuId) {
        if let Some(k) = self.kickers.get(task.0 as usize).and_then(|k| k.get()) {
            k.kick();
        }
    }
}

pub(crate) struct ThreadsRun {
    ex: ThreadsExecutor,
    set: Arc<VmSet>,
}

pub(crate) fn task_name(set: &VmSet, s: &VcpuSlot) -> String {
    format!("{}/vcpu{}", set.vms()[s.vm].name, s.index)
}

fn body(ctx: &TaskCtx, set: &VmSet, slot: &VcpuSlot) {
    // The start gate: wait until every vCPU thread exists. The starter
    // wakes only threads that announced they wait here, so no start wake
    // is left pending for a thread that came late (its guest's first HLT
    // would return at once), and none coalesces with a doorbell that
    // another vCPU rings right after the start.
    while !set.started() && !ctx.stopping() {
        slot.gate.store(GATE_WAITING, Ordering::SeqCst);
        if set.started() {
            // Take the announcement back; if the starter already took it,
            // its wake is coming: consume it.
            if slot.gate.swap(GATE_OPEN, Ordering::SeqCst) != GATE_WAITING {
                ctx.block();
            }
            break;
        }
        ctx.block();
    }
    let vm = set.vms()[slot.vm].clone();
    let mut st = slot.lock();
    let wake = |s: &VcpuSlot| {
        if let Some(t) = s.task.get() {
            ctx.wake(*t);
        }
    };
    while !ctx.stopping() {
        ctx.checkpoint();
        match enter(set, &vm, &mut st) {
            Action::Continue => {}
            Action::Block => {
                let t0 = set.now();
                ctx.block();
                resumed(set, slot, &mut st.m, Resume::Halt(t0));
            }
            Action::Sleep(ns) => {
                let due = set.now() + ns;
                ctx.sleep_until(ctx.now() + ns);
                // the executor's timer woke it and its thread got the run
                // slot: the whole "due -> wake" stage
                set.woken(slot);
                resumed(set, slot, &mut st.m, Resume::Timer(due));
            }
            Action::Yield => ctx.yield_now(),
            Action::Wake(k) => {
                if let Some(s) = set.doorbell(slot.vm, k, set.now()) {
                    wake(s);
                    set.woken(s);
                }
            }
            Action::Exit => break,
            Action::Fail(r) => {
                set.fail_vm(slot.vm, r, &wake);
                break;
            }
        }
    }
    set.vcpu_exited(slot, &mut st);
}

impl ThreadsRun {
    pub(crate) fn start(opts: &ExecOptions, set: &Arc<VmSet>) -> Result<Self, TaskError> {
        let max = opts.sched.max_tasks;
        if set.slots().len() > max {
            return Err(TaskError::Input(format!(
                "{} vCPUs, but the scheduler holds at most {max} tasks",
                set.slots().len()
            )));
        }
        let hook = Arc::new(VcpuKickHook {
            kickers: (0..max).map(|_| OnceLock::new()).collect(),
        });
        let cfg = ExecConfig {
            mapping: opts.mapping.clone(),
            tick: opts.tick,
            check: opts.check.clone(),
            host_rt: opts.host_rt,
            ..ExecConfig::default()
        };
        let ex = ThreadsExecutor::new(
            opts.topology.clone(),
            opts.mitigations,
            opts.sched.clone(),
            cfg,
            hook.clone(),
        )?;
        let run = Self {
            ex,
            set: set.clone(),
        };
        if let Err(e) = run.spawn_all(&hook) {
            let _ = run.shutdown(Duration::from_secs(30));
            return Err(e);
        }
        set.mark_started();
        for s in set.slots() {
            if s.gate.swap(GATE_OPEN, Ordering::SeqCst) == GATE_WAITING {
                if let Some(t) = s.task.get() {
                    let _ = run.ex.wake(*t);
                }
            }
        }
        Ok(run)
    }

    fn spawn_all(&self, hook: &VcpuKickHook) -> Result<(), TaskError> {
        let sched = self.ex.scheduler();
        for vm in self.set.vms() {
            let g = sched.create_group(&vm.name)?;
            let _ = vm.group.set(g);
        }
        for slot in self.set.slots() {
            let vm = &self.set.vms()[slot.vm];
            let mut spec = TaskSpec::new(task_name(&self.set, slot))
                .policy(slot.placement.policy)
                .group(*vm.group.get().expect("set above"));
            if let Some(m) = slot.placement.affinity {
                spec = spec.affinity(m);
            }
            let (set, s) = (self.set.clone(), slot.clone());
            // The kicker goes in before the task can run.
            let id = self.ex.spawn(&spec, move |ctx| body(ctx, &set, &s))?;
            let _ = hook.kickers[id.0 as usize].set(slot.kicker().clone());
            let _ = slot.task.set(id);
        }
        Ok(())
    }

    pub(crate) fn counters(&self) -> SchedCounters {
        self.ex.scheduler().counters()
    }

    pub(crate) fn scheduler(&self) -> &Arc<vcpu_sched::Scheduler> {
        self.ex.scheduler()
    }

    pub(crate) fn wake_slot(&self, s: &VcpuSlot) {
        if let Some(t) = s.task.get() {
            let _ = self.ex.wake(*t);
        }
    }

    pub(crate) fn shutdown(self, timeout: Duration) -> Result<ExecOutcome, TaskError> {
        self.set.request_stop();
        let rep = self.ex.shutdown(timeout)?;
        let names: HashMap<String, usize> = self
            .set
            .slots()
            .iter()
            .map(|s| (task_name(&self.set, s), s.global))
            .collect();
        let mut tasks = vec![None; self.set.slots().len()];
        for t in rep.tasks {
            if let Some(&g) = names.get(&t.name) {
                tasks[g] = Some(t);
            }
        }
        Ok(ExecOutcome {
            tasks,
            host_schedstat: Vec::new(),
            counters: rep.counters,
            sched_ns_per_cpu: rep.sched_ns_per_cpu,
            sched_calls_per_cpu: rep.sched_calls_per_cpu,
            violations: rep.violations,
            checks: rep.checks,
            pin_errors: rep.pin_errors,
        })
    }
}
