//! One `vmm bench` run: build the VMs, run them for a warm-up and a
//! measured window, and report.
//!
//! WHAT: [`run`] and its steps.
//! WHY: the measurement has several phases (build, window, per-vCPU rows,
//! the workload's metric, the checker's verdict); one function each keeps
//! them readable and separately changeable.
//! HOW: the VMs are micro-guests ([`super::guests`]), all in one
//! [`VmSet`] on one executor ([`Running`]); progress counters are read
//! from guest memory and the set when the window opens and closes.

pub(crate) use super::place::VmPlace;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vcpu_sched::bench::{RunReport, TaskSummary};
use vcpu_sched::exec::{CheckConfig, CpuMapping};
use vcpu_sched::stats::Histogram;
use vcpu_sched::workload::defs;
use vcpu_sched::workload::Metric;
use vcpu_sched::{CpuMask, Policy, SchedConfig};
use vm_memory::GuestMemoryMmap;

use super::calibrate::iters_per_us;
use super::{guests, BenchError, BenchOptions, BenchReport, IoCpus, VcpuRow, Workload};
use vmm_machine::micro::{read_u64, MicroError, MicroHost, MicroVm, MicroVmSpec, DATA_ADDR};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, Placement, Running, VmSet};

struct Built {
    set: Arc<VmSet>,
    memories: Vec<GuestMemoryMmap>,
    /// `net`: the host side of the taps.
    peer: Option<super::net::Peer>,
}

/// The workload's compute per operation, us (`vcpu_sched::workload::defs`,
/// shared with the thread workloads and the simulator).
fn default_burst(w: Workload) -> u64 {
    match w {
        Workload::Cyclic => defs::CYCLIC_BURST_US,
        Workload::Messaging => defs::MESSAGING_BURST_US,
        Workload::Runq => defs::RUNQ_BURST_US,
        Workload::Transcode => defs::TRANSCODE_BURST_US,
        Workload::Pingpong => defs::PINGPONG_BURST_US,
        Workload::Blk | Workload::Net => 0,
    }
}

fn build(
    opts: &BenchOptions,
    topo: &topology::HostTopology,
    host: &MicroHost,
) -> Result<Built, BenchError> {
    let total = opts.vms * opts.vcpus;
    if opts.pin && total > topo.num_cpus() {
        return Err(BenchError::Input(format!(
            "--pin gives every vCPU a CPU of its own, but {total} vCPUs do not fit on the \
             {} CPUs of the topology: give fewer --vms or --vcpus, or leave --pin out",
            topo.num_cpus()
        )));
    }
    if opts.workload == Workload::Blk {
        let places = device_vm_places(opts, topo)?;
        let (vms, memories) = super::blk::iops_vms(&opts.blk, &places, host)?;
        return Ok(Built {
            set: VmSet::new(vms)?,
            memories,
            peer: None,
        });
    }
    if opts.workload == Workload::Net {
        let places = device_vm_places(opts, topo)?;
        let (vms, memories) = super::net::vms(&opts.net, &places, host)?;
        let peer = super::net::Peer::start(&opts.net, &memories)?;
        return Ok(Built {
            set: VmSet::new(vms)?,
            memories,
            peer: Some(peer),
        });
    }
    let ipu = iters_per_us(host)?;
    let mut vms = Vec::with_capacity(opts.vms);
    let mut memories = Vec::with_capacity(opts.vms);
    for v in 0..opts.vms {
        // each VM its own seed: its vCPUs draw their own steps
        let code = guest_code(opts, ipu, v as u64)?;
        let spec = MicroVmSpec::new(format!("vm{v}"), opts.vcpus, code);
        let vm = MicroVm::build(host, &spec)?;
        memories.push(vm.memory.clone());
        let p = placement(opts, topo, v);
        let placements = if opts.pin {
            // vCPU i of VM v on logical CPU v * vcpus + i, alone
            (0..opts.vcpus)
                .map(|i| Placement {
                    policy: p.policy,
                    affinity: Some(CpuMask::single((v * opts.vcpus + i) as u32)),
                })
                .collect()
        } else {
            vec![p]
        };
        vms.push(vm.into_guest(placements));
    }
    Ok(Built {
        set: VmSet::new(vms)?,
        memories,
        peer: None,
    })
}

