//! virtio-blk micro-guest programs, built on [`super::driver`], and the
//! host's check of what they wrote.
//!
//! * [`Integrity`]: writes generations of 4 KiB blocks whose every word
//!   encodes (block, generation), flushes after each generation and
//!   `REPORT`s the generation once its flush has completed; optionally
//!   reads every block back and compares it in the guest. [`verify`]
//!   checks an image on the host: every block written by a generation
//!   whose flush completed holds that generation or a later one that
//!   wrote it, whole.
//! * [`Iops`]: random 4 KiB reads (or writes) at a queue depth, for ever;
//!   [`COMPLETED`](super::driver::COMPLETED) counts them.
//! * [`Hostile`]: one program per way a driver can break the rules; each
//!   waits for the device to set `NEEDS_RESET` (woken by its
//!   configuration interrupt), `REPORT`s the status, then resets the
//!   device, serves one read to show that a reset brings it back,
//!   `REPORT`s 1 and ends.
//!
//! All drive device 0 from vCPU 0 of a one-vCPU VM.
//!
//! # The pattern
//! Block `b` written by generation `g` holds 512 little-endian words:
//! word 0 is `0xB10C << 48 | g << 24 | b` ([`word0`]), word `k` is word 0
//! XOR `k * PATTERN_STEP`. A block holding a mix of two writes, another
//! block's data or zeros where data belongs is caught by [`verify`].
//!
//! # Generations
//! Write `n` (counting from 0 over the whole run) goes to block
//! `n mod blocks`; generation `g` is writes `g * per_gen .. (g + 1) *
//! per_gen`, all completed before its flush is posted.

use std::path::Path;

use iced_x86::code_asm::*;

use super::devices::DEVICE_BASE;
use super::driver::{
    data, reg, Driver, BLOCK_BYTES, BUF, DESC, FAIL_VERIFY, FLUSHED, F_INDIRECT, F_NEXT, F_WRITE,
    HDR, LAST_STATUS, QUEUE_SIZE, SCRATCH, STATUS_BYTES, T_FLUSH, T_IN, T_OUT, USED,
};
use super::MicroError;

fn e(x: IcedError) -> MicroError {
    MicroError::Assemble(x.to_string())
}

/// The tag in the top 16 bits of a block's first word.
pub const MAGIC: u64 = 0xb10c;
/// Word `k` of a block is word 0 XOR `k * PATTERN_STEP` (the driver's
/// assembler writes the same pattern).
pub use super::driver::PATTERN_STEP;
/// Most blocks the pattern can name (24 bits).
pub const MAX_BLOCKS: u64 = 1 << 24;
/// Generations the pattern can name (24 bits); a run without a
/// generation count stops after this many.
pub const MAX_GENS: u64 = (1 << 24) - 1;
/// Sectors per block.
const SECTORS: u64 = BLOCK_BYTES / 512;

/// The first word of block `block` as generation `gen` writes it.
pub fn word0(block: u64, gen: u64) -> u64 {
    MAGIC << 48 | (gen & 0xff_ffff) << 24 | (block & 0xff_ffff)
}

/// Block `block` as generation `gen` writes it.
pub fn pattern(block: u64, gen: u64) -> Vec<u8> {
    let w0 = word0(block, gen);
    (0..BLOCK_BYTES / 8)
        .flat_map(|k| (w0 ^ k.wrapping_mul(PATTERN_STEP)).to_le_bytes())
        .collect()
}

/// The integrity writer (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Integrity {
    /// Blocks of the image it writes, from block 0 (1..=2^24).
    pub blocks: u64,
    /// Writes per generation (1..=2^20).
    pub per_gen: u32,
    /// Generations; 0: until stopped (or [`MAX_GENS`]).
    pub gens: u64,
    /// Requests in flight (1..=64).
    pub qd: u16,
    /// Read every block back at the end and compare it in the guest
    /// (needs `gens` > 0).
    pub verify: bool,
}

