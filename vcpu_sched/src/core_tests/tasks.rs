//! Tasks and placement whatever their policy: wake and block, affinity,
//! the idle tracker, the L2 wakeup rule, migration counts, groups and typed
//! errors.

use super::*;

#[test]
fn pending_wake_cancels_block() {
    let mut sim = Sim::new(hand_topo(1, 1, 1, 2), Mitigations::none());
    let t = sim.s.add_task(&TaskSpec::new("t"), 0).unwrap();
    sim.s.wake(t, None, 10).unwrap();
    sim.settle();
    let cpu = sim.s.task_cpu(t).unwrap();
    assert_eq!(sim.s.current(cpu).unwrap(), Some(t));
    assert!(!sim.s.wake(t, Some(cpu), 20).unwrap(), "already awake");
    assert_eq!(sim.s.schedule(cpu, Prev::Block, 30).unwrap(), Pick::Same);
    assert_eq!(sim.s.task_state(t).unwrap(), TaskState::Running);
    assert_eq!(sim.s.schedule(cpu, Prev::Block, 40).unwrap(), Pick::Idle);
    assert_eq!(sim.s.task_state(t).unwrap(), TaskState::Blocked);
    sim.settle();
    sim.strict("end");
}

#[test]
fn affinity_moves_queued_and_running_tasks() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let mut sim = Sim::new(topo16(), mit);
        let ids = sim.fifo_tasks("t", 3, 50, CpuMask::single(3));
        for &t in &ids {
            sim.s.wake(t, Some(0), sim.now).unwrap();
        }
        sim.settle();
        sim.strict("pinned");
        assert_eq!(sim.running(), vec![(3, ids[0])]);
        // widen: the waiting ones spread out at once
        for &t in &ids {
            sim.s
                .set_affinity(t, &"0-15".parse().unwrap(), sim.now)
                .unwrap();
            sim.settle();
            sim.strict("widened");
        }
        assert_eq!(sim.running().len(), 3);
        // move the running one away from its CPU
        let (cpu, t) = sim.running()[0];
        let dest: CpuMask = if cpu == 12 {
            "13".parse().unwrap()
        } else {
            "12".parse().unwrap()
        };
        sim.s.set_affinity(t, &dest, sim.now).unwrap();
        assert!(sim.s.needs_attention(cpu).unwrap());
        sim.settle();
        sim.strict("moved");
        assert_eq!(sim.s.task_cpu(t).unwrap(), dest.first().unwrap());
        assert_eq!(sim.s.current(dest.first().unwrap()).unwrap(), Some(t));
        // bad masks are errors that name the problem
        let e = sim
            .s
            .set_affinity(t, &CpuMask::empty(), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty"), "{e}");
        let e = sim
            .s
            .set_affinity(t, &"99".parse().unwrap(), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not managed"), "{e}");
    }
}

