//! The deterministic simulator: the real scheduler core driven in virtual
//! time on a topology much larger than the host. It exists in the
//! `vcpu_sched_sim` build of these sources (`--cfg sim`), whose sync layer
//! reports every shared access; `vcpu_sched`, the one `vmm` links, has
//! neither.
//!
//! One thread, one event queue ordered by (virtual ns, sequence number),
//! one simulated CPU per topology CPU. Each event calls the same
//! [`Scheduler`](crate::Scheduler) entry points the thread executor calls (`wake`,
//! `schedule`, `tick`); there is no scheduling decision here. While a core
//! call runs, the [`sync`](crate::sync) layer reports every shared access
//! (line, kind); the [`coherence`] model charges them on the calling CPU in
//! virtual time, so the call ends at `now + instructions + memory`. Kicks
//! the core sends become events at the kicked CPU, one transfer later.
//!
//! Tasks follow small behaviour models of the seeds' workloads
//! ([`SimWorkload`]); VMs are task groups. Same inputs and seed give the
//! same report, byte for byte. The [`InvariantChecker`](crate::check::InvariantChecker) observes the core
//! every 10 ms of virtual time.

//!
//! Files, by concern: `workload` what to simulate, `state` the
//! simulated machine and its set-up, `events` the CPUs' events and core
//! calls, `model` the workloads' behaviour, `memory` what a core call
//! costs, `report` what a run reports; [`coherence`] and [`costs`] the
//! memory model, `queue` the event queue, [`regions`] the names of the
//! core's structures.

mod calls;
pub mod coherence;
pub mod contention;
pub mod costs;
mod events;
mod interleave;
mod memory;
mod model;
mod queue;
pub mod regions;
mod report;
mod state;
mod workload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use topology::HostTopology;

pub use calls::InterleaveStats;
pub use coherence::{Arbitration, Coherence};
pub use costs::{CostTable, DeepIdle, Level, INSTR};
use queue::Ev;
pub use report::{C2cRow, LockRow, SimReport};
use state::Sim;
pub use workload::{SimConfig, SimWorkload};

/// Runs one simulation. `stop` set by another thread (Ctrl-C) ends it
/// early with `partial` set.
pub fn run(
    topo: Arc<HostTopology>,
    cfg: &SimConfig,
    stop: &AtomicBool,
) -> crate::Result<SimReport> {
    run_with_progress(topo, cfg, stop, &mut |_| {})
}

/// [`run`], calling `progress` with the virtual ns reached every 10 ms.
pub fn run_with_progress(
    topo: Arc<HostTopology>,
    cfg: &SimConfig,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> crate::Result<SimReport> {
    cfg.check()?;
    let mut sim = Sim::new(topo.clone(), cfg)?;
    let (reached, partial) = event_loop(&mut sim, cfg.duration_ns, stop, progress);
    sim.drain();
    Ok(sim.report(&topo, reached.max(1), partial))
}

/// Pops and handles events until virtual time `end`, or until `stop` is
/// seen at a check event. Returns the virtual ns reached and whether it
/// stopped early.
fn event_loop(
    sim: &mut Sim<'_>,
    end: u64,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> (u64, bool) {
    let mut reached = 0;
    while let Some(k) = sim.q.pop() {
        let (t, seq, ev) = Ev::unkey(k);
        if t >= end {
            return (end, false);
        }
        reached = t;
        sim.coh.set_floor(t);
        if ev == Ev::Check {
            if stop.load(Ordering::Relaxed) {
                return (reached, true);
            }
            progress(t);
        }
        sim.handle(t, seq, ev);
    }
    (reached, false)
}

#[cfg(test)]
mod tests;
