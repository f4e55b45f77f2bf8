//! The baseline: plain 1:1 vCPU threads scheduled by the host kernel, as
//! Cloud Hypervisor and Firecracker run them. No `vcpu_sched` at all.
//!
//! Each vCPU gets a thread; an RT vCPU's thread gets `SCHED_FIFO` (or
//! `SCHED_RR`) at the same priority, a fair one stays `SCHED_OTHER`. A
//! vCPU with an affinity is pinned to the host CPUs its logical CPUs map
//! to. Without permission for RT policies (`EPERM`) the threads stay
//! `SCHED_OTHER`, with a warning. `HLT` parks the thread until a doorbell unparks it (wakes are
//! remembered one deep, as in the scheduler); `SLEEP` is a `nanosleep`;
//! `YIELD` is `sched_yield`.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vcpu_sched::exec::set_current_thread_policy;
use vcpu_sched::{Policy, SchedError};

use super::{enter, resumed, Action, ExecOptions, ExecOutcome, Resume, TaskError, VcpuSlot, VmSet};

/// Per vCPU thread: `(time on CPU, time waiting)` once it ended.
type SchedStats = Arc<Mutex<Vec<Option<(u64, u64)>>>>;

pub(crate) struct HostRun {
    set: Arc<VmSet>,
    handles: Vec<JoinHandle<()>>,
    schedstat: SchedStats,
}

/// Wakes a vCPU thread (its token, then unpark).
pub(crate) fn wake_slot(s: &VcpuSlot) {
    s.token.store(true, Ordering::Release);
    if let Some(t) = s.thread.get() {
        t.unpark();
    }
}

/// Logs `msg` once per process.
pub(crate) fn warn_once(msg: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| tracing::warn!("{msg}"));
}

fn pin_to(cpus: &[u32]) -> std::io::Result<()> {
    vcpu_sched::os_thread::set_affinity(cpus)
}

/// `(time on CPU, time waiting on a run queue)` of the calling thread.
fn thread_schedstat() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

