//! Human-readable renderings: an `lstopo`-like tree of a host, and the table
//! of what a guest is shown.

use std::fmt::Write as _;

use crate::cpulist;
use crate::guest::GuestTopology;
use crate::host::{CacheInfo, HostTopology};
// Once defined here; kept under these paths for callers outside the crate.
pub use crate::text::{human_bytes, plural};

/// An `lstopo`-like tree.
pub fn host_tree(t: &HostTopology) -> String {
    let mut out = String::new();
    // Nodes without CPUs (CXL or HBM memory, or a bare `[numa]`) are in the
    // distance table too: say so, so that the counts add up.
    let memory_only: Vec<u32> = (0..t.num_nodes() as u32)
        .filter(|&n| t.cpus_of_node(n).is_empty())
        .collect();
    machine_line(&mut out, t, memory_only.len());
    for p in 0..t.num_packages() as u32 {
        package_lines(&mut out, t, p);
    }
    for &n in &memory_only {
        let info = &t.nodes()[n as usize];
        let _ = writeln!(
            out,
            "  NUMANode {n} (P#{}{}, no CPUs)",
            info.os_index,
            memory_suffix(info.memory)
        );
    }
    if t.num_nodes() > 1 {
        distance_table(&mut out, t);
    }
    out
}

/// The first line: the source, its counts, and the nodes without CPUs.
fn machine_line(out: &mut String, t: &HostTopology, memory_only: usize) {
    let extra = if memory_only == 0 {
        String::new()
    } else {
        format!(
            ", and {} without CPUs",
            plural(memory_only as u64, "NUMA node", "NUMA nodes")
        )
    };
    let _ = writeln!(out, "Machine ({}): {}{extra}", t.source(), t.shape());
}

/// `, 16 GiB` for a node with known memory, nothing otherwise.
fn memory_suffix(memory: u64) -> String {
    if memory > 0 {
        format!(", {}", human_bytes(memory))
    } else {
        String::new()
    }
}

/// ` (32 MiB)` for a cache of known size, nothing otherwise.
fn cache_size(c: Option<CacheInfo>) -> String {
    c.map(|c| format!(" ({})", human_bytes(c.size)))
        .unwrap_or_default()
}

/// One NUMA node (that has CPUs) at `indent`.
fn node_line(out: &mut String, t: &HostTopology, indent: &str, n: u32) {
    let info = &t.nodes()[n as usize];
    let _ = writeln!(
        out,
        "{indent}NUMANode {n} (P#{}{})",
        info.os_index,
        memory_suffix(info.memory)
    );
}

/// The nodes whose CPUs all lie within `cpus` (memory-only nodes excluded).
fn nodes_within(t: &HostTopology, cpus: &[u32]) -> Vec<u32> {
    (0..t.num_nodes() as u32)
        .filter(|&n| {
            let nc = t.cpus_of_node(n);
            !nc.is_empty() && nc.iter().all(|c| cpus.contains(c))
        })
        .collect()
}

/// Package `p`: its nodes, then each die (named only when the package has
/// several) with the die's own nodes and its caches.
fn package_lines(out: &mut String, t: &HostTopology, p: u32) {
    let _ = writeln!(out, "  Package {p}");
    let pcpus = t.cpus_of_package(p);
    let mut dies: Vec<u32> = pcpus.iter().map(|&c| t.die_of(c)).collect();
    dies.dedup();
    let show_dies = dies.len() > 1;
    // Nodes that fit in one die are shown under that die.
    let die_nodes: Vec<u32> = if show_dies {
        dies.iter()
            .flat_map(|&d| nodes_within(t, t.cpus_of_die(d)))
            .collect()
    } else {
        Vec::new()
    };
    for n in nodes_within(t, pcpus) {
        if !die_nodes.contains(&n) {
            node_line(out, t, "    ", n);
        }
    }
    for &d in &dies {
        let indent = if show_dies {
            let _ = writeln!(out, "    Die {d}");
            for n in nodes_within(t, t.cpus_of_die(d)) {
                node_line(out, t, "      ", n);
            }
            "      "
        } else {
            "    "
        };
        die_caches(out, t, d, indent);
    }
}

/// The LLCs of die `d`, each with its L2s and their cores.
fn die_caches(out: &mut String, t: &HostTopology, d: u32, indent: &str) {
    let caches = t.caches();
    let llc_label = if caches.l3.is_some() { "L3" } else { "LLC" };
    let mut llcs: Vec<u32> = t.cpus_of_die(d).iter().map(|&c| t.llc_of(c)).collect();
    llcs.dedup();
    for llc in llcs {
        let _ = writeln!(out, "{indent}{llc_label} {llc}{}", cache_size(caches.l3));
        let mut l2s: Vec<u32> = t.cpus_of_llc(llc).iter().map(|&c| t.l2_of(c)).collect();
        l2s.dedup();
        for l2 in l2s {
            l2_lines(out, t, l2, indent);
        }
    }
}

