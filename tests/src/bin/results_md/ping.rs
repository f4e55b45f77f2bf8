//! The ping target's reading, from the raw round-trip files of
//! `scripts/targets-ping.sh` (`DIR/<point>-<row>-<rep>.txt`: `#` header
//! lines, then `seq ms` per reply).
//!
//! WHAT: per point (x1, x4) and percentile (p50, p99), each repetition's
//! percentile of `all` over the same percentile of the row (`all (A/A)`,
//! `host 1:1`): above 100% the row answered faster than `all`; the paired
//! reading of those ratios and the target's verdict for the host row.
//!
//! WHY: one reading for the ping table (`targets-ping.sh --table`) and the
//! summary of every target, with the same bootstrap as every other paired
//! column (`vcpu_sched::comparison::paired`), so that the two tables
//! cannot disagree.
//!
//! HOW: the percentile is the nearest rank (`ceil(q * n)`-th smallest); a
//! repetition counts only where both files exist and hold replies. A
//! verdict from fewer than 8 repetitions says so.

use std::fmt::Write as _;
use std::path::Path;

use vcpu_sched::comparison::paired::{paired, Paired, PairedVerdict};

use super::{median_spread, one_decimal};

pub const POINTS: [&str; 2] = ["x1", "x4"];
pub const PERCENTILES: [(f64, &str); 2] = [(0.5, "p50"), (0.99, "p99")];
/// (label, file stem) of the rows compared with `all`: its A/A row, the
/// host's 1:1 threads (the target), and `B`, an A/B's variant (`all` with
/// the `vmm serve` flags `targets-ping.sh`'s `B_ARGS` names, recorded in
/// the directory's `meta.txt`), where one was run.
pub const ROWS: [(&str, &str); 3] = [("all (A/A)", "all-aa"), ("host 1:1", "host"), ("B", "b")];
/// Repetitions the target asks for.
pub const WANTED_REPS: usize = 8;

/// The sorted round trips of one file, ms.
pub fn rtts(text: &str) -> Result<Vec<f64>, String> {
    let mut v = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .last()
                .and_then(|x| x.parse::<f64>().ok())
                .ok_or_else(|| format!("not a round trip: {l:?}"))
        })
        .collect::<Result<Vec<f64>, String>>()?;
    v.sort_by(f64::total_cmp);
    Ok(v)
}

/// The nearest-rank percentile of sorted values (`q` in 0..=1).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    let k = ((q * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1;
    sorted.get(k).copied().unwrap_or(f64::NAN)
}

/// One row of the ping table.
pub struct PingRow {
    pub point: &'static str,
    pub percentile: &'static str,
    pub label: &'static str,
    /// Each counted repetition's percentile, ms: `all`, then the row.
    pub all: Vec<f64>,
    pub row: Vec<f64>,
    /// `all` / row, percent.
    pub paired: Paired,
}

impl PingRow {
    /// The target's verdict (the host row), the A/B's (the B row) or the
    /// A/A row's role.
    pub fn verdict(&self) -> String {
        if self.label == ROWS[0].0 {
            return "A/A (noise floor)".into();
        }
        if self.label == ROWS[2].0 {
            return match self.paired.verdict {
                PairedVerdict::Better => "**B faster**",
                PairedVerdict::Worse => "**B slower**",
                PairedVerdict::CannotTellApart => "cannot tell apart",
                PairedVerdict::TooFewPairs => "too few pairs",
            }
            .into();
        }
        let mut v = match self.paired.verdict {
            PairedVerdict::Worse => "**met**",
            PairedVerdict::Better => "**missed**",
            PairedVerdict::CannotTellApart => "cannot tell apart",
            PairedVerdict::TooFewPairs => "too few pairs",
        }
        .to_string();
        if self.paired.pairs < WANTED_REPS {
            let _ = write!(
                v,
                " (only {} repetitions: the target asks for {WANTED_REPS})",
                self.paired.pairs
            );
        }
        v
    }
}

/// Every row with at least one repetition, for repetitions `1..=reps`.
pub fn rows(dir: &Path, reps: usize) -> Result<Vec<PingRow>, String> {
    let read = |name: String| -> Result<Option<Vec<f64>>, String> {
        let p = dir.join(name);
        if !p.is_file() {
            return Ok(None);
        }
        let t = std::fs::read_to_string(&p).map_err(|e| format!("reading {}: {e}", p.display()))?;
        let v = rtts(&t).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok((!v.is_empty()).then_some(v))
    };
    let mut out = Vec::new();
    for point in POINTS {
        for (q, qn) in PERCENTILES {
            for (label, stem) in ROWS {
                let (mut all, mut row, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
                for rep in 1..=reps {
                    let (Some(a), Some(r)) = (
                        read(format!("{point}-all-{rep}.txt"))?,
                        read(format!("{point}-{stem}-{rep}.txt"))?,
                    ) else {
                        continue;
                    };
                    let (pa, pr) = (percentile(&a, q), percentile(&r, q));
                    all.push(pa);
                    row.push(pr);
                    ratios.push(pa / pr * 100.0);
                }
                if ratios.is_empty() {
                    continue;
                }
                out.push(PingRow {
                    point,
                    percentile: qn,
                    label,
                    all,
                    row,
                    paired: paired(&ratios),
                });
            }
        }
    }
    Ok(out)
}

/// The A/A row of `r`'s point and percentile (none for the A/A row
/// itself).
pub fn aa_of<'a>(rows: &'a [PingRow], r: &PingRow) -> Option<&'a PingRow> {
    if r.label == ROWS[0].0 {
        return None;
    }
    rows.iter()
        .find(|a| a.label == ROWS[0].0 && a.point == r.point && a.percentile == r.percentile)
}

