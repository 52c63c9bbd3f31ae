//! The MANA driver: our own datapath over the raw queues `manadv_init_obj` describes.
//!
//! * `mod.rs`: the provider contract (what verbs, or the device model, hand the datapath) and
//!   the port's slow path.
//! * [`txq`]: TX burst: WQEs straight into the SQ ring, one doorbell per burst, completions.
//! * [`rxq`]: RX burst: CQ polling by owner bits, mbuf delivery, bulk refill, one doorbell.
//!
//! See `DESIGN.md` beside this file for the queue state machine, memory ordering and sources.
#![deny(unsafe_code)]

pub mod rxq;
pub mod txq;

pub use rxq::RxQueue;
pub use txq::TxQueue;

use crate::devices::MacAddr;
use crate::port::counters::Counters;
use crate::port::{
    Caps, Link, PortConfig, PortDriver, PortError, PortSpec, QueueSetup, RssConfig, RxImpl,
    RxOffloads, TxImpl, TxOffloads,
};
use crate::sys::DevMem;
use mempool::{ChunkInfo, ChunkKeys, MbufPool, Registration};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A TX queue as `manadv_init_obj(QP | CQ)` describes it.
#[derive(Debug, Clone)]
pub struct RawTxQueue {
    /// SQ ring memory (`manadv_qp.sq_buf`, `sq_size` bytes).
    pub sq: Arc<DevMem>,
    /// Hardware SQ id (`manadv_qp.sq_id`).
    pub sq_id: u32,
    /// vPort offset for every TX OOB (`manadv_qp.tx_vp_offset`).
    pub tx_vp_offset: u16,
    /// The doorbell page (`manadv_qp.db_page`).
    pub db_page: Arc<DevMem>,
    /// CQ ring memory (`manadv_cq.buf`).
    pub cq: Arc<DevMem>,
    /// CQEs in the ring (`manadv_cq.count`).
    pub cq_count: u32,
    /// Hardware CQ id (`manadv_cq.cq_id`).
    pub cq_id: u32,
}

/// An RX queue as `manadv_init_obj(RWQ | CQ)` describes it.
#[derive(Debug, Clone)]
pub struct RawRxQueue {
    /// RQ ring memory (`manadv_rwq.buf`, `size` bytes).
    pub rq: Arc<DevMem>,
    /// Hardware RQ id (`manadv_rwq.wq_id`).
    pub rq_id: u32,
    /// The doorbell page (`manadv_rwq.db_page`).
    pub db_page: Arc<DevMem>,
    /// CQ ring memory.
    pub cq: Arc<DevMem>,
    /// CQEs in the ring.
    pub cq_count: u32,
    /// Hardware CQ id.
    pub cq_id: u32,
}

/// Errors of a MANA provider's control path.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Raw-packet QP creation failed with EBUSY / ENODEV: someone else holds the vPort.
    #[error("{holder} holds the port")]
    PortBusy {
        /// The kernel netdev that holds the port, when known (what a take-over brings down).
        netdev: Option<String>,
        /// Who (e.g. "kernel netdev eth1").
        holder: String,
        /// What to do.
        hint: String,
    },
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
    /// A verbs call (or its model equivalent) failed.
    #[error("{call} failed while creating {object}: {source}")]
    Verbs {
        /// The call.
        call: &'static str,
        /// The object.
        object: &'static str,
        /// errno.
        #[source]
        source: std::io::Error,
    },
}

/// The queue-buffer allocator contract of `manadv_set_context_attr(ctx,
/// MANADV_CTX_ATTR_BUF_ALLOCATORS, ..)` (spec §1.3): CQ, SQ and RQ rings live in memory the
/// application provides, page-aligned and zero-filled (a zero owner field means "empty"), and
/// mapped until the queue is destroyed.
pub trait QueueAllocator: Send + Sync {
    /// `size` bytes of page-aligned, zeroed memory.
    ///
    /// # Errors
    /// The memory could not be had.
    fn alloc(&self, size: usize) -> std::io::Result<Arc<DevMem>>;
}

/// Queue memory from anonymous page mappings (page-aligned and zeroed by the kernel).
#[derive(Debug, Default, Clone, Copy)]
pub struct PageAllocator;

impl QueueAllocator for PageAllocator {
    fn alloc(&self, size: usize) -> std::io::Result<Arc<DevMem>> {
        DevMem::anon(size).map(Arc::new)
    }
}

