//! This machine's own cache-line costs, in the table format of the
//! published measurements the simulator's cost tables cite:
//!
//! * **core-to-core latency**: for every pair of host CPUs this process
//!   may use, two threads pinned to them bounce one 64-byte-aligned line
//!   with compare-and-swap: each spins on a load until the counter is
//!   odd (its turn) or even (the other's), then CASes it on. A round trip
//!   is two owner changes; one-way = round trip / 2, the definition of
//!   nviennot/core-to-core-latency and Chips and Cheese (CAS only, no
//!   parity spin of a different kind). The median of `--samples` runs of
//!   `--round-trips` each; the line is first touched by the pair's first
//!   CPU. Pairs are classed by hwloc's topology: (a) SMT siblings, (b)
//!   a shared L2 that is not SMT, (c) a shared LLC, (d) the same NUMA
//!   node, other LLC, (e) another node.
//! * **many threads on one line**: `fetch_add` on one shared counter by
//!   1, 2, 4, ... threads up to the usable CPUs, one pinned per CPU, for
//!   `--millis` each: aggregate operations per second and the time per
//!   operation (1e9 / ops per second; the time per owner change only if
//!   every operation moves the line, which the one-way latency bounds).
//!
//! `cargo run -p benches --release --bin c2c -- [--out DIR]` prints both
//! tables in markdown; with `--out` it also writes `DIR/pairs.csv` (every
//! pair's samples, ns one-way), `DIR/contention.csv` and `DIR/tables.md`,
//! and refuses to replace any of them that already exists.
//! Under software virtualization (kvm_pvm) the vCPUs are host threads, so
//! these are the costs the simulator would need for *this* machine, not
//! for the hardware under it.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use vcpu_sched::exec::{allowed_host_cpus, pin_current_thread};

/// One cache line, alone.
#[repr(align(128))]
struct Line(AtomicU64);

struct Opts {
    round_trips: u64,
    samples: usize,
    millis: u64,
    out: Option<PathBuf>,
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "c2c: {msg}\nusage: c2c [--round-trips N (default 100000)] [--samples N (default 7)] \
         [--millis MS (default 500)] [--out DIR]"
    );
    std::process::exit(2);
}

