//! `vmm serve`: a Cloud Hypervisor-compatible REST API over a Unix socket.
//!
//! WHAT: a long-running server (tokio, hyper HTTP/1.1 on a
//! `UnixListener`) that creates, boots, inspects, shuts down and deletes
//! many VMs while others run, speaks CH's paths, verbs, field names and
//! status codes under `/api/v1/`, and serves Prometheus text at
//! `/metrics` ([`metrics`]). Request bodies are in [`api`].
//!
//! Several VMs on CH's one-VM API: the CH paths (`/api/v1/vm.boot`) act on
//! the VM named `default`; `/api/v1/vms/{id}/vm.boot` acts on VM `{id}`
//! (ids: 1-64 of `[A-Za-z0-9_-]`), and `GET /api/v1/vms` lists them.
//!
//! WHY: operators (and Kata's clh driver) drive VMMs through this API; one
//! process for many VMs is what a shared scheduler needs.
//!
//! HOW: one `Mutex<State>` holds the VM table and the planner's free map;
//! a handler takes it only to read or flip a record, never across an
//! executor start or stop, which run on tokio's blocking pool. The server
//! owns one [`VcpuPool`]: one `vcpu_sched` scheduler over the server's
//! topology and mitigations, with its workers and clock, started with the
//! server. Each booted VM is a [`VmSet`] attached to that pool (its vCPUs
//! become tasks, the VM a task group) and detached at shutdown, while the
//! other VMs run on: every VM shares the one scheduler and its fixes.
//! `--executor host` runs each VM on plain 1:1 threads instead (the
//! baseline, no `vcpu_sched`).

pub mod api;
pub mod metrics;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use topology::{GuestTopology, HostTopology};
use vcpu_sched::exec::CpuMapping;
use vcpu_sched::{CpuMask, Mitigations, Policy};

use api::{ApiError, VmConfig, VmResize};
use vcpu_sched::placement::pack::{FreeMap, Relax, VmPlan};
use vmm_machine::micro::asm::GuestAsm;
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu::VcpuExit;
use vmm_machine::vcpu_body::VcpuPool;
use vmm_machine::vcpu_body::{
    ExecOptions, ExecutorKind, ExitMapper, GuestVm, Placement, Running, VmSet,
};

/// Exit reasons counted per VM (`vmm_vm_exits_total{reason}`).
pub const EXIT_REASONS: [&str; 9] = [
    "halt",
    "io",
    "kicked",
    "reset",
    "power_off",
    "shutdown",
    "internal_error",
    "fail_entry",
    "other",
];

/// A VM's vCPU exits by reason ([`EXIT_REASONS`] order), over all its
/// boots.
#[derive(Debug, Default)]
pub struct ExitCounts([AtomicU64; 9]);

impl ExitCounts {
    /// (reason, count) pairs.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        EXIT_REASONS
            .iter()
            .zip(&self.0)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Counts each exit by reason on its way to the VM's own mapping: exits
/// that reach the executor (a port write a device handles inside the
/// vCPU's run loop does not).
struct CountingMapper {
    inner: Arc<dyn ExitMapper>,
    counts: Arc<ExitCounts>,
}

impl ExitMapper for CountingMapper {
    fn io(&self) -> &dyn vmm_machine::vcpu::PortIo {
        self.inner.io()
    }
    fn map_exit(
        &self,
        vcpu: &vmm_machine::vcpu::Vcpu,
        exit: VcpuExit,
    ) -> vmm_machine::vcpu_body::Action {
        let i = match &exit {
            VcpuExit::Halt => 0,
            VcpuExit::Io { .. } => 1,
            VcpuExit::Kicked => 2,
            VcpuExit::Reset => 3,
            VcpuExit::PowerOff => 4,
            VcpuExit::Shutdown => 5,
            VcpuExit::InternalError { .. } => 6,
            VcpuExit::FailEntry { .. } => 7,
            VcpuExit::Unexpected(_) => 8,
        };
        self.counts.0[i].fetch_add(1, Ordering::Relaxed);
        self.inner.map_exit(vcpu, exit)
    }
    fn on_kicked(&self, vcpu: &vmm_machine::vcpu::Vcpu) -> Option<vmm_machine::vcpu_body::Action> {
        self.counts.0[2].fetch_add(1, Ordering::Relaxed);
        self.inner.on_kicked(vcpu)
    }
    fn before_entry(&self, vcpu: &vmm_machine::vcpu::Vcpu) {
        self.inner.before_entry(vcpu)
    }
}

/// The largest request body.
const MAX_BODY: usize = 1 << 20;
/// How long a VM's vCPUs get to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The VM the CH paths act on.
pub const DEFAULT_VM: &str = "default";

/// Every route: (method, path under `/api/v1/` or absolute). The OpenAPI
/// document (docs/api.yaml) is checked against this table by a test.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v1/vmm.ping"),
    ("PUT", "/api/v1/vmm.shutdown"),
    ("PUT", "/api/v1/vm.create"),
    ("PUT", "/api/v1/vm.boot"),
    ("GET", "/api/v1/vm.info"),
    ("GET", "/api/v1/vm.counters"),
    ("PUT", "/api/v1/vm.pause"),
    ("PUT", "/api/v1/vm.resume"),
    ("PUT", "/api/v1/vm.shutdown"),
    ("PUT", "/api/v1/vm.reboot"),
    ("PUT", "/api/v1/vm.delete"),
    ("PUT", "/api/v1/vm.resize"),
    ("GET", "/api/v1/vms"),
    ("GET", "/metrics"),
];

