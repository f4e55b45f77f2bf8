//! virtio-net on micro-guests: the `net` workload's VMs and the host
//! peer on the other side of each VM's tap.
//!
//! WHAT: each VM has one vCPU and one virtio-net device on a tap of its
//! own (VM `v` on the `v`-th tap), driven by a program of
//! `vmm_machine::micro::net` in one [`NetMode`]; a host thread per tap
//! plays the peer.
//! WHY: packets/s and request/response wakeups through the device model
//! at full rate, without Linux in the guest.
//! HOW: the count the metric is made of depends on who receives:
//! * `tx`: the frames the taps received from the VMM (the interfaces'
//!   `rx_packets`); no peer thread;
//! * `rx`: the frames the guests counted; a peer thread per tap injects
//!   frames through an `AF_PACKET` socket, at most [`RX_WINDOW`] ahead of
//!   what its guest has counted (so the tap's queue never overflows);
//! * `echo`: round trips the peers completed; each peer sends one frame,
//!   waits for it to come back (addresses swapped, every other byte
//!   equal: else it is counted corrupt) and sends the next, timing each
//!   round trip inside the measured window.
//!
//! The caller makes the taps (`ip tuntap add NAME mode tap; ip link set
//! NAME up`), inside a network namespace of its own so that nothing
//! leaves the host.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vcpu_sched::stats::Histogram;
use vm_memory::GuestMemoryMmap;

use vmm_devices::packet::PacketSocket;
use vmm_machine::micro::devices::MicroDevice;
use vmm_machine::micro::net::{self, NetMode, GUEST_MAC, PEER_MAC};
use vmm_machine::micro::{read_u64, MicroError, MicroHost, MicroVm, MicroVmSpec, DATA_ADDR};
use vmm_machine::vcpu_body::GuestVm;

use super::place::VmPlace;
use super::BenchError;

/// Frames an `rx` peer keeps in flight ahead of its guest's count.
pub const RX_WINDOW: u64 = 128;
/// How long an `echo` peer waits for a frame to come back before it
/// counts it lost and sends the next.
pub const ECHO_TIMEOUT: Duration = Duration::from_secs(2);
/// The smallest frame (an Ethernet header, IPv4, UDP and the 8-byte
/// sequence number) and the largest (a 1500-byte MTU).
pub const FRAME_BYTES: std::ops::RangeInclusive<usize> = 50..=1514;

/// The `net` workload's taps and mode.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetOptions {
    /// Taps, one per VM (VM `v` on `taps[v]`).
    pub taps: Vec<String>,
    /// What the guests do.
    pub mode: NetMode,
    /// Ethernet bytes of the frames the host sends (`rx`, `echo`).
    pub frame_bytes: usize,
}

impl Default for NetOptions {
    fn default() -> Self {
        Self {
            taps: Vec::new(),
            mode: NetMode::Echo,
            frame_bytes: 60,
        }
    }
}

fn input(s: String) -> BenchError {
    BenchError::Input(s)
}

/// The fix for a tap that is missing or down.
fn make_tap(name: &str) -> String {
    format!("ip tuntap add {name} mode tap && ip link set {name} up")
}

/// Checks `net`'s shape: one vCPU per VM, a tap per VM, each an
/// existing tap that is up, a frame size that fits.
pub(crate) fn validate(o: &NetOptions, vms: usize, vcpus: usize) -> Result<(), BenchError> {
    if o.taps.is_empty() {
        return Err(input(
            "net needs a tap per VM: give --tap NAME (repeated) or --tap-prefix P (taps P0, P1, ..)"
                .into(),
        ));
    }
    if vcpus != 1 {
        return Err(input(format!(
            "net drives its device from one vCPU per VM: give --vcpus 1 (not {vcpus}), and \
             more --vms (each with its own tap) for more load"
        )));
    }
    if o.taps.len() < vms {
        return Err(input(format!(
            "net gives each VM a tap of its own: {vms} VMs but {} taps; give one --tap per VM",
            o.taps.len()
        )));
    }
    if !FRAME_BYTES.contains(&o.frame_bytes) {
        return Err(input(format!(
            "--frame-bytes {}: give {} to {}",
            o.frame_bytes,
            FRAME_BYTES.start(),
            FRAME_BYTES.end()
        )));
    }
    for t in &o.taps[..vms] {
        let dir = Path::new("/sys/class/net").join(t);
        if !dir.exists() {
            return Err(input(format!(
                "tap {t}: no such network interface; create it first ({})",
                make_tap(t)
            )));
        }
        if !dir.join("tun_flags").exists() {
            return Err(input(format!(
                "{t} is a network interface but not a tap; give taps ({})",
                make_tap(t)
            )));
        }
        let flags = std::fs::read_to_string(dir.join("flags")).unwrap_or_default();
        let up = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap_or(0) & 1;
        if up == 0 {
            return Err(input(format!(
                "tap {t} is down; bring it up: ip link set {t} up"
            )));
        }
    }
    Ok(())
}

