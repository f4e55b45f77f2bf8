//! virtio-vsock micro-guest programs, built on [`super::driver`]: one
//! vCPU drives device 0, a virtio-vsock device
//! (`vmm_devices::virtio::vsock`), as a stream echo server.
//!
//! The driver negotiates `VERSION_1` and nothing else. Queue 0 receives,
//! queue 1 transmits, both of [`QUEUE_SIZE`] entries; queue 2 (events) is
//! set up with [`EVENT_QUEUE_SIZE`] entries and no buffers (the device
//! sends no events). Interrupts on MSI-X vector 0, configuration changes
//! on vector 1, as every micro-guest driver.
//!
//! Every receive buffer is one descriptor of [`BUF_BYTES`]: the 44-byte
//! packet header and up to [`MAX_PAYLOAD`] bytes after it. A packet is
//! answered from its own buffer (no copy), with the header's CIDs and
//! ports swapped and `flags` cleared: transmit descriptor `i` points at
//! receive buffer `i`, and the buffer goes back to the receive ring once
//! the transmission has completed. The answer to each op:
//!
//! | op received | answer | counted in |
//! |---|---|---|
//! | `REQUEST` | `RESPONSE` (any port is listening) | [`ACCEPTED`] |
//! | `RW` | the same `RW`, payload untouched | [`PACKETS`], [`BYTES`] |
//! | `SHUTDOWN` | `RST` | [`RESETS`] |
//! | `CREDIT_REQUEST`, `CREDIT_UPDATE` | `CREDIT_UPDATE` | |
//! | `RESPONSE` | none | [`CONNECTED`] |
//! | `RST`, anything else | none | [`REFUSED`] (`RST` only) |
//!
//! Credit without per-connection state: an answer keeps the header's
//! `buf_alloc` and `fwd_cnt`, the device's own. The guest echoes every
//! byte at once, so what it has taken of a connection and not yet seen
//! the host take is exactly what the device has sent and not yet
//! forwarded: claiming the device's `fwd_cnt` as its own grants credit
//! only as fast as the host reader drains the echo (end-to-end flow
//! control), and its `buf_alloc` (the device's, 64 KiB) bounds the bytes
//! in flight to what the device buffers. The device's credit updates
//! (sent when its forwarded count moves) are answered with the guest's,
//! which reopens the device's credit towards the guest. Any number of
//! connections at once: nothing is kept per connection.
//!
//! Modes ([`VsockMode`]):
//! * `echo`: serve whatever the host connects to (`CONNECT <port>`).
//! * `connect`: as `echo`, and at start `conns` requests from guest ports
//!   [`GUEST_PORT_BASE`]`+k` to host port `port` (the host's
//!   `<socket>_<port>` listener): guest-to-host connections, echoed the
//!   same way once the host sends.
//!
//! The program runs for ever, reaps both rings on every wake, notifies a
//! queue once per pass (unless the device set `VIRTQ_USED_F_NO_NOTIFY`),
//! and ends with `DONE 6` ([`FAIL_DEVICE`]) when a wake brings nothing
//! and the device says `NEEDS_RESET`, or `DONE 5` ([`FAIL_USED`]) when
//! the device returns a descriptor the driver does not have.
//!
//! # Registers
//! `R12`/`R13`: the receive queue's used index reached and available
//! index published; `R14`/`R15`: the same for the transmit queue; `R10`:
//! queues to notify (bit 0 receive, bit 1 transmit); `R8`, `R9`, `R11`:
//! scratch of the packet handling. `RBX`, `RBP`, `RDI` as in
//! [`super::driver`].
//!
//! # Memory (offsets from [`DATA_ADDR`](super::DATA_ADDR))
//! | offset | what |
//! |---|---|
//! | [`PACKETS`] | `RW` packets echoed (u64) |
//! | [`BYTES`] | payload bytes echoed (u64) |
//! | [`ACCEPTED`] | requests answered (u64) |
//! | [`RESETS`] | shutdowns answered with `RST` (u64) |
//! | [`CONNECTED`] | responses to the guest's requests (u64) |
//! | [`REFUSED`] | resets received (u64) |
//! | [`LAST_STATUS`] | the device status seen last (u64) |
//! | [`RX_DESC`], [`RX_AVAIL`], [`RX_USED`] | the receive queue |
//! | [`TX_DESC`], [`TX_AVAIL`], [`TX_USED`] | the transmit queue |
//! | [`EV_DESC`], [`EV_AVAIL`], [`EV_USED`] | the event queue |
//! | [`REQ`] | `connect`'s request headers, 64 bytes each (transmit descriptor [`NBUF`]` + k`) |
//! | [`RX_BUF`] | receive buffer `i` at `RX_BUF + i * BUF_BYTES` |

