//! l2fwd: forwards every frame that arrives on a port to its paired port (0<->1, 2<->3, ...),
//! optionally rewriting the MAC addresses, like DPDK's examples/l2fwd.

use apps::cli::{usage, Failure};
use apps::common::{
    announce_ready, device_lines, loss_lines, open_ports, si, stats_json, wait_links, Counter,
    EventWatch, Idle, PortSet,
};
use clap::Parser;
use mempool::lcache;
use pmd::lcore::{launch_each, CoreList, StopFlag};
use pmd::port::{Burst, Port, PortConfig, PortSpec, PortState, RxQueue, Stats, TxQueue};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Layer-2 forwarder: what arrives on port 0 leaves on port 1 and vice versa (then 2<->3 ...).
///
/// Ports are devargs strings: `emu-mana:wire=shm:NAME` (device model on a shared-memory cable),
/// `emu-mana:wire=afpacket:IFACE`, `null`, `mana:mac=..` (hardware). With MAC updating (the
/// default, as in DPDK's l2fwd) the destination MAC becomes `02:00:00:00:00:<egress port>` and
/// the source MAC the egress port's MAC; `--no-mac-updating` forwards frames untouched.
/// Stops on SIGINT/SIGTERM/SIGHUP/SIGQUIT or after `--duration`, and prints a summary (`--json`
/// for machines). A port taken over from its kernel netdev (`busy=takeover`) gives it back on
/// exit, also on a second signal.
///
/// Port events (link down/up, device failure or removal, recovery, queue errors) are logged
/// on stderr as they happen and listed in the `--json` report. A link that goes down does not
/// stop forwarding (frames are lost until it is back). A `mana:`/`mlx5:` port whose device is
/// reset or removed recovers by itself (`recover-timeout=`, default 120 s) while the other
/// ports go on forwarding; frames meant for it meanwhile are counted as `down_drops`. A port
/// that does not recover (a device model, or a device that stayed away past its timeout)
/// stops l2fwd with exit status 1, unless `--keep-running`.
///
/// While it runs, l2fwd answers on DPDK's telemetry socket (`pmd-telemetry`, or DPDK's
/// `dpdk-telemetry.py`): its ports' counters (`/ethdev/stats,0`), events, pool and lcores.
/// Two instances at once need two `--file-prefix`es.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A port, as a devargs string; give an even number of them (pairs 0-1, 2-3, ...).
    #[arg(long = "port", required = true, value_name = "SPEC")]
    ports: Vec<PortSpec>,
    /// Cores to poll on, e.g. `1` or `1-3,5`. RX queues are spread over them round-robin.
    #[arg(long, default_value = "0", value_name = "LIST")]
    lcores: CoreList,
    /// Packets per burst.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=512))]
    burst: u16,
    /// RX queues per port.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    rxq: u16,
    /// Descriptors per queue (a power of two).
    #[arg(long, default_value_t = 512, value_parser = apps::cli::ring_size)]
    ring_size: u16,
    /// Mbufs in the pool [default: every ring of every port full (queue counts from the
    /// devargs' rxq=/txq=), plus per-core caches and 4096 spare, rounded up to a power of two
    /// less one]. Must at least fill the RX rings.
    #[arg(long, value_parser = apps::cli::pool_size)]
    pool_size: Option<u32>,
    /// MTU of every port in bytes (68..=9000): 9000 for jumbo frames (up to 9018 bytes with
    /// a VLAN tag). The mbufs' data room is sized to hold the longest frame.
    #[arg(long, default_value_t = 1500, value_parser = apps::cli::mtu)]
    mtu: u16,
    /// Rewrite MAC addresses (default).
    #[arg(long, overrides_with = "no_mac_updating")]
    mac_updating: bool,
    /// Forward frames untouched (io forwarding).
    #[arg(long)]
    no_mac_updating: bool,
    /// Receive only frames for each port's own MAC and broadcast. By default a port that
    /// can (mlx5, the device models) receives every frame, as DPDK's l2fwd does.
    #[arg(long)]
    no_promiscuous: bool,
    /// Seconds between live statistics lines on stderr (0: none).
    #[arg(long, default_value_t = 1.0, value_parser = apps::cli::seconds)]
    stats_interval: f64,
    /// Seconds to wait for every port's link to come up before forwarding (a device-model
    /// port is down until the far end of its cable is attached, or while its afpacket
    /// interface is down); a port found down is reported at once. After the wait, warn and
    /// forward anyway (the link may come up later); 0: do not wait. The "ready" event
    /// (`--json`) comes after the wait: a script that starts the cables' far ends only once
    /// l2fwd is ready should pass 0.
    #[arg(long, visible_alias = "link-wait", default_value_t = 10.0, value_name = "S", value_parser = apps::cli::seconds)]
    link_timeout: f64,
    /// Stop after this many seconds (default: run until a stop signal).
    #[arg(long, value_parser = apps::cli::positive_seconds)]
    duration: Option<f64>,
    /// Never yield the CPU when idle (for dedicated cores).
    #[arg(long)]
    busy_poll: bool,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Keep forwarding between the other ports when a port is lost for good (its device
    /// failed and did not come back); l2fwd still exits with status 1 at the end, naming it.
    #[arg(long)]
    keep_running: bool,
    #[command(flatten)]
    telemetry: apps::telemetry::TelemetryArgs,
}

