//! virtio-fs (virtio 1.2, 5.11) as a vhost-user frontend: the queues are
//! served by another process, the vhost-user backend (virtiofsd), which
//! maps guest memory itself; this VMM only shows the device to the guest
//! and tells the backend where everything is.
//!
//! ```text
//! guest driver ──doorbell──▶ ioeventfd (KVM) ──kick──▶ virtiofsd ── host files
//!      ▲                                                  │
//!      └── MSI-X ◀── VirtioInterrupt ◀── relay thread ◀──call eventfd
//! ```
//!
//! # Protocol
//!
//! Messages of the vhost-user protocol (rust-vmm's `vhost` crate speaks
//! it), in order:
//!
//! * at build time ([`Fs::connect`]): `SET_OWNER`, `GET_FEATURES`, and, if
//!   the backend has `VHOST_USER_F_PROTOCOL_FEATURES`,
//!   `GET_PROTOCOL_FEATURES` / `SET_PROTOCOL_FEATURES` with `MQ` and
//!   `REPLY_ACK` where offered (`CONFIG` is not taken: the configuration
//!   space, the tag and the queue count, is this device's own), and
//!   `GET_QUEUE_NUM` to check that the backend has the queues asked for;
//! * at `DRIVER_OK` ([`VirtioDevice::activate`]): `SET_FEATURES` (the
//!   driver's features, plus `PROTOCOL_FEATURES`), `SET_MEM_TABLE` (each
//!   guest RAM range as its memfd, offset and guest address), then per
//!   queue `SET_VRING_NUM`, `SET_VRING_ADDR` (this process's addresses of
//!   the rings), `SET_VRING_BASE` 0, `SET_VRING_CALL`, `SET_VRING_KICK` (the
//!   eventfd the transport registered as the queue's ioeventfd: the
//!   guest's doorbell goes straight to the backend) and `SET_VRING_ENABLE`;
//! * at reset ([`VirtioDevice::reset`]): `SET_VRING_ENABLE` 0 and
//!   `GET_VRING_BASE`, which stops each ring.
//!
//! With `REPLY_ACK` every request asks for an answer, so a backend that
//! refuses one (a memory table it cannot map) is an error here, not a
//! silent hang of the guest's file system later.
//!
//! # Interrupts
//!
//! The call eventfds are this process's, not the vectors' irqfds: a
//! relay thread ([`worker`](super::worker)) turns each call into
//! [`VirtioInterrupt::signal_queue`]. That keeps MSI-X masking exact (a
//! masked vector's interrupt stays pending and is delivered at unmask,
//! where an irqfd without a route would drop it) and tells the vCPU
//! scheduler which vCPU has an interrupt (a vCPU asleep in `vcpu_sched`
//! is not in `KVM_RUN`, where an irqfd alone would wake it). The cost is
//! one thread wakeup per interrupt.
//!
//! # Failure
//!
//! The backend is another process and may die. Every request has a
//! [`REPLY_TIMEOUT`], so a hung backend cannot hold a vCPU forever; the
//! relay thread watches the socket and, when the backend closes it, marks
//! the device failed: [`BackendHealth`] holds the reason (the VMM shows it
//! to the user), the status gets `NEEDS_RESET` and the driver its config
//! interrupt. Nothing else of the VM is touched; a reset does not
//! reconnect (the guest's file system is gone with the backend).

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{error, info, warn};
use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{
    Frontend, VhostUserFrontend, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;

use super::worker::{QueueHandler, Worker};
use super::{features, Activation, Memory, VirtioDevice, VirtioInterrupt};
use crate::DeviceError;

/// virtio-fs's device ID (`VIRTIO_ID_FS`).
pub const DEVICE_ID: u32 = 26;
/// The tag's size in the configuration space.
pub const TAG_LEN: usize = 36;
/// Entries per queue, at most (what Kata asks for).
pub const MAX_QUEUE_SIZE: u16 = 1024;
/// Request queues, at most (each has its MSI-X vector and eventfds).
pub const MAX_REQUEST_QUEUES: u16 = 64;
/// How long the backend may take to answer a request.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Features a guest may have of this device when the backend has them;
/// the transport adds `VERSION_1`.
const PASSED_FEATURES: u64 = features::INDIRECT_DESC | features::EVENT_IDX;

/// Errors of the vhost-user connection.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The tag is empty, too long or has a NUL.
    #[error(
        "virtio-fs tag {tag:?}: give 1 to {TAG_LEN} bytes without NUL (the name the guest mounts)"
    )]
    BadTag {
        /// The tag given.
        tag: String,
    },
    /// The socket could not be connected.
    #[error(
        "cannot connect to the vhost-user socket {}: {source}; start the backend first \
         (e.g. `virtiofsd --socket-path={} -o source=DIR`) and give its socket path",
        path.display(), path.display()
    )]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What connect said.
        source: std::io::Error,
    },
    /// A request failed or went unanswered.
    #[error("vhost-user backend {}: {op}: {source}", path.display())]
    Request {
        /// The socket.
        path: PathBuf,
        /// The request.
        op: &'static str,
        /// The error.
        source: vhost::Error,
    },
    /// The backend lacks something this device needs.
    #[error("vhost-user backend {}: {what}", path.display())]
    Unsupported {
        /// The socket.
        path: PathBuf,
        /// What is missing.
        what: String,
    },
}

