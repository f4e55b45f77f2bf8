//! virtio-net micro-guest programs, built on [`super::driver`]: one vCPU
//! drives device 0, a virtio-net device on a host tap.
//!
//! The driver negotiates `VERSION_1` and nothing else: no mergeable
//! receive buffers, no offloads, no control queue, no MAC from the
//! device (the frames carry their own addresses). Every packet on either
//! queue is one descriptor holding the 12-byte `virtio_net_hdr_v1` and
//! the Ethernet frame after it. Queue 0 receives, queue 1 transmits,
//! both of [`QUEUE_SIZE`] entries with their interrupts on MSI-X vector
//! 0 (configuration changes on vector 1, as every micro-guest driver).
//!
//! Modes ([`NetMode`]):
//! * `tx`: the transmit ring full of one minimal UDP frame ([`tx_frame`]);
//!   each completion puts its descriptor back. [`FRAMES`] counts
//!   completed transmissions.
//! * `rx`: the receive ring full of 2 KiB buffers; each frame received
//!   counts in [`FRAMES`] and its buffer goes back.
//! * `echo`: each frame received goes back out of the same buffer (no
//!   copy) with its Ethernet addresses swapped and its header zeroed;
//!   the buffer returns to the receive ring once the transmission has
//!   completed. [`FRAMES`] counts echoed frames. Between packets the
//!   vCPU halts, so each request's interrupt wakes it: the
//!   request/response case.
//!
//! All modes run for ever, reap both rings on every wake, notify a queue
//! only once per pass and only when the device has not set
//! `VIRTQ_USED_F_NO_NOTIFY`, and end with `DONE 6` ([`FAIL_DEVICE`]) when
//! a wake brings nothing and the device says `NEEDS_RESET`, or `DONE 5`
//! ([`FAIL_USED`]) when the device returns a descriptor the driver does
//! not have.
//!
//! # Registers
//! `R12`/`R13`: the receive queue's used index reached and available
//! index published; `R14`/`R15`: the same for the transmit queue; `R10`:
//! queues to notify (bit 0 receive, bit 1 transmit). `RBX`, `RBP`, `RDI`
//! as in [`super::driver`].
//!
//! # Memory (offsets from [`DATA_ADDR`](super::DATA_ADDR))
//! | offset | what |
//! |---|---|
//! | [`FRAMES`] | frames counted (u64; the host reads it) |
//! | [`LAST_STATUS`] | the device status seen last (u64) |
//! | [`RX_DESC`], [`RX_AVAIL`], [`RX_USED`] | the receive queue |
//! | [`TX_DESC`], [`TX_AVAIL`], [`TX_USED`] | the transmit queue |
//! | [`TX_FRAME`] | `tx`'s frame, header first |
//! | [`RX_BUF`] | receive buffer `i` at `RX_BUF + i * BUF_BYTES` |

use iced_x86::code_asm::*;

use super::devices::DEVICE_BASE;
use super::driver::{
    data, reg, status, Driver, COMPLETED, FAIL_DEVICE, FAIL_USED, F_WRITE, LAST_STATUS,
};
use super::MicroError;

fn e(x: IcedError) -> MicroError {
    MicroError::Assemble(x.to_string())
}

/// Frames counted (u64): sent (`tx`), received (`rx`) or echoed (`echo`).
pub const FRAMES: u64 = COMPLETED;
/// Receive descriptor table.
pub const RX_DESC: u64 = 0x1000;
/// Receive available ring.
pub const RX_AVAIL: u64 = 0x2000;
/// Receive used ring.
pub const RX_USED: u64 = 0x3000;
/// Transmit descriptor table.
pub const TX_DESC: u64 = 0x4000;
/// Transmit available ring.
pub const TX_AVAIL: u64 = 0x5000;
/// Transmit used ring.
pub const TX_USED: u64 = 0x6000;
/// `tx`'s frame.
pub const TX_FRAME: u64 = 0x7000;
/// Receive buffers.
pub const RX_BUF: u64 = 0x1_0000;
/// Bytes per receive buffer: header and a 1514-byte frame fit.
pub const BUF_BYTES: u64 = 2048;
/// Entries of each queue (and receive buffers).
pub const QUEUE_SIZE: u16 = 256;
/// The virtio-net header (`virtio_net_hdr_v1`; with `VERSION_1` it always
/// has `num_buffers`).
pub const HDR_BYTES: usize = 12;
/// The guest's Ethernet address in `tx` frames.
pub const GUEST_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x6e, 0x65, 0x74];
/// The destination of `tx` frames: no host interface has it, so the host
/// stack drops them at once.
pub const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x70, 0x65, 0x72];
/// Bytes of `tx`'s Ethernet frame (the Ethernet minimum, without FCS).
pub const TX_FRAME_BYTES: usize = 60;

