//! One vCPU and its run loop, usable on its own.
//!
//! A [`Vcpu`] wraps a KVM vCPU fd. [`Vcpu::run`] enters the guest and
//! handles exits that are plain device accesses through a [`PortIo`]
//! (serial output, a read of an absent port) without returning; it returns
//! on the first exit that means something to whoever drives the vCPU:
//!
//! | [`VcpuExit`] | cause |
//! |---|---|
//! | `Halt` | HLT, only without an in-kernel LAPIC (micro-guests) |
//! | `Io` | a port write the [`PortIo`] hands back ([`IoAction::Exit`]) |
//! | `Kicked` | [`Kicker::kick`] from any thread |
//! | `Reset`, `PowerOff` | the guest reset or powered off the machine |
//! | `Shutdown` | triple fault |
//! | `InternalError`, `FailEntry`, `Unexpected` | KVM could not go on |
//!
//! Nothing here assumes one VM per process or one thread per vCPU: a vCPU
//! may be run from any thread, one thread at a time (`run` takes `&mut
//! self`), and many VMs' vCPUs can live in one process.
//!
//! ## The kick
//!
//! [`Kicker::kick`] makes a running (or about to run) `KVM_RUN` return, race
//! free, following KVM's documented protocol:
//!
//! 1. the kicker sets a `pending` flag, then `kvm_run.immediate_exit = 1`
//!    (in the vCPU's shared `kvm_run` page), then, if the vCPU is inside
//!    [`Vcpu::run`] on some thread, sends that thread [`kick_signal`];
//! 2. the signal's handler does nothing, but it is installed without
//!    `SA_RESTART`, so an ioctl in progress returns `EINTR`, and KVM checks
//!    for pending signals before every guest entry;
//! 3. `immediate_exit` covers the window where the signal lands just before
//!    `KVM_RUN` is entered: KVM then returns `EINTR` at once;
//! 4. the vCPU clears `immediate_exit` first and takes `pending` second, so
//!    a kick that races with the clear is either seen now or leaves
//!    `immediate_exit` set for the next entry. A kick is never lost; at
//!    worst one extra `EINTR` is absorbed.
//!
//! A kick while the vCPU is not running is remembered: the next `run`
//! returns `Kicked` without entering the guest.

use std::sync::Arc;

use kvm_bindings::{
    KVM_INTERNAL_ERROR_EMULATION, KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES,
    KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit as KvmExit, VcpuFd, VmFd};
use tracing::{debug, trace};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::compat::{assist_for, Assist};

pub mod block_watch;
pub mod inject;
mod kick;
pub mod park;
pub mod probe;
pub mod steal;

pub use kick::{install_kick_signal, kick_signal, Kicker};
use kick::{KickShared, RunGuard};

/// Errors of the vCPU layer.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A KVM ioctl failed.
    #[error("vCPU {vcpu}: {op} failed: {source}")]
    Kvm {
        /// vCPU index.
        vcpu: usize,
        /// Which operation.
        op: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// The kick signal handler could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    Signal(std::io::Error),
}

/// What a port write asks the run loop to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoAction {
    /// Handled; keep running the guest.
    Continue,
    /// Return [`VcpuExit::Io`] to the caller.
    Exit,
    /// The guest reset the machine.
    Reset,
    /// The guest powered the machine off.
    PowerOff,
}

