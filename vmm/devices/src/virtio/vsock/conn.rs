//! One vsock connection: a host stream and a guest socket, with the
//! credit each side has and what is still owed to the guest.

use super::*;

/// A packet's header fields, as read once from guest memory.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hdr {
    pub(super) src_cid: u64,
    pub(super) dst_cid: u64,
    pub(super) src_port: u32,
    pub(super) dst_port: u32,
    pub(super) len: u32,
    pub(super) type_: u16,
    pub(super) op: u16,
    pub(super) flags: u32,
    pub(super) buf_alloc: u32,
    pub(super) fwd_cnt: u32,
}

impl Hdr {
    /// The header's fields from its 44 bytes (virtio 1.2, 5.10.6:
    /// little-endian `src_cid`, `dst_cid`, `src_port`, `dst_port`, `len`,
    /// `type`, `op`, `flags`, `buf_alloc`, `fwd_cnt`).
    pub(super) fn parse(b: &[u8; PKT_HEADER_SIZE]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap_or_default());
        Self {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }
}

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// A host stream that has not sent its `CONNECT` line yet.
    Handshake,
    /// `OP_REQUEST` to the guest sent (or to send); no answer yet.
    Requesting,
    /// Both sides connected.
    Established,
}

/// One connection: a host stream and a guest socket.
pub(super) struct Conn {
    pub(super) stream: UnixStream,
    pub(super) state: State,
    /// The host side's port (ours).
    pub(super) local_port: u32,
    /// The guest side's port.
    pub(super) peer_port: u32,
    pub(super) line: Vec<u8>,
    // What to send the guest.
    pub(super) need_request: bool,
    pub(super) need_response: bool,
    pub(super) need_shutdown: bool,
    pub(super) need_credit: bool,
    pub(super) need_credit_request: bool,
    pub(super) need_rst: bool,
    // Credit: the guest's (peer) and ours.
    pub(super) peer_buf_alloc: u32,
    pub(super) peer_fwd_cnt: Wrapping<u32>,
    /// Data bytes sent to the guest.
    pub(super) tx_cnt: Wrapping<u32>,
    /// Data bytes received from the guest.
    pub(super) rx_cnt: Wrapping<u32>,
    /// Data bytes written to the host stream.
    pub(super) fwd_cnt: Wrapping<u32>,
    /// The `fwd_cnt` the guest last heard of.
    pub(super) fwd_sent: Wrapping<u32>,
    /// Bytes for the host stream; its first `to_host_ctrl` bytes are ours
    /// (the `OK` line), not the guest's.
    pub(super) to_host: VecDeque<u8>,
    pub(super) to_host_ctrl: usize,
    /// Host bytes read (and credited) but not yet in a receive buffer.
    pub(super) staged: Vec<u8>,
    pub(super) staged_off: usize,
    /// The host stream's read side ended.
    pub(super) host_eof: bool,
    /// The host stream's write side is shut down.
    pub(super) host_wr_shut: bool,
    /// `SHUTDOWN_*` flags the guest sent.
    pub(super) guest_shut: u32,
    /// The host stream hung up or failed: no longer watched.
    pub(super) hung_up: bool,
    /// The epoll interest registered now (0: not registered).
    pub(super) interest: u32,
    /// When the connection was made (a handshake's deadline).
    pub(super) born: std::time::Instant,
}

impl Conn {
    pub(super) fn new(stream: UnixStream, state: State, local_port: u32, peer_port: u32) -> Self {
        Self {
            stream,
            state,
            local_port,
            peer_port,
            line: Vec::new(),
            need_request: false,
            need_response: false,
            need_shutdown: false,
            need_credit: false,
            need_credit_request: false,
            need_rst: false,
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            tx_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            fwd_cnt: Wrapping(0),
            fwd_sent: Wrapping(0),
            to_host: VecDeque::new(),
            to_host_ctrl: 0,
            staged: Vec::new(),
            staged_off: 0,
            host_eof: false,
            host_wr_shut: false,
            guest_shut: 0,
            hung_up: false,
            interest: 0,
            born: std::time::Instant::now(),
        }
    }

