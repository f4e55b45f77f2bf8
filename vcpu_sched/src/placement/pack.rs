//! `vmm plan` and `vm.create`'s placement: packing pinned VMs onto a host.
//!
//! WHAT: [`pack`] places N VMs of one guest shape (or [`place`] one VM
//! next to VMs already placed) onto host CPUs, aligned level by level:
//! * a guest NUMA node gets a host NUMA node of its own (per VM);
//! * a guest LLC gets a host LLC of its own, inside that node;
//! * a guest L2 group gets a host L2 group of its own, inside that LLC;
//! * a guest core gets a whole free host core (never shared with another
//!   guest core, so an RT vCPU never has a sibling from another VM), and
//!   guest SMT siblings land on that core's threads.
//!
//! [`Relax`] lets a request give up the L2 or LLC rule: a guest L2 (or
//! LLC) may then be split across host L2s (LLCs) of the same host LLC
//! (node). A request that does not fit is refused with a [`PlanError`]
//! naming the VM, the guest level that did not fit and what the host had
//! left.
//!
//! WHY: operators packing RT transcoding VMs need each guest's view of
//! its caches to be true on the host, or the guest scheduler's L2/LLC
//! decisions are wrong; the API's `vm.create` uses the same code when no
//! `cpus.affinity` is given, so a plan printed by `vmm plan` is what the
//! server would do.
//!
//! HOW: greedy best fit with no backtracking: guest units in order, each
//! onto the free host unit with the fewest free cores that still fits.
//! A VM is tried on a copy of the free map and committed only if all of it
//! fits.

use std::collections::BTreeMap;

use serde::Serialize;
use topology::{GuestTopology, HostTopology};

/// Which alignment rules a request gives up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Relax {
    /// A guest L2 group may span host L2 groups (of one host LLC).
    #[serde(default)]
    pub l2: bool,
    /// A guest LLC may span host LLCs (of one host NUMA node).
    #[serde(default)]
    pub llc: bool,
}

impl Relax {
    /// Parses `none` or a comma list of `l2`, `llc`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut r = Relax::default();
        for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match item {
                "none" => {}
                "l2" => r.l2 = true,
                "llc" => r.llc = true,
                other => {
                    return Err(format!(
                        "unknown level {other:?}; give none, l2, llc or l2,llc"
                    ))
                }
            }
        }
        Ok(r)
    }
}

/// Why a request does not fit (the message is the whole story).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

/// One VM's placement: vCPU `i` on host CPU `dense[i]` (the host model's
/// dense index), which the OS calls `os[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VmPlan {
    /// Dense host CPU per vCPU.
    pub dense: Vec<u32>,
    /// OS CPU number per vCPU.
    pub os: Vec<u32>,
}

/// One entry of Cloud Hypervisor's `cpus.affinity`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuAffinity {
    /// The vCPU index.
    pub vcpu: u32,
    /// Host CPUs (OS numbers) it may run on.
    pub host_cpus: Vec<u32>,
}

impl VmPlan {
    /// As `cpus.affinity`: each vCPU pinned to its one host CPU.
    pub fn affinity(&self) -> Vec<CpuAffinity> {
        self.os
            .iter()
            .enumerate()
            .map(|(i, &c)| CpuAffinity {
                vcpu: i as u32,
                host_cpus: vec![c],
            })
            .collect()
    }
}

/// Guest tree: node -> LLC -> L2 -> core -> vCPUs.
type Tree = Vec<Vec<Vec<Vec<u32>>>>;

fn guest_tree(g: &GuestTopology, relax: Relax) -> Vec<Tree> {
    type Key = (u32, u32, u32);
    type Cores = BTreeMap<u32, Vec<u32>>;
    let mut m: BTreeMap<u32, BTreeMap<Key, BTreeMap<u32, Cores>>> = BTreeMap::new();
    for (i, c) in g.cpus().iter().enumerate() {
        m.entry(c.node)
            .or_default()
            .entry((c.package, c.die, c.llc))
            .or_default()
            .entry(c.l2)
            .or_default()
            .entry(c.core)
            .or_default()
            .push(i as u32);
    }
    m.into_values()
        .map(|llcs| {
            let mut out: Vec<Vec<Vec<Vec<u32>>>> = Vec::new();
            for l2s in llcs.into_values() {
                let mut llc: Vec<Vec<Vec<u32>>> = Vec::new();
                for cores in l2s.into_values() {
                    let cores: Vec<Vec<u32>> = cores.into_values().collect();
                    if relax.l2 {
                        llc.extend(cores.into_iter().map(|c| vec![c]));
                    } else {
                        llc.push(cores);
                    }
                }
                if relax.llc {
                    out.extend(llc.into_iter().map(|l2| vec![l2]));
                } else {
                    out.push(llc);
                }
            }
            out
        })
        .collect()
}

