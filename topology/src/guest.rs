//! Guest topologies and their x2APIC ID layout.
//!
//! A guest is a tree: packages, dies, LLCs, L2 groups, cores, threads, plus
//! the NUMA node of each vCPU. Real x86 hardware encodes that tree in the
//! x2APIC ID, one bit field per level, each field as narrow as its largest
//! count allows (`ceil(log2(n))` bits). Software then recovers the tree by
//! shifting: Linux and hwloc take `apic >> shift` as the ID of the core, the
//! cache or the package. That only works when every cache's group of CPUs
//! is an aligned power-of-two block of APIC IDs, so the layout here gives
//! each level that can own a cache its own field:
//!
//! ```text
//!  | package | die | llc | l2 | core | thread |
//!  msb                                     lsb
//! ```
//!
//! Counts need not be powers of two (24 cores, 12 LLCs): the field is
//! rounded up and some IDs are simply not used, as on real parts.
//!
//! vCPU `i` is the `i`-th CPU in APIC-ID order. Linux numbers CPUs in MADT
//! order and the VMM writes the MADT in APIC-ID order, so guest CPU `i` in
//! Linux is vCPU `i` here.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::{Result, TopologyError};
use crate::host::{uniform_distances, CacheInfo, Caches, HostTopology};

/// Number of bits needed to hold indices `0..n` (0 for `n <= 1`).
pub fn bits_for(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// Bit widths of the x2APIC ID fields, lowest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApicLayout {
    /// Bits for the thread within its core.
    pub thread_bits: u32,
    /// Bits for the core within its L2 group.
    pub core_bits: u32,
    /// Bits for the L2 group within its LLC.
    pub l2_bits: u32,
    /// Bits for the LLC within its die.
    pub llc_bits: u32,
    /// Bits for the die within its package.
    pub die_bits: u32,
}

impl ApicLayout {
    /// The narrowest layout for these per-parent maxima.
    pub fn for_counts(c: &GuestCounts) -> Self {
        Self {
            thread_bits: bits_for(c.threads_per_core),
            core_bits: bits_for(c.cores_per_l2),
            l2_bits: bits_for(c.l2s_per_llc),
            llc_bits: bits_for(c.llcs_per_die),
            die_bits: bits_for(c.dies_per_package),
        }
    }
    /// Shift from the APIC ID to the core: the SMT field's width.
    pub fn smt_shift(&self) -> u32 {
        self.thread_bits
    }
    /// Shift to the L2 group (CPUs below it share an L2).
    pub fn l2_shift(&self) -> u32 {
        self.thread_bits + self.core_bits
    }
    /// Shift to the LLC (CPUs below it share the LLC).
    pub fn llc_shift(&self) -> u32 {
        self.l2_shift() + self.l2_bits
    }
    /// Shift to the die.
    pub fn die_shift(&self) -> u32 {
        self.llc_shift() + self.llc_bits
    }
    /// Shift to the package.
    pub fn package_shift(&self) -> u32 {
        self.die_shift() + self.die_bits
    }
    /// Composes an APIC ID from per-parent indices.
    pub fn apic_id(
        &self,
        package: u32,
        die: u32,
        llc: u32,
        l2: u32,
        core: u32,
        thread: u32,
    ) -> u32 {
        (package << self.package_shift())
            | (die << self.die_shift())
            | (llc << self.llc_shift())
            | (l2 << self.l2_shift())
            | (core << self.smt_shift())
            | thread
    }
    /// Splits an APIC ID back into (package, die, llc, l2, core, thread).
    pub fn decode(&self, apic: u32) -> (u32, u32, u32, u32, u32, u32) {
        let f = |shift: u32, bits: u32| (apic >> shift) & ((1u32 << bits) - 1);
        (
            apic >> self.package_shift(),
            f(self.die_shift(), self.die_bits),
            f(self.llc_shift(), self.llc_bits),
            f(self.l2_shift(), self.l2_bits),
            f(self.smt_shift(), self.core_bits),
            f(0, self.thread_bits),
        )
    }
}

