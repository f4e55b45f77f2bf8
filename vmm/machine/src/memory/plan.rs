//! Where guest RAM goes: equal shares per node laid out around the MMIO
//! hole, and the E820 map that describes it.

use super::{HumanSize, MemoryError, MIN_MEMORY, MIN_NODE_MEMORY, NODE_ALIGN};
use crate::layout::{EBDA_START, HIMEM_START, MMIO_HOLE_END, MMIO_HOLE_START};

/// A run of guest physical memory belonging to one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    /// Guest NUMA node.
    pub node: u32,
    /// First guest physical address.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
}

impl RamRange {
    /// One past the last address.
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// How guest RAM is split across nodes and laid out in guest physical
/// address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    total: u64,
    node_sizes: Vec<u64>,
    ranges: Vec<RamRange>,
}

impl MemoryPlan {
    /// The minimum total memory for `nodes` guest nodes.
    pub fn minimum(nodes: usize) -> u64 {
        MIN_MEMORY.max(nodes as u64 * MIN_NODE_MEMORY)
    }

    /// Splits `total` bytes across `nodes` nodes.
    pub fn new(total: u64, nodes: usize) -> Result<Self, MemoryError> {
        let nodes = nodes.max(1);
        let min = Self::minimum(nodes);
        if total < min {
            return Err(MemoryError::TooSmall {
                requested: HumanSize(total),
                minimum: HumanSize(min),
            });
        }
        if total > (1u64 << 46) {
            return Err(MemoryError::TooLarge(HumanSize(total)));
        }
        let share = (total / nodes as u64) / NODE_ALIGN * NODE_ALIGN;
        let mut node_sizes = vec![share; nodes];
        // The remainder (less than NODE_ALIGN per node, rounded down to 4K)
        // goes to the last node.
        let rest = (total - share * nodes as u64) & !0xfff;
        *node_sizes.last_mut().unwrap() += rest;
        let mut ranges = Vec::new();
        let mut addr = 0u64;
        for (node, &size) in node_sizes.iter().enumerate() {
            let mut left = size;
            while left > 0 {
                if (MMIO_HOLE_START..MMIO_HOLE_END).contains(&addr) {
                    addr = MMIO_HOLE_END;
                }
                let limit = if addr < MMIO_HOLE_START {
                    MMIO_HOLE_START - addr
                } else {
                    u64::MAX
                };
                let take = left.min(limit);
                ranges.push(RamRange {
                    node: node as u32,
                    start: addr,
                    size: take,
                });
                addr += take;
                left -= take;
            }
        }
        Ok(Self {
            total: node_sizes.iter().sum(),
            node_sizes,
            ranges,
        })
    }

    /// Total guest RAM in bytes.
    pub fn total(&self) -> u64 {
        self.total
    }
    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.node_sizes.len()
    }
    /// RAM of node `node` in bytes.
    pub fn node_size(&self, node: u32) -> u64 {
        self.node_sizes[node as usize]
    }
    /// All ranges in address order.
    pub fn ranges(&self) -> &[RamRange] {
        &self.ranges
    }
    /// The ranges of one node.
    pub fn node_ranges(&self, node: u32) -> impl Iterator<Item = &RamRange> {
        self.ranges.iter().filter(move |r| r.node == node)
    }
    /// The end of RAM below the MMIO hole (where the initrd goes).
    pub fn low_ram_end(&self) -> u64 {
        self.ranges
            .iter()
            .filter(|r| r.start < MMIO_HOLE_START)
            .map(|r| r.end())
            .max()
            .unwrap_or(0)
    }
    /// Highest guest physical address + 1.
    pub fn end(&self) -> u64 {
        self.ranges.iter().map(|r| r.end()).max().unwrap_or(0)
    }

    /// The E820 map: RAM ranges, with the BIOS area below 1 MiB reserved.
    pub fn e820(&self) -> Vec<E820Entry> {
        let mut out = Vec::new();
        for r in &self.ranges {
            if r.start < HIMEM_START {
                out.push(E820Entry {
                    addr: r.start,
                    size: EBDA_START - r.start,
                    kind: E820Kind::Ram,
                });
                out.push(E820Entry {
                    addr: EBDA_START,
                    size: HIMEM_START - EBDA_START,
                    kind: E820Kind::Reserved,
                });
                if r.end() > HIMEM_START {
                    out.push(E820Entry {
                        addr: HIMEM_START,
                        size: r.end() - HIMEM_START,
                        kind: E820Kind::Ram,
                    });
                }
            } else {
                out.push(E820Entry {
                    addr: r.start,
                    size: r.size,
                    kind: E820Kind::Ram,
                });
            }
        }
        out
    }
}

/// E820 memory types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E820Kind {
    /// Usable RAM (1).
    Ram = 1,
    /// Reserved (2).
    Reserved = 2,
}

/// One E820 entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    /// Start.
    pub addr: u64,
    /// Length.
    pub size: u64,
    /// Type.
    pub kind: E820Kind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{GIB, MIB};

    #[test]
    fn equal_shares_back_to_back() {
        let p = MemoryPlan::new(GIB, 2).unwrap();
        assert_eq!(p.node_size(0), 512 * MIB);
        assert_eq!(p.node_size(1), 512 * MIB);
        assert_eq!(
            p.ranges(),
            &[
                RamRange {
                    node: 0,
                    start: 0,
                    size: 512 * MIB
                },
                RamRange {
                    node: 1,
                    start: 512 * MIB,
                    size: 512 * MIB
                }
            ]
        );
        assert_eq!(p.low_ram_end(), GIB);
    }

    #[test]
    fn hole_splits_a_node() {
        // 8 GiB over 2 nodes: node 0 is 0..3G + 4G..5G (the hole cuts
        // it), node 1 is 5G..9G.
        let p = MemoryPlan::new(8 * GIB, 2).unwrap();
        let r = p.ranges();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].node, r[0].start, r[0].size), (0, 0, 3 * GIB));
        assert_eq!((r[1].node, r[1].start, r[1].size), (0, 4 * GIB, GIB));
        assert_eq!((r[2].node, r[2].start, r[2].size), (1, 5 * GIB, 4 * GIB));
        assert_eq!(p.total(), 8 * GIB);
        assert_eq!(p.low_ram_end(), 3 * GIB);
        // No range touches the hole.
        assert!(r
            .iter()
            .all(|x| x.end() <= MMIO_HOLE_START || x.start >= MMIO_HOLE_END));
    }

    #[test]
    fn odd_sizes_and_minimum() {
        let p = MemoryPlan::new(1000 * MIB, 3).unwrap();
        assert_eq!(p.total(), 1000 * MIB);
        assert_eq!(p.node_size(0), 332 * MIB);
        assert_eq!(p.node_size(2), 336 * MIB);
        let e = MemoryPlan::new(16 * MIB, 1).unwrap_err().to_string();
        assert!(e.contains("minimum is 64M"), "{e}");
        let e = MemoryPlan::new(96 * MIB, 4).unwrap_err().to_string();
        assert!(e.contains("minimum is 128M"), "{e}");
    }

    #[test]
    fn e820_reserves_bios_area() {
        let p = MemoryPlan::new(256 * MIB, 1).unwrap();
        let e = p.e820();
        assert_eq!(e[0].kind, E820Kind::Ram);
        assert_eq!(e[0].size, EBDA_START);
        assert_eq!(e[1].kind, E820Kind::Reserved);
        assert_eq!(e[1].addr + e[1].size, HIMEM_START);
        assert_eq!(e[2].addr, HIMEM_START);
        assert_eq!(e[2].addr + e[2].size, 256 * MIB);
    }
}
