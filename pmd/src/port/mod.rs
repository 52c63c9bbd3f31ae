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

pub mod attach;
pub mod devargs;
pub mod lock;
pub mod probe;
pub mod recovery;
pub mod shared_stats;

pub use crate::ethdev::{
    max_frame_bytes, Burst, Caps, Link, PortConfig, PortError, PortEvent, PortState, QueueFault,
    QueueRef, QueueStats, RssConfig, RssFields, RxOffloads, Stats, TxOffloads, L2_OVERHEAD,
};
pub use crate::takeover::BusyPolicy;
pub use devargs::{DevargsError, PortKind, PortSpec, DEFAULT_RECOVER_TIMEOUT};
pub use lock::PortLock;
pub use recovery::{QueueCtl, Reopen};

use recovery::{generation, running, Gone, Recovery};

use crate::capture::ring::Direction;
use crate::capture::server::Target as CaptureTarget;
use crate::capture::{Mirror, Tap};
use crate::ethdev::{
    check_config, Counters, PortDriver, QueueSetup, Queues, RxBurst, TxBurst, Xstat,
};
use crate::net::MacAddr;
use mempool::MbufPool;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An RX queue handle, owned by one polling core.
pub struct RxQueue {
    imp: Box<dyn RxBurst>,
    ctl: Arc<QueueCtl>,
    /// The last control word this handle ran under: always a running word, or
    /// [`recovery::NEVER`] until the first burst of a started port. Equal to the port's
    /// word: the burst goes straight to the driver.
    seen: u64,
    /// The generation `imp` belongs to.
    gen: u64,
    port: u16,
    queue: u16,
    /// Live capture of what this queue receives ([`crate::capture`]).
    mirror: Mirror,
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxQueue(port {} queue {})", self.port, self.queue)
    }
}

