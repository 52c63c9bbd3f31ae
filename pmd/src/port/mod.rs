//! The generic port API between apps and drivers.
//!
//! * Slow path: [`Port`] opens a device from a [`PortSpec`], is configured with a typed
//!   [`PortConfig`], started, stopped and closed, and reports [`Caps`], [`Link`] and
//!   [`Stats`]. Its methods return `Result`.
//! * Fast path: [`RxQueue::rx_burst`] and [`TxQueue::tx_burst`] on queue handles taken from
//!   a configured port. A handle is `Send` but not `Sync`: one polling core owns each queue,
//!   so the datapath takes no lock. Dispatch to the driver is one `match` per burst.
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

pub mod burst;
pub mod config;
pub mod counters;
pub mod devargs;
pub mod lcache;

pub use burst::Burst;
pub use config::{
    Caps, Link, PortConfig, QueueStats, RssConfig, RssFields, RxOffloads, Stats, TxOffloads,
};
pub use devargs::{DevargsError, PortKind, PortSpec};

use crate::devices::MacAddr;
use counters::Counters;
use mempool::MbufPool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Errors of the port slow path.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// No device matches the spec.
    #[error("{spec}: {why}")]
    NoDevice {
        /// The spec as given.
        spec: String,
        /// What was looked for and what to do.
        why: String,
    },
    /// The port belongs to someone else (on MANA: the kernel netdev is up).
    #[error("{spec}: port is busy: {holder} holds it; {hint}")]
    Busy {
        /// The spec.
        spec: String,
        /// Who holds it (e.g. "netdev eth1").
        holder: String,
        /// What to do about it.
        hint: String,
    },
    /// A configuration value outside what the device can do.
    #[error("{what}: {requested} requested, the port allows {allowed}")]
    BadConfig {
        /// Which setting.
        what: &'static str,
        /// What was asked.
        requested: String,
        /// What is possible.
        allowed: String,
    },
    /// An operation not allowed in the port's state.
    #[error("cannot {op} a port that is {state:?}")]
    State {
        /// The operation.
        op: &'static str,
        /// The port's state.
        state: PortState,
    },
    /// A queue index past the configured count.
    #[error("{dir} queue {queue} does not exist: the port has {count} {dir} queue(s)")]
    NoSuchQueue {
        /// "rx" or "tx".
        dir: &'static str,
        /// Asked for.
        queue: u16,
        /// Configured.
        count: u16,
    },
    /// The handle of this queue was already taken.
    #[error("{dir} queue {queue} was already taken (each queue has one owner)")]
    QueueTaken {
        /// "rx" or "tx".
        dir: &'static str,
        /// The queue.
        queue: u16,
    },
    /// A driver's device setup step failed.
    #[error("{what}: {source}")]
    Setup {
        /// The step.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Where a port is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Opened, not configured.
    Opened,
    /// Configured (or stopped): queue handles exist, bursts return 0.
    Configured,
    /// Started: bursts move packets.
    Started,
}