/// How the server runs VMs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The socket path.
    pub socket: PathBuf,
    /// The topology spec the scheduler manages (`host`, a preset, ...).
    pub topology: String,
    /// The fixes.
    pub mitigations: Mitigations,
    /// Which executor runs each VM.
    pub executor: ExecutorKind,
    /// Per-vCPU metric series.
    pub per_vcpu_metrics: bool,
}

/// A VM's lifecycle state, as CH names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// Created, not booted.
    Created,
    /// Booted.
    Running,
    /// Booted, its vCPUs held off every CPU (vm.pause).
    Paused,
    /// Shut down (by the API, or the guest ended or failed).
    Shutdown,
}

impl VmState {
    fn name(self) -> &'static str {
        match self {
            VmState::Created => "Created",
            VmState::Running => "Running",
            VmState::Paused => "Paused",
            VmState::Shutdown => "Shutdown",
        }
    }
}

/// One VM of the server.
pub struct VmRecord {
    config: VmConfig,
    shape: String,
    plan: Option<VmPlan>,
    state: VmState,
    run: Option<Arc<Running>>,
    /// Set while a boot, shutdown or delete is in flight.
    busy: bool,
    boots: u64,
    /// Counters of earlier boots, kept so that `_total` series never drop.
    past_exits: u64,
    last_stop: Option<String>,
    /// Exits by reason, all boots.
    exit_counts: Arc<ExitCounts>,
}

impl VmRecord {
    /// Refreshes a Running VM whose guest ended or failed to `Shutdown`
    /// state (the executor keeps running until the API stops it).
    fn observed_state(&self) -> (VmState, Option<String>) {
        if let (VmState::Running | VmState::Paused, Some(r)) = (self.state, &self.run) {
            let e = &r.set().vms()[0];
            if let Some(f) = e.failure() {
                return (VmState::Shutdown, Some(f.to_string()));
            }
            if e.finished_at().is_some() {
                return (VmState::Shutdown, Some("every vCPU ended".into()));
            }
        }
        (self.state, self.last_stop.clone())
    }
}

/// Everything the handlers share.
pub struct State {
    opts: ServeOptions,
    topo: Arc<HostTopology>,
    mapping: CpuMapping,
    /// The scheduler every VM shares (`None` with `--executor host`).
    pool: Option<Arc<VcpuPool>>,
    micro: MicroHost,
    vms: BTreeMap<String, VmRecord>,
    free: FreeMap,
    started: Instant,
    shutdown: Arc<tokio::sync::Notify>,
    api_latency: prometheus_client::metrics::histogram::Histogram,
    api_requests: prometheus_client::metrics::family::Family<
        Vec<(String, String)>,
        prometheus_client::metrics::counter::Counter,
    >,
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The topology.
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    /// The scheduler's CPU mapping.
    #[error(transparent)]
    Sched(#[from] vcpu_sched::SchedError),
    /// KVM.
    #[error(transparent)]
    Micro(#[from] vmm_machine::micro::MicroError),
    /// The shared scheduler and its workers.
    #[error("starting the shared scheduler: {0}")]
    Executor(#[from] vmm_machine::vcpu_body::TaskError),
    /// An executor the server cannot share.
    #[error("{0}")]
    Input(String),
    /// The socket.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

impl State {
    /// Opens KVM and loads the topology.
    pub fn new(opts: ServeOptions) -> Result<Self, ServeError> {
        vmm_machine::vcpu::install_kick_signal().map_err(vmm_machine::micro::MicroError::from)?;
        let topo = Arc::new(topology::load(&opts.topology)?);
        let mapping = CpuMapping::for_spec(&opts.topology)?;
        let micro = MicroHost::open()?;
        let pool = match opts.executor {
            ExecutorKind::Workers => {
                let mut eo = ExecOptions::new(topo.clone(), mapping.clone());
                eo.mitigations = opts.mitigations;
                Some(Arc::new(VcpuPool::start(&eo)?))
            }
            ExecutorKind::Host => None,
            ExecutorKind::Threads => {
                return Err(ServeError::Input(
                    "executor threads: vmm serve runs every VM on one shared scheduler, which                      the threads executor cannot take VMs into while it runs; use workers (the                      default) or host (1:1 threads, no vcpu_sched)"
                        .into(),
                ))
            }
        };
        Ok(Self {
            free: FreeMap::new(&topo),
            topo,
            mapping,
            pool,
            micro,
            vms: BTreeMap::new(),
            started: Instant::now(),
            shutdown: Arc::new(tokio::sync::Notify::new()),
            api_latency: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(5e-6, 4.0, 10),
            ),
            api_requests: Default::default(),
            opts,
        })
    }
}

fn json_response(status: u16, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn empty(status: u16) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::NO_CONTENT);
    r
}

fn error_response(e: &ApiError) -> Response<Full<Bytes>> {
    json_response(e.status, &serde_json::to_value(e).unwrap_or_default())
}

type Reply = Result<Response<Full<Bytes>>, ApiError>;

/// Splits a path into (VM id, endpoint). `None`: not an API path.
fn route(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/api/v1/")?;
    if let Some(r) = rest.strip_prefix("vms/") {
        let (id, ep) = r.split_once('/')?;
        return Some((id.to_string(), ep.to_string()));
    }
    Some((DEFAULT_VM.to_string(), rest.to_string()))
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

async fn body_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, ApiError> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            ApiError::status(413, format!("request body: {e} (at most {MAX_BODY} bytes)"))
        })?
        .to_bytes();
    parse_body(&bytes)
}

