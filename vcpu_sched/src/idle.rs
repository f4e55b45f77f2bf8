//! Idle CPU tracking: which CPUs are idle, for wakeup placement ("is there
//! an idle CPU in this LLC?") and for idle load balancing ("is any CPU idle
//! that could take work from me?", asked on every busy tick).
//!
//! A CPU enters and leaves the idle set under its own runqueue lock, so the
//! enter/exit calls of one CPU never overlap; different CPUs race freely.
//!
//! The set is kept the way Linux keeps its nohz idle set: a CPU enters it
//! when it goes idle (unless it is still in it), but a CPU that becomes
//! busy leaves it only once a tick has found it busy
//! ([`crate::Scheduler::tick`] marks it; its next `schedule` takes it out
//! under its own runqueue lock), not at once. So a CPU that flips between
//! idle and busy many times between two ticks writes the set at most twice
//! per tick, not twice per flip, and the set may name CPUs that are busy
//! by now (one that runs a task for long stays named until it next
//! schedules). Its searches therefore
//! take a `live` test (the scheduler passes each candidate CPU's own idle
//! flag, as Linux's wakeup placement reads each candidate runqueue) and
//! skip the stale ones.
//!
//! The baseline ([`GlobalIdle`]) is one mask and one count for the machine,
//! like Linux's `nohz.idle_cpus_mask` and `nohz.nr_cpus`: every entry and
//! exit of every CPU writes the same lines. Fix 4
//! ([`crate::fixes::llcidle`]) keeps them per LLC.

use crate::cpumask::{AtomicCpuMask, CpuMask};
pub use crate::fixes::llcidle::{IdleLlcCount, LlcIdle, LlcIdleSet};
use crate::sync::{AtomicI32, Ordering};
use crate::task::CpuId;
use crate::topo::TopoMap;

/// The baseline: one count and one mask for all CPUs, side by side.
#[repr(C, align(128))]
pub struct GlobalIdle {
    pub(crate) count: AtomicI32,
    pub(crate) mask: AtomicCpuMask,
}

impl GlobalIdle {
    fn new(map: &TopoMap, all_idle: bool) -> Self {
        let g = Self {
            count: AtomicI32::new(0),
            mask: AtomicCpuMask::new(),
        };
        if all_idle {
            for c in map.all().iter() {
                g.mask.set(c, Ordering::Relaxed);
            }
            g.count.store(map.ncpus() as i32, Ordering::Relaxed);
        }
        g
    }
}

/// Idle tracking in either layout, with the spans its searches use.
pub struct IdleTracker {
    pub(crate) kind: IdleKind,
    llc_span: Box<[CpuMask]>,
    node_span: Box<[CpuMask]>,
    cpu_llc: Box<[u32]>,
    cpu_node: Box<[u32]>,
    all: CpuMask,
}

pub(crate) enum IdleKind {
    Global(Box<GlobalIdle>),
    PerLlc(Box<LlcIdleSet>),
}

impl IdleTracker {
    /// Builds the layout fix 4 asks for. `all_idle` starts with every CPU
    /// idle (as a scheduler does before any task runs).
    pub fn new(map: &TopoMap, per_llc: bool, all_idle: bool) -> Self {
        Self {
            kind: if per_llc {
                IdleKind::PerLlc(Box::new(LlcIdleSet::new(map, all_idle)))
            } else {
                IdleKind::Global(Box::new(GlobalIdle::new(map, all_idle)))
            },
            llc_span: (0..map.nllcs() as u32).map(|l| *map.llc_span(l)).collect(),
            node_span: (0..map.nnodes() as u32)
                .map(|n| *map.node_span(n))
                .collect(),
            cpu_llc: (0..map.ncpus() as u32).map(|c| map.llc_of(c)).collect(),
            cpu_node: (0..map.ncpus() as u32).map(|c| map.node_of(c)).collect(),
            all: *map.all(),
        }
    }

    /// `cpu` goes idle. Must not be called twice without an [`exit`](Self::exit).
    #[inline]
    pub fn enter(&self, cpu: CpuId) {
        match &self.kind {
            IdleKind::Global(g) => {
                g.mask.set(cpu, Ordering::Release);
                g.count.fetch_add(1, Ordering::AcqRel);
            }
            IdleKind::PerLlc(s) => s.enter(cpu, self.cpu_llc[cpu as usize]),
        }
    }

