//! Building the PCI segments and their virtio devices ([`PciBuilder`]),
//! at boot from a [`DeviceSpec`] and, for PCI hotplug, one device at a
//! time into a running VM.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use tracing::info;
use vm_memory::GuestMemoryMmap;
use vmm_devices::pci::{PciRoot, PciSegment, SegmentLayout};
use vmm_devices::virtio::block::Block;
use vmm_devices::virtio::console::{Console, ConsoleOut};
use vmm_devices::virtio::fs::BackendHealth;
use vmm_devices::virtio::net::{Mac, Net};
use vmm_devices::virtio::rng::Rng;
use vmm_devices::virtio::transport::BAR_SIZE;
use vmm_devices::virtio::vsock::Vsock;
use vmm_devices::virtio::{VirtioDevice, VirtioPci};
use vmm_devices::DeviceError;

use super::kvm::{GsiRoutes, KvmMsi, KvmNotify, MsiWakeSlot};
use super::spec::{Backends, DeviceSpec, DiskSpec, NetSpec};
use vmm_devices::virtio::block::QUEUE_SIZE as DISK_QUEUE_SIZE;

/// What [`PciBuilder::build`] made.
pub struct BuiltPci {
    /// The segments and their devices.
    pub root: PciRoot,
    /// The virtio-console's output handle, if there is one.
    pub console: Option<ConsoleOut>,
    /// Each device with an external backend (virtio-fs): its name and
    /// whether its backend still serves it.
    pub health: Vec<(String, BackendHealth)>,
    /// The builder, for devices added later (PCI hotplug).
    pub builder: PciBuilder,
}

/// What building the PCI devices needs from the VM.
pub struct PciBuilder {
    /// The VM.
    pub vm: Arc<VmFd>,
    /// Its GSI routes.
    pub routes: Arc<GsiRoutes>,
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// Called with an MSI's destination APIC ID after it is raised.
    pub wake: MsiWakeSlot,
    /// Per segment: the host CPUs (OS numbers) its devices' I/O threads
    /// run on ([`io_cpus`]).
    pub io_cpus: Vec<Option<Vec<usize>>>,
}

/// Per PCI segment, the host CPUs (OS numbers) for the I/O threads of its
/// devices: those of the host node that backs the segment's guest node
/// (the node its memory is bound to). The guest's driver puts the
/// device's rings in memory of the device's node (the kernel allocates
/// them on `dev_to_node`), which is bound to that host node; the thread
/// that reads them and writes the used rings runs there too, as do the
/// vCPUs the node's interrupts go to. `None` where that node's memory is
/// not bound to one host node (one-node host, unpinned vCPUs, a guest
/// node spread over host nodes): the thread then runs wherever the host
/// kernel puts it.
pub fn io_cpus(
    layouts: &[SegmentLayout],
    policies: &[crate::memory::NodePolicy],
    host: Option<&topology::HostTopology>,
) -> Vec<Option<Vec<usize>>> {
    layouts
        .iter()
        .map(|l| {
            let host = host?;
            let node = l.node?;
            let p = policies.iter().find(|p| p.node == node)?;
            let crate::memory::HostPolicy::Bind(os_nodes) = &p.policy else {
                return None;
            };
            let [os_node] = os_nodes.as_slice() else {
                return None;
            };
            let dense = host.nodes().iter().position(|n| n.os_index == *os_node)?;
            let cpus: Vec<usize> = host
                .cpus_of_node(dense as u32)
                .iter()
                .map(|&c| host.os_index(c) as usize)
                .collect();
            (!cpus.is_empty()).then_some(cpus)
        })
        .collect()
}

/// Disk `i`'s virtio-blk device, for a guest of `vcpus` vCPUs.
pub fn block_device(
    name: &str,
    d: &DiskSpec,
    disk: vmm_devices::virtio::block::Disk,
    vcpus: usize,
) -> Block {
    Block::new(name, disk, DeviceSpec::disk_queues(d, vcpus))
        .with_engine(d.engine)
        .with_queue_size(d.queue_size.unwrap_or(DISK_QUEUE_SIZE))
}

/// A virtio-net device over `taps` (one per queue pair).
pub fn net_device(name: &str, n: &NetSpec, taps: Vec<vmm_devices::tap::Tap>) -> Net {
    let mac = n.mac.unwrap_or_else(Mac::random);
    info!(device = name, %mac, pairs = taps.len(), "virtio-net");
    Net::new(name, taps, mac)
}

