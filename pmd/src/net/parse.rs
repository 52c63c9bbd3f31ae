//! Finding and reading Ethernet, IPv4/IPv6, TCP and UDP headers: what a NIC's parser looks at
//! (checksum verdicts, the RSS hash input) and where its TX offloads write.
//!
//! Everything here reads untrusted bytes and never panics: a frame that is too short or not
//! what its headers claim is simply "other" (`None`, [`L3::Other`], [`L4::Other`]). Lengths
//! taken from length fields are clamped to the bytes actually present.
#![deny(unsafe_code)]

use super::csum;

/// Bytes of an Ethernet header without a VLAN tag.
pub const ETH_HEADER_BYTES: usize = 14;
/// Bytes of an 802.1Q tag.
pub const VLAN_TAG_BYTES: usize = 4;
/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype (TPID) of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// Bytes of an IPv4 header without options.
pub const IPV4_MIN_HEADER_BYTES: usize = 20;
/// Bytes of the IPv6 fixed header.
pub const IPV6_HEADER_BYTES: usize = 40;
/// Bytes of a TCP header without options.
pub const TCP_MIN_HEADER_BYTES: usize = 20;
/// Bytes of a UDP header.
pub const UDP_HEADER_BYTES: usize = 8;
/// Offset of the checksum field in a TCP header.
pub const TCP_CSUM_OFFSET: usize = 16;
/// Offset of the checksum field in a UDP header.
pub const UDP_CSUM_OFFSET: usize = 6;
/// Longest RSS hash input: IPv6 source and destination addresses, then the two ports.
pub const RSS_INPUT_MAX_BYTES: usize = 36;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Where the L3 header starts and the ethertype that announces it, looking through one
/// 802.1Q tag; `None` if the frame is shorter than its Ethernet header.
pub fn l3_start(frame: &[u8]) -> Option<(usize, u16)> {
    let et = be16(frame, 12)?;
    if et == ETHERTYPE_VLAN {
        let inner = ETH_HEADER_BYTES + VLAN_TAG_BYTES;
        return Some((inner, be16(frame, inner - 2)?));
    }
    Some((ETH_HEADER_BYTES, et))
}

/// IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpVersion {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// An IPv4 or IPv6 header inside a frame, as byte offsets into the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    /// IPv4 or IPv6.
    pub version: IpVersion,
    /// Offset of the IP header.
    pub start: usize,
    /// Offset of the L4 header: after the IPv4 options, or after the IPv6 fixed header
    /// (extension headers are not walked).
    pub l4_start: usize,
    /// End of the IP packet: where its length field says, clamped to the frame and to no
    /// less than `l4_start`.
    pub l4_end: usize,
    /// IPv4 protocol or IPv6 next header.
    pub proto: u8,
    /// IPv4 only: the more-fragments flag or a non-zero fragment offset.
    pub fragment: bool,
}

impl IpHeader {
    /// Finds the IP header at `start` that `ethertype` announces. `None` for another
    /// ethertype, a version nibble that disagrees with it, a header that does not fit in the
    /// frame, or an IPv4 IHL below 5.
    #[inline]
    pub fn parse(frame: &[u8], start: usize, ethertype: u16) -> Option<Self> {
        let ip = frame.get(start..)?;
        let first = *ip.first()?;
        match ethertype {
            ETHERTYPE_IPV4 if ip.len() >= IPV4_MIN_HEADER_BYTES && first >> 4 == 4 => {
                let ihl = usize::from(first & 0xf) * 4;
                if ihl < IPV4_MIN_HEADER_BYTES || ip.len() < ihl {
                    return None;
                }
                let total = usize::from(be16(ip, 2)?).clamp(ihl, ip.len());
                Some(Self {
                    version: IpVersion::V4,
                    start,
                    l4_start: start + ihl,
                    l4_end: start + total,
                    proto: ip[9],
                    fragment: be16(ip, 6)? & 0x3fff != 0,
                })
            }
            ETHERTYPE_IPV6 if ip.len() >= IPV6_HEADER_BYTES && first >> 4 == 6 => {
                let payload = usize::from(be16(ip, 4)?);
                Some(Self {
                    version: IpVersion::V6,
                    start,
                    l4_start: start + IPV6_HEADER_BYTES,
                    l4_end: start + (IPV6_HEADER_BYTES + payload).min(ip.len()),
                    proto: ip[6],
                    fragment: false,
                })
            }
            _ => None,
        }
    }

