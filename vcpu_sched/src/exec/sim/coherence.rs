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
pub use super::costs::Level;
use crate::sync::recorder::Kind;

/// No CPU (an owner or a lock holder).
const NONE: u32 = u32::MAX;

/// Sharers kept inline; a sixth moves them to a spilled mask.
const INLINE: usize = 5;
/// `Sharers::n` of a spilled set.
const SPILLED: u16 = u16::MAX;

/// The CPUs holding a line shared: up to [`INLINE`] ids in place (most
/// lines have a few), more as a mask in [`Spill`]. 12 bytes, so that a
/// [`Line`] fits one host cache line: the model's working set is what
/// bounds its speed.
#[derive(Clone, Copy, Debug, Default)]
struct Sharers {
    /// How many ids are inline, or [`SPILLED`].
    n: u16,
    /// The ids; when spilled, ids 0 and 1 hold the mask's slot.
    ids: [u16; INLINE],
}

impl Sharers {
    fn slot(&self) -> Option<usize> {
        (self.n == SPILLED).then(|| (self.ids[0] as usize) | ((self.ids[1] as usize) << 16))
    }
    fn inline(&self) -> &[u16] {
        if self.n == SPILLED {
            &[]
        } else {
            &self.ids[..self.n as usize]
        }
    }
}

/// Spilled sharer masks, `nw` words each, and the free slots.
#[derive(Default)]
struct Spill {
    nw: usize,
    words: Vec<u64>,
    free: Vec<usize>,
}

impl Spill {
    fn mask(&self, slot: usize) -> &[u64] {
        &self.words[slot * self.nw..(slot + 1) * self.nw]
    }
    fn mask_mut(&mut self, slot: usize) -> &mut [u64] {
        &mut self.words[slot * self.nw..(slot + 1) * self.nw]
    }
    fn alloc(&mut self) -> usize {
        if let Some(s) = self.free.pop() {
            return s;
        }
        let s = self.words.len() / self.nw;
        self.words.resize(self.words.len() + self.nw, 0);
        s
    }

    fn has(&self, sh: &Sharers, c: u32) -> bool {
        match sh.slot() {
            Some(s) => self.mask(s)[c as usize / 64] & (1 << (c % 64)) != 0,
            None => sh.inline().contains(&(c as u16)),
        }
    }

    fn add(&mut self, sh: &mut Sharers, c: u32) {
        if let Some(s) = sh.slot() {
            self.mask_mut(s)[c as usize / 64] |= 1 << (c % 64);
            return;
        }
        if sh.inline().contains(&(c as u16)) {
            return;
        }
        if (sh.n as usize) < INLINE {
            sh.ids[sh.n as usize] = c as u16;
            sh.n += 1;
            return;
        }
        let s = self.alloc();
        let m = self.mask_mut(s);
        for &i in sh.ids.iter().chain(std::iter::once(&(c as u16))) {
            m[i as usize / 64] |= 1 << (i % 64);
        }
        *sh = Sharers {
            n: SPILLED,
            ids: [s as u16, (s >> 16) as u16, 0, 0, 0],
        };
    }

    fn clear(&mut self, sh: &mut Sharers) {
        if let Some(s) = sh.slot() {
            self.mask_mut(s).fill(0);
            self.free.push(s);
        }
        *sh = Sharers::default();
    }
}

/// Coherence state of one line: one host cache line, so that an access
/// touches one (lock words keep their state in a [`LockLine`] of their
/// own).
#[derive(Clone, Debug)]
#[repr(align(64))]
struct Line {
    /// The CPU holding it modified/exclusive, or [`NONE`].
    owner: u32,
    /// CPUs holding it shared (empty when owned).
    sharers: Sharers,
    /// Ownership transfers booked on it: (start, end), sorted. Calls run
    /// one at a time, so a call can book a transfer later in virtual time
    /// than another CPU's call that runs after it; that one takes the
    /// first gap at or after its own time, as the hardware would have
    /// served it first.
    busy: Vec<(u64, u64)>,
    /// Its traffic (kept here, not in a map of its own: one lookup per
    /// access).
    stat: LineStat,
}

