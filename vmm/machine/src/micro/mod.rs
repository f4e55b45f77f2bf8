//! Built-in micro-guests: tiny x86-64 programs, generated in Rust with
//! iced-x86's assembler, that talk to the VMM through a five-port
//! paravirtual interface ([`proto`]) and wait with `HLT`.
//!
//! They exist to put real KVM vCPUs under the scheduler at full rate:
//! there is no in-kernel irqchip, so every `HLT` and every doorbell exits
//! to the VMM, and a VM is built and running in well under a millisecond
//! (even under kvm_pvm, where the guest's instructions are emulated).
//!
//! # The machine
//! * 64-bit long mode from the first instruction: paging on, an identity
//!   map of the first GiB with 2 MiB pages (RAM, then nothing but the
//!   device window: an access elsewhere is reported as a bad MMIO
//!   access), flat code (selector 0x10) and data
//!   (0x18) segments, interrupts off, and an empty IDT, so that any
//!   exception ends in a triple fault (reported, VM torn down).
//! * RAM from guest-physical 0, 2 MiB by default (up to 1 GiB):
//!
//! ```text
//! 0x0000_0500  GDT, then the (empty) IDT          } the same long-mode
//! 0x0000_9000  PML4, PDPT (0xA000), PD (0xB000)   } entry as a Linux guest
//! 0x0001_0000  code (CODE_ADDR; at most CODE_MAX bytes), entry point
//! 0x0004_0000  stacks, STACK_SIZE bytes per vCPU, growing down from STACK_TOP
//! 0x0010_0000  shared data (DATA_ADDR) up to the end of RAM
//!  ...         no RAM (at most 1008 MiB of RAM with devices)
//! 0x3f00_0000  device i's 64 KiB BAR at 0x3f00_0000 + i * 0x1_0000 (up to 16)
//! 0x4000_0000  end of the identity map
//! ```
//! * Every vCPU starts at [`CODE_ADDR`] with `RDI` = its index, `RSI` =
//!   the number of vCPUs, `RBX` = [`DATA_ADDR`], `RSP` = its own stack.
//! * Devices only if the spec asks ([`MicroVmSpec::devices`]): virtio
//!   devices on the modern PCI transport at fixed addresses, no PCI
//!   enumeration, MSI-X vectors that wake a vCPU ([`devices`]). [`driver`]
//!   is a virtio driver written in the same assembler, [`blk`] the
//!   virtio-blk programs built on it (integrity writer, IOPS, hostile
//!   drivers) and the host's check of what they wrote, [`net`] the
//!   virtio-net ones, [`vsock`] a virtio-vsock echo server.
//! * Everything else is an error that stops the VM with a message: a read
//!   of any port, a write to a port that is not in [`proto`], any access
//!   to memory that is neither RAM nor a device's BAR; nothing else in the
//!   process is affected. (A device refuses what a driver does wrong with
//!   `NEEDS_RESET` instead: the guest goes on and may reset it.)

pub mod asm;
pub mod blk;
pub mod devices;
pub mod driver;
pub mod net;
pub mod proto;
pub mod vsock;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kvm_bindings::CpuId;
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_devices::pci::PciDevice;

use crate::vcpu::{IoAction, Kicker, PortIo, Vcpu, VcpuExit};
use crate::vcpu_body::{Action, ExitMapper, VcpuWaker};
use crate::vm::{handle_exit, StopReason, VmControl};
use devices::{DeviceSlot, MicroDevice, WakerSlot};
use proto::{ProtoError, Request};

