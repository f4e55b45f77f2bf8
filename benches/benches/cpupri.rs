//! Fix 1, cpupri split: writers move their CPUs between levels (fair <->
//! RT 50, as RT tasks come and go) and look for the lowest CPU for an RT 60
//! task, on a modelled genoa-2s (384 CPUs, 2 nodes). Baseline: the packed
//! layout; fix: counts and masks on their own lines, per-node masks.

// benches-twin builds this file against the simulator's build of
// vcpu_sched, with its own copy of the helper library.
#[cfg(twin)]
extern crate benches_twin as benches;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::cpupri::CpuPri;
use vcpu_sched::Policy;

fn bench(c: &mut Criterion) {
    let map = benches::map("genoa-2s");
    let mut g = c.benchmark_group("cpupri");
    for (name, split) in [("baseline", false), ("fix", true)] {
        let cp = CpuPri::new(&map, split, true);
        let rt50 = Policy::Fifo(50).pri_idx();
        let rt60 = Policy::Fifo(60).pri_idx();
        for n in benches::writer_counts() {
            g.bench_with_input(BenchmarkId::new(name, format!("{n}w")), &n, |b, &n| {
                b.iter_custom(|iters| {
                    benches::contended(n, iters, |w, iters| {
                        for i in 0..iters {
                            let cpu = benches::cpu_for(&map, w, n, i);
                            cp.set(cpu, rt50);
                            std::hint::black_box(cp.find(rt60, map.all(), map.node_of(cpu)));
                            cp.set(cpu, vcpu_sched::task::PRI_FAIR);
                        }
                    })
                })
            });
        }
    }
    g.finish();
}

benches::bench_main!(bench);
