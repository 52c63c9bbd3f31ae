//! A dropped RX queue's posted buffers stay out of the pool while the device can still write
//! into them: the port's RX objects (the RSS QP, tables and WQs on hardware; the model's RQ
//! records here) are shared by all its queues and outlive any one handle. They come back
//! when the port closes its queues.

use mempool::{lcache, MbufPool, MbufPoolConfig};
use pmd::port::{Port, PortConfig};
use std::sync::Arc;

fn check(spec: &str) {
    let pool = Arc::new(MbufPool::new(MbufPoolConfig::new("parked", 4096)).unwrap());
    let mut port = Port::open(0, &spec.parse().unwrap()).unwrap();
    let cfg = PortConfig::default()
        .with_queues(2, 1)
        .with_ring_sizes(256, 256);
    port.configure(&cfg, &pool).unwrap();
    let rx0 = port.rx_queue(0).unwrap();
    let rx1 = port.rx_queue(1).unwrap();
    let tx = port.tx_queue(0).unwrap();
    port.start().unwrap();
    lcache::flush();
    let posted = pool.in_use();
    assert!(posted >= 256, "{spec}: {posted} buffers posted");
    drop(rx0);
    lcache::flush();
    assert_eq!(
        pool.in_use(),
        posted,
        "{spec}: queue 0's buffers went back to the pool while its RQ is still served"
    );
    drop((rx1, tx));
    port.close();
    lcache::flush();
    assert_eq!(
        pool.in_use(),
        0,
        "{spec}: every buffer back once the queues are gone"
    );
}

#[test]
fn a_dropped_rx_queue_keeps_its_buffers_from_the_pool_until_its_rq_is_gone() {
    // (A striding RQ's buffers are the queue's own registered memory, not the pool's: kept
    // mapped and registered the same way, which the pool cannot show.)
    for spec in ["emu-mana:wire=none", "emu-mlx5:wire=none"] {
        check(spec);
    }
}

/// The same for a TX queue's frames in flight: the device may still read them until the SQ
/// is destroyed, so a dropped queue's unsent frames (counted as transmit errors) stay out of
/// the pool until the port closes its queues.
#[test]
fn a_dropped_tx_queue_keeps_its_frames_in_flight_from_the_pool_until_its_sq_is_gone() {
    use pmd::emu::testing;
    use pmd::port::{probe, Burst};
    for kind in ["mana", "mlx5"] {
        let pool = Arc::new(MbufPool::new(MbufPoolConfig::new("parked-tx", 4096)).unwrap());
        let (mut port, pause): (Port, Box<dyn Fn()>) = if kind == "mana" {
            let (model, h) = testing::mana("none", 0).unwrap();
            let p = probe::mana(0, "tx".into(), Box::new(model), Default::default());
            (p, Box::new(move || h.pause()))
        } else {
            let (model, h) = testing::mlx5("none", 0, 0).unwrap();
            (
                probe::mlx5(0, "tx".into(), Box::new(model)),
                Box::new(move || h.pause()),
            )
        };
        let cfg = PortConfig::default().with_ring_sizes(256, 256);
        port.configure(&cfg, &pool).unwrap();
        let rx = port.rx_queue(0).unwrap();
        let mut tx = port.tx_queue(0).unwrap();
        port.start().unwrap();
        // The device takes nothing from now on: what is sent stays in flight.
        pause();
        lcache::flush();
        let before = pool.in_use();
        let mut burst = Burst::with_capacity(32);
        for _ in 0..32 {
            let mut m = lcache::alloc(&pool).unwrap();
            m.extend_from_slice(&[0xab; 64]).unwrap();
            burst.push(m).unwrap();
        }
        assert_eq!(tx.tx_burst(&mut burst), 32, "{kind}");
        drop(tx);
        lcache::flush();
        assert_eq!(
            pool.in_use(),
            before + 32,
            "{kind}: frames in flight went back to the pool while the SQ is still there"
        );
        assert_eq!(port.stats().oerrors, 32, "{kind}: counted as not sent");
        drop(rx);
        port.close();
        lcache::flush();
        assert_eq!(
            pool.in_use(),
            0,
            "{kind}: every buffer back once the queues are gone"
        );
    }
}
