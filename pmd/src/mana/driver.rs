//! The MANA port driver over a [`Provider`] (rdma-core on hardware, the device model
//! otherwise): the port's slow path, which registers the pool, creates the queues the
//! provider describes and builds the datapath's queues over them.
#![deny(unsafe_code)]

use super::provider::{
    PageAllocator, Provider, RawRxQueue, RawTxQueue, SetupError, SharedFileAllocator,
};
use super::{RxQueue, TxQueue, Xstats};
use crate::ethdev::{
    rx_fill_error, Caps, Link, PoolRegistration, PortConfig, PortDriver, PortError, PortEvent,
    QueueSetup, Queues, RxBurst, RxOffloads, TxBurst, TxOffloads,
};
use crate::net::MacAddr;
use crate::takeover::{BusyPolicy, NetdevGuard, Seconds};
use mempool::{ChunkKeys, MbufPool};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Smallest queue the device takes (64 descriptors, DPDK's minimum).
pub const MIN_DESC: u16 = 64;

/// How the driver treats the port beyond its queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// What to do when the kernel's netdev holds the port (`busy=`): fail, wait for it, or
    /// take the port over (bring the netdev down, and up again when the driver goes).
    pub busy: BusyPolicy,
}

/// Back-off of `busy=wait` between two tries: from the first to the last, doubling.
const BUSY_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(500));

/// The MANA port driver over a [`Provider`].
pub struct Driver {
    provider: Box<dyn Provider>,
    opts: Options,
    /// The netdevs taken over, given back when the driver goes (after its queues).
    taken: Option<NetdevGuard>,
    /// The pool registered with the provider, its keys, and the guards (via the pool).
    registered: PoolRegistration,
    /// Per-queue driver counters of the current configuration (RX queues, then TX queues).
    xstats: Vec<Arc<Xstats>>,
    /// The queue pairs exported to other processes (`PortConfig::export`): held here so
    /// their device objects live while the port does, and described.
    exported: Vec<(RawRxQueue, RawTxQueue)>,
    exports: Vec<crate::ethdev::QueueExport>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mana::Driver({}, {:?})", self.provider.mac(), self.opts)
    }
}

impl Driver {
    /// A driver over `provider`. Sets the queue-buffer allocator first: the raw path needs
    /// external queue buffers before the first CQ exists (§1.3).
    pub fn new(mut provider: Box<dyn Provider>, opts: Options) -> Self {
        provider.set_allocator(Arc::new(PageAllocator));
        Self {
            provider,
            opts,
            taken: None,
            registered: PoolRegistration::default(),
            xstats: Vec::new(),
            exported: Vec::new(),
            exports: Vec::new(),
        }
    }

    fn keys_for(&mut self, pool: &Arc<MbufPool>) -> Result<ChunkKeys, PortError> {
        let provider = &mut self.provider;
        self.registered
            .keys_for(pool, |chunk| provider.reg_mr(chunk))
    }

