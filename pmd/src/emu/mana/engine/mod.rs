//! The MANA NIC's side of the queues: consumes SQ WQEs after doorbells, reads frames through
//! memory keys, applies TX offloads, puts frames on the wire; takes frames off the wire into
//! posted RQ buffers; writes CQEs with owner bits. Written from the spec as the device's
//! behaviour (§10 "What a faithful device model must reproduce"), not from the driver's code.
#![deny(unsafe_code)]

use crate::emu::wire::{Wire, MAX_FRAME};
use crate::hw::mana::cqe::{hash_type, owner_for, Cqe, CqeType, RxCsum, CLIENT_TYPE_COMPLETION};
use crate::hw::mana::doorbell::{self, DoorbellKind};
use crate::hw::mana::wqe::{
    Sge, TxOob, WqeHeader, LONG_OOB_BYTES, SGE_BYTES, SHORT_OOB_BYTES, WQE_HEADER_BYTES,
};
use crate::hw::mana::{BU_BYTES, CQE_BYTES, MAX_SQ_WQE_BYTES, RSS_TABLE_ENTRIES};
use crate::net::{csum, toeplitz};
use crate::sys::mem::fence_before_owner_write;
use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `vendor_err` the model puts in a TX CQE whose SGE is outside registered memory.
pub const VENDOR_ERR_BAD_MKEY: u32 = 0x4d4b; // "MK"
/// `vendor_err` for a WQE whose header or OOB is malformed.
pub const VENDOR_ERR_BAD_WQE: u32 = 0x5751; // "WQ"
/// `vendor_err` for an error injected on purpose.
pub const VENDOR_ERR_INJECTED: u32 = 0x464c; // "FL"

/// Faults on demand; all deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every n-th TX WQE completes with TX_VPORT_DISABLED instead of being sent (0: off).
    pub tx_error_every: u32,
    /// Every n-th frame from the wire is dropped before reaching an RQ (0: off).
    pub rx_drop_every: u32,
    /// Every n-th RX frame completes as RX_TRUNCATED (0: off).
    pub rx_error_every: u32,
    /// Link down: frames in both directions are dropped (TX still completes, as on a NIC
    /// whose cable is out).
    pub link_down: bool,
    /// Completions are held back for this many engine steps (slow completions).
    pub completion_delay_steps: u32,
    /// RX CQE coalescing (newer kernels enable it for RSS QPs): up to four packets per
    /// RX_COALESCED_4 CQE.
    pub rx_coalesce: bool,
}

/// Device-side counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Frames put on the wire.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// TX WQEs completed with an error.
    pub tx_errors: u64,
    /// Frames the wire refused (receiver full).
    pub tx_wire_drops: u64,
    /// Frames delivered into RQ buffers.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames dropped because no RX WQE was posted (the NIC's "discarded, no WQE").
    pub rx_no_wqe: u64,
    /// Frames larger than the posted buffer (RX_TRUNCATED).
    pub rx_truncated: u64,
    /// Frames dropped by faults or link down.
    pub rx_fault_drops: u64,
    /// Doorbells whose queue id did not match the queue.
    pub bad_doorbells: u64,
    /// RX CQEs written (fewer than frames when coalescing).
    pub rx_cqes: u64,
}

pub(crate) struct Sq {
    pub mem: Arc<DevMem>,
    pub id: u32,
    pub cq: usize,
    pub db: Arc<DevMem>,
    pub vp_offset: u16,
    /// Consumer position in bytes (free-running).
    pub consumed: u32,
}

pub(crate) struct Rq {
    pub mem: Arc<DevMem>,
    pub id: u32,
    pub cq: usize,
    pub db: Arc<DevMem>,
    pub consumed: u32,
}

pub(crate) struct Cq {
    pub mem: Arc<DevMem>,
    pub count: u32,
    pub id: u32,
    /// CQEs written since creation.
    pub written: u64,
    /// Completions waiting out `completion_delay_steps`: (due step, body, wq, is_sq).
    pub delayed: std::collections::VecDeque<(u64, [u8; CQE_BYTES], u32, bool)>,
}

pub(crate) struct Mr {
    pub lkey: u32,
    pub addr: usize,
    pub len: usize,
    pub mem: DevMem,
}