/// The places of `blk`'s and `net`'s VMs (one vCPU each): with `pin`, VM
/// `v`'s vCPU alone on logical CPU `v`; its I/O threads on that CPU's
/// host CPU (`same`), the next logical CPU's (`other`), or not placed
/// (`any`). [`validate`] has checked that `same` and `other` come with
/// `pin` on `--topology host`, where logical CPU `c` is host CPU
/// `os_index(c)`.
fn device_vm_places(
    opts: &BenchOptions,
    topo: &topology::HostTopology,
) -> Result<Vec<VmPlace>, BenchError> {
    let n = topo.num_cpus();
    if opts.io_cpus == IoCpus::Other && n < 2 {
        return Err(BenchError::Input(format!(
            "--io-cpus other puts the I/O threads on another host CPU, but the topology has \
             {n} CPU; use same or any"
        )));
    }
    Ok((0..opts.vms)
        .map(|v| {
            let vcpu = Placement {
                affinity: opts.pin.then(|| CpuMask::single(v as u32)),
                ..Placement::default()
            };
            let host_cpu = |c: usize| vec![topo.os_index((c % n) as u32) as usize];
            let io_cpus = match opts.io_cpus {
                IoCpus::Any => None,
                IoCpus::Same => Some(host_cpu(v)),
                IoCpus::Other => Some(host_cpu(v + 1)),
            };
            VmPlace { vcpu, io_cpus }
        })
        .collect())
}

/// The workload's guest code, its steps `ipu` loop iterations per
/// microsecond long on average, drawn from a generator seeded by `seed`.
fn guest_code(opts: &BenchOptions, ipu: f64, seed: u64) -> Result<Vec<u8>, BenchError> {
    let burst = opts
        .burst_us
        .unwrap_or_else(|| default_burst(opts.workload));
    let iters = ((burst as f64 * ipu) as u64).max(1);
    let total = opts.vms * opts.vcpus;
    Ok(match opts.workload {
        Workload::Cyclic => {
            let period_us = opts
                .period_us
                .unwrap_or_else(|| 1000u64.max(total as u64 * 1000 / 16));
            if period_us == 0 || period_us > u32::MAX as u64 / 1000 {
                return Err(BenchError::Input(format!(
                    "a period of {period_us} us; give 1 to {} us",
                    u32::MAX / 1000
                )));
            }
            guests::cyclic((period_us * 1000) as u32, iters, seed)?
        }
        Workload::Messaging => {
            even_vcpus(opts, "messaging pairs senders with receivers")?;
            guests::messaging(iters, seed)?
        }
        Workload::Runq => {
            if opts.vcpus < 2 {
                return Err(BenchError::Input(
                    "runq needs a message vCPU and at least one worker: --vcpus 2 or more".into(),
                ));
            }
            guests::runq(iters, seed)?
        }
        Workload::Transcode => guests::transcode(iters, seed)?,
        Workload::Pingpong => {
            even_vcpus(opts, "pingpong pairs vCPU 2p with 2p+1")?;
            guests::pingpong(iters, seed)?
        }
        Workload::Blk | Workload::Net => {
            return Err(BenchError::Input(format!(
                "{} builds its guests itself",
                opts.workload.name()
            )))
        }
    })
}

/// A workload that pairs its vCPUs (`why`) needs an even count.
fn even_vcpus(opts: &BenchOptions, why: &str) -> Result<(), BenchError> {
    if opts.vcpus % 2 != 0 {
        return Err(BenchError::Input(format!(
            "{why}: give an even --vcpus (not {})",
            opts.vcpus
        )));
    }
    Ok(())
}

