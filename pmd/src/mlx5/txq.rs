//! mlx5 TX queue: SEND and TSO WQEs straight into the SQ ring (WQEBBs of 64 bytes, wrapping
//! like any other WQE, §2.1), the doorbell record then the 8-byte UAR write once per burst
//! (§3.1), and completion moderation (§2.8): only the last WQE a burst posted asks for a
//! CQE, and only once 32 packets were queued since the previous request or the rings could
//! not take another WQE; a CQE for WQE index `w` completes every WQE up to and including `w`.
//!
//! Where the device needs no inline header, runs of single-segment packets with the same
//! checksum flags go out in enhanced multi-packet WQEs (eMPW, §2.7): one title (control and
//! Ethernet segments) and one pointer descriptor per packet, at most 32 packets; the others
//! (multi-segment, TSO, VLAN insertion) as SEND or TSO WQEs.
//!
//! The inline header: the device's minimum (`RawSq::min_inline`, 18 on ConnectX-4, §1.9) is
//! copied into the Ethernet segment; a VLAN tag to insert goes into that copy in software
//! (making it 18 bytes at least) when the queue inlines, or to the Ethernet segment's VLAN
//! command otherwise. TSO inlines the whole L2–L4 header.
#![deny(unsafe_code)]

use super::cq::CompletionQueue;
use super::provider::SetupError;
use super::provider::{QueueState, RawSq};
use super::xstats::TxXstats;
use crate::ethdev::{counters, kick, Burst, Counters, Kick, QueueOwner, TxBurst};
use crate::hw::mlx5::cqe::{Cqe, CqeOpcode};
use crate::hw::mlx5::doorbell::{self, SND_DBR};
use crate::hw::mlx5::wqe::{
    data_seg_words, eth_seg_units, CtrlSeg, DataSeg, EthSeg, CE_ALWAYS, CE_FIRST_ERROR, CS_L3,
    CS_L4, SEG_BYTES,
};
use crate::hw::mlx5::{
    wqebbs, Opcode, CQE_BYTES, DPDK_MAX_DS, DS_BYTES, DS_PER_WQEBB, WQEBB_BYTES,
};
use crate::ring::{Polled, WorkQueue};
use crate::sys::barrier::{mmio_flush_writes, udma_to_device_barrier};
use crate::sys::{DevMem, Mmio};
use mempool::lcache::with_cache;
use mempool::{ChunkKeys, Iova, Mbuf, MbufFifo, MbufPool, OffloadFlags};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Packets queued between two completion requests (`MLX5_TX_COMP_THRESH`, §2.8).
pub const COMP_THRESH: u32 = 32;
/// Inline bytes a software-inserted VLAN tag needs: 12 MAC bytes, the 4-byte tag, the
/// EtherType (§2.3).
const VLAN_INLINE: usize = 18;
/// The offload flags an eMPW WQE's packets must share.
const EMPW_FLAGS: OffloadFlags = OffloadFlags::from_bits_retain(
    OffloadFlags::TX_TCP_SEG.bits()
        | OffloadFlags::TX_VLAN.bits()
        | OffloadFlags::TX_IP_CKSUM.bits()
        | OffloadFlags::TX_TCP_CKSUM.bits()
        | OffloadFlags::TX_UDP_CKSUM.bits(),
);
/// Most packets in one eMPW WQE (`MLX5_EMPW_MAX_PACKETS`, §2.7).
pub const EMPW_MAX: usize = 32;
/// WQEBBs of the largest WQE the queue builds ([`DPDK_MAX_DS`] units).
const MAX_WQE_BBS: u32 = wqebbs(DPDK_MAX_DS) as u32;
/// Largest TSO header (`MLX5_MAX_TSO_HEADER`).
const MAX_TSO_HEADER: usize = 192;
/// Bursts a queue whose recovery failed lets pass before it tries again (each try is a
/// device call or two).
pub const RECOVERY_RETRY_BURSTS: u32 = 1024;

/// A completion requested (CE = ALWAYS on WQE `wqe`): when its CQE arrives, the SQ is
/// consumed up to `wq_head` and the descriptors up to `desc_head` (free-running counters as
/// they were when the request was made).
#[derive(Debug, Clone, Copy, Default)]
struct Req {
    wqe: u16,
    wq_head: u32,
    desc_head: u32,
    /// Bytes of the packets posted since the previous request, up to this one.
    bytes: u64,
}

/// An mlx5 TX queue, owned by one core.
pub struct TxQueue {
    wq: WorkQueue,
    cq: CompletionQueue,
    cq_dbrec: Arc<DevMem>,
    dbrec: Arc<DevMem>,
    bf_reg: Mmio,
    sqn: u32,
    min_inline: usize,
    /// Single-segment packets go out in enhanced multi-packet WQEs (§2.7): only where the
    /// device needs no inline header.
    empw: bool,
    /// The packets in flight, in posting order (freed in bulk by completions).
    desc: MbufFifo,
    /// The WQEs in flight, oldest at `wqe_tail`: each one's index (its first WQEBB) and the
    /// position in `desc` of its first packet (an eMPW WQE carries several). Only an error
    /// completion reads them, to tell the failed WQE's packets from those sent before it.
    wqes: Box<[(u16, u32)]>,
    wqe_head: u32,
    wqe_tail: u32,
    /// Completion requests in flight, oldest at `req_tail` (each covers at least one
    /// descriptor, so there are never more than descriptors).
    reqs: Box<[Req]>,
    req_head: u32,
    req_tail: u32,
    /// Packets queued since the last completion request, and their bytes.
    unrequested: u32,
    unrequested_bytes: u64,
    pool: Arc<MbufPool>,
    keys: ChunkKeys,
    counters: Arc<Counters>,
    xstats: Arc<TxXstats>,
    /// The QP's state machine, for error recovery.
    state: Arc<dyn QueueState>,
    /// A recovery failed: the queue takes no packets and tries again in `retry_in` bursts.
    down: bool,
    retry_in: u32,
    /// A failed recovery was logged (once per queue).
    warned: bool,
    _owner: QueueOwner,
    /// The device's work on this thread (a device model's inline engine; `None` on hardware).
    kick: Kick,
    done: Vec<Mbuf>,
    /// The current burst in runs, in order: this many packets went out in the WQE at this
    /// index (an eMPW WQE carries several), or were dropped (`None`).
    posted: Vec<(u32, Option<u16>)>,
    wqe: [u8; DPDK_MAX_DS * DS_BYTES + WQEBB_BYTES],
    /// An inline header with a VLAN tag put in (TSO headers and the device's minimum).
    vlan_hdr: [u8; MAX_TSO_HEADER],
    /// Where the frames in flight go when the queue drops (last field: after `state` and
    /// `_owner`, which hold the QP).
    parked: Arc<crate::ethdev::Parked>,
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mlx5::TxQueue(sq {:#x}, {} in flight)",
            self.sqn,
            self.desc.len()
        )
    }
}

/// What [`TxQueue::post_empw`] did.
enum Empw {
    /// An eMPW WQE with this many packets went out; the first 8 bytes of its control segment
    /// (for the doorbell).
    Posted {
        pkts: usize,
        bytes: u64,
        ctrl: [u8; 8],
    },
    /// The first packet cannot go in an eMPW WQE.
    NotEligible,
    /// The SQ is full.
    NoRoom,
}

enum Build {
    /// A WQE of this many bytes (whole WQEBBs) is in `self.wqe`.
    Wqe(usize),
    /// Unsendable: freed and counted.
    Drop,
}

