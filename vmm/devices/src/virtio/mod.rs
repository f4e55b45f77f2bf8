//! virtio 1.x devices over the modern PCI transport.
//!
//! ```text
//! guest driver ──MMIO──▶ VirtioPci (transport: common cfg, ISR, device cfg,
//!                         │          notify, MSI-X; feature and status checks)
//!                         │ DRIVER_OK: queues checked, ioeventfds registered
//!                         ▼
//!            VirtioDevice::activate ──▶ Worker thread (epoll on the queue
//!                                        eventfds) ──▶ QueueHandler::process
//!                                        │  strict chain walk (chain.rs)
//!                                        ▼
//!                          used ring + VirtioInterrupt::signal_queue
//!                          (MSI-X vector ──▶ irqfd ──▶ the guest's vCPU)
//! ```
//!
//! [`fs`] is different: a vhost-user frontend whose queues another
//! process (virtiofsd) serves; the VMM only relays its interrupts.
//!
//! Descriptor chains come from rust-vmm's `virtio-queue`; the layouts and
//! feature bits from `virtio-bindings`. [`chain::walk`] adds what a device
//! facing an untrusted guest needs on top: a chain that loops, leaves guest
//! memory, nests indirect tables or puts a readable buffer after a
//! writable one is an error, not a shorter chain. A device that meets one
//! calls [`VirtioInterrupt::fault`]: the status gets `NEEDS_RESET`, the
//! driver its config interrupt, and the queues are served no more until
//! the driver resets the device.

use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tracing::warn;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::pci::msix::Msix;
use crate::DeviceError;

pub mod block;
pub mod block_engine;
pub mod chain;
pub mod console;
pub mod disk;
pub mod fs;
pub mod net;
pub mod rng;
pub mod transport;
pub mod vsock;
pub mod worker;

pub use transport::VirtioPci;

/// Guest memory as devices see it.
pub type Memory = GuestMemoryMmap;

/// Device status bits (virtio 1.2, 2.1).
pub mod status {
    /// The guest found the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u8 = 2;
    /// The driver is ready: queues live.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is done.
    pub const FEATURES_OK: u8 = 8;
    /// The device met an error it cannot recover from without a reset.
    pub const NEEDS_RESET: u8 = 0x40;
    /// The driver gave up on the device.
    pub const FAILED: u8 = 0x80;
}

/// Feature bits every device here offers.
pub mod features {
    /// virtio 1.x (the modern interface): required.
    pub const VERSION_1: u64 = 1 << 32;
    /// Indirect descriptor tables.
    pub const INDIRECT_DESC: u64 = 1 << 28;
    /// used_event / avail_event notification suppression.
    pub const EVENT_IDX: u64 = 1 << 29;
}

/// "No MSI-X vector".
pub const NO_VECTOR: u16 = 0xffff;

/// A queue handed to a device at activation.
#[derive(Debug)]
pub struct ActiveQueue {
    /// Its index.
    pub index: usize,
    /// The ring, checked against guest memory.
    pub queue: Queue,
    /// Signalled when the driver notifies the queue.
    pub event: EventFd,
    /// The MSI-X vector for its used-buffer interrupts.
    pub vector: u16,
}

/// What a device gets when the driver sets `DRIVER_OK`.
#[derive(Debug)]
pub struct Activation {
    /// Guest memory.
    pub mem: Memory,
    /// The features the driver accepted.
    pub features: u64,
    /// The queues the driver enabled.
    pub queues: Vec<ActiveQueue>,
    /// Interrupts and fault reporting.
    pub interrupt: Arc<VirtioInterrupt>,
    /// Host CPUs (OS numbers) the device's I/O threads run on: those of
    /// the host node behind its PCI segment's guest node; `None`:
    /// wherever the host kernel puts them.
    pub io_cpus: Option<Arc<[usize]>>,
}

