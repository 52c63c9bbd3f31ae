//! The RX side (§4.1, §4.2, §5.1, §8 items 8–10): frames from the wire, steered to an RQ by
//! RSS (or to the only RQ), then a responder CQE with the hash, checksum verdicts, header
//! types and the stripped VLAN.
//!
//! * Cyclic RQ: one posted WQE consumed per frame, the frame scattered into its data segments
//!   through the memory keys; RESP_ERR LOCAL_LENGTH for a frame larger than the WQE.
//! * Striding RQ: the frame is written at the next free stride boundary of the current WQE's
//!   buffer, over `ceil(len / stride_bytes)` strides; the CQE's `byte_cnt` packs the strides
//!   and the length, `wqe_counter` is the first stride's index and `wqe_id` the WQE counter.
//!   A frame that does not fit the strides left gets a filler CQE for them first (bit 31,
//!   `wqe_counter` = the first unused stride) and goes to the next WQE. The WQE counter moves
//!   when every stride of a WQE is used; frames are dropped (`rx_no_wqe`) while no WQE is
//!   posted. A frame longer than a whole WQE, or a bad key, completes with RESP_ERR
//!   (LOCAL_LENGTH, LOCAL_PROT) that uses up the rest of the current WQE (the model's choice:
//!   what hardware does there is not documented, spec §9).
//! * Either kind: RESP_ERR LOCAL_PROT for a bad key or range puts the RQ in error: its posted
//!   WQEs are flushed (WR_FLUSH; a striding RQ's with the strides each had left) and its
//!   frames dropped until the driver resets it (§5.3, §8 item 7). LOCAL_LENGTH does not.
#![deny(unsafe_code)]

use super::{record, Engine, HwQueueState, RxHashFields, BUDGET};
use crate::emu::wire::faults::Arrival;
use crate::emu::wire::Wire;
use crate::hw::mlx5::cqe::{csum_ok, hash_type, hdr_type, CqeFields, CqeOpcode, Syndrome};
use crate::hw::mlx5::doorbell::RCV_DBR;
use crate::hw::mlx5::wqe::{
    DataSeg, MprqByteCnt, MprqWqe, INVALID_LKEY, MPRQ_WQE_BYTES, SEG_BYTES,
};
use crate::net::parse::{self, IpHeader, L3, L4};

/// TCP flags: ACK.
const TCP_ACK: u8 = 0x10;

impl Engine {
    /// Takes up to [`BUDGET`] frames off the wire (dropped ones count) into RQs; returns how
    /// many, then writes the compressed sessions gathered meanwhile.
    ///
    /// With `only_with_room` (an inline kick), a frame is taken only while every RQ it could
    /// go to has a posted WQE and room in its CQ: the rest wait on the wire, the device's
    /// receive buffer there (see [`crate::emu::thread`]); otherwise frames that find no WQE
    /// or no CQ room are dropped and counted (`rx_no_wqe`, `rx_cq_full`), as a NIC running on
    /// its own does.
    /// A wire that holds its arrivals ([`Wire::holds_arrivals`], the kernel's ring of an
    /// afpacket wire) is treated as with `only_with_room`.
    pub(super) fn process_wire(&mut self, only_with_room: bool) -> usize {
        let hold = only_with_room || self.wire.holds_arrivals();
        let mut n = 0;
        while n < BUDGET {
            if hold && !self.rx_room() {
                break;
            }
            let mut frame = std::mem::take(&mut self.frame);
            let got = match self.wire.recv_or_drop(&mut frame) {
                Arrival::Nothing => {
                    self.frame = frame;
                    break;
                }
                Arrival::Frame(len) => Some(len.min(frame.len())),
                Arrival::Dropped => None,
            };
            n += 1;
            match got {
                Some(len) => self.receive(&mut frame[..len]),
                None => self.stats.rx_fault_drops += 1,
            }
            self.frame = frame;
        }
        // A session never waits past the end of a pass (the device's compression timeout).
        for q in &mut self.rqs {
            let w = q.cq.flush();
            self.stats.rx_cqes += w as u64;
        }
        n
    }

