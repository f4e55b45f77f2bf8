//! One vCPU as a task body: an entry is one `KVM_RUN`, the exit mapped to
//! an action, and the bookkeeping around it (latencies, the wakeup
//! breakdown, a doorbell to another vCPU, the VM's failure and teardown).
//!
//! WHAT: [`VcpuBody`] implements `vcpu_sched`'s [`Body`] and
//! [`VcpuHooks`] its [`Hooks`] (preempt = the vCPU's kicker; the wake and
//! pick stamps of the breakdown).
//! WHY: this is all a KVM vCPU adds to the executors; every executor runs
//! it unchanged, so the vCPU side is written once.
//! HOW: the body remembers how it last left (a halt, a sleep) and records
//! the latency when it is entered again; a wake to vCPU `k` becomes the
//! executor's wake of `k`'s task; a failure stops its VM and wakes the
//! VM's other vCPUs so that they see it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use vcpu_sched::exec::{Body, Cx, Hooks, TaskEnd};

use super::set::{enter, VcpuMetrics, VcpuSlot, VmEntry, VmSet};
use super::stages::io_stages;
use super::Action;

/// The executor's action vocabulary with task ids and messages.
type ExecAction = vcpu_sched::exec::Action;

/// A vCPU's body.
pub(crate) struct VcpuBody {
    set: Arc<VmSet>,
    slot: Arc<VcpuSlot>,
    vm: Arc<VmEntry>,
    /// How it last left the guest for the scheduler, to record when it
    /// runs again.
    pending: Option<Resume>,
}

impl VcpuBody {
    pub(crate) fn new(set: &Arc<VmSet>, slot: &Arc<VcpuSlot>) -> Self {
        Self {
            set: set.clone(),
            slot: slot.clone(),
            vm: set.vms()[slot.vm].clone(),
            pending: None,
        }
    }
}

impl Body for VcpuBody {
    fn enter(&mut self, cx: &Cx<'_>) -> ExecAction {
        let (set, slot) = (&*self.set, &*self.slot);
        let Some(mut st) = slot.try_lock() else {
            return ExecAction::Fail(format!(
                "vCPU {} of VM {} is being run elsewhere",
                slot.index, self.vm.name
            ));
        };
        let stopping = cx.stopping() || set.stopping() || self.vm.control.is_stopping();
        if let Some(r) = self.pending.take() {
            // A guest's own sleep lasts its time: an early wake (kept for
            // its next HLT by the scheduler) sends it back to sleep.
            if let Resume::Timer(due) = r {
                let now = set.now();
                if now < due && !stopping && !self.vm.paused() && !self.vm.mapper.wake_ends_sleep()
                {
                    self.pending = Some(r);
                    return ExecAction::Sleep(due - now);
                }
            }
            resumed(set, slot, &mut st.m, r);
        }
        if let Some(bp) = cx.block_path() {
            match bp.schedule {
                Some((called, picked)) => set.switched_in(&mut st.m, bp.exit, called, picked),
                None => set.host_switched_in(&mut st.m, bp.exit),
            }
        }
        if stopping {
            set.vcpu_exited(slot, &mut st);
            return ExecAction::Exit;
        }
        let a: Action = enter(set, &self.vm, &mut st, cx.cpu() as usize);
        cx.stamp_exit(st.exit_at);
        match a {
            Action::Block => self.pending = Some(Resume::Halt(set.now())),
            Action::Sleep(ns) => self.pending = Some(Resume::Timer(set.now() + ns)),
            Action::Exit => set.vcpu_exited(slot, &mut st),
            Action::Fail(ref r) => {
                set.fail_vm(slot.vm, r.clone(), &|s: &VcpuSlot| {
                    if let Some(t) = s.task.get() {
                        cx.wake(*t);
                    }
                });
                set.vcpu_exited(slot, &mut st);
            }
            _ => {}
        }
        a.map(
            |k| {
                let s = set.doorbell(slot.vm, k, set.now())?;
                s.task.get().copied()
            },
            |r| r.to_string().lines().next().unwrap_or_default().to_string(),
        )
    }

    fn finished(&mut self, end: &TaskEnd) {
        let set = &self.set;
        set.keep_finished(self.slot.global, end.stats.clone(), end.host_schedstat);
        set.live_bodies.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the executor calls on a vCPU from other threads.
pub(crate) struct VcpuHooks {
    set: Arc<VmSet>,
    slot: Arc<VcpuSlot>,
}

impl VcpuHooks {
    pub(crate) fn new(set: &Arc<VmSet>, slot: &Arc<VcpuSlot>) -> Self {
        Self {
            set: set.clone(),
            slot: slot.clone(),
        }
    }
}

impl Hooks for VcpuHooks {
    fn preempt(&self) {
        self.slot.kicker().kick();
    }
    fn woken(&self) {
        self.set.woken(&self.slot);
    }
    fn picked(&self) {
        self.set.picked(&self.slot);
    }
}

/// How a blocked vCPU came back, for the latency it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resume {
    /// From a HLT that started at this time.
    Halt(u64),
    /// From a sleep due at this time.
    Timer(u64),
}

/// Records the latency of a vCPU that runs again after `how` (called
/// right before its `KVM_RUN`), and with the breakdown on, its stages.
pub(crate) fn resumed(set: &VmSet, slot: &VcpuSlot, m: &mut VcpuMetrics, how: Resume) {
    let now = set.now();
    // breakdown off: no read-modify-write on the slot's line
    let (woken, picked, io) = if set.breakdown_on() {
        (
            slot.woken_at.swap(0, Ordering::AcqRel),
            slot.picked_at.swap(0, Ordering::AcqRel),
            slot.take_io_stamps(),
        )
    } else {
        (0, 0, None)
    };
    let inside = set.window.inside(now);
    let (from, base) = match how {
        Resume::Halt(blocked_at) => {
            let d = slot.doorbell_at.swap(0, Ordering::AcqRel);
            if d != 0 && inside {
                m.doorbell_latency
                    .record(now.saturating_sub(d.max(blocked_at)));
            }
            // a wake that came before the vCPU blocked is no wakeup of
            // a blocked vCPU: no stages
            if woken < blocked_at {
                return;
            }
            // an interrupt woke it; one raised before the block (just
            // before the HLT's exit, its wake racing it) is no clean
            // sample of either path: no stages
            if let Some((dev, irq)) = io {
                if irq >= blocked_at && inside {
                    io_stages(&mut m.stages, (dev, irq, woken, picked), now);
                }
                return;
            }
            (d.max(blocked_at), 0)
        }
        Resume::Timer(due) => {
            if inside {
                m.timer_latency.record(now.saturating_sub(due));
            }
            (due, 3)
        }
    };
    if woken != 0 && from != 0 && inside {
        let st = &mut m.stages.0;
        st[base].record(woken.saturating_sub(from));
        if picked >= woken {
            st[base + 1].record(picked - woken);
            st[base + 2].record(now.saturating_sub(picked));
        } else {
            // no pick stamp (threads, host): wake to KVM_RUN in one
            st[base + 1].record(now.saturating_sub(woken));
        }
    }
}