impl TxQueue {
    /// A TX queue over `raw` with room for `nb_desc` packets in flight (a power of two, at
    /// most the ring's WQEBBs), sending mbufs of `pool` whose chunks `keys` registered.
    ///
    /// # Panics
    /// If `nb_desc` is not a power of two, or the ring or CQ is smaller than the spec allows.
    pub fn new(
        raw: RawSq,
        nb_desc: u16,
        pool: Arc<MbufPool>,
        keys: ChunkKeys,
        counters: Arc<Counters>,
        xstats: Arc<TxXstats>,
    ) -> Self {
        let n = u32::from(nb_desc);
        assert!(
            n.is_power_of_two()
                && raw.wqe_cnt >= n
                && raw.buf.len() >= raw.wqe_cnt as usize * WQEBB_BYTES,
            "tx ring of {n} needs an SQ of at least {n} WQEBBs"
        );
        Self {
            wq: WorkQueue::new(Arc::clone(&raw.buf), WQEBB_BYTES),
            cq: CompletionQueue::new(Arc::clone(&raw.cq.buf), raw.cq.cqe_cnt),
            cq_dbrec: raw.cq.dbrec,
            dbrec: raw.dbrec,
            bf_reg: raw.bf_reg,
            sqn: raw.sqn,
            min_inline: usize::from(raw.min_inline),
            empw: raw.min_inline == 0,
            desc: MbufFifo::new(&pool, n),
            wqes: vec![(0, 0); n as usize].into_boxed_slice(),
            wqe_head: 0,
            wqe_tail: 0,
            reqs: vec![Req::default(); n as usize].into_boxed_slice(),
            req_head: 0,
            req_tail: 0,
            unrequested: 0,
            unrequested_bytes: 0,
            pool,
            keys,
            counters,
            xstats,
            state: raw.state,
            down: false,
            retry_in: 0,
            warned: false,
            _owner: raw.owner,
            parked: raw.parked,
            kick: raw.kick,
            done: Vec::with_capacity(n as usize),
            posted: Vec::with_capacity(n as usize),
            wqe: [0; DPDK_MAX_DS * DS_BYTES + WQEBB_BYTES],
            vlan_hdr: [0; MAX_TSO_HEADER],
        }
    }