/// The `net` workload's VMs, VM `v` at `places[v]`.
pub(crate) fn vms(
    o: &NetOptions,
    places: &[VmPlace],
    host: &MicroHost,
) -> Result<(Vec<GuestVm>, Vec<GuestMemoryMmap>), BenchError> {
    let code = net::program(o.mode)?;
    let mut guests = Vec::with_capacity(places.len());
    let mut memories = Vec::with_capacity(places.len());
    for (v, (tap, p)) in o.taps.iter().zip(places).enumerate() {
        let mut spec = MicroVmSpec::new(format!("vm{v}"), 1, code.clone());
        spec.devices = vec![MicroDevice::Net { tap: tap.clone() }];
        spec.io_cpus = p.io_cpus.clone();
        let vm = MicroVm::build(host, &spec).map_err(|e| match e {
            MicroError::Tap(t) => input(t.to_string()),
            e => e.into(),
        })?;
        memories.push(vm.memory.clone());
        guests.push(vm.into_guest(vec![p.vcpu.clone()]));
    }
    Ok((guests, memories))
}

/// One peer's counters, written by its thread, read by the measuring
/// thread (a line of its own: the peers run on different CPUs).
#[repr(align(64))]
#[derive(Default)]
struct PeerCounters {
    /// `echo`: round trips completed.
    round_trips: AtomicU64,
    /// `echo`: frames that came back changed.
    corrupt: AtomicU64,
    /// `echo`: frames that did not come back in [`ECHO_TIMEOUT`] inside
    /// the window.
    lost: AtomicU64,
    /// `rx`: frames sent.
    sent: AtomicU64,
}

/// What the peers saw, for the report.
#[derive(Clone, Debug, Default)]
pub struct PeerStats {
    /// Round trips completed (echo).
    pub round_trips: u64,
    /// Frames that came back changed (echo).
    pub corrupt: u64,
    /// Frames that did not come back in time, inside the window (echo).
    pub lost: u64,
    /// Frames injected (rx).
    pub sent: u64,
    /// Round-trip times inside the window (echo), ns.
    pub rtt: Histogram,
    /// A peer's error (a socket that failed).
    pub errors: Vec<String>,
}

impl PeerStats {
    /// The report's extras.
    pub fn extras(&self, mode: NetMode) -> Vec<(String, f64)> {
        match mode {
            NetMode::Echo => vec![
                ("corrupt".into(), self.corrupt as f64),
                ("lost".into(), self.lost as f64),
                ("rtt_p50_ns".into(), self.rtt.quantile(0.5) as f64),
                ("rtt_p99_ns".into(), self.rtt.quantile(0.99) as f64),
            ],
            NetMode::Rx => vec![("injected".into(), self.sent as f64)],
            NetMode::Tx => Vec::new(),
        }
    }
}

/// The host side of every VM's tap (see the module docs).
pub(crate) struct Peer {
    mode: NetMode,
    taps: Vec<String>,
    stop: Arc<AtomicBool>,
    window: Arc<AtomicBool>,
    counters: Vec<Arc<PeerCounters>>,
    threads: Vec<JoinHandle<Result<Histogram, String>>>,
}

impl Peer {
    /// Starts the peers of `taps` (one per VM, whose memories are
    /// `memories`).
    pub(crate) fn start(o: &NetOptions, memories: &[GuestMemoryMmap]) -> Result<Self, BenchError> {
        let taps: Vec<String> = o.taps.iter().take(memories.len()).cloned().collect();
        let mut p = Peer {
            mode: o.mode,
            taps: taps.clone(),
            stop: Arc::default(),
            window: Arc::default(),
            counters: Vec::new(),
            threads: Vec::new(),
        };
        if o.mode == NetMode::Tx {
            return Ok(p);
        }
        for (v, (tap, mem)) in taps.iter().zip(memories).enumerate() {
            let sock = PacketSocket::bind(tap, Duration::from_millis(100))
                .map_err(|e| input(e.to_string()))?;
            let c = Arc::new(PeerCounters::default());
            p.counters.push(c.clone());
            let (stop, window, mem) = (p.stop.clone(), p.window.clone(), mem.clone());
            let (mode, bytes) = (o.mode, o.frame_bytes);
            let t = std::thread::Builder::new()
                .name(format!("net-peer{v}"))
                .spawn(move || match mode {
                    NetMode::Rx => inject(&sock, bytes, &mem, &c, &stop).map(|_| Histogram::new()),
                    _ => echo(&sock, bytes, &c, &stop, &window),
                })
                .map_err(|e| BenchError::Failed(format!("starting a net peer thread: {e}")))?;
            p.threads.push(t);
        }
        Ok(p)
    }