/// The scheduling attributes of VM `v`'s vCPUs: RT workloads are FIFO,
/// transcode VMs are pinned to cores of their own.
fn placement(opts: &BenchOptions, topo: &topology::HostTopology, v: usize) -> Placement {
    match opts.workload {
        Workload::Cyclic => Placement {
            policy: Policy::Fifo(opts.prio),
            affinity: None,
        },
        Workload::Transcode => Placement {
            policy: Policy::Fifo(opts.prio),
            // as the seed's instances: half as many cores as vCPUs
            affinity: Some(defs::transcode_cpus(topo, v, opts.vcpus.div_ceil(2))),
        },
        _ => Placement::default(),
    }
}

/// Sum of the workload's progress counters in guest memory.
fn guest_count(w: Workload, b: &Built, vcpus: usize) -> u64 {
    if let Some(p) = &b.peer {
        return p.count(&b.memories);
    }
    let mut s = 0;
    for m in &b.memories {
        match w {
            Workload::Messaging => {
                for p in 0..vcpus as u64 / 2 {
                    s += read_u64(m, DATA_ADDR + guests::pipe_offset(p) + 64).unwrap_or(0);
                }
            }
            Workload::Runq => s += read_u64(m, DATA_ADDR + guests::RUNQ_ANSWERS).unwrap_or(0),
            Workload::Transcode => s += read_u64(m, DATA_ADDR + guests::FRAMES).unwrap_or(0),
            Workload::Pingpong => {
                for p in 0..vcpus as u64 / 2 {
                    let at = DATA_ADDR + guests::pair_offset(p) + guests::HANDOFFS;
                    s += read_u64(m, at).unwrap_or(0);
                }
            }
            Workload::Blk => {
                s += read_u64(m, DATA_ADDR + vmm_machine::micro::driver::COMPLETED).unwrap_or(0)
            }
            Workload::Cyclic | Workload::Net => {}
        }
    }
    s
}

fn validate(opts: &BenchOptions) -> Result<(), BenchError> {
    if opts.vms == 0 || opts.vcpus == 0 {
        return Err(BenchError::Input(
            "give at least one VM and one vCPU per VM".into(),
        ));
    }
    if opts.duration.is_zero() {
        return Err(BenchError::Input("the duration must be positive".into()));
    }
    if opts.prio == 0 || opts.prio > 99 {
        return Err(BenchError::Input(format!(
            "RT priority {}; give 1 to 99",
            opts.prio
        )));
    }
    if opts.burst_us == Some(0) {
        return Err(BenchError::Input("a burst must be at least 1 us".into()));
    }
    validate_io_cpus(opts)?;
    if opts.workload == Workload::Blk {
        super::blk::validate(&opts.blk, opts.vms, opts.vcpus)?;
    }
    if opts.workload == Workload::Net {
        super::net::validate(&opts.net, opts.vms, opts.vcpus)?;
    }
    Ok(())
}

/// `--io-cpus same|other` only where the vCPU's host CPU is known: `blk`
/// or `net`, pinned vCPUs, the host's own topology.
fn validate_io_cpus(opts: &BenchOptions) -> Result<(), BenchError> {
    let io = opts.io_cpus;
    if io == IoCpus::Any {
        return Ok(());
    }
    if !matches!(opts.workload, Workload::Blk | Workload::Net) {
        return Err(BenchError::Input(format!(
            "--io-cpus places virtio devices' I/O threads: the blk and net workloads only, \
             not {}",
            opts.workload.name()
        )));
    }
    if !opts.pin {
        return Err(BenchError::Input(format!(
            "--io-cpus {io} places the I/O threads by the host CPU of each VM's vCPU: give \
             --pin too (VM v's vCPU alone on CPU v)"
        )));
    }
    if opts.topology.trim() != "host" {
        return Err(BenchError::Input(format!(
            "--io-cpus {io} needs --topology host (on an emulated topology, logical CPUs \
             share host CPUs), not {}",
            opts.topology
        )));
    }
    Ok(())
}

