//! pktgen: a traffic generator with sequence numbers, loss and latency measurement.

use apps::cli::{usage, Failure, FrameSizes, MAX_FRAME_SIZE};
use apps::common::{
    announce_ready, device_lines, loss_lines, open_ports, si, stats_json, wait_links, Counter,
    EventWatch, Idle, PortSet,
};
use apps::pktgen::{
    flows_varying, load_pcap, read_stamp, size_cycle, FrameGen, FrameSpec, IpRange, Pacing,
    PortRange, SeqTracker, FCS_BYTES, IMIX, L1_OVERHEAD_BYTES,
};
use clap::Parser;
use hdrhistogram::Histogram;
use mempool::lcache;
use pmd::lcore::{launch_each, CoreList, Lcore, StopFlag};
use pmd::port::{max_frame_bytes, Burst, Port, PortConfig, PortSpec, RxQueue, Stats, TxQueue};
use pmd::MacAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Traffic generator: sends UDP/IPv4 frames (or replays a pcap) on the first port, at a
/// precise rate, and receives them back on the last port (the same one if only one is given),
/// counting loss (sequence gaps), duplicates, reordering and latency.
///
/// Every generated frame carries a sequence number and a TX timestamp in its first 16 payload
/// bytes. Replayed pcap frames are sent byte-exact (no stamps: only counts are compared).
///
/// Frame sizes (`--size`, `--imix`) are Ethernet frames without the 4-byte FCS, which the NIC
/// appends: `--size 60` is a minimal 64-byte frame on the wire. DPDK's testpmd counts the
/// same way (`--txpkts` excludes the FCS); pktgen-dpdk counts the FCS (its 64 is our 60).
///
/// The final report says what the ports' devices did with the frames: how many of those
/// the transmit queue accepted left the device, and how many it dropped (a full cable, a
/// frame over the MTU), and what the receiving device dropped, so that every frame sent is
/// received or counted somewhere.
///
/// Port events (link down/up, device failure or removal, queue errors) are logged on stderr
/// as they happen and listed in the `--json` report; a failed or removed device stops the
/// run, which then exits with status 1 after its report.
///
/// While it runs, pktgen answers on DPDK's telemetry socket (`pmd-telemetry`, or DPDK's
/// `dpdk-telemetry.py`): its ports' counters (`/ethdev/stats,0`), events, pool and lcores.
/// Two instances at once need two `--file-prefix`es.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// A port as a devargs string (one or two): TX on the first, RX on the last.
    #[arg(long = "port", required = true, value_name = "SPEC")]
    ports: Vec<PortSpec>,
    /// Cores: one (TX and RX on it) or two (TX on the first, RX on the second).
    #[arg(long, default_value = "0", value_name = "LIST")]
    lcores: CoreList,
    /// Packets per second.
    #[arg(long, group = "speed", value_name = "PPS", value_parser = apps::cli::pps)]
    rate: Option<f64>,
    /// Bit rate in Gbit/s of frame bytes without FCS, the L2 rate (converted to packets per
    /// second for the mean of --size).
    #[arg(long, group = "speed", value_name = "G", value_parser = apps::cli::gbps)]
    rate_gbps: Option<f64>,
    /// Bit rate in Gbit/s on the wire, the L1 rate: each frame counts with its FCS (4 bytes),
    /// preamble and start delimiter (8) and the minimum inter-frame gap (12), as a link's
    /// speed does (10 Gbit/s of 60-byte frames: 14.88 Mpps).
    #[arg(long, group = "speed", value_name = "G", value_parser = apps::cli::gbps)]
    rate_gbps_l1: Option<f64>,
    /// As fast as possible (the default when no rate is given).
    #[arg(long, group = "speed")]
    max: bool,
    /// Frame size in bytes without the FCS (60..=9018, a VLAN tag included; 60 is a 64-byte
    /// frame on the wire), or a list of sizes sent in turn: `--size 60,124,1514`. Frames
    /// longer than the MTU allows (1514 bytes at the default 1500, 1518 tagged) raise the MTU
    /// to fit unless --mtu is given.
    #[arg(long, default_value = "60", value_name = "BYTES[,BYTES..]", value_parser = apps::cli::frame_sizes)]
    size: FrameSizes,
    /// Simple IMIX: frames of 60, 590 and 1514 bytes without FCS (64, 594 and 1518 on the
    /// wire) in the ratio 7:4:1, interleaved.
    #[arg(long, conflicts_with = "size")]
    imix: bool,
    /// MTU of the ports in bytes (68..=9000; 9000 for jumbo frames). Default: 1500, or what
    /// --size or the largest --pcap frame needs. The mbufs' data room is sized to hold the
    /// longest frame of the MTU.
    #[arg(long, value_parser = apps::cli::mtu)]
    mtu: Option<u16>,
    /// Number of flows, each a distinct 5-tuple: the flows walk every combination of the
    /// address and port ranges (source port fastest); with every range a single value (the
    /// defaults) the source UDP port varies from --src-port. The banner says what varies.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    flows: u32,
    /// Source IPv4 address or range A.B.C.D[-E.F.G.H].
    #[arg(long, default_value = "169.254.1.1")]
    src_ip: IpRange,
    /// Destination IPv4 address or range.
    #[arg(long, default_value = "169.254.1.2")]
    dst_ip: IpRange,
    /// Source UDP port or range P[-Q].
    #[arg(long, default_value = "1024")]
    src_port: PortRange,
    /// Destination UDP port or range.
    #[arg(long, default_value = "9000")]
    dst_port: PortRange,
    /// Tag frames with this 802.1Q VLAN id.
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..4095))]
    vlan: Option<u16>,
    /// Receive only frames for the receiving port's own MAC and broadcast. By default a port
    /// that can (mlx5, the device models) receives every frame, as pktgen-dpdk does.
    #[arg(long)]
    no_promiscuous: bool,
    /// Destination MAC of generated frames.
    #[arg(long, default_value = "02:00:00:00:00:00")]
    dst_mac: MacAddr,
    /// Source MAC of generated frames (default: the sending port's MAC).
    #[arg(long)]
    src_mac: Option<MacAddr>,
    /// Send exactly this many frames, then wait for them to come back and stop.
    #[arg(long)]
    count: Option<u64>,
    /// Send for this many seconds (default 10 unless --count is given).
    #[arg(long, value_parser = apps::cli::positive_seconds)]
    duration: Option<f64>,
    /// Replay the frames of this pcap file (looping) instead of generating UDP frames.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Replay the --pcap capture with its own timing (the gaps between its timestamps),
    /// looping, instead of at a rate.
    #[arg(long, requires = "pcap", conflicts_with_all = ["rate", "rate_gbps", "rate_gbps_l1", "max"])]
    pcap_timing: bool,
    /// With --pcap-timing: replay this many times as fast (0.5: half speed).
    #[arg(long, default_value_t = 1.0, value_name = "X", requires = "pcap_timing", value_parser = apps::cli::speed)]
    pcap_speed: f64,
    /// Only receive (and count) for --duration seconds.
    #[arg(long)]
    rx_only: bool,
    /// Only send (like testpmd's txonly forwarding): no receive polling, no loss or latency
    /// accounting; the report has what was sent and what the devices did with it.
    #[arg(long, conflicts_with_all = ["rx_only", "max_loss"])]
    tx_only: bool,
    /// Packets per burst.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=512))]
    burst: u16,
    /// Descriptors per queue.
    #[arg(long, default_value_t = 1024, value_parser = apps::cli::ring_size)]
    ring_size: u16,
    /// Mbufs in the pool [default: every ring of every port full (queue counts from the
    /// devargs' rxq=/txq=), plus per-core caches and 4096 spare, rounded up to a power of two
    /// less one]. Must at least fill the RX rings.
    #[arg(long, value_parser = apps::cli::pool_size)]
    pool_size: Option<u32>,
    /// Seconds between live statistics lines on stderr (0: none).
    #[arg(long, default_value_t = 1.0, value_parser = apps::cli::seconds)]
    stats_interval: f64,
    /// Seconds to wait for every port's link to come up before sending (a device-model port
    /// is down until the far end of its cable is attached, or while its afpacket interface
    /// is down); a port found down is reported at once. A link still down after the wait
    /// fails the run, exit status 1; 0: do not wait, warn and send anyway (frames sent into
    /// a down link are lost: a cable's far end discards them when it attaches, counted as
    /// its `wire_rx_stale`).
    #[arg(long, visible_alias = "link-wait", default_value_t = 10.0, value_name = "S", value_parser = apps::cli::seconds)]
    link_timeout: f64,
    /// After sending, wait at most this long for frames still on their way (and stop early
    /// when none arrived for a quarter of it, at least 0.5 s).
    #[arg(long, default_value_t = 2.0, value_parser = apps::cli::seconds)]
    drain_timeout: f64,
    /// Never yield the CPU when idle.
    #[arg(long)]
    busy_poll: bool,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 when more than this percentage of the frames sent was lost (for
    /// scripts and CI), after the report.
    #[arg(long, value_name = "PCT", value_parser = apps::cli::percent)]
    max_loss: Option<f64>,
    /// A shell command (`sh -c`) to start once the links are up and traffic starts, e.g. a
    /// capture or a script that acts during the run; pktgen waits for it at the end (at most
    /// --drain-timeout, then kills it) and reports its exit status. Spawning a child makes
    /// pktgen register memory fork-safe (ibv_fork_init on hardware ports).
    #[arg(long, value_name = "CMD")]
    run: Option<String>,
    #[command(flatten)]
    telemetry: apps::telemetry::TelemetryArgs,
}