/// Port and MMIO accesses that exit to userspace. Implementations must be
/// cheap and must not block for long: they run on the vCPU's thread.
pub trait PortIo: Send + Sync {
    /// An `IN` from `port`; fill `data` (1, 2 or 4 bytes).
    fn pio_read(&self, vcpu: usize, port: u16, data: &mut [u8]);
    /// An `OUT` to `port`.
    fn pio_write(&self, vcpu: usize, port: u16, data: &[u8]) -> IoAction;
    /// A read of unbacked guest physical memory. All ones by default, as
    /// on real hardware.
    fn mmio_read(&self, _vcpu: usize, _addr: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    /// A write to unbacked guest physical memory. Ignored by default.
    fn mmio_write(&self, _vcpu: usize, _addr: u64, _data: &[u8]) -> IoAction {
        IoAction::Continue
    }
}

/// Why [`Vcpu::run`] returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuExit {
    /// HLT reached userspace (no in-kernel LAPIC).
    Halt,
    /// A port write the [`PortIo`] handed back.
    Io {
        /// The port.
        port: u16,
        /// The value written, little endian, zero-extended.
        value: u32,
        /// Access size in bytes.
        size: u8,
    },
    /// [`Kicker::kick`] interrupted the vCPU.
    Kicked,
    /// The guest reset the machine (i8042, 0xcf9, or a KVM reset event).
    Reset,
    /// The guest powered the machine off (ACPI S5 or a KVM shutdown event).
    PowerOff,
    /// Triple fault (`KVM_EXIT_SHUTDOWN`).
    Shutdown,
    /// KVM could not emulate an instruction or deliver an event.
    InternalError {
        /// `kvm_run.internal.suberror`.
        suberror: u32,
        /// The instruction bytes at RIP, if known.
        insn: Vec<u8>,
    },
    /// `KVM_EXIT_FAIL_ENTRY`.
    FailEntry {
        /// Hardware reason.
        reason: u64,
    },
    /// Any other exit, described.
    Unexpected(String),
}

/// Counters of one vCPU, for logs and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuStats {
    /// Every return from `KVM_RUN`.
    pub exits: u64,
    /// Port accesses.
    pub pio: u64,
    /// MMIO accesses.
    pub mmio: u64,
    /// Kicks taken.
    pub kicks: u64,
    /// Instructions completed by the compat assist.
    pub assists: u64,
}

/// One KVM vCPU.
pub struct Vcpu {
    index: usize,
    kvm_id: u64,
    fd: VcpuFd,
    kick: Arc<KickShared>,
    assist: bool,
    memory: Option<GuestMemoryMmap>,
    stats: VcpuStats,
    /// A test's fault, armed through [`Vcpu::inject`].
    fault: Option<inject::Fault>,
    /// `KVM_RUN` calls so far (for `fault`).
    runs: u64,
    /// See [`Vcpu::kicked_at_boundary`].
    kicked_at_boundary: bool,
}

impl std::fmt::Debug for Vcpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vcpu")
            .field("index", &self.index)
            .field("kvm_id", &self.kvm_id)
            .field("stats", &self.stats)
            .finish()
    }
}

/// What one pass through KVM_RUN produced, before borrows end.
enum Step {
    Continue,
    Return(VcpuExit),
    Internal,
    Interrupted,
}

/// What the run loop does with one return of `KVM_RUN`: port and MMIO
/// accesses go to `io` and the guest goes on, unless the device side asks
/// for an exit.
fn step_of(exit: KvmExit<'_>, index: usize, stats: &mut VcpuStats, io: &dyn PortIo) -> Step {
    match exit {
        KvmExit::IoIn(port, data) => {
            stats.pio += 1;
            io.pio_read(index, port, data);
            Step::Continue
        }
        KvmExit::IoOut(port, data) => {
            stats.pio += 1;
            match io.pio_write(index, port, data) {
                IoAction::Continue => Step::Continue,
                IoAction::Reset => Step::Return(VcpuExit::Reset),
                IoAction::PowerOff => Step::Return(VcpuExit::PowerOff),
                IoAction::Exit => {
                    let mut v = [0u8; 4];
                    let n = data.len().min(4);
                    v[..n].copy_from_slice(&data[..n]);
                    Step::Return(VcpuExit::Io {
                        port,
                        value: u32::from_le_bytes(v),
                        size: data.len() as u8,
                    })
                }
            }
        }
        KvmExit::MmioRead(addr, data) => {
            stats.mmio += 1;
            io.mmio_read(index, addr, data);
            Step::Continue
        }
        KvmExit::MmioWrite(addr, data) => {
            stats.mmio += 1;
            match io.mmio_write(index, addr, data) {
                IoAction::Continue | IoAction::Exit => Step::Continue,
                IoAction::Reset => Step::Return(VcpuExit::Reset),
                IoAction::PowerOff => Step::Return(VcpuExit::PowerOff),
            }
        }
        KvmExit::Hlt => Step::Return(VcpuExit::Halt),
        KvmExit::Shutdown => Step::Return(VcpuExit::Shutdown),
        KvmExit::SystemEvent(kind, _) => Step::Return(match kind {
            KVM_SYSTEM_EVENT_SHUTDOWN => VcpuExit::PowerOff,
            KVM_SYSTEM_EVENT_RESET => VcpuExit::Reset,
            KVM_SYSTEM_EVENT_CRASH => VcpuExit::Unexpected("KVM system event: guest crash".into()),
            k => VcpuExit::Unexpected(format!("KVM system event {k}")),
        }),
        KvmExit::InternalError => Step::Internal,
        KvmExit::Intr => Step::Interrupted,
        KvmExit::FailEntry(reason, _) => Step::Return(VcpuExit::FailEntry { reason }),
        KvmExit::IrqWindowOpen => Step::Continue,
        other => Step::Return(VcpuExit::Unexpected(format!("{other:?}"))),
    }
}

