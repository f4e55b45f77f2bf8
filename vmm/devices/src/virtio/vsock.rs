//! virtio-vsock (virtio 1.2, 5.10) with a "hybrid" host side over Unix
//! sockets: stream sockets only, no `SEQPACKET`.
//!
//! The host side follows the idea of Firecracker's and Cloud Hypervisor's
//! hybrid vsock (their documentation describes the protocol; this is our
//! own implementation of it):
//!
//! * The VMM listens on the Unix socket `socket`. A host process connects
//!   and writes `CONNECT <port>\n`; the device asks the guest for a
//!   connection to guest port `<port>` (`OP_REQUEST`, from a host port it
//!   picks). On the guest's `OP_RESPONSE` the host stream gets
//!   `OK <host port>\n`, then bytes flow both ways. On the guest's
//!   `OP_RST` the host stream is closed.
//! * A guest connection to host port `P` (`OP_REQUEST` to CID 2) connects
//!   to the Unix socket `<socket>_<P>`: `OP_RESPONSE` when that works,
//!   `OP_RST` when it does not.
//!
//! Flow control is the virtio one, credit based, per connection:
//!
//! * Guest to host: the device advertises [`BUF_ALLOC`] bytes and counts
//!   in `fwd_cnt` what it has written to the host stream. A slow host
//!   reader leaves bytes in the connection's buffer, which the guest's
//!   credit keeps under [`BUF_ALLOC`]; a guest that sends past its credit
//!   gets its connection reset (nothing is dropped silently). When the
//!   guest's view of our free space falls under half, the device sends
//!   `OP_CREDIT_UPDATE`; it answers `OP_CREDIT_REQUEST` with one too.
//! * Host to guest: the device reads a host stream only while the
//!   guest's credit (`buf_alloc - (tx_cnt - fwd_cnt)`, from the guest's
//!   latest header) has room, at most [`STAGE_MAX`] bytes at a time, and
//!   asks for credit (`OP_CREDIT_REQUEST`) when it has none.
//!
//! Shutdown: host EOF sends `OP_SHUTDOWN` (`SEND`, and `RCV` too when the
//! host closed both directions) to the guest; the
//! guest's `OP_SHUTDOWN` shuts the host stream's matching side down once
//! its buffered bytes are written; when both directions are done the
//! device sends `OP_RST` and forgets the connection. A host write error
//! resets the connection.
//!
//! The guest is untrusted: a broken descriptor chain (see
//! [`chain::walk`]) or a receive chain the device cannot write is a guest
//! error (`NEEDS_RESET`). A malformed packet (too short a buffer, a
//! length over [`MAX_PKT_DATA`], a wrong CID) is dropped, logged and
//! counted ([`VsockStats::malformed`]); an unknown op, a `SEQPACKET`
//! packet or a packet for no connection is answered `OP_RST`. At most
//! [`MAX_CONNS`] connections (handshakes included) live at once; more are
//! refused (host side: closed; guest side: `OP_RST`).
//!
//! Host streams, the listener and the worker's view of them: the worker
//! watches one epoll fd of its own (edge-triggered, through
//! [`QueueHandler::host_fds`]), in which the listener and every stream
//! are level-triggered with the interest each needs now (read only while
//! there is credit, write only while bytes wait).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::OsString;
use std::io::{ErrorKind, Read, Write};
use std::num::Wrapping;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::{debug, warn};
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::Bytes;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::chain;
use super::worker::{QueueHandler, Worker};
use super::{Activation, Memory, VirtioDevice, VirtioInterrupt};
use crate::DeviceError;

/// Queue size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// The host's CID.
pub const HOST_CID: u64 = 2;
/// The smallest CID a guest may have (0-2 are reserved).
pub const MIN_GUEST_CID: u64 = 3;
/// Bytes of guest data the device buffers per connection (its
/// advertised `buf_alloc`).
pub const BUF_ALLOC: u32 = 64 * 1024;
/// Most bytes read from a host stream at once.
pub const STAGE_MAX: usize = 16 * 1024;
/// The largest payload of one packet.
pub const MAX_PKT_DATA: u32 = 64 * 1024;
/// The most connections at once.
pub const MAX_CONNS: usize = 128;
/// The longest `CONNECT <port>\n` line.
const MAX_LINE: usize = 32;
/// Most `OP_RST`s for no connection waiting for receive buffers.
const MAX_STRAY: usize = 256;

