//! Guest RAM: one region per guest NUMA node, each bound to a host node.
//!
//! [`MemoryPlan`] splits the requested size into equal shares per guest
//! node (multiples of 2 MiB, the remainder going to the last node) and lays
//! them out back to back from guest physical address 0, skipping the MMIO
//! hole below 4 GiB. [`node_policies`] decides which host node each guest
//! node's memory must come from, and [`GuestRam::allocate`] maps the memory
//! and applies that policy with `mbind(2)` before any page is touched.

use std::fmt;

use tracing::{debug, info, warn};
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use crate::layout::{EBDA_START, HIMEM_START, MIB, MMIO_HOLE_END, MMIO_HOLE_START};

/// Smallest amount of memory a guest NUMA node may get.
pub const MIN_NODE_MEMORY: u64 = 32 * MIB;
/// Smallest guest.
pub const MIN_MEMORY: u64 = 64 * MIB;
/// Node shares are multiples of this.
pub const NODE_ALIGN: u64 = 2 * MIB;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The requested size is below the minimum.
    #[error(
        "--memory {requested} is too small: the minimum is {minimum} ({} per NUMA node, {} in all)",
        HumanSize(MIN_NODE_MEMORY),
        HumanSize(MIN_MEMORY)
    )]
    TooSmall {
        /// What was asked for.
        requested: HumanSize,
        /// The minimum for this many nodes.
        minimum: HumanSize,
    },
    /// The address space would overflow.
    #[error("--memory {0} is too large for this VMM's address space")]
    TooLarge(HumanSize),
    /// mmap failed.
    #[error("cannot map {size} of guest memory for node {node}: {source}")]
    Map {
        /// Guest node.
        node: u32,
        /// Size of the region.
        size: HumanSize,
        /// What mmap said.
        source: vm_memory::mmap::MmapRegionError,
    },
    /// The regions could not be assembled (overlap: a bug).
    #[error("cannot assemble guest memory: {0}")]
    Assemble(String),
    /// mbind failed.
    #[error("cannot bind guest node {node}'s memory to host node(s) {nodes:?}: {source}")]
    Bind {
        /// Guest node.
        node: u32,
        /// Host nodes.
        nodes: Vec<u32>,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A byte count printed the way users type it (`512M`, `2G`, `1536K`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanSize(pub u64);

impl fmt::Display for HumanSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
            if b >= 1 << shift && b % (1 << shift) == 0 {
                return write!(f, "{}{unit}", b >> shift);
            }
        }
        if b >= MIB {
            write!(f, "{:.1}M", b as f64 / MIB as f64)
        } else {
            write!(f, "{b}B")
        }
    }
}

/// Parses a memory size: a number with an optional binary unit `K`, `M`,
/// `G` or `T` (`KiB`, `MB`... accepted too, all meaning powers of 1024). A
/// bare number means MiB, as in QEMU's `-m`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size: give a number with a unit, e.g. 512M or 2G"
        ));
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 20,
        "k" | "kb" | "kib" => 10,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "b" => 0,
        other => {
            return Err(format!(
                "{s:?} has an unknown unit {other:?}: use K, M, G or T (e.g. 512M, 2G)"
            ))
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: give a number with a unit, e.g. 512M"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= (1u64 << 52) as f64 {
        return Err(format!("{s:?} is implausibly large"));
    }
    Ok(bytes as u64)
}

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

/// Where a guest node's memory comes from on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPolicy {
    /// The host kernel's default (first touch).
    Default,
    /// `MPOL_BIND` to these host nodes (OS numbers).
    Bind(Vec<u32>),
    /// `MPOL_INTERLEAVE` over these host nodes (OS numbers).
    Interleave(Vec<u32>),
}

/// The policy for one guest node and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePolicy {
    /// Guest node.
    pub node: u32,
    /// The policy.
    pub policy: HostPolicy,
    /// A short reason, for the log.
    pub reason: String,
}