/// RSS state (§1.6 step 6): key and the 64-entry table `entry[k] = rq[k mod n]`.
pub(crate) struct Rss {
    pub key: [u8; 40],
    pub table: [u16; RSS_TABLE_ENTRIES],
    pub enabled: bool,
}

/// The engine: every queue, memory region and the wire of one modelled port.
pub struct Engine {
    pub(crate) sqs: Vec<Sq>,
    pub(crate) rqs: Vec<Rq>,
    pub(crate) cqs: Vec<Cq>,
    pub(crate) mrs: Vec<Mr>,
    pub(crate) rss: Rss,
    pub(crate) wire: Box<dyn Wire>,
    pub(crate) faults: Faults,
    pub(crate) stats: ModelStats,
    frame: Vec<u8>,
    seg: Vec<u8>,
    coalescing: Option<Coalescing>,
    steps: u64,
    tx_seen: u64,
    rx_seen: u64,
}

/// Largest packet a TSO WQE may describe (the IPv4 total length limit plus headers).
pub const LSO_MAX_BYTES: usize = 65536 + 256;

/// Frames or WQEs handled per queue per step, so one busy queue cannot starve the others.
const BUDGET: usize = 64;

impl Engine {
    pub(crate) fn new(wire: Box<dyn Wire>) -> Self {
        Self {
            sqs: Vec::new(),
            rqs: Vec::new(),
            cqs: Vec::new(),
            mrs: Vec::new(),
            rss: Rss {
                key: [0; 40],
                table: [0; RSS_TABLE_ENTRIES],
                enabled: false,
            },
            wire,
            faults: Faults::default(),
            stats: ModelStats::default(),
            frame: vec![0; LSO_MAX_BYTES + 4],
            seg: Vec::with_capacity(MAX_FRAME + 4),
            coalescing: None,
            steps: 0,
            tx_seen: 0,
            rx_seen: 0,
        }
    }

    /// One pass over every queue and the wire; returns the work done (WQEs + frames + CQEs).
    pub fn step(&mut self) -> usize {
        self.steps += 1;
        let mut work = 0;
        for i in 0..self.sqs.len() {
            work += self.process_sq(i);
        }
        work += self.process_wire();
        work += self.release_delayed();
        work
    }

    fn release_delayed(&mut self) -> usize {
        let mut n = 0;
        for cq in &mut self.cqs {
            while cq.delayed.front().is_some_and(|d| d.0 <= self.steps) {
                if let Some((_, body, wq, is_sq)) = cq.delayed.pop_front() {
                    write_cqe_now(cq, &body, wq, is_sq);
                    n += 1;
                }
            }
        }
        n
    }

    fn complete(&mut self, cq: usize, body: [u8; CQE_BYTES], wq: u32, is_sq: bool) {
        if !is_sq {
            self.stats.rx_cqes += 1;
        }
        let delay = u64::from(self.faults.completion_delay_steps);
        let cq = &mut self.cqs[cq];
        if delay > 0 || !cq.delayed.is_empty() {
            cq.delayed.push_back((self.steps + delay, body, wq, is_sq));
        } else {
            write_cqe_now(cq, &body, wq, is_sq);
        }
    }

    fn mr_read(&self, addr: u64, key: u32, out: &mut [u8]) -> bool {
        match self.find_mr(addr, key, out.len()) {
            Some((mr, off)) => {
                mr.mem.read(off, out);
                true
            }
            None => false,
        }
    }

    fn find_mr(&self, addr: u64, key: u32, len: usize) -> Option<(&Mr, usize)> {
        let mr = self.mrs.iter().find(|m| m.lkey == key)?;
        let addr = usize::try_from(addr).ok()?;
        let off = addr.checked_sub(mr.addr)?;
        (off.checked_add(len)? <= mr.len).then_some((mr, off))
    }

    // ---- TX -----------------------------------------------------------------------------