    /// Opens or closes the measured window (echo's round-trip times and
    /// losses count inside it only).
    pub(crate) fn set_window(&self, open: bool) {
        self.window.store(open, Ordering::Release);
    }

    /// The count the metric is made of (see the module docs).
    pub(crate) fn count(&self, memories: &[GuestMemoryMmap]) -> u64 {
        match self.mode {
            NetMode::Tx => self.taps.iter().map(|t| tap_rx_packets(t)).sum(),
            NetMode::Rx => memories
                .iter()
                .map(|m| read_u64(m, DATA_ADDR + net::FRAMES).unwrap_or(0))
                .sum(),
            NetMode::Echo => self
                .counters
                .iter()
                .map(|c| c.round_trips.load(Ordering::Acquire))
                .sum(),
        }
    }

    /// Stops the peers and sums what they saw.
    pub(crate) fn stop(self) -> PeerStats {
        self.stop.store(true, Ordering::Release);
        let mut s = PeerStats::default();
        for (t, tap) in self.threads.into_iter().zip(&self.taps) {
            match t.join() {
                Ok(Ok(h)) => s.rtt.merge(&h),
                Ok(Err(e)) => s.errors.push(format!("peer of {tap}: {e}")),
                Err(_) => s.errors.push(format!("peer of {tap}: the thread panicked")),
            }
        }
        for c in &self.counters {
            s.round_trips += c.round_trips.load(Ordering::Acquire);
            s.corrupt += c.corrupt.load(Ordering::Acquire);
            s.lost += c.lost.load(Ordering::Acquire);
            s.sent += c.sent.load(Ordering::Acquire);
        }
        s
    }
}

/// What the peers saw that is wrong: changed echoes, lost frames, a
/// failed socket (violations: with `--check` they fail the run).
pub(crate) fn check_peer(p: &PeerStats, violations: &mut Vec<String>) {
    if p.corrupt > 0 {
        violations.push(format!(
            "{} echoed frames came back changed (not the frame sent with its addresses swapped)",
            p.corrupt
        ));
    }
    if p.lost > 0 {
        violations.push(format!(
            "{} frames sent in the window did not come back within {} s",
            p.lost,
            ECHO_TIMEOUT.as_secs()
        ));
    }
    violations.extend(p.errors.iter().cloned());
}

/// The peers' part of a run's report: their extras, their violations;
/// changed echoes and failed peers fail every run, checker or not.
pub(crate) fn report(
    p: &PeerStats,
    mode: NetMode,
    extra: &mut std::collections::BTreeMap<String, f64>,
    violations: &mut Vec<String>,
) -> Result<(), BenchError> {
    extra.extend(p.extras(mode));
    check_peer(p, violations);
    if p.corrupt == 0 && p.errors.is_empty() {
        return Ok(());
    }
    let mut v = Vec::new();
    check_peer(
        &PeerStats {
            lost: 0,
            ..p.clone()
        },
        &mut v,
    );
    Err(BenchError::Failed(format!("net: {}", v.join(" | "))))
}

