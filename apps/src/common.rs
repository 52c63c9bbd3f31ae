//! What the tools share: pool and port set-up, port events, idle back-off, counters,
//! formatting.
#![deny(unsafe_code)]

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{wait_events, Port, PortConfig, PortEvent, PortSpec, Stats};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A counter with one writer (a polling core) and any number of readers.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (single writer: a relaxed load and store, no locked instruction).
    #[inline]
    pub fn add(&self, n: u64) {
        if n != 0 {
            self.0
                .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        }
    }
    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Creates the mbuf pool for `ports` ports with the given ring sizes and cores, its data room
/// sized for frames of `mtu` ([`crate::cli::data_room_for`]: 2048 bytes up to MTU 2030, 9024
/// for jumbo frames of MTU 9000).
///
/// # Errors
/// The pool's error (size, memory).
pub fn make_pool(
    name: &str,
    ports: usize,
    rxq: u16,
    txq: u16,
    ring: u16,
    cores: usize,
    mtu: u16,
) -> Result<Arc<MbufPool>, mempool::Error> {
    // Every RX descriptor holds a buffer, every TX descriptor may; plus per-core caches and
    // bursts in flight.
    let per_port = u32::from(rxq) * u32::from(ring) + u32::from(txq) * u32::from(ring);
    let n = (ports as u32 * per_port + cores as u32 * (512 + 1024) + 4096).next_power_of_two() - 1;
    MbufPool::new(MbufPoolConfig::new(name, n).data_room(crate::cli::data_room_for(mtu)))
}

/// Opens and configures `specs` as ports 0.., each with `rxq` RX (unless the spec says
/// otherwise) and `txq` TX queues. `base.promiscuous` asks for promiscuous mode where a port
/// has it (MANA has none: its ports receive their own MAC, broadcast and multicast).
///
/// # Errors
/// A message naming the port and what went wrong.
pub fn open_ports(
    specs: &[PortSpec],
    base: &PortConfig,
    pool: &Arc<MbufPool>,
) -> Result<Vec<Port>, String> {
    let mut ports = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let mut port = Port::open(i as u16, spec).map_err(|e| format!("port {i} ({spec}): {e}"))?;
        let cfg = PortConfig {
            rx_queues: spec.rxq.unwrap_or(base.rx_queues),
            tx_queues: spec.txq.unwrap_or(base.tx_queues).max(base.tx_queues),
            promiscuous: base.promiscuous && port.caps().promiscuous,
            ..base.clone()
        };
        port.configure(&cfg, pool)
            .map_err(|e| format!("port {i} ({spec}): {e}"))?;
        ports.push(port);
    }
    Ok(ports)
}

/// Waits until every port's link is up, at most `timeout` in all (DPDK apps do the same
/// before forwarding). A device-model port is down until the far end of its cable is
/// attached, so this is also how two processes on one cable find each other.
///
/// # Errors
/// The ports still down at the deadline, with what to check.
pub fn wait_links(ports: &[Port], timeout: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    let mut down = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if let Err(e) = port.wait_link_up(left) {
            down.push(format!("port {i}: {e}"));
        }
    }
    if down.is_empty() {
        Ok(())
    } else {
        Err(down.join("\n"))
    }
}

/// Tells scripts that the tool is ready (its ports are open, started and their links waited
/// for; forwarding or sending starts now): with `--json`, one line on stderr,
/// `{"event":"ready","tool":..,"pid":..,"ports":[{"port","spec","mac","link_up"}]}`, so a
/// script starts the next process when it sees it instead of sleeping. stdout keeps only the
/// summary document.
pub fn announce_ready(tool: &str, specs: &[PortSpec], ports: &[Port], json: bool) {
    if !json {
        return;
    }
    let ports: Vec<serde_json::Value> = ports
        .iter()
        .zip(specs)
        .enumerate()
        .map(|(i, (p, spec))| {
            serde_json::json!({
                "port": i,
                "spec": spec.to_string(),
                "mac": p.mac().to_string(),
                "link_up": p.link().up,
            })
        })
        .collect();
    eprintln!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "tool": tool,
            "pid": std::process::id(),
            "ports": ports,
        })
    );
}

/// One port event as a tool saw it.
#[derive(Debug, Clone)]
pub struct SeenEvent {
    /// Seconds since the tool started watching.
    pub t_s: f64,
    /// Port index (as given on the command line).
    pub port: usize,
    /// What happened.
    pub event: PortEvent,
}

/// The ports' events, watched from a tool's main (statistics) loop, never from a polling
/// core: [`EventWatch::wait`] takes the place of the loop's sleep, logs every event on
/// stderr (`TOOL: port N (SPEC): EVENT`) and keeps them for the final report.
#[derive(Debug)]
pub struct EventWatch {
    tool: &'static str,
    names: Vec<String>,
    t0: Instant,
    seen: Vec<SeenEvent>,
    poll_failed: bool,
}

impl EventWatch {
    /// Watches `ports` for `tool` (the log prefix), timing events from `t0`.
    pub fn new(tool: &'static str, ports: &[Port], t0: Instant) -> Self {
        Self {
            tool,
            names: ports.iter().map(|p| p.name().to_string()).collect(),
            t0,
            seen: Vec::new(),
            poll_failed: false,
        }
    }

