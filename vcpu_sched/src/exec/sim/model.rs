//! The workloads' behaviour: what a task does when its step of compute
//! ends (write or read a pipe, hand the token to its partner, answer a
//! request, meet at a barrier), and the pipes' invariants.

use super::state::{senders, Sim};
use super::workload::SimWorkload;
use crate::workload::defs;
use crate::{Prev, TaskId};

impl Sim<'_> {
    /// Task `n` (`id`) on `cpu` ended its step at `t`. Returns how `cpu`
    /// then calls `schedule` and when; `None` when the model keeps the CPU
    /// busy itself (the task goes on computing, or the CPU wakes tasks
    /// one by one first).
    pub(super) fn step_done(
        &mut self,
        n: usize,
        id: TaskId,
        cpu: u32,
        t: u64,
    ) -> Option<(Prev, u64)> {
        let task = self.tasks[n];
        let vm = &self.vms[task.vm as usize];
        let mut now = t;
        let prev = match self.cfg.workload {
            SimWorkload::Messaging => match self.pipe_op(n, cpu, now) {
                Some(t) => {
                    // the pipe took or gave a message: the task
                    // goes on computing; a preemption its wake
                    // caused arrives as a kick, after the wake's
                    // core call
                    self.cpus[cpu as usize].free_at = t;
                    self.start(cpu, id, t);
                    return None;
                }
                None => Prev::Block,
            },
            SimWorkload::Pingpong => {
                // the partner: tasks 2p and 2p+1 of a VM
                let next = vm[task.idx as usize ^ 1];
                now = self.wake(next, cpu, now);
                Prev::Block
            }
            SimWorkload::Cyclic => Prev::Block,
            SimWorkload::Runq => {
                let v = task.vm as usize;
                if task.idx == 0 {
                    // a request for every worker, then wait for
                    // all the answers
                    self.barrier[v] = 0;
                    let workers = self.vms[v][1..].to_vec();
                    self.plan(cpu, workers, Prev::Block, now);
                    return None;
                } else {
                    self.done += 1;
                    self.barrier[v] += 1;
                    if self.barrier[v] as usize == self.vms[v].len() - 1 {
                        let m = self.vms[v][0];
                        now = self.wake(m, cpu, now);
                    }
                }
                Prev::Block
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
                    self.plan(cpu, others, Prev::Keep, now);
                    return None;
                } else {
                    Prev::Block
                }
            }
        };
        Some((prev, now))
    }

    /// messaging: task `n` on `cpu` writes its next message (sender) or
    /// reads one (receiver) at `now`. Returns when it is done (after the
    /// wake it made, if any), or None if it must wait. The pipes are the
    /// workload's memory, not the scheduler's: they cost nothing here.
    fn pipe_op(&mut self, n: usize, cpu: u32, now: u64) -> Option<u64> {
        let (vcpus, task) = (self.cfg.vcpus, self.tasks[n]);
        let (s, receivers) = (senders(vcpus), vcpus - senders(vcpus));
        let base = task.vm as usize * receivers;
        let idx = task.idx as usize;
        if idx < s {
            let p = base + (task.sent as usize + idx) % receivers;
            let pipe = &mut self.pipes[p];
            if pipe.count as usize >= defs::MESSAGING_PIPE {
                pipe.writers.push_back(n as u32);
                return None;
            }
            pipe.count += 1;
            self.written += 1;
            self.tasks[n].sent = task.sent.wrapping_add(1);
            if std::mem::take(&mut pipe.reader_waits) {
                let reader = self.vms[task.vm as usize][s + (p - base)];
                return Some(self.wake(reader, cpu, now));
            }
            Some(now)
        } else {
            let pipe = &mut self.pipes[base + idx - s];
            if pipe.count == 0 {
                pipe.reader_waits = true;
                return None;
            }
            pipe.count -= 1;
            self.done += 1;
            // one freed slot, one writer woken (Linux's pipes wait
            // exclusively since 5.5, as the thread workload's do)
            match pipe.writers.pop_front() {
                Some(w) => Some(self.wake(w, cpu, now)),
                None => Some(now),
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
