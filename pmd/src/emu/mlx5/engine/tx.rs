//! The TX side: send WQEs from the device's counter up to the end of the WQE the SQ's latest
//! UAR doorbell named (§2, §3, §8 items 2–7): control segment checks, the Ethernet segment
//! (inline header, VLAN insert command, checksum flags, TSO `mss`), pointer and inline data
//! segments through the memory keys, eMPW (one packet per descriptor), frames onto the wire,
//! requester CQEs for WQEs that ask for one and error CQEs for those that fail.
//!
//! The trigger is the 8-byte UAR write (§3.1 step 5), checked against the doorbell record
//! (`dbrec[1]`, step 3) and the ring when it is sampled (`uar.rs`): a record store without
//! a UAR write starts nothing. A BlueFlame copy into the register counts as its doorbell;
//! its WQE is read from the ring, where it always is too (§3.2).
#![deny(unsafe_code)]

use super::{Engine, HwQueueState, BUDGET, VENDOR_ERR_INJECTED};
use crate::emu::wire::Wire;
use crate::hw::mlx5::cqe::{CqeFields, CqeOpcode, Syndrome};
use crate::hw::mlx5::wqe::{
    eth_seg_units, inline_seg_units, CtrlSeg, DataSeg, EthSeg, InlineSeg, CE_ALWAYS, CS_L3, CS_L4,
    ES_INLINE_START, SEG_BYTES, VLAN_INSERT_CMD,
};
use crate::hw::mlx5::{wqebbs, Opcode, DS_BYTES, MAX_DS, WQEBB_BYTES};
use crate::net::csum::{self, TxCsum};
use crate::net::parse::{self, IpHeader};
use crate::net::tso::{self, Tso};
use crate::ring::read_ring;

/// The largest WQE: 63 units in 16 WQEBBs.
const MAX_WQE_BYTES: usize = MAX_DS.div_ceil(4) * WQEBB_BYTES;
/// Most packets one eMPW WQE can describe (one unit each after ctrl and eseg).
const MAX_EMPW_PACKETS: usize = MAX_DS - 2;
/// Headroom before a gathered frame: room for a VLAN tag the device inserts.
const HEADROOM: usize = 4;
/// The engine's gather buffer: a TSO packet, or every packet of an eMPW WQE back to back, each
/// as long as a wire carries (jumbo frames: 61 of 9208 bytes, about 550 KiB).
pub(super) const GATHER_BYTES: usize = {
    let lso = super::LSO_MAX_BYTES + HEADROOM;
    let empw = HEADROOM + MAX_EMPW_PACKETS * crate::emu::wire::MAX_FRAME;
    if lso > empw {
        lso
    } else {
        empw
    }
};
/// The shortest frame put on the wire: shorter ones are padded with zeros (§8 item 5; the
/// device's padding is believed, not confirmed).
const MIN_FRAME: usize = 60;

/// Why a WQE failed: the syndrome and vendor syndrome of its error CQE (§5.3).
type Failure = (Syndrome, u8);

fn qp_op() -> Failure {
    (Syndrome::LocalQpOp, 0)
}