/// The ping table (`results_md --ping-table DIR [REPS]`).
pub fn table(dir: &Path, reps: usize) -> Result<String, String> {
    let mut s = String::from(
        "| point | percentile | `all`, ms: median (min-max) | row | row, ms: median (min-max) | \
         paired `all` / row [95% CI] | reps | verdict |\n|---|---|---:|---|---:|---:|---:|---|\n",
    );
    let rows = rows(dir, reps)?;
    for r in &rows {
        let aa = aa_of(&rows, r).map(|a| &a.paired);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.point,
            r.percentile,
            median_spread(&r.all, one_decimal),
            r.label,
            median_spread(&r.row, one_decimal),
            r.paired.render(),
            r.paired.pairs,
            super::summary::guarded(r.verdict(), aa)
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
        assert_eq!(rtts("# head\n2 5.5\n1 0.5\n\n").unwrap(), vec![0.5, 5.5]);
        assert!(rtts("1 x\n").is_err());
    }

    /// `DIR/NAME.txt`: a header and 10 round trips from `ms` up by 0.02.
    fn write_rtts(dir: &Path, name: &str, ms: f64) {
        let body: String = (1..=10)
            .map(|i| format!("{i} {}\n", ms + i as f64 * 0.02))
            .collect();
        std::fs::write(dir.join(format!("{name}.txt")), format!("# cmd\n{body}")).unwrap();
    }

    #[test]
    fn a_host_faster_in_every_repetition_misses_the_target() {
        let dir = tempfile::tempdir().unwrap();
        for rep in 1..=4 {
            let w = |stem: &str, ms: f64| write_rtts(dir.path(), &format!("x1-{stem}-{rep}"), ms);
            w("all", 20.0 + rep as f64 * 0.2);
            w("all-aa", 20.0 + (5 - rep) as f64 * 0.2);
            w("host", 18.0);
        }
        let rows = rows(dir.path(), 8).unwrap();
        // x1 only: p50 and p99, each with the A/A and the host row
        assert_eq!(rows.len(), 4);
        let host = rows
            .iter()
            .find(|r| r.label == "host 1:1" && r.percentile == "p50")
            .unwrap();
        assert_eq!(host.paired.verdict, PairedVerdict::Better);
        assert_eq!(
            host.verdict(),
            "**missed** (only 4 repetitions: the target asks for 8)"
        );
        let t = table(dir.path(), 8).unwrap();
        assert!(
            t.contains("| x1 | p50 | 20.6 (20.3-20.9) | host 1:1 | 18.1 (18.1-18.1) | "),
            "{t}"
        );
        assert!(t.contains("| A/A (noise floor) |"), "{t}");
    }

    #[test]
    fn a_b_row_gets_the_ab_verdict_and_every_row_is_guarded_by_the_aa_row() {
        let dir = tempfile::tempdir().unwrap();
        for rep in 1..=8 {
            let w = |stem: &str, ms: f64| write_rtts(dir.path(), &format!("x4-{stem}-{rep}"), ms);
            w("all", 200.0 + rep as f64);
            // the A/A row far off: no verdict may stand beside it
            w("all-aa", 150.0 + rep as f64 * 0.5);
            w("b", 160.0);
            w("host", 300.0);
        }
        let rows = rows(dir.path(), 8).unwrap();
        assert_eq!(rows.len(), 6);
        let b = rows
            .iter()
            .find(|r| r.label == "B" && r.percentile == "p50")
            .unwrap();
        assert_eq!(b.verdict(), "**B faster**");
        let host = rows.iter().find(|r| r.label == "host 1:1").unwrap();
        assert_eq!(host.verdict(), "**met**");
        assert_eq!(aa_of(&rows, host).unwrap().label, "all (A/A)");
        assert_eq!(aa_of(&rows, b).unwrap().label, "all (A/A)");
        let t = table(dir.path(), 8).unwrap();
        assert!(
            t.contains("| B | 160.1 (160.1-160.1) | ")
                && t.contains(
                    "no verdict: the A/A row's interval excludes 100% (was: **B faster**)"
                ),
            "{t}"
        );
    }
}