/// The host's cores, grouped node -> LLC -> L2 -> core (dense CPUs).
struct Host {
    nodes: Vec<Vec<Vec<Vec<u32>>>>, // node -> llc -> l2 -> cores (core ids)
}

fn host_tree(h: &HostTopology) -> Host {
    let mut m: BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, Vec<u32>>>> = BTreeMap::new();
    for c in 0..h.num_cpus() as u32 {
        let core = h.core_of(c);
        let e = m
            .entry(h.node_of(c))
            .or_default()
            .entry(h.llc_of(c))
            .or_default()
            .entry(h.l2_of(c))
            .or_default();
        if !e.contains(&core) {
            e.push(core);
        }
    }
    Host {
        nodes: m
            .into_values()
            .map(|l| {
                l.into_values()
                    .map(|l2| l2.into_values().collect())
                    .collect()
            })
            .collect(),
    }
}

/// Host CPUs in use (dense index), shared by successive [`place`] calls.
#[derive(Clone, Debug)]
pub struct FreeMap {
    used: Vec<bool>,
}

impl FreeMap {
    /// All of `host` free.
    pub fn new(host: &HostTopology) -> Self {
        Self {
            used: vec![false; host.num_cpus()],
        }
    }
    /// Marks CPUs (dense) used or free.
    pub fn set(&mut self, dense: &[u32], used: bool) {
        for &c in dense {
            if let Some(u) = self.used.get_mut(c as usize) {
                *u = used;
            }
        }
    }
    fn core_free(&self, host: &HostTopology, core: u32) -> Option<usize> {
        let cpus = host.cpus_of_core(core);
        cpus.iter()
            .all(|&c| !self.used[c as usize])
            .then_some(cpus.len())
    }
    fn free_cores<'a>(&self, host: &HostTopology, cores: impl Iterator<Item = &'a u32>) -> usize {
        cores
            .filter(|&&c| self.core_free(host, c).is_some())
            .count()
    }
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// Places one guest L2 group (cores of vCPUs) into host L2 `cores`.
fn put_l2(
    host: &HostTopology,
    free: &mut FreeMap,
    g: &[Vec<u32>],
    cores: &[u32],
    out: &mut [u32],
) -> bool {
    let mut picked = Vec::new();
    for gc in g {
        let Some(&hc) = cores.iter().find(|&&hc| {
            !picked.contains(&hc) && free.core_free(host, hc).is_some_and(|n| n >= gc.len())
        }) else {
            return false;
        };
        picked.push(hc);
    }
    for (gc, &hc) in g.iter().zip(&picked) {
        let cpus = host.cpus_of_core(hc);
        for (t, &v) in gc.iter().enumerate() {
            out[v as usize] = cpus[t];
        }
        free.set(cpus, true);
    }
    true
}

/// Places one guest LLC into host LLC `l2s`; distinct host L2s per guest L2.
fn put_llc(
    host: &HostTopology,
    free: &mut FreeMap,
    g: &[Vec<Vec<u32>>],
    l2s: &[Vec<u32>],
    out: &mut [u32],
    share: bool,
) -> bool {
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(g[i].len()));
    let mut used_l2 = vec![false; l2s.len()];
    for gi in order {
        // Best fit: the host L2 with the fewest free cores that still holds it.
        let mut cands: Vec<usize> = (0..l2s.len())
            .filter(|&i| !used_l2[i] && free.free_cores(host, l2s[i].iter()) >= g[gi].len())
            .collect();
        cands.sort_by_key(|&i| (free.free_cores(host, l2s[i].iter()), i));
        let mut done = false;
        for hi in cands {
            let mut trial = free.clone();
            if put_l2(host, &mut trial, &g[gi], &l2s[hi], out) {
                *free = trial;
                used_l2[hi] = !share;
                done = true;
                break;
            }
        }
        if !done {
            return false;
        }
    }
    true
}