/// A request body as `T` (JSON), or a 400 naming the field at fault.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::from_json(&e))
}

/// Answers one request. Never panics on input; every failure is a JSON
/// error body.
pub async fn handle(
    state: Shared,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let reply = dispatch(&state, req).await;
    let resp = match reply {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(%method, %path, status = e.status, error = %e.error, "api error");
            error_response(&e)
        }
    };
    let s = lock(&state);
    s.api_latency.observe(t0.elapsed().as_secs_f64());
    let ep = if ROUTES.iter().any(|(_, p)| *p == path) || path.starts_with("/api/v1/vms/") {
        route(&path).map(|(_, e)| e).unwrap_or_else(|| path.clone())
    } else {
        "other".into()
    };
    s.api_requests
        .get_or_create(&vec![
            ("endpoint".into(), ep),
            ("code".into(), resp.status().as_u16().to_string()),
        ])
        .inc();
    Ok(resp)
}

async fn dispatch(state: &Shared, req: Request<Incoming>) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if path == "/metrics" {
        if method != Method::GET {
            return Err(ApiError::status(405, "GET /metrics"));
        }
        let open = req
            .headers()
            .get("accept")
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("application/openmetrics-text"));
        let text = metrics::render(&lock(state));
        let (text, ctype) = if open {
            (
                text,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        } else {
            (
                metrics::to_classic(&text),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        };
        let mut r = Response::new(Full::new(Bytes::from(text)));
        r.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static(ctype),
        );
        return Ok(r);
    }
    if path == "/api/v1/vms" {
        if method != Method::GET {
            return Err(ApiError::status(405, "GET /api/v1/vms"));
        }
        let s = lock(state);
        let list: Vec<serde_json::Value> = s
            .vms
            .iter()
            .map(|(id, v)| serde_json::json!({"id": id, "state": v.observed_state().0.name()}))
            .collect();
        return Ok(json_response(200, &serde_json::Value::Array(list)));
    }
    let Some((id, ep)) = route(&path) else {
        return Err(ApiError::status(404, format!("no such endpoint: {path}")));
    };
    if !valid_id(&id) {
        return Err(ApiError::bad(
            "id",
            format!("{id:?} is not a VM id (1-64 of A-Z a-z 0-9 - _)"),
        ));
    }
    let want = |m: Method| -> Result<(), ApiError> {
        if method == m {
            Ok(())
        } else {
            Err(ApiError::status(
                405,
                format!("{ep} takes {m}, not {method}"),
            ))
        }
    };
    match ep.as_str() {
        "vmm.ping" if path == "/api/v1/vmm.ping" => {
            want(Method::GET)?;
            Ok(json_response(
                200,
                &serde_json::json!({
                    "build_version": env!("CARGO_PKG_VERSION"),
                    "version": env!("CARGO_PKG_VERSION"),
                    "pid": std::process::id(),
                    "features": ["x_vmm"],
                }),
            ))
        }
        "vmm.shutdown" if path == "/api/v1/vmm.shutdown" => {
            want(Method::PUT)?;
            lock(state).shutdown.notify_one();
            Ok(empty(204))
        }
        "vm.create" => {
            want(Method::PUT)?;
            let cfg: VmConfig = body_json(req).await?;
            create(state, &id, cfg)
        }
        "vm.boot" => {
            want(Method::PUT)?;
            boot(state, &id).await
        }
        "vm.info" => {
            want(Method::GET)?;
            info(state, &id)
        }
        "vm.counters" => {
            want(Method::GET)?;
            counters(state, &id)
        }
        "vm.pause" | "vm.resume" => {
            want(Method::PUT)?;
            pause_resume(state, &id, ep == "vm.pause")
        }
        "vm.resize" => {
            want(Method::PUT)?;
            let r: VmResize = body_json(req).await?;
            let s = lock(state);
            let v = s.vms.get(&id).ok_or_else(|| not_created(&id))?;
            let field = if r.desired_vcpus.is_some() {
                "desired_vcpus"
            } else if r.desired_ram.is_some() {
                "desired_ram"
            } else {
                "desired_balloon"
            };
            if r.desired_vcpus == Some(v.config.cpus.boot_vcpus)
                && r.desired_ram.is_none()
                && r.desired_balloon.is_none()
            {
                return Ok(empty(204));
            }
            Err(ApiError::bad(
                field,
                "resizing is not supported: the shared scheduler takes vCPUs in and out, but a booted guest cannot gain or lose vCPUs without ACPI CPU and memory hotplug, which this VMM does not implement; vm.delete and vm.create the VM with the size it needs",
            ))
        }
        "vm.shutdown" => {
            want(Method::PUT)?;
            shutdown_vm(state, &id, false).await
        }
        "vm.reboot" => {
            want(Method::PUT)?;
            shutdown_vm(state, &id, false).await?;
            boot(state, &id).await
        }
        "vm.delete" => {
            want(Method::PUT)?;
            shutdown_vm(state, &id, true).await
        }
        _ => Err(ApiError::status(404, format!("no such endpoint: {path}"))),
    }
}

