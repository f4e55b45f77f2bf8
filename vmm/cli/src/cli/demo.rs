//! `vmm demo`: the main job on an embedded default.
//!
//! WHAT: shows a preset host (genoa-2s) and what a guest placed on a slice
//! of it would see.
//! WHY: a first look that needs no flags, no kernel and no KVM.
//! HOW: loads the preset, picks the CPUs `--pin auto` would pick for a
//! 2-socket x 2-LLC x 2-core x 2-thread guest, and prints the guest table.

use anyhow::Result;
use topology::GuestTopology;

use super::args::{out, outln};

/// The embedded default: a Genoa-like host and a 2-socket guest on it.
pub fn run() -> Result<()> {
    let host = topology::load("genoa-2s")?;
    outln!("== Host model: preset genoa-2s ==");
    outln!("{}", host.shape());
    outln!("hwloc synthetic: {}", host.synthetic()?);
    outln!();
    // A guest mirroring 2 CCDs on each socket's first 2 cores: what `--pin
    // auto` would pick for 2 sockets x 2 LLCs x 2 cores x 2 threads.
    let mut slice = Vec::new();
    for pkg in 0..2u32 {
        for llc in 0..2u32 {
            let first_llc = host.llcs_of_node(pkg)[llc as usize];
            slice.extend_from_slice(&host.cpus_of_llc(first_llc)[..4]);
        }
    }
    let g = GuestTopology::from_host_cpus(&host, &slice)?;
    outln!(
        "== A guest on host CPUs {} ==",
        topology::cpulist::format(&slice)
    );
    out!("{}", topology::render::guest_table(&g));
    Ok(())
}