/// The driver side of a port's slow path. Object-safe; called rarely.
pub(crate) trait PortDriver: Send {
    fn caps(&self) -> Caps;
    fn mac(&self) -> MacAddr;
    fn link(&self) -> Link;
    /// Builds the queues for `cfg` (already checked against `caps`).
    fn configure(
        &mut self,
        cfg: &PortConfig,
        pool: &Arc<MbufPool>,
        q: &QueueSetup,
    ) -> Result<(Vec<RxImpl>, Vec<TxImpl>), PortError>;
    fn start(&mut self) -> Result<(), PortError> {
        Ok(())
    }
    fn stop(&mut self) {}
    fn xstats(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Frames the device dropped for lack of posted RX buffers.
    fn imissed(&self) -> u64 {
        0
    }
    /// The device model behind the port, if it is one.
    #[cfg(feature = "emu")]
    fn model(&self) -> Option<crate::emu::mana::ModelHandle> {
        None
    }
}

/// What every queue of one configuration shares with the port.
pub(crate) struct QueueSetup {
    pub port_id: u16,
    pub rx_counters: Vec<Arc<Counters>>,
    pub tx_counters: Vec<Arc<Counters>>,
}

/// The driver-specific part of an RX queue.
pub(crate) enum RxImpl {
    Null(crate::null::RxQueue),
    #[cfg(feature = "emu")]
    Mana(Box<crate::mana::RxQueue>),
}

/// The driver-specific part of a TX queue.
pub(crate) enum TxImpl {
    Null(crate::null::TxQueue),
    #[cfg(feature = "emu")]
    Mana(Box<crate::mana::TxQueue>),
}

/// An RX queue handle, owned by one polling core.
pub struct RxQueue {
    imp: RxImpl,
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
        match &mut self.imp {
            RxImpl::Null(q) => q.rx_burst(out),
            #[cfg(feature = "emu")]
            RxImpl::Mana(q) => q.rx_burst(out),
        }
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
    imp: TxImpl,
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
        match &mut self.imp {
            TxImpl::Null(q) => q.tx_burst(pkts),
            #[cfg(feature = "emu")]
            TxImpl::Mana(q) => q.tx_burst(pkts),
        }
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
    spec: PortSpec,
    driver: Box<dyn PortDriver>,
    state: PortState,
    config: Option<PortConfig>,
    running: Arc<AtomicBool>,
    rx: Vec<Option<RxImpl>>,
    tx: Vec<Option<TxImpl>>,
    rx_counters: Vec<Arc<Counters>>,
    tx_counters: Vec<Arc<Counters>>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Port({} {} {:?})", self.id, self.spec, self.state)
    }
}

