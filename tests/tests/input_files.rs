//! Input files that never end, by class, in every subcommand: a FIFO, a
//! device (`/dev/zero`, `/dev/null`, `/dev/stdin`), a directory, a socket
//! or an absurdly large (sparse) file given where a file is read. Each is
//! refused at once (exit 2) before it is opened for reading, in bounded
//! memory, with one line that names the flag, what the path is and what
//! to give instead; nothing in the directory is touched (no output made,
//! no socket bound, the FIFO still a FIFO).

use std::path::{Path, PathBuf};

use integration_tests::tiny_kernel;
use integration_tests::user_error::{mkfifo, s, sim_user_error, snapshot, user_error};

/// A directory with a FIFO `p`, a regular tiny kernel `k`, a Unix socket
/// `sock`, and sparse files over every limit.
struct Files {
    dir: tempfile::TempDir,
    fifo: PathBuf,
    kernel: PathBuf,
    sock: PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("p");
        mkfifo(&fifo);
        let kernel = dir.path().join("k");
        std::fs::write(&kernel, tiny_kernel(&[0xf4])).unwrap();
        let sock = dir.path().join("sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        Files {
            dir,
            fifo,
            kernel,
            sock,
            _listener: listener,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A sparse file of `len` bytes named `name`.
    fn sparse(&self, name: &str, len: u64) -> PathBuf {
        let p = self.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(len).unwrap();
        p
    }
}

/// Every place that reads a file, with `bad` put there: the arguments and
/// the flag the message must name.
fn places<'a>(f: &'a Files, bad: &'a str, out: &'a str) -> Vec<(Vec<&'a str>, &'a str)> {
    let k = s(&f.kernel);
    let run = |extra: &[&'a str]| {
        let mut v = vec!["run", "--memory", "128M"];
        v.extend_from_slice(extra);
        v
    };
    vec![
        (run(&["--kernel", bad, "--guest", "pu:1"]), "--kernel"),
        (
            run(&["--kernel", k, "--initrd", bad, "--guest", "pu:1"]),
            "--initrd",
        ),
        (vec!["run", "--config", bad], "--config"),
        (run(&["--kernel", k, "--guest", bad]), bad),
        (vec!["topology", "show", "-t", bad], bad),
        (vec!["topology", "guest", "-g", bad], bad),
        (vec!["topology", "cpuid-dump", "-g", bad, "-o", out], bad),
        (vec!["plan", "-t", bad, "-g", "pu:1"], "--topology"),
        (vec!["plan", "-g", bad], "--guest"),
        (vec!["plan", "--request", bad], "--request"),
        (
            vec!["serve", "--api-socket", out, "--config", bad],
            "--config",
        ),
        (vec!["serve", "--api-socket", out, "-t", bad], "--topology"),
        (vec!["sched-bench", "cyclic", "-t", bad], "--topology"),
        (vec!["bench", "cyclic", "-t", bad], "--topology"),
        (vec!["sim", "cyclic", "--topology", bad], "--topology"),
    ]
}

/// Runs every place with `bad` and checks the class's rules; `what` is
/// what the message must call it.
fn refused_everywhere(f: &Files, bad: &str, what: &[&str]) {
    let out = f.path().join("new-output");
    let before = snapshot(f.path());
    for (args, flag) in places(f, bad, s(&out)) {
        let mut want = vec![flag];
        want.extend_from_slice(what);
        user_error(&args, &want);
    }
    assert_eq!(snapshot(f.path()), before, "a file was touched");
}

#[test]
fn a_fifo_is_refused_before_it_is_opened() {
    let f = Files::new();
    refused_everywhere(&f, s(&f.fifo), &["a named pipe (FIFO)", "give"]);
    // The same through a symbolic link.
    let link = f.path().join("link");
    std::os::unix::fs::symlink(&f.fifo, &link).unwrap();
    refused_everywhere(&f, s(&link), &["a named pipe (FIFO)"]);
    // The simulator's own binary refuses it the same way.
    sim_user_error(
        &["cyclic", "--topology", s(&f.fifo)],
        &["--topology", "a named pipe (FIFO)"],
    );
}

