//! The send doorbell as the device sees it: the 8-byte store to the SQ's UAR register (its
//! BlueFlame register, `bf.reg`), which carries the first 8 bytes of the last posted WQE's
//! control segment (§3.1 step 5, §8 item 2). rdma-core (`providers/mlx5/qp.c`,
//! `post_send_db`: the record `qp->db[MLX5_SND_DBR]`, then `mmio_write64_be(bf->reg +
//! bf->offset, ctrl)`), Linux (`mlx5e_notify_hw`: `*wq->db = pc`, `wmb()`,
//! `mlx5_write64(ctrl, uar_map)`) and DPDK (`mlx5_doorbell_ring` in
//! `drivers/common/mlx5/mlx5_common.h`, called by the TX burst with the last WQE's first
//! 8 bytes and `wqe_ci`) all write the SQ doorbell record first and this register second.
//!
//! On a ConnectX the register write is an event that starts the SQ; the record is where the
//! device reads the producer counter from. The model follows both:
//!
//! * A doorbell names a WQE: the index in `opmod_idx_opcode` bits 23:8 and the SQ in `qpn_ds`
//!   bits 31:8 (§2.2); its end is that index plus `ceil(ds / 4)` WQEBBs.
//! * It is refused, counted in [`ModelStats::tx_bad_doorbells`](super::ModelStats), and does
//!   nothing when no SQ of that number uses the register, when the WQE it names is not one
//!   the doorbell record announces and the device has yet to consume (the record, read after
//!   the doorbell with acquire ordering, must cover its end, and the end may not lie more
//!   than a ring ahead of the device's counter), or when the WQE at that index in the ring
//!   does not start with the same 8 bytes. The last check is the model's strict reading of
//!   §8 item 2 ("optionally assert"): DPDK's packet-pacing rearm queue
//!   (`mlx5_txpp_doorbell_rearm_queue`) rings values whose index differs from the ring's
//!   WQEs, so hardware may not compare; no Ethernet SQ driver does that.
//! * An SQ in RESET ignores doorbells (the device does not look at it, §1.5); they are not
//!   counted.
//! * Otherwise the SQ may consume WQEs up to the end of the WQE named (never backwards). So a
//!   record write without a register write starts nothing, and a register write without
//!   the record covering its WQE neither: both are required. The WQEs of rdma-core, DPDK
//!   and our driver end exactly at the record, so for them this is "up to the record";
//!   stopping at the WQE named, rather than reading on to wherever the record has got to
//!   when the model samples, keeps a later doorbell from naming a WQE consumed already.
//!
//! Sampling: the model only sees memory. It watches 8 bytes at the start of each half of
//! every register its SQs use (rdma-core alternates the halves of a BlueFlame register,
//! `bf->offset ^= bf->buf_size`, §3.2; DPDK and our driver write the first; a BlueFlame copy
//! of the whole WQE starts with the same 8 bytes), and samples each at the start of every
//! step and, for one SQ, on its kick. A value it has not seen yet is a doorbell. Consequences,
//! deviations of the model, stated also in the module docs of [`crate::emu::mlx5`]:
//! * Two doorbells into one slot between two samples leave only the last. For one SQ the
//!   last covers the earlier (it names a later WQE and the record is cumulative). For a
//!   register shared by several SQs (rdma-core hands out shared registers once the
//!   dedicated ones are used up, and under `MLX5_SHUT_UP_BF` every QP shares one), another
//!   SQ's write can hide an SQ's doorbell until that SQ's next doorbell; a driver that
//!   posts and then waits without ringing again would stall on the model where hardware
//!   would not (as for the MANA model's shared doorbell page).
//! * The same value written twice in a row is one doorbell. Two doorbells of one SQ differ,
//!   since each names a WQE at least one WQEBB and at most a ring (≤ 2^15 WQEBBs, a 16-bit
//!   index) after the previous; only the restart of the counters at RESET brings an old
//!   value back, so [`Engine::forget_uar`] clears the SQ's value from its register at RESET
//!   (a compare-and-swap to 0, so a sibling's newer write is kept) and the first doorbell
//!   after RTS is seen even if it repeats the last one before RESET byte for byte.
#![deny(unsafe_code)]