    fn process_sq(&mut self, i: usize) -> usize {
        let db = self.sqs[i]
            .db
            .load_u64(doorbell::SQ_OFFSET, Ordering::Acquire);
        let d = doorbell::decode(DoorbellKind::Sq, db);
        if db == 0 {
            return 0;
        }
        if d.id != self.sqs[i].id {
            // A doorbell for another queue id: the hardware would ring that queue; ours has
            // one page per queue, so it is a driver bug. Count it and ignore it.
            if d.index != self.sqs[i].consumed {
                self.stats.bad_doorbells += 1;
            }
            return 0;
        }
        let mut done = 0;
        while self.sqs[i].consumed != d.index && done < BUDGET {
            let pending = d.index.wrapping_sub(self.sqs[i].consumed);
            let mut wqe = [0u8; MAX_SQ_WQE_BYTES];
            let sq = &self.sqs[i];
            read_ring(&sq.mem, sq.consumed, &mut wqe[..WQE_HEADER_BYTES]);
            let Some(h) = WqeHeader::new_checked(&wqe[..WQE_HEADER_BYTES]) else {
                break;
            };
            let bytes = h.wqe_bytes();
            let oob = h.inline_oob_bytes();
            let nsge = usize::from(h.num_sge());
            let wqe_ok = bytes <= MAX_SQ_WQE_BYTES
                && (oob == SHORT_OOB_BYTES || oob == LONG_OOB_BYTES)
                && nsge >= 1
                && bytes as u32 <= pending;
            if !wqe_ok {
                // Malformed or runs past the producer: complete with an error, skip 1 BU.
                let (cq, id) = (sq.cq, sq.id);
                let skip = if bytes as u32 <= pending && bytes <= MAX_SQ_WQE_BYTES {
                    bytes as u32
                } else {
                    pending
                };
                self.tx_error(
                    cq,
                    id,
                    CqeType::TxInvalidOob,
                    VENDOR_ERR_BAD_WQE,
                    self.sqs[i].consumed,
                );
                self.sqs[i].consumed = self.sqs[i].consumed.wrapping_add(skip);
                done += 1;
                continue;
            }
            let lso = (h.client_oob_in_sgl() && h.client_data_unit() > 0).then(|| {
                (
                    usize::from(h.last_vbytes()),
                    usize::from(h.client_data_unit()),
                )
            });
            read_ring(&sq.mem, sq.consumed, &mut wqe[..bytes]);
            let pos = self.sqs[i].consumed;
            self.sqs[i].consumed = pos.wrapping_add(bytes as u32);
            self.transmit(i, &wqe[..bytes], oob, nsge, pos, lso);
            done += 1;
        }
        done
    }

    fn tx_error(&mut self, cq: usize, sq_id: u32, t: CqeType, vendor_err: u32, pos: u32) {
        self.stats.tx_errors += 1;
        tracing::debug!(target: "pmd::emu", sq_id, ?t, vendor_err, pos, "TX WQE completed with an error");
        let mut body = [0u8; CQE_BYTES];
        if let Some(mut c) = Cqe::new_checked(&mut body[..]) {
            c.set_header(t, CLIENT_TYPE_COMPLETION, vendor_err);
            c.set_tx(0, 0, (pos / BU_BYTES as u32) & 0x07ff_ffff);
        }
        self.complete(cq, body, sq_id, true);
    }

