//! Two `emu-mlx5` ports joined by an in-process cable: the mlx5 driver (TX and RX queues)
//! over the mlx5 device model, through the port API an application uses. Every frame arrives
//! once, in order, byte for byte, over many laps of the rings, and every buffer comes back;
//! with cyclic RQs and with multi-packet (striding) RQs, with and without compressed CQEs.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::ethdev::{Burst, Stats};
use pmd::port::{Port, PortConfig, RxQueue, TxQueue};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static CABLE: AtomicU32 = AtomicU32::new(0);

fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental EtherType
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (seq as usize + i) as u8;
    }
    f
}

/// The sizes the frames cycle through: 60 to 1459 bytes.
fn size(seq: u32) -> usize {
    60 + (seq % 1400) as usize
}

struct Pair {
    _p0: Port,
    p1: Port,
    tx0: TxQueue,
    rx1: RxQueue,
    // The other directions' queues, kept until the end.
    _rest: (RxQueue, TxQueue),
}

/// Port 0 (`emu-mlx5:wire=loop:NAME`) sends to port 1 (`...,` + `rx_args`), both started,
/// with their devargs' default engine (inline).
fn pair(pool: &Arc<MbufPool>, rx_args: &str, ring: u16) -> Pair {
    pair_on(pool, rx_args, ring, "")
}

/// [`pair`] with `engine` (`,engine=thread`, ...) on both ports.
fn pair_on(pool: &Arc<MbufPool>, rx_args: &str, ring: u16, engine: &str) -> Pair {
    let name = format!(
        "mlx5-port-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let cfg = PortConfig::default().with_ring_sizes(ring, 256);
    let s0 = format!("emu-mlx5:wire=loop:{name}{engine}")
        .parse()
        .unwrap();
    let s1 = format!("emu-mlx5:wire=loop:{name}{rx_args}{engine}")
        .parse()
        .unwrap();
    let (p0, rx0, tx0) = Port::open_started(0, &s0, &cfg, pool).unwrap();
    let (p1, rx1, tx1) = Port::open_started(1, &s1, &cfg, pool).unwrap();
    assert!(p0.link().up && p1.link().up, "both ends attached");
    Pair {
        _p0: p0,
        p1,
        tx0,
        rx1,
        _rest: (rx0, tx1),
    }
}

/// Sends up to `n` (at most 16) frames numbered from `*seq` on; moves `*seq` past those sent.
fn send(tx: &mut TxQueue, pool: &Arc<MbufPool>, seq: &mut u32, n: u32) {
    let mut b = Burst::with_capacity(16);
    while b.spare() > 0 && (b.len() as u32) < n {
        let s = *seq + b.len() as u32;
        let mut m = mempool::lcache::alloc(pool).unwrap();
        m.extend_from_slice(&frame(s, size(s))).unwrap();
        b.push(m).unwrap();
    }
    *seq += tx.tx_burst(&mut b) as u32;
}

/// Sends `n` frames through `p`, at most `window` in flight, and checks each arrives once, in
/// order, byte for byte.
fn cross(p: &mut Pair, pool: &Arc<MbufPool>, n: u32, window: u32) {
    let (mut sent, mut got) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < n && Instant::now() < deadline {
        if sent < n && sent - got < window {
            let k = (n - sent).min(window - (sent - got));
            send(&mut p.tx0, pool, &mut sent, k);
        }
        let mut b = Burst::with_capacity(32);
        p.rx1.rx_burst(&mut b);
        for m in b.drain_front(b.len()) {
            let want = frame(got, size(got));
            let imissed = p.p1.stats().imissed;
            assert_eq!(m.data(), &want[..], "frame {got} ({imissed} dropped)");
            got += 1;
        }
    }
    assert_eq!(got, n, "sent {sent}");
}

fn xstat(s: &Stats, name: &str) -> u64 {
    s.xstats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no xstat {name} in {:?}", s.xstats))
        .1
}

fn finish(p: Pair, pool: &Arc<MbufPool>) {
    drop(p);
    assert_eq!(pool.in_use(), 0);
    assert_eq!(pool.available(), pool.capacity());
}

#[test]
fn frames_cross_an_emu_mlx5_cable_in_order_byte_for_byte() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port", 4096)).unwrap();
    let mut p = pair(&pool, "", 256);
    cross(&mut p, &pool, 5000, 128);
    let s = p.p1.stats();
    assert_eq!((s.ipackets, s.ierrors, s.imissed), (5000, 0, 0));
    assert_eq!(xstat(&s, "rx_mprq_wqes_retired"), 0, "cyclic RQs");
    finish(p, &pool);
}

