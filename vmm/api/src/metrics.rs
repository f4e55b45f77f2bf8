//! `GET /metrics`: Prometheus text exposition of the server's VMs.
//!
//! WHAT: per VM, its KVM exits, live vCPUs, boots and state, and its
//! vCPUs' scheduler statistics (run delay, running time, migrations,
//! wakeups, preemptions, a wake-to-run latency histogram; with the host
//! executor run delay and running time only, from the host kernel's
//! schedstat of each vCPU thread); for the one
//! scheduler every VM shares, every [`vcpu_sched::SchedCounters`] field as
//! a `_total` counter (context switches, wake-list vs direct enqueues, RT
//! push/pull, RT overload updates, shared-runqueue pops, steals,
//! group-load writes, ...), migrations by distance
//! (`vmm_sched_migrations_total{distance="l2|llc|node|remote"}`), and its
//! live tasks and task groups, and its on/off settings
//! (`vmm_sched_setting{setting="sleeper_credit"}` 1 or 0); the API's own
//! request counts and latency histogram; with `--metrics-per-vcpu`, KVM
//! exits and run delay per vCPU.
//! WHY: operators scrape VMMs with Prometheus; per-vCPU series are opt-in
//! because a host with hundreds of vCPUs would multiply the series.
//! HOW: a fresh `prometheus-client` registry per scrape, filled from
//! atomics the executors already keep (no lock a vCPU takes), encoded as
//! OpenMetrics text; a scraper that does not ask for OpenMetrics (curl,
//! `promtool check metrics`) gets the classic text format 0.0.4
//! ([`to_classic`]). Names follow Prometheus conventions: base units,
//! `_total` for counters, `_seconds` for times.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use vcpu_sched::exec::HostSchedstat;
use vcpu_sched::TaskStats;

use super::vms::{VmRecord, VmState};

type Labels = Vec<(String, String)>;

/// The API's own series: requests by endpoint and status code, and the
/// time each took. Kept by the HTTP front end, outside the VM table's
/// lock (the families synchronise themselves).
pub struct ApiMetrics {
    latency: Histogram,
    requests: Family<Labels, Counter>,
    /// `accept` failures (EMFILE, ENFILE, ENOMEM...), each followed by a
    /// pause of the accept loop.
    accept_errors: Counter,
    /// Times the accept loop waited for a slot because
    /// [`MAX_CONNECTIONS`] were open.
    ///
    /// [`MAX_CONNECTIONS`]: crate::server::MAX_CONNECTIONS
    at_cap: Counter,
    /// Connections the server holds now.
    open: Gauge,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self {
            latency: Histogram::new(exponential_buckets(5e-6, 4.0, 10)),
            requests: Family::default(),
            accept_errors: Counter::default(),
            at_cap: Counter::default(),
            open: Gauge::default(),
        }
    }
}

impl ApiMetrics {
    /// Counts one answered request.
    pub fn observe(&self, endpoint: String, code: u16, seconds: f64) {
        self.latency.observe(seconds);
        self.requests
            .get_or_create(&vec![
                ("endpoint".into(), endpoint),
                ("code".into(), code.to_string()),
            ])
            .inc();
    }

    /// Counts a failed `accept`.
    pub fn accept_failed(&self) {
        self.accept_errors.inc();
    }

    /// Counts a wait of the accept loop at the connection cap.
    pub fn at_cap(&self) {
        self.at_cap.inc();
    }

    /// The API's own series, into a scrape's registry.
    fn register(&self, reg: &mut Registry) {
        reg.register(
            "api_requests",
            "API requests answered, by endpoint and status code",
            self.requests.clone(),
        );
        reg.register(
            "api_request_duration_seconds",
            "Time to answer an API request",
            self.latency.clone(),
        );
        reg.register(
            "api_accept_errors",
            "Failed accepts of an API connection (each pauses the accept loop)",
            self.accept_errors.clone(),
        );
        reg.register(
            "api_connection_cap_waits",
            "Times the accept loop waited for a free slot at the connection cap",
            self.at_cap.clone(),
        );
        reg.register(
            "api_connections",
            "API connections open now",
            self.open.clone(),
        );
    }

    /// A connection opened (`+1`) or closed (`-1`).
    pub fn connections(&self, delta: i64) {
        self.open.inc_by(delta);
    }
}

