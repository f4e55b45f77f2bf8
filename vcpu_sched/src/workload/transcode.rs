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

use super::{
    defs, task_rng, Burst, Metric, Rng, Running, Tally, Window, WorkloadParams, WorkloadResult,
};
use crate::error::Result;
use crate::exec::{Action, Body, Cx, Spawner};
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

/// One of an instance's tasks: a burst per frame; the last to finish a
/// frame starts the next one by waking the others.
struct Task {
    m: Arc<Transcode>,
    vm: Arc<Vm>,
    k: usize,
    burst_us: u64,
    /// Draws each step's compute (`defs::step`).
    rng: Rng,
    /// The frame it works on, and its burst (`None`: waiting for the next
    /// frame after `frame`).
    frame: u64,
    burst: Option<Burst>,
    frames: u64,
}

impl Body for Task {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        let vm = self.vm.clone();
        loop {
            if cx.stopping() {
                self.m.t.publish(&[("frames", self.frames)], None);
                return Action::Exit;
            }
            let Some(b) = self.burst.as_mut() else {
                if vm.frame.load(Ordering::Acquire) == self.frame {
                    return Action::Block;
                }
                self.start_frame();
                continue;
            };
            if !b.run(cx) {
                return Action::Continue;
            }
            if vm.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                vm.remaining.store(vm.ids.len() as u32, Ordering::Release);
                vm.frame.fetch_add(1, Ordering::AcqRel);
                if self.m.w.inside(cx.now()) {
                    self.frames += 1;
                }
                for (j, id) in vm.ids.iter().enumerate() {
                    if j != self.k {
                        if let Some(&id) = id.get() {
                            cx.wake(id);
                        }
                    }
                }
                self.start_frame();
            } else {
                self.burst = None;
            }
        }
    }
}

impl Task {
    /// Starts the burst of the instance's current frame.
    fn start_frame(&mut self) {
        self.frame = self.vm.frame.load(Ordering::Acquire);
        self.burst = Some(Burst::step(self.burst_us, &mut self.rng));
    }
}

pub(super) fn start(p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    let topo = ex.topology().clone();
    let vms = p
        .groups
        .unwrap_or((topo.num_cores() / defs::TRANSCODE_CORES).max(2));
    let per = p.group_size.unwrap_or(defs::TRANSCODE_TASKS);
    let burst_us = p.burst_us.unwrap_or(defs::TRANSCODE_BURST_US);
    let prio = p.prio.unwrap_or(defs::RT_PRIO);
    let me = Arc::new(Transcode {
        w: Window::default(),
        t: Tally::default(),
        tasks: vms * per,
    });
    for g in 0..vms {
        let gid = ex.create_group(&format!("vm{g}"))?;
        let mask = defs::transcode_cpus(&topo, g, defs::TRANSCODE_CORES);
        let vm = Arc::new(Vm {
            remaining: AtomicU32::new(per as u32),
            frame: AtomicU64::new(0),
            ids: (0..per).map(|_| OnceLock::new()).collect(),
        });
        for k in 0..per {
            let spec = TaskSpec::new(format!("vm{g}/t{k}"))
                .policy(Policy::Fifo(prio))
                .affinity(mask)
                .group(gid);
            let mut body = Task {
                m: me.clone(),
                vm: vm.clone(),
                k,
                burst_us,
                rng: task_rng(&[g as u64, k as u64]),
                frame: 0,
                burst: None,
                frames: 0,
            };
            body.start_frame();
            let id = ex.spawn(&spec, Box::new(body))?;
            let _ = vm.ids[k].set(id);
        }
        // tasks that finished their first burst before all ids were known
        for id in vm.ids.iter().filter_map(|i| i.get()) {
            let _ = ex.wake(*id);
        }
    }
    Ok(me)
}
