//! The devices of a `VmConfig`, in Cloud Hypervisor's field names:
//! `disks` ([`DiskConfig`]), `net` ([`NetConfig`]), `fs` ([`FsConfig`]),
//! `rng` ([`RngConfig`]), `vsock` ([`VsockConfig`]) and `platform.num_pci_segments`
//! ([`PlatformConfig`]), turned into the machine's [`DeviceSpec`].
//!
//! Checked at `vm.create` without opening anything: every field's value,
//! and that each disk image is a regular file (a `stat`, which never
//! blocks). The images are opened and locked at `vm.boot`, on the
//! blocking pool, where a locked image or a read-only file asked for
//! read-write is refused with the machine's message. A `net`'s tap must
//! exist at `vm.create` (a look in sysfs); it is opened at `vm.boot`. A
//! `vsock`'s socket path must not exist at `vm.create`; the VMM creates
//! the socket at `vm.boot` and removes it when the VM goes. An `fs`'s
//! socket must exist and be a socket at `vm.create` (a `stat`: virtiofsd
//! serves one connection, so nothing connects before `vm.boot`).

use serde::{Deserialize, Serialize};
use vmm_machine::devices::{
    DeviceSpec, DiskSpec, FsSpec, NetSpec, SharedFds, TapSource, VsockSpec, FS_QUEUE_SIZE,
    MAX_PCI_SEGMENTS, NET_QUEUE_SIZE,
};

use super::defaults::{self, yes};
use super::error::ApiError;

/// A bad device field: (field, what is wrong and the fix). `api`
/// turns it into its 400 answer.
pub type FieldError = (String, String);

fn bad(field: &str, msg: impl Into<String>) -> FieldError {
    (field.to_string(), msg.into())
}

/// An [`ApiError`] naming a field as a [`FieldError`] (without the
/// field's name twice).
fn field_error(e: ApiError) -> FieldError {
    let field = e.field.unwrap_or_default();
    let msg = e
        .error
        .strip_prefix(&format!("{field}: "))
        .map(str::to_string)
        .unwrap_or(e.error);
    (field, msg)
}

/// CH's `DiskConfig`: every field of CH's API 0.3.0, those this VMM does
/// not implement only at their defaults.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Entries per queue: a power of two from 4 to 1024 (CH's default is
    /// 128; this VMM's, when absent, 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_size: Option<u16>,
    /// The PCI segment.
    #[serde(default)]
    pub pci_segment: u16,
    /// CH's device id (accepted, unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// O_DIRECT: false only.
    #[serde(default)]
    pub direct: bool,
    /// CH's IOMMU flag: false only.
    #[serde(default)]
    pub iommu: bool,
    /// vhost-user: false only.
    #[serde(default)]
    pub vhost_user: bool,
    /// vhost-user socket: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_socket: Option<String>,
    /// Rate limiter: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter_config: Option<serde_json::Value>,
    /// The serial the guest reads: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Rate-limit group: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_group: Option<String>,
    /// Queue affinity: absent or empty only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_affinity: Option<Vec<serde_json::Value>>,
    /// Backing files (qcow2): false only.
    #[serde(default)]
    pub backing_files: bool,
    /// Punch holes on discard: true (CH's default, what this VMM does).
    #[serde(default = "yes")]
    pub sparse: bool,
    /// `Raw` only (or absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_type: Option<String>,
    /// A fixed PCI device number: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_device_id: Option<u8>,
}

/// CH's `NetConfig`: every field of CH's API 0.3.0, those this VMM does
/// not implement only at their defaults.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// An existing tap's name (or `fds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<String>,
    /// The host side's address, which CH gives a tap it creates; this VMM
    /// creates none, so it is accepted unused (as CH ignores it for a
    /// given tap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Its netmask, the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
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
    /// CH's device id (`vm.add-net` names one `_netN` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tap's MAC: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_mac: Option<String>,
    /// The tap's MTU: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// CH's IOMMU flag: false only.
    #[serde(default)]
    pub iommu: bool,
    /// vhost-user: false only.
    #[serde(default)]
    pub vhost_user: bool,
    /// vhost-user socket: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_socket: Option<String>,
    /// vhost-user mode (`Client`, CH's default, or `Server`): unused
    /// without vhost_user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_mode: Option<String>,
    /// A fixed PCI device number: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_device_id: Option<u8>,
    /// Rate limiter: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter_config: Option<serde_json::Value>,
    /// TSO offload: true only (offered to the guest).
    #[serde(default = "yes")]
    pub offload_tso: bool,
    /// UFO offload: true only (CH's default; the guest is not offered UFO,
    /// which Linux guests stopped using in 4.14).
    #[serde(default = "yes")]
    pub offload_ufo: bool,
    /// Checksum offload: true only (offered to the guest).
    #[serde(default = "yes")]
    pub offload_csum: bool,
    /// The tap's descriptors. In a request body these are placeholders
    /// (as in CH, numbers in the client's process mean nothing here): the
    /// descriptors themselves travel with `vm.add-net` as `SCM_RIGHTS`
    /// ancillary data, and then this lists their numbers in the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fds: Option<Vec<i32>>,
    /// The descriptors received with `vm.add-net`, owned by the VM.
    #[serde(skip)]
    pub received: Option<SharedFds>,
}

