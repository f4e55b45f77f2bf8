//! The simulator's event queue.
//!
//! Every event is one `u128` key: (virtual ns, sequence number, event), so
//! that one comparison orders events by time, then by push order. A CPU
//! has at most one live burst end (the task running on it), and in the
//! messaging workload almost every event is one: a task finishes a step,
//! its pipe is ready, it starts the next. Those live in a winner tree over
//! the CPUs (each inner node holds the smaller key of its two children),
//! whose update walks a fixed path from leaf to root: the addresses are
//! known before any comparison, so the loads overlap, where a binary
//! heap's sift-down waits on each level's comparison to find the next.
//! The tree compares 64-bit keys (see [`Queue`]), with no branch to
//! mispredict. Everything else (kicks, ticks, timers, checks, steps) goes
//! to a binary heap; popping takes the smaller of the two tops, so the
//! order is exactly the keys' order. A new burst end of a CPU replaces its old one, which the
//! simulator would have dropped as stale anyway.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ev {
    BurstEnd {
        cpu: u32,
    },
    Kick {
        cpu: u32,
    },
    Tick {
        cpu: u32,
    },
    Timer {
        task: u32,
    },
    Check,
    /// A CPU's next wakeup of a sequence (see `Sim::step`).
    Step {
        cpu: u32,
    },
    /// An interleaved call's next move (see `interleave`).
    Call {
        slot: u32,
    },
    /// A contended line is free: its arbitration picks the next owner
    /// (see `interleave`).
    Grant {
        idx: u32,
    },
}

/// Bits of an event's CPU or task number in its queue key.
pub(super) const EV_IDX_BITS: u32 = 24;
/// Bits of the sequence number in an event's queue key.
pub(super) const EV_SEQ_BITS: u32 = 59;
/// Where a key's time starts.
pub(super) const EV_TIME_SHIFT: u32 = EV_SEQ_BITS + EV_IDX_BITS + 3;
/// Virtual time fits the key's top 42 bits (73 minutes).
pub(super) const EV_T_MAX: u64 = (1 << (128 - EV_TIME_SHIFT)) - 1;

impl Ev {
    /// The queue's key: (time, sequence number, event) packed in one
    /// u128, so that the heap orders events by time, then by push order,
    /// with one comparison, and moves 16 bytes instead of 32.
    pub(super) fn key(self, t: u64, seq: u64) -> u128 {
        let (kind, idx) = match self {
            Ev::BurstEnd { cpu } => (0, cpu),
            Ev::Kick { cpu } => (1, cpu),
            Ev::Tick { cpu } => (2, cpu),
            Ev::Timer { task } => (3, task),
            Ev::Check => (4, 0),
            Ev::Step { cpu } => (5, cpu),
            Ev::Call { slot } => (6, slot),
            Ev::Grant { idx } => (7, idx),
        };
        debug_assert!(idx < 1 << EV_IDX_BITS && seq < 1 << EV_SEQ_BITS);
        ((t.min(EV_T_MAX) as u128) << EV_TIME_SHIFT)
            | ((seq as u128) << (EV_IDX_BITS + 3))
            | ((idx as u128) << 3)
            | kind
    }

    /// (time, sequence number, event) of a key.
    pub(super) fn unkey(k: u128) -> (u64, u64, Ev) {
        let t = (k >> EV_TIME_SHIFT) as u64;
        let seq = ((k >> (EV_IDX_BITS + 3)) & ((1 << EV_SEQ_BITS) - 1)) as u64;
        let idx = ((k >> 3) & ((1 << EV_IDX_BITS) - 1)) as u32;
        let ev = match k & 7 {
            0 => Ev::BurstEnd { cpu: idx },
            1 => Ev::Kick { cpu: idx },
            2 => Ev::Tick { cpu: idx },
            3 => Ev::Timer { task: idx },
            5 => Ev::Step { cpu: idx },
            6 => Ev::Call { slot: idx },
            7 => Ev::Grant { idx },
            _ => Ev::Check,
        };
        (t, seq, ev)
    }
}

/// An empty leaf: after every real key.
const NONE: u64 = u64::MAX;

