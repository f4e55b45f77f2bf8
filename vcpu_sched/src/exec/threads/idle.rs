//! The idle context of a CPU: a thread pinned to the CPU's host CPU that
//! holds the run slot while the CPU is idle, parks until kicked, and then
//! asks the core whether anything should run.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::shared::Shared;
use super::{IDLE, NONE};
use crate::exec::clock::current_tid;
use crate::exec::CPU_OK;
use crate::sched::{Pick, Prev, Scheduler};
use crate::task::CpuId;

pub(super) fn idle_main(sh: Arc<Shared>, sched: Arc<Scheduler>, cpu: CpuId) {
    let slot = &sh.slots[cpu as usize];
    slot.idle_tid.store(current_tid(), Ordering::Release);
    sh.pin_to(slot.host_cpu);
    sh.host_rt(0);
    // The idle context starts holding the slot; run one schedule for any
    // work queued before it started.
    slot.idle_token.store(true, Ordering::Release);
    loop {
        // `idle_parked` is cleared before the token is taken, so the
        // checker never sees this context parked without a token once a
        // kick has landed (see ClockHost::liveness).
        // The token is taken with a swap (acquire): whichever kick or
        // grant it takes, what that one published before its token (need
        // resched, the wake list, the owner) is visible below; a token
        // set after the swap stays for the next round.
        slot.idle_parked.store(true, Ordering::SeqCst);
        while !slot.idle_token.load(Ordering::SeqCst) {
            if sh.idle_stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::park();
        }
        slot.idle_parked.store(false, Ordering::SeqCst);
        slot.idle_token.swap(false, Ordering::AcqRel);
        if sh.idle_stop.load(Ordering::Acquire) {
            return;
        }
        if slot.owner.load(Ordering::SeqCst) != IDLE {
            continue;
        }
        sh.cpu_exec[cpu as usize]
            .idle_wakeups
            .fetch_add(1, Ordering::Relaxed);
        if let Err(other) =
            slot.active
                .compare_exchange(NONE, IDLE, Ordering::AcqRel, Ordering::Acquire)
        {
            sh.violation(format!(
                "the idle context of CPU {cpu} entered while task {other} is inside"
            ));
            continue;
        }
        let t0 = sh.now();
        let pick = sched.schedule(cpu, Prev::Keep, t0).expect(CPU_OK);
        let ce = &sh.cpu_exec[cpu as usize];
        ce.sched_ns.fetch_add(sh.now() - t0, Ordering::Relaxed);
        ce.sched_calls.fetch_add(1, Ordering::Relaxed);
        let _ = slot
            .active
            .compare_exchange(IDLE, NONE, Ordering::AcqRel, Ordering::Relaxed);
        if let Pick::Switch(n) = pick {
            sh.grant(n.0, cpu);
        } else {
            // Still idle: make sure a kick between schedule and here is seen.
            fence(Ordering::SeqCst);
            if sched.needs_attention(cpu).expect(CPU_OK) {
                slot.idle_token.store(true, Ordering::Release);
            }
        }
    }
}
