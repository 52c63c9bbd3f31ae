//! MANA TX queue: builds GDMA WQEs straight into the circular SQ, rings one doorbell per
//! burst, and frees exactly the mbufs whose WQEs completed, in order, in bulk.
//!
//! Completions are suppressed on every WQE of a burst but the last one actually posted
//! (§4.1 `suppress_txcqe_gen`, what DPDK does, §8.2): the device writes one TX_OKAY CQE per
//! burst, which completes every descriptor up to that WQE. A failed WQE gets an error CQE
//! whether suppressed or not (DPDK's 2026 rule, §8.2, §11 item 16): the queue finds the
//! descriptor by the CQE's WQE offset within the oldest run (the descriptors before it were
//! sent, it failed); when the offset names none of them it falls back to DPDK's reading (the
//! oldest descriptor failed). Since the last WQE of every burst asks for a completion, no
//! WQE is ever left waiting for one: a queue that is full always has a CQE coming. The CQ
//! has at least as many entries as the descriptor ring (one CQE per WQE at most), so it
//! cannot overflow.
#![deny(unsafe_code)]

use super::cq::CompletionQueue;
use super::{QueueOwner, RawTxQueue, Xstats};
use crate::ethdev::{kick, Burst, Counters, Kick, TxBurst};
use crate::hw::mana::cqe::{Cqe, CqeHeader, CqeType, CQE_HEADER_BYTES};
use crate::hw::mana::doorbell;
use crate::hw::mana::wqe::{
    sge_key_size, Sge, TxOob, TxOobFields, WqeHeader, SGE_BYTES, SHORT_OOB_BYTES, WQE_HEADER_BYTES,
};
use crate::hw::mana::{BU_BYTES, CQE_BYTES, MAX_SQ_WQE_BYTES, MAX_TX_SGES};
use crate::net::parse::{pseudo_sum, IpVersion};
use crate::ring::{Polled, WorkQueue};
use crate::sys::Doorbell;
use mempool::lcache::with_cache;
use mempool::{ChunkKeys, Iova, Mbuf, MbufFifo, MbufPool, OffloadFlags};
use std::sync::Arc;

/// `suppress_txcqe_gen` in the first byte of the TX OOB (§4.1).
const SUPPRESS_BIT: u8 = 0x80;
/// The 27 bits of a TX CQE's WQE offset (§7.5), in BUs.
const TX_WQE_OFFSET_MASK: u32 = 0x07ff_ffff;

/// A MANA TX queue, owned by one core.
pub struct TxQueue {
    wq: WorkQueue,
    cq: CompletionQueue,
    db: Doorbell,
    sq_id: u32,
    cq_id: u32,
    vp_offset: u16,
    /// In-flight packets, in posting order (freed in bulk).
    desc: MbufFifo,
    /// Per descriptor (by free-running position): the first BU of its WQE, the SQ position
    /// after it (free-running BUs), and its packet's length.
    d_at: Box<[u32]>,
    d_end: Box<[u32]>,
    d_len: Box<[u32]>,
    /// Runs in flight, oldest first: the descriptor position each ends at (exclusive); the
    /// last WQE of each asked for a completion.
    reqs: Box<[u32]>,
    req_head: u32,
    req_tail: u32,
    pool: Arc<MbufPool>,
    keys: ChunkKeys,
    counters: Arc<Counters>,
    xstats: Arc<Xstats>,
    /// Keeps the SQ, CQ and doorbell mapping alive while this handle exists.
    _owner: QueueOwner,
    /// The device's work on this thread (a device model's inline engine; `None` on hardware).
    kick: Kick,
    /// Completed packets waiting to be freed in one go.
    done: Vec<Mbuf>,
    /// Per packet of the current burst: its WQE's first BU and the SQ position after it, or
    /// `None` when it was dropped as unsendable.
    posted: Vec<Option<(u32, u32)>>,
    wqe: [u8; MAX_SQ_WQE_BYTES],
    /// Where the frames in flight go when the queue drops (last field: after `_owner`).
    parked: Arc<crate::ethdev::Parked>,
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mana::TxQueue(sq {:#x}, {} in flight)",
            self.sq_id,
            self.in_flight()
        )
    }
}

