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
        // The default engine: the one the VMM serves disks with.
        engine: Default::default(),
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
    for kind in [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ] {
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

/// `vmm bench blk --integrity` over `imgs` (16 writes per generation,
/// queue depth 8), killed with SIGKILL once every VM has flushed at least
/// 3 generations (and a little later, so that writes are in flight);
/// returns each VM's last generation whose flush it printed.
fn integrity_killed(kind: &str, imgs: &[PathBuf]) -> Vec<Option<u64>> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let mut args: Vec<String> = [
        "bench",
        "blk",
        "--integrity",
        "--executor",
        kind,
        "--qd",
        "8",
        "--per-gen",
        "16",
        "--duration",
        "120s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in imgs {
        args.push("--disk".into());
        args.push(i.display().to_string());
    }
    let mut child = Command::new(integration_tests::vmm_bin())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting vmm");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut last: Vec<Option<u64>> = vec![None; imgs.len()];
    let note = |l: &str, last: &mut Vec<Option<u64>>| {
        let mut w = l.split_whitespace();
        if let (Some(vm), Some("flushed"), Some("generation"), Some(g)) =
            (w.next(), w.next(), w.next(), w.next())
        {
            let v: usize = vm.trim_start_matches("vm").parse().expect("vm index");
            let g: u64 = g.parse().expect("generation");
            assert!(
                last[v].map_or(g == 0, |p| g == p + 1),
                "{kind}: vm{v}: generation {g} after {:?}",
                last[v]
            );
            last[v] = Some(g);
        }
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(40) {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            note(&l, &mut last);
        }
        if last.iter().all(|g| g.is_some_and(|g| g >= 3)) {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(30));
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL
    let status = child.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{kind}: {status:?}");
    reader.join().expect("reader");
    // Lines printed before the kill are still in the pipe.
    for l in rx.try_iter() {
        note(&l, &mut last);
    }
    last
}

#[test]
fn sigkill_mid_run_keeps_every_write_acknowledged_before_the_last_completed_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 4 * cpus();
    for kind in ["workers", "threads", "host"] {
        let imgs: Vec<PathBuf> = (0..n)
            .map(|i| image(dir.path(), &format!("kill-{kind}-{i}.img"), 40))
            .collect();
        let last = integrity_killed(kind, &imgs);
        for (i, (img, g)) in imgs.iter().zip(&last).enumerate() {
            let g = g.unwrap_or_else(|| panic!("{kind}: vm{i} printed no completed flush"));
            let w = Integrity {
                blocks: 40,
                per_gen: 16,
                gens: 0,
                qd: 8,
                verify: false,
            };
            let v =
                blk::verify_file(img, &w, g + 1).unwrap_or_else(|e| panic!("{kind}: vm{i}: {e}"));
            assert_eq!(v.flushed_blocks, 40, "{kind}: vm{i}: {v:?}");
        }
    }
}

#[test]
fn the_integrity_command_verifies_its_images_and_refuses_bad_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = image(dir.path(), "a.img", 32);
    let b = image(dir.path(), "b.img", 32);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let r = integration_tests::guest::run_vmm(
        &[
            "bench",
            "blk",
            "--integrity",
            "--gens",
            "4",
            "--per-gen",
            "8",
            "--disk",
            a,
            "--disk",
            b,
        ],
        Duration::from_secs(60),
    );
    assert_eq!(r.status, Some(0), "{}", r.context());
    for vm in ["vm0", "vm1"] {
        assert!(
            r.console.contains(&format!("{vm} flushed generation 3\n")),
            "{}",
            r.context()
        );
        assert!(
            r.console.contains(&format!("{vm}: 4 generations flushed;")),
            "{}",
            r.context()
        );
    }
    assert!(r.console.contains("verified: 32 blocks"), "{}", r.context());
    let missing = dir.path().join("none.img");
    let missing = missing.to_str().unwrap();
    for (args, needle) in [
        (vec!["bench", "blk"], "--disk IMG"),
        (
            vec!["bench", "blk", "--disk", a, "--vcpus", "2"],
            "--vcpus 1",
        ),
        (vec!["bench", "blk", "--disk", missing], "no such file"),
        (vec!["bench", "blk", "--disk", a, "--qd", "65"], "1 to 64"),
        (
            vec!["bench", "blk", "--integrity", "--disk", a, "--vms", "2"],
            "one --disk per VM",
        ),
        (
            vec!["bench", "blk", "--disk", a, "--write", "--vms", "2"],
            "one --disk per VM",
        ),
        (
            vec!["bench", "runq", "--disk", a],
            "--disk applies to the blk workload",
        ),
        (
            vec!["bench", "blk", "--disk", a, "--gens", "3"],
            "--gens applies to --integrity",
        ),
        (
            vec!["bench", "blk", "--disk", a, "--engine", "aio"],
            "sync, pool, io_uring",
        ),
        (
            vec!["bench", "blk", "--disk", a, "--compare-engines", "sync"],
            "two engines or more",
        ),
    ] {
        let r = integration_tests::guest::run_vmm(&args, Duration::from_secs(30));
        integration_tests::guest::assert_input_error(&r, &[needle]);
    }
    // A locked image: another process holds it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this test owns; no memory is passed.
    let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    let r = integration_tests::guest::run_vmm(
        &["bench", "blk", "--integrity", "--gens", "1", "--disk", a],
        Duration::from_secs(30),
    );
    integration_tests::guest::assert_input_error(&r, &["locked"]);
}

