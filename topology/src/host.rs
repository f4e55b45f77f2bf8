//! The host model: every logical CPU with dense indices for its core, L2,
//! LLC, die, NUMA node and package.
//!
//! Dense means "small integers from 0 that can index arrays": the scheduler
//! keeps per-LLC and per-node arrays and must never hash or search to find a
//! CPU's LLC. Logical CPU `i` here is hwloc's logical PU index, which follows
//! the tree (SMT siblings are neighbours); the operating system's number for
//! the same CPU is [`CpuLocation::os_index`], which is what affinity calls need.
//!
//! Levels that the source does not describe collapse onto the level below:
//! no L2 object means each core is its own L2; no L3 means the L2 is the LLC,
//! and with no cache information at all the die is the LLC (as Linux does
//! when a machine reports no caches). No die object means one die per package.

use serde::Serialize;

use crate::error::{Result, TopologyError};

/// Default NUMA distance of a node to itself (ACPI SLIT convention).
pub const LOCAL_DISTANCE: u32 = 10;
/// Default distance between two different nodes when the source has none.
pub const REMOTE_DISTANCE: u32 = 21;

/// Where one logical CPU sits. All fields but `os_index` are dense indices
/// into the host's arrays of cores, L2s, LLCs, dies, nodes and packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CpuLocation {
    /// The operating system's CPU number (hwloc's PU os_index).
    pub os_index: u32,
    /// Dense core index.
    pub core: u32,
    /// Dense L2 index.
    pub l2: u32,
    /// Dense last-level-cache index.
    pub llc: u32,
    /// Dense die index (global, not per package).
    pub die: u32,
    /// Dense NUMA node index.
    pub node: u32,
    /// Dense package index.
    pub package: u32,
}

/// One cache level's geometry, as far as the source knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CacheInfo {
    /// Size in bytes.
    pub size: u64,
    /// Line size in bytes (64 when unknown).
    pub line_size: u32,
    /// Associativity; 0 when unknown or fully associative.
    pub ways: u32,
}

/// The cache geometry of a (first) CPU. Sizes are per instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Caches {
    /// L1 data cache.
    pub l1d: Option<CacheInfo>,
    /// L1 instruction cache.
    pub l1i: Option<CacheInfo>,
    /// Unified L2.
    pub l2: Option<CacheInfo>,
    /// Unified L3.
    pub l3: Option<CacheInfo>,
}

/// A NUMA node of the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    /// The operating system's node number.
    pub os_index: u32,
    /// Local memory in bytes (0 when unknown).
    pub memory: u64,
}

/// A CPU as a source describes it, before dense renumbering. The ids can be
/// any unique keys (hwloc's persistent object indices, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawCpu {
    /// OS CPU number.
    pub os_index: u32,
    /// Key of the core.
    pub core: u64,
    /// Key of the L2 group.
    pub l2: u64,
    /// Key of the LLC group.
    pub llc: u64,
    /// Key of the die.
    pub die: u64,
    /// Index into the `nodes` list given alongside.
    pub node: u32,
    /// Key of the package.
    pub package: u64,
}

/// The host (or an emulated host) topology with dense indices.
#[derive(Clone, Debug, Serialize)]
pub struct HostTopology {
    source: String,
    cpus: Vec<CpuLocation>,
    core_cpus: Vec<Vec<u32>>,
    l2_cpus: Vec<Vec<u32>>,
    llc_cpus: Vec<Vec<u32>>,
    die_cpus: Vec<Vec<u32>>,
    node_cpus: Vec<Vec<u32>>,
    package_cpus: Vec<Vec<u32>>,
    node_llcs: Vec<Vec<u32>>,
    nodes: Vec<NodeInfo>,
    distances: Vec<u32>,
    caches: Caches,
    #[serde(skip)]
    synthetic: Option<String>,
}

/// Renumbers keys densely in order of first appearance.
struct Densifier<K: Eq + std::hash::Hash + Copy> {
    map: std::collections::HashMap<K, u32>,
}

impl<K: Eq + std::hash::Hash + Copy> Densifier<K> {
    fn new() -> Self {
        Self {
            map: std::collections::HashMap::new(),
        }
    }
    fn get(&mut self, k: K) -> u32 {
        let n = self.map.len() as u32;
        *self.map.entry(k).or_insert(n)
    }
    fn len(&self) -> usize {
        self.map.len()
    }
}

