//! The generic port API between apps and drivers.
//!
//! * Slow path: [`Port`] opens a device from a [`PortSpec`], is configured with a typed
//!   [`PortConfig`], started, stopped and closed, and reports [`Caps`], [`Link`] and
//!   [`Stats`]. Its methods return `Result`.
//! * Fast path: [`RxQueue::rx_burst`] and [`TxQueue::tx_burst`] on queue handles taken from
//!   a configured port. A handle is `Send` but not `Sync`: one polling core owns each queue,
//!   so the datapath takes no lock. Dispatch to the driver is one `match` per burst.
//!
//! * Events: [`Port::event_fd`] is one pollable descriptor per port (put it in your poll or
//!   epoll set); when it is readable, [`Port::take_events`] returns the [`PortEvent`]s (link
//!   up/down, device fatal/removed, queue errors). [`wait_events`] does both for a set of
//!   ports, for a main loop that has nothing else to wait on.
//!
//! Queue lifecycle: `Opened --configure--> Configured --start--> Started --stop--> Configured`;
//! `close` from any state. Bursts on a queue whose port is not started (stopped, closed,
//! reconfigured) return 0 and never panic, like DPDK's `*_burst_removed` stubs.
//!
//! ```
//! use pmd::port::{Burst, Port, PortConfig};
//! let pool = mempool::MbufPool::new(mempool::MbufPoolConfig::new("doc", 1024))?;
//! let mut port = Port::open(0, &"null:size=64".parse()?)?;
//! port.configure(&PortConfig::default(), &pool)?;
//! let mut rx = port.rx_queue(0)?;
//! let mut tx = port.tx_queue(0)?;
//! port.start()?;
//! let mut burst = Burst::with_capacity(32);
//! assert_eq!(rx.rx_burst(&mut burst), 32);
//! assert_eq!(tx.tx_burst(&mut burst), 32);
//! port.stop();
//! assert_eq!(rx.rx_burst(&mut burst), 0);
//! drop((rx, tx));
//! assert_eq!(pool.in_use(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

pub mod devargs;
pub mod lock;
pub mod probe;

pub use crate::ethdev::{
    max_frame_bytes, Burst, Caps, Link, PortConfig, PortError, PortEvent, PortState, QueueFault,
    QueueRef, QueueStats, RssConfig, RssFields, RxOffloads, Stats, TxOffloads, L2_OVERHEAD,
};
pub use crate::takeover::BusyPolicy;
pub use devargs::{DevargsError, PortKind, PortSpec};
pub use lock::PortLock;

use crate::ethdev::{check_config, Counters, PortDriver, QueueSetup, RxBurst, TxBurst};
use crate::net::MacAddr;
use mempool::MbufPool;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An RX queue handle, owned by one polling core.
pub struct RxQueue {
    imp: Box<dyn RxBurst>,
    running: Arc<AtomicBool>,
    port: u16,
    queue: u16,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxQueue(port {} queue {})", self.port, self.queue)
    }
}

impl RxQueue {
    /// Receives up to `out.spare()` packets into `out` and returns how many arrived; 0 means
    /// nothing is waiting (or the port is not started). Never allocates, locks or logs;
    /// errors are counted in the port's [`Stats`].
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Burst) -> usize {
        if !self.running.load(Ordering::Acquire) || out.spare() == 0 {
            return 0;
        }
        self.imp.rx_burst(out)
    }

    /// Port id.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Queue index.
    pub fn queue(&self) -> u16 {
        self.queue
    }
}

/// A TX queue handle, owned by one polling core.
pub struct TxQueue {
    imp: Box<dyn TxBurst>,
    running: Arc<AtomicBool>,
    port: u16,
    queue: u16,
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TxQueue(port {} queue {})", self.port, self.queue)
    }
}

impl TxQueue {
    /// Hands packets from the front of `pkts` to the device and returns how many it took;
    /// those leave `pkts`, the rest stay there, in order, for the caller to retry or free.
    /// Also processes the device's completions (frees sent packets), so an empty burst is a
    /// way to reclaim. Never allocates, locks or logs. A port that is not started takes
    /// nothing.
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        if !self.running.load(Ordering::Acquire) {
            return 0;
        }
        self.imp.tx_burst(pkts)
    }

    /// Port id.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Queue index.
    pub fn queue(&self) -> u16 {
        self.queue
    }
}

/// A port: one device (real or modelled) with its queues.
pub struct Port {
    id: u16,
    name: String,
    spec: Option<PortSpec>,
    driver: Box<dyn PortDriver>,
    state: PortState,
    config: Option<PortConfig>,
    running: Arc<AtomicBool>,
    rx: Vec<Option<Box<dyn RxBurst>>>,
    tx: Vec<Option<Box<dyn TxBurst>>>,
    rx_counters: Vec<Arc<Counters>>,
    tx_counters: Vec<Arc<Counters>>,
    /// The port's lock (see [`lock`]). Declared after `driver`: fields drop in order, so the
    /// driver (and a netdev it took over) is gone before another process may open the port.
    lock: Option<PortLock>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Port({} {} {:?})", self.id, self.name, self.state)
    }
}