    /// `cpu` stops being idle.
    #[inline]
    pub fn exit(&self, cpu: CpuId) {
        match &self.kind {
            IdleKind::Global(g) => {
                g.count.fetch_sub(1, Ordering::AcqRel);
                g.mask.clear(cpu, Ordering::Release);
            }
            IdleKind::PerLlc(s) => s.exit(cpu, self.cpu_llc[cpu as usize]),
        }
    }

    /// Might any CPU be idle? The cheap check a busy tick makes.
    #[inline]
    pub fn any(&self) -> bool {
        match &self.kind {
            IdleKind::Global(g) => g.count.load(Ordering::Acquire) > 0,
            IdleKind::PerLlc(s) => s.any(),
        }
    }

    /// A CPU of LLC `llc` in `allowed` that the set names idle and that
    /// passes `live` (see the module docs: the set can be stale).
    #[inline]
    pub fn find_in_llc(
        &self,
        llc: u32,
        allowed: &CpuMask,
        live: &dyn Fn(CpuId) -> bool,
    ) -> Option<CpuId> {
        let within = allowed.and(&self.llc_span[llc as usize]);
        if within.is_empty() {
            return None;
        }
        let cands = match &self.kind {
            IdleKind::Global(g) => g.mask.and(&within, Ordering::Acquire),
            IdleKind::PerLlc(s) => s.candidates_in_llc(llc, &within)?,
        };
        let found = cands.iter().find(|&c| live(c));
        found
    }

    /// A CPU of `allowed` that the set names idle and that passes `live`,
    /// searched near `prefer`: its LLC, then its node, then anywhere.
    pub fn find(
        &self,
        allowed: &CpuMask,
        prefer: CpuId,
        live: &dyn Fn(CpuId) -> bool,
    ) -> Option<CpuId> {
        if !self.any() {
            return None;
        }
        let llc = self.cpu_llc[prefer as usize];
        if let Some(c) = self.find_in_llc(llc, allowed, live) {
            return Some(c);
        }
        match &self.kind {
            IdleKind::Global(g) => {
                let llc_span = &self.llc_span[llc as usize];
                let node = &self.node_span[self.cpu_node[prefer as usize] as usize];
                let m = g.mask.load(Ordering::Acquire);
                let near = m.and(&allowed.and(node)).and_not(llc_span);
                let far = m.and(&allowed.and(&self.all)).and_not(node);
                let found = near.iter().chain(far.iter()).find(|&c| live(c));
                found
            }
            IdleKind::PerLlc(s) => s.find_other_llcs(llc, allowed, &self.llc_span, live),
        }
    }

    /// Is `cpu` marked idle (for the invariant checker)?
    pub fn is_idle(&self, cpu: CpuId) -> bool {
        match &self.kind {
            IdleKind::Global(g) => g.mask.test(cpu, Ordering::Acquire),
            IdleKind::PerLlc(s) => s.is_idle(cpu, self.cpu_llc[cpu as usize]),
        }
    }

    /// Checks the counts against the masks; call only when no CPU is
    /// entering or leaving idle (the checker holds every runqueue lock).
    /// Returns a description of the first mismatch.
    pub fn check_consistent(&self) -> Result<u32, String> {
        match &self.kind {
            IdleKind::Global(g) => {
                let n = g.mask.load(Ordering::Acquire).count() as i32;
                let c = g.count.load(Ordering::Acquire);
                if n != c {
                    return Err(format!(
                        "global idle count {c} but {n} CPUs in the idle mask"
                    ));
                }
                Ok(n as u32)
            }
            IdleKind::PerLlc(s) => s.check_consistent(&self.llc_span),
        }
    }

    /// LLC `llc`'s own idle count with fix 4; `None` in the baseline, which
    /// counts idle CPUs machine-wide only (for tests of the wiring).
    #[doc(hidden)]
    pub fn llc_idle_count(&self, llc: u32) -> Option<i32> {
        match &self.kind {
            IdleKind::Global(_) => None,
            IdleKind::PerLlc(s) => Some(s.llc_count(llc)),
        }
    }

