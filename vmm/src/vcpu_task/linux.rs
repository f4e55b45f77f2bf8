//! Running a built Linux VM: on the host 1:1 runner ([`run_threads`],
//! `vmm run --sched host`, the default) or under `vcpu_sched`
//! ([`run_sched`], `vmm run --sched vcpu_sched`). Both go through the same
//! [`VmSet`](super::VmSet) and [`LinuxMapper`]; the host runner is the
//! `host` executor ([`super::host`]).
//!
//! # Under `vcpu_sched`
//!
//! A Linux guest has the in-kernel LAPIC, so `HLT` does not exit: KVM
//! blocks the calling thread inside `KVM_RUN` until an interrupt arrives.
//! Under the scheduler that thread holds a run slot, so a halted vCPU
//! would keep its CPU from every other vCPU. The halt poller finds such
//! vCPUs and makes them give the slot up:
//!
//! * every `poll` (1 ms by default) it reads each vCPU's `blocking` stat
//!   from KVM's binary stats fd (1 while the vCPU is halted inside
//!   `KVM_RUN`) and kicks the ones that are (`immediate_exit` + signal, so
//!   `KVM_RUN` returns `EINTR`); without a stats fd it kicks every vCPU;
//! * after any kick the runner asks `KVM_GET_MP_STATE`; a halted vCPU
//!   ([`KVM_MP_STATE_HALTED`]) is blocked in the scheduler for `halt_ns`
//!   and then re-enters `KVM_RUN`, where KVM delivers whatever interrupt
//!   arrived meanwhile (or the vCPU halts again and is found again).
//!
//! Semantics and limits: an interrupt for a vCPU that gave up its slot is
//! delivered when its halt sleep ends, so wakeup latency grows by up to
//! `halt_ns` plus the poll period (about 1-2 ms with the defaults; a
//! scheduler-level wake from an I/O thread through `Running::wake` ends
//! the sleep early). A vCPU that halts and is woken inside KVM before
//! the poller sees it simply keeps its slot. The poller costs one `pread`
//! per vCPU per period and one kick per halt it finds.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use kvm_bindings::KVM_MP_STATE_HALTED;

use super::{Action, ExitMapper};
use crate::devices::LegacyDevices;
use crate::vcpu::{PortIo, Vcpu, VcpuExit};
use crate::vm::handle_exit;

/// `KVM_GET_STATS_FD`, `_IO(KVMIO, 0xce)` (kvm-ioctls has no wrapper).
const KVM_GET_STATS_FD: libc::c_ulong = 0xae00 | 0xce;

/// A vCPU's `blocking` stat: the stats fd and where the value lives.
pub struct BlockingStat {
    fd: OwnedFd,
    offset: u64,
}

impl BlockingStat {
    /// Opens `vcpu`'s stats fd and finds `blocking`; `None` if KVM has
    /// no stats fd or no such stat.
    pub fn open(vcpu: &Vcpu) -> Option<Self> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd
        // (or -1); the vCPU fd is valid for the call.
        let raw = unsafe { libc::ioctl(vcpu.fd().as_raw_fd(), KVM_GET_STATS_FD as _, 0) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a new fd this process owns from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut hdr = [0u8; 24];
        pread(&fd, &mut hdr, 0)?;
        let u = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (name_size, num_desc, desc_offset, data_offset) =
            (u(&hdr, 4), u(&hdr, 8), u(&hdr, 16), u(&hdr, 20));
        let dsize = 16 + name_size as usize;
        if num_desc > 4096 || name_size > 4096 {
            return None;
        }
        let mut descs = vec![0u8; dsize * num_desc as usize];
        pread(&fd, &mut descs, desc_offset as u64)?;
        for d in descs.chunks_exact(dsize) {
            let name = &d[16..];
            let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            if &name[..end] == b"blocking" {
                return Some(Self {
                    fd,
                    offset: data_offset as u64 + u(d, 8) as u64,
                });
            }
        }
        None
    }

    /// Is the vCPU halted inside `KVM_RUN` right now?
    pub fn blocking(&self) -> bool {
        let mut v = [0u8; 8];
        pread(&self.fd, &mut v, self.offset).is_some() && u64::from_ne_bytes(v) != 0
    }
}

fn pread(fd: &OwnedFd, buf: &mut [u8], off: u64) -> Option<()> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writes; the fd is
    // open.
    let n = unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            off as libc::off_t,
        )
    };
    (n == buf.len() as isize).then_some(())
}

