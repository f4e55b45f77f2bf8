//! The worker side of the vsock device: the queues, the host listener and
//! streams on one epoll fd, and the packets between them.

use super::conn::{Conn, Hdr, State};
use super::*;

/// The listener's epoll token; connections have 1 and up.
pub(super) const LISTENER: u64 = 0;

/// A queue the handler serves.
pub(super) struct Served {
    pub(super) queue: Queue,
    pub(super) vector: u16,
}

/// What the handler talks to: the listener, the connections, its epoll.
pub(super) struct Backend {
    pub(super) cid: u64,
    pub(super) path: PathBuf,
    pub(super) listener: Arc<UnixListener>,
    pub(super) epoll: Epoll,
    pub(super) stats: Arc<VsockStats>,
    pub(super) handshake_timeout: std::time::Duration,
}

/// The device's queues and connections, on its I/O thread.
pub(super) struct VsockQueues {
    pub(super) be: Backend,
    pub(super) mem: Option<Memory>,
    pub(super) interrupt: Arc<VirtioInterrupt>,
    pub(super) rx: Option<Served>,
    pub(super) tx: Option<Served>,
    pub(super) conns: BTreeMap<u64, Conn>,
    /// (local port, peer port) to token, for established or
    /// requesting connections.
    pub(super) by_ports: HashMap<(u32, u32), u64>,
    pub(super) next_token: u64,
    pub(super) next_port: u32,
    /// The token after which the next receive round starts.
    pub(super) cursor: u64,
    /// `OP_RST`s for packets of no connection: (local, peer) ports.
    pub(super) stray: VecDeque<(u32, u32)>,
    pub(super) buf: Vec<u8>,
}

/// Ports the device picks for host-initiated connections start here.
pub(super) const FIRST_LOCAL_PORT: u32 = 1 << 30;

impl VsockQueues {
    pub(super) fn new(be: Backend) -> Self {
        Self {
            be,
            mem: None,
            interrupt: Arc::new(VirtioInterrupt::standalone("vsock")),
            rx: None,
            tx: None,
            conns: BTreeMap::new(),
            by_ports: HashMap::new(),
            next_token: 1,
            next_port: FIRST_LOCAL_PORT,
            cursor: 0,
            stray: VecDeque::new(),
            buf: Vec::new(),
        }
    }

    /// Does everything that can be done now: guest packets, new host
    /// connections, host bytes both ways, packets for the guest; until
    /// nothing moves.
    pub(super) fn pump(&mut self) -> Result<(), String> {
        // Each round either moves something or ends the loop; the bound
        // only keeps a bug from spinning the thread forever.
        for _ in 0..100_000 {
            let mut moved = self.drain_tx()?;
            self.sync_interests();
            moved |= self.host_events();
            moved |= self.fill_rx()?;
            self.sync_interests();
            if !moved {
                return Ok(());
            }
        }
        warn!("vsock: the I/O loop did not settle; going on at the next event");
        Ok(())
    }

    /// Registers each connection's epoll interest where it changed, and
    /// forgets connections that are done.
    pub(super) fn sync_interests(&mut self) {
        let mut gone = Vec::new();
        for (&t, c) in self.conns.iter_mut() {
            if c.hung_up && !c.need_rst {
                // A handshake that failed: forget it; a host stream that
                // went away while the guest was asked: reset. An
                // established one goes on to its shutdown (what the
                // guest still sends fails to write and resets it).
                match c.state {
                    State::Handshake => {
                        gone.push(t);
                        continue;
                    }
                    State::Requesting => c.reset(),
                    State::Established => {}
                }
            }
            let want = c.wanted_interest();
            if want == c.interest {
                continue;
            }
            let fd = c.stream.as_raw_fd();
            let r = match (c.interest, want) {
                (_, 0) => self
                    .be
                    .epoll
                    .ctl(ControlOperation::Delete, fd, EpollEvent::default()),
                (0, w) => add_fd(&self.be.epoll, fd, w, t),
                (_, w) => self.be.epoll.ctl(
                    ControlOperation::Modify,
                    fd,
                    EpollEvent::new(EventSet::from_bits_truncate(w), t),
                ),
            };
            match r {
                Ok(()) => c.interest = want,
                Err(e) => {
                    warn!("vsock: watching a host stream: {e}");
                    c.reset();
                    c.interest = 0;
                }
            }
        }
        for t in gone {
            self.forget(t);
        }
    }

