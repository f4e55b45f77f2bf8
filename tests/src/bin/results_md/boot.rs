//! The Linux boot target's reading, from `vmm/scripts/boot-sched.sh`'s
//! lines (`sched rep seconds wall load1`, tab-separated).
//!
//! WHAT: per repetition, the `vcpu_sched` boot's time over the `host`
//! boot's and over its A/A row's (`vcpu_sched-aa`, a second `vcpu_sched`
//! boot of the same repetition), then the paired reading of each: the
//! geometric mean with its 95% bootstrap interval, and the target's
//! verdict against a slowdown limit (1.1x for one VM, 1.0x for the total
//! time of several VMs booted at once).
//!
//! WHY: one pair of boots spreads 10-20% on this host; only the paired
//! interval, next to the same reading of `vcpu_sched` against itself, says
//! whether a limit is met. Files written before the A/A row existed (no
//! `vcpu_sched-aa` lines) still read, without an A/A reading. A `B` row
//! (`vcpu_sched-b`: `vcpu_sched` with other settings, `B_ARGS`) gets the
//! same paired reading against `vcpu_sched`, to A/B a setting on the boot.
//!
//! HOW: ratios are oriented as the comparison tables (host / vcpu_sched in
//! percent: above 100% vcpu_sched is faster) for `paired`, and printed as
//! slowdowns (the inverse). The target is met when the interval's slow end
//! is within the limit, missed when its fast end is beyond it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use vcpu_sched::comparison::paired::{paired, Paired};

use super::{median_spread, one_decimal};

/// One repetition's boot times, seconds (None: did not reach the line).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rep {
    pub host: Option<f64>,
    pub sched: Option<f64>,
    pub aa: Option<f64>,
    pub b: Option<f64>,
}

/// The paired reading of a boots file.
pub struct BootReading {
    pub reps: BTreeMap<u32, Rep>,
    /// host / vcpu_sched, percent (above 100: vcpu_sched faster).
    pub vs_host: Paired,
    /// vcpu_sched-aa / vcpu_sched, percent; `None` without A/A lines.
    pub aa: Option<Paired>,
    /// vcpu_sched-b / vcpu_sched, percent; `None` without B lines.
    pub b: Option<Paired>,
}

/// A slowdown (vcpu_sched's time over the row's) from a paired percentage.
pub fn slowdown(pct: f64) -> f64 {
    100.0 / pct
}