fn group(cpus: &[CpuLocation], n: usize, key: impl Fn(&CpuLocation) -> u32) -> Vec<Vec<u32>> {
    let mut out = vec![Vec::new(); n];
    for (i, c) in cpus.iter().enumerate() {
        out[key(c) as usize].push(i as u32);
    }
    out
}

/// How many cores, L2s, LLCs, dies and packages the dense numbering made.
#[derive(Clone, Copy, Debug)]
struct LevelCounts {
    cores: usize,
    l2s: usize,
    llcs: usize,
    dies: usize,
    packages: usize,
}

/// Renumbers the raw CPUs' keys densely, level by level, in order of first
/// appearance. Fails on a CPU listed twice or a node index out of range.
fn densify(raw: &[RawCpu], n_nodes: usize) -> Result<(Vec<CpuLocation>, LevelCounts)> {
    let (mut dc, mut dl2, mut dllc, mut ddie, mut dpkg) = (
        Densifier::new(),
        Densifier::new(),
        Densifier::new(),
        Densifier::new(),
        Densifier::new(),
    );
    let mut seen_os = std::collections::HashSet::new();
    let mut cpus = Vec::with_capacity(raw.len());
    for r in raw {
        if !seen_os.insert(r.os_index) {
            return Err(TopologyError::Unsupported(format!(
                "CPU {} appears twice",
                r.os_index
            )));
        }
        if r.node as usize >= n_nodes {
            return Err(TopologyError::Unsupported(format!(
                "CPU {} refers to NUMA node {} of {}",
                r.os_index, r.node, n_nodes
            )));
        }
        cpus.push(CpuLocation {
            os_index: r.os_index,
            core: dc.get(r.core),
            l2: dl2.get(r.l2),
            llc: dllc.get(r.llc),
            die: ddie.get(r.die),
            node: r.node,
            package: dpkg.get(r.package),
        });
    }
    let counts = LevelCounts {
        cores: dc.len(),
        l2s: dl2.len(),
        llcs: dllc.len(),
        dies: ddie.len(),
        packages: dpkg.len(),
    };
    Ok((cpus, counts))
}

/// Checks that each of `n_child` children (keyed by `child`) has exactly
/// one parent (keyed by `parent`); `what` words the failure.
fn check_nesting(
    cpus: &[CpuLocation],
    n_child: usize,
    child: impl Fn(&CpuLocation) -> u32,
    parent: impl Fn(&CpuLocation) -> u32,
    what: &str,
) -> Result<()> {
    let mut owner = vec![u32::MAX; n_child];
    for c in cpus {
        let slot = &mut owner[child(c) as usize];
        if *slot == u32::MAX {
            *slot = parent(c);
        } else if *slot != parent(c) {
            return Err(TopologyError::Unsupported(format!(
                "{what} (CPU {} crosses the boundary)",
                c.os_index
            )));
        }
    }
    Ok(())
}

/// The levels nest: core inside L2 inside LLC inside die inside package,
/// and each core inside one NUMA node.
fn check_levels_nest(cpus: &[CpuLocation], n: &LevelCounts) -> Result<()> {
    type Key = fn(&CpuLocation) -> u32;
    let levels: [(usize, Key, Key, &str); 5] = [
        (n.cores, |c| c.core, |c| c.l2, "a core spans two L2 caches"),
        (n.l2s, |c| c.l2, |c| c.llc, "an L2 spans two LLCs"),
        (n.llcs, |c| c.llc, |c| c.die, "an LLC spans two dies"),
        (n.dies, |c| c.die, |c| c.package, "a die spans two packages"),
        (
            n.cores,
            |c| c.core,
            |c| c.node,
            "a core spans two NUMA nodes",
        ),
    ];
    for (n_child, child, parent, what) in levels {
        check_nesting(cpus, n_child, child, parent, what)?;
    }
    Ok(())
}

