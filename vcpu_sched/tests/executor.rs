//! The threads executor on real threads: handover, preemption, timers,
//! emulated topologies, and its own checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vcpu_sched::exec::*;
use vcpu_sched::*;

fn exec(spec: &str, mit: Mitigations, check: bool) -> ThreadsExecutor {
    let topo = Arc::new(topology::load(spec).unwrap());
    let cfg = ExecConfig {
        mapping: CpuMapping::emulated_on_allowed().unwrap(),
        check: check.then(CheckConfig::default),
        ..ExecConfig::default()
    };
    ThreadsExecutor::new(topo, mit, SchedConfig::default(), cfg, Arc::new(FlagKick)).unwrap()
}

#[test]
fn ping_pong_hands_the_slot_back_and_forth() {
    for mit in [Mitigations::none(), Mitigations::all()] {
        let ex = exec("package:1 l3:1 l2:2 core:1 pu:1", mit, true);
        let count = Arc::new(AtomicU64::new(0));
        let peer = Arc::new(AtomicU64::new(u64::MAX));
        let mut ids = Vec::new();
        for i in 0..2 {
            let (count, peer) = (count.clone(), peer.clone());
            let id = ex
                .spawn(&TaskSpec::new(format!("p{i}")), move |ctx| {
                    // wait until both exist
                    while peer.load(Ordering::Acquire) == u64::MAX && !ctx.stopping() {
                        ctx.yield_now();
                    }
                    let other = TaskId((peer.load(Ordering::Acquire) >> (32 * (1 - i))) as u32);
                    for _ in 0..2000 {
                        if ctx.stopping() {
                            break;
                        }
                        count.fetch_add(1, Ordering::Relaxed);
                        ctx.wake(other);
                        ctx.block();
                    }
                    ctx.wake(other);
                })
                .unwrap();
            ids.push(id);
        }
        peer.store(
            ((ids[1].0 as u64) << 32) | ids[0].0 as u64,
            Ordering::Release,
        );
        let start = std::time::Instant::now();
        while ex.live_tasks() > 0 && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ex.live_tasks(), 0, "{mit}: the ping-pong finished");
        let r = ex.shutdown(Duration::from_secs(10)).unwrap();
        assert!(r.violations.is_empty(), "{mit}: {:?}", r.violations);
        assert_eq!(count.load(Ordering::Relaxed), 4000);
        assert!(r.counters.switches > 1000, "{mit}: {:?}", r.counters);
        assert_eq!(r.tasks.len(), 2);
    }
}

#[test]
fn rt_task_preempts_a_spinning_fair_task() {
    let ex = exec("package:1 l3:1 l2:1 core:1 pu:1", Mitigations::all(), true);
    let spins = Arc::new(AtomicU64::new(0));
    let s2 = spins.clone();
    ex.spawn(&TaskSpec::new("hog"), move |ctx| {
        while !ctx.stopping() {
            s2.fetch_add(1, Ordering::Relaxed);
            ctx.compute_for(100_000);
        }
    })
    .unwrap();
    let lat = Arc::new(AtomicU64::new(0));
    let l2 = lat.clone();
    let rt = ex
        .spawn(&TaskSpec::new("rt").policy(Policy::Fifo(50)), move |ctx| {
            let mut next = ctx.now();
            for _ in 0..50 {
                next += 2_000_000;
                ctx.sleep_until(next);
                l2.fetch_max(ctx.now().saturating_sub(next), Ordering::Relaxed);
            }
        })
        .unwrap();
    let start = std::time::Instant::now();
    while ex.live_tasks() > 1 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        ex.live_tasks(),
        1,
        "the RT task ran all its periods despite the hog"
    );
    let _ = rt;
    let r = ex.shutdown(Duration::from_secs(10)).unwrap();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(spins.load(Ordering::Relaxed) > 0, "the hog ran too");
    let rt_stats = r.tasks.iter().find(|t| t.name == "rt").unwrap();
    let hog = r.tasks.iter().find(|t| t.name == "hog").unwrap();
    // (A period whose deadline had passed before the task slept again
    // needs no wakeup, so counts are not exactly 50 on a loaded host.)
    assert!(rt_stats.wakeups > 0 && rt_stats.runs > 1, "{rt_stats:?}");
    // timer wakeups come from outside the managed CPUs: the wake list
    assert!(
        r.counters.wake_queued >= rt_stats.wakeups,
        "{:?}",
        r.counters
    );
    // on the single CPU, the RT task only ever ran by preempting the hog
    assert!(hog.preemptions + 1 >= rt_stats.runs, "{hog:?} {rt_stats:?}");
}

