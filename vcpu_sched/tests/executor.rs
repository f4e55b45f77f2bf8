//! The executors on real threads: the same bodies on the M:N workers, on
//! one thread per task with run slots, and (where no scheduler is needed)
//! on plain host threads: hand-over, preemption, timers, sleeps that a wake
//! ends early, emulated topologies, and the executors' own checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vcpu_sched::exec::*;
use vcpu_sched::*;

const SCHED_KINDS: [ExecutorKind; 2] = [ExecutorKind::Workers, ExecutorKind::Threads];

fn exec(kind: ExecutorKind, spec: &str, mit: Mitigations, check: bool) -> Executor {
    let topo = Arc::new(topology::load(spec).unwrap());
    let cfg = ExecConfig {
        mapping: CpuMapping::emulated_on_allowed().unwrap(),
        check: check.then(CheckConfig::default),
        ..ExecConfig::default()
    };
    Executor::start(kind, topo, mit, SchedConfig::default(), &cfg).unwrap()
}

/// Waits (at most `secs`) until `done()`; false if it never was.
fn wait_until(secs: u64, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > Duration::from_secs(secs) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Spins for about `ns` of wall time, handing the CPU back when asked.
fn compute(cx: &Cx<'_>, ns: u64) -> bool {
    let end = cx.now() + ns;
    while cx.now() < end {
        for i in 0..200u32 {
            std::hint::black_box(i.wrapping_mul(2_654_435_761));
        }
        if cx.should_yield() {
            return false;
        }
    }
    true
}

/// Two tasks wake each other and block, 2,000 times each.
fn ping_pong(ex: &Executor) -> Arc<AtomicU64> {
    let count = Arc::new(AtomicU64::new(0));
    let peer = Arc::new(AtomicU64::new(u64::MAX));
    let mut ids = Vec::new();
    for i in 0..2 {
        let (count, peer) = (count.clone(), peer.clone());
        let mut n = 0;
        let body = move |cx: &Cx<'_>| {
            if cx.stopping() {
                return Action::Exit;
            }
            let p = peer.load(Ordering::Acquire);
            if p == u64::MAX {
                // wait until both exist
                return Action::Yield;
            }
            let other = TaskId((p >> (32 * (1 - i))) as u32);
            if n == 2000 {
                return Action::Wake(other);
            }
            if n == 2001 {
                return Action::Exit;
            }
            n += 1;
            count.fetch_add(1, Ordering::Relaxed);
            cx.wake(other);
            Action::Block
        };
        ids.push(
            ex.spawner()
                .spawn(&TaskSpec::new(format!("p{i}")), Box::new(body))
                .unwrap(),
        );
    }
    peer.store(
        ((ids[1].0 as u64) << 32) | ids[0].0 as u64,
        Ordering::Release,
    );
    count
}

#[test]
fn ping_pong_hands_the_cpu_back_and_forth_on_every_executor() {
    for kind in ExecutorKind::ALL {
        for mit in [Mitigations::none(), Mitigations::all()] {
            if kind == ExecutorKind::Host && mit != Mitigations::none() {
                continue;
            }
            let ex = exec(kind, "package:1 l3:1 l2:2 core:1 pu:1", mit, true);
            let count = ping_pong(&ex);
            let finished = wait_until(60, || count.load(Ordering::Relaxed) >= 4000);
            assert!(finished, "{kind} {mit}: {count:?}");
            let r = ex.shutdown(Duration::from_secs(10)).unwrap();
            assert!(r.violations.is_empty(), "{kind} {mit}: {:?}", r.violations);
            assert!(r.failures.is_empty(), "{kind} {mit}: {:?}", r.failures);
            assert_eq!(count.load(Ordering::Relaxed), 4000, "{kind} {mit}");
            if kind.has_scheduler() {
                assert!(r.counters.switches > 1000, "{kind} {mit}: {:?}", r.counters);
                assert_eq!(r.tasks.len(), 2, "{kind} {mit}");
            } else {
                assert_eq!(r.host_schedstat.iter().flatten().count(), 2, "{kind}");
            }
        }
    }
}

