//! virtio-fs as a vhost-user frontend, judged by the guest kernel's FUSE
//! client and a real backend: QEMU's C virtiofsd (Debian's
//! `qemu-system-common`, installed by `scripts/setup.sh`).
//!
//! * `vmm run --fs`: the minimal kernel boots with `rootfstype=virtiofs
//!   root=TAG` and no initrd. Its log must say `VFS: Mounted root (virtiofs
//!   filesystem)`, and then `Starting init: /sbin/init exists but couldn't
//!   execute it (error -8)`: the shared directory's `/sbin/init` is a file
//!   of text, so the kernel found it (FUSE `LOOKUP`), opened it and read
//!   its first bytes (`OPEN`, `READ`: every request through the rings in
//!   shared memory, kicked by the guest's doorbell straight to virtiofsd
//!   and answered through the relayed interrupt) before refusing it as no
//!   executable format (`ENOEXEC`).
//! * `vmm serve`: a Linux VM mounts its root the same way next to a
//!   micro-guest; virtiofsd is then killed. The server neither panics
//!   nor hangs, `vm.info` reports the device's backend failed, and the
//!   micro-guest goes on running, as does the server's API.
//!
//! Guest user space cannot run under kvm_pvm, so nothing past the kernel
//! is judged. Without virtiofsd the tests skip loudly (fail under CI).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use integration_tests::guest::{guest_images, run_vmm};
use integration_tests::serve::{call, rt, Server};
use integration_tests::virtiofsd::{shared_root, virtiofsd, Backend};
use integration_tests::{require_kvm, skip_or_fail};
use serde_json::json;

const MOUNTED: &str = "VFS: Mounted root (virtiofs filesystem)";
/// Past the mount: `/sbin/init` was looked up, opened and read.
const INIT_READ: &str = "Starting init: /sbin/init exists but couldn't execute it (error -8)";
const INIT_READ_RE: &str = r"Starting init: /sbin/init exists but couldn't execute it \(error -8\)";
const TAG: &str = "testroot";

/// Whether the test can run: KVM and virtiofsd.
fn ready() -> Option<PathBuf> {
    if !require_kvm() {
        return None;
    }
    let bin = virtiofsd();
    if bin.is_none() {
        skip_or_fail(
            "virtiofsd is not installed (Debian: apt-get install qemu-system-common, \
             which scripts/setup.sh does); the virtio-fs tests did NOT run",
        );
    }
    bin
}

/// Lines of a kernel log that say the FUSE or virtio-fs driver failed
/// (`fuse: init (API version ...)`, the module's greeting, is not one).
fn fs_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("virtio-fs:")
                || l.contains("virtio_fs")
                || (l.contains("fuse:") && !l.contains("fuse: init (API version"))
                || l.contains("VFS: Cannot open root")
        })
        .collect()
}

#[test]
fn the_guest_mounts_its_root_from_virtiofsd_and_reads_a_file() {
    let Some(bin) = ready() else { return };
    let g = guest_images();
    let dir = tempfile::tempdir().unwrap();
    let root = shared_root(dir.path());
    let sock = dir.path().join("vfs.sock");
    let backend = Backend::start(&bin, &root, &sock, &dir.path().join("virtiofsd.log"));
    let kernel = g.vmlinux.to_string_lossy().into_owned();
    let fs = format!(
        "tag={TAG},socket={},num_queues=1,queue_size=1024",
        sock.display()
    );
    let cmdline = format!("rootfstype=virtiofs root={TAG} rw loglevel=8");
    let r = run_vmm(
        &[
            "-v",
            "run",
            "--kernel",
            &kernel,
            "--memory",
            "512M",
            "--guest",
            "package:1 l3:1 l2:1 core:1 pu:1",
            "--fs",
            &fs,
            "--cmdline",
            &cmdline,
            "--until",
            INIT_READ_RE,
            "--timeout",
            "10m",
        ],
        Duration::from_secs(11 * 60),
    );
    eprintln!("virtio-fs boot: {:.1} s", r.elapsed.as_secs_f64());
    let ctx = format!("{}\n--- virtiofsd ---\n{}", r.context(), backend.log());
    assert_eq!(r.status, Some(0), "{ctx}");
    assert!(r.console.contains(MOUNTED), "{ctx}");
    assert!(r.console.contains(INIT_READ), "{ctx}");
    assert!(
        fs_errors(&r.console).is_empty(),
        "{:?}\n{ctx}",
        fs_errors(&r.console)
    );
    assert!(r.stderr.contains("vhost-user backend connected"), "{ctx}");
    assert!(!r.stderr.contains("backend failed"), "{ctx}");
    assert!(!r.stderr.contains("needs a reset"), "{ctx}");
    assert!(!r.stderr.contains("panicked"), "{ctx}");
}