/// A winner tree of keys, one live key per index (a CPU's burst end, an
/// interleaved call's next move): pushing an index's key replaces its
/// previous one.
///
/// The tree compares `u64`s, not the full keys: a leaf's tree key is its
/// time above a rank, a counter of pushes into the tree, so that among
/// equal times the earlier push wins, as the full key's sequence number
/// would have it. When the counter runs out, the live leaves are ranked
/// anew in their order. (A `u128` minimum compiles to a branch that
/// mispredicts on every other level; a `u64` one to a conditional move.)
struct Tree {
    /// Node 1 is the root, node j's children are 2j and 2j+1, index c's
    /// leaf is `leaves + c`; empty leaves hold [`NONE`].
    tree: Vec<u64>,
    leaves: usize,
    /// Each index's full key ([`u128::MAX`] when empty).
    full: Vec<u128>,
    /// The index that holds each rank.
    owner: Vec<u32>,
    /// The next rank to give.
    next_rank: u64,
    rank_bits: u32,
    /// The index whose key was popped last: its leaf still holds it
    /// until the next pop, unless a new key replaced it first (the usual
    /// case for a CPU's burst ends, which then costs one walk up the tree
    /// instead of two).
    popped: Option<usize>,
}

impl Tree {
    fn new(n: usize) -> Self {
        let leaves = n.max(1).next_power_of_two();
        // room for every index and many pushes between renumberings
        let rank_bits = (leaves.trailing_zeros() + 4).max(16);
        assert!(
            rank_bits + (128 - EV_TIME_SHIFT) <= 64,
            "{n} CPUs: too many for the event queue"
        );
        Self {
            tree: vec![NONE; 2 * leaves],
            leaves,
            full: vec![u128::MAX; leaves],
            owner: vec![0; 1 << rank_bits],
            next_rank: 0,
            rank_bits,
            popped: None,
        }
    }

    fn push(&mut self, c: usize, key: u128) {
        if self.popped == Some(c) {
            self.popped = None;
        }
        if self.next_rank == 1 << self.rank_bits {
            self.rerank();
        }
        let r = self.next_rank;
        self.next_rank += 1;
        self.owner[r as usize] = c as u32;
        self.full[c] = key;
        let t = (key >> EV_TIME_SHIFT) as u64;
        self.set(c, (t << self.rank_bits) | r);
    }

    /// Drops the key popped last unless it was replaced.
    fn forget_popped(&mut self) {
        if let Some(c) = self.popped.take() {
            self.full[c] = u128::MAX;
            self.set(c, NONE);
        }
    }

    /// The smallest live key and its index ([`u128::MAX`] when none).
    fn top(&self) -> (usize, u128) {
        let root = self.tree[1];
        if root == NONE {
            return (0, u128::MAX);
        }
        let c = self.owner[(root & ((1 << self.rank_bits) - 1)) as usize] as usize;
        (c, self.full[c])
    }

    /// Sets leaf `c`'s tree key and the minima above it.
    fn set(&mut self, c: usize, key: u64) {
        let mut j = self.leaves + c;
        self.tree[j] = key;
        let mut v = key;
        while j > 1 {
            v = v.min(self.tree[j ^ 1]);
            j >>= 1;
            self.tree[j] = v;
        }
    }

    /// Ranks the live leaves 0, 1, .. in their order and rebuilds the tree.
    fn rerank(&mut self) {
        let mut live: Vec<(u64, usize)> = (0..self.leaves)
            .filter(|&c| self.tree[self.leaves + c] != NONE)
            .map(|c| (self.tree[self.leaves + c], c))
            .collect();
        live.sort_unstable();
        let mask = (1u64 << self.rank_bits) - 1;
        for (r, &(k, c)) in live.iter().enumerate() {
            self.owner[r] = c as u32;
            self.tree[self.leaves + c] = (k & !mask) | r as u64;
        }
        self.next_rank = live.len() as u64;
        for j in (1..self.leaves).rev() {
            self.tree[j] = self.tree[2 * j].min(self.tree[2 * j + 1]);
        }
    }
}

/// The event queue: a winner tree of per-CPU burst ends and one of
/// interleaved calls' next moves, beside a heap for everything else.
/// Popping takes the smallest of the three tops, so the order is exactly
/// the keys' order.
pub(super) struct Queue {
    heap: BinaryHeap<Reverse<u128>>,
    bursts: Tree,
    /// Calls in flight number at most one per CPU plus the timers' wakes
    /// under way; a slot beyond the tree's leaves goes to the heap.
    calls: Tree,
}

