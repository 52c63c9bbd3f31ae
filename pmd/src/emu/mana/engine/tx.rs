//! The TX side: SQ WQEs after a doorbell, checked against their queue (§10 item 1), frames
//! gathered through memory keys, TX offloads (VLAN insertion, checksums, TSO), frames onto
//! the wire, TX CQEs.
#![deny(unsafe_code)]

use super::{CqOf, Engine, BUDGET, VENDOR_ERR_BAD_MKEY, VENDOR_ERR_BAD_WQE, VENDOR_ERR_INJECTED};
use crate::emu::wire::Wire;
use crate::hw::mana::cqe::{Cqe, CqeType, CLIENT_TYPE_COMPLETION};
use crate::hw::mana::wqe::{
    Sge, TxOob, WqeHeader, LONG_OOB_BYTES, SGE_BYTES, SHORT_OOB_BYTES, WQE_HEADER_BYTES,
};
use crate::hw::mana::{BU_BYTES, CQE_BYTES, MAX_SQ_WQE_BYTES};
use crate::net::csum::{self, TxCsum};
use crate::net::parse;
use crate::net::tso::{self, Tso};
use crate::ring::read_wrapped;

impl Engine {
    /// Consumes the WQEs the SQ doorbell announces (at most [`BUDGET`]); returns how many.
    pub(super) fn process_sq(&mut self, i: usize) -> usize {
        let tail = self.sqs[i].tail;
        let mut done = 0;
        // Only the bytes of each WQE are read and looked at (zeroed once, not per WQE).
        let mut wqe = [0u8; MAX_SQ_WQE_BYTES];
        while self.sqs[i].consumed != tail && done < BUDGET {
            let pending = tail.wrapping_sub(self.sqs[i].consumed);
            let sq = &self.sqs[i];
            // One basic unit first: a one-SGE WQE with the short OOB is all there is.
            read_wrapped(&sq.mem, sq.consumed, &mut wqe[..BU_BYTES]);
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
                let id = sq.id;
                let skip = if bytes as u32 <= pending && bytes <= MAX_SQ_WQE_BYTES {
                    bytes as u32
                } else {
                    pending
                };
                self.tx_error(
                    CqOf::Sq(i),
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
            if bytes > BU_BYTES {
                // The first unit is in already: the rest of the WQE.
                read_wrapped(
                    &sq.mem,
                    sq.consumed.wrapping_add(BU_BYTES as u32),
                    &mut wqe[BU_BYTES..bytes],
                );
            }
            let pos = self.sqs[i].consumed;
            self.sqs[i].consumed = pos.wrapping_add(bytes as u32);
            self.transmit(i, &wqe[..bytes], oob, nsge, pos, lso);
            done += 1;
        }
        done
    }

    /// Completes the WQE at byte position `pos` with error `t`.
    fn tx_error(&mut self, cq: CqOf, sq_id: u32, t: CqeType, vendor_err: u32, pos: u32) {
        self.stats.tx_errors += 1;
        tracing::debug!(target: "pmd::emu", sq_id, ?t, vendor_err, pos, "TX WQE completed with an error");
        let mut body = [0u8; CQE_BYTES];
        if let Some(mut c) = Cqe::new_checked(&mut body[..]) {
            c.set_header(t, CLIENT_TYPE_COMPLETION, vendor_err);
            c.set_tx(0, 0, (pos / BU_BYTES as u32) & 0x07ff_ffff);
        }
        self.complete(cq, &body, sq_id, true);
    }

    /// Sends what one well-formed WQE describes (checked against its queue first) and
    /// completes it.
    fn transmit(
        &mut self,
        i: usize,
        wqe: &[u8],
        oob_bytes: usize,
        nsge: usize,
        pos: u32,
        lso: Option<(usize, usize)>,
    ) {
        let (cq, sq_id, vp) = (CqOf::Sq(i), self.sqs[i].id, self.sqs[i].vp_offset);
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
        if o.vcq_num() != self.sqs[i].cq.id
            || o.vsq_frame() != crate::hw::mana::wqe::vsq_frame(sq_id)
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
                || !self
                    .mrs
                    .read(s.address(), s.mem_key(), &mut frame[len..len + size])
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
        // The vPort's MTU (spec §1.11, §7.3 TX_MTU_DROP): the L3 size of the frame, or of
        // each TSO segment, may not exceed it.
        let l2 = if len >= 4 + 14 && frame[4 + 12..4 + 14] == [0x81, 0x00] {
            18
        } else {
            14
        };
        let l3_bytes = match lso {
            None => (len - 4).saturating_sub(l2),
            Some((hdr, mss)) => (hdr + mss).saturating_sub(l2),
        };
        if l3_bytes > usize::from(self.mtu) {
            self.frame = frame;
            self.stats.tx_mtu_errors += 1;
            return self.tx_error(cq, sq_id, CqeType::TxMtuDrop, 0, pos);
        }
        match lso {
            None => self.send_frame(&mut frame, len, &o),
            Some((hdr, mss)) => {
                // TCP segmentation (§4.4): headers (`last_vbytes`) + at most MSS payload bytes
                // per frame; each segment gets the OOB's VLAN tag and checksums.
                let req = Tso {
                    header_bytes: hdr,
                    l4_start: usize::from(o.trans_off()),
                    mss,
                };
                let mut seg = std::mem::take(&mut self.seg);
                let cut = tso::segment(&frame[4..len], &req, 4, &mut seg, |s| {
                    let n = s.len();
                    self.send_frame(s, n, &o);
                });
                self.seg = seg;
                if let Err(e) = cut {
                    tracing::debug!(target: "pmd::emu", sq_id, error = %e, "TSO WQE refused");
                    self.frame = frame;
                    return self.tx_error(
                        cq,
                        sq_id,
                        CqeType::TxHdrProcessingError,
                        VENDOR_ERR_BAD_WQE,
                        pos,
                    );
                }
            }
        }
        self.frame = frame;
        if !o.suppress_txcqe_gen() {
            let mut body = [0u8; CQE_BYTES];
            if let Some(mut c) = Cqe::new_checked(&mut body[..]) {
                c.set_header(CqeType::TxOkay, CLIENT_TYPE_COMPLETION, 0);
                c.set_tx(0, 0, (pos / BU_BYTES as u32) & 0x07ff_ffff);
            }
            self.complete(cq, &body, sq_id, true);
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
            buf[start + 12..start + 14].copy_from_slice(&parse::ETHERTYPE_VLAN.to_be_bytes());
            buf[start + 14..start + 16].copy_from_slice(&tci.to_be_bytes());
        }
        let out = &mut buf[start..len];
        csum::apply_tx(
            out,
            TxCsum {
                ipv4: o.comp_iphdr_csum(),
                tcp: o.comp_tcp_csum(),
                udp: o.comp_udp_csum(),
            },
        );
        // Link down is the wire's fault: it refuses the frame.
        if self.wire.send(out) {
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += out.len() as u64;
        } else {
            self.stats.tx_wire_drops += 1;
        }
    }
}
