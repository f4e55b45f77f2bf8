//! A tiny virtio driver for micro-guests, written as iced-x86 code: the
//! transport steps (reset, feature negotiation, MSI-X, one queue,
//! `DRIVER_OK`), and virtio-blk requests on queue 0 at any queue depth up
//! to [`MAX_QD`]. Programs built with it are in [`super::blk`].
//!
//! The driver drives device 0 of the VM from one vCPU. It accepts
//! `VERSION_1` and nothing else (callers may add feature bits, as the
//! hostile programs do), points MSI-X vectors 0 (the queue) and 1
//! (configuration changes, `NEEDS_RESET` among them) at the vCPU running
//! it, and waits for completions with "look at the used index, then
//! `HLT`" (the device's interrupt rings the vCPU's doorbell; see
//! [`super::devices`]).
//!
//! # Registers
//! | register | holds |
//! |---|---|
//! | `RBX` | [`DATA_ADDR`], the base of everything below |
//! | `RBP` | the device's BAR |
//! | `R12` | free request slots |
//! | `R13` | requests in flight |
//! | `R14` | the used index the driver has reached |
//! | `R15` | the available index the driver has published |
//! | `RDI`, `RSI` | kept: the vCPU's index, the VM's vCPU count |
//! | `RAX`, `RCX`, `RDX`, `R8`, `R9` | scratch: every helper clobbers them |
//! | `R10`, `R11` | the program's own (helpers keep them) |
//!
//! # Memory (offsets from [`DATA_ADDR`])
//! | offset | what |
//! |---|---|
//! | [`COMPLETED`] | requests completed (u64; the host reads it) |
//! | [`FLUSHED`] | generations flushed (u64; integrity writer) |
//! | [`LAST_STATUS`] | the device status the program saw last (u64) |
//! | [`NOTIFIED`] | the available index last notified (u16) |
//! | [`DESC`] | descriptor table, [`QUEUE_SIZE`] entries: slot `s` uses `s` (header), `64 + s` (data), `128 + s` (status) |
//! | [`AVAIL`], [`USED`] | the rings |
//! | [`HDR`] | request headers, 16 bytes per slot |
//! | [`STATUS_BYTES`] | status bytes, one per slot |
//! | [`FREE`] | the free-slot stack (u32 each) |
//! | [`SCRATCH`] | for hostile programs' own tables |
//! | [`BUF`] | data buffers, [`BLOCK_BYTES`] per slot |
//!
//! # Failure codes (`DONE n`)
//! | n | why |
//! |---|---|
//! | [`FAIL_IO`] | a request completed with a status other than OK |
//! | [`FAIL_SETUP`] | the device refused the setup (features, `DRIVER_OK`) |
//! | [`FAIL_VERIFY`] | a block read back differs from what was written |
//! | [`FAIL_USED`] | the used ring returned a slot the driver did not post |
//! | [`FAIL_DEVICE`] | the device needs a reset (`NEEDS_RESET`) |

use iced_x86::code_asm::*;

use super::asm::GuestAsm;
use super::{MicroError, DATA_ADDR};

/// Word `k` of a block the integrity writer fills is word 0 XOR
/// `k * PATTERN_STEP` (`blk::verify` checks the same pattern).
pub const PATTERN_STEP: u64 = 0x7f4a_7c15;

fn e(x: IcedError) -> MicroError {
    MicroError::Assemble(x.to_string())
}