/// vm.pause (Running -> Paused) and vm.resume (Paused -> Running).
fn pause_resume(state: &Shared, id: &str, pause: bool) -> Reply {
    let mut s = lock(state);
    let v = s.vms.get_mut(id).ok_or_else(|| not_created(id))?;
    if v.busy {
        return Err(ApiError::status(
            409,
            format!("VM {id} is busy with another request"),
        ));
    }
    let (now, _) = v.observed_state();
    let (from, to) = if pause {
        (VmState::Running, VmState::Paused)
    } else {
        (VmState::Paused, VmState::Running)
    };
    let Some(r) = v.run.as_ref().filter(|_| now == from) else {
        return Err(ApiError::status(
            405,
            format!(
                "VM {id} is {}; vm.{} needs a {} VM",
                now.name(),
                if pause { "pause" } else { "resume" },
                from.name()
            ),
        ));
    };
    if pause {
        r.pause(0);
    } else {
        r.resume(0);
    }
    v.state = to;
    Ok(empty(204))
}

fn not_created(id: &str) -> ApiError {
    ApiError::status(404, format!("VM {id} is not created"))
}

fn create(state: &Shared, id: &str, cfg: VmConfig) -> Reply {
    let mut s = lock(state);
    if s.vms.contains_key(id) {
        return Err(ApiError::status(
            409,
            format!("VM {id} already exists; vm.delete it first"),
        ));
    }
    // Guest RAM is committed per created VM: all of it together must fit
    // in the host's RAM, or the last VM to boot would take the host down.
    if let Some(total) = vmm_machine::memory::host_mem_total() {
        let others: u64 = s.vms.values().map(|v| v.config.memory_bytes()).sum();
        let want = cfg.memory_bytes();
        if others.saturating_add(want) > total {
            return Err(ApiError::bad(
                "memory.size",
                format!(
                    "{want} bytes more than the {others} bytes the server's {} VMs already \
                     hold is beyond this host's {total} bytes of RAM; give less, or vm.delete \
                     a VM first",
                    s.vms.len()
                ),
            ));
        }
    }
    let topo = s.topo.clone();
    let (shape, plan) = admit(&cfg, id, &topo, &mut s.free)?;
    tracing::info!(vm = id, shape, "created");
    s.vms.insert(
        id.to_string(),
        VmRecord {
            config: cfg,
            shape,
            plan,
            state: VmState::Created,
            run: None,
            busy: false,
            boots: 0,
            past_exits: 0,
            last_stop: None,
            exit_counts: Arc::default(),
        },
    );
    Ok(empty(204))
}