/// Decides which host node(s) each guest node's memory is bound to.
///
/// * A host with one NUMA node: nothing to bind.
/// * A guest mirrored from host CPUs ([`topology::GuestTopology::from_host_cpus`]):
///   the host node it mirrors.
/// * vCPUs pinned (`pins[v]` = host CPU of vCPU `v`, as dense indices of
///   `host`): the host node(s) of the CPUs the node's vCPUs run on: `Bind`
///   when that is one node, `Interleave` when they span several.
/// * Unpinned vCPUs: nothing to bind (the host scheduler may move the
///   threads anywhere; binding would make every access remote).
pub fn node_policies(
    guest: &topology::GuestTopology,
    host: &topology::HostTopology,
    pins: Option<&[u32]>,
) -> Vec<NodePolicy> {
    let n = guest.num_nodes() as u32;
    let os_node = |dense: u32| host.nodes()[dense as usize].os_index;
    (0..n)
        .map(|node| {
            if host.num_nodes() <= 1 {
                return NodePolicy {
                    node,
                    policy: HostPolicy::Default,
                    reason: "the host has one NUMA node".into(),
                };
            }
            if let Some(h) = guest.host_node(node) {
                return NodePolicy {
                    node,
                    policy: HostPolicy::Bind(vec![os_node(h)]),
                    reason: "mirrors this host node".into(),
                };
            }
            let Some(pins) = pins else {
                return NodePolicy {
                    node,
                    policy: HostPolicy::Default,
                    reason: "vCPUs are not pinned".into(),
                };
            };
            let mut hn: Vec<u32> = guest
                .node_cpus(node)
                .iter()
                .filter_map(|&v| pins.get(v as usize))
                .map(|&c| os_node(host.node_of(c)))
                .collect();
            hn.sort_unstable();
            hn.dedup();
            match hn.len() {
                0 => NodePolicy {
                    node,
                    policy: HostPolicy::Default,
                    reason: "the node has no vCPUs".into(),
                },
                1 => NodePolicy {
                    node,
                    policy: HostPolicy::Bind(hn),
                    reason: "its vCPUs are pinned to this host node".into(),
                },
                _ => NodePolicy {
                    node,
                    policy: HostPolicy::Interleave(hn),
                    reason: "its vCPUs are pinned across several host nodes".into(),
                },
            }
        })
        .collect()
}

/// Guest RAM, mapped.
pub struct GuestRam {
    plan: MemoryPlan,
    memory: GuestMemoryMmap,
}

impl fmt::Debug for GuestRam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuestRam")
            .field("plan", &self.plan)
            .finish()
    }
}

const MPOL_BIND: libc::c_int = 2;
const MPOL_INTERLEAVE: libc::c_int = 3;

fn mbind(addr: *mut u8, len: usize, mode: libc::c_int, nodes: &[u32]) -> std::io::Result<()> {
    let max = nodes.iter().copied().max().unwrap_or(0) as usize + 1;
    let words = max.div_ceil(64);
    let mut mask = vec![0u64; words];
    for &n in nodes {
        mask[n as usize / 64] |= 1 << (n % 64);
    }
    // SAFETY: mbind only changes the NUMA policy of [addr, addr + len), a
    // mapping this process owns and has not handed out yet; the node mask is
    // a live buffer of `words` 64-bit words, and maxnode counts its bits
    // plus one as the system call expects.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            mode as libc::c_ulong,
            mask.as_ptr() as libc::c_ulong,
            (words * 64 + 1) as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl GuestRam {
    /// Maps the memory of `plan`, one host mapping per range, and applies
    /// `policies` (indexed by guest node) before anything touches it.
    pub fn allocate(plan: MemoryPlan, policies: &[NodePolicy]) -> Result<Self, MemoryError> {
        let mut regions = Vec::with_capacity(plan.ranges().len());
        for r in plan.ranges() {
            let region =
                MmapRegion::<()>::new(r.size as usize).map_err(|source| MemoryError::Map {
                    node: r.node,
                    size: HumanSize(r.size),
                    source,
                })?;
            let addr = region.as_ptr();
            // Transparent huge pages where the host allows them: fewer TLB
            // misses in the guest on hardware KVM.
            // SAFETY: madvise on a mapping owned by `region`; it only
            // changes paging hints.
            unsafe {
                libc::madvise(addr.cast(), r.size as usize, libc::MADV_HUGEPAGE);
            }
            let policy = policies
                .iter()
                .find(|p| p.node == r.node)
                .map(|p| p.policy.clone())
                .unwrap_or(HostPolicy::Default);
            match &policy {
                HostPolicy::Default => {}
                HostPolicy::Bind(nodes) | HostPolicy::Interleave(nodes) => {
                    let mode = if matches!(policy, HostPolicy::Bind(_)) {
                        MPOL_BIND
                    } else {
                        MPOL_INTERLEAVE
                    };
                    mbind(addr, r.size as usize, mode, nodes).map_err(|source| {
                        MemoryError::Bind {
                            node: r.node,
                            nodes: nodes.clone(),
                            source,
                        }
                    })?;
                }
            }
            debug!(
                node = r.node,
                start = format_args!("{:#x}", r.start),
                size = %HumanSize(r.size),
                ?policy,
                "guest RAM range"
            );
            let region = GuestRegionMmap::new(region, GuestAddress(r.start))
                .ok_or_else(|| MemoryError::Assemble("region address overflow".into()))?;
            regions.push(region);
        }
        for p in policies {
            match &p.policy {
                HostPolicy::Default => {
                    debug!(node = p.node, reason = %p.reason, "guest node memory not bound")
                }
                _ => {
                    info!(node = p.node, policy = ?p.policy, reason = %p.reason, "guest node memory bound")
                }
            }
        }
        let memory = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| MemoryError::Assemble(e.to_string()))?;
        if plan.total() > host_mem_total().unwrap_or(u64::MAX) {
            warn!(
                "--memory {} exceeds the host's RAM; the guest may be killed when it touches it",
                HumanSize(plan.total())
            );
        }
        Ok(Self { plan, memory })
    }

    /// The plan this memory follows.
    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }
    /// The vm-memory view.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }
}

