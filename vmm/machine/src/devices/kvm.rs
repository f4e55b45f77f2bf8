//! KVM behind `vmm_devices`' two hypervisor traits: MSI routes and irqfds
//! ([`KvmMsi`]) and ioeventfds ([`KvmNotify`]).
//!
//! KVM has one GSI routing table per VM, and `KVM_SET_GSI_ROUTING` replaces
//! all of it. [`GsiRoutes`] keeps the whole table: the routes KVM sets up
//! by default for the in-kernel irqchip (GSIs 0-15 to the PIC and the
//! IOAPIC, 16-23 to the IOAPIC: COM1's irqfd on GSI 4 goes on working),
//! plus one MSI route per device vector the guest has unmasked. GSIs for
//! vectors come from rust-vmm's `vm-allocator`, above the IOAPIC's 24
//! pins. Each vector's irqfd is registered once, when the device is
//! built; while the vector has no route, KVM drops its signals, which is
//! why `vmm_devices`' MSI-X state only triggers routed vectors and keeps
//! the others pending.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use kvm_bindings::{
    kvm_irq_routing_entry, kvm_irq_routing_irqchip, kvm_irq_routing_msi, KvmIrqRouting,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vm_allocator::IdAllocator;
use vmm_devices::interrupt::{MsiMessage, MsiVectors, NotifyEvents};
use vmm_devices::DeviceError;
use vmm_sys_util::eventfd::EventFd;

/// The IOAPIC's pins: GSIs below this are the irqchip's.
pub const IOAPIC_PINS: u32 = 24;
/// The highest GSI handed to MSI vectors (KVM takes 4096 routes on x86).
const LAST_GSI: u32 = 4095;

fn kvm_err(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> DeviceError {
    move |e| DeviceError::Hypervisor {
        op,
        source: std::io::Error::from_raw_os_error(e.errno()),
    }
}

fn irqchip(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        ..Default::default()
    };
    e.u.irqchip = kvm_irq_routing_irqchip { irqchip: chip, pin };
    e
}

/// The VM's GSI routing table and GSI allocator.
pub struct GsiRoutes {
    vm: Arc<VmFd>,
    state: Mutex<RouteState>,
}

struct RouteState {
    msi: BTreeMap<u32, MsiMessage>,
    ids: IdAllocator,
}

impl std::fmt::Debug for GsiRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GsiRoutes")
    }
}

impl GsiRoutes {
    /// The table of `vm`, which has the in-kernel irqchip.
    pub fn new(vm: Arc<VmFd>) -> Self {
        let ids = IdAllocator::new(IOAPIC_PINS, LAST_GSI).expect("a valid GSI range");
        Self {
            vm,
            state: Mutex::new(RouteState {
                msi: BTreeMap::new(),
                ids,
            }),
        }
    }

    fn allocate(&self) -> Result<u32, DeviceError> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.ids.allocate_id().map_err(|e| {
            DeviceError::Full(format!(
                "no GSI left for an MSI-X vector ({e}); use fewer queues"
            ))
        })
    }

    /// Sets (or with `None` removes) `gsi`'s MSI route and hands KVM the
    /// whole table.
    fn set(&self, gsi: u32, msg: Option<MsiMessage>) -> Result<(), DeviceError> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match msg {
            Some(m) => s.msi.insert(gsi, m),
            None => s.msi.remove(&gsi),
        };
        let mut entries = Vec::with_capacity(40 + s.msi.len());
        for pin in 0..IOAPIC_PINS {
            if pin < 16 && pin != 2 {
                let (chip, p) = if pin < 8 {
                    (KVM_IRQCHIP_PIC_MASTER, pin)
                } else {
                    (KVM_IRQCHIP_PIC_SLAVE, pin - 8)
                };
                entries.push(irqchip(pin, chip, p));
            }
            entries.push(irqchip(pin, KVM_IRQCHIP_IOAPIC, pin));
        }
        for (&gsi, m) in &s.msi {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi = kvm_irq_routing_msi {
                address_lo: m.addr as u32,
                address_hi: (m.addr >> 32) as u32,
                data: m.data,
                ..Default::default()
            };
            entries.push(e);
        }
        let table = KvmIrqRouting::from_entries(&entries).map_err(|e| {
            DeviceError::Full(format!(
                "the GSI routing table ({} entries): {e:?}",
                entries.len()
            ))
        })?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(kvm_err("KVM_SET_GSI_ROUTING"))
    }
}

