//! The thread workloads follow the shared definitions
//! (`vcpu_sched::workload::defs`) that the simulator and the micro-guests
//! read too: messaging computes per message, so that its message rate is
//! bounded by the compute it is given; pingpong's pairs hand their token
//! back and forth, one compute per handoff, on every executor.

use std::time::Duration;

use vcpu_sched::bench::{run_workload, RunOptions};
use vcpu_sched::exec::ExecutorKind;
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

/// Transactions per second of `pairs` pairs in one group on the real
/// CPUs, `burst_us` per handoff, on `executor`.
fn pingpong(pairs: usize, burst_us: u64, executor: ExecutorKind) -> (f64, f64) {
    let mut o = RunOptions::new(WorkloadKind::Pingpong, "host");
    o.params.groups = Some(1);
    o.params.group_size = Some(2 * pairs);
    o.params.burst_us = Some(burst_us);
    o.duration = Duration::from_millis(400);
    o.warmup = Some(Duration::from_millis(100));
    o.executor = executor;
    o.check = executor != ExecutorKind::Host;
    let r = run_workload(&o).unwrap_or_else(|e| panic!("{executor:?}: {e}"));
    assert_eq!(r.tasks, 2 * pairs);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    (r.metric.value, r.extra["handoffs"])
}

#[test]
fn pingpong_pairs_hand_their_token_back_and_forth() {
    for ex in [
        ExecutorKind::Threads,
        ExecutorKind::Workers,
        ExecutorKind::Host,
    ] {
        // one pair at 300 us a side: a round trip takes at least 600 us,
        // so at most about 1,700 a second (twice that for the work
        // unit's calibration), and the pair must keep going
        let (tps, handoffs) = pingpong(1, 300, ex);
        assert!(tps > 50.0 && tps < 3_400.0, "{ex:?}: {tps} trans/s");
        assert!(handoffs > 100.0, "{ex:?}: {handoffs} handoffs");
        // more pairs than CPUs still all make progress
        let (tps, _) = pingpong(4, 5, ex);
        assert!(tps > 0.0, "{ex:?}: 4 pairs: {tps} trans/s");
    }
    // an odd group cannot pair its tasks
    let mut o = RunOptions::new(WorkloadKind::Pingpong, "host");
    o.params.group_size = Some(3);
    o.duration = Duration::from_millis(100);
    let e = run_workload(&o).unwrap_err().to_string();
    assert!(e.contains("even group size"), "{e}");
}
