//! The request and response bodies of `vmm serve`, with Cloud Hypervisor's
//! field names, and their checks.
//!
//! WHAT: [`VmConfig`] (CH's `cpus`, `memory`, `numa`, `payload`, `serial`,
//! `console`, plus our `x_vmm` extension), [`VmResize`], the error body
//! [`ApiError`], and [`VmConfig::guest_shape`], which turns a config into a
//! guest topology or names the field that is wrong.
//! WHY: operators' tools (curl scripts, Kata's clh driver) send CH's JSON;
//! a typo must be a 400 naming the field, never a silently ignored key,
//! so every struct denies unknown fields.
//! HOW: plain serde types; no I/O.

use serde::{Deserialize, Serialize};

use vcpu_sched::placement::pack::{CpuAffinity, Relax};

/// An error answer: `{"error": "...", "field": "cpus.topology"}`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    #[serde(skip)]
    pub status: u16,
    /// What is wrong and what to give instead.
    pub error: String,
    /// The request field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    /// A 400 naming `field`.
    pub fn bad(field: &str, error: impl Into<String>) -> Self {
        Self {
            status: 400,
            error: format!("{field}: {}", error.into()),
            field: Some(field.into()),
        }
    }
    /// Any status, no field.
    pub fn status(status: u16, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            field: None,
        }
    }
    /// A body that is not valid JSON for the expected type. serde names an
    /// unknown or missing field in its message; that name becomes `field`.
    pub fn from_json(e: &serde_json::Error) -> Self {
        let msg = e.to_string();
        let field = ["unknown field `", "missing field `"].iter().find_map(|p| {
            let i = msg.find(p)? + p.len();
            let j = msg[i..].find('`')? + i;
            Some(msg[i..j].to_string())
        });
        Self {
            status: 400,
            error: format!("invalid JSON body: {msg}"),
            field,
        }
    }
}

/// CH's `VmConfig`, the subset this VMM implements.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// This VMM's extensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_vmm: Option<Extensions>,
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
}

