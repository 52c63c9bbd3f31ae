//! The MANA provider over rdma-core: `mana:` ports on an Azure VM (or on the fake
//! rdma-core of the tests).
//!
//! Bring-up, in DPDK net/mana's order (spec §1.13): open the device of the port; install
//! the queue-buffer allocators (`manadv_set_context_attr`) before any queue exists; a PD and
//! a parent domain whose `pd_context` is the port number (the MANA provider takes the port
//! of a raw queue from there); register the pool's chunks on the PD; per TX queue a CQ and a
//! raw-packet QP asking for 30 SGEs (what the datapath may send); per RX queue a CQ and a
//! WQ, then the indirection table and the RSS QP with the 40-byte Toeplitz key; only then
//! `manadv_init_obj` (rdma-core v44 learns the CQ ids from the QPs). Sizes are clamped to
//! the device's limits by the port layer, which says so.
//!
//! Events: the context's async-event descriptor, made non-blocking at open, is the port's
//! event descriptor; [`super::events`] fetches, acknowledges and maps each event. Every
//! context of a device sees every port's events, so the provider keeps its own port's;
//! queue errors name the queue whose CQ, QP or WQ they are about.
#![deny(unsafe_code)]

use super::events;
use super::manadv::{self, Allocators};
use super::objects::{Context, Cq, IndTable, Mr, ParentDomain, Pd, Qp, Wq};
use super::VerbsError;
use crate::devices::{self, sysfs_root, PortSelector as Selector};
use crate::ethdev::{Link, PortEvent, QueueRef, RssConfig, RssFields};
use crate::hw::mana::MAX_TX_SGES;
use crate::mana::{Provider, QueueAllocator, QueueOwner, RawRxQueue, RawTxQueue, SetupError};
use crate::net::MacAddr;
use mempool::{ChunkInfo, Registration};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;

/// The device's limits, from `ibv_query_device_ex`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most WQEs per queue (`max_qp_wr`).
    pub max_wr: u32,
    /// Most CQEs per CQ.
    pub max_cqe: u32,
    /// Most SGEs per send WQE.
    pub max_sge: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Largest indirection table (0: not reported).
    pub max_ind_table: u32,
    /// Ports of the device.
    pub ports: u8,
}

/// Queues of one TX queue: what its handle keeps alive.
struct TxObjects {
    qp: Arc<Qp>,
    cq: Arc<Cq>,
    /// After the QP and CQ: the frames the queue left in flight.
    parked: Arc<crate::ethdev::Parked>,
}

/// RX queues: the RSS QP (which holds the table, the WQs and their CQs).
struct RxObjects {
    _rss: Arc<Qp>,
    /// After the QP (and with it the table and the WQs): the buffers the queues left.
    _parked: Arc<crate::ethdev::Parked>,
}

/// A MANA port over rdma-core.
pub struct ManaProvider {
    ctx: Arc<Context>,
    port: u32,
    pd: Arc<Pd>,
    domain: Arc<ParentDomain>,
    alloc: Arc<Allocators>,
    mac: MacAddr,
    netdev: Option<devices::Netdev>,
    limits: Limits,
    tx: Vec<QueueOwner>,
    rx: Option<QueueOwner>,
    /// The queue each live CQ, QP and WQ belongs to, by address (what an async event names).
    objects: HashMap<usize, QueueRef>,
    /// Whether the async-event descriptor can be polled: made non-blocking at open, and the
    /// device not gone since.
    events_live: bool,
    /// The queue allocator is a shared one (queue pairs exported to another process): the
    /// rings are named by their files, and no queue runs a fake device model inline (the
    /// other process's queues need the model's own thread).
    shared_rings: bool,
}

impl std::fmt::Debug for ManaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ManaProvider({} port {})", self.ctx.name(), self.port)
    }
}

fn verbs(e: VerbsError) -> SetupError {
    SetupError::Device(Box::new(e))
}

/// `vendor_part_id` of a MANA function's raw-packet device: the GDMA device type
/// `GDMA_DEVICE_MANA` (kernel include/net/mana/gdma.h), which `mana_ib_query_device` reports;
/// its RDMA device reports `GDMA_DEVICE_MANA_IB` (3). Older kernels report 0.
const PART_RAW_PACKET: u32 = 2;

