//! OS threads: CPU affinity, scheduling policy and signals, in one place.
//!
//! WHAT: thin safe wrappers over the `libc` calls the executors and the VMM
//! make about their own threads: the allowed host CPUs, pinning to a CPU,
//! the host scheduling policy (`SCHED_FIFO`, `SCHED_RR`, `SCHED_OTHER`),
//! and the thread-directed signal the VMM kicks a vCPU out of `KVM_RUN`
//! with. (Thread names are set with `std::thread::Builder::name`.)
//!
//! WHY: copies of these calls lived in the threads executor and in several
//! VMM files, each with its own `unsafe` block and error text. One module
//! keeps the `unsafe` in one place, each block with its reason.
//!
//! HOW: the primitives ([`allowed_cpus`], [`set_affinity`], [`set_policy`])
//! act on the calling thread (pid 0) and return the OS error as
//! `std::io::Error`; the executor-facing functions below them add context
//! and return [`SchedError`]. [`install_interrupting_handler`],
//! [`OsThread::current`] and [`OsThread::signal`] are the signal side.

use std::io;

use crate::error::{Result, SchedError};
use crate::task::Policy;

/// A host scheduling policy for the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPolicy {
    /// `SCHED_FIFO` at this priority (1..=99).
    Fifo(u8),
    /// `SCHED_RR` at this priority (1..=99).
    Rr(u8),
    /// `SCHED_OTHER`, the default time-sharing policy.
    Other,
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<Vec<u32>> {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set; pid 0 is the
    // calling thread; sched_getaffinity writes at most the size we pass,
    // which is the set's own size.
    let (rc, set) = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        (rc, set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads bit `c` of the set, and `c` is below
        // CPU_SETSIZE, the set's size in bits.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c as u32)
        .collect())
}

/// Restricts the calling thread to `cpus`. CPUs at or above the kernel
/// set size (`CPU_SETSIZE`, 1024) cannot be named and are left out; a set
/// left empty is refused by the kernel (`EINVAL`).
pub fn set_affinity(cpus: &[u32]) -> io::Result<()> {
    set_thread_affinity(0, cpus)
}