    /// Source then destination address, as the RSS hash input and pseudo-header take them.
    pub fn addresses<'a>(&self, frame: &'a [u8]) -> &'a [u8] {
        let (at, len) = match self.version {
            IpVersion::V4 => (12, 8),
            IpVersion::V6 => (8, 32),
        };
        &frame[self.start + at..self.start + at + len]
    }

    /// The pseudo-header sum for an L4 header of `proto` and `l4_len` bytes (see
    /// [`pseudo_sum`]).
    pub fn pseudo_sum(&self, frame: &[u8], proto: u8, l4_len: usize) -> u16 {
        pseudo_sum(frame, self.start, self.version, proto, l4_len)
    }
}

/// The pseudo-header sum (folded, not complemented) of the IP header at `ip_start`, for an L4
/// header of `proto` and `l4_len` bytes: [`csum::ipv4_pseudo`] or [`csum::ipv6_pseudo`].
///
/// # Panics
/// If the frame is shorter than the IP header's fixed part.
pub fn pseudo_sum(
    frame: &[u8],
    ip_start: usize,
    version: IpVersion,
    proto: u8,
    l4_len: usize,
) -> u16 {
    let ip = &frame[ip_start..];
    match version {
        IpVersion::V4 => {
            let addr = |at: usize| [ip[at], ip[at + 1], ip[at + 2], ip[at + 3]];
            csum::ipv4_pseudo(addr(12), addr(16), proto, l4_len as u16)
        }
        IpVersion::V6 => {
            let addr = |at: usize| -> [u8; 16] {
                let mut a = [0u8; 16];
                a.copy_from_slice(&ip[at..at + 16]);
                a
            };
            csum::ipv6_pseudo(addr(8), addr(24), proto, l4_len as u32)
        }
    }
}

/// What a NIC's RX parser makes of the network layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    /// Not IPv4 or IPv6, or a header that does not parse.
    Other,
    /// IPv4, with the header checksum verdict.
    Ipv4 {
        /// The header checksum is right.
        csum_ok: bool,
    },
    /// IPv6 (no header checksum).
    Ipv6,
}

/// What a NIC's RX parser makes of the transport layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// Not TCP or UDP, a fragment, or a header cut short.
    Other,
    /// TCP, with the checksum verdict.
    Tcp {
        /// The checksum is right.
        csum_ok: bool,
    },
    /// UDP, with the checksum verdict.
    Udp {
        /// The checksum is right; `None` for a zero checksum over IPv4 ("no checksum").
        csum_ok: Option<bool>,
    },
}

/// A received frame as a NIC's parser classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    /// The network layer.
    pub l3: L3,
    /// The transport layer.
    pub l4: L4,
    /// Where the addresses are in the frame, and how many bytes (0: none).
    addrs_at: u16,
    addrs_len: u16,
    /// Where the ports are (source then destination), when L4 is TCP or UDP.
    ports_at: Option<u16>,
}

impl Classified {
    /// The RSS hash input in NDIS order, in two parts of the classified `frame` (no copy):
    /// source and destination address; then source and destination port for TCP and UDP
    /// (else empty). Both empty for [`L3::Other`].
    #[inline]
    pub fn rss_parts<'a>(&self, frame: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        let a = usize::from(self.addrs_at);
        let addrs = &frame[a..a + usize::from(self.addrs_len)];
        let ports = match self.ports_at {
            Some(p) => &frame[usize::from(p)..usize::from(p) + 4],
            None => &[],
        };
        (addrs, ports)
    }

    /// The RSS hash input in NDIS order, copied out of the classified `frame`: the two
    /// [`rss_parts`](Self::rss_parts) one after the other.
    pub fn rss_input(&self, frame: &[u8]) -> ([u8; RSS_INPUT_MAX_BYTES], usize) {
        let (a, p) = self.rss_parts(frame);
        let mut out = [0u8; RSS_INPUT_MAX_BYTES];
        out[..a.len()].copy_from_slice(a);
        out[a.len()..a.len() + p.len()].copy_from_slice(p);
        (out, a.len() + p.len())
    }
}

