//! Fix 6: per-node group load.
//!
//! WHAT: A group's (a VM's) load is kept as one counter per NUMA node
//! ([`NodeLoad`]); the total is their sum. A migration between two CPUs of
//! the same node writes nothing; one across nodes writes the two node
//! counters.
//!
//! WHY: The baseline subtracts a migrating task's weight from the group's
//! single shared sum and adds it back: two atomic writes to a line that
//! every CPU running the group writes too. With wakeup migrations at high
//! rates (netperf, hackbench) that line crosses the sockets constantly. The
//! kernel measured netperf UDP_RR +50% on Sapphire Rapids (hackbench -8%).
//!
//! HOW: Each CPU only writes its own node's counter for its group, so the
//! line is shared within a socket at most. A migration inside a node moves
//! load between two CPUs that write the same counter: the net change is
//! zero, so it is skipped. Readers sum the nodes. With a single node this
//! is the baseline counter minus the migration writes.

use crate::sync::shared::AtomicI64;

/// One group's load on one node, alone on its lines.
#[repr(align(128))]
pub struct NodeLoad {
    pub(crate) load: AtomicI64,
}

impl NodeLoad {
    pub(crate) fn new() -> Self {
        Self {
            load: AtomicI64::new(0),
        }
    }
}
