//! Bad input to the real `vmm` binary, flag by flag: every case exits with
//! the right status (2 for the user's mistakes) within 10 s, without a
//! panic, under 1 GB of memory, with a message that names the problem.
//! Also: one duration syntax everywhere, output paths checked before any
//! work, console streams, `--timeout` over setup, and no colour codes in
//! pipes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::run_bounded::{run_bounded, run_bounded_env, Bounded};
use integration_tests::tiny_kernel;

const LIMIT: Duration = Duration::from_secs(10);
const SHAPE: &str = "package:1 core:1 pu:1";

fn vmm(args: &[&str]) -> Bounded {
    run_bounded(args, LIMIT)
}

/// Asserts the run ended by itself with `code`, quickly, small, without a
/// panic, and that stderr has every needle.
#[track_caller]
fn assert_exit(r: &Bounded, code: i32, needles: &[&str]) {
    assert!(!r.timed_out, "hung:\n{}", r.context());
    assert_eq!(r.code, Some(code), "{}", r.context());
    assert!(r.elapsed < LIMIT, "{}", r.context());
    assert!(!r.stderr.contains("panicked"), "{}", r.context());
    assert!(r.max_rss_kb < 1 << 20, "over 1 GB:\n{}", r.context());
    for n in needles {
        assert!(r.stderr.contains(n), "missing {n:?}:\n{}", r.context());
    }
    for bad in ["Some(", "Errno", "os error"] {
        assert!(
            !r.stderr.contains(bad),
            "Debug text {bad:?}:\n{}",
            r.context()
        );
    }
}

#[track_caller]
fn user_error(args: &[&str], needles: &[&str]) -> Bounded {
    let r = vmm(args);
    assert_exit(&r, 2, needles);
    let lines: Vec<&str> = r.stderr.trim().lines().collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{}", r.context());
    assert!(lines[0].starts_with("error: "), "{}", r.context());
    r
}

/// `vmm run` up to the flag under test; the kernel does not exist, so a
/// run that gets past its flags fails on the kernel (still exit 2).
fn run_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "run",
        "--kernel",
        "/nonexistent/vmlinux",
        "--memory",
        "256M",
        "--guest",
        SHAPE,
    ];
    v.extend_from_slice(extra);
    v
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tiny kernel that prints a line on COM1 and resets.
fn hello_kernel(dir: &Path) -> PathBuf {
    let mut code = vec![0x66, 0xba, 0xf8, 0x03];
    for b in b"hello from the guest\n" {
        code.extend_from_slice(&[0xb0, *b, 0xee]);
    }
    code.extend_from_slice(&[0xb0, 0xfe, 0xe6, 0x64, 0xf4]);
    write(dir, "k", &tiny_kernel(&code))
}

// ------------------------------------------------------------ durations

#[test]
fn bad_durations_in_every_subcommand() {
    for (value, needle) in [
        ("0", "more than zero"),
        ("0s", "more than zero"),
        ("-1", "negative"),
        ("-5s", "negative"),
        ("1e400", "too long"),
        ("inf", "too long"),
        ("nan", "not a duration"),
        ("abc", "not a duration"),
        ("", "empty"),
        ("10y", "not a duration"),
    ] {
        for cmd in [&["bench", "runq"][..], &["sched-bench", "runq"][..]] {
            let mut a = cmd.to_vec();
            a.extend(["--duration", value]);
            user_error(&a, &["--duration", needle, "5s"]);
        }
        user_error(
            &run_args(&["--timeout", value]),
            &["--timeout", needle, "5s"],
        );
    }
    // Limits are errors, never silent caps.
    user_error(&["bench", "runq", "--duration", "2h"], &["limit of 1h"]);
    user_error(
        &["sched-bench", "runq", "--duration", "5ms"],
        &["at least 100ms"],
    );
    user_error(
        &run_args(&["--timeout", "30d"]),
        &["--timeout", "not a duration"],
    );
    user_error(&run_args(&["--timeout", "200h"]), &["--timeout", "168h"]);
}

/// Every form parses in every place: each run gets past its duration and
/// stops at a later, deliberate mistake.
#[test]
fn one_duration_syntax_everywhere() {
    for d in ["5s", "500ms", "2m", "0.3", "1m30s", "3"] {
        user_error(
            &["bench", "runq", "--duration", d, "--vcpus", "300"],
            &["--vcpus 300"],
        );
        user_error(
            &["sched-bench", "runq", "--duration", d, "--prio", "5"],
            &["--prio applies to"],
        );
        user_error(
            &[
                "run",
                "--kernel",
                "/nonexistent/vmlinux",
                "--memory",
                "1T",
                "--guest",
                SHAPE,
                "--timeout",
                d,
            ],
            &["--memory", "more than this host's"],
        );
    }
}

