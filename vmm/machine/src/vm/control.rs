//! How a VM stops: [`StopReason`], the [`VmControl`] that records the
//! first one and kicks the vCPUs, and what a vCPU's exit means for its VM
//! ([`handle_exit`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::console::ConsoleEvents;
use crate::vcpu::{Kicker, Vcpu, VcpuExit};

/// Why a VM stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// The guest reset the machine (`reboot`).
    Reset {
        /// The vCPU that did it.
        vcpu: usize,
    },
    /// The guest powered off (ACPI S5).
    PowerOff {
        /// The vCPU that did it.
        vcpu: usize,
    },
    /// The console printed a line matching `--until`.
    UntilMatched {
        /// The line.
        line: String,
        /// Time since the vCPUs started.
        after: Duration,
    },
    /// The guest kernel panicked.
    GuestPanic {
        /// Its message.
        message: String,
    },
    /// A vCPU triple-faulted.
    TripleFault {
        /// Which.
        vcpu: usize,
        /// Its registers.
        registers: String,
    },
    /// KVM reported an internal error (typically an instruction its
    /// emulator cannot run).
    InternalError {
        /// Which vCPU.
        vcpu: usize,
        /// KVM's suberror.
        suberror: u32,
        /// The instruction bytes.
        insn: Vec<u8>,
        /// Its registers.
        registers: String,
    },
    /// Something else ended a vCPU.
    VcpuFailed {
        /// Which.
        vcpu: usize,
        /// What happened.
        what: String,
    },
    /// `--timeout` ran out.
    Timeout(Duration),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Reset { vcpu } => write!(f, "the guest reset the machine (vCPU {vcpu})"),
            StopReason::PowerOff { vcpu } => write!(f, "the guest powered off (vCPU {vcpu})"),
            StopReason::UntilMatched { line, after } => write!(
                f,
                "--until matched after {:.2} s: {line}",
                after.as_secs_f64()
            ),
            StopReason::GuestPanic { message } => {
                write!(f, "the guest kernel panicked: {message}")
            }
            StopReason::TripleFault { vcpu, registers } => write!(
                f,
                "vCPU {vcpu} shut down (triple fault); its registers:\n{registers}"
            ),
            StopReason::InternalError {
                vcpu,
                suberror,
                insn,
                registers,
            } => {
                let what = match suberror {
                    1 => "an instruction KVM cannot emulate",
                    2 => "an exception while delivering an exception",
                    3 => "an event it could not deliver",
                    _ => "an internal error",
                };
                let bytes: Vec<String> = insn.iter().map(|b| format!("{b:02x}")).collect();
                write!(
                    f,
                    "vCPU {vcpu}: KVM hit {what} (suberror {suberror}, instruction bytes [{}]); \
                     its registers:\n{registers}",
                    bytes.join(" ")
                )
            }
            StopReason::VcpuFailed { vcpu, what } => write!(f, "vCPU {vcpu}: {what}"),
            StopReason::Timeout(d) => write!(
                f,
                "--timeout {}: the guest did not reset, power off or match --until in time",
                duration_words(*d)
            ),
        }
    }
}

/// A timeout as the user wrote it: `10m`, `90s`, `1500ms`.
fn duration_words(d: std::time::Duration) -> String {
    let (s, ms) = (d.as_secs(), d.as_millis());
    match () {
        _ if ms % 1000 != 0 => format!("{ms}ms"),
        _ if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        _ if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// Stop requests and the vCPUs' kickers of one VM.
pub struct VmControl {
    stopping: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    cond: Condvar,
    kickers: Mutex<Vec<Kicker>>,
    started: Mutex<Option<Instant>>,
}

impl fmt::Debug for VmControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmControl")
            .field("stopping", &self.is_stopping())
            .finish()
    }
}

impl VmControl {
    /// A control block with no vCPUs yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            stopping: AtomicBool::new(false),
            reason: Mutex::new(None),
            cond: Condvar::new(),
            kickers: Mutex::new(Vec::new()),
            started: Mutex::new(None),
        })
    }

    /// Registers a vCPU's kicker, so that a stop interrupts it.
    pub fn add_kicker(&self, k: Kicker) {
        self.kickers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(k);
    }

    /// Marks the moment the vCPUs start (for `--until` timings).
    pub fn mark_started(&self) {
        *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Time since [`mark_started`](Self::mark_started).
    pub fn elapsed(&self) -> Duration {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    /// Asks the VM to stop. The first reason wins; every vCPU is kicked.
    /// Returns whether this call's reason was the one recorded.
    pub fn request_stop(&self, reason: StopReason) -> bool {
        let first = {
            let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some(reason);
                true
            } else {
                false
            }
        };
        self.stopping.store(true, Ordering::SeqCst);
        for k in self
            .kickers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            k.kick();
        }
        self.cond.notify_all();
        first
    }

    /// Whether a stop was requested.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// The recorded reason, if any.
    pub fn reason(&self) -> Option<StopReason> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits for a stop request, at most `timeout`. `None` when it timed out.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<StopReason> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(reason) = r.as_ref() {
                return Some(reason.clone());
            }
            match deadline {
                None => r = self.cond.wait(r).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    r = self
                        .cond
                        .wait_timeout(r, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }
}

impl ConsoleEvents for VmControl {
    fn until_matched(&self, line: &str) {
        let after = self.elapsed();
        self.request_stop(StopReason::UntilMatched {
            line: line.to_string(),
            after,
        });
    }
    fn guest_panicked(&self, message: &str) {
        self.request_stop(StopReason::GuestPanic {
            message: message.to_string(),
        });
    }
}

/// What one vCPU thread does with an exit: keep going, or stop the VM.
pub fn handle_exit(vcpu: &Vcpu, exit: VcpuExit) -> Option<StopReason> {
    let i = vcpu.index();
    match exit {
        VcpuExit::Kicked | VcpuExit::Io { .. } => None,
        VcpuExit::Reset => Some(StopReason::Reset { vcpu: i }),
        VcpuExit::PowerOff => Some(StopReason::PowerOff { vcpu: i }),
        VcpuExit::Shutdown => Some(StopReason::TripleFault {
            vcpu: i,
            registers: vcpu.state_report(),
        }),
        VcpuExit::InternalError { suberror, insn } => Some(StopReason::InternalError {
            vcpu: i,
            suberror,
            insn,
            registers: vcpu.state_report(),
        }),
        VcpuExit::Halt => Some(StopReason::VcpuFailed {
            vcpu: i,
            what: "HLT exited to userspace, which the in-kernel LAPIC should prevent".into(),
        }),
        VcpuExit::FailEntry { reason } => Some(StopReason::VcpuFailed {
            vcpu: i,
            what: format!("KVM could not enter the guest (hardware reason {reason:#x})"),
        }),
        VcpuExit::Unexpected(what) => Some(StopReason::VcpuFailed { vcpu: i, what }),
    }
}
