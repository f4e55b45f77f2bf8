//! Fix 3, sharded shared runqueue: writers on CPUs of one big LLC push a
//! task and pop one, as wakeups and newly idle CPUs do, on a modelled
//! gnr-2s (one 240-CPU LLC per socket). Baseline: one queue and lock per
//! LLC; fix: shards of 6 CPUs.

// benches-twin builds this file against the simulator's build of
// vcpu_sched, with its own copy of the helper library.
#[cfg(twin)]
extern crate benches_twin as benches;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::shared_rq::SharedRq;

fn bench(c: &mut Criterion) {
    let map = benches::map("gnr-2s");
    let llc0: Vec<u32> = map.llc_cpus(0).to_vec();
    let mut g = c.benchmark_group("shardrq");
    for (name, sharded) in [("baseline", false), ("fix", true)] {
        let q = SharedRq::new(&map, sharded, 6);
        for n in benches::writer_counts() {
            g.bench_with_input(BenchmarkId::new(name, format!("{n}w")), &n, |b, &n| {
                b.iter_custom(|iters| {
                    benches::contended(n, iters, |w, iters| {
                        // writers spread over the LLC, each on its own shard
                        let cpu = llc0[(w * llc0.len() / n) % llc0.len()];
                        for i in 0..iters {
                            q.push(cpu, (w as u64 * 1_000_000 + i) as u32);
                            std::hint::black_box(q.pop(cpu));
                        }
                    })
                })
            });
        }
    }
    g.finish();
}

benches::bench_main!(bench);
