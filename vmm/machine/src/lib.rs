//! # vmm_machine
//!
//! The machine a guest of `vmm` sees, and the vCPU body that
//! [`vcpu_sched`]'s executors run: a KVM VM whose CPU topology (packages,
//! dies, LLCs, L2 groups, cores, threads, NUMA nodes and distances) the
//! guest kernel reads through CPUID and ACPI (MADT, SRAT, SLIT), with its
//! memory bound per node on the host.
//!
//! | module | what |
//! |---|---|
//! | [`vm`] | building a Linux VM (KVM VM, memory, devices, ACPI, CPUID, boot); stop reasons and control |
//! | [`vcpu`] | a vCPU, its run loop, the race-free kick, probes from outside its loop |
//! | [`memory`] | guest RAM per NUMA node, E820, host memory policy |
//! | [`boot`] | vmlinux/bzImage loading and the 64-bit entry |
//! | [`acpi`] | RSDP, XSDT, FADT, DSDT, MADT, SRAT, SLIT |
//! | [`cpuid`] | KVM's CPUID, topology leaves, paravirtual features |
//! | [`compat`] | kvm_pvm workarounds |
//! | [`devices`], [`console`] | what port and MMIO exits reach: the legacy devices (COM1, i8042, reset ports), the PCI segments and virtio devices (`vmm_devices`) wired to KVM (MSI routes, irqfds, ioeventfds); the console sink |
//! | [`layout`] | the guest physical memory map |
//! | [`micro`] | built-in micro-guests and their port interface |
//! | [`vcpu_body`] | the vCPU body: a KVM vCPU as a `vcpu_sched` task body, the set of VMs an executor runs, and running it |
//!
//! The device models themselves live in `vmm_devices`, which knows nothing
//! of KVM; [`devices`] gives them KVM. Nothing here parses
//! a command line or serves a request: the `vmm` binary and the API crate
//! describe a VM, this crate builds and runs it.

pub mod acpi;
pub mod boot;
pub mod compat;
pub mod console;
pub mod console_host;
pub mod cpuid;
pub mod devices;
pub mod layout;
pub mod memory;
pub mod micro;
pub mod vcpu;
pub mod vcpu_body;
pub mod vm;

#[cfg(test)]
mod test_kvm;

/// Errors of building and running a VM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad user input that fits no other variant.
    #[error("{0}")]
    Input(String),
    /// Kernel, initrd or command line.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// ACPI tables.
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    /// A vCPU.
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    /// Pinning.
    #[error(transparent)]
    Pin(#[from] vcpu_sched::placement::PinError),
    /// The topology.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// A VM-level KVM ioctl.
    #[error("{op} failed: {source}")]
    Kvm {
        /// The operation.
        op: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// A device.
    #[error(transparent)]
    Device(#[from] vmm_devices::DeviceError),
    /// A disk image the user named.
    #[error(transparent)]
    Disk(#[from] vmm_devices::virtio::block::DiskError),
    /// A tap the user named (or passed).
    #[error(transparent)]
    Tap(#[from] vmm_devices::tap::TapError),
    /// A virtio-fs backend could not be connected or refused the device.
    #[error(transparent)]
    Fs(#[from] vmm_devices::virtio::fs::FsError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}
