//! Criterion's saved runs of several named passes, side by side: the raw
//! data of an A/B, and its table (`scripts/sync-layer-ab.sh`).
//!
//! WHAT: [`collect`] reads, for every benchmark under a criterion home and
//! every pass (a `--save-baseline` name), the per-sample data
//! (`sample.json`: iterations and total ns per sample) and the estimates
//! (`estimates.json`: mean, median, standard deviation and, for linear
//! sampling, the slope, each with its confidence interval). [`table`]
//! renders them: each pass's estimate per iteration, the spread between
//! the passes of one build (the A/A) and each other build against it.
//! WHY: the committed record must hold what criterion measured, not only
//! ratios computed from it.
//! HOW: passes are named `BUILD-N` (`prod-1`, `twin-1`, `prod-2`, ...);
//! the first build named is the reference.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// Every benchmark under `home` with data for at least one of `passes`:
/// `{ full_id: { pass: { iters, times_ns, estimates } } }`.
pub fn collect(home: &Path, passes: &[String]) -> Value {
    let mut out = BTreeMap::new();
    for bench in bench_dirs(home) {
        let Some(id) = passes
            .iter()
            .find_map(|p| read(&bench.join(p).join("benchmark.json")))
            .and_then(|b| b["full_id"].as_str().map(str::to_string))
        else {
            continue;
        };
        let mut per = serde_json::Map::new();
        for p in passes {
            let dir = bench.join(p);
            let (Some(s), Some(e)) = (
                read(&dir.join("sample.json")),
                read(&dir.join("estimates.json")),
            ) else {
                continue;
            };
            let keep = |k: &str| {
                e.get(k).filter(|v| v.is_object()).map(|v| {
                    json!({
                        "point_ns": v["point_estimate"],
                        "ci_lo_ns": v["confidence_interval"]["lower_bound"],
                        "ci_hi_ns": v["confidence_interval"]["upper_bound"],
                        "ci_level": v["confidence_interval"]["confidence_level"],
                    })
                })
            };
            let est: serde_json::Map<String, Value> = ["mean", "median", "std_dev", "slope"]
                .into_iter()
                .filter_map(|k| keep(k).map(|v| (k.to_string(), v)))
                .collect();
            per.insert(
                p.clone(),
                json!({
                    "sampling_mode": s["sampling_mode"],
                    "iters": s["iters"],
                    "times_ns": s["times"],
                    "estimates": est,
                }),
            );
        }
        if !per.is_empty() {
            out.insert(id, Value::Object(per));
        }
    }
    serde_json::to_value(out).unwrap_or(Value::Null)
}