impl Vcpu {
    /// Creates vCPU `index` of a VM with KVM vCPU id `kvm_id` (on x86 the
    /// initial APIC ID).
    pub fn new(vm: &VmFd, index: usize, kvm_id: u64) -> Result<Self, VcpuError> {
        install_kick_signal()?;
        let mut fd = vm.create_vcpu(kvm_id).map_err(|source| VcpuError::Kvm {
            vcpu: index,
            op: "KVM_CREATE_VCPU",
            source,
        })?;
        let imm: *mut u8 = &mut fd.get_kvm_run().immediate_exit;
        Ok(Self {
            index,
            kvm_id,
            fd,
            kick: KickShared::new(imm),
            assist: false,
            memory: None,
            stats: VcpuStats::default(),
            fault: None,
            runs: 0,
            kicked_at_boundary: false,
        })
    }

    /// Arms a test fault: on the `fault.at`th `KVM_RUN` from now (see
    /// [`inject`]).
    pub fn inject(&mut self, fault: inject::Fault) {
        self.runs = 0;
        self.fault = Some(fault);
    }

    /// The armed fault, if it is due at this `KVM_RUN`.
    fn due_fault(&mut self) -> Option<inject::FaultKind> {
        let f = self.fault?;
        self.runs += 1;
        if self.runs != f.at {
            return None;
        }
        self.fault = None;
        Some(f.kind)
    }

    /// The vCPU's index in its VM.
    pub fn index(&self) -> usize {
        self.index
    }
    /// KVM's vCPU id (the initial APIC ID).
    pub fn kvm_id(&self) -> u64 {
        self.kvm_id
    }
    /// The KVM fd, for setup ioctls.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }
    /// Counters.
    pub fn stats(&self) -> VcpuStats {
        self.stats
    }
    /// A handle that kicks this vCPU.
    pub fn kicker(&self) -> Kicker {
        self.kick.kicker()
    }
    /// Turns on the emulation assist for INT3 and FWAIT (kvm_pvm only, see
    /// [`crate::compat`]). `memory` lets the assist read the instruction
    /// when KVM does not report its bytes.
    pub fn enable_compat_assist(&mut self, memory: GuestMemoryMmap) {
        self.assist = true;
        self.memory = Some(memory);
    }

    fn kvm_err(&self, op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
        let vcpu = self.index;
        move |source| VcpuError::Kvm { vcpu, op, source }
    }

    /// Takes a pending kick (see the module docs for the order).
    fn take_kick(&self) -> bool {
        self.kick.take()
    }