/// Restricts thread `tid` of this process (0: the calling thread) to
/// `cpus`, as [`set_affinity`] does.
pub fn set_thread_affinity(tid: u32, cpus: &[u32]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set; CPU_SET only
    // writes bit `c`, checked to be below CPU_SETSIZE; sched_setaffinity
    // reads exactly the size we pass, the set's own, and names a thread
    // by its id (a thread that is gone fails with ESRCH).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if (c as usize) < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c as usize, &mut set);
            }
        }
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the calling thread's host scheduling policy. RT policies need
/// `CAP_SYS_NICE` or an RT rlimit (`EPERM` otherwise).
pub fn set_policy(p: HostPolicy) -> io::Result<()> {
    let (policy, prio) = match p {
        HostPolicy::Fifo(x) => (libc::SCHED_FIFO, x as libc::c_int),
        HostPolicy::Rr(x) => (libc::SCHED_RR, x as libc::c_int),
        HostPolicy::Other => (libc::SCHED_OTHER, 0),
    };
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param
    // that outlives the call, which only reads it.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the calling thread's timer slack to `ns` (Linux's default for a
/// `SCHED_OTHER` thread is 50 us: its timed sleeps may end that late).
pub fn set_timer_slack(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer argument and changes
    // only the calling thread's timer slack; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Installs an empty handler for `sig` without `SA_RESTART`, so that a
/// blocking system call of the thread that receives it (such as
/// `KVM_RUN`) returns `EINTR` instead of being restarted.
pub fn install_interrupting_handler(sig: libc::c_int) -> io::Result<()> {
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value;
    // the handler is an `extern "C"` function that touches nothing, so it
    // is async-signal-safe; sigaction only reads `sa`, which outlives the
    // call, and the old action is not asked for (null).
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(sig, &sa, std::ptr::null_mut())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A thread of this process, as a signal target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OsThread(libc::pthread_t);

impl OsThread {
    /// The calling thread.
    pub fn current() -> Self {
        // SAFETY: pthread_self has no preconditions and cannot fail.
        OsThread(unsafe { libc::pthread_self() })
    }

    /// Sends `sig` to the thread.
    ///
    /// # Safety
    /// The thread must still be alive: POSIX leaves signalling an ended
    /// thread undefined (its id may have been reused). Callers keep the
    /// thread from ending while they hold its handle, e.g. by clearing the
    /// handle under a lock that the signaller also holds.
    pub unsafe fn signal(self, sig: libc::c_int) -> io::Result<()> {
        // SAFETY: the caller guarantees the thread is alive (see above).
        let rc = unsafe { libc::pthread_kill(self.0, sig) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
    }
}

/// The host CPU the calling thread is running on right now (`sched_getcpu`;
/// it may move the next instant), or `None` where the kernel cannot say.
pub fn current_host_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu takes no arguments and only reads the calling
    // thread's CPU number (through the vDSO or rseq area); no memory of
    // ours is touched.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// The host CPUs this process may run on.
pub fn allowed_host_cpus() -> Result<Vec<u32>> {
    allowed_cpus().map_err(|source| SchedError::Os {
        context: "sched_getaffinity".into(),
        source,
    })
}

/// Sets the calling thread's host scheduling policy (`SCHED_FIFO` or
/// `SCHED_RR` at the task's priority; `Fair` leaves it as it is).
pub fn set_current_thread_policy(p: Policy) -> Result<()> {
    let host = match p {
        Policy::Fifo(x) => HostPolicy::Fifo(x),
        Policy::Rr(x) => HostPolicy::Rr(x),
        Policy::Fair(_) => return Ok(()),
    };
    set_policy(host).map_err(|source| SchedError::Os {
        context: format!("cannot set host {p:?} (needs CAP_SYS_NICE or an RT rlimit)"),
        source,
    })
}

/// Gives the calling thread host `SCHED_FIFO` at `prio + above` (at most
/// 99); where that is not permitted, warns once per process and goes on.
pub fn set_host_rt(prio: u8, above: u8) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let p = prio.saturating_add(above).clamp(1, 99);
    if let Err(e) = set_current_thread_policy(Policy::Fifo(p)) {
        WARNED.call_once(|| tracing::warn!("executor threads stay SCHED_OTHER: {e}"));
    }
}

/// Pins the calling thread to host CPU `cpu`.
pub fn pin_current_thread(cpu: u32) -> Result<()> {
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(SchedError::Config(format!(
            "host CPU {cpu} is out of range"
        )));
    }
    set_affinity(&[cpu]).map_err(|source| SchedError::Os {
        context: format!("cannot pin a thread to host CPU {cpu}"),
        source,
    })
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    #[test]
    fn affinity_round_trip_on_a_thread_of_its_own() {
        std::thread::spawn(|| {
            let all = allowed_cpus().unwrap();
            assert!(!all.is_empty());
            set_affinity(&all[..1]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), all[..1].to_vec());
            // nothing nameable left: the kernel refuses the empty set
            let e = set_affinity(&[1 << 20]).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
            assert!(pin_current_thread(1 << 20).is_err());
            pin_current_thread(all[0]).unwrap();
            // SCHED_OTHER is always allowed
            set_policy(HostPolicy::Other).unwrap();
        })
        .join()
        .unwrap();
    }
}

/// What the kernel says thread `tid` of this process is doing, for
/// diagnostics of a stuck thread: its state letter (R running or
/// runnable, S sleeping, D uninterruptible), the system call it is in (a
/// number, or "running" in user space) and the top of its kernel stack
/// (readable by root only; empty otherwise).
pub fn describe_thread(tid: u32) -> String {
    let base = format!("/proc/self/task/{tid}");
    let state = std::fs::read_to_string(format!("{base}/stat"))
        .ok()
        .and_then(|s| {
            // the name is in parentheses and may hold spaces
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().next().map(str::to_string)
        })
        .unwrap_or_else(|| "?".into());
    let syscall = std::fs::read_to_string(format!("{base}/syscall"))
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let stack: Vec<String> = std::fs::read_to_string(format!("{base}/stack"))
        .unwrap_or_default()
        .lines()
        .take(6)
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|f| f.split('+').next().unwrap_or(f).to_string())
        .collect();
    format!(
        "thread {tid}: state {state}, syscall {syscall}, kernel stack [{}]",
        stack.join(" < ")
    )
}
