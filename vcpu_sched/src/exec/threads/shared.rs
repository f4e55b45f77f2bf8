//! What the executor's threads and its kicker share: per-CPU run slots,
//! per-task run state, the grant hand-over, the kicker the core calls, and
//! the clock thread's view of it all.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Instant;

use super::{pin_current_thread, set_host_rt, CpuMapping, KickHook, IDLE, NONE};
use crate::check::Liveness;
use crate::exec::clock::{runnable_thread, ClockHost, TimerQueue};
use crate::sched::{KickCpu, Scheduler};
use crate::stats::TaskStats;
use crate::task::{CpuId, TaskId};
use crate::tasks::lock;

/// One CPU's slot.
#[repr(align(128))]
pub(super) struct Slot {
    /// The task holding the slot, or [`IDLE`].
    pub(super) owner: AtomicU32,
    /// Who is inside the slot right now (double-run detection).
    pub(super) active: AtomicU32,
    pub(super) idle_token: AtomicBool,
    /// Set while the idle context sleeps for want of a kick (with
    /// `idle_token`, it tells the checker a sleeping idle context from a
    /// starved one).
    pub(super) idle_parked: AtomicBool,
    /// The idle context's kernel thread id (0 until it starts).
    pub(super) idle_tid: AtomicU32,
    pub(super) idle_thread: OnceLock<Thread>,
    pub(super) host_cpu: u32,
}

/// One CPU's executor counters, written by whoever holds its slot.
#[repr(align(128))]
#[derive(Default)]
pub(super) struct CpuExec {
    pub(super) sched_ns: AtomicU64,
    pub(super) sched_calls: AtomicU64,
    pub(super) grants: AtomicU64,
    pub(super) idle_wakeups: AtomicU64,
}

/// Per-task executor state.
#[repr(align(128))]
pub(super) struct TaskRt {
    pub(super) thread: Mutex<Option<Thread>>,
    pub(super) grant: AtomicU32,
    pub(super) preempt: AtomicBool,
    pub(super) running_on: AtomicU32,
    pub(super) host_cpu: AtomicU32,
    pub(super) timer_gen: AtomicU64,
    /// Its thread's kernel thread id (0 until it starts).
    pub(super) tid: AtomicU32,
}

impl TaskRt {
    pub(super) fn new() -> Self {
        Self {
            thread: Mutex::new(None),
            grant: AtomicU32::new(NONE),
            preempt: AtomicBool::new(false),
            running_on: AtomicU32::new(NONE),
            host_cpu: AtomicU32::new(NONE),
            timer_gen: AtomicU64::new(0),
            tid: AtomicU32::new(0),
        }
    }
}

/// The part of the executor the kicker and every thread share.
pub(super) struct Shared {
    pub(super) mapping: CpuMapping,
    pub(super) slots: Box<[Slot]>,
    pub(super) cpu_exec: Box<[CpuExec]>,
    pub(super) trt: Box<[TaskRt]>,
    pub(super) hook: Arc<dyn KickHook>,
    pub(super) epoch: Instant,
    pub(super) stopping: AtomicBool,
    pub(super) idle_stop: AtomicBool,
    pub(super) timers: TimerQueue,
    pub(super) violations: Mutex<Vec<String>>,
    pub(super) pin: bool,
    pub(super) host_rt: Option<u8>,
    pub(super) pin_errors: AtomicU64,
    pub(super) check: bool,
    pub(super) live: AtomicUsize,
    pub(super) finished: Mutex<Vec<(TaskId, TaskStats)>>,
}

impl Shared {
    #[inline]
    pub(super) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    pub(super) fn violation(&self, v: String) {
        tracing::error!("scheduler invariant violated: {v}");
        lock(&self.violations).push(v);
    }

    /// Host SCHED_FIFO for the calling thread at `host_rt + above`, if
    /// configured.
    pub(super) fn host_rt(&self, above: u8) {
        if let Some(p) = self.host_rt {
            set_host_rt(p, above);
        }
    }

    pub(super) fn pin_to(&self, host_cpu: u32) {
        if self.pin && pin_current_thread(host_cpu).is_err() {
            self.pin_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives `cpu`'s slot to task `n`.
    pub(super) fn grant(&self, n: u32, cpu: CpuId) {
        self.slots[cpu as usize].owner.store(n, Ordering::SeqCst);
        self.cpu_exec[cpu as usize]
            .grants
            .fetch_add(1, Ordering::Relaxed);
        let t = &self.trt[n as usize];
        let old = t.grant.swap(cpu, Ordering::AcqRel);
        if old != NONE {
            self.violation(format!(
                "task {n} granted CPU {cpu} while its grant of CPU {old} is still pending"
            ));
        }
        if let Some(th) = lock(&t.thread).as_ref() {
            th.unpark();
        }
    }

    /// Gives `cpu`'s slot to its idle context.
    pub(super) fn grant_idle(&self, cpu: CpuId) {
        let s = &self.slots[cpu as usize];
        s.owner.store(IDLE, Ordering::SeqCst);
        s.idle_token.store(true, Ordering::Release);
        if let Some(th) = s.idle_thread.get() {
            th.unpark();
        }
    }
}

pub(super) struct ExecKicker(pub(super) Arc<Shared>);

impl KickCpu for ExecKicker {
    fn kick(&self, cpu: CpuId) {
        let sh = &self.0;
        fence(Ordering::SeqCst);
        let s = &sh.slots[cpu as usize];
        match s.owner.load(Ordering::SeqCst) {
            IDLE => {
                s.idle_token.store(true, Ordering::Release);
                if let Some(th) = s.idle_thread.get() {
                    th.unpark();
                }
            }
            NONE => {}
            t => {
                sh.trt[t as usize].preempt.store(true, Ordering::Release);
                sh.hook.kick(TaskId(t), cpu);
            }
        }
    }
}

impl ClockHost for Shared {
    fn now(&self) -> u64 {
        Shared::now(self)
    }

    fn quit(&self) -> bool {
        self.idle_stop.load(Ordering::Acquire)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    fn fire(&self, sched: &Scheduler, key: usize, gen: u64, now: u64) {
        if self.trt[key].timer_gen.load(Ordering::Relaxed) == gen {
            let _ = sched.wake(TaskId(key as u32), None, now);
        }
    }

    /// The thread that acts for a CPU is its slot holder: the idle context
    /// (parked only without a kick's token) or the granted task's thread
    /// (runnable: granted means woken). Its host CPU time tells a thread
    /// that had the chance to act from one the host has not run.
    fn liveness(&self, cpu: CpuId) -> Liveness {
        let Some(slot) = self.slots.get(cpu as usize) else {
            return Liveness::Unknown;
        };
        let owner = slot.owner.load(Ordering::SeqCst);
        let tid = if owner == IDLE {
            if slot.idle_parked.load(Ordering::SeqCst) && !slot.idle_token.load(Ordering::SeqCst) {
                return Liveness::Parked;
            }
            slot.idle_tid.load(Ordering::Acquire)
        } else {
            match self.trt.get(owner as usize) {
                Some(t) => t.tid.load(Ordering::Acquire),
                None => return Liveness::Unknown,
            }
        };
        runnable_thread(tid)
    }
}
