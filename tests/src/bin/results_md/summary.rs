//! One table of every target of `scripts/targets.sh`: the CPU workloads,
//! the virtio-blk I/O workloads, the ping round trip and the Linux boot.
//!
//! WHAT: one line per target and point: `all` (vcpu_sched, every fix) and
//! the host kernel's 1:1 threads as median (min-max) over the repetitions,
//! the host row's paired ratio against `all` and the A/A row's, the
//! repetitions, the verdict and when and from which commit it was measured.
//!
//! WHY: the targets are measured by four scripts into four directories;
//! their own tables (above this one in the doc) keep every column, and
//! this one answers "where does vcpu_sched stand against the host" at one
//! glance, rebuilt from the same raw data by the same readings.
//!
//! HOW: every ratio is oriented as the comparison tables: above 100% the
//! row did better than `all`. CPU and I/O lines read the comparison JSON
//! (`targets.rs`), ping lines the raw round trips (`ping.rs`), boot lines
//! `boots.tsv` (`boot.rs`); a boot target is a slowdown limit (1.1x the
//! host's time for one VM, 1.0x for four at once). Each directory's
//! `meta.txt` gives the date and the binary's commit. A directory not
//! there yet gives a line that says so.

use std::fmt::Write as _;
use std::path::Path;

use vcpu_sched::comparison::paired::{Paired, PairedVerdict};

use super::boot::BootReading;
use super::targets::{load, row, target, IO_WORKLOADS, POINTS, WORKLOADS};
use super::{fmt, median_spread, one_decimal, paired_of, parse_meta, text, values};

/// The boot targets: directory (relative to the doc), point, slowdown limit.
const BOOTS: [(&str, &str, f64); 2] = [
    ("data/targets-boot/vms1", "1 VM, 12 vCPUs", 1.1),
    ("data/targets-boot/vms4", "4 VMs at once, 48 vCPUs", 1.0),
];
const PING_DIR: &str = "data/targets-ping";

/// `date, commit` from `dir/meta.txt`.
fn measured(dir: &Path) -> String {
    let Ok(t) = std::fs::read_to_string(dir.join("meta.txt")) else {
        return "no meta.txt".into();
    };
    let m = parse_meta(&t);
    let date = m.get("date").map_or("?", |d| d.get(..10).unwrap_or(d));
    let commit = m.get("commit").map_or("?", |c| c.get(..7).unwrap_or(c));
    let dirty = if m.get("dirty").is_some_and(|d| d == "yes") {
        " (dirty)"
    } else {
        ""
    };
    format!("{date}, `{commit}`{dirty}")
}

/// The machine `dir/meta.txt` names, as `cpu, N CPUs, /dev/kvm: K`.
fn machine(dir: &Path) -> Option<String> {
    let t = std::fs::read_to_string(dir.join("meta.txt")).ok()?;
    let m = parse_meta(&t);
    let get = |k: &str| m.get(k).map_or("unknown", String::as_str);
    Some(format!(
        "{}, {} CPUs, Linux {}, /dev/kvm: {}",
        get("cpu"),
        get("nproc"),
        get("kernel"),
        get("kvm")
    ))
}

/// Every data directory of the summary, relative to the doc.
fn dirs() -> Vec<&'static str> {
    let mut d = vec!["data/targets", "data/targets-io", PING_DIR];
    d.extend(BOOTS.iter().map(|b| b.0));
    d
}

struct Line<'a> {
    target: String,
    point: &'a str,
    all: String,
    host: String,
    host_vs_all: Paired,
    aa: Option<Paired>,
    verdict: String,
    measured: String,
}

impl Line<'_> {
    fn render(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.target,
            self.point,
            self.all,
            self.host,
            self.host_vs_all.render(),
            self.aa.map_or("-".into(), |a| a.render()),
            self.host_vs_all.pairs,
            self.verdict,
            self.measured
        )
    }
}

/// A verdict is void when the A/A row, the same configuration against
/// itself, already reads as better or worse: the run cannot tell its own
/// noise from an effect.
pub fn guarded(verdict: String, aa: Option<&Paired>) -> String {
    match aa.map(|a| a.verdict) {
        Some(PairedVerdict::Better | PairedVerdict::Worse) => {
            format!("no verdict: the A/A row's interval excludes 100% (was: {verdict})")
        }
        _ => verdict,
    }
}