impl Default for Line {
    fn default() -> Self {
        Self {
            owner: NONE,
            sharers: Sharers::default(),
            busy: Vec::new(),
            stat: LineStat::default(),
        }
    }
}

/// A lock word's state besides its line's.
#[derive(Clone, Copy, Debug)]
struct LockLine {
    /// When its holder released it, and who ([`NONE`]: never taken).
    released_at: u64,
    last_holder: u32,
    /// Its contention.
    stat: LockStat,
}

impl Default for LockLine {
    fn default() -> Self {
        Self {
            released_at: 0,
            last_holder: NONE,
            stat: LockStat::default(),
        }
    }
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

/// Per-line records. The simulator names lines as region number << 40
/// plus the line offset in the region (bit 63 set for a line in no
/// region): region lines live in a vector per region, indexed by offset
/// (no hashing, and neighbouring lines stay neighbours in memory, which
/// halved the cost of an access); the rest in a map.
struct LineStore<T> {
    dense: Vec<Vec<T>>,
    sparse: LineMap<T>,
}

impl<T> Default for LineStore<T> {
    fn default() -> Self {
        Self {
            dense: Vec::new(),
            sparse: LineMap::default(),
        }
    }
}

impl<T: Default> LineStore<T> {
    fn get(&mut self, line: u64) -> &mut T {
        let (region, off) = ((line >> 40) as usize, line & ((1 << 40) - 1));
        if line >> 63 != 0 || off >= DENSE_LINES {
            return self.sparse.entry(line).or_default();
        }
        if region >= self.dense.len() {
            self.dense.resize_with(region + 1, Vec::new);
        }
        let v = &mut self.dense[region];
        if off as usize >= v.len() {
            v.resize_with(off as usize + 1, T::default);
        }
        &mut v[off as usize]
    }

    /// Every line ever touched, with its name (any order).
    fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
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

impl Mask {
    fn set(&mut self, c: u32) {
        self.0[c as usize / 64] |= 1 << (c % 64);
    }
}

/// Per-line traffic, for the c2c report.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineStat {
    /// Misses served by another cache (HITM-like transfers).
    pub transfers: u64,
    /// Virtual ns spent on them, queueing included.
    pub cost_ns: u64,
    /// Interleaved runs: virtual ns writes waited in the line's queue
    /// for their turn (arbitration) before their transfer began.
    pub queued_ns: u64,
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
    /// Per CPU, its core, L2, LLC, die and package.
    keys: Vec<[u32; 5]>,
    /// Per CPU, the CPUs at each level or nearer: itself, SMT core, L2,
    /// LLC, die, package (for spilled sharer sets).
    tiers: Vec<[Mask; 6]>,
    lines: LineStore<Line>,
    locks: LineStore<LockLine>,
    spill: Spill,
    /// No access starts before this (the event loop's time).
    floor: u64,
    /// Locks are real (interleaved runs): a lock word is charged as the
    /// RMW it is, and the waits are the simulator's, reported through
    /// [`Coherence::lock_waited`].
    real_locks: bool,
    /// Interleaved runs: writes waiting for a line in transfer.
    waiters: LineMap<Vec<Waiter>>,
    /// Who gets a contended line next.
    arbitration: Arbitration,
}

/// Who gets a contended line next, among the writes waiting for it
/// (interleaved runs; see [`Coherence::write_request`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arbitration {
    /// In order of arrival.
    #[default]
    Fifo,
    /// The waiter nearest the line's current owner (SMT sibling, then L2,
    /// LLC, die, package, the other socket), in order of arrival among
    /// equals: hardware tends to hand a contended line to nearby
    /// requesters first (a directory or home agent serves the requests
    /// it has in hand, and a nearby one arrives sooner); Dice, Marathe and
    /// Shavit, "Lock Cohorting" (PPoPP 2012) build NUMA-aware locks on the
    /// same observation. No code from either.
    Nearest,
}

