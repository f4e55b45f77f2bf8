//! `vmm sim` through the real binary on a 16-CPU topology: a comparison
//! writes the shared comparison JSON with real numbers, the same seed gives
//! the same bytes, a sweep writes an SVG and a CSV, and bad requests get one
//! line and exit status 2. `vmm sim` runs the `vmm-sim` binary beside
//! `vmm`: its help is the simulator's, and without it `vmm sim` says how to
//! build it.

use std::time::Duration;

use integration_tests::comparison::check_comparison;
use integration_tests::guest::{assert_input_error, run_vmm, VmmRun};

const TOPO: &str = "package:2 l3:1 l2:4 core:1 pu:2";

fn run(args: &[&str]) -> VmmRun {
    run_vmm(args, Duration::from_secs(300))
}

#[test]
fn bad_requests_name_the_problem() {
    assert_input_error(
        &run(&["sim", "hackbench", "--topology", "icx-2s"]),
        &["messaging"],
    );
    assert_input_error(&run(&["sim", "cyclic", "--topology", TOPO]), &["--costs"]);
    assert_input_error(
        &run(&["sim", "cyclic", "--topology", "package:two"]),
        &["--topology"],
    );
    assert_input_error(
        &run(&["sim", "cyclic", "--topology", "icx-2s", "--compare", "all"]),
        &["at least two"],
    );
    assert_input_error(
        &run(&[
            "sim",
            "cyclic",
            "--topology",
            "icx-2s",
            "--sweep",
            "cpus=4,999",
        ]),
        &["999"],
    );
    assert_input_error(
        &run(&[
            "sim",
            "cyclic",
            "--topology",
            "icx-2s",
            "--latency-scale",
            "0",
        ]),
        &["--latency-scale"],
    );
    assert_input_error(
        &run(&["sim", "cyclic", "--topology", "icx-2s", "--burst-us", "0"]),
        &["--burst-us"],
    );
    assert_input_error(
        &run(&["sim", "pingpong", "--topology", "icx-2s", "--vcpus", "3"]),
        &["--vcpus 3", "even"],
    );
    assert_input_error(
        &run(&["sim", "messaging", "--topology", "icx-2s", "--vcpus", "1"]),
        &["--vcpus 1", "sender"],
    );
    assert_input_error(
        &run(&["sim", "runq", "--topology", "icx-2s", "--vcpus", "1"]),
        &["--vcpus 1", "message task"],
    );
    assert_input_error(
        &run(&["sim", "schbenchx", "--topology", "icx-2s"]),
        &["schbenchx", "runq"],
    );
    assert_input_error(
        &run(&[
            "sim",
            "cyclic",
            "--topology",
            "icx-2s",
            "--interleave",
            "--arbitration",
            "random",
        ]),
        &["random", "nearest", "fifo"],
    );
    // the rule only means something when calls interleave
    assert_input_error(
        &run(&[
            "sim",
            "cyclic",
            "--topology",
            "icx-2s",
            "--arbitration",
            "fifo",
        ]),
        &["--interleave"],
    );
}

