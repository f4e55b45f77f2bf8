//! `vmm sched-bench` through the real binary: a checked run and a two-set
//! comparison produce the table and JSON a user reads; bad requests get one
//! line and exit status 2.

use std::time::Duration;

use integration_tests::guest::{assert_input_error, run_vmm, VmmRun};

fn run(args: &[&str]) -> VmmRun {
    run_vmm(args, Duration::from_secs(300))
}

#[test]
fn bad_requests_name_the_problem() {
    assert_input_error(
        &run(&["sched-bench", "hackbench"]),
        &["unknown workload", "messaging"],
    );
    assert_input_error(
        &run(&["sched-bench", "runq", "--topology", "package:two"]),
        &["--topology"],
    );
    assert_input_error(
        &run(&["sched-bench", "runq", "--mitigations", "only:turbo"]),
        &["turbo", "l2wake"],
    );
    assert_input_error(
        &run(&["sched-bench", "runq", "--compare", "all"]),
        &["at least two"],
    );
    assert_input_error(
        &run(&["sched-bench", "runq", "--duration", "0"]),
        &["--duration"],
    );
    assert_input_error(
        &run(&["sched-bench", "cyclic", "--prio", "120"]),
        &["1..=99"],
    );
}

#[test]
fn checked_run_on_emulated_genoa_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let r = run(&[
        "sched-bench",
        "messaging",
        "--topology",
        "genoa-2s",
        "--mitigations",
        "all",
        "--duration",
        "0.5",
        "--check",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert!(
        r.console.contains("messaging on genoa-2s [all]") && r.console.contains("384 CPUs"),
        "{}",
        r.context()
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["cpus"], 384);
    assert!(v["metric"]["value"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["checks"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["violations"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn comparison_prints_the_seeds_table() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let r = run(&[
        "sched-bench",
        "runq",
        "--compare",
        "none;only:l2wake;all",
        "--reps",
        "2",
        "--duration",
        "0.3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    for row in ["none (A/A)", "only:l2wake", "all", "noise band", "100.0%"] {
        assert!(r.console.contains(row), "missing {row}: {}", r.context());
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    integration_tests::comparison::check_comparison(
        &v,
        &["none", "none (A/A)", "only:l2wake", "all"],
        2,
    );
    // every run's report rides along: 4 rows x 2 repetitions
    assert_eq!(v["runs"].as_array().map(|r| r.len()), Some(8), "{v}");
}

/// The same workload on every executor: the M:N workers (checked), and
/// plain host threads, the peer; the JSON names the executor. The host
/// executor has no scheduler, so a set, a comparison or the checker is
/// refused with it.
#[test]
fn every_executor_runs_the_workload_and_the_host_refuses_scheduler_flags() {
    let dir = tempfile::tempdir().unwrap();
    for (exec, label, extra) in [
        ("workers", "[all, workers]", &["--check"][..]),
        ("host", "[host 1:1]", &[][..]),
    ] {
        let json = dir.path().join(format!("{exec}.json"));
        let mut args = vec![
            "sched-bench",
            "runq",
            "--executor",
            exec,
            "--duration",
            "0.4",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let r = run(&args);
        assert_eq!(r.status, Some(0), "{exec}: {}", r.context());
        assert!(
            r.console.contains(&format!("runq on host {label}")),
            "{exec}: {}",
            r.context()
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["executor"], exec, "{exec}");
        assert!(v["metric"]["value"].as_f64().unwrap() > 0.0, "{exec}: {v}");
    }
    for flag in [
        &["--check"][..],
        &["--mitigations", "all"],
        &["--compare", "seeds"],
    ] {
        let mut args = vec!["sched-bench", "runq", "--executor", "host"];
        args.extend_from_slice(flag);
        assert_input_error(&run(&args), &[flag[0], "--executor host"]);
    }
    assert_input_error(
        &run(&["sched-bench", "runq", "--executor", "m:n"]),
        &["unknown executor", "workers"],
    );
}
