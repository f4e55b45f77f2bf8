//! The devices of a `VmConfig`, in Cloud Hypervisor's field names:
//! `disks` ([`DiskConfig`]), `net` ([`NetConfig`]), `rng` ([`RngConfig`]) and
//! `platform.num_pci_segments` ([`PlatformConfig`]), turned into the
//! machine's [`DeviceSpec`].
//!
//! Checked at `vm.create` without opening anything: every field's value,
//! and that each disk image is a regular file (a `stat`, which never
//! blocks). The images are opened and locked at `vm.boot`, on the
//! blocking pool, where a locked image or a read-only file asked for
//! read-write is refused with the machine's message. A `net`'s tap must
//! exist at `vm.create` (a look in sysfs); it is opened at `vm.boot`.

use serde::{Deserialize, Serialize};
use vmm_machine::devices::{
    DeviceSpec, DiskSpec, NetSpec, TapSource, DISK_QUEUE_SIZE, MAX_PCI_SEGMENTS, NET_QUEUE_SIZE,
};

/// A bad device field: (field, what is wrong and the fix). `api`
/// turns it into its 400 answer.
pub type FieldError = (String, String);

fn bad(field: &str, msg: impl Into<String>) -> FieldError {
    (field.to_string(), msg.into())
}

/// CH's `DiskConfig`, the fields this VMM implements.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// The raw image.
    pub path: String,
    /// Read-only.
    #[serde(default)]
    pub readonly: bool,
    /// Queues (default: one per vCPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_queues: Option<u16>,
    /// Queue size: this VMM's is 256; only that is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_size: Option<u16>,
    /// The PCI segment.
    #[serde(default)]
    pub pci_segment: u16,
    /// CH's device id (accepted, unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// CH's `NetConfig`, the fields this VMM implements.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// An existing tap's name.
    pub tap: Option<String>,
    /// The guest's MAC address (default: a random local one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Receive and transmit queues together, 2 per pair (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_queues: Option<u16>,
    /// Queue size: this VMM's is 256; only that is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_size: Option<u16>,
    /// The PCI segment.
    #[serde(default)]
    pub pci_segment: u16,
    /// CH's device id (accepted, unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// CH's `RngConfig`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngConfig {
    /// The entropy source: `/dev/urandom` only.
    pub src: String,
    /// CH's IOMMU flag: false only.
    #[serde(default)]
    pub iommu: bool,
}

/// CH's `PlatformConfig`, the field this VMM implements.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformConfig {
    /// PCI segments (1 to 16).
    #[serde(default = "one")]
    pub num_pci_segments: u16,
}

fn one() -> u16 {
    1
}

fn check_disk(i: usize, d: &DiskConfig, segments: u16) -> Result<DiskSpec, FieldError> {
    let field = |f: &str| format!("disks[{i}].{f}");
    if d.path.is_empty() {
        return Err(bad(&field("path"), "empty: give a raw image's path"));
    }
    match std::fs::metadata(&d.path) {
        Ok(m) if m.is_file() => {}
        Ok(m) => {
            return Err(bad(
                &field("path"),
                format!(
                    "{} is {}; give a raw image file",
                    d.path,
                    topology::user_file::kind(&m)
                ),
            ))
        }
        Err(e) => return Err(bad(&field("path"), format!("{}: {e}", d.path))),
    }
    if let Some(q) = d.queue_size.filter(|&q| q != DISK_QUEUE_SIZE) {
        return Err(bad(
            &field("queue_size"),
            format!(
                "{q}: this VMM's queues have {}; leave it out",
                DISK_QUEUE_SIZE
            ),
        ));
    }
    if d.pci_segment >= segments {
        return Err(bad(
            &field("pci_segment"),
            format!(
                "{} does not exist: platform.num_pci_segments is {segments}; raise it or pick a lower segment",
                d.pci_segment
            ),
        ));
    }
    Ok(DiskSpec {
        path: d.path.clone().into(),
        readonly: d.readonly,
        num_queues: d.num_queues,
        pci_segment: d.pci_segment,
        // Cloud Hypervisor's DiskConfig has no engine: the default.
        engine: Default::default(),
    })
}

