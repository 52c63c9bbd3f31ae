//! pmd-dumpcap: captures what a running l2fwd or pktgen (or any app with capture turned on)
//! receives and sends, into a pcapng file, without stopping it; like DPDK's dpdk-dumpcap.

use apps::cli::{usage, Failure};
use clap::Parser;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::interface_statistics::{
    InterfaceStatisticsBlock, InterfaceStatisticsOption,
};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use pmd::capture::ring::{Direction, Frame, Layout, RingCounters, RingId, RingReader};
use pmd::capture::server::SOCKET_NAME;
use pmd::sys::seqpacket::SeqConn;
use pmd::sys::DevMem;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Captures the frames a running app's ports receive and send, into a pcapng file.
///
/// The app (l2fwd, pktgen, or any app that turned capture on) mirrors the chosen ports'
/// frames into shared-memory rings that this tool drains; the app goes on forwarding. A
/// capture filter (`-f`, tcpdump syntax, compiled by libpcap) runs in the app, before any
/// copy. The file has one interface per port (named by its devargs), nanosecond
/// timestamps, the direction of every frame, and at the end the frames each port's
/// rings dropped (full) and the filter rejected. Stops at `-c`/`-a`, on Ctrl-C, or when the
/// app exits; a killed pmd-dumpcap stops the app's mirroring by itself.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The app's --file-prefix.
    #[arg(long, default_value = "rte", value_name = "P")]
    file_prefix: String,
    /// Ports to capture (ids, comma-separated or repeated) [default: port 0].
    #[arg(
        short = 'i',
        long = "interface",
        value_name = "PORT[,PORT...]",
        value_delimiter = ','
    )]
    ports: Vec<u16>,
    /// Capture only received frames.
    #[arg(long, conflicts_with = "tx")]
    rx: bool,
    /// Capture only sent frames.
    #[arg(long)]
    tx: bool,
    /// Capture filter (tcpdump / pcap-filter(7) syntax), e.g. 'udp dst port 9000'.
    #[arg(short = 'f', long = "filter", value_name = "FILTER")]
    filter: Option<String>,
    /// Stop after this many frames.
    #[arg(short = 'c', long = "count", value_name = "COUNT")]
    count: Option<u64>,
    /// Stop condition, as dumpcap's: `duration:SECONDS`.
    #[arg(short = 'a', long = "autostop", value_name = "duration:S", value_parser = autostop)]
    autostop: Option<f64>,
    /// The pcapng file to write.
    #[arg(
        short = 'w',
        long = "write",
        value_name = "FILE",
        required_unless_present = "list_interfaces"
    )]
    write: Option<PathBuf>,
    /// Bytes kept of each frame.
    #[arg(short = 's', long = "snapshot-length", default_value_t = 65535, value_parser = clap::value_parser!(u32).range(1..=65535))]
    snaplen: u32,
    /// Bytes of each queue's ring (a power of two, 64 KiB to 256 MiB).
    #[arg(long, default_value_t = 4 << 20, value_name = "BYTES")]
    ring_bytes: u64,
    /// List the app's ports and exit.
    #[arg(short = 'D', long = "list-interfaces")]
    list_interfaces: bool,
    /// No progress lines.
    #[arg(short = 'q', long)]
    quiet: bool,
}

fn autostop(s: &str) -> Result<f64, String> {
    let v = s
        .strip_prefix("duration:")
        .ok_or_else(|| format!("'{s}': expected duration:SECONDS"))?;
    apps::cli::positive_seconds(v)
}

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report("pmd-dumpcap"),
    }
}

/// The filter compiled by libpcap for Ethernet frames, as `[code, jt, jf, k]` rows.
fn compile(filter: &str) -> Result<Vec<[u32; 4]>, Failure> {
    let cap = pcap::Capture::dead(pcap::Linktype::ETHERNET).map_err(|e| format!("libpcap: {e}"))?;
    let prog = cap
        .compile(filter, true)
        .map_err(|e| usage(format!("bad capture filter '{filter}': {e}")))?;
    prog.get_instructions()
        .iter()
        .map(|i| {
            let f: Vec<u32> = i
                .to_string()
                .split(' ')
                .filter_map(|x| x.parse().ok())
                .collect();
            <[u32; 4]>::try_from(f)
                .map_err(|_| Failure::from(format!("libpcap gave an instruction '{i}'")))
        })
        .collect()
}