impl Integrity {
    /// Refuses parameters the program cannot run with.
    pub fn validate(&self) -> Result<(), MicroError> {
        let bad = |s: String| Err(MicroError::Input(s));
        if self.blocks == 0 || self.blocks > MAX_BLOCKS {
            return bad(format!(
                "{} blocks of 4 KiB; the integrity writer takes 1 to {MAX_BLOCKS}",
                self.blocks
            ));
        }
        if self.per_gen == 0 || self.per_gen > 1 << 20 {
            return bad(format!(
                "{} writes per generation; give 1 to {}",
                self.per_gen,
                1 << 20
            ));
        }
        if self.gens > MAX_GENS {
            return bad(format!(
                "{} generations; at most {MAX_GENS} (0: until stopped)",
                self.gens
            ));
        }
        if self.verify && self.gens == 0 {
            return bad("a read-back needs a number of generations".into());
        }
        Ok(())
    }

    /// Writes in the first `gens` generations.
    fn writes(&self, gens: u64) -> u64 {
        gens.saturating_mul(u64::from(self.per_gen))
    }

    /// The generation that wrote `block` last among the first `gens`;
    /// `None` if none did.
    pub fn last_gen(&self, block: u64, gens: u64) -> Option<u64> {
        let n = self.writes(gens);
        if block >= self.blocks || block >= n {
            return None;
        }
        let last = block + self.blocks * ((n - 1 - block) / self.blocks);
        Some(last / u64::from(self.per_gen))
    }

    /// Does generation `gen` write `block`?
    pub fn writes_block(&self, gen: u64, block: u64) -> bool {
        let w = u64::from(self.per_gen);
        if w >= self.blocks {
            return block < self.blocks;
        }
        let first = (gen * w) % self.blocks;
        (block + self.blocks - first) % self.blocks < w
    }

    /// The program.
    pub fn program(&self) -> Result<Vec<u8>, MicroError> {
        self.validate()?;
        let mut d = Driver::new(DEVICE_BASE, self.qd)?;
        d.init()?;
        let w = self.per_gen;
        let magic = MAGIC << 48;
        let a = d.a();
        let mut gen_loop = a.create_label();
        let mut w_loop = a.create_label();
        let mut have = a.create_label();
        a.xor(r10d, r10d).map_err(e)?;
        a.set_label(&mut gen_loop).map_err(e)?;
        a.xor(r11d, r11d).map_err(e)?;
        a.set_label(&mut w_loop).map_err(e)?;
        a.test(r12, r12).map_err(e)?;
        a.jnz(have).map_err(e)?;
        d.wait()?;
        let a = d.a();
        a.jmp(w_loop).map_err(e)?;
        a.set_label(&mut have).map_err(e)?;
        d.take()?;
        let a = d.a();
        // block = (gen * per_gen + j) mod blocks
        a.mov(rax, r10).map_err(e)?;
        a.imul_3(rax, rax, w as i32).map_err(e)?;
        a.add(rax, r11).map_err(e)?;
        a.xor(edx, edx).map_err(e)?;
        a.mov(rcx, self.blocks).map_err(e)?;
        a.div(rcx).map_err(e)?;
        a.push(r8).map_err(e)?;
        a.push(rdx).map_err(e)?;
        a.mov(rax, r10).map_err(e)?;
        a.shl(rax, 24).map_err(e)?;
        a.or(rax, rdx).map_err(e)?;
        a.mov(rcx, magic).map_err(e)?;
        a.or(rax, rcx).map_err(e)?;
        d.fill()?;
        let a = d.a();
        a.pop(rdx).map_err(e)?;
        a.pop(r8).map_err(e)?;
        a.shl(rdx, SECTORS.trailing_zeros()).map_err(e)?;
        a.mov(eax, T_OUT).map_err(e)?;
        d.post()?;
        let a = d.a();
        a.inc(r11).map_err(e)?;
        a.cmp(r11, w as i32).map_err(e)?;
        a.jb(w_loop).map_err(e)?;
        // Every write of the generation completed: flush it.
        d.drain()?;
        d.a().xor(edx, edx).map_err(e)?;
        d.request(T_FLUSH)?;
        let a = d.a();
        a.lea(rax, qword_ptr(r10 + 1)).map_err(e)?;
        a.mov(qword_ptr(rbx + FLUSHED as i32), rax).map_err(e)?;
        d.asm().report_reg(r10d)?;
        let a = d.a();
        a.inc(r10).map_err(e)?;
        let last = if self.gens == 0 { MAX_GENS } else { self.gens };
        a.mov(rax, last).map_err(e)?;
        a.cmp(r10, rax).map_err(e)?;
        a.jb(gen_loop).map_err(e)?;
        if self.verify {
            self.read_back(&mut d)?;
        }
        d.finish()
    }