/// Per port counters of one core.
#[derive(Default)]
struct PortCounters {
    rx: Counter,
    tx: Counter,
    /// Frames the port's TX queue did not take (a full ring).
    dropped: Counter,
    /// Frames for the port while it had no device (recovering, or failed).
    down: Counter,
}

struct Work {
    rxqs: Vec<(usize, RxQueue)>,
    /// This core's TX queue on every port.
    txqs: Vec<TxQueue>,
}

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report("l2fwd"),
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    let np = args.ports.len();
    if np < 2 || !np.is_multiple_of(2) {
        return Err(usage(format!("{np} port(s) given: l2fwd forwards between pairs, give an even number (--port A --port B)")));
    }
    args.lcores.validate().map_err(|e| usage(e.to_string()))?;
    let cores = args.lcores.cores().len();
    let mac_updating = !args.no_mac_updating;
    let cfg = PortConfig::default()
        .with_queues(args.rxq, cores as u16)
        .with_ring_sizes(args.ring_size, args.ring_size)
        .with_promiscuous(!args.no_promiscuous)
        .with_mtu(args.mtu);
    // Stop signals are guarded before the first port opens: from then on a taken-over netdev
    // is given back however the process stops (first signal: clean stop; second: clean stop without the drain; third: at once).
    let stop = StopFlag::new();
    stop.on_signals().map_err(|e| e.to_string())?;
    // Before any device is touched, as DPDK's EAL does: a prefix in use fails the start.
    let mut telemetry = apps::telemetry::start("l2fwd", &args.telemetry)?;
    let PortSet { mut ports, pool } =
        open_ports("l2fwd", &args.ports, &cfg, cores, args.pool_size)?;
    let macs: Vec<[u8; 6]> = ports.iter().map(|p| p.mac().0).collect();

    // Hand out queues: RX queues round-robin over cores; every core its own TX queue per port.
    let mut work: Vec<Work> = (0..cores)
        .map(|_| Work {
            rxqs: Vec::new(),
            txqs: Vec::new(),
        })
        .collect();
    let mut next = 0;
    for (p, port) in ports.iter_mut().enumerate() {
        let nrx = port.config().map_or(1, |c| c.rx_queues);
        for q in 0..nrx {
            work[next % cores]
                .rxqs
                .push((p, port.rx_queue(q).map_err(|e| e.to_string())?));
            next += 1;
        }
    }
    for (c, w) in work.iter_mut().enumerate() {
        for port in ports.iter_mut() {
            w.txqs
                .push(port.tx_queue(c as u16).map_err(|e| e.to_string())?);
        }
    }
    for port in &mut ports {
        port.start().map_err(|e| e.to_string())?;
    }
    // pmd-dumpcap's socket: captures of what the ports receive and send, while l2fwd runs.
    let capture = apps::telemetry::capture("l2fwd", &args.telemetry, telemetry.as_ref(), &ports)?;
    // Forward anyway when a link stays down: it may come up later (a peer started late).
    if let Err(down) = wait_links(
        "l2fwd",
        &ports,
        Duration::from_secs_f64(args.link_timeout),
        &stop,
    ) {
        eprintln!("l2fwd: warning: forwarding with a link down:\n{down}");
    }
    announce_ready("l2fwd", &args.ports, &ports, args.json);
    let counters: Arc<Vec<Vec<PortCounters>>> = Arc::new(
        (0..cores)
            .map(|_| (0..np).map(|_| PortCounters::default()).collect())
            .collect(),
    );
    if let Some(t) = &telemetry {
        t.watch_pool(&pool).map_err(|e| e.to_string())?;
        let (c, lcores) = (Arc::clone(&counters), args.lcores.cores().to_vec());
        t.register("/pmd/lcores", LCORES_HELP, move |_| {
            Ok(lcores_answer(&c, &lcores))
        })
        .map_err(|e| e.to_string())?;
    }
    if !args.json {
        eprintln!(
            "l2fwd: {np} ports, lcores {}, burst {}, mac updating {}",
            args.lcores,
            args.burst,
            if mac_updating { "on" } else { "off" }
        );
    }

    let t0 = Instant::now();
    let mut events = EventWatch::new("l2fwd", &ports, t0);
    let mut fatal = None;
    let stopped_at = std::cell::Cell::new(None);
    let burst = usize::from(args.burst);
    let busy = args.busy_poll;
    let c2 = Arc::clone(&counters);
    launch_each(
        &args.lcores,
        &stop,
        work,
        |lcore, mut w: Work| {
            let mine = &c2[lcore.index];
            let mut b = Burst::with_capacity(burst);
            let mut idle = Idle::new(busy);
            while !lcore.stop.is_set() {
                let mut moved = false;
                for (src, rx) in &mut w.rxqs {
                    let n = rx.rx_burst(&mut b);
                    if n == 0 {
                        continue;
                    }
                    moved = true;
                    mine[*src].rx.add(n as u64);
                    let dst = *src ^ 1;
                    if mac_updating {
                        for m in b.iter_mut() {
                            let d = m.data_mut();
                            if d.len() >= 12 {
                                d[..6].copy_from_slice(&[2, 0, 0, 0, 0, dst as u8]);
                                d[6..12].copy_from_slice(&macs[dst]);
                            }
                        }
                    }
                    let sent = w.txqs[dst].tx_burst(&mut b);
                    mine[dst].tx.add(sent as u64);
                    if !b.is_empty() {
                        if w.txqs[dst].port_running() {
                            mine[dst].dropped.add(b.len() as u64);
                        } else {
                            mine[dst].down.add(b.len() as u64);
                        }
                        lcache::with_cache(&pool, |c| b.free_all(c));
                    }
                }
                if !moved {
                    // Idle: reclaim what the TX queues sent (a queue no frame was for gets
                    // no burst otherwise), which is also when a queue whose port recovered
                    // lets go of its dead device.
                    for tx in &mut w.txqs {
                        tx.tx_burst(&mut b);
                    }
                }
                idle.after(moved);
            }
            // Let in-flight packets complete so every buffer goes back to the pool.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(200) {
                for tx in &mut w.txqs {
                    tx.tx_burst(&mut b);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(w);
            lcache::flush();
        },
        |stop| {
            fatal = main_loop(
                args,
                &counters,
                t0,
                stop,
                &mut ports,
                &mut events,
                telemetry.as_ref(),
            );
            stopped_at.set(Some(t0.elapsed()));
            // Nothing answers the ports' questions from here on: the socket goes now, so
            // that a client sees the instance go instead of waiting for answers.
            drop(telemetry.take());
        },
    )
    .map_err(|e| e.to_string())?;
    drop(capture);
    let secs = stopped_at
        .get()
        .unwrap_or_else(|| t0.elapsed())
        .as_secs_f64();
    for p in &mut ports {
        p.stop();
    }
    // What each device dropped before l2fwd saw it (imissed: no RX buffer, or a full ring
    // under the port, such as the kernel's on an afpacket wire), and its extended counters.
    let port_stats: Vec<Stats> = ports.iter().map(Port::stats).collect();
    // A capture that failed since the main loop last looked (reading the statistics above
    // wrote out what the capture still buffered): its event is there now.
    let _ = events.wait(&mut ports, Duration::ZERO);
    let ends: Vec<PortEnd> = ports
        .iter()
        .map(|p| PortEnd {
            state: p.state(),
            recoveries: p.recoveries(),
            failure: p.failure().map(str::to_string),
        })
        .collect();
    drop(ports);
    let in_use = pool.in_use();
    report(args, &counters, &port_stats, &ends, secs, in_use, &events);
    if let Some(f) = fatal {
        return Err(f.into());
    }
    if in_use != 0 {
        return Err(format!("{in_use} mbufs were not returned to the pool").into());
    }
    if let Some(f) = events.capture_failure() {
        return Err(f.into());
    }
    Ok(())
}

