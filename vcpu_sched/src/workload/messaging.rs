//! `messaging`: groups of senders and receivers passing messages through
//! bounded pipes, like `hackbench -g G -f F --threads --pipe` and `perf
//! bench sched messaging`.
//!
//! Each group has F senders and F receivers (fair tasks); every sender
//! computes and writes to every receiver's pipe in turn, a receiver reads
//! its pipe and computes, per message
//! ([`defs::MESSAGING_BURST_US`](super::defs::MESSAGING_BURST_US), or
//! `burst_us`). A full pipe blocks the sender, an empty one the receiver,
//! and each side wakes the other (a read wakes one waiting writer); a
//! blocked pipe operation is retried after the task's next compute, as
//! the simulator's model has it (its system call finishing).
//! Defaults: F = 10, one group per 20 CPUs (at least one), pipes of 16
//! messages.
//!
//! Metric: messages per second, higher is better (hackbench reports the
//! time for a fixed number, the inverse).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::{task_rng, Burst, Metric, Rng, Running, Tally, Window, WorkloadParams, WorkloadResult};
use crate::error::Result;
use crate::exec::{Action, Body, Cx, Spawner};
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
    /// Writes one message and wakes a waiting reader; false if the pipe is
    /// full, in which case the writer is registered to be woken by the
    /// next read (its body blocks and tries again).
    pub(crate) fn try_send(&self, cx: &Cx<'_>, v: u64) -> bool {
        let mut p = lock(&self.inner);
        if p.buf.len() < PIPE {
            p.buf.push_back(v);
            let r = p.reader.take();
            drop(p);
            if let Some(r) = r {
                cx.wake(r);
            }
            return true;
        }
        if !p.writers.contains(&cx.id()) {
            p.writers.push_back(cx.id());
        }
        false
    }

    /// Reads one message; `None` if the pipe is empty, in which case the
    /// reader is registered to be woken by the next write.
    pub(crate) fn try_recv(&self, cx: &Cx<'_>) -> Option<u64> {
        let mut p = lock(&self.inner);
        if let Some(v) = p.buf.pop_front() {
            // One freed slot wakes one writer, as Linux's pipes do since
            // they wait exclusively (5.5): waking them all had every other
            // writer find the pipe full again.
            let w = p.writers.pop_front();
            drop(p);
            if let Some(w) = w {
                cx.wake(w);
            }
            return Some(v);
        }
        p.reader = Some(cx.id());
        None
    }
}

/// A receiver: reads its pipe and computes per message, counting
/// messages inside the window.
struct Receiver {
    m: Arc<Messaging>,
    pipes: Arc<Vec<Pipe>>,
    r: usize,
    got: u64,
    burst_us: u64,
    /// Draws each step's compute (`defs::step`).
    rng: Rng,
    /// The compute in progress (after a read, or before the retry of one
    /// that blocked).
    burst: Option<Burst>,
}

impl Body for Receiver {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        loop {
            if cx.stopping() {
                self.m.t.publish(&[("received", self.got)], None);
                return Action::Exit;
            }
            if let Some(b) = self.burst.as_mut() {
                if !b.run(cx) {
                    return Action::Continue;
                }
                self.burst = None;
            }
            let got = self.pipes[self.r].try_recv(cx).is_some();
            self.burst = Some(Burst::step(self.burst_us, &mut self.rng));
            if !got {
                return Action::Block;
            }
            if self.m.w.inside(cx.now()) {
                self.got += 1;
            }
            // a read is a system call: its return is a preemption point
            if cx.should_yield() {
                return Action::Continue;
            }
        }
    }
}

/// A sender: computes, then writes the next receiver's pipe of its
/// group, every receiver in turn.
struct Sender {
    pipes: Arc<Vec<Pipe>>,
    s: usize,
    r: usize,
    i: u64,
    burst_us: u64,
    /// Draws each step's compute (`defs::step`).
    rng: Rng,
    /// The compute in progress before the next write.
    burst: Option<Burst>,
}

impl Body for Sender {
    fn enter(&mut self, cx: &Cx<'_>) -> Action {
        let f = self.pipes.len();
        loop {
            if cx.stopping() {
                return Action::Exit;
            }
            let b = self
                .burst
                .get_or_insert_with(|| Burst::step(self.burst_us, &mut self.rng));
            if !b.run(cx) {
                return Action::Continue;
            }
            self.burst = None;
            if !self.pipes[(self.r + self.s) % f].try_send(cx, self.i) {
                return Action::Block;
            }
            self.i += 1;
            self.r = (self.r + 1) % f;
            if cx.should_yield() {
                return Action::Continue;
            }
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

pub(super) fn start(p: &WorkloadParams, ex: &dyn Spawner) -> Result<Arc<dyn Running>> {
    let n = ex.topology().num_cpus();
    let groups = p.groups.unwrap_or((n / 20).max(1));
    let f = p.group_size.unwrap_or(10);
    let burst_us = p.burst_us.unwrap_or(super::defs::MESSAGING_BURST_US);
    let me = Arc::new(Messaging {
        w: Window::default(),
        t: Tally::default(),
        tasks: groups * f * 2,
    });
    for g in 0..groups {
        let gid = ex.create_group(&format!("msg{g}"))?;
        let pipes: Arc<Vec<Pipe>> = Arc::new((0..f).map(|_| Pipe::default()).collect());
        for r in 0..f {
            let body = Receiver {
                m: me.clone(),
                pipes: pipes.clone(),
                r,
                got: 0,
                burst_us,
                rng: task_rng(&[g as u64, 0, r as u64]),
                burst: None,
            };
            ex.spawn(&spec(format!("g{g}r{r}"), gid), Box::new(body))?;
        }
        for s in 0..f {
            let body = Sender {
                pipes: pipes.clone(),
                s,
                r: 0,
                i: 0,
                burst_us,
                rng: task_rng(&[g as u64, 1, s as u64]),
                burst: None,
            };
            ex.spawn(&spec(format!("g{g}s{s}"), gid), Box::new(body))?;
        }
    }
    Ok(me)
}

fn spec(name: String, g: GroupId) -> TaskSpec {
    TaskSpec::new(name).group(g)
}
