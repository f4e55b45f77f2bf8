//! Checks of the comparison JSON that every `--compare` writes (one shape
//! for `vmm sched-bench`, `vmm bench` and the simulator): rows present,
//! numbers finite and consistent, the baseline at 100%, the A/A row second,
//! and each verdict agreeing with the noise band.

use serde_json::Value;

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
    for (i, row) in rows.iter().enumerate() {
        let values: Vec<f64> = row["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|x| x.as_f64().expect("a number"))
            .collect();
        assert_eq!(values.len(), reps, "{row}");
        assert!(values.iter().all(|x| x.is_finite() && *x >= 0.0), "{row}");
        let mean = num(row, "mean");
        let vmin = values.iter().copied().fold(f64::INFINITY, f64::min);
        let vmax = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!(
            vmin - eps <= mean && mean <= vmax + eps,
            "mean in range: {row}"
        );
        assert!(num(row, "stddev") >= 0.0, "{row}");
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
