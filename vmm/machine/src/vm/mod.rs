//! A Linux VM: KVM VM, memory per node, devices, ACPI, CPUID and boot.
//!
//! [`LinuxVm::build`] does everything up to the first `KVM_RUN`; the VM is
//! then driven by [`run_threads`](crate::vcpu_body::linux::run_threads)
//! (one host thread per vCPU, the host kernel schedules them), or by any
//! other executor that takes the vCPUs
//! out with [`LinuxVm::take_vcpus`] and runs them with
//! [`Vcpu::run`](crate::vcpu::Vcpu::run) against [`LinuxVm::devices`],
//! reporting what it sees to [`LinuxVm::control`]. Nothing here is global
//! to the process: many VMs can be built and run side by side.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use kvm_bindings::{kvm_enable_cap, kvm_pit_config, kvm_userspace_memory_region};
use kvm_bindings::{KVM_CAP_X2APIC_API, KVM_PIT_SPEAKER_DUMMY};
use kvm_bindings::{KVM_X2APIC_API_DISABLE_BROADCAST_QUIRK, KVM_X2APIC_API_USE_32BIT_IDS};
use kvm_ioctls::{Kvm, VmFd};
use regex::Regex;
use topology::cpuid::CpuidSet;
use topology::{GuestTopology, HostTopology, Vendor};
use tracing::{debug, info};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::acpi;
use crate::boot::{self, BootRequest};
use crate::compat::CompatMode;
use crate::console::ConsoleSink;
use crate::cpuid::{self, CpuidCaps};
use crate::devices::{
    CpuHotplug, DeviceSpec, Devices, GsiRoutes, LegacyDevices, MsiWakeSlot, PciBuilder, PciHotplug,
};
use crate::layout::{COM1_GSI, GED_GSI};
use crate::memory::{self, GuestRam, HumanSize, MemoryPlan};
use crate::vcpu::Vcpu;
use crate::Error;
use vcpu_sched::placement::pin::PinPlan;

mod control;

pub use control::{handle_exit, StopReason, VmControl};

/// Command-line items every Linux guest of this VMM gets, before the
/// compatibility items and the user's own: the console on COM1, and reboot
/// through the i8042 (which ends the VM cleanly). PCI is probed: its
/// segments are in the MCFG and the DSDT.
pub const BASE_CMDLINE: &[&str] = &["console=ttyS0", "reboot=k"];

/// Everything needed to build a Linux VM.
pub struct LinuxVmSpec {
    /// The guest's CPU topology.
    pub guest: GuestTopology,
    /// RAM in bytes, split equally across the guest's nodes.
    pub memory: u64,
    /// Kernel (vmlinux or bzImage).
    pub kernel: PathBuf,
    /// Initrd.
    pub initrd: Option<PathBuf>,
    /// The user's command line, appended after [`BASE_CMDLINE`] and the
    /// compatibility items.
    pub cmdline: String,
    /// CPUID encoding; `None` takes the host's.
    pub vendor: Option<Vendor>,
    /// kvm_pvm workarounds.
    pub compat: CompatMode,
    /// Where vCPUs will run (dense indices of `host`), for memory binding.
    pub pins: Option<PinPlan>,
    /// The host model the pins refer to.
    pub host: Option<HostTopology>,
    /// The console's destination.
    pub console: Box<dyn Write + Send>,
    /// `--until`.
    pub until: Option<Regex>,
    /// PCI segments and devices.
    pub devices: DeviceSpec,
    /// Guest RAM as shared memfds (`memory.shared`), which vhost-user
    /// backends can map; an fs device implies it.
    pub shared_memory: bool,
    /// Input for the virtio-console (a pty's master, a socket's pipe).
    pub console_input: Option<std::os::fd::OwnedFd>,
    /// With a virtio console, where COM1 writes (`None`: stderr).
    pub serial: Option<Box<dyn Write + Send>>,
    /// ACPI CPU hotplug: how many of `guest`'s vCPUs are present at boot
    /// (the others wait to be hot-added, see
    /// [`crate::devices::cpu_hotplug`]). `None`, or all of them: no
    /// hotplug controller.
    pub boot_vcpus: Option<usize>,
    /// ACPI PCI hotplug: a slot device per PCI slot and the controller
    /// ([`crate::devices::pci_hotplug`]), for devices added while the
    /// guest runs (`vmm serve`'s `vm.add-disk`, `vm.add-net`). Without an
    /// API nothing can be added, and each slot costs the guest's boot
    /// some ACPI work (about 60 ms per slot under kvm_pvm), so `vmm run`
    /// leaves it off.
    pub pci_hotplug: bool,
}

