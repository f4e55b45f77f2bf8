//! virtio-rng (virtio 1.2, 5.4): one queue of device-writable buffers
//! that the device fills from the host's `/dev/urandom`.
//!
//! A request gets at most [`MAX_PER_REQUEST`] bytes (the used length says
//! how many; the driver asks again), so a guest cannot make the I/O
//! thread read gigabytes for one buffer.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_queue::Queue;
use vm_memory::Bytes;

use super::chain;
use super::worker::{QueueHandler, Worker};
use super::{features, Activation, Memory, VirtioDevice, VirtioInterrupt};
use crate::DeviceError;

/// Most bytes served per request.
pub const MAX_PER_REQUEST: usize = 64 * 1024;
const QUEUE_SIZE: u16 = 256;

/// The virtio-rng device.
#[derive(Debug)]
pub struct Rng {
    source: File,
    worker: Option<Worker>,
}

impl Rng {
    /// Reads from `/dev/urandom`.
    pub fn new() -> Result<Self, DeviceError> {
        Self::from_path(Path::new("/dev/urandom"))
    }

    /// Reads from `path` (tests use a file of known bytes).
    pub fn from_path(path: &Path) -> Result<Self, DeviceError> {
        let source = File::open(path).map_err(|source| DeviceError::Host {
            what: format!("opening {}", path.display()),
            source,
        })?;
        Ok(Self {
            source,
            worker: None,
        })
    }
}

struct RngQueue {
    source: File,
    mem: Memory,
    queue: Queue,
    vector: u16,
    interrupt: Arc<VirtioInterrupt>,
    buf: Vec<u8>,
}

impl QueueHandler for RngQueue {
    fn process(&mut self, _index: usize) -> Result<(), String> {
        let (source, mem, buf) = (&mut self.source, &self.mem, &mut self.buf);
        let used = chain::drain(&mut self.queue, mem, |c| {
            let mut left = MAX_PER_REQUEST;
            let mut written = 0u32;
            for b in &c.writable {
                let n = (b.len as usize).min(left);
                if n == 0 {
                    break;
                }
                buf.resize(n, 0);
                source
                    .read_exact(buf)
                    .map_err(|e| format!("host entropy source: {e}"))?;
                mem.write_slice(buf, b.addr)
                    .map_err(|e| format!("writing the buffer: {e}"))?;
                left -= n;
                written += n as u32;
            }
            Ok(written)
        })?;
        if used {
            self.interrupt
                .signal_used(&mut self.queue, &self.mem, self.vector)?;
        }
        Ok(())
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }
    fn pci_class(&self) -> u32 {
        // Unclassified device (as QEMU and Cloud Hypervisor show it).
        0xff_00_00
    }
    fn features(&self) -> u64 {
        features::INDIRECT_DESC | features::EVENT_IDX
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.reset();
        let Some(q) = a.queues.into_iter().next() else {
            return Ok(());
        };
        let source = self
            .source
            .try_clone()
            .map_err(|source| DeviceError::Host {
                what: "duplicating the entropy source".into(),
                source,
            })?;
        let handler = RngQueue {
            source,
            mem: a.mem,
            queue: q.queue,
            vector: q.vector,
            interrupt: a.interrupt.clone(),
            buf: Vec::new(),
        };
        self.worker = Some(Worker::spawn_on(
            "virtio-rng",
            handler,
            vec![(q.index, q.event)],
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