/// Classifies a received frame: L3 and L4 protocol, the checksum verdicts, and the RSS hash
/// input. `frame` starts with an untagged Ethernet header, as a device sees it after
/// stripping the 802.1Q tag; a tag still present makes the frame [`L3::Other`]. IPv4
/// fragments are classified at L3 only.
// Inline always: a `Classified` returned through memory is read back right after its
// bytes were written one field at a time, and waits for those stores (a device model
// classifies every frame it receives).
#[inline(always)]
pub fn classify(frame: &[u8]) -> Classified {
    let mut out = Classified {
        l3: L3::Other,
        l4: L4::Other,
        addrs_at: 0,
        addrs_len: 0,
        ports_at: None,
    };
    let Some(et) = be16(frame, 12) else {
        return out;
    };
    let Some(ip) = IpHeader::parse(frame, ETH_HEADER_BYTES, et) else {
        return out;
    };
    out.l3 = match ip.version {
        IpVersion::V4 => L3::Ipv4 {
            csum_ok: csum::checksum(&frame[ip.start..ip.l4_start]) == 0,
        },
        IpVersion::V6 => L3::Ipv6,
    };
    let addrs = ip.addresses(frame);
    out.addrs_at = (addrs.as_ptr() as usize - frame.as_ptr() as usize) as u16;
    out.addrs_len = addrs.len() as u16;
    let l4 = &frame[ip.l4_start..ip.l4_end];
    let l4_csum_ok = || {
        let pseudo = ip.pseudo_sum(frame, ip.proto, l4.len());
        csum::fold(csum::add(u32::from(pseudo), l4)) == 0xffff
    };
    out.l4 = match ip.proto {
        _ if ip.fragment => L4::Other,
        IPPROTO_TCP if l4.len() >= TCP_MIN_HEADER_BYTES => L4::Tcp {
            csum_ok: l4_csum_ok(),
        },
        IPPROTO_UDP if l4.len() >= UDP_HEADER_BYTES => {
            let none = ip.version == IpVersion::V4 && l4[UDP_CSUM_OFFSET..][..2] == [0, 0];
            L4::Udp {
                csum_ok: (!none).then(l4_csum_ok),
            }
        }
        _ => L4::Other,
    };
    if out.l4 != L4::Other {
        out.ports_at = Some(ip.l4_start as u16);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use proptest::prelude::*;

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn input(c: &Classified, frame: &[u8]) -> Vec<u8> {
        let (b, n) = c.rss_input(frame);
        b[..n].to_vec()
    }
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn udp4(payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(MAC_A, MAC_B)
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(1000, 2000);
        let mut f = Vec::new();
        b.write(&mut f, payload).unwrap();
        f
    }

    fn tcp6(payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(MAC_A, MAC_B)
            .ipv6([0xfe; 16], [0xfd; 16], 64)
            .tcp(40000, 80, 7, 1024);
        let mut f = Vec::new();
        b.write(&mut f, payload).unwrap();
        f
    }

    #[test]
    fn udp_over_ipv4_with_good_checksums() {
        let f = udp4(b"hello");
        let c = classify(&f);
        assert_eq!(c.l3, L3::Ipv4 { csum_ok: true });
        assert_eq!(
            c.l4,
            L4::Udp {
                csum_ok: Some(true)
            }
        );
        assert_eq!(
            input(&c, &f),
            &[10, 0, 0, 1, 10, 0, 0, 2, 0x03, 0xe8, 0x07, 0xd0]
        );
    }

    #[test]
    fn tcp_over_ipv6_and_a_corrupted_payload() {
        let mut f = tcp6(b"some payload");
        let c = classify(&f);
        assert_eq!((c.l3, c.l4), (L3::Ipv6, L4::Tcp { csum_ok: true }));
        assert_eq!(input(&c, &f).len(), 36);
        assert_eq!(&input(&c, &f)[32..], &[0x9c, 0x40, 0, 80]);
        let last = f.len() - 1;
        f[last] ^= 0x40;
        assert_eq!(classify(&f).l4, L4::Tcp { csum_ok: false });
    }

    #[test]
    fn bad_ipv4_header_checksum_is_reported() {
        let mut f = udp4(b"x");
        f[14 + 10] ^= 1;
        assert_eq!(classify(&f).l3, L3::Ipv4 { csum_ok: false });
    }

    #[test]
    fn zero_udp_checksum_over_ipv4_is_no_checksum() {
        let mut f = udp4(b"abc");
        f[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
        assert_eq!(classify(&f).l4, L4::Udp { csum_ok: None });
    }

    #[test]
    fn fragments_and_short_l4_headers_hash_on_addresses_only() {
        let mut f = udp4(b"abcdefgh");
        f[14 + 6] = 0x20; // more fragments
        f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
        let c = csum::checksum(&f[14..34]);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        let c = classify(&f);
        assert_eq!((c.l3, c.l4), (L3::Ipv4 { csum_ok: true }, L4::Other));
        assert_eq!(input(&c, &f).len(), 8);

        // A TCP header cut to 10 bytes by the IP total length.
        let mut f = tcp6(b"");
        f[14 + 4..14 + 6].copy_from_slice(&10u16.to_be_bytes());
        let c = classify(&f);
        assert_eq!((c.l3, c.l4), (L3::Ipv6, L4::Other));
        assert_eq!(input(&c, &f).len(), 32);
    }

    #[test]
    fn other_ethertypes_tags_and_runts_are_other() {
        let mut arp = udp4(b"");
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let mut tagged = udp4(b"");
        tagged[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        let mut bad_ihl = udp4(b"");
        bad_ihl[14] = 0x44;
        for f in [&arp[..], &tagged[..], &bad_ihl[..], &[0u8; 13][..], &[]] {
            let c = classify(f);
            assert_eq!((c.l3, c.l4, input(&c, f)), (L3::Other, L4::Other, vec![]));
        }
    }

    #[test]
    fn l3_start_looks_through_one_tag() {
        let mut f = vec![0u8; 18];
        f[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        f[16..18].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        assert_eq!(l3_start(&f), Some((18, ETHERTYPE_IPV6)));
        assert_eq!(l3_start(&f[..17]), None);
        assert_eq!(l3_start(&udp4(b"")), Some((14, ETHERTYPE_IPV4)));
    }

    #[test]
    fn ip_length_fields_are_clamped_to_the_frame() {
        let mut f = udp4(b"12345678");
        f[14 + 2..14 + 4].copy_from_slice(&9000u16.to_be_bytes());
        let ip = IpHeader::parse(&f, 14, ETHERTYPE_IPV4).unwrap();
        assert_eq!((ip.l4_start, ip.l4_end), (34, f.len()));
        f[14 + 2..14 + 4].copy_from_slice(&4u16.to_be_bytes());
        let ip = IpHeader::parse(&f, 14, ETHERTYPE_IPV4).unwrap();
        assert_eq!(ip.l4_end, ip.l4_start);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any bytes at all: classifying never panics.
        #[test]
        fn classify_never_panics(frame in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = classify(&frame);
        }

        /// Valid headers with any length fields: no panic either.
        #[test]
        fn classify_survives_lying_length_fields(total in any::<u16>(), plen in any::<u16>(), cut in 0usize..80) {
            let mut v4 = udp4(&[7; 24]);
            v4[16..18].copy_from_slice(&total.to_be_bytes());
            v4.truncate(v4.len().saturating_sub(cut));
            let _ = classify(&v4);
            let mut v6 = tcp6(&[7; 24]);
            v6[18..20].copy_from_slice(&plen.to_be_bytes());
            v6.truncate(v6.len().saturating_sub(cut));
            let _ = classify(&v6);
        }
    }
}
