//! Property tests of the scheduler core: random operation sequences on
//! random topologies (1 to 512 CPUs, built from hwloc synthetic strings)
//! under random mitigation sets, with the invariant checker after every
//! step and a small model of each task's blocked / pending-wake state.
//!
//! A failure shrinks to a minimal topology and operation list; proptest
//! stores its seed in `tests/core_props.proptest-regressions`, which is
//! committed so that the case is replayed first on every run.
//!
//! The public API has no call that changes a live task's policy, priority
//! or group, and no CPU offline/online: those changes are made the way a
//! VMM makes them, by replacing a blocked task with a new one
//! ([`Op::Respawn`]), which moves group load and RT/fair membership.
//!
//! `PROPTEST_CASES` overrides the number of cases (default below).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use vcpu_sched::*;

/// Cases per run: enough to meet every mitigation set several times while
/// keeping the suite near 5 s in the test profile.
const CASES: u32 = 1024;

/// Records kicks, so that a CPU needing attention without a kick (a lost
/// kick) is caught.
#[derive(Default)]
struct RecKick(Mutex<BTreeSet<u32>>);

impl KickCpu for RecKick {
    fn kick(&self, cpu: CpuId) {
        self.0.lock().unwrap().insert(cpu);
    }
}

/// A topology shape: `package:P [numa] l3:A l2:B core:C pu:D`.
#[derive(Clone, Debug)]
struct Shape {
    packages: u32,
    numa: bool,
    l3: u32,
    l2: u32,
    cores: u32,
    pus: u32,
}

impl Shape {
    fn cpus(&self) -> u32 {
        self.packages * self.l3 * self.l2 * self.cores * self.pus
    }

    fn synthetic(&self) -> String {
        format!(
            "package:{}{} l3:{} l2:{} core:{} pu:{}",
            self.packages,
            if self.numa { " [numa]" } else { "" },
            self.l3,
            self.l2,
            self.cores,
            self.pus
        )
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        1u32..=4,
        any::<bool>(),
        1u32..=4,
        1u32..=8,
        1u32..=4,
        1u32..=2,
    )
        .prop_map(|(packages, numa, l3, l2, cores, pus)| Shape {
            packages,
            numa,
            l3,
            l2,
            cores,
            pus,
        })
        .prop_filter("at most 512 CPUs", |s| s.cpus() <= 512)
}

/// Any of the 64 mitigation sets, the named ones (none, all, each alone,
/// all but one) weighted up so that each is met in a normal run.
fn mitigations() -> impl Strategy<Value = Mitigations> {
    let mut named = vec![Mitigations::none(), Mitigations::all()];
    for f in Fix::ALL {
        named.push(Mitigations::only(f));
        named.push(Mitigations::all_but(f));
    }
    let subset = any::<u8>().prop_map(|bits| {
        Fix::ALL
            .iter()
            .enumerate()
            .fold(Mitigations::none(), |m, (i, f)| {
                m.with(*f, bits & (1 << i) != 0)
            })
    });
    prop_oneof![3 => proptest::sample::select(named), 1 => subset]
}

/// A task's policy: fair with a weight, FIFO or RR with a priority.
fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        proptest::sample::select(vec![512u32, 1024, 2048]).prop_map(Policy::Fair),
        (1u8..=99).prop_map(Policy::Fifo),
        (1u8..=99).prop_map(Policy::Rr),
    ]
}

/// One step. Task and CPU numbers are taken modulo the live counts, so a
/// shrunk topology keeps the sequence meaningful.
#[derive(Clone, Debug)]
enum Op {
    /// Wake a task from a managed CPU or (None) from outside.
    Wake { task: u32, waker: Option<u32> },
    /// The CPU's current task blocks.
    Block { cpu: u32 },
    /// The CPU's current task yields.
    Yield { cpu: u32 },
    /// The CPU's current task exits and is removed; a new one replaces it.
    Exit {
        cpu: u32,
        policy: Policy,
        group: u32,
    },
    /// A task's affinity becomes `len` CPUs from `first`.
    Affinity { task: u32, first: u32, len: u32 },
    /// A blocked task is replaced by one with another policy and group
    /// (priority change, RT/fair switch, group move).
    Respawn {
        task: u32,
        policy: Policy,
        group: u32,
    },
    /// A scheduler tick on every CPU (time slices, balancing).
    Tick,
    /// An idle CPU schedules on its own (idle balance, pulls).
    Poke { cpu: u32 },
    /// Time passes without any call.
    Sleep { ns: u32 },
    /// Every kick is delivered.
    Settle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u32>(), proptest::option::of(any::<u32>()))
            .prop_map(|(task, waker)| Op::Wake { task, waker }),
        4 => any::<u32>().prop_map(|cpu| Op::Block { cpu }),
        2 => any::<u32>().prop_map(|cpu| Op::Yield { cpu }),
        1 => (any::<u32>(), policy(), 0u32..4).prop_map(|(cpu, policy, group)| Op::Exit {
            cpu,
            policy,
            group
        }),
        2 => (any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(task, first, len)| Op::Affinity { task, first, len }),
        1 => (any::<u32>(), policy(), 0u32..4).prop_map(|(task, policy, group)| Op::Respawn {
            task,
            policy,
            group
        }),
        2 => Just(Op::Tick),
        1 => any::<u32>().prop_map(|cpu| Op::Poke { cpu }),
        1 => (1u32..50_000_000).prop_map(|ns| Op::Sleep { ns }),
        3 => Just(Op::Settle),
    ]
}