use super::{record, Engine, EngineError, HwQueueState};
use crate::hw::mlx5::doorbell::SND_DBR;
use crate::hw::mlx5::wqe::{CtrlSeg, SEG_BYTES};
use crate::hw::mlx5::{wqebbs, WQEBB_BYTES};
use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes of the UAR doorbell write (§3.1 step 5).
pub const UAR_WRITE_BYTES: usize = 8;

/// An SQ's UAR register as the engine is given it: the register's memory and the size of
/// one BlueFlame half (0: a doorbell-only register with one slot, §1.7).
#[derive(Debug, Clone)]
pub(crate) struct UarReg {
    pub mem: Arc<DevMem>,
    pub half: usize,
}

impl UarReg {
    /// The byte offsets sampled: the start of each half.
    fn offsets(&self) -> impl Iterator<Item = usize> {
        std::iter::once(0).chain((self.half > 0).then_some(self.half))
    }

    /// Checks that every slot is in the memory and 8-byte aligned.
    pub fn check(&self, sqn: u32) -> Result<(), EngineError> {
        let ok = self.mem.addr().is_multiple_of(UAR_WRITE_BYTES)
            && self.half.is_multiple_of(UAR_WRITE_BYTES)
            && self.half + UAR_WRITE_BYTES <= self.mem.len();
        if ok {
            Ok(())
        } else {
            Err(EngineError::UarRegister {
                id: sqn,
                addr: self.mem.addr(),
                bytes: self.mem.len(),
                half: self.half,
            })
        }
    }
}

/// One 8-byte slot the engine samples, shared by every SQ whose register holds it.
pub(crate) struct UarSlot {
    mem: Arc<DevMem>,
    off: usize,
    /// The last value seen (only a new value is a doorbell).
    last: u64,
    /// SQs of this engine using the slot.
    users: usize,
}

impl UarSlot {
    fn addr(&self) -> usize {
        self.mem.addr() + self.off
    }

    fn load(&self) -> u64 {
        // Acquire: the driver's record store (and its WQEs) before its register store are
        // visible once the value is (its barrier precedes the store, §3.1 step 4).
        self.mem.load_u64(self.off, Ordering::Acquire)
    }
}

/// What a doorbell value says (§2.2: the control segment's first two big-endian dwords).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Doorbell {
    index: u16,
    qpn: u32,
    bbs: u16,
}

fn decode(v: u64) -> Doorbell {
    let mut b = [0u8; SEG_BYTES];
    b[..UAR_WRITE_BYTES].copy_from_slice(&v.to_ne_bytes());
    let c = CtrlSeg::new_checked(&b[..]).expect("a whole segment");
    Doorbell {
        index: c.wqe_index(),
        qpn: c.qpn(),
        bbs: wqebbs(usize::from(c.ds())).max(1) as u16,
    }
}

impl Engine {
    /// Starts sampling the slots of `reg` for a new SQ (or counts one more user of them). A
    /// slot new to the engine starts from its current contents: what a register held before
    /// (a previous QP's last doorbell) is not an event.
    pub(super) fn watch_uar(&mut self, reg: &UarReg) {
        for off in reg.offsets() {
            let addr = reg.mem.addr() + off;
            if let Some(s) = self.uars.iter_mut().find(|s| s.addr() == addr) {
                s.users += 1;
                continue;
            }
            let mut s = UarSlot {
                mem: Arc::clone(&reg.mem),
                off,
                last: 0,
                users: 1,
            };
            s.last = s.load();
            self.uars.push(s);
        }
    }

    /// One SQ fewer on `reg`'s slots; a slot is dropped (and its memory with it) with its
    /// last user.
    pub(super) fn unwatch_uar(&mut self, reg: &UarReg) {
        for off in reg.offsets() {
            let addr = reg.mem.addr() + off;
            if let Some(i) = self.uars.iter().position(|s| s.addr() == addr) {
                self.uars[i].users -= 1;
                if self.uars[i].users == 0 {
                    self.uars.swap_remove(i);
                }
            }
        }
    }

    /// Samples every slot and takes each new value as a doorbell.
    pub(super) fn scan_uars(&mut self) {
        for s in 0..self.uars.len() {
            self.sample_uar(s);
        }
    }