/// The exit mapping of a Linux guest: devices as in `vmm run`; under the
/// scheduler, a kicked vCPU found halted sleeps `halt_ns` there.
pub struct LinuxMapper {
    devices: Arc<LegacyDevices>,
    /// `None`: halted vCPUs keep their thread (the host runner).
    halt_ns: Option<u64>,
}

impl LinuxMapper {
    /// For a VM's devices, under the scheduler.
    pub fn new(devices: Arc<LegacyDevices>, halt_ns: u64) -> Self {
        Self {
            devices,
            halt_ns: Some(halt_ns.max(1)),
        }
    }

    /// For a VM's devices, on the host 1:1 runner: a halted vCPU waits in
    /// `KVM_RUN` on its own thread.
    pub fn host(devices: Arc<LegacyDevices>) -> Self {
        Self {
            devices,
            halt_ns: None,
        }
    }
}

impl ExitMapper for LinuxMapper {
    fn io(&self) -> &dyn PortIo {
        &*self.devices
    }

    fn map_exit(&self, vcpu: &Vcpu, exit: VcpuExit) -> Action {
        match handle_exit(vcpu, exit) {
            Some(r) => Action::Fail(r),
            None => Action::Continue,
        }
    }

    fn on_kicked(&self, vcpu: &Vcpu) -> Option<Action> {
        let halt_ns = self.halt_ns?;
        match vcpu.mp_state() {
            Ok(KVM_MP_STATE_HALTED) => Some(Action::Sleep(halt_ns)),
            _ => None,
        }
    }
}

/// How `vmm run --sched vcpu_sched` runs a Linux VM.
#[derive(Clone, Debug)]
pub struct LinuxSchedOptions {
    /// The fixes.
    pub mitigations: vcpu_sched::Mitigations,
    /// The vCPUs' policy in the scheduler (`--rt`: FIFO/RR; else fair).
    pub policy: vcpu_sched::Policy,
    /// vCPU `i` may run on host CPU `pins[i]` only (`--pin`).
    pub pins: Option<Vec<u32>>,
    /// Give up after this long.
    pub timeout: Option<std::time::Duration>,
    /// Halt poll period.
    pub poll: std::time::Duration,
    /// How long a halted vCPU gives up its slot.
    pub halt: std::time::Duration,
}

/// Runs a built Linux VM with its vCPUs as `vcpu_sched` tasks (one task
/// group) on the M:N worker executor over the host's CPUs, until the VM
/// stops or the timeout passes. Returns why it stopped.
pub fn run_sched(
    mut vm: crate::vm::LinuxVm,
    opts: &LinuxSchedOptions,
) -> Result<crate::vm::StopReason, super::TaskError> {
    use std::time::{Duration, Instant};

    use super::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};
    use crate::vm::StopReason;

    crate::vcpu::install_kick_signal()?;
    let topo = Arc::new(topology::load("host")?);
    let vcpus = vm.take_vcpus();
    let n = vcpus.len();
    let stats: Vec<Option<BlockingStat>> = vcpus.iter().map(BlockingStat::open).collect();
    if stats.iter().any(|s| s.is_none()) {
        tracing::warn!(
            "no KVM stats fd with a `blocking` stat: the halt poller kicks every vCPU each period"
        );
    }
    let kickers: Vec<crate::vcpu::Kicker> = vcpus.iter().map(|v| v.kicker()).collect();
    let control = vm.control();
    let devices = vm.devices();
    let placement = match &opts.pins {
        None => vec![Placement {
            policy: opts.policy,
            affinity: None,
        }],
        Some(p) => p
            .iter()
            .map(|&os| {
                let cpu = topo.cpu_by_os_index(os).ok_or_else(|| {
                    super::TaskError::Input(format!("--pin: host CPU {os} is not available"))
                })?;
                Ok(Placement {
                    policy: opts.policy,
                    affinity: Some(vcpu_sched::CpuMask::from_cpus([cpu])),
                })
            })
            .collect::<Result<Vec<_>, super::TaskError>>()?,
    };
    let guest = GuestVm {
        name: "vm0".into(),
        vcpus,
        mapper: Arc::new(LinuxMapper::new(
            devices.clone(),
            opts.halt.as_nanos() as u64,
        )),
        control: control.clone(),
        placement,
        keep: Box::new(vm),
    };
    let set = VmSet::new(vec![guest])?;
    let mut eo = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    eo.kind = ExecutorKind::Workers;
    eo.mitigations = opts.mitigations;
    control.mark_started();
    let running = Running::start(&eo, set.clone())?;
    let t0 = Instant::now();
    let mut halts_found = 0u64;
    let reason = loop {
        if let Some(r) = control.reason() {
            break r;
        }
        if set.vms()[0].live() == 0 {
            break control.reason().unwrap_or(StopReason::VcpuFailed {
                vcpu: 0,
                what: "every vCPU ended".into(),
            });
        }
        if let Some(t) = opts.timeout {
            if t0.elapsed() >= t {
                control.request_stop(StopReason::Timeout(t));
                break control.reason().unwrap_or(StopReason::Timeout(t));
            }
        }
        for (s, k) in stats.iter().zip(&kickers) {
            if s.as_ref().is_none_or(|s| s.blocking()) {
                halts_found += 1;
                k.kick();
            }
        }
        std::thread::sleep(opts.poll.max(Duration::from_micros(100)));
    };
    let out = running.stop(Duration::from_secs(10));
    devices.flush_console();
    match out {
        Ok(o) => tracing::debug!(
            vcpus = n,
            halts_found,
            switches = o.counters.switches,
            violations = o.violations.len(),
            "vcpu_sched run done"
        ),
        Err(e) => tracing::warn!("stopping the vCPUs: {e}"),
    }
    Ok(reason)
}

