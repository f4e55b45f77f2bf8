//! `transcode`: many groups of 8 RT FIFO-99 tasks, each group (a VM)
//! pinned to 4 cores / 8 CPUs, computing in bursts that block, like the
//! multi-instance FFmpeg case of the seeds (60 instances x 8 threads on a
//! 480-CPU Granite Rapids).
//!
//! A frame is one burst on each of the group's 8 tasks; the last to finish
//! starts the next frame by waking the others. All tasks are FIFO 99, so
//! every wakeup goes through cpupri and the RT overload / push / pull
//! machinery. Groups take cores `4g..4g+3` (wrapping), so on hosts with
//! fewer than 4 cores per group they overlap and RT tasks queue. Defaults:
//! one group per 4 cores (at least 2), 8 tasks each, 500 us bursts.
//!
//! Metric: frames per second over all groups, higher is better.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{defs, work, Metric, Running, Tally, Window, WorkloadParams, WorkloadResult};
use crate::error::Result;
use crate::exec::ThreadsExecutor;
use crate::task::{Policy, TaskId, TaskSpec};

struct Transcode {
    w: Window,
    t: Tally,
    tasks: usize,
}

impl Running for Transcode {
    fn window(&self) -> &Window {
        &self.w
    }
    fn finish(&self) -> WorkloadResult {
        let secs = self.w.len() as f64 / 1e9;
        let frames = self.t.count("frames") as f64;
        let mut extra = BTreeMap::new();
        extra.insert("frames".into(), frames);
        WorkloadResult {
            metric: Metric {
                name: "frames_per_s".into(),
                unit: "frames/s".into(),
                value: if secs > 0.0 { frames / secs } else { 0.0 },
                higher_is_better: true,
            },
            extra,
            tasks: self.tasks,
        }
    }
}

struct Vm {
    remaining: AtomicU32,
    frame: AtomicU64,
    ids: Vec<OnceLock<TaskId>>,
}

pub(super) fn start(p: &WorkloadParams, ex: &ThreadsExecutor) -> Result<Arc<dyn Running>> {
    let topo = ex.scheduler().topology().clone();
    let vms = p
        .groups
        .unwrap_or((topo.num_cores() / defs::TRANSCODE_CORES).max(2));
    let per = p.group_size.unwrap_or(defs::TRANSCODE_TASKS);
    let burst = p.burst_us.unwrap_or(defs::TRANSCODE_BURST_US);
    let prio = p.prio.unwrap_or(defs::RT_PRIO);
    let me = Arc::new(Transcode {
        w: Window::default(),
        t: Tally::default(),
        tasks: vms * per,
    });
    for g in 0..vms {
        let gid = ex.scheduler().create_group(&format!("vm{g}"))?;
        let mask = defs::transcode_cpus(&topo, g, defs::TRANSCODE_CORES);
        let vm = Arc::new(Vm {
            remaining: AtomicU32::new(per as u32),
            frame: AtomicU64::new(0),
            ids: (0..per).map(|_| OnceLock::new()).collect(),
        });
        for k in 0..per {
            let (m, v2) = (me.clone(), vm.clone());
            let spec = TaskSpec::new(format!("vm{g}/t{k}"))
                .policy(Policy::Fifo(prio))
                .affinity(mask)
                .group(gid);
            let id = ex.spawn(&spec, move |ctx| {
                let vm = v2;
                let mut frames = 0u64;
                while !ctx.stopping() {
                    let f = vm.frame.load(Ordering::Acquire);
                    work(ctx, burst);
                    if vm.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        vm.remaining.store(vm.ids.len() as u32, Ordering::Release);
                        vm.frame.fetch_add(1, Ordering::AcqRel);
                        if m.w.inside(ctx.now()) {
                            frames += 1;
                        }
                        for (j, id) in vm.ids.iter().enumerate() {
                            if j != k {
                                if let Some(&id) = id.get() {
                                    ctx.wake(id);
                                }
                            }
                        }
                    } else {
                        while vm.frame.load(Ordering::Acquire) == f && !ctx.stopping() {
                            ctx.block();
                        }
                    }
                }
                m.t.publish(&[("frames", frames)], None);
            })?;
            let _ = vm.ids[k].set(id);
        }
        // tasks that finished their first burst before all ids were known
        for id in vm.ids.iter().filter_map(|i| i.get()) {
            let _ = ex.wake(*id);
        }
    }
    Ok(me)
}
