//! Fix 1: split cpupri vectors.
//!
//! WHAT: Each cpupri level's count and mask live on cache lines of their
//! own ([`CpuPriCount`], [`CpuPriMask`]), every level is padded away from
//! its neighbours, each CPU's current level sits on its own line
//! ([`CpuPriSlot`]), and, when the machine has several NUMA nodes, each
//! level's mask is split into one mask per node.
//!
//! WHY: In the packed layout a CPU that changes level writes the count of
//! two levels; every RT wakeup on every other CPU reads those counts and
//! the masks next to them. With hundreds of CPUs the lines holding the
//! lowest (fair and idle) and busy RT levels bounce between all cores and
//! both sockets whenever RT tasks start and stop. The
//! kernel patch that split them measured FFmpeg +11%, stress-ng cyclic +31%
//! and pi_stress +76% on 2-socket machines.
//!
//! HOW: Counts and masks are separate `#[repr(align(128))]` arrays (128
//! bytes, because x86's adjacent-line prefetcher pulls 64-byte lines in
//! pairs: 64-byte padding still lets neighbours fight). A CPU writes its
//! node's mask only, so mask writes stay on one socket; readers look at the
//! preferred node first. With one node the split collapses to one mask per
//! level. The gain needs many concurrent writers: on 2 cores the extra lines
//! cost more than the sharing they avoid.

use crate::sync::shared::{AtomicU32, Ordering};

use crate::cpumask::{AtomicCpuMask, CpuMask};
use crate::task::{CpuId, NR_PRI, PRI_FAIR};
use crate::topo::TopoMap;

/// A level's CPU count, alone on its cache lines.
#[repr(align(128))]
pub struct CpuPriCount {
    pub(crate) count: AtomicU32,
}

/// A level's CPU mask (or one node's part of it), alone on its cache lines.
#[repr(align(128))]
pub struct CpuPriMask {
    pub(crate) mask: AtomicCpuMask,
}

/// One CPU's current level, alone on its cache line pair.
#[repr(align(128))]
pub struct CpuPriSlot {
    pub(crate) pri: AtomicU32,
}

/// The split layout.
pub struct SplitCpuPri {
    pub(crate) counts: Box<[CpuPriCount]>,
    /// `NR_PRI * nmasks` masks, level-major.
    pub(crate) masks: Box<[CpuPriMask]>,
    nmasks: usize,
    /// Index into a level's masks for each CPU (its node, or 0).
    cpu_mask: Box<[u32]>,
    /// The mask index of each node (nodes without CPUs map to 0).
    node_mask: Box<[u32]>,
    /// The CPUs of each mask index.
    spans: Box<[CpuMask]>,
    pub(crate) cpu_to_pri: Box<[CpuPriSlot]>,
}

impl SplitCpuPri {
    /// Every CPU of `map` starts idle (at the fair level).
    pub fn new(map: &TopoMap, node_masks: bool) -> Self {
        let nodes = map.cpu_nodes();
        let split = node_masks && nodes.len() > 1;
        let nmasks = if split { nodes.len() } else { 1 };
        let mut node_mask = vec![0u32; map.nnodes()];
        let mut spans = vec![CpuMask::empty(); nmasks];
        for (i, &nd) in nodes.iter().enumerate() {
            let mi = if split { i } else { 0 };
            node_mask[nd as usize] = mi as u32;
            spans[mi] = spans[mi].or(map.node_span(nd));
        }
        let cpu_mask: Box<[u32]> = (0..map.ncpus() as u32)
            .map(|c| node_mask[map.node_of(c) as usize])
            .collect();
        let s = Self {
            counts: (0..NR_PRI)
                .map(|_| CpuPriCount {
                    count: AtomicU32::new(0),
                })
                .collect(),
            masks: (0..NR_PRI * nmasks)
                .map(|_| CpuPriMask {
                    mask: AtomicCpuMask::new(),
                })
                .collect(),
            nmasks,
            cpu_mask,
            node_mask: node_mask.into(),
            spans: spans.into(),
            cpu_to_pri: (0..map.ncpus())
                .map(|_| CpuPriSlot {
                    pri: AtomicU32::new(PRI_FAIR),
                })
                .collect(),
        };
        for c in map.all().iter() {
            s.mask_of(PRI_FAIR, c).set(c, Ordering::Relaxed);
        }
        s.counts[PRI_FAIR as usize]
            .count
            .store(map.ncpus() as u32, Ordering::Relaxed);
        s
    }

    #[inline]
    fn mask_of(&self, pri: u32, cpu: CpuId) -> &AtomicCpuMask {
        &self.masks[pri as usize * self.nmasks + self.cpu_mask[cpu as usize] as usize].mask
    }

    pub(crate) fn set(&self, cpu: CpuId, pri: u32) {
        let slot = &self.cpu_to_pri[cpu as usize].pri;
        let old = slot.load(Ordering::Relaxed);
        if old == pri {
            return;
        }
        self.mask_of(pri, cpu).set(cpu, Ordering::Relaxed);
        self.counts[pri as usize]
            .count
            .fetch_add(1, Ordering::AcqRel);
        self.counts[old as usize]
            .count
            .fetch_sub(1, Ordering::AcqRel);
        self.mask_of(old, cpu).clear(cpu, Ordering::Release);
        slot.store(pri, Ordering::Relaxed);
    }

    pub(crate) fn get(&self, cpu: CpuId) -> u32 {
        self.cpu_to_pri[cpu as usize].pri.load(Ordering::Relaxed)
    }

    pub(crate) fn find(
        &self,
        task_pri: u32,
        allowed: &CpuMask,
        prefer_node: u32,
    ) -> Option<CpuMask> {
        let first = self
            .node_mask
            .get(prefer_node as usize)
            .copied()
            .unwrap_or(0) as usize;
        for pri in PRI_FAIR as usize..task_pri as usize {
            if self.counts[pri].count.load(Ordering::Acquire) == 0 {
                continue;
            }
            let base = pri * self.nmasks;
            for k in 0..self.nmasks {
                let mi = (first + k) % self.nmasks;
                let within = allowed.and(&self.spans[mi]);
                if within.is_empty() {
                    continue;
                }
                let m = self.masks[base + mi].mask.and(&within, Ordering::Acquire);
                if !m.is_empty() {
                    return Some(m);
                }
            }
        }
        None
    }

    pub(crate) fn count(&self, pri: u32) -> u32 {
        self.counts[pri as usize].count.load(Ordering::Relaxed)
    }

    pub(crate) fn mask(&self, pri: u32) -> CpuMask {
        let base = pri as usize * self.nmasks;
        (0..self.nmasks).fold(CpuMask::empty(), |m, k| {
            m.or(&self.masks[base + k].mask.load(Ordering::Relaxed))
        })
    }

    /// How many masks each level has (1, or the number of nodes).
    pub fn masks_per_level(&self) -> usize {
        self.nmasks
    }

    /// Addresses of level `pri`'s count and first mask (layout tests).
    pub(crate) fn level_addrs(&self, pri: u32) -> (usize, usize) {
        (
            &self.counts[pri as usize] as *const _ as usize,
            &self.masks[pri as usize * self.nmasks] as *const _ as usize,
        )
    }
}
