//! The six contention fixes as one switchboard.
//!
//! Each fix is a field of [`Mitigations`]. [`Mitigations::none`] is the
//! kernel's behaviour before the patches, [`Mitigations::all`] turns every
//! fix on. The string forms, used on command lines, are
//!
//! | form              | meaning                              |
//! |-------------------|--------------------------------------|
//! | `none`            | baseline                             |
//! | `all`             | every fix                            |
//! | `only:X[,Y..]`    | just the named fixes                 |
//! | `all-but:X[,Y..]` | every fix except the named ones      |
//!
//! with the short fix names of [`Fix::name`]: `cpupri`, `rto`, `shardrq`,
//! `llcidle`, `l2wake`, `grpload`. [`Display`](std::fmt::Display) writes the
//! shortest of these forms, and parsing it gives the same value back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::SchedError;

/// One fix, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fix {
    /// 1: cpupri counts and masks on separate cache lines, hot vectors padded
    /// apart, masks optionally split per NUMA node ([`crate::fixes::cpupri`]).
    CpuPri,
    /// 2: per-node RT overload count and flag, hot root-domain fields away
    /// from read-mostly ones ([`crate::fixes::rto`]).
    Rto,
    /// 3: sharded per-LLC shared runqueue ([`crate::fixes::shardrq`]).
    ShardRq,
    /// 4: per-LLC idle mask and count ([`crate::fixes::llcidle`]).
    LlcIdle,
    /// 5: direct wakeup enqueue only within an L2 ([`crate::fixes::l2wake`]).
    L2Wake,
    /// 6: per-node group load ([`crate::fixes::grpload`]).
    GrpLoad,
}

impl Fix {
    /// Every fix, in the order of the design notes.
    pub const ALL: [Fix; 6] = [
        Fix::CpuPri,
        Fix::Rto,
        Fix::ShardRq,
        Fix::LlcIdle,
        Fix::L2Wake,
        Fix::GrpLoad,
    ];

    /// The short name used in mitigation strings.
    pub fn name(self) -> &'static str {
        match self {
            Fix::CpuPri => "cpupri",
            Fix::Rto => "rto",
            Fix::ShardRq => "shardrq",
            Fix::LlcIdle => "llcidle",
            Fix::L2Wake => "l2wake",
            Fix::GrpLoad => "grpload",
        }
    }

    /// One line saying what the fix does.
    pub fn describe(self) -> &'static str {
        match self {
            Fix::CpuPri => "cpupri counts and masks on separate cache lines, per-node masks",
            Fix::Rto => "per-node RT overload count and flag",
            Fix::ShardRq => "per-LLC shared runqueue split into shards",
            Fix::LlcIdle => "per-LLC idle mask and count",
            Fix::L2Wake => "direct wakeup enqueue only when waker and target share an L2",
            Fix::GrpLoad => "per-node group load",
        }
    }
}

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fix {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, SchedError> {
        let t = s.trim();
        Fix::ALL
            .iter()
            .copied()
            .find(|f| f.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| parse_error(s, format!("{t:?} is not a fix name")))
    }
}

/// Which fixes are on. Build with [`none`](Self::none), [`all`](Self::all),
/// [`only`](Self::only), [`all_but`](Self::all_but) or by parsing a string.
///
/// Each field has its fix's name ([`Fix::name`]), as do the fix's file in
/// [`crate::fixes`] and its criterion bench. Serialized sets written before
/// that used longer field names (`cpupri_split`, ...), which still read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mitigations {
    /// Fix 1, cpupri split.
    #[serde(alias = "cpupri_split")]
    pub cpupri: bool,
    /// Fix 2, per-node RT overload tracking.
    #[serde(alias = "rto_per_node")]
    pub rto: bool,
    /// Fix 3, sharded shared runqueue.
    #[serde(alias = "sharded_shared_rq")]
    pub shardrq: bool,
    /// Fix 4, per-LLC idle tracking.
    #[serde(alias = "llc_idle")]
    pub llcidle: bool,
    /// Fix 5, L2-local direct wakeups.
    #[serde(alias = "l2_wakeup")]
    pub l2wake: bool,
    /// Fix 6, per-node group load.
    #[serde(alias = "node_group_load")]
    pub grpload: bool,
}

