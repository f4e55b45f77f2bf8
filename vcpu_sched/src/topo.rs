//! The scheduler's precomputed view of a topology: for every CPU its L2,
//! LLC and node, and the CPU set of every L2, LLC and node, so that the hot
//! paths index arrays and intersect masks and never search.

use topology::HostTopology;

use crate::cpumask::{CpuMask, MAX_CPUS};
use crate::error::{Result, SchedError};
use crate::task::CpuId;

/// Dense per-CPU indices and per-level CPU masks of one topology.
#[derive(Clone, Debug)]
pub struct TopoMap {
    ncpus: usize,
    all: CpuMask,
    cpu_l2: Vec<u32>,
    cpu_llc: Vec<u32>,
    cpu_node: Vec<u32>,
    l2_span: Vec<CpuMask>,
    llc_span: Vec<CpuMask>,
    node_span: Vec<CpuMask>,
    llc_cpus: Vec<Vec<u32>>,
    node_llcs: Vec<Vec<u32>>,
    /// Nodes with at least one CPU, in index order.
    cpu_nodes: Vec<u32>,
}

impl TopoMap {
    /// Builds the view. Fails if the topology has more than [`MAX_CPUS`] CPUs.
    pub fn new(t: &HostTopology) -> Result<Self> {
        let n = t.num_cpus();
        if n > MAX_CPUS {
            return Err(SchedError::TooManyCpus {
                cpus: n,
                max: MAX_CPUS,
            });
        }
        let span = |cpus: &[u32]| CpuMask::from_cpus(cpus.iter().copied());
        let cpu_nodes: Vec<u32> = (0..t.num_nodes() as u32)
            .filter(|&nd| !t.cpus_of_node(nd).is_empty())
            .collect();
        Ok(Self {
            ncpus: n,
            all: CpuMask::first_n(n),
            cpu_l2: (0..n as u32).map(|c| t.l2_of(c)).collect(),
            cpu_llc: (0..n as u32).map(|c| t.llc_of(c)).collect(),
            cpu_node: (0..n as u32).map(|c| t.node_of(c)).collect(),
            l2_span: (0..t.num_l2s() as u32)
                .map(|i| span(t.cpus_of_l2(i)))
                .collect(),
            llc_span: (0..t.num_llcs() as u32)
                .map(|i| span(t.cpus_of_llc(i)))
                .collect(),
            node_span: (0..t.num_nodes() as u32)
                .map(|i| span(t.cpus_of_node(i)))
                .collect(),
            llc_cpus: (0..t.num_llcs() as u32)
                .map(|i| t.cpus_of_llc(i).to_vec())
                .collect(),
            node_llcs: (0..t.num_nodes() as u32)
                .map(|i| t.llcs_of_node(i).to_vec())
                .collect(),
            cpu_nodes,
        })
    }

    /// Number of CPUs.
    #[inline]
    pub fn ncpus(&self) -> usize {
        self.ncpus
    }
    /// Every CPU.
    #[inline]
    pub fn all(&self) -> &CpuMask {
        &self.all
    }
    /// Number of LLCs.
    #[inline]
    pub fn nllcs(&self) -> usize {
        self.llc_span.len()
    }
    /// Number of NUMA nodes (including ones without CPUs).
    #[inline]
    pub fn nnodes(&self) -> usize {
        self.node_span.len()
    }
    /// Nodes that have CPUs.
    #[inline]
    pub fn cpu_nodes(&self) -> &[u32] {
        &self.cpu_nodes
    }
    /// L2 of `cpu`.
    #[inline]
    pub fn l2_of(&self, cpu: CpuId) -> u32 {
        self.cpu_l2[cpu as usize]
    }
    /// LLC of `cpu`.
    #[inline]
    pub fn llc_of(&self, cpu: CpuId) -> u32 {
        self.cpu_llc[cpu as usize]
    }
    /// Node of `cpu`.
    #[inline]
    pub fn node_of(&self, cpu: CpuId) -> u32 {
        self.cpu_node[cpu as usize]
    }
    /// CPUs of L2 `l2`.
    #[inline]
    pub fn l2_span(&self, l2: u32) -> &CpuMask {
        &self.l2_span[l2 as usize]
    }
    /// CPUs of LLC `llc`.
    #[inline]
    pub fn llc_span(&self, llc: u32) -> &CpuMask {
        &self.llc_span[llc as usize]
    }
    /// CPUs of node `node`.
    #[inline]
    pub fn node_span(&self, node: u32) -> &CpuMask {
        &self.node_span[node as usize]
    }
    /// CPUs of LLC `llc`, in order.
    #[inline]
    pub fn llc_cpus(&self, llc: u32) -> &[u32] {
        &self.llc_cpus[llc as usize]
    }
    /// LLCs of node `node`.
    #[inline]
    pub fn node_llcs(&self, node: u32) -> &[u32] {
        &self.node_llcs[node as usize]
    }
    /// Do `a` and `b` share an L2?
    #[inline]
    pub fn share_l2(&self, a: CpuId, b: CpuId) -> bool {
        self.cpu_l2[a as usize] == self.cpu_l2[b as usize]
    }
    /// Do `a` and `b` share an LLC?
    #[inline]
    pub fn share_llc(&self, a: CpuId, b: CpuId) -> bool {
        self.cpu_llc[a as usize] == self.cpu_llc[b as usize]
    }

