//! RT scheduling: priorities, round robin, RT placement, push and the
//! bounded pull (fix 1's territory).

use super::*;

/// `puller`'s RT pull while the test holds `held`'s runqueue lock: its
/// result, or a timeout error after 20 s if it waited for that lock.
fn pull_while_locked(
    sim: &Sim,
    puller: u32,
    held: u32,
) -> Result<bool, std::sync::mpsc::RecvTimeoutError> {
    let (s, now) = (&sim.s, sim.now);
    std::thread::scope(|sc| {
        let guard = s.lock_rq(held);
        let (tx, rx) = std::sync::mpsc::channel();
        sc.spawn(move || tx.send(s.pull_rt(puller, now)).unwrap());
        let r = rx.recv_timeout(std::time::Duration::from_secs(20));
        drop(guard);
        r
    })
}

/// RT pull leaves alone, without taking its lock, an overloaded CPU whose
/// waiting task is no more urgent than what the puller runs. Without that
/// lockless check every CPU that schedules locked every overloaded CPU in
/// turn, and the 1,000-vCPU soak's workers convoyed on those locks for
/// tens of seconds. Here the source's runqueue lock is held by the test
/// while CPU 1 pulls: the pull must come back anyway.
#[test]
fn rt_pull_skips_a_source_with_nothing_more_urgent_without_its_lock() {
    for mit in all_sets() {
        let mut sim = Sim::new(topo16(), mit);
        let on0 = sim.fifo_tasks("a", 1, 50, CpuMask::single(0))[0];
        let on1 = sim.fifo_tasks("b", 1, 50, CpuMask::single(1))[0];
        let mut both = CpuMask::single(0);
        both.set(1);
        let extra = sim.fifo_tasks("c", 1, 50, both)[0];
        for (t, by) in [(on0, 0), (on1, 1), (extra, 0)] {
            sim.s.wake(t, Some(by), sim.now).unwrap();
            sim.settle();
        }
        assert_eq!(sim.s.current(0).unwrap(), Some(on0), "{mit}");
        assert_eq!(sim.s.current(1).unwrap(), Some(on1), "{mit}");
        assert_eq!(sim.s.task_state(extra).unwrap(), TaskState::Queued);
        assert_eq!(
            sim.s.task_cpu(extra).unwrap(),
            0,
            "{mit}: it waits on CPU 0"
        );
        assert_eq!(
            pull_while_locked(&sim, 1, 0),
            Ok(false),
            "{mit}: CPU 1's pull waited for CPU 0's lock (or pulled an equal task)"
        );
    }
}

