//! The memory cost model: per-line coherence state, transfer latencies by
//! topology distance, serialized transfers of one line, and locks that
//! spin in virtual time.
//!
//! A line is held by one owner (modified/exclusive) or by a set of sharers.
//! A hit costs an L1 hit. A miss costs the transfer latency from the
//! nearest holder at their topology distance; a store or RMW by a sharer
//! also pays for invalidating the farthest other sharer. A line is busy
//! until its last transfer completes, so N CPUs hammering one line queue
//! behind one another: contention collapse comes from that queue, not from
//! a constant. Ideas from the MESI protocol and from Boyd-Wickizer et al.,
//! "Non-scalable locks are dangerous" (Linux Symposium 2012); no code.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use topology::HostTopology;

use super::costs::CostTable;
use crate::sync::recorder::Kind;

/// How far apart two CPUs are, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The same CPU.
    Same,
    /// SMT siblings.
    Smt,
    /// Sharing an L2.
    L2,
    /// Sharing an LLC (CCX on AMD, the mesh of a die on Intel).
    Llc,
    /// The same die, another LLC.
    Die,
    /// The same package, another die.
    Package,
    /// The other socket.
    Remote,
}

/// Coherence state of one line.
#[derive(Clone, Debug, Default)]
struct Line {
    /// The CPU holding it modified/exclusive.
    owner: Option<u32>,
    /// CPUs holding it shared (empty when owned).
    sharers: Mask,
    /// Ownership transfers booked on it: (start, end), sorted. Calls run
    /// one at a time, so a call can book a transfer later in virtual time
    /// than another CPU's call that runs after it; that one takes the
    /// first gap at or after its own time, as the hardware would have
    /// served it first.
    busy: Vec<(u64, u64)>,
    /// Lock word: when its holder released it, and who.
    released_at: u64,
    last_holder: Option<u32>,
    /// Its traffic and, as a lock word, its contention (kept here, not in
    /// maps of their own: one lookup per access).
    stat: LineStat,
    lock: LockStat,
}

/// A fast hasher for line numbers (u64 keys): one multiply. Deterministic;
/// no attacker chooses the keys.
#[derive(Default)]
pub struct LineHasher(u64);

impl Hasher for LineHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by line.
pub type LineMap<V> = HashMap<u64, V, BuildHasherDefault<LineHasher>>;

/// Line offsets within a region kept in a dense vector; beyond, in the
/// map (a region touched sparsely far from its start).
const DENSE_LINES: u64 = 1 << 16;

/// Every line's state. The simulator names lines as region number << 40
/// plus the line offset in the region (bit 63 set for a line in no
/// region): region lines live in a vector per region, indexed by offset
/// (no hashing, and neighbouring lines stay neighbours in memory, which
/// halved the cost of an access); the rest in a map.
#[derive(Default)]
struct LineStore {
    dense: Vec<Vec<Line>>,
    sparse: LineMap<Line>,
}

impl LineStore {
    fn get(&mut self, line: u64) -> &mut Line {
        let (region, off) = ((line >> 40) as usize, line & ((1 << 40) - 1));
        if line >> 63 != 0 || off >= DENSE_LINES {
            return self.sparse.entry(line).or_default();
        }
        if region >= self.dense.len() {
            self.dense.resize_with(region + 1, Vec::new);
        }
        let v = &mut self.dense[region];
        if off as usize >= v.len() {
            v.resize_with(off as usize + 1, Line::default);
        }
        &mut v[off as usize]
    }

    /// Every line ever touched, with its name (any order).
    fn iter(&self) -> impl Iterator<Item = (u64, &Line)> {
        let dense = self.dense.iter().enumerate().flat_map(|(r, v)| {
            v.iter()
                .enumerate()
                .map(move |(o, l)| (((r as u64) << 40) | o as u64, l))
        });
        dense.chain(self.sparse.iter().map(|(k, l)| (*k, l)))
    }
}

const WORDS: usize = crate::cpumask::MAX_CPUS / 64;

/// A set of CPUs, one bit each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mask([u64; WORDS]);

impl Default for Mask {
    fn default() -> Self {
        Mask([0; WORDS])
    }
}