/// Requests completed (u64).
pub const COMPLETED: u64 = 0x000;
/// Generations written and flushed (u64).
pub const FLUSHED: u64 = 0x080;
/// The last device status the program recorded (u64).
pub const LAST_STATUS: u64 = 0x100;
/// The available index last notified (u16).
pub const NOTIFIED: u64 = 0x180;
/// Descriptor table.
pub const DESC: u64 = 0x1000;
/// Available ring.
pub const AVAIL: u64 = 0x2000;
/// Used ring.
pub const USED: u64 = 0x3000;
/// Request headers.
pub const HDR: u64 = 0x4000;
/// Status bytes.
pub const STATUS_BYTES: u64 = 0x4800;
/// Free-slot stack.
pub const FREE: u64 = 0x5000;
/// Free for a program's own tables (up to [`BUF`]).
pub const SCRATCH: u64 = 0x6000;
/// Data buffers.
pub const BUF: u64 = 0x1_0000;
/// Bytes per request (and per buffer).
pub const BLOCK_BYTES: u64 = 4096;
/// The queue size the driver sets.
pub const QUEUE_SIZE: u16 = 256;
/// The deepest queue the driver keeps (three descriptors per request).
pub const MAX_QD: u16 = 64;
/// Data-area bytes the driver needs (RAM must reach `DATA_ADDR` + this).
pub const AREA: u64 = BUF + MAX_QD as u64 * BLOCK_BYTES;

/// `DONE` codes; see the module docs.
pub const FAIL_IO: u32 = 2;
/// See the module docs.
pub const FAIL_SETUP: u32 = 3;
/// See the module docs.
pub const FAIL_VERIFY: u32 = 4;
/// See the module docs.
pub const FAIL_USED: u32 = 5;
/// See the module docs.
pub const FAIL_DEVICE: u32 = 6;

/// virtio-blk request types.
pub const T_IN: u32 = 0;
/// Write.
pub const T_OUT: u32 = 1;
/// Flush.
pub const T_FLUSH: u32 = 4;

/// Descriptor flags.
pub const F_NEXT: u16 = 1;
/// Device-writable.
pub const F_WRITE: u16 = 2;
/// An indirect table.
pub const F_INDIRECT: u16 = 4;

/// Common configuration registers (offsets in the BAR).
pub mod reg {
    /// device_feature_select (u32).
    pub const DEVICE_FEATURE_SELECT: i32 = 0x00;
    /// device_feature (u32).
    pub const DEVICE_FEATURE: i32 = 0x04;
    /// driver_feature_select (u32).
    pub const DRIVER_FEATURE_SELECT: i32 = 0x08;
    /// driver_feature (u32).
    pub const DRIVER_FEATURE: i32 = 0x0c;
    /// config_msix_vector (u16).
    pub const CONFIG_VECTOR: i32 = 0x10;
    /// device_status (u8).
    pub const STATUS: i32 = 0x14;
    /// queue_select (u16).
    pub const QUEUE_SELECT: i32 = 0x16;
    /// queue_size (u16).
    pub const QUEUE_SIZE: i32 = 0x18;
    /// queue_msix_vector (u16).
    pub const QUEUE_VECTOR: i32 = 0x1a;
    /// queue_enable (u16).
    pub const QUEUE_ENABLE: i32 = 0x1c;
    /// queue_desc (low u32; high at +4).
    pub const QUEUE_DESC: i32 = 0x20;
    /// queue_driver, the available ring.
    pub const QUEUE_AVAIL: i32 = 0x28;
    /// queue_device, the used ring.
    pub const QUEUE_USED: i32 = 0x30;
    /// Queue 0's notification address (queue `q`'s is `NOTIFY + 4 q`).
    pub const NOTIFY: i32 = 0x3000;
    /// The MSI-X table.
    pub const MSIX_TABLE: i32 = 0x8000;
}

/// Device status bits.
pub mod status {
    pub use vmm_devices::virtio::status::*;
}

/// Absolute guest address of data-area offset `off`.
pub const fn data(off: u64) -> u64 {
    DATA_ADDR + off
}

/// Labels of the driver's subroutines, emitted once by
/// [`Driver::finish`].
#[derive(Clone, Copy)]
struct Subs {
    take: CodeLabel,
    post: CodeLabel,
    reap: CodeLabel,
    wait: CodeLabel,
    drain: CodeLabel,
    fill: CodeLabel,
    check: CodeLabel,
    setup_slots: CodeLabel,
    fail: [CodeLabel; 5],
}