/// CPU 1's RT task blocks while FIFO task `x` (allowed on CPUs 0 and 1)
/// waits on CPU 0 behind an equal one, and the test holds CPU 0's
/// runqueue lock meanwhile (as a preempted holder would). Bounded (the
/// default), CPU 1's `schedule` does not wait for that lock: it passes the
/// source by, counts it, asks it to push and goes idle; once the lock is
/// free, CPU 0's push hands `x` to CPU 1. Unbounded, the same `schedule`
/// waits for the lock and pulls `x` itself.
#[test]
fn a_blocking_rt_cpu_does_not_wait_for_a_busy_pull_source() {
    for bounded in [true, false] {
        for mit in [Mitigations::none(), Mitigations::all()] {
            let cfg = SchedConfig {
                bounded_rt_pull: bounded,
                ..SchedConfig::default()
            };
            let mut sim = Sim::with_config(topo16(), mit, cfg);
            let on0 = sim.fifo_tasks("a", 1, 50, CpuMask::single(0))[0];
            let on1 = sim.fifo_tasks("b", 1, 60, CpuMask::single(1))[0];
            let x = sim.fifo_tasks("x", 1, 50, CpuMask::from_cpus([0, 1]))[0];
            for (t, by) in [(on0, 0), (on1, 1), (x, 0)] {
                sim.s.wake(t, Some(by), sim.now).unwrap();
                sim.settle();
            }
            let what = format!("{mit}, bounded {bounded}");
            assert_eq!(sim.s.current(1).unwrap(), Some(on1), "{what}");
            assert_eq!(sim.s.task_state(x).unwrap(), TaskState::Queued, "{what}");
            assert_eq!(sim.s.task_cpu(x).unwrap(), 0, "{what}: x waits on CPU 0");
            let before = sim.s.counters().rt_pull_busy;
            sim.now += 100;
            let (s, now) = (&sim.s, sim.now);
            let (pick, waited) = std::thread::scope(|sc| {
                let guard = s.lock_rq(0);
                let (tx, rx) = std::sync::mpsc::channel();
                sc.spawn(move || tx.send(s.schedule(1, Prev::Block, now).unwrap()).unwrap());
                let hold = std::time::Duration::from_millis(if bounded { 20_000 } else { 300 });
                let r = rx.recv_timeout(hold);
                drop(guard);
                match r {
                    Ok(p) => (p, false),
                    Err(_) => (rx.recv().unwrap(), true),
                }
            });
            if bounded {
                assert!(!waited, "{what}: CPU 1's schedule waited for CPU 0's lock");
                assert_eq!(pick, Pick::Idle, "{what}: nothing pulled, CPU 1 idles");
                assert_eq!(sim.s.counters().rt_pull_busy, before + 1, "{what}");
                assert!(
                    sim.kicks().contains(&0),
                    "{what}: the busy source was not asked to push"
                );
                sim.settle();
            } else {
                assert!(
                    waited,
                    "{what}: the unbounded pull did not wait for the lock"
                );
                assert_eq!(pick, Pick::Switch(x), "{what}: it pulled x itself");
                assert_eq!(sim.s.counters().rt_pull_busy, before, "{what}");
            }
            assert_eq!(
                sim.s.current(1).unwrap(),
                Some(x),
                "{what}: x runs on CPU 1"
            );
            assert_eq!(sim.s.current(0).unwrap(), Some(on0), "{what}");
            sim.strict(&what);
        }
    }
}

/// A bounded pull that takes a task from one source and passes a busy one
/// by still asks the busy one to push when what waits there is more
/// urgent than what it took: CPU 1 pulls `x` (FIFO 50) from CPU 0 while
/// the test holds CPU 2's lock, where `y` (FIFO 70) waits; CPU 2 is
/// kicked, and once its lock is free its push hands `y` to CPU 1.
#[test]
fn a_bounded_pull_asks_a_busy_source_with_a_more_urgent_task_to_push() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let mut sim = Sim::new(topo16(), mit);
        let a0 = sim.fifo_tasks("a", 1, 60, CpuMask::single(0))[0];
        let b1 = sim.fifo_tasks("b", 1, 95, CpuMask::single(1))[0];
        let a2 = sim.fifo_tasks("c", 1, 90, CpuMask::single(2))[0];
        let x = sim.fifo_tasks("x", 1, 50, CpuMask::from_cpus([0, 1]))[0];
        let y = sim.fifo_tasks("y", 1, 70, CpuMask::single(2))[0];
        for (t, by) in [(a0, 0), (b1, 1), (a2, 2), (x, 0), (y, 2)] {
            sim.s.wake(t, Some(by), sim.now).unwrap();
            sim.settle();
        }
        // queued on CPU 2, then allowed on CPU 1 too (busier: it stays)
        sim.s
            .set_affinity(y, &CpuMask::from_cpus([1, 2]), sim.now)
            .unwrap();
        sim.settle();
        assert_eq!(sim.s.task_cpu(x).unwrap(), 0, "{mit}: x waits on CPU 0");
        assert_eq!(sim.s.task_cpu(y).unwrap(), 2, "{mit}: y waits on CPU 2");
        assert_eq!(sim.s.task_state(y).unwrap(), TaskState::Queued, "{mit}");
        sim.now += 100;
        let (s, now) = (&sim.s, sim.now);
        let pick = std::thread::scope(|sc| {
            let guard = s.lock_rq(2);
            let h = sc.spawn(move || s.schedule(1, Prev::Block, now).unwrap());
            let t0 = std::time::Instant::now();
            while !h.is_finished() && t0.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let done = h.is_finished();
            drop(guard);
            assert!(done, "{mit}: CPU 1's schedule waited for CPU 2's lock");
            h.join().unwrap()
        });
        assert_eq!(pick, Pick::Switch(x), "{mit}: CPU 1 pulled x from CPU 0");
        assert!(
            sim.kicks().contains(&2),
            "{mit}: CPU 2, passed by with a more urgent task, was not asked to push"
        );
        sim.settle();
        assert_eq!(sim.s.current(1).unwrap(), Some(y), "{mit}: y runs on CPU 1");
        sim.strict(&format!("{mit}"));
    }
}

