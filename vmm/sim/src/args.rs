//! The simulator's flags, and what they resolve to before any run: the
//! workload, the topology, the cost table, the mitigation sets and the
//! shape of the VMs ([`Plan`]). Every check on user input happens here,
//! before the first simulated nanosecond.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use cli_common::args::{self as common, ignored};
use cli_common::exit::InputError;
use topology::HostTopology;
use vcpu_sched_sim::exec::sim::{Arbitration, CostTable, SimConfig, SimWorkload};
use vcpu_sched_sim::{Mitigations, SchedError};

/// `vmm sim WORKLOAD ...`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// messaging, cyclic, transcode, pingpong or runq.
    pub workload: String,
    /// Topology: a preset (gnr-2s, spr-2s, icx-2s, clx-2s, genoa-2s,
    /// milan-2s) or an hwloc synthetic string (then give --costs).
    #[arg(long, short, value_name = "PRESET|SPEC")]
    pub topology: String,
    /// The latency table: a preset's (default: --topology's), or a TOML
    /// file of one (as `c2c --out DIR` writes: DIR/costs.toml).
    #[arg(long, value_name = "PRESET|FILE")]
    pub costs: Option<String>,
    /// What a kick of an idle CPU waits for: `off` (nothing), `c1` (the
    /// part's C1 exit: every idle CPU in C1, as on a host tuned for
    /// latency) or `deep` (also the part's deepest core C-state once a CPU
    /// has been idle past its target residency, as on a default BIOS and
    /// kernel). Default: `off` for a preset, what a --costs file says for
    /// a file.
    #[arg(long, value_name = "off|c1|deep", value_parser = idle_states)]
    pub idle_states: Option<IdleStates>,
    /// Scale every latency of the table (sensitivity: 0.5, 1.5); 0.1..=10.
    #[arg(long, value_name = "F", default_value_t = 1.0, value_parser = latency_scale)]
    pub latency_scale: f64,
    /// VMs (task groups); default: enough to fill the CPUs (twice for
    /// messaging; one per 8 CPUs for runq, as `sched-bench runq`); 1..=4096.
    #[arg(long, value_name = "N", value_parser = common::count, allow_negative_numbers = true)]
    pub vms: Option<usize>,
    /// vCPUs (tasks) per VM, 1..=4096 (default 8; 2 for pingpong, which
    /// pairs them and needs an even number; 9 for runq, a message task and
    /// 8 workers; messaging and runq need 2 or more).
    #[arg(long, value_name = "M", value_parser = common::count, allow_negative_numbers = true)]
    pub vcpus: Option<usize>,
    /// Mean compute per step in microseconds, 1..=1000000 (default: the
    /// workload's definition, `vcpu_sched::workload::defs`: messaging 1,
    /// cyclic 5, transcode 500, runq 20; pingpong 5).
    #[arg(long, value_name = "US", value_parser = common::burst_us)]
    pub burst_us: Option<u64>,
    /// Virtual time to simulate: 1s, 200ms, ...; 1ms to 1h.
    #[arg(long, short, default_value = "1s", value_name = "DURATION",
          value_parser = sim_duration, allow_hyphen_values = true)]
    pub duration: Duration,
    /// The workload's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One mitigation set: none, all (default), only:FIX[,FIX..] or
    /// all-but:FIX[,..].
    #[arg(long, short, value_name = "SET", value_parser = mitigations)]
    pub mitigations: Option<Mitigations>,
    /// Compare sets: `seeds` (baseline, each fix alone, all) or a list
    /// `none;all` whose first entry is the baseline. The A/A row is the
    /// baseline with another seed.
    #[arg(long, value_name = "seeds|SET;SET..", conflicts_with = "mitigations")]
    pub compare: Option<String>,
    /// Repetitions (seeds) of every set with --compare (1..=100, default 1).
    #[arg(long, value_name = "N", value_parser = common::reps, allow_negative_numbers = true)]
    pub reps: Option<usize>,
    /// Also write the result as JSON here: a new file (one that exists is
    /// refused, never replaced).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print cache-line transfers and their cost per structure and field.
    #[arg(long)]
    pub c2c: bool,
    /// Interleave the CPUs' core calls at every shared access (transient
    /// states visible, locks granted in order of arrival) instead of
    /// running each call to completion.
    #[arg(long)]
    pub interleave: bool,
    /// With --interleave: who gets a contended cache line next, `nearest`
    /// (the waiter nearest its current owner) or `fifo` (in order of
    /// arrival).
    #[arg(long, value_name = "nearest|fifo", value_parser = arbitration)]
    pub arbitration: Option<Arbitration>,
    /// Print contended acquisitions and wait time per lock class.
    #[arg(long)]
    pub lockstat: bool,
    /// A scaling sweep: `cpus=16,64,192` (the first N CPUs of the
    /// topology), each with every --compare set (or the one set).
    #[arg(long, value_name = "cpus=N,N..")]
    pub sweep: Option<String>,
    /// With --sweep: write the curve as SVG here and as CSV beside it
    /// (FILE.csv); both new files (one that exists is refused).
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub plot: Option<PathBuf>,
    /// Run a simulation estimated over 2 h of real time (otherwise refused
    /// as a likely slip in --duration, --reps, --compare or --sweep).
    #[arg(long)]
    pub long: bool,
}

