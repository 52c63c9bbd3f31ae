//! A secondary's side of a queue pair its primary exported ([`crate::ethdev::export`]):
//! [`AttachedPair::open`] reads the pair's description, maps its rings and builds the
//! driver's queues over them in this process, with receive buffers from the primary's shared
//! pool. The handles are the same [`RxQueue`] / [`TxQueue`] a port hands out, so a polling
//! loop runs unchanged in either process.
//!
//! The device serves the rings from the primary (a device model's engine thread there), so
//! the pair works only while the primary runs: stop polling when the primary is gone
//! (`pmd::mp::Secondary::primary_gone`), or when the primary rebuilt the pair
//! ([`AttachedPair::rebuilt`]).
//!
//! The buffers the pair had posted, and its frames in flight, go back to the pool only once
//! the primary has destroyed the rings they are on ([`Port::rebuild_queues`], after which
//! the description names new rings): until then the device may still write into or read
//! them. A pair dropped before that leaves them out (as the primary's own queues do until
//! their device objects are gone); a secondary that leaves cleanly releases its pair, waits
//! for the primary to rebuild it ([`AttachedPair::wait_rebuilt`]), then drops it.
//!
//! [`Port::rebuild_queues`]: super::Port::rebuild_queues
#![deny(unsafe_code)]

use super::recovery::QueueCtl;
use super::{RxQueue, TxQueue};
use crate::capture::ring::Direction;
use crate::capture::{Mirror, Tap};
use crate::ethdev::{Counters, PortError, QueueExport, QueueStats};
use mempool::MbufPool;
use std::path::Path;
use std::sync::Arc;

/// An exported queue pair, attached in this process.
pub struct AttachedPair {
    /// The RX queue (posted full when attached).
    pub rx: RxQueue,
    /// The TX queue.
    pub tx: TxQueue,
    ctl: Arc<QueueCtl>,
    counters: (Arc<Counters>, Arc<Counters>),
    export: QueueExport,
    dir: std::path::PathBuf,
    /// Where the queues leave their buffers when dropped.
    parked: Arc<crate::ethdev::Parked>,
    /// The caller says the primary destroyed the rings ([`AttachedPair::drop_destroyed`]).
    destroyed: bool,
    /// Where the primary reads this pair's counters.
    shared_stats: Option<super::shared_stats::SharedQueueStats>,
}

impl std::fmt::Debug for AttachedPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AttachedPair(port {} queue {} of process {})",
            self.export.port, self.export.queue, self.export.pid
        )
    }
}

