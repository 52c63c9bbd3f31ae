//! The MANA datapath against the MANA device model: two `emu-mana` ports joined by an
//! in-process cable, with the model stepped deterministically.

use mempool::{Mbuf, MbufPool, MbufPoolConfig, OffloadFlags, TxOffload};
use pmd::emu::mana::{Faults, ModelHandle};
use pmd::emu::testing;
use pmd::port::{
    probe, Burst, Port, PortConfig, PortError, RxOffloads, RxQueue, TxOffloads, TxQueue,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

static CABLE: AtomicU32 = AtomicU32::new(0);

struct Pair {
    a: Port,
    b: Port,
    ma: ModelHandle,
    mb: ModelHandle,
    tx: TxQueue,
    rx: Vec<RxQueue>,
    pool: Arc<MbufPool>,
}

/// A MANA port over a device model on `wire`, and the model's handle (from the fixture).
fn model_port(id: u16, wire: &str) -> (Port, ModelHandle) {
    let (model, handle) = testing::mana(wire, id).unwrap();
    let port = probe::mana(
        id,
        format!("model {id} on {wire}"),
        Box::new(model),
        pmd::mana::Options::default(),
    );
    (port, handle)
}

fn pair(cfg_b: PortConfig, pool_size: u32) -> Pair {
    let name = format!(
        "mana-emu-test-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let pool = MbufPool::new(MbufPoolConfig::new("t", pool_size)).unwrap();
    let (mut a, ma) = model_port(0, &format!("loop:{name}"));
    let (mut b, mb) = model_port(1, &format!("loop:{name}"));
    ma.pause();
    mb.pause();
    let cfg_a = PortConfig::default()
        .with_ring_sizes(64, 64)
        .with_tx_offloads(TxOffloads::all() & b.caps().tx_offloads);
    a.configure(&cfg_a, &pool).unwrap();
    b.configure(&cfg_b, &pool).unwrap();
    let tx = a.tx_queue(0).unwrap();
    let rx = (0..cfg_b.rx_queues)
        .map(|q| b.rx_queue(q).unwrap())
        .collect();
    a.start().unwrap();
    b.start().unwrap();
    Pair {
        a,
        b,
        ma,
        mb,
        tx,
        rx,
        pool,
    }
}

fn small_cfg() -> PortConfig {
    PortConfig::default().with_ring_sizes(64, 64)
}

/// An Ethernet/IPv4/UDP frame with a sequence number in its payload.
fn udp_frame(seq: u32, src_port: u16, len: usize) -> Vec<u8> {
    let payload_len = len - 42;
    let mut payload = vec![0u8; payload_len];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([169, 254, 1, 1], [169, 254, 1, 2], 64)
        .udp(src_port, 9000);
    let mut out = Vec::with_capacity(len);
    b.write(&mut out, &payload).unwrap();
    out
}

fn mbuf_with(pool: &Arc<MbufPool>, bytes: &[u8]) -> Mbuf {
    let mut m = mempool::lcache::alloc(pool).unwrap();
    m.extend_from_slice(bytes).unwrap();
    m
}

/// Sends `n` numbered 64-byte UDP frames from port A (all taken) and lets both models run.
fn send_udp(p: &mut Pair, n: u32) {
    let mut burst = Burst::with_capacity(n as usize);
    for i in 0..n {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(i, 1, 64)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), n as usize);
    step_both(p);
}

fn step_both(p: &Pair) {
    for _ in 0..4 {
        p.ma.run_until_idle(100);
        p.mb.run_until_idle(100);
    }
}

fn drain(rx: &mut RxQueue, into: &mut Vec<Vec<u8>>) -> Vec<Mbuf> {
    let mut b = Burst::with_capacity(32);
    let mut kept = Vec::new();
    loop {
        if rx.rx_burst(&mut b) == 0 {
            break;
        }
        for m in b.drain_front(b.len()) {
            into.push(m.data().to_vec());
            kept.push(m);
        }
    }
    kept
}

#[test]
fn frames_cross_byte_exact_over_many_ring_laps() {
    let mut p = pair(small_cfg(), 1024);
    let mut got = Vec::new();
    let mut sent = Vec::new();
    // 64-entry rings, 40 laps: owner bits wrap through all 8 generations several times.
    for round in 0..80u32 {
        let mut burst = Burst::with_capacity(32);
        for i in 0..32 {
            let f = udp_frame(round * 32 + i, 1000 + i as u16, 60 + (i as usize % 7) * 100);
            sent.push(f.clone());
            burst.push(mbuf_with(&p.pool, &f)).unwrap();
        }
        assert_eq!(p.tx.tx_burst(&mut burst), 32);
        step_both(&p);
        let mut frames = Vec::new();
        let kept = drain(&mut p.rx[0], &mut frames);
        got.extend(frames);
        drop(kept);
    }
    // Every frame, byte-exact, in the order sent.
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "frames differ or arrived out of order");
    // A last empty burst reclaims the final completions.
    p.tx.tx_burst(&mut Burst::with_capacity(1));
    let sa = p.a.stats();
    let sb = p.b.stats();
    assert_eq!(sa.opackets, 80 * 32);
    assert_eq!(sb.ipackets, 80 * 32);
    assert_eq!(sa.obytes, sb.ibytes);
    assert_eq!(p.mb.stats().rx_no_wqe, 0);
    drop(p.tx);
    drop(p.rx);
    drop((p.a, p.b));
    assert_eq!(p.pool.in_use(), 0);
}

