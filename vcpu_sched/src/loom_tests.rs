//! loom model checks of the lock-free parts: the wake list and the idle
//! accounting. Run with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p vcpu_sched --release --lib loom
//! ```
//!
//! (a separate target directory avoids rebuilding the normal build:
//! `CARGO_TARGET_DIR=target-loom`). Models with two threads are explored
//! exhaustively; those with three threads use a preemption bound of 3
//! (every interleaving with at most three preemptions, loom's recommended
//! practice), which keeps the whole set to well under a minute.

fn bounded() -> Builder {
    let mut b = Builder::new();
    b.preemption_bound = Some(3);
    b
}

use loom::model::Builder;
use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::fixes::llcidle::LlcIdleSet;
use crate::idle::IdleTracker;
use crate::topo::TopoMap;
use crate::wakelist::{WakeList, NIL};

/// Two wakers push two tasks each while the owner drains once; every task
/// is drained exactly once, each waker's tasks in its order, and a task
/// left on the list always has a kick pending (the push that found the
/// list empty after the owner's drain raised it).
#[test]
fn loom_wake_list_loses_nothing_and_never_misses_a_kick() {
    bounded().check(|| {
        let links: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(NIL)).collect());
        let list = Arc::new(WakeList::new());
        let kicked = Arc::new(AtomicBool::new(false));
        let pushers: Vec<_> = (0..2u32)
            .map(|p| {
                let (links, list, kicked) = (links.clone(), list.clone(), kicked.clone());
                thread::spawn(move || {
                    for k in 0..2 {
                        let t = p * 2 + k;
                        if list.push(t, &links[t as usize]) {
                            kicked.store(true, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        // the owner: consume the kick, then drain
        kicked.store(false, Ordering::SeqCst);
        let mut seen: Vec<u32> = list.take_all(|t| &links[t as usize]).collect();
        for h in pushers {
            h.join().unwrap();
        }
        if !list.is_empty() {
            assert!(kicked.load(Ordering::SeqCst), "tasks left without a kick");
        }
        seen.extend(list.take_all(|t| &links[t as usize]));
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3], "every task exactly once");
        for p in 0..2u32 {
            let mine: Vec<u32> = seen.iter().copied().filter(|t| t / 2 == p).collect();
            assert_eq!(mine, vec![p * 2, p * 2 + 1], "per-waker order");
        }
    });
}

/// Pushing while the owner drains repeatedly: links are reused safely.
#[test]
fn loom_wake_list_reuses_links() {
    loom::model(|| {
        let links: Arc<Vec<AtomicU32>> = Arc::new((0..2).map(|_| AtomicU32::new(NIL)).collect());
        let list = Arc::new(WakeList::new());
        let (l2, li2) = (list.clone(), links.clone());
        let h = thread::spawn(move || {
            l2.push(0, &li2[0]);
            l2.push(1, &li2[1]);
        });
        let mut n = list.take_all(|t| &links[t as usize]).count();
        n += list.take_all(|t| &links[t as usize]).count();
        h.join().unwrap();
        n += list.take_all(|t| &links[t as usize]).count();
        assert_eq!(n, 2);
        for l in links.iter() {
            assert_eq!(l.load(Ordering::Relaxed), NIL, "drained links are reset");
        }
    });
}

fn map(llcs: u32, per_llc: u32) -> TopoMap {
    use topology::host::{Caches, HostTopology, NodeInfo, RawCpu};
    let raw: Vec<RawCpu> = (0..llcs * per_llc)
        .map(|i| RawCpu {
            os_index: i,
            core: i as u64,
            l2: i as u64,
            llc: (i / per_llc) as u64,
            die: 0,
            node: 0,
            package: 0,
        })
        .collect();
    let nodes = vec![NodeInfo {
        os_index: 0,
        memory: 0,
    }];
    TopoMap::new(&HostTopology::from_raw("loom", &raw, nodes, None, Caches::default()).unwrap())
        .unwrap()
}

/// Two CPUs of one LLC go idle and busy concurrently (one ends idle); the
/// LLC count, its mask and the global count of LLCs with idle CPUs end
/// exact, whatever the interleaving of the 0<->1 transitions.
#[test]
fn loom_llcidle_transitions_end_exact() {
    let m = map(2, 2);
    loom::model(move || {
        let s = Arc::new(LlcIdleSet::new(&m, false));
        let s2 = s.clone();
        let h = thread::spawn(move || {
            s2.enter(0, 0);
            s2.exit(0, 0);
        });
        s.enter(1, 0);
        s.exit(1, 0);
        s.enter(1, 0);
        h.join().unwrap();
        assert_eq!(s.llc_count(0), 1);
        assert_eq!(s.nr_idle_llcs(), 1, "one LLC has an idle CPU");
        assert!(s.any());
        assert!(s.is_idle(1, 0) && !s.is_idle(0, 0));
    });
}

/// The global count is a hint while transitions race: it never claims an
/// idle LLC exists when every CPU has been busy throughout, and once all
/// CPUs are busy again it is exactly zero.
#[test]
fn loom_llcidle_count_returns_to_zero() {
    let m = map(2, 2);
    bounded().check(move || {
        let s = Arc::new(LlcIdleSet::new(&m, false));
        let hs: Vec<_> = [(0u32, 0u32), (1, 0), (2, 1)]
            .into_iter()
            .map(|(cpu, llc)| {
                let s = s.clone();
                thread::spawn(move || {
                    s.enter(cpu, llc);
                    s.exit(cpu, llc);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(s.nr_idle_llcs(), 0);
        assert!(!s.any());
        assert_eq!(s.llc_count(0), 0);
        assert_eq!(s.llc_count(1), 0);
    });
}

/// Single-CPU LLCs collapse to the CPU's bit and the global count; the
/// same exactness holds, for the baseline layout as well.
#[test]
fn loom_single_cpu_llcs_and_baseline() {
    let m = map(2, 1);
    loom::model(move || {
        for per_llc in [true, false] {
            let t = Arc::new(IdleTracker::new(&m, per_llc, false));
            let t2 = t.clone();
            let h = thread::spawn(move || {
                t2.enter(0);
                t2.exit(0);
                t2.enter(0);
            });
            t.enter(1);
            t.exit(1);
            h.join().unwrap();
            assert_eq!(t.check_consistent(), Ok(1));
            assert!(t.any());
        }
    });
}