/// CH's `FsConfig`: a virtio-fs device whose vhost-user backend
/// (virtiofsd) listens on `socket`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsConfig {
    /// The name the guest mounts.
    pub tag: String,
    /// The backend's vhost-user socket.
    pub socket: String,
    /// Request queues (CH's default 1).
    #[serde(default = "one")]
    pub num_queues: u16,
    /// Entries per queue (CH's default 1024).
    #[serde(default = "fs_queue_size")]
    pub queue_size: u16,
    /// The PCI segment.
    #[serde(default)]
    pub pci_segment: u16,
    /// CH's device id: accepted and echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

fn fs_queue_size() -> u16 {
    FS_QUEUE_SIZE
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

/// CH's `PlatformConfig`: `num_pci_segments`, the rest only at CH's
/// defaults (`PlatformConfig::check_ch`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformConfig {
    /// PCI segments (1 to 16).
    #[serde(default = "one")]
    pub num_pci_segments: u16,
    /// Segments behind the IOMMU: absent or empty only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_segments: Option<Vec<u16>>,
    /// IOMMU address width: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_address_width: Option<u8>,
    /// SMBIOS serial number: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// SMBIOS UUID: absent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// SMBIOS OEM strings: absent or empty only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oem_strings: Option<Vec<String>>,
    /// Intel TDX: false only.
    #[serde(default)]
    pub tdx: bool,
    /// AMD SEV-SNP: false only.
    #[serde(default)]
    pub sev_snp: bool,
}

impl PlatformConfig {
    /// Every field but `num_pci_segments` at CH's default.
    fn check_ch(&self) -> Result<(), ApiError> {
        use defaults::{absent, empty, off};
        empty(
            "platform.iommu_segments",
            &self.iommu_segments,
            "this VMM has no IOMMU",
        )?;
        absent(
            "platform.iommu_address_width",
            &self.iommu_address_width,
            "this VMM has no IOMMU",
        )?;
        absent(
            "platform.serial_number",
            &self.serial_number,
            "SMBIOS tables are not implemented",
        )?;
        absent(
            "platform.uuid",
            &self.uuid,
            "SMBIOS tables are not implemented",
        )?;
        empty(
            "platform.oem_strings",
            &self.oem_strings,
            "SMBIOS tables are not implemented",
        )?;
        off(
            "platform.tdx",
            self.tdx,
            "confidential guests are not implemented",
        )?;
        off(
            "platform.sev_snp",
            self.sev_snp,
            "confidential guests are not implemented",
        )
    }
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
    check_disk_defaults(&field, d).map_err(field_error)?;
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
        queue_size: d.queue_size,
        pci_segment: d.pci_segment,
        // Cloud Hypervisor's DiskConfig has no engine: the default.
        engine: Default::default(),
    })
}

/// A disk's fields this VMM takes only at CH's defaults.
fn check_disk_defaults(field: &dyn Fn(&str) -> String, d: &DiskConfig) -> Result<(), ApiError> {
    use defaults::{absent, off, only};
    off(&field("direct"), d.direct, "O_DIRECT is not implemented")?;
    off(&field("iommu"), d.iommu, "this VMM has no IOMMU")?;
    off(
        &field("vhost_user"),
        d.vhost_user,
        "vhost-user disks are not implemented",
    )?;
    absent(
        &field("vhost_socket"),
        &d.vhost_socket,
        "vhost-user disks are not implemented",
    )?;
    absent(
        &field("rate_limiter_config"),
        &d.rate_limiter_config,
        "I/O rate limiting is not implemented",
    )?;
    absent(
        &field("serial"),
        &d.serial,
        "disk serials are not implemented",
    )?;
    absent(
        &field("rate_limit_group"),
        &d.rate_limit_group,
        "I/O rate limiting is not implemented",
    )?;
    defaults::empty(
        &field("queue_affinity"),
        &d.queue_affinity,
        "queue affinity is not implemented",
    )?;
    off(
        &field("backing_files"),
        d.backing_files,
        "only raw images are read here",
    )?;
    only(
        &field("sparse"),
        &d.sparse,
        &true,
        "discards always punch holes here",
    )?;
    if d.image_type.as_deref().is_some_and(|t| t != "Raw") {
        absent(
            &field("image_type"),
            &d.image_type,
            "only raw images are read here (give Raw)",
        )?;
    }
    absent(
        &field("pci_device_id"),
        &d.pci_device_id,
        "devices take the next free slot here",
    )?;
    Ok(())
}