    /// Waits up to `timeout` for events on `ports`, logs and records them. Returns the
    /// message of the first fatal one (device failed or removed), after which the tool
    /// should stop; link changes are only logged.
    pub fn wait(&mut self, ports: &mut [Port], timeout: Duration) -> Option<String> {
        let got = if self.poll_failed {
            std::thread::sleep(timeout);
            Vec::new()
        } else {
            wait_events(ports, timeout).unwrap_or_else(|e| {
                eprintln!(
                    "{}: warning: watching port events failed ({e}); events are no longer reported",
                    self.tool
                );
                self.poll_failed = true;
                Vec::new()
            })
        };
        let mut fatal = None;
        for (port, event) in got {
            let what = format!("port {port} ({}): {event}", self.names[port]);
            eprintln!("{}: {what}", self.tool);
            if event.is_fatal() && fatal.is_none() {
                fatal = Some(format!("{what}: stopping"));
            }
            self.seen.push(SeenEvent {
                t_s: self.t0.elapsed().as_secs_f64(),
                port,
                event,
            });
        }
        fatal
    }

    /// The events seen so far, oldest first.
    pub fn seen(&self) -> &[SeenEvent] {
        &self.seen
    }

    /// The events as a JSON array for `--json` reports:
    /// `[{"t_s": .., "port": N, "event": "link_down", "message": "link down"}, ..]`.
    pub fn json(&self) -> Value {
        Value::Array(
            self.seen
                .iter()
                .map(|e| {
                    json!({
                        "t_s": e.t_s,
                        "port": e.port,
                        "event": e.event.name(),
                        "message": e.event.to_string(),
                    })
                })
                .collect(),
        )
    }
}

/// Back-off for a polling loop that found nothing to do, so that on a small machine other
/// processes (and device-model engine threads, `engine=thread`) get the CPU when there is no
/// traffic. A loop that moves packets keeps its CPU, as DPDK's lcores do: the device models'
/// default inline engines do their work on this very core, and giving it away (a yield hands
/// a loaded machine's core to whoever else is runnable, for a whole time slice) only lets the
/// cables fill. Busy mode never yields.
#[derive(Debug, Clone)]
pub struct Idle {
    busy: bool,
    empty: u32,
}

impl Idle {
    /// `busy`: spin forever (benchmarks on dedicated cores).
    pub fn new(busy: bool) -> Self {
        Self { busy, empty: 0 }
    }

    /// Call after each loop iteration with whether it moved any packet.
    #[inline]
    pub fn after(&mut self, did_work: bool) {
        if self.busy {
            return;
        }
        if did_work {
            self.empty = 0;
            return;
        }
        self.empty = self.empty.saturating_add(1);
        if self.empty < 256 {
            std::hint::spin_loop();
        } else if self.empty < 512 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(u64::from(
                (self.empty - 511).min(100),
            )));
        }
    }
}

/// The counters of a port that count frames lost or refused somewhere on its way (the
/// device's and the driver's: `dev_tx_wire_drops`, a full cable; `dev_rx_no_wqe`, no
/// buffer; `*_errors`, `*_drops`, `*_full`, ...), those that are not zero, by name. With them a
/// tool says where frames went that did not arrive.
pub fn loss_counters(stats: &Stats) -> Vec<(String, u64)> {
    const LOSS: [&str; 8] = [
        "drop", "no_wqe", "full", "miss", "error", "overflow", "trunc", "flush",
    ];
    let mut out: Vec<(String, u64)> = stats
        .xstats
        .iter()
        .filter(|(n, v)| *v > 0 && LOSS.iter().any(|w| n.contains(w)))
        .cloned()
        .collect();
    for (name, v) in [
        ("imissed", stats.imissed),
        ("ierrors", stats.ierrors),
        ("oerrors", stats.oerrors),
        ("rx_nombuf", stats.rx_nombuf),
    ] {
        if v > 0 {
            out.push((name.to_string(), v));
        }
    }
    out
}

/// A port's statistics for a `--json` report: the basic counters and every extended
/// counter by name.
pub fn stats_json(stats: &Stats) -> Value {
    let x: serde_json::Map<String, Value> = stats
        .xstats
        .iter()
        .map(|(n, v)| (n.clone(), json!(v)))
        .collect();
    json!({
        "ipackets": stats.ipackets, "opackets": stats.opackets, "imissed": stats.imissed,
        "ierrors": stats.ierrors, "oerrors": stats.oerrors, "rx_nombuf": stats.rx_nombuf,
        "xstats": x,
    })
}

/// One line per port with loss counters (nothing for a port without losses), for a text
/// summary: `  port 1 losses: dev_tx_wire_drops 4630`.
pub fn loss_lines(stats: &[Stats]) -> Vec<String> {
    stats
        .iter()
        .enumerate()
        .filter_map(|(p, s)| {
            let l = loss_counters(s);
            (!l.is_empty()).then(|| {
                let list: Vec<String> = l.iter().map(|(n, v)| format!("{n} {v}")).collect();
                format!("  port {p} losses: {}", list.join(", "))
            })
        })
        .collect()
}

/// `1234567.0` -> `"1.23 M"`.
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} k", v / 1e3)
    } else {
        format!("{v:.0} ")
    }
}
