//! The RX side: frames from the wire into posted RQ buffers (VLAN strip, RSS queue choice,
//! scatter through memory keys), RX CQEs with checksum verdicts and hash, and RX_COALESCED_4
//! coalescing (§7.4).
#![deny(unsafe_code)]

use super::{CqOf, Engine, BUDGET, VENDOR_ERR_INJECTED};
use crate::emu::wire::faults::Arrival;
use crate::emu::wire::Wire;
use crate::hw::mana::cqe::{hash_type, Cqe, CqeType, RxCsum, CLIENT_TYPE_COMPLETION};
use crate::hw::mana::wqe::{Sge, WqeHeader, SGE_BYTES, SHORT_OOB_BYTES, WQE_HEADER_BYTES};
use crate::hw::mana::{BU_BYTES, CQE_BYTES, RSS_TABLE_ENTRIES};
use crate::net::parse::{self, L3, L4};
use crate::net::toeplitz;
use crate::ring::read_wrapped;

impl Engine {
    /// Takes up to [`BUDGET`] frames off the wire (dropped ones count) into RQ buffers. With
    /// `only_with_room` (an inline kick), or on a wire that holds its arrivals
    /// ([`Wire::holds_arrivals`], the kernel's ring of an afpacket wire), a frame is taken
    /// only while every RQ it could go to has a posted WQE: the rest wait on the wire, the
    /// device's receive buffer there (see the module docs of [`crate::emu::thread`]);
    /// otherwise frames that find no WQE are dropped and counted (`rx_no_wqe`), as a NIC
    /// running on its own does.
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
                // Link down or rx_drop_every: the wire's faults.
                Arrival::Dropped => None,
            };
            n += 1;
            self.rx_seen += 1;
            match got {
                Some(len) => self.receive(&mut frame[..len]),
                None => self.stats.rx_fault_drops += 1,
            }
            self.frame = frame;
        }
        // Coalescing never holds a packet past the end of a pass.
        self.flush_coalesced();
        n
    }

    /// Whether a frame taken off the wire now finds a posted WQE whichever RQ RSS picks (all
    /// RQs have one, or the default RX object has one when RSS is off). Without any RQ a
    /// frame is dropped whatever happens: that counts as room. The doorbells are sampled
    /// again before saying no (the driver may have posted since this pass sampled them).
    fn rx_room(&mut self) -> bool {
        let ready = |e: &Self| {
            let posted = |q: &super::Rq| {
                let p = q.tail.wrapping_sub(q.consumed);
                (BU_BYTES as u32..=1 << 30).contains(&p)
            };
            if e.rss.enabled {
                e.rqs.iter().all(posted)
            } else {
                e.rss.default.and_then(|i| e.rqs.get(i)).is_none_or(posted)
            }
        };
        if ready(self) {
            return true;
        }
        self.scan_doorbells();
        ready(self)
    }

    /// Delivers one frame: VLAN strip, RSS, scatter into the next RX WQE, the RX CQE.
    fn receive(&mut self, frame: &mut [u8]) {
        // 802.1Q: the device strips the tag and reports the VID (§7.4).
        let mut vlan = None;
        let mut start = 0;
        if frame.len() >= 18 && frame[12..14] == parse::ETHERTYPE_VLAN.to_be_bytes() {
            vlan = Some(u16::from_be_bytes([frame[14], frame[15]]) & 0x0fff);
            frame.copy_within(0..12, 4);
            start = 4;
        }
        let frame = &frame[start..];
        let info = RxInfo::of(frame, &self.rss.hasher);
        let rq_idx = if self.rss.enabled && info.hash_type != 0 {
            usize::from(self.rss.table[(info.hash & (RSS_TABLE_ENTRIES as u32 - 1)) as usize])
        } else {
            // Frames without a hash go to the default RX object (§1.6 step 6).
            self.rss.default.unwrap_or(usize::MAX)
        };
        let Some(rq) = self.rqs.get(rq_idx) else {
            self.stats.rx_no_wqe += 1;
            return;
        };
        if !has_wqe(rq.tail, rq.consumed) {
            // A doorbell is an event on hardware: one rung since this step sampled the page
            // counts. Sample again before calling the queue empty.
            self.scan_doorbells();
        }
        let rq = &self.rqs[rq_idx];
        if !has_wqe(rq.tail, rq.consumed) {
            self.stats.rx_no_wqe += 1;
            return;
        }
        let mut wqe = [0u8; 256];
        // One basic unit first: a one-SGE receive WQE (what drivers post) is all there is.
        read_wrapped(&rq.mem, rq.consumed, &mut wqe[..BU_BYTES]);
        let Some(h) = WqeHeader::new_checked(&wqe[..WQE_HEADER_BYTES]) else {
            return;
        };
        let bytes = h.wqe_bytes().min(256);
        let nsge = usize::from(h.num_sge());
        let oob = h.inline_oob_bytes();
        if bytes > BU_BYTES {
            read_wrapped(
                &rq.mem,
                rq.consumed.wrapping_add(BU_BYTES as u32),
                &mut wqe[BU_BYTES..bytes],
            );
        }
        let (pos, cq, id) = (rq.consumed, CqOf::Rq(rq_idx), rq.id);
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
                match self.mrs.find(s.address(), s.mem_key(), n) {
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
            if self.rx_coalesce || self.faults.rx_coalesce {
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
        self.complete(cq, &body, id, false);
    }

    /// Writes the coalesced CQE being filled, if any.
    pub(super) fn flush_coalesced(&mut self) {
        if let Some(p) = self.coalescing.take() {
            self.complete(p.cq, &p.body, p.wq_id, false);
        }
    }
}

/// Whether an RQ whose doorbell says `tail` and whose engine has consumed up to `consumed`
/// (bytes, free-running) has a WQE posted (at least one basic unit pending; a difference
/// past 2^30 is a consumer ahead of a stale tail, not a posting).
fn has_wqe(tail: u32, consumed: u32) -> bool {
    let pending = tail.wrapping_sub(consumed);
    (BU_BYTES as u32..=1 << 30).contains(&pending)
}

/// An RX_COALESCED_4 CQE being filled.
pub(super) struct Coalescing {
    rq: usize,
    cq: CqOf,
    wq_id: u32,
    flags: [u8; 4],
    body: [u8; CQE_BYTES],
    k: usize,
}

/// What the RX side writes into a CQE about a frame's headers.
#[derive(Debug, PartialEq, Eq)]
struct RxInfo {
    hash: u32,
    hash_type: u16,
    csum: RxCsum,
}

impl RxInfo {
    /// The RSS hash (NDIS tuple, see [`parse::Classified::rss_input`]) under `key`, the
    /// single-bit NDIS hash type (§11 item 2), and the checksum verdicts, for an untagged
    /// frame.
    fn of(frame: &[u8], hasher: &toeplitz::Table) -> Self {
        let c = parse::classify(frame);
        let v6 = c.l3 == L3::Ipv6;
        let pick = |v4: u16, v6_bits: u16| if v6 { v6_bits } else { v4 };
        let hash_type = match (c.l3, c.l4) {
            (L3::Other, _) => 0,
            (_, L4::Tcp { .. }) => pick(hash_type::TCP_IPV4, hash_type::TCP_IPV6),
            (_, L4::Udp { .. }) => pick(hash_type::UDP_IPV4, hash_type::UDP_IPV6),
            (_, L4::Other) => pick(hash_type::IPV4, hash_type::IPV6),
        };
        let mut csum = RxCsum::default();
        if let L3::Ipv4 { csum_ok } = c.l3 {
            (csum.ip_ok, csum.ip_bad) = (csum_ok, !csum_ok);
        }
        match c.l4 {
            L4::Tcp { csum_ok } => (csum.tcp_ok, csum.tcp_bad) = (csum_ok, !csum_ok),
            L4::Udp {
                csum_ok: Some(csum_ok),
            } => (csum.udp_ok, csum.udp_bad) = (csum_ok, !csum_ok),
            L4::Udp { csum_ok: None } | L4::Other => {}
        }
        Self {
            hash: {
                let (addrs, ports) = c.rss_parts(frame);
                hasher.hash_at(0, addrs) ^ hasher.hash_at(addrs.len(), ports)
            },
            hash_type,
            csum,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    const KEY: [u8; 40] = [0x6d; 40];

    fn frame(v6: bool, tcp: bool) -> Vec<u8> {
        let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let mut f = Vec::new();
        match (v6, tcp) {
            (false, false) => eth
                .ipv4([169, 254, 0, 1], [169, 254, 0, 2], 64)
                .udp(1000, 2000)
                .write(&mut f, b"hello world"),
            (false, true) => eth
                .ipv4([169, 254, 0, 1], [169, 254, 0, 2], 64)
                .tcp(1000, 2000, 1, 100)
                .write(&mut f, b"hello world"),
            (true, false) => eth
                .ipv6([1; 16], [2; 16], 64)
                .udp(1000, 2000)
                .write(&mut f, b"hello world"),
            (true, true) => eth
                .ipv6([1; 16], [2; 16], 64)
                .tcp(1000, 2000, 1, 100)
                .write(&mut f, b"hello world"),
        }
        .unwrap();
        f
    }

    #[test]
    fn hash_types_are_single_ndis_bits_and_verdicts_land_in_their_fields() {
        for (v6, tcp, want) in [
            (false, false, hash_type::UDP_IPV4),
            (false, true, hash_type::TCP_IPV4),
            (true, false, hash_type::UDP_IPV6),
            (true, true, hash_type::TCP_IPV6),
        ] {
            let f = frame(v6, tcp);
            let info = RxInfo::of(&f, &toeplitz::Table::new(&KEY));
            assert_eq!(info.hash_type, want);
            let c = info.csum;
            assert_eq!((c.ip_ok, c.ip_bad), (!v6, false));
            assert_eq!(
                (c.tcp_ok, c.tcp_bad, c.udp_ok, c.udp_bad),
                (tcp, false, !tcp, false)
            );
            let tuple = parse::classify(&f);
            let (input, n) = tuple.rss_input(&f);
            assert_eq!(info.hash, toeplitz::hash(&KEY, &input[..n]));
            assert_ne!(info.hash, 0);
        }
        // A flipped payload byte is caught.
        let mut f = frame(false, false);
        let last = f.len() - 1;
        f[last] ^= 1;
        let c = RxInfo::of(&f, &toeplitz::Table::new(&KEY)).csum;
        assert!(c.ip_ok && c.udp_bad && !c.udp_ok);
    }

    #[test]
    fn fragments_hash_on_addresses_and_other_frames_not_at_all() {
        let mut f = frame(false, true);
        f[14 + 6] = 0x20; // more fragments; the header checksum is now wrong
        let info = RxInfo::of(&f, &toeplitz::Table::new(&KEY));
        assert_eq!(info.hash_type, hash_type::IPV4);
        assert!(info.csum.ip_bad && !info.csum.tcp_ok && !info.csum.tcp_bad);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(
            RxInfo::of(&f, &toeplitz::Table::new(&KEY)),
            RxInfo {
                hash: 0,
                hash_type: 0,
                csum: RxCsum::default()
            }
        );
    }
}