    /// Packets handed to the device and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.desc.len()
    }

    /// Processes completions: frees every packet up to each completed WQE; after an error
    /// CQE, recovers the queue (RESET, drain, counters to 0, RTS; see `DESIGN.md`). Returns
    /// the CQEs consumed.
    pub fn reclaim(&mut self) -> u32 {
        let (n, failed) = self.complete();
        if failed {
            self.recover();
        }
        n
    }

    /// Whether a recovery failed and the queue takes no packets until a retry succeeds.
    pub fn is_down(&self) -> bool {
        self.down
    }

    /// Consumes CQEs up to the first error CQE (included): frees every packet up to each
    /// completed WQE, counts the failed WQE's packets as errors. Returns the CQEs consumed
    /// and whether an error CQE was among them.
    fn complete(&mut self) -> (u32, bool) {
        let mut n = 0u32;
        let mut failed = false;
        while !self.desc.is_empty() {
            let off = match self.cq.poll() {
                Polled::Entry(off) => off,
                Polled::Empty | Polled::Overflow => break,
            };
            // A requester CQE's last 8 bytes say all: SQ number, WQE counter, op_own (§5.1).
            let mut tail = [0u8; 8];
            self.cq.read(off + CQE_BYTES - 8, &mut tail);
            n += 1;
            if CqeOpcode::from(tail[7] >> 4) != CqeOpcode::Req {
                let mut b = [0u8; CQE_BYTES];
                self.cq.read(off, &mut b);
                self.complete_error(&b);
                failed = true;
                break;
            }
            self.complete_request(u16::from_be_bytes([tail[4], tail[5]]));
        }
        if n > 0 {
            self.write_cq_ci();
        }
        (n, failed)
    }

    /// A requester CQE for WQE `upto`: every WQE up to it was sent. Finds the request made on
    /// it (a CQE for a WQE the queue asked nothing for is counted and ignored: it names no
    /// packets the queue can trust), consumes the SQ and frees the descriptors up to it, in
    /// one bulk return to the per-core cache.
    #[inline]
    fn complete_request(&mut self, upto: u16) {
        let mask = self.reqs.len() as u32 - 1;
        let mut k = self.req_tail;
        while k != self.req_head && self.reqs[(k & mask) as usize].wqe != upto {
            k = k.wrapping_add(1);
        }
        if k == self.req_head {
            TxXstats::bump(&self.xstats.unexpected_cqes);
            return;
        }
        // Requests before it were completed by this CQE too (a CQE covers every WQE up to it).
        let mut bytes = 0u64;
        while self.req_tail != k {
            bytes += self.reqs[(self.req_tail & mask) as usize].bytes;
            self.req_tail = self.req_tail.wrapping_add(1);
        }
        let r = self.reqs[(k & mask) as usize];
        self.req_tail = k.wrapping_add(1);
        bytes += r.bytes;
        self.wq.complete_to(r.wq_head);
        let count = r.desc_head.wrapping_sub(self.desc.popped());
        let desc = &mut self.desc;
        with_cache(&self.pool, |cache| desc.free_front(count, cache));
        self.counters.add(u64::from(count), bytes);
        // The WQEs that held them are done.
        let wmask = self.wqes.len() as u32 - 1;
        while self.wqe_tail != self.wqe_head
            && (self.wqes[(self.wqe_tail & wmask) as usize].1)
                .wrapping_sub(r.desc_head)
                .cast_signed()
                < 0
        {
            self.wqe_tail = self.wqe_tail.wrapping_add(1);
        }
    }

    /// An error CQE (`b`) for WQE `upto`: the packets of the WQEs before it were sent, those
    /// of `upto` failed (an eMPW WQE carries several); the rest is the recovery's.
    #[cold]
    fn complete_error(&mut self, b: &[u8; CQE_BYTES]) {
        let Some(c) = Cqe::new_checked(&b[..]) else {
            return;
        };
        self.xstats.count_error(c.syndrome());
        crate::dp_trace!(sq = self.sqn, syndrome = ?c.syndrome(), "tx error completion\n{}", crate::hw::hexdump(b));
        let upto = c.wqe_counter();
        let (mut ok_pkts, mut ok_bytes, mut errs) = (0u64, 0u64, 0u64);
        // Only if the failed WQE is in flight: a CQE naming another is no proof of anything.
        let mask = self.wqes.len() as u32 - 1;
        let entry = |k: u32| self.wqes[(k & mask) as usize];
        let (from, to) = (self.desc.popped(), self.desc.pushed());
        let failed = (0..self.wqe_head.wrapping_sub(self.wqe_tail))
            .map(|j| self.wqe_tail.wrapping_add(j))
            .find(|&j| entry(j).0 == upto);
        if let Some(j) = failed {
            let start = entry(j).1;
            let end = if j.wrapping_add(1) != self.wqe_head {
                entry(j.wrapping_add(1)).1
            } else {
                to
            };
            let ok = start.wrapping_sub(from);
            errs = u64::from(end.wrapping_sub(start));
            for i in 0..end.wrapping_sub(from) {
                if let Some(m) = self.desc.pop() {
                    if i < ok {
                        ok_pkts += 1;
                        ok_bytes += u64::from(m.pkt_len());
                    }
                    self.done.push(m);
                }
            }
        }
        self.free_done();
        self.counters.add(ok_pkts, ok_bytes);
        if errs > 0 {
            self.counters.add_errors(errs);
            counters::bump(&self.xstats.error_drops, errs);
        }
    }

    /// `SET_CI` ← the CQ's consumer counter (§5.4).
    fn write_cq_ci(&self) {
        self.cq_dbrec.store_u32(
            0,
            u32::from_ne_bytes(doorbell::cq_set_ci(self.cq.head())),
            Ordering::Release,
        );
    }

    /// Gives the mbufs in `done` back to the pool.
    fn free_done(&mut self) {
        if !self.done.is_empty() {
            let done = &mut self.done;
            with_cache(&self.pool, |cache| {
                done.drain(..).for_each(|m| m.free_to(cache))
            });
        }
    }

    /// Error recovery after an error CQE (§2.8, §5.3, what DPDK's TX error handling does),
    /// on the polling core, with device calls through the queue's state machine:
    ///
    /// 1. the SQ to RESET: the device stops reading it and writes no more CQEs for it;
    /// 2. every CQE it wrote before is consumed (the flushes of the WQEs after the failed
    ///    one), and `SET_CI` written: the CQ itself is not reset and keeps its counter;
    /// 3. every packet still in flight is freed and counted (`tx_error_drops`, errors):
    ///    none of them was sent;
    /// 4. the WQE counters restart at 0, as the device's did, and the SQ record is written
    ///    0 (DPDK leaves the old value until its next doorbell; writing it while the SQ is in
    ///    RESET costs nothing and leaves no stale doorbell for a device that samples it);
    /// 5. the SQ back to RTS; the next burst posts from WQE index 0.
    ///
    /// If a state change fails the queue is down: counted, logged once, it takes no packets
    /// (a burst returns 0, like a detached queue) and tries again every
    /// [`RECOVERY_RETRY_BURSTS`] bursts; the steps are safe to repeat.
    #[cold]
    fn recover(&mut self) {
        if let Err(e) = self.state.reset() {
            return self.recovery_failed("RESET", &e);
        }
        let mut n = 0u32;
        while let Polled::Entry(off) = self.cq.poll() {
            let mut b = [0u8; CQE_BYTES];
            self.cq.read(off, &mut b);
            if let Some(c) = Cqe::new_checked(&b[..]) {
                if c.opcode() != CqeOpcode::Req {
                    self.xstats.count_error(c.syndrome());
                }
            }
            n += 1;
        }
        if n > 0 {
            self.write_cq_ci();
        }
        let mut dropped = 0u64;
        self.req_tail = self.req_head;
        self.wqe_tail = self.wqe_head;
        self.unrequested_bytes = 0;
        while let Some(m) = self.desc.pop() {
            dropped += 1;
            self.done.push(m);
        }
        self.free_done();
        self.counters.add_errors(dropped);
        counters::bump(&self.xstats.error_drops, dropped);
        self.wq.restart();
        self.unrequested = 0;
        self.dbrec.store_u32(
            SND_DBR,
            u32::from_ne_bytes(doorbell::sq_record(0)),
            Ordering::Release,
        );
        if let Err(e) = self.state.ready() {
            return self.recovery_failed("RTS", &e);
        }
        self.down = false;
        TxXstats::bump(&self.xstats.recoveries);
    }

    #[cold]
    fn recovery_failed(&mut self, to: &'static str, e: &SetupError) {
        TxXstats::bump(&self.xstats.recovery_failures);
        self.down = true;
        self.retry_in = RECOVERY_RETRY_BURSTS;
        if !self.warned {
            self.warned = true;
            tracing::warn!(target: "pmd::mlx5::driver", sq = self.sqn, to, error = %e,
                "tx queue recovery failed: the queue takes no packets and tries again every {RECOVERY_RETRY_BURSTS} bursts");
        }
    }

    /// A burst on a queue that is down: counts down to the next recovery attempt.
    #[cold]
    fn retry_recovery(&mut self) {
        self.retry_in = self.retry_in.saturating_sub(1);
        if self.retry_in == 0 {
            self.recover();
        }
    }

    /// See [`crate::ethdev::TxBurst::tx_burst`].
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        if self.down {
            self.retry_recovery();
            if self.down {
                return 0;
            }
        }
        // Work the device left for later (a software device's), before completions are read.
        kick::run(&self.kick);
        self.reclaim();
        if self.down {
            return 0;
        }
        if pkts.is_empty() {
            // A reclaim call: packets still waiting for a completion request would otherwise
            // wait for the next busy burst (holding their mbufs, not counted as sent).
            if self.unrequested > 0 {
                self.flush();
            }
            return 0;
        }
        let want = pkts.len().min(self.desc.free() as usize);
        self.posted.clear();
        let mut last_ctrl = None;
        // Where the last WQE posted starts (its first WQEBB, free-running).
        let mut last_at = 0u32;
        let mut i = 0;
        while i < want {
            let wqe_index = self.wq.head() as u16;
            if self.empw {
                match self.post_empw(&pkts.as_slice()[i..want]) {
                    Empw::Posted {
                        pkts: n,
                        bytes,
                        ctrl,
                    } => {
                        last_at = u32::from(wqe_index);
                        last_ctrl = Some(ctrl);
                        self.unrequested += n as u32;
                        self.unrequested_bytes += bytes;
                        self.posted.push((n as u32, Some(wqe_index)));
                        i += n;
                        continue;
                    }
                    Empw::NoRoom => break,
                    Empw::NotEligible => {}
                }
            }
            match self.build_wqe(&pkts.as_slice()[i], wqe_index) {
                Build::Wqe(bytes) => {
                    let at = self.wq.head();
                    if self.wq.post(&self.wqe[..bytes]).is_none() {
                        break;
                    }
                    last_at = at;
                    self.unrequested += 1;
                    self.unrequested_bytes += u64::from(pkts.as_slice()[i].pkt_len());
                    let mut ctrl = [0u8; 8];
                    ctrl.copy_from_slice(&self.wqe[..8]);
                    last_ctrl = Some(ctrl);
                    self.posted.push((1, Some(wqe_index)));
                }
                Build::Drop => self.posted.push((1, None)),
            }
            i += 1;
        }
        let taken = i;
        let mut dropped = 0u64;
        let mask = self.wqes.len() as u32 - 1;
        if self.posted.iter().all(|&(_, idx)| idx.is_some()) {
            // Nothing dropped (the usual case): each WQE's packets follow the previous
            // one's in the descriptors, and they all go in at once.
            let mut at = self.desc.pushed();
            for &(n, idx) in &self.posted {
                if let Some(idx) = idx {
                    self.wqes[(self.wqe_head & mask) as usize] = (idx, at);
                    self.wqe_head = self.wqe_head.wrapping_add(1);
                    at = at.wrapping_add(n);
                }
            }
            self.desc.push_all(pkts.drain_front(taken));
            return self.posted_tail(taken, last_at, last_ctrl, 0);
        }
        let mut taken_pkts = pkts.drain_front(taken);
        for &(n, idx) in &self.posted {
            match idx {
                // At most `free()` packets were taken: the ring has room for each (and each
                // WQE carries one at least, so the WQE ring too).
                Some(idx) => {
                    self.wqes[(self.wqe_head & mask) as usize] = (idx, self.desc.pushed());
                    self.wqe_head = self.wqe_head.wrapping_add(1);
                    self.desc.push_all(taken_pkts.by_ref().take(n as usize));
                }
                None => {
                    dropped += u64::from(n);
                    self.done.extend(taken_pkts.by_ref().take(n as usize));
                }
            }
        }
        drop(taken_pkts);
        self.posted_tail(taken, last_at, last_ctrl, dropped)
    }

    /// The end of a burst that took `taken` packets: the `dropped` ones (in `done`) freed and
    /// counted, and, when WQEs were posted (the last at WQEBB `last_at`, its control segment
    /// `last_ctrl`), a completion requested if due and the doorbell rung.
    #[inline]
    fn posted_tail(
        &mut self,
        taken: usize,
        last_at: u32,
        last_ctrl: Option<[u8; 8]>,
        dropped: u64,
    ) -> usize {
        if dropped > 0 {
            self.counters.add_errors(dropped);
            let done = &mut self.done;
            with_cache(&self.pool, |cache| {
                done.drain(..).for_each(|m| m.free_to(cache))
            });
        }
        if let Some(ctrl) = last_ctrl {
            self.request_completion(last_at);
            self.ring(ctrl);
            kick::run(&self.kick);
        }
        taken
    }

    /// Asks for a completion on the last WQE posted (at WQEBB `at`), after the burst's WQEs
    /// are in the ring, when one is due (§2.8): once [`COMP_THRESH`] packets wait for one, or
    /// when the rings could not take the next packet's WQE whatever it is (fewer WQEBBs free
    /// than the largest WQE, or no descriptor free). So whenever the queue cannot post, a
    /// completion is on its way for some WQE in flight, and the queue drains: the request is
    /// decided on the WQE actually posted last, not on the one the burst meant to post last.
    #[inline]
    fn request_completion(&mut self, at: u32) {
        if self.unrequested < COMP_THRESH && self.wq.free() >= MAX_WQE_BBS && self.desc.free() > 0 {
            return;
        }
        self.record_request(at);
        // `fm_ce_se` is the last byte of the control segment's third dword (big-endian): CE
        // in bits 3:2.
        let mem = self.wq.mem();
        let off = (at as usize * WQEBB_BYTES + 11) & (mem.len() - 1);
        let mut b = [0u8; 1];
        mem.read(off, &mut b);
        mem.write(off, &[(b[0] & !0x0c) | (CE_ALWAYS << 2)]);
    }

    /// Records a completion request on the WQE at WQEBB `at`, the last posted: its CQE will
    /// complete every packet posted until now.
    #[inline]
    fn record_request(&mut self, at: u32) {
        self.unrequested = 0;
        let mask = self.reqs.len() as u32 - 1;
        self.reqs[(self.req_head & mask) as usize] = Req {
            wqe: at as u16,
            wq_head: self.wq.head(),
            desc_head: self.desc.pushed(),
            bytes: std::mem::take(&mut self.unrequested_bytes),
        };
        self.req_head = self.req_head.wrapping_add(1);
    }

    /// Asks for a completion of every packet posted so far, when the queue goes idle: a NOP
    /// WQE (one WQEBB, control segment only, §2.2) with CE = ALWAYS. DPDK's mlx5 leaves up to
    /// `MLX5_TX_COMP_THRESH - 1` packets uncompleted on an idle queue (and counts them as sent
    /// when posted); here an empty burst completes them, so it frees every mbuf it can and
    /// `opackets` (counted at completion) catches up, as [`TxQueue`]'s docs promise. Costs one
    /// WQEBB and a doorbell per busy-to-idle transition, nothing while busy.
    #[cold]
    fn flush(&mut self) {
        if self.wq.free() == 0 {
            // A full SQ already has a completion requested (see `request_completion`).
            return;
        }
        let at = self.wq.head();
        let mut nop = [0u8; WQEBB_BYTES];
        if let Some(mut c) = CtrlSeg::new_checked(&mut nop[..SEG_BYTES]) {
            c.write(Opcode::Nop, 0, at as u16, self.sqn, 1, CE_ALWAYS);
        }
        if self.wq.post(&nop).is_none() {
            return;
        }
        self.record_request(at);
        let mut ctrl = [0u8; 8];
        ctrl.copy_from_slice(&nop[..8]);
        self.ring(ctrl);
        kick::run(&self.kick);
    }

    /// The doorbell (§3.1): the SQ record (producer counter in WQEBBs) after the WQE writes,
    /// then the first 8 bytes of the last WQE's control segment to the UAR, then a flush.
    fn ring(&self, ctrl: [u8; 8]) {
        udma_to_device_barrier();
        self.dbrec.store_u32(
            SND_DBR,
            u32::from_ne_bytes(doorbell::sq_record(self.wq.head())),
            Ordering::Release,
        );
        // The record before the MMIO write (rdma-core's `mmio_wc_start`), then the write
        // (the bytes verbatim), then the write-combining flush.
        mmio_flush_writes();
        self.bf_reg.ring(0, u64::from_ne_bytes(ctrl));
        mmio_flush_writes();
    }

    /// Posts an eMPW WQE for the longest run at the start of `pkts` that can share one
    /// (single segment, no TSO, no VLAN, the same checksum flags, buffers in registered
    /// chunks; at most [`EMPW_MAX`] and what the SQ has room for). The pointer descriptors go
    /// straight into the ring, then the title (control and Ethernet segments); a WQE that
    /// could reach the end of the ring is built aside and copied (wrapping).
    #[inline]
    fn post_empw(&mut self, pkts: &[Mbuf]) -> Empw {
        let free = self.wq.free() as usize;
        if free == 0 {
            return Empw::NoRoom;
        }
        // Title (2 units) plus one unit per packet, 4 units per WQEBB.
        let room = (free * DS_PER_WQEBB - 2).min(EMPW_MAX).min(pkts.len());
        let size = self.wq.mem().len();
        let start = self.wq.head_bytes() as usize & (size - 1);
        // Where the WQE cannot reach the end of the ring, it goes straight in.
        let window = self.wq.mem().window(start, (2 + room) * SEG_BYTES);
        let mut n = 0;
        let mut bytes = 0u64;
        // The flags that matter here: those of the first packet, which no other may differ
        // from (TSO and VLAN insertion never go in an eMPW WQE).
        let Some(first) = pkts.first() else {
            return Empw::NotEligible;
        };
        let f0 = first.ol_flags() & EMPW_FLAGS;
        if f0.intersects(OffloadFlags::TX_TCP_SEG | OffloadFlags::TX_VLAN) {
            return Empw::NotEligible;
        }
        for m in &pkts[..room] {
            if m.ol_flags() & EMPW_FLAGS != f0 || m.nb_segs() != 1 || m.is_empty() {
                break;
            }
            let data = m.data();
            let addr = data.as_ptr() as usize;
            let Some(key) = self.keys.key_for_addr(addr) else {
                break;
            };
            bytes += data.len() as u64;
            let at = (2 + n) * SEG_BYTES;
            if let Some(w) = &window {
                let (lo, hi) = data_seg_words(Iova(addr as u64), key, data.len() as u32);
                w.write_2x64(at, lo, hi);
            } else {
                let d = DataSeg::bytes(Iova(addr as u64), key, data.len() as u32);
                self.wqe[at..at + SEG_BYTES].copy_from_slice(&d);
            }
            n += 1;
        }
        if n == 0 {
            return Empw::NotEligible;
        }
        let ds = 2 + n;
        let mut title = [0u8; 2 * SEG_BYTES];
        if let Some(mut c) = CtrlSeg::new_checked(&mut title[..SEG_BYTES]) {
            c.write(
                Opcode::Empw,
                0,
                self.wq.head() as u16,
                self.sqn,
                ds as u8,
                CE_FIRST_ERROR,
            );
        }
        if let Some(mut e) = EthSeg::new_checked(&mut title[SEG_BYTES..]) {
            e.write(cs_flags(f0), 0, &[]);
        }
        // The tail of the last WQEBB is ignored by the device; keep it clean.
        let bbs = wqebbs(ds);
        let end = bbs * WQEBB_BYTES;
        if window.is_some() {
            let mem = self.wq.mem();
            mem.write(start, &title);
            mem.fill(start + ds * SEG_BYTES, end - ds * SEG_BYTES, 0);
            self.wq.advance(bbs as u32);
        } else {
            self.wqe[..2 * SEG_BYTES].copy_from_slice(&title);
            self.wqe[ds * SEG_BYTES..end].fill(0);
            // Room was checked: the copy cannot fail.
            let _ = self.wq.post(&self.wqe[..end]);
        }
        let mut ctrl = [0u8; 8];
        ctrl.copy_from_slice(&title[..8]);
        Empw::Posted {
            pkts: n,
            bytes,
            ctrl,
        }
    }

    /// Writes the WQE for `m` into `self.wqe`.
    #[inline]
    fn build_wqe(&mut self, m: &Mbuf, wqe_index: u16) -> Build {
        let flags = m.ol_flags();
        let mut cs = cs_flags(flags);
        let first = match m.segments().next() {
            Some(s) => s,
            None => return Build::Drop,
        };
        let vlan = flags.contains(OffloadFlags::TX_VLAN).then(|| m.vlan_tci());
        let (opcode, mss, hdr_len) = if flags.contains(OffloadFlags::TX_TCP_SEG) {
            let o = m.tx_offload();
            let h = usize::from(o.l2_len) + usize::from(o.l3_len) + usize::from(o.l4_len);
            if o.tso_segsz == 0 || !(19..=MAX_TSO_HEADER).contains(&h) || vlan.is_some() {
                TxXstats::bump(&self.xstats.bad_tso);
                return Build::Drop;
            }
            cs |= CS_L4;
            if !flags.contains(OffloadFlags::TX_IPV6) {
                cs |= CS_L3;
            }
            (Opcode::Tso, o.tso_segsz, h)
        } else {
            let need = if vlan.is_some() && self.min_inline > 0 {
                self.min_inline.max(VLAN_INLINE)
            } else {
                self.min_inline
            };
            (Opcode::Send, 0, need)
        };
        // Inline header bytes (the frame's own, or composed with the tag in `vlan_hdr`), and
        // where the pointer data starts in the first segment.
        let vlan_hdr = &mut self.vlan_hdr;
        let (hdr, inl, data_from): (&[u8], usize, usize) = match vlan {
            Some(tci) if hdr_len > 0 => {
                let take = hdr_len - 4;
                if first.len() < take {
                    TxXstats::bump(&self.xstats.short_header);
                    return Build::Drop;
                }
                vlan_hdr[..12].copy_from_slice(&first[..12]);
                vlan_hdr[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
                vlan_hdr[14..16].copy_from_slice(&tci.to_be_bytes());
                vlan_hdr[16..hdr_len].copy_from_slice(&first[12..take]);
                (&vlan_hdr[..hdr_len], hdr_len, take)
            }
            _ => {
                if first.len() < hdr_len {
                    TxXstats::bump(&self.xstats.short_header);
                    return Build::Drop;
                }
                (&first[..hdr_len], hdr_len, hdr_len)
            }
        };
        let eth_units = eth_seg_units(inl);
        let data_segs = usize::from(m.nb_segs()) - usize::from(first.len() == data_from);
        let ds = 1 + eth_units + data_segs;
        if ds > DPDK_MAX_DS {
            TxXstats::bump(&self.xstats.too_many_segs);
            return Build::Drop;
        }
        let bytes = wqebbs(ds) * WQEBB_BYTES;
        let w = &mut self.wqe[..bytes];
        if let Some(mut c) = CtrlSeg::new_checked(&mut w[..SEG_BYTES]) {
            c.write(opcode, 0, wqe_index, self.sqn, ds as u8, CE_FIRST_ERROR);
        }
        if let Some(mut e) = EthSeg::new_checked(&mut w[SEG_BYTES..2 * SEG_BYTES]) {
            match vlan {
                Some(tci) if inl == 0 => e.write_vlan_insert(cs, tci),
                _ => e.write(cs, mss, &hdr[..inl]),
            }
        }
        if inl > 2 {
            w[2 * SEG_BYTES..2 * SEG_BYTES + inl - 2].copy_from_slice(&hdr[2..inl]);
        }
        let mut at = (1 + eth_units) * DS_BYTES;
        for (i, seg) in m.segments().enumerate() {
            let (addr, len) = if i == 0 {
                (seg.as_ptr() as usize + data_from, seg.len() - data_from)
            } else {
                (seg.as_ptr() as usize, seg.len())
            };
            if len == 0 {
                continue;
            }
            let Some(key) = self.keys.key_for_addr(addr) else {
                TxXstats::bump(&self.xstats.no_mkey);
                return Build::Drop;
            };
            if let Some(mut d) = DataSeg::new_checked(&mut w[at..at + SEG_BYTES]) {
                d.set(Iova(addr as u64), key, len as u32);
            }
            at += SEG_BYTES;
        }
        Build::Wqe(bytes)
    }
}