    /// Runs the guest until an exit that matters (see [`VcpuExit`]).
    pub fn run(&mut self, io: &dyn PortIo) -> Result<VcpuExit, VcpuError> {
        let kick = self.kick.clone();
        let _guard = RunGuard::enter(&kick);
        let index = self.index;
        loop {
            self.stats.exits += 1;
            if let Some(r) = self.injected_fault() {
                return r;
            }
            let step = match self.fd.run() {
                Ok(exit) => step_of(exit, index, &mut self.stats, io),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    Step::Interrupted
                }
                Err(e) => {
                    return Err(VcpuError::Kvm {
                        vcpu: index,
                        op: "KVM_RUN",
                        source: e,
                    })
                }
            };
            match step {
                Step::Continue => {}
                Step::Return(exit) => return Ok(exit),
                Step::Interrupted => {
                    if self.take_kick() {
                        self.stats.kicks += 1;
                        // KVM sets KVM_EXIT_INTR only on the way out of its
                        // run loop: a KVM_RUN that returned before that
                        // (immediate_exit) leaves the previous exit's
                        // reason, and after an MMIO or port exit that
                        // means the access is still to be completed.
                        self.kicked_at_boundary =
                            self.fd.get_kvm_run().exit_reason == kvm_bindings::KVM_EXIT_INTR;
                        return Ok(VcpuExit::Kicked);
                    }
                    // Another signal, or the leftover immediate_exit of a
                    // kick already reported: go back in.
                    trace!(vcpu = index, "spurious EINTR");
                }
                Step::Internal => {
                    let (suberror, insn) = self.internal_error_info();
                    if suberror == KVM_INTERNAL_ERROR_EMULATION && self.assist {
                        if let Some(a) = assist_for(&insn) {
                            self.apply_assist(a)?;
                            continue;
                        }
                    }
                    return Ok(VcpuExit::InternalError { suberror, insn });
                }
            }
        }
    }

    /// What a fault injected for this `KVM_RUN` ([`inject`]) makes of it,
    /// if one is due.
    fn injected_fault(&mut self) -> Option<Result<VcpuExit, VcpuError>> {
        let index = self.index;
        match self.due_fault()? {
            inject::FaultKind::Ioctl => Some(Err(VcpuError::Kvm {
                vcpu: index,
                op: "KVM_RUN",
                source: kvm_ioctls::Error::new(libc::EFAULT),
            })),
            inject::FaultKind::InternalError => Some(Ok(VcpuExit::InternalError {
                suberror: KVM_INTERNAL_ERROR_EMULATION,
                insn: Vec::new(),
            })),
            inject::FaultKind::Panic => {
                panic!("vCPU {index}: injected panic on KVM_RUN {}", self.runs)
            }
        }
    }

    /// The suberror and instruction bytes of the last internal-error exit.
    fn internal_error_info(&mut self) -> (u32, Vec<u8>) {
        let run = self.fd.get_kvm_run();
        // SAFETY: called right after KVM_RUN returned KVM_EXIT_INTERNAL_ERROR,
        // so `internal` is the active union member; `emulation_failure`
        // shares its first two fields and is read only for the emulation
        // suberror, whose layout the flags field describes.
        let (suberror, ndata) = unsafe {
            let i = run.__bindgen_anon_1.internal;
            (i.suberror, i.ndata)
        };
        let mut insn = Vec::new();
        if suberror == KVM_INTERNAL_ERROR_EMULATION && ndata >= 3 {
            // SAFETY: see above.
            let ef = unsafe { run.__bindgen_anon_1.emulation_failure };
            if ef.flags & KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES as u64 != 0 {
                // SAFETY: the flag says the instruction bytes are valid.
                let b = unsafe { ef.__bindgen_anon_1.__bindgen_anon_1 };
                let n = (b.insn_size as usize).min(b.insn_bytes.len());
                insn.extend_from_slice(&b.insn_bytes[..n]);
            }
        }
        if insn.is_empty() {
            insn = self.read_insn_at_rip().unwrap_or_default();
        }
        (suberror, insn)
    }

    /// Reads up to 15 bytes at the guest's RIP through its page tables.
    fn read_insn_at_rip(&self) -> Option<Vec<u8>> {
        let mem = self.memory.as_ref()?;
        let regs = self.fd.get_regs().ok()?;
        let sregs = self.fd.get_sregs().ok()?;
        let linear = regs.rip.wrapping_add(sregs.cs.base);
        let t = self.fd.translate_gva(linear).ok()?;
        if t.valid == 0 {
            return None;
        }
        let mut buf = [0u8; 15];
        // Stay within the page: the next one may map elsewhere.
        let n = (0x1000 - (t.physical_address & 0xfff)).min(15) as usize;
        mem.read_slice(&mut buf[..n], GuestAddress(t.physical_address))
            .ok()?;
        Some(buf[..n].to_vec())
    }

    fn apply_assist(&mut self, a: Assist) -> Result<(), VcpuError> {
        let (len, vector) = match a {
            Assist::Skip { len } => (len, None),
            Assist::SkipAndInject { len, vector } => (len, Some(vector)),
        };
        let mut regs = self.fd.get_regs().map_err(self.kvm_err("KVM_GET_REGS"))?;
        regs.rip = regs.rip.wrapping_add(len);
        self.fd
            .set_regs(&regs)
            .map_err(self.kvm_err("KVM_SET_REGS"))?;
        self.stats.assists += 1;
        let Some(vector) = vector else {
            trace!(
                vcpu = self.index,
                rip = format_args!("{:#x}", regs.rip),
                "compat assist: skipped"
            );
            return Ok(());
        };
        let mut ev = self
            .fd
            .get_vcpu_events()
            .map_err(self.kvm_err("KVM_GET_VCPU_EVENTS"))?;
        ev.exception.injected = 1;
        ev.exception.nr = vector;
        ev.exception.has_error_code = 0;
        ev.exception.error_code = 0;
        ev.exception.pending = 0;
        self.fd
            .set_vcpu_events(&ev)
            .map_err(self.kvm_err("KVM_SET_VCPU_EVENTS"))?;
        debug!(
            vcpu = self.index,
            rip = format_args!("{:#x}", regs.rip),
            vector,
            "compat assist: skipped the instruction and injected the exception"
        );
        Ok(())
    }

    /// The vCPU's registers, for a crash report (one line per group).
    pub fn state_report(&self) -> String {
        let mut out = String::new();
        match self.fd.get_regs() {
            Ok(r) => {
                out.push_str(&format!(
                    "RIP={:#018x} RSP={:#018x} RBP={:#018x} RFLAGS={:#x}\n\
                     RAX={:#018x} RBX={:#018x} RCX={:#018x} RDX={:#018x}\n\
                     RSI={:#018x} RDI={:#018x} R8={:#018x} R9={:#018x}\n\
                     R10={:#018x} R11={:#018x} R12={:#018x} R13={:#018x}\n\
                     R14={:#018x} R15={:#018x}\n",
                    r.rip,
                    r.rsp,
                    r.rbp,
                    r.rflags,
                    r.rax,
                    r.rbx,
                    r.rcx,
                    r.rdx,
                    r.rsi,
                    r.rdi,
                    r.r8,
                    r.r9,
                    r.r10,
                    r.r11,
                    r.r12,
                    r.r13,
                    r.r14,
                    r.r15
                ));
            }
            Err(e) => out.push_str(&format!("(registers unavailable: {e})\n")),
        }
        match self.fd.get_sregs() {
            Ok(s) => out.push_str(&format!(
                "CR0={:#x} CR2={:#x} CR3={:#x} CR4={:#x} EFER={:#x} CS={:#x} (base {:#x}, l={}) SS={:#x}",
                s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.cs.selector, s.cs.base, s.cs.l, s.ss.selector
            )),
            Err(e) => out.push_str(&format!("(system registers unavailable: {e})")),
        }
        out
    }

    /// Nanoseconds until the guest's TSC-deadline timer fires: `Some(0)`
    /// when it is due already, `None` when it is not armed (or the LAPIC
    /// timer is not in TSC-deadline mode: KVM then reads the MSR as 0).
    /// One `KVM_GET_MSRS` for `IA32_TSC_DEADLINE` and the guest's TSC
    /// (KVM answers the latter at the moment of the call); `tsc_khz` is
    /// the guest's TSC rate ([`Self::tsc_khz`]). Call it only while the
    /// vCPU is out of `KVM_RUN`.
    pub fn tsc_deadline_in(&self, tsc_khz: u32) -> Result<Option<u64>, VcpuError> {
        const MSR_IA32_TSC: u32 = 0x10;
        const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
        let [Some(deadline), Some(tsc)] = self.msrs([MSR_IA32_TSC_DEADLINE, MSR_IA32_TSC])? else {
            return Ok(None);
        };
        if deadline == 0 || tsc_khz == 0 {
            return Ok(None);
        }
        let cycles = deadline.saturating_sub(tsc);
        Ok(Some(
            (u128::from(cycles) * 1_000_000 / u128::from(tsc_khz)).min(u128::from(u64::MAX)) as u64,
        ))
    }

    /// The guest's TSC rate in kHz (`KVM_GET_TSC_KHZ`).
    pub fn tsc_khz(&self) -> Result<u32, VcpuError> {
        self.fd
            .get_tsc_khz()
            .map_err(self.kvm_err("KVM_GET_TSC_KHZ"))
    }

    /// Did the last [`VcpuExit::Kicked`] leave the guest at an instruction
    /// boundary? False when the kick landed before KVM completed an MMIO
    /// or port access the guest made (KVM finishes it on the next
    /// `KVM_RUN`): then another vCPU must not be told this one is
    /// preempted ([`steal`]).
    pub fn kicked_at_boundary(&self) -> bool {
        self.kicked_at_boundary
    }

    /// One MSR's value (`KVM_GET_MSRS`); `None` when KVM does not have it.
    /// Call only while the vCPU is out of `KVM_RUN`.
    pub fn msr(&self, index: u32) -> Result<Option<u64>, VcpuError> {
        Ok(self.msrs([index])?[0])
    }

    /// Several MSRs in one `KVM_GET_MSRS`, in order; KVM stops at the
    /// first it does not have, which reads `None` with all after it.
    fn msrs<const N: usize>(&self, indices: [u32; N]) -> Result<[Option<u64>; N], VcpuError> {
        let entries = indices.map(|index| kvm_bindings::kvm_msr_entry {
            index,
            ..Default::default()
        });
        let mut msrs = kvm_bindings::Msrs::from_entries(&entries).map_err(|_| VcpuError::Kvm {
            vcpu: self.index,
            op: "KVM_GET_MSRS",
            source: kvm_ioctls::Error::new(libc::E2BIG),
        })?;
        let n = self
            .fd
            .get_msrs(&mut msrs)
            .map_err(self.kvm_err("KVM_GET_MSRS"))?;
        let got = msrs.as_slice();
        Ok(std::array::from_fn(|i| (i < n).then(|| got[i].data)))
    }

    /// `KVM_GET_MP_STATE` (3 = halted).
    pub fn mp_state(&self) -> Result<u32, VcpuError> {
        self.fd
            .get_mp_state()
            .map(|s| s.mp_state)
            .map_err(self.kvm_err("KVM_GET_MP_STATE"))
    }
}

