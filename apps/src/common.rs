//! What the tools share: pool and port set-up, port events, idle back-off, counters,
//! formatting.
#![deny(unsafe_code)]

use crate::cli::{usage, Failure};
use mempool::{MbufPool, MbufPoolConfig};
use pmd::lcore::StopFlag;
use pmd::port::{wait_events, Port, PortConfig, PortEvent, PortSpec, PortState, Stats};
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

/// Buffers each polling core may hold outside the rings: its mbuf cache (512) and the
/// bursts it has in hand.
const PER_CORE: u64 = 512 + 1024;

/// The ports a tool runs, open and configured, and the pool that feeds them.
pub struct PortSet {
    /// Ports 0.. in the order given.
    pub ports: Vec<Port>,
    /// Their shared mbuf pool.
    pub pool: Arc<MbufPool>,
}

/// Opens `specs` as ports 0.., sizes one mbuf pool for them and configures each with `rxq`
/// RX queues (`base.rx_queues` unless its spec says `rxq=`) and `txq` TX queues (the spec's
/// `txq=`, never fewer than `base.tx_queues`: every polling core sends on its own).
/// `base.promiscuous` asks for promiscuous mode where a port has it (MANA has none: its
/// ports receive their own MAC, broadcast and multicast).
///
/// The pool is sized once the ports are open, from what each will really get (queue counts
/// from the devargs, ring sizes as the device takes them), and before anything is allocated
/// for it: every RX descriptor holds a buffer, every TX descriptor may, plus `cores` per-core
/// caches and bursts in flight. `pool_size` (`--pool-size`) overrides that; it must at least
/// fill the RX rings, with a burst's room per core.
///
/// # Errors
/// A usage error for a `pool_size` too small for the rings; otherwise a runtime error naming
/// the port and what went wrong, or the pool's (memory).
pub fn open_ports(
    name: &str,
    specs: &[PortSpec],
    base: &PortConfig,
    cores: usize,
    pool_size: Option<u32>,
) -> Result<PortSet, Failure> {
    let mut ports = Vec::new();
    // What each port is asked for (configure reduces ring sizes and says so), and what it
    // will get (the pool is sized for that).
    let mut asked = Vec::new();
    let mut cfgs = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let port = Port::open(i as u16, spec).map_err(|e| format!("port {i} ({spec}): {e}"))?;
        let cfg = PortConfig {
            promiscuous: base.promiscuous && port.caps().promiscuous,
            ..port_config(spec, base)
        };
        cfgs.push(port.effective_config(&cfg));
        asked.push(cfg);
        ports.push(port);
    }
    let plan = PoolPlan::new(&cfgs, cores, pool_size, base.mtu)?;
    let pool = MbufPool::new(plan.config(name)).map_err(|e| {
        format!(
            "mbuf pool of {} buffers of {} bytes: {e}",
            plan.count, plan.data_room
        )
    })?;
    tracing::info!(target: "apps", buffers = plan.count, "mbuf pool");
    for (i, (port, cfg)) in ports.iter_mut().zip(&asked).enumerate() {
        port.configure(cfg, &pool)
            .map_err(|e| format!("port {i} ({}): {e}", specs[i]))?;
    }
    Ok(PortSet { ports, pool })
}

/// What a tool asks of the port `spec` names, from its own options in `base`: the spec's
/// `rxq=` (else `base.rx_queues`) and `txq=` (never fewer than `base.tx_queues`: every polling
/// core sends on its own).
pub fn port_config(spec: &PortSpec, base: &PortConfig) -> PortConfig {
    PortConfig {
        rx_queues: spec.rxq.unwrap_or(base.rx_queues),
        tx_queues: spec.txq.unwrap_or(base.tx_queues).max(base.tx_queues),
        ..base.clone()
    }
}

/// The mbuf pool a tool makes: how many buffers, and how much data room each has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    /// Buffers in the pool.
    pub count: u32,
    /// Data room of each, in bytes.
    pub data_room: u16,
}