/// Mask operations look at the first `nw` words only: those that can hold
/// one of the topology's CPUs (8 for 480 CPUs, not 16).
impl Mask {
    fn set(&mut self, c: u32) {
        self.0[c as usize / 64] |= 1 << (c % 64);
    }
    fn unset(&mut self, c: u32) {
        self.0[c as usize / 64] &= !(1 << (c % 64));
    }
    fn has(&self, c: u32) -> bool {
        self.0[c as usize / 64] & (1 << (c % 64)) != 0
    }
    fn is_empty(&self, nw: usize) -> bool {
        self.0[..nw].iter().all(|&w| w == 0)
    }
    fn intersects(&self, o: &Mask, nw: usize) -> bool {
        self.0[..nw].iter().zip(&o.0[..nw]).any(|(a, b)| a & b != 0)
    }
    /// Whether some CPU of `self` is outside `o`.
    fn outside(&self, o: &Mask, nw: usize) -> bool {
        self.0[..nw]
            .iter()
            .zip(&o.0[..nw])
            .any(|(a, b)| a & !b != 0)
    }
    fn clear(&mut self, nw: usize) {
        self.0[..nw].fill(0);
    }
}

/// Per-line traffic, for the c2c report.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineStat {
    /// Misses served by another cache (HITM-like transfers).
    pub transfers: u64,
    /// Virtual ns spent on them, queueing included.
    pub cost_ns: u64,
}

/// Per-lock contention, for the lockstat report.
#[derive(Clone, Copy, Debug, Default)]
pub struct LockStat {
    /// Acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found the lock held.
    pub contended: u64,
    /// Virtual ns spent spinning.
    pub wait_ns: u64,
}

/// The model: a cost table, the topology's distances and every line's
/// state.
pub struct Coherence {
    cost: CostTable,
    core: Vec<u32>,
    l2: Vec<u32>,
    llc: Vec<u32>,
    die: Vec<u32>,
    package: Vec<u32>,
    /// Per CPU, the CPUs at each level or nearer: itself, SMT core, L2,
    /// LLC, die, package.
    tiers: Vec<[Mask; 6]>,
    /// Mask words that hold the topology's CPUs.
    nw: usize,
    lines: LineStore,
    /// No access starts before this (the event loop's time).
    floor: u64,
}

impl Coherence {
    /// A model of `topo` with `cost`.
    pub fn new(topo: &HostTopology, cost: CostTable) -> Self {
        let c = topo.cpus();
        let tiers = (0..c.len())
            .map(|a| {
                let mut t = [Mask::default(); 6];
                for (b, lb) in c.iter().enumerate() {
                    let la = &c[a];
                    let same = [
                        a == b,
                        la.core == lb.core,
                        la.l2 == lb.l2,
                        la.llc == lb.llc,
                        la.die == lb.die,
                        la.package == lb.package,
                    ];
                    for (k, s) in same.iter().enumerate() {
                        if *s {
                            t[k].set(b as u32);
                        }
                    }
                }
                t
            })
            .collect();
        Self {
            tiers,
            nw: c.len().div_ceil(64).max(1),
            cost,
            core: c.iter().map(|l| l.core).collect(),
            l2: c.iter().map(|l| l.l2).collect(),
            llc: c.iter().map(|l| l.llc).collect(),
            die: c.iter().map(|l| l.die).collect(),
            package: c.iter().map(|l| l.package).collect(),
            lines: LineStore::default(),
            floor: 0,
        }
    }

    /// Tells the model that no access will start before `t`, so bookings
    /// that end earlier can be forgotten.
    pub fn set_floor(&mut self, t: u64) {
        self.floor = t;
    }

    /// The cost table in use.
    pub fn cost(&self) -> &CostTable {
        &self.cost
    }

    /// The distance between two CPUs.
    pub fn level(&self, a: u32, b: u32) -> Level {
        let (a, b) = (a as usize, b as usize);
        if a == b {
            Level::Same
        } else if self.core[a] == self.core[b] {
            Level::Smt
        } else if self.l2[a] == self.l2[b] {
            Level::L2
        } else if self.llc[a] == self.llc[b] {
            Level::Llc
        } else if self.die[a] == self.die[b] {
            Level::Die
        } else if self.package[a] == self.package[b] {
            Level::Package
        } else {
            Level::Remote
        }
    }