#[test]
fn a_missing_backend_socket_is_a_clear_error() {
    if !require_kvm() {
        return;
    }
    let g = guest_images();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nobody.sock");
    let fs = format!("tag={TAG},socket={}", sock.display());
    let kernel = g.vmlinux.to_string_lossy().into_owned();
    let r = run_vmm(
        &[
            "run",
            "--kernel",
            &kernel,
            "--memory",
            "256M",
            "--guest",
            "package:1 core:1 pu:1",
            "--fs",
            &fs,
            "--timeout",
            "60s",
        ],
        Duration::from_secs(90),
    );
    integration_tests::guest::assert_input_error(&r, &["nobody.sock", "virtiofsd --socket-path="]);
}

/// vm.info's report of the default VM's device backends.
async fn backends(sock: &Path) -> serde_json::Value {
    let (s, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    assert_eq!(s, 200, "{v}");
    v["x_vmm"]["device_backends"].clone()
}

#[test]
fn virtiofsd_dying_fails_its_device_only() {
    let Some(bin) = ready() else { return };
    let g = guest_images();
    let dir = tempfile::tempdir().unwrap();
    let root = shared_root(dir.path());
    let vsock = dir.path().join("vfs.sock");
    let mut backend = Backend::start(&bin, &root, &vsock, &dir.path().join("virtiofsd.log"));
    let srv = Server::start_env("package:1 l3:1 l2:2 core:1 pu:2", &[], &[]);
    let sock = srv.sock.clone();
    let serial = dir.path().join("ttyS0.log");
    let cfg = json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 256u64 << 20, "shared": true},
        "payload": {"kernel": g.vmlinux,
                    "cmdline": format!("rootfstype=virtiofs root={TAG} rw loglevel=8")},
        "platform": {"num_pci_segments": 2},
        "fs": [{"tag": TAG, "socket": vsock, "num_queues": 1, "queue_size": 1024,
                "pci_segment": 1, "id": "fs0"}],
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
        "x_vmm": {"placement": {"policy": "none"}},
    })
    .to_string();
    let ticker = r#"{"cpus":{"boot_vcpus":1,"max_vcpus":1},"x_vmm":{"micro":"ticker"}}"#;
    rt().block_on(async {
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vms/b/vm.create", Some(ticker)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.boot", None).await;
        assert_eq!(s, 204, "{v}\n{}", srv.log());
        let (s, v) = call(&sock, "PUT", "/api/v1/vms/b/vm.boot", None).await;
        assert_eq!(s, 204, "{v}\n{}", srv.log());
        assert_eq!(
            backends(&sock).await,
            json!([{"device": "virtio-fs0", "state": "Ok"}])
        );
        let log = integration_tests::serve::wait_for_log(
            &sock,
            &serial,
            INIT_READ,
            Duration::from_secs(10 * 60),
        )
        .await;
        assert!(log.contains(MOUNTED), "{log}");
        assert!(
            log.contains("pci 0001:00:01.0: [1af4:105a]"),
            "virtio-fs (ID 26) on segment 1:\n{log}"
        );

        // The backend dies.
        backend.kill();
        let deadline = Instant::now() + Duration::from_secs(20);
        let report = loop {
            let b = backends(&sock).await;
            if b[0]["state"] == "Failed" {
                break b;
            }
            assert!(
                Instant::now() < deadline,
                "not reported failed: {b}\n{}",
                srv.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let why = report[0]["error"].as_str().unwrap_or_default();
        assert!(why.contains("closed the vhost-user connection"), "{report}");
        // The state changes just before the line is logged: wait for it.
        while !srv.log().contains("vhost-user backend failed") {
            assert!(Instant::now() < deadline, "not logged:\n{}", srv.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // The rest goes on: the VM itself, the micro-guest, the API.
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Running", "{v}");
        let exits = |v: &serde_json::Value| v["x_vmm"]["kvm_exits"].as_u64().unwrap_or(0);
        let (_, b1) = call(&sock, "GET", "/api/v1/vms/b/vm.info", None).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, b2) = call(&sock, "GET", "/api/v1/vms/b/vm.info", None).await;
        assert_eq!(b2["state"], "Running", "{b2}");
        assert!(
            exits(&b2) > exits(&b1),
            "the micro-guest stalled: {b1} {b2}"
        );

        // Shutting the VM down does not wait on the dead backend.
        let t = Instant::now();
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.shutdown", None).await;
        assert_eq!(s, 204, "{v}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let (s, v) = call(&sock, "PUT", "/api/v1/vms/b/vm.shutdown", None).await;
        assert_eq!(s, 204, "{v}");
    });
    assert!(!srv.log().contains("panicked"), "{}", srv.log());
}
