//! A bounded run of the `vmm` binary: a time limit, captured output, and
//! the child's peak memory.
//!
//! WHAT: [`run_bounded`] runs `vmm ARGS` and returns a [`Bounded`]: exit
//! code, stdout, stderr, wall time, peak RSS, and whether it had to be
//! killed. [`run_bounded_env`] does the same with extra environment
//! variables.
//! WHY: tests of bad input must prove that the VMM neither hangs nor blows
//! up memory, not only that it prints the right message.
//! HOW: spawns the child with piped stdout and stderr (read on two
//! threads, so a chatty child never blocks), polls `wait4(pid, WNOHANG)`
//! until it exits or the deadline passes (then SIGKILL and a blocking
//! `wait4`), and takes `ru_maxrss` from that `wait4`'s rusage, which is the
//! child's own (not every child of the test process, as
//! `getrusage(RUSAGE_CHILDREN)` would be).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a bounded run produced.
#[derive(Clone, Debug)]
pub struct Bounded {
    /// Exit code; `None` when a signal ended it (also after a timeout).
    pub code: Option<i32>,
    /// Everything on stdout.
    pub stdout: String,
    /// Everything on stderr.
    pub stderr: String,
    /// Wall time from spawn to exit (or kill).
    pub elapsed: Duration,
    /// The child's peak resident set, KiB (`ru_maxrss`).
    pub max_rss_kb: u64,
    /// It ran past the limit and was killed.
    pub timed_out: bool,
}

impl Bounded {
    /// A summary for assertion messages.
    pub fn context(&self) -> String {
        format!(
            "code {:?} after {:.2} s, peak RSS {} KiB{}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            self.code,
            self.elapsed.as_secs_f64(),
            self.max_rss_kb,
            if self.timed_out {
                ", KILLED (timeout)"
            } else {
                ""
            },
            self.stderr,
            self.stdout
        )
    }
}

/// Runs `vmm ARGS` (see [`crate::vmm_bin`]) for at most `timeout`.
pub fn run_bounded(args: &[&str], timeout: Duration) -> Bounded {
    run_bounded_env(args, &[], timeout)
}

/// [`run_bounded`] with `env` added to the child's environment.
pub fn run_bounded_env(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Bounded {
    let start = Instant::now();
    let mut cmd = Command::new(crate::vmm_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("starting vmm");
    let pid = child.id() as libc::pid_t;
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let err = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let mut timed_out = false;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status: libc::c_int = 0;
    loop {
        let flags = if timed_out { 0 } else { libc::WNOHANG };
        // SAFETY: `pid` is our own child, not yet reaped (only this loop
        // reaps it); `status` and `usage` are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if r == pid {
            break;
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            panic!("wait4 on vmm (pid {pid}): {e}");
        }
        if start.elapsed() >= timeout {
            timed_out = true;
            // SAFETY: the child is not reaped yet, so `pid` is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            continue;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = start.elapsed();
    // The child is reaped; std's handle must not wait for it again.
    drop(child);
    let code = if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    };
    Bounded {
        code,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed,
        max_rss_kb: usage.ru_maxrss.max(0) as u64,
        timed_out,
    }
}