impl fmt::Debug for LinuxVmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinuxVmSpec")
            .field("guest", &self.guest.describe())
            .field("memory", &self.memory)
            .field("kernel", &self.kernel)
            .field("initrd", &self.initrd)
            .field("cmdline", &self.cmdline)
            .finish()
    }
}

/// The complete command line for a user part and a compat mode. With a
/// virtio console the kernel's console is `hvc0` after `ttyS0`: the
/// kernel registers `hvc0` at its very start, long before the virtio
/// driver gives it a device, and what it prints to it until then is
/// lost; COM1 carries that early part (and the rest again).
pub fn full_cmdline(user: &str, compat: CompatMode, virtio_console: bool) -> String {
    let mut items: Vec<String> = BASE_CMDLINE
        .iter()
        .map(|s| match *s {
            "console=ttyS0" if virtio_console => "console=ttyS0 console=hvc0".to_string(),
            s => s.to_string(),
        })
        .collect();
    items.extend(compat.cmdline_items());
    let user = user.trim();
    if !user.is_empty() {
        items.push(user.to_string());
    }
    items.join(" ")
}

/// A built Linux VM, ready to run.
pub struct LinuxVm {
    vm: Arc<VmFd>,
    ram: GuestRam,
    vcpus: Vec<Vcpu>,
    devices: Arc<Devices>,
    msi_wake: MsiWakeSlot,
    control: Arc<VmControl>,
    guest: GuestTopology,
    cmdline: String,
}

impl fmt::Debug for LinuxVm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinuxVm")
            .field("guest", &self.guest.describe())
            .field("ram", &self.ram)
            .field("vcpus", &self.vcpus.len())
            .finish()
    }
}

fn kvm_err(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { op, source }
}

/// Creates a KVM VM with the in-kernel irqchip (PIC, IOAPIC, LAPICs) and
/// PIT, as a Linux guest wants them.
pub fn create_vm_with_irqchip(kvm: &Kvm) -> Result<VmFd, Error> {
    create_vm(kvm, true)
}

/// Creates a KVM VM, with the in-kernel irqchip and PIT or without them.
/// Without, every HLT and every interrupt-controller access exits to
/// userspace ([`VcpuExit::Halt`](crate::vcpu::VcpuExit::Halt)): what micro-guests want.
pub fn create_vm(kvm: &Kvm, irqchip: bool) -> Result<VmFd, Error> {
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    // Intel needs a TSS area for real-mode emulation; harmless elsewhere.
    if let Err(e) = vm.set_tss_address(0xfffb_d000) {
        debug!("KVM_SET_TSS_ADDR: {e}");
    }
    if !irqchip {
        return Ok(vm);
    }
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))?;
    Ok(vm)
}