/// RT pull leaves alone, without taking its lock, an overloaded CPU none
/// of whose waiting tasks may run on the puller (their affinity folded
/// onto 64 bits misses its bit): pinned RT vCPUs of other VMs. Without
/// it, every CPU lowering its priority double-locked every overloaded CPU
/// and found nothing (the simulator's 480-CPU transcode spent all its CPU
/// time there). A task allowed on the puller is still pulled.
#[test]
fn rt_pull_skips_a_source_whose_waiting_tasks_may_not_run_here() {
    for mit in all_sets() {
        pinned_source_is_passed_by(topo16(), mit, 1);
    }
}

/// The same above 64 CPUs, where the fold must group CPUs: folded by
/// `cpu % 64`, CPU 64 shared CPU 0's bit and locked the source for a task
/// pinned to CPUs 0 and 2 (on the simulator's 480-CPU transcode at 20 us
/// per frame, about a million such futile double locks per 20 ms, one in
/// nine sources scanned). Folded by neighbourhood it passes it by, while
/// CPU 1, next to the task's CPUs, still gets it.
#[test]
fn rt_pull_above_64_cpus_skips_a_source_whose_tasks_are_pinned_far_away() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        // 2 packages x 4 LLCs x 8 L2s x 2 threads: 128 CPUs
        pinned_source_is_passed_by(hand_topo(2, 4, 8, 2), mit, 64);
    }
}

/// A FIFO task `x` allowed on CPUs 0 and 2 waits behind pinned tasks
/// there: `puller`'s pull must come back without the source's lock (the
/// test holds it). Once `x` may run on CPU 1 too, idle CPU 1 gets it.
fn pinned_source_is_passed_by(t: HostTopology, mit: Mitigations, puller: u32) {
    let mut sim = Sim::new(t, mit);
    let on0 = sim.fifo_tasks("a", 1, 50, CpuMask::single(0))[0];
    let on2 = sim.fifo_tasks("b", 1, 60, CpuMask::single(2))[0];
    let x = sim.fifo_tasks("x", 1, 50, CpuMask::from_cpus([0, 2]))[0];
    for (t, by) in [(on0, 0), (on2, 2), (x, 0)] {
        sim.s.wake(t, Some(by), sim.now).unwrap();
        sim.settle();
    }
    assert_eq!(sim.s.task_state(x).unwrap(), TaskState::Queued, "{mit}");
    let src = sim.s.task_cpu(x).unwrap();
    assert!(src == 0 || src == 2, "{mit}: it waits on CPU {src}");
    assert_eq!(
        pull_while_locked(&sim, puller, src),
        Ok(false),
        "{mit}: CPU {puller}'s pull waited for CPU {src}'s lock though x may not run there"
    );
    // allowed on CPU 1 now: CPU 1 (idle) gets it
    sim.s
        .set_affinity(x, &CpuMask::from_cpus([0, 1, 2]), sim.now)
        .unwrap();
    sim.settle();
    assert_eq!(sim.s.current(1).unwrap(), Some(x), "{mit}");
    sim.strict("x on CPU 1");
}