/// The idle tracker's set is kept as Linux keeps its nohz idle set: a CPU
/// that becomes busy stays in it until its first `schedule` after a tick,
/// so one that goes idle again before then writes nothing shared. Placement checks each
/// candidate's own idle flag, so a busy CPU still in the set is passed
/// over: task B, last on CPU 2 (now busy with A, still in the set), goes
/// to idle CPU 3, the only other CPU it may use.
#[test]
fn a_cpu_leaves_the_idle_set_after_a_tick_and_placement_skips_it_before() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let mut sim = Sim::new(topo16(), mit);
        let b = sim
            .s
            .add_task(&TaskSpec::new("b").affinity(CpuMask::single(2)), 0)
            .unwrap();
        sim.s.wake(b, None, sim.now).unwrap();
        sim.settle();
        assert_eq!(sim.s.current(2).unwrap(), Some(b));
        assert!(
            sim.s.idle.is_idle(2),
            "{mit}: busy, in the set until its tick"
        );
        sim.strict("busy before its tick");
        sim.now += 10;
        sim.s.schedule(2, Prev::Block, sim.now).unwrap();
        assert!(sim.s.idle.is_idle(2), "{mit}");
        sim.s
            .set_affinity(b, &"2-3".parse().unwrap(), sim.now)
            .unwrap();
        let a = sim
            .s
            .add_task(&TaskSpec::new("a").affinity(CpuMask::single(2)), 0)
            .unwrap();
        sim.s.wake(a, None, sim.now).unwrap();
        sim.settle();
        assert_eq!(sim.s.current(2).unwrap(), Some(a));
        assert!(sim.s.idle.is_idle(2), "{mit}: stale member");
        sim.s.wake(b, None, sim.now).unwrap();
        sim.settle();
        assert_eq!(
            sim.s.current(3).unwrap(),
            Some(b),
            "{mit}: B belongs on idle CPU 3, not on busy CPU 2\n{}",
            sim.s.dump()
        );
        sim.strict("both running, neither ticked");
        sim.now += 10_000_000;
        sim.s.tick(2, sim.now).unwrap();
        sim.s.tick(3, sim.now).unwrap();
        assert!(sim.s.idle.is_idle(2), "{mit}: a tick only marks the CPU");
        sim.strict("after the ticks");
        for c in [2, 3] {
            sim.s.schedule(c, Prev::Keep, sim.now).unwrap();
        }
        assert!(
            !sim.s.idle.is_idle(2) && !sim.s.idle.is_idle(3),
            "{mit}: the schedule after a tick takes a busy CPU out"
        );
        sim.strict("after the schedules");
        assert_eq!(sim.s.idle.check_consistent().unwrap(), 14, "{mit}");
    }
}

#[test]
fn l2_rule_decides_direct_or_queued() {
    // 4 and 5 share an L2, 4 and 6 only the LLC
    for (mit, direct_to_6) in [
        (Mitigations::none(), true),
        (Mitigations::only(Fix::L2Wake), false),
    ] {
        let mut sim = Sim::new(topo16(), mit);
        let t = sim
            .s
            .add_task(&TaskSpec::new("t").affinity(CpuMask::single(6)), 0)
            .unwrap();
        let before = sim.s.counters();
        sim.s.wake(t, Some(4), sim.now).unwrap();
        let d = sim.s.counters().since(&before);
        assert_eq!(d.wake_direct == 1, direct_to_6, "{mit}");
        assert_eq!(d.wake_queued == 1, !direct_to_6, "{mit}");
        sim.settle();
        assert_eq!(sim.s.current(6).unwrap(), Some(t));
        sim.strict("woken");
    }
}

