//! `vmm-sim`: the simulator's command line. `vmm sim ARGS` runs it (it
//! lies beside `vmm`), so it speaks as `vmm sim`: the same help, messages
//! and exit statuses (0 done, 1 a runtime failure or an invariant
//! violation, 2 bad input).
//!
//! It runs the scheduler core on a big topology in deterministic virtual
//! time (`vcpu_sched_sim::exec::sim`), with memory costs from a cited
//! per-preset table. One run prints the workload's metric and the share of
//! simulated CPU time inside the scheduler; `--compare` prints the same
//! seeds' table and JSON as `vmm bench --compare`
//! (`vcpu_sched::comparison`), its A/A row being the baseline with another
//! seed; `--c2c` and `--lockstat` name the hot structures and locks;
//! `--sweep cpus=...` with `--plot` writes a scaling curve (SVG and CSV).
//! Ctrl-C stops a run cleanly and what is printed is marked partial.
//!
//! It links `vcpu_sched_sim`, the scheduler's sources built with the
//! reporting sync layer; `vmm` links the plain `vcpu_sched` and pays
//! nothing for the simulator.
//!
//! Modules: [`args`] the flags and what they resolve to; [`run`] one run
//! or a comparison; [`sweep`] the scaling sweep, drawn by [`plot`];
//! [`report`] the shared printing; [`stop`] Ctrl-C. Each imports only
//! modules listed before it in that order, or leaves ([`args`],
//! [`stop`], [`plot`]).

mod args;
mod plot;
mod report;
mod run;
mod stop;
mod sweep;

use std::process::ExitCode;

use clap::Parser;
use cli_common::exit::{one_line, status_with, Fault, InputError};

/// Simulate the scheduler core on a big topology in deterministic virtual
/// time, with cited cache-line transfer costs (`--compare seeds`, `--c2c`,
/// `--lockstat`, `--sweep`).
#[derive(Debug, Parser)]
#[command(name = "vmm-sim", bin_name = "vmm sim", long_about = None)]
struct Cli {
    #[command(flatten)]
    sim: args::SimArgs,
    /// More logging (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    // shown where `vmm sim --help` showed vmm's global flag: beside the
    // first option, in name order
    #[arg(short, long, action = clap::ArgAction::Count, display_order = 0)]
    verbose: u8,
}

/// Whose fault an error of the simulator's is (see `cli_common::exit`).
fn fault(e: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    if e.is::<InputError>() || e.is::<clap::Error>() {
        return Some(Fault::User);
    }
    if let Some(e) = e.downcast_ref::<vcpu_sched_sim::SchedError>() {
        return Some(Fault::user_if(e.is_user_error()));
    }
    if let Some(e) = e.downcast_ref::<topology::TopologyError>() {
        return Some(Fault::user_if(e.is_user_error()));
    }
    None
}

fn main() -> ExitCode {
    let cli: Cli = match cli_common::term::parse() {
        Ok(c) => c,
        Err(code) => return code,
    };
    cli_common::term::init_tracing(cli.verbose);
    match run::run(cli.sim) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = ExitCode::from(status_with(&e, fault));
            // One line: the chain of contexts, outermost first.
            eprintln!("error: {}", one_line(&e));
            code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults() {
        let status = |e: anyhow::Error| status_with(&e, fault);
        assert_eq!(status(InputError("x".into()).into()), 2);
        let w = vcpu_sched_sim::SchedError::Workload("x".into());
        assert_eq!(status(anyhow::Error::from(w).context("running")), 2);
        let host = topology::TopologyError::Host("x".into());
        assert_eq!(status(vcpu_sched_sim::SchedError::from(host).into()), 1);
        assert_eq!(status(anyhow::anyhow!("invariant violations: x")), 1);
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