impl Drop for Vcpu {
    fn drop(&mut self) {
        // Kickers may outlive the vCPU: stop them from touching the kvm_run
        // mapping, which goes away with the fd.
        self.kick.detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

    /// Collects COM1 bytes; port 0x99 hands the value back; 0x64 <- 0xfe resets.
    #[derive(Default)]
    struct TestIo(StdMutex<Vec<u8>>);
    impl PortIo for TestIo {
        fn pio_read(&self, _: usize, _: u16, data: &mut [u8]) {
            data.fill(0xff);
        }
        fn pio_write(&self, _: usize, port: u16, data: &[u8]) -> IoAction {
            match port {
                0x3f8 => {
                    self.0.lock().unwrap().extend_from_slice(data);
                    IoAction::Continue
                }
                0x99 => IoAction::Exit,
                0x64 if data == [0xfe] => IoAction::Reset,
                _ => IoAction::Continue,
            }
        }
    }

    /// A real-mode VM without an irqchip, running `code` at 0x1000.
    fn micro_vm(code: &[u8]) -> Option<(VmFd, GuestMemoryMmap, Vcpu)> {
        let kvm = crate::test_kvm::kvm()?;
        let vm = kvm.create_vm().unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        for (slot, r) in mem.iter().enumerate() {
            let host = mem.get_host_address(r.start_addr()).unwrap();
            // SAFETY: `mem` outlives the VM in every test below (it is
            // returned alongside the fd and dropped after it).
            unsafe {
                vm.set_user_memory_region(kvm_bindings::kvm_userspace_memory_region {
                    slot: slot as u32,
                    flags: 0,
                    guest_phys_addr: r.start_addr().0,
                    memory_size: r.len(),
                    userspace_addr: host as u64,
                })
                .unwrap();
            }
        }
        mem.write_slice(code, GuestAddress(0x1000)).unwrap();
        let v = Vcpu::new(&vm, 0, 0).unwrap();
        let mut s = v.fd().get_sregs().unwrap();
        s.cs.base = 0;
        s.cs.selector = 0;
        v.fd().set_sregs(&s).unwrap();
        let r = kvm_bindings::kvm_regs {
            rip: 0x1000,
            rflags: 2,
            ..Default::default()
        };
        v.fd().set_regs(&r).unwrap();
        Some((vm, mem, v))
    }

    #[test]
    fn vcpus_move_between_threads_and_kickers_are_shared() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Vcpu>();
        send_sync::<Kicker>();
    }

