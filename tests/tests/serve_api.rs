//! `vmm serve` driven through its real Unix socket with a real HTTP client
//! (hyper), and by `scripts/serve-demo.sh` with curl: the life of its VMs.
//!
//! Every test starts its own server (a child process, killed if the test
//! fails) on a small synthetic topology, runs built-in micro-guests, and
//! bounds every wait. They cover the lifecycle of several VMs at once, every
//! error case (the server keeps answering after each), a guest that
//! triple-faults next to one that keeps running, injected faults, a Linux
//! guest, SIGTERM, and the OpenAPI document against the route table. The
//! metrics are in `serve_metrics.rs`, many and misbehaving clients in
//! `serve_connections.rs`, the server's settings in `serve_config.rs`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration_tests::serve::{
    boot_default, call, call_text, exits, progresses, rt, sample, samples, start, start_on,
    wait_for_log, Server, TICKER2,
};
use integration_tests::{vmm_bin, workspace_root};
use serde_json::{json, Value};

#[test]
fn lifecycle_of_several_vms() {
    let mut srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        let (s, v) = call(&sock, "GET", "/api/v1/vmm.ping", None).await;
        assert_eq!(s, 200);
        assert_eq!(v["pid"].as_u64(), Some(srv.child.id() as u64));
        // CH path: the default VM; /vms/{id}/: another.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        let (s, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!((s, v["state"].as_str()), (200, Some("Created")));
        // The planner pinned both SMT siblings of one host core.
        let aff = v["config"]["cpus"]["affinity"].as_array().unwrap().clone();
        assert_eq!(aff.len(), 2);
        let cpus: Vec<u64> = aff
            .iter()
            .map(|a| a["host_cpus"][0].as_u64().unwrap())
            .collect();
        assert_eq!(cpus[0] / 2, cpus[1] / 2, "siblings on one core: {cpus:?}");
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        let first = progresses(&sock, "default", 0).await;
        // A second VM boots while the first runs; it gets other cores.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/b/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        let (_, vb) = call(&sock, "GET", "/api/v1/vms/b/vm.info", None).await;
        let bcpu = vb["config"]["cpus"]["affinity"][0]["host_cpus"][0]
            .as_u64()
            .unwrap();
        assert!(!cpus.contains(&bcpu));
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/b/vm.boot", None).await.0,
            204
        );
        progresses(&sock, "b", 0).await;
        progresses(&sock, "default", first).await;
        let (s, list) = call(&sock, "GET", "/api/v1/vms", None).await;
        assert_eq!(s, 200);
        assert_eq!(list.as_array().unwrap().len(), 2);
        // Counters: per vCPU and the scheduler's.
        let (s, c) = call(&sock, "GET", "/api/v1/vm.counters", None).await;
        assert_eq!(s, 200);
        assert!(c["vcpu1"]["kvm_exits"].as_u64().unwrap() > 0, "{c}");
        // its time on the workers, in whole ms (0 for a short run)
        assert!(c["vcpu1"]["held_ms"].is_u64(), "{c}");
        assert!(c["scheduler"]["switches"].as_u64().unwrap() > 0, "{c}");
        // Reboot, shut down, boot again, delete.
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.reboot", None).await.0, 204);
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["x_vmm"]["boots"], 2);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.shutdown", None).await.0, 204);
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Shutdown");
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Running");
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/b/vm.delete", None).await.0,
            204
        );
        assert_eq!(
            call(&sock, "GET", "/api/v1/vms/b/vm.info", None).await.0,
            404
        );
        // Its cores are free again: a new VM gets them.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/c/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vmm.shutdown", None).await.0,
            204
        );
    });
    assert_eq!(
        srv.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        srv.log()
    );
    assert!(!srv.sock.exists(), "socket left behind");
    assert!(srv.log().contains("stopped every VM"), "{}", srv.log());
}

/// The scheduler's live tasks and groups, from /metrics.
async fn sched_tasks_groups(sock: &Path) -> (f64, f64) {
    let (_, m) = call_text(sock, "GET", "/metrics", None).await;
    let m = samples(&m);
    (
        sample(&m, "vmm_sched_tasks"),
        sample(&m, "vmm_sched_groups"),
    )
}

