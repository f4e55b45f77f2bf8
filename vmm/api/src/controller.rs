//! The VM-lifecycle controller: what each API request does to the
//! server's VMs.
//!
//! WHAT: [`ApiRequest`] (one variant per route, with the VM id and the
//! parsed body), [`Answer`] (what a request returns when it succeeds), and
//! [`Controller`], which owns the VM table, the planner's free map, the
//! shared scheduler and KVM, and has one method per request: create,
//! boot, info, counters, pause/resume, resize, shutdown, reboot, delete,
//! ping, vmm.shutdown, list, metrics.
//! WHY: routing (the HTTP front end) and the VM lifecycle change for
//! different reasons; the lifecycle knows no HTTP type, so it can be
//! driven and read without a socket.
//! HOW: one `Mutex` holds the VM table and the free map; a method takes it
//! only to read or flip a record, never across file I/O, a boot or a stop:
//! those run on tokio's blocking pool with the lock let go, a `busy` flag
//! on the record keeping other requests off the VM meanwhile, and the lock
//! taken again to record the result. `vm.create` checks the request's
//! files ([`files`]) with no lock held, then checks again
//! under it what others may have changed since (the id, the memory).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use topology::HostTopology;
use vcpu_sched::exec::CpuMapping;
use vcpu_sched::placement::pack::FreeMap;
use vmm_machine::micro::MicroHost;
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, Running, VcpuPool};

use super::admission::{admit, placement_name};
use super::api::{ApiError, VmConfig, VmResize};
use super::devices::{DiskConfig, FsConfig, NetConfig, VsockConfig};
use super::fds::Received;
use super::files;
use super::guests::{self, BootJob, Booted};
use super::metrics::{self, ApiMetrics};
use super::options::{ServeError, ServeOptions};
use super::vms::{VmRecord, VmState};

/// How long a VM's vCPUs get to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `vm.create` waits for its files to be checked (a regular file
/// takes microseconds; only a file that blocks takes longer).
const FILE_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// One API request, routed and parsed.
#[derive(Debug)]
pub enum ApiRequest {
    /// `GET vmm.ping`.
    Ping,
    /// `PUT vmm.shutdown`.
    VmmShutdown,
    /// `GET /api/v1/vms`.
    List,
    /// `GET /metrics`, in OpenMetrics or the classic text format.
    Metrics {
        /// The client asked for OpenMetrics.
        openmetrics: bool,
    },
    /// `PUT vm.create`.
    Create {
        /// The VM.
        id: String,
        /// Its config.
        config: Box<VmConfig>,
    },
    /// `PUT vm.boot`.
    Boot {
        /// The VM.
        id: String,
    },
    /// `GET vm.info`.
    Info {
        /// The VM.
        id: String,
    },
    /// `GET vm.counters`.
    Counters {
        /// The VM.
        id: String,
    },
    /// `PUT vm.pause`.
    Pause {
        /// The VM.
        id: String,
    },
    /// `PUT vm.resume`.
    Resume {
        /// The VM.
        id: String,
    },
    /// `PUT vm.resize`.
    Resize {
        /// The VM.
        id: String,
        /// The sizes asked for.
        resize: VmResize,
    },
    /// `PUT vm.add-net`, with the descriptors that came with it.
    AddNet {
        /// The VM.
        id: String,
        /// The net.
        net: Box<NetConfig>,
        /// The tap's descriptors (`SCM_RIGHTS`).
        fds: Received,
    },
    /// `PUT vm.add-disk`.
    AddDisk {
        /// The VM.
        id: String,
        /// The disk.
        disk: Box<DiskConfig>,
    },
    /// `PUT vm.add-fs`.
    AddFs {
        /// The VM.
        id: String,
        /// The fs.
        fs: Box<FsConfig>,
    },
    /// `PUT vm.add-vsock`.
    AddVsock {
        /// The VM.
        id: String,
        /// The vsock.
        vsock: Box<VsockConfig>,
    },
    /// `PUT vm.remove-device`.
    RemoveDevice {
        /// The VM.
        id: String,
        /// The device's id.
        device: String,
    },
    /// `PUT vm.shutdown`.
    Shutdown {
        /// The VM.
        id: String,
    },
    /// `PUT vm.reboot`.
    Reboot {
        /// The VM.
        id: String,
    },
    /// `PUT vm.delete`.
    Delete {
        /// The VM.
        id: String,
    },
}

/// A request's answer when it succeeds.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Done, nothing to say (HTTP 204).
    Done,
    /// A JSON document (HTTP 200).
    Json(serde_json::Value),
    /// Text of a content type (HTTP 200): the metrics.
    Text {
        /// The text.
        body: String,
        /// Its content type.
        content_type: &'static str,
    },
}

