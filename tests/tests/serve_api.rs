//! `vmm serve` driven through its real Unix socket with a real HTTP client
//! (hyper), and by `scripts/serve-demo.sh` with curl.
//!
//! Every test starts its own server (a child process, killed if the test
//! fails) on a small synthetic topology, runs built-in micro-guests, and
//! bounds every wait. They cover the lifecycle of several VMs at once, every
//! error case (the server keeps answering after each), a guest that
//! triple-faults next to one that keeps running, the metrics (parsed, and
//! checked by `promtool` where it is installed), 100 concurrent clients,
//! SIGTERM, and the OpenAPI document against the route table.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use integration_tests::serve::{call, call_text, rt, Server};
use integration_tests::{require_tool, vmm_bin, workspace_root};
use serde_json::{json, Value};

/// The topology every server here manages: 8 CPUs, 2 LLCs of 2 L2s of one
/// SMT2 core each (emulated on this host's CPUs).
const TOPO: &str = "package:1 l3:2 l2:2 core:1 pu:2";

/// `vmm serve` on [`TOPO`] with `extra` flags.
fn start(extra: &[&str]) -> Server {
    Server::start_env(TOPO, extra, &[])
}

/// `vmm serve` on `topology` with `extra` flags.
fn start_on(topology: &str, extra: &[&str]) -> Server {
    Server::start_env(topology, extra, &[])
}

const TICKER2: &str = r#"{"cpus":{"boot_vcpus":2,"max_vcpus":2,"topology":{"threads_per_core":2,"cores_per_die":1,"dies_per_package":1,"packages":1}},"x_vmm":{"micro":"ticker"}}"#;

async fn exits(sock: &Path, vm: &str) -> u64 {
    let p = if vm == "default" {
        "/api/v1/vm.info".to_string()
    } else {
        format!("/api/v1/vms/{vm}/vm.info")
    };
    let (s, v) = call(sock, "GET", &p, None).await;
    assert_eq!(s, 200, "{v}");
    v["x_vmm"]["kvm_exits"].as_u64().unwrap()
}

/// Waits (bounded) until `vm`'s exits exceed `than`.
async fn progresses(sock: &Path, vm: &str, than: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = exits(sock, vm).await;
        if n > than {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "VM {vm} made no progress past {than} exits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
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

/// `name{labels} value` lines of a classic exposition.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            (
                k.to_string(),
                v.parse::<f64>()
                    .unwrap_or_else(|_| panic!("bad value {l:?}")),
            )
        })
        .collect()
}

fn sample(s: &[(String, f64)], key: &str) -> f64 {
    s.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no sample {key}"))
        .1
}

