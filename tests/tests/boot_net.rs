//! virtio-net judged by the guest kernel's network stack and by ping.
//!
//! The test makes its own network namespace with a multi-queue tap in it
//! (10.0.2.1/24) and runs the VMM inside that namespace, so no packet
//! leaves it. The minimal kernel configures eth0 with its own `ip=`
//! autoconfiguration (no user space: guest user space cannot run under
//! kvm_pvm) and waits for a root device that never appears (`rootwait`),
//! which keeps it alive. The host's `ping` (iputils, not this project)
//! then sends 1,000 echo requests from inside the namespace; the guest
//! kernel answers each one from its interrupt path: RX interrupt, NAPI,
//! ICMP, TX notify. Zero loss is required; the round-trip times are
//! printed (p50/p99) for the record, never asserted (timings here are
//! noisy, and kvm_pvm emulates every guest instruction).
//!
//! Both schedulers: `--sched host` with 1 vCPU, one queue pair and the
//! serial console, and `--sched vcpu_sched` with 2 vCPUs, two pairs
//! (every RX interrupt has to wake a vCPU that may sleep in the
//! scheduler) and `--console virtio`: the kernel's console is then
//! `hvc0` (COM1, on stderr, keeps early boot, which precedes the virtio
//! driver), and the `ip=` lines must arrive through the virtio console
//! on stdout.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use integration_tests::guest::guest_images;
use integration_tests::netns::{Netns, GUEST_IP, HOST_IP, TAP};
use integration_tests::vmm_bin;

const MAC: &str = "52:54:00:12:34:56";
const PINGS: usize = 1000;
/// 20 requests a second: a guest under kvm_pvm answers about 40 a
/// second on one vCPU (about a million emulated instructions a second).
const INTERVAL: &str = "0.05";

/// The VMM's console lines, read on a thread.
struct Guest {
    child: Child,
    /// (from stdout, the line).
    lines: mpsc::Receiver<(bool, String)>,
    seen: Vec<String>,
}

impl Guest {
    fn wait_for(&mut self, needle: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            match self.lines.recv_timeout(Duration::from_secs(1)) {
                Ok((stdout, l)) => {
                    let hit = stdout && l.contains(needle);
                    self.seen.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
        false
    }

    fn tail(&self) -> String {
        self.seen[self.seen.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn boot(ns: &Netns, sched: &str, shape: &str, net: &str, console: &str) -> Guest {
    let g = guest_images();
    let cmdline = format!(
        "root=/dev/vda rootwait ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off loglevel=8"
    );
    let mut child = ns
        .exec(vmm_bin().to_str().unwrap())
        .args(["-v", "run", "--sched", sched, "--kernel"])
        .arg(&g.vmlinux)
        .args(["--memory", "256M", "--guest", shape, "--net", net])
        .args(["--console", console])
        .args(["--cmdline", &cmdline, "--timeout", "10m"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the VMM inside the namespace");
    // stdout is the guest's console (hvc0 with --console virtio); stderr
    // the log and, with a virtio console, COM1.
    let (tx, rx) = mpsc::channel();
    for (is_stdout, out) in [
        (
            true,
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        ),
        (false, Box::new(child.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((is_stdout, l)).is_err() {
                    break;
                }
            }
        });
    }
    Guest {
        child,
        lines: rx,
        seen: Vec::new(),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn answers_every_ping(sched: &str, shape: &str, net: &str, pairs: usize, console: &str) {
    let ns = Netns::new(sched);
    let mut g = boot(&ns, sched, shape, net, console);
    // ip= prints "IP-Config: Complete:", then the device line.
    let up = g.wait_for(
        &format!(", ipaddr={GUEST_IP}, mask="),
        Duration::from_secs(9 * 60),
    );
    assert!(up, "eth0 was not configured; console tail:\n{}", g.tail());
    let log = g.seen.join("\n");
    // The guest's own PCI enumeration: a virtio 1.x network device
    // (1af4:1041), class 0x020000 (Ethernet), with its 64 KiB BAR.
    assert!(
        log.contains("[1af4:1041] type 00 class 0x020000"),
        "no virtio-net PCI device in the guest's enumeration:\n{log}"
    );
    assert!(
        log.contains(&format!("hwaddr={MAC}, ipaddr={GUEST_IP}")),
        "eth0 is not configured with the given MAC:\n{log}"
    );
    assert!(
        ns.wait_reachable(Duration::from_secs(60)),
        "no ping answered in 60 s; console tail:\n{}",
        g.tail()
    );
    let (mut rtts, summary) = ns.ping(PINGS, INTERVAL);
    let tail = g.tail();
    drop(g);
    assert_eq!(
        rtts.len(),
        PINGS,
        "{sched}: {} of {PINGS} echo requests answered ({summary}); console tail:\n{tail}",
        rtts.len()
    );
    rtts.sort_by(f64::total_cmp);
    eprintln!(
        "{sched}, {pairs} queue pair(s): {PINGS} pings, 0 lost; rtt p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&rtts, 0.5),
        percentile(&rtts, 0.99),
        rtts[rtts.len() - 1]
    );
}

#[test]
fn the_guest_kernel_answers_1000_pings_under_both_schedulers() {
    answers_every_ping(
        "host",
        "package:1 l3:1 l2:1 core:1 pu:1",
        &format!("tap={TAP},mac={MAC}"),
        1,
        "serial",
    );
    answers_every_ping(
        "vcpu_sched",
        "package:1 l3:1 l2:1 core:2 pu:1",
        &format!("tap={TAP},mac={MAC},num_queues=4"),
        2,
        "virtio",
    );
}
