//! Devices added to and removed from a VM: `vm.add-disk`, `vm.add-net`,
//! `vm.add-fs`, `vm.add-vsock` and `vm.remove-device`, on a VM not booted (its config changes; the
//! next boot builds it) and on a running one (ACPI PCI hotplug, see
//! `vmm_machine::devices::pci_hotplug`).
//!
//! WHAT: each device of a booted VM has a Cloud Hypervisor id (the one
//! its config gave, else `_diskN`/`_netN`/`_fsN`/`_vsockN`, written into
//! the config at boot as CH does) and a PCI address; [`crate::vms::VmRecord`]'s `pci_ids` maps one
//! to the other. An add opens the device's host side (the image, locked;
//! the tap) on the blocking pool, puts the device in a free slot and
//! tells the guest, then answers CH's `PciDeviceInfo` (`{id, bdf}`); a
//! removal asks the guest to give the device back and answers at once
//! (as CH does): the device leaves the bus when the guest ejects it,
//! which `vm.info`'s `x_vmm.pci_devices` shows.
//! WHY: Kata hot-adds the disks of block-backed containers (and its
//! network endpoints) to a running sandbox and removes them by the id
//! `vm.add-disk` returned.
//! HOW: the record is marked busy while the blocking part runs, so a
//! boot, a shutdown or another add cannot interleave; its config and map
//! change only when the device is in.

use std::sync::Arc;

use vmm_machine::devices::{bdf, Devices, PciFunction};

use super::api::{ApiError, VmConfig};
use super::controller::{busy, not_created, Answer, Controller, Outcome};
use super::device_ids::{device_count, ensure_ids, fresh_id, ids};
use super::devices::{DiskConfig, FsConfig, NetConfig, VsockConfig};
use super::fds::{Received, MAX_FDS};
use super::vms::VmState;

/// Which kind of device an add is.
enum NewDevice {
    Disk(Box<DiskConfig>),
    Net(Box<NetConfig>),
    Fs(Box<FsConfig>),
    Vsock(Box<VsockConfig>),
}

impl NewDevice {
    fn kind(&self) -> &'static str {
        match self {
            NewDevice::Disk(_) => "disk",
            NewDevice::Net(_) => "net",
            NewDevice::Fs(_) => "fs",
            NewDevice::Vsock(_) => "vsock",
        }
    }
}

impl Controller {
    /// `vm.add-net` (the descriptors that came with it, if any, as
    /// `SCM_RIGHTS`): see [`add`](Self::add).
    pub(crate) async fn add_net(&self, id: &str, net: NetConfig, fds: Received) -> Outcome {
        let net = net_with_fds(net, fds)?;
        self.add(id, NewDevice::Net(Box::new(net))).await
    }

    /// `vm.add-disk`: see [`add`](Self::add).
    pub(crate) async fn add_disk(&self, id: &str, disk: DiskConfig) -> Outcome {
        self.add(id, NewDevice::Disk(Box::new(disk))).await
    }

    /// `vm.add-fs`: see [`add`](Self::add). Its virtiofsd must be
    /// listening, and guest RAM shared (`memory.shared`, or an fs at
    /// `vm.create`).
    pub(crate) async fn add_fs(&self, id: &str, fs: FsConfig) -> Outcome {
        self.add(id, NewDevice::Fs(Box::new(fs))).await
    }

    /// `vm.add-vsock`: see [`add`](Self::add). A VM has one vsock at most.
    pub(crate) async fn add_vsock(&self, id: &str, vsock: VsockConfig) -> Outcome {
        self.add(id, NewDevice::Vsock(Box::new(vsock))).await
    }