/// A program that drives device 0 (see the module docs).
pub struct Driver {
    g: GuestAsm,
    qd: u16,
    subs: Subs,
}

impl Driver {
    /// A program whose driver keeps up to `qd` requests in flight
    /// (1..=[`MAX_QD`]) on the device whose BAR is at `bar`.
    pub fn new(bar: u64, qd: u16) -> Result<Self, MicroError> {
        if qd == 0 || qd > MAX_QD {
            return Err(MicroError::Input(format!(
                "queue depth {qd}; the micro-guest driver keeps 1 to {MAX_QD} requests in flight"
            )));
        }
        let mut g = GuestAsm::new()?;
        let mut l = || g.label();
        let subs = Subs {
            take: l(),
            post: l(),
            reap: l(),
            wait: l(),
            drain: l(),
            fill: l(),
            check: l(),
            setup_slots: l(),
            fail: [l(), l(), l(), l(), l()],
        };
        g.raw().mov(rbp, bar).map_err(e)?;
        Ok(Self { g, qd, subs })
    }

    /// The assembler, for the program's own code.
    pub fn asm(&mut self) -> &mut GuestAsm {
        &mut self.g
    }

    /// The raw assembler.
    pub fn a(&mut self) -> &mut CodeAssembler {
        self.g.raw()
    }

    /// The queue depth.
    pub fn qd(&self) -> u16 {
        self.qd
    }

    /// The label that ends the program with `DONE code` (one of the
    /// `FAIL_*` codes).
    pub fn fail(&self, code: u32) -> CodeLabel {
        let i = match code {
            FAIL_IO => 0,
            FAIL_SETUP => 1,
            FAIL_VERIFY => 2,
            FAIL_USED => 3,
            _ => 4,
        };
        self.subs.fail[i]
    }

    /// A write of `v` (1, 2 or 4 bytes) to BAR offset `off`.
    pub fn write_reg(&mut self, off: i32, v: u32, size: u8) -> Result<(), MicroError> {
        let a = self.a();
        match size {
            1 => a.mov(byte_ptr(rbp + off), v),
            2 => a.mov(word_ptr(rbp + off), v),
            _ => a.mov(dword_ptr(rbp + off), v),
        }
        .map_err(e)
    }

    /// `EAX` = the device status byte.
    pub fn read_status(&mut self) -> Result<(), MicroError> {
        self.a().movzx(eax, byte_ptr(rbp + reg::STATUS)).map_err(e)
    }

    /// Reset, `ACKNOWLEDGE | DRIVER`, `VERSION_1` plus `features_low`
    /// (bits 0-31), `FEATURES_OK` (checked), MSI-X vectors 0 and 1 at this
    /// vCPU, configuration changes on vector 1.
    pub fn begin(&mut self, features_low: u32) -> Result<(), MicroError> {
        use status::*;
        let setup = self.fail(FAIL_SETUP);
        self.write_reg(reg::STATUS, 0, 1)?;
        self.write_reg(reg::STATUS, u32::from(ACKNOWLEDGE), 1)?;
        self.write_reg(reg::STATUS, u32::from(ACKNOWLEDGE | DRIVER), 1)?;
        self.write_reg(reg::DEVICE_FEATURE_SELECT, 1, 4)?;
        let a = self.a();
        a.mov(eax, dword_ptr(rbp + reg::DEVICE_FEATURE))
            .map_err(e)?;
        a.test(eax, 1).map_err(e)?; // VERSION_1 is bit 32
        a.jz(setup).map_err(e)?;
        self.write_reg(reg::DRIVER_FEATURE_SELECT, 0, 4)?;
        self.write_reg(reg::DRIVER_FEATURE, features_low, 4)?;
        self.write_reg(reg::DRIVER_FEATURE_SELECT, 1, 4)?;
        self.write_reg(reg::DRIVER_FEATURE, 1, 4)?;
        self.write_reg(
            reg::STATUS,
            u32::from(ACKNOWLEDGE | DRIVER | FEATURES_OK),
            1,
        )?;
        self.read_status()?;
        let a = self.a();
        a.test(eax, u32::from(FEATURES_OK)).map_err(e)?;
        a.jz(setup).map_err(e)?;
        // MSI-X entries 0 and 1: address 0xfee00000 | vcpu << 12.
        a.mov(eax, edi).map_err(e)?;
        a.shl(eax, 12).map_err(e)?;
        a.or(eax, 0xfee0_0000u32).map_err(e)?;
        for v in 0..2 {
            let t = reg::MSIX_TABLE + 16 * v;
            a.mov(dword_ptr(rbp + t), eax).map_err(e)?;
            a.mov(dword_ptr(rbp + (t + 4)), 0).map_err(e)?;
            a.mov(dword_ptr(rbp + (t + 8)), 0).map_err(e)?;
            a.mov(dword_ptr(rbp + (t + 12)), 0).map_err(e)?;
        }
        self.write_reg(reg::CONFIG_VECTOR, 1, 2)
    }

