//! virtio-vsock driven as a guest driver drives it (the test plays the
//! guest's vsock stack on the rings) with real Unix sockets on the host
//! side: host-initiated connections (`CONNECT <port>`), guest-initiated
//! ones (`<socket>_<port>`), credit both ways under a slow reader,
//! shutdown and reset, the connection cap, and malformed packets (dropped
//! or answered `OP_RST`, never a panic; a broken chain is `NEEDS_RESET`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use super::status;
use super::tests::{Driver, F_NEXT, F_WRITE};
use super::vsock::*;

const RX: u64 = 0x4_0000;
const TX: u64 = 0x5_0000;
const EVT: u64 = 0x6_0000;
const RX_BUF: u64 = 0x8_0000;
const TX_BUF: u64 = 0xa_0000;
/// One big transmit buffer (a 64 KiB payload).
const BIG_BUF: u64 = 0xc_0000;
const SLOT: u64 = 0x1100;
const QSIZE: u16 = 16;
const HDR: usize = 44;
const CID: u64 = 3;
/// The test guest's receive buffer per connection.
const GUEST_BUF: u32 = 256 * 1024;

/// A packet as the test guest sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Pkt {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    type_: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
    data: Vec<u8>,
}

impl Pkt {
    /// A stream packet from the guest, port `src` to host port `dst`.
    fn guest(op: u16, src: u32, dst: u32) -> Self {
        Self {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port: src,
            dst_port: dst,
            type_: TYPE_STREAM,
            op,
            buf_alloc: GUEST_BUF,
            ..Default::default()
        }
    }
    fn header(&self, len: u32) -> [u8; HDR] {
        let mut h = [0u8; HDR];
        h[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        h[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        h[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        h[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        h[24..28].copy_from_slice(&len.to_le_bytes());
        h[28..30].copy_from_slice(&self.type_.to_le_bytes());
        h[30..32].copy_from_slice(&self.op.to_le_bytes());
        h[32..36].copy_from_slice(&self.flags.to_le_bytes());
        h[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        h[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        h
    }
    fn parse(h: &[u8], data: Vec<u8>) -> Self {
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(h[o..o + 2].try_into().unwrap());
        Self {
            src_cid: u64::from_le_bytes(h[0..8].try_into().unwrap()),
            dst_cid: u64::from_le_bytes(h[8..16].try_into().unwrap()),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
            data,
        }
    }
}

/// The test guest: the rings, and counters for its one connection's
/// credit where a test needs them.
struct Guest {
    d: Driver,
    rx_idx: u16,
    rx_seen: u16,
    tx_idx: u16,
    /// The next transmit descriptor (one or two per packet).
    tx_slot: u16,
    path: PathBuf,
    stats: Arc<VsockStats>,
    _dir: tempfile::TempDir,
}

impl Guest {
    fn new() -> Self {
        Self::with(|d| d)
    }

    /// A guest whose device `tune` changed.
    fn with(tune: impl FnOnce(Vsock) -> Vsock) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vsock.sock");
        let dev = tune(Vsock::new("vsock-test", CID, &path).unwrap());
        let stats = dev.stats();
        let mut d = Driver::with(Box::new(dev));
        d.msix();
        d.setup_features(QSIZE, 0);
        d.queue_at(0, QSIZE, RX);
        d.queue_at(1, QSIZE, TX);
        d.queue_at(2, QSIZE, EVT);
        d.driver_ok();
        assert_eq!(d.status() & status::NEEDS_RESET, 0);
        let mut g = Self {
            d,
            rx_idx: 0,
            rx_seen: 0,
            tx_idx: 0,
            tx_slot: 0,
            path,
            stats,
            _dir: dir,
        };
        for slot in 0..QSIZE {
            g.post_rx(slot);
        }
        g
    }

    fn post(&mut self, index: u16, base: u64, idx: u16, head: u16) {
        let m = &self.d.mem;
        m.write_obj(
            head,
            GuestAddress(base + 0x1000 + 4 + 2 * u64::from(idx % QSIZE)),
        )
        .unwrap();
        m.write_obj(idx.wrapping_add(1), GuestAddress(base + 0x1000 + 2))
            .unwrap();
        self.d.w(0x3000 + 4 * u64::from(index), u64::from(index), 2);
    }

    /// Posts receive buffer `slot`: header and 4 KiB in one descriptor.
    fn post_rx(&mut self, slot: u16) {
        let addr = RX_BUF + u64::from(slot) * SLOT;
        self.d.desc(RX, slot, addr, (HDR + 4096) as u32, F_WRITE, 0);
        let idx = self.rx_idx;
        self.rx_idx = idx.wrapping_add(1);
        self.post(0, RX, idx, slot);
    }

    /// Sends `p` with payload `p.data` (header and payload in one
    /// descriptor) and waits until the device took it.
    fn send(&mut self, p: &Pkt) {
        let slot = self.slot();
        let addr = TX_BUF + u64::from(slot) * SLOT;
        assert!(p.data.len() <= 4096);
        self.d
            .mem
            .write_slice(&p.header(p.data.len() as u32), GuestAddress(addr))
            .unwrap();
        self.d
            .mem
            .write_slice(&p.data, GuestAddress(addr + HDR as u64))
            .unwrap();
        self.d
            .desc(TX, slot, addr, (HDR + p.data.len()) as u32, 0, 0);
        self.send_head(slot);
    }

    /// Sends the raw header `h` and a payload descriptor of `data`.
    fn send_raw(&mut self, h: [u8; HDR], data: &[u8]) {
        let slot = self.slot();
        let addr = TX_BUF + u64::from(slot) * SLOT;
        self.d.mem.write_slice(&h, GuestAddress(addr)).unwrap();
        if data.is_empty() {
            self.d.desc(TX, slot, addr, HDR as u32, 0, 0);
        } else {
            self.d.mem.write_slice(data, GuestAddress(BIG_BUF)).unwrap();
            let next = self.slot();
            self.d.desc(TX, slot, addr, HDR as u32, F_NEXT, next);
            self.d.desc(TX, next, BIG_BUF, data.len() as u32, 0, 0);
        }
        self.send_head(slot);
    }

    fn send_head(&mut self, head: u16) {
        let idx = self.tx_idx;
        self.tx_idx = idx.wrapping_add(1);
        self.post(1, TX, idx, head);
        let want = idx.wrapping_add(1);
        assert!(
            self.d.wait(|d| d.used_at(TX) == want),
            "the device takes the packet"
        );
    }

    /// Sends one packet whose bytes are `parts`, one buffer each.
    fn send_parts(&mut self, parts: &[&[u8]]) {
        let slots: Vec<u16> = (0..parts.len()).map(|_| self.slot()).collect();
        for (k, part) in parts.iter().enumerate() {
            let addr = BIG_BUF + 0x100 * k as u64;
            self.d.mem.write_slice(part, GuestAddress(addr)).unwrap();
            let (flags, next) = match slots.get(k + 1) {
                Some(&n) => (F_NEXT, n),
                None => (0, 0),
            };
            self.d
                .desc(TX, slots[k], addr, part.len() as u32, flags, next);
        }
        self.send_head(slots[0]);
    }

    /// A free transmit descriptor.
    fn slot(&mut self) -> u16 {
        let s = self.tx_slot % QSIZE;
        self.tx_slot = self.tx_slot.wrapping_add(1);
        s
    }

    /// The next packet to the guest within `t`, its buffer posted again.
    fn recv_within(&mut self, t: Duration) -> Option<Pkt> {
        let start = Instant::now();
        while self.d.used_at(RX) == self.rx_seen {
            if start.elapsed() > t {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let (head, len) = self.d.used_elem(RX, self.rx_seen % QSIZE);
        self.rx_seen = self.rx_seen.wrapping_add(1);
        let addr = RX_BUF + u64::from(head) * SLOT;
        let mut h = [0u8; HDR];
        self.d.mem.read_slice(&mut h, GuestAddress(addr)).unwrap();
        let n = (len as usize)
            .checked_sub(HDR)
            .expect("a used length past the header");
        let mut data = vec![0u8; n];
        self.d
            .mem
            .read_slice(&mut data, GuestAddress(addr + HDR as u64))
            .unwrap();
        let p = Pkt::parse(&h, data);
        let dlen = u32::from_le_bytes(h[24..28].try_into().unwrap());
        assert_eq!(dlen as usize, n, "header len matches the used length");
        self.post_rx(head as u16);
        Some(p)
    }

    fn recv(&mut self) -> Pkt {
        self.recv_within(Duration::from_secs(5))
            .expect("a packet for the guest")
    }

    /// Connects from the host to guest port `port`, the guest accepting:
    /// the host stream and the device's (local) port.
    fn host_connect(&mut self, port: u32) -> (UnixStream, u32) {
        let mut s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        writeln!(s, "CONNECT {port}").unwrap();
        let req = self.recv();
        assert_eq!(req.op, OP_REQUEST);
        assert_eq!((req.src_cid, req.dst_cid), (HOST_CID, CID));
        assert_eq!(req.dst_port, port);
        assert_eq!(req.type_, TYPE_STREAM);
        self.send(&Pkt::guest(OP_RESPONSE, port, req.src_port));
        let mut line = String::new();
        let mut r = BufReader::new(s.try_clone().unwrap());
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("OK {}\n", req.src_port));
        assert!(r.buffer().is_empty());
        (s, req.src_port)
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn config_space_has_the_cid_and_bad_configs_are_refused() {
    let mut g = Guest::new();
    let cid: Vec<u8> = (0..8).map(|i| g.d.r(0x2000 + i, 1) as u8).collect();
    assert_eq!(cid, CID.to_le_bytes());
    // The path exists now: a second device may not take it.
    let e = Vsock::new("x", 4, &g.path).unwrap_err();
    assert!(matches!(e, VsockError::Exists(_)), "{e}");
    let e = Vsock::new("x", 2, &g.path.with_extension("other")).unwrap_err();
    assert!(matches!(e, VsockError::Cid(2)), "{e}");
    // A file of the user's is left alone.
    let f = g.path.with_extension("users");
    std::fs::write(&f, b"mine").unwrap();
    assert!(Vsock::new("x", 5, &f).is_err());
    assert_eq!(std::fs::read(&f).unwrap(), b"mine");
}

#[test]
fn the_socket_file_goes_with_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let dev = Vsock::new("v", 9, &path).unwrap();
    assert!(path.exists());
    drop(dev);
    assert!(!path.exists());
}

#[test]
fn host_connects_and_bytes_flow_both_ways() {
    let mut g = Guest::new();
    let (mut s, local) = g.host_connect(1234);
    s.write_all(b"hello guest").unwrap();
    let p = g.recv();
    assert_eq!(p.op, OP_RW);
    assert_eq!((p.src_port, p.dst_port), (local, 1234));
    assert_eq!(p.data, b"hello guest");
    assert_eq!(p.buf_alloc, BUF_ALLOC);
    let mut rw = Pkt::guest(OP_RW, 1234, local);
    rw.data = b"hello host".to_vec();
    g.send(&rw);
    let mut got = [0u8; 10];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello host");
    // Larger than one receive buffer: split, in order, every byte.
    let big = pattern(10_000, 7);
    s.write_all(&big).unwrap();
    let mut got = Vec::new();
    while got.len() < big.len() {
        let p = g.recv();
        assert_eq!(p.op, OP_RW);
        assert!(p.data.len() <= 4096);
        got.extend(p.data);
    }
    assert_eq!(got, big);
    assert_eq!(g.stats.connections.load(Ordering::Relaxed), 1);
}

#[test]
fn a_bad_connect_line_or_a_refusing_guest_closes_the_host_stream() {
    let mut g = Guest::new();
    let mut s = UnixStream::connect(&g.path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"HELLO 5\n").unwrap();
    let mut b = Vec::new();
    assert_eq!(s.read_to_end(&mut b).unwrap(), 0, "closed");
    // The guest answers the request with a reset.
    let mut s = UnixStream::connect(&g.path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"CONNECT 99\n").unwrap();
    let req = g.recv();
    assert_eq!(req.op, OP_REQUEST);
    g.send(&Pkt::guest(OP_RST, 99, req.src_port));
    assert_eq!(s.read_to_end(&mut b).unwrap(), 0, "closed");
    assert!(b.is_empty());
}

#[test]
fn the_guest_connects_to_a_host_port() {
    let mut g = Guest::new();
    let l = UnixListener::bind(format!("{}_5000", g.path.display())).unwrap();
    g.send(&Pkt::guest(OP_REQUEST, 777, 5000));
    let p = g.recv();
    assert_eq!(p.op, OP_RESPONSE);
    assert_eq!((p.src_port, p.dst_port, p.dst_cid), (5000, 777, CID));
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rw = Pkt::guest(OP_RW, 777, 5000);
    rw.data = b"ping".to_vec();
    g.send(&rw);
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    s.write_all(b"pong").unwrap();
    let p = g.recv();
    assert_eq!((p.op, p.data.as_slice()), (OP_RW, &b"pong"[..]));
    // No socket for port 5001: reset.
    g.send(&Pkt::guest(OP_REQUEST, 778, 5001));
    let p = g.recv();
    assert_eq!((p.op, p.src_port, p.dst_port), (OP_RST, 5001, 778));
    assert_eq!(g.stats.refused.load(Ordering::Relaxed), 1);
}

#[test]
fn host_data_stops_at_the_guests_credit_and_resumes_with_an_update() {
    let mut g = Guest::new();
    let mut s = UnixStream::connect(&g.path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"CONNECT 80\n").unwrap();
    let req = g.recv();
    let mut resp = Pkt::guest(OP_RESPONSE, 80, req.src_port);
    resp.buf_alloc = 8192;
    g.send(&resp);
    let mut line = [0u8; 64];
    let n = s.read(&mut line).unwrap();
    assert!(line[..n].starts_with(b"OK "));
    let all = pattern(20_000, 3);
    s.write_all(&all).unwrap();
    let mut got = Vec::new();
    let mut asked = false;
    while let Some(p) = g.recv_within(Duration::from_millis(300)) {
        match p.op {
            OP_RW => got.extend(p.data),
            OP_CREDIT_REQUEST => asked = true,
            op => panic!("unexpected op {op}"),
        }
    }
    assert_eq!(got.len(), 8192, "exactly the guest's credit");
    assert!(asked, "the device asked for credit");
    // The guest read it all: credit again, and the rest comes.
    let mut upd = Pkt::guest(OP_CREDIT_UPDATE, 80, req.src_port);
    upd.buf_alloc = 8192;
    while got.len() < all.len() {
        upd.fwd_cnt = got.len() as u32;
        g.send(&upd);
        while let Some(p) = g.recv_within(Duration::from_millis(300)) {
            if p.op == OP_RW {
                got.extend(p.data);
            }
        }
    }
    assert_eq!(got, all);
}

/// The guest sends 1 MiB within the device's credit to a host that reads
/// slowly: every byte arrives, in order, and nothing is reset.
#[test]
fn guest_data_to_a_slow_host_reader_is_complete() {
    let mut g = Guest::new();
    let (s, local) = g.host_connect(7);
    const TOTAL: usize = 1 << 20;
    let reader = std::thread::spawn(move || {
        let mut s = s;
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        while got.len() < TOTAL {
            std::thread::sleep(Duration::from_millis(2));
            let n = s.read(&mut b).unwrap();
            assert!(n > 0, "early EOF");
            got.extend_from_slice(&b[..n]);
        }
        got
    });
    let all = pattern(TOTAL, 11);
    let (mut sent, mut peer_alloc, mut peer_fwd) = (0usize, BUF_ALLOC, 0u32);
    let mut stalls = 0;
    while sent < TOTAL {
        let credit = peer_alloc - (sent as u32 - peer_fwd);
        if credit == 0 {
            let p = g.recv();
            assert_eq!(p.op, OP_CREDIT_UPDATE);
            (peer_alloc, peer_fwd) = (p.buf_alloc, p.fwd_cnt);
            stalls += 1;
            continue;
        }
        let n = (credit as usize).min(4096).min(TOTAL - sent);
        let mut rw = Pkt::guest(OP_RW, 7, local);
        rw.data = all[sent..sent + n].to_vec();
        g.send(&rw);
        sent += n;
        // Take credit updates as they come (and the SHUTDOWN of a
        // reader that has had everything already).
        while let Some(p) = g.recv_within(Duration::ZERO) {
            if p.op == OP_SHUTDOWN {
                assert_eq!(sent, TOTAL);
                continue;
            }
            assert_eq!(p.op, OP_CREDIT_UPDATE);
            (peer_alloc, peer_fwd) = (p.buf_alloc, p.fwd_cnt);
        }
    }
    let got = reader.join().unwrap();
    assert!(got == all, "every byte, in order");
    assert!(stalls > 0, "the credit ran out at least once");
    assert_eq!(g.stats.resets.load(Ordering::Relaxed), 0);
}

#[test]
fn a_guest_sending_past_its_credit_is_reset() {
    let mut g = Guest::new();
    let (s, local) = g.host_connect(8);
    // The host never reads: fill its socket and our buffer.
    let mut rw = Pkt::guest(OP_RW, 8, local);
    rw.data = vec![0x5a; 4096];
    let mut reset = false;
    for _ in 0..1000 {
        g.send(&rw);
        if let Some(p) = g.recv_within(Duration::ZERO) {
            if p.op == OP_RST {
                reset = true;
                break;
            }
        }
    }
    if !reset {
        reset = std::iter::from_fn(|| g.recv_within(Duration::from_millis(300)))
            .any(|p| p.op == OP_RST);
    }
    assert!(reset, "the connection was reset");
    drop(s);
}

#[test]
fn host_close_shuts_down_and_guest_shutdown_closes_the_host_side() {
    let mut g = Guest::new();
    // Host closes: SHUTDOWN to the guest, which resets; later packets of
    // the connection get a reset.
    let (s, local) = g.host_connect(21);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let p = g.recv();
    assert_eq!((p.op, p.flags), (OP_SHUTDOWN, SHUTDOWN_SEND));
    g.send(&Pkt::guest(OP_RST, 21, local));
    let mut b = Vec::new();
    let mut s = s;
    assert_eq!(s.read_to_end(&mut b).unwrap(), 0, "closed after the RST");
    let mut rw = Pkt::guest(OP_RW, 21, local);
    rw.data = b"late".to_vec();
    g.send(&rw);
    assert_eq!(g.recv().op, OP_RST);
    // A host that closes both directions: SHUTDOWN with both flags.
    let (s, _) = g.host_connect(24);
    drop(s);
    let p = g.recv();
    assert_eq!((p.op, p.flags), (OP_SHUTDOWN, SHUTDOWN_SEND | SHUTDOWN_RCV));
    // The guest shuts both directions down: the host reads EOF after the
    // data, and the device resets the connection.
    let (mut s, local) = g.host_connect(22);
    let mut rw = Pkt::guest(OP_RW, 22, local);
    rw.data = b"last words".to_vec();
    g.send(&rw);
    let mut sd = Pkt::guest(OP_SHUTDOWN, 22, local);
    sd.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    g.send(&sd);
    let mut b = Vec::new();
    s.read_to_end(&mut b).unwrap();
    assert_eq!(b, b"last words");
    let p = g.recv();
    assert_eq!((p.op, p.src_port, p.dst_port), (OP_RST, local, 22));
}

#[test]
fn half_close_from_the_guest_still_carries_host_data() {
    let mut g = Guest::new();
    let (mut s, local) = g.host_connect(23);
    let mut sd = Pkt::guest(OP_SHUTDOWN, 23, local);
    sd.flags = SHUTDOWN_SEND;
    g.send(&sd);
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "EOF for the host reader");
    s.write_all(b"still here").unwrap();
    let p = g.recv();
    assert_eq!((p.op, p.data.as_slice()), (OP_RW, &b"still here"[..]));
    // The host closes too: both directions done, the device resets.
    drop(s);
    let ops: Vec<u16> = std::iter::from_fn(|| g.recv_within(Duration::from_millis(500)))
        .map(|p| p.op)
        .collect();
    assert_eq!(ops.last(), Some(&OP_RST), "{ops:?}");
}

#[test]
fn malformed_packets_are_dropped_or_reset_and_the_device_goes_on() {
    let mut g = Guest::new();
    // Wrong source CID: dropped, counted, no answer.
    let mut p = Pkt::guest(OP_REQUEST, 1, 2);
    p.src_cid = 42;
    g.send(&p);
    // A length over the most: dropped.
    g.send_raw(Pkt::guest(OP_RW, 1, 2).header(MAX_PKT_DATA + 1), &[]);
    // A length its buffer does not have.
    g.send_raw(Pkt::guest(OP_RW, 1, 2).header(4000), &[1, 2, 3]);
    // A buffer shorter than a header.
    let slot = g.slot();
    g.d.desc(TX, slot, TX_BUF, 10, 0, 0);
    g.send_head(slot);
    // A device-writable transmit buffer.
    let slot = g.slot();
    g.d.desc(TX, slot, TX_BUF, HDR as u32, F_WRITE, 0);
    g.send_head(slot);
    assert_eq!(g.stats.malformed.load(Ordering::Relaxed), 5);
    assert!(g.recv_within(Duration::from_millis(100)).is_none());
    // Unknown op, SEQPACKET, data for no connection: reset each.
    g.send(&Pkt::guest(99, 10, 11));
    let mut sp = Pkt::guest(OP_REQUEST, 12, 13);
    sp.type_ = 2;
    g.send(&sp);
    g.send(&Pkt::guest(OP_RW, 14, 15));
    for (src, dst) in [(11, 10), (13, 12), (15, 14)] {
        let p = g.recv();
        assert_eq!((p.op, p.src_port, p.dst_port), (OP_RST, src, dst));
    }
    // A reset for no connection gets no answer.
    g.send(&Pkt::guest(OP_RST, 16, 17));
    assert!(g.recv_within(Duration::from_millis(100)).is_none());
    // An unknown op on a live connection resets it.
    let (mut s, local) = g.host_connect(30);
    g.send(&Pkt::guest(42, 30, local));
    assert_eq!(g.recv().op, OP_RST);
    let mut b = Vec::new();
    assert_eq!(s.read_to_end(&mut b).unwrap(), 0);
    // Still working, no reset needed.
    let (mut s, local) = g.host_connect(31);
    s.write_all(b"ok").unwrap();
    assert_eq!(g.recv().data, b"ok");
    let _ = local;
    assert_eq!(g.d.status() & status::NEEDS_RESET, 0);
}

#[test]
fn a_broken_chain_needs_a_reset() {
    let mut g = Guest::new();
    // A transmit chain that loops on itself.
    let slot = g.slot();
    g.d.desc(TX, slot, TX_BUF, HDR as u32, F_NEXT, slot);
    let idx = g.tx_idx;
    g.post(1, TX, idx, slot);
    assert!(g.d.faulted());
}

#[test]
fn connections_past_the_cap_are_refused() {
    let mut g = Guest::new();
    let conns: Vec<UnixStream> = (0..MAX_CONNS)
        .map(|_| UnixStream::connect(&g.path).unwrap())
        .collect();
    let mut extra = UnixStream::connect(&g.path).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = Vec::new();
    assert_eq!(extra.read_to_end(&mut b).unwrap(), 0, "refused: closed");
    assert!(g.d.wait(|_| g.stats.refused.load(Ordering::Relaxed) == 1));
    drop(conns);
}

#[test]
fn silent_host_connections_give_their_slots_back() {
    // Every slot taken by clients that never send their CONNECT line:
    // once they are past the handshake timeout, the next client closes
    // them, takes a slot and gets through.
    let mut g = Guest::with(|d| d.with_handshake_timeout(Duration::from_millis(200)));
    let mut silent: Vec<UnixStream> = (0..MAX_CONNS)
        .map(|_| UnixStream::connect(&g.path).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    let (mut s, local) = g.host_connect(50);
    s.write_all(b"late").unwrap();
    assert_eq!(g.recv().data, b"late");
    let _ = local;
    // The silent ones were closed.
    for c in silent.iter_mut().take(3) {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = Vec::new();
        assert_eq!(c.read_to_end(&mut b).unwrap(), 0, "closed");
    }
    assert!(g.stats.refused.load(Ordering::Relaxed) >= MAX_CONNS as u64);
}

/// A host listener that accepts nothing, its backlog full: the guest's
/// connection is reset at once, and the device goes on serving (before,
/// a blocking `connect` stalled the worker, and every connection of the
/// VM with it).
#[test]
fn a_full_backlog_resets_the_guests_connection_without_stalling() {
    use std::os::unix::net::UnixStream;
    let mut g = Guest::new();
    let path = format!("{}_6000", g.path.display());
    let _l = UnixListener::bind(&path).unwrap();
    // fill the backlog with connections nobody accepts
    let mut held = Vec::new();
    loop {
        let s = socket2::Socket::new(
            socket2::Domain::UNIX,
            socket2::Type::STREAM.nonblocking(),
            None,
        )
        .unwrap();
        match s.connect(&socket2::SockAddr::unix(&path).unwrap()) {
            Ok(()) => held.push(UnixStream::from(s)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the backlog: {e}"),
        }
        assert!(held.len() < 10_000, "the backlog never filled");
    }
    let t = std::time::Instant::now();
    g.send(&Pkt::guest(OP_REQUEST, 779, 6000));
    let p = g.recv();
    assert_eq!((p.op, p.src_port, p.dst_port), (OP_RST, 6000, 779));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // the device still serves: another port's listener gets its connection
    let l2 = UnixListener::bind(format!("{}_6001", g.path.display())).unwrap();
    g.send(&Pkt::guest(OP_REQUEST, 780, 6001));
    assert_eq!(g.recv().op, OP_RESPONSE);
    l2.accept().unwrap();
}

#[test]
fn a_packet_split_over_many_buffers_arrives_whole() {
    // The header over two buffers, the payload over three (a zero-copy
    // send gives one buffer per page): the host reads every byte, in
    // order.
    let mut g = Guest::new();
    let (mut s, local) = g.host_connect(40);
    let h = Pkt::guest(OP_RW, 40, local).header(10);
    let parts: [&[u8]; 5] = [&h[..20], &h[20..], b"hello", b"wor", b"ld"];
    g.send_parts(&parts);
    let mut got = [0u8; 10];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"helloworld");
    assert_eq!(g.stats.malformed.load(Ordering::Relaxed), 0);
    // A payload shorter than its length, split the same way: dropped.
    let h = Pkt::guest(OP_RW, 40, local).header(64);
    let parts: [&[u8]; 3] = [&h[..30], &h[30..], b"short"];
    g.send_parts(&parts);
    assert_eq!(g.stats.malformed.load(Ordering::Relaxed), 1);
    assert_eq!(g.d.status() & status::NEEDS_RESET, 0);
}
