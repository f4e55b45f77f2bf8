//! Where vCPU threads run: `--pin auto | none | LIST`.
//!
//! `auto` matches the guest's shape onto the host CPUs this process may
//! use, level by level:
//! * each guest NUMA node gets a host node of its own;
//! * inside it, each guest LLC gets a host LLC of its own, large enough for
//!   all its cores;
//! * inside that, each guest core gets a host core with at least as many
//!   hardware threads, and guest SMT siblings land on that core's threads.
//!
//! Guest cores are placed in order on host cores in order, so cores that
//! share a guest L2 land on neighbouring host cores (on the same host L2
//! where the host's L2 groups are large enough). The search is greedy
//! (first host node that fits, smallest host LLC that fits), which finds a
//! placement for every symmetric shape; when none exists the error says
//! what the guest needs and what the host has.

use std::collections::BTreeMap;

use topology::{GuestTopology, HostTopology};

/// `--pin` as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PinSpec {
    /// No pinning: the host scheduler places the threads.
    #[default]
    None,
    /// Match the guest's shape onto host CPUs.
    Auto,
    /// vCPU `i` on host CPU `list[i]` (OS numbers).
    List(Vec<u32>),
}

impl PinSpec {
    /// Parses `auto`, `none` or a CPU list (`0-7`, `0,2,4`). The list's
    /// order is kept: vCPU `i` goes to its `i`-th CPU.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(PinSpec::Auto),
            "none" | "" => Ok(PinSpec::None),
            list => {
                let mut out = Vec::new();
                for item in list.split(',') {
                    let item = item.trim();
                    let num = |x: &str| {
                        x.trim().parse::<u32>().map_err(|_| {
                            format!(
                                "{s:?} is not `auto`, `none` or a CPU list like 0-7 or 0,2,4 \
                                 ({x:?} is not a CPU number)"
                            )
                        })
                    };
                    match item.split_once('-') {
                        Some((a, b)) => {
                            let (a, b) = (num(a)?, num(b)?);
                            if a > b || b - a > 65536 {
                                return Err(format!("{s:?}: range {item:?} is not a valid range"));
                            }
                            out.extend(a..=b);
                        }
                        None => out.push(num(item)?),
                    }
                }
                let mut seen = out.clone();
                seen.sort_unstable();
                if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                    return Err(format!(
                        "{s:?} lists CPU {} twice: each vCPU needs its own host CPU",
                        w[0]
                    ));
                }
                Ok(PinSpec::List(out))
            }
        }
    }
}

/// A placement: vCPU `i` runs on host CPU `dense[i]` (dense index of the
/// host model), which the OS calls `os[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinPlan {
    /// Dense host CPU indices.
    pub dense: Vec<u32>,
    /// OS CPU numbers, for affinity calls.
    pub os: Vec<u32>,
}

/// Why a placement is impossible (the message is the whole story).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PinError(pub String);

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// Resolves `spec` for `guest` on `host` (the CPUs this process may use).
pub fn plan(
    spec: &PinSpec,
    guest: &GuestTopology,
    host: &HostTopology,
) -> Result<Option<PinPlan>, PinError> {
    match spec {
        PinSpec::None => Ok(None),
        PinSpec::List(list) => {
            if list.len() != guest.num_vcpus() {
                return Err(PinError(format!(
                    "--pin lists {} but the guest has {}: give one host CPU per vCPU, \
                     or use --pin auto or --pin none",
                    plural(list.len(), "CPU"),
                    plural(guest.num_vcpus(), "vCPU")
                )));
            }
            let allowed: Vec<u32> = host.cpus().iter().map(|c| c.os_index).collect();
            let mut dense = Vec::with_capacity(list.len());
            for &os in list {
                match host.cpu_by_os_index(os) {
                    Some(d) => dense.push(d),
                    None => {
                        return Err(PinError(format!(
                            "--pin: host CPU {os} is not one this process may use (allowed: {})",
                            topology::cpulist::format(&allowed)
                        )))
                    }
                }
            }
            Ok(Some(PinPlan {
                dense,
                os: list.clone(),
            }))
        }
        PinSpec::Auto => auto(guest, host).map(Some),
    }
}

