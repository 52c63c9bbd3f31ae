//! The mlx5 port driver over a [`Provider`] (rdma-core on hardware, the device model
//! otherwise): registers the pool, creates the queues the provider describes and builds the
//! datapath's queues over them.
#![deny(unsafe_code)]

use super::provider::{Mprq, MprqCaps, Provider, RawRq, RawSq, RxQueueRequest};
use super::{rxq_mprq, RxQueue, RxXstats, TxQueue, TxXstats};
use crate::ethdev::{
    rx_fill_error, Caps, Link, PoolRegistration, PortConfig, PortDriver, PortError, PortEvent,
    QueueSetup, Queues, RxBurst, RxOffloads, TxBurst, TxOffloads,
};
use crate::net::MacAddr;
use crate::sys::mem::{DeviceBuffers, PageAllocator, SharedFileAllocator};
use mempool::MbufPool;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Smallest ring the driver takes.
pub const MIN_DESC: u16 = 64;

/// How the driver sets its receive queues up (the `mprq=` and `cqe-comp=` device arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Receive through striding RQs of this geometry (`None`: cyclic RQs, one mbuf per WQE).
    pub mprq: Option<Mprq>,
    /// Ask for compressed RX CQEs (DPDK's `rxq_cqe_comp_en`, on by default; §1.4, §6).
    pub cqe_compression: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            mprq: None,
            cqe_compression: true,
        }
    }
}

/// Bytes a frame carries beyond its MTU on the wire as the RQ sees it: the Ethernet header
/// and one VLAN tag (no FCS: it is not scattered, §1.6).
const L2_OVERHEAD: u32 = crate::ethdev::L2_OVERHEAD as u32;
/// The largest MTU of a ConnectX port (DPDK net/mlx5's range).
const MAX_MTU: u16 = 9978;

/// The mlx5 port driver over a [`Provider`].
pub struct Driver {
    provider: Box<dyn Provider>,
    opts: Options,
    registered: PoolRegistration,
    rx_xstats: Vec<Arc<RxXstats>>,
    tx_xstats: Vec<Arc<TxXstats>>,
    /// The queue pairs exported to other processes (`PortConfig::export`): held here so
    /// their device objects live until the next configuration or the driver's end.
    exported: Vec<(RawRq, RawSq)>,
    exports: Vec<crate::ethdev::QueueExport>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mlx5::Driver({})", self.provider.mac())
    }
}

impl Driver {
    /// A driver over `provider`, with the default [`Options`] (cyclic RQs, compressed CQEs).
    pub fn new(provider: Box<dyn Provider>) -> Self {
        Self::with_options(provider, Options::default())
    }

    /// A driver over `provider` with `opts`.
    pub fn with_options(provider: Box<dyn Provider>, opts: Options) -> Self {
        Self {
            provider,
            opts,
            registered: PoolRegistration::default(),
            rx_xstats: Vec::new(),
            tx_xstats: Vec::new(),
            exported: Vec::new(),
            exports: Vec::new(),
        }
    }
}