impl PoolPlan {
    /// The pool for ports configured as `cfgs` (what each will really get), polled by `cores`
    /// cores, for frames of `mtu`: every RX descriptor holds a buffer, every TX descriptor
    /// may, plus per-core caches and bursts in flight; `pool_size` (`--pool-size`) overrides
    /// the count but must at least fill the RX rings, with a burst's room per core. The data
    /// room holds the longest frame of the MTU (2048 bytes up to MTU 2030, 9024 for jumbo
    /// frames of MTU 9000).
    ///
    /// # Errors
    /// A usage error for a `pool_size` too small for the rings.
    pub fn new(
        cfgs: &[PortConfig],
        cores: usize,
        pool_size: Option<u32>,
        mtu: u16,
    ) -> Result<Self, Failure> {
        let sizing = PoolSizing::of(cfgs, cores);
        let count = match pool_size {
            None => sizing.default_count(),
            Some(n) if u64::from(n) < sizing.minimum() => {
                return Err(usage(format!(
                    "--pool-size {n}: the ports' RX rings hold {} mbufs ({}) and each of {cores} \
                     polling core(s) needs {} more in flight: give at least {} (the default \
                     here is {})",
                    sizing.rx,
                    describe_rx(cfgs),
                    BURST_ROOM,
                    sizing.minimum(),
                    sizing.default_count()
                )))
            }
            Some(n) => n,
        };
        Ok(PoolPlan {
            count,
            data_room: crate::cli::data_room_for(mtu),
        })
    }

    /// The pool's configuration, named `name`.
    pub fn config(&self, name: &str) -> MbufPoolConfig {
        MbufPoolConfig::new(name, self.count).data_room(self.data_room)
    }

    /// Bytes of memory the pool maps (see [`MbufPoolConfig::memory_bytes`]).
    pub fn memory_bytes(&self) -> Option<usize> {
        self.config("plan").memory_bytes()
    }
}

/// The room `--pool-size` must leave per polling core beyond the RX rings: a burst in hand
/// on receive and one on transmit.
const BURST_ROOM: u64 = 64;

/// How many buffers a set of port configurations holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolSizing {
    /// RX descriptors, all ports and queues.
    rx: u64,
    /// TX descriptors.
    tx: u64,
    /// Polling cores.
    cores: u64,
}

impl PoolSizing {
    fn of(cfgs: &[PortConfig], cores: usize) -> Self {
        let sum = |f: fn(&PortConfig) -> u64| cfgs.iter().map(f).sum::<u64>();
        PoolSizing {
            rx: sum(|c| u64::from(c.rx_queues) * u64::from(c.rx_ring_size)),
            tx: sum(|c| u64::from(c.tx_queues) * u64::from(c.tx_ring_size)),
            cores: cores as u64,
        }
    }

    /// The fewest buffers that keep every RX ring full with a burst per core in flight.
    fn minimum(&self) -> u64 {
        self.rx + self.cores * BURST_ROOM
    }

    /// Every ring full, per-core caches and bursts, 4,096 spare; a power of two less one
    /// (the pool's ring holds one fewer than its size), at most [`crate::cli::MAX_POOL`] (the
    /// port then says which ring it cannot fill).
    fn default_count(&self) -> u32 {
        let n = (self.rx + self.tx + self.cores * PER_CORE + 4096).next_power_of_two() - 1;
        n.min(u64::from(crate::cli::MAX_POOL)) as u32
    }
}

