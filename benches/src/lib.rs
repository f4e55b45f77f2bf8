//! Shared helpers for the criterion benchmarks in `benches/benches/`: one
//! benchmark group per scheduler fix, baseline against fix, on the
//! operation the fix targets, with several writer threads where the fix is
//! about contention.
//!
//! * `BENCH_WRITERS` sets the number of writer threads (default: the host
//!   CPUs this process may use). Each writer is pinned to host CPU
//!   `i % host CPUs` and plays a different logical CPU of the modelled
//!   topology (an emulated 2-socket machine), so the data structures see
//!   the access pattern of many CPUs, compressed onto the real ones.
//! * [`ratios`] reads criterion's estimates back and prints baseline/fix
//!   ratios (see `docs/results-scheduler.md`).
//! * [`ab`] puts criterion's saved passes of several builds side by side
//!   with their raw samples (`scripts/sync-layer-ab.sh`).
//!
//! Besides the per-fix groups: `core_ops` times the core's whole calls
//! (`wake`, `schedule`, `tick`; each fix alone, all, an A/A row) and
//! counts their accesses (`scripts/core-ops.sh`), `calibrate` derives the
//! simulator's instruction costs, `sim_speed` times the simulator, and
//! the `c2c` binary measures this machine's core-to-core latency and
//! contended throughput.

pub mod ab;

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use vcpu_sched::exec::{allowed_host_cpus, pin_current_thread};
use vcpu_sched::TopoMap;

/// The `main` of every benchmark in `benches/benches/`: criterion with this
/// suite's settings (20 samples, 1 s warm-up, 3 s of measurement) running
/// the given `fn(&mut Criterion)`s. Expands to a `main`, so use it once, at
/// the end of a bench file; it names `criterion` (a dev-dependency of the
/// bench targets), not this library.
#[macro_export]
macro_rules! bench_main {
    ($($target:path),+ $(,)?) => {
        criterion::criterion_group! {
            name = suite;
            config = criterion::Criterion::default()
                .sample_size(20)
                .warm_up_time(std::time::Duration::from_secs(1))
                .measurement_time(std::time::Duration::from_secs(3));
            targets = $($target),+
        }
        criterion::criterion_main!(suite);
    };
}

/// The modelled topology's precomputed view.
pub fn map(spec: &str) -> TopoMap {
    let t = topology::load(spec).expect("topology preset");
    TopoMap::new(&t).expect("topology fits")
}

/// The writer counts to measure: 1 (the cost of the layout alone, no
/// sharing) and [`writers`] (contention), without duplicates.
pub fn writer_counts() -> Vec<usize> {
    let n = writers();
    if n == 1 {
        vec![1]
    } else {
        vec![1, n]
    }
}

/// Writer threads: `BENCH_WRITERS`, or the host CPUs we may use.
pub fn writers() -> usize {
    std::env::var("BENCH_WRITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| allowed_host_cpus().map(|v| v.len()).unwrap_or(2).max(1))
}

/// Runs `f(thread, iters)` on `threads` pinned threads started together,
/// and returns the wall time until the last one finished.
pub fn contended<F>(threads: usize, iters: u64, f: F) -> Duration
where
    F: Fn(usize, u64) + Sync,
{
    let host = allowed_host_cpus().unwrap_or_else(|_| vec![0]);
    let start = Arc::new(Barrier::new(threads + 1));
    let mut t0 = Instant::now();
    std::thread::scope(|s| {
        for i in 0..threads {
            let (start, f, host) = (start.clone(), &f, &host);
            s.spawn(move || {
                let _ = pin_current_thread(host[i % host.len()]);
                start.wait();
                f(i, iters);
            });
        }
        start.wait();
        t0 = Instant::now();
        // the scope joins every writer before it returns
    });
    t0.elapsed().max(Duration::from_nanos(1))
}

/// A logical CPU for writer `w` of `n`, spread across nodes and LLCs of
/// `map`, stepping through `k` CPUs per writer: writer 0 plays CPUs on node
/// 0, writer 1 on the other node, and so on.
pub fn cpu_for(map: &TopoMap, w: usize, n: usize, step: u64) -> u32 {
    let cpus = map.ncpus() as u64;
    let stride = (cpus / n.max(1) as u64).max(1);
    ((w as u64 * stride + (step % 8) * 2) % cpus) as u32
}

/// Baseline/fix time ratios from criterion's saved estimates under
/// `dir` (`target/criterion`): one line per group and parameter with
/// baseline, fix, ratio (baseline time / fix time: above 1 the fix is
/// faster) and the ratio's range from the two confidence intervals.
pub fn ratios(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(groups) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut groups: Vec<_> = groups.flatten().map(|e| e.path()).collect();
    groups.sort();
    for g in groups {
        let name = g.file_name().unwrap().to_string_lossy().to_string();
        let est = |variant: &str, param: &str| -> Option<(f64, f64, f64)> {
            let p = g.join(variant).join(param).join("new/estimates.json");
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
            // slope for linear sampling, mean otherwise
            let m = if v["slope"].is_object() {
                &v["slope"]
            } else {
                &v["mean"]
            };
            Some((
                m["point_estimate"].as_f64()?,
                m["confidence_interval"]["lower_bound"].as_f64()?,
                m["confidence_interval"]["upper_bound"].as_f64()?,
            ))
        };
        let Ok(params) = std::fs::read_dir(g.join("baseline")) else {
            continue;
        };
        let mut params: Vec<String> = params
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|p| p != "report")
            .collect();
        params.sort();
        for p in params {
            if let (Some(b), Some(f)) = (est("baseline", &p), est("fix", &p)) {
                out.push(format!(
                    "{name:<12} {p:<12} baseline {:>10.1} ns  fix {:>10.1} ns  ratio {:>5.2}x  ({:.2}-{:.2})",
                    b.0,
                    f.0,
                    b.0 / f.0,
                    b.1 / f.2,
                    b.2 / f.1
                ));
            }
        }
    }
    out
}