impl Port {
    /// Opens the device `spec` names, as port `id` (the number mbufs are stamped with).
    /// First takes the port's lock ([`lock`]), before anything touches the device.
    ///
    /// # Errors
    /// [`PortError::InUse`] when another process of ours has the port open;
    /// [`PortError::NoDevice`] when nothing matches (with what to do instead), or a driver's
    /// set-up error.
    pub fn open(id: u16, spec: &PortSpec) -> Result<Self, PortError> {
        let lock = lock::key_for(spec)
            .map(|key| PortLock::acquire(&key, &spec.to_string()))
            .transpose()?;
        let driver = probe::probe(id, spec)?;
        let mut port = Self::from_driver(id, spec.to_string(), driver);
        port.spec = Some(spec.clone());
        port.lock = lock;
        Ok(port)
    }

    /// Hands the port a lock taken by hand (a port built with [`Port::from_driver`] has
    /// none); it is released after the driver when the port goes.
    pub fn with_lock(mut self, lock: PortLock) -> Self {
        self.lock = Some(lock);
        self
    }

    /// A port over a driver built by hand (see [`probe::mana`] for a MANA driver over any
    /// provider). `name` is what logs and errors call the port.
    pub fn from_driver(id: u16, name: String, driver: Box<dyn PortDriver>) -> Self {
        tracing::info!(target: "pmd::port", port = id, name = %name, mac = %driver.mac(), "port opened");
        Self {
            id,
            name,
            spec: None,
            driver,
            state: PortState::Opened,
            config: None,
            running: Arc::new(AtomicBool::new(false)),
            rx: Vec::new(),
            tx: Vec::new(),
            rx_counters: Vec::new(),
            tx_counters: Vec::new(),
            lock: None,
        }
    }

    /// The common case in one call: opens `spec`, configures it with `cfg`, takes the handles
    /// of RX queue 0 and TX queue 0, and starts the port.
    ///
    /// # Errors
    /// Any error of [`Port::open`], [`Port::configure`] or [`Port::start`].
    pub fn open_started(
        id: u16,
        spec: &PortSpec,
        cfg: &PortConfig,
        pool: &Arc<MbufPool>,
    ) -> Result<(Self, RxQueue, TxQueue), PortError> {
        let mut port = Self::open(id, spec)?;
        port.configure(cfg, pool)?;
        let rx = port.rx_queue(0)?;
        let tx = port.tx_queue(0)?;
        port.start()?;
        Ok((port, rx, tx))
    }

    /// Port id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The spec it was opened from (`None` for a port built with [`Port::from_driver`]).
    pub fn spec(&self) -> Option<&PortSpec> {
        self.spec.as_ref()
    }

    /// What logs and errors call the port (its spec, as given).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lifecycle state.
    pub fn state(&self) -> PortState {
        self.state
    }

    /// What the device can do.
    pub fn caps(&self) -> Caps {
        self.driver.caps()
    }

    /// The port's MAC address.
    pub fn mac(&self) -> MacAddr {
        self.driver.mac()
    }

    /// Link status.
    pub fn link(&self) -> Link {
        self.driver.link()
    }

    /// The configuration in force, if any.
    pub fn config(&self) -> Option<&PortConfig> {
        self.config.as_ref()
    }

    /// Checks `cfg` against the capabilities and builds the queues; their handles are then
    /// taken with [`Port::rx_queue`] / [`Port::tx_queue`]. Reconfiguring a stopped port
    /// detaches the handles of the previous configuration (their bursts return 0).
    ///
    /// # Errors
    /// [`PortError::State`] on a started port; [`PortError::BadConfig`] for values outside
    /// [`Caps`]; a driver's set-up error.
    pub fn configure(&mut self, cfg: &PortConfig, pool: &Arc<MbufPool>) -> Result<(), PortError> {
        if self.state == PortState::Started {
            return Err(PortError::State {
                op: "configure",
                state: self.state,
            });
        }
        let caps = self.driver.caps();
        let cfg = &self.effective(cfg, &caps);
        check_config(cfg, &caps, pool)?;
        self.detach_queues();
        let setup = QueueSetup::new(self.id, cfg.rx_queues, cfg.tx_queues);
        let queues = self
            .driver
            .configure(cfg, pool, &setup)
            .map_err(|e| match e {
                // Name the port, not only the step that failed.
                PortError::Busy { spec, holder, hint } => PortError::Busy {
                    spec: format!("{} ({spec})", self.name),
                    holder,
                    hint,
                },
                PortError::Setup { what, source } => PortError::Setup {
                    what: format!("{}: {what}", self.name),
                    source,
                },
                other => other,
            })?;
        debug_assert_eq!(
            (queues.rx.len(), queues.tx.len()),
            (usize::from(cfg.rx_queues), usize::from(cfg.tx_queues))
        );
        self.rx = queues.rx.into_iter().map(Some).collect();
        self.tx = queues.tx.into_iter().map(Some).collect();
        self.rx_counters = setup.rx_counters;
        self.tx_counters = setup.tx_counters;
        self.config = Some(cfg.clone());
        self.state = PortState::Configured;
        tracing::info!(
            target: "pmd::port",
            port = self.id,
            rxq = cfg.rx_queues,
            txq = cfg.tx_queues,
            rx_ring = cfg.rx_ring_size,
            tx_ring = cfg.tx_ring_size,
            "port configured"
        );
        Ok(())
    }