    /// Adds a device. Not booted: it joins the config (a net answers
    /// the address it gets at boot, as `vm.add-net` always has; the
    /// others 204, as CH). Booted: PCI hotplug, answering `{id, bdf}`.
    async fn add(&self, id: &str, dev: NewDevice) -> Outcome {
        let (mut cfg, devices) = {
            let mut t = self.table();
            let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
            if v.busy {
                return Err(busy(id));
            }
            let (st, _) = v.observed_state();
            let booted = matches!(st, VmState::Running | VmState::Paused);
            if booted && v.devices.is_none() {
                return Err(ApiError::status(
                    405,
                    format!(
                        "VM {id} is a micro-guest, which has no PCI bus; devices go to Linux \
                         guests"
                    ),
                ));
            }
            if st == VmState::Shutdown && v.run.is_some() {
                return Err(ApiError::status(
                    405,
                    format!("VM {id}'s guest has ended; vm.shutdown it first"),
                ));
            }
            if booted {
                v.busy = true;
            }
            let mut cfg = v.config.clone();
            ensure_ids(&mut cfg);
            (cfg, booted.then(|| v.devices.clone()).flatten())
        };
        let booted = devices.is_some();
        let result = self.add_to(id, &mut cfg, dev, devices).await;
        let mut t = self.table();
        let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if booted {
            v.busy = false;
        }
        let (dev_id, at) = result?;
        if !booted && device_count(&v.config) + 1 != device_count(&cfg) {
            // Another add or removal changed the config meanwhile.
            return Err(busy(id));
        }
        v.config = cfg;
        match at {
            Some(f) => {
                v.pci_ids.insert(dev_id.clone(), (f.segment, f.slot));
                tracing::info!(vm = id, device = dev_id, bdf = f.bdf(), "device hot-added");
                Ok(Answer::Json(
                    serde_json::json!({ "id": dev_id, "bdf": f.bdf() }),
                ))
            }
            None => {
                tracing::info!(vm = id, device = dev_id, "device added to the config");
                let is_net = v
                    .config
                    .net
                    .iter()
                    .flatten()
                    .any(|n| n.id.as_deref() == Some(&dev_id));
                if !is_net {
                    return Ok(Answer::Done);
                }
                // The address the net gets at boot (the config was checked).
                let spec = v.config.device_spec()?;
                let index = v.config.net.as_ref().map_or(0, Vec::len) - 1;
                let (seg, slot) = spec
                    .net_address(index)
                    .ok_or_else(|| ApiError::status(500, "the new net has no PCI address"))?;
                Ok(Answer::Json(
                    serde_json::json!({ "id": dev_id, "bdf": bdf(seg, slot) }),
                ))
            }
        }
    }

