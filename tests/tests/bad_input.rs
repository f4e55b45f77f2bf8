//! Bad input to the real `vmm` binary: every case must exit 2 within a few
//! seconds, in bounded memory, without a panic, with one plain message that
//! names the problem.

use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::{require_tool, run_bounded, BoundedOutput};

const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RSS_KB: u64 = 1 << 20; // 1 GiB

/// Text that must never reach a user: panics, and Rust's debug formatting.
const LEAKS: &[&str] = &[
    "panicked",
    "RUST_BACKTRACE",
    "unreachable",
    "Some(",
    "Errno",
    "untagged enum",
    "StrOrInt",
    "expected u32",
    "expected u64",
];

fn run(args: &[&str]) -> BoundedOutput {
    run_bounded(args, TIMEOUT)
}

/// Runs `args` and checks the common rules, then that stderr holds each
/// of `want`.
fn bad(args: &[&str], want: &[&str]) -> BoundedOutput {
    let r = run(args);
    let ctx = || format!("vmm {args:?}: {}", r.describe());
    assert!(!r.timed_out, "ran past {TIMEOUT:?}: {}", ctx());
    assert!(r.max_rss_kb < MAX_RSS_KB, "used too much memory: {}", ctx());
    assert_eq!(r.code, Some(2), "a user mistake exits 2: {}", ctx());
    for leak in LEAKS {
        assert!(!r.stderr.contains(leak), "stderr shows {leak:?}: {}", ctx());
    }
    assert!(r.stderr.starts_with("error: "), "{}", ctx());
    assert!(
        r.stdout_bytes < 64 << 10,
        "printed {} bytes to stdout: {}",
        r.stdout_bytes,
        ctx()
    );
    for w in want {
        assert!(r.stderr.contains(w), "stderr lacks {w:?}: {}", ctx());
    }
    r
}

