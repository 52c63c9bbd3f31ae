//! Tests on a real NIC, ignored unless `PMD_TEST_PORT` names the port to use: a MANA port (an
//! Azure VM with Accelerated Networking), e.g.
//! `PMD_TEST_PORT=mana:dev=mana_0,port=2 cargo test -p integration-tests --test all hw_nic -- --ignored`,
//! or an mlx5 one (`PMD_TEST_PORT=mlx5:dev=mlx5_0`). `PMD_TEST_MANA_PORT` is the older name.
//! A MANA port's netdev must be down (or add `busy=takeover` to the spec). Never name the NIC
//! that carries your SSH session.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::ethdev::Burst;
use pmd::port::{Port, PortConfig};
use std::time::{Duration, Instant};

fn port_spec() -> String {
    std::env::var("PMD_TEST_PORT")
        .or_else(|_| std::env::var("PMD_TEST_MANA_PORT"))
        .expect("set PMD_TEST_PORT to a mana: or mlx5: port spec to run the hardware tests")
}

/// The port opens, configures, comes up and closes again, twice (nothing leaks between the
/// two bring-ups), with the pool whole at the end.
#[test]
#[ignore = "needs a MANA or mlx5 NIC: set PMD_TEST_PORT"]
fn bringup_and_teardown_twice() {
    let spec = port_spec();
    let pool = MbufPool::new(MbufPoolConfig::new("hw-nic-up", 4096)).unwrap();
    for _ in 0..2 {
        let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
        port.configure(&PortConfig::default(), &pool).unwrap();
        port.start().unwrap();
        assert!(port.link().up, "{spec}: link down");
        port.stop();
        drop(port);
    }
    assert_eq!(pool.in_use(), 0);
}

/// 10,000 broadcast frames leave the port: every one completes without error (`opackets`,
/// counted at completion, is exactly what was sent), and every buffer comes back, the queue
/// drained before it is dropped.
#[test]
#[ignore = "needs a MANA or mlx5 NIC: set PMD_TEST_PORT"]
fn broadcast_frames_complete_and_buffers_come_back() {
    let spec = port_spec();
    let pool = MbufPool::new(MbufPoolConfig::new("hw-nic-tx", 4096)).unwrap();
    let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
    port.configure(&PortConfig::default(), &pool).unwrap();
    let mut txq = port.tx_queue(0).unwrap();
    port.start().unwrap();
    // The RX ring's buffers (nothing polls RX here, so they stay posted).
    let posted_rx = pool.in_use();
    let mac = port.mac().0;
    let mut frame = vec![0u8; 60];
    frame[..6].fill(0xff);
    frame[6..12].copy_from_slice(&mac);
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    let (mut sent, want) = (0u64, 10_000u64);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut b = Burst::with_capacity(32);
    while sent < want && Instant::now() < deadline {
        while b.len() < 32 && sent + (b.len() as u64) < want {
            let Some(mut m) = mempool::lcache::alloc(&pool) else {
                break;
            };
            m.extend_from_slice(&frame).unwrap();
            b.push(m).unwrap();
        }
        sent += txq.tx_burst(&mut b) as u64;
    }
    // What the deadline left unsent.
    drop(b);
    // Drain the queue: empty bursts reclaim completions (and ask for those not yet asked
    // for) until every TX buffer is back; 5 s bounds a stuck queue.
    let mut empty = Burst::with_capacity(1);
    let drained = integration_tests::eventually(Duration::from_secs(5), || {
        txq.tx_burst(&mut empty);
        pool.in_use() == posted_rx
    });
    let in_flight = pool.in_use().saturating_sub(posted_rx);
    let stats = port.stats();
    port.stop();
    drop(txq);
    drop(port);
    assert_eq!(sent, want);
    assert!(
        drained,
        "{in_flight} TX buffers still in flight after 5 s: {stats:?}"
    );
    assert_eq!(stats.opackets, want, "{stats:?}");
    assert_eq!(stats.oerrors, 0, "{stats:?}");
    assert_eq!(pool.in_use(), 0);
}
