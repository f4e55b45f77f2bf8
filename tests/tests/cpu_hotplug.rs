//! ACPI CPU hotplug through `vmm serve`'s `vm.resize`, as Kata drives it:
//! a Linux guest created with `boot_vcpus: 1, max_vcpus: 2` gains its
//! second vCPU, then gives it back.
//!
//! The guest kernel is the judge (guest user space cannot run under
//! kvm_pvm): after `vm.resize {"desired_vcpus": 2}` the kernel's ACPI
//! processor driver, notified through the Generic Event Device, maps the
//! new CPU and prints `CPU1 has been hot-added`. Linux 6.1 does not online
//! a hot-added CPU by itself (user space writes
//! `/sys/devices/system/cpu/cpu1/online`, as the Kata agent does), so the
//! test stops at the hot-add. `vm.resize {"desired_vcpus": 1}` then sends
//! an eject request: the kernel removes the (offline) CPU and calls its
//! `_EJ0`, which `vm.info`'s `x_vmm.present_vcpus` shows. Sizes past
//! `max_vcpus` are refused naming `desired_vcpus`. Each executor that
//! runs vCPUs differently is tried: `workers` (the shared scheduler) and
//! `host` (a thread per vCPU).

use std::path::Path;
use std::time::{Duration, Instant};

use integration_tests::guest::guest_images;
use integration_tests::serve::{call, rt, wait_for_log, Server};
use serde_json::json;

fn config(kernel: &Path, serial: &Path) -> String {
    json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 2,
                 "topology": {"threads_per_core": 1, "cores_per_die": 2, "dies_per_package": 1, "packages": 1}},
        "memory": {"size": 256u64 << 20},
        // root= names a device that never appears: the kernel waits, alive.
        "payload": {"kernel": kernel, "cmdline": "root=/dev/vdz rootwait loglevel=8"},
        "serial": {"mode": "File", "file": serial},
        "x_vmm": {"placement": {"policy": "none"}},
    })
    .to_string()
}

async fn present_vcpus(sock: &Path) -> serde_json::Value {
    let (_, v) = call(sock, "GET", "/api/v1/vm.info", None).await;
    v
}

fn hotplug_on(executor: &str) {
    let g = guest_images();
    let work = tempfile::tempdir().unwrap();
    let srv = Server::start_env("host", &["--executor", executor], &[]);
    let sock = srv.sock.clone();
    let serial = work.path().join("ttyS0.log");
    let cfg = config(&g.vmlinux, &serial);
    rt().block_on(async {
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.boot", None).await;
        assert_eq!(s, 204, "{v}\n{}", srv.log());
        let limit = Duration::from_secs(10 * 60);
        let log = wait_for_log(&sock, &serial, "Waiting for root device", limit).await;
        assert!(log.contains("smp: Brought up 1 node, 1 CPU"), "{log}");
        let v = present_vcpus(&sock).await;
        assert_eq!(v["x_vmm"]["present_vcpus"], 1, "{v}");
        // Past max_vcpus: refused, nothing changes.
        let (s, v) = call(
            &sock,
            "PUT",
            "/api/v1/vm.resize",
            Some(r#"{"desired_vcpus":3}"#),
        )
        .await;
        assert_eq!(
            (s, v["field"].as_str()),
            (400, Some("desired_vcpus")),
            "{v}"
        );
        // Grow: the guest maps CPU 1.
        let (s, v) = call(
            &sock,
            "PUT",
            "/api/v1/vm.resize",
            Some(r#"{"desired_vcpus":2}"#),
        )
        .await;
        assert_eq!(s, 204, "{v}");
        let log = wait_for_log(&sock, &serial, "CPU1 has been hot-added", limit).await;
        assert!(!log.contains("ACPI Error"), "{log}");
        let v = present_vcpus(&sock).await;
        assert_eq!(v["x_vmm"]["present_vcpus"], 2, "{v}");
        assert_eq!(v["x_vmm"]["live_vcpus"], 2, "{v}");
        assert_eq!(v["config"]["cpus"]["boot_vcpus"], 2, "{v}");
        // Shrink: the guest ejects CPU 1 (_EJ0 clears its present bit).
        let (s, v) = call(
            &sock,
            "PUT",
            "/api/v1/vm.resize",
            Some(r#"{"desired_vcpus":1}"#),
        )
        .await;
        assert_eq!(s, 204, "{v}");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = present_vcpus(&sock).await;
            if v["x_vmm"]["present_vcpus"] == 1 {
                assert_eq!(v["state"], "Running", "{v}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the guest did not eject CPU 1: {v}\n{}\n{}",
                std::fs::read_to_string(&serial).unwrap_or_default(),
                srv.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.shutdown", None).await;
        assert_eq!(s, 204, "{v}");
    });
}

#[test]
fn resize_hot_adds_and_ejects_a_vcpu_on_workers() {
    hotplug_on("workers");
}

#[test]
fn resize_hot_adds_and_ejects_a_vcpu_on_host_threads() {
    hotplug_on("host");
}
