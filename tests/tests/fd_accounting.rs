//! File descriptors are accounted for: building, running and tearing down
//! micro-guest VMs (each a KVM VM fd, vCPU fds and eventfds) over and over
//! leaves the process with the descriptors it had after the first round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_machine::micro::asm::{Op, Script};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, Placement, Running, VmSet};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// One round: `vms` VMs of 2 vCPUs run to the end on the threads
/// executor, then everything is dropped.
fn round(host: &MicroHost, vms: usize) {
    let script = Script {
        vcpus: vec![vec![Op::Report(1), Op::Wake(1), Op::Done(0)]],
        others: vec![Op::Wait, Op::Report(2), Op::Done(0)],
    };
    let code = script.assemble().expect("assemble");
    let guests = (0..vms)
        .map(|i| {
            let spec = MicroVmSpec::new(format!("fd{i}"), 2, code.clone());
            MicroVm::build(host, &spec)
                .expect("build micro-guest")
                .into_guest(vec![Placement::default()])
        })
        .collect();
    let set = VmSet::new(guests).expect("set");
    let topo = Arc::new(topology::load("host").expect("host topology"));
    let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    o.kind = ExecutorKind::Threads;
    let run = Running::start(&o, set.clone()).expect("start");
    let t0 = Instant::now();
    while set.finished_vms() < vms && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(set.finished_vms(), vms, "VMs still running after 30 s");
    run.stop(Duration::from_secs(20)).expect("stop");
    for vm in set.vms() {
        assert!(vm.failure().is_none(), "{}: {:?}", vm.name, vm.failure());
        assert!(vm.torn_down(), "{} released after its last vCPU", vm.name);
    }
}

#[test]
fn vm_churn_leaks_no_file_descriptors() {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let host = MicroHost::open().expect("/dev/kvm");
    // the first round opens what stays open for the process's life
    round(&host, 4);
    let base = open_fds();
    for _ in 0..20 {
        round(&host, 4);
    }
    let after = open_fds();
    assert!(
        after <= base,
        "80 VMs created and torn down: {base} descriptors open before, {after} after"
    );
}
