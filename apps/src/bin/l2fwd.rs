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
///
/// Multi-process, as DPDK's `--proc-type`: `--proc-type primary` opens the ports, polls one
/// queue pair of each per lcore and leaves `--secondaries` more of each to worker processes;
/// `l2fwd --proc-type secondary --file-prefix P` (no `--port`) attaches to the primary with
/// that prefix, takes the next free queue pair of every port (or those `--queues` names) and
/// forwards on them from its first lcore, with the primary's mbuf pool. A worker stops with a
/// signal (it gives its queue pairs back, which the primary rebuilds) or when the primary
/// stops. MANA and mlx5 ports (a device model needs `engine=thread`).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A port, as a devargs string; give an even number of them (pairs 0-1, 2-3, ...). Not
    /// with `--proc-type secondary` (it uses its primary's ports).
    #[arg(long = "port", value_name = "SPEC")]
    ports: Vec<PortSpec>,
    /// Multi-process role (see above); without it, l2fwd is a process of its own.
    #[arg(long, value_enum, value_name = "ROLE")]
    proc_type: Option<ProcType>,
    /// With `--proc-type primary`: queue pairs of every port left to secondaries, after the
    /// one per lcore the primary polls.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=15))]
    secondaries: u16,
    /// With `--proc-type secondary`: the queue pair to take, of every port (`3`) or of each
    /// port in order (`3,2`) [default: the next free one of each].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    queues: Vec<u16>,
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

/// `--proc-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProcType {
    /// Opens the ports; exports queue pairs to secondaries.
    Primary,
    /// Attaches to a primary's ports and pool.
    Secondary,
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