/// What the test knows of a task: whether it is blocked, and whether a
/// wake arrived while it was awake (its next block returns at once).
#[derive(Clone, Copy, Debug, Default)]
struct Model {
    blocked: bool,
    pending: bool,
    group: usize,
}

struct Harness {
    s: Scheduler,
    kicks: Arc<RecKick>,
    now: u64,
    n: u32,
    groups: Vec<GroupId>,
    tasks: BTreeMap<TaskId, Model>,
}

impl Harness {
    fn new(topo: topology::HostTopology, mit: Mitigations, busy_balance: bool) -> Self {
        let kicks = Arc::new(RecKick::default());
        let cfg = SchedConfig {
            busy_balance,
            ..SchedConfig::default()
        };
        let s = Scheduler::new(Arc::new(topo), mit, cfg, kicks.clone()).expect("scheduler");
        let n = s.num_cpus() as u32;
        let mut groups = vec![GroupId::ROOT];
        for i in 0..3 {
            groups.push(s.create_group(&format!("g{i}")).unwrap());
        }
        Harness {
            s,
            kicks,
            now: 1_000,
            n,
            groups,
            tasks: BTreeMap::new(),
        }
    }

    fn spawn(&mut self, policy: Policy, group: u32) -> Result<(), TestCaseError> {
        let g = group as usize % self.groups.len();
        let spec = TaskSpec::new("p").policy(policy).group(self.groups[g]);
        let t = self.s.add_task(&spec, self.now).map_err(fail)?;
        prop_assert_eq!(self.s.task_state(t).map_err(fail)?, TaskState::Blocked);
        self.tasks.insert(
            t,
            Model {
                blocked: true,
                pending: false,
                group: g,
            },
        );
        Ok(())
    }

    fn task(&self, i: u32) -> TaskId {
        let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
        ids[i as usize % ids.len()]
    }

    fn cpu(&self, c: u32) -> CpuId {
        c % self.n
    }

