//! virtio-console (virtio 1.2, 5.3): one port, the guest's `hvc0`.
//!
//! Queue 0 (receive) carries host input to the guest, queue 1 (transmit)
//! the guest's output. Output goes to a writer (the VMM's console sink:
//! stdout, a file, a pty or a socket client); input comes from a host
//! file descriptor when there is one (a pty's master, or the pipe a
//! socket's client is copied into), watched edge-triggered by the I/O
//! thread. No multiport, no emergency write, no size: Linux needs none of
//! them for `console=hvc0`.
//!
//! The guest is untrusted: a transmit chain longer than
//! [`MAX_PER_REQUEST`] is cut there (a guest cannot make the thread
//! buffer gigabytes), a receive chain with device-readable buffers is a
//! guest error (`NEEDS_RESET`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use tracing::debug;
use virtio_bindings::virtio_ids::VIRTIO_ID_CONSOLE;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;

use super::chain::{self, Chain};
use super::worker::{QueueHandler, Worker};
use super::{features, Activation, Memory, VirtioDevice, VirtioInterrupt};
use crate::DeviceError;

/// Queue size of both queues.
pub const QUEUE_SIZE: u16 = 64;
/// Most output bytes taken from one transmit chain.
pub const MAX_PER_REQUEST: u64 = 64 * 1024;

/// Where the guest's output goes.
pub type ConsoleOut = Arc<Mutex<Box<dyn Write + Send>>>;

/// The virtio-console device.
pub struct Console {
    out: ConsoleOut,
    input: Option<Arc<File>>,
    worker: Option<Worker>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("input", &self.input)
            .finish()
    }
}

impl Console {
    /// Output to `out`; input from `input` (made non-blocking), if any.
    pub fn new(out: Box<dyn Write + Send>, input: Option<OwnedFd>) -> Self {
        if let Some(fd) = &input {
            set_nonblocking(fd.as_raw_fd());
        }
        Self {
            out: Arc::new(Mutex::new(out)),
            input: input.map(|fd| Arc::new(File::from(fd))),
            worker: None,
        }
    }

    /// Flushes the output (at VM stop).
    pub fn flush(&self) {
        let _ = self.out.lock().unwrap_or_else(|e| e.into_inner()).flush();
    }

    /// A handle on the output, to flush it after the device is gone.
    pub fn output(&self) -> ConsoleOut {
        self.out.clone()
    }
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller owns; no memory
    // is passed.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

struct ConsoleQueues {
    mem: Memory,
    interrupt: Arc<VirtioInterrupt>,
    out: ConsoleOut,
    input: Option<Arc<File>>,
    /// The input reached its end: stop reading it.
    input_closed: bool,
    rx: Option<(Queue, u16)>,
    tx: Option<(Queue, u16)>,
    stash: VecDeque<Chain>,
    buf: Vec<u8>,
}

impl ConsoleQueues {
    fn signal(&self, q: &mut Queue, vector: u16) -> Result<(), String> {
        self.interrupt.signal_used(q, &self.mem, vector)
    }

    fn transmit(&mut self) -> Result<(), String> {
        let Some((mut q, vector)) = self.tx.take() else {
            return Ok(());
        };
        let (mem, out, buf) = (&self.mem, &self.out, &mut self.buf);
        let r = chain::drain(&mut q, mem, |c| {
            let mut left = MAX_PER_REQUEST;
            buf.clear();
            for b in &c.readable {
                let n = u64::from(b.len).min(left) as usize;
                let at = buf.len();
                buf.resize(at + n, 0);
                mem.read_slice(&mut buf[at..], b.addr)
                    .map_err(|e| format!("reading console output: {e}"))?;
                left -= n as u64;
                if left == 0 {
                    break;
                }
            }
            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = o.write_all(buf) {
                debug!("console output: {e}");
            }
            Ok(0)
        });
        let res = match r {
            Ok(true) => self.signal(&mut q, vector),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        self.tx = Some((q, vector));
        res
    }

    /// Moves input bytes into the guest's receive buffers until either
    /// runs out.
    fn receive(&mut self) -> Result<(), String> {
        let (Some(input), false) = (self.input.clone(), self.input_closed) else {
            return Ok(());
        };
        let Some((mut q, vector)) = self.rx.take() else {
            return Ok(());
        };
        let r = self.receive_on(&input, &mut q);
        let res = match r {
            Ok(true) => self.signal(&mut q, vector),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        self.rx = Some((q, vector));
        res
    }

    fn receive_on(&mut self, input: &File, q: &mut Queue) -> Result<bool, String> {
        let mut used = false;
        loop {
            if self.stash.is_empty() {
                match chain::next(q, &self.mem).map_err(|e| e.to_string())? {
                    Some(c) if !c.readable.is_empty() || c.writable_len() == 0 => {
                        return Err(format!(
                            "receive chain {} has device-readable buffers or no room",
                            c.head
                        ))
                    }
                    Some(c) => self.stash.push_back(c),
                    None => {
                        if q.enable_notification(&self.mem)
                            .map_err(|e| e.to_string())?
                        {
                            continue;
                        }
                        return Ok(used);
                    }
                }
            }
            let Some(c) = self.stash.front() else {
                return Ok(used);
            };
            let room = c.writable_len().min(4096) as usize;
            self.buf.resize(room, 0);
            let n = match (&*input).read(&mut self.buf) {
                Ok(0) => {
                    self.input_closed = true;
                    return Ok(used);
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(used),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!("console input: {e}");
                    self.input_closed = true;
                    return Ok(used);
                }
            };
            let Some(c) = self.stash.pop_front() else {
                return Ok(used);
            };
            let mut off = 0;
            for b in &c.writable {
                if off == n {
                    break;
                }
                let k = (b.len as usize).min(n - off);
                self.mem
                    .write_slice(&self.buf[off..off + k], b.addr)
                    .map_err(|e| format!("writing console input: {e}"))?;
                off += k;
            }
            q.add_used(&self.mem, c.head, n as u32)
                .map_err(|e| e.to_string())?;
            used = true;
        }
    }
}

impl QueueHandler for ConsoleQueues {
    fn process(&mut self, index: usize) -> Result<(), String> {
        match index {
            0 => self.receive(),
            _ => self.transmit(),
        }
    }

    fn host_fds(&self) -> Vec<RawFd> {
        self.input.iter().map(|f| f.as_raw_fd()).collect()
    }

    fn host_ready(&mut self, _k: usize) -> Result<(), String> {
        self.receive()
    }
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }
    fn pci_class(&self) -> u32 {
        // Simple communication controller, other (as QEMU shows it).
        0x07_80_00
    }
    fn features(&self) -> u64 {
        features::INDIRECT_DESC | features::EVENT_IDX
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE, QUEUE_SIZE]
    }
    fn activate(&mut self, a: Activation) -> Result<(), DeviceError> {
        self.reset();
        let mut h = ConsoleQueues {
            mem: a.mem,
            interrupt: a.interrupt.clone(),
            out: self.out.clone(),
            input: self.input.clone(),
            input_closed: false,
            rx: None,
            tx: None,
            stash: VecDeque::new(),
            buf: Vec::new(),
        };
        let mut events = Vec::new();
        for q in a.queues {
            match q.index {
                0 => h.rx = Some((q.queue, q.vector)),
                1 => h.tx = Some((q.queue, q.vector)),
                _ => continue,
            }
            events.push((q.index, q.event));
        }
        self.worker = Some(Worker::spawn_on(
            "virtio-console",
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
        self.flush();
    }
}
