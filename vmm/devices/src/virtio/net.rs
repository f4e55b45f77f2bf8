//! virtio-net (virtio 1.2, 5.1) backed by a host tap.
//!
//! * Queues: receive and transmit per queue pair (`rx0, tx0, rx1, tx1,
//!   ...`), then the control queue. Several pairs (`VIRTIO_NET_F_MQ`)
//!   need a multi-queue tap: pair `p` uses the tap's `p`-th file, and
//!   each pair has its own I/O thread, so pairs move packets in
//!   parallel. The control queue takes `VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET`
//!   (the number of pairs the driver uses) and answers `ERR` to anything
//!   else.
//! * Header: `virtio_net_hdr_v1` (12 bytes) on both sides; the tap is set
//!   to the same size, so checksum and segmentation metadata pass through
//!   untouched.
//! * Offloads: the guest may hand over partial checksums and TSO frames
//!   (`CSUM`, `HOST_TSO4/6`, `HOST_ECN`; a tap with `IFF_VNET_HDR` always
//!   takes them). It is offered partial checksums and TSO frames on
//!   receive (`GUEST_CSUM`, `GUEST_TSO4/6`, `GUEST_ECN`) only when the tap
//!   accepts `TUNSETOFFLOAD`, and the tap is told exactly what the driver
//!   accepted.
//! * Receive buffers: `VIRTIO_NET_F_MRG_RXBUF`, so a large packet spans
//!   several small buffers, as Linux posts them. Chains taken from the
//!   ring for a packet that did not fit yet are kept for the next try, so
//!   `avail_event` always asks the driver for *new* buffers.
//! * MAC: given, or a random locally administered unicast address.
//!
//! The guest is untrusted: a receive chain with device-readable buffers,
//! a control command without an ack byte, or a broken chain is a guest
//! error (`NEEDS_RESET`); a transmit packet shorter than its header or
//! longer than [`MAX_PACKET`] is dropped and counted, as a NIC drops a
//! malformed frame.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::{debug, warn};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_F_CSUM,
    VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_OK,
    VIRTIO_NET_S_LINK_UP,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::chain::{self, Chain};
use super::worker::{QueueHandler, Worker};
use super::{features, Activation, Memory, VirtioDevice, VirtioInterrupt};
use crate::tap::{Tap, VNET_HDR_LEN};
use crate::DeviceError;

/// Queue size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// The largest packet, header included: a 64 KiB TSO frame, its
/// Ethernet header and the virtio-net header.
pub const MAX_PACKET: usize = VNET_HDR_LEN + 14 + 65535;
/// The most queue pairs (as for disk queues).
pub const MAX_PAIRS: u16 = 32;
/// Most bytes of one control command.
const MAX_CTRL: u64 = 4096;

const fn bit(b: u32) -> u64 {
    1 << b
}

/// Packet counters, shared with whoever wants to read them.
#[derive(Debug, Default)]
pub struct NetStats {
    /// Packets handed to the guest.
    pub rx_packets: AtomicU64,
    /// Packets the guest sent out.
    pub tx_packets: AtomicU64,
    /// Host packets dropped: too large for the guest's buffers.
    pub rx_dropped: AtomicU64,
    /// Guest packets dropped: malformed, or refused by the tap.
    pub tx_dropped: AtomicU64,
}

/// A MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// A random locally administered unicast address.
    pub fn random() -> Self {
        let mut b = [0u8; 6];
        if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
            use std::io::Read;
            let _ = f.read_exact(&mut b);
        }
        if b == [0; 6] {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id());
            b.copy_from_slice(&t.to_le_bytes()[..6]);
        }
        b[0] = (b[0] & 0xfe) | 0x02;
        Self(b)
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "MAC address {s:?}: give six hex bytes separated by ':', e.g. 52:54:00:12:34:56"
            )
        };
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut b = [0u8; 6];
        for (o, p) in b.iter_mut().zip(&parts) {
            if p.len() != 2 {
                return Err(bad());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if b[0] & 1 != 0 {
            return Err(format!(
                "MAC address {s}: a multicast address (the first byte is odd); \
                 a NIC needs a unicast one, e.g. 52:54:00:12:34:56"
            ));
        }
        Ok(Self(b))
    }
}