    /// `cfg` as [`Port::configure`] will apply it: ring sizes above the device's maximum
    /// reduced to it (as DPDK's `rte_eth_dev_adjust_nb_rx_tx_desc` does). Tools size their
    /// mbuf pool from this before allocating it.
    pub fn effective_config(&self, cfg: &PortConfig) -> PortConfig {
        clamp_rings(cfg, &self.driver.caps())
    }

    /// [`clamp_rings`], saying so where a size was reduced: requested and effective.
    fn effective(&self, cfg: &PortConfig, caps: &Caps) -> PortConfig {
        let eff = clamp_rings(cfg, caps);
        for (what, asked, got) in [
            ("rx ring size", cfg.rx_ring_size, eff.rx_ring_size),
            ("tx ring size", cfg.tx_ring_size, eff.tx_ring_size),
        ] {
            if asked != got {
                tracing::warn!(
                    target: "pmd::port",
                    port = self.id,
                    "{}: {what} {asked} requested, the device takes at most {got}: using {got}",
                    self.name,
                );
            }
        }
        eff
    }

    fn detach_queues(&mut self) {
        self.running.store(false, Ordering::Release);
        self.running = Arc::new(AtomicBool::new(false));
        self.rx.clear();
        self.tx.clear();
    }

    /// Takes the handle of RX queue `queue` (once).
    ///
    /// # Errors
    /// [`PortError::State`] before configure, [`PortError::NoSuchQueue`],
    /// [`PortError::QueueTaken`].
    pub fn rx_queue(&mut self, queue: u16) -> Result<RxQueue, PortError> {
        if self.state == PortState::Opened {
            return Err(PortError::State {
                op: "take a queue of",
                state: self.state,
            });
        }
        let count = self.rx.len() as u16;
        let slot = self
            .rx
            .get_mut(usize::from(queue))
            .ok_or(PortError::NoSuchQueue {
                dir: "rx",
                queue,
                count,
            })?;
        let imp = slot
            .take()
            .ok_or(PortError::QueueTaken { dir: "rx", queue })?;
        Ok(RxQueue {
            imp,
            running: Arc::clone(&self.running),
            port: self.id,
            queue,
        })
    }

    /// Takes the handle of TX queue `queue` (once).
    ///
    /// # Errors
    /// As [`Port::rx_queue`].
    pub fn tx_queue(&mut self, queue: u16) -> Result<TxQueue, PortError> {
        if self.state == PortState::Opened {
            return Err(PortError::State {
                op: "take a queue of",
                state: self.state,
            });
        }
        let count = self.tx.len() as u16;
        let slot = self
            .tx
            .get_mut(usize::from(queue))
            .ok_or(PortError::NoSuchQueue {
                dir: "tx",
                queue,
                count,
            })?;
        let imp = slot
            .take()
            .ok_or(PortError::QueueTaken { dir: "tx", queue })?;
        Ok(TxQueue {
            imp,
            running: Arc::clone(&self.running),
            port: self.id,
            queue,
        })
    }

    /// Starts the datapath: bursts move packets from now on.
    ///
    /// # Errors
    /// [`PortError::State`] before configure; a driver's start error.
    pub fn start(&mut self) -> Result<(), PortError> {
        match self.state {
            PortState::Opened => {
                return Err(PortError::State {
                    op: "start",
                    state: self.state,
                })
            }
            PortState::Started => return Ok(()),
            PortState::Configured => {}
        }
        self.driver.start()?;
        self.running.store(true, Ordering::Release);
        self.state = PortState::Started;
        tracing::info!(target: "pmd::port", port = self.id, "port started");
        Ok(())
    }

    /// Stops the datapath: bursts return 0 until the next start. Packets the queues hold stay
    /// with them and are freed when the handles drop.
    pub fn stop(&mut self) {
        if self.state == PortState::Started {
            self.running.store(false, Ordering::Release);
            self.driver.stop();
            self.state = PortState::Configured;
            tracing::info!(target: "pmd::port", port = self.id, "port stopped");
        }
    }

