//! The fair part of a per-CPU runqueue: waiting tasks ordered by virtual
//! runtime (CFS-style). Virtual runtime advances by real runtime scaled by
//! `NICE_0_WEIGHT / weight`; the task with the smallest runs next.
//!
//! Only waiting tasks are here; the CPU's current task is not (its virtual
//! runtime lives in the task). Protected by the runqueue lock.

use std::collections::BTreeSet;

use crate::task::NICE_0_WEIGHT;

/// Waiting fair tasks of one CPU.
#[derive(Debug, Default)]
pub(crate) struct FairRq {
    tree: BTreeSet<(u64, u32)>,
    /// Monotonic floor of the virtual runtimes on this CPU; woken and
    /// migrated tasks are placed relative to it.
    pub(crate) min_vruntime: u64,
    /// Sum of the weights of the waiting tasks.
    pub(crate) load: u64,
}

impl FairRq {
    pub(crate) fn enqueue(&mut self, task: u32, vruntime: u64, weight: u32) {
        self.tree.insert((vruntime, task));
        self.load += weight as u64;
    }

    pub(crate) fn dequeue(&mut self, task: u32, vruntime: u64, weight: u32) -> bool {
        let ok = self.tree.remove(&(vruntime, task));
        if ok {
            self.load -= weight as u64;
        }
        ok
    }

    /// The task with the smallest virtual runtime.
    pub(crate) fn first(&self) -> Option<(u64, u32)> {
        self.tree.first().copied()
    }

    /// Waiting tasks, smallest virtual runtime first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.tree.iter().copied()
    }

    /// Waiting tasks, largest virtual runtime first (steal candidates: they
    /// would wait longest here).
    pub(crate) fn iter_rev(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.tree.iter().rev().copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.tree.len()
    }

    /// Raises `min_vruntime` towards the smallest of `curr` (the running
    /// fair task's virtual runtime, if any) and the leftmost waiter. Never
    /// lowers it.
    pub(crate) fn update_min(&mut self, curr: Option<u64>) {
        let left = self.first().map(|(v, _)| v);
        let cand = match (curr, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(c) = cand {
            self.min_vruntime = self.min_vruntime.max(c);
        }
    }
}

/// Virtual runtime earned by running `delta_ns` at `weight`.
#[inline]
pub(crate) fn scale_delta(delta_ns: u64, weight: u32) -> u64 {
    if weight == NICE_0_WEIGHT {
        delta_ns
    } else {
        ((delta_ns as u128 * NICE_0_WEIGHT as u128) / weight.max(1) as u128) as u64
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn orders_by_vruntime_then_id() {
        let mut q = FairRq::default();
        assert_eq!(q.first(), None);
        q.enqueue(7, 300, 1024);
        q.enqueue(3, 100, 2048);
        q.enqueue(5, 100, 512);
        assert_eq!(q.first(), Some((100, 3)));
        assert_eq!(q.load, 1024 + 2048 + 512);
        assert_eq!(q.iter_rev().next(), Some((300, 7)));
        assert!(q.dequeue(3, 100, 2048));
        assert!(!q.dequeue(3, 100, 2048));
        assert_eq!(q.first(), Some((100, 5)));
        assert_eq!(q.len(), 2);
        assert_eq!(q.load, 1536);
    }

    #[test]
    fn min_vruntime_is_monotonic() {
        let mut q = FairRq::default();
        q.update_min(None);
        assert_eq!(q.min_vruntime, 0);
        q.update_min(Some(50));
        assert_eq!(q.min_vruntime, 50);
        q.enqueue(1, 10, 1024);
        q.update_min(Some(70));
        assert_eq!(q.min_vruntime, 50, "never goes back");
        q.dequeue(1, 10, 1024);
        q.enqueue(1, 90, 1024);
        q.update_min(Some(80));
        assert_eq!(q.min_vruntime, 80);
    }

    #[test]
    fn weight_scaling() {
        assert_eq!(scale_delta(1000, 1024), 1000);
        assert_eq!(scale_delta(1000, 2048), 500);
        assert_eq!(scale_delta(1000, 512), 2000);
        assert_eq!(scale_delta(u64::MAX / 2048, 1), (u64::MAX / 2048) * 1024);
    }
}