/// What `vm.create` decides from a request alone (no KVM, no I/O): the
/// guest shape, and its placement on `topo` (the given `cpus.affinity`,
/// or the planner's on the CPUs `free` has left, which it takes). An
/// error names the field at fault. The `api_body` fuzz target drives it.
pub fn admit(
    cfg: &VmConfig,
    id: &str,
    topo: &HostTopology,
    free: &mut FreeMap,
) -> Result<(String, Option<VmPlan>), ApiError> {
    let shape = cfg.guest_shape()?;
    let guest = GuestTopology::from_spec(&shape)
        .map_err(|e| ApiError::bad("cpus.topology", e.to_string()))?;
    let x = cfg.x_vmm.clone().unwrap_or_default();
    let placement = x.placement.clone();
    let policy = placement.as_ref().map_or("pinned", |p| p.policy.as_str());
    let relax = placement.as_ref().map_or(Relax::default(), |p| p.relax);
    let plan = if let Some(aff) = &cfg.cpus.affinity {
        let n = cfg.cpus.boot_vcpus;
        let mut dense = vec![u32::MAX; n as usize];
        let mut os = vec![u32::MAX; n as usize];
        for a in aff {
            if a.vcpu >= n {
                return Err(ApiError::bad(
                    "cpus.affinity",
                    format!("vcpu {} but the VM has {n} vCPUs", a.vcpu),
                ));
            }
            let [c] = a.host_cpus[..] else {
                return Err(ApiError::bad(
                    "cpus.affinity",
                    format!(
                        "vcpu {}: give exactly one host CPU per vCPU (pinned placement)",
                        a.vcpu
                    ),
                ));
            };
            let d = topo.cpu_by_os_index(c).ok_or_else(|| {
                ApiError::bad(
                    "cpus.affinity",
                    format!("host CPU {c} is not in the server's topology"),
                )
            })?;
            dense[a.vcpu as usize] = d;
            os[a.vcpu as usize] = c;
        }
        if let Some(v) = dense.iter().position(|&d| d == u32::MAX) {
            return Err(ApiError::bad(
                "cpus.affinity",
                format!("vcpu {v} has no entry"),
            ));
        }
        Some(VmPlan { dense, os })
    } else if policy == "pinned" {
        let p = vcpu_sched::placement::pack::place(topo, &guest, relax, free, &format!("VM {id}"))
            .map_err(|e| ApiError::bad("cpus", e.0))?;
        Some(p)
    } else {
        None
    };
    if cfg.cpus.affinity.is_some() {
        if let Some(p) = &plan {
            free.set(&p.dense, true);
        }
    }
    Ok((shape, plan))
}

/// The micro-guest program.
fn program(name: &str, vcpus: usize) -> Result<Vec<u8>, vmm_machine::micro::MicroError> {
    use vmm_machine::micro::asm::{Op, Script};
    match name {
        "exit" => Script {
            vcpus: vec![],
            others: vec![Op::Report(1), Op::Done(0)],
        }
        .assemble(),
        "crash" => Script {
            vcpus: vec![vec![Op::Report(1), Op::Crash]],
            others: vec![Op::Report(1), Op::Sleep(1_000_000), Op::Done(0)],
        }
        .assemble(),
        "spin" => {
            let mut g = GuestAsm::new()?;
            let mut top = g.label();
            g.bind(&mut top)?;
            g.compute(1_000_000)?;
            g.raw()
                .jmp(top)
                .map_err(|e| vmm_machine::micro::MicroError::Assemble(e.to_string()))?;
            g.finish()
        }
        _ => {
            let _ = vcpus;
            let mut g = GuestAsm::new()?;
            let mut top = g.label();
            g.bind(&mut top)?;
            g.compute(2000)?;
            g.report(1)?;
            g.sleep_ns(1_000_000)?;
            g.raw()
                .jmp(top)
                .map_err(|e| vmm_machine::micro::MicroError::Assemble(e.to_string()))?;
            g.finish()
        }
    }
}