/// Runs one workload once. `progress` gets the fraction done (0..=1).
pub fn run(opts: &BenchOptions, progress: &mut dyn FnMut(f64)) -> Result<BenchReport, BenchError> {
    validate(opts)?;
    vmm_machine::vcpu::install_kick_signal().map_err(MicroError::from)?;
    let topo = Arc::new(topology::load(&opts.topology)?);
    let mapping = CpuMapping::for_spec(&opts.topology)?;
    let emulated = mapping.is_emulated();
    let host_cpus = mapping.host_cpus(topo.num_cpus());
    let host = MicroHost::open()?;
    let mut built = build(opts, &topo, &host)?;
    let set = built.set.clone();
    let eo = exec_options(opts, topo.clone(), mapping, set.slots().len());
    let host_rt = eo.host_rt;
    set.set_breakdown(opts.breakdown);
    let running = Running::start(&eo, set.clone())?;
    // The workers of an RT workload run at host SCHED_FIFO; a SCHED_OTHER
    // measuring thread would get no CPU until the window is over and then
    // open and close it in one wakeup. It sleeps between 10 ms checks, so
    // one priority above the workers (as the clock thread) costs them
    // almost nothing.
    if let Some(p) = host_rt {
        vcpu_sched::os_thread::set_host_rt(p, 2);
    }
    let m = measure(opts, &built, &running, progress);
    if host_rt.is_some() {
        let _ = vcpu_sched::os_thread::set_policy(vcpu_sched::os_thread::HostPolicy::Other);
    }
    let peer = built.peer.take().map(super::net::Peer::stop);
    let out = running.stop(Duration::from_secs(60))?;
    progress(1.0);
    let secs = set.window.len() as f64 / 1e9;
    let metrics = set.take_metrics();
    let breakdown = if opts.breakdown {
        stage_rows(&metrics)
    } else {
        Vec::new()
    };
    let mut rows = vcpu_rows(opts, &set, &metrics, &out, &m);
    let mut ts = TaskSummary::from_tasks(out.tasks.iter().flatten());
    // every vCPU counts, also one whose statistics the executor lacks
    ts.tasks = metrics.len();
    ts.run_delay_per_task_ns = ts.run_delay_ns as f64 / ts.tasks.max(1) as f64;
    let count = m.guest_end.saturating_sub(m.start.guest) as f64;
    let (metric, mut extra) = workload_metric(opts.workload, &rows.guest_latency, count, secs);
    let sched_ns: u64 = out.sched_ns_per_cpu.iter().sum();
    let sched_calls: u64 = out.sched_calls_per_cpu.iter().sum();
    if !out.timer_spin_ns_per_cpu.is_empty() {
        // the timer advance's cost: CPU time idle workers polled, over the
        // whole run (warm-up included), per CPU
        let spun: u64 = out.timer_spin_ns_per_cpu.iter().sum();
        extra.insert(
            "timer_spin_ms_per_cpu".into(),
            spun as f64 / 1e6 / out.timer_spin_ns_per_cpu.len() as f64,
        );
    }
    let mut violations = out.violations.clone();
    for (vm, r) in set.failures() {
        violations.push(format!("VM {vm} failed: {r}"));
    }
    if let Some(p) = &peer {
        super::net::report(p, opts.net.mode, &mut extra, &mut violations)?;
    }
    let report = BenchReport {
        run: RunReport {
            workload: opts.workload.name().into(),
            topology: opts.topology.clone(),
            executor: opts.executor,
            cpus: topo.num_cpus(),
            host_cpus,
            emulated,
            mitigations: if opts.executor == ExecutorKind::Host {
                "host 1:1".into()
            } else {
                opts.mitigations.to_string()
            },
            duration_s: secs,
            metric,
            extra,
            tasks: metrics.len(),
            counters: m.counters_end.since(&m.start.counters),
            sched_ns,
            sched_calls,
            sched_ns_per_call: sched_ns as f64 / sched_calls.max(1) as f64,
            sched_ns_per_cpu: out.sched_ns_per_cpu.clone(),
            task_summary: ts,
            checks: out.checks,
            violations,
        },
        executor: opts.executor,
        thread_policy: thread_policy(opts, host_rt),
        kicks: opts.kicks,
        rt_pull: opts.rt_pull,
        timer_advance: opts.timer_advance,
        busy_balance: opts.busy_balance && opts.executor != ExecutorKind::Host,
        fair_slice_ns: (opts.executor != ExecutorKind::Host)
            .then(|| opts.fair_slice_ns_on(topo.num_cpus())),
        fair_slice_scaling: (opts.executor != ExecutorKind::Host)
            .then_some(opts.fair_slice_scaling),
        tick_ns: (opts.executor != ExecutorKind::Host).then(|| opts.tick_ns_in_force()),
        vms: opts.vms,
        vcpus: opts.vcpus,
        per_vcpu: std::mem::take(&mut rows.rows),
        guest_latency: rows.guest_latency,
        stalled: rows.stalled,
        breakdown,
    };
    if opts.check {
        check_problems(&report)?;
    }
    if opts.require_measurement {
        check_measured(&report, count)?;
    }
    Ok(report)
}