#[test]
fn emulated_genoa_runs_hundreds_of_tasks() {
    let ex = exec("genoa-2s", Mitigations::all(), true);
    assert_eq!(ex.scheduler().num_cpus(), 384);
    let done = Arc::new(AtomicU64::new(0));
    for i in 0..400u32 {
        let d = done.clone();
        let pol = if i % 4 == 0 {
            Policy::Fifo((i % 90 + 1) as u8)
        } else {
            Policy::default()
        };
        ex.spawn(&TaskSpec::new(format!("t{i}")).policy(pol), move |ctx| {
            for k in 0..20u64 {
                ctx.sleep_until(ctx.now() + 200_000 + (k * 7919 % 300_000));
                ctx.compute_for(20_000);
            }
            d.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    }
    let start = std::time::Instant::now();
    while ex.live_tasks() > 0 && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(done.load(Ordering::Relaxed), 400);
    let r = ex.shutdown(Duration::from_secs(10)).unwrap();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.checks > 0);
    assert_eq!(r.tasks.len(), 400);
}

/// `host_rt` puts task threads at host SCHED_FIFO at that priority. Where
/// the process may not (no CAP_SYS_NICE, no RT rlimit) they stay
/// SCHED_OTHER, and the run still completes.
#[test]
fn host_rt_runs_task_threads_at_host_sched_fifo() {
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
    let topo = Arc::new(topology::load("package:1 l3:1 l2:1 core:1 pu:1").unwrap());
    let cfg = ExecConfig {
        mapping: CpuMapping::emulated_on_allowed().unwrap(),
        host_rt: Some(3),
        ..ExecConfig::default()
    };
    let ex = ThreadsExecutor::new(
        topo,
        Mitigations::all(),
        SchedConfig::default(),
        cfg,
        Arc::new(FlagKick),
    )
    .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s2 = seen.clone();
    ex.spawn(&TaskSpec::new("t"), move |_| {
        *s2.lock().unwrap() = Some(policy_of_this_thread());
    })
    .unwrap();
    let start = std::time::Instant::now();
    while ex.live_tasks() > 0 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = ex.shutdown(Duration::from_secs(10)).unwrap();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let got = seen.lock().unwrap().expect("the task ran");
    if permitted {
        assert_eq!(got, (libc::SCHED_FIFO, 3));
    } else {
        assert_eq!(got.0, libc::SCHED_OTHER);
    }
}

/// What the checker is told about a CPU: an idle CPU's context sleeps
/// unkicked; a CPU whose task computes is runnable, and its host CPU time
/// grows while it runs.
#[test]
fn liveness_tells_a_sleeping_cpu_from_a_working_one() {
    let ex = exec("package:1 l3:1 l2:2 core:1 pu:1", Mitigations::all(), false);
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait_for("CPU 1 idles parked", &|| ex.liveness(1) == Liveness::Parked);
    let go = Arc::new(AtomicU64::new(1));
    let g2 = go.clone();
    let t = ex
        .spawn(
            &TaskSpec::new("spin").affinity(CpuMask::single(1)),
            move |ctx| {
                while g2.load(Ordering::Relaxed) == 1 && !ctx.stopping() {
                    ctx.compute_for(1_000_000);
                }
            },
        )
        .unwrap();
    wait_for("the task runs on CPU 1", &|| {
        ex.scheduler().current(1).unwrap() == Some(t)
    });
    let cpu_ns = || match ex.liveness(1) {
        Liveness::Runnable { cpu_ns } => Some(cpu_ns),
        _ => None,
    };
    if thread_cpu_ns(current_tid()).is_some() {
        let a = cpu_ns().unwrap_or_else(|| panic!("not runnable: {:?}", ex.liveness(1)));
        wait_for("its host CPU time grows", &|| cpu_ns().unwrap_or(0) > a);
    } else {
        // a kernel without schedstat: the executor cannot tell
        assert_eq!(ex.liveness(1), Liveness::Unknown);
    }
    go.store(0, Ordering::Relaxed);
    let r = ex.shutdown(Duration::from_secs(10)).unwrap();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}