impl Engine {
    /// Consumes the WQEs the SQ's accepted doorbells announce (at most [`BUDGET`]); returns
    /// how many.
    pub(super) fn process_sq(&mut self, i: usize) -> usize {
        // The device does not look at an SQ in RESET.
        if self.sqs[i].state == HwQueueState::Reset {
            return 0;
        }
        let rec = self.sqs[i].db_tail;
        let mut done = 0;
        let mut wqe = [0u8; MAX_WQE_BYTES];
        while done < BUDGET {
            let sq = &self.sqs[i];
            let pending = rec.wrapping_sub(sq.ci);
            if pending == 0 {
                break;
            }
            // A WQE is started only when its CQE (requested or an error) has a free entry:
            // the device never overruns the consumer (§8 item 12); it waits instead.
            if sq.cq.room() == 0 {
                self.stats.tx_cq_stalls += 1;
                break;
            }
            let ring_bytes = sq.wqe_cnt as usize * WQEBB_BYTES;
            let pos = u32::from(sq.ci) * WQEBB_BYTES as u32;
            read_ring(&sq.buf, ring_bytes, pos, &mut wqe[..SEG_BYTES]);
            let ctrl = CtrlSeg::new_checked(&wqe[..SEG_BYTES]).expect("16-byte segment");
            let (ds, ce, opcode) = (usize::from(ctrl.ds()), ctrl.ce(), ctrl.opcode());
            let index = sq.ci;
            let bbs = wqebbs(ds).max(1) as u16;
            if bbs > pending {
                // The WQE runs past the doorbell's: malformed; consume what was announced.
                self.sqs[i].ci = rec;
                self.tx_complete(i, index, u8::from(opcode), CE_ALWAYS, Err(qp_op()));
                done += 1;
                continue;
            }
            let bytes = usize::from(bbs) * WQEBB_BYTES;
            read_ring(&sq.buf, ring_bytes, pos, &mut wqe[..bytes]);
            self.sqs[i].ci = index.wrapping_add(bbs);
            self.stats.tx_wqes += 1;
            let outcome = if self.sqs[i].state == HwQueueState::Error {
                Err((Syndrome::WrFlush, 0))
            } else {
                self.execute(i, &wqe[..ds * DS_BYTES], index)
            };
            self.tx_complete(i, index, u8::from(opcode), ce, outcome);
            done += 1;
        }
        done
    }

    /// Writes the requester CQE a WQE asks for (CE = 2 or 3, §2.8), or its error CQE
    /// (always, §8 item 7), and moves the SQ to error on a failure.
    fn tx_complete(
        &mut self,
        i: usize,
        index: u16,
        opcode: u8,
        ce: u8,
        outcome: Result<(), Failure>,
    ) {
        let now = self.now_ns();
        let sq = &mut self.sqs[i];
        let mut f = CqeFields {
            opcode: u8::from(CqeOpcode::Req),
            sop: opcode,
            qpn: sq.sqn,
            wqe_counter: index,
            timestamp: now,
            ..CqeFields::default()
        };
        match outcome {
            Ok(()) if ce < CE_ALWAYS => return,
            Ok(()) => {}
            Err((syndrome, vendor)) => {
                f.opcode = u8::from(CqeOpcode::ReqErr);
                f.syndrome = u8::from(syndrome);
                f.vendor_err_synd = vendor;
                if syndrome == Syndrome::WrFlush {
                    self.stats.tx_flushed += 1;
                } else {
                    sq.state = HwQueueState::Error;
                    self.stats.tx_errors += 1;
                    tracing::debug!(target: "pmd::emu", sqn = sq.sqn, index, ?syndrome, "send WQE failed; SQ in error");
                }
            }
        }
        sq.cq.write(&f);
    }