    /// Creates the TX queues. The raw TX QP is where the kernel's hold on the vPort shows
    /// (§2.1); what happens then is the port's [`BusyPolicy`]: fail; retry with back-off
    /// until the port is free (a stop signal ends the wait); or take the port over and try
    /// once more.
    fn create_tx(&mut self, cfg: &PortConfig) -> Result<Vec<RawTxQueue>, PortError> {
        let nb_desc = u32::from(cfg.tx_ring_size);
        let t0 = Instant::now();
        let mut backoff = BUSY_BACKOFF.0;
        loop {
            let busy = match self.provider.create_tx_queues(cfg.tx_queues, nb_desc) {
                Err(e @ SetupError::PortBusy { .. }) => e,
                other => return other.map_err(|e| e.into_port_error("creating tx queues")),
            };
            match (self.opts.busy, &busy) {
                (
                    BusyPolicy::Takeover,
                    SetupError::PortBusy {
                        netdev: Some(netdev),
                        master,
                        ..
                    },
                ) if self.taken.is_none() => {
                    let holder = crate::takeover::Holder {
                        netdev: netdev.clone(),
                        master: master.clone(),
                    };
                    let guard =
                        NetdevGuard::take_over_holder(&holder).map_err(|e| PortError::Setup {
                            what: format!("taking the port over from {}", holder.describe()),
                            source: Box::new(e),
                        })?;
                    self.taken = Some(guard);
                }
                (BusyPolicy::Wait { timeout }, SetupError::PortBusy { holder, .. }) => {
                    let waited = t0.elapsed();
                    if backoff == BUSY_BACKOFF.0 {
                        // Once per wait: the first try.
                        tracing::warn!(target: "pmd::mana::init", "busy=wait: {holder} holds the port; waiting up to {} s for it to be free", Seconds(timeout));
                    }
                    if waited >= timeout {
                        return Err(waited_too_long(busy, waited));
                    }
                    if crate::takeover::exit::stop_requested() {
                        return Err(PortError::Setup {
                            what: "waiting for the port to be free (busy=wait)".into(),
                            source: "stopped by a signal".into(),
                        });
                    }
                    std::thread::sleep(backoff.min(timeout - waited));
                    backoff = (backoff * 2).min(BUSY_BACKOFF.1);
                }
                _ => return Err(busy.into_port_error("creating tx queues")),
            }
        }
    }
}

/// The busy error after `busy=wait` gave up.
fn waited_too_long(busy: SetupError, waited: Duration) -> PortError {
    match busy {
        SetupError::PortBusy {
            netdev,
            master,
            errno,
            holder,
            ..
        } => {
            let h = netdev.map(|netdev| crate::takeover::Holder { netdev, master });
            PortError::Busy {
                spec: "creating tx queues".into(),
                holder,
                hint: crate::takeover::busy::hint_after_wait(h.as_ref(), errno, waited),
            }
        }
        other => other.into_port_error("creating tx queues"),
    }
}

impl PortDriver for Driver {
    fn caps(&self) -> Caps {
        let max_desc = self.provider.max_desc().min(u32::from(u16::MAX)) as u16;
        Caps {
            max_rx_queues: self.provider.max_queues(),
            max_tx_queues: self.provider.max_queues(),
            min_ring_size: MIN_DESC,
            max_ring_size: max_desc,
            ring_size_pow2: true,
            rx_offloads: RxOffloads::IPV4_CKSUM
                | RxOffloads::L4_CKSUM
                | RxOffloads::RSS_HASH
                | RxOffloads::VLAN_STRIP,
            tx_offloads: TxOffloads::IPV4_CKSUM
                | TxOffloads::UDP_CKSUM
                | TxOffloads::TCP_CKSUM
                | TxOffloads::TCP_TSO
                | TxOffloads::VLAN_INSERT
                | TxOffloads::MULTI_SEGS,
            max_burst: max_desc,
            // DPDK net/mana's range (spec §1.11), capped by the device's (a host without
            // jumbo frames: 1500).
            mtu_range: (68, crate::ethdev::cap_mtu(9000, self.provider.max_mtu())),
            // The vPort receives its own MAC, broadcast and multicast only: neither the
            // kernel driver nor DPDK's net/mana has a promiscuous mode for MANA.
            promiscuous: false,
        }
    }

    fn mac(&self) -> MacAddr {
        self.provider.mac()
    }

    fn link(&self) -> Link {
        self.provider.link()
    }