/// Registers every region of `memory` as a KVM memory slot. The caller
/// keeps `memory` alive as long as `vm`.
pub fn register_memory(vm: &VmFd, memory: &GuestMemoryMmap) -> Result<(), Error> {
    for (slot, region) in memory.iter().enumerate() {
        let host = memory
            .get_host_address(region.start_addr())
            .map_err(|e| Error::Other(format!("guest memory: {e}")))?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region's host mapping is owned by `memory`, which
        // the caller keeps alive as long as the VM fd (LinuxVm holds both
        // and drops the fd first).
        unsafe { vm.set_user_memory_region(r) }.map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// Refuses a guest with more vCPUs, or a higher APIC ID, than this host's
/// KVM takes; returns the guest's highest APIC ID.
fn check_vcpu_ids(kvm: &Kvm, guest: &GuestTopology) -> Result<u32, Error> {
    let n = guest.num_vcpus();
    let max_vcpus = kvm.get_max_vcpus();
    if n > max_vcpus {
        return Err(Error::Input(format!(
            "--guest has {n} vCPUs; this host's KVM allows at most {max_vcpus} per VM"
        )));
    }
    let max_apic = guest.cpus().iter().map(|c| c.apic_id).max().unwrap_or(0);
    let max_id = kvm.get_max_vcpu_id();
    if max_apic as usize >= max_id {
        return Err(Error::Input(format!(
            "--guest needs x2APIC ID {max_apic}, but this host's KVM takes vCPU ids below {max_id}"
        )));
    }
    Ok(max_apic)
}

/// Turns on KVM's x2APIC API (32-bit APIC IDs), for APIC IDs above 254.
fn enable_x2apic_api(vm: &VmFd) -> Result<(), Error> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_X2APIC_API,
        ..Default::default()
    };
    cap.args[0] = (KVM_X2APIC_API_USE_32BIT_IDS | KVM_X2APIC_API_DISABLE_BROADCAST_QUIRK) as u64;
    vm.enable_cap(&cap)
        .map_err(kvm_err("KVM_ENABLE_CAP(X2APIC_API)"))
}

/// The devices: the legacy ones (COM1's interrupt wired to an irqfd and
/// its output to a console sink that stops `control` on `--until`) and
/// the PCI segments of `devices`.
fn create_devices(
    vm: &Arc<VmFd>,
    ram: &GuestRam,
    spec: (
        Box<dyn Write + Send>,
        Option<Regex>,
        &DeviceSpec,
        (usize, usize),
    ),
    (backends, io_cpus): (crate::devices::Backends, Vec<Option<Vec<usize>>>),
    control: &Arc<VmControl>,
    wake: &MsiWakeSlot,
    (hotplug, pci_hotplug): (Option<(usize, usize)>, bool),
) -> Result<Arc<Devices>, Error> {
    let (console, until, devices, shape) = spec;
    let pci_segments = devices.pci_segments.max(1);
    let mut backends = backends;
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK)
        .map_err(|e| Error::Other(format!("creating the serial eventfd: {e}")))?;
    vm.register_irqfd(&serial_irq, COM1_GSI)
        .map_err(kvm_err("KVM_IRQFD(COM1)"))?;
    // The guest's console (the one `--until` watches) is hvc0 with a
    // virtio console; COM1 then writes to stderr (early boot, earlycon).
    let sink = ConsoleSink::new(console, until, control.clone());
    // `backends.console` arrives holding COM1's writer; the virtio
    // console gets the sink.
    let serial_sink = match backends.console.as_mut() {
        Some((out, _)) => {
            let serial = std::mem::replace(out, Box::new(sink));
            ConsoleSink::new(serial, None, control.clone())
        }
        None => sink,
    };
    let legacy = LegacyDevices::new(serial_irq, serial_sink);
    let pci = PciBuilder {
        vm: vm.clone(),
        routes: Arc::new(GsiRoutes::new(vm.clone())),
        mem: ram.memory().clone(),
        wake: wake.clone(),
        io_cpus,
    }
    .build(devices, shape, backends)?;
    let mut devices = Devices::new(legacy, pci);
    if hotplug.is_none() && !pci_hotplug {
        return Ok(Arc::new(devices));
    }
    // The GED's interrupt, shared by the PCI and CPU hotplug controllers
    // (each holds a handle on the same eventfd).
    let ged = EventFd::new(libc::EFD_NONBLOCK)
        .map_err(|e| Error::Other(format!("creating the GED eventfd: {e}")))?;
    vm.register_irqfd(&ged, GED_GSI)
        .map_err(kvm_err("KVM_IRQFD(GED)"))?;
    let ged_handle = || {
        ged.try_clone()
            .map_err(|e| Error::Other(format!("duplicating the GED eventfd: {e}")))
    };
    if pci_hotplug {
        devices = devices.with_pci_hotplug(Arc::new(PciHotplug::new(pci_segments, ged_handle()?)));
    }
    if let Some((max, present)) = hotplug {
        info!(max, present, "ACPI CPU hotplug");
        devices = devices.with_cpu_hotplug(Arc::new(CpuHotplug::new(max, present, ged_handle()?)));
    }
    Ok(Arc::new(devices))
}