/// Real seconds one CPU costs per second of virtual time, at most: the
/// slowest measured case, messaging with every fix on gnr-2s, took 51 s
/// for 480 CPUs x 1 s in a release build (`docs/simulator.md`, Speed;
/// `docs/data/sim/speed-1s-gnr-2s.txt`). Cyclic runs about 13x faster,
/// so the estimate is an upper bound.
const SIM_S_PER_CPU_S: f64 = 51.0 / 480.0;

/// How much longer an interleaved run takes: messaging with every fix on
/// gnr-2s, 20 ms, 3.0-3.3x in pairs on the development machine
/// (docs/simulator.md, "Interleaving"), rounded up.
const INTERLEAVE_SLOWDOWN: f64 = 3.5;

/// Refuses a simulation estimated over the limit ([`common::check_work`]):
/// every size of the sweep (or the topology's CPUs) for every cell and
/// repetition.
pub fn check_work(a: &SimArgs, plan: &Plan, sizes: &[usize]) -> Result<(), InputError> {
    let cells = plan.variants.len() + usize::from(a.compare.is_some());
    let runs = cells * a.reps.unwrap_or(1) * sizes.len();
    let cpu_s: f64 = sizes.iter().sum::<usize>() as f64 * a.duration.as_secs_f64();
    let slowdown = if a.interleave {
        INTERLEAVE_SLOWDOWN
    } else {
        1.0
    };
    let estimate = cpu_s * SIM_S_PER_CPU_S * slowdown * (cells * a.reps.unwrap_or(1)) as f64;
    common::check_work(
        &format!(
            "the simulation ({runs} runs of {} virtual on up to {} CPUs)",
            common::format_duration(a.duration),
            sizes.iter().max().copied().unwrap_or(0)
        ),
        Duration::from_secs_f64(estimate.min(1e9)),
        a.long,
        "give a shorter --duration, fewer --reps, --compare sets or --sweep points",
    )
}

fn latency_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.1..=10.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a scale from 0.1 to 10")),
    }
}

fn sim_duration(s: &str) -> Result<Duration, String> {
    let d = common::parse_duration(s)?;
    if d < Duration::from_millis(1) || d > Duration::from_secs(3600) {
        return Err(format!("{s:?}: give 1ms to 1h of virtual time"));
    }
    Ok(d)
}

/// `--mitigations SET` (`Mitigations`' `FromStr`, as `vmm`'s flag).
fn mitigations(s: &str) -> Result<Mitigations, String> {
    s.parse::<Mitigations>().map_err(|e| e.to_string())
}

