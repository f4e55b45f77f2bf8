//! The paired reading of a comparison row: the ratio of each repetition to
//! the baseline run of the same repetition, their geometric mean and a 95%
//! bootstrap confidence interval, and what that interval says.
//!
//! WHAT: [`paired`] turns a row's per-repetition ratios (in percent,
//! oriented so that above 100 is better) into a [`Paired`]: the number of
//! pairs, the geometric mean ratio, the interval and a [`PairedVerdict`]:
//! better or worse only when the whole interval lies on one side of 100%,
//! otherwise "cannot tell apart".
//!
//! WHY: the band rule (the row's min-max against the A/A row's spread)
//! calls a row a tie whenever one repetition of either row strays: a
//! single outlier in the A/A row widens the band for every row, and a row
//! that beat the baseline in 5 of 5 repetitions by 3% still "overlaps" a
//! 97-101% band. The repetitions are interleaved, so repetition `i` of a
//! row and of the baseline ran back to back under the same host state;
//! their ratio is the measurement, and the question is whether the ratios
//! sit on one side of 100%.
//!
//! HOW: the ratios' logarithms are resampled with replacement
//! ([`RESAMPLES`] resamples of as many pairs as there are, with the
//! workspace's [`Rng`] from the fixed [`SEED`], so the same data always
//! gives the same interval), each resample's mean is taken, and the
//! interval is the 2.5th and 97.5th percentile of those means, back in
//! percent (a percentile bootstrap of the geometric mean). The geometric
//! mean, not the arithmetic one, because ratios are multiplicative: 50%
//! and 200% cancel. Not the median either: with 3-5 pairs a bootstrap of
//! the median can only land on the data points, so its interval is the
//! min-max again. The interval always lies within the ratios' min-max, so
//! it reads "better" only when every repetition (3 pairs) or nearly every
//! one (5 pairs) did better. With fewer than [`MIN_PAIRS`] pairs there is
//! no interval. A percentile bootstrap of few pairs is narrower than the
//! truth (it cannot see spread that the few pairs did not show): read it
//! with the band rule beside it, and the A/A row's own interval, which
//! should hold 100%.

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Bootstrap resamples per row.
pub const RESAMPLES: usize = 10_000;

/// The resampling generator's seed: fixed, so that a table rebuilt from
/// the same values is the same table.
pub const SEED: u64 = 0x5EED_0B00_7C1A;

/// Fewer pairs than this give no interval.
pub const MIN_PAIRS: usize = 3;

/// What a row's paired interval says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairedVerdict {
    /// The whole interval lies above 100%.
    Better,
    /// The whole interval lies below 100%.
    Worse,
    /// The interval holds 100% (or touches it).
    CannotTellApart,
    /// Fewer than [`MIN_PAIRS`] pairs with a ratio: no interval.
    TooFewPairs,
}

impl PairedVerdict {
    /// The words printed in a table.
    pub fn label(self) -> &'static str {
        match self {
            PairedVerdict::Better => "better",
            PairedVerdict::Worse => "worse",
            PairedVerdict::CannotTellApart => "cannot tell apart",
            PairedVerdict::TooFewPairs => "too few pairs",
        }
    }
}

/// A row's paired ratio and its interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    /// Repetitions with a ratio (both runs measured something).
    pub pairs: usize,
    /// The geometric mean of the per-repetition ratios, in percent (NaN
    /// without a pair).
    pub ratio_pct: f64,
    /// The 95% percentile-bootstrap interval of that mean, in percent
    /// (NaN, NaN with fewer than [`MIN_PAIRS`] pairs).
    pub ci95_pct: (f64, f64),
    /// What the interval says.
    pub verdict: PairedVerdict,
}

impl Paired {
    /// `ratio% [lo-hi]`, or `ratio% (n pairs)` without an interval, or `-`.
    pub fn render(&self) -> String {
        if !self.ratio_pct.is_finite() {
            "-".into()
        } else if self.verdict == PairedVerdict::TooFewPairs {
            format!("{:.1}% ({} pairs)", self.ratio_pct, self.pairs)
        } else {
            format!(
                "{:.1}% [{:.1}-{:.1}]",
                self.ratio_pct, self.ci95_pct.0, self.ci95_pct.1
            )
        }
    }
}