    /// Whether a frame taken off the wire now finds a posted WQE and CQ room whichever RQ RSS
    /// picks. An RQ that is not ready drops its frames whatever happens (and without any RQ
    /// every frame is dropped): that counts as room.
    fn rx_room(&self) -> bool {
        let room = |q: &super::Rq| {
            if q.state != HwQueueState::Ready {
                return true;
            }
            let posted = record(&q.dbrec, RCV_DBR) as u16 != q.ci;
            // A striding RQ may need a filler CQE before the frame's.
            let cqes = if q.mprq.is_some() { 2 } else { 1 };
            posted && q.cq.room() >= cqes
        };
        if self.rss.is_empty() {
            self.rqs.first().is_none_or(room)
        } else {
            // Every RQ (the tables name them, some perhaps many times).
            self.rqs.iter().all(room)
        }
    }

    /// Flushes the WQEs posted to RQ `i`, which is in error: each completes with RESP_ERR
    /// WR_FLUSH in order (at most [`BUDGET`] per pass, and only as the CQ has room); returns
    /// how many.
    pub(super) fn flush_rq(&mut self, i: usize) -> usize {
        let now = self.now_ns();
        let rq = &mut self.rqs[i];
        let posted = record(&rq.dbrec, RCV_DBR) as u16;
        let mut n = 0;
        while n < BUDGET && posted != rq.ci && rq.cq.room() > 0 {
            let mut f = CqeFields {
                opcode: u8::from(CqeOpcode::RespErr),
                syndrome: u8::from(Syndrome::WrFlush),
                wqe_counter: rq.ci,
                qpn: rq.rqn,
                timestamp: now,
                ..CqeFields::default()
            };
            if let Some(geo) = rq.mprq {
                // A striding WQE is flushed with the strides it had left (the model's
                // choice, like its other striding errors).
                f.wqe_id = rq.ci;
                f.wqe_counter = rq.stride_ci as u16;
                f.byte_cnt = MprqByteCnt {
                    filler: false,
                    strides: (geo.strides() - rq.stride_ci) as u16,
                    len: 0,
                }
                .word();
                rq.stride_ci = 0;
            }
            self.stats.rx_cqes += rq.cq.write(&f) as u64;
            self.stats.rx_flushed += 1;
            rq.ci = rq.ci.wrapping_add(1);
            n += 1;
        }
        n
    }