const MASK: i32 = QUEUE_SIZE as i32 - 1;
/// `VIRTQ_USED_F_NO_NOTIFY`.
const USED_NO_NOTIFY: u32 = 1;

/// What the program does with its device (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// Transmit minimal UDP frames as fast as the ring allows.
    Tx,
    /// Count frames received.
    Rx,
    /// Send every frame received back, addresses swapped.
    Echo,
}

impl NetMode {
    /// Every mode.
    pub const ALL: [NetMode; 3] = [NetMode::Tx, NetMode::Rx, NetMode::Echo];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            NetMode::Tx => "tx",
            NetMode::Rx => "rx",
            NetMode::Echo => "echo",
        }
    }
}

impl std::str::FromStr for NetMode {
    type Err = MicroError;
    fn from_str(s: &str) -> Result<Self, MicroError> {
        NetMode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| MicroError::Input(format!("net mode {s:?}: give tx, rx or echo")))
    }
}

impl std::fmt::Display for NetMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The one's-complement checksum of an IPv4 header.
fn ip_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet frame of `len` bytes (at least 42) from `src` to `dst`:
/// IPv4 10.77.0.2 -> 10.77.0.1, UDP 9 -> 9 (discard), the payload
/// `payload` repeated. The UDP checksum is 0 (none, as IPv4 allows).
pub fn udp_frame(dst: [u8; 6], src: [u8; 6], len: usize, payload: &[u8]) -> Vec<u8> {
    let len = len.max(42);
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (len - 14) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&[10, 77, 0, 2]);
    ip[16..20].copy_from_slice(&[10, 77, 0, 1]);
    let c = ip_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&9u16.to_be_bytes());
    f.extend_from_slice(&9u16.to_be_bytes());
    f.extend_from_slice(&(ip_len - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    let mut k = 0;
    while f.len() < len {
        f.push(payload.get(k % payload.len().max(1)).copied().unwrap_or(0));
        k += 1;
    }
    f
}

/// `tx`'s frame, without the virtio-net header.
pub fn tx_frame() -> Vec<u8> {
    udp_frame(PEER_MAC, GUEST_MAC, TX_FRAME_BYTES, b"vmm micro-guest tx")
}

/// The program of `mode` (see the module docs).
pub fn program(mode: NetMode) -> Result<Vec<u8>, MicroError> {
    let mut d = Driver::new(DEVICE_BASE, 1)?;
    let fail_used = d.fail(FAIL_USED);
    let fail_device = d.fail(FAIL_DEVICE);
    d.begin(0)?;
    setup_rings(&mut d, mode)?;
    d.queue_regs(
        0,
        QUEUE_SIZE,
        0,
        [data(RX_DESC), data(RX_AVAIL), data(RX_USED)],
    )?;
    d.queue_regs(
        1,
        QUEUE_SIZE,
        0,
        [data(TX_DESC), data(TX_AVAIL), data(TX_USED)],
    )?;
    d.driver_ok()?;
    let a = d.a();
    // Both queues hold work (buffers or frames): tell the device.
    a.mov(r10d, 3).map_err(e)?;
    let mut top = a.create_label();
    let mut look = a.create_label();
    a.set_label(&mut top).map_err(e)?;
    reap_rx(a, mode, fail_used)?;
    reap_tx(a, mode, fail_used)?;
    notify(a)?;
    // Anything new since the passes? Then another pass, else HLT.
    a.set_label(&mut look).map_err(e)?;
    used_moved(a, top)?;
    a.hlt().map_err(e)?;
    used_moved(a, top)?;
    // A wake with nothing new: the configuration interrupt?
    a.movzx(eax, byte_ptr(rbp + reg::STATUS)).map_err(e)?;
    a.mov(qword_ptr(rbx + LAST_STATUS as i32), rax).map_err(e)?;
    a.test(eax, u32::from(status::NEEDS_RESET)).map_err(e)?;
    a.jnz(fail_device).map_err(e)?;
    a.jmp(look).map_err(e)?;
    d.finish()
}

/// An address in the identity map with nothing behind it (RAM ends below
/// it, the device window starts above).
const NOWHERE: u64 = 0x3000_0000;

/// A hostile driver: after a correct setup, one transmit descriptor whose
/// buffer is at an address with no guest memory. The device must refuse
/// it with `NEEDS_RESET`; the program waits for that (woken by the
/// configuration interrupt), `REPORT`s the device status and ends with
/// `DONE 0`.
pub fn hostile_tx_outside_memory() -> Result<Vec<u8>, MicroError> {
    let mut d = Driver::new(DEVICE_BASE, 1)?;
    d.begin(0)?;
    setup_rings(&mut d, NetMode::Echo)?;
    d.queue_regs(
        0,
        QUEUE_SIZE,
        0,
        [data(RX_DESC), data(RX_AVAIL), data(RX_USED)],
    )?;
    d.queue_regs(
        1,
        QUEUE_SIZE,
        0,
        [data(TX_DESC), data(TX_AVAIL), data(TX_USED)],
    )?;
    d.driver_ok()?;
    let a = d.a();
    a.mov(rax, NOWHERE).map_err(e)?;
    a.mov(qword_ptr(rbx + TX_DESC as i32), rax).map_err(e)?;
    a.mov(dword_ptr(rbx + (TX_DESC as i32 + 8)), 64)
        .map_err(e)?;
    a.mov(word_ptr(rbx + (TX_AVAIL as i32 + 4)), 0).map_err(e)?;
    a.mov(word_ptr(rbx + (TX_AVAIL as i32 + 2)), 1).map_err(e)?;
    a.mov(word_ptr(rbp + (reg::NOTIFY + 4)), 1).map_err(e)?;
    let mut look = a.create_label();
    let mut got = a.create_label();
    a.set_label(&mut look).map_err(e)?;
    a.movzx(eax, byte_ptr(rbp + reg::STATUS)).map_err(e)?;
    a.test(eax, u32::from(status::NEEDS_RESET)).map_err(e)?;
    a.jnz(got).map_err(e)?;
    a.hlt().map_err(e)?;
    a.jmp(look).map_err(e)?;
    a.set_label(&mut got).map_err(e)?;
    a.mov(qword_ptr(rbx + LAST_STATUS as i32), rax).map_err(e)?;
    d.asm().report_reg(eax)?;
    d.finish()
}

/// Jumps to `to` if either used index moved past what was reaped.
fn used_moved(a: &mut CodeAssembler, to: CodeLabel) -> Result<(), MicroError> {
    a.movzx(eax, word_ptr(rbx + (RX_USED as i32 + 2)))
        .map_err(e)?;
    a.cmp(ax, r12w).map_err(e)?;
    a.jne(to).map_err(e)?;
    a.movzx(eax, word_ptr(rbx + (TX_USED as i32 + 2)))
        .map_err(e)?;
    a.cmp(ax, r14w).map_err(e)?;
    a.jne(to).map_err(e)
}

/// Both rings' descriptors and available rings as the mode starts them:
/// every receive buffer posted; `tx`'s frame written and every transmit
/// descriptor posted pointing at it; `echo`'s transmit descriptor `i`
/// pointing at receive buffer `i`.
fn setup_rings(d: &mut Driver, mode: NetMode) -> Result<(), MicroError> {
    if mode == NetMode::Tx {
        write_tx_frame(d)?;
    }
    let frame_len = (HDR_BYTES + TX_FRAME_BYTES) as u32;
    let a = d.a();
    let mut top = a.create_label();
    a.xor(ecx, ecx).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    // rx: desc[i] = {RX_BUF + i * 2048, 2048, WRITE}; avail[i] = i
    a.mov(r8, rcx).map_err(e)?;
    a.shl(r8, 4).map_err(e)?;
    a.mov(r9, rcx).map_err(e)?;
    a.shl(r9, 11).map_err(e)?;
    a.lea(r9, qword_ptr(rbx + r9 + RX_BUF as i32)).map_err(e)?;
    a.mov(qword_ptr(rbx + r8 + RX_DESC as i32), r9).map_err(e)?;
    a.mov(dword_ptr(rbx + r8 + (RX_DESC as i32 + 8)), BUF_BYTES as u32)
        .map_err(e)?;
    a.mov(
        dword_ptr(rbx + r8 + (RX_DESC as i32 + 12)),
        u32::from(F_WRITE),
    )
    .map_err(e)?;
    a.mov(word_ptr(rbx + rcx * 2 + (RX_AVAIL as i32 + 4)), cx)
        .map_err(e)?;
    // tx: the frame (tx) or receive buffer i (echo), device-readable
    if mode == NetMode::Tx {
        a.lea(r9, qword_ptr(rbx + TX_FRAME as i32)).map_err(e)?;
    }
    a.mov(qword_ptr(rbx + r8 + TX_DESC as i32), r9).map_err(e)?;
    a.mov(dword_ptr(rbx + r8 + (TX_DESC as i32 + 8)), frame_len)
        .map_err(e)?;
    a.mov(dword_ptr(rbx + r8 + (TX_DESC as i32 + 12)), 0)
        .map_err(e)?;
    a.mov(word_ptr(rbx + rcx * 2 + (TX_AVAIL as i32 + 4)), cx)
        .map_err(e)?;
    a.inc(ecx).map_err(e)?;
    a.cmp(ecx, u32::from(QUEUE_SIZE)).map_err(e)?;
    a.jb(top).map_err(e)?;
    // Indices: every receive buffer available; tx: every frame.
    let posted = u32::from(QUEUE_SIZE);
    let tx_posted = if mode == NetMode::Tx { posted } else { 0 };
    a.mov(dword_ptr(rbx + RX_AVAIL as i32), posted << 16)
        .map_err(e)?;
    a.mov(dword_ptr(rbx + TX_AVAIL as i32), tx_posted << 16)
        .map_err(e)?;
    a.mov(dword_ptr(rbx + RX_USED as i32), 0).map_err(e)?;
    a.mov(dword_ptr(rbx + TX_USED as i32), 0).map_err(e)?;
    a.xor(r12d, r12d).map_err(e)?;
    a.mov(r13d, posted).map_err(e)?;
    a.xor(r14d, r14d).map_err(e)?;
    a.mov(r15d, tx_posted).map_err(e)
}

/// Writes the zero header and [`tx_frame`] at [`TX_FRAME`].
fn write_tx_frame(d: &mut Driver) -> Result<(), MicroError> {
    let mut bytes = vec![0u8; HDR_BYTES];
    bytes.extend_from_slice(&tx_frame());
    bytes.resize(bytes.len().next_multiple_of(8), 0);
    let a = d.a();
    for (k, chunk) in bytes.chunks(8).enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        a.mov(rax, u64::from_le_bytes(w)).map_err(e)?;
        a.mov(qword_ptr(rbx + (TX_FRAME as i32 + 8 * k as i32)), rax)
            .map_err(e)?;
    }
    Ok(())
}