    pub(super) fn forget(&mut self, t: u64) {
        if let Some(c) = self.conns.remove(&t) {
            if self.by_ports.get(&(c.local_port, c.peer_port)) == Some(&t) {
                self.by_ports.remove(&(c.local_port, c.peer_port));
            }
        }
    }

    /// Serves the epoll events ready now. True if anything moved.
    pub(super) fn host_events(&mut self) -> bool {
        let mut events = [EpollEvent::default(); 64];
        let n = match self.be.epoll.wait(0, &mut events) {
            Ok(n) => n,
            Err(e) => {
                if e.kind() != ErrorKind::Interrupted {
                    warn!("vsock: epoll_wait: {e}");
                }
                return false;
            }
        };
        let mut moved = false;
        for ev in &events[..n] {
            let t = ev.data();
            if t == LISTENER {
                moved |= self.accept();
                continue;
            }
            let Some(c) = self.conns.get_mut(&t) else {
                continue;
            };
            let set = ev.event_set();
            if set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR) {
                moved |= c.read_host();
            }
            if set.contains(EventSet::OUT) || !c.to_host.is_empty() {
                moved |= c.flush();
            }
            let gone = c.state != State::Established || c.host_eof;
            if set.intersects(EventSet::HANG_UP | EventSet::ERROR) && gone && !c.hung_up {
                // Nothing more will come; level-triggered it would be
                // reported again and again.
                c.hung_up = true;
                moved = true;
            }
            if c.state == State::Requesting && c.local_port == 0 {
                moved |= self.assign_port(t);
            }
        }
        moved
    }

    /// Gives a host connection that named its guest port a local port.
    pub(super) fn assign_port(&mut self, t: u64) -> bool {
        let Some(c) = self.conns.get_mut(&t) else {
            return false;
        };
        let mut port = self.next_port;
        while self.by_ports.contains_key(&(port, c.peer_port)) {
            port = port.wrapping_add(1).max(FIRST_LOCAL_PORT);
        }
        self.next_port = port.wrapping_add(1).max(FIRST_LOCAL_PORT);
        c.local_port = port;
        self.by_ports.insert((port, c.peer_port), t);
        true
    }

    /// Takes the host's new connections.
    pub(super) fn accept(&mut self) -> bool {
        let mut moved = false;
        loop {
            let stream = match self.be.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if e.kind() != ErrorKind::WouldBlock {
                        warn!("vsock: accept: {e}");
                    }
                    return moved;
                }
            };
            moved = true;
            self.expire_handshakes();
            if self.conns.len() >= MAX_CONNS {
                warn!("vsock: {MAX_CONNS} connections already; refusing a host connection");
                self.be.stats.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let Err(e) = stream.set_nonblocking(true) {
                warn!("vsock: a host connection: {e}");
                continue;
            }
            let t = self.next_token;
            self.next_token += 1;
            self.conns
                .insert(t, Conn::new(stream, State::Handshake, 0, 0));
        }
    }

    /// Closes the host connections that have not sent their `CONNECT`
    /// line in time.
    fn expire_handshakes(&mut self) {
        let limit = self.be.handshake_timeout;
        let stale: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Handshake && c.born.elapsed() > limit)
            .map(|(t, _)| *t)
            .collect();
        for t in stale {
            debug!("vsock: a host connection sent no CONNECT line in {limit:?}; closed");
            self.be.stats.refused.fetch_add(1, Ordering::Relaxed);
            self.forget(t);
        }
    }

    pub(super) fn signal(&self, s: &mut Served) -> Result<(), String> {
        match &self.mem {
            Some(m) => self.interrupt.signal_used(&mut s.queue, m, s.vector),
            None => Ok(()),
        }
    }

    /// Takes every packet the guest queued. True if it took any.
    pub(super) fn drain_tx(&mut self) -> Result<bool, String> {
        let (Some(mut tx), Some(mem)) = (self.tx.take(), self.mem.clone()) else {
            return Ok(false);
        };
        let r = self.drain_tx_on(&mut tx, &mem);
        let out = match r {
            Ok(true) => self.signal(&mut tx).map(|()| true),
            other => other,
        };
        self.tx = Some(tx);
        out
    }

    pub(super) fn drain_tx_on(&mut self, tx: &mut Served, mem: &Memory) -> Result<bool, String> {
        let mut used = false;
        loop {
            while let Some(head) = pop_checked(&mut tx.queue, mem)? {
                let index = head.head_index();
                let read = chain::walk(head, mem)
                    .map_err(|e| e.to_string())
                    .and_then(|c| read_tx(mem, &c, &mut self.buf));
                match read {
                    Ok(hdr) => self.guest_packet(hdr),
                    Err(e) => {
                        debug!("vsock: a malformed guest packet: {e}");
                        self.be.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tx.queue
                    .add_used(mem, index, 0)
                    .map_err(|e| e.to_string())?;
                used = true;
            }
            if !tx
                .queue
                .enable_notification(mem)
                .map_err(|e| e.to_string())?
            {
                return Ok(used);
            }
        }
    }

    pub(super) fn stray_rst(&mut self, local: u32, peer: u32) {
        if self.stray.len() < MAX_STRAY {
            self.stray.push_back((local, peer));
        } else {
            debug!("vsock: too many resets waiting; dropping one");
        }
    }

    /// One packet from the guest, its payload in `self.buf`.
    pub(super) fn guest_packet(&mut self, h: Hdr) {
        if h.src_cid != self.be.cid || h.dst_cid != HOST_CID {
            debug!(
                src = h.src_cid,
                dst = h.dst_cid,
                "vsock: a packet with wrong CIDs"
            );
            self.be.stats.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let key = (h.dst_port, h.src_port);
        let known = self.by_ports.get(&key).copied();
        match known {
            _ if h.type_ != TYPE_STREAM => {
                if h.op != OP_RST {
                    self.stray_rst(key.0, key.1);
                }
            }
            None if h.op == OP_REQUEST => self.guest_connect(h),
            None if h.op == OP_RST => {}
            None => self.stray_rst(key.0, key.1),
            Some(t) => self.conn_packet(t, h),
        }
    }

    /// The guest connects to host port `P` (`dst_port`): `<socket>_<P>`.
    pub(super) fn guest_connect(&mut self, h: Hdr) {
        let (local, peer) = (h.dst_port, h.src_port);
        if self.conns.len() >= MAX_CONNS {
            warn!("vsock: {MAX_CONNS} connections already; refusing the guest's");
            self.be.stats.refused.fetch_add(1, Ordering::Relaxed);
            self.stray_rst(local, peer);
            return;
        }
        let mut p: OsString = self.be.path.clone().into_os_string();
        p.push(format!("_{local}"));
        let stream = connect_nonblocking(Path::new(&p));
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                debug!(
                    "vsock: the guest's connection to {}: {e}",
                    Path::new(&p).display()
                );
                self.be.stats.refused.fetch_add(1, Ordering::Relaxed);
                self.stray_rst(local, peer);
                return;
            }
        };
        let mut c = Conn::new(stream, State::Established, local, peer);
        c.need_response = true;
        c.peer_buf_alloc = h.buf_alloc;
        c.peer_fwd_cnt = Wrapping(h.fwd_cnt);
        let t = self.next_token;
        self.next_token += 1;
        self.conns.insert(t, c);
        self.by_ports.insert((local, peer), t);
        self.be.stats.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A packet of connection `t`.
    pub(super) fn conn_packet(&mut self, t: u64, h: Hdr) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        if c.need_rst {
            return; // being reset: whatever it says now is moot
        }
        c.peer_buf_alloc = h.buf_alloc;
        c.peer_fwd_cnt = Wrapping(h.fwd_cnt);
        match h.op {
            OP_RESPONSE if c.state == State::Requesting => {
                c.state = State::Established;
                let line = format!("OK {}\n", c.local_port);
                c.to_host_ctrl += line.len();
                c.to_host.extend(line.as_bytes());
                c.flush();
                self.be.stats.connections.fetch_add(1, Ordering::Relaxed);
            }
            OP_RW if c.state == State::Established && c.guest_shut & SHUTDOWN_SEND == 0 => {
                let held = (c.rx_cnt - c.fwd_cnt).0;
                if u64::from(held) + u64::from(h.len) > u64::from(BUF_ALLOC) {
                    warn!(port = c.local_port, "vsock: the guest sent past its credit");
                    c.reset();
                    return;
                }
                c.rx_cnt += h.len;
                c.to_host.extend(&self.buf);
                c.flush();
            }
            OP_CREDIT_UPDATE => {}
            OP_CREDIT_REQUEST => c.need_credit = true,
            OP_SHUTDOWN if c.state == State::Established => {
                // No flags: as good as both (the guest is going away).
                let f = h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                c.guest_shut |= if f == 0 {
                    SHUTDOWN_RCV | SHUTDOWN_SEND
                } else {
                    f
                };
                if c.guest_shut & SHUTDOWN_RCV != 0 {
                    c.staged.clear();
                    c.staged_off = 0;
                    c.need_shutdown = false;
                }
                c.settle();
            }
            OP_RST => {
                // Best effort for what is buffered, then close.
                c.flush();
                self.forget(t);
            }
            _ => {
                debug!(op = h.op, "vsock: a packet the connection cannot take");
                c.reset();
            }
        }
    }

    /// Hands the guest what waits for it, as long as it has receive
    /// buffers. True if it used any.
    pub(super) fn fill_rx(&mut self) -> Result<bool, String> {
        let (Some(mut rx), Some(mem)) = (self.rx.take(), self.mem.clone()) else {
            return Ok(false);
        };
        let r = self.fill_rx_on(&mut rx, &mem);
        let out = match r {
            Ok(true) => self.signal(&mut rx).map(|()| true),
            other => other,
        };
        self.rx = Some(rx);
        out
    }

    pub(super) fn fill_rx_on(&mut self, rx: &mut Served, mem: &Memory) -> Result<bool, String> {
        let mut used = false;
        while let Some(next) = self.next_outgoing() {
            let Some(mut head) = pop_checked(&mut rx.queue, mem)? else {
                if rx
                    .queue
                    .enable_notification(mem)
                    .map_err(|e| e.to_string())?
                {
                    continue;
                }
                break;
            };
            let index = head.head_index();
            let mut pkt = VsockPacket::from_rx_virtq_chain(mem, &mut head, MAX_PKT_DATA)
                .map_err(|e| format!("receive chain {index}: {e}"))?;
            let len = self.write_packet(next, &mut pkt)?;
            rx.queue
                .add_used(mem, index, len)
                .map_err(|e| e.to_string())?;
            used = true;
        }
        Ok(used)
    }

    /// What gets the next receive buffer: a stray reset first, then the
    /// connections in turn after the last one served.
    pub(super) fn next_outgoing(&mut self) -> Option<Outgoing> {
        if let Some(&(l, p)) = self.stray.front() {
            return Some(Outgoing::Stray(l, p));
        }
        let after = self.conns.range(self.cursor + 1..).map(|(t, c)| (*t, c));
        let before = self.conns.range(..=self.cursor).map(|(t, c)| (*t, c));
        let t = after
            .chain(before)
            .find(|(_, c)| c.state != State::Handshake && c.has_outgoing())
            .map(|(t, _)| t)?;
        self.cursor = t;
        Some(Outgoing::Conn(t))
    }

    /// Writes the next packet of `what` into `pkt`: the used length.
    pub(super) fn write_packet(
        &mut self,
        what: Outgoing,
        pkt: &mut VsockPacket<'_, ()>,
    ) -> Result<u32, String> {
        let zero = [0u8; PKT_HEADER_SIZE];
        pkt.header_slice()
            .write_slice(&zero, 0)
            .map_err(|e| format!("writing a vsock header: {e}"))?;
        pkt.set_src_cid(HOST_CID)
            .set_dst_cid(self.be.cid)
            .set_type(TYPE_STREAM)
            .set_buf_alloc(BUF_ALLOC);
        let t = match what {
            Outgoing::Stray(l, p) => {
                self.stray.pop_front();
                pkt.set_src_port(l).set_dst_port(p).set_op(OP_RST);
                self.be.stats.resets.fetch_add(1, Ordering::Relaxed);
                return Ok(PKT_HEADER_SIZE as u32);
            }
            Outgoing::Conn(t) => t,
        };
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(PKT_HEADER_SIZE as u32);
        };
        pkt.set_src_port(c.local_port)
            .set_dst_port(c.peer_port)
            .set_fwd_cnt(c.fwd_cnt.0);
        c.fwd_sent = c.fwd_cnt;
        c.need_credit = false;
        let (op, n) = next_conn_packet(c, pkt)?;
        pkt.set_op(op).set_len(n);
        if op == OP_RST {
            self.be.stats.resets.fetch_add(1, Ordering::Relaxed);
            self.forget(t);
        }
        Ok(PKT_HEADER_SIZE as u32 + n)
    }
}

