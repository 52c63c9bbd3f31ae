//! Classic BPF (cBPF): the checker and interpreter for capture filters.
//!
//! A capture tool compiles a tcpdump-style filter with libpcap (`pcap_compile`) and sends the
//! instructions to a running app. They cross a trust boundary, so [`Program::new`] checks them
//! as strictly as the Linux kernel does for `SO_ATTACH_FILTER` (`net/core/filter.c`), and
//! [`Program::run`] never panics and always terminates.
//!
//! Accepted (the kernel's `chk_code_allowed` table, 49 opcodes; anything else, including any
//! code above `0xff`, is [`BpfError::BadOpcode`]):
//! - `LD`: `W|IMM`, `W|LEN`, `W|MEM`, and `W`/`H`/`B` with `ABS` or `IND`;
//! - `LDX`: `W|IMM`, `W|LEN`, `W|MEM`, `B|MSH`;
//! - `ST`, `STX`; `MISC`: `TAX`, `TXA`; `RET`: `K`, `A`;
//! - `ALU`: `ADD SUB MUL DIV MOD AND OR XOR LSH RSH` with `K` or `X`, and `NEG`;
//! - `JMP`: `JA`, and `JEQ JGT JGE JSET` with `K` or `X`.
//!
//! Rejected, besides unknown opcodes (the rules of the kernel's `bpf_check_basics_ok`,
//! `bpf_check_classic` and `check_load_and_stores`):
//! - an empty program, or one longer than [`MAX_INSNS`] (`BPF_MAXINSNS`);
//! - division or modulo by a constant 0, a constant shift by 32 or more;
//! - a scratch index `M[k]` with `k >= 16` (`BPF_MEMWORDS`);
//! - a jump (`JA k`, or a conditional's `jt`/`jf`) past the last instruction. Offsets are
//!   unsigned and relative to the next instruction, so every jump goes forward;
//! - a last instruction that is not a `RET`. With forward jumps only, every path ends in one;
//! - a load of `M[k]` that some path reaches without a store to `M[k]`. Like the kernel, the
//!   check is one forward pass in which the state after a `RET` also flows into the next
//!   instruction, so it is never less strict than the kernel's.
//!
//! Stricter than the kernel: packet loads (`ABS`, `IND`, `MSH`) with `k >= 0x8000_0000` are
//! [`BpfError::AncillaryLoad`]. Those are the kernel's ancillary loads (`SKF_AD_OFF`, protocol,
//! VLAN tag, ...) and negative offsets (`SKF_NET_OFF`, `SKF_LL_OFF`). We have no socket buffer
//! to take them from, and libpcap does not emit them for Ethernet filters.
//!
//! Running: `A`, `X` and `M[0..16]` are `u32`s, zero at the start. Packet loads are big-endian.
//! A load that does not fit in the captured bytes makes the program return 0 (reject), as in
//! the kernel and in libpcap's `bpf_filter`. `IND` offsets are `X + k` without wrap-around.
//! Division or modulo by `X == 0` returns 0. A shift by `X >= 32` gives 0 (libpcap's rule;
//! in C the result is undefined). `LEN` loads the frame's length on the wire.

/// Longest program accepted, in instructions (the kernel's `BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;
/// Scratch memory words `M[0..16]` (`BPF_MEMWORDS`).
pub const MEM_WORDS: usize = 16;
/// Snap length returned by [`Program::accept_all`]: libpcap's largest snapshot length.
pub const ACCEPT_ALL_SNAPLEN: u32 = 262_144;
/// Packet offsets from here up are ancillary loads or negative offsets (`SKF_*_OFF`).
const FIRST_ANCILLARY_K: u32 = 0x8000_0000;

/// Opcode fields (`<linux/filter.h>`, libpcap's `pcap/bpf.h`). An opcode is
/// `class | size | mode` for loads, `class | op | source` for ALU and jumps, `RET | K` or
/// `RET | A`, `MISC | TAX` or `MISC | TXA`.
pub mod code {
    /// Class: load into A.
    pub const LD: u16 = 0x00;
    /// Class: load into X.
    pub const LDX: u16 = 0x01;
    /// Class: store A into `M[k]`.
    pub const ST: u16 = 0x02;
    /// Class: store X into `M[k]`.
    pub const STX: u16 = 0x03;
    /// Class: arithmetic on A.
    pub const ALU: u16 = 0x04;
    /// Class: jumps.
    pub const JMP: u16 = 0x05;
    /// Class: return (the accepted snap length).
    pub const RET: u16 = 0x06;
    /// Class: register moves.
    pub const MISC: u16 = 0x07;

    /// Load size: 32-bit word.
    pub const W: u16 = 0x00;
    /// Load size: 16-bit half word.
    pub const H: u16 = 0x08;
    /// Load size: byte.
    pub const B: u16 = 0x10;

    /// Load mode: the constant `k`.
    pub const IMM: u16 = 0x00;
    /// Load mode: packet bytes at `k`.
    pub const ABS: u16 = 0x20;
    /// Load mode: packet bytes at `X + k`.
    pub const IND: u16 = 0x40;
    /// Load mode: scratch word `M[k]`.
    pub const MEM: u16 = 0x60;
    /// Load mode: the frame's length on the wire.
    pub const LEN: u16 = 0x80;
    /// Load mode (`LDX` only): `4 * (packet[k] & 0xf)`, an IPv4 header length.
    pub const MSH: u16 = 0xa0;

    /// ALU op: `A + src`.
    pub const ADD: u16 = 0x00;
    /// ALU op: `A - src`.
    pub const SUB: u16 = 0x10;
    /// ALU op: `A * src`.
    pub const MUL: u16 = 0x20;
    /// ALU op: `A / src`.
    pub const DIV: u16 = 0x30;
    /// ALU op: `A | src`.
    pub const OR: u16 = 0x40;
    /// ALU op: `A & src`.
    pub const AND: u16 = 0x50;
    /// ALU op: `A << src`.
    pub const LSH: u16 = 0x60;
    /// ALU op: `A >> src`.
    pub const RSH: u16 = 0x70;
    /// ALU op: `-A` (source bit must be `K`).
    pub const NEG: u16 = 0x80;
    /// ALU op: `A % src`.
    pub const MOD: u16 = 0x90;
    /// ALU op: `A ^ src`.
    pub const XOR: u16 = 0xa0;

    /// Jump: always, by `k`.
    pub const JA: u16 = 0x00;
    /// Jump: `A == src`.
    pub const JEQ: u16 = 0x10;
    /// Jump: `A > src`.
    pub const JGT: u16 = 0x20;
    /// Jump: `A >= src`.
    pub const JGE: u16 = 0x30;
    /// Jump: `A & src != 0`.
    pub const JSET: u16 = 0x40;