/// Whether a device's backend still serves it: `None` while it does, the
/// reason once it failed. Cloned handles see the same state.
#[derive(Clone, Debug, Default)]
pub struct BackendHealth(Arc<Mutex<Option<String>>>);

impl BackendHealth {
    /// Why the backend failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the first failure; true if this was it.
    fn fail(&self, why: &str) -> bool {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_some() {
            return false;
        }
        *s = Some(why.to_string());
        true
    }
}

/// A virtio-fs device whose queues a vhost-user backend serves.
pub struct Fs {
    name: String,
    tag: [u8; TAG_LEN],
    request_queues: u16,
    queue_size: u16,
    socket: PathBuf,
    frontend: Frontend,
    /// The backend's virtio features (`GET_FEATURES`).
    backend_features: u64,
    /// Whether `VHOST_USER_F_PROTOCOL_FEATURES` was negotiated.
    protocol: bool,
    health: BackendHealth,
    /// While the driver runs the device: the relay thread and the queues
    /// the backend serves.
    active: Option<(Worker, Vec<usize>)>,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("name", &self.name)
            .field("socket", &self.socket)
            .field("request_queues", &self.request_queues)
            .finish()
    }
}

/// The tag as the configuration space holds it.
pub fn tag_bytes(tag: &str) -> Result<[u8; TAG_LEN], FsError> {
    let b = tag.as_bytes();
    if b.is_empty() || b.len() > TAG_LEN || b.contains(&0) {
        return Err(FsError::BadTag { tag: tag.into() });
    }
    let mut out = [0u8; TAG_LEN];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

impl Fs {
    /// Connects to the backend at `socket` and agrees on the protocol (see
    /// the module docs): `request_queues` request queues (plus the
    /// high-priority one) of up to `queue_size` entries, the guest
    /// mounting it by `tag`.
    pub fn connect(
        name: &str,
        tag: &str,
        socket: &Path,
        request_queues: u16,
        queue_size: u16,
    ) -> Result<Self, FsError> {
        let tag = tag_bytes(tag)?;
        let connect_err = |source| FsError::Connect {
            path: socket.into(),
            source,
        };
        let stream = UnixStream::connect(socket).map_err(connect_err)?;
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .and_then(|_| stream.set_write_timeout(Some(REPLY_TIMEOUT)))
            .map_err(connect_err)?;
        let queues = 1 + u64::from(request_queues);
        let frontend = Frontend::from_stream(stream, queues);
        let mut fs = Self {
            name: name.into(),
            tag,
            request_queues,
            queue_size,
            socket: socket.into(),
            frontend,
            backend_features: 0,
            protocol: false,
            health: BackendHealth::default(),
            active: None,
        };
        fs.handshake(queues)?;
        info!(device = %fs.name, socket = %socket.display(),
            features = format_args!("{:#x}", fs.backend_features), protocol = fs.protocol,
            "vhost-user backend connected");
        Ok(fs)
    }

    fn req(&self, op: &'static str) -> impl FnOnce(vhost::Error) -> FsError + '_ {
        move |source| FsError::Request {
            path: self.socket.clone(),
            op,
            source,
        }
    }

    fn unsupported(&self, what: String) -> FsError {
        FsError::Unsupported {
            path: self.socket.clone(),
            what,
        }
    }

    fn handshake(&mut self, queues: u64) -> Result<(), FsError> {
        self.frontend.set_owner().map_err(self.req("SET_OWNER"))?;
        self.backend_features = self
            .frontend
            .get_features()
            .map_err(self.req("GET_FEATURES"))?;
        if self.backend_features & features::VERSION_1 == 0 {
            return Err(self.unsupported("it does not offer VIRTIO_F_VERSION_1".into()));
        }
        let pf = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        self.protocol = self.backend_features & pf != 0;
        if !self.protocol {
            return if queues > 2 {
                Err(self.unsupported(format!(
                    "{} request queues need the MQ protocol feature, which it lacks; give num_queues=1",
                    queues - 1
                )))
            } else {
                Ok(())
            };
        }
        let offered = self
            .frontend
            .get_protocol_features()
            .map_err(self.req("GET_PROTOCOL_FEATURES"))?;
        let want = offered & (VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK);
        self.frontend
            .set_protocol_features(want)
            .map_err(self.req("SET_PROTOCOL_FEATURES"))?;
        if want.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            self.frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        if want.contains(VhostUserProtocolFeatures::MQ) {
            let n = self
                .frontend
                .get_queue_num()
                .map_err(self.req("GET_QUEUE_NUM"))?;
            if n < queues {
                return Err(self.unsupported(format!(
                    "it serves {n} queues and the device has {queues} (1 + num_queues={}); \
                     give num_queues={} or less",
                    queues - 1,
                    n.saturating_sub(1).max(1)
                )));
            }
        } else if queues > 2 {
            return Err(self.unsupported(format!(
                "{} request queues need the MQ protocol feature, which it lacks; give num_queues=1",
                queues - 1
            )));
        }
        Ok(())
    }

    /// Whether the backend still serves the device (a handle to keep).
    pub fn health(&self) -> BackendHealth {
        self.health.clone()
    }

    /// Marks the backend failed (once): logged, kept in [`BackendHealth`],
    /// and the driver is told through `NEEDS_RESET`.
    fn failed(health: &BackendHealth, interrupt: &VirtioInterrupt, name: &str, why: &str) {
        if health.fail(why) {
            error!(device = %name, "vhost-user backend failed, the device is out of service: {why}");
        }
        interrupt.backend_failed();
    }

    /// This process's address of guest address `addr`.
    fn host_addr(mem: &Memory, addr: u64, what: &str) -> Result<u64, String> {
        mem.get_host_address(GuestAddress(addr))
            .map(|p| p as u64)
            .map_err(|e| format!("{what} at {addr:#x}: {e}"))
    }

    /// `SET_FEATURES` and `SET_MEM_TABLE`.
    fn send_memory(&self, mem: &Memory, driver_features: u64) -> Result<(), String> {
        let pf = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let feats = driver_features | (self.backend_features & pf);
        self.frontend
            .set_features(feats)
            .map_err(|e| format!("SET_FEATURES {feats:#x}: {e}"))?;
        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                format!(
                    "guest memory is not shared ({e}): a vhost-user device needs memory that \
                     the backend can map (memory.shared, or memfd RAM, which an fs device implies)"
                )
            })?;
        self.frontend
            .set_mem_table(&regions)
            .map_err(|e| format!("SET_MEM_TABLE ({} regions): {e}", regions.len()))?;
        Ok(())
    }

    /// Hands queue `q` to the backend, calls going to `call`.
    fn send_queue(
        &mut self,
        mem: &Memory,
        q: &super::ActiveQueue,
        call: &EventFd,
    ) -> Result<(), String> {
        let i = q.index;
        let ctx = |op: &str, e: vhost::Error| format!("queue {i}: {op}: {e}");
        let size = q.queue.size();
        self.frontend
            .set_vring_num(i, size)
            .map_err(|e| ctx("SET_VRING_NUM", e))?;
        let cfg = VringConfigData {
            queue_max_size: q.queue.max_size(),
            queue_size: size,
            flags: 0,
            desc_table_addr: Self::host_addr(mem, q.queue.desc_table(), "descriptor table")?,
            used_ring_addr: Self::host_addr(mem, q.queue.used_ring(), "used ring")?,
            avail_ring_addr: Self::host_addr(mem, q.queue.avail_ring(), "available ring")?,
            log_addr: None,
        };
        self.frontend
            .set_vring_addr(i, &cfg)
            .map_err(|e| ctx("SET_VRING_ADDR", e))?;
        self.frontend
            .set_vring_base(i, 0)
            .map_err(|e| ctx("SET_VRING_BASE", e))?;
        self.frontend
            .set_vring_call(i, call)
            .map_err(|e| ctx("SET_VRING_CALL", e))?;
        self.frontend
            .set_vring_kick(i, &q.event)
            .map_err(|e| ctx("SET_VRING_KICK", e))?;
        if self.protocol {
            self.frontend
                .set_vring_enable(i, true)
                .map_err(|e| ctx("SET_VRING_ENABLE", e))?;
        }
        Ok(())
    }

    fn start(&mut self, a: Activation) -> Result<(), String> {
        if let Some(why) = self.health.failure() {
            return Err(format!("the backend failed earlier: {why}"));
        }
        self.send_memory(&a.mem, a.features)?;
        let mut calls = Vec::with_capacity(a.queues.len());
        let mut vectors = Vec::with_capacity(a.queues.len());
        for q in &a.queues {
            let call = EventFd::new(libc::EFD_NONBLOCK)
                .map_err(|e| format!("queue {}: call eventfd: {e}", q.index))?;
            self.send_queue(&a.mem, q, &call)?;
            vectors.push((q.index, q.vector));
            calls.push((q.index, call));
        }
        let served: Vec<usize> = calls.iter().map(|c| c.0).collect();
        let relay = Relay {
            name: self.name.clone(),
            vectors,
            interrupt: a.interrupt.clone(),
            health: self.health.clone(),
            socket: self.frontend.as_raw_fd(),
        };
        let worker = Worker::spawn_on(
            &format!("{}-relay", self.name),
            relay,
            calls,
            a.interrupt,
            a.io_cpus,
        )
        .map_err(|e| e.to_string())?;
        self.active = Some((worker, served));
        Ok(())
    }
}

