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
    /// vCPUs at most (must equal `boot_vcpus`: no hotplug).
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

impl VmConfig {
    /// Does it boot a Linux kernel (`payload.kernel`)?
    pub fn linux_payload(&self) -> bool {
        self.payload.as_ref().is_some_and(|p| p.kernel.is_some())
    }

    /// The guest RAM this VM holds when booted: `memory.size`, or the
    /// default of its payload (CH's 512 MiB for Linux, 2 MiB for a
    /// micro-guest).
    pub fn memory_bytes(&self) -> u64 {
        match &self.memory {
            Some(m) => m.size,
            None if self.linux_payload() => LINUX_DEFAULT_MEMORY,
            None => vmm_machine::micro::MIN_MEMORY,
        }
    }

    /// The config as `vm.info` shows it, in CH's schema: `cpus.max_vcpus`,
    /// `memory` (with the size in effect) and `payload` filled in where the
    /// request left them out, as CH echoes its defaults.
    pub fn echo(&self) -> VmConfig {
        let mut c = self.clone();
        c.cpus.max_vcpus.get_or_insert(c.cpus.boot_vcpus);
        if c.memory.is_none() {
            c.memory = Some(MemoryConfig::of_size(self.memory_bytes()));
        }
        c.payload.get_or_insert_with(PayloadConfig::default);
        c
    }

    /// Checks every field against what this VMM can honour and returns
    /// the guest shape as an hwloc synthetic string (or the preset
    /// named); an error names the field. Reads no file: the files a
    /// config names are checked apart, with no lock held (the crate's
    /// `files` module).
    pub fn guest_shape(&self) -> Result<String, ApiError> {
        self.ch.check()?;
        self.check_cpus()?;
        self.check_payload()?;
        self.check_extensions()?;
        self.check_memory()?;
        self.check_consoles()?;
        let (shape, field) = self.shape()?;
        let g = topology::GuestTopology::from_spec(&shape)
            .map_err(|e| ApiError::bad(field, format!("{shape:?}: {e}")))?;
        if g.num_vcpus() != self.cpus.boot_vcpus as usize {
            return Err(ApiError::bad(
                field,
                format!(
                    "{shape:?} has {} vCPUs, but boot_vcpus is {}",
                    g.num_vcpus(),
                    self.cpus.boot_vcpus
                ),
            ));
        }
        self.check_numa(&g)?;
        Ok(shape)
    }

    /// The machine's devices (`disks`, `net`, `rng`, `platform`); an error names
    /// the field. Stats the disk images, opens nothing.
    pub fn device_spec(&self) -> Result<vmm_machine::devices::DeviceSpec, ApiError> {
        let d = crate::devices::Devices {
            disks: self.disks.as_deref(),
            net: self.net.as_deref(),
            fs: self.fs.as_deref(),
            rng: self.rng.as_ref(),
            platform: self.platform.as_ref(),
        };
        if self.x_vmm.as_ref().is_some_and(|x| x.micro.is_some())
            && (self.disks.is_some()
                || self.rng.is_some()
                || self.net.is_some()
                || self.fs.as_ref().is_some_and(|f| !f.is_empty()))
        {
            return Err(ApiError::bad(
                "disks",
                "micro-guests have no PCI devices: give a Linux payload, or leave disks, net, fs and rng out",
            ));
        }
        let mut spec = crate::devices::device_spec(d, self.cpus.boot_vcpus as usize)
            .map_err(|(field, msg)| ApiError::bad(&field, msg))?;
        if self.linux_payload() && self.console.as_ref().is_some_and(ConsoleConfig::is_device) {
            spec.console = Some(0);
        }
        Ok(spec)
    }

