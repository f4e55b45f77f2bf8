//! Affinity changes of queued, running, blocked and waking tasks.

use std::sync::atomic::Ordering;

use super::Scheduler;
use crate::cpumask::CpuMask;
use crate::error::Result;
use crate::task::{CpuId, TaskId};
use crate::tasks::{lock, Task, ST_QUEUED, ST_RUNNING, ST_WAKING};

impl Scheduler {
    /// Changes a task's affinity. A waiting task on a CPU it may no longer
    /// use moves at once; a running one is preempted and moves when its CPU
    /// reschedules.
    pub fn set_affinity(&self, id: TaskId, mask: &CpuMask, now: u64) -> Result<()> {
        let mask = self.check_mask(mask)?;
        let t = self.task(id)?;
        loop {
            let code = t.code();
            let cpu = t.cpu.load(Ordering::Acquire);
            let done = match code {
                ST_QUEUED => self.set_affinity_queued(t, id, cpu, mask, now),
                ST_RUNNING => self.set_affinity_running(t, id, cpu, mask),
                _ => {
                    // Blocked or waking: a waking task reaches a runqueue only
                    // after checking its mask under the affinity lock, so a
                    // mask stored while it is not queued is seen. If it got
                    // queued before we took the lock, go round again.
                    let mut a = lock(&t.affinity);
                    let c = t.code();
                    if c == ST_QUEUED || c == ST_RUNNING {
                        drop(a);
                        false
                    } else {
                        *a = mask;
                        t.nr_allowed.store(mask.count(), Ordering::Relaxed);
                        t.aff_fold
                            .store(mask.fold64(self.tasks.fold_shift), Ordering::Relaxed);
                        true
                    }
                }
            };
            if done {
                return Ok(());
            }
        }
    }

    /// Stores `mask` as `t`'s affinity (the caller holds the lock that
    /// keeps the task where it was seen).
    fn store_affinity(&self, t: &Task, mask: CpuMask) {
        let mut a = lock(&t.affinity);
        *a = mask;
        t.nr_allowed.store(mask.count(), Ordering::Relaxed);
        t.aff_fold
            .store(mask.fold64(self.tasks.fold_shift), Ordering::Relaxed);
    }

    /// `set_affinity` of a task seen queued on `cpu`; false if it moved
    /// before the lock was taken (look again).
    fn set_affinity_queued(
        &self,
        t: &Task,
        id: TaskId,
        cpu: CpuId,
        mask: CpuMask,
        now: u64,
    ) -> bool {
        // The mask changes under the runqueue lock, so that no push, pull
        // or steal (which check the mask under the locks they hold) moves
        // the task with the old one.
        let mut rq = self.lock_rq(cpu);
        if t.code() != ST_QUEUED || t.cpu.load(Ordering::Acquire) != cpu {
            return false;
        }
        self.store_affinity(t, mask);
        if t.policy().is_rt() {
            let want = mask.count() > 1;
            if t.pushable.swap(want, Ordering::Relaxed) != want {
                if want {
                    rq.rt.nr_pushable += 1;
                } else {
                    rq.rt.nr_pushable -= 1;
                }
                self.update_overload(&mut rq);
            }
        }
        if mask.contains(cpu) {
            // it stays queued here: pullers' affinity hint includes it now
            self.sync_hot(&rq);
            let push = rq.overloaded;
            drop(rq);
            if push {
                self.push_rt(cpu, now);
            }
            return true;
        }
        self.dequeue_task(&mut rq, id.0);
        t.set_state(ST_WAKING, false);
        t.acct.transition(ST_WAKING, now);
        self.gload
            .sub(t.group.load(Ordering::Relaxed), cpu, t.policy().weight());
        drop(rq);
        self.forward(id.0, &mask, None);
        true
    }

    /// `set_affinity` of a task seen running on `cpu`; false if it is no
    /// longer current there (look again).
    fn set_affinity_running(&self, t: &Task, id: TaskId, cpu: CpuId, mask: CpuMask) -> bool {
        let rq = self.lock_rq(cpu);
        if rq.curr != Some(id.0) {
            return false;
        }
        self.store_affinity(t, mask);
        if !mask.contains(cpu) {
            // Its CPU moves it on when it reschedules.
            self.cpus[cpu as usize]
                .hot
                .need_resched
                .store(true, Ordering::SeqCst);
            drop(rq);
            self.stats_of(None)
                .resched_kicks
                .fetch_add(1, Ordering::Relaxed);
            self.kicker.kick(cpu);
        }
        true
    }
}