fn check_net(i: usize, n: &NetConfig, segments: u16) -> Result<NetSpec, FieldError> {
    let field = |f: &str| format!("net[{i}].{f}");
    let Some(tap) = n.tap.as_deref().filter(|t| !t.is_empty()) else {
        return Err(bad(&field("tap"), "missing: give an existing tap's name"));
    };
    if tap.contains('/') || tap.len() >= 16 || tap == "." || tap == ".." {
        return Err(bad(
            &field("tap"),
            format!("{tap:?} is not an interface name"),
        ));
    }
    if !std::path::Path::new("/sys/class/net").join(tap).exists() {
        return Err(bad(
            &field("tap"),
            format!("{tap}: no such network interface; create it first (ip tuntap add {tap} mode tap multi_queue)"),
        ));
    }
    let mac = match &n.mac {
        None => None,
        Some(m) => Some(m.parse().map_err(|e: String| bad(&field("mac"), e))?),
    };
    if let Some(q) = n.queue_size.filter(|&q| q != NET_QUEUE_SIZE) {
        return Err(bad(
            &field("queue_size"),
            format!("{q}: this VMM's queues have {NET_QUEUE_SIZE}; leave it out"),
        ));
    }
    if n.pci_segment >= segments {
        return Err(bad(
            &field("pci_segment"),
            format!(
                "{} does not exist: platform.num_pci_segments is {segments}; raise it or pick a lower segment",
                n.pci_segment
            ),
        ));
    }
    Ok(NetSpec {
        tap: TapSource::Name(tap.to_string()),
        mac,
        num_queues: n.num_queues,
        pci_segment: n.pci_segment,
    })
}

/// The devices a `VmConfig` names, in its fields.
#[derive(Clone, Copy, Debug, Default)]
pub struct Devices<'a> {
    /// `disks`.
    pub disks: Option<&'a [DiskConfig]>,
    /// `net`.
    pub net: Option<&'a [NetConfig]>,
    /// `rng`.
    pub rng: Option<&'a RngConfig>,
    /// `platform`.
    pub platform: Option<&'a PlatformConfig>,
}

/// The machine's devices for `cfg`, a guest of `vcpus` vCPUs; an error
/// names the field.
pub fn device_spec(cfg: Devices<'_>, vcpus: usize) -> Result<DeviceSpec, FieldError> {
    let segments = cfg.platform.map_or(1, |p| p.num_pci_segments);
    if segments == 0 || segments > MAX_PCI_SEGMENTS {
        return Err(bad(
            "platform.num_pci_segments",
            format!("{segments} is out of range: give 1 to {MAX_PCI_SEGMENTS}"),
        ));
    }
    let rng = match cfg.rng {
        None => None,
        Some(r) if r.src != "/dev/urandom" => {
            return Err(bad(
                "rng.src",
                format!("{:?}: only /dev/urandom is served; give that", r.src),
            ))
        }
        Some(r) if r.iommu => return Err(bad("rng.iommu", "this VMM has no IOMMU; give false")),
        Some(_) => Some(0),
    };
    let disks = cfg
        .disks
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, d)| check_disk(i, d, segments))
        .collect::<Result<Vec<_>, _>>()?;
    let nets = cfg
        .net
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, n)| check_net(i, n, segments))
        .collect::<Result<Vec<_>, _>>()?;
    let spec = DeviceSpec {
        pci_segments: segments,
        rng,
        disks,
        nets,
        console: None,
    };
    spec.check(vcpus).map_err(|e| {
        let field = if e.starts_with("net ") || e.starts_with("the net") {
            "net"
        } else {
            "disks"
        };
        bad(field, e)
    })?;
    Ok(spec)
}
