//! The comparison table every A/B in the project prints: one type for
//! `vmm sched-bench --compare`, `vmm bench --compare` and the simulator.
//!
//! WHAT: rows of a metric per variant (the baseline, an A/A row, each
//! mitigation set, and peers such as the host's 1:1 threads), each with its
//! per-repetition values, its mean relative to the baseline and the spread
//! of the per-repetition ratios, and a verdict: within noise, better or
//! worse.
//!
//! WHY: on a 2-CPU machine the same configuration run twice differs by up
//! to +-30%. A table without its noise floor invites reading noise as an
//! effect. The A/A row is the baseline run again as if it were a variant,
//! interleaved with the others, so the noise floor of *this* run stands next
//! to every effect, and an effect inside it is labelled as noise, in the
//! table and in the JSON.
//!
//! HOW: [`cells`] lays out the variants with the A/A row second; the
//! runners run every cell once per repetition in [`interleaved`] order;
//! [`Comparison::assemble`] computes the rows. A variant is *within noise*
//! when its per-repetition ratio range `[min, max]` overlaps the noise band:
//! the A/A row's per-repetition range widened to include 100% (the A/A
//! row's expected value). Ratios are oriented so that above 100% is always
//! better (mean over baseline for throughputs, baseline over mean for
//! latencies), and each repetition is divided by the baseline run of the
//! same repetition, so slow drift of the host cancels.
//!
//! Beside the band rule, each row carries its paired reading ([`paired`]):
//! the geometric mean of those per-repetition ratios with a 95% bootstrap
//! interval, better or worse only when the interval excludes 100%. The
//! band rule lets one outlier (in the row or in the A/A row) turn any
//! effect into a tie; the interval asks whether the pairs sit on one side.
//! [`Comparison::render_paired_table`] prints both.

pub mod paired;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SchedError};
use crate::mitigations::Mitigations;
use paired::Paired;

/// What a row of a comparison is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// The reference, 100% by definition.
    Baseline,
    /// The baseline run again as its own variant: the noise floor.
    #[serde(rename = "aa")]
    AA,
    /// A mitigation set.
    Variant,
    /// Something that is not a mitigation set of this scheduler (the host
    /// kernel's 1:1 threads).
    Peer,
}

/// How a row's effect reads against the noise band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The reference row.
    Baseline,
    /// The A/A row itself.
    NoiseFloor,
    /// The per-repetition range overlaps the noise band.
    WithinNoise,
    /// Every repetition is above the noise band.
    Better,
    /// Every repetition is below the noise band.
    Worse,
    /// No finite ratio (a zero or missing baseline).
    Unknown,
}

impl Verdict {
    /// The word printed in the table.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Baseline => "baseline",
            Verdict::NoiseFloor => "A/A",
            Verdict::WithinNoise => "within noise",
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::Unknown => "no ratio",
        }
    }
}

/// One cell of a comparison: what runs in one column of every repetition.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// The row's label.
    pub label: String,
    /// What the row is.
    pub kind: RowKind,
    /// The mitigation set it runs (the baseline's for the A/A row and
    /// peers).
    pub mitigations: Mitigations,
}

/// The suffix that marks the A/A row's label.
pub const AA_SUFFIX: &str = " (A/A)";

/// The cells of a comparison of `variants` (the first is the baseline):
/// the baseline, its A/A row, then the other variants. A set listed twice
/// runs twice.
pub fn cells(variants: &[Mitigations]) -> Result<Vec<Cell>> {
    let Some(&base) = variants.first() else {
        return Err(SchedError::Workload(
            "a comparison needs at least one mitigation set (the first is the baseline)".into(),
        ));
    };
    let mut out = vec![
        Cell {
            label: base.to_string(),
            kind: RowKind::Baseline,
            mitigations: base,
        },
        Cell {
            label: format!("{base}{AA_SUFFIX}"),
            kind: RowKind::AA,
            mitigations: base,
        },
    ];
    out.extend(variants[1..].iter().map(|&m| Cell {
        label: m.to_string(),
        kind: RowKind::Variant,
        mitigations: m,
    }));
    Ok(out)
}

