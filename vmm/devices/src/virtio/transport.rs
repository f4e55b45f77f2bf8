//! The virtio PCI transport, modern interface only (virtio 1.2, 4.1).
//!
//! One 64 KiB memory BAR (BAR 0) holds every structure the capabilities
//! point at:
//!
//! | offset | structure |
//! |---|---|
//! | 0x0000 | common configuration (features, status, queue setup) |
//! | 0x1000 | ISR status (read to clear) |
//! | 0x2000 | device-specific configuration |
//! | 0x3000 | notifications: queue `q` at `0x3000 + 4q` (multiplier 4) |
//! | 0x8000 | MSI-X table |
//! | 0xc000 | MSI-X pending bits |
//!
//! The driver's every write is checked: features outside the offer, or
//! without `VERSION_1`, keep `FEATURES_OK` clear; a queue size that is not
//! a power of two or above the maximum, rings outside guest memory or
//! misaligned, and a notification before `DRIVER_OK` set `NEEDS_RESET`.
//! At `DRIVER_OK` each enabled queue's notification address becomes an
//! ioeventfd (moved with the BAR if the guest moves it) and the device is
//! activated; status 0 resets it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{debug, info};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::NO_VECTOR;
use super::{features, status, Activation, ActiveQueue, Memory, VirtioDevice, VirtioInterrupt};
use crate::interrupt::{MsiVectors, NotifyEvents};
use crate::pci::config::{ConfigChange, PciConfig, PciIds};
use crate::pci::msix::{self, Msix, MSIX_CAP_ID};
use crate::pci::PciDevice;
use crate::DeviceError;

/// BAR 0's size.
pub const BAR_SIZE: u32 = 0x1_0000;
const COMMON: u64 = 0x0000;
const COMMON_LEN: u64 = 0x38;
const ISR: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const DEVICE_CFG_LEN: u64 = 0x1000;
const NOTIFY: u64 = 0x3000;
const NOTIFY_MULTIPLIER: u32 = 4;
const NOTIFY_LEN: u64 = 0x1000;
const MSIX_TABLE: u64 = 0x8000;
const MSIX_PBA: u64 = 0xc000;
/// The most queues a device may have (the notify area's size).
pub const MAX_QUEUES: usize = (NOTIFY_LEN / NOTIFY_MULTIPLIER as u64) as usize;

const VENDOR_CAP_ID: u8 = 0x09;
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
/// `VIRTIO_PCI_CAP_PCI_CFG`: a window into the BARs through config space
/// (virtio 1.2, 4.1.4.9), which the specification requires of every
/// device, for drivers that cannot map BARs (firmware, early boot).
const CAP_PCI_CFG: u8 = 5;

/// The virtio PCI vendor ID, and the modern device IDs' base.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
const MODERN_DEVICE_BASE: u16 = 0x1040;

/// A queue as the driver configures it.
#[derive(Debug)]
struct QueueSetup {
    max: u16,
    size: u16,
    ready: bool,
    vector: u16,
    desc: u64,
    avail: u64,
    used: u64,
    event: EventFd,
}

/// A virtio device on the PCI transport (see the module docs).
pub struct VirtioPci {
    name: String,
    config: PciConfig,
    msix_cap: usize,
    /// The `VIRTIO_PCI_CAP_PCI_CFG` capability's offset.
    pci_cfg_cap: usize,
    msix: Arc<Mutex<Msix>>,
    device: Box<dyn VirtioDevice>,
    status: Arc<AtomicU8>,
    interrupt: Arc<VirtioInterrupt>,
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    queue_select: u16,
    queues: Vec<QueueSetup>,
    config_vector: u16,
    notify: Arc<dyn NotifyEvents>,
    /// BAR 0's address at which the ioeventfds are registered.
    registered: Option<u64>,
    mem: Memory,
    active: bool,
    io_cpus: Option<Arc<[usize]>>,
}

impl std::fmt::Debug for VirtioPci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioPci")
            .field("name", &self.name)
            .field("status", &self.status.load(Ordering::Relaxed))
            .finish()
    }
}