/// The virtio-net device.
#[derive(Debug)]
pub struct Net {
    name: String,
    taps: Vec<Arc<Tap>>,
    mac: Mac,
    guest_offloads: bool,
    workers: Vec<Worker>,
    stats: Arc<NetStats>,
}

impl Net {
    /// A device with one queue pair per tap file.
    pub fn new(name: &str, taps: Vec<Tap>, mac: Mac) -> Self {
        // Receive offloads only where the tap takes TUNSETOFFLOAD; off
        // until the driver says which it accepts.
        let guest_offloads = taps.first().is_some_and(|t| {
            let all = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
            t.set_offload(all).is_ok() && t.set_offload(0).is_ok()
        });
        Self {
            name: name.to_string(),
            taps: taps.into_iter().map(Arc::new).collect(),
            mac,
            guest_offloads,
            workers: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<NetStats> {
        self.stats.clone()
    }

    fn pairs(&self) -> u16 {
        self.taps.len().max(1) as u16
    }

    fn config(&self) -> [u8; 10] {
        let mut c = [0u8; 10];
        c[..6].copy_from_slice(&self.mac.0);
        c[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        c[8..10].copy_from_slice(&self.pairs().to_le_bytes());
        c
    }
}

/// `TUN_F_*` for the receive offloads the driver accepted.
fn tun_offloads(accepted: u64) -> u32 {
    let mut f = 0;
    if accepted & bit(VIRTIO_NET_F_GUEST_CSUM) != 0 {
        f |= libc::TUN_F_CSUM;
        if accepted & bit(VIRTIO_NET_F_GUEST_TSO4) != 0 {
            f |= libc::TUN_F_TSO4;
        }
        if accepted & bit(VIRTIO_NET_F_GUEST_TSO6) != 0 {
            f |= libc::TUN_F_TSO6;
        }
        if accepted & bit(VIRTIO_NET_F_GUEST_ECN) != 0 {
            f |= libc::TUN_F_TSO_ECN;
        }
    }
    f
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }
    fn pci_class(&self) -> u32 {
        // Network controller, Ethernet.
        0x02_00_00
    }
    fn features(&self) -> u64 {
        let mut f = features::INDIRECT_DESC
            | features::EVENT_IDX
            | bit(VIRTIO_NET_F_CSUM)
            | bit(VIRTIO_NET_F_HOST_TSO4)
            | bit(VIRTIO_NET_F_HOST_TSO6)
            | bit(VIRTIO_NET_F_HOST_ECN)
            | bit(VIRTIO_NET_F_MAC)
            | bit(VIRTIO_NET_F_STATUS)
            | bit(VIRTIO_NET_F_MRG_RXBUF)
            | bit(VIRTIO_NET_F_CTRL_VQ);
        if self.pairs() > 1 {
            f |= bit(VIRTIO_NET_F_MQ);
        }
        if self.guest_offloads {
            f |= bit(VIRTIO_NET_F_GUEST_CSUM)
                | bit(VIRTIO_NET_F_GUEST_TSO4)
                | bit(VIRTIO_NET_F_GUEST_TSO6)
                | bit(VIRTIO_NET_F_GUEST_ECN);
        }
        f
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 2 * usize::from(self.pairs()) + 1]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let c = self.config();
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| c.get(o + i))
                .copied()
                .unwrap_or(0);
        }
    }
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.reset();
        let offloads = tun_offloads(a.features);
        for t in &self.taps {
            if let Err(e) = t.set_offload(offloads) {
                warn!(device = %self.name, "{e}");
            }
        }
        let pairs = self.pairs();
        let ctrl_index = 2 * usize::from(pairs);
        let mut handlers: Vec<PairQueues> = self
            .taps
            .iter()
            .enumerate()
            .map(|(p, tap)| PairQueues {
                pair: p,
                tap: tap.clone(),
                mem: a.mem.clone(),
                interrupt: a.interrupt.clone(),
                stats: self.stats.clone(),
                mergeable: a.features & bit(VIRTIO_NET_F_MRG_RXBUF) != 0,
                pairs,
                rx: None,
                tx: None,
                ctrl: None,
                stash: VecDeque::new(),
                rx_buf: vec![0; MAX_PACKET],
                rx_len: 0,
                tx_buf: Vec::with_capacity(MAX_PACKET),
                events: Vec::new(),
            })
            .collect();
        for q in a.queues {
            let (p, slot) = if q.index == ctrl_index {
                (0, 2)
            } else {
                (q.index / 2, q.index % 2)
            };
            let Some(h) = handlers.get_mut(p) else {
                continue;
            };
            let served = Served {
                queue: q.queue,
                vector: q.vector,
                index: q.index,
            };
            match slot {
                0 => h.rx = Some(served),
                1 => h.tx = Some(served),
                _ => h.ctrl = Some(served),
            }
            h.events.push((q.index, q.event));
        }
        for mut h in handlers {
            if h.events.is_empty() {
                continue;
            }
            let events = std::mem::take(&mut h.events);
            let name = format!("{}-q{}", self.name, h.pair);
            self.workers.push(Worker::spawn_on(
                &name,
                h,
                events,
                a.interrupt.clone(),
                a.io_cpus.clone(),
            )?);
        }
        Ok(())
    }
    fn reset(&mut self) {
        for w in self.workers.drain(..) {
            w.stop();
        }
    }
}

