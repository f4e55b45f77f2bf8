//! Exit codes of the `vmm` binary: the one place that decides them.
//!
//! WHAT: which outcome exits with which status, and, for errors, whose
//! fault it is: the user's (exit 2: change the request and it works) or
//! the run's (exit 1: the host, KVM, the guest or a bug failed).
//! WHY: the CLI, the library's error enums and the executors all meet
//! here, so a new error kind is classified once and the table below stays
//! true. `docs/vmm.md` carries the same table.
//! HOW: [`status_for_error`] walks an [`anyhow::Error`]'s chain, outermost
//! first, and the first error of a type listed here decides ([`fault`]);
//! an error of no listed type is a runtime failure. [`for_stop`] maps why
//! a `vmm run` guest stopped.
//!
//! | status | meaning | examples |
//! |---|---|---|
//! | [`SUCCESS`] 0 | done | `vmm run`: the guest reset, powered off, or a console line matched `--until`; any other command finished |
//! | [`FAILURE`] 1 | a runtime failure | the guest triple-faulted, panicked or hit an instruction KVM cannot emulate; `/dev/kvm` cannot be opened; a KVM ioctl, a memory mapping or the host topology failed; `bench --check` found a problem; vCPUs did not stop |
//! | [`INPUT`] 2 | the user's fault: bad input, one line on stderr | a missing, unreadable or non-kernel `--kernel` (or `--initrd`); memory below the minimum; a malformed topology string; an unpinnable shape; a bad flag value or config file; an RT policy the user may not set; clap's usage errors |
//! | [`TIMEOUT`] 124 | `vmm run --timeout` expired (as `timeout(1)`) | the guest did not reset, power off or match `--until` in time |

use crate::boot::BootError;
use crate::memory::MemoryError;
use crate::micro::MicroError;
use crate::vcpu_task::TaskError;
use crate::vm::StopReason;

/// Success.
pub const SUCCESS: u8 = 0;
/// A runtime failure (the host, KVM, the guest, a bug).
pub const FAILURE: u8 = 1;
/// The user's fault: bad input (also what clap exits with on usage errors).
pub const INPUT: u8 = 2;
/// `vmm run --timeout` expired.
pub const TIMEOUT: u8 = 124;

/// A user-input problem that fits no typed error: exits with [`INPUT`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// Whose fault an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The user's: a different request would work (exit 2).
    User,
    /// The run's: the host, KVM, the guest or a bug (exit 1).
    Runtime,
}

impl Fault {
    /// Its exit status.
    pub fn status(self) -> u8 {
        match self {
            Fault::User => INPUT,
            Fault::Runtime => FAILURE,
        }
    }
}

/// The exit status of a `vmm run` whose guest stopped for `reason`.
pub fn for_stop(reason: &StopReason) -> u8 {
    match reason {
        StopReason::Reset { .. }
        | StopReason::PowerOff { .. }
        | StopReason::UntilMatched { .. } => SUCCESS,
        StopReason::Timeout(_) => TIMEOUT,
        StopReason::GuestPanic { .. }
        | StopReason::TripleFault { .. }
        | StopReason::InternalError { .. }
        | StopReason::VcpuFailed { .. } => FAILURE,
    }
}

/// The exit status of a command that failed with `e`.
pub fn status_for_error(e: &anyhow::Error) -> u8 {
    e.chain().find_map(fault).unwrap_or(Fault::Runtime).status()
}

/// Whose fault `e` is, if it is of a type this module knows; `None`
/// otherwise (a plain message, an I/O error: look further down the chain).
pub fn fault(e: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    if e.is::<InputError>()
        || e.is::<crate::config::ConfigError>()
        || e.is::<crate::pin::PinError>()
        || e.is::<crate::acpi::AcpiError>()
        || e.is::<clap::Error>()
    {
        return Some(Fault::User);
    }
    if let Some(e) = e.downcast_ref::<crate::Error>() {
        return Some(of_error(e));
    }
    if let Some(e) = e.downcast_ref::<BootError>() {
        return Some(of_boot(e));
    }
    if let Some(e) = e.downcast_ref::<MemoryError>() {
        return Some(of_memory(e));
    }
    if let Some(e) = e.downcast_ref::<topology::TopologyError>() {
        return Some(of_topology(e));
    }
    if let Some(e) = e.downcast_ref::<vcpu_sched::SchedError>() {
        return Some(of_sched(e));
    }
    if let Some(e) = e.downcast_ref::<TaskError>() {
        return Some(of_task(e));
    }
    if let Some(e) = e.downcast_ref::<MicroError>() {
        return Some(of_micro(e));
    }
    if let Some(e) = e.downcast_ref::<crate::vcpu_bench::BenchError>() {
        return Some(of_bench(e));
    }
    if e.is::<crate::vcpu::VcpuError>() {
        return Some(Fault::Runtime);
    }
    None
}

/// [`crate::Error`].
pub fn of_error(e: &crate::Error) -> Fault {
    use crate::Error;
    match e {
        Error::Input(_) | Error::Pin(_) | Error::Config(_) | Error::Acpi(_) => Fault::User,
        Error::Boot(b) => of_boot(b),
        Error::Memory(m) => of_memory(m),
        Error::Topology(t) => of_topology(t),
        Error::Vcpu(_) | Error::Kvm { .. } | Error::Other(_) => Fault::Runtime,
    }
}

