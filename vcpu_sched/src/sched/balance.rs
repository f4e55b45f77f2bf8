//! Balancing: RT push and pull between CPUs (guided by cpupri and RT
//! overload tracking), the new-idle balance (RT pull, the LLC's shared
//! runqueue, stealing a waiting fair task), the busy balance (a busy CPU
//! hands a waiting fair task to a less loaded busy one; off by default),
//! and the migration they share.

use std::sync::atomic::Ordering;

use super::Scheduler;
use crate::cpumask::CpuMask;
use crate::rq::{Rq, NO_TASK};
use crate::sync::shared::{AtomicBool, MutexGuard};
use crate::task::{CpuId, PRI_FAIR};
use crate::tasks::ST_QUEUED;

impl Scheduler {
    /// Moves queued task `id` from `src` to `dst` (both locked).
    pub(super) fn migrate_queued(&self, src: &mut Rq, dst: &mut Rq, id: u32, now: u64, by: CpuId) {
        let t = self.t(id);
        self.dequeue_task(src, id);
        let st = &self.cpus[by as usize].stats;
        if self.gload.migrate(
            t.group.load(Ordering::Relaxed),
            src.cpu,
            dst.cpu,
            t.policy().weight(),
        ) {
            st.group_load_writes.fetch_add(1, Ordering::Relaxed);
        } else {
            st.group_load_skips.fetch_add(1, Ordering::Relaxed);
        }
        self.enqueue_task(dst, id, now, false, false);
        t.acct.migrations.fetch_add(1, Ordering::Relaxed);
        self.count_migration(by, src.cpu, dst.cpu);
    }

    /// Pushes waiting RT tasks of `cpu` to CPUs running lower priorities.
    pub(crate) fn push_rt(&self, cpu: CpuId, now: u64) {
        // CPUs that turned out busier than cpupri said (busier for every
        // less urgent task too), and tasks that have nowhere to go, for the
        // rest of this call.
        let mut tried = CpuMask::single(cpu);
        let mut stuck: Vec<u32> = Vec::new();
        let mut told = false;
        for _ in 0..32 {
            let rq = self.lock_rq(cpu);
            if !rq.overloaded {
                return;
            }
            // The queue's head preempts what runs here: this CPU runs it
            // next (tell it once), and it stays. The tasks behind it wait
            // here whatever runs now, so they are pushed like any other;
            // otherwise a burst of wakeups onto a CPU slow to answer its
            // kick would all wait for it while other CPUs idle.
            let head = rq.rt.iter_by_prio().next();
            if let Some((h, hp)) = head {
                if hp as u32 + PRI_FAIR > rq.curr_pri && !stuck.contains(&h) {
                    stuck.push(h);
                    if !told && !rq.in_balance {
                        told = true;
                        drop(rq);
                        self.resched_cpu(cpu, Some(cpu));
                    }
                    continue;
                }
            }
            let Some((id, prio)) = rq
                .rt
                .iter_by_prio()
                .find(|&(i, _)| self.t(i).pushable.load(Ordering::Relaxed) && !stuck.contains(&i))
            else {
                return;
            };
            let tpri = prio as u32 + PRI_FAIR;
            drop(rq);
            let aff = self.t(id).affinity().and_not(&tried);
            let target = self
                .cpupri
                .find(tpri, &aff, self.map.node_of(cpu))
                .and_then(|m| self.rt_target(&m, cpu));
            let Some(target) = target else {
                stuck.push(id);
                continue;
            };
            let (mut a, mut b) = self.lock2(cpu, target);
            let t = self.t(id);
            if t.code() != ST_QUEUED || t.cpu.load(Ordering::Acquire) != cpu {
                continue;
            }
            let b_best =
                b.rt.highest()
                    .map(|p| p as u32 + PRI_FAIR)
                    .unwrap_or(0)
                    .max(b.curr_pri);
            if b_best >= tpri || !t.allowed(target) {
                tried.set(target);
                continue;
            }
            self.migrate_queued(&mut a, &mut b, id, now, cpu);
            let resched = !b.in_balance;
            drop(a);
            drop(b);
            self.cpus[cpu as usize]
                .stats
                .rt_pushes
                .fetch_add(1, Ordering::Relaxed);
            if resched {
                self.resched_cpu(target, Some(cpu));
            }
        }
    }

