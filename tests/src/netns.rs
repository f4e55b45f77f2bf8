//! A network namespace that a test makes for itself, with a tap device in
//! it, so that no packet of a networked guest leaves the namespace.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;

/// The host's address on the tap (a /24).
pub const HOST_IP: &str = "10.0.2.1";
/// The guest's address, as the kernel's `ip=` sets it.
pub const GUEST_IP: &str = "10.0.2.15";
/// The tap's name inside the namespace.
pub const TAP: &str = "vmmtap0";

/// Runs `ip ARGS`; fails the test with ip's message when it fails.
pub fn ip(args: &[&str]) {
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

/// A network namespace with a multi-queue tap [`TAP`] at [`HOST_IP`]/24
/// and `lo` up; deleted (with the tap) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// `vmmtest-TAG-PID`, replacing a stale one of that name.
    pub fn new(tag: &str) -> Self {
        let name = format!("vmmtest-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        let n = ns.name.as_str();
        ip(&["-n", n, "tuntap", "add", TAP, "mode", "tap", "multi_queue"]);
        ip(&["-n", n, "addr", "add", &format!("{HOST_IP}/24"), "dev", TAP]);
        ip(&["-n", n, "link", "set", TAP, "up"]);
        ip(&["-n", n, "link", "set", "lo", "up"]);
        ns
    }

    /// `ip netns exec NAME PROGRAM`: add the program's arguments.
    pub fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// `queues` descriptors of [`TAP`], opened inside the namespace as
    /// Kata's runtime opens a sandbox's tap (`/dev/net/tun`, `TUNSETIFF`
    /// with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE`), to be
    /// sent to the server with `vm.add-net`. A thread of its own enters the
    /// namespace (`setns` changes only the calling thread's), opens them
    /// there and ends: the descriptors stay attached to the tap.
    pub fn open_tap(&self, queues: usize) -> Vec<OwnedFd> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("the namespace's file");
            // SAFETY: setns on an open namespace descriptor; it changes
            // this (short-lived) thread's network namespace only.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            (0..queues).map(|_| open_tun(TAP)).collect()
        })
        .join()
        .expect("the tap-opening thread")
    }

    /// Pings the guest once a second until it answers (true) or `limit`
    /// passes (false): the kernel prints its `ip=` result before the
    /// first exchange (ARP) has completed, so the counted pings start from
    /// here.
    pub fn wait_reachable(&self, limit: std::time::Duration) -> bool {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            let ok = self
                .exec("ping")
                .args(["-n", "-c", "1", "-W", "1", GUEST_IP])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return true;
            }
        }
        false
    }

    /// `ping -c COUNT -i INTERVAL` the guest from inside the namespace:
    /// the round-trip times of the replies in milliseconds, and ping's
    /// summary lines.
    ///
    /// A late reply is a reply, not a loss: with `-c` alone, ping stops
    /// twice the slowest round trip after its last request, so one reply
    /// held up behind a stalled vCPU (a CI run saw 49 of 50 with a 78 ms
    /// maximum) was counted as lost. `-w` makes it wait until every
    /// request is answered or a deadline 10 s past the last request.
    pub fn ping(&self, count: usize, interval: &str) -> (Vec<f64>, String) {
        let gap: f64 = interval.parse().expect("ping interval in seconds");
        let deadline = (count as f64 * gap).ceil() as u64 + 10;
        let out = self
            .exec("ping")
            .args(["-n", "-c", &count.to_string(), "-i", interval])
            .args(["-w", &deadline.to_string()])
            .arg(GUEST_IP)
            .output()
            .expect("ping (iputils-ping; scripts/setup.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let rtts = text
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.split("time=").nth(1))
            .filter_map(|t| t.split_whitespace().next()?.parse().ok())
            .collect();
        let summary = text.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        (rtts, summary)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// `struct ifreq` with its flags, for `TUNSETIFF`.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A descriptor of tap `name` in this thread's namespace.
fn open_tun(name: &str) -> OwnedFd {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("/dev/net/tun");
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE)
            as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq; `req` is one and
    // outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    assert!(
        r >= 0,
        "TUNSETIFF {name}: {}",
        std::io::Error::last_os_error()
    );
    OwnedFd::from(f)
}