    /// Queue 0 of `size` entries at [`DESC`], [`AVAIL`], [`USED`] on
    /// vector 0, rings emptied, every request slot's descriptors written
    /// and free, enabled. `size` other than [`QUEUE_SIZE`] is for hostile
    /// programs (the request helpers assume [`QUEUE_SIZE`]).
    pub fn queue(&mut self, size: u16) -> Result<(), MicroError> {
        self.queue_at(size, data(DESC), data(AVAIL), data(USED))
    }

    /// As [`queue`](Self::queue), with the rings' addresses given.
    pub fn queue_at(
        &mut self,
        size: u16,
        desc: u64,
        avail: u64,
        used: u64,
    ) -> Result<(), MicroError> {
        let setup_slots = self.subs.setup_slots;
        let a = self.a();
        // Empty rings: flags and index 0 (the device starts at 0 too).
        a.mov(dword_ptr(rbx + AVAIL as i32), 0).map_err(e)?;
        a.mov(dword_ptr(rbx + USED as i32), 0).map_err(e)?;
        a.mov(word_ptr(rbx + NOTIFIED as i32), 0).map_err(e)?;
        a.call(setup_slots).map_err(e)?;
        self.queue_regs(0, size, 0, [desc, avail, used])
    }

    /// Queue `index` of `size` entries on MSI-X vector `vector`, its rings
    /// at `[desc, avail, used]`, enabled; the rings' contents are the
    /// caller's (for drivers other than the block helpers').
    pub fn queue_regs(
        &mut self,
        index: u16,
        size: u16,
        vector: u16,
        rings: [u64; 3],
    ) -> Result<(), MicroError> {
        self.write_reg(reg::QUEUE_SELECT, u32::from(index), 2)?;
        self.write_reg(reg::QUEUE_SIZE, u32::from(size), 2)?;
        self.write_reg(reg::QUEUE_VECTOR, u32::from(vector), 2)?;
        for (r, addr) in [reg::QUEUE_DESC, reg::QUEUE_AVAIL, reg::QUEUE_USED]
            .into_iter()
            .zip(rings)
        {
            self.write_reg(r, addr as u32, 4)?;
            self.write_reg(r + 4, (addr >> 32) as u32, 4)?;
        }
        self.write_reg(reg::QUEUE_ENABLE, 1, 2)
    }

    /// `DRIVER_OK`, then checks that the device took it (not
    /// `NEEDS_RESET`).
    pub fn driver_ok(&mut self) -> Result<(), MicroError> {
        use status::*;
        let setup = self.fail(FAIL_SETUP);
        self.write_reg(
            reg::STATUS,
            u32::from(ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK),
            1,
        )?;
        self.read_status()?;
        let a = self.a();
        a.test(eax, u32::from(NEEDS_RESET)).map_err(e)?;
        a.jnz(setup).map_err(e)?;
        a.test(eax, u32::from(DRIVER_OK)).map_err(e)?;
        a.jz(setup).map_err(e)
    }

