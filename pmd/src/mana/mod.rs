//! The MANA driver: our own datapath over the raw queues `manadv_init_obj` describes.
//!
//! * `mod.rs`: the port's slow path ([`Driver`]).
//! * [`provider`]: the provider contract (what verbs, or the device model, hand the
//!   datapath) and the raw-queue descriptions.
//! * [`txq`]: TX burst: WQEs straight into the SQ ring, one doorbell per burst, completions.
//! * [`rxq`]: RX burst: CQ polling by owner bits, mbuf delivery, bulk refill, one doorbell.
//!
//! A MANA port over any provider (the device model, rdma-core, or a test's own):
//! [`crate::port::probe::mana`]. See `DESIGN.md` beside this file for the queue state
//! machine, memory ordering and sources.
#![deny(unsafe_code)]

pub mod cq;
pub mod provider;
pub mod rxq;
pub mod txq;
mod xstats;

pub use provider::{
    PageAllocator, Provider, QueueAllocator, QueueOwner, RawRxQueue, RawTxQueue, SetupError,
};
pub use rxq::RxQueue;
pub use txq::TxQueue;
pub use xstats::Xstats;

use crate::ethdev::{
    Caps, Link, PortConfig, PortDriver, PortError, PortEvent, QueueSetup, Queues, RxBurst,
    RxOffloads, TxBurst, TxOffloads,
};
use crate::net::MacAddr;
use mempool::{ChunkKeys, MbufPool};
use std::os::fd::RawFd;
use std::sync::Arc;

/// Smallest queue the device takes (64 descriptors, DPDK's minimum).
pub const MIN_DESC: u16 = 64;

/// How the driver treats the port beyond its queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Take the port over from the kernel netdev when it holds it (`takeover=1`): bring it
    /// down, and up again when the driver goes.
    pub takeover: bool,
}

/// The MANA port driver over a [`Provider`].
pub struct Driver {
    provider: Box<dyn Provider>,
    opts: Options,
    /// The netdevs taken over, given back when the driver goes (after its queues).
    taken: Option<crate::takeover::NetdevGuard>,
    /// The pool registered with the provider, its keys, and the guards (via the pool).
    registered: Option<(Arc<MbufPool>, ChunkKeys)>,
    /// Per-queue driver counters of the current configuration (RX queues, then TX queues).
    xstats: Vec<Arc<Xstats>>,
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
            registered: None,
            xstats: Vec::new(),
        }
    }

    fn keys_for(&mut self, pool: &Arc<MbufPool>) -> Result<ChunkKeys, PortError> {
        if let Some((p, keys)) = &self.registered {
            if Arc::ptr_eq(p, pool) {
                return Ok(keys.clone());
            }
        }
        let provider = &mut self.provider;
        let keys = pool
            .register_chunks(|chunk| {
                provider
                    .reg_mr(chunk)
                    .map_err(|e| Box::new(e) as mempool::BoxError)
            })
            .map_err(|e| PortError::Setup {
                what: "registering the mbuf pool for DMA".into(),
                source: Box::new(e),
            })?;
        self.registered = Some((Arc::clone(pool), keys.clone()));
        Ok(keys)
    }

    /// Creates the TX queues; where the kernel holds the vPort and `takeover` is on, takes
    /// the port over and tries once more. The raw TX QP is where the hold shows (§2.1).
    fn create_tx(&mut self, cfg: &PortConfig) -> Result<Vec<RawTxQueue>, PortError> {
        let nb_desc = u32::from(cfg.tx_ring_size);
        match self.provider.create_tx_queues(cfg.tx_queues, nb_desc) {
            Err(SetupError::PortBusy {
                netdev: Some(netdev),
                ..
            }) if self.opts.takeover && self.taken.is_none() => {
                let guard = crate::takeover::NetdevGuard::take_over(&netdev).map_err(|e| {
                    PortError::Setup {
                        what: "taking the port over".into(),
                        source: Box::new(e),
                    }
                })?;
                self.taken = Some(guard);
                self.provider.create_tx_queues(cfg.tx_queues, nb_desc)
            }
            other => other,
        }
        .map_err(|e| setup_err("creating tx queues", e))
    }
}

fn setup_err(spec_what: &str, e: SetupError) -> PortError {
    match e {
        SetupError::PortBusy { holder, hint, .. } => PortError::Busy {
            spec: spec_what.to_string(),
            holder,
            hint,
        },
        other => PortError::Setup {
            what: spec_what.to_string(),
            source: Box::new(other),
        },
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
            // DPDK net/mana's range (spec §1.11).
            mtu_range: (68, 9000),
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
        self.provider.destroy_queues();
        self.xstats.clear();
        self.provider
            .set_mtu(cfg.mtu)
            .map_err(|e| setup_err("setting the mtu", e))?;
        if cfg.fork_safe || crate::ethdev::fork_safe_from_env() {
            self.provider
                .fork_safe()
                .map_err(|e| setup_err("making memory registration fork-safe", e))?;
        }
        let keys = self.keys_for(pool)?;
        let raw_tx = self.create_tx(cfg)?;
        let raw_rx = self
            .provider
            .create_rx_queues(cfg.rx_queues, u32::from(cfg.rx_ring_size), &cfg.rss)
            .map_err(|e| setup_err("creating rx queues", e))?;
        let mut rx: Vec<Box<dyn RxBurst>> = Vec::new();
        for (raw, c) in raw_rx.into_iter().zip(&q.rx_counters) {
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
            queue.fill().map_err(|missing| PortError::BadConfig {
                what: "mbuf pool size",
                requested: pool.capacity().to_string(),
                allowed: format!(
                    "enough free mbufs to post {} rx buffers ({missing} missing)",
                    cfg.rx_ring_size
                ),
            })?;
            rx.push(Box::new(queue));
        }
        let mut tx: Vec<Box<dyn TxBurst>> = Vec::new();
        for (raw, c) in raw_tx.into_iter().zip(&q.tx_counters) {
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

    fn xstats(&self) -> Vec<(String, u64)> {
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
        self.provider.destroy_queues();
    }
}