    /// Reads every written block back and compares it with the pattern
    /// of the generation that wrote it last.
    fn read_back(&self, d: &mut Driver) -> Result<(), MicroError> {
        let n = self.writes(self.gens);
        let upto = self.blocks.min(n);
        let fail = d.fail(FAIL_VERIFY);
        let a = d.a();
        let mut top = a.create_label();
        let mut ok = a.create_label();
        a.xor(r10d, r10d).map_err(e)?;
        a.set_label(&mut top).map_err(e)?;
        // gen = (b + blocks * ((n - 1 - b) / blocks)) / per_gen
        a.mov(rax, n - 1).map_err(e)?;
        a.sub(rax, r10).map_err(e)?;
        a.xor(edx, edx).map_err(e)?;
        a.mov(rcx, self.blocks).map_err(e)?;
        a.div(rcx).map_err(e)?;
        a.imul_2(rax, rcx).map_err(e)?;
        a.add(rax, r10).map_err(e)?;
        a.xor(edx, edx).map_err(e)?;
        a.mov(ecx, self.per_gen).map_err(e)?;
        a.div(rcx).map_err(e)?;
        a.mov(r11, rax).map_err(e)?;
        a.mov(rdx, r10).map_err(e)?;
        a.shl(rdx, SECTORS.trailing_zeros()).map_err(e)?;
        d.request(T_IN)?;
        let a = d.a();
        a.mov(rax, r11).map_err(e)?;
        a.shl(rax, 24).map_err(e)?;
        a.or(rax, r10).map_err(e)?;
        a.mov(rcx, MAGIC << 48).map_err(e)?;
        a.or(rax, rcx).map_err(e)?;
        d.check()?;
        let a = d.a();
        a.test(eax, eax).map_err(e)?;
        a.jz(ok).map_err(e)?;
        a.mov(qword_ptr(rbx + LAST_STATUS as i32), r10).map_err(e)?;
        a.jmp(fail).map_err(e)?;
        a.set_label(&mut ok).map_err(e)?;
        a.inc(r10).map_err(e)?;
        a.mov(rax, upto).map_err(e)?;
        a.cmp(r10, rax).map_err(e)?;
        a.jb(top).map_err(e)
    }
}

/// What [`verify`] found in a good image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Blocks that had to hold a flushed write, and did.
    pub flushed_blocks: u64,
    /// Of those, blocks holding a later generation than the last flushed
    /// one that wrote them (written, not yet flushed).
    pub newer: u64,
    /// Blocks nothing flushed wrote, holding zeros or a later write.
    pub other: u64,
}

/// What [`verify`] found wrong, naming the first bad block.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// The image is smaller than the blocks written.
    #[error("the image has {len} bytes; the writer wrote {blocks} blocks of 4 KiB")]
    Short {
        /// Its length.
        len: u64,
        /// Blocks written.
        blocks: u64,
    },
    /// A flushed write is missing: the block is all zeros.
    #[error("block {block}: zeros, but generation {expected} wrote it and its flush completed")]
    Missing {
        /// The block.
        block: u64,
        /// The generation that wrote it last before the flush.
        expected: u64,
    },
    /// The block holds an older write than a flushed one.
    #[error(
        "block {block}: generation {found}, older than generation {expected} whose flush completed"
    )]
    Stale {
        /// The block.
        block: u64,
        /// What it holds.
        found: u64,
        /// What it must hold at least.
        expected: u64,
    },
    /// The block is not one whole write of the pattern (torn, foreign or
    /// garbage).
    #[error("block {block}: not a whole block of the pattern ({what})")]
    Corrupt {
        /// The block.
        block: u64,
        /// What is wrong.
        what: String,
    },
    /// The block holds a generation that never wrote it.
    #[error("block {block}: generation {found}, which does not write this block")]
    Foreign {
        /// The block.
        block: u64,
        /// What it holds.
        found: u64,
    },
}