/// The frames tap `name` received from its VMM (`rx_packets`).
fn tap_rx_packets(name: &str) -> u64 {
    let p = Path::new("/sys/class/net")
        .join(name)
        .join("statistics/rx_packets");
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// `rx`: frames to the guest, at most [`RX_WINDOW`] ahead of its count;
/// when the guest's count has not moved for 20 ms (frames the tap
/// dropped), the window starts again from it.
fn inject(
    sock: &PacketSocket,
    bytes: usize,
    mem: &GuestMemoryMmap,
    c: &PeerCounters,
    stop: &AtomicBool,
) -> Result<(), String> {
    let frame = net::udp_frame(GUEST_MAC, PEER_MAC, bytes, b"vmm rx peer");
    let mut base = 0u64; // frames sent when the window last restarted, minus the guest's count then
    let mut sent = 0u64;
    let mut seen = 0u64;
    let mut moved = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let got = read_u64(mem, DATA_ADDR + net::FRAMES).unwrap_or(0);
        if got != seen {
            seen = got;
            moved = Instant::now();
        }
        let ahead = sent.saturating_sub(base).saturating_sub(got);
        if ahead >= RX_WINDOW {
            if moved.elapsed() < Duration::from_millis(20) {
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            base = sent.saturating_sub(got);
            moved = Instant::now();
        }
        match sock.send(&frame) {
            Ok(_) => {
                sent += 1;
                c.sent.store(sent, Ordering::Release);
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(format!("sending: {e}")),
        }
    }
    Ok(())
}

/// The frame `echo` sends as number `seq`: the sequence number, then
/// bytes that depend on it.
fn echo_frame(seq: u64, bytes: usize) -> Vec<u8> {
    let mut payload = seq.to_le_bytes().to_vec();
    payload.extend((0..64u64).map(|k| (seq.wrapping_mul(31).wrapping_add(k * 7)) as u8));
    net::udp_frame(GUEST_MAC, PEER_MAC, bytes, &payload)
}

/// What came back for a frame.
enum Echoed {
    /// The frame, intact, addresses swapped.
    Intact,
    /// Ours (its sequence number) but changed.
    Corrupt,
    /// Not this frame (another frame, the host's own traffic).
    Other,
}

/// Judges `got` against the frame `sent` whose number is `seq`.
fn judge(sent: &[u8], got: &[u8]) -> Echoed {
    let ours = got.len() >= 50 && got[..6] == PEER_MAC && got[6..12] == GUEST_MAC;
    // the sequence number sits right after the UDP header
    if !ours || got[42..50] != sent[42..50] {
        return Echoed::Other;
    }
    if got.len() == sent.len() && got[12..] == sent[12..] {
        Echoed::Intact
    } else {
        Echoed::Corrupt
    }
}

/// `echo`: one frame at a time; each round trip timed (inside the
/// window), each echo compared with what was sent.
fn echo(
    sock: &PacketSocket,
    bytes: usize,
    c: &PeerCounters,
    stop: &AtomicBool,
    window: &AtomicBool,
) -> Result<Histogram, String> {
    let mut rtt = Histogram::new();
    let mut buf = vec![0u8; 2048];
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        seq += 1;
        let frame = echo_frame(seq, bytes);
        let t0 = Instant::now();
        if let Err(e) = sock.send(&frame) {
            if e.kind() == std::io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS)
            {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            return Err(format!("sending: {e}"));
        }
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(rtt);
            }
            // Lost only when nothing is waiting: a peer thread that the
            // host kept off its CPU past the deadline still finds the echo.
            let Some(n) = sock.recv(&mut buf).map_err(|e| format!("receiving: {e}"))? else {
                if t0.elapsed() > ECHO_TIMEOUT {
                    if window.load(Ordering::Acquire) {
                        c.lost.fetch_add(1, Ordering::AcqRel);
                    }
                    break;
                }
                continue;
            };
            match judge(&frame, &buf[..n]) {
                Echoed::Other => continue,
                Echoed::Corrupt => {
                    c.corrupt.fetch_add(1, Ordering::AcqRel);
                    break;
                }
                Echoed::Intact => {
                    if window.load(Ordering::Acquire) {
                        rtt.record(t0.elapsed().as_nanos() as u64);
                    }
                    c.round_trips.fetch_add(1, Ordering::AcqRel);
                    break;
                }
            }
        }
    }
    Ok(rtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swapped(f: &[u8]) -> Vec<u8> {
        let mut g = f.to_vec();
        g[..6].copy_from_slice(&f[6..12]);
        g[6..12].copy_from_slice(&f[..6]);
        g
    }

    #[test]
    fn echoes_are_judged() {
        let f = echo_frame(7, 60);
        assert_eq!(f.len(), 60);
        assert!(matches!(judge(&f, &swapped(&f)), Echoed::Intact));
        // the frame as sent (not swapped): not an echo
        assert!(matches!(judge(&f, &f), Echoed::Other));
        // an older frame's echo
        assert!(matches!(
            judge(&f, &swapped(&echo_frame(6, 60))),
            Echoed::Other
        ));
        // one flipped byte, or a cut frame
        let mut bad = swapped(&f);
        bad[55] ^= 1;
        assert!(matches!(judge(&f, &bad), Echoed::Corrupt));
        assert!(matches!(judge(&f, &swapped(&f)[..58]), Echoed::Corrupt));
        let big = echo_frame(9, 1514);
        assert!(matches!(judge(&big, &swapped(&big)), Echoed::Intact));
    }

    #[test]
    fn bad_shapes_are_refused_with_the_fix() {
        let mut o = NetOptions::default();
        let e = validate(&o, 1, 1).unwrap_err().to_string();
        assert!(e.contains("--tap"), "{e}");
        o.taps = vec!["vmm-no-such-tap0".into()];
        let e = validate(&o, 1, 2).unwrap_err().to_string();
        assert!(e.contains("--vcpus 1"), "{e}");
        let e = validate(&o, 2, 1).unwrap_err().to_string();
        assert!(e.contains("one --tap per VM"), "{e}");
        let e = validate(&o, 1, 1).unwrap_err().to_string();
        assert!(e.contains("ip tuntap add vmm-no-such-tap0 mode tap"), "{e}");
        o.frame_bytes = 20;
        let e = validate(&o, 1, 1).unwrap_err().to_string();
        assert!(e.contains("--frame-bytes"), "{e}");
    }
}
