//! The workloads' behaviour: what a task does when its step of compute
//! ends (write or read a pipe, hand the token to its partner, answer a
//! request, meet at a barrier), and the pipes' invariants.

use super::calls::AfterWake;
use super::state::{senders, Sim};
use super::workload::SimWorkload;
use crate::workload::defs;
use crate::{Prev, TaskId};

/// messaging: what a pipe operation leaves its task to do.
enum PipeOp {
    /// Go on computing.
    Done,
    /// Wake this task, then go on computing.
    Wake(u32),
    /// Block.
    Wait,
}

impl Sim<'_> {
    /// Task `n` (`id`) on `cpu` ended its step at `t`: what it does next
    /// (go on computing, wake tasks, block), ending in its CPU's
    /// `schedule` unless it goes on.
    pub(super) fn step_done(&mut self, n: usize, id: TaskId, cpu: u32, t: u64) {
        let task = self.tasks[n];
        let vm = &self.vms[task.vm as usize];
        match self.cfg.workload {
            SimWorkload::Messaging => match self.pipe_op(n) {
                // the pipe took or gave a message: the task goes on
                // computing; a preemption its wake caused arrives as a
                // kick, after the wake's core call
                PipeOp::Done => {
                    self.cpus[cpu as usize].free_at = t;
                    self.start(cpu, id, t);
                }
                PipeOp::Wake(w) => self.wake(w, cpu, t, AfterWake::Continue(id)),
                PipeOp::Wait => self.then_schedule(cpu, Prev::Block, t),
            },
            SimWorkload::Pingpong => {
                // the partner: tasks 2p and 2p+1 of a VM
                let next = vm[task.idx as usize ^ 1];
                self.wake(next, cpu, t, AfterWake::Schedule(Prev::Block));
            }
            SimWorkload::Cyclic => self.then_schedule(cpu, Prev::Block, t),
            SimWorkload::Runq => {
                let v = task.vm as usize;
                if task.idx == 0 {
                    // a request for every worker, then wait for
                    // all the answers
                    self.barrier[v] = 0;
                    let workers = self.vms[v][1..].to_vec();
                    self.plan(cpu, workers, Prev::Block, t);
                } else {
                    self.done += 1;
                    self.barrier[v] += 1;
                    if self.barrier[v] as usize == self.vms[v].len() - 1 {
                        let m = self.vms[v][0];
                        self.wake(m, cpu, t, AfterWake::Schedule(Prev::Block));
                    } else {
                        self.then_schedule(cpu, Prev::Block, t);
                    }
                }
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
                    self.plan(cpu, others, Prev::Keep, t);
                } else {
                    self.then_schedule(cpu, Prev::Block, t);
                }
            }
        }
    }

    /// messaging: task `n` writes its next message (sender) or reads one
    /// (receiver): done, done once it has woken a task, or it must wait.
    /// The pipes are the workload's memory, not the scheduler's: they
    /// cost nothing here.
    fn pipe_op(&mut self, n: usize) -> PipeOp {
        let (vcpus, task) = (self.cfg.vcpus, self.tasks[n]);
        let (s, receivers) = (senders(vcpus), vcpus - senders(vcpus));
        let base = task.vm as usize * receivers;
        let idx = task.idx as usize;
        if idx < s {
            let p = base + (task.sent as usize + idx) % receivers;
            let pipe = &mut self.pipes[p];
            if pipe.count as usize >= defs::MESSAGING_PIPE {
                pipe.writers.push_back(n as u32);
                return PipeOp::Wait;
            }
            pipe.count += 1;
            self.written += 1;
            self.tasks[n].sent = task.sent.wrapping_add(1);
            if std::mem::take(&mut pipe.reader_waits) {
                return PipeOp::Wake(self.vms[task.vm as usize][s + (p - base)]);
            }
            PipeOp::Done
        } else {
            let pipe = &mut self.pipes[base + idx - s];
            if pipe.count == 0 {
                pipe.reader_waits = true;
                return PipeOp::Wait;
            }
            pipe.count -= 1;
            self.done += 1;
            // one freed slot, one writer woken (Linux's pipes wait
            // exclusively since 5.5, as the thread workload's do)
            match pipe.writers.pop_front() {
                Some(w) => PipeOp::Wake(w),
                None => PipeOp::Done,
            }
        }
    }

    /// messaging: what the pipes must satisfy at any time. Every message
    /// written is read or still in its pipe; none holds more than its
    /// capacity; a reader waits only on an empty pipe.
    pub(super) fn pipe_violations(&self) -> Vec<String> {
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
}