/// One port's counters summed over the cores.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    rx: u64,
    tx: u64,
    dropped: u64,
    down: u64,
}

const LCORES_HELP: &str = "Per polling core (lcore index, CPU), per port: frames received \
    (rx) and sent (tx), not taken by a full TX ring (dropped), and meant for a port without \
    its device (down_drops). No parameter.";

/// `/pmd/lcores`: the counters each polling core keeps (read as the statistics line reads
/// them; the cores are not involved).
fn lcores_answer(counters: &[Vec<PortCounters>], cpus: &[usize]) -> pmd::telemetry::Data {
    use pmd::telemetry::Data;
    Data::Array(
        counters
            .iter()
            .zip(cpus)
            .enumerate()
            .map(|(i, (ports, cpu))| {
                let ports = ports
                    .iter()
                    .enumerate()
                    .map(|(p, c)| {
                        Data::dict()
                            .with("port", p)
                            .with("rx", c.rx.get())
                            .with("tx", c.tx.get())
                            .with("dropped", c.dropped.get())
                            .with("down_drops", c.down.get())
                    })
                    .collect::<Vec<_>>();
                Data::dict()
                    .with("lcore", i)
                    .with("cpu", *cpu)
                    .with("ports", ports)
            })
            .collect(),
    )
}

fn totals(counters: &[Vec<PortCounters>], np: usize) -> Vec<Totals> {
    (0..np)
        .map(|p| {
            counters.iter().fold(Totals::default(), |t, c| Totals {
                rx: t.rx + c[p].rx.get(),
                tx: t.tx + c[p].tx.get(),
                dropped: t.dropped + c[p].dropped.get(),
                down: t.down + c[p].down.get(),
            })
        })
        .collect()
}