    /// The part of an add that may block: the config with the device is
    /// checked (files are `stat`ed), and on a booted VM the device's host
    /// side is opened and the device plugged in. Returns the device's id
    /// and, booted, where it went.
    async fn add_to(
        &self,
        vm: &str,
        cfg: &mut VmConfig,
        dev: NewDevice,
        devices: Option<Arc<Devices>>,
    ) -> Result<(String, Option<PciFunction>), ApiError> {
        let kind = dev.kind();
        // The new device alone is checked (with the VM's segments and
        // vCPUs): the others were checked at vm.create, and some of their
        // create-time rules (a vsock socket that must not exist yet) no
        // longer hold once the VM has booted.
        let mut alone = cfg.clone();
        (alone.vsock, alone.fs, alone.rng, alone.disks, alone.net) = (None, None, None, None, None);
        let dev_id = match dev {
            NewDevice::Disk(mut d) => {
                let id = d.id.clone().unwrap_or_else(|| fresh_id(cfg, "_disk"));
                d.id = Some(id.clone());
                alone.disks = Some(vec![(*d).clone()]);
                cfg.disks.get_or_insert_with(Vec::new).push(*d);
                id
            }
            NewDevice::Net(mut n) => {
                let id = n.id.clone().unwrap_or_else(|| fresh_id(cfg, "_net"));
                n.id = Some(id.clone());
                alone.net = Some(vec![(*n).clone()]);
                cfg.net.get_or_insert_with(Vec::new).push(*n);
                id
            }
            NewDevice::Fs(mut f) => {
                let id = f.id.clone().unwrap_or_else(|| fresh_id(cfg, "_fs"));
                f.id = Some(id.clone());
                alone.fs = Some(vec![(*f).clone()]);
                cfg.fs.get_or_insert_with(Vec::new).push(*f);
                id
            }
            NewDevice::Vsock(mut v) => {
                if cfg.vsock.is_some() {
                    return Err(ApiError::bad(
                        "cid",
                        "the VM has a vsock already (one per VM, as in CH); vm.remove-device it first",
                    ));
                }
                let id = v.id.clone().unwrap_or_else(|| fresh_id(cfg, "_vsock"));
                v.id = Some(id.clone());
                alone.vsock = Some((*v).clone());
                cfg.vsock = Some(*v);
                id
            }
        };
        if ids(cfg).iter().filter(|i| **i == dev_id).count() > 1 {
            return Err(ApiError::bad(
                "id",
                format!("{dev_id:?}: the VM has a device of that id; give another"),
            ));
        }
        let vcpus = cfg.max_vcpus() as usize;
        let name = match kind {
            "disk" => format!("virtio-blk:{dev_id}"),
            "net" => format!("virtio-net:{dev_id}"),
            other => format!("virtio-{other}:{dev_id}"),
        };
        let plug = tokio::task::spawn_blocking(move || -> Result<Option<PciFunction>, ApiError> {
            let spec = alone.device_spec()?;
            let Some(devices) = devices else {
                return Ok(None);
            };
            let hot = |e: vmm_machine::devices::DeviceError| ApiError::status(500, e.to_string());
            let f = if let Some(d) = spec.disks.first() {
                let disk = vmm_devices::virtio::block::Disk::open(&d.path, d.readonly)
                    .map_err(|e| ApiError::bad("path", e.to_string()))?;
                devices.hot_add_disk(&name, d, disk, vcpus).map_err(hot)?
            } else if let Some(n) = spec.nets.first() {
                let taps = n.open().map_err(|e| ApiError::bad("tap", e.to_string()))?;
                devices.hot_add_net(&name, n, taps).map_err(hot)?
            } else if let Some(f) = spec.fs.first() {
                devices.hot_add_fs(&name, f).map_err(|e| match e {
                    vmm_machine::devices::DeviceError::Backend(m) => ApiError::bad("socket", m),
                    vmm_machine::devices::DeviceError::Hotplug(m) => ApiError::status(409, m),
                    other => hot(other),
                })?
            } else if let Some(v) = &spec.vsock {
                devices
                    .hot_add_vsock(&name, v)
                    .map_err(|e| ApiError::bad("socket", e.to_string()))?
            } else {
                return Err(ApiError::status(500, "no device to add"));
            };
            Ok(Some(f))
        })
        .await
        .map_err(|e| ApiError::status(500, format!("{vm}: device task failed: {e}")))?
        .map_err(|e| index_free(e, kind))?;
        Ok((dev_id, plug))
    }

