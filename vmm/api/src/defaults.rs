//! Cloud Hypervisor's fields that this VMM takes only at their default.
//!
//! WHAT: checks that a field of CH's VmConfig is absent or at CH's
//! default ([`only`], [`absent`], [`empty`], [`off`]), each failing with a
//! 400 that names the field, the value given and why it cannot be
//! honoured; and [`Unsupported`], the top-level VmConfig fields of devices
//! and features this VMM does not implement (`pmem`, `devices`, ...).
//! WHY: CH's generated clients (Kata's Go client among them) send every
//! field their constructors default, so a config full of `false`s and
//! empty lists must be accepted; a value that asks for something this VMM
//! does not do must be refused, never ignored.
//! HOW: plain functions over serde values; the defaults are those of CH's
//! OpenAPI document (`vmm/src/api/openapi/cloud-hypervisor.yaml`, API
//! 0.3.0), which Kata's generated client (`NewVmConfig`, `NewCpusConfig`,
//! `NewMemoryConfig`, ...) fills in.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ApiError;

/// At most this much of a refused value is quoted in an error.
const QUOTE: usize = 160;

/// `v` as compact JSON, cut at `QUOTE` characters.
pub fn quote<T: Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).unwrap_or_else(|_| "?".into());
    if s.chars().count() <= QUOTE {
        return s;
    }
    let cut: String = s.chars().take(QUOTE).collect();
    format!("{cut}...")
}

/// `field` must equal `want` (CH's default, or what this VMM does).
pub fn only<T: PartialEq + Serialize>(
    field: &str,
    got: &T,
    want: &T,
    why: &str,
) -> Result<(), ApiError> {
    if got == want {
        return Ok(());
    }
    Err(ApiError::bad(
        field,
        format!(
            "{}: {why}; give {} or leave it out",
            quote(got),
            quote(want)
        ),
    ))
}

/// A boolean that this VMM honours only as `false`.
pub fn off(field: &str, got: bool, why: &str) -> Result<(), ApiError> {
    only(field, &got, &false, why)
}

/// An optional field that this VMM honours only when absent.
pub fn absent<T: Serialize>(field: &str, got: &Option<T>, why: &str) -> Result<(), ApiError> {
    match got {
        None => Ok(()),
        Some(v) => Err(ApiError::bad(
            field,
            format!("{}: {why}; leave it out", quote(v)),
        )),
    }
}

/// An optional list that this VMM honours only when absent or empty.
pub fn empty<T: Serialize>(field: &str, got: &Option<Vec<T>>, why: &str) -> Result<(), ApiError> {
    match got {
        Some(v) if !v.is_empty() => Err(ApiError::bad(
            field,
            format!("{}: {why}; leave it out", quote(v)),
        )),
        _ => Ok(()),
    }
}

/// serde's default of a field whose CH default is `true`.
pub fn yes() -> bool {
    true
}

/// VmConfig's fields of devices and features this VMM does not implement:
/// each is accepted absent (or empty, or `false`, CH's defaults) and
/// refused otherwise, naming what is missing. Flattened into
/// [`VmConfig`](super::api::VmConfig), so they keep CH's names and
/// `vm.info` echoes them. serde cannot deny unknown fields through a
/// flattened struct, so they are collected in `other` and refused by
/// [`Unsupported::check`], by name.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Unsupported {
    /// CH's rate-limit groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_groups: Option<Vec<Value>>,
    /// virtio-balloon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<Value>,
    /// vhost-user devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic_vhost_user: Option<Vec<Value>>,
    /// virtio-pmem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pmem: Option<Vec<Value>>,
    /// The debug console (port 0xe9); `{"mode": "Off"}` is its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug_console: Option<Value>,
    /// VFIO devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<Value>>,
    /// vfio-user devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_devices: Option<Vec<Value>>,
    /// vDPA devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdpa: Option<Vec<Value>>,
    /// A virtual IOMMU.
    #[serde(default)]
    pub iommu: bool,
    /// A watchdog device.
    #[serde(default)]
    pub watchdog: bool,
    /// The RTC's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtc: Option<Value>,
    /// A pvpanic device.
    #[serde(default)]
    pub pvpanic: bool,
    /// Per-segment MMIO aperture weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_segments: Option<Vec<Value>>,
    /// A TPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<Value>,
    /// Landlock sandboxing of the VMM itself.
    #[serde(default)]
    pub landlock_enable: bool,
    /// Landlock rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock_rules: Option<Vec<Value>>,
    /// Any other field: refused by name.
    #[serde(flatten, skip_serializing)]
    pub other: std::collections::BTreeMap<String, Value>,
}