#[test]
fn frames_cross_with_cqe_compression_off() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port-nozip", 4096)).unwrap();
    let mut p = pair(&pool, ",cqe-comp=0", 256);
    cross(&mut p, &pool, 3000, 128);
    let s = p.p1.stats();
    assert_eq!(s.ipackets, 3000);
    assert_eq!(xstat(&s, "rx_compressed_sessions"), 0);
    assert_eq!(xstat(&s, "dev_rx_compressed_sessions"), 0);
    finish(p, &pool);
}

/// DPDK's default geometry (64 strides of 2 KiB): every frame takes one stride.
#[test]
fn frames_cross_into_multi_packet_rqs() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port-mprq", 4096)).unwrap();
    let mut p = pair(&pool, ",mprq=1", 256);
    cross(&mut p, &pool, 5000, 128);
    let s = p.p1.stats();
    assert_eq!((s.ipackets, s.ierrors, s.imissed), (5000, 0, 0));
    // 5000 one-stride frames in WQEs of 64 strides: 78 WQEs finished and posted again.
    assert_eq!(xstat(&s, "rx_mprq_wqes_retired"), 5000 / 64);
    assert_eq!(xstat(&s, "rx_mprq_fillers"), 0);
    assert_eq!(
        xstat(&s, "rx_compressed_sessions"),
        xstat(&s, "dev_rx_compressed_sessions")
    );
    finish(p, &pool);
}

/// Strides of 128 bytes, 16 per WQE: frames span up to 12 strides, and those that do not fit
/// a WQE's rest leave fillers; with and without compressed CQEs. A ring of 2048 strides (128
/// WQEs) holds at least 127 such frames (one per WQE at worst, and the WQE being read is not
/// posted), more than the 64 the sender keeps in flight.
#[test]
fn frames_span_small_strides_and_fillers_close_wqes() {
    for comp in ["1", "0"] {
        let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port-strides", 4096)).unwrap();
        let args = format!(",mprq=1,mprq-log-stride=7,mprq-log-strides=4,cqe-comp={comp}");
        let mut p = pair(&pool, &args, 2048);
        cross(&mut p, &pool, 4000, 64);
        let s = p.p1.stats();
        assert_eq!(
            (s.ipackets, s.ierrors, s.imissed),
            (4000, 0, 0),
            "cqe-comp={comp}"
        );
        let fillers = xstat(&s, "rx_mprq_fillers");
        assert!(fillers > 100, "cqe-comp={comp}: {fillers} fillers");
        assert_eq!(fillers, xstat(&s, "dev_rx_fillers"));
        // Every stride of every finished WQE is a packet's or a filler's.
        let strides: u64 = (0..4000).map(|k| size(k).div_ceil(128) as u64).sum::<u64>();
        let retired = xstat(&s, "rx_mprq_wqes_retired");
        assert!(retired * 16 <= strides + 16 * fillers && strides <= (retired + 1) * 16);
        finish(p, &pool);
    }
}

