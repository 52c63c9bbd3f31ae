//! The receive side of an mlx5 CQ, shared by the cyclic ([`super::rxq`]) and the striding
//! ([`super::rxq_mprq`]) RX queue: it turns the CQ into a sequence of completions, one per
//! received packet (or striding-RQ filler), whether the device wrote a normal CQE (§5.1) or a
//! compressed session of the basic layout (§6.2).
//!
//! A session's title gives the count (`byte_cnt`) and the fields its packets share; mini CQE
//! `i` sits in the array at slot `t + 1` (`i < 8`) or `t + 8k` (array `k`). Each mini gives the
//! packet's `byte_cnt` and, by the CQ's mini format, its RSS hash (HASH, cyclic RQs) or its
//! stride index (CSUM_STRIDX, striding RQs; the hash then is the title's). Mid-session the
//! consumer index (and `SET_CI`) stays at the title; once the last mini is handed out, the
//! session's slots after the title are poisoned (opcode INVALID) so that no later lap reads a
//! stale array or hole as a completion, and the consumer jumps to `t + n`.
#![deny(unsafe_code)]

use super::cq::CompletionQueue;
use super::provider::RawCq;
use crate::hw::mlx5::cqe::{
    csum_ok, mini_slot, op_own, Cqe, CqeFormat, CqeOpcode, MiniCqe, MiniCqeFormat, Syndrome,
};
use crate::hw::mlx5::doorbell::{self, CQ_SET_CI};
use crate::hw::mlx5::{CQE_BYTES, MINI_CQE_BYTES};
use crate::ring::Polled;
use crate::sys::DevMem;
use mempool::{CksumStatus, OffloadFlags};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a CQE says of its packets beyond length, hash and stride (a session's title: of all
/// of them).
#[derive(Debug, Clone, Copy)]
pub(super) struct RxMeta {
    /// Checksum flags.
    pub fl: OffloadFlags,
    /// Whether the device hashed the packets.
    pub hashed: bool,
    /// A stripped VLAN tag.
    pub vlan: Option<u16>,
}

impl RxMeta {
    fn of(c: &Cqe<&[u8]>) -> Self {
        let mut fl = OffloadFlags::empty();
        let ok = c.hds_ip_ext();
        // The device reports good checksums only; a clear bit means "not checked" (§5.1).
        fl.set_rx_ip_cksum(if ok & csum_ok::L3 != 0 {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        fl.set_rx_l4_cksum(if ok & csum_ok::L4 != 0 {
            CksumStatus::Good
        } else {
            CksumStatus::Unknown
        });
        Self {
            fl,
            hashed: c.rx_hash_type() != 0,
            vlan: c.vlan(),
        }
    }
}

/// One packet's completion (from a normal CQE or a mini).
#[derive(Debug, Clone, Copy)]
pub(super) struct RxCompletion {
    /// `byte_cnt`: the length (cyclic RQ), or the packed filler / strides / length word
    /// (striding RQ, §4.2).
    pub byte_cnt: u32,
    /// The RSS hash result (meaningful when `meta.hashed`).
    pub hash: u32,
    /// The stride index where the packet starts (striding RQ), when the completion carries
    /// it: a normal CQE's `wqe_counter`, a CSUM_STRIDX mini's stride index; `None` for HASH
    /// minis.
    pub stride_idx: Option<u16>,
    /// The rest.
    pub meta: RxMeta,
}

/// What [`RxCq::next`] found.
#[derive(Debug, Clone, Copy)]
pub(super) enum RxPolled {
    /// Nothing new.
    Empty,
    /// A packet's (or filler's) completion.
    Packet(RxCompletion),
    /// An error CQE (§5.3), or a format a raw-packet RQ does not produce (data scattered into
    /// the CQE, §9 item 10): the queue drops what the completion stands for.
    Bad {
        /// A syndrome that needs the WQ reset (LOCAL_QP_OP, LOCAL_PROT, WR_FLUSH, §5.3).
        critical: bool,
    },
}

/// A compressed session being handed out.
#[derive(Debug)]
struct Session {
    /// What the title says of every packet.
    meta: RxMeta,
    /// The title's hash (CSUM_STRIDX minis carry none).
    hash: u32,
    /// The title's position (free-running).
    t: u32,
    /// Completions in the session.
    n: u32,
    /// The next mini to hand out.
    next: u32,
}

/// The receive CQ of one RX queue.
#[derive(Debug)]
pub(super) struct RxCq {
    cq: CompletionQueue,
    dbrec: Arc<DevMem>,
    /// The mini format of the CQ's compressed sessions.
    mini: MiniCqeFormat,
    session: Option<Session>,
    /// The `SET_CI` value last written.
    written: u32,
    /// Compressed sessions started.
    pub sessions: u64,
}

impl RxCq {
    /// The CQ `raw`, whose compressed sessions (if any) carry `mini` minis.
    pub fn new(raw: RawCq, mini: MiniCqeFormat) -> Self {
        Self {
            cq: CompletionQueue::new(raw.buf, raw.cqe_cnt),
            dbrec: raw.dbrec,
            mini,
            session: None,
            written: 0,
            sessions: 0,
        }
    }

    /// The consumer index `SET_CI` should hold: the title while a session is being handed
    /// out, else the next entry.
    pub fn ci(&self) -> u32 {
        match &self.session {
            Some(s) => s.t,
            None => self.cq.head(),
        }
    }

    /// The next completion, consumed.
    #[inline]
    pub fn next(&mut self) -> RxPolled {
        if let Some(p) = self.session_next() {
            return p;
        }
        let off = match self.cq.poll() {
            Polled::Entry(off) => off,
            Polled::Empty | Polled::Overflow => return RxPolled::Empty,
        };
        let mut b = [0u8; CQE_BYTES];
        self.cq.read(off, &mut b);
        let c = Cqe::new_checked(&b[..]).expect("64 bytes");
        match (c.opcode(), c.format()) {
            (CqeOpcode::RespSend, CqeFormat::Normal) => RxPolled::Packet(RxCompletion {
                byte_cnt: c.byte_cnt(),
                hash: c.rx_hash_res(),
                stride_idx: Some(c.wqe_counter()),
                meta: RxMeta::of(&c),
            }),
            (CqeOpcode::RespSend, CqeFormat::Compressed) if c.byte_cnt() >= 1 => {
                self.sessions += 1;
                self.session = Some(Session {
                    meta: RxMeta::of(&c),
                    hash: c.rx_hash_res(),
                    t: self.cq.head().wrapping_sub(1),
                    n: c.byte_cnt(),
                    next: 0,
                });
                self.session_next().unwrap_or(RxPolled::Empty)
            }
            (_op, _) => {
                crate::dp_trace!(opcode = ?_op, "rx error completion\n{}", crate::hw::hexdump(&b));
                RxPolled::Bad {
                    critical: matches!(
                        c.syndrome(),
                        Syndrome::LocalQpOp | Syndrome::LocalProt | Syndrome::WrFlush
                    ),
                }
            }
        }
    }

    /// The next mini of the current session, if any; ends the session (its slots poisoned,
    /// the consumer moved past it) when that was its last.
    #[inline]
    fn session_next(&mut self) -> Option<RxPolled> {
        let s = self.session.as_mut()?;
        let (t, n, i, meta, title_hash) = (s.t, s.n, s.next, s.meta, s.hash);
        s.next += 1;
        let (slot, e) = mini_slot(t, i);
        let mut b = [0u8; MINI_CQE_BYTES];
        self.cq
            .mem()
            .read(self.cq.offset_of(slot) + e * MINI_CQE_BYTES, &mut b);
        let mini = MiniCqe::new_checked(&b[..]).expect("8 bytes");
        let (hash, stride_idx) = match self.mini {
            MiniCqeFormat::Hash => (mini.rx_hash_result(), None),
            _ => (title_hash, Some(mini.stride_idx())),
        };
        if i + 1 >= n {
            // Poison the session's slots after the title, then move past them (§6.2).
            for k in 1..n {
                let off = self.cq.offset_of(t.wrapping_add(k));
                self.cq
                    .mem()
                    .write(off + CQE_BYTES - 1, &[op_own(15, 0, false)]);
            }
            self.cq.skip(n - 1);
            self.session = None;
        }
        Some(RxPolled::Packet(RxCompletion {
            byte_cnt: mini.byte_cnt(),
            hash,
            stride_idx,
            meta,
        }))
    }

    /// Writes `SET_CI` (§5.4) if the consumer index moved since the last write.
    #[inline]
    pub fn commit(&mut self) {
        let ci = self.ci();
        if ci != self.written {
            self.dbrec.store_u32(
                CQ_SET_CI,
                u32::from_ne_bytes(doorbell::cq_set_ci(ci)),
                Ordering::Release,
            );
            self.written = ci;
        }
    }
}