/// The relay thread's handler: a queue's call eventfd becomes its MSI-X
/// vector; the socket closing marks the backend failed.
struct Relay {
    name: String,
    /// (queue index, MSI-X vector).
    vectors: Vec<(usize, u16)>,
    interrupt: Arc<VirtioInterrupt>,
    health: BackendHealth,
    socket: RawFd,
}

impl QueueHandler for Relay {
    fn process(&mut self, index: usize) -> Result<(), String> {
        if let Some(&(_, v)) = self.vectors.iter().find(|(i, _)| *i == index) {
            self.interrupt.signal_queue(v);
        }
        Ok(())
    }

    fn host_fds(&self) -> Vec<RawFd> {
        vec![self.socket]
    }

    fn host_ready(&mut self, _k: usize) -> Result<(), String> {
        // Readable: a reply the frontend will read (left in place), or
        // the end of the stream: the backend closed it (exited, crashed).
        let mut b = [0u8; 1];
        // SAFETY: recv writes at most 1 byte into `b`, which lives through
        // the call; MSG_PEEK leaves the data for the frontend.
        let n = unsafe {
            libc::recv(
                self.socket,
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        let err = std::io::Error::last_os_error();
        let closed = match n {
            0 => Some("it closed the vhost-user connection (exited or crashed)".to_string()),
            n if n > 0 => None,
            _ if err.kind() == std::io::ErrorKind::WouldBlock => None,
            _ => Some(format!("the vhost-user connection broke: {err}")),
        };
        if let Some(why) = closed {
            Fs::failed(&self.health, &self.interrupt, &self.name, &why);
        }
        Ok(())
    }
}

impl VirtioDevice for Fs {
    fn device_type(&self) -> u32 {
        DEVICE_ID
    }

    fn pci_class(&self) -> u32 {
        // Mass storage, other.
        0x01_80_00
    }

    fn features(&self) -> u64 {
        self.backend_features & PASSED_FEATURES
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![self.queue_size; 1 + usize::from(self.request_queues)]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut cfg = [0u8; TAG_LEN + 4];
        cfg[..TAG_LEN].copy_from_slice(&self.tag);
        cfg[TAG_LEN..].copy_from_slice(&u32::from(self.request_queues).to_le_bytes());
        data.fill(0);
        let start = (offset as usize).min(cfg.len());
        let n = data.len().min(cfg.len() - start);
        data[..n].copy_from_slice(&cfg[start..start + n]);
    }

    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.reset();
        let interrupt = a.interrupt.clone();
        if let Err(why) = self.start(a) {
            // A backend that cannot take the queues is out of service; a
            // closed socket says so first.
            Self::failed(&self.health, &interrupt, &self.name, &why);
            return Err(DeviceError::Backend(why));
        }
        Ok(())
    }

    fn reset(&mut self) {
        let Some((worker, queues)) = self.active.take() else {
            return;
        };
        worker.stop();
        if self.health.failure().is_some() {
            return;
        }
        for i in queues {
            if self.protocol {
                if let Err(e) = self.frontend.set_vring_enable(i, false) {
                    warn!(device = %self.name, queue = i, "SET_VRING_ENABLE 0: {e}");
                }
            }
            if let Err(e) = self.frontend.get_vring_base(i) {
                warn!(device = %self.name, queue = i, "GET_VRING_BASE (stopping the ring): {e}");
            }
        }
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked() {
        assert_eq!(&tag_bytes("myfs").unwrap()[..5], b"myfs\0");
        assert!(tag_bytes("").is_err());
        assert!(tag_bytes(&"x".repeat(37)).is_err());
        assert!(tag_bytes(&"x".repeat(36)).is_ok());
        assert!(tag_bytes("a\0b").is_err());
    }

    #[test]
    fn a_missing_socket_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        let e = Fs::connect("virtio-fs0", "t", &path, 1, 1024).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("none.sock") && m.contains("virtiofsd --socket-path"),
            "{m}"
        );
    }

    #[test]
    fn health_keeps_the_first_failure() {
        let h = BackendHealth::default();
        assert!(h.failure().is_none());
        assert!(h.fail("one"));
        assert!(!h.clone().fail("two"));
        assert_eq!(h.failure().as_deref(), Some("one"));
    }
}