/// The distance matrix as given, or the default one. A given matrix must be
/// `n_nodes` squared and shaped as an ACPI SLIT, since that is where a
/// guest's copy goes: 10 on the diagonal, 11..=255 elsewhere (255:
/// unreachable). Linux checks the same (`slit_valid`) and drops a table
/// that breaks it, so a guest would silently lose its NUMA distances.
fn distance_matrix(distances: Option<Vec<u32>>, n_nodes: usize) -> Result<Vec<u32>> {
    let Some(d) = distances else {
        return Ok(default_distances(n_nodes));
    };
    if d.len() != n_nodes * n_nodes {
        return Err(TopologyError::Unsupported(format!(
            "distance matrix has {} entries for {} nodes",
            d.len(),
            n_nodes
        )));
    }
    const FIX: &str = "NUMA distances are relative, as in an ACPI SLIT or \
                       `numactl --hardware`: 10 from a node to itself, 11..=255 \
                       between nodes; fix the XML's <distances2> values, or \
                       remove the element to get 10 and 21";
    for a in 0..n_nodes {
        for b in 0..n_nodes {
            let v = d[a * n_nodes + b];
            let ok = if a == b {
                v == 10
            } else {
                (11..=255).contains(&v)
            };
            if !ok {
                return Err(TopologyError::Unsupported(format!(
                    "NUMA distance from node {a} to node {b} is {v}. {FIX}"
                )));
            }
        }
    }
    Ok(d)
}

/// Per node, the LLCs with at least one CPU on it, in order of appearance.
fn llcs_per_node(cpus: &[CpuLocation], n_nodes: usize) -> Vec<Vec<u32>> {
    let mut node_llcs = vec![Vec::new(); n_nodes];
    for c in cpus {
        let v: &mut Vec<u32> = &mut node_llcs[c.node as usize];
        if !v.contains(&c.llc) {
            v.push(c.llc);
        }
    }
    node_llcs
}

impl HostTopology {
    /// Builds the model from CPUs in logical order (SMT siblings and cache
    /// neighbours adjacent, as hwloc orders them).
    ///
    /// `distances` is a row-major `nodes.len()` squared matrix; `None` gives
    /// 10 on the diagonal and 21 elsewhere. Fails if the levels do not nest
    /// (core inside L2 inside LLC inside die inside package).
    pub fn from_raw(
        source: impl Into<String>,
        raw: &[RawCpu],
        nodes: Vec<NodeInfo>,
        distances: Option<Vec<u32>>,
        caches: Caches,
    ) -> Result<Self> {
        if raw.is_empty() {
            return Err(TopologyError::Unsupported(
                "the topology has no CPUs".into(),
            ));
        }
        if nodes.is_empty() {
            return Err(TopologyError::Unsupported(
                "the topology has no NUMA node".into(),
            ));
        }
        let n_nodes = nodes.len();
        let (cpus, n) = densify(raw, n_nodes)?;
        check_levels_nest(&cpus, &n)?;
        let distances = distance_matrix(distances, n_nodes)?;
        Ok(Self {
            source: source.into(),
            core_cpus: group(&cpus, n.cores, |c| c.core),
            l2_cpus: group(&cpus, n.l2s, |c| c.l2),
            llc_cpus: group(&cpus, n.llcs, |c| c.llc),
            die_cpus: group(&cpus, n.dies, |c| c.die),
            node_cpus: group(&cpus, n_nodes, |c| c.node),
            package_cpus: group(&cpus, n.packages, |c| c.package),
            node_llcs: llcs_per_node(&cpus, n_nodes),
            cpus,
            nodes,
            distances,
            caches,
            synthetic: None,
        })
    }

    pub(crate) fn set_synthetic(&mut self, s: Option<String>) {
        self.synthetic = s;
    }

    pub(crate) fn rename(&mut self, source: &str) {
        self.source = source.to_string();
    }

