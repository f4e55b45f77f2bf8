//! The thread workloads follow the shared definitions
//! (`vcpu_sched::workload::defs`) that the simulator and the micro-guests
//! read too: here, that messaging computes per message, so that its
//! message rate is bounded by the compute it is given.

use std::time::Duration;

use vcpu_sched::bench::{run_workload, RunOptions};
use vcpu_sched::workload::WorkloadKind;

/// Messages per second of one sender and one receiver on the real CPUs,
/// each computing `burst_us` per message.
fn rate(burst_us: u64) -> f64 {
    let mut o = RunOptions::new(WorkloadKind::Messaging, "host");
    o.params.groups = Some(1);
    o.params.group_size = Some(1);
    o.params.burst_us = Some(burst_us);
    o.duration = Duration::from_millis(400);
    o.warmup = Some(Duration::from_millis(100));
    let r = run_workload(&o).unwrap();
    assert_eq!(r.tasks, 2);
    r.metric.value
}

#[test]
fn messaging_computes_per_message() {
    // 400 us of compute before each write and after each read: at most
    // 2,500 messages a second even with the two sides overlapping on two
    // CPUs; twice that allows for the work unit's calibration. Without
    // the compute a message costs a few microseconds.
    let slow = rate(400);
    assert!(
        slow > 0.0 && slow < 5_000.0,
        "{slow} msg/s at 400 us per message"
    );
    let fast = rate(1);
    assert!(
        fast > 5.0 * slow,
        "{fast} msg/s at 1 us against {slow} at 400 us"
    );
}
