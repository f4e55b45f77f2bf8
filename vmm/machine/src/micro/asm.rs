//! Writing micro-guests: a thin layer over iced-x86's assembler
//! ([`CodeAssembler`], 64-bit) with one method per interface operation,
//! and [`Script`], a per-vCPU list of operations for tests and demos.
//!
//! Conventions of generated code (see [`super`] for the machine):
//! * `RBX` holds [`DATA_ADDR`](super::DATA_ADDR), the shared data area;
//!   `RDI` the vCPU's index, `RSI` the number of vCPUs; generated helpers
//!   keep all three.
//! * `RAX` and `RCX` are scratch: every helper may clobber them.
//! * A program that draws its steps ([`GuestAsm::seed_steps`],
//!   [`GuestAsm::compute_step`]) keeps the generator's state in `R15`, and
//!   `compute_step` clobbers `RDX` as well.

use iced_x86::code_asm::*;

use super::proto::{PORT_DONE, PORT_REPORT, PORT_SLEEP, PORT_WAKE, PORT_YIELD};
use super::{MicroError, CODE_ADDR, CODE_MAX};

/// A micro-guest program being written.
pub struct GuestAsm {
    a: CodeAssembler,
}

fn asm_err(e: IcedError) -> MicroError {
    MicroError::Assemble(e.to_string())
}

impl GuestAsm {
    /// An empty 64-bit program.
    pub fn new() -> Result<Self, MicroError> {
        Ok(Self {
            a: CodeAssembler::new(64).map_err(asm_err)?,
        })
    }

    /// The assembler itself, for anything the helpers do not cover.
    pub fn raw(&mut self) -> &mut CodeAssembler {
        &mut self.a
    }

    /// A new label.
    pub fn label(&mut self) -> CodeLabel {
        self.a.create_label()
    }

    /// Binds `l` to the next instruction.
    pub fn bind(&mut self, l: &mut CodeLabel) -> Result<(), MicroError> {
        self.a.set_label(l).map_err(asm_err)
    }

    /// Computes for `iters` iterations of a two-instruction loop
    /// (`dec rcx; jnz`); nothing for 0.
    pub fn compute(&mut self, iters: u64) -> Result<(), MicroError> {
        if iters == 0 {
            return Ok(());
        }
        self.a.mov(rcx, iters).map_err(asm_err)?;
        self.compute_rcx()
    }

