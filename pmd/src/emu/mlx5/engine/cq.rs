//! Writing CQEs as the device does (§5.2, §8 items 11–13): the body first, then `op_own` with
//! the owner bit of the producer's lap, behind a release fence; never more than `cqe_cnt`
//! entries ahead of the consumer's `SET_CI`; and, when turned on, responder completions in
//! compressed sessions of the basic layout (§6.2) with HASH mini CQEs (cyclic RQs) or
//! CSUM_STRIDX mini CQEs (striding RQs, §6.1).
#![deny(unsafe_code)]

use super::{record, CqSpec};
use crate::hw::mlx5::cqe::{mini_slot, Cqe, CqeFields, CqeFormat, MiniCqe, MiniCqeFormat, OP_OWN};
use crate::hw::mlx5::doorbell::CQ_SET_CI;
use crate::hw::mlx5::{CQE_BYTES, MINIS_PER_ARRAY};
use crate::sys::barrier::fence_before_owner_write;
use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct Cq {
    pub buf: Arc<DevMem>,
    pub cqe_cnt: u32,
    pub dbrec: Arc<DevMem>,
    pub cqn: u32,
    /// The producer counter (free-running; entries written, session slots included).
    pi: u32,
    /// Compressed sessions of at most this many completions (`None`: off).
    max_session: Option<u32>,
    /// What the minis carry besides the byte count.
    mini: MiniCqeFormat,
    /// The responder completions of the session being gathered.
    session: Vec<CqeFields>,
    /// Compressed sessions written.
    pub sessions: u64,
}

impl Cq {
    pub fn new(spec: CqSpec) -> Self {
        Self {
            buf: spec.buf,
            cqe_cnt: spec.cqe_cnt,
            dbrec: spec.dbrec,
            cqn: spec.cqn,
            pi: 0,
            max_session: None,
            mini: MiniCqeFormat::Hash,
            session: Vec::new(),
            sessions: 0,
        }
    }

    /// Compressed sessions of at most `max` completions (and at most the ring) with `mini`
    /// minis (HASH or CSUM_STRIDX), or none.
    pub fn set_compression(&mut self, max: Option<u32>, mini: MiniCqeFormat) {
        self.flush();
        self.mini = mini;
        self.max_session = max.map(|m| m.min(self.cqe_cnt));
        self.session = Vec::with_capacity(self.max_session.unwrap_or(0) as usize);
    }

    /// Entries the device may still write: `cqe_cnt` minus how far the producer is ahead of
    /// `SET_CI` (§5.4), completions gathered for a session counted as written. `SET_CI` is
    /// 24 bits; a CQ of at most 2^15 entries is compared modulo 2^16, so DPDK's TX path,
    /// which writes a 16-bit counter, is understood too (§8 item 12).
    pub fn room(&self) -> u32 {
        let ci = record(&self.dbrec, CQ_SET_CI);
        let mask = if self.cqe_cnt <= 1 << 15 {
            0xffff
        } else {
            0x00ff_ffff
        };
        let ahead = self.pi.wrapping_sub(ci) & mask;
        self.cqe_cnt
            .saturating_sub(ahead)
            .saturating_sub(self.session.len() as u32)
    }

    /// Writes one normal CQE now (flushing a gathered session first, so the CQ stays in
    /// order); returns the entries written.
    pub fn write(&mut self, f: &CqeFields) -> usize {
        let n = self.flush();
        self.write_at(self.pi, f);
        self.pi = self.pi.wrapping_add(1);
        n + 1
    }

    /// A responder completion: written now, or gathered into the compressed session when
    /// compression is on (the session is written when an unlike completion comes, when it
    /// is full, or at [`flush`](Cq::flush)). Returns the entries written now.
    pub fn push_rx(&mut self, f: &CqeFields) -> usize {
        let Some(max) = self.max_session else {
            return self.write(f);
        };
        let mut n = 0;
        if let Some(first) = self.session.first() {
            let last = self.session[self.session.len() - 1];
            if self.session.len() as u32 >= max || !compressible(self.mini, first, &last, f) {
                n += self.flush();
            }
        }
        self.session.push(*f);
        if self.session.len() as u32 >= max {
            n += self.flush();
        }
        n
    }