/// `EAX` = the descriptor of used entry `idx` (a register holding the
/// index reached) of the used ring at `used`, `EDX` = its length; jumps
/// to `bad` if the descriptor is `limit` or more (not one the driver
/// made available). Shared with [`super::vsock`]: both drive
/// [`QUEUE_SIZE`]-entry queues.
pub(super) fn used_entry(
    a: &mut CodeAssembler,
    used: u64,
    idx: AsmRegister32,
    limit: u16,
    bad: CodeLabel,
) -> Result<(), MicroError> {
    a.mov(ecx, idx).map_err(e)?;
    a.and(ecx, MASK).map_err(e)?;
    a.mov(eax, dword_ptr(rbx + rcx * 8 + (used as i32 + 4)))
        .map_err(e)?;
    a.mov(edx, dword_ptr(rbx + rcx * 8 + (used as i32 + 8)))
        .map_err(e)?;
    a.cmp(eax, u32::from(limit)).map_err(e)?;
    a.jae(bad).map_err(e)
}

/// Makes descriptor `AX` available on the queue whose available ring is
/// at `avail` and whose published index is in `idx`; marks the queue for
/// notification (`bit` in `R10`).
pub(super) fn repost(
    a: &mut CodeAssembler,
    avail: u64,
    idx: AsmRegister32,
    idx16: AsmRegister16,
    bit: u32,
) -> Result<(), MicroError> {
    a.mov(ecx, idx).map_err(e)?;
    a.and(ecx, MASK).map_err(e)?;
    a.mov(word_ptr(rbx + rcx * 2 + (avail as i32 + 4)), ax)
        .map_err(e)?;
    a.inc(idx).map_err(e)?;
    // the index after the entry (x86 keeps the stores in order)
    a.mov(word_ptr(rbx + (avail as i32 + 2)), idx16)
        .map_err(e)?;
    a.or(r10d, bit).map_err(e)
}