/// Writes the ACPI tables into guest RAM.
fn write_acpi(ram: &GuestRam, acpi: &acpi::AcpiImage) -> Result<(), Error> {
    ram.memory()
        .write_slice(&acpi.bytes, GuestAddress(acpi.base))
        .map_err(|e| Error::Other(format!("writing the ACPI tables: {e}")))?;
    for (sig, addr, len) in &acpi.tables {
        debug!(
            table = %String::from_utf8_lossy(sig),
            addr = format_args!("{addr:#x}"),
            len,
            "ACPI table"
        );
    }
    Ok(())
}

/// What every vCPU's CPUID is made of: KVM's supported set, the vendor
/// to encode, the features to expose and the compat mode's hiding.
struct CpuidPlan {
    base: CpuidSet,
    vendor: Vendor,
    caps: CpuidCaps,
    compat: CompatMode,
}

impl CpuidPlan {
    /// Asks KVM what it supports; `vendor` `None` takes the host's.
    fn probe(
        kvm: &Kvm,
        vendor: Option<Vendor>,
        compat: CompatMode,
        x2apic_boot: bool,
    ) -> Result<Self, Error> {
        let base = cpuid::supported(kvm).map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
        let vendor = vendor.or_else(|| base.vendor()).unwrap_or(Vendor::Intel);
        let caps = CpuidCaps {
            ext_dest_id: x2apic_boot,
            ..CpuidCaps::probe(kvm)
        };
        Ok(Self {
            base,
            vendor,
            caps,
            compat,
        })
    }

    /// Sets vCPU `i`'s CPUID: the topology leaves, PV features, compat
    /// hiding (logged for vCPU 0).
    fn set(&self, guest: &GuestTopology, vcpu: &Vcpu, i: usize) -> Result<(), Error> {
        let mut set = guest.cpuid(i, &self.base, self.vendor);
        cpuid::finish(&mut set, self.caps);
        self.compat.adjust_cpuid(&mut set);
        if i == 0 {
            info!(
                vendor = %self.vendor,
                pv = ?cpuid::pv_feature_names(cpuid::pv_features(&set)),
                "guest CPUID"
            );
        }
        let kc =
            cpuid::to_kvm(&set).map_err(|e| Error::Other(format!("CPUID for vCPU {i}: {e:?}")))?;
        vcpu.fd().set_cpuid2(&kc).map_err(kvm_err("KVM_SET_CPUID2"))
    }
}