/// Counters the main core reads while workers run.
#[derive(Default)]
struct Shared {
    tx_packets: Counter,
    tx_bytes: Counter,
    rx_packets: Counter,
    rx_bytes: Counter,
    gaps: AtomicU64,
    p50: AtomicU64,
    p99: AtomicU64,
    tx_done: AtomicBool,
    /// A stop signal arrived: stop sending, then drain as at the end of a run.
    stop_sending: AtomicBool,
    tx_start_ns: AtomicU64,
    tx_end_ns: AtomicU64,
}

enum Frames {
    Gen(FrameGen),
    Pcap(Vec<Vec<u8>>),
}

struct TxSide {
    q: TxQueue,
    frames: Frames,
    pending: Burst,
    pacing: Option<Pacing>,
    count: Option<u64>,
    duration: Option<Duration>,
    sent: u64,
    made: u64,
    start: Option<Instant>,
    done: bool,
}

struct RxSide {
    /// Every RX queue of the receiving port (RSS spreads the flows over them).
    qs: Vec<RxQueue>,
    tracker: SeqTracker,
    hist: Histogram<u64>,
    stamped: bool,
    last_publish: Instant,
    burst: Burst,
}

enum Role {
    Tx(TxSide),
    Rx(RxSide),
    Both(TxSide, Box<RxSide>),
}

impl Role {
    /// What the core does, for `/pmd/lcores`.
    fn name(&self) -> &'static str {
        match self {
            Role::Tx(_) => "tx",
            Role::Rx(_) => "rx",
            Role::Both(..) => "tx+rx",
        }
    }
}

const LCORES_HELP: &str = "Per polling core (lcore index, CPU, role tx, rx or tx+rx): what \
    it counts, frames and bytes sent or received, and on receive the sequence gaps and \
    latency percentiles in ns (as of the last tenth of a second). No parameter.";

