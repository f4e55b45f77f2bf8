//! How the interleaved simulator hands control between simulated CPUs:
//! the cost of one hand-off there and back, with a stackful coroutine
//! (corosensei, what `vmm sim --interleave` uses) and with two OS threads
//! taking turns (the deterministic hand-off loom and shuttle use, here
//! with `std`'s thread park/unpark). Every shared access of an
//! interleaved core call is one such round trip, so this decides the
//! simulator's speed (docs/simulator.md, "Interleaving").
//!
//! `cargo bench -p benches --bench handoff`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use corosensei::{Coroutine, CoroutineResult};
use criterion::{criterion_group, criterion_main, Criterion};

fn coroutine(c: &mut Criterion) {
    let mut co: Coroutine<(), (), ()> = Coroutine::new(|y, ()| loop {
        y.suspend(());
    });
    c.bench_function("handoff/coroutine_round_trip", |b| {
        b.iter(|| match co.resume(()) {
            CoroutineResult::Yield(()) => {}
            CoroutineResult::Return(()) => unreachable!("the coroutine loops"),
        })
    });
}

/// Two threads taking turns: the bench thread unparks the other and
/// parks until it is handed control back.
fn threads(c: &mut Criterion) {
    let turn = Arc::new(AtomicBool::new(false)); // true: the other's turn
    let stop = Arc::new(AtomicBool::new(false));
    let me = thread::current();
    let (t2, s2) = (turn.clone(), stop.clone());
    let other = thread::spawn(move || loop {
        while !t2.load(Ordering::Acquire) {
            if s2.load(Ordering::Acquire) {
                return;
            }
            thread::park();
        }
        t2.store(false, Ordering::Release);
        me.unpark();
    });
    let ot = other.thread().clone();
    c.bench_function("handoff/os_threads_round_trip", |b| {
        b.iter(|| {
            turn.store(true, Ordering::Release);
            ot.unpark();
            while turn.load(Ordering::Acquire) {
                thread::park();
            }
        })
    });
    stop.store(true, Ordering::Release);
    ot.unpark();
    other.join().expect("the other thread ends");
}

criterion_group!(benches, coroutine, threads);
criterion_main!(benches);
