//! `vmm serve`'s and `vmm plan`'s input: bad flags and files refused in one
//! line with exit 2, the config file, Cloud Hypervisor's shape flags, and
//! the scheduler's settings reaching the one scheduler every VM shares
//! (and refused on the host executor). Each test starts its own server
//! (see `serve_api.rs`).

use std::path::Path;
use std::time::Duration;

use integration_tests::serve::{call, call_text, progresses, rt, sample, samples, start, TOPO};
use serde_json::{json, Value};

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
/// bounds, the tick, the halt poller's period and halt parking are settings of the shared scheduler: with `--executor host` (flag or config file)
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
        ("halt_park", "on"),
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
