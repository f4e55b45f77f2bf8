//! The workloads' defining parameters, shared by every runner: the thread
//! workloads of this module, `vmm bench`'s micro-guests and the simulator
//! (`exec::sim`). A runner that models a workload takes its shape from
//! here, so that "transcode" or "cyclic" means the same tasks, priorities,
//! pinning and compute everywhere, and a result of one runner can be set
//! beside another's.

use crate::cpumask::CpuMask;

/// RT priority of cyclic and transcode tasks (FIFO), as the seeds' RT
/// benchmarks run them (cyclictest and stress-ng at 99, the FFmpeg
/// workers of the cpupri series as FIFO threads).
pub const RT_PRIO: u8 = 99;

/// How much a step's compute varies: every runner draws each step's
/// compute uniformly from `1 - x` to `1 + x` times its mean, `x` =
/// `STEP_JITTER_PCT` / 100 (in whole units: see [`step_range`]). Real tasks never compute for
/// exactly the same time twice; a runner whose steps were all equal (the
/// simulator above all, where nothing else perturbs them) would run its
/// tasks in lockstep and measure phase effects no real run has.
pub const STEP_JITTER_PCT: u64 = 25;

/// The range a step of mean `mean` (any unit) is drawn from: `(lo,
/// span)`, the step being `lo + u` for `u` uniform in `0..span`. Integer
/// arithmetic, so that every runner computes the same bounds, and
/// symmetric about the mean, so that the mean stays `mean` even where it
/// is a few units (a micro-guest's step can be 2 loop iterations): with
/// `d` = `mean` x [`STEP_JITTER_PCT`] / 100, the steps are `mean - d` to
/// `mean + d`. (For a mean divisible by 4, every one the simulator uses,
/// these are the bounds it drew from before the rule was shared.)
pub const fn step_range(mean: u64) -> (u64, u64) {
    let d = mean * STEP_JITTER_PCT / 100;
    (mean - d, 2 * d + 1)
}

/// One step's compute for a mean of `mean`, `below(n)` being the
/// runner's uniform draw from `0..n` (its seeded generator).
pub fn step(mean: u64, below: impl FnOnce(u64) -> u64) -> u64 {
    let (lo, span) = step_range(mean);
    lo + below(span)
}

/// cyclic: timer period, us (1 ms, cyclictest's usual interval).
pub const CYCLIC_PERIOD_US: u64 = 1_000;
/// cyclic: compute per cycle, us.
pub const CYCLIC_BURST_US: u64 = 5;

/// messaging: compute per message, us (hackbench's senders and receivers
/// do little besides the pipe operation).
pub const MESSAGING_BURST_US: u64 = 1;
/// messaging: messages a pipe holds before its writer blocks.
pub const MESSAGING_PIPE: usize = 16;

/// runq: compute per request, us.
pub const RUNQ_BURST_US: u64 = 20;

/// pingpong: compute per handoff, us (a request's handling on each
/// side; no real benchmark defines it).
pub const PINGPONG_BURST_US: u64 = 5;

/// transcode: tasks per instance (VM), as the seed's FFmpeg instances.
pub const TRANSCODE_TASKS: usize = 8;
/// transcode: cores an instance is pinned to.
pub const TRANSCODE_CORES: usize = 4;
/// transcode: compute per task per frame, us.
pub const TRANSCODE_BURST_US: u64 = 500;

/// The CPUs of transcode instance `g`: cores `g*cores .. g*cores+cores-1`
/// (wrapping around the cores), every thread of each. On a topology with
/// no more than `cores` cores, all CPUs.
pub fn transcode_cpus(topo: &topology::HostTopology, g: usize, cores: usize) -> CpuMask {
    let nc = topo.num_cores();
    if nc <= cores {
        return CpuMask::first_n(topo.num_cpus());
    }
    let mut m = CpuMask::empty();
    for k in 0..cores {
        for &c in topo.cpus_of_core(((g * cores + k) % nc) as u32) {
            m.set(c);
        }
    }
    m
}

#[cfg(all(test, not(loom), not(sim)))]
mod tests {
    use super::*;

    /// The steps stay within +-25% of the mean and reach both ends.
    #[test]
    fn steps_spread_over_the_jitter_range() {
        assert_eq!(step_range(1000), (750, 501));
        assert_eq!(step_range(0), (0, 1));
        // small means keep their mean: too small to vary, or symmetric
        assert_eq!(step_range(2), (2, 1));
        assert_eq!(step_range(5), (4, 3));
        let mut r = crate::rng::Rng::new(7);
        let (mut lo, mut hi, mut sum) = (u64::MAX, 0, 0);
        for _ in 0..10_000 {
            let s = step(1000, |n| r.below(n));
            lo = lo.min(s);
            hi = hi.max(s);
            sum += s;
        }
        assert!(
            (750..760).contains(&lo) && (1240..=1250).contains(&hi),
            "{lo}..{hi}"
        );
        let mean = sum as f64 / 10_000.0;
        assert!((mean - 1000.0).abs() < 10.0, "{mean}");
    }
}