/// A queue a handler serves.
struct Served {
    queue: Queue,
    vector: u16,
    index: usize,
}

/// One queue pair (and, for pair 0, the control queue), on its own thread.
struct PairQueues {
    pair: usize,
    tap: Arc<Tap>,
    mem: Memory,
    interrupt: Arc<VirtioInterrupt>,
    stats: Arc<NetStats>,
    mergeable: bool,
    pairs: u16,
    rx: Option<Served>,
    tx: Option<Served>,
    ctrl: Option<Served>,
    /// Receive chains taken from the ring but not used yet.
    stash: VecDeque<Chain>,
    /// A packet read from the tap and not yet delivered: `rx_buf[..rx_len]`.
    rx_buf: Vec<u8>,
    rx_len: usize,
    tx_buf: Vec<u8>,
    events: Vec<(usize, vmm_sys_util::eventfd::EventFd)>,
}

/// What became of a packet offered to the receive queue.
enum Rx {
    Delivered,
    /// The guest has not posted room for it yet.
    NoRoom,
    /// It can never fit (no mergeable buffers and a chain too small).
    Dropped,
}

impl PairQueues {
    fn signal(&self, s: &mut Served) -> Result<(), String> {
        self.interrupt
            .signal_used(&mut s.queue, &self.mem, s.vector)
    }

    /// Moves packets from the tap to the guest until either runs out.
    fn receive(&mut self) -> Result<(), String> {
        let Some(mut rx) = self.rx.take() else {
            return Ok(());
        };
        let r = self.receive_on(&mut rx);
        self.rx = Some(rx);
        r
    }

    fn receive_on(&mut self, rx: &mut Served) -> Result<(), String> {
        let mut delivered = false;
        loop {
            if self.rx_len == 0 {
                match self.tap.recv(&mut self.rx_buf) {
                    Ok(Some(n)) if n > VNET_HDR_LEN => self.rx_len = n,
                    Ok(Some(_)) => continue,
                    Ok(None) => break,
                    Err(e) => {
                        debug!(tap = self.tap.name(), "tap read: {e}");
                        break;
                    }
                }
            }
            match self.offer(rx)? {
                Rx::Delivered => {
                    delivered = true;
                    self.rx_len = 0;
                    self.stats.rx_packets.fetch_add(1, Ordering::Relaxed);
                }
                Rx::Dropped => {
                    self.rx_len = 0;
                    self.stats.rx_dropped.fetch_add(1, Ordering::Relaxed);
                }
                Rx::NoRoom => break,
            }
        }
        if delivered {
            self.signal(rx)?;
        }
        Ok(())
    }