/// Checks `image` after a run of `w` of which the first `flushed`
/// generations' flushes completed (see the module docs). Blocks beyond
/// those may hold zeros or any whole write of a later generation.
pub fn verify(image: &[u8], w: &Integrity, flushed: u64) -> Result<Verified, VerifyError> {
    if (image.len() as u64) < w.blocks * BLOCK_BYTES {
        return Err(VerifyError::Short {
            len: image.len() as u64,
            blocks: w.blocks,
        });
    }
    let mut out = Verified::default();
    for (b, block) in image
        .chunks_exact(BLOCK_BYTES as usize)
        .take(w.blocks as usize)
        .enumerate()
    {
        let b = b as u64;
        let expected = w.last_gen(b, flushed);
        let found = decode(b, block)?;
        match (expected, found) {
            (None, None) => out.other += 1,
            (Some(g), None) => {
                return Err(VerifyError::Missing {
                    block: b,
                    expected: g,
                })
            }
            (_, Some(f)) if !w.writes_block(f, b) => {
                return Err(VerifyError::Foreign { block: b, found: f })
            }
            (None, Some(_)) => out.other += 1,
            (Some(g), Some(f)) if f < g => {
                return Err(VerifyError::Stale {
                    block: b,
                    found: f,
                    expected: g,
                })
            }
            (Some(g), Some(f)) => {
                out.flushed_blocks += 1;
                out.newer += u64::from(f > g);
            }
        }
    }
    Ok(out)
}

/// [`verify`] of the image file at `path`.
pub fn verify_file(path: &Path, w: &Integrity, flushed: u64) -> Result<Verified, String> {
    let image = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    verify(&image, w, flushed).map_err(|e| format!("{}: {e}", path.display()))
}

/// The generation a block holds (`None`: all zeros), or why it is not a
/// whole block of the pattern for block `b`.
fn decode(b: u64, block: &[u8]) -> Result<Option<u64>, VerifyError> {
    let word = |k: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&block[k * 8..k * 8 + 8]);
        u64::from_le_bytes(x)
    };
    let w0 = word(0);
    if w0 == 0 && block.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let corrupt = |what: String| VerifyError::Corrupt { block: b, what };
    if w0 >> 48 != MAGIC {
        return Err(corrupt(format!("first word {w0:#018x} has no tag")));
    }
    if w0 & 0xff_ffff != b & 0xff_ffff {
        return Err(corrupt(format!("it is block {}'s data", w0 & 0xff_ffff)));
    }
    for k in 1..(BLOCK_BYTES / 8) as usize {
        let want = w0 ^ (k as u64).wrapping_mul(PATTERN_STEP);
        if word(k) != want {
            return Err(corrupt(format!(
                "word {k} is {:#018x}, not {want:#018x}: a torn or mixed write",
                word(k)
            )));
        }
    }
    Ok(Some((w0 >> 24) & 0xff_ffff))
}

/// Random 4 KiB requests at a queue depth, for ever (see the module
/// docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Iops {
    /// Blocks of the image the requests fall in (at least 1).
    pub blocks: u64,
    /// Requests in flight (1..=64).
    pub qd: u16,
    /// Writes instead of reads.
    pub write: bool,
    /// The random sequence's seed.
    pub seed: u64,
}

impl Iops {
    /// The program.
    pub fn program(&self) -> Result<Vec<u8>, MicroError> {
        if self.blocks == 0 {
            return Err(MicroError::Input(
                "the image holds no whole 4 KiB block".into(),
            ));
        }
        let mut d = Driver::new(DEVICE_BASE, self.qd)?;
        d.init()?;
        let a = d.a();
        let mut fill = a.create_label();
        let mut wait = a.create_label();
        a.mov(r10, self.seed | 1).map_err(e)?;
        a.set_label(&mut fill).map_err(e)?;
        a.test(r12, r12).map_err(e)?;
        a.jz(wait).map_err(e)?;
        d.take()?;
        let a = d.a();
        // a 64-bit LCG; the block from its high bits
        a.mov(rax, 6_364_136_223_846_793_005u64).map_err(e)?;
        a.imul_2(r10, rax).map_err(e)?;
        a.mov(rax, 1_442_695_040_888_963_407u64).map_err(e)?;
        a.add(r10, rax).map_err(e)?;
        a.mov(rax, r10).map_err(e)?;
        a.shr(rax, 33).map_err(e)?;
        a.xor(edx, edx).map_err(e)?;
        a.mov(rcx, self.blocks).map_err(e)?;
        a.div(rcx).map_err(e)?;
        a.shl(rdx, SECTORS.trailing_zeros()).map_err(e)?;
        a.mov(eax, if self.write { T_OUT } else { T_IN })
            .map_err(e)?;
        d.post()?;
        d.a().jmp(fill).map_err(e)?;
        d.a().set_label(&mut wait).map_err(e)?;
        d.wait()?;
        d.a().jmp(fill).map_err(e)?;
        d.finish()
    }
}