impl AttachedPair {
    /// Attaches to queue pair `queue` of port `port`, which the primary exported to `dir`,
    /// posting receive buffers from `pool` (the primary's shared pool, attached in this
    /// process). Claim the pair first (`pmd::mp::Secondary::claim`): the queues have one
    /// owner. `device` is the port's device descriptor, which the primary passed
    /// (`pmd::mp::Secondary::device`): a `mana:` port's pairs ring the doorbell page
    /// mapped from it; a device-model port's need none.
    ///
    /// A pair is attached once per export: its rings then hold this process's state, and
    /// the primary rebuilds them ([`Port::rebuild_queues`](super::Port::rebuild_queues))
    /// before another process may attach.
    ///
    /// # Errors
    /// [`PortError::Setup`]: no description (not exported, or the primary is gone), one that
    /// does not parse or check out, a pair another process attached to since it was
    /// exported, a ring file that is missing or short, another pool, no `device` for a pair
    /// that needs it (or one that cannot be mapped), or too few free mbufs to post the RX
    /// ring.
    pub fn open(
        dir: &Path,
        port: u16,
        queue: u16,
        pool: &Arc<MbufPool>,
        device: Option<crate::sys::DeviceFd<'_>>,
    ) -> Result<Self, PortError> {
        let export = QueueExport::read_from(dir, port, queue).map_err(|why| PortError::Setup {
            what: format!("attaching to port {port} queue pair {queue}"),
            source: why.into(),
        })?;
        if device.is_some() && !generation_matches(&export, device) {
            return Err(PortError::Setup {
                what: format!("attaching to port {port} queue pair {queue}"),
                source: "the device descriptor held is not the one these rings are on (the \
                         primary's port was recovered onto a new device context since): ask \
                         the primary for the current one (pmd::mp::Secondary::refresh_device)"
                    .into(),
            });
        }
        let shared_stats = match export.area("stats") {
            Ok(a) => Some(
                super::shared_stats::SharedQueueStats::open(&a.path).map_err(|why| {
                    PortError::Setup {
                        what: format!("attaching to port {port} queue pair {queue}"),
                        source: why.into(),
                    }
                })?,
            ),
            Err(_) => None,
        };
        let counters = (Arc::new(Counters::default()), Arc::new(Counters::default()));
        let parked = crate::ethdev::Parked::new();
        let (rx, tx) = super::probe::import_pair(
            &export,
            device.map(|d| d.fd),
            pool,
            Arc::clone(&counters.0),
            Arc::clone(&counters.1),
            Arc::clone(&parked),
            || {
                export.mark_used(dir)?;
                // Rebuilt between our read and our mark: the mark is for rings we did not map.
                match QueueExport::read_from(dir, port, queue) {
                    Ok(now) if now == export => Ok(()),
                    _ => {
                        let _ = std::fs::remove_file(QueueExport::used_marker(dir, port, queue));
                        Err(
                            "the primary rebuilt the pair while this process attached: try again"
                                .into(),
                        )
                    }
                }
            },
        )?;
        let ctl = QueueCtl::new();
        ctl.set_running(true);
        let tap = Tap::new();
        tracing::info!(target: "pmd::port", port, queue, primary = export.pid, "attached to an exported queue pair");
        Ok(Self {
            rx: RxQueue {
                imp: rx,
                ctl: Arc::clone(&ctl),
                seen: super::recovery::NEVER,
                gen: ctl.gen(),
                port,
                queue,
                mirror: Mirror::new(Arc::clone(&tap), port, queue, Direction::Rx),
            },
            tx: TxQueue {
                imp: tx,
                ctl: Arc::clone(&ctl),
                seen: super::recovery::NEVER,
                gen: ctl.gen(),
                port,
                queue,
                mirror: Mirror::new(tap, port, queue, Direction::Tx),
            },
            ctl,
            counters,
            export,
            dir: dir.to_owned(),
            parked,
            destroyed: false,
            shared_stats,
        })
    }