#[test]
fn rt_task_preempts_a_spinning_fair_task() {
    for kind in SCHED_KINDS {
        let ex = exec(
            kind,
            "package:1 l3:1 l2:1 core:1 pu:1",
            Mitigations::all(),
            true,
        );
        let sp = ex.spawner();
        let spins = Arc::new(AtomicU64::new(0));
        let s2 = spins.clone();
        sp.spawn(
            &TaskSpec::new("hog"),
            Box::new(move |cx: &Cx<'_>| {
                if cx.stopping() {
                    return Action::Exit;
                }
                s2.fetch_add(1, Ordering::Relaxed);
                compute(cx, 100_000);
                Action::Continue
            }),
        )
        .unwrap();
        let (periods, lat) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (p2, l2) = (periods.clone(), lat.clone());
        let mut next = 0u64;
        sp.spawn(
            &TaskSpec::new("rt").policy(Policy::Fifo(50)),
            Box::new(move |cx: &Cx<'_>| {
                let now = cx.now();
                if next == 0 {
                    next = now + 2_000_000;
                }
                if now < next {
                    return Action::Sleep(next - now);
                }
                l2.fetch_max(now - next, Ordering::Relaxed);
                if p2.fetch_add(1, Ordering::Relaxed) + 1 == 50 {
                    return Action::Exit;
                }
                next += 2_000_000;
                Action::Continue
            }),
        )
        .unwrap();
        let ran = wait_until(60, || periods.load(Ordering::Relaxed) >= 50);
        assert!(
            ran,
            "{kind}: the RT task ran all its periods despite the hog"
        );
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "{kind}: {:?}", r.violations);
        assert!(spins.load(Ordering::Relaxed) > 0, "{kind}: the hog ran too");
        let rt_stats = r.tasks.iter().find(|t| t.name == "rt").unwrap();
        let hog = r.tasks.iter().find(|t| t.name == "hog").unwrap();
        // (A period whose deadline had passed before the task slept again
        // needs no wakeup, so counts are not exactly 50 on a loaded host.)
        assert!(
            rt_stats.wakeups > 0 && rt_stats.runs > 1,
            "{kind}: {rt_stats:?}"
        );
        // on the single CPU, the RT task only ever ran by preempting the hog
        assert!(
            hog.preemptions + 1 >= rt_stats.runs,
            "{kind}: {hog:?} {rt_stats:?}"
        );
    }
}

/// A sleep ends at its time, or earlier when the task is woken: the
/// semantics every executor gives `Action::Sleep` (the Linux halt poller
/// relies on it to wake a halted vCPU as soon as an interrupt is pending).
#[test]
fn a_wake_ends_a_sleep_early_and_the_timer_ends_it_otherwise() {
    for kind in ExecutorKind::ALL {
        let ex = exec(
            kind,
            "package:1 l3:1 l2:2 core:1 pu:1",
            Mitigations::all(),
            true,
        );
        let sp = ex.spawner();
        let woke_after = Arc::new(Mutex::new(Vec::new()));
        let w2 = woke_after.clone();
        let mut asleep_since = 0u64;
        let id = sp
            .spawn(
                &TaskSpec::new("sleeper"),
                Box::new(move |cx: &Cx<'_>| {
                    if asleep_since != 0 {
                        w2.lock().unwrap().push(cx.now() - asleep_since);
                    }
                    if cx.stopping() || w2.lock().unwrap().len() == 2 {
                        return Action::Exit;
                    }
                    asleep_since = cx.now();
                    // first a 30 s sleep (to be cut short), then 50 ms
                    let n = w2.lock().unwrap().len();
                    Action::Sleep(if n == 0 { 30_000_000_000 } else { 50_000_000 })
                }),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        sp.wake(id);
        assert!(
            wait_until(30, || woke_after.lock().unwrap().len() == 2),
            "{kind}: {:?}",
            woke_after.lock().unwrap()
        );
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "{kind}: {:?}", r.violations);
        let w = woke_after.lock().unwrap().clone();
        assert!(
            w[0] < 10_000_000_000,
            "{kind}: the wake did not end the sleep: {w:?}"
        );
        assert!(
            w[1] >= 50_000_000,
            "{kind}: the timed sleep ended early: {w:?}"
        );
    }
}

