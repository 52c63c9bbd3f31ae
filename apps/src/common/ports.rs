//! Pool and port set-up for the tools: opening the ports a tool runs with one pool sized for
//! all their rings, waiting for links, announcing readiness.
#![deny(unsafe_code)]

use crate::cli::{usage, Failure};
use mempool::{MbufPool, MbufPoolConfig};
use pmd::lcore::StopFlag;
use pmd::port::{Port, PortConfig, PortSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// `pool_file`: make the pool in that shared file, for other processes to attach to (a
/// multi-process primary).
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
    pool_file: Option<&std::path::Path>,
) -> Result<PortSet, Failure> {
    let mut ports = Vec::new();
    // What each port is asked for (configure reduces ring sizes and says so), and what it
    // will get (the pool is sized for that).
    let mut asked = Vec::new();
    let mut cfgs = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let port = Port::open(i as u16, spec).map_err(|e| format!("port {i} ({spec}): {e}"))?;
        let cfg =
            port_config(spec, base).with_promiscuous(base.promiscuous && port.caps().promiscuous);
        cfgs.push(port.effective_config(&cfg));
        asked.push(cfg);
        ports.push(port);
    }
    let plan = PoolPlan::new(&cfgs, cores, pool_size, base.mtu)?;
    let mut pool_cfg = plan.config(name);
    if let Some(f) = pool_file {
        pool_cfg = pool_cfg.shared_file(f);
    }
    let pool = MbufPool::new(pool_cfg).map_err(|e| {
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
    base.clone()
        .with_rx_queues(spec.rxq.unwrap_or(base.rx_queues))
        .with_tx_queues(spec.txq.unwrap_or(base.tx_queues).max(base.tx_queues))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rxq: u16, txq: u16, ring: u16) -> PortConfig {
        PortConfig::default()
            .with_queues(rxq, txq)
            .with_ring_sizes(ring, ring)
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
}