/// Pauses the default VM and waits until its migration counts stop
/// moving; then the scheduler's migrations by distance add up to the VM's
/// own count (its 2 vCPUs are the only tasks this scheduler has had).
async fn migrations_add_up_once_paused(sock: &Path) {
    assert_eq!(call(sock, "PUT", "/api/v1/vm.pause", None).await.0, 204);
    let by_distance = |s: &[(String, f64)]| -> f64 {
        ["l2", "llc", "node", "remote"]
            .iter()
            .map(|d| {
                sample(
                    s,
                    &format!("vmm_sched_migrations_total{{distance=\"{d}\"}}"),
                )
            })
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    loop {
        let (s, text) = call_text(sock, "GET", "/metrics", None).await;
        assert_eq!(s, 200);
        let m = samples(&text);
        let now = (
            sample(&m, "vmm_vm_migrations_total{vm=\"default\"}"),
            by_distance(&m),
        );
        if last == Some(now) {
            assert_eq!(
                now.0, now.1,
                "the VM's migrations against the scheduler's by distance"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the paused VM's migration counts never settled: {last:?} then {now:?}"
        );
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn metrics_parse_grow_and_pass_promtool() {
    let srv = start(&["--metrics-per-vcpu"]);
    let sock = srv.sock.clone();
    let (text, openmetrics) = rt().block_on(async {
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        progresses(&sock, "default", 0).await;
        // the VM's first exits may all be vCPU 0's: wait until vCPU 1 has
        // left the guest once too (both vCPUs run the ticker)
        let vcpu1 = "vmm_vcpu_kvm_exits_total{vm=\"default\",vcpu=\"1\"}";
        let deadline = Instant::now() + Duration::from_secs(20);
        let a = loop {
            let (s, a) = call_text(&sock, "GET", "/metrics", None).await;
            assert_eq!(s, 200);
            let a = samples(&a);
            if sample(&a, vcpu1) > 0.0 {
                break a;
            }
            assert!(Instant::now() < deadline, "vCPU 1 never left the guest");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let e0 = sample(&a, "vmm_vm_kvm_exits_total{vm=\"default\"}");
        assert!(e0 > 0.0);
        assert_eq!(sample(&a, "vmm_vm_running{vm=\"default\"}"), 1.0);
        // The shared scheduler's counters carry no VM label.
        assert!(sample(&a, "vmm_sched_switches_total") > 0.0);
        assert_eq!(sample(&a, "vmm_sched_tasks"), 2.0);
        assert_eq!(sample(&a, "vmm_sched_groups"), 1.0);
        // TICKER2 asks for no RT policy: no runqueue ever holds a
        // pushable RT task, so the RT overload mask never changes
        assert_eq!(sample(&a, "vmm_sched_rto_updates_total"), 0.0);
        progresses(&sock, "default", e0 as u64).await;
        let (_, b) = call_text(&sock, "GET", "/metrics", None).await;
        let bs = samples(&b);
        assert!(sample(&bs, "vmm_vm_kvm_exits_total{vm=\"default\"}") > e0);
        assert!(sample(&bs, "vmm_api_request_duration_seconds_count") > 0.0);
        // The scheduler's view: run delay per VM and per vCPU, and a
        // wake-to-run histogram whose buckets add up. Both vCPUs waited
        // in a runqueue before their first run, and the VM's run delay is
        // its vCPUs' (one snapshot of each vCPU feeds both).
        let delay = sample(&bs, "vmm_vm_run_delay_seconds_total{vm=\"default\"}");
        let per_vcpu: Vec<f64> = (0..2)
            .map(|k| {
                sample(
                    &bs,
                    &format!("vmm_vcpu_run_delay_seconds_total{{vm=\"default\",vcpu=\"{k}\"}}"),
                )
            })
            .collect();
        assert!(per_vcpu.iter().all(|d| *d > 0.0), "{per_vcpu:?}");
        let sum: f64 = per_vcpu.iter().sum();
        assert!(
            (delay - sum).abs() <= 1e-9 * delay,
            "{delay} != {per_vcpu:?}"
        );
        let wakeups = sample(&bs, "vmm_vm_wakeups_total{vm=\"default\"}");
        assert!(wakeups > 0.0);
        // every wakeup ends in a switch-in, but for the (at most 2) woken
        // vCPUs still waiting at the scrape
        let runs = sample(&bs, "vmm_vm_runs_total{vm=\"default\"}");
        assert!(runs + 2.0 >= wakeups, "runs {runs}, wakeups {wakeups}");
        // The ticker's exits are its port writes (REPORT, SLEEP).
        assert!(sample(&bs, "vmm_vm_exits_total{vm=\"default\",reason=\"io\"}") > 0.0);
        assert_eq!(
            sample(
                &bs,
                "vmm_vm_exits_total{vm=\"default\",reason=\"shutdown\"}"
            ),
            0.0
        );
        let count = sample(&bs, "vmm_vm_wake_to_run_seconds_count{vm=\"default\"}");
        assert!(count > 0.0);
        let buckets: Vec<f64> = bs
            .iter()
            .filter(|(k, _)| k.starts_with("vmm_vm_wake_to_run_seconds_bucket{"))
            .map(|(_, v)| *v)
            .collect();
        assert!(
            buckets.len() > 2 && buckets.windows(2).all(|w| w[0] <= w[1]),
            "{buckets:?}"
        );
        assert_eq!(
            sample(
                &bs,
                "vmm_vm_wake_to_run_seconds_bucket{le=\"+Inf\",vm=\"default\"}"
            ),
            count
        );
        // OpenMetrics on request.
        let stream = tokio::net::UnixStream::connect(&sock).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .uri("http://localhost/metrics")
            .header("host", "localhost")
            .header("accept", "application/openmetrics-text; version=1.0.0")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let r = tx.send_request(req).await.unwrap();
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"));
        let om = r.into_body().collect().await.unwrap().to_bytes();
        let om = String::from_utf8_lossy(&om).into_owned();
        assert!(om.trim_end().ends_with("# EOF"));
        migrations_add_up_once_paused(&sock).await;
        (b, om)
    });
    // Every counter family is named for its _total sample, with help.
    assert!(text.contains("# TYPE vmm_vm_kvm_exits_total counter"));
    drop(srv);
    if !require_tool("promtool", "scripts/setup.sh installs it") {
        return;
    }
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting promtool");
    use std::io::Write;
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    openmetrics_parses(&openmetrics);
}

/// The OpenMetrics exposition, judged by the Prometheus project's Python
/// client's strict OpenMetrics parser (`python3-prometheus-client`;
/// promtool 2.42's `check metrics` reads only the classic format, where
/// an OpenMetrics counter's family name, without `_total`, reads as a
/// metric with no help text).
fn openmetrics_parses(om: &str) {
    const PY: &str = "/usr/bin/python3";
    let probe = Command::new(PY)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        integration_tests::skip_or_fail(
            "python3-prometheus-client is not installed (scripts/setup.sh installs it)",
        );
        return;
    }
    let script = "import sys\n\
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
fams = list(parse(sys.stdin.read()))\n\
names = {f.name for f in fams}\n\
assert 'vmm_vm_kvm_exits' in names, sorted(names)\n\
print(len(fams))\n";
    let mut p = Command::new(PY)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting python3");
    use std::io::Write;
    p.stdin.take().unwrap().write_all(om.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the exposition: {}\n{om}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hundred_clients_neither_stall_the_api_nor_the_vcpus() {
    let srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        let before = progresses(&sock, "default", 0).await;
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..100 {
            let sock = sock.clone();
            tasks.push(tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                for i in 0..10 {
                    let path = if (c + i) % 2 == 0 {
                        "/api/v1/vm.info"
                    } else {
                        "/metrics"
                    };
                    let t = Instant::now();
                    let (s, _) = call_text(&sock, "GET", path, None).await;
                    assert_eq!(s, 200, "{path}");
                    worst = worst.max(t.elapsed());
                }
                worst
            }));
        }
        let all = tokio::time::timeout(Duration::from_secs(120), futures_join(tasks))
            .await
            .expect("1000 requests from 100 clients did not finish in 120 s");
        let worst = all.into_iter().max().unwrap();
        let after = exits(&sock, "default").await;
        eprintln!(
            "100 clients x 10 requests in {:?}, slowest {:?}; vCPU exits {before} -> {after}",
            t0.elapsed(),
            worst
        );
        assert!(
            after > before,
            "the vCPUs made no progress while the API was hammered"
        );
        assert!(worst < Duration::from_secs(30), "a request took {worst:?}");
    });
    drop(srv);
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<Duration>>) -> Vec<Duration> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

#[test]
fn sigterm_stops_every_vm_and_removes_the_socket() {
    let mut srv = start(&[]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        progresses(&sock, "default", 0).await;
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

/// The host executor names its vCPU threads `vcpuN`, and `/metrics` gives
/// their running time, run delay and runs (switch-ins) as the host
/// kernel's schedstat counts them: a scrape lies between two reads of the
/// threads' own schedstat files, one before it and one after.
#[test]
fn host_executor_names_vcpu_threads_and_reports_their_schedstat() {
    let srv = start(&["--executor", "host"]);
    let sock = srv.sock.clone();
    let pid = srv.child.id();
    rt().block_on(async {
        assert_eq!(
            call(&sock, "PUT", "/api/v1/vm.create", Some(TICKER2))
                .await
                .0,
            204
        );
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        progresses(&sock, "default", 0).await;
    });
    let vcpus = || -> Vec<(String, std::path::PathBuf)> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                let n = std::fs::read_to_string(p.join("comm")).ok()?;
                let n = n.trim();
                n.starts_with("vcpu").then(|| (n.to_string(), p))
            })
            .collect()
    };
    let mut names: Vec<String> = vcpus().into_iter().map(|(n, _)| n).collect();
    names.sort();
    assert_eq!(names, ["vcpu0", "vcpu1"]);
    // (running s, run delay s, runs) summed over the vCPU threads
    let schedstat = || -> (f64, f64, f64) {
        vcpus().iter().fold((0.0, 0.0, 0.0), |(r, d, n), (_, p)| {
            let t = std::fs::read_to_string(p.join("schedstat")).unwrap();
            let v: Vec<f64> = t
                .split_whitespace()
                .map(|x| x.parse::<f64>().unwrap())
                .collect();
            (r + v[0] / 1e9, d + v[1] / 1e9, n + v[2])
        })
    };
    let before = schedstat();
    let m = rt().block_on(async {
        let (s, text) = call_text(&sock, "GET", "/metrics", None).await;
        assert_eq!(s, 200, "{text}");
        samples(&text)
    });
    let after = schedstat();
    let running = sample(&m, "vmm_vm_running_seconds_total{vm=\"default\"}");
    let delay = sample(&m, "vmm_vm_run_delay_seconds_total{vm=\"default\"}");
    let runs = sample(&m, "vmm_vm_runs_total{vm=\"default\"}");
    // the exposition rounds to a few significant digits at most
    let tol = 1e-6;
    assert!(
        before.0 > 0.0 && before.0 - tol <= running && running <= after.0 + tol,
        "running {running} s not within the threads' {before:?} .. {after:?}"
    );
    assert!(
        before.1 - tol <= delay && delay <= after.1 + tol,
        "run delay {delay} s not within the threads' {before:?} .. {after:?}"
    );
    assert!(
        before.2 > 0.0 && before.2 <= runs && runs <= after.2,
        "runs {runs} not within the threads' {before:?} .. {after:?}"
    );
    drop(srv);
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

#[test]
fn bad_serve_and_plan_input_is_one_line_and_exit_2() {
    use integration_tests::run_bounded::run_bounded;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let sock = sock.to_str().unwrap();
    let bad_cfg = dir.path().join("bad.toml");
    std::fs::write(&bad_cfg, "topology = \"host\"\nbogus = 1\n").unwrap();
    // A user's file where the socket would go: refused, kept as it was.
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let fifo = dir.path().join("fifo");
    integration_tests::user_error::mkfifo(&fifo);
    for (args, needle) in [
        (
            vec!["serve", "--api-socket", precious.to_str().unwrap()],
            "a regular file is there, not a socket a server left",
        ),
        (
            vec!["serve", "--api-socket", fifo.to_str().unwrap()],
            "not a socket a server left",
        ),
        (
            vec!["serve", "--api-socket", sock, "-t", "bogus"],
            "--topology bogus",
        ),
        (
            vec!["serve", "--api-socket", "/nonexistent/dir/s.sock"],
            "is not a directory",
        ),
        (
            vec!["serve", "--api-socket", sock, "--executor", "threads"],
            "one shared scheduler",
        ),
        (
            vec![
                "serve",
                "--api-socket",
                sock,
                "--config",
                bad_cfg.to_str().unwrap(),
            ],
            "unknown field `bogus`",
        ),
        (
            vec![
                "plan",
                "-t",
                "genoa-2s",
                "-g",
                "package:1 l3:1 l2:9 core:1 pu:2",
            ],
            "fits in no host node left",
        ),
        (
            vec![
                "plan",
                "-t",
                "genoa-2s",
                "-g",
                "package:1 l3:1 l2:8 core:1 pu:2",
                "--vms",
                "25",
            ],
            "VM 24 of 25",
        ),
        (vec!["plan", "-g", "x"], "--guest x"),
        (
            vec!["plan", "-g", "package:1 core:1 pu:1", "--relax", "l3"],
            "unknown level",
        ),
    ] {
        let out = run_bounded(&args, Duration::from_secs(60));
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.context());
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {}", out.context());
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "{args:?}: {}",
            out.context()
        );
        assert!(
            lines[0].matches("--api-socket").count() <= 1,
            "the flag named once: {}",
            lines[0]
        );
    }
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    use std::os::unix::fs::FileTypeExt as _;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn config_file_sets_the_executor_and_plan_json_feeds_vm_create() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, "executor = \"host\"\nmetrics_per_vcpu = true\n").unwrap();
    // vmm plan's JSON for this topology, handed to vm.create as the affinity.
    let out = integration_tests::run_bounded::run_bounded(
        &[
            "plan",
            "-t",
            TOPO,
            "-g",
            "package:1 l3:1 l2:1 core:1 pu:2",
            "--vms",
            "2",
            "-f",
            "json",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    let plans: Value = serde_json::from_str(&out.stdout).unwrap();
    let second = plans[1]["cpus"]["affinity"].clone();
    let srv = start(&["--config", cfg.to_str().unwrap()]);
    let sock = srv.sock.clone();
    rt().block_on(async {
        let body = json!({
            "cpus": {"boot_vcpus": 2, "affinity": second, "topology": {"threads_per_core": 2, "cores_per_die": 1, "dies_per_package": 1, "packages": 1}},
        });
        let (s, v) = call(&sock, "PUT", "/api/v1/vm.create", Some(&body.to_string())).await;
        assert_eq!(s, 204, "{v}");
        assert_eq!(call(&sock, "PUT", "/api/v1/vm.boot", None).await.0, 204);
        let (_, v) = call(&sock, "GET", "/api/v1/vm.info", None).await;
        assert_eq!(v["x_vmm"]["executor"], "host");
        assert_eq!(v["config"]["cpus"]["affinity"], second);
        progresses(&sock, "default", 0).await;
        let (_, m) = call_text(&sock, "GET", "/metrics", None).await;
        assert!(m.contains("vmm_vcpu_kvm_exits_total{vm=\"default\",vcpu=\"0\"}"), "{m}");
    });
    drop(srv);
}

#[test]
fn plan_takes_cloud_hypervisor_shape_flags() {
    // 2 packages (a node each) x 4 cores x 2 threads on genoa-2s, whose
    // node 0 is CPUs 0-95 and 192-287.
    let out = integration_tests::run_bounded::run_bounded(
        &[
            "plan",
            "-t",
            "genoa-2s",
            "--packages",
            "2",
            "--numa",
            "--cores-per-die",
            "4",
            "--threads-per-core",
            "2",
            "--vms",
            "3",
            "-f",
            "json",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{}", out.context());
    let plans: Value = serde_json::from_str(&out.stdout).unwrap();
    let node0 = |c: u64| c < 96 || (192..288).contains(&c);
    let mut seen = std::collections::BTreeSet::new();
    for vm in plans.as_array().unwrap() {
        let aff = vm["cpus"]["affinity"].as_array().unwrap();
        assert_eq!(aff.len(), 16);
        for a in aff {
            let (v, c) = (
                a["vcpu"].as_u64().unwrap(),
                a["host_cpus"][0].as_u64().unwrap(),
            );
            assert_eq!(node0(c), v < 8, "vCPU {v} on host CPU {c}");
            assert!(seen.insert(c), "host CPU {c} given twice");
        }
    }
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // fields after the ")" that ends the command name: state is 3rd,
    // utime the 14th and stime the 15th of the whole line
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Reads until EOF or `limit`; how long the server took to close.
fn closed_within(s: &mut std::os::unix::net::UnixStream, limit: Duration) -> Option<Duration> {
    use std::io::Read;
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(_) => return None,
        }
    }
}

/// A metric's value from a scrape.
async fn metric(sock: &Path, key: &str) -> f64 {
    let (s, text) = call_text(sock, "GET", "/metrics", None).await;
    assert_eq!(s, 200, "{text}");
    sample(&samples(&text), key)
}

#[test]
fn out_of_descriptors_the_accept_loop_pauses_and_a_real_client_gets_through() {
    // 48 descriptors: the server starts (KVM, runtime, socket), then the
    // idle connections below use up the rest and accept fails (EMFILE).
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=48:48").arg(vmm_bin());
    let srv = Server::spawn(cmd, TOPO, &[]);
    let sock = srv.sock.clone();
    let idle: Vec<_> = (0..80)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(&sock).ok())
        .collect();
    assert!(idle.len() >= 48, "only {} connections", idle.len());
    std::thread::sleep(Duration::from_millis(500));
    let (c0, t0) = (cpu_seconds(srv.child.id()), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let used = (cpu_seconds(srv.child.id()) - c0) / t0.elapsed().as_secs_f64();
    // A loop that retries accept at once burns a whole CPU (1.0).
    assert!(
        used < 0.3,
        "the server used {used:.2} CPUs while out of descriptors"
    );
    drop(idle);
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ok = tokio::time::timeout(
                Duration::from_secs(1),
                call(&sock, "GET", "/api/v1/vmm.ping", None),
            )
            .await;
            if matches!(ok, Ok((200, _))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no ping answered after the descriptors came back"
            );
        }
        assert!(metric(&sock, "vmm_api_accept_errors_total").await >= 1.0);
    });
}

