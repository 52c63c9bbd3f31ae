//! Framework overhead: io forwarding between two null ports on one pinned core, the same
//! experiment as `dpdk-testpmd --vdev net_null0 --vdev net_null1 --forward-mode=io`.

use clap::Parser;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::lcore::{available_cores, launch_each, CoreList, StopFlag};
use pmd::port::{Burst, Port, PortConfig, RxQueue, TxQueue};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Forward packets between two null ports (rx burst from port 0, tx burst to port 1, and the
/// other way), 32-packet bursts, no touching of packet data; print forwarded packets per
/// second. A stand-in for testpmd's io forwarding over net_null, to compare framework costs.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0, value_parser = apps::cli::positive_seconds)]
    duration: f64,
    /// Core to forward on (default: the last usable core, leaving core 0 as the main core).
    #[arg(long)]
    core: Option<usize>,
    /// Packets per burst.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=512))]
    burst: u16,
    /// Frame size the null ports hand out.
    #[arg(long, default_value_t = 64)]
    size: u16,
    /// Print one JSON object: {"pps": .., "duration_s": ..}.
    #[arg(long)]
    json: bool,
    /// Stop after this many rounds of two forwarding bursts (one each way) instead of after
    /// --duration: a fixed amount of work, for instruction counts (`valgrind
    /// --tool=callgrind`), which are then the same from run to run.
    #[arg(long, value_name = "N")]
    rounds: Option<u64>,
    /// Capture every frame of both directions of the forwarding (`pmd::capture`, what
    /// `pmd-dumpcap` turns on in a running app), the rings drained on the forwarding core
    /// after each round: the cost of a mirrored frame, for `valgrind --tool=callgrind
    /// --toggle-collect='*Mirror*'` (the drain is not in the mirror functions).
    #[arg(long)]
    capture: bool,
}

type Queues = (RxQueue, TxQueue, RxQueue, TxQueue);
/// The capture's memory, its ring readers and a frame buffer (`--capture`).
type Drain = (
    pmd::sys::DevMem,
    Vec<pmd::capture::ring::RingReader>,
    Vec<pmd::capture::ring::Frame>,
);

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("null_fwd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let core = args
        .core
        .unwrap_or_else(|| *available_cores().last().unwrap_or(&0));
    let cores: CoreList = core.to_string().parse()?;
    let pool = MbufPool::new(MbufPoolConfig::new("null_fwd", 8192))?;
    let cfg = PortConfig::default().with_ring_sizes(1024, 1024);
    let spec = format!("null:size={}", args.size).parse()?;
    let mut p0 = Port::open(0, &spec)?;
    let mut p1 = Port::open(1, &spec)?;
    p0.configure(&cfg, &pool)?;
    p1.configure(&cfg, &pool)?;
    let queues: Queues = (
        p0.rx_queue(0)?,
        p0.tx_queue(0)?,
        p1.rx_queue(0)?,
        p1.tx_queue(0)?,
    );
    p0.start()?;
    p1.start()?;
    let capture = if args.capture {
        use pmd::capture::bpf::Program;
        use pmd::capture::ring::{Direction, RingId};
        let rings = vec![
            RingId {
                port: 0,
                queue: 0,
                dir: Direction::Rx,
            },
            RingId {
                port: 1,
                queue: 0,
                dir: Direction::Tx,
            },
            RingId {
                port: 1,
                queue: 0,
                dir: Direction::Rx,
            },
            RingId {
                port: 0,
                queue: 0,
                dir: Direction::Tx,
            },
        ];
        let (session, file) = pmd::capture::Session::new(
            rings,
            16 << 20,
            65535,
            Program::accept_all(),
            std::process::id(),
        )?;
        p0.capture_target()
            .tap
            .attach(&session)
            .map_err(|_| "capture busy")?;
        p1.capture_target()
            .tap
            .attach(&session)
            .map_err(|_| "capture busy")?;
        Some((session, file))
    } else {
        None
    };
    let drain = capture
        .as_ref()
        .map(|(_, file)| -> Result<_, Box<dyn std::error::Error>> {
            let mem = pmd::sys::DevMem::map_file(file, file.metadata()?.len() as usize)?;
            let (layout, ids) = pmd::capture::ring::Layout::read(&mem)?;
            let readers: Vec<_> = (0..ids.len())
                .map(|r| pmd::capture::ring::RingReader::new(&mem, &layout, r))
                .collect();
            Ok((mem, readers, Vec::new()))
        })
        .transpose()?;
    let stop = StopFlag::new();
    stop.on_signals()?;
    let burst = usize::from(args.burst);
    let t0 = Instant::now();
    let deadline = Duration::from_secs_f64(args.duration);
    let rounds = args.rounds;
    let done = std::sync::atomic::AtomicBool::new(false);
    let forwarded = launch_each(
        &cores,
        &stop,
        vec![(queues, drain)],
        |lcore, ((mut rx0, mut tx0, mut rx1, mut tx1), mut drain): (Queues, Option<Drain>)| {
            let mut b = Burst::with_capacity(burst);
            let mut fwd = 0u64;
            let mut captured = 0u64;
            if let Some(n) = rounds {
                for _ in 0..n {
                    fwd += forward(&mut rx0, &mut tx1, &mut b, &pool);
                    fwd += forward(&mut rx1, &mut tx0, &mut b, &pool);
                    if let Some((mem, readers, frames)) = &mut drain {
                        for r in readers.iter_mut() {
                            captured += r.drain(mem, usize::MAX, frames).unwrap_or(0) as u64;
                            frames.clear();
                        }
                    }
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            }
            while rounds.is_none() && !lcore.stop.is_set() {
                for _ in 0..1024 {
                    fwd += forward(&mut rx0, &mut tx1, &mut b, &pool);
                    fwd += forward(&mut rx1, &mut tx0, &mut b, &pool);
                }
                if let Some((mem, readers, frames)) = &mut drain {
                    for r in readers.iter_mut() {
                        captured += r.drain(mem, usize::MAX, frames).unwrap_or(0) as u64;
                        frames.clear();
                    }
                }
            }
            mempool::lcache::flush();
            if drain.is_some() {
                eprintln!("null_fwd: {captured} frames captured");
            }
            fwd
        },
        |stop| {
            while !stop.is_set()
                && !done.load(std::sync::atomic::Ordering::Acquire)
                && (rounds.is_some() || t0.elapsed() < deadline)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        },
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let pps = forwarded[0] as f64 / secs;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"pps": pps.round(), "duration_s": secs})
        );
    } else {
        println!(
            "forwarded {} packets in {secs:.2} s on core {core}: {:.2} Mpps",
            forwarded[0],
            pps / 1e6
        );
    }
    drop((p0, p1));
    if pool.in_use() != 0 {
        return Err(format!("{} mbufs not returned to the pool", pool.in_use()).into());
    }
    Ok(())
}

#[inline]
fn forward(
    rx: &mut RxQueue,
    tx: &mut TxQueue,
    b: &mut Burst,
    pool: &std::sync::Arc<MbufPool>,
) -> u64 {
    let n = rx.rx_burst(b);
    if n == 0 {
        return 0;
    }
    let sent = tx.tx_burst(b);
    // What the device did not take is dropped (testpmd frees it too).
    if !b.is_empty() {
        mempool::lcache::with_cache(pool, |cache| b.free_all(cache));
    }
    sent as u64
}