/// What a request returns.
pub type Outcome = Result<Answer, ApiError>;

/// The VMs, and the host CPUs their placements hold.
pub(crate) struct Table {
    pub(crate) vms: BTreeMap<String, VmRecord>,
    free: FreeMap,
}

/// The server's VMs and what runs them.
pub struct Controller {
    opts: ServeOptions,
    topo: Arc<HostTopology>,
    mapping: CpuMapping,
    /// The scheduler every VM shares (`None` with `--executor host`).
    pool: Option<Arc<VcpuPool>>,
    micro: Arc<MicroHost>,
    table: Mutex<Table>,
    started: Instant,
    shutdown: tokio::sync::Notify,
    api: ApiMetrics,
}

pub(crate) fn not_created(id: &str) -> ApiError {
    ApiError::status(404, format!("VM {id} is not created"))
}

pub(crate) fn busy(id: &str) -> ApiError {
    ApiError::status(409, format!("VM {id} is busy with another request"))
}

impl Controller {
    /// Opens KVM, loads the topology and (`--executor workers`) starts the
    /// scheduler every VM will share.
    pub fn new(opts: ServeOptions) -> Result<Self, ServeError> {
        vmm_machine::vcpu::install_kick_signal().map_err(vmm_machine::micro::MicroError::from)?;
        let topo = Arc::new(topology::load(&opts.topology)?);
        let mapping = CpuMapping::for_spec(&opts.topology)?;
        let micro = Arc::new(MicroHost::open()?);
        let pool = match opts.executor {
            ExecutorKind::Workers => {
                let mut eo = ExecOptions::new(topo.clone(), mapping.clone());
                eo.mitigations = opts.mitigations;
                eo.sched.busy_balance = opts.busy_balance;
                eo.sched.sleeper_credit = opts.sleeper_credit;
                eo.sched.fair_wakeup_preempt = opts.wakeup_preempt;
                eo.sched.fair_latency_ns = opts.fair_latency_ns;
                eo.sched.fair_min_granularity_ns = opts.fair_min_granularity_ns;
                eo.sched.fair_slice_scaling = opts.fair_slice_scaling;
                eo.tick = std::time::Duration::from_nanos(opts.tick_ns);
                eo.halt_poll = std::time::Duration::from_nanos(opts.halt_poll_ns);
                eo.halt_park = opts.halt_park;
                Some(Arc::new(VcpuPool::start(&eo)?))
            }
            ExecutorKind::Host => None,
            ExecutorKind::Threads => {
                return Err(ServeError::Input(
                    "executor threads: vmm serve runs every VM on one shared scheduler, which \
                     the threads executor cannot take VMs into while it runs; use workers (the \
                     default) or host (1:1 threads, no vcpu_sched)"
                        .into(),
                ))
            }
        };
        Ok(Self {
            table: Mutex::new(Table {
                vms: BTreeMap::new(),
                free: FreeMap::new(&topo),
            }),
            topo,
            mapping,
            pool,
            micro,
            started: Instant::now(),
            shutdown: tokio::sync::Notify::new(),
            api: ApiMetrics::default(),
            opts,
        })
    }

    pub(crate) fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The API's own series, which the HTTP front end counts into.
    pub fn api_metrics(&self) -> &ApiMetrics {
        &self.api
    }

    /// Notified by `vmm.shutdown`.
    pub fn shutdown_requested(&self) -> &tokio::sync::Notify {
        &self.shutdown
    }

    /// Answers one request.
    pub async fn handle(&self, req: ApiRequest) -> Outcome {
        match req {
            ApiRequest::Ping => Ok(Self::ping()),
            ApiRequest::VmmShutdown => {
                self.shutdown.notify_one();
                Ok(Answer::Done)
            }
            ApiRequest::List => Ok(self.list()),
            ApiRequest::Metrics { openmetrics } => Ok(self.metrics(openmetrics)),
            ApiRequest::Create { id, config } => self.create(&id, *config).await,
            ApiRequest::Boot { id } => self.boot(&id).await,
            ApiRequest::Info { id } => self.info(&id),
            ApiRequest::Counters { id } => self.counters(&id),
            ApiRequest::Pause { id } => self.pause_resume(&id, true),
            ApiRequest::Resume { id } => self.pause_resume(&id, false),
            ApiRequest::Resize { id, resize } => self.resize(&id, &resize),
            ApiRequest::AddNet { id, net, fds } => self.add_net(&id, *net, fds).await,
            ApiRequest::AddDisk { id, disk } => self.add_disk(&id, *disk).await,
            ApiRequest::AddFs { id, fs } => self.add_fs(&id, *fs).await,
            ApiRequest::AddVsock { id, vsock } => self.add_vsock(&id, *vsock).await,
            ApiRequest::RemoveDevice { id, device } => self.remove_device(&id, &device).await,
            ApiRequest::Shutdown { id } => self.shutdown_vm(&id, false).await,
            ApiRequest::Reboot { id } => {
                self.shutdown_vm(&id, false).await?;
                self.boot(&id).await
            }
            ApiRequest::Delete { id } => self.shutdown_vm(&id, true).await,
        }
    }