    /// Seeds the step generator ([`GuestAsm::compute_step`]) in `R15`
    /// from `seed` and the vCPU's index (`RDI`), so that every vCPU of
    /// every VM given its own `seed` draws its own sequence. Clobbers
    /// `RAX` and `RCX`.
    pub fn seed_steps(&mut self, seed: u64) -> Result<(), MicroError> {
        let a = &mut self.a;
        a.mov(r15, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .map_err(asm_err)?;
        a.mov(rax, rdi).map_err(asm_err)?;
        a.mov(rcx, 0xBF58_476D_1CE4_E5B9u64).map_err(asm_err)?;
        a.imul_2(rax, rcx).map_err(asm_err)?;
        a.xor(r15, rax).map_err(asm_err)?;
        // xorshift's state must not be 0
        a.or(r15, 1).map_err(asm_err)
    }

    /// Computes one step of a workload whose steps take `mean` iterations
    /// on average: `lo + x mod span` iterations, `(lo, span)` the
    /// workloads' shared rule
    /// ([`vcpu_sched::workload::defs::step_range`]) and `x` the next
    /// value of a xorshift64 generator (Marsaglia 2003: shifts 13, 7, 17)
    /// in `R15` ([`GuestAsm::seed_steps`] first). Clobbers `RAX`, `RCX`
    /// and `RDX`.
    pub fn compute_step(&mut self, mean: u64) -> Result<(), MicroError> {
        self.draw_step(mean)?;
        self.compute_rcx()
    }

    /// The draw of [`GuestAsm::compute_step`] alone: leaves the step's
    /// iterations (at least 1) in `RCX`. Clobbers `RAX` and `RDX`.
    pub fn draw_step(&mut self, mean: u64) -> Result<(), MicroError> {
        let (lo, span) = vcpu_sched::workload::defs::step_range(mean);
        let a = &mut self.a;
        for (left, k) in [(true, 13u32), (false, 7), (true, 17)] {
            a.mov(rax, r15).map_err(asm_err)?;
            if left {
                a.shl(rax, k).map_err(asm_err)?;
            } else {
                a.shr(rax, k).map_err(asm_err)?;
            }
            a.xor(r15, rax).map_err(asm_err)?;
        }
        a.mov(rax, r15).map_err(asm_err)?;
        a.xor(edx, edx).map_err(asm_err)?;
        a.mov(rcx, span).map_err(asm_err)?;
        a.div(rcx).map_err(asm_err)?;
        a.mov(rcx, lo).map_err(asm_err)?;
        a.add(rcx, rdx).map_err(asm_err)?;
        // at least one iteration (`compute_rcx` needs RCX > 0): 0 - 1
        // borrows, so the carry adds 1 to a 0 and nothing to the rest
        a.cmp(rcx, 1).map_err(asm_err)?;
        a.adc(rcx, 0).map_err(asm_err)
    }

    /// Computes for `RCX` iterations (at least one: the caller makes sure
    /// `RCX` is not 0).
    pub fn compute_rcx(&mut self) -> Result<(), MicroError> {
        let mut l = self.a.create_label();
        self.a.set_label(&mut l).map_err(asm_err)?;
        self.a.dec(rcx).map_err(asm_err)?;
        self.a.jnz(l).map_err(asm_err)
    }

    fn out_eax(&mut self, port: u16) -> Result<(), MicroError> {
        self.a.out(port as u32, eax).map_err(asm_err)
    }

    fn out_imm(&mut self, port: u16, v: u32) -> Result<(), MicroError> {
        self.a.mov(eax, v).map_err(asm_err)?;
        self.out_eax(port)
    }

    /// `REPORT v`.
    pub fn report(&mut self, v: u32) -> Result<(), MicroError> {
        self.out_imm(PORT_REPORT, v)
    }

    /// `REPORT` of a register's low 32 bits.
    pub fn report_reg(&mut self, r: AsmRegister32) -> Result<(), MicroError> {
        if r != eax {
            self.a.mov(eax, r).map_err(asm_err)?;
        }
        self.out_eax(PORT_REPORT)
    }

    /// `WAKE k`.
    pub fn wake(&mut self, k: u32) -> Result<(), MicroError> {
        self.out_imm(PORT_WAKE, k)
    }

    /// `WAKE` of the vCPU whose index is in `r`.
    pub fn wake_reg(&mut self, r: AsmRegister32) -> Result<(), MicroError> {
        if r != eax {
            self.a.mov(eax, r).map_err(asm_err)?;
        }
        self.out_eax(PORT_WAKE)
    }

    /// `SLEEP ns`.
    pub fn sleep_ns(&mut self, ns: u32) -> Result<(), MicroError> {
        self.out_imm(PORT_SLEEP, ns)
    }

    /// `SLEEP` for the nanoseconds in `r`.
    pub fn sleep_reg(&mut self, r: AsmRegister32) -> Result<(), MicroError> {
        if r != eax {
            self.a.mov(eax, r).map_err(asm_err)?;
        }
        self.out_eax(PORT_SLEEP)
    }

    /// `YIELD`.
    pub fn yield_now(&mut self) -> Result<(), MicroError> {
        self.out_imm(PORT_YIELD, 0)
    }

    /// `HLT`: wait until woken.
    pub fn wait(&mut self) -> Result<(), MicroError> {
        self.a.hlt().map_err(asm_err)
    }

    /// `DONE code`, then (should the VMM ever resume the vCPU) an `HLT`
    /// loop.
    pub fn done(&mut self, code: u32) -> Result<(), MicroError> {
        self.out_imm(PORT_DONE, code)?;
        let mut l = self.a.create_label();
        self.a.set_label(&mut l).map_err(asm_err)?;
        self.a.hlt().map_err(asm_err)?;
        self.a.jmp(l).map_err(asm_err)
    }

    /// Assembles at [`CODE_ADDR`].
    pub fn finish(mut self) -> Result<Vec<u8>, MicroError> {
        let code = self.a.assemble(CODE_ADDR).map_err(asm_err)?;
        if code.len() as u64 > CODE_MAX {
            return Err(MicroError::Assemble(format!(
                "the program is {} bytes; at most {CODE_MAX} fit",
                code.len()
            )));
        }
        Ok(code)
    }
}

/// One step of a [`Script`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Compute for this many loop iterations.
    Compute(u64),
    /// `REPORT v`.
    Report(u32),
    /// `WAKE k`.
    Wake(u32),
    /// `SLEEP ns`.
    Sleep(u32),
    /// `YIELD`.
    Yield,
    /// `HLT` once.
    Wait,
    /// `DONE code` (ends the vCPU's script).
    Done(u32),
    /// Any port write, of 1, 2 or 4 bytes (to test the VMM's checks).
    Out {
        /// The port.
        port: u16,
        /// The value.
        value: u32,
        /// 1, 2 or 4.
        size: u8,
    },
    /// A read from a port (always an error).
    In(u16),
    /// A 32-bit store to a guest-physical address.
    Store {
        /// The address.
        addr: u64,
        /// The value.
        value: u32,
    },
    /// `ud2` with no IDT: #UD, #DF, then a triple fault.
    Crash,
    /// Spin forever without exits (only a kick gets the vCPU out).
    Spin,
}