impl Mitigations {
    /// The baseline: the kernel's behaviour before the patches.
    pub const fn none() -> Self {
        Self {
            cpupri: false,
            rto: false,
            shardrq: false,
            llcidle: false,
            l2wake: false,
            grpload: false,
        }
    }

    /// Every fix on.
    pub const fn all() -> Self {
        Self {
            cpupri: true,
            rto: true,
            shardrq: true,
            llcidle: true,
            l2wake: true,
            grpload: true,
        }
    }

    /// Just `fix`.
    pub fn only(fix: Fix) -> Self {
        Self::none().with(fix, true)
    }

    /// Every fix but `fix`.
    pub fn all_but(fix: Fix) -> Self {
        Self::all().with(fix, false)
    }

    /// This set with `fix` turned on or off.
    pub fn with(mut self, fix: Fix, on: bool) -> Self {
        *self.field(fix) = on;
        self
    }

    /// Is `fix` on?
    pub fn has(&self, fix: Fix) -> bool {
        let mut c = *self;
        *c.field(fix)
    }

    fn field(&mut self, fix: Fix) -> &mut bool {
        match fix {
            Fix::CpuPri => &mut self.cpupri,
            Fix::Rto => &mut self.rto,
            Fix::ShardRq => &mut self.shardrq,
            Fix::LlcIdle => &mut self.llcidle,
            Fix::L2Wake => &mut self.l2wake,
            Fix::GrpLoad => &mut self.grpload,
        }
    }

    /// The fixes that are on.
    pub fn enabled(&self) -> Vec<Fix> {
        Fix::ALL.iter().copied().filter(|f| self.has(*f)).collect()
    }

    /// The comparison set of the seeds: baseline, each fix alone, and all.
    pub fn seeds_variants() -> Vec<Mitigations> {
        let mut v = vec![Self::none()];
        v.extend(Fix::ALL.iter().map(|f| Self::only(*f)));
        v.push(Self::all());
        v
    }

    /// Parses a comparison's list of sets: `seeds` ([`Self::seeds_variants`])
    /// or sets joined by `;` (`none;all`), the first the baseline, each as
    /// [`FromStr`] reads it; empty entries are skipped. A list that names no
    /// set is an error.
    pub fn parse_sets(list: &str) -> Result<Vec<Self>, SchedError> {
        if list.trim() == "seeds" {
            return Ok(Self::seeds_variants());
        }
        let n = list.split(';').filter(|s| !s.trim().is_empty()).count();
        if n > MAX_SETS {
            // every run of a comparison runs each set: a list this long is
            // a mistake (and quoting it whole would flood the terminal)
            return Err(SchedError::Mitigations {
                input: format!("{:.40}...", list),
                reason: format!(
                    "{n} sets; a comparison takes at most {MAX_SETS}, every distinct set once"
                ),
                fixes: join(&Fix::ALL).replace(',', ", "),
            });
        }
        let sets = list
            .split(';')
            .filter(|s| !s.trim().is_empty())
            .map(str::parse)
            .collect::<Result<Vec<Self>, _>>()?;
        if sets.is_empty() {
            return Err(parse_error(
                list,
                "it names no set: give seeds or sets such as \"none;all\"",
            ));
        }
        Ok(sets)
    }
}

/// The most sets one `--compare` list takes: each of the six fixes on or
/// off.
pub const MAX_SETS: usize = 1 << 6;

