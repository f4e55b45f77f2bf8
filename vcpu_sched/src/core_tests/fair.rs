//! Fair scheduling: shares, slices, wakeup preemption and sleeper credit,
//! lazy kicks, and the balances that spread fair work.

use super::*;

#[test]
fn fair_tasks_share_by_weight() {
    let mut sim = Sim::new(hand_topo(1, 1, 1, 1), Mitigations::all());
    let a = sim
        .s
        .add_task(&TaskSpec::new("a").policy(Policy::Fair(1024)), 0)
        .unwrap();
    let b = sim
        .s
        .add_task(&TaskSpec::new("b").policy(Policy::Fair(2048)), 0)
        .unwrap();
    sim.s.wake(a, None, sim.now).unwrap();
    sim.s.wake(b, None, sim.now).unwrap();
    sim.settle();
    for _ in 0..3000 {
        sim.now += 100_000;
        sim.s.tick(0, sim.now).unwrap();
        sim.settle();
    }
    let ra = sim.s.task_stats(a).unwrap().running_ns as f64;
    let rb = sim.s.task_stats(b).unwrap().running_ns as f64;
    let ratio = rb / ra;
    assert!(
        (1.6..2.5).contains(&ratio),
        "weight 2:1 got {ratio:.2} ({ra} vs {rb})"
    );
    sim.strict("end");
}