/// The most points one `--sweep` takes.
pub const MAX_SWEEP_POINTS: usize = 64;

/// `--sweep cpus=N,N..`: the sizes, each at least 2; at most
/// [`MAX_SWEEP_POINTS`] of them.
pub fn parse_sweep(s: &str) -> Result<Vec<usize>, InputError> {
    let points = s.split(',').count();
    if points > MAX_SWEEP_POINTS {
        return Err(InputError(format!(
            "--sweep: {points} points; a sweep takes at most {MAX_SWEEP_POINTS} (each runs \
             every set): give fewer sizes, such as cpus=16,64,192"
        )));
    }
    let bad = || {
        InputError(format!(
            "--sweep {s:?}: give cpus=N,N.. such as cpus=16,64,192"
        ))
    };
    let list = s.strip_prefix("cpus=").ok_or_else(bad)?;
    let v: Vec<usize> = list
        .split(',')
        .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n >= 2))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if v.is_empty() {
        return Err(bad());
    }
    Ok(v)
}

/// What the flags resolve to: everything a run needs but its size and
/// seed.
pub struct Plan {
    /// The workload.
    pub workload: SimWorkload,
    /// The topology.
    pub topo: Arc<HostTopology>,
    /// The memory cost table, scaled.
    pub cost: CostTable,
    /// vCPUs per VM.
    pub vcpus: usize,
    /// VMs, when given (else sized to the CPUs, [`Plan::config`]).
    pub vms: Option<usize>,
    /// The mitigation sets: the one set, or --compare's (two or more).
    pub variants: Vec<Mitigations>,
}

impl Plan {
    /// Checks the flags, in order, and resolves them; a bad one is an
    /// [`InputError`] naming it.
    pub fn from_args(a: &SimArgs) -> Result<Self> {
        let workload = SimWorkload::parse(&a.workload).ok_or_else(|| {
            InputError(format!(
                "workload {:?}: give messaging, cyclic, transcode, pingpong or runq",
                a.workload
            ))
        })?;
        if a.compare.is_none() && a.reps.is_some() {
            return Err(ignored("--reps", "--compare", "a single run").into());
        }
        if a.arbitration.is_some() && !a.interleave {
            return Err(ignored(
                "--arbitration",
                "--interleave",
                "a run whose calls run to completion",
            )
            .into());
        }
        if let Some(path) = &a.json {
            common::check_output_file("--json", path, false)?;
        }
        if let Some(path) = &a.plot {
            common::check_output_file("--plot", path, false)?;
            common::check_output_file("--plot", &path.with_extension("csv"), false)?;
        }
        let topo = load(&a.topology)?;
        let cost = cost_table(a)?;
        let variants = variants(a)?;
        let vcpus = a.vcpus.unwrap_or(match workload {
            SimWorkload::Pingpong => 2,
            SimWorkload::Runq => 9,
            _ => 8,
        });
        check_shape(workload, vcpus)?;
        Ok(Self {
            workload,
            topo,
            cost,
            vcpus,
            vms: a.vms,
            variants,
        })
    }

    /// One run's configuration on `cpus` CPUs: the VMs given, or enough
    /// to fill the CPUs (twice for messaging; one team per 8 CPUs for
    /// runq, as the thread workload's default).
    pub fn config(&self, cpus: usize, a: &SimArgs, seed: u64, mit: Mitigations) -> SimConfig {
        let per = if self.workload == SimWorkload::Messaging {
            2
        } else {
            1
        };
        let fill = if self.workload == SimWorkload::Runq {
            (cpus / 8).max(1)
        } else {
            (cpus * per / self.vcpus).max(1)
        };
        SimConfig {
            workload: self.workload,
            vms: self.vms.unwrap_or(fill),
            vcpus: self.vcpus,
            duration_ns: a.duration.as_nanos() as u64,
            work_ns: a.burst_us.map(|us| us * 1000),
            seed,
            mitigations: mit,
            cost: self.cost,
            interleave: a.interleave,
            arbitration: a.arbitration.unwrap_or(Arbitration::Nearest),
        }
    }
}