/// A program given as one list of operations per vCPU; vCPUs without a
/// list of their own run `others`. A list that does not end in `Done`,
/// `Crash` or `Spin` gets `Done(0)`.
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// Lists by vCPU index.
    pub vcpus: Vec<Vec<Op>>,
    /// The list of every other vCPU.
    pub others: Vec<Op>,
}

impl Script {
    /// Assembles the script.
    pub fn assemble(&self) -> Result<Vec<u8>, MicroError> {
        let mut g = GuestAsm::new()?;
        let mut labels: Vec<CodeLabel> = (0..self.vcpus.len()).map(|_| g.label()).collect();
        for (i, l) in labels.iter().enumerate() {
            g.raw().cmp(edi, i as u32).map_err(asm_err)?;
            g.raw().je(*l).map_err(asm_err)?;
        }
        emit_ops(&mut g, &self.others)?;
        for (ops, l) in self.vcpus.iter().zip(labels.iter_mut()) {
            g.bind(l)?;
            emit_ops(&mut g, ops)?;
        }
        g.finish()
    }
}

fn emit_ops(g: &mut GuestAsm, ops: &[Op]) -> Result<(), MicroError> {
    for op in ops {
        match op {
            Op::Compute(n) => g.compute(*n)?,
            Op::Report(v) => g.report(*v)?,
            Op::Wake(k) => g.wake(*k)?,
            Op::Sleep(ns) => g.sleep_ns(*ns)?,
            Op::Yield => g.yield_now()?,
            Op::Wait => g.wait()?,
            Op::Done(c) => return g.done(*c),
            Op::Out { port, value, size } => {
                g.raw().mov(eax, *value).map_err(asm_err)?;
                g.raw().mov(dx, *port as u32).map_err(asm_err)?;
                match size {
                    1 => g.raw().out(dx, al),
                    2 => g.raw().out(dx, ax),
                    _ => g.raw().out(dx, eax),
                }
                .map_err(asm_err)?;
            }
            Op::In(port) => {
                g.raw().mov(dx, *port as u32).map_err(asm_err)?;
                g.raw().in_(eax, dx).map_err(asm_err)?;
            }
            Op::Store { addr, value } => {
                g.raw().mov(rcx, *addr).map_err(asm_err)?;
                g.raw().mov(dword_ptr(rcx), *value).map_err(asm_err)?;
            }
            Op::Crash => {
                return g.raw().ud2().map_err(asm_err);
            }
            Op::Spin => {
                let mut l = g.label();
                g.bind(&mut l)?;
                return g.raw().jmp(l).map_err(asm_err);
            }
        }
    }
    g.done(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    fn mnemonics(code: &[u8]) -> Vec<Mnemonic> {
        let mut d = Decoder::with_ip(64, code, CODE_ADDR, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode().mnemonic());
        }
        v
    }

    #[test]
    fn helpers_emit_the_documented_instructions() {
        let mut g = GuestAsm::new().unwrap();
        g.compute(5).unwrap();
        g.report(1).unwrap();
        g.wait().unwrap();
        g.done(0).unwrap();
        let code = g.finish().unwrap();
        use Mnemonic::*;
        assert_eq!(
            mnemonics(&code),
            vec![Mov, Dec, Jne, Mov, Out, Hlt, Mov, Out, Hlt, Jmp]
        );
        // out imm8, eax: E7 ib
        let mut g = GuestAsm::new().unwrap();
        g.wake(3).unwrap();
        let code = g.finish().unwrap();
        assert_eq!(&code[code.len() - 2..], &[0xe7, 0xe1]);
    }

    #[test]
    fn scripts_dispatch_on_the_vcpu_index() {
        let s = Script {
            vcpus: vec![vec![Op::Report(1)], vec![Op::Wait]],
            others: vec![Op::Spin],
        };
        let code = s.assemble().unwrap();
        let m = mnemonics(&code);
        assert_eq!(m.iter().filter(|&&x| x == Mnemonic::Cmp).count(), 2);
        assert!(m.contains(&Mnemonic::Hlt));
    }
}
