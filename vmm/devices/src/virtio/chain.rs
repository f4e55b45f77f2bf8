//! Descriptor chains checked as an untrusted guest's input.
//!
//! `virtio-queue` walks a chain and stops where it can go no further: a
//! loop ends when the chain has visited as many descriptors as the queue
//! has, an index past the table or an indirect table inside an indirect
//! table ends it early, as does a total length past 4 GiB. For a device
//! that silently serves a shorter chain; here each is an error
//! ([`ChainError`]): the chain's last descriptor still says "next", so the
//! walk knows it was cut. Every buffer must also lie inside guest memory,
//! and the device-readable buffers must come before the device-writable
//! ones (virtio 1.2, 2.7.4.2).
//!
//! Queue-level checks sit here too: [`available`] refuses an available
//! index that runs further ahead than the queue is long (a used ring the
//! driver would overflow).

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemory, Permissions};

use super::Memory;

/// Why a chain was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// Nothing in it (its head is an unusable indirect table).
    #[error("descriptor chain {head} is empty")]
    Empty {
        /// Its head index.
        head: u16,
    },
    /// It was cut: a loop, an index past the table, an indirect table
    /// inside an indirect table, or more than 4 GiB in total.
    #[error(
        "descriptor chain {head} loops, leaves its table, nests indirect tables or exceeds 4 GiB"
    )]
    Cut {
        /// Its head index.
        head: u16,
    },
    /// A buffer outside guest memory.
    #[error("descriptor chain {head}: buffer {addr:#x}+{len:#x} is outside guest memory")]
    OutOfMemory {
        /// Its head index.
        head: u16,
        /// The buffer's address.
        addr: u64,
        /// Its length.
        len: u32,
    },
    /// A device-readable buffer after a device-writable one.
    #[error("descriptor chain {head} puts a readable buffer after a writable one")]
    Order {
        /// Its head index.
        head: u16,
    },
    /// The available ring ran further ahead than the queue is long.
    #[error(
        "available index {avail} is {ahead} entries ahead of the device, in a queue of {size}"
    )]
    Overrun {
        /// The driver's available index.
        avail: u16,
        /// How far ahead of the device it is.
        ahead: u16,
        /// The queue size.
        size: u16,
    },
    /// The rings could not be read.
    #[error("the queue's rings cannot be read: {0}")]
    Ring(String),
}

/// One buffer of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Guest address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// A checked chain: its head and its buffers, readable ones first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The head index, for the used ring.
    pub head: u16,
    /// Device-readable buffers, in order.
    pub readable: Vec<Buffer>,
    /// Device-writable buffers, in order.
    pub writable: Vec<Buffer>,
}

impl Chain {
    /// Total bytes the device may write.
    pub fn writable_len(&self) -> u64 {
        self.writable.iter().map(|b| u64::from(b.len)).sum()
    }
    /// Total bytes the device may read.
    pub fn readable_len(&self) -> u64 {
        self.readable.iter().map(|b| u64::from(b.len)).sum()
    }
}

/// Walks `chain` strictly (see the module docs).
pub fn walk(chain: DescriptorChain<&Memory>, mem: &Memory) -> Result<Chain, ChainError> {
    let head = chain.head_index();
    let mut out = Chain {
        head,
        ..Default::default()
    };
    let mut last: Option<Descriptor> = None;
    for d in chain {
        let len = d.len();
        let perm = if d.is_write_only() {
            Permissions::Write
        } else {
            Permissions::Read
        };
        if len > 0 && !mem.check_range(d.addr(), len as usize, perm) {
            return Err(ChainError::OutOfMemory {
                head,
                addr: d.addr().0,
                len,
            });
        }
        let b = Buffer {
            addr: d.addr(),
            len,
        };
        if d.is_write_only() {
            out.writable.push(b);
        } else if out.writable.is_empty() {
            out.readable.push(b);
        } else {
            return Err(ChainError::Order { head });
        }
        last = Some(d);
    }
    match last {
        None => Err(ChainError::Empty { head }),
        Some(d) if d.has_next() => Err(ChainError::Cut { head }),
        Some(_) => Ok(out),
    }
}

/// How many chains the driver has made available, refusing an available
/// index further ahead than the queue is long.
pub fn available(queue: &Queue, mem: &Memory) -> Result<u16, ChainError> {
    let avail = queue
        .avail_idx(mem, Ordering::Acquire)
        .map_err(|e| ChainError::Ring(e.to_string()))?;
    let ahead = (avail - Wrapping(queue.next_avail())).0;
    if ahead > queue.size() {
        return Err(ChainError::Overrun {
            avail: avail.0,
            ahead,
            size: queue.size(),
        });
    }
    Ok(ahead)
}

/// A helper for devices: the next chain, checked, or `None` when the
/// driver has made no more available.
pub fn next(queue: &mut Queue, mem: &Memory) -> Result<Option<Chain>, ChainError> {
    if available(queue, mem)? == 0 {
        return Ok(None);
    }
    match queue.pop_descriptor_chain(mem) {
        Some(c) => walk(c, mem).map(Some),
        None => Err(ChainError::Ring("the available ring cannot be read".into())),
    }
}

/// Serves every chain the driver makes available, until it makes no more:
/// `serve` answers one chain and returns the bytes it wrote into it, which
/// go to the used ring. Before its last look at the available ring it
/// re-arms the driver's notifications (with `EVENT_IDX`, it writes
/// `avail_event`; without it, it clears the no-notify flag), so a buffer
/// made available in between is either seen here or notified (virtio 1.2,
/// 2.7.10). Returns whether any chain was used.
pub fn drain(
    queue: &mut Queue,
    mem: &Memory,
    mut serve: impl FnMut(&Chain) -> Result<u32, String>,
) -> Result<bool, String> {
    drain_some(queue, mem, |c| serve(c).map(Some))
}

/// As [`drain`], for a device that may finish a chain later: `serve`
/// returning `Ok(None)` took the chain without using it (the device adds
/// its used entry itself when it completes).
pub fn drain_some(
    queue: &mut Queue,
    mem: &Memory,
    mut serve: impl FnMut(&Chain) -> Result<Option<u32>, String>,
) -> Result<bool, String> {
    let mut used = false;
    loop {
        while let Some(c) = next(queue, mem).map_err(|e| e.to_string())? {
            if let Some(n) = serve(&c)? {
                queue.add_used(mem, c.head, n).map_err(|e| e.to_string())?;
                used = true;
            }
        }
        if !queue.enable_notification(mem).map_err(|e| e.to_string())? {
            return Ok(used);
        }
    }
}
