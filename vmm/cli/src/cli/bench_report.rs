//! The text report of one `vmm bench` run ([`render_report`]): the
//! metric and its extras, the latency breakdown, the executor's threads,
//! and with `--per-vcpu` a row per vCPU.

use std::fmt::Write as _;

use vmm_lab::{BenchReport, VcpuRow};
use vmm_machine::vcpu_body::ExecutorKind;

/// The summary of one run: metric, extras, per-vCPU aggregates and the
/// scheduler's per-CPU overhead.
pub fn render_report(r: &BenchReport, per_vcpu: bool) -> String {
    let run = &r.run;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} on {} ({} CPUs{}), {} VMs x {} vCPUs, executor {}, mitigations {}: {} = {:.3} {} over {:.2} s",
        run.workload,
        run.topology,
        run.cpus,
        if run.emulated {
            format!(" emulated on {} host CPUs", run.host_cpus)
        } else {
            String::new()
        },
        r.vms,
        r.vcpus,
        r.executor,
        run.mitigations,
        run.metric.name,
        run.metric.value,
        run.metric.unit,
        run.duration_s
    );
    let extras: Vec<String> = run
        .extra
        .iter()
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect();
    let _ = writeln!(s, "  {}", extras.join(", "));
    let n = r.per_vcpu.len().max(1) as f64;
    let sum = |f: fn(&VcpuRow) -> u64| r.per_vcpu.iter().map(f).sum::<u64>();
    let ts = &run.task_summary;
    let _ = writeln!(
        s,
        "  per vCPU (mean): {:.0} KVM_RUN entries, {:.0} halts, {:.0} sleeps, {:.0} doorbells, {:.1} preemption kicks, run delay {:.2} ms, {:.1} migrations",
        sum(|v| v.entries) as f64 / n,
        sum(|v| v.blocks) as f64 / n,
        sum(|v| v.sleeps) as f64 / n,
        sum(|v| v.wakes_sent) as f64 / n,
        sum(|v| v.preempt_kicks) as f64 / n,
        ts.run_delay_per_task_ns / 1e6,
        ts.migrations as f64 / n,
    );
    render_threads(&mut s, r);
    if !r.stalled.is_empty() {
        let _ = writeln!(s, "  vCPUs without progress: {}", r.stalled.len());
    }
    if per_vcpu {
        render_per_vcpu(&mut s, r);
    }
    render_breakdown(&mut s, r);
    s
}

/// The wakeup breakdown (`--breakdown`), one line per stage.
fn render_breakdown(s: &mut String, r: &BenchReport) {
    if r.breakdown.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "  wakeup breakdown (CLOCK_MONOTONIC, us)  {:>9} {:>9} {:>9} {:>9}",
        "count", "p50", "p99", "mean"
    );
    for row in &r.breakdown {
        if row.count == 0 {
            let _ = writeln!(
                s,
                "    {:<36} {:>9} {:>9} {:>9} {:>9}",
                row.stage, 0, "-", "-", "-"
            );
            continue;
        }
        let _ = writeln!(
            s,
            "    {:<36} {:>9} {:>9.1} {:>9.1} {:>9.1}",
            row.stage,
            row.count,
            row.p50_ns as f64 / 1e3,
            row.p99_ns as f64 / 1e3,
            row.mean_ns / 1e3
        );
    }
}

/// Where the vCPUs' threads (host executor) or the scheduler spent time.
fn render_threads(s: &mut String, r: &BenchReport) {
    let run = &r.run;
    let ts = &run.task_summary;
    let n = r.per_vcpu.len().max(1) as f64;
    let sum = |f: fn(&VcpuRow) -> u64| r.per_vcpu.iter().map(f).sum::<u64>();
    if r.executor == ExecutorKind::Host {
        let _ = writeln!(
            *s,
            "  host threads: {:.1} ms on CPU, {:.1} ms waiting on a host run queue (mean per vCPU)",
            sum(|v| v.host_run_ns) as f64 / n / 1e6,
            sum(|v| v.host_wait_ns) as f64 / n / 1e6
        );
    } else {
        let _ = writeln!(
            *s,
            "  scheduler: wake-to-run p50 {} ns p99 {} ns; time running {:.0} ms, queued {:.0} ms, blocked {:.0} ms (all vCPUs); {} schedule calls, {:.0} ns each",
            ts.wake_to_run_p50_ns,
            ts.wake_to_run_p99_ns,
            ts.running_ns as f64 / 1e6,
            ts.queued_ns as f64 / 1e6,
            ts.blocked_ns as f64 / 1e6,
            run.sched_calls,
            run.sched_ns_per_call
        );
        let per_cpu: Vec<String> = run
            .sched_ns_per_cpu
            .iter()
            .map(|ns| format!("{:.1}", *ns as f64 / 1e6))
            .collect();
        let shown = per_cpu.len().min(16);
        let _ = writeln!(
            *s,
            "  scheduler overhead per CPU (ms in schedule, whole run): {}{}",
            per_cpu[..shown].join(" "),
            if per_cpu.len() > shown {
                format!(" ... ({} CPUs)", per_cpu.len())
            } else {
                String::new()
            }
        );
        let c: Vec<String> = run
            .counters
            .fields()
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(*s, "  counters (window): {}", c.join(", "));
    }
}

/// One line per vCPU.
fn render_per_vcpu(s: &mut String, r: &BenchReport) {
    let _ = writeln!(
        *s,
        "  {:<14} {:>8} {:>7} {:>11} {:>11} {:>11} {:>6} {:>10} {:>10} {:>10}",
        "vcpu",
        "entries",
        "halts",
        "delay_us",
        "w2r_p50_ns",
        "w2r_p99_ns",
        "migr",
        "run_ms",
        "queue_ms",
        "block_ms"
    );
    for v in &r.per_vcpu {
        let _ = writeln!(
            *s,
            "  {:<14} {:>8} {:>7} {:>11.1} {:>11} {:>11} {:>6} {:>10.1} {:>10.1} {:>10.1}",
            v.name,
            v.entries,
            v.blocks,
            v.run_delay_ns as f64 / 1e3,
            v.wake_to_run_p50_ns,
            v.wake_to_run_p99_ns,
            v.migrations,
            v.running_ns as f64 / 1e6,
            v.queued_ns as f64 / 1e6,
            v.blocked_ns as f64 / 1e6
        );
    }
}