impl TxQueue {
    /// A TX queue over `raw` with `nb_desc` descriptors (a power of two, at most the CQ's
    /// entries), sending mbufs of `pool` whose chunks `keys` registered. Public so a test can
    /// run the datapath on queue memory it controls.
    ///
    /// # Panics
    /// If `nb_desc` is not a power of two or the CQ is smaller.
    pub fn new(
        raw: RawTxQueue,
        nb_desc: u16,
        pool: Arc<MbufPool>,
        keys: ChunkKeys,
        counters: Arc<Counters>,
        xstats: Arc<Xstats>,
    ) -> Self {
        let n = u32::from(nb_desc);
        assert!(
            n.is_power_of_two() && raw.cq_count >= n,
            "tx ring {n} needs a CQ of at least {n} entries"
        );
        tracing::debug!(target: "pmd::mana::init", sq_id = raw.sq_id, cq_id = raw.cq_id, sq_bytes = raw.sq.len(), nb_desc, "tx queue");
        Self {
            wq: WorkQueue::new(raw.sq, BU_BYTES),
            cq: CompletionQueue::new(raw.cq, raw.cq_count),
            db: Doorbell::new(raw.db_page, raw.db_monitor),
            sq_id: raw.sq_id,
            cq_id: raw.cq_id,
            vp_offset: raw.tx_vp_offset,
            desc: MbufFifo::new(&pool, n),
            d_at: vec![0; n as usize].into_boxed_slice(),
            d_end: vec![0; n as usize].into_boxed_slice(),
            d_len: vec![0; n as usize].into_boxed_slice(),
            reqs: vec![0; n as usize].into_boxed_slice(),
            req_head: 0,
            req_tail: 0,
            pool,
            keys,
            counters,
            xstats,
            _owner: raw.owner,
            parked: raw.parked,
            kick: raw.kick,
            done: Vec::with_capacity(n as usize),
            posted: Vec::with_capacity(n as usize),
            wqe: [0; MAX_SQ_WQE_BYTES],
        }
    }