    /// `cpus.boot_vcpus` and `cpus.max_vcpus`.
    fn check_cpus(&self) -> Result<(), ApiError> {
        let c = &self.cpus;
        if c.boot_vcpus == 0 {
            return Err(ApiError::bad("cpus.boot_vcpus", "give at least 1 vCPU"));
        }
        if c.boot_vcpus > vmm_machine::micro::MAX_VCPUS as u32 {
            return Err(ApiError::bad(
                "cpus.boot_vcpus",
                format!("at most {} vCPUs per VM", vmm_machine::micro::MAX_VCPUS),
            ));
        }
        if let Some(m) = c.max_vcpus {
            if m != c.boot_vcpus {
                return Err(ApiError::bad(
                    "cpus.max_vcpus",
                    format!(
                        "{m} differs from boot_vcpus {}: vCPU hotplug is not supported, give equal \
                         values (Kata: default_maxvcpus = default_vcpus)",
                        c.boot_vcpus
                    ),
                ));
            }
        }
        off(
            "cpus.kvm_hyperv",
            c.kvm_hyperv,
            "Hyper-V enlightenments are not implemented",
        )?;
        absent(
            "cpus.max_phys_bits",
            &c.max_phys_bits,
            "the guest's physical address width is this VMM's own",
        )?;
        if let Some(f) = &c.features {
            let none = serde_json::json!({});
            if *f != none && *f != serde_json::json!({"amx": false}) {
                absent(
                    "cpus.features",
                    &c.features,
                    "CPU features (AMX) are not implemented",
                )?;
            }
        }
        Ok(())
    }

    /// `payload`: what goes with what, and the command line (its files
    /// are checked apart).
    fn check_payload(&self) -> Result<(), ApiError> {
        let Some(p) = &self.payload else {
            return Ok(());
        };
        absent(
            "payload.firmware",
            &p.firmware,
            "firmware payloads are not implemented: give kernel",
        )?;
        absent(
            "payload.igvm",
            &p.igvm,
            "IGVM payloads are not implemented: give kernel",
        )?;
        absent(
            "payload.host_data",
            &p.host_data,
            "confidential guests are not implemented",
        )?;
        if p.kernel.is_none() && (p.initramfs.is_some() || p.cmdline.is_some()) {
            return Err(ApiError::bad(
                "payload.kernel",
                "initramfs and cmdline need a kernel",
            ));
        }
        if p.kernel.is_some() && self.x_vmm.as_ref().is_some_and(|x| x.micro.is_some()) {
            return Err(ApiError::bad(
                "x_vmm.micro",
                "give a micro-guest or payload.kernel, not both",
            ));
        }
        if let Some(c) = &p.cmdline {
            vmm_machine::boot::check_cmdline(c)
                .map_err(|e| ApiError::bad("payload.cmdline", e.to_string()))?;
        }
        Ok(())
    }

    /// `x_vmm`: the micro-guest, the RT policy, the placement.
    fn check_extensions(&self) -> Result<(), ApiError> {
        let Some(x) = &self.x_vmm else {
            return Ok(());
        };
        if let Some(m) = &x.micro {
            if !MICRO_PROGRAMS.contains(&m.as_str()) {
                return Err(ApiError::bad(
                    "x_vmm.micro",
                    format!("unknown program {m:?}; give one of {MICRO_PROGRAMS:?}"),
                ));
            }
        }
        if let Some(rt) = &x.rt {
            rt.check(self.cpus.boot_vcpus)?;
        }
        if let Some(p) = &x.placement {
            if !matches!(p.policy.as_str(), "pinned" | "none") {
                return Err(ApiError::bad(
                    "x_vmm.placement.policy",
                    "give pinned or none",
                ));
            }
            if self.cpus.affinity.is_some() {
                return Err(ApiError::bad(
                    "x_vmm.placement",
                    "cpus.affinity already places every vCPU; give one of the two",
                ));
            }
        }
        if x.topology.is_some() && self.cpus.topology.is_some() {
            return Err(ApiError::bad(
                "x_vmm.topology",
                "cpus.topology gives the shape too; give one of the two",
            ));
        }
        Ok(())
    }

    /// `memory.size`, against the payload's limits and the host's RAM.
    fn check_memory(&self) -> Result<(), ApiError> {
        let Some(m) = &self.memory else {
            return Ok(());
        };
        m.check_ch()?;
        if !self.linux_payload() {
            let (lo, hi) = (
                vmm_machine::micro::MIN_MEMORY,
                vmm_machine::micro::MAX_MEMORY,
            );
            if m.size < lo || m.size > hi || m.size % lo != 0 {
                return Err(ApiError::bad(
                    "memory.size",
                    format!(
                        "{} bytes; a micro-guest takes a multiple of {lo} from {lo} to {hi}",
                        m.size
                    ),
                ));
            }
            return Ok(());
        }
        if let Some(total) = vmm_machine::memory::host_mem_total() {
            if m.size > total {
                return Err(ApiError::bad(
                    "memory.size",
                    format!(
                        "{} bytes is more than this host's {total} bytes of RAM",
                        m.size
                    ),
                ));
            }
        }
        if m.size < LINUX_MIN_MEMORY || m.size % (2 << 20) != 0 {
            return Err(ApiError::bad(
                "memory.size",
                format!(
                    "{} bytes; a Linux guest takes a multiple of 2 MiB, at least {LINUX_MIN_MEMORY}",
                    m.size
                ),
            ));
        }
        Ok(())
    }