// ------------------------------------------------------- numeric flags

#[test]
fn numeric_flags_have_one_set_of_rules() {
    for cmd in [&["bench", "runq"][..], &["sched-bench", "runq"][..]] {
        for (flag, value, needle) in [
            ("--burst-us", "99999999999", "out of range"),
            ("--burst-us", "0", "1 to 1000000"),
            ("--burst-us", "-3", "negative"),
            ("--burst-us", "1.5", "whole number"),
            ("--burst-us", "", "empty"),
            ("--reps", "0", "1 to 100"),
            ("--reps", "1000", "1 to 100"),
        ] {
            let mut a = cmd.to_vec();
            a.extend([flag, value]);
            user_error(&a, &[flag, needle]);
        }
    }
    for cmd in [&["bench", "cyclic"][..], &["sched-bench", "cyclic"][..]] {
        for (flag, value, needle) in [
            ("--period-us", "0", "1 to 1000000"),
            ("--period-us", "99999999999", "out of range"),
            ("--prio", "0", "1..=99"),
            ("--prio", "100", "1..=99"),
            ("--prio", "300", "1..=99"),
        ] {
            let mut a = cmd.to_vec();
            a.extend([flag, value]);
            user_error(&a, &[flag, needle]);
        }
    }
    for (flag, value, needle) in [
        ("--tasks", "0", "1 to 4096"),
        ("--tasks", "100000000", "out of range"),
        ("--groups", "0", "1 to 4096"),
        ("--group-size", "99999", "out of range"),
    ] {
        user_error(&["sched-bench", "messaging", flag, value], &[flag, needle]);
    }
}

#[test]
fn ignored_flags_are_errors() {
    user_error(
        &["bench", "runq", "--period-us", "100"],
        &["--period-us applies to cyclic", "runq"],
    );
    user_error(
        &["bench", "messaging", "--prio", "50"],
        &["--prio applies to cyclic and transcode"],
    );
    user_error(
        &["bench", "runq", "--no-host-rt"],
        &["--no-host-rt applies to"],
    );
    user_error(
        &["bench", "runq", "--reps", "2"],
        &["--reps applies to --compare"],
    );
    user_error(
        &[
            "bench",
            "runq",
            "--executor",
            "host",
            "--mitigations",
            "all",
        ],
        &["--mitigations applies to", "--executor host"],
    );
    user_error(
        &["sched-bench", "messaging", "--prio", "5"],
        &["--prio applies to", "messaging"],
    );
    user_error(
        &["sched-bench", "runq", "--period-us", "5"],
        &["--period-us applies to"],
    );
    user_error(
        &["sched-bench", "cyclic", "--groups", "5"],
        &["--groups applies to"],
    );
}

#[test]
fn bench_vcpu_limits() {
    user_error(
        &["bench", "messaging", "--vms", "4", "--vcpus", "1024"],
        &["--vcpus 1024", "at most 256"],
    );
    user_error(
        &["bench", "messaging", "--vms", "8", "--vcpus", "256"],
        &["2048 vCPUs", "at most 1024"],
    );
    user_error(&["bench", "runq", "--vms", "0"], &["--vms", "1 to 1024"]);
    user_error(
        &["bench", "runq", "--vcpus", "99999999999999999999999"],
        &["--vcpus", "out of range"],
    );
}

// ------------------------------------------------------ run's placement

#[test]
fn pin_and_rt_values() {
    user_error(&run_args(&["--pin="]), &["--pin", "empty"]);
    user_error(&run_args(&["--pin", " "]), &["--pin", "empty"]);
    user_error(&run_args(&["--rt="]), &["--rt", "empty"]);
    user_error(&run_args(&["--rt", "fifo:100"]), &["--rt", "1 to 99"]);
    user_error(&run_args(&["--rt", "fifo:0"]), &["--rt", "1 to 99"]);
    user_error(
        &run_args(&["--rt", "deadline:5"]),
        &["--rt", "unknown policy"],
    );
    user_error(&run_args(&["--pin", "fast"]), &["--pin", "CPU list"]);
}