/// A task starts blocked: the wake that starts it is not also a wake for
/// its first block. A second wake that lands before it has run is
/// remembered for that block, as a wake of a running task is. (A micro-guest
/// worker halts at once and counts on the doorbell it was sent while it
/// was still starting: losing it stalled the host executor's vCPUs.)
#[test]
fn a_wake_before_the_first_run_is_kept_for_the_first_block() {
    for kind in ExecutorKind::ALL {
        let ex = exec(
            kind,
            "package:1 l3:1 l2:2 core:1 pu:1",
            Mitigations::all(),
            false,
        );
        let entries = Arc::new(AtomicU64::new(0));
        let e2 = entries.clone();
        let body = Box::new(move |cx: &Cx<'_>| {
            // block once, then end
            if e2.fetch_add(1, Ordering::AcqRel) == 0 && !cx.stopping() {
                Action::Block
            } else {
                Action::Exit
            }
        });
        let spec = TaskSpec::new("halts-at-once");
        // added without running, then woken twice before it can run
        let id = match &ex {
            Executor::Workers(w) => w.add(&spec, body, None),
            Executor::Threads(t) => t.add(&spec, body, None),
            Executor::Host(h) => h.add(&spec, body, None, &HostThread::default()),
        }
        .unwrap();
        let sp = ex.spawner();
        assert!(sp.wake(id), "{kind}: the first wake found it awake");
        sp.wake(id);
        assert!(
            wait_until(10, || entries.load(Ordering::Acquire) == 2),
            "{kind}: the second wake was lost ({} entries)",
            entries.load(Ordering::Acquire)
        );
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.failures.is_empty(), "{kind}: {:?}", r.failures);
    }
}

#[test]
fn emulated_genoa_runs_hundreds_of_tasks() {
    for kind in SCHED_KINDS {
        let ex = exec(kind, "genoa-2s", Mitigations::all(), true);
        assert_eq!(ex.scheduler().unwrap().num_cpus(), 384);
        let done = Arc::new(AtomicU64::new(0));
        for i in 0..400u32 {
            let d = done.clone();
            let pol = if i % 4 == 0 {
                Policy::Fifo((i % 90 + 1) as u8)
            } else {
                Policy::default()
            };
            let (mut k, mut sleeping) = (0u64, false);
            let body = move |cx: &Cx<'_>| {
                if cx.stopping() {
                    return Action::Exit;
                }
                if k == 20 {
                    d.fetch_add(1, Ordering::Relaxed);
                    return Action::Exit;
                }
                if !sleeping {
                    sleeping = true;
                    return Action::Sleep(200_000 + (k * 7919 % 300_000));
                }
                if !compute(cx, 20_000) {
                    return Action::Continue;
                }
                sleeping = false;
                k += 1;
                Action::Continue
            };
            ex.spawner()
                .spawn(&TaskSpec::new(format!("t{i}")).policy(pol), Box::new(body))
                .unwrap();
        }
        assert!(
            wait_until(120, || done.load(Ordering::Relaxed) == 400),
            "{kind}: {} of 400 done",
            done.load(Ordering::Relaxed)
        );
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "{kind}: {:?}", r.violations);
        assert!(r.checks > 0, "{kind}");
        assert_eq!(r.tasks.len(), 400, "{kind}");
    }
}

/// A body that panics fails its task alone: the executor reports it and
/// runs on.
#[test]
fn a_panicking_body_fails_its_task_and_the_others_run_on() {
    for kind in ExecutorKind::ALL {
        let ex = exec(
            kind,
            "package:1 l3:1 l2:2 core:1 pu:1",
            Mitigations::all(),
            false,
        );
        let sp = ex.spawner();
        sp.spawn(
            &TaskSpec::new("bad"),
            Box::new(|_: &Cx<'_>| -> Action { panic!("boom") }),
        )
        .unwrap();
        let n = Arc::new(AtomicU64::new(0));
        let n2 = n.clone();
        sp.spawn(
            &TaskSpec::new("good"),
            Box::new(move |cx: &Cx<'_>| {
                if cx.stopping() || n2.fetch_add(1, Ordering::Relaxed) == 100 {
                    return Action::Exit;
                }
                Action::Sleep(100_000)
            }),
        )
        .unwrap();
        assert!(wait_until(30, || n.load(Ordering::Relaxed) > 100), "{kind}");
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert_eq!(r.failures.len(), 1, "{kind}: {:?}", r.failures);
        assert!(r.failures[0].contains("boom"), "{kind}: {:?}", r.failures);
    }
}

