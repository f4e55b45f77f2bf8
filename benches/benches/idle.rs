//! Fix 4, per-LLC idle tracking: writers take their CPUs in and out of
//! idle, with the "any idle CPU?" check of a busy tick and an idle-CPU
//! search in their LLC as a wakeup does, on a modelled genoa-2s (24 LLCs).
//! Baseline: one global mask and count; fix: per-LLC masks and counts and
//! a count of LLCs with idle CPUs.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vcpu_sched::idle::IdleTracker;

fn bench(c: &mut Criterion) {
    let map = benches::map("genoa-2s");
    let mut g = c.benchmark_group("idle");
    for (name, per_llc) in [("baseline", false), ("fix", true)] {
        // start with every CPU busy; each writer toggles its own CPUs
        let t = IdleTracker::new(&map, per_llc, false);
        for n in benches::writer_counts() {
            g.bench_with_input(BenchmarkId::new(name, format!("{n}w")), &n, |b, &n| {
                b.iter_custom(|iters| {
                    benches::contended(n, iters, |w, iters| {
                        for i in 0..iters {
                            let cpu = benches::cpu_for(&map, w, n, i);
                            t.enter(cpu);
                            std::hint::black_box(t.any());
                            std::hint::black_box(t.find_in_llc(map.llc_of(cpu), map.all()));
                            t.exit(cpu);
                            std::hint::black_box(t.any());
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
