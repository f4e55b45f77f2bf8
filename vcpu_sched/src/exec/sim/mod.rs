//! The deterministic simulator: the real scheduler core driven in virtual
//! time on a topology much larger than the host. It exists in the
//! `vcpu_sched_sim` build of these sources (`--cfg sim`), whose sync layer
//! reports every shared access; `vcpu_sched`, the one `vmm` links, has
//! neither.
//!
//! One thread, one event queue ordered by (virtual ns, sequence number),
//! one simulated CPU per topology CPU. Each event calls the same
//! [`Scheduler`] entry points the thread executor calls (`wake`,
//! `schedule`, `tick`); there is no scheduling decision here. While a core
//! call runs, the [`sync`](crate::sync) layer reports every shared access
//! (line, kind); the [`coherence`] model charges them on the calling CPU in
//! virtual time, so the call ends at `now + instructions + memory`. Kicks
//! the core sends become events at the kicked CPU, one transfer later.
//!
//! Tasks follow small behaviour models of the seeds' workloads
//! ([`SimWorkload`]); VMs are task groups. Same inputs and seed give the
//! same report, byte for byte. The [`InvariantChecker`] observes the core
//! every 10 ms of virtual time.

pub mod coherence;
pub mod costs;
mod queue;
pub mod regions;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use topology::HostTopology;

use crate::check::InvariantChecker;
use crate::rng::Rng;
use crate::sync::recorder::{self, Access, Kind};
use crate::workload::defs;
use crate::{
    CpuId, KickCpu, Mitigations, Pick, Policy, Prev, SchedConfig, SchedError, Scheduler, TaskId,
    TaskSpec,
};
pub use coherence::Coherence;
pub use costs::{CostTable, Level, INSTR};
use queue::{Ev, Queue, EV_IDX_BITS, EV_T_MAX};

/// The workloads, shaped like the seeds' benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimWorkload {
    /// hackbench-like, as the thread workload (`workload::messaging`)
    /// runs it: each VM's first half of tasks are senders, the rest
    /// receivers, one pipe of [`defs::MESSAGING_PIPE`] messages per
    /// receiver. A sender computes ([`defs::MESSAGING_BURST_US`]) and
    /// writes to every receiver's pipe in turn; a receiver reads its pipe
    /// and computes per message. A full pipe blocks its writer, an empty
    /// one its reader; each read wakes one waiting writer, a write wakes
    /// the waiting reader. Messages received per second.
    Messaging,
    /// cyclictest-like: one RT FIFO task ([`defs::RT_PRIO`]) per vCPU woken
    /// by a timer every [`defs::CYCLIC_PERIOD_US`], computing
    /// [`defs::CYCLIC_BURST_US`]. Mean latency timer -> running (ns, lower
    /// is better).
    Cyclic,
    /// Multi-instance transcode, as `vmm bench` and the thread workload run
    /// it: per VM, RT FIFO workers ([`defs::RT_PRIO`]) pinned to half as
    /// many cores as the VM has vCPUs ([`defs::transcode_cpus`]) compute a
    /// frame ([`defs::TRANSCODE_BURST_US`]) and meet at a barrier.
    /// Frames/s.
    Transcode,
    /// UDP_RR-like ping-pong pairs: a VM's tasks 2p and 2p+1 hand one
    /// request back and forth (no real bench defines it; 5 us per
    /// transaction side). `--vcpus 2` gives a VM per pair; one VM of many
    /// pairs is a benchmark run in one cgroup. Transactions/s.
    Pingpong,
    /// schbench-like, as the thread workload (`workload::runq`) runs it:
    /// per VM, vCPU 0 is a message task and the others its workers. The
    /// message task stamps a request for every worker and wakes it, then
    /// waits; a worker computes the request ([`defs::RUNQ_BURST_US`]) and
    /// answers, and the last answer wakes the message task, which does no
    /// compute of its own besides its wakeups. Requests (worker answers)
    /// per second; the report's maximum latency is request to running.
    Runq,
}