fn load(spec: &str) -> Result<Arc<HostTopology>> {
    Ok(Arc::new(
        topology::load(spec)
            .map_err(SchedError::from)
            .map_err(|e| InputError(format!("--topology {spec}: {e}")))?,
    ))
}

/// The latency table of --costs (default --topology's preset), scaled by
/// --latency-scale. --costs names a preset, or a TOML file with every
/// field of [`CostTable`] (what `c2c --out DIR` writes as `DIR/costs.toml`).
fn cost_table(a: &SimArgs) -> Result<CostTable, InputError> {
    let name = a.costs.clone().unwrap_or_else(|| a.topology.clone());
    let preset = CostTable::for_preset(&name).filter(|_| name != "test");
    let is_preset = preset.is_some();
    let table = if a.costs.is_some() && preset.is_none() && looks_like_file(&name) {
        cost_file(&name)?
    } else {
        preset.ok_or_else(|| {
            InputError(format!(
                "no latency table for {name:?}: give --costs with one of gnr-2s, spr-2s, \
                 icx-2s, clx-2s, genoa-2s, milan-2s, or a cost table file (FILE.toml, \
                 as `cargo run -p benches --release --bin c2c -- --out DIR` writes)"
            ))
        })?
    };
    let table = with_idle_states(table, &name, is_preset, a.idle_states)?;
    Ok(table.scaled(a.latency_scale))
}

/// `--idle-states`: which idle states the simulated CPUs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStates {
    /// No idle exit.
    Off,
    /// C1 only.
    C1,
    /// C1, and the deepest core C-state after its target residency.
    Deep,
}

fn idle_states(s: &str) -> Result<IdleStates, String> {
    match s {
        "off" => Ok(IdleStates::Off),
        "c1" => Ok(IdleStates::C1),
        "deep" => Ok(IdleStates::Deep),
        _ => Err(format!(
            "{s:?}: give off (no idle exit), c1 (every idle CPU in C1) or deep (also the \
             part's deepest core C-state after its target residency)"
        )),
    }
}

/// The table's idle exits as --idle-states says: `off` drops them, `c1`
/// keeps C1's (a preset's part's, or the file's) and drops a deep state,
/// `deep` takes the preset's part's (a file must carry its own).
fn with_idle_states(
    table: CostTable,
    name: &str,
    preset: bool,
    states: Option<IdleStates>,
) -> Result<CostTable, InputError> {
    let c1 = |t: CostTable| {
        if preset {
            CostTable {
                idle_exit_ns: CostTable::c1_exit_of(name).unwrap_or(0),
                ..t
            }
        } else {
            t
        }
    };
    match states {
        None => Ok(table),
        Some(IdleStates::Off) => Ok(CostTable {
            idle_exit_ns: 0,
            ..table.with_deep_idle(None)
        }),
        Some(IdleStates::C1) => Ok(c1(table).with_deep_idle(None)),
        Some(IdleStates::Deep) if preset => {
            Ok(c1(table).with_deep_idle(CostTable::deep_idle_of(name)))
        }
        Some(IdleStates::Deep) if table.deep_idle_after_ns == 0 => Err(InputError(format!(
            "--idle-states deep: the cost table {name} has no deep idle state: add \
             deep_idle_after_ns and deep_idle_exit_ns to it (the state's target residency and \
             exit latency, ns), or give --idle-states c1"
        ))),
        Some(IdleStates::Deep) => Ok(table),
    }
}

/// A --costs value that names a file rather than a preset (a preset's
/// name wins over a file of that name in the working directory).
fn looks_like_file(s: &str) -> bool {
    s.contains('/') || s.ends_with(".toml") || std::path::Path::new(s).is_file()
}