    /// Source: the constant `k` (ALU, jumps, `RET`).
    pub const K: u16 = 0x00;
    /// Source: register X (ALU, jumps).
    pub const X: u16 = 0x08;
    /// `RET` source: register A.
    pub const A: u16 = 0x10;

    /// `MISC`: `X = A`.
    pub const TAX: u16 = 0x00;
    /// `MISC`: `A = X`.
    pub const TXA: u16 = 0x80;

    pub(super) const CLASS_MASK: u16 = 0x07;
    pub(super) const SIZE_MASK: u16 = 0x18;
    pub(super) const MODE_MASK: u16 = 0xe0;
    pub(super) const OP_MASK: u16 = 0xf0;
    pub(super) const SRC_MASK: u16 = 0x08;
}

/// One instruction, as libpcap's `struct bpf_insn` and the kernel's `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode (see [`code`]).
    pub code: u16,
    /// Conditional jumps: offset from the next instruction when the test holds.
    pub jt: u8,
    /// Conditional jumps: offset from the next instruction when the test fails.
    pub jf: u8,
    /// The constant operand.
    pub k: u32,
}

impl Insn {
    /// An instruction from its four fields.
    pub const fn new(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }
}

/// Why a program was refused. `at` is the index of the offending instruction.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BpfError {
    /// No instructions.
    #[error("empty filter: a program needs at least one instruction, a RET")]
    Empty,
    /// More than [`MAX_INSNS`] instructions.
    #[error("filter has {len} instructions; at most {MAX_INSNS} are allowed (BPF_MAXINSNS)")]
    TooLong {
        /// The program's length.
        len: usize,
    },
    /// An opcode outside the accepted set (see the module docs).
    #[error("instruction {at}: opcode {code:#06x} is not an accepted classic BPF instruction")]
    BadOpcode {
        /// Index of the instruction.
        at: usize,
        /// Its opcode.
        code: u16,
    },
    /// A packet load with `k >= 0x8000_0000`: a kernel ancillary load or negative offset.
    #[error(
        "instruction {at}: packet load at k = {k:#010x}: ancillary loads and negative offsets \
         (SKF_AD_OFF, SKF_NET_OFF, SKF_LL_OFF) are not supported; offsets must be below 0x80000000"
    )]
    AncillaryLoad {
        /// Index of the instruction.
        at: usize,
        /// Its offset.
        k: u32,
    },
    /// A jump that lands past the last instruction.
    #[error(
        "instruction {at}: jump to instruction {target} is outside the {len}-instruction \
         program (jumps go forward to an instruction that exists)"
    )]
    JumpOutOfRange {
        /// Index of the jump.
        at: usize,
        /// The instruction it would land on.
        target: u64,
        /// The program's length.
        len: usize,
    },
    /// The last instruction is not a `RET`.
    #[error("last instruction ({at}) has opcode {code:#06x}, not a RET: a filter must end in RET")]
    NoReturn {
        /// Index of the last instruction.
        at: usize,
        /// Its opcode.
        code: u16,
    },
    /// `DIV` or `MOD` by the constant 0.
    #[error("instruction {at}: division or modulo by the constant 0")]
    DivByZero {
        /// Index of the instruction.
        at: usize,
    },
    /// `LSH` or `RSH` by a constant of 32 or more.
    #[error("instruction {at}: shift by the constant {k}; constant shifts must be below 32")]
    ShiftTooLarge {
        /// Index of the instruction.
        at: usize,
        /// The shift.
        k: u32,
    },
    /// `M[k]` with `k >= 16`.
    #[error("instruction {at}: scratch word M[{k}] does not exist; M[0] to M[15] do")]
    BadMemIndex {
        /// Index of the instruction.
        at: usize,
        /// The scratch index.
        k: u32,
    },
    /// A load of `M[slot]` that some path reaches with no store to `M[slot]`.
    #[error("instruction {at}: loads M[{slot}], which is not stored on every path before it")]
    UninitMem {
        /// Index of the load.
        at: usize,
        /// The scratch index.
        slot: usize,
    },
}

/// A checked program, ready to [`run`](Program::run).
#[derive(Debug, Clone)]
pub struct Program {
    insns: Box<[Insn]>,
    /// `insns` decoded; every slot, jump and offset already checked.
    ops: Box<[Op]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    W,
    H,
    B,
}

/// Where a load takes its value from. `Mem` slots are `< MEM_WORDS`, packet offsets
/// `< FIRST_ANCILLARY_K`.
#[derive(Debug, Clone, Copy)]
enum Load {
    Imm(u32),
    Mem(usize),
    Len,
    Abs(Size, u32),
    Ind(Size, u32),
    Msh(u32),
}

#[derive(Debug, Clone, Copy)]
enum Operand {
    K(u32),
    X,
}

#[derive(Debug, Clone, Copy)]
enum AluOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    And,
    Or,
    Xor,
    Lsh,
    Rsh,
}

#[derive(Debug, Clone, Copy)]
enum Cond {
    Eq,
    Gt,
    Ge,
    Set,
}

/// A decoded instruction. Jump offsets are relative to the next instruction and land inside
/// the program.
#[derive(Debug, Clone, Copy)]
enum Op {
    Ld(Load),
    Ldx(Load),
    St(usize),
    Stx(usize),
    Alu(AluOp, Operand),
    Neg,
    Ja(usize),
    Jmp(Cond, Operand, u8, u8),
    RetK(u32),
    RetA,
    Tax,
    Txa,
}