fn connect(prefix: &str) -> Result<SeqConn, Failure> {
    let dir = pmd::telemetry::runtime_dir(prefix);
    let path = dir.join(SOCKET_NAME);
    SeqConn::connect(&path).map_err(|e| {
        Failure::from(format!(
            "no running app with --file-prefix {prefix} to capture from ({}: {e}); start l2fwd or pktgen (capture is on unless --no-telemetry), or give its --file-prefix",
            path.display()
        ))
    })
}

fn recv_json(
    conn: &SeqConn,
    buf: &mut [u8],
) -> Result<(Value, Option<std::os::fd::OwnedFd>), Failure> {
    let (n, fd) = conn
        .recv_with_fd(buf)
        .map_err(|e| format!("the app did not answer: {e}"))?;
    if n == 0 {
        return Err("the app closed the capture connection".into());
    }
    let v = serde_json::from_slice(&buf[..n])
        .map_err(|e| format!("the app's answer is not JSON: {e}"))?;
    Ok((v, fd))
}

/// One interface of the file: a port.
struct Iface {
    port: u16,
    name: String,
}

fn run(args: &Args) -> Result<(), Failure> {
    // What can be checked here is checked before the app is asked for anything.
    let filter = args.filter.as_deref().map(compile).transpose()?;
    let out = match (&args.write, args.list_interfaces) {
        (Some(p), false) => {
            let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Some((p.clone(), f))
        }
        _ => None,
    };
    let conn = connect(&args.file_prefix)?;
    conn.set_timeouts(Some(Duration::from_secs(5)), Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 16];
    if args.list_interfaces {
        conn.send(json!({"list": null}).to_string().as_bytes())
            .map_err(|e| e.to_string())?;
        let (v, _) = recv_json(&conn, &mut buf)?;
        for p in v["ports"].as_array().into_iter().flatten() {
            println!(
                "{}. {} (rx queues {}, tx queues {})",
                p["port"],
                p["name"].as_str().unwrap_or("?"),
                p["rx_queues"],
                p["tx_queues"]
            );
        }
        return Ok(());
    }
    let ports = if args.ports.is_empty() {
        vec![0]
    } else {
        args.ports.clone()
    };
    let (out_path, out) = out.ok_or_else(|| usage("-w FILE is required"))?;
    let req = json!({"start": {
        "ports": ports, "rx": !args.tx, "tx": !args.rx, "snaplen": args.snaplen,
        "ring_bytes": args.ring_bytes, "filter": filter, "filter_text": args.filter,
    }});
    conn.send(req.to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let (v, fd) = recv_json(&conn, &mut buf)?;
    if let Some(e) = v.get("error") {
        return Err(format!("the app refused the capture: {}", e.as_str().unwrap_or("?")).into());
    }
    let ok = v
        .get("ok")
        .ok_or_else(|| format!("unexpected answer: {v}"))?;
    let fd = fd.ok_or("the app sent no capture memory")?;
    let file = std::fs::File::from(fd);
    let len = file.metadata().map_err(|e| e.to_string())?.len() as usize;
    let mem =
        DevMem::map_file(&file, len).map_err(|e| format!("mapping the capture memory: {e}"))?;
    let (layout, ids) = Layout::read(&mem).map_err(|e| e.to_string())?;
    check_rings(ok, &layout, &ids)?;

    // The file: one interface per port, in the order asked.
    let ifaces: Vec<Iface> = ok["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| Iface {
            port: p["port"].as_u64().unwrap_or(0) as u16,
            name: p["name"].as_str().unwrap_or("?").to_string(),
        })
        .collect();
    let shb = SectionHeaderBlock {
        options: vec![SectionHeaderOption::UserApplication(Cow::Owned(format!(
            "pmd-dumpcap {}",
            env!("CARGO_PKG_VERSION")
        )))],
        ..Default::default()
    };
    let mut w =
        PcapNgWriter::with_section_header(BufWriter::new(out), shb).map_err(|e| e.to_string())?;
    for (i, f) in ifaces.iter().enumerate() {
        let speed = ok["ports"][i]["speed_mbps"].as_u64().unwrap_or(0);
        let mut options = vec![
            InterfaceDescriptionOption::IfName(Cow::Owned(f.name.clone())),
            InterfaceDescriptionOption::IfDescription(Cow::Owned(format!("port {}", f.port))),
            InterfaceDescriptionOption::IfTsResol(9),
        ];
        if speed > 0 {
            options.push(InterfaceDescriptionOption::IfSpeed(speed * 1_000_000));
        }
        if let Some(t) = &args.filter {
            // if_filter: a first byte of 0 says "a libpcap filter string".
            let mut b = vec![0u8];
            b.extend_from_slice(t.as_bytes());
            options.push(InterfaceDescriptionOption::IfFilter(Cow::Owned(b)));
        }
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: args.snaplen,
            options,
        })
        .map_err(|e| e.to_string())?;
    }
    let iface_of: Vec<u32> = ids
        .iter()
        .map(|r| ifaces.iter().position(|f| f.port == r.port).unwrap_or(0) as u32)
        .collect();
    let mut readers: Vec<RingReader> = (0..ids.len())
        .map(|i| RingReader::new(&mem, &layout, i))
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|e| e.to_string())?;
    }
    if !args.quiet {
        eprintln!(
            "pmd-dumpcap: capturing {} on port(s) {} into {}{}",
            if args.rx {
                "received frames"
            } else if args.tx {
                "sent frames"
            } else {
                "received and sent frames"
            },
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(","),
            out_path.display(),
            args.filter
                .as_deref()
                .map(|f| format!(" (filter '{f}')"))
                .unwrap_or_default()
        );
    }
    let t0 = Instant::now();
    let start_ns = now_ns();
    let mut written: u64 = 0;
    let mut beyond_count: u64 = 0;
    let mut last_note = Instant::now();
    let mut batch: Vec<(u32, Direction, Frame)> = Vec::new();
    let mut frames = Vec::new();
    let mut app_gone = false;
    let mut failure: Option<String> = None;
    conn.set_timeouts(Some(Duration::from_millis(1)), Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    loop {
        let done = stop.load(Ordering::Relaxed)
            || args
                .autostop
                .is_some_and(|s| t0.elapsed().as_secs_f64() >= s)
            || args.count.is_some_and(|c| written >= c);
        if done {
            break;
        }
        let n = drain(&mem, &mut readers, &ids, &iface_of, &mut frames, &mut batch)
            .map_err(|e| e.to_string());
        match n {
            Ok(0) => {
                // Nothing waiting: is the app still there? (It says nothing during a capture.)
                match conn.recv(&mut buf) {
                    Ok((0, _)) => {
                        app_gone = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => {
                        app_gone = true;
                        break;
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                failure = Some(format!("the capture rings are corrupt: {e}"));
                break;
            }
        }
        write_batch(
            &mut w,
            &mut batch,
            args.count,
            &mut written,
            &mut beyond_count,
        )?;
        if !args.quiet && last_note.elapsed() >= Duration::from_secs(1) {
            last_note = Instant::now();
            eprintln!(
                "pmd-dumpcap: [{:6.1}s] {written} frames",
                t0.elapsed().as_secs_f64()
            );
        }
    }
    // Stop the mirroring, wait until no queue writes any more, then take what is left.
    let mut released = false;
    if !app_gone {
        conn.set_timeouts(Some(Duration::from_secs(5)), Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        if conn
            .send(json!({"stop": null}).to_string().as_bytes())
            .is_ok()
        {
            if let Ok((v, _)) = recv_json(&conn, &mut buf) {
                released = v["stopped"]["released"].as_bool().unwrap_or(false);
            }
        }
    }
    if failure.is_none() && args.count.is_none_or(|c| written < c) {
        if let Err(e) = drain(&mem, &mut readers, &ids, &iface_of, &mut frames, &mut batch) {
            failure = Some(format!("the capture rings are corrupt: {e}"));
        }
        write_batch(
            &mut w,
            &mut batch,
            args.count,
            &mut written,
            &mut beyond_count,
        )?;
    }
    // Statistics per interface, summed over its rings.
    let end_ns = now_ns();
    let mut per_iface = vec![RingCounters::default(); ifaces.len()];
    for (r, reader) in readers.iter().enumerate() {
        let c = reader.counters(&mem);
        let t = &mut per_iface[iface_of[r] as usize];
        t.seen += c.seen;
        t.filtered += c.filtered;
        t.dropped += c.dropped;
    }
    for (i, c) in per_iface.iter().enumerate() {
        w.write_pcapng_block(InterfaceStatisticsBlock {
            interface_id: i as u32,
            timestamp: end_ns,
            options: vec![
                InterfaceStatisticsOption::IsbStartTime(start_ns),
                InterfaceStatisticsOption::IsbEndTime(end_ns),
                InterfaceStatisticsOption::IsbIfRecv(c.seen),
                InterfaceStatisticsOption::IsbIfDrop(c.dropped),
                InterfaceStatisticsOption::IsbFilterAccept(c.seen - c.filtered),
            ],
        })
        .map_err(|e| e.to_string())?;
    }
    w.get_mut()
        .flush()
        .map_err(|e| format!("{}: {e}", out_path.display()))?;
    let total = per_iface
        .iter()
        .fold(RingCounters::default(), |a, c| RingCounters {
            seen: a.seen + c.seen,
            filtered: a.filtered + c.filtered,
            dropped: a.dropped + c.dropped,
        });
    eprintln!(
        "pmd-dumpcap: {written} frames captured in {:.1} s, {} dropped (ring full), {} filtered out, {} seen{}",
        t0.elapsed().as_secs_f64(),
        total.dropped,
        total.filtered,
        total.seen,
        if beyond_count > 0 { format!(", {beyond_count} past the count not written") } else { String::new() }
    );
    if let Some(f) = failure {
        return Err(f.into());
    }
    if app_gone {
        eprintln!("pmd-dumpcap: the app exited; the file holds what it mirrored until then");
    } else if !released {
        eprintln!(
            "pmd-dumpcap: warning: the app did not confirm that every queue stopped mirroring"
        );
    }
    Ok(())
}

/// Checks that the rings the app described are the ones in the memory.
fn check_rings(ok: &Value, layout: &Layout, ids: &[RingId]) -> Result<(), Failure> {
    let said = ok["rings"].as_array().map_or(0, Vec::len);
    if said != ids.len() || ok["ring_bytes"].as_u64() != Some(layout.ring_bytes) {
        return Err(format!(
            "the capture memory has {} rings of {} bytes, the app said {said} of {}",
            ids.len(),
            layout.ring_bytes,
            ok["ring_bytes"]
        )
        .into());
    }
    Ok(())
}

/// Drains every ring into `batch`, returns how many frames came.
fn drain(
    mem: &DevMem,
    readers: &mut [RingReader],
    ids: &[RingId],
    iface_of: &[u32],
    frames: &mut Vec<Frame>,
    batch: &mut Vec<(u32, Direction, Frame)>,
) -> Result<usize, pmd::capture::ring::RingError> {
    let mut n = 0;
    for (r, reader) in readers.iter_mut().enumerate() {
        n += reader.drain(mem, 4096, frames)?;
        batch.extend(frames.drain(..).map(|f| (iface_of[r], ids[r].dir, f)));
    }
    Ok(n)
}

/// Writes `batch` in time order (up to `count` frames in all).
fn write_batch<W: Write>(
    w: &mut PcapNgWriter<W>,
    batch: &mut Vec<(u32, Direction, Frame)>,
    count: Option<u64>,
    written: &mut u64,
    beyond: &mut u64,
) -> Result<(), Failure> {
    batch.sort_by_key(|(_, _, f)| f.ts_ns);
    for (iface, dir, f) in batch.drain(..) {
        if count.is_some_and(|c| *written >= c) {
            *beyond += 1;
            continue;
        }
        // epb_flags bits 0-1: 1 inbound, 2 outbound.
        let flags = match dir {
            Direction::Rx => 1,
            Direction::Tx => 2,
        };
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: iface,
            timestamp: Duration::from_nanos(f.ts_ns),
            original_len: f.origlen,
            data: Cow::Owned(f.data),
            options: vec![EnhancedPacketOption::Flags(flags)],
        })
        .map_err(|e| format!("writing the capture file: {e}"))?;
        *written += 1;
    }
    Ok(())
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