fn put_node(
    host: &HostTopology,
    free: &mut FreeMap,
    g: &[Vec<Vec<Vec<u32>>>],
    llcs: &[Vec<Vec<u32>>],
    out: &mut [u32],
    relax: Relax,
) -> bool {
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(g[i].iter().map(Vec::len).sum::<usize>()));
    let mut used_llc = vec![false; llcs.len()];
    for gi in order {
        let need: usize = g[gi].iter().map(Vec::len).sum();
        let mut cands: Vec<usize> = (0..llcs.len())
            .filter(|&i| !used_llc[i] && free.free_cores(host, llcs[i].iter().flatten()) >= need)
            .collect();
        cands.sort_by_key(|&i| (free.free_cores(host, llcs[i].iter().flatten()), i));
        let mut done = false;
        for hi in cands {
            let mut trial = free.clone();
            if put_llc(host, &mut trial, &g[gi], &llcs[hi], out, relax.l2) {
                *free = trial;
                used_llc[hi] = !relax.llc;
                done = true;
                break;
            }
        }
        if !done {
            return false;
        }
    }
    true
}

fn describe_free(host: &HostTopology, h: &Host, free: &FreeMap) -> String {
    let per_node: Vec<String> = h
        .nodes
        .iter()
        .enumerate()
        .map(|(n, llcs)| {
            let best = llcs
                .iter()
                .map(|l| free.free_cores(host, l.iter().flatten()))
                .max()
                .unwrap_or(0);
            format!(
                "node {n}: {} free, at most {best} in one LLC",
                plural(
                    free.free_cores(host, llcs.iter().flatten().flatten()),
                    "core"
                )
            )
        })
        .collect();
    per_node.join("; ")
}

/// Places one VM of shape `guest` on the CPUs of `host` that `free` says
/// are free, and marks them used. `label` names the VM in errors.
pub fn place(
    host: &HostTopology,
    guest: &GuestTopology,
    relax: Relax,
    free: &mut FreeMap,
    label: &str,
) -> Result<VmPlan, PlanError> {
    let g = guest_tree(guest, relax);
    let h = host_tree(host);
    let mut out = vec![u32::MAX; guest.num_vcpus()];
    let mut trial = free.clone();
    let mut used_node = vec![false; h.nodes.len()];
    for (gn, gnode) in g.iter().enumerate() {
        let need: usize = gnode.iter().flatten().map(Vec::len).sum();
        let threads = gnode
            .iter()
            .flatten()
            .flatten()
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        let mut placed = false;
        for (hnode, used) in h.nodes.iter().zip(used_node.iter_mut()) {
            if *used {
                continue;
            }
            let mut t2 = trial.clone();
            if put_node(host, &mut t2, gnode, hnode, &mut out, relax) {
                trial = t2;
                *used = true;
                placed = true;
                break;
            }
        }
        if !placed {
            let biggest = gnode
                .iter()
                .map(|l| l.iter().map(Vec::len).sum::<usize>())
                .max();
            return Err(PlanError(format!(
                "{label}: guest node {gn} ({} in {}, the largest LLC {} of {} threads, \
                 {}) fits in no host node left ({})",
                plural(need, "core"),
                plural(gnode.len(), "LLC"),
                plural(biggest.unwrap_or(0), "core"),
                threads,
                if relax.l2 {
                    "L2 relaxed"
                } else {
                    "each guest L2 on one host L2"
                },
                describe_free(host, &h, &trial)
            )));
        }
    }
    *free = trial;
    let os = out.iter().map(|&d| host.os_index(d)).collect();
    Ok(VmPlan { dense: out, os })
}