    /// The whole setup: [`begin`](Self::begin) with no extra features,
    /// [`queue`](Self::queue), [`driver_ok`](Self::driver_ok).
    pub fn init(&mut self) -> Result<(), MicroError> {
        self.begin(0)?;
        self.queue(QUEUE_SIZE)?;
        self.driver_ok()
    }

    /// `R8` = a free slot (there must be one: `R12` > 0).
    pub fn take(&mut self) -> Result<(), MicroError> {
        let l = self.subs.take;
        self.a().call(l).map_err(e)
    }

    /// Makes request `EAX` (type) at sector `RDX` available in slot `R8`
    /// (its buffer is [`BUF`]` + R8 * 4096`); notified at the next wait.
    pub fn post(&mut self) -> Result<(), MicroError> {
        let l = self.subs.post;
        self.a().call(l).map_err(e)
    }

    /// Waits until at least one request completes, and reaps what did
    /// (each frees its slot and counts in [`COMPLETED`]; a status other
    /// than OK ends the program with [`FAIL_IO`]). Notifies the device
    /// first if requests were posted since the last notification.
    pub fn wait(&mut self) -> Result<(), MicroError> {
        let l = self.subs.wait;
        self.a().call(l).map_err(e)
    }

    /// Waits until no request is in flight.
    pub fn drain(&mut self) -> Result<(), MicroError> {
        let l = self.subs.drain;
        self.a().call(l).map_err(e)
    }

    /// Fills slot `R8`'s buffer with the pattern whose first word is
    /// `RAX` (word `k` is `RAX ^ k * PATTERN_STEP`).
    pub fn fill(&mut self) -> Result<(), MicroError> {
        let l = self.subs.fill;
        self.a().call(l).map_err(e)
    }

    /// Compares slot `R8`'s buffer with the pattern of `RAX`: `EAX` = 0
    /// if it matches, 1 if not.
    pub fn check(&mut self) -> Result<(), MicroError> {
        let l = self.subs.check;
        self.a().call(l).map_err(e)
    }

    /// Posts one request of type `kind` at sector `RDX` and waits for it
    /// (queue depth 1); `R8` is its slot afterwards.
    pub fn request(&mut self, kind: u32) -> Result<(), MicroError> {
        self.take()?;
        let a = self.a();
        a.push(r8).map_err(e)?;
        a.mov(eax, kind).map_err(e)?;
        self.post()?;
        self.drain()?;
        self.a().pop(r8).map_err(e)
    }

    /// Ends the program with `DONE 0`, emits the subroutines and
    /// assembles.
    pub fn finish(mut self) -> Result<Vec<u8>, MicroError> {
        self.g.done(0)?;
        self.emit_subs()?;
        self.g.finish()
    }

    /// The subroutines every program may call, each emitted once.
    fn emit_subs(&mut self) -> Result<(), MicroError> {
        // Copies of the labels: binding one binds every copy (same id).
        let mut s = self.subs;
        let qd = u32::from(self.qd);
        let g = &mut self.g;
        emit_setup_slots(g, &mut s.setup_slots, qd)?;
        emit_take(g, &mut s.take)?;
        emit_post(g, &mut s.post)?;
        emit_reap(g, &mut s, qd)?;
        emit_wait(g, &mut s)?;
        emit_drain(g, &mut s)?;
        emit_pattern(g, &mut s.fill, true)?;
        emit_pattern(g, &mut s.check, false)?;
        for (label, code) in
            s.fail
                .iter_mut()
                .zip([FAIL_IO, FAIL_SETUP, FAIL_VERIFY, FAIL_USED, FAIL_DEVICE])
        {
            g.bind(label)?;
            g.done(code)?;
        }
        Ok(())
    }
}

/// The used-ring index mask of a [`QUEUE_SIZE`] queue.
const MASK: i32 = QUEUE_SIZE as i32 - 1;

