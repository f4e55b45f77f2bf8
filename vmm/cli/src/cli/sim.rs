//! `vmm sim`: runs the simulator's own binary, `vmm-sim`, found beside
//! this one, with the same arguments, the way git and cargo run their
//! subcommands.
//!
//! WHAT: the `sim` subcommand as `vmm --help` lists it; everything after
//! `sim` (`--help` included) goes to `vmm-sim`, whose help, messages and
//! exit status are what the user sees.
//! WHY: the simulator needs the scheduler built with its reporting sync
//! layer (`vcpu_sched_sim`); this binary links the plain `vcpu_sched`, so
//! the hot paths of `run`, `serve` and `bench` pay nothing for it.
//! HOW: `exec` of `vmm-sim` in the directory of [`std::env::current_exe`]
//! (`cargo build --workspace` puts both in one target directory); `-v`
//! given before `sim` is passed on. Without `vmm-sim` there, exit 2 with
//! the command that builds it.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};
use clap::Args;

use super::args::InputError;

/// The simulator's binary.
pub const SIM_BIN: &str = "vmm-sim";

/// `vmm sim ARGS`: ARGS as `vmm-sim` takes them (`vmm sim --help`).
#[derive(Debug, Args)]
pub struct SimArgs {
    /// The simulator's arguments: WORKLOAD --topology PRESET ...; see
    /// `vmm sim --help`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// Where `vmm-sim` must be: beside this executable.
fn sim_path() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the vmm executable's own path")?;
    Ok(exe.with_file_name(SIM_BIN))
}

/// Replaces this process with `vmm-sim ARGS` (`-v` as many times as
/// `verbose`); returns only if that fails.
pub fn run(a: SimArgs, verbose: u8) -> Result<ExitCode> {
    let sim = sim_path()?;
    if !sim.is_file() {
        let release = sim.parent().is_some_and(|d| d.ends_with("release"));
        return Err(InputError(format!(
            "vmm sim runs the simulator's binary {}, which is not there: build it with \
             `cargo build{} -p vmm-sim` (or `cargo build{} --workspace`)",
            sim.display(),
            if release { " --release" } else { "" },
            if release { " --release" } else { "" },
        ))
        .into());
    }
    let mut cmd = Command::new(&sim);
    cmd.args(std::iter::repeat_n("-v", verbose.into()));
    cmd.args(&a.args);
    let e = cmd.exec();
    Err(anyhow::Error::new(e).context(format!("running {}", sim.display())))
}