/// Statistics and port events until a stop, the deadline or a port lost for good (whose
/// message it returns; with `--keep-running` the first such message is returned at the end).
fn main_loop(
    args: &Args,
    counters: &Arc<Vec<Vec<PortCounters>>>,
    t0: Instant,
    stop: &StopFlag,
    ports: &mut [Port],
    events: &mut EventWatch,
    telemetry: Option<&pmd::telemetry::Telemetry>,
) -> Option<String> {
    let np = ports.len();
    let deadline = args.duration.map(Duration::from_secs_f64);
    let interval = (args.stats_interval > 0.0 && !args.json)
        .then(|| Duration::from_secs_f64(args.stats_interval));
    let mut last = totals(counters, np);
    let mut last_t = Instant::now();
    let mut lost = None;
    while !stop.is_set() && deadline.is_none_or(|d| t0.elapsed() < d) {
        // Port events are watched here, never on the polling cores (which is also where a
        // recovering port looks for its device): a link that goes down is logged and
        // forwarding goes on; a port lost for good stops the run (or not: --keep-running).
        if let Some(f) = events.wait(ports, Duration::from_millis(20)) {
            if !args.keep_running {
                return Some(f);
            }
            lost.get_or_insert(f);
        }
        // A capture that stopped recording (a full disk) stops the run: it is not the
        // capture that was asked for.
        if let Some(f) = events.capture_failure() {
            return Some(f.to_string());
        }
        // Telemetry's questions about the ports, answered here where the ports are.
        apps::telemetry::serve(telemetry, ports, events);
        if let Some(iv) = interval {
            if last_t.elapsed() >= iv {
                let now = totals(counters, np);
                let dt = last_t.elapsed().as_secs_f64();
                let mut line = format!("[{:6.1}s]", t0.elapsed().as_secs_f64());
                for (p, (n, l)) in now.iter().zip(&last).enumerate() {
                    // What the device dropped before l2fwd saw a frame, or after it sent it.
                    let s = ports[p].stats();
                    let d = s.device_drops;
                    line += &format!(
                        "  p{p} rx {} ({}pps) tx {} ({}pps) drop {} missed {} dev-drop tx {} rx {}",
                        n.rx,
                        si((n.rx - l.rx) as f64 / dt),
                        n.tx,
                        si((n.tx - l.tx) as f64 / dt),
                        n.dropped,
                        s.imissed,
                        d.tx,
                        d.rx
                    );
                    if n.down > 0 || ports[p].state() != PortState::Started {
                        line += &format!(" down-drop {} ({:?})", n.down, ports[p].state());
                    }
                }
                eprintln!("{line}");
                last = now;
                last_t = Instant::now();
            }
        }
    }
    lost
}