/// `host_rt` puts the threads that run bodies at host SCHED_FIFO at that
/// priority. Where the process may not (no CAP_SYS_NICE, no RT rlimit)
/// they stay SCHED_OTHER, and the run still completes.
#[test]
fn host_rt_runs_body_threads_at_host_sched_fifo() {
    fn policy_of_this_thread() -> (i32, i32) {
        // SAFETY: plain queries of the calling thread; `p` outlives the call.
        unsafe {
            let mut p: libc::sched_param = std::mem::zeroed();
            libc::sched_getparam(0, &mut p);
            (libc::sched_getscheduler(0), p.sched_priority)
        }
    }
    // may this process use SCHED_FIFO at all? (asked on a throwaway thread)
    let permitted = std::thread::spawn(|| set_current_thread_policy(Policy::Fifo(1)).is_ok())
        .join()
        .unwrap();
    for kind in SCHED_KINDS {
        let topo = Arc::new(topology::load("package:1 l3:1 l2:1 core:1 pu:1").unwrap());
        let cfg = ExecConfig {
            mapping: CpuMapping::emulated_on_allowed().unwrap(),
            host_rt: Some(3),
            ..ExecConfig::default()
        };
        let ex =
            Executor::start(kind, topo, Mitigations::all(), SchedConfig::default(), &cfg).unwrap();
        let seen = Arc::new(Mutex::new(None));
        let s2 = seen.clone();
        ex.spawner()
            .spawn(
                &TaskSpec::new("t"),
                Box::new(move |_: &Cx<'_>| {
                    *s2.lock().unwrap() = Some(policy_of_this_thread());
                    Action::Exit
                }),
            )
            .unwrap();
        assert!(wait_until(30, || seen.lock().unwrap().is_some()), "{kind}");
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "{kind}: {:?}", r.violations);
        let got = seen.lock().unwrap().expect("the task ran");
        if permitted {
            assert_eq!(got, (libc::SCHED_FIFO, 3), "{kind}");
        } else {
            assert_eq!(got.0, libc::SCHED_OTHER, "{kind}");
        }
    }
}

/// What the checker is told about a CPU: an idle CPU's own thread sleeps
/// unkicked; a CPU whose task computes is runnable, and its host CPU time
/// grows while it runs.
#[test]
fn liveness_tells_a_sleeping_cpu_from_a_working_one() {
    for kind in SCHED_KINDS {
        let ex = exec(
            kind,
            "package:1 l3:1 l2:2 core:1 pu:1",
            Mitigations::all(),
            false,
        );
        let liveness = |cpu| match &ex {
            Executor::Workers(w) => w.liveness(cpu),
            Executor::Threads(t) => t.liveness(cpu),
            Executor::Host(_) => unreachable!(),
        };
        assert!(
            wait_until(30, || liveness(1) == Liveness::Parked),
            "{kind}: CPU 1 idles parked"
        );
        let go = Arc::new(AtomicU64::new(1));
        let g2 = go.clone();
        let t = ex
            .spawner()
            .spawn(
                &TaskSpec::new("spin").affinity(CpuMask::single(1)),
                Box::new(move |cx: &Cx<'_>| {
                    if g2.load(Ordering::Relaxed) != 1 || cx.stopping() {
                        return Action::Exit;
                    }
                    compute(cx, 1_000_000);
                    Action::Continue
                }),
            )
            .unwrap();
        let sched = ex.scheduler().unwrap().clone();
        assert!(
            wait_until(30, || sched.current(1).unwrap() == Some(t)),
            "{kind}: the task runs on CPU 1"
        );
        let cpu_ns = || match liveness(1) {
            Liveness::Runnable { cpu_ns } => Some(cpu_ns),
            _ => None,
        };
        if thread_cpu_ns(current_tid()).is_some() {
            let a = cpu_ns().unwrap_or_else(|| panic!("{kind}: not runnable: {:?}", liveness(1)));
            assert!(
                wait_until(30, || cpu_ns().unwrap_or(0) > a),
                "{kind}: its host CPU time grows"
            );
        } else {
            // a kernel without schedstat: the executor cannot tell
            assert_eq!(liveness(1), Liveness::Unknown);
        }
        go.store(0, Ordering::Relaxed);
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "{kind}: {:?}", r.violations);
    }
}