/// How long a secondary waits for a queue pair's description while the primary rebuilds it.
const ATTACH_WAIT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    let result = if args.proc_type == Some(ProcType::Secondary) {
        secondary::run(&args)
    } else {
        run(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report("l2fwd"),
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    if !args.queues.is_empty() {
        return Err(usage(
            "--queues is for --proc-type secondary (which queue pairs of its primary's ports to take)",
        ));
    }
    let np = args.ports.len();
    if np < 2 || !np.is_multiple_of(2) {
        return Err(usage(format!("{np} port(s) given: l2fwd forwards between pairs, give an even number (--port A --port B)")));
    }
    args.lcores.validate().map_err(|e| usage(e.to_string()))?;
    let cores = args.lcores.cores().len();
    let mac_updating = !args.no_mac_updating;
    let primary = args.proc_type == Some(ProcType::Primary);
    // A primary: one queue pair per lcore of every port, then the secondaries' pairs,
    // exported into the runtime directory (where its control socket and pool file are).
    let pairs = cores as u16 + args.secondaries;
    let run_dir = pmd::telemetry::runtime_dir(&args.telemetry.file_prefix);
    let mut cfg = PortConfig::default()
        .with_queues(args.rxq, cores as u16)
        .with_ring_sizes(args.ring_size, args.ring_size)
        .with_promiscuous(!args.no_promiscuous)
        .with_mtu(args.mtu);
    if primary {
        if args
            .ports
            .iter()
            .any(|s| s.rxq.is_some() || s.txq.is_some())
        {
            return Err(usage(
                "--proc-type primary sets every port's queue pairs (one per lcore, plus \
                 --secondaries): leave rxq=/txq= out of the devargs",
            ));
        }
        std::fs::create_dir_all(&run_dir)
            .map_err(|e| format!("runtime directory {}: {e}", run_dir.display()))?;
        cfg = cfg
            .with_queues(pairs, pairs)
            .with_export((cores as u16..pairs).collect(), &run_dir);
    }
    // Stop signals are guarded before the first port opens: from then on a taken-over netdev
    // is given back however the process stops (first signal: clean stop; second: clean stop without the drain; third: at once).
    let stop = StopFlag::new();
    stop.on_signals().map_err(|e| e.to_string())?;
    // Before any device is touched, as DPDK's EAL does: a prefix in use fails the start.
    let mut telemetry = apps::telemetry::start("l2fwd", &args.telemetry)?;
    // The control socket first: a second primary of the prefix is refused before it touches
    // the first one's pool file or rings.
    let mut workers = if primary {
        Some(Workers::listen(args)?)
    } else {
        None
    };
    let pool_file = primary.then(|| run_dir.join("l2fwd-mbufs"));
    let pool_cores = if primary { usize::from(pairs) } else { cores };
    let PortSet { mut ports, pool } = open_ports(
        "l2fwd",
        &args.ports,
        &cfg,
        pool_cores,
        args.pool_size,
        pool_file.as_deref(),
    )?;
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
        if primary {
            // Core c polls queue pair c of every port; the others are the secondaries'.
            for (c, w) in work.iter_mut().enumerate() {
                w.rxqs
                    .push((p, port.rx_queue(c as u16).map_err(|e| e.to_string())?));
            }
            continue;
        }
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
    if let Some(w) = &mut workers {
        w.offer(args, &ports, pairs, cores as u16, &pool)?;
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
                        rewrite_macs(&mut b, dst, &macs[dst]);
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
                workers.as_mut(),
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
    // Only now, with the queues destroyed: the secondaries may then give back what they
    // posted on theirs.
    let workers = workers.map(Workers::stop);
    let in_use = pool.in_use();
    report(
        args,
        &counters,
        &port_stats,
        &ends,
        secs,
        in_use,
        &events,
        workers,
    );
    if let Some(f) = fatal {
        return Err(f.into());
    }
    if in_use != 0 {
        let why = if workers.is_some_and(|w| w.killed > 0) {
            " (secondaries that were killed while polling: what they had posted was not returned)"
        } else {
            ""
        };
        return Err(format!("{in_use} mbufs were not returned to the pool{why}").into());
    }
    if let Some(f) = events.capture_failure() {
        return Err(f.into());
    }
    Ok(())
}

/// DPDK l2fwd's MAC updating: the destination becomes `02:00:00:00:00:<egress port>`, the
/// source the egress port's MAC.
fn rewrite_macs(b: &mut Burst, dst: usize, mac: &[u8; 6]) {
    for m in b.iter_mut() {
        let d = m.data_mut();
        if d.len() >= 12 {
            d[..6].copy_from_slice(&[2, 0, 0, 0, 0, dst as u8]);
            d[6..12].copy_from_slice(mac);
        }
    }
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

/// A primary's side of its secondaries: the control socket, and what happened on it.
struct Workers {
    mp: pmd::mp::Primary,
    counts: WorkerCounts,
    /// The device generation published for each port (a recovery opens a new context, a
    /// new generation, which is published again).
    devices: Vec<(u16, u64)>,
    /// The pool the secondaries share.
    pool: Option<Arc<mempool::MbufPool>>,
    /// What each secondary that gave pairs back or died still holds: the ports of its pairs
    /// not rebuilt yet, and whether it died. A dead one's mbufs (posted on its pairs, in
    /// flight, in hand) are returned once every pair it gave back is rebuilt.
    held: std::collections::HashMap<u32, Held>,
    /// `Primary::dropped_events` when last looked at: a lost event could be a pair given back
    /// and never rebuilt, so no dead secondary's mbufs are returned after one.
    dropped: u64,
}

/// A secondary's pairs not rebuilt yet, and whether it died without a goodbye.
#[derive(Debug, Default)]
struct Held {
    unrebuilt: std::collections::BTreeSet<u16>,
    dead: bool,
}

/// What a primary's secondaries did.
#[derive(Debug, Clone, Copy, Default)]
struct WorkerCounts {
    /// Secondaries that attached.
    attached: u64,
    /// Secondaries that left without a goodbye (killed, or crashed).
    killed: u64,
    /// Queue rebuilds of a port after a secondary gave its queue pair back.
    rebuilds: u64,
    /// Mbufs of dead secondaries' caches returned to the pool.
    reclaimed: u64,
    /// Mbufs dead secondaries held outside their caches (posted, in flight), returned to
    /// the pool once their queue pairs were rebuilt.
    reclaimed_held: u64,
}

impl Workers {
    /// Starts the control socket of prefix `--file-prefix` (refused while another primary
    /// of the prefix runs).
    fn listen(args: &Args) -> Result<Self, Failure> {
        let mp = pmd::mp::Primary::start(&pmd::mp::MpConfig::new(&args.telemetry.file_prefix))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            mp,
            counts: WorkerCounts::default(),
            devices: Vec::new(),
            pool: None,
            held: std::collections::HashMap::new(),
            dropped: 0,
        })
    }

    /// Offers the secondaries the queue pairs `cores..pairs` of every port, and the pool.
    fn offer(
        &mut self,
        args: &Args,
        ports: &[Port],
        pairs: u16,
        cores: u16,
        pool: &Arc<mempool::MbufPool>,
    ) -> Result<(), Failure> {
        let kept: Vec<u16> = (0..cores).collect();
        for (p, spec) in ports.iter().zip(&args.ports) {
            self.mp.publish(p.id(), &spec.to_string(), pairs, &kept);
        }
        self.publish_devices(ports).map_err(|e| e.to_string())?;
        self.mp.share_pool(pool).map_err(|e| e.to_string())?;
        self.pool = Some(Arc::clone(pool));
        eprintln!(
            "l2fwd: primary: {} queue pair(s) of every port for secondaries (l2fwd --proc-type \
             secondary --file-prefix {})",
            pairs - cores,
            args.telemetry.file_prefix
        );
        Ok(())
    }

    /// Publishes each port's device descriptor that is not published yet: a `mana:` port's
    /// doorbell page is the device's, and secondaries map it from the context's command
    /// descriptor, which goes with each grant. After a recovery the port has a new one.
    fn publish_devices(&mut self, ports: &[Port]) -> Result<(), pmd::mp::MpError> {
        for p in ports {
            let Some(d) = p.device() else { continue };
            let known = self.devices.iter_mut().find(|(port, _)| *port == p.id());
            if known.as_ref().is_some_and(|(_, g)| *g == d.generation) {
                continue;
            }
            self.mp.publish_device(p.id(), d.fd, d.generation)?;
            match known {
                Some((_, g)) => {
                    *g = d.generation;
                    eprintln!("l2fwd: port {}: its new device descriptor published to the secondaries (the port was recovered)", p.id());
                }
                None => self.devices.push((p.id(), d.generation)),
            }
        }
        Ok(())
    }

    /// What happened on the control socket. A queue pair given back (its secondary left,
    /// or died) holds that secondary's state: its port's queues are rebuilt for the next
    /// one (the other secondaries on that port attach again to the new ones).
    fn serve(&mut self, ports: &mut [Port]) {
        use pmd::mp::{MpEvent, ReleaseWhy};
        if let Err(e) = self.publish_devices(ports) {
            eprintln!("l2fwd: warning: {e}");
        }
        let mut rebuild = Vec::new();
        for e in self.mp.events() {
            match e {
                MpEvent::Attached { pid, app } => {
                    self.counts.attached += 1;
                    eprintln!("l2fwd: secondary {pid} ({app}) attached");
                }
                MpEvent::Claimed { pid, port, queue } => {
                    eprintln!("l2fwd: secondary {pid} polls port {port} queue pair {queue}");
                }
                MpEvent::Released {
                    pid,
                    port,
                    queue,
                    why,
                } => {
                    eprintln!(
                        "l2fwd: secondary {pid} gave back port {port} queue pair {queue} ({why:?})"
                    );
                    if why != ReleaseWhy::Stopping {
                        if !rebuild.contains(&port) {
                            rebuild.push(port);
                        }
                        self.held.entry(pid).or_default().unrebuilt.insert(port);
                    }
                }
                MpEvent::Reclaimed { pid, pool, mbufs } => {
                    self.counts.reclaimed += u64::from(mbufs);
                    eprintln!(
                        "l2fwd: {mbufs} mbufs of dead secondary {pid}'s caches back to pool {pool}"
                    );
                }
                MpEvent::Detached { pid, clean } => {
                    if clean {
                        // It gave back what it had itself.
                        self.held.remove(&pid);
                    } else {
                        self.counts.killed += 1;
                        eprintln!("l2fwd: secondary {pid} is gone without a goodbye (killed?): the buffers it had posted come back once its queue pairs are rebuilt");
                        self.held.entry(pid).or_default().dead = true;
                    }
                }
            }
        }
        for p in rebuild {
            let Some(port) = ports.iter_mut().find(|x| x.id() == p) else {
                continue;
            };
            match port.rebuild_queues() {
                Ok(()) => {
                    self.counts.rebuilds += 1;
                    for h in self.held.values_mut() {
                        h.unrebuilt.remove(&p);
                    }
                }
                Err(e) => eprintln!("l2fwd: warning: port {p}: rebuilding its queues: {e}"),
            }
        }
        let dropped = self.mp.dropped_events();
        if dropped != self.dropped {
            self.dropped = dropped;
            if self.held.values().any(|h| h.dead) {
                eprintln!("l2fwd: warning: control events were lost: the buffers dead secondaries posted stay out of the pool (a pair given back may not be rebuilt)");
            }
            self.held.clear();
        }
        // A dead secondary's pairs, once all rebuilt (Released comes before Detached, and
        // each rebuild before this), are out of the device's reach. A pair whose rebuild
        // failed keeps its entry: its mbufs stay out (the device may still use them).
        let ready: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.dead && h.unrebuilt.is_empty())
            .map(|(&pid, _)| pid)
            .collect();
        for pid in ready {
            self.held.remove(&pid);
            reclaim_held(self.pool.as_ref(), pid, &mut self.counts);
        }
    }

    /// Tells the secondaries the ports' queues are destroyed (call once the ports are
    /// dropped), and waits up to 3 s for them to give back what they posted and exit.
    fn stop(mut self) -> WorkerCounts {
        // What the main loop did not see yet.
        for e in self.mp.events() {
            match e {
                pmd::mp::MpEvent::Detached { pid, clean: false } => {
                    self.counts.killed += 1;
                    self.held.entry(pid).or_default().dead = true;
                }
                pmd::mp::MpEvent::Reclaimed { mbufs, .. } => {
                    self.counts.reclaimed += u64::from(mbufs);
                }
                _ => {}
            }
        }
        let lost = self.mp.dropped_events() != self.dropped;
        let pids = self.mp.secondaries();
        let Workers {
            mp,
            mut counts,
            pool,
            held,
            ..
        } = self;
        mp.shutdown_closed("the l2fwd primary stopped");
        let t0 = Instant::now();
        while pids.iter().any(|&p| pmd::sys::net::process_alive(p))
            && t0.elapsed() < Duration::from_secs(3)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The ports are closed (every queue destroyed): whatever dead secondaries still held
        // can come back, unless a lost event leaves that in doubt.
        if !lost {
            for (pid, h) in held {
                if h.dead {
                    reclaim_held(pool.as_ref(), pid, &mut counts);
                }
            }
        }
        counts
    }
}