/// The breakdown's rows: every vCPU's stage histograms merged.
fn stage_rows(metrics: &[vmm_machine::vcpu_body::VcpuMetrics]) -> Vec<super::StageRow> {
    let mut all = vmm_machine::vcpu_body::Stages::default();
    for m in metrics {
        all.merge(&m.stages);
    }
    vmm_machine::vcpu_body::STAGES
        .iter()
        .zip(&all.0)
        .map(|(name, h)| super::StageRow {
            stage: name.to_string(),
            count: h.count(),
            p50_ns: h.quantile(0.5),
            p99_ns: h.quantile(0.99),
            mean_ns: h.mean(),
        })
        .collect()
}

/// A run that measured nothing, or whose numbers cannot be measurements,
/// is a failure (exit 1), never a plain result: no progress counted in the
/// window, a metric that is not a finite number, or a scheduler
/// wake-to-run p99 longer than the whole window (a saturated histogram:
/// the vCPUs are too oversubscribed to measure).
pub fn check_measured(r: &BenchReport, count: f64) -> Result<(), BenchError> {
    let run = &r.run;
    let fix = "give a smaller --burst-us, fewer --vms or --vcpus, or a longer --duration";
    let window_ns = run.duration_s * 1e9;
    let what = format!(
        "{} with {} VMs x {} vCPUs over {:.2} s",
        run.workload, r.vms, r.vcpus, run.duration_s
    );
    if run.duration_s <= 0.0 {
        return Err(BenchError::Failed(format!(
            "{what}: the measured window was empty; give a longer --duration"
        )));
    }
    let nothing = match r.guest_latency.count() {
        0 if run.metric.name == "p99_wakeup_latency" => Some("no timer wakeup"),
        _ if run.metric.name != "p99_wakeup_latency" && count <= 0.0 => {
            Some("no guest progress (no message, request or frame completed)")
        }
        _ => None,
    };
    if let Some(n) = nothing {
        return Err(BenchError::Failed(format!(
            "{what} measured nothing: {n} in the window; {fix}"
        )));
    }
    if !run.metric.value.is_finite() || run.metric.value <= 0.0 {
        return Err(BenchError::Failed(format!(
            "{what}: {} came out as {}, which is not a measurement; {fix}",
            run.metric.name, run.metric.value
        )));
    }
    let p99 = run.task_summary.wake_to_run_p99_ns;
    if r.executor != ExecutorKind::Host && p99 as f64 > window_ns {
        return Err(BenchError::Failed(format!(
            "{what}: the scheduler's wake-to-run p99 ({p99} ns) is longer than the \
             measured window, so its histogram saturated and is not a measurement; {fix}"
        )));
    }
    Ok(())
}