fn missing(target: &str, point: &str, rel: &str) -> String {
    format!("| {target} | {point} | - | - | - | - | 0 | not measured yet (no `{rel}/`) | - |")
}

/// The lines of one comparison-JSON directory.
fn json_lines(here: &Path, rel: &str, workloads: &[&str], out: &mut String) -> Result<(), String> {
    let dir = here.join(rel);
    for &w in workloads {
        for p in POINTS {
            let stem = format!("{w}-{p}");
            if !dir.join(format!("{stem}.json")).is_file()
                && !dir.join(format!("{stem}.json.gz")).is_file()
            {
                let _ = writeln!(out, "{}", missing(w, p, rel));
                continue;
            }
            let v = load(&dir, &stem)?;
            let ctx = |e: String| format!("{rel}/{stem}: {e}");
            let higher = v
                .get("higher_is_better")
                .and_then(serde_json::Value::as_bool)
                .ok_or_else(|| ctx("no higher_is_better".into()))?;
            let all = values(row(&v, "all").map_err(ctx)?).map_err(ctx)?;
            let host = values(row(&v, "host 1:1").map_err(ctx)?).map_err(ctx)?;
            let aa = values(row(&v, "all (A/A)").map_err(ctx)?).map_err(ctx)?;
            let h = paired_of(&host, &all, higher);
            let a = paired_of(&aa, &all, higher);
            let unit = text(&v, "unit").map_err(ctx)?;
            let line = Line {
                target: format!(
                    "{w}: `{}` ({}, {unit})",
                    text(&v, "metric").map_err(ctx)?,
                    if higher {
                        "higher is better"
                    } else {
                        "lower is better"
                    }
                ),
                point: p,
                all: median_spread(&all, fmt),
                host: median_spread(&host, fmt),
                host_vs_all: h,
                aa: Some(a),
                verdict: guarded(target(h.verdict).into(), Some(&a)),
                measured: measured(&dir),
            };
            let _ = writeln!(out, "{}", line.render());
        }
    }
    Ok(())
}

/// The ping lines: the host row of each point and percentile.
fn ping_lines(here: &Path, out: &mut String) -> Result<(), String> {
    let dir = here.join(PING_DIR);
    if !dir.is_dir() {
        let _ = writeln!(out, "{}", missing("ping round trip", "x1, x4", PING_DIR));
        return Ok(());
    }
    let rows = super::ping::rows(&dir, super::ping::WANTED_REPS)?;
    for r in rows.iter().filter(|r| r.label == "host 1:1") {
        let aa = super::ping::aa_of(&rows, r).map(|a| a.paired);
        let line = Line {
            target: format!(
                "ping round trip over virtio-net: {} (ms, lower is better)",
                r.percentile
            ),
            point: r.point,
            all: median_spread(&r.all, one_decimal),
            host: median_spread(&r.row, one_decimal),
            host_vs_all: r.paired,
            aa,
            verdict: guarded(r.verdict(), aa.as_ref()),
            measured: measured(&dir),
        };
        let _ = writeln!(out, "{}", line.render());
    }
    Ok(())
}