    fn transmit(
        &mut self,
        i: usize,
        wqe: &[u8],
        oob_bytes: usize,
        nsge: usize,
        pos: u32,
        lso: Option<(usize, usize)>,
    ) {
        let (cq, sq_id, vp) = (self.sqs[i].cq, self.sqs[i].id, self.sqs[i].vp_offset);
        let Some(o) = TxOob::new_checked(&wqe[WQE_HEADER_BYTES..WQE_HEADER_BYTES + oob_bytes])
        else {
            return;
        };
        // Strict checks of the OOB against the queue (§10 item 1).
        let vp_ok = if oob_bytes == LONG_OOB_BYTES && vp > 0xff {
            o.long_vp_offset() == vp
        } else {
            u16::from(o.short_vp_offset()) == vp
        };
        if o.vcq_num() != self.cqs[cq].id || o.vsq_frame() != crate::hw::mana::wqe::vsq_frame(sq_id)
        {
            return self.tx_error(cq, sq_id, CqeType::TxInvalidOob, VENDOR_ERR_BAD_WQE, pos);
        }
        if !vp_ok {
            return self.tx_error(cq, sq_id, CqeType::TxVportIdxOutOfRange, 0, pos);
        }
        self.tx_seen += 1;
        if self.faults.tx_error_every > 0
            && self
                .tx_seen
                .is_multiple_of(u64::from(self.faults.tx_error_every))
        {
            return self.tx_error(
                cq,
                sq_id,
                CqeType::TxVportDisabled,
                VENDOR_ERR_INJECTED,
                pos,
            );
        }
        // Gather the frame through the memory keys; leave room for a VLAN tag at the front.
        let mut frame = std::mem::take(&mut self.frame);
        let mut len = 4usize;
        let mut ok = true;
        for k in 0..nsge {
            let at = WQE_HEADER_BYTES + oob_bytes + k * SGE_BYTES;
            let Some(s) = Sge::new_checked(&wqe[at..at + SGE_BYTES]) else {
                ok = false;
                break;
            };
            let size = s.size() as usize;
            if len + size > frame.len()
                || !self.mr_read(s.address(), s.mem_key(), &mut frame[len..len + size])
            {
                ok = false;
                break;
            }
            len += size;
        }
        if !ok {
            self.frame = frame;
            return self.tx_error(
                cq,
                sq_id,
                CqeType::TxHdrProcessingError,
                VENDOR_ERR_BAD_MKEY,
                pos,
            );
        }
        match lso {
            None => self.send_frame(&mut frame, len, &o),
            Some((hdr, mss)) => {
                // TCP segmentation (§4.4): headers (`last_vbytes`) + at most MSS payload bytes
                // per frame, IPv4 id / TCP seq advanced, FIN and PSH only on the last frame.
                if hdr < 14 + 20 + 20 || 4 + hdr > len || mss == 0 {
                    self.frame = frame;
                    return self.tx_error(
                        cq,
                        sq_id,
                        CqeType::TxHdrProcessingError,
                        VENDOR_ERR_BAD_WQE,
                        pos,
                    );
                }
                let mut seg = std::mem::take(&mut self.seg);
                let payload = len - 4 - hdr;
                let count = payload.div_ceil(mss).max(1);
                for k in 0..count {
                    let chunk = mss.min(payload - k * mss);
                    seg.clear();
                    seg.extend_from_slice(&[0; 4]);
                    seg.extend_from_slice(&frame[4..4 + hdr]);
                    seg.extend_from_slice(&frame[4 + hdr + k * mss..4 + hdr + k * mss + chunk]);
                    fix_segment(
                        &mut seg[4..],
                        hdr,
                        usize::from(o.trans_off()),
                        k,
                        count,
                        mss,
                    );
                    let n = seg.len();
                    self.send_frame(&mut seg, n, &o);
                }
                self.seg = seg;
            }
        }
        self.frame = frame;
        if !o.suppress_txcqe_gen() {
            let mut body = [0u8; CQE_BYTES];
            if let Some(mut c) = Cqe::new_checked(&mut body[..]) {
                c.set_header(CqeType::TxOkay, CLIENT_TYPE_COMPLETION, 0);
                c.set_tx(0, 0, (pos / BU_BYTES as u32) & 0x07ff_ffff);
            }
            self.complete(cq, body, sq_id, true);
        }
    }

    /// Puts `buf[4..len]` on the wire after the OOB's VLAN insertion (into the 4 bytes of
    /// headroom) and checksum requests.
    fn send_frame(&mut self, buf: &mut [u8], len: usize, o: &TxOob<&[u8]>) {
        let mut start = 4usize;
        if o.inject_vlan_pri_tag() && len - start >= 12 {
            let (pcp, dei, vid) = o.vlan();
            buf.copy_within(start..start + 12, start - 4);
            start -= 4;
            let tci = (u16::from(pcp) << 13) | (u16::from(dei) << 12) | vid;
            buf[start + 12..start + 14].copy_from_slice(&0x8100u16.to_be_bytes());
            buf[start + 14..start + 16].copy_from_slice(&tci.to_be_bytes());
        }
        let out = &mut buf[start..len];
        apply_tx_checksums(
            out,
            o.comp_iphdr_csum(),
            o.comp_tcp_csum(),
            o.comp_udp_csum(),
        );
        if self.faults.link_down {
            self.stats.tx_wire_drops += 1;
        } else if self.wire.send(out) {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += out.len() as u64;
        } else {
            self.stats.tx_wire_drops += 1;
        }
    }