    /// Is this the per-LLC layout?
    pub fn per_llc(&self) -> bool {
        matches!(self.kind, IdleKind::PerLlc(_))
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use crate::topo::tests::hand_topo;

    /// Every candidate is live (the set is exact in these tests).
    const ANY: fn(CpuId) -> bool = |_| true;

    fn both(map: &TopoMap, all_idle: bool) -> [IdleTracker; 2] {
        [
            IdleTracker::new(map, false, all_idle),
            IdleTracker::new(map, true, all_idle),
        ]
    }

    #[test]
    fn all_cpus_idle_then_none() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        for t in both(&map, true) {
            assert!(t.any());
            assert_eq!(t.check_consistent().unwrap(), 16);
            assert_eq!(t.find(map.all(), 5, &ANY), Some(4), "prefer's LLC first");
            for c in 0..16 {
                t.exit(c);
            }
            assert!(!t.any());
            assert_eq!(t.find(map.all(), 5, &ANY), None);
            assert_eq!(t.find_in_llc(1, map.all(), &ANY), None, "empty LLC");
            assert_eq!(t.check_consistent().unwrap(), 0);
        }
    }

    #[test]
    fn search_order_llc_node_anywhere() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        for t in both(&map, false) {
            assert!(!t.any());
            t.enter(14); // node 1, LLC 3
            t.enter(6); // node 0, LLC 1
            assert!(t.any());
            assert_eq!(
                t.find(map.all(), 0, &ANY),
                Some(6),
                "same node before other node"
            );
            assert_eq!(t.find(map.all(), 12, &ANY), Some(14));
            assert_eq!(
                t.find(&"0-5".parse().unwrap(), 0, &ANY),
                None,
                "affinity respected"
            );
            assert_eq!(
                t.find(&"14".parse().unwrap(), 0, &ANY),
                Some(14),
                "anywhere last"
            );
            assert_eq!(t.find_in_llc(1, map.all(), &ANY), Some(6));
            assert_eq!(t.find_in_llc(0, map.all(), &ANY), None);
            assert!(t.is_idle(6) && !t.is_idle(7));
            t.exit(6);
            assert_eq!(t.find(map.all(), 0, &ANY), Some(14));
            t.exit(14);
            assert!(!t.any());
            assert_eq!(t.check_consistent().unwrap(), 0);
        }
    }

    #[test]
    fn stale_members_are_skipped_by_the_live_test() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        for t in both(&map, false) {
            t.enter(4);
            t.enter(5);
            t.enter(14);
            // CPU 4 has become busy but is still in the set
            let live = |c: CpuId| c != 4;
            assert_eq!(t.find_in_llc(1, map.all(), &live), Some(5));
            assert_eq!(t.find(map.all(), 4, &live), Some(5));
            let only14 = |c: CpuId| c == 14;
            assert_eq!(t.find(map.all(), 4, &only14), Some(14), "other node last");
            assert_eq!(t.find(map.all(), 4, &|_| false), None);
            assert_eq!(t.check_consistent().unwrap(), 3);
        }
    }

    #[test]
    fn single_cpu_llcs_collapse_but_still_work() {
        let map = TopoMap::new(&hand_topo(1, 4, 1, 1)).unwrap();
        for t in both(&map, true) {
            assert_eq!(t.check_consistent().unwrap(), 4);
            t.exit(0);
            t.exit(1);
            assert_eq!(t.find(map.all(), 0, &ANY), Some(2));
            assert!(t.any());
            t.exit(2);
            t.exit(3);
            assert!(!t.any());
            t.enter(3);
            assert_eq!(t.find(map.all(), 0, &ANY), Some(3));
            assert_eq!(t.check_consistent().unwrap(), 1);
        }
    }

    #[test]
    fn concurrent_enter_exit_keeps_counts_exact() {
        let map = TopoMap::new(&hand_topo(1, 2, 2, 2)).unwrap(); // 2 LLCs of 4
        for per_llc in [false, true] {
            let t = std::sync::Arc::new(IdleTracker::new(&map, per_llc, false));
            let hs: Vec<_> = (0..8u32)
                .map(|c| {
                    let t = t.clone();
                    std::thread::spawn(move || {
                        for i in 0..5_000 {
                            t.enter(c);
                            if i % 7 == 0 {
                                std::thread::yield_now();
                            }
                            t.exit(c);
                        }
                        if c % 3 == 0 {
                            t.enter(c);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(t.check_consistent().unwrap(), 3, "CPUs 0, 3, 6 stay idle");
            assert!(t.any());
        }
    }
}
