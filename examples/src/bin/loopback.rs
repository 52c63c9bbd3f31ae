//! The smallest complete program on the port API: two device-model MANA ports joined by an
//! in-process cable; port 0 sends a few UDP frames, port 1 receives them; every buffer goes
//! back to the pool at the end.
//!
//!     cargo run -p examples --bin loopback

use mempool::lcache;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig};
use std::time::{Duration, Instant};

const HELP: &str = "loopback: the smallest complete program on the port API.

Two MANA device-model ports joined by an in-process cable: port 0 sends 8 UDP frames, port 1
receives them, and every buffer goes back to the pool. Takes no options.

Usage: loopback [--help]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => {}
        ["-h" | "--help"] => {
            println!("{HELP}");
            return Ok(());
        }
        other => {
            eprintln!("loopback: unexpected argument {other:?}\n\n{HELP}");
            std::process::exit(2);
        }
    }
    pmd::log::init("info");
    let pool = MbufPool::new(MbufPoolConfig::new("example", 2048))?;
    let cfg = PortConfig::default().with_ring_sizes(256, 256);

    let mut a = Port::open(0, &"emu-mana:wire=loop:example".parse()?)?;
    let mut b = Port::open(1, &"emu-mana:wire=loop:example".parse()?)?;
    a.configure(&cfg, &pool)?;
    b.configure(&cfg, &pool)?;
    let mut tx = a.tx_queue(0)?;
    let mut rx = b.rx_queue(0)?;
    a.start()?;
    b.start()?;

    // Build 8 frames: broadcast Ethernet, a local experimental EtherType, a counter.
    let mut out = Burst::with_capacity(32);
    for i in 0..8u8 {
        let mut m = lcache::alloc(&pool).ok_or("pool empty")?;
        let mut frame = [0u8; 60];
        frame[..6].copy_from_slice(&[0xff; 6]);
        frame[6..12].copy_from_slice(&a.mac().0);
        frame[12..14].copy_from_slice(&[0x88, 0xb5]);
        frame[14] = i;
        m.extend_from_slice(&frame)?;
        out.push(m).map_err(|_| "burst full")?;
    }
    let sent = tx.tx_burst(&mut out);
    println!("port 0 sent {sent} frames");

    // The model's engine threads move them across; poll until all arrived.
    let mut inb = Burst::with_capacity(32);
    let mut got = 0;
    let t0 = Instant::now();
    while got < sent && t0.elapsed() < Duration::from_secs(5) {
        if rx.rx_burst(&mut inb) > 0 {
            for m in inb.iter() {
                println!(
                    "port 1 received {} bytes, counter {}",
                    m.len(),
                    m.data()[14]
                );
            }
            got += inb.len();
            // Dropped into this thread's cache (the bursts made one): no shared-ring trip.
            inb.clear();
        }
    }
    tx.tx_burst(&mut out); // reclaims the completions
    println!("port 0: {:?}", a.stats().opackets);
    println!("port 1: {:?}", b.stats().ipackets);

    drop((tx, rx, a, b));
    lcache::flush();
    println!("mbufs still in use: {}", pool.in_use());
    if got != sent || pool.in_use() != 0 {
        return Err("frames or buffers went missing".into());
    }
    Ok(())
}
