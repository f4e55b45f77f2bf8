//! # vmm
//!
//! A KVM virtual machine monitor whose vCPUs are placed and scheduled by
//! [`vcpu_sched`], on hosts described by [`topology`].
//!
//! It boots real Linux guests with a chosen CPU topology (packages, dies,
//! LLCs, L2 groups, cores, threads, NUMA nodes and distances) that the
//! guest kernel sees through CPUID and ACPI (MADT, SRAT, SLIT), with guest
//! memory bound per node on the host.
//!
//! | module | what |
//! |---|---|
//! | [`exit`] | exit codes: the one table of whose fault an error is (0, 1, 2, 124) |
//! | [`cli`] | the `vmm` command line: one module per subcommand, [`cli::args`] the shared leaf |
//! | [`config`] | `vmm run` flags and TOML files |
//! | [`vm`] | building a Linux VM; the one-thread-per-vCPU runner |
//! | [`vcpu`] | a vCPU, its run loop and the race-free kick |
//! | [`memory`] | guest RAM per NUMA node, E820, host memory policy |
//! | [`boot`] | vmlinux/bzImage loading and the 64-bit entry |
//! | [`acpi`] | RSDP, XSDT, FADT, DSDT, MADT, SRAT, SLIT |
//! | [`cpuid`] | KVM's CPUID, topology leaves, paravirtual features |
//! | [`compat`] | kvm_pvm workarounds |
//! | [`devices`], [`console`] | COM1, i8042 and reset ports; the console sink |
//! | [`pin`], [`rt`] | vCPU placement and real-time policy |
//! | [`micro`] | built-in micro-guests and their port interface |
//! | [`vcpu_body`] | the vCPU body: KVM vCPUs as `vcpu_sched` task bodies, the VM set, running it on an executor |
//! | [`vcpu_bench`] | `vmm bench`'s engine: the seeds' workloads as micro-guests on KVM, one run or a comparison |
//!
//! `vmm sched-bench` (the scheduler alone on synthetic tasks) is
//! [`cli::sched_bench`]: argument parsing and output over
//! [`vcpu_sched::bench`].
//!
//! The architecture is described in `docs/vmm.md`.

pub mod acpi;
pub mod boot;
pub mod cli;
pub mod compat;
pub mod config;
pub mod console;
pub mod cpuid;
pub mod devices;
pub mod exit;
pub mod layout;
pub mod memory;
pub mod micro;
pub mod pin;
pub mod plan;
pub mod rt;
pub mod serve;
pub mod vcpu;
pub mod vcpu_bench;
pub mod vcpu_body;
pub mod vm;

#[cfg(test)]
mod test_kvm;

/// Errors of the VMM library.
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
    Pin(#[from] pin::PinError),
    /// A setting.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
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
    /// Anything else.
    #[error("{0}")]
    Other(String),
}
