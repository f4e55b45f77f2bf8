//! Wiring table: each [`Mitigations`] switch turns on its own fix and no
//! other.
//!
//! WHAT: For the baseline, for each fix alone (in [`Fix::ALL`] order) and
//! for all fixes, build a [`Scheduler`] on a 2-node topology and probe the
//! six places a switch changes: the cpupri layout, the RT overload
//! counters, the shared-runqueue shards, the idle tracking, the wakeup rule
//! and the group-load buckets. Each probe says from what it observes
//! whether its fix is on; the table must equal the switches.
//!
//! WHY: The fixes are chosen by six booleans read in a handful of places.
//! Two of them swapped (`mit.rto` passed where `mit.cpupri`
//! belongs) would compile, pass every per-structure test, and silently
//! measure the wrong fix. The unit tests of each structure build it with an
//! explicit flag and so cannot see that.
//!
//! HOW: Each probe looks at one structure through behaviour where that is
//! cheap (who is found first, whether a wake is queued directly) and
//! through small `#[doc(hidden)]` read-only accessors otherwise, and
//! asserts the baseline shape whenever it reports "off".

use std::sync::Arc;

use crate::cpumask::CpuMask;
use crate::fixes::shardrq::shard_layout;
use crate::mitigations::{Fix, Mitigations};
use crate::sched::{NoKick, Prev, Scheduler};
use crate::task::{CpuId, Policy, TaskSpec, TaskState, PRI_FAIR};
use crate::{SchedConfig, CACHE_PAD};

/// 2 nodes x 2 LLCs x 2 L2s x 2 cores x 2 threads = 32 CPUs, 8 per LLC.
const TOPO: &str = "package:2 [numa] l3:2 l2:2 core:2 pu:2";

fn sched(mit: Mitigations) -> Scheduler {
    let topo = Arc::new(topology::load(TOPO).expect("test topology"));
    Scheduler::new(topo, mit, SchedConfig::default(), Arc::new(NoKick)).expect("scheduler")
}

/// Fix 1: level counts and masks on separate blocks, masks split per node.
fn probe_cpupri(s: &Scheduler) -> bool {
    let (count, mask) = s.cpupri.level_addrs(PRI_FAIR);
    // split: count and mask in blocks of their own, so at least a block
    // apart; baseline: the mask right after its count
    let split = count.abs_diff(mask) >= CACHE_PAD;
    let m = s.topo_map();
    let node1 = *m.node_span(1);
    // Every CPU is idle: an RT task preferring node 1 finds node 1's CPUs
    // only when the masks are per node (default config), all otherwise.
    let found = s
        .cpupri
        .find(Policy::Fifo(10).pri_idx(), m.all(), 1)
        .expect("idle CPUs");
    if split {
        assert_eq!(found, node1, "split cpupri with node masks");
    } else {
        assert!(
            mask > count && mask - count < 64,
            "baseline: count and mask side by side ({count:#x}, {mask:#x})"
        );
        assert_eq!(found, *m.all(), "baseline cpupri: one mask per level");
    }
    split
}

/// Fix 2: one overload counter per node; the own node's CPUs come first.
fn probe_rto(s: &Scheduler) -> bool {
    let m = s.topo_map();
    let a = m.node_span(0).first().unwrap();
    let b = m.node_span(1).first().unwrap();
    s.rto.set(a);
    s.rto.set(b);
    let order: Vec<CpuId> = s.rto.candidates(1).iter().collect();
    s.rto.clear(a);
    s.rto.clear(b);
    assert!(!s.rto.overloaded());
    let per_node = s.rto.counters() == 2;
    if per_node {
        assert_eq!(order, vec![b, a], "per-node rto: own node first");
    } else {
        assert_eq!(s.rto.counters(), 1);
        assert_eq!(order, vec![a, b], "flat rto: one mask in CPU order");
    }
    per_node
}

/// Fix 3: an LLC of 8 CPUs is split into shards of `shard_size`.
fn probe_shardrq(s: &Scheduler) -> bool {
    let m = s.topo_map();
    let per_llc = m.llc_cpus(0).len();
    let shards = shard_layout(per_llc, s.config().shard_size).0;
    assert!(shards > 1, "the topology must be big enough to shard");
    let n = s.shared.shards_of_llc(0);
    for llc in 0..m.nllcs() as u32 {
        assert_eq!(s.shared.shards_of_llc(llc), n);
    }
    if n == 1 {
        false
    } else {
        assert_eq!(n, shards);
        true
    }
}

