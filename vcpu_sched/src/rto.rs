//! RT overload tracking ("rto"): which CPUs have RT tasks waiting that
//! could run elsewhere. A CPU that lowers its priority looks here to pull
//! such a task; a CPU that has none skips the whole pull on one load.
//!
//! A CPU enters and leaves the set under its own runqueue lock. The mask bit
//! is set before the count goes up and cleared after it goes down, so that a
//! reader that sees a non-zero count finds the CPU in the mask.
//!
//! Two layouts, chosen by fix 2 ([`crate::fixes::rto`]):
//! [`FlatRootDomain`], the baseline, and [`NodeRto`].

use crate::sync::shared::{AtomicU32, Ordering};

pub use crate::cpumask::CpuMaskList;
use crate::cpumask::{AtomicCpuMask, CpuMask};
pub use crate::fixes::rto::{NodeRto, RootDomainRead, RtoNodeCount, RtoNodeFlag, RtoNodeMask};
use crate::task::CpuId;
use crate::topo::TopoMap;

/// The baseline root domain: the overload count and mask sit in one block
/// with the read-mostly span, as in Linux's `struct root_domain`, so every
/// update dirties the line that every pull reads.
#[repr(C, align(128))]
pub struct FlatRootDomain {
    pub(crate) rto_count: AtomicU32,
    pub(crate) nr_cpus: u32,
    pub(crate) span: CpuMask,
    pub(crate) rto_mask: AtomicCpuMask,
}

impl FlatRootDomain {
    /// An empty overload set over `map`'s CPUs.
    pub fn new(map: &TopoMap) -> Self {
        Self {
            rto_count: AtomicU32::new(0),
            nr_cpus: map.ncpus() as u32,
            span: *map.all(),
            rto_mask: AtomicCpuMask::new(),
        }
    }
}

/// RT overload tracking in either layout.
pub enum RtOverload {
    /// Baseline.
    Flat(Box<FlatRootDomain>),
    /// Fix 2.
    PerNode(Box<NodeRto>),
}

impl RtOverload {
    /// Builds the layout fix 2 asks for.
    pub fn new(map: &TopoMap, per_node: bool) -> Self {
        if per_node {
            RtOverload::PerNode(Box::new(NodeRto::new(map)))
        } else {
            RtOverload::Flat(Box::new(FlatRootDomain::new(map)))
        }
    }

    /// `cpu` now has pushable RT tasks waiting.
    #[inline]
    pub fn set(&self, cpu: CpuId) {
        match self {
            RtOverload::Flat(f) => {
                f.rto_mask.set(cpu, Ordering::Relaxed);
                f.rto_count.fetch_add(1, Ordering::AcqRel);
            }
            RtOverload::PerNode(n) => n.set(cpu),
        }
    }

    /// `cpu` no longer has pushable RT tasks waiting.
    #[inline]
    pub fn clear(&self, cpu: CpuId) {
        match self {
            RtOverload::Flat(f) => {
                f.rto_count.fetch_sub(1, Ordering::AcqRel);
                f.rto_mask.clear(cpu, Ordering::Release);
            }
            RtOverload::PerNode(n) => n.clear(cpu),
        }
    }

    /// Is any CPU overloaded? One load (baseline) or one load per node of a
    /// read-mostly flag (fix).
    #[inline]
    pub fn overloaded(&self) -> bool {
        match self {
            RtOverload::Flat(f) => f.rto_count.load(Ordering::Acquire) != 0,
            RtOverload::PerNode(n) => n.overloaded(),
        }
    }

    /// The overloaded CPUs, `prefer_node`'s first (fix) or in one mask
    /// (baseline), restricted to the root domain's span.
    pub fn candidates(&self, prefer_node: u32) -> CpuMaskList {
        match self {
            RtOverload::Flat(f) => {
                let mut l = CpuMaskList::default();
                if f.rto_count.load(Ordering::Acquire) != 0 && f.nr_cpus > 0 {
                    l.push(f.rto_mask.and(&f.span, Ordering::Acquire));
                }
                l
            }
            RtOverload::PerNode(n) => n.candidates(prefer_node),
        }
    }

    /// Total count (for the invariant checker).
    pub fn count(&self) -> u32 {
        match self {
            RtOverload::Flat(f) => f.rto_count.load(Ordering::Relaxed),
            RtOverload::PerNode(n) => n.count(),
        }
    }

    /// How many overload counters there are: 1 in the baseline, one per
    /// NUMA node with fix 2 (for tests that check which layout was built).
    #[doc(hidden)]
    pub fn counters(&self) -> usize {
        match self {
            RtOverload::Flat(_) => 1,
            RtOverload::PerNode(n) => n.nodes(),
        }
    }

    /// All overloaded CPUs (for the invariant checker).
    pub fn mask(&self) -> CpuMask {
        match self {
            RtOverload::Flat(f) => f.rto_mask.load(Ordering::Relaxed),
            RtOverload::PerNode(n) => n.mask(),
        }
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use crate::topo::tests::hand_topo;

    #[test]
    fn both_layouts_track_the_same_set() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        for per_node in [false, true] {
            let r = RtOverload::new(&map, per_node);
            assert!(!r.overloaded());
            assert!(r.candidates(0).is_empty());
            r.set(3);
            r.set(12);
            assert!(r.overloaded());
            assert_eq!(r.count(), 2);
            assert_eq!(r.mask().to_string(), "3,12");
            let c: Vec<u32> = r.candidates(1).iter().collect();
            if per_node {
                assert_eq!(c, vec![12, 3], "own node first");
            } else {
                assert_eq!(c, vec![3, 12]);
            }
            r.clear(3);
            assert!(r.overloaded());
            r.clear(12);
            assert!(!r.overloaded(), "per_node={per_node}");
            assert_eq!(r.count(), 0);
            assert!(r.mask().is_empty());
        }
    }

    #[test]
    fn flag_follows_the_count_under_concurrency() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        let r = std::sync::Arc::new(RtOverload::new(&map, true));
        let hs: Vec<_> = [1u32, 2, 9, 10]
            .into_iter()
            .map(|cpu| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        r.set(cpu);
                        r.clear(cpu);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(!r.overloaded(), "a node flag stayed set with a zero count");
        r.set(9);
        assert!(r.overloaded());
    }
}