/// The executor's options for a run of `nslots` vCPUs.
fn exec_options(
    opts: &BenchOptions,
    topo: Arc<topology::HostTopology>,
    mapping: CpuMapping,
    nslots: usize,
) -> ExecOptions {
    let emulated = mapping.is_emulated();
    let mut eo = ExecOptions::new(topo, mapping);
    eo.kind = opts.executor;
    eo.mitigations = opts.mitigations;
    let [fair_latency_ns, fair_min_granularity_ns] = opts.fair_slice_ns();
    eo.sched = SchedConfig {
        max_tasks: SchedConfig::default().max_tasks.max(nslots),
        fair_latency_ns,
        fair_min_granularity_ns,
        fair_slice_scaling: opts.fair_slice_scaling,
        lazy_fair_kicks: opts.kicks == super::Kicks::Lazy,
        sleeper_credit: opts.sleeper_credit,
        fair_wakeup_preempt: !opts.no_wakeup_preempt,
        slice_follows_load: opts.slices_follow_load,
        busy_balance: opts.busy_balance,
        bounded_rt_pull: opts.rt_pull == super::RtPull::Bounded,
        ..SchedConfig::default()
    };
    eo.check = opts.check.then(CheckConfig::default);
    eo.timer_advance = opts.timer_advance == super::TimerAdvance::On;
    eo.tick = Duration::from_nanos(opts.tick_ns_in_force());
    // RT workloads: the host baseline runs its vCPU threads at SCHED_FIFO,
    // so the executor's threads (workers, or the threads executor's vCPU
    // and idle threads; the clock one above) run at it too; otherwise
    // any host process would preempt our RT vCPUs but not the baseline's.
    // Never on an emulated topology: hundreds of SCHED_FIFO workers on a
    // few host CPUs would starve everything else on the host.
    if opts.host_rt && !emulated && matches!(opts.workload, Workload::Cyclic | Workload::Transcode)
    {
        eo.host_rt = Some(opts.prio.min(98));
    }
    eo
}

/// The host policy the threads that ran the vCPUs had, in words (see
/// `BenchReport::thread_policy`): what was asked for, and whether the
/// host permitted it.
fn thread_policy(opts: &BenchOptions, host_rt: Option<u8>) -> String {
    let asked = match (opts.executor, host_rt) {
        (ExecutorKind::Host, _) => match opts.workload {
            Workload::Cyclic | Workload::Transcode => format!("SCHED_FIFO {}", opts.prio),
            _ => return "SCHED_OTHER".into(),
        },
        (_, Some(p)) => format!("SCHED_FIFO {p}"),
        (_, None) => return "SCHED_OTHER".into(),
    };
    let permitted = std::thread::spawn(|| {
        vcpu_sched::exec::set_current_thread_policy(vcpu_sched::Policy::Fifo(1)).is_ok()
    })
    .join()
    .unwrap_or(false);
    if permitted {
        asked
    } else {
        format!("SCHED_OTHER ({asked} not permitted)")
    }
}

/// Progress counters when the window opened.
#[derive(Default)]
struct WindowStart {
    /// The workload's guest counter.
    guest: u64,
    /// The scheduler's counters.
    counters: vcpu_sched::SchedCounters,
    /// Exits from `KVM_RUN` per vCPU.
    exits: Vec<u64>,
}

/// What [`measure`] saw.
struct Measured {
    start: WindowStart,
    guest_end: u64,
    counters_end: vcpu_sched::SchedCounters,
    exits_end: Vec<u64>,
    /// The checker is on and a VM failed before the end.
    failed_early: bool,
}

