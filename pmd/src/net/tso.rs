//! TCP segmentation offload as a device performs it: one large TCP packet (headers once, then
//! the payload) becomes frames of at most MSS payload bytes, each with the headers repeated
//! and fixed up: IPv4 total length and id (IPv6 payload length), TCP sequence number and
//! flags, and the TCP pseudo-header sum in the checksum field, so that the device's checksum
//! offload ([`csum::apply_tx`](super::csum::apply_tx)) finishes every segment.
#![deny(unsafe_code)]

use super::parse::{self, IpVersion};

/// Shortest headers a TSO packet can have: Ethernet, IPv4 and TCP without options.
pub const MIN_HEADER_BYTES: usize =
    parse::ETH_HEADER_BYTES + parse::IPV4_MIN_HEADER_BYTES + parse::TCP_MIN_HEADER_BYTES;

/// How to cut a TSO packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tso {
    /// Bytes of headers (Ethernet through TCP) at the front of the packet, repeated in every
    /// segment.
    pub header_bytes: usize,
    /// Offset of the TCP header. An offset inside the Ethernet header (e.g. 0: "not given")
    /// means right after a fixed-size IP header.
    pub l4_start: usize,
    /// Most payload bytes per segment.
    pub mss: usize,
}

/// A TSO request the device refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TsoError {
    /// The headers are shorter than Ethernet + IPv4 + TCP.
    #[error(
        "TSO headers of {0} bytes are shorter than Ethernet + IPv4 + TCP ({MIN_HEADER_BYTES})"
    )]
    HeadersTooShort(usize),
    /// The headers run past the end of the packet.
    #[error("TSO headers of {header_bytes} bytes run past the {packet_bytes}-byte packet")]
    HeadersPastPacket {
        /// The header length asked for.
        header_bytes: usize,
        /// The packet's length.
        packet_bytes: usize,
    },
    /// An MSS of zero.
    #[error("TSO MSS of zero")]
    ZeroMss,
}

/// Cuts `packet` into segments as `tso` says. Each segment is built in `buf` after `headroom`
/// zero bytes (room for, e.g., a VLAN tag the device inserts later) and handed to `emit` as
/// the whole of `buf`, in order. A packet with no payload gives one header-only segment.
/// Returns the number of segments.
///
/// # Errors
/// [`TsoError`] when the request is invalid; nothing is emitted then.
pub fn segment(
    packet: &[u8],
    tso: &Tso,
    headroom: usize,
    buf: &mut Vec<u8>,
    mut emit: impl FnMut(&mut [u8]),
) -> Result<usize, TsoError> {
    let (hdr, mss) = (tso.header_bytes, tso.mss);
    if hdr < MIN_HEADER_BYTES {
        return Err(TsoError::HeadersTooShort(hdr));
    }
    if hdr > packet.len() {
        return Err(TsoError::HeadersPastPacket {
            header_bytes: hdr,
            packet_bytes: packet.len(),
        });
    }
    if mss == 0 {
        return Err(TsoError::ZeroMss);
    }
    let (headers, payload) = packet.split_at(hdr);
    let count = payload.len().div_ceil(mss).max(1);
    for k in 0..count {
        let chunk = &payload[(k * mss).min(payload.len())..((k + 1) * mss).min(payload.len())];
        buf.clear();
        buf.resize(headroom, 0);
        buf.extend_from_slice(headers);
        buf.extend_from_slice(chunk);
        fix_segment(&mut buf[headroom..], hdr, tso.l4_start, k, count, mss);
        emit(buf);
    }
    Ok(count)
}

