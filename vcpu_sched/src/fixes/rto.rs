//! Fix 2: per-node RT overload tracking.
//!
//! WHAT: The RT overload count and flag are kept per NUMA node
//! ([`RtoNodeCount`], [`RtoNodeFlag`], [`RtoNodeMask`]), and the read-mostly
//! part of the root domain ([`RootDomainRead`]) sits on lines of its own,
//! away from anything that is written.
//!
//! WHY: Every RT enqueue or dequeue that changes a CPU's overload state
//! writes the global `rto_count`, and every CPU that lowers its priority
//! reads it to decide whether to pull. On a 2-socket machine running many RT
//! tasks that line crosses the sockets constantly, and it shares a line with
//! fields every pull reads. The kernel patch measured stress-ng cyclic +50%.
//!
//! HOW: A CPU only writes its own node's count and mask. The node's
//! overloaded flag changes only when the node count goes 0->1 or 1->0, so
//! the flags stay read-mostly; a reader checks the flags (one shared line
//! per node) and walks overloaded nodes, its own first. The flag is
//! re-derived after each transition so that racing 0->1 and 1->0 updates
//! cannot leave it stale. With one node this is the baseline with padding.

use crate::sync::shared::{AtomicBool, AtomicU32, Ordering};

use crate::cpumask::{AtomicCpuMask, CpuMask, CpuMaskList};
use crate::task::CpuId;
use crate::topo::TopoMap;

/// The read-mostly part of the root domain, on lines of its own.
#[repr(align(128))]
pub struct RootDomainRead {
    pub(crate) nr_cpus: u32,
    pub(crate) span: CpuMask,
}

/// One node's overload count: written by the node's CPUs only.
#[repr(align(128))]
pub struct RtoNodeCount {
    pub(crate) count: AtomicU32,
}

/// One node's overloaded flag: written only on 0<->1 transitions.
#[repr(align(128))]
pub struct RtoNodeFlag {
    pub(crate) overloaded: AtomicBool,
}

/// One node's overloaded CPUs.
#[repr(align(128))]
pub struct RtoNodeMask {
    pub(crate) mask: AtomicCpuMask,
}

/// Per-node overload tracking.
pub struct NodeRto {
    pub(crate) read: RootDomainRead,
    pub(crate) counts: Box<[RtoNodeCount]>,
    pub(crate) flags: Box<[RtoNodeFlag]>,
    pub(crate) masks: Box<[RtoNodeMask]>,
    /// Per-node spans, indexed by node.
    spans: Box<[CpuMask]>,
    node_of: Box<[u32]>,
}

impl NodeRto {
    /// An empty set over `map`'s CPUs.
    pub fn new(map: &TopoMap) -> Self {
        let n = map.nnodes().max(1);
        Self {
            read: RootDomainRead {
                nr_cpus: map.ncpus() as u32,
                span: *map.all(),
            },
            counts: (0..n)
                .map(|_| RtoNodeCount {
                    count: AtomicU32::new(0),
                })
                .collect(),
            flags: (0..n)
                .map(|_| RtoNodeFlag {
                    overloaded: AtomicBool::new(false),
                })
                .collect(),
            masks: (0..n)
                .map(|_| RtoNodeMask {
                    mask: AtomicCpuMask::new(),
                })
                .collect(),
            spans: (0..n as u32).map(|i| *map.node_span(i)).collect(),
            node_of: (0..map.ncpus() as u32).map(|c| map.node_of(c)).collect(),
        }
    }

    fn refresh_flag(&self, node: usize) {
        loop {
            let want = self.counts[node].count.load(Ordering::SeqCst) != 0;
            self.flags[node].overloaded.store(want, Ordering::SeqCst);
            if (self.counts[node].count.load(Ordering::SeqCst) != 0) == want {
                return;
            }
        }
    }

    pub(crate) fn set(&self, cpu: CpuId) {
        let n = self.node_of[cpu as usize] as usize;
        self.masks[n].mask.set(cpu, Ordering::Relaxed);
        if self.counts[n].count.fetch_add(1, Ordering::SeqCst) == 0 {
            self.refresh_flag(n);
        }
    }

    pub(crate) fn clear(&self, cpu: CpuId) {
        let n = self.node_of[cpu as usize] as usize;
        if self.counts[n].count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.refresh_flag(n);
        }
        self.masks[n].mask.clear(cpu, Ordering::Release);
    }

    pub(crate) fn overloaded(&self) -> bool {
        self.flags
            .iter()
            .any(|f| f.overloaded.load(Ordering::Acquire))
    }

    pub(crate) fn candidates(&self, prefer_node: u32) -> CpuMaskList {
        let mut l = CpuMaskList::default();
        let n = self.flags.len();
        let first = (prefer_node as usize).min(n - 1);
        for k in 0..n {
            let i = (first + k) % n;
            if !self.flags[i].overloaded.load(Ordering::Acquire) {
                continue;
            }
            let within = self.spans[i].and(&self.read.span);
            l.push(self.masks[i].mask.and(&within, Ordering::Acquire));
        }
        l
    }

    pub(crate) fn count(&self) -> u32 {
        self.counts
            .iter()
            .map(|c| c.count.load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn mask(&self) -> CpuMask {
        self.masks.iter().fold(CpuMask::empty(), |m, x| {
            m.or(&x.mask.load(Ordering::Relaxed))
        })
    }

    /// Nodes with a counter of their own.
    pub fn nodes(&self) -> usize {
        self.counts.len()
    }

    /// CPUs in the root domain.
    pub fn nr_cpus(&self) -> u32 {
        self.read.nr_cpus
    }
}