impl SimWorkload {
    /// Parses a workload name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "messaging" => Self::Messaging,
            "cyclic" => Self::Cyclic,
            "transcode" => Self::Transcode,
            "pingpong" | "udp_rr" => Self::Pingpong,
            "runq" | "schbench" => Self::Runq,
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Messaging => "messaging",
            Self::Cyclic => "cyclic",
            Self::Transcode => "transcode",
            Self::Pingpong => "pingpong",
            Self::Runq => "runq",
        }
    }

    /// (metric, unit, higher is better).
    pub fn metric(self) -> (&'static str, &'static str, bool) {
        match self {
            Self::Messaging => ("messages/s", "msg/s", true),
            Self::Cyclic => ("mean wakeup latency", "ns", false),
            Self::Transcode => ("frames/s", "frames/s", true),
            Self::Pingpong => ("transactions/s", "trans/s", true),
            Self::Runq => ("requests/s", "req/s", true),
        }
    }

    /// Mean compute time of one step (ns): the workload's definition
    /// ([`defs`]), the same for every variant and topology.
    fn work_ns(self) -> u64 {
        match self {
            Self::Messaging => defs::MESSAGING_BURST_US * 1000,
            Self::Cyclic => defs::CYCLIC_BURST_US * 1000,
            Self::Transcode => defs::TRANSCODE_BURST_US * 1000,
            Self::Pingpong => 5_000,
            Self::Runq => defs::RUNQ_BURST_US * 1000,
        }
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The workload.
    pub workload: SimWorkload,
    /// VMs (task groups).
    pub vms: usize,
    /// vCPUs (tasks) per VM.
    pub vcpus: usize,
    /// Virtual time to simulate, ns.
    pub duration_ns: u64,
    /// Mean compute per step, ns (`None`: the workload's definition).
    pub work_ns: Option<u64>,
    /// The seed of the workload's jitter.
    pub seed: u64,
    /// The fixes.
    pub mitigations: Mitigations,
    /// The memory cost table.
    pub cost: CostTable,
}

/// One structure's coherence traffic.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct C2cRow {
    /// Structure and field.
    pub name: String,
    /// Transfers from another CPU's cache.
    pub transfers: u64,
    /// Virtual ns they cost, queueing included.
    pub cost_ns: u64,
}

/// One lock class's contention.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LockRow {
    /// The lock class.
    pub name: String,
    /// Acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found it held.
    pub contended: u64,
    /// Virtual ns spent waiting.
    pub wait_ns: u64,
}

/// The result of one simulation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SimReport {
    /// Workload name.
    pub workload: String,
    /// CPUs simulated.
    pub cpus: usize,
    /// Fixes.
    pub mitigations: String,
    /// Seed.
    pub seed: u64,
    /// Virtual ns simulated (less than asked if stopped).
    pub simulated_ns: u64,
    /// The workload's metric.
    pub metric: f64,
    /// Its name.
    pub metric_name: String,
    /// Share of simulated CPU time inside the scheduler.
    pub sched_share: f64,
    /// Core calls made.
    pub calls: u64,
    /// Mean virtual ns per core call.
    pub sched_ns_per_call: f64,
    /// Worst timer -> running latency (cyclic), ns.
    pub max_latency_ns: u64,
    /// Invariant violations found.
    pub violations: Vec<String>,
    /// Per structure, hottest first.
    pub c2c: Vec<C2cRow>,
    /// Per lock class, most waited first.
    pub lockstat: Vec<LockRow>,
    /// Stopped early (Ctrl-C).
    pub partial: bool,
    /// The scheduler's counters over the whole run (placement, balancing,
    /// wake paths), as `vmm bench` reports them.
    #[serde(default)]
    pub counters: crate::SchedCounters,
    /// messaging, pingpong: wakes that found their task already awake.
    /// The workloads wake only a task that waits (a pipe's reader or
    /// writer, a pair's partner), so this stays 0; anything else is a
    /// flaw of the model (an earlier token-ring messaging model merged
    /// messages this way).
    #[serde(default)]
    pub absorbed_wakes: u64,
}

/// Records the core's kicks for the event loop.
#[derive(Default)]
struct Kicks(Mutex<Vec<CpuId>>);

impl KickCpu for Kicks {
    fn kick(&self, cpu: CpuId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(cpu);
    }
}

#[derive(Clone, Copy, Default)]
struct Cpu {
    curr: Option<TaskId>,
    /// The sequence number of its running burst's end event; 0 when none
    /// is live (an event whose number differs is stale).
    burst: u64,
    burst_start: u64,
    free_at: u64,
}

#[derive(Clone, Copy, Default)]
struct Task {
    vm: u32,
    idx: u32,
    remaining: u64,
    fired_at: Option<u64>,
    /// messaging senders: messages written (which pipe is next).
    sent: u32,
}

