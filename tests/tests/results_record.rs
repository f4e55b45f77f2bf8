//! The published results tables rebuild from their committed raw data.
//!
//! WHAT: runs `results_md` (the tool that `scripts/results.sh` and
//! `scripts/targets.sh` write the tables with) on the committed raw JSON
//! and metadata under `docs/data/`, and compares what it writes with the
//! committed pages byte for byte: the seeds tables of
//! `docs/results-scheduler.md` and `docs/results-vcpus.md`, and the Targets
//! table of `docs/results-vcpus.md`.
//!
//! WHY: a published number must be the one its raw data gives. An edit of
//! a table by hand, a change of how a table is computed (such as the paired
//! interval) without regenerating the pages, or raw data replaced without
//! the page, all fail here.
//!
//! HOW: the tool writes into a temporary directory; the pages' text outside
//! the generated sections passes through unchanged, so any difference is a
//! generated section that its data no longer gives. To fix one, regenerate
//! in place: `results_md docs/data/results-meta.txt docs/data
//! docs/results-scheduler.md docs/results-scheduler.md docs/results-vcpus.md
//! docs/results-vcpus.md` and `results_md --targets docs/results-vcpus.md
//! docs/results-vcpus.md` (the binary: `cargo build -p integration-tests
//! --bin results_md`).

use std::path::Path;
use std::process::Command;

use integration_tests::workspace_root;

fn results_md(args: &[&Path]) {
    let out = Command::new(env!("CARGO_BIN_EXE_results_md"))
        .args(args)
        .output()
        .expect("running results_md");
    assert!(
        out.status.success(),
        "results_md {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_same(committed: &Path, rebuilt: &Path) {
    let want = std::fs::read_to_string(committed).unwrap();
    let got = std::fs::read_to_string(rebuilt).unwrap();
    if want != got {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{} does not rebuild from its raw data (first difference at line {}):\n  committed: {:?}\n  rebuilt:   {:?}\n(see this file's doc for the command that regenerates it)",
            committed.display(),
            first + 1,
            want.lines().nth(first).unwrap_or("<end>"),
            got.lines().nth(first).unwrap_or("<end>"),
        );
    }
}

#[test]
fn seeds_tables_rebuild_from_the_committed_json() {
    let root = workspace_root();
    let tmp = tempfile::tempdir().unwrap();
    let docs = root.join("docs");
    let pages = ["results-scheduler.md", "results-vcpus.md"];
    let mut args = vec![docs.join("data/results-meta.txt"), docs.join("data")];
    for p in pages {
        args.push(docs.join(p));
        args.push(tmp.path().join(p));
    }
    let args: Vec<&Path> = args.iter().map(|p| p.as_path()).collect();
    results_md(&args);
    for p in pages {
        assert_same(&docs.join(p), &tmp.path().join(p));
    }
}

#[test]
fn targets_table_rebuilds_from_the_committed_runs() {
    let page = workspace_root().join("docs/results-vcpus.md");
    let text = std::fs::read_to_string(&page).unwrap();
    assert!(
        text.contains("<!-- targets:begin data/targets -->"),
        "the Targets table is generated (a targets:begin marker)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("results-vcpus.md");
    results_md(&[Path::new("--targets"), &page, &out]);
    assert_same(&page, &out);
}