    /// Packets handed to the device and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.desc.len()
    }

    /// Processes completions: frees completed packets, counts errors. Returns how many.
    pub fn reclaim(&mut self) -> u32 {
        let mut n = 0u32;
        while !self.desc.is_empty() {
            let off = match self.cq.poll() {
                Polled::Entry(off) => off,
                Polled::Empty => break,
                Polled::Overflow => {
                    Xstats::bump(&self.xstats.cq_overflows);
                    break;
                }
            };
            let mut hdr = [0u8; CQE_HEADER_BYTES];
            self.cq.read(off, &mut hdr);
            let t = CqeHeader::new_checked(&hdr[..]).map_or(CqeType::Unknown(0), |h| h.cqe_type());
            if t == CqeType::TxOkay {
                self.complete_run();
            } else {
                self.complete_error(off, t);
            }
            n += 1;
        }
        n
    }

    /// A TX_OKAY CQE: the oldest run was sent, every descriptor of it.
    #[inline]
    fn complete_run(&mut self) {
        if self.req_tail == self.req_head {
            // A success for a WQE that asked for none: nothing can be trusted from it.
            Xstats::bump(&self.xstats.tx_unexpected_cqes);
            return;
        }
        let mask = self.reqs.len() as u32 - 1;
        let end = self.reqs[(self.req_tail & mask) as usize];
        self.req_tail = self.req_tail.wrapping_add(1);
        self.complete_to(end, 0);
    }

    /// Frees the descriptors up to position `end` (exclusive), the last `failed` of them
    /// failed (counted as errors), the others sent; the SQ is consumed up to the last one.
    #[inline]
    fn complete_to(&mut self, end: u32, failed: u32) {
        let mask = self.reqs.len() as u32 - 1;
        let from = self.desc.popped();
        let count = end.wrapping_sub(from);
        if count == 0 || count > self.desc.len() {
            return;
        }
        let ok = count - failed;
        let bytes: u64 = (0..ok)
            .map(|k| u64::from(self.d_len[(from.wrapping_add(k) & mask) as usize]))
            .sum();
        self.wq
            .complete_to(self.d_end[(end.wrapping_sub(1) & mask) as usize]);
        let desc = &mut self.desc;
        with_cache(&self.pool, |cache| desc.free_front(count, cache));
        self.counters.add(u64::from(ok), bytes);
        self.counters.add_errors(u64::from(failed));
    }

    /// An error CQE (type `t`) at CQ offset `off`: one WQE failed, suppressed or not. It is
    /// the descriptor of the oldest run whose WQE starts at the CQE's WQE offset (those before
    /// it were sent); if the offset names none, the oldest descriptor (DPDK's reading, §8.2).
    #[cold]
    fn complete_error(&mut self, off: usize, t: CqeType) {
        crate::dp_trace!(sq = self.sq_id, cqe = ?t, "tx error completion");
        // (The type is only traced: every error type fails the WQE alike.)
        let _ = t;
        Xstats::bump(&self.xstats.tx_cqe_errors);
        let mut b = [0u8; CQE_BYTES];
        self.cq.read(off, &mut b);
        let wqe_bu = Cqe::new_checked(&b[..]).map(|c| c.tx_wqe_offset());
        let mask = self.reqs.len() as u32 - 1;
        let from = self.desc.popped();
        let end = if self.req_tail != self.req_head {
            self.reqs[(self.req_tail & mask) as usize]
        } else {
            self.desc.pushed()
        };
        let failed = (0..end.wrapping_sub(from))
            .map(|k| from.wrapping_add(k))
            .find(|&k| Some(self.d_at[(k & mask) as usize] & TX_WQE_OFFSET_MASK) == wqe_bu)
            .unwrap_or(from);
        let upto = failed.wrapping_add(1);
        if upto == end && self.req_tail != self.req_head {
            // The run's last WQE failed: no TX_OKAY will come for it.
            self.req_tail = self.req_tail.wrapping_add(1);
        }
        self.complete_to(upto, 1);
    }

    /// See [`crate::ethdev::TxBurst::tx_burst`].
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        // Work the device left for later (a software device's), before completions are read.
        kick::run(&self.kick);
        self.reclaim();
        let room = self.desc.free() as usize;
        self.posted.clear();
        for i in 0..pkts.len().min(room) {
            match self.build_wqe(&mut pkts.as_mut_slice()[i]) {
                Build::Wqe(bytes) => {
                    let at = self.wq.head();
                    if self.wq.post(&self.wqe[..bytes]).is_none() {
                        break;
                    }
                    self.posted.push(Some((at, self.wq.head())));
                }
                Build::Small(w) => {
                    if self.wq.free() == 0 {
                        break;
                    }
                    // One BU, contiguous in the ring: straight in, two 16-byte stores.
                    let at = self.wq.head();
                    let mem = self.wq.mem();
                    let off = self.wq.head_bytes() as usize & (mem.len() - 1);
                    mem.write_2x64(off, w[0].to_le(), w[1].to_le());
                    mem.write_2x64(off + 16, w[2].to_le(), w[3].to_le());
                    self.wq.advance(1);
                    self.posted.push(Some((at, self.wq.head())));
                }
                // Unsendable: taken (and freed, counted) so it cannot block the queue.
                Build::Drop => self.posted.push(None),
            }
        }
        let taken = self.posted.len();
        let mut last_at = None;
        // Move the taken packets into the descriptor ring, in order.
        let mut errs = 0;
        let mask = self.reqs.len() as u32 - 1;
        for (m, p) in pkts.drain_front(taken).zip(&self.posted) {
            match p {
                // At most `room` packets were taken, so the ring has space for each.
                Some((at, end)) => {
                    last_at = Some(*at);
                    let k = (self.desc.pushed() & mask) as usize;
                    self.d_at[k] = *at;
                    self.d_end[k] = *end;
                    self.d_len[k] = m.pkt_len();
                    let _ = self.desc.push(m);
                }
                None => {
                    errs += 1;
                    self.done.push(m);
                }
            }
        }
        if errs > 0 {
            self.counters.add_errors(errs);
            let done = &mut self.done;
            with_cache(&self.pool, |cache| {
                done.drain(..).for_each(|m| m.free_to(cache))
            });
        }
        if let Some(at) = last_at {
            // The last WQE posted asks for the completion of the whole run: its OOB's
            // suppress bit (dword 0 bit 7, after the 8-byte header) cleared in the ring.
            let mem = self.wq.mem();
            let off = (at as usize * BU_BYTES + WQE_HEADER_BYTES) & (mem.len() - 1);
            let mut b = [0u8; 1];
            mem.read(off, &mut b);
            mem.write(off, &[b[0] & !SUPPRESS_BIT]);
            self.reqs[(self.req_head & mask) as usize] = self.desc.pushed();
            self.req_head = self.req_head.wrapping_add(1);
            // One doorbell per burst, with the absolute producer position (§6.3).
            self.db.ring(
                doorbell::SQ_OFFSET,
                doorbell::sq(self.sq_id, self.wq.head_bytes()),
            );
            kick::run(&self.kick);
        }
        taken
    }

    /// Writes the WQE for `m` into `self.wqe`; its length in bytes.
    #[inline]
    fn build_wqe(&mut self, m: &mut Mbuf) -> Build {
        let flags = m.ol_flags();
        let mut f = TxOobFields {
            // Every WQE suppressed; the burst's last one is then asked (`tx_burst`).
            suppress_cqe: true,
            vcq_num: self.cq_id,
            sq_id: self.sq_id,
            vp_offset: self.vp_offset,
            ..Default::default()
        };
        // TCP segmentation (Linux's LSO rules, §4.4): headers alone in SGE 0, their length in
        // `last_vbytes`, the MSS in `client_data_unit`, IP and TCP checksums requested.
        let mut lso: Option<(usize, u16)> = None;
        if flags.contains(OffloadFlags::TX_TCP_SEG) {
            let o = m.tx_offload();
            let v6 = flags.contains(OffloadFlags::TX_IPV6);
            let l3 = usize::from(o.l2_len);
            let l4 = l3 + usize::from(o.l3_len);
            let hdr = l4 + usize::from(o.l4_len);
            let ok = o.l4_len >= 20
                && o.tso_segsz > 0
                && o.tso_segsz <= 0x3fff
                && hdr <= 0xff
                && prepare_lso(m.data_mut(), l3, l4, hdr, v6);
            if !ok {
                Xstats::bump(&self.xstats.tx_bad_tso);
                return Build::Drop;
            }
            f.outer_ipv4 = !v6;
            f.outer_ipv6 = v6;
            f.ip_csum = !v6;
            f.tcp_csum = true;
            f.trans_off = l4 as u16;
            lso = Some((hdr, o.tso_segsz));
        } else if flags.intersects(
            OffloadFlags::TX_IP_CKSUM
                | OffloadFlags::TX_TCP_CKSUM
                | OffloadFlags::TX_UDP_CKSUM
                | OffloadFlags::TX_IPV4
                | OffloadFlags::TX_IPV6,
        ) {
            f.outer_ipv4 = flags.contains(OffloadFlags::TX_IPV4);
            f.outer_ipv6 = flags.contains(OffloadFlags::TX_IPV6);
            f.ip_csum = flags.contains(OffloadFlags::TX_IP_CKSUM);
            let l4 = flags.intersects(OffloadFlags::TX_TCP_CKSUM | OffloadFlags::TX_UDP_CKSUM);
            if l4 {
                let tcp = flags.contains(OffloadFlags::TX_TCP_CKSUM);
                let o = m.tx_offload();
                let l3 = usize::from(o.l2_len);
                let l4_off = l3 + usize::from(o.l3_len);
                if !write_pseudo_header(m.data_mut(), l3, l4_off, tcp, f.outer_ipv6, None) {
                    Xstats::bump(&self.xstats.tx_bad_offload);
                    return Build::Drop;
                }
                f.tcp_csum = tcp;
                f.udp_csum = !tcp;
                f.trans_off = l4_off as u16;
            }
        }
        if flags.contains(OffloadFlags::TX_VLAN) {
            let tci = m.vlan_tci();
            f.vlan = Some(((tci >> 13) as u8, tci & 0x1000 != 0, tci & 0x0fff));
        }
        // With LSO the first segment is split after the headers.
        let split = lso.map_or(0, |(hdr, _)| hdr);
        let first_len = m.len();
        let nsge = usize::from(m.nb_segs()) + usize::from(split > 0 && first_len > split);
        if nsge > MAX_TX_SGES {
            Xstats::bump(&self.xstats.tx_too_many_segs);
            return Build::Drop;
        }
        let oob = f.oob_bytes();
        if nsge == 1 && lso.is_none() && oob == SHORT_OOB_BYTES {
            // The common WQE, one BU (§3.1): header, short OOB, one SGE, as four words.
            let data = m.data();
            let addr = data.as_ptr() as usize;
            let Some(key) = self.keys.key_for_addr(addr) else {
                Xstats::bump(&self.xstats.tx_no_mkey);
                return Build::Drop;
            };
            let [dw0, dw1] = f.first_dwords();
            return Build::Small([
                SMALL_WQE_HEADER,
                u64::from(dw0) | (u64::from(dw1) << 32),
                Iova(addr as u64).0,
                sge_key_size(key, data.len() as u32),
            ]);
        }
        let sge_off = WQE_HEADER_BYTES + oob;
        let bytes = crate::hw::mana::wqe::wqe_bytes(oob, nsge);
        let w = &mut self.wqe[..bytes];
        if let Some(mut h) = WqeHeader::new_checked(&mut w[..WQE_HEADER_BYTES]) {
            h.init(oob, nsge as u8);
            if let Some((hdr, mss)) = lso {
                h.set_client_oob_in_sgl(true);
                h.set_last_vbytes(hdr as u8);
                h.set_client_data_unit(mss);
            }
        }
        if let Some(mut o) = TxOob::new_checked(&mut w[WQE_HEADER_BYTES..sge_off]) {
            o.write(&f);
        }
        let mut at = sge_off;
        for (i, seg) in m.segments().enumerate() {
            let addr = seg.as_ptr() as usize;
            let Some(key) = self.keys.key_for_addr(addr) else {
                Xstats::bump(&self.xstats.tx_no_mkey);
                return Build::Drop;
            };
            let pieces: [(usize, usize); 2] = if i == 0 && split > 0 && seg.len() > split {
                [(addr, split), (addr + split, seg.len() - split)]
            } else {
                [(addr, seg.len()), (0, 0)]
            };
            for (a, n) in pieces.into_iter().filter(|p| p.1 > 0) {
                if let Some(mut s) = Sge::new_checked(&mut w[at..at + SGE_BYTES]) {
                    s.set(Iova(a as u64), key, n as u32);
                }
                at += SGE_BYTES;
            }
        }
        Build::Wqe(bytes)
    }
}