/// The boot lines.
fn boot_lines(here: &Path, out: &mut String) -> Result<(), String> {
    for (rel, point, limit) in BOOTS {
        let dir = here.join(rel);
        let f = dir.join("boots.tsv");
        if !f.is_file() {
            let _ = writeln!(out, "{}", missing("Linux boot", point, rel));
            continue;
        }
        let t = std::fs::read_to_string(&f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let r = BootReading::parse(&t).map_err(|e| format!("{rel}/boots.tsv: {e}"))?;
        let mut verdict = r.verdict(limit).to_string();
        if r.vs_host.pairs < super::ping::WANTED_REPS {
            let _ = write!(verdict, " (only {} repetitions)", r.vs_host.pairs);
        }
        let aa = r.aa.is_some().then(|| r.row_vs_all(|b| b.aa));
        let line = Line {
            target: format!(
                "Linux boot to the root sched domain (s, lower is better; at most {limit:.1}x the host's)"
            ),
            point,
            all: r.seconds(|b| b.sched),
            host: r.seconds(|b| b.host),
            host_vs_all: r.row_vs_all(|b| b.host),
            aa,
            verdict: guarded(verdict, aa.as_ref()),
            measured: measured(&dir),
        };
        let _ = writeln!(out, "{}", line.render());
    }
    Ok(())
}

/// The generated summary section; `here` is the doc's directory.
pub fn section(here: &Path) -> Result<String, String> {
    let mut s = String::from(
        "\n| target (unit) | point | `all` (vcpu_sched): median (min-max) | host 1:1: median (min-max) | \
         host 1:1 vs `all`: paired [95% CI] | A/A vs `all`: paired [95% CI] | reps | verdict | measured (binary) |\n\
         |---|---|---:|---:|---:|---:|---:|---|---|\n",
    );
    json_lines(here, "data/targets", &WORKLOADS, &mut s)?;
    json_lines(here, "data/targets-io", &IO_WORKLOADS, &mut s)?;
    ping_lines(here, &mut s)?;
    boot_lines(here, &mut s)?;
    s.push_str(
        "\nPaired columns: the geometric mean of each repetition's ratio of the row to the `all` \
         run of the same repetition, oriented so that above 100% the row did better than `all`, \
         with a 95% bootstrap interval. A target is met only when the host row's whole interval \
         says vcpu_sched did at least as well (for the boots: when its slow end is within the \
         limit), missed when the whole interval says the opposite; no verdict when the A/A \
         row's own interval excludes 100% (the run cannot tell its noise from an effect).",
    );
    let mut machines: Vec<String> = dirs()
        .iter()
        .filter_map(|d| machine(&here.join(d)))
        .collect();
    machines.sort();
    machines.dedup();
    match machines.as_slice() {
        [] => s.push_str(" Machine: not recorded (no `meta.txt`).\n\n"),
        [one] => {
            let _ = write!(s, " Machine (every directory's `meta.txt`): {one}.\n\n");
        }
        many => {
            let _ = write!(
                s,
                " Machines (the directories' `meta.txt` differ): {}.\n\n",
                many.join("; ")
            );
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vcpu_sched::comparison::paired::paired;

    #[test]
    fn a_moving_aa_row_voids_the_verdict() {
        let still = paired(&[99.0, 101.0, 100.5, 99.5]);
        let moving = paired(&[80.0, 82.0, 81.0, 79.0]);
        assert_eq!(guarded("**met**".into(), Some(&still)), "**met**");
        assert_eq!(guarded("**met**".into(), None), "**met**");
        assert_eq!(
            guarded("**met**".into(), Some(&moving)),
            "no verdict: the A/A row's interval excludes 100% (was: **met**)"
        );
    }

    #[test]
    fn every_target_has_a_line_measured_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("data/targets-boot/vms1");
        std::fs::create_dir_all(&boot).unwrap();
        let tsv: String = (1..=8)
            .map(|r| {
                format!(
                    "host\t{r}\t50.0\t1\t1\nvcpu_sched\t{r}\t{}\t1\t1\nvcpu_sched-aa\t{r}\t{}\t1\t1\n",
                    52.0 + f64::from(r) * 0.1,
                    52.0 + f64::from(9 - r) * 0.1
                )
            })
            .collect();
        std::fs::write(boot.join("boots.tsv"), tsv).unwrap();
        std::fs::write(
            boot.join("meta.txt"),
            "date=2026-11-28T14:00:00Z\ncommit=abcdef012345\ndirty=no\n",
        )
        .unwrap();
        let s = section(dir.path()).unwrap();
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| target"))
            .collect();
        // 8 CPU, 4 I/O, 1 ping (no directory), 2 boot
        assert_eq!(lines.len(), 15, "{s}");
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains("not measured yet"))
                .count(),
            14,
            "{s}"
        );
        let b = lines.iter().find(|l| l.contains("1 VM, 12 vCPUs")).unwrap();
        // the host is faster (above 100%), but vcpu_sched within 1.1x of it
        assert!(
            b.contains("| 52.5 (52.1-52.8) | 50.0 (50.0-50.0) | 104.9% ["),
            "{b}"
        );
        assert!(
            b.ends_with("| 8 | **met** | 2026-11-28, `abcdef0` |"),
            "{b}"
        );
        // the one directory with a meta.txt names the machine
        assert!(
            s.contains(" Machine (every directory's `meta.txt`): unknown, unknown CPUs, Linux unknown, /dev/kvm: unknown.\n"),
            "{s}"
        );
    }
}
