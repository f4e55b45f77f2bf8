//! Interleaved core calls: each simulated CPU's call runs as a coroutine
//! that hands control back to the simulator at every shared access the
//! [`sync`](crate::sync) layer reports, so that accesses of all CPUs are
//! served in virtual-time order and a call sees the others' transient
//! states (a claimed source, a runqueue in balance, a held lock).
//!
//! WHAT: [`SimConfig::interleave`](super::SimConfig). A call's accesses are
//! charged by the same coherence model as a call run to completion, but
//! each one only when virtual time reaches it: the call is suspended and
//! an event queued at the access's issue time unless no other event comes
//! first, in which case it goes on at once. Loads overlap in groups of
//! `mlp`; a plain (relaxed or release) store goes into a store buffer and
//! the call goes on at once, the buffer draining in order in the
//! background; an RMW, a SeqCst store (an `xchg` on x86), a lock or an
//! unlock waits for what came before it and for the store buffer, and
//! takes effect when it completes: the call resumes then.
//!
//! WHY: run to completion, a call never sees another half done: the
//! claim (`pull_busy`) and the `in_balance` flag are set and cleared
//! inside one call, so the pass-by and push-request paths are dead code;
//! a lock wait is measured against whoever was processed last, not
//! whoever came first in virtual time.
//!
//! HOW: [corosensei](https://docs.rs/corosensei) stackful coroutines on
//! the simulator's one thread (a switch is a few ns; a deterministic
//! hand-off between OS threads, as loom and shuttle do, costs a futex
//! wake per access). Locks are real: the sync layer's mutex tries the
//! lock and, when another call holds it, suspends with
//! [`Suspend::Blocked`]; the simulator queues the waiter on the lock's
//! address in order of arrival; when the holder's release completes, the
//! first waiter still spinning gets it at once, and only if none spins is
//! the first sleeper woken. Waiting costs what `std`'s futex mutex costs:
//! a waiter spins for the cost table's `lock_spin_ns`, then sleeps in the
//! kernel; a sleeper is resumed `wakeup_ns` after the release (a caller
//! arriving meanwhile takes the free lock first) and the releaser pays
//! `futex_wake_ns` for waking it.

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};

use super::calls::{CallStart, Interleave, Op, Out, Slot, Then, STACK_BYTES};
use super::costs::INSTR;
use super::queue::Ev;
use super::state::Sim;
use crate::sync::recorder::{self, Kind, Suspend, Yielder};