/// `setup_slots`: the descriptors of every slot written, all `qd` slots
/// free, the ring indices (`R12`-`R15`) reset.
fn emit_setup_slots(g: &mut GuestAsm, label: &mut CodeLabel, qd: u32) -> Result<(), MicroError> {
    g.bind(label)?;
    let a = g.raw();
    let mut top = a.create_label();
    a.xor(ecx, ecx).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    // r8 = &desc[s]
    a.mov(r8, rcx).map_err(e)?;
    a.shl(r8, 4).map_err(e)?;
    a.lea(r8, qword_ptr(rbx + r8 + DESC as i32)).map_err(e)?;
    // header: HDR + 16 s, 16 bytes, next 64 + s
    a.mov(r9, rcx).map_err(e)?;
    a.shl(r9, 4).map_err(e)?;
    a.lea(r9, qword_ptr(rbx + r9 + HDR as i32)).map_err(e)?;
    a.mov(qword_ptr(r8), r9).map_err(e)?;
    a.mov(dword_ptr(r8 + 8), 16).map_err(e)?;
    a.mov(word_ptr(r8 + 12), u32::from(F_NEXT)).map_err(e)?;
    a.lea(eax, dword_ptr(rcx + i32::from(MAX_QD))).map_err(e)?;
    a.mov(word_ptr(r8 + 14), ax).map_err(e)?;
    // data: BUF + 4096 s, 4096 bytes, next 128 + s
    let d = 16 * i32::from(MAX_QD);
    a.mov(r9, rcx).map_err(e)?;
    a.shl(r9, 12).map_err(e)?;
    a.lea(r9, qword_ptr(rbx + r9 + BUF as i32)).map_err(e)?;
    a.mov(qword_ptr(r8 + d), r9).map_err(e)?;
    a.mov(dword_ptr(r8 + (d + 8)), BLOCK_BYTES as u32)
        .map_err(e)?;
    a.mov(word_ptr(r8 + (d + 12)), u32::from(F_NEXT))
        .map_err(e)?;
    a.lea(eax, dword_ptr(rcx + 2 * i32::from(MAX_QD)))
        .map_err(e)?;
    a.mov(word_ptr(r8 + (d + 14)), ax).map_err(e)?;
    // status: STATUS_BYTES + s, 1 byte, device-writable
    a.lea(r9, qword_ptr(rbx + rcx + STATUS_BYTES as i32))
        .map_err(e)?;
    a.mov(qword_ptr(r8 + 2 * d), r9).map_err(e)?;
    a.mov(dword_ptr(r8 + (2 * d + 8)), 1).map_err(e)?;
    a.mov(dword_ptr(r8 + (2 * d + 12)), u32::from(F_WRITE))
        .map_err(e)?;
    // free
    a.mov(dword_ptr(rbx + rcx * 4 + FREE as i32), ecx)
        .map_err(e)?;
    a.inc(ecx).map_err(e)?;
    a.cmp(ecx, qd).map_err(e)?;
    a.jb(top).map_err(e)?;
    a.mov(r12d, qd).map_err(e)?;
    a.xor(r13d, r13d).map_err(e)?;
    a.xor(r14d, r14d).map_err(e)?;
    a.xor(r15d, r15d).map_err(e)?;
    a.ret().map_err(e)
}

/// `take`: `R8` = a free slot.
fn emit_take(g: &mut GuestAsm, label: &mut CodeLabel) -> Result<(), MicroError> {
    g.bind(label)?;
    let a = g.raw();
    a.dec(r12).map_err(e)?;
    a.mov(r8d, dword_ptr(rbx + r12 * 4 + FREE as i32))
        .map_err(e)?;
    a.ret().map_err(e)
}

