//! Helpers shared by the integration tests in `tests/tests/`.
//!
//! The tests drive the real `vmm` binary as a user would, and judge what it
//! produces with third-party tools (hwloc's CPUID parser, the guest kernel).

use std::path::PathBuf;
use std::process::{Command, Output};

/// Path of the `vmm` binary built for this workspace.
pub fn vmm_bin() -> PathBuf {
    if let Ok(p) = std::env::var("VMM_BIN") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("vmm");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "vmm binary not found under {}; run `cargo build -p vmm` first (the test command does)",
        target.display()
    );
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `shared/topologies` directory with the real machines' CPUID dumps.
pub fn shared_topologies() -> Option<PathBuf> {
    let root = workspace_root();
    [
        root.join("shared/topologies"),
        root.join("../shared/topologies"),
        root.join("tests/data/topologies"),
    ]
    .into_iter()
    .find(|p| p.join("cpuid").is_dir())
}

/// Runs `vmm ARGS` and returns its output.
pub fn vmm(args: &[&str]) -> Output {
    Command::new(vmm_bin())
        .args(args)
        .output()
        .expect("running vmm")
}