/// What a scrape reads.
pub struct Sources<'a> {
    /// The VM table.
    pub vms: &'a BTreeMap<String, VmRecord>,
    /// `--metrics-per-vcpu`.
    pub per_vcpu: bool,
    /// The scheduler every VM shares (none with `--executor host`), and
    /// its periods, ns: the tick and the halt poller's.
    pub sched: Option<(&'a vcpu_sched::Scheduler, [u64; 2])>,
    /// The API's own series.
    pub api: &'a ApiMetrics,
    /// When the server started.
    pub started: Instant,
}

/// Upper bounds (seconds) of the latency histograms: 1 us x 4^k up to
/// about 1 s, then +Inf.
const LATENCY_BOUNDS: [f64; 11] = [
    1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1.024e-3, 4.096e-3, 16.384e-3, 65.536e-3, 262.144e-3,
    1.048576,
];

/// A histogram encoded from a snapshot (the scheduler's HDR histogram of
/// nanoseconds), not from observations.
#[derive(Debug, Default)]
struct SnapshotHistogram(Mutex<Snapshot>);

/// Sum (seconds), count, and (upper bound, count) per bucket.
type Snapshot = (f64, u64, Vec<(f64, u64)>);

impl SnapshotHistogram {
    /// Sets it to `h` (values in ns).
    fn set(&self, h: &vcpu_sched::stats::Histogram) {
        let mut buckets: Vec<(f64, u64)> = LATENCY_BOUNDS.iter().map(|&b| (b, 0)).collect();
        buckets.push((f64::MAX, 0));
        for (v, n) in h.pairs() {
            let secs = v as f64 / 1e9;
            let i = LATENCY_BOUNDS
                .iter()
                .position(|&b| secs <= b)
                .unwrap_or(LATENCY_BOUNDS.len());
            buckets[i].1 += n;
        }
        let count = h.count();
        let sum = h.mean() * count as f64 / 1e9;
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = (sum, count, buckets);
    }
}

