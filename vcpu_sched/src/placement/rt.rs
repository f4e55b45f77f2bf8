//! Real-time scheduling of vCPU threads: `--rt fifo:PRIO | rr:PRIO | none`.
//!
//! Equal-priority `SCHED_FIFO` threads never time-slice: with more vCPUs
//! than host CPUs, a vCPU spinning on a lock held by a preempted sibling
//! spins forever. The VMM warns when that can happen (see
//! [`oversubscribed`]); `rr` time-slices between equal priorities.

use std::fmt;

/// A real-time policy for vCPU threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RtPolicy {
    /// `SCHED_FIFO` at this priority.
    Fifo(u8),
    /// `SCHED_RR` at this priority.
    Rr(u8),
}

impl fmt::Display for RtPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RtPolicy::Fifo(p) => write!(f, "fifo:{p}"),
            RtPolicy::Rr(p) => write!(f, "rr:{p}"),
        }
    }
}

impl RtPolicy {
    /// The scheduler policy it is.
    pub fn policy(self) -> crate::task::Policy {
        match self {
            RtPolicy::Fifo(p) => crate::task::Policy::Fifo(p),
            RtPolicy::Rr(p) => crate::task::Policy::Rr(p),
        }
    }

    /// Parses `fifo:PRIO`, `rr:PRIO` (PRIO 1..=99) or `none`.
    pub fn parse(s: &str) -> Result<Option<Self>, String> {
        let t = s.trim();
        if t == "none" || t.is_empty() {
            return Ok(None);
        }
        let (kind, prio) = t
            .split_once(':')
            .ok_or_else(|| format!("{s:?} is not fifo:PRIO, rr:PRIO or none (e.g. fifo:50)"))?;
        let prio: u8 = prio
            .trim()
            .parse()
            .ok()
            .filter(|p| (1..=99).contains(p))
            .ok_or_else(|| format!("{s:?}: the priority must be a number from 1 to 99"))?;
        match kind.trim().to_ascii_lowercase().as_str() {
            "fifo" => Ok(Some(RtPolicy::Fifo(prio))),
            "rr" => Ok(Some(RtPolicy::Rr(prio))),
            k => Err(format!(
                "{s:?}: unknown policy {k:?}; use fifo:PRIO, rr:PRIO or none"
            )),
        }
    }
}

/// Whether `vcpus` RT threads could compete for fewer host CPUs: the
/// distinct CPUs they are pinned to, or all CPUs this process may use.
pub fn oversubscribed(vcpus: usize, pins: Option<&[u32]>, allowed_cpus: usize) -> bool {
    let cpus = match pins {
        Some(p) => {
            let mut v = p.to_vec();
            v.sort_unstable();
            v.dedup();
            v.len()
        }
        None => allowed_cpus,
    };
    vcpus > cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(
            RtPolicy::parse("fifo:99").unwrap(),
            Some(RtPolicy::Fifo(99))
        );
        assert_eq!(RtPolicy::parse("RR:1").unwrap(), Some(RtPolicy::Rr(1)));
        assert_eq!(RtPolicy::parse("none").unwrap(), None);
        assert!(RtPolicy::parse("fifo:0").unwrap_err().contains("1 to 99"));
        assert!(RtPolicy::parse("fifo:100").is_err());
        assert!(RtPolicy::parse("fifo").unwrap_err().contains("fifo:PRIO"));
        assert!(RtPolicy::parse("deadline:5")
            .unwrap_err()
            .contains("unknown policy"));
        assert_eq!(RtPolicy::Fifo(7).to_string(), "fifo:7");
    }

    #[test]
    fn oversubscription() {
        assert!(oversubscribed(8, None, 2));
        assert!(!oversubscribed(2, None, 2));
        assert!(oversubscribed(2, Some(&[0, 0]), 16));
        assert!(!oversubscribed(2, Some(&[0, 1]), 16));
    }
}