    /// Takes chains until the stash holds `need` writable bytes (one
    /// chain without mergeable buffers). False when the ring ran dry;
    /// then the driver is asked to notify when it posts more.
    fn fill_stash(&mut self, rx: &mut Served, need: u64) -> Result<bool, String> {
        loop {
            let room: u64 = if self.mergeable {
                self.stash.iter().map(Chain::writable_len).sum()
            } else {
                self.stash.front().map_or(0, Chain::writable_len)
            };
            if room >= need || (!self.mergeable && !self.stash.is_empty()) {
                return Ok(true);
            }
            match chain::next(&mut rx.queue, &self.mem).map_err(|e| e.to_string())? {
                Some(c) => {
                    if !c.readable.is_empty() || c.writable_len() == 0 {
                        return Err(format!(
                            "receive chain {} has device-readable buffers or no room",
                            c.head
                        ));
                    }
                    self.stash.push_back(c);
                }
                None => {
                    if !rx
                        .queue
                        .enable_notification(&self.mem)
                        .map_err(|e| e.to_string())?
                    {
                        return Ok(false);
                    }
                }
            }
        }
    }

    fn offer(&mut self, rx: &mut Served) -> Result<Rx, String> {
        let len = self.rx_len;
        if !self.fill_stash(rx, len as u64)? {
            return Ok(Rx::NoRoom);
        }
        if !self.mergeable {
            let room = self.stash.front().map_or(0, Chain::writable_len);
            if room < len as u64 {
                return Ok(Rx::Dropped);
            }
        }
        // Count the chains the packet takes, and say so in num_buffers.
        let mut chains = 0usize;
        let mut room = 0u64;
        for c in &self.stash {
            chains += 1;
            room += c.writable_len();
            if room >= len as u64 {
                break;
            }
        }
        self.rx_buf[10..12].copy_from_slice(&(chains as u16).to_le_bytes());
        let mut off = 0usize;
        for _ in 0..chains {
            let Some(c) = self.stash.pop_front() else {
                break;
            };
            let start = off;
            for b in &c.writable {
                if off == len {
                    break;
                }
                let n = (b.len as usize).min(len - off);
                self.mem
                    .write_slice(&self.rx_buf[off..off + n], b.addr)
                    .map_err(|e| format!("writing a receive buffer: {e}"))?;
                off += n;
            }
            rx.queue
                .add_used(&self.mem, c.head, (off - start) as u32)
                .map_err(|e| e.to_string())?;
        }
        Ok(Rx::Delivered)
    }