/// Called with the destination APIC ID of each MSI a device raises, after
/// its irqfd is written: where the vCPU scheduler learns that a vCPU it
/// keeps asleep has an interrupt (see `vcpu_body::linux`).
pub type MsiWake = Arc<dyn Fn(u32) + Send + Sync>;

/// Where the executor that runs a VM puts its [`MsiWake`], once, after the
/// devices were built. Empty: nobody needs telling (the host runner's
/// vCPUs wait inside `KVM_RUN`, where the irqfd wakes them).
pub type MsiWakeSlot = Arc<OnceLock<MsiWake>>;

/// One device's vectors: a GSI and an irqfd each.
pub struct KvmMsi {
    routes: Arc<GsiRoutes>,
    vectors: Vec<(u32, EventFd)>,
    dest: Mutex<Vec<Option<u32>>>,
    wake: MsiWakeSlot,
}

impl std::fmt::Debug for KvmMsi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvmMsi")
            .field(
                "gsis",
                &self.vectors.iter().map(|v| v.0).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl KvmMsi {
    /// `count` vectors, each with a fresh GSI and a registered irqfd.
    pub fn new(routes: Arc<GsiRoutes>, count: u16, wake: MsiWakeSlot) -> Result<Self, DeviceError> {
        let mut vectors = Vec::with_capacity(count.into());
        for _ in 0..count {
            let gsi = routes.allocate()?;
            let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| DeviceError::Host {
                what: "creating an irqfd".into(),
                source,
            })?;
            routes
                .vm
                .register_irqfd(&evt, gsi)
                .map_err(kvm_err("KVM_IRQFD"))?;
            vectors.push((gsi, evt));
        }
        Ok(Self {
            routes,
            vectors,
            dest: Mutex::new(vec![None; count.into()]),
            wake,
        })
    }
}

impl MsiVectors for KvmMsi {
    fn count(&self) -> u16 {
        self.vectors.len() as u16
    }

    fn route(&self, vector: u16, msg: Option<MsiMessage>) -> Result<(), DeviceError> {
        let Some(&(gsi, _)) = self.vectors.get(usize::from(vector)) else {
            return Ok(());
        };
        self.dest.lock().unwrap_or_else(|e| e.into_inner())[usize::from(vector)] =
            msg.map(|m| m.dest_apic_id());
        self.routes.set(gsi, msg)
    }

    fn trigger(&self, vector: u16) -> Result<(), DeviceError> {
        let Some((_, evt)) = self.vectors.get(usize::from(vector)) else {
            return Ok(());
        };
        evt.write(1).map_err(|source| DeviceError::Host {
            what: "writing an irqfd".into(),
            source,
        })?;
        if let Some(wake) = self.wake.get() {
            let dest = self.dest.lock().unwrap_or_else(|e| e.into_inner())[usize::from(vector)];
            if let Some(apic) = dest {
                wake(apic);
            }
        }
        Ok(())
    }
}

impl Drop for KvmMsi {
    fn drop(&mut self) {
        for (gsi, evt) in &self.vectors {
            let _ = self.routes.vm.unregister_irqfd(evt, *gsi);
            let _ = self.routes.set(*gsi, None);
            let mut s = self.routes.state.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.ids.free_id(*gsi);
        }
    }
}

/// Ioeventfds on the VM.
#[derive(Debug)]
pub struct KvmNotify(pub Arc<VmFd>);

impl NotifyEvents for KvmNotify {
    fn register(&self, addr: u64, evt: &EventFd) -> Result<(), DeviceError> {
        self.0
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(kvm_err("KVM_IOEVENTFD"))
    }
    fn unregister(&self, addr: u64, evt: &EventFd) -> Result<(), DeviceError> {
        self.0
            .unregister_ioevent(evt, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(kvm_err("KVM_IOEVENTFD(deassign)"))
    }
}