#[test]
fn in_order_delivery_and_rx_metadata() {
    let mut p = pair(
        small_cfg()
            .with_rx_offloads(RxOffloads::all() & !RxOffloads::SCATTER & !RxOffloads::TIMESTAMP),
        512,
    );
    let mut burst = Burst::with_capacity(16);
    for i in 0..16 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(i, 5000, 128)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), 16);
    step_both(&p);
    let mut b = Burst::with_capacity(32);
    assert_eq!(p.rx[0].rx_burst(&mut b), 16);
    for (i, m) in b.iter().enumerate() {
        assert_eq!(
            u32::from_be_bytes(m.data()[42..46].try_into().unwrap()),
            i as u32,
            "in order"
        );
        let fl = m.ol_flags();
        assert!(
            fl.contains(OffloadFlags::RX_IP_CKSUM_GOOD)
                && fl.contains(OffloadFlags::RX_L4_CKSUM_GOOD),
            "{fl:?}"
        );
        assert!(fl.contains(OffloadFlags::RX_RSS_HASH));
        assert_eq!(m.port(), 1);
        assert_eq!(m.len(), 128);
    }
    b.free_all(&mut p.pool.cache());
}

#[test]
fn rss_spreads_flows_by_toeplitz_and_reports_the_hash() {
    let cfg = small_cfg().with_rx_queues(4);
    let key = cfg.rss.key;
    let mut p = pair(cfg, 2048);
    let mut burst = Burst::with_capacity(64);
    for i in 0..64u16 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(u32::from(i), 10_000 + i, 80)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), 64);
    step_both(&p);
    let mut per_queue = [0usize; 4];
    let mut b = Burst::with_capacity(64);
    for (q, rx) in p.rx.iter_mut().enumerate() {
        rx.rx_burst(&mut b);
        for m in b.iter() {
            let sport = u16::from_be_bytes([m.data()[34], m.data()[35]]);
            let mut input = [0u8; 12];
            let n = pmd::net::toeplitz::ipv4_input(
                [169, 254, 1, 1],
                [169, 254, 1, 2],
                Some((sport, 9000)),
                &mut input,
            );
            let h = pmd::net::toeplitz::hash(&key, &input[..n]);
            assert_eq!(m.rss_hash(), h);
            assert_eq!(
                (h & 63) as usize % 4,
                q,
                "flow {sport} on the queue its hash selects"
            );
            per_queue[q] += 1;
        }
        b.free_all(&mut p.pool.cache());
    }
    assert_eq!(per_queue.iter().sum::<usize>(), 64);
    assert!(
        per_queue.iter().all(|&n| n > 0),
        "64 flows reach all 4 queues: {per_queue:?}"
    );
}