#[test]
fn every_vm_joins_one_scheduler_and_pause_holds_its_vcpus() {
    let srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        assert_eq!(sched_tasks_groups(&sock).await, (0.0, 0.0));
        for vm in ["a", "b"] {
            let p = format!("/api/v1/vms/{vm}/vm.create");
            assert_eq!(call(&sock, "PUT", &p, Some(TICKER2)).await.0, 204);
            let p = format!("/api/v1/vms/{vm}/vm.boot");
            assert_eq!(call(&sock, "PUT", &p, None).await.0, 204);
        }
        // Both VMs' vCPUs are tasks of the one scheduler, a group each.
        assert_eq!(sched_tasks_groups(&sock).await, (4.0, 2.0));
        progresses(&sock, "a", 0).await;
        // Paused: a's vCPUs stop (no more exits), b goes on.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/a/vm.pause", None).await.0,
            204
        );
        let (_, v) = call(&sock, "GET", "/api/v1/vms/a/vm.info", None).await;
        assert_eq!(v["state"], "Paused");
        // in-flight exits land within a few ms of the pause
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = exits(&sock, "a").await;
        let b0 = exits(&sock, "b").await;
        progresses(&sock, "b", b0).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(exits(&sock, "a").await, held, "a paused VM's vCPUs ran");
        // Still tasks (held, not removed); resumed, they run again.
        assert_eq!(sched_tasks_groups(&sock).await, (4.0, 2.0));
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/a/vm.resume", None).await.0,
            204
        );
        let (_, v) = call(&sock, "GET", "/api/v1/vms/a/vm.info", None).await;
        assert_eq!(v["state"], "Running");
        progresses(&sock, "a", held).await;
        // A paused VM shuts down cleanly too.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/a/vm.pause", None).await.0,
            204
        );
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/a/vm.shutdown", None)
                .await
                .0,
            204
        );
        assert_eq!(sched_tasks_groups(&sock).await, (2.0, 1.0));
        let b1 = exits(&sock, "b").await;
        progresses(&sock, "b", b1).await;
        // b leaves; a boots again into the same scheduler.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/b/vm.delete", None).await.0,
            204
        );
        assert_eq!(sched_tasks_groups(&sock).await, (0.0, 0.0));
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/a/vm.boot", None).await.0,
            204
        );
        assert_eq!(sched_tasks_groups(&sock).await, (2.0, 1.0));
        let a1 = exits(&sock, "a").await;
        progresses(&sock, "a", a1).await;
    });
    drop(srv);
}

/// method, path, body, status, field named, text in the error.
type Case = (
    &'static str,
    &'static str,
    Option<&'static str>,
    u16,
    Option<&'static str>,
    &'static str,
);

