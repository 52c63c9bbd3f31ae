//! Test helper: opens an `emu-mana` port on a wire and echoes every frame it receives back,
//! until it has echoed `COUNT` frames or `SECONDS` pass. Prints `ready` once its port is
//! open, then what it did as one line: `echoed N in_use N stale N` (`stale`: the port's
//! `wire_rx_stale`, frames discarded because they were sent before it attached). Warnings
//! (`PMD_LOG`, default warn) go to stderr; a port that cannot be opened exits with status 1.
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
    pmd::log::init("warn");
    let count: u64 = count.parse().expect("COUNT");
    let secs: f64 = secs.parse().expect("SECONDS");
    let pool = MbufPool::new(MbufPoolConfig::new("echo", 1024)).expect("pool");
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    let (port, mut rx, mut tx) = Port::open_started(1, &spec.parse().expect("spec"), &cfg, &pool)
        .unwrap_or_else(|e| {
            eprintln!("shm_echo: {e}");
            std::process::exit(1);
        });
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
    let stale = port
        .stats()
        .xstats
        .iter()
        .find(|(n, _)| n == "wire_rx_stale")
        .map_or(0, |(_, v)| *v);
    drop(port);
    println!("echoed {echoed} in_use {} stale {stale}", pool.in_use());
}