/// Largest number of children per parent, level by level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GuestCounts {
    /// Packages in the guest.
    pub packages: u32,
    /// Dies per package.
    pub dies_per_package: u32,
    /// LLCs per die.
    pub llcs_per_die: u32,
    /// L2 groups per LLC.
    pub l2s_per_llc: u32,
    /// Cores per L2 group.
    pub cores_per_l2: u32,
    /// Threads per core.
    pub threads_per_core: u32,
}

/// One vCPU. Tree indices are local to the parent (die 1 of package 0 and
/// die 1 of package 1 both have `die == 1`); `node` is global.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GuestCpu {
    /// x2APIC ID.
    pub apic_id: u32,
    /// Package index.
    pub package: u32,
    /// Die within the package.
    pub die: u32,
    /// LLC within the die.
    pub llc: u32,
    /// L2 group within the LLC.
    pub l2: u32,
    /// Core within the L2 group.
    pub core: u32,
    /// Thread within the core.
    pub thread: u32,
    /// Guest NUMA node.
    pub node: u32,
    /// The host CPU (dense index) this vCPU mirrors, if derived from one.
    pub host_cpu: Option<u32>,
}

/// A guest CPU topology.
#[derive(Clone, Debug, Serialize)]
pub struct GuestTopology {
    source: String,
    cpus: Vec<GuestCpu>,
    layout: ApicLayout,
    counts: GuestCounts,
    num_nodes: u32,
    node_host: Vec<Option<u32>>,
    distances: Vec<u32>,
    caches: Caches,
}

/// Cache sizes a guest gets where its source gives none.
pub const DEFAULT_CACHES: Caches = Caches {
    l1d: Some(CacheInfo {
        size: 32 << 10,
        line_size: 64,
        ways: 8,
    }),
    l1i: Some(CacheInfo {
        size: 32 << 10,
        line_size: 64,
        ways: 8,
    }),
    l2: Some(CacheInfo {
        size: 1 << 20,
        line_size: 64,
        ways: 8,
    }),
    l3: Some(CacheInfo {
        size: 32 << 20,
        line_size: 64,
        ways: 16,
    }),
};

/// Assigns dense local indices per parent in order of first appearance.
#[derive(Default)]
struct LocalIndex {
    map: HashMap<(u32, u32), u32>,
    next: HashMap<u32, u32>,
}

impl LocalIndex {
    fn get(&mut self, parent: u32, key: u32) -> u32 {
        if let Some(&v) = self.map.get(&(parent, key)) {
            return v;
        }
        let n = self.next.entry(parent).or_insert(0);
        let v = *n;
        *n += 1;
        self.map.insert((parent, key), v);
        v
    }
    fn max_children(&self) -> u32 {
        self.next.values().copied().max().unwrap_or(1)
    }
}

/// Checks the host CPUs a guest is made of (some, none twice, all
/// existing) and sorts them in tree order: package, die, LLC, L2, core,
/// then logical order.
fn tree_order(host: &HostTopology, cpus: &[u32]) -> Result<Vec<u32>> {
    if cpus.is_empty() {
        return Err(TopologyError::Guest(
            "a guest needs at least one vCPU".into(),
        ));
    }
    let mut sel = cpus.to_vec();
    sel.sort_unstable();
    if sel.windows(2).any(|w| w[0] == w[1]) {
        return Err(TopologyError::Guest("a host CPU is listed twice".into()));
    }
    if let Some(&bad) = sel.iter().find(|&&c| c as usize >= host.num_cpus()) {
        return Err(TopologyError::Guest(format!(
            "host CPU {bad} does not exist ({} CPUs)",
            host.num_cpus()
        )));
    }
    sel.sort_by_key(|&c| {
        let l = host.cpu(c);
        (l.package, l.die, l.llc, l.l2, l.core, c)
    });
    Ok(sel)
}