    /// Delivers kicks until no CPU needs attention; every CPU needing
    /// attention must have been kicked, unless all it holds is fair
    /// wakeups deferred to it while it runs a task (lazy kicks), which its
    /// next schedule takes.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..10_000 {
            let kicked = std::mem::take(&mut *self.kicks.0.lock().unwrap());
            let mut need = Vec::new();
            for c in 0..self.n {
                if self.s.needs_attention(c).map_err(fail)? {
                    prop_assert!(
                        kicked.contains(&c) || self.s.only_deferred_wakeups(c).map_err(fail)?,
                        "CPU {} needs attention, never kicked",
                        c
                    );
                    need.push(c);
                }
            }
            if need.is_empty() {
                return Ok(());
            }
            for c in need {
                self.now += 100;
                self.s.schedule(c, Prev::Keep, self.now).map_err(fail)?;
            }
        }
        Err(TestCaseError::fail("the scheduler does not settle"))
    }

    /// The current task of `cpu` leaves it by `prev` (Block or Yield), as
    /// the model expects.
    fn leave(&mut self, cpu: CpuId, prev: Prev) -> Result<(), TestCaseError> {
        let Some(t) = self.s.current(cpu).map_err(fail)? else {
            return Ok(());
        };
        self.s.schedule(cpu, prev, self.now).map_err(fail)?;
        let m = self.tasks.get_mut(&t).expect("current task is live");
        if matches!(prev, Prev::Block) {
            if m.pending {
                m.pending = false;
            } else {
                m.blocked = true;
            }
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.now += 1 + 997;
        match *op {
            Op::Wake { task, waker } => {
                let t = self.task(task);
                let woke = self
                    .s
                    .wake(t, waker.map(|c| self.cpu(c)), self.now)
                    .map_err(fail)?;
                let m = self.tasks.get_mut(&t).unwrap();
                prop_assert_eq!(woke, m.blocked, "wake of {:?} ({:?})", t, m);
                if m.blocked {
                    m.blocked = false;
                } else {
                    m.pending = true;
                }
            }
            Op::Block { cpu } => self.leave(self.cpu(cpu), Prev::Block)?,
            Op::Yield { cpu } => self.leave(self.cpu(cpu), Prev::Yield)?,
            Op::Exit { cpu, policy, group } => {
                let cpu = self.cpu(cpu);
                if let Some(t) = self.s.current(cpu).map_err(fail)? {
                    self.s.schedule(cpu, Prev::Exit, self.now).map_err(fail)?;
                    self.s.remove_task(t).map_err(fail)?;
                    self.tasks.remove(&t);
                    self.spawn(policy, group)?;
                }
            }
            Op::Affinity { task, first, len } => {
                let t = self.task(task);
                let a = self.cpu(first);
                let b = (a as u64 + (len % self.n) as u64).min(self.n as u64 - 1) as u32;
                let mask = CpuMask::from_cpus(a..=b);
                self.s.set_affinity(t, &mask, self.now).map_err(fail)?;
                prop_assert_eq!(self.s.task_affinity(t).map_err(fail)?, mask);
            }
            Op::Respawn {
                task,
                policy,
                group,
            } => {
                let t = self.task(task);
                if self.tasks[&t].blocked {
                    prop_assert_eq!(self.s.task_state(t).map_err(fail)?, TaskState::Blocked);
                    self.s.remove_task(t).map_err(fail)?;
                    self.tasks.remove(&t);
                    self.spawn(policy, group)?;
                } else {
                    // a task that is awake cannot be removed
                    prop_assert!(self.s.remove_task(t).is_err());
                }
            }
            Op::Tick => {
                for c in 0..self.n {
                    self.s.tick(c, self.now).map_err(fail)?;
                }
            }
            Op::Poke { cpu } => {
                let cpu = self.cpu(cpu);
                if self.s.current(cpu).map_err(fail)?.is_none() {
                    self.s.schedule(cpu, Prev::Keep, self.now).map_err(fail)?;
                }
            }
            Op::Sleep { ns } => self.now += ns as u64,
            Op::Settle => {
                self.settle()?;
                self.strict()?;
            }
        }
        // structural invariants hold after every call, settled or not
        let r = self.s.snapshot_check();
        prop_assert!(
            r.violations.is_empty(),
            "after {:?}: {:#?}",
            op,
            r.violations
        );
        prop_assert_eq!(r.live as usize, self.tasks.len());
        Ok(())
    }

    /// The checks that hold only at a quiescent point: no anomaly, no RT
    /// wait, the model's blocked tasks blocked and the others runnable, the
    /// running tasks inside their affinity, the group counts right.
    fn strict(&self) -> Result<(), TestCaseError> {
        let anomalies = self.s.anomalies();
        prop_assert!(anomalies.is_empty(), "{:?}", anomalies);
        let r = self.s.snapshot_check();
        prop_assert!(r.violations.is_empty(), "{:#?}", r.violations);
        prop_assert!(
            r.rt_waits.is_empty(),
            "RT waits at a quiescent point: {:#?}\n{}",
            r.rt_waits,
            self.s.dump()
        );
        for (t, m) in &self.tasks {
            let st = self.s.task_state(*t).map_err(fail)?;
            if m.blocked {
                prop_assert_eq!(st, TaskState::Blocked, "{:?}", t);
            } else {
                prop_assert!(
                    matches!(st, TaskState::Queued | TaskState::Running),
                    "{:?} awake but {:?}",
                    t,
                    st
                );
            }
        }
        for c in 0..self.n {
            if let Some(t) = self.s.current(c).map_err(fail)? {
                let out = self.s.running_outside_affinity(c, t).map_err(fail)?;
                prop_assert!(out.is_none(), "{:?} on CPU {} outside {:?}", t, c, out);
            }
        }
        let infos = self.s.groups();
        for (i, g) in self.groups.iter().enumerate() {
            let want = self.tasks.values().filter(|m| m.group == i).count() as u32;
            let got = infos.iter().find(|x| x.id == *g).map(|x| x.tasks);
            prop_assert_eq!(got, Some(want), "tasks of group {:?}", g);
        }
        Ok(())
    }

    /// Everybody blocks; nothing is lost and every CPU ends idle.
    fn wind_down(&mut self) -> Result<(), TestCaseError> {
        self.settle()?;
        for _ in 0..10_000 {
            let mut any = false;
            for c in 0..self.n {
                if self.s.current(c).map_err(fail)?.is_some() {
                    any = true;
                    self.now += 10;
                    self.leave(c, Prev::Block)?;
                }
            }
            self.settle()?;
            if !any {
                break;
            }
        }
        self.strict()?;
        let r = self.s.snapshot_check();
        prop_assert_eq!(r.idle_cpus, self.n, "all CPUs idle");
        prop_assert_eq!(r.running + r.queued + r.waking, 0);
        prop_assert!(self.tasks.values().all(|m| m.blocked && !m.pending));
        Ok(())
    }
}

fn fail(e: SchedError) -> TestCaseError {
    TestCaseError::fail(format!("scheduler error: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES),
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_ops_keep_invariants(
        shape in shape(),
        mit in mitigations(),
        busy_balance in any::<bool>(),
        tasks in proptest::collection::vec((policy(), 0u32..4), 1..24),
        ops in proptest::collection::vec(op(), 1..160),
    ) {
        let topo = topology::load(&shape.synthetic())
            .map_err(|e| TestCaseError::fail(format!("{}: {e}", shape.synthetic())))?;
        prop_assert_eq!(topo.num_cpus() as u32, shape.cpus());
        let mut h = Harness::new(topo, mit, busy_balance);
        for (p, g) in tasks {
            h.spawn(p, g)?;
        }
        for op in &ops {
            h.step(op)?;
        }
        h.wind_down()?;
    }
}