impl TypedMetric for SnapshotHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for SnapshotHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        encoder.encode_histogram::<NoLabelSet>(g.0, g.1, &g.2, None)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Per-VM sums of its vCPUs' scheduler statistics.
#[derive(Default)]
struct TaskFamilies {
    run_delay: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
    running: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
    runs: Family<Labels, Counter>,
    migrations: Family<Labels, Counter>,
    wakeups: Family<Labels, Counter>,
    preemptions: Family<Labels, Counter>,
    wake_to_run: Family<Labels, SnapshotHistogram>,
    vcpu_run_delay: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl TaskFamilies {
    /// The host executor's vCPU threads: their run delay, running time
    /// and runs from the host kernel's schedstat, the series vcpu_sched's
    /// own statistics give for the other executors (no wakeup, migration
    /// or wake-to-run series: the kernel's schedstat has no such split).
    fn add_host(&self, l: &Labels, host: &[Option<HostSchedstat>], per_vcpu: bool) {
        if host.iter().all(Option::is_none) {
            return;
        }
        let (mut run, mut delay, mut runs) = (0u64, 0u64, 0u64);
        for (k, h) in host.iter().enumerate() {
            let Some(h) = h else { continue };
            run += h.running_ns;
            delay += h.run_delay_ns;
            runs += h.runs;
            if per_vcpu {
                let mut lk = l.clone();
                lk.push(("vcpu".into(), k.to_string()));
                self.vcpu_run_delay
                    .get_or_create(&lk)
                    .inc_by(h.run_delay_ns as f64 / 1e9);
            }
        }
        self.run_delay.get_or_create(l).inc_by(delay as f64 / 1e9);
        self.running.get_or_create(l).inc_by(run as f64 / 1e9);
        self.runs.get_or_create(l).inc_by(runs);
    }

    fn add(&self, l: &Labels, stats: &[Option<TaskStats>], per_vcpu: bool) {
        let mut h = vcpu_sched::stats::Histogram::new();
        let (mut delay, mut run, mut runs, mut mig, mut wk, mut pre) = (0u64, 0u64, 0, 0, 0, 0);
        for (k, t) in stats.iter().enumerate() {
            let Some(t) = t else { continue };
            delay += t.run_delay_ns;
            run += t.running_ns;
            runs += t.runs;
            mig += t.migrations;
            wk += t.wakeups;
            pre += t.preemptions;
            h.merge(&t.wake_to_run);
            if per_vcpu {
                let mut lk = l.clone();
                lk.push(("vcpu".into(), k.to_string()));
                self.vcpu_run_delay
                    .get_or_create(&lk)
                    .inc_by(t.run_delay_ns as f64 / 1e9);
            }
        }
        if stats.iter().all(Option::is_none) {
            return;
        }
        self.run_delay.get_or_create(l).inc_by(delay as f64 / 1e9);
        self.running.get_or_create(l).inc_by(run as f64 / 1e9);
        self.runs.get_or_create(l).inc_by(runs);
        self.migrations.get_or_create(l).inc_by(mig);
        self.wakeups.get_or_create(l).inc_by(wk);
        self.preemptions.get_or_create(l).inc_by(pre);
        self.wake_to_run.get_or_create(l).set(&h);
    }

    fn register(self, reg: &mut Registry, per_vcpu: bool) {
        reg.register(
            "vm_run_delay_seconds",
            "Time the VM's vCPUs were runnable but not running (this boot)",
            self.run_delay,
        );
        reg.register(
            "vm_running_seconds",
            "Time the VM's vCPUs ran (this boot)",
            self.running,
        );
        reg.register(
            "vm_runs",
            "Times the VM's vCPUs were switched in, after a wakeup or a preemption (this boot)",
            self.runs,
        );
        reg.register(
            "vm_migrations",
            "CPU changes of the VM's vCPUs (this boot)",
            self.migrations,
        );
        reg.register(
            "vm_wakeups",
            "Wakeups of the VM's vCPUs (this boot)",
            self.wakeups,
        );
        reg.register(
            "vm_preemptions",
            "Times the VM's vCPUs were switched out while runnable (this boot)",
            self.preemptions,
        );
        reg.register(
            "vm_wake_to_run_seconds",
            "From a vCPU's wakeup to its running, per wakeup (this boot)",
            self.wake_to_run,
        );
        if per_vcpu {
            reg.register(
                "vcpu_run_delay_seconds",
                "Run delay per vCPU (this boot)",
                self.vcpu_run_delay,
            );
        }
    }
}

fn counter_family() -> Family<Labels, Counter> {
    Family::default()
}

fn gauge_family() -> Family<Labels, Gauge> {
    Family::default()
}

/// The exposition text of `src`.
pub fn render(src: &Sources) -> String {
    let mut reg = Registry::with_prefix("vmm");
    let exits = counter_family();
    let vcpu_exits = counter_family();
    let boots = counter_family();
    let live = gauge_family();
    let vcpus = gauge_family();
    let running = gauge_family();
    let tasks = TaskFamilies::default();
    let by_reason = counter_family();
    for (id, v) in src.vms {
        let l = vec![("vm".to_string(), id.clone())];
        let (st, _) = v.observed_state();
        running
            .get_or_create(&l)
            .set(i64::from(st == VmState::Running));
        vcpus.get_or_create(&l).set(v.config.cpus.boot_vcpus as i64);
        boots.get_or_create(&l).inc_by(v.boots);
        let mut total = v.past_exits;
        let mut nlive = 0;
        if let Some(r) = &v.run {
            let snap = r.set().progress_snapshot();
            total += snap.iter().sum::<u64>();
            nlive = r.set().vms()[0].live();
            if src.per_vcpu {
                for (k, n) in snap.iter().enumerate() {
                    let mut lk = l.clone();
                    lk.push(("vcpu".into(), k.to_string()));
                    vcpu_exits.get_or_create(&lk).inc_by(*n);
                }
            }
            tasks.add(&l, &r.task_stats(), src.per_vcpu);
            tasks.add_host(&l, &r.host_schedstat(), src.per_vcpu);
        }
        exits.get_or_create(&l).inc_by(total);
        for (reason, n) in v.exit_counts.snapshot() {
            let mut lr = l.clone();
            lr.push(("reason".into(), reason.into()));
            by_reason.get_or_create(&lr).inc_by(n);
        }
        live.get_or_create(&l).set(nlive as i64);
    }
    reg.register(
        "vm_kvm_exits",
        "Exits from KVM_RUN of the VM's vCPUs (all boots)",
        exits,
    );
    reg.register(
        "vm_exits",
        "vCPU exits that reached the VMM's exit handling, by reason (all boots)",
        by_reason,
    );
    reg.register("vm_boots", "Times the VM was booted", boots);
    reg.register("vm_vcpus", "vCPUs the VM was created with", vcpus);
    reg.register("vm_live_vcpus", "vCPUs of the VM still running", live);
    reg.register(
        "vm_running",
        "1 if the VM is booted and its guest has not ended",
        running,
    );
    if src.per_vcpu {
        reg.register(
            "vcpu_kvm_exits",
            "Exits from KVM_RUN per vCPU (this boot)",
            vcpu_exits,
        );
    }
    tasks.register(&mut reg, src.per_vcpu);
    if let Some((sched, periods)) = src.sched {
        register_scheduler(&mut reg, sched, periods);
    }
    src.api.register(&mut reg);
    let up = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    up.set(src.started.elapsed().as_secs_f64());
    reg.register("uptime_seconds", "Seconds since the server started", up);
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        out = "# EOF\n".into();
    }
    out
}