/// Stream sockets.
pub const TYPE_STREAM: u16 = 1;
/// Connection request.
pub const OP_REQUEST: u16 = 1;
/// Connection accepted.
pub const OP_RESPONSE: u16 = 2;
/// Connection reset.
pub const OP_RST: u16 = 3;
/// One or both directions shut down.
pub const OP_SHUTDOWN: u16 = 4;
/// Data.
pub const OP_RW: u16 = 5;
/// Here is my credit.
pub const OP_CREDIT_UPDATE: u16 = 6;
/// Tell me your credit.
pub const OP_CREDIT_REQUEST: u16 = 7;
/// `OP_SHUTDOWN`: the sender will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// `OP_SHUTDOWN`: the sender will send no more.
pub const SHUTDOWN_SEND: u32 = 2;

/// Why a vsock device could not be made.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// CIDs 0, 1 and 2 are reserved.
    #[error("vsock cid {0}: a guest CID must be 3 or more (0-2 are reserved)")]
    Cid(u64),
    /// The socket path exists; it is not ours to remove.
    #[error("vsock socket {0}: the path exists; remove it or choose another (the VMM creates it)")]
    Exists(PathBuf),
    /// Binding the listener failed.
    #[error("vsock socket {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl From<VsockError> for DeviceError {
    fn from(e: VsockError) -> Self {
        match e {
            VsockError::Bind { path, source } => DeviceError::Host {
                what: format!("vsock socket {}", path.display()),
                source,
            },
            other => DeviceError::Host {
                what: other.to_string(),
                source: std::io::Error::from(ErrorKind::InvalidInput),
            },
        }
    }
}

/// Counters, shared with whoever wants to read them.
#[derive(Debug, Default)]
pub struct VsockStats {
    /// Connections that got established (both directions).
    pub connections: AtomicU64,
    /// Guest packets dropped as malformed.
    pub malformed: AtomicU64,
    /// `OP_RST`s sent to the guest.
    pub resets: AtomicU64,
    /// Connections refused: over [`MAX_CONNS`], a bad `CONNECT` line, or
    /// no host socket for a guest's request.
    pub refused: AtomicU64,
}

/// The virtio-vsock device.
#[derive(Debug)]
pub struct Vsock {
    name: String,
    cid: u64,
    path: PathBuf,
    listener: Arc<UnixListener>,
    /// The socket file's (device, inode), to remove only our own.
    ident: Option<(u64, u64)>,
    worker: Option<Worker>,
    stats: Arc<VsockStats>,
}

impl Vsock {
    /// A device for guest CID `cid`, listening on `path` (which must not
    /// exist; the device creates it and removes it when dropped).
    pub fn new(name: &str, cid: u64, path: &Path) -> Result<Self, VsockError> {
        if cid < MIN_GUEST_CID || cid > u64::from(u32::MAX) {
            return Err(VsockError::Cid(cid));
        }
        if path.symlink_metadata().is_ok() {
            return Err(VsockError::Exists(path.to_path_buf()));
        }
        let bind = |source| VsockError::Bind {
            path: path.to_path_buf(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(|e| {
            if e.kind() == ErrorKind::AddrInUse {
                VsockError::Exists(path.to_path_buf())
            } else {
                bind(e)
            }
        })?;
        listener.set_nonblocking(true).map_err(bind)?;
        let ident = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        Ok(Self {
            name: name.to_string(),
            cid,
            path: path.to_path_buf(),
            listener: Arc::new(listener),
            ident,
            worker: None,
            stats: Arc::default(),
        })
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<VsockStats> {
        self.stats.clone()
    }

    /// The socket it listens on.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        self.reset();
        // Only the socket file this device made: not one somebody put
        // in its place since.
        let ours = std::fs::symlink_metadata(&self.path)
            .ok()
            .is_some_and(|m| Some((m.dev(), m.ino())) == self.ident);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                debug!(device = %self.name, "removing {}: {e}", self.path.display());
            }
        }
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }
    fn pci_class(&self) -> u32 {
        // Other communication controller.
        0x07_80_00
    }
    fn features(&self) -> u64 {
        // VERSION_1 (added by the transport); stream sockets only.
        0
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 3]
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let c = self.cid.to_le_bytes();
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
        let epoll = Epoll::new().map_err(|source| DeviceError::Host {
            what: "creating the vsock epoll fd".into(),
            source,
        })?;
        epoll
            .ctl(
                ControlOperation::Add,
                self.listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER),
            )
            .map_err(|source| DeviceError::Host {
                what: "watching the vsock listener".into(),
                source,
            })?;
        let mut h = VsockQueues::new(Backend {
            cid: self.cid,
            path: self.path.clone(),
            listener: self.listener.clone(),
            epoll,
            stats: self.stats.clone(),
        });
        h.mem = Some(a.mem.clone());
        h.interrupt = a.interrupt.clone();
        let mut events = Vec::new();
        for q in a.queues {
            let served = Served {
                queue: q.queue,
                vector: q.vector,
            };
            match q.index {
                0 => h.rx = Some(served),
                1 => h.tx = Some(served),
                _ => {} // the event queue: no events to send
            }
            events.push((q.index, q.event));
        }
        self.worker = Some(Worker::spawn_on(
            &self.name,
            h,
            events,
            a.interrupt,
            a.io_cpus,
        )?);
        Ok(())
    }
    fn reset(&mut self) {
        if let Some(w) = self.worker.take() {
            w.stop();
        }
    }
}