/// Every used entry of the receive queue: counted (`rx`), put back
/// (`rx`, `tx`), or echoed (`echo`).
fn reap_rx(a: &mut CodeAssembler, mode: NetMode, bad: CodeLabel) -> Result<(), MicroError> {
    let mut top = a.create_label();
    let mut check = a.create_label();
    let mut back = a.create_label();
    a.jmp(check).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    used_entry(a, RX_USED, r12d, QUEUE_SIZE, bad)?;
    a.inc(r12d).map_err(e)?;
    if mode == NetMode::Echo {
        // A frame too short to carry two addresses goes straight back.
        a.cmp(edx, (HDR_BYTES + 14) as u32).map_err(e)?;
        a.jb(back).map_err(e)?;
        echo(a)?;
        a.jmp(check).map_err(e)?;
    } else if mode == NetMode::Rx {
        a.inc(qword_ptr(rbx + FRAMES as i32)).map_err(e)?;
    }
    a.set_label(&mut back).map_err(e)?;
    repost(a, RX_AVAIL, r13d, r13w, 1)?;
    a.set_label(&mut check).map_err(e)?;
    a.movzx(ecx, word_ptr(rbx + (RX_USED as i32 + 2)))
        .map_err(e)?;
    a.cmp(cx, r12w).map_err(e)?;
    a.jne(top).map_err(e)
}

