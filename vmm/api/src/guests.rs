//! What `vm.boot` runs: a micro-guest program or a Linux kernel, on the
//! server's shared scheduler or (`--executor host`) on threads of its own.
//!
//! WHAT: [`boot`] builds one VM from its config and placement and starts
//! its vCPUs ([`BootJob`] holds all it needs, taken from the VM table
//! before the lock is let go); the micro-guest programs
//! (`x_vmm.micro`); the Linux boot with its halt poller; the exit-counting
//! mapper ([`ExitCounts`], by [`EXIT_REASONS`]); the test faults
//! `VMM_INJECT` arms.
//! WHY: a boot opens `/dev/kvm`, reads a kernel and maps guest memory:
//! slow work that must never run under the server's state lock, and that
//! knows nothing of HTTP or of the VM table.
//! HOW: plain blocking functions, called on tokio's blocking pool by the
//! controller; errors are strings the controller answers with as a 500.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vmm_devices::virtio::fs::BackendHealth;

use topology::{GuestTopology, HostTopology};
use vcpu_sched::placement::pack::VmPlan;
use vcpu_sched::{CpuMask, Policy};
use vmm_machine::devices::CpuHotplug;
use vmm_machine::micro::asm::GuestAsm;
use vmm_machine::micro::{MicroError, MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu::{PortIo, Vcpu, VcpuExit};
use vmm_machine::vcpu_body::{
    Action, ExecOptions, ExitMapper, GuestVm, Placement, Running, VcpuPool, VmSet,
};

use super::api::{self, VmConfig};
use super::files::{self, FileId};

/// Exit reasons counted per VM (`vmm_vm_exits_total{reason}`).
pub const EXIT_REASONS: [&str; 9] = [
    "halt",
    "io",
    "kicked",
    "reset",
    "power_off",
    "shutdown",
    "internal_error",
    "fail_entry",
    "other",
];

/// A VM's vCPU exits by reason ([`EXIT_REASONS`] order), over all its
/// boots.
#[derive(Debug, Default)]
pub struct ExitCounts([AtomicU64; 9]);

impl ExitCounts {
    /// (reason, count) pairs.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        EXIT_REASONS
            .iter()
            .zip(&self.0)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Counts each exit by reason on its way to the VM's own mapping: exits
/// that reach the executor (a port write a device handles inside the
/// vCPU's run loop does not).
struct CountingMapper {
    inner: Arc<dyn ExitMapper>,
    counts: Arc<ExitCounts>,
}

impl ExitMapper for CountingMapper {
    fn io(&self) -> &dyn PortIo {
        self.inner.io()
    }
    fn map_exit(&self, vcpu: &Vcpu, exit: VcpuExit) -> Action {
        let i = match &exit {
            VcpuExit::Halt => 0,
            VcpuExit::Io { .. } => 1,
            VcpuExit::Kicked => 2,
            VcpuExit::Reset => 3,
            VcpuExit::PowerOff => 4,
            VcpuExit::Shutdown => 5,
            VcpuExit::InternalError { .. } => 6,
            VcpuExit::FailEntry { .. } => 7,
            VcpuExit::Unexpected(_) => 8,
        };
        self.counts.0[i].fetch_add(1, Ordering::Relaxed);
        self.inner.map_exit(vcpu, exit)
    }
    fn on_kicked(&self, vcpu: &Vcpu) -> Option<Action> {
        self.counts.0[2].fetch_add(1, Ordering::Relaxed);
        self.inner.on_kicked(vcpu)
    }
    fn before_entry(&self, vcpu: &Vcpu) {
        self.inner.before_entry(vcpu)
    }
    fn wake_ends_sleep(&self) -> bool {
        self.inner.wake_ends_sleep()
    }
    fn attached(&self, waker: vmm_machine::vcpu_body::VcpuWaker) {
        self.inner.attached(waker)
    }
    fn halts_in_kvm(&self) -> bool {
        self.inner.halts_in_kvm()
    }
}

/// Everything one boot needs, taken from the VM table under its lock.
pub struct BootJob {
    /// The VM id.
    pub id: String,
    /// Its config, as created.
    pub config: VmConfig,
    /// Its placement (absent: any CPU).
    pub plan: Option<VmPlan>,
    /// The server's topology.
    pub topo: Arc<HostTopology>,
    /// The shared scheduler (`None` with `--executor host`).
    pub pool: Option<Arc<VcpuPool>>,
    /// How to run the VM on threads of its own (`--executor host`).
    pub exec: ExecOptions,
    /// KVM, for micro-guests.
    pub micro: Arc<MicroHost>,
    /// The VM's exits by reason, kept over boots.
    pub counts: Arc<ExitCounts>,
    /// The serial file this VM made at an earlier boot.
    pub console: Option<FileId>,
    /// The virtio console's file this VM made at an earlier boot.
    pub vconsole: Option<FileId>,
}

/// A booted VM: its running vCPUs and the serial file it writes (made or
/// reopened by this boot).
pub struct Booted {
    /// The vCPUs.
    pub running: Arc<Running>,
    /// The serial file's identity, with `serial.mode` `File`.
    pub console: Option<FileId>,
    /// The virtio console file's identity, with `console.mode` `File`.
    pub vconsole: Option<FileId>,
    /// The devices with an external backend (virtio-fs): each one's name
    /// and whether its backend still serves it.
    pub backends: Vec<(String, BackendHealth)>,
    /// The ACPI CPU hotplug controller (a Linux guest with `max_vcpus`
    /// above `boot_vcpus`).
    pub cpu_hotplug: Option<Arc<CpuHotplug>>,
    /// The Linux guest's devices (PCI hotplug); `None` for micro-guests.
    pub devices: Option<Arc<vmm_machine::devices::Devices>>,
}

/// Builds the VM `job` describes and starts its vCPUs. Blocking: KVM,
/// guest memory, the kernel's file.
pub fn boot(job: BootJob) -> Result<Booted, String> {
    let placement = placements(&job.config, job.plan.as_ref());
    let on = Executor {
        pool: job.pool.as_ref(),
        eo: &job.exec,
    };
    if job.config.linux_payload() {
        return boot_linux(&job, placement, on);
    }
    let n = job.config.cpus.boot_vcpus as usize;
    let code = program(&micro_program(&job.config)).map_err(|e| e.to_string())?;
    let mut spec = MicroVmSpec::new(job.id.clone(), n, code);
    if let Some(m) = &job.config.memory {
        spec.memory = m.size;
    }
    let vm = MicroVm::build(&job.micro, &spec).map_err(|e| e.to_string())?;
    let mut guest = vm.into_guest(placement);
    arm_faults(&job.id, &mut guest.vcpus)?;
    guest.mapper = Arc::new(CountingMapper {
        inner: guest.mapper,
        counts: job.counts.clone(),
    });
    tracing::info!(vm = job.id, "booting");
    let (running, _) = on.start(guest)?;
    Ok(Booted {
        running: Arc::new(running),
        console: None,
        vconsole: None,
        backends: Vec::new(),
        cpu_hotplug: None,
        devices: None,
    })
}

/// Each vCPU's scheduling policy (`x_vmm.rt`, else fair) and host CPU
/// (the plan's, else any).
fn placements(cfg: &VmConfig, plan: Option<&VmPlan>) -> Vec<Placement> {
    let rt = cfg.x_vmm.as_ref().and_then(|x| x.rt.clone());
    let policy = |k: usize| match &rt {
        Some(r) if r.policy == "rr" => Policy::Rr(r.priority_of(k)),
        Some(r) => Policy::Fifo(r.priority_of(k)),
        None => Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
    };
    (0..cfg.max_vcpus() as usize)
        .map(|k| Placement {
            policy: policy(k),
            affinity: plan.map(|p| CpuMask::single(p.dense[k])),
        })
        .collect()
}

/// The micro-guest `x_vmm.micro` names (`ticker` when absent).
fn micro_program(cfg: &VmConfig) -> String {
    cfg.x_vmm
        .as_ref()
        .and_then(|x| x.micro.clone())
        .unwrap_or_else(|| "ticker".into())
}

/// The micro-guest program's code.
fn program(name: &str) -> Result<Vec<u8>, MicroError> {
    use vmm_machine::micro::asm::{Op, Script};
    let jump_back = |g: &mut GuestAsm, top| {
        g.raw()
            .jmp(top)
            .map_err(|e| MicroError::Assemble(e.to_string()))
    };
    match name {
        "exit" => Script {
            vcpus: vec![],
            others: vec![Op::Report(1), Op::Done(0)],
        }
        .assemble(),
        "crash" => Script {
            vcpus: vec![vec![Op::Report(1), Op::Crash]],
            others: vec![Op::Report(1), Op::Sleep(1_000_000), Op::Done(0)],
        }
        .assemble(),
        "spin" => {
            let mut g = GuestAsm::new()?;
            let mut top = g.label();
            g.bind(&mut top)?;
            g.compute(1_000_000)?;
            jump_back(&mut g, top)?;
            g.finish()
        }
        _ => {
            let mut g = GuestAsm::new()?;
            let mut top = g.label();
            g.bind(&mut top)?;
            g.compute(2000)?;
            g.report(1)?;
            g.sleep_ns(1_000_000)?;
            jump_back(&mut g, top)?;
            g.finish()
        }
    }
}

/// Arms the test faults `VMM_INJECT` names for VM `id` (see
/// [`vmm_machine::vcpu::inject`]; unset in normal use).
fn arm_faults(id: &str, vcpus: &mut [Vcpu]) -> Result<(), String> {
    for (k, f) in vmm_machine::vcpu::inject::for_vm(id)? {
        let n = vcpus.len();
        let v = vcpus
            .get_mut(k)
            .ok_or_else(|| format!("VMM_INJECT: VM {id} has {n} vCPUs, no vCPU {k}"))?;
        tracing::warn!(vm = id, vcpu = k, fault = %f.kind, at = f.at, "test fault armed");
        v.inject(f);
    }
    Ok(())
}

/// Where a booted VM runs: the server's shared pool, or (`--executor
/// host`) an executor of its own.
#[derive(Clone, Copy)]
struct Executor<'a> {
    pool: Option<&'a Arc<VcpuPool>>,
    eo: &'a ExecOptions,
}

impl Executor<'_> {
    /// Makes the VM's set (on the pool's clock) and starts its vCPUs.
    fn start(self, guest: GuestVm) -> Result<(Running, Arc<VmSet>), String> {
        let set = match self.pool {
            Some(p) => VmSet::new_on(vec![guest], p.epoch()),
            None => VmSet::new(vec![guest]),
        }
        .map_err(|e| e.to_string())?;
        let r = match self.pool {
            Some(p) => Running::start_on(p, set.clone()),
            None => Running::start(self.eo, set.clone()),
        };
        r.map(|r| (r, set)).map_err(|e| e.to_string())
    }
}