#[test]
fn run_mitigations() {
    user_error(
        &run_args(&["--sched", "vcpu_sched", "--mitigations", "bogus"]),
        &["--mitigations", "bogus"],
    );
    user_error(
        &run_args(&["--sched", "vcpu_sched", "--mitigations", "only:turbo"]),
        &["--mitigations", "turbo"],
    );
    user_error(
        &run_args(&["--mitigations", "all"]),
        &["--mitigations", "--sched host", "ignored"],
    );
    user_error(
        &run_args(&["--sched", "host", "--mitigations", "none"]),
        &["--mitigations", "--sched vcpu_sched"],
    );
    // Accepted with vcpu_sched: the run gets as far as the kernel.
    for set in ["none", "all", "only:l2wake,cpupri", "all-but:rto"] {
        user_error(
            &run_args(&["--sched", "vcpu_sched", "--mitigations", set]),
            &["--kernel"],
        );
    }
}

#[test]
fn run_scheduler_settings() {
    user_error(
        &run_args(&["--fair-slice-scaling", "none"]),
        &["--fair-slice-scaling", "--sched host", "ignored"],
    );
    user_error(
        &run_args(&["--sched", "vcpu_sched", "--fair-slice-scaling", "linear"]),
        &["--fair-slice-scaling", "\"linear\"", "give log", "or none"],
    );
    user_error(
        &run_args(&["--tick-us", "4000"]),
        &["--tick-us", "--sched host", "ignored"],
    );
    user_error(
        &run_args(&["--sched", "vcpu_sched", "--halt-poll-us", "50"]),
        &["--halt-poll-us", "give 100..=100000"],
    );
    user_error(
        &run_args(&["--halt-park", "on"]),
        &["--halt-park", "--sched host", "ignored"],
    );
    user_error(
        &run_args(&["--sched", "vcpu_sched", "--halt-park", "yes"]),
        &["--halt-park", "\"yes\"", "give on or off"],
    );
    user_error(
        &run_args(&[
            "--sched",
            "vcpu_sched",
            "--tick-us",
            "4000",
            "--halt-poll-us",
            "2000",
            "--halt-park",
            "on",
        ]),
        &["--kernel"],
    );
    // Accepted with vcpu_sched: the run gets as far as the kernel.
    for v in ["log", "none"] {
        user_error(
            &run_args(&["--sched", "vcpu_sched", "--fair-slice-scaling", v]),
            &["--kernel"],
        );
    }
}

// ------------------------------------------------------------- memory

#[test]
fn memory_beyond_the_host_fails_fast() {
    let r = user_error(
        &[
            "run",
            "--kernel",
            "/nonexistent/vmlinux",
            "--memory",
            "1T",
            "--guest",
            SHAPE,
            "--timeout",
            "5s",
        ],
        &["--memory", "more than this host's", "GiB"],
    );
    assert!(r.elapsed < Duration::from_secs(5), "{}", r.context());
}

// ----------------------------------------------------------- outputs

#[test]
fn json_paths_are_checked_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in [&["bench", "runq"][..], &["sched-bench", "runq"][..]] {
        for (path, needle) in [
            ("/nonexistent/dir/x.json", "does not exist"),
            ("/", "is a directory"),
            (s(dir.path()), "is a directory"),
            ("/proc/x.json", "cannot write"),
        ] {
            let mut a = cmd.to_vec();
            // A long run: the check must come first.
            a.extend(["--json", path, "--duration", "1h"]);
            user_error(&a, &["--json", needle]);
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn cpuid_dump_out_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "file", b"keep");
    user_error(
        &["topology", "cpuid-dump", "-g", SHAPE, "-o", s(&f)],
        &["--out", "not a directory"],
    );
    user_error(
        &["topology", "cpuid-dump", "-g", SHAPE, "-o", "/proc/dump"],
        &["--out", "cannot write"],
    );
    assert_eq!(std::fs::read(&f).unwrap(), b"keep");
    let out = dir.path().join("a/b");
    let r = vmm(&["topology", "cpuid-dump", "-g", SHAPE, "-o", s(&out)]);
    assert_exit(&r, 0, &[]);
    assert!(out.join("pu0").exists(), "{}", r.context());
}

#[test]
fn console_never_clobbers() {
    let dir = tempfile::tempdir().unwrap();
    let existing = write(dir.path(), "console.log", b"precious\n");
    let r = user_error(
        &run_args(&["--console", s(&existing)]),
        &["--console", "exists", "--console-append"],
    );
    assert!(r.stdout.is_empty());
    assert_eq!(std::fs::read(&existing).unwrap(), b"precious\n");
    user_error(
        &run_args(&["--console", "/nonexistent/dir/c.log"]),
        &["--console", "does not exist"],
    );
    user_error(
        &run_args(&["--console", s(dir.path())]),
        &["--console", "is a directory"],
    );
    user_error(
        &run_args(&["--console-append"]),
        &["--console-append", "--console FILE"],
    );
    user_error(&run_args(&["--console="]), &["--console", "empty"]);
}

