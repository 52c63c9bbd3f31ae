//! pktgen's building blocks, by role: [`frames`] (address and port ranges, frame templates
//! with sequence/timestamp stamps), [`pcap`] (frames replayed from a capture), [`pacing`]
//! (when the next burst may go), [`seq`] (the receive-side sequence tracker); here the frame
//! sizes they share.
#![deny(unsafe_code)]

pub mod frames;
pub mod pacing;
pub mod pcap;
pub mod seq;

pub use frames::*;
pub use pacing::*;
pub use pcap::*;
pub use seq::*;

/// Bytes of the stamp at the start of the UDP payload: sequence number (u64, big-endian) and
/// TX timestamp in ns on the sender's monotonic clock (u64, big-endian).
pub const STAMP_BYTES: usize = 16;
/// Ethernet + IPv4 + UDP headers.
pub const HEADERS: usize = 14 + 20 + 8;
/// Smallest frame: headers and stamp, padded to Ethernet's 60-byte minimum (without FCS).
pub const MIN_SIZE: u16 = 60;
/// Bytes of the Ethernet frame check sequence, which the NIC appends: not in `--size`.
pub const FCS_BYTES: u64 = 4;
/// Bytes each frame takes on the wire besides itself and its FCS: preamble (7), start of
/// frame delimiter (1) and the minimum inter-frame gap (12).
pub const L1_OVERHEAD_BYTES: u64 = 20;

/// The frame sizes of `--imix`, without FCS, and how many of each in a cycle of 12: the
/// classic "simple IMIX" 7:4:1 of 64, 594 and 1518-byte frames counted with their FCS (IP
/// packets of 40 (padded to 46), 576 and 1500 bytes).
pub const IMIX: [(u16, u32); 3] = [(60, 7), (590, 4), (1514, 1)];

/// The order in which frames of the given sizes and weights are sent, one cycle: a smooth
/// weighted round robin (nginx's), so that `--imix` interleaves its sizes instead of
/// sending seven small frames in a row; equal weights keep the order given.
pub fn size_cycle(sizes: &[(u16, u32)]) -> Vec<u16> {
    let total: i64 = sizes.iter().map(|&(_, w)| i64::from(w)).sum();
    let mut current = vec![0i64; sizes.len()];
    let mut out = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, &(_, w)) in sizes.iter().enumerate() {
            current[i] += i64::from(w);
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(sizes[best].0);
    }
    out
}