    /// One access by `cpu` starting at `now`; returns when it completes.
    pub fn access(&mut self, cpu: u32, line: u64, kind: Kind, now: u64) -> u64 {
        let mut now = now;
        // The line is updated where it lies: one lookup, and a `Line`
        // (some 200 bytes) is not moved out and back.
        let l = self.lines.get(line);
        if kind == Kind::Lock {
            // Spin until the previous holder's release, in virtual time.
            let st = &mut l.lock;
            st.acquisitions += 1;
            if l.released_at > now && l.last_holder.is_some_and(|h| h != cpu) {
                st.contended += 1;
                st.wait_ns += l.released_at - now;
                now = l.released_at;
            }
        }
        let m = Model {
            cost: &self.cost,
            tiers: &self.tiers[cpu as usize],
            nw: self.nw,
            floor: self.floor,
        };
        let (done, transferred) = m.transfer(l, cpu, kind, now);
        match kind {
            Kind::Lock => l.last_holder = Some(cpu),
            Kind::Unlock => {
                l.released_at = done;
                l.last_holder = Some(cpu);
            }
            _ => {}
        }
        if transferred {
            l.stat.transfers += 1;
            l.stat.cost_ns += done - now;
        }
        done
    }

    /// Traffic per line that another cache ever supplied (any order).
    pub fn line_stats(&self) -> impl Iterator<Item = (u64, &LineStat)> {
        self.lines
            .iter()
            .filter(|(_, l)| l.stat.transfers > 0)
            .map(|(k, l)| (k, &l.stat))
    }

    /// Contention per lock word ever taken (any order).
    pub fn lock_stats(&self) -> impl Iterator<Item = (u64, &LockStat)> {
        self.lines
            .iter()
            .filter(|(_, l)| l.lock.acquisitions > 0)
            .map(|(k, l)| (k, &l.lock))
    }
}

/// What one access needs besides its line: the costs, the accessing
/// CPU's tiers, the mask width and the floor.
struct Model<'a> {
    cost: &'a CostTable,
    tiers: &'a [Mask; 6],
    nw: usize,
    floor: u64,
}

