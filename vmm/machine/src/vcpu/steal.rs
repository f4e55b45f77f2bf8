//! The guest's steal-time area, as the M:N executors need it: marking a
//! descheduled vCPU "preempted".
//!
//! WHAT: [`mark_preempted`] sets `KVM_VCPU_PREEMPTED` in the `preempted`
//! byte of the vCPU's `struct kvm_steal_time` (the guest registers it with
//! `MSR_KVM_STEAL_TIME`) when the executor takes the vCPU off its worker.
//!
//! WHY: a Linux guest asks `vcpu_is_preempted()` before it waits on
//! another vCPU: its paravirtual TLB flush does not IPI a preempted vCPU
//! but leaves it a flag (`KVM_VCPU_FLUSH_TLB`) that KVM acts on at the
//! next entry, so the sender does not spin until that vCPU runs again;
//! mutex and rwsem owners that are preempted stop optimistic spinning;
//! the scheduler does not count a preempted vCPU as an idle CPU to wake a
//! task on. On 1:1 threads KVM sets the flag itself when the host
//! preempts a vCPU's thread inside `KVM_RUN` (`kvm_steal_time_set_preempted`).
//! Under M:N a vCPU is descheduled outside `KVM_RUN`, where KVM sees
//! nothing: the guest thought every vCPU was always running and spun on
//! the ones waiting for a worker.
//!
//! HOW: after a kick that the executor answers by rescheduling (not a
//! halted vCPU: KVM does not mark those either), read
//! `MSR_KVM_STEAL_TIME` (`KVM_GET_MSRS`, the guest can move or disable the
//! area at any time) and, if it is enabled and the area lies in guest
//! RAM, `fetch_or` the flag into its `preempted` byte (offset 16). KVM
//! clears the byte (and does a requested flush) on the next `KVM_RUN`
//! (`record_steal_time`, run on every vCPU load). Only a vCPU at an
//! instruction boundary is marked: a kick that lands before KVM finished
//! an MMIO or port access ([`Vcpu::kicked_at_boundary`]) is not, for the
//! reason KVM gives in its own check (`at_instruction_boundary`): a flush
//! left for later would race with an access already translated.

use std::sync::atomic::{AtomicU8, Ordering};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileMemory};

use super::{Vcpu, VcpuError};

/// `MSR_KVM_STEAL_TIME`: the guest physical address of its
/// `struct kvm_steal_time` (64-byte aligned) in bits 63:6, enabled by bit 0.
pub const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
/// Bit 0 of [`MSR_KVM_STEAL_TIME`]: the area is in use.
const KVM_MSR_ENABLED: u64 = 1;
/// Size of `struct kvm_steal_time`.
pub const STEAL_TIME_SIZE: usize = 64;
/// Offset of its `preempted` byte.
pub const PREEMPTED_OFFSET: usize = 16;
/// `KVM_VCPU_PREEMPTED`: the vCPU is not running.
pub const KVM_VCPU_PREEMPTED: u8 = 1;
/// `KVM_VCPU_FLUSH_TLB`: set by other vCPUs of a preempted one, for KVM
/// to flush its TLB before it runs again.
pub const KVM_VCPU_FLUSH_TLB: u8 = 2;

/// Where the guest put `vcpu`'s steal-time area: `None` when it has not
/// enabled one. Call only while the vCPU is out of `KVM_RUN`.
pub fn steal_time_gpa(vcpu: &Vcpu) -> Result<Option<u64>, VcpuError> {
    let v = vcpu.msr(MSR_KVM_STEAL_TIME)?;
    Ok(v.filter(|v| v & KVM_MSR_ENABLED != 0).map(|v| v & !0x3f))
}

/// Calls `f` on the `preempted` byte of the steal-time area at `gpa`, if
/// the whole area lies in one region of `mem` (a guest may point the MSR
/// anywhere).
fn with_preempted_byte<R>(
    mem: &GuestMemoryMmap,
    gpa: u64,
    f: impl FnOnce(&AtomicU8) -> R,
) -> Option<R> {
    let area = mem.get_slice(GuestAddress(gpa), STEAL_TIME_SIZE).ok()?;
    // `get_slice` returns the whole area or an error (never a short slice).
    area.get_atomic_ref::<AtomicU8>(PREEMPTED_OFFSET)
        .ok()
        .map(f)
}

/// Marks `vcpu` preempted in its steal-time area (module docs). Returns
/// whether a mark was written: false when the guest has no area, or the
/// area is outside guest RAM. Call only on the thread that owns the vCPU,
/// while it is out of `KVM_RUN`.
pub fn mark_preempted(vcpu: &Vcpu, mem: &GuestMemoryMmap) -> Result<bool, VcpuError> {
    let Some(gpa) = steal_time_gpa(vcpu)? else {
        return Ok(false);
    };
    // Other vCPUs of the guest may `cmpxchg` the byte (adding
    // KVM_VCPU_FLUSH_TLB) from now on: an atomic OR keeps their bit.
    Ok(with_preempted_byte(mem, gpa, |b| {
        b.fetch_or(KVM_VCPU_PREEMPTED, Ordering::AcqRel)
    })
    .is_some())
}

/// The `preempted` byte of `vcpu`'s steal-time area, `None` without one
/// (tests and diagnostics).
pub fn preempted(vcpu: &Vcpu, mem: &GuestMemoryMmap) -> Result<Option<u8>, VcpuError> {
    Ok(steal_time_gpa(vcpu)?
        .and_then(|gpa| with_preempted_byte(mem, gpa, |b| b.load(Ordering::Acquire))))
}
