//! # vcpu_sched
//!
//! A user-level scheduler for vCPU threads with the six contention fixes of
//! the design notes, each switchable through one [`Mitigations`] value.
//!
//! * The **core** ([`Scheduler`]) holds data and decisions and owns no
//!   threads: per-CPU runqueues (RT priority bitmap with FIFO lists, and a
//!   CFS-style fair queue), the root domain (cpupri, RT overload tracking,
//!   push and pull), per-LLC shared runqueues, idle tracking with idle load
//!   balancing, lock-free wake lists, and per-group load. Callers pass the
//!   time; the core tells them which CPU needs attention through a
//!   [`KickCpu`].
//! * **Executors** drive it. [`exec::ThreadsExecutor`] runs each task on
//!   an OS thread that only runs while it holds its CPU's run slot, on the
//!   real CPUs or on a big topology emulated onto them.
//! * **Workloads** ([`workload`]) shaped like the seeds' benchmarks, a
//!   runner that returns a serialisable report, and a comparison runner
//!   ([`bench`](mod@bench)) that interleaves mitigation sets and renders the seeds'
//!   table.
//! * **Checking**: the [invariant checker](check), loom tests of the wake
//!   list and the idle accounting (`RUSTFLAGS="--cfg loom" cargo test -p
//!   vcpu_sched --release --lib loom`), and the stress tests in `tests/`.
//!
//! Two crates compile these sources. `vcpu_sched` is the production form:
//! every shared atomic and lock is the `std` one. `vcpu_sched_sim`
//! (`vcpu_sched/sim/`) builds them with `--cfg sim`: the sync layer
//! reports every shared access and `exec::sim`, the deterministic
//! simulator, exists. Only the simulator's binary (`vmm-sim`) links it,
//! so no Cargo feature can switch the production form's layer on. The
//! core's unit tests run in `vcpu_sched`, the simulator's in
//! `vcpu_sched_sim`.
//!
//! ```
//! use std::sync::Arc;
//! use vcpu_sched::*;
//! let topo = Arc::new(topology::load("package:1 l3:1 l2:2 core:1 pu:2").unwrap());
//! let s = Scheduler::new(topo, Mitigations::all(), SchedConfig::default(), Arc::new(NoKick)).unwrap();
//! let t = s.add_task(&TaskSpec::new("vcpu0").policy(Policy::Fifo(50)), 0).unwrap();
//! s.wake(t, None, 10).unwrap();
//! let cpu = s.task_cpu(t).unwrap(); // where it was sent (its wake list)
//! assert_eq!(s.schedule(cpu, Prev::Keep, 20).unwrap(), Pick::Switch(t));
//! assert_eq!(s.schedule(cpu, Prev::Block, 30).unwrap(), Pick::Idle);
//! // a CPU it does not manage is a typed error, not a panic
//! assert!(matches!(s.schedule(99, Prev::Keep, 40), Err(SchedError::NoSuchCpu { cpu: 99, ncpus: 4 })));
//! ```

#![warn(missing_docs)]

pub mod bench;
pub mod check;
pub mod comparison;
pub mod config;
pub mod cpumask;
pub mod cpupri;
pub mod error;
pub mod exec;
pub mod fixes;
pub mod group_load;
pub mod histogram;
pub mod idle;
pub mod mitigations;
pub mod os_thread;
pub mod placement;
pub mod rng;
pub mod rq;
pub mod rto;
pub mod sched;
pub mod shared_rq;
pub mod stats;
pub mod task;
pub mod topo;
pub mod wakelist;
pub mod workload;

mod fair_rq;
mod rt_rq;
#[cfg(not(all(not(loom), sim)))]
mod sync;
#[cfg(all(not(loom), sim))]
pub mod sync;
mod tasks;

#[cfg(all(test, not(loom), not(sim)))]
mod core_tests;
#[cfg(all(test, not(loom), not(sim)))]
mod layout_tests;
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom), not(sim)))]
mod wiring_tests;

pub use check::{InvariantChecker, Liveness, RtWait, SnapshotReport};
pub use config::{FairBounds, SchedConfig, SliceScaling};
pub use cpumask::{AtomicCpuMask, CpuMask, MAX_CPUS};
pub use error::{Result, SchedError};
pub use mitigations::{Fix, Mitigations};
pub use sched::{GroupInfo, KickCpu, NoKick, Pick, Prev, Scheduler};
pub use stats::{Histogram, SchedCounters, TaskStats};
pub use task::{CpuId, GroupId, Policy, TaskId, TaskSpec, TaskState};
pub use topo::TopoMap;

/// The padding of shared hot types: 128 bytes, two cache lines, because
/// x86's adjacent-line prefetcher fetches 64-byte lines in pairs, so two
/// hot fields 64 bytes apart still interfere.
pub const CACHE_PAD: usize = 128;
