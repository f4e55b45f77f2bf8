//! Where guest RAM comes from on the host: the NUMA policy per guest
//! node, and the mapping bound to it with `mbind(2)`.
//!
//! RAM is private anonymous memory, or, when another process must map it
//! too (a vhost-user backend such as virtiofsd reads and writes the
//! guest's buffers itself), shared memory: one `memfd_create(2)` file per
//! range, mapped `MAP_SHARED`, whose descriptor is handed to the backend
//! with the range's guest address ([`GuestRam::allocate`]'s `shared`).

use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::os::fd::FromRawFd;

use tracing::{debug, info};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use super::{host_mem_total, HumanSize, MemoryError, MemoryPlan};

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

/// A memfd of `size` bytes for guest node `node`'s range at `start`, its
/// pages not yet allocated (they come on first touch, as anonymous
/// memory's do).
fn memfd(node: u32, start: u64, size: u64) -> Result<File, MemoryError> {
    let err = |source| MemoryError::SharedFile {
        node,
        size: HumanSize(size),
        source,
    };
    let name = CString::new(format!("guest-ram-node{node}-{start:#x}"))
        .map_err(|e| err(std::io::Error::other(e)))?;
    // SAFETY: memfd_create reads the NUL-terminated name, which lives
    // through the call, and returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created above and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).map_err(err)?;
    Ok(file)
}

/// One range's host mapping: private anonymous, or a shared memfd.
fn map_range(r: &super::RamRange, shared: bool) -> Result<MmapRegion<()>, MemoryError> {
    let map_err = |source| MemoryError::Map {
        node: r.node,
        size: HumanSize(r.size),
        source,
    };
    if shared {
        let file = memfd(r.node, r.start, r.size)?;
        MmapRegion::<()>::from_file(FileOffset::new(file, 0), r.size as usize).map_err(map_err)
    } else {
        MmapRegion::<()>::new(r.size as usize).map_err(map_err)
    }
}

impl GuestRam {
    /// Maps the memory of `plan`, one host mapping per range, and applies
    /// `policies` (indexed by guest node) before anything touches it.
    /// More than the host's RAM is refused before anything is mapped.
    /// `shared`: each range is a memfd mapped `MAP_SHARED` (see the
    /// module docs), which vhost-user backends can map too.
    pub fn allocate(
        plan: MemoryPlan,
        policies: &[NodePolicy],
        shared: bool,
    ) -> Result<Self, MemoryError> {
        if let Some(host) = host_mem_total() {
            if plan.total() > host {
                return Err(MemoryError::BeyondHost {
                    requested: HumanSize(plan.total()),
                    host: HumanSize(host),
                });
            }
        }
        let mut regions = Vec::with_capacity(plan.ranges().len());
        for r in plan.ranges() {
            let region = map_range(r, shared)?;
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
                shared,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::MIB;

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
    fn more_than_the_host_has_is_refused_before_mapping() {
        let host = host_mem_total().expect("MemTotal");
        let want = (host + (1 << 30)) & !((1 << 30) - 1);
        let plan = MemoryPlan::new(want, 1).unwrap();
        let e = GuestRam::allocate(plan, &[], false).expect_err("refused");
        assert!(
            matches!(e, MemoryError::BeyondHost { .. })
                && e.to_string().contains("more than this host's"),
            "{e}"
        );
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
        let ram = GuestRam::allocate(plan, &pol, false).unwrap();
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

    #[test]
    fn shared_memory_is_a_memfd_another_mapping_sees() {
        use std::os::unix::fs::FileExt;
        use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};
        let plan = MemoryPlan::new(64 * MIB, 1).unwrap();
        let ram = GuestRam::allocate(plan, &[], true).unwrap();
        ram.memory()
            .write_obj(0xfeed_f00du32, GuestAddress(0x2000))
            .unwrap();
        let region = ram.memory().iter().next().unwrap();
        let fo = region.file_offset().expect("a shared region has a file");
        assert_eq!(fo.start(), 0);
        let mut b = [0u8; 4];
        fo.file().read_exact_at(&mut b, 0x2000).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0xfeed_f00d);
        // Private memory has no file.
        let plan = MemoryPlan::new(64 * MIB, 1).unwrap();
        let ram = GuestRam::allocate(plan, &[], false).unwrap();
        assert!(ram.memory().iter().next().unwrap().file_offset().is_none());
    }
}
