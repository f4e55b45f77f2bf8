//! `/dev/kvm` for unit tests, with one rule for when it is missing.
//!
//! WHAT: [`kvm`] opens KVM for a test, or says why the test does not run.
//! WHY: a test that returns early without KVM passes without checking
//! anything, and a CI machine that lost KVM would go on reporting green.
//! HOW: the integration tests' rule (`tests/src/tools.rs`): under `CI=true`
//! a missing `/dev/kvm` fails the test; elsewhere the test prints
//! `skipped: ...` to stderr and returns. A `/dev/kvm` that exists but
//! cannot be opened fails the test everywhere.

use kvm_ioctls::Kvm;

/// KVM, or `None` (after saying so) where the machine has no `/dev/kvm`.
pub(crate) fn kvm() -> Option<Kvm> {
    match Kvm::new() {
        Ok(k) => Some(k),
        Err(e) if e.errno() == libc::ENOENT => {
            let reason = "no /dev/kvm (KVM is not available on this machine)";
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{reason} (under CI=true a missing tool fails the test instead of skipping it)"
            );
            eprintln!("skipped: {reason}");
            None
        }
        Err(e) => panic!("/dev/kvm exists but cannot be opened: {e}"),
    }
}