/// `/pmd/lcores`: the counters the polling cores publish (read as the statistics line reads
/// them; the cores are not involved).
fn lcores_answer(sh: &Shared, cores: &[(usize, &'static str)]) -> pmd::telemetry::Data {
    use pmd::telemetry::Data;
    Data::Array(
        cores
            .iter()
            .enumerate()
            .map(|(i, (cpu, role))| {
                let mut d = Data::dict();
                d.add("lcore", i).add("cpu", *cpu).add("role", *role);
                if role.starts_with("tx") {
                    d.add("tx_packets", sh.tx_packets.get())
                        .add("tx_bytes", sh.tx_bytes.get())
                        .add("tx_done", sh.tx_done.load(Ordering::Relaxed));
                }
                if role.ends_with("rx") {
                    d.add("rx_packets", sh.rx_packets.get())
                        .add("rx_bytes", sh.rx_bytes.get())
                        .add("gaps", sh.gaps.load(Ordering::Relaxed))
                        .add("latency_p50_ns", sh.p50.load(Ordering::Relaxed))
                        .add("latency_p99_ns", sh.p99.load(Ordering::Relaxed));
                }
                d
            })
            .collect(),
    )
}

enum Outcome {
    Tx,
    Rx(Box<RxSide>),
}

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => e.report("pktgen"),
    }
}

/// The pacing the options ask for, for frames of `mean_len` bytes on average (without FCS):
/// `None` as fast as possible.
fn pacing(
    args: &Args,
    mean_len: f64,
    capture_times: Option<&[u64]>,
) -> Result<Option<Pacing>, Failure> {
    let l1_len = mean_len + (FCS_BYTES + L1_OVERHEAD_BYTES) as f64;
    Ok(match (args.rate, args.rate_gbps, args.rate_gbps_l1) {
        (Some(r), _, _) => Some(Pacing::Rate(r)),
        (_, Some(g), _) => Some(Pacing::Rate(g * 1e9 / (mean_len * 8.0))),
        (_, _, Some(g)) => Some(Pacing::Rate(g * 1e9 / (l1_len * 8.0))),
        _ => match capture_times {
            Some(t) if args.pcap_timing => Some(
                Pacing::capture(t, args.pcap_speed)
                    .map_err(|e| usage(format!("--pcap-timing: {e}")))?,
            ),
            _ => None,
        },
    })
}

/// The ports' MTU: `--mtu` when given (every frame must fit it: a usage error otherwise),
/// else 1500 or the L3 size of the longest frame to send, whichever is larger.
fn port_mtu(given: Option<u16>, frames: &Frames, vlan: bool) -> Result<u16, Failure> {
    let tag = |tagged: bool| if tagged { 18 } else { 14 };
    let need = match frames {
        Frames::Gen(g) => g.len().saturating_sub(tag(vlan)),
        // L3 bytes of a frame: after the Ethernet header and a VLAN tag if it has one.
        Frames::Pcap(f) => f
            .iter()
            .map(|f| {
                f.len()
                    .saturating_sub(tag(f.get(12..14) == Some(&[0x81, 0x00])))
            })
            .max()
            .unwrap_or(0),
    };
    match given {
        Some(mtu) if need > usize::from(mtu) => Err(usage(format!(
            "--mtu {mtu}: frames with {need} bytes after the Ethernet header (and VLAN tag) \
             do not fit; raise --mtu to at least {need} or send smaller frames"
        ))),
        Some(mtu) => Ok(mtu),
        // At most MAX_FRAME_SIZE - 14 (frames are checked against it): fits u16.
        None => Ok((need as u16).max(1500)),
    }
}

/// The checks of a command line that clap cannot make; the sending time (`None`: until
/// --count frames are sent).
fn check_args(args: &Args) -> Result<Option<Duration>, Failure> {
    let np = args.ports.len();
    if np > 2 {
        return Err(usage(format!(
            "{np} ports given: pktgen sends on one port and receives on the same or a second one"
        )));
    }
    let ncores = args.lcores.cores().len();
    if ncores > 2 {
        return Err(usage(format!(
            "--lcores {}: pktgen uses one core (TX and RX) or two (TX, RX)",
            args.lcores
        )));
    }
    args.lcores.validate().map_err(|e| usage(e.to_string()))?;
    if args.rx_only && (args.pcap.is_some() || args.count.is_some()) {
        return Err(usage(
            "--rx-only sends nothing: it takes neither --pcap nor --count",
        ));
    }
    Ok(match (args.duration, args.count) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    })
}

/// What pktgen sends: generated or replayed frames, the capture's timestamps (a replay), the
/// mean frame length, the MTU the ports need, and a line that says it.
struct Traffic {
    frames: Frames,
    capture_times: Option<Vec<u64>>,
    mean_len: f64,
    mtu: u16,
    what: String,
}