    /// Writes the gathered session, if any: a normal CQE for a single completion (sessions
    /// have at least 2, §6.2), else the mini-CQE arrays then the title. Returns the entries
    /// written.
    pub fn flush(&mut self) -> usize {
        let n = self.session.len() as u32;
        match n {
            0 => 0,
            1 => {
                let f = self.session[0];
                self.session.clear();
                self.write_at(self.pi, &f);
                self.pi = self.pi.wrapping_add(1);
                1
            }
            _ => {
                let t = self.pi;
                // Arrays first (§6.2: array 0 at t + 1, array k at t + 8k, each a whole slot
                // of 8 minis, byte 63 included); slots between them are holes, not written.
                for k in 0..n.div_ceil(MINIS_PER_ARRAY as u32) {
                    let (slot, _) = mini_slot(t, k * MINIS_PER_ARRAY as u32);
                    let mut arr = [0u8; CQE_BYTES];
                    let mut view = Cqe::new_checked(&mut arr[..]).expect("64-byte buffer");
                    for i in 0..MINIS_PER_ARRAY as u32 {
                        let m = k * MINIS_PER_ARRAY as u32 + i;
                        if let Some(f) = self.session.get(m as usize) {
                            let word0 = match self.mini {
                                MiniCqeFormat::Hash => f.rx_hash_res,
                                // The model computes no raw checksum (CQE bytes 20–21 are 0).
                                _ => MiniCqe::<&[u8]>::stridx_word(0, f.wqe_counter),
                            };
                            view.set_mini(i as usize, word0, f.byte_cnt);
                        }
                    }
                    self.buf.write(self.offset(slot), &arr);
                }
                // Then the title: packet 0's CQE with format 3 and byte_cnt = n.
                let mut title = self.session[0];
                title.format = u8::from(CqeFormat::Compressed);
                title.byte_cnt = n;
                self.write_at(t, &title);
                self.pi = t.wrapping_add(n);
                self.session.clear();
                self.sessions += 1;
                n as usize
            }
        }
    }

    fn offset(&self, counter: u32) -> usize {
        (counter & (self.cqe_cnt - 1)) as usize * CQE_BYTES
    }

    /// Writes `f` at producer counter `at` with the owner bit of its lap (§5.2): bytes 0–59,
    /// a release fence, then bytes 60–63 (`wqe_counter`, signature, `op_own`) as one aligned
    /// 32-bit store (§8 item 11).
    fn write_at(&self, at: u32, f: &CqeFields) {
        let mut body = [0u8; CQE_BYTES];
        let mut c = Cqe::new_checked(&mut body[..]).expect("64-byte buffer");
        let mut f = *f;
        // The lap's parity: `at / cqe_cnt`, a power of two.
        f.owner = (at >> self.cqe_cnt.trailing_zeros()) & 1 == 1;
        c.write(&f);
        let off = self.offset(at);
        self.buf.write_dwords(off, &body[..60]);
        fence_before_owner_write();
        let tail = [body[60], body[61], body[62], body[OP_OWN]];
        self.buf
            .store_u32(off + 60, u32::from_ne_bytes(tail), Ordering::Release);
    }
}

/// Whether `f` may join a session that starts with `first` and ends with `last`: the same
/// in every field the title carries for all, and, with HASH minis (cyclic RQ), the next WQE of
/// the same RQ (the decompressor derives mini `i`'s WQE counter as the title's + `i`, §6.2).
/// CSUM_STRIDX minis carry the stride index but no hash, so the hash must match too.
/// Timestamps differ and are not compared: minis carry none, which is why DPDK turns
/// compression off when it wants them.
fn compressible(mini: MiniCqeFormat, first: &CqeFields, last: &CqeFields, f: &CqeFields) -> bool {
    let key = |c: &CqeFields| {
        (
            c.opcode,
            c.rx_hash_type,
            c.hds_ip_ext,
            c.l4_l3_hdr_type,
            c.vlan_info,
            c.qpn,
            c.syndrome,
        )
    };
    key(first) == key(f)
        && match mini {
            MiniCqeFormat::Hash => f.wqe_counter == last.wqe_counter.wrapping_add(1),
            _ => f.rx_hash_res == first.rx_hash_res,
        }
}
