//! RFC 1071 Internet checksum helpers, and finishing the checksums a TX descriptor asks a
//! device for ([`apply_tx`]).
#![deny(unsafe_code)]

use super::parse::{self, IpHeader, IpVersion};

/// Adds `data` to a running one's-complement sum (big-endian 16-bit words; an odd last byte
/// is padded with zero). The result is congruent to the 16-bit sum, not equal to it: fold it
/// ([`fold`]) before use.
///
/// Eight bytes at a time, in the machine's byte order: a one's-complement sum may be
/// accumulated in any width and folded at the end, and the sum of byte-swapped words is the
/// byte-swapped sum (RFC 1071 §2 (B) "byte order independence", (C) "parallel summation").
/// So each 64-bit word is loaded as it lies in memory, its two 32-bit halves go into a 64-bit
/// accumulator (which cannot overflow below 2^31 words), and only the folded 16-bit result is
/// put into network order.
#[inline]
pub fn add(sum: u32, data: &[u8]) -> u32 {
    let mut acc = 0u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        acc += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = words.remainder();
    if let [a, b, c, d, tail @ ..] = rest {
        acc += u64::from(u32::from_ne_bytes([*a, *b, *c, *d]));
        rest = tail;
    }
    if let [a, b, tail @ ..] = rest {
        acc += u64::from(u16::from_ne_bytes([*a, *b]));
        rest = tail;
    }
    if let [last] = rest {
        // The high byte of a big-endian word: where it lies in memory, then a zero.
        acc += u64::from(u16::from_ne_bytes([*last, 0]));
    }
    // End-around carries (2^32 = 2^16 = 1 mod 0xffff): 64 bits to 33, to 32, then to 16
    // bits in three steps that cannot leave a carry behind.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    let words = u64::from(u16::from_be(acc as u16));
    let total = u64::from(sum) + words;
    ((total & 0xffff_ffff) + (total >> 32)) as u32
}

/// Folds a running sum to 16 bits (not complemented).
#[inline]
pub fn fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The checksum of `data`: the complement of the folded sum.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(add(0, data))
}

/// The IPv4 pseudo-header sum (source, destination, zero + protocol, L4 length), folded, not
/// complemented: what a driver stores in the L4 checksum field when it asks the NIC to finish
/// the checksum (DPDK `rte_ipv4_phdr_cksum`).
pub fn ipv4_pseudo(src: [u8; 4], dst: [u8; 4], proto: u8, l4_len: u16) -> u16 {
    // Six 16-bit words, summed directly (at most 2^19: no carry is lost before the fold).
    let words = |a: [u8; 4]| {
        u32::from(u16::from_be_bytes([a[0], a[1]])) + u32::from(u16::from_be_bytes([a[2], a[3]]))
    };
    fold(words(src) + words(dst) + u32::from(proto) + u32::from(l4_len))
}

/// The IPv6 pseudo-header sum (source, destination, 32-bit length, 32-bit next header),
/// folded, not complemented (DPDK `rte_ipv6_phdr_cksum`).
pub fn ipv6_pseudo(src: [u8; 16], dst: [u8; 16], next_header: u8, l4_len: u32) -> u16 {
    let addrs = add(add(0, &src), &dst);
    // Both sums start from 0, so `addrs` is at most 2 * 0xffff: no carry is lost.
    fold(addrs + (l4_len >> 16) + (l4_len & 0xffff) + u32::from(next_header))
}

/// Which checksums a TX descriptor asks the device to finish.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxCsum {
    /// The IPv4 header checksum.
    pub ipv4: bool,
    /// The TCP checksum.
    pub tcp: bool,
    /// The UDP checksum.
    pub udp: bool,
}