#[test]
fn errors_are_4xx_json_naming_the_field_and_the_server_keeps_serving() {
    let srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        let cases: &[Case] = &[
            ("PUT", "/api/v1/vm.create", Some("{\"cpus\":"), 400, None, "invalid JSON"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"cpus":{"boot_vcpus":2,"bogus":1}}"#), 400, Some("bogus"), "unknown field"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"cpuz":{}}"#), 400, Some("cpuz"), "unknown field"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"cpus":{"boot_vcpus":4,"topology":{"threads_per_core":2,"cores_per_die":3,"dies_per_package":1,"packages":1}}}"#), 400, Some("cpus.topology"), "= 6 vCPUs"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"cpus":{"boot_vcpus":9}}"#), 400, Some("cpus"), "fits in no host node"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"cpus":{"boot_vcpus":2,"max_vcpus":4}}"#), 400, Some("cpus.max_vcpus"), "hotplug"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"cpus":{"boot_vcpus":1,"affinity":[{"vcpu":0,"host_cpus":[99]}]}}"#), 400, Some("cpus.affinity"), "host CPU 99"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"payload":{"kernel":"/nonexistent/vmlinux"}}"#), 400, Some("payload.kernel"), "/nonexistent/vmlinux"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"payload":{"cmdline":"x"}}"#), 400, Some("payload.kernel"), "need a kernel"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"x_vmm":{"rt":{"policy":"fifo","priority":0}}}"#), 400, Some("x_vmm.rt.priority"), "1..=99"),
            ("PUT", "/api/v1/vms/nope/vm.boot", None, 404, None, "not created"),
            ("GET", "/api/v1/vms/nope/vm.info", None, 404, None, "not created"),
            ("PUT", "/api/v1/vms/bad%id/vm.info", None, 400, Some("id"), "not a VM id"),
            ("GET", "/api/v1/vm.create", None, 405, None, "takes PUT"),
            ("GET", "/api/v1/vm.nothing", None, 404, None, "no such endpoint"),
            // CH's endpoints not implemented: 501 with what is missing
            ("PUT", "/api/v1/vm.add-pmem", Some("{}"), 501, None, "virtio-pmem"),
            ("PUT", "/api/v1/vms/nope/vm.add-disk", Some(r#"{"path":"/x"}"#), 404, None, "not created"),
            ("PUT", "/api/v1/vms/nope/vm.remove-device", Some(r#"{"id":"_disk0"}"#), 404, None, "not created"),
            ("PUT", "/api/v1/vm.remove-device", Some(r#"{"id":"_disk0","x":1}"#), 400, Some("x"), "unknown field"),
            ("PUT", "/api/v1/vms/x/vm.snapshot", Some("{}"), 501, None, "snapshots"),
            // CH's fields at their defaults pass; others are named
            ("PUT", "/api/v1/vm.create", Some(r#"{"balloon":{"size":1}}"#), 400, Some("balloon"), "virtio-balloon"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"vsock":{"cid":2,"socket":"/s"}}"#), 400, Some("vsock.cid"), "3 or more"),
            ("PUT", "/api/v1/vm.create", Some(r#"{"memory":{"size":2097152,"hugepages":true}}"#), 400, Some("memory.hugepages"), "hugetlbfs"),
            // serde reads a struct from an array; the API does not
            ("PUT", "/api/v1/vm.create", Some("[]"), 400, None, "not a JSON object"),
            ("PUT", "/api/v1/vm.create", Some(" [1, 2]"), 400, None, "not a JSON object"),
            ("PUT", "/api/v1/vm.create", Some(""), 400, None, "empty"),
            ("PUT", "/api/v1/vm.resize", Some("[4]"), 400, None, "not a JSON object"),
        ];
        for (m, p, b, status, field, needle) in cases {
            let (s, v) = call(&sock, m, p, *b).await;
            assert_eq!(s, *status, "{m} {p} {b:?}: {v}");
            let err = v["error"].as_str().unwrap_or_else(|| panic!("no error body: {v}"));
            assert!(err.contains(needle), "{m} {p}: {err:?} lacks {needle:?}");
            assert_eq!(v["field"].as_str(), *field, "{m} {p}: {v}");
            // still serving
            assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
        }
        // vm.delete of no VM: 204, as CH documents and answers.
        assert_eq!(call(&sock, "PUT", "/api/v1/vms/nope/vm.delete", None).await.0, 204);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.delete", None).await.0, 204);
        // A Linux VM created without `memory` gets CH's 512 MiB, and
        // vm.info says so (not a micro-guest's 2 MiB).
        let kernel = srv.dir().join("vmlinux");
        std::fs::write(&kernel, integration_tests::tiny_kernel(&[0xf4])).unwrap();
        let body = json!({"payload": {"kernel": kernel}, "x_vmm": {"placement": {"policy": "none"}}});
        let (s, v) = call(&sock, "PUT", "/api/v1/vms/lin/vm.create", Some(&body.to_string())).await;
        assert_eq!(s, 204, "{v}");
        let (_, v) = call(&sock, "GET", "/api/v1/vms/lin/vm.info", None).await;
        assert_eq!(v["memory_actual_size"], 512u64 << 20, "{v}");
        assert_eq!(call(&sock, "PUT", "/api/v1/vms/lin/vm.delete", None).await.0, 204);
        // Wrong state transitions: 405, as CH.
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2)).await.0, 204);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2)).await.0, 409);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.shutdown", None).await.0, 405);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.pause", None).await.0, 405);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 405);
        // Pause and resume only from the state each needs.
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.resume", None).await;
        assert_eq!(s, 405, "{v}");
        assert!(v["error"].as_str().unwrap().contains("needs a Paused VM"), "{v}");
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.pause", None).await.0, 204);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.pause", None).await.0, 405);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 405);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.resume", None).await.0, 204);
        // Unsupported, said so.
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.resize", Some(r#"{"desired_vcpus":4}"#)).await;
        assert_eq!((s, v["field"].as_str()), (400, Some("desired_vcpus")), "{v}");
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
    });
    drop(srv);
}

