//! What a core call costs: the accesses the sync layer reported during
//! the call, charged in program order by the coherence model, and the
//! model line of each address (region and offset, [`super::regions`]).

use super::costs::INSTR;
use super::queue::Ev;
use super::regions;
use super::state::{Sim, LINE_MEMO};
use crate::sync::recorder::{self, Kind};
use crate::Scheduler;

impl Sim<'_> {
    /// Names the core's shared structures, sorted by address, for
    /// [`Sim::line_of`] and the report.
    pub(super) fn name_regions(&mut self) {
        let mut regions: Vec<(u64, u64, &'static str)> = regions::of(&self.s)
            .into_iter()
            .filter(|r| r.len > 0)
            .map(|r| (r.start as u64, (r.start + r.len) as u64, r.name))
            .collect();
        regions.sort_by_key(|r| r.0);
        self.regions = regions;
    }

    /// One core call on `cpu` at `now`: returns its result and when it
    /// ends in virtual time.
    pub(super) fn call<R>(
        &mut self,
        cpu: u32,
        now: u64,
        instr: u64,
        f: impl FnOnce(&Scheduler, u64) -> R,
    ) -> (R, u64) {
        recorder::start();
        let r = f(&self.s, now);
        recorder::stop_into(&mut self.buf);
        // Accesses in program order; consecutive loads overlap in groups
        // of the core's miss buffers (`mlp`), everything else waits for
        // what came before it.
        let mlp = self.coh.cost().mlp.max(1);
        let mut t = now + instr;
        let (mut group_end, mut in_group) = (t, 0);
        for i in 0..self.buf.len() {
            let a = self.buf[i];
            let line = self.line_of(a.addr);
            if a.kind == Kind::Load {
                let d = self.coh.access(cpu, line, a.kind, t) + INSTR.per_access_ns;
                group_end = group_end.max(d);
                in_group += 1;
                if in_group == mlp {
                    t = group_end;
                    in_group = 0;
                }
            } else {
                t = t.max(group_end);
                t = self.coh.access(cpu, line, a.kind, t) + INSTR.per_access_ns;
                group_end = t;
                in_group = 0;
            }
        }
        t = t.max(group_end);
        let t = self.kicks_at(cpu, t);
        self.sched_ns += t - now;
        self.calls += 1;
        (r, t)
    }

    /// The kicks a core call of `cpu` sent (run to completion: all of the
    /// call's, at its end; interleaved: since its last access), as events
    /// at the kicked CPUs one transfer after `now`; returns when the
    /// sender goes on. A kick of an idle CPU also costs the sender
    /// `kick_ns` and reaches the CPU's `schedule` its idle state's exit
    /// later ([`CostTable::idle_exit`](super::CostTable::idle_exit); all 0
    /// on the presets unless `--idle-states` asks for the part's C1 or
    /// deepest state), the idle period counted from the CPU's last
    /// `schedule` that found nothing to run.
    pub(super) fn kicks_at(&mut self, cpu: u32, now: u64) -> u64 {
        self.kicks.take_into(&mut self.kicked);
        let kicked = std::mem::take(&mut self.kicked);
        let cost = *self.coh.cost();
        let mut t = now;
        for &c in &kicked {
            let lat = cost.transfer(self.coh.level(cpu, c));
            let k = self.cpus[c as usize];
            let at = if k.curr.is_none() && k.free_at <= now {
                t += cost.kick_ns;
                if k.exit_until > now {
                    // already leaving its idle state for an earlier kick:
                    // this one is served when that exit ends, not by a
                    // second exit
                    (t + lat).max(k.exit_until)
                } else {
                    let at = t + lat + cost.idle_exit(now.saturating_sub(k.idle_since));
                    self.cpus[c as usize].exit_until = at;
                    at
                }
            } else {
                t + lat
            };
            self.push(at, Ev::Kick { cpu: c });
        }
        self.kicked = kicked;
        t
    }

    /// The model's line of an address: region number and line offset from
    /// the region's start, so that the allocator's placement of unaligned
    /// buffers (which differs from run to run) cannot change a result;
    /// aligned structures keep exactly their real lines. Addresses in no
    /// region keep their real line, tagged apart.
    pub(super) fn line_of(&mut self, addr: u64) -> u64 {
        // Keyed by the address itself, not its real line: in an unaligned
        // region two addresses of one real line can be two model lines.
        let slot = ((addr >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            >> (64 - LINE_MEMO.trailing_zeros())) as usize;
        let (k, v) = self.line_memo[slot];
        if k == addr.wrapping_add(1) {
            return v;
        }
        let v = self.line_of_slow(addr);
        self.line_memo[slot] = (addr.wrapping_add(1), v);
        v
    }

    fn line_of_slow(&self, addr: u64) -> u64 {
        let i = self.regions.partition_point(|r| r.0 <= addr);
        if i > 0 {
            let (start, end, _) = self.regions[i - 1];
            if addr < end {
                return ((i as u64) << 40) | ((addr - start) / 64);
            }
        }
        (addr / 64) | (1 << 63)
    }

    pub(super) fn region_name(&self, line: u64) -> &'static str {
        let i = (line >> 40) as usize;
        if line >> 63 == 0 && i > 0 && i <= self.regions.len() {
            self.regions[i - 1].2
        } else {
            "other"
        }
    }
}