/// Finishes the checksums `req` asks for, as a device's TX checksum offload does: computes the
/// IPv4 header checksum, and completes the TCP or UDP checksum whose field the driver filled
/// with the pseudo-header sum ([`ipv4_pseudo`], [`ipv6_pseudo`]). Looks through one 802.1Q
/// tag; frames that are not IPv4/IPv6, or whose L4 header is cut short, are left as they are
/// (beyond the IPv4 header checksum). A UDP checksum that comes out zero is sent as `ffff`.
pub fn apply_tx(frame: &mut [u8], req: TxCsum) {
    if req == TxCsum::default() {
        return;
    }
    let Some(ip) = parse::l3_start(frame).and_then(|(at, et)| IpHeader::parse(frame, at, et))
    else {
        return;
    };
    if ip.version == IpVersion::V4 && req.ipv4 {
        let field = ip.start + 10;
        frame[field..field + 2].copy_from_slice(&[0, 0]);
        let c = checksum(&frame[ip.start..ip.l4_start]);
        frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    }
    let field = match ip.proto {
        parse::IPPROTO_TCP if req.tcp => parse::TCP_CSUM_OFFSET,
        parse::IPPROTO_UDP if req.udp => parse::UDP_CSUM_OFFSET,
        _ => return,
    };
    let (l4, end) = (ip.l4_start, ip.l4_end);
    if end < l4 + field + 2 {
        return;
    }
    // The field already holds the pseudo-header sum: summing the segment as it is and
    // complementing gives the full checksum.
    let mut c = !fold(add(0, &frame[l4..end]));
    if ip.proto == parse::IPPROTO_UDP && c == 0 {
        c = 0xffff;
    }
    frame[l4 + field..l4 + field + 2].copy_from_slice(&c.to_be_bytes());
}

