//! The micro-guests' paravirtual port interface.
//!
//! A micro-guest asks the VMM for scheduler services by writing a 32-bit
//! value to one of five I/O ports (`out imm8, eax`), and waits to be woken
//! with `HLT`. Nothing else reaches the VMM: compute is the guest's own
//! loop, and its shared state lives in its own memory.
//!
//! | port | name | value | the VMM does |
//! |------|------|-------|--------------|
//! | 0xE0 | `REPORT` | any `u32` | records the value for this vCPU, then resumes it |
//! | 0xE1 | `WAKE`   | a vCPU index `k` of the same VM, `k < vcpus` | wakes vCPU `k` (a doorbell), then resumes the writer |
//! | 0xE2 | `SLEEP`  | nanoseconds, `1..=u32::MAX` | blocks the vCPU until that much time has passed (a timer) |
//! | 0xE3 | `YIELD`  | `0` | lets other runnable vCPUs of the same priority run first |
//! | 0xE4 | `DONE`   | exit code; `0` = success | ends this vCPU; a non-zero code fails the VM |
//! | `HLT` | wait   | — | blocks the vCPU until another vCPU rings its doorbell |
//!
//! Wakes are remembered one deep: a doorbell that arrives while its target
//! is still running makes the target's next `HLT` return at once, so the
//! usual "check the condition, then `HLT`" loop never loses a wakeup (the
//! waker must publish the condition before it rings). A woken vCPU
//! re-checks its condition: `HLT` may also return for a doorbell meant for
//! an earlier wait.
//!
//! Errors (each stops the VM that made them, with a message naming the
//! vCPU, the port and the value; other VMs are not affected):
//! * a write to any other port, or any read (`IN`) from any port;
//! * a write that is not 32 bits wide;
//! * `WAKE` of a vCPU index the VM does not have;
//! * `SLEEP` of 0 ns (use `YIELD`);
//! * `YIELD` with a non-zero value (reserved);
//! * `DONE` with a non-zero code (the guest reports its own failure);
//! * an access to guest-physical memory that has no RAM behind it.

use std::fmt;

/// `REPORT`: record a value.
pub const PORT_REPORT: u16 = 0xe0;
/// `WAKE`: ring vCPU `k`'s doorbell.
pub const PORT_WAKE: u16 = 0xe1;
/// `SLEEP`: block for `T` ns.
pub const PORT_SLEEP: u16 = 0xe2;
/// `YIELD`: let others run.
pub const PORT_YIELD: u16 = 0xe3;
/// `DONE`: this vCPU is finished.
pub const PORT_DONE: u16 = 0xe4;

/// Every port of the interface, with its name.
pub const PORTS: [(u16, &str); 5] = [
    (PORT_REPORT, "REPORT"),
    (PORT_WAKE, "WAKE"),
    (PORT_SLEEP, "SLEEP"),
    (PORT_YIELD, "YIELD"),
    (PORT_DONE, "DONE"),
];

/// A decoded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Record a value.
    Report(u32),
    /// Wake vCPU `k` of this VM.
    Wake(u32),
    /// Sleep this many nanoseconds.
    Sleep(u32),
    /// Yield.
    Yield,
    /// This vCPU is finished with this code (0: success).
    Done(u32),
}

/// A request the VMM refuses. Each one stops the VM that made it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A write to a port that is not part of the interface.
    #[error(
        "wrote {value:#x} to I/O port {port:#x}, which is not a micro-guest port \
         (REPORT 0xe0, WAKE 0xe1, SLEEP 0xe2, YIELD 0xe3, DONE 0xe4)"
    )]
    BadPort {
        /// The port.
        port: u16,
        /// The value written.
        value: u32,
    },
    /// A read from a port: the interface has none.
    #[error(
        "read from I/O port {port:#x}; micro-guest ports are write-only and nothing else is there"
    )]
    Read {
        /// The port.
        port: u16,
    },
    /// A write that is not 32 bits wide.
    #[error("wrote {size} byte(s) to port {port:#x} ({name}); requests are 32-bit writes (out imm8, eax)")]
    BadSize {
        /// The port.
        port: u16,
        /// Its name.
        name: &'static str,
        /// The access size in bytes.
        size: u8,
    },
    /// `WAKE` of a vCPU the VM does not have.
    #[error("WAKE {target}: this VM has vCPUs 0..{vcpus}")]
    NoSuchVcpu {
        /// The index asked for.
        target: u32,
        /// vCPUs in the VM.
        vcpus: usize,
    },
    /// `SLEEP 0`.
    #[error("SLEEP 0: a sleep must be at least 1 ns (use YIELD to let others run)")]
    ZeroSleep,
    /// `YIELD` with a value.
    #[error("YIELD {value:#x}: the value is reserved and must be 0")]
    YieldValue {
        /// The value written.
        value: u32,
    },
    /// Guest memory that is not RAM.
    #[error("{what} guest-physical address {addr:#x}, which is not RAM (the VM has {ram:#x} bytes from 0)")]
    Mmio {
        /// "read from" or "wrote to".
        what: &'static str,
        /// The address.
        addr: u64,
        /// RAM size.
        ram: u64,
    },
}