/// Where the code is loaded, and the entry point of every vCPU.
pub const CODE_ADDR: u64 = 0x1_0000;
/// The largest program.
pub const CODE_MAX: u64 = 0x3_0000;
/// The top of vCPU 0's stack; vCPU `i`'s is `STACK_TOP - i * STACK_SIZE`.
pub const STACK_TOP: u64 = 0x10_0000;
/// Stack bytes per vCPU.
pub const STACK_SIZE: u64 = 0x300;
/// The shared data area.
pub const DATA_ADDR: u64 = 0x10_0000;
/// Default (and smallest) RAM.
pub const MIN_MEMORY: u64 = 2 << 20;
/// Largest RAM (what one page directory maps).
pub const MAX_MEMORY: u64 = 1 << 30;
/// The most vCPUs a micro-guest may have (the stack area's size).
pub const MAX_VCPUS: usize = ((STACK_TOP - 0x4_0000) / STACK_SIZE) as usize;

/// Errors building a micro-guest.
#[derive(Debug, thiserror::Error)]
pub enum MicroError {
    /// The program could not be assembled.
    #[error("assembling the micro-guest: {0}")]
    Assemble(String),
    /// A bad request (sizes, counts).
    #[error("{0}")]
    Input(String),
    /// A KVM call failed.
    #[error("{op} failed: {source}")]
    Kvm {
        /// The operation.
        op: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// A vCPU could not be created.
    #[error(transparent)]
    Vcpu(#[from] crate::vcpu::VcpuError),
    /// Guest memory.
    #[error("guest memory: {0}")]
    Memory(String),
    /// A disk image the spec names.
    #[error(transparent)]
    Disk(#[from] vmm_devices::virtio::block::DiskError),
    /// A device could not be built.
    #[error(transparent)]
    Device(#[from] vmm_devices::DeviceError),
    /// A tap the spec names (missing, not a tap, in use).
    #[error(transparent)]
    Tap(#[from] vmm_devices::tap::TapError),
    /// A vsock device the spec names (its CID, its socket path).
    #[error(transparent)]
    Vsock(#[from] vmm_devices::virtio::vsock::VsockError),
}

/// What every micro-guest needs from KVM, opened once: `/dev/kvm` and the
/// supported CPUID.
pub struct MicroHost {
    kvm: Kvm,
    cpuid: CpuId,
    max_vcpus: usize,
}

impl MicroHost {
    /// Opens `/dev/kvm`.
    pub fn open() -> Result<Self, MicroError> {
        let kvm = Kvm::new().map_err(|source| MicroError::Kvm {
            op: "opening /dev/kvm",
            source,
        })?;
        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(|source| MicroError::Kvm {
                op: "KVM_GET_SUPPORTED_CPUID",
                source,
            })?;
        let max_vcpus = kvm.get_max_vcpus().min(MAX_VCPUS);
        Ok(Self {
            kvm,
            cpuid,
            max_vcpus,
        })
    }

    /// The most vCPUs one micro-guest may have here.
    pub fn max_vcpus(&self) -> usize {
        self.max_vcpus
    }
}

/// A micro-guest to build.
#[derive(Clone, Debug)]
pub struct MicroVmSpec {
    /// Its name, used in reports.
    pub name: String,
    /// vCPUs.
    pub vcpus: usize,
    /// RAM in bytes: a multiple of 2 MiB, 2 MiB to 1 GiB.
    pub memory: u64,
    /// The program, assembled at [`CODE_ADDR`].
    pub code: Vec<u8>,
    /// Initial contents of the data area (at [`DATA_ADDR`]).
    pub data: Vec<u8>,
    /// How many `REPORT` values to keep per vCPU, in order (the count and
    /// the sum are always kept).
    pub report_log: usize,
    /// Virtio devices, device `i`'s BAR at
    /// [`DEVICE_BASE`](devices::DEVICE_BASE)` + i * 64 KiB` (see
    /// [`devices`]).
    pub devices: Vec<MicroDevice>,
    /// Host CPUs (OS numbers) its devices' I/O threads run on
    /// (`VirtioPci::with_io_cpus`); `None`: wherever the host kernel
    /// puts them.
    pub io_cpus: Option<Vec<usize>>,
}

impl MicroVmSpec {
    /// A spec with default memory, no initial data and no report log.
    pub fn new(name: impl Into<String>, vcpus: usize, code: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            vcpus,
            memory: MIN_MEMORY,
            code,
            data: Vec::new(),
            report_log: 0,
            devices: Vec::new(),
            io_cpus: None,
        }
    }
}

/// `REPORT`s of one vCPU.
#[derive(Default)]
struct Reports {
    count: AtomicU64,
    sum: AtomicU64,
    log: Mutex<Vec<u32>>,
}

/// The micro-guest's side of the VMM: its [`PortIo`] and its
/// [`ExitMapper`]. Shared by its vCPUs.
pub struct MicroIo {
    name: String,
    vcpus: usize,
    ram: u64,
    log_cap: usize,
    reports: Box<[Reports]>,
    faults: Box<[Mutex<Option<ProtoError>>]>,
    kickers: OnceLock<Vec<Kicker>>,
    devices: Vec<DeviceSlot>,
    waker: WakerSlot,
    on_report: OnceLock<ReportHook>,
}

/// Called with (vCPU, value) for every `REPORT`, on the vCPU's thread.
type ReportHook = Box<dyn Fn(usize, u32) + Send + Sync>;

impl MicroIo {
    fn fault(&self, vcpu: usize, e: ProtoError) {
        if let Some(f) = self.faults.get(vcpu) {
            let mut g = f.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_none() {
                *g = Some(e);
            }
        }
        // Get the vCPU out of KVM_RUN: its run returns Kicked, and
        // `on_kicked` finds the fault.
        if let Some(k) = self.kickers.get().and_then(|k| k.get(vcpu)) {
            k.kick();
        }
    }

    /// The values vCPU `vcpu` reported, in order (up to the spec's
    /// `report_log`).
    pub fn report_log(&self, vcpu: usize) -> Vec<u32> {
        self.reports
            .get(vcpu)
            .map(|r| r.log.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default()
    }

    /// How many values vCPU `vcpu` reported.
    pub fn report_count(&self, vcpu: usize) -> u64 {
        self.reports
            .get(vcpu)
            .map_or(0, |r| r.count.load(Ordering::Relaxed))
    }

    /// The sum of the values vCPU `vcpu` reported.
    pub fn report_sum(&self, vcpu: usize) -> u64 {
        self.reports
            .get(vcpu)
            .map_or(0, |r| r.sum.load(Ordering::Relaxed))
    }

    /// Calls `f(vcpu, value)` for every `REPORT` from now on, on the
    /// reporting vCPU's thread, before the vCPU resumes (keep it short).
    /// False if a hook was already set.
    pub fn set_report_hook(&self, f: impl Fn(usize, u32) + Send + Sync + 'static) -> bool {
        self.on_report.set(Box::new(f)).is_ok()
    }

    /// Device `i`'s status byte (`None`: no such device, or torn down).
    pub fn device_status(&self, i: usize) -> Option<u8> {
        let d = self.devices.get(i)?;
        let mut g = d.pci.lock().unwrap_or_else(|p| p.into_inner());
        let mut b = [0u8; 1];
        g.as_mut()?.read_bar(0, 0x14, &mut b);
        Some(b[0])
    }

    /// The device whose BAR holds `addr`, and the offset in it.
    fn device_at(&self, addr: u64) -> Option<(&DeviceSlot, u64)> {
        self.devices
            .iter()
            .find_map(|d| d.offset(addr).map(|o| (d, o)))
    }

    /// Drops the devices (their I/O threads stop, their images are closed
    /// and unlocked) and forgets the executor's waker: the VM is torn down.
    fn release_devices(&self) {
        for d in &self.devices {
            let dev = d.pci.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(dev);
        }
        self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn proto_failure(&self, vcpu: usize, e: &ProtoError) -> Action {
        Action::Fail(StopReason::VcpuFailed {
            vcpu,
            what: format!("micro-guest {}: {e}", self.name),
        })
    }
}

impl PortIo for MicroIo {
    fn pio_read(&self, vcpu: usize, port: u16, data: &mut [u8]) {
        data.fill(0xff);
        self.fault(vcpu, ProtoError::Read { port });
    }
    fn pio_write(&self, _vcpu: usize, _port: u16, _data: &[u8]) -> IoAction {
        // Every write goes to the mapper, which decodes and checks it.
        IoAction::Exit
    }
    fn mmio_read(&self, vcpu: usize, addr: u64, data: &mut [u8]) {
        if let Some((d, off)) = self.device_at(addr) {
            let mut g = d.pci.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(pci) = g.as_mut() {
                pci.read_bar(0, off, data);
                return;
            }
        }
        data.fill(0xff);
        self.fault(
            vcpu,
            ProtoError::Mmio {
                what: "read from",
                addr,
                ram: self.ram,
            },
        );
    }
    fn mmio_write(&self, vcpu: usize, addr: u64, data: &[u8]) -> IoAction {
        if let Some((d, off)) = self.device_at(addr) {
            let mut g = d.pci.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(pci) = g.as_mut() {
                pci.write_bar(0, off, data);
                return IoAction::Continue;
            }
        }
        self.fault(
            vcpu,
            ProtoError::Mmio {
                what: "wrote to",
                addr,
                ram: self.ram,
            },
        );
        IoAction::Continue
    }
}

impl ExitMapper for MicroIo {
    fn io(&self) -> &dyn PortIo {
        self
    }

    fn map_exit(&self, vcpu: &Vcpu, exit: VcpuExit) -> Action {
        let i = vcpu.index();
        match exit {
            VcpuExit::Io { port, value, size } => {
                match proto::decode(port, value, size, self.vcpus) {
                    Ok(Request::Report(v)) => {
                        if let Some(f) = self.on_report.get() {
                            f(i, v);
                        }
                        if let Some(r) = self.reports.get(i) {
                            r.count.fetch_add(1, Ordering::Relaxed);
                            r.sum.fetch_add(v as u64, Ordering::Relaxed);
                            if self.log_cap > 0 {
                                let mut l = r.log.lock().unwrap_or_else(|p| p.into_inner());
                                if l.len() < self.log_cap {
                                    l.push(v);
                                }
                            }
                        }
                        Action::Continue
                    }
                    Ok(Request::Wake(k)) => Action::Wake(k as usize),
                    Ok(Request::Sleep(ns)) => Action::Sleep(ns as u64),
                    Ok(Request::Yield) => Action::Yield,
                    Ok(Request::Done(0)) => Action::Exit,
                    Ok(Request::Done(code)) => Action::Fail(StopReason::VcpuFailed {
                        vcpu: i,
                        what: format!(
                            "micro-guest {}: the guest reported failure (DONE {code})",
                            self.name
                        ),
                    }),
                    Err(e) => self.proto_failure(i, &e),
                }
            }
            VcpuExit::Halt => Action::Block,
            VcpuExit::Kicked => Action::Continue,
            other => match handle_exit(vcpu, other) {
                Some(reason) => Action::Fail(reason),
                None => Action::Continue,
            },
        }
    }

    fn on_kicked(&self, vcpu: &Vcpu) -> Option<Action> {
        let i = vcpu.index();
        let f = self
            .faults
            .get(i)?
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        Some(self.proto_failure(i, &f))
    }

    fn attached(&self, waker: VcpuWaker) {
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker);
    }
}

/// A built micro-guest: its vCPUs, its I/O side, its control block, its
/// memory and its KVM VM. Fields drop in order: vCPUs, then the VM, then
/// the memory.
pub struct MicroVm {
    /// The vCPUs (take them out to run them).
    pub vcpus: Vec<Vcpu>,
    /// The VM fd (its devices' ioeventfds hold it too).
    pub vm: Arc<VmFd>,
    /// The ports and the exit mapping.
    pub io: Arc<MicroIo>,
    /// Stop requests; every vCPU's kicker is registered.
    pub control: Arc<VmControl>,
    /// Guest RAM.
    pub memory: GuestMemoryMmap,
    /// The name.
    pub name: String,
}

impl std::fmt::Debug for MicroVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicroVm")
            .field("name", &self.name)
            .field("vcpus", &self.vcpus.len())
            .finish()
    }
}

impl MicroVm {
    /// Builds the VM: memory, page tables, GDT, program, data, vCPUs in
    /// long mode at the entry point. No vCPU runs yet.
    pub fn build(host: &MicroHost, spec: &MicroVmSpec) -> Result<Self, MicroError> {
        check_spec(host, spec)?;
        let vm = crate::vm::create_vm(&host.kvm, false).map_err(|e| match e {
            crate::Error::Kvm { op, source } => MicroError::Kvm { op, source },
            other => MicroError::Memory(other.to_string()),
        })?;
        let vm = Arc::new(vm);
        let memory = guest_memory(&vm, spec)?;
        let waker: WakerSlot = Arc::default();
        let devices = spec
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let io = spec.io_cpus.clone();
                devices::build_device(&spec.name, i, d, io, &vm, &memory, &waker)
            })
            .collect::<Result<Vec<_>, MicroError>>()?;
        let io = Arc::new(MicroIo {
            name: spec.name.clone(),
            vcpus: spec.vcpus,
            ram: spec.memory,
            log_cap: spec.report_log,
            reports: (0..spec.vcpus).map(|_| Reports::default()).collect(),
            faults: (0..spec.vcpus).map(|_| Mutex::new(None)).collect(),
            kickers: OnceLock::new(),
            devices,
            waker,
            on_report: OnceLock::new(),
        });
        let control = VmControl::new();
        let vcpus = (0..spec.vcpus)
            .map(|i| {
                let v = entry_vcpu(host, &vm, spec, i)?;
                control.add_kicker(v.kicker());
                Ok(v)
            })
            .collect::<Result<Vec<_>, MicroError>>()?;
        let _ = io.kickers.set(vcpus.iter().map(|v| v.kicker()).collect());
        Ok(Self {
            vcpus,
            vm,
            io,
            control,
            memory,
            name: spec.name.clone(),
        })
    }

    /// Reads a `u64` of the data area at byte `offset` (atomically: the
    /// guest may be writing it).
    pub fn read_data_u64(&self, offset: u64) -> Option<u64> {
        read_u64(&self.memory, DATA_ADDR + offset)
    }
}

impl Drop for MicroVm {
    fn drop(&mut self) {
        // Before the VM fd and the memory: the devices' I/O threads use
        // both.
        self.io.release_devices();
    }
}

/// Refuses a spec the machine cannot hold.
fn check_spec(host: &MicroHost, spec: &MicroVmSpec) -> Result<(), MicroError> {
    let bad = |s: String| Err(MicroError::Input(format!("micro-guest {}: {s}", spec.name)));
    if spec.vcpus == 0 || spec.vcpus > host.max_vcpus {
        return bad(format!(
            "{} vCPUs; a micro-guest has 1 to {} here",
            spec.vcpus, host.max_vcpus
        ));
    }
    if spec.memory < MIN_MEMORY || spec.memory > MAX_MEMORY || spec.memory % MIN_MEMORY != 0 {
        return bad(format!(
            "{} bytes of RAM; give a multiple of 2 MiB from 2 MiB to 1 GiB",
            spec.memory
        ));
    }
    if spec.code.len() as u64 > CODE_MAX {
        return bad(format!(
            "the program is {} bytes; at most {CODE_MAX} fit",
            spec.code.len()
        ));
    }
    if spec.devices.len() > devices::MAX_DEVICES {
        return bad(format!(
            "{} devices; a micro-guest has at most {}",
            spec.devices.len(),
            devices::MAX_DEVICES
        ));
    }
    if !spec.devices.is_empty() && spec.memory > devices::DEVICE_BASE {
        return bad(format!(
            "{} bytes of RAM reach the device window at {:#x}; a micro-guest with devices \
             has at most {} MiB of RAM",
            spec.memory,
            devices::DEVICE_BASE,
            devices::DEVICE_BASE >> 20
        ));
    }
    if DATA_ADDR + spec.data.len() as u64 > spec.memory {
        return bad(format!(
            "{} bytes of data do not fit in {} bytes of RAM above {DATA_ADDR:#x}",
            spec.data.len(),
            spec.memory
        ));
    }
    Ok(())
}

/// The guest's RAM, registered with `vm`, holding the long-mode tables,
/// the program and the data.
fn guest_memory(vm: &VmFd, spec: &MicroVmSpec) -> Result<GuestMemoryMmap, MicroError> {
    let mem_err = |e: &dyn std::fmt::Display| MicroError::Memory(e.to_string());
    let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), spec.memory as usize)])
        .map_err(|e| mem_err(&e))?;
    crate::vm::register_memory(vm, &memory).map_err(|e| mem_err(&e))?;
    crate::boot::write_long_mode_tables(&memory).map_err(|e| mem_err(&e))?;
    memory
        .write_slice(&spec.code, GuestAddress(CODE_ADDR))
        .map_err(|e| mem_err(&e))?;
    memory
        .write_slice(&spec.data, GuestAddress(DATA_ADDR))
        .map_err(|e| mem_err(&e))?;
    Ok(memory)
}

