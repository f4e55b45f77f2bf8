//! The threads executor's own state beside the shared core: each task's
//! thread and pending grant, each CPU's "who is inside" marker, and the
//! grant that hands a CPU's run slot to a task thread or to the CPU's idle
//! context.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;

use crate::exec::shared::{ExecCore, IDLE, NONE};
use crate::stats::TaskStats;
use crate::task::{CpuId, TaskId};
use crate::tasks::lock;

/// A task thread's hand-over state.
#[repr(align(128))]
pub(super) struct ThreadRt {
    pub(super) thread: Mutex<Option<Thread>>,
    /// The CPU granted to it and not yet taken ([`NONE`]: none).
    pub(super) grant: AtomicU32,
    /// The CPU whose slot it is inside ([`NONE`]: none).
    pub(super) running_on: AtomicU32,
    /// The host CPU its thread is pinned to ([`NONE`]: not yet).
    pub(super) host_cpu: AtomicU32,
}

impl ThreadRt {
    fn new() -> Self {
        Self {
            thread: Mutex::new(None),
            grant: AtomicU32::new(NONE),
            running_on: AtomicU32::new(NONE),
            host_cpu: AtomicU32::new(NONE),
        }
    }
}

/// The part of the executor every thread shares.
pub(super) struct Shared {
    pub(super) core: Arc<ExecCore>,
    /// By task id.
    pub(super) trt: Box<[ThreadRt]>,
    /// Per CPU: who is inside its slot right now (double-run detection).
    pub(super) active: Box<[AtomicU32]>,
    /// Task bodies that have not returned.
    pub(super) live: AtomicUsize,
    /// Final statistics of ended tasks.
    pub(super) finished: Mutex<Vec<(TaskId, TaskStats)>>,
    /// Failures of ended tasks, `name: why`.
    pub(super) failures: Mutex<Vec<String>>,
}

impl Shared {
    pub(super) fn new(core: Arc<ExecCore>) -> Self {
        let (ncpus, ntasks) = (core.slots.len(), core.tasks.len());
        Self {
            core,
            trt: (0..ntasks).map(|_| ThreadRt::new()).collect(),
            active: (0..ncpus).map(|_| AtomicU32::new(NONE)).collect(),
            live: AtomicUsize::new(0),
            finished: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
        }
    }

    /// Gives `cpu`'s slot to task `n`.
    pub(super) fn grant(&self, n: u32, cpu: CpuId) {
        let core = &self.core;
        core.slots[cpu as usize].owner.store(n, Ordering::SeqCst);
        core.counters[cpu as usize]
            .grants
            .fetch_add(1, Ordering::Relaxed);
        let t = &self.trt[n as usize];
        let old = t.grant.swap(cpu, Ordering::AcqRel);
        if old != NONE {
            core.violation(format!(
                "task {n} granted CPU {cpu} while its grant of CPU {old} is still pending"
            ));
        }
        if let Some(th) = lock(&t.thread).as_ref() {
            th.unpark();
        }
    }

    /// Gives `cpu`'s slot to its idle context.
    pub(super) fn grant_idle(&self, cpu: CpuId) {
        let s = &self.core.slots[cpu as usize];
        s.owner.store(IDLE, Ordering::SeqCst);
        s.kick_own();
    }
}
