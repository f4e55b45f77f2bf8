//! virtio-blk on micro-guests: the `blk` workload's VMs (IOPS, through
//! [`super::run`]) and the integrity writer ([`integrity`]).
//!
//! WHAT: each VM has one vCPU and one virtio-blk device over a raw image
//! (`vmm_machine::micro::devices`), driven by a program of
//! `vmm_machine::micro::blk`.
//! WHY: the device model at full rate, without Linux: IOPS per executor,
//! and data that must survive the VMM being killed.
//! HOW: `blk` builds its VMs here and runs them like every workload;
//! [`integrity`] runs its own set until every VM has written its
//! generations or the time is up, reports each completed flush as it
//! happens, and verifies every image after the stop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vcpu_sched::exec::{CheckConfig, CpuMapping};
use vcpu_sched::Mitigations;

use vmm_machine::devices::BlockEngine;
use vmm_machine::micro::blk::{self, Integrity, Iops, Verified, MAX_BLOCKS};
use vmm_machine::micro::devices::MicroDevice;
use vmm_machine::micro::driver::{FLUSHED, MAX_QD};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};

use super::place::VmPlace;
use super::BenchError;

/// The `blk` workload's images and requests.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlkOptions {
    /// Raw images; VM `v` uses image `v mod len`. Read-only (a shared
    /// lock: VMs may share one) unless `write`.
    pub disks: Vec<PathBuf>,
    /// Requests in flight per VM (1..=64).
    pub qd: u16,
    /// Random writes instead of reads: each VM needs an image of its
    /// own, whose contents are overwritten.
    pub write: bool,
    /// The devices' request engine.
    #[serde(with = "engine_name", default)]
    pub engine: BlockEngine,
}

/// A [`BlockEngine`] as its name in JSON.
mod engine_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use vmm_machine::devices::BlockEngine;

    pub fn serialize<S: Serializer>(e: &BlockEngine, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(e)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BlockEngine, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl Default for BlkOptions {
    fn default() -> Self {
        Self {
            disks: Vec::new(),
            qd: 1,
            write: false,
            engine: BlockEngine::default(),
        }
    }
}

fn input(s: String) -> BenchError {
    BenchError::Input(s)
}

/// Whole 4 KiB blocks of the image at `path` the programs use (at most
/// the pattern's limit).
fn blocks_of(path: &Path) -> Result<u64, BenchError> {
    let len = std::fs::metadata(path)
        .map_err(|e| {
            let what = match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_string(),
                _ => e.to_string(),
            };
            input(format!(
                "disk image {}: {what} (give the path of an existing raw image)",
                path.display()
            ))
        })?
        .len();
    let blocks = (len / 4096).min(MAX_BLOCKS);
    if blocks == 0 {
        return Err(input(format!(
            "disk image {}: {len} bytes, less than one 4 KiB block; give a bigger image",
            path.display()
        )));
    }
    Ok(blocks)
}

fn check_qd(qd: u16) -> Result<(), BenchError> {
    if qd == 0 || qd > MAX_QD {
        return Err(input(format!(
            "--qd {qd}: a micro-guest keeps 1 to {MAX_QD} requests in flight"
        )));
    }
    Ok(())
}

/// Checks `blk`'s shape: images given, one vCPU per VM, an image of its
/// own per VM for writes.
pub(crate) fn validate(o: &BlkOptions, vms: usize, vcpus: usize) -> Result<(), BenchError> {
    if o.disks.is_empty() {
        return Err(input(
            "blk needs a raw image: give --disk IMG (a file of at least 4 KiB)".into(),
        ));
    }
    if vcpus != 1 {
        return Err(input(format!(
            "blk drives its device from one vCPU per VM: give --vcpus 1 (not {vcpus}), and \
             more --vms for more load"
        )));
    }
    check_qd(o.qd)?;
    if o.write && o.disks.len() < vms {
        return Err(input(format!(
            "blk --write locks each image for one VM: give one --disk per VM ({vms} VMs, {} \
             images), or leave --write out to read a shared image",
            o.disks.len()
        )));
    }
    Ok(())
}

/// The spec of `blk` VM `v`.
pub(crate) fn iops_spec(o: &BlkOptions, v: usize) -> Result<MicroVmSpec, BenchError> {
    let disk = &o.disks[v % o.disks.len()];
    let p = Iops {
        blocks: blocks_of(disk)?,
        qd: o.qd,
        write: o.write,
        seed: 0x9e37_79b9 * (v as u64 + 1),
    };
    let mut spec = MicroVmSpec::new(format!("vm{v}"), 1, p.program()?);
    spec.devices = vec![MicroDevice::Block {
        path: disk.clone(),
        readonly: !o.write,
        engine: o.engine,
    }];
    Ok(spec)
}

