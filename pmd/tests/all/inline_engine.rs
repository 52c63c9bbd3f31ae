//! The device models' inline engine (`engine=inline`, the default of ports opened from
//! devargs): no thread of their own, the device's work done in the kicks the drivers make on
//! the polling thread. Every test here runs inline only, so the process never has a model
//! thread (the first test checks that). Exact counts, no timing: inline, nothing happens
//! between two calls of the test.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::emu::mana::ModelSpec;
use pmd::emu::{testing, EngineMode};
use pmd::ethdev::{Burst, Stats};
use pmd::port::{probe, Port, PortConfig, PortEvent, RxQueue, TxQueue};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static CABLE: AtomicU32 = AtomicU32::new(0);

const KINDS: [&str; 2] = ["emu-mana", "emu-mlx5"];

/// Port 0 sends to port 1 over a new in-process cable, both `kind` with `extra` devargs,
/// started, with `rx_ring` receive descriptors.
struct Pair {
    p0: Port,
    p1: Port,
    tx0: TxQueue,
    rx1: RxQueue,
    _rest: (RxQueue, TxQueue),
}

fn pair(pool: &Arc<MbufPool>, kind: &str, extra: &str, rx_ring: u16) -> Pair {
    let name = format!(
        "inline-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let cfg = PortConfig::default().with_ring_sizes(rx_ring, 256);
    let spec = |id: u16| {
        format!("{kind}:wire=loop:{name}{extra},mac=02:00:00:00:00:0{id}")
            .parse()
            .unwrap()
    };
    let (p0, rx0, tx0) = Port::open_started(0, &spec(0), &cfg, pool).unwrap();
    let (p1, rx1, tx1) = Port::open_started(1, &spec(1), &cfg, pool).unwrap();
    Pair {
        p0,
        p1,
        tx0,
        rx1,
        _rest: (rx0, tx1),
    }
}

/// Frame `seq` of `len` bytes, addressed to port 1 (so that a MANA port takes it).
fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    f
}

/// Sends frames `seq..seq + n` of `len` bytes; every burst is taken whole (the device
/// completes them in the doorbell's kick).
fn send(tx: &mut TxQueue, pool: &Arc<MbufPool>, seq: u32, n: u32, len: usize) {
    let mut s = seq;
    while s < seq + n {
        let mut b = Burst::with_capacity(32);
        while b.spare() > 0 && s + (b.len() as u32) < seq + n {
            let mut m = mempool::lcache::alloc(pool).unwrap();
            m.extend_from_slice(&frame(s + b.len() as u32, len))
                .unwrap();
            b.push(m).unwrap();
        }
        let k = b.len();
        assert_eq!(tx.tx_burst(&mut b), k, "a burst is taken whole");
        s += k as u32;
    }
    // An empty burst reclaims the last completions (the port counts sent packets there).
    tx.tx_burst(&mut Burst::with_capacity(1));
}

/// Receives until a burst comes back empty; checks the frames are `first..` in order.
fn receive(rx: &mut RxQueue, first: u32) -> u32 {
    let mut got = 0;
    loop {
        let mut b = Burst::with_capacity(32);
        if rx.rx_burst(&mut b) == 0 {
            return got;
        }
        for m in b.drain_front(b.len()) {
            let seq = u32::from_be_bytes(m.data()[14..18].try_into().unwrap());
            assert_eq!(seq, first + got, "in order");
            got += 1;
        }
    }
}

fn xstat(s: &Stats, name: &str) -> u64 {
    s.xstats
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no xstat {name} in {:?}", s.xstats))
        .1
}

fn model_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("emu-"))
        .collect()
}

#[test]
fn inline_ports_run_no_thread_and_move_every_frame() {
    let pool = MbufPool::new(MbufPoolConfig::new("inline-basic", 4096)).unwrap();
    for kind in KINDS {
        let mut p = pair(&pool, kind, "", 256);
        assert!(model_threads().is_empty(), "{:?}", model_threads());
        for round in 0..50 {
            send(
                &mut p.tx0,
                &pool,
                round * 100,
                100,
                60 + round as usize * 20,
            );
            assert_eq!(
                receive(&mut p.rx1, round * 100),
                100,
                "{kind} round {round}"
            );
        }
        let (s0, s1) = (p.p0.stats(), p.p1.stats());
        // (`opackets` counts completions; mlx5 asks for one every few WQEs only.)
        assert_eq!(
            (xstat(&s0, "dev_tx_frames"), s1.ipackets, s1.imissed),
            (5000, 5000, 0)
        );
        assert_eq!(xstat(&s0, "dev_tx_wire_drops"), 0);
        drop(p);
        assert_eq!(pool.in_use(), 0, "{kind}: every buffer back");
    }
}

