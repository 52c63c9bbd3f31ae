//! Frames, devargs and capture files: the parsers of bytes that come from outside.

use crate::input::Input;
use pmd::net::{csum, parse, toeplitz, tso};
use pmd::port::PortSpec;

/// A frame from the wire through every parser a device model, the wires and the apps run on
/// received bytes: classification and the RSS input, the IP header parser, the Toeplitz hash,
/// the TX checksum completion and TSO segmentation. Invariants: nothing panics; the checksum
/// completion keeps the frame's length; TSO's segments carry the whole payload in order, each
/// at most the headers and one MSS.
pub fn net_parse(data: &[u8]) {
    let mut input = Input::new(data);
    let ctl: [u8; 6] = input.array();
    let frame = input.rest();
    let c = parse::classify(frame);
    let (bytes, n) = c.rss_input(frame);
    let key = pmd::ethdev::RssConfig::default().key;
    let table = toeplitz::Table::new(&key);
    assert_eq!(
        table.hash(&bytes[..n]),
        toeplitz::hash(&key, &bytes[..n]),
        "the table and the bitwise Toeplitz hash agree"
    );
    if let Some((at, et)) = parse::l3_start(frame) {
        if let Some(ip) = parse::IpHeader::parse(frame, at, et) {
            let _ = ip.addresses(frame);
        }
    }
    let req = csum::TxCsum {
        ipv4: ctl[0] & 1 != 0,
        tcp: ctl[0] & 2 != 0,
        udp: ctl[0] & 4 != 0,
    };
    let mut copy = frame.to_vec();
    csum::apply_tx(&mut copy, req);
    assert_eq!(copy.len(), frame.len());
    let mut copy = frame.to_vec();
    csum::apply_tx_full(&mut copy, req);
    assert_eq!(copy.len(), frame.len());

    let t = tso::Tso {
        header_bytes: usize::from(ctl[1]),
        l4_start: usize::from(ctl[2]),
        mss: usize::from(u16::from_le_bytes([ctl[3], ctl[4]])),
    };
    let headroom = usize::from(ctl[5] & 7);
    let mut buf = Vec::new();
    let mut payload = Vec::new();
    let mut segments = 0;
    let r = tso::segment(frame, &t, headroom, &mut buf, |seg| {
        segments += 1;
        assert!(
            seg.len() >= headroom + t.header_bytes,
            "a segment holds the headers"
        );
        let body = &seg[headroom + t.header_bytes..];
        assert!(body.len() <= t.mss, "a segment carries at most one MSS");
        payload.extend_from_slice(body);
    });
    if let Ok(n) = r {
        assert_eq!(n, segments);
        assert_eq!(
            payload,
            frame[t.header_bytes..],
            "the payload, whole and in order"
        );
    }
}

/// A devargs string (`--port`), as every tool parses it. Invariants: nothing panics; a spec
/// that parses prints as a string that parses to the same spec.
pub fn devargs(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = s.parse::<PortSpec>() {
        let printed = spec.to_string();
        let again: PortSpec = printed
            .parse()
            .unwrap_or_else(|e| panic!("{s:?} parsed, printed as {printed:?}, which fails: {e}"));
        assert_eq!(again, spec, "{s:?} printed as {printed:?}");
    }
}

/// A capture file for pktgen's `--pcap` (classic pcap or pcapng). Invariants: nothing panics;
/// a capture that loads has frames, each of at least an Ethernet header and at most the
/// limit, and one timestamp per frame, never decreasing.
pub fn pcap_file(data: &[u8]) {
    const MAX: usize = 9018;
    if let Ok(c) = apps::pktgen::parse_pcap("fuzz.pcap", data, MAX) {
        assert!(!c.frames.is_empty());
        assert_eq!(c.frames.len(), c.times_ns.len());
        assert!(c.frames.iter().all(|f| (14..=MAX).contains(&f.len())));
        assert!(c.times_ns.windows(2).all(|w| w[0] <= w[1]));
    }
}