/// What [`integrity`] runs.
#[derive(Clone, Debug)]
pub struct IntegrityOptions {
    /// One VM per image; the images are overwritten.
    pub disks: Vec<PathBuf>,
    /// Topology SPEC for the executor (`host` or emulated).
    pub topology: String,
    /// The executor.
    pub executor: ExecutorKind,
    /// The fixes (scheduler executors).
    pub mitigations: Mitigations,
    /// Requests in flight per VM.
    pub qd: u16,
    /// Writes per generation (a flush after each generation).
    pub per_gen: u32,
    /// Generations per VM, then a read-back in the guest; 0: until
    /// `duration` has passed.
    pub gens: u64,
    /// The longest the run lasts; VMs still writing then are stopped.
    pub duration: Duration,
    /// The invariant checker on.
    pub check: bool,
    /// The devices' request engine.
    pub engine: BlockEngine,
}

/// One VM of an [`integrity`] run.
#[derive(Clone, Debug)]
pub struct IntegrityVm {
    /// Its name (`vm<i>`).
    pub name: String,
    /// Its image.
    pub disk: PathBuf,
    /// What it wrote.
    pub writer: Integrity,
    /// Generations whose flush completed.
    pub flushed: u64,
    /// Its failure (a guest `DONE n`, a device error), if any.
    pub failure: Option<String>,
    /// The host's verification of the image.
    pub verified: Result<Verified, String>,
}

/// Called with (VM index, VM name, generation) for each completed flush.
pub type OnFlush = Arc<dyn Fn(usize, &str, u64) + Send + Sync>;

/// Runs the integrity writer, one VM per image (see the module docs).
/// `on_flush(vm, name, generation)` is called on the vCPU's thread as
/// soon as the guest has seen a generation's flush complete.
pub fn integrity(
    opts: &IntegrityOptions,
    on_flush: OnFlush,
) -> Result<Vec<IntegrityVm>, BenchError> {
    if opts.disks.is_empty() {
        return Err(input(
            "--integrity needs images to write: give --disk IMG, one per VM".into(),
        ));
    }
    check_qd(opts.qd)?;
    vmm_machine::vcpu::install_kick_signal().map_err(vmm_machine::micro::MicroError::from)?;
    let topo = Arc::new(topology::load(&opts.topology)?);
    let mapping = CpuMapping::for_spec(&opts.topology)?;
    let host = MicroHost::open()?;
    let mut vms = Vec::new();
    let mut built = Vec::new();
    for (v, disk) in opts.disks.iter().enumerate() {
        let w = Integrity {
            blocks: blocks_of(disk)?,
            per_gen: opts.per_gen,
            gens: opts.gens,
            qd: opts.qd,
            verify: opts.gens > 0,
        };
        w.validate()?;
        let name = format!("vm{v}");
        let mut spec = MicroVmSpec::new(&name, 1, w.program()?);
        spec.devices = vec![MicroDevice::Block {
            path: disk.clone(),
            readonly: false,
            engine: opts.engine,
        }];
        let vm = MicroVm::build(&host, &spec)?;
        let hook = on_flush.clone();
        let n = name.clone();
        vm.io.set_report_hook(move |_, g| hook(v, &n, u64::from(g)));
        built.push((name, disk.clone(), w, vm.memory.clone()));
        vms.push(vm.into_guest(vec![Placement::default()]));
    }
    let set = VmSet::new(vms)?;
    let mut eo = ExecOptions::new(topo, mapping);
    eo.kind = opts.executor;
    eo.mitigations = opts.mitigations;
    eo.check = opts.check.then(CheckConfig::default);
    let running = Running::start(&eo, set.clone())?;
    wait_for(&set, opts.duration);
    let out = running.stop(Duration::from_secs(30))?;
    if !out.violations.is_empty() {
        return Err(BenchError::Failed(format!(
            "the executor's invariant checker: {}",
            out.violations.join(" | ")
        )));
    }
    Ok(built
        .into_iter()
        .zip(set.vms())
        .map(|((name, disk, writer, mem), vm)| {
            let flushed =
                vmm_machine::micro::read_u64(&mem, vmm_machine::micro::DATA_ADDR + FLUSHED)
                    .unwrap_or(0);
            let verified = blk::verify_file(&disk, &writer, flushed);
            IntegrityVm {
                name,
                disk,
                writer,
                flushed,
                failure: vm.failure().map(|r| r.to_string()),
                verified,
            }
        })
        .collect())
}

/// Until every VM has ended or `limit` has passed.
fn wait_for(set: &VmSet, limit: Duration) {
    let t0 = Instant::now();
    let n = set.vms().len();
    while set.finished_vms() < n && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(5).min(limit.saturating_sub(t0.elapsed())));
    }
}

/// The `blk` workload's VMs, VM `v` at `places[v]`.
pub(crate) fn iops_vms(
    o: &BlkOptions,
    places: &[VmPlace],
    host: &MicroHost,
) -> Result<(Vec<GuestVm>, Vec<vm_memory::GuestMemoryMmap>), BenchError> {
    let mut guests = Vec::with_capacity(places.len());
    let mut memories = Vec::with_capacity(places.len());
    for (v, p) in places.iter().enumerate() {
        let mut spec = iops_spec(o, v)?;
        spec.io_cpus = p.io_cpus.clone();
        let vm = MicroVm::build(host, &spec)?;
        memories.push(vm.memory.clone());
        guests.push(vm.into_guest(vec![p.vcpu.clone()]));
    }
    Ok((guests, memories))
}