#[test]
fn stalled_connections_are_closed_and_excess_ones_wait_for_a_slot() {
    use std::io::Write;
    let srv = start(&[]);
    let sock = srv.sock.clone();
    // Headers that never end: closed after the 10 s header timeout,
    // while other clients are served.
    let mut stalled = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    stalled
        .write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    rt().block_on(async {
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
    });
    let took = closed_within(&mut stalled, Duration::from_secs(20));
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(15)),
        "a connection stalled mid-headers was not closed ({took:?})"
    );
    // The cap: with 256 connections open, one more waits (in the
    // socket's backlog) until one of them closes; then it is served.
    let mut held: Vec<_> = (0..256)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    extra
        .write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let answer = |s: &mut std::os::unix::net::UnixStream, limit: Duration| {
        use std::io::Read;
        s.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(_) => String::new(),
        }
    };
    assert_eq!(
        answer(&mut extra, Duration::from_secs(1)),
        "",
        "served over the cap"
    );
    held.pop();
    let got = answer(&mut extra, Duration::from_secs(5));
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    drop(held);
    rt().block_on(async {
        assert_eq!(call(&sock, "GET", "/api/v1/vmm.ping", None).await.0, 200);
        assert!(metric(&sock, "vmm_api_connection_cap_waits_total").await >= 1.0);
    });
}