    /// Waits until the link is up, polling every millisecond, at most `timeout` (DPDK apps
    /// do the same before sending). A device-model port reports link down until the far end
    /// of its wire is attached.
    ///
    /// # Errors
    /// [`PortError::LinkDown`] when the link is still down at the deadline.
    pub fn wait_link_up(&self, timeout: Duration) -> Result<Link, PortError> {
        let t0 = Instant::now();
        loop {
            let link = self.driver.link();
            if link.up {
                return Ok(link);
            }
            if t0.elapsed() >= timeout {
                return Err(PortError::LinkDown {
                    spec: self.name.clone(),
                    waited: t0.elapsed(),
                    hint:
                        "is the far end of the cable (the peer process or interface) there and up?"
                            .into(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A descriptor that becomes readable when the port has [`PortEvent`]s to take
    /// (level-triggered, non-blocking), for poll(2) or epoll(7); `None` when the port reports
    /// no events (a `null` port), or no longer (after [`PortEvent::DeviceRemoved`]). It stays
    /// valid while the port is open; never read it, call [`Port::take_events`].
    pub fn event_fd(&self) -> Option<RawFd> {
        self.driver.event_fd()
    }

    /// The events since the last call, oldest first, and clears the descriptor. Slow path
    /// (a system call or two), never blocks, allocates nothing when there are none. Call it
    /// when [`Port::event_fd`] is readable, from a control thread, not from a polling core.
    pub fn take_events(&mut self) -> Vec<PortEvent> {
        let mut out = Vec::new();
        self.driver.take_events(&mut out);
        for e in &out {
            tracing::debug!(target: "pmd::port", port = self.id, event = %e, "port event");
        }
        out
    }

    /// Statistics: per queue and summed, plus the driver's extended counters.
    pub fn stats(&self) -> Stats {
        let rx: Vec<QueueStats> = self.rx_counters.iter().map(|c| c.snapshot()).collect();
        let tx: Vec<QueueStats> = self.tx_counters.iter().map(|c| c.snapshot()).collect();
        Stats {
            ipackets: rx.iter().map(|q| q.packets).sum(),
            ibytes: rx.iter().map(|q| q.bytes).sum(),
            ierrors: rx.iter().map(|q| q.errors).sum(),
            imissed: rx.iter().map(|q| q.missed).sum::<u64>() + self.driver.imissed(),
            rx_nombuf: rx.iter().map(|q| q.nombuf).sum(),
            opackets: tx.iter().map(|q| q.packets).sum(),
            obytes: tx.iter().map(|q| q.bytes).sum(),
            oerrors: tx.iter().map(|q| q.errors).sum(),
            rx_queues: rx,
            tx_queues: tx,
            xstats: self.driver.xstats(),
        }
    }

    /// Stops the port and releases the device. Queue handles still held return 0 from now on
    /// and free what they hold when dropped.
    pub fn close(mut self) {
        self.stop();
        self.detach_queues();
    }
}

/// Waits up to `timeout` for an event on any of `ports` (poll(2) on their
/// [`Port::event_fd`]s), then takes the events of every port whose descriptor is readable:
/// `(index in ports, event)`, each port's in order. With no port that has a descriptor, it
/// just sleeps for `timeout`, so a main loop can call it in place of its sleep.
///
/// # Errors
/// poll(2) failed (not for a signal, which returns early with nothing).
pub fn wait_events(
    ports: &mut [Port],
    timeout: Duration,
) -> std::io::Result<Vec<(usize, PortEvent)>> {
    let watched: Vec<(usize, RawFd)> = ports
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.event_fd().map(|fd| (i, fd)))
        .collect();
    let fds: Vec<RawFd> = watched.iter().map(|w| w.1).collect();
    let ready = crate::sys::event::poll_readable(&fds, timeout)?;
    let mut out = Vec::new();
    for ((i, _), r) in watched.into_iter().zip(ready) {
        if r {
            out.extend(ports[i].take_events().into_iter().map(|e| (i, e)));
        }
    }
    Ok(out)
}

impl Drop for Port {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Release);
    }
}

/// `cfg` with ring sizes above the device's maximum (the largest power of two under it where
/// sizes must be powers of two) reduced to it.
fn clamp_rings(cfg: &PortConfig, caps: &Caps) -> PortConfig {
    let mut eff = cfg.clone();
    let mut max = caps.max_ring_size;
    if caps.ring_size_pow2 && max > 0 {
        max = 1 << (15 - max.leading_zeros());
    }
    for v in [&mut eff.rx_ring_size, &mut eff.tx_ring_size] {
        if *v > max && max >= caps.min_ring_size {
            *v = max;
        }
    }
    eff
}
