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
//! refused (host side: closed; guest side: `OP_RST`). A host connection
//! that has not sent its `CONNECT` line within [`HANDSHAKE_TIMEOUT`] is
//! closed when the next one arrives.
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
/// How long a host connection may take to send its `CONNECT` line: past
/// it, the connection is closed when the next host connection arrives
/// (so that silent clients cannot hold the [`MAX_CONNS`] slots).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
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
    handshake_timeout: std::time::Duration,
}

impl Vsock {
    /// The same device with another [`HANDSHAKE_TIMEOUT`].
    pub fn with_handshake_timeout(mut self, t: std::time::Duration) -> Self {
        self.handshake_timeout = t;
        self
    }

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
            handshake_timeout: HANDSHAKE_TIMEOUT,
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
            handshake_timeout: self.handshake_timeout,
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

mod conn;
mod queues;

use queues::{Backend, Served, VsockQueues, LISTENER};