    /// Delivers one frame.
    fn receive(&mut self, frame: &mut [u8]) {
        // The TIR (the steering looks at the frame as it came), before the tag moves.
        let tir = match (&self.steer, self.rss.len()) {
            (_, 0) => None,
            (Some(steer), _) => match steer(frame) {
                Some(i) if i < self.rss.len() => Some(i),
                _ => {
                    self.stats.rx_unsteered_drops += 1;
                    return;
                }
            },
            (None, _) => None,
        };
        // The parser looks through one C-VLAN tag whether or not the RQ strips it.
        let tag = (frame.len() >= 18 && frame[12..14] == parse::ETHERTYPE_VLAN.to_be_bytes())
            .then(|| u16::from_be_bytes([frame[14], frame[15]]));
        if tag.is_some() {
            frame.copy_within(0..12, 4);
        }
        let untagged_at = if tag.is_some() { 4 } else { 0 };
        let (info, tir) = RxInfo::of(&frame[untagged_at..], &self.rss, tir);
        let qi = match tir {
            Some(t) => {
                let r = &self.rss[t.index];
                if t.mismatch {
                    self.stats.rx_hash_wrong_type += 1;
                }
                r.table[(info.hash as usize) & (r.table.len() - 1)]
            }
            None => 0,
        };
        let Some(rq) = self.rqs.get(qi) else {
            self.stats.rx_no_wqe += 1;
            return;
        };
        // An RQ in RESET or in error has no WQE the device may use.
        if rq.state != HwQueueState::Ready {
            self.stats.rx_no_wqe += 1;
            return;
        }
        let strip = tag.is_some() && rq.vlan_strip;
        let data: &[u8] = if strip || tag.is_none() {
            &frame[untagged_at..]
        } else {
            // Put the tag back: this RQ receives the frame as it came.
            frame.copy_within(4..16, 0);
            frame[12..14].copy_from_slice(&parse::ETHERTYPE_VLAN.to_be_bytes());
            frame[14..16].copy_from_slice(&tag.unwrap_or(0).to_be_bytes());
            frame
        };
        // What the CQE says of a delivered frame.
        let mut ok = CqeFields {
            opcode: u8::from(CqeOpcode::RespSend),
            byte_cnt: data.len() as u32,
            timestamp: self.now_ns(),
            rx_hash_res: info.hash,
            rx_hash_type: info.hash_type,
            hds_ip_ext: info.hds_ip_ext,
            l4_l3_hdr_type: info.l4_l3_hdr_type,
            ..CqeFields::default()
        };
        if let (true, Some(tci)) = (strip, tag) {
            ok.l4_l3_hdr_type |= hdr_type::CVLAN;
            ok.vlan_info = tci;
        }
        if rq.mprq.is_some() {
            self.receive_striding(qi, data, ok);
        } else {
            self.receive_cyclic(qi, data, ok);
        }
    }

    /// Delivers `data` into the next WQE of cyclic RQ `qi`.
    fn receive_cyclic(&mut self, qi: usize, data: &[u8], ok: CqeFields) {
        let rq = &self.rqs[qi];
        if rq.cq.room() == 0 {
            self.stats.rx_cq_full += 1;
            return;
        }
        // Posted WQEs: the record's low 16 bits against the device's counter (§4.1).
        let posted = record(&rq.dbrec, RCV_DBR) as u16;
        if posted == rq.ci {
            self.stats.rx_no_wqe += 1;
            return;
        }
        let index = rq.ci;
        let stride = rq.stride as usize;
        // The WQE: in a local buffer for up to four scatter entries (drivers post one or
        // two), else in the engine's scratch buffer (a long scatter list is rare).
        let mut small = [0u8; 4 * SEG_BYTES];
        let mut scratch = std::mem::take(&mut self.rx_wqe);
        let wqe: &mut [u8] = if stride <= small.len() {
            &mut small[..stride]
        } else {
            scratch.resize(stride.min(4096), 0);
            &mut scratch[..]
        };
        rq.buf.read(
            (usize::from(index) & (rq.wqe_cnt as usize - 1)) * stride,
            wqe,
        );
        let wqe: &[u8] = wqe;
        // The scatter list: `stride / 16` entries, ended early by lkey 0x100 or a zero count.
        let entries = || {
            wqe.chunks_exact(SEG_BYTES)
                .filter_map(DataSeg::new_checked)
                .take_while(|d| d.lkey() != INVALID_LKEY && d.byte_count() != 0)
        };
        let capacity: usize = entries().map(|d| d.byte_count() as usize).sum();
        let mut failed = None;
        self.rx_scatters += 1;
        let every = u64::from(self.faults.rx_bad_key_every);
        if data.len() > capacity {
            failed = Some(Syndrome::LocalLength);
        } else if every > 0 && self.rx_scatters.is_multiple_of(every) {
            // The fault: the WQE's key is looked up as if it were not registered.
            failed = Some(Syndrome::LocalProt);
        } else {
            let mut done = 0;
            for d in entries() {
                if done == data.len() {
                    break;
                }
                let n = (d.byte_count() as usize).min(data.len() - done);
                if !self.mrs.write(d.addr(), d.lkey(), &data[done..done + n]) {
                    failed = Some(Syndrome::LocalProt);
                    break;
                }
                done += n;
            }
        }
        self.rx_wqe = scratch;
        let rq = &mut self.rqs[qi];
        rq.ci = index.wrapping_add(1);
        let f = CqeFields {
            wqe_counter: index,
            ..ok
        };
        match failed {
            Some(s) => {
                let e = error_cqe(&f, s, rq.rqn);
                self.rq_failed(qi, s, index);
                self.stats.rx_cqes += self.rqs[qi].cq.write(&e) as u64;
            }
            None => {
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += data.len() as u64;
                self.stats.rx_cqes += rq.cq.push_rx(&f) as u64;
            }
        }
    }