/// Returns what dead secondary `pid` held outside its caches to `pool` (its queue pairs are
/// destroyed: rebuilt, or the ports closed). Its connection can end a moment before the
/// process does (it is exiting): up to 200 ms for that. One that still runs lost its
/// connection only; its mbufs are its own.
fn reclaim_held(pool: Option<&Arc<mempool::MbufPool>>, pid: u32, counts: &mut WorkerCounts) {
    let Some(pool) = pool else { return };
    let t0 = Instant::now();
    loop {
        match pool.reclaim_owned(pid) {
            Ok(n) => {
                counts.reclaimed_held += u64::from(n);
                eprintln!(
                    "l2fwd: {n} mbufs dead secondary {pid} had posted or in flight back to pool {}",
                    pool.name()
                );
                return;
            }
            Err(mempool::Error::ProcessAlive { .. })
                if t0.elapsed() < Duration::from_millis(200) =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(mempool::Error::ProcessAlive { .. }) => {
                eprintln!("l2fwd: secondary {pid} lost its connection but still runs: its mbufs are its own");
                return;
            }
            Err(e) => {
                eprintln!("l2fwd: warning: {e}");
                return;
            }
        }
    }
}

/// Statistics and port events until a stop, the deadline or a port lost for good (whose
/// message it returns; with `--keep-running` the first such message is returned at the end).
#[allow(clippy::too_many_arguments)]
fn main_loop(
    args: &Args,
    counters: &Arc<Vec<Vec<PortCounters>>>,
    t0: Instant,
    stop: &StopFlag,
    ports: &mut [Port],
    events: &mut EventWatch,
    telemetry: Option<&pmd::telemetry::Telemetry>,
    mut workers: Option<&mut Workers>,
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
        if let Some(w) = workers.as_deref_mut() {
            w.serve(ports);
        }
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

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    counters: &[Vec<PortCounters>],
    port_stats: &[Stats],
    ends: &[PortEnd],
    secs: f64,
    in_use: u32,
    events: &EventWatch,
    workers: Option<WorkerCounts>,
) {
    let secondaries = workers.map(|w| {
        serde_json::json!({"attached": w.attached, "killed": w.killed,
            "rebuilds": w.rebuilds, "reclaimed_mbufs": w.reclaimed,
            "reclaimed_held_mbufs": w.reclaimed_held})
    });
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
                "secondaries": secondaries,
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
        if let Some(w) = workers {
            println!(
                "  secondaries: {} attached, {} killed, {} queue rebuilds, {} mbufs reclaimed from dead ones' caches, {} they had posted or in flight",
                w.attached, w.killed, w.rebuilds, w.reclaimed, w.reclaimed_held
            );
        }
        if !events.seen().is_empty() {
            println!("  port events: {}", events.seen().len());
        }
    }
}