/// The directories under `home` that hold one benchmark's runs (those
/// with a `benchmark.json` in some pass), sorted.
fn bench_dirs(home: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![home.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.join("benchmark.json").is_file() {
                // a pass directory: its parent is the benchmark
                if let Some(parent) = p.parent() {
                    found.push(parent.to_path_buf());
                }
            } else if p.is_dir() && p.file_name().is_some_and(|n| n != "report") {
                stack.push(p);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

fn read(p: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// A pass's time per iteration: criterion's slope (linear sampling) or
/// mean, point estimate in ns.
pub fn point(pass: &Value) -> Option<f64> {
    let e = &pass["estimates"];
    let m = if e["slope"].is_object() {
        &e["slope"]
    } else {
        &e["mean"]
    };
    m["point_ns"].as_f64()
}

/// The markdown table of [`collect`]'s data: one row per benchmark, one
/// column per pass, then the reference build's A/A spread ((max - min) /
/// min of its passes) and every other build's mean over the reference's
/// mean, marked `*` where all its passes lie outside the reference's.
pub fn table(data: &Value, passes: &[String]) -> String {
    let build = |p: &str| p.rsplit_once('-').map_or(p, |(b, _)| b).to_string();
    let mut builds: Vec<String> = Vec::new();
    for p in passes {
        if !builds.contains(&build(p)) {
            builds.push(build(p));
        }
    }
    let reference = builds[0].clone();
    let mut s = format!("| bench | {} | {reference} A/A |", passes.join(" | "));
    for b in &builds[1..] {
        s += &format!(" {b}/{reference} |");
    }
    s += &format!("\n|---|{}---|", "---|".repeat(passes.len()));
    s += &"---|".repeat(builds.len() - 1);
    s.push('\n');
    let Some(rows) = data.as_object() else {
        return s;
    };
    for (id, per) in rows {
        let of = |b: &str| -> Vec<f64> {
            passes
                .iter()
                .filter(|p| build(p) == b)
                .filter_map(|p| point(&per[p.as_str()]))
                .collect()
        };
        s += &format!("| {id} |");
        for p in passes {
            s += &match point(&per[p.as_str()]) {
                Some(v) => format!(" {} |", ns(v)),
                None => " - |".to_string(),
            };
        }
        let r = of(&reference);
        let (lo, hi) = (
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(0.0, f64::max),
        );
        s += &format!(" {:.1}% |", 100.0 * (hi / lo - 1.0));
        let rmean = r.iter().sum::<f64>() / r.len().max(1) as f64;
        for b in &builds[1..] {
            let v = of(b);
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            let outside = !v.is_empty() && v.iter().all(|&x| x < lo || x > hi);
            s += &format!(
                " {:.1}%{} |",
                100.0 * mean / rmean,
                if outside { " *" } else { "" }
            );
        }
        s.push('\n');
    }
    s
}

/// A time in ns, µs above 10 µs.
fn ns(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.2} µs", v / 1000.0)
    } else {
        format!("{v:.2} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(dir: &Path, id: &str, mean: f64) {
        std::fs::create_dir_all(dir).unwrap();
        let w = |f: &str, v: Value| std::fs::write(dir.join(f), v.to_string()).unwrap();
        w("benchmark.json", json!({ "full_id": id }));
        w(
            "sample.json",
            json!({ "sampling_mode": "Linear", "iters": [1.0, 2.0], "times": [mean, 2.0 * mean] }),
        );
        let e = json!({ "point_estimate": mean, "standard_error": 0.1,
            "confidence_interval": { "confidence_level": 0.95, "lower_bound": mean - 1.0, "upper_bound": mean + 1.0 } });
        w(
            "estimates.json",
            json!({ "mean": e, "median": e, "std_dev": e, "slope": e }),
        );
    }

    #[test]
    fn passes_side_by_side() {
        let home = tempfile_dir();
        let b = home.join("rto/baseline/1w");
        pass(&b.join("prod-1"), "rto/baseline/1w", 40.0);
        pass(&b.join("prod-2"), "rto/baseline/1w", 42.0);
        pass(&b.join("twin-1"), "rto/baseline/1w", 50.0);
        pass(&b.join("twin-2"), "rto/baseline/1w", 49.0);
        std::fs::create_dir_all(b.join("report")).unwrap();
        let passes: Vec<String> = ["prod-1", "twin-1", "prod-2", "twin-2"]
            .map(String::from)
            .to_vec();
        let d = collect(&home, &passes);
        let per = &d["rto/baseline/1w"];
        assert_eq!(per["prod-2"]["times_ns"][1], 84.0);
        assert_eq!(point(&per["twin-1"]), Some(50.0));
        let t = table(&d, &passes);
        assert!(
            t.starts_with("| bench | prod-1 | twin-1 | prod-2 | twin-2 | prod A/A | twin/prod |")
        );
        // A/A 42/40 = 5.0%; twin 49.5 over prod 41 = 120.7%, outside
        assert!(
            t.contains(
                "| rto/baseline/1w | 40.00 ns | 50.00 ns | 42.00 ns | 49.00 ns | 5.0% | 120.7% * |"
            ),
            "{t}"
        );
        std::fs::remove_dir_all(&home).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("benches-ab-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