/// The order of an interleaved comparison of `variants` cells over
/// `repetitions`: `(repetition, variant)` pairs, repetition `r` starting
/// `r` places further along the list, so that slow drift of the host
/// favours no variant.
pub fn interleaved(variants: usize, repetitions: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..repetitions).flat_map(move |rep| (0..variants).map(move |k| (rep, (k + rep) % variants)))
}

/// One row's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VariantRow {
    /// The row's label (a mitigation set, `... (A/A)`, or a peer's name).
    pub mitigations: String,
    /// What the row is.
    pub kind: RowKind,
    /// The metric of each repetition.
    pub values: Vec<f64>,
    /// Their mean.
    pub mean: f64,
    /// Their standard deviation.
    pub stddev: f64,
    /// Relative performance against the baseline, in percent: mean over
    /// baseline mean for higher-is-better metrics, baseline over mean for
    /// lower-is-better ones, so that above 100 is always better.
    pub relative_pct: f64,
    /// The lowest per-repetition relative performance (each repetition
    /// against the baseline run of the same repetition).
    pub relative_min_pct: f64,
    /// The highest, likewise.
    pub relative_max_pct: f64,
    /// The row's effect against the noise band.
    pub verdict: Verdict,
    /// `verdict == WithinNoise`, spelled out for readers of the JSON.
    pub within_noise: bool,
    /// The per-repetition ratios' geometric mean with its 95% bootstrap
    /// interval and what the interval says (absent in JSON written before
    /// it existed; `None` for the baseline row).
    #[serde(default)]
    pub paired: Option<Paired>,
    /// Mean time per `schedule` call (ns), averaged over repetitions (NaN
    /// where the row has no scheduler).
    pub sched_ns_per_call: f64,
}

/// A finished comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    /// What was compared, on what (its fields at the top level of the
    /// JSON).
    #[serde(flatten)]
    pub header: ComparisonHeader,
    /// Repetitions.
    pub repetitions: usize,
    /// The noise band in percent of the baseline: the A/A row's
    /// per-repetition range, widened to include 100 (`[100, 100]` without
    /// an A/A row).
    pub noise_band_pct: (f64, f64),
    /// One row per cell, the baseline first, the A/A row second.
    pub rows: Vec<VariantRow>,
}

/// What the first run of a comparison says about all of them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ComparisonHeader {
    /// Workload name.
    pub workload: String,
    /// Topology SPEC.
    pub topology: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Host CPUs.
    pub host_cpus: usize,
    /// The metric's name.
    pub metric: String,
    /// Its unit.
    pub unit: String,
    /// Is bigger better?
    pub higher_is_better: bool,
    /// Measured seconds per run.
    pub duration_s: f64,
}

/// The arithmetic mean (0 for no values).
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The sample standard deviation (0 for fewer than two values).
pub fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// `value` relative to `base` in percent, oriented so that above 100 is
/// better; NaN where there is no ratio (a zero baseline throughput or a
/// zero latency).
fn relative(value: f64, base: f64, higher_is_better: bool) -> f64 {
    let (num, den) = if higher_is_better {
        (value, base)
    } else {
        (base, value)
    };
    if den > 0.0 && num.is_finite() {
        100.0 * num / den
    } else {
        f64::NAN
    }
}

/// The noise band from the A/A row's per-repetition range (see the module
/// doc).
fn noise_band(aa: Option<(f64, f64)>) -> (f64, f64) {
    match aa {
        Some((lo, hi)) if lo.is_finite() && hi.is_finite() => (lo.min(100.0), hi.max(100.0)),
        _ => (100.0, 100.0),
    }
}

