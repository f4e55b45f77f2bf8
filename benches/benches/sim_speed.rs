//! The simulator's own speed: wall time to simulate a fixed stretch of
//! virtual time on the real core, at the scale the simulator is for.
//!
//! Needs the `sim` feature (`cargo bench -p benches --features sim --bench
//! sim_speed`); it is off by default so that the hot-path benches above
//! measure the production sync layer (plain atomics and locks), not the
//! reporting one.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::exec::sim::{run, CostTable, SimConfig, SimWorkload};
use vcpu_sched::Mitigations;

fn bench(c: &mut Criterion) {
    let topo = Arc::new(topology::load("gnr-2s").expect("preset gnr-2s"));
    let cost = CostTable::for_preset("gnr-2s").expect("cost table for gnr-2s");
    let stop = AtomicBool::new(false);
    let mut g = c.benchmark_group("sim_speed");
    g.sample_size(10);
    // 480 CPUs; 1 ms of virtual time per iteration (the whole-second target
    // is 1000 of these; docs/simulator.md reports that run).
    for workload in [SimWorkload::Cyclic, SimWorkload::Messaging] {
        for (name, mit) in [("none", Mitigations::none()), ("all", Mitigations::all())] {
            let cfg = SimConfig {
                workload,
                vms: 60,
                vcpus: 8,
                duration_ns: 1_000_000,
                work_ns: None,
                seed: 1,
                mitigations: mit,
                cost,
            };
            g.bench_with_input(
                BenchmarkId::new(workload.name(), format!("{name}/480cpus/1ms")),
                &cfg,
                |b, cfg| b.iter(|| run(topo.clone(), cfg, &stop).expect("simulation runs")),
            );
        }
    }
    g.finish();
}

benches::bench_main!(bench);