/// Packs `vms` VMs of shape `guest` onto an empty `host`.
pub fn pack(
    host: &HostTopology,
    guest: &GuestTopology,
    vms: usize,
    relax: Relax,
) -> Result<Vec<VmPlan>, PlanError> {
    let mut free = FreeMap::new(host);
    (0..vms)
        .map(|i| place(host, guest, relax, &mut free, &format!("VM {i} of {vms}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the promises of the module doc on a packing.
    fn check(host: &HostTopology, g: &GuestTopology, plans: &[VmPlan], relax: Relax) {
        let mut all: Vec<u32> = plans.iter().flat_map(|p| p.dense.clone()).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a host CPU given twice");
        let mut core_owner = BTreeMap::new();
        for (vm, p) in plans.iter().enumerate() {
            for a in 0..g.num_vcpus() {
                let ha = p.dense[a];
                let gcore = (
                    g.cpu(a).package,
                    g.cpu(a).die,
                    g.cpu(a).llc,
                    g.cpu(a).l2,
                    g.cpu(a).core,
                );
                let prev = core_owner.insert(host.core_of(ha), (vm, gcore));
                assert!(
                    prev.is_none() || prev == Some((vm, gcore)),
                    "host core shared"
                );
                for b in 0..g.num_vcpus() {
                    let hb = p.dense[b];
                    let same =
                        |f: fn(&GuestTopology, usize) -> Vec<u32>| f(g, a).contains(&(b as u32));
                    assert_eq!(same(GuestTopology::smt_siblings), host.share_smt(ha, hb));
                    if same(GuestTopology::l2_siblings) && !relax.l2 {
                        assert!(host.share_l2(ha, hb), "guest L2 split");
                    }
                    if same(GuestTopology::llc_siblings) && !relax.llc {
                        assert!(host.share_llc(ha, hb), "guest LLC split");
                    }
                    if !same(GuestTopology::llc_siblings) && !relax.llc {
                        assert!(!host.share_llc(ha, hb), "two guest LLCs on one host LLC");
                    }
                    if !same(GuestTopology::l2_siblings) && !relax.l2 && !relax.llc {
                        assert!(!host.share_l2(ha, hb), "two guest L2s on one host L2");
                    }
                    assert_eq!(g.cpu(a).node == g.cpu(b).node, host.share_node(ha, hb));
                }
            }
        }
    }

    #[test]
    fn packs_presets_aligned() {
        for (hs, gs, vms) in [
            ("genoa-2s", "package:1 l3:1 l2:4 core:1 pu:2", 40),
            ("genoa-2s", "package:2 [numa] l3:2 l2:2 core:1 pu:2", 10),
            ("gnr-2s", "package:1 l3:1 l2:8 core:1 pu:2", 30),
            ("gnr-2s", "package:2 [numa] l3:1 l2:4 core:1 pu:1", 25),
        ] {
            let host = topology::load(hs).unwrap();
            let g = GuestTopology::from_spec(gs).unwrap();
            let p = pack(&host, &g, vms, Relax::default()).unwrap();
            assert_eq!(p.len(), vms);
            check(&host, &g, &p, Relax::default());
        }
    }

    #[test]
    fn fills_a_host_then_says_where() {
        // genoa-2s: 2 nodes x 12 LLCs x 8 cores x 2 threads. An 8-core
        // guest LLC fits one per host LLC: 24 fit, the 25th does not.
        let host = topology::load("genoa-2s").unwrap();
        let g = GuestTopology::from_spec("package:1 l3:1 l2:8 core:1 pu:2").unwrap();
        let p = pack(&host, &g, 24, Relax::default()).unwrap();
        check(&host, &g, &p, Relax::default());
        let e = pack(&host, &g, 25, Relax::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("VM 24 of 25: guest node 0"), "{e}");
        assert!(
            e.contains("node 0: 0 cores free") && e.contains("node 1: 0 cores free"),
            "{e}"
        );
    }

    #[test]
    fn relax_llc_splits_only_when_asked() {
        // A 12-core guest LLC is larger than any genoa LLC (8 cores).
        let host = topology::load("genoa-2s").unwrap();
        let g = GuestTopology::from_spec("package:1 l3:1 l2:12 core:1 pu:2").unwrap();
        let e = pack(&host, &g, 1, Relax::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("the largest LLC 12 cores"), "{e}");
        let r = Relax {
            l2: false,
            llc: true,
        };
        let p = pack(&host, &g, 2, r).unwrap();
        check(&host, &g, &p, r);
        let llcs: std::collections::BTreeSet<u32> =
            p[0].dense.iter().map(|&c| host.llc_of(c)).collect();
        assert!(llcs.len() > 1);
    }

    #[test]
    fn numa_guest_needs_two_nodes() {
        let host = topology::load("package:1 [numa] l3:2 l2:4 core:1 pu:2").unwrap();
        let g = GuestTopology::from_spec("package:2 [numa] l3:1 l2:2 core:1 pu:2").unwrap();
        let e = pack(&host, &g, 1, Relax::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("guest node 1") && e.contains("fits in no host node left"),
            "{e}"
        );
    }

    #[test]
    fn affinity_json_is_ch_shaped() {
        let host = topology::load("package:1 l3:1 l2:4 core:1 pu:2").unwrap();
        let g = GuestTopology::from_spec("package:1 l3:1 l2:2 core:1 pu:2").unwrap();
        let p = pack(&host, &g, 2, Relax::default()).unwrap();
        let j = serde_json::to_value(p[1].affinity()).unwrap();
        assert_eq!(j.as_array().unwrap().len(), 4);
        assert_eq!(j[0]["vcpu"], 0);
        assert_eq!(j[0]["host_cpus"].as_array().unwrap().len(), 1);
        assert!(Relax::parse("l3").is_err());
        assert_eq!(
            Relax::parse("l2,llc").unwrap(),
            Relax {
                l2: true,
                llc: true
            }
        );
    }
}
