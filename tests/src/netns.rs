//! A network namespace that a test makes for itself, with a tap device in
//! it, so that no packet of a networked guest leaves the namespace.

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

    /// `ping -c COUNT -i INTERVAL` the guest from inside the namespace:
    /// the round-trip times of the replies in milliseconds, and ping's
    /// summary lines.
    pub fn ping(&self, count: usize, interval: &str) -> (Vec<f64>, String) {
        let out = self
            .exec("ping")
            .args(["-n", "-c", &count.to_string(), "-i", interval, "-W", "10"])
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