/// `post`: request `EAX` at sector `RDX` in slot `R8`, made available.
fn emit_post(g: &mut GuestAsm, label: &mut CodeLabel) -> Result<(), MicroError> {
    g.bind(label)?;
    let a = g.raw();
    let mut flush = a.create_label();
    let mut read = a.create_label();
    let mut avail = a.create_label();
    a.mov(r9, r8).map_err(e)?;
    a.shl(r9, 4).map_err(e)?;
    a.mov(dword_ptr(rbx + r9 + HDR as i32), eax).map_err(e)?;
    a.mov(dword_ptr(rbx + r9 + (HDR as i32 + 4)), 0)
        .map_err(e)?;
    a.mov(qword_ptr(rbx + r9 + (HDR as i32 + 8)), rdx)
        .map_err(e)?;
    a.mov(byte_ptr(rbx + r8 + STATUS_BYTES as i32), 0xff)
        .map_err(e)?;
    // r9 = &desc[s]; the data descriptor is 64 entries on
    let d = 16 * i32::from(MAX_QD);
    a.lea(r9, qword_ptr(rbx + r9 + DESC as i32)).map_err(e)?;
    a.cmp(eax, T_FLUSH).map_err(e)?;
    a.je(flush).map_err(e)?;
    a.lea(edx, dword_ptr(r8 + i32::from(MAX_QD))).map_err(e)?;
    a.mov(word_ptr(r9 + 14), dx).map_err(e)?;
    a.cmp(eax, T_IN).map_err(e)?;
    a.je(read).map_err(e)?;
    a.mov(word_ptr(r9 + (d + 12)), u32::from(F_NEXT))
        .map_err(e)?;
    a.jmp(avail).map_err(e)?;
    a.set_label(&mut read).map_err(e)?;
    a.mov(word_ptr(r9 + (d + 12)), u32::from(F_NEXT | F_WRITE))
        .map_err(e)?;
    a.jmp(avail).map_err(e)?;
    a.set_label(&mut flush).map_err(e)?;
    a.lea(edx, dword_ptr(r8 + 2 * i32::from(MAX_QD)))
        .map_err(e)?;
    a.mov(word_ptr(r9 + 14), dx).map_err(e)?;
    a.set_label(&mut avail).map_err(e)?;
    a.mov(eax, r15d).map_err(e)?;
    a.and(eax, MASK).map_err(e)?;
    a.mov(word_ptr(rbx + rax * 2 + (AVAIL as i32 + 4)), r8w)
        .map_err(e)?;
    a.inc(r15d).map_err(e)?;
    // the index after the entry (x86 keeps the stores in order)
    a.mov(word_ptr(rbx + (AVAIL as i32 + 2)), r15w).map_err(e)?;
    a.inc(r13).map_err(e)?;
    a.ret().map_err(e)
}

/// `reap`: every used entry up to the device's used index.
fn emit_reap(g: &mut GuestAsm, s: &mut Subs, qd: u32) -> Result<(), MicroError> {
    let (fail_io, fail_used) = (s.fail[0], s.fail[3]);
    g.bind(&mut s.reap)?;
    let top = s.reap;
    let a = g.raw();
    let mut out = a.create_label();
    a.movzx(eax, word_ptr(rbx + (USED as i32 + 2))).map_err(e)?;
    a.cmp(ax, r14w).map_err(e)?;
    a.je(out).map_err(e)?;
    a.mov(ecx, r14d).map_err(e)?;
    a.and(ecx, MASK).map_err(e)?;
    a.mov(eax, dword_ptr(rbx + rcx * 8 + (USED as i32 + 4)))
        .map_err(e)?;
    a.cmp(eax, qd).map_err(e)?;
    a.jae(fail_used).map_err(e)?;
    a.movzx(ecx, byte_ptr(rbx + rax + STATUS_BYTES as i32))
        .map_err(e)?;
    a.test(ecx, ecx).map_err(e)?;
    a.jnz(fail_io).map_err(e)?;
    a.mov(dword_ptr(rbx + r12 * 4 + FREE as i32), eax)
        .map_err(e)?;
    a.inc(r12).map_err(e)?;
    a.dec(r13).map_err(e)?;
    a.inc(r14d).map_err(e)?;
    a.inc(qword_ptr(rbx + COMPLETED as i32)).map_err(e)?;
    a.jmp(top).map_err(e)?;
    a.set_label(&mut out).map_err(e)?;
    a.ret().map_err(e)
}