/// Turns segment `k` of `count` (headers of `hdr` bytes, TCP at `l4`) into a frame of its
/// own: IPv4 total length and id (or IPv6 payload length), TCP sequence number and flags, and
/// the TCP pseudo-header sum for the device to finish. Headers that do not hold together
/// (the TCP header overlapping the IP header or running past `hdr`) are left as they are.
fn fix_segment(f: &mut [u8], hdr: usize, l4: usize, k: usize, count: usize, mss: usize) {
    let Some((l3, _)) = parse::l3_start(f) else {
        return;
    };
    let (version, ip_bytes) = match f.get(l3).map(|b| b >> 4) {
        Some(4) => (IpVersion::V4, parse::IPV4_MIN_HEADER_BYTES),
        _ => (IpVersion::V6, parse::IPV6_HEADER_BYTES),
    };
    let l4 = if l4 > l3 { l4 } else { l3 + ip_bytes };
    if l4 < l3 + ip_bytes || l4 + parse::TCP_MIN_HEADER_BYTES > hdr || hdr > f.len() {
        return;
    }
    let l4_len = f.len() - l4;
    match version {
        IpVersion::V4 => {
            let tot = (f.len() - l3) as u16;
            f[l3 + 2..l3 + 4].copy_from_slice(&tot.to_be_bytes());
            let id = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]).wrapping_add(k as u16);
            f[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
            f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
        }
        IpVersion::V6 => {
            let plen = (f.len() - l3 - parse::IPV6_HEADER_BYTES) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        }
    }
    let pseudo = parse::pseudo_sum(f, l3, version, parse::IPPROTO_TCP, l4_len);
    let seq = u32::from_be_bytes([f[l4 + 4], f[l4 + 5], f[l4 + 6], f[l4 + 7]])
        .wrapping_add((k * mss) as u32);
    f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
    if k + 1 < count {
        f[l4 + 13] &= !(0x01 | 0x08); // FIN, PSH: last segment only
    }
    if k > 0 {
        f[l4 + 13] &= !0x80; // CWR: first segment only
    }
    let field = l4 + parse::TCP_CSUM_OFFSET;
    f[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::csum::{self, TxCsum};
    use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

    /// A TSO packet as a driver hands it over: etherparse builds a TCP packet with FIN, PSH
    /// and CWR set; the per-packet length fields and checksums are the driver's stale ones.
    fn big_packet(v6: bool, vlan: bool, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        if v6 {
            eth.ipv6([1; 16], [2; 16], 64)
                .tcp(4000, 80, 0xffff_fff0, 1024)
                .fin()
                .psh()
                .cwr()
                .write(&mut f, payload)
                .unwrap();
        } else {
            eth.ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
                .tcp(4000, 80, 0xffff_fff0, 1024)
                .fin()
                .psh()
                .cwr()
                .write(&mut f, payload)
                .unwrap();
        }
        if vlan {
            f.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        }
        f
    }

    fn header_bytes(v6: bool, vlan: bool) -> usize {
        14 + 4 * usize::from(vlan) + if v6 { 40 } else { 20 } + 20
    }

    #[test]
    fn segments_are_valid_tcp_frames_that_rebuild_the_payload() {
        let payload: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
        for (v6, vlan) in [(false, false), (false, true), (true, false), (true, true)] {
            let pkt = big_packet(v6, vlan, &payload);
            let hdr = header_bytes(v6, vlan);
            let tso = Tso {
                header_bytes: hdr,
                l4_start: hdr - 20,
                mss: 1000,
            };
            let mut frames = Vec::new();
            let n = segment(&pkt, &tso, 4, &mut Vec::new(), |seg| {
                assert_eq!(&seg[..4], &[0; 4], "headroom");
                let f = &mut seg[4..];
                csum::apply_tx(
                    f,
                    TxCsum {
                        ipv4: true,
                        tcp: true,
                        udp: false,
                    },
                );
                frames.push(f.to_vec());
            })
            .unwrap();
            assert_eq!((n, frames.len()), (3, 3));
            let mut rebuilt = Vec::new();
            for (k, f) in frames.iter().enumerate() {
                let s = SlicedPacket::from_ethernet(f).unwrap();
                match &s.net {
                    Some(NetSlice::Ipv4(ip)) => {
                        let h = ip.header().to_header();
                        assert_eq!(h.header_checksum, h.calc_header_checksum());
                        assert_eq!(usize::from(h.total_len), f.len() - (hdr - 40));
                        assert_eq!(h.identification, k as u16);
                    }
                    Some(NetSlice::Ipv6(ip)) => {
                        let plen = usize::from(ip.header().payload_length());
                        assert_eq!(plen, f.len() - (hdr - 20));
                    }
                    other => panic!("{other:?}"),
                }
                let Some(TransportSlice::Tcp(tcp)) = &s.transport else {
                    panic!("not TCP")
                };
                let want = match &s.net {
                    Some(NetSlice::Ipv4(ip)) => tcp
                        .to_header()
                        .calc_checksum_ipv4(&ip.header().to_header(), tcp.payload())
                        .unwrap(),
                    Some(NetSlice::Ipv6(ip)) => tcp
                        .to_header()
                        .calc_checksum_ipv6(&ip.header().to_header(), tcp.payload())
                        .unwrap(),
                    _ => unreachable!(),
                };
                assert_eq!(tcp.checksum(), want, "segment {k}");
                assert_eq!(
                    tcp.sequence_number(),
                    0xffff_fff0u32.wrapping_add(1000 * k as u32)
                );
                let last = k == 2;
                assert_eq!((tcp.fin(), tcp.psh(), tcp.cwr()), (last, last, k == 0));
                rebuilt.extend_from_slice(tcp.payload());
            }
            assert_eq!(rebuilt, payload, "v6 {v6}, vlan {vlan}");
            assert_eq!(frames[2].len(), hdr + 500);
        }
    }

    #[test]
    fn no_payload_gives_one_header_only_segment() {
        let pkt = big_packet(false, false, b"");
        let tso = Tso {
            header_bytes: 54,
            l4_start: 34,
            mss: 1460,
        };
        let mut lens = Vec::new();
        assert_eq!(
            segment(&pkt, &tso, 0, &mut Vec::new(), |s| lens.push(s.len())),
            Ok(1)
        );
        assert_eq!(lens, [54]);
    }

    #[test]
    fn invalid_requests_are_refused_before_anything_is_sent() {
        let pkt = big_packet(false, false, &[0; 100]);
        let ok = Tso {
            header_bytes: 54,
            l4_start: 34,
            mss: 10,
        };
        let mut sent = 0;
        let mut run = |t: Tso| segment(&pkt, &t, 0, &mut Vec::new(), |_| sent += 1);
        assert_eq!(
            run(Tso {
                header_bytes: 53,
                ..ok
            }),
            Err(TsoError::HeadersTooShort(53))
        );
        assert_eq!(
            run(Tso {
                header_bytes: 155,
                ..ok
            }),
            Err(TsoError::HeadersPastPacket {
                header_bytes: 155,
                packet_bytes: 154
            })
        );
        assert_eq!(run(Tso { mss: 0, ..ok }), Err(TsoError::ZeroMss));
        assert_eq!(sent, 0);
    }

    proptest::proptest! {
        /// Any header bytes and offsets: no panic.
        #[test]
        fn segmenting_never_panics(
            mut pkt in proptest::collection::vec(proptest::prelude::any::<u8>(), 54..200),
            hdr in 54usize..120, l4 in 0usize..120, mss in 1usize..64, vlan: bool, v6: bool,
        ) {
            if vlan {
                pkt[12..14].copy_from_slice(&[0x81, 0x00]);
            }
            pkt[14 + 4 * usize::from(vlan)] = if v6 { 0x60 } else { 0x45 };
            let tso = Tso { header_bytes: hdr, l4_start: l4, mss };
            let _ = segment(&pkt, &tso, 4, &mut Vec::new(), |_| {});
        }
    }
}