/// The Ethernet segment's checksum flags for a packet's offload flags (§2.3).
fn cs_flags(flags: OffloadFlags) -> u8 {
    let mut cs = 0u8;
    if flags.contains(OffloadFlags::TX_IP_CKSUM) {
        cs |= CS_L3;
    }
    if flags.intersects(OffloadFlags::TX_TCP_CKSUM | OffloadFlags::TX_UDP_CKSUM) {
        cs |= CS_L4;
    }
    cs
}

impl TxBurst for TxQueue {
    #[inline]
    fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        TxQueue::tx_burst(self, pkts)
    }
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        // No recovery here: the queue is going away (and its QP may be gone already). What
        // is still in flight is freed unsent and counted as lost (transmit errors): the
        // port's counters outlive the queue (a queue rebuilt after a device reset keeps them).
        let _ = self.complete();
        self.counters.add_errors(u64::from(self.in_flight()));
        // The device may still read them until the QP is destroyed (the port holds it too):
        // they wait there (see `Parked`), not in the pool.
        let in_flight = std::mem::replace(&mut self.desc, MbufFifo::new(&self.pool, 1));
        self.parked.park(in_flight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::mlx5::cqe::{CqeFields, Syndrome};
    use crate::mlx5::provider::testing::TestState;
    use crate::mlx5::{RawCq, RawSq};
    use mempool::{MbufPoolConfig, Registration};

    /// The queue's extended counter `n`.
    fn xstat(q: &TxQueue, n: &str) -> u64 {
        q.xstats
            .list()
            .into_iter()
            .find(|x| x.name == n)
            .unwrap_or_else(|| panic!("no tx xstat {n}"))
            .value
    }

    const WQE_CNT: u32 = 64;
    const CQE_CNT: u32 = 8;

    struct Nic {
        sq: Arc<DevMem>,
        cq: Arc<DevMem>,
        dbrec: Arc<DevMem>,
        bf: Arc<DevMem>,
        /// CQEs written so far.
        written: u32,
    }

    fn queue(pool: &Arc<MbufPool>, min_inline: u16) -> (TxQueue, Nic) {
        queue_with(pool, min_inline, Arc::default())
    }

    fn queue_with(pool: &Arc<MbufPool>, min_inline: u16, state: Arc<TestState>) -> (TxQueue, Nic) {
        let keys = pool
            .register_chunks(|_| Ok(Registration::new(mempool::Lkey(0x77))))
            .unwrap();
        let sq = Arc::new(DevMem::anon(WQE_CNT as usize * WQEBB_BYTES).unwrap());
        let cq = Arc::new(DevMem::anon(CQE_CNT as usize * CQE_BYTES).unwrap());
        for i in 0..CQE_CNT as usize {
            cq.write(i * CQE_BYTES + 63, &[0xf0]);
        }
        let dbrec = Arc::new(DevMem::anon(4096).unwrap());
        let bf = Arc::new(DevMem::anon(4096).unwrap());
        let raw = RawSq {
            buf: Arc::clone(&sq),
            wqe_cnt: WQE_CNT,
            sqn: 0xab_cd12,
            dbrec: Arc::clone(&dbrec),
            bf_reg: crate::sys::Mmio::new(Arc::clone(&bf)),
            bf_size: 256,
            min_inline,
            cq: RawCq {
                buf: Arc::clone(&cq),
                cqe_cnt: CQE_CNT,
                dbrec: Arc::clone(&dbrec),
                cqn: 7,
            },
            owner: Arc::new(()),
            parked: crate::ethdev::Parked::new(),
            state,
            kick: None,
        };
        let q = TxQueue::new(
            raw,
            WQE_CNT as u16,
            Arc::clone(pool),
            keys,
            Arc::default(),
            Arc::default(),
        );
        (
            q,
            Nic {
                sq,
                cq,
                dbrec: Arc::clone(&dbrec),
                bf,
                written: 0,
            },
        )
    }

    impl Nic {
        /// Completes WQE `index` as the device would (a requester CQE).
        fn complete(&mut self, index: u16) {
            self.cqe(index, 0, 0);
        }
        /// Fails WQE `index` with `syndrome` (a REQ_ERR CQE; WR_FLUSH for a flush).
        fn fail(&mut self, index: u16, syndrome: Syndrome) {
            self.cqe(index, 13, u8::from(syndrome));
        }
        fn cq_ci(&self) -> u32 {
            u32::from_be_bytes(self.dbrec.load_u32(0, Ordering::Acquire).to_ne_bytes())
        }
        fn cqe(&mut self, index: u16, opcode: u8, syndrome: u8) {
            let slot = (self.written % CQE_CNT) as usize * CQE_BYTES;
            let mut b = [0u8; CQE_BYTES];
            Cqe::new_checked(&mut b[..]).unwrap().write(&CqeFields {
                opcode,
                syndrome,
                owner: (self.written / CQE_CNT) & 1 == 1,
                wqe_counter: index,
                sop: 0x0a,
                qpn: 0xab_cd12,
                ..Default::default()
            });
            self.cq.write(slot, &b);
            self.written += 1;
        }
        fn wqe(&self, bb: u32, n: usize) -> Vec<u8> {
            let mut v = vec![0u8; n];
            crate::ring::read_wrapped(&self.sq, bb * WQEBB_BYTES as u32, &mut v);
            v
        }
        fn sq_record(&self) -> u32 {
            u32::from_be_bytes(
                self.dbrec
                    .load_u32(SND_DBR, Ordering::Acquire)
                    .to_ne_bytes(),
            )
        }
    }

    fn frame(pool: &Arc<MbufPool>, len: usize, seed: u8) -> Mbuf {
        let mut m = mempool::lcache::alloc(pool).unwrap();
        let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
        m.extend_from_slice(&data).unwrap();
        m
    }

    /// 18 bytes inline (ConnectX-4), the rest through one pointer segment: ds 4, one WQEBB;
    /// the record and the UAR write follow the last WQE; no completion is asked for under 32
    /// packets.
    #[test]
    fn send_with_minimum_inline_builds_the_reference_layout() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-inline", 256)).unwrap();
        let (mut q, nic) = queue(&pool, 18);
        let mut b = Burst::with_capacity(4);
        b.push(frame(&pool, 60, 1)).unwrap();
        assert_eq!(q.tx_burst(&mut b), 1);
        let w = nic.wqe(0, 64);
        let c = CtrlSeg::new_checked(&w[..16]).unwrap();
        assert_eq!(
            (c.opcode(), c.wqe_index(), c.qpn(), c.ds()),
            (Opcode::Send, 0, 0xab_cd12, 4)
        );
        assert_eq!(c.ce(), CE_FIRST_ERROR);
        let e = EthSeg::new_checked(&w[16..]).unwrap();
        assert_eq!(e.inline_hdr_sz(), 18);
        let expect: Vec<u8> = (0..18).map(|i| 1u8.wrapping_add(i)).collect();
        assert_eq!(e.inline(), &expect[..]);
        let d = DataSeg::new_checked(&w[48..64]).unwrap();
        assert_eq!((d.byte_count(), d.lkey()), (42, mempool::Lkey(0x77)));
        assert_eq!(nic.sq_record(), 1);
        assert_eq!(
            nic.bf.load_u64(0, Ordering::Acquire).to_ne_bytes(),
            c.doorbell_bytes()
        );
        assert_eq!(q.in_flight(), 1);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// Without a minimum, a VLAN tag goes to the Ethernet segment's insert command; with one,
    /// into the inline copy (18 bytes: MACs, tag, EtherType) and the pointer starts at 14.
    #[test]
    fn vlan_insertion_uses_the_command_or_the_inline_copy() {
        for (min, inl, from) in [(0u16, 0usize, 0usize), (18, 18, 14)] {
            let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-vlan", 256)).unwrap();
            let (mut q, nic) = queue(&pool, min);
            let mut m = frame(&pool, 64, 0x10);
            m.set_ol_flags(OffloadFlags::TX_VLAN);
            m.set_vlan_tci(100);
            let mut b = Burst::with_capacity(1);
            b.push(m).unwrap();
            assert_eq!(q.tx_burst(&mut b), 1);
            let w = nic.wqe(0, 64);
            let e = EthSeg::new_checked(&w[16..]).unwrap();
            if inl == 0 {
                assert_eq!(e.vlan_insert(), Some(100));
            } else {
                assert_eq!(e.inline_hdr_sz() as usize, inl);
                assert_eq!(&e.inline()[12..16], &[0x81, 0, 0, 100]);
                assert_eq!(&e.inline()[16..18], &[0x10 + 12, 0x10 + 13]);
            }
            let at = 16 * (1 + eth_seg_units(inl));
            let d = DataSeg::new_checked(&w[at..at + 16]).unwrap();
            assert_eq!(d.byte_count() as usize, 64 - from);
            drop(q);
            assert_eq!(pool.in_use(), 0);
        }
    }

    /// TSO: opcode TSO, the MSS and the whole L2–L4 header inline, the payload through one
    /// pointer segment per mbuf segment (two here), checksum flags L3 and L4; ds and WQEBBs
    /// as the reference (golden V3) counts them.
    #[test]
    fn tso_inlines_the_headers_and_points_at_every_payload_segment() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-tso", 256)).unwrap();
        let (mut q, nic) = queue(&pool, 0);
        let mut m = frame(&pool, 54 + 100, 0x40);
        let tail = frame(&pool, 1000, 0x80);
        m.chain(tail).unwrap();
        m.set_ol_flags(
            OffloadFlags::TX_TCP_SEG | OffloadFlags::TX_IPV4 | OffloadFlags::TX_IP_CKSUM,
        );
        m.set_tx_offload(mempool::TxOffload {
            l2_len: 14,
            l3_len: 20,
            l4_len: 20,
            tso_segsz: 1448,
        });
        let mut b = Burst::with_capacity(1);
        b.push(m).unwrap();
        assert_eq!(q.tx_burst(&mut b), 1);
        let w = nic.wqe(0, 128);
        let c = CtrlSeg::new_checked(&w[..16]).unwrap();
        assert_eq!((c.opcode(), c.ds()), (Opcode::Tso, 8));
        let e = EthSeg::new_checked(&w[16..]).unwrap();
        assert_eq!(
            (e.mss(), e.inline_hdr_sz(), e.cs_flags()),
            (1448, 54, CS_L3 | CS_L4)
        );
        let hdr: Vec<u8> = (0..54).map(|i| 0x40u8.wrapping_add(i)).collect();
        assert_eq!(e.inline(), &hdr[..]);
        let d0 = DataSeg::new_checked(&w[96..112]).unwrap();
        let d1 = DataSeg::new_checked(&w[112..128]).unwrap();
        assert_eq!((d0.byte_count(), d1.byte_count()), (100, 1000));
        assert_eq!(nic.sq_record(), 2, "two WQEBBs");
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// Where nothing is inlined, single-segment packets with the same checksum flags share
    /// eMPW WQEs (opcode 0x29, ds = 2 + packets, one pointer descriptor each, at most 32);
    /// a change of flags starts a new WQE; one CQE for a WQE frees all of its packets.
    #[test]
    fn empw_packs_a_burst_and_one_completion_frees_the_whole_wqe() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-empw", 512)).unwrap();
        let (mut q, mut nic) = queue(&pool, 0);
        let mut b = Burst::with_capacity(40);
        for k in 0..40 {
            let mut m = frame(&pool, 60 + k, k as u8);
            if k >= 36 {
                m.set_ol_flags(OffloadFlags::TX_IP_CKSUM);
            }
            b.push(m).unwrap();
        }
        assert_eq!(q.tx_burst(&mut b), 40);
        // WQE 0: 32 packets (the most), ds 34 = 9 WQEBBs; WQE 9: 4 packets; WQE 11: the 4
        // with other checksum flags, asking for the completion (40 packets wait).
        let mut at = 0u32;
        for (pk, cs, ce) in [
            (32usize, 0u8, CE_FIRST_ERROR),
            (4, 0, CE_FIRST_ERROR),
            (4, CS_L3, CE_ALWAYS),
        ] {
            let w = nic.wqe(at, 32 + 16 * pk);
            let c = CtrlSeg::new_checked(&w[..16]).unwrap();
            assert_eq!(
                (c.opcode(), c.wqe_index(), c.ds() as usize, c.ce()),
                (Opcode::Empw, at as u16, 2 + pk, ce)
            );
            let e = EthSeg::new_checked(&w[16..32]).unwrap();
            assert_eq!((e.cs_flags(), e.inline_hdr_sz()), (cs, 0));
            for k in 0..pk {
                let d = DataSeg::new_checked(&w[32 + 16 * k..48 + 16 * k]).unwrap();
                assert_eq!(d.lkey(), mempool::Lkey(0x77));
            }
            at += crate::hw::mlx5::wqebbs(2 + pk) as u32;
        }
        assert_eq!(nic.sq_record(), at);
        assert_eq!(q.in_flight(), 40);
        nic.complete(11);
        q.reclaim();
        assert_eq!(
            q.in_flight(),
            0,
            "the CQE of the last WQE frees every packet"
        );
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// Over many ring laps: a completion is requested on the last WQE of a burst once 32
    /// packets wait; its CQE frees every packet up to that WQE, in order, and the CQ's
    /// consumer index is written back.
    #[test]
    fn moderated_completions_free_everything_up_to_the_completed_wqe() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-mod", 512)).unwrap();
        // A ConnectX-4-like queue (18 bytes inline): one SEND WQE per packet, no eMPW.
        let (mut q, mut nic) = queue(&pool, 18);
        let mut sent = 0u32;
        for round in 0..40u32 {
            let mut b = Burst::with_capacity(16);
            for k in 0..16 {
                b.push(frame(&pool, 60 + k, round as u8)).unwrap();
            }
            assert_eq!(q.tx_burst(&mut b), 16);
            sent += 16;
            let last = (sent - 1) as u16;
            let w = nic.wqe(u32::from(last) % WQE_CNT, 16);
            let c = CtrlSeg::new_checked(&w[..]).unwrap();
            assert_eq!(c.wqe_index(), last, "one WQEBB per packet");
            if sent.is_multiple_of(32) {
                assert_eq!(c.ce(), CE_ALWAYS, "round {round}");
                nic.complete(last);
            } else {
                assert_eq!(c.ce(), CE_FIRST_ERROR, "round {round}");
            }
            q.reclaim();
            assert_eq!(q.in_flight(), sent % 32, "round {round}");
        }
        assert_eq!(nic.sq_record(), sent & 0xffff);
        let ci = u32::from_be_bytes(nic.dbrec.load_u32(0, Ordering::Acquire).to_ne_bytes());
        assert_eq!(ci, sent / 32);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    fn burst_of(pool: &Arc<MbufPool>, n: usize, seed: u8) -> Burst {
        let mut b = Burst::with_capacity(n);
        for k in 0..n {
            b.push(frame(pool, 60 + k, seed)).unwrap();
        }
        b
    }

    /// An error CQE for WQE 4 of 10 (one SEND WQE per packet), then flushes for the WQEs the
    /// device reached after it: the 4 packets before it count as sent, the failed one and the
    /// 5 after it as dropped errors; the SQ goes RESET → RTS, the CQ is drained (SET_CI at 6),
    /// the SQ record is 0 and the next burst posts from WQE index 0. Over several rounds the
    /// counters restart at 0 each time and nothing leaks.
    #[test]
    fn an_error_cqe_resets_the_sq_and_the_next_burst_starts_at_wqe_0() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-recover", 512)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, 18, Arc::clone(&state));
        for round in 0..5u64 {
            let mut b = burst_of(&pool, 10, round as u8);
            assert_eq!(q.tx_burst(&mut b), 10);
            let w = nic.wqe(0, 16);
            assert_eq!(CtrlSeg::new_checked(&w[..]).unwrap().wqe_index(), 0);
            assert_eq!(nic.sq_record(), 10);
            // The device: WQEs 0-3 sent (CE = 1: no CQE), 4 fails, 5-9 flushed.
            nic.fail(4, Syndrome::LocalProt);
            for i in 5..10 {
                nic.fail(i, Syndrome::WrFlush);
            }
            assert_eq!(
                q.reclaim(),
                1,
                "the error CQE; the flushes go to the recovery"
            );
            assert_eq!(state.resets.load(Ordering::Relaxed), round + 1);
            assert_eq!(state.readies.load(Ordering::Relaxed), round + 1);
            assert_eq!(q.in_flight(), 0);
            assert_eq!(nic.cq_ci(), nic.written, "every CQE consumed");
            assert_eq!(
                nic.sq_record(),
                0,
                "the record follows the device's counter"
            );
            let c = q.counters.snapshot();
            assert_eq!((c.packets, c.errors), (4 * (round + 1), 6 * (round + 1)));
            let x = |n: &str| xstat(&q, n);
            assert_eq!(x("tx_cqe_errors"), round + 1);
            assert_eq!(x("tx_err_local_prot"), round + 1);
            assert_eq!(x("tx_flushed"), 5 * (round + 1));
            assert_eq!(x("tx_error_drops"), 6 * (round + 1));
            assert_eq!(x("tx_recoveries"), round + 1);
            assert_eq!(pool.in_use(), 0, "every packet freed");
        }
        // Back to normal: 32 packets from WQE 0, the completion request on the last.
        let mut b = burst_of(&pool, 32, 9);
        assert_eq!(q.tx_burst(&mut b), 32);
        let w = nic.wqe(31, 16);
        let c = CtrlSeg::new_checked(&w[..]).unwrap();
        assert_eq!((c.wqe_index(), c.ce()), (31, CE_ALWAYS));
        nic.complete(31);
        q.reclaim();
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.counters.snapshot().packets, 20 + 32);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// A RESET that fails leaves the queue down: counted, bursts take nothing (the packets
    /// stay with the caller) and return at once; a retry every RECOVERY_RETRY_BURSTS bursts;
    /// once a retry succeeds the queue sends again from WQE 0. A queue that never recovers
    /// keeps answering 0 and gives every buffer back when dropped.
    #[test]
    fn a_failing_reset_leaves_the_queue_down_and_retries_without_spinning() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-downq", 512)).unwrap();
        let state = Arc::new(TestState::default());
        let (mut q, mut nic) = queue_with(&pool, 18, Arc::clone(&state));
        let mut b = burst_of(&pool, 4, 1);
        assert_eq!(q.tx_burst(&mut b), 4);
        nic.fail(1, Syndrome::LocalQpOp);
        nic.fail(2, Syndrome::WrFlush);
        state.fail.store(1, Ordering::Relaxed);
        q.reclaim();
        assert!(q.is_down());
        let x = xstat;
        assert_eq!(x(&q, "tx_recovery_failures"), 1);
        assert_eq!(x(&q, "tx_err_local_qp_op"), 1);
        // Packet 0 was sent, 1 failed; 2 and 3 wait for the recovery.
        assert_eq!(q.in_flight(), 2);
        let mut b = burst_of(&pool, 8, 2);
        for k in 1..RECOVERY_RETRY_BURSTS {
            assert_eq!(q.tx_burst(&mut b), 0, "burst {k}");
            assert_eq!(b.len(), 8);
        }
        assert_eq!(state.resets.load(Ordering::Relaxed), 0);
        // The retry: it works this time; the same call sends.
        assert_eq!(q.tx_burst(&mut b), 8);
        assert!(!q.is_down());
        assert_eq!(state.resets.load(Ordering::Relaxed), 1);
        assert_eq!(x(&q, "tx_flushed"), 1);
        assert_eq!(q.counters.snapshot().errors, 3);
        assert_eq!(
            CtrlSeg::new_checked(&nic.wqe(0, 16)[..])
                .unwrap()
                .wqe_index(),
            0
        );
        assert_eq!(nic.sq_record(), 8);
        // Now it never comes back.
        nic.fail(0, Syndrome::LocalProt);
        state.fail.store(u64::MAX, Ordering::Relaxed);
        let mut b = burst_of(&pool, 8, 3);
        for _ in 0..5 * RECOVERY_RETRY_BURSTS {
            assert_eq!(q.tx_burst(&mut b), 0);
        }
        // The first burst found the error and failed; then one retry per 1024 bursts.
        assert_eq!(x(&q, "tx_recovery_failures"), 1 + 1 + 4);
        assert!(q.is_down());
        drop(b);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    impl Nic {
        /// The device's side after a doorbell: walks the WQEs posted since `*seen` (a WQEBB
        /// counter) up to the SQ record and writes a CQE for each that asks for one (CE =
        /// ALWAYS). Returns the CQEs written.
        fn step(&mut self, seen: &mut u32) -> u32 {
            let rec = self.sq_record();
            let mut n = 0;
            while (*seen & 0xffff) != rec {
                let w = self.wqe(*seen % WQE_CNT, 16);
                let c = CtrlSeg::new_checked(&w[..]).unwrap();
                assert_eq!(c.wqe_index(), *seen as u16, "WQEs back to back");
                if c.ce() == CE_ALWAYS {
                    self.complete(c.wqe_index());
                    n += 1;
                }
                *seen = seen.wrapping_add(crate::hw::mlx5::wqebbs(usize::from(c.ds())) as u32);
            }
            n
        }
    }

    /// Packet shapes for the stall tests: 0 single segment, 1 three segments (two WQEBBs
    /// without inline), 2 TSO over two segments, 3 VLAN insertion, 4 twenty segments (six
    /// WQEBBs), 5 single segment with checksum flags (another eMPW run).
    fn shaped(pool: &Arc<MbufPool>, shape: u32, seed: u8) -> Mbuf {
        let segs = match shape {
            1 => 3,
            2 => 2,
            4 => 20,
            _ => 1,
        };
        let mut m = frame(pool, 60 + usize::from(seed % 8), seed);
        for k in 1..segs {
            m.chain(frame(pool, 100, seed.wrapping_add(k))).unwrap();
        }
        match shape {
            2 => {
                m.set_ol_flags(OffloadFlags::TX_TCP_SEG | OffloadFlags::TX_IPV4);
                m.set_tx_offload(mempool::TxOffload {
                    l2_len: 14,
                    l3_len: 20,
                    l4_len: 20,
                    tso_segsz: 1448,
                });
            }
            3 => {
                m.set_ol_flags(OffloadFlags::TX_VLAN);
                m.set_vlan_tci(7);
            }
            5 => m.set_ol_flags(OffloadFlags::TX_IP_CKSUM),
            _ => {}
        }
        m
    }

    /// Fewer packets than the completion threshold, then the queue goes idle: the empty
    /// burst asks for their completion (one NOP WQE), so their mbufs come back and
    /// `opackets` counts them; a second empty burst posts nothing more.
    #[test]
    fn an_idle_queue_completes_every_packet_it_sent() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-idle", 512)).unwrap();
        for min_inline in [0, 18] {
            let (mut q, mut nic) = queue(&pool, min_inline);
            let mut seen = 0u32;
            let mut b = burst_of(&pool, 5, 1);
            assert_eq!(q.tx_burst(&mut b), 5);
            assert_eq!(
                nic.step(&mut seen),
                0,
                "below the threshold: no completion asked"
            );
            assert_eq!(q.in_flight(), 5);
            let rec = nic.sq_record();
            let mut empty = Burst::with_capacity(1);
            assert_eq!(q.tx_burst(&mut empty), 0);
            assert_eq!(nic.sq_record(), rec.wrapping_add(1), "one NOP WQEBB");
            let w = nic.wqe(rec % WQE_CNT, 16);
            let c = CtrlSeg::new_checked(&w[..]).unwrap();
            assert_eq!((c.opcode(), c.ce(), c.ds()), (Opcode::Nop, CE_ALWAYS, 1));
            assert_eq!(nic.step(&mut seen), 1);
            assert_eq!(q.tx_burst(&mut empty), 0);
            assert_eq!(q.in_flight(), 0, "every mbuf back");
            let st = q.counters.snapshot();
            assert_eq!((st.packets, st.bytes), (5, (60..65).sum::<u64>()));
            assert_eq!(
                nic.sq_record(),
                rec.wrapping_add(1),
                "nothing more while idle"
            );
            drop(q);
            assert_eq!(pool.in_use(), 0);
        }
    }

    /// The reviewer's case: an SQ of 64 WQEBBs with 64 descriptors, a burst of 64
    /// three-segment packets (two WQEBBs each, no inline). 32 fit; the last one posted must
    /// ask for the completion, or nothing ever completes and every later burst sends 0.
    #[test]
    fn a_burst_that_fills_the_sq_midway_still_asks_for_a_completion() {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-stall", 2048)).unwrap();
        let (mut q, mut nic) = queue(&pool, 0);
        let mut seen = 0u32;
        let mut b = Burst::with_capacity(64);
        for k in 0..64 {
            b.push(shaped(&pool, 1, k)).unwrap();
        }
        assert_eq!(q.tx_burst(&mut b), 32, "32 WQEs of two WQEBBs fill the SQ");
        let w = nic.wqe(62, 16);
        assert_eq!(CtrlSeg::new_checked(&w[..]).unwrap().ce(), CE_ALWAYS);
        assert_eq!(nic.step(&mut seen), 1);
        assert_eq!(
            q.tx_burst(&mut b),
            32,
            "the completion made room for the rest"
        );
        nic.step(&mut seen);
        q.reclaim();
        assert_eq!(q.in_flight(), 0);
        drop(q);
        assert_eq!(pool.in_use(), 0);
    }

    /// Every mix of WQE shapes (SEND, multi-segment, TSO, VLAN, eMPW runs, with and without
    /// inline headers) and burst sizes, with a device that completes only what is asked for:
    /// the queue never stops sending (no burst offered packets three times in a row without
    /// taking one), and once the offered packets are all taken, a last full-ring burst
    /// completes and frees every earlier packet; the pool ends whole.
    #[test]
    fn no_mix_of_wqe_sizes_leaves_the_queue_stalled() {
        for min_inline in [0u16, 18] {
            for seed in 0..40u32 {
                let pool = MbufPool::new(MbufPoolConfig::new("mlx5-tx-mix", 8192)).unwrap();
                let (mut q, mut nic) = queue(&pool, min_inline);
                let mut seen = 0u32;
                let mut rng =
                    0x9e37_79b9u32 ^ seed.wrapping_mul(0x85eb_ca6b) ^ u32::from(min_inline);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    rng
                };
                let (mut offered, mut idle) = (0u32, 0u32);
                let mut b = Burst::with_capacity(64);
                while offered < 600 || !b.is_empty() {
                    while b.len() < 1 + (next() % 64) as usize && offered < 600 {
                        // Shapes weighted by the seed: some runs mostly big WQEs.
                        let shape = match (next() % 8, seed % 4) {
                            (s, 0) => s % 6,
                            (s, 1) if s < 5 => 4,
                            (s, 2) if s < 5 => 1,
                            (s, _) => s % 6,
                        };
                        b.push(shaped(&pool, shape, offered as u8)).unwrap();
                        offered += 1;
                    }
                    let took = q.tx_burst(&mut b);
                    nic.step(&mut seen);
                    idle = if took == 0 { idle + 1 } else { 0 };
                    assert!(
                        idle < 3,
                        "stalled: inline {min_inline}, seed {seed}, {} in flight, {offered} offered",
                        q.in_flight()
                    );
                }
                drop(b);
                drop(q);
                assert_eq!(pool.in_use(), 0, "inline {min_inline}, seed {seed}");
            }
        }
    }
}