impl RxQueue {
    /// Receives up to `out.spare()` packets into `out` and returns how many arrived; 0 means
    /// nothing is waiting (or the port is not started, or recovering). Never allocates,
    /// locks or logs; errors are counted in the port's [`Stats`].
    ///
    /// Costs the port layer one load of the port's control word per burst; when it changed
    /// (start, stop, a recovery), the handle catches up between bursts ([`QueueCtl`]).
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Burst) -> usize {
        let w = self.ctl.word.load(Ordering::Acquire);
        if (w != self.seen && !self.catch_up(w)) || out.spare() == 0 {
            return 0;
        }
        let n = self.imp.rx_burst(out);
        // Live capture: one relaxed load when none is on.
        if self.mirror.on() {
            let all = out.as_slice();
            self.mirror.rx(&all[all.len() - n..]);
        }
        n
    }

    #[cold]
    #[inline(never)]
    fn catch_up(&mut self, w: u64) -> bool {
        if let Some((gen, next)) = self.ctl.next_rx(w, self.gen, self.queue) {
            // The old queue goes here, on its own core: the buffers it had posted go back
            // to the pool, and its device objects once no handle holds them.
            self.imp = next;
            self.gen = gen;
        }
        // Run only on a word of the queue's own generation (a newer one may have been
        // published since `w` was loaded: the next burst sees it).
        if running(w) && generation(w) == self.gen {
            self.seen = w;
            true
        } else {
            false
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
    imp: Box<dyn TxBurst>,
    ctl: Arc<QueueCtl>,
    seen: u64,
    gen: u64,
    port: u16,
    queue: u16,
    /// Live capture of what this queue sends ([`crate::capture`]).
    mirror: Mirror,
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
    /// way to reclaim. Never allocates, locks or logs. A port that is not started (or is
    /// recovering) takes nothing.
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut Burst) -> usize {
        let w = self.ctl.word.load(Ordering::Acquire);
        if w != self.seen && !self.catch_up(w) {
            return 0;
        }
        // Live capture: one relaxed load when none is on.
        if self.mirror.on() {
            return self.tx_mirrored(pkts);
        }
        self.imp.tx_burst(pkts)
    }

    /// A burst while a capture is on (or just ended): the frames are written to the capture
    /// before the driver takes them, and kept only for those it took.
    #[cold]
    #[inline(never)]
    fn tx_mirrored(&mut self, pkts: &mut Burst) -> usize {
        self.mirror.tx_before(pkts.as_slice());
        let n = self.imp.tx_burst(pkts);
        self.mirror.tx_after(n);
        n
    }

    /// Whether the port runs now (started, not recovering, not failed). Not for every
    /// burst: a caller asks when a burst took less than it was given, to tell packets a
    /// port without a device refused from those a full ring did.
    pub fn port_running(&self) -> bool {
        running(self.ctl.word.load(Ordering::Relaxed))
    }

    #[cold]
    #[inline(never)]
    fn catch_up(&mut self, w: u64) -> bool {
        if let Some((gen, next)) = self.ctl.next_tx(w, self.gen, self.queue) {
            self.imp = next;
            self.gen = gen;
        }
        if running(w) && generation(w) == self.gen {
            self.seen = w;
            true
        } else {
            false
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
#[must_use = "dropping a Port stops its queues: keep it as long as its queue handles are used"]
pub struct Port {
    id: u16,
    name: String,
    spec: Option<PortSpec>,
    driver: Box<dyn PortDriver>,
    state: PortState,
    config: Option<PortConfig>,
    /// The pool the queues were configured with (a recovery configures the new device with
    /// it again).
    pool: Option<Arc<MbufPool>>,
    /// What the port shares with the handles of the current configuration.
    ctl: Arc<QueueCtl>,
    /// The queues whose handles were not taken yet (`None`: taken).
    rx: Vec<Option<Box<dyn RxBurst>>>,
    tx: Vec<Option<Box<dyn TxBurst>>>,
    rx_counters: Vec<Arc<Counters>>,
    tx_counters: Vec<Arc<Counters>>,
    /// How to open the device again after it failed or went away (`None`: the port does
    /// not recover), and how long to wait for it.
    reopen: Option<(Reopen, std::time::Duration)>,
    /// The recovery in progress.
    recovery: Option<Recovery>,
    /// Why the recovery failed, once it did.
    failure: Option<String>,
    /// Extended counters and `imissed` of the device generations before this one.
    xstats_base: Vec<Xstat>,
    imissed_base: u64,
    /// The port's own event descriptor (an epoll set over the driver's descriptor and, while
    /// recovering, a timer): the same for the port's whole life, whatever device is behind
    /// it. `None`: the driver reports no events and the port does not recover.
    events: Option<PortEvents>,
    /// Recoveries completed, and the last one.
    recoveries: u64,
    /// The generation of the device context (1 at open, one more per recovery onto a new
    /// one): what exported pairs name, so that a secondary can tell a stale descriptor.
    device_gen: u64,
    last_recovery: Option<recovery::Completed>,
    /// The port's lock (see [`lock`]). Declared after `driver`: fields drop in order, so the
    /// driver (and a netdev it took over) is gone before another process may open the port.
    lock: Option<PortLock>,
    /// The live-capture switch its queue handles watch ([`crate::capture`]).
    tap: Arc<Tap>,
    /// Queue pairs exported to other processes: their description files (removed when
    /// the port is configured again or dropped) and counters.
    exported: Vec<ExportedPair>,
    /// The counters of exported pairs' earlier exports (a rebuild starts new ones), by
    /// queue: (RX, TX).
    exported_base: Vec<(u16, QueueStats, QueueStats)>,
}

/// A queue pair this port exported.
struct ExportedPair {
    queue: u16,
    desc: std::path::PathBuf,
    /// What the secondary polling it counts.
    stats: shared_stats::SharedQueueStats,
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
        if matches!(spec.kind, PortKind::Mana { .. } | PortKind::Mlx5 { .. }) {
            // The kernel re-creates the netdev on resume, and something may bring it up
            // again. busy=takeover takes it down again (the driver does); busy=wait waits
            // within the recover timeout: here, between attempts, never blocking in the
            // driver (which would wait for busy-timeout on the control thread); busy=fail
            // fails the recovery at once (see `try_recover`).
            let mut again = spec.clone();
            if matches!(again.busy, BusyPolicy::Wait { .. }) {
                again.busy = BusyPolicy::Fail;
            }
            port.reopen = Some((
                Box::new(move || probe::probe(id, &again)),
                spec.recover_timeout.unwrap_or(DEFAULT_RECOVER_TIMEOUT),
            ));
            port.ensure_events();
        }
        Ok(port)
    }

    /// Makes the port recover from a lost device (see [`recovery`]): `reopen` opens the
    /// device again (it is called every [`recovery::RETRY_INTERVAL`] until it succeeds and
    /// the queues are rebuilt, or `timeout` has passed). [`Port::open`] does this for
    /// `mana:` and `mlx5:` ports, with the spec's probe and `recover-timeout=`.
    pub fn with_recovery(mut self, reopen: Reopen, timeout: std::time::Duration) -> Self {
        self.reopen = Some((reopen, timeout));
        self.ensure_events();
        self
    }

    /// Makes the port's own event descriptor, watching the driver's. Without one (no
    /// descriptors left), the driver's is handed out as it is, and a recovery is driven only
    /// by [`wait_events`] and calls of [`Port::take_events`].
    fn ensure_events(&mut self) {
        if self.events.is_none() {
            match PortEvents::new() {
                Ok(e) => self.events = Some(e),
                Err(e) => {
                    tracing::warn!(target: "pmd::port", port = self.id, "{}: no event descriptor of its own ({e}): handing out the device's", self.name);
                    return;
                }
            }
        }
        self.watch_driver();
    }

    /// Watches the current driver's descriptor (instead of the previous driver's).
    fn watch_driver(&mut self) {
        if let Some(ev) = &mut self.events {
            ev.watch(self.driver.event_fd());
        }
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
        let mut port = Self {
            id,
            name,
            spec: None,
            driver,
            state: PortState::Opened,
            config: None,
            pool: None,
            ctl: QueueCtl::new(),
            rx: Vec::new(),
            tx: Vec::new(),
            rx_counters: Vec::new(),
            tx_counters: Vec::new(),
            reopen: None,
            recovery: None,
            failure: None,
            xstats_base: Vec::new(),
            imissed_base: 0,
            recoveries: 0,
            device_gen: 1,
            last_recovery: None,
            events: None,
            lock: None,
            tap: Tap::new(),
            exported: Vec::new(),
            exported_base: Vec::new(),
        };
        if port.driver.event_fd().is_some() {
            port.ensure_events();
        }
        port
    }

    /// The common case in one call: opens `spec`, configures it with `cfg`, takes the handles
    /// of RX queue 0 and TX queue 0, and starts the port. Keep the port as long as the
    /// handles are used: dropping it stops them (`let (_, rx, tx) = ...` drops it at once;
    /// the drop warns).
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

    /// What a live capture of this port needs ([`crate::capture::server`]): its name, MAC,
    /// queue counts (of the current configuration) and capture switch.
    pub fn capture_target(&self) -> CaptureTarget {
        CaptureTarget {
            port: self.id,
            name: self
                .spec
                .as_ref()
                .map_or_else(|| self.name.clone(), ToString::to_string),
            mac: self.mac().0,
            speed_mbps: self.link().speed_mbps,
            rx_queues: self.rx.len() as u16,
            tx_queues: self.tx.len() as u16,
            tap: Arc::clone(&self.tap),
        }
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
        if matches!(
            self.state,
            PortState::Started | PortState::Recovering | PortState::Failed
        ) {
            return Err(PortError::State {
                op: "configure",
                state: self.state,
            });
        }
        let caps = self.driver.caps();
        let cfg = &self.effective(cfg, &caps);
        check_config(cfg, &caps, pool)?;
        check_export(cfg, pool)?;
        self.detach_queues();
        self.unexport();
        // A new configuration counts from zero, its exported pairs too.
        self.exported_base.clear();
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
        if let Some(x) = &cfg.export {
            self.export(x)?;
        }
        self.rx = queues.rx.into_iter().map(Some).collect();
        self.tx = queues.tx.into_iter().map(Some).collect();
        self.rx_counters = setup.rx_counters;
        self.tx_counters = setup.tx_counters;
        self.config = Some(cfg.clone());
        self.pool = Some(Arc::clone(pool));
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

    /// Writes the descriptions of the queue pairs the driver exported.
    fn export(&mut self, x: &crate::ethdev::ExportConfig) -> Result<(), PortError> {
        let exports = self.driver.exports();
        if exports.len() != x.queues.len() {
            return Err(PortError::Setup {
                what: format!("{}: exporting queue pairs {:?}", self.name, x.queues),
                source: "this port's driver cannot export queues to another process (MANA \
                         ports can)"
                    .into(),
            });
        }
        for mut e in exports {
            // A marker left by a process that attached to an earlier export (of a primary
            // that died, say) names rings that are gone.
            let _ = std::fs::remove_file(crate::ethdev::QueueExport::used_marker(
                &x.dir, e.port, e.queue,
            ));
            let stats_path = x.dir.join(format!(
                "{}.stats",
                crate::ethdev::QueueExport::file_name(e.port, e.queue)
            ));
            let _ = std::fs::remove_file(&stats_path);
            let stats = shared_stats::SharedQueueStats::create(&stats_path).map_err(|err| {
                PortError::Setup {
                    what: format!(
                        "{}: the counters of queue pair {} at {}",
                        self.name,
                        e.queue,
                        stats_path.display()
                    ),
                    source: Box::new(err),
                }
            })?;
            e.areas.push(crate::ethdev::export::Area {
                role: "stats".into(),
                path: stats_path,
                offset: 0,
                len: shared_stats::STATS_BYTES,
            });
            if self.driver.device_fd().is_some() {
                e.values.push((DEVICE_GEN.to_string(), self.device_gen));
            }
            let path = e.write_to(&x.dir).map_err(|err| PortError::Setup {
                what: format!(
                    "{}: writing the description of queue pair {} to {}",
                    self.name,
                    e.queue,
                    x.dir.display()
                ),
                source: Box::new(err),
            })?;
            tracing::info!(target: "pmd::port", port = self.id, queue = e.queue, file = %path.display(), "queue pair exported");
            self.exported.push(ExportedPair {
                queue: e.queue,
                desc: path,
                stats,
            });
        }
        Ok(())
    }

    /// Removes the descriptions of exported queue pairs, and the marks of the processes that
    /// attached to them.
    fn unexport(&mut self) {
        for e in self.exported.drain(..) {
            // What its secondaries counted stays counted.
            let (rx, tx) = e.stats.read();
            match self.exported_base.iter_mut().find(|b| b.0 == e.queue) {
                Some(b) => {
                    b.1 = add_stats(&b.1, &rx);
                    b.2 = add_stats(&b.2, &tx);
                }
                None => self.exported_base.push((e.queue, rx, tx)),
            }
            let _ = std::fs::remove_file(&e.desc);
            let mut used = e.desc.into_os_string();
            used.push(".used");
            let _ = std::fs::remove_file(used);
        }
    }

    /// The error for a handle of an exported queue.
    fn exported_error(&self, dir: &'static str, queue: u16) -> Option<PortError> {
        self.exported
            .iter()
            .any(|e| e.queue == queue)
            .then(|| PortError::BadConfig {
                what: "queue handle",
                requested: format!("{dir} queue {queue}"),
                allowed: format!(
                    "the queues this process keeps: queue pair {queue} is exported to another \
                     process"
                ),
            })
    }

    fn detach_queues(&mut self) {
        self.ctl.set_running(false);
        self.ctl = QueueCtl::new();
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
        if let Some(e) = self.exported_error("rx", queue) {
            return Err(e);
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
            ctl: Arc::clone(&self.ctl),
            seen: recovery::NEVER,
            gen: self.ctl.gen(),
            port: self.id,
            queue,
            mirror: Mirror::new(Arc::clone(&self.tap), self.id, queue, Direction::Rx),
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
        if let Some(e) = self.exported_error("tx", queue) {
            return Err(e);
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
            ctl: Arc::clone(&self.ctl),
            seen: recovery::NEVER,
            gen: self.ctl.gen(),
            port: self.id,
            queue,
            mirror: Mirror::new(Arc::clone(&self.tap), self.id, queue, Direction::Tx),
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
            PortState::Recovering | PortState::Failed => {
                return Err(PortError::State {
                    op: "start",
                    state: self.state,
                })
            }
            PortState::Configured => {}
        }
        self.driver.start()?;
        self.ctl.set_running(true);
        self.state = PortState::Started;
        tracing::info!(target: "pmd::port", port = self.id, "port started");
        Ok(())
    }

    /// Stops the datapath: bursts return 0 until the next start. Packets the queues hold stay
    /// with them and are freed when the handles drop.
    pub fn stop(&mut self) {
        if let Some(r) = &mut self.recovery {
            // Rebuilt, it stays stopped.
            r.was_started = false;
        }
        if self.state == PortState::Started {
            self.ctl.set_running(false);
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

    /// The device's command descriptor, with its generation, which a process polling one
    /// of this port's exported queue pairs needs ([`PortConfig::export`],
    /// `attach::AttachedPair::open`): on a `mana:` port the context's `cmd_fd`, whose page 0
    /// is the doorbell page of the port's queues. `None` where the exported rings need none
    /// (device-model ports). Hand it to `pmd::mp::Primary::publish_device`, which passes it
    /// with `SCM_RIGHTS`. A recovery opens a new context, a new generation (which the
    /// export descriptions name): publish the new descriptor after it.
    pub fn device(&self) -> Option<crate::sys::DeviceFd<'_>> {
        self.driver.device_fd().map(|fd| crate::sys::DeviceFd {
            fd,
            generation: self.device_gen,
        })
    }

    /// A descriptor that becomes readable when the port has [`PortEvent`]s to take
    /// (level-triggered, non-blocking), for poll(2) or epoll(7); `None` when the port reports
    /// no events (a `null` port). It is the port's own (an epoll set over the device's
    /// descriptor): the same across a recovery, when it is also readable every
    /// [`recovery::RETRY_INTERVAL`] so that the thread that waits on it looks for the device.
    /// It stays valid while the port is open; never read it, call [`Port::take_events`].
    pub fn event_fd(&self) -> Option<RawFd> {
        match &self.events {
            Some(e) => Some(e.fd()),
            None => self.driver.event_fd(),
        }
    }

    /// The events since the last call, oldest first, and clears the descriptor. Slow path
    /// (a system call or two), never blocks, allocates nothing when there are none. Call it
    /// when [`Port::event_fd`] is readable, from a control thread, not from a polling core.
    ///
    /// It also drives a port's recovery (see [`recovery`]): a lost device starts it
    /// ([`PortEvent::Recovering`] follows the fatal event), and while it runs each call looks
    /// for the device (every [`recovery::RETRY_INTERVAL`]), so call it at least that often
    /// while [`Port::state`] is [`PortState::Recovering`] ([`wait_events`] does).
    pub fn take_events(&mut self) -> Vec<PortEvent> {
        let mut out = Vec::new();
        self.driver.take_events(&mut out);
        // A driver whose device was removed stops handing out its descriptor (it would stay
        // readable for ever): stop watching it too.
        let fd = self.driver.event_fd();
        if let Some(ev) = &mut self.events {
            if ev.member != fd {
                ev.watch(fd);
            }
        }
        if out.iter().any(PortEvent::is_fatal) && self.recovery.is_none() {
            self.begin_recovery(&mut out);
        }
        if self.recovery.is_some() {
            if let Some(ev) = &self.events {
                ev.tick();
            }
            self.try_recover(&mut out);
        }
        for e in &out {
            tracing::debug!(target: "pmd::port", port = self.id, event = %e, "port event");
        }
        out
    }

    /// Why the port failed ([`PortState::Failed`]): what its recovery waited for and the
    /// last error.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Whether the port recovers from a lost device by itself (see [`recovery`]).
    pub fn recovers(&self) -> bool {
        self.reopen.is_some()
    }

    /// Recoveries this port has completed.
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// The device is lost: stop the queues, let the handles drop theirs, drop the driver.
    fn begin_recovery(&mut self, out: &mut Vec<PortEvent>) {
        let Some((_, timeout)) = &self.reopen else {
            return;
        };
        if !matches!(self.state, PortState::Configured | PortState::Started) {
            return;
        }
        let timeout = *timeout;
        let was_started = self.state == PortState::Started;
        // The handles see a new generation with nothing in it: they drop their dead queues
        // (on their own cores, between bursts) and return 0 until the next one.
        self.ctl.retire();
        for slot in self.rx.iter_mut().filter(|s| s.is_some()) {
            *slot = Some(Box::new(recovery::Detached));
        }
        for slot in self.tx.iter_mut().filter(|s| s.is_some()) {
            *slot = Some(Box::new(recovery::Detached));
        }
        let gone: Box<dyn PortDriver> = Box::new(Gone {
            caps: self.driver.caps(),
            mac: self.driver.mac(),
        });
        let old = std::mem::replace(&mut self.driver, gone);
        if let Some(ev) = &mut self.events {
            ev.watch(None);
            ev.recovering(true);
        }
        recovery::sum_into(&mut self.xstats_base, old.xstats());
        self.imissed_base = self.imissed_base.wrapping_add(old.imissed());
        // The driver's objects go now; a queue's, when its handle has let go of it.
        drop(old);
        self.state = PortState::Recovering;
        self.recovery = Some(Recovery::new(timeout, was_started, self.last_recovery));
        tracing::warn!(
            target: "pmd::port",
            port = self.id,
            "{}: device lost; recovering (waiting up to {:.0} s for it to come back)",
            self.name,
            timeout.as_secs_f64()
        );
        out.push(PortEvent::Recovering);
    }

    /// One look for the device, when due; on success the port runs again.
    fn try_recover(&mut self, out: &mut Vec<PortEvent>) {
        let now = Instant::now();
        let Some(r) = &self.recovery else { return };
        if now < r.next_try {
            return;
        }
        match self.rebuild() {
            Ok(()) => {
                let r = self.recovery.take().expect("recovering");
                let downtime = r.since.elapsed();
                self.watch_driver();
                if let Some(ev) = &mut self.events {
                    ev.recovering(false);
                }
                self.recoveries += 1;
                self.last_recovery = Some(recovery::Completed {
                    at: Instant::now(),
                    deadline: r.deadline,
                });
                tracing::warn!(
                    target: "pmd::port",
                    port = self.id,
                    "{}: recovered after {:.3} s ({} attempts)",
                    self.name,
                    downtime.as_secs_f64(),
                    r.attempts + 1
                );
                out.push(PortEvent::Recovered { downtime });
            }
            Err(e) => {
                // The kernel's netdev holds the port again, and the policy is to fail.
                let busy_fails = matches!(e, PortError::Busy { .. })
                    && self
                        .spec
                        .as_ref()
                        .is_some_and(|s| s.busy == BusyPolicy::Fail);
                let r = self.recovery.as_mut().expect("recovering");
                r.attempts += 1;
                let msg = e.to_string();
                if r.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::info!(target: "pmd::port", port = self.id, "{}: not back yet: {msg}", self.name);
                }
                r.last_error = Some(msg);
                if now >= r.deadline || busy_fails {
                    let waited = r.since.elapsed();
                    let why = if busy_fails {
                        format!(
                            "{}: the device came back after {:.1} s, but {} (busy=fail; \
                             busy=wait waits for the port within recover-timeout, \
                             busy=takeover takes it)",
                            self.name,
                            waited.as_secs_f64(),
                            r.last_error.as_deref().unwrap_or("the port is busy")
                        )
                    } else {
                        let timeout = self.reopen.as_ref().map_or(0.0, |r| r.1.as_secs_f64());
                        // A loss right after a recovery keeps that recovery's deadline.
                        let carried = if (waited.as_secs_f64() + 0.05) < timeout {
                            ", the deadline of the recovery just before"
                        } else {
                            ""
                        };
                        format!(
                            "{}: the device (MAC {}) did not come back within {:.1} s \
                             (recover-timeout {timeout:.1} s{carried}); {} attempts, the last: {}",
                            self.name,
                            self.driver.mac(),
                            waited.as_secs_f64(),
                            r.attempts,
                            r.last_error.as_deref().unwrap_or("none")
                        )
                    };
                    tracing::error!(target: "pmd::port", port = self.id, "{why}");
                    self.failure = Some(why);
                    self.recovery = None;
                    if let Some(ev) = &mut self.events {
                        ev.recovering(false);
                    }
                    self.state = PortState::Failed;
                    out.push(PortEvent::RecoveryFailed);
                } else {
                    r.next_try = now + recovery::RETRY_INTERVAL;
                }
            }
        }
    }

    /// Opens the device again and rebuilds the configuration in force on it.
    fn rebuild(&mut self) -> Result<(), PortError> {
        let (reopen, _) = self.reopen.as_mut().expect("a recovering port can reopen");
        let mut driver = reopen()?;
        let mac = self.driver.mac();
        if driver.mac() != mac {
            return Err(PortError::NoDevice {
                spec: self.name.clone(),
                why: format!(
                    "the device found has MAC {}, the lost one had {mac}: waiting for that one",
                    driver.mac()
                ),
            });
        }
        // A recovery starts only on a configured port (`begin_recovery`).
        let cfg = self
            .config
            .clone()
            .expect("a recovering port was configured");
        let pool = self.pool.clone().expect("a recovering port was configured");
        let setup = QueueSetup::continuing(self.id, &self.rx_counters, &self.tx_counters);
        let queues = driver.configure(&cfg, &pool, &setup)?;
        let was_started = self.recovery.as_ref().is_some_and(|r| r.was_started);
        if was_started {
            driver.start()?;
        }
        self.driver = driver;
        self.device_gen += 1;
        self.install(queues, was_started);
        self.reexport(&cfg)
    }

    /// Builds every queue again on the same device, with the configuration in force: the
    /// queue handles taken catch up between bursts (as after a recovery, counters
    /// continuing), and exported queue pairs are exported anew. What a primary does when the
    /// secondary that polled an exported pair is gone: the pair's rings still hold that
    /// process's state, so the next secondary needs new ones. Buffers the old queues had
    /// posted go back to the pool once the device objects are destroyed; those a dead
    /// secondary had posted stay out (counted by the pool as in use).
    ///
    /// # Errors
    /// [`PortError::State`] unless the port is configured or started; the driver's
    /// configure or start error (the port is then left stopped, its handles idle).
    pub fn rebuild_queues(&mut self) -> Result<(), PortError> {
        if !matches!(self.state, PortState::Configured | PortState::Started) {
            return Err(PortError::State {
                op: "rebuild the queues of",
                state: self.state,
            });
        }
        let cfg = self.config.clone().expect("a configured port has a config");
        let pool = self.pool.clone().expect("a configured port has a pool");
        let was_started = self.state == PortState::Started;
        // The handles stop using the old queues from their next burst. The old descriptions
        // stay until the old queues are destroyed: a secondary that sees a new description
        // may free what it had posted on them.
        self.ctl.set_running(false);
        let setup = QueueSetup::continuing(self.id, &self.rx_counters, &self.tx_counters);
        let queues = match self.driver.configure(&cfg, &pool, &setup) {
            Ok(q) => q,
            Err(e) => {
                // The old queues are gone, and no new ones: nothing runs until the port is
                // configured again.
                self.unexport();
                self.state = PortState::Opened;
                self.rx.clear();
                self.tx.clear();
                return Err(e);
            }
        };
        let started = if was_started {
            self.driver.start()
        } else {
            Ok(())
        };
        // The new queues exist either way: the handles get them, the exports describe them.
        self.install(queues, was_started && started.is_ok());
        tracing::info!(target: "pmd::port", port = self.id, "queues rebuilt");
        self.reexport(&cfg)?;
        started
    }

    /// Describes the exported queue pairs of the configuration just built.
    fn reexport(&mut self, cfg: &PortConfig) -> Result<(), PortError> {
        self.unexport();
        match &cfg.export {
            Some(x) => self.export(x),
            None => Ok(()),
        }
    }

    /// Gives the queues of a rebuilt configuration to the handles taken (the others stay
    /// here) and sets the port's state.
    fn install(&mut self, queues: Queues, was_started: bool) {
        // Queues whose handles were taken go to the handles; the others stay here.
        let mut rx_slots = Vec::with_capacity(queues.rx.len());
        for (i, q) in queues.rx.into_iter().enumerate() {
            match self.rx.get_mut(i) {
                Some(Some(slot)) => {
                    *slot = q;
                    rx_slots.push(None);
                }
                _ => rx_slots.push(Some(q)),
            }
        }
        let mut tx_slots = Vec::with_capacity(queues.tx.len());
        for (i, q) in queues.tx.into_iter().enumerate() {
            match self.tx.get_mut(i) {
                Some(Some(slot)) => {
                    *slot = q;
                    tx_slots.push(None);
                }
                _ => tx_slots.push(Some(q)),
            }
        }
        self.ctl.publish(rx_slots, tx_slots, was_started);
        self.state = if was_started {
            PortState::Started
        } else {
            PortState::Configured
        };
    }

    /// Statistics: per queue and summed, plus the driver's extended counters.
    pub fn stats(&self) -> Stats {
        let mut rx: Vec<QueueStats> = self.rx_counters.iter().map(|c| c.snapshot()).collect();
        let mut tx: Vec<QueueStats> = self.tx_counters.iter().map(|c| c.snapshot()).collect();
        // Exported queue pairs: what the secondaries polling them counted.
        for &(q, ref r, ref t) in &self.exported_base {
            if let (Some(x), Some(y)) = (rx.get_mut(usize::from(q)), tx.get_mut(usize::from(q))) {
                *x = add_stats(x, r);
                *y = add_stats(y, t);
            }
        }
        for e in &self.exported {
            let (r, t) = e.stats.read();
            let q = usize::from(e.queue);
            if let (Some(x), Some(y)) = (rx.get_mut(q), tx.get_mut(q)) {
                *x = add_stats(x, &r);
                *y = add_stats(y, &t);
            }
        }
        Stats {
            ipackets: rx.iter().map(|q| q.packets).sum(),
            ibytes: rx.iter().map(|q| q.bytes).sum(),
            ierrors: rx.iter().map(|q| q.errors).sum(),
            imissed: rx.iter().map(|q| q.missed).sum::<u64>()
                + self.driver.imissed()
                + self.imissed_base,
            rx_nombuf: rx.iter().map(|q| q.nombuf).sum(),
            opackets: tx.iter().map(|q| q.packets).sum(),
            obytes: tx.iter().map(|q| q.bytes).sum(),
            oerrors: tx.iter().map(|q| q.errors).sum(),
            rx_queues: rx,
            tx_queues: tx,
            ..Stats::default()
        }
        .with_xstats(recovery::summed(&self.xstats_base, self.driver.xstats()))
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
    // A recovering port has no descriptor to wake us: look for its device often enough.
    let recovering = ports.iter().any(|p| p.state() == PortState::Recovering);
    let timeout = if recovering {
        timeout.min(recovery::RETRY_INTERVAL)
    } else {
        timeout
    };
    let ready = crate::sys::event::poll_readable(&fds, timeout)?;
    let mut out = Vec::new();
    let mut taken = vec![false; ports.len()];
    for ((i, _), r) in watched.into_iter().zip(ready) {
        if r {
            taken[i] = true;
            out.extend(ports[i].take_events().into_iter().map(|e| (i, e)));
        }
    }
    for (i, p) in ports.iter_mut().enumerate() {
        if !taken[i] && p.state() == PortState::Recovering {
            out.extend(p.take_events().into_iter().map(|e| (i, e)));
        }
    }
    Ok(out)
}

impl Drop for Port {
    /// Stops the port: from their next burst its queue handles return 0. A port dropped
    /// while handles of it live (`let (_, rx, tx) = Port::open_started(..)` drops it at
    /// once) says so in a warning, so that bursts returning 0 are not a mystery.
    fn drop(&mut self) {
        self.ctl.set_running(false);
        self.unexport();
        let handles = Arc::strong_count(&self.ctl) - 1;
        if handles > 0 && !std::thread::panicking() {
            tracing::warn!(target: "pmd::port", port = self.id, "port {} dropped while {handles} of its queue handles live: their bursts return 0 from now on (keep the Port as long as its queues are used)", self.id);
        }
    }
}

/// Two queues' counters added.
fn add_stats(a: &QueueStats, b: &QueueStats) -> QueueStats {
    QueueStats {
        packets: a.packets.wrapping_add(b.packets),
        bytes: a.bytes.wrapping_add(b.bytes),
        errors: a.errors.wrapping_add(b.errors),
        missed: a.missed.wrapping_add(b.missed),
        nombuf: a.nombuf.wrapping_add(b.nombuf),
    }
}

/// The description value naming the device generation of an exported pair's rings (see
/// [`Port::device`]).
pub(crate) const DEVICE_GEN: &str = "device_gen";

/// An export asks for distinct queue pairs the port has, of a pool other processes can
/// attach to.
fn check_export(cfg: &PortConfig, pool: &MbufPool) -> Result<(), PortError> {
    let Some(x) = &cfg.export else {
        return Ok(());
    };
    let pairs = cfg.rx_queues.min(cfg.tx_queues);
    let bad = |requested: String, allowed: String| PortError::BadConfig {
        what: "exported queue pairs",
        requested,
        allowed,
    };
    if x.queues.is_empty() {
        return Err(bad("none".into(), "at least one queue pair".into()));
    }
    for (i, &q) in x.queues.iter().enumerate() {
        if q >= pairs {
            return Err(bad(
                format!("queue pair {q}"),
                format!("queue pairs below {pairs}"),
            ));
        }
        if x.queues[..i].contains(&q) {
            return Err(bad(format!("queue pair {q} twice"), "each once".into()));
        }
    }
    if !pool.is_shared() {
        return Err(bad(
            format!("pool '{}', private to this process", pool.name()),
            "a pool made with a shared file (MbufPoolConfig::shared_file), which the other \
             process attaches to"
                .into(),
        ));
    }
    if !x.dir.is_dir() {
        return Err(bad(
            format!("directory {}", x.dir.display()),
            "an existing directory (tmpfs or hugetlbfs)".into(),
        ));
    }
    Ok(())
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

/// A port's own event descriptor: an epoll set over its driver's descriptor and a timer
/// that ticks while the port recovers.
#[derive(Debug)]
struct PortEvents {
    set: crate::sys::event::EpollSet,
    timer: crate::sys::event::TimerFd,
    /// The driver descriptor in the set.
    member: Option<RawFd>,
}

impl PortEvents {
    fn new() -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let set = crate::sys::event::EpollSet::new()?;
        let timer = crate::sys::event::TimerFd::new()?;
        set.add(timer.as_raw_fd())?;
        Ok(Self {
            set,
            timer,
            member: None,
        })
    }

    fn fd(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.set.as_raw_fd()
    }

    /// Watches `fd` (a driver's) instead of the one watched so far.
    fn watch(&mut self, fd: Option<RawFd>) {
        if let Some(old) = self.member.take() {
            // It may be closed already (it then left the set by itself).
            let _ = self.set.remove(old);
        }
        if let Some(fd) = fd {
            match self.set.add(fd) {
                Ok(()) => self.member = Some(fd),
                Err(e) => {
                    tracing::warn!(target: "pmd::port", "watching the device's event descriptor failed ({e}): its events are seen only when something else wakes the port");
                }
            }
        }
    }

    /// Ticks every retry interval while recovering, so that a thread waiting on the port's
    /// descriptor drives the recovery; silent otherwise.
    fn recovering(&self, on: bool) {
        let every = if on {
            recovery::RETRY_INTERVAL
        } else {
            Duration::ZERO
        };
        if let Err(e) = self.timer.arm(every) {
            tracing::warn!(target: "pmd::port", "recovery timer: {e}");
        }
        self.timer.clear();
    }

    /// Takes a tick of the timer.
    fn tick(&self) {
        self.timer.clear();
    }
}
