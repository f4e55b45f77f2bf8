//! The 1,000-vCPU soak (opt-in, not CI): 125 micro-guest VMs x 8 vCPUs of
//! the cyclic (RT), messaging and transcode (RT) workloads on one shared
//! scheduler pool over the emulated gnr-2s topology, with the invariant
//! checker on, for 10 minutes, while VMs are destroyed and created all the
//! time. It fails on any invariant violation, a stuck vCPU, RSS that is
//! not flat within 10% after the warm-up, or more file descriptors at the
//! end than after the warm-up. A vCPU is stuck when it is runnable (not
//! blocked in the scheduler) and has not left the guest for 10 s
//! (starved), or when no vCPU of its VM has for 10 s (a lost wakeup
//! leaves a whole VM waiting). A vCPU blocked in `HLT` while its VM goes
//! on is waiting for a doorbell, not stuck.
//!
//! Run it (release build; docs/reliability.md has the last result):
//!
//!     SOAK_OUT=docs/data/soak.txt cargo test --release -p integration-tests --test soak -- --ignored --nocapture
//!
//! `SOAK_SECS` (600), `SOAK_VMS` (125), `SOAK_VCPUS` (8) and
//! `SOAK_TOPOLOGY` (gnr-2s) change its size; `SOAK_CHURN_MS` (2000) is the
//! time between two replacements of the oldest VM; `SOAK_LINE_S` (30) the
//! time between progress lines.
//!
//! For a stuck vCPU it prints where the task is in the core (its state,
//! which CPU's wake list holds it), that CPU's worker (what it runs,
//! parked, kick pending, the core's current task) and what the kernel says
//! of the worker's thread (state, system call, kernel stack).
//! `SOAK_GDB=FILE` also writes every thread's stack to FILE with gdb at the
//! first stuck vCPU (that is how the RT-pull convoy was found).
//! `SOAK_GLIBC_DEFAULT_HEAP=1` skips [`vmm_machine::memory::steady_heap`], to see
//! what it saves.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vcpu_sched::exec::{CheckConfig, CpuMapping};
use vcpu_sched::{Mitigations, Policy};
use vmm_lab::{guests, iters_per_us};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::VcpuPool;
use vmm_machine::vcpu_body::{ExecOptions, Placement, Running, VmSet};

/// Counts the bytes the process holds on the heap, to tell a leak (live
/// bytes grow) from allocator fragmentation (RSS grows, live bytes flat).
struct Counting;