/// `wait`: notify if needed, then `HLT` until the used index moves; a
/// wake with no progress looks at the device status (its configuration
/// interrupt: `NEEDS_RESET`).
fn emit_wait(g: &mut GuestAsm, s: &mut Subs) -> Result<(), MicroError> {
    let fail_device = s.fail[4];
    g.bind(&mut s.wait)?;
    let reap = s.reap;
    let a = g.raw();
    let mut look = a.create_label();
    let mut progress = a.create_label();
    a.cmp(word_ptr(rbx + NOTIFIED as i32), r15w).map_err(e)?;
    a.je(look).map_err(e)?;
    a.mov(word_ptr(rbx + NOTIFIED as i32), r15w).map_err(e)?;
    a.mov(word_ptr(rbp + reg::NOTIFY), 0).map_err(e)?;
    let sleep = look;
    a.set_label(&mut look).map_err(e)?;
    a.movzx(eax, word_ptr(rbx + (USED as i32 + 2))).map_err(e)?;
    a.cmp(ax, r14w).map_err(e)?;
    a.jne(progress).map_err(e)?;
    a.hlt().map_err(e)?;
    a.movzx(eax, word_ptr(rbx + (USED as i32 + 2))).map_err(e)?;
    a.cmp(ax, r14w).map_err(e)?;
    a.jne(progress).map_err(e)?;
    a.movzx(eax, byte_ptr(rbp + reg::STATUS)).map_err(e)?;
    a.mov(qword_ptr(rbx + LAST_STATUS as i32), rax).map_err(e)?;
    a.test(eax, u32::from(status::NEEDS_RESET)).map_err(e)?;
    a.jnz(fail_device).map_err(e)?;
    a.jmp(sleep).map_err(e)?;
    a.set_label(&mut progress).map_err(e)?;
    a.call(reap).map_err(e)?;
    a.ret().map_err(e)
}

/// `drain`: wait until nothing is in flight.
fn emit_drain(g: &mut GuestAsm, s: &mut Subs) -> Result<(), MicroError> {
    g.bind(&mut s.drain)?;
    let (wait, top) = (s.wait, s.drain);
    let a = g.raw();
    let mut out = a.create_label();
    a.test(r13, r13).map_err(e)?;
    a.jz(out).map_err(e)?;
    a.call(wait).map_err(e)?;
    a.jmp(top).map_err(e)?;
    a.set_label(&mut out).map_err(e)?;
    a.ret().map_err(e)
}

/// `fill` (`write`) or `check`: slot `R8`'s buffer against the pattern of
/// `RAX`.
fn emit_pattern(g: &mut GuestAsm, label: &mut CodeLabel, write: bool) -> Result<(), MicroError> {
    g.bind(label)?;
    let a = g.raw();
    let mut top = a.create_label();
    let mut bad = a.create_label();
    a.mov(rcx, r8).map_err(e)?;
    a.shl(rcx, 12).map_err(e)?;
    a.lea(rcx, qword_ptr(rbx + rcx + BUF as i32)).map_err(e)?;
    a.xor(edx, edx).map_err(e)?;
    a.mov(r9d, (BLOCK_BYTES / 8) as u32).map_err(e)?;
    a.set_label(&mut top).map_err(e)?;
    a.mov(r8, rax).map_err(e)?;
    a.xor(r8, rdx).map_err(e)?;
    if write {
        a.mov(qword_ptr(rcx), r8).map_err(e)?;
    } else {
        a.cmp(qword_ptr(rcx), r8).map_err(e)?;
        a.jne(bad).map_err(e)?;
    }
    a.add(rcx, 8).map_err(e)?;
    a.add(rdx, PATTERN_STEP as i32).map_err(e)?;
    a.dec(r9d).map_err(e)?;
    a.jnz(top).map_err(e)?;
    a.xor(eax, eax).map_err(e)?;
    a.ret().map_err(e)?;
    a.set_label(&mut bad).map_err(e)?;
    a.mov(eax, 1).map_err(e)?;
    a.ret().map_err(e)
}