/// `--proc-type secondary`: a worker of a running primary, forwarding on one queue pair of
/// each of its ports.
mod secondary {
    use super::{rewrite_macs, usage, Args, Burst, Duration, Failure, Instant, StopFlag};
    use apps::common::Idle;
    use mempool::lcache;
    use pmd::lcore::{launch_each, CoreList};
    use pmd::mp::Secondary;
    use pmd::port::attach::AttachedPair;
    use std::path::PathBuf;
    use std::sync::Arc;

    /// How often the worker looks at its primary and its queue pairs.
    const CHECK: Duration = Duration::from_millis(50);

    /// What the worker did on one port.
    #[derive(Debug, Default, Clone, Copy)]
    struct PortTotals {
        rx: u64,
        tx: u64,
        dropped: u64,
    }

    /// The worker's state: its control connection and a queue pair of every port.
    struct Fwd {
        s: Secondary,
        /// `None` only while a pair is being attached again.
        pairs: Vec<Option<AttachedPair>>,
        pool: Arc<mempool::MbufPool>,
        dir: PathBuf,
    }

    /// How the worker ended.
    struct End {
        totals: Vec<PortTotals>,
        queues: Vec<(u16, u16)>,
        why: String,
        reattached: u64,
        returned: bool,
    }

    pub(super) fn run(args: &Args) -> Result<(), Failure> {
        if !args.ports.is_empty() {
            return Err(usage(
                "--proc-type secondary uses its primary's ports: leave --port out",
            ));
        }
        args.lcores.validate().map_err(|e| usage(e.to_string()))?;
        let core = args.lcores.cores()[0];
        let one: CoreList = core.to_string().parse().map_err(|e| format!("{e}"))?;
        let stop = StopFlag::new();
        stop.on_signals().map_err(|e| e.to_string())?;
        let prefix = &args.telemetry.file_prefix;
        let mut s = Secondary::attach(prefix, "l2fwd").map_err(|e| e.to_string())?;
        let ports: Vec<u16> = s.ports().iter().map(|p| p.id).collect();
        if ports.len() < 2 || !ports.len().is_multiple_of(2) {
            return Err(format!(
                "the primary has {} port(s): l2fwd forwards between pairs of ports (is the primary still starting?)",
                ports.len()
            )
            .into());
        }
        let pool = s
            .pools()
            .next()
            .cloned()
            .ok_or("the primary shares no mbuf pool (is it an l2fwd --proc-type primary?)")?;
        if !(args.queues.is_empty() || args.queues.len() == 1 || args.queues.len() == ports.len()) {
            return Err(usage(format!(
                "--queues names one queue pair for every port, or one for each of the {} ports \
                 in order, not {}",
                ports.len(),
                args.queues.len()
            )));
        }
        let dir = pmd::telemetry::runtime_dir(prefix);
        let mut pairs = Vec::new();
        for (i, &p) in ports.iter().enumerate() {
            let want = match args.queues.as_slice() {
                [] => None,
                [q] => Some(*q),
                qs => Some(qs[i]),
            };
            let q = s.claim(p, want).map_err(|e| format!("port {p}: {e}"))?;
            // A pair given back by a secondary that left is rebuilt by the primary: its
            // description may be on its way.
            let pair =
                AttachedPair::open_waiting(&dir, p, q, &pool, s.device(p), super::ATTACH_WAIT)
                    .map_err(|e| e.to_string())?;
            pairs.push(Some(pair));
        }
        let taken: Vec<String> = pairs
            .iter()
            .flatten()
            .map(|p| format!("port {} queue pair {}", p.rx.port(), p.rx.queue()))
            .collect();
        eprintln!(
            "l2fwd: secondary of process {} on lcore {core}: {}",
            pairs[0].as_ref().map_or(0, AttachedPair::primary_pid),
            taken.join(", ")
        );
        let fwd = Fwd {
            s,
            pairs,
            pool,
            dir,
        };
        let (burst, mac_updating, busy) = (
            usize::from(args.burst),
            !args.no_mac_updating,
            args.busy_poll,
        );
        let deadline = args.duration.map(Duration::from_secs_f64);
        let ends = launch_each(
            &one,
            &stop,
            vec![fwd],
            |lcore, fwd| fwd.run(&lcore.stop, burst, mac_updating, busy),
            |stop| {
                let t0 = Instant::now();
                while !stop.is_set() && deadline.is_none_or(|d| t0.elapsed() < d) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            },
        )
        .map_err(|e| e.to_string())?;
        let end = ends.into_iter().next().expect("one worker")?;
        report(args, &end);
        Ok(())
    }

