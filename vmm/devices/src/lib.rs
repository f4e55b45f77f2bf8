//! # vmm_devices
//!
//! The devices a guest of `vmm` does I/O through: PCI segments, MSI-X and
//! virtio 1.x over the modern PCI transport. Nothing here knows KVM: the
//! machine crate (`vmm_machine`) routes the guest's MMIO and port accesses
//! here, and gives each device the two things only KVM can do, through
//! the traits of [`interrupt`]: deliver an MSI (an irqfd behind a GSI
//! route) and turn a queue notification into an eventfd (an ioeventfd).
//!
//! | module | what |
//! |---|---|
//! | [`pci`] | a PCI segment: config space through ECAM and 0xCF8/0xCFC, BARs, capabilities, MSI-X |
//! | [`interrupt`] | what a device needs from the hypervisor: MSI routes and triggers, notification eventfds |
//! | [`tap`] | host tap devices (by name or passed-in fd) with the virtio-net header, the back end of virtio-net |
//! | [`virtio`] | the virtio PCI transport, descriptor chains checked strictly, the queue worker thread, the devices |
//!
//! The guest is untrusted. Every value it writes (a BAR, a queue size, a
//! descriptor, a length) is checked where it arrives; a device that sees
//! nonsense sets `NEEDS_RESET`, tells the driver through its config
//! interrupt and stops serving its queues until the driver resets it.
//! Nothing a guest does panics the host process or touches another VM.

pub mod interrupt;
pub mod packet;
pub mod pci;
pub mod tap;
pub mod virtio;

/// Errors of building devices and of the hypervisor calls behind them.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A hypervisor call (irqfd, ioeventfd, MSI route) failed.
    #[error("{op} failed: {source}")]
    Hypervisor {
        /// The operation.
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// A host resource (an eventfd, a thread, a file) could not be had.
    #[error("{what}: {source}")]
    Host {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A device's host side (a vhost-user backend) failed.
    #[error("device backend: {0}")]
    Backend(String),
    /// The PCI segment has no free device slot or address space left.
    #[error("{0}")]
    Full(String),
    /// A PCI hotplug request that cannot be carried out.
    #[error("PCI hotplug: {0}")]
    Hotplug(String),
}
