//! The one latency histogram of the workspace.
//!
//! WHAT: [`Histogram`] records nanosecond values with
//! [`SIGNIFICANT_DIGITS`] significant decimal digits (relative error below
//! 0.1%), backed by the `hdrhistogram` crate, and reports count, max, mean
//! and quantiles. Values above [`Histogram::HIGHEST`] are clamped to it and
//! remembered: [`Histogram::overflowed`] tells that a run had them.
//!
//! WHY: there were two: a log2 histogram whose quantiles were bucket upper
//! bounds (a wake-to-run p50 of 67108863 ns is 2^26-1, only good to a
//! factor of 2, yet printed to the nanosecond) and a log-linear one good to
//! about 6%. Reports mixed them. One type with a stated precision, whose
//! quantiles are rounded to the digits it really has, makes numbers
//! comparable and honest.
//!
//! HOW: an empty histogram allocates nothing (each task has one); the
//! first value allocates an auto-resizing `hdrhistogram::Histogram<u64>`
//! sized by the largest value seen. The exact sum is kept for the mean.
//! Serialised, it is a summary (count, max, mean, p50..p999, overflowed)
//! plus the recorded (value, count) pairs, from which it is rebuilt.
//!
//! A histogram can keep fewer digits ([`Histogram::with_digits`]): each
//! task's wake-to-run histogram is recorded on every context switch, and
//! at 3 digits a task's counters for latencies of 0.5-5 us span some 2,000
//! slots (16 KiB); a few hundred tasks' histograms then evict the
//! scheduler's own lines from the cache. At 2 digits they span a seventh of
//! that. A merge keeps the fewer digits of the two, and quantiles are
//! rounded to them, so a report never claims a digit it does not have.

use serde::{Deserialize, Serialize};

/// Significant decimal digits every recorded value keeps.
pub const SIGNIFICANT_DIGITS: u8 = 3;

type Hdr = hdrhistogram::Histogram<u64>;

/// A histogram of nanosecond values (see the module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "Repr", from = "Repr")]
pub struct Histogram {
    h: Option<Box<Hdr>>,
    sum: u128,
    overflowed: bool,
    /// Significant digits kept (1..=[`SIGNIFICANT_DIGITS`]).
    digits: u8,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            h: None,
            sum: 0,
            overflowed: false,
            digits: SIGNIFICANT_DIGITS,
        }
    }
}

impl PartialEq for Histogram {
    fn eq(&self, o: &Self) -> bool {
        self.overflowed == o.overflowed
            && self.digits == o.digits
            && self.sum == o.sum
            && self.pairs() == o.pairs()
    }
}

impl Histogram {
    /// The largest value recorded as itself: one hour in ns. Larger values
    /// are recorded as this and set [`overflowed`](Self::overflowed).
    pub const HIGHEST: u64 = 3_600_000_000_000;

    /// Empty (allocates nothing), keeping [`SIGNIFICANT_DIGITS`] digits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty, keeping `digits` significant digits (clamped to
    /// 1..=[`SIGNIFICANT_DIGITS`]): a smaller, cheaper histogram.
    pub fn with_digits(digits: u8) -> Self {
        Self {
            digits: digits.clamp(1, SIGNIFICANT_DIGITS),
            ..Self::default()
        }
    }

    /// Significant digits its values and quantiles have.
    pub fn digits(&self) -> u8 {
        self.digits
    }

    fn hdr(&mut self) -> &mut Hdr {
        let digits = self.digits;
        self.h.get_or_insert_with(|| {
            let mut h = Hdr::new(digits).expect("valid significant digits");
            h.auto(true);
            Box::new(h)
        })
    }

    /// Records one value (ns), clamped to [`HIGHEST`](Self::HIGHEST).
    #[inline]
    pub fn record(&mut self, v: u64) {
        self.record_n(v, 1);
    }

    fn record_n(&mut self, v: u64, n: u64) {
        let v = if v > Self::HIGHEST {
            self.overflowed = true;
            Self::HIGHEST
        } else {
            v
        };
        // auto-resizing and below HIGHEST: cannot fail
        let _ = self.hdr().record_n(v, n);
        self.sum += v as u128 * n as u128;
    }