    impl Fwd {
        /// Forwards until `stop` or the primary goes, then gives the queue pairs back.
        fn run(
            mut self,
            stop: &StopFlag,
            burst: usize,
            mac_updating: bool,
            busy: bool,
        ) -> Result<End, Failure> {
            let np = self.pairs.len();
            let macs: Vec<[u8; 6]> = self
                .pairs
                .iter()
                .map(|p| {
                    p.as_ref()
                        .and_then(AttachedPair::mac)
                        .map_or([0; 6], |m| m.0)
                })
                .collect();
            let queues: Vec<(u16, u16)> = self
                .pairs
                .iter()
                .flatten()
                .map(|p| (p.rx.port(), p.rx.queue()))
                .collect();
            let mut totals = vec![PortTotals::default(); np];
            let mut b = Burst::with_capacity(burst);
            let mut idle = Idle::new(busy);
            let mut checked = Instant::now();
            let mut reattached = 0;
            let why = loop {
                let mut moved = false;
                for src in 0..np {
                    let dst = src ^ 1;
                    let Some(rx) = self.pairs[src].as_mut() else {
                        continue;
                    };
                    let n = rx.rx.rx_burst(&mut b);
                    if n == 0 {
                        continue;
                    }
                    moved = true;
                    totals[src].rx += n as u64;
                    if mac_updating {
                        rewrite_macs(&mut b, dst, &macs[dst]);
                    }
                    if let Some(tx) = self.pairs[dst].as_mut() {
                        totals[dst].tx += tx.tx.tx_burst(&mut b) as u64;
                    }
                    if !b.is_empty() {
                        totals[dst].dropped += b.len() as u64;
                        lcache::with_cache(&self.pool, |c| b.free_all(c));
                    }
                }
                if !moved {
                    // Reclaim what was sent.
                    for p in self.pairs.iter_mut().flatten() {
                        p.tx.tx_burst(&mut b);
                    }
                }
                idle.after(moved);
                if checked.elapsed() < CHECK {
                    continue;
                }
                checked = Instant::now();
                for p in self.pairs.iter().flatten() {
                    p.publish_stats();
                }
                if stop.is_set() {
                    break "stopped by a signal".to_string();
                }
                if let Some(r) = self.s.primary_gone() {
                    stop.set();
                    break format!("the primary stopped ({r})");
                }
                reattached += self.reattach()?;
            };
            let returned = self.give_back();
            Ok(End {
                totals,
                queues,
                why,
                reattached,
                returned,
            })
        }