#[test]
fn multi_segment_tx_arrives_as_one_frame() {
    let mut p = pair(small_cfg(), 256);
    let f = udp_frame(7, 1, 300);
    let mut head = mbuf_with(&p.pool, &f[..100]);
    head.chain(mbuf_with(&p.pool, &f[100..250])).unwrap();
    head.chain(mbuf_with(&p.pool, &f[250..])).unwrap();
    assert_eq!(head.nb_segs(), 3);
    let mut burst = Burst::with_capacity(1);
    burst.push(head).unwrap();
    assert_eq!(p.tx.tx_burst(&mut burst), 1);
    step_both(&p);
    let mut b = Burst::with_capacity(4);
    assert_eq!(p.rx[0].rx_burst(&mut b), 1);
    assert_eq!(b.as_slice()[0].data(), &f[..]);
    b.free_all(&mut p.pool.cache());
    p.tx.tx_burst(&mut Burst::with_capacity(1));
    assert_eq!(p.a.stats().opackets, 1);
}

#[test]
fn tx_checksum_and_vlan_offloads_are_applied_by_the_device() {
    let mut p = pair(small_cfg().with_rx_offloads(RxOffloads::VLAN_STRIP), 256);
    let mut f = udp_frame(1, 1234, 200);
    // Spoil both checksums: the device must fill them in.
    f[24] = 0;
    f[25] = 0;
    f[40] = 0xde;
    f[41] = 0xad;
    let mut m = mbuf_with(&p.pool, &f);
    m.set_ol_flags(
        OffloadFlags::TX_IPV4
            | OffloadFlags::TX_IP_CKSUM
            | OffloadFlags::TX_UDP_CKSUM
            | OffloadFlags::TX_VLAN,
    );
    m.set_tx_offload(TxOffload {
        l2_len: 14,
        l3_len: 20,
        ..Default::default()
    });
    m.set_vlan_tci((5 << 13) | 42);
    let mut burst = Burst::with_capacity(1);
    burst.push(m).unwrap();
    assert_eq!(p.tx.tx_burst(&mut burst), 1);
    step_both(&p);
    let mut b = Burst::with_capacity(4);
    assert_eq!(p.rx[0].rx_burst(&mut b), 1);
    let m = &b.as_slice()[0];
    assert!(m
        .ol_flags()
        .contains(OffloadFlags::RX_VLAN | OffloadFlags::RX_VLAN_STRIPPED));
    assert_eq!(m.vlan_tci(), 42, "the VID (PCP is not reported)");
    let parsed = etherparse::SlicedPacket::from_ethernet(m.data()).unwrap();
    let Some(etherparse::NetSlice::Ipv4(ip)) = parsed.net else {
        panic!("not ipv4")
    };
    let hdr = ip.header().to_header();
    assert_eq!(hdr.header_checksum, hdr.calc_header_checksum());
    let Some(etherparse::TransportSlice::Udp(udp)) = parsed.transport else {
        panic!("not udp")
    };
    assert_eq!(
        udp.checksum(),
        udp.to_header()
            .calc_checksum_ipv4(&hdr, udp.payload())
            .unwrap()
    );
    assert!(m.ol_flags().contains(OffloadFlags::RX_L4_CKSUM_GOOD));
}

