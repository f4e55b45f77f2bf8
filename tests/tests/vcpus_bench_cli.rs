//! `vmm bench` from the command line: a run prints its summary and writes
//! JSON; bad input is one line on stderr and exit status 2.

use integration_tests::vmm_bin;

fn vmm(args: &[&str]) -> std::process::Output {
    std::process::Command::new(vmm_bin())
        .args(args)
        .output()
        .expect("run vmm")
}

/// A short cyclic run of 1 VM x `vcpus` vCPUs with `flag` (a flag and
/// its value) if any: its JSON report.
fn cyclic_report(dir: &std::path::Path, vcpus: &str, flag: Option<[&str; 2]>) -> serde_json::Value {
    let json = dir.join(format!(
        "{}.json",
        flag.map_or_else(|| "default".to_string(), |f| f.concat())
    ));
    let mut args = vec![
        "bench",
        "cyclic",
        "--vms",
        "1",
        "--vcpus",
        vcpus,
        "--duration",
        "0.3",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend(flag.iter().flatten());
    let o = vmm(&args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// One `vmm bench WORKLOAD --vms VMS --vcpus VCPUS --reps 2` comparison
/// along `flag` (`--compare-kicks`, ...): checks its table against
/// `labels` (the baseline, its A/A row, the other value) and returns the
/// six reports.
fn axis_comparison(
    workload: &str,
    (vms, vcpus): (&str, &str),
    duration: &str,
    flag: &str,
    labels: &[&str],
) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let o = vmm(&[
        "bench",
        workload,
        "--vms",
        vms,
        "--vcpus",
        vcpus,
        "--duration",
        duration,
        flag,
        "--reps",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    integration_tests::comparison::check_comparison(&v, labels, 2);
    let reports = v["reports"].as_array().unwrap().clone();
    assert_eq!(reports.len(), 6, "{v}");
    reports
}

/// Each of `cases` is refused: exit 2, its message on stderr.
fn refused(cases: &[(Vec<&str>, &str)]) {
    for (args, msg) in cases {
        let o = vmm(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

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

/// `--compare-kicks`: eager kicks (baseline and A/A) against lazy ones,
/// all fixes on the workers, interleaved; every report says which
/// protocol ran it, and only lazy rows defer wakeups.
#[test]
fn kick_protocols_compare_interleaved() {
    let reports = axis_comparison(
        "messaging",
        ("2", "2"),
        "0.3",
        "--compare-kicks",
        &["eager kicks", "eager kicks (A/A)", "lazy kicks"],
    );
    for r in &reports {
        assert_eq!(r["run"]["mitigations"], "all");
        let deferred = r["run"]["counters"]["wake_deferred"].as_u64().unwrap();
        match r["kicks"].as_str().unwrap() {
            "eager" => assert_eq!(deferred, 0, "an eager run deferred wakeups"),
            "lazy" => {}
            k => panic!("kicks {k:?}"),
        }
    }
    assert_eq!(
        reports.iter().filter(|r| r["kicks"] == "lazy").count(),
        2,
        "{reports:?}"
    );
    refused(&[
        (
            vec!["bench", "runq", "--executor", "host", "--kicks", "eager"],
            "--kicks",
        ),
        (
            vec!["bench", "runq", "--executor", "host", "--compare-kicks"],
            "--compare-kicks",
        ),
        (
            vec!["bench", "runq", "--kicks", "sometimes"],
            "lazy or eager",
        ),
        (
            vec!["bench", "runq", "--executor", "host", "--sleeper-credit"],
            "--sleeper-credit",
        ),
        (
            vec!["bench", "runq", "--executor", "host", "--no-wakeup-preempt"],
            "--no-wakeup-preempt",
        ),
        (
            vec![
                "bench",
                "runq",
                "--executor",
                "host",
                "--slices-follow-load",
            ],
            "--slices-follow-load",
        ),
        (
            vec![
                "bench",
                "runq",
                "--executor",
                "host",
                "--busy-balance",
                "on",
            ],
            "--busy-balance",
        ),
        (
            vec!["bench", "runq", "--compare-kicks", "--compare", "seeds"],
            "--compare",
        ),
        (
            vec!["bench", "cyclic", "--executor", "host", "--rt-pull", "wait"],
            "--rt-pull",
        ),
        (
            vec!["bench", "cyclic", "--rt-pull", "spin"],
            "bounded (pass a busy source by, the default) or wait",
        ),
    ]);
}

/// `--timer-advance`: each report records whether the workers parked
/// ahead of the vCPUs' timers (on by default) and what polling cost them
/// (`timer_spin_ms_per_cpu`; none with it off).
#[test]
fn timer_advance_is_chosen_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, want) in [(None, "on"), (Some("off"), "off"), (Some("on"), "on")] {
        let v = cyclic_report(dir.path(), "2", flag.map(|f| ["--timer-advance", f]));
        assert_eq!(v["timer_advance"], want, "{flag:?}");
        let spin = v["run"]["extra"]["timer_spin_ms_per_cpu"].as_f64();
        assert!(spin.is_some_and(|s| s >= 0.0), "{flag:?}: {spin:?}");
        if want == "off" {
            assert_eq!(spin, Some(0.0), "{flag:?}: polled with the advance off");
        }
    }
}

/// `--fair-slice-scaling` and `--compare-fair-slice-scaling`: each report
/// records the fair bounds it ran with, Linux's 6 ms / 0.75 ms times 1 +
/// log2(min(CPUs, 8)) by default (`log`), as given with `none`; a setting
/// the host executor cannot honour, or an unknown one, is refused.
#[test]
fn fair_slice_bounds_are_scaled_and_recorded() {
    let check = |v: &serde_json::Value, want: &str| {
        assert_eq!(v["fair_slice_scaling"], want);
        let cpus = v["run"]["cpus"].as_u64().unwrap();
        let factor = match want {
            "none" => 1,
            _ => 1 + cpus.clamp(1, 8).ilog2() as u64,
        };
        assert_eq!(
            v["fair_slice_ns"],
            serde_json::json!([6_000_000 * factor, 750_000 * factor]),
            "{want} on {cpus} CPUs"
        );
    };
    let dir = tempfile::tempdir().unwrap();
    check(&cyclic_report(dir.path(), "2", None), "log");
    let v = cyclic_report(dir.path(), "2", Some(["--fair-slice-scaling", "none"]));
    check(&v, "none");
    let reports = axis_comparison(
        "runq",
        ("2", "2"),
        "0.3",
        "--compare-fair-slice-scaling",
        &[
            "unscaled slices",
            "unscaled slices (A/A)",
            "log-scaled slices",
        ],
    );
    let mut scaled = 0;
    for r in &reports {
        let want = r["fair_slice_scaling"].as_str().unwrap();
        scaled += usize::from(want == "log");
        check(r, want);
    }
    assert_eq!(scaled, 2, "{reports:?}");
    refused(&[
        (
            vec![
                "bench",
                "cyclic",
                "--executor",
                "host",
                "--fair-slice-scaling",
                "none",
            ],
            "fair_slice_scaling: a setting of vcpu_sched",
        ),
        (
            vec!["bench", "cyclic", "--fair-slice-scaling", "linear"],
            "give log",
        ),
        (
            vec![
                "bench",
                "runq",
                "--executor",
                "host",
                "--compare-fair-slice-scaling",
            ],
            "--compare-fair-slice-scaling",
        ),
        (
            vec![
                "bench",
                "runq",
                "--compare-fair-slice-scaling",
                "--fair-slice-scaling",
                "log",
            ],
            "--fair-slice-scaling",
        ),
    ]);
}

/// `--tick-us`: the scheduler's tick period reaches the executor and
/// the report. runq at 4 vCPUs per CPU keeps each CPU's runqueue busy, so
/// at the default 1 ms tick the ticks that take the runqueue lock
/// (`ticks_slow`) run to hundreds; at a 100 ms tick there cannot be more
/// than one per CPU per 100 ms of the whole process's life. Refused with
/// the host executor and out of range.
#[test]
fn tick_period_is_chosen_and_recorded() {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let vcpus = (4 * cpus).min(256).to_string();
    let dir = tempfile::tempdir().unwrap();
    let run = |tick: Option<&str>| {
        let json = dir
            .path()
            .join(format!("tick-{}.json", tick.unwrap_or("default")));
        let mut args = vec![
            "bench",
            "runq",
            "--vms",
            "1",
            "--vcpus",
            &vcpus,
            "--duration",
            "0.5",
            "--json",
        ];
        let path = json.to_str().unwrap().to_string();
        args.push(&path);
        if let Some(t) = tick {
            args.extend(["--tick-us", t]);
        }
        let t0 = std::time::Instant::now();
        let o = vmm(&args);
        let secs = t0.elapsed().as_secs_f64();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (v, secs)
    };
    let (fast, _) = run(None);
    let (slow, secs) = run(Some("100000"));
    assert_eq!(fast["tick_ns"], 1_000_000, "{fast}");
    assert_eq!(slow["tick_ns"], 100_000_000, "{slow}");
    let slow_ticks = |v: &serde_json::Value| v["run"]["counters"]["ticks_slow"].as_u64().unwrap();
    let bound = (cpus as f64 * (secs / 0.1 + 2.0)) as u64;
    assert!(
        slow_ticks(&slow) <= bound,
        "{} slow ticks at a 100 ms tick in {secs:.1} s on {cpus} CPUs",
        slow_ticks(&slow)
    );
    assert!(
        slow_ticks(&fast) > bound,
        "only {} slow ticks at the 1 ms tick: the check above would say nothing",
        slow_ticks(&fast)
    );
    refused(&[
        (
            vec!["bench", "runq", "--executor", "host", "--tick-us", "4000"],
            "tick_us: a setting of vcpu_sched",
        ),
        (vec!["bench", "runq", "--tick-us", "50"], "--tick-us"),
    ]);
}

/// `--compare-busy-balance`: the busy balance off (baseline and A/A)
/// against on, all fixes on the workers, interleaved; every report says
/// which setting ran it, and rows with it off never push. (runq at 4
/// vCPUs per CPU: whether the rows with it on push at all depends on an
/// excess of CPU-bound vCPUs lasting 100 ms, which these vCPUs, blocking
/// between requests, rarely build; `core_tests` checks the push itself.)
#[test]
fn busy_balance_compares_interleaved() {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let vcpus = (2 * cpus).min(256).to_string();
    let reports = axis_comparison(
        "runq",
        ("2", &vcpus),
        "0.5",
        "--compare-busy-balance",
        &["no busy balance", "no busy balance (A/A)", "busy balance"],
    );
    let mut runs_on = 0;
    for r in &reports {
        assert_eq!(r["run"]["mitigations"], "all");
        let pushes = r["run"]["counters"]["busy_pushes"].as_u64().unwrap();
        if r["busy_balance"].as_bool().unwrap() {
            runs_on += 1;
        } else {
            assert_eq!(pushes, 0, "a run without the busy balance pushed");
        }
    }
    assert_eq!(runs_on, 2, "{reports:?}");
    // a single run: off by default, and recorded
    let dir = tempfile::tempdir().unwrap();
    for (flag, want) in [(None, false), (Some("off"), false), (Some("on"), true)] {
        let v = cyclic_report(dir.path(), "2", flag.map(|f| ["--busy-balance", f]));
        assert_eq!(v["busy_balance"], want, "{flag:?}");
    }
    refused(&[
        (
            vec![
                "bench",
                "runq",
                "--executor",
                "host",
                "--compare-busy-balance",
            ],
            "--compare-busy-balance",
        ),
        (
            vec![
                "bench",
                "runq",
                "--compare-busy-balance",
                "--busy-balance",
                "off",
            ],
            "--busy-balance",
        ),
        (
            vec!["bench", "runq", "--busy-balance", "sometimes"],
            "not a busy balance setting",
        ),
        (
            vec!["bench", "runq", "--compare-busy-balance", "--compare-kicks"],
            "--compare",
        ),
    ]);
}

/// `--rt-pull`: each report records the RT pull protocol it ran (bounded
/// by default), and a waiting pull never passes a busy source by.
#[test]
fn rt_pull_protocol_is_chosen_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    // 4 FIFO vCPUs per CPU (an even number, at most 256): RT overload
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let vcpus = (4 * cpus).min(256).to_string();
    for (flag, want) in [
        (None, "bounded"),
        (Some("wait"), "wait"),
        (Some("bounded"), "bounded"),
    ] {
        let v = cyclic_report(dir.path(), &vcpus, flag.map(|f| ["--rt-pull", f]));
        assert_eq!(v["rt_pull"], want, "{flag:?}");
        let c = &v["run"]["counters"];
        assert!(
            c["rt_pulls"].as_u64().unwrap() > 0,
            "{flag:?}: no RT pull ran: {c}"
        );
        if want == "wait" {
            assert_eq!(c["rt_pull_busy"], 0, "{flag:?}: {c}");
        }
    }
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