/// The error for a mitigation string `input` that does not parse, naming
/// the valid fix names. Here rather than in [`crate::error`], so that the
/// error module does not depend on this one.
fn parse_error(input: &str, reason: impl Into<String>) -> SchedError {
    SchedError::Mitigations {
        input: input.to_string(),
        reason: reason.into(),
        fixes: join(&Fix::ALL).replace(',', ", "),
    }
}

fn join(fixes: &[Fix]) -> String {
    fixes.iter().map(|f| f.name()).collect::<Vec<_>>().join(",")
}

impl fmt::Display for Mitigations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = self.enabled();
        let off: Vec<Fix> = Fix::ALL.iter().copied().filter(|x| !self.has(*x)).collect();
        if on.is_empty() {
            f.write_str("none")
        } else if off.is_empty() {
            f.write_str("all")
        } else if on.len() <= off.len() {
            write!(f, "only:{}", join(&on))
        } else {
            write!(f, "all-but:{}", join(&off))
        }
    }
}

impl FromStr for Mitigations {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, SchedError> {
        let t = s.trim();
        let parse_list = |list: &str| -> Result<Vec<Fix>, SchedError> {
            if list.trim().is_empty() {
                return Err(parse_error(s, "the fix list is empty"));
            }
            list.split(',')
                .map(|x| {
                    Fix::ALL
                        .iter()
                        .copied()
                        .find(|f| f.name().eq_ignore_ascii_case(x.trim()))
                        .ok_or_else(|| parse_error(s, format!("{:?} is not a fix name", x.trim())))
                })
                .collect()
        };
        if t.is_empty() {
            Err(parse_error(s, "it is empty"))
        } else if t.eq_ignore_ascii_case("none") {
            Ok(Self::none())
        } else if t.eq_ignore_ascii_case("all") {
            Ok(Self::all())
        } else if let Some(rest) = t.strip_prefix("only:") {
            Ok(parse_list(rest)?
                .into_iter()
                .fold(Self::none(), |m, f| m.with(f, true)))
        } else if let Some(rest) = t.strip_prefix("all-but:") {
            Ok(parse_list(rest)?
                .into_iter()
                .fold(Self::all(), |m, f| m.with(f, false)))
        } else {
            Err(parse_error(s, "it is not one of the four forms"))
        }
    }
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn constructors() {
        assert!(Mitigations::none().enabled().is_empty());
        assert_eq!(Mitigations::all().enabled().len(), 6);
        for f in Fix::ALL {
            assert_eq!(Mitigations::only(f).enabled(), vec![f]);
            assert_eq!(Mitigations::all_but(f).enabled().len(), 5);
            assert!(!Mitigations::all_but(f).has(f));
        }
        // baseline, each fix alone in the order of the design notes, all
        let mut want = vec![Mitigations::none()];
        for f in Fix::ALL {
            want.push(Mitigations::only(f));
        }
        want.push(Mitigations::all());
        assert_eq!(Mitigations::seeds_variants(), want);
        assert_eq!(
            Mitigations::seeds_variants()
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>(),
            [
                "none",
                "only:cpupri",
                "only:rto",
                "only:shardrq",
                "only:llcidle",
                "only:l2wake",
                "only:grpload",
                "all"
            ]
        );
    }