/// A guest LLC: its cores, each a list of vCPUs (SMT siblings).
type GuestLlc = Vec<Vec<u32>>;
/// A host LLC: its cores, each a list of dense CPUs.
type HostLlc = Vec<Vec<u32>>;

fn guest_shape(guest: &GuestTopology) -> Result<Vec<Vec<GuestLlc>>, PinError> {
    let l = guest.layout();
    // node -> llc key -> core key -> vcpus
    let mut nodes: BTreeMap<u32, BTreeMap<u32, BTreeMap<u32, Vec<u32>>>> = BTreeMap::new();
    let mut llc_node: BTreeMap<u32, u32> = BTreeMap::new();
    for (i, c) in guest.cpus().iter().enumerate() {
        let llc = c.apic_id >> l.llc_shift();
        let core = c.apic_id >> l.smt_shift();
        if let Some(&n) = llc_node.get(&llc) {
            if n != c.node {
                return Err(PinError(
                    "--pin auto: a guest LLC spans two guest NUMA nodes, which no host LLC \
                     can mirror: use --pin none or an explicit list"
                        .into(),
                ));
            }
        }
        llc_node.insert(llc, c.node);
        nodes
            .entry(c.node)
            .or_default()
            .entry(llc)
            .or_default()
            .entry(core)
            .or_default()
            .push(i as u32);
    }
    Ok(nodes
        .into_values()
        .map(|llcs| {
            llcs.into_values()
                .map(|cores| cores.into_values().collect())
                .collect()
        })
        .collect())
}

fn host_shape(host: &HostTopology) -> Vec<Vec<HostLlc>> {
    (0..host.num_nodes() as u32)
        .map(|n| {
            host.llcs_of_node(n)
                .iter()
                .map(|&llc| {
                    let mut cores: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
                    for &c in host.cpus_of_llc(llc) {
                        cores.entry(host.core_of(c)).or_default().push(c);
                    }
                    cores.into_values().collect()
                })
                .collect()
        })
        .filter(|llcs: &Vec<HostLlc>| !llcs.is_empty())
        .collect()
}

/// Can `g` go into `h`: enough cores with enough threads each?
fn llc_fits(g: &GuestLlc, h: &HostLlc) -> bool {
    let mut need: Vec<usize> = g.iter().map(|c| c.len()).collect();
    need.sort_unstable_by(|a, b| b.cmp(a));
    let mut have: Vec<usize> = h.iter().map(|c| c.len()).collect();
    have.sort_unstable_by(|a, b| b.cmp(a));
    need.len() <= have.len() && need.iter().zip(&have).all(|(n, h)| n <= h)
}

/// Places a guest node's LLCs into a host node's LLCs (distinct, smallest
/// that fits first). Returns host LLC indices per guest LLC.
fn place_node(g: &[GuestLlc], h: &[HostLlc]) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(g[i].len()));
    let mut used = vec![false; h.len()];
    let mut out = vec![usize::MAX; g.len()];
    for gi in order {
        let best = (0..h.len())
            .filter(|&hi| !used[hi] && llc_fits(&g[gi], &h[hi]))
            .min_by_key(|&hi| (h[hi].len(), hi))?;
        used[best] = true;
        out[gi] = best;
    }
    Some(out)
}

fn describe_guest(g: &[Vec<GuestLlc>]) -> String {
    let llcs = g.iter().map(|n| n.len()).max().unwrap_or(0);
    let cores = g
        .iter()
        .flat_map(|n| n.iter().map(|l| l.len()))
        .max()
        .unwrap_or(0);
    let threads = g
        .iter()
        .flat_map(|n| n.iter().flat_map(|l| l.iter().map(|c| c.len())))
        .max()
        .unwrap_or(0);
    format!(
        "{} x {} x {} x {}",
        plural(g.len(), "node"),
        plural(llcs, "LLC"),
        plural(cores, "core"),
        plural(threads, "thread")
    )
}