/// A virtio device behind the PCI transport.
pub trait VirtioDevice: Send {
    /// Its virtio device ID (`virtio_ids`).
    fn device_type(&self) -> u32;
    /// The PCI class code to show.
    fn pci_class(&self) -> u32;
    /// Its features (the transport adds [`features::VERSION_1`]).
    fn features(&self) -> u64;
    /// The largest size of each of its queues (powers of two).
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Reads its configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let _ = offset;
        data.fill(0);
    }
    /// Writes its configuration space.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let _ = (offset, data);
    }
    /// Starts serving the queues.
    fn activate(&mut self, activation: Activation) -> Result<(), DeviceError>;
    /// Stops serving them (waits for its worker) and forgets them.
    fn reset(&mut self);
}

/// A device's interrupts, and its way to report a guest's fault.
pub struct VirtioInterrupt {
    msix: Arc<Mutex<Msix>>,
    isr: AtomicU8,
    config_vector: AtomicU16,
    status: Arc<AtomicU8>,
    name: String,
}

impl std::fmt::Debug for VirtioInterrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioInterrupt")
            .field("name", &self.name)
            .finish()
    }
}

const ISR_QUEUE: u8 = 1;
const ISR_CONFIG: u8 = 2;

impl VirtioInterrupt {
    /// Interrupts that go nowhere (one vector, never routed): for a
    /// device driven without a transport, as the fuzz targets do.
    pub fn standalone(name: &str) -> Self {
        let vectors = Arc::new(crate::interrupt::testing::RecordingMsi::new(1));
        let msix = Arc::new(Mutex::new(Msix::new(vectors)));
        Self::new(msix, Arc::new(AtomicU8::new(0)), name.into())
    }

    pub(crate) fn new(msix: Arc<Mutex<Msix>>, status: Arc<AtomicU8>, name: String) -> Self {
        Self {
            msix,
            isr: AtomicU8::new(0),
            config_vector: AtomicU16::new(NO_VECTOR),
            status,
            name,
        }
    }

    fn raise(&self, vector: u16) {
        if vector != NO_VECTOR {
            self.msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .raise(vector);
        }
    }

    /// Used buffers on a queue whose vector is `vector`.
    pub fn signal_queue(&self, vector: u16) {
        self.isr.fetch_or(ISR_QUEUE, Ordering::SeqCst);
        self.raise(vector);
    }

    /// The device added used buffers to `queue`: raises `vector` if the
    /// driver asked for an interrupt now (`EVENT_IDX`'s `used_event`).
    pub fn signal_used(&self, queue: &mut Queue, mem: &Memory, vector: u16) -> Result<(), String> {
        if queue.needs_notification(mem).map_err(|e| e.to_string())? {
            self.signal_queue(vector);
        }
        Ok(())
    }

    /// The device configuration (or status) changed.
    pub fn signal_config(&self) {
        self.isr.fetch_or(ISR_CONFIG, Ordering::SeqCst);
        self.raise(self.config_vector.load(Ordering::SeqCst));
    }

    /// The guest did something the device cannot serve: `NEEDS_RESET`,
    /// and the driver is told. Logged once per fault.
    pub fn fault(&self, what: &str) {
        let old = self.status.fetch_or(status::NEEDS_RESET, Ordering::SeqCst);
        if old & status::NEEDS_RESET == 0 {
            warn!(device = %self.name, "guest error, device needs a reset: {what}");
            self.signal_config();
        }
    }

    /// The device's host side (a vhost-user backend) failed: as
    /// [`fault`](Self::fault), without blaming the guest; the caller logs
    /// why.
    pub fn backend_failed(&self) {
        let old = self.status.fetch_or(status::NEEDS_RESET, Ordering::SeqCst);
        if old & status::NEEDS_RESET == 0 {
            self.signal_config();
        }
    }

    /// Whether the device waits for a reset.
    pub fn faulted(&self) -> bool {
        self.status.load(Ordering::SeqCst) & status::NEEDS_RESET != 0
    }

    pub(crate) fn take_isr(&self) -> u8 {
        self.isr.swap(0, Ordering::SeqCst)
    }

    pub(crate) fn set_config_vector(&self, v: u16) {
        self.config_vector.store(v, Ordering::SeqCst);
    }

    pub(crate) fn clear(&self) {
        self.isr.store(0, Ordering::SeqCst);
        self.config_vector.store(NO_VECTOR, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod block_tests;
#[cfg(test)]
mod console_tests;
#[cfg(test)]
mod net_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vsock_tests;