/// Where a Linux guest's serial console goes (`serial.mode`): a file this
/// VM made, the server's stdout, or nowhere.
fn console_of(
    cfg: &VmConfig,
    made: Option<FileId>,
) -> Result<(Box<dyn std::io::Write + Send>, Option<FileId>), String> {
    match &cfg.serial {
        Some(c) if c.mode == "File" => {
            let f = c
                .file
                .as_deref()
                .ok_or("serial.file: give a file for mode File")?;
            let (file, id) = files::open_console("serial", f, made)?;
            Ok((Box::new(file), Some(id)))
        }
        Some(c) if c.mode == "Tty" => Ok((Box::new(std::io::stdout()), None)),
        _ => Ok((Box::new(std::io::sink()), None)),
    }
}

/// The virtio console's host end (`console.mode`), if the VM has one:
/// the server's stdout, a file this VM makes (or made at an earlier boot),
/// a new pty, or a new Unix socket (removed when the VM ends).
struct VirtioConsole {
    out: Box<dyn std::io::Write + Send>,
    input: Option<std::os::fd::OwnedFd>,
    made: Option<FileId>,
    guard: Option<vmm_machine::console_host::SocketGuard>,
}

fn virtio_console_of(
    cfg: &VmConfig,
    made: Option<FileId>,
) -> Result<Option<VirtioConsole>, String> {
    use vmm_machine::console_host;
    let Some(c) = cfg.console.as_ref().filter(|c| c.is_device()) else {
        return Ok(None);
    };
    let plain = |out: Box<dyn std::io::Write + Send>, made| VirtioConsole {
        out,
        input: None,
        made,
        guard: None,
    };
    let host = |h: console_host::HostConsole| VirtioConsole {
        out: h.out,
        input: Some(h.input),
        made: None,
        guard: h.guard,
    };
    Ok(Some(match c.mode.as_str() {
        "File" => {
            let f = c
                .file
                .as_deref()
                .ok_or("console.file: give a file for mode File")?;
            let (file, id) = files::open_console("console", f, made)?;
            plain(Box::new(file), Some(id))
        }
        "Pty" => host(console_host::pty().map_err(|e| format!("console.mode Pty: {e}"))?),
        "Socket" => {
            let p = c
                .socket
                .as_deref()
                .ok_or("console.socket: give a path for mode Socket")?;
            host(
                console_host::socket(std::path::Path::new(p))
                    .map_err(|e| format!("console.socket {p}: {e}"))?,
            )
        }
        _ => plain(Box::new(std::io::stdout()), None),
    }))
}

