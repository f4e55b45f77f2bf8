//! `vmm bench` from the command line: a run prints its summary and writes
//! JSON; a comparison has its A/A and host rows, the executors compare on
//! one interleaved set; the breakdown splits every wakeup into stages;
//! `--pin` keeps each vCPU on a CPU of its own; bad input is one line on
//! stderr and exit status 2. The scheduler's settings and protocols are
//! in `vcpus_bench_settings.rs`.

use integration_tests::vmm;

#[test]
fn a_run_prints_metrics_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = vmm(&[
        "bench",
        "runq",
        "--vms",
        "2",
        "--vcpus",
        "4",
        "--duration",
        "0.3",
        "--check",
        "--per-vcpu",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("requests_per_s"), "{out}");
    assert!(out.contains("scheduler overhead per CPU"), "{out}");
    assert!(out.contains("vm1/vcpu3"), "per-vCPU lines: {out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["per_vcpu"].as_array().map(|a| a.len()), Some(8));
    assert_eq!(v["run"]["workload"], "runq");
}

#[test]
fn a_small_comparison_has_the_aa_and_host_rows() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let o = vmm(&[
        "bench",
        "messaging",
        "--vms",
        "2",
        "--vcpus",
        "2",
        "--duration",
        "0.2",
        "--compare",
        "none;all",
        "--reps",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for row in ["none (A/A)", "all", "host 1:1", "relative", "noise band"] {
        assert!(out.contains(row), "no {row:?} in {out}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = integration_tests::comparison::check_comparison(
        &v,
        &["none", "none (A/A)", "all", "host 1:1"],
        2,
    );
    assert_eq!(rows[2]["kind"], "variant");
    assert_eq!(rows[3]["kind"], "peer");
    assert_eq!(v["reports"].as_array().map(|r| r.len()), Some(8), "{v}");
}

/// `--compare-executors`: the same set on the workers (baseline and A/A),
/// on the threads executor and on host 1:1 threads, interleaved; every
/// report says which executor ran it.
#[test]
fn executors_compare_with_the_same_set_interleaved() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("e.json");
    let o = vmm(&[
        "bench",
        "runq",
        "--vms",
        "1",
        "--vcpus",
        "4",
        "--duration",
        "0.2",
        "--compare-executors",
        "--reps",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = integration_tests::comparison::check_comparison(
        &v,
        &["all", "all (A/A)", "all on threads", "host 1:1"],
        2,
    );
    assert_eq!(rows[2]["kind"], "variant");
    let execs: Vec<String> = v["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["executor"].as_str().unwrap().to_string())
        .collect();
    // a warm-up run is not reported; 4 rows x 2 repetitions are
    assert_eq!(execs.len(), 8, "{execs:?}");
    for (e, n) in [("workers", 4), ("threads", 2), ("host", 2)] {
        assert_eq!(execs.iter().filter(|x| *x == e).count(), n, "{execs:?}");
    }
    // the host kernel's executor has nothing to compare with itself
    let o = vmm(&["bench", "runq", "--executor", "host", "--compare-executors"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--compare-executors"));
    let o = vmm(&["bench", "runq", "--compare-executors", "--compare", "seeds"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn bad_input_exits_2_with_one_line() {
    for (args, msg) in [
        (vec!["bench", "nosuch"], "unknown workload"),
        (vec!["bench", "messaging", "--vcpus", "3"], "even --vcpus"),
        (vec!["bench", "pingpong", "--vcpus", "3"], "even --vcpus"),
        (
            vec![
                "bench",
                "cyclic",
                "--executor",
                "threads",
                "--timer-advance",
                "off",
            ],
            "--timer-advance",
        ),
        (
            vec!["bench", "cyclic", "--timer-advance", "sometimes"],
            "not a timer advance setting",
        ),
        (vec!["bench", "runq", "--vcpus", "1"], "at least one worker"),
        (
            vec!["bench", "cyclic", "--topology", "no-such-machine"],
            "--topology",
        ),
        (
            vec!["bench", "cyclic", "--executor", "fibers"],
            "unknown executor",
        ),
        (
            vec!["bench", "cyclic", "--mitigations", "only:nope"],
            "--mitigations",
        ),
        (vec!["bench", "cyclic", "--duration", "0"], "--duration"),
        (vec!["bench", "cyclic", "--vms", "0"], "--vms"),
        (vec!["bench", "cyclic", "--prio", "0"], "priority"),
        (
            vec![
                "bench",
                "cyclic",
                "--topology",
                "package:1 core:2 pu:1",
                "--vcpus",
                "4",
                "--pin",
            ],
            "do not fit on the 2 CPUs",
        ),
    ] {
        let o = vmm(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn breakdown_splits_every_wakeup_into_stages() {
    // messaging (doorbells) on the workers and the host executor, cyclic
    // (timers) on workers: the first stage of each wakeup has samples,
    // only an executor with a pick of its own (workers) fills the
    // pick -> KVM_RUN stage, and the block path's parts.
    for (workload, executor, kind) in [
        ("messaging", "workers", "doorbell"),
        ("messaging", "host", "doorbell"),
        ("cyclic", "workers", "timer"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        let mut args = vec![
            "bench",
            workload,
            "--vms",
            "2",
            "--vcpus",
            "2",
            "--duration",
            "0.4",
            "--executor",
            executor,
            // 2 CPUs whatever the host has: 4 vCPUs overcommit them
            "--topology",
            "package:1 core:2 pu:1",
            "--breakdown",
            "--json",
        ];
        args.push(json.to_str().unwrap());
        if workload == "cyclic" {
            args.push("--no-host-rt");
        }
        let o = vmm(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("wakeup breakdown"), "{out}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let rows = v["breakdown"].as_array().expect("breakdown rows");
        assert_eq!(rows.len(), vmm_machine::vcpu_body::STAGES.len(), "{v}");
        let stage = |name: &str| {
            rows.iter()
                .find(|r| r["stage"].as_str().unwrap().starts_with(name))
                .unwrap_or_else(|| panic!("no stage {name}"))
        };
        let first = stage(&format!("{kind}: "));
        assert!(
            first["count"].as_u64().unwrap() > 10,
            "{executor} {workload}: {first}"
        );
        let sum: f64 = rows
            .iter()
            .filter(|r| r["stage"].as_str().unwrap().starts_with(kind))
            .map(|r| r["mean_ns"].as_f64().unwrap())
            .sum();
        assert!(sum > 0.0, "{executor} {workload}: {rows:?}");
        // executors with a pick of their own fill the pick -> KVM_RUN stage
        let enter = stage(&format!("{kind}: picked")).clone();
        assert_eq!(
            enter["count"].as_u64().unwrap() > 0,
            executor == "workers",
            "{executor} {workload}: {enter}"
        );
        // the block path: on workers each switch after a block has all
        // three parts and the total (4 vCPUs on 2 CPUs: a CPU often has
        // another vCPU waiting); the host
        // executor sees the total only
        let count = |name: &str| stage(name)["count"].as_u64().unwrap();
        let total = count("block: exit -> next");
        let parts = [
            count("block: exit -> schedule"),
            count("block: schedule"),
            count("block: picked"),
        ];
        if executor == "workers" && workload == "messaging" {
            assert!(total > 0, "{executor} {workload}: {rows:?}");
        }
        if executor == "workers" {
            assert_eq!(parts, [total; 3], "{executor} {workload}: {rows:?}");
        } else {
            assert_eq!(parts, [0; 3], "{executor} {workload}: {rows:?}");
        }
    }
    // a single run only
    let o = vmm(&["bench", "runq", "--compare", "seeds", "--breakdown"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--breakdown"));
}

#[test]
fn pin_keeps_every_vcpu_on_its_own_cpu() {
    // runq on 4 emulated CPUs: unpinned, its 4 vCPUs migrate (tens of
    // times in 0.5 s here); pinned, none moves
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = vmm(&[
        "bench",
        "runq",
        "--topology",
        "package:1 core:4 pu:1",
        "--vms",
        "1",
        "--vcpus",
        "4",
        "--duration",
        "0.5",
        "--pin",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["per_vcpu"].as_array().expect("per-vCPU rows");
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(r["migrations"], 0, "{r}");
        assert!(r["entries"].as_u64().unwrap() > 0, "{r}");
    }
}
