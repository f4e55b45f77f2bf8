//! Guest RAM: one region per guest NUMA node, each bound to a host node.
//!
//! [`MemoryPlan`] splits the requested size into equal shares per guest
//! node (multiples of 2 MiB, the remainder going to the last node) and lays
//! them out back to back from guest physical address 0, skipping the MMIO
//! hole below 4 GiB. [`node_policies`] decides which host node each guest
//! node's memory must come from, and [`GuestRam::allocate`] maps the memory
//! and applies that policy with `mbind(2)` before any page is touched.

use crate::layout::MIB;

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
    /// More than the host's RAM: it could never all be backed.
    #[error("--memory {requested} is more than this host's {host} of RAM; give less")]
    BeyondHost {
        /// What was asked for.
        requested: HumanSize,
        /// The host's RAM (`MemTotal`).
        host: HumanSize,
    },
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
    /// The memfd behind shared guest memory could not be made.
    #[error("cannot create a {size} memfd for guest node {node}'s shared memory: {source}")]
    SharedFile {
        /// Guest node.
        node: u32,
        /// Size of the range.
        size: HumanSize,
        /// The OS error.
        source: std::io::Error,
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

mod host;
mod plan;
mod size;

pub use host::{node_policies, GuestRam, HostPolicy, NodePolicy};
pub use plan::{E820Entry, E820Kind, MemoryPlan, RamRange};
pub use size::{host_mem_available, host_mem_total, parse_size, HumanSize};

/// Keeps the process's own heap from creeping in a long run: fixes glibc's
/// mmap threshold at its default, 128 KiB, which also turns off its
/// dynamic adjustment (mallopt(3), `M_MMAP_THRESHOLD`). Call it once, early
/// (`vmm` does, in `main`).
///
/// WHY: glibc raises the threshold to the size of each mmapped block that
/// is freed, so after the first VM is destroyed, the large per-vCPU buffers
/// (latency histograms of a few hundred KiB) of every later VM come from
/// the malloc arenas instead of their own mappings, and arenas seldom give
/// memory back. In the 1,000-vCPU soak with a VM replaced every 2 s, the
/// arenas grew from about 5 to 13-17 MiB each while the bytes in use stayed
/// flat (docs/reliability.md). With the threshold fixed, a destroyed VM's
/// large buffers are unmapped with it.
///
/// Returns false where the C library refused (or is not glibc).
///
/// See also [`release_freed`], for what the threshold does not cover.
pub fn steady_heap() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes the allocator's tuning; it is
        // called before or between allocations like any other libc call
        // and takes no pointers.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// Hands memory the process has freed back to the kernel: glibc's
/// `malloc_trim(0)`, which returns the free pages of every malloc arena,
/// not only the top of the main one. `VcpuPool::detach` calls it each
/// time a VM leaves the shared pool: it returns what the VMs destroyed
/// before were freed of (this one's state goes when its last owner drops
/// it), so in steady churn the arenas hold about one VM's worth.
///
/// WHY: blocks under the mmap threshold ([`steady_heap`]) come from the
/// arenas, one per group of threads; with hundreds of worker threads
/// freeing a destroyed VM's state and allocating the next one's, the
/// arenas kept the freed pages: in the 600 s soak of 2026-11-26 RSS grew
/// about 1.4 MiB/min while the live heap stayed flat (docs/reliability.md).
///
/// Returns true if memory was released; false where nothing was (or the
/// C library is not glibc).
pub fn release_freed() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only returns free memory of the allocator's
        // own arenas to the kernel; it takes no pointer and is thread-safe.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}