/// Lets the set run: a warm-up, then the measured window; with the
/// checker on, waits up to 30 s more for vCPUs that have not run again
/// after their first exit, and stops early when a VM fails.
fn measure(
    opts: &BenchOptions,
    built: &Built,
    running: &Running,
    progress: &mut dyn FnMut(f64),
) -> Measured {
    let set = &built.set;
    let warmup = opts
        .warmup
        .unwrap_or_else(|| (opts.duration / 5).min(Duration::from_secs(1)));
    let total = warmup + opts.duration;
    let t0 = Instant::now();
    let mut opened = None;
    // The window lasts --duration from when it really opened: a measuring
    // thread that wakes late (a loaded host) shifts the window, never
    // shortens it.
    let mut close_at = total;
    let mut failed_early = false;
    loop {
        let el = t0.elapsed();
        if opened.is_none() && el >= warmup {
            set.open_window();
            if let Some(p) = &built.peer {
                p.set_window(true);
            }
            close_at = t0.elapsed() + opts.duration;
            opened = Some(WindowStart {
                guest: guest_count(opts.workload, built, opts.vcpus),
                counters: running.counters().unwrap_or_default(),
                exits: set.progress_snapshot(),
            });
        }
        if opened.is_some() && el >= close_at {
            // With the checker on, a vCPU that has not yet run again after
            // its first exit gets up to 30 s more (a loaded host, a big
            // emulated topology); one that still has not is reported.
            let slow = opts.check
                && el < close_at + Duration::from_secs(30)
                && set.progress_snapshot().iter().any(|&p| p < 2);
            if !slow {
                break;
            }
        }
        if opts.check && !set.failures().is_empty() {
            failed_early = true;
            break;
        }
        progress((el.as_secs_f64() / close_at.as_secs_f64()).min(1.0));
        std::thread::sleep(
            Duration::from_millis(10)
                .min(close_at.saturating_sub(el).max(Duration::from_millis(1))),
        );
    }
    set.close_window();
    if let Some(p) = &built.peer {
        p.set_window(false);
    }
    Measured {
        start: opened.unwrap_or_default(),
        guest_end: guest_count(opts.workload, built, opts.vcpus),
        counters_end: running.counters().unwrap_or_default(),
        exits_end: set.progress_snapshot(),
        failed_early,
    }
}

/// Per-vCPU rows, the merged guest latency, and the vCPUs without
/// progress.
struct Rows {
    rows: Vec<VcpuRow>,
    guest_latency: Histogram,
    stalled: Vec<String>,
}

fn vcpu_rows(
    opts: &BenchOptions,
    set: &VmSet,
    metrics: &[vmm_machine::vcpu_body::VcpuMetrics],
    out: &vmm_machine::vcpu_body::ExecOutcome,
    m: &Measured,
) -> Rows {
    let mut stalled = Vec::new();
    let mut guest_latency = Histogram::new();
    let mut rows = Vec::with_capacity(metrics.len());
    for (i, vm_m) in metrics.iter().enumerate() {
        let s = &set.slots()[i];
        let name = format!("{}/vcpu{}", set.vms()[s.vm].name, s.index);
        // Progress: the vCPU ran, came back to the VMM (halt, sleep,
        // doorbell, kick) and ran again. Per window it would be too strict
        // for short windows on emulated topologies, where one frame of a
        // pinned VM can take longer than the window.
        if !m.failed_early && vm_m.entries < 2 {
            stalled.push(name.clone());
        }
        match opts.workload {
            Workload::Cyclic => guest_latency.merge(&vm_m.timer_latency),
            _ => guest_latency.merge(&vm_m.doorbell_latency),
        }
        let t = out.tasks.get(i).cloned().flatten().unwrap_or_default();
        let hs = out
            .host_schedstat
            .get(i)
            .copied()
            .flatten()
            .unwrap_or_default();
        rows.push(VcpuRow {
            name,
            entries: vm_m.entries,
            window_exits: m
                .exits_end
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(m.start.exits.get(i).copied().unwrap_or(0)),
            blocks: vm_m.blocks,
            sleeps: vm_m.sleeps,
            wakes_sent: vm_m.wakes_sent,
            preempt_kicks: vm_m.preempt_kicks,
            run_delay_ns: t.run_delay_ns,
            wake_to_run_p50_ns: t.wake_to_run.quantile(0.5),
            wake_to_run_p99_ns: t.wake_to_run.quantile(0.99),
            migrations: t.migrations,
            running_ns: t.running_ns,
            queued_ns: t.queued_ns,
            blocked_ns: t.blocked_ns,
            host_run_ns: hs.running_ns,
            host_wait_ns: hs.run_delay_ns,
        });
    }
    Rows {
        rows,
        guest_latency,
        stalled,
    }
}