/// What the MANA datapath needs from below: rdma-core on hardware, the device model otherwise.
/// The calls mirror the bring-up checklist of the spec (§1.13).
pub trait Provider: Send {
    /// Sets the queue-buffer allocator (`manadv_set_context_attr`); must come before any
    /// queue is created.
    fn set_allocator(&mut self, alloc: Arc<dyn QueueAllocator>);
    /// The port's MAC address.
    fn mac(&self) -> MacAddr;
    /// Link state.
    fn link(&self) -> Link;
    /// Most queues of each kind.
    fn max_queues(&self) -> u16;
    /// Most descriptors per queue.
    fn max_desc(&self) -> u32;
    /// Registers one pool chunk for DMA (`ibv_reg_mr`) and returns its key; the registration
    /// lasts until the returned guard drops.
    ///
    /// # Errors
    /// The registration failed.
    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError>;
    /// Creates `n` TX queues of `nb_desc` WQEs each (CQ + raw-packet QP per queue).
    ///
    /// # Errors
    /// [`SetupError::PortBusy`] when the vPort is held; limits; verbs failures.
    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawTxQueue>, SetupError>;
    /// Creates `n` RX queues of `nb_desc` WQEs each, spread by RSS.
    ///
    /// # Errors
    /// As `create_tx_queues`.
    fn create_rx_queues(
        &mut self,
        n: u16,
        nb_desc: u32,
        rss: &RssConfig,
    ) -> Result<Vec<RawRxQueue>, SetupError>;
    /// Destroys all queues (teardown order of §1.10).
    fn destroy_queues(&mut self);
    /// Device-side counters, by name.
    fn xstats(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Frames the device dropped because no receive WQE was posted.
    fn rx_missed(&self) -> u64 {
        0
    }
    /// The device model behind this provider, if it is one.
    #[cfg(feature = "emu")]
    fn model(&self) -> Option<crate::emu::mana::ModelHandle> {
        None
    }
}

/// Driver-side extended counters of one port, updated by the owning cores.
#[derive(Debug, Default)]
pub struct DriverXstats {
    /// RX CQEs with a type other than RX_OKAY / RX_COALESCED_4.
    pub rx_cqe_errors: AtomicU64,
    /// RX_TRUNCATED CQEs.
    pub rx_cqe_truncated: AtomicU64,
    /// TX CQEs with an error type.
    pub tx_cqe_errors: AtomicU64,
    /// Times a CQ was found lapped by the device.
    pub cq_overflows: AtomicU64,
    /// Packets dropped at TX because they had more segments than a WQE holds.
    pub tx_too_many_segs: AtomicU64,
    /// Packets dropped at TX because a segment was outside any registered memory.
    pub tx_no_mkey: AtomicU64,
    /// Packets dropped at TX because their checksum-offload headers were not where the
    /// mbuf's lengths said.
    pub tx_bad_offload: AtomicU64,
    /// Packets dropped at TX because their TSO request was unusable (MSS 0 or above 16383,
    /// headers over 255 bytes or not in the first segment).
    pub tx_bad_tso: AtomicU64,
}

impl DriverXstats {
    #[inline]
    pub(crate) fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// The MANA port driver over a provider.
pub(crate) struct ManaDriver {
    provider: Box<dyn Provider>,
    /// Take the port over from the kernel netdev when it holds it (`takeover=1`).
    takeover: bool,
    /// The netdevs taken over, given back when the driver goes (after its queues).
    taken: Option<crate::takeover::NetdevGuard>,
    /// The pool registered with the provider, its keys, and the guards (via the pool).
    registered: Option<(Arc<MbufPool>, ChunkKeys)>,
    xstats: Arc<DriverXstats>,
}

/// Smallest queue the device takes (64 descriptors, DPDK's minimum).
pub const MIN_DESC: u16 = 64;

impl ManaDriver {
    pub(crate) fn new(mut provider: Box<dyn Provider>) -> Self {
        // The raw path needs external queue buffers before the first CQ exists (§1.3).
        provider.set_allocator(Arc::new(PageAllocator));
        Self {
            provider,
            takeover: false,
            taken: None,
            registered: None,
            xstats: Arc::new(DriverXstats::default()),
        }
    }