use iced_x86::code_asm::*;

use super::devices::DEVICE_BASE;
use super::driver::{data, reg, status, Driver, FAIL_DEVICE, FAIL_USED, F_WRITE, LAST_STATUS};
use super::net::{repost, used_entry};
use super::MicroError;

fn e(x: IcedError) -> MicroError {
    MicroError::Assemble(x.to_string())
}

/// `RW` packets echoed (u64).
pub const PACKETS: u64 = 0x000;
/// Payload bytes echoed (u64).
pub const BYTES: u64 = 0x008;
/// Requests answered with `RESPONSE` (u64).
pub const ACCEPTED: u64 = 0x010;
/// Shutdowns answered with `RST` (u64).
pub const RESETS: u64 = 0x018;
/// `RESPONSE`s to the guest's own requests (u64).
pub const CONNECTED: u64 = 0x020;
/// `RST`s received (u64).
pub const REFUSED: u64 = 0x028;
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
/// Event descriptor table.
pub const EV_DESC: u64 = 0x7000;
/// Event available ring.
pub const EV_AVAIL: u64 = 0x7400;
/// Event used ring.
pub const EV_USED: u64 = 0x7800;
/// `connect`'s request headers.
pub const REQ: u64 = 0x8000;
/// Receive buffers.
pub const RX_BUF: u64 = 0x1_0000;
/// Bytes per receive buffer: the header and the payload.
pub const BUF_BYTES: u64 = 4096;
/// The packet header.
pub const HDR_BYTES: u64 = 44;
/// The most payload one receive buffer takes.
pub const MAX_PAYLOAD: u64 = BUF_BYTES - HDR_BYTES;
/// Receive buffers (transmit descriptors `0..NBUF` point at them).
pub const NBUF: u16 = 128;
/// Entries of the receive and transmit queues.
pub const QUEUE_SIZE: u16 = 256;
/// Entries of the event queue.
pub const EVENT_QUEUE_SIZE: u16 = 16;
/// The most connections `connect` opens.
pub const MAX_CONNECT: u16 = 64;
/// `connect`'s guest ports: `GUEST_PORT_BASE + k`.
pub const GUEST_PORT_BASE: u32 = 10_000;
/// `buf_alloc` of `connect`'s requests (the device's own).
pub const REQ_BUF_ALLOC: u32 = 64 * 1024;

// The layout fits: requests below the buffers, the buffers in the
// smallest RAM, buffers and requests in the transmit queue.
const _: () = assert!(REQ + 64 * MAX_CONNECT as u64 <= RX_BUF);
const _: () = assert!(RX_BUF + NBUF as u64 * BUF_BYTES <= super::MIN_MEMORY - super::DATA_ADDR);
const _: () = assert!(NBUF + MAX_CONNECT <= QUEUE_SIZE);

// The ring helpers shared with `net` mask indices with its queue size.
const _: () = assert!(QUEUE_SIZE == super::net::QUEUE_SIZE);

/// `VIRTQ_USED_F_NO_NOTIFY`.
const USED_NO_NOTIFY: u32 = 1;
/// The device's configuration space (the guest CID) in the BAR.
const DEVICE_CFG: i32 = 0x2000;

/// Header field offsets.
mod hdr {
    pub const SRC_CID: i32 = 0;
    pub const DST_CID: i32 = 8;
    pub const SRC_PORT: i32 = 16;
    pub const DST_PORT: i32 = 20;
    pub const LEN: i32 = 24;
    pub const TYPE: i32 = 28;
    pub const OP: i32 = 30;
    pub const FLAGS: i32 = 32;
    pub const BUF_ALLOC: i32 = 36;
    pub const FWD_CNT: i32 = 40;
}

/// vsock ops.
mod op {
    pub const REQUEST: u32 = 1;
    pub const RESPONSE: u32 = 2;
    pub const RST: u32 = 3;
    pub const SHUTDOWN: u32 = 4;
    pub const RW: u32 = 5;
    pub const CREDIT_UPDATE: u32 = 6;
    pub const CREDIT_REQUEST: u32 = 7;
}

