//! The ids of a VM's devices, as Cloud Hypervisor gives them (`_diskN`,
//! `_netN`, `_fsN`, `_vsockN`), and where each one sits on the running
//! guest's PCI buses.
//!
//! WHAT: `ensure_ids` gives every device without an id one, `map_ids`
//! ties each id to the PCI function a boot built for it, `pci_report` is
//! `vm.info`'s `x_vmm.pci_devices`.
//! WHY: the controller (at boot, in `vm.info`) and the hotplug requests
//! both need them; here they import neither.
//! HOW: plain functions over the config and the machine's function list.

use std::collections::BTreeMap;

use vmm_machine::devices::PciFunction;

use super::api::VmConfig;
use super::vms::VmRecord;

/// Every device id of `cfg` (disks, nets, fs, vsock).
pub(crate) fn ids(cfg: &VmConfig) -> Vec<String> {
    let disks = cfg.disks.iter().flatten().filter_map(|d| d.id.clone());
    let nets = cfg.net.iter().flatten().filter_map(|n| n.id.clone());
    let fs = cfg.fs.iter().flatten().filter_map(|f| f.id.clone());
    let vsock = cfg.vsock.iter().filter_map(|v| v.id.clone());
    disks.chain(nets).chain(fs).chain(vsock).collect()
}

/// How many disks, nets, fs and vsocks `cfg` has (with an id or not).
pub(crate) fn device_count(cfg: &VmConfig) -> usize {
    cfg.disks.as_ref().map_or(0, Vec::len)
        + cfg.net.as_ref().map_or(0, Vec::len)
        + cfg.fs.as_ref().map_or(0, Vec::len)
        + usize::from(cfg.vsock.is_some())
}

/// The lowest `{prefix}N` that no device of `cfg` has.
pub(crate) fn fresh_id(cfg: &VmConfig, prefix: &str) -> String {
    let taken = ids(cfg);
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .find(|c| !taken.contains(c))
        .unwrap_or_default()
}

/// Gives every disk, net, fs and vsock without an id one (`_diskN`,
/// `_netN`, `_fsN`, `_vsockN`), as CH does when it builds the devices.
pub(crate) fn ensure_ids(cfg: &mut VmConfig) {
    for i in 0..cfg.disks.as_ref().map_or(0, Vec::len) {
        if cfg.disks.as_ref().is_some_and(|d| d[i].id.is_none()) {
            let id = fresh_id(cfg, "_disk");
            if let Some(d) = cfg.disks.as_mut() {
                d[i].id = Some(id);
            }
        }
    }
    for i in 0..cfg.net.as_ref().map_or(0, Vec::len) {
        if cfg.net.as_ref().is_some_and(|n| n[i].id.is_none()) {
            let id = fresh_id(cfg, "_net");
            if let Some(n) = cfg.net.as_mut() {
                n[i].id = Some(id);
            }
        }
    }
    for i in 0..cfg.fs.as_ref().map_or(0, Vec::len) {
        if cfg.fs.as_ref().is_some_and(|f| f[i].id.is_none()) {
            let id = fresh_id(cfg, "_fs");
            if let Some(f) = cfg.fs.as_mut() {
                f[i].id = Some(id);
            }
        }
    }
    if cfg.vsock.as_ref().is_some_and(|v| v.id.is_none()) {
        let id = fresh_id(cfg, "_vsock");
        if let Some(v) = cfg.vsock.as_mut() {
            v.id = Some(id);
        }
    }
}

/// At boot: each device's id to the PCI function the boot built for it
/// (`virtio-blkI` is `disks[I]`, `virtio-netI` is `net[I]`, `virtio-fsI`
/// is `fs[I]`, `virtio-vsock` the vsock).
pub(crate) fn map_ids(cfg: &VmConfig, functions: &[PciFunction]) -> BTreeMap<String, (u16, usize)> {
    let at = |name: String| {
        functions
            .iter()
            .find(|f| f.name == name)
            .map(|f| (f.segment, f.slot))
    };
    let disks = cfg
        .disks
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, d)| Some((d.id.clone()?, at(format!("virtio-blk{i}"))?)));
    let nets = cfg
        .net
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, n)| Some((n.id.clone()?, at(format!("virtio-net{i}"))?)));
    disks.chain(nets).collect()
}

/// `vm.info`'s `x_vmm.pci_devices`: every function on the guest's buses
/// now, with its id where it has one.
pub(crate) fn pci_report(v: &VmRecord) -> serde_json::Value {
    let Some(devs) = &v.devices else {
        return serde_json::json!([]);
    };
    devs.pci_functions()
        .iter()
        .map(|f| {
            let id = v
                .pci_ids
                .iter()
                .find(|(_, a)| **a == (f.segment, f.slot))
                .map(|(id, _)| id.clone());
            serde_json::json!({ "bdf": f.bdf(), "device": f.name, "id": id })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(body: &str) -> VmConfig {
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn ids_are_given_as_ch_names_them_and_never_twice() {
        let mut c = cfg(r#"{"payload": {"kernel": "/k"},
                "disks": [{"path": "/a"}, {"path": "/b", "id": "_disk0"}, {"path": "/c"}],
                "net": [{"tap": "t0"}, {"tap": "t1", "id": "eth"}]}"#);
        ensure_ids(&mut c);
        let disks: Vec<_> = c
            .disks
            .iter()
            .flatten()
            .map(|d| d.id.clone().unwrap())
            .collect();
        assert_eq!(disks, ["_disk1", "_disk0", "_disk2"]);
        let nets: Vec<_> = c
            .net
            .iter()
            .flatten()
            .map(|n| n.id.clone().unwrap())
            .collect();
        assert_eq!(nets, ["_net0", "eth"]);
        assert_eq!(fresh_id(&c, "_disk"), "_disk3");
        assert_eq!(fresh_id(&c, "_net"), "_net1");
    }

    #[test]
    fn boot_functions_map_to_ids_by_position() {
        let mut c = cfg(r#"{"payload": {"kernel": "/k"},
                "disks": [{"path": "/a"}, {"path": "/b", "id": "root"}],
                "net": [{"tap": "t0"}]}"#);
        ensure_ids(&mut c);
        let f = |segment, slot, name: &str| PciFunction {
            segment,
            slot,
            name: name.into(),
        };
        let m = map_ids(
            &c,
            &[
                f(0, 1, "virtio-rng"),
                f(0, 2, "virtio-blk0"),
                f(1, 1, "virtio-blk1"),
                f(0, 3, "virtio-net0"),
            ],
        );
        assert_eq!(m.get("_disk0"), Some(&(0, 2)));
        assert_eq!(m.get("root"), Some(&(1, 1)));
        assert_eq!(m.get("_net0"), Some(&(0, 3)));
        assert_eq!(m.len(), 3);
    }
}