#[test]
fn without_vlan_strip_the_tag_is_put_back() {
    let mut p = pair(small_cfg(), 256);
    let f = udp_frame(1, 1, 100);
    let mut m = mbuf_with(&p.pool, &f);
    m.set_ol_flags(OffloadFlags::TX_VLAN);
    m.set_vlan_tci(7);
    let mut burst = Burst::with_capacity(1);
    burst.push(m).unwrap();
    p.tx.tx_burst(&mut burst);
    step_both(&p);
    let mut b = Burst::with_capacity(4);
    assert_eq!(p.rx[0].rx_burst(&mut b), 1);
    let d = b.as_slice()[0].data();
    assert_eq!(d.len(), 104);
    assert_eq!(&d[12..16], &[0x81, 0x00, 0x00, 0x07]);
    assert_eq!(&d[16..], &f[12..]);
    b.free_all(&mut p.pool.cache());
}

#[test]
fn full_ring_pushes_back_and_nothing_is_lost() {
    let mut p = pair(small_cfg(), 1024);
    let mut burst = Burst::with_capacity(100);
    for i in 0..100 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(i, 1, 64)))
            .unwrap();
    }
    // The model is paused: the 64-descriptor ring fills and the rest stay with the caller.
    assert_eq!(p.tx.tx_burst(&mut burst), 64);
    assert_eq!(burst.len(), 36);
    assert_eq!(p.tx.tx_burst(&mut burst), 0);
    step_both(&p);
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    assert_eq!(p.tx.tx_burst(&mut burst), 36);
    step_both(&p);
    drop(drain(&mut p.rx[0], &mut frames));
    assert_eq!(frames.len(), 100);
    let seqs: Vec<u32> = frames
        .iter()
        .map(|f| u32::from_be_bytes(f[42..46].try_into().unwrap()))
        .collect();
    assert_eq!(seqs, (0..100).collect::<Vec<_>>(), "all 100, in order");
}

#[test]
fn rx_pool_exhaustion_counts_nombuf_and_recovers() {
    // 64 RX descriptors on each port; the pool has just enough to fill both rings and a few.
    let mut p = pair(small_cfg(), 160);
    let mut held = Vec::new();
    let mut sent = 0;
    for round in 0..6 {
        let mut burst = Burst::with_capacity(16);
        for i in 0..16 {
            match mempool::lcache::alloc(&p.pool) {
                Some(mut m) => {
                    m.extend_from_slice(&udp_frame(round * 16 + i, 1, 64))
                        .unwrap();
                    burst.push(m).unwrap();
                }
                None => break,
            }
        }
        sent += p.tx.tx_burst(&mut burst);
        drop(burst);
        step_both(&p);
        let mut b = Burst::with_capacity(32);
        p.rx[0].rx_burst(&mut b);
        // Keep what arrives: the pool runs dry and refills fail.
        while let Some(m) = b.pop() {
            held.push(m);
        }
        p.tx.tx_burst(&mut Burst::with_capacity(1));
    }
    let s = p.b.stats();
    assert!(s.rx_nombuf > 0, "refills failed and were counted: {s:?}");
    assert!(sent > 0);
    drop(held);
    // Buffers are back: the next poll refills the ring completely...
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    assert_eq!(
        p.b.stats().imissed,
        p.mb.stats().rx_no_wqe,
        "device drops are reported"
    );
    frames.clear();
    // ... and traffic flows again: every frame of a new burst arrives, in order.
    let mut burst = Burst::with_capacity(8);
    for i in 0..8 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(1000 + i, 1, 64)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), 8);
    step_both(&p);
    let missed_before = p.mb.stats().rx_no_wqe;
    drop(drain(&mut p.rx[0], &mut frames));
    let seqs: Vec<u32> = frames
        .iter()
        .map(|f| u32::from_be_bytes(f[42..46].try_into().unwrap()))
        .collect();
    assert_eq!(seqs, (1000..1008).collect::<Vec<_>>(), "recovered");
    assert_eq!(
        p.mb.stats().rx_no_wqe,
        missed_before,
        "no drop after recovery"
    );
    drop(p.tx);
    drop(p.rx);
    drop((p.a, p.b));
    assert_eq!(p.pool.in_use(), 0, "every buffer back");
}