/// Why a device is not the raw-packet device of its MANA function, or `None` when it is (or
/// cannot tell: an older kernel reports neither field). Kernel `mana_ib_query_device` sets
/// `vendor_part_id` to the GDMA device type and `raw_packet_caps` only on the raw-packet
/// device; DPDK's net/mana skips a device with a non-zero part id other than 2, or without
/// raw-packet capabilities.
fn not_raw_packet(attr: &rdma_sys::ibv_device_attr_ex) -> Option<String> {
    let part = attr.orig_attr.vendor_part_id;
    if part == 0 {
        return None;
    }
    if part != PART_RAW_PACKET {
        return Some(format!(
            "vendor part id {part}, the function's RDMA device, not its raw-packet one ({PART_RAW_PACKET})"
        ));
    }
    (attr.raw_packet_caps == 0).then(|| "no raw-packet capabilities".to_string())
}

impl ManaProvider {
    /// The fake rdma-core's inline model for a queue (`Context::fake_kick`), unless the
    /// rings are shared with another process, which the model's own thread must serve.
    fn kick(&self, is_rx: bool, queue_id: u32) -> crate::ethdev::Kick {
        if self.shared_rings {
            None
        } else {
            self.ctx.fake_kick(is_rx, queue_id)
        }
    }

    /// The fake rdma-core's doorbell monitor for a queue whose rings another process polls
    /// too (`Context::fake_db_monitor`): its engine runs on its own thread there, sampling
    /// the shared doorbell page, and would miss a doorbell a sibling overwrote (an RQ whose
    /// first one is missed never receives). `None` on real rdma-core, and for ports that
    /// export nothing (their fake engines run inline, kicked after each first fill).
    ///
    /// # Errors
    /// The fake could not make one: the queue could not be served (once a context has a
    /// monitor the fake reads its doorbells through monitors only).
    fn monitor(
        &self,
        is_rx: bool,
        queue_id: u32,
        owner: &QueueOwner,
    ) -> Result<Option<Arc<crate::sys::DevMem>>, SetupError> {
        if !self.shared_rings {
            return Ok(None);
        }
        self.ctx
            .fake_db_monitor(is_rx, queue_id, owner)
            .transpose()
            .map_err(verbs)
    }

