//! CPU sets: [`CpuMask`], a plain value, and [`AtomicCpuMask`], a shared
//! bitmap that many CPUs set and clear concurrently.
//!
//! Indices are the topology's dense CPU indices, not OS numbers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::sync::{AtomicU64, Ordering};

/// The most CPUs a mask holds. The biggest preset (`gnr-2s`) has 480; the
/// simulator of a later issue may want more, so there is headroom. The value
/// is a `Copy` array so that passing a mask around never allocates.
pub const MAX_CPUS: usize = 1024;
const WORDS: usize = MAX_CPUS / 64;

/// A set of CPUs (dense indices below [`MAX_CPUS`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CpuMask {
    w: [u64; WORDS],
}

impl Default for CpuMask {
    fn default() -> Self {
        Self::empty()
    }
}

impl CpuMask {
    /// No CPU.
    pub const fn empty() -> Self {
        Self { w: [0; WORDS] }
    }

    /// CPUs `0..n`.
    pub fn first_n(n: usize) -> Self {
        let mut m = Self::empty();
        let n = n.min(MAX_CPUS);
        for i in 0..n / 64 {
            m.w[i] = u64::MAX;
        }
        if n % 64 != 0 {
            m.w[n / 64] = (1u64 << (n % 64)) - 1;
        }
        m
    }

    /// Exactly `cpu`.
    pub fn single(cpu: u32) -> Self {
        let mut m = Self::empty();
        m.set(cpu);
        m
    }

    /// The CPUs yielded by `cpus`. Panics on an index >= [`MAX_CPUS`].
    pub fn from_cpus(cpus: impl IntoIterator<Item = u32>) -> Self {
        let mut m = Self::empty();
        for c in cpus {
            m.set(c);
        }
        m
    }

    /// Adds `cpu`.
    #[inline]
    pub fn set(&mut self, cpu: u32) {
        self.w[cpu as usize / 64] |= 1 << (cpu % 64);
    }

    /// Removes `cpu`.
    #[inline]
    pub fn clear(&mut self, cpu: u32) {
        self.w[cpu as usize / 64] &= !(1 << (cpu % 64));
    }

    /// Is `cpu` in the set?
    #[inline]
    pub fn contains(&self, cpu: u32) -> bool {
        (cpu as usize) < MAX_CPUS && self.w[cpu as usize / 64] & (1 << (cpu % 64)) != 0
    }

    /// Number of CPUs.
    pub fn count(&self) -> u32 {
        self.w.iter().map(|w| w.count_ones()).sum()
    }

    /// Is the set empty?
    pub fn is_empty(&self) -> bool {
        self.w.iter().all(|&w| w == 0)
    }

    /// Lowest CPU.
    pub fn first(&self) -> Option<u32> {
        self.w
            .iter()
            .enumerate()
            .find(|(_, &w)| w != 0)
            .map(|(i, w)| i as u32 * 64 + w.trailing_zeros())
    }

    /// Lowest CPU `>= from`, wrapping around to the start.
    pub fn next_wrapping(&self, from: u32) -> Option<u32> {
        let from = from as usize % MAX_CPUS;
        let (wi, bit) = (from / 64, from % 64);
        let masked = self.w[wi] & (u64::MAX << bit);
        if masked != 0 {
            return Some(wi as u32 * 64 + masked.trailing_zeros());
        }
        for i in (wi + 1..WORDS).chain(0..=wi) {
            if self.w[i] != 0 {
                return Some(i as u32 * 64 + self.w[i].trailing_zeros());
            }
        }
        None
    }

    /// The intersection.
    pub fn and(&self, o: &CpuMask) -> CpuMask {
        let mut m = *self;
        for i in 0..WORDS {
            m.w[i] &= o.w[i];
        }
        m
    }

    /// The union.
    pub fn or(&self, o: &CpuMask) -> CpuMask {
        let mut m = *self;
        for i in 0..WORDS {
            m.w[i] |= o.w[i];
        }
        m
    }

    /// `self` without the CPUs of `o`.
    pub fn and_not(&self, o: &CpuMask) -> CpuMask {
        let mut m = *self;
        for i in 0..WORDS {
            m.w[i] &= !o.w[i];
        }
        m
    }

    /// Do the sets share a CPU?
    pub fn intersects(&self, o: &CpuMask) -> bool {
        self.w.iter().zip(o.w.iter()).any(|(a, b)| a & b != 0)
    }