/// How [`run_threads`] runs the vCPUs.
#[derive(Clone, Debug, Default)]
pub struct ThreadOptions {
    /// vCPU `i` is pinned to OS CPU `pins[i]`.
    pub pins: Option<Vec<u32>>,
    /// Real-time policy for the vCPU threads.
    pub rt: Option<crate::rt::RtPolicy>,
    /// Give up after this long.
    pub timeout: Option<std::time::Duration>,
}

/// Runs every vCPU on a thread of its own (`vcpu<N>`, the host executor)
/// until the VM stops or the timeout passes, and returns why it stopped.
/// Setup failures of a thread (pinning, an RT policy the host refuses)
/// are returned as input errors before the guest runs.
pub fn run_threads(
    mut vm: crate::vm::LinuxVm,
    opts: &ThreadOptions,
) -> Result<crate::vm::StopReason, crate::Error> {
    use std::time::Duration;

    use super::host::{HostOptions, HostRun, ThreadNames};
    use super::{GuestVm, Placement, VmSet};
    use crate::vm::StopReason;

    let vcpus = vm.take_vcpus();
    let n = vcpus.len();
    let control = vm.control();
    let devices = vm.devices();
    let policy = match opts.rt {
        Some(crate::rt::RtPolicy::Fifo(p)) => vcpu_sched::Policy::Fifo(p),
        Some(crate::rt::RtPolicy::Rr(p)) => vcpu_sched::Policy::Rr(p),
        None => vcpu_sched::Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
    };
    let guest = GuestVm {
        name: "vm0".into(),
        vcpus,
        mapper: Arc::new(LinuxMapper::host(devices.clone())),
        control: control.clone(),
        placement: vec![Placement {
            policy,
            affinity: None,
        }],
        keep: Box::new(vm),
    };
    let set = VmSet::new(vec![guest]).map_err(task_err)?;
    let ho = HostOptions {
        pins: (0..n)
            .map(|i| opts.pins.as_ref().map(|p| vec![p[i]]))
            .collect(),
        names: ThreadNames::Vcpu,
        strict_policy: true,
        stack_size: None,
    };
    control.mark_started();
    let run = HostRun::start(&ho, &set).map_err(task_err)?;
    let reason = match control.wait(opts.timeout) {
        Some(r) => r,
        None => {
            let t = opts.timeout.unwrap_or_default();
            control.request_stop(StopReason::Timeout(t));
            control.reason().unwrap_or(StopReason::Timeout(t))
        }
    };
    if let Err(e) = run.shutdown(Duration::from_secs(5)) {
        tracing::warn!("{e}; leaving them behind");
    }
    devices.flush_console();
    Ok(reason)
}

/// Executor errors of `vmm run`: a thread setup the user asked for and
/// the host refused is input; the rest is a runtime failure.
fn task_err(e: super::TaskError) -> crate::Error {
    match e {
        super::TaskError::Input(m) => crate::Error::Input(m),
        other => crate::Error::Other(other.to_string()),
    }
}
