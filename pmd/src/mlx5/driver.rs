//! The mlx5 port driver over a [`Provider`] (rdma-core on hardware, the device model
//! otherwise): registers the pool, creates the queues the provider describes and builds the
//! datapath's queues over them.
#![deny(unsafe_code)]

use super::provider::{RawRq, RawSq};
use super::{RxQueue, RxXstats, TxQueue, TxXstats};
use crate::ethdev::{
    rx_fill_error, Caps, Link, PoolRegistration, PortConfig, PortDriver, PortError, PortEvent,
    QueueSetup, Queues, RssConfig, RxBurst, RxOffloads, TxBurst, TxOffloads,
};
use crate::net::MacAddr;
use mempool::{ChunkInfo, MbufPool, Registration};
use std::os::fd::RawFd;
use std::sync::Arc;

/// Smallest ring the driver takes.
pub const MIN_DESC: u16 = 64;

/// Errors of an mlx5 provider's control path.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// No port matches the selection (the message says what there is).
    #[error("{0}")]
    NoPort(String),
    /// Queue sizes or counts outside the device's limits.
    #[error("{what}: {requested} requested, device maximum is {max}")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Asked.
        requested: u32,
        /// Allowed.
        max: u32,
    },
    /// A device call failed; the error names the call, the object, errno and what to do.
    #[error("{0}")]
    Device(Box<dyn std::error::Error + Send + Sync>),
}

/// What the mlx5 datapath needs from below (spec §1).
pub trait Provider: Send {
    /// The port's MAC address.
    fn mac(&self) -> MacAddr;
    /// Link state.
    fn link(&self) -> Link;
    /// Most queues of each kind.
    fn max_queues(&self) -> u16;
    /// Most descriptors per queue.
    fn max_desc(&self) -> u32;
    /// Whether the port can receive frames for any destination (a flow rule on hardware).
    fn promiscuous(&self) -> bool {
        false
    }
    /// Sets the port's MTU.
    ///
    /// # Errors
    /// The device refused the value.
    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError>;
    /// Registers one pool chunk (`ibv_reg_mr`); the registration lasts until the guard drops.
    ///
    /// # Errors
    /// The registration failed.
    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError>;
    /// Creates `n` send queues (raw-packet QP + CQ each) with room for `nb_desc` WQEBBs.
    ///
    /// # Errors
    /// Limits; device failures.
    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawSq>, SetupError>;
    /// Creates `n` receive queues (WQ + CQ each) of `nb_desc` WQEs, spread by RSS.
    ///
    /// # Errors
    /// As `create_tx_queues`.
    fn create_rx_queues(
        &mut self,
        n: u16,
        nb_desc: u32,
        rss: &RssConfig,
    ) -> Result<Vec<RawRq>, SetupError>;
    /// Destroys all queues; objects a queue handle still holds go when it drops.
    fn destroy_queues(&mut self);
    /// Device-side counters, by name.
    fn xstats(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Frames dropped for lack of a posted receive buffer.
    fn rx_missed(&self) -> u64 {
        0
    }
    /// The port's pollable event descriptor, if it has one.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }
    /// Appends the events that arrived since the last call.
    fn take_events(&mut self, _out: &mut Vec<PortEvent>) {}
}

/// The mlx5 port driver over a [`Provider`].
pub struct Driver {
    provider: Box<dyn Provider>,
    registered: PoolRegistration,
    rx_xstats: Vec<Arc<RxXstats>>,
    tx_xstats: Vec<Arc<TxXstats>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mlx5::Driver({})", self.provider.mac())
    }
}

impl Driver {
    /// A driver over `provider`.
    pub fn new(provider: Box<dyn Provider>) -> Self {
        Self {
            provider,
            registered: PoolRegistration::default(),
            rx_xstats: Vec::new(),
            tx_xstats: Vec::new(),
        }
    }
}

fn setup_err(what: &str, e: SetupError) -> PortError {
    PortError::Setup {
        what: what.to_string(),
        source: Box::new(e),
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
            mtu_range: (68, 9978),
            promiscuous: self.provider.promiscuous(),
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
        self.rx_xstats.clear();
        self.tx_xstats.clear();
        self.provider
            .set_mtu(cfg.mtu)
            .map_err(|e| setup_err("setting the mtu", e))?;
        let provider = &mut self.provider;
        let keys = self
            .registered
            .keys_for(pool, |chunk| provider.reg_mr(chunk))?;
        let raw_tx = self
            .provider
            .create_tx_queues(cfg.tx_queues, u32::from(cfg.tx_ring_size))
            .map_err(|e| setup_err("creating tx queues", e))?;
        let raw_rx = self
            .provider
            .create_rx_queues(cfg.rx_queues, u32::from(cfg.rx_ring_size), &cfg.rss)
            .map_err(|e| setup_err("creating rx queues", e))?;
        let mut rx: Vec<Box<dyn RxBurst>> = Vec::new();
        for (raw, c) in raw_rx.into_iter().zip(&q.rx_counters) {
            let x = Arc::new(RxXstats::default());
            self.rx_xstats.push(Arc::clone(&x));
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
            let x = Arc::new(TxXstats::default());
            self.tx_xstats.push(Arc::clone(&x));
            tx.push(Box::new(TxQueue::new(
                raw,
                cfg.tx_ring_size,
                Arc::clone(pool),
                keys.clone(),
                Arc::clone(c),
                x,
            )));
        }
        tracing::info!(target: "pmd::mlx5::init", port = q.port_id, rxq = cfg.rx_queues, txq = cfg.tx_queues, mtu = cfg.mtu, "mlx5 queues created");
        Ok(Queues { rx, tx })
    }

    fn imissed(&self) -> u64 {
        self.provider.rx_missed()
    }

    fn xstats(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = Vec::new();
        let mut add = |list: Vec<(String, u64)>| {
            for (k, n) in list {
                match v.iter_mut().find(|(name, _)| *name == k) {
                    Some((_, total)) => *total += n,
                    None => v.push((k, n)),
                }
            }
        };
        self.rx_xstats.iter().for_each(|x| add(x.list()));
        self.tx_xstats.iter().for_each(|x| add(x.list()));
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
