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
//! * **one core's own costs**: an L1 hit and a DRAM access (a pointer
//!   chase through 16 KiB and through 128 MiB of lines in a random cyclic
//!   order, ns per dependent load; 4 KiB pages, so the DRAM figure
//!   includes page walks as a scheduler's scattered lines would), the miss
//!   buffers (the same chase with 1, 2, 4, ... 32 independent chains: the
//!   fewest chains whose time per load is within 10% of the best), 100
//!   spin-loop hints (`std`'s mutex spins that many times before it
//!   sleeps), a system call (`getpid`, as cheap as a futex wake that finds
//!   no waiter), a wakeup on the same CPU (two
//!   threads pinned to one CPU taking turns through `park`/`unpark`,
//!   `std`'s futex: one-way = a wake and a switch) and a wakeup of a
//!   thread sleeping on another, idle CPU (the same across the pair:
//!   the wake, the interrupt to the idle CPU, its exit from idle and the
//!   switch; and the waker's `unpark` call alone). `costs.toml` turns the
//!   wakeups into the executor costs the model charges when given them
//!   (`switch_ns`, `kick_ns`, `idle_exit_ns`): this machine's executors
//!   run tasks or CPUs as host threads.
//!
//! `cargo run -p benches --release --bin c2c -- [--out DIR]` prints the
//! tables in markdown; with `--out` it also writes `DIR/pairs.csv` (every
//! pair's samples, ns one-way), `DIR/contention.csv`, `DIR/core.csv`,
//! `DIR/tables.md` and `DIR/costs.toml`, this machine's cost table for
//! `vmm sim --costs DIR/costs.toml` (each value's source in a comment; a
//! level with no pair of CPUs here stands in from the next measured one,
//! and says so), and refuses to replace any of them that already exists.
//! Under software virtualization (kvm_pvm) the vCPUs are host threads, so
//! these are the costs the simulator would need for *this* machine, not
//! for the hardware under it.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use vcpu_sched_sim::exec::sim::CostTable;

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

/// One cache line of a pointer chase: the index of the next line.
#[repr(align(64))]
#[derive(Clone, Copy)]
struct ChaseLine {
    next: usize,
    _pad: [u64; 7],
}

/// Lines of `bytes` linked in one random cycle (a fixed xorshift seed).
fn chase_ring(bytes: usize) -> Vec<ChaseLine> {
    let n = (bytes / 64).max(2);
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut ring = vec![
        ChaseLine {
            next: 0,
            _pad: [0; 7]
        };
        n
    ];
    for w in 0..n {
        ring[order[w]].next = order[(w + 1) % n];
    }
    ring
}

/// ns per load of `chains` independent chases through `ring`, `loads`
/// loads in all (each chain starts an equal step apart along the cycle).
fn chase(ring: &[ChaseLine], chains: usize, loads: u64) -> f64 {
    const MAX: usize = 32;
    let chains = chains.clamp(1, MAX);
    let mut at = [0usize; MAX];
    let mut p = 0;
    let step = ring.len() / chains;
    for (c, slot) in at.iter_mut().enumerate().take(chains) {
        if c > 0 {
            for _ in 0..step {
                p = ring[p].next;
            }
        }
        *slot = p;
    }
    let rounds = (loads / chains as u64).max(1);
    let t = Instant::now();
    for _ in 0..rounds {
        for slot in at.iter_mut().take(chains) {
            *slot = ring[*slot].next;
        }
    }
    std::hint::black_box(&at);
    t.elapsed().as_nanos() as f64 / (rounds * chains as u64) as f64
}

/// ns of 100 spin-loop hints (PAUSE on x86), as `std`'s mutex spins.
fn spin100(sets: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..sets {
        for _ in 0..100 {
            std::hint::spin_loop();
        }
    }
    t.elapsed().as_nanos() as f64 / sets as f64
}

