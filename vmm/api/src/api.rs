//! The request and response bodies of `vmm serve`, with Cloud Hypervisor's
//! field names, and their checks.
//!
//! WHAT: [`VmConfig`] (CH's `cpus`, `memory`, `numa`, `payload`, `serial`,
//! `console`, plus our `x_vmm` extension), [`VmResize`], the error body
//! [`ApiError`], and [`VmConfig::guest_shape`], which turns a config into a
//! guest topology or names the field that is wrong.
//! WHY: operators' tools (curl scripts, Kata's clh driver) send CH's JSON;
//! a typo must be a 400 naming the field, never a silently ignored key,
//! so every struct denies unknown fields; and a known field set to what
//! this VMM cannot honour (a PTY console, NUMA distances other than the
//! guest's, a placement that `cpus.affinity` overrides) is a 400 naming
//! it, never ignored.
//! HOW: plain serde types, one check per part of the config; no I/O (the
//! files a config names are checked by the crate's `files` module).

use serde::{Deserialize, Serialize};

use vcpu_sched::placement::pack::{CpuAffinity, Relax};

use super::defaults::{absent, off, only, yes, Unsupported};

pub use super::error::ApiError;

/// CH's `VmConfig`: every field of CH's API 0.3.0; those of devices and
/// features this VMM does not implement ([`Unsupported`]) only at their
/// defaults. Unknown fields are refused by name ([`Unsupported::check`]:
/// serde cannot deny them through a flattened struct).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VmConfig {
    /// vCPUs.
    #[serde(default)]
    pub cpus: CpusConfig,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryConfig>,
    /// What to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<PayloadConfig>,
    /// Guest NUMA nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<Vec<NumaConfig>>,
    /// The serial port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<ConsoleConfig>,
    /// The virtio console.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<ConsoleConfig>,
    /// virtio-blk disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<crate::devices::DiskConfig>>,
    /// virtio-net devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<Vec<crate::devices::NetConfig>>,
    /// virtio-fs devices (vhost-user; guest RAM becomes shared memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<Vec<crate::devices::FsConfig>>,
    /// A virtio-rng.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<crate::devices::RngConfig>,
    /// The platform (PCI segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<crate::devices::PlatformConfig>,
    /// A virtio-vsock (hybrid vsock over a Unix socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<crate::devices::VsockConfig>,
    /// This VMM's extensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_vmm: Option<Extensions>,
    /// CH's fields this VMM takes only at their defaults, and any unknown
    /// field (refused).
    #[serde(flatten)]
    pub ch: Unsupported,
}

/// CH's `CpusConfig`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpusConfig {
    /// vCPUs at boot.
    pub boot_vcpus: u32,
    /// vCPUs at most: those past `boot_vcpus` are hot-added by
    /// `vm.resize` (ACPI CPU hotplug, Linux guests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vcpus: Option<u32>,
    /// The guest CPU topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<CpuTopology>,
    /// Host CPUs per vCPU; absent: the planner picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Vec<CpuAffinity>>,
    /// Hyper-V enlightenments: false only.
    #[serde(default)]
    pub kvm_hyperv: bool,
    /// A limit on the guest's physical address bits: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_phys_bits: Option<u32>,
    /// CH's default `true`; either value is accepted: this VMM's CPUID
    /// never offers VMX or SVM, so the guest never nests.
    #[serde(default = "yes")]
    pub nested: bool,
    /// CPU features (`amx`): false or absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<serde_json::Value>,
}

impl Default for CpusConfig {
    fn default() -> Self {
        Self {
            boot_vcpus: 1,
            max_vcpus: None,
            topology: None,
            affinity: None,
            kvm_hyperv: false,
            max_phys_bits: None,
            nested: true,
            features: None,
        }
    }
}

/// CH's `CpuTopology`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuTopology {
    /// SMT threads per core.
    pub threads_per_core: u32,
    /// Cores per die.
    pub cores_per_die: u32,
    /// Dies per package.
    pub dies_per_package: u32,
    /// Packages (sockets).
    pub packages: u32,
}

/// CH's `MemoryConfig`: `size`, and the rest at CH's defaults
/// (`MemoryConfig::check_ch`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Bytes.
    pub size: u64,
    /// The most memory `vm.resize` may add: accepted and echoed (Kata
    /// reads it back as its ceiling), but `vm.resize` with `desired_ram`
    /// answers 400: no memory hotplug here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug_size: Option<u64>,
    /// Memory hotplugged at boot: absent or 0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplugged_size: Option<u64>,
    /// KSM: false only.
    #[serde(default)]
    pub mergeable: bool,
    /// `Acpi` only (no virtio-mem).
    #[serde(default = "acpi")]
    pub hotplug_method: String,
    /// Shared guest memory: each RAM range a memfd mapped `MAP_SHARED`,
    /// which vhost-user backends (virtiofsd) map too. An `fs` device
    /// makes guest RAM shared whether this is set or not.
    #[serde(default)]
    pub shared: bool,
    /// hugetlbfs pages: false only.
    #[serde(default)]
    pub hugepages: bool,
    /// Their size: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepage_size: Option<u64>,
    /// Populate at boot: false only.
    #[serde(default)]
    pub prefault: bool,
    /// Reserve swap space: false only.
    #[serde(default)]
    pub reserve: bool,
    /// Transparent huge pages: true (CH's default, what this VMM does:
    /// guest RAM is madvised MADV_HUGEPAGE) only.
    #[serde(default = "yes")]
    pub thp: bool,
    /// Memory zones: absent or empty only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<serde_json::Value>>,
}

fn acpi() -> String {
    "Acpi".into()
}

