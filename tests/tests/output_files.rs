//! Outputs never replace or delete what the program did not make. Every
//! output flag, given a path where a user's file (or directory) already
//! is, is refused at once (exit 2, before any work) with one line naming
//! the flag and what to give instead, and the file is left as it was.
//! What is provably the program's own is rewritten: a CPUID dump folder
//! with its marker. (`serve --api-socket`: `serve_config.rs`; the API's
//! `serial.file`: `vmm_api::files`.)

use std::path::Path;

use integration_tests::tiny_kernel;
use integration_tests::user_error::{s, sim_user_error, snapshot, user_error};

/// A directory with a user's file `mine.json` (and `mine.csv`, `mine.svg`)
/// and a tiny kernel.
fn setup() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for name in ["mine.json", "mine.csv", "mine.svg", "console.log"] {
        std::fs::write(dir.path().join(name), format!("the user's {name}\n")).unwrap();
    }
    let k = dir.path().join("k");
    std::fs::write(&k, tiny_kernel(&[0xf4])).unwrap();
    let k = s(&k).to_string();
    (dir, k)
}

fn p(dir: &Path, name: &str) -> String {
    s(&dir.join(name)).to_string()
}

#[test]
fn result_files_that_exist_are_refused_untouched() {
    let (dir, _) = setup();
    let d = dir.path();
    let before = snapshot(d);
    let mine = p(d, "mine.json");
    let exists = "the file exists and would be overwritten";
    user_error(
        &[
            "bench", "runq", "--vms", "1", "--vcpus", "2", "--json", &mine,
        ],
        &["--json", exists],
    );
    user_error(
        &["sched-bench", "cyclic", "--json", &mine],
        &["--json", exists],
    );
    user_error(
        &["sim", "cyclic", "-t", "gnr-2s", "--json", &mine],
        &["--json", exists],
    );
    sim_user_error(
        &["cyclic", "-t", "gnr-2s", "--json", &mine],
        &["--json", exists],
    );
    // --plot writes FILE.svg and FILE.csv: either one existing refuses it.
    let svg = p(d, "mine.svg");
    let sweep = ["sim", "cyclic", "-t", "gnr-2s", "--sweep", "cpus=16,32"];
    let mut a = sweep.to_vec();
    a.extend(["--plot", &svg]);
    user_error(&a, &["--plot", exists]);
    let fresh_svg = p(d, "fresh.svg");
    std::fs::write(d.join("fresh.csv"), "the user's csv\n").unwrap();
    let before_csv = snapshot(d);
    let mut a = sweep.to_vec();
    a.extend(["--plot", &fresh_svg]);
    user_error(&a, &["--plot", "fresh.csv", exists]);
    assert_eq!(snapshot(d), before_csv, "a file was touched");
    std::fs::remove_file(d.join("fresh.csv")).unwrap();
    assert_eq!(snapshot(d), before, "a file was touched");
}

#[test]
fn a_console_file_that_exists_is_refused() {
    let (dir, k) = setup();
    let d = dir.path();
    let before = snapshot(d);
    let log = p(d, "console.log");
    user_error(
        &[
            "run",
            "--kernel",
            &k,
            "--memory",
            "128M",
            "--guest",
            "pu:1",
            "--console",
            &log,
        ],
        &["--console", "the file exists"],
    );
    assert_eq!(snapshot(d), before, "a file was touched");
}

#[test]
fn a_cpuid_dump_goes_only_where_no_user_file_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A directory of the user's: their own dump (no marker), kept whole.
    let theirs = d.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("pu0"), "their CPU 0\n").unwrap();
    std::fs::write(theirs.join("notes.txt"), "keep\n").unwrap();
    let before = snapshot(d);
    user_error(
        &["topology", "cpuid-dump", "-g", "pu:2", "-o", s(&theirs)],
        &[
            "--out",
            "no .vmm-cpuid-dump marker",
            "give a new or empty directory",
        ],
    );
    // A regular file where the folder would go.
    let file = d.join("file");
    std::fs::write(&file, "x").unwrap();
    let before_file = snapshot(d);
    user_error(
        &["topology", "cpuid-dump", "-g", "pu:2", "-o", s(&file)],
        &["--out"],
    );
    assert_eq!(snapshot(d), before_file, "a file was touched");
    std::fs::remove_file(&file).unwrap();
    assert_eq!(snapshot(d), before, "the user's dump was touched");

    // A new folder gets the dump and its marker; writing a smaller guest
    // into it again is allowed (it is ours) and leaves no stale puN.
    let ours = d.join("ours");
    let run = |shape: &str| {
        let out = std::process::Command::new(integration_tests::vmm_bin())
            .args(["topology", "cpuid-dump", "-g", shape, "-o", s(&ours)])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    run("package:1 core:4 pu:1");
    assert!(ours.join(".vmm-cpuid-dump").is_file());
    assert!(ours.join("pu3").is_file());
    run("package:1 core:2 pu:1");
    assert!(ours.join("pu1").is_file());
    assert!(!ours.join("pu2").exists(), "a stale puN was left");
    // hwloc reads it back as 2 CPUs.
    let out = std::process::Command::new(integration_tests::vmm_bin())
        .args(["topology", "show", "-t", s(&ours), "-f", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cpus"].as_array().map(Vec::len), Some(2), "{v}");
}

/// The measurement scripts remove their own earlier output before a run
/// (vmm never replaces a file), but only what git can give back. A
/// directory given with `--out` that holds anything else (here a user's
/// file, and one named like the script's own output) is refused before
/// any measurement, and left as it was.
#[test]
fn measurement_scripts_write_only_over_what_git_can_restore() {
    let (dir, _) = setup();
    let d = dir.path();
    std::fs::write(d.join("qd1-x1.json.gz"), "the user's earlier run\n").unwrap();
    let before = snapshot(d);
    let root = integration_tests::workspace_root();
    let out = std::process::Command::new("scripts/blk-bench.sh")
        .current_dir(&root)
        .env("VMM_BIN", integration_tests::vmm_bin())
        .args(["--out", s(d), "--duration", "0.1", "--reps", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(
        err.contains("refusing to write over") && err.contains(s(d)) && err.contains("--out"),
        "the refusal names the directory and what to give instead: {err}"
    );
    assert_eq!(snapshot(d), before, "nothing in the directory changed");

    // The committed data under docs/data/ is what the scripts may rewrite
    // (git restores it); a file outside the repository is not.
    let check = |path: &str| {
        std::process::Command::new("bash")
            .current_dir(&root)
            .args([
                "-c",
                "source scripts/lib/bench.sh && restorable \"$1\"",
                "restorable",
                path,
            ])
            .status()
            .unwrap()
            .success()
    };
    assert!(check("docs/data/targets"), "committed data is restorable");
    assert!(check(&p(d, "no-such-file")), "a missing file is restorable");
    assert!(!check(&p(d, "mine.json")), "a user's file is not");
    assert!(!check(s(d)), "nor a directory holding one");
}
