//! Writes the generated sections of docs/results-scheduler.md and
//! docs/results-vcpus.md from the comparison JSON that `scripts/results.sh`
//! collects (`vmm sched-bench|bench ... --compare seeds --json FILE`).
//!
//! ```text
//! results_md META DATA_DIR IN.md OUT.md [IN.md OUT.md ...]
//! results_md --targets IN.md OUT.md
//! results_md --compact FILE.json...
//! results_md --boot-pairs BOOTS.tsv [LIMIT]
//! results_md --ping-table DIR [REPS]
//! ```
//!
//! META is `key=value` lines: `date`, `commit`, `dirty`, `cpu`,
//! `cpu_vendor`, `cpu_family`, `nproc`, `kernel`, `kvm` (what
//! `scripts/machine-meta.sh` prints), `mode`, and `cmd.NAME` (the exact command that wrote
//! `DATA_DIR/NAME.json`). In each markdown file, the text between
//! `<!-- results:begin NAME -->` and `<!-- results:end -->` is replaced:
//! `NAME` = `machine` by the date, commit and machine of the run, any other
//! by the command, a link to its raw JSON (`data/NAME.json`, relative to
//! the doc) and the table. Everything outside the markers is kept.
//!
//! Each table has two verdicts: the band rule (a row whose per-repetition
//! min-max overlaps the A/A row's is within noise) and the paired one,
//! computed here from the raw per-repetition values (so JSON written before
//! it existed gets it too): the geometric mean of each repetition's ratio to
//! the baseline run of the same repetition, with a 95% bootstrap interval
//! (`vcpu_sched::comparison::paired`); better or worse only when the
//! interval excludes 100%.
//!
//! `--boot-pairs` reads `vmm/scripts/boot-sched.sh`'s lines and prints
//! each repetition's slowdowns against the host and the A/A row, their
//! paired readings and the target's verdict for a slowdown LIMIT (default
//! 1.1): see `boot.rs`.
//!
//! `--ping-table` prints the ping target's table from the raw round trips
//! of `scripts/targets-ping.sh` in DIR (REPS repetitions, default 8): see
//! `ping.rs`.
//!
//! `--targets` fills `<!-- targets:begin DIR -->` ... `<!-- targets:end -->`
//! with the Targets table from the `scripts/targets.sh` runs in `DIR`
//! (relative to the doc): see `targets.rs`; `<!-- targets:begin summary
//! -->` gets one table of every target: see `summary.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;
use vcpu_sched::comparison::paired::{paired, Paired};
use vcpu_sched::comparison::per_repetition_ratios;