/// Sends receive buffer `EAX` (`EDX` bytes, header included) back: the
/// Ethernet addresses swapped, the header zeroed, transmit descriptor
/// `EAX` (which points at the buffer) `EDX` long and made available.
fn echo(a: &mut CodeAssembler) -> Result<(), MicroError> {
    let h = HDR_BYTES as i32;
    a.mov(r8, rax).map_err(e)?;
    a.shl(r8, 11).map_err(e)?;
    a.lea(r8, qword_ptr(rbx + r8 + RX_BUF as i32)).map_err(e)?;
    // destination (h..h+6) <-> source (h+6..h+12)
    a.mov(r9d, dword_ptr(r8 + h)).map_err(e)?;
    a.mov(r11d, dword_ptr(r8 + (h + 6))).map_err(e)?;
    a.mov(dword_ptr(r8 + h), r11d).map_err(e)?;
    a.mov(dword_ptr(r8 + (h + 6)), r9d).map_err(e)?;
    a.mov(r9w, word_ptr(r8 + (h + 4))).map_err(e)?;
    a.mov(r11w, word_ptr(r8 + (h + 10))).map_err(e)?;
    a.mov(word_ptr(r8 + (h + 4)), r11w).map_err(e)?;
    a.mov(word_ptr(r8 + (h + 10)), r9w).map_err(e)?;
    a.mov(qword_ptr(r8), 0).map_err(e)?;
    a.mov(dword_ptr(r8 + 8), 0).map_err(e)?;
    a.mov(r8, rax).map_err(e)?;
    a.shl(r8, 4).map_err(e)?;
    a.mov(dword_ptr(rbx + r8 + (TX_DESC as i32 + 8)), edx)
        .map_err(e)?;
    repost(a, TX_AVAIL, r15d, r15w, 2)
}

