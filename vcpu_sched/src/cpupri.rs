//! cpupri: for each priority level, which CPUs currently run at it, so that
//! an RT task can find the lowest-priority CPU it may run on without looking
//! at every runqueue.
//!
//! Levels are the cpupri indices of [`crate::task`]: 1 for a CPU that runs
//! a fair task or nothing, and 2..=100 for RT priorities 1..=99. An idle
//! CPU registers at the fair level ([`level`]), as in Linux since v5.10
//! (Dietmar Eggemann, "sched/cpupri: Remove pri_to_cpu\[CPUPRI_IDLE\]",
//! 2020): RT placement gains nothing from telling idle from fair CPUs
//! apart that the idle tracker cannot tell it more cheaply, and with a
//! separate idle level every idle entry and exit of every CPU, RT or not,
//! wrote two levels' shared counts and masks. Now cpupri is written only
//! when a CPU's RT level changes. Each level has a count of CPUs and a
//! mask of them. A CPU moves between levels under its own runqueue lock;
//! readers hold no lock and treat the answer as a hint that the caller
//! re-checks under the target's lock.
//!
//! Ordering, as in Linux: a CPU is added to the new level's mask before the
//! level's count goes up, and leaves the old level's count before its mask.
//! A reader loads the count first: a non-zero count then guarantees the
//! mask bits that made it non-zero are visible. A reader can miss a CPU in
//! flight, which is harmless: the pusher retries, and a pull from the other
//! side catches it.
//!
//! Two layouts, chosen by fix 1 ([`crate::fixes::cpupri`]):
//! [`FlatCpuPri`], the baseline, and [`SplitCpuPri`].

use crate::sync::shared::{AtomicU32, Ordering};

use crate::cpumask::{AtomicCpuMask, CpuMask};
pub use crate::fixes::cpupri::{CpuPriCount, CpuPriMask, CpuPriSlot, SplitCpuPri};
use crate::task::{CpuId, NR_PRI, PRI_FAIR};
use crate::topo::TopoMap;

/// The cpupri level a CPU registers at when its runqueue runs at `pri`
/// (a [`crate::task`] priority index): idle ([`crate::task::PRI_IDLE`])
/// and fair CPUs share [`PRI_FAIR`], the lowest level.
#[inline]
pub const fn level(pri: u32) -> u32 {
    if pri < PRI_FAIR {
        PRI_FAIR
    } else {
        pri
    }
}

/// One level of the baseline layout: count and mask side by side, levels
/// packed one after the other, as Linux's `struct cpupri_vec` array was.
#[repr(C)]
pub struct FlatVec {
    pub(crate) count: AtomicU32,
    pub(crate) mask: AtomicCpuMask,
}

/// The baseline layout: counts, masks and neighbouring levels share cache
/// lines, and `cpu_to_pri` is one packed array that every CPU writes.
pub struct FlatCpuPri {
    pub(crate) vecs: Box<[FlatVec]>,
    pub(crate) cpu_to_pri: Box<[AtomicU32]>,
}

impl FlatCpuPri {
    /// Every CPU of `map` starts idle (at the fair level).
    pub fn new(map: &TopoMap) -> Self {
        let vecs: Box<[FlatVec]> = (0..NR_PRI)
            .map(|_| FlatVec {
                count: AtomicU32::new(0),
                mask: AtomicCpuMask::new(),
            })
            .collect();
        for c in map.all().iter() {
            vecs[PRI_FAIR as usize].mask.set(c, Ordering::Relaxed);
        }
        vecs[PRI_FAIR as usize]
            .count
            .store(map.ncpus() as u32, Ordering::Relaxed);
        Self {
            vecs,
            cpu_to_pri: (0..map.ncpus()).map(|_| AtomicU32::new(PRI_FAIR)).collect(),
        }
    }

    fn set(&self, cpu: CpuId, pri: u32) {
        let old = self.cpu_to_pri[cpu as usize].load(Ordering::Relaxed);
        if old == pri {
            return;
        }
        let new = &self.vecs[pri as usize];
        new.mask.set(cpu, Ordering::Relaxed);
        new.count.fetch_add(1, Ordering::AcqRel);
        let o = &self.vecs[old as usize];
        o.count.fetch_sub(1, Ordering::AcqRel);
        o.mask.clear(cpu, Ordering::Release);
        self.cpu_to_pri[cpu as usize].store(pri, Ordering::Relaxed);
    }

