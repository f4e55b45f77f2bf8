//! The shared worker pool (`vmm serve`'s executor): VM sets join and leave
//! one running scheduler while others run on, a set that does not fit is
//! refused whole, and a paused VM's vCPUs stay off the CPUs until resumed,
//! on every executor, without waking a vCPU that had halted on its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_machine::micro::asm::{Op, Script};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::VcpuPool;
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};

/// Rounds of a long runner: at least 1.6 s of 200 us sleeps, longer than
/// any test here needs it, and as many as fit in a micro-guest's program.
const LONG: usize = 8_000;

/// A VM whose `vcpus` vCPUs each sleep `rounds` times for 200 us (an exit
/// each), then end.
fn sleeper(host: &MicroHost, name: &str, vcpus: usize, rounds: usize) -> GuestVm {
    let mut ops = Vec::new();
    for _ in 0..rounds {
        ops.push(Op::Compute(1_000));
        ops.push(Op::Sleep(200_000));
    }
    ops.push(Op::Done(0));
    let script = Script {
        vcpus: vec![],
        others: ops,
    };
    build(host, name, vcpus, &script)
}

fn build(host: &MicroHost, name: &str, vcpus: usize, script: &Script) -> GuestVm {
    let code = script.assemble().expect("assemble");
    let spec = MicroVmSpec::new(name, vcpus, code);
    let vm = MicroVm::build(host, &spec).expect("build micro-guest");
    vm.into_guest(vec![Placement::default()])
}

fn opts(kind: ExecutorKind, max_tasks: usize) -> ExecOptions {
    let topo = Arc::new(topology::load("host").expect("host topology"));
    let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    o.kind = kind;
    o.mitigations = vcpu_sched::Mitigations::all();
    o.sched.max_tasks = max_tasks;
    o.check = Some(vcpu_sched::exec::CheckConfig::default());
    o
}

fn exits(set: &VmSet) -> u64 {
    set.progress_snapshot().iter().sum()
}