    /// Bytes the guest can still take: its `buf_alloc` less what is in
    /// flight, less what is staged for it.
    pub(super) fn peer_credit(&self) -> u32 {
        let in_flight = (self.tx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc
            .saturating_sub(in_flight)
            .saturating_sub((self.staged.len() - self.staged_off) as u32)
    }

    pub(super) fn has_staged(&self) -> bool {
        self.staged_off < self.staged.len()
    }

    pub(super) fn wants_read(&self) -> bool {
        match self.state {
            State::Handshake => true,
            State::Requesting => false,
            State::Established => {
                !self.has_staged()
                    && !self.host_eof
                    && !self.need_rst
                    && self.guest_shut & SHUTDOWN_RCV == 0
                    && self.peer_credit() > 0
            }
        }
    }

    pub(super) fn wanted_interest(&self) -> u32 {
        if self.hung_up {
            return 0;
        }
        let mut i = 0;
        if self.wants_read() {
            i |= EventSet::IN.bits();
        }
        if !self.to_host.is_empty() {
            i |= EventSet::OUT.bits();
        }
        i
    }

    /// Whether it has a packet for the guest.
    pub(super) fn has_outgoing(&self) -> bool {
        self.need_rst
            || self.need_request
            || self.need_response
            || self.need_shutdown
            || self.need_credit
            || self.need_credit_request
            || (self.state == State::Established && self.has_staged())
    }

    /// Resets it: `OP_RST` to the guest, the host stream closed.
    pub(super) fn reset(&mut self) {
        self.need_rst = true;
        self.to_host.clear();
        self.to_host_ctrl = 0;
        self.staged.clear();
        self.staged_off = 0;
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.hung_up = true;
    }

    /// Writes what waits for the host stream. True if bytes moved.
    pub(super) fn flush(&mut self) -> bool {
        let mut moved = false;
        while !self.to_host.is_empty() && !self.need_rst {
            let (a, _) = self.to_host.as_slices();
            match self.stream.write(a) {
                Ok(0) => break,
                Ok(n) => {
                    moved = true;
                    self.to_host.drain(..n);
                    let ctrl = n.min(self.to_host_ctrl);
                    self.to_host_ctrl -= ctrl;
                    self.fwd_cnt += (n - ctrl) as u32;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!(port = self.local_port, "vsock host write: {e}");
                    self.reset();
                }
            }
        }
        // The guest thinks it has less than half our buffer: tell it.
        let seen_free = BUF_ALLOC.saturating_sub((self.rx_cnt - self.fwd_sent).0);
        if seen_free < BUF_ALLOC / 2 && self.fwd_cnt != self.fwd_sent {
            self.need_credit = true;
        }
        self.settle();
        moved
    }

    /// Moves shutdowns on: the host's write side once the guest's data is
    /// out, and `OP_RST` once both directions are done.
    pub(super) fn settle(&mut self) {
        if self.state != State::Established || self.need_rst || !self.to_host.is_empty() {
            return;
        }
        if self.guest_shut & SHUTDOWN_SEND != 0 && !self.host_wr_shut {
            self.host_wr_shut = true;
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        let guest_done = self.guest_shut == SHUTDOWN_RCV | SHUTDOWN_SEND;
        let both_eof = self.guest_shut & SHUTDOWN_SEND != 0 && self.host_eof && !self.has_staged();
        if guest_done || both_eof {
            self.reset();
        }
    }

    /// Reads the host stream: the `CONNECT` line, or data within the
    /// guest's credit. True if it did anything.
    pub(super) fn read_host(&mut self) -> bool {
        match self.state {
            State::Handshake => self.read_line(),
            State::Established if self.wants_read() => self.read_data(),
            _ => false,
        }
    }

    pub(super) fn read_data(&mut self) -> bool {
        let n = (self.peer_credit() as usize).min(STAGE_MAX);
        self.staged.resize(n, 0);
        self.staged_off = 0;
        let r = loop {
            match self.stream.read(&mut self.staged) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        match r {
            Ok(0) => {
                self.staged.clear();
                self.host_eof = true;
                self.need_shutdown = true;
                self.settle();
                true
            }
            Ok(k) => {
                self.staged.truncate(k);
                if self.peer_credit() == 0 {
                    self.need_credit_request = true;
                }
                true
            }
            Err(e) => {
                self.staged.clear();
                if e.kind() == ErrorKind::WouldBlock {
                    return false;
                }
                debug!(port = self.local_port, "vsock host read: {e}");
                self.reset();
                true
            }
        }
    }

    /// Reads the `CONNECT <port>\n` line a byte at a time (so that no
    /// data after it is taken before the guest gives credit).
    pub(super) fn read_line(&mut self) -> bool {
        let mut b = [0u8; 1];
        loop {
            match self.stream.read(&mut b) {
                Ok(0) => {
                    self.hung_up = true;
                    return true;
                }
                Ok(_) if b[0] == b'\n' => {
                    match parse_connect(&self.line) {
                        Some(port) => {
                            self.peer_port = port;
                            self.state = State::Requesting;
                            self.need_request = true;
                        }
                        None => {
                            debug!("vsock: a bad CONNECT line from the host");
                            self.hung_up = true;
                        }
                    }
                    return true;
                }
                Ok(_) if self.line.len() >= MAX_LINE => {
                    self.hung_up = true;
                    return true;
                }
                Ok(_) => self.line.push(b[0]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(_) => {
                    self.hung_up = true;
                    return true;
                }
            }
        }
    }
}

/// The port of a `CONNECT <port>` line (a trailing `\r` allowed).
pub(super) fn parse_connect(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let port = s.strip_prefix("CONNECT ")?;
    port.trim().parse().ok()
}