    /// Samples the slots of SQ `i`'s register only (its kick); a value there may be a
    /// sibling's doorbell, which goes to the sibling.
    pub(super) fn scan_uar_of(&mut self, i: usize) {
        let reg = self.sqs[i].uar.clone();
        for off in reg.offsets() {
            let addr = reg.mem.addr() + off;
            if let Some(s) = self.uars.iter().position(|s| s.addr() == addr) {
                self.sample_uar(s);
            }
        }
    }

    /// Slot `s`: a value not seen yet is a doorbell.
    fn sample_uar(&mut self, s: usize) {
        let v = self.uars[s].load();
        if v == self.uars[s].last {
            return;
        }
        self.uars[s].last = v;
        let addr = self.uars[s].addr();
        let d = decode(v);
        let sq = self.sqs.iter().position(|q| {
            q.sqn == d.qpn && q.uar.offsets().any(|off| q.uar.mem.addr() + off == addr)
        });
        match sq {
            Some(i) => self.doorbell(i, d, v),
            None => self.bad_doorbell(v, "for no SQ of its register"),
        }
    }

    /// A doorbell `d` (raw value `v`) for SQ `i`: checked against the record and the ring,
    /// then the SQ may consume up to the end of the WQE it names.
    fn doorbell(&mut self, i: usize, d: Doorbell, v: u64) {
        let q = &self.sqs[i];
        if q.state == HwQueueState::Reset {
            tracing::debug!(target: "pmd::emu", sqn = q.sqn, value = v, "doorbell for an SQ in RESET: ignored");
            return;
        }
        // Read after the doorbell (the sample's acquire): the driver wrote it before.
        let rec = record(&q.dbrec, SND_DBR) as u16;
        let announced = u32::from(rec.wrapping_sub(q.ci));
        let at = u32::from(d.index.wrapping_sub(q.ci));
        let end = at + u32::from(d.bbs);
        if at >= announced || end > announced || end > q.wqe_cnt {
            return self.bad_doorbell(v, "naming a WQE the record does not announce");
        }
        let mut head = [0u8; UAR_WRITE_BYTES];
        let slot = u32::from(d.index) & (q.wqe_cnt - 1);
        q.buf.read(slot as usize * WQEBB_BYTES, &mut head);
        if head != v.to_ne_bytes() {
            return self.bad_doorbell(v, "unlike the WQE it names");
        }
        // Never backwards: a sample may take two halves' doorbells in either order.
        if end > u32::from(q.db_tail.wrapping_sub(q.ci)) {
            self.sqs[i].db_tail = d.index.wrapping_add(d.bbs);
        }
    }

    fn bad_doorbell(&mut self, v: u64, why: &'static str) {
        self.stats.tx_bad_doorbells += 1;
        let d = decode(v);
        tracing::debug!(target: "pmd::emu", qpn = d.qpn, index = d.index, value = v, why, "UAR doorbell refused");
    }