    #[cfg(feature = "emu")]
    pub(crate) fn open_emu(spec: &PortSpec, port_id: u16) -> Result<Self, PortError> {
        let provider = crate::emu::mana::EmuProvider::open(spec, port_id)?;
        let mut d = Self::new(Box::new(provider));
        d.takeover = spec.takeover;
        Ok(d)
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

impl PortDriver for ManaDriver {
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
            mtu_range: (68, 9000),
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
    ) -> Result<(Vec<RxImpl>, Vec<TxImpl>), PortError> {
        self.provider.destroy_queues();
        let keys = self.keys_for(pool)?;
        // The raw TX QP is where the kernel's hold on the vPort shows (§2.1).
        let raw_tx = match self
            .provider
            .create_tx_queues(cfg.tx_queues, u32::from(cfg.tx_ring_size))
        {
            Err(SetupError::PortBusy {
                netdev: Some(netdev),
                ..
            }) if self.takeover && self.taken.is_none() => {
                let guard = crate::takeover::NetdevGuard::take_over(&netdev).map_err(|e| {
                    PortError::Setup {
                        what: "taking the port over".into(),
                        source: Box::new(e),
                    }
                })?;
                self.taken = Some(guard);
                self.provider
                    .create_tx_queues(cfg.tx_queues, u32::from(cfg.tx_ring_size))
            }
            other => other,
        }
        .map_err(|e| setup_err("creating tx queues", e))?;
        let raw_rx = self
            .provider
            .create_rx_queues(cfg.rx_queues, u32::from(cfg.rx_ring_size), &cfg.rss)
            .map_err(|e| setup_err("creating rx queues", e))?;
        let tx = raw_tx
            .into_iter()
            .zip(&q.tx_counters)
            .map(|(raw, c): (RawTxQueue, &Arc<Counters>)| {
                TxImpl::Mana(Box::new(TxQueue::new(
                    raw,
                    cfg.tx_ring_size,
                    Arc::clone(pool),
                    keys.clone(),
                    Arc::clone(c),
                    Arc::clone(&self.xstats),
                )))
            })
            .collect();
        let mut rx = Vec::new();
        for (raw, c) in raw_rx.into_iter().zip(&q.rx_counters) {
            let mut queue = RxQueue::new(
                raw,
                cfg,
                q.port_id,
                Arc::clone(pool),
                keys.clone(),
                Arc::clone(c),
                Arc::clone(&self.xstats),
            );
            queue.fill().map_err(|missing| PortError::BadConfig {
                what: "mbuf pool size",
                requested: pool.capacity().to_string(),
                allowed: format!(
                    "enough free mbufs to post {} rx buffers ({missing} missing)",
                    cfg.rx_ring_size
                ),
            })?;
            rx.push(RxImpl::Mana(Box::new(queue)));
        }
        tracing::info!(target: "pmd::mana::init", port = q.port_id, rxq = cfg.rx_queues, txq = cfg.tx_queues, "mana queues created");
        Ok((rx, tx))
    }

    #[cfg(feature = "emu")]
    fn model(&self) -> Option<crate::emu::mana::ModelHandle> {
        self.provider.model()
    }

    fn imissed(&self) -> u64 {
        self.provider.rx_missed()
    }

    fn xstats(&self) -> Vec<(String, u64)> {
        let x = &self.xstats;
        let mut v = vec![
            (
                "rx_cqe_errors".to_string(),
                x.rx_cqe_errors.load(Ordering::Relaxed),
            ),
            (
                "rx_cqe_truncated".to_string(),
                x.rx_cqe_truncated.load(Ordering::Relaxed),
            ),
            (
                "tx_cqe_errors".to_string(),
                x.tx_cqe_errors.load(Ordering::Relaxed),
            ),
            (
                "cq_overflows".to_string(),
                x.cq_overflows.load(Ordering::Relaxed),
            ),
            (
                "tx_too_many_segs".to_string(),
                x.tx_too_many_segs.load(Ordering::Relaxed),
            ),
            (
                "tx_no_mkey".to_string(),
                x.tx_no_mkey.load(Ordering::Relaxed),
            ),
        ];
        v.extend(self.provider.xstats());
        v
    }
}

impl Drop for ManaDriver {
    fn drop(&mut self) {
        self.provider.destroy_queues();
    }
}