/// The paired reading of per-repetition ratios in percent (above 100
/// better); ratios that are NaN or negative (no ratio) are left out. See
/// the module doc.
pub fn paired(ratios_pct: &[f64]) -> Paired {
    let logs: Vec<f64> = ratios_pct
        .iter()
        .filter(|r| **r >= 0.0 && r.is_finite())
        // relative to 100%, so that a ratio of exactly 100% is a log of
        // exactly 0 and identical runs give exactly [100, 100]
        .map(|r| (r / 100.0).ln())
        .collect();
    let n = logs.len();
    let ratio_pct = if n == 0 {
        f64::NAN
    } else {
        100.0 * (logs.iter().sum::<f64>() / n as f64).exp()
    };
    if n < MIN_PAIRS {
        return Paired {
            pairs: n,
            ratio_pct,
            ci95_pct: (f64::NAN, f64::NAN),
            verdict: PairedVerdict::TooFewPairs,
        };
    }
    let mut rng = Rng::new(SEED);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            (0..n)
                .map(|_| logs[rng.below(n as u64) as usize])
                .sum::<f64>()
                / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    // the 250th lowest and the 250th highest of 10,000
    let tail = RESAMPLES / 40;
    let (lo, hi) = (means[tail], means[RESAMPLES - 1 - tail]);
    let verdict = if lo > 0.0 {
        PairedVerdict::Better
    } else if hi < 0.0 {
        PairedVerdict::Worse
    } else {
        PairedVerdict::CannotTellApart
    };
    Paired {
        pairs: n,
        ratio_pct,
        ci95_pct: (100.0 * lo.exp(), 100.0 * hi.exp()),
        verdict,
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn a_host_that_wins_every_pair_by_3_to_5_percent_is_outside_the_interval() {
        // all as the baseline, the host's ratio oriented "above 100: the
        // host is better than all": 5 of 5 pairs above 100
        let p = paired(&[103.0, 104.0, 105.0, 103.5, 104.5]);
        assert_eq!(p.pairs, 5);
        // geometric mean, by hand: exp(mean(ln r)) = 103.998...
        let gm = (103.0f64 * 104.0 * 105.0 * 103.5 * 104.5).powf(0.2);
        assert!((p.ratio_pct - gm).abs() < 1e-9, "{p:?}");
        assert!((p.ratio_pct - 103.998).abs() < 1e-3, "{p:?}");
        // every resample's mean lies within the ratios' min-max
        assert!(103.0 <= p.ci95_pct.0 && p.ci95_pct.1 <= 105.0, "{p:?}");
        assert!(p.ci95_pct.0 < p.ratio_pct && p.ratio_pct < p.ci95_pct.1);
        assert_eq!(p.verdict, PairedVerdict::Better);
        // the same from the other side: the variant lost every pair
        let q = paired(&[
            100.0 / 1.03,
            100.0 / 1.04,
            100.0 / 1.05,
            100.0 / 1.035,
            100.0 / 1.045,
        ]);
        assert!(q.ci95_pct.1 < 100.0, "{q:?}");
        assert_eq!(q.verdict, PairedVerdict::Worse);
    }

    #[test]
    fn one_outlier_in_five_does_not_decide_and_a_straddle_is_no_verdict() {
        // transcode x1's host row: one repetition at 145%, the others
        // around 100: the interval holds 100%
        let p = paired(&[101.3, 145.0, 100.7, 97.2, 94.9]);
        assert!(p.ci95_pct.0 < 100.0 && 100.0 < p.ci95_pct.1, "{p:?}");
        assert_eq!(p.verdict, PairedVerdict::CannotTellApart);
        assert_eq!(p.verdict.label(), "cannot tell apart");
        // identical runs: [100, 100] touches 100, which is no effect
        let p = paired(&[100.0; 5]);
        assert_eq!(p.ci95_pct, (100.0, 100.0));
        assert_eq!(p.verdict, PairedVerdict::CannotTellApart);
    }

    #[test]
    fn few_pairs_give_no_interval_or_one_at_the_extremes() {
        // below MIN_PAIRS there is no interval, only the mean
        let p = paired(&[110.0, 120.0]);
        assert_eq!(p.verdict, PairedVerdict::TooFewPairs);
        assert!(p.ci95_pct.0.is_nan() && p.ci95_pct.1.is_nan());
        assert!((p.ratio_pct - (110.0f64 * 120.0).sqrt()).abs() < 1e-9);
        assert_eq!(p.render(), "114.9% (2 pairs)");
        // three pairs {90, 110, 110}: a resample is all 90 with chance
        // 1/27 = 3.7% > 2.5%, so the lower bound is 90 itself; all 110
        // has chance 8/27 > 2.5%, so the upper bound is 110
        let p = paired(&[90.0, 110.0, 110.0]);
        assert!((p.ci95_pct.0 - 90.0).abs() < 1e-9, "{p:?}");
        assert!((p.ci95_pct.1 - 110.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.render(), format!("{:.1}% [90.0-110.0]", p.ratio_pct));
    }

    #[test]
    fn the_same_ratios_give_the_same_interval_and_missing_ratios_drop_out() {
        let r = [97.1, 99.2, 101.5, 98.0, 103.3];
        assert_eq!(paired(&r), paired(&r));
        let with_gaps = [97.1, f64::NAN, 99.2, 101.5, -1.0, 98.0, 103.3];
        assert_eq!(paired(&with_gaps), paired(&r));
        let none = paired(&[]);
        assert_eq!((none.pairs, none.verdict), (0, PairedVerdict::TooFewPairs));
        assert_eq!(none.render(), "-");
        // a zero throughput is a ratio of 0%: the mean and the lower
        // bound go to 0, and the interval is still read
        let z = paired(&[0.0, 80.0, 90.0, 85.0]);
        assert_eq!(z.ratio_pct, 0.0);
        assert_eq!(z.verdict, PairedVerdict::Worse);
    }
}