/// Ways a driver breaks the rules (see the module docs). Each must leave
/// the device in `NEEDS_RESET`, serving nothing until it is reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// A chain whose descriptors point at each other for ever.
    DescriptorLoop,
    /// A data buffer at an address with no guest memory.
    OutsideMemory,
    /// A data buffer 4 GiB long (the largest length a descriptor holds).
    FourGib,
    /// An indirect table whose only entry is an indirect table: itself.
    IndirectSelf,
    /// An available index further ahead than the queue holds: the used
    /// ring would overflow.
    UsedRingOverflow,
    /// A queue size of 3.
    QueueSizeNotPow2,
    /// A queue notification before `DRIVER_OK`.
    NotifyBeforeDriverOk,
    /// Rings at an address with no guest memory, then `DRIVER_OK`.
    RingsOutsideMemory,
}

/// An address in the identity map with nothing behind it (RAM ends below
/// it, the device window starts above).
const NOWHERE: u64 = 0x3000_0000;

impl Hostile {
    /// Every case.
    pub const ALL: [Hostile; 8] = [
        Hostile::DescriptorLoop,
        Hostile::OutsideMemory,
        Hostile::FourGib,
        Hostile::IndirectSelf,
        Hostile::UsedRingOverflow,
        Hostile::QueueSizeNotPow2,
        Hostile::NotifyBeforeDriverOk,
        Hostile::RingsOutsideMemory,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Hostile::DescriptorLoop => "descriptor-loop",
            Hostile::OutsideMemory => "outside-memory",
            Hostile::FourGib => "4gib-length",
            Hostile::IndirectSelf => "indirect-self",
            Hostile::UsedRingOverflow => "used-ring-overflow",
            Hostile::QueueSizeNotPow2 => "queue-size-3",
            Hostile::NotifyBeforeDriverOk => "notify-before-driver-ok",
            Hostile::RingsOutsideMemory => "rings-outside-memory",
        }
    }

    /// The program: the breach, a wait for `NEEDS_RESET` (`REPORT` of the
    /// status), a reset and one good read (`REPORT 1`), `DONE 0`.
    pub fn program(self) -> Result<Vec<u8>, MicroError> {
        use super::driver::status::*;
        let mut d = Driver::new(DEVICE_BASE, 1)?;
        let header = data(HDR);
        let status = data(STATUS_BYTES);
        match self {
            Hostile::QueueSizeNotPow2 => {
                d.begin(0)?;
                d.write_reg(reg::QUEUE_SELECT, 0, 2)?;
                d.write_reg(reg::QUEUE_SIZE, 3, 2)?;
            }
            Hostile::NotifyBeforeDriverOk => {
                d.begin(0)?;
                d.queue(QUEUE_SIZE)?;
                d.write_reg(reg::NOTIFY, 0, 2)?;
            }
            Hostile::RingsOutsideMemory => {
                d.begin(0)?;
                d.queue_at(QUEUE_SIZE, NOWHERE, data(super::driver::AVAIL), data(USED))?;
                d.write_reg(
                    reg::STATUS,
                    u32::from(ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK),
                    1,
                )?;
            }
            Hostile::DescriptorLoop => {
                d.init()?;
                desc(&mut d, 0, header, 16, F_NEXT, 1)?;
                desc(&mut d, 1, data(BUF), 4096, F_NEXT | F_WRITE, 0)?;
                publish(&mut d, 0, 1)?;
            }
            Hostile::OutsideMemory | Hostile::FourGib => {
                d.init()?;
                let (addr, len) = match self {
                    Hostile::OutsideMemory => (NOWHERE, 4096),
                    _ => (data(BUF), u32::MAX),
                };
                desc(&mut d, 0, header, 16, F_NEXT, 1)?;
                desc(&mut d, 1, addr, len, F_NEXT | F_WRITE, 2)?;
                desc(&mut d, 2, status, 1, F_WRITE, 0)?;
                publish(&mut d, 0, 1)?;
            }
            Hostile::IndirectSelf => {
                d.begin(1 << 28)?; // VIRTIO_F_INDIRECT_DESC
                d.queue(QUEUE_SIZE)?;
                d.driver_ok()?;
                let table = data(SCRATCH);
                desc(&mut d, 0, table, 32, F_INDIRECT, 0)?;
                desc_at(&mut d, table, table, 32, F_INDIRECT, 0)?;
                desc_at(&mut d, table + 16, 0, 0, 0, 0)?;
                publish(&mut d, 0, 1)?;
            }
            Hostile::UsedRingOverflow => {
                d.init()?;
                desc(&mut d, 0, header, 16, F_NEXT, 2)?;
                desc(&mut d, 2, status, 1, F_WRITE, 0)?;
                publish(&mut d, 0, QUEUE_SIZE + 40)?;
            }
        }
        // Wait for NEEDS_RESET: the configuration interrupt wakes the HLT.
        d.read_status()?;
        let a = d.a();
        let mut look = a.create_label();
        let mut got = a.create_label();
        a.set_label(&mut look).map_err(e)?;
        a.movzx(eax, byte_ptr(rbp + reg::STATUS)).map_err(e)?;
        a.test(eax, u32::from(NEEDS_RESET)).map_err(e)?;
        a.jnz(got).map_err(e)?;
        a.hlt().map_err(e)?;
        a.jmp(look).map_err(e)?;
        a.set_label(&mut got).map_err(e)?;
        a.mov(qword_ptr(rbx + LAST_STATUS as i32), rax).map_err(e)?;
        d.asm().report_reg(eax)?;
        // A reset brings it back.
        d.init()?;
        d.a().xor(edx, edx).map_err(e)?;
        d.request(T_IN)?;
        d.asm().report(1)?;
        d.finish()
    }
}