/// The host's distances between `nodes` (dense host indices), row-major.
fn node_distances(host: &HostTopology, nodes: &[u32]) -> Vec<u32> {
    let mut distances = Vec::with_capacity(nodes.len() * nodes.len());
    for &a in nodes {
        for &b in nodes {
            distances.push(host.distance(a, b));
        }
    }
    distances
}

/// The host's caches, with [`DEFAULT_CACHES`] where it has none.
fn guest_caches(host: &HostTopology) -> Caches {
    let hc = host.caches();
    Caches {
        l1d: hc.l1d.or(DEFAULT_CACHES.l1d),
        l1i: hc.l1i.or(DEFAULT_CACHES.l1i),
        l2: hc.l2.or(DEFAULT_CACHES.l2),
        l3: hc.l3.or(DEFAULT_CACHES.l3),
    }
}

impl GuestTopology {
    /// A guest shaped like a topology SPEC (preset, synthetic string, XML or
    /// CPUID dump; see [`crate::load()`]). The vCPUs mirror no host CPU.
    pub fn from_spec(spec: &str) -> Result<Self> {
        let t = crate::load::load(spec)?;
        let all: Vec<u32> = (0..t.num_cpus() as u32).collect();
        let mut g = Self::build(&t, &all, false)?;
        g.source = t.source().to_string();
        Ok(g)
    }

    /// A guest that mirrors host CPUs `cpus` (dense indices of `host`): vCPUs
    /// share SMT cores, L2s, LLCs, dies, packages and nodes exactly as those
    /// host CPUs do. vCPU `i` maps to `cpus()[i].host_cpu`, which is the
    /// natural pinning.
    pub fn from_host_cpus(host: &HostTopology, cpus: &[u32]) -> Result<Self> {
        Self::build(host, cpus, true)
    }

    fn build(host: &HostTopology, cpus: &[u32], mirror: bool) -> Result<Self> {
        let sel = tree_order(host, cpus)?;
        let (mut pkg, mut die, mut llc, mut l2, mut core, mut thr) = (
            LocalIndex::default(),
            LocalIndex::default(),
            LocalIndex::default(),
            LocalIndex::default(),
            LocalIndex::default(),
            LocalIndex::default(),
        );
        let mut used_nodes: Vec<u32> = sel.iter().map(|&c| host.node_of(c)).collect();
        used_nodes.sort_unstable();
        used_nodes.dedup();
        let mut partial = Vec::with_capacity(sel.len());
        for &c in &sel {
            let l = host.cpu(c);
            let p = pkg.get(0, l.package);
            let d = die.get(l.package, l.die);
            let lc = llc.get(l.die, l.llc);
            let l2i = l2.get(l.llc, l.l2);
            let co = core.get(l.l2, l.core);
            let t = thr.get(l.core, c);
            let node = used_nodes.binary_search(&l.node).unwrap() as u32;
            partial.push((p, d, lc, l2i, co, t, node, c));
        }
        let counts = GuestCounts {
            packages: pkg.max_children(),
            dies_per_package: die.max_children(),
            llcs_per_die: llc.max_children(),
            l2s_per_llc: l2.max_children(),
            cores_per_l2: core.max_children(),
            threads_per_core: thr.max_children(),
        };
        let layout = ApicLayout::for_counts(&counts);
        if layout.package_shift() + bits_for(counts.packages) > 32 {
            return Err(TopologyError::Guest(
                "the x2APIC IDs would need more than 32 bits".into(),
            ));
        }
        let cpus: Vec<GuestCpu> = partial
            .into_iter()
            .map(|(p, d, lc, l2i, co, t, node, c)| GuestCpu {
                apic_id: layout.apic_id(p, d, lc, l2i, co, t),
                package: p,
                die: d,
                llc: lc,
                l2: l2i,
                core: co,
                thread: t,
                node,
                host_cpu: mirror.then_some(c),
            })
            .collect();
        debug_assert!(cpus.windows(2).all(|w| w[0].apic_id < w[1].apic_id));
        let n = used_nodes.len();
        Ok(Self {
            source: host.source().to_string(),
            cpus,
            layout,
            counts,
            num_nodes: n as u32,
            node_host: used_nodes.iter().map(|&h| mirror.then_some(h)).collect(),
            distances: node_distances(host, &used_nodes),
            caches: guest_caches(host),
        })
    }