    /// Carries out one well-sized WQE (`wqe` = its `ds` units, ring wrap undone).
    fn execute(&mut self, i: usize, wqe: &[u8], index: u16) -> Result<(), Failure> {
        let (sqn, min_inline) = (self.sqs[i].sqn, usize::from(self.sqs[i].min_inline));
        let ctrl = CtrlSeg::new_checked(wqe).ok_or_else(qp_op)?;
        // Strict checks of the control segment against the queue (§2.2, §8 item 3).
        if ctrl.wqe_index() != index || ctrl.qpn() != sqn {
            return Err(qp_op());
        }
        let opcode = ctrl.opcode();
        if opcode == Opcode::Nop {
            return Ok(());
        }
        if !matches!(opcode, Opcode::Send | Opcode::Tso | Opcode::Empw) || wqe.len() < 2 * DS_BYTES
        {
            return Err(qp_op());
        }
        self.tx_executed += 1;
        if opcode == Opcode::Send {
            self.stats.tx_send_wqes += 1;
        }
        let every = u64::from(self.faults.tx_error_every);
        if every > 0 && self.tx_executed.is_multiple_of(every) {
            return Err((Syndrome::LocalQpOp, VENDOR_ERR_INJECTED));
        }
        let eseg = EthSeg::new_checked(&wqe[SEG_BYTES..]).ok_or_else(qp_op)?;
        let (cs, mss, ihs) = (eseg.cs_flags(), eseg.mss(), eseg.inline_hdr_sz());
        let (vlan, inline_len) = match ihs {
            VLAN_INSERT_CMD => (eseg.vlan_insert(), 0),
            n => (None, usize::from(n)),
        };
        let inline_at = SEG_BYTES + ES_INLINE_START;
        if inline_at + inline_len > wqe.len() {
            return Err(qp_op());
        }
        let data_at = SEG_BYTES + eth_seg_units(inline_len) * DS_BYTES;
        let csum = TxCsum {
            ipv4: cs & CS_L3 != 0,
            tcp: cs & CS_L4 != 0,
            udp: cs & CS_L4 != 0,
        };
        let mut frame = std::mem::take(&mut self.frame);
        let r = match opcode {
            Opcode::Empw => {
                // One packet per descriptor; no inline header, no VLAN command (§2.7), and
                // minimal inlining is impossible with it (§1.9).
                if ihs != 0 || mss != 0 || min_inline > 0 {
                    Err(qp_op())
                } else {
                    self.empw(&wqe[data_at.min(wqe.len())..], &mut frame, csum)
                }
            }
            _ => {
                // SEND and TSO: the inline header, then every data segment (§2.3, §2.4).
                // Fewer inline bytes than the queue's minimum: a malformed WQE (§1.9, §8
                // item 4; the hardware's answer is unconfirmed).
                if inline_len < min_inline || (opcode == Opcode::Send && mss != 0) {
                    Err(qp_op())
                } else {
                    frame[HEADROOM..HEADROOM + inline_len]
                        .copy_from_slice(&wqe[inline_at..inline_at + inline_len]);
                    let mut len = HEADROOM + inline_len;
                    match self.gather(&wqe[data_at.min(wqe.len())..], &mut frame, &mut len, None) {
                        Err(e) => Err(e),
                        Ok(_) if opcode == Opcode::Tso => {
                            self.tso(&mut frame, len, inline_len, mss, vlan, csum)
                        }
                        Ok(_) => {
                            self.send_frame(&mut frame, HEADROOM, len, vlan, csum);
                            Ok(())
                        }
                    }
                }
            }
        };
        self.frame = frame;
        r
    }

    /// Copies the data segments in `segs` to `frame[*len..]`: pointer segments through their
    /// memory key (LOCAL_PROT on a bad key or range, §8 item 3), inline segments from the WQE.
    /// With `one`, stops after one segment and returns it (eMPW). Returns the segments read.
    fn gather(
        &mut self,
        segs: &[u8],
        frame: &mut [u8],
        len: &mut usize,
        one: Option<()>,
    ) -> Result<usize, Failure> {
        let mut off = 0;
        let mut count = 0;
        while off + SEG_BYTES <= segs.len() {
            let d = DataSeg::new_checked(&segs[off..]).ok_or_else(qp_op)?;
            let n = match InlineSeg::len(d.byte_count()) {
                Some(n) => {
                    let n = n as usize;
                    if off + 4 + n > segs.len() || *len + n > frame.len() {
                        return Err(qp_op());
                    }
                    frame[*len..*len + n].copy_from_slice(&segs[off + 4..off + 4 + n]);
                    off += inline_seg_units(n) * DS_BYTES;
                    n
                }
                None => {
                    let n = d.byte_count() as usize;
                    // A zero-length gather entry is never produced by DPDK and its meaning is
                    // unconfirmed (§2.4): the model calls it a length error.
                    if n == 0 {
                        return Err((Syndrome::LocalLength, 0));
                    }
                    if *len + n > frame.len() {
                        return Err((Syndrome::LocalLength, 0));
                    }
                    self.tx_gathers += 1;
                    let every = u64::from(self.faults.tx_bad_key_every);
                    // The fault: the key is looked up as if it were not registered.
                    let unknown_key = every > 0 && self.tx_gathers.is_multiple_of(every);
                    if unknown_key
                        || !self
                            .mrs
                            .read(d.addr(), d.lkey(), &mut frame[*len..*len + n])
                    {
                        return Err((Syndrome::LocalProt, 0));
                    }
                    off += SEG_BYTES;
                    n
                }
            };
            *len += n;
            count += 1;
            if one.is_some() {
                break;
            }
        }
        Ok(count)
    }

