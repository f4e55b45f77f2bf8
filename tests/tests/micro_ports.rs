//! Micro-guests on real KVM vCPUs: every port operation round-trips on
//! every executor, and each kind of bad request (and a triple fault) stops
//! only the VM that made it, with a message naming the problem, while the
//! other VMs of the same process run to the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_machine::micro::asm::{Op, Script};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};

fn guest(
    host: &MicroHost,
    name: &str,
    vcpus: usize,
    script: &Script,
    log: usize,
) -> (GuestVm, Arc<vmm_machine::micro::MicroIo>) {
    let code = script.assemble().expect("assemble");
    let mut spec = MicroVmSpec::new(name, vcpus, code);
    spec.report_log = log;
    let vm = MicroVm::build(host, &spec).expect("build micro-guest");
    let io = vm.io.clone();
    (vm.into_guest(vec![Placement::default()]), io)
}

fn opts(kind: ExecutorKind) -> ExecOptions {
    let topo = Arc::new(topology::load("host").expect("host topology"));
    let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
    o.kind = kind;
    o.check = Some(vcpu_sched::exec::CheckConfig::default());
    o
}

/// Runs until every VM has ended (or 30 s), then stops the executor.
fn run_to_end(
    kind: ExecutorKind,
    vms: Vec<GuestVm>,
) -> (Arc<VmSet>, vmm_machine::vcpu_body::ExecOutcome) {
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    let set = VmSet::new(vms).expect("set");
    let n = set.vms().len();
    let run = Running::start(&opts(kind), set.clone()).expect("start");
    let t0 = Instant::now();
    while set.finished_vms() < n && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        set.finished_vms(),
        n,
        "{kind}: VMs still running after 30 s: {:?}",
        set.vms()
            .iter()
            .filter(|v| v.live() > 0)
            .map(|v| (&v.name, v.live()))
            .collect::<Vec<_>>()
    );
    let out = run.stop(Duration::from_secs(20)).expect("stop");
    assert!(out.violations.is_empty(), "{kind}: {:?}", out.violations);
    (set, out)
}

#[test]
fn every_port_operation_round_trips_on_every_executor() {
    let host = MicroHost::open().expect("/dev/kvm");
    for kind in [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ] {
        let script = Script {
            vcpus: vec![
                vec![
                    Op::Report(7),
                    Op::Compute(10_000),
                    Op::Sleep(300_000),
                    Op::Report(8),
                    Op::Yield,
                    Op::Wake(1),
                    Op::Done(0),
                ],
                vec![Op::Wait, Op::Report(9), Op::Done(0)],
            ],
            others: vec![Op::Report(0xdead_beef), Op::Done(0)],
        };
        let (g, io) = guest(&host, "ports", 3, &script, 8);
        let (set, _out) = run_to_end(kind, vec![g]);
        let vm = &set.vms()[0];
        assert!(vm.failure().is_none(), "{kind}: {:?}", vm.failure());
        assert!(
            vm.torn_down(),
            "{kind}: the VM is released after its last vCPU"
        );
        assert_eq!(io.report_log(0), vec![7, 8], "{kind}");
        assert_eq!(
            io.report_log(1),
            vec![9],
            "{kind}: vCPU 1 ran on after its doorbell"
        );
        assert_eq!(io.report_log(2), vec![0xdead_beef], "{kind}");
        assert_eq!(io.report_sum(0), 15);
        let m = set.take_metrics();
        assert!(
            m[0].sleeps == 1 && m[0].yields == 1 && m[0].wakes_sent == 1,
            "{kind}: {:?}",
            m[0]
        );
        assert_eq!(m[1].blocks, 1, "{kind}: vCPU 1 halted once");
    }
}