fn verdict(kind: RowKind, lo: f64, hi: f64, band: (f64, f64)) -> Verdict {
    match kind {
        RowKind::Baseline => Verdict::Baseline,
        RowKind::AA => Verdict::NoiseFloor,
        _ if !(lo.is_finite() && hi.is_finite()) => Verdict::Unknown,
        _ if lo > band.1 => Verdict::Better,
        _ if hi < band.0 => Verdict::Worse,
        _ => Verdict::WithinNoise,
    }
}

/// Each repetition of `vals` relative to the baseline run of the same
/// repetition, in percent, oriented as `relative`; repetitions without a
/// ratio are left out.
pub fn per_repetition_ratios(vals: &[f64], base: &[f64], higher_is_better: bool) -> Vec<f64> {
    vals.iter()
        .zip(base)
        .map(|(&x, &b)| relative(x, b, higher_is_better))
        .filter(|r| !r.is_nan())
        .collect()
}

/// The rows from a cell-major table of metric values
/// (`values[cell][repetition]`; cell 0 is the baseline) and each cell's mean
/// time per `schedule` call.
pub fn rows(
    cells: &[(String, RowKind)],
    values: &[Vec<f64>],
    sched_ns_per_call: &[f64],
    higher_is_better: bool,
) -> (Vec<VariantRow>, (f64, f64)) {
    let empty = Vec::new();
    let base = values.first().unwrap_or(&empty);
    let base_mean = mean(base);
    let per_rep: Vec<Vec<f64>> = values
        .iter()
        .map(|vals| per_repetition_ratios(vals, base, higher_is_better))
        .collect();
    let ranges: Vec<(f64, f64, f64)> = values
        .iter()
        .zip(&per_rep)
        .map(|(vals, per_rep)| {
            let lo = per_rep.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = per_rep.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (relative(mean(vals), base_mean, higher_is_better), lo, hi)
        })
        .collect();
    let aa = cells
        .iter()
        .position(|(_, k)| *k == RowKind::AA)
        .map(|i| (ranges[i].1, ranges[i].2));
    let band = noise_band(aa);
    let rows = cells
        .iter()
        .zip(values)
        .zip(&ranges)
        .enumerate()
        .map(|(i, (((label, kind), vals), &(rel, lo, hi)))| {
            let verdict = verdict(*kind, lo, hi, band);
            let paired = (*kind != RowKind::Baseline).then(|| paired::paired(&per_rep[i]));
            VariantRow {
                mitigations: label.clone(),
                kind: *kind,
                values: vals.clone(),
                mean: mean(vals),
                stddev: stddev(vals),
                relative_pct: rel,
                relative_min_pct: lo,
                relative_max_pct: hi,
                verdict,
                within_noise: verdict == Verdict::WithinNoise,
                paired,
                sched_ns_per_call: sched_ns_per_call.get(i).copied().unwrap_or(f64::NAN),
            }
        })
        .collect();
    (rows, band)
}