    /// eMPW: every descriptor is one packet (§2.7); all are gathered before any is sent, so a
    /// failing descriptor sends nothing.
    fn empw(&mut self, segs: &[u8], frame: &mut [u8], csum: TxCsum) -> Result<(), Failure> {
        let mut bounds = [(0usize, 0usize); MAX_EMPW_PACKETS];
        let mut packets = 0;
        let mut off = 0;
        let mut len = HEADROOM;
        while off + SEG_BYTES <= segs.len() && packets < MAX_EMPW_PACKETS {
            let start = len;
            let d = DataSeg::new_checked(&segs[off..]).ok_or_else(qp_op)?;
            let units = match InlineSeg::len(d.byte_count()) {
                Some(n) => inline_seg_units(n as usize),
                None => 1,
            };
            self.gather(&segs[off..], frame, &mut len, Some(()))?;
            bounds[packets] = (start, len);
            packets += 1;
            off += units * DS_BYTES;
        }
        for &(start, end) in &bounds[..packets] {
            // Packets lie back to back: eMPW carries no VLAN command, so none needs room
            // before it, and checksums stay inside each packet.
            self.send_frame(frame, start, end, None, csum);
        }
        Ok(())
    }

    /// TSO: cuts the gathered packet (`frame[HEADROOM..len]`, `hdr` header bytes) into `mss`
    /// payload pieces with fixed-up headers (§2.6 F, §8 item 5).
    fn tso(
        &mut self,
        frame: &mut [u8],
        len: usize,
        hdr: usize,
        mss: u16,
        vlan: Option<u16>,
        csum: TxCsum,
    ) -> Result<(), Failure> {
        let packet = &frame[HEADROOM..len];
        let l4_start = parse::l3_start(packet)
            .and_then(|(at, et)| IpHeader::parse(packet, at, et))
            .map_or(0, |ip| ip.l4_start);
        let req = Tso {
            header_bytes: hdr,
            l4_start,
            mss: usize::from(mss),
        };
        let mut seg = std::mem::take(&mut self.seg);
        let cut = tso::segment(packet, &req, HEADROOM, &mut seg, |s| {
            let n = s.len();
            self.send_frame(s, HEADROOM, n, vlan, csum);
        });
        self.seg = seg;
        cut.map(|_| ()).map_err(|e| {
            tracing::debug!(target: "pmd::emu", error = %e, "TSO WQE refused");
            qp_op()
        })
    }

    /// Puts `buf[start..end]` on the wire after VLAN insertion (into the bytes before
    /// `start`, at least 4), the checksums asked for, the MTU check and padding.
    fn send_frame(
        &mut self,
        buf: &mut [u8],
        mut start: usize,
        end: usize,
        vlan: Option<u16>,
        cs: TxCsum,
    ) {
        if let Some(tci) = vlan {
            if end - start >= 12 && start >= 4 {
                buf.copy_within(start..start + 12, start - 4);
                start -= 4;
                buf[start + 12..start + 14].copy_from_slice(&parse::ETHERTYPE_VLAN.to_be_bytes());
                buf[start + 14..start + 16].copy_from_slice(&tci.to_be_bytes());
            }
        }
        let out = &mut buf[start..end];
        csum::apply_tx_full(out, cs);
        let l2 = if out.len() >= 18 && out[12..14] == parse::ETHERTYPE_VLAN.to_be_bytes() {
            18
        } else {
            14
        };
        if out.len().saturating_sub(l2) > usize::from(self.mtu) {
            self.stats.tx_mtu_drops += 1;
            return;
        }
        let mut pad = [0u8; MIN_FRAME];
        let wire_frame: &[u8] = if out.len() < MIN_FRAME {
            pad[..out.len()].copy_from_slice(out);
            &pad
        } else {
            out
        };
        if self.wire.send(wire_frame) {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += wire_frame.len() as u64;
        } else {
            self.stats.tx_wire_drops += 1;
        }
    }
}