    #[test]
    fn micro_guest_serial_io_halt_and_reset() {
        let code = [
            0xba, 0xf8, 0x03, // mov dx, 0x3f8
            0xb0, b'H', 0xee, // mov al, 'H'; out dx, al
            0xb0, b'i', 0xee, // mov al, 'i'; out dx, al
            0xb0, 0x2a, 0xe6, 0x99, // mov al, 42; out 0x99, al
            0xf4, // hlt
            0xb0, 0xfe, 0xe6, 0x64, // mov al, 0xfe; out 0x64, al
        ];
        let Some((_vm, _mem, mut v)) = micro_vm(&code) else {
            return;
        };
        let io = TestIo::default();
        assert_eq!(
            v.run(&io).unwrap(),
            VcpuExit::Io {
                port: 0x99,
                value: 42,
                size: 1
            }
        );
        assert_eq!(&*io.0.lock().unwrap(), b"Hi");
        assert_eq!(v.run(&io).unwrap(), VcpuExit::Halt);
        assert_eq!(v.run(&io).unwrap(), VcpuExit::Reset);
        assert!(v.stats().pio >= 4);
    }

    #[test]
    fn kick_interrupts_a_spinning_guest_and_is_never_lost() {
        let code = [0xeb, 0xfe]; // jmp $
        let Some((_vm, _mem, mut v)) = micro_vm(&code) else {
            return;
        };
        let io = TestIo::default();
        // A kick before run is remembered.
        let k = v.kicker();
        k.kick();
        assert_eq!(v.run(&io).unwrap(), VcpuExit::Kicked);
        // Kicks from another thread while the guest spins.
        for _ in 0..20 {
            let k = v.kicker();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                k.kick();
            });
            assert_eq!(v.run(&io).unwrap(), VcpuExit::Kicked);
            t.join().unwrap();
        }
        assert_eq!(v.stats().kicks, 21);
        // The same vCPU run from another thread, kicked from this one.
        let k = v.kicker();
        let t = std::thread::spawn(move || {
            let io = TestIo::default();
            let exit = v.run(&io).unwrap();
            (exit, v)
        });
        std::thread::sleep(std::time::Duration::from_millis(5));
        k.kick();
        let (exit, v) = t.join().unwrap();
        assert_eq!(exit, VcpuExit::Kicked);
        // A kicker outliving its vCPU does nothing harmful.
        let k = v.kicker();
        drop(v);
        k.kick();
    }

    /// What an MMIO write does in [`preempted_mark_is_kvms_and_only_at_a_boundary`]:
    /// kicks the vCPU that made it, so the re-entry that would complete it
    /// returns `EINTR` first.
    struct KickOnMmio(StdMutex<Option<Kicker>>);
    impl PortIo for KickOnMmio {
        fn pio_read(&self, _: usize, _: u16, data: &mut [u8]) {
            data.fill(0xff);
        }
        fn pio_write(&self, _: usize, _: u16, _: &[u8]) -> IoAction {
            IoAction::Continue
        }
        fn mmio_write(&self, _: usize, _: u64, _: &[u8]) -> IoAction {
            if let Some(k) = self.0.lock().unwrap().as_ref() {
                k.kick();
            }
            IoAction::Continue
        }
    }

    /// The steal-time mark as KVM reads it: written where the guest's
    /// `MSR_KVM_STEAL_TIME` says, kept with a flush bit another vCPU adds,
    /// cleared by KVM itself on the next `KVM_RUN` (so the layout and the
    /// protocol are KVM's, not ours); nothing written without an area or
    /// outside RAM; a kick before an MMIO write completes is not at an
    /// instruction boundary, one in the middle of a spin is.
    #[test]
    fn preempted_mark_is_kvms_and_only_at_a_boundary() {
        use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
        use vm_memory::VolatileMemory;
        let code = [
            0xb8, 0x00, 0x20, // mov ax, 0x2000
            0x8e, 0xd8, // mov ds, ax
            0xc6, 0x06, 0x00, 0x00, 0x01, // mov byte [0], 1 (0x20000: no RAM)
            0xeb, 0xfe, // jmp $
        ];
        let Some((_vm, mem, mut v)) = micro_vm(&code) else {
            return;
        };
        let set = |v: &Vcpu, val: u64| {
            let m = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
                index: steal::MSR_KVM_STEAL_TIME,
                data: val,
                ..Default::default()
            }])
            .unwrap();
            assert_eq!(
                v.fd().set_msrs(&m).unwrap(),
                1,
                "KVM refused MSR_KVM_STEAL_TIME"
            );
        };
        let area = 0x3000u64;
        let slice = mem
            .get_slice(GuestAddress(area), steal::STEAL_TIME_SIZE)
            .unwrap();
        let byte = || {
            slice
                .get_atomic_ref::<AtomicU8>(steal::PREEMPTED_OFFSET)
                .unwrap()
                .load(Ordering::Acquire)
        };
        let version = || {
            slice
                .get_atomic_ref::<AtomicU32>(8)
                .unwrap()
                .load(Ordering::Acquire)
        };
        // No area yet: nothing to mark.
        assert_eq!(steal::steal_time_gpa(&v).unwrap(), None);
        assert!(!steal::mark_preempted(&v, &mem).unwrap());
        // Outside RAM: the guest's mistake, nothing written.
        set(&v, 0x10_0000 | 1);
        assert!(!steal::mark_preempted(&v, &mem).unwrap());
        set(&v, area | 1);
        assert_eq!(steal::steal_time_gpa(&v).unwrap(), Some(area));
        assert!(steal::mark_preempted(&v, &mem).unwrap());
        assert_eq!(byte(), steal::KVM_VCPU_PREEMPTED);
        // Another vCPU asks for a flush; marking again keeps its bit.
        slice
            .get_atomic_ref::<AtomicU8>(steal::PREEMPTED_OFFSET)
            .unwrap()
            .fetch_or(steal::KVM_VCPU_FLUSH_TLB, Ordering::AcqRel);
        assert!(steal::mark_preempted(&v, &mem).unwrap());
        assert_eq!(
            byte(),
            steal::KVM_VCPU_PREEMPTED | steal::KVM_VCPU_FLUSH_TLB
        );
        // The MMIO write kicks its own vCPU: KVM_RUN returns before it
        // completes the write.
        let io = KickOnMmio(StdMutex::new(Some(v.kicker())));
        assert_eq!(v.run(&io).unwrap(), VcpuExit::Kicked);
        assert!(!v.kicked_at_boundary(), "kicked with an MMIO write pending");
        // KVM entered (the MMIO exit) and cleared the mark and the flush.
        assert_eq!(byte(), 0, "KVM did not clear the preempted byte on entry");
        let v1 = version();
        assert!(
            v1 > 0 && v1 % 2 == 0,
            "KVM did not update the area: version {v1}"
        );
        io.0.lock().unwrap().take();
        // Kicked while it spins: at a boundary.
        let k = v.kicker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            k.kick();
        });
        assert_eq!(v.run(&io).unwrap(), VcpuExit::Kicked);
        t.join().unwrap();
        assert!(v.kicked_at_boundary(), "kicked in a spin loop");
        assert!(steal::mark_preempted(&v, &mem).unwrap());
        assert_eq!(byte(), steal::KVM_VCPU_PREEMPTED);
        // Disabled by the guest: no longer marked.
        set(&v, area);
        assert_eq!(steal::steal_time_gpa(&v).unwrap(), None);
        assert!(!steal::mark_preempted(&v, &mem).unwrap());
    }
}