impl Sim<'_> {
    fn il(&mut self) -> &mut Interleave {
        self.il.as_mut().expect("interleaving is on")
    }

    /// `cpu` makes core call `op` at `now` (`instr` ns of instructions
    /// before its first access); `then` says what follows when it
    /// returns. `occupies`: the CPU waits for it.
    pub(super) fn begin(
        &mut self,
        cpu: u32,
        now: u64,
        instr: u64,
        op: Op,
        then: Then,
        occupies: bool,
    ) {
        let Some(il) = self.il.as_mut() else {
            let (out, end) = self.call(cpu, now, instr, |s, now| op.run(s, cpu, now));
            if matches!(then, Then::Scheduled) {
                self.schedule_only.0 += end - now;
                self.schedule_only.1 += 1;
            }
            self.cont(cpu, then, out, end);
            return;
        };
        if occupies {
            il.busy[cpu as usize] = true;
        }
        let start = CallStart {
            cpu,
            now,
            instr,
            op,
            then,
            occupies,
        };
        if il.check_due.is_some() {
            il.parked.push(start);
            return;
        }
        let k = self.new_slot(start);
        self.advance(k, now);
    }

    /// A slot for the call `start` describes.
    fn new_slot(&mut self, start: CallStart) -> usize {
        let CallStart {
            cpu,
            now,
            instr,
            op,
            then,
            occupies,
        } = start;
        let il = self.il.as_mut().expect("interleaving is on");
        let stack = match il.stacks.pop() {
            Some(s) => s,
            None => DefaultStack::new(STACK_BYTES).expect("mmap of a coroutine stack"),
        };
        let s = self.s.clone();
        let co = Coroutine::with_stack(stack, move |y: &Yielder, ()| {
            recorder::enter(y);
            op.run(&s, cpu, now)
        });
        let t = now + instr;
        let slot = Slot {
            co: Some(co),
            cpu,
            occupies,
            then,
            start: now,
            t,
            group_end: t,
            drained: t,
            in_group: 0,
            pending: None,
            done: None,
            blocked_at: 0,
            retrying: false,
        };
        let k = match il.free.pop() {
            Some(k) => {
                il.slots[k] = slot;
                k
            }
            None => {
                il.slots.push(slot);
                il.slots.len() - 1
            }
        };
        il.in_flight += 1;
        k
    }

    /// An `Ev::Call` event of slot `k` at `t`: its pending access is
    /// charged, or its result delivered, or it is resumed.
    pub(super) fn call_event(&mut self, k: usize, t: u64) {
        let slot = &mut self.il().slots[k];
        if let Some(out) = slot.done.take() {
            self.finish(k, out, t);
            return;
        }
        if let Some((line, kind)) = slot.pending.take() {
            let Some(resume) = self.charge_access(k, line, kind, t) else {
                return;
            };
            if resume >= self.q.min_time() {
                self.il().stats.queued += 1;
                self.push(resume, Ev::Call { slot: k as u32 });
                return;
            }
            self.advance(k, resume);
            return;
        }
        self.advance(k, t);
    }

    /// Runs slot `k`'s call from virtual time `now` until it must wait for
    /// other CPUs' events, blocks on a lock, or returns.
    fn advance(&mut self, k: usize, mut now: u64) {
        loop {
            let cpu = self.il().slots[k].cpu;
            recorder::set_recording(true);
            let r = self.il().slots[k]
                .co
                .as_mut()
                .expect("a slot in flight has its coroutine")
                .resume(());
            recorder::leave();
            recorder::set_recording(false);
            let sent = self.kicks_at(cpu, now);
            if sent > now {
                let slot = &mut self.il().slots[k];
                slot.t = slot.t.max(sent);
                now = sent;
            }
            match r {
                CoroutineResult::Yield(Suspend::Access(a)) => {
                    let line = self.line_of(a.addr);
                    let slot = &self.il().slots[k];
                    let issue = match a.kind {
                        // loads pass the store buffer
                        Kind::Load => slot.t,
                        // a plain store waits for what came before it,
                        // not for the stores ahead of it in the buffer
                        Kind::Store => slot.t.max(slot.group_end),
                        // locked instructions drain the store buffer
                        _ => slot.t.max(slot.group_end).max(slot.drained),
                    };
                    if issue >= self.q.min_time() {
                        let il = self.il();
                        il.stats.queued += 1;
                        il.slots[k].pending = Some((line, a.kind));
                        self.push(issue, Ev::Call { slot: k as u32 });
                        return;
                    }
                    let Some(resume) = self.charge_access(k, line, a.kind, issue) else {
                        return;
                    };
                    now = resume;
                    if now >= self.q.min_time() {
                        self.il().stats.queued += 1;
                        self.push(now, Ev::Call { slot: k as u32 });
                        return;
                    }
                }
                CoroutineResult::Yield(Suspend::Released(word)) => {
                    let line = self.line_of(word);
                    let go_on = self.hand_over(k, line, word, now);
                    if go_on >= self.q.min_time() {
                        self.push(go_on, Ev::Call { slot: k as u32 });
                        return;
                    }
                    now = go_on;
                }
                CoroutineResult::Yield(Suspend::Blocked(word)) => {
                    let il = self.il();
                    il.stats.lock_blocks += 1;
                    let slot = &mut il.slots[k];
                    slot.blocked_at = now;
                    let front = std::mem::take(&mut slot.retrying);
                    let q = il.waiters.entry(word).or_default();
                    if front {
                        q.push_front(k);
                    } else {
                        q.push_back(k);
                    }
                    return;
                }
                CoroutineResult::Return(out) => {
                    let slot = &self.il().slots[k];
                    let end = slot.t.max(slot.group_end).max(now);
                    if end >= self.q.min_time() {
                        self.il().slots[k].done = Some(out);
                        self.push(end, Ev::Call { slot: k as u32 });
                        return;
                    }
                    self.finish(k, out, end);
                    return;
                }
            }
        }
    }

    /// Charges slot `k`'s access at its issue time `at`; returns when the
    /// call goes on (a load: at once, the next load overlaps it; a plain
    /// store: at once, into the store buffer; anything else: when it
    /// completes).
    ///
    /// A write that finds the line in transfer, or others waiting for it,
    /// waits in the line's queue (`None`): the line's arbitration
    /// ([`Coherence::grant_next`](super::Coherence::grant_next)) resumes it.
    fn charge_access(&mut self, k: usize, line: u64, kind: Kind, at: u64) -> Option<u64> {
        let cpu = self.il().slots[k].cpu;
        let mlp = self.coh.cost().mlp.max(1);
        let d = if matches!(kind, Kind::Load | Kind::Store) {
            // a buffered store drains in the background, so the call never
            // waits in the line's queue for it
            self.coh.access(cpu, line, kind, at)
        } else {
            match self.coh.write_request(cpu, line, kind, at, k as u64) {
                Ok(d) => d,
                Err(free_at) => {
                    self.wait_for_line(line, free_at);
                    return None;
                }
            }
        } + INSTR.per_access_ns;
        let il = self.il.as_mut().expect("interleaving is on");
        il.stats.accesses += 1;
        let slot = &mut il.slots[k];
        if kind == Kind::Load {
            slot.group_end = slot.group_end.max(d);
            slot.in_group += 1;
            if slot.in_group == mlp {
                slot.t = slot.group_end;
                slot.in_group = 0;
            }
            return Some(at);
        }
        if kind == Kind::Store {
            // into the store buffer: the call goes on at once; the buffer
            // drains in order, this store by `d`
            slot.drained = slot.drained.max(d);
            slot.t = at;
            return Some(at);
        }
        slot.t = d;
        slot.group_end = d;
        slot.in_group = 0;
        Some(d)
    }

    /// A write waits for `line`, free at `free_at`: the line's next
    /// arbitration is due then, unless one is already.
    fn wait_for_line(&mut self, line: u64, free_at: u64) {
        let il = self.il();
        il.stats.line_waits += 1;
        if il.grant_due.contains_key(&line) {
            return;
        }
        let idx = match il.grant_free.pop() {
            Some(i) => {
                il.grant_lines[i as usize] = line;
                i
            }
            None => {
                il.grant_lines.push(line);
                (il.grant_lines.len() - 1) as u32
            }
        };
        il.grant_due.insert(line, idx);
        self.push(free_at, Ev::Grant { idx });
    }

    /// An `Ev::Grant` event at `t`: the line it names is free, and its
    /// arbitration picks the waiting write that gets it; that call resumes
    /// when its access completes.
    pub(super) fn grant_event(&mut self, idx: u32, t: u64) {
        let line = self.il().grant_lines[idx as usize];
        let granted = self.coh.grant_next(line, t);
        let il = self.il();
        if let Some((token, done, more)) = granted {
            il.stats.accesses += 1;
            let w = token as usize;
            let d = done + INSTR.per_access_ns;
            let slot = &mut il.slots[w];
            slot.t = d;
            slot.group_end = d;
            slot.in_group = 0;
            self.push(d, Ev::Call { slot: w as u32 });
            if more {
                self.push(done, Ev::Grant { idx });
                return;
            }
        }
        let il = self.il();
        il.grant_due.remove(&line);
        il.grant_free.push(idx);
    }

    /// Slot `k` released the lock at `addr` (model line `line`) at `done`,
    /// when its unlock completed: the first waiter gets it. Returns when
    /// the releaser goes on.
    fn hand_over(&mut self, k: usize, line: u64, addr: u64, done: u64) -> u64 {
        let cost = *self.coh.cost();
        let il = self.il.as_mut().expect("interleaving is on");
        let Some(q) = il.waiters.get_mut(&addr).filter(|q| !q.is_empty()) else {
            return done;
        };
        // `std`'s futex mutex is not fair: a waiter still spinning sees
        // the release and takes the lock at once, ahead of any asleep (the
        // first of those is woken only when nobody spins); so the first
        // spinner in order of arrival, else the first sleeper
        let slots = &il.slots;
        let spinning = |w: &usize| done.saturating_sub(slots[*w].blocked_at) <= cost.lock_spin_ns;
        let i = q.iter().position(spinning).unwrap_or(0);
        let Some(w) = q.remove(i) else {
            return done;
        };
        let waited = done.saturating_sub(il.slots[w].blocked_at);
        let (resume, releaser) = if waited <= cost.lock_spin_ns {
            // still spinning: it sees the release at once (its retry pays
            // the line's transfer)
            (done, done)
        } else {
            // asleep in the kernel: the releaser's unlock makes the wake
            // syscall, and the waiter runs a wakeup later
            il.stats.lock_sleeps += 1;
            let r = done + cost.futex_wake_ns;
            il.slots[k].t = r;
            il.slots[k].group_end = r;
            (r + cost.wakeup_ns, r)
        };
        let wait = resume.saturating_sub(il.slots[w].blocked_at);
        il.stats.lock_wait_ns += wait;
        let ws = &mut il.slots[w];
        ws.t = ws.t.max(resume);
        ws.group_end = ws.group_end.max(resume);
        ws.retrying = true;
        self.coh.lock_waited(line, wait);
        self.push(resume, Ev::Call { slot: w as u32 });
        releaser
    }

    /// Slot `k`'s call returned `out`, ending at `end`.
    fn finish(&mut self, k: usize, out: Out, end: u64) {
        let il = self.il();
        let slot = &mut il.slots[k];
        let co = slot.co.take().expect("a slot in flight has its coroutine");
        let (cpu, then, start, occupies) = (slot.cpu, slot.then, slot.start, slot.occupies);
        il.stacks.push(co.into_stack());
        il.free.push(k);
        il.in_flight -= 1;
        if occupies {
            il.busy[cpu as usize] = false;
        }
        if il.ending {
            return;
        }
        self.sched_ns += end - start;
        self.calls += 1;
        if matches!(then, Then::Scheduled) {
            self.schedule_only.0 += end - start;
            self.schedule_only.1 += 1;
        }
        self.cont(cpu, then, out, end);
        if occupies && !self.il().busy[cpu as usize] {
            self.release_deferred(cpu, end);
        }
        if self.il().in_flight == 0 {
            if let Some(due) = self.il().check_due.take() {
                self.checker.observe(&self.s, end);
                let il = self.il();
                il.stats.check_hold_ns += end - due;
                for p in std::mem::take(&mut il.parked) {
                    self.begin(p.cpu, p.now.max(end), p.instr, p.op, p.then, p.occupies);
                }
            }
        }
    }

    /// An event for `cpu` while it waits for a call: kept until it is
    /// free. Returns whether it was kept.
    pub(super) fn defer_if_busy(&mut self, cpu: u32, t: u64, seq: u64, ev: Ev) -> bool {
        match self.il.as_mut() {
            Some(il) if il.busy[cpu as usize] => {
                il.deferred[cpu as usize].push((t, seq, ev));
                true
            }
            _ => false,
        }
    }

    /// `cpu` is free at `now`: the events it kept are handled, in order
    /// (each at `now`, as `t.max(free_at)` would have had them).
    fn release_deferred(&mut self, cpu: u32, now: u64) {
        let kept = std::mem::take(&mut self.il().deferred[cpu as usize]);
        for (t, seq, ev) in kept {
            self.handle(t.max(now), seq, ev);
        }
    }

    /// The invariant checker's turn at `t`: at once if no call is in
    /// flight, else when the last ends (new calls wait meanwhile).
    pub(super) fn check_at(&mut self, t: u64) {
        match self.il.as_mut() {
            Some(il) if il.in_flight > 0 => {
                il.stats.checks_delayed += 1;
                il.check_due = Some(t);
            }
            _ => {
                self.checker.observe(&self.s, t);
            }
        }
    }

    /// The run is over: lets the calls in flight finish (nothing follows
    /// them), so that no lock is left held when the report reads the
    /// core.
    pub(super) fn drain(&mut self) {
        let Some(il) = self.il.as_mut() else { return };
        il.ending = true;
        il.parked.clear();
        while self.il().in_flight > 0 {
            let Some(key) = self.q.pop() else { break };
            let (t, _, ev) = Ev::unkey(key);
            self.coh.set_floor(t);
            match ev {
                Ev::Call { slot } => self.call_event(slot as usize, t),
                Ev::Grant { idx } => self.grant_event(idx, t),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::Arc;

    use super::*;
    use crate::exec::sim::queue::Queue;
    use crate::exec::sim::{CostTable, SimConfig, SimWorkload};
    use crate::{Mitigations, Scheduler};

    thread_local! {
        static ORDER: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    }

    /// 4 CPUs, each its own L2 under one L3, the `test` cost table.
    fn probe_cfg(interleave: bool) -> SimConfig {
        SimConfig {
            workload: SimWorkload::Cyclic,
            vms: 1,
            vcpus: 1,
            duration_ns: 1_000_000,
            work_ns: None,
            seed: 1,
            mitigations: Mitigations::all(),
            cost: CostTable::for_preset("test").unwrap(),
            interleave,
            arbitration: crate::exec::sim::Arbitration::Nearest,
        }
    }

    /// A simulator of `cfg` with none of its workload's events: only what
    /// a test starts happens.
    fn probe_sim(cfg: &SimConfig) -> Sim<'_> {
        let topo = Arc::new(topology::load("package:1 l3:1 l2:4 core:1 pu:1").unwrap());
        let mut sim = Sim::new(topo.clone(), cfg).unwrap();
        sim.q = Queue::new(topo.num_cpus());
        sim
    }

    /// `cpu` starts `op` at `at`, waiting for it, with nothing after.
    fn probe_start(cpu: u32, at: u64, op: Op) -> CallStart {
        CallStart {
            cpu,
            now: at,
            instr: 0,
            op,
            then: Then::Nothing,
            occupies: true,
        }
    }

    /// Handles events until none is left.
    fn run_events(sim: &mut Sim<'_>) {
        while let Some(k) = sim.q.pop() {
            let (t, seq, ev) = Ev::unkey(k);
            sim.coh.set_floor(t);
            sim.handle(t, seq, ev);
        }
    }

    /// Takes CPU 0's runqueue lock and notes who got it.
    fn take_rq0(s: &Scheduler, cpu: u32) {
        let g = s.lock_rq(0);
        ORDER.with(|o| o.borrow_mut().push(cpu));
        drop(g);
    }

    /// Three CPUs ask for one lock while it is held; they get it in the
    /// order they asked in virtual time (1, 3, 2), not the order their
    /// calls were started in (1, 2, 3), which is all run to completion
    /// can give.
    fn order(interleave: bool) -> Vec<u32> {
        let cfg = probe_cfg(interleave);
        let mut sim = probe_sim(&cfg);
        ORDER.with(|o| o.borrow_mut().clear());
        for (cpu, at) in [(1, 100), (2, 110), (3, 105)] {
            let op = Op::Probe(take_rq0);
            if interleave {
                // each call starts at its time, as if from an event there
                let k = sim.new_slot(probe_start(cpu, at, op));
                sim.push(at, Ev::Call { slot: k as u32 });
            } else {
                sim.begin(cpu, at, 0, op, Then::Nothing, true);
            }
        }
        run_events(&mut sim);
        if let Some(il) = &sim.il {
            assert_eq!(il.in_flight, 0);
            assert_eq!(il.stats.lock_blocks, 2, "{:?}", il.stats);
        }
        ORDER.with(|o| o.borrow().clone())
    }

    /// Four lines, each alone.
    #[repr(align(64))]
    struct Cell(crate::sync::shared::AtomicU64);
    static CELLS: [Cell; 4] = [
        Cell(crate::sync::shared::AtomicU64::new(0)),
        Cell(crate::sync::shared::AtomicU64::new(0)),
        Cell(crate::sync::shared::AtomicU64::new(0)),
        Cell(crate::sync::shared::AtomicU64::new(0)),
    ];

    fn store_relaxed(_: &Scheduler, _: u32) {
        for c in &CELLS {
            c.0.store(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn store_seqcst(_: &Scheduler, _: u32) {
        for c in &CELLS {
            c.0.store(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// How long CPU 0's call of `probe` takes when CPU 3 (another L2)
    /// wrote the four lines last.
    fn stores_take(probe: fn(&Scheduler, u32)) -> u64 {
        let cfg = probe_cfg(true);
        let mut sim = probe_sim(&cfg);
        let run = |sim: &mut Sim<'_>, cpu: u32, at: u64| {
            let before = sim.sched_ns;
            let k = sim.new_slot(probe_start(cpu, at, Op::Probe(probe)));
            sim.push(at, Ev::Call { slot: k as u32 });
            run_events(sim);
            sim.sched_ns - before
        };
        run(&mut sim, 3, 0);
        run(&mut sim, 0, 100_000)
    }

    /// Plain stores retire into the store buffer: a call of four of them
    /// to lines another core holds does not wait for the transfers; four
    /// SeqCst stores (`xchg` on x86) wait for each.
    #[test]
    fn plain_stores_do_not_wait_for_their_lines_seqcst_ones_do() {
        let c = CostTable::for_preset("test").unwrap();
        let (relaxed, seqcst) = (stores_take(store_relaxed), stores_take(store_seqcst));
        assert!(relaxed < c.llc_ns, "relaxed {relaxed}");
        assert!(seqcst >= 4 * c.llc_ns, "seqcst {seqcst}");
    }

    #[test]
    fn a_held_lock_goes_to_its_waiters_in_order_of_arrival() {
        assert_eq!(order(true), vec![1, 3, 2]);
        assert_eq!(order(false), vec![1, 2, 3]);
    }
}