    /// [`AttachedPair::open`], tried again for up to `timeout` while the pair's description
    /// is missing, changes under the attempt, or names files that are gone: a primary
    /// rebuilding the pair (after the secondary that held it left or died) destroys the old
    /// rings (their files go), then replaces the description, and a claim granted meanwhile
    /// finds rings that are going or no description. Any other error is returned at once.
    ///
    /// # Errors
    /// As [`AttachedPair::open`]; the last attempt's error at the timeout.
    pub fn open_waiting(
        dir: &Path,
        port: u16,
        queue: u16,
        pool: &Arc<MbufPool>,
        device: Option<crate::sys::DeviceFd<'_>>,
        timeout: std::time::Duration,
    ) -> Result<Self, PortError> {
        let t0 = std::time::Instant::now();
        loop {
            let before = QueueExport::read_from(dir, port, queue).ok();
            let err = match Self::open(dir, port, queue, pool, device) {
                Ok(p) => return Ok(p),
                Err(e) => e,
            };
            let after = QueueExport::read_from(dir, port, queue).ok();
            let stale = after
                .as_ref()
                .is_some_and(|e| e.areas.iter().any(|a| !a.path.exists()));
            if (before.is_some() && before == after && !stale) || t0.elapsed() >= timeout {
                return Err(err);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Whether `device` is of the device generation the current description of pair
    /// `queue` of `port` names (true for a pair that names none, and when there is no
    /// description to read): after the primary's port was recovered onto a new
    /// device context, the descriptor a secondary holds is the old one; ask the primary
    /// for the new one (`pmd::mp::Secondary::refresh_device`) before attaching again.
    pub fn device_is_current(
        dir: &Path,
        port: u16,
        queue: u16,
        device: Option<crate::sys::DeviceFd<'_>>,
    ) -> bool {
        QueueExport::read_from(dir, port, queue).map_or(true, |e| generation_matches(&e, device))
    }

    /// Whether the primary has rebuilt the pair since this process attached: its
    /// description now names other rings (the old ones are destroyed, so what this pair
    /// posted can go back to the pool). A description that is gone (the primary stopped or
    /// died) is not a rebuild. Reads a small file: ask from a control loop, not per burst.
    pub fn rebuilt(&self) -> bool {
        QueueExport::read_from(&self.dir, self.export.port, self.export.queue)
            .is_ok_and(|now| now != self.export)
    }

    /// Waits up to `timeout` for [`AttachedPair::rebuilt`]; polls every 10 ms.
    pub fn wait_rebuilt(&self, timeout: std::time::Duration) -> bool {
        let t0 = std::time::Instant::now();
        loop {
            if self.rebuilt() {
                return true;
            }
            if t0.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// This process's counters of the pair: (RX, TX).
    pub fn stats(&self) -> (QueueStats, QueueStats) {
        (self.counters.0.snapshot(), self.counters.1.snapshot())
    }

    /// Writes the pair's counters where the primary reads them (its port's statistics and
    /// telemetry then count this process's traffic on the pair). A few stores: call it from
    /// the polling loop now and then (l2fwd: every 50 ms), not per burst. Done once more
    /// when the pair is dropped.
    pub fn publish_stats(&self) {
        if let Some(s) = &self.shared_stats {
            let (rx, tx) = self.stats();
            s.publish(&rx, &tx);
        }
    }

    /// Stops the pair: from their next burst its handles return 0 (wherever they were
    /// moved to).
    pub fn stop(&self) {
        self.ctl.set_running(false);
    }

    /// The primary's pid.
    pub fn primary_pid(&self) -> u32 {
        self.export.pid
    }

    /// The port's MAC address, as the primary described it.
    pub fn mac(&self) -> Option<crate::net::MacAddr> {
        let v = self.export.value("mac").ok()?;
        Some(crate::ethdev::export::mac_of(v))
    }

    /// Drops the pair once the primary has said it destroyed its queues
    /// (`pmd::mp::Secondary::primary_closed_queues`): what the pair posted or had in flight
    /// goes back to the pool, which nothing else can tell here (the primary removed the
    /// description with its ports).
    pub fn drop_destroyed(mut self) {
        self.destroyed = true;
    }
}

impl Drop for AttachedPair {
    /// Stops the handles. What the pair's queues posted or had in flight goes back to the
    /// pool (once the handles are dropped) if the primary rebuilt the pair; else it stays
    /// out, since the device may still use it.
    fn drop(&mut self) {
        self.ctl.set_running(false);
        self.publish_stats();
        if !self.destroyed && !self.rebuilt() {
            let out = Arc::clone(&self.parked);
            tracing::info!(target: "pmd::port", port = self.export.port, queue = self.export.queue, "attached pair dropped before the primary rebuilt it: its posted buffers stay out of the pool");
            std::mem::forget(out);
        }
    }
}

/// Whether `device` is of the device generation description `e` names (true when it names
/// none: a device model's pairs).
fn generation_matches(e: &QueueExport, device: Option<crate::sys::DeviceFd<'_>>) -> bool {
    match e.value(super::DEVICE_GEN) {
        Ok(g) => device.is_some_and(|d| d.generation == g),
        Err(_) => true,
    }
}
