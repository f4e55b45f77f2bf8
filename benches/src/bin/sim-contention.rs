//! The simulator's coherence model against the published contention row
//! it must reproduce: aggregate `fetch_add` throughput on one shared line
//! by thread count on 2x Xeon Gold 6130 (Skylake-SP, 2 x 16 cores, one
//! thread pinned per core; S. Gambhir, "What does a lock actually cost?",
//! <https://shubhankar-gambhir.github.io/posts/what-does-a-lock-actually-cost-concurrent-counter-benchmarks/>,
//! median of 5 runs): 1T 115.8 M ops/s, 2T 16.1 M, 4T 20.8 M, 8T 24.4 M,
//! 16T 27.0 M, 32T 29.1 M.
//!
//! The model runs the same loop (`exec::sim::contention`) on the `clx-2s`
//! preset (Cascade Lake, the same core and mesh as Skylake-SP: SMT 7 ns,
//! same socket 48 ns, other socket 136 ns, published one-way latencies),
//! with each line-arbitration rule and two thread placements, since the
//! source does not say which cores its N threads used: the first socket
//! first ("packed") or the two sockets in turn ("alternating"). The only
//! constant fitted is the loop's own work per op, from the 1T row.
//!
//! `cargo run -p benches --release --bin sim-contention` prints the table
//! in markdown (docs/simulator.md "Contended lines").

use vcpu_sched_sim::exec::sim::contention::fetch_add_rate;
use vcpu_sched_sim::exec::sim::{Arbitration, CostTable};

/// The measured row: (threads, M ops/s).
const MEASURED: [(usize, f64); 6] = [
    (1, 115.8),
    (2, 16.1),
    (4, 20.8),
    (8, 24.4),
    (16, 27.0),
    (32, 29.1),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topo = topology::load("clx-2s")?;
    let cost = CostTable::for_preset("clx-2s").ok_or("no clx-2s cost table")?;
    // one core per thread (no SMT siblings), by package
    let mut by_pkg: Vec<Vec<u32>> = Vec::new();
    let mut seen_cores = std::collections::BTreeSet::new();
    for (i, c) in topo.cpus().iter().enumerate() {
        if !seen_cores.insert((c.package, c.core)) {
            continue;
        }
        let p = c.package as usize;
        if by_pkg.len() <= p {
            by_pkg.resize(p + 1, Vec::new());
        }
        by_pkg[p].push(i as u32);
    }
    let packed: Vec<u32> = by_pkg.iter().flatten().copied().collect();
    let alternating: Vec<u32> = (0..by_pkg[0].len())
        .flat_map(|k| by_pkg.iter().filter_map(move |p| p.get(k).copied()))
        .collect();
    // the loop's own work, fitted to the 1T row: 1e9 / 115.8 M = 8.6 ns per
    // op, of which the model charges an L1 hit
    let op_ns = (1e9 / (MEASURED[0].1 * 1e6)).round() as u64 - cost.l1_hit_ns;
    println!("loop work per op: {op_ns} ns (fitted to the 1T row); clx-2s: L1 {} ns, SMT {} ns, same socket {} ns, other socket {} ns\n",
        cost.l1_hit_ns, cost.smt_ns, cost.llc_ns, cost.remote_ns);
    println!("| threads | measured (M ops/s) | packed, FIFO | packed, nearest | alternating, FIFO | alternating, nearest |");
    println!("|---|---|---|---|---|---|");
    for (n, want) in MEASURED {
        let mut cells = Vec::new();
        for place in [&packed, &alternating] {
            for a in [Arbitration::Fifo, Arbitration::Nearest] {
                let r = fetch_add_rate(&topo, cost, &place[..n], op_ns, 2_000_000, a) / 1e6;
                cells.push(format!("{r:.1} ({:+.0}%)", 100.0 * (r - want) / want));
            }
        }
        println!("| {n} | {want} | {} |", cells.join(" | "));
    }
    Ok(())
}