#[test]
fn a_crashing_guest_shows_in_info_and_others_go_on() {
    let srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        boot_default(&sock, TICKER2).await;
        let crash = r#"{"cpus":{"boot_vcpus":1},"x_vmm":{"micro":"crash"}}"#;
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/x/vm.create", Some(crash))
                .await
                .0,
            204
        );
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/x/vm.boot", None).await.0,
            204
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let v = loop {
            let (_, v) = call(&sock, "GET", "/api/v1/vms/x/vm.info", None).await;
            if v["state"] == "Shutdown" {
                break v;
            }
            assert!(Instant::now() < deadline, "crash not seen: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let why = v["x_vmm"]["stop_reason"].as_str().unwrap();
        assert!(why.contains("triple fault"), "{why}");
        // The exit reasons: its one REPORT (a port write), then the
        // triple fault.
        let (_, c) = call(&sock, "GET", "/api/v1/vms/x/vm.counters", None).await;
        assert_eq!(c["exits"]["shutdown"], 1, "{c}");
        assert_eq!(c["exits"]["io"], 1, "{c}");
        let n = exits(&sock, "default").await;
        progresses(&sock, "default", n).await;
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Running");
    });
    drop(srv);
}

#[test]
fn sigterm_stops_every_vm_and_removes_the_socket() {
    let mut srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        boot_default(&sock, TICKER2).await;
    });
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(srv.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert_eq!(
        srv.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        srv.log()
    );
    assert!(!sock.exists());
    assert!(srv.log().contains("stopped every VM"), "{}", srv.log());
}

#[test]
fn linux_guest_create_boot_info_shutdown() {
    // The minimal kernel (guest/build.sh); a 2-vCPU guest pinned by the
    // planner on this host's CPUs, its serial console in a file.
    let img = integration_tests::guest::guest_images();
    let mut srv = start_on("host", &[]);
    let sock = srv.sock.clone();
    let console = sock.with_file_name("console.log");
    let cfg = json!({
        "cpus": {"boot_vcpus": 2, "topology": {"threads_per_core": 1, "cores_per_die": 2, "dies_per_package": 1, "packages": 1}},
        "memory": {"size": 256u64 << 20},
        "payload": {"kernel": img.vmlinux, "initramfs": img.initramfs, "cmdline": "loglevel=8"},
        "serial": {"mode": "File", "file": console},
    })
    .to_string();
    rt().block_on(async {
        // More memory than the host has: refused up front, naming the field.
        let mut huge: Value = serde_json::from_str(&cfg).unwrap();
        huge["memory"]["size"] = json!(1u64 << 50);
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&huge.to_string())).await;
        assert_eq!((s, v["field"].as_str()), (400, Some("memory.size")), "{v}");
        // Each fits, both together do not: the second is refused.
        let total: u64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
            * 1024;
        let mut big: Value = serde_json::from_str(&cfg).unwrap();
        big["memory"]["size"] = json!((total * 6 / 10) & !((2u64 << 20) - 1));
        let big = big.to_string();
        let (s, v) = call(&sock, "PUT", "/api/v1/vms/m1/vm.create", Some(&big)).await;
        assert_eq!(s, 204, "{v}");
        let (s, v) = call(&sock, "PUT", "/api/v1/vms/m2/vm.create", Some(&big)).await;
        assert_eq!((s, v["field"].as_str()), (400, Some("memory.size")), "{v}");
        assert!(v["error"].as_str().unwrap().contains("already hold"), "{v}");
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/m1/vm.delete", None).await.0,
            204
        );
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        if s == 400 && v["field"] == "cpus" {
            // A host with fewer than 2 cores: let any CPU run them.
            let mut c: Value = serde_json::from_str(&cfg).unwrap();
            c["x_vmm"] = json!({"placement": {"policy": "none"}});
            let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&c.to_string())).await;
            assert_eq!(s, 204, "{v}");
        } else {
            assert_eq!(s, 204, "{v}");
        }
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let log = std::fs::read_to_string(&console).unwrap_or_default();
            if log.contains("smp: Brought up") {
                break;
            }
            let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
            assert_eq!(v["state"], "Running", "{v}\n{log}");
            assert!(
                Instant::now() < deadline,
                "no 'smp: Brought up' in 300 s:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Running", "{v}");
        assert_eq!(v["memory_actual_size"], 256u64 << 20);
        assert!(v["x_vmm"]["kvm_exits"].as_u64().unwrap() > 0);
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.shutdown", None).await.0, 204);
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["state"], "Shutdown");
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vmm.shutdown", None).await.0,
            204
        );
    });
    assert_eq!(
        srv.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        srv.log()
    );
}