/// The name of an interface port.
pub fn port_name(port: u16) -> Option<&'static str> {
    PORTS.iter().find(|(p, _)| *p == port).map(|(_, n)| *n)
}

/// Decodes a port write of `size` bytes from a VM with `vcpus` vCPUs.
pub fn decode(port: u16, value: u32, size: u8, vcpus: usize) -> Result<Request, ProtoError> {
    let Some(name) = port_name(port) else {
        return Err(ProtoError::BadPort { port, value });
    };
    if size != 4 {
        return Err(ProtoError::BadSize { port, name, size });
    }
    Ok(match port {
        PORT_REPORT => Request::Report(value),
        PORT_WAKE => {
            if value as usize >= vcpus {
                return Err(ProtoError::NoSuchVcpu {
                    target: value,
                    vcpus,
                });
            }
            Request::Wake(value)
        }
        PORT_SLEEP => {
            if value == 0 {
                return Err(ProtoError::ZeroSleep);
            }
            Request::Sleep(value)
        }
        PORT_YIELD => {
            if value != 0 {
                return Err(ProtoError::YieldValue { value });
            }
            Request::Yield
        }
        _ => Request::Done(value),
    })
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Report(v) => write!(f, "REPORT {v:#x}"),
            Request::Wake(k) => write!(f, "WAKE {k}"),
            Request::Sleep(ns) => write!(f, "SLEEP {ns} ns"),
            Request::Yield => write!(f, "YIELD"),
            Request::Done(c) => write!(f, "DONE {c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_request() {
        assert_eq!(decode(PORT_REPORT, 7, 4, 2), Ok(Request::Report(7)));
        assert_eq!(decode(PORT_WAKE, 1, 4, 2), Ok(Request::Wake(1)));
        assert_eq!(decode(PORT_SLEEP, 1000, 4, 2), Ok(Request::Sleep(1000)));
        assert_eq!(decode(PORT_YIELD, 0, 4, 2), Ok(Request::Yield));
        assert_eq!(decode(PORT_DONE, 0, 4, 2), Ok(Request::Done(0)));
        assert_eq!(decode(PORT_DONE, 3, 4, 2), Ok(Request::Done(3)));
    }

    #[test]
    fn refuses_malformed_requests_with_clear_messages() {
        let e = decode(0x80, 1, 1, 2).unwrap_err();
        assert!(matches!(e, ProtoError::BadPort { port: 0x80, .. }));
        assert!(e.to_string().contains("0x80") && e.to_string().contains("REPORT 0xe0"));
        let e = decode(PORT_REPORT, 1, 1, 2).unwrap_err();
        assert!(e.to_string().contains("32-bit"), "{e}");
        let e = decode(PORT_WAKE, 2, 4, 2).unwrap_err();
        assert_eq!(
            e,
            ProtoError::NoSuchVcpu {
                target: 2,
                vcpus: 2
            }
        );
        assert!(e.to_string().contains("vCPUs 0..2"));
        assert_eq!(decode(PORT_SLEEP, 0, 4, 2), Err(ProtoError::ZeroSleep));
        assert_eq!(
            decode(PORT_YIELD, 5, 4, 2),
            Err(ProtoError::YieldValue { value: 5 })
        );
        assert_eq!(
            decode(PORT_WAKE, 0, 2, 2).unwrap_err().to_string(),
            "wrote 2 byte(s) to port 0xe1 (WAKE); requests are 32-bit writes (out imm8, eax)"
        );
    }
}