/// The scheduler's settings from `/metrics`: `vmm_sched_setting` (busy
/// balance, sleeper credit, wakeup preemption) and
/// `vmm_sched_fair_slice_seconds` (latency, min granularity, wakeup
/// granularity, in µs), then `vmm_sched_tick_seconds` and
/// `vmm_halt_poll_seconds` (µs).
async fn sched_settings(sock: &Path) -> [f64; 8] {
    let (s, text) = call_text(sock, "GET", "/metrics", None).await;
    assert_eq!(s, 200, "{text}");
    let m = samples(&text);
    let on = ["busy_balance", "sleeper_credit", "wakeup_preempt"]
        .map(|k| sample(&m, &format!("vmm_sched_setting{{setting=\"{k}\"}}")));
    let us = ["latency", "min_granularity", "wakeup_granularity"].map(|b| {
        (sample(
            &m,
            &format!("vmm_sched_fair_slice_seconds{{bound=\"{b}\"}}"),
        ) * 1e6)
            .round()
    });
    let tick = (sample(&m, "vmm_sched_tick_seconds") * 1e6).round();
    let poll = (sample(&m, "vmm_halt_poll_seconds") * 1e6).round();
    [on[0], on[1], on[2], us[0], us[1], us[2], tick, poll]
}

/// `--sleeper-credit`, `--wakeup-preempt`, `--busy-balance`,
/// `--fair-latency-us`, `--fair-min-granularity-us`,
/// `--fair-slice-scaling`, `--tick-us` and `--halt-poll-us` (flags, or the config file's keys, a flag
/// winning over the file) reach the scheduler every VM shares: its own
/// bounds, exported on `/metrics`, say so. [`TOPO`] has 8 CPUs, so the
/// default scaling multiplies Linux's 6 ms / 0.75 ms / 1 ms by 4.
#[test]
fn scheduler_settings_reach_the_shared_scheduler() {
    let srv = start(&[]);
    let defaults = rt().block_on(sched_settings(&srv.sock));
    assert_eq!(
        defaults,
        [1.0, 0.0, 1.0, 24000.0, 3000.0, 4000.0, 1000.0, 1000.0],
        "{}",
        srv.log()
    );
    drop(srv);
    let srv = start(&[
        "--sleeper-credit",
        "on",
        "--wakeup-preempt",
        "off",
        "--busy-balance",
        "off",
        "--fair-latency-us",
        "12000",
        "--fair-min-granularity-us",
        "1500",
        "--fair-slice-scaling",
        "none",
        "--tick-us",
        "4000",
        "--halt-poll-us",
        "2000",
    ]);
    let flipped = rt().block_on(sched_settings(&srv.sock));
    assert_eq!(
        flipped,
        [0.0, 1.0, 0.0, 12000.0, 1500.0, 1000.0, 4000.0, 2000.0],
        "{}",
        srv.log()
    );
    drop(srv);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("serve.toml");
    std::fs::write(
        &cfg,
        "sleeper_credit = true\nwakeup_preempt = false\nfair_latency_us = 24000\n\
         fair_min_granularity_us = 3000\nfair_slice_scaling = \"none\"\ntick_us = 2000\nhalt_poll_us = 500\n",
    )
    .unwrap();
    let srv = start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--wakeup-preempt",
        "on",
        "--fair-min-granularity-us",
        "2000",
    ]);
    let from_file = rt().block_on(sched_settings(&srv.sock));
    assert_eq!(
        from_file,
        [1.0, 1.0, 1.0, 24000.0, 2000.0, 1000.0, 2000.0, 500.0],
        "{}",
        srv.log()
    );
}