fn describe_host(h: &[Vec<HostLlc>], host: &HostTopology) -> String {
    let llcs: usize = h.iter().map(|n| n.len()).sum();
    let cores = h
        .iter()
        .flat_map(|n| n.iter().map(|l| l.len()))
        .max()
        .unwrap_or(0);
    let threads = h
        .iter()
        .flat_map(|n| n.iter().flat_map(|l| l.iter().map(|c| c.len())))
        .max()
        .unwrap_or(0);
    let allowed: Vec<u32> = host.cpus().iter().map(|c| c.os_index).collect();
    format!(
        "the host CPUs this process may use ({}) have {}, {} in all, of up to {} x {}",
        topology::cpulist::format(&allowed),
        plural(h.len(), "node"),
        plural(llcs, "LLC"),
        plural(cores, "core"),
        plural(threads, "thread")
    )
}

fn auto(guest: &GuestTopology, host: &HostTopology) -> Result<PinPlan, PinError> {
    let g = guest_shape(guest)?;
    let h = host_shape(host);
    let hint = "use --pin none or an explicit --pin list";
    if g.len() > h.len() {
        return Err(PinError(format!(
            "--pin auto: the guest needs {} ({}), but {}: {hint}",
            plural(g.len(), "NUMA node"),
            describe_guest(&g),
            describe_host(&h, host)
        )));
    }
    if guest.num_vcpus() > host.num_cpus() {
        return Err(PinError(format!(
            "--pin auto: the guest has {} but only {} may be used: {hint}",
            plural(guest.num_vcpus(), "vCPU"),
            plural(host.num_cpus(), "host CPU")
        )));
    }
    let mut dense = vec![u32::MAX; guest.num_vcpus()];
    let mut node_used = vec![false; h.len()];
    for (gn, gnode) in g.iter().enumerate() {
        let found = (0..h.len())
            .filter(|&hn| !node_used[hn])
            .find_map(|hn| place_node(gnode, &h[hn]).map(|p| (hn, p)));
        let Some((hn, llc_map)) = found else {
            return Err(PinError(format!(
                "--pin auto: guest node {gn} needs {} of {} x {}, which no free host node \
                 can hold ({}): {hint}",
                plural(gnode.len(), "LLC"),
                plural(gnode.iter().map(|l| l.len()).max().unwrap_or(0), "core"),
                plural(
                    gnode
                        .iter()
                        .flat_map(|l| l.iter().map(|c| c.len()))
                        .max()
                        .unwrap_or(0),
                    "thread"
                ),
                describe_host(&h, host)
            )));
        };
        node_used[hn] = true;
        for (gl, &hl) in gnode.iter().zip(&llc_map) {
            let hcores = &h[hn][hl];
            let mut free = vec![true; hcores.len()];
            for gcore in gl {
                // First free host core with enough threads (in host order,
                // so neighbouring guest cores stay neighbours).
                let hc = (0..hcores.len())
                    .find(|&i| free[i] && hcores[i].len() >= gcore.len())
                    .expect("llc_fits checked the capacity");
                free[hc] = false;
                for (t, &v) in gcore.iter().enumerate() {
                    dense[v as usize] = hcores[hc][t];
                }
            }
        }
    }
    let os = dense.iter().map(|&d| host.os_index(d)).collect();
    Ok(PinPlan { dense, os })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(PinSpec::parse("auto").unwrap(), PinSpec::Auto);
        assert_eq!(PinSpec::parse("none").unwrap(), PinSpec::None);
        assert_eq!(
            PinSpec::parse("0-3").unwrap(),
            PinSpec::List(vec![0, 1, 2, 3])
        );
        assert_eq!(
            PinSpec::parse("4,0, 2").unwrap(),
            PinSpec::List(vec![4, 0, 2])
        );
        assert!(PinSpec::parse("0,0").unwrap_err().contains("twice"));
        assert!(PinSpec::parse("3-1").is_err());
        assert!(PinSpec::parse("fast").unwrap_err().contains("not `auto`"));
    }

    fn check_shape(g: &GuestTopology, host: &HostTopology, p: &PinPlan) {
        let n = g.num_vcpus();
        let mut seen = p.dense.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n, "distinct host CPUs");
        for a in 0..n {
            for b in 0..n {
                let (ha, hb) = (p.dense[a], p.dense[b]);
                let gs = |f: fn(&GuestTopology, usize) -> Vec<u32>| f(g, a).contains(&(b as u32));
                assert_eq!(
                    gs(GuestTopology::smt_siblings),
                    host.share_smt(ha, hb),
                    "SMT {a} {b}"
                );
                if gs(GuestTopology::llc_siblings) {
                    assert!(host.share_llc(ha, hb), "LLC {a} {b}");
                } else {
                    assert!(!host.share_llc(ha, hb), "distinct LLCs {a} {b}");
                }
                assert_eq!(
                    g.cpu(a).node == g.cpu(b).node,
                    host.share_node(ha, hb),
                    "node {a} {b}"
                );
            }
        }
    }

    #[test]
    fn auto_on_genoa() {
        let host = topology::load("genoa-2s").unwrap();
        for spec in [
            "package:2 [numa] l3:1 l2:2 core:1 pu:2",
            "package:2 [numa] l3:2 l2:4 core:1 pu:2",
            "package:2 [numa] l3:3 l2:5 core:1 pu:2",
            "package:1 l3:1 l2:8 core:1 pu:1",
        ] {
            let g = GuestTopology::from_spec(spec).unwrap();
            let p = plan(&PinSpec::Auto, &g, &host).unwrap().unwrap();
            check_shape(&g, &host, &p);
        }
        // Guest node 0 on host node 0, node 1 on host node 1.
        let g = GuestTopology::from_spec("package:2 [numa] l3:1 l2:2 core:1 pu:2").unwrap();
        let p = plan(&PinSpec::Auto, &g, &host).unwrap().unwrap();
        assert_eq!(p.dense, vec![0, 1, 2, 3, 192, 193, 194, 195]);
    }

    #[test]
    fn auto_errors_say_why() {
        let host = topology::load("package:1 [numa] l3:1 l2:2 core:1 pu:1").unwrap();
        let g = GuestTopology::from_spec("package:2 [numa] l3:1 l2:2 core:1 pu:2").unwrap();
        let e = plan(&PinSpec::Auto, &g, &host).unwrap_err().to_string();
        assert!(
            e.contains("the guest needs 2 NUMA nodes") && e.contains("--pin none"),
            "{e}"
        );
        // SMT guest on a host without SMT.
        let host = topology::load("package:2 [numa] l3:1 l2:8 core:1 pu:1").unwrap();
        let e = plan(&PinSpec::Auto, &g, &host).unwrap_err().to_string();
        assert!(
            e.contains("guest node 0 needs 1 LLC of 2 cores x 2 threads"),
            "{e}"
        );
        // An LLC too big for any host LLC.
        let host = topology::load("genoa-2s").unwrap();
        let g = GuestTopology::from_spec("package:1 l3:1 l2:16 core:1 pu:2").unwrap();
        assert!(plan(&PinSpec::Auto, &g, &host).is_err());
        // More vCPUs than CPUs.
        let host = topology::load("package:1 core:2 pu:1").unwrap();
        let g = GuestTopology::from_spec("package:1 core:3 pu:1").unwrap();
        let e = plan(&PinSpec::Auto, &g, &host).unwrap_err().to_string();
        assert!(e.contains("3 vCPUs but only 2 host CPUs"), "{e}");
    }

    #[test]
    fn lists() {
        let host = topology::load("package:1 core:4 pu:1").unwrap();
        let g = GuestTopology::from_spec("package:1 core:2 pu:1").unwrap();
        let p = plan(&PinSpec::List(vec![3, 1]), &g, &host)
            .unwrap()
            .unwrap();
        assert_eq!(p.os, vec![3, 1]);
        let e = plan(&PinSpec::List(vec![1]), &g, &host)
            .unwrap_err()
            .to_string();
        assert!(e.contains("lists 1 CPU but the guest has 2 vCPUs"), "{e}");
        let e = plan(&PinSpec::List(vec![1, 9]), &g, &host)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host CPU 9 is not one this process may use (allowed: 0-3)"),
            "{e}"
        );
        assert_eq!(plan(&PinSpec::None, &g, &host).unwrap(), None);
    }
}
