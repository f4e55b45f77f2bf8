//! Fix 6, per-node group load: writers migrate runnable tasks of one group
//! (a VM) between CPUs of their node, one migration in eight crossing
//! nodes, with the wake/block updates around them, on a modelled genoa-2s.
//! Baseline: one shared sum per group (a migration subtracts and adds);
//! fix: per-node sums (a migration inside a node writes nothing).

// benches-twin builds this file against the simulator's build of
// vcpu_sched, with its own copy of the helper library.
#[cfg(twin)]
extern crate benches_twin as benches;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::group_load::GroupLoad;

fn bench(c: &mut Criterion) {
    let map = benches::map("genoa-2s");
    let mut g = c.benchmark_group("grpload");
    for (name, per_node) in [("baseline", false), ("fix", true)] {
        let gl = GroupLoad::new(&map, 4, per_node);
        for n in benches::writer_counts() {
            g.bench_with_input(BenchmarkId::new(name, format!("{n}w")), &n, |b, &n| {
                b.iter_custom(|iters| {
                    benches::contended(n, iters, |w, iters| {
                        for i in 0..iters {
                            let a = benches::cpu_for(&map, w, n, i);
                            let b = if i % 8 == 7 {
                                (a + map.ncpus() as u32 / 2) % map.ncpus() as u32
                            } else {
                                benches::cpu_for(&map, w, n, i + 1)
                            };
                            gl.add(1, a, 1024);
                            gl.migrate(1, a, b, 1024);
                            gl.migrate(1, b, a, 1024);
                            gl.sub(1, a, 1024);
                        }
                    })
                })
            });
        }
        assert_eq!(gl.total(1), 0);
    }
    g.finish();
}

benches::bench_main!(bench);