    /// Sends every packet the driver queued.
    fn transmit(&mut self) -> Result<(), String> {
        let Some(mut tx) = self.tx.take() else {
            return Ok(());
        };
        let (tap, mem, buf, stats) = (&self.tap, &self.mem, &mut self.tx_buf, &self.stats);
        let r = chain::drain(&mut tx.queue, mem, |c| {
            let len = c.readable_len();
            if len <= VNET_HDR_LEN as u64 || len > MAX_PACKET as u64 {
                stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
            buf.clear();
            for b in &c.readable {
                let at = buf.len();
                buf.resize(at + b.len as usize, 0);
                mem.read_slice(&mut buf[at..], b.addr)
                    .map_err(|e| format!("reading a transmit buffer: {e}"))?;
            }
            match tap.send(buf) {
                Ok(_) => stats.tx_packets.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    debug!(tap = tap.name(), "tap write: {e}");
                    stats.tx_dropped.fetch_add(1, Ordering::Relaxed)
                }
            };
            Ok(0)
        });
        let out = match r {
            Ok(true) => self.signal(&mut tx),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        self.tx = Some(tx);
        out
    }

    /// Answers control commands.
    fn control(&mut self) -> Result<(), String> {
        let Some(mut ctrl) = self.ctrl.take() else {
            return Ok(());
        };
        let (mem, pairs) = (&self.mem, self.pairs);
        let r = chain::drain(&mut ctrl.queue, mem, |c| {
            let ack = *c
                .writable
                .last()
                .filter(|b| b.len >= 1)
                .ok_or("a control command without an ack byte")?;
            let mut cmd = Vec::new();
            if c.readable_len() <= MAX_CTRL {
                for b in &c.readable {
                    let at = cmd.len();
                    cmd.resize(at + b.len as usize, 0);
                    mem.read_slice(&mut cmd[at..], b.addr)
                        .map_err(|e| format!("reading a control command: {e}"))?;
                }
            }
            let status = match cmd.as_slice() {
                [class, code, n0, n1, ..]
                    if u32::from(*class) == VIRTIO_NET_CTRL_MQ
                        && u32::from(*code) == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET =>
                {
                    let n = u16::from_le_bytes([*n0, *n1]);
                    if (1..=pairs).contains(&n) {
                        VIRTIO_NET_OK
                    } else {
                        VIRTIO_NET_ERR
                    }
                }
                _ => VIRTIO_NET_ERR,
            };
            mem.write_obj(
                status as u8,
                GuestAddress(ack.addr.0 + u64::from(ack.len) - 1),
            )
            .map_err(|e| format!("writing the ack: {e}"))?;
            Ok(1)
        });
        let out = match r {
            Ok(true) => self.signal(&mut ctrl),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        self.ctrl = Some(ctrl);
        out
    }
}

impl QueueHandler for PairQueues {
    fn process(&mut self, index: usize) -> Result<(), String> {
        let is = |s: &Option<Served>| s.as_ref().is_some_and(|s| s.index == index);
        if is(&self.rx) {
            // New buffers: a packet may be waiting for them.
            self.receive()
        } else if is(&self.tx) {
            self.transmit()
        } else if is(&self.ctrl) {
            self.control()
        } else {
            Ok(())
        }
    }

    fn host_fds(&self) -> Vec<RawFd> {
        if self.rx.is_some() {
            vec![self.tap.as_raw_fd()]
        } else {
            Vec::new()
        }
    }

    fn host_ready(&mut self, _k: usize) -> Result<(), String> {
        self.receive()
    }
}

/// Serves what the driver made available on a receive, a transmit and a
/// control queue (`[rx, tx, ctrl]`), once, on the calling thread, with
/// `tap`: transmit, then receive what the tap holds, then the control
/// queue. The path as the fuzz targets drive it over arbitrary guest
/// memory; `Err` is what makes the device need a reset.
pub fn serve_once(
    tap: Tap,
    mem: &Memory,
    [rx, tx, ctrl]: [Queue; 3],
    mergeable: bool,
) -> Result<(), String> {
    let served = |queue, index| {
        Some(Served {
            queue,
            vector: super::NO_VECTOR,
            index,
        })
    };
    let mut h = PairQueues {
        pair: 0,
        tap: Arc::new(tap),
        mem: mem.clone(),
        interrupt: Arc::new(VirtioInterrupt::standalone("net-serve-once")),
        stats: Arc::default(),
        mergeable,
        pairs: 1,
        rx: served(rx, 0),
        tx: served(tx, 1),
        ctrl: served(ctrl, 2),
        stash: VecDeque::new(),
        rx_buf: vec![0; MAX_PACKET],
        rx_len: 0,
        tx_buf: Vec::new(),
        events: Vec::new(),
    };
    h.transmit()?;
    h.receive()?;
    h.control()
}