    /// At SQ `i`'s RESET: takes a doorbell still unsampled in its register first, then
    /// clears the register's value where it is the SQ's, so that a doorbell after RTS that
    /// repeats it (the counters restart at 0) is a new value (see the module docs).
    pub(super) fn forget_uar(&mut self, i: usize) {
        self.scan_uar_of(i);
        let reg = self.sqs[i].uar.clone();
        let sqn = self.sqs[i].sqn;
        for off in reg.offsets() {
            let addr = reg.mem.addr() + off;
            let Some(s) = self.uars.iter().position(|s| s.addr() == addr) else {
                continue;
            };
            let v = self.uars[s].last;
            if decode(v).qpn == sqn && reg.mem.compare_exchange_u64(off, v, 0).is_ok() {
                self.uars[s].last = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::mlx5::engine::{CqSpec, SqSpec};
    use crate::emu::wire::NoWire;
    use crate::hw::mlx5::doorbell::sq_record;
    use crate::hw::mlx5::wqe::CE_ALWAYS;
    use crate::hw::mlx5::{Opcode, CQE_BYTES};

    const WQE_CNT: u32 = 16;
    const HALF: usize = 256;

    fn mem(bytes: usize) -> Arc<DevMem> {
        Arc::new(DevMem::anon(bytes).unwrap())
    }

    /// The driver's side of one SQ: NOP WQEs with CE = ALWAYS (one CQE each).
    struct Driver {
        buf: Arc<DevMem>,
        dbrec: Arc<DevMem>,
        uar: Arc<DevMem>,
        sqn: u32,
        pi: u16,
    }

    impl Driver {
        /// A NOP at `pi` (ds 1, one WQEBB); its doorbell value.
        fn post(&mut self) -> u64 {
            let mut w = [0u8; WQEBB_BYTES];
            CtrlSeg::new_checked(&mut w[..SEG_BYTES]).unwrap().write(
                Opcode::Nop,
                0,
                self.pi,
                self.sqn,
                1,
                CE_ALWAYS,
            );
            let slot = usize::from(self.pi) & (WQE_CNT as usize - 1);
            self.buf.write(slot * WQEBB_BYTES, &w);
            self.pi = self.pi.wrapping_add(1);
            u64::from_ne_bytes(w[..8].try_into().unwrap())
        }
        fn record(&self) {
            self.dbrec.store_u32(
                SND_DBR,
                u32::from_ne_bytes(sq_record(u32::from(self.pi))),
                Ordering::Release,
            );
        }
        fn uar(&self, off: usize, v: u64) {
            self.uar.ring_doorbell(off, v);
        }
        /// The whole doorbell: the record, then the register.
        fn ring(&self, v: u64) {
            self.record();
            self.uar(0, v);
        }
    }

    fn sq_on(e: &mut Engine, sqn: u32, uar: &Arc<DevMem>, half: usize) -> Driver {
        let d = Driver {
            buf: mem(WQE_CNT as usize * WQEBB_BYTES),
            dbrec: mem(8),
            uar: Arc::clone(uar),
            sqn,
            pi: 0,
        };
        e.add_sq(SqSpec {
            buf: Arc::clone(&d.buf),
            wqe_cnt: WQE_CNT,
            sqn,
            dbrec: Arc::clone(&d.dbrec),
            uar: Arc::clone(uar),
            bf_size: half as u32,
            min_inline: 0,
            cq: CqSpec {
                buf: mem(64 * CQE_BYTES),
                cqe_cnt: 64,
                dbrec: mem(8),
                cqn: sqn + 0x1000,
            },
        })
        .unwrap();
        d
    }

    fn world() -> (Engine, Driver) {
        let mut e = Engine::new(Box::new(NoWire));
        let uar = mem(2 * HALF);
        let d = sq_on(&mut e, 0x12, &uar, HALF);
        (e, d)
    }

    /// The record alone starts nothing (the old model's trigger); the register write then
    /// starts the WQEs the record announced.
    #[test]
    fn a_record_without_the_uar_write_starts_nothing() {
        let (mut e, mut d) = world();
        d.post();
        let v1 = d.post();
        d.record();
        assert_eq!(e.step(), 0);
        assert_eq!(e.stats().tx_wqes, 0);
        d.uar(0, v1);
        assert_eq!(e.step(), 2);
        assert_eq!((e.stats().tx_wqes, e.stats().tx_bad_doorbells), (2, 0));
    }

    /// A value naming a WQE past the record, another SQ, or a WQE whose first 8 bytes in the
    /// ring differ is counted once and starts nothing; the right value then does.
    #[test]
    fn a_uar_write_the_ring_or_record_does_not_back_is_counted_and_ignored() {
        let (mut e, mut d) = world();
        let v = d.post();
        d.record();
        let edit = |v: u64, at: usize, bytes: &[u8]| {
            let mut b = v.to_ne_bytes();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            u64::from_ne_bytes(b)
        };
        let bad = [
            edit(v, 1, &1u16.to_be_bytes()),             // WQE 1: past the record
            edit(v, 1, &(WQE_CNT as u16).to_be_bytes()), // WQE 0's slot a lap later
            edit(v, 4, &0x13u32.to_be_bytes()[1..]),     // no SQ 0x13 on this register
            edit(v, 7, &[2]),                            // WQE 0, but ds 2
            edit(v, 3, &[u8::from(Opcode::Send)]),       // WQE 0, but a SEND
        ];
        for (n, value) in bad.into_iter().enumerate() {
            d.uar(0, value);
            e.step();
            e.step();
            assert_eq!(e.stats().tx_bad_doorbells, n as u64 + 1, "value {value:#x}");
            assert_eq!(e.stats().tx_wqes, 0);
        }
        d.uar(0, v);
        e.step();
        assert_eq!((e.stats().tx_wqes, e.stats().tx_bad_doorbells), (1, 5));
    }

    /// A doorbell naming an earlier WQE than the record's last starts the WQEs up to it
    /// only; the rest wait for a doorbell naming them.
    #[test]
    fn a_doorbell_starts_the_wqes_up_to_the_one_it_names() {
        let (mut e, mut d) = world();
        let v0 = d.post();
        let v1 = d.post();
        d.ring(v0);
        assert_eq!(e.step(), 1);
        assert_eq!(e.step(), 0);
        d.uar(0, v1);
        assert_eq!(e.step(), 1);
        assert_eq!(e.stats().tx_bad_doorbells, 0);
    }

    /// The register written before the record covers the WQE: refused, and the record
    /// written afterwards starts nothing either.
    #[test]
    fn a_uar_write_before_the_record_is_refused() {
        let (mut e, mut d) = world();
        let v = d.post();
        d.uar(0, v);
        e.step();
        d.record();
        e.step();
        assert_eq!((e.stats().tx_wqes, e.stats().tx_bad_doorbells), (0, 1));
    }

    /// Two doorbells between samples: the last names the later WQE and covers both; a
    /// doorbell in the other BlueFlame half counts as well.
    #[test]
    fn the_last_of_two_doorbells_covers_both_and_either_half_rings() {
        let (mut e, mut d) = world();
        let v = d.post();
        d.ring(v);
        let v = d.post();
        d.ring(v);
        assert_eq!(e.step(), 2);
        let v = d.post();
        d.record();
        d.uar(HALF, v);
        assert_eq!(e.step(), 1);
        assert_eq!((e.stats().tx_wqes, e.stats().tx_bad_doorbells), (3, 0));
    }

    /// Two SQs on one register (a shared BlueFlame register): each doorbell goes to the SQ
    /// it names; one overwritten before the sample waits for that SQ's next doorbell.
    #[test]
    fn a_shared_register_dispatches_by_qpn() {
        let mut e = Engine::new(Box::new(NoWire));
        let uar = mem(8);
        let mut a = sq_on(&mut e, 0x21, &uar, 0);
        let mut b = sq_on(&mut e, 0x22, &uar, 0);
        let va = a.post();
        a.ring(va);
        assert_eq!(e.step(), 1);
        let vb = b.post();
        b.ring(vb);
        assert_eq!(e.step(), 1);
        // a's doorbell hidden by b's: only b's WQE goes.
        let va = a.post();
        a.ring(va);
        let vb = b.post();
        b.ring(vb);
        assert_eq!(e.step(), 1);
        let va = a.post();
        a.ring(va);
        assert_eq!(e.step(), 2);
        assert_eq!((e.stats().tx_wqes, e.stats().tx_bad_doorbells), (5, 0));
        e.remove_sq(0x21).unwrap();
        e.remove_sq(0x22).unwrap();
        assert!(e.uars.is_empty());
    }

    /// RESET → RTS restarts the counters: the first doorbell after it repeats the last one
    /// before it byte for byte, and is still seen. A doorbell while in RESET is ignored.
    #[test]
    fn the_same_doorbell_after_a_reset_still_rings() {
        let (mut e, mut d) = world();
        let v = d.post();
        d.ring(v);
        assert_eq!(e.step(), 1);
        e.sq_to_reset(0x12).unwrap();
        d.pi = 0;
        let again = d.post();
        assert_eq!(again, v);
        d.ring(again);
        assert_eq!(e.step(), 0, "an SQ in RESET is not read");
        e.sq_to_rts(0x12).unwrap();
        e.step();
        assert_eq!(
            e.stats().tx_wqes,
            1,
            "the doorbell rung in RESET went unheard"
        );
        e.sq_to_reset(0x12).unwrap();
        e.sq_to_rts(0x12).unwrap();
        d.pi = 0;
        let again = d.post();
        d.ring(again);
        assert_eq!(e.step(), 1);
        assert_eq!((e.stats().tx_wqes, e.stats().tx_bad_doorbells), (2, 0));
    }
}