/// A write waiting for a line.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    cpu: u32,
    kind: Kind,
    token: u64,
    /// When it asked for the line.
    since: u64,
}

/// The levels of `Coherence::tiers` past `Same`, nearest first.
const LEVELS: [Level; 6] = [
    Level::Same,
    Level::Smt,
    Level::L2,
    Level::Llc,
    Level::Die,
    Level::Package,
];

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
            cost,
            keys: c
                .iter()
                .map(|l| [l.core, l.l2, l.llc, l.die, l.package])
                .collect(),
            lines: LineStore::default(),
            locks: LineStore::default(),
            spill: Spill {
                nw: c.len().div_ceil(64).max(1),
                ..Spill::default()
            },
            floor: 0,
            real_locks: false,
            waiters: LineMap::default(),
            arbitration: Arbitration::default(),
        }
    }

    /// Tells the model that no access will start before `t`, so bookings
    /// that end earlier can be forgotten.
    pub fn set_floor(&mut self, t: u64) {
        self.floor = t;
    }

    /// Interleaved runs: locks are real (see `real_locks`).
    pub fn set_real_locks(&mut self) {
        self.real_locks = true;
    }

    /// Interleaved runs: who gets a contended line next.
    pub fn set_arbitration(&mut self, a: Arbitration) {
        self.arbitration = a;
    }

    /// Interleaved runs: a lock attempt at `line` found it held and waited
    /// `wait_ns` for it.
    pub fn lock_waited(&mut self, line: u64, wait_ns: u64) {
        let st = &mut self.locks.get(line).stat;
        st.contended += 1;
        st.wait_ns += wait_ns;
    }

    /// The cost table in use.
    pub fn cost(&self) -> &CostTable {
        &self.cost
    }

    /// The distance between two CPUs.
    pub fn level(&self, a: u32, b: u32) -> Level {
        level_of(&self.keys, a, b)
    }

    /// One access by `cpu` starting at `now`; returns when it completes.
    pub fn access(&mut self, cpu: u32, line: u64, kind: Kind, now: u64) -> u64 {
        let mut now = now;
        if kind == Kind::Lock && self.real_locks {
            self.locks.get(line).stat.acquisitions += 1;
        } else if kind == Kind::Lock {
            // Spin until the previous holder's release, in virtual time.
            let l = self.locks.get(line);
            let st = &mut l.stat;
            st.acquisitions += 1;
            if l.released_at > now && l.last_holder != NONE && l.last_holder != cpu {
                st.contended += 1;
                st.wait_ns += l.released_at - now;
                now = l.released_at;
            }
            // the transfer below reads no lock state: record the holder now
            l.last_holder = cpu;
        }
        // The line is updated where it lies: one lookup, and a `Line` is
        // not moved out and back.
        let l = self.lines.get(line);
        let m = Model {
            cost: &self.cost,
            keys: &self.keys,
            tiers: &self.tiers[cpu as usize],
            floor: self.floor,
        };
        let (done, transferred) = m.transfer(l, &mut self.spill, cpu, kind, now);
        if transferred {
            l.stat.transfers += 1;
            l.stat.cost_ns += done - now;
        }
        if kind == Kind::Unlock && !self.real_locks {
            let l = self.locks.get(line);
            l.released_at = done;
            l.last_holder = cpu;
        }
        done
    }

    /// When the last ownership transfer booked on `line` completes (0 if
    /// none is booked).
    fn busy_until(&mut self, line: u64) -> u64 {
        self.lines.get(line).busy.last().map_or(0, |&(_, e)| e)
    }

    /// Interleaved runs: a write (store, RMW, lock, unlock) of `line` by
    /// `cpu` arriving at `at`, `token` naming the requester. Served at once
    /// (`Ok(done)`) when no other write is moving the line and none waits
    /// for it; otherwise it joins the line's queue and `Err(free_at)` says
    /// when the line is next free: the caller then calls
    /// [`Coherence::grant_next`] at that time.
    ///
    /// WHAT: requests that meet a line in transfer wait, and when it is
    /// free the next owner is chosen by the [`Arbitration`] rule, instead
    /// of each request booking the first gap in order of processing.
    /// WHY: the order a contended line is handed on in decides what a
    /// handoff costs (a chain that crosses sockets at every step, or one
    /// that stays near the owner), and with it where contention collapses.
    /// HOW: one queue per line with waiters, in arrival order; the
    /// caller's event loop triggers the choice at the line's free time.
    pub fn write_request(
        &mut self,
        cpu: u32,
        line: u64,
        kind: Kind,
        at: u64,
        token: u64,
    ) -> Result<u64, u64> {
        let free_at = self.busy_until(line);
        let queued = self.waiters.get(&line).is_some_and(|q| !q.is_empty());
        if !queued && free_at <= at {
            return Ok(self.access(cpu, line, kind, at));
        }
        self.waiters.entry(line).or_default().push(Waiter {
            cpu,
            kind,
            token,
            since: at,
        });
        Err(free_at.max(at))
    }

    /// Interleaved runs: `line` is free at `at`: the waiter the
    /// arbitration rule picks gets it. Returns its token, when its access
    /// completes, and whether others still wait (the next choice is then
    /// due at that completion).
    pub fn grant_next(&mut self, line: u64, at: u64) -> Option<(u64, u64, bool)> {
        let owner = self.lines.get(line).owner;
        let q = self.waiters.get_mut(&line)?;
        if q.is_empty() {
            return None;
        }
        let i = match self.arbitration {
            Arbitration::Fifo => 0,
            Arbitration::Nearest if owner == NONE => 0,
            // the nearest to the current owner, the earliest among equals;
            // the owner's own new request comes after the others' (they
            // were ordered at the line's home before it)
            Arbitration::Nearest => (0..q.len())
                .min_by_key(|&i| {
                    let c = q[i].cpu;
                    (c == owner, level_of(&self.keys, owner, c), i)
                })
                .unwrap_or(0),
        };
        let w = q.remove(i);
        let more = !q.is_empty();
        self.lines.get(line).stat.queued_ns += at.saturating_sub(w.since);
        let done = self.access(w.cpu, line, w.kind, at);
        Some((w.token, done, more))
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
        self.locks
            .iter()
            .filter(|(_, l)| l.stat.acquisitions > 0)
            .map(|(k, l)| (k, &l.stat))
    }
}