async fn boot(state: &Shared, id: &str) -> Reply {
    let (cfg, plan, eo, spec, counts) = {
        let mut s = lock(state);
        let topo = s.topo.clone();
        let mapping = s.mapping.clone();
        let mitigations = s.opts.mitigations;
        let executor = s.opts.executor;
        let v = s.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if v.busy {
            return Err(ApiError::status(
                409,
                format!("VM {id} is busy with another request"),
            ));
        }
        if matches!(v.state, VmState::Running | VmState::Paused) {
            return Err(ApiError::status(405, format!("VM {id} is already booted")));
        }
        v.busy = true;
        let mut eo = ExecOptions::new(topo, mapping);
        eo.kind = executor;
        eo.mitigations = mitigations;
        let prog = v
            .config
            .x_vmm
            .as_ref()
            .and_then(|x| x.micro.clone())
            .unwrap_or_else(|| "ticker".into());
        let n = v.config.cpus.boot_vcpus as usize;
        let code = program(&prog, n);
        let mut spec = code.map(|c| MicroVmSpec::new(id.to_string(), n, c));
        if let (Ok(sp), Some(m)) = (spec.as_mut(), &v.config.memory) {
            sp.memory = m.size;
        }
        (
            v.config.clone(),
            v.plan.clone(),
            eo,
            spec,
            v.exit_counts.clone(),
        )
    };
    let st = state.clone();
    let id2 = id.to_string();
    let (topo2, pool) = {
        let s = lock(state);
        (s.topo.clone(), s.pool.clone())
    };
    let result = tokio::task::spawn_blocking(move || -> Result<Arc<Running>, String> {
        let rt = cfg.x_vmm.as_ref().and_then(|x| x.rt.clone());
        let policy = |k: usize| match &rt {
            Some(r) if r.policy == "rr" => Policy::Rr(r.priority_of(k)),
            Some(r) => Policy::Fifo(r.priority_of(k)),
            None => Policy::Fair(vcpu_sched::task::NICE_0_WEIGHT),
        };
        let n = cfg.cpus.boot_vcpus as usize;
        let placement: Vec<Placement> = (0..n)
            .map(|k| Placement {
                policy: policy(k),
                affinity: plan.as_ref().map(|p| CpuMask::single(p.dense[k])),
            })
            .collect();
        if cfg.linux_payload() {
            let on = Executor {
                pool: pool.as_ref(),
                eo: &eo,
            };
            return boot_linux(&id2, &cfg, plan.as_ref(), &topo2, placement, on, counts);
        }
        let spec = spec.map_err(|e| e.to_string())?;
        let vm = {
            let s = lock(&st);
            MicroVm::build(&s.micro, &spec).map_err(|e| e.to_string())?
        };
        let mut guest = vm.into_guest(placement);
        arm_faults(&id2, &mut guest.vcpus)?;
        guest.mapper = Arc::new(CountingMapper {
            inner: guest.mapper,
            counts,
        });
        tracing::info!(vm = id2, "booting");
        Executor {
            pool: pool.as_ref(),
            eo: &eo,
        }
        .start(guest)
        .map(|(r, _)| Arc::new(r))
    })
    .await
    .unwrap_or_else(|e| Err(format!("boot task failed: {e}")));
    let mut s = lock(state);
    let Some(v) = s.vms.get_mut(id) else {
        return Err(not_created(id));
    };
    v.busy = false;
    match result {
        Ok(r) => {
            v.run = Some(r);
            v.state = VmState::Running;
            v.boots += 1;
            v.last_stop = None;
            Ok(empty(204))
        }
        Err(e) => Err(ApiError::status(
            500,
            format!("VM {id} could not boot: {e}"),
        )),
    }
}

/// Arms the test faults `VMM_INJECT` names for VM `id` (see
/// [`vmm_machine::vcpu::inject`]; unset in normal use).
fn arm_faults(id: &str, vcpus: &mut [vmm_machine::vcpu::Vcpu]) -> Result<(), String> {
    for (k, f) in vmm_machine::vcpu::inject::for_vm(id)? {
        let n = vcpus.len();
        let v = vcpus
            .get_mut(k)
            .ok_or_else(|| format!("VMM_INJECT: VM {id} has {n} vCPUs, no vCPU {k}"))?;
        tracing::warn!(vm = id, vcpu = k, fault = %f.kind, at = f.at, "test fault armed");
        v.inject(f);
    }
    Ok(())
}

/// Where a booted VM runs: the server's shared pool, or (`--executor
/// host`) an executor of its own.
#[derive(Clone, Copy)]
struct Executor<'a> {
    pool: Option<&'a Arc<VcpuPool>>,
    eo: &'a ExecOptions,
}

impl Executor<'_> {
    /// Makes the VM's set (on the pool's clock) and starts its vCPUs.
    fn start(self, guest: GuestVm) -> Result<(Running, Arc<VmSet>), String> {
        let set = match self.pool {
            Some(p) => VmSet::new_on(vec![guest], p.epoch()),
            None => VmSet::new(vec![guest]),
        }
        .map_err(|e| e.to_string())?;
        let r = match self.pool {
            Some(p) => Running::start_on(p, set.clone()),
            None => Running::start(self.eo, set.clone()),
        };
        r.map(|r| (r, set)).map_err(|e| e.to_string())
    }
}