/// The listener's epoll token; connections have 1 and up.
const LISTENER: u64 = 0;

/// A queue the handler serves.
struct Served {
    queue: Queue,
    vector: u16,
}

/// A packet's header fields, as read once from guest memory.
#[derive(Clone, Copy, Debug)]
struct Hdr {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    len: u32,
    type_: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

impl Hdr {
    fn of(p: &VsockPacket<'_, ()>) -> Self {
        Self {
            src_cid: p.src_cid(),
            dst_cid: p.dst_cid(),
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            len: p.len(),
            type_: p.type_(),
            op: p.op(),
            flags: p.flags(),
            buf_alloc: p.buf_alloc(),
            fwd_cnt: p.fwd_cnt(),
        }
    }
}

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A host stream that has not sent its `CONNECT` line yet.
    Handshake,
    /// `OP_REQUEST` to the guest sent (or to send); no answer yet.
    Requesting,
    /// Both sides connected.
    Established,
}

/// One connection: a host stream and a guest socket.
struct Conn {
    stream: UnixStream,
    state: State,
    /// The host side's port (ours).
    local_port: u32,
    /// The guest side's port.
    peer_port: u32,
    line: Vec<u8>,
    // What to send the guest.
    need_request: bool,
    need_response: bool,
    need_shutdown: bool,
    need_credit: bool,
    need_credit_request: bool,
    need_rst: bool,
    // Credit: the guest's (peer) and ours.
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Data bytes sent to the guest.
    tx_cnt: Wrapping<u32>,
    /// Data bytes received from the guest.
    rx_cnt: Wrapping<u32>,
    /// Data bytes written to the host stream.
    fwd_cnt: Wrapping<u32>,
    /// The `fwd_cnt` the guest last heard of.
    fwd_sent: Wrapping<u32>,
    /// Bytes for the host stream; its first `to_host_ctrl` bytes are ours
    /// (the `OK` line), not the guest's.
    to_host: VecDeque<u8>,
    to_host_ctrl: usize,
    /// Host bytes read (and credited) but not yet in a receive buffer.
    staged: Vec<u8>,
    staged_off: usize,
    /// The host stream's read side ended.
    host_eof: bool,
    /// The host stream's write side is shut down.
    host_wr_shut: bool,
    /// `SHUTDOWN_*` flags the guest sent.
    guest_shut: u32,
    /// The host stream hung up or failed: no longer watched.
    hung_up: bool,
    /// The epoll interest registered now (0: not registered).
    interest: u32,
}