/// A cost table from a TOML file, checked.
fn cost_file(path: &str) -> Result<CostTable, InputError> {
    // a regular file of at most 1 MiB (a FIFO or a device is refused,
    // never read)
    let text = topology::user_file::read_text(
        std::path::Path::new(path),
        1 << 20,
        "a cost table file (FILE.toml)",
    )
    .map_err(|e| InputError(format!("--costs {path}: cannot read it: {e}")))?;
    let t: CostTable = toml::from_str(&text).map_err(|e| {
        InputError(format!(
            "--costs {path}: not a cost table: {}. A table names every field: l1_hit_ns, \
             smt_ns, l2_ns, llc_ns, die_ns, package_ns, remote_ns, memory_ns, mlp, \
             lock_spin_ns, futex_wake_ns, wakeup_ns",
            e.message()
        ))
    })?;
    t.check()
        .map_err(|e| InputError(format!("--costs {path}: {e}")))?;
    Ok(t)
}

/// --compare's sets (at least two), or the one --mitigations set.
fn variants(a: &SimArgs) -> Result<Vec<Mitigations>, InputError> {
    let Some(list) = &a.compare else {
        return Ok(vec![a.mitigations.unwrap_or_else(Mitigations::all)]);
    };
    let v = Mitigations::parse_sets(list).map_err(|e| InputError(format!("--compare: {e}")))?;
    if v.len() < 2 {
        return Err(InputError(format!(
            "--compare {list:?}: give at least two sets, e.g. \"none;all\", or seeds"
        )));
    }
    Ok(v)
}

/// The VM shapes a workload cannot run.
fn check_shape(workload: SimWorkload, vcpus: usize) -> Result<(), InputError> {
    let why = match workload {
        SimWorkload::Pingpong if vcpus % 2 != 0 => {
            "pingpong pairs a VM's vCPUs (2p with 2p+1); give an even number"
        }
        SimWorkload::Messaging if vcpus < 2 => {
            "messaging needs a sender and a receiver per VM; give 2 or more"
        }
        SimWorkload::Runq if vcpus < 2 => {
            "runq needs a message task and a worker per VM; give 2 or more"
        }
        _ => return Ok(()),
    };
    Err(InputError(format!("--vcpus {vcpus}: {why}")))
}

/// `--arbitration`.
fn arbitration(s: &str) -> Result<Arbitration, String> {
    match s {
        "nearest" => Ok(Arbitration::Nearest),
        "fifo" => Ok(Arbitration::Fifo),
        _ => Err(format!(
            "'{s}' is no arbitration rule: give nearest (the waiter nearest the line's owner) or fifo (order of arrival)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps() {
        assert_eq!(parse_sweep("cpus=4, 16").unwrap(), vec![4, 16]);
        for bad in ["4,16", "cpus=", "cpus=1", "cpus=4,x"] {
            assert!(
                parse_sweep(bad).unwrap_err().0.contains("cpus=16,64"),
                "{bad}"
            );
        }
    }

    #[test]
    fn flag_values() {
        assert!(latency_scale("0.05").is_err());
        assert_eq!(latency_scale("1.5").unwrap(), 1.5);
        assert!(sim_duration("2h").unwrap_err().contains("1ms to 1h"));
        assert_eq!(sim_duration("20ms").unwrap(), Duration::from_millis(20));
        assert!(mitigations("").unwrap_err().contains("empty"));
        assert_eq!(mitigations("all").unwrap(), Mitigations::all());
    }

    #[test]
    fn shapes() {
        let e = check_shape(SimWorkload::Pingpong, 3).unwrap_err().0;
        assert!(e.contains("--vcpus 3") && e.contains("even"), "{e}");
        assert!(check_shape(SimWorkload::Messaging, 1).is_err());
        assert!(check_shape(SimWorkload::Runq, 1).is_err());
        assert!(check_shape(SimWorkload::Cyclic, 1).is_ok());
    }
}