/// A built Linux VM, the serial and console files it made, and what to
/// keep while it runs.
type BuiltLinux = (
    vmm_machine::vm::LinuxVm,
    (Option<FileId>, Option<FileId>),
    Option<vmm_machine::console_host::SocketGuard>,
);

/// Builds a Linux VM (`payload.kernel`): checks its files again (they may
/// have changed since `vm.create`), reads the kernel, maps its memory.
fn build_linux(job: &BootJob) -> Result<BuiltLinux, String> {
    let cfg = &job.config;
    files::check_payload_files(cfg).map_err(|e| e.error)?;
    let shape = cfg.guest_shape().map_err(|e| e.error)?;
    let guest = GuestTopology::from_spec(&shape).map_err(|e| e.to_string())?;
    let p = cfg.payload.clone().unwrap_or_default();
    let (serial, made) = console_of(cfg, job.console)?;
    let vcons = virtio_console_of(cfg, job.vconsole)?;
    let vmade = vcons.as_ref().and_then(|v| v.made);
    // With a virtio console the guest's console (what `console` names)
    // is hvc0, and COM1 writes where `serial` says.
    let (console, serial, input, guard) = match vcons {
        Some(v) => (v.out, Some(serial), v.input, v.guard),
        None => (serial, None, None, None),
    };
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
    let plan = job.plan.as_ref();
    let spec = vmm_machine::vm::LinuxVmSpec {
        guest,
        memory: cfg
            .memory
            .as_ref()
            .map_or(api::LINUX_DEFAULT_MEMORY, |m| m.size),
        kernel: p.kernel.clone().unwrap_or_default().into(),
        initrd: p.initramfs.clone().map(Into::into),
        cmdline: p.cmdline.clone().unwrap_or_default(),
        vendor: None,
        compat: vmm_machine::compat::CompatArg::Auto.resolve(),
        pins: plan.map(|p| vcpu_sched::placement::pin::PinPlan {
            dense: p.dense.clone(),
            os: p.os.clone(),
        }),
        host: plan.map(|_| (*job.topo).clone()),
        console,
        until: None,
        devices: cfg.device_spec().map_err(|e| e.error)?,
        shared_memory: cfg.memory.as_ref().is_some_and(|m| m.shared),
        console_input: input,
        serial,
        boot_vcpus: Some(cfg.cpus.boot_vcpus as usize),
        pci_hotplug: true,
    };
    let vm = vmm_machine::vm::LinuxVm::build(&kvm, spec).map_err(|e| e.to_string())?;
    Ok((vm, (made, vmade), guard))
}