impl LinuxVm {
    /// Builds the VM: checks the request, maps and binds memory, creates
    /// the irqchip, devices and vCPUs, writes ACPI tables and loads the
    /// kernel. User errors (a missing kernel, too little memory) are
    /// reported before anything is allocated.
    pub fn build(kvm: &Kvm, spec: LinuxVmSpec) -> Result<Self, Error> {
        let guest = spec.guest;
        let n = guest.num_vcpus();
        // Input checks first.
        let plan = MemoryPlan::new(spec.memory, guest.num_nodes())?;
        let info = boot::inspect_kernel(&spec.kernel)?;
        boot::check_fit(&info, spec.initrd.as_deref(), &plan)?;
        let cmdline = full_cmdline(&spec.cmdline, spec.compat, spec.devices.console.is_some());
        boot::check_cmdline(&cmdline)?;
        let max_apic = check_vcpu_ids(kvm, &guest)?;
        spec.devices.check(n).map_err(Error::Input)?;
        let mut backends = spec.devices.open()?;
        if spec.devices.console.is_some() {
            backends.console = Some((
                spec.serial.unwrap_or_else(|| Box::new(std::io::stderr())),
                spec.console_input,
            ));
        }
        let segments = spec.devices.layouts(guest.num_nodes());
        let hotplug = spec.boot_vcpus.filter(|&b| b < n).map(|b| b.max(1));
        let acpi = acpi::build(&guest, &plan, &segments, (hotplug, spec.pci_hotplug))?;

        let vm = Arc::new(create_vm_with_irqchip(kvm)?);
        let x2apic_boot = max_apic > 254;
        if x2apic_boot {
            enable_x2apic_api(&vm)?;
        }

        let policies = match &spec.host {
            Some(h) => memory::node_policies(&guest, h, spec.pins.as_ref().map(|p| &p.dense[..])),
            None => Vec::new(),
        };
        let shared = spec.shared_memory || !spec.devices.fs.is_empty();
        let ram = GuestRam::allocate(plan, &policies, shared)?;
        let io_cpus = crate::devices::io_cpus(&segments, &policies, spec.host.as_ref());
        register_memory(&vm, ram.memory())?;

        let control = VmControl::new();
        let msi_wake = MsiWakeSlot::default();
        let devices = create_devices(
            &vm,
            &ram,
            (
                spec.console,
                spec.until,
                &spec.devices,
                (guest.num_nodes(), n),
            ),
            (backends, io_cpus),
            &control,
            &msi_wake,
            (hotplug.map(|b| (n, b)), spec.pci_hotplug),
        )?;

        write_acpi(&ram, &acpi)?;
        let entry = boot::load(
            ram.memory(),
            ram.plan(),
            &BootRequest {
                kernel: &spec.kernel,
                initrd: spec.initrd.as_deref(),
                cmdline: &cmdline,
                rsdp: acpi.rsdp,
            },
        )?;

        let cpuid = CpuidPlan::probe(kvm, spec.vendor, spec.compat, x2apic_boot)?;
        let mut vcpus = Vec::with_capacity(n);
        for i in 0..n {
            let apic = guest.cpu(i).apic_id;
            let mut vcpu = Vcpu::new(&vm, i, apic as u64)?;
            cpuid.set(&guest, &vcpu, i)?;
            boot::setup_vcpu(vcpu.fd(), i)?;
            if i == 0 {
                boot::setup_boot_vcpu(vcpu.fd(), &entry, x2apic_boot)?;
            }
            if spec.compat.assist() {
                vcpu.enable_compat_assist(ram.memory().clone());
            }
            control.add_kicker(vcpu.kicker());
            vcpus.push(vcpu);
        }
        info!(
            guest = %guest.describe(),
            memory = %HumanSize(ram.plan().total()),
            cmdline = %cmdline,
            "VM built"
        );
        Ok(Self {
            vm,
            ram,
            vcpus,
            devices,
            msi_wake,
            control,
            guest,
            cmdline,
        })
    }

    /// The guest topology.
    pub fn guest(&self) -> &GuestTopology {
        &self.guest
    }
    /// The complete kernel command line.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }
    /// The guest's RAM.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }
    /// The KVM VM fd.
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm
    }
    /// Turns KVM's halt polling off for this VM (`KVM_CAP_HALT_POLL`, 0
    /// ns): a vCPU that halts blocks at once instead of spinning up to
    /// the host's `halt_poll_ns` (200 us here) on its thread. For an M:N
    /// executor that thread is a worker that should run another vCPU, and
    /// a spinning vCPU reads as not blocking to the halt poller and the
    /// block watch. Returns false where KVM has no such capability (the
    /// host's polling then stays).
    pub fn disable_halt_polling(&self) -> bool {
        let mut cap = kvm_enable_cap {
            cap: kvm_bindings::KVM_CAP_HALT_POLL,
            ..Default::default()
        };
        cap.args[0] = 0;
        self.vm.enable_cap(&cap).is_ok()
    }
    /// The devices, the [`PortIo`](crate::vcpu::PortIo) to run vCPUs with.
    pub fn devices(&self) -> Arc<Devices> {
        self.devices.clone()
    }
    /// Where an executor that keeps halted vCPUs asleep outside `KVM_RUN`
    /// hooks in, to hear of each device interrupt (its destination APIC
    /// ID) at once.
    pub fn msi_wake(&self) -> MsiWakeSlot {
        self.msi_wake.clone()
    }
    /// Stop requests and kickers.
    pub fn control(&self) -> Arc<VmControl> {
        self.control.clone()
    }
    /// Takes the vCPUs out, for an executor that runs them itself.
    pub fn take_vcpus(&mut self) -> Vec<Vcpu> {
        std::mem::take(&mut self.vcpus)
    }
}