/// One L2 with its cores: on one line when it holds a single core.
fn l2_lines(out: &mut String, t: &HostTopology, l2: u32, indent: &str) {
    let size = cache_size(t.caches().l2);
    let mut cores: Vec<u32> = t.cpus_of_l2(l2).iter().map(|&c| t.core_of(c)).collect();
    cores.dedup();
    let pus = |core: u32| {
        t.cpus_of_core(core)
            .iter()
            .map(|&c| format!("PU {c} (P#{})", t.os_index(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if cores.len() == 1 {
        let _ = writeln!(
            out,
            "{indent}  L2 {l2}{size} + Core {}: {}",
            cores[0],
            pus(cores[0])
        );
    } else {
        let _ = writeln!(out, "{indent}  L2 {l2}{size}");
        for core in cores {
            let _ = writeln!(out, "{indent}    Core {core}: {}", pus(core));
        }
    }
}

/// The NUMA distance matrix, one row per node.
fn distance_table(out: &mut String, t: &HostTopology) {
    let n = t.num_nodes() as u32;
    let w = (n - 1).to_string().len();
    let _ = writeln!(out, "NUMA distances between the {n} nodes:");
    let head: Vec<String> = (0..n).map(|b| format!("{b:>4}")).collect();
    let _ = writeln!(out, "  {:pad$}{}", "", head.join(""), pad = w + 6);
    for a in 0..n {
        let row: Vec<String> = (0..n).map(|b| format!("{:>4}", t.distance(a, b))).collect();
        let _ = writeln!(out, "  node {a:>w$}:{}", row.join(""));
    }
}

/// What a guest is shown: the APIC layout, and per vCPU its place in the
/// tree and the CPU lists Linux will report in sysfs.
pub fn guest_table(g: &GuestTopology) -> String {
    let mut out = String::new();
    let l = g.layout();
    let _ = writeln!(out, "Guest ({}): {}", g.source(), g.describe());
    let _ = writeln!(
        out,
        "x2APIC ID bits: thread {} | core {} | L2 {} | LLC {} | die {} | package from bit {}",
        l.thread_bits,
        l.core_bits,
        l.l2_bits,
        l.llc_bits,
        l.die_bits,
        l.package_shift()
    );
    let _ = writeln!(
        out,
        "{:>5} {:>6} {:>4} {:>4} {:>4} {:>4} {:>5} {:>4} {:>5} {:>5}  {:<12} {:<12} {:<12}",
        "vCPU",
        "APIC",
        "pkg",
        "die",
        "llc",
        "l2",
        "core",
        "thr",
        "node",
        "host",
        "smt",
        "l2 shared",
        "l3 shared"
    );
    for (i, c) in g.cpus().iter().enumerate() {
        let host = c
            .host_cpu
            .map(|h| h.to_string())
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:>5} {:>#6x} {:>4} {:>4} {:>4} {:>4} {:>5} {:>4} {:>5} {:>5}  {:<12} {:<12} {:<12}",
            i,
            c.apic_id,
            c.package,
            c.die,
            c.llc,
            c.l2,
            c.core,
            c.thread,
            c.node,
            host,
            cpulist::format(&g.smt_siblings(i)),
            cpulist::format(&g.l2_siblings(i)),
            cpulist::format(&g.llc_siblings(i)),
        );
    }
    let n = g.num_nodes() as u32;
    for a in 0..n {
        let row: Vec<String> = (0..n).map(|b| g.distance(a, b).to_string()).collect();
        let _ = writeln!(
            out,
            "node {a}: cpus {} distances {}",
            cpulist::format(&g.node_cpus(a)),
            row.join(" ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_mentions_every_level() {
        let t = crate::load::load("package:2 die:2 [numa] l3:1(size=16777216) l2:2 core:1 pu:2")
            .unwrap();
        let s = host_tree(&t);
        assert!(s.contains("Package 1"), "{s}");
        assert!(s.contains("    Die 3"), "{s}");
        assert!(s.contains("      NUMANode 3"), "{s}");
        assert!(s.contains("L3 3 (16 MiB)"), "{s}");
        assert!(s.contains("PU 15 (P#15)"), "{s}");
        assert!(s.contains("NUMA distances"), "{s}");
    }

    #[test]
    fn counts_agree_with_the_distance_table() {
        let t = crate::load::load("package:1 [numa] [numa] [numa] core:2 pu:1").unwrap();
        let s = host_tree(&t);
        assert!(
            s.contains("1 package, 1 die, 1 NUMA node, 1 LLC, 2 L2s, 2 cores, 2 CPUs, and 2 NUMA nodes without CPUs"),
            "{s}"
        );
        assert!(s.contains("NUMANode 2 (P#2, no CPUs)"), "{s}");
        assert!(s.contains("NUMA distances between the 3 nodes:"), "{s}");
        let g = GuestTopology::from_spec("core:1 pu:1").unwrap();
        assert!(
            g.describe().starts_with(
                "1 vCPU: 1 package x 1 die x 1 LLC x 1 L2 x 1 core x 1 thread, 1 NUMA node"
            ),
            "{}",
            g.describe()
        );
    }

    #[test]
    fn guest_table_lists_sharing() {
        let g = GuestTopology::from_spec("package:2 [numa] l3:1 l2:2 core:1 pu:2").unwrap();
        let s = guest_table(&g);
        assert!(s.contains("8 vCPUs: 2 packages"), "{s}");
        assert!(s.contains("node 1: cpus 4-7 distances 21 10"), "{s}");
    }
}