/// The op (and payload length) of connection `c`'s next packet, its
/// payload written into `pkt`.
pub(super) fn next_conn_packet(
    c: &mut Conn,
    pkt: &mut VsockPacket<'_, ()>,
) -> Result<(u16, u32), String> {
    if c.need_rst {
        return Ok((OP_RST, 0));
    }
    if c.need_request {
        c.need_request = false;
        return Ok((OP_REQUEST, 0));
    }
    if c.need_response {
        c.need_response = false;
        return Ok((OP_RESPONSE, 0));
    }
    if c.state == State::Established && c.has_staged() {
        if let Some(d) = pkt.data_slice() {
            let n = (c.staged.len() - c.staged_off).min(d.len());
            d.write_slice(&c.staged[c.staged_off..c.staged_off + n], 0)
                .map_err(|e| format!("writing a vsock payload: {e}"))?;
            c.staged_off += n;
            c.tx_cnt += n as u32;
            if !c.has_staged() {
                c.staged.clear();
                c.staged_off = 0;
            }
            return Ok((OP_RW, n as u32));
        }
    }
    if c.need_shutdown && !c.has_staged() {
        c.need_shutdown = false;
        // A host that closed both directions (hung up) takes nothing
        // more either; one that only shut its writing side still reads.
        let rcv = if c.hung_up { SHUTDOWN_RCV } else { 0 };
        pkt.set_flags(SHUTDOWN_SEND | rcv);
        return Ok((OP_SHUTDOWN, 0));
    }
    if c.need_credit_request {
        c.need_credit_request = false;
        return Ok((OP_CREDIT_REQUEST, 0));
    }
    // A credit update (asked for, or a buffer too small for data).
    Ok((OP_CREDIT_UPDATE, 0))
}

