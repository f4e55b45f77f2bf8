//! The seeds' workloads as micro-guest programs (see `docs/micro-guests.md`
//! for the machine and the port interface). Each VM runs one program on
//! all its vCPUs; `RDI` is the vCPU's index, `RSI` the VM's vCPU count,
//! `RBX` the shared data area. Counters the VMM reads live in that area,
//! each on its own 128-byte block, and are only ever increased, so the
//! VMM can read them at any time.
//!
//! Every step's compute is drawn by the workloads' shared rule
//! (`vcpu_sched::workload::defs::step`: uniform within +-25% of the mean)
//! from a generator seeded by the program's `seed` and the vCPU's index
//! (`GuestAsm::seed_steps`, `compute_step`), as the thread workloads and
//! the simulator draw theirs; `RDX` and `R15` are the generator's.
//!
//! Every wait is "check the condition, then `HLT`, then check again", and
//! every publish is a `lock`ed write before the doorbell, so a doorbell is
//! never lost (wakes are remembered one deep) and a spurious return from
//! `HLT` is harmless.

use iced_x86::code_asm::*;

use vmm_machine::micro::asm::GuestAsm;
use vmm_machine::micro::proto::PORT_WAKE;
use vmm_machine::micro::MicroError;

fn e(x: IcedError) -> MicroError {
    MicroError::Assemble(x.to_string())
}

/// Bytes between two counters of the data area.
pub const BLOCK: u64 = 128;

/// `cyclic`: every vCPU sleeps `period_ns`, computes a step of `iters`,
/// again. The VMM measures how late each vCPU runs after its timer
/// (wakeup latency).
pub fn cyclic(period_ns: u32, iters: u64, seed: u64) -> Result<Vec<u8>, MicroError> {
    let mut g = GuestAsm::new()?;
    g.seed_steps(seed)?;
    let mut top = g.label();
    g.bind(&mut top)?;
    g.sleep_ns(period_ns.max(1))?;
    g.compute_step(iters)?;
    g.raw().jmp(top).map_err(e)?;
    g.finish()
}

/// Points `R8` at the block of the vCPU's pair (2p and 2p+1 share block
/// `p` of the data area) and puts the partner's index in `R10`; uses
/// `R9`.
fn pair_regs(a: &mut CodeAssembler) -> Result<(), MicroError> {
    a.mov(r9, rdi).map_err(e)?;
    a.shr(r9, 1).map_err(e)?;
    a.shl(r9, BLOCK.trailing_zeros()).map_err(e)?;
    a.lea(r8, qword_ptr(rbx + r9)).map_err(e)?;
    a.mov(r10d, edi).map_err(e)?;
    a.xor(r10d, 1).map_err(e)
}

/// Offset of pair `p`'s `produced` counter (its `consumed` is 64 bytes on).
pub fn pipe_offset(p: u64) -> u64 {
    p * BLOCK
}

/// Messages a pipe holds.
pub const PIPE: u32 = 16;

/// `messaging`: vCPUs in sender/receiver pairs (2p sends to 2p+1) through
/// a pipe of [`PIPE`] messages in shared memory. A full pipe halts the
/// sender, an empty one the receiver; each message rings the partner's
/// doorbell, as a pipe write or read wakes the other side in hackbench.
/// Both sides compute a step of `iters` per message: the sender before
/// it writes, the receiver after it reads.
pub fn messaging(iters: u64, seed: u64) -> Result<Vec<u8>, MicroError> {
    let mut g = GuestAsm::new()?;
    g.seed_steps(seed)?;
    let a = g.raw();
    // r8 = &pipe[rdi / 2]; r10 = partner
    pair_regs(a)?;
    let mut receiver = a.create_label();
    a.test(edi, 1).map_err(e)?;
    a.jnz(receiver).map_err(e)?;
    // Sender.
    let mut s_check = a.create_label();
    let mut s_send = a.create_label();
    a.set_label(&mut s_check).map_err(e)?;
    a.mov(rax, qword_ptr(r8)).map_err(e)?;
    a.sub(rax, qword_ptr(r8 + 64)).map_err(e)?;
    a.cmp(rax, PIPE as i32).map_err(e)?;
    a.jb(s_send).map_err(e)?;
    a.hlt().map_err(e)?;
    a.jmp(s_check).map_err(e)?;
    a.set_label(&mut s_send).map_err(e)?;
    g.compute_step(iters)?;
    let a = g.raw();
    a.lock().inc(qword_ptr(r8)).map_err(e)?;
    a.mov(eax, r10d).map_err(e)?;
    a.out(PORT_WAKE as u32, eax).map_err(e)?;
    a.jmp(s_check).map_err(e)?;
    // Receiver.
    let mut r_recv = a.create_label();
    a.set_label(&mut receiver).map_err(e)?;
    let r_check = receiver;
    a.mov(rax, qword_ptr(r8)).map_err(e)?;
    a.cmp(rax, qword_ptr(r8 + 64)).map_err(e)?;
    a.jne(r_recv).map_err(e)?;
    a.hlt().map_err(e)?;
    a.jmp(r_check).map_err(e)?;
    a.set_label(&mut r_recv).map_err(e)?;
    a.lock().inc(qword_ptr(r8 + 64)).map_err(e)?;
    g.compute_step(iters)?;
    let a = g.raw();
    a.mov(eax, r10d).map_err(e)?;
    a.out(PORT_WAKE as u32, eax).map_err(e)?;
    a.jmp(r_check).map_err(e)?;
    g.finish()
}