    fn ping() -> Answer {
        Answer::Json(serde_json::json!({
            "build_version": env!("CARGO_PKG_VERSION"),
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "features": ["x_vmm"],
        }))
    }

    fn list(&self) -> Answer {
        let t = self.table();
        let list: Vec<serde_json::Value> = t
            .vms
            .iter()
            .map(|(id, v)| serde_json::json!({"id": id, "state": v.observed_state().0.name()}))
            .collect();
        Answer::Json(serde_json::Value::Array(list))
    }

    fn metrics(&self, openmetrics: bool) -> Answer {
        let text = {
            let t = self.table();
            metrics::render(&metrics::Sources {
                vms: &t.vms,
                per_vcpu: self.opts.per_vcpu_metrics,
                sched: self.pool.as_ref().map(|p| {
                    let (tick, poll) = p.periods();
                    (
                        &**p.scheduler(),
                        [tick.as_nanos() as u64, poll.as_nanos() as u64],
                    )
                }),
                api: &self.api,
                started: self.started,
            })
        };
        if openmetrics {
            Answer::Text {
                body: text,
                content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            }
        } else {
            Answer::Text {
                body: metrics::to_classic(&text),
                content_type: "text/plain; version=0.0.4; charset=utf-8",
            }
        }
    }

    /// `vm.create`: the request's own checks, its files (no lock held),
    /// then under the lock the id, the memory and the placement.
    async fn create(&self, id: &str, cfg: VmConfig) -> Outcome {
        Self::check_room(&self.table(), id, &cfg)?;
        cfg.guest_shape()?;
        cfg.device_spec()?;
        Self::check_files(&cfg).await?;
        let mut t = self.table();
        Self::check_room(&t, id, &cfg)?;
        let (shape, plan) = admit(&cfg, id, &self.topo, &mut t.free)?;
        tracing::info!(vm = id, shape, "created");
        t.vms
            .insert(id.to_string(), VmRecord::new(cfg, shape, plan));
        Ok(Answer::Done)
    }

    /// A new VM `id` needs the id free and, with the guest RAM every
    /// created VM already holds, room in the host's RAM (or the last VM
    /// to boot would take the host down).
    fn check_room(t: &Table, id: &str, cfg: &VmConfig) -> Result<(), ApiError> {
        if t.vms.contains_key(id) {
            return Err(ApiError::status(
                409,
                format!("VM {id} already exists; vm.delete it first"),
            ));
        }
        let Some(total) = vmm_machine::memory::host_mem_total() else {
            return Ok(());
        };
        let others: u64 = t.vms.values().map(|v| v.config.memory_bytes()).sum();
        let want = cfg.memory_bytes();
        if others.saturating_add(want) > total {
            return Err(ApiError::bad(
                "memory.size",
                format!(
                    "{want} bytes more than the {others} bytes the server's {} VMs already \
                     hold is beyond this host's {total} bytes of RAM; give less, or vm.delete \
                     a VM first",
                    t.vms.len()
                ),
            ));
        }
        Ok(())
    }