    /// Opens the port `sel` names: the device context, its allocators, a PD and the port's
    /// parent domain.
    ///
    /// # Errors
    /// No such port, or a verbs call failed (everything opened so far is closed again).
    pub fn open(sel: &Selector) -> Result<Self, SetupError> {
        let candidates = devices::resolve_ports(&sysfs_root(), devices::Family::Mana, sel)
            .map_err(SetupError::NoPort)?;
        // Newer kernels list a MANA function twice: its raw-packet device and its RDMA
        // (RNIC) device, with the same netdev; only the first creates raw-packet QPs. Take
        // the first candidate that is a raw-packet device (as DPDK's net/mana does since
        // "net/mana: check vendor ID when probing RDMA device").
        let mut skipped = Vec::new();
        let mut chosen = None;
        let mut first_error = None;
        for (dev, port, netdev) in &candidates {
            // A candidate that cannot be opened (a sibling device this process may not use,
            // or one not back yet) does not fail the others.
            let opened = Context::open(dev).and_then(|ctx| {
                let attr = ctx.query_device_ex()?;
                Ok((ctx, attr))
            });
            let (ctx, attr) = match opened {
                Ok(x) => x,
                Err(e) => {
                    skipped.push(format!("{dev} ({e})"));
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            match not_raw_packet(&attr) {
                Some(why) => {
                    tracing::info!(target: "pmd::verbs", device = %dev, "skipping {dev}: {why}");
                    skipped.push(format!("{dev} ({why})"));
                }
                None if chosen.is_none() => {
                    chosen = Some((dev.clone(), *port, netdev.clone(), ctx, attr))
                }
                None => {
                    let (first, first_port) = chosen
                        .as_ref()
                        .map(|c| (c.0.clone(), c.1))
                        .unwrap_or_default();
                    tracing::warn!(
                        target: "pmd::verbs",
                        "{sel} matches more than one MANA port ({first} port {first_port}, {dev} port {port}, ...): using {first} port {first_port}; name it with dev= and port= to choose"
                    );
                }
            }
        }
        let Some((dev, port, netdev, ctx, attr)) = chosen else {
            // One candidate that failed to open: its own error, as before.
            if let (1, Some(e)) = (candidates.len(), first_error) {
                return Err(verbs(e));
            }
            return Err(SetupError::NoPort(format!(
                "{sel} matches no raw-packet MANA device: {} (these are RDMA devices; the \
                 function's raw-packet device is the one with vendor part id 2)",
                skipped.join(", ")
            )));
        };
        let mac = netdev.as_ref().and_then(|n| n.mac).ok_or_else(|| {
            SetupError::NoPort(format!(
                "{dev} port {port} has no netdev with a MAC address in sysfs; the MAC of a MANA \
                 port is its netdev's (check that the mana driver bound the interface)"
            ))
        })?;
        let o = &attr.orig_attr;
        let limits = Limits {
            max_wr: u32::try_from(o.max_qp_wr).unwrap_or(0),
            max_cqe: u32::try_from(o.max_cqe).unwrap_or(0),
            max_sge: u32::try_from(o.max_sge).unwrap_or(0),
            max_qp: u32::try_from(o.max_qp).unwrap_or(0),
            max_ind_table: attr.rss_caps.max_rwq_indirection_table_size,
            ports: o.phys_port_cnt,
        };
        let pattr = ctx
            .query_port(u8::try_from(port).unwrap_or(0))
            .map_err(verbs)?;
        let alloc = manadv::install_allocators(&ctx).map_err(verbs)?;
        let pd = Pd::alloc(&ctx).map_err(verbs)?;
        let domain = ParentDomain::alloc(&pd, port as usize).map_err(verbs)?;
        let events_live = match events::set_nonblocking(&ctx) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "pmd::verbs", device = %dev, port, "async event fd cannot be made non-blocking ({e}): the port reports no events");
                false
            }
        };
        tracing::info!(
            target: "pmd::verbs",
            device = %dev, port, mac = %mac,
            netdev = netdev.as_ref().map(|n| n.name.as_str()).unwrap_or("-"),
            max_wr = limits.max_wr, max_sge = limits.max_sge, max_qp = limits.max_qp,
            port_state = pattr.state,
            rdma_core = crate::sys::RDMA_CORE_VERSION,
            "MANA port opened"
        );
        Ok(Self {
            ctx,
            port,
            pd,
            domain,
            alloc,
            mac,
            netdev,
            limits,
            tx: Vec::new(),
            rx: None,
            objects: HashMap::new(),
            events_live,
            shared_rings: false,
        })
    }

    /// The device's limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The port's kernel netdev.
    pub fn netdev(&self) -> Option<&str> {
        self.netdev.as_ref().map(|n| n.name.as_str())
    }

    /// Queue buffers allocated and freed so far through the context's allocators.
    pub fn allocator_counts(&self) -> (u64, u64) {
        self.alloc.counts()
    }

    fn name(&self) -> String {
        format!("{} port {}", self.ctx.name(), self.port)
    }

    /// A raw QP refused because the kernel holds the vPort: `ENODEV` on released kernels
    /// (mana_ib turns any vPort configuration error into it), `EBUSY` on newer ones.
    fn busy_or(&self, e: VerbsError) -> SetupError {
        if matches!(e.errno(), libc::ENODEV | libc::EBUSY) {
            // Up now? (Not when the port opened: a take-over, or the admin, may have
            // changed it since.)
            match &self.netdev {
                Some(n)
                    if !crate::devices::netdev_up_now(self.ctx.name(), &n.name).unwrap_or(n.up) =>
                {
                    SetupError::port_busy_elsewhere(&n.name, e.errno())
                }
                _ => SetupError::port_busy(self.netdev(), e.errno()),
            }
        } else {
            verbs(e)
        }
    }

    fn check(&self, n: u16, nb_desc: u32) -> Result<(), SetupError> {
        let max = self.max_desc();
        if nb_desc > max {
            return Err(SetupError::Limit {
                what: "descriptors per queue",
                requested: nb_desc,
                max,
            });
        }
        if n > self.max_queues() {
            return Err(SetupError::Limit {
                what: "queues",
                requested: u32::from(n),
                max: u32::from(self.max_queues()),
            });
        }
        Ok(())
    }
}