/// What the report says of each port besides its counters.
struct PortEnd {
    state: PortState,
    recoveries: u64,
    failure: Option<String>,
}

fn report(
    args: &Args,
    counters: &[Vec<PortCounters>],
    port_stats: &[Stats],
    ends: &[PortEnd],
    secs: f64,
    in_use: u32,
    events: &EventWatch,
) {
    let t = totals(counters, port_stats.len());
    let rx: u64 = t.iter().map(|x| x.rx).sum();
    let tx: u64 = t.iter().map(|x| x.tx).sum();
    let dropped: u64 = t.iter().map(|x| x.dropped).sum();
    let down: u64 = t.iter().map(|x| x.down).sum();
    let recoveries: u64 = ends.iter().map(|e| e.recoveries).sum();
    let missed: u64 = port_stats.iter().map(|s| s.imissed).sum();
    // Every frame a device dropped, sending or receiving (imissed included).
    let dev_drops: u64 = port_stats.iter().map(|s| s.device_drops.total()).sum();
    if args.json {
        let ports: Vec<_> = t
            .iter()
            .zip(port_stats)
            .enumerate()
            .map(|(p, (t, s))| {
                let xstats: serde_json::Map<String, serde_json::Value> = s
                    .xstats
                    .iter()
                    .map(|(n, v)| (n.clone(), (*v).into()))
                    .collect();
                let e = &ends[p];
                serde_json::json!({"port": p, "rx_packets": t.rx, "tx_packets": t.tx,
                    "dropped": t.dropped, "down_drops": t.down, "imissed": s.imissed,
                    "state": format!("{:?}", e.state).to_lowercase(),
                    "recoveries": e.recoveries, "failure": e.failure,
                    "xstats": xstats, "stats": stats_json(s)})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "rx_packets": rx, "tx_packets": tx, "dropped": dropped, "imissed": missed,
                "down_drops": down, "recoveries": recoveries,
                "device_drops": dev_drops,
                "duration_s": secs, "pps": tx as f64 / secs, "ports": ports,
                "pool_in_use": in_use, "events": events.json(),
            })
        );
    } else {
        println!(
            "l2fwd summary: {secs:.2} s, rx {rx}, tx {tx}, dropped {dropped}, missed {missed}, device drops {dev_drops}, {}pps forwarded",
            si(tx as f64 / secs)
        );
        for (p, (t, s)) in t.iter().zip(port_stats).enumerate() {
            let dd = s.device_drops;
            println!(
                "  port {p}: rx {} tx {} dropped {} missed {} device drops tx {} rx {}",
                t.rx, t.tx, t.dropped, s.imissed, dd.tx, dd.rx
            );
            let e = &ends[p];
            if t.down > 0 || e.recoveries > 0 || e.state != PortState::Configured {
                println!(
                    "    while without its device: {} frames not sent; recoveries {}; state at exit {:?}{}",
                    t.down,
                    e.recoveries,
                    e.state,
                    e.failure.as_deref().map(|f| format!(" ({f})")).unwrap_or_default()
                );
            }
        }
        for line in device_lines(port_stats)
            .into_iter()
            .chain(loss_lines(port_stats))
        {
            println!("{line}");
        }
        println!("  mbufs still in use at exit: {in_use}");
        if !events.seen().is_empty() {
            println!("  port events: {}", events.seen().len());
        }
    }
}