    #[test]
    fn parse_and_display_round_trip() {
        for (s, m) in [
            ("none", Mitigations::none()),
            ("all", Mitigations::all()),
            ("only:cpupri", Mitigations::only(Fix::CpuPri)),
            ("all-but:l2wake", Mitigations::all_but(Fix::L2Wake)),
            (
                "only:rto,grpload",
                Mitigations::only(Fix::Rto).with(Fix::GrpLoad, true),
            ),
        ] {
            assert_eq!(s.parse::<Mitigations>().unwrap(), m, "{s}");
            assert_eq!(m.to_string(), s);
        }
        // every subset survives the round trip
        for bits in 0u32..64 {
            let m = Fix::ALL
                .iter()
                .enumerate()
                .fold(Mitigations::none(), |m, (i, f)| {
                    m.with(*f, bits & (1 << i) != 0)
                });
            assert_eq!(m.to_string().parse::<Mitigations>().unwrap(), m);
        }
        // surrounding whitespace and spaces in the list are ignored; the
        // words none/all and fix names ignore case, the only:/all-but:
        // prefixes do not
        assert_eq!(
            " only:rto , grpload ".parse::<Mitigations>().unwrap(),
            Mitigations::only(Fix::Rto).with(Fix::GrpLoad, true)
        );
        assert_eq!(
            " NONE ".parse::<Mitigations>().unwrap(),
            Mitigations::none()
        );
        assert_eq!("All".parse::<Mitigations>().unwrap(), Mitigations::all());
        assert!(" ONLY:rto".parse::<Mitigations>().is_err());
        assert!("All-But:rto".parse::<Mitigations>().is_err());
        // a fix named twice is just on
        assert_eq!(
            "only:rto,rto".parse::<Mitigations>().unwrap(),
            Mitigations::only(Fix::Rto)
        );
        assert_eq!(
            "only:LLCIDLE".parse::<Mitigations>().unwrap(),
            Mitigations::only(Fix::LlcIdle)
        );
    }

    #[test]
    fn errors_name_valid_values() {
        for bad in [
            "",
            "some",
            "only:",
            "only:foo",
            "all-but:cpupri,bar",
            "only cpupri",
        ] {
            let e = bad.parse::<Mitigations>().unwrap_err().to_string();
            assert!(
                e.contains("none, all, only:FIX or all-but:FIX"),
                "{bad}: {e}"
            );
            assert!(
                e.contains("cpupri, rto, shardrq, llcidle, l2wake, grpload"),
                "{e}"
            );
        }
        assert!("only:foo"
            .parse::<Mitigations>()
            .unwrap_err()
            .to_string()
            .contains("\"foo\""));
        assert!("x".parse::<Fix>().is_err());
        assert_eq!("rto".parse::<Fix>().unwrap(), Fix::Rto);
        assert!(" "
            .parse::<Mitigations>()
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }

    #[test]
    fn comparison_lists() {
        assert_eq!(
            Mitigations::parse_sets("seeds").unwrap(),
            Mitigations::seeds_variants()
        );
        assert_eq!(
            Mitigations::parse_sets("none; ;all;").unwrap(),
            vec![Mitigations::none(), Mitigations::all()]
        );
        let e = Mitigations::parse_sets(";;").unwrap_err().to_string();
        assert!(e.contains("names no set") && e.contains("seeds"), "{e}");
        let e = Mitigations::parse_sets("none;bogus")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"bogus\""), "{e}");
    }

    #[test]
    fn serde() {
        let j = serde_json::to_string(&Mitigations::only(Fix::ShardRq)).unwrap();
        assert_eq!(
            j,
            r#"{"cpupri":false,"rto":false,"shardrq":true,"llcidle":false,"l2wake":false,"grpload":false}"#
        );
        // the fields' names before each fix had one name still read
        let old = r#"{"cpupri_split":true,"rto_per_node":false,"sharded_shared_rq":true,"llc_idle":false,"l2_wakeup":true,"node_group_load":false}"#;
        assert_eq!(
            serde_json::from_str::<Mitigations>(old).unwrap(),
            "only:cpupri,shardrq,l2wake".parse().unwrap()
        );
        for f in Fix::ALL {
            let m = Mitigations::all_but(f);
            let j = serde_json::to_string(&m).unwrap();
            assert!(j.contains(&format!("\"{}\":false", f.name())), "{j}");
            assert_eq!(serde_json::from_str::<Mitigations>(&j).unwrap(), m);
        }
        assert_eq!(serde_json::to_string(&Fix::L2Wake).unwrap(), "\"l2wake\"");
    }
}