    // ---- RX -----------------------------------------------------------------------------

    fn process_wire(&mut self) -> usize {
        let mut n = 0;
        while n < BUDGET {
            let mut frame = std::mem::take(&mut self.frame);
            let got = self.wire.recv(&mut frame);
            let Some(len) = got else {
                self.frame = frame;
                break;
            };
            n += 1;
            self.rx_seen += 1;
            let len = len.min(frame.len());
            let drop_fault = self.faults.rx_drop_every > 0
                && self
                    .rx_seen
                    .is_multiple_of(u64::from(self.faults.rx_drop_every));
            if self.faults.link_down || drop_fault {
                self.stats.rx_fault_drops += 1;
            } else {
                self.receive(&mut frame[..len]);
            }
            self.frame = frame;
        }
        // Coalescing never holds a packet past the end of a pass.
        self.flush_coalesced();
        n
    }

    fn receive(&mut self, frame: &mut [u8]) {
        // 802.1Q: the device strips the tag and reports the VID (§7.4).
        let mut vlan = None;
        let mut start = 0;
        if frame.len() >= 18 && frame[12..14] == [0x81, 0x00] {
            vlan = Some(u16::from_be_bytes([frame[14], frame[15]]) & 0x0fff);
            frame.copy_within(0..12, 4);
            start = 4;
        }
        let frame = &frame[start..];
        let info = classify(frame, &self.rss.key);
        let rq_idx = if self.rss.enabled && info.hash_type != 0 {
            usize::from(self.rss.table[(info.hash & (RSS_TABLE_ENTRIES as u32 - 1)) as usize])
        } else {
            // The default RX object is the last RQ created (§1.6 step 6).
            self.rqs.len().wrapping_sub(1)
        };
        let Some(rq) = self.rqs.get(rq_idx) else {
            self.stats.rx_no_wqe += 1;
            return;
        };
        let db = doorbell::decode(
            DoorbellKind::Rq,
            rq.db.load_u64(doorbell::RQ_OFFSET, Ordering::Acquire),
        );
        let pending = db.index.wrapping_sub(rq.consumed);
        if db.id != rq.id || pending < BU_BYTES as u32 || pending > 1 << 30 {
            self.stats.rx_no_wqe += 1;
            return;
        }
        let mut wqe = [0u8; 256];
        read_ring(&rq.mem, rq.consumed, &mut wqe[..WQE_HEADER_BYTES]);
        let Some(h) = WqeHeader::new_checked(&wqe[..WQE_HEADER_BYTES]) else {
            return;
        };
        let bytes = h.wqe_bytes().min(256);
        let nsge = usize::from(h.num_sge());
        let oob = h.inline_oob_bytes();
        read_ring(&rq.mem, rq.consumed, &mut wqe[..bytes]);
        let (pos, cq, id) = (rq.consumed, rq.cq, rq.id);
        self.rqs[rq_idx].consumed = pos.wrapping_add(bytes as u32);

        // Scatter into the SGEs.
        let mut body = [0u8; CQE_BYTES];
        let mut c = Cqe::new_checked(&mut body[..]).expect("64-byte buffer");
        let capacity: usize = (0..nsge)
            .filter_map(|k| {
                Sge::new_checked(&wqe[WQE_HEADER_BYTES + oob + k * SGE_BYTES..])
                    .map(|s| s.size() as usize)
            })
            .sum();
        let inject = self.faults.rx_error_every > 0
            && self
                .rx_seen
                .is_multiple_of(u64::from(self.faults.rx_error_every));
        let mut ok = frame.len() <= capacity && !inject && oob == SHORT_OOB_BYTES;
        if ok {
            let mut done = 0;
            for k in 0..nsge {
                let Some(s) = Sge::new_checked(&wqe[WQE_HEADER_BYTES + oob + k * SGE_BYTES..])
                else {
                    break;
                };
                let n = (s.size() as usize).min(frame.len() - done);
                if n == 0 {
                    break;
                }
                match self.find_mr(s.address(), s.mem_key(), n) {
                    Some((mr, off)) => mr.mem.write(off, &frame[done..done + n]),
                    None => {
                        ok = false;
                        break;
                    }
                }
                done += n;
            }
        }
        if ok {
            c.set_header(CqeType::RxOkay, CLIENT_TYPE_COMPLETION, 0);
            c.set_rx_vlan(vlan);
            c.set_rx_csum(info.csum);
            c.set_rx_hash_type(info.hash_type);
            c.set_rx_pkt(0, frame.len() as u16, info.hash);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += frame.len() as u64;
            if self.faults.rx_coalesce {
                // Up to 4 packets of one RQ share a CQE when their flags dword is the same
                // (§7.4 "Coalescing"); each still consumed its own WQE, in order.
                c.set_header(CqeType::RxCoalesced4, CLIENT_TYPE_COMPLETION, 0);
                c.set_rx_wqe_offset(pos);
                let raw = c.into_inner();
                let flags = [raw[4], raw[5], raw[6], raw[7]];
                if let Some(pend) = &mut self.coalescing {
                    if pend.rq == rq_idx && pend.flags == flags && pend.k < 4 {
                        if let Some(mut pc) = Cqe::new_checked(&mut pend.body[..]) {
                            pc.set_rx_pkt(pend.k, frame.len() as u16, info.hash);
                        }
                        pend.k += 1;
                        if pend.k == 4 {
                            self.flush_coalesced();
                        }
                        return;
                    }
                }
                self.flush_coalesced();
                self.coalescing = Some(Coalescing {
                    rq: rq_idx,
                    cq,
                    wq_id: id,
                    flags,
                    body,
                    k: 1,
                });
                return;
            }
        } else {
            c.set_header(
                CqeType::RxTruncated,
                CLIENT_TYPE_COMPLETION,
                if inject { VENDOR_ERR_INJECTED } else { 0 },
            );
            self.stats.rx_truncated += 1;
        }
        c.set_rx_wqe_offset(pos);
        self.flush_coalesced();
        self.complete(cq, body, id, false);
    }