        /// Attaches again to every pair the primary rebuilt (another secondary of its port
        /// left): what the old one posted goes back to the pool, the new one is posted.
        fn reattach(&mut self) -> Result<u64, Failure> {
            let mut n = 0;
            for slot in &mut self.pairs {
                if !slot.as_ref().is_some_and(AttachedPair::rebuilt) {
                    continue;
                }
                let (port, queue) = slot
                    .as_ref()
                    .map(|p| (p.rx.port(), p.rx.queue()))
                    .expect("checked");
                // A recovery of the primary's port rebuilds its pairs on a new device
                // context: the new rings ring the new context's doorbell page.
                if !AttachedPair::device_is_current(&self.dir, port, queue, self.s.device(port)) {
                    self.s
                        .refresh_device(port)
                        .map_err(|e| format!("port {port}: asking for its device again: {e}"))?;
                    if !AttachedPair::device_is_current(&self.dir, port, queue, self.s.device(port))
                    {
                        // The primary has not published it yet: next round.
                        continue;
                    }
                    eprintln!("l2fwd: secondary: port {port}: the primary's port runs on a new device context (recovered): got its new descriptor");
                }
                drop(slot.take());
                let fresh = AttachedPair::open_waiting(
                    &self.dir,
                    port,
                    queue,
                    &self.pool,
                    self.s.device(port),
                    super::ATTACH_WAIT,
                )
                .map_err(|e| format!("attaching again to port {port} queue pair {queue}: {e}"))?;
                eprintln!("l2fwd: secondary: port {port} queue pair {queue} rebuilt by the primary: attached again");
                *slot = Some(fresh);
                n += 1;
            }
            Ok(n)
        }