/// Decodes the instruction at `at` of a `len`-instruction program and checks its operands
/// (the per-instruction rules of `chk_code_allowed` and `bpf_check_classic`).
fn decode(at: usize, insn: Insn, len: usize) -> Result<Op, BpfError> {
    use code::*;
    let Insn { code: c, jt, jf, k } = insn;
    let bad = BpfError::BadOpcode { at, code: c };
    if c > 0xff {
        return Err(bad);
    }
    let slot = || match usize::try_from(k) {
        Ok(s) if s < MEM_WORDS => Ok(s),
        _ => Err(BpfError::BadMemIndex { at, k }),
    };
    let offset = || match k {
        0..FIRST_ANCILLARY_K => Ok(k),
        _ => Err(BpfError::AncillaryLoad { at, k }),
    };
    let size = match c & SIZE_MASK {
        W => Some(Size::W),
        H => Some(Size::H),
        B => Some(Size::B),
        _ => None,
    };
    let src = if c & SRC_MASK == X {
        Operand::X
    } else {
        Operand::K(k)
    };
    let rest = c & !CLASS_MASK;
    let op = match c & CLASS_MASK {
        LD => Op::Ld(match (c & MODE_MASK, size) {
            (IMM, Some(Size::W)) => Load::Imm(k),
            (ABS, Some(s)) => Load::Abs(s, offset()?),
            (IND, Some(s)) => Load::Ind(s, offset()?),
            (MEM, Some(Size::W)) => Load::Mem(slot()?),
            (LEN, Some(Size::W)) => Load::Len,
            _ => return Err(bad),
        }),
        LDX => Op::Ldx(match (c & MODE_MASK, size) {
            (IMM, Some(Size::W)) => Load::Imm(k),
            (MEM, Some(Size::W)) => Load::Mem(slot()?),
            (LEN, Some(Size::W)) => Load::Len,
            (MSH, Some(Size::B)) => Load::Msh(offset()?),
            _ => return Err(bad),
        }),
        ST if rest == 0 => Op::St(slot()?),
        STX if rest == 0 => Op::Stx(slot()?),
        ALU => {
            let op = match c & OP_MASK {
                NEG if c & SRC_MASK == K => return Ok(Op::Neg),
                ADD => AluOp::Add,
                SUB => AluOp::Sub,
                MUL => AluOp::Mul,
                DIV => AluOp::Div,
                MOD => AluOp::Mod,
                AND => AluOp::And,
                OR => AluOp::Or,
                XOR => AluOp::Xor,
                LSH => AluOp::Lsh,
                RSH => AluOp::Rsh,
                _ => return Err(bad),
            };
            match (op, src) {
                (AluOp::Div | AluOp::Mod, Operand::K(0)) => return Err(BpfError::DivByZero { at }),
                (AluOp::Lsh | AluOp::Rsh, Operand::K(32..)) => {
                    return Err(BpfError::ShiftTooLarge { at, k });
                }
                _ => Op::Alu(op, src),
            }
        }
        JMP => {
            // Targets in u64: `at + 1 + k` cannot wrap around to a backward jump.
            let check = |off: u64| {
                let target = at as u64 + 1 + off;
                if target < len as u64 {
                    Ok(())
                } else {
                    Err(BpfError::JumpOutOfRange { at, target, len })
                }
            };
            let cond = match c & OP_MASK {
                JA if c & SRC_MASK == K => {
                    check(u64::from(k))?;
                    // In range, so below `len` and a usize.
                    return Ok(Op::Ja(k as usize));
                }
                JEQ => Cond::Eq,
                JGT => Cond::Gt,
                JGE => Cond::Ge,
                JSET => Cond::Set,
                _ => return Err(bad),
            };
            check(u64::from(jt))?;
            check(u64::from(jf))?;
            Op::Jmp(cond, src, jt, jf)
        }
        RET => match rest {
            K => Op::RetK(k),
            A => Op::RetA,
            _ => return Err(bad),
        },
        MISC => match rest {
            TAX => Op::Tax,
            TXA => Op::Txa,
            _ => return Err(bad),
        },
        _ => return Err(bad),
    };
    Ok(op)
}

/// The kernel's `check_load_and_stores`: one forward pass with the set of scratch words
/// stored on every path so far; a jump target keeps the intersection of the sets that reach
/// it. The program is loop-free, so one pass sees every predecessor first.
fn check_scratch(ops: &[Op]) -> Result<(), BpfError> {
    const ALL: u16 = u16::MAX;
    // `jumped_in[i]`: the words stored on every jump into `i` (all, if none jumps there).
    let mut jumped_in = vec![ALL; ops.len()];
    let mut stored: u16 = 0;
    for (at, op) in ops.iter().enumerate() {
        stored &= jumped_in[at];
        match *op {
            Op::St(s) | Op::Stx(s) => stored |= 1 << s,
            Op::Ld(Load::Mem(slot)) | Op::Ldx(Load::Mem(slot)) if stored & (1 << slot) == 0 => {
                return Err(BpfError::UninitMem { at, slot });
            }
            Op::Ja(off) => {
                jumped_in[at + 1 + off] &= stored;
                stored = ALL;
            }
            Op::Jmp(_, _, jt, jf) => {
                jumped_in[at + 1 + usize::from(jt)] &= stored;
                jumped_in[at + 1 + usize::from(jf)] &= stored;
                stored = ALL;
            }
            _ => {}
        }
    }
    Ok(())
}

/// `size` big-endian bytes of `data` at `offset`; `None` when they are not all there.
fn packet_load(data: &[u8], offset: u64, size: Size) -> Option<u32> {
    let len = match size {
        Size::W => 4,
        Size::H => 2,
        Size::B => 1,
    };
    let start = usize::try_from(offset).ok()?;
    let bytes = data.get(start..start.checked_add(len)?)?;
    Some(bytes.iter().fold(0, |v, &b| (v << 8) | u32::from(b)))
}

impl Program {
    /// Checks `insns` (see the module docs for what is accepted) and prepares them to run.
    pub fn new(insns: &[Insn]) -> Result<Program, BpfError> {
        let len = insns.len();
        if len == 0 {
            return Err(BpfError::Empty);
        }
        if len > MAX_INSNS {
            return Err(BpfError::TooLong { len });
        }
        let ops = insns
            .iter()
            .enumerate()
            .map(|(at, &insn)| decode(at, insn, len))
            .collect::<Result<Box<[Op]>, _>>()?;
        if !matches!(ops[len - 1], Op::RetK(_) | Op::RetA) {
            let code = insns[len - 1].code;
            return Err(BpfError::NoReturn { at: len - 1, code });
        }
        check_scratch(&ops)?;
        Ok(Program {
            insns: insns.into(),
            ops,
        })
    }

    /// `ret #262144`: accepts every frame, whole.
    pub fn accept_all() -> Program {
        Program {
            insns: [Insn::new(code::RET | code::K, 0, 0, ACCEPT_ALL_SNAPLEN)].into(),
            ops: [Op::RetK(ACCEPT_ALL_SNAPLEN)].into(),
        }
    }

    /// The instructions, as given to [`new`](Program::new).
    pub fn insns(&self) -> &[Insn] {
        &self.insns
    }