#[test]
fn error_completions_are_counted_not_fatal() {
    let mut p = pair(small_cfg(), 512);
    p.ma.set_faults(Faults {
        tx_error_every: 2,
        ..Default::default()
    });
    p.mb.set_faults(Faults {
        rx_error_every: 3,
        ..Default::default()
    });
    send_udp(&mut p, 12);
    p.tx.tx_burst(&mut Burst::with_capacity(1));
    let sa = p.a.stats();
    assert_eq!((sa.opackets, sa.oerrors), (6, 6));
    assert!(sa.xstats.contains(&("tx_cqe_errors".to_string(), 6)));
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    let sb = p.b.stats();
    assert_eq!((sb.ipackets, sb.ierrors), (4, 2));
    assert_eq!(frames.len(), 4);
}

/// Frames whose completions the device still holds back when their queue is destroyed are
/// lost with it and counted by the device (`rx_destroyed_drops`), those an error completion
/// was to report as well as those already in the queue's buffers: none is lost uncounted.
#[test]
fn completions_held_back_when_the_queue_goes_are_counted() {
    let mut p = pair(small_cfg(), 512);
    p.mb.set_faults(Faults {
        rx_error_every: 3,
        completion_delay_steps: 1_000_000,
        ..Default::default()
    });
    send_udp(&mut p, 12);
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    assert!(frames.is_empty(), "every completion is held back");
    let s = p.mb.stats();
    assert_eq!(
        (s.rx_frames, s.rx_truncated),
        (8, 4),
        "every third one an error"
    );
    let Pair { a, b, mb, rx, .. } = p;
    drop(rx);
    b.close();
    a.close();
    assert_eq!(mb.stats().rx_destroyed_drops, 12);
}

#[test]
fn link_down_drops_frames_and_reports_down() {
    let mut p = pair(small_cfg(), 256);
    p.ma.set_faults(Faults {
        link_down: true,
        ..Default::default()
    });
    assert!(!p.a.link().up);
    let mut burst = Burst::with_capacity(4);
    for i in 0..4 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(i, 1, 64)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), 4);
    step_both(&p);
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    assert!(frames.is_empty());
    assert_eq!(p.ma.stats().tx_wire_drops, 4);
}

