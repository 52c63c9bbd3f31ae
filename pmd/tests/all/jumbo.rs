//! Jumbo frames end to end through the port API: two device-model ports (`emu-mana`,
//! `emu-mlx5` in its receive variants) joined by an in-process cable, a 9000-byte MTU and a
//! pool whose data room holds 9018-byte frames. Every frame arrives byte for byte and every
//! buffer comes back; a frame longer than the receiver's buffers is dropped by the device
//! and counted (never silently); an MTU the pool cannot hold is refused at configure.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{max_frame_bytes, Burst, Port, PortConfig, RxQueue, Stats, TxQueue};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static CABLE: AtomicU32 = AtomicU32::new(0);

const JUMBO_MTU: u16 = 9000;

/// A pool whose buffers hold a frame of `mtu`.
fn pool_for(name: &str, mtu: u16, count: u32) -> Arc<MbufPool> {
    let room = max_frame_bytes(mtu).next_multiple_of(64).max(2048) as u16;
    MbufPool::new(MbufPoolConfig::new(name, count).data_room(room)).unwrap()
}

/// A frame of `len` bytes numbered `seq`: broadcast, a local experimental EtherType, or with
/// `vlan` an 802.1Q tag before it (the tag counts in `len`).
fn frame(seq: u32, len: usize, vlan: Option<u16>) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    let mut at = 12;
    if let Some(tci) = vlan {
        f[12..14].copy_from_slice(&[0x81, 0x00]);
        f[14..16].copy_from_slice(&tci.to_be_bytes());
        at = 16;
    }
    f[at..at + 2].copy_from_slice(&[0x88, 0xb5]);
    f[at + 2..at + 6].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[at + 6..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(7).wrapping_add(i) as u8;
    }
    f
}

struct Pair {
    tx_port: Port,
    rx_port: Port,
    tx: TxQueue,
    rx: RxQueue,
    // The other directions' queues, kept until the end.
    _rest: (RxQueue, TxQueue),
}

/// Port 0 (`<kind>:wire=loop:NAME` + `args`, MTU `tx_mtu`, pool `tx_pool`) sends to port 1
/// (same kind and args, MTU `rx_mtu`, pool `rx_pool`), both started.
fn pair(
    kind: &str,
    args: &str,
    (tx_mtu, tx_pool): (u16, &Arc<MbufPool>),
    (rx_mtu, rx_pool): (u16, &Arc<MbufPool>),
) -> Pair {
    let name = format!(
        "jumbo-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let cfg = |mtu| {
        PortConfig::default()
            .with_ring_sizes(256, 256)
            .with_mtu(mtu)
    };
    let spec = |id: u16| {
        format!("{kind}:wire=loop:{name}{args},mac=02:00:00:00:00:0{id}")
            .parse()
            .unwrap()
    };
    let (tx_port, rx0, tx) = Port::open_started(0, &spec(0), &cfg(tx_mtu), tx_pool).unwrap();
    let (rx_port, rx, tx1) = Port::open_started(1, &spec(1), &cfg(rx_mtu), rx_pool).unwrap();
    assert!(tx_port.link().up && rx_port.link().up, "both ends attached");
    Pair {
        tx_port,
        rx_port,
        tx,
        rx,
        _rest: (rx0, tx1),
    }
}

/// Sends `frames` (at most `window` in flight) and returns what arrived, in order, once
/// `want` frames arrived (or, to fail, when nothing moved for a while).
fn cross(
    p: &mut Pair,
    pool: &Arc<MbufPool>,
    frames: &[Vec<u8>],
    window: usize,
    want: usize,
) -> Vec<Vec<u8>> {
    let (mut sent, mut got) = (0usize, Vec::new());
    let mut idle_since = Instant::now();
    while (got.len() < want || sent < frames.len())
        && idle_since.elapsed() < Duration::from_secs(10)
    {
        let mut moved = false;
        if sent < frames.len() && sent - got.len().min(sent) < window {
            let mut b = Burst::with_capacity(16);
            for f in frames[sent..].iter().take(16) {
                let mut m = mempool::lcache::alloc(pool).unwrap();
                m.extend_from_slice(f).unwrap();
                b.push(m).unwrap();
            }
            let n = p.tx.tx_burst(&mut b);
            sent += n;
            moved |= n > 0;
            // What the queue did not take goes back to the pool (it is sent again next time).
            drop(b);
        }
        let mut b = Burst::with_capacity(32);
        let n = p.rx.rx_burst(&mut b);
        moved |= n > 0;
        got.extend(b.drain_front(n).map(|m| m.data().to_vec()));
        if moved {
            idle_since = Instant::now();
        }
    }
    got
}