#[test]
fn prio_99_preempts_prio_1_on_one_cpu() {
    for mit in all_sets() {
        let mut sim = Sim::new(hand_topo(1, 1, 1, 1), mit);
        let lo = sim
            .s
            .add_task(&TaskSpec::new("lo").policy(Policy::Fifo(1)), 0)
            .unwrap();
        let hi = sim
            .s
            .add_task(&TaskSpec::new("hi").policy(Policy::Fifo(99)), 0)
            .unwrap();
        assert!(sim.s.wake(lo, None, sim.now).unwrap());
        sim.settle();
        assert_eq!(sim.s.current(0).unwrap(), Some(lo));
        assert!(sim.s.wake(hi, Some(0), sim.now).unwrap());
        sim.settle();
        assert_eq!(sim.s.current(0).unwrap(), Some(hi), "{mit}");
        assert_eq!(sim.s.task_state(lo).unwrap(), TaskState::Queued);
        sim.strict("99 running");
        sim.now += 10;
        assert_eq!(
            sim.s.schedule(0, Prev::Block, sim.now).unwrap(),
            Pick::Switch(lo)
        );
        sim.now += 10;
        assert_eq!(sim.s.schedule(0, Prev::Block, sim.now).unwrap(), Pick::Idle);
        sim.settle();
        sim.strict("all idle");
        let st = sim.s.task_stats(lo).unwrap();
        assert_eq!(st.runs, 2);
        assert_eq!(st.preemptions, 1);
        assert_eq!(st.wake_to_run.count(), 1);
    }
}

#[test]
fn rt_top_tasks_run_everywhere() {
    for mit in all_sets() {
        let mut sim = Sim::new(topo16(), mit);
        let mut ids = Vec::new();
        for i in 0..40u32 {
            let p = Policy::Fifo((i * 7 % 99 + 1) as u8);
            ids.push((
                sim.s
                    .add_task(&TaskSpec::new(format!("t{i}")).policy(p), 0)
                    .unwrap(),
                p,
            ));
        }
        for (k, (id, _)) in ids.iter().enumerate() {
            sim.now += 50;
            sim.s.wake(*id, Some((k % 16) as u32), sim.now).unwrap();
            if k % 5 == 0 {
                sim.settle();
                sim.strict("while waking");
            }
        }
        sim.settle();
        sim.strict("all woken");
        let mut prios: Vec<u8> = ids.iter().map(|(_, p)| p.rt_prio()).collect();
        prios.sort_unstable_by(|a, b| b.cmp(a));
        let mut running: Vec<u8> = sim
            .running()
            .iter()
            .map(|(_, t)| sim.s.task_policy(*t).unwrap().rt_prio())
            .collect();
        running.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(
            running,
            prios[..16].to_vec(),
            "{mit}: the 16 most urgent run"
        );
    }
}

#[test]
fn rr_rotates_equal_priorities() {
    let mut sim = Sim::new(hand_topo(1, 1, 1, 1), Mitigations::none());
    let a = sim
        .s
        .add_task(&TaskSpec::new("a").policy(Policy::Rr(10)), 0)
        .unwrap();
    let b = sim
        .s
        .add_task(&TaskSpec::new("b").policy(Policy::Rr(10)), 0)
        .unwrap();
    let f = sim
        .s
        .add_task(&TaskSpec::new("f").policy(Policy::Fifo(10)), 0)
        .unwrap();
    sim.s.wake(a, None, sim.now).unwrap();
    sim.s.wake(b, None, sim.now).unwrap();
    sim.settle();
    let first = sim.s.current(0).unwrap();
    sim.now += 150_000_000;
    sim.s.tick(0, sim.now).unwrap();
    sim.settle();
    assert_ne!(
        sim.s.current(0).unwrap(),
        first,
        "RR slice expired: the peer runs"
    );
    // FIFO never rotates by time
    sim.s.schedule(0, Prev::Block, sim.now).unwrap();
    sim.s.schedule(0, Prev::Block, sim.now).unwrap();
    sim.s.wake(f, None, sim.now).unwrap();
    sim.s.wake(a, None, sim.now).unwrap();
    sim.settle();
    let cur = sim.s.current(0).unwrap().unwrap();
    sim.now += 500_000_000;
    sim.s.tick(0, sim.now).unwrap();
    sim.settle();
    if cur == f {
        assert_eq!(sim.s.current(0).unwrap(), Some(f), "FIFO keeps the CPU");
    }
    sim.strict("end");
}