    fn find(&self, task_pri: u32, allowed: &CpuMask) -> Option<CpuMask> {
        let below = (task_pri as usize).max(PRI_FAIR as usize);
        for v in &self.vecs[PRI_FAIR as usize..below] {
            if v.count.load(Ordering::Acquire) == 0 {
                continue;
            }
            let m = v.mask.and(allowed, Ordering::Acquire);
            if !m.is_empty() {
                return Some(m);
            }
        }
        None
    }
}

/// cpupri in either layout.
pub enum CpuPri {
    /// Baseline.
    Flat(FlatCpuPri),
    /// Fix 1.
    Split(SplitCpuPri),
}

impl CpuPri {
    /// Builds the layout fix 1 asks for; `node_masks` also splits the masks
    /// per NUMA node (ignored with one node, where it would only add work).
    pub fn new(map: &TopoMap, split: bool, node_masks: bool) -> Self {
        if split {
            CpuPri::Split(SplitCpuPri::new(map, node_masks))
        } else {
            CpuPri::Flat(FlatCpuPri::new(map))
        }
    }

    /// Moves `cpu` to the level of priority index `pri` ([`level`]: idle
    /// registers as fair). Only `cpu`'s runqueue-lock holder calls this;
    /// callers that know the old index skip calls that keep the level.
    #[inline]
    pub fn set(&self, cpu: CpuId, pri: u32) {
        let pri = level(pri);
        match self {
            CpuPri::Flat(f) => f.set(cpu, pri),
            CpuPri::Split(s) => s.set(cpu, pri),
        }
    }

    /// The level `cpu` is registered at ([`level`] of what it runs).
    pub fn get(&self, cpu: CpuId) -> u32 {
        match self {
            CpuPri::Flat(f) => f.cpu_to_pri[cpu as usize].load(Ordering::Relaxed),
            CpuPri::Split(s) => s.get(cpu),
        }
    }

    /// The CPUs of `allowed` at the lowest level below `task_pri` that has
    /// any; `None` if every allowed CPU runs at `task_pri` or above. With
    /// per-node masks the answer is limited to one node, `prefer_node` first.
    #[inline]
    pub fn find(&self, task_pri: u32, allowed: &CpuMask, prefer_node: u32) -> Option<CpuMask> {
        match self {
            CpuPri::Flat(f) => f.find(task_pri, allowed),
            CpuPri::Split(s) => s.find(task_pri, allowed, prefer_node),
        }
    }

    /// The count of level `pri` (for the invariant checker).
    pub fn count(&self, pri: u32) -> u32 {
        match self {
            CpuPri::Flat(f) => f.vecs[pri as usize].count.load(Ordering::Relaxed),
            CpuPri::Split(s) => s.count(pri),
        }
    }

    /// The mask of level `pri` (for the invariant checker).
    pub fn mask(&self, pri: u32) -> CpuMask {
        match self {
            CpuPri::Flat(f) => f.vecs[pri as usize].mask.load(Ordering::Relaxed),
            CpuPri::Split(s) => s.mask(pri),
        }
    }

