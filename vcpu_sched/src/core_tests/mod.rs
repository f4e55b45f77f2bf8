//! Deterministic tests of the core, driven single-threaded: every kick is
//! delivered by calling `schedule` on the kicked CPU until nothing needs
//! attention ("settled"), which is a quiescent point where every invariant,
//! including the RT priority one, must hold exactly.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use topology::HostTopology;

use crate::rng::Rng;
use crate::topo::tests::hand_topo;
use crate::*;

mod fair;
mod random;
mod rt;
mod tasks;

/// Records kicks.
#[derive(Default)]
pub(crate) struct RecKick(Mutex<BTreeSet<u32>>);

impl KickCpu for RecKick {
    fn kick(&self, cpu: CpuId) {
        self.0.lock().unwrap().insert(cpu);
    }
}

pub(crate) struct Sim {
    pub(crate) s: Scheduler,
    k: Arc<RecKick>,
    pub(crate) now: u64,
}

impl Sim {
    pub(crate) fn new(t: HostTopology, mit: Mitigations) -> Self {
        Self::with_config(t, mit, SchedConfig::default())
    }

    pub(crate) fn with_config(t: HostTopology, mit: Mitigations, cfg: SchedConfig) -> Self {
        let k = Arc::new(RecKick::default());
        let s = Scheduler::new(Arc::new(t), mit, cfg, k.clone()).unwrap();
        Sim { s, k, now: 1_000 }
    }

    /// The kicks sent and not yet delivered by [`Self::settle`].
    pub(crate) fn kicks(&self) -> BTreeSet<u32> {
        self.k.0.lock().unwrap().clone()
    }

    /// Delivers kicks until no CPU needs attention. Checks that every CPU
    /// needing attention was kicked (no lost kick).
    pub(crate) fn settle(&mut self) {
        let n = self.s.num_cpus() as u32;
        for _ in 0..10_000 {
            let kicked = std::mem::take(&mut *self.k.0.lock().unwrap());
            let need: Vec<u32> = (0..n)
                .filter(|&c| self.s.needs_attention(c).unwrap())
                .collect();
            for c in &need {
                // the one exception: fair wakeups deferred (lazy kicks) to
                // a busy CPU, taken at its next schedule or tick
                assert!(
                    kicked.contains(c) || self.s.only_deferred_wakeups(*c).unwrap(),
                    "CPU {c} needs attention but was never kicked"
                );
            }
            if need.is_empty() {
                return;
            }
            for c in need {
                self.now += 100;
                self.s.schedule(c, Prev::Keep, self.now).unwrap();
            }
        }
        panic!("the scheduler does not settle");
    }

    pub(crate) fn strict(&self, what: &str) {
        assert!(
            self.s.anomalies().is_empty(),
            "{what}: {:?}",
            self.s.anomalies()
        );
        let r = self.s.snapshot_check();
        assert!(r.violations.is_empty(), "{what}: {:#?}", r.violations);
        assert!(
            r.rt_waits.is_empty(),
            "{what}: RT waits at a quiescent point: {:#?}\n{}",
            r.rt_waits,
            self.s.dump()
        );
    }

    /// `n` SCHED_FIFO tasks named `prefix0..`, blocked.
    pub(crate) fn fifo_tasks(&self, prefix: &str, n: usize, prio: u8, aff: CpuMask) -> Vec<TaskId> {
        (0..n)
            .map(|i| {
                let spec = TaskSpec::new(format!("{prefix}{i}"))
                    .policy(Policy::Fifo(prio))
                    .affinity(aff);
                self.s.add_task(&spec, 0).unwrap()
            })
            .collect()
    }

    fn running(&self) -> Vec<(u32, TaskId)> {
        (0..self.s.num_cpus() as u32)
            .filter_map(|c| self.s.current(c).unwrap().map(|t| (c, t)))
            .collect()
    }
}

fn topo16() -> HostTopology {
    hand_topo(2, 2, 2, 2)
}

fn all_sets() -> Vec<Mitigations> {
    Mitigations::seeds_variants()
}