/// vCPU `i`, in long mode at the entry point with its registers set (see
/// the module docs).
fn entry_vcpu(
    host: &MicroHost,
    vm: &VmFd,
    spec: &MicroVmSpec,
    i: usize,
) -> Result<Vcpu, MicroError> {
    let kerr = |op: &'static str| move |source| MicroError::Kvm { op, source };
    let v = Vcpu::new(vm, i, i as u64)?;
    v.fd()
        .set_cpuid2(&host.cpuid)
        .map_err(kerr("KVM_SET_CPUID2"))?;
    crate::boot::enter_long_mode(v.fd(), i).map_err(|e| match e {
        crate::boot::BootError::Vcpu { op, source, .. } => MicroError::Kvm { op, source },
        other => MicroError::Memory(other.to_string()),
    })?;
    let regs = kvm_bindings::kvm_regs {
        rip: CODE_ADDR,
        rflags: 0x2,
        rsp: STACK_TOP - i as u64 * STACK_SIZE,
        rdi: i as u64,
        rsi: spec.vcpus as u64,
        rbx: DATA_ADDR,
        ..Default::default()
    };
    v.fd().set_regs(&regs).map_err(kerr("KVM_SET_REGS"))?;
    Ok(v)
}

/// Reads an aligned `u64` of guest memory atomically.
pub fn read_u64(mem: &GuestMemoryMmap, addr: u64) -> Option<u64> {
    mem.load::<u64>(GuestAddress(addr), Ordering::Acquire).ok()
}

impl MicroVm {
    /// Hands the VM to an executor: its vCPUs, its exit mapper, its
    /// control block, and everything else (VM fd, memory) to drop when its
    /// last vCPU ends. `placement` has one entry for all vCPUs, or one per
    /// vCPU.
    pub fn into_guest(
        mut self,
        placement: Vec<crate::vcpu_body::Placement>,
    ) -> crate::vcpu_body::GuestVm {
        let vcpus = std::mem::take(&mut self.vcpus);
        crate::vcpu_body::GuestVm {
            name: self.name.clone(),
            vcpus,
            mapper: self.io.clone(),
            control: self.control.clone(),
            placement,
            keep: Box::new(self),
        }
    }
}