/// What the program does (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VsockMode {
    /// Echo every connection the host opens.
    Echo,
    /// Echo, and open `conns` connections to host port `port` at start.
    Connect {
        /// The host port (the host listens on `<socket>_<port>`).
        port: u32,
        /// How many (1..=[`MAX_CONNECT`]).
        conns: u16,
    },
}

/// The program of `mode` (see the module docs).
pub fn program(mode: VsockMode) -> Result<Vec<u8>, MicroError> {
    let requests = match mode {
        VsockMode::Echo => 0,
        VsockMode::Connect { conns, .. } if (1..=MAX_CONNECT).contains(&conns) => conns,
        VsockMode::Connect { conns, .. } => {
            return Err(MicroError::Input(format!(
                "{conns} vsock connections; the micro-guest opens 1 to {MAX_CONNECT}"
            )))
        }
    };
    let mut d = Driver::new(DEVICE_BASE, 1)?;
    let fail_used = d.fail(FAIL_USED);
    let fail_device = d.fail(FAIL_DEVICE);
    d.begin(0)?;
    setup_rings(&mut d)?;
    if let VsockMode::Connect { port, conns } = mode {
        write_requests(&mut d, port, conns)?;
    }
    let rings = [
        (0, QUEUE_SIZE, [RX_DESC, RX_AVAIL, RX_USED]),
        (1, QUEUE_SIZE, [TX_DESC, TX_AVAIL, TX_USED]),
        (2, EVENT_QUEUE_SIZE, [EV_DESC, EV_AVAIL, EV_USED]),
    ];
    for (q, size, [desc, avail, used]) in rings {
        d.queue_regs(q, size, 0, [data(desc), data(avail), data(used)])?;
    }
    d.driver_ok()?;
    let a = d.a();
    // Receive buffers (and requests) are waiting: tell the device.
    a.mov(r10d, if requests > 0 { 3 } else { 1 }).map_err(e)?;
    let mut top = a.create_label();
    let mut look = a.create_label();
    a.set_label(&mut top).map_err(e)?;
    reap_rx(a, fail_used)?;
    reap_tx(a, fail_used)?;
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

/// Receive descriptor `i` = buffer `i`, device-writable, available;
/// transmit descriptor `i` points at it (its length set when used); the
/// event rings empty; the indices.
fn setup_rings(d: &mut Driver) -> Result<(), MicroError> {
    let a = d.a();
    let mut top = a.create_label();
    a.xor(ecx, ecx).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    a.mov(r8, rcx).map_err(e)?;
    a.shl(r8, 4).map_err(e)?;
    a.mov(r9, rcx).map_err(e)?;
    a.shl(r9, 12).map_err(e)?;
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
    a.mov(qword_ptr(rbx + r8 + TX_DESC as i32), r9).map_err(e)?;
    a.mov(dword_ptr(rbx + r8 + (TX_DESC as i32 + 8)), HDR_BYTES as u32)
        .map_err(e)?;
    a.mov(dword_ptr(rbx + r8 + (TX_DESC as i32 + 12)), 0)
        .map_err(e)?;
    a.inc(ecx).map_err(e)?;
    a.cmp(ecx, u32::from(NBUF)).map_err(e)?;
    a.jb(top).map_err(e)?;
    let posted = u32::from(NBUF);
    a.mov(dword_ptr(rbx + RX_AVAIL as i32), posted << 16)
        .map_err(e)?;
    for ring in [TX_AVAIL, RX_USED, TX_USED, EV_AVAIL, EV_USED] {
        a.mov(dword_ptr(rbx + ring as i32), 0).map_err(e)?;
    }
    a.xor(r12d, r12d).map_err(e)?;
    a.mov(r13d, posted).map_err(e)?;
    a.xor(r14d, r14d).map_err(e)?;
    a.xor(r15d, r15d).map_err(e)
}

/// `connect`'s requests: header `k` at [`REQ`]` + 64 k` from guest port
/// [`GUEST_PORT_BASE`]` + k` (the guest CID read from the device) to
/// host port `port`, in transmit descriptor [`NBUF`]` + k`, available.
fn write_requests(d: &mut Driver, port: u32, conns: u16) -> Result<(), MicroError> {
    let a = d.a();
    let mut top = a.create_label();
    a.xor(ecx, ecx).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    // r8 = &REQ[k]
    a.mov(r8, rcx).map_err(e)?;
    a.shl(r8, 6).map_err(e)?;
    a.lea(r8, qword_ptr(rbx + r8 + REQ as i32)).map_err(e)?;
    a.mov(eax, dword_ptr(rbp + DEVICE_CFG)).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::SRC_CID), eax).map_err(e)?;
    a.mov(eax, dword_ptr(rbp + (DEVICE_CFG + 4))).map_err(e)?;
    a.mov(dword_ptr(r8 + (hdr::SRC_CID + 4)), eax).map_err(e)?;
    a.mov(qword_ptr(r8 + hdr::DST_CID), 2).map_err(e)?;
    a.lea(eax, dword_ptr(rcx + GUEST_PORT_BASE as i32))
        .map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::SRC_PORT), eax).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::DST_PORT), port).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::LEN), 0).map_err(e)?;
    a.mov(word_ptr(r8 + hdr::TYPE), 1).map_err(e)?;
    a.mov(word_ptr(r8 + hdr::OP), op::REQUEST).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::FLAGS), 0).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::BUF_ALLOC), REQ_BUF_ALLOC)
        .map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::FWD_CNT), 0).map_err(e)?;
    // transmit descriptor NBUF + k = {r8, 44, 0}, available entry k
    a.lea(edx, dword_ptr(rcx + i32::from(NBUF))).map_err(e)?;
    a.mov(r9, rdx).map_err(e)?;
    a.shl(r9, 4).map_err(e)?;
    a.mov(qword_ptr(rbx + r9 + TX_DESC as i32), r8).map_err(e)?;
    a.mov(dword_ptr(rbx + r9 + (TX_DESC as i32 + 8)), HDR_BYTES as u32)
        .map_err(e)?;
    a.mov(dword_ptr(rbx + r9 + (TX_DESC as i32 + 12)), 0)
        .map_err(e)?;
    a.mov(word_ptr(rbx + rcx * 2 + (TX_AVAIL as i32 + 4)), dx)
        .map_err(e)?;
    a.inc(ecx).map_err(e)?;
    a.cmp(ecx, u32::from(conns)).map_err(e)?;
    a.jb(top).map_err(e)?;
    a.mov(r15d, u32::from(conns)).map_err(e)?;
    a.mov(word_ptr(rbx + (TX_AVAIL as i32 + 2)), r15w)
        .map_err(e)
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