/// A net's fields this VMM takes only at CH's defaults.
fn check_net_defaults(field: &dyn Fn(&str) -> String, n: &NetConfig) -> Result<(), ApiError> {
    use defaults::{absent, off, only};
    for (f, v) in [("ip", &n.ip), ("mask", &n.mask)] {
        if let Some(a) = v
            .as_deref()
            .filter(|a| a.parse::<std::net::IpAddr>().is_err())
        {
            return Err(ApiError::bad(
                &field(f),
                format!("{a:?} is not an IPv4 or IPv6 address"),
            ));
        }
    }
    absent(
        &field("host_mac"),
        &n.host_mac,
        "the tap's own MAC is left as it is",
    )?;
    absent(
        &field("mtu"),
        &n.mtu,
        "the MTU is left to the tap and the guest",
    )?;
    off(&field("iommu"), n.iommu, "this VMM has no IOMMU")?;
    off(
        &field("vhost_user"),
        n.vhost_user,
        "vhost-user nets are not implemented",
    )?;
    absent(
        &field("vhost_socket"),
        &n.vhost_socket,
        "vhost-user nets are not implemented",
    )?;
    if let Some(m) = n
        .vhost_mode
        .as_deref()
        .filter(|m| !matches!(*m, "Client" | "Server"))
    {
        return Err(ApiError::bad(
            &field("vhost_mode"),
            format!("{m:?}: give Client or Server"),
        ));
    }
    absent(
        &field("pci_device_id"),
        &n.pci_device_id,
        "devices take the next free slot here",
    )?;
    absent(
        &field("rate_limiter_config"),
        &n.rate_limiter_config,
        "I/O rate limiting is not implemented",
    )?;
    for (f, v) in [
        ("offload_tso", n.offload_tso),
        ("offload_ufo", n.offload_ufo),
        ("offload_csum", n.offload_csum),
    ] {
        only(&field(f), &v, &true, "offloads cannot be turned off here")?;
    }
    Ok(())
}

/// Where net `i`'s tap comes from: the descriptors received with
/// `vm.add-net`, or `tap`.
fn tap_source(field: &dyn Fn(&str) -> String, n: &NetConfig) -> Result<TapSource, FieldError> {
    if let Some(fds) = &n.received {
        if n.tap.is_some() {
            return Err(bad(
                &field("tap"),
                "given with file descriptors: give a tap's name or pass its descriptors, not both",
            ));
        }
        return Ok(TapSource::Shared(fds.clone()));
    }
    if let Some(f) = &n.fds {
        return Err(bad(
            &field("fds"),
            format!(
                "{f:?}: descriptor numbers in a request body mean nothing in this process; pass \
                 the descriptors themselves with vm.add-net as SCM_RIGHTS ancillary data, or \
                 give tap"
            ),
        ));
    }
    let Some(tap) = n.tap.as_deref().filter(|t| !t.is_empty()) else {
        return Err(bad(
            &field("tap"),
            "missing: give an existing tap's name, or pass its descriptors with vm.add-net \
             (SCM_RIGHTS); this VMM creates no tap",
        ));
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
    Ok(TapSource::Name(tap.to_string()))
}

fn check_net(i: usize, n: &NetConfig, segments: u16) -> Result<NetSpec, FieldError> {
    let field = |f: &str| format!("net[{i}].{f}");
    check_net_defaults(&field, n).map_err(field_error)?;
    let tap = tap_source(&field, n)?;
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
        tap,
        mac,
        num_queues: n.num_queues,
        pci_segment: n.pci_segment,
    })
}

/// CH's `VsockConfig`: a virtio-vsock whose host side is the Unix socket
/// `socket` (hybrid vsock: `CONNECT <port>` on it reaches guest port
/// `<port>`; the guest's connections to host port P go to `<socket>_P`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// The guest's CID: 3 or more.
    pub cid: u64,
    /// The Unix socket the VMM creates at boot (it must not exist).
    pub socket: String,
    /// CH's IOMMU flag: false only.
    #[serde(default)]
    pub iommu: bool,
    /// The PCI segment.
    #[serde(default)]
    pub pci_segment: u16,
    /// CH's device id (accepted, unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

