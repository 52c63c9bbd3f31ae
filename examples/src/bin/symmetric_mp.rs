//! DPDK's symmetric_mp on the pmd API: one primary and N-1 secondary processes forward
//! between two ports, each on its own queue pair (the primary on pair 0, secondary k on pair
//! k), with one mbuf pool shared by all of them. RSS spreads the flows over the pairs.
//!
//! To stay self-contained, the primary also plays the traffic generator: the forwarding
//! ports are device-model ports (MANA, or mlx5 with `--device mlx5`) whose cables lead to
//! two more ports in the primary,
//! which send numbered frames in and count them out. It starts the secondaries itself (this
//! same program, `--proc-type secondary`); each stops when the primary does.
//!
//!     cargo run -p examples --bin symmetric_mp -- --num-procs 3

use mempool::lcache;
use mempool::{MbufPool, MbufPoolConfig, PagePolicy};
use pmd::mp::{MpConfig, Primary, Secondary};
use pmd::port::attach::AttachedPair;
use pmd::port::{Burst, Port, PortConfig, RxQueue, TxQueue};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const HELP: &str = "symmetric_mp: DPDK's symmetric multi-process forwarder on the pmd API.

A primary and N-1 secondaries forward between two device-model ports, each process on
its own queue pair of both (flows spread by RSS), with one shared mbuf pool. The primary
also sends 10000 numbered frames in and checks that every one comes out (or is counted
missed by a port), and that every mbuf is back in the pool at the end.

Usage: symmetric_mp [--num-procs N] [--device mana|mlx5]
         --num-procs N     N processes in all (1..=8, default 3; 1, 2, 4 or 8 on mlx5,
                           whose RSS table holds each queue once)
         --device D        the ports' device model: mana (default) or mlx5
       symmetric_mp --help";

/// Frames the primary sends through the forwarders.
const FRAMES: u32 = 10_000;
const PREFIX: &str = "symmetric_mp";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["-h" | "--help"] => {
            println!("{HELP}");
            return;
        }
        ["--proc-type", "secondary", "--dir", dir] => secondary(Path::new(dir)),
        opts => {
            let (mut procs, mut device) = (3, "mana");
            for o in opts.chunks(2) {
                match o {
                    ["--num-procs", n] => match n.parse::<u16>() {
                        Ok(n @ 1..=8) => procs = n,
                        _ => usage(&format!("--num-procs takes 1 to 8, not '{n}'")),
                    },
                    ["--device", d @ ("mana" | "mlx5")] => device = d,
                    ["--device", d] => usage(&format!("--device takes mana or mlx5, not '{d}'")),
                    other => usage(&format!("unexpected arguments {other:?}")),
                }
            }
            if device == "mlx5" && !procs.is_power_of_two() {
                usage(&format!(
                    "--num-procs {procs} with --device mlx5: the mlx5 RSS table needs 1, 2, 4 \
                     or 8 queues"
                ));
            }
            primary(procs, device)
        }
    };
    if let Err(e) = result {
        eprintln!("symmetric_mp: {e}");
        std::process::exit(1);
    }
}

fn usage(why: &str) -> ! {
    eprintln!("symmetric_mp: {why}\n\n{HELP}");
    std::process::exit(2);
}

type Error = Box<dyn std::error::Error>;

