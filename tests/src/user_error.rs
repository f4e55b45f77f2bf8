//! What every bad-input test of the `vmm` binary checks, by class
//! (`tests/tests/input_files.rs`, `output_files.rs`, `work_limits.rs`,
//! `measured_nothing.rs`): the exit status, the time (a hang is a
//! failure: the limit is well below the test's own), the peak memory (an
//! unbounded read), the message (one line naming the problem and the
//! fix, no Rust debug text), and that no file was touched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::run_bounded::{run_bounded, run_bounded_cmd, Bounded};

/// How long a refused command may take: the checks come before any work.
pub const QUICK: Duration = Duration::from_secs(5);
/// When a command is killed as hung (well below any test's own limit).
pub const HANG: Duration = Duration::from_secs(15);
/// The peak resident set a refused command may reach (an unbounded read
/// of `/dev/zero` or a sparse file would pass it at once).
pub const MAX_RSS_KB: u64 = 256 << 10;

/// Text that must never reach a user: panics and Rust's debug formatting.
pub const LEAKS: &[&str] = &[
    "panicked",
    "RUST_BACKTRACE",
    "Some(",
    "Errno",
    "os error",
    "untagged enum",
    "StrOrInt",
    "expected u32",
    "expected u64",
    "NaN",
    "inf%",
];

/// Asserts that `r` ended by itself with `code`, within [`QUICK`], under
/// [`MAX_RSS_KB`], with one `error: ` line holding every needle and none
/// of [`LEAKS`].
#[track_caller]
pub fn assert_refused(r: &Bounded, code: i32, needles: &[&str]) {
    assert!(!r.timed_out, "hung:\n{}", r.context());
    assert_eq!(r.code, Some(code), "{}", r.context());
    assert!(r.elapsed < QUICK, "took {:?}:\n{}", r.elapsed, r.context());
    assert!(r.max_rss_kb < MAX_RSS_KB, "memory:\n{}", r.context());
    for leak in LEAKS {
        assert!(!r.stderr.contains(leak), "{leak:?}:\n{}", r.context());
    }
    let lines: Vec<&str> = r.stderr.trim().lines().collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{}", r.context());
    assert!(lines[0].starts_with("error: "), "{}", r.context());
    for n in needles {
        assert!(lines[0].contains(n), "missing {n:?}:\n{}", r.context());
    }
}

/// Runs `vmm ARGS` and asserts it is refused as the user's mistake (exit
/// 2, [`assert_refused`]).
#[track_caller]
pub fn user_error(args: &[&str], needles: &[&str]) -> Bounded {
    let r = run_bounded(args, HANG);
    assert_refused(&r, 2, needles);
    r
}

/// [`user_error`] for the simulator's own binary, `vmm-sim` (beside
/// `vmm`), which `vmm sim` runs.
#[track_caller]
pub fn sim_user_error(args: &[&str], needles: &[&str]) -> Bounded {
    let mut cmd = std::process::Command::new(crate::vmm_bin().with_file_name("vmm-sim"));
    cmd.args(args);
    let r = run_bounded_cmd(cmd, HANG);
    assert_refused(&r, 2, needles);
    r
}

/// Makes a FIFO at `p`.
pub fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().expect("UTF-8 path")).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A path as `&str`.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// What is in a directory tree, to see that nothing was touched: every
/// path with its kind; for a regular file its inode, size and change
/// times, and for a small one a hash of its bytes (links are not
/// followed). A large file (the tests' sparse files of gigabytes) is never
/// read: reading it would grow this process, and a child forked from it
/// inherits that peak in its `ru_maxrss`.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    use std::os::unix::fs::FileTypeExt as _;
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for ent in std::fs::read_dir(&d).expect("reading the test directory") {
            let ent = ent.unwrap();
            let p = ent.path();
            let ft = std::fs::symlink_metadata(&p).unwrap().file_type();
            let what = if ft.is_dir() {
                todo.push(p.clone());
                "dir".to_string()
            } else if ft.is_symlink() {
                format!("link -> {}", std::fs::read_link(&p).unwrap().display())
            } else if ft.is_fifo() {
                "fifo".to_string()
            } else if ft.is_socket() {
                "socket".to_string()
            } else {
                file_state(&p)
            };
            out.insert(p, what);
        }
    }
    out
}

/// A regular file's identity and times, and a hash of its bytes when it
/// is at most 1 MiB.
fn file_state(p: &Path) -> String {
    use std::hash::{Hash as _, Hasher as _};
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(p).unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if m.len() <= 1 << 20 {
        std::fs::read(p).unwrap().hash(&mut h);
    }
    format!(
        "file ino {} len {} mtime {}.{} ctime {}.{} hash {:x}",
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        h.finish()
    )
}