    /// A model of only `cpus` (dense indices of `self`), renumbered densely.
    /// Nodes without any of these CPUs are dropped. This is how a host is
    /// narrowed to the CPUs a process may use, or a big emulated topology to
    /// a slice of it.
    pub fn restrict(&self, cpus: &[u32]) -> Result<Self> {
        let mut sorted = cpus.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Err(TopologyError::Guest("no CPUs selected".into()));
        }
        if let Some(&bad) = sorted.iter().find(|&&c| c as usize >= self.cpus.len()) {
            return Err(TopologyError::Guest(format!(
                "CPU {bad} does not exist (the topology has {} CPUs)",
                self.cpus.len()
            )));
        }
        let mut used_nodes: Vec<u32> = sorted.iter().map(|&c| self.cpus[c as usize].node).collect();
        used_nodes.sort_unstable();
        used_nodes.dedup();
        let node_map = |n: u32| used_nodes.binary_search(&n).unwrap() as u32;
        let raw: Vec<RawCpu> = sorted
            .iter()
            .map(|&c| {
                let l = &self.cpus[c as usize];
                RawCpu {
                    os_index: l.os_index,
                    core: l.core as u64,
                    l2: l.l2 as u64,
                    llc: l.llc as u64,
                    die: l.die as u64,
                    node: node_map(l.node),
                    package: l.package as u64,
                }
            })
            .collect();
        let nodes = used_nodes
            .iter()
            .map(|&n| self.nodes[n as usize].clone())
            .collect();
        let mut dist = Vec::with_capacity(used_nodes.len() * used_nodes.len());
        for &a in &used_nodes {
            for &b in &used_nodes {
                dist.push(self.distance(a, b));
            }
        }
        HostTopology::from_raw(
            format!(
                "{} restricted to {}",
                self.source,
                crate::cpulist::format(&sorted)
            ),
            &raw,
            nodes,
            Some(dist),
            self.caches,
        )
    }

    /// Where the topology came from (a preset name, a path, `host`, ...).
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Number of logical CPUs.
    pub fn num_cpus(&self) -> usize {
        self.cpus.len()
    }
    /// Number of physical cores.
    pub fn num_cores(&self) -> usize {
        self.core_cpus.len()
    }
    /// Number of L2 groups.
    pub fn num_l2s(&self) -> usize {
        self.l2_cpus.len()
    }
    /// Number of last-level caches.
    pub fn num_llcs(&self) -> usize {
        self.llc_cpus.len()
    }
    /// Number of dies.
    pub fn num_dies(&self) -> usize {
        self.die_cpus.len()
    }
    /// Number of NUMA nodes (including nodes without CPUs).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }
    /// Number of packages (sockets).
    pub fn num_packages(&self) -> usize {
        self.package_cpus.len()
    }
    /// All CPUs, indexed by dense CPU index.
    pub fn cpus(&self) -> &[CpuLocation] {
        &self.cpus
    }
    /// One CPU's location. Panics if `cpu` is out of range (a programming
    /// error: dense indices come from this model).
    #[inline]
    pub fn cpu(&self, cpu: u32) -> &CpuLocation {
        &self.cpus[cpu as usize]
    }
    /// The OS CPU number of dense CPU `cpu`.
    #[inline]
    pub fn os_index(&self, cpu: u32) -> u32 {
        self.cpus[cpu as usize].os_index
    }
    /// The dense index of OS CPU `os`.
    pub fn cpu_by_os_index(&self, os: u32) -> Option<u32> {
        self.cpus
            .iter()
            .position(|c| c.os_index == os)
            .map(|i| i as u32)
    }
    /// Do `a` and `b` share a physical core (SMT siblings, or the same CPU)?
    #[inline]
    pub fn share_smt(&self, a: u32, b: u32) -> bool {
        self.cpu(a).core == self.cpu(b).core
    }
    /// Do `a` and `b` share an L2?
    #[inline]
    pub fn share_l2(&self, a: u32, b: u32) -> bool {
        self.cpu(a).l2 == self.cpu(b).l2
    }
    /// Do `a` and `b` share a last-level cache?
    #[inline]
    pub fn share_llc(&self, a: u32, b: u32) -> bool {
        self.cpu(a).llc == self.cpu(b).llc
    }
    /// Are `a` and `b` on the same NUMA node?
    #[inline]
    pub fn share_node(&self, a: u32, b: u32) -> bool {
        self.cpu(a).node == self.cpu(b).node
    }
    /// Dense core index of `cpu`.
    #[inline]
    pub fn core_of(&self, cpu: u32) -> u32 {
        self.cpu(cpu).core
    }
    /// Dense L2 index of `cpu`.
    #[inline]
    pub fn l2_of(&self, cpu: u32) -> u32 {
        self.cpu(cpu).l2
    }
    /// Dense LLC index of `cpu`.
    #[inline]
    pub fn llc_of(&self, cpu: u32) -> u32 {
        self.cpu(cpu).llc
    }
    /// Dense die index of `cpu`.
    #[inline]
    pub fn die_of(&self, cpu: u32) -> u32 {
        self.cpu(cpu).die
    }
    /// Dense NUMA node index of `cpu`.
    #[inline]
    pub fn node_of(&self, cpu: u32) -> u32 {
        self.cpu(cpu).node
    }
    /// Dense package index of `cpu`.
    #[inline]
    pub fn package_of(&self, cpu: u32) -> u32 {
        self.cpu(cpu).package
    }
    /// The CPUs of core `core`, in logical order.
    pub fn cpus_of_core(&self, core: u32) -> &[u32] {
        &self.core_cpus[core as usize]
    }
    /// The CPUs sharing L2 `l2`.
    pub fn cpus_of_l2(&self, l2: u32) -> &[u32] {
        &self.l2_cpus[l2 as usize]
    }
    /// The CPUs sharing LLC `llc`.
    pub fn cpus_of_llc(&self, llc: u32) -> &[u32] {
        &self.llc_cpus[llc as usize]
    }
    /// The CPUs of die `die`.
    pub fn cpus_of_die(&self, die: u32) -> &[u32] {
        &self.die_cpus[die as usize]
    }
    /// The CPUs of NUMA node `node` (empty for a memory-only node).
    pub fn cpus_of_node(&self, node: u32) -> &[u32] {
        &self.node_cpus[node as usize]
    }
    /// The CPUs of package `package`.
    pub fn cpus_of_package(&self, package: u32) -> &[u32] {
        &self.package_cpus[package as usize]
    }
    /// The LLCs with at least one CPU on `node`.
    pub fn llcs_of_node(&self, node: u32) -> &[u32] {
        &self.node_llcs[node as usize]
    }
    /// NUMA distance between nodes `a` and `b` (ACPI SLIT units: 10 = local).
    #[inline]
    pub fn distance(&self, a: u32, b: u32) -> u32 {
        self.distances[a as usize * self.nodes.len() + b as usize]
    }
    /// The whole distance matrix, row-major.
    pub fn distances(&self) -> &[u32] {
        &self.distances
    }
    /// Node descriptions (OS index and memory), by dense node index.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }
    /// Cache geometry.
    pub fn caches(&self) -> &Caches {
        &self.caches
    }
    /// Overrides the cache geometry (used where a source lacks it).
    pub fn set_caches(&mut self, caches: Caches) {
        self.caches = caches;
    }

    /// hwloc's synthetic description of this topology, when it is symmetric
    /// and came through hwloc.
    pub fn synthetic(&self) -> Result<&str> {
        self.synthetic.as_deref().ok_or(TopologyError::NotSymmetric)
    }

    /// Counts of every level, for summaries and tests.
    pub fn shape(&self) -> ShapeCounts {
        ShapeCounts {
            packages: self.num_packages(),
            dies: self.num_dies(),
            nodes: self
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.node_cpus[*i].is_empty())
                .count(),
            llcs: self.num_llcs(),
            l2s: self.num_l2s(),
            cores: self.num_cores(),
            cpus: self.num_cpus(),
        }
    }
}