/// The primary: ports, pool, the secondaries, the traffic and the verdict.
fn primary(procs: u16, device: &str) -> Result<(), Error> {
    pmd::log::init("warn");
    let dir = std::env::temp_dir().join(format!("symmetric_mp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_primary(procs, device, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_primary(procs: u16, device: &str, dir: &Path) -> Result<(), Error> {
    let pool = MbufPool::new(
        MbufPoolConfig::new("symmetric_mp", 8191)
            .page_policy(PagePolicy::Normal)
            .shared_file(dir.join("mbufs")),
    )?;
    // Forwarding ports 0 and 1 (engine on its own thread: it serves the secondaries' queues
    // too); their cables lead to the generator's ports 2 and 3.
    let spec = |cable: &str, mac: u8| -> Result<pmd::port::PortSpec, Error> {
        Ok(format!(
            "emu-{device}:wire=loop:{cable}-{},engine=thread,mac=02:00:00:00:00:0{mac}",
            std::process::id()
        )
        .parse()?)
    };
    let fwd_cfg = PortConfig::default()
        .with_ring_sizes(256, 256)
        .with_queues(procs, procs)
        .with_export((1..procs).collect(), dir);
    let mut fwd = Vec::new();
    for (id, cable) in ["a", "b"].into_iter().enumerate() {
        let mut p = Port::open(id as u16, &spec(cable, id as u8 + 1)?)?;
        let cfg = if procs > 1 {
            fwd_cfg.clone()
        } else {
            PortConfig::default().with_ring_sizes(256, 256)
        };
        p.configure(&cfg, &pool)?;
        fwd.push(p);
    }
    let mut gen = Vec::new();
    for (id, cable) in ["a", "b"].into_iter().enumerate() {
        let mut p = Port::open(id as u16 + 2, &spec(cable, id as u8 + 3)?)?;
        p.configure(&PortConfig::default().with_ring_sizes(1024, 256), &pool)?;
        gen.push(p);
    }
    let mut mine = pair_of(&mut fwd)?;
    let (mut gen_tx, mut gen_rx) = (gen[0].tx_queue(0)?, gen[1].rx_queue(0)?);
    for p in fwd.iter_mut().chain(gen.iter_mut()) {
        p.start()?;
    }

    let mp = Primary::start(&MpConfig::new(PREFIX).with_dir(dir))?;
    for p in &fwd {
        mp.publish(p.id(), p.name(), procs, &[0]);
        if let Some(d) = p.device() {
            mp.publish_device(p.id(), d.fd, d.generation)?;
        }
    }
    mp.share_pool(&pool)?;
    let mut children: Vec<Child> = (1..procs)
        .map(|_| {
            Command::new(std::env::current_exe()?)
                .args(["--proc-type", "secondary", "--dir"])
                .arg(dir)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    // Every secondary has its pairs before traffic starts.
    let t0 = Instant::now();
    let taken = |port: u16| {
        mp.owners(port).map_or(0, |o| {
            o.iter()
                .filter(|o| matches!(o, pmd::mp::Owner::Secondary(_)))
                .count()
        })
    };
    while taken(0) + 1 < usize::from(procs) || taken(1) + 1 < usize::from(procs) {
        if t0.elapsed() > Duration::from_secs(20) {
            return Err("the secondaries did not take their queue pairs within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Numbered frames of many flows in at port 2; count them out at port 3.
    let (mut sent, mut out) = (0u32, vec![false; FRAMES as usize]);
    let (mut burst, mut got) = (Burst::with_capacity(32), Burst::with_capacity(32));
    let t0 = Instant::now();
    while out.iter().filter(|x| **x).count() < FRAMES as usize
        && t0.elapsed() < Duration::from_secs(30)
    {
        while sent < FRAMES && burst.len() < 16 {
            let mut m = lcache::alloc(&pool).ok_or("pool empty")?;
            m.extend_from_slice(&frame(sent))?;
            burst.push(m).map_err(|_| "burst full")?;
            sent += 1;
        }
        gen_tx.tx_burst(&mut burst);
        forward(&mut mine, &pool);
        while gen_rx.rx_burst(&mut got) > 0 {
            for m in got.iter() {
                if let Some(n) = seq_of(m) {
                    out[n as usize] = true;
                }
            }
            lcache::with_cache(&pool, |c| got.free_all(c));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let arrived = out.iter().filter(|x| **x).count();
    // The secondaries publish their counters every 20 ms.
    std::thread::sleep(Duration::from_millis(100));
    let stats = fwd[0].stats();
    // Frames no port had a buffer posted for when they came (the receiving end's rings are
    // refilled in batches; several forwarders can outrun it): counted, not lost silently.
    let missed: u64 = fwd.iter().chain(&gen).map(|p| p.stats().imissed).sum();
    // Stop: our queues first, then tell the secondaries (their buffers can come back).
    drop(burst);
    drop((mine, gen_tx, gen_rx));
    drop(fwd);
    drop(gen);
    mp.shutdown_closed("symmetric_mp: done");
    let mut failed = 0;
    for c in &mut children {
        failed += usize::from(!c.wait()?.success());
    }
    println!(
        "symmetric_mp: {procs} processes, {arrived} of {FRAMES} frames forwarded, {missed} \
         missed by a port with no buffer posted"
    );
    for (q, s) in stats.rx_queues.iter().enumerate() {
        let who = if q == 0 {
            "primary".to_string()
        } else {
            format!("secondary {q}")
        };
        println!(
            "  queue pair {q} ({who}): {} frames in on port 0",
            s.packets
        );
    }
    let in_use = pool.in_use();
    println!("  mbufs still in use: {in_use}");

    if failed > 0 {
        return Err(format!("{failed} secondaries failed").into());
    }
    if arrived as u64 + missed != u64::from(FRAMES) || in_use != 0 {
        return Err("frames unaccounted for, or mbufs that did not come back".into());
    }
    Ok(())
}

/// A secondary: pair k of both ports, forwarded until the primary stops.
fn secondary(dir: &Path) -> Result<(), Error> {
    pmd::log::init("warn");
    let socket = dir.join(pmd::mp::SOCKET_NAME);
    let mut s = Secondary::attach_at(&socket, PREFIX, "symmetric_mp")?;
    let pool = s
        .pool("symmetric_mp")
        .ok_or("the primary shares no pool")?
        .clone();
    let q0 = s.claim(0, None)?;
    let q1 = s.claim(1, Some(q0))?;
    let mut pairs = [
        AttachedPair::open(dir, 0, q0, &pool, s.device(0))?,
        AttachedPair::open(dir, 1, q1, &pool, s.device(1))?,
    ];
    let mut burst = Burst::with_capacity(32);
    let mut n = 0u64;
    let mut published = Instant::now();
    while s.primary_gone().is_none() {
        let [a, b] = &mut pairs;
        for (from, to) in [(&mut a.rx, &mut b.tx), (&mut b.rx, &mut a.tx)] {
            n += from.rx_burst(&mut burst) as u64;
            to.tx_burst(&mut burst);
            lcache::with_cache(&pool, |c| burst.free_all(c));
        }
        if published.elapsed() > Duration::from_millis(20) {
            // Where the primary's port statistics read them.
            pairs.iter().for_each(AttachedPair::publish_stats);
            published = Instant::now();
        }
    }
    drop(burst);
    eprintln!("symmetric_mp: secondary {q0}: forwarded {n} frames");
    if s.primary_closed_queues() {
        // The primary destroyed the rings: what they held comes back to the pool.
        pairs.into_iter().for_each(AttachedPair::drop_destroyed);
    }
    lcache::flush();
    Ok(())
}

/// The primary's own pair: queue 0 of both forwarding ports.
struct OwnPair {
    rx: [RxQueue; 2],
    tx: [TxQueue; 2],
    burst: Burst,
}

fn pair_of(ports: &mut [Port]) -> Result<OwnPair, Error> {
    Ok(OwnPair {
        rx: [ports[0].rx_queue(0)?, ports[1].rx_queue(0)?],
        tx: [ports[0].tx_queue(0)?, ports[1].tx_queue(0)?],
        burst: Burst::with_capacity(32),
    })
}

fn forward(p: &mut OwnPair, pool: &std::sync::Arc<MbufPool>) {
    for src in 0..2 {
        p.rx[src].rx_burst(&mut p.burst);
        p.tx[src ^ 1].tx_burst(&mut p.burst);
        lcache::with_cache(pool, |c| p.burst.free_all(c));
    }
}

/// Frame `n`: broadcast (every port takes it, forwarded untouched), UDP from port `n` (a
/// flow per frame, for RSS), its number in the payload.
fn frame(n: u32) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 3], [0xff; 6])
        .ipv4([169, 254, 7, 1], [169, 254, 7, 2], 64)
        .udp(1024 + (n % 50_000) as u16, 9)
        .write(&mut out, &n.to_be_bytes())
        .expect("a UDP frame");
    out
}

/// A frame's number, if it is one of ours.
fn seq_of(m: &mempool::Mbuf) -> Option<u32> {
    let b = m.get(42..46)?;
    let n = u32::from_be_bytes(b.try_into().ok()?);
    (n < FRAMES).then_some(n)
}
