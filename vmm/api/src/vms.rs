//! The server's VMs: one record per VM, and its lifecycle state.
//!
//! WHAT: [`VmState`] (CH's names) and [`VmRecord`] (a VM's config, shape,
//! placement, running vCPUs, boots and counters), with
//! [`VmRecord::observed_state`], which sees a guest that ended on its own.
//! WHY: the controller changes these records and the metrics read them;
//! both import this file, which imports neither.
//! HOW: plain data; the controller keeps the table behind its lock.

use std::sync::Arc;

use vcpu_sched::placement::pack::VmPlan;
use vmm_machine::vcpu_body::Running;

use super::api::VmConfig;
use super::files::FileId;
use super::guests::ExitCounts;

/// A VM's lifecycle state, as CH names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// Created, not booted.
    Created,
    /// Booted.
    Running,
    /// Booted, its vCPUs held off every CPU (vm.pause).
    Paused,
    /// Shut down (by the API, or the guest ended or failed).
    Shutdown,
}

impl VmState {
    /// CH's name.
    pub fn name(self) -> &'static str {
        match self {
            VmState::Created => "Created",
            VmState::Running => "Running",
            VmState::Paused => "Paused",
            VmState::Shutdown => "Shutdown",
        }
    }
}

/// One VM of the server.
pub struct VmRecord {
    pub(crate) config: VmConfig,
    pub(crate) shape: String,
    pub(crate) plan: Option<VmPlan>,
    pub(crate) state: VmState,
    pub(crate) run: Option<Arc<Running>>,
    /// The running guest's CPU hotplug controller (`vm.resize`).
    pub(crate) cpu_hotplug: Option<Arc<vmm_machine::devices::CpuHotplug>>,
    /// The running Linux guest's devices (PCI hotplug).
    pub(crate) devices: Option<Arc<vmm_machine::devices::Devices>>,
    /// The running guest's disks and nets: CH id to PCI (segment, slot).
    pub(crate) pci_ids: std::collections::BTreeMap<String, (u16, usize)>,
    /// Set while a boot, shutdown or delete is in flight.
    pub(crate) busy: bool,
    pub(crate) boots: u64,
    /// Counters of earlier boots, kept so that `_total` series never drop.
    pub(crate) past_exits: u64,
    pub(crate) last_stop: Option<String>,
    /// Exits by reason, all boots.
    pub(crate) exit_counts: Arc<ExitCounts>,
    /// The serial file an earlier boot made (a later boot appends to it).
    pub(crate) console: Option<FileId>,
    /// The virtio console's file an earlier boot made.
    pub(crate) vconsole: Option<FileId>,
    /// The running boot's devices with an external backend (virtio-fs):
    /// name and health, for `vm.info`.
    pub(crate) backends: Vec<(String, vmm_devices::virtio::fs::BackendHealth)>,
}

impl VmRecord {
    /// A VM just created.
    pub(crate) fn new(config: VmConfig, shape: String, plan: Option<VmPlan>) -> Self {
        Self {
            config,
            shape,
            plan,
            state: VmState::Created,
            run: None,
            cpu_hotplug: None,
            devices: None,
            pci_ids: Default::default(),
            busy: false,
            boots: 0,
            past_exits: 0,
            last_stop: None,
            exit_counts: Arc::default(),
            console: None,
            vconsole: None,
            backends: Vec::new(),
        }
    }

    /// `vm.info`'s `x_vmm.device_backends`: per device with an external
    /// backend, whether it still serves the device, and why not.
    pub fn backend_report(&self) -> serde_json::Value {
        // The running guest's devices know the hot-added ones too.
        let live = self.devices.as_ref().map(|d| d.backend_health());
        live.as_ref()
            .unwrap_or(&self.backends)
            .iter()
            .map(|(name, h)| match h.failure() {
                None => serde_json::json!({ "device": name, "state": "Ok" }),
                Some(why) => {
                    serde_json::json!({ "device": name, "state": "Failed", "error": why })
                }
            })
            .collect()
    }

    /// Its state, with a Running VM whose guest ended or failed seen as
    /// `Shutdown` (the executor keeps running until the API stops it), and
    /// why it stopped.
    pub fn observed_state(&self) -> (VmState, Option<String>) {
        if let (VmState::Running | VmState::Paused, Some(r)) = (self.state, &self.run) {
            let e = &r.set().vms()[0];
            if let Some(f) = e.failure() {
                return (VmState::Shutdown, Some(f.to_string()));
            }
            if e.finished_at().is_some() {
                return (VmState::Shutdown, Some("every vCPU ended".into()));
            }
        }
        (self.state, self.last_stop.clone())
    }

    /// vCPUs the guest has now: the hotplug controller's present ones
    /// (hot-added, not yet ejected), else `boot_vcpus`.
    pub fn present_vcpus(&self) -> usize {
        match &self.cpu_hotplug {
            Some(h) => h.present_map().iter().filter(|p| **p).count(),
            None => self.config.cpus.boot_vcpus as usize,
        }
    }

    /// Its KVM exits over every boot, and its live vCPUs.
    pub fn exits_and_live(&self) -> (u64, usize) {
        match &self.run {
            Some(r) => (
                self.past_exits + r.set().progress_snapshot().iter().sum::<u64>(),
                r.set().vms()[0].live(),
            ),
            None => (self.past_exits, 0),
        }
    }
}