/// Offset of the `runq` round counter (requests completed, in units of
/// one worker's answer).
pub const RUNQ_ANSWERS: u64 = BLOCK;

/// `runq`: vCPU 0 is the message thread, the others its workers (like
/// schbench). A round: vCPU 0 clears the answer count and rings every
/// worker; each worker computes a step of `iters`, counts its answer,
/// and the last one rings vCPU 0, which starts the next round. Every
/// request is a doorbell, a short run and a halt. Needs at least 2 vCPUs.
pub fn runq(iters: u64, seed: u64) -> Result<Vec<u8>, MicroError> {
    let mut g = GuestAsm::new()?;
    g.seed_steps(seed)?;
    let mut worker = g.label();
    g.raw().test(edi, edi).map_err(e)?;
    g.raw().jnz(worker).map_err(e)?;
    {
        let a = g.raw();
        let mut round = a.create_label();
        let mut wl = a.create_label();
        let mut wait = a.create_label();
        a.set_label(&mut round).map_err(e)?;
        a.mov(qword_ptr(rbx), 0).map_err(e)?;
        a.mov(r9d, 1).map_err(e)?;
        a.set_label(&mut wl).map_err(e)?;
        a.mov(eax, r9d).map_err(e)?;
        a.out(PORT_WAKE as u32, eax).map_err(e)?;
        a.inc(r9d).map_err(e)?;
        a.cmp(r9d, esi).map_err(e)?;
        a.jb(wl).map_err(e)?;
        a.set_label(&mut wait).map_err(e)?;
        a.lea(rcx, qword_ptr(rsi - 1)).map_err(e)?;
        a.cmp(qword_ptr(rbx), rcx).map_err(e)?;
        a.jae(round).map_err(e)?;
        a.hlt().map_err(e)?;
        a.jmp(wait).map_err(e)?;
    }
    g.bind(&mut worker)?;
    g.wait()?;
    g.compute_step(iters)?;
    let a = g.raw();
    a.lock().inc(qword_ptr(rbx + RUNQ_ANSWERS)).map_err(e)?;
    a.mov(eax, 1).map_err(e)?;
    a.lock().xadd(qword_ptr(rbx), rax).map_err(e)?;
    a.lea(rcx, qword_ptr(rsi - 2)).map_err(e)?;
    a.cmp(rax, rcx).map_err(e)?;
    a.jne(worker).map_err(e)?;
    a.mov(eax, 0).map_err(e)?;
    a.out(PORT_WAKE as u32, eax).map_err(e)?;
    a.jmp(worker).map_err(e)?;
    g.finish()
}

/// Offset of pair `p`'s `turn` word (its handoff counter is 64 bytes on).
pub fn pair_offset(p: u64) -> u64 {
    p * BLOCK
}

/// Offset of a pair's handoff counter within its block.
pub const HANDOFFS: u64 = 64;