impl BootReading {
    /// Reads the lines of `boot-sched.sh`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut reps: BTreeMap<u32, Rep> = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let f: Vec<&str> = line.split('\t').collect();
            let (Some(sched), Some(rep), Some(secs)) = (f.first(), f.get(1), f.get(2)) else {
                return Err(format!("not a boot line: {line:?}"));
            };
            let rep: u32 = rep
                .parse()
                .map_err(|_| format!("bad repetition in {line:?}"))?;
            let secs: Option<f64> = secs.parse().ok().filter(|s: &f64| *s > 0.0);
            let e = reps.entry(rep).or_default();
            match *sched {
                "host" => e.host = secs,
                "vcpu_sched" => e.sched = secs,
                "vcpu_sched-aa" => e.aa = secs,
                "vcpu_sched-b" => e.b = secs,
                other => return Err(format!("unknown sched {other:?} in {line:?}")),
            }
        }
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => a / b * 100.0,
            _ => f64::NAN,
        };
        let vs_host: Vec<f64> = reps.values().map(|r| ratio(r.host, r.sched)).collect();
        let row = |name: &str, get: fn(&Rep) -> Option<f64>| {
            let has = text.lines().any(|l| l.starts_with(&format!("{name}\t")));
            let v: Vec<f64> = reps.values().map(|r| ratio(get(r), r.sched)).collect();
            has.then(|| paired(&v))
        };
        Ok(Self {
            vs_host: paired(&vs_host),
            aa: row("vcpu_sched-aa", |r| r.aa),
            b: row("vcpu_sched-b", |r| r.b),
            reps,
        })
    }

    /// The row against `all` in the comparison tables' orientation (above
    /// 100%: the row booted faster than `vcpu_sched`): `host` or the A/A.
    pub fn row_vs_all(&self, row: fn(&Rep) -> Option<f64>) -> Paired {
        let r: Vec<f64> = self
            .reps
            .values()
            .map(|b| match (b.sched, row(b)) {
                (Some(s), Some(x)) => s / x * 100.0,
                _ => f64::NAN,
            })
            .collect();
        paired(&r)
    }

    /// `median (min-max)` of one row's boots, seconds.
    pub fn seconds(&self, row: fn(&Rep) -> Option<f64>) -> String {
        let v: Vec<f64> = self.reps.values().filter_map(row).collect();
        median_spread(&v, one_decimal)
    }

    /// The target's verdict for a slowdown `limit` (1.1: at most 1.1x the
    /// host's time).
    pub fn verdict(&self, limit: f64) -> &'static str {
        let p = &self.vs_host;
        if !p.ci95_pct.0.is_finite() {
            return "too few pairs";
        }
        // slowdowns: the interval's slow end is the low percentage
        let (fast, slow) = (slowdown(p.ci95_pct.1), slowdown(p.ci95_pct.0));
        if slow <= limit {
            "**met**"
        } else if fast > limit {
            "**missed**"
        } else {
            "cannot tell"
        }
    }

    /// `1.234x [1.200-1.270]`, the slowdown and its interval.
    pub fn render(p: &Paired) -> String {
        if !p.ci95_pct.0.is_finite() {
            return format!("{:.3}x ({} pairs)", slowdown(p.ratio_pct), p.pairs);
        }
        format!(
            "{:.3}x [{:.3}-{:.3}]",
            slowdown(p.ratio_pct),
            slowdown(p.ci95_pct.1),
            slowdown(p.ci95_pct.0)
        )
    }
}

