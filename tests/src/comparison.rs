//! Checks of the comparison JSON that every `--compare` writes (one shape
//! for `vmm sched-bench`, `vmm bench` and the simulator): rows present,
//! numbers finite and consistent, the baseline at 100%, the A/A row second,
//! each verdict agreeing with the noise band, and each row's paired
//! interval the one its per-repetition values give.

use serde_json::Value;
use vcpu_sched::comparison::paired::paired;
use vcpu_sched::comparison::per_repetition_ratios;

fn num(row: &Value, key: &str) -> f64 {
    let x = row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("row has no number {key}: {row}"));
    assert!(x.is_finite(), "{key} is not finite: {row}");
    x
}

/// Asserts that `v` is a well-formed comparison whose row labels are
/// exactly `labels` (the baseline first, its `(A/A)` row second) with
/// `reps` values each, and returns the rows.
pub fn check_comparison(v: &Value, labels: &[&str], reps: usize) -> Vec<Value> {
    let rows = v["rows"].as_array().expect("a rows array").clone();
    let got: Vec<&str> = rows
        .iter()
        .map(|r| r["mitigations"].as_str().expect("row label"))
        .collect();
    assert_eq!(got, labels, "row labels");
    assert_eq!(v["repetitions"].as_u64(), Some(reps as u64), "{v}");
    let band = v["noise_band_pct"].as_array().expect("noise_band_pct");
    let (lo, hi) = (band[0].as_f64().unwrap(), band[1].as_f64().unwrap());
    assert!(lo <= 100.0 && 100.0 <= hi, "the band holds 100%: {lo}-{hi}");
    let eps = 1e-6;
    let higher = v["higher_is_better"].as_bool().expect("higher_is_better");
    let values_of = |row: &Value| -> Vec<f64> {
        row["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|x| x.as_f64().expect("a number"))
            .collect()
    };
    let base = values_of(&rows[0]);
    for (i, row) in rows.iter().enumerate() {
        let values = values_of(row);
        check_paired(row, i, &per_repetition_ratios(&values, &base, higher));
        assert_eq!(values.len(), reps, "{row}");
        assert!(values.iter().all(|x| x.is_finite() && *x >= 0.0), "{row}");
        let mean = num(row, "mean");
        let vmin = values.iter().copied().fold(f64::INFINITY, f64::min);
        let vmax = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!(
            vmin - eps <= mean && mean <= vmax + eps,
            "mean in range: {row}"
        );
        // the mean and the sample standard deviation (n - 1), computed
        // here from the values the row lists
        let n = values.len() as f64;
        let m = values.iter().sum::<f64>() / n;
        assert!(
            (mean - m).abs() <= eps * m.abs().max(1.0),
            "mean of the values: {row}"
        );
        let sd = if values.len() < 2 {
            0.0
        } else {
            (values.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        };
        let got = num(row, "stddev");
        assert!(
            (got - sd).abs() <= eps * sd.max(1.0),
            "stddev {got}, the values give {sd}: {row}"
        );
        let (rel, rmin, rmax) = (
            num(row, "relative_pct"),
            num(row, "relative_min_pct"),
            num(row, "relative_max_pct"),
        );
        assert!(
            rmin - eps <= rel && rel <= rmax + eps,
            "min <= relative <= max: {row}"
        );
        let kind = row["kind"].as_str().expect("kind");
        let verdict = row["verdict"].as_str().expect("verdict");
        match i {
            0 => {
                assert_eq!((kind, verdict), ("baseline", "baseline"), "{row}");
                assert!(
                    (rel - 100.0).abs() < eps && (rmin - 100.0).abs() < eps,
                    "{row}"
                );
                assert!((rmax - 100.0).abs() < eps, "{row}");
            }
            1 => {
                assert_eq!((kind, verdict), ("aa", "noise_floor"), "{row}");
                assert_eq!(labels[1], format!("{} (A/A)", labels[0]));
                assert!(
                    lo <= rmin + eps && rmax <= hi + eps,
                    "A/A inside the band: {row}"
                );
            }
            _ => {
                let expect = if rmin > hi {
                    "better"
                } else if rmax < lo {
                    "worse"
                } else {
                    "within_noise"
                };
                assert_eq!(verdict, expect, "verdict against {lo}-{hi}: {row}");
                assert_eq!(
                    row["within_noise"].as_bool(),
                    Some(expect == "within_noise")
                );
            }
        }
    }
    rows
}

/// The row's paired reading is what its per-repetition `ratios` give, and
/// its verdict is the interval's side of 100%; the baseline (row 0) has
/// none.
fn check_paired(row: &Value, i: usize, ratios: &[f64]) {
    let p = &row["paired"];
    if i == 0 {
        assert!(p.is_null(), "the baseline has no paired reading: {row}");
        return;
    }
    let want = paired(ratios);
    assert_eq!(p["pairs"].as_u64(), Some(want.pairs as u64), "{row}");
    let verdict = p["verdict"].as_str().expect("paired verdict");
    if want.pairs < vcpu_sched::comparison::paired::MIN_PAIRS {
        assert_eq!(verdict, "too_few_pairs", "{row}");
        return;
    }
    let ci = p["ci95_pct"].as_array().expect("ci95_pct");
    let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
    let ratio = num(p, "ratio_pct");
    assert!((ratio - want.ratio_pct).abs() < 1e-9, "{row}");
    assert!(
        (lo - want.ci95_pct.0).abs() < 1e-9 && (hi - want.ci95_pct.1).abs() < 1e-9,
        "{row}"
    );
    assert!(lo <= ratio + 1e-9 && ratio <= hi + 1e-9, "{row}");
    let side = if lo > 100.0 {
        "better"
    } else if hi < 100.0 {
        "worse"
    } else {
        "cannot_tell_apart"
    };
    assert_eq!(verdict, side, "{row}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use vcpu_sched::comparison::{Comparison, ComparisonHeader, RowKind};

    fn sample() -> Value {
        let header = ComparisonHeader {
            workload: "w".into(),
            topology: "t".into(),
            cpus: 2,
            host_cpus: 2,
            metric: "m".into(),
            unit: "u".into(),
            higher_is_better: true,
            duration_s: 1.0,
        };
        let cells = [
            ("none".to_string(), RowKind::Baseline),
            ("none (A/A)".to_string(), RowKind::AA),
            ("all".to_string(), RowKind::Variant),
        ];
        // the baseline's values: mean 5, sum of squared deviations 32, so
        // the sample standard deviation is sqrt(32 / 7) = 2.13809
        let values = [
            vec![2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0],
            vec![2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0],
            vec![3.0, 5.0, 5.0, 5.0, 6.0, 6.0, 8.0, 10.0],
        ];
        let c = Comparison::assemble(header, &cells, &values, &[]).unwrap();
        serde_json::to_value(&c).unwrap()
    }

    #[test]
    fn a_wrong_stddev_or_paired_reading_is_caught() {
        let v = sample();
        assert!((v["rows"][0]["stddev"].as_f64().unwrap() - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        let rows = check_comparison(&v, &["none", "none (A/A)", "all"], 8);
        assert_eq!(rows[2]["paired"]["verdict"], "better");
        let broken = |f: &dyn Fn(&mut Value)| {
            let mut w = sample();
            f(&mut w);
            std::panic::catch_unwind(|| check_comparison(&w, &["none", "none (A/A)", "all"], 8))
                .is_err()
        };
        assert!(broken(&|w| w["rows"][0]["stddev"] = 2.0.into()));
        assert!(broken(
            &|w| w["rows"][2]["paired"]["verdict"] = "cannot_tell_apart".into()
        ));
        assert!(broken(
            &|w| w["rows"][2]["paired"]["ci95_pct"][0] = 99.0.into()
        ));
    }
}