/// How many of each level a topology has, in total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShapeCounts {
    /// Packages (sockets).
    pub packages: usize,
    /// Dies.
    pub dies: usize,
    /// NUMA nodes with CPUs.
    pub nodes: usize,
    /// Last-level caches.
    pub llcs: usize,
    /// L2 groups.
    pub l2s: usize,
    /// Cores.
    pub cores: usize,
    /// Logical CPUs.
    pub cpus: usize,
}

impl std::fmt::Display for ShapeCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::plural;
        let n = |v: usize| v as u64;
        write!(
            f,
            "{}, {}, {}, {}, {}, {}, {}",
            plural(n(self.packages), "package", "packages"),
            plural(n(self.dies), "die", "dies"),
            plural(n(self.nodes), "NUMA node", "NUMA nodes"),
            plural(n(self.llcs), "LLC", "LLCs"),
            plural(n(self.l2s), "L2", "L2s"),
            plural(n(self.cores), "core", "cores"),
            plural(n(self.cpus), "CPU", "CPUs"),
        )
    }
}

/// A `n` x `n` matrix with [`LOCAL_DISTANCE`] on the diagonal and
/// [`REMOTE_DISTANCE`] elsewhere.
pub fn default_distances(n: usize) -> Vec<u32> {
    uniform_distances(n, REMOTE_DISTANCE)
}