/// Kernel, initrd and command line: every problem with a file the user
/// named (missing, unreadable, not a kernel, not loadable) is theirs.
pub fn of_boot(e: &BootError) -> Fault {
    match e {
        BootError::KernelMissing(_)
        | BootError::NotAKernel { .. }
        | BootError::InitrdMissing(_)
        | BootError::Read { .. }
        | BootError::Load { .. }
        | BootError::TooSmall { .. }
        | BootError::CmdlineTooLong { .. }
        | BootError::CmdlineNul => Fault::User,
        BootError::Memory { .. } | BootError::Vcpu { .. } => Fault::Runtime,
    }
}

/// Guest memory: the size is the user's; mapping and binding the host's.
pub fn of_memory(e: &MemoryError) -> Fault {
    match e {
        MemoryError::TooSmall { .. } | MemoryError::TooLarge(_) => Fault::User,
        _ => Fault::Runtime,
    }
}

/// Topologies: a spec is the user's; reading this host's is not.
pub fn of_topology(e: &topology::TopologyError) -> Fault {
    match e {
        topology::TopologyError::Io { .. } | topology::TopologyError::Host(_) => Fault::Runtime,
        _ => Fault::User,
    }
}

/// The scheduler: a request it cannot take is the user's; a broken
/// invariant, an OS call or a bad state is not.
pub fn of_sched(e: &vcpu_sched::SchedError) -> Fault {
    use vcpu_sched::SchedError;
    match e {
        SchedError::Topology(t) => of_topology(t),
        SchedError::Workload(_)
        | SchedError::Config(_)
        | SchedError::Mitigations { .. }
        | SchedError::Policy(_)
        | SchedError::TooManyTasks(_)
        | SchedError::TooManyGroups(_)
        | SchedError::TooManyCpus { .. } => Fault::User,
        _ => Fault::Runtime,
    }
}

/// The executors.
pub fn of_task(e: &TaskError) -> Fault {
    match e {
        TaskError::Input(_) => Fault::User,
        TaskError::Sched(s) => of_sched(s),
        TaskError::Topology(t) => of_topology(t),
        TaskError::Vcpu(_) | TaskError::Os { .. } | TaskError::Stuck(_) => Fault::Runtime,
    }
}

/// Micro-guests.
pub fn of_micro(e: &MicroError) -> Fault {
    match e {
        MicroError::Input(_) => Fault::User,
        _ => Fault::Runtime,
    }
}

/// `vmm bench` runs.
pub fn of_bench(e: &crate::vcpu_bench::BenchError) -> Fault {
    use crate::vcpu_bench::BenchError;
    match e {
        BenchError::Input(_) => Fault::User,
        BenchError::Topology(t) => of_topology(t),
        BenchError::Sched(s) => of_sched(s),
        BenchError::Micro(m) => of_micro(m),
        BenchError::Task(t) => of_task(t),
        BenchError::Failed(_) => Fault::Runtime,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn status(e: impl Into<anyhow::Error>) -> u8 {
        status_for_error(&e.into())
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(for_stop(&StopReason::Reset { vcpu: 0 }), SUCCESS);
        assert_eq!(for_stop(&StopReason::PowerOff { vcpu: 1 }), SUCCESS);
        assert_eq!(
            for_stop(&StopReason::Timeout(Duration::from_secs(1))),
            TIMEOUT
        );
        assert_eq!(
            for_stop(&StopReason::GuestPanic {
                message: "x".into()
            }),
            FAILURE
        );
    }

    #[test]
    fn errors() {
        let read = || BootError::Read {
            path: "/k".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        };
        assert_eq!(status(crate::Error::from(read())), INPUT);
        assert_eq!(status(read()), INPUT);
        assert_eq!(status(crate::Error::Other("x".into())), FAILURE);
        assert_eq!(status(anyhow::anyhow!("plain")), FAILURE);
        assert_eq!(
            status(anyhow::Error::from(InputError("x".into())).context("c")),
            INPUT
        );
        assert_eq!(
            status(TaskError::Topology(topology::TopologyError::Host(
                "x".into()
            ))),
            FAILURE
        );
        assert_eq!(
            status(TaskError::Sched(vcpu_sched::SchedError::Policy("x".into()))),
            INPUT
        );
        assert_eq!(status(TaskError::Stuck("x".into())), FAILURE);
        assert_eq!(
            status(crate::vcpu_bench::BenchError::Failed("x".into())),
            FAILURE
        );
        assert_eq!(
            status(crate::vcpu_bench::BenchError::Input("x".into())),
            INPUT
        );
    }
}

/// The one line printed for an error: its chain of contexts and causes,
/// outermost first, joined by ": ", leaving out a cause whose text the
/// line already holds (typed errors often print their source inside their
/// own message, and the chain would repeat it).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod one_line_tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x: {source}")]
    struct Read {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = anyhow::Error::new(Read {
            source: std::io::Error::other("it is a directory"),
        })
        .context("--initrd /x");
        assert_eq!(
            one_line(&e),
            "--initrd /x: cannot read /x: it is a directory"
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }
}