/// `pingpong`: vCPUs in pairs (2p and 2p+1) handing one token back and
/// forth, as `vcpu_sched::workload::pingpong` defines it for threads and
/// the simulator. The pair's `turn` word names the side holding the token
/// (0: the even vCPU, which starts). The holder computes a step of
/// `iters`, counts
/// a handoff, passes the token (a `lock`ed exchange) and rings its
/// partner, then halts until the token comes back. Every handoff is a
/// doorbell to a halted vCPU. Needs an even vCPU count.
pub fn pingpong(iters: u64, seed: u64) -> Result<Vec<u8>, MicroError> {
    let mut g = GuestAsm::new()?;
    g.seed_steps(seed)?;
    let a = g.raw();
    // r8 = &pair[rdi / 2]; r10 = partner; r11 = my side (0 or 1)
    pair_regs(a)?;
    a.mov(r11d, edi).map_err(e)?;
    a.and(r11d, 1).map_err(e)?;
    let mut wait = a.create_label();
    let mut go = a.create_label();
    a.set_label(&mut wait).map_err(e)?;
    a.cmp(qword_ptr(r8), r11).map_err(e)?;
    a.je(go).map_err(e)?;
    a.hlt().map_err(e)?;
    a.jmp(wait).map_err(e)?;
    a.set_label(&mut go).map_err(e)?;
    g.compute_step(iters)?;
    let a = g.raw();
    a.lock().inc(qword_ptr(r8 + HANDOFFS)).map_err(e)?;
    a.mov(rax, r11).map_err(e)?;
    a.xor(eax, 1).map_err(e)?;
    a.xchg(qword_ptr(r8), rax).map_err(e)?;
    a.mov(eax, r10d).map_err(e)?;
    a.out(PORT_WAKE as u32, eax).map_err(e)?;
    a.jmp(wait).map_err(e)?;
    g.finish()
}

/// Offset of the transcode frame counter.
pub const FRAMES: u64 = BLOCK;

/// `transcode`: a frame is one step of `iters` on every vCPU of the VM;
/// the last vCPU to finish counts the frame and rings the others, which
/// halt until the frame number changes.
pub fn transcode(iters: u64, seed: u64) -> Result<Vec<u8>, MicroError> {
    let mut g = GuestAsm::new()?;
    g.seed_steps(seed)?;
    let mut top = g.label();
    g.bind(&mut top)?;
    g.raw().mov(r12, qword_ptr(rbx + FRAMES)).map_err(e)?;
    g.compute_step(iters)?;
    let a = g.raw();
    let mut waitf = a.create_label();
    let mut wl = a.create_label();
    let mut skip = a.create_label();
    a.mov(eax, 1).map_err(e)?;
    a.lock().xadd(qword_ptr(rbx), rax).map_err(e)?;
    a.lea(rcx, qword_ptr(rsi - 1)).map_err(e)?;
    a.cmp(rax, rcx).map_err(e)?;
    a.jne(waitf).map_err(e)?;
    // The last one: reset, next frame, ring the others.
    a.mov(qword_ptr(rbx), 0).map_err(e)?;
    a.lock().inc(qword_ptr(rbx + FRAMES)).map_err(e)?;
    a.xor(r9d, r9d).map_err(e)?;
    a.set_label(&mut wl).map_err(e)?;
    a.cmp(r9d, edi).map_err(e)?;
    a.je(skip).map_err(e)?;
    a.mov(eax, r9d).map_err(e)?;
    a.out(PORT_WAKE as u32, eax).map_err(e)?;
    a.set_label(&mut skip).map_err(e)?;
    a.inc(r9d).map_err(e)?;
    a.cmp(r9d, esi).map_err(e)?;
    a.jb(wl).map_err(e)?;
    a.jmp(top).map_err(e)?;
    a.set_label(&mut waitf).map_err(e)?;
    a.cmp(qword_ptr(rbx + FRAMES), r12).map_err(e)?;
    a.jne(top).map_err(e)?;
    a.hlt().map_err(e)?;
    a.jmp(waitf).map_err(e)?;
    g.finish()
}

/// A program that computes `iters` and ends (for calibration).
pub fn compute_once(iters: u64) -> Result<Vec<u8>, MicroError> {
    let mut g = GuestAsm::new()?;
    g.compute(iters)?;
    g.done(0)?;
    g.finish()
}