/// The report `results_md --boot-pairs BOOTS.tsv [LIMIT]` prints.
pub fn report(text: &str, limit: f64) -> Result<String, String> {
    let r = BootReading::parse(text)?;
    let mut out =
        String::from("rep  host_s  vcpu_sched_s  vcpu_sched-aa_s  vcpu_sched/host  vcpu_sched/aa");
    out.push_str(if r.b.is_some() {
        "  vcpu_sched-b_s  vcpu_sched/b\n"
    } else {
        "\n"
    });
    let show = |x: Option<f64>| x.map_or("NA".to_string(), |s| format!("{s:.2}"));
    for (rep, b) in &r.reps {
        let q = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.3}x", a / b),
            _ => "-".into(),
        };
        let _ = write!(
            out,
            "{rep:3}  {:>6}  {:>12}  {:>15}  {:>15}  {:>13}",
            show(b.host),
            show(b.sched),
            show(b.aa),
            q(b.sched, b.host),
            q(b.sched, b.aa),
        );
        if r.b.is_some() {
            let _ = write!(out, "  {:>14}  {:>12}", show(b.b), q(b.sched, b.b));
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "pairs {}: vcpu_sched takes {} the host's time (paired: {})",
        r.vs_host.pairs,
        BootReading::render(&r.vs_host),
        r.vs_host.verdict.label()
    );
    match &r.aa {
        Some(a) => {
            let _ = writeln!(
                out,
                "A/A, pairs {}: vcpu_sched takes {} its A/A row's time (paired: {})",
                a.pairs,
                BootReading::render(a),
                a.verdict.label()
            );
        }
        None => {
            out.push_str("A/A: none in this file (written before boot-sched.sh ran an A/A row)\n")
        }
    }
    if let Some(p) = &r.b {
        let _ = writeln!(
            out,
            "B, pairs {}: vcpu_sched takes {} the B row's (vcpu_sched-b) time (paired: {})",
            p.pairs,
            BootReading::render(p),
            p.verdict.label()
        );
    }
    let _ = writeln!(
        out,
        "boots, s: host {}; vcpu_sched {}; target: at most {limit:.1}x the host's time: {}",
        r.seconds(|b| b.host),
        r.seconds(|b| b.sched),
        r.verdict(limit).trim_matches('*'),
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_each_repetition_with_the_host_and_the_aa_row() {
        let text = "host\t1\t10.0\t10.1\t1\nvcpu_sched\t1\t13.0\t13.1\t1\nvcpu_sched-aa\t1\t12.0\t1\t1\n\
                    host\t2\t11.0\t11.1\t1\nvcpu_sched\t2\t13.2\t13.3\t1\nvcpu_sched-aa\t2\t13.2\t1\t1\n\
                    host\t3\t10.0\t10.1\t1\nvcpu_sched\t3\tNA\t99\t1\nvcpu_sched-aa\t3\t12.0\t1\t1\n\
                    host\t4\t10.0\t10.1\t1\nvcpu_sched\t4\t12.5\t12.6\t1\nvcpu_sched-aa\t4\t13.0\t1\t1\n";
        let out = report(text, 1.1).unwrap();
        assert!(
            out.contains(
                "  1   10.00         13.00            12.00           1.300x         1.083x"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "  3   10.00            NA            12.00                -              -"
            ),
            "{out}"
        );
        // geometric mean of 1.3, 1.2, 1.25
        assert!(out.contains("pairs 3: vcpu_sched takes 1.249x ["), "{out}");
        assert!(out.contains("(paired: worse)"), "{out}");
        assert!(out.contains("A/A, pairs 3: vcpu_sched takes"), "{out}");
        // every pair is above 1.1x: missed; a limit above every pair: met
        assert!(
            out.ends_with("target: at most 1.1x the host's time: missed\n"),
            "{out}"
        );
        let r = BootReading::parse(text).unwrap();
        assert_eq!(r.verdict(1.4), "**met**");
        assert_eq!(r.verdict(1.25), "cannot tell");
        assert!(BootReading::parse("bogus line\n").is_err());
        assert!(BootReading::parse("guest\t1\t1\t1\t1\n").is_err());
    }

    #[test]
    fn a_b_row_is_paired_with_vcpu_sched_too() {
        let text = "host\t1\t10.0\t10.1\t1\nvcpu_sched\t1\t12.0\t1\t1\nvcpu_sched-b\t1\t15.0\t1\t1\n\
                    host\t2\t10.0\t10.1\t1\nvcpu_sched\t2\t12.0\t1\t1\nvcpu_sched-b\t2\tNA\t1\t1\n\
                    host\t3\t10.0\t10.1\t1\nvcpu_sched\t3\t10.0\t1\t1\nvcpu_sched-b\t3\t12.0\t1\t1\n";
        let r = BootReading::parse(text).unwrap();
        assert!(r.aa.is_none());
        let b = r.b.as_ref().unwrap();
        assert_eq!(b.pairs, 2);
        // geometric mean of 15/12 and 12/10, in percent
        assert!((b.ratio_pct - (1.25f64 * 1.2).sqrt() * 100.0).abs() < 1e-9);
        let out = report(text, 1.1).unwrap();
        assert!(out
            .lines()
            .next()
            .unwrap()
            .ends_with("vcpu_sched-b_s  vcpu_sched/b"));
        assert!(out.contains("          15.00        0.800x\n"), "{out}");
        assert!(out.contains("             NA             -\n"), "{out}");
        assert!(
            out.contains("B, pairs 2: vcpu_sched takes 0.816x (2 pairs)"),
            "{out}"
        );
        assert!(!report("host\t1\t1\t1\t1\n", 1.1)
            .unwrap()
            .contains("B, pairs"));
    }

    #[test]
    fn files_without_an_aa_row_still_read() {
        let text = "host\t1\t10.0\t10.1\t1\nvcpu_sched\t1\t13.0\t13.1\t1\n";
        let r = BootReading::parse(text).unwrap();
        assert!(r.aa.is_none());
        assert_eq!(r.verdict(1.1), "too few pairs");
        assert!(report(text, 1.1)
            .unwrap()
            .contains("A/A: none in this file"));
    }
}