    /// Sets every inter-node distance to `remote` (10 stays on the
    /// diagonal). `remote` must be in 11..=254, as ACPI SLIT requires.
    pub fn set_remote_distance(&mut self, remote: u32) -> Result<()> {
        if !(11..=254).contains(&remote) {
            return Err(TopologyError::Guest(format!(
                "NUMA distance {remote} is out of range: use 11..=254 (10 is local)"
            )));
        }
        self.distances = uniform_distances(self.num_nodes as usize, remote);
        Ok(())
    }

    /// Where the shape came from.
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Number of vCPUs.
    pub fn num_vcpus(&self) -> usize {
        self.cpus.len()
    }
    /// All vCPUs in APIC-ID order.
    pub fn cpus(&self) -> &[GuestCpu] {
        &self.cpus
    }
    /// One vCPU.
    pub fn cpu(&self, vcpu: usize) -> &GuestCpu {
        &self.cpus[vcpu]
    }
    /// The APIC ID layout.
    pub fn layout(&self) -> &ApicLayout {
        &self.layout
    }
    /// Per-parent maxima.
    pub fn counts(&self) -> &GuestCounts {
        &self.counts
    }
    /// Number of guest NUMA nodes.
    pub fn num_nodes(&self) -> usize {
        self.num_nodes as usize
    }
    /// The host node (dense index) guest node `node` mirrors, if any.
    pub fn host_node(&self, node: u32) -> Option<u32> {
        self.node_host[node as usize]
    }
    /// vCPUs of guest node `node`.
    pub fn node_cpus(&self, node: u32) -> Vec<u32> {
        self.filter(|c| c.node == node)
    }
    /// Guest NUMA distance.
    pub fn distance(&self, a: u32, b: u32) -> u32 {
        self.distances[(a * self.num_nodes + b) as usize]
    }
    /// The whole distance matrix, row-major.
    pub fn distances(&self) -> &[u32] {
        &self.distances
    }
    /// Cache geometry shown to the guest.
    pub fn caches(&self) -> &Caches {
        &self.caches
    }
    /// Largest number of vCPUs in one package.
    pub fn max_cpus_per_package(&self) -> u32 {
        (0..self.counts.packages)
            .map(|p| self.cpus.iter().filter(|c| c.package == p).count() as u32)
            .max()
            .unwrap_or(1)
    }
    /// Number of packages actually present.
    pub fn num_packages(&self) -> u32 {
        self.counts.packages
    }

