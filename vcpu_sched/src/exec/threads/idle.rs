//! The idle context of a CPU: a thread pinned to the CPU's host CPU that
//! holds the run slot while the CPU is idle, parks until kicked, and then
//! asks the core whether anything should run.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::handover::Shared;
use crate::exec::clock::current_tid;
use crate::exec::shared::{IDLE, NONE};
use crate::exec::CPU_OK;
use crate::sched::{Pick, Prev, Scheduler};
use crate::task::CpuId;

pub(super) fn idle_main(sh: Arc<Shared>, sched: Arc<Scheduler>, cpu: CpuId) {
    let core = &sh.core;
    let slot = &core.slots[cpu as usize];
    slot.tid.store(current_tid(), Ordering::Release);
    core.pin_to(slot.host_cpu);
    core.host_rt(0);
    // The idle context starts holding the slot; run one schedule for any
    // work queued before it started.
    slot.token.store(true, Ordering::Release);
    loop {
        // `parked` is cleared before the token is taken, so the checker
        // never sees this context parked without a token once a kick has
        // landed (see ExecCore's liveness).
        slot.parked.store(true, Ordering::SeqCst);
        while !slot.token.load(Ordering::SeqCst) {
            if core.quit.load(Ordering::Acquire) {
                return;
            }
            std::thread::park();
        }
        slot.parked.store(false, Ordering::SeqCst);
        slot.take_token();
        if core.quit.load(Ordering::Acquire) {
            return;
        }
        if slot.owner.load(Ordering::SeqCst) != IDLE {
            continue;
        }
        core.counters[cpu as usize]
            .idle_wakeups
            .fetch_add(1, Ordering::Relaxed);
        if let Err(other) = sh.active[cpu as usize].compare_exchange(
            NONE,
            IDLE,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            core.violation(format!(
                "the idle context of CPU {cpu} entered while task {other} is inside"
            ));
            continue;
        }
        let t0 = core.now();
        let pick = sched.schedule(cpu, Prev::Keep, t0).expect(CPU_OK);
        let c = &core.counters[cpu as usize];
        c.sched_ns.fetch_add(core.now() - t0, Ordering::Relaxed);
        c.sched_calls.fetch_add(1, Ordering::Relaxed);
        let _ = sh.active[cpu as usize].compare_exchange(
            IDLE,
            NONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        if let Pick::Switch(n) = pick {
            sh.grant(n.0, cpu);
        } else {
            // Still idle: make sure a kick between schedule and here is seen.
            fence(Ordering::SeqCst);
            if sched.needs_attention(cpu).expect(CPU_OK) {
                slot.token.store(true, Ordering::Release);
            }
        }
    }
}