/// The frames of `args` (--pcap, or the generator's --size/--imix/--flows/addresses).
fn traffic(args: &Args) -> Result<Traffic, Failure> {
    let sizes = if args.imix {
        size_cycle(&IMIX)
    } else {
        args.size.0.clone()
    };
    let gen_spec = FrameSpec {
        sizes,
        flows: args.flows,
        src_ip: args.src_ip,
        dst_ip: args.dst_ip,
        src_port: args.src_port,
        dst_port: args.dst_port,
        vlan: args.vlan,
        // The sending port's MAC unless --src-mac says otherwise: set once the port is open.
        src_mac: args.src_mac.map_or([0x02, 0, 0, 0, 0xaa, 0x01], |m| m.0),
        dst_mac: args.dst_mac.0,
    };
    let mut capture_times = None;
    let frames = match &args.pcap {
        Some(p) => {
            let longest = args.mtu.map_or(MAX_FRAME_SIZE.into(), max_frame_bytes);
            let cap = load_pcap(p, longest as usize)?;
            if cap.skipped_short > 0 {
                eprintln!(
                    "pktgen: {}: {} records shorter than an Ethernet header (14 bytes) skipped; replaying {} frames",
                    p.display(),
                    cap.skipped_short,
                    cap.frames.len()
                );
            }
            capture_times = Some(cap.times_ns);
            Frames::Pcap(cap.frames)
        }
        None => Frames::Gen(FrameGen::new(&gen_spec).map_err(|e| {
            // The sizes came from --imix, not from a --size the user typed.
            usage(if args.imix { format!("--imix: {e}") } else { e })
        })?),
    };
    let mtu = port_mtu(args.mtu, &frames, args.vlan.is_some())?;
    let mean_len = match &frames {
        Frames::Gen(g) => g.mean_len(),
        Frames::Pcap(f) => f.iter().map(Vec::len).sum::<usize>() as f64 / f.len() as f64,
    };
    let sizes_text = if args.imix {
        format!("IMIX 7:4:1 of 60/590/1514 B ({mean_len:.1} B on average)")
    } else if args.size.0.len() > 1 {
        let list: Vec<String> = args.size.0.iter().map(u16::to_string).collect();
        format!("{} B in turn ({mean_len:.1} B on average)", list.join("/"))
    } else {
        format!("{mean_len:.0} B")
    };
    let what = match &frames {
        Frames::Gen(_) => format!(
            "UDP frames of {sizes_text} without FCS, {} flows ({})",
            args.flows,
            flows_varying(&gen_spec).map_err(usage)?
        ),
        Frames::Pcap(f) => format!(
            "{} pcap frames, {mean_len:.0} B on average{}",
            f.len(),
            if args.pcap_timing {
                format!(", with the capture's timing x{}", args.pcap_speed)
            } else {
                String::new()
            }
        ),
    };
    Ok(Traffic {
        frames,
        capture_times,
        mean_len,
        mtu,
        what,
    })
}

/// The polling cores' work: the sending side on `txq`, the receiving side on `rxqs`, on one
/// core or two (`--lcores`), or the sending side alone (`--tx-only`, on the first core).
fn roles(
    args: &Args,
    txq: TxQueue,
    rxqs: Vec<RxQueue>,
    frames: Frames,
    pacing: Option<Pacing>,
    duration: Option<Duration>,
) -> Result<(Vec<Role>, CoreList), Failure> {
    let burst = usize::from(args.burst);
    let ncores = args.lcores.cores().len();
    let tx = TxSide {
        q: txq,
        frames,
        pending: Burst::with_capacity(burst),
        pacing,
        count: args.count,
        duration,
        sent: 0,
        made: 0,
        start: None,
        done: args.rx_only,
    };
    let rx = RxSide {
        qs: rxqs,
        // Flows are what the generator assigns (sequence number modulo --flows); replayed
        // captures carry no stamps.
        tracker: SeqTracker::with_flows(args.flows),
        hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())?,
        stamped: args.pcap.is_none(),
        last_publish: Instant::now(),
        burst: Burst::with_capacity(burst),
    };
    let roles = if args.tx_only {
        // Nothing polls the receiving port: what arrives there is the device's to drop
        // (counted, imissed), as in testpmd's txonly mode.
        drop(rx);
        vec![Role::Tx(tx)]
    } else if ncores == 2 {
        vec![Role::Tx(tx), Role::Rx(rx)]
    } else {
        vec![Role::Both(tx, Box::new(rx))]
    };
    let lcores = if args.tx_only {
        args.lcores.cores()[..1]
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",")
            .parse::<CoreList>()
            .map_err(|e| e.to_string())?
    } else {
        args.lcores.clone()
    };
    Ok((roles, lcores))
}