    /// Writes the coalesced CQE being filled, if any.
    fn flush_coalesced(&mut self) {
        if let Some(p) = self.coalescing.take() {
            self.complete(p.cq, p.body, p.wq_id, false);
        }
    }
}

/// An RX_COALESCED_4 CQE being filled.
struct Coalescing {
    rq: usize,
    cq: usize,
    wq_id: u32,
    flags: [u8; 4],
    body: [u8; CQE_BYTES],
    k: usize,
}

/// Turns segment `k` of `count` (headers of `hdr` bytes, TCP at `l4`) into a frame of its
/// own: IPv4 total length and id (or IPv6 payload length), TCP sequence number and flags, and
/// the TCP pseudo-header sum for the device to finish.
fn fix_segment(f: &mut [u8], hdr: usize, l4: usize, k: usize, count: usize, mss: usize) {
    let l3 = if f[12..14] == [0x81, 0x00] { 18 } else { 14 };
    let l4 = if l4 > l3 { l4 } else { l3 + 20 };
    if l4 + 20 > hdr || hdr > f.len() {
        return;
    }
    let l4_len = (f.len() - l4) as u16;
    let pseudo = if f[l3] >> 4 == 4 {
        let tot = (f.len() - l3) as u16;
        f[l3 + 2..l3 + 4].copy_from_slice(&tot.to_be_bytes());
        let id = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]).wrapping_add(k as u16);
        f[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
        f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
        let src = [f[l3 + 12], f[l3 + 13], f[l3 + 14], f[l3 + 15]];
        let dst = [f[l3 + 16], f[l3 + 17], f[l3 + 18], f[l3 + 19]];
        csum::ipv4_pseudo(src, dst, 6, l4_len)
    } else {
        let plen = (f.len() - l3 - 40) as u16;
        f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&f[l3 + 8..l3 + 24]);
        dst.copy_from_slice(&f[l3 + 24..l3 + 40]);
        csum::ipv6_pseudo(src, dst, 6, u32::from(l4_len))
    };
    let seq = u32::from_be_bytes([f[l4 + 4], f[l4 + 5], f[l4 + 6], f[l4 + 7]])
        .wrapping_add((k * mss) as u32);
    f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
    if k + 1 < count {
        f[l4 + 13] &= !(0x01 | 0x08); // FIN, PSH: last segment only
    }
    if k > 0 {
        f[l4 + 13] &= !0x80; // CWR: first segment only
    }
    f[l4 + 16..l4 + 18].copy_from_slice(&pseudo.to_be_bytes());
}