/// The busy balance, sleeper credit, wakeup preemption, the fair slice
/// bounds, the tick and the halt poller's period are settings of the shared scheduler: with `--executor host` (flag or config file)
/// `vmm serve` refuses any value the host executor cannot honour, naming
/// the setting, before it listens.
#[test]
fn scheduler_settings_are_refused_on_the_host_executor() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let sock_s = sock.to_str().unwrap();
    for (key, value) in [
        ("busy_balance", "on"),
        ("sleeper_credit", "on"),
        ("wakeup_preempt", "off"),
        ("fair_latency_us", "12000"),
        ("fair_min_granularity_us", "1500"),
        ("fair_slice_scaling", "none"),
        ("tick_us", "4000"),
        ("halt_poll_us", "2000"),
    ] {
        let cfg = dir.path().join(format!("{key}.toml"));
        let toml_value = match value {
            "on" | "off" => (value == "on").to_string(),
            "none" => format!("\"{value}\""),
            n => n.to_string(),
        };
        std::fs::write(&cfg, format!("executor = \"host\"\n{key} = {toml_value}\n")).unwrap();
        let flag = format!("--{}", key.replace('_', "-"));
        for extra in [
            vec!["--config", cfg.to_str().unwrap()],
            vec!["--executor", "host", &flag, value],
        ] {
            let mut args = vec!["serve", "--api-socket", sock_s];
            args.extend(extra);
            let out = integration_tests::run_bounded::run_bounded(&args, Duration::from_secs(60));
            assert_eq!(out.code, Some(2), "{}", out.context());
            assert!(
                out.stderr
                    .contains(&format!("{key}: a setting of vcpu_sched")),
                "{}",
                out.context()
            );
            assert!(!sock.exists(), "it listened");
        }
    }
}