/// messaging: one receiver's pipe.
#[derive(Clone, Default)]
struct Pipe {
    /// Messages in it, at most [`defs::MESSAGING_PIPE`].
    count: u32,
    /// The reader found it empty and blocked (a write wakes it).
    reader_waits: bool,
    /// Writers that found it full and blocked, in arrival order (a read
    /// wakes the first).
    writers: std::collections::VecDeque<u32>,
}

/// messaging: a VM's senders (the rest of its tasks receive).
fn senders(vcpus: usize) -> usize {
    vcpus / 2
}

const TICK_NS: u64 = 1_000_000;
/// cyclic's timer period.
const PERIOD_NS: u64 = defs::CYCLIC_PERIOD_US * 1000;
/// Slots of the `line_of` memo (a power of two; 1 MiB).
const LINE_MEMO: usize = 1 << 16;
const CHECK_NS: u64 = 10_000_000;

struct Sim<'a> {
    s: Scheduler,
    cfg: &'a SimConfig,
    kicks: Arc<Kicks>,
    coh: Coherence,
    q: Queue,
    seq: u64,
    cpus: Vec<Cpu>,
    tasks: Vec<Task>,
    ids: Vec<TaskId>,
    /// Our task number by task id.
    index: Vec<u32>,
    /// Task ids by VM.
    vms: Vec<Vec<u32>>,
    /// Per VM: transcode's workers at the barrier; runq's answers.
    barrier: Vec<u32>,
    /// messaging: the pipes, VM by VM, one per receiver.
    pipes: Vec<Pipe>,
    /// Per CPU: tasks it still has to wake (the next last), and how it
    /// then calls `schedule`.
    plans: Vec<(Vec<u32>, Prev)>,
    rng: Rng,
    buf: Vec<Access>,
    /// Named regions sorted by start: (start, end, name).
    regions: Vec<(u64, u64, &'static str)>,
    /// `line_of`'s answers, direct-mapped by address: (address + 1, model
    /// line); 0 marks an empty slot. The same few thousand lines are
    /// looked up over and over, and a binary search over the regions on
    /// every access was a fifth of the run time.
    line_memo: Vec<(u64, u64)>,
    sched_ns: u64,
    calls: u64,
    done: u64,
    /// messaging: messages written.
    written: u64,
    absorbed: u64,
    lat_sum: u64,
    lat_n: u64,
    lat_max: u64,
    checker: InvariantChecker,
}

/// Runs one simulation. `stop` set by another thread (Ctrl-C) ends it
/// early with `partial` set.
pub fn run(
    topo: Arc<HostTopology>,
    cfg: &SimConfig,
    stop: &AtomicBool,
) -> crate::Result<SimReport> {
    run_with_progress(topo, cfg, stop, &mut |_| {})
}