/// Builds and starts a Linux VM: its vCPUs become tasks like a
/// micro-guest's. On the shared pool its [`HaltPoller`] joins the pool's
/// one halt-poll thread (`VcpuPool::poll_hub`), which kicks halted vCPUs
/// out of `KVM_RUN` (the in-kernel irqchip keeps HLT inside KVM) and
/// wakes them when an interrupt is pending, until the set stops, as `vmm
/// run --sched vcpu_sched` does on its own thread; with `--executor host`
/// each vCPU keeps its thread, halted or not, as `vmm run --sched host`.
///
/// [`HaltPoller`]: vmm_machine::vcpu_body::linux::HaltPoller
fn boot_linux(job: &BootJob, placement: Vec<Placement>, on: Executor) -> Result<Booted, String> {
    use vmm_machine::vcpu_body::linux::{apic_ids, HaltPoller, HaltSleep, LinuxMapper};
    let id = job.id.as_str();
    let (mut vm, (console, vconsole), guard) = build_linux(job)?;
    let mut vcpus = vm.take_vcpus();
    arm_faults(id, &mut vcpus)?;
    let control = vm.control();
    let apics = apic_ids(&vm);
    let msi_wake = vm.msi_wake();
    let backends = vm.devices().backend_health();
    let cpu_hotplug = vm.devices().cpu_hotplug().cloned();
    let devices = vm.devices();
    // On threads of its own (`--executor host`, no pool) a halted vCPU
    // waits inside `KVM_RUN` on its own thread and KVM wakes that thread
    // for an interrupt, as under `vmm run --sched host`: no halt sleeps
    // and no poller, so the host kernel's row is the plain 1:1 threads.
    let host_threads = job.pool.is_none();
    if !host_threads && !vm.disable_halt_polling() {
        tracing::debug!(
            vm = id,
            "KVM has no KVM_CAP_HALT_POLL: its halt polling stays on"
        );
    }
    let park = job.pool.as_ref().is_some_and(|p| p.halt_park());
    let mapper = Arc::new(if host_threads {
        LinuxMapper::host(vm.devices())
    } else {
        let m = LinuxMapper::new(vm.devices(), vcpus.len(), HaltSleep::default())
            .with_preempt_marks(vm.ram().memory().clone());
        if park {
            m.with_parking(vm.vm_fd(), &vcpus)
                .map_err(|e| format!("VM {id}: parking its halted vCPUs: {e}"))?
        } else {
            m
        }
    });
    let poller = (!host_threads).then(|| HaltPoller::new(mapper.clone(), &vcpus));
    let guest = GuestVm {
        name: id.to_string(),
        vcpus,
        mapper: Arc::new(CountingMapper {
            inner: mapper,
            counts: job.counts.clone(),
        }),
        control: control.clone(),
        placement,
        keep: Box::new((vm, guard)),
    };
    control.mark_started();
    tracing::info!(vm = id, "booting Linux");
    let (running, set) = on.start(guest)?;
    let running = Arc::new(running);
    if let Some(poller) = poller {
        let hub = job
            .pool
            .as_ref()
            .and_then(|p| p.poll_hub())
            .ok_or_else(|| format!("VM {id}: no halt-poll thread to run its halted vCPUs"))?;
        drop(set);
        hub.add(poller, &apics, &msi_wake, &running);
    }
    Ok(Booted {
        running,
        console,
        vconsole,
        backends,
        cpu_hotplug,
        devices: Some(devices),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inner mapper with the non-default answers.
    struct Linuxish;

    impl PortIo for Linuxish {
        fn pio_read(&self, _: usize, _: u16, _: &mut [u8]) {}
        fn pio_write(&self, _: usize, _: u16, _: &[u8]) -> vmm_machine::vcpu::IoAction {
            vmm_machine::vcpu::IoAction::Continue
        }
        fn mmio_read(&self, _: usize, _: u64, _: &mut [u8]) {}
        fn mmio_write(&self, _: usize, _: u64, _: &[u8]) -> vmm_machine::vcpu::IoAction {
            vmm_machine::vcpu::IoAction::Continue
        }
    }

    impl ExitMapper for Linuxish {
        fn io(&self) -> &dyn PortIo {
            self
        }
        fn map_exit(&self, _: &Vcpu, _: VcpuExit) -> Action {
            Action::Continue
        }
        fn wake_ends_sleep(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_counting_wrapper_keeps_the_inner_mappers_wake_rule() {
        // A Linux guest's imposed sleep must end at a device interrupt's
        // wake under `vmm serve` as under `vmm run`.
        let m = CountingMapper {
            inner: Arc::new(Linuxish),
            counts: Arc::default(),
        };
        assert!(m.wake_ends_sleep());
    }
}