    /// Is every CPU of `self` in `o`?
    pub fn is_subset(&self, o: &CpuMask) -> bool {
        self.w.iter().zip(o.w.iter()).all(|(a, b)| a & !b == 0)
    }

    /// The mask folded onto 64 bits: bit `i` is set when some CPU `c`
    /// with `(c >> shift) % 64 == i` is in it ([`CpuMask::fold_bit`]). A
    /// clear bit proves a CPU absent without the mask (a lock-free hint; a
    /// set bit proves nothing). With `shift` from [`CpuMask::fold_shift`]
    /// every bit stands for `2^shift` consecutive CPUs and no two of them
    /// share a bit otherwise, so the hint is exact up to 64 CPUs, and above
    /// that a mask of neighbouring CPUs (a pinned VM's cores) sets few bits.
    /// Folding `c % 64` instead made every 64th CPU share a bit: on 480
    /// CPUs a VM pinned to 8 CPUs set 8 bits, each shared by 7 other CPUs.
    pub fn fold64(&self, shift: u32) -> u64 {
        if shift == 0 {
            return self.w.iter().fold(0, |a, w| a | w);
        }
        self.iter().fold(0, |a, c| a | Self::fold_bit(c, shift))
    }

    /// The bit of `cpu` in a [`CpuMask::fold64`] by `shift`.
    #[inline]
    pub fn fold_bit(cpu: u32, shift: u32) -> u64 {
        1 << ((cpu >> shift) % 64)
    }

    /// The smallest shift that gives each of `ncpus` CPUs (numbered from 0)
    /// a bit of its own group: `ncpus <= 64 << shift`.
    pub fn fold_shift(ncpus: usize) -> u32 {
        let mut s = 0;
        while ncpus > 64usize << s {
            s += 1;
        }
        s
    }

    /// Word `i` (CPUs `64 i .. 64 i + 63`).
    pub fn word(&self, i: usize) -> u64 {
        self.w[i]
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.w.iter().enumerate().flat_map(|(i, &w)| BitIter {
            w,
            base: i as u32 * 64,
        })
    }

    /// As a sorted vector.
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

/// Iterates the set bits of one word.
struct BitIter {
    w: u64,
    base: u32,
}

impl Iterator for BitIter {
    type Item = u32;
    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.w == 0 {
            return None;
        }
        let b = self.w.trailing_zeros();
        self.w &= self.w - 1;
        Some(self.base + b)
    }
}

impl fmt::Display for CpuMask {
    /// Linux CPU-list form (`0-3,8`); `(none)` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("(none)");
        }
        f.write_str(&topology::cpulist::format(&self.to_vec()))
    }
}

impl fmt::Debug for CpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuMask({self})")
    }
}

impl FromStr for CpuMask {
    type Err = crate::SchedError;
    /// Parses a CPU list (`0-3,8`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v = topology::cpulist::parse(s)?;
        if let Some(&bad) = v.iter().find(|&&c| c as usize >= MAX_CPUS) {
            return Err(crate::SchedError::Affinity {
                mask: s.to_string(),
                reason: format!("CPU {bad} is beyond the {MAX_CPUS} CPUs a mask holds"),
            });
        }
        Ok(CpuMask::from_cpus(v))
    }
}

impl Serialize for CpuMask {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&topology::cpulist::format(&self.to_vec()))
    }
}

impl<'de> Deserialize<'de> for CpuMask {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Ok(CpuMask::empty());
        }
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A shared bitmap of CPUs, set and cleared with atomic read-modify-writes.
///
/// The words are inline (128 bytes for [`MAX_CPUS`]), so the cache lines a
/// mask occupies are decided by the type that embeds it: a baseline layout
/// packs it next to other fields, a fixed layout wraps it in a padded type of
/// its own. Readers only load the words their query mask has bits in, so a
/// per-node or per-LLC query touches only that part of the mask.
pub struct AtomicCpuMask {
    w: [AtomicU64; WORDS],
}

