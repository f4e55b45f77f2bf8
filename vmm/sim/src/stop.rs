//! Ctrl-C: [`STOP`] is set, the simulator sees it within 10 ms of virtual
//! time and returns what it has, marked partial.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by Ctrl-C.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes Ctrl-C set [`STOP`] instead of ending the process.
pub fn catch_ctrl_c() {
    let handler: extern "C" fn(libc::c_int) = on_sigint;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; installing it changes no memory of ours.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
}
