//! Per-group load tracking: the summed weight of each group's runnable
//! tasks (for the VMM, each VM's demand for CPU). It is updated when tasks
//! become runnable or stop, and when a runnable task migrates between CPUs.
//! Reports and placement read it.
//!
//! The baseline ([`GroupSum`]) is one counter per group that every CPU
//! running the group's tasks updates, and a migration subtracts from it and
//! adds back, as Linux's `tg->load_avg` is updated on detach and attach.
//! Fix 6 ([`crate::fixes::grpload`]) keeps it per node.

use crate::sync::shared::{AtomicI64, Ordering};

pub use crate::fixes::grpload::NodeLoad;
use crate::task::CpuId;
use crate::topo::TopoMap;

/// One group's load, alone on its lines.
#[repr(align(128))]
pub struct GroupSum {
    pub(crate) load: AtomicI64,
}

/// Group load in either layout.
pub enum GroupLoad {
    /// Baseline: one shared sum per group.
    Shared(Box<[GroupSum]>),
    /// Fix 6: one sum per group and node.
    PerNode {
        /// Nodes per group.
        nodes: usize,
        /// `groups * nodes` sums, group-major.
        loads: Box<[NodeLoad]>,
        /// Node of each CPU.
        node_of: Box<[u32]>,
    },
}

impl GroupLoad {
    /// Room for `groups` groups; fix 6 if `per_node`.
    pub fn new(map: &TopoMap, groups: usize, per_node: bool) -> Self {
        if per_node {
            let nodes = map.nnodes().max(1);
            GroupLoad::PerNode {
                nodes,
                loads: (0..groups * nodes).map(|_| NodeLoad::new()).collect(),
                node_of: (0..map.ncpus() as u32).map(|c| map.node_of(c)).collect(),
            }
        } else {
            GroupLoad::Shared(
                (0..groups)
                    .map(|_| GroupSum {
                        load: AtomicI64::new(0),
                    })
                    .collect(),
            )
        }
    }

    #[inline]
    fn slot(&self, group: u32, cpu: CpuId) -> &AtomicI64 {
        match self {
            GroupLoad::Shared(s) => &s[group as usize].load,
            GroupLoad::PerNode {
                nodes,
                loads,
                node_of,
            } => &loads[group as usize * nodes + node_of[cpu as usize] as usize].load,
        }
    }

    /// A task of `group` with weight `w` became runnable on `cpu`.
    #[inline]
    pub fn add(&self, group: u32, cpu: CpuId, w: u32) {
        self.slot(group, cpu).fetch_add(w as i64, Ordering::Relaxed);
    }

    /// A task of `group` with weight `w` stopped being runnable on `cpu`.
    #[inline]
    pub fn sub(&self, group: u32, cpu: CpuId, w: u32) {
        self.slot(group, cpu).fetch_sub(w as i64, Ordering::Relaxed);
    }

    /// A runnable task of `group` moved from `from` to `to`. Returns whether
    /// any shared counter was written.
    #[inline]
    pub fn migrate(&self, group: u32, from: CpuId, to: CpuId, w: u32) -> bool {
        match self {
            GroupLoad::Shared(_) => {
                // detach, then attach: two updates of the same shared line
                self.sub(group, from, w);
                self.add(group, to, w);
                true
            }
            GroupLoad::PerNode { node_of, .. } => {
                if node_of[from as usize] == node_of[to as usize] {
                    return false;
                }
                self.sub(group, from, w);
                self.add(group, to, w);
                true
            }
        }
    }

    /// The group's total load.
    pub fn total(&self, group: u32) -> i64 {
        match self {
            GroupLoad::Shared(s) => s[group as usize].load.load(Ordering::Relaxed),
            GroupLoad::PerNode { nodes, loads, .. } => loads
                [group as usize * nodes..(group as usize + 1) * nodes]
                .iter()
                .map(|l| l.load.load(Ordering::Relaxed))
                .sum(),
        }
    }

    /// The group's load per node (one entry in the baseline).
    pub fn per_node(&self, group: u32) -> Vec<i64> {
        match self {
            GroupLoad::Shared(_) => vec![self.total(group)],
            GroupLoad::PerNode { nodes, loads, .. } => loads
                [group as usize * nodes..(group as usize + 1) * nodes]
                .iter()
                .map(|l| l.load.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use crate::topo::tests::hand_topo;

    #[test]
    fn totals_agree_and_fix_skips_node_local_migrations() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        for per_node in [false, true] {
            let g = GroupLoad::new(&map, 4, per_node);
            assert_eq!(g.total(3), 0);
            g.add(3, 0, 1024);
            g.add(3, 9, 512);
            assert_eq!(g.total(3), 1536);
            // inside node 0
            assert_eq!(g.migrate(3, 0, 5, 1024), !per_node);
            assert_eq!(g.total(3), 1536);
            // across nodes
            assert!(g.migrate(3, 5, 12, 1024));
            assert_eq!(g.total(3), 1536);
            if per_node {
                assert_eq!(g.per_node(3), vec![0, 1536]);
            }
            g.sub(3, 12, 1024);
            g.sub(3, 9, 512);
            assert_eq!(g.total(3), 0);
            assert_eq!(g.total(2), 0, "groups are independent");
        }
    }
}