/// Labels of the answers in [`reap_rx`].
struct Answers {
    rw: CodeLabel,
    request: CodeLabel,
    shutdown: CodeLabel,
    credit: CodeLabel,
    response: CodeLabel,
    rst: CodeLabel,
    /// Send `EDX` bytes of buffer `EAX` (header at `R8`).
    send: CodeLabel,
    /// Give buffer `EAX` back to the receive ring.
    back: CodeLabel,
    /// Look for the next used entry.
    check: CodeLabel,
}

/// Every used entry of the receive queue, answered (see the module docs).
fn reap_rx(a: &mut CodeAssembler, bad: CodeLabel) -> Result<(), MicroError> {
    let mut l = Answers {
        rw: a.create_label(),
        request: a.create_label(),
        shutdown: a.create_label(),
        credit: a.create_label(),
        response: a.create_label(),
        rst: a.create_label(),
        send: a.create_label(),
        back: a.create_label(),
        check: a.create_label(),
    };
    let mut top = a.create_label();
    a.jmp(l.check).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    used_entry(a, RX_USED, r12d, NBUF, bad)?;
    a.inc(r12d).map_err(e)?;
    // r8 = the buffer; a used length short of a header: straight back
    a.mov(r8, rax).map_err(e)?;
    a.shl(r8, 12).map_err(e)?;
    a.lea(r8, qword_ptr(rbx + r8 + RX_BUF as i32)).map_err(e)?;
    a.cmp(edx, HDR_BYTES as u32).map_err(e)?;
    a.jb(l.back).map_err(e)?;
    a.movzx(ecx, word_ptr(r8 + hdr::OP)).map_err(e)?;
    for (code, to) in [
        (op::RW, l.rw),
        (op::REQUEST, l.request),
        (op::SHUTDOWN, l.shutdown),
        (op::CREDIT_REQUEST, l.credit),
        (op::CREDIT_UPDATE, l.credit),
        (op::RESPONSE, l.response),
        (op::RST, l.rst),
    ] {
        a.cmp(ecx, code).map_err(e)?;
        a.je(to).map_err(e)?;
    }
    a.jmp(l.back).map_err(e)?;
    answers(a, &mut l)?;
    a.set_label(&mut l.check).map_err(e)?;
    a.movzx(ecx, word_ptr(rbx + (RX_USED as i32 + 2)))
        .map_err(e)?;
    a.cmp(cx, r12w).map_err(e)?;
    a.jne(top).map_err(e)
}