    /// `serial` and `console`: only what this VMM has (a Linux guest's
    /// 16550 serial port, to a file or the server's stdout; its virtio
    /// console, `hvc0`, to the server's stdout, a new file, a new pty or a
    /// new Unix socket), never a field it would ignore.
    fn check_consoles(&self) -> Result<(), ApiError> {
        if let Some(s) = &self.serial {
            let honoured: &[&str] = if self.linux_payload() {
                &["Off", "Null", "Tty", "File"]
            } else {
                &["Off", "Null"]
            };
            if !honoured.contains(&s.mode.as_str()) {
                let why = if self.linux_payload() {
                    "this VMM sends a serial port to a file (File) or its stdout (Tty), or nowhere"
                } else {
                    "a micro-guest has no serial port"
                };
                return Err(ApiError::bad(
                    "serial.mode",
                    format!("{:?}: {why}; give one of {honoured:?}", s.mode),
                ));
            }
            check_console_file("serial", s)?;
        }
        if let Some(c) = &self.console {
            let honoured: &[&str] = if self.linux_payload() {
                &["Off", "Null", "Tty", "File", "Pty", "Socket"]
            } else {
                &["Off", "Null"]
            };
            if !honoured.contains(&c.mode.as_str()) {
                return Err(ApiError::bad(
                    "console.mode",
                    format!(
                        "{:?}: {}; give one of {honoured:?}",
                        c.mode,
                        if self.linux_payload() {
                            "not a console mode"
                        } else {
                            "a micro-guest has no virtio console"
                        }
                    ),
                ));
            }
            if c.iommu {
                return Err(ApiError::bad(
                    "console.iommu",
                    "this VMM has no IOMMU; give false",
                ));
            }
            match (c.mode.as_str(), &c.socket) {
                ("Socket", None) => {
                    return Err(ApiError::bad(
                        "console.socket",
                        "give a socket path for mode Socket",
                    ))
                }
                ("Socket", Some(_)) | (_, None) => {}
                (m, Some(_)) => {
                    return Err(ApiError::bad(
                        "console.socket",
                        format!("mode {m} makes no socket; give mode Socket, or leave socket out"),
                    ))
                }
            }
            check_console_file("console", c)?;
        }
        Ok(())
    }

    /// The guest shape: `x_vmm.topology`, `cpus.topology` (CH's terms) or
    /// one package of `boot_vcpus` cores; and the field it came from.
    fn shape(&self) -> Result<(String, &'static str), ApiError> {
        let c = &self.cpus;
        let nodes = self.numa.as_ref().map_or(0, Vec::len);
        if let Some(t) = self.x_vmm.as_ref().and_then(|x| x.topology.as_ref()) {
            return Ok((t.clone(), "x_vmm.topology"));
        }
        let Some(t) = &c.topology else {
            if nodes > 1 {
                return Err(ApiError::bad(
                    "numa",
                    "several guest nodes need cpus.topology",
                ));
            }
            return Ok((
                format!("package:1 l3:1 l2:{} core:1 pu:1", c.boot_vcpus),
                "cpus.boot_vcpus",
            ));
        };
        let n = [
            t.threads_per_core,
            t.cores_per_die,
            t.dies_per_package,
            t.packages,
        ];
        if n.contains(&0) {
            return Err(ApiError::bad(
                "cpus.topology",
                "every count must be at least 1",
            ));
        }
        let total: u64 = n.iter().map(|&v| v as u64).product();
        if total != c.boot_vcpus as u64 {
            return Err(ApiError::bad(
                "cpus.topology",
                format!(
                    "{} x {} x {} x {} = {total} vCPUs, but boot_vcpus is {}",
                    t.packages,
                    t.dies_per_package,
                    t.cores_per_die,
                    t.threads_per_core,
                    c.boot_vcpus
                ),
            ));
        }
        if nodes > 1 && nodes as u32 != t.packages {
            return Err(ApiError::bad(
                "numa",
                format!("{nodes} guest nodes; give one per package ({})", t.packages),
            ));
        }
        let shape = ch_shape(
            t.packages,
            t.dies_per_package,
            t.cores_per_die,
            t.threads_per_core,
            nodes > 1,
        );
        Ok((shape, "cpus.topology"))
    }

