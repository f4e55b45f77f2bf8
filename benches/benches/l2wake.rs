//! Fix 5, L2-local wakeups: wakers on CPUs that share the target's LLC but
//! not its L2 wake tasks onto the target CPU through the real wakeup path
//! ([`Scheduler::wake`]), while the target CPU schedules them as fast as it
//! can (block the current task, drain, pick). Baseline: LLC sharing allows
//! the direct enqueue, so wakers take the target's runqueue lock; fix: only
//! L2 sharing does, so they push onto its lock-free wake list and the
//! target drains it in batches. Time per successful wakeup.

// benches-twin builds this file against the simulator's build of
// vcpu_sched, with its own copy of the helper library.
#[cfg(twin)]
extern crate benches_twin as benches;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion};
use vcpu_sched::{CpuMask, Mitigations, NoKick, Prev, SchedConfig, Scheduler, TaskId, TaskSpec};

const POOL: usize = 32;

fn bench(c: &mut Criterion) {
    let n = benches::writers().max(2);
    let wakers = n - 1;
    let spec = format!("package:1 l3:1 l2:{} core:1 pu:1", n);
    let topo = Arc::new(topology::load(&spec).expect("synthetic topology"));
    let epoch = Instant::now();
    let now = move || epoch.elapsed().as_nanos() as u64 + 1;
    let mut g = c.benchmark_group("l2wake");
    for (name, mit) in [
        ("baseline", Mitigations::none()),
        ("fix", Mitigations::only(vcpu_sched::Fix::L2Wake)),
    ] {
        let s = Scheduler::new(topo.clone(), mit, SchedConfig::default(), Arc::new(NoKick))
            .expect("scheduler");
        let pools: Vec<Vec<TaskId>> = (0..wakers)
            .map(|w| {
                (0..POOL)
                    .map(|k| {
                        s.add_task(
                            &TaskSpec::new(format!("w{w}t{k}")).affinity(CpuMask::single(0)),
                            0,
                        )
                        .expect("task")
                    })
                    .collect()
            })
            .collect();
        g.bench_with_input(BenchmarkId::new(name, format!("{wakers}w")), &n, |b, &n| {
            b.iter_custom(|iters| {
                let done = AtomicUsize::new(0);
                let stop = AtomicBool::new(false);
                benches::contended(n, iters, |w, iters| {
                    if w == 0 {
                        // the target CPU
                        while !stop.load(Ordering::Relaxed) {
                            s.schedule(0, Prev::Block, now()).unwrap();
                        }
                        return;
                    }
                    let pool = &pools[w - 1];
                    let mut ok = 0;
                    let mut i = 0;
                    while ok < iters {
                        if s.wake(pool[i % POOL], Some(w as u32), now())
                            .unwrap_or(false)
                        {
                            ok += 1;
                        }
                        i += 1;
                    }
                    if done.fetch_add(1, Ordering::AcqRel) + 1 == wakers {
                        stop.store(true, Ordering::Relaxed);
                    }
                })
            })
        });
        let c = s.counters();
        assert!(
            if name == "fix" {
                c.wake_queued > 0 && c.wake_direct == 0
            } else {
                c.wake_direct > 0 && c.wake_queued == 0
            },
            "{name}: {c:?}"
        );
    }
    g.finish();
}

benches::bench_main!(bench);
