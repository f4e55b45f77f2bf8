//! `messaging`: groups of senders and receivers passing messages through
//! bounded pipes, like `hackbench -g G -f F --threads --pipe` and `perf
//! bench sched messaging`.
//!
//! Each group has F senders and F receivers (fair tasks); every sender
//! writes to every receiver's pipe in turn, a receiver reads its pipe. A
//! full pipe blocks the sender, an empty one the receiver, and each side
//! wakes the other (a read wakes one waiting writer): a wakeup per message
//! or so, mostly between CPUs.
//! Defaults: F = 10, one group per 20 CPUs (at least one), pipes of 16
//! messages.
//!
//! Metric: messages per second, higher is better (hackbench reports the
//! time for a fixed number, the inverse).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::{Metric, Running, Tally, Window, WorkloadParams, WorkloadResult};
use crate::error::Result;
use crate::exec::{TaskCtx, ThreadsExecutor};
use crate::task::{GroupId, TaskId, TaskSpec};
use crate::tasks::lock;

const PIPE: usize = super::defs::MESSAGING_PIPE;

#[derive(Default)]
struct PipeInner {
    buf: VecDeque<u64>,
    reader: Option<TaskId>,
    writers: VecDeque<TaskId>,
}

/// A bounded pipe between task bodies.
#[derive(Default)]
pub(crate) struct Pipe {
    inner: Mutex<PipeInner>,
}

impl Pipe {
    /// Writes one message, blocking while full; false if stopping.
    pub(crate) fn send(&self, ctx: &TaskCtx, v: u64) -> bool {
        loop {
            let mut p = lock(&self.inner);
            if p.buf.len() < PIPE {
                p.buf.push_back(v);
                let r = p.reader.take();
                drop(p);
                if let Some(r) = r {
                    ctx.wake(r);
                }
                return true;
            }
            if ctx.stopping() {
                return false;
            }
            if !p.writers.contains(&ctx.id()) {
                p.writers.push_back(ctx.id());
            }
            drop(p);
            ctx.block();
        }
    }

    /// Reads one message, blocking while empty; None if stopping.
    pub(crate) fn recv(&self, ctx: &TaskCtx) -> Option<u64> {
        loop {
            let mut p = lock(&self.inner);
            if let Some(v) = p.buf.pop_front() {
                // One freed slot wakes one writer, as Linux's pipes do
                // since they wait exclusively (5.5): waking them all had
                // every other writer find the pipe full again.
                let w = p.writers.pop_front();
                drop(p);
                if let Some(w) = w {
                    ctx.wake(w);
                }
                return Some(v);
            }
            if ctx.stopping() {
                return None;
            }
            p.reader = Some(ctx.id());
            drop(p);
            ctx.block();
        }
    }
}

struct Messaging {
    w: Window,
    t: Tally,
    tasks: usize,
}

impl Running for Messaging {
    fn window(&self) -> &Window {
        &self.w
    }
    fn finish(&self) -> WorkloadResult {
        let secs = self.w.len() as f64 / 1e9;
        let msgs = self.t.count("received") as f64;
        let rate = if secs > 0.0 { msgs / secs } else { 0.0 };
        let mut extra = BTreeMap::new();
        extra.insert("messages".into(), msgs);
        extra.insert(
            "ns_per_message".into(),
            if msgs > 0.0 { secs * 1e9 / msgs } else { 0.0 },
        );
        WorkloadResult {
            metric: Metric {
                name: "messages_per_s".into(),
                unit: "msg/s".into(),
                value: rate,
                higher_is_better: true,
            },
            extra,
            tasks: self.tasks,
        }
    }
}

pub(super) fn start(p: &WorkloadParams, ex: &ThreadsExecutor) -> Result<Arc<dyn Running>> {
    let n = ex.scheduler().num_cpus();
    let groups = p.groups.unwrap_or((n / 20).max(1));
    let f = p.group_size.unwrap_or(10);
    let me = Arc::new(Messaging {
        w: Window::default(),
        t: Tally::default(),
        tasks: groups * f * 2,
    });
    for g in 0..groups {
        let gid = ex.scheduler().create_group(&format!("msg{g}"))?;
        let pipes: Arc<Vec<Pipe>> = Arc::new((0..f).map(|_| Pipe::default()).collect());
        for r in 0..f {
            let (m, pipes) = (me.clone(), pipes.clone());
            ex.spawn(&spec(format!("g{g}r{r}"), gid), move |ctx| {
                let mut got = 0u64;
                while let Some(_v) = pipes[r].recv(ctx) {
                    if m.w.inside(ctx.now()) {
                        got += 1;
                    }
                }
                m.t.publish(&[("received", got)], None);
            })?;
        }
        for s in 0..f {
            let pipes = pipes.clone();
            ex.spawn(&spec(format!("g{g}s{s}"), gid), move |ctx| {
                let mut i = 0u64;
                'out: loop {
                    for r in 0..f {
                        if !pipes[(r + s) % f].send(ctx, i) {
                            break 'out;
                        }
                        i += 1;
                    }
                }
            })?;
        }
    }
    Ok(me)
}

fn spec(name: String, g: GroupId) -> TaskSpec {
    TaskSpec::new(name).group(g)
}
