//! `GET /metrics`: Prometheus text exposition of the server's VMs.
//!
//! WHAT: per VM, its KVM exits, live vCPUs, boots and state; per VM's
//! scheduler, every [`vcpu_sched::SchedCounters`] field as a `_total`
//! counter (context switches, wake-list vs direct enqueues, RT push/pull,
//! shared-runqueue pops, steals, group-load writes, ...); the API's own
//! request counts and latency histogram; with `--metrics-per-vcpu`, KVM
//! exits per vCPU.
//! WHY: operators scrape VMMs with Prometheus; per-vCPU series are opt-in
//! because a host with hundreds of vCPUs would multiply the series.
//! HOW: a fresh `prometheus-client` registry per scrape, filled from
//! atomics the executors already keep (no lock a vCPU takes), encoded as
//! OpenMetrics text; a scraper that does not ask for OpenMetrics (curl,
//! `promtool check metrics`) gets the classic text format 0.0.4
//! ([`to_classic`]). Names follow Prometheus conventions: base units,
//! `_total` for counters, `_seconds` for times.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::State;

type Labels = Vec<(String, String)>;

fn counter_family() -> Family<Labels, Counter> {
    Family::default()
}

fn gauge_family() -> Family<Labels, Gauge> {
    Family::default()
}

/// The exposition text of `state`.
pub fn render(state: &State) -> String {
    let mut reg = Registry::with_prefix("vmm");
    let exits = counter_family();
    let vcpu_exits = counter_family();
    let boots = counter_family();
    let live = gauge_family();
    let vcpus = gauge_family();
    let running = gauge_family();
    let mut sched: Vec<(&'static str, Family<Labels, Counter>)> = Vec::new();
    for (id, v) in &state.vms {
        let l = vec![("vm".to_string(), id.clone())];
        let (st, _) = v.observed_state();
        running
            .get_or_create(&l)
            .set(i64::from(st == super::VmState::Running));
        vcpus.get_or_create(&l).set(v.config.cpus.boot_vcpus as i64);
        boots.get_or_create(&l).inc_by(v.boots);
        let mut total = v.past_exits;
        let mut nlive = 0;
        if let Some(r) = &v.run {
            let snap = r.set().progress_snapshot();
            total += snap.iter().sum::<u64>();
            nlive = r.set().vms()[0].live();
            if state.opts.per_vcpu_metrics {
                for (k, n) in snap.iter().enumerate() {
                    let mut lk = l.clone();
                    lk.push(("vcpu".into(), k.to_string()));
                    vcpu_exits.get_or_create(&lk).inc_by(*n);
                }
            }
            if let Some(c) = r.counters() {
                for (name, n) in c.fields() {
                    let fam = match sched.iter().position(|(k, _)| *k == name) {
                        Some(i) => &sched[i].1,
                        None => {
                            sched.push((name, counter_family()));
                            &sched[sched.len() - 1].1
                        }
                    };
                    fam.get_or_create(&l).inc_by(n);
                }
            }
        }
        exits.get_or_create(&l).inc_by(total);
        live.get_or_create(&l).set(nlive as i64);
    }
    reg.register(
        "vm_kvm_exits",
        "Exits from KVM_RUN of the VM's vCPUs (all boots)",
        exits,
    );
    reg.register("vm_boots", "Times the VM was booted", boots);
    reg.register("vm_vcpus", "vCPUs the VM was created with", vcpus);
    reg.register("vm_live_vcpus", "vCPUs of the VM still running", live);
    reg.register(
        "vm_running",
        "1 if the VM is booted and its guest has not ended",
        running,
    );
    if state.opts.per_vcpu_metrics {
        reg.register(
            "vcpu_kvm_exits",
            "Exits from KVM_RUN per vCPU (this boot)",
            vcpu_exits,
        );
    }
    for (name, fam) in sched {
        reg.register(
            format!("sched_{name}"),
            format!("vcpu_sched counter {name} of the VM's scheduler (this boot)"),
            fam,
        );
    }
    reg.register(
        "api_requests",
        "API requests answered, by endpoint and status code",
        state.api_requests.clone(),
    );
    reg.register(
        "api_request_duration_seconds",
        "Time to answer an API request",
        state.api_latency.clone(),
    );
    let up = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    up.set(state.started.elapsed().as_secs_f64());
    reg.register("uptime_seconds", "Seconds since the server started", up);
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        out = "# EOF\n".into();
    }
    out
}

/// OpenMetrics text as the classic Prometheus text format (0.0.4): a
/// counter family's `# HELP`/`# TYPE` lines name the `_total` sample, and
/// the `# EOF` and `# UNIT` lines go.
pub fn to_classic(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{p}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn classic_names_the_total_sample() {
        let open = "# HELP a_b Things.\n# TYPE a_b counter\na_b_total{vm=\"x\"} 3\n# HELP g G.\n# TYPE g gauge\ng 1\n# EOF\n";
        let c = super::to_classic(open);
        assert_eq!(
            c,
            "# HELP a_b_total Things.\n# TYPE a_b_total counter\na_b_total{vm=\"x\"} 3\n# HELP g G.\n# TYPE g gauge\ng 1\n"
        );
    }
}