impl PciBuilder {
    /// Puts `device` on `segment` behind the virtio PCI transport, with
    /// one MSI-X vector per queue and one for configuration changes;
    /// returns its slot. On an error nothing stays allocated.
    pub fn add_virtio(
        &self,
        segment: &PciSegment,
        name: &str,
        device: Box<dyn VirtioDevice>,
    ) -> Result<usize, DeviceError> {
        let slot = segment.free_slot()?;
        let size = u64::from(BAR_SIZE);
        let bar = segment.allocate_bar(size)?;
        let made = (|| {
            let count = device.queue_max_sizes().len() as u16 + 1;
            let vectors = Arc::new(KvmMsi::new(self.routes.clone(), count, self.wake.clone())?);
            let notify = Arc::new(KvmNotify(self.vm.clone()));
            VirtioPci::new(name, device, bar, vectors, notify, self.mem.clone())
        })();
        let dev = match made {
            Ok(d) => d,
            Err(e) => {
                segment.free_bar((u64::from(bar), size));
                return Err(e);
            }
        };
        let cpus = self
            .io_cpus
            .get(usize::from(segment.layout().id))
            .cloned()
            .flatten();
        let on = cpus.as_ref().map(|c| c.len());
        let dev = dev.with_io_cpus(cpus);
        info!(
            device = name,
            segment = segment.layout().id,
            slot,
            bar = format_args!("{bar:#x}"),
            node = ?segment.layout().node,
            io_thread_cpus = ?on,
            "virtio device"
        );
        segment.insert(
            slot,
            name,
            Arc::new(Mutex::new(dev)),
            Some((u64::from(bar), size)),
        )?;
        Ok(slot)
    }

    /// PCI hotplug: puts `device` in a free slot of `segment` of the
    /// running VM's `root`; returns the slot. The guest learns of it
    /// from the hotplug controller, which the caller tells.
    pub fn hot_add(
        &self,
        root: &PciRoot,
        segment: u16,
        name: &str,
        device: Box<dyn VirtioDevice>,
    ) -> Result<usize, DeviceError> {
        let seg = root.segments().get(usize::from(segment)).ok_or_else(|| {
            DeviceError::Full(format!(
                "PCI segment {segment} does not exist: the guest has {} (0 to {}); \
                 pick a lower pci_segment",
                root.segments().len(),
                root.segments().len().saturating_sub(1)
            ))
        })?;
        self.add_virtio(seg, name, device)
    }

    /// The segments of `spec` for a guest of `nodes` nodes, with its
    /// devices; the builder stays with them, for PCI hotplug.
    pub fn build(
        self,
        spec: &DeviceSpec,
        (nodes, vcpus): (usize, usize),
        backends: Backends,
    ) -> Result<BuiltPci, DeviceError> {
        let segments = spec
            .layouts(nodes)
            .into_iter()
            .map(PciSegment::new)
            .collect::<Result<Vec<_>, _>>()?;
        let seg = |s: u16| &segments[usize::from(s)];
        if let Some(s) = spec.rng {
            self.add_virtio(seg(s), "virtio-rng", Box::new(Rng::new()?))?;
        }
        for (i, (d, disk)) in spec.disks.iter().zip(backends.disks).enumerate() {
            let name = format!("virtio-blk{i}");
            let dev = block_device(&name, d, disk, vcpus);
            self.add_virtio(seg(d.pci_segment), &name, Box::new(dev))?;
        }
        let mut console_out = None;
        if let (Some(s), Some((out, input))) = (spec.console, backends.console) {
            let dev = Console::new(out, input);
            console_out = Some(dev.output());
            self.add_virtio(seg(s), "virtio-console", Box::new(dev))?;
        }
        for (i, (n, taps)) in spec.nets.iter().zip(backends.taps).enumerate() {
            let name = format!("virtio-net{i}");
            let dev = net_device(&name, n, taps);
            self.add_virtio(seg(n.pci_segment), &name, Box::new(dev))?;
        }
        if let Some(v) = &spec.vsock {
            let name = "virtio-vsock";
            let dev = Vsock::new(name, v.cid, &v.socket)?;
            info!(device = name, cid = v.cid, socket = %v.socket.display(), "virtio-vsock");
            self.add_virtio(seg(v.pci_segment), name, Box::new(dev))?;
        }
        let mut health = Vec::new();
        for (i, (f, dev)) in spec.fs.iter().zip(backends.fs).enumerate() {
            let name = format!("virtio-fs{i}");
            info!(device = name, tag = %f.tag, socket = %f.socket.display(),
                request_queues = f.num_queues, "virtio-fs (vhost-user)");
            health.push((name.clone(), dev.health()));
            self.add_virtio(seg(f.pci_segment), &name, Box::new(dev))?;
        }
        Ok(BuiltPci {
            root: PciRoot::new(segments),
            console: console_out,
            health,
            builder: self,
        })
    }
}