/// RT tasks woken one after another onto the same idle CPU, whose worker
/// has not answered its kick yet (on an oversubscribed host it may take
/// seconds), must not all wait for it while other CPUs idle.
#[test]
fn a_burst_of_rt_wakeups_does_not_pile_onto_a_cpu_that_has_not_answered() {
    for mit in all_sets() {
        let mut sim = Sim::new(topo16(), mit);
        // CPU 1 (an L2 sibling of the tasks' home CPU 0) runs the waker
        let waker = sim
            .s
            .add_task(&TaskSpec::new("waker").affinity(CpuMask::single(1)), 0)
            .unwrap();
        sim.s.wake(waker, None, sim.now).unwrap();
        sim.settle();
        assert_eq!(sim.s.current(1).unwrap(), Some(waker));
        let ids = sim.fifo_tasks("rt", 4, 50, CpuMask::single(0));
        // each has last run on CPU 0, which is idle again
        for &t in &ids {
            sim.s.wake(t, None, sim.now).unwrap();
            sim.settle();
            assert_eq!(sim.s.current(0).unwrap(), Some(t));
            sim.now += 10;
            sim.s.schedule(0, Prev::Block, sim.now).unwrap();
            sim.s
                .set_affinity(t, &"0-3".parse().unwrap(), sim.now)
                .unwrap();
        }
        sim.strict("all blocked");
        // no kick is delivered between the wakeups
        for &t in &ids {
            sim.s.wake(t, Some(1), sim.now).unwrap();
        }
        // every CPU but 0 answers its kicks
        for _ in 0..100 {
            let need: Vec<u32> = (1..16)
                .filter(|&c| sim.s.needs_attention(c).unwrap())
                .collect();
            if need.is_empty() {
                break;
            }
            for c in need {
                sim.now += 100;
                sim.s.schedule(c, Prev::Keep, sim.now).unwrap();
            }
        }
        let running: Vec<CpuId> = (2..4)
            .filter(|&c| sim.s.current(c).unwrap().is_some())
            .collect();
        assert_eq!(
            running.len(),
            2,
            "{mit}: 4 RT tasks woken onto CPUs 0-3 while CPU 0 does not answer; \
             idle CPUs 2 and 3 must run two of them\n{}",
            sim.s.dump()
        );
        sim.settle();
        sim.strict("after the burst");
        assert_eq!(sim.running().len(), 4, "{mit}");
    }
}

/// cpupri files idle CPUs and CPUs running fair tasks at one level (as
/// Linux has since v5.10), so the RT wakeup asks the idle tracker for an
/// idle CPU of the LLC before taking the nearest CPU of that level: a woken
/// RT task whose CPU runs a more urgent RT task goes to idle CPU 3, not to
/// CPU 1 (its SMT sibling, running fair work), and no fair task is
/// preempted.
#[test]
fn rt_wakeup_prefers_an_idle_cpu_of_its_llc_to_one_running_fair_work() {
    for mit in all_sets() {
        let mut sim = Sim::new(topo16(), mit);
        let rt = sim.fifo_tasks("rt", 1, 50, CpuMask::single(0))[0];
        sim.s.wake(rt, None, sim.now).unwrap();
        sim.settle();
        sim.now += 10;
        sim.s.schedule(0, Prev::Block, sim.now).unwrap();
        sim.s
            .set_affinity(rt, &"0-3".parse().unwrap(), sim.now)
            .unwrap();
        let hog = sim.fifo_tasks("hog", 1, 60, CpuMask::single(0))[0];
        sim.s.wake(hog, None, sim.now).unwrap();
        let fair: Vec<TaskId> = [1u32, 2]
            .iter()
            .map(|&c| {
                let spec = TaskSpec::new(format!("fair{c}")).affinity(CpuMask::single(c));
                let t = sim.s.add_task(&spec, 0).unwrap();
                sim.s.wake(t, None, sim.now).unwrap();
                t
            })
            .collect();
        sim.settle();
        assert_eq!(sim.s.current(0).unwrap(), Some(hog));
        assert_eq!(sim.s.current(3).unwrap(), None, "CPU 3 idle");
        sim.s.wake(rt, Some(0), sim.now).unwrap();
        sim.settle();
        assert_eq!(
            sim.s.current(3).unwrap(),
            Some(rt),
            "{mit}: the RT task belongs on idle CPU 3\n{}",
            sim.s.dump()
        );
        assert_eq!(sim.s.current(1).unwrap(), Some(fair[0]), "{mit}");
        assert_eq!(sim.s.current(2).unwrap(), Some(fair[1]), "{mit}");
        sim.strict("after the wakeup");
    }
}

