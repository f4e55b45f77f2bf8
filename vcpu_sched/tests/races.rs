//! Races between CPUs driving the core directly on real threads (no
//! executor): each thread plays one CPU and blocks whatever it runs, while
//! the others wake those tasks at once. Regression test for a task that was
//! claimed by a lock-free waker while its old CPU was still taking it off
//! the runqueue (the fair tree was left with a stale key and the task later
//! ran on two CPUs). The core records such impossible states as anomalies;
//! the snapshot checker checks the rest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vcpu_sched::*;

#[test]
fn block_and_wake_race_leaves_no_stale_state() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let topo = Arc::new(topology::load("package:1 l3:1 l2:4 core:1 pu:2").unwrap());
        let s =
            Arc::new(Scheduler::new(topo, mit, SchedConfig::default(), Arc::new(NoKick)).unwrap());
        let n = s.num_cpus() as u32;
        // fewer tasks than CPUs, so wakeups find idle CPUs other than the
        // one the task is leaving; more CPU threads than host CPUs, so the
        // host preempts them inside the window
        let tasks: Vec<TaskId> = (0..6)
            .map(|i| {
                let p = if i % 3 == 0 {
                    Policy::Fifo(10 + i as u8)
                } else {
                    Policy::Fair(1024)
                };
                s.add_task(&TaskSpec::new(format!("t{i}")).policy(p), 0)
                    .unwrap()
            })
            .collect();
        let epoch = Instant::now();
        let now = move || epoch.elapsed().as_nanos() as u64 + 1;
        let stop = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        for cpu in 0..n {
            let (s, stop, tasks) = (s.clone(), stop.clone(), tasks.clone());
            hs.push(std::thread::spawn(move || {
                let mut k = cpu as usize;
                while !stop.load(Ordering::Relaxed) {
                    // run: block what runs here (or pick something)
                    let prev = if s.current(cpu).unwrap().is_some() {
                        Prev::Block
                    } else {
                        Prev::Keep
                    };
                    s.schedule(cpu, prev, now()).unwrap();
                    // and wake others right away, from this CPU
                    for _ in 0..2 {
                        k = (k + 5) % tasks.len();
                        let _ = s.wake(tasks[k], Some(cpu), now());
                    }
                }
            }));
        }
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        assert!(s.anomalies().is_empty(), "{mit}: {:?}", s.anomalies());
        let r = s.snapshot_check();
        assert!(r.violations.is_empty(), "{mit}: {:?}", r.violations);
        assert!(s.counters().switches > 1000, "{mit}: the race ran");
    }
}