#[test]
fn comparison_json_is_real_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let args = [
        "sim",
        "pingpong",
        "--topology",
        TOPO,
        "--costs",
        "icx-2s",
        "--duration",
        "10ms",
        "--compare",
        "none;all",
        "--c2c",
        "--lockstat",
        "--json",
        json.to_str().unwrap(),
    ];
    let a = run(&args);
    assert_eq!(a.status, Some(0), "{}", a.context());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = check_comparison(&v, &["none", "none (A/A)", "all"], 1);
    for r in &rows {
        // 8 pairs with 5 us of work per step: some thousands of
        // transactions per second each, far from zero and below the bound
        // of work alone (8 pairs x 1e9 / (2 x 3.75 us) = 2.1M/s)
        let m = r["mean"].as_f64().unwrap();
        assert!(m > 10_000.0 && m < 2_200_000.0, "{r}");
        assert!(r["sched_ns_per_call"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(a.console.contains("c2c [none]"), "{}", a.context());
    assert!(a.console.contains("rq.lock+queues"), "{}", a.context());
    assert!(a.console.contains("lockstat [all]"), "{}", a.context());
    // the same seed gives the same table, byte for byte (vmm never
    // replaces a result file: the first run's JSON goes first)
    std::fs::remove_file(&json).unwrap();
    let b = run(&args);
    assert_eq!(b.status, Some(0), "{}", b.context());
    assert_eq!(a.console, b.console);
}

#[test]
fn sweep_writes_svg_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("s.svg");
    let r = run(&[
        "sim",
        "messaging",
        "--topology",
        TOPO,
        "--costs",
        "spr-2s",
        "--duration",
        "5ms",
        "--vcpus",
        "4",
        "--compare",
        "none;all",
        "--sweep",
        "cpus=4,16",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("polyline"), "{s}");
    let csv = std::fs::read_to_string(svg.with_extension("csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "cpus,mitigations,metric,sched_share");
    // one row per size and set: 4 and 16 CPUs x none and all
    assert_eq!(lines.len(), 5, "{csv}");
    for l in &lines[1..] {
        let metric: f64 = l.split(',').nth(2).unwrap().parse().unwrap();
        assert!(metric > 0.0, "{l}");
    }
}

#[test]
fn vmm_sim_is_the_simulators_binary() {
    // vmm's own help lists the subcommand
    let top = run(&["--help"]);
    assert_eq!(top.status, Some(0), "{}", top.context());
    assert!(top.console.contains("\n  sim "), "{}", top.context());
    // `vmm sim --help` is the simulator's, speaking as `vmm sim`
    let help = run(&["sim", "--help"]);
    assert_eq!(help.status, Some(0), "{}", help.context());
    for want in [
        "Usage: vmm sim",
        "--topology",
        "--sweep",
        "--lockstat",
        "-v, --verbose",
    ] {
        assert!(help.console.contains(want), "{want}:\n{}", help.context());
    }
    // -v before `sim` is passed on, and the simulator takes it
    let v = run(&[
        "-v",
        "sim",
        "cyclic",
        "--topology",
        "icx-2s",
        "--burst-us",
        "0",
    ]);
    assert_input_error(&v, &["--burst-us"]);
    // a clap usage error of the simulator's: its status, 2
    let bad = run(&["sim", "cyclic", "--topology", "icx-2s", "--no-such-flag"]);
    assert_eq!(bad.status, Some(2), "{}", bad.context());
    assert!(bad.stderr.contains("--no-such-flag"), "{}", bad.context());
}

#[test]
fn vmm_sim_without_its_binary_says_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("vmm");
    std::fs::copy(integration_tests::vmm_bin(), &lone).unwrap();
    let out = std::process::Command::new(&lone)
        .args(["sim", "cyclic", "--topology", "icx-2s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("vmm-sim") && err.contains("cargo build"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `--interleave` through the binary: RT vCPUs overcommitted 2x on 32
/// CPUs, where idle CPUs pull at once; interleaved, a puller finds a
/// source claimed by another, passes it by and asks it to push, and the
/// report says what interleaving did. The same seed gives the same bytes.
#[test]
fn interleaved_run_shows_pass_bys_and_push_requests() {
    let args = [
        "sim",
        "transcode",
        "--topology",
        "package:2 l3:1 l2:8 core:1 pu:2",
        "--costs",
        "icx-2s",
        "--vms",
        "8",
        "--burst-us",
        "20",
        "--duration",
        "5ms",
        "-m",
        "all",
        "--interleave",
    ];
    let a = run(&args);
    assert_eq!(a.status, Some(0), "{}", a.context());
    for want in ["balance_passed_by ", "push_requests ", "  interleaved: "] {
        assert!(a.console.contains(want), "{want}: {}", a.context());
    }
    let b = run(&args);
    assert_eq!(a.console, b.console);
}

/// `--costs FILE.toml`: a table read from a file by field name drives the
/// model exactly as the preset it copies does (same output bytes), a
/// table with other costs gives other numbers, and a bad file is refused
/// with what is wrong.
#[test]
fn a_cost_table_file_drives_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let icx = "l1_hit_ns = 2\nsmt_ns = 8\nl2_ns = 8\nllc_ns = 51\ndie_ns = 51\n\
               package_ns = 51\nremote_ns = 108\nmemory_ns = 107\nmlp = 12\n\
               lock_spin_ns = 5600\nfutex_wake_ns = 240\nwakeup_ns = 1070\n";
    let file = dir.path().join("icx.toml");
    std::fs::write(&file, icx).unwrap();
    let slow = dir.path().join("slow.toml");
    std::fs::write(
        &slow,
        icx.replace("llc_ns = 51", "llc_ns = 400")
            .replace("remote_ns = 108", "remote_ns = 900"),
    )
    .unwrap();
    let sim = |costs: &str| {
        let r = run(&[
            "sim",
            "messaging",
            "--topology",
            TOPO,
            "--costs",
            costs,
            "--duration",
            "5ms",
        ]);
        assert_eq!(r.status, Some(0), "{}", r.context());
        r.console
    };
    let preset = sim("icx-2s");
    assert_eq!(sim(file.to_str().unwrap()), preset);
    assert_ne!(sim(slow.to_str().unwrap()), preset);

    let bad = |name: &str, text: &str, want: &[&str]| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let r = run(&[
            "sim",
            "cyclic",
            "--topology",
            TOPO,
            "--costs",
            p.to_str().unwrap(),
        ]);
        assert_input_error(&r, want);
    };
    bad("typo.toml", &icx.replace("llc_ns", "llc_nss"), &["llc_nss"]);
    bad("short.toml", &icx.replace("mlp = 12\n", ""), &["mlp"]);
    bad(
        "zero.toml",
        &icx.replace("mlp = 12", "mlp = 0"),
        &["mlp = 0"],
    );
    bad("text.toml", "llc_ns = fast\n", &["not a cost table"]);
    // a path that is not a readable regular file
    let refused = |path: &str, want: &[&str]| {
        assert_input_error(
            &run(&["sim", "cyclic", "--topology", TOPO, "--costs", path]),
            want,
        )
    };
    let missing = dir.path().join("none.toml");
    refused(missing.to_str().unwrap(), &["cannot read"]);
    // not a regular file (a FIFO or /dev/zero would hang or fill memory)
    let sub = dir.path().join("tables.toml");
    std::fs::create_dir(&sub).unwrap();
    refused(sub.to_str().unwrap(), &["not a regular file"]);
    refused("/dev/zero", &["not a regular file"]);
}

/// `--idle-states`: `off` is the presets' default (same bytes as without
/// the flag); `c1` charges the part's C1 exit to every kick of an idle
/// CPU, `deep` adds the part's deepest C-state, which cyclic's CPUs (idle
/// about 1 ms between timer periods) reach: each changes the wakeups; a
/// cost file gives both by field name; asking for a deep state a file
/// lacks, or for a state with no name, is refused with what to give.
#[test]
fn idle_states_choose_the_cpus_idle_depth() {
    // a 20 ms cyclic run with `--costs costs` and `extra`
    let cyclic = |costs: &str, extra: &[&str]| {
        let mut args = vec![
            "sim",
            "cyclic",
            "--topology",
            TOPO,
            "--costs",
            costs,
            "--duration",
            "20ms",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let sim = |extra: &[&str]| {
        let r = cyclic("icx-2s", extra);
        assert_eq!(r.status, Some(0), "{}", r.context());
        r.console
    };
    let default = sim(&[]);
    assert_eq!(sim(&["--idle-states", "off"]), default);
    let c1 = sim(&["--idle-states", "c1"]);
    assert_ne!(c1, default);
    let deep = sim(&["--idle-states", "deep"]);
    assert_ne!(deep, c1);

    let dir = tempfile::tempdir().unwrap();
    let icx = "l1_hit_ns = 2\nsmt_ns = 8\nl2_ns = 8\nllc_ns = 51\ndie_ns = 51\n\
               package_ns = 51\nremote_ns = 108\nmemory_ns = 107\nmlp = 12\n\
               lock_spin_ns = 5600\nfutex_wake_ns = 240\nwakeup_ns = 1070\n\
               idle_exit_ns = 1000\n";
    let shallow = dir.path().join("icx.toml");
    std::fs::write(&shallow, icx).unwrap();
    let with_c6 = dir.path().join("icx-c6.toml");
    std::fs::write(
        &with_c6,
        format!("{icx}deep_idle_after_ns = 600000\ndeep_idle_exit_ns = 170000\n"),
    )
    .unwrap();
    let file = |path: &std::path::Path, extra: &[&str]| cyclic(path.to_str().unwrap(), extra);
    // the file's own deep state, as the preset's with `deep`
    let r = file(&with_c6, &[]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert_eq!(r.console, deep);
    // `c1` drops a file's deep state, `off` its C1 too
    let r = file(&with_c6, &["--idle-states", "c1"]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert_eq!(r.console, c1);
    let r = file(&with_c6, &["--idle-states", "off"]);
    assert_eq!(r.status, Some(0), "{}", r.context());
    assert_eq!(r.console, default);
    assert_input_error(
        &file(&shallow, &["--idle-states", "deep"]),
        &[
            "--idle-states deep",
            "deep_idle_after_ns",
            "--idle-states c1",
        ],
    );
    let half = dir.path().join("half.toml");
    std::fs::write(&half, format!("{icx}deep_idle_after_ns = 600000\n")).unwrap();
    assert_input_error(&file(&half, &[]), &["deep_idle_exit_ns", "both"]);
    assert_input_error(
        &run(&[
            "sim",
            "cyclic",
            "--topology",
            "icx-2s",
            "--idle-states",
            "c6",
        ]),
        &["c6", "off", "c1", "deep"],
    );
}