/// "16 × 4096 + 1 × 512": queues × descriptors per port, for the error message.
fn describe_rx(cfgs: &[PortConfig]) -> String {
    cfgs.iter()
        .map(|c| format!("{} × {}", c.rx_queues, c.rx_ring_size))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Waits until every port's link is up, at most `timeout` in all (DPDK apps do the same
/// before forwarding), or until `stop` is set (a stop signal during start-up ends the wait at
/// once; the caller then stops as it would have later). A device-model port is down until
/// the far end of its cable is attached (or, on an afpacket wire, while the interface is
/// down), so this is also how two processes on one cable find each other.
///
/// Each port found down is reported at once on stderr, so a user is not left guessing
/// during the wait: `TOOL: warning: port N (SPEC): link down; waiting up to S s for it
/// (--link-timeout)`, or `...; not waiting (--link-timeout 0)` when `timeout` is zero.
///
/// # Errors
/// The ports still down at the deadline, with what to check.
pub fn wait_links(
    tool: &str,
    ports: &[Port],
    timeout: Duration,
    stop: &StopFlag,
) -> Result<(), String> {
    for (i, port) in ports.iter().enumerate() {
        if !port.link().up {
            if timeout.is_zero() {
                eprintln!(
                    "{tool}: warning: port {i} ({}): link down; not waiting (--link-timeout 0)",
                    port.name()
                );
            } else {
                eprintln!(
                    "{tool}: warning: port {i} ({}): link down; waiting up to {} s for it (--link-timeout)",
                    port.name(),
                    timeout.as_secs_f64()
                );
            }
        }
    }
    let t0 = Instant::now();
    loop {
        let down: Vec<usize> = (0..ports.len()).filter(|&i| !ports[i].link().up).collect();
        if down.is_empty() || stop.is_set() {
            return Ok(());
        }
        if t0.elapsed() >= timeout {
            return Err(down
                .iter()
                .map(|&i| {
                    format!(
                        "port {i}: {}: link still down after {:.1} s: is the far end of the \
                         cable (the peer process or interface) there and up?",
                        ports[i].name(),
                        t0.elapsed().as_secs_f64()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"));
        }
        std::thread::sleep(Duration::from_millis(2));
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
    /// message of the first one that ends a port for good, after which the tool should stop:
    /// a device that failed or went away on a port that does not recover, or a recovery
    /// that failed ([`PortEvent::RecoveryFailed`], with [`Port::failure`]'s reason). A port
    /// that recovers by itself ([`PortState::Recovering`] after the loss) is only logged,
    /// like link changes.
    pub fn wait(&mut self, ports: &mut [Port], timeout: Duration) -> Option<String> {
        let got = if self.poll_failed {
            // Without poll, still drive the recoveries (each looks for its device when due).
            std::thread::sleep(timeout.min(pmd::port::recovery::RETRY_INTERVAL));
            let mut got = Vec::new();
            for (i, p) in ports.iter_mut().enumerate() {
                if p.state() == PortState::Recovering {
                    got.extend(p.take_events().into_iter().map(|e| (i, e)));
                }
            }
            got
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
            let mut what = format!("port {port} ({}): {event}", self.names[port]);
            if event == PortEvent::RecoveryFailed {
                if let Some(why) = ports[port].failure() {
                    what = format!("port {port}: recovery failed: {why}");
                }
            }
            eprintln!("{}: {what}", self.tool);
            let recovering = matches!(
                ports[port].state(),
                PortState::Recovering | PortState::Started | PortState::Configured
            ) && ports[port].recovers();
            let ends = match event {
                PortEvent::RecoveryFailed => true,
                e => e.is_fatal() && !recovering,
            };
            if ends && fatal.is_none() {
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
                    let mut v = json!({
                        "t_s": e.t_s,
                        "port": e.port,
                        "event": e.event.name(),
                        "message": e.event.to_string(),
                    });
                    if let PortEvent::Recovered { downtime } = e.event {
                        v["downtime_s"] = downtime.as_secs_f64().into();
                    }
                    v
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

/// The counters of a port that count frames lost or refused somewhere on its way, those that
/// are not zero, by name: the extended counters its driver, device and wire declare as losses
/// ([`pmd::ethdev::Loss`]: `dev_tx_wire_drops`, a full cable; `dev_rx_no_wqe`, no buffer;
/// `wire_rx_stale`, frames sent on a cable before this end was attached; error
/// completions, ...), then the basic counters'. With them a tool says where frames went that
/// did not arrive.
pub fn loss_counters(stats: &Stats) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = stats
        .losses
        .iter()
        .map(|x| (x.name.clone(), x.value))
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

/// A port's statistics for a `--json` report: the basic counters, the frames its device
/// dropped (`Stats::device_drops`), every queue's counters and every extended counter by name
/// (zeros included).
pub fn stats_json(stats: &Stats) -> Value {
    let x: serde_json::Map<String, Value> = stats
        .xstats
        .iter()
        .map(|(n, v)| (n.clone(), json!(v)))
        .collect();
    let queues = |qs: &[pmd::port::QueueStats]| -> Vec<Value> {
        qs.iter()
            .enumerate()
            .map(|(i, q)| {
                json!({"queue": i, "packets": q.packets, "bytes": q.bytes, "errors": q.errors,
                    "missed": q.missed, "nombuf": q.nombuf})
            })
            .collect()
    };
    let d = stats.device_drops;
    json!({
        "ipackets": stats.ipackets, "opackets": stats.opackets, "ibytes": stats.ibytes,
        "obytes": stats.obytes, "imissed": stats.imissed, "ierrors": stats.ierrors,
        "oerrors": stats.oerrors, "rx_nombuf": stats.rx_nombuf,
        "device_drops": {"tx": d.tx, "rx": d.rx},
        "rx_queues": queues(&stats.rx_queues), "tx_queues": queues(&stats.tx_queues),
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

/// The device counters of every port for a text summary, readable: per port its basic
/// counters and the frames its device dropped, the queues of a port with more than one
/// (those with any count), and its extended counters that are not zero (`--json` has all):
///
/// ```text
///   port 0 device: ipackets 0 opackets 1000 imissed 0 rx_nombuf 0, dropped tx 500 rx 0
///   port 0 rxq 1: packets 10 missed 3
///   port 0 xstats: dev_tx_frames 500, dev_tx_errors 500, dev_tx_mtu_errors 500
/// ```
pub fn device_lines(stats: &[Stats]) -> Vec<String> {
    let mut out = Vec::new();
    for (p, s) in stats.iter().enumerate() {
        let d = s.device_drops;
        out.push(format!(
            "  port {p} device: ipackets {} opackets {} imissed {} ierrors {} oerrors {} rx_nombuf {}, dropped tx {} rx {}",
            s.ipackets, s.opackets, s.imissed, s.ierrors, s.oerrors, s.rx_nombuf, d.tx, d.rx
        ));
        for (dir, qs) in [("rxq", &s.rx_queues), ("txq", &s.tx_queues)] {
            if qs.len() < 2 {
                continue;
            }
            for (i, q) in qs.iter().enumerate() {
                let mut parts = Vec::new();
                for (n, v) in [
                    ("packets", q.packets),
                    ("errors", q.errors),
                    ("missed", q.missed),
                    ("nombuf", q.nombuf),
                ] {
                    if v > 0 {
                        parts.push(format!("{n} {v}"));
                    }
                }
                if !parts.is_empty() {
                    out.push(format!("  port {p} {dir} {i}: {}", parts.join(" ")));
                }
            }
        }
        let x: Vec<String> = s
            .xstats
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        if !x.is_empty() {
            out.push(format!("  port {p} xstats: {}", x.join(", ")));
        }
    }
    out
}

/// The [`Wire::stats`](pmd::emu::wire::Wire::stats) entries of a device-model port's pcap
/// capture (`pcap=FILE`), as its extended counters name them: write failures, and the OS
/// error of the first.
const PCAP_ERRORS: &str = "wire_pcap_write_errors";
const PCAP_ERRNO: &str = "wire_pcap_write_errno";
const PCAP_UNRECORDED: &str = "wire_pcap_unrecorded";

/// Why the pcap capture of `stats`' port failed after it opened (a full disk), or `None`
/// while it records (or the port records nothing). A tool stops on it with status 1: a
/// capture with frames missing is not what was asked for.
pub fn capture_failure(stats: &Stats) -> Option<String> {
    let get = |name: &str| {
        stats
            .xstats
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    };
    if get(PCAP_ERRORS) == 0 {
        return None;
    }
    let why = match i32::try_from(get(PCAP_ERRNO)) {
        Ok(e) if e > 0 => std::io::Error::from_raw_os_error(e).to_string(),
        _ => "write error".to_string(),
    };
    Some(format!(
        "writing the pcap capture failed ({why}): the file ends at the last whole record \
         before it; the frames it lacks are counted as {PCAP_UNRECORDED}"
    ))
}

/// The first port whose pcap capture failed ([`capture_failure`]), as a fatal message for a
/// tool's main loop: `port 0 (SPEC): writing the pcap capture failed (...): stopping`.
pub fn failed_capture(ports: &[Port]) -> Option<String> {
    ports.iter().enumerate().find_map(|(i, p)| {
        capture_failure(&p.stats()).map(|m| format!("port {i} ({}): {m}: stopping", p.name()))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rxq: u16, txq: u16, ring: u16) -> PortConfig {
        PortConfig {
            rx_queues: rxq,
            tx_queues: txq,
            rx_ring_size: ring,
            tx_ring_size: ring,
            ..Default::default()
        }
    }

    #[test]
    fn the_pool_holds_every_ring_of_every_port_with_its_own_queue_counts() {
        // rxq=16 on one port, ring 4096: 16 × 4096 + 1 × 4096 RX descriptors.
        let s = PoolSizing::of(&[cfg(16, 1, 4096), cfg(1, 1, 4096)], 1);
        assert_eq!(s.rx, 17 * 4096);
        assert_eq!(s.tx, 2 * 4096);
        assert_eq!(s.minimum(), 17 * 4096 + BURST_ROOM);
        let n = u64::from(s.default_count());
        assert!(n >= s.rx + s.tx + PER_CORE, "{n}");
        assert!((n + 1).is_power_of_two());
        assert_eq!(
            describe_rx(&[cfg(16, 1, 4096), cfg(1, 1, 4096)]),
            "16 × 4096 + 1 × 4096"
        );
    }

    #[test]
    fn the_default_never_exceeds_the_largest_pool() {
        let s = PoolSizing::of(&vec![cfg(1024, 1024, 32768); 4], 64);
        assert_eq!(s.default_count(), crate::cli::MAX_POOL);
    }

    fn stats(x: &[(&str, u64)]) -> Stats {
        let mut s = Stats::default();
        s.imissed = 7;
        s.oerrors = 3;
        s.xstats = x.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        s
    }

    /// The losses a tool lists are the counters declared as losses that are not zero, then
    /// the basic counters'; the device drops add the declared device drops to the basic
    /// counters once.
    #[test]
    fn loss_counters_and_device_drops_follow_the_declared_kinds() {
        use pmd::ethdev::{DeviceDrops, Loss, Xstat};
        let mut s = Stats::default();
        (s.imissed, s.ierrors, s.oerrors) = (7, 1, 500);
        let s = s.with_xstats(vec![
            Xstat::new("tx_cqe_errors", 500, Loss::Counted),
            Xstat::new("dev_tx_frames", 10, Loss::None),
            Xstat::new("dev_tx_wire_drops", 20, Loss::Tx),
            Xstat::new("dev_rx_fault_drops", 2, Loss::Rx),
            Xstat::new("dev_rx_no_wqe", 7, Loss::Counted),
            Xstat::new("wire_rx_drops", 0, Loss::Counted),
            Xstat::new("wire_tx_stranded", 30, Loss::Tx),
        ]);
        assert_eq!(s.device_drops, DeviceDrops { tx: 550, rx: 10 });
        let l = loss_counters(&s);
        let names: Vec<&str> = l.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tx_cqe_errors",
                "dev_tx_wire_drops",
                "dev_rx_fault_drops",
                "dev_rx_no_wqe",
                "wire_tx_stranded",
                "imissed",
                "ierrors",
                "oerrors"
            ]
        );
        assert_eq!(s.xstat("dev_tx_frames"), Some(10));
    }

    /// A capture that failed says why, with the OS error's text.
    #[test]
    fn capture_failures_name_the_os_error() {
        assert_eq!(
            capture_failure(&stats(&[("wire_pcap_write_errors", 0)])),
            None
        );
        let m = capture_failure(&stats(&[
            ("wire_pcap_write_errors", 1),
            ("wire_pcap_write_errno", 28),
        ]))
        .unwrap();
        assert!(m.contains("(No space left on device"), "{m}");
    }
}