fn run(args: &Args) -> Result<ExitCode, Failure> {
    let duration = check_args(args)?;
    let (np, ncores) = (args.ports.len(), args.lcores.cores().len());
    let Traffic {
        mut frames,
        capture_times,
        mean_len,
        mtu,
        what,
    } = traffic(args)?;
    let pacing = pacing(args, mean_len, capture_times.as_deref())?;
    let cfg = PortConfig::default()
        .with_ring_sizes(args.ring_size, args.ring_size)
        // A child process must never share pages the NIC writes.
        .with_fork_safe(args.run.is_some())
        .with_promiscuous(!args.no_promiscuous)
        .with_mtu(mtu);
    // Stop signals are guarded before the first port opens: from then on a taken-over netdev
    // is given back however the process stops (first signal: clean stop; second: clean stop without the drain; third: at once).
    // The signals set `signalled`; the workers stop on `stop`, which the main loop lets go
    // only after the frames in flight had their drain window.
    let signalled = StopFlag::new();
    signalled.on_signals().map_err(|e| e.to_string())?;
    let stop = StopFlag::new();
    // Before any device is touched, as DPDK's EAL does: a prefix in use fails the start.
    let mut telemetry = apps::telemetry::start("pktgen", &args.telemetry)?;
    let PortSet { mut ports, pool } =
        open_ports("pktgen", &args.ports, &cfg, ncores, args.pool_size, None)?;
    if let (Frames::Gen(g), None) = (&mut frames, args.src_mac) {
        g.set_src_mac(ports[0].mac().0);
    }
    let txq = ports[0].tx_queue(0).map_err(|e| e.to_string())?;
    let nrxq = ports[np - 1].config().map_or(1, |c| c.rx_queues);
    let rxqs = (0..nrxq)
        .map(|q| ports[np - 1].rx_queue(q))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    for p in &mut ports {
        p.start().map_err(|e| e.to_string())?;
    }
    // pmd-dumpcap's socket: captures of what the ports send and receive, while pktgen runs.
    let capture = apps::telemetry::capture("pktgen", &args.telemetry, telemetry.as_ref(), &ports)?;
    // Frames sent into a down link are lost: wait for the peer, or say why not (unless told
    // not to wait: then the warnings were the word).
    if let Err(down) = wait_links(
        "pktgen",
        &ports,
        Duration::from_secs_f64(args.link_timeout),
        &signalled,
    ) {
        if args.link_timeout > 0.0 {
            return Err(format!("{down}\n(raise --link-timeout, or start the peer first)").into());
        }
    }
    announce_ready("pktgen", &args.ports, &ports, args.json);
    let (roles, lcores) = roles(args, txq, rxqs, frames, pacing.clone(), duration)?;
    let shared = Arc::new(Shared::default());
    if args.rx_only {
        shared.tx_done.store(true, Ordering::Release);
    }
    if let Some(t) = &telemetry {
        t.watch_pool(&pool).map_err(|e| e.to_string())?;
        let sh = Arc::clone(&shared);
        let cores: Vec<(usize, &'static str)> = lcores
            .cores()
            .iter()
            .zip(roles.iter().map(Role::name))
            .map(|(c, r)| (*c, r))
            .collect();
        t.register("/pmd/lcores", LCORES_HELP, move |_| {
            Ok(lcores_answer(&sh, &cores))
        })
        .map_err(|e| e.to_string())?;
    }
    let epoch = Instant::now();
    if !args.json {
        eprintln!(
            "pktgen: {} on {}, rx on port {}, {what}",
            match &pacing {
                Some(Pacing::Rate(r)) => format!("{}pps", si(*r)),
                Some(Pacing::Capture { .. }) => "capture timing".into(),
                None => "max rate".into(),
            },
            args.ports[0],
            np - 1,
        );
    }
    let child = match &args.run {
        Some(cmd) => Some(
            std::process::Command::new("sh")
                .args(["-c", cmd])
                .spawn()
                .map_err(|e| format!("--run {cmd:?}: {e}"))?,
        ),
        None => None,
    };
    let sh = Arc::clone(&shared);
    let busy = args.busy_poll;
    let mut events = EventWatch::new("pktgen", &ports, epoch);
    let mut fatal = None;
    let results = launch_each(
        &lcores,
        &stop,
        roles,
        |lcore, role| work(&lcore, role, &pool, &sh, epoch, busy),
        |_| {
            fatal = main_loop(
                args,
                &shared,
                &signalled,
                epoch,
                &mut ports,
                &mut events,
                telemetry.as_ref(),
            );
            // Nothing answers the ports' questions from here on: the socket goes now, so
            // that a client sees the instance go instead of waiting for answers.
            drop(telemetry.take());
        },
    )
    .map_err(|e| e.to_string())?;
    drop(capture);
    finish(
        args, results, &pool, &shared, ports, events, epoch, fatal, child,
    )
}

/// One polling core's run: its role's loop until the stop, then (a sending core) the frames
/// in flight let complete; what the receiving side saw comes back.
/// After the polling cores: the last frames received, the ports' counters, the pool's
/// accounting, the `--run` child reaped, the report and the verdict.
#[allow(clippy::too_many_arguments)]
fn finish(
    args: &Args,
    results: Vec<Outcome>,
    pool: &Arc<mempool::MbufPool>,
    shared: &Shared,
    mut ports: Vec<Port>,
    mut events: EventWatch,
    epoch: Instant,
    fatal: Option<String>,
    mut child: Option<std::process::Child>,
) -> Result<ExitCode, Failure> {
    let rx = results.into_iter().find_map(|o| match o {
        Outcome::Rx(r) => Some(r),
        Outcome::Tx => None,
    });
    let (hist, tracker) = match rx {
        Some(mut rx) => {
            // One last look at frames that arrived after the workers stopped polling.
            rx.poll(pool, shared);
            (rx.hist.clone(), rx.tracker.clone())
        }
        None if args.tx_only => (
            Histogram::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())?,
            SeqTracker::default(),
        ),
        None => return Err("no receive side ran".into()),
    };
    for p in &mut ports {
        p.stop();
    }
    // The ports' own counters say where lost frames went (a full cable, no buffer, ...).
    let port_stats: Vec<Stats> = ports.iter().map(Port::stats).collect();
    // A capture that failed since the main loop last looked (reading the statistics above
    // wrote out what the capture still buffered): its event is there now.
    let _ = events.wait(&mut ports, Duration::ZERO);
    drop(ports);
    lcache::flush();
    let in_use = pool.in_use();
    if let Some(c) = child.as_mut() {
        reap(c, Duration::from_secs_f64(args.drain_timeout));
    }
    report(
        args,
        shared,
        &tracker,
        &hist,
        epoch,
        in_use,
        &events,
        &port_stats,
    );
    verdict(args, in_use, fatal, &events, shared, &tracker)
}

fn work(
    lcore: &Lcore,
    role: Role,
    pool: &Arc<mempool::MbufPool>,
    sh: &Shared,
    epoch: Instant,
    busy: bool,
) -> Outcome {
    let mut idle = Idle::new(busy);
    let out = match role {
        Role::Tx(mut t) => {
            while !lcore.stop.is_set() {
                let w = t.poll(pool, sh, epoch);
                pace(&t, w, busy, &mut idle);
            }
            t.finish(pool);
            Outcome::Tx
        }
        Role::Rx(mut r) => {
            while !lcore.stop.is_set() {
                let w = r.poll(pool, sh);
                idle.after(w);
            }
            Outcome::Rx(Box::new(r))
        }
        Role::Both(mut t, mut r) => {
            while !lcore.stop.is_set() {
                let a = t.poll(pool, sh, epoch);
                let b = r.poll(pool, sh);
                pace(&t, a || b, busy, &mut idle);
            }
            t.finish(pool);
            Outcome::Rx(r)
        }
    };
    lcache::flush();
    out
}