    /// `vm.remove-device`: a disk, net, fs or vsock, by id. Booted: the guest is
    /// asked to give it back (it leaves when the guest ejects it, see
    /// `x_vmm.pci_devices`); not booted, or booted: it leaves the config.
    pub(crate) async fn remove_device(&self, id: &str, dev_id: &str) -> Outcome {
        let mut t = self.table();
        let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if v.busy {
            return Err(busy(id));
        }
        let (st, _) = v.observed_state();
        let booted = matches!(st, VmState::Running | VmState::Paused);
        ensure_ids(&mut v.config);
        let same = |d: &Option<String>| d.as_deref() == Some(dev_id);
        let in_disks = v.config.disks.iter().flatten().position(|d| same(&d.id));
        let in_nets = v.config.net.iter().flatten().position(|n| same(&n.id));
        let in_fs = v.config.fs.iter().flatten().position(|f| same(&f.id));
        let is_vsock = v.config.vsock.as_ref().is_some_and(|x| same(&x.id));
        if in_disks.is_none() && in_nets.is_none() && in_fs.is_none() && !is_vsock {
            let known = ids(&v.config);
            let other = known.iter().any(|k| k == dev_id);
            return Err(if other {
                ApiError::bad(
                    "id",
                    format!(
                        "{dev_id:?} is not a disk, net, fs or vsock; only those can be removed"
                    ),
                )
            } else {
                ApiError::status(
                    404,
                    format!("VM {id} has no device {dev_id:?}; its devices: {known:?}"),
                )
            });
        }
        if booted {
            let (devices, at) = (v.devices.clone(), v.pci_ids.get(dev_id).copied());
            match (devices, at) {
                (Some(d), Some((seg, slot))) => d
                    .request_removal(seg, slot)
                    .map_err(|e| ApiError::status(500, format!("VM {id}: {e}")))?,
                _ => {
                    return Err(ApiError::status(
                        500,
                        format!("VM {id}: device {dev_id:?} has no PCI address"),
                    ))
                }
            }
            v.pci_ids.remove(dev_id);
        }
        if let (Some(i), Some(d)) = (in_disks, v.config.disks.as_mut()) {
            d.remove(i);
        }
        if let (Some(i), Some(n)) = (in_nets, v.config.net.as_mut()) {
            n.remove(i);
        }
        if let (Some(i), Some(f)) = (in_fs, v.config.fs.as_mut()) {
            f.remove(i);
        }
        if is_vsock {
            v.config.vsock = None;
        }
        tracing::info!(vm = id, device = dev_id, booted, "device removed");
        Ok(Answer::Done)
    }
}

/// A field error of the new entry, named as the request's own field
/// (`path`, not `disks[2].path`).
fn index_free(mut e: ApiError, kind: &str) -> ApiError {
    let prefix = match kind {
        "disk" => "disks[0].",
        "net" => "net[0].",
        "fs" => "fs[0].",
        _ => "vsock.",
    };
    if let Some(f) = e.field.as_mut() {
        if let Some(rest) = f.strip_prefix(prefix) {
            *f = rest.to_string();
        }
    }
    e.error = e.error.replace(prefix, "");
    e
}
/// `net` with the descriptors that came with its request: each must be
/// an open tap with the vnet header, one per queue pair (CH's rule:
/// `num_queues` = 2 x the descriptors); the body's `fds` become their
/// numbers here. Any error drops (closes) every descriptor.
fn net_with_fds(mut net: NetConfig, fds: Received) -> Result<NetConfig, ApiError> {
    use std::os::fd::{AsFd, AsRawFd};
    if fds.too_many {
        return Err(ApiError::bad(
            "fds",
            format!(
                "more than {MAX_FDS} file descriptors came with the request; send one per queue \
                 pair, at most {MAX_FDS} (all were closed)"
            ),
        ));
    }
    if fds.fds.is_empty() {
        return Ok(net);
    }
    for (k, fd) in fds.fds.iter().enumerate() {
        vmm_devices::tap::Tap::check_fd(fd.as_fd()).map_err(|e| {
            ApiError::bad(
                &format!("fds[{k}]"),
                format!("the descriptor sent as number {k}: {e}"),
            )
        })?;
    }
    let n = fds.fds.len();
    let q = net.num_queues.unwrap_or(2);
    if usize::from(q) != 2 * n {
        return Err(ApiError::bad(
            "num_queues",
            format!(
                "{q} with {n} file descriptor(s): one queue pair per descriptor, so give \
                 num_queues = {} (or send {} descriptors)",
                2 * n,
                q / 2
            ),
        ));
    }
    net.fds = Some(fds.fds.iter().map(|f| f.as_raw_fd()).collect());
    net.received = Some(vmm_machine::devices::SharedFds(Arc::new(fds.fds)));
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_entrys_field_errors_name_the_requests_field() {
        let e = index_free(
            ApiError::bad("disks[0].path", "disks[0].path: /x: no such file"),
            "disk",
        );
        assert_eq!(e.field.as_deref(), Some("path"));
        assert!(!e.error.contains("disks[0]"), "{}", e.error);
    }
}
