//! What a run prints besides its metric: the scheduler's share of the
//! simulated CPU time per set, the per-structure (`--c2c`) and per-lock
//! (`--lockstat`) views, and the JSON file.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use cli_common::outln;
use vcpu_sched_sim::comparison::Cell;
use vcpu_sched_sim::exec::sim::SimReport;

use crate::args::SimArgs;

/// Writes `s` to the new file `path` (`--json`, checked before the run)
/// and says so on stderr.
pub fn write(path: &Path, s: &str) -> Result<()> {
    cli_common::args::write_new("--json", path, s.as_bytes())?;
    eprintln!("written to {}", path.display());
    Ok(())
}

/// The scheduler's share of simulated CPU time and its ns per core call,
/// one line per set, from each set's first repetition.
pub fn share_table(cells: &[Cell], firsts: &[Option<SimReport>]) -> String {
    let mut s = String::from("scheduler share of simulated CPU time (first repetition):\n");
    for (c, r) in cells.iter().zip(firsts) {
        if let Some(r) = r {
            let _ = writeln!(
                s,
                "  {:<28} {:>6.2}%  {:>7.0} ns/call{}",
                c.label,
                100.0 * r.sched_share,
                r.sched_ns_per_call,
                if r.violations.is_empty() {
                    String::new()
                } else {
                    format!("  {} INVARIANT VIOLATIONS", r.violations.len())
                }
            );
        }
    }
    s
}

/// The `--c2c` and `--lockstat` tables of one run, if asked for.
pub fn print_views(a: &SimArgs, label: &str, r: &SimReport) {
    if a.c2c {
        outln!("c2c [{label}]: cache-line transfers per structure, hottest first");
        // interleaved, writes also wait in a line's queue for their turn:
        // one more column (run to completion it would be all zeros)
        let queued = r.interleave.is_some();
        let head = format!(
            "  {:<40} {:>12} {:>14} {:>9}",
            "structure.field", "transfers", "cost ms", "ns/xfer"
        );
        if queued {
            outln!("{head} {:>14}", "queued ms");
        } else {
            outln!("{head}");
        }
        for row in r.c2c.iter().take(12) {
            let line = format!(
                "  {:<40} {:>12} {:>14.3} {:>9.1}",
                row.name,
                row.transfers,
                row.cost_ns as f64 / 1e6,
                row.cost_ns as f64 / row.transfers.max(1) as f64
            );
            if queued {
                outln!("{line} {:>14.3}", row.queued_ns as f64 / 1e6);
            } else {
                outln!("{line}");
            }
        }
    }
    if a.lockstat {
        outln!("lockstat [{label}]: per lock class, most waited first");
        outln!(
            "  {:<40} {:>12} {:>12} {:>14}",
            "class",
            "acquisitions",
            "contended",
            "wait ms"
        );
        for row in &r.lockstat {
            outln!(
                "  {:<40} {:>12} {:>12} {:>14.3}",
                row.name,
                row.acquisitions,
                row.contended,
                row.wait_ns as f64 / 1e6
            );
        }
    }
}
