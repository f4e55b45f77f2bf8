//! Test-only fault injection below the guest.
//!
//! WHAT: a [`Fault`] armed on a vCPU ([`super::Vcpu::inject`]) fires on
//! its Nth `KVM_RUN`: the ioctl fails (as if KVM returned `EFAULT`), KVM
//! reports an internal error (emulation failure), or the thread running
//! the vCPU panics.
//! WHY: the containment tests must show that each of these stops only its
//! own VM, names the VM and the reason, and leaves the other VMs (and
//! `vmm serve`) running; none of them can be provoked on demand through a
//! real guest on every host.
//! HOW: one branch on an `Option` before each `KVM_RUN`; unarmed (always,
//! outside tests) it costs a predicted-not-taken compare. Armed only
//! through this API or, for `vmm serve`, the `VMM_INJECT` environment
//! variable ([`parse_env`]), read at every `vm.boot` (so each boot of the
//! VM is armed again), which docs/reliability.md documents as a test
//! facility.

use std::fmt;
use std::str::FromStr;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// `KVM_RUN` fails with `EFAULT`.
    Ioctl,
    /// `KVM_RUN` returns `KVM_EXIT_INTERNAL_ERROR` (emulation failure).
    InternalError,
    /// The thread running the vCPU panics.
    Panic,
}

/// A fault on the `at`th `KVM_RUN` of a vCPU (1: the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// On which entry.
    pub at: u64,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::Ioctl => "ioctl",
            FaultKind::InternalError => "internal",
            FaultKind::Panic => "panic",
        })
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ioctl" => Ok(FaultKind::Ioctl),
            "internal" => Ok(FaultKind::InternalError),
            "panic" => Ok(FaultKind::Panic),
            _ => Err(format!("unknown fault {s:?}: use ioctl, internal or panic")),
        }
    }
}

/// Parses `VMM_INJECT`: comma-separated `VM:VCPU:KIND@N` entries (fault
/// KIND on the Nth entry of vCPU VCPU of VM id VM), e.g.
/// `a:0:panic@100,b:1:ioctl@5`.
pub fn parse_env(s: &str) -> Result<Vec<(String, usize, Fault)>, String> {
    let mut out = Vec::new();
    for e in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = || format!("VMM_INJECT entry {e:?}: give VM:VCPU:KIND@N, e.g. a:0:panic@100");
        let mut p = e.splitn(3, ':');
        let (Some(vm), Some(vcpu), Some(rest)) = (p.next(), p.next(), p.next()) else {
            return Err(bad());
        };
        let (kind, at) = rest.split_once('@').ok_or_else(bad)?;
        let vcpu: usize = vcpu.parse().map_err(|_| bad())?;
        let at: u64 = at.parse().map_err(|_| bad())?;
        if at == 0 {
            return Err(bad());
        }
        let kind = kind.parse().map_err(|m| format!("{}: {m}", bad()))?;
        out.push((vm.to_string(), vcpu, Fault { kind, at }));
    }
    Ok(out)
}

/// The faults `VMM_INJECT` arms for VM `vm`: (vCPU index, fault). An
/// unset variable arms nothing; a malformed one is an error naming it.
pub fn for_vm(vm: &str) -> Result<Vec<(usize, Fault)>, String> {
    match std::env::var("VMM_INJECT") {
        Ok(s) => Ok(parse_env(&s)?
            .into_iter()
            .filter(|(v, _, _)| v == vm)
            .map(|(_, k, f)| (k, f))
            .collect()),
        Err(_) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_names_bad_ones() {
        let v = parse_env("a:0:panic@100, b:1:ioctl@5,c:2:internal@1").unwrap();
        assert_eq!(
            v,
            vec![
                (
                    "a".into(),
                    0,
                    Fault {
                        kind: FaultKind::Panic,
                        at: 100
                    }
                ),
                (
                    "b".into(),
                    1,
                    Fault {
                        kind: FaultKind::Ioctl,
                        at: 5
                    }
                ),
                (
                    "c".into(),
                    2,
                    Fault {
                        kind: FaultKind::InternalError,
                        at: 1
                    }
                ),
            ]
        );
        for bad in [
            "a",
            "a:0",
            "a:x:panic@1",
            "a:0:panic",
            "a:0:boom@1",
            "a:0:panic@0",
        ] {
            let e = parse_env(bad).unwrap_err();
            assert!(e.contains("VM:VCPU:KIND@N"), "{bad}: {e}");
        }
        assert!(parse_env("").unwrap().is_empty());
    }
}