    /// Delivers `data` at the next free stride boundary of striding RQ `qi` (§4.2).
    fn receive_striding(&mut self, qi: usize, data: &[u8], ok: CqeFields) {
        let rq = &self.rqs[qi];
        let Some(geo) = rq.mprq else { return };
        let strides = geo.strides();
        let stride_bytes = geo.stride_bytes() as usize;
        let need = data.len().div_ceil(stride_bytes).max(1) as u32;
        // The frame fits a WQE but not what is left of this one: a filler first.
        let filler = rq.stride_ci > 0 && need <= strides && rq.stride_ci + need > strides;
        if rq.cq.room() < 1 + u32::from(filler) {
            self.stats.rx_cq_full += 1;
            return;
        }
        let posted = record(&rq.dbrec, RCV_DBR) as u16;
        if posted == rq.ci {
            self.stats.rx_no_wqe += 1;
            return;
        }
        let rq = &mut self.rqs[qi];
        if filler {
            let f = CqeFields {
                opcode: u8::from(CqeOpcode::RespSend),
                byte_cnt: MprqByteCnt {
                    filler: true,
                    strides: (strides - rq.stride_ci) as u16,
                    len: 0,
                }
                .word(),
                wqe_counter: rq.stride_ci as u16,
                wqe_id: rq.ci,
                timestamp: ok.timestamp,
                ..CqeFields::default()
            };
            rq.ci = rq.ci.wrapping_add(1);
            rq.stride_ci = 0;
            self.stats.rx_fillers += 1;
            self.stats.rx_cqes += rq.cq.write(&f) as u64;
            if posted == rq.ci {
                self.stats.rx_no_wqe += 1;
                return;
            }
        }
        let (index, first) = (rq.ci, rq.stride_ci);
        let mut w = [0u8; MPRQ_WQE_BYTES];
        rq.buf.read(
            (usize::from(index) & (rq.wqe_cnt as usize - 1)) * rq.stride as usize,
            &mut w,
        );
        let Some(wqe) = MprqWqe::new_checked(&w[..]) else {
            return;
        };
        let d = wqe.dseg();
        let end = (u64::from(first) + u64::from(need)) * stride_bytes as u64;
        self.rx_scatters += 1;
        let every = u64::from(self.faults.rx_bad_key_every);
        let failed = if need > strides || end > u64::from(d.byte_count()) {
            Some(Syndrome::LocalLength)
        } else if every > 0 && self.rx_scatters.is_multiple_of(every) {
            // The fault: the WQE's key is looked up as if it were not registered.
            Some(Syndrome::LocalProt)
        } else if !self.mrs.write(
            d.addr() + u64::from(first) * stride_bytes as u64,
            d.lkey(),
            data,
        ) {
            Some(Syndrome::LocalProt)
        } else {
            None
        };
        let rq = &mut self.rqs[qi];
        // An error uses up the rest of the WQE; a packet its strides.
        let used = match failed {
            Some(_) => strides - first,
            None => need,
        };
        rq.stride_ci += used;
        if rq.stride_ci >= strides {
            rq.ci = rq.ci.wrapping_add(1);
            rq.stride_ci = 0;
        }
        let f = CqeFields {
            byte_cnt: MprqByteCnt {
                filler: false,
                strides: used as u16,
                len: if failed.is_some() {
                    0
                } else {
                    data.len() as u16
                },
            }
            .word(),
            wqe_counter: first as u16,
            wqe_id: index,
            ..ok
        };
        match failed {
            Some(s) => {
                let e = error_cqe(&f, s, rq.rqn);
                self.rq_failed(qi, s, index);
                self.stats.rx_cqes += self.rqs[qi].cq.write(&e) as u64;
            }
            None => {
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += data.len() as u64;
                self.stats.rx_cqes += rq.cq.push_rx(&f) as u64;
            }
        }
    }

