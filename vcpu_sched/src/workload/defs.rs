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