fn parse() -> Opts {
    let mut o = Opts {
        round_trips: 100_000,
        samples: 7,
        millis: 500,
        out: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        let num = |name: &str, v: String| -> u64 {
            v.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| usage(&format!("{name} {v}: give a positive whole number")))
        };
        match a.as_str() {
            "--round-trips" => o.round_trips = num("--round-trips", val("--round-trips")),
            "--samples" => o.samples = num("--samples", val("--samples")) as usize,
            "--millis" => o.millis = num("--millis", val("--millis")),
            "--out" => o.out = Some(PathBuf::from(val("--out"))),
            "-h" | "--help" => usage("the options"),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    o
}

/// One-way ns of `n` CAS round trips between host CPUs `a` and `b`.
fn ping_pong(a: u32, b: u32, n: u64) -> f64 {
    let line = Line(AtomicU64::new(0));
    let start = Barrier::new(2);
    let mut took = Duration::ZERO;
    std::thread::scope(|s| {
        let (line, start) = (&line, &start);
        let first = s.spawn(move || {
            let _ = pin_current_thread(a);
            line.0.store(0, Ordering::Relaxed); // first touch on `a`
            start.wait();
            let t0 = Instant::now();
            for i in 0..n {
                let mine = 2 * i;
                while line
                    .0
                    .compare_exchange(mine, mine + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    std::hint::spin_loop();
                }
            }
            // the last hand back
            while line.0.load(Ordering::Acquire) != 2 * n {
                std::hint::spin_loop();
            }
            t0.elapsed()
        });
        s.spawn(move || {
            let _ = pin_current_thread(b);
            start.wait();
            for i in 0..n {
                let theirs = 2 * i + 1;
                while line
                    .0
                    .compare_exchange(theirs, theirs + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    std::hint::spin_loop();
                }
            }
        });
        took = first.join().expect("ping thread");
    });
    took.as_nanos() as f64 / (2 * n) as f64
}

/// Aggregate `fetch_add` operations per second of `cpus.len()` threads.
fn contended(cpus: &[u32], millis: u64) -> f64 {
    let line = Line(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let start = Barrier::new(cpus.len() + 1);
    let mut t = Duration::ZERO;
    std::thread::scope(|s| {
        for &c in cpus {
            let (line, stop, start) = (&line, &stop, &start);
            s.spawn(move || {
                let _ = pin_current_thread(c);
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        line.0.fetch_add(1, Ordering::AcqRel);
                    }
                }
            });
        }
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(millis));
        stop.store(true, Ordering::Relaxed);
        t = t0.elapsed();
    });
    line.0.load(Ordering::Relaxed) as f64 / t.as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let o = parse();
    let topo = topology::load("host").unwrap_or_else(|e| usage(&format!("reading the host: {e}")));
    let mut cpus = allowed_host_cpus().unwrap_or_else(|e| usage(&format!("{e}")));
    cpus.sort_unstable();
    if cpus.len() < 2 {
        usage("needs at least 2 usable host CPUs");
    }
    let level = |a: u32, b: u32| -> &'static str {
        let (Some(x), Some(y)) = (topo.cpu_by_os_index(a), topo.cpu_by_os_index(b)) else {
            return "unknown";
        };
        if topo.share_smt(x, y) {
            "(a) SMT sibling"
        } else if topo.share_l2(x, y) {
            "(b) shared L2"
        } else if topo.share_llc(x, y) {
            "(c) same LLC"
        } else if topo.cpu(x).node == topo.cpu(y).node {
            "(d) same node, other LLC"
        } else {
            "(e) other node"
        }
    };
    let machine = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "this machine".into());
    let machine = format!("{machine}, {} usable CPUs", cpus.len());

    // every pair, both directions folded into one (a -> b, a < b)
    let mut pairs_csv = String::from("cpu_a,cpu_b,level,sample,ns_one_way\n");
    let mut by_level: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for (i, &a) in cpus.iter().enumerate() {
        for &b in &cpus[i + 1..] {
            let mut s: Vec<f64> = (0..o.samples)
                .map(|k| {
                    let ns = ping_pong(a, b, o.round_trips);
                    pairs_csv.push_str(&format!("{a},{b},{},{k},{ns:.2}\n", level(a, b)));
                    ns
                })
                .collect();
            by_level
                .entry(level(a, b))
                .or_default()
                .push(median(&mut s));
        }
    }
    let mut md = String::new();
    md.push_str("| machine | level | ns (range) | source | test/notes |\n|---|---|---|---|---|\n");
    for (lv, v) in &mut by_level {
        let (lo, hi) = (
            v.iter().cloned().fold(f64::INFINITY, f64::min),
            v.iter().cloned().fold(0.0, f64::max),
        );
        let med = median(v);
        md.push_str(&format!(
            "| {machine} | {lv} | median {med:.1}; {lo:.1}-{hi:.1} | this repository, `c2c` | \
             [measured] CAS ping-pong, one-way = round trip / 2; median of {} runs of {} round \
             trips per pair; {} pair{} |\n",
            o.samples,
            o.round_trips,
            v.len(),
            if v.len() == 1 { "" } else { "s" }
        ));
    }
    let mut counts = vec![1usize];
    while counts.last().unwrap() * 2 <= cpus.len() {
        counts.push(counts.last().unwrap() * 2);
    }
    if *counts.last().unwrap() != cpus.len() {
        counts.push(cpus.len());
    }
    let mut cont_csv = String::from("threads,ops_per_s,ns_per_op\n");
    let mut parts = Vec::new();
    for &t in &counts {
        let mut v: Vec<f64> = (0..3).map(|_| contended(&cpus[..t], o.millis)).collect();
        let ops = median(&mut v);
        cont_csv.push_str(&format!("{t},{ops:.0},{:.2}\n", 1e9 / ops));
        parts.push(format!("{t}T {:.1} M ops/s", ops / 1e6));
    }
    md.push_str(&format!(
        "\n| machine | measurement | numbers | source | notes |\n|---|---|---|---|---|\n\
         | {machine} | Aggregate throughput of `fetch_add` on ONE shared counter, by thread count | {} | this repository, `c2c` | [measured] median of 3 runs of {} ms; one thread pinned per CPU, CPUs in order; [derived] ns per operation = 1e9 / ops: {} (an owner change per operation takes at least the one-way latency above: below it, a thread completes several operations per ownership) |\n",
        parts.join("; "),
        o.millis,
        cont_csv
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                format!("{}T {} ns", f[0], f[2])
            })
            .collect::<Vec<_>>()
            .join(", ")
    ));
    print!("{md}");
    if let Some(dir) = o.out {
        let write = |name: &str, s: &str| {
            let p = dir.join(name);
            // never over a file this run did not make
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .and_then(|mut f| f.write_all(s.as_bytes()))
                .unwrap_or_else(|e| {
                    usage(&format!(
                        "writing {}: {e} (give --out a new or empty directory)",
                        p.display()
                    ))
                });
        };
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| usage(&format!("creating {}: {e}", dir.display())));
        write("pairs.csv", &pairs_csv);
        write("contention.csv", &cont_csv);
        write("tables.md", &md);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two usable CPUs, if this machine has them.
    /// Skips (returns `None`) only outside CI: under `CI=true` a machine
    /// without 2 CPUs fails the test instead of passing it silently.
    fn two() -> Option<(u32, u32)> {
        let c = allowed_host_cpus().unwrap_or_default();
        let pair = (c.len() >= 2).then(|| (c[0], c[1]));
        assert!(
            pair.is_some() || std::env::var("CI").is_err(),
            "c2c's tests need 2 usable CPUs"
        );
        pair
    }

    #[test]
    fn a_ping_pong_completes_and_takes_time() {
        let Some((a, b)) = two() else { return };
        let ns = ping_pong(a, b, 500);
        assert!(ns.is_finite() && ns > 0.5, "{ns} ns one way");
    }

    #[test]
    fn the_shared_counter_counts_every_increment() {
        let Some((a, b)) = two() else { return };
        let ops = contended(&[a, b], 20);
        // at least one batch of 64 per thread, and not faster than one
        // increment per 0.1 ns
        assert!(ops > 64.0 / 0.03 && ops < 1e10, "{ops} ops/s");
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
