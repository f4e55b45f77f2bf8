//! Running a command under a time limit, measuring its peak memory, and
//! keeping only a bounded amount of its output: for tests that feed the
//! `vmm` binary bad input and must fail (not hang or eat the machine) when
//! it misbehaves.
//!
//! The child runs in its own process group, so that a timeout also kills
//! whatever it started (`lstopo`, for instance). Its peak resident set comes
//! from `wait4(2)`'s `rusage`, which counts the child alone.

use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The most bytes of each stream kept in [`BoundedOutput`]; the rest is
/// counted and dropped.
pub const KEEP_BYTES: usize = 1 << 20;

/// What a bounded run produced.
#[derive(Clone, Debug)]
pub struct BoundedOutput {
    /// The exit status, or `None` when a signal ended it.
    pub code: Option<i32>,
    /// The signal that ended it, if one did (SIGKILL after a timeout).
    pub signal: Option<i32>,
    /// Whether the time limit ran out and the child was killed.
    pub timed_out: bool,
    /// Up to [`KEEP_BYTES`] of stdout, lossily decoded.
    pub stdout: String,
    /// Up to [`KEEP_BYTES`] of stderr, lossily decoded.
    pub stderr: String,
    /// Every byte written to stdout, kept or not.
    pub stdout_bytes: u64,
    /// Every byte written to stderr, kept or not.
    pub stderr_bytes: u64,
    /// From spawn to exit.
    pub elapsed: Duration,
    /// The child's peak resident set, in KiB (`ru_maxrss`).
    pub max_rss_kb: u64,
}

/// The short name the CLI tests use.
pub type Bounded = BoundedOutput;

impl BoundedOutput {
    /// [`describe`](Self::describe) plus the whole stdout, for assertion
    /// messages of tests that read both streams.
    pub fn context(&self) -> String {
        format!(
            "{}\nstdout:\n{}",
            self.describe(),
            self.stdout.chars().take(4000).collect::<String>()
        )
    }

    /// A one-paragraph account for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "code {:?}, signal {:?}, timed out {}, {:.2?}, peak RSS {} KiB, \
             stdout {} bytes, stderr {} bytes:\n{}",
            self.code,
            self.signal,
            self.timed_out,
            self.elapsed,
            self.max_rss_kb,
            self.stdout_bytes,
            self.stderr_bytes,
            self.stderr.chars().take(4000).collect::<String>()
        )
    }
}

/// Drains a pipe, keeping the first [`KEEP_BYTES`].
fn drain(mut r: impl Read + Send + 'static) -> thread::JoinHandle<(Vec<u8>, u64)> {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut total = 0u64;
        let mut buf = [0u8; 64 << 10];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    let room = KEEP_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        (kept, total)
    })
}

/// Runs `vmm ARGS` (the binary from [`crate::vmm_bin`]) with stdin closed,
/// killing it after `timeout`.
pub fn run_bounded(args: &[&str], timeout: Duration) -> BoundedOutput {
    let mut cmd = Command::new(crate::vmm_bin());
    cmd.args(args);
    run_bounded_cmd(cmd, timeout)
}

/// [`run_bounded`] with `env` added to the child's environment.
pub fn run_bounded_env(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> BoundedOutput {
    let mut cmd = Command::new(crate::vmm_bin());
    cmd.args(args).envs(env.iter().copied());
    run_bounded_cmd(cmd, timeout)
}

/// Runs `cmd` with stdin closed, killing it (and its process group) after
/// `timeout`.
pub fn run_bounded_cmd(mut cmd: Command, timeout: Duration) -> BoundedOutput {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawning the command");
    let pid = child.id() as libc::pid_t;
    let out = drain(child.stdout.take().expect("piped stdout"));
    let err = drain(child.stderr.take().expect("piped stderr"));

    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; wait4 fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: `pid` is our unreaped child; the pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("wait4: {}", std::io::Error::last_os_error());
        }
        if !timed_out && start.elapsed() >= timeout {
            timed_out = true;
            // SAFETY: the child is not reaped yet, so `pid` (and its group,
            // which it leads) is still ours.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
        thread::sleep(Duration::from_millis(5));
    }
    let elapsed = start.elapsed();
    // Anything the child left running in its group goes too, so that the
    // pipes close.
    // SAFETY: killing a process group we created; ESRCH when it is empty.
    unsafe {
        libc::killpg(pid, libc::SIGKILL);
    }
    // `child` was reaped by wait4 above: never wait on it again.
    drop(child);
    let (stdout, stdout_bytes) = out.join().expect("stdout reader");
    let (stderr, stderr_bytes) = err.join().expect("stderr reader");
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    BoundedOutput {
        code,
        signal,
        timed_out,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        stdout_bytes,
        stderr_bytes,
        elapsed,
        max_rss_kb: usage.ru_maxrss.max(0) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleeper_is_killed_and_output_is_capped() {
        let mut c = Command::new("sh");
        c.args(["-c", "head -c 3000000 /dev/zero; sleep 30"]);
        let r = run_bounded_cmd(c, Duration::from_millis(500));
        assert!(r.timed_out, "{}", r.describe());
        assert_eq!(r.signal, Some(libc::SIGKILL));
        assert!(r.elapsed < Duration::from_secs(10));
        assert_eq!(r.stdout_bytes, 3_000_000);
        assert_eq!(r.stdout.len(), KEEP_BYTES);
    }

    #[test]
    fn exit_code_and_memory() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo oops >&2; exit 3"]);
        let r = run_bounded_cmd(c, Duration::from_secs(10));
        assert_eq!(r.code, Some(3));
        assert_eq!(r.stderr, "oops\n");
        assert!(!r.timed_out);
        assert!(
            r.max_rss_kb > 0 && r.max_rss_kb < 1 << 20,
            "{}",
            r.max_rss_kb
        );
    }
}
