//! What the server is started with, and why it may not start.
//!
//! WHAT: [`ServeOptions`] (the socket, the topology, the fixes, the
//! executor, per-vCPU metrics, the shared scheduler's settings) and [`ServeError`].
//! WHY: every other module of the crate reads these; keeping them in a
//! file of their own, importing no sibling, keeps the module graph
//! one-way.
//! HOW: plain types.

use std::path::PathBuf;

use vcpu_sched::Mitigations;
use vmm_machine::vcpu_body::ExecutorKind;

/// How the server runs VMs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The socket path.
    pub socket: PathBuf,
    /// The topology spec the scheduler manages (`host`, a preset, ...).
    pub topology: String,
    /// The fixes.
    pub mitigations: Mitigations,
    /// Which executor runs each VM.
    pub executor: ExecutorKind,
    /// Per-vCPU metric series.
    pub per_vcpu_metrics: bool,
    /// The shared scheduler's busy balance
    /// (`vcpu_sched::SchedConfig::busy_balance`; `vmm serve` turns it on
    /// with the workers executor unless told otherwise).
    pub busy_balance: bool,
    /// Sleeper credit for woken fair vCPUs
    /// (`vcpu_sched::SchedConfig::sleeper_credit`; off by default).
    pub sleeper_credit: bool,
    /// Fair wakeup preemption
    /// (`vcpu_sched::SchedConfig::fair_wakeup_preempt`; on by default).
    pub wakeup_preempt: bool,
    /// The fair period slices are cut from, ns
    /// (`vcpu_sched::SchedConfig::fair_latency_ns`).
    pub fair_latency_ns: u64,
    /// The shortest fair slice, ns
    /// (`vcpu_sched::SchedConfig::fair_min_granularity_ns`).
    pub fair_min_granularity_ns: u64,
    /// How the scheduler scales the fair bounds for its CPUs
    /// (`vcpu_sched::SchedConfig::fair_slice_scaling`; log by default).
    pub fair_slice_scaling: vcpu_sched::SliceScaling,
    /// The shared scheduler's tick period, ns (1 ms by default): each
    /// CPU's slice ends, deferred wakeups and balances are looked at this
    /// often (`vmm_machine::vcpu_body::ExecOptions::tick`).
    pub tick_ns: u64,
    /// How often the halt poller probes the Linux VMs' vCPUs, ns (1 ms by
    /// default; `vmm_machine::vcpu_body::ExecOptions::halt_poll`).
    pub halt_poll_ns: u64,
    /// Park the Linux VMs' halted vCPUs inside KVM, a thread each
    /// (`vmm_machine::vcpu_body::parker`), instead of probing them.
    pub halt_park: bool,
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The topology.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// The scheduler's CPU mapping.
    #[error(transparent)]
    Sched(#[from] vcpu_sched::SchedError),
    /// KVM.
    #[error(transparent)]
    Micro(#[from] vmm_machine::micro::MicroError),
    /// The shared scheduler and its workers.
    #[error("starting the shared scheduler: {0}")]
    Executor(#[from] vmm_machine::vcpu_body::TaskError),
    /// The user's input: an executor the server cannot share, a socket
    /// path the server will not take (a user's file, a live server).
    #[error("{0}")]
    Input(String),
    /// The socket, the signal handlers, the runtime.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

impl ServeError {
    /// Is it the user's mistake (a different command line would work)?
    pub fn is_user_fault(&self) -> bool {
        matches!(self, ServeError::Input(_))
    }
}