/// Waits (at most 20 s) until `set` has more than `than` exits.
fn progresses(set: &VmSet, than: u64, what: &str) -> u64 {
    let t0 = Instant::now();
    loop {
        let n = exits(set);
        if n > than {
            return n;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{what}: no progress"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn wait_finished(set: &VmSet, what: &str) {
    let t0 = Instant::now();
    while set.finished_vms() < set.vms().len() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: not finished"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Live tasks and task groups (the root group left out) of the pool.
fn census(pool: &VcpuPool) -> (usize, usize) {
    let s = pool.scheduler();
    (s.live_tasks().len(), s.groups().len() - 1)
}

#[test]
fn sets_join_and_leave_a_running_pool() {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let host = MicroHost::open().expect("/dev/kvm");
    let pool = Arc::new(VcpuPool::start(&opts(ExecutorKind::Workers, 64)).expect("pool"));
    assert_eq!(census(&pool), (0, 0));
    // A runs long; B joins while A runs, ends, and leaves.
    let a = VmSet::new_on(vec![sleeper(&host, "a", 3, LONG)], pool.epoch()).unwrap();
    let ra = Running::start_on(&pool, a.clone()).expect("attach a");
    let a0 = progresses(&a, 0, "a");
    assert_eq!(census(&pool), (3, 1));
    let b = VmSet::new_on(vec![sleeper(&host, "b", 2, 20)], pool.epoch()).unwrap();
    let rb = Running::start_on(&pool, b.clone()).expect("attach b");
    assert_eq!(census(&pool), (5, 2));
    wait_finished(&b, "b");
    let out = rb.stop(Duration::from_secs(20)).expect("detach b");
    // every vCPU of b reported, each woken from its sleeps (a timer that
    // fires before its sleeper has blocked is no wakeup, so not all 20)
    assert_eq!(out.tasks.len(), 2);
    for t in &out.tasks {
        let t = t.as_ref().expect("b's task statistics");
        assert!(
            t.wakeups > 0 && t.runs > t.wakeups / 2,
            "{}: {} wakeups, {} runs",
            t.name,
            t.wakeups,
            t.runs
        );
    }
    assert!(b.vms()[0].torn_down(), "b's memory and fds released");
    assert_eq!(census(&pool), (3, 1));
    // A ran on through all of it, and a third set joins the same pool.
    let a1 = progresses(&a, a0, "a after b left");
    let c = VmSet::new_on(vec![sleeper(&host, "c", 1, LONG)], pool.epoch()).unwrap();
    let rc = Running::start_on(&pool, c.clone()).expect("attach c");
    progresses(&c, 0, "c");
    progresses(&a, a1, "a beside c");
    assert_eq!(census(&pool), (4, 2));
    // A set made on another clock, or one that already ran, is refused.
    let other = VmSet::new(vec![sleeper(&host, "x", 1, 1)]).unwrap();
    let e = Running::start_on(&pool, other)
        .err()
        .expect("another clock");
    assert!(e.to_string().contains("another clock"), "{e}");
    let e = Running::start_on(&pool, c.clone()).err().expect("twice");
    assert!(e.to_string().contains("already run"), "{e}");
    // Both long runners stopped from outside, mid-run.
    let oa = ra.stop(Duration::from_secs(20)).expect("detach a");
    assert!(oa.tasks.iter().all(Option::is_some));
    rc.stop(Duration::from_secs(20)).expect("detach c");
    assert_eq!(census(&pool), (0, 0));
    assert!(pool.violations().is_empty(), "{:?}", pool.violations());
    pool.stop();
}

#[test]
fn a_set_that_does_not_fit_is_refused_whole() {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let host = MicroHost::open().expect("/dev/kvm");
    let pool = Arc::new(VcpuPool::start(&opts(ExecutorKind::Workers, 4)).expect("pool"));
    let a = VmSet::new_on(vec![sleeper(&host, "a", 3, LONG)], pool.epoch()).unwrap();
    let ra = Running::start_on(&pool, a.clone()).expect("attach a");
    let b = VmSet::new_on(vec![sleeper(&host, "b", 2, 10)], pool.epoch()).unwrap();
    let e = Running::start_on(&pool, b.clone())
        .err()
        .expect("5 tasks in a scheduler of 4");
    assert!(e.to_string().contains("4"), "{e}");
    // nothing of b stayed behind; a runs on
    assert_eq!(census(&pool), (3, 1));
    let n = exits(&a);
    progresses(&a, n, "a after b was refused");
    ra.stop(Duration::from_secs(20)).expect("detach a");
    assert_eq!(census(&pool), (0, 0));
    assert!(pool.violations().is_empty(), "{:?}", pool.violations());
}

#[test]
fn pause_holds_a_vm_and_resume_wakes_only_what_it_held() {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let host = MicroHost::open().expect("/dev/kvm");
    for kind in [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ] {
        // vCPU 0 sleeps in a loop; vCPU 1 halts until a doorbell that
        // never comes (a resume must not ring it).
        let mut busy = Vec::new();
        for _ in 0..LONG {
            busy.push(Op::Compute(1_000));
            busy.push(Op::Sleep(200_000));
        }
        busy.push(Op::Done(0));
        let script = Script {
            vcpus: vec![busy, vec![Op::Wait, Op::Report(9), Op::Done(0)]],
            others: vec![],
        };
        let set = VmSet::new(vec![build(&host, "p", 2, &script)]).unwrap();
        let run = Running::start(&opts(kind, 4096), set.clone()).expect("start");
        let e0 = progresses(&set, 2, &format!("{kind}"));
        assert!(run.pause(0), "{kind}");
        assert!(!run.pause(0), "{kind}: paused twice");
        assert!(set.vms()[0].paused());
        // the pause's kick lands within a few ms; then nothing runs
        std::thread::sleep(Duration::from_millis(50));
        let held = exits(&set);
        assert!(held >= e0);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(exits(&set), held, "{kind}: a paused vCPU ran");
        assert!(run.resume(0), "{kind}");
        assert!(!run.resume(0), "{kind}: resumed twice");
        progresses(&set, held, &format!("{kind} resumed"));
        // vCPU 1 still waits for its doorbell: 2 live vCPUs
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            set.vms()[0].live(),
            2,
            "{kind}: the resume woke a halted vCPU"
        );
        let out = run.stop(Duration::from_secs(20)).expect("stop");
        assert!(out.violations.is_empty(), "{kind}: {:?}", out.violations);
    }
}