    /// Runs the program on a frame: `data` holds the bytes available (possibly fewer than the
    /// frame has), `wire_len` is the frame's length on the wire (what `LEN` loads). Returns
    /// the snap length the program accepts, 0 to reject, as the kernel's filter run does.
    /// A packet load outside `data` and a division by `X == 0` return 0.
    pub fn run(&self, data: &[u8], wire_len: u32) -> u32 {
        let (mut a, mut x, mut mem) = (0u32, 0u32, [0u32; MEM_WORDS]);
        let mut pc = 0;
        // Checked jumps go forward and land inside, and the last op returns, so this ends.
        while let Some(&op) = self.ops.get(pc) {
            pc += 1;
            match op {
                Op::Ld(load) | Op::Ldx(load) => {
                    let value = match load {
                        Load::Imm(k) => Some(k),
                        Load::Mem(slot) => Some(mem[slot]),
                        Load::Len => Some(wire_len),
                        Load::Abs(size, k) => packet_load(data, u64::from(k), size),
                        Load::Ind(size, k) => packet_load(data, u64::from(x) + u64::from(k), size),
                        Load::Msh(k) => {
                            packet_load(data, u64::from(k), Size::B).map(|b| (b & 0xf) << 2)
                        }
                    };
                    let Some(value) = value else { return 0 };
                    if matches!(op, Op::Ld(_)) {
                        a = value;
                    } else {
                        x = value;
                    }
                }
                Op::St(slot) => mem[slot] = a,
                Op::Stx(slot) => mem[slot] = x,
                Op::Alu(alu, src) => {
                    let v = match src {
                        Operand::K(k) => k,
                        Operand::X => x,
                    };
                    a = match alu {
                        AluOp::Add => a.wrapping_add(v),
                        AluOp::Sub => a.wrapping_sub(v),
                        AluOp::Mul => a.wrapping_mul(v),
                        AluOp::Div => match a.checked_div(v) {
                            Some(q) => q,
                            None => return 0,
                        },
                        AluOp::Mod => match a.checked_rem(v) {
                            Some(r) => r,
                            None => return 0,
                        },
                        AluOp::And => a & v,
                        AluOp::Or => a | v,
                        AluOp::Xor => a ^ v,
                        AluOp::Lsh => a.checked_shl(v).unwrap_or(0),
                        AluOp::Rsh => a.checked_shr(v).unwrap_or(0),
                    };
                }
                Op::Neg => a = a.wrapping_neg(),
                Op::Ja(off) => pc += off,
                Op::Jmp(cond, src, jt, jf) => {
                    let v = match src {
                        Operand::K(k) => k,
                        Operand::X => x,
                    };
                    let taken = match cond {
                        Cond::Eq => a == v,
                        Cond::Gt => a > v,
                        Cond::Ge => a >= v,
                        Cond::Set => a & v != 0,
                    };
                    pc += usize::from(if taken { jt } else { jf });
                }
                Op::RetK(k) => return k,
                Op::RetA => return a,
                Op::Tax => x = a,
                Op::Txa => a = x,
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::code::*;
    use super::*;
    use etherparse::{PacketBuilder, VlanId};
    use proptest::prelude::*;

    const fn i(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn::new(code, jt, jf, k)
    }

    fn refused(insns: &[Insn]) -> BpfError {
        Program::new(insns).unwrap_err()
    }

    /// Runs `insns` on `data`, whose length on the wire is its length.
    fn run(insns: &[Insn], data: &[u8]) -> u32 {
        Program::new(insns).unwrap().run(data, data.len() as u32)
    }

    const RET_A: Insn = i(RET | A, 0, 0, 0);

    // The kernel's `chk_code_allowed` table, written out as numbers.
    const KERNEL_OPCODES: [u16; 49] = [
        0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3c, 0x94, 0x9c, 0x54, 0x5c, 0x44,
        0x4c, // ALU
        0xa4, 0xac, 0x64, 0x6c, 0x74, 0x7c, 0x84, // ALU
        0x20, 0x28, 0x30, 0x80, 0x40, 0x48, 0x50, 0x00, 0x60, // LD
        0x81, 0xb1, 0x01, 0x61, // LDX
        0x02, 0x03, 0x07, 0x87, 0x06, 0x16, // ST STX TAX TXA RET
        0x05, 0x15, 0x1d, 0x35, 0x3d, 0x25, 0x2d, 0x45, 0x4d, // JMP
    ];

    #[test]
    fn exactly_the_kernels_opcodes_decode() {
        for code in 0..=u16::MAX {
            // k = 1, jumps of 0 and 1 in a 3-instruction program: valid operands for all.
            let decoded = decode(0, i(code, 0, 0, 1), 3);
            assert_eq!(
                decoded.is_ok(),
                KERNEL_OPCODES.contains(&code),
                "{code:#06x}: {decoded:?}"
            );
            if let Err(e) = decoded {
                assert_eq!(e, BpfError::BadOpcode { at: 0, code });
            }
        }
    }

    #[test]
    fn packet_loads_are_big_endian_words_halves_and_bytes() {
        let data = [0x12, 0x34, 0x56, 0x78, 0x9a];
        assert_eq!(run(&[i(LD | W | ABS, 0, 0, 1), RET_A], &data), 0x3456_789a);
        assert_eq!(run(&[i(LD | H | ABS, 0, 0, 3), RET_A], &data), 0x789a);
        assert_eq!(run(&[i(LD | B | ABS, 0, 0, 4), RET_A], &data), 0x9a);
        // IND adds X.
        let ind = [i(LDX | W | IMM, 0, 0, 2), i(LD | H | IND, 0, 0, 1), RET_A];
        assert_eq!(run(&ind, &data), 0x789a);
        // MSH: X = 4 * (byte & 0xf), an IPv4 header length.
        let msh = [i(LDX | B | MSH, 0, 0, 0), i(MISC | TXA, 0, 0, 0), RET_A];
        assert_eq!(run(&msh, &[0x45]), 20);
    }

    #[test]
    fn loads_outside_the_captured_bytes_reject() {
        let data = [0xff; 8];
        assert_eq!(run(&[i(LD | W | ABS, 0, 0, 5), RET_A], &data), 0);
        assert_eq!(run(&[i(LD | H | ABS, 0, 0, 7), RET_A], &data), 0);
        assert_eq!(run(&[i(LD | B | ABS, 0, 0, 8), RET_A], &data), 0);
        assert_eq!(run(&[i(LDX | B | MSH, 0, 0, 8), RET_A], &data), 0);
        assert_eq!(run(&[i(LD | B | ABS, 0, 0, 0x7fff_ffff), RET_A], &data), 0);
        // X + k does not wrap around to a small offset (nor does it in libpcap 1.10.3).
        let ind = [
            i(LDX | W | IMM, 0, 0, u32::MAX),
            i(LD | B | IND, 0, 0, 1),
            RET_A,
        ];
        assert_eq!(run(&ind, &data), 0);
        // Even when the program would return a constant afterwards.
        let then_accept = [i(LD | B | ABS, 0, 0, 8), i(RET | K, 0, 0, 9)];
        assert_eq!(run(&then_accept, &data), 0);
        assert_eq!(run(&then_accept, &[0; 9]), 9);
    }

    #[test]
    fn len_imm_and_scratch_loads() {
        let p = Program::new(&[
            i(LD | W | LEN, 0, 0, 0), // A = 1000
            i(LDX | W | IMM, 0, 0, 7),
            i(ST, 0, 0, 15),
            i(STX, 0, 0, 0),
            i(LDX | W | LEN, 0, 0, 0),
            i(LD | W | IMM, 0, 0, 0),
            i(LD | W | MEM, 0, 0, 0),   // A = 7
            i(ALU | ADD | X, 0, 0, 0),  // A = 1007
            i(LDX | W | MEM, 0, 0, 15), // X = 1000
            i(ALU | ADD | X, 0, 0, 0),
            RET_A,
        ])
        .unwrap();
        assert_eq!(p.run(&[], 1000), 2007);
    }

    #[test]
    fn alu_ops_with_k_and_with_x() {
        let cases = [
            (ADD, u32::MAX, 2, 1),
            (SUB, 1, 2, u32::MAX),
            (MUL, 0x8000_0001, 2, 2),
            (DIV, 7, 2, 3),
            (MOD, 7, 4, 3),
            (AND, 0b1100, 0b1010, 0b1000),
            (OR, 0b1100, 0b1010, 0b1110),
            (XOR, 0b1100, 0b1010, 0b0110),
            (LSH, 0x8000_0001, 1, 2),
            (RSH, 0x8000_0000, 31, 1),
        ];
        for (op, a, v, want) in cases {
            let with_k = [i(LD | IMM, 0, 0, a), i(ALU | op | K, 0, 0, v), RET_A];
            let with_x = [
                i(LD | IMM, 0, 0, a),
                i(LDX | IMM, 0, 0, v),
                i(ALU | op | X, 0, 0, 0),
                RET_A,
            ];
            assert_eq!(run(&with_k, &[]), want, "{op:#x} K");
            assert_eq!(run(&with_x, &[]), want, "{op:#x} X");
        }
        assert_eq!(
            run(&[i(LD | IMM, 0, 0, 1), i(ALU | NEG, 0, 0, 0), RET_A], &[]),
            u32::MAX
        );
    }

    #[test]
    fn division_and_modulo_by_x_zero_reject() {
        for op in [DIV, MOD] {
            let p = [
                i(LD | IMM, 0, 0, 5),
                i(ALU | op | X, 0, 0, 0),
                i(RET | K, 0, 0, 7),
            ];
            assert_eq!(run(&p, &[]), 0, "{op:#x}");
        }
    }

    /// libpcap 1.10.3's interpreter (`pcap_offline_filter`) gives 1 for these too.
    #[test]
    fn shifts_by_x_of_32_or_more_give_0() {
        for op in [LSH, RSH] {
            for x in [32, 33, u32::MAX] {
                let p = [
                    i(LD | IMM, 0, 0, u32::MAX),
                    i(LDX | IMM, 0, 0, x),
                    i(ALU | op | X, 0, 0, 0),
                    i(ALU | ADD | K, 0, 0, 1),
                    RET_A,
                ];
                assert_eq!(run(&p, &[]), 1, "{op:#x} by {x}");
            }
        }
    }

    #[test]
    fn conditional_jumps_with_k_and_with_x() {
        let cases = [
            (JEQ, 5, 5, true),
            (JEQ, 5, 6, false),
            (JGT, 6, 5, true),
            (JGT, 5, 5, false),
            (JGE, 5, 5, true),
            (JGE, 4, 5, false),
            (JSET, 0b0110, 0b0100, true),
            (JSET, 0b0110, 0b1001, false),
        ];
        for (op, a, v, taken) in cases {
            let want = if taken { 1 } else { 2 };
            let (ret_true, ret_false) = (i(RET | K, 0, 0, 1), i(RET | K, 0, 0, 2));
            let with_k = [
                i(LD | IMM, 0, 0, a),
                i(JMP | op | K, 1, 0, v),
                ret_false,
                ret_true,
            ];
            let with_x = [
                i(LD | IMM, 0, 0, a),
                i(LDX | IMM, 0, 0, v),
                i(JMP | op | X, 1, 0, 0),
                ret_false,
                ret_true,
            ];
            assert_eq!(run(&with_k, &[]), want, "{op:#x} K {a} {v}");
            assert_eq!(run(&with_x, &[]), want, "{op:#x} X {a} {v}");
        }
        let ja = [
            i(JMP | JA, 0, 0, 2),
            i(RET | K, 0, 0, 1),
            i(RET | K, 0, 0, 2),
            i(RET | K, 0, 0, 3),
        ];
        assert_eq!(run(&ja, &[]), 3);
    }

    #[test]
    fn tax_txa_and_ret() {
        let p = [
            i(LD | IMM, 0, 0, 3),
            i(MISC | TAX, 0, 0, 0),
            i(LD | IMM, 0, 0, 4),
            i(ALU | MUL | X, 0, 0, 0),
            i(MISC | TXA, 0, 0, 0),
            RET_A,
        ];
        assert_eq!(run(&p, &[]), 3);
        assert_eq!(run(&[i(RET | K, 0, 0, 96)], &[]), 96);
    }

    #[test]
    fn accept_all_returns_262144() {
        let all = Program::accept_all();
        assert_eq!(all.run(&[], 0), 262_144);
        assert_eq!(
            Program::new(all.insns()).unwrap().run(&[1; 64], 64),
            262_144
        );
    }

    #[test]
    fn empty_and_too_long_programs_are_refused() {
        assert_eq!(refused(&[]), BpfError::Empty);
        let rets = vec![i(RET | K, 0, 0, 0); MAX_INSNS + 1];
        assert_eq!(refused(&rets), BpfError::TooLong { len: 4097 });
        assert!(Program::new(&rets[..MAX_INSNS]).is_ok());
    }

    #[test]
    fn ancillary_loads_and_negative_offsets_are_refused() {
        for (code, k) in [
            (LD | W | ABS, 0xffff_f000), // SKF_AD_OFF + SKF_AD_PROTOCOL
            (LD | H | ABS, 0xffff_f004), // SKF_AD_OFF + SKF_AD_IFINDEX
            (LD | B | IND, 0xfff0_0000), // SKF_NET_OFF
            (LD | W | IND, 0xffe0_0000), // SKF_LL_OFF
            (LDX | B | MSH, 0x8000_0000),
        ] {
            let e = refused(&[i(code, 0, 0, k), RET_A]);
            assert_eq!(e, BpfError::AncillaryLoad { at: 0, k });
            assert!(e.to_string().contains("ancillary loads"), "{e}");
        }
    }

    #[test]
    fn constant_division_by_zero_and_long_shifts_are_refused() {
        for op in [DIV, MOD] {
            let e = refused(&[i(ALU | op | K, 0, 0, 0), RET_A]);
            assert_eq!(e, BpfError::DivByZero { at: 0 });
        }
        for op in [LSH, RSH] {
            let e = refused(&[i(ALU | op | K, 0, 0, 32), RET_A]);
            assert_eq!(e, BpfError::ShiftTooLarge { at: 0, k: 32 });
            assert!(Program::new(&[i(ALU | op | K, 0, 0, 31), RET_A]).is_ok());
        }
    }

    #[test]
    fn scratch_indexes_past_15_are_refused() {
        for code in [ST, STX, LD | W | MEM, LDX | W | MEM] {
            let e = refused(&[i(code, 0, 0, 16), RET_A]);
            assert_eq!(e, BpfError::BadMemIndex { at: 0, k: 16 });
        }
    }

    #[test]
    fn jumps_past_the_end_are_refused() {
        let ret = i(RET | K, 0, 0, 0);
        assert!(Program::new(&[i(JMP | JA, 0, 0, 1), ret, ret]).is_ok());
        let e = refused(&[i(JMP | JA, 0, 0, 2), ret, ret]);
        assert_eq!(
            e,
            BpfError::JumpOutOfRange {
                at: 0,
                target: 3,
                len: 3
            }
        );
        assert!(
            e.to_string()
                .starts_with("instruction 0: jump to instruction 3"),
            "{e}"
        );
        // A huge offset must not wrap around to a backward jump.
        let e = refused(&[ret, i(JMP | JA, 0, 0, u32::MAX), ret]);
        assert_eq!(
            e,
            BpfError::JumpOutOfRange {
                at: 1,
                target: (1 << 32) + 1,
                len: 3
            }
        );
        let e = refused(&[i(JMP | JEQ | K, 2, 0, 0), ret, ret]);
        assert_eq!(
            e,
            BpfError::JumpOutOfRange {
                at: 0,
                target: 3,
                len: 3
            }
        );
        let e = refused(&[i(JMP | JGT | X, 0, 2, 0), ret, ret]);
        assert_eq!(
            e,
            BpfError::JumpOutOfRange {
                at: 0,
                target: 3,
                len: 3
            }
        );
    }

    #[test]
    fn the_last_instruction_must_return() {
        let e = refused(&[i(LD | IMM, 0, 0, 0)]);
        assert_eq!(e, BpfError::NoReturn { at: 0, code: 0 });
        // A conditional jump cannot be last: both branches would leave the program.
        let e = refused(&[RET_A, i(JMP | JEQ | K, 0, 0, 0)]);
        assert!(matches!(e, BpfError::JumpOutOfRange { at: 1, .. }), "{e}");
    }

    #[test]
    fn scratch_loads_need_a_store_on_every_path() {
        let e = refused(&[i(LD | W | MEM, 0, 0, 3), RET_A]);
        assert_eq!(e, BpfError::UninitMem { at: 0, slot: 3 });
        assert!(e.to_string().contains("M[3]"), "{e}");
        let stored_on = |jt_stores: bool, jf_stores: bool| {
            let (store, skip) = (i(ST, 0, 0, 1), i(LD | IMM, 0, 0, 0));
            Program::new(&[
                i(JMP | JEQ | K, 2, 0, 0),
                if jf_stores { store } else { skip },
                i(JMP | JA, 0, 0, 1),
                if jt_stores { store } else { skip },
                i(LDX | W | MEM, 0, 0, 1),
                RET_A,
            ])
        };
        assert!(stored_on(true, true).is_ok());
        assert_eq!(
            stored_on(true, false).unwrap_err(),
            BpfError::UninitMem { at: 4, slot: 1 }
        );
        assert!(stored_on(false, true).is_err());
        // As in the kernel, what a RET leaves flows into the next instruction: here M[0] is
        // stored on the only path into 4, yet the load is refused.
        let e = refused(&[
            i(JMP | JEQ | K, 0, 2, 1),
            i(ST, 0, 0, 0),
            i(JMP | JA, 0, 0, 1),
            i(RET | K, 0, 0, 0),
            i(LD | W | MEM, 0, 0, 0),
            RET_A,
        ]);
        assert_eq!(e, BpfError::UninitMem { at: 4, slot: 0 });
    }

    #[test]
    fn errors_name_the_instruction() {
        let e = refused(&[RET_A, i(0x0e, 0, 0, 0), RET_A]);
        assert_eq!(e, BpfError::BadOpcode { at: 1, code: 0x0e });
        assert_eq!(
            e.to_string(),
            "instruction 1: opcode 0x000e is not an accepted classic BPF instruction"
        );
    }

    // Golden programs: `pcap_compile` output (libpcap 1.10.3, DLT_EN10MB, snaplen 65535,
    // optimize 1, PCAP_NETMASK_UNKNOWN) for the filter in each doc line.
    /// `udp dst port 9000`
    const UDP_DST_PORT_9000: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 0, 4, 0x86dd),
        i(0x30, 0, 0, 0x14),
        i(0x15, 0, 11, 0x11),
        i(0x28, 0, 0, 0x38),
        i(0x15, 8, 9, 0x2328),
        i(0x15, 0, 8, 0x800),
        i(0x30, 0, 0, 0x17),
        i(0x15, 0, 6, 0x11),
        i(0x28, 0, 0, 0x14),
        i(0x45, 4, 0, 0x1fff),
        i(0xb1, 0, 0, 0xe),
        i(0x48, 0, 0, 0x10),
        i(0x15, 0, 1, 0x2328),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `ip`
    const IP: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 0, 1, 0x800),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `tcp`
    const TCP: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 0, 2, 0x800),
        i(0x30, 0, 0, 0x17),
        i(0x15, 6, 7, 0x6),
        i(0x15, 0, 6, 0x86dd),
        i(0x30, 0, 0, 0x14),
        i(0x15, 3, 0, 0x6),
        i(0x15, 0, 3, 0x2c),
        i(0x30, 0, 0, 0x36),
        i(0x15, 0, 1, 0x6),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `vlan and udp`
    const VLAN_AND_UDP: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 2, 0, 0x8100),
        i(0x15, 1, 0, 0x88a8),
        i(0x15, 0, 11, 0x9100),
        i(0x28, 0, 0, 0x10),
        i(0x15, 0, 2, 0x800),
        i(0x30, 0, 0, 0x1b),
        i(0x15, 6, 7, 0x11),
        i(0x15, 0, 6, 0x86dd),
        i(0x30, 0, 0, 0x18),
        i(0x15, 3, 0, 0x11),
        i(0x15, 0, 3, 0x2c),
        i(0x30, 0, 0, 0x3a),
        i(0x15, 0, 1, 0x11),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `ip6`
    const IP6: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 0, 1, 0x86dd),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `ether host 02:00:00:00:00:01`
    const ETHER_HOST: &[Insn] = &[
        i(0x20, 0, 0, 0x8),
        i(0x15, 0, 2, 0x1),
        i(0x28, 0, 0, 0x6),
        i(0x15, 4, 0, 0x200),
        i(0x20, 0, 0, 0x2),
        i(0x15, 0, 3, 0x1),
        i(0x28, 0, 0, 0x0),
        i(0x15, 0, 1, 0x200),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `len > 100`
    const LEN_GT_100: &[Insn] = &[
        i(0x80, 0, 0, 0x0),
        i(0x25, 0, 1, 0x64),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `tcp and (ip[2:2] - ((ip[0]&0xf)<<2) - ((tcp[12]&0xf0)>>2)) != 0`
    const TCP_WITH_PAYLOAD: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 0, 19, 0x800),
        i(0x30, 0, 0, 0x17),
        i(0x15, 0, 17, 0x6),
        i(0x28, 0, 0, 0x10),
        i(0x02, 0, 0, 0x1),
        i(0x30, 0, 0, 0xe),
        i(0x54, 0, 0, 0xf),
        i(0x64, 0, 0, 0x2),
        i(0x07, 0, 0, 0x5),
        i(0x60, 0, 0, 0x1),
        i(0x1c, 0, 0, 0x0),
        i(0x02, 0, 0, 0x5),
        i(0xb1, 0, 0, 0xe),
        i(0x50, 0, 0, 0x1a),
        i(0x54, 0, 0, 0xf0),
        i(0x74, 0, 0, 0x2),
        i(0x07, 0, 0, 0x9),
        i(0x60, 0, 0, 0x5),
        i(0x1d, 1, 0, 0x0),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];
    /// `tcp[tcpflags] & tcp-syn != 0`
    const TCP_SYN: &[Insn] = &[
        i(0x28, 0, 0, 0xc),
        i(0x15, 0, 8, 0x800),
        i(0x30, 0, 0, 0x17),
        i(0x15, 0, 6, 0x6),
        i(0x28, 0, 0, 0x14),
        i(0x45, 4, 0, 0x1fff),
        i(0xb1, 0, 0, 0xe),
        i(0x50, 0, 0, 0x1b),
        i(0x45, 0, 1, 0x2),
        i(0x06, 0, 0, 0xffff),
        i(0x06, 0, 0, 0x0),
    ];

    const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const OTHER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 3];
    const IPV4_ADDRS: ([u8; 4], [u8; 4]) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    const IPV6_ADDRS: ([u8; 16], [u8; 16]) = ([0xfd; 16], [0xfe; 16]);

    /// A test frame: its bytes and how many of them are captured.
    struct Frame {
        name: &'static str,
        bytes: Vec<u8>,
        captured: usize,
    }

    /// The frames of the golden verdicts, in the order of `GOLDEN_VERDICTS`' columns.
    fn frames() -> Vec<Frame> {
        macro_rules! built {
            ($builder:expr, $payload_len:expr) => {{
                let mut f = Vec::new();
                $builder.write(&mut f, &[0x5a; $payload_len]).unwrap();
                f
            }};
        }
        let eth = |src, dst| PacketBuilder::ethernet2(src, dst);
        let vlan = || eth(HOST_MAC, PEER_MAC).single_vlan(VlanId::try_new(5).unwrap());
        let udp4 = built!(
            eth(HOST_MAC, PEER_MAC)
                .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                .udp(4000, 9000),
            100
        );
        let mut fragment = udp4.clone();
        fragment[20..22].copy_from_slice(&[0x00, 0x01]); // fragment offset 8 bytes
        let whole = |name, bytes: Vec<u8>| Frame {
            name,
            captured: bytes.len(),
            bytes,
        };
        vec![
            whole("udp4_9000", udp4.clone()),
            whole(
                "udp4_9001",
                built!(
                    eth(HOST_MAC, PEER_MAC)
                        .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                        .udp(4000, 9001),
                    8
                ),
            ),
            whole(
                "tcp4_9000_data",
                built!(
                    eth(HOST_MAC, PEER_MAC)
                        .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                        .tcp(4000, 9000, 1, 1024)
                        .ack(1)
                        .psh(),
                    10
                ),
            ),
            whole(
                "tcp4_9000_syn",
                built!(
                    eth(HOST_MAC, PEER_MAC)
                        .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                        .tcp(4000, 9000, 1, 1024)
                        .syn(),
                    0
                ),
            ),
            whole(
                "udp6_9000",
                built!(
                    eth(HOST_MAC, PEER_MAC)
                        .ipv6(IPV6_ADDRS.0, IPV6_ADDRS.1, 64)
                        .udp(4000, 9000),
                    8
                ),
            ),
            whole(
                "tcp6_9000",
                built!(
                    eth(HOST_MAC, PEER_MAC)
                        .ipv6(IPV6_ADDRS.0, IPV6_ADDRS.1, 64)
                        .tcp(4000, 9000, 1, 1024),
                    100
                ),
            ),
            whole(
                "vlan_udp4_9000",
                built!(
                    vlan().ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64).udp(4000, 9000),
                    8
                ),
            ),
            whole(
                "vlan_udp6_9000",
                built!(
                    vlan().ipv6(IPV6_ADDRS.0, IPV6_ADDRS.1, 64).udp(4000, 9000),
                    8
                ),
            ),
            whole(
                "vlan_tcp4_9000",
                built!(
                    vlan()
                        .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                        .tcp(4000, 9000, 1, 1024),
                    8
                ),
            ),
            whole("udp4_9000_fragment", fragment),
            whole(
                "other_macs_udp4_9000",
                built!(
                    eth(OTHER_MAC, PEER_MAC)
                        .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                        .udp(4000, 9000),
                    8
                ),
            ),
            whole(
                "to_host_udp4_9001",
                built!(
                    eth(OTHER_MAC, HOST_MAC)
                        .ipv4(IPV4_ADDRS.0, IPV4_ADDRS.1, 64)
                        .udp(4000, 9001),
                    8
                ),
            ),
            // The UDP destination port is at bytes 36..38: one byte short.
            Frame {
                name: "udp4_9000_cut_37",
                captured: 37,
                bytes: udp4.clone(),
            },
            Frame {
                name: "udp4_9000_cut_12",
                captured: 12,
                bytes: udp4.clone(),
            },
            Frame {
                name: "udp4_9000_cut_0",
                captured: 0,
                bytes: udp4,
            },
        ]
    }

    /// libpcap's `pcap_offline_filter` verdict for each golden program on each of `frames()`.
    const GOLDEN_VERDICTS: [(&[Insn], [u32; 15]); 9] = [
        (
            UDP_DST_PORT_9000,
            [65535, 0, 0, 0, 65535, 0, 0, 0, 0, 0, 65535, 0, 0, 0, 0],
        ),
        (
            IP,
            [
                65535, 65535, 65535, 65535, 0, 0, 0, 0, 0, 65535, 65535, 65535, 65535, 0, 0,
            ],
        ),
        (
            TCP,
            [0, 0, 65535, 65535, 0, 65535, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            VLAN_AND_UDP,
            [0, 0, 0, 0, 0, 0, 65535, 65535, 0, 0, 0, 0, 0, 0, 0],
        ),
        (IP6, [0, 0, 0, 0, 65535, 65535, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        (
            ETHER_HOST,
            [
                65535, 65535, 65535, 65535, 65535, 65535, 65535, 65535, 65535, 65535, 0, 65535,
                65535, 65535, 0,
            ],
        ),
        (
            LEN_GT_100,
            [
                65535, 0, 0, 0, 0, 65535, 0, 0, 0, 65535, 0, 0, 65535, 65535, 65535,
            ],
        ),
        (
            TCP_WITH_PAYLOAD,
            [0, 0, 65535, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (TCP_SYN, [0, 0, 0, 65535, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    ];

    #[test]
    fn golden_programs_agree_with_libpcap() {
        let frames = frames();
        for (insns, verdicts) in GOLDEN_VERDICTS {
            let p = Program::new(insns).unwrap();
            assert_eq!(p.insns(), insns);
            for (f, want) in frames.iter().zip(verdicts) {
                let got = p.run(&f.bytes[..f.captured], f.bytes.len() as u32);
                assert_eq!(got, want, "{} on {insns:?}", f.name);
            }
        }
    }

    #[test]
    fn golden_udp_port_filter_reads_the_port_libpcap_reads() {
        let udp = &frames()[0].bytes;
        assert_eq!(&udp[36..38], &9000u16.to_be_bytes());
        let p = Program::new(UDP_DST_PORT_9000).unwrap();
        let mut to_9001 = udp.clone();
        to_9001[36..38].copy_from_slice(&9001u16.to_be_bytes());
        assert_eq!(p.run(udp, udp.len() as u32), 65535);
        assert_eq!(p.run(&to_9001, udp.len() as u32), 0);
    }

    /// An instruction from the accepted opcodes or any at all, with mostly small operands.
    fn any_insn() -> impl Strategy<Value = Insn> {
        let code =
            prop_oneof![3 => proptest::sample::select(&KERNEL_OPCODES[..]), 1 => any::<u16>()];
        let jump = prop_oneof![3 => 0u8..8, 1 => any::<u8>()];
        let k = prop_oneof![3 => 0u32..64, 1 => any::<u32>()];
        (code, jump.clone(), jump, k).prop_map(|(c, jt, jf, k)| i(c, jt, jf, k))
    }

    /// `insn` bent to pass every check at `at` of a `len`-instruction program, except the
    /// scratch check: an accepted opcode, jumps and offsets in range, no constant 0 divisor.
    fn repaired(at: usize, mut insn: Insn, len: usize) -> Insn {
        if at == len - 1 {
            return i(RET | (insn.code & A), 0, 0, insn.k);
        }
        if !KERNEL_OPCODES.contains(&insn.code) {
            insn.code = KERNEL_OPCODES[usize::from(insn.code) % KERNEL_OPCODES.len()];
        }
        let room = (len - at - 1) as u32;
        let (c, k) = (insn.code, insn.k);
        match (c & CLASS_MASK, c & MODE_MASK, c & OP_MASK) {
            (JMP, _, JA) => insn.k = k % room,
            (JMP, _, _) => {
                insn.jt = (u32::from(insn.jt) % room.min(256)) as u8;
                insn.jf = (u32::from(insn.jf) % room.min(256)) as u8;
            }
            (ST | STX, _, _) | (LD | LDX, MEM, _) => insn.k = k % 16,
            (LD | LDX, ABS | IND | MSH, _) => insn.k = k % 128,
            (ALU, _, DIV | MOD) if c & SRC_MASK == K => insn.k = k.max(1),
            (ALU, _, LSH | RSH) if c & SRC_MASK == K => insn.k = k % 32,
            _ => {}
        }
        insn
    }

    proptest! {
        #[test]
        fn repaired_programs_are_accepted_unless_a_scratch_load_is_unset(
            insns in proptest::collection::vec(any_insn(), 1..64),
            data in proptest::collection::vec(any::<u8>(), 0..96),
            wire_len in any::<u32>(),
        ) {
            let len = insns.len();
            let insns: Vec<Insn> =
                insns.iter().enumerate().map(|(at, &insn)| repaired(at, insn, len)).collect();
            match Program::new(&insns) {
                Ok(p) => {
                    p.run(&data, wire_len);
                }
                Err(BpfError::UninitMem { .. }) => {}
                Err(e) => prop_assert!(false, "{e}: {insns:?}"),
            }
        }

        #[test]
        fn random_programs_are_refused_or_run_to_a_return(
            mut insns in proptest::collection::vec(any_insn(), 1..48),
            end_with_ret in any::<bool>(),
            data in proptest::collection::vec(any::<u8>(), 0..96),
            wire_len in any::<u32>(),
        ) {
            if end_with_ret {
                insns.push(RET_A);
            }
            if let Ok(p) = Program::new(&insns) {
                let len = insns.len() as u64;
                for (at, insn) in insns.iter().enumerate() {
                    let next = at as u64 + 1;
                    if insn.code == JMP | JA {
                        prop_assert!(next + u64::from(insn.k) < len);
                    } else if insn.code & CLASS_MASK == JMP {
                        prop_assert!(next + u64::from(insn.jt.max(insn.jf)) < len);
                    }
                }
                p.run(&data, wire_len);
            }
        }

        #[test]
        fn every_jump_past_the_end_is_refused(
            len in 2usize..200,
            at_seed in any::<usize>(),
            past in any::<u32>(),
            kind in 0..3u8,
        ) {
            let at = at_seed % (len - 1);
            // Offsets below `room` land inside; `room <= 198`, so a `jt`/`jf` can miss too.
            let room = (len - at - 1) as u32;
            let k = room + past % (u32::MAX - room + 1);
            let long = (room + past % (256 - room)) as u8;
            let short = (room - 1) as u8;
            let mut insns = vec![i(RET | K, 0, 0, 0); len];
            insns[at] = match kind {
                0 => i(JMP | JA, 0, 0, k),
                1 => i(JMP | JEQ | K, long, short, 0),
                _ => i(JMP | JSET | X, short, long, 0),
            };
            let result = Program::new(&insns);
            let refused_at =
                matches!(result, Err(BpfError::JumpOutOfRange { at: a, .. }) if a == at);
            prop_assert!(refused_at, "{:?}", result);
            // Every offset below `room` is accepted.
            insns[at] = i(JMP | JA, 0, 0, room - 1);
            prop_assert!(Program::new(&insns).is_ok());
        }
    }
}