/// Every used entry of the transmit queue: counted (`tx`, `echo`); its
/// descriptor posted again (`tx`) or its receive buffer given back
/// (`echo`).
fn reap_tx(a: &mut CodeAssembler, mode: NetMode, bad: CodeLabel) -> Result<(), MicroError> {
    let mut top = a.create_label();
    let mut check = a.create_label();
    a.jmp(check).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    used_entry(a, TX_USED, r14d, QUEUE_SIZE, bad)?;
    a.inc(r14d).map_err(e)?;
    a.inc(qword_ptr(rbx + FRAMES as i32)).map_err(e)?;
    match mode {
        NetMode::Tx => repost(a, TX_AVAIL, r15d, r15w, 2)?,
        NetMode::Echo => repost(a, RX_AVAIL, r13d, r13w, 1)?,
        NetMode::Rx => {}
    }
    a.set_label(&mut check).map_err(e)?;
    a.movzx(ecx, word_ptr(rbx + (TX_USED as i32 + 2)))
        .map_err(e)?;
    a.cmp(cx, r14w).map_err(e)?;
    a.jne(top).map_err(e)
}

/// Notifies the queues marked in `R10` whose used ring does not say
/// `NO_NOTIFY` (read after a full fence: the available index must be
/// visible before the flag is looked at), then clears `R10`.
fn notify(a: &mut CodeAssembler) -> Result<(), MicroError> {
    for (q, used) in [(0u32, RX_USED), (1, TX_USED)] {
        let mut skip = a.create_label();
        a.test(r10d, 1 << q).map_err(e)?;
        a.jz(skip).map_err(e)?;
        a.mfence().map_err(e)?;
        a.test(word_ptr(rbx + used as i32), USED_NO_NOTIFY)
            .map_err(e)?;
        a.jnz(skip).map_err(e)?;
        a.mov(word_ptr(rbp + (reg::NOTIFY + 4 * q as i32)), q)
            .map_err(e)?;
        a.set_label(&mut skip).map_err(e)?;
    }
    a.xor(r10d, r10d).map_err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_assemble() {
        for m in NetMode::ALL {
            if let Err(x) = program(m) {
                panic!("{m}: {x}");
            }
        }
        assert!(hostile_tx_outside_memory().is_ok());
        assert!("bogus".parse::<NetMode>().is_err());
        assert_eq!("ECHO".parse::<NetMode>().unwrap(), NetMode::Echo);
    }

    #[test]
    fn frames_are_well_formed() {
        let f = tx_frame();
        assert_eq!(f.len(), TX_FRAME_BYTES);
        assert_eq!(&f[..6], &PEER_MAC);
        assert_eq!(&f[6..12], &GUEST_MAC);
        // a correct IPv4 header checksums to 0
        assert_eq!(ip_checksum(&f[14..34]), 0);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14);
        assert_eq!(
            u16::from_be_bytes([f[38], f[39]]) as usize,
            f.len() - 34,
            "UDP length"
        );
        let big = udp_frame(PEER_MAC, GUEST_MAC, 1514, &[1, 2, 3]);
        assert_eq!(big.len(), 1514);
        assert!(BUF_BYTES as usize >= HDR_BYTES + 1514);
        assert!(
            RX_BUF + u64::from(QUEUE_SIZE) * BUF_BYTES
                <= super::super::MIN_MEMORY - super::super::DATA_ADDR
        );
    }
}