impl TxBurst for TxQueue {
    #[inline]
    fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        TxQueue::tx_burst(self, pkts)
    }
}

enum Build {
    /// A WQE of this many bytes in the staging buffer.
    Wqe(usize),
    /// A one-BU WQE (header, short OOB, one SGE) as four little-endian words.
    Small([u64; 4]),
    Drop,
}

/// The header of a one-BU WQE: no last-vbytes, one SGE, an 8-byte OOB (§3.1: `num_sge` in
/// dword 1 bits 7:0, the OOB size in dwords in bits 10:8).
const SMALL_WQE_HEADER: u64 = (1 | ((SHORT_OOB_BYTES as u64 / 4) << 8)) << 32;

/// Zeroes the IPv4 total length and header checksum (IPv6: payload length) and stores the
/// pseudo-header sum computed with length 0 in the TCP checksum (Linux's LSO convention,
/// §4.4). `false` if the headers do not fit the first segment.
fn prepare_lso(data: &mut [u8], l3: usize, l4: usize, hdr: usize, ipv6: bool) -> bool {
    if data.len() < hdr {
        return false;
    }
    if ipv6 {
        data[l3 + 4..l3 + 6].copy_from_slice(&[0, 0]);
    } else {
        data[l3 + 2..l3 + 4].copy_from_slice(&[0, 0]);
        data[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    }
    write_pseudo_header(data, l3, l4, true, ipv6, Some(0))
}

/// Stores the pseudo-header sum in the L4 checksum field (DPDK's convention for MANA, §4.3),
/// with the L4 length from the IP header, or `l4_len` when given. `false` if the headers are
/// not where the offsets say.
fn write_pseudo_header(
    data: &mut [u8],
    l3: usize,
    l4: usize,
    tcp: bool,
    ipv6: bool,
    l4_len: Option<u16>,
) -> bool {
    let field = l4 + if tcp { 16 } else { 6 };
    let fixed = if ipv6 { 40 } else { 20 };
    if field + 2 > data.len() || l4 < l3 || l3 + fixed > data.len() {
        return false;
    }
    let be16 = |at: usize| u16::from_be_bytes([data[at], data[at + 1]]);
    let (version, proto, len) = if ipv6 {
        // Next header and payload length of the fixed IPv6 header.
        (
            IpVersion::V6,
            data[l3 + 6],
            l4_len.unwrap_or_else(|| be16(l3 + 4)),
        )
    } else {
        let total = be16(l3 + 2);
        let len = l4_len.unwrap_or_else(|| total.saturating_sub((l4 - l3) as u16));
        (IpVersion::V4, data[l3 + 9], len)
    };
    let sum = pseudo_sum(data, l3, version, proto, usize::from(len));
    data[field..field + 2].copy_from_slice(&sum.to_be_bytes());
    true
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        // Completions that arrived are accounted; what is still in flight is freed unsent,
        // and counted as lost (transmit errors): the port's counters outlive the queue (a
        // queue rebuilt after a device reset keeps them), so the frames a dead device never
        // sent are not lost uncounted.
        self.reclaim();
        self.counters.add_errors(u64::from(self.in_flight()));
        // The device may still read them until the SQ is destroyed (the port holds it too):
        // they wait there (see `Parked`), not in the pool.
        let in_flight = std::mem::replace(&mut self.desc, MbufFifo::new(&self.pool, 1));
        self.parked.park(in_flight);
    }
}

#[cfg(test)]
mod small_wqe_tests {
    use super::*;

    #[test]
    fn the_small_header_is_what_the_header_writer_writes() {
        let mut b = [0u8; WQE_HEADER_BYTES];
        WqeHeader::new_checked(&mut b[..])
            .unwrap()
            .init(SHORT_OOB_BYTES, 1);
        assert_eq!(u64::from_le_bytes(b), SMALL_WQE_HEADER);
    }
}
