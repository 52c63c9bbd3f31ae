//! Receive-side scaling: one port with several RX queues, each polled by its own thread, the
//! device spreading flows over them by the Toeplitz hash of their addresses and ports. A
//! sender port on the same in-process cable sends UDP frames of many flows; every worker
//! counts what its queue got, checks that each frame carries the hash its flow should have
//! (`pmd::net::toeplitz`, the same key as the port's `RssConfig`), and that a flow never
//! shows up on two queues.
//!
//!     cargo run --release -p examples --bin rss -- --queues 4 --flows 256

use etherparse::PacketBuilder;
use examples::Cli;
use mempool::lcache;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig, RssConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELP: &str = "rss: receive-side scaling, one thread per RX queue.

A MANA device-model port with QUEUES RX queues receives UDP frames of FLOWS flows (source
ports 10000 and up, 169.254.1.1 -> 169.254.1.2:9000) from a sender port on an in-process
cable. Each queue is polled by its own thread. At the end it prints the frames per queue and
checks that every frame carries its flow's Toeplitz hash and that no flow reached two queues
(exit status 1 if not, or if a frame or a buffer is missing).

Usage: rss [--queues N] [--flows N] [--frames N] [--help]
  --queues N   RX queues, 1 to 16 (default 4)
  --flows N    distinct flows, 1 to 50000 (default 256)
  --frames N   frames to send (default 20000)";

const SRC: [u8; 4] = [169, 254, 1, 1];
const DST: [u8; 4] = [169, 254, 1, 2];
const DPORT: u16 = 9000;

struct Args {
    queues: u16,
    flows: u16,
    frames: u64,
}

fn parse_args() -> Args {
    let mut cli = Cli::new("rss", HELP);
    let mut a = Args {
        queues: 4,
        flows: 256,
        frames: 20_000,
    };
    while let Some(arg) = cli.next_option() {
        let mut num = |what: &str, lo: u64, hi: u64| -> u64 {
            cli.value(what, &format!("a number from {lo} to {hi}"), |n| {
                (lo..=hi).contains(n)
            })
        };
        match arg.as_str() {
            "--queues" => a.queues = num("--queues", 1, 16) as u16,
            "--flows" => a.flows = num("--flows", 1, 50_000) as u16,
            "--frames" => a.frames = num("--frames", 1, u64::MAX),
            other => cli.unexpected(other),
        }
    }
    a
}

/// The UDP frame of flow `flow` (source port 10000 + `flow`).
fn frame(flow: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(SRC, DST, 64)
        .udp(10_000 + flow, DPORT)
        .write(&mut f, &[0u8; 18])
        .expect("a UDP frame");
    f
}

/// The hash the device must give flow `sport` with `rss`'s key.
fn expected_hash(rss: &RssConfig, sport: u16) -> u32 {
    let mut input = [0u8; 12];
    let n = pmd::net::toeplitz::ipv4_input(SRC, DST, Some((sport, DPORT)), &mut input);
    pmd::net::toeplitz::hash(&rss.key, &input[..n])
}

/// What one worker saw: frames, frames with a wrong hash, and its flows (source ports).
#[derive(Default)]
struct Seen {
    frames: u64,
    bad_hash: u64,
    flows: HashMap<u16, u64>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args();
    pmd::log::init("warn");
    let pool = MbufPool::new(MbufPoolConfig::new("rss", 16384))?;
    let rx_cfg = PortConfig::default()
        .with_rx_queues(args.queues)
        .with_ring_sizes(256, 256);
    let rss = rx_cfg.rss.clone();
    let mut sender = Port::open(0, &"emu-mana:wire=loop:rss-example".parse()?)?;
    let mut receiver = Port::open(1, &"emu-mana:wire=loop:rss-example".parse()?)?;
    sender.configure(&PortConfig::default().with_ring_sizes(256, 256), &pool)?;
    receiver.configure(&rx_cfg, &pool)?;
    let mut tx = sender.tx_queue(0)?;
    let rxqs = (0..args.queues)
        .map(|q| receiver.rx_queue(q))
        .collect::<Result<Vec<_>, _>>()?;
    sender.start()?;
    receiver.start()?;

    // One worker per RX queue (a real dataplane pins each to its own core).
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = rxqs
        .into_iter()
        .map(|mut rx| {
            let (stop, rss) = (Arc::clone(&stop), rss.clone());
            std::thread::spawn(move || {
                let mut seen = Seen::default();
                let mut b = Burst::with_capacity(32);
                loop {
                    let done = stop.load(Ordering::Relaxed);
                    if rx.rx_burst(&mut b) == 0 {
                        if done {
                            return seen;
                        }
                        std::hint::spin_loop();
                        continue;
                    }
                    for m in b.iter() {
                        let d = m.data();
                        let sport = u16::from_be_bytes([d[34], d[35]]);
                        seen.frames += 1;
                        seen.bad_hash += u64::from(m.rss_hash() != expected_hash(&rss, sport));
                        *seen.flows.entry(sport).or_default() += 1;
                    }
                    b.clear();
                }
            })
        })
        .collect();

    // The sender: round robin over the flows.
    let frames: Vec<Vec<u8>> = (0..args.flows).map(frame).collect();
    let (mut sent, mut refused) = (0u64, 0u64);
    let mut out = Burst::with_capacity(32);
    while sent + refused < args.frames {
        while sent + refused + (out.len() as u64) < args.frames && out.spare() > 0 {
            let i = ((sent + refused + out.len() as u64) % u64::from(args.flows)) as usize;
            let Some(mut m) = lcache::alloc(&pool) else {
                break;
            };
            m.extend_from_slice(&frames[i])?;
            let _ = out.push(m);
        }
        sent += tx.tx_burst(&mut out) as u64;
        refused += out.len() as u64;
        out.clear();
    }
    // Let the last frames arrive, then stop the workers (they drain their queues first).
    let t0 = Instant::now();
    while receiver.stats().ipackets + receiver.stats().device_drops.rx < sent
        && t0.elapsed() < Duration::from_secs(10)
    {
        tx.tx_burst(&mut out);
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect();

    let received: u64 = seen.iter().map(|s| s.frames).sum();
    let bad_hash: u64 = seen.iter().map(|s| s.bad_hash).sum();
    let mut queue_of: HashMap<u16, usize> = HashMap::new();
    let mut split_flows = 0;
    for (q, s) in seen.iter().enumerate() {
        for &flow in s.flows.keys() {
            if queue_of.insert(flow, q).is_some() {
                split_flows += 1;
            }
        }
    }
    let dev = receiver.stats().device_drops;
    println!(
        "sent {sent} frames of {} flows ({refused} refused by a full TX ring), received {received}, \
         device drops {}",
        args.flows,
        dev.total() + sender.stats().device_drops.total()
    );
    for (q, s) in seen.iter().enumerate() {
        println!("queue {q}: {} frames, {} flows", s.frames, s.flows.len());
    }
    println!("frames with a wrong hash: {bad_hash}; flows seen on two queues: {split_flows}");
    let accounted = received + dev.total() + sender.stats().device_drops.total() == sent;
    drop((tx, out));
    sender.close();
    receiver.close();
    lcache::flush();
    println!("mbufs still in use: {}", pool.in_use());
    if bad_hash > 0 || split_flows > 0 || !accounted || pool.in_use() != 0 {
        std::process::exit(1);
    }
    Ok(())
}
