//! `vmm serve`: the REST API server's arguments and runner.
//!
//! WHAT: flags for [`crate::serve::serve`].
//! WHY: one file per subcommand.
//! HOW: thin glue; the server itself lives in [`crate::serve`].

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::args;
use crate::serve::{serve, ServeOptions};
use crate::vcpu_task::ExecutorKind;

/// `vmm serve` arguments.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The Unix socket to listen on (removed again at shutdown).
    #[arg(long, value_name = "PATH")]
    pub api_socket: PathBuf,
    /// The topology the scheduler manages: `host`, a preset or an hwloc
    /// spec (a preset runs emulated on this host's CPUs).
    #[arg(long, short, default_value = "host", value_name = "SPEC")]
    pub topology: String,
    /// The scheduler's fixes (none, all, only:X, all-but:X).
    #[arg(long, short, default_value = "all", value_name = "SET", value_parser = args::mitigations)]
    pub mitigations: vcpu_sched::Mitigations,
    /// Which executor runs the vCPUs: workers (M:N), threads or host (1:1
    /// threads named vcpuN).
    #[arg(long, default_value = "workers", value_name = "KIND")]
    pub executor: ExecutorKind,
    /// Export KVM exits per vCPU on /metrics (one series per vCPU).
    #[arg(long)]
    pub metrics_per_vcpu: bool,
}

/// Runs `vmm serve` until `vmm.shutdown` or SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    let opts = ServeOptions {
        socket: a.api_socket.clone(),
        topology: a.topology.clone(),
        mitigations: a.mitigations,
        executor: a.executor,
        per_vcpu_metrics: a.metrics_per_vcpu,
    };
    serve(opts).with_context(|| format!("vmm serve --api-socket {}", a.api_socket.display()))
}