/// ns of one system call that does next to nothing (`getpid`, which
/// `std::process::id` makes every time: glibc stopped caching it in 2.25).
fn syscall_ns(cpu: u32, n: u64) -> f64 {
    std::thread::scope(|s| {
        s.spawn(move || {
            let _ = pin_current_thread(cpu);
            let t = Instant::now();
            for _ in 0..n {
                std::hint::black_box(std::process::id());
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .join()
        .expect("syscall thread")
    })
}

/// One-way ns of `n` round trips between two threads pinned to `a` and
/// `b` that take turns through `park`/`unpark` (std's futex): each side
/// sleeps until the other wakes it. `a == b`: a wake and a switch on one
/// CPU; otherwise the wake of a thread asleep on another, idle CPU.
fn wake_ping_pong(a: u32, b: u32, n: u64) -> f64 {
    wake_ping_pong_split(a, b, n).0
}

/// [`wake_ping_pong`], and the mean ns the first thread's `unpark` call
/// itself took (the waker's share: the futex wake system call).
fn wake_ping_pong_split(a: u32, b: u32, n: u64) -> (f64, f64) {
    let turn = AtomicU64::new(0);
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        let (turn, start) = (&turn, &start);
        let (tx, rx) = std::sync::mpsc::channel();
        let second = s.spawn(move || {
            let _ = pin_current_thread(b);
            let first: std::thread::Thread = rx.recv().expect("first thread");
            start.wait();
            for i in 0..n {
                while turn.load(Ordering::Acquire) != 2 * i + 1 {
                    std::thread::park();
                }
                turn.store(2 * i + 2, Ordering::Release);
                first.unpark();
            }
        });
        let first = s.spawn(move || {
            let _ = pin_current_thread(a);
            start.wait();
            let t = Instant::now();
            let mut waking = Duration::ZERO;
            for i in 0..n {
                turn.store(2 * i + 1, Ordering::Release);
                let w = Instant::now();
                second.thread().unpark();
                waking += w.elapsed();
                while turn.load(Ordering::Acquire) != 2 * i + 2 {
                    std::thread::park();
                }
            }
            (
                t.elapsed().as_nanos() as f64 / (2 * n) as f64,
                waking.as_nanos() as f64 / n as f64,
            )
        });
        tx.send(first.thread().clone()).expect("second thread");
        first.join().expect("wake thread")
    })
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
    // one core's own costs, on the first usable CPU (the chases and the
    // spin), the pair (the wakeups)
    let (c0, c1) = (cpus[0], cpus[1]);
    let _ = pin_current_thread(c0);
    let med = |f: &mut dyn FnMut() -> f64| -> f64 {
        let mut v: Vec<f64> = (0..o.samples).map(|_| f()).collect();
        median(&mut v)
    };
    let small = chase_ring(16 << 10);
    let l1 = med(&mut || chase(&small, 1, 20_000_000));
    let big = chase_ring(128 << 20);
    let dram = med(&mut || chase(&big, 1, 2_000_000));
    let mut mlp_curve = Vec::new();
    for k in [1usize, 2, 4, 8, 12, 16, 24, 32] {
        mlp_curve.push((k, med(&mut || chase(&big, k, 4_000_000))));
    }
    drop(big);
    let mlp = pick_mlp(&mlp_curve);
    let spin = med(&mut || spin100(100_000));
    let sys = med(&mut || syscall_ns(c0, 200_000));
    let wake_same = med(&mut || wake_ping_pong(c0, c0, 20_000));
    let mut idle_runs: Vec<(f64, f64)> = (0..o.samples)
        .map(|_| wake_ping_pong_split(c0, c1, 20_000))
        .collect();
    let wake_idle = median(&mut idle_runs.iter().map(|r| r.0).collect::<Vec<_>>());
    let unpark_idle = median(&mut idle_runs.iter_mut().map(|r| r.1).collect::<Vec<_>>());
    let mut core_csv = String::from("measurement,ns\n");
    for (k, ns) in &mlp_curve {
        core_csv.push_str(&format!("chase_128MiB_{k}_chains_per_load,{ns:.2}\n"));
    }
    for (name, ns) in [
        ("l1_hit", l1),
        ("dram", dram),
        ("spin_100_hints", spin),
        ("syscall", sys),
        ("wakeup_same_cpu", wake_same),
        ("wakeup_idle_cpu", wake_idle),
        ("unpark_of_idle_cpu_thread", unpark_idle),
    ] {
        core_csv.push_str(&format!("{name},{ns:.2}\n"));
    }
    let n = o.samples;
    md.push_str(&format!(
        "\n| machine | measurement | ns | source | test/notes |\n|---|---|---|---|---|\n\
         | {machine} | L1 hit | {l1:.2} | this repository, `c2c` | [measured] pointer chase through 16 KiB, random cyclic order, ns per dependent load; median of {n} |\n\
         | {machine} | DRAM access | {dram:.1} | same | [measured] the chase through 128 MiB (4 KiB pages: page walks included); median of {n} |\n\
         | {machine} | miss buffers | {mlp} | same | [derived] fewest independent chains whose ns per load is within 10% of the best: {} |\n\
         | {machine} | 100 spin-loop hints | {spin:.0} | same | [measured] `std::hint::spin_loop` (PAUSE) x 100, as `std`'s mutex spins before it sleeps; median of {n} |\n\
         | {machine} | system call | {sys:.0} | same | [measured] `getpid` (`std::process::id`), a syscall that does next to nothing, as a futex wake that finds no waiter; median of {n} |\n\
         | {machine} | wakeup, same CPU | {wake_same:.0} | same | [measured] two threads pinned to one CPU take turns via `park`/`unpark` (futex); one-way; median of {n} |\n\
         | {machine} | wakeup of an idle CPU | {wake_idle:.0} | same | [measured] the same across CPUs {c0} and {c1}: wake, interrupt, idle exit, switch; one-way; median of {n} |\n\
         | {machine} | the waker's `unpark` of it | {unpark_idle:.0} | same | [measured] the `unpark` call alone in that ping-pong (the futex wake system call), mean per call; median of {n} |\n",
        mlp_curve
            .iter()
            .map(|(k, ns)| format!("{k}: {ns:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let pair_ns: std::collections::BTreeMap<char, f64> = by_level
        .iter_mut()
        .filter_map(|(lv, v)| lv.chars().nth(1).map(|c| (c, median(v))))
        .collect();
    let measured = Measured {
        pairs: pair_ns,
        l1,
        dram,
        mlp,
        spin,
        syscall: sys,
        wakeup: wake_same,
        wakeup_idle: wake_idle,
        unpark: unpark_idle,
    };
    let (table, toml_text) = cost_table(&measured, &machine);
    if let Err(e) = table.check() {
        usage(&format!("the measured cost table is not usable: {e}"));
    }
    md.push_str(&format!(
        "\n`costs.toml` (for `vmm sim --costs`):\n\n```toml\n{toml_text}```\n"
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
        write("core.csv", &core_csv);
        write("costs.toml", &toml_text);
    }
}

/// The fewest chains whose ns per load is within 10% of the best.
fn pick_mlp(curve: &[(usize, f64)]) -> u32 {
    let best = curve.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    curve
        .iter()
        .find(|c| c.1 <= best * 1.1)
        .map_or(1, |c| c.0 as u32)
}

/// What `costs.toml` is made from.
struct Measured {
    /// Median one-way ns per pair class: 'a' SMT, 'b' shared L2, 'c' same
    /// LLC, 'd' same node, 'e' other node.
    pairs: std::collections::BTreeMap<char, f64>,
    l1: f64,
    dram: f64,
    mlp: u32,
    spin: f64,
    syscall: f64,
    wakeup: f64,
    wakeup_idle: f64,
    unpark: f64,
}

/// This machine's cost table, and its TOML with each value's source. The
/// model's levels map to the pair classes: SMT (a), L2 (b), LLC (c), die
/// and package (d), remote (e). A level without a pair here takes the
/// next farther measured one (the presets' rule), else the nearest
/// measured one below it; its comment says so.
fn cost_table(m: &Measured, machine: &str) -> (CostTable, String) {
    const LEVELS: [(&str, char); 6] = [
        ("smt_ns", 'a'),
        ("l2_ns", 'b'),
        ("llc_ns", 'c'),
        ("die_ns", 'd'),
        ("package_ns", 'd'),
        ("remote_ns", 'e'),
    ];
    let class = |c: char| match c {
        'a' => "SMT siblings",
        'b' => "a shared L2",
        'c' => "the same LLC",
        'd' => "the same node, another LLC",
        _ => "another node",
    };
    let round = |x: f64| x.round().max(1.0) as u64;
    let mut lines = vec![
        format!("# {machine}: cost table measured by `c2c` (benches/src/bin/c2c.rs)"),
        "# ns; levels are one-way CAS ping-pong latencies (round trip / 2)".to_string(),
    ];
    let mut ns = [0u64; 6];
    for (i, (field, c)) in LEVELS.iter().enumerate() {
        let (v, why) = if let Some(v) = m.pairs.get(c) {
            (*v, format!("measured: pairs sharing {}", class(*c)))
        } else if let Some((fc, v)) = LEVELS[i + 1..]
            .iter()
            .find_map(|(_, fc)| m.pairs.get(fc).map(|v| (*fc, *v)))
        {
            (
                v,
                format!("no such pair here: stands in from {}", class(fc)),
            )
        } else if let Some((fc, v)) = LEVELS[..i]
            .iter()
            .rev()
            .find_map(|(_, fc)| m.pairs.get(fc).map(|v| (*fc, *v)))
        {
            (
                v,
                format!("no such pair here or farther: stands in from {}", class(fc)),
            )
        } else {
            (m.dram, "no pair measured: the DRAM access stands in".into())
        };
        ns[i] = round(v);
        lines.push(format!("{field} = {}  # {why}", ns[i]));
    }
    let t = CostTable {
        l1_hit_ns: round(m.l1),
        smt_ns: ns[0],
        l2_ns: ns[1],
        llc_ns: ns[2],
        die_ns: ns[3],
        package_ns: ns[4],
        remote_ns: ns[5],
        memory_ns: round(m.dram),
        mlp: m.mlp.max(1),
        lock_spin_ns: round(m.spin),
        futex_wake_ns: round(m.syscall),
        wakeup_ns: round(m.wakeup),
        switch_ns: round(m.wakeup),
        kick_ns: round(m.unpark),
        idle_exit_ns: round(m.wakeup_idle - m.wakeup - m.unpark),
        // a host thread's wakeup has no idle depth the tool can measure
        // here: `vmm sim --idle-states deep` wants these in the file
        deep_idle_after_ns: 0,
        deep_idle_exit_ns: 0,
    };
    lines.extend([
        format!("l1_hit_ns = {}  # measured: {:.2} ns per load, pointer chase in 16 KiB", t.l1_hit_ns, m.l1),
        format!("memory_ns = {}  # measured: pointer chase in 128 MiB, 4 KiB pages", t.memory_ns),
        format!("mlp = {}  # derived: fewest parallel chases within 10% of the best time per load", t.mlp),
        format!("lock_spin_ns = {}  # measured: 100 spin-loop hints, as std's mutex spins", t.lock_spin_ns),
        format!("futex_wake_ns = {}  # measured: one system call that does next to nothing (getpid)", t.futex_wake_ns),
        format!("wakeup_ns = {}  # measured: park/unpark ping-pong on one CPU, one-way (a wake and a switch)", t.wakeup_ns),
        "# what this machine's executors add (their tasks or CPUs are host threads):".to_string(),
        format!("switch_ns = {}  # measured: as wakeup_ns, a switch between two host threads on one CPU", t.switch_ns),
        format!("kick_ns = {}  # measured: the waker's unpark of a thread asleep on the other CPU", t.kick_ns),
        format!(
            "idle_exit_ns = {}  # derived: cross-CPU park/unpark one-way ({:.0}) less wakeup_ns and kick_ns",
            t.idle_exit_ns, m.wakeup_idle
        ),
    ]);
    let mut text = lines.join("\n");
    text.push('\n');
    (t, text)
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
    fn the_core_rows_measure_something() {
        let ring = chase_ring(16 << 10);
        let ns = chase(&ring, 1, 100_000);
        assert!(ns > 0.05 && ns < 1_000.0, "{ns} ns per L1 load");
        assert!(chase(&ring, 8, 100_000) > 0.0);
        assert!(spin100(100) > 0.0);
        let Some((a, b)) = two() else { return };
        assert!(syscall_ns(a, 100) > 1.0);
        assert!(wake_ping_pong(a, a, 50) > 1.0);
        assert!(wake_ping_pong(a, b, 50) > 1.0);
    }

    #[test]
    fn the_ring_visits_every_line_once() {
        let ring = chase_ring(64 * 100);
        let (mut p, mut seen) = (0usize, vec![false; 100]);
        for _ in 0..100 {
            assert!(!seen[p]);
            seen[p] = true;
            p = ring[p].next;
        }
        assert_eq!(p, 0);
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn mlp_is_the_knee_of_the_curve() {
        let curve = [
            (1, 100.0),
            (2, 52.0),
            (4, 27.0),
            (8, 15.0),
            (12, 14.0),
            (16, 14.5),
        ];
        assert_eq!(pick_mlp(&curve), 8);
        assert_eq!(pick_mlp(&[(1, 10.0), (2, 10.5)]), 1);
    }

    #[test]
    fn costs_toml_reads_back_and_fills_missing_levels() {
        let m = Measured {
            pairs: [('c', 40.6)].into_iter().collect(),
            l1: 1.2,
            dram: 98.0,
            mlp: 12,
            spin: 3210.0,
            syscall: 230.0,
            wakeup: 2400.0,
            wakeup_idle: 30_000.0,
            unpark: 1_600.0,
        };
        let (t, text) = cost_table(&m, "test machine");
        let back: CostTable = toml::from_str(&text).unwrap();
        assert_eq!(back, t);
        back.check().unwrap();
        // SMT and L2 take the LLC's figure (the next farther measured);
        // die, package and remote have nothing farther: the LLC's too
        assert_eq!((t.smt_ns, t.l2_ns, t.llc_ns, t.remote_ns), (41, 41, 41, 41));
        assert!(text.contains("smt_ns = 41  # no such pair here: stands in from the same LLC"));
        assert!(text.contains("remote_ns = 41  # no such pair here or farther"));
        assert!(text.contains("llc_ns = 41  # measured"));
        assert_eq!((t.l1_hit_ns, t.memory_ns, t.mlp), (1, 98, 12));
        assert_eq!(
            (t.lock_spin_ns, t.futex_wake_ns, t.wakeup_ns),
            (3210, 230, 2400)
        );
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