    /// Adds every value of `o`; the result keeps the fewer digits of the
    /// two.
    pub fn merge(&mut self, o: &Histogram) {
        self.overflowed |= o.overflowed;
        if o.h.is_some() && o.digits < self.digits {
            self.digits = o.digits;
            if let Some(mine) = self.h.take() {
                // re-recorded at the coarser precision
                let _ = self.hdr().add(&*mine);
            }
        }
        if let Some(oh) = &o.h {
            let _ = self.hdr().add(&**oh);
            self.sum += o.sum;
        }
    }

    /// Whether any value was above [`HIGHEST`](Self::HIGHEST) and clamped:
    /// the maximum and the top quantiles then understate the truth.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.h.as_ref().map_or(0, |h| h.len())
    }

    /// Largest value, to [`digits`](Self::digits) digits; 0 when empty.
    pub fn max(&self) -> u64 {
        self.h
            .as_ref()
            .map_or(0, |h| round_to(h.max(), self.digits))
    }

    /// Mean of the recorded (clamped) values; 0 when empty.
    pub fn mean(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum as f64 / n as f64,
        }
    }

    /// The `q` quantile (0..=1), rounded to [`digits`](Self::digits)
    /// significant digits (the precision it has); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        match &self.h {
            Some(h) if !h.is_empty() => round_to(
                h.value_at_quantile(q.clamp(0.0, 1.0)).min(h.max()),
                self.digits,
            ),
            _ => 0,
        }
    }

    /// The recorded values as (value, count), ascending; values are the
    /// lowest of their bucket.
    pub fn pairs(&self) -> Vec<(u64, u64)> {
        match &self.h {
            Some(h) => h
                .iter_recorded()
                .map(|v| {
                    (
                        h.lowest_equivalent(v.value_iterated_to()),
                        v.count_at_value(),
                    )
                })
                .collect(),
            None => Vec::new(),
        }
    }
}

/// `v` rounded to [`SIGNIFICANT_DIGITS`] significant decimal digits.
pub fn round_sig(v: u64) -> u64 {
    round_to(v, SIGNIFICANT_DIGITS)
}

/// `v` rounded to `keep` significant decimal digits.
pub fn round_to(v: u64, keep: u8) -> u64 {
    let digits = v.checked_ilog10().map_or(1, |d| d + 1);
    let keep = u32::from(keep.max(1));
    if digits <= keep {
        return v;
    }
    let p = 10u64.pow(digits - keep);
    (v / p + u64::from(v % p >= p / 2)).saturating_mul(p)
}

/// The serialised form: a summary for readers, the pairs for rebuilding.
#[derive(Serialize, Deserialize)]
struct Repr {
    count: u64,
    max: u64,
    mean: f64,
    p50: u64,
    p90: u64,
    p99: u64,
    p999: u64,
    overflowed: bool,
    significant_digits: u8,
    #[serde(default)]
    values: Vec<(u64, u64)>,
}

impl From<Histogram> for Repr {
    fn from(h: Histogram) -> Self {
        Repr {
            count: h.count(),
            max: h.max(),
            mean: h.mean(),
            p50: h.quantile(0.5),
            p90: h.quantile(0.9),
            p99: h.quantile(0.99),
            p999: h.quantile(0.999),
            overflowed: h.overflowed,
            significant_digits: h.digits,
            values: h.pairs(),
        }
    }
}