/// What each unimplemented device or feature lacks, for the 400 that
/// refuses it (also the list in docs/api.md).
pub const MISSING: &[(&str, &str)] = &[
    ("rate_limit_groups", "I/O rate limiting is not implemented"),
    ("balloon", "virtio-balloon is not implemented"),
    (
        "generic_vhost_user",
        "vhost-user devices are not implemented",
    ),
    ("pmem", "virtio-pmem is not implemented"),
    (
        "debug_console",
        "the debug console port is not implemented (only mode Off)",
    ),
    ("devices", "VFIO device passthrough is not implemented"),
    ("user_devices", "vfio-user devices are not implemented"),
    ("vdpa", "vDPA devices are not implemented"),
    ("iommu", "this VMM has no virtual IOMMU"),
    ("watchdog", "this VMM has no watchdog device"),
    ("rtc", "the RTC is not configurable"),
    ("pvpanic", "this VMM has no pvpanic device"),
    (
        "pci_segments",
        "MMIO aperture weights are not implemented (platform.num_pci_segments sets the segments)",
    ),
    ("tpm", "this VMM has no TPM"),
    (
        "landlock_enable",
        "this VMM does not sandbox itself with Landlock",
    ),
    (
        "landlock_rules",
        "this VMM does not sandbox itself with Landlock",
    ),
];

fn why(field: &str) -> &'static str {
    MISSING
        .iter()
        .find(|(f, _)| *f == field)
        .map_or("not implemented", |(_, w)| w)
}

impl Unsupported {
    /// Each field absent, empty or `false` (CH's defaults); an error names
    /// the first one that is not, its value and what is missing.
    pub fn check(&self) -> Result<(), ApiError> {
        if let Some(name) = self.other.keys().next() {
            return Err(ApiError::bad(
                name,
                "unknown field: not a field of Cloud Hypervisor's VmConfig (API 0.3.0) nor \
                 x_vmm; check its spelling, or remove it",
            ));
        }
        let lists = [
            ("rate_limit_groups", &self.rate_limit_groups),
            ("generic_vhost_user", &self.generic_vhost_user),
            ("pmem", &self.pmem),
            ("devices", &self.devices),
            ("user_devices", &self.user_devices),
            ("vdpa", &self.vdpa),
            ("pci_segments", &self.pci_segments),
            ("landlock_rules", &self.landlock_rules),
        ];
        for (f, v) in lists {
            empty(f, v, why(f))?;
        }
        for (f, v) in [
            ("balloon", &self.balloon),
            ("rtc", &self.rtc),
            ("tpm", &self.tpm),
        ] {
            absent(f, v, why(f))?;
        }
        for (f, v) in [
            ("iommu", self.iommu),
            ("watchdog", self.watchdog),
            ("pvpanic", self.pvpanic),
            ("landlock_enable", self.landlock_enable),
        ] {
            off(f, v, why(f))?;
        }
        match &self.debug_console {
            None => Ok(()),
            Some(v) if *v == serde_json::json!({"mode": "Off"}) => Ok(()),
            Some(v) if *v == serde_json::json!({"mode": "Off", "iommu": false}) => Ok(()),
            Some(_) => absent("debug_console", &self.debug_console, why("debug_console")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_values_are_named() {
        let u: Unsupported = serde_json::from_str(
            r#"{"iommu":false,"watchdog":false,"pvpanic":false,"landlock_enable":false,"pmem":[],"debug_console":{"mode":"Off"}}"#,
        )
        .unwrap();
        u.check().unwrap();
        let u: Unsupported =
            serde_json::from_str(r#"{"pmem":[{"file":"/img/pmem0","size":1048576}]}"#).unwrap();
        let e = u.check().unwrap_err();
        assert_eq!(e.field.as_deref(), Some("pmem"));
        assert!(
            e.error.contains("pmem0") && e.error.contains("virtio-pmem"),
            "{e:?}"
        );
        let u: Unsupported = serde_json::from_str(r#"{"balloon":{"size":1}}"#).unwrap();
        let e = u.check().unwrap_err();
        assert!(
            e.error.contains("\"size\":1") && e.error.contains("balloon"),
            "{e:?}"
        );
        let u: Unsupported = serde_json::from_str(r#"{"iommu":true}"#).unwrap();
        assert_eq!(u.check().unwrap_err().field.as_deref(), Some("iommu"));
        let u: Unsupported = serde_json::from_str(r#"{"bogus":1}"#).unwrap();
        assert_eq!(u.check().unwrap_err().field.as_deref(), Some("bogus"));
        assert!(quote(&"x".repeat(500)).ends_with("..."));
    }
}
