//! OS threads: CPU affinity, scheduling policy and names, in one place.
//!
//! WHAT: thin safe wrappers over the `libc` calls the executors and the VMM
//! make about their own threads: the allowed host CPUs, pinning to a CPU,
//! the host scheduling policy (`SCHED_FIFO`, `SCHED_RR`, `SCHED_OTHER`).
//!
//! WHY: copies of these calls lived in the threads executor and in several
//! VMM files, each with its own `unsafe` block and error text. One module
//! keeps the `unsafe` in one place, each block with its reason.
//!
//! HOW: every function acts on the calling thread (pid 0) and returns a
//! typed error naming the call that failed.

use crate::error::{Result, SchedError};
use crate::task::Policy;

/// The host CPUs this process may run on.
pub fn allowed_host_cpus() -> Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it, and pid 0 means this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(SchedError::Os {
                context: "sched_getaffinity".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok((0..libc::CPU_SETSIZE as u32)
            .filter(|&c| libc::CPU_ISSET(c as usize, &set))
            .collect())
    }
}

/// Sets the calling thread's host scheduling policy (`SCHED_FIFO` or
/// `SCHED_RR` at the task's priority; `Fair` leaves it as it is).
pub fn set_current_thread_policy(p: Policy) -> Result<()> {
    let (policy, prio) = match p {
        Policy::Fifo(x) => (libc::SCHED_FIFO, x),
        Policy::Rr(x) => (libc::SCHED_RR, x),
        Policy::Fair(_) => return Ok(()),
    };
    let param = libc::sched_param {
        sched_priority: prio as libc::c_int,
    };
    // SAFETY: pid 0 is the calling thread; `param` lives across the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(SchedError::Os {
            context: format!("cannot set host {p:?} (needs CAP_SYS_NICE or an RT rlimit)"),
            source: std::io::Error::last_os_error(),
        })
    }
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
    // SAFETY: the set is zeroed plain data and CPU_SET writes inside it
    // (cpu is below CPU_SETSIZE); sched_setaffinity only reads it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(SchedError::Os {
            context: format!("cannot pin a thread to host CPU {cpu}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