/// Builds and starts a Linux VM (`payload.kernel`): its vCPUs become tasks
/// like a micro-guest's; a poller thread ([`HaltPoller`]) kicks halted
/// vCPUs out of `KVM_RUN` (the in-kernel irqchip keeps HLT inside KVM)
/// and wakes them when an interrupt is pending, until the set stops, as
/// `vmm run --sched vcpu_sched` does.
fn boot_linux(
    id: &str,
    cfg: &VmConfig,
    plan: Option<&VmPlan>,
    topo: &HostTopology,
    placement: Vec<Placement>,
    on: Executor,
    counts: Arc<ExitCounts>,
) -> Result<Arc<Running>, String> {
    use vmm_machine::vcpu_body::linux::{HaltPoller, LinuxMapper};
    let shape = cfg.guest_shape().map_err(|e| e.error)?;
    let guest = GuestTopology::from_spec(&shape).map_err(|e| e.to_string())?;
    let p = cfg.payload.clone().unwrap_or(api::PayloadConfig {
        kernel: None,
        cmdline: None,
        initramfs: None,
    });
    let console: Box<dyn std::io::Write + Send> = match &cfg.serial {
        Some(c) if c.mode == "File" => {
            let f = c
                .file
                .as_deref()
                .ok_or("serial.file: give a file for mode File")?;
            Box::new(std::fs::File::create(f).map_err(|e| format!("serial.file {f}: {e}"))?)
        }
        Some(c) if c.mode == "Tty" => Box::new(std::io::stdout()),
        _ => Box::new(std::io::sink()),
    };
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| format!("cannot open /dev/kvm: {e}"))?;
    let spec = vmm_machine::vm::LinuxVmSpec {
        guest,
        memory: cfg
            .memory
            .as_ref()
            .map_or(api::LINUX_DEFAULT_MEMORY, |m| m.size),
        kernel: p.kernel.clone().unwrap_or_default().into(),
        initrd: p.initramfs.clone().map(Into::into),
        cmdline: p.cmdline.clone().unwrap_or_default(),
        vendor: None,
        compat: vmm_machine::compat::CompatArg::Auto.resolve(),
        pins: plan.map(|p| vcpu_sched::placement::pin::PinPlan {
            dense: p.dense.clone(),
            os: p.os.clone(),
        }),
        host: plan.map(|_| topo.clone()),
        console,
        until: None,
    };
    let mut vm = vmm_machine::vm::LinuxVm::build(&kvm, spec).map_err(|e| e.to_string())?;
    let mut vcpus = vm.take_vcpus();
    arm_faults(id, &mut vcpus)?;
    let control = vm.control();
    let mapper = Arc::new(LinuxMapper::new(
        vm.devices(),
        vcpus.len(),
        vmm_machine::vcpu_body::linux::HaltSleep::default(),
    ));
    let poller = HaltPoller::new(mapper.clone(), &vcpus);
    let guest = vmm_machine::vcpu_body::GuestVm {
        name: id.to_string(),
        vcpus,
        mapper: Arc::new(CountingMapper {
            inner: mapper,
            counts,
        }),
        control: control.clone(),
        placement,
        keep: Box::new(vm),
    };
    control.mark_started();
    tracing::info!(vm = id, "booting Linux");
    let (running, set) = on.start(guest)?;
    let running = Arc::new(running);
    // A weak handle: stopping the VM unwraps the `Running`, which a
    // poller round holds for microseconds at most.
    let weak = Arc::downgrade(&running);
    std::thread::Builder::new()
        .name(format!("halt-poll/{id}"))
        .spawn(move || {
            while !set.stopping() && set.vms()[0].live() > 0 {
                let Some(r) = weak.upgrade() else { break };
                poller.round(&|k| r.wake(0, k));
                drop(r);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .map_err(|e| format!("cannot start the halt poller: {e}"))?;
    Ok(running)
}

/// Stops a VM's vCPUs; with `delete`, also forgets it (any state).
async fn shutdown_vm(state: &Shared, id: &str, delete: bool) -> Reply {
    let run = {
        let mut s = lock(state);
        let v = s.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if v.busy {
            return Err(ApiError::status(
                409,
                format!("VM {id} is busy with another request"),
            ));
        }
        if !delete && !matches!(v.state, VmState::Running | VmState::Paused) {
            return Err(ApiError::status(
                405,
                format!("VM {id} is not booted (state {})", v.state.name()),
            ));
        }
        v.busy = true;
        let (_, why) = v.observed_state();
        v.last_stop = why.or_else(|| Some("shut down by the API".into()));
        v.run.take()
    };
    let stopped = match run {
        Some(r) => stop_running(r).await,
        None => Ok(0),
    };
    let mut s = lock(state);
    if delete {
        if let Some(v) = s.vms.remove(id) {
            if let Some(p) = v.plan {
                s.free.set(&p.dense, false);
            }
        }
    } else if let Some(v) = s.vms.get_mut(id) {
        v.busy = false;
        v.state = VmState::Shutdown;
        if let Ok(n) = stopped {
            v.past_exits += n;
        }
    }
    match stopped {
        Ok(_) => Ok(empty(204)),
        Err(e) => Err(ApiError::status(500, format!("VM {id}: {e}"))),
    }
}

/// Stops an executor on the blocking pool; returns the VM's KVM exits.
async fn stop_running(r: Arc<Running>) -> Result<u64, String> {
    tokio::task::spawn_blocking(move || {
        let exits: u64 = r.set().progress_snapshot().iter().sum();
        // The handlers' clones are short-lived; wait for them to go.
        let mut r = r;
        let deadline = Instant::now() + Duration::from_secs(5);
        let owned = loop {
            match Arc::try_unwrap(r) {
                Ok(o) => break o,
                Err(back) if Instant::now() < deadline => {
                    r = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return Err("the VM is still referenced; not stopped".to_string()),
            }
        };
        owned
            .stop(STOP_TIMEOUT)
            .map(|_| exits)
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(format!("stop task failed: {e}")))
}

fn info(state: &Shared, id: &str) -> Reply {
    let s = lock(state);
    let v = s.vms.get(id).ok_or_else(|| not_created(id))?;
    let (st, why) = v.observed_state();
    let (exits, live) = match &v.run {
        Some(r) => (
            r.set().progress_snapshot().iter().sum::<u64>(),
            r.set().vms()[0].live(),
        ),
        None => (0, 0),
    };
    let mem = v
        .config
        .memory
        .as_ref()
        .map_or(vmm_machine::micro::MIN_MEMORY, |m| m.size);
    let mut config = serde_json::to_value(&v.config).unwrap_or_default();
    if let (Some(p), Some(obj)) = (
        &v.plan,
        config.get_mut("cpus").and_then(|c| c.as_object_mut()),
    ) {
        obj.insert(
            "affinity".into(),
            serde_json::to_value(p.affinity()).unwrap_or_default(),
        );
    }
    Ok(json_response(
        200,
        &serde_json::json!({
            "config": config,
            "state": st.name(),
            "memory_actual_size": mem,
            "x_vmm": {
                "id": id,
                "guest_topology": v.shape,
                "boots": v.boots,
                "live_vcpus": live,
                "kvm_exits": v.past_exits + exits,
                "stop_reason": why,
                "executor": s.opts.executor.name(),
            },
        }),
    ))
}

fn counters(state: &Shared, id: &str) -> Reply {
    let s = lock(state);
    let v = s.vms.get(id).ok_or_else(|| not_created(id))?;
    let mut out = serde_json::Map::new();
    let exits: serde_json::Map<String, serde_json::Value> = v
        .exit_counts
        .snapshot()
        .into_iter()
        .map(|(k, n)| (k.to_string(), n.into()))
        .collect();
    out.insert("exits".into(), serde_json::Value::Object(exits));
    if let Some(r) = &v.run {
        for (k, n) in r.set().progress_snapshot().iter().enumerate() {
            out.insert(format!("vcpu{k}"), serde_json::json!({ "kvm_exits": n }));
        }
        if let Some(c) = r.counters() {
            let m: serde_json::Map<String, serde_json::Value> = c
                .fields()
                .into_iter()
                .map(|(k, n)| (k.to_string(), n.into()))
                .collect();
            out.insert("scheduler".into(), serde_json::Value::Object(m));
        }
    }
    Ok(json_response(200, &serde_json::Value::Object(out)))
}

/// Runs the server until `vmm.shutdown` or SIGTERM/SIGINT, then stops
/// every VM and removes the socket.
pub fn serve(opts: ServeOptions) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ServeError::Io("starting the tokio runtime".into(), e))?;
    rt.block_on(serve_async(opts))
}

async fn serve_async(opts: ServeOptions) -> Result<(), ServeError> {
    let path = opts.socket.clone();
    let state = State::new(opts)?;
    let shutdown = state.shutdown.clone();
    let state: Shared = Arc::new(Mutex::new(state));
    if path.exists() {
        // A stale socket from a killed server: refuse a live one.
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Err(ServeError::Io(
                format!("--api-socket {}", path.display()),
                std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another server answers on it",
                ),
            ));
        }
        let _ = std::fs::remove_file(&path);
    }
    let listener = tokio::net::UnixListener::bind(&path)
        .map_err(|e| ServeError::Io(format!("--api-socket {}", path.display()), e))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ServeError::Io("SIGTERM handler".into(), e))?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| ServeError::Io("SIGINT handler".into(), e))?;
    tracing::info!(socket = %path.display(), "serving");
    eprintln!("vmm serve: listening on {}", path.display());
    loop {
        tokio::select! {
            a = listener.accept() => {
                let Ok((stream, _)) = a else { continue };
                let st = state.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(st.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
            _ = shutdown.notified() => { tracing::info!("vmm.shutdown"); break; }
            _ = term.recv() => { tracing::info!("SIGTERM"); break; }
            _ = int.recv() => { tracing::info!("SIGINT"); break; }
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
    let ids: Vec<String> = lock(&state).vms.keys().cloned().collect();
    for id in ids {
        if let Err(e) = shutdown_vm(&state, &id, true).await {
            tracing::warn!(vm = id, error = %e.error, "stopping at shutdown");
        }
    }
    let pool = lock(&state).pool.take();
    if let Some(p) = pool {
        p.stop();
    }
    eprintln!("vmm serve: stopped every VM, removed {}", path.display());
    Ok(())
}