    fn configure(
        &mut self,
        cfg: &PortConfig,
        pool: &Arc<MbufPool>,
        q: &QueueSetup,
    ) -> Result<Queues, PortError> {
        self.exports.clear();
        self.exported.clear();
        self.provider.destroy_queues();
        self.xstats.clear();
        // Exported queues need their rings where another process can map them.
        match &cfg.export {
            Some(x) => {
                self.provider
                    .set_allocator(Arc::new(SharedFileAllocator::for_configuration(
                        &x.dir,
                        &format!("port{}", q.port_id),
                    )))
            }
            None => self.provider.set_allocator(Arc::new(PageAllocator)),
        }
        let exported: &[u16] = cfg.export.as_ref().map_or(&[], |x| &x.queues);
        self.provider
            .set_mtu(cfg.mtu)
            .map_err(|e| e.into_port_error("setting the mtu"))?;
        if cfg.fork_safe || crate::ethdev::fork_safe_from_env() {
            self.provider
                .fork_safe()
                .map_err(|e| e.into_port_error("making memory registration fork-safe"))?;
        }
        let keys = self.keys_for(pool)?;
        let raw_tx = self.create_tx(cfg)?;
        let raw_rx = self
            .provider
            .create_rx_queues(cfg.rx_queues, u32::from(cfg.rx_ring_size), &cfg.rss)
            .map_err(|e| e.into_port_error("creating rx queues"))?;
        let mut raw_tx: Vec<Option<RawTxQueue>> = raw_tx.into_iter().map(Some).collect();
        let mut rx: Vec<Box<dyn RxBurst>> = Vec::new();
        for (i, (raw, c)) in raw_rx.into_iter().zip(&q.rx_counters).enumerate() {
            if exported.contains(&(i as u16)) {
                let tx_raw = crate::ethdev::export::take_tx(&mut raw_tx, i, cfg.tx_queues)?;
                let e = super::export::describe(
                    (q.port_id, i as u16),
                    (&raw, &tx_raw),
                    cfg,
                    pool,
                    &keys,
                    self.provider.mac(),
                )
                .map_err(|why| PortError::Setup {
                    what: format!("exporting queue pair {i}"),
                    source: why.into(),
                })?;
                self.exports.push(e);
                self.exported.push((raw, tx_raw));
                rx.push(Box::new(crate::ethdev::Exported));
                continue;
            }
            let x = Arc::new(Xstats::default());
            self.xstats.push(Arc::clone(&x));
            let mut queue = RxQueue::new(
                raw,
                cfg,
                q.port_id,
                Arc::clone(pool),
                keys.clone(),
                Arc::clone(c),
                x,
            );
            queue
                .fill()
                .map_err(|missing| rx_fill_error(pool, cfg.rx_ring_size, missing))?;
            rx.push(Box::new(queue));
        }
        let mut tx: Vec<Box<dyn TxBurst>> = Vec::new();
        for (raw, c) in raw_tx.into_iter().zip(&q.tx_counters) {
            let Some(raw) = raw else {
                tx.push(Box::new(crate::ethdev::Exported));
                continue;
            };
            let x = Arc::new(Xstats::default());
            self.xstats.push(Arc::clone(&x));
            tx.push(Box::new(TxQueue::new(
                raw,
                cfg.tx_ring_size,
                Arc::clone(pool),
                keys.clone(),
                Arc::clone(c),
                x,
            )));
        }
        tracing::info!(target: "pmd::mana::init", port = q.port_id, rxq = cfg.rx_queues, txq = cfg.tx_queues, mtu = cfg.mtu, "mana queues created");
        Ok(Queues { rx, tx })
    }

    fn imissed(&self) -> u64 {
        self.provider.rx_missed()
    }

    fn exports(&self) -> Vec<crate::ethdev::QueueExport> {
        self.exports.clone()
    }

    fn device_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.provider.device_fd()
    }

    fn xstats(&self) -> Vec<crate::ethdev::Xstat> {
        let mut v = Xstats::sum(&self.xstats);
        v.extend(self.provider.xstats());
        v
    }

    fn event_fd(&self) -> Option<RawFd> {
        self.provider.event_fd()
    }

    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        self.provider.take_events(out);
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The exported queues' handles first, as the port drops its own before the driver.
        self.exported.clear();
        self.provider.destroy_queues();
    }
}