impl Port {
    /// Opens the device `spec` names, as port `id` (the number mbufs are stamped with).
    ///
    /// # Errors
    /// [`PortError::NoDevice`] when nothing matches (with what to do instead), or a driver's
    /// set-up error.
    pub fn open(id: u16, spec: &PortSpec) -> Result<Self, PortError> {
        let driver: Box<dyn PortDriver> = match &spec.kind {
            PortKind::Null { size, mac } => Box::new(crate::null::NullDriver::new(*size, *mac, id)),
            PortKind::EmuMlx5 { .. } => {
                return Err(PortError::NoDevice {
                    spec: spec.to_string(),
                    why: "the mlx5 device model is not built yet; use emu-mana:wire=... for a modelled NIC".into(),
                })
            }
            PortKind::Mana { .. } | PortKind::Mlx5 { .. } => return Err(hardware_unavailable(spec)),
            #[cfg(feature = "emu")]
            PortKind::EmuMana { .. } => Box::new(crate::mana::ManaDriver::open_emu(spec, id)?),
            #[cfg(not(feature = "emu"))]
            PortKind::EmuMana { .. } => {
                return Err(PortError::NoDevice { spec: spec.to_string(), why: "this build has no device model (feature `emu`)".into() })
            }
        };
        tracing::info!(target: "pmd::port", port = id, spec = %spec, mac = %driver.mac(), "port opened");
        Ok(Self {
            id,
            spec: spec.clone(),
            driver,
            state: PortState::Opened,
            config: None,
            running: Arc::new(AtomicBool::new(false)),
            rx: Vec::new(),
            tx: Vec::new(),
            rx_counters: Vec::new(),
            tx_counters: Vec::new(),
        })
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

    /// The spec it was opened from.
    pub fn spec(&self) -> &PortSpec {
        &self.spec
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
        check_config(cfg, &self.driver.caps(), pool)?;
        self.detach_queues();
        let setup = QueueSetup {
            port_id: self.id,
            rx_counters: (0..cfg.rx_queues)
                .map(|_| Arc::new(Counters::default()))
                .collect(),
            tx_counters: (0..cfg.tx_queues)
                .map(|_| Arc::new(Counters::default()))
                .collect(),
        };
        let (rx, tx) = self
            .driver
            .configure(cfg, pool, &setup)
            .map_err(|e| match e {
                // Name the port, not only the step that failed.
                PortError::Busy { spec, holder, hint } => PortError::Busy {
                    spec: format!("{} ({spec})", self.spec),
                    holder,
                    hint,
                },
                PortError::Setup { what, source } => PortError::Setup {
                    what: format!("{}: {what}", self.spec),
                    source,
                },
                other => other,
            })?;
        debug_assert_eq!(
            (rx.len(), tx.len()),
            (usize::from(cfg.rx_queues), usize::from(cfg.tx_queues))
        );
        self.rx = rx.into_iter().map(Some).collect();
        self.tx = tx.into_iter().map(Some).collect();
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

    /// The device model behind this port (an `emu-*` port), to step it or inject faults.
    #[cfg(feature = "emu")]
    pub fn model(&self) -> Option<crate::emu::mana::ModelHandle> {
        self.driver.model()
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

impl Drop for Port {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Release);
    }
}

fn check_config(cfg: &PortConfig, caps: &Caps, pool: &MbufPool) -> Result<(), PortError> {
    let range = |what, v: u16, lo: u16, hi: u16| {
        if v < lo || v > hi {
            Err(PortError::BadConfig {
                what,
                requested: v.to_string(),
                allowed: format!("{lo}..={hi}"),
            })
        } else {
            Ok(())
        }
    };
    range("rx queues", cfg.rx_queues, 1, caps.max_rx_queues)?;
    range("tx queues", cfg.tx_queues, 1, caps.max_tx_queues)?;
    range(
        "rx ring size",
        cfg.rx_ring_size,
        caps.min_ring_size,
        caps.max_ring_size,
    )?;
    range(
        "tx ring size",
        cfg.tx_ring_size,
        caps.min_ring_size,
        caps.max_ring_size,
    )?;
    range("mtu", cfg.mtu, caps.mtu_range.0, caps.mtu_range.1)?;
    if caps.ring_size_pow2 {
        for (what, v) in [
            ("rx ring size", cfg.rx_ring_size),
            ("tx ring size", cfg.tx_ring_size),
        ] {
            if !v.is_power_of_two() {
                return Err(PortError::BadConfig {
                    what,
                    requested: v.to_string(),
                    allowed: "a power of two".into(),
                });
            }
        }
    }
    if !caps.rx_offloads.contains(cfg.rx_offloads) {
        return Err(PortError::BadConfig {
            what: "rx offloads",
            requested: format!("{:?}", cfg.rx_offloads),
            allowed: format!("{:?}", caps.rx_offloads),
        });
    }
    if !caps.tx_offloads.contains(cfg.tx_offloads) {
        return Err(PortError::BadConfig {
            what: "tx offloads",
            requested: format!("{:?}", cfg.tx_offloads),
            allowed: format!("{:?}", caps.tx_offloads),
        });
    }
    // Every RX descriptor holds a buffer; the pool must be able to fill all rings and leave
    // room for packets in flight.
    let need = u32::from(cfg.rx_queues) * u32::from(cfg.rx_ring_size);
    if pool.capacity() < need {
        return Err(PortError::BadConfig {
            what: "mbuf pool size",
            requested: pool.capacity().to_string(),
            allowed: format!(
                "at least {need} mbufs to fill {} rx ring(s) of {}",
                cfg.rx_queues, cfg.rx_ring_size
            ),
        });
    }
    Ok(())
}

fn hardware_unavailable(spec: &PortSpec) -> PortError {
    let root = std::path::Path::new(crate::devices::DEFAULT_SYSFS_ROOT);
    let devs = crate::devices::list(root).unwrap_or_default();
    let (want, name) = match spec.kind {
        PortKind::Mana { .. } => (crate::devices::Provider::Mana, "MANA"),
        _ => (crate::devices::Provider::Mlx5, "mlx5"),
    };
    let found: Vec<_> = devs
        .iter()
        .filter(|d| d.provider == want)
        .map(|d| d.name.clone())
        .collect();
    let why = if found.is_empty() {
        format!(
            "no {name} RDMA device on this machine (run pmd-devices to see what there is); \
             without hardware use the device model, e.g. --port emu-mana:wire=shm:demo0"
        )
    } else {
        format!(
            "found {} but the hardware datapath over verbs is not available in this build yet; \
             the device model (emu-mana) runs the same datapath",
            found.join(", ")
        )
    };
    PortError::NoDevice {
        spec: spec.to_string(),
        why,
    }
}