/// The shared scheduler's counters (since the server started), its live
/// tasks and its task groups.
fn register_scheduler(reg: &mut Registry, sched: &vcpu_sched::Scheduler, periods: [u64; 2]) {
    let migrations = counter_family();
    for (name, n) in sched.counters().fields() {
        if let Some(d) = name.strip_prefix("migrations_") {
            migrations
                .get_or_create(&vec![("distance".to_string(), d.to_string())])
                .inc_by(n);
            continue;
        }
        let c = Counter::<u64>::default();
        c.inc_by(n);
        reg.register(
            format!("sched_{name}"),
            format!("vcpu_sched counter {name} of the scheduler every VM shares"),
            c,
        );
    }
    reg.register(
        "sched_migrations",
        "vCPU task migrations by distance: between CPUs sharing an L2 (l2), an LLC (llc), \
         a NUMA node (node), or across nodes (remote)",
        migrations,
    );
    let tasks = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    tasks.set(sched.live_tasks().len() as i64);
    reg.register(
        "sched_tasks",
        "vCPU tasks in the shared scheduler, over every VM",
        tasks,
    );
    let settings = gauge_family();
    let c = sched.config();
    for (name, on) in [
        ("busy_balance", c.busy_balance),
        ("sleeper_credit", c.sleeper_credit),
        ("wakeup_preempt", c.fair_wakeup_preempt),
        ("lazy_fair_kicks", c.lazy_fair_kicks),
        ("slice_follows_load", c.slice_follows_load),
        ("bounded_rt_pull", c.bounded_rt_pull),
    ] {
        settings
            .get_or_create(&vec![("setting".to_string(), name.to_string())])
            .set(i64::from(on));
    }
    reg.register(
        "sched_setting",
        "The shared scheduler's on/off settings (1 on, 0 off), named as vmm serve's flags \
         (busy_balance, sleeper_credit, wakeup_preempt) or SchedConfig (the others) name them",
        settings,
    );
    let slices = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let fair = sched.fair_bounds();
    for (bound, ns) in [
        ("latency", fair.latency_ns),
        ("min_granularity", fair.min_granularity_ns),
        ("wakeup_granularity", fair.wakeup_granularity_ns),
    ] {
        slices
            .get_or_create(&vec![("bound".to_string(), bound.to_string())])
            .set(ns as f64 / 1e9);
    }
    reg.register(
        "sched_fair_slice_seconds",
        "The shared scheduler's fair bounds in force: the period slices are cut from \
         (latency), the shortest slice (min_granularity) and how far behind a woken vCPU must \
         be to preempt (wakeup_granularity); vmm serve's --fair-latency-us and \
         --fair-min-granularity-us (and 1 ms) times --fair-slice-scaling's factor",
        slices,
    );
    let [tick_ns, halt_poll_ns] = periods;
    let tick = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    tick.set(tick_ns as f64 / 1e9);
    reg.register(
        "sched_tick_seconds",
        "The shared scheduler's tick period (vmm serve's --tick-us): how often each CPU's \
         slice end, deferred wakeups and balances are looked at",
        tick,
    );
    let poll = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    poll.set(halt_poll_ns as f64 / 1e9);
    reg.register(
        "halt_poll_seconds",
        "The halt poller's period (vmm serve's --halt-poll-us): how often the vCPUs of Linux \
         VMs asleep in the scheduler are probed for an interrupt (an IPI) and those halted \
         inside KVM_RUN are kicked out",
        poll,
    );
    let groups = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    // the root group is always there
    groups.set(sched.groups().len().saturating_sub(1) as i64);
    reg.register(
        "sched_groups",
        "Task groups (one per booted VM) in the shared scheduler",
        groups,
    );
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
