//! The host 1:1 runner: plain vCPU threads scheduled by the host kernel,
//! as Cloud Hypervisor and Firecracker run them. No `vcpu_sched` at all.
//! It is the `host` executor of `vmm bench` (the baseline) and the runner
//! of `vmm run --sched host` ([`crate::vm::run_threads`]): the one place
//! that runs vCPUs one thread each.
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
use std::time::Duration;

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

/// How the vCPU threads are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ThreadNames {
    /// `v<VM>.<vCPU>` (many VMs in one process).
    PerVm,
    /// `vcpu<N>` (one VM: `vmm run`).
    Vcpu,
}

/// How [`HostRun`] sets up its threads.
#[derive(Clone, Debug)]
pub(crate) struct HostOptions {
    /// Host CPUs each vCPU's thread is pinned to, by global index (`None`,
    /// or a missing entry: not pinned).
    pub pins: Vec<Option<Vec<u32>>>,
    /// Thread names.
    pub names: ThreadNames,
    /// A policy the host does not permit (`EPERM`) fails the start instead
    /// of leaving the thread `SCHED_OTHER` with a warning.
    pub strict_policy: bool,
    /// Thread stack size (`None`: the Rust default).
    pub stack_size: Option<usize>,
}

impl HostOptions {
    /// The `host` executor's choices for `set`: each vCPU pinned to the
    /// host CPUs its placement's logical CPUs map to; small stacks, as
    /// there may be thousands.
    pub(crate) fn for_executor(opts: &ExecOptions, set: &VmSet) -> Self {
        let pins = set
            .slots()
            .iter()
            .map(|slot| {
                slot.placement.affinity.as_ref().map(|m| {
                    let mut v: Vec<u32> = m.iter().map(|c| opts.host_cpu(c)).collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                })
            })
            .collect();
        Self {
            pins,
            // A set of one VM (`vmm serve` runs each VM as its own set)
            // names its threads `vcpuN`, as orchestrators such as Kata
            // expect when they pin vCPU threads by name.
            names: if set.vms().len() == 1 {
                ThreadNames::Vcpu
            } else {
                ThreadNames::PerVm
            },
            strict_policy: false,
            stack_size: Some(256 << 10),
        }
    }
}

/// Warns when more RT vCPU threads than host CPUs could starve each other.
pub(crate) fn warn_rt_oversubscribed(set: &VmSet) {
    let rt = set
        .slots()
        .iter()
        .filter(|s| !matches!(s.placement.policy, Policy::Fair(_)))
        .count();
    let host_cpus = vcpu_sched::exec::allowed_host_cpus().map_or(0, |v| v.len());
    if rt > host_cpus {
        // docs/kvm-notes.md: equal-priority FIFO threads never time-slice; a
        // vCPU that spins in the guest starves the others on its CPU.
        tracing::warn!(
            "{rt} RT vCPU threads on {host_cpus} host CPUs: a vCPU that does not block starves the others on its CPU"
        );
    }
}

/// Pins the calling thread and gives it its policy; `Err` is a message
/// for the user.
fn setup_thread(slot: &VcpuSlot, pins: Option<&[u32]>, strict_policy: bool) -> Result<(), String> {
    let what = format!("vCPU {} of VM {}", slot.index, slot.vm);
    if let Some(p) = pins {
        pin_to(p)
            .map_err(|e| format!("cannot pin the thread of {what} to host CPUs {p:?}: {e}"))?;
    }
    let policy = slot.placement.policy;
    if let Err(e) = set_current_thread_policy(policy) {
        let eperm = matches!(&e, SchedError::Os { source, .. }
            if source.raw_os_error() == Some(libc::EPERM));
        const NEEDS: &str = "needs root, CAP_SYS_NICE or a high enough RLIMIT_RTPRIO";
        if !eperm {
            return Err(format!(
                "cannot give the thread of {what} the policy {policy}: {e}"
            ));
        }
        if strict_policy {
            return Err(format!(
                "--rt {policy}: cannot set the policy of the thread of {what}: {e} ({NEEDS})"
            ));
        }
        // Not permitted: run on as SCHED_OTHER.
        warn_once(&format!(
            "vCPU threads stay SCHED_OTHER: the policy {policy} is not permitted ({NEEDS})"
        ));
    }
    Ok(())
}