fn show(spec: &str, want: &[&str]) -> BoundedOutput {
    bad(&["topology", "show", "-t", spec], want)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(path(p)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

// ---- topology FILE ---------------------------------------------------

#[test]
fn topology_special_files() {
    show("/proc/self/mem", &["/proc/self/mem", "cannot read it"]);
    show("/dev/null", &["/dev/null", "is a character device"]);
    show("/dev/zero", &["/dev/zero", "is a character device"]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("topo.xml");
    mkfifo(&fifo);
    show(path(&fifo), &["named pipe (FIFO)", "not"]);
    show(
        "/proc/cpuinfo",
        &["does not look like an hwloc XML topology"],
    );
    show("/nonexistent/topo.xml", &["no such file or directory"]);
}

#[test]
fn topology_bad_xml_files() {
    let dir = tempfile::tempdir().unwrap();
    let f = |name: &str, body: &[u8]| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    show(path(&f("empty.xml", b"")), &["it is empty"]);
    show(path(&f("blank.xml", b"  \n\n")), &["it is empty"]);
    show(
        path(&f("junk.xml", b"hello world\n")),
        &[
            "does not look like an hwloc XML topology",
            "lstopo --of xml",
        ],
    );
    show(
        path(&f("bin.xml", &[0xff, 0xfe, 0, 1, 2])),
        &["not text (not UTF-8)"],
    );
    show(
        path(&f(
            "cut.xml",
            b"<?xml version=\"1.0\"?>\n<topology><object type=\"Machine\"",
        )),
        &["hwloc could not parse it"],
    );
    // 20 MB (sparse, so the test itself stays cheap).
    let big = dir.path().join("big.xml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    show(path(&big), &["the limit is 16777216 (16 MiB)"]);
}

/// Runs `lstopo-no-graphics -i SYNTHETIC --of xml` (hwloc's own export);
/// a failing lstopo fails the test.
fn lstopo_xml(synthetic: &str) -> String {
    let out = std::process::Command::new("lstopo-no-graphics")
        .args(["-i", synthetic, "--of", "xml"])
        .output()
        .expect("starting lstopo-no-graphics");
    assert!(
        out.status.success(),
        "lstopo-no-graphics -i {synthetic:?} --of xml failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn topology_xml_over_the_limits() {
    if !require_tool("lstopo-no-graphics", "apt install hwloc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("pu5000.xml");
    std::fs::write(&p, lstopo_xml("pu:5000")).unwrap();
    show(path(&p), &["it has 5000 CPUs; the limit is 4096"]);

    let p = dir.path().join("nodes.xml");
    std::fs::write(&p, lstopo_xml("package:300 [numa] pu:1")).unwrap();
    show(path(&p), &["it has 300 NUMA nodes; the limit is 256"]);

    // A hand-edited file that lists one CPU twice: hwloc's consistency
    // check would abort() the process in a debug build.
    let x = lstopo_xml("pu:2").replace("os_index=\"1\"", "os_index=\"0\"");
    let p = dir.path().join("dup.xml");
    std::fs::write(&p, x).unwrap();
    show(path(&p), &["P#0 appears twice"]);
}

#[test]
fn topology_dump_directories() {
    let dir = tempfile::tempdir().unwrap();
    show(
        path(dir.path()),
        &[
            "CPUID dump directory",
            "neither hwloc-cpuid-info nor pu0",
            "vmm topology cpuid-dump",
        ],
    );
    std::fs::write(dir.path().join("pu0"), b"").unwrap();
    show(path(dir.path()), &["lacks hwloc-cpuid-info"]);
    std::fs::create_dir(dir.path().join("hwloc-cpuid-info")).unwrap();
    show(
        path(dir.path()),
        &["hwloc-cpuid-info is a directory, not a regular file"],
    );
    std::fs::remove_dir(dir.path().join("hwloc-cpuid-info")).unwrap();
    std::fs::write(dir.path().join("hwloc-cpuid-info"), b"").unwrap();
    std::fs::File::create(dir.path().join("pu1"))
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    show(path(dir.path()), &["pu1 is 20971520 bytes"]);
}

// ---- synthetic descriptions ------------------------------------------

#[test]
fn synthetic_too_large_is_refused_at_once() {
    for spec in [
        "pu:16384",
        "pu:8192",
        "package:4096 core:4096 pu:4096",
        "package:99999999999999999999999 pu:2",
        "package:2 core:99999999999 pu:2",
    ] {
        let r = show(spec, &["the limit is 4096 CPUs"]);
        assert!(
            r.elapsed < Duration::from_secs(3),
            "{spec}: {:?}",
            r.elapsed
        );
    }
    show(
        "package:512 [numa] pu:1",
        &["512 NUMA nodes; the limit is 256"],
    );
    show(&"core:1 ".repeat(40), &["more than 32 levels"]);
    let long = format!("package:1 pu:1({})", "x".repeat(100_000));
    let r = show(&long, &["the limit is 65536"]);
    assert!(
        r.stderr.len() < 2000,
        "the message echoes it all: {}",
        r.stderr.len()
    );
}

#[test]
fn synthetic_indexes_must_match() {
    show("pu:2(indexes=0,0,0,0)", &["index 0 is given twice"]);
    show("pu:2(indexes=0,0)", &["index 0 is given twice"]);
    show(
        "pu:2(indexes=0,1,2)",
        &["has 3 indexes but the level has 2 objects"],
    );
    show(
        "pu:4(indexes=0,1)",
        &["has 2 indexes but the level has 4 objects"],
    );
    show("pu:2(indexes=0,4000000000)", &["too large"]);
    show("core:4 pu:2(indexes=1*4:1*2)", &["exactly once"]);
    show(
        "package:2 [numa(indexes=3,3)] pu:1",
        &["index 3 is given twice"],
    );
}

#[test]
fn synthetic_garbage() {
    for (spec, want) in [
        ("pu:0", "count of 0"),
        ("package:0 pu:1", "count of 0"),
        ("package:-1 pu:2", "no count"),
        ("package:", "no count"),
        ("package:0x10 pu:1", "whole number"),
        ("package:2 bogus", "type:count"),
        ("garbage", "is not `host`, a preset"),
        ("package:2 core:2", "hwloc rejected it"),
        ("flurb:2 pu:1", "hwloc rejected it"),
        ("l3:1(size=1 pu:1", "never closed"),
        ("pu:1)", "unmatched"),
        ("[core] pu:1", "only NUMA nodes"),
        ("   ", "empty"),
    ] {
        show(spec, &[want, "malformed topology description"]);
    }
}

#[test]
fn guest_specs_get_the_same_checks() {
    for (spec, want) in [
        ("pu:16384", "the limit is 4096 CPUs"),
        ("pu:2(indexes=0,0,0,0)", "index 0 is given twice"),
        ("/dev/null", "is a character device"),
        ("pu:0", "count of 0"),
    ] {
        bad(&["topology", "guest", "--guest", spec], &[want]);
    }
}

#[test]
fn the_largest_accepted_topology_is_quick() {
    let r = run(&["topology", "show", "-t", "package:16 [numa] core:128 pu:2"]);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stdout.contains("16 packages, 16 dies, 16 NUMA nodes"),
        "{}",
        r.describe()
    );
    assert!(r.stdout_bytes < 1 << 20, "{}", r.describe());
    assert!(r.max_rss_kb < MAX_RSS_KB, "{}", r.describe());
}

// ---- vmm run --config and flags --------------------------------------

fn run_with_config(cfg: &str, want: &[&str]) -> BoundedOutput {
    bad(&["run", "--config", cfg], want)
}

#[test]
fn config_special_files() {
    let r = run_with_config("/dev/zero", &["--config /dev/zero", "not a regular file"]);
    assert!(r.max_rss_kb < 256 << 10, "{}", r.describe());
    let dir = tempfile::tempdir().unwrap();
    run_with_config(path(dir.path()), &["it is a directory", "give a TOML file"]);
    let fifo = dir.path().join("vm.toml");
    mkfifo(&fifo);
    run_with_config(path(&fifo), &["not a regular file"]);
    let r = run_with_config(
        "/nonexistent/vm.toml",
        &["--config /nonexistent/vm.toml: no such file"],
    );
    assert!(!r.stderr.contains("os error"), "{}", r.describe());
    let big = dir.path().join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    run_with_config(path(&big), &["the limit is 1048576 (1 MiB)"]);
}

#[test]
fn config_contents_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vm.toml");
    for (text, want) in [
        (
            "kernel = \"k\"\nmemroy = \"1G\"\n",
            &["unknown field `memroy`", "line 2"][..],
        ),
        ("memory = true\n", &["line 1, `memory`", "a size in quotes"]),
        ("memory = 1.5\n", &["`memory`", "whole number of MiB"]),
        ("timeout = -5\n", &["`timeout`", "a duration in quotes"]),
        (
            "numa-distance = -3\n",
            &["`numa-distance`", "expected a whole number"],
        ),
        ("kernel = 5\n", &["`kernel`", "a file path in quotes"]),
        ("kernel = \n", &["line 1"]),
        ("[[[", &["line 1"]),
        ("memory = \"1G\"\nmemory = \"2G\"\n", &["line 2"]),
    ] {
        std::fs::write(&p, text).unwrap();
        run_with_config(path(&p), want);
    }
    std::fs::write(&p, [0xffu8, 0xfe, b'\n']).unwrap();
    run_with_config(path(&p), &["not UTF-8"]);
}

#[test]
fn run_flags_garbage() {
    let base = ["run", "--kernel", "/nonexistent/vmlinux", "--guest", "pu:1"];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    for (extra, want) in [
        (&["--memory", "12QB"][..], &["--memory", "unknown unit"][..]),
        (&["--memory", "lots"], &["--memory", "is not a size"]),
        (&["--memory", ""], &["--memory"]),
        (
            &["--memory", "99999999T"],
            &["--memory", "implausibly large"],
        ),
        (
            &["--memory", "1G", "--timeout", "0"],
            &["--timeout", "more than zero"],
        ),
        (
            &["--memory", "1G", "--timeout", "soon"],
            &["--timeout", "not a duration"],
        ),
        (
            &["--memory", "1G", "--numa-distance", "5"],
            &["--numa-distance", "11..=254"],
        ),
    ] {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bad(&args, want);
    }
    // The kernel is checked before the topology: give a real (tiny) one.
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("vmlinux");
    std::fs::write(&kernel, integration_tests::tiny_kernel(&[0xf4])).unwrap();
    bad(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--memory",
            "1G",
            "--guest",
            "pu:16384",
        ],
        &["--guest", "the limit is 4096 CPUs"],
    );
}