    /// Counts a failed receive WQE of RQ `qi`: LOCAL_LENGTH loses the packet and the RQ goes
    /// on (§8 item 9); a protection error puts the RQ in error: its posted WQEs are flushed
    /// and it takes no frame until it is reset (§5.3: the driver resets it).
    fn rq_failed(&mut self, qi: usize, s: Syndrome, index: u16) {
        if s == Syndrome::LocalLength {
            self.stats.rx_oversize += 1;
        } else {
            self.stats.rx_prot_errors += 1;
            let rq = &mut self.rqs[qi];
            rq.state = HwQueueState::Error;
            tracing::debug!(target: "pmd::emu", rqn = rq.rqn, index, "receive WQE failed; RQ in error");
        }
    }
}

/// A responder error CQE (§5.3) for the completion `f` would have been: its WQE counter (and
/// striding `wqe_id`, `byte_cnt`), the syndrome, the RQ number; nothing about the packet.
fn error_cqe(f: &CqeFields, s: Syndrome, rqn: u32) -> CqeFields {
    CqeFields {
        opcode: u8::from(CqeOpcode::RespErr),
        syndrome: u8::from(s),
        qpn: rqn,
        byte_cnt: f.byte_cnt,
        wqe_counter: f.wqe_counter,
        wqe_id: f.wqe_id,
        timestamp: f.timestamp,
        ..CqeFields::default()
    }
}

/// What the RX parser writes into a responder CQE about a frame (§5.1).
#[derive(Debug, Default, PartialEq, Eq)]
struct RxInfo {
    hash: u32,
    hash_type: u8,
    hds_ip_ext: u8,
    l4_l3_hdr_type: u8,
}