/// The distance between CPUs `a` and `b` given each CPU's core, L2, LLC,
/// die and package.
fn level_of(keys: &[[u32; 5]], a: u32, b: u32) -> Level {
    if a == b {
        return Level::Same;
    }
    let (ka, kb) = (&keys[a as usize], &keys[b as usize]);
    (0..5)
        .find(|&k| ka[k] == kb[k])
        .map_or(Level::Remote, |k| LEVELS[k + 1])
}

/// What one access needs besides its line: the costs, the topology, the
/// accessing CPU's tiers and the floor.
struct Model<'a> {
    cost: &'a CostTable,
    keys: &'a [[u32; 5]],
    tiers: &'a [Mask; 6],
    floor: u64,
}

impl Model<'_> {
    /// The nearest and the farthest of `sh` but `cpu`, if any: the nearest
    /// serves a miss, the farthest bounds an invalidation.
    fn near_far(&self, spill: &Spill, sh: &Sharers, cpu: u32) -> Option<(Level, Level)> {
        match sh.slot() {
            None => {
                let mut it = sh
                    .inline()
                    .iter()
                    .filter(|&&h| u32::from(h) != cpu)
                    .map(|&h| level_of(self.keys, cpu, u32::from(h)));
                let first = it.next()?;
                Some(it.fold((first, first), |(n, f), l| (n.min(l), f.max(l))))
            }
            Some(slot) => {
                let m = spill.mask(slot);
                let (w, b) = (cpu as usize / 64, 1u64 << (cpu % 64));
                let other = |i: usize| if i == w { m[i] & !b } else { m[i] };
                if (0..m.len()).all(|i| other(i) == 0) {
                    return None;
                }
                let t = self.tiers;
                let near = (1..6)
                    .find(|&k| (0..m.len()).any(|i| other(i) & t[k].0[i] != 0))
                    .map_or(Level::Remote, |k| LEVELS[k]);
                let far = (1..6)
                    .find(|&k| (0..m.len()).all(|i| other(i) & !t[k].0[i] == 0))
                    .map_or(Level::Remote, |k| LEVELS[k]);
                Some((near, far))
            }
        }
    }

    /// Serves an access of `cpu` to line `l` starting at `now`: when it
    /// completes, and whether another cache supplied the line.
    fn transfer(
        &self,
        l: &mut Line,
        spill: &mut Spill,
        cpu: u32,
        kind: Kind,
        now: u64,
    ) -> (u64, bool) {
        let write = kind != Kind::Load;
        let hit = l.owner == cpu || (!write && spill.has(&l.sharers, cpu));
        if hit {
            return (now + self.cost.l1_hit_ns, false);
        }
        // A line is owned or shared, never both. The nearest holder serves
        // the miss (memory if nobody holds it); a write also invalidates
        // the other sharers, and the farthest bounds the upgrade.
        let (nearest, far) = if l.owner != NONE {
            let lv = level_of(self.keys, cpu, l.owner);
            (Some(lv), None)
        } else {
            match self.near_far(spill, &l.sharers, cpu) {
                Some((n, f)) => (Some(n), write.then_some(f)),
                None => (None, None),
            }
        };
        let mut lat = nearest.map_or(self.cost.memory_ns, |lv| self.cost.transfer(lv));
        if let Some(f) = far {
            lat = lat.max(self.cost.transfer(f));
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
            l.owner = cpu;
            spill.clear(&mut l.sharers);
        } else {
            if l.owner != NONE {
                spill.add(&mut l.sharers, l.owner);
                l.owner = NONE;
            }
            spill.add(&mut l.sharers, cpu);
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
    fn many_sharers_spill_and_keep_their_distances() {
        // more sharers than fit inline: the nearest still serves a read and
        // the farthest still bounds a write's invalidation
        let c = CostTable::for_preset("test").unwrap();
        let mut m = model();
        m.access(0, 5, Kind::Store, 0);
        let mut t = 1000;
        for r in 1..8 {
            t = m.access(r, 5, Kind::Load, t);
        }
        // CPUs 0-7 (socket 0) share it; CPU 9 (socket 1) reads it remotely
        assert_eq!(m.access(9, 5, Kind::Load, 10_000), 10_000 + c.remote_ns);
        // CPU 1 writes: its nearest holder is its SMT sibling, the farthest
        // other sharer is on the other socket
        assert_eq!(m.access(1, 5, Kind::Store, 20_000), 20_000 + c.remote_ns);
        // the write left it owned by CPU 1 alone: CPU 0 reads from its sibling
        assert_eq!(m.access(0, 5, Kind::Load, 30_000), 30_000 + c.smt_ns);
        assert_eq!(m.access(1, 5, Kind::Load, 40_000), 40_000 + c.l1_hit_ns);
        // sharers 0-7 again, then CPU 0 upgrades: the farthest is another
        // LLC of its package (the die level here)
        let mut t = 50_000;
        for r in 2..8 {
            t = m.access(r, 5, Kind::Load, t);
        }
        assert_eq!(m.access(0, 5, Kind::Rmw, 60_000), 60_000 + c.die_ns);
        // a freed spill slot is reused and starts empty
        for r in 8..16 {
            m.access(r, 6, Kind::Load, 70_000);
        }
        assert_eq!(m.access(8, 6, Kind::Store, 80_000), 80_000 + c.die_ns);
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
