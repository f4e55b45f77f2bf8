//! Time: the per-CPU tick (slice expiry, idle load-balancing kicks and
//! the busy balance).

use std::sync::atomic::Ordering;

use super::Scheduler;
use crate::error::Result;
use crate::task::CpuId;

impl Scheduler {
    /// The timer tick for `cpu`. Cheap when nothing is due (a few loads of
    /// the CPU's hot line): checks the current task's slice, takes the
    /// fair wakeups left on its deferred wake list (with whatever else
    /// its wake lists hold; an RT task among them that does not preempt
    /// is pushed, as at any wakeup's enqueue), and now and
    /// then, if tasks wait here while other CPUs idle, kicks an idle CPU
    /// to take one (idle load balancing), or with
    /// `SchedConfig::busy_balance` and no idle CPU hands one to a busy CPU
    /// with at least two fewer waiting (`busy_push`).
    /// A CPU id it does not manage is an error.
    pub fn tick(&self, cpu: CpuId, now: u64) -> Result<()> {
        let cpu = self.check_cpu(cpu)?;
        self.tick_checked(cpu, now);
        Ok(())
    }

    fn tick_checked(&self, cpu: CpuId, now: u64) {
        let pc = &self.cpus[cpu as usize];
        let h = &pc.hot;
        if h.idle_set_stale.load(Ordering::Relaxed) && !h.idle_set_leave.load(Ordering::Relaxed) {
            // busy since before this tick: it leaves the idle tracker's
            // set at its next schedule, under its own lock (Linux's
            // nohz_balance_exit_idle from the tick; the tick here may run
            // on another thread, which must not wait for that lock)
            h.idle_set_leave.store(true, Ordering::Relaxed);
        }
        let due = now >= h.slice_end.load(Ordering::Relaxed);
        // fair wakeups left without a kick (lazy kicks): the tick bounds
        // how long they wait to be seen by this CPU's picks and by stealers
        let deferred = self.cfg.lazy_fair_kicks && !pc.wake.deferred.is_empty();
        if due || deferred {
            let mut rq = self.lock_rq(cpu);
            let drained = if deferred {
                self.drain_wakelist(&mut rq, now)
            } else {
                0
            };
            // an RT task taken from the lists that does not preempt what
            // runs here is pushed to a CPU running lower, as a wakeup's
            // enqueue pushes (Linux's task_woken_rt): its kick may have
            // been spent by this drain, so no schedule would push it
            let push = drained > 0 && rq.overloaded;
            let mut resched = false;
            match rq.curr {
                Some(c) if !rq.in_balance => {
                    self.update_curr(&mut rq, c, now);
                    resched = self.should_switch(&rq, c, now);
                    if due {
                        let pol = self.t(c).policy();
                        h.slice_end
                            .store(self.slice_end(&rq, pol, now), Ordering::Relaxed);
                    }
                }
                Some(_) => {}
                None => {
                    h.slice_end.store(u64::MAX, Ordering::Relaxed);
                    resched = drained > 0;
                }
            }
            drop(rq);
            pc.stats.ticks_slow.fetch_add(1, Ordering::Relaxed);
            if resched {
                self.resched_cpu(cpu, Some(cpu));
            }
            if push {
                self.push_rt(cpu, now);
            }
        }
        if h.nr_queued.load(Ordering::Relaxed) > 0 && now >= h.next_balance.load(Ordering::Relaxed)
        {
            h.next_balance
                .store(now + self.cfg.balance_interval_ns, Ordering::Relaxed);
            let mut kicked = false;
            if self.idle.any() {
                if let Some(i) = self
                    .idle
                    .find(self.map.all(), cpu, &|c| self.is_idle_now(c))
                {
                    if i != cpu {
                        self.cpus[i as usize]
                            .hot
                            .balance_hint
                            .store(cpu, Ordering::Relaxed);
                        pc.stats.balance_kicks.fetch_add(1, Ordering::Relaxed);
                        self.resched_cpu(i, Some(cpu));
                        kicked = true;
                    }
                }
            }
            // no idle CPU to take a task: a busy one with fewer may
            if !kicked && self.cfg.busy_balance {
                self.busy_push(cpu, now);
            }
        }
    }
}