#[test]
fn port_held_by_the_kernel_is_reported_with_what_to_do() {
    let pool = MbufPool::new(MbufPoolConfig::new("busy", 256)).unwrap();
    let (mut port, model) = model_port(0, "none");
    model.set_held_by(Some("eth1"));
    let e = port.configure(&small_cfg(), &pool).unwrap_err();
    assert!(matches!(e, PortError::Busy { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("kernel netdev eth1 holds it") && msg.contains("ip link set eth1 down"),
        "{msg}"
    );
    model.set_held_by(None);
    port.configure(&small_cfg(), &pool).unwrap();
}

#[test]
fn engine_thread_runs_the_cable_unattended() {
    let name = format!("mana-thread-{}", std::process::id());
    let pool = MbufPool::new(MbufPoolConfig::new("thr", 1024)).unwrap();
    let mut a = Port::open(0, &format!("emu-mana:wire=loop:{name}").parse().unwrap()).unwrap();
    let mut b = Port::open(1, &format!("emu-mana:wire=loop:{name}").parse().unwrap()).unwrap();
    a.configure(&small_cfg(), &pool).unwrap();
    b.configure(&small_cfg(), &pool).unwrap();
    let mut tx = a.tx_queue(0).unwrap();
    let mut rx = b.rx_queue(0).unwrap();
    a.start().unwrap();
    b.start().unwrap();
    let mut received = 0usize;
    let mut sent = 0usize;
    let mut b_out = Burst::with_capacity(32);
    let mut b_in = Burst::with_capacity(32);
    let t0 = std::time::Instant::now();
    // Paced: never more frames on the way than the receiver is sure to have posted (it
    // refills whenever fewer than 32 are posted, so at least 32 are, out of 64).
    while received < 10_000 && t0.elapsed() < std::time::Duration::from_secs(20) {
        let room = 32 - (sent - received);
        if sent < 10_000 && room > 0 {
            while b_out.len() < room && sent + b_out.len() < 10_000 {
                b_out
                    .push(mbuf_with(
                        &pool,
                        &udp_frame((sent + b_out.len()) as u32, 1, 64),
                    ))
                    .unwrap();
            }
            sent += tx.tx_burst(&mut b_out);
        }
        received += rx.rx_burst(&mut b_in);
        b_in.free_all(&mut pool.cache());
    }
    drop(b_out);
    assert_eq!(
        received,
        10_000,
        "paced traffic loses nothing (sent {sent}); sender {:?}; receiver {:?}",
        a.stats(),
        b.stats()
    );
    assert_eq!(b.stats().imissed, 0);
    drop((tx, rx, a, b));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn tso_splits_a_large_tcp_packet_into_valid_segments() {
    let mut p = pair(small_cfg(), 512);
    let payload: Vec<u8> = (0..5000u32).map(|i| (i * 13 % 251) as u8).collect();
    let mut pkt = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([169, 254, 1, 1], [169, 254, 1, 2], 64)
        .tcp(40000, 80, 1_000_000, 65535)
        .psh()
        .ack(7)
        .write(&mut pkt, &payload)
        .unwrap();
    // Three mbufs: headers + 1946 bytes, 2048, the rest.
    let mut head = mbuf_with(&p.pool, &pkt[..2000]);
    head.chain(mbuf_with(&p.pool, &pkt[2000..4048])).unwrap();
    head.chain(mbuf_with(&p.pool, &pkt[4048..])).unwrap();
    head.set_ol_flags(OffloadFlags::TX_IPV4 | OffloadFlags::TX_TCP_SEG);
    head.set_tx_offload(TxOffload {
        l2_len: 14,
        l3_len: 20,
        l4_len: 20,
        tso_segsz: 1000,
    });
    let mut burst = Burst::with_capacity(1);
    burst.push(head).unwrap();
    assert_eq!(p.tx.tx_burst(&mut burst), 1);
    step_both(&p);
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    assert_eq!(frames.len(), 5, "5000 bytes at MSS 1000");
    let mut joined = Vec::new();
    for (k, f) in frames.iter().enumerate() {
        let s = etherparse::SlicedPacket::from_ethernet(f).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else {
            panic!("ipv4")
        };
        let h = ip.header().to_header();
        assert_eq!(
            h.header_checksum,
            h.calc_header_checksum(),
            "segment {k} ip checksum"
        );
        assert_eq!(usize::from(h.total_len), f.len() - 14);
        let Some(etherparse::TransportSlice::Tcp(t)) = s.transport else {
            panic!("tcp")
        };
        assert_eq!(
            t.checksum(),
            t.to_header().calc_checksum_ipv4(&h, t.payload()).unwrap(),
            "segment {k} tcp checksum"
        );
        assert_eq!(t.sequence_number(), 1_000_000 + 1000 * k as u32);
        assert_eq!(t.psh(), k == 4, "PSH only on the last segment");
        assert!(t.ack());
        joined.extend_from_slice(t.payload());
    }
    assert_eq!(joined, payload);
    p.tx.tx_burst(&mut Burst::with_capacity(1));
    let s = p.a.stats();
    assert_eq!((s.opackets, s.oerrors), (1, 0));
    assert_eq!(p.ma.stats().tx_frames, 5);
}

/// Coalescing turned on by the fault knob, or by the vPort setting (the `cqe-coalesce=1`
/// devarg's), which faults set afterwards leave on.
#[test]
fn coalesced_completions_deliver_every_packet_in_order_across_small_bursts() {
    for vport in [false, true] {
        coalesced_completions(vport);
    }
}

fn coalesced_completions(vport: bool) {
    let mut p = pair(small_cfg(), 512);
    if vport {
        p.mb.set_rx_coalesce(true);
        p.mb.set_faults(Faults::default());
    } else {
        p.mb.set_faults(Faults {
            rx_coalesce: true,
            ..Default::default()
        });
    }
    let mut burst = Burst::with_capacity(10);
    for i in 0..10 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(i, 4242, 64 + i as usize)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), 10);
    step_both(&p);
    // Bursts of 3 cut into the 4-packet CQEs: the rest of a CQE waits for the next call.
    let mut got = Vec::new();
    let mut b = Burst::with_capacity(3);
    for _ in 0..10 {
        p.rx[0].rx_burst(&mut b);
        for m in b.iter() {
            got.push((
                u32::from_be_bytes(m.data()[42..46].try_into().unwrap()),
                m.len(),
                m.rss_hash(),
            ));
        }
        b.free_all(&mut p.pool.cache());
    }
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    assert!(got.iter().enumerate().all(|(i, g)| g.1 == 64 + i));
    assert!(got.iter().all(|g| g.2 == got[0].2), "one flow, one hash");
    let s = p.b.stats();
    assert_eq!((s.ipackets, s.ierrors), (10, 0));
    assert_eq!(p.mb.stats().rx_cqes, 3, "10 packets in CQEs of 4, 4 and 2");
}

#[test]
fn mtu_is_enforced_by_the_device_and_promiscuous_mode_is_refused() {
    let mut cfg = small_cfg();
    cfg.mtu = 1000;
    let name = format!("mana-mtu-{}", std::process::id());
    let pool = MbufPool::new(MbufPoolConfig::new("mtu", 512)).unwrap();
    let (mut a, ma) = model_port(0, &format!("loop:{name}"));
    let (mut b, mb) = model_port(1, &format!("loop:{name}"));
    ma.pause();
    mb.pause();
    // MANA has no promiscuous mode: asking for it is a clear configuration error.
    let e = a
        .configure(&cfg.clone().with_promiscuous(true), &pool)
        .unwrap_err();
    assert!(
        matches!(
            e,
            PortError::BadConfig {
                what: "promiscuous mode",
                ..
            }
        ),
        "{e}"
    );
    assert!(!a.caps().promiscuous);
    a.configure(&cfg, &pool).unwrap();
    b.configure(&small_cfg(), &pool).unwrap();
    let mut tx = a.tx_queue(0).unwrap();
    let mut rx = b.rx_queue(0).unwrap();
    a.start().unwrap();
    b.start().unwrap();
    // 14 + 1000 bytes fit the MTU of 1000; 14 + 1001 do not.
    let mut burst = Burst::with_capacity(2);
    burst
        .push(mbuf_with(&pool, &udp_frame(0, 1, 1014)))
        .unwrap();
    burst
        .push(mbuf_with(&pool, &udp_frame(1, 1, 1015)))
        .unwrap();
    assert_eq!(tx.tx_burst(&mut burst), 2);
    for _ in 0..4 {
        ma.run_until_idle(100);
        mb.run_until_idle(100);
    }
    tx.tx_burst(&mut Burst::with_capacity(1));
    let mut frames = Vec::new();
    drop(drain(&mut rx, &mut frames));
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].len(), 1014);
    let s = a.stats();
    assert_eq!((s.opackets, s.oerrors), (1, 1));
    assert!(
        s.xstats.contains(&("dev_tx_mtu_errors".to_string(), 1)),
        "{s:?}"
    );
    drop((tx, rx, a, b));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn the_model_exposes_the_raw_queues_it_handed_out() {
    let (mut port, model) = model_port(3, "none");
    let pool = MbufPool::new(MbufPoolConfig::new("raw", 512)).unwrap();
    port.configure(&small_cfg().with_rx_queues(2), &pool)
        .unwrap();
    let (txq, rxq) = (model.tx_queues(), model.rx_queues());
    assert_eq!((txq.len(), rxq.len()), (1, 2));
    assert_eq!(txq[0].tx_vp_offset, 3);
    assert_ne!(rxq[0].rq_id, rxq[1].rq_id);
    assert_eq!(txq[0].db_page.len(), 4096);
    // One doorbell page for the port's queues, as rdma-core maps one per context; each
    // queue has a monitor of its own writes (the model's view of every doorbell).
    assert!(Arc::ptr_eq(&txq[0].db_page, &rxq[0].db_page));
    assert!(Arc::ptr_eq(&rxq[0].db_page, &rxq[1].db_page));
    let monitors: Vec<_> = txq
        .iter()
        .map(|q| q.db_monitor.clone())
        .chain(rxq.iter().map(|q| q.db_monitor.clone()))
        .map(|m| m.expect("a monitor per queue"))
        .collect();
    assert!(!Arc::ptr_eq(&monitors[0], &monitors[1]) && !Arc::ptr_eq(&monitors[1], &monitors[2]));
    assert!(!model.memory_regions().is_empty());
    drop(port);
    assert!(model.tx_queues().is_empty(), "destroyed with the port");
}

