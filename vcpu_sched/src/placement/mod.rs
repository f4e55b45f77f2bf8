//! Placement: which host CPUs the vCPUs of a VM may run on, and at which
//! host policy.
//!
//! | module | what |
//! |---|---|
//! | [`pack`] | packing pinned VMs onto a host, level by level (`vmm plan`, and `vm.create` without an affinity) |
//! | [`pin`] | `--pin auto \| none \| LIST`: one VM's vCPUs onto the CPUs this process may use |
//! | [`rt`] | `--rt fifo:PRIO \| rr:PRIO \| none`, and when RT vCPU threads would starve each other |
//!
//! A placement is decided before the VM is built: its host CPUs give the
//! guest its topology (the slice of the host it runs on), its memory's
//! nodes, and the scheduler's affinities.

pub mod pack;
pub mod pin;
pub mod rt;

pub use pack::{FreeMap, Relax, VmPlan};
pub use pin::{PinError, PinPlan, PinSpec};
pub use rt::RtPolicy;