/// A receiver that does not poll: its device takes no frame it has no buffer for; the frames
/// wait on the cable (the device's receive buffer here) and all arrive, in order, once the
/// receiver polls. Nothing is dropped (compare `a_receiver_that_does_not_poll_makes_the_
/// device_count_drops` in `mlx5_port.rs`, the device on its own thread).
#[test]
fn a_receiver_that_does_not_poll_leaves_frames_on_the_cable() {
    let pool = MbufPool::new(MbufPoolConfig::new("inline-bp", 4096)).unwrap();
    for kind in KINDS {
        for extra in ["", ",mprq=1"] {
            if kind == "emu-mana" && !extra.is_empty() {
                continue;
            }
            // 128 receive buffers (the least a striding RQ takes: two WQEs of 64 strides),
            // 3000 frames sent before the first poll.
            let mut p = pair(&pool, kind, extra, 128);
            send(&mut p.tx0, &pool, 0, 3000, 60);
            assert_eq!(receive(&mut p.rx1, 0), 3000, "{kind}{extra}");
            let s1 = p.p1.stats();
            assert_eq!((s1.ipackets, s1.imissed), (3000, 0), "{kind}{extra}");
            assert_eq!(xstat(&s1, "dev_rx_no_wqe"), 0);
            assert_eq!(xstat(&p.p0.stats(), "dev_tx_wire_drops"), 0);
        }
    }
}

/// A cable that fills up (the receiver does not poll for too long): the sending device
/// counts every frame the cable refused (`dev_tx_wire_drops`), the receiver gets exactly what
/// the cable held, in order, and the counts add up to what was sent.
#[test]
fn a_full_cable_is_counted_by_the_sending_device() {
    let pool = MbufPool::new(MbufPoolConfig::new("inline-full", 4096)).unwrap();
    // 1000-byte frames take 1024 bytes of cable each.
    let fits = (pmd::emu::wire::LOOPBACK_RING_BYTES / 1024) as u32;
    for kind in KINDS {
        let mut p = pair(&pool, kind, "", 256);
        send(&mut p.tx0, &pool, 0, fits + 500, 1000);
        let s0 = p.p0.stats();
        assert_eq!(xstat(&s0, "dev_tx_wire_drops"), 500, "{kind}");
        assert_eq!(xstat(&s0, "dev_tx_frames"), u64::from(fits), "{kind}");
        assert_eq!(receive(&mut p.rx1, 0), fits, "{kind}");
        // The cable has room again.
        send(&mut p.tx0, &pool, fits, 10, 1000);
        assert_eq!(receive(&mut p.rx1, fits), 10, "{kind}");
        assert_eq!(xstat(&p.p0.stats(), "dev_tx_wire_drops"), 500, "{kind}");
    }
}

/// An inline engine paused for a test does nothing in the kicks; its steps do the work.
#[test]
fn a_paused_inline_engine_moves_frames_only_when_stepped() {
    let pool = MbufPool::new(MbufPoolConfig::new("inline-step", 1024)).unwrap();
    let wire = format!("loop:inline-step-{}", std::process::id());
    let spec = |_| ModelSpec {
        engine: EngineMode::Inline,
        ..ModelSpec::new(wire.parse().unwrap())
    };
    let (m0, h0) = testing::mana_with(&spec(0), 0).unwrap();
    let (m1, h1) = testing::mana_with(&spec(1), 1).unwrap();
    let opts = pmd::mana::Options::default();
    let mut p0 = probe::mana(0, "a".into(), Box::new(m0), opts.clone());
    let mut p1 = probe::mana(1, "b".into(), Box::new(m1), opts);
    let cfg = PortConfig::default().with_ring_sizes(64, 64);
    p0.configure(&cfg, &pool).unwrap();
    p1.configure(&cfg, &pool).unwrap();
    let (mut tx, mut rx) = (p0.tx_queue(0).unwrap(), p1.rx_queue(0).unwrap());
    p0.start().unwrap();
    p1.start().unwrap();
    h0.pause();
    h1.pause();
    send(&mut tx, &pool, 0, 10, 60);
    assert_eq!(h0.stats().tx_frames, 0, "paused: the kick did nothing");
    assert_eq!(receive(&mut rx, 0), 0);
    assert!(h0.step() > 0);
    assert_eq!(h0.stats().tx_frames, 10);
    assert_eq!(receive(&mut rx, 0), 0, "the receiving device is paused too");
    assert!(h1.step() > 0);
    assert_eq!(receive(&mut rx, 0), 10);
    h0.resume();
    h1.resume();
    send(&mut tx, &pool, 10, 5, 60);
    assert_eq!(
        receive(&mut rx, 10),
        5,
        "resumed: the kicks do the work again"
    );
}

/// The link watch runs in the kicks: a peer that goes away is reported as a port event
/// while the port's queues are polled.
#[test]
fn an_inline_port_reports_its_peer_going_away_while_polled() {
    let pool = MbufPool::new(MbufPoolConfig::new("inline-link", 4096)).unwrap();
    let mut p = pair(&pool, "emu-mana", "", 64);
    assert!(p.p1.link().up);
    let _ = p.p1.take_events();
    // Port 0 goes, with its queue handles (they keep its device, and its end of the cable).
    drop((p.p0, p.tx0, p._rest.0));
    assert!(!p.p1.link().up, "the link is read when asked");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.is_empty() && Instant::now() < deadline {
        let mut b = Burst::with_capacity(32);
        p.rx1.rx_burst(&mut b);
        seen = p.p1.take_events();
    }
    assert_eq!(seen, [PortEvent::LinkDown]);
}
