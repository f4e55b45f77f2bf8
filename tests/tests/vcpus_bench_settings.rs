//! `vmm bench`'s scheduler settings and protocols: each is chosen by its
//! flag, recorded in the JSON report, refused where it cannot apply, and
//! where it has a `--compare-*` axis, compared interleaved with an A/A
//! row (kick protocols, busy balance). Timer advance, the fair slice's
//! bounds and their scaling, the tick period and the RT pull protocol.

use integration_tests::bench::{axis_comparison, cyclic_report, refused};
use integration_tests::vmm;

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