/// Writes a CQE: body first, then (after a release fence) the info dword with the owner
/// bits as one aligned 32-bit store (§10 items 10-12).
fn write_cqe_now(cq: &mut Cq, body: &[u8; CQE_BYTES], wq: u32, is_sq: bool) {
    let slot = (cq.written % u64::from(cq.count)) as usize * CQE_BYTES;
    let owner = owner_for(cq.written, cq.count);
    cq.mem.write(slot, &body[..60]);
    fence_before_owner_write();
    cq.mem.store_u32(
        slot + 60,
        Cqe::<[u8; 64]>::info_value(wq, is_sq, owner),
        Ordering::Release,
    );
    cq.written += 1;
}

/// Reads `out.len()` bytes of a ring at free-running byte position `pos`, wrapping.
fn read_ring(mem: &DevMem, pos: u32, out: &mut [u8]) {
    let size = mem.len();
    let start = pos as usize & (size - 1);
    let first = out.len().min(size - start);
    mem.read(start, &mut out[..first]);
    if first < out.len() {
        let rest = out.len() - first;
        mem.read(0, &mut out[first..first + rest]);
    }
}

/// What the RX side learns from the headers.
struct RxInfo {
    hash: u32,
    hash_type: u16,
    csum: RxCsum,
}

/// Parses Ethernet / IPv4 / IPv6 / TCP / UDP: the RSS hash (NDIS tuple: addresses, then ports
/// for TCP and UDP), the single-bit NDIS hash type (§11 item 2), and checksum verdicts.
fn classify(frame: &[u8], key: &[u8; 40]) -> RxInfo {
    let mut info = RxInfo {
        hash: 0,
        hash_type: 0,
        csum: RxCsum::default(),
    };
    if frame.len() < 14 {
        return info;
    }
    let et = u16::from_be_bytes([frame[12], frame[13]]);
    let l3 = &frame[14..];
    let mut input = [0u8; 36];
    let (proto, l4, n, v6) = match et {
        0x0800 if l3.len() >= 20 && l3[0] >> 4 == 4 => {
            let ihl = usize::from(l3[0] & 0xf) * 4;
            if ihl < 20 || l3.len() < ihl {
                return info;
            }
            let good = csum::checksum(&l3[..ihl]) == 0;
            info.csum.ip_ok = good;
            info.csum.ip_bad = !good;
            input[..8].copy_from_slice(&l3[12..20]);
            let total = usize::from(u16::from_be_bytes([l3[2], l3[3]])).clamp(ihl, l3.len());
            let frag = u16::from_be_bytes([l3[6], l3[7]]) & 0x3fff != 0;
            let proto = if frag { 0 } else { l3[9] };
            (proto, &l3[ihl..total], 8, false)
        }
        0x86dd if l3.len() >= 40 && l3[0] >> 4 == 6 => {
            input[..32].copy_from_slice(&l3[8..40]);
            let plen = usize::from(u16::from_be_bytes([l3[4], l3[5]]));
            (l3[6], &l3[40..(40 + plen).min(l3.len())], 32, true)
        }
        _ => return info,
    };
    let (src4, dst4) = (
        [input[0], input[1], input[2], input[3]],
        [input[4], input[5], input[6], input[7]],
    );
    let l4_ok = |field: usize| -> Option<bool> {
        let sum = if v6 {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&l3[8..24]);
            d.copy_from_slice(&l3[24..40]);
            csum::ipv6_pseudo(s, d, proto, l4.len() as u32)
        } else {
            csum::ipv4_pseudo(src4, dst4, proto, l4.len() as u16)
        };
        if l4.len() < field + 2 {
            return None;
        }
        Some(csum::fold(csum::add(u32::from(sum), l4)) == 0xffff)
    };
    let mut len = n;
    match proto {
        6 if l4.len() >= 20 => {
            input[n..n + 4].copy_from_slice(&l4[..4]);
            len += 4;
            info.hash_type = if v6 {
                hash_type::TCP_IPV6
            } else {
                hash_type::TCP_IPV4
            };
            let good = l4_ok(16).unwrap_or(false);
            info.csum.tcp_ok = good;
            info.csum.tcp_bad = !good;
        }
        17 if l4.len() >= 8 => {
            input[n..n + 4].copy_from_slice(&l4[..4]);
            len += 4;
            info.hash_type = if v6 {
                hash_type::UDP_IPV6
            } else {
                hash_type::UDP_IPV4
            };
            // A zero UDP checksum over IPv4 means "none": neither good nor bad.
            if v6 || l4[6..8] != [0, 0] {
                let good = l4_ok(6).unwrap_or(false);
                info.csum.udp_ok = good;
                info.csum.udp_bad = !good;
            }
        }
        _ => info.hash_type = if v6 { hash_type::IPV6 } else { hash_type::IPV4 },
    }
    info.hash = toeplitz::hash(key, &input[..len]);
    info
}