/// Finishes the checksums `req` asks for as a device that ignores what the L4 checksum field
/// holds (mlx5, spec mlx5.md §2.3: the device computes the whole TCP/UDP checksum, pseudo
/// header included): the field is first set to the pseudo-header sum, then [`apply_tx`]
/// completes it. Frames it cannot parse are left as [`apply_tx`] leaves them.
pub fn apply_tx_full(frame: &mut [u8], req: TxCsum) {
    if req.tcp || req.udp {
        if let Some(ip) = parse::l3_start(frame).and_then(|(at, et)| IpHeader::parse(frame, at, et))
        {
            let field = match ip.proto {
                parse::IPPROTO_TCP if req.tcp => Some(parse::TCP_CSUM_OFFSET),
                parse::IPPROTO_UDP if req.udp => Some(parse::UDP_CSUM_OFFSET),
                _ => None,
            };
            if let Some(field) = field {
                let (l4, end) = (ip.l4_start, ip.l4_end);
                if end >= l4 + field + 2 && !ip.fragment {
                    let p = ip.pseudo_sum(frame, ip.proto, end - l4);
                    frame[l4 + field..l4 + field + 2].copy_from_slice(&p.to_be_bytes());
                }
            }
        }
    }
    apply_tx(frame, req);
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

    /// Golden values written by DPDK's `rte_ipv4_phdr_cksum` (captured from DPDK net/mana's
    /// TX path): 192.168.0.1 -> 192.168.0.2, TCP total length 114 -> `81 b8`; UDP total
    /// length 60 -> `81 8d`. L4 length = total length - 20.
    #[test]
    fn pseudo_header_matches_dpdk() {
        let (a, b) = ([192, 168, 0, 1], [192, 168, 0, 2]);
        assert_eq!(ipv4_pseudo(a, b, 6, 114 - 20).to_be_bytes(), [0x81, 0xb8]);
        assert_eq!(ipv4_pseudo(a, b, 17, 60 - 20).to_be_bytes(), [0x81, 0x8d]);
    }

    /// RFC 1071 section 3 example: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2.
    #[test]
    fn rfc1071_example() {
        assert_eq!(
            fold(add(0, &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])),
            0xddf2
        );
        // A well-known IPv4 header (from the Wikipedia IPv4 checksum example): b861.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0xb861);
    }

    /// A frame built (with correct checksums) by etherparse.
    macro_rules! built {
        ($builder:expr, $payload:expr) => {{
            let mut f = Vec::new();
            $builder.write(&mut f, $payload).unwrap();
            f
        }};
    }

    /// `good` as a driver hands it to the device: optionally tagged, a stale IPv4 header
    /// checksum, and the pseudo-header sum in the L4 checksum field.
    fn prepare(good: &[u8], vlan: bool) -> Vec<u8> {
        let mut f = good.to_vec();
        if vlan {
            f.splice(12..12, [0x81, 0x00, 0x20, 0x05]);
        }
        let (l3, et) = parse::l3_start(&f).unwrap();
        let ip = IpHeader::parse(&f, l3, et).unwrap();
        if ip.version == IpVersion::V4 {
            f[l3 + 10..l3 + 12].copy_from_slice(&[0xde, 0xad]);
        }
        let field = ip.l4_start
            + if ip.proto == parse::IPPROTO_TCP {
                parse::TCP_CSUM_OFFSET
            } else {
                parse::UDP_CSUM_OFFSET
            };
        let p = ip.pseudo_sum(&f, ip.proto, ip.l4_end - ip.l4_start);
        f[field..field + 2].copy_from_slice(&p.to_be_bytes());
        f
    }

    #[test]
    fn apply_tx_matches_etherparse_for_udp4_tcp4_udp6_tcp6() {
        let m = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let payload = b"hello world, odd length";
        let frames = [
            built!(
                PacketBuilder::ethernet2(m.0, m.1)
                    .ipv4([169, 254, 0, 1], [169, 254, 0, 2], 64)
                    .udp(1000, 2000),
                payload
            ),
            built!(
                PacketBuilder::ethernet2(m.0, m.1)
                    .ipv4([192, 168, 0, 1], [192, 168, 0, 2], 64)
                    .tcp(1234, 80, 99, 512),
                payload
            ),
            built!(
                PacketBuilder::ethernet2(m.0, m.1)
                    .ipv6([1; 16], [2; 16], 64)
                    .udp(53, 5353),
                payload
            ),
            built!(
                PacketBuilder::ethernet2(m.0, m.1)
                    .ipv6([3; 16], [4; 16], 64)
                    .tcp(5, 6, 7, 8),
                payload
            ),
        ];
        for (i, good) in frames.into_iter().enumerate() {
            for vlan in [false, true] {
                let mut f = prepare(&good, vlan);
                apply_tx(
                    &mut f,
                    TxCsum {
                        ipv4: true,
                        tcp: true,
                        udp: true,
                    },
                );
                let mut want = good.clone();
                if vlan {
                    want.splice(12..12, [0x81, 0x00, 0x20, 0x05]);
                }
                assert_eq!(f, want, "frame {i}, vlan {vlan}");
                // And etherparse agrees the result is consistent.
                let s = SlicedPacket::from_ethernet(&f).unwrap();
                if let Some(NetSlice::Ipv4(ip)) = &s.net {
                    let h = ip.header().to_header();
                    assert_eq!(h.header_checksum, h.calc_header_checksum());
                }
                assert!(matches!(
                    s.transport,
                    Some(TransportSlice::Udp(_) | TransportSlice::Tcp(_))
                ));
            }
        }
    }

    #[test]
    fn apply_tx_does_only_what_is_asked() {
        let good = built!(
            PacketBuilder::ethernet2([0; 6], [1; 6])
                .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
                .udp(1, 2),
            b"abc"
        );
        let prepared = prepare(&good, false);
        let mut f = prepared.clone();
        apply_tx(&mut f, TxCsum::default());
        assert_eq!(f, prepared);
        apply_tx(
            &mut f,
            TxCsum {
                tcp: true,
                ..TxCsum::default()
            },
        );
        assert_eq!(f, prepared, "a TCP request leaves a UDP frame alone");
        apply_tx(
            &mut f,
            TxCsum {
                ipv4: true,
                ..TxCsum::default()
            },
        );
        assert_eq!(f[24..26], good[24..26]);
        assert_eq!(f[40..42], prepared[40..42], "UDP field untouched");
    }

    #[test]
    fn apply_tx_full_ignores_what_the_l4_field_held() {
        let m = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let payload = b"hello world, odd length";
        for good in [
            built!(
                PacketBuilder::ethernet2(m.0, m.1)
                    .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
                    .udp(1000, 2000),
                payload
            ),
            built!(
                PacketBuilder::ethernet2(m.0, m.1)
                    .ipv6([3; 16], [4; 16], 64)
                    .tcp(5, 6, 7, 8),
                payload
            ),
        ] {
            let mut f = good.clone();
            let ipv4 = f[12..14] == [0x08, 0x00];
            if ipv4 {
                f[24..26].copy_from_slice(&[0x12, 0x34]);
            }
            let field = if ipv4 { 14 + 20 + 6 } else { 14 + 40 + 16 };
            f[field..field + 2].copy_from_slice(&[0xde, 0xad]);
            apply_tx_full(
                &mut f,
                TxCsum {
                    ipv4: true,
                    tcp: true,
                    udp: true,
                },
            );
            assert_eq!(f, good);
        }
    }

    /// The sum as RFC 1071 writes it: one 16-bit word at a time, end-around carries.
    fn add_by_words(mut sum: u64, data: &[u8]) -> u16 {
        for c in data.chunks(2) {
            sum += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    proptest::proptest! {
        #[test]
        fn add_folds_to_the_word_by_word_sum(
            sum in proptest::prelude::any::<u32>(),
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600),
            split in 0usize..1600,
        ) {
            proptest::prop_assert_eq!(fold(add(sum, &data)), add_by_words(u64::from(sum), &data));
            // Chained over an even split, as the callers chain header and payload.
            let at = (split.min(data.len())) & !1;
            let chained = add(add(sum, &data[..at]), &data[at..]);
            proptest::prop_assert_eq!(fold(chained), add_by_words(u64::from(sum), &data));
        }

        /// The pseudo-header sums equal the sum over the pseudo-header laid out as RFC 768
        /// (IPv4) and RFC 8200 §8.1 (IPv6) draw it.
        #[test]
        fn pseudo_sums_match_the_laid_out_pseudo_headers(
            v4 in proptest::prelude::any::<[u8; 8]>(),
            v6 in proptest::prelude::any::<[u8; 32]>(),
            proto: u8, len16: u16, len32: u32,
        ) {
            let (s4, d4) = ([v4[0], v4[1], v4[2], v4[3]], [v4[4], v4[5], v4[6], v4[7]]);
            let mut h4 = Vec::from(v4);
            h4.extend_from_slice(&[0, proto]);
            h4.extend_from_slice(&len16.to_be_bytes());
            proptest::prop_assert_eq!(ipv4_pseudo(s4, d4, proto, len16), add_by_words(0, &h4));
            let mut s6 = [0u8; 16];
            let mut d6 = [0u8; 16];
            s6.copy_from_slice(&v6[..16]);
            d6.copy_from_slice(&v6[16..]);
            let mut h6 = Vec::from(v6);
            h6.extend_from_slice(&len32.to_be_bytes());
            h6.extend_from_slice(&[0, 0, 0, proto]);
            proptest::prop_assert_eq!(ipv6_pseudo(s6, d6, proto, len32), add_by_words(0, &h6));
        }

        #[test]
        fn all_ones_data_never_folds_to_zero(n in 1usize..200) {
            // 0xffff words: the one's-complement sum is 0xffff ("negative zero"), never 0.
            proptest::prop_assert_eq!(fold(add(0, &vec![0xff; 2 * n])), 0xffff);
        }

        /// Any bytes, any request: no panic.
        #[test]
        fn apply_tx_never_panics(
            mut frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
            ipv4: bool, tcp: bool, udp: bool,
        ) {
            apply_tx(&mut frame, TxCsum { ipv4, tcp, udp });
        }
    }
}
