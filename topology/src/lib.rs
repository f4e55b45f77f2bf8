//! # topology
//!
//! What the hardware looks like, and what a guest is shown.
//!
//! * [`HostTopology`] models a host (the live machine, an hwloc XML file, a
//!   synthetic description, a CPUID dump, or a named [preset](presets)) with
//!   dense indices: every logical CPU knows its core, L2, LLC, die, NUMA node
//!   and package as small integers, so that a scheduler can index arrays with
//!   them. Queries such as [`HostTopology::share_llc`] are a compare of two
//!   integers.
//! * [`GuestTopology`] is the shape a VM is given, either from the same
//!   synthetic language or mirrored from a slice of host CPUs. It computes
//!   the x2APIC ID layout ([`ApicLayout`]) and per-vCPU CPUID in Intel or AMD
//!   encoding ([`GuestTopology::cpuid`]), and writes that CPUID as an hwloc
//!   dump ([`dump::write_cpuid_dump`]) so that hwloc's own parser can judge it.
//!
//! There is one way in: hwloc 2.x through the `hwlocality` binding. The
//! description language is hwloc's synthetic format, so there is no
//! home-made syntax to learn.
//!
//! ```
//! let host = topology::load("genoa-2s").unwrap();
//! assert_eq!(host.num_llcs(), 24);
//! assert!(host.share_llc(0, 15) && !host.share_llc(0, 16));
//! let guest = topology::GuestTopology::from_spec("package:2 [numa] l3:1 l2:2 core:1 pu:2").unwrap();
//! assert_eq!(guest.num_vcpus(), 8);
//! assert_eq!(guest.cpu(4).apic_id, 4);
//! ```

#![warn(missing_docs)]

pub mod cpuid;
pub mod cpulist;
pub mod dump;
pub mod dump_read;
pub mod error;
pub mod guest;
pub mod host;
pub mod limits;
pub mod load;
pub mod presets;
pub mod render;
pub mod text;
pub mod user_file;

pub use cpuid::{CpuidEntry, CpuidSet, Vendor};
pub use error::{Result, TopologyError};
pub use guest::{ApicLayout, GuestCounts, GuestCpu, GuestTopology};
pub use host::{CacheInfo, Caches, CpuLocation, HostTopology, NodeInfo, ShapeCounts};
pub use load::{load, TopologySpec};