/// The answers' code: each ends at `check`.
fn answers(a: &mut CodeAssembler, l: &mut Answers) -> Result<(), MicroError> {
    // RW: echo it, the used length (header and payload) as it came.
    a.set_label(&mut l.rw).map_err(e)?;
    a.inc(qword_ptr(rbx + PACKETS as i32)).map_err(e)?;
    a.lea(ecx, dword_ptr(rdx - HDR_BYTES as i32)).map_err(e)?;
    a.add(qword_ptr(rbx + BYTES as i32), rcx).map_err(e)?;
    a.jmp(l.send).map_err(e)?;
    // Control answers: the op, no payload.
    for (label, answer, count) in [
        (&mut l.request, op::RESPONSE, Some(ACCEPTED)),
        (&mut l.shutdown, op::RST, Some(RESETS)),
        (&mut l.credit, op::CREDIT_UPDATE, None),
    ] {
        a.set_label(label).map_err(e)?;
        if let Some(c) = count {
            a.inc(qword_ptr(rbx + c as i32)).map_err(e)?;
        }
        a.mov(word_ptr(r8 + hdr::OP), answer).map_err(e)?;
        a.mov(dword_ptr(r8 + hdr::LEN), 0).map_err(e)?;
        a.mov(edx, HDR_BYTES as u32).map_err(e)?;
        a.jmp(l.send).map_err(e)?;
    }
    for (label, count) in [(&mut l.response, CONNECTED), (&mut l.rst, REFUSED)] {
        a.set_label(label).map_err(e)?;
        a.inc(qword_ptr(rbx + count as i32)).map_err(e)?;
        a.jmp(l.back).map_err(e)?;
    }
    // send: CIDs and ports swapped, flags cleared, transmit descriptor
    // EAX (buffer EAX) EDX long, available.
    a.set_label(&mut l.send).map_err(e)?;
    a.mov(r9, qword_ptr(r8 + hdr::SRC_CID)).map_err(e)?;
    a.mov(r11, qword_ptr(r8 + hdr::DST_CID)).map_err(e)?;
    a.mov(qword_ptr(r8 + hdr::SRC_CID), r11).map_err(e)?;
    a.mov(qword_ptr(r8 + hdr::DST_CID), r9).map_err(e)?;
    a.mov(r9d, dword_ptr(r8 + hdr::SRC_PORT)).map_err(e)?;
    a.mov(r11d, dword_ptr(r8 + hdr::DST_PORT)).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::SRC_PORT), r11d).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::DST_PORT), r9d).map_err(e)?;
    a.mov(dword_ptr(r8 + hdr::FLAGS), 0).map_err(e)?;
    a.mov(r9, rax).map_err(e)?;
    a.shl(r9, 4).map_err(e)?;
    a.mov(dword_ptr(rbx + r9 + (TX_DESC as i32 + 8)), edx)
        .map_err(e)?;
    repost(a, TX_AVAIL, r15d, r15w, 2)?;
    a.jmp(l.check).map_err(e)?;
    a.set_label(&mut l.back).map_err(e)?;
    repost(a, RX_AVAIL, r13d, r13w, 1)?;
    a.jmp(l.check).map_err(e)
}

/// Every used entry of the transmit queue: an answer's buffer goes back
/// to the receive ring; a request's descriptor is done.
fn reap_tx(a: &mut CodeAssembler, bad: CodeLabel) -> Result<(), MicroError> {
    let mut top = a.create_label();
    let mut check = a.create_label();
    a.jmp(check).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    used_entry(a, TX_USED, r14d, NBUF + MAX_CONNECT, bad)?;
    a.inc(r14d).map_err(e)?;
    a.cmp(eax, u32::from(NBUF)).map_err(e)?;
    a.jae(check).map_err(e)?;
    repost(a, RX_AVAIL, r13d, r13w, 1)?;
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
    fn the_programs_assemble_and_fit() {
        assert!(program(VsockMode::Echo).is_ok());
        assert!(program(VsockMode::Connect { port: 5, conns: 1 }).is_ok());
        assert!(program(VsockMode::Connect {
            port: 5,
            conns: MAX_CONNECT
        })
        .is_ok());
        assert!(program(VsockMode::Connect { port: 5, conns: 0 }).is_err());
        assert!(program(VsockMode::Connect {
            port: 5,
            conns: MAX_CONNECT + 1
        })
        .is_err());
    }
}
