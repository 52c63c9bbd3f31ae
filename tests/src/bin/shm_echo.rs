//! Test helper: opens an `emu-mana` port on a wire and echoes every frame it receives back,
//! until it has echoed `COUNT` frames or `SECONDS` pass. Prints what it did as one line.
//! Usage: shm_echo PORT_SPEC COUNT SECONDS

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, count, secs] = &args[..] else {
        eprintln!("usage: shm_echo PORT_SPEC COUNT SECONDS");
        std::process::exit(2);
    };
    let count: u64 = count.parse().expect("COUNT");
    let secs: f64 = secs.parse().expect("SECONDS");
    let pool = MbufPool::new(MbufPoolConfig::new("echo", 1024)).expect("pool");
    let cfg = PortConfig {
        rx_ring_size: 256,
        tx_ring_size: 256,
        ..Default::default()
    };
    let (port, mut rx, mut tx) =
        Port::open_started(1, &spec.parse().expect("spec"), &cfg, &pool).expect("open");
    println!("ready");
    let mut b = Burst::with_capacity(32);
    let mut echoed = 0u64;
    let t0 = Instant::now();
    while echoed < count && t0.elapsed() < Duration::from_secs_f64(secs) {
        rx.rx_burst(&mut b);
        while !b.is_empty() {
            echoed += tx.tx_burst(&mut b) as u64;
        }
    }
    // Let the last completions come back.
    for _ in 0..1000 {
        tx.tx_burst(&mut b);
        std::thread::sleep(Duration::from_micros(100));
    }
    drop((rx, tx));
    mempool::lcache::flush();
    drop(port);
    println!("echoed {echoed} in_use {}", pool.in_use());
}