impl Default for CpusConfig {
    fn default() -> Self {
        Self {
            boot_vcpus: 1,
            max_vcpus: None,
            topology: None,
            affinity: None,
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

/// CH's `MemoryConfig` (only `size`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Bytes.
    pub size: u64,
}

/// CH's `PayloadConfig`.
#[derive(Clone, Debug, Serialize, Deserialize)]
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

/// CH's `ConsoleConfig` (mode and file).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// `Off`, `Null`, `Tty`, `File`, `Pty` or `Socket` (only `Off` and
    /// `Null` mean anything to a micro-guest).
    pub mode: String,
    /// The file, for `File`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
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
    /// 1 ms, forever), `exit` (every vCPU ends at once) or `crash` (vCPU 0
    /// triple-faults).
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

    /// Checks the fields this VMM does not take and returns the guest
    /// shape as an hwloc synthetic string (or the preset named).
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

    pub fn guest_shape(&self) -> Result<String, ApiError> {
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
                        "{m} differs from boot_vcpus {}: vCPU hotplug is not supported, give equal values",
                        c.boot_vcpus
                    ),
                ));
            }
        }
        let x = self.x_vmm.clone().unwrap_or_default();
        let linux = self.linux_payload();
        if let Some(p) = &self.payload {
            if p.kernel.is_none() && (p.initramfs.is_some() || p.cmdline.is_some()) {
                return Err(ApiError::bad(
                    "payload.kernel",
                    "initramfs and cmdline need a kernel",
                ));
            }
            if let Some(k) = &p.kernel {
                if x.micro.is_some() {
                    return Err(ApiError::bad(
                        "x_vmm.micro",
                        "give a micro-guest or payload.kernel, not both",
                    ));
                }
                vmm_machine::boot::inspect_kernel(std::path::Path::new(k))
                    .map_err(|e| ApiError::bad("payload.kernel", e.to_string()))?;
            }
            if let Some(i) = &p.initramfs {
                vmm_machine::boot::check_initrd(std::path::Path::new(i))
                    .map_err(|e| ApiError::bad("payload.initramfs", e.to_string()))?;
            }
            if let Some(c) = &p.cmdline {
                vmm_machine::boot::check_cmdline(c)
                    .map_err(|e| ApiError::bad("payload.cmdline", e.to_string()))?;
            }
        }
        if let Some(m) = &x.micro {
            if !MICRO_PROGRAMS.contains(&m.as_str()) {
                return Err(ApiError::bad(
                    "x_vmm.micro",
                    format!("unknown program {m:?}; give one of {MICRO_PROGRAMS:?}"),
                ));
            }
        }
        if let Some(rt) = &x.rt {
            if !matches!(rt.policy.as_str(), "fifo" | "rr") {
                return Err(ApiError::bad("x_vmm.rt.policy", "give fifo or rr"));
            }
            if !(1..=99).contains(&rt.priority) {
                return Err(ApiError::bad(
                    "x_vmm.rt.priority",
                    "an RT priority is 1..=99",
                ));
            }
            if let Some(v) = &rt.vcpu_priorities {
                if v.len() != c.boot_vcpus as usize || v.iter().any(|p| !(1..=99).contains(p)) {
                    return Err(ApiError::bad(
                        "x_vmm.rt.vcpu_priorities",
                        format!(
                            "give one RT priority (1..=99) per vCPU: {} of them",
                            c.boot_vcpus
                        ),
                    ));
                }
            }
        }
        if let Some(p) = &x.placement {
            if !matches!(p.policy.as_str(), "pinned" | "none") {
                return Err(ApiError::bad(
                    "x_vmm.placement.policy",
                    "give pinned or none",
                ));
            }
        }
        if let (true, Some(m)) = (linux, &self.memory) {
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
        } else if let Some(m) = &self.memory {
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
        }
        let nodes = self.numa.as_ref().map_or(0, Vec::len);
        let (shape, field) = if let Some(t) = &x.topology {
            (t.clone(), "x_vmm.topology")
        } else if let Some(t) = &c.topology {
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
            (
                ch_shape(
                    t.packages,
                    t.dies_per_package,
                    t.cores_per_die,
                    t.threads_per_core,
                    nodes > 1,
                ),
                "cpus.topology",
            )
        } else {
            if nodes > 1 {
                return Err(ApiError::bad(
                    "numa",
                    "several guest nodes need cpus.topology",
                ));
            }
            (
                format!("package:1 l3:1 l2:{} core:1 pu:1", c.boot_vcpus),
                "cpus.boot_vcpus",
            )
        };
        let g = topology::GuestTopology::from_spec(&shape)
            .map_err(|e| ApiError::bad(field, format!("{shape:?}: {e}")))?;
        if g.num_vcpus() != c.boot_vcpus as usize {
            return Err(ApiError::bad(
                field,
                format!(
                    "{shape:?} has {} vCPUs, but boot_vcpus is {}",
                    g.num_vcpus(),
                    c.boot_vcpus
                ),
            ));
        }
        Ok(shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(j: &str) -> Result<VmConfig, ApiError> {
        serde_json::from_str(j).map_err(|e| ApiError::from_json(&e))
    }

    #[test]
    fn ch_topology_becomes_a_synthetic_shape() {
        let c = cfg(r#"{"cpus":{"boot_vcpus":8,"max_vcpus":8,"topology":{"threads_per_core":2,"cores_per_die":2,"dies_per_package":1,"packages":2}},"numa":[{"guest_numa_id":0},{"guest_numa_id":1}]}"#).unwrap();
        let s = c.guest_shape().unwrap();
        let g = topology::GuestTopology::from_spec(&s).unwrap();
        assert_eq!(g.num_vcpus(), 8);
        assert_eq!(g.num_nodes(), 2);
        assert_eq!(g.smt_siblings(0).len(), 2);
    }

    #[test]
    fn errors_name_the_field() {
        let e = cfg(r#"{"cpus":{"boot_vcpus":2,"bogus":1}}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("bogus"));
        let e = cfg(r#"{"cpus":{"boot_vcpus":4,"topology":{"threads_per_core":2,"cores_per_die":3,"dies_per_package":1,"packages":1}}}"#)
            .unwrap()
            .guest_shape()
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("cpus.topology"));
        let e = cfg(r#"{"cpus":{"boot_vcpus":2,"max_vcpus":4}}"#)
            .unwrap()
            .guest_shape()
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("cpus.max_vcpus"));
        let e = cfg(r#"{"memory":{"size":1000}}"#)
            .unwrap()
            .guest_shape()
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("memory.size"));
        let e = cfg(r#"{"cpus":{"boot_vcpus":2},"x_vmm":{"rt":{"policy":"fifo","priority":5,"vcpu_priorities":[3]}}}"#)
            .unwrap()
            .guest_shape()
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("x_vmm.rt.vcpu_priorities"));
        let ok = cfg(r#"{"cpus":{"boot_vcpus":2},"x_vmm":{"rt":{"policy":"rr","priority":5,"vcpu_priorities":[3,7]}}}"#).unwrap();
        ok.guest_shape().unwrap();
        let rt = ok.x_vmm.unwrap().rt.unwrap();
        assert_eq!((rt.priority_of(0), rt.priority_of(1)), (3, 7));
        let e = cfg(r#"{"x_vmm":{"micro":"nope"}}"#)
            .unwrap()
            .guest_shape()
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("x_vmm.micro"));
        let e = cfg("{").unwrap_err();
        assert!(e.error.contains("invalid JSON"), "{e:?}");
    }
}