/// Lazy kicks: a fair wakeup through a busy CPU's wake list kicks it only
/// if it would preempt what runs there. One that would not waits on the
/// deferred list, unkicked, until the CPU's tick (or next schedule) takes
/// it; an idle target, an RT wakeup, a wakeup that preempts, and the
/// eager protocol (lazy kicks off) all kick.
#[test]
fn a_fair_wakeup_that_would_not_preempt_a_busy_cpu_does_not_kick_it() {
    let mit = Mitigations::only(Fix::L2Wake);
    for lazy in [true, false] {
        let cfg = SchedConfig {
            lazy_fair_kicks: lazy,
            ..SchedConfig::default()
        };
        let mut sim = Sim::with_config(topo16(), mit, cfg.clone());
        let on6 = CpuMask::single(6);
        let spec = |n: &str| TaskSpec::new(n).affinity(on6);
        let (busy, w1, w2) = (
            sim.s.add_task(&spec("busy"), 0).unwrap(),
            sim.s.add_task(&spec("w1"), 0).unwrap(),
            sim.s.add_task(&spec("w2"), 0).unwrap(),
        );
        // idle target: kicked either way (4 and 6 share no L2: queued)
        sim.s.wake(busy, Some(4), sim.now).unwrap();
        assert_eq!(sim.kicks(), BTreeSet::from([6]), "lazy {lazy}: idle target");
        sim.settle();
        assert_eq!(sim.s.current(6).unwrap(), Some(busy));
        // w1 has run far more than `busy` (a relative virtual runtime
        // above the granularity): it would not preempt
        sim.s.tasks.slots[w1.0 as usize].vruntime.store(
            10 * sim.s.fair_bounds().wakeup_granularity_ns,
            std::sync::atomic::Ordering::Relaxed,
        );
        let before = sim.s.counters();
        sim.now += 1_000;
        sim.s.wake(w1, Some(4), sim.now).unwrap();
        let d = sim.s.counters().since(&before);
        if lazy {
            assert!(
                sim.kicks().is_empty(),
                "a kick for a wakeup that does not preempt"
            );
            assert_eq!(d.wake_deferred, 1);
            assert_eq!(sim.s.wake_list_of(w1), Some(6));
            assert!(
                sim.s.needs_attention(6).unwrap(),
                "the body's next entry takes it"
            );
            // the tick takes it: queued behind `busy`, which keeps running
            sim.now += 1_000;
            sim.s.tick(6, sim.now).unwrap();
            assert_eq!(sim.s.wake_list_of(w1), None);
            assert_eq!(sim.s.task_state(w1).unwrap(), TaskState::Queued);
            // (the tick may kick an idle CPU to balance: w1 waits here)
            assert!(
                !sim.kicks().contains(&6),
                "it does not preempt at the tick either"
            );
            assert!(!sim.s.needs_attention(6).unwrap());
        } else {
            assert_eq!(
                sim.kicks(),
                BTreeSet::from([6]),
                "eager: every queued wakeup kicks"
            );
            assert_eq!(d.wake_deferred, 0);
        }
        sim.settle();
        assert_eq!(sim.s.current(6).unwrap(), Some(busy));
        sim.strict("deferred");
        // w2 has slept (relative virtual runtime far below): it preempts
        sim.now += 1_000;
        sim.s.tick(6, sim.now).unwrap();
        sim.settle();
        sim.s.tasks.slots[w2.0 as usize].vruntime.store(
            (-(10 * sim.s.fair_bounds().latency_ns as i64)) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // `busy` has been charged well past the sleeper credit
        sim.now += 20 * sim.s.fair_bounds().latency_ns;
        sim.s.tick(6, sim.now).unwrap();
        sim.settle();
        let cur = sim.s.current(6).unwrap().unwrap();
        sim.s.wake(w2, Some(4), sim.now).unwrap();
        assert_eq!(
            sim.kicks(),
            BTreeSet::from([6]),
            "lazy {lazy}: a preempting wakeup kicks ({cur:?} runs)"
        );
        sim.settle();
        assert_eq!(sim.s.current(6).unwrap(), Some(w2), "lazy {lazy}");
        sim.strict("preempted");
    }
    // an RT wakeup onto a CPU busy with fair work kicks
    let mut sim = Sim::new(topo16(), mit);
    let fair = sim
        .s
        .add_task(&TaskSpec::new("f").affinity(CpuMask::single(6)), 0)
        .unwrap();
    sim.s.wake(fair, Some(6), sim.now).unwrap();
    sim.settle();
    let rt = sim.fifo_tasks("rt", 1, 10, CpuMask::single(6))[0];
    sim.settle();
    sim.s.wake(rt, Some(4), sim.now).unwrap();
    assert_eq!(sim.kicks(), BTreeSet::from([6]), "RT wakeup");
    sim.settle();
    assert_eq!(sim.s.current(6).unwrap(), Some(rt));
    sim.strict("rt");
}

/// Sleeper credit: a fair task back from a sleep of half the latency or
/// more is placed that far behind and preempts a CPU hog at once; without
/// the credit it comes back level with it and waits.
#[test]
fn sleeper_credit_lets_a_sleeper_preempt() {
    for credit in [false, true] {
        let cfg = SchedConfig {
            sleeper_credit: credit,
            // the 6 ms latency the sleeps below are sized by
            fair_slice_scaling: SliceScaling::None,
            ..SchedConfig::default()
        };
        let mut sim = Sim::with_config(topo16(), Mitigations::all(), cfg.clone());
        let on6 = CpuMask::single(6);
        let hog = sim
            .s
            .add_task(&TaskSpec::new("hog").affinity(on6), sim.now)
            .unwrap();
        let sleeper = sim
            .s
            .add_task(&TaskSpec::new("s").affinity(on6), sim.now)
            .unwrap();
        sim.s.wake(hog, Some(6), sim.now).unwrap();
        sim.settle();
        assert_eq!(sim.s.current(6).unwrap(), Some(hog));
        // the sleeper sleeps while the hog runs 20 ms, ticked every 1 ms
        // (its virtual runtime, and the runqueue's minimum, move on)
        for _ in 0..20 {
            sim.now += 1_000_000;
            sim.s.tick(6, sim.now).unwrap();
        }
        sim.settle();
        sim.s.wake(sleeper, Some(6), sim.now).unwrap();
        sim.settle();
        let expect = if credit { sleeper } else { hog };
        assert_eq!(sim.s.current(6).unwrap(), Some(expect), "credit {credit}");
        sim.strict("woken");
    }
}

/// Without fair wakeup preemption a credited sleeper does not preempt a
/// CPU hog when it wakes (no kick, no switch), and goes first once the
/// hog's turn ends at a tick: ahead of a second hog that waited longer.
/// With it (the default) the same sleeper preempts at once.
#[test]
fn without_wakeup_preemption_a_credited_sleeper_waits_for_the_tick_and_goes_first() {
    for preempt in [true, false] {
        let cfg = SchedConfig {
            sleeper_credit: true,
            fair_wakeup_preempt: preempt,
            // the 6 ms latency the sleeps below are sized by
            fair_slice_scaling: SliceScaling::None,
            ..SchedConfig::default()
        };
        let mut sim = Sim::with_config(topo16(), Mitigations::all(), cfg.clone());
        let on6 = CpuMask::single(6);
        let add = |sim: &mut Sim, name: &str| {
            let spec = TaskSpec::new(name).affinity(on6);
            sim.s.add_task(&spec, sim.now).unwrap()
        };
        let (hog, hog2, sleeper) = (
            add(&mut sim, "hog"),
            add(&mut sim, "hog2"),
            add(&mut sim, "s"),
        );
        sim.s.wake(hog, Some(6), sim.now).unwrap();
        sim.s.wake(hog2, Some(6), sim.now).unwrap();
        sim.settle();
        // the hogs share CPU 6 for 20 ms, ticked every 1 ms, while the
        // sleeper sleeps
        for _ in 0..20 {
            sim.now += 1_000_000;
            sim.s.tick(6, sim.now).unwrap();
            sim.settle();
        }
        let running = sim.s.current(6).unwrap().unwrap();
        let waiting = if running == hog { hog2 } else { hog };
        let kicks = sim.s.counters().resched_kicks;
        sim.s.wake(sleeper, Some(6), sim.now).unwrap();
        sim.settle();
        if preempt {
            assert_eq!(sim.s.current(6).unwrap(), Some(sleeper));
            continue;
        }
        assert_eq!(sim.s.current(6).unwrap(), Some(running), "no preemption");
        assert_eq!(
            sim.s.counters().resched_kicks,
            kicks,
            "no preemption request"
        );
        // at the next ticks the running hog gives way to the sleeper, not
        // to the hog that waited
        let mut next = running;
        for _ in 0..8 {
            sim.now += 1_000_000;
            sim.s.tick(6, sim.now).unwrap();
            sim.settle();
            next = sim.s.current(6).unwrap().unwrap();
            if next != running {
                break;
            }
        }
        assert_eq!(next, sleeper, "picked after the hog (waiting: {waiting:?})");
        sim.strict("no wakeup preemption");
    }
}

/// A fair task that started alone got a whole latency's slice; when three
/// more join its runqueue (woken level with it: no wakeup preemption), its
/// slice end follows the load in, so the tick switches it out after a
/// quarter of the latency. With fixed slices it keeps the CPU for the
/// whole latency first.
#[test]
fn a_running_slice_shrinks_when_tasks_join_its_runqueue() {
    for follow in [true, false] {
        let cfg = SchedConfig {
            slice_follows_load: follow,
            ..SchedConfig::default()
        };
        let mut sim = Sim::with_config(topo16(), Mitigations::all(), cfg);
        // 16 CPUs: Linux's log scaling makes it 4 x 6 ms
        let latency = sim.s.fair_bounds().latency_ns;
        assert_eq!(latency, 24_000_000);
        let on6 = CpuMask::single(6);
        let ids: Vec<TaskId> = (0..4)
            .map(|i| {
                let spec = TaskSpec::new(format!("f{i}")).affinity(on6);
                sim.s.add_task(&spec, sim.now).unwrap()
            })
            .collect();
        sim.s.wake(ids[0], Some(6), sim.now).unwrap();
        sim.settle();
        assert_eq!(sim.s.current(6).unwrap(), Some(ids[0]));
        let start = sim.now;
        for &t in &ids[1..] {
            sim.s.wake(t, Some(6), sim.now).unwrap();
        }
        sim.settle();
        assert_eq!(
            sim.s.current(6).unwrap(),
            Some(ids[0]),
            "no wakeup preemption"
        );
        // tick every 100 us until the first switch
        let mut switched_after = None;
        for _ in 0..300 {
            sim.now += 100_000;
            sim.s.tick(6, sim.now).unwrap();
            sim.settle();
            if sim.s.current(6).unwrap() != Some(ids[0]) {
                switched_after = Some(sim.now - start);
                break;
            }
        }
        let after = switched_after.expect("the first task never gave way");
        if follow {
            assert!(after <= latency / 4 + 200_000, "switched after {after} ns");
        } else {
            assert!(after >= latency, "switched after {after} ns");
        }
        sim.strict("slices");
    }
}

/// A task woken onto an idle CPU waits there for that CPU's kick: another
/// CPU that goes idle meanwhile must not steal it (Linux's balancer passes
/// a runqueue with one runnable task by). The simulator found the cost:
/// with 2-task ping-pong VMs on spr-2s, every wakeup was stolen by the
/// waker's CPU as it went idle, the robbed CPU went looking for work in
/// turn, and runqueue-lock waits took 45% of CPU time.
#[test]
fn an_idle_cpu_does_not_steal_the_one_task_queued_on_another_idle_cpu() {
    for mit in all_sets() {
        let mut sim = Sim::new(topo16(), mit);
        let all: CpuMask = "0-15".parse().unwrap();
        let ids: Vec<TaskId> = (0..2)
            .map(|i| {
                let spec = TaskSpec::new(format!("f{i}")).affinity(all);
                sim.s.add_task(&spec, 0).unwrap()
            })
            .collect();
        // both run; f0 blocks, so its CPU is idle and its previous one
        for &t in &ids {
            sim.s.wake(t, None, sim.now).unwrap();
        }
        sim.settle();
        let cpu_of = |sim: &Sim, t: TaskId| sim.running().iter().find(|r| r.1 == t).unwrap().0;
        let (home, other) = (cpu_of(&sim, ids[0]), cpu_of(&sim, ids[1]));
        sim.now += 1_000;
        sim.s.schedule(home, Prev::Block, sim.now).unwrap();
        sim.settle();
        // f1 wakes f0 (queued on its idle previous CPU, which has not
        // answered the kick yet) and blocks: its CPU looks for work
        sim.now += 1_000;
        sim.s.wake(ids[0], Some(other), sim.now).unwrap();
        sim.s.schedule(other, Prev::Block, sim.now).unwrap();
        assert_eq!(sim.s.current(other).unwrap(), None, "{mit}: stolen");
        assert_eq!(sim.s.counters().steals, 0, "{mit}");
        sim.settle();
        assert_eq!(sim.running(), vec![(home, ids[0])], "{mit}");
        sim.strict("one queued task");
    }
}

/// No wake-affine rule: a fair wakee goes to its previous CPU while that
/// CPU is idle, never towards its waker (Linux's `wake_affine` may, for a
/// synchronous wakeup). So a pair of tasks handing a token back and
/// forth from two CPUs stays on those two CPUs for good: without fix 5
/// each wakeup goes straight into the other CPU's runqueue (the CPUs
/// share an LLC), with it each waits on the other CPU's wake list, where
/// no balance can take it, and kicks that CPU. What the simulator's
/// two-CPU pingpong shows with fix 5 (docs/simulator.md, "Measured error
/// against this machine").
#[test]
fn a_pair_split_across_l2s_stays_split_and_fix_5_queues_every_handoff() {
    for (mit, queued) in [
        (Mitigations::none(), false),
        (Mitigations::only(Fix::L2Wake), true),
    ] {
        let mut sim = Sim::new(topo16(), mit);
        // 4 and 6 share the LLC, not an L2
        let two: CpuMask = "4,6".parse().unwrap();
        let ids: Vec<TaskId> = (0..2)
            .map(|i| {
                let spec = TaskSpec::new(format!("p{i}")).affinity(two);
                sim.s.add_task(&spec, 0).unwrap()
            })
            .collect();
        // one after the other: the second finds the first's CPU busy and
        // takes the other, idle one of the LLC
        for &t in &ids {
            sim.s.wake(t, None, sim.now).unwrap();
            sim.settle();
        }
        let cpu_of = |sim: &Sim, t: TaskId| sim.running().iter().find(|r| r.1 == t).map(|r| r.0);
        let (a, b) = (cpu_of(&sim, ids[0]).unwrap(), cpu_of(&sim, ids[1]).unwrap());
        assert_ne!(a, b, "{mit}: both start running, one per CPU");
        // p1 waits for the token
        sim.now += 1_000;
        sim.s.schedule(b, Prev::Block, sim.now).unwrap();
        sim.settle();
        let before = sim.s.counters();
        for _ in 0..50 {
            for (from, to, me, other) in [(a, b, ids[0], ids[1]), (b, a, ids[1], ids[0])] {
                sim.now += 1_000;
                sim.s.wake(other, Some(from), sim.now).unwrap();
                sim.s.schedule(from, Prev::Block, sim.now).unwrap();
                sim.settle();
                assert_eq!(
                    sim.running(),
                    vec![(to, other)],
                    "{mit}: {me:?} handed over"
                );
            }
        }
        let d = sim.s.counters().since(&before);
        assert_eq!(d.migrations_l2 + d.migrations_llc, 0, "{mit}");
        assert_eq!(d.steals + d.shared_pops, 0, "{mit}");
        if queued {
            assert_eq!((d.wake_queued, d.wake_direct), (100, 0), "{mit}");
        } else {
            assert_eq!((d.wake_queued, d.wake_direct), (0, 100), "{mit}");
        }
        sim.strict("a split pair");
    }
}

#[test]
fn idle_balance_and_shared_runqueue_spread_fair_work() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let mut sim = Sim::new(topo16(), mit);
        let ids: Vec<TaskId> = (0..6)
            .map(|i| {
                sim.s
                    .add_task(
                        &TaskSpec::new(format!("f{i}")).affinity(CpuMask::single(0)),
                        0,
                    )
                    .unwrap()
            })
            .collect();
        for &t in &ids {
            sim.s.wake(t, Some(0), sim.now).unwrap();
        }
        sim.settle();
        assert_eq!(sim.running().len(), 1);
        for &t in &ids {
            sim.s
                .set_affinity(t, &"0-15".parse().unwrap(), sim.now)
                .unwrap();
        }
        sim.settle();
        for _ in 0..20 {
            sim.now += 5_000_000;
            for c in 0..16 {
                sim.s.tick(c, sim.now).unwrap();
            }
            sim.settle();
        }
        sim.strict("balanced");
        let c = sim.s.counters();
        assert!(
            c.balance_kicks > 0 && c.steals + c.shared_pops > 0,
            "{mit}: {c:?}"
        );
        assert_eq!(sim.running().len(), 6, "{mit}: every task got a CPU");
    }
}