/// A `RemoteWaker` is the spawner's wake, owned: a thread that holds a
/// clone (a device's I/O thread) wakes a task that blocks over and over,
/// on every executor, and a wake after shutdown is harmless.
#[test]
fn a_remote_waker_wakes_tasks_from_another_thread() {
    for kind in ExecutorKind::ALL {
        let ex = exec(
            kind,
            "package:1 l3:1 l2:2 core:1 pu:1",
            Mitigations::all(),
            false,
        );
        let entries = Arc::new(AtomicU64::new(0));
        let e2 = entries.clone();
        let body = move |cx: &Cx<'_>| {
            if cx.stopping() || e2.fetch_add(1, Ordering::AcqRel) >= 100 {
                Action::Exit
            } else {
                Action::Block
            }
        };
        let id = ex
            .spawner()
            .spawn(&TaskSpec::new("blocks"), Box::new(body))
            .unwrap();
        let waker = ex.remote_waker();
        let w2 = waker.clone();
        let e3 = entries.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            while e3.load(Ordering::Acquire) <= 100 && start.elapsed() < Duration::from_secs(20) {
                w2.wake(id);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        t.join().unwrap();
        assert!(
            entries.load(Ordering::Acquire) > 100,
            "{kind}: the remote wakes did not get the task through its blocks ({} entries)",
            entries.load(Ordering::Acquire)
        );
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.failures.is_empty(), "{kind}: {:?}", r.failures);
        waker.wake(id);
    }
}

/// The workers' timer advance (`ExecConfig::timer_advance`): an idle
/// worker learns how late its timed parks return, parks that much ahead of
/// a sleep timer and polls the rest of the way. With it on the polling
/// shows in the report (`timer_spin_ns_per_cpu`), with it off there is
/// none; on or off, no sleep ever ends before its due time.
#[test]
fn timer_advance_polls_ahead_and_never_ends_a_sleep_early() {
    const SLEEPS: u64 = 300;
    for on in [true, false] {
        let topo = Arc::new(topology::load("host").unwrap());
        let cfg = ExecConfig {
            mapping: CpuMapping::Host,
            timer_advance: on,
            ..ExecConfig::default()
        };
        let ex = Executor::start(
            ExecutorKind::Workers,
            topo,
            Mitigations::all(),
            SchedConfig::default(),
            &cfg,
        )
        .unwrap();
        let (done, early) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (d2, e2) = (done.clone(), early.clone());
        let mut due = 0u64;
        ex.spawner()
            .spawn(
                &TaskSpec::new("sleeper").policy(Policy::Fifo(50)),
                Box::new(move |cx: &Cx<'_>| {
                    let now = cx.now();
                    // nothing else wakes it: every run after the first
                    // is a sleep's end
                    if due != 0 && now < due {
                        e2.fetch_add(1, Ordering::Relaxed);
                    }
                    if d2.fetch_add(1, Ordering::Relaxed) + 1 >= SLEEPS {
                        return Action::Exit;
                    }
                    due = now + 500_000;
                    Action::Sleep(500_000)
                }),
            )
            .unwrap();
        assert!(
            wait_until(60, || done.load(Ordering::Relaxed) >= SLEEPS),
            "advance {on}: the sleeps did not all end"
        );
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "advance {on}: {:?}", r.violations);
        assert_eq!(
            early.load(Ordering::Relaxed),
            0,
            "advance {on}: a sleep ended before its due time"
        );
        let spun: u64 = r.timer_spin_ns_per_cpu.iter().sum();
        if on {
            assert!(
                spun > 0,
                "advance on: no worker ever polled ahead of a timer"
            );
        } else {
            assert_eq!(spun, 0, "advance off: a worker polled");
        }
    }
}