/// With `--halt-park on` a Linux guest on the shared pool boots as before
/// (every AP started: each waited for its SIPI on its park thread), and
/// when the VM leaves the halt-poll hub its closing line shows vCPUs
/// parked inside KVM and woken by KVM.
#[test]
fn linux_guest_boots_with_halted_vcpus_parked() {
    let img = integration_tests::guest::guest_images();
    // -v: the hub's closing line is an info line
    let mut srv = start_on("host", &["--halt-park", "on", "-v"]);
    let sock = srv.sock.clone();
    let console = sock.with_file_name("console.log");
    let cfg = json!({
        "cpus": {"boot_vcpus": 4, "topology": {"threads_per_core": 1, "cores_per_die": 4, "dies_per_package": 1, "packages": 1}},
        "memory": {"size": 256u64 << 20},
        "payload": {"kernel": img.vmlinux, "initramfs": img.initramfs, "cmdline": "loglevel=8"},
        "serial": {"mode": "File", "file": console},
        "x_vmm": {"placement": {"policy": "none"}},
    })
    .to_string();
    rt().block_on(async {
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&cfg)).await;
        assert_eq!(s, 204, "{v}");
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        let log = wait_for_log(&sock, &console, "smp: Brought up", Duration::from_secs(300)).await;
        assert!(log.contains("4 CPUs"), "{log}");
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.shutdown", None).await.0, 204);
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vmm.shutdown", None).await.0,
            204
        );
    });
    assert_eq!(
        srv.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{}",
        srv.log()
    );
    let log = srv.log();
    for key in ["parked=", "park_woken="] {
        let n = integration_tests::guest_check::logged_count(&log, "left the halt-poll hub", key);
        assert!(n > 0, "{key}0 in:\n{log}");
    }
}