    /// `numa`: one entry per guest node of the shape, each saying what
    /// the guest gets (its vCPUs, its distances) or leaving it out; no
    /// memory zones (this VMM has none).
    fn check_numa(&self, g: &topology::GuestTopology) -> Result<(), ApiError> {
        let Some(numa) = &self.numa else {
            return Ok(());
        };
        let nodes = g.num_nodes() as u32;
        if numa.len() as u32 != nodes {
            return Err(ApiError::bad(
                "numa",
                format!(
                    "{} entries, but the guest has {nodes} NUMA nodes; give one per node",
                    numa.len()
                ),
            ));
        }
        let mut seen = vec![false; nodes as usize];
        for n in numa {
            let id = n.guest_numa_id;
            if id >= nodes || std::mem::replace(&mut seen[id as usize], true) {
                return Err(ApiError::bad(
                    "numa.guest_numa_id",
                    format!("{id}: give each of 0..{nodes} once"),
                ));
            }
            n.check_against(g)?;
        }
        Ok(())
    }
}

/// A console's `file`: given with mode `File` only, and needed there.
fn check_console_file(name: &str, c: &ConsoleConfig) -> Result<(), ApiError> {
    match (c.mode.as_str(), &c.file) {
        ("File", None) => Err(ApiError::bad(
            &format!("{name}.file"),
            "give a file for mode File",
        )),
        ("File", Some(_)) | (_, None) => Ok(()),
        (m, Some(_)) => Err(ApiError::bad(
            &format!("{name}.file"),
            format!("mode {m} writes no file; give mode File, or leave file out"),
        )),
    }
}

impl NumaConfig {
    /// Its `cpus` and `distances` are what the guest gets, if given.
    fn check_against(&self, g: &topology::GuestTopology) -> Result<(), ApiError> {
        let id = self.guest_numa_id;
        if let Some(cpus) = &self.cpus {
            let mut mine = cpus.clone();
            mine.sort_unstable();
            let real = g.node_cpus(id);
            if mine != real {
                return Err(ApiError::bad(
                    "numa.cpus",
                    format!(
                        "node {id}: {cpus:?}, but the guest topology puts vCPUs {real:?} there; \
                         give those, or leave cpus out"
                    ),
                ));
            }
        }
        for d in self.distances.iter().flatten() {
            let real =
                (d.destination < g.num_nodes() as u32).then(|| g.distance(id, d.destination));
            if real != Some(d.distance) {
                return Err(ApiError::bad(
                    "numa.distances",
                    format!(
                        "node {id} to {}: {}, but the guest's distance (from its topology) is \
                         {real:?}; give that, or leave distances out",
                        d.destination, d.distance
                    ),
                ));
            }
        }
        if self.memory_zones.as_ref().is_some_and(|z| !z.is_empty()) {
            return Err(ApiError::bad(
                "numa.memory_zones",
                "this VMM has no memory zones; leave memory_zones out",
            ));
        }
        Ok(())
    }
}

impl RtConfig {
    /// The policy and priorities, for a VM of `vcpus` vCPUs.
    fn check(&self, vcpus: u32) -> Result<(), ApiError> {
        if !matches!(self.policy.as_str(), "fifo" | "rr") {
            return Err(ApiError::bad("x_vmm.rt.policy", "give fifo or rr"));
        }
        if !(1..=99).contains(&self.priority) {
            return Err(ApiError::bad(
                "x_vmm.rt.priority",
                "an RT priority is 1..=99",
            ));
        }
        if let Some(v) = &self.vcpu_priorities {
            if v.len() != vcpus as usize || v.iter().any(|p| !(1..=99).contains(p)) {
                return Err(ApiError::bad(
                    "x_vmm.rt.vcpu_priorities",
                    format!("give one RT priority (1..=99) per vCPU: {vcpus} of them"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