impl Default for AtomicCpuMask {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicCpuMask {
    /// An empty mask.
    pub fn new() -> Self {
        Self {
            w: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[inline]
    fn slot(&self, cpu: u32) -> (&AtomicU64, u64) {
        (&self.w[cpu as usize / 64], 1u64 << (cpu % 64))
    }

    /// Adds `cpu`; returns whether it was already set.
    #[inline]
    pub fn set(&self, cpu: u32, order: Ordering) -> bool {
        let (w, b) = self.slot(cpu);
        w.fetch_or(b, order) & b != 0
    }

    /// Removes `cpu`; returns whether it was set.
    #[inline]
    pub fn clear(&self, cpu: u32, order: Ordering) -> bool {
        let (w, b) = self.slot(cpu);
        w.fetch_and(!b, order) & b != 0
    }

    /// Is `cpu` set?
    #[inline]
    pub fn test(&self, cpu: u32, order: Ordering) -> bool {
        let (w, b) = self.slot(cpu);
        w.load(order) & b != 0
    }

    /// A snapshot of every word (each word read atomically, the whole not).
    pub fn load(&self, order: Ordering) -> CpuMask {
        let mut m = CpuMask::empty();
        for (i, w) in self.w.iter().enumerate() {
            m.w[i] = w.load(order);
        }
        m
    }

    /// `self & other`, loading only the words where `other` has bits.
    pub fn and(&self, other: &CpuMask, order: Ordering) -> CpuMask {
        let mut m = CpuMask::empty();
        for (i, w) in self.w.iter().enumerate() {
            if other.w[i] != 0 {
                m.w[i] = w.load(order) & other.w[i];
            }
        }
        m
    }

    /// The lowest CPU in `self & other`.
    pub fn first_and(&self, other: &CpuMask, order: Ordering) -> Option<u32> {
        for (i, w) in self.w.iter().enumerate() {
            let o = other.w[i];
            if o == 0 {
                continue;
            }
            let x = w.load(order) & o;
            if x != 0 {
                return Some(i as u32 * 64 + x.trailing_zeros());
            }
        }
        None
    }

    /// Is any CPU of `within` set?
    pub fn any_in(&self, within: &CpuMask, order: Ordering) -> bool {
        self.first_and(within, order).is_some()
    }
}

impl fmt::Debug for AtomicCpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AtomicCpuMask({})", self.load(Ordering::Relaxed))
    }
}

/// A short list of masks, most preferred first.
#[derive(Default, Debug)]
pub struct CpuMaskList {
    pub(crate) masks: Vec<CpuMask>,
}

impl CpuMaskList {
    pub(crate) fn push(&mut self, m: CpuMask) {
        if !m.is_empty() {
            self.masks.push(m);
        }
    }
    /// The CPUs, preferred masks first.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.masks.iter().flat_map(|m| m.iter())
    }
    /// The CPUs, preferred masks first, each mask from `start` on
    /// (wrapping): CPUs that all scan the same list spread out instead of
    /// all trying the same CPU first.
    pub fn iter_from(&self, start: u32) -> impl Iterator<Item = u32> + '_ {
        self.masks.iter().flat_map(move |m| {
            let mut left = *m;
            let mut at = start;
            std::iter::from_fn(move || {
                let c = left.next_wrapping(at)?;
                left.clear(c);
                at = c;
                Some(c)
            })
        })
    }
    /// No CPU at all?
    pub fn is_empty(&self) -> bool {
        self.masks.is_empty()
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn fold_groups_neighbours_and_is_exact_up_to_64_cpus() {
        assert_eq!(CpuMask::fold_shift(1), 0);
        assert_eq!(CpuMask::fold_shift(64), 0);
        assert_eq!(CpuMask::fold_shift(65), 1);
        assert_eq!(CpuMask::fold_shift(480), 3);
        let m = CpuMask::from_cpus([3, 40]);
        // up to 64 CPUs a bit is a CPU
        assert_eq!(m.fold64(0), 1 << 3 | 1 << 40);
        // on 480 CPUs a pinned VM of 8 neighbours sets one bit, which CPU
        // 64 (the same bit under `c % 64`) does not share
        let vm = CpuMask::from_cpus(0..8);
        assert_eq!(vm.fold64(3), 1);
        assert_eq!(vm.fold64(3) & CpuMask::fold_bit(64, 3), 0);
        assert_ne!(vm.fold64(3) & CpuMask::fold_bit(7, 3), 0);
        // a clear bit still proves absence for every CPU
        let far = CpuMask::from_cpus([5, 130, 479]);
        for c in 0..480 {
            if far.fold64(3) & CpuMask::fold_bit(c, 3) == 0 {
                assert!(!far.contains(c), "{c}");
            }
        }
    }

    #[test]
    fn mask_list_from_a_start_keeps_mask_order_and_wraps_inside_each() {
        let mut l = CpuMaskList::default();
        let mut a = CpuMask::empty();
        for c in [1, 4, 6] {
            a.set(c);
        }
        let mut b = CpuMask::empty();
        for c in [8, 10] {
            b.set(c);
        }
        l.push(a);
        l.push(b);
        assert_eq!(l.iter_from(5).collect::<Vec<_>>(), vec![6, 1, 4, 8, 10]);
        assert_eq!(l.iter_from(9).collect::<Vec<_>>(), vec![1, 4, 6, 10, 8]);
        assert_eq!(
            l.iter_from(0).collect::<Vec<_>>(),
            l.iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn basic_ops() {
        let mut m = CpuMask::empty();
        assert!(m.is_empty());
        assert_eq!(m.first(), None);
        m.set(0);
        m.set(63);
        m.set(64);
        m.set(1023);
        assert_eq!(m.count(), 4);
        assert_eq!(m.to_vec(), vec![0, 63, 64, 1023]);
        assert!(m.contains(1023) && !m.contains(1) && !m.contains(5000));
        m.clear(63);
        assert_eq!(m.to_string(), "0,64,1023");
        assert_eq!(CpuMask::first_n(3).to_string(), "0-2");
        assert_eq!(CpuMask::first_n(64).count(), 64);
        assert_eq!(CpuMask::first_n(65).count(), 65);
        assert_eq!(CpuMask::first_n(0), CpuMask::empty());
        assert_eq!(CpuMask::empty().to_string(), "(none)");
    }

    #[test]
    fn set_algebra() {
        let a: CpuMask = "0-7".parse().unwrap();
        let b: CpuMask = "4-11".parse().unwrap();
        assert_eq!(a.and(&b).to_string(), "4-7");
        assert_eq!(a.or(&b).to_string(), "0-11");
        assert_eq!(a.and_not(&b).to_string(), "0-3");
        assert!(a.intersects(&b));
        assert!(!a.intersects(&"8-9".parse().unwrap()));
        assert!("2-3".parse::<CpuMask>().unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
    }

    #[test]
    fn next_wrapping_wraps() {
        let m = CpuMask::from_cpus([3, 70, 500]);
        assert_eq!(m.next_wrapping(0), Some(3));
        assert_eq!(m.next_wrapping(3), Some(3));
        assert_eq!(m.next_wrapping(4), Some(70));
        assert_eq!(m.next_wrapping(71), Some(500));
        assert_eq!(m.next_wrapping(501), Some(3));
        assert_eq!(CpuMask::empty().next_wrapping(9), None);
    }

    #[test]
    fn parse_errors_name_the_problem() {
        let e = "1-".parse::<CpuMask>().unwrap_err().to_string();
        assert!(e.contains("malformed CPU list"), "{e}");
        let e = "2000".parse::<CpuMask>().unwrap_err().to_string();
        assert!(e.contains("beyond"), "{e}");
    }

    #[test]
    fn serde_round_trip() {
        let m: CpuMask = "1-3,9".parse().unwrap();
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, "\"1-3,9\"");
        assert_eq!(serde_json::from_str::<CpuMask>(&j).unwrap(), m);
    }

    #[test]
    fn atomic_mask() {
        let a = AtomicCpuMask::new();
        assert!(!a.set(130, Ordering::Relaxed));
        assert!(a.set(130, Ordering::Relaxed));
        assert!(a.test(130, Ordering::Relaxed));
        assert!(!a.test(5, Ordering::Relaxed));
        let all = CpuMask::first_n(1024);
        assert_eq!(a.first_and(&all, Ordering::Relaxed), Some(130));
        assert_eq!(a.first_and(&CpuMask::first_n(128), Ordering::Relaxed), None);
        assert_eq!(a.and(&all, Ordering::Relaxed).to_string(), "130");
        assert_eq!(a.load(Ordering::Relaxed).to_string(), "130");
        assert!(a.any_in(&all, Ordering::Relaxed));
        assert!(a.clear(130, Ordering::Relaxed));
        assert!(!a.clear(130, Ordering::Relaxed));
        assert!(!a.any_in(&all, Ordering::Relaxed));
        a.set(1023, Ordering::Relaxed);
        assert_eq!(a.first_and(&all, Ordering::Relaxed), Some(1023));
    }
}