/// A CPU holding several waiting RT tasks that beat what it runs keeps the
/// first (it runs it next) and pushes the others to CPUs that can run them
/// now, without waiting for its own schedule().
#[test]
fn push_keeps_the_head_and_sends_the_rest_away() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let mut sim = Sim::new(topo16(), mit);
        let ids = sim.fifo_tasks("t", 3, 50, CpuMask::single(3));
        for &t in &ids {
            sim.s.wake(t, Some(2), sim.now).unwrap();
        }
        // CPU 3 has not answered: all three wait there, idle
        assert_eq!(sim.s.current(3).unwrap(), None);
        assert!(ids
            .iter()
            .all(|&t| sim.s.task_state(t).unwrap() == TaskState::Queued));
        for &t in &ids {
            sim.s
                .set_affinity(t, &"0-15".parse().unwrap(), sim.now)
                .unwrap();
        }
        // still no schedule() on CPU 3: the head waits there, the rest left
        assert_eq!(sim.s.task_cpu(ids[0]).unwrap(), 3, "{mit}");
        for &t in &ids[1..] {
            assert_ne!(sim.s.task_cpu(t).unwrap(), 3, "{mit}\n{}", sim.s.dump());
        }
        assert!(sim.s.needs_attention(3).unwrap());
        sim.settle();
        sim.strict("pushed");
        assert_eq!(sim.running().len(), 3);
        // CPU 3 became overloaded (pushable tasks waiting) and stopped
        // being so: two overload-counter updates at least.
        assert!(sim.s.counters().rto_updates >= 2, "{mit}");
    }
}

/// An RT wakeup left on a busy CPU's wake list, where it cannot preempt,
/// is pushed to a CPU running lower when that CPU's tick takes it (with a
/// deferred fair wakeup) off the list, as a wakeup's enqueue pushes
/// (Linux's `task_woken_rt`): the drain spends what the wakeup's kick
/// would have made the CPU do, so nothing else would push it. (Found by
/// `tests/core_props.rs`.)
#[test]
fn an_rt_wakeup_taken_off_the_wake_list_by_the_tick_is_pushed() {
    let mut sim = Sim::with_config(topo16(), Mitigations::none(), SchedConfig::default());
    let spec = |n: &str, pol: Policy, m: CpuMask| TaskSpec::new(n).policy(pol).affinity(m);
    let a = sim
        .s
        .add_task(&spec("a", Policy::Fifo(50), CpuMask::single(6)), sim.now)
        .unwrap();
    let b = sim
        .s
        .add_task(&spec("b", Policy::Fifo(60), CpuMask::single(7)), sim.now)
        .unwrap();
    let c = sim
        .s
        .add_task(
            &spec("c", Policy::Fifo(50), CpuMask::from_cpus(6..=7)),
            sim.now,
        )
        .unwrap();
    let f = sim
        .s
        .add_task(&spec("f", Policy::Fair(1024), CpuMask::single(6)), sim.now)
        .unwrap();
    sim.s.wake(a, None, sim.now).unwrap();
    sim.s.wake(b, None, sim.now).unwrap();
    sim.settle();
    assert_eq!(sim.s.current(6).unwrap(), Some(a));
    assert_eq!(sim.s.current(7).unwrap(), Some(b));
    // c goes to CPU 6, the lower of its two, where it cannot preempt a;
    // f is deferred there (it would not preempt an RT task)
    sim.now += 1_000;
    sim.s.wake(c, None, sim.now).unwrap();
    sim.s.wake(f, None, sim.now).unwrap();
    // CPU 7 goes idle before CPU 6 looks at its lists: nothing to pull yet
    sim.s.schedule(7, Prev::Block, sim.now).unwrap();
    assert_eq!(sim.s.current(7).unwrap(), None);
    sim.now += 1_000;
    sim.s.tick(6, sim.now).unwrap();
    sim.settle();
    assert_eq!(sim.s.current(6).unwrap(), Some(a));
    assert_eq!(
        sim.s.current(7).unwrap(),
        Some(c),
        "c pushed to the idle CPU"
    );
    sim.strict("pushed from the tick");
}