impl MemoryConfig {
    /// `size` bytes, every other field at CH's default.
    pub fn of_size(size: u64) -> Self {
        Self {
            size,
            hotplug_size: None,
            hotplugged_size: None,
            mergeable: false,
            hotplug_method: acpi(),
            shared: false,
            hugepages: false,
            hugepage_size: None,
            prefault: false,
            reserve: false,
            thp: true,
            zones: None,
        }
    }

    /// Every field but `size` and `hotplug_size` at what this VMM does.
    fn check_ch(&self) -> Result<(), ApiError> {
        if self.hotplugged_size.is_some_and(|h| h != 0) {
            absent(
                "memory.hotplugged_size",
                &self.hotplugged_size,
                "no memory hotplug here",
            )?;
        }
        off(
            "memory.mergeable",
            self.mergeable,
            "KSM merging is not implemented",
        )?;
        only(
            "memory.hotplug_method",
            &self.hotplug_method.as_str(),
            &"Acpi",
            "virtio-mem is not implemented",
        )?;
        off(
            "memory.hugepages",
            self.hugepages,
            "hugetlbfs backing is not implemented",
        )?;
        absent(
            "memory.hugepage_size",
            &self.hugepage_size,
            "hugetlbfs backing is not implemented",
        )?;
        off(
            "memory.prefault",
            self.prefault,
            "prefaulting is not implemented",
        )?;
        off(
            "memory.reserve",
            self.reserve,
            "reserving is not implemented",
        )?;
        only(
            "memory.thp",
            &self.thp,
            &true,
            "guest RAM is always madvised for transparent huge pages here",
        )?;
        if self.zones.as_ref().is_some_and(|z| !z.is_empty()) {
            absent(
                "memory.zones",
                &self.zones,
                "memory zones are not implemented",
            )?;
        }
        Ok(())
    }
}

/// CH's `PayloadConfig`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadConfig {
    /// A kernel image path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The kernel command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// An initramfs path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initramfs: Option<String>,
    /// Firmware: absent only (kernels boot directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// An IGVM file: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub igvm: Option<String>,
    /// Confidential-guest host data: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_data: Option<String>,
}

/// CH's `NumaConfig`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumaConfig {
    /// The guest node.
    pub guest_numa_id: u32,
    /// Its vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<u32>>,
    /// Distances to other nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distances: Option<Vec<NumaDistance>>,
    /// Memory zone ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_zones: Option<Vec<String>>,
}

/// CH's `NumaDistance`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumaDistance {
    /// The other node.
    pub destination: u32,
    /// The distance.
    pub distance: u32,
}

/// CH's `ConsoleConfig`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// `Off`, `Null`, `Tty`, `File`, `Pty` or `Socket` (only `Off` and
    /// `Null` mean anything to a micro-guest).
    pub mode: String,
    /// The file, for `File`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The Unix socket to make, for the console's `Socket`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// CH's IOMMU flag: false only.
    #[serde(default)]
    pub iommu: bool,
}

impl ConsoleConfig {
    /// Whether this `console` asks for a virtio console device.
    pub fn is_device(&self) -> bool {
        matches!(self.mode.as_str(), "Tty" | "File" | "Pty" | "Socket")
    }
}

/// CH's `VmResize`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmResize {
    /// The wanted vCPU count.
    #[serde(default)]
    pub desired_vcpus: Option<u32>,
    /// The wanted memory size.
    #[serde(default)]
    pub desired_ram: Option<u64>,
    /// The wanted balloon size.
    #[serde(default)]
    pub desired_balloon: Option<u64>,
}

/// `x_vmm`: what only this VMM has.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extensions {
    /// The guest shape as an hwloc synthetic string (or a preset); wins
    /// over `cpus.topology`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// RT scheduling of every vCPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rt: Option<RtConfig>,
    /// Where the planner may put the vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementConfig>,
    /// A built-in micro-guest as the payload: `ticker` (reports and sleeps
    /// 1 ms, forever), `exit` (every vCPU ends at once), `crash` (vCPU 0
    /// triple-faults) or `spin` (computes without an exit, forever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro: Option<String>,
}

/// `x_vmm.rt`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RtConfig {
    /// `fifo` or `rr`.
    pub policy: String,
    /// 1..=99.
    pub priority: u8,
    /// Per-vCPU priorities (one per vCPU, 1..=99), overriding `priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_priorities: Option<Vec<u8>>,
}

impl RtConfig {
    /// vCPU `k`'s priority.
    pub fn priority_of(&self, k: usize) -> u8 {
        self.vcpu_priorities
            .as_ref()
            .and_then(|v| v.get(k).copied())
            .unwrap_or(self.priority)
    }
}

/// `x_vmm.placement`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// `pinned` (the planner; the default) or `none` (any CPU).
    #[serde(default = "pinned")]
    pub policy: String,
    /// Alignment rules the planner may give up.
    #[serde(default)]
    pub relax: Relax,
}

fn pinned() -> String {
    "pinned".into()
}

/// The micro-guest programs `x_vmm.micro` names.
pub const MICRO_PROGRAMS: &[&str] = &["ticker", "exit", "crash", "spin"];

/// Cloud Hypervisor's CPU topology as an hwloc synthetic guest shape: one
/// LLC per die, an L2 per core, and with `numa` one NUMA node per package.
pub fn ch_shape(packages: u32, dies: u32, cores: u32, threads: u32, numa: bool) -> String {
    let numa = if numa { " [numa]" } else { "" };
    format!("package:{packages}{numa} die:{dies} l3:1 l2:{cores} core:1 pu:{threads}")
}

/// The smallest memory of a Linux guest.
pub const LINUX_MIN_MEMORY: u64 = 64 << 20;
/// A Linux guest's memory when `memory` is absent (CH's default).
pub const LINUX_DEFAULT_MEMORY: u64 = 512 << 20;

#[path = "api_checks.rs"]
mod checks;

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