/// A receiver that does not poll, the device on its own thread (as a NIC): the device fills
/// every posted WQE, then drops (and counts, `imissed`) what finds none; once the receiver
/// polls, its WQEs are posted again and frames flow.
#[test]
fn a_receiver_that_does_not_poll_makes_the_device_count_drops() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port-bp", 4096)).unwrap();
    // 4 WQEs of 64 one-stride frames: the ring holds 256.
    let mut p = pair_on(&pool, ",mprq=1", 256, ",engine=thread");
    let (mut sent, total) = (0u32, 1000u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent < total && Instant::now() < deadline {
        let k = total - sent;
        send(&mut p.tx0, &pool, &mut sent, k);
    }
    assert_eq!(sent, total);
    // Wait until the receiving device has dealt with every frame.
    while p.p1.stats().imissed < u64::from(total - 256) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(p.p1.stats().imissed, u64::from(total - 256));
    assert_eq!(
        xstat(&p.p1.stats(), "dev_rx_no_wqe"),
        u64::from(total - 256)
    );
    let mut got = 0u32;
    for _ in 0..100 {
        let mut b = Burst::with_capacity(32);
        p.rx1.rx_burst(&mut b);
        for m in b.drain_front(b.len()) {
            assert_eq!(m.data(), &frame(got, size(got))[..], "frame {got}");
            got += 1;
        }
    }
    assert_eq!(got, 256, "the first 256 frames, in order");
    // The ring is posted again: more frames arrive (at most 64 in flight: no drop).
    let mut more = 0u32;
    let mut seq = 5000u32;
    while more < 300 && Instant::now() < deadline {
        if seq < 5300 && seq - 5000 - more < 64 {
            let k = (5300 - seq).min(64 - (seq - 5000 - more));
            send(&mut p.tx0, &pool, &mut seq, k);
        }
        let mut b = Burst::with_capacity(32);
        more += p.rx1.rx_burst(&mut b) as u32;
    }
    assert_eq!(more, 300);
    assert_eq!(p.p1.stats().imissed, u64::from(total - 256));
    finish(p, &pool);
}

/// Striding settings the device or the configuration cannot take are refused at configure,
/// naming the setting and what to change.
#[test]
fn bad_striding_settings_are_refused_with_what_to_change() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port-bad", 1024)).unwrap();
    let cases: &[(&str, u16, u16, &[&str])] = &[
        // A WQE of 16 x 64 bytes cannot hold a 1518-byte frame.
        (
            "mprq=1,mprq-log-stride=6,mprq-log-strides=4",
            1500,
            256,
            &["mtu", "1500", "at most 1006", "raise mprq-log-stride"],
        ),
        // 64 strides per WQE and a ring of 64: one WQE.
        (
            "mprq=1",
            1500,
            64,
            &[
                "rx ring size",
                "64",
                "at least 128",
                "lower mprq-log-strides",
            ],
        ),
        // The model takes strides up to 8 KiB.
        (
            "mprq=1,mprq-log-stride=14",
            1500,
            256,
            &["mprq geometry", "mprq-log-stride 6..=13"],
        ),
    ];
    for (args, mtu, ring, needles) in cases {
        let spec = format!("emu-mlx5:wire=none,{args}").parse().unwrap();
        let mut port = Port::open(0, &spec).unwrap();
        let cfg = PortConfig::default()
            .with_mtu(*mtu)
            .with_rx_ring_size(*ring);
        let e = port.configure(&cfg, &pool).unwrap_err().to_string();
        for n in *needles {
            assert!(e.contains(n), "{args}: error {e:?} lacks {n:?}");
        }
    }
    // A jumbo MTU fits default WQEs (128 KiB), and mbufs with a data room for it.
    let jumbo =
        MbufPool::new(MbufPoolConfig::new("mlx5-port-jumbo", 1024).data_room(9018)).unwrap();
    let spec = "emu-mlx5:wire=none,mprq=1".parse().unwrap();
    let mut port = Port::open(0, &spec).unwrap();
    let cfg = PortConfig::default().with_mtu(9000).with_rx_ring_size(256);
    port.configure(&cfg, &jumbo).unwrap();
}