    /// The CPU of `mask` closest to `near`: `near` itself, then its L2, LLC,
    /// node, then the first one after `near` (wrapping, to spread load).
    pub fn closest(&self, mask: &CpuMask, near: CpuId) -> Option<CpuId> {
        if mask.contains(near) {
            return Some(near);
        }
        for level in [
            self.l2_span(self.l2_of(near)),
            self.llc_span(self.llc_of(near)),
            self.node_span(self.node_of(near)),
        ] {
            if let Some(c) = mask.and(level).next_wrapping(near) {
                return Some(c);
            }
        }
        mask.next_wrapping(near)
    }
}

#[cfg(all(test, not(loom), not(sim)))]
pub(crate) mod tests {
    use super::*;
    use topology::host::{Caches, NodeInfo, RawCpu};

    /// `packages` x `llcs` x `l2s` x `threads` CPUs, one node per package,
    /// built by hand (no hwloc) for fast unit tests.
    pub(crate) fn hand_topo(packages: u32, llcs: u32, l2s: u32, threads: u32) -> HostTopology {
        let mut raw = Vec::new();
        let per_pkg = llcs * l2s * threads;
        for i in 0..packages * per_pkg {
            let core = (i / threads) as u64;
            raw.push(RawCpu {
                os_index: i,
                core,
                l2: core,
                llc: (i / (l2s * threads)) as u64,
                die: (i / per_pkg) as u64,
                node: i / per_pkg,
                package: (i / per_pkg) as u64,
            });
        }
        let nodes = (0..packages)
            .map(|n| NodeInfo {
                os_index: n,
                memory: 0,
            })
            .collect();
        HostTopology::from_raw("hand", &raw, nodes, None, Caches::default()).unwrap()
    }

    #[test]
    fn spans_and_closest() {
        let t = hand_topo(2, 2, 2, 2); // 16 CPUs, LLC of 4, L2 of 2
        let m = TopoMap::new(&t).unwrap();
        assert_eq!(m.ncpus(), 16);
        assert_eq!(m.nllcs(), 4);
        assert_eq!(m.llc_span(1).to_string(), "4-7");
        assert_eq!(m.node_span(1).to_string(), "8-15");
        assert_eq!(m.l2_span(m.l2_of(5)).to_string(), "4-5");
        assert!(m.share_l2(4, 5) && !m.share_l2(5, 6) && m.share_llc(5, 6));
        let mask: CpuMask = "2,7,9,14".parse().unwrap();
        assert_eq!(m.closest(&mask, 7), Some(7));
        assert_eq!(m.closest(&mask, 6), Some(7), "same L2 first");
        assert_eq!(m.closest(&mask, 4), Some(7), "then the LLC");
        assert_eq!(m.closest(&mask, 0), Some(2));
        assert_eq!(
            m.closest(&"9".parse().unwrap(), 0),
            Some(9),
            "then anywhere"
        );
        assert_eq!(m.closest(&CpuMask::empty(), 0), None);
        assert_eq!(m.cpu_nodes(), &[0, 1]);
    }
}