/// The device model's counter of frames over the MTU: MANA completes them with TX_MTU_DROP
/// (an error completion), mlx5 drops them and completes the WQE normally.
fn mtu_counter(kind: &str) -> &'static str {
    if kind == "emu-mana" {
        "dev_tx_mtu_errors"
    } else {
        "dev_tx_mtu_drops"
    }
}

fn xstat(s: &Stats, name: &str) -> u64 {
    s.xstats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no xstat {name} in {:?}", s.xstats))
        .1
}

/// Drops the ports and queues, then checks every buffer of `pools` is back.
fn finish(p: Pair, pools: &[&Arc<MbufPool>]) {
    drop(p);
    for pool in pools {
        assert_eq!(pool.in_use(), 0, "pool {}", pool.name());
        assert_eq!(pool.available(), pool.capacity(), "pool {}", pool.name());
    }
}

/// 9014-byte frames (the largest untagged frame of a 9000 MTU), a 9018-byte tagged one, and
/// sizes in between, cross one cable byte for byte over several laps of 256-entry rings.
fn jumbo_round_trip(kind: &str, args: &str) {
    let pool = pool_for(&format!("jumbo-{kind}{args}"), JUMBO_MTU, 2047);
    assert!(pool.data_room() >= 9018);
    let mut p = pair(kind, args, (JUMBO_MTU, &pool), (JUMBO_MTU, &pool));
    let mut frames: Vec<Vec<u8>> = (0..600)
        .map(|k| {
            let len = match k % 3 {
                0 => 9014,
                1 => 60 + (k as usize * 131) % 8954,
                _ => 1514 + (k as usize * 17) % 7500,
            };
            frame(k, len, None)
        })
        .collect();
    frames.push(frame(600, 9018, Some(100)));
    let bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
    let got = cross(&mut p, &pool, &frames, 128, frames.len());
    assert_eq!(
        got.len(),
        frames.len(),
        "{kind}{args}: frames lost\nsender {:?}\nreceiver {:?}",
        p.tx_port.stats(),
        p.rx_port.stats()
    );
    for (k, (g, f)) in got.iter().zip(&frames).enumerate() {
        assert!(
            g == f,
            "{kind}{args}: frame {k} ({} bytes) differs",
            f.len()
        );
    }
    let (s, t) = (p.rx_port.stats(), p.tx_port.stats());
    assert_eq!(
        (s.ipackets, s.ibytes, s.ierrors, s.imissed),
        (frames.len() as u64, bytes, 0, 0),
        "{kind}{args}: receiver"
    );
    // The sending device put every frame on the wire (the driver counts a frame once its
    // completion is reclaimed, which may wait for a later burst).
    assert_eq!(
        (
            xstat(&t, "dev_tx_frames"),
            xstat(&t, "dev_tx_bytes"),
            xstat(&t, mtu_counter(kind)),
            t.oerrors
        ),
        (frames.len() as u64, bytes, 0, 0),
        "{kind}{args}: sender"
    );
    finish(p, &[&pool]);
}

#[test]
fn jumbo_frames_round_trip_through_the_mana_model() {
    jumbo_round_trip("emu-mana", "");
}

#[test]
fn jumbo_frames_round_trip_through_the_mlx5_model() {
    // Cyclic RQs with and without compressed CQEs, a ConnectX-4 that needs 18 bytes inline
    // (the inline header path), and multi-packet RQs (a frame spans five 2 KiB strides).
    for args in ["", ",cqe-comp=0", ",inline=18", ",mprq=1"] {
        jumbo_round_trip("emu-mlx5", args);
    }
}

/// A peer with a 9000-byte MTU sends to a port at 1500 (default pool, 2048-byte buffers): the
/// frame longer than the posted buffer is dropped by the device and counted where it happens
/// (MANA: an RX_TRUNCATED completion; mlx5: a LOCAL_LENGTH error completion, or on a
/// multi-packet RQ a packet longer than an mbuf), and the frames around it arrive.
fn long_frame_is_counted(kind: &str, args: &str, driver_xstat: &str, device_xstat: &str) {
    let big = pool_for(&format!("long-tx-{kind}{args}"), JUMBO_MTU, 1023);
    let small = MbufPool::new(MbufPoolConfig::new(format!("long-rx-{kind}{args}"), 1023)).unwrap();
    let mut p = pair(kind, args, (JUMBO_MTU, &big), (1500, &small));
    let frames = [
        frame(0, 1514, None),
        frame(1, 3000, None),
        frame(2, 2049 + 14, None),
        frame(3, 60, None),
    ];
    let got = cross(&mut p, &big, &frames, 16, 2);
    let ctx = format!("{kind}{args}");
    assert_eq!(got, vec![frames[0].clone(), frames[3].clone()], "{ctx}");
    let s = p.rx_port.stats();
    assert_eq!((s.ipackets, s.ierrors), (2, 2), "{ctx}: {s:?}");
    assert_eq!(xstat(&s, driver_xstat), 2, "{ctx}");
    if !device_xstat.is_empty() {
        assert_eq!(xstat(&s, device_xstat), 2, "{ctx}");
    }
    assert_eq!(
        p.tx_port.stats().oerrors,
        0,
        "{ctx}: the sender sent them all"
    );
    finish(p, &[&big, &small]);
}