    /// The addresses of level `pri`'s count and of its (first) mask, for
    /// tests that check which layout was built: the baseline keeps them on
    /// one cache line, fix 1 on separate [`crate::CACHE_PAD`] blocks.
    #[doc(hidden)]
    pub fn level_addrs(&self, pri: u32) -> (usize, usize) {
        match self {
            CpuPri::Flat(f) => {
                let v = &f.vecs[pri as usize];
                (&v.count as *const _ as usize, &v.mask as *const _ as usize)
            }
            CpuPri::Split(s) => s.level_addrs(pri),
        }
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use crate::task::{Policy, PRI_IDLE};
    use crate::topo::tests::hand_topo;

    fn each_layout(f: impl Fn(&CpuPri, &TopoMap)) {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        for (split, nodes) in [(false, false), (true, false), (true, true)] {
            f(&CpuPri::new(&map, split, nodes), &map);
        }
    }

    #[test]
    fn all_idle_at_start_on_the_fair_level() {
        each_layout(|cp, map| {
            assert_eq!(cp.count(PRI_FAIR), 16);
            assert_eq!(cp.mask(PRI_FAIR), *map.all());
            assert_eq!(cp.count(PRI_IDLE), 0, "no idle level (Linux >= 5.10)");
            assert_eq!(cp.get(5), PRI_FAIR);
            let p99 = Policy::Fifo(99).pri_idx();
            assert!(cp.find(p99, map.all(), 0).unwrap().count() > 0);
            // nothing is below the fair level: a fair or idle search finds
            // nothing (it could not preempt anything anyway)
            assert!(cp.find(PRI_FAIR, map.all(), 0).is_none());
            assert!(cp.find(PRI_IDLE, map.all(), 0).is_none());
        });
    }

    #[test]
    fn idle_and_fair_share_one_level() {
        each_layout(|cp, map| {
            cp.set(4, Policy::Fifo(20).pri_idx());
            cp.set(4, PRI_IDLE);
            assert_eq!(cp.get(4), PRI_FAIR);
            cp.set(6, PRI_FAIR);
            assert_eq!(cp.count(PRI_FAIR), 16);
            assert_eq!(cp.mask(PRI_FAIR), *map.all());
            assert_eq!(level(PRI_IDLE), PRI_FAIR);
            assert_eq!(level(PRI_FAIR), PRI_FAIR);
            assert_eq!(level(7), 7);
        });
    }

    #[test]
    fn finds_lowest_allowed_level() {
        each_layout(|cp, map| {
            // everybody runs RT 50 except CPU 3 (fair) and CPU 12 (RT 10)
            for c in map.all().iter() {
                cp.set(c, Policy::Fifo(50).pri_idx());
            }
            cp.set(3, PRI_FAIR);
            cp.set(12, Policy::Fifo(10).pri_idx());
            assert_eq!(cp.count(PRI_FAIR), 1);
            assert_eq!(cp.count(Policy::Fifo(50).pri_idx()), 14);
            let p99 = Policy::Fifo(99).pri_idx();
            assert_eq!(cp.find(p99, map.all(), 0).unwrap().to_string(), "3");
            let not3 = map.all().and_not(&CpuMask::single(3));
            assert_eq!(cp.find(p99, &not3, 1).unwrap().to_string(), "12");
            // prio 50 cannot preempt prio 50; prio 1 finds nothing at all
            let only_50s = not3.and_not(&CpuMask::single(12));
            assert!(cp.find(Policy::Fifo(50).pri_idx(), &only_50s, 0).is_none());
            assert!(cp.find(Policy::Fifo(1).pri_idx(), &only_50s, 0).is_none());
            // prio 99 against prio 1: a CPU at RT 1 is found by an RT 99 task
            cp.set(7, Policy::Fifo(1).pri_idx());
            assert_eq!(cp.find(p99, &only_50s, 0).unwrap().to_string(), "7");
            assert_eq!(cp.get(7), Policy::Fifo(1).pri_idx());
            // back to idle restores the start
            for c in map.all().iter() {
                cp.set(c, PRI_IDLE);
            }
            assert_eq!(cp.count(PRI_FAIR), 16);
            for p in (0..NR_PRI as u32).filter(|&p| p != PRI_FAIR) {
                assert_eq!(cp.count(p), 0);
                assert!(cp.mask(p).is_empty());
            }
        });
    }

    #[test]
    fn node_split_prefers_the_given_node() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        let rt50 = Policy::Fifo(50).pri_idx();
        let cp = CpuPri::new(&map, true, true);
        for c in map.all().iter() {
            cp.set(c, rt50);
        }
        cp.set(2, PRI_IDLE);
        cp.set(9, PRI_FAIR);
        let p = Policy::Fifo(55).pri_idx();
        assert_eq!(cp.find(p, map.all(), 0).unwrap().to_string(), "2");
        assert_eq!(cp.find(p, map.all(), 1).unwrap().to_string(), "9");
        // flat returns both nodes' lowest CPUs
        let flat = CpuPri::new(&map, false, false);
        for c in map.all().iter() {
            flat.set(c, rt50);
        }
        flat.set(2, PRI_IDLE);
        flat.set(9, PRI_FAIR);
        assert_eq!(flat.find(p, map.all(), 1).unwrap().to_string(), "2,9");
    }
}