    /// The most urgent priority index `rq` runs or has waiting (an RT
    /// task below it gains nothing by moving there).
    fn rt_level(&self, rq: &Rq) -> u32 {
        let mut mine = rq.rt.highest().map_or(0, |p| p as u32 + PRI_FAIR);
        if let Some(c) = rq.curr {
            mine = mine.max(self.t(c).policy().pri_idx());
        }
        mine
    }

    /// Pulls waiting RT tasks from overloaded CPUs that are more urgent than
    /// anything queued on `cpu`. Returns whether it pulled any.
    pub(crate) fn pull_rt(&self, cpu: CpuId, now: u64) -> bool {
        if !self.rto.overloaded() {
            return false;
        }
        let mut pulled = false;
        // What this CPU has (runs or has waiting), read once under its own
        // lock: a source whose best waiting task (its hot line's
        // `rt_queued_pri`) is no more urgent is skipped without taking its
        // lock, and so is one that runs that task next itself (Linux's
        // pull_rt_task makes the same lockless check against
        // `highest_prio.next`). Without it every CPU that schedules locks
        // every overloaded CPU in turn: with hundreds of CPUs that is a
        // convoy on the same few runqueue locks (the 1,000-vCPU soak found
        // 397 of 480 workers waiting in here). The check is a hint; the
        // locked one below decides.
        let mut mine_hint = self.rt_level(&self.lock_rq(cpu));
        let mut passed_by = None;
        // sources passed by because another thread held their lock
        let mut busy = CpuMask::empty();
        // Each puller starts its scan of a node's overloaded CPUs at its
        // own number: the idle CPUs that pull at once then spread over the
        // sources instead of queueing on the first one's lock.
        let cands = self.rto.candidates(self.map.node_of(cpu));
        let fold_bit = CpuMask::fold_bit(cpu, self.tasks.fold_shift);
        for src in cands.iter_from(cpu) {
            if src == cpu {
                continue;
            }
            let h = &self.cpus[src as usize].hot;
            let best = h.rt_queued_pri.load(Ordering::Relaxed);
            // None of its waiting tasks may run here (their folded masks
            // miss this CPU's bit): pinned tasks elsewhere, such as other
            // VMs' RT vCPUs. Without this check every CPU lowering its
            // priority locked every overloaded CPU of the node and found
            // nothing: on gnr-2s transcode (60 VMs of 8 pinned FIFO vCPUs)
            // 120,082 futile double locks in 20 ms, every one of them, and
            // the baseline spent all its CPU time in the scheduler. Linux
            // avoids that herd differently (RT_PUSH_IPI: the overloaded CPU
            // is asked to push); the fold is cheaper to check. Above 64 CPUs
            // a bit stands for a group of neighbouring CPUs
            // ([`CpuMask::fold64`]); folded by `cpu % 64` instead, one
            // source in nine still passed the check on gnr-2s and was
            // locked for nothing, a million times per 20 ms at 20 us frames.
            if h.rt_queued_fold.load(Ordering::Relaxed) & fold_bit == 0 {
                continue;
            }
            if best <= mine_hint.max(PRI_FAIR)
                || (best > h.curr_pri.load(Ordering::Relaxed)
                    && h.curr.load(Ordering::Relaxed) != NO_TASK)
            {
                continue;
            }
            // One puller per source: another CPU already pulling from it
            // takes its best task, so this one passes it by rather than
            // sleep on its lock (in the soak, hundreds of idle CPUs chose
            // the same few sources at once and queued on their locks). The
            // source's own push, and later pulls, move what is left.
            let Some(_claim) = SourceClaim::take(&h.pull_busy) else {
                passed_by.get_or_insert(src);
                self.cpus[cpu as usize]
                    .stats
                    .balance_passed_by
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let Some((mut me, mut s)) = self.lock_pull_pair(cpu, src) else {
                busy.set(src);
                self.cpus[cpu as usize]
                    .stats
                    .rt_pull_busy
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let mine = self.rt_level(&me);
            let found = s.rt.iter_by_prio().find(|&(i, p)| {
                let tp = p as u32 + PRI_FAIR;
                // Only tasks more urgent than ours, and only those the source
                // will not run next itself.
                tp > mine
                    && (tp <= s.curr_pri || s.curr.is_none() && s.in_balance)
                    && self.t(i).pushable.load(Ordering::Relaxed)
                    && self.t(i).allowed(cpu)
            });
            if let Some((id, p)) = found {
                self.migrate_queued(&mut s, &mut me, id, now, cpu);
                mine_hint = mine_hint.max(p as u32 + PRI_FAIR);
                pulled = true;
                self.cpus[cpu as usize]
                    .stats
                    .rt_pulls
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        self.ask_sources_to_push(cpu, pulled, mine_hint, passed_by, &busy);
        pulled
    }

    /// After `cpu`'s RT pull (`pulled`: whether it took anything; its
    /// level is now `mine`): asks the sources it passed by to push. One
    /// passed by because another CPU was pulling from it, only if nothing
    /// was pulled: it may hold more than the other puller takes, and it
    /// pushes at its next `schedule`, where it knows the lowest CPUs
    /// through cpupri. One passed by because its lock was held (`busy`,
    /// bounded pull) keeps what waits there: asked whenever that still
    /// beats what this CPU has now (the lock's holder may be a waker, the
    /// tick or the checker, none of which pushes from it).
    fn ask_sources_to_push(
        &self,
        cpu: CpuId,
        pulled: bool,
        mine: u32,
        passed_by: Option<CpuId>,
        busy: &CpuMask,
    ) {
        if let (false, Some(src)) = (pulled, passed_by) {
            self.request_push(src, cpu);
        }
        for src in busy.iter() {
            let best = self.cpus[src as usize]
                .hot
                .rt_queued_pri
                .load(Ordering::Relaxed);
            if !pulled || best > mine {
                self.request_push(src, cpu);
            }
        }
    }

    /// Asks `src` to push its surplus RT tasks at its next `schedule`
    /// (see `pull_rt`), kicking it unless a request is pending already.
    fn request_push(&self, src: CpuId, by: CpuId) {
        let h = &self.cpus[src as usize].hot;
        if !h.push_request.swap(true, Ordering::AcqRel) {
            self.cpus[by as usize]
                .stats
                .push_requests
                .fetch_add(1, Ordering::Relaxed);
            self.resched_cpu(src, Some(by));
        }
    }

    /// The RT pull's two locks: `cpu`'s own, then source `src`'s.
    ///
    /// WHAT: with [`SchedConfig::bounded_rt_pull`](crate::SchedConfig) the
    /// source's lock is only tried; `None` when another thread holds it.
    ///
    /// WHY: the pull runs inside `schedule` on the block path (a CPU whose
    /// RT task blocks lowers its priority and pulls). Waiting there for a
    /// busy source's lock waits for whatever its holder is doing, and the
    /// holder can be a thread the host has preempted: `vmm bench cyclic`
    /// with 8 FIFO vCPUs on 2 CPUs timed the pull's lock pair at under
    /// 0.13 us at p50 but 32-262 us for about 3% of the pulls, and that
    /// tail was the block path's p99 (58-90 us; 4-5 us bounded); the
    /// holders were workers preempted by the executor's clock thread,
    /// which runs one host priority above them (docs/breakdown.md, "The
    /// RT pull's lock wait"). Linux's rq
    /// locks are spinlocks held with interrupts off, so a holder there is
    /// never preempted, and `pull_rt_task` can afford to spin.
    ///
    /// HOW: a busy source is passed by and asked to push (`push_request`
    /// and a kick) unless this CPU pulled something at least as urgent
    /// as what waits there; it pushes at its next `schedule` (and an
    /// overloaded CPU also pushes at the end of the `schedule` it may be
    /// in). The own lock is taken first and waited for;
    /// trying the second while holding the first cannot deadlock.
    fn lock_pull_pair(
        &self,
        cpu: CpuId,
        src: CpuId,
    ) -> Option<(MutexGuard<'_, Rq>, MutexGuard<'_, Rq>)> {
        if !self.cfg.bounded_rt_pull {
            return Some(self.lock2(cpu, src));
        }
        let me = self.lock_rq(cpu);
        let s = self.try_lock_rq(src)?;
        Some((me, s))
    }

    /// Looks for work for idle `cpu`: RT pull, the LLC's shared runqueue,
    /// then stealing a waiting fair task from a busy CPU nearby.
    /// `rt_pulled`: the caller has just tried an RT pull (a second one
    /// finds the same sources, and takes their locks again for nothing).
    pub(super) fn newidle_balance(&self, cpu: CpuId, now: u64, rt_pulled: bool) -> bool {
        if !rt_pulled && self.pull_rt(cpu, now) {
            return true;
        }
        let st = &self.cpus[cpu as usize].stats;
        for _ in 0..4 {
            let Some(id) = self.shared.pop(cpu) else {
                break;
            };
            self.t(id).in_shared.store(false, Ordering::Release);
            if self.try_pull_fair(cpu, id, now) {
                st.shared_pops.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            st.shared_stale.fetch_add(1, Ordering::Relaxed);
        }
        self.steal_fair(cpu, now)
    }

    /// Migrates fair task `id` to `cpu` if it is still waiting elsewhere
    /// and may run here.
    pub(super) fn try_pull_fair(&self, cpu: CpuId, id: u32, now: u64) -> bool {
        let t = self.t(id);
        if t.code() != ST_QUEUED || t.policy().is_rt() {
            return false;
        }
        let src = t.cpu.load(Ordering::Acquire);
        if src == cpu {
            return true;
        }
        if !t.allowed(cpu) {
            return false;
        }
        let (mut me, mut s) = self.lock2(cpu, src);
        if t.code() != ST_QUEUED || t.cpu.load(Ordering::Acquire) != src || !t.allowed(cpu) {
            return false;
        }
        self.migrate_queued(&mut s, &mut me, id, now, cpu);
        true
    }

    /// Steals one waiting fair task from a busy CPU: the one that kicked
    /// us first, then our LLC, node, and the rest, looking at no more than
    /// `steal_scan_limit` CPUs.
    pub(super) fn steal_fair(&self, cpu: CpuId, now: u64) -> bool {
        let hint = self.cpus[cpu as usize]
            .hot
            .balance_hint
            .swap(NO_TASK, Ordering::Relaxed);
        let llc = self.map.llc_span(self.map.llc_of(cpu));
        let node = self.map.node_span(self.map.node_of(cpu));
        let order = [
            if hint != NO_TASK && (hint as usize) < self.cpus.len() {
                CpuMask::single(hint)
            } else {
                CpuMask::empty()
            },
            *llc,
            node.and_not(llc),
            self.map.all().and_not(node),
        ];
        let mut budget = self.cfg.steal_scan_limit;
        for m in order.iter() {
            let mut m = *m;
            m.clear(cpu);
            let mut c = cpu;
            while let Some(src) = m.next_wrapping(c) {
                m.clear(src);
                c = src;
                if budget == 0 {
                    return false;
                }
                budget -= 1;
                // An idle source with one waiting task is about to run
                // it (it was kicked when the task was queued): taking it
                // moves the task for nothing and sends the source looking
                // for work in turn. Linux's balancer passes a runqueue
                // with one runnable task by for the same reason.
                let h = &self.cpus[src as usize].hot;
                let queued = h.nr_fair_queued.load(Ordering::Relaxed);
                if queued == 0 || (queued == 1 && h.idle.load(Ordering::Relaxed)) {
                    continue;
                }
                // one balancer per source (see pull_rt): a busy one is
                // passed by, and the scan goes on to the next
                let Some(_claim) = SourceClaim::take(&self.cpus[src as usize].hot.pull_busy) else {
                    self.cpus[cpu as usize]
                        .stats
                        .balance_passed_by
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let (mut me, mut s) = self.lock2(cpu, src);
                let cand = s
                    .fair
                    .iter_rev()
                    .map(|(_, i)| i)
                    .find(|&i| self.t(i).allowed(cpu));
                if let Some(id) = cand {
                    self.migrate_queued(&mut s, &mut me, id, now, cpu);
                    self.cpus[cpu as usize]
                        .stats
                        .steals
                        .fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        false
    }
}

impl Scheduler {
    /// Busy balance: hands one waiting fair task of busy `cpu` to a busy
    /// CPU nearby that has at least two fewer waiting. Returns whether one
    /// moved.
    ///
    /// WHAT: at the tick's balance interval, when `cpu` has fair tasks
    /// waiting and no CPU is idle to take one, it looks over its LLC, then
    /// its node (at most `steal_scan_limit` CPUs) for a CPU that runs a
    /// task and has at least two fewer fair tasks waiting and two fewer
    /// CPU-bound ones, and moves a CPU-bound waiting task there.
    ///
    /// WHY: every other path moves a fair task only into an idle CPU
    /// (new-idle balance, the shared runqueue, the tick's idle kick). With
    /// tasks that never block, a CPU that got one runs it alone for ever
    /// while three share the next CPU: 4 VMs booting at once on 2 CPUs,
    /// each VM's boot CPU compute-bound before SMP bring-up, progressed at
    /// 100% / 33% / 33% / 33% (docs/results-vcpus.md, "Linux boot").
    /// Linux's `load_balance` runs from busy CPUs too (less often than
    /// from idle ones) for this reason. `SchedConfig::busy_balance`: on
    /// in `vmm serve`, off elsewhere by default.
    ///
    /// HOW: push rather than pull, so that the tick of the CPU with the
    /// queue does it and the counts need no global view: the source claims
    /// itself (`pull_busy`, as stealers do, so it is never pulled from and
    /// pushing at once), locks both runqueues in order, re-reads both
    /// counts under the locks (the margin of two keeps one task from
    /// bouncing between two CPUs that differ by one), then counts the
    /// CPU-bound fair tasks on each side (the current one included: tasks
    /// whose last turns ended preempted, not blocked, `Task::is_hog`) and
    /// moves the most urgent CPU-bound waiting task only if the source
    /// has had two more of them for 100 ms. Waiting counts alone are the
    /// wrong load: one booting Linux VM's boot CPU (its one CPU hog)
    /// shares 2 CPUs with 11 idle vCPUs that wake for a tick and block
    /// again; pushing on counts moved ticking vCPUs onto the hog's CPU and
    /// the hog itself to the back of the other CPU's queue (it keeps its
    /// lag) about 30 times a second, and made that boot 13% slower
    /// (docs/results-vcpus.md, "Busy balance"). Linux weighs its imbalance
    /// by each task's tracked load (PELT) for the same reason; the
    /// CPU-bound count is that weighing's coarsest form. The target runs
    /// the task when its current slice ends; no kick.
    pub(crate) fn busy_push(&self, cpu: CpuId, now: u64) -> bool {
        /// How long a CPU-bound excess must last before the busy balance
        /// acts on it: 25 balance intervals. The imbalance it is for lasts
        /// minutes (4 booting VMs' boot CPUs, 3 on one CPU and 1 on the
        /// other); one booting VM's brief ones (a spinning AP next to its
        /// boot CPU during SMP bring-up) are left to the idle steal.
        const HOG_EXCESS_PERSIST_NS: u64 = 100_000_000;
        let me_hot = &self.cpus[cpu as usize].hot;
        if me_hot.nr_fair_queued.load(Ordering::Relaxed) < 2 {
            return false;
        }
        let hogs = |rq: &Rq| {
            rq.fair
                .iter()
                .map(|(_, i)| i)
                .chain(rq.curr)
                .filter(|&i| self.t(i).is_hog())
                .count()
        };
        // Fewer than two CPU-bound tasks here (the common case: short jobs
        // queued around one hog) settles it under this CPU's lock alone,
        // before any claim or other lock: a claim held here makes a CPU
        // that goes idle pass this one by instead of stealing from it.
        if hogs(&self.lock_rq(cpu)) < 2 {
            return false;
        }
        let Some(_claim) = SourceClaim::take(&me_hot.pull_busy) else {
            return false;
        };
        let llc = self.map.llc_span(self.map.llc_of(cpu));
        let node = self.map.node_span(self.map.node_of(cpu));
        let mut budget = self.cfg.steal_scan_limit;
        for m in [*llc, node.and_not(llc)] {
            let mut m = m;
            m.clear(cpu);
            let mut c = cpu;
            while let Some(dst) = m.next_wrapping(c) {
                m.clear(dst);
                c = dst;
                if budget == 0 {
                    return false;
                }
                budget -= 1;
                let d = &self.cpus[dst as usize].hot;
                let mine = me_hot.nr_fair_queued.load(Ordering::Relaxed);
                if d.idle.load(Ordering::Relaxed)
                    || d.nr_fair_queued.load(Ordering::Relaxed) + 2 > mine
                {
                    continue;
                }
                let (mut me, mut to) = self.lock2(cpu, dst);
                if me.in_balance
                    || to.in_balance
                    || to.curr.is_none()
                    || d.nr_fair_queued.load(Ordering::Relaxed) + 2
                        > me_hot.nr_fair_queued.load(Ordering::Relaxed)
                {
                    continue;
                }
                if hogs(&me) < hogs(&to) + 2 {
                    continue;
                }
                // only an excess that lasts: a hog's queue fills and drains
                // within milliseconds when short jobs wake around it
                if now.saturating_sub(me.hog_excess_seen) > 2 * self.cfg.balance_interval_ns {
                    me.hog_excess_since = now;
                }
                me.hog_excess_seen = now;
                if now.saturating_sub(me.hog_excess_since) < HOG_EXCESS_PERSIST_NS {
                    return false;
                }
                let cand = me
                    .fair
                    .iter()
                    .map(|(_, i)| i)
                    .find(|&i| self.t(i).is_hog() && self.t(i).allowed(dst));
                if let Some(id) = cand {
                    self.migrate_queued(&mut me, &mut to, id, now, cpu);
                    self.cpus[cpu as usize]
                        .stats
                        .busy_pushes
                        .fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        false
    }
}

/// A balancer's claim on a source CPU (its `pull_busy` flag): at most one
/// CPU pulls or steals from a source at a time, and the others pass it by
/// instead of queueing on its runqueue lock. Released on drop, after the
/// runqueue guards taken under it (declared after it, they drop first).
struct SourceClaim<'a>(&'a AtomicBool);

impl<'a> SourceClaim<'a> {
    fn take(flag: &'a AtomicBool) -> Option<Self> {
        (!flag.swap(true, Ordering::Acquire)).then_some(Self(flag))
    }
}

impl Drop for SourceClaim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