#[test]
fn bad_requests_and_crashes_stop_only_their_vm() {
    let host = MicroHost::open().expect("/dev/kvm");
    let bad: Vec<(&str, Vec<Op>, &str)> = vec![
        (
            "badport",
            vec![Op::Out {
                port: 0x80,
                value: 1,
                size: 4,
            }],
            "0x80, which is not a micro-guest port",
        ),
        (
            "narrow",
            vec![Op::Out {
                port: 0xe0,
                value: 1,
                size: 1,
            }],
            "requests are 32-bit writes",
        ),
        ("read", vec![Op::In(0xe0)], "read from I/O port 0xe0"),
        (
            "nowake",
            vec![Op::Wake(5)],
            "WAKE 5: this VM has vCPUs 0..2",
        ),
        ("sleep0", vec![Op::Sleep(0)], "SLEEP 0"),
        (
            "yield1",
            vec![Op::Out {
                port: 0xe3,
                value: 1,
                size: 4,
            }],
            "YIELD 0x1",
        ),
        ("failed", vec![Op::Done(3)], "DONE 3"),
        (
            "mmio",
            vec![Op::Store {
                addr: 0x3000_0000,
                value: 1,
            }],
            "not RAM",
        ),
        ("crash", vec![Op::Crash], "triple"),
    ];
    for kind in [
        ExecutorKind::Workers,
        ExecutorKind::Threads,
        ExecutorKind::Host,
    ] {
        let mut vms = Vec::new();
        // A good VM that keeps working through all the failures.
        let good = Script {
            vcpus: vec![],
            others: (0..50)
                .flat_map(|_| [Op::Sleep(200_000), Op::Report(1)])
                .collect(),
        };
        let (g, good_io) = guest(&host, "good", 2, &good, 0);
        vms.push(g);
        for (name, ops, _) in &bad {
            // vCPU 0 misbehaves; vCPU 1 spins without exits and must be
            // kicked out when its VM stops.
            let s = Script {
                vcpus: vec![ops.clone()],
                others: vec![Op::Spin],
            };
            vms.push(guest(&host, name, 2, &s, 0).0);
        }
        let (set, _) = run_to_end(kind, vms);
        assert!(
            set.vms()[0].failure().is_none(),
            "{kind}: the good VM failed: {:?}",
            set.vms()[0].failure()
        );
        assert_eq!(
            good_io.report_count(0) + good_io.report_count(1),
            100,
            "{kind}: the good VM ran to its end"
        );
        for (i, (name, _, msg)) in bad.iter().enumerate() {
            let vm = &set.vms()[i + 1];
            let r = vm
                .failure()
                .unwrap_or_else(|| panic!("{kind}: VM {name} was not stopped"));
            let text = r.to_string();
            assert!(
                text.to_lowercase().contains(&msg.to_lowercase()),
                "{kind}: VM {name}: {text}"
            );
            assert!(vm.torn_down(), "{kind}: VM {name} was not torn down");
        }
    }
}

/// The micro-guests' step generator (`GuestAsm::seed_steps`,
/// `draw_step`), run by the guest itself: every draw lies in the shared
/// rule's range (`defs::step_range`), the sequence is the xorshift64 the
/// helper documents (recomputed here from the seed and the vCPU index),
/// two vCPUs draw different sequences, and the draws spread over the
/// range around the mean.
#[test]
fn micro_guest_steps_follow_the_shared_rule() {
    use vmm_machine::micro::asm::GuestAsm;
    const MEAN: u64 = 1000;
    const DRAWS: u32 = 400;
    const SEED: u64 = 42;
    let host = MicroHost::open().expect("/dev/kvm");
    let mut g = GuestAsm::new().unwrap();
    g.seed_steps(SEED).unwrap();
    g.raw().mov(iced_x86::code_asm::r12d, DRAWS).unwrap();
    let mut top = g.label();
    g.bind(&mut top).unwrap();
    g.draw_step(MEAN).unwrap();
    g.report_reg(iced_x86::code_asm::ecx).unwrap();
    g.raw().dec(iced_x86::code_asm::r12d).unwrap();
    g.raw().jnz(top).unwrap();
    g.done(0).unwrap();
    let code = g.finish().unwrap();
    let mut spec = MicroVmSpec::new("steps", 2, code);
    spec.report_log = DRAWS as usize;
    let vm = MicroVm::build(&host, &spec).expect("build micro-guest");
    let io = vm.io.clone();
    run_to_end(
        ExecutorKind::Workers,
        vec![vm.into_guest(vec![Placement::default()])],
    );
    let (lo, span) = vcpu_sched::workload::defs::step_range(MEAN);
    let mut logs = Vec::new();
    for vcpu in 0..2u64 {
        let log = io.report_log(vcpu as usize);
        assert_eq!(log.len(), DRAWS as usize, "vCPU {vcpu}");
        // the reference: the helper's seeding and xorshift64 (13, 7, 17)
        let mut x =
            SEED.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ vcpu.wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
        for (i, &got) in log.iter().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let want = (lo + x % span).max(1);
            assert_eq!(u64::from(got), want, "vCPU {vcpu}, draw {i}");
            assert!((lo..lo + span).contains(&want));
        }
        let mean = log.iter().map(|&v| f64::from(v)).sum::<f64>() / log.len() as f64;
        assert!(
            (mean - MEAN as f64).abs() < 30.0,
            "vCPU {vcpu}: mean {mean}"
        );
        let (min, max) = (log.iter().min().unwrap(), log.iter().max().unwrap());
        assert!(*min < 800 && *max > 1200, "vCPU {vcpu}: {min}..{max}");
        logs.push(log);
    }
    assert_ne!(logs[0], logs[1], "two vCPUs drew the same sequence");
}