#[test]
fn groups_and_errors() {
    let sim = Sim::new(hand_topo(1, 1, 1, 2), Mitigations::none());
    let g = sim.s.create_group("vm1").unwrap();
    let t = sim.s.add_task(&TaskSpec::new("v").group(g), 0).unwrap();
    assert!(sim
        .s
        .remove_group(g)
        .unwrap_err()
        .to_string()
        .contains("still has 1"));
    assert!(sim.s.remove_group(GroupId::ROOT).is_err());
    sim.s.wake(t, None, 5).unwrap();
    assert!(
        sim.s.remove_task(t).is_err(),
        "a waking task cannot be removed"
    );
    let e = sim
        .s
        .add_task(&TaskSpec::new("x").policy(Policy::Fifo(0)), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1..=99"), "{e}");
    let e = sim
        .s
        .add_task(&TaskSpec::new("x").group(GroupId(77)), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such group 77"), "{e}");
    assert!(sim.s.wake(TaskId(4000), None, 0).is_err());
    assert_eq!(sim.s.groups().len(), 2);
}

#[test]
fn out_of_range_cpus_are_typed_errors() {
    use crate::SchedError;
    let topo = Arc::new(topology::load("package:1 l3:1 l2:2 core:1 pu:2").unwrap());
    let s = Scheduler::new(
        topo,
        Mitigations::all(),
        SchedConfig::default(),
        Arc::new(crate::NoKick),
    )
    .unwrap();
    let n = s.num_cpus() as u32;
    assert_eq!(n, 4);
    let t = s.add_task(&TaskSpec::new("t"), 0).unwrap();
    for bad in [n, n + 1, 1000, u32::MAX] {
        let is_no_such = |e: SchedError| {
            assert!(
                matches!(e, SchedError::NoSuchCpu { cpu, ncpus: 4 } if cpu == bad),
                "{e}"
            );
            assert!(e.to_string().contains(&format!("no such CPU {bad}")), "{e}");
        };
        is_no_such(s.schedule(bad, Prev::Keep, 1).unwrap_err());
        is_no_such(s.tick(bad, 1).unwrap_err());
        is_no_such(s.current(bad).unwrap_err());
        is_no_such(s.needs_attention(bad).unwrap_err());
        is_no_such(s.cpu_counters(bad).unwrap_err());
        is_no_such(s.running_outside_affinity(bad, t).unwrap_err());
        is_no_such(s.wake(t, Some(bad), 1).unwrap_err());
        is_no_such(s.check_cpu(bad).unwrap_err());
    }
    // the failed calls changed nothing: the task is still blocked and wakes
    assert_eq!(s.task_state(t).unwrap(), TaskState::Blocked);
    assert!(s.wake(t, Some(n - 1), 2).unwrap());
    assert_eq!(s.check_cpu(n - 1).unwrap(), n - 1);
}

/// Migrations are counted by distance: a task made to wake on a CPU that
/// shares its last CPU's L2, then its LLC, then its node, then none of
/// them, adds one to each class in turn, and the classes sum to the
/// tasks' own migration counts.
#[test]
fn migrations_are_counted_by_distance() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let mut sim = Sim::new(topo16(), mit);
        let m = sim.s.topo_map();
        // From CPU 0: an L2 sibling, an LLC sibling, a node sibling, a
        // CPU of the other node.
        let find = |f: &dyn Fn(u32) -> bool| (1..16u32).find(|&c| f(c)).unwrap();
        let l2 = find(&|c| m.share_l2(0, c));
        let llc = find(&|c| !m.share_l2(0, c) && m.share_llc(0, c));
        let node = find(&|c| !m.share_llc(0, c) && m.node_of(c) == m.node_of(0));
        let remote = find(&|c| m.node_of(c) != m.node_of(0));
        let t = sim.fifo_tasks("m", 1, 10, CpuMask::single(0))[0];
        let mut prev = 0;
        let mut expect = [0u64; 4];
        for (k, dest) in [l2, llc, node, remote].into_iter().enumerate() {
            sim.s.wake(t, None, sim.now).unwrap();
            sim.settle();
            assert_eq!(sim.s.current(prev).unwrap(), Some(t));
            sim.now += 100;
            sim.s.schedule(prev, Prev::Block, sim.now).unwrap();
            sim.settle();
            // the next wake must land on `dest`, which is `k` levels away
            // from where it last ran; move it back to CPU 0 afterwards
            sim.s
                .set_affinity(t, &CpuMask::single(dest), sim.now)
                .unwrap();
            sim.s.wake(t, None, sim.now).unwrap();
            sim.settle();
            assert_eq!(sim.s.current(dest).unwrap(), Some(t), "{mit}");
            expect[k] += 1;
            let c = sim.s.counters();
            assert_eq!(
                [
                    c.migrations_l2,
                    c.migrations_llc,
                    c.migrations_node,
                    c.migrations_remote
                ],
                expect,
                "{mit}: after a move to CPU {dest}"
            );
            // back home for the next round (one more migration, same class)
            sim.now += 100;
            sim.s.schedule(dest, Prev::Block, sim.now).unwrap();
            sim.settle();
            sim.s.set_affinity(t, &CpuMask::single(0), sim.now).unwrap();
            expect[k] += 1;
            prev = 0;
        }
        sim.s.wake(t, None, sim.now).unwrap();
        sim.settle();
        let c = sim.s.counters();
        let by_distance =
            c.migrations_l2 + c.migrations_llc + c.migrations_node + c.migrations_remote;
        assert_eq!(
            by_distance,
            sim.s.task_stats(t).unwrap().migrations,
            "{mit}"
        );
        assert_eq!(by_distance, 8, "{mit}");
        sim.strict("migrations");
    }
}