impl Conn {
    fn new(stream: UnixStream, state: State, local_port: u32, peer_port: u32) -> Self {
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
        }
    }

    /// Bytes the guest can still take: its `buf_alloc` less what is in
    /// flight, less what is staged for it.
    fn peer_credit(&self) -> u32 {
        let in_flight = (self.tx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc
            .saturating_sub(in_flight)
            .saturating_sub((self.staged.len() - self.staged_off) as u32)
    }

    fn has_staged(&self) -> bool {
        self.staged_off < self.staged.len()
    }

    fn wants_read(&self) -> bool {
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

    fn wanted_interest(&self) -> u32 {
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
    fn has_outgoing(&self) -> bool {
        self.need_rst
            || self.need_request
            || self.need_response
            || self.need_shutdown
            || self.need_credit
            || self.need_credit_request
            || (self.state == State::Established && self.has_staged())
    }

    /// Resets it: `OP_RST` to the guest, the host stream closed.
    fn reset(&mut self) {
        self.need_rst = true;
        self.to_host.clear();
        self.to_host_ctrl = 0;
        self.staged.clear();
        self.staged_off = 0;
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.hung_up = true;
    }

    /// Writes what waits for the host stream. True if bytes moved.
    fn flush(&mut self) -> bool {
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
    fn settle(&mut self) {
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
    fn read_host(&mut self) -> bool {
        match self.state {
            State::Handshake => self.read_line(),
            State::Established if self.wants_read() => self.read_data(),
            _ => false,
        }
    }

    fn read_data(&mut self) -> bool {
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
    fn read_line(&mut self) -> bool {
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
fn parse_connect(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let port = s.strip_prefix("CONNECT ")?;
    port.trim().parse().ok()
}

/// What the handler talks to: the listener, the connections, its epoll.
struct Backend {
    cid: u64,
    path: PathBuf,
    listener: Arc<UnixListener>,
    epoll: Epoll,
    stats: Arc<VsockStats>,
}

/// The device's queues and connections, on its I/O thread.
struct VsockQueues {
    be: Backend,
    mem: Option<Memory>,
    interrupt: Arc<VirtioInterrupt>,
    rx: Option<Served>,
    tx: Option<Served>,
    conns: BTreeMap<u64, Conn>,
    /// (local port, peer port) to token, for established or
    /// requesting connections.
    by_ports: HashMap<(u32, u32), u64>,
    next_token: u64,
    next_port: u32,
    /// The token after which the next receive round starts.
    cursor: u64,
    /// `OP_RST`s for packets of no connection: (local, peer) ports.
    stray: VecDeque<(u32, u32)>,
    buf: Vec<u8>,
}

/// Ports the device picks for host-initiated connections start here.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

impl VsockQueues {
    fn new(be: Backend) -> Self {
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
    fn pump(&mut self) -> Result<(), String> {
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
    fn sync_interests(&mut self) {
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

    fn forget(&mut self, t: u64) {
        if let Some(c) = self.conns.remove(&t) {
            if self.by_ports.get(&(c.local_port, c.peer_port)) == Some(&t) {
                self.by_ports.remove(&(c.local_port, c.peer_port));
            }
        }
    }

    /// Serves the epoll events ready now. True if anything moved.
    fn host_events(&mut self) -> bool {
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
    fn assign_port(&mut self, t: u64) -> bool {
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
    fn accept(&mut self) -> bool {
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

    fn signal(&self, s: &mut Served) -> Result<(), String> {
        match &self.mem {
            Some(m) => self.interrupt.signal_used(&mut s.queue, m, s.vector),
            None => Ok(()),
        }
    }

    /// Takes every packet the guest queued. True if it took any.
    fn drain_tx(&mut self) -> Result<bool, String> {
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

    fn drain_tx_on(&mut self, tx: &mut Served, mem: &Memory) -> Result<bool, String> {
        let mut used = false;
        loop {
            while let Some(head) = pop_checked(&mut tx.queue, mem)? {
                let index = head.head_index();
                let mut c = head.clone();
                match VsockPacket::from_tx_virtq_chain(mem, &mut c, MAX_PKT_DATA) {
                    Ok(pkt) => {
                        let hdr = Hdr::of(&pkt);
                        self.buf.clear();
                        if let Some(d) = pkt.data_slice() {
                            self.buf.resize(hdr.len as usize, 0);
                            d.copy_to(&mut self.buf[..]);
                        }
                        self.guest_packet(hdr);
                    }
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

    fn stray_rst(&mut self, local: u32, peer: u32) {
        if self.stray.len() < MAX_STRAY {
            self.stray.push_back((local, peer));
        } else {
            debug!("vsock: too many resets waiting; dropping one");
        }
    }

    /// One packet from the guest, its payload in `self.buf`.
    fn guest_packet(&mut self, h: Hdr) {
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
    fn guest_connect(&mut self, h: Hdr) {
        let (local, peer) = (h.dst_port, h.src_port);
        if self.conns.len() >= MAX_CONNS {
            warn!("vsock: {MAX_CONNS} connections already; refusing the guest's");
            self.be.stats.refused.fetch_add(1, Ordering::Relaxed);
            self.stray_rst(local, peer);
            return;
        }
        let mut p: OsString = self.be.path.clone().into_os_string();
        p.push(format!("_{local}"));
        let stream = UnixStream::connect(&p).and_then(|s| s.set_nonblocking(true).map(|()| s));
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
    fn conn_packet(&mut self, t: u64, h: Hdr) {
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
    fn fill_rx(&mut self) -> Result<bool, String> {
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

    fn fill_rx_on(&mut self, rx: &mut Served, mem: &Memory) -> Result<bool, String> {
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
    fn next_outgoing(&mut self) -> Option<Outgoing> {
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
    fn write_packet(
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
fn next_conn_packet(c: &mut Conn, pkt: &mut VsockPacket<'_, ()>) -> Result<(u16, u32), String> {
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
enum Outgoing {
    /// A reset for a packet of no connection: (local, peer) ports.
    Stray(u32, u32),
    /// A connection, by token.
    Conn(u64),
}

fn add_fd(epoll: &Epoll, fd: RawFd, interest: u32, token: u64) -> std::io::Result<()> {
    epoll.ctl(
        ControlOperation::Add,
        fd,
        EpollEvent::new(EventSet::from_bits_truncate(interest), token),
    )
}

/// The next chain of `queue`, checked strictly by [`chain::walk`] (a
/// broken chain is a guest error), still whole for the packet parser.
fn pop_checked<'m>(
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