/// Descriptor `i` of the queue's table.
fn desc(
    d: &mut Driver,
    i: u16,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) -> Result<(), MicroError> {
    desc_at(d, data(DESC) + 16 * u64::from(i), addr, len, flags, next)
}

/// The descriptor at guest address `at`.
fn desc_at(
    d: &mut Driver,
    at: u64,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) -> Result<(), MicroError> {
    let a = d.a();
    a.mov(rcx, at).map_err(e)?;
    a.mov(rax, addr).map_err(e)?;
    a.mov(qword_ptr(rcx), rax).map_err(e)?;
    a.mov(dword_ptr(rcx + 8), len).map_err(e)?;
    a.mov(
        dword_ptr(rcx + 12),
        u32::from(flags) | u32::from(next) << 16,
    )
    .map_err(e)
}

/// Puts `head` in the available ring's first entry, sets the available
/// index to `idx` and notifies.
fn publish(d: &mut Driver, head: u16, idx: u16) -> Result<(), MicroError> {
    let avail = super::driver::AVAIL as i32;
    let a = d.a();
    a.mov(word_ptr(rbx + (avail + 4)), u32::from(head))
        .map_err(e)?;
    a.mov(word_ptr(rbx + (avail + 2)), u32::from(idx))
        .map_err(e)?;
    d.write_reg(reg::NOTIFY, 0, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image a run of `w` leaves after `gens` generations, every
    /// write landed.
    fn written(w: &Integrity, gens: u64) -> Vec<u8> {
        let mut img = vec![0u8; (w.blocks * BLOCK_BYTES) as usize];
        for n in 0..w.writes(gens) {
            let b = n % w.blocks;
            let g = n / u64::from(w.per_gen);
            let off = (b * BLOCK_BYTES) as usize;
            img[off..off + BLOCK_BYTES as usize].copy_from_slice(&pattern(b, g));
        }
        img
    }

    fn w() -> Integrity {
        Integrity {
            blocks: 50,
            per_gen: 7,
            gens: 0,
            qd: 4,
            verify: false,
        }
    }

    #[test]
    fn last_gen_and_writes_block_agree_with_the_writes() {
        let w = w();
        for gens in [0, 1, 3, 8, 20] {
            let mut last = vec![None; 50];
            for n in 0..w.writes(gens) {
                last[(n % 50) as usize] = Some(n / 7);
            }
            for b in 0..50 {
                assert_eq!(
                    w.last_gen(b, gens),
                    last[b as usize],
                    "block {b} gens {gens}"
                );
            }
        }
        for g in 0..20u64 {
            for b in 0..50u64 {
                let by_writes = (g * 7..g * 7 + 7).any(|n| n % 50 == b);
                assert_eq!(w.writes_block(g, b), by_writes, "gen {g} block {b}");
            }
        }
    }

    #[test]
    fn a_good_image_passes_also_with_later_writes_landed() {
        let w = w();
        let img = written(&w, 12);
        let v = verify(&img, &w, 12).unwrap();
        assert_eq!(v.flushed_blocks, 50);
        assert_eq!(v.newer, 0);
        // Generations 10 and 11 landed but only 10 were flushed.
        let v = verify(&img, &w, 10).unwrap();
        assert!(v.newer > 0);
        // Only part of the disk written: the rest is zeros.
        let v = verify(&written(&w, 3), &w, 3).unwrap();
        assert_eq!((v.flushed_blocks, v.other), (21, 29));
    }

    #[test]
    fn every_kind_of_damage_is_caught() {
        let w = w();
        let mut img = written(&w, 12);
        let blk = |b: u64| (b * BLOCK_BYTES) as usize..((b + 1) * BLOCK_BYTES) as usize;
        // a flushed write lost: the block goes back to an older generation
        let gen = w.last_gen(5, 12).unwrap();
        let mut stale = img.clone();
        let older = (0..gen).rev().find(|&g| w.writes_block(g, 5)).unwrap();
        stale[blk(5)].copy_from_slice(&pattern(5, older));
        assert_eq!(
            verify(&stale, &w, 12),
            Err(VerifyError::Stale {
                block: 5,
                found: older,
                expected: gen
            })
        );
        // zeros where a flushed write belongs
        let mut zero = img.clone();
        zero[blk(9)].fill(0);
        assert!(matches!(
            verify(&zero, &w, 12),
            Err(VerifyError::Missing { block: 9, .. })
        ));
        // a torn write: half of one sector from another generation
        let mut torn = img.clone();
        let other = pattern(3, older);
        torn[blk(3).start + 1024..blk(3).start + 1280].copy_from_slice(&other[1024..1280]);
        assert!(matches!(
            verify(&torn, &w, 12),
            Err(VerifyError::Corrupt { block: 3, .. })
        ));
        // a write that went to the wrong block
        let mut moved = img.clone();
        let eleven = pattern(11, w.last_gen(11, 12).unwrap());
        moved[blk(12)].copy_from_slice(&eleven);
        assert!(matches!(
            verify(&moved, &w, 12),
            Err(VerifyError::Corrupt { block: 12, .. })
        ));
        // a single flipped bit
        img[blk(40).start + 4000] ^= 1;
        assert!(matches!(
            verify(&img, &w, 12),
            Err(VerifyError::Corrupt { block: 40, .. })
        ));
        // too short
        assert!(matches!(
            verify(&img[..4096], &w, 12),
            Err(VerifyError::Short { .. })
        ));
    }

    #[test]
    fn the_programs_assemble() {
        let mut w = w();
        w.gens = 3;
        w.verify = true;
        if let Err(e) = w.program() {
            panic!("{e}");
        }
        for qd in [1, 32, 64] {
            let p = Iops {
                blocks: 100,
                qd,
                write: false,
                seed: 1,
            };
            assert!(p.program().is_ok());
        }
        for h in Hostile::ALL {
            assert!(h.program().is_ok(), "{}", h.name());
        }
        assert!(Iops {
            blocks: 100,
            qd: 65,
            write: false,
            seed: 1
        }
        .program()
        .is_err());
        w.gens = 0;
        assert!(
            w.validate().is_err(),
            "read-back without a generation count"
        );
    }
}
