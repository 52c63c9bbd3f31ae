//! Port lifecycle and null-port bursts, with every buffer accounted for.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig, PortError, PortState};
use std::sync::Arc;

fn pool(n: u32) -> Arc<MbufPool> {
    MbufPool::new(MbufPoolConfig::new("test", n)).unwrap()
}

fn null_port(id: u16, spec: &str) -> Port {
    Port::open(id, &spec.parse().unwrap()).unwrap()
}

#[test]
fn lifecycle_and_bursts_on_a_stopped_port() {
    let pool = pool(2048);
    let mut port = null_port(3, "null:size=128");
    assert_eq!(port.state(), PortState::Opened);
    assert!(matches!(port.rx_queue(0), Err(PortError::State { .. })));
    assert!(matches!(
        port.start(),
        Err(PortError::State { op: "start", .. })
    ));

    let cfg = PortConfig::default().with_queues(2, 2);
    port.configure(&cfg, &pool).unwrap();
    let mut rx = port.rx_queue(1).unwrap();
    let mut tx = port.tx_queue(0).unwrap();
    assert!(matches!(
        port.rx_queue(1),
        Err(PortError::QueueTaken {
            dir: "rx",
            queue: 1
        })
    ));
    let e = port.tx_queue(2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tx queue 2 does not exist: the port has 2 tx queue(s)"
    );

    let mut burst = Burst::with_capacity(32);
    // Configured but not started: nothing moves.
    assert_eq!(rx.rx_burst(&mut burst), 0);
    port.start().unwrap();
    assert!(matches!(
        port.configure(&cfg, &pool),
        Err(PortError::State {
            op: "configure",
            ..
        })
    ));
    assert_eq!(rx.rx_burst(&mut burst), 32);
    assert!(burst.iter().all(|m| m.len() == 128 && m.port() == 3));
    assert_eq!(pool.in_use(), 32);
    assert_eq!(tx.tx_burst(&mut burst), 32);
    assert!(burst.is_empty());

    port.stop();
    assert_eq!(port.state(), PortState::Configured);
    assert_eq!(rx.rx_burst(&mut burst), 0);
    let mut one = Burst::with_capacity(1);
    port.start().unwrap();
    assert_eq!(rx.rx_burst(&mut one), 1);
    port.stop();
    assert_eq!(tx.tx_burst(&mut one), 0, "a stopped port takes nothing");
    assert_eq!(one.len(), 1, "and the packet stays with the caller");
    drop(one);

    let s = port.stats();
    assert_eq!((s.ipackets, s.ibytes), (33, 33 * 128));
    assert_eq!((s.opackets, s.obytes), (32, 32 * 128));
    assert_eq!(s.rx_queues[1].packets, 33);
    assert_eq!(s.rx_queues[0].packets, 0);

    // Reconfigure detaches the old handles.
    port.configure(&PortConfig::default(), &pool).unwrap();
    port.start().unwrap();
    assert_eq!(rx.rx_burst(&mut burst), 0, "old handle is detached");
    port.close();
    assert_eq!(rx.rx_burst(&mut burst), 0);
    drop((rx, tx));
    assert_eq!(pool.in_use(), 0, "every buffer back");
}

#[test]
fn bad_configs_are_refused_with_the_limits() {
    let pool = pool(256);
    let mut port = null_port(0, "null");
    let e = port
        .configure(&PortConfig::default().with_rx_queues(0), &pool)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rx queues: 0 requested, the port allows 1..=64"
    );
    let e = port
        .configure(&PortConfig::default().with_rx_ring_size(512), &pool)
        .unwrap_err();
    assert!(e.to_string().contains("at least 512 mbufs"), "{e}");
    let mut big = null_port(0, "null:size=4000");
    let e = big
        .configure(&PortConfig::default().with_rx_ring_size(64), &pool)
        .unwrap_err();
    assert!(
        e.to_string().contains("null frame size: 4000 requested"),
        "{e}"
    );
}

#[test]
fn pool_exhaustion_counts_nombuf_and_recovers() {
    let pool = pool(64);
    let cfg = PortConfig::default().with_ring_sizes(16, 16);
    let (port, mut rx, mut tx) =
        Port::open_started(0, &"null".parse().unwrap(), &cfg, &pool).unwrap();
    let mut held = Vec::new();
    loop {
        let mut b = Burst::with_capacity(16);
        if rx.rx_burst(&mut b) == 0 {
            break;
        }
        held.push(b);
    }
    // 64 buffers are four bursts of 16; the fifth finds the pool empty, fails whole (a bulk
    // get is all-or-nothing) and counts once.
    assert_eq!(held.len(), 4);
    assert_eq!(pool.in_use(), 64);
    assert_eq!(port.stats().rx_nombuf, 1);
    assert_eq!(port.stats().ipackets, 64);
    for mut b in held {
        assert_eq!(tx.tx_burst(&mut b), b.capacity().min(16));
    }
    let mut b = Burst::with_capacity(16);
    assert_eq!(rx.rx_burst(&mut b), 16, "recovers once buffers are back");
    drop(b);
    drop((rx, tx));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn hardware_kinds_explain_what_to_do_without_hardware() {
    let e = Port::open(0, &"mana:mac=00:15:5d:01:02:03".parse().unwrap()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("mana:mac=00:15:5d:01:02:03: "), "{msg}");
    assert!(msg.contains("emu-mana"), "{msg}");
}

#[test]
fn queues_move_to_other_threads() {
    let pool = pool(1024);
    let cfg = PortConfig::default().with_rx_ring_size(64);
    let (port, mut rx, mut tx) =
        Port::open_started(0, &"null".parse().unwrap(), &cfg, &pool).unwrap();
    let moved = std::thread::spawn(move || {
        let mut b = Burst::with_capacity(32);
        let mut n = 0;
        for _ in 0..1000 {
            n += rx.rx_burst(&mut b);
            n -= tx.tx_burst(&mut b);
        }
        (n, rx, tx)
    })
    .join()
    .unwrap();
    assert_eq!(moved.0, 0);
    assert_eq!(port.stats().opackets, 32_000);
    drop(moved);
    assert_eq!(pool.in_use(), 0);
}
