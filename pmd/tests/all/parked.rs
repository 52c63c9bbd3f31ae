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