/// The body (after ID and next) of a `virtio_pci_cap`, and the extra
/// notify multiplier for the notify capability.
fn vendor_cap(cfg_type: u8, offset: u64, length: u64, extra: Option<u32>) -> Vec<u8> {
    let cap_len = if extra.is_some() { 20u8 } else { 16 };
    let mut b = vec![cap_len, cfg_type, 0, 0, 0, 0];
    b.extend_from_slice(&(offset as u32).to_le_bytes());
    b.extend_from_slice(&(length as u32).to_le_bytes());
    if let Some(x) = extra {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

fn host_err(what: &str) -> impl FnOnce(std::io::Error) -> DeviceError + '_ {
    move |source| DeviceError::Host {
        what: what.to_string(),
        source,
    }
}

impl VirtioPci {
    /// Runs the device's I/O threads on these host CPUs (OS numbers).
    pub fn with_io_cpus(mut self, cpus: Option<Vec<usize>>) -> Self {
        self.io_cpus = cpus.filter(|c| !c.is_empty()).map(Into::into);
        self
    }

    /// Puts `device` on the transport, BAR 0 at `bar` (from the segment's
    /// allocator), its MSI-X vectors from `vectors` (one per queue plus
    /// one for configuration changes is what Linux asks for).
    pub fn new(
        name: &str,
        device: Box<dyn VirtioDevice>,
        bar: u32,
        vectors: Arc<dyn MsiVectors>,
        notify: Arc<dyn NotifyEvents>,
        mem: Memory,
    ) -> Result<Self, DeviceError> {
        let maxes = device.queue_max_sizes();
        assert!(
            maxes.len() <= MAX_QUEUES,
            "too many queues for the notify area"
        );
        let mut config = PciConfig::new(PciIds {
            vendor: VIRTIO_VENDOR,
            device: MODERN_DEVICE_BASE + device.device_type() as u16,
            revision: 1,
            class: device.pci_class(),
            subsystem_vendor: VIRTIO_VENDOR,
            subsystem: 0x40,
        });
        config.set_bar(0, bar, BAR_SIZE);
        let n = maxes.len() as u64;
        for (t, off, len, extra) in [
            (CAP_COMMON, COMMON, COMMON_LEN, None),
            (CAP_ISR, ISR, 4, None),
            (CAP_DEVICE, DEVICE_CFG, DEVICE_CFG_LEN, None),
            (
                CAP_NOTIFY,
                NOTIFY,
                n * u64::from(NOTIFY_MULTIPLIER),
                Some(NOTIFY_MULTIPLIER),
            ),
        ] {
            let body = vendor_cap(t, off, len.max(4), extra);
            let w = vec![0u8; body.len()];
            config.add_capability(VENDOR_CAP_ID, &body, &w);
        }
        // PCI_CFG: cap_len, cfg_type, bar, id, padding, offset, length
        // and the 4 data bytes; the driver writes bar, offset, length and
        // data.
        let mut body = vendor_cap(CAP_PCI_CFG, 0, 0, Some(0));
        body[4] = 0;
        let mut w = vec![0u8; body.len()];
        w[2] = 0xff;
        w[6..18].fill(0xff);
        let pci_cfg_cap = config.add_capability(VENDOR_CAP_ID, &body, &w);
        let (body, w) = msix::capability(vectors.count(), 0, MSIX_TABLE as u32, MSIX_PBA as u32);
        let msix_cap = config.add_capability(MSIX_CAP_ID, &body, &w);
        let msix = Arc::new(Mutex::new(Msix::new(vectors)));
        let status = Arc::new(AtomicU8::new(0));
        let interrupt = Arc::new(VirtioInterrupt::new(
            msix.clone(),
            status.clone(),
            name.into(),
        ));
        let queues = maxes
            .iter()
            .map(|&max| {
                Ok(QueueSetup {
                    max,
                    size: max,
                    ready: false,
                    vector: NO_VECTOR,
                    desc: 0,
                    avail: 0,
                    used: 0,
                    event: EventFd::new(libc::EFD_NONBLOCK)
                        .map_err(host_err("creating a queue eventfd"))?,
                })
            })
            .collect::<Result<Vec<_>, DeviceError>>()?;
        Ok(Self {
            name: name.into(),
            config,
            msix_cap,
            pci_cfg_cap,
            msix,
            device,
            status,
            interrupt,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            queue_select: 0,
            queues,
            config_vector: NO_VECTOR,
            notify,
            registered: None,
            mem,
            active: false,
            io_cpus: None,
        })
    }

    /// The device status byte.
    pub fn status(&self) -> u8 {
        self.status.load(Ordering::SeqCst)
    }

    fn offered(&self) -> u64 {
        self.device.features() | features::VERSION_1
    }

    fn fault(&self, what: &str) {
        self.interrupt.fault(what);
    }

    fn queue(&mut self) -> Option<&mut QueueSetup> {
        self.queues.get_mut(self.queue_select as usize)
    }

    fn read_common(&mut self, off: u64, data: &mut [u8]) {
        let sel = self.queue_select as usize;
        let q = self.queues.get(sel);
        let v: u64 = match off {
            0x00 => u64::from(self.device_feature_select),
            0x04 => match self.device_feature_select {
                0 => self.offered() & 0xffff_ffff,
                1 => self.offered() >> 32,
                _ => 0,
            },
            0x08 => u64::from(self.driver_feature_select),
            0x0c => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            0x10 => u64::from(self.config_vector),
            0x12 => self.queues.len() as u64,
            0x14 => u64::from(self.status()),
            0x15 => 0,
            0x16 => u64::from(self.queue_select),
            0x18 => q.map_or(0, |q| u64::from(q.size)),
            0x1a => q.map_or(u64::from(NO_VECTOR), |q| u64::from(q.vector)),
            0x1c => q.map_or(0, |q| u64::from(q.ready)),
            0x1e => q.map_or(0, |_| sel as u64),
            0x20 => q.map_or(0, |q| q.desc),
            0x24 => q.map_or(0, |q| q.desc >> 32),
            0x28 => q.map_or(0, |q| q.avail),
            0x2c => q.map_or(0, |q| q.avail >> 32),
            0x30 => q.map_or(0, |q| q.used),
            0x34 => q.map_or(0, |q| q.used >> 32),
            _ => 0,
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = (v >> (8 * i)) as u8;
        }
    }

    fn write_common(&mut self, off: u64, data: &[u8]) {
        let mut v = 0u64;
        for (i, &b) in data.iter().enumerate().take(8) {
            v |= u64::from(b) << (8 * i);
        }
        // Queue and feature setup is frozen once the driver is running.
        let live = self.active && !(off == 0x14 || off == 0x16 || off == 0x00 || off == 0x08);
        if live {
            debug!(device = %self.name, off, "common config write after DRIVER_OK ignored");
            return;
        }
        let count = self.msix.lock().unwrap_or_else(|e| e.into_inner()).count();
        let vector = |v: u64| {
            if (v as u16) < count {
                v as u16
            } else {
                NO_VECTOR
            }
        };
        match off {
            0x00 => self.device_feature_select = v as u32,
            0x08 => self.driver_feature_select = v as u32,
            0x0c => match self.driver_feature_select {
                0 => {
                    self.driver_features = (self.driver_features & !0xffff_ffff) | (v & 0xffff_ffff)
                }
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (v << 32),
                _ => {}
            },
            0x10 => {
                self.config_vector = vector(v);
                self.interrupt.set_config_vector(self.config_vector);
            }
            0x14 => self.write_status(v as u8),
            0x16 => self.queue_select = v as u16,
            0x18 => self.set_queue_size(v as u16),
            0x1a => {
                let vec = vector(v);
                if let Some(q) = self.queue() {
                    q.vector = vec;
                }
            }
            0x1c => {
                if let Some(q) = self.queue() {
                    q.ready = v & 1 == 1;
                }
            }
            0x20 | 0x24 | 0x28 | 0x2c | 0x30 | 0x34 => self.set_queue_address(off, v),
            _ => debug!(device = %self.name, off, "write to a read-only common config field"),
        }
    }

    fn set_queue_size(&mut self, size: u16) {
        let Some(q) = self.queue() else { return };
        let max = q.max;
        if size == 0 || size > max || !size.is_power_of_two() {
            self.fault(&format!(
                "queue size {size} (the queue takes a power of two up to {max})"
            ));
        } else {
            q.size = size;
        }
    }

    fn set_queue_address(&mut self, off: u64, v: u64) {
        let Some(q) = self.queue() else { return };
        let field = match off & !7 {
            0x20 => &mut q.desc,
            0x28 => &mut q.avail,
            _ => &mut q.used,
        };
        *field = if off % 8 == 0 {
            (*field & !0xffff_ffff) | (v & 0xffff_ffff)
        } else {
            (*field & 0xffff_ffff) | (v << 32)
        };
    }

    fn write_status(&mut self, v: u8) {
        if v == 0 {
            self.reset();
            return;
        }
        let old = self.status();
        let mut new = v | (old & status::NEEDS_RESET);
        if new & status::FEATURES_OK != 0 && old & status::FEATURES_OK == 0 {
            let extra = self.driver_features & !self.offered();
            if extra != 0 || self.driver_features & features::VERSION_1 == 0 {
                info!(device = %self.name, driver = self.driver_features, offered = self.offered(),
                    "driver features refused (outside the offer, or without VERSION_1)");
                new &= !status::FEATURES_OK;
            }
        }
        self.status.store(new, Ordering::SeqCst);
        if new & status::DRIVER_OK != 0 && old & status::DRIVER_OK == 0 {
            if new & status::FEATURES_OK == 0 {
                self.fault("DRIVER_OK without FEATURES_OK");
            } else if let Err(e) = self.activate() {
                self.fault(&e);
            }
        }
    }

    fn activate(&mut self) -> Result<(), String> {
        if self.interrupt.faulted() {
            return Err("DRIVER_OK on a device that needs a reset".into());
        }
        let mut active = Vec::new();
        for (index, s) in self.queues.iter().enumerate().filter(|(_, s)| s.ready) {
            let mut q = Queue::new(s.max).map_err(|e| format!("queue {index}: {e}"))?;
            q.try_set_size(s.size)
                .map_err(|e| format!("queue {index}: {e}"))?;
            q.try_set_desc_table_address(GuestAddress(s.desc))
                .and_then(|_| q.try_set_avail_ring_address(GuestAddress(s.avail)))
                .and_then(|_| q.try_set_used_ring_address(GuestAddress(s.used)))
                .map_err(|e| format!("queue {index}: {e}"))?;
            q.set_event_idx(self.driver_features & features::EVENT_IDX != 0);
            q.set_ready(true);
            if !q.is_valid(&self.mem) {
                return Err(format!(
                    "queue {index}: its rings ({:#x}, {:#x}, {:#x}, {} entries) are not in guest memory",
                    s.desc, s.avail, s.used, s.size
                ));
            }
            let event = s.event.try_clone().map_err(|e| format!("eventfd: {e}"))?;
            active.push(ActiveQueue {
                index,
                queue: q,
                event,
                vector: s.vector,
            });
        }
        self.register_notify(self.config.bar_address(0));
        self.device
            .activate(Activation {
                mem: self.mem.clone(),
                features: self.driver_features,
                queues: active,
                interrupt: self.interrupt.clone(),
                io_cpus: self.io_cpus.clone(),
            })
            .map_err(|e| format!("activation: {e}"))?;
        self.active = true;
        info!(device = %self.name, features = format_args!("{:#x}", self.driver_features),
            "virtio device activated");
        Ok(())
    }

    fn notify_addr(base: u64, q: usize) -> u64 {
        base + NOTIFY + q as u64 * u64::from(NOTIFY_MULTIPLIER)
    }

    /// Ioeventfds for the ready queues at BAR 0 address `base` (nothing
    /// if BAR 0 holds no address). A failure leaves that queue on the
    /// MMIO-exit path, which works, only slower.
    fn register_notify(&mut self, base: u64) {
        self.unregister_notify();
        if base == 0 {
            return;
        }
        for (i, q) in self.queues.iter().enumerate().filter(|(_, q)| q.ready) {
            if let Err(e) = self.notify.register(Self::notify_addr(base, i), &q.event) {
                info!(device = %self.name, queue = i, "no ioeventfd, notifications exit: {e}");
            }
        }
        self.registered = Some(base);
    }

    fn unregister_notify(&mut self) {
        if let Some(base) = self.registered.take() {
            for (i, q) in self.queues.iter().enumerate().filter(|(_, q)| q.ready) {
                let _ = self.notify.unregister(Self::notify_addr(base, i), &q.event);
            }
        }
    }

    fn reset(&mut self) {
        self.device.reset();
        self.unregister_notify();
        self.active = false;
        self.status.store(0, Ordering::SeqCst);
        self.interrupt.clear();
        self.driver_features = 0;
        self.device_feature_select = 0;
        self.driver_feature_select = 0;
        self.queue_select = 0;
        self.config_vector = NO_VECTOR;
        for q in &mut self.queues {
            q.size = q.max;
            q.ready = false;
            q.vector = NO_VECTOR;
            (q.desc, q.avail, q.used) = (0, 0, 0);
            let _ = q.event.read();
        }
        debug!(device = %self.name, "virtio device reset");
    }

    fn notify_write(&mut self, off: u64) {
        let q = (off / u64::from(NOTIFY_MULTIPLIER)) as usize;
        if !self.active {
            self.fault(&format!("queue {q} notified before DRIVER_OK"));
            return;
        }
        // Only without an ioeventfd (or before KVM has it) do notifications
        // arrive here: pass them on.
        if let Some(s) = self.queues.get(q).filter(|s| s.ready) {
            let _ = s.event.write(1);
        }
    }
}

impl VirtioPci {
    /// The BAR 0 access the `PCI_CFG` capability asks for: its offset and
    /// length, when the driver chose BAR 0, a length of 1, 2 or 4 and an
    /// offset aligned to it inside the BAR. Anything else moves nothing
    /// (the specification leaves it undefined).
    fn pci_cfg_window(&self) -> Option<(u64, usize)> {
        let c = self.config.bytes(self.pci_cfg_cap, 16);
        let bar = c[4];
        let off = u32::from_le_bytes([c[8], c[9], c[10], c[11]]);
        let len = u32::from_le_bytes([c[12], c[13], c[14], c[15]]) as usize;
        let ok = bar == 0
            && matches!(len, 1 | 2 | 4)
            && off as usize % len == 0
            && u64::from(off) + len as u64 <= u64::from(BAR_SIZE);
        ok.then_some((u64::from(off), len))
    }
}

impl PciDevice for VirtioPci {
    fn config(&self) -> &PciConfig {
        &self.config
    }

    fn read_config(&mut self, reg: usize) -> u32 {
        let data_reg = (self.pci_cfg_cap + 16) / 4;
        if reg == data_reg {
            if let Some((off, len)) = self.pci_cfg_window() {
                let mut b = [0u8; 4];
                self.read_bar(0, off, &mut b[..len]);
                return u32::from_le_bytes(b);
            }
        }
        self.config.read(reg)
    }

    fn write_config(&mut self, offset: usize, data: &[u8]) -> ConfigChange {
        let data_at = self.pci_cfg_cap + 16;
        if offset == data_at && (1..=4).contains(&data.len()) {
            let change = self.config.write(offset, data);
            if let Some((off, len)) = self.pci_cfg_window() {
                let n = len.min(data.len());
                let mut b = [0u8; 4];
                b[..n].copy_from_slice(&data[..n]);
                self.write_bar(0, off, &b[..len]);
            }
            return change;
        }
        let before = self.config.bar_address(0);
        let change = self.config.write(offset, data);
        if change.capability == Some(self.msix_cap) {
            let ctrl = u16::from_le_bytes([
                self.config.bytes(self.msix_cap + 2, 2)[0],
                self.config.bytes(self.msix_cap + 2, 2)[1],
            ]);
            self.msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_control(ctrl);
        }
        let after = self.config.bar_address(0);
        if self.active && after != before && self.registered.is_some() {
            self.register_notify(after);
        }
        change
    }

    fn read_bar(&mut self, bar: usize, off: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != 0 {
            return;
        }
        match off {
            o if o < COMMON + COMMON_LEN => self.read_common(o - COMMON, data),
            o if (ISR..ISR + 4).contains(&o) => {
                data[0] = self.interrupt.take_isr();
            }
            o if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&o) => {
                self.device.read_config(o - DEVICE_CFG, data);
            }
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => {
                self.msix
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .read_table(o - MSIX_TABLE, data);
            }
            o if o >= MSIX_PBA => {
                self.msix
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .read_pba(o - MSIX_PBA, data);
            }
            _ => {}
        }
    }

    fn write_bar(&mut self, bar: usize, off: u64, data: &[u8]) {
        if bar != 0 {
            return;
        }
        match off {
            o if o < COMMON + COMMON_LEN => self.write_common(o - COMMON, data),
            o if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&o) => {
                self.device.write_config(o - DEVICE_CFG, data);
            }
            o if (NOTIFY..NOTIFY + NOTIFY_LEN).contains(&o) => self.notify_write(o - NOTIFY),
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => {
                self.msix
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write_table(o - MSIX_TABLE, data);
            }
            _ => {}
        }
    }
}

impl Drop for VirtioPci {
    fn drop(&mut self) {
        self.device.reset();
        self.unregister_notify();
    }
}