// beside this file, not in src/bin/ (where they would be binaries of their own)
#[path = "results_md/boot.rs"]
mod boot;
#[path = "results_md/ping.rs"]
mod ping;
#[path = "results_md/summary.rs"]
mod summary;
#[path = "results_md/targets.rs"]
mod targets;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--compact") {
        return match args[1..].iter().try_for_each(|f| compact(Path::new(f))) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some("--boot-pairs") {
        let limit = match args.get(2).map(|l| l.parse::<f64>()) {
            None => 1.1,
            Some(Ok(l)) if l > 0.0 => l,
            Some(_) => {
                eprintln!(
                    "--boot-pairs: LIMIT {:?} is not a slowdown such as 1.1",
                    args[2]
                );
                return ExitCode::from(2);
            }
        };
        let read = |f: &String| {
            std::fs::read_to_string(f)
                .map_err(|e| format!("{f}: {e}"))
                .and_then(|t| boot::report(&t, limit).map_err(|e| format!("{f}: {e}")))
        };
        return match args.get(1).map(read) {
            Some(Ok(s)) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Some(Err(e)) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
            None => {
                eprintln!("usage: results_md --boot-pairs BOOTS.tsv [LIMIT]");
                ExitCode::from(2)
            }
        };
    }
    if args.first().map(String::as_str) == Some("--ping-table") {
        let reps = match args.get(2).map(|r| r.parse::<usize>()) {
            None => ping::WANTED_REPS,
            Some(Ok(r)) if r > 0 => r,
            Some(_) => {
                eprintln!(
                    "--ping-table: REPS {:?} is not a count of repetitions",
                    args[2]
                );
                return ExitCode::from(2);
            }
        };
        let Some(dir) = args.get(1) else {
            eprintln!("usage: results_md --ping-table DIR [REPS]");
            return ExitCode::from(2);
        };
        return match ping::table(Path::new(dir), reps) {
            Ok(t) => {
                print!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.first().map(String::as_str) == Some("--targets") {
        if args.len() != 3 {
            eprintln!("usage: results_md --targets IN.md OUT.md");
            return ExitCode::from(2);
        }
        return match targets::fill_doc(Path::new(&args[1]), Path::new(&args[2])) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.len() < 4 || args.len() % 2 != 0 {
        eprintln!("usage: results_md META DATA_DIR IN.md OUT.md [IN.md OUT.md ...]");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Rewrites a raw comparison JSON as compact JSON without the histograms'
/// bucket lists (`values` next to `significant_digits`): every metric,
/// per-repetition value, counter and quantile stays; the buckets of every
/// latency histogram of every vCPU of every run made the files hundreds of
/// MB.
fn compact(path: &Path) -> Result<(), String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    drop_buckets(&mut v);
    let out = serde_json::to_string(&v).map_err(|e| e.to_string())?;
    std::fs::write(path, out + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
}

fn drop_buckets(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if m.contains_key("significant_digits") {
                m.remove("values");
            }
            m.values_mut().for_each(drop_buckets);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(drop_buckets),
        _ => {}
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let meta_text =
        std::fs::read_to_string(&args[0]).map_err(|e| format!("reading {}: {e}", args[0]))?;
    let meta = parse_meta(&meta_text);
    let data = Path::new(&args[1]);
    for pair in args[2..].chunks(2) {
        let text =
            std::fs::read_to_string(&pair[0]).map_err(|e| format!("reading {}: {e}", pair[0]))?;
        let out = fill(&text, "results", &|name| section(name, &meta, data))
            .map_err(|e| format!("{}: {e}", pair[0]))?;
        std::fs::write(&pair[1], out).map_err(|e| format!("writing {}: {e}", pair[1]))?;
    }
    Ok(())
}

fn parse_meta(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Replaces every section of `text` marked `<!-- TAG:begin NAME -->` ...
/// `<!-- TAG:end -->` by `gen(NAME)`.
fn fill(
    text: &str,
    tag: &str,
    gen: &dyn Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    let begin = format!("<!-- {tag}:begin ");
    let end = format!("<!-- {tag}:end -->");
    let mut out = String::new();
    let mut rest = text;
    while let Some(b) = rest.find(&begin) {
        let after = &rest[b + begin.len()..];
        let close = after
            .find("-->")
            .ok_or_else(|| format!("unterminated {tag}:begin marker"))?;
        let name = after[..close].trim();
        let body_start = b + begin.len() + close + 3;
        let e = rest[body_start..]
            .find(&end)
            .ok_or_else(|| format!("no {end} after {tag}:begin {name}"))?;
        if rest[body_start..body_start + e].contains(&begin) {
            return Err(format!(
                "{tag}:begin {name} has no {end} before the next begin"
            ));
        }
        out.push_str(&rest[..body_start]);
        out.push('\n');
        out.push_str(&gen(name)?);
        out.push_str(&end);
        rest = &rest[body_start + e + end.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

fn get<'a>(meta: &'a BTreeMap<String, String>, k: &str) -> &'a str {
    meta.get(k).map(String::as_str).unwrap_or("unknown")
}

fn section(name: &str, meta: &BTreeMap<String, String>, data: &Path) -> Result<String, String> {
    if name == "machine" {
        return Ok(machine(meta));
    }
    let path = data.join(format!("{name}.json"));
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    let cmd = meta
        .get(&format!("cmd.{name}"))
        .ok_or_else(|| format!("no cmd.{name} in the meta file"))?;
    table(name, cmd, &v).map_err(|e| format!("{}: {e}", path.display()))
}

fn machine(meta: &BTreeMap<String, String>) -> String {
    let dirty = if get(meta, "dirty") == "yes" {
        " with uncommitted changes"
    } else {
        ""
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Generated by `scripts/results.sh`{} on {} (UTC) at commit `{}`{dirty}.",
        if get(meta, "mode") == "small" {
            " --small (tiny runs: a test of the script, not results)"
        } else {
            ""
        },
        get(meta, "date"),
        get(meta, "commit"),
    );
    // lscpu's vendor and family, where the run recorded them
    let family = match (meta.get("cpu_vendor"), meta.get("cpu_family")) {
        (Some(v), Some(f)) if !v.is_empty() && !f.is_empty() => format!(" ({v}, family {f})"),
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "Machine: `{}`{family}, {} CPUs, Linux {}, /dev/kvm: {}. Raw data and this \
         metadata: [`data/results-meta.txt`](data/results-meta.txt).",
        get(meta, "cpu"),
        get(meta, "nproc"),
        get(meta, "kernel"),
        get(meta, "kvm"),
    );
    s
}

fn num(v: &Value, k: &str) -> Result<f64, String> {
    match v.get(k) {
        Some(Value::Null) => Ok(f64::NAN),
        Some(x) => x.as_f64().ok_or_else(|| format!("{k} is not a number")),
        None => Err(format!("no {k}")),
    }
}

fn text<'a>(v: &'a Value, k: &str) -> Result<&'a str, String> {
    v.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("no string {k}"))
}

/// A value with about 4 significant digits, no exponent.
fn fmt(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a >= 1000.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// `median (min-max)` of some values, each shown by `show`; `-` for none.
fn median_spread(xs: &[f64], show: fn(f64) -> String) -> String {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return "-".into();
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    format!("{} ({}-{})", show(med), show(v[0]), show(v[n - 1]))
}

/// One decimal.
fn one_decimal(x: f64) -> String {
    format!("{x:.1}")
}

/// What the metric is, and whether it was measured or derived.
fn metric_note(metric: &str) -> &'static str {
    match metric {
        "p99_wakeup_latency" => {
            "measured: the 99th percentile of wakeup latency (timer due -> task or vCPU running) over the run's window"
        }
        "time_per_100k_messages" => {
            "derived: 100000 / (messages counted in the window / window length), i.e. from the measured message rate"
        }
        "messages_per_s" => "measured: messages counted in the window / window length",
        "requests_per_s" => "measured: requests answered in the window / window length",
        "frames_per_s" => "measured: frames finished in the window / window length",
        _ => "as the JSON's metric",
    }
}

/// How the paired columns are read, after each table.
const PAIRED_NOTE: &str = "Paired: the geometric mean of each repetition's ratio to the \
    baseline run of the same repetition, with a 95% bootstrap interval (10,000 resamples, \
    fixed seed); better or worse only when the interval excludes 100% (with 3 repetitions, \
    only when all 3 agree).";

/// A row's per-repetition values.
fn values(row: &Value) -> Result<Vec<f64>, String> {
    row.get("values")
        .and_then(Value::as_array)
        .ok_or("a row has no values")?
        .iter()
        .map(|x| {
            x.as_f64()
                .ok_or_else(|| "a value is not a number".to_string())
        })
        .collect()
}

/// The paired reading of `vals` against the baseline's `base`.
fn paired_of(vals: &[f64], base: &[f64], higher_is_better: bool) -> Paired {
    paired(&per_repetition_ratios(vals, base, higher_is_better))
}

fn table(name: &str, cmd: &str, v: &Value) -> Result<String, String> {
    let workload = text(v, "workload")?;
    let topology = text(v, "topology")?;
    let cpus = num(v, "cpus")?;
    let metric = text(v, "metric")?;
    let unit = text(v, "unit")?;
    let higher = v
        .get("higher_is_better")
        .and_then(Value::as_bool)
        .ok_or("no higher_is_better")?;
    let reps = num(v, "repetitions")?;
    let dur = num(v, "duration_s")?;
    let band = v
        .get("noise_band_pct")
        .and_then(Value::as_array)
        .ok_or("no noise_band_pct")?;
    let (lo, hi) = (
        band.first().and_then(Value::as_f64).unwrap_or(f64::NAN),
        band.get(1).and_then(Value::as_f64).unwrap_or(f64::NAN),
    );
    let rows = v.get("rows").and_then(Value::as_array).ok_or("no rows")?;
    if rows.is_empty() {
        return Err("no rows".into());
    }
    let vms = match (v.get("vms"), v.get("vcpus")) {
        (Some(a), Some(b)) => format!(", {a} VMs x {b} vCPUs"),
        _ => String::new(),
    };
    let mut s = String::new();
    let _ = writeln!(s, "\n```sh\n{cmd}\n```\n");
    let _ = writeln!(
        s,
        "{workload} on {topology} ({cpus} CPUs){vms}, {reps} x {dur} s per row, rows interleaved; \
         metric `{metric}` [{unit}], {} is better ({}). Raw data: [`data/{name}.json`](data/{name}.json).\n",
        if higher { "higher" } else { "lower" },
        metric_note(metric),
    );
    let _ = writeln!(
        s,
        "| mitigations | mean | stddev | relative | min-max | band rule | paired [95% CI] | paired | ns/schedule |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---|---:|---|---:|");
    let base = values(&rows[0])?;
    for (i, r) in rows.iter().enumerate() {
        let label = text(r, "mitigations")?;
        let verdict = match text(r, "verdict")? {
            "noise_floor" => "A/A (noise floor)",
            "within_noise" => "within noise",
            "unknown" => "no ratio",
            other => other,
        };
        let per_call = num(r, "sched_ns_per_call")?;
        let (ratio, word) = if i == 0 {
            ("-".to_string(), "-")
        } else {
            let p = paired_of(&values(r)?, &base, higher);
            (p.render(), p.verdict.label())
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {:.1}% | {:.1}-{:.1}% | {verdict} | {ratio} | {word} | {} |",
            fmt(num(r, "mean")?),
            fmt(num(r, "stddev")?),
            num(r, "relative_pct")?,
            num(r, "relative_min_pct")?,
            num(r, "relative_max_pct")?,
            if per_call.is_finite() && per_call > 0.0 {
                format!("{per_call:.0}")
            } else {
                "-".into()
            },
        );
    }
    let _ = writeln!(
        s,
        "\nNoise band (the A/A row's per-repetition range, with 100%): {lo:.1}-{hi:.1}%; \
         a row whose min-max overlaps it is within noise. {PAIRED_NOTE}\n"
    );
    Ok(s)
}

/// The paired reading of `boot-sched.sh`'s output (see the module doc).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacting_drops_only_histogram_buckets() {
        let mut v = serde_json::json!({
            "rows": [{"values": [1.0, 2.0], "mean": 1.5}],
            "h": {"significant_digits": 3, "p99": 7, "values": [[1, 2]]},
        });
        drop_buckets(&mut v);
        assert_eq!(v["rows"][0]["values"], serde_json::json!([1.0, 2.0]));
        assert_eq!(v["h"]["p99"], 7);
        assert!(v["h"].get("values").is_none());
    }

    #[test]
    fn fills_only_between_markers() {
        let doc = "intro\n<!-- results:begin a -->\nold\n<!-- results:end -->\nprose\n<!-- results:begin b -->\n<!-- results:end -->\nend\n";
        let out = fill(doc, "results", &|n| Ok(format!("new {n}\n"))).unwrap();
        assert_eq!(
            out,
            "intro\n<!-- results:begin a -->\nnew a\n<!-- results:end -->\nprose\n<!-- results:begin b -->\nnew b\n<!-- results:end -->\nend\n"
        );
        assert!(fill("<!-- results:begin a -->\nx", "results", &|_| Ok(
            String::new()
        ))
        .is_err());
        // another tag's markers are left alone
        assert_eq!(fill(doc, "targets", &|_| Ok(String::new())).unwrap(), doc);
    }

    #[test]
    fn names_the_machine_as_recorded() {
        let mut meta = parse_meta("date=D\ncommit=c\ndirty=no\ncpu=Intel(R) Xeon(R) Processor\nnproc=2\nkernel=k\nkvm=none\n");
        let m = machine(&meta);
        assert!(
            m.contains("Machine: `Intel(R) Xeon(R) Processor`, 2 CPUs, Linux k, /dev/kvm: none."),
            "{m}"
        );
        meta.insert("cpu_vendor".into(), "AuthenticAMD".into());
        meta.insert("cpu_family".into(), "25".into());
        meta.insert("cpu".into(), "AMD EPYC".into());
        let m = machine(&meta);
        assert!(
            m.contains("Machine: `AMD EPYC` (AuthenticAMD, family 25), 2 CPUs"),
            "{m}"
        );
    }

    #[test]
    fn renders_a_comparison() {
        let v: Value = serde_json::from_str(
            r#"{"workload":"runq","topology":"host","cpus":2,"metric":"requests_per_s","unit":"1/s",
               "higher_is_better":true,"duration_s":2.0,"repetitions":3,"noise_band_pct":[95.0,104.0],
               "rows":[{"mitigations":"none","kind":"baseline","values":[1,2,3],"mean":25000.4,"stddev":600.2,
                 "relative_pct":100.0,"relative_min_pct":100.0,"relative_max_pct":100.0,"verdict":"baseline",
                 "within_noise":false,"sched_ns_per_call":972.3},
                {"mitigations":"host 1:1","kind":"peer","values":[1.1,2.4,3.6],"mean":31341,"stddev":3637,
                 "relative_pct":125.2,"relative_min_pct":110.0,"relative_max_pct":130.0,"verdict":"better",
                 "within_noise":false,"sched_ns_per_call":null}]}"#,
        )
        .unwrap();
        let t = table("x", "vmm sched-bench runq", &v).unwrap();
        assert!(t.contains("```sh\nvmm sched-bench runq\n```"), "{t}");
        assert!(
            t.contains("| none | 25000 | 600.2 | 100.0% | 100.0-100.0% | baseline | - | - | 972 |"),
            "{t}"
        );
        // paired, by hand: ratios 110, 120, 120; geometric mean
        // (110 * 120 * 120)^(1/3) = 116.57; a resample of three 110s has
        // chance 1/27 > 2.5%, of three 120s 8/27: the interval is 110-120
        assert!(
            t.contains("| host 1:1 | 31341 | 3637 | 125.2% | 110.0-130.0% | better | 116.6% [110.0-120.0] | better | - |"),
            "{t}"
        );
        assert!(t.contains("95.0-104.0%"), "{t}");
        assert!(t.contains("[`data/x.json`](data/x.json)"), "{t}");
    }
}