/// A `n` x `n` matrix with 10 on the diagonal and `remote` elsewhere.
pub fn uniform_distances(n: usize, remote: u32) -> Vec<u32> {
    let mut d = vec![remote; n * n];
    for i in 0..n {
        d[i * n + i] = LOCAL_DISTANCE;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 packages x 2 LLCs x 2 cores x 2 threads, one node per package,
    /// built by hand so the test does not depend on hwloc.
    fn small() -> HostTopology {
        let mut raw = Vec::new();
        for i in 0..16u32 {
            let core = (i / 2) as u64;
            raw.push(RawCpu {
                os_index: i,
                core,
                l2: core,
                llc: (i / 4) as u64,
                die: (i / 8) as u64,
                node: i / 8,
                package: (i / 8) as u64,
            });
        }
        let nodes = (0..2)
            .map(|n| NodeInfo {
                os_index: n,
                memory: 1 << 30,
            })
            .collect();
        HostTopology::from_raw("hand", &raw, nodes, None, Caches::default()).unwrap()
    }

    #[test]
    fn queries() {
        let t = small();
        assert_eq!(t.num_cpus(), 16);
        assert_eq!(t.num_cores(), 8);
        assert_eq!(t.num_llcs(), 4);
        assert_eq!(t.num_nodes(), 2);
        assert!(t.share_smt(0, 1) && !t.share_smt(1, 2));
        assert!(t.share_l2(2, 3) && !t.share_l2(3, 4));
        assert!(t.share_llc(0, 3) && !t.share_llc(3, 4));
        assert_eq!(t.node_of(7), 0);
        assert_eq!(t.node_of(8), 1);
        assert_eq!(t.package_of(15), 1);
        assert_eq!(t.cpus_of_llc(1), &[4, 5, 6, 7]);
        assert_eq!(t.llcs_of_node(1), &[2, 3]);
        assert_eq!(t.distance(0, 0), 10);
        assert_eq!(t.distance(0, 1), 21);
        assert_eq!(t.cpus_of_core(3), &[6, 7]);
        assert_eq!(t.cpu_by_os_index(9), Some(9));
        assert_eq!(
            t.shape().to_string(),
            "2 packages, 2 dies, 2 NUMA nodes, 4 LLCs, 8 L2s, 8 cores, 16 CPUs"
        );
    }

    #[test]
    fn restrict_renumbers_densely() {
        let t = small();
        let r = t.restrict(&[9, 8, 12, 13]).unwrap();
        assert_eq!(r.num_cpus(), 4);
        assert_eq!(r.num_nodes(), 1);
        assert_eq!(r.num_llcs(), 2);
        assert_eq!(r.os_index(0), 8);
        assert!(r.share_smt(0, 1));
        assert!(!r.share_llc(1, 2));
        assert_eq!(r.distance(0, 0), 10);
        assert!(t.restrict(&[]).is_err());
        assert!(t
            .restrict(&[16])
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
    }

    #[test]
    fn rejects_bad_nesting() {
        let mut raw = vec![
            RawCpu {
                os_index: 0,
                core: 0,
                l2: 0,
                llc: 0,
                die: 0,
                node: 0,
                package: 0,
            },
            RawCpu {
                os_index: 1,
                core: 0,
                l2: 1,
                llc: 0,
                die: 0,
                node: 0,
                package: 0,
            },
        ];
        let nodes = vec![NodeInfo {
            os_index: 0,
            memory: 0,
        }];
        let e =
            HostTopology::from_raw("x", &raw, nodes.clone(), None, Caches::default()).unwrap_err();
        assert!(e.to_string().contains("core spans two L2"), "{e}");
        raw[1].l2 = 0;
        raw[1].os_index = 0;
        assert!(
            HostTopology::from_raw("x", &raw, nodes, None, Caches::default())
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }
}