/// Finishes the checksums a TX OOB asked for: the IPv4 header checksum, and the TCP/UDP
/// checksum whose field holds the pseudo-header sum (§4.3, §10 item 7).
fn apply_tx_checksums(frame: &mut [u8], ip: bool, tcp: bool, udp: bool) {
    if !(ip || tcp || udp) || frame.len() < 14 {
        return;
    }
    let mut l3 = 14;
    let mut et = u16::from_be_bytes([frame[12], frame[13]]);
    if et == 0x8100 && frame.len() >= 18 {
        l3 = 18;
        et = u16::from_be_bytes([frame[16], frame[17]]);
    }
    let (l4, end, proto) = match et {
        0x0800 if frame.len() >= l3 + 20 => {
            let ihl = usize::from(frame[l3] & 0xf) * 4;
            if ihl < 20 || frame.len() < l3 + ihl {
                return;
            }
            if ip {
                frame[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
                let c = csum::checksum(&frame[l3..l3 + ihl]);
                frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            }
            let total = usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]));
            (l3 + ihl, (l3 + total).min(frame.len()), frame[l3 + 9])
        }
        0x86dd if frame.len() >= l3 + 40 => {
            let plen = usize::from(u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]));
            (l3 + 40, (l3 + 40 + plen).min(frame.len()), frame[l3 + 6])
        }
        _ => return,
    };
    let field = match proto {
        6 if tcp => 16,
        17 if udp => 6,
        _ => return,
    };
    if end < l4 + field + 2 {
        return;
    }
    // The field already holds the pseudo-header sum: summing the segment as it is and
    // complementing gives the full checksum.
    let mut c = !csum::fold(csum::add(0, &frame[l4..end]));
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    frame[l4 + field..l4 + field + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + payload.len()];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + 8 + payload.len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[169, 254, 0, 1]);
        ip[16..20].copy_from_slice(&[169, 254, 0, 2]);
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&2000u16.to_be_bytes());
        f[38..40].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f[42..].copy_from_slice(payload);
        f
    }

    #[test]
    fn tx_checksums_then_rx_verifies_them() {
        let mut f = udp_frame(b"hello world");
        // The driver's part: pseudo-header sum in the UDP field.
        let p = csum::ipv4_pseudo([169, 254, 0, 1], [169, 254, 0, 2], 17, 19);
        f[40..42].copy_from_slice(&p.to_be_bytes());
        apply_tx_checksums(&mut f, true, false, true);
        // Independent check with etherparse.
        {
            let parsed = etherparse::SlicedPacket::from_ethernet(&f).unwrap();
            let Some(etherparse::NetSlice::Ipv4(ip)) = parsed.net else {
                panic!()
            };
            let hdr = ip.header().to_header();
            assert_eq!(hdr.header_checksum, hdr.calc_header_checksum());
            let Some(etherparse::TransportSlice::Udp(udp)) = parsed.transport else {
                panic!()
            };
            assert_eq!(
                udp.checksum(),
                udp.to_header()
                    .calc_checksum_ipv4(&hdr, udp.payload())
                    .unwrap()
            );
        }
        let info = classify(&f, &[0x6d; 40]);
        assert!(info.csum.ip_ok && info.csum.udp_ok && !info.csum.ip_bad && !info.csum.udp_bad);
        assert_eq!(info.hash_type, hash_type::UDP_IPV4);
        // A flipped payload byte is caught.
        f[45] ^= 1;
        let info = classify(&f, &[0x6d; 40]);
        assert!(info.csum.udp_bad);
    }
}