/// Checks a striding geometry against the device and the port configuration: the device's
/// limits, a whole frame of `cfg.mtu` within one WQE (frames longer than a stride span
/// strides, §4.2, but never WQEs), and a ring of at least two WQEs (so the device can fill
/// one while software finishes the other).
///
/// # Errors
/// [`PortError::BadConfig`] naming the setting and what would do.
pub fn check_mprq(m: Mprq, caps: Option<MprqCaps>, cfg: &PortConfig) -> Result<(), PortError> {
    let geometry = format!(
        "mprq-log-stride={} mprq-log-strides={}",
        m.log_stride_bytes, m.log_strides
    );
    let Some(caps) = caps else {
        return Err(PortError::BadConfig {
            what: "mprq",
            requested: geometry,
            allowed: "cyclic RQs only (mprq=0): the device reports no striding RQ capability"
                .into(),
        });
    };
    if !caps.allows(m) {
        return Err(PortError::BadConfig {
            what: "mprq geometry",
            requested: geometry,
            allowed: format!(
                "mprq-log-stride {}..={} and mprq-log-strides {}..={}",
                caps.min_single_stride_log_num_of_bytes,
                caps.max_single_stride_log_num_of_bytes,
                caps.min_single_wqe_log_num_of_strides,
                caps.max_single_wqe_log_num_of_strides
            ),
        });
    }
    let frame = u64::from(u32::from(cfg.mtu) + L2_OVERHEAD);
    if frame > m.wqe_bytes() {
        return Err(PortError::BadConfig {
            what: "mtu",
            requested: cfg.mtu.to_string(),
            allowed: format!(
                "at most {} with striding RQ WQEs of {} strides of {} bytes (a frame never \
                 spans WQEs): raise mprq-log-stride or mprq-log-strides",
                m.wqe_bytes() - u64::from(L2_OVERHEAD),
                m.strides(),
                m.stride_bytes()
            ),
        });
    }
    if u32::from(cfg.rx_ring_size) < 2 * m.strides() {
        return Err(PortError::BadConfig {
            what: "rx ring size",
            requested: cfg.rx_ring_size.to_string(),
            allowed: format!(
                "at least {} with {} strides per WQE (two WQEs): raise the ring or lower \
                 mprq-log-strides",
                2 * m.strides(),
                m.strides()
            ),
        });
    }
    Ok(())
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
            mtu_range: (68, crate::ethdev::cap_mtu(MAX_MTU, self.provider.max_mtu())),
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
        if let Some(m) = self.opts.mprq {
            check_mprq(m, self.provider.mprq_caps(), cfg)?;
        }
        let exported: &[u16] = cfg.export.as_ref().map_or(&[], |x| &x.queues);
        if self.opts.mprq.is_some() && !exported.is_empty() {
            return Err(PortError::BadConfig {
                what: "exported queue pairs",
                requested: format!("{exported:?} with striding RQs"),
                allowed: "cyclic RQs only (mprq=0): a striding RQ's buffers are the primary \
                          port's, not the shared pool's"
                    .into(),
            });
        }
        self.exports.clear();
        self.exported.clear();
        self.provider.destroy_queues();
        self.rx_xstats.clear();
        self.tx_xstats.clear();
        // Exported queues need their rings and records where another process can map them.
        match &cfg.export {
            Some(x) => {
                self.provider
                    .set_allocator(Arc::new(SharedFileAllocator::for_configuration(
                        &x.dir,
                        &format!("mlx5-port{}", q.port_id),
                    )))
            }
            None => self.provider.set_allocator(Arc::new(PageAllocator)),
        }
        self.provider
            .set_mtu(cfg.mtu)
            .map_err(|e| e.into_port_error("setting the mtu"))?;
        let provider = &mut self.provider;
        let keys = self
            .registered
            .keys_for(pool, |chunk| provider.reg_mr(chunk))?;
        let raw_tx = self
            .provider
            .create_tx_queues(cfg.tx_queues, u32::from(cfg.tx_ring_size))
            .map_err(|e| e.into_port_error("creating tx queues"))?;
        let req = RxQueueRequest {
            n: cfg.rx_queues,
            nb_desc: u32::from(cfg.rx_ring_size),
            rss: cfg.rss.clone(),
            mprq: self.opts.mprq,
            cqe_compression: self.opts.cqe_compression,
            promiscuous: cfg.promiscuous,
        };
        let raw_rx = self
            .provider
            .create_rx_queues(&req)
            .map_err(|e| e.into_port_error("creating rx queues"))?;
        let mut raw_tx: Vec<Option<RawSq>> = raw_tx.into_iter().map(Some).collect();
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
            let x = Arc::new(RxXstats::default());
            self.rx_xstats.push(Arc::clone(&x));
            tracing::debug!(target: "pmd::mlx5::init", port = q.port_id, rxq = i, rqn = raw.rqn, wqes = raw.wqe_cnt, cqes = raw.cq.cqe_cnt, mprq = ?raw.mprq, cqe_compression = raw.cqe_compression, "rx queue");
            let Some(m) = raw.mprq else {
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
                continue;
            };
            // What the queue got may differ from what was asked: check it too.
            check_mprq(m, self.provider.mprq_caps(), cfg)?;
            let provider = &mut self.provider;
            let bufs = DeviceBuffers::new(
                &format!("mlx5-p{}-rxq{i}-strides", q.port_id),
                raw.wqe_cnt,
                m.wqe_bytes() as usize,
                |chunk| provider.reg_mr(chunk).map_err(Into::into),
            )
            .map_err(|e| PortError::Setup {
                what: format!("striding rx queue {i}: buffers of {} bytes", m.wqe_bytes()),
                source: Box::new(e),
            })?;
            let mut queue = rxq_mprq::RxQueue::new(
                raw,
                bufs,
                cfg,
                q.port_id,
                Arc::clone(pool),
                Arc::clone(c),
                x,
            );
            queue.fill();
            rx.push(Box::new(queue));
        }
        let mut tx: Vec<Box<dyn TxBurst>> = Vec::new();
        for (raw, c) in raw_tx.into_iter().zip(&q.tx_counters) {
            let Some(raw) = raw else {
                tx.push(Box::new(crate::ethdev::Exported));
                continue;
            };
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
        tracing::info!(target: "pmd::mlx5::init", port = q.port_id, rxq = cfg.rx_queues, txq = cfg.tx_queues, mtu = cfg.mtu, mprq = ?self.opts.mprq, cqe_compression = self.opts.cqe_compression, "mlx5 queues created");
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
        let mut v = RxXstats::sum(&self.rx_xstats);
        v.extend(TxXstats::sum(&self.tx_xstats));
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
