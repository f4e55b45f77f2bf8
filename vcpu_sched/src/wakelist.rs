//! The wake list: a lock-free, intrusive Treiber stack of woken tasks that
//! a remote waker hands to a CPU instead of taking that CPU's runqueue lock.
//!
//! Intrusive: the link lives in the task (one `AtomicU32` per task, indexed
//! by task id), so pushing never allocates. A task is on at most one wake
//! list at a time (it was claimed by exactly one waker), so its link is
//! never shared.
//!
//! Push is a compare-and-swap on the head. The owner CPU takes the whole
//! list with one swap; taking everything at once means a popper never reads
//! a node another popper may have recycled, so there is no ABA problem. The
//! taken chain is in push-reverse order; [`WakeChain`] reverses it so that
//! tasks are enqueued in wake order.
//!
//! Measured in the seeds, a Treiber stack beat a segmented queue here: the
//! list is short and drained in one go, so the stack's single CAS wins.

use crate::sync::{AtomicU32, Ordering};

/// The end of a chain.
pub const NIL: u32 = u32::MAX;

/// A wake list head.
pub struct WakeList {
    head: AtomicU32,
}

impl Default for WakeList {
    fn default() -> Self {
        Self::new()
    }
}

impl WakeList {
    /// An empty list.
    pub fn new() -> Self {
        Self {
            head: AtomicU32::new(NIL),
        }
    }

    /// Pushes `task`, whose link is `link`. Returns true if the list was
    /// empty: only then does the owner need a kick, as an earlier pusher
    /// already sent one that has not been acted on.
    ///
    /// Orderings: the successful CAS acquires what the owner's draining swap
    /// released, so everything the owner did before draining (such as
    /// clearing its "kicked" flag) happens before this pusher's kick; loom
    /// found the kick lost with a release-only CAS and an acquire-only swap.
    #[inline]
    pub fn push(&self, task: u32, link: &AtomicU32) -> bool {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            link.store(head, Ordering::Relaxed);
            match self
                .head
                .compare_exchange_weak(head, task, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return head == NIL,
                Err(h) => head = h,
            }
        }
    }

    /// Takes every queued task, oldest first.
    #[inline]
    pub fn take_all<'a, F>(&self, link: F) -> WakeChain<F>
    where
        F: Fn(u32) -> &'a AtomicU32,
    {
        let mut cur = self.head.swap(NIL, Ordering::AcqRel);
        // Reverse in place, relinking through the tasks' own links: the
        // chain is ours alone now.
        let mut prev = NIL;
        while cur != NIL {
            let l = link(cur);
            let next = l.load(Ordering::Relaxed);
            l.store(prev, Ordering::Relaxed);
            prev = cur;
            cur = next;
        }
        WakeChain { cur: prev, link }
    }

    /// Whether `task` is on this list: a racy walk of at most `limit`
    /// links, for diagnostics only (a concurrent push or drain can hide a
    /// task that is there, never invent one that never was).
    pub fn holds<'a, F>(&self, task: u32, link: F, limit: usize) -> bool
    where
        F: Fn(u32) -> &'a AtomicU32,
    {
        let mut cur = self.head.load(Ordering::Acquire);
        for _ in 0..limit {
            if cur == NIL {
                return false;
            }
            if cur == task {
                return true;
            }
            cur = link(cur).load(Ordering::Acquire);
        }
        false
    }

    /// Is the list empty (a racy hint)?
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) == NIL
    }
}

/// Tasks taken from a wake list, oldest first.
pub struct WakeChain<F> {
    cur: u32,
    link: F,
}

impl<'a, F> Iterator for WakeChain<F>
where
    F: Fn(u32) -> &'a AtomicU32,
{
    type Item = u32;
    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.cur == NIL {
            return None;
        }
        let t = self.cur;
        let l = (self.link)(t);
        self.cur = l.load(Ordering::Relaxed);
        l.store(NIL, Ordering::Relaxed);
        Some(t)
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn links(n: usize) -> Arc<Vec<AtomicU32>> {
        Arc::new((0..n).map(|_| AtomicU32::new(NIL)).collect())
    }

    #[test]
    fn empty_and_fifo_order() {
        let l = links(8);
        let w = WakeList::new();
        assert!(w.is_empty());
        assert_eq!(w.take_all(|t| &l[t as usize]).count(), 0);
        assert!(w.push(3, &l[3]), "first push reports an empty list");
        assert!(!w.push(5, &l[5]));
        assert!(!w.push(0, &l[0]));
        assert!(!w.is_empty());
        let got: Vec<u32> = w.take_all(|t| &l[t as usize]).collect();
        assert_eq!(got, vec![3, 5, 0]);
        assert!(w.is_empty());
        assert!(w.push(5, &l[5]), "links are reusable after a drain");
        assert_eq!(w.take_all(|t| &l[t as usize]).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn concurrent_pushers_and_drainer_lose_nothing() {
        const PER: u32 = 20_000;
        const PUSHERS: u32 = 3;
        let l = links((PER * PUSHERS) as usize);
        let w = Arc::new(WakeList::new());
        let hs: Vec<_> = (0..PUSHERS)
            .map(|p| {
                let (w, l) = (w.clone(), l.clone());
                std::thread::spawn(move || {
                    for i in 0..PER {
                        let t = p * PER + i;
                        w.push(t, &l[t as usize]);
                    }
                })
            })
            .collect();
        let mut seen = vec![false; (PER * PUSHERS) as usize];
        let mut last = [None::<u32>; PUSHERS as usize];
        let mut n = 0;
        while n < PER * PUSHERS {
            for t in w.take_all(|t| &l[t as usize]) {
                assert!(!seen[t as usize], "task {t} drained twice");
                seen[t as usize] = true;
                let p = (t / PER) as usize;
                assert!(last[p].is_none_or(|x| x < t), "per-pusher order kept");
                last[p] = Some(t);
                n += 1;
            }
        }
        for h in hs {
            h.join().unwrap();
        }
        assert!(w.is_empty());
    }
}