/// Who gets the next receive buffer.
#[derive(Clone, Copy, Debug)]
pub(super) enum Outgoing {
    /// A reset for a packet of no connection: (local, peer) ports.
    Stray(u32, u32),
    /// A connection, by token.
    Conn(u64),
}

pub(super) fn add_fd(epoll: &Epoll, fd: RawFd, interest: u32, token: u64) -> std::io::Result<()> {
    epoll.ctl(
        ControlOperation::Add,
        fd,
        EpollEvent::new(EventSet::from_bits_truncate(interest), token),
    )
}

/// A guest packet from a transmit chain: its header, its payload into
/// `buf`. Header and payload may be split over any number of
/// device-readable buffers (virtio 1.2 leaves the split to the driver:
/// Linux 6.1 sends the header and the payload apart, 6.2 and later may
/// send both in one buffer, and a zero-copy send one buffer per page).
/// Refused: a device-writable buffer, fewer bytes than a header, a
/// length over [`MAX_PKT_DATA`], or fewer bytes than the length says.
pub(super) fn read_tx(mem: &Memory, c: &chain::Chain, buf: &mut Vec<u8>) -> Result<Hdr, String> {
    if !c.writable.is_empty() {
        return Err("a device-writable buffer in a transmit chain".into());
    }
    let total = c.readable_len();
    if total < PKT_HEADER_SIZE as u64 {
        return Err(format!("{total} bytes, less than a header"));
    }
    let mut head = [0u8; PKT_HEADER_SIZE];
    buf.clear();
    let mut at = 0usize;
    let mut want = PKT_HEADER_SIZE;
    let mut hdr = None;
    for b in &c.readable {
        let mut off = 0u64;
        while off < u64::from(b.len) && at < want {
            let n = ((u64::from(b.len) - off) as usize).min(want - at);
            let addr = vm_memory::GuestAddress(b.addr.0 + off);
            if at < PKT_HEADER_SIZE {
                mem.read_slice(&mut head[at..at + n], addr)
            } else {
                let from = buf.len();
                buf.resize(from + n, 0);
                mem.read_slice(&mut buf[from..], addr)
            }
            .map_err(|e| e.to_string())?;
            at += n;
            off += n as u64;
            if at == PKT_HEADER_SIZE && hdr.is_none() {
                let h = Hdr::parse(&head);
                if h.len > MAX_PKT_DATA {
                    return Err(format!("length {} over {MAX_PKT_DATA}", h.len));
                }
                want += h.len as usize;
                hdr = Some(h);
            }
        }
    }
    match hdr {
        Some(h) if at == want => Ok(h),
        Some(h) => Err(format!(
            "length {} with {} payload bytes",
            h.len,
            at - PKT_HEADER_SIZE
        )),
        None => Err("no header".into()),
    }
}