/// The device model's counter `name` of port `p`.
fn dev_stat(p: &Port, name: &str) -> u64 {
    p.stats()
        .xstats
        .iter()
        .find(|(k, _)| k == name)
        .map_or_else(|| panic!("no xstat {name}"), |(_, v)| *v)
}

/// TX suppresses the completion of every WQE of a burst but the last (DPDK's rule, §8.2): a
/// burst of 32 costs the device one CQE, and that CQE frees all 32 packets.
#[test]
fn a_tx_burst_asks_for_one_completion() {
    let mut p = pair(small_cfg(), 512);
    let mut burst = Burst::with_capacity(32);
    for i in 0..32 {
        burst
            .push(mbuf_with(&p.pool, &udp_frame(i, 1, 64)))
            .unwrap();
    }
    assert_eq!(p.tx.tx_burst(&mut burst), 32);
    step_both(&p);
    assert_eq!(
        p.a.stats().opackets,
        0,
        "nothing reclaimed before the next burst"
    );
    p.tx.tx_burst(&mut Burst::with_capacity(1));
    assert_eq!(dev_stat(&p.a, "dev_tx_cqes"), 1);
    assert_eq!(p.a.stats().opackets, 32);
    let mut frames = Vec::new();
    drop(drain(&mut p.rx[0], &mut frames));
    assert_eq!(frames.len(), 32);
}