/// Waits (bounded) until VM `vm` is `Shutdown` and its last vCPU has
/// ended (a failed VM shows `Shutdown` at once; its other vCPUs leave the
/// guest a moment later); its vm.info.
async fn shut_down(sock: &Path, vm: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let (s, v) = call(sock, "GET", &format!("/api/v1/vms/{vm}/vm.info"), None).await;
        assert_eq!(s, 200, "{v}");
        if v["state"] == "Shutdown" && v["x_vmm"]["live_vcpus"] == 0 {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "VM {vm} still {} after {limit:?}",
            v["state"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn injected_faults_stop_only_their_vm_and_the_server_stays_up() {
    // Test faults (vmm_machine::vcpu::inject) armed through VMM_INJECT: a panic of
    // the thread running a vCPU, a KVM internal error and a failed KVM_RUN
    // in three micro-guests, and a failed KVM_RUN in a booting Linux guest.
    let img = integration_tests::guest::guest_images();
    let inject = "p:1:panic@5,i:0:internal@5,k:1:ioctl@5,lin:0:ioctl@2000";
    let srv = Server::start_env("host", &[], &[("VMM_INJECT", inject)]);
    let sock = srv.sock.clone();
    let micro =
        r#"{"cpus":{"boot_vcpus":2},"x_vmm":{"micro":"ticker","placement":{"policy":"none"}}}"#;
    let linux = json!({
        "cpus": {"boot_vcpus": 1},
        "memory": {"size": 256u64 << 20},
        "payload": {"kernel": img.vmlinux, "initramfs": img.initramfs, "cmdline": "loglevel=8"},
        "x_vmm": {"placement": {"policy": "none"}},
    })
    .to_string();
    rt().block_on(async {
        // A guest that spins without exits is preempted, not a fault.
        let spin =
            r#"{"cpus":{"boot_vcpus":2},"x_vmm":{"micro":"spin","placement":{"policy":"none"}}}"#;
        for (vm, body) in [
            ("calm", micro),
            ("spin", spin),
            ("p", micro),
            ("i", micro),
            ("k", micro),
            ("lin", &linux),
        ] {
            let p = format!("/api/v1/vms/{vm}/vm.create");
            assert_eq!(call(&sock, "PUT", &p, Some(body)).await.0, 204, "{vm}");
            let p = format!("/api/v1/vms/{vm}/vm.boot");
            assert_eq!(call(&sock, "PUT", &p, None).await.0, 204, "{vm}");
        }
        for (vm, why) in [
            (
                "p",
                "vCPU 1: the thread running it panicked: vCPU 1: injected panic",
            ),
            ("i", "vCPU 0: KVM hit an instruction KVM cannot emulate"),
            ("k", "vCPU 1: vCPU 1: KVM_RUN failed"),
            ("lin", "KVM_RUN failed"),
        ] {
            let v = shut_down(&sock, vm, Duration::from_secs(120)).await;
            let reason = v["x_vmm"]["stop_reason"].as_str().unwrap_or_default();
            assert!(reason.contains(why), "{vm}: {v}");
            assert_eq!(v["x_vmm"]["live_vcpus"], 0, "{vm}: {v}");
        }
        // The server answers, and the calm VM runs on and is counted.
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
        let n = exits(&sock, "calm").await;
        progresses(&sock, "calm", n).await;
        for vm in ["calm", "spin"] {
            let (_, v) = call(&sock, "GET", &format!("/api/v1/vms/{vm}/vm.info"), None).await;
            assert_eq!(v["state"], "Running", "{v}");
        }
        let (_, m) = call_text(&sock, "GET", "/metrics", None).await;
        let m = samples(&m);
        assert!(sample(&m, "vmm_vm_kvm_exits_total{vm=\"calm\"}") > n as f64);
        assert_eq!(
            sample(&m, "vmm_vm_exits_total{vm=\"i\",reason=\"internal_error\"}"),
            1.0
        );
        assert_eq!(sample(&m, "vmm_vm_running{vm=\"p\"}"), 0.0);
        // A failed VM boots again; VMM_INJECT arms every boot, so it
        // fails the same way, and the server goes on.
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/p/vm.shutdown", None)
                .await
                .0,
            204
        );
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vms/p/vm.boot", None).await.0,
            204
        );
        let v = shut_down(&sock, "p", Duration::from_secs(60)).await;
        assert_eq!(v["x_vmm"]["boots"], 2, "{v}");
        assert!(v["x_vmm"]["stop_reason"]
            .as_str()
            .unwrap()
            .contains("injected panic"));
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
    });
    assert!(srv.log().contains("injected panic"), "{}", srv.log());
}

#[test]
fn curl_script_drives_the_api() {
    let out = integration_tests::run_bounded::run_bounded_cmd(
        {
            let mut c = Command::new(workspace_root().join("scripts/serve-demo.sh"));
            c.env("VMM_BIN", vmm_bin());
            c
        },
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    for needle in [
        "\"state\":\"Running\"",
        "triple fault",
        "\"field\":\"bogus\"} [400]",
        "vmm_vm_kvm_exits_total{vm=\"default\"}",
        "server stopped, socket removed",
    ] {
        assert!(
            out.stdout.contains(needle),
            "{needle:?} missing:\n{}",
            out.context()
        );
    }
}

#[test]
fn openapi_document_matches_the_routes() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/api.yaml")).unwrap();
    // paths in the document: "  /path:" lines, methods: "    get:" lines under them
    let mut documented = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            current = Some(format!("/{p}"));
        } else if let (Some(p), Some(m)) = (
            &current,
            line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')),
        ) {
            if ["get", "put", "post", "delete"].contains(&m) {
                documented.push((m.to_uppercase(), p.clone()));
            }
        } else if !line.starts_with(' ') && !line.is_empty() {
            current = None;
        }
    }
    let mut real: Vec<(String, String)> = vmm_api::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    // each VM endpoint also under /api/v1/vms/{id}/
    for (m, p) in vmm_api::ROUTES {
        if let Some(ep) = p.strip_prefix("/api/v1/vm.") {
            real.push((m.to_string(), format!("/api/v1/vms/{{id}}/vm.{ep}")));
        }
    }
    documented.sort();
    real.sort();
    assert_eq!(documented, real, "docs/api.yaml and vmm_api::ROUTES differ");
}
