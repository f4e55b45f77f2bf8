//! The simulator's state: the simulated CPUs and tasks, the workloads'
//! own state (pipes, barriers, wakeup plans), the event queue, the
//! coherence model and the counters of the report; how a run sets it up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use topology::HostTopology;

use super::calls::Interleave;
use super::coherence::Coherence;
use super::queue::{Ev, Queue};
use super::workload::{SimConfig, SimWorkload};
use crate::check::InvariantChecker;
use crate::rng::Rng;
use crate::stats::Histogram;
use crate::sync::recorder::Access;
use crate::workload::defs;
use crate::{CpuId, KickCpu, Policy, Prev, SchedConfig, Scheduler, SliceScaling, TaskId, TaskSpec};

/// Records the core's kicks for the event loop.
#[derive(Default)]
pub(super) struct Kicks {
    list: Mutex<Vec<CpuId>>,
    /// Whether `list` may hold any: an interleaved simulation looks after
    /// every access, and almost always finds none.
    any: AtomicBool,
}

impl KickCpu for Kicks {
    fn kick(&self, cpu: CpuId) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cpu);
        self.any.store(true, Ordering::Relaxed);
    }
}

impl Kicks {
    /// Moves the kicks sent since the last call into `out` (cleared first),
    /// in order.
    pub(super) fn take_into(&self, out: &mut Vec<CpuId>) {
        out.clear();
        // a load first: the line stays shared in the common case
        if self.any.load(Ordering::Relaxed) && self.any.swap(false, Ordering::Relaxed) {
            out.append(&mut self.list.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

/// A simulated CPU: its task and its running burst.
#[derive(Clone, Copy, Default)]
pub(super) struct Cpu {
    pub(super) curr: Option<TaskId>,
    /// The sequence number of its running burst's end event; 0 when none
    /// is live (an event whose number differs is stale).
    pub(super) burst: u64,
    pub(super) burst_start: u64,
    pub(super) free_at: u64,
    /// When its current idle period began: its last `schedule` that
    /// found nothing to run (the idle state's depth follows from it:
    /// [`CostTable::idle_exit`](super::CostTable::idle_exit)). The model's
    /// ticks of an idle CPU do not end the period: a tickless kernel
    /// stops the tick of an idle CPU.
    pub(super) idle_since: u64,
    /// While it leaves its idle state for a kick: when that exit ends
    /// (a second kick meanwhile waits for it rather than paying another).
    pub(super) exit_until: u64,
}

/// A simulated task (a vCPU): its VM, its index there, what is left of
/// its step, and when its timer or request fired.
#[derive(Clone, Copy, Default)]
pub(super) struct Task {
    pub(super) vm: u32,
    pub(super) idx: u32,
    pub(super) remaining: u64,
    pub(super) fired_at: Option<u64>,
    /// messaging senders: messages written (which pipe is next).
    pub(super) sent: u32,
}

/// messaging: one receiver's pipe.
#[derive(Clone, Default)]
pub(super) struct Pipe {
    /// Messages in it, at most [`defs::MESSAGING_PIPE`].
    pub(super) count: u32,
    /// The reader found it empty and blocked (a write wakes it).
    pub(super) reader_waits: bool,
    /// Writers that found it full and blocked, in arrival order (a read
    /// wakes the first).
    pub(super) writers: std::collections::VecDeque<u32>,
}

/// messaging: a VM's senders (the rest of its tasks receive).
pub(super) fn senders(vcpus: usize) -> usize {
    vcpus / 2
}

/// The scheduler tick's period.
pub(super) const TICK_NS: u64 = 1_000_000;
/// cyclic's timer period.
pub(super) const PERIOD_NS: u64 = defs::CYCLIC_PERIOD_US * 1000;
/// Slots of the `line_of` memo (a power of two; 1 MiB).
pub(super) const LINE_MEMO: usize = 1 << 16;
/// How often the invariant checker observes the core.
pub(super) const CHECK_NS: u64 = 10_000_000;

/// One simulation: the real core, the simulated machine around it, and
/// what the report counts.
pub(super) struct Sim<'a> {
    /// Shared with the coroutines of interleaved calls.
    pub(super) s: Arc<Scheduler>,
    /// Interleaving's state, when on.
    pub(super) il: Option<Interleave>,
    pub(super) cfg: &'a SimConfig,
    pub(super) kicks: Arc<Kicks>,
    /// The kicks of the last call (a buffer kept between calls).
    pub(super) kicked: Vec<CpuId>,
    pub(super) coh: Coherence,
    pub(super) q: Queue,
    pub(super) seq: u64,
    pub(super) cpus: Vec<Cpu>,
    pub(super) tasks: Vec<Task>,
    pub(super) ids: Vec<TaskId>,
    /// Our task number by task id.
    pub(super) index: Vec<u32>,
    /// Task ids by VM.
    pub(super) vms: Vec<Vec<u32>>,
    /// Per VM: transcode's workers at the barrier; runq's answers.
    pub(super) barrier: Vec<u32>,
    /// messaging: the pipes, VM by VM, one per receiver.
    pub(super) pipes: Vec<Pipe>,
    /// Per CPU: tasks it still has to wake (the next last), and how it
    /// then calls `schedule`.
    pub(super) plans: Vec<(Vec<u32>, Prev)>,
    pub(super) rng: Rng,
    pub(super) buf: Vec<Access>,
    /// Named regions sorted by start: (start, end, name).
    pub(super) regions: Vec<(u64, u64, &'static str)>,
    /// `line_of`'s answers, direct-mapped by address: (address + 1, model
    /// line); 0 marks an empty slot. The same few thousand lines are
    /// looked up over and over, and a binary search over the regions on
    /// every access was a fifth of the run time.
    pub(super) line_memo: Vec<(u64, u64)>,
    pub(super) sched_ns: u64,
    pub(super) calls: u64,
    /// The `schedule` calls alone: (ns, calls), as the threaded executors
    /// time them (`sched_ns_per_call` of `vmm sched-bench`).
    pub(super) schedule_only: (u64, u64),
    pub(super) done: u64,
    /// messaging: messages written.
    pub(super) written: u64,
    pub(super) absorbed: u64,
    /// cyclic: each timer's latency to its task running, ns (the thread
    /// workload's histogram: its p99 is the metric on both sides).
    pub(super) lat: Histogram,
    pub(super) checker: InvariantChecker,
}

impl<'a> Sim<'a> {
    /// A scheduler for `topo` with the run's tasks and groups, every task's
    /// first event queued, and the core's regions named.
    pub(super) fn new(topo: Arc<HostTopology>, cfg: &'a SimConfig) -> crate::Result<Self> {
        let ntasks = cfg.vms.saturating_mul(cfg.vcpus);
        let sc = SchedConfig {
            max_tasks: SchedConfig::default().max_tasks.max(ntasks + 1),
            max_groups: SchedConfig::default().max_groups.max(cfg.vms + 1),
            // the seeds' kick protocol, which the recorded results follow
            lazy_fair_kicks: false,
            // and its RT pull, which waits for a source's lock
            bounded_rt_pull: false,
            // and no busy balance (fair tasks move only into idle CPUs)
            busy_balance: false,
            // and Linux's unscaled fair bounds (6 ms, 0.75 ms, 1 ms)
            fair_slice_scaling: SliceScaling::None,
            ..SchedConfig::default()
        };
        let kicks = Arc::new(Kicks::default());
        let s = Arc::new(Scheduler::new(
            topo.clone(),
            cfg.mitigations,
            sc,
            kicks.clone(),
        )?);
        let mut coh = Coherence::new(&topo, cfg.cost);
        if cfg.interleave {
            coh.set_real_locks();
            coh.set_arbitration(cfg.arbitration);
        }
        let mut sim = Sim {
            il: cfg.interleave.then(|| Interleave::new(topo.num_cpus())),
            coh,
            cpus: vec![Cpu::default(); s.num_cpus()],
            s,
            cfg,
            kicks,
            kicked: Vec::new(),
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
            schedule_only: (0, 0),
            done: 0,
            written: 0,
            absorbed: 0,
            lat: Histogram::new(),
            checker: InvariantChecker::new(50_000_000),
        };
        sim.setup()?;
        sim.name_regions();
        Ok(sim)
    }

    /// Queues `ev` at `t`; returns its sequence number.
    pub(super) fn push(&mut self, t: u64, ev: Ev) -> u64 {
        self.seq += 1;
        self.q.push(ev.key(t, self.seq));
        self.seq
    }

    /// One step's compute: the workloads' shared rule
    /// ([`defs::step`](crate::workload::defs::step)), drawn from the run's
    /// seeded generator.
    pub(super) fn jitter(&mut self, mean: u64) -> u64 {
        crate::workload::defs::step(mean, |n| self.rng.below(n))
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

    pub(super) fn task_of(&self, id: TaskId) -> usize {
        self.index[id.0 as usize] as usize
    }
}