fn check_vsock(v: &VsockConfig, segments: u16) -> Result<VsockSpec, FieldError> {
    if v.iommu {
        return Err(bad("vsock.iommu", "this VMM has no IOMMU; give false"));
    }
    if v.cid < vmm_machine::devices::MIN_VSOCK_CID || v.cid > u64::from(u32::MAX) {
        return Err(bad(
            "vsock.cid",
            format!(
                "{}: a guest CID must be 3 or more (0-2 are reserved) and fit 32 bits",
                v.cid
            ),
        ));
    }
    if v.socket.is_empty() {
        return Err(bad("vsock.socket", "empty: give the Unix socket's path"));
    }
    if !v.socket.starts_with('/') {
        return Err(bad(
            "vsock.socket",
            format!(
                "{:?}: give an absolute path (the server's directory is not the caller's)",
                v.socket
            ),
        ));
    }
    if v.pci_segment >= segments {
        return Err(bad(
            "vsock.pci_segment",
            format!(
                "{} does not exist: platform.num_pci_segments is {segments}; raise it or pick a lower segment",
                v.pci_segment
            ),
        ));
    }
    Ok(VsockSpec {
        cid: v.cid,
        socket: v.socket.clone().into(),
        pci_segment: v.pci_segment,
    })
}

fn check_fs(i: usize, f: &FsConfig, segments: u16) -> Result<FsSpec, FieldError> {
    use std::os::unix::fs::FileTypeExt;
    let field = |x: &str| format!("fs[{i}].{x}");
    if f.pci_segment >= segments {
        return Err(bad(
            &field("pci_segment"),
            format!(
                "{} does not exist: platform.num_pci_segments is {segments}; raise it or pick a lower segment",
                f.pci_segment
            ),
        ));
    }
    let is_socket = std::fs::metadata(&f.socket).map(|m| m.file_type().is_socket());
    match is_socket {
        Ok(true) => {}
        Ok(false) => {
            return Err(bad(
                &field("socket"),
                format!(
                    "{}: not a socket; give the vhost-user socket virtiofsd listens on",
                    f.socket
                ),
            ))
        }
        Err(e) => {
            return Err(bad(
                &field("socket"),
                format!(
                    "{}: {e}; start the backend first (virtiofsd --socket-path={} -o source=DIR)",
                    f.socket, f.socket
                ),
            ))
        }
    }
    let spec = FsSpec {
        tag: f.tag.clone(),
        socket: f.socket.clone().into(),
        num_queues: f.num_queues,
        queue_size: f.queue_size,
        pci_segment: f.pci_segment,
    };
    Ok(spec)
}

/// The devices a `VmConfig` names, in its fields.
#[derive(Clone, Copy, Debug, Default)]
pub struct Devices<'a> {
    /// `disks`.
    pub disks: Option<&'a [DiskConfig]>,
    /// `net`.
    pub net: Option<&'a [NetConfig]>,
    /// `fs`.
    pub fs: Option<&'a [FsConfig]>,
    /// `rng`.
    pub rng: Option<&'a RngConfig>,
    /// `platform`.
    pub platform: Option<&'a PlatformConfig>,
    /// `vsock`.
    pub vsock: Option<&'a VsockConfig>,
}

/// The machine's devices for `cfg`, a guest of `vcpus` vCPUs; an error
/// names the field.
pub fn device_spec(cfg: Devices<'_>, vcpus: usize) -> Result<DeviceSpec, FieldError> {
    if let Some(p) = cfg.platform {
        p.check_ch().map_err(field_error)?;
    }
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
    let vsock = cfg.vsock.map(|v| check_vsock(v, segments)).transpose()?;
    let spec = DeviceSpec {
        pci_segments: segments,
        rng,
        disks,
        nets,
        console: None,
        vsock,
        fs: cfg
            .fs
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, f)| check_fs(i, f, segments))
            .collect::<Result<Vec<_>, _>>()?,
    };
    spec.check(vcpus).map_err(|e| {
        let field = if e.starts_with("vsock") {
            "vsock.socket"
        } else if e.starts_with("net ") || e.starts_with("the net") {
            "net"
        } else if e.starts_with("fs ") || e.starts_with("the fs") {
            "fs"
        } else {
            "disks"
        };
        bad(field, e)
    })?;
    Ok(spec)
}