        /// Gives the queue pairs back. To a running primary: it rebuilds them, and what they
        /// posted comes back to the pool. A primary that stopped after destroying its queues
        /// said so; one that died did not, and then what they posted stays out. Returns
        /// whether everything came back.
        fn give_back(mut self) -> bool {
            let pairs: Vec<AttachedPair> = self.pairs.drain(..).flatten().collect();
            for p in &pairs {
                p.publish_stats();
            }
            let mut all = true;
            if self.s.primary_gone().is_none() {
                for p in &pairs {
                    if let Err(e) = self.s.release(p.rx.port(), p.rx.queue()) {
                        eprintln!(
                            "l2fwd: secondary: giving back port {} queue pair {}: {e}",
                            p.rx.port(),
                            p.rx.queue()
                        );
                    }
                }
                for p in pairs {
                    all &= p.wait_rebuilt(Duration::from_secs(5));
                }
            } else if self.s.primary_closed_queues() {
                pairs.into_iter().for_each(AttachedPair::drop_destroyed);
            } else {
                all = false;
            }
            lcache::flush();
            all
        }
    }

    fn report(args: &Args, end: &End) {
        if args.json {
            let ports: Vec<_> = end
                .totals
                .iter()
                .zip(&end.queues)
                .map(|(t, (p, q))| {
                    serde_json::json!({"port": p, "queue": q, "rx_packets": t.rx,
                        "tx_packets": t.tx, "dropped": t.dropped})
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({"proc_type": "secondary", "end": end.why, "ports": ports,
                    "reattached": end.reattached, "buffers_returned": end.returned})
            );
            return;
        }
        println!("l2fwd secondary summary: {}", end.why);
        for (t, (p, q)) in end.totals.iter().zip(&end.queues) {
            println!(
                "  port {p} queue pair {q}: rx {} tx {} dropped {}",
                t.rx, t.tx, t.dropped
            );
        }
        if end.reattached > 0 {
            println!("  attached again after a rebuild: {}", end.reattached);
        }
        if !end.returned {
            println!("  the buffers its queues had posted stay out of the pool (the primary did not rebuild or close them)");
        }
    }
}