fn body(set: &VmSet, slot: &VcpuSlot) {
    let vm = set.vms()[slot.vm].clone();
    let mut st = slot.lock();
    let parked = |st_set: &VmSet| {
        while !slot.token.swap(false, Ordering::AcqRel) {
            if st_set.stopping() || vm.control.is_stopping() {
                return;
            }
            std::thread::park();
        }
    };
    loop {
        match enter(set, &vm, &mut st) {
            Action::Continue => {}
            Action::Block => {
                let t0 = set.now();
                parked(set);
                resumed(set, slot, &mut st.m, Resume::Halt(t0));
            }
            Action::Sleep(ns) => {
                let due = set.now() + ns;
                std::thread::sleep(Duration::from_nanos(ns));
                resumed(set, slot, &mut st.m, Resume::Timer(due));
            }
            Action::Yield => {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            Action::Wake(k) => {
                if let Some(s) = set.doorbell(slot.vm, k, set.now()) {
                    wake_slot(s);
                }
            }
            Action::Exit => break,
            Action::Fail(r) => {
                set.fail_vm(slot.vm, r, &wake_slot);
                break;
            }
        }
    }
    set.vcpu_exited(slot, &mut st);
}

impl HostRun {
    pub(crate) fn start(opts: &ExecOptions, set: &Arc<VmSet>) -> Result<Self, TaskError> {
        let n = set.slots().len();
        let rt = set
            .slots()
            .iter()
            .filter(|s| !matches!(s.placement.policy, Policy::Fair(_)))
            .count();
        let host_cpus = vcpu_sched::exec::allowed_host_cpus().map_or(0, |v| v.len());
        if rt > host_cpus {
            // KVM-NOTES: equal-priority FIFO threads never time-slice; a
            // vCPU that spins in the guest starves the others on its CPU.
            tracing::warn!(
                "{rt} RT vCPU threads on {host_cpus} host CPUs: a vCPU that does not block starves the others on its CPU"
            );
        }
        let schedstat: SchedStats = Arc::new(Mutex::new(vec![None; n]));
        let (tx, rx) = mpsc::channel::<Result<(), String>>();
        let mut handles = Vec::with_capacity(n);
        for slot in set.slots() {
            let pins: Option<Vec<u32>> = slot.placement.affinity.as_ref().map(|m| {
                let mut v: Vec<u32> = m.iter().map(|c| opts.host_cpu(c)).collect();
                v.sort_unstable();
                v.dedup();
                v
            });
            let policy = slot.placement.policy;
            let (set2, slot2, tx2, ss) = (set.clone(), slot.clone(), tx.clone(), schedstat.clone());
            let name = format!("v{}.{}", slot.vm, slot.index);
            let h = std::thread::Builder::new()
                .name(name)
                .stack_size(256 << 10)
                .spawn(move || {
                    let mut setup = Ok(());
                    if let Some(p) = &pins {
                        if let Err(e) = pin_to(p) {
                            setup =
                                Err(format!("cannot pin a vCPU thread to host CPUs {p:?}: {e}"));
                        }
                    }
                    if setup.is_ok() {
                        if let Err(e) = set_current_thread_policy(policy) {
                            let eperm = matches!(&e, SchedError::Os { source, .. }
                                if source.raw_os_error() == Some(libc::EPERM));
                            if eperm {
                                // Not permitted (no root, CAP_SYS_NICE or
                                // RLIMIT_RTPRIO): run on as SCHED_OTHER.
                                warn_once(&format!(
                                    "vCPU threads stay SCHED_OTHER: the policy {policy} is not permitted \
                                     (needs root, CAP_SYS_NICE or a high enough RLIMIT_RTPRIO)"
                                ));
                            } else {
                                setup = Err(format!(
                                    "cannot give a vCPU thread the policy {policy}: {e}"
                                ));
                            }
                        }
                    }
                    let _ = slot2.thread.set(std::thread::current());
                    let ok = setup.is_ok();
                    let _ = tx2.send(setup);
                    while !set2.started() && !set2.stopping() {
                        std::thread::park();
                    }
                    if ok && !set2.stopping() {
                        body(&set2, &slot2);
                    } else {
                        let mut st = slot2.lock();
                        set2.vcpu_exited(&slot2, &mut st);
                    }
                    let s = thread_schedstat();
                    ss.lock().unwrap_or_else(|p| p.into_inner())[slot2.global] = s;
                })
                .map_err(|e| TaskError::Os {
                    context: format!(
                        "cannot start the thread of vCPU {} of VM {}",
                        slot.index, slot.vm
                    ),
                    source: e,
                })?;
            handles.push(h);
        }
        drop(tx);
        let mut err = None;
        for _ in 0..n {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    err.get_or_insert(e);
                }
                Err(_) => {
                    err.get_or_insert("a vCPU thread died during setup".into());
                }
            }
        }
        let run = Self {
            set: set.clone(),
            handles,
            schedstat,
        };
        if let Some(e) = err {
            let _ = run.shutdown(Duration::from_secs(10));
            return Err(TaskError::Input(e));
        }
        set.mark_started();
        for s in set.slots() {
            if let Some(t) = s.thread.get() {
                t.unpark();
            }
        }
        Ok(run)
    }

    pub(crate) fn shutdown(self, timeout: Duration) -> Result<ExecOutcome, TaskError> {
        self.set.request_stop();
        let deadline = Instant::now() + timeout;
        let mut handles = self.handles;
        while !handles.is_empty() {
            for s in self.set.slots() {
                wake_slot(s);
            }
            let (done, rest): (Vec<_>, Vec<_>) = handles.into_iter().partition(|h| h.is_finished());
            for h in done {
                let _ = h.join();
            }
            handles = rest;
            if handles.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(TaskError::Stuck(format!(
                    "{} vCPU threads did not end within {timeout:?}",
                    handles.len()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let n = self.set.slots().len();
        Ok(ExecOutcome {
            tasks: vec![None; n],
            host_schedstat: std::mem::take(
                &mut *self.schedstat.lock().unwrap_or_else(|p| p.into_inner()),
            ),
            ..ExecOutcome::default()
        })
    }
}
