//! Where a device VM of `blk` or `net` runs (a leaf: both workloads and
//! the runner that places them use it).

use vmm_machine::vcpu_body::Placement;

/// Where one `blk` or `net` VM runs: its one vCPU's placement and its
/// devices' I/O threads' host CPUs (`None`: not placed).
#[derive(Clone, Debug, Default)]
pub(crate) struct VmPlace {
    pub(crate) vcpu: Placement,
    pub(crate) io_cpus: Option<Vec<usize>>,
}