/// The next chain of `queue`, checked strictly by [`chain::walk`] (a
/// broken chain is a guest error), still whole for the packet parser.
pub(super) fn pop_checked<'m>(
    queue: &mut Queue,
    mem: &'m Memory,
) -> Result<Option<DescriptorChain<&'m Memory>>, String> {
    if chain::available(queue, mem).map_err(|e| e.to_string())? == 0 {
        return Ok(None);
    }
    let Some(c) = queue.pop_descriptor_chain(mem) else {
        return Err("the available ring cannot be read".into());
    };
    chain::walk(c.clone(), mem).map_err(|e| e.to_string())?;
    Ok(Some(c))
}

impl QueueHandler for VsockQueues {
    fn process(&mut self, _index: usize) -> Result<(), String> {
        // New receive buffers, new packets: either may unblock anything.
        self.pump()
    }

    fn host_fds(&self) -> Vec<RawFd> {
        vec![self.be.epoll.as_raw_fd()]
    }

    fn host_ready(&mut self, _k: usize) -> Result<(), String> {
        self.pump()
    }
}

/// Connects to the Unix socket `path` without waiting: a listener whose
/// backlog is full answers `EAGAIN` at once (the guest gets `OP_RST`)
/// instead of stalling the device's worker, and with it every other
/// connection of this VM. The stream comes back non-blocking.
fn connect_nonblocking(path: &Path) -> std::io::Result<UnixStream> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let s = Socket::new(Domain::UNIX, Type::STREAM.nonblocking().cloexec(), None)?;
    s.connect(&SockAddr::unix(path)?)?;
    Ok(s.into())
}