/// A vCPU thread: set up, report, wait for the start, run, record its
/// host run-queue statistics.
fn thread_main(
    set: &VmSet,
    slot: &VcpuSlot,
    setup: Result<(), String>,
    tx: mpsc::Sender<Result<(), String>>,
    schedstat: &SchedStats,
) {
    let _ = slot.thread.set(std::thread::current());
    let ok = setup.is_ok();
    let _ = tx.send(setup);
    drop(tx);
    while !set.started() && !set.stopping() {
        std::thread::park();
    }
    if ok && !set.stopping() {
        body(set, slot);
    } else {
        let mut st = slot.lock();
        set.vcpu_exited(slot, &mut st);
    }
    let s = thread_schedstat();
    schedstat.lock().unwrap_or_else(|p| p.into_inner())[slot.global] = s;
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
    // breakdown, block path: since when this thread waits to run again
    // (0: it ran on)
    let mut since = 0;
    loop {
        set.host_entering(slot, std::mem::take(&mut since), &mut st.m);
        match enter(set, &vm, &mut st) {
            Action::Continue => {}
            Action::Block => {
                let t0 = set.now();
                set.host_blocked(slot, st.exit_at);
                parked(set);
                since = set.woken_stamp(slot);
                resumed(set, slot, &mut st.m, Resume::Halt(t0));
            }
            Action::Sleep(ns) => {
                let due = set.now() + ns;
                set.host_blocked(slot, st.exit_at);
                std::thread::sleep(Duration::from_nanos(ns));
                // the kernel's timer woke this thread and it runs: the
                // whole "due -> wake" stage (no executor pick after it)
                set.woken(slot);
                since = due;
                resumed(set, slot, &mut st.m, Resume::Timer(due));
            }
            Action::Yield => {
                std::thread::yield_now();
            }
            Action::Wake(k) => {
                if let Some(s) = set.doorbell(slot.vm, k, set.now()) {
                    wake_slot(s);
                    set.woken(s);
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
    /// Starts a thread per vCPU and lets them go once every one is set up;
    /// the first setup failure stops them all and is returned.
    pub(crate) fn start(opts: &HostOptions, set: &Arc<VmSet>) -> Result<Self, TaskError> {
        let n = set.slots().len();
        let schedstat: SchedStats = Arc::new(Mutex::new(vec![None; n]));
        let (tx, rx) = mpsc::channel::<Result<(), String>>();
        let mut handles = Vec::with_capacity(n);
        for slot in set.slots() {
            let pins = opts.pins.get(slot.global).cloned().flatten();
            let strict = opts.strict_policy;
            let (set2, slot2, tx2, ss) = (set.clone(), slot.clone(), tx.clone(), schedstat.clone());
            let name = match opts.names {
                ThreadNames::PerVm => format!("v{}.{}", slot.vm, slot.index),
                ThreadNames::Vcpu => format!("vcpu{}", slot.index),
            };
            let mut b = std::thread::Builder::new().name(name);
            if let Some(size) = opts.stack_size {
                b = b.stack_size(size);
            }
            let h = b
                .spawn(move || {
                    let setup = setup_thread(&slot2, pins.as_deref(), strict);
                    thread_main(&set2, &slot2, setup, tx2, &ss);
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
        let mut handles = self.handles;
        super::drain(
            &self.set,
            timeout,
            &wake_slot,
            &|s| super::threads::task_name(&self.set, s),
            &mut || {
                let (done, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut handles)
                    .into_iter()
                    .partition(|h| h.is_finished());
                for h in done {
                    let _ = h.join();
                }
                handles = rest;
                handles.is_empty()
            },
        )?;
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