/// Fix 4: every LLC counts its own idle CPUs (all idle at start).
fn probe_llcidle(s: &Scheduler) -> bool {
    let m = s.topo_map();
    match s.idle.llc_idle_count(0) {
        Some(_) => {
            assert!(s.idle.per_llc());
            for llc in 0..m.nllcs() as u32 {
                assert_eq!(
                    s.idle.llc_idle_count(llc),
                    Some(m.llc_cpus(llc).len() as i32)
                );
            }
            true
        }
        None => {
            assert!(!s.idle.per_llc());
            false
        }
    }
}

/// Fix 5: a waker on another L2 of the target's LLC goes through the wake
/// list under the fix and enqueues directly in the baseline; an L2 sibling
/// always enqueues directly, another LLC never does.
fn probe_l2wake(s: &Scheduler) -> bool {
    let m = s.topo_map();
    let target: CpuId = 0;
    let l2 = *m.l2_span(m.l2_of(target));
    let llc = *m.llc_span(m.llc_of(target));
    let sibling = l2.iter().find(|&c| c != target).unwrap();
    let other_l2 = llc.and_not(&l2).first().unwrap();
    let other_llc = m.all().and_not(&llc).first().unwrap();
    assert!(m.share_llc(other_l2, target) && !m.share_l2(other_l2, target));
    let wake_from = |waker: CpuId| {
        let spec = TaskSpec::new("probe").affinity(CpuMask::single(target));
        let t = s.add_task(&spec, 1).unwrap();
        let before = s.cpu_counters(waker).unwrap();
        assert!(s.wake(t, Some(waker), 2).unwrap());
        let after = s.cpu_counters(waker).unwrap();
        let direct = after.wake_direct - before.wake_direct;
        let queued = after.wake_queued - before.wake_queued;
        assert_eq!(direct + queued, 1);
        let state = s.task_state(t).unwrap();
        assert_eq!(
            state,
            if direct == 1 {
                TaskState::Queued
            } else {
                TaskState::Waking
            }
        );
        direct == 1
    };
    assert!(wake_from(sibling), "an L2 sibling enqueues directly");
    assert!(!wake_from(other_llc), "another LLC uses the wake list");
    let l2_rule = !wake_from(other_l2);
    assert!(s.needs_attention(target).unwrap());
    l2_rule
}

/// Fix 6: a group's load is kept per node.
fn probe_grpload(s: &Scheduler) -> bool {
    let m = s.topo_map();
    let cpu = m.node_span(1).first().unwrap();
    let g = s.create_group("probe").unwrap();
    let spec = TaskSpec::new("grp").group(g).affinity(CpuMask::single(cpu));
    let t = s.add_task(&spec, 1).unwrap();
    s.wake(t, None, 2).unwrap();
    assert_eq!(
        s.schedule(cpu, Prev::Keep, 3).unwrap(),
        crate::Pick::Switch(t)
    );
    let w = Policy::default().weight() as i64;
    assert_eq!(s.group_load(g), w);
    let buckets = s.gload.per_node(g.0);
    if buckets.len() == 1 {
        assert_eq!(buckets, vec![w]);
        false
    } else {
        assert_eq!(buckets, vec![0, w], "the load sits in the task's node");
        true
    }
}

/// What each probe sees, in [`Fix::ALL`] order.
fn observe(mit: Mitigations) -> [bool; 6] {
    let s = sched(mit);
    [
        probe_cpupri(&s),
        probe_rto(&s),
        probe_shardrq(&s),
        probe_llcidle(&s),
        probe_l2wake(&s),
        probe_grpload(&s),
    ]
}

#[test]
fn probe_order_is_fix_order() {
    assert_eq!(
        Fix::ALL,
        [
            Fix::CpuPri,
            Fix::Rto,
            Fix::ShardRq,
            Fix::LlcIdle,
            Fix::L2Wake,
            Fix::GrpLoad
        ]
    );
}

#[test]
fn baseline_has_no_fix() {
    assert_eq!(observe(Mitigations::none()), [false; 6]);
}

#[test]
fn each_switch_turns_on_its_own_fix_only() {
    for (i, f) in Fix::ALL.into_iter().enumerate() {
        let mut want = [false; 6];
        want[i] = true;
        assert_eq!(observe(Mitigations::only(f)), want, "only:{f}");
        let mut want = [true; 6];
        want[i] = false;
        assert_eq!(observe(Mitigations::all_but(f)), want, "all-but:{f}");
    }
}

#[test]
fn all_has_every_fix() {
    assert_eq!(observe(Mitigations::all()), [true; 6]);
}