impl RxInfo {
    /// Classifies an untagged frame; with RSS, hashes it on a TIR: `tir` when the port's
    /// steering chose one, else the first of `tirs` (most specific first) whose type the
    /// frame has. The TIR's selected fields of the frame's own family and protocol go into
    /// the Toeplitz input in the order source address, destination address, source port,
    /// destination port (§8 item 8); a frame of another type than its TIR hashes to 0.
    fn of(frame: &[u8], tirs: &[super::Tir], tir: Option<usize>) -> (Self, Option<TirPick>) {
        let c = parse::classify(frame);
        let ip = parse::l3_start(frame).and_then(|(at, et)| IpHeader::parse(frame, at, et));
        let mut out = Self {
            hds_ip_ext: csum_ok::L2,
            ..Self::default()
        };
        let alen = match c.l3 {
            L3::Other => 0,
            L3::Ipv4 { csum_ok } => {
                out.l4_l3_hdr_type |= hdr_type::L3_IPV4;
                if csum_ok {
                    out.hds_ip_ext |= csum_ok::L3;
                }
                4
            }
            L3::Ipv6 => {
                out.l4_l3_hdr_type |= hdr_type::L3_IPV6;
                out.hds_ip_ext |= csum_ok::L3;
                16
            }
        };
        let pick = |out: Self| {
            let proto = match c.l4 {
                L4::Tcp { .. } => Some(6),
                L4::Udp { .. } => Some(17),
                L4::Other => None,
            };
            let v6 = match alen {
                0 => None,
                4 => Some(false),
                _ => Some(true),
            };
            let fits = |f: RxHashFields| {
                f.l3_v6().is_none_or(|t| Some(t) == v6)
                    && f.l4_proto().is_none_or(|p| Some(p) == proto)
            };
            let index = match tir {
                Some(i) => i,
                None => match tirs.iter().position(|t| fits(t.fields)) {
                    Some(i) => i,
                    None if tirs.is_empty() => return (out, None),
                    None => 0,
                },
            };
            let mismatch = !fits(tirs[index].fields);
            (out, Some(TirPick { index, mismatch }))
        };
        if alen == 0 {
            return pick(out);
        }
        if ip.is_some_and(|ip| ip.fragment) {
            out.l4_l3_hdr_type |= hdr_type::FRAG;
        }
        match c.l4 {
            L4::Tcp { csum_ok } => {
                if csum_ok {
                    out.hds_ip_ext |= csum_ok::L4;
                }
                out.l4_l3_hdr_type |= match ip {
                    Some(ip) if frame[ip.l4_start + 13] & TCP_ACK != 0 => {
                        let data_at = ip.l4_start + usize::from(frame[ip.l4_start + 12] >> 4) * 4;
                        if ip.l4_end > data_at {
                            hdr_type::L4_TCP_ACK_DATA
                        } else {
                            hdr_type::L4_TCP_ACK_NO_DATA
                        }
                    }
                    _ => hdr_type::L4_TCP,
                };
            }
            L4::Udp { csum_ok } => {
                // No checksum (0 over IPv4) counts as OK, as the kernel reads it.
                if csum_ok != Some(false) {
                    out.hds_ip_ext |= csum_ok::L4;
                }
                out.l4_l3_hdr_type |= hdr_type::L4_UDP;
            }
            L4::Other => {}
        }
        let (mut out, chosen) = pick(out);
        let Some(t) = chosen.filter(|t| !t.mismatch) else {
            return (out, chosen);
        };
        let (key, fields) = (&tirs[t.index].hasher, tirs[t.index].fields);
        // The NDIS-ordered tuple: addresses, then ports when L4 is TCP or UDP; each selected
        // field hashed where it lies in the frame, at its place in the input.
        let (addrs, ports) = c.rss_parts(frame);
        let mut n = 0;
        let mut hash = 0u32;
        let mut push = |b: &[u8]| {
            hash ^= key.hash_at(n, b);
            n += b.len();
        };
        let (src, dst, l3_type) = if alen == 4 {
            (
                RxHashFields::SRC_IPV4,
                RxHashFields::DST_IPV4,
                hash_type::IPV4,
            )
        } else {
            (
                RxHashFields::SRC_IPV6,
                RxHashFields::DST_IPV6,
                hash_type::IPV6,
            )
        };
        if fields.contains(src) {
            push(&addrs[..alen]);
        }
        if fields.contains(dst) {
            push(&addrs[alen..2 * alen]);
        }
        if fields.intersects(src | dst) {
            out.hash_type |= l3_type;
        }
        let (sp, dp, l4_type) = match c.l4 {
            L4::Tcp { .. } => (
                RxHashFields::SRC_PORT_TCP,
                RxHashFields::DST_PORT_TCP,
                hash_type::TCP,
            ),
            L4::Udp { .. } => (
                RxHashFields::SRC_PORT_UDP,
                RxHashFields::DST_PORT_UDP,
                hash_type::UDP,
            ),
            L4::Other => (RxHashFields::empty(), RxHashFields::empty(), 0),
        };
        if ports.len() == 4 && !(sp | dp).is_empty() {
            if fields.contains(sp) {
                push(&ports[..2]);
            }
            if fields.contains(dp) {
                push(&ports[2..]);
            }
            if fields.intersects(sp | dp) {
                out.hash_type |= l4_type;
            }
        }
        out.hash = hash;
        (out, chosen)
    }
}

/// The TIR a frame went to: its index, and whether the frame is of another type than the
/// TIR hashes.
#[derive(Debug, Clone, Copy)]
struct TirPick {
    index: usize,
    mismatch: bool,
}
