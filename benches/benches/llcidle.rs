//! Fix 4, per-LLC idle tracking: writers take their CPUs out of idle and
//! back, with the "any idle CPU?" check of a busy tick and an idle-CPU
//! search in their LLC as a wakeup does, on a modelled genoa-2s (24 LLCs of
//! 16 CPUs). Baseline: one global mask and count; fix: per-LLC masks and
//! counts and a count of LLCs with idle CPUs.
//!
//! Two scenarios:
//! * `mostly-idle`: every other CPU stays idle, so a writer's LLC never
//!   runs out of idle CPUs and the fix never touches the global count (the
//!   common case on a machine with spare CPUs);
//! * `mostly-busy`: every other CPU stays busy, so each writer's exit and
//!   entry are the LLC's 1->0 and 0->1 transitions and the fix writes the
//!   global count every time, like the baseline, on top of its own work
//!   (its worst case).

// benches-twin builds this file against the simulator's build of
// vcpu_sched, with its own copy of the helper library.
#[cfg(twin)]
extern crate benches_twin as benches;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::idle::IdleTracker;

fn bench(c: &mut Criterion) {
    let map = benches::map("genoa-2s");
    let mut g = c.benchmark_group("llcidle");
    for (scenario, all_idle) in [("mostly-idle", true), ("mostly-busy", false)] {
        for (name, per_llc) in [("baseline", false), ("fix", true)] {
            for n in benches::writer_counts() {
                let t = IdleTracker::new(&map, per_llc, all_idle);
                g.bench_with_input(
                    BenchmarkId::new(name, format!("{n}w-{scenario}")),
                    &n,
                    |b, &n| {
                        b.iter_custom(|iters| {
                            benches::contended(n, iters, |w, iters| {
                                for i in 0..iters {
                                    let cpu = benches::cpu_for(&map, w, n, i);
                                    // leave idle and come back, or the reverse
                                    if all_idle {
                                        t.exit(cpu);
                                    } else {
                                        t.enter(cpu);
                                    }
                                    std::hint::black_box(t.any());
                                    std::hint::black_box(t.find_in_llc(
                                        map.llc_of(cpu),
                                        map.all(),
                                        &|_| true,
                                    ));
                                    if all_idle {
                                        t.enter(cpu);
                                    } else {
                                        t.exit(cpu);
                                    }
                                    std::hint::black_box(t.any());
                                }
                            })
                        })
                    },
                );
                assert!(t.check_consistent().is_ok());
            }
        }
    }
    g.finish();
}

benches::bench_main!(bench);
