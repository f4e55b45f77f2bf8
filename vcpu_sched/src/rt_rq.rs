//! The RT part of a per-CPU runqueue: one FIFO list per priority and a
//! bitmap of the non-empty lists, so that the most urgent waiting task is
//! found with two word scans.
//!
//! Only waiting tasks are here; the CPU's current task is not. Protected by
//! the runqueue lock.

use std::collections::VecDeque;

use crate::task::RT_PRIO_MAX;

const LEVELS: usize = RT_PRIO_MAX as usize + 1;

/// Waiting RT tasks of one CPU.
#[derive(Debug)]
pub(crate) struct RtRq {
    bitmap: [u64; 2],
    queues: Vec<VecDeque<u32>>,
    nr: u32,
    /// Waiting tasks that may run on another CPU (candidates for push).
    pub(crate) nr_pushable: u32,
}

impl Default for RtRq {
    fn default() -> Self {
        Self::new()
    }
}

impl RtRq {
    pub(crate) fn new() -> Self {
        Self {
            bitmap: [0; 2],
            queues: (0..LEVELS).map(|_| VecDeque::new()).collect(),
            nr: 0,
            nr_pushable: 0,
        }
    }

    /// Adds `task` at priority `prio` (1..=99), at the tail, or at the head
    /// for a task that was preempted and should resume first.
    pub(crate) fn enqueue(&mut self, task: u32, prio: u8, head: bool) {
        let p = prio as usize;
        debug_assert!((1..LEVELS).contains(&p));
        if head {
            self.queues[p].push_front(task);
        } else {
            self.queues[p].push_back(task);
        }
        self.bitmap[p / 64] |= 1 << (p % 64);
        self.nr += 1;
    }

    /// Removes `task` from priority `prio`; false if it is not there.
    pub(crate) fn dequeue(&mut self, task: u32, prio: u8) -> bool {
        let p = prio as usize;
        let q = &mut self.queues[p];
        let Some(pos) = q.iter().position(|&t| t == task) else {
            return false;
        };
        q.remove(pos);
        if q.is_empty() {
            self.bitmap[p / 64] &= !(1 << (p % 64));
        }
        self.nr -= 1;
        true
    }

    /// The highest priority with a waiting task.
    pub(crate) fn highest(&self) -> Option<u8> {
        if self.bitmap[1] != 0 {
            Some(64 + 63 - self.bitmap[1].leading_zeros() as u8)
        } else if self.bitmap[0] != 0 {
            Some(63 - self.bitmap[0].leading_zeros() as u8)
        } else {
            None
        }
    }

    /// The first task of the highest priority, without removing it.
    pub(crate) fn peek(&self) -> Option<(u32, u8)> {
        let p = self.highest()?;
        Some((*self.queues[p as usize].front()?, p))
    }

    /// Removes and returns the first task of the highest priority.
    #[cfg(all(test, not(loom), not(sim)))]
    pub(crate) fn pop(&mut self) -> Option<(u32, u8)> {
        let (t, p) = self.peek()?;
        self.dequeue(t, p);
        Some((t, p))
    }

    /// Waiting tasks, most urgent first.
    pub(crate) fn iter_by_prio(&self) -> impl Iterator<Item = (u32, u8)> + '_ {
        (1..LEVELS)
            .rev()
            .filter(|&p| self.bitmap[p / 64] & (1 << (p % 64)) != 0)
            .flat_map(move |p| self.queues[p].iter().map(move |&t| (t, p as u8)))
    }

    /// Number of waiting tasks at priority `prio`.
    pub(crate) fn len_at(&self, prio: u8) -> usize {
        self.queues[prio as usize].len()
    }

    /// Number of waiting tasks.
    pub(crate) fn len(&self) -> u32 {
        self.nr
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn empty() {
        let mut q = RtRq::new();
        assert_eq!(q.highest(), None);
        assert_eq!(q.pop(), None);
        assert!(!q.dequeue(3, 50));
        assert_eq!(q.len(), 0);
        assert_eq!(q.iter_by_prio().count(), 0);
    }

    #[test]
    fn prio_99_beats_1_and_fifo_within_a_level() {
        let mut q = RtRq::new();
        q.enqueue(1, 1, false);
        q.enqueue(2, 99, false);
        q.enqueue(3, 99, false);
        q.enqueue(4, 63, false);
        q.enqueue(5, 64, false);
        assert_eq!(q.highest(), Some(99));
        assert_eq!(
            q.iter_by_prio().collect::<Vec<_>>(),
            vec![(2, 99), (3, 99), (5, 64), (4, 63), (1, 1)]
        );
        assert_eq!(q.pop(), Some((2, 99)));
        assert_eq!(q.pop(), Some((3, 99)));
        assert_eq!(q.pop(), Some((5, 64)));
        assert_eq!(q.highest(), Some(63));
        assert_eq!(q.pop(), Some((4, 63)));
        assert_eq!(q.pop(), Some((1, 1)));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn head_insert_and_dequeue_from_middle() {
        let mut q = RtRq::new();
        q.enqueue(1, 10, false);
        q.enqueue(2, 10, false);
        q.enqueue(3, 10, true);
        assert_eq!(q.len_at(10), 3);
        assert_eq!(q.peek(), Some((3, 10)));
        assert!(q.dequeue(1, 10));
        assert!(!q.dequeue(1, 10));
        assert!(!q.dequeue(2, 11), "wrong level");
        assert_eq!(q.len(), 2);
        assert!(q.dequeue(3, 10) && q.dequeue(2, 10));
        assert_eq!(q.highest(), None, "bitmap bit cleared with the last task");
    }
}