impl Comparison {
    /// A comparison from its header, its cells (label and kind, the
    /// baseline first), the cell-major table of metric values and each
    /// cell's mean time per `schedule` call.
    ///
    /// A value that is not a finite, non-negative number is an error: a
    /// run that measured nothing is never a plain result.
    pub fn assemble(
        header: ComparisonHeader,
        cells: &[(String, RowKind)],
        values: &[Vec<f64>],
        sched_ns_per_call: &[f64],
    ) -> Result<Self> {
        if cells.is_empty() || cells.len() != values.len() {
            return Err(SchedError::Workload(format!(
                "a comparison needs one row of values per cell ({} cells, {} rows)",
                cells.len(),
                values.len()
            )));
        }
        for ((label, _), vals) in cells.iter().zip(values) {
            if let Some(bad) = vals.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return Err(SchedError::Workload(format!(
                    "run '{label}' measured no usable {} ({bad}); run longer or with a smaller load",
                    header.metric
                )));
            }
        }
        let (rows, band) = rows(cells, values, sched_ns_per_call, header.higher_is_better);
        Ok(Comparison {
            header,
            repetitions: values.first().map_or(0, |v| v.len()),
            noise_band_pct: band,
            rows,
        })
    }

    /// The band-rule table: one row per cell with its mean metric, its
    /// standard deviation, its relative performance (baseline 100%, above
    /// 100% better), the min-max of the per-repetition ratios and the
    /// verdict against the noise band; then the band itself. The
    /// simulator prints this layout (its committed outputs under
    /// `docs/data/sim/` are reruns of it, byte for byte).
    pub fn render_table(&self) -> String {
        self.render(false)
    }

    /// [`Comparison::render_table`] with two more columns: each row's
    /// paired ratio with its 95% bootstrap interval, and what the interval
    /// says. What `vmm sched-bench` and `vmm bench` print.
    pub fn render_paired_table(&self) -> String {
        self.render(true)
    }

    fn render(&self, with_paired: bool) -> String {
        let mut s = String::new();
        let h = &self.header;
        let emulated = if h.host_cpus < h.cpus {
            format!(" emulated on {} host CPUs", h.host_cpus)
        } else {
            String::new()
        };
        let better = if h.higher_is_better {
            "higher"
        } else {
            "lower"
        };
        let _ = writeln!(
            s,
            "{} on {} ({} CPUs{emulated}), {} x {:.1} s per variant; metric {} [{}], {better} is better",
            h.workload, h.topology, h.cpus, self.repetitions, h.duration_s,
            h.metric, h.unit,
        );
        let head = format!(
            "{:<28} {:>14} {:>10} {:>9} {:>17} {:>10}  ",
            "mitigations", "mean", "stddev", "relative", "min-max", "ns/sched"
        );
        if with_paired {
            let _ = writeln!(
                s,
                "{head}{:<12}  {:>22}  paired",
                "effect", "paired [95% CI]"
            );
        } else {
            let _ = writeln!(s, "{head}effect");
        }
        for r in &self.rows {
            let per_call = if r.sched_ns_per_call.is_finite() {
                format!("{:.0}", r.sched_ns_per_call)
            } else {
                "-".into()
            };
            let line = format!(
                "{:<28} {:>14.3} {:>10.3} {:>8.1}% {:>7.1}%-{:>6.1}% {:>10}  ",
                r.mitigations,
                r.mean,
                r.stddev,
                r.relative_pct,
                r.relative_min_pct,
                r.relative_max_pct,
                per_call,
            );
            if with_paired {
                let (ratio, word) = match &r.paired {
                    Some(p) => (p.render(), p.verdict.label()),
                    None => ("-".into(), "-"),
                };
                let _ = writeln!(s, "{line}{:<12}  {ratio:>22}  {word}", r.verdict.label());
            } else {
                let _ = writeln!(s, "{line}{}", r.verdict.label());
            }
        }
        let _ = writeln!(
            s,
            "noise band (A/A, with 100%): {:.1}%-{:.1}%; an effect whose min-max overlaps it is within noise",
            self.noise_band_pct.0, self.noise_band_pct.1
        );
        if with_paired {
            let _ = writeln!(
                s,
                "paired: geometric mean of the per-repetition ratios, 95% bootstrap interval \
                 ({} resamples, fixed seed); better or worse only when the interval excludes 100%",
                paired::RESAMPLES
            );
        }
        s
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    fn kinds(labels: &[(&str, RowKind)]) -> Vec<(String, RowKind)> {
        labels.iter().map(|(l, k)| (l.to_string(), *k)).collect()
    }

    fn header(higher_is_better: bool) -> ComparisonHeader {
        ComparisonHeader {
            workload: "w".into(),
            topology: "t".into(),
            cpus: 2,
            host_cpus: 2,
            metric: "m".into(),
            unit: "u".into(),
            higher_is_better,
            duration_s: 1.0,
        }
    }

    #[test]
    fn stats_helpers() {
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
        assert!((stddev(&[1.0, 2.0, 3.0]) - 1.0).abs() < 1e-12);
        assert_eq!(stddev(&[5.0]), 0.0);
    }

    #[test]
    fn interleaving_rotates_the_start() {
        let order: Vec<_> = interleaved(3, 2).collect();
        assert_eq!(order, vec![(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0)]);
        assert_eq!(interleaved(0, 3).count(), 0);
    }

    #[test]
    fn cells_put_the_aa_row_second() {
        let v = Mitigations::seeds_variants();
        let c = cells(&v).unwrap();
        assert_eq!(c.len(), v.len() + 1);
        assert_eq!((c[0].kind, c[0].mitigations), (RowKind::Baseline, v[0]));
        assert_eq!((c[1].kind, c[1].mitigations), (RowKind::AA, v[0]));
        assert_eq!(c[1].label, format!("{}{AA_SUFFIX}", v[0]));
        for (cell, m) in c[2..].iter().zip(&v[1..]) {
            assert_eq!((cell.kind, cell.mitigations), (RowKind::Variant, *m));
        }
        assert!(cells(&[]).is_err());
    }

    #[test]
    fn rows_are_oriented_so_that_above_100_is_better() {
        let k = kinds(&[("none", RowKind::Baseline), ("all", RowKind::Variant)]);
        // latencies: the second set halves them
        let (r, band) = rows(&k, &[vec![10.0, 20.0], vec![5.0, 10.0]], &[1.0, 2.0], false);
        assert_eq!(r[0].relative_pct, 100.0);
        assert_eq!(r[1].relative_pct, 200.0);
        assert_eq!(
            (r[1].relative_min_pct, r[1].relative_max_pct),
            (200.0, 200.0)
        );
        assert_eq!(r[1].sched_ns_per_call, 2.0);
        // no A/A row: the band is 100% alone, and 200% is better
        assert_eq!(band, (100.0, 100.0));
        assert_eq!(r[1].verdict, Verdict::Better);
        // throughputs: a zero is 0%, a zero baseline has no ratio and does
        // not count in the range
        let (r, _) = rows(&k, &[vec![4.0, 0.0], vec![0.0, 3.0]], &[], true);
        assert_eq!(r[1].relative_min_pct, 0.0);
        assert_eq!(r[1].relative_max_pct, 0.0);
        assert_eq!(r[1].relative_pct, 75.0);
    }

    #[test]
    fn an_effect_inside_the_aa_spread_is_noise_and_one_outside_is_not() {
        let k = kinds(&[
            ("none", RowKind::Baseline),
            ("none (A/A)", RowKind::AA),
            ("a", RowKind::Variant),
            ("b", RowKind::Variant),
            ("c", RowKind::Variant),
        ]);
        // throughput; A/A per repetition: 90%, 110% -> band 90-110
        let values = [
            vec![100.0, 100.0],
            vec![90.0, 110.0],
            vec![105.0, 125.0], // 105-125: overlaps the band
            vec![115.0, 130.0], // 115-130: above
            vec![50.0, 80.0],   // 50-80: below
        ];
        let c = Comparison::assemble(header(true), &k, &values, &[]).unwrap();
        assert_eq!(c.noise_band_pct, (90.0, 110.0));
        let v: Vec<Verdict> = c.rows.iter().map(|r| r.verdict).collect();
        assert_eq!(
            v,
            [
                Verdict::Baseline,
                Verdict::NoiseFloor,
                Verdict::WithinNoise,
                Verdict::Better,
                Verdict::Worse
            ]
        );
        assert!(c.rows[2].within_noise && !c.rows[3].within_noise);
        let t = c.render_table();
        assert!(
            t.contains("within noise") && t.contains("90.0%-110.0%"),
            "{t}"
        );
        // the band always holds 100%: an A/A row that came out 103-105%
        // still makes a 99-102% variant noise
        let values = [
            vec![100.0, 100.0],
            vec![103.0, 105.0],
            vec![99.0, 102.0],
            vec![99.0, 99.5],
            vec![106.0, 107.0],
        ];
        let c = Comparison::assemble(header(true), &k, &values, &[]).unwrap();
        assert_eq!(c.noise_band_pct, (100.0, 105.0));
        assert_eq!(c.rows[2].verdict, Verdict::WithinNoise);
        assert_eq!(c.rows[3].verdict, Verdict::Worse);
        assert_eq!(c.rows[4].verdict, Verdict::Better);
    }

    #[test]
    fn a_row_that_wins_every_pair_is_within_noise_by_the_band_but_not_paired() {
        use paired::PairedVerdict;
        let k = kinds(&[
            ("all", RowKind::Baseline),
            ("all (A/A)", RowKind::AA),
            ("host 1:1", RowKind::Peer),
        ]);
        // s per 100k messages, lower is better: the A/A row strays to 97%
        // and 101.2% (band 97-101.2%); the host is faster in every
        // repetition (101-105%), but its 101% repetition overlaps the band
        let base = [1.00, 1.20, 1.10, 1.30, 1.00];
        let aa = [1.00 / 0.97, 1.20 / 1.012, 1.10, 1.30, 1.00];
        let ratios = [103.0, 101.0, 104.0, 105.0, 103.5];
        let host: Vec<f64> = base
            .iter()
            .zip(ratios)
            .map(|(b, r)| b * 100.0 / r)
            .collect();
        let c = Comparison::assemble(header(false), &k, &[base.to_vec(), aa.to_vec(), host], &[])
            .unwrap();
        assert!(
            (c.noise_band_pct.0 - 97.0).abs() < 1e-9,
            "{:?}",
            c.noise_band_pct
        );
        let h = &c.rows[2];
        assert_eq!(h.verdict, Verdict::WithinNoise);
        let p = h.paired.expect("a paired reading");
        assert_eq!(p.pairs, 5);
        let gm = ratios.iter().map(|r| r.ln()).sum::<f64>() / 5.0;
        assert!((p.ratio_pct - gm.exp()).abs() < 1e-9, "{p:?}");
        assert!(p.ci95_pct.0 > 100.0, "{p:?}");
        assert_eq!(p.verdict, PairedVerdict::Better);
        // the baseline has no paired reading; the A/A row has one
        assert!(c.rows[0].paired.is_none());
        assert!(c.rows[1].paired.is_some());
        // the band-only table is unchanged; the paired one adds the column
        let band = c.render_table();
        assert!(!band.contains("paired"), "{band}");
        let t = c.render_paired_table();
        let line = t.lines().find(|l| l.starts_with("host 1:1")).unwrap();
        assert!(
            line.contains("within noise") && line.ends_with(" better"),
            "{t}"
        );
        assert!(line.contains(&p.render()), "{t}");
        assert!(t.contains("paired: geometric mean"), "{t}");
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["rows"][2]["paired"]["verdict"], "better");
        assert!(json["rows"][0]["paired"].is_null());
    }

    #[test]
    fn the_relative_mean_lies_inside_the_per_repetition_range() {
        // ratio of means is a weighted mean of per-repetition ratios
        let k = kinds(&[("none", RowKind::Baseline), ("x", RowKind::Variant)]);
        for hib in [true, false] {
            let (r, _) = rows(&k, &[vec![1.0, 10.0, 3.0], vec![2.0, 9.0, 7.0]], &[], hib);
            let r = &r[1];
            assert!(
                r.relative_min_pct <= r.relative_pct + 1e-9
                    && r.relative_pct <= r.relative_max_pct + 1e-9,
                "{r:?}"
            );
        }
    }

    #[test]
    fn a_run_that_measured_nothing_is_an_error() {
        let k = kinds(&[("none", RowKind::Baseline), ("x", RowKind::Variant)]);
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let e = Comparison::assemble(header(true), &k, &[vec![1.0], vec![bad]], &[])
                .unwrap_err()
                .to_string();
            assert!(e.contains("'x'") && e.contains("no usable m"), "{e}");
        }
        assert!(Comparison::assemble(header(true), &k, &[vec![1.0]], &[]).is_err());
    }
}
