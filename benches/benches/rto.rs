//! Fix 2, per-node RT overload tracking: writers mark their CPUs
//! overloaded and clear them again (an RT task queued behind another and
//! pushed away), and check "is anybody overloaded?" and walk the
//! candidates as every CPU that lowers its priority does, on a modelled
//! genoa-2s. Baseline: one count and mask next to the read-mostly span;
//! fix: per-node counts, flags and masks.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vcpu_sched::rto::RtOverload;

fn bench(c: &mut Criterion) {
    let map = benches::map("genoa-2s");
    let mut g = c.benchmark_group("rto");
    for (name, per_node) in [("baseline", false), ("fix", true)] {
        let r = RtOverload::new(&map, per_node);
        for n in benches::writer_counts() {
            g.bench_with_input(BenchmarkId::new(name, format!("{n}w")), &n, |b, &n| {
                b.iter_custom(|iters| {
                    benches::contended(n, iters, |w, iters| {
                        for i in 0..iters {
                            let cpu = benches::cpu_for(&map, w, n, i);
                            r.set(cpu);
                            std::hint::black_box(r.overloaded());
                            std::hint::black_box(r.candidates(map.node_of(cpu)).iter().next());
                            r.clear(cpu);
                            std::hint::black_box(r.overloaded());
                        }
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
