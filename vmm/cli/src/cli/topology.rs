//! `vmm topology ...`: show host and guest topologies, write CPUID dumps,
//! list the presets.
//!
//! WHAT: the `topology` subcommand's arguments and its runner.
//! WHY: one file per subcommand, so each can change without the others.
//! HOW: thin glue over the `topology` crate; no state.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use topology::{GuestTopology, Vendor};

use super::args::{out, outln, InputError};

/// Output formats of `topology show`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    /// An lstopo-like tree.
    Text,
    /// The dense model as JSON.
    Json,
    /// hwloc's synthetic description.
    Synthetic,
}

/// Vendor choice for guest CPUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VendorArg {
    /// The host's vendor.
    Host,
    /// AMD encoding.
    Amd,
    /// Intel encoding.
    Intel,
}

impl VendorArg {
    /// Resolves `host` against this machine's CPUID.
    pub fn resolve(self) -> Vendor {
        match self {
            VendorArg::Amd => Vendor::Amd,
            VendorArg::Intel => Vendor::Intel,
            VendorArg::Host => topology::cpuid::host_cpuid()
                .vendor()
                .unwrap_or(Vendor::Intel),
        }
    }
}

/// `vmm topology ...`
#[derive(Debug, Subcommand)]
pub enum TopologyCmd {
    /// Show a topology: `host`, a preset, a synthetic string, an hwloc XML
    /// file or a CPUID dump directory.
    Show {
        /// What to show (default: this host).
        #[arg(long, short, default_value = "host", value_name = "SPEC")]
        topology: String,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = ShowFormat::Text)]
        format: ShowFormat,
    },
    /// Show what a guest of this shape sees: APIC IDs, sharing, nodes.
    Guest {
        /// Guest shape (same SPEC language as `show`).
        #[arg(long, short, value_name = "SPEC")]
        guest: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write the guest's per-vCPU CPUID as an hwloc CPUID dump directory.
    CpuidDump {
        /// Guest shape.
        #[arg(long, short, value_name = "SPEC")]
        guest: String,
        /// Output directory (created with its parents; old puN files in it
        /// are removed). Checked before anything is written.
        #[arg(long, short, value_name = "DIR")]
        out: PathBuf,
        /// CPUID vendor encoding.
        #[arg(long, value_enum, default_value_t = VendorArg::Host)]
        vendor: VendorArg,
    },
    /// List the named presets.
    Presets,
}

/// Runs `vmm topology ...`.
pub fn run(cmd: TopologyCmd) -> Result<()> {
    match cmd {
        TopologyCmd::Show {
            topology: spec,
            format,
        } => {
            let t = topology::load(&spec)?;
            match format {
                ShowFormat::Text => out!("{}", topology::render::host_tree(&t)),
                ShowFormat::Json => outln!("{}", serde_json::to_string_pretty(&t)?),
                ShowFormat::Synthetic => outln!("{}", t.synthetic()?),
            }
        }
        TopologyCmd::Guest { guest, json } => {
            let g = GuestTopology::from_spec(&guest)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&g)?);
            } else {
                out!("{}", topology::render::guest_table(&g));
            }
        }
        TopologyCmd::CpuidDump { guest, out, vendor } => {
            super::args::check_output_dir("--out", &out)?;
            topology::dump::check_dump_dir(&out)
                .map_err(|m| InputError(format!("--out {}: {m}", out.display())))?;
            let g = GuestTopology::from_spec(&guest)?;
            let vendor = vendor.resolve();
            let base = topology::cpuid::host_cpuid();
            topology::dump::write_cpuid_dump(&g, &base, vendor, &out)
                .with_context(|| format!("writing the CPUID dump to {}", out.display()))?;
            outln!(
                "wrote {} CPUs ({vendor} encoding) to {}",
                g.num_vcpus(),
                out.display()
            );
        }
        TopologyCmd::Presets => {
            for p in topology::presets::PRESETS {
                outln!(
                    "{:<10} {}\n           {}",
                    p.name,
                    p.description,
                    p.synthetic
                );
            }
        }
    }
    Ok(())
}