/// Failed WQEs get an error CQE even when suppressed; the queue finds each one's descriptor
/// by the CQE's WQE offset. Over bursts of every size from 1 to 40 with every 7th WQE
/// failing, the queue never stalls, every packet is counted once (sent or error, exactly as
/// the device did it) and the pool ends whole.
#[test]
fn suppressed_runs_with_failures_add_up_and_never_stall() {
    let mut p = pair(small_cfg(), 1024);
    p.ma.set_faults(Faults {
        tx_error_every: 7,
        ..Default::default()
    });
    let (mut offered, mut frames) = (0u64, Vec::new());
    for round in 0..60u64 {
        let n = 1 + (round * 13) % 40;
        let mut burst = Burst::with_capacity(n as usize);
        for i in 0..n {
            burst
                .push(mbuf_with(&p.pool, &udp_frame((offered + i) as u32, 1, 64)))
                .unwrap();
        }
        offered += n;
        for tries in 0.. {
            assert!(tries < 50, "stalled in round {round}: {:?}", p.a.stats());
            p.tx.tx_burst(&mut burst);
            step_both(&p);
            drop(drain(&mut p.rx[0], &mut frames));
            if burst.is_empty() {
                break;
            }
        }
    }
    // The last burst's CQE comes: everything is accounted.
    p.tx.tx_burst(&mut Burst::with_capacity(1));
    let s = p.a.stats();
    let failed = dev_stat(&p.a, "dev_tx_errors");
    assert!(failed > 0);
    assert_eq!((s.opackets, s.oerrors), (offered - failed, failed));
    assert_eq!(frames.len() as u64, offered - failed);
    let pool = std::sync::Arc::clone(&p.pool);
    drop(p);
    assert_eq!(pool.in_use(), 0);
}