/// [`run`], calling `progress` with the virtual ns reached every 10 ms.
pub fn run_with_progress(
    topo: Arc<HostTopology>,
    cfg: &SimConfig,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> crate::Result<SimReport> {
    if cfg.vms == 0 || cfg.vcpus == 0 || cfg.duration_ns == 0 {
        return Err(SchedError::Workload(
            "a simulation needs at least one VM, one vCPU and a duration".into(),
        ));
    }
    if cfg.workload == SimWorkload::Messaging && cfg.vcpus < 2 {
        return Err(SchedError::Workload(
            "messaging needs at least 2 vCPUs per VM (a sender and a receiver)".into(),
        ));
    }
    if cfg.workload == SimWorkload::Runq && cfg.vcpus < 2 {
        return Err(SchedError::Workload(
            "runq needs at least 2 vCPUs per VM (a message task and a worker)".into(),
        ));
    }
    if cfg.workload == SimWorkload::Pingpong && cfg.vcpus % 2 != 0 {
        return Err(SchedError::Workload(format!(
            "pingpong pairs a VM's vCPUs: give an even number (not {})",
            cfg.vcpus
        )));
    }
    let ntasks = cfg.vms.saturating_mul(cfg.vcpus);
    if ntasks >= 1 << EV_IDX_BITS || cfg.duration_ns > EV_T_MAX / 2 {
        return Err(SchedError::Workload(format!(
            "{ntasks} tasks for {} s: the simulator takes fewer than {} tasks and up to {} s",
            cfg.duration_ns / 1_000_000_000,
            1u64 << EV_IDX_BITS,
            EV_T_MAX / 2 / 1_000_000_000
        )));
    }
    let sc = SchedConfig {
        max_tasks: SchedConfig::default().max_tasks.max(ntasks + 1),
        max_groups: SchedConfig::default().max_groups.max(cfg.vms + 1),
        ..SchedConfig::default()
    };
    let kicks = Arc::new(Kicks::default());
    let s = Scheduler::new(topo.clone(), cfg.mitigations, sc, kicks.clone())?;
    let mut sim = Sim {
        coh: Coherence::new(&topo, cfg.cost),
        cpus: vec![Cpu::default(); s.num_cpus()],
        s,
        cfg,
        kicks,
        q: Queue::new(topo.num_cpus()),
        seq: 0,
        tasks: Vec::new(),
        ids: Vec::new(),
        index: Vec::new(),
        vms: vec![Vec::new(); cfg.vms],
        barrier: vec![0; cfg.vms],
        pipes: Vec::new(),
        plans: vec![(Vec::new(), Prev::Keep); topo.num_cpus()],
        rng: Rng::new(cfg.seed),
        buf: Vec::new(),
        regions: Vec::new(),
        line_memo: vec![(0, 0); LINE_MEMO],
        sched_ns: 0,
        calls: 0,
        done: 0,
        written: 0,
        absorbed: 0,
        lat_sum: 0,
        lat_n: 0,
        lat_max: 0,
        checker: InvariantChecker::new(50_000_000),
    };
    sim.setup()?;
    let mut regions: Vec<(u64, u64, &'static str)> = regions::of(&sim.s)
        .into_iter()
        .filter(|r| r.len > 0)
        .map(|r| (r.start as u64, (r.start + r.len) as u64, r.name))
        .collect();
    regions.sort_by_key(|r| r.0);
    sim.regions = regions;
    let end = cfg.duration_ns;
    let mut partial = false;
    let mut reached = 0;
    while let Some(k) = sim.q.pop() {
        let (t, seq, ev) = Ev::unkey(k);
        if t >= end {
            reached = end;
            break;
        }
        reached = t;
        sim.coh.set_floor(t);
        if ev == Ev::Check {
            if stop.load(Ordering::Relaxed) {
                partial = true;
                break;
            }
            progress(t);
        }
        sim.handle(t, seq, ev);
    }
    Ok(sim.report(&topo, reached.max(1), partial))
}

impl Sim<'_> {
    /// Queues `ev` at `t`; returns its sequence number.
    fn push(&mut self, t: u64, ev: Ev) -> u64 {
        self.seq += 1;
        self.q.push(ev.key(t, self.seq));
        self.seq
    }

    fn jitter(&mut self, mean: u64) -> u64 {
        // uniform in [0.75, 1.25) x mean
        mean * 3 / 4 + self.rng.below(mean / 2 + 1)
    }

    fn setup(&mut self) -> crate::Result<()> {
        let w = self.cfg.workload;
        for vm in 0..self.cfg.vms {
            let g = self.s.create_group(&format!("vm{vm}"))?;
            for k in 0..self.cfg.vcpus {
                let policy = match w {
                    SimWorkload::Cyclic | SimWorkload::Transcode => Policy::Fifo(defs::RT_PRIO),
                    _ => Policy::Fair(1024),
                };
                let mut spec = TaskSpec::new(format!("vm{vm}/vcpu{k}"))
                    .policy(policy)
                    .group(g);
                if w == SimWorkload::Transcode {
                    let topo = self.s.topology().clone();
                    let cores = self.cfg.vcpus.div_ceil(2);
                    spec = spec.affinity(defs::transcode_cpus(&topo, vm, cores));
                }
                let id = self.s.add_task(&spec, 0)?;
                let n = self.tasks.len() as u32;
                self.tasks.push(Task {
                    vm: vm as u32,
                    idx: k as u32,
                    ..Task::default()
                });
                self.ids.push(id);
                if self.index.len() <= id.0 as usize {
                    self.index.resize(id.0 as usize + 1, u32::MAX);
                }
                self.index[id.0 as usize] = n;
                self.vms[vm].push(n);
            }
        }
        if w == SimWorkload::Messaging {
            let receivers = self.cfg.vcpus - senders(self.cfg.vcpus);
            self.pipes = vec![
                Pipe {
                    reader_waits: true,
                    ..Pipe::default()
                };
                self.cfg.vms * receivers
            ];
        }
        for n in 0..self.tasks.len() as u32 {
            let t = self.tasks[n as usize];
            match w {
                SimWorkload::Cyclic => {
                    let off = self.rng.below(PERIOD_NS);
                    self.push(off, Ev::Timer { task: n });
                }
                // receivers wait for their first message
                SimWorkload::Messaging if t.idx as usize >= senders(self.cfg.vcpus) => {}
                // one token per pair of tasks
                SimWorkload::Pingpong if t.idx % 2 == 1 => {}
                // workers wait for their first request
                SimWorkload::Runq if t.idx > 0 => {}
                _ => {
                    let at = 1 + n as u64;
                    self.push(at, Ev::Timer { task: n });
                }
            }
        }
        for c in 0..self.cpus.len() as u32 {
            self.push(TICK_NS + c as u64, Ev::Tick { cpu: c });
        }
        self.push(CHECK_NS, Ev::Check);
        Ok(())
    }

    /// One core call on `cpu` at `now`: returns its result and when it
    /// ends in virtual time.
    fn call<R>(
        &mut self,
        cpu: u32,
        now: u64,
        instr: u64,
        f: impl FnOnce(&Scheduler, u64) -> R,
    ) -> (R, u64) {
        recorder::start();
        let r = f(&self.s, now);
        recorder::stop_into(&mut self.buf);
        // Accesses in program order; consecutive loads overlap in groups
        // of the core's miss buffers (`mlp`), everything else waits for
        // what came before it.
        let mlp = self.coh.cost().mlp.max(1);
        let mut t = now + instr;
        let (mut group_end, mut in_group) = (t, 0);
        for i in 0..self.buf.len() {
            let a = self.buf[i];
            let line = self.line_of(a.addr);
            if a.kind == Kind::Load {
                let d = self.coh.access(cpu, line, a.kind, t) + INSTR.per_access_ns;
                group_end = group_end.max(d);
                in_group += 1;
                if in_group == mlp {
                    t = group_end;
                    in_group = 0;
                }
            } else {
                t = t.max(group_end);
                t = self.coh.access(cpu, line, a.kind, t) + INSTR.per_access_ns;
                group_end = t;
                in_group = 0;
            }
        }
        t = t.max(group_end);
        self.sched_ns += t - now;
        self.calls += 1;
        let kicked: Vec<CpuId> =
            std::mem::take(&mut *self.kicks.0.lock().unwrap_or_else(|e| e.into_inner()));
        for k in kicked {
            let lat = self.coh.cost().transfer(self.coh.level(cpu, k));
            self.push(t + lat, Ev::Kick { cpu: k });
        }
        (r, t)
    }

    /// The model's line of an address: region number and line offset from
    /// the region's start, so that the allocator's placement of unaligned
    /// buffers (which differs from run to run) cannot change a result;
    /// aligned structures keep exactly their real lines. Addresses in no
    /// region keep their real line, tagged apart.
    fn line_of(&mut self, addr: u64) -> u64 {
        // Keyed by the address itself, not its real line: in an unaligned
        // region two addresses of one real line can be two model lines.
        let slot = ((addr >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            >> (64 - LINE_MEMO.trailing_zeros())) as usize;
        let (k, v) = self.line_memo[slot];
        if k == addr.wrapping_add(1) {
            return v;
        }
        let v = self.line_of_slow(addr);
        self.line_memo[slot] = (addr.wrapping_add(1), v);
        v
    }

    fn line_of_slow(&self, addr: u64) -> u64 {
        let i = self.regions.partition_point(|r| r.0 <= addr);
        if i > 0 {
            let (start, end, _) = self.regions[i - 1];
            if addr < end {
                return ((i as u64) << 40) | ((addr - start) / 64);
            }
        }
        (addr / 64) | (1 << 63)
    }

    fn region_name(&self, line: u64) -> &'static str {
        let i = (line >> 40) as usize;
        if line >> 63 == 0 && i > 0 && i <= self.regions.len() {
            self.regions[i - 1].2
        } else {
            "other"
        }
    }

    fn task_of(&self, id: TaskId) -> usize {
        self.index[id.0 as usize] as usize
    }

    fn wake(&mut self, n: u32, waker: u32, now: u64) -> u64 {
        let id = self.ids[n as usize];
        let (r, t) = self.call(waker, now, INSTR.wake_ns, |s, now| {
            s.wake(id, Some(waker), now)
        });
        // pingpong counts a delivered token; messaging counts reads and
        // transcode frames at their barrier instead
        match r {
            Ok(true) if self.cfg.workload == SimWorkload::Pingpong => self.done += 1,
            Ok(false) if self.cfg.workload != SimWorkload::Transcode => self.absorbed += 1,
            _ => {}
        }
        t
    }

    /// messaging: task `n` on `cpu` writes its next message (sender) or
    /// reads one (receiver) at `now`. Returns when it is done (after the
    /// wake it made, if any), or None if it must wait. The pipes are the
    /// workload's memory, not the scheduler's: they cost nothing here.
    fn pipe_op(&mut self, n: usize, cpu: u32, now: u64) -> Option<u64> {
        let (vcpus, task) = (self.cfg.vcpus, self.tasks[n]);
        let (s, receivers) = (senders(vcpus), vcpus - senders(vcpus));
        let base = task.vm as usize * receivers;
        let idx = task.idx as usize;
        if idx < s {
            let p = base + (task.sent as usize + idx) % receivers;
            let pipe = &mut self.pipes[p];
            if pipe.count as usize >= defs::MESSAGING_PIPE {
                pipe.writers.push_back(n as u32);
                return None;
            }
            pipe.count += 1;
            self.written += 1;
            self.tasks[n].sent = task.sent.wrapping_add(1);
            if std::mem::take(&mut pipe.reader_waits) {
                let reader = self.vms[task.vm as usize][s + (p - base)];
                return Some(self.wake(reader, cpu, now));
            }
            Some(now)
        } else {
            let pipe = &mut self.pipes[base + idx - s];
            if pipe.count == 0 {
                pipe.reader_waits = true;
                return None;
            }
            pipe.count -= 1;
            self.done += 1;
            // one freed slot, one writer woken (Linux's pipes wait
            // exclusively since 5.5, as the thread workload's do)
            match pipe.writers.pop_front() {
                Some(w) => Some(self.wake(w, cpu, now)),
                None => Some(now),
            }
        }
    }

    fn start(&mut self, cpu: u32, id: TaskId, now: u64) {
        let n = self.task_of(id);
        if let Some(f) = self.tasks[n].fired_at.take() {
            let lat = now.saturating_sub(f);
            self.lat_sum += lat;
            self.lat_n += 1;
            self.lat_max = self.lat_max.max(lat);
        }
        // runq's message task computes nothing between its wakeups
        let idle_step = self.cfg.workload == SimWorkload::Runq && self.tasks[n].idx == 0;
        if self.tasks[n].remaining == 0 && !idle_step {
            let w = self.cfg.work_ns.unwrap_or(self.cfg.workload.work_ns());
            self.tasks[n].remaining = self.jitter(w);
        }
        let c = &mut self.cpus[cpu as usize];
        c.curr = Some(id);
        c.burst_start = now;
        let end = now + self.tasks[n].remaining;
        self.cpus[cpu as usize].burst = self.push(end, Ev::BurstEnd { cpu });
    }

    /// Stops the current burst's clock at `now`.
    fn charge(&mut self, cpu: u32, now: u64) {
        let c = &mut self.cpus[cpu as usize];
        c.burst = 0;
        if let Some(id) = c.curr {
            let ran = now.saturating_sub(c.burst_start);
            let n = self.task_of(id);
            let t = &mut self.tasks[n];
            t.remaining = t.remaining.saturating_sub(ran).max(1);
        }
    }

    /// `cpu`'s task, its burst over, wakes `tasks` in order and then calls
    /// `schedule` with `then`. Each wakeup after the first is an event at
    /// the end of the one before, so that what other CPUs do meanwhile
    /// (a kicked CPU draining its wake list) happens in between, as on
    /// hardware; in one handler, a CPU waking eight tasks would finish
    /// and go idle before any of them was seen anywhere.
    fn plan(&mut self, cpu: u32, mut tasks: Vec<u32>, then: Prev, now: u64) {
        tasks.reverse();
        self.cpus[cpu as usize].burst = 0;
        self.plans[cpu as usize] = (tasks, then);
        self.step(cpu, now);
    }

    /// `cpu` is waking tasks one after another: its burst is over, and
    /// what remains is those wakeups and then a `schedule`.
    fn stepping(&self, cpu: u32) -> bool {
        !self.plans[cpu as usize].0.is_empty()
    }

    /// The next wakeup of `cpu`'s plan; after the last, its `schedule`.
    fn step(&mut self, cpu: u32, now: u64) {
        let mut now = now;
        if let Some(w) = self.plans[cpu as usize].0.pop() {
            if self.cfg.workload == SimWorkload::Runq {
                // the request's stamp
                self.tasks[w as usize].fired_at = Some(now);
            }
            now = self.wake(w, cpu, now);
            if !self.plans[cpu as usize].0.is_empty() {
                self.cpus[cpu as usize].free_at = now;
                self.push(now, Ev::Step { cpu });
                return;
            }
        }
        let then = self.plans[cpu as usize].1;
        self.schedule(cpu, then, now);
    }

    fn schedule(&mut self, cpu: u32, prev: Prev, now: u64) {
        let (r, t) = self.call(cpu, now, INSTR.schedule_ns, |s, now| {
            s.schedule(cpu, prev, now)
        });
        self.cpus[cpu as usize].free_at = t;
        match r.expect(crate::exec::CPU_OK) {
            Pick::Same => {
                if let Some(id) = self.cpus[cpu as usize].curr {
                    self.start(cpu, id, t);
                }
            }
            Pick::Switch(id) => self.start(cpu, id, t),
            Pick::Idle => {
                let c = &mut self.cpus[cpu as usize];
                c.curr = None;
                c.burst = 0;
            }
        }
    }

    fn handle(&mut self, t: u64, seq: u64, ev: Ev) {
        match ev {
            Ev::BurstEnd { cpu } => {
                let c = self.cpus[cpu as usize];
                if c.burst != seq {
                    return;
                }
                let Some(id) = c.curr else { return };
                let n = self.task_of(id);
                self.tasks[n].remaining = 0;
                let task = self.tasks[n];
                let vm = &self.vms[task.vm as usize];
                let mut now = t;
                let prev = match self.cfg.workload {
                    SimWorkload::Messaging => match self.pipe_op(n, cpu, now) {
                        Some(t) => {
                            // the pipe took or gave a message: the task
                            // goes on computing; a preemption its wake
                            // caused arrives as a kick, after the wake's
                            // core call
                            self.cpus[cpu as usize].free_at = t;
                            self.start(cpu, id, t);
                            return;
                        }
                        None => Prev::Block,
                    },
                    SimWorkload::Pingpong => {
                        // the partner: tasks 2p and 2p+1 of a VM
                        let next = vm[task.idx as usize ^ 1];
                        now = self.wake(next, cpu, now);
                        Prev::Block
                    }
                    SimWorkload::Cyclic => Prev::Block,
                    SimWorkload::Runq => {
                        let v = task.vm as usize;
                        if task.idx == 0 {
                            // a request for every worker, then wait for
                            // all the answers
                            self.barrier[v] = 0;
                            let workers = self.vms[v][1..].to_vec();
                            self.plan(cpu, workers, Prev::Block, now);
                            return;
                        } else {
                            self.done += 1;
                            self.barrier[v] += 1;
                            if self.barrier[v] as usize == self.vms[v].len() - 1 {
                                let m = self.vms[v][0];
                                now = self.wake(m, cpu, now);
                            }
                        }
                        Prev::Block
                    }
                    SimWorkload::Transcode => {
                        let v = task.vm as usize;
                        self.barrier[v] += 1;
                        if self.barrier[v] as usize == self.vms[v].len() {
                            self.barrier[v] = 0;
                            self.done += 1;
                            let others: Vec<u32> = self.vms[v]
                                .iter()
                                .copied()
                                .filter(|&o| o as usize != n)
                                .collect();
                            self.plan(cpu, others, Prev::Keep, now);
                            return;
                        } else {
                            Prev::Block
                        }
                    }
                };
                self.cpus[cpu as usize].burst = 0;
                self.schedule(cpu, prev, now);
            }
            Ev::Kick { cpu } => {
                if self.stepping(cpu) {
                    // the `schedule` that ends its wakeups does what the
                    // kick asks (drain the wake list, pick again)
                    return;
                }
                let at = t.max(self.cpus[cpu as usize].free_at);
                self.charge(cpu, at);
                self.schedule(cpu, Prev::Keep, at);
            }
            Ev::Tick { cpu } => {
                let at = t.max(self.cpus[cpu as usize].free_at);
                let (_, end) = self.call(cpu, at, INSTR.tick_ns, |s, now| s.tick(cpu, now));
                self.cpus[cpu as usize].free_at = end;
                if self.cpus[cpu as usize].curr.is_some() && !self.stepping(cpu) {
                    // the tick's time delays the running task
                    let c = self.cpus[cpu as usize];
                    let n = self.task_of(c.curr.expect("checked"));
                    let ran = at.saturating_sub(c.burst_start);
                    let left = self.tasks[n].remaining.saturating_sub(ran).max(1);
                    self.cpus[cpu as usize].burst_start = end;
                    self.tasks[n].remaining = left;
                    self.cpus[cpu as usize].burst = self.push(end + left, Ev::BurstEnd { cpu });
                }
                self.push(t + TICK_NS, Ev::Tick { cpu });
            }
            Ev::Timer { task } => {
                let id = self.ids[task as usize];
                let waker = self.s.task_cpu(id).unwrap_or(0);
                if self.cfg.workload == SimWorkload::Cyclic {
                    self.tasks[task as usize].fired_at = Some(t);
                    self.push(t + PERIOD_NS, Ev::Timer { task });
                }
                let (_, end) = self.call(waker, t, INSTR.wake_ns, |s, now| {
                    s.wake(id, Some(waker), now)
                });
                let _ = end;
            }
            Ev::Check => {
                self.checker.observe(&self.s, t);
                self.push(t + CHECK_NS, Ev::Check);
            }
            Ev::Step { cpu } => {
                let at = t.max(self.cpus[cpu as usize].free_at);
                self.step(cpu, at);
            }
        }
    }

    /// messaging: what the pipes must satisfy at any time. Every message
    /// written is read or still in its pipe; none holds more than its
    /// capacity; a reader waits only on an empty pipe.
    fn pipe_violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let held: u64 = self.pipes.iter().map(|p| p.count as u64).sum();
        if self.written != self.done + held && self.cfg.workload == SimWorkload::Messaging {
            v.push(format!(
                "pipes: {} messages written, {} read, {held} held",
                self.written, self.done
            ));
        }
        for (i, p) in self.pipes.iter().enumerate() {
            if p.count as usize > defs::MESSAGING_PIPE || (p.reader_waits && p.count > 0) {
                v.push(format!(
                    "pipe {i}: {} messages, reader waiting: {}",
                    p.count, p.reader_waits
                ));
            }
        }
        v
    }

    fn report(&mut self, topo: &HostTopology, simulated: u64, partial: bool) -> SimReport {
        let w = self.cfg.workload;
        let secs = simulated as f64 / 1e9;
        let metric = match w {
            SimWorkload::Cyclic => {
                if self.lat_n == 0 {
                    f64::NAN
                } else {
                    self.lat_sum as f64 / self.lat_n as f64
                }
            }
            SimWorkload::Pingpong => self.done as f64 / 2.0 / secs,
            // messages read, frames, requests answered
            _ => self.done as f64 / secs,
        };
        let name = |l: u64| self.region_name(l);
        let mut c2c: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (l, st) in self.coh.line_stats() {
            let e = c2c.entry(name(l)).or_default();
            e.0 += st.transfers;
            e.1 += st.cost_ns;
        }
        let mut c2c: Vec<C2cRow> = c2c
            .into_iter()
            .map(|(n, (tr, c))| C2cRow {
                name: n.to_string(),
                transfers: tr,
                cost_ns: c,
            })
            .collect();
        c2c.sort_by(|a, b| b.cost_ns.cmp(&a.cost_ns).then(a.name.cmp(&b.name)));
        let mut locks: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
        for (l, st) in self.coh.lock_stats() {
            let e = locks.entry(name(l)).or_default();
            e.0 += st.acquisitions;
            e.1 += st.contended;
            e.2 += st.wait_ns;
        }
        let mut lockstat: Vec<LockRow> = locks
            .into_iter()
            .map(|(n, (a, c, w))| LockRow {
                name: n.to_string(),
                acquisitions: a,
                contended: c,
                wait_ns: w,
            })
            .collect();
        lockstat.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.name.cmp(&b.name)));
        let mut violations = self.checker.violations.clone();
        violations.extend(self.s.anomalies());
        violations.extend(self.pipe_violations());
        SimReport {
            workload: w.name().to_string(),
            cpus: topo.num_cpus(),
            mitigations: self.cfg.mitigations.to_string(),
            seed: self.cfg.seed,
            simulated_ns: simulated,
            metric,
            metric_name: w.metric().0.to_string(),
            sched_share: self.sched_ns as f64 / (self.cpus.len() as f64 * simulated as f64),
            calls: self.calls,
            sched_ns_per_call: self.sched_ns as f64 / self.calls.max(1) as f64,
            max_latency_ns: self.lat_max,
            violations,
            c2c,
            lockstat,
            partial,
            counters: self.s.counters(),
            absorbed_wakes: self.absorbed,
        }
    }
}

#[cfg(test)]
mod tests;