impl Queue {
    /// A queue for `cpus` CPUs.
    pub(super) fn new(cpus: usize) -> Self {
        Self {
            heap: BinaryHeap::new(),
            bursts: Tree::new(cpus),
            calls: Tree::new(2 * cpus),
        }
    }

    /// Queues `key`.
    pub(super) fn push(&mut self, key: u128) {
        match Ev::unkey(key).2 {
            Ev::BurstEnd { cpu } => self.bursts.push(cpu as usize, key),
            Ev::Call { slot } if (slot as usize) < self.calls.leaves => {
                self.calls.push(slot as usize, key)
            }
            _ => self.heap.push(Reverse(key)),
        }
    }

    /// Takes the smallest key.
    pub(super) fn pop(&mut self) -> Option<u128> {
        self.bursts.forget_popped();
        self.calls.forget_popped();
        let (b, bk) = self.bursts.top();
        let (c, ck) = self.calls.top();
        let hk = self.heap.peek().map_or(u128::MAX, |&Reverse(h)| h);
        if hk < bk && hk < ck {
            return self.heap.pop().map(|Reverse(k)| k);
        }
        if bk == u128::MAX && ck == u128::MAX {
            return None;
        }
        if bk < ck {
            self.bursts.popped = Some(b);
            Some(bk)
        } else {
            self.calls.popped = Some(c);
            Some(ck)
        }
    }

    /// The time of the earliest event queued (`u64::MAX` when none): an
    /// event pushed at an earlier time would be popped next.
    pub(super) fn min_time(&mut self) -> u64 {
        self.bursts.forget_popped();
        self.calls.forget_popped();
        let t = |k: u128| {
            if k == u128::MAX {
                u64::MAX
            } else {
                (k >> EV_TIME_SHIFT) as u64
            }
        };
        let hk = self.heap.peek().map_or(u128::MAX, |&Reverse(h)| h);
        t(self.bursts.top().1.min(self.calls.top().1).min(hk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The queue pops exactly what a plain heap pops, given that a CPU's
    /// newer burst end replaces its older one (the simulator's stale
    /// events are left out of the reference), and a call slot has one
    /// event at a time (slots past the call tree's leaves go to the
    /// heap); `min_time` is the reference's first time.
    #[test]
    fn pops_in_key_order_like_a_heap() {
        let mut rng = Rng::new(7);
        let mut q = Queue::new(5);
        // rank anew every few pushes, as a long run does
        q.bursts.rank_bits = 4;
        q.bursts.owner.truncate(16);
        // reference: live keys, and each CPU's live burst end
        let mut live: std::collections::BTreeSet<u128> = Default::default();
        let mut burst: [Option<u128>; 5] = [None; 5];
        let mut call = [false; 24];
        let (mut now, mut seq) = (0u64, 0u64);
        for _ in 0..40_000 {
            let want_min = live.first().map_or(u64::MAX, |&k| Ev::unkey(k).0);
            assert_eq!(q.min_time(), want_min);
            if rng.below(2) > 0 {
                seq += 1;
                // few distinct times: many ties, which push order breaks
                let t = now + rng.below(4);
                let c = rng.below(5) as u32;
                let slot = rng.below(24) as u32;
                let ev = match rng.below(8) {
                    0..=3 => Ev::BurstEnd { cpu: c },
                    4 => Ev::Kick { cpu: c },
                    5 if !call[slot as usize] => {
                        call[slot as usize] = true;
                        Ev::Call { slot }
                    }
                    _ => Ev::Timer { task: c + 100 },
                };
                let k = ev.key(t, seq);
                if let Ev::BurstEnd { cpu } = ev {
                    if let Some(old) = burst[cpu as usize].replace(k) {
                        live.remove(&old);
                    }
                }
                live.insert(k);
                q.push(k);
            } else {
                let want = live.pop_first();
                assert_eq!(q.pop(), want);
                if let Some(k) = want {
                    let (t, _, ev) = Ev::unkey(k);
                    now = t;
                    match ev {
                        Ev::BurstEnd { cpu } => burst[cpu as usize] = None,
                        Ev::Call { slot } => call[slot as usize] = false,
                        _ => {}
                    }
                }
            }
        }
        while let Some(k) = live.pop_first() {
            assert_eq!(q.pop(), Some(k));
        }
        assert_eq!(q.pop(), None);
    }
}