#[test]
fn console_streams_and_append() {
    let dir = tempfile::tempdir().unwrap();
    let k = hello_kernel(dir.path());
    let base = |extra: &[&str]| -> Bounded {
        let mut a = vec![
            "run",
            "--kernel",
            s(&k),
            "--memory",
            "128M",
            "--guest",
            SHAPE,
            "--timeout",
            "60s",
        ];
        a.extend_from_slice(extra);
        run_bounded(&a, Duration::from_secs(90))
    };
    let cwd_stderr = Path::new("stderr");
    let before = cwd_stderr.exists();
    let r = base(&["--console=stderr"]);
    assert_eq!(r.code, Some(0), "{}", r.context());
    assert!(r.stderr.contains("hello from the guest"), "{}", r.context());
    assert!(r.stdout.is_empty(), "{}", r.context());
    assert_eq!(cwd_stderr.exists(), before, "a file named stderr appeared");
    for stdout in ["stdout", "-"] {
        let r = base(&["--console", stdout]);
        assert_eq!(r.code, Some(0), "{}", r.context());
        assert_eq!(r.stdout, "hello from the guest\n", "{}", r.context());
        assert!(!Path::new(stdout).exists() || stdout == "-");
    }
    let log = write(dir.path(), "c.log", b"old\n");
    let r = base(&["--console", s(&log), "--console-append"]);
    assert_eq!(r.code, Some(0), "{}", r.context());
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "old\nhello from the guest\n"
    );
    let new = dir.path().join("new.log");
    let r = base(&["--console", s(&new)]);
    assert_eq!(r.code, Some(0), "{}", r.context());
    assert_eq!(
        std::fs::read_to_string(&new).unwrap(),
        "hello from the guest\n"
    );
}

// ------------------------------------------------------------ timeout

/// `--timeout` counts from the start of the command: 1 ms runs out during
/// setup (or at once when the guest starts) and exits 124, never later.
#[test]
fn timeout_covers_setup() {
    let dir = tempfile::tempdir().unwrap();
    // A kernel that halts for ever with interrupts off: only the time
    // limit ends it.
    let k = write(dir.path(), "k", &tiny_kernel(&[0xfa, 0xf4, 0xeb, 0xfc]));
    let r = vmm(&[
        "run",
        "--kernel",
        s(&k),
        "--memory",
        "128M",
        "--guest",
        SHAPE,
        "--timeout",
        "1ms",
    ]);
    assert_exit(&r, 124, &["--timeout 1ms"]);
    assert!(r.elapsed < Duration::from_secs(5), "{}", r.context());
    // The user's mistake is the answer, not the clock.
    user_error(
        &run_args(&["--timeout", "1ms"]),
        &["--kernel /nonexistent/vmlinux", "no such file"],
    );
}

// ------------------------------------------------------------- colour

/// Piped stderr (and `NO_COLOR`) carries no escape codes: logs, clap's
/// errors and the VMM's own.
#[test]
fn no_colour_in_pipes() {
    for env in [&[][..], &[("NO_COLOR", "1")][..]] {
        let mut e = env.to_vec();
        e.push(("RUST_LOG", "debug"));
        for args in [
            &["topology", "show", "-t", "genoa-2s", "-f", "synthetic"][..],
            &["bench", "runq", "--duration", "0"][..],
            &["bench", "--bogus-flag"][..],
            &run_args(&["--pin="])[..],
        ] {
            let r = run_bounded_env(args, &e, LIMIT);
            assert!(!r.timed_out, "{}", r.context());
            assert!(
                !r.stderr.contains('\x1b') && !r.stdout.contains('\x1b'),
                "escape codes in {args:?}:\n{}",
                r.context()
            );
        }
    }
}

/// A reader that goes away (`vmm ... | head -1`) ends `vmm` quietly with
/// status 141, as SIGPIPE would end a C tool, not with a panic about a
/// broken pipe.
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(integration_tests::vmm_bin())
        // some 100 KB of JSON, more than a pipe holds
        .args(["topology", "show", "-t", "gnr-2s", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // read one byte, then close the pipe: the rest cannot be written
    let mut out = child.stdout.take().unwrap();
    let mut b = [0u8; 1];
    out.read_exact(&mut b).unwrap();
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(st.code(), Some(141), "{err}");
}