/// The workload's headline metric and extras, from the guest latency and
/// the guest's progress `count` over `secs` of window.
fn workload_metric(
    w: Workload,
    lat: &Histogram,
    count: f64,
    secs: f64,
) -> (Metric, BTreeMap<String, f64>) {
    let mut extra = BTreeMap::new();
    for (k, q) in [("p50_ns", 0.5), ("p90_ns", 0.9), ("p99_ns", 0.99)] {
        extra.insert(k.to_string(), lat.quantile(q) as f64);
    }
    extra.insert("max_ns".into(), lat.max() as f64);
    extra.insert("wakeups".into(), lat.count() as f64);
    let per_s = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    let metric = match w {
        Workload::Cyclic => {
            extra.insert("ops_per_s".into(), per_s(lat.count() as f64));
            Metric {
                name: "p99_wakeup_latency".into(),
                unit: "ns".into(),
                value: lat.quantile(0.99) as f64,
                higher_is_better: false,
            }
        }
        Workload::Messaging => {
            extra.insert("messages".into(), count);
            extra.insert("messages_per_s".into(), per_s(count));
            Metric {
                name: "time_per_100k_messages".into(),
                unit: "s".into(),
                value: if count > 0.0 {
                    secs * 1e5 / count
                } else {
                    f64::INFINITY
                },
                higher_is_better: false,
            }
        }
        Workload::Runq => {
            extra.insert("requests".into(), count);
            Metric {
                name: "requests_per_s".into(),
                unit: "1/s".into(),
                value: per_s(count),
                higher_is_better: true,
            }
        }
        Workload::Transcode => {
            extra.insert("frames".into(), count);
            Metric {
                name: "frames_per_s".into(),
                unit: "1/s".into(),
                value: per_s(count),
                higher_is_better: true,
            }
        }
        Workload::Pingpong => {
            // a transaction is a round trip: two handoffs (as the thread
            // workload and the simulator count it)
            extra.insert("handoffs".into(), count);
            Metric {
                name: "transactions_per_s".into(),
                unit: "trans/s".into(),
                value: per_s(count / 2.0),
                higher_is_better: true,
            }
        }
        Workload::Net => {
            extra.insert("packets".into(), count);
            Metric {
                name: "packets_per_s".into(),
                unit: "1/s".into(),
                value: per_s(count),
                higher_is_better: true,
            }
        }
        Workload::Blk => {
            extra.insert("requests".into(), count);
            Metric {
                name: "iops".into(),
                unit: "1/s".into(),
                value: per_s(count),
                higher_is_better: true,
            }
        }
    };
    (metric, extra)
}

/// With the checker on: violations, failed VMs and vCPUs without progress
/// fail the run.
fn check_problems(report: &BenchReport) -> Result<(), BenchError> {
    let mut problems = report.run.violations.clone();
    if !report.stalled.is_empty() {
        problems.push(format!(
            "{} vCPUs made no progress (never ran again after their first exit): {}",
            report.stalled.len(),
            report
                .stalled
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(BenchError::Failed(format!(
        "{} problem(s): {}",
        problems.len(),
        problems
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    )))
}
