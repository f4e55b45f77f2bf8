//! The vCPU body: a KVM vCPU as a `vcpu_sched` task body, and the set of
//! VMs an executor runs.
//!
//! # The model
//! A vCPU is a task; a VM is a task group (so per-node group load, fix 6,
//! sees real VMs). The executors are `vcpu_sched`'s
//! ([`vcpu_sched::exec`]); this module supplies what they run: the body
//! of a vCPU (`VcpuBody`), one entry of which is one
//! `KVM_RUN` and the mapping of what comes back into an [`Action`] by the
//! VM's [`ExitMapper`]:
//!
//! | exit (micro-guests) | action | scheduler |
//! |---|---|---|
//! | `HLT` | `Block` | block until woken; a wake that came first is remembered |
//! | doorbell port | `Wake(k)` | wake vCPU `k` of the same VM, keep running |
//! | sleep port | `Sleep(ns)` | block, with a timer that wakes |
//! | yield port | `Yield` | requeue behind equal priorities |
//! | kick (`EINTR`) | `Continue` | a preemption checkpoint, then back in |
//! | done port | `Exit` | the task ends; the VM goes on |
//! | triple fault, bad request, KVM error | `Fail(reason)` | the VM is stopped, reported and torn down |
//!
//! The mapper is all a guest type has to provide. A Linux guest with the
//! in-kernel LAPIC maps `HLT` nowhere (it stays in KVM) and instead
//! answers a kick with a sleep when it finds the vCPU halted
//! ([`ExitMapper::on_kicked`]); a thread outside the executor can wake a
//! sleeping vCPU with [`Running::wake`].
//!
//! # Preemption
//! The scheduler preempts a running vCPU through its hooks: the vCPU's
//! [`Kicker`](crate::vcpu::Kicker) sets `immediate_exit` and signals the
//! thread in `KVM_RUN`, which returns `EINTR` (see [`crate::vcpu`]). Every
//! executor checks for pending scheduler work right before it enters the
//! body; a kick that lands after the check is caught by `immediate_exit`.
//!
//! # Executors
//! [`Running`] runs a [`VmSet`] on any executor kind ([`ExecutorKind`]:
//! `workers`, M:N, the default; `threads`, a thread per vCPU with run
//! slots; `host`, plain 1:1 threads the host kernel schedules, as Cloud
//! Hypervisor and Firecracker run vCPUs). [`VcpuPool`] is one M:N
//! executor that sets join and leave while others run (`vmm serve`). Why
//! `workers` is the default is measured in `docs/results-vcpus.md`.

mod body;
pub mod linux;
pub mod parker;
pub mod poll_hub;
mod run;
mod set;
mod stages;

pub use set::{VcpuMetrics, VcpuSlot, VcpuState, VmEntry, VmSet, Window};
pub use stages::{Stages, STAGES};

pub use run::{
    ExecOptions, ExecOutcome, Running, VcpuPool, VcpuWaker, DEFAULT_HALT_POLL, DEFAULT_TICK,
};
pub use vcpu_sched::exec::ExecutorKind;

use std::any::Any;
use std::sync::Arc;

use vcpu_sched::{CpuMask, Policy};

use crate::vcpu::{PortIo, Vcpu, VcpuExit};
use crate::vm::{StopReason, VmControl};

/// What a vCPU exit means to its executor: `vcpu_sched`'s action, with a
/// vCPU index of the same VM as the wake target and a VM stop reason as
/// the failure.
pub type Action = vcpu_sched::exec::Action<usize, StopReason>;

/// How one VM's vCPU exits become scheduler actions. One per VM, shared
/// by its vCPUs (so `Send + Sync`). Called on the thread running the vCPU;
/// must not block.
pub trait ExitMapper: Send + Sync {
    /// The device side the vCPUs run against.
    fn io(&self) -> &dyn PortIo;
    /// Maps an exit of `vcpu` (never [`VcpuExit::Kicked`]).
    fn map_exit(&self, vcpu: &Vcpu, exit: VcpuExit) -> Action;
    /// `KVM_RUN` returned because of a kick. `Some` for a reason of the
    /// mapper's own (a fault its device side recorded; a halted vCPU found
    /// through `KVM_GET_MP_STATE` or the stats fd); `None` when it was the
    /// scheduler's preemption (the default).
    fn on_kicked(&self, _vcpu: &Vcpu) -> Option<Action> {
        None
    }
    /// Called on the thread about to enter `KVM_RUN` for `vcpu`, right
    /// before it does: a mapper whose other threads issue ioctls on a
    /// vCPU that is out of the guest (the Linux halt poller's probe) takes
    /// the vCPU back here. Wrapping mappers must forward it.
    fn before_entry(&self, _vcpu: &Vcpu) {}
    /// Does a wake end this guest's sleeps early? A sleep the guest asked
    /// for (the micro-guests' sleep port) lasts its time, and a wake in
    /// between is kept for the guest's next `HLT` (false, the default); a
    /// sleep the VMM imposes on a halted vCPU (Linux) ends as soon as the
    /// vCPU is woken (true).
    fn wake_ends_sleep(&self) -> bool {
        false
    }
    /// The VM's vCPUs are tasks of an executor now and are about to run:
    /// `waker` wakes them from other threads (a micro-guest's device
    /// interrupts). Called once per run, before any vCPU enters the guest.
    fn attached(&self, _waker: VcpuWaker) {}
    /// Its vCPUs wait inside `KVM_RUN` when the guest halts (the
    /// in-kernel LAPIC), holding the worker that runs them: the M:N
    /// executor watches for that ([`BlockWatch`](crate::vcpu::block_watch::BlockWatch)).
    fn halts_in_kvm(&self) -> bool {
        false
    }
}

/// Scheduling attributes of one vCPU task.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The scheduler policy (and, for the host executor, the thread's).
    pub policy: Policy,
    /// Logical CPUs it may run on (`None`: all).
    pub affinity: Option<CpuMask>,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            policy: Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
            affinity: None,
        }
    }
}

/// A VM handed to an executor.
pub struct GuestVm {
    /// Its name (reports, group name).
    pub name: String,
    /// The vCPUs, index order.
    pub vcpus: Vec<Vcpu>,
    /// Exit mapping and device side.
    pub mapper: Arc<dyn ExitMapper>,
    /// Stop requests (its vCPUs' kickers registered).
    pub control: Arc<VmControl>,
    /// One entry per vCPU, or a single entry for all.
    pub placement: Vec<Placement>,
    /// Dropped when the last vCPU has ended: the VM fd, memory, ...
    pub keep: Box<dyn Any + Send>,
}

/// Errors of the vCPU body and its runs.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A bad request.
    #[error("{0}")]
    Input(String),
    /// The scheduler or an executor refused.
    #[error(transparent)]
    Sched(#[from] vcpu_sched::SchedError),
    /// vCPUs did not end in time.
    #[error("{0}")]
    Stuck(String),
    /// The topology (reading the host's, or a spec).
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// A vCPU (the kick signal).
    #[error(transparent)]
    Vcpu(#[from] crate::vcpu::VcpuError),
}