#[test]
fn devices_sockets_and_directories_are_refused() {
    let f = Files::new();
    for dev in ["/dev/zero", "/dev/null", "/dev/stdin"] {
        refused_everywhere(&f, dev, &["a character device"]);
    }
    refused_everywhere(&f, s(&f.sock), &["a socket"]);
    // A directory is a CPUID dump where a topology goes: that check says
    // what it lacks; everywhere a file goes, it is "a directory".
    let d = f.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let k = s(&f.kernel);
    for (args, want) in [
        (
            vec!["run", "--kernel", s(&d), "--memory", "128M", "-g", "pu:1"],
            "--kernel",
        ),
        (
            vec![
                "run",
                "--kernel",
                k,
                "--initrd",
                s(&d),
                "--memory",
                "128M",
                "-g",
                "pu:1",
            ],
            "--initrd",
        ),
        (vec!["run", "--config", s(&d)], "--config"),
        (vec!["plan", "--request", s(&d)], "--request"),
    ] {
        user_error(&args, &[want, "a directory, not a regular file", "give"]);
    }
}

/// Files larger than any real one: refused from their size, never read
/// (the files are sparse, so the test itself stays cheap).
#[test]
fn absurd_sizes_are_refused_unread() {
    let f = Files::new();
    let huge = f.sparse("huge", 3 << 30);
    let mib2 = f.sparse("two-mib", 2 << 20);
    let k = s(&f.kernel);
    let run = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = ["run", "--memory", "128M", "--guest", "pu:1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let mut kernel = run(&["--kernel"]);
    kernel.push(s(&huge).into());
    let mut initrd = run(&["--kernel"]);
    initrd.extend([k.to_string(), "--initrd".into(), s(&huge).into()]);
    let before = snapshot(f.path());
    for (args, want) in [
        (kernel, vec!["--kernel", "the limit is 2147483648 (2 GiB)"]),
        (initrd, vec!["--initrd", "the limit is 2147483648 (2 GiB)"]),
        (
            vec!["run".into(), "--config".into(), s(&mib2).into()],
            vec!["--config", "the limit is 1048576 (1 MiB)", "a TOML file"],
        ),
        (
            vec!["plan".into(), "--request".into(), s(&mib2).into()],
            vec!["--request", "the limit is 1048576 (1 MiB)"],
        ),
        (
            vec![
                "serve".into(),
                "--api-socket".into(),
                s(&f.path().join("api.sock")).into(),
                "--config".into(),
                s(&mib2).into(),
            ],
            vec!["--config", "the limit is 1048576 (1 MiB)"],
        ),
        (
            vec![
                "topology".into(),
                "show".into(),
                "-t".into(),
                s(&huge).into(),
            ],
            vec!["the limit is 16777216 (16 MiB)"],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        user_error(&args, &want);
    }
    assert_eq!(snapshot(f.path()), before, "a file was touched");
}

/// A CPUID dump directory whose files never end: hwloc would open them;
/// they are refused first.
#[test]
fn a_dump_directory_with_a_fifo() {
    let f = Files::new();
    let d = f.path().join("dump");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("hwloc-cpuid-info"), "Architecture: x86\n").unwrap();
    mkfifo(&d.join("pu0"));
    let before = snapshot(f.path());
    for args in [
        vec!["topology", "show", "-t", s(&d)],
        vec!["topology", "guest", "-g", s(&d)],
        vec!["sched-bench", "cyclic", "-t", s(&d)],
    ] {
        user_error(&args, &["pu0 is a named pipe (FIFO), not a regular file"]);
    }
    std::fs::remove_file(d.join("pu0")).unwrap();
    std::fs::write(d.join("pu0"), "").unwrap();
    std::fs::remove_file(d.join("hwloc-cpuid-info")).unwrap();
    mkfifo(&d.join("hwloc-cpuid-info"));
    let swapped = snapshot(&d);
    user_error(
        &["topology", "show", "-t", s(&d)],
        &["hwloc-cpuid-info is a named pipe (FIFO)"],
    );
    let left = snapshot(&d);
    assert_eq!(left, swapped, "the dump was touched");
    assert!(left.values().any(|v| v == "fifo"), "{left:?}");
    assert_eq!(before.len(), snapshot(f.path()).len());
}
