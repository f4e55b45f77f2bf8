//! Tests that need a tool from outside the workspace (`promtool`, hwloc's
//! `lstopo-no-graphics`, `/dev/kvm`): one rule for when it is missing.
//!
//! WHAT: [`require_tool`] and [`require_kvm`] say whether a test can run;
//! [`skip_or_fail`] is what happens when it cannot.
//!
//! WHY: a test that returns early when its tool is missing passes without
//! checking anything, and a CI machine that lost the tool would go on
//! reporting green. Under `CI=true` (what CI sets) a missing tool fails the
//! test; elsewhere the test says on stderr that it skipped, and why. A tool
//! that is installed but fails is never a skip: the caller asserts on its
//! exit status, so the failure is the test's.
//!
//! HOW: a tool is missing when it cannot be started because no such
//! program is on `PATH` (`ErrorKind::NotFound`); any other error starting
//! it fails the test at once. `/dev/kvm` is missing when the path does not
//! exist; one that exists but cannot be opened fails the test.

use std::io::ErrorKind;
use std::path::Path;
use std::process::{Command, Stdio};

/// Whether this run is CI's (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The test cannot run for `reason`: under `CI=true` this panics (the test
/// fails); elsewhere it prints `skipped: REASON` to stderr and returns, and
/// the caller returns.
pub fn skip_or_fail(reason: &str) {
    assert!(
        !in_ci(),
        "{reason} (under CI=true a missing tool fails the test instead of skipping it)"
    );
    eprintln!("skipped: {reason}");
}

/// Whether `program` is installed; `install` says how to get it. Missing:
/// [`skip_or_fail`] and false. Present but impossible to start (no
/// permission, not an executable): the test fails here.
pub fn require_tool(program: &str, install: &str) -> bool {
    match Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        // started: installed (whether `--version` succeeds is not judged;
        // the test asserts on the runs that matter)
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            skip_or_fail(&format!("{program} is not installed ({install})"));
            false
        }
        Err(e) => panic!("{program} is installed but could not be started: {e}"),
    }
}

/// Whether `/dev/kvm` can be used. Missing: [`skip_or_fail`] and false.
/// Present but not openable for reading and writing: the test fails here.
pub fn require_kvm() -> bool {
    let dev = Path::new("/dev/kvm");
    if !dev.exists() {
        skip_or_fail("no /dev/kvm (KVM is not available on this machine)");
        return false;
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(dev) {
        panic!("/dev/kvm exists but cannot be opened: {e} (add this user to the kvm group)");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_present_tool_is_required_and_a_missing_one_is_not_found() {
        // `sh` is on every machine these tests run on
        assert!(require_tool("sh", "-"));
        let missing = "no-such-tool-for-integration-tests";
        if in_ci() {
            let r = std::panic::catch_unwind(|| require_tool(missing, "nowhere"));
            let msg = r.unwrap_err();
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(
                msg.contains("is not installed (nowhere)") && msg.contains("CI=true"),
                "{msg}"
            );
        } else {
            assert!(!require_tool(missing, "nowhere"));
        }
    }
}