#[test]
fn a_frame_longer_than_the_rx_buffer_is_counted_by_the_mana_model() {
    long_frame_is_counted("emu-mana", "", "rx_cqe_truncated", "dev_rx_truncated");
}

#[test]
fn a_frame_longer_than_the_rx_buffer_is_counted_by_the_mlx5_model() {
    long_frame_is_counted("emu-mlx5", "", "rx_cqe_errors", "dev_rx_oversize");
    // A striding WQE (128 KiB) takes the frame; the driver cannot fit it in an mbuf.
    long_frame_is_counted("emu-mlx5", ",mprq=1", "rx_too_long", "");
}

/// A frame over the sender's MTU never reaches the wire: the device drops it and counts it.
#[test]
fn a_frame_over_the_mtu_is_dropped_by_the_sending_device_and_counted() {
    for kind in ["emu-mana", "emu-mlx5"] {
        let pool = pool_for(&format!("over-mtu-{kind}"), JUMBO_MTU, 1023);
        let mut p = pair(kind, "", (1500, &pool), (JUMBO_MTU, &pool));
        let frames = [
            frame(0, 1514, None),
            frame(1, 1515, None),
            frame(2, 60, None),
        ];
        let got = cross(&mut p, &pool, &frames, 16, 2);
        assert_eq!(got, vec![frames[0].clone(), frames[2].clone()], "{kind}");
        let t = p.tx_port.stats();
        assert_eq!(xstat(&t, mtu_counter(kind)), 1, "{kind}: {t:?}");
        finish(p, &[&pool]);
    }
}

/// The MTU is checked against the device's range and against the pool's data room, with
/// what to change.
#[test]
fn an_mtu_the_pool_or_device_cannot_take_is_refused_with_what_to_change() {
    let small = MbufPool::new(MbufPoolConfig::new("mtu-small", 1023)).unwrap();
    let big = pool_for("mtu-big", JUMBO_MTU, 1023);
    let cases: &[(&str, u16, &Arc<MbufPool>, &[&str])] = &[
        (
            "emu-mana:wire=none",
            9000,
            &small,
            &["mtu", "9000", "at most 2030", "2048-byte data room", "9018"],
        ),
        (
            "emu-mlx5:wire=none",
            2031,
            &small,
            &["mtu", "2031", "at most 2030", "data room of at least 2049"],
        ),
        (
            "emu-mana:wire=none",
            9001,
            &big,
            &["mtu", "9001", "68..=9000"],
        ),
        ("emu-mlx5:wire=none", 67, &big, &["mtu", "67", "68..=9978"]),
    ];
    for (spec, mtu, pool, needles) in cases {
        let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
        let cfg = PortConfig::default().with_mtu(*mtu).with_rx_ring_size(256);
        let e = port.configure(&cfg, pool).unwrap_err().to_string();
        for n in *needles {
            assert!(e.contains(n), "{spec} mtu {mtu}: error {e:?} lacks {n:?}");
        }
    }
    // The largest MTU each pool holds is taken.
    for (spec, mtu, pool) in [
        ("emu-mana:wire=none", 2030, &small),
        ("emu-mlx5:wire=none", 9000, &big),
    ] {
        let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
        let cfg = PortConfig::default().with_mtu(mtu).with_rx_ring_size(256);
        port.configure(&cfg, pool).unwrap();
    }
}

/// A port's largest MTU is its driver's, capped by what the device reports (a MANA host
/// without jumbo frames: 1500), never below 68.
#[test]
fn the_device_caps_the_drivers_mtu_range() {
    use pmd::ethdev::cap_mtu;
    assert_eq!(cap_mtu(9000, None), 9000);
    assert_eq!(cap_mtu(9000, Some(1500)), 1500);
    assert_eq!(cap_mtu(9978, Some(65535)), 9978);
    assert_eq!(cap_mtu(9000, Some(0)), 68);
    // The models report nothing: their ranges are their drivers'.
    for (spec, max) in [("emu-mana:wire=none", 9000), ("emu-mlx5:wire=none", 9978)] {
        let port = Port::open(0, &spec.parse().unwrap()).unwrap();
        assert_eq!(port.caps().mtu_range, (68, max), "{spec}");
    }
}