/// `IBV_RX_HASH_*` for the fields of `rss`.
fn hash_fields(f: RssFields) -> u64 {
    use rdma_sys::ibv_rx_hash_fields as h;
    let mut m = 0u64;
    if f.contains(RssFields::IPV4) {
        m |= (h::IBV_RX_HASH_SRC_IPV4 | h::IBV_RX_HASH_DST_IPV4).0 as u64;
    }
    if f.contains(RssFields::IPV6) {
        m |= (h::IBV_RX_HASH_SRC_IPV6 | h::IBV_RX_HASH_DST_IPV6).0 as u64;
    }
    if f.contains(RssFields::TCP) {
        m |= (h::IBV_RX_HASH_SRC_PORT_TCP | h::IBV_RX_HASH_DST_PORT_TCP).0 as u64;
    }
    if f.contains(RssFields::UDP) {
        m |= (h::IBV_RX_HASH_SRC_PORT_UDP | h::IBV_RX_HASH_DST_PORT_UDP).0 as u64;
    }
    m
}

impl Provider for ManaProvider {
    fn set_allocator(&mut self, alloc: Arc<dyn QueueAllocator>) {
        self.shared_rings = alloc.is_shared();
        self.alloc.set_source(alloc);
    }

    fn device_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.ctx.cmd_fd())
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn link(&self) -> Link {
        // MANA reports no carrier through the netdev; the IB port state is what there is
        // (DPDK net/mana reports the link always up at 100G, spec §1.11).
        let up = self
            .ctx
            .query_port(u8::try_from(self.port).unwrap_or(0))
            .is_ok_and(|a| a.state == rdma_sys::ibv_port_state::IBV_PORT_ACTIVE);
        Link {
            up,
            speed_mbps: 100_000,
            full_duplex: true,
        }
    }

    fn max_queues(&self) -> u16 {
        let mut m = self.limits.max_qp.max(1);
        if self.limits.max_ind_table > 0 {
            m = m.min(self.limits.max_ind_table);
        }
        // A power of two: the indirection table holds the RX queues once each.
        let m = u16::try_from(m.min(64)).unwrap_or(64);
        1 << (15 - m.leading_zeros())
    }

    fn max_desc(&self) -> u32 {
        self.limits.max_wr.min(self.limits.max_cqe)
    }

    fn max_mtu(&self) -> Option<u16> {
        let max = super::netdev_max_mtu(&self.netdev.as_ref()?.name)?;
        Some(u16::try_from(max).unwrap_or(u16::MAX))
    }

    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError> {
        // On MANA the MTU is the kernel netdev's (spec §1.1): the device drops larger TX
        // frames. A smaller MTU for the port is the application's business.
        match self
            .netdev
            .as_ref()
            .and_then(|n| super::netdev_mtu(&n.name))
        {
            Some(cur) if u32::from(mtu) > cur => Err(SetupError::Limit {
                what: "mtu (the netdev's MTU; raise it with ip link set DEV mtu N)",
                requested: u32::from(mtu),
                max: cur,
            }),
            _ => Ok(()),
        }
    }

    fn fork_safe(&mut self) -> Result<(), SetupError> {
        super::fork_init().map(|_| ()).map_err(verbs)
    }

    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError> {
        let mr = Mr::register(&self.pd, chunk.addr, chunk.len).map_err(verbs)?;
        Ok(Registration::with_guard(mempool::Lkey(mr.lkey()), mr))
    }

    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawTxQueue>, SetupError> {
        self.check(n, nb_desc)?;
        let mut objs = Vec::new();
        for q in 0..n {
            let what = format!("tx queue {q} of {}", self.name());
            let cq = Cq::create(&self.ctx, nb_desc, format!("{what}: CQ")).map_err(verbs)?;
            let sge = (MAX_TX_SGES as u32).min(self.limits.max_sge.max(1));
            let qp = Qp::raw_packet(
                &(&self.domain).into(),
                &cq,
                nb_desc,
                sge,
                format!("{what}: QP"),
            )
            .map_err(|e| self.busy_or(e))?;
            self.objects.insert(cq.as_ptr() as usize, QueueRef::Tx(q));
            self.objects.insert(qp.as_ptr() as usize, QueueRef::Tx(q));
            objs.push((
                what,
                Arc::new(TxObjects {
                    qp,
                    cq,
                    parked: crate::ethdev::Parked::new(),
                }),
            ));
        }
        let mut out = Vec::new();
        for (what, o) in objs {
            let owner: QueueOwner = Arc::clone(&o) as QueueOwner;
            let m = manadv::init_tx(&o.qp, &o.cq, &owner, &what).map_err(verbs)?;
            out.push(RawTxQueue {
                sq: self.alloc.in_shared_file(m.sq, &owner),
                sq_id: m.sq_id,
                tx_vp_offset: m.tx_vp_offset,
                db_page: m.db_page,
                db_monitor: self.monitor(false, m.sq_id, &owner)?,
                cq: self.alloc.in_shared_file(m.cq, &owner),
                cq_count: m.cq_count,
                cq_id: m.cq_id,
                owner: Arc::clone(&owner),
                parked: Arc::clone(&o.parked),
                kick: self.kick(false, m.sq_id),
            });
            self.tx.push(owner);
        }
        Ok(out)
    }

    fn create_rx_queues(
        &mut self,
        n: u16,
        nb_desc: u32,
        rss: &RssConfig,
    ) -> Result<Vec<RawRxQueue>, SetupError> {
        self.check(n, nb_desc)?;
        if !n.is_power_of_two() {
            return Err(SetupError::Limit {
                what: "rx queues (a power of two: the indirection table holds each once)",
                requested: u32::from(n),
                max: u32::from(self.max_queues()),
            });
        }
        let mut wqs = Vec::new();
        for q in 0..n {
            let what = format!("rx queue {q} of {}", self.name());
            let cq = Cq::create(&self.ctx, nb_desc, format!("{what}: CQ")).map_err(verbs)?;
            let wq = Wq::create(
                &(&self.domain).into(),
                &cq,
                nb_desc,
                1,
                format!("{what}: WQ"),
            )
            .map_err(verbs)?;
            self.objects.insert(cq.as_ptr() as usize, QueueRef::Rx(q));
            self.objects.insert(wq.as_ptr() as usize, QueueRef::Rx(q));
            wqs.push((what, wq, cq));
        }
        let table = IndTable::create(&self.ctx, wqs.iter().map(|w| Arc::clone(&w.1)).collect())
            .map_err(verbs)?;
        let rss_qp = Qp::rss(
            &(&self.domain).into(),
            &table,
            &rss.key,
            hash_fields(rss.fields),
            format!("RSS QP of {}", self.name()),
        )
        .map_err(|e| self.busy_or(e))?;
        self.objects
            .insert(rss_qp.as_ptr() as usize, QueueRef::RxAll);
        let parked = crate::ethdev::Parked::new();
        let owner: QueueOwner = Arc::new(RxObjects {
            _rss: rss_qp,
            _parked: Arc::clone(&parked),
        });
        let mut out = Vec::new();
        for (what, wq, cq) in &wqs {
            let m = manadv::init_rx(wq, cq, &owner, what).map_err(verbs)?;
            out.push(RawRxQueue {
                rq: self.alloc.in_shared_file(m.rq, &owner),
                rq_id: m.rq_id,
                db_page: m.db_page,
                db_monitor: self.monitor(true, m.rq_id, &owner)?,
                cq: self.alloc.in_shared_file(m.cq, &owner),
                cq_count: m.cq_count,
                cq_id: m.cq_id,
                owner: Arc::clone(&owner),
                parked: Arc::clone(&parked),
                kick: self.kick(true, m.rq_id),
            });
        }
        self.rx = Some(owner);
        Ok(out)
    }

    fn destroy_queues(&mut self) {
        self.tx.clear();
        self.rx = None;
        self.objects.clear();
    }

    fn event_fd(&self) -> Option<RawFd> {
        self.events_live.then(|| self.ctx.async_fd())
    }

    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        let name = self.name();
        let objects = &self.objects;
        events::drain(
            &self.ctx,
            self.port,
            &name,
            &mut self.events_live,
            |a| objects.get(&a).copied(),
            out,
        );
    }
}

impl Drop for ManaProvider {
    fn drop(&mut self) {
        self.destroy_queues();
        let (a, f) = self.alloc.counts();
        let n = self.alloc.null_frees();
        tracing::debug!(target: "pmd::verbs", port = %self.name(), allocs = a, frees = f, null_frees = n, "queue-buffer allocator at close (queues still held by the datapath free later)");
    }
}
