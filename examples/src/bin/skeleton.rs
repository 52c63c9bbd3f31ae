//! A two-port forwarder, the shape of most dataplanes (DPDK's `skeleton`): a polling thread
//! takes what arrives on port 0 out of port 1 and what arrives on port 1 out of port 0, and
//! counts every frame it could not send. The traffic comes from this program itself, over two
//! in-process cables: a generator port on the far end of port 0's cable, a sink on the far end
//! of port 1's. At the end it prints what arrived, where the rest went (the forwarder's drops
//! and each port's device drops and loss counters, from `Port::stats`), and checks that every
//! buffer went back to the pool.
//!
//!     cargo run --release -p examples --bin skeleton -- --frames 200000

use examples::Cli;
use mempool::lcache;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig, RxQueue, TxQueue};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELP: &str = "skeleton: a two-port forwarder, the shape of most dataplanes.

A polling thread forwards port 0 -> port 1 and port 1 -> port 0 (MANA device-model ports).
This program also makes the traffic: a generator port sends FRAMES numbered UDP-sized frames
into port 0's cable, a sink port counts what comes out of port 1's. At the end it prints what
arrived, what the forwarder dropped, each port's device drops and loss counters, and whether
every buffer went back to the pool (exit status 1 if not, or if a frame is unaccounted for).

Usage: skeleton [--frames N] [--help]
  --frames N   frames to send (default 100000)";

const BURST: usize = 32;

/// Moves every frame `rx` has out of `tx`; frees and counts what `tx` would not take.
fn forward(rx: &mut RxQueue, tx: &mut TxQueue, b: &mut Burst, dropped: &mut u64) -> usize {
    let n = rx.rx_burst(b);
    if n > 0 {
        tx.tx_burst(b);
        // What the TX ring had no room for: freed here (to this thread's cache), counted.
        *dropped += b.len() as u64;
        b.clear();
    }
    n
}

fn parse_args() -> u64 {
    let mut cli = Cli::new("skeleton", HELP);
    let mut frames = 100_000u64;
    while let Some(a) = cli.next_option() {
        match a.as_str() {
            "--frames" => frames = cli.value("--frames", "a positive number", |n| *n > 0),
            other => cli.unexpected(other),
        }
    }
    frames
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let frames = parse_args();
    pmd::log::init("warn");
    // Four ports of 256-entry rings, their bursts and the per-core caches.
    let pool = MbufPool::new(MbufPoolConfig::new("skeleton", 8192))?;
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    // Two cables: generator <-> port 0, port 1 <-> sink.
    let mut ports = Vec::new();
    for (id, cable) in [
        (0, "skel-in"),
        (1, "skel-out"),
        (2, "skel-in"),
        (3, "skel-out"),
    ] {
        let mut p = Port::open(id, &format!("emu-mana:wire=loop:{cable}").parse()?)?;
        p.configure(&cfg, &pool)?;
        ports.push(p);
    }
    let (mut rx0, mut tx0) = (ports[0].rx_queue(0)?, ports[0].tx_queue(0)?);
    let (mut rx1, mut tx1) = (ports[1].rx_queue(0)?, ports[1].tx_queue(0)?);
    let mut gen = ports[2].tx_queue(0)?;
    let mut sink = ports[3].rx_queue(0)?;
    for p in &mut ports {
        p.start()?;
    }

    // The forwarder: one thread polls both ports (a real dataplane pins it to a core).
    let stop = Arc::new(AtomicBool::new(false));
    let fwd_dropped = Arc::new(AtomicU64::new(0));
    let forwarder = {
        let (stop, fwd_dropped) = (Arc::clone(&stop), Arc::clone(&fwd_dropped));
        std::thread::spawn(move || {
            let mut b = Burst::with_capacity(BURST);
            let mut dropped = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = forward(&mut rx0, &mut tx1, &mut b, &mut dropped)
                    + forward(&mut rx1, &mut tx0, &mut b, &mut dropped);
                if n == 0 {
                    std::hint::spin_loop();
                }
            }
            // An empty burst completes what the TX queues still hold.
            tx0.tx_burst(&mut b);
            tx1.tx_burst(&mut b);
            fwd_dropped.store(dropped, Ordering::Relaxed);
        })
    };

    // The traffic: send `frames` numbered frames, count what the sink gets.
    let mac = ports[2].mac();
    let (mut sent, mut refused, mut received) = (0u64, 0u64, 0u64);
    let mut out = Burst::with_capacity(BURST);
    let mut inb = Burst::with_capacity(BURST);
    let t0 = Instant::now();
    let mut last_rx = Instant::now();
    while (sent + refused < frames || last_rx.elapsed() < Duration::from_millis(300))
        && t0.elapsed() < Duration::from_secs(60)
    {
        while sent + refused < frames && out.spare() > 0 {
            let Some(mut m) = lcache::alloc(&pool) else {
                break;
            };
            let mut f = [0u8; 60];
            f[..6].copy_from_slice(&[0xff; 6]);
            f[6..12].copy_from_slice(&mac.0);
            f[12..14].copy_from_slice(&[0x88, 0xb5]);
            f[14..22].copy_from_slice(&(sent + refused).to_be_bytes());
            m.extend_from_slice(&f)?;
            let _ = out.push(m);
        }
        let n = gen.tx_burst(&mut out) as u64;
        sent += n;
        // A full TX ring: the generator does not wait, it counts and drops (as pktgen does).
        refused += out.len() as u64;
        out.clear();
        let got = sink.rx_burst(&mut inb) as u64;
        if got > 0 {
            received += got;
            last_rx = Instant::now();
            inb.clear();
        }
    }
    gen.tx_burst(&mut out);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    forwarder.join().map_err(|_| "forwarder panicked")?;
    let dropped = fwd_dropped.load(Ordering::Relaxed);

    println!(
        "sent {sent} frames ({refused} refused by the generator's full ring), received {received} \
         in {secs:.2} s ({:.0} frames/s)",
        received as f64 / secs
    );
    println!("forwarder dropped {dropped} (a TX ring full)");
    let mut device = 0;
    for (i, p) in ports.iter().enumerate() {
        let s = p.stats();
        device += s.device_drops.total();
        let losses: Vec<String> = s
            .losses
            .iter()
            .map(|x| format!("{} {}", x.name, x.value))
            .collect();
        println!(
            "port {i}: rx {} tx {}, device drops tx {} rx {}{}",
            s.ipackets,
            s.opackets,
            s.device_drops.tx,
            s.device_drops.rx,
            if losses.is_empty() {
                String::new()
            } else {
                format!(", losses: {}", losses.join(", "))
            }
        );
    }
    let lost = sent - received;
    println!(
        "lost {lost}: forwarder {dropped} + devices {device}{}",
        if lost == dropped + device {
            " (every frame accounted for)"
        } else {
            " (NOT all accounted for)"
        }
    );
    drop((gen, sink, inb, out));
    for p in ports {
        p.close();
    }
    lcache::flush();
    println!("mbufs still in use: {}", pool.in_use());
    if pool.in_use() != 0 || lost != dropped + device {
        std::process::exit(1);
    }
    Ok(())
}
