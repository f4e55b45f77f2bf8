//! The race-free kick: [`Kicker`], the kick signal and the record of
//! which thread is inside [`Vcpu::run`] (the protocol is in the module
//! docs of [`crate::vcpu`]).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use vcpu_sched::os_thread::OsThread;

use super::VcpuError;
#[cfg(doc)]
use super::{Vcpu, VcpuExit};

/// The signal used to kick vCPUs: `SIGRTMIN`, handled by an empty handler
/// installed without `SA_RESTART`.
pub fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

/// Installs the kick signal's handler (once per process). Every call
/// returns the outcome of the first.
pub fn install_kick_signal() -> Result<(), VcpuError> {
    // 0: installed; otherwise the OS error of the one attempt.
    static RESULT: OnceLock<i32> = OnceLock::new();
    let err = *RESULT.get_or_init(|| {
        // Without SA_RESTART, so that KVM_RUN returns EINTR.
        match vcpu_sched::os_thread::install_interrupting_handler(kick_signal()) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(-1),
        }
    });
    if err == 0 {
        Ok(())
    } else {
        Err(VcpuError::Signal(std::io::Error::from_raw_os_error(err)))
    }
}

/// Where a vCPU is, as far as kicking is concerned.
pub(super) struct KickTarget {
    /// The thread inside [`Vcpu::run`], if any.
    thread: Option<OsThread>,
}

/// State shared between a [`Vcpu`] and its [`Kicker`]s.
pub(super) struct KickShared {
    /// `&kvm_run.immediate_exit`, or null once the vCPU is gone.
    immediate_exit: AtomicPtr<u8>,
    /// A kick not yet reported.
    pending: AtomicBool,
    target: Mutex<KickTarget>,
}

impl KickShared {
    /// The kick state of a vCPU whose `kvm_run.immediate_exit` is at `imm`.
    pub(super) fn new(imm: *mut u8) -> Arc<Self> {
        Arc::new(KickShared {
            immediate_exit: AtomicPtr::new(imm),
            pending: AtomicBool::new(false),
            target: Mutex::new(KickTarget { thread: None }),
        })
    }

    /// Sets `kvm_run.immediate_exit`, unless the vCPU is gone.
    pub(super) fn set_immediate_exit(&self, v: u8) {
        let p = self.immediate_exit.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: `p` points into the vCPU's kvm_run mapping, which
            // lives as long as the VcpuFd; the Vcpu nulls the pointer under
            // the target lock before dropping the fd, and every caller of
            // this function holds that lock or is the Vcpu itself. The byte
            // is only ever accessed atomically by this process.
            unsafe { AtomicU8::from_ptr(p) }.store(v, Ordering::SeqCst);
        }
    }

    /// Takes a pending kick: clears `immediate_exit` first, then takes
    /// `pending` (see the module docs for the order).
    pub(super) fn take(&self) -> bool {
        self.set_immediate_exit(0);
        self.pending.swap(false, Ordering::SeqCst)
    }

    /// Is a kick waiting to be reported?
    pub(super) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Stops kickers from touching the kvm_run mapping, which goes away
    /// with the vCPU's fd.
    pub(super) fn detach(&self) {
        let _t = self.target.lock().unwrap_or_else(|e| e.into_inner());
        self.immediate_exit
            .store(std::ptr::null_mut(), Ordering::Release);
    }

    /// A kicker of this vCPU.
    pub(super) fn kicker(self: &Arc<Self>) -> Kicker {
        Kicker {
            shared: self.clone(),
        }
    }
}

/// A handle that interrupts a vCPU from any thread. Cheap to clone.
#[derive(Clone)]
pub struct Kicker {
    shared: Arc<KickShared>,
}

impl std::fmt::Debug for Kicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kicker")
            .field("pending", &self.shared.pending.load(Ordering::Relaxed))
            .finish()
    }
}

impl Kicker {
    /// Makes the vCPU's current or next [`Vcpu::run`] return
    /// [`VcpuExit::Kicked`] (see the module docs for why this is race
    /// free).
    pub fn kick(&self) {
        let s = &self.shared;
        s.pending.store(true, Ordering::SeqCst);
        let target = s.target.lock().unwrap_or_else(|e| e.into_inner());
        s.set_immediate_exit(1);
        if let Some(t) = target.thread {
            // SAFETY: `t` is the thread currently inside Vcpu::run; it
            // clears `thread` under this same lock before leaving run, so
            // it is alive while we hold the lock.
            let _ = unsafe { t.signal(kick_signal()) };
        }
    }
}

impl Kicker {
    /// Interrupts the thread inside `KVM_RUN` for this vCPU without a
    /// kick to report: `immediate_exit` and the signal, not `pending`.
    /// What a [`ParkFd`](super::park::ParkFd)'s waiter gets when the vCPU
    /// is wanted back; the caller sets its own flag first (the waiter
    /// reads it after clearing `immediate_exit`), so that a nudge before
    /// the waiter enters is not lost.
    pub fn nudge(&self) {
        let s = &self.shared;
        let target = s.target.lock().unwrap_or_else(|e| e.into_inner());
        s.set_immediate_exit(1);
        if let Some(t) = target.thread {
            // SAFETY: as in `kick`: the thread clears `thread` under this
            // lock before it leaves, so it is alive while we hold it.
            let _ = unsafe { t.signal(kick_signal()) };
        }
    }
}

/// Marks the calling thread as the one running the vCPU, until dropped.
pub(super) struct RunGuard<'a>(&'a KickShared);

impl<'a> RunGuard<'a> {
    /// Records the calling thread as the one inside [`Vcpu::run`].
    pub(super) fn enter(s: &'a KickShared) -> Self {
        let me = OsThread::current();
        s.target.lock().unwrap_or_else(|e| e.into_inner()).thread = Some(me);
        RunGuard(s)
    }
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        self.0
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .thread = None;
    }
}