impl From<Repr> for Histogram {
    fn from(r: Repr) -> Self {
        let mut h = Histogram::with_digits(r.significant_digits);
        for (v, n) in r.values {
            h.record_n(v, n);
        }
        h.overflowed = r.overflowed;
        h
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn empty() {
        let h = Histogram::new();
        assert_eq!((h.count(), h.max(), h.quantile(0.5)), (0, 0, 0));
        assert_eq!(h.mean(), 0.0);
        assert!(!h.overflowed());
        assert!(h.h.is_none(), "an empty histogram allocates nothing");
    }

    #[test]
    fn quantiles_are_accurate_and_rounded_to_their_precision() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, want) in [(0.5, 500_000u64), (0.9, 900_000), (0.99, 990_000)] {
            let got = h.quantile(q);
            assert!(got.abs_diff(want) * 500 <= want, "q{q}: {got} vs {want}");
            assert_eq!(got, round_sig(got), "printed with the digits it has");
        }
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.max(), 1_000_000);
        assert!((h.mean() - 500_005.0).abs() < 1e-6);
        // what the log2 histogram printed as 67108863 is now 67100000-ish
        let mut w = Histogram::new();
        w.record(50_000_000);
        assert_eq!(w.quantile(0.5), 50_000_000);
        let mut small = Histogram::new();
        for v in 0..16 {
            small.record(v);
        }
        assert_eq!(small.quantile(1.0), 15);
        assert_eq!(small.quantile(0.0), 0);
    }

    #[test]
    fn merge_and_overflow() {
        let mut a = Histogram::new();
        a.record(1_000);
        let mut b = Histogram::new();
        b.record(2_000);
        b.record(Histogram::HIGHEST + 1);
        assert!(b.overflowed());
        assert_eq!(b.max(), round_sig(Histogram::HIGHEST));
        a.merge(&b);
        a.merge(&Histogram::new());
        assert_eq!(a.count(), 3);
        assert!(a.overflowed(), "merging keeps the flag");
        let mut c = Histogram::new();
        c.record(u64::MAX);
        assert!(c.overflowed());
    }

    #[test]
    fn fewer_digits_round_and_merge_to_the_coarser() {
        let mut t = Histogram::with_digits(2);
        for v in [1_234u64, 5_678, 91_011] {
            t.record(v);
        }
        assert_eq!(t.digits(), 2);
        assert_eq!(t.max(), 91_000);
        assert_eq!(t.quantile(0.5), 5_700);
        assert!((t.mean() - 32_641.0).abs() < 1e-6, "the sum stays exact");
        // a 3-digit histogram with values merged with a 2-digit one
        let mut all = Histogram::new();
        all.record(123_456);
        all.merge(&t);
        assert_eq!((all.digits(), all.count()), (2, 4));
        assert_eq!(all.max(), 120_000);
        assert_eq!(all.quantile(0.5), 5_700);
        // an empty coarse histogram does not coarsen
        let mut fine = Histogram::new();
        fine.record(1_234);
        fine.merge(&Histogram::with_digits(1));
        assert_eq!((fine.digits(), fine.max()), (3, 1_230));
        let j = serde_json::to_value(&t).unwrap();
        assert_eq!(j["significant_digits"], 2);
        let back: Histogram = serde_json::from_value(j).unwrap();
        assert_eq!((back.digits(), back.pairs()), (2, t.pairs()));
        assert_eq!(Histogram::with_digits(9).digits(), SIGNIFICANT_DIGITS);
        assert_eq!(round_to(1_250, 2), 1_300);
    }

    #[test]
    fn serde_round_trip_and_summary() {
        let mut h = Histogram::new();
        for v in [10, 20, 30, 123_456_789] {
            h.record(v);
        }
        let j = serde_json::to_value(&h).unwrap();
        assert_eq!(j["count"], 4);
        assert_eq!(j["max"], 123_000_000);
        assert_eq!(j["overflowed"], false);
        assert_eq!(j["significant_digits"], 3);
        assert!(j["p50"].is_u64());
        let back: Histogram = serde_json::from_value(j).unwrap();
        assert_eq!(back.count(), 4);
        assert_eq!(back.quantile(0.5), h.quantile(0.5));
        assert_eq!(back.max(), h.max());
    }

    #[test]
    fn rounding() {
        assert_eq!(round_sig(0), 0);
        assert_eq!(round_sig(999), 999);
        assert_eq!(round_sig(1_234), 1_230);
        assert_eq!(round_sig(1_235), 1_240);
        assert_eq!(round_sig(67_108_863), 67_100_000);
        assert_eq!(round_sig(u64::MAX), 18_400_000_000_000_000_000);
    }
}
