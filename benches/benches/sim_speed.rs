//! The simulator's own speed: wall time to simulate a fixed stretch of
//! virtual time on the real core, at the scale the simulator is for.
//!
//! `cargo bench -p benches --bench sim_speed`. It links `vcpu_sched_sim`,
//! the scheduler built with the reporting sync layer; the per-fix benches
//! beside it link the plain `vcpu_sched` (plain atomics and locks), as
//! `vmm` does.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched_sim::exec::sim::{run, Arbitration, CostTable, SimConfig, SimWorkload};
use vcpu_sched_sim::Mitigations;

fn bench(c: &mut Criterion) {
    let topo = Arc::new(topology::load("gnr-2s").expect("preset gnr-2s"));
    let cost = CostTable::for_preset("gnr-2s").expect("cost table for gnr-2s");
    let stop = AtomicBool::new(false);
    let mut g = c.benchmark_group("sim_speed");
    g.sample_size(10);
    // 480 CPUs; 1 ms of virtual time per iteration (the whole-second target
    // is 1000 of these; docs/simulator.md reports that run).
    // Interleaved (`--interleave`): messaging with every fix, the speed
    // goal's case.
    let cases = [
        (SimWorkload::Cyclic, "none", Mitigations::none(), false),
        (SimWorkload::Cyclic, "all", Mitigations::all(), false),
        (SimWorkload::Messaging, "none", Mitigations::none(), false),
        (SimWorkload::Messaging, "all", Mitigations::all(), false),
        (
            SimWorkload::Messaging,
            "all-interleaved",
            Mitigations::all(),
            true,
        ),
    ];
    for (workload, name, mit, interleave) in cases {
        let cfg = SimConfig {
            workload,
            vms: 60,
            vcpus: 8,
            duration_ns: 1_000_000,
            work_ns: None,
            seed: 1,
            mitigations: mit,
            cost,
            interleave,
            arbitration: Arbitration::Nearest,
        };
        g.bench_with_input(
            BenchmarkId::new(workload.name(), format!("{name}/480cpus/1ms")),
            &cfg,
            |b, cfg| b.iter(|| run(topo.clone(), cfg, &stop).expect("simulation runs")),
        );
    }
    g.finish();
}

benches::bench_main!(bench);
