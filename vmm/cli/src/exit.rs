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
//! a `vmm run` guest stopped. The statuses, [`InputError`] and
//! [`one_line`] are `cli_common`'s, shared with `vmm-sim`, which `vmm sim`
//! runs and whose status it hands through.
//!
//! | status | meaning | examples |
//! |---|---|---|
//! | [`SUCCESS`] 0 | done | `vmm run`: the guest reset, powered off, or a console line matched `--until`; any other command finished |
//! | [`FAILURE`] 1 | a runtime failure | the guest triple-faulted, panicked or hit an instruction KVM cannot emulate; `/dev/kvm` cannot be opened; a KVM ioctl, a memory mapping or the host topology failed; `bench --check` found a problem; vCPUs did not stop |
//! | [`INPUT`] 2 | the user's fault: bad input, one line on stderr | a missing, unreadable or non-kernel `--kernel` (or `--initrd`); memory below the minimum; a malformed topology string; an unpinnable shape; a bad flag value or config file; an RT policy the user may not set; clap's usage errors |
//! | [`TIMEOUT`] 124 | `vmm run --timeout` expired (as `timeout(1)`) | the guest did not reset, power off or match `--until` in time |

use vmm_machine::boot::BootError;
use vmm_machine::memory::MemoryError;
use vmm_machine::micro::MicroError;
use vmm_machine::vcpu_body::TaskError;
use vmm_machine::vm::StopReason;

pub use cli_common::exit::{one_line, Fault, InputError, FAILURE, INPUT, SUCCESS};

/// `vmm run --timeout` expired.
pub const TIMEOUT: u8 = 124;

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
    cli_common::exit::status_with(e, fault)
}

/// Whose fault `e` is, if it is of a type this module knows; `None`
/// otherwise (a plain message, an I/O error: look further down the chain).
pub fn fault(e: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    if e.is::<InputError>()
        || e.is::<crate::config::ConfigError>()
        || e.is::<vcpu_sched::placement::pin::PinError>()
        || e.is::<vmm_machine::acpi::AcpiError>()
        || e.is::<clap::Error>()
    {
        return Some(Fault::User);
    }
    if let Some(e) = e.downcast_ref::<vmm_machine::Error>() {
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
    if let Some(e) = e.downcast_ref::<vmm_lab::BenchError>() {
        return Some(of_bench(e));
    }
    if e.is::<vmm_machine::vcpu::VcpuError>() {
        return Some(Fault::Runtime);
    }
    None
}

/// [`vmm_machine::Error`].
pub fn of_error(e: &vmm_machine::Error) -> Fault {
    use vmm_machine::Error;
    match e {
        Error::Input(_) | Error::Pin(_) | Error::Acpi(_) => Fault::User,
        Error::Boot(b) => of_boot(b),
        Error::Memory(m) => of_memory(m),
        Error::Topology(t) => of_topology(t),
        Error::Device(vmm_machine::devices::DeviceError::Full(_))
        | Error::Disk(_)
        | Error::Tap(_)
        | Error::Fs(_) => Fault::User,
        Error::Device(_) | Error::Vcpu(_) | Error::Kvm { .. } | Error::Other(_) => Fault::Runtime,
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
        | BootError::File { .. }
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

/// Topologies: a spec is the user's; reading this host's is not
/// ([`topology::TopologyError::is_user_error`]).
pub fn of_topology(e: &topology::TopologyError) -> Fault {
    Fault::user_if(e.is_user_error())
}

/// The scheduler: a request it cannot take is the user's; a broken
/// invariant, an OS call or a bad state is not
/// ([`vcpu_sched::SchedError::is_user_error`]).
pub fn of_sched(e: &vcpu_sched::SchedError) -> Fault {
    Fault::user_if(e.is_user_error())
}

/// The executors.
pub fn of_task(e: &TaskError) -> Fault {
    match e {
        TaskError::Input(_) => Fault::User,
        TaskError::Sched(s) => of_sched(s),
        TaskError::Topology(t) => of_topology(t),
        TaskError::Vcpu(_) | TaskError::Stuck(_) => Fault::Runtime,
    }
}

/// Micro-guests.
pub fn of_micro(e: &MicroError) -> Fault {
    match e {
        // an image or a tap the user named: missing, locked, not writable
        MicroError::Input(_) | MicroError::Disk(_) | MicroError::Tap(_) => Fault::User,
        _ => Fault::Runtime,
    }
}

/// `vmm bench` runs.
pub fn of_bench(e: &vmm_lab::BenchError) -> Fault {
    use vmm_lab::BenchError;
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
        assert_eq!(status(vmm_machine::Error::from(read())), INPUT);
        assert_eq!(status(read()), INPUT);
        assert_eq!(status(vmm_machine::Error::Other("x".into())), FAILURE);
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
        assert_eq!(status(vmm_lab::BenchError::Failed("x".into())), FAILURE);
        assert_eq!(status(vmm_lab::BenchError::Input("x".into())), INPUT);
    }
}