    fn filter(&self, f: impl Fn(&GuestCpu) -> bool) -> Vec<u32> {
        self.cpus
            .iter()
            .enumerate()
            .filter(|(_, c)| f(c))
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// vCPUs on the same core as `vcpu` (itself included), as Linux's
    /// `thread_siblings_list` shows them.
    pub fn smt_siblings(&self, vcpu: usize) -> Vec<u32> {
        let me = self.cpus[vcpu];
        let s = self.layout.smt_shift();
        self.filter(|c| c.apic_id >> s == me.apic_id >> s)
    }
    /// vCPUs sharing `vcpu`'s L2.
    pub fn l2_siblings(&self, vcpu: usize) -> Vec<u32> {
        let me = self.cpus[vcpu];
        let s = self.layout.l2_shift();
        self.filter(|c| c.apic_id >> s == me.apic_id >> s)
    }
    /// vCPUs sharing `vcpu`'s LLC.
    pub fn llc_siblings(&self, vcpu: usize) -> Vec<u32> {
        let me = self.cpus[vcpu];
        let s = self.layout.llc_shift();
        self.filter(|c| c.apic_id >> s == me.apic_id >> s)
    }
    /// vCPUs in `vcpu`'s die.
    pub fn die_siblings(&self, vcpu: usize) -> Vec<u32> {
        let me = self.cpus[vcpu];
        let s = self.layout.die_shift();
        self.filter(|c| c.apic_id >> s == me.apic_id >> s)
    }
    /// vCPUs in `vcpu`'s package.
    pub fn package_siblings(&self, vcpu: usize) -> Vec<u32> {
        let me = self.cpus[vcpu];
        self.filter(|c| c.package == me.package)
    }
    /// The core ID Linux derives for `vcpu`: APIC ID bits between the SMT
    /// field and the package field (unique within the package).
    pub fn linux_core_id(&self, vcpu: usize) -> u32 {
        let l = &self.layout;
        let width = l.package_shift() - l.smt_shift();
        (self.cpus[vcpu].apic_id >> l.smt_shift()) & ((1u32 << width) - 1)
    }

    /// A compact description like `2 packages x 3 dies x 1 LLC x 2 L2 x 1
    /// core x 2 threads, 2 nodes`.
    pub fn describe(&self) -> String {
        let c = &self.counts;
        use crate::text::plural;
        let n = |v: u32| u64::from(v);
        format!(
            "{}: {} x {} x {} x {} x {} x {}, {}",
            plural(self.cpus.len() as u64, "vCPU", "vCPUs"),
            plural(n(c.packages), "package", "packages"),
            plural(n(c.dies_per_package), "die", "dies"),
            plural(n(c.llcs_per_die), "LLC", "LLCs"),
            plural(n(c.l2s_per_llc), "L2", "L2s"),
            plural(n(c.cores_per_l2), "core", "cores"),
            plural(n(c.threads_per_core), "thread", "threads"),
            plural(n(self.num_nodes), "NUMA node", "NUMA nodes"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits() {
        assert_eq!(bits_for(0), 0);
        assert_eq!(bits_for(1), 0);
        assert_eq!(bits_for(2), 1);
        assert_eq!(bits_for(3), 2);
        assert_eq!(bits_for(4), 2);
        assert_eq!(bits_for(12), 4);
        assert_eq!(bits_for(24), 5);
        assert_eq!(bits_for(120), 7);
    }

    #[test]
    fn layout_compose_decode() {
        let l = ApicLayout {
            thread_bits: 1,
            core_bits: 0,
            l2_bits: 3,
            llc_bits: 4,
            die_bits: 0,
        };
        assert_eq!(l.l2_shift(), 1);
        assert_eq!(l.llc_shift(), 4);
        assert_eq!(l.package_shift(), 8);
        let id = l.apic_id(1, 0, 11, 7, 0, 1);
        assert_eq!(id, (1 << 8) | (11 << 4) | (7 << 1) | 1);
        assert_eq!(l.decode(id), (1, 0, 11, 7, 0, 1));
    }

    #[test]
    fn genoa_layout_matches_real_hardware() {
        // Real EPYC 9654: thread 1 bit, core-in-CCD 3 bits, CCD 4 bits.
        let g = GuestTopology::from_spec("genoa-2s").unwrap();
        assert_eq!(g.num_vcpus(), 384);
        let l = g.layout();
        assert_eq!(
            (
                l.thread_bits,
                l.core_bits,
                l.l2_bits,
                l.llc_bits,
                l.die_bits
            ),
            (1, 0, 3, 4, 0)
        );
        assert_eq!(l.package_shift(), 8);
        // vCPU 192 is the first of package 1, APIC ID 0x100.
        assert_eq!(g.cpu(192).apic_id, 0x100);
        assert_eq!(g.cpu(192).package, 1);
        assert_eq!(g.llc_siblings(0), (0..16).collect::<Vec<_>>());
        assert_eq!(g.smt_siblings(3), vec![2, 3]);
        assert_eq!(g.num_nodes(), 2);
        assert_eq!(g.node_cpus(1), (192..384).collect::<Vec<_>>());
    }

    #[test]
    fn non_power_of_two_counts() {
        // 24 cores per package without SMT: 5 core bits, IDs 24..31 unused.
        let g = GuestTopology::from_spec("package:2 l3:1 l2:24 core:1 pu:1").unwrap();
        let l = g.layout();
        assert_eq!((l.thread_bits, l.l2_bits, l.package_shift()), (0, 5, 5));
        assert_eq!(g.cpu(23).apic_id, 23);
        assert_eq!(g.cpu(24).apic_id, 32);
        assert_eq!(g.linux_core_id(24), 0);
        assert_eq!(g.linux_core_id(23), 23);
        // 3 dies x 3 cores x 2 threads.
        let g = GuestTopology::from_spec("package:2 die:3 l3:1 l2:3 core:1 pu:2").unwrap();
        let l = g.layout();
        assert_eq!(
            (l.thread_bits, l.l2_bits, l.die_bits, l.package_shift()),
            (1, 2, 2, 5)
        );
        assert_eq!(g.cpu(6).apic_id, 1 << 3); // die 1
        assert_eq!(g.cpu(18).apic_id, 1 << 5); // package 1
        assert_eq!(g.die_siblings(7), (6..12).collect::<Vec<_>>());
    }

    #[test]
    fn shared_l2_between_cores() {
        let g = GuestTopology::from_spec("package:1 l3:1 l2:2 core:4 pu:1").unwrap();
        assert_eq!(g.l2_siblings(5), vec![4, 5, 6, 7]);
        assert_eq!(g.layout().l2_shift(), 2);
    }

    #[test]
    fn single_cpu_guest() {
        let g = GuestTopology::from_spec("package:1 core:1 pu:1").unwrap();
        assert_eq!(g.num_vcpus(), 1);
        assert_eq!(g.cpu(0).apic_id, 0);
        assert_eq!(g.layout().package_shift(), 0);
        assert_eq!(g.caches().l3.unwrap().size, 32 << 20);
    }

    #[test]
    fn mirrors_a_slice_of_host_cpus() {
        let host = crate::load::load("genoa-2s").unwrap();
        // Two SMT pairs of CCD 0 and one pair of CCD 13 (package 1).
        let slice: Vec<u32> = vec![0, 1, 2, 3, 13 * 16, 13 * 16 + 1];
        let g = GuestTopology::from_host_cpus(&host, &slice).unwrap();
        assert_eq!(g.num_vcpus(), 6);
        assert_eq!(g.counts().packages, 2);
        assert_eq!(g.num_nodes(), 2);
        assert_eq!(g.smt_siblings(0), vec![0, 1]);
        assert_eq!(g.llc_siblings(0), vec![0, 1, 2, 3]);
        assert_eq!(g.llc_siblings(4), vec![4, 5]);
        assert_eq!(g.cpu(4).host_cpu, Some(208));
        assert_eq!(g.host_node(1), Some(1));
        assert_eq!(g.distance(0, 1), 21);
        assert!(GuestTopology::from_host_cpus(&host, &[]).is_err());
        assert!(GuestTopology::from_host_cpus(&host, &[1, 1]).is_err());
        assert!(GuestTopology::from_host_cpus(&host, &[384]).is_err());
    }

    #[test]
    fn distance_override() {
        let mut g = GuestTopology::from_spec("package:2 [numa] core:2 pu:1").unwrap();
        g.set_remote_distance(32).unwrap();
        assert_eq!(g.distances(), &[10, 32, 32, 10]);
        assert!(g.set_remote_distance(10).is_err());
        assert!(g.set_remote_distance(255).is_err());
    }
}