/// The host's RAM (`MemTotal` of `/proc/meminfo`), in bytes.
pub fn host_mem_total() -> Option<u64> {
    meminfo("MemTotal:")
}

/// The host's RAM available without swapping (`MemAvailable`), in bytes.
pub fn host_mem_available() -> Option<u64> {
    meminfo("MemAvailable:")
}

fn meminfo(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::GIB;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 * MIB);
        assert_eq!(parse_size("2G").unwrap(), 2 * GIB);
        assert_eq!(parse_size("2GiB").unwrap(), 2 * GIB);
        assert_eq!(parse_size("1.5G").unwrap(), 1536 * MIB);
        assert_eq!(parse_size("768").unwrap(), 768 * MIB);
        assert_eq!(parse_size("65536K").unwrap(), 64 * MIB);
        assert!(parse_size("12X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999T").is_err());
        assert_eq!(HumanSize(512 * MIB).to_string(), "512M");
        assert_eq!(HumanSize(3 * GIB).to_string(), "3G");
    }

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

    #[test]
    fn policies_follow_pins_on_a_two_node_host() {
        let host = topology::load("genoa-2s").unwrap();
        let guest = topology::GuestTopology::from_spec("package:2 [numa] core:2 pu:2").unwrap();
        // One host node: nothing to bind.
        let one = topology::load("package:1 [numa] core:4 pu:2").unwrap();
        assert!(node_policies(&guest, &one, Some(&[0, 1, 2, 3, 4, 5, 6, 7]))
            .iter()
            .all(|p| p.policy == HostPolicy::Default));
        // Unpinned: nothing to bind.
        assert!(node_policies(&guest, &host, None)
            .iter()
            .all(|p| p.policy == HostPolicy::Default));
        // Guest node 0 on host package 0, node 1 on package 1.
        let pins = [0, 1, 2, 3, 192, 193, 194, 195];
        let p = node_policies(&guest, &host, Some(&pins));
        assert_eq!(p[0].policy, HostPolicy::Bind(vec![0]));
        assert_eq!(p[1].policy, HostPolicy::Bind(vec![1]));
        // Reversed placement binds the other way round.
        let pins = [192, 193, 194, 195, 0, 1, 2, 3];
        let p = node_policies(&guest, &host, Some(&pins));
        assert_eq!(p[0].policy, HostPolicy::Bind(vec![1]));
        // A guest node spread over both host nodes interleaves.
        let pins = [0, 1, 192, 193, 2, 3, 4, 5];
        let p = node_policies(&guest, &host, Some(&pins));
        assert_eq!(p[0].policy, HostPolicy::Interleave(vec![0, 1]));
        assert_eq!(p[1].policy, HostPolicy::Bind(vec![0]));
        // A mirrored guest binds to the nodes it mirrors.
        let m = topology::GuestTopology::from_host_cpus(&host, &[200, 201]).unwrap();
        let p = node_policies(&m, &host, None);
        assert_eq!(p[0].policy, HostPolicy::Bind(vec![1]));
    }

    #[test]
    fn allocate_and_bind_on_this_host() {
        let plan = MemoryPlan::new(64 * MIB, 1).unwrap();
        // Binding to node 0 works on every Linux host.
        let pol = vec![NodePolicy {
            node: 0,
            policy: HostPolicy::Bind(vec![0]),
            reason: "test".into(),
        }];
        let ram = GuestRam::allocate(plan, &pol).unwrap();
        use vm_memory::{Bytes, GuestMemoryBackend};
        ram.memory()
            .write_obj(0x1234_5678u32, GuestAddress(0x1000))
            .unwrap();
        assert_eq!(
            ram.memory().read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0x1234_5678
        );
        assert_eq!(ram.memory().num_regions(), 1);
    }
}
