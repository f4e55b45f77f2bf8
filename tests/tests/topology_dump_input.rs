//! CPUID dump directories that hwloc's x86 parser cannot use.
//!
//! hwloc's parser does not fail on such a dump: it reads this machine's own
//! CPUID instead (when `hwloc-cpuid-info` does not say `Architecture: x86`,
//! or the `puN` files have a gap) or makes bare CPUs (when the files hold
//! no CPUID), and `lstopo` exits 0. So `vmm topology show -t DIR` used to
//! print this host's CPUs under the dump's name. Every such directory must
//! now be refused by every command that takes a topology SPEC: exit 2, one
//! message that names the problem and the fix, nothing on stdout.
//!
//! These tests run the `vmm` binary as a user would, on a dump that `vmm
//! topology cpuid-dump` wrote and that loads before it is damaged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::{run_bounded, BoundedOutput};

const TIMEOUT: Duration = Duration::from_secs(20);

/// A 2-package, 3-cores-each guest: 6 CPUs, unlike any host it runs on.
const SHAPE: &str = "package:2 l3:1 l2:3 core:1 pu:1";

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

/// Whether hwloc's `lstopo-no-graphics` is installed. Without it no dump
/// loads; under `CI=true` that is a failure, elsewhere the test says it
/// skipped (`integration_tests::tools`). An lstopo that is installed but
/// fails is the test's failure, not a skip.
fn have_lstopo() -> bool {
    integration_tests::require_tool("lstopo-no-graphics", "apt install hwloc")
}

/// Writes a CPUID dump of `SHAPE` in Intel's encoding into `dir/name` and
/// checks that it loads as 6 CPUs.
fn good_dump(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let r = run_bounded(
        &[
            "topology",
            "cpuid-dump",
            "-g",
            SHAPE,
            "-o",
            path(&out),
            "--vendor",
            "intel",
        ],
        TIMEOUT,
    );
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let r = run_bounded(&["topology", "show", "-t", path(&out)], TIMEOUT);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout.contains("2 packages") && r.stdout.contains("6 CPUs"),
        "{}",
        r.describe()
    );
    out
}

/// Every command that takes a topology SPEC refuses `dir` with exit 2 and
/// a message holding each of `want`.
fn refused(dir: &Path, want: &[&str]) {
    let out = dir.with_extension("out");
    let commands: [Vec<&str>; 3] = [
        vec!["topology", "show", "-t", path(dir)],
        vec!["topology", "guest", "-g", path(dir)],
        vec!["topology", "cpuid-dump", "-g", path(dir), "-o", path(&out)],
    ];
    for args in &commands {
        let r: BoundedOutput = run_bounded(args, TIMEOUT);
        let ctx = || format!("vmm {args:?}: {}", r.describe());
        assert!(!r.timed_out, "{}", ctx());
        assert_eq!(r.code, Some(2), "a user mistake exits 2: {}", ctx());
        assert!(
            r.stderr
                .starts_with("error: cannot load CPUID dump directory"),
            "{}",
            ctx()
        );
        for w in want {
            assert!(r.stderr.contains(w), "stderr lacks {w:?}: {}", ctx());
        }
        assert_eq!(r.stdout, "", "described something: {}", ctx());
        assert!(!r.stderr.contains("panicked"), "{}", ctx());
    }
    assert!(!out.join("pu0").exists(), "a dump was written from it");
}

#[test]
fn another_architecture_is_refused() {
    if !have_lstopo() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dump = good_dump(tmp.path(), "arm");
    // What hwloc-gather-cpuid would write on an Arm machine, with CPU files
    // that are not x86 CPUID either.
    std::fs::write(dump.join("hwloc-cpuid-info"), "Architecture: aarch64\n").unwrap();
    refused(
        &dump,
        &[
            "hwloc-cpuid-info says \"Architecture: aarch64\"",
            "exactly `Architecture: x86`",
            "lstopo --of xml",
        ],
    );
    for i in 0..6 {
        std::fs::write(dump.join(format!("pu{i}")), "MIDR_EL1 0x410fd0c1\n").unwrap();
    }
    refused(&dump, &["says \"Architecture: aarch64\""]);
}

#[test]
fn a_first_line_hwloc_does_not_take_is_refused() {
    if !have_lstopo() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dump = good_dump(tmp.path(), "dump");
    let info = dump.join("hwloc-cpuid-info");
    for (text, want) in [
        ("", "hwloc-cpuid-info is empty"),
        ("Architecture: x86\r\n", "Windows line endings"),
        ("Architecture: x86", "lacks its newline"),
    ] {
        std::fs::write(&info, text).unwrap();
        refused(&dump, &[want, "exactly `Architecture: x86`"]);
    }
}

#[test]
fn files_that_are_not_cpuid_dumps_are_refused() {
    if !have_lstopo() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dump = good_dump(tmp.path(), "text");
    for i in 0..6 {
        std::fs::write(dump.join(format!("pu{i}")), "hello, world\n").unwrap();
    }
    refused(
        &dump,
        &["pu0 holds no CPUID lines", "not a CPUID dump file"],
    );

    let dump = good_dump(tmp.path(), "one-bad");
    std::fs::write(dump.join("pu4"), "# nothing here\n").unwrap();
    refused(&dump, &["pu4 holds no CPUID lines"]);
}

#[test]
fn cpu_files_with_a_gap_are_refused() {
    if !have_lstopo() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dump = good_dump(tmp.path(), "gap");
    std::fs::remove_file(dump.join("pu3")).unwrap();
    refused(&dump, &["pu3 is missing", "5 files, the last is pu5"]);
    std::fs::rename(dump.join("pu5"), dump.join("pu03")).unwrap();
    refused(&dump, &["\"pu03\"", "not plain"]);
}

#[test]
fn an_unknown_vendor_is_refused() {
    if !have_lstopo() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dump = good_dump(tmp.path(), "vendor");
    // "GenuineIntel" in leaf 0 (EBX, EDX, ECX) becomes "AAAAAAAAAAAA".
    let pu0 = std::fs::read_to_string(dump.join("pu0")).unwrap();
    let changed = pu0.replace(" 756e6547 6c65746e 49656e69", " 41414141 41414141 41414141");
    assert_ne!(pu0, changed, "leaf 0 not found in:\n{pu0}");
    std::fs::write(dump.join("pu0"), changed).unwrap();
    refused(&dump, &["vendor \"AAAAAAAAAAAA\""]);
}
