//! virtio-net driven by micro-guests at full rate, without Linux
//! (`vmm_machine::micro::net`), against a host peer on each VM's tap.
//!
//! The test makes its own network namespace with a tap per VM in it and
//! runs everything inside it, so no frame leaves it. `vmm bench net
//! --mode echo --check` on every executor, and at 4x overcommit: the
//! host sends a frame, the guest sends it back with its addresses
//! swapped, and the host compares every byte (a changed frame fails the
//! run, a frame not back within 2 s fails it under `--check`). A hostile
//! driver's transmit buffer outside guest memory puts its device in
//! `NEEDS_RESET` while a VM beside it goes on transmitting.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::vmm_bin;
use vmm_machine::micro::devices::MicroDevice;
use vmm_machine::micro::net::{self, NetMode};
use vmm_machine::micro::{MicroHost, MicroVm, MicroVmSpec};
use vmm_machine::vcpu_body::{ExecOptions, ExecutorKind, GuestVm, Placement, Running, VmSet};

const TAP: &str = "mnet";

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2; scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root: it creates a network namespace)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace with taps `mnet0..` in it (up, IPv6 off so the
/// host stack sends nothing of its own), removed on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str, taps: usize) -> Self {
        let name = format!("vmmtest-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        let n = ns.name.as_str();
        ip(&["-n", n, "link", "set", "lo", "up"]);
        let _ = Command::new("ip")
            .args(["netns", "exec", n, "sysctl", "-qw"])
            .arg("net.ipv6.conf.all.disable_ipv6=1")
            .output();
        for i in 0..taps {
            let t = format!("{TAP}{i}");
            ip(&["-n", n, "tuntap", "add", &t, "mode", "tap"]);
            ip(&["-n", n, "link", "set", &t, "up"]);
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// The CPUs this process may use.
fn cpus() -> usize {
    vcpu_sched::exec::allowed_host_cpus().map_or(1, |v| v.len().max(1))
}

/// `vmm bench net --mode echo --check` with `vms` VMs on `executor`;
/// returns the JSON report.
fn echo(ns: &Netns, executor: &str, vms: usize, frame_bytes: usize) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.json");
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(vmm_bin())
        .args([
            "bench",
            "net",
            "--mode",
            "echo",
            "--check",
            "--tap-prefix",
            TAP,
        ])
        .args(["--vms", &vms.to_string(), "--executor", executor])
        .args(["--frame-bytes", &frame_bytes.to_string(), "--duration", "1"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run vmm");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{executor}, {vms} VMs: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse json")
}

#[test]
fn echo_returns_every_frame_intact_on_every_executor_and_at_4x_overcommit() {
    let n = cpus();
    let ns = Netns::new("mnet", 4 * n);
    let runs = [
        ("workers", n, 60),
        ("threads", n, 1514),
        ("host", n, 1514),
        ("workers", 4 * n, 60),
        ("host", 4 * n, 301),
    ];
    for (executor, vms, bytes) in runs {
        let r = echo(&ns, executor, vms, bytes);
        let x = &r["run"]["extra"];
        let what = format!("{executor}, {vms} VMs, {bytes}-byte frames");
        assert_eq!(x["corrupt"].as_f64(), Some(0.0), "{what}: {x}");
        assert_eq!(x["lost"].as_f64(), Some(0.0), "{what}: {x}");
        let packets = x["packets"].as_f64().unwrap_or(0.0);
        assert!(packets > 0.0, "{what}: no round trip: {x}");
        assert!(
            r["stalled"].as_array().is_some_and(|s| s.is_empty()),
            "{what}: {}",
            r["stalled"]
        );
        eprintln!(
            "{what}: {packets} round trips, p50 {} us, p99 {} us",
            x["rtt_p50_ns"].as_f64().unwrap_or(0.0) / 1e3,
            x["rtt_p99_ns"].as_f64().unwrap_or(0.0) / 1e3
        );
    }
}

#[test]
fn a_missing_tap_is_refused_with_the_fix() {
    let ns = Netns::new("mnet-missing", 1);
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(vmm_bin())
        .args(["bench", "net", "--tap", "mnet0", "--tap", "nosuchtap"])
        .output()
        .expect("run vmm");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nosuchtap") && err.contains("ip tuntap add nosuchtap mode tap"),
        "{err}"
    );
}

/// One-vCPU micro-guests, each `(name, code, tap)` with virtio-net on
/// its tap (this process runs inside the test's namespace).
fn net_vms(specs: Vec<(&'static str, Vec<u8>, &'static str)>) -> Vec<(GuestVm, MicroVmParts)> {
    let host = MicroHost::open().expect("/dev/kvm");
    specs
        .into_iter()
        .map(|(name, code, tap)| {
            let mut spec = MicroVmSpec::new(name, 1, code);
            spec.report_log = 16;
            spec.devices = vec![MicroDevice::Net { tap: tap.into() }];
            let vm = MicroVm::build(&host, &spec).expect("build micro-guest");
            let parts = MicroVmParts {
                io: vm.io.clone(),
                memory: vm.memory.clone(),
            };
            (vm.into_guest(vec![Placement::default()]), parts)
        })
        .collect()
}

struct MicroVmParts {
    io: Arc<vmm_machine::micro::MicroIo>,
    memory: vm_memory::GuestMemoryMmap,
}

/// The hostile case runs in a copy of this test binary that `ip netns
/// exec` starts inside the namespace (a tap is opened by name, and its
/// name is looked up in the namespace's own sysfs).
#[test]
fn a_transmit_buffer_outside_memory_needs_reset_and_the_vm_beside_it_goes_on() {
    let ns = Netns::new("mnet-hostile", 2);
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "hostile_inside_the_namespace",
            "--ignored",
            "--nocapture",
        ])
        .env("MICRO_NET_INSIDE", "1")
        .output()
        .expect("run the test binary");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run inside its namespace by a_transmit_buffer_outside_memory_needs_reset_and_the_vm_beside_it_goes_on"]
fn hostile_inside_the_namespace() {
    if std::env::var_os("MICRO_NET_INSIDE").is_none() {
        return;
    }
    vmm_machine::vcpu::install_kick_signal().expect("kick signal");
    for kind in [ExecutorKind::Workers, ExecutorKind::Host] {
        let bad = net::hostile_tx_outside_memory().expect("program");
        let good = net::program(NetMode::Tx).expect("program");
        let mut built = net_vms(vec![("hostile", bad, "mnet0"), ("sender", good, "mnet1")]);
        let (g_good, good_parts) = built.pop().expect("sender");
        let (g_bad, bad_parts) = built.pop().expect("hostile");
        let set = VmSet::new(vec![g_bad, g_good]).expect("set");
        let topo = Arc::new(topology::load("host").expect("host topology"));
        let mut o = ExecOptions::new(topo, vcpu_sched::exec::CpuMapping::Host);
        o.kind = kind;
        o.mitigations = vcpu_sched::Mitigations::all();
        let run = Running::start(&o, set.clone()).expect("start");
        let t0 = Instant::now();
        while set.vms()[0].live() > 0 && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let frames = |p: &MicroVmParts| {
            vmm_machine::micro::read_u64(&p.memory, vmm_machine::micro::DATA_ADDR + net::FRAMES)
                .unwrap_or(0)
        };
        let at_reset = frames(&good_parts);
        std::thread::sleep(Duration::from_millis(300));
        let later = frames(&good_parts);
        run.stop(Duration::from_secs(20)).expect("stop");
        assert!(
            set.vms()[0].failure().is_none(),
            "{kind}: the hostile VM did not end well: {:?}",
            set.vms()[0].failure()
        );
        let log = bad_parts.io.report_log(0);
        assert_eq!(log.len(), 1, "{kind}: reports {log:x?}");
        assert_ne!(
            log[0] & 0x40,
            0,
            "{kind}: status {:#x} has no NEEDS_RESET",
            log[0]
        );
        assert!(
            set.vms()[1].failure().is_none(),
            "{kind}: the sender failed: {:?}",
            set.vms()[1].failure()
        );
        assert!(
            later > at_reset,
            "{kind}: the sender stopped after the other device's reset ({at_reset} -> {later} frames)"
        );
    }
}

/// `Cpus_allowed_list` of thread `name` of process `pid`, once it exists
/// (`None` after `limit`).
fn thread_cpus(pid: u32, name: &str, limit: Duration) -> Option<String> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            if let Some(c) = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            {
                return Some(c.trim().to_string());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `vmm bench net --io-cpus`: the queue pair's I/O thread
/// (`vm0-net0-q0`) on the pinned vCPU's CPU (`same`) or another one
/// (`other`); without --pin, an input error.
#[test]
fn io_cpus_place_the_queue_pairs_thread_where_asked() {
    let ns = Netns::new("mnet-io", 1);
    let mut placements = vec!["same"];
    if cpus() >= 2 {
        placements.push("other");
    }
    for p in placements {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(vmm_bin())
            .args(["bench", "net", "--tap", "mnet0", "--executor", "host"])
            .args(["--pin", "--io-cpus", p, "--duration", "3"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run vmm");
        // `ip netns exec` execs the command: the child is vmm
        let limit = Duration::from_secs(60);
        // a new thread places itself first thing: read once it is there
        let _ = thread_cpus(child.id(), "vm0-net0-q0", limit);
        std::thread::sleep(Duration::from_millis(200));
        let vcpu = thread_cpus(child.id(), "vcpu0", limit);
        let io = thread_cpus(child.id(), "vm0-net0-q0", limit);
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{p}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (vcpu, io) = (vcpu.expect("vcpu0"), io.expect("vm0-net0-q0"));
        match p {
            "same" => assert_eq!(io, vcpu, "{p}"),
            _ => assert!(io != vcpu && !io.contains([',', '-']), "{p}: {io} / {vcpu}"),
        }
    }
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(vmm_bin())
        .args(["bench", "net", "--tap", "mnet0", "--io-cpus", "same"])
        .output()
        .expect("run vmm");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("give --pin"), "{err}");
}
