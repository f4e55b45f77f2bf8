//! Per-LLC shared runqueues: a FIFO of runnable fair tasks per LLC that an
//! idle CPU pops from before it goes idle, so that work queued behind a busy
//! CPU spreads to an idle sibling cache-locally and at once (the idea of
//! Linux's SHARED_RUNQ proposal).
//!
//! Entries are hints. A task is pushed when a wakeup leaves it waiting on a
//! busy CPU, and is not removed when that CPU runs it; the popper checks
//! that the task is still waiting (and may run here) before it migrates it,
//! and drops stale entries. A per-task flag keeps at most one entry per
//! task, so a queue never holds more entries than there are tasks.
//!
//! The baseline has one queue (one lock) per LLC; fix 3
//! ([`crate::fixes::shardrq`]) splits it into shards.

use crate::sync::shared::Mutex;
use crate::sync::shared::{AtomicU32, Ordering};
use std::collections::VecDeque;

pub use crate::fixes::shardrq::shard_layout;
use crate::task::CpuId;
use crate::topo::TopoMap;

/// One queue with its lock, alone on its cache lines. `len` lets a popper
/// skip an empty shard without taking the lock.
#[repr(align(128))]
pub struct Shard {
    pub(crate) len: AtomicU32,
    pub(crate) q: Mutex<VecDeque<u32>>,
}

impl Shard {
    fn new() -> Self {
        Self {
            len: AtomicU32::new(0),
            q: Mutex::new(VecDeque::new()),
        }
    }
}

/// All shared runqueues of a machine.
pub struct SharedRq {
    pub(crate) shards: Box<[Shard]>,
    /// Global shard index of each CPU's own shard.
    cpu_shard: Box<[u32]>,
    /// First global shard index of each LLC, and how many it has.
    llc_first: Box<[u32]>,
    llc_nshards: Box<[u32]>,
    cpu_llc: Box<[u32]>,
}

impl SharedRq {
    /// One shard per LLC (baseline), or shards of `shard_size` CPUs (fix 3).
    pub fn new(map: &TopoMap, sharded: bool, shard_size: usize) -> Self {
        let mut cpu_shard = vec![0u32; map.ncpus()];
        let mut llc_first = Vec::with_capacity(map.nllcs());
        let mut llc_nshards = Vec::with_capacity(map.nllcs());
        let mut total = 0u32;
        for llc in 0..map.nllcs() as u32 {
            let cpus = map.llc_cpus(llc);
            let size = if sharded { shard_size } else { usize::MAX };
            let (n, of) = shard_layout(cpus.len(), size);
            llc_first.push(total);
            llc_nshards.push(n as u32);
            for (i, &c) in cpus.iter().enumerate() {
                cpu_shard[c as usize] = total + of(i) as u32;
            }
            total += n as u32;
        }
        Self {
            shards: (0..total).map(|_| Shard::new()).collect(),
            cpu_shard: cpu_shard.into(),
            llc_first: llc_first.into(),
            llc_nshards: llc_nshards.into(),
            cpu_llc: (0..map.ncpus() as u32).map(|c| map.llc_of(c)).collect(),
        }
    }

    /// Queues `task`, which waits on `cpu`, in `cpu`'s own shard.
    pub fn push(&self, cpu: CpuId, task: u32) {
        let s = &self.shards[self.cpu_shard[cpu as usize] as usize];
        let mut q = s.q.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(task);
        s.len.store(q.len() as u32, Ordering::Relaxed);
    }

    /// Pops the oldest entry for `cpu`, trying its own shard first and then
    /// the other shards of its LLC in turn. Empty shards are skipped
    /// without locking.
    pub fn pop(&self, cpu: CpuId) -> Option<u32> {
        let llc = self.cpu_llc[cpu as usize] as usize;
        let first = self.llc_first[llc];
        let n = self.llc_nshards[llc];
        let own = self.cpu_shard[cpu as usize] - first;
        for k in 0..n {
            let s = &self.shards[(first + (own + k) % n) as usize];
            if s.len.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut q = s.q.lock().unwrap_or_else(|e| e.into_inner());
            let t = q.pop_front();
            s.len.store(q.len() as u32, Ordering::Relaxed);
            if t.is_some() {
                return t;
            }
        }
        None
    }

    /// Number of shards of LLC `llc`.
    pub fn shards_of_llc(&self, llc: u32) -> usize {
        self.llc_nshards[llc as usize] as usize
    }

    /// The global shard index of `cpu`'s own shard.
    pub fn shard_of(&self, cpu: CpuId) -> usize {
        self.cpu_shard[cpu as usize] as usize
    }

    /// Entries (live or stale) queued in LLC `llc`.
    pub fn len_llc(&self, llc: u32) -> usize {
        let (a, n) = (self.llc_first[llc as usize], self.llc_nshards[llc as usize]);
        (a..a + n)
            .map(|i| self.shards[i as usize].len.load(Ordering::Relaxed) as usize)
            .sum()
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;
    use crate::topo::tests::hand_topo;

    #[test]
    fn baseline_is_one_fifo_per_llc() {
        let map = TopoMap::new(&hand_topo(1, 2, 4, 2)).unwrap(); // 2 LLCs of 8
        let s = SharedRq::new(&map, false, 6);
        assert_eq!(s.shards_of_llc(0), 1);
        assert_eq!(s.pop(0), None, "empty LLC");
        s.push(1, 10);
        s.push(7, 11);
        s.push(8, 20);
        assert_eq!(s.len_llc(0), 2);
        assert_eq!(s.pop(5), Some(10));
        assert_eq!(s.pop(5), Some(11));
        assert_eq!(s.pop(5), None, "never crosses LLCs");
        assert_eq!(s.pop(9), Some(20));
    }

    #[test]
    fn shards_push_local_pop_own_first_then_others() {
        let map = TopoMap::new(&hand_topo(1, 1, 8, 2)).unwrap(); // 1 LLC of 16
        let s = SharedRq::new(&map, true, 6);
        assert_eq!(s.shards_of_llc(0), 3, "16 CPUs in shards of 6: 6+6+4");
        assert_eq!(s.shard_of(0), s.shard_of(5));
        assert_ne!(s.shard_of(5), s.shard_of(6));
        assert_eq!(s.shard_of(15), 2);
        s.push(0, 1); // shard 0
        s.push(7, 2); // shard 1
        s.push(13, 3); // shard 2
        assert_eq!(s.pop(8), Some(2), "own shard first");
        assert_eq!(s.pop(8), Some(3), "then the next one");
        assert_eq!(s.pop(8), Some(1), "wrapping around");
        assert_eq!(s.pop(8), None);
    }

    #[test]
    fn small_llc_collapses_to_one_shard() {
        let map = TopoMap::new(&hand_topo(1, 1, 1, 2)).unwrap();
        let s = SharedRq::new(&map, true, 6);
        assert_eq!(s.shards_of_llc(0), 1);
        let m1 = TopoMap::new(&hand_topo(1, 4, 1, 1)).unwrap(); // single-CPU LLCs
        let s1 = SharedRq::new(&m1, true, 6);
        for l in 0..4 {
            assert_eq!(s1.shards_of_llc(l), 1);
        }
    }
}