/// `vmm bench blk --compare-engines`: every engine a row, the first one
/// twice (its A/A row), on the host executor; the integrity writer on
/// each engine verifies its image.
#[test]
fn engines_compare_interleaved_and_each_keeps_the_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = image(dir.path(), "a.img", 64);
    let a = a.to_str().unwrap();
    let json = dir.path().join("c.json");
    let r = integration_tests::guest::run_vmm(
        &[
            "bench",
            "blk",
            "--disk",
            a,
            "--qd",
            "8",
            "--executor",
            "host",
            "--compare-engines",
            "sync,pool,io_uring",
            "--duration",
            "0.2",
            "--reps",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(r.status, Some(0), "{}", r.context());
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let labels: Vec<&str> = j["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| row["mitigations"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["sync", "sync (A/A)", "pool", "io_uring"]);
    for engine in ["sync", "pool", "io_uring"] {
        let r = integration_tests::guest::run_vmm(
            &[
                "bench",
                "blk",
                "--integrity",
                "--gens",
                "3",
                "--per-gen",
                "16",
                "--qd",
                "8",
                "--engine",
                engine,
                "--disk",
                a,
            ],
            Duration::from_secs(60),
        );
        assert_eq!(r.status, Some(0), "{engine}: {}", r.context());
        assert!(
            r.console.contains("vm0: 3 generations flushed;"),
            "{}",
            r.context()
        );
    }
}

#[test]
fn io_breakdown_splits_each_completion_into_the_io_paths_stages() {
    // virtio-blk at queue depth 1 on the workers and the host executor:
    // every completion wakes a halted vCPU through its MSI, so the I/O
    // stages fill (the device thread's handling, the wake, and on workers
    // the pick apart from KVM_RUN) and no completion counts as a doorbell.
    let dir = tempfile::tempdir().expect("tempdir");
    let img = image(dir.path(), "io.img", 256);
    for (executor, engine) in [
        ("workers", "sync"),
        ("workers", "io_uring"),
        ("host", "sync"),
    ] {
        let json = dir.path().join(format!("{executor}-{engine}.json"));
        let r = integration_tests::guest::run_vmm(
            &[
                "bench",
                "blk",
                "--disk",
                img.to_str().unwrap(),
                "--vms",
                "2",
                "--qd",
                "1",
                "--engine",
                engine,
                "--executor",
                executor,
                "--duration",
                "0.4",
                "--breakdown",
                "--json",
                json.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        assert_eq!(r.status, Some(0), "{executor}: {}", r.context());
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let rows = v["breakdown"].as_array().expect("breakdown rows");
        let count = |name: &str| {
            rows.iter()
                .find(|r| r["stage"].as_str() == Some(name))
                .unwrap_or_else(|| panic!("no stage {name}: {rows:?}"))["count"]
                .as_u64()
                .unwrap()
        };
        let what = format!("{executor} {engine}: {rows:?}");
        let device = count("io: device woken -> interrupt");
        let wake = count("io: interrupt -> wake returned");
        assert!(wake >= 5, "{what}");
        // each completion was raised by the device's I/O thread, so each
        // has the thread's wakeup stamp and the total
        assert_eq!(device, wake, "{what}");
        assert_eq!(count("io: device woken -> KVM_RUN"), device, "{what}");
        assert_eq!(count("io: wake -> picked"), wake, "{what}");
        assert_eq!(
            count("io: picked -> KVM_RUN") > 0,
            executor == "workers",
            "{what}"
        );
        // a completion is no doorbell; the one exception is a race at
        // the edge (the vCPU resumed between the interrupt's doorbell and
        // its stamps), rare
        assert!(
            count("doorbell: exit -> wake returned") * 50 <= wake,
            "{what}"
        );
    }
}

/// `Cpus_allowed_list` of each thread of process `pid` named in `names`,
/// once every one of them exists (or after `limit`).
fn thread_cpus(pid: u32, names: &[&str], limit: Duration) -> Vec<(String, String)> {
    let t0 = Instant::now();
    loop {
        let mut found = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|c| c.trim().to_string());
            if let (true, Some(c)) = (names.contains(&comm.trim()), cpus) {
                found.push((comm.trim().to_string(), c));
            }
        }
        if found.len() == names.len() || t0.elapsed() > limit {
            found.sort();
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `vmm bench blk --io-cpus`: with pinned vCPUs (VM v's on host CPU v),
/// `same` puts VM v's I/O thread (`vmN-blk0`) on its vCPU's CPU, `other`
/// on the next CPU, `any` on every CPU the process may use (not the
/// vCPU's, whose thread started it); bad values are input errors.
#[test]
fn io_cpus_place_the_io_thread_where_asked_and_bad_values_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = image(dir.path(), "a.img", 64);
    let a = a.to_str().unwrap();
    let all = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let n = cpus();
    let mut placements = vec!["same", "any"];
    if n >= 2 {
        placements.push("other");
    }
    let vms = n.min(2);
    for p in placements {
        let vms_s = vms.to_string();
        let child = std::process::Command::new(integration_tests::vmm_bin())
            .args(["bench", "blk", "--disk", a, "--executor", "host", "--pin"])
            .args(["--vms", &vms_s, "--io-cpus", p, "--duration", "3"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start vmm");
        // one VM names its vCPU thread vcpu0; several, vV.0
        let names: Vec<String> = (0..vms)
            .flat_map(|v| {
                let vcpu = if vms == 1 {
                    "vcpu0".to_string()
                } else {
                    format!("v{v}.0")
                };
                [vcpu, format!("vm{v}-blk0")]
            })
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        // a new thread places itself first thing: read once all are there
        let _ = thread_cpus(child.id(), &refs, Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(200));
        let got = thread_cpus(child.id(), &refs, Duration::from_secs(1));
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{p}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cpus_of = |name: &str| {
            got.iter()
                .find(|(n, _)| n == name)
                .map(|(_, c)| c.clone())
                .unwrap_or_else(|| panic!("{p}: no thread {name} in {got:?}"))
        };
        for v in 0..vms {
            let vcpu = cpus_of(&names[2 * v]);
            let io = cpus_of(&format!("vm{v}-blk0"));
            match p {
                "same" => assert_eq!(io, vcpu, "{p}: {got:?}"),
                "other" => {
                    assert_ne!(io, vcpu, "{p}: {got:?}");
                    assert!(!io.contains([',', '-']), "{p}: one CPU: {got:?}");
                }
                _ => assert_eq!(io, all, "{p}: {got:?}"),
            }
        }
    }
    // the comparison: every placement a row, the first twice (A/A)
    let json = dir.path().join("io.json");
    let vms_s = vms.to_string();
    let r = integration_tests::guest::run_vmm(
        &[
            "bench",
            "blk",
            "--disk",
            a,
            "--vms",
            &vms_s,
            "--executor",
            "host",
            "--pin",
            "--compare-io-cpus",
            "any,same",
            "--duration",
            "0.2",
            "--reps",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(r.status, Some(0), "{}", r.context());
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let labels: Vec<&str> = j["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| row["mitigations"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["any", "any (A/A)", "same"]);
    for (args, needle) in [
        (
            vec!["bench", "blk", "--disk", a, "--io-cpus", "near"],
            "same (the vCPU's host CPU), other (another host CPU) or any",
        ),
        (
            vec!["bench", "blk", "--disk", a, "--io-cpus", "same"],
            "give --pin",
        ),
        (
            vec![
                "bench",
                "blk",
                "--disk",
                a,
                "--io-cpus",
                "other",
                "--pin",
                "--topology",
                "package:1 core:2 pu:1",
            ],
            "needs --topology host",
        ),
        (
            vec!["bench", "runq", "--io-cpus", "same"],
            "--io-cpus applies to the blk and net workloads",
        ),
        (
            vec!["bench", "blk", "--disk", a, "--compare-io-cpus", "same"],
            "two placements or more",
        ),
        (
            vec!["bench", "blk", "--integrity", "--disk", a, "--pin"],
            "--pin applies to a blk IOPS run",
        ),
    ] {
        let r = integration_tests::guest::run_vmm(&args, Duration::from_secs(30));
        integration_tests::guest::assert_input_error(&r, &[needle]);
    }
}
