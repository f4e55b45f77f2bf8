//! The named address ranges of the core's shared structures, for the
//! simulator's per-structure report (`vmm sim --c2c`) and its model lines.
//!
//! WHAT: [`of`] lists, for one [`Scheduler`], where each shared structure
//! and field lies in memory (runqueues, tasks, groups, cpupri, RT
//! overload, idle tracking, group load, shared runqueue shards), each
//! layout in the form its fix chose.
//! WHY: the sync layer reports raw addresses; the simulator maps them to a
//! structure's name and to a line counted from the structure's start, so
//! the allocator's placement cannot change a result.
//! HOW: the simulator's own code reading the core's fields (`pub(crate)`):
//! the core carries no hook for it.

use crate::cpupri::CpuPri;
use crate::fixes::cpupri::SplitCpuPri;
use crate::fixes::llcidle::LlcIdleSet;
use crate::fixes::rto::NodeRto;
use crate::group_load::GroupLoad;
use crate::idle::{IdleKind, IdleTracker};
use crate::rto::RtOverload;
use crate::shared_rq::SharedRq;
use crate::Scheduler;

/// A named address range.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// First byte.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// Structure and field, e.g. `cpupri.counts`.
    pub name: &'static str,
}

/// The region of a slice.
fn slice<T>(s: &[T], name: &'static str) -> Region {
    Region {
        start: s.as_ptr() as usize,
        len: std::mem::size_of_val(s),
        name,
    }
}

/// The region of one value.
fn one<T>(v: &T, name: &'static str) -> Region {
    Region {
        start: v as *const T as usize,
        len: size_of::<T>(),
        name,
    }
}

/// Every shared structure of `s`, in no particular order.
pub fn of(s: &Scheduler) -> Vec<Region> {
    let mut out = Vec::new();
    for c in s.cpus.iter() {
        out.push(one(&c.rq, "rq.lock+queues"));
        out.push(one(&c.hot, "rq.hot(idle,curr_pri,need_resched)"));
        out.push(one(&c.wake, "rq.wake_list"));
        out.push(one(&c.stats, "rq.stats"));
    }
    out.push(slice(&s.tasks.slots, "task"));
    out.push(slice(&s.groups.ntasks, "group.ntasks"));
    cpupri(&s.cpupri, &mut out);
    rto(&s.rto, &mut out);
    idle(&s.idle, &mut out);
    group_load(&s.gload, &mut out);
    shared_rq(&s.shared, &mut out);
    out
}

fn cpupri(c: &CpuPri, out: &mut Vec<Region>) {
    match c {
        CpuPri::Flat(f) => {
            out.push(slice(&f.vecs, "cpupri.vec(count+mask)"));
            out.push(slice(&f.cpu_to_pri, "cpupri.cpu_to_pri"));
        }
        CpuPri::Split(s) => cpupri_fix(s, out),
    }
}

/// Fix 1's layout.
fn cpupri_fix(s: &SplitCpuPri, out: &mut Vec<Region>) {
    out.push(slice(&s.counts, "cpupri.counts"));
    out.push(slice(&s.masks, "cpupri.masks"));
    out.push(slice(&s.cpu_to_pri, "cpupri.cpu_to_pri"));
}

fn rto(r: &RtOverload, out: &mut Vec<Region>) {
    match r {
        RtOverload::Flat(f) => {
            out.push(one(&f.rto_count, "rto.count"));
            out.push(one(&f.rto_mask, "rto.mask"));
        }
        RtOverload::PerNode(n) => rto_fix(n, out),
    }
}

/// Fix 2's layout.
fn rto_fix(n: &NodeRto, out: &mut Vec<Region>) {
    out.push(slice(&n.counts, "rto.node_counts"));
    out.push(slice(&n.flags, "rto.node_flags"));
    out.push(slice(&n.masks, "rto.node_masks"));
    out.push(one(&n.read, "rto.root_domain"));
}

fn idle(t: &IdleTracker, out: &mut Vec<Region>) {
    match &t.kind {
        IdleKind::Global(g) => {
            out.push(one(&g.count, "idle.count"));
            out.push(one(&g.mask, "idle.mask"));
        }
        IdleKind::PerLlc(l) => llcidle_fix(l, out),
    }
}

/// Fix 4's layout.
fn llcidle_fix(l: &LlcIdleSet, out: &mut Vec<Region>) {
    out.push(slice(&l.llcs, "idle.per_llc(count+mask)"));
    out.push(one(&l.nr_idle_llcs, "idle.nr_idle_llcs"));
}

fn group_load(g: &GroupLoad, out: &mut Vec<Region>) {
    match g {
        GroupLoad::Shared(s) => out.push(slice(s, "group_load.sum")),
        GroupLoad::PerNode { loads, .. } => out.push(slice(loads, "group_load.per_node")),
    }
}

fn shared_rq(s: &SharedRq, out: &mut Vec<Region>) {
    out.push(slice(&s.shards, "shared_rq.shard(lock+len+list)"));
}