/// The run's exit status once the report is out: a failure for buffers missing from the
/// pool, a port lost for good, a capture that stopped, or more loss than --max-loss.
fn verdict(
    args: &Args,
    in_use: u32,
    fatal: Option<String>,
    events: &EventWatch,
    shared: &Shared,
    tracker: &SeqTracker,
) -> Result<ExitCode, Failure> {
    if in_use != 0 {
        return Err(format!("{in_use} mbufs were not returned to the pool").into());
    }
    if let Some(f) = fatal {
        eprintln!("pktgen: {f}");
        return Ok(ExitCode::FAILURE);
    }
    // A capture that failed since the main loop last looked.
    if let Some(f) = events.capture_failure() {
        return Err(f.into());
    }
    if let Some(max) = args.max_loss {
        let tx = shared.tx_packets.get();
        let lost = tx.saturating_sub(tracker.unique);
        let pct = if tx == 0 {
            0.0
        } else {
            lost as f64 * 100.0 / tx as f64
        };
        if pct > max {
            eprintln!(
                "pktgen: lost {lost} of {tx} frames ({pct:.3}%), more than --max-loss {max}%"
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Longest single sleep between frames: the loop looks at the stop flag and the deadline at
/// least this often, whatever the rate (at 0.05 pps the next frame is 20 s away).
const MAX_PACING_SLEEP: Duration = Duration::from_millis(10);

/// Between sends at a set rate, give the CPU away instead of spinning on the clock: sleep
/// when the next frame is due in more than 200 µs (at most [`MAX_PACING_SLEEP`]), yield when
/// it is due in more than 20 µs (the device model's engine threads may share this core).
#[inline]
fn pace(t: &TxSide, did_work: bool, busy: bool, idle: &mut Idle) {
    if !busy {
        if let Some(wait) = t.next_due_in().map(|w| w.min(MAX_PACING_SLEEP)) {
            if wait > Duration::from_micros(200) {
                std::thread::sleep(wait - Duration::from_micros(100));
                return;
            }
            if wait > Duration::from_micros(20) {
                std::thread::yield_now();
                return;
            }
        }
    }
    idle.after(did_work);
}

impl TxSide {
    /// How long until the next frame is due, when sending at a set rate with nothing pending.
    fn next_due_in(&self) -> Option<Duration> {
        let (pacing, start) = (self.pacing.as_ref()?, self.start?);
        if self.done || !self.pending.is_empty() {
            return None;
        }
        let due_at = start + pacing.due_at(self.sent);
        due_at.checked_duration_since(Instant::now())
    }

    /// Sends what is due; returns whether it did anything.
    fn poll(&mut self, pool: &Arc<mempool::MbufPool>, sh: &Shared, epoch: Instant) -> bool {
        if self.done {
            self.q.tx_burst(&mut self.pending);
            return false;
        }
        let now = Instant::now();
        let start = *self.start.get_or_insert_with(|| {
            sh.tx_start_ns
                .store((now - epoch).as_nanos() as u64, Ordering::Release);
            now
        });
        let elapsed = now - start;
        let out_of_time =
            self.duration.is_some_and(|d| elapsed >= d) || sh.stop_sending.load(Ordering::Acquire);
        let out_of_count = self.count.is_some_and(|c| self.made >= c) && self.pending.is_empty();
        if out_of_time || out_of_count {
            self.done = true;
            // Frames built but never accepted are freed and were never counted as sent.
            lcache::with_cache(pool, |c| self.pending.free_all(c));
            sh.tx_end_ns.store(
                (start - epoch + elapsed).as_nanos() as u64,
                Ordering::Release,
            );
            sh.tx_done.store(true, Ordering::Release);
            return false;
        }
        let due = self.pacing.as_ref().map_or(u64::MAX, |p| p.due(elapsed));
        let mut want = due
            .saturating_sub(self.sent + self.pending.len() as u64)
            .min(self.pending.spare() as u64);
        if let Some(c) = self.count {
            want = want.min(c - self.made);
        }
        if want > 0 {
            // The machine's clock, not this process's: a receiver in another process reads
            // the same one.
            let ts = pmd::sys::clock::monotonic_ns();
            for _ in 0..want {
                let Some(mut m) = lcache::alloc(pool) else {
                    break;
                };
                let ok = match &self.frames {
                    Frames::Gen(g) => m
                        .append(g.len_of(self.made))
                        .map(|buf| g.write(self.made, ts, buf))
                        .is_ok(),
                    Frames::Pcap(f) => m
                        .extend_from_slice(&f[(self.made % f.len() as u64) as usize])
                        .is_ok(),
                };
                if !ok {
                    lcache::free(pool, m);
                    break;
                }
                self.made += 1;
                let _ = self.pending.push(m);
            }
        }
        if self.pending.is_empty() {
            return false;
        }
        let bytes: u64 = self.pending.iter().map(|m| u64::from(m.pkt_len())).sum();
        let before = self.pending.len();
        let n = self.q.tx_burst(&mut self.pending);
        let left: u64 = self.pending.iter().map(|m| u64::from(m.pkt_len())).sum();
        debug_assert_eq!(before - n, self.pending.len());
        self.sent += n as u64;
        sh.tx_packets.add(n as u64);
        sh.tx_bytes.add(bytes - left);
        n > 0
    }

    /// Lets in-flight frames complete so their buffers return.
    fn finish(&mut self, pool: &Arc<mempool::MbufPool>) {
        lcache::with_cache(pool, |c| self.pending.free_all(c));
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(100) {
            self.q.tx_burst(&mut self.pending);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl RxSide {
    fn poll(&mut self, pool: &Arc<mempool::MbufPool>, sh: &Shared) -> bool {
        let mut total = 0;
        for q in &mut self.qs {
            let n = q.rx_burst(&mut self.burst);
            if n == 0 {
                continue;
            }
            total += n;
            let now = pmd::sys::clock::monotonic_ns();
            let mut bytes = 0u64;
            for m in self.burst.iter() {
                bytes += u64::from(m.pkt_len());
                if self.stamped {
                    if let Some((seq, ts)) = read_stamp(m.data()) {
                        self.tracker.record(seq);
                        if ts <= now {
                            let _ = self.hist.record((now - ts).max(1));
                        }
                    }
                } else {
                    self.tracker.unique += 1;
                }
            }
            lcache::with_cache(pool, |c| self.burst.free_all(c));
            sh.rx_packets.add(n as u64);
            sh.rx_bytes.add(bytes);
        }
        let n = total;
        if self.last_publish.elapsed() > Duration::from_millis(100) {
            self.last_publish = Instant::now();
            sh.gaps.store(self.tracker.gaps, Ordering::Relaxed);
            sh.p50
                .store(self.hist.value_at_quantile(0.5), Ordering::Relaxed);
            sh.p99
                .store(self.hist.value_at_quantile(0.99), Ordering::Relaxed);
        }
        n > 0
    }
}

/// Waits up to `limit` for the `--run` child (not at all after a second stop signal), then
/// kills it; says how it ended.
fn reap(c: &mut std::process::Child, limit: Duration) {
    let end = Instant::now() + limit;
    let status = loop {
        match c.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < end && !pmd::takeover::exit::hurry_requested() => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                eprintln!("pktgen: --run child {} still running: killed", c.id());
                let _ = c.kill();
                break c.wait().ok();
            }
            Err(e) => {
                eprintln!("pktgen: --run child {}: {e}", c.id());
                break None;
            }
        }
    };
    if let Some(s) = status {
        eprintln!("pktgen: --run child {} exited: {s}", c.id());
    }
}

/// Statistics, port events and the end of the run (time, drain); returns the message of a
/// fatal port event that ended it early.
fn main_loop(
    args: &Args,
    sh: &Shared,
    signalled: &StopFlag,
    epoch: Instant,
    ports: &mut [Port],
    events: &mut EventWatch,
    telemetry: Option<&pmd::telemetry::Telemetry>,
) -> Option<String> {
    let interval = (args.stats_interval > 0.0 && !args.json)
        .then(|| Duration::from_secs_f64(args.stats_interval));
    let rx_only_until = args
        .rx_only
        .then(|| Duration::from_secs_f64(args.duration.unwrap_or(10.0)));
    let drain_timeout = Duration::from_secs_f64(args.drain_timeout.max(0.0));
    // No frame for this long: nothing more is coming (a longer --drain-timeout waits longer
    // through a peer that is slow to be scheduled, on a loaded machine).
    let stalled = (drain_timeout / 4).max(Duration::from_millis(500));
    let mut last = (sh.tx_packets.get(), sh.rx_packets.get(), Instant::now());
    // (drain start, frames seen, last progress, whether a stop signal had come by then)
    let mut drain: Option<(Instant, u64, Instant, bool)> = None;
    loop {
        // Port events are watched here, never on the polling cores.
        if let Some(f) = events.wait(ports, Duration::from_millis(10)) {
            return Some(f);
        }
        // Telemetry's questions about the ports, answered here where the ports are.
        apps::telemetry::serve(telemetry, ports, events);
        // A capture that stopped recording (a full disk) stops the run.
        if let Some(f) = events.capture_failure() {
            return Some(f.to_string());
        }
        if signalled.is_set() {
            // Stop sending; what is in flight gets the drain window below (a second
            // signal cuts it short).
            sh.stop_sending.store(true, Ordering::Release);
            if pmd::takeover::exit::hurry_requested() || rx_only_until.is_some() {
                break;
            }
        }
        if let Some(until) = rx_only_until {
            if epoch.elapsed() >= until {
                break;
            }
        } else if sh.tx_done.load(Ordering::Acquire) && args.tx_only {
            // Nothing to wait for: nobody receives.
            break;
        } else if sh.tx_done.load(Ordering::Acquire) {
            // Sending is over: wait for what is still on the wire, but not for ever.
            let rx = sh.rx_packets.get();
            let now = Instant::now();
            let (since, seen, progress, signalled_before) =
                drain.get_or_insert((now, rx, now, signalled.is_set()));
            if rx != *seen {
                *seen = rx;
                *progress = now;
            }
            let all_back = rx >= sh.tx_packets.get();
            // A stop signal during the drain itself means "stop waiting": the sending is
            // over, what has not come back is reported lost.
            let cut_short = signalled.is_set() && !*signalled_before;
            if all_back || cut_short || now - *since >= drain_timeout || now - *progress >= stalled
            {
                break;
            }
        }
        if let Some(iv) = interval {
            if last.2.elapsed() >= iv {
                let (tx, rx) = (sh.tx_packets.get(), sh.rx_packets.get());
                let dt = last.2.elapsed().as_secs_f64();
                // What the ports' devices dropped so far, sending and receiving.
                let (dtx, drx) = ports.iter().fold((0, 0), |(t, r), p| {
                    let d = p.stats().device_drops;
                    (t + d.tx, r + d.rx)
                });
                eprintln!(
                    "[{:6.1}s] tx {}pps  rx {}pps  sent {tx}  received {rx}  dev-drop tx {dtx} rx {drx}  gaps {}  latency p50 {:.1} us p99 {:.1} us",
                    epoch.elapsed().as_secs_f64(),
                    si((tx - last.0) as f64 / dt),
                    si((rx - last.1) as f64 / dt),
                    sh.gaps.load(Ordering::Relaxed),
                    sh.p50.load(Ordering::Relaxed) as f64 / 1e3,
                    sh.p99.load(Ordering::Relaxed) as f64 / 1e3,
                );
                last = (tx, rx, Instant::now());
            }
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    sh: &Shared,
    tracker: &SeqTracker,
    hist: &Histogram<u64>,
    epoch: Instant,
    in_use: u32,
    events: &EventWatch,
    port_stats: &[Stats],
) {
    let tx_packets = sh.tx_packets.get();
    let tx_bytes = sh.tx_bytes.get();
    let rx_packets = sh.rx_packets.get();
    let rx_bytes = sh.rx_bytes.get();
    let start = sh.tx_start_ns.load(Ordering::Acquire);
    let end = match sh.tx_end_ns.load(Ordering::Acquire) {
        0 => epoch.elapsed().as_nanos() as u64,
        e => e,
    };
    let secs = if args.rx_only {
        epoch.elapsed().as_secs_f64()
    } else {
        (end.saturating_sub(start)) as f64 / 1e9
    }
    .max(1e-9);
    let lost = tx_packets.saturating_sub(tracker.unique);
    // What the devices did with the frames: the sending port's accepted `tx_packets` (its
    // queue took them) and dropped some of them (a full cable, over the MTU); the
    // receiving port dropped some that reached it (no buffer).
    let np = port_stats.len();
    let tx_dropped = port_stats.first().map_or(0, |s| s.device_drops.tx);
    let rx_dropped = port_stats.last().map_or(0, |s| s.device_drops.rx);
    let dev_dropped: u64 = port_stats.iter().map(|s| s.device_drops.total()).sum();
    let on_wire = tx_packets.saturating_sub(tx_dropped);
    let l1_bytes = tx_bytes + tx_packets * (FCS_BYTES + L1_OVERHEAD_BYTES);
    let (min, p50, p99, max) = if hist.is_empty() {
        (0, 0, 0, 0)
    } else {
        (
            hist.min(),
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99),
            hist.max(),
        )
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "tx_packets": tx_packets, "tx_bytes": tx_bytes, "rx_packets": rx_packets, "rx_bytes": rx_bytes,
                "lost": (!args.tx_only).then_some(lost), "tx_only": args.tx_only,
                "duplicates": tracker.duplicates, "reordered": tracker.reordered,
                "longest_gap": (!args.tx_only).then(|| serde_json::json!({
                    "frames": tracker.longest_gap, "first_seq": tracker.longest_gap_first,
                    "lost": tracker.longest_gap_missing(),
                    "seconds": tracker.longest_gap as f64 * secs / (tx_packets.max(1)) as f64,
                })),
                "duration_s": secs, "tx_pps": tx_packets as f64 / secs, "rx_pps": rx_packets as f64 / secs,
                "tx_gbps": tx_bytes as f64 * 8.0 / secs / 1e9,
                "tx_gbps_l1": l1_bytes as f64 * 8.0 / secs / 1e9,
                "device": {
                    "accepted": tx_packets, "tx_dropped": tx_dropped, "on_wire": on_wire,
                    "on_wire_pps": on_wire as f64 / secs, "rx_dropped": rx_dropped,
                    "dropped": dev_dropped,
                },
                "latency_ns": {"min": min, "p50": p50, "p99": p99, "max": max},
                "pool_in_use": in_use,
                "events": events.json(),
                "ports": port_stats.iter().enumerate().map(|(p, s)| {
                    let mut v = stats_json(s);
                    v["port"] = serde_json::json!(p);
                    v
                }).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "pktgen summary: sent {tx_packets} ({tx_bytes} B) in {secs:.2} s = {}pps, {:.3} Gbit/s ({:.3} Gbit/s L1)",
            si(tx_packets as f64 / secs),
            tx_bytes as f64 * 8.0 / secs / 1e9,
            l1_bytes as f64 * 8.0 / secs / 1e9,
        );
        println!(
            "  device: port 0 accepted {tx_packets}, dropped {tx_dropped}, {on_wire} left it ({}pps); port {} dropped {rx_dropped} on receive",
            si(on_wire as f64 / secs),
            np.saturating_sub(1),
        );
        if args.tx_only {
            println!("  tx-only: nothing received or counted as lost");
        } else {
            println!(
                "  received {rx_packets} ({rx_bytes} B), lost {lost} (dropped by these ports' devices {dev_dropped}, elsewhere {}), duplicates {}, reordered {}",
                lost.saturating_sub(dev_dropped),
                tracker.duplicates,
                tracker.reordered
            );
            if tracker.longest_gap > 1 {
                let missing = tracker.longest_gap_missing();
                println!(
                    "  longest gap: {} frames from sequence {} (about {:.3} s at the send rate), {missing} of them lost; lost outside it {}",
                    tracker.longest_gap,
                    tracker.longest_gap_first,
                    tracker.longest_gap as f64 * secs / tx_packets.max(1) as f64,
                    lost.saturating_sub(missing)
                );
            }
        }
        if !hist.is_empty() {
            println!(
                "  latency: min {:.1} us  p50 {:.1} us  p99 {:.1} us  max {:.1} us",
                min as f64 / 1e3,
                p50 as f64 / 1e3,
                p99 as f64 / 1e3,
                max as f64 / 1e3
            );
        }
        println!("  mbufs still in use at exit: {in_use}");
        for line in device_lines(port_stats)
            .into_iter()
            .chain(loss_lines(port_stats))
        {
            println!("{line}");
        }
        if !events.seen().is_empty() {
            println!("  port events: {}", events.seen().len());
        }
    }
}
