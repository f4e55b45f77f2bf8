//! Fix 5: L2-local direct wakeups.
//!
//! WHAT: A waker enqueues a woken task straight into the target CPU's
//! runqueue (taking that runqueue's lock) only when waker and target share
//! an L2. Otherwise it pushes the task onto the target's lock-free wake list
//! ([`crate::wakelist`]) and kicks the target, which enqueues it itself.
//! The baseline makes the same choice on LLC sharing, as Linux did.
//!
//! WHY: On parts whose LLC spans many cores (a whole socket on Intel
//! servers, a 16-CPU CCD on AMD), "shares the LLC" lets wakers from dozens
//! of cores take a remote runqueue lock and dirty its lines; the lock and
//! the runqueue data then bounce between cores, and the target stalls on
//! its own lock. Within an L2 the lines are already shared. The kernel patch
//! measured hackbench 49 s -> 34 s.
//!
//! HOW: [`direct_wakeup_allowed`] is the whole rule. The wake list is an
//! intrusive Treiber stack: one CAS to push, one swap for the target to take
//! everything; a kick is only sent when the list was empty. On a machine
//! whose L2 holds a single core the fix sends every cross-core wakeup
//! through the list; on 2 cores that costs a kick per wakeup and shows as a
//! loss, because there is no lock contention to win back.
//!
//! Kicks of busy CPUs ([`SchedConfig::lazy_fair_kicks`](crate::SchedConfig::lazy_fair_kicks), on in the
//! executors): a kick of a CPU that runs a task is a preemption request,
//! and for a vCPU in `KVM_RUN` that is a VM exit. A fair wakeup that would
//! not preempt the running task gains nothing from it: the waker guesses
//! `check_preempt` without the target's lock (`may_preempt_remote` in
//! `sched/wakeup.rs`), and when the
//! answer is no it pushes the task on the target's *deferred* list and
//! sends nothing. The target takes that list at its next `schedule`, at
//! its body's next entry (`needs_attention`), or at its next tick, which
//! bounds the wait. An idle target is still kicked: the waker fences and
//! re-reads the target's idle flag after the push, and an idle CPU fences
//! and re-reads its lists after setting the flag, so one of the two sees
//! the other. (Linux does the cheaper half of this on bare metal: an IPI
//! to a busy CPU costs little there, so it only avoids queueing remotely
//! when the target is idle; under KVM every kick of a running vCPU is an
//! exit, so the deferral pays.)

use crate::task::CpuId;
use crate::topo::TopoMap;

/// May a waker on `waker` enqueue directly into `target`'s runqueue?
/// Always for the same CPU; then L2 sharing (fix 5) or LLC sharing
/// (baseline).
#[inline]
pub fn direct_wakeup_allowed(map: &TopoMap, l2_rule: bool, waker: CpuId, target: CpuId) -> bool {
    waker == target
        || if l2_rule {
            map.share_l2(waker, target)
        } else {
            map.share_llc(waker, target)
        }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use crate::topo::tests::hand_topo;

    #[test]
    fn rule() {
        let map = TopoMap::new(&hand_topo(2, 2, 2, 2)).unwrap();
        // 4 and 5 share an L2; 4 and 6 share only the LLC; 4 and 8 nothing
        for l2 in [false, true] {
            assert!(direct_wakeup_allowed(&map, l2, 4, 4));
            assert!(direct_wakeup_allowed(&map, l2, 4, 5));
            assert!(!direct_wakeup_allowed(&map, l2, 4, 8));
        }
        assert!(direct_wakeup_allowed(&map, false, 4, 6));
        assert!(!direct_wakeup_allowed(&map, true, 4, 6));
    }
}