static LIVE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counter only observes sizes.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as i64, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(
            n as i64 - l.size() as i64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // SAFETY: as for dealloc and alloc.
        unsafe { std::alloc::System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn heap_mib() -> f64 {
    LIVE.load(std::sync::atomic::Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// One of the mix, in rotation: (name, program, RT?).
fn program(kind: usize, ipu: f64) -> (&'static str, Vec<u8>, bool) {
    // short bursts: the 1,000 vCPUs share 2 real CPUs here
    let it = |us: f64| ((us * ipu) as u64).max(1);
    match kind % 3 {
        0 => (
            "cyclic",
            guests::cyclic(2_000_000, it(5.0), kind as u64).unwrap(),
            true,
        ),
        1 => (
            "messaging",
            guests::messaging(it(2.0), kind as u64).unwrap(),
            false,
        ),
        _ => (
            "transcode",
            guests::transcode(it(50.0), kind as u64).unwrap(),
            true,
        ),
    }
}

struct Live {
    name: String,
    run: Running,
    set: Arc<VmSet>,
    /// Progress per vCPU at the last check, and when it last moved.
    seen: Vec<(u64, Instant)>,
    /// When any vCPU of the VM last moved.
    vm_moved: Instant,
    /// Per vCPU: when it was reported stuck, until it moves again.
    stuck_since: Vec<Option<Instant>>,
}

#[test]
#[ignore = "a 10-minute soak; run it by hand (see the module docs)"]
fn soak_1000_vcpus_with_churn() {
    let secs = env("SOAK_SECS", 600);
    let nvms = env("SOAK_VMS", 125) as usize;
    let nvcpus = env("SOAK_VCPUS", 8) as usize;
    let churn = Duration::from_millis(env("SOAK_CHURN_MS", 2000));
    let spec = std::env::var("SOAK_TOPOLOGY").unwrap_or_else(|_| "gnr-2s".into());
    let warmup = Duration::from_secs((secs / 10).clamp(5, 60));
    let stuck_after = Duration::from_secs(10);
    let line_every = Duration::from_secs(env("SOAK_LINE_S", 30));
    // Where the log goes, checked now rather than after ten minutes. A
    // relative path is taken from the workspace root, where the command in
    // the module docs is run (cargo runs tests from the crate's directory).
    let out = std::env::var_os("SOAK_OUT").map(|p| {
        let p = std::path::PathBuf::from(p);
        let p = if p.is_relative() {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(p)
        } else {
            p
        };
        if let Err(e) = std::fs::write(&p, "") {
            panic!("SOAK_OUT {}: {e} (does its directory exist?)", p.display());
        }
        p
    });

    // as `vmm` does in main (SOAK_GLIBC_DEFAULT_HEAP=1 leaves glibc's
    // dynamic mmap threshold on, to compare)
    if std::env::var_os("SOAK_GLIBC_DEFAULT_HEAP").is_none() {
        assert!(vmm_machine::memory::steady_heap(), "mallopt refused");
    }
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let host = MicroHost::open().expect("/dev/kvm");
    let ipu = iters_per_us(&host).expect("calibration");
    let topo = Arc::new(topology::load(&spec).expect("topology"));
    let mut eo = ExecOptions::new(topo.clone(), CpuMapping::for_spec(&spec).expect("mapping"));
    eo.mitigations = Mitigations::all();
    eo.check = Some(CheckConfig::default());
    eo.sched.max_tasks = eo.sched.max_tasks.max(2 * nvms * nvcpus);
    let pool = Arc::new(VcpuPool::start(&eo).expect("pool"));

    let mut made = 0usize;
    let make = |made: &mut usize| -> Live {
        let (kind, code, rt) = program(*made, ipu);
        let name = format!("{kind}{made}");
        *made += 1;
        let vm = MicroVm::build(&host, &MicroVmSpec::new(name.clone(), nvcpus, code))
            .expect("build micro-guest");
        let policy = if rt {
            Policy::Fifo(50)
        } else {
            Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT)
        };
        let guest = vm.into_guest(vec![Placement {
            policy,
            affinity: None,
        }]);
        let set = VmSet::new_on(vec![guest], pool.epoch()).expect("set");
        let run = Running::start_on(&pool, set.clone()).expect("attach");
        let now = Instant::now();
        Live {
            name,
            run,
            set,
            seen: vec![(0, now); nvcpus],
            vm_moved: now,
            stuck_since: vec![None; nvcpus],
        }
    };

    let mut log = String::new();
    let _ = writeln!(
        log,
        "soak: {nvms} VMs x {nvcpus} vCPUs ({} vCPUs) on {spec} ({} CPUs emulated on {} host CPUs), \
         mitigations all, checker on, {secs} s, one VM replaced every {} ms, warm-up {} s",
        nvms * nvcpus,
        topo.num_cpus(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        churn.as_millis(),
        warmup.as_secs()
    );
    eprint!("{log}");
    let t0 = Instant::now();
    let mut live: VecDeque<Live> = (0..nvms).map(|_| make(&mut made)).collect();
    let attached = format!(
        "all {nvms} VMs attached after {:.1} s\n",
        t0.elapsed().as_secs_f64()
    );
    eprint!("{attached}");
    log.push_str(&attached);

    let mut violations: Vec<String> = Vec::new();
    let mut stuck: Vec<String> = Vec::new();
    let (mut destroyed, mut ended) = (0usize, 0usize);
    let mut samples: Vec<(f64, u64, usize)> = Vec::new(); // (t, rss KiB, fds) after warm-up
    let mut last_churn = Instant::now();
    let mut last_line = Instant::now();
    let mut exits_before = 0u64;
    let mut gdb_done = false;
    let mut retired_exits = 0u64;
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_secs(1));
        let now = Instant::now();
        // progress: every vCPU of a VM that has not ended moves
        let sched = pool.scheduler();
        for l in live.iter_mut() {
            let ended_vm = l.set.vms()[0].live() == 0;
            for (k, p) in l.set.progress_snapshot().into_iter().enumerate() {
                let (last, at) = l.seen[k];
                if p != last {
                    if let Some(since) = l.stuck_since[k].take() {
                        eprintln!(
                            "RECOVERED: {}/vcpu{k} moved again {:.1} s after it was reported stuck",
                            l.name,
                            now.saturating_duration_since(since).as_secs_f64()
                        );
                    }
                    l.seen[k] = (p, now);
                    l.vm_moved = now;
                    continue;
                }
                if ended_vm || now.saturating_duration_since(at) <= stuck_after {
                    continue;
                }
                let slot = &l.set.slots()[k];
                let state = slot.task.get().and_then(|t| sched.task_state(*t).ok());
                let starved = !matches!(state, Some(vcpu_sched::TaskState::Blocked) | None);
                let vm_stalled = now.saturating_duration_since(l.vm_moved) > stuck_after;
                if starved || vm_stalled {
                    let what = format!(
                        "{}/vcpu{k}: no exit for {:.0} s, {state:?}{}",
                        l.name,
                        now.saturating_duration_since(at).as_secs_f64(),
                        if vm_stalled {
                            ", its whole VM stalled"
                        } else {
                            ""
                        }
                    );
                    // Where it is: its state in the core, which CPU's wake
                    // list holds it (else the CPU it is on or last ran on),
                    // and that CPU's worker.
                    let what = match slot.task.get() {
                        Some(&t) if starved => {
                            let on_list = sched.wake_list_of(t);
                            let cpu = on_list.or_else(|| sched.task_cpu(t).ok());
                            format!(
                                "{what}; {}; {}",
                                sched
                                    .explain_task(t, pool.now())
                                    .unwrap_or_else(|e| e.to_string()),
                                cpu.map_or("no CPU".into(), |c| pool.cpu_state(c))
                            )
                        }
                        _ => what,
                    };
                    eprintln!("STUCK: {what}");
                    if let (Ok(out), false) = (std::env::var("SOAK_GDB"), gdb_done) {
                        // every thread's stack, once (the process stops
                        // while gdb reads it)
                        gdb_done = true;
                        // straight into the file: a pipe would need this
                        // (stopped) process to read it
                        if let Ok(f) = std::fs::File::create(&out) {
                            let _ = std::process::Command::new("gdb")
                                .args(["-batch", "-p", &std::process::id().to_string()])
                                .args(["-ex", "thread apply all bt 20"])
                                .stdout(f)
                                .stderr(std::process::Stdio::null())
                                .status();
                        }
                    }
                    stuck.push(what);
                    l.stuck_since[k] = Some(now);
                    // once per vCPU
                    l.seen[k].1 = now + Duration::from_secs(3600);
                }
            }
            if let Some(f) = l.set.vms()[0].failure() {
                violations.push(format!("VM {} failed: {f}", l.name));
            }
        }
        // churn: the oldest VM goes, a fresh one of the next kind comes
        if now - last_churn >= churn {
            last_churn = now;
            let old = live.pop_front().expect("a VM");
            let t_stop = Instant::now();
            if old.set.vms()[0].live() == 0 {
                ended += 1;
            }
            retired_exits += old.set.progress_snapshot().iter().sum::<u64>();
            let out = old.run.stop(Duration::from_secs(60)).expect("detach");
            violations.extend(
                out.violations
                    .into_iter()
                    .map(|v| format!("{}: {v}", old.name)),
            );
            assert!(old.set.vms()[0].torn_down(), "{}: not torn down", old.name);
            destroyed += 1;
            let t_make = Instant::now();
            live.push_back(make(&mut made));
            let (stop_s, make_s) = (
                (t_make - t_stop).as_secs_f64(),
                t_make.elapsed().as_secs_f64(),
            );
            if stop_s + make_s > 2.0 {
                eprintln!(
                    "SLOW CHURN at t={:.0}s: destroying {} took {stop_s:.1} s, creating the next {make_s:.1} s",
                    (now - t0).as_secs_f64(),
                    old.name
                );
            }
        }
        let t = (now - t0).as_secs_f64();
        if now - t0 >= warmup {
            samples.push((t, rss_kib(), fds()));
        }
        if now - last_line >= line_every {
            last_line = now;
            let exits: u64 = retired_exits
                + live
                    .iter()
                    .map(|l| l.set.progress_snapshot().iter().sum::<u64>())
                    .sum::<u64>();
            let line = format!(
                "t={t:5.0}s VMs {} vCPUs {} tasks {} RSS {:.1} MiB (heap {:.1} MiB) fds {} exits/s {:.0} created {} destroyed {}",
                live.len(),
                live.len() * nvcpus,
                pool.scheduler().live_tasks().len(),
                rss_kib() as f64 / 1024.0,
                heap_mib(),
                fds(),
                (exits - exits_before) as f64 / line_every.as_secs_f64(),
                made,
                destroyed
            );
            exits_before = exits;
            eprintln!("{line}");
            let _ = writeln!(log, "{line}");
        }
    }
    // everything down; the pool's own findings last
    let fds_live = samples.last().map_or(0, |s| s.2);
    for l in live.drain(..) {
        let out = l.run.stop(Duration::from_secs(60)).expect("detach");
        violations.extend(
            out.violations
                .into_iter()
                .map(|v| format!("{}: {v}", l.name)),
        );
    }
    violations.extend(pool.violations());
    let tasks_left = pool.scheduler().live_tasks().len();
    pool.stop();

    let rss: Vec<u64> = samples.iter().map(|s| s.1).collect();
    let (lo, hi) = (
        rss.iter().copied().min().unwrap_or(0),
        rss.iter().copied().max().unwrap_or(0),
    );
    let fds_warm = samples.first().map_or(0, |s| s.2);
    let rss_flat = lo > 0 && (hi as f64) <= lo as f64 * 1.10;
    let verdict = format!(
        "verdict after {:.0} s: VMs created {made}, destroyed {destroyed} ({ended} had ended on their own), \
         invariant violations {}, stuck vCPUs {}, RSS after warm-up {:.1}-{:.1} MiB ({}), \
         fds after warm-up {fds_warm}, with all VMs up at the end {fds_live}, tasks left after teardown {tasks_left}",
        t0.elapsed().as_secs_f64(),
        violations.len(),
        stuck.len(),
        lo as f64 / 1024.0,
        hi as f64 / 1024.0,
        if rss_flat { "flat within 10%" } else { "NOT flat within 10%" },
    );
    let _ = writeln!(log, "{verdict}");
    for v in violations.iter().take(20) {
        let _ = writeln!(log, "  violation: {v}");
    }
    for s in stuck.iter().take(20) {
        let _ = writeln!(log, "  stuck: {s}");
    }
    // The verdict first, then the log: a failed write is reported after
    // the verdict and never stands in for it.
    let mut failed = Vec::new();
    if !violations.is_empty() {
        failed.push(format!("{} invariant violations", violations.len()));
    }
    if !stuck.is_empty() {
        failed.push(format!("{} stuck vCPUs", stuck.len()));
    }
    if !rss_flat {
        failed.push("RSS not flat within 10% after the warm-up".to_string());
    }
    if fds_live > fds_warm {
        failed.push(format!(
            "fds grew: {fds_warm} after the warm-up, {fds_live} at the end"
        ));
    }
    if tasks_left != 0 {
        failed.push(format!("{tasks_left} tasks left after teardown"));
    }
    let outcome = if failed.is_empty() {
        "PASSED".to_string()
    } else {
        format!("FAILED: {}", failed.join("; "))
    };
    let _ = writeln!(log, "{outcome}");
    eprintln!("{verdict}\n{outcome}");
    let written = match &out {
        Some(p) => std::fs::write(p, &log).map_err(|e| format!("SOAK_OUT {}: {e}", p.display())),
        None => Ok(()),
    };
    assert!(
        failed.is_empty(),
        "{log}\nthe soak failed: {}{}",
        failed.join("; "),
        written
            .as_ref()
            .err()
            .map(|e| format!(" (and the log could not be written: {e})"))
            .unwrap_or_default()
    );
    if let Err(e) = written {
        panic!("the soak passed (verdict above), but its log could not be written: {e}");
    }
}