/// `seq mod n`: which of `n` things (sizes, flows) frame `seq` takes in turn. One of them
/// (the common case) costs no division, which is asked several times per frame.
#[inline]
pub(crate) fn cycle_index(seq: u64, n: usize) -> usize {
    match n {
        1 => 0,
        n => (seq % n as u64) as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn the_longest_gap_is_found_and_late_frames_leave_it() {
        let mut t = SeqTracker::default();
        for s in (0..10).chain(12..20).chain(120..130) {
            t.record(s);
        }
        assert_eq!((t.longest_gap, t.longest_gap_first), (100, 20));
        assert_eq!(t.longest_gap_missing(), 100);
        t.record(50);
        t.record(51);
        assert_eq!((t.longest_gap, t.longest_gap_missing()), (100, 98));
        assert_eq!(t.gaps, 2 + 98);
    }

    fn spec(size: u16, flows: u32, vlan: Option<u16>) -> FrameSpec {
        FrameSpec {
            sizes: vec![size],
            flows,
            src_ip: "169.254.1.1-169.254.1.4".parse().unwrap(),
            dst_ip: "169.254.2.1".parse().unwrap(),
            src_port: "1000-1001".parse().unwrap(),
            dst_port: "9000".parse().unwrap(),
            vlan,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
        }
    }

    /// `--flows N` gives N distinct 5-tuples: with the default single values the source port
    /// varies (and the banner says so); ranges that cannot give N tuples are refused.
    #[test]
    fn flows_are_distinct_five_tuples() {
        let mut sp = spec(128, 64, None);
        sp.src_ip = "169.254.1.1".parse().unwrap();
        sp.src_port = "1024".parse().unwrap();
        // The distinct (IPv4 addresses, UDP ports) of the first `n` frames.
        let tuples = |g: &FrameGen, n: u64| -> std::collections::BTreeSet<Vec<u8>> {
            (0..n)
                .map(|i| {
                    let mut out = vec![0u8; 128];
                    g.write(i, 0, &mut out);
                    out[26..38].to_vec()
                })
                .collect()
        };
        let g = FrameGen::new(&sp).unwrap();
        assert_eq!(flows_varying(&sp).unwrap(), "source UDP port 1024-1087");
        assert_eq!(tuples(&g, 64).len(), 64);
        // 4 source IPs x 2 source ports: 8 combinations, not 64.
        let e = FrameGen::new(&spec(128, 64, None)).unwrap_err();
        assert!(e.contains("only 8 distinct 5-tuples"), "{e}");
        let g = FrameGen::new(&spec(128, 8, None)).unwrap();
        assert_eq!(tuples(&g, 8).len(), 8, "every combination once");
        assert_eq!(
            flows_varying(&spec(128, 8, None)).unwrap(),
            "source IP 169.254.1.1-169.254.1.4, source UDP port 1000-1001"
        );
        let mut sp = spec(128, 100, None);
        sp.src_ip = "169.254.1.1".parse().unwrap();
        sp.src_port = "65500".parse().unwrap();
        assert!(FrameGen::new(&sp).unwrap_err().contains("past 65535"));
    }

    #[test]
    fn frames_carry_stamps_with_valid_checksums() {
        for vlan in [None, Some(100)] {
            let g = FrameGen::new(&spec(128, 8, vlan)).unwrap();
            let mut buf = [0u8; 2048];
            for seq in [0u64, 1, 7, 0xdead_beef_1234, u64::MAX] {
                let n = g.write(seq, seq ^ 0x5555, &mut buf);
                assert_eq!(n, 128);
                assert_eq!(read_stamp(&buf[..n]), Some((seq, seq ^ 0x5555)));
                let p = etherparse::SlicedPacket::from_ethernet(&buf[..n]).unwrap();
                let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
                    panic!()
                };
                let h = ip.header().to_header();
                assert_eq!(h.header_checksum, h.calc_header_checksum());
                let Some(etherparse::TransportSlice::Udp(u)) = p.transport else {
                    panic!()
                };
                assert_eq!(
                    u.checksum(),
                    u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap(),
                    "seq {seq}"
                );
                // Flow fields walk the combinations: source port fastest, then source IP.
                let f = (seq % 8) as u32;
                assert_eq!(
                    u32::from(Ipv4Addr::from(h.source)),
                    u32::from(Ipv4Addr::new(169, 254, 1, 1)) + f / 2
                );
                assert_eq!(u.source_port(), 1000 + (f % 2) as u16);
            }
        }
    }

    /// Frames of a size list are cut from the largest template with their IP and UDP
    /// lengths and checksums right, in the cycle's order; `--imix` interleaves 7:4:1.
    #[test]
    fn size_lists_give_valid_frames_of_each_size() {
        for vlan in [None, Some(7)] {
            let mut sp = spec(128, 8, vlan);
            sp.sizes = vec![64, 1518, 128, 62];
            let g = FrameGen::new(&sp).unwrap();
            let mut buf = [0u8; 2048];
            for seq in 0..16u64 {
                let n = g.write(seq, 42, &mut buf);
                assert_eq!(n, usize::from(sp.sizes[(seq % 4) as usize]));
                assert_eq!(n, g.len_of(seq));
                let p = etherparse::SlicedPacket::from_ethernet(&buf[..n]).unwrap();
                let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
                    panic!()
                };
                let h = ip.header().to_header();
                assert_eq!(usize::from(h.total_len), n - 14 - vlan.map_or(0, |_| 4));
                assert_eq!(h.header_checksum, h.calc_header_checksum(), "seq {seq}");
                let Some(etherparse::TransportSlice::Udp(u)) = p.transport else {
                    panic!()
                };
                assert_eq!(
                    u.checksum(),
                    u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap(),
                    "seq {seq} size {n}"
                );
                assert_eq!(read_stamp(&buf[..n]), Some((seq, 42)));
            }
            assert!((g.mean_len() - 443.0).abs() < 1e-9);
        }
        let cycle = size_cycle(&IMIX);
        assert_eq!(cycle.len(), 12);
        assert_eq!(cycle.iter().filter(|&&s| s == 60).count(), 7);
        assert_eq!(cycle.iter().filter(|&&s| s == 590).count(), 4);
        assert_eq!(cycle.iter().filter(|&&s| s == 1514).count(), 1);
        assert!(
            cycle.windows(3).all(|w| w.iter().any(|&s| s != 60)),
            "small frames interleaved: {cycle:?}"
        );
        assert_eq!(size_cycle(&[(64, 1), (128, 1), (1518, 1)]), [64, 128, 1518]);
        let mut sp = spec(128, 1, None);
        sp.sizes = vec![128, 40];
        assert!(FrameGen::new(&sp).unwrap_err().contains("--size 40"));
    }

    /// A capture's timing: frames are due at their capture times over the speed, looping
    /// with a period of the span plus the mean gap; a capture without a span is refused.
    #[test]
    fn capture_pacing_follows_the_timestamps() {
        use std::time::Duration;
        let p = Pacing::capture(&[0, 1_000_000, 3_000_000], 1.0).unwrap();
        // Span 3 ms, mean gap 1.5 ms: a loop is 4.5 ms.
        let ms = |m: f64| Duration::from_secs_f64(m / 1e3);
        assert_eq!(p.due(ms(0.0)), 1);
        assert_eq!(p.due(ms(0.999)), 1);
        assert_eq!(p.due(ms(1.0)), 2);
        assert_eq!(p.due(ms(3.0)), 3);
        assert_eq!(p.due(ms(4.4)), 3);
        assert_eq!(p.due(ms(4.5)), 4);
        assert_eq!(p.due(ms(45.0)), 31);
        for k in 0..20 {
            let at = p.due_at(k);
            assert_eq!(
                p.due(at + Duration::from_nanos(10)),
                k + 1,
                "frame {k} at {at:?}"
            );
        }
        let fast = Pacing::capture(&[0, 1_000_000, 3_000_000], 10.0).unwrap();
        assert_eq!(fast.due(ms(0.45)), 4);
        assert!(fast.due_at(3).abs_diff(ms(0.45)) < Duration::from_nanos(2));
        assert!(Pacing::capture(&[0], 1.0)
            .unwrap_err()
            .contains("spans no time"));
        assert!(Pacing::capture(&[0, 0, 0], 1.0).is_err());
        assert_eq!(Pacing::Rate(1000.0).due(ms(10.0)), 11);
    }

    #[test]
    fn sizes_and_ranges_are_checked() {
        assert!(FrameGen::new(&spec(50, 1, None))
            .unwrap_err()
            .contains("at least 60 bytes"));
        assert!(FrameGen::new(&spec(60, 1, Some(5)))
            .unwrap_err()
            .contains("at least 62 bytes"));
        assert!(FrameGen::new(&spec(62, 1, Some(5))).is_ok());
        assert!("10.0.0.5-10.0.0.1"
            .parse::<IpRange>()
            .unwrap_err()
            .contains("ends before"));
        assert!("10.0.0"
            .parse::<IpRange>()
            .unwrap_err()
            .contains("not an IPv4"));
        assert!("70000".parse::<PortRange>().is_err());
        assert_eq!("10.0.0.1-10.0.0.3".parse::<IpRange>().unwrap().len, 3);
    }

    #[test]
    fn tracker_counts_gaps_duplicates_and_reordering() {
        let mut t = SeqTracker::default();
        for s in [0, 1, 2, 5, 3, 3, 6, 4] {
            t.record(s);
        }
        assert_eq!(t.unique, 7);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.reordered, 2);
        assert_eq!(t.gaps, 0, "3 and 4 arrived late, nothing lost");
        t.record(10);
        assert_eq!(t.gaps, 3);
        // A far jump clears the window.
        t.record(10 + SeqTracker::WINDOW * 2);
        assert_eq!(t.unique, 9);
    }

    /// Reordering is counted per flow: two flows on two queues interleave freely, a frame
    /// overtaken by a later frame of its own flow counts.
    #[test]
    fn reordering_is_per_flow() {
        let mut t = SeqTracker::with_flows(2);
        // Flow 0: 0 2 4 6, flow 1: 1 3 5 7, delivered a queue at a time.
        for s in [0, 2, 4, 6, 1, 3, 5, 7] {
            t.record(s);
        }
        assert_eq!((t.unique, t.reordered, t.gaps, t.duplicates), (8, 0, 0, 0));
        let mut t = SeqTracker::with_flows(2);
        for s in [0, 4, 2, 1, 3] {
            t.record(s);
        }
        assert_eq!(t.reordered, 1, "2 came after 4, both flow 0");
        // The same arrivals with one flow: every late frame counts.
        let mut t = SeqTracker::with_flows(1);
        for s in [0, 2, 4, 6, 1, 3, 5, 7] {
            t.record(s);
        }
        assert_eq!(t.reordered, 3);
    }

    #[test]
    fn pcap_errors_are_clear() {
        let d = std::env::temp_dir().join(format!("pktgen-pcap-{}", std::process::id()));
        std::fs::write(&d, b"definitely not a pcap").unwrap();
        assert!(load_pcap(&d, 2048)
            .unwrap_err()
            .contains("not a pcap or pcapng file"));
        // A valid header followed by a cut record.
        let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).unwrap();
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            std::time::Duration::ZERO,
            60,
            &[0u8; 60],
        ))
        .unwrap();
        let mut bytes = w.into_writer();
        bytes.truncate(bytes.len() - 10);
        std::fs::write(&d, &bytes).unwrap();
        let e = load_pcap(&d, 2048).unwrap_err();
        assert!(e.contains("malformed or truncated"), "{e}");
        let _ = std::fs::remove_file(&d);
    }

    fn frame(n: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| n.wrapping_add(i as u8)).collect()
    }

    /// A pcapng file (Wireshark's default) replays like a pcap one; records shorter than an
    /// Ethernet header (0 and 3 bytes) are skipped and counted, not sent.
    #[test]
    fn pcapng_is_read_and_short_records_are_skipped_and_counted() {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
        use pcap_file::pcapng::PcapNgWriter;
        use std::borrow::Cow;
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: pcap_file::DataLink::ETHERNET,
            snaplen: 0,
            options: vec![],
        })
        .unwrap();
        let lens = [60usize, 0, 3, 1514, 14];
        for (i, len) in lens.iter().enumerate() {
            let data = frame(i as u8, *len);
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: std::time::Duration::from_micros(i as u64),
                original_len: *len as u32,
                data: Cow::Owned(data),
                options: vec![],
            })
            .unwrap();
        }
        let d = std::env::temp_dir().join(format!("pktgen-pcapng-{}", std::process::id()));
        std::fs::write(&d, w.into_inner()).unwrap();
        let cap = load_pcap(&d, 2048).unwrap();
        assert_eq!(cap.skipped_short, 2);
        assert_eq!(cap.frames, vec![frame(0, 60), frame(3, 1514), frame(4, 14)]);
        // The same in a classic pcap.
        let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).unwrap();
        for (i, len) in lens.iter().enumerate() {
            let data = frame(i as u8, *len);
            w.write_packet(&pcap_file::pcap::PcapPacket::new(
                std::time::Duration::ZERO,
                *len as u32,
                &data,
            ))
            .unwrap();
        }
        std::fs::write(&d, w.into_writer()).unwrap();
        let cap2 = load_pcap(&d, 2048).unwrap();
        assert_eq!(cap2.frames, cap.frames);
        // The capture's own timing: 0, 3 and 4 µs after the first frame (the short records
        // at 1 and 2 µs were skipped); the pcap's frames all at one time.
        assert_eq!(cap.times_ns, vec![0, 3000, 4000]);
        assert_eq!(cap2.times_ns, vec![0, 0, 0]);
        // Nothing but short records: nothing to replay, said so.
        let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).unwrap();
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            std::time::Duration::ZERO,
            3,
            &[1, 2, 3],
        ))
        .unwrap();
        std::fs::write(&d, w.into_writer()).unwrap();
        let e = load_pcap(&d, 2048).unwrap_err();
        assert!(e.contains("no frames to replay (1 records shorter"), "{e}");
        let _ = std::fs::remove_file(&d);
    }
}
