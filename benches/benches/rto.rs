//! Fix 2, per-node RT overload tracking: writers mark their CPUs
//! overloaded and clear them again (an RT task queued behind another and
//! pushed away), and check "is anybody overloaded?" and walk the
//! candidates as every CPU that lowers its priority does, on a modelled
//! genoa-2s (2 nodes). Baseline: one count and mask next to the
//! read-mostly span; fix: per-node counts, masks and overloaded flags.
//!
//! Two scenarios:
//! * `others-overloaded`: some other CPUs of each node stay overloaded, so
//!   the node counts never return to 0 and the fix's flags stay put (the
//!   RT-heavy case the fix is for);
//! * `alone`: nobody else is overloaded, so each set and clear is its
//!   node's 0->1 and 1->0 transition and the fix rewrites its flag every
//!   time (its worst case).

// benches-twin builds this file against the simulator's build of
// vcpu_sched, with its own copy of the helper library.
#[cfg(twin)]
extern crate benches_twin as benches;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::rto::RtOverload;

fn bench(c: &mut Criterion) {
    let map = benches::map("genoa-2s");
    let mut g = c.benchmark_group("rto");
    for (scenario, background) in [("others-overloaded", true), ("alone", false)] {
        for (name, per_node) in [("baseline", false), ("fix", true)] {
            for n in benches::writer_counts() {
                let r = RtOverload::new(&map, per_node);
                if background {
                    // CPUs the writers never play (odd ones)
                    for node in 0..map.nnodes() as u32 {
                        for cpu in map.node_span(node).iter().filter(|c| c % 2 == 1).take(4) {
                            r.set(cpu);
                        }
                    }
                }
                g.bench_with_input(
                    BenchmarkId::new(name, format!("{n}w-{scenario}")),
                    &n,
                    |b, &n| {
                        b.iter_custom(|iters| {
                            benches::contended(n, iters, |w, iters| {
                                for i in 0..iters {
                                    let cpu = benches::cpu_for(&map, w, n, i);
                                    r.set(cpu);
                                    std::hint::black_box(r.overloaded());
                                    std::hint::black_box(
                                        r.candidates(map.node_of(cpu)).iter().next(),
                                    );
                                    r.clear(cpu);
                                    std::hint::black_box(r.overloaded());
                                }
                            })
                        })
                    },
                );
            }
        }
    }
    g.finish();
}

benches::bench_main!(bench);