    /// The request's files, checked on the blocking pool (a file that
    /// blocks holds one blocking thread, never the server).
    async fn check_files(cfg: &VmConfig) -> Result<(), ApiError> {
        let c = cfg.clone();
        let job = tokio::task::spawn_blocking(move || files::check_config_files(&c));
        match tokio::time::timeout(FILE_CHECK_TIMEOUT, job).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(ApiError::status(500, format!("file check failed: {e}"))),
            Err(_) => Err(ApiError::bad(
                "payload",
                format!(
                    "its files were not read within {} s (a file that blocks when opened?); \
                     give regular files",
                    FILE_CHECK_TIMEOUT.as_secs()
                ),
            )),
        }
    }

    /// `vm.boot`: marks the VM busy, builds and starts it on the blocking
    /// pool, records the outcome.
    async fn boot(&self, id: &str) -> Outcome {
        let job = self.start_boot(id)?;
        let result = tokio::task::spawn_blocking(move || guests::boot(job))
            .await
            .unwrap_or_else(|e| Err(format!("boot task failed: {e}")));
        self.finish_boot(id, result)
    }

    /// Takes what a boot needs from the VM's record, and marks it busy.
    fn start_boot(&self, id: &str) -> Result<BootJob, ApiError> {
        let mut t = self.table();
        let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if v.busy {
            return Err(busy(id));
        }
        if matches!(v.state, VmState::Running | VmState::Paused) {
            return Err(ApiError::status(405, format!("VM {id} is already booted")));
        }
        v.busy = true;
        let mut exec = ExecOptions::new(self.topo.clone(), self.mapping.clone());
        exec.kind = self.opts.executor;
        exec.mitigations = self.opts.mitigations;
        Ok(BootJob {
            id: id.to_string(),
            config: v.config.clone(),
            plan: v.plan.clone(),
            topo: self.topo.clone(),
            pool: self.pool.clone(),
            exec,
            micro: self.micro.clone(),
            counts: v.exit_counts.clone(),
            console: v.console,
            vconsole: v.vconsole,
        })
    }

    fn finish_boot(&self, id: &str, result: Result<Booted, String>) -> Outcome {
        let mut t = self.table();
        let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        v.busy = false;
        match result {
            Ok(b) => {
                v.run = Some(b.running);
                v.backends = b.backends;
                v.cpu_hotplug = b.cpu_hotplug;
                if let Some(d) = &b.devices {
                    crate::device_ids::ensure_ids(&mut v.config);
                    v.pci_ids = crate::device_ids::map_ids(&v.config, &d.pci_functions());
                }
                v.devices = b.devices;
                v.console = b.console.or(v.console);
                v.vconsole = b.vconsole.or(v.vconsole);
                v.state = VmState::Running;
                v.boots += 1;
                v.last_stop = None;
                Ok(Answer::Done)
            }
            Err(e) => Err(ApiError::status(
                500,
                format!("VM {id} could not boot: {e}"),
            )),
        }
    }

    /// `vm.pause` (Running -> Paused) and `vm.resume` (Paused -> Running).
    fn pause_resume(&self, id: &str, pause: bool) -> Outcome {
        let mut t = self.table();
        let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if v.busy {
            return Err(busy(id));
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
        Ok(Answer::Done)
    }

    /// `vm.resize`: `desired_vcpus` from 1 to `cpus.max_vcpus` (ACPI CPU
    /// hotplug: more vCPUs are hot-added, fewer are asked back from the
    /// guest, which ejects them); memory and the balloon only with
    /// requests that change nothing.
    fn resize(&self, id: &str, r: &VmResize) -> Outcome {
        let mut t = self.table();
        let v = t.vms.get_mut(id).ok_or_else(|| not_created(id))?;
        if r.desired_ram.is_some() {
            return Err(ApiError::bad("desired_ram", "memory resizing is not supported: there is no memory hotplug (ACPI memory devices, virtio-mem) and no balloon; create the VM with the memory it needs (memory.size; Kata: default_memory sized for the sandbox, with static_sandbox_resource_mgmt = true so that it never asks for a resize)"));
        }
        if r.desired_balloon.is_some() {
            return Err(ApiError::bad("desired_balloon", "the balloon is not supported (no virtio-balloon device); create the VM with the memory it needs (memory.size)"));
        }
        match r.desired_vcpus {
            Some(d) => resize_vcpus(id, v, d),
            None => Ok(Answer::Done),
        }
    }

    /// Stops a VM's vCPUs (`vm.shutdown`); with `delete`, also forgets it,
    /// in any state (`vm.delete`).
    async fn shutdown_vm(&self, id: &str, delete: bool) -> Outcome {
        let run = {
            let mut t = self.table();
            let Some(v) = t.vms.get_mut(id) else {
                // CH answers 204 to vm.delete with no VM: nothing to do.
                return if delete {
                    Ok(Answer::Done)
                } else {
                    Err(not_created(id))
                };
            };
            if v.busy {
                return Err(busy(id));
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
            v.cpu_hotplug = None;
            v.devices = None;
            v.pci_ids.clear();
            v.run.take()
        };
        let stopped = match run {
            Some(r) => stop_running(r).await,
            None => Ok(0),
        };
        let mut t = self.table();
        if delete {
            if let Some(v) = t.vms.remove(id) {
                if let Some(p) = v.plan {
                    t.free.set(&p.dense, false);
                }
            }
        } else if let Some(v) = t.vms.get_mut(id) {
            v.busy = false;
            v.state = VmState::Shutdown;
            if let Ok(n) = stopped {
                v.past_exits += n;
            }
        }
        match stopped {
            Ok(_) => Ok(Answer::Done),
            Err(e) => Err(ApiError::status(500, format!("VM {id}: {e}"))),
        }
    }

    fn info(&self, id: &str) -> Outcome {
        let t = self.table();
        let v = t.vms.get(id).ok_or_else(|| not_created(id))?;
        let (st, why) = v.observed_state();
        let (exits, live) = v.exits_and_live();
        // What the guest got: the size asked for, or its payload's
        // default (512 MiB for Linux, as CH gives).
        let mem = v.config.memory_bytes();
        let mut config = serde_json::to_value(v.config.echo()).unwrap_or_default();
        if let (Some(p), Some(obj)) = (
            &v.plan,
            config.get_mut("cpus").and_then(|c| c.as_object_mut()),
        ) {
            obj.insert(
                "affinity".into(),
                serde_json::to_value(p.affinity()).unwrap_or_default(),
            );
        }
        Ok(Answer::Json(serde_json::json!({
            "config": config,
            "state": st.name(),
            "memory_actual_size": mem,
            "x_vmm": {
                "id": id,
                "guest_topology": v.shape,
                "boots": v.boots,
                "live_vcpus": live,
                "present_vcpus": v.present_vcpus(),
                "kvm_exits": exits,
                "stop_reason": why,
                "executor": self.opts.executor.name(),
                "placement": placement_name(&v.config, v.plan.as_ref()),
                "device_backends": v.backend_report(),
                "pci_devices": crate::device_ids::pci_report(v),
            },
        })))
    }

    fn counters(&self, id: &str) -> Outcome {
        let t = self.table();
        let v = t.vms.get(id).ok_or_else(|| not_created(id))?;
        let mut out = serde_json::Map::new();
        let exits: serde_json::Map<String, serde_json::Value> = v
            .exit_counts
            .snapshot()
            .into_iter()
            .map(|(k, n)| (k.to_string(), n.into()))
            .collect();
        out.insert("exits".into(), serde_json::Value::Object(exits));
        if let Some(r) = &v.run {
            let held = r.set().held_ms_snapshot();
            for (k, n) in r.set().progress_snapshot().iter().enumerate() {
                out.insert(
                    format!("vcpu{k}"),
                    serde_json::json!({ "kvm_exits": n, "held_ms": held.get(k) }),
                );
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
        Ok(Answer::Json(serde_json::Value::Object(out)))
    }

    /// Stops and forgets every VM, then the shared scheduler: the server's
    /// last act.
    pub async fn stop_all(&self) {
        let ids: Vec<String> = self.table().vms.keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.shutdown_vm(&id, true).await {
                tracing::warn!(vm = id, error = %e.error, "stopping at shutdown");
            }
        }
        if let Some(p) = &self.pool {
            p.stop();
        }
    }
}

/// Stops an executor on the blocking pool; returns the VM's KVM exits.
/// `vm.resize`'s `desired_vcpus`: checked against `cpus.max_vcpus`,
/// then handed to the running guest's hotplug controller; the config's
/// `boot_vcpus` follows (as CH's does), so a reboot starts with as many.
fn resize_vcpus(id: &str, v: &mut crate::vms::VmRecord, d: u32) -> Outcome {
    let max = v.config.max_vcpus();
    if d == 0 || d > max {
        return Err(ApiError::bad(
            "desired_vcpus",
            format!(
                "{d}: give 1 to cpus.max_vcpus ({max}); a VM gains vCPUs only up to the \
                 max_vcpus it was created with (Kata: default_maxvcpus)"
            ),
        ));
    }
    if d == v.config.cpus.boot_vcpus {
        return Ok(Answer::Done);
    }
    // A boot or shutdown in flight has its own copy of the config.
    if v.busy {
        return Err(busy(id));
    }
    let running = matches!(v.state, VmState::Running | VmState::Paused);
    match (&v.cpu_hotplug, running) {
        (Some(h), true) => {
            h.resize(d as usize)
                .map_err(|e| ApiError::status(500, format!("VM {id}: {e}")))?;
            tracing::info!(vm = id, desired_vcpus = d, "vm.resize");
        }
        (None, true) => {
            return Err(ApiError::bad(
                "desired_vcpus",
                format!("VM {id} was booted without CPU hotplug (max_vcpus = boot_vcpus)"),
            ))
        }
        // Not booted: the next boot starts with `d`.
        (_, false) => {}
    }
    v.config.cpus.boot_vcpus = d;
    Ok(Answer::Done)
}

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
