//! Faults below the guest stay inside their VM: an injected `KVM_RUN`
//! failure, a KVM internal error and a panic of the thread running a vCPU
//! (`vmm_machine::vcpu::inject`) each stop only the VM they hit, with its name and
//! the reason, on every executor, while a bystander VM runs to its end;
//! and under `vmm serve` (micro-guests and a Linux guest) the server
//! stays up and the other VM keeps running and counting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_machine::micro::asm::{Op, Script};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu::inject::{Fault, FaultKind};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};

/// `vcpus` vCPUs that each sleep 100 us `rounds` times, then end.
fn sleeper(host: &MicroHost, name: &str, vcpus: usize, rounds: usize) -> GuestVm {
    let mut ops = Vec::new();
    for _ in 0..rounds {
        ops.push(Op::Compute(500));
        ops.push(Op::Sleep(100_000));
    }
    ops.push(Op::Done(0));
    let code = Script {
        vcpus: vec![],
        others: ops,
    }
    .assemble()
    .expect("assemble");
    MicroVm::build(host, &MicroVmSpec::new(name, vcpus, code))
        .expect("build micro-guest")
        .into_guest(vec![Placement::default()])
}

fn opts(kind: ExecutorKind) -> ExecOptions {
    let topo = Arc::new(topology::load("host").expect("host topology"));
    let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    o.kind = kind;
    o.mitigations = vcpu_sched::Mitigations::all();
    o.check = Some(vcpu_sched::exec::CheckConfig::default());
    o
}

fn expected(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Ioctl => "KVM_RUN failed",
        FaultKind::InternalError => "KVM hit an instruction KVM cannot emulate",
        FaultKind::Panic => "the thread running it panicked: vCPU 1: injected panic",
    }
}

#[test]
fn each_injected_fault_stops_only_its_vm_on_every_executor() {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let host = MicroHost::open().expect("/dev/kvm");
    for exec in [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ] {
        for kind in [FaultKind::Ioctl, FaultKind::InternalError, FaultKind::Panic] {
            let what = format!("{exec}, {kind}");
            // The victim would run for seconds; the fault comes on vCPU
            // 1's 5th entry.
            let mut victim = sleeper(&host, "victim", 2, 5_000);
            victim.vcpus[1].inject(Fault { kind, at: 5 });
            let bystander = sleeper(&host, "bystander", 2, 200);
            let set = VmSet::new(vec![victim, bystander]).expect("set");
            let run = Running::start(&opts(exec), set.clone()).expect("start");
            let t0 = Instant::now();
            while set.finished_vms() < 2 && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(
                set.finished_vms(),
                2,
                "{what}: VMs still running after 30 s"
            );
            let (v, b) = (&set.vms()[0], &set.vms()[1]);
            let why = v
                .failure()
                .unwrap_or_else(|| panic!("{what}: the victim did not fail"))
                .to_string();
            assert!(why.contains(expected(kind)), "{what}: {why}");
            assert!(why.starts_with("vCPU 1"), "{what}: {why}");
            assert!(b.failure().is_none(), "{what}: {:?}", b.failure());
            assert!(v.torn_down() && b.torn_down(), "{what}");
            // the bystander ran all its 200 sleeps on both vCPUs
            let progress = set.progress_snapshot();
            assert!(
                progress[2] > 200 && progress[3] > 200,
                "{what}: {progress:?}"
            );
            let out = run.stop(Duration::from_secs(20)).expect("stop");
            assert!(out.violations.is_empty(), "{what}: {:?}", out.violations);
        }
    }
}