impl Model<'_> {
    /// Serves an access of `cpu` to line `l` starting at `now`: when it
    /// completes, and whether another cache supplied the line.
    fn transfer(&self, l: &mut Line, cpu: u32, kind: Kind, now: u64) -> (u64, bool) {
        let nw = self.nw;
        let write = kind != Kind::Load;
        let hit = if write {
            l.owner == Some(cpu)
        } else {
            l.owner == Some(cpu) || l.sharers.has(cpu)
        };
        if hit {
            return (now + self.cost.l1_hit_ns, false);
        }
        // Everyone holding it but `cpu`.
        let mut holders = l.sharers;
        if let Some(o) = l.owner {
            holders.set(o);
        }
        holders.unset(cpu);
        const LEVELS: [Level; 6] = [
            Level::Same,
            Level::Smt,
            Level::L2,
            Level::Llc,
            Level::Die,
            Level::Package,
        ];
        let tiers = self.tiers;
        // The nearest holder serves the miss; memory if nobody holds it.
        let nearest = if holders.is_empty(nw) {
            None
        } else {
            Some(
                (1..6)
                    .find(|&k| holders.intersects(&tiers[k], nw))
                    .map_or(Level::Remote, |k| LEVELS[k]),
            )
        };
        let mut lat = nearest.map_or(self.cost.memory_ns, |lv| self.cost.transfer(lv));
        if write && !l.sharers.is_empty(nw) {
            // Invalidating the farthest other sharer bounds the upgrade.
            let mut others = l.sharers;
            others.unset(cpu);
            if !others.is_empty(nw) {
                let far = (1..6)
                    .find(|&k| !others.outside(&tiers[k], nw))
                    .map_or(Level::Remote, |k| LEVELS[k]);
                lat = lat.max(self.cost.transfer(far));
            }
        }
        // Ownership transfers serialize on the line: a write takes the
        // first gap of `lat` at or after `now`. Read misses of a line
        // nobody is writing are served in parallel (from the sharers or
        // the home agent): they wait only for a write in progress.
        // The bookings never overlap (each write takes a gap), so sorted by
        // start they are sorted by end too: the expired ones are a prefix,
        // and so are those that end by `now`, which cannot delay this
        // access. Binary searches skip both.
        let floor = self.floor;
        let expired = l.busy.partition_point(|&(_, e)| e <= floor);
        l.busy.drain(..expired);
        let past = l.busy.partition_point(|&(_, e)| e <= now);
        let start = if write {
            let mut s = now;
            for &(b, e) in &l.busy[past..] {
                if s + lat <= b {
                    break;
                }
                s = s.max(e);
            }
            s
        } else {
            l.busy
                .get(past)
                .filter(|&&(b, _)| b <= now)
                .map_or(now, |&(_, e)| e)
        };
        let done = start + lat;
        if write {
            let at = l.busy.partition_point(|&(b, _)| b < start);
            l.busy.insert(at, (start, done));
        }
        if write {
            l.owner = Some(cpu);
            l.sharers.clear(nw);
        } else {
            if let Some(o) = l.owner.take() {
                l.sharers.set(o);
            }
            l.sharers.set(cpu);
        }
        (done, nearest.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::sim::costs::CostTable;

    fn topo() -> HostTopology {
        // 2 packages x 2 LLCs x 2 cores x 2 threads = 16 CPUs
        topology::load("package:2 l3:2 l2:2 core:1 pu:2").unwrap()
    }

    fn model() -> Coherence {
        Coherence::new(&topo(), CostTable::for_preset("test").unwrap())
    }

    #[test]
    fn levels_follow_the_topology() {
        let m = model();
        assert_eq!(m.level(0, 1), Level::Smt);
        assert_eq!(m.level(0, 2), Level::Llc);
        // no die level in the string: a die is a package, another LLC in
        // it is the die level
        assert_eq!(m.level(0, 4), Level::Die);
        assert_eq!(m.level(0, 8), Level::Remote);
    }

    #[test]
    fn one_writer_n_readers() {
        let mut m = model();
        let c = *m.cost();
        // writer on CPU 0 takes the line from memory, then hits
        assert_eq!(m.access(0, 1, Kind::Store, 0), c.memory_ns);
        assert_eq!(m.access(0, 1, Kind::Store, 1000), 1000 + c.l1_hit_ns);
        // readers 2 (same LLC) and 3 (same LLC): each a transfer, serialized
        let t = 2000;
        let d2 = m.access(2, 1, Kind::Load, t);
        assert_eq!(d2, t + c.llc_ns);
        let d3 = m.access(3, 1, Kind::Load, t);
        // CPU 3's nearest holder is its SMT sibling 2; reads of a line
        // nobody writes do not queue behind one another
        assert_eq!(d3, t + c.smt_ns);
        // the writer's next store invalidates three sharers: farthest is LLC
        let w = m.access(0, 1, Kind::Store, 5000);
        assert_eq!(w, 5000 + c.llc_ns);
    }

    #[test]
    fn n_writers_on_one_line_queue() {
        let c = CostTable::for_preset("test").unwrap();
        for n in [2u32, 4, 8] {
            let mut m = model();
            m.access(8, 7, Kind::Rmw, 0); // owned by CPU 8 (socket 1)
            let t = 10_000;
            let last = (0..n).map(|k| m.access(k, 7, Kind::Rmw, t)).max().unwrap();
            // first from the other socket, then each hands on within socket 0
            let mut want = t + c.remote_ns;
            for k in 1..n {
                want += c.transfer(m.level(k - 1, k));
            }
            assert_eq!(last, want, "n = {n}");
        }
    }

    #[test]
    fn false_sharing_costs_only_on_one_line() {
        // two CPUs on different sockets each bump their own field
        let c = CostTable::for_preset("test").unwrap();
        let run = |same_line: bool| {
            let mut m = model();
            let (a, b) = (0u64, if same_line { 0 } else { 1 });
            let mut t = 0;
            for _ in 0..10 {
                t = m.access(0, a, Kind::Rmw, t);
                t = m.access(8, b, Kind::Rmw, t);
            }
            t
        };
        let shared = run(true);
        let split = run(false);
        assert_eq!(split, 2 * c.memory_ns + 18 * c.l1_hit_ns);
        assert_eq!(shared, c.memory_ns + 19 * c.remote_ns);
    }

    #[test]
    fn lock_handover_within_l2_is_cheaper_than_across_sockets() {
        let c = CostTable::for_preset("test").unwrap();
        let handover = |other: u32| {
            let mut m = model();
            let got0 = m.access(0, 3, Kind::Lock, 0);
            assert_eq!(got0, c.memory_ns);
            let rel = m.access(0, 3, Kind::Unlock, got0 + 100);
            assert_eq!(rel, got0 + 100 + c.l1_hit_ns);
            // the other CPU tried during the critical section and waits
            let got = m.access(other, 3, Kind::Lock, got0 + 50);
            let st = *m.lock_stats().find(|(l, _)| *l == 3).unwrap().1;
            assert_eq!((st.acquisitions, st.contended), (2, 1));
            assert_eq!(st.wait_ns, rel - (got0 + 50));
            got - rel
        };
        assert_eq!(handover(1), c.smt_ns);
        assert_eq!(handover(8), c.remote_ns);
    }
}