/// The busy balance (`vmm serve` turns it on): three tasks that never block on
/// CPU 0 and one on CPU 1 stay so without it, since no CPU ever idles to
/// steal; with it, once the excess of CPU-bound tasks has lasted 100 ms
/// (not before), CPU 0's tick hands one waiting task to CPU 1 (2 and 2),
/// and no further task moves (the margin of two).
#[test]
fn a_busy_cpu_hands_a_waiting_task_to_a_less_loaded_busy_cpu_only_with_busy_balance() {
    for busy in [false, true] {
        for mit in [Mitigations::none(), Mitigations::all()] {
            let cfg = SchedConfig {
                busy_balance: busy,
                ..SchedConfig::default()
            };
            // 2 CPUs with an L2 each and one LLC, as the 2-CPU host
            let mut sim = Sim::with_config(hand_topo(1, 1, 2, 1), mit, cfg);
            let spec = |i: usize, m: &str| {
                TaskSpec::new(format!("f{i}")).affinity(m.parse::<CpuMask>().unwrap())
            };
            let a = sim.s.add_task(&spec(0, "1"), 0).unwrap();
            sim.s.wake(a, Some(1), sim.now).unwrap();
            sim.settle();
            let mut ids = vec![a];
            for i in 1..4 {
                let t = sim.s.add_task(&spec(i, "0"), 0).unwrap();
                sim.s.wake(t, Some(0), sim.now).unwrap();
                ids.push(t);
            }
            sim.settle();
            let both: CpuMask = "0-1".parse().unwrap();
            for &t in &ids {
                sim.s.set_affinity(t, &both, sim.now).unwrap();
            }
            sim.settle();
            let t0 = sim.now;
            let mut first_push = None;
            for _ in 0..200 {
                sim.now += 1_000_000;
                for c in 0..2 {
                    sim.s.tick(c, sim.now).unwrap();
                }
                sim.settle();
                if first_push.is_none() && sim.s.counters().busy_pushes > 0 {
                    first_push = Some(sim.now - t0);
                }
            }
            sim.strict("busy balance");
            if let Some(t) = first_push {
                assert!(
                    t >= 100_000_000,
                    "{mit}: pushed after {t} ns, before the excess lasted"
                );
            }
            let on = |c: u32| {
                ids.iter()
                    .filter(|&&t| sim.s.task_cpu(t).unwrap() == c)
                    .count()
            };
            let pushes = sim.s.counters().busy_pushes;
            if busy {
                assert_eq!((on(0), on(1), pushes), (2, 2, 1), "{mit}");
            } else {
                assert_eq!((on(0), on(1), pushes), (3, 1, 0), "{mit}");
            }
        }
    }
}
