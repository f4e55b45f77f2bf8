//! The coherence model alone under the contention the published
//! measurements have: N CPUs each doing `fetch_add` on one shared line in
//! a loop, as fast as the line comes to them. Its aggregate rate by N is
//! what `c2c` measures on this machine and what the cited contention rows
//! report for others, so the model's line arbitration can be checked
//! against them without the scheduler in between (`sim-contention` in
//! the benches prints the table; docs/simulator.md "Contended lines").

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use topology::HostTopology;

use super::coherence::{Arbitration, Coherence};
use super::costs::CostTable;
use crate::sync::recorder::Kind;

/// The one line every CPU bumps.
const LINE: u64 = 1;

/// What happens next in the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Next {
    /// CPU `n`-th of the list issues its next `fetch_add`.
    Issue(usize),
    /// The line is free: the arbiter picks its next owner.
    Grant,
}

/// Operations per second the model sustains when each CPU of `cpus`
/// issues a `fetch_add` on one line `op_ns` after its previous one
/// completed (the loop's own work: the instructions around the atomic),
/// over `duration_ns` of virtual time, with `arbitration` choosing who
/// gets the line when several wait.
pub fn fetch_add_rate(
    topo: &HostTopology,
    cost: CostTable,
    cpus: &[u32],
    op_ns: u64,
    duration_ns: u64,
    arbitration: Arbitration,
) -> f64 {
    let mut coh = Coherence::new(topo, cost);
    coh.set_arbitration(arbitration);
    let mut q: BinaryHeap<Reverse<(u64, u64, Next)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |q: &mut BinaryHeap<_>, t: u64, n: Next| {
        seq += 1;
        q.push(Reverse((t, seq, n)));
    };
    for i in 0..cpus.len() {
        push(&mut q, i as u64, Next::Issue(i));
    }
    let (mut ops, mut grant_due) = (0u64, false);
    while let Some(Reverse((t, _, n))) = q.pop() {
        if t >= duration_ns {
            break;
        }
        coh.set_floor(t);
        match n {
            Next::Issue(i) => match coh.write_request(cpus[i], LINE, Kind::Rmw, t, i as u64) {
                Ok(done) => {
                    ops += 1;
                    push(&mut q, done + op_ns, Next::Issue(i));
                }
                Err(free_at) => {
                    if !grant_due {
                        grant_due = true;
                        push(&mut q, free_at, Next::Grant);
                    }
                }
            },
            Next::Grant => {
                grant_due = false;
                if let Some((token, done, more)) = coh.grant_next(LINE, t) {
                    ops += 1;
                    push(&mut q, done + op_ns, Next::Issue(token as usize));
                    if more {
                        grant_due = true;
                        push(&mut q, done, Next::Grant);
                    }
                }
            }
        }
    }
    ops as f64 * 1e9 / duration_ns as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> HostTopology {
        // 2 packages x 2 LLCs x 2 cores x 2 threads = 16 CPUs
        topology::load("package:2 l3:2 l2:2 core:1 pu:2").unwrap()
    }

    /// One CPU alone: every op an L1 hit plus the loop's work.
    #[test]
    fn one_cpu_runs_at_its_own_speed() {
        let c = CostTable::for_preset("test").unwrap();
        let r = fetch_add_rate(&topo(), c, &[0], 8, 1_000_000, Arbitration::Fifo);
        let want = 1e9 / (c.l1_hit_ns + 8) as f64;
        assert!((r - want).abs() / want < 0.01, "{r} vs {want}");
    }

    /// Two CPUs on different sockets: every op moves the line across, at
    /// the remote latency (the rule cannot matter with one waiter).
    #[test]
    fn two_cpus_hand_the_line_back_and_forth() {
        let c = CostTable::for_preset("test").unwrap();
        for a in [Arbitration::Fifo, Arbitration::Nearest] {
            let r = fetch_add_rate(&topo(), c, &[0, 8], 0, 1_000_000, a);
            let want = 1e9 / c.remote_ns as f64;
            assert!((r - want).abs() / want < 0.05, "{a:?}: {r} vs {want}");
        }
    }

    /// CPUs of both sockets, alternating in the list: in order of arrival
    /// the line crosses the sockets at almost every handoff; nearest
    /// first keeps it on one socket for runs of handoffs, and more ops go
    /// through. (Nearest first starves the far socket meanwhile: that is
    /// the unfairness it models.)
    #[test]
    fn nearest_first_crosses_sockets_less_often_than_arrival_order() {
        let c = CostTable::for_preset("test").unwrap();
        let cpus = [0, 8, 2, 10, 4, 12, 6, 14];
        let fifo = fetch_add_rate(&topo(), c, &cpus, 0, 1_000_000, Arbitration::Fifo);
        let near = fetch_add_rate(&topo(), c, &cpus, 0, 1_000_000, Arbitration::Nearest);
        assert!(near > 1.3 * fifo, "nearest {near} vs fifo {fifo}");
    }
}
