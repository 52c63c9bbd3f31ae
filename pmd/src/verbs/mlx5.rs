//! The mlx5 provider over rdma-core: `mlx5:` ports on a ConnectX (or on the fake rdma-core
//! of the tests).
//!
//! Bring-up, in DPDK net/mlx5's Verbs order (spec mlx5.md §1): open the device of the port
//! and check that libmlx5 drives it (`mlx5dv_is_supported`); install the queue-buffer
//! allocators with `mlx5dv_set_context_attr` before any queue exists; query the device
//! (`ibv_query_device_ex`, `mlx5dv_query_device`) and the port; a PD; register the pool's
//! chunks on it.
//! * TX, per queue: a CQ of exactly `nb_desc` entries (rdma-core rounds `n + 1` up to a
//!   power of two, so `nb_desc - 1` is asked, §1.4), a raw-packet QP through
//!   `ibv_create_qp_ex` with one SGE and, when the device does TSO, room for a TSO header;
//!   RESET→INIT(port)→RTR→RTS; `mlx5dv_init_obj(QP | CQ)`.
//! * RX, per queue: a CQ (compressed with HASH mini CQEs when the device supports it,
//!   through `mlx5dv_create_cq`, §1.4), a WQ of `nb_desc` one-SGE WQEs, RDY,
//!   `mlx5dv_init_obj(RWQ | CQ)`; then the indirection table, one hashing QP per traffic
//!   type of the port's RSS configuration (Toeplitz under its key; `hash_qps`: a TIR hashes
//!   one family and one L4 protocol) and their steering rules: the port's MAC and
//!   broadcast, or everything in promiscuous mode, each also matching its QP's type
//!   (§1.6 B).
//!
//! Why context allocators (`mlx5dv_set_context_attr`) and not parent-domain allocators:
//! the context's cover every object rdma-core allocates for a queue (QP, CQ and WQ buffers
//! and doorbell records), whichever call creates it, while a parent domain's reach CQs only
//! when they are created through `ibv_create_cq_ex` on that domain and must answer per
//! resource type; the MANA provider uses the same mechanism, so both share [`Allocators`].
//!
//! The minimum inline header is not exported by rdma-core (§1.9): it is 18 bytes on
//! ConnectX-4 and ConnectX-4 Lx (by PCI device id, as DPDK decides without DevX) and none
//! on later devices; `inline=N` raises it. eMPW is used where `mlx5dv_query_device` reports
//! enhanced MPW and no inline header is needed.
//!
//! The port's netdev keeps running beside us (mlx5 is a bifurcated driver: our steering
//! rules take the frames they match), so there is nothing to take over; the MTU is the
//! netdev's.
#![deny(unsafe_code)]

use super::alloc::Allocators;
use super::events;
use super::mlx5dv::{self, DvCaps};
use super::objects::{Context, Cq, Domain, Flow, FlowMatch, FlowProto, IndTable, Mr, Pd, Qp, Wq};
use super::VerbsError;
use crate::devices::{self, resolve_port, sysfs_root, Family, PortSelector};
use crate::ethdev::{Link, PortEvent, QueueOwner, QueueRef, RssFields};
use crate::mlx5::{Provider, QueueState, RawRq, RawSq, RxQueueRequest, SetupError};
use crate::net::MacAddr;
use mempool::{ChunkInfo, Registration};
use rdma_sys::{ibv_qp_state, ibv_wq_state};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Bytes of TSO header room asked for on each send QP (DPDK's `MLX5_MAX_TSO_HEADER`).
const MAX_TSO_HEADER: u16 = 192;
/// Minimum inline header of ConnectX-4 and ConnectX-4 Lx (L2 with one VLAN tag, §1.9).
const CX4_MIN_INLINE: u16 = 18;
/// `IBV_LINK_LAYER_ETHERNET` (verbs.h; an anonymous enum rdma-sys leaves out).
const LINK_LAYER_ETHERNET: u8 = 2;
/// Broadcast MAC.
const BROADCAST: [u8; 6] = [0xff; 6];

/// The device's limits, from `ibv_query_device_ex` and `mlx5dv_query_device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most WQEs per queue (`max_qp_wr`).
    pub max_wr: u32,
    /// Most CQEs per CQ.
    pub max_cqe: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Largest indirection table (0: not reported).
    pub max_ind_table: u32,
    /// Largest TSO payload (0: no TSO).
    pub max_tso: u32,
    /// PCI device id (`vendor_part_id`).
    pub part_id: u32,
}

/// Options of an `mlx5:` port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Inline at least this many bytes of each frame (raises the device's minimum).
    pub min_inline: Option<u16>,
}

/// One TX queue's objects: what its handle keeps alive.
struct TxObjects {
    qp: Arc<Qp>,
    _cq: Arc<Cq>,
    /// After the QP and CQ (the queue's recovery holds the QP too, and drops it before its
    /// own handle on this): the frames the queue left in flight.
    parked: Arc<crate::ethdev::Parked>,
}

/// The RX side: rules, then the hashing QPs (which hold the tables, the WQs and their CQs).
struct RxObjects {
    _flows: Vec<Flow>,
    _hash: Vec<Arc<Qp>>,
    /// After the QPs (and with them the tables and the WQs no queue holds): the buffers the
    /// queues left.
    _parked: Arc<crate::ethdev::Parked>,
}

/// A send QP's state machine, for the TX queue's error recovery (spec §1.5): RESET, then
/// INIT (with the port), RTR and RTS, as DPDK's Verbs path does.
struct QpState {
    qp: Arc<Qp>,
    port: u8,
}

impl QueueState for QpState {
    fn reset(&self) -> Result<(), SetupError> {
        self.qp
            .modify_state(ibv_qp_state::IBV_QPS_RESET, self.port)
            .map_err(verbs)
    }

    fn ready(&self) -> Result<(), SetupError> {
        to_rts(&self.qp, self.port)
    }
}

/// A WQ's state machine, for the RX queue's error recovery: RESET, then RDY.
struct WqState {
    wq: Arc<Wq>,
}

impl QueueState for WqState {
    fn reset(&self) -> Result<(), SetupError> {
        self.wq
            .modify_state(ibv_wq_state::IBV_WQS_RESET)
            .map_err(verbs)
    }

    fn ready(&self) -> Result<(), SetupError> {
        self.wq
            .modify_state(ibv_wq_state::IBV_WQS_RDY)
            .map_err(verbs)
    }
}

/// RESET→INIT(port)→RTR→RTS.
fn to_rts(qp: &Qp, port: u8) -> Result<(), SetupError> {
    for s in [
        ibv_qp_state::IBV_QPS_INIT,
        ibv_qp_state::IBV_QPS_RTR,
        ibv_qp_state::IBV_QPS_RTS,
    ] {
        qp.modify_state(s, port).map_err(verbs)?;
    }
    Ok(())
}

/// An mlx5 port over rdma-core.
pub struct Mlx5Provider {
    ctx: Arc<Context>,
    port: u8,
    pd: Arc<Pd>,
    alloc: Arc<Allocators>,
    mac: MacAddr,
    netdev: Option<devices::Netdev>,
    limits: Limits,
    dv: DvCaps,
    min_inline: u16,
    tx: Vec<QueueOwner>,
    rx: Option<QueueOwner>,
    objects: HashMap<usize, QueueRef>,
    events_live: bool,
    /// Queue memory comes from shared files (the port exports queue pairs).
    shared_rings: bool,
}

impl std::fmt::Debug for Mlx5Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mlx5Provider({} port {})", self.ctx.name(), self.port)
    }
}

fn verbs(e: VerbsError) -> SetupError {
    SetupError::Device(Box::new(e))
}

/// The minimum inline header of the device with PCI id `part_id` (spec §1.9).
pub fn min_inline_for(part_id: u32) -> u16 {
    match part_id {
        // ConnectX-4, its VF, ConnectX-4 Lx, its VF.
        0x1013..=0x1016 => CX4_MIN_INLINE,
        _ => 0,
    }
}

impl Mlx5Provider {
    /// Opens the port `sel` names: the device context, its allocators and a PD.
    ///
    /// # Errors
    /// No such port, the device is not an mlx5 one, or a verbs call failed (everything
    /// opened so far is closed again).
    pub fn open(sel: &PortSelector, opts: Options) -> Result<Self, SetupError> {
        let (dev, port, netdev) =
            resolve_port(&sysfs_root(), Family::Mlx5, sel).map_err(SetupError::NoPort)?;
        let mac = netdev.as_ref().and_then(|n| n.mac).ok_or_else(|| {
            SetupError::NoPort(format!(
                "{dev} port {port} has no netdev with a MAC address in sysfs; the MAC of an \
                 mlx5 port is its netdev's (check that mlx5_core bound the interface)"
            ))
        })?;
        let port =
            u8::try_from(port).map_err(|_| SetupError::NoPort(format!("{dev}: port {port}")))?;
        let ctx = Context::open(&dev).map_err(verbs)?;
        if !mlx5dv::is_supported(&ctx) {
            return Err(SetupError::NoPort(format!(
                "{dev} is not driven by libmlx5 (mlx5dv_is_supported says no): install \
                 rdma-core's mlx5 provider (ibverbs-providers)"
            )));
        }
        let attr = ctx.query_device_ex().map_err(verbs)?;
        let o = &attr.orig_attr;
        let limits = Limits {
            max_wr: u32::try_from(o.max_qp_wr).unwrap_or(0),
            max_cqe: u32::try_from(o.max_cqe).unwrap_or(0),
            max_qp: u32::try_from(o.max_qp).unwrap_or(0),
            max_ind_table: attr.rss_caps.max_rwq_indirection_table_size,
            max_tso: attr.tso_caps.max_tso,
            part_id: o.vendor_part_id,
        };
        let dv = mlx5dv::query(&ctx).map_err(verbs)?;
        let pattr = ctx.query_port(port).map_err(verbs)?;
        if pattr.link_layer != LINK_LAYER_ETHERNET {
            return Err(SetupError::NoPort(format!(
                "{dev} port {port} is not an Ethernet port (link layer {}); raw-packet queues \
                 need a ConnectX port in Ethernet mode (mlxconfig LINK_TYPE_P1=2)",
                pattr.link_layer
            )));
        }
        let alloc = mlx5dv::install_allocators(&ctx).map_err(verbs)?;
        let pd = Pd::alloc(&ctx).map_err(verbs)?;
        let events_live = match events::set_nonblocking(&ctx) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(target: "pmd::verbs", device = %dev, port, "async event fd cannot be made non-blocking ({e}): the port reports no events");
                false
            }
        };
        let min_inline = min_inline_for(limits.part_id).max(opts.min_inline.unwrap_or(0));
        tracing::info!(
            target: "pmd::verbs",
            device = %dev, port, mac = %mac,
            netdev = netdev.as_ref().map(|n| n.name.as_str()).unwrap_or("-"),
            part_id = format_args!("{:#06x}", limits.part_id),
            max_wr = limits.max_wr, max_qp = limits.max_qp, max_tso = limits.max_tso,
            empw = dv.enhanced_mpw, cqe_comp_max = dv.cqe_comp_max,
            min_inline, port_state = pattr.state,
            rdma_core = crate::sys::RDMA_CORE_VERSION,
            "mlx5 port opened"
        );
        Ok(Self {
            ctx,
            port,
            pd,
            alloc,
            mac,
            netdev,
            limits,
            dv,
            min_inline,
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

    /// What `mlx5dv_query_device` reported.
    pub fn dv_caps(&self) -> DvCaps {
        self.dv
    }

    /// The bytes each frame carries inline.
    pub fn min_inline(&self) -> u16 {
        self.min_inline
    }

    /// Queue buffers allocated and freed so far through the context's allocators.
    pub fn allocator_counts(&self) -> (u64, u64) {
        self.alloc.counts()
    }

    /// The fake rdma-core's inline model for a queue (`Context::fake_kick`), unless the
    /// rings are shared with another process, which the model's own thread must serve.
    fn kick(&self, is_rx: bool, queue_id: u32) -> crate::ethdev::Kick {
        if self.shared_rings {
            None
        } else {
            self.ctx.fake_kick(is_rx, queue_id)
        }
    }

    /// `cq` with its ring and record named by the shared files they live in.
    fn shared_cq(&self, cq: crate::mlx5::RawCq, owner: &QueueOwner) -> crate::mlx5::RawCq {
        crate::mlx5::RawCq {
            buf: self.alloc.in_shared_file(cq.buf, owner),
            dbrec: self.alloc.in_shared_file(cq.dbrec, owner),
            ..cq
        }
    }

    fn name(&self) -> String {
        format!("{} port {}", self.ctx.name(), self.port)
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

    /// Whether the device compresses receive CQEs with HASH mini CQEs.
    fn can_compress(&self) -> bool {
        self.dv.cqe_comp_max >= 2
            && self.dv.cqe_comp_formats & crate::sys::dv::MLX5DV_CQE_RES_FORMAT_HASH != 0
    }

    /// The steering rules of the RX side: everything, or the port's MAC and broadcast.
    fn rules(&self, promiscuous: bool) -> Vec<FlowMatch> {
        if promiscuous {
            return vec![FlowMatch::Dst {
                mac: [0; 6],
                mask: [0; 6],
            }];
        }
        vec![
            FlowMatch::Dst {
                mac: self.mac.0,
                mask: BROADCAST,
            },
            FlowMatch::Dst {
                mac: BROADCAST,
                mask: BROADCAST,
            },
        ]
    }
}

/// One hashing QP of a port: the traffic type its rules match, the `IBV_RX_HASH_*` fields
/// it hashes, and the rule priority (more specific types first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HashQp {
    proto: FlowProto,
    fields: u64,
    priority: u16,
}

/// The hashing QPs for `rss`, most specific first. A TIR hashes one L3 family and at most one
/// L4 protocol (kernel `create_rss_raw_qp_tir`: IPv4 with IPv6 fields, or TCP with UDP
/// ports, is `EINVAL`; spec §1.6 B), so a port asking for several gets one QP per (family,
/// protocol) pair and one per family alone, each fed by rules matching only its type, as
/// DPDK's mlx5 PMD expands its RSS flows and the kernel's own netdev programs one indirect
/// TIR per traffic type. The last QP hashes nothing and takes every other frame (non-IP, or
/// a family not asked for): with no fields the kernel allows only a one-entry table, so it
/// sends them all to the first queue.
fn hash_qps(f: RssFields) -> Vec<HashQp> {
    use rdma_sys::ibv_rx_hash_fields as h;
    let mut out = Vec::new();
    let families = [
        (
            RssFields::IPV4,
            false,
            (h::IBV_RX_HASH_SRC_IPV4 | h::IBV_RX_HASH_DST_IPV4).0 as u64,
        ),
        (
            RssFields::IPV6,
            true,
            (h::IBV_RX_HASH_SRC_IPV6 | h::IBV_RX_HASH_DST_IPV6).0 as u64,
        ),
    ];
    let protocols = [
        (
            RssFields::TCP,
            6,
            (h::IBV_RX_HASH_SRC_PORT_TCP | h::IBV_RX_HASH_DST_PORT_TCP).0 as u64,
        ),
        (
            RssFields::UDP,
            17,
            (h::IBV_RX_HASH_SRC_PORT_UDP | h::IBV_RX_HASH_DST_PORT_UDP).0 as u64,
        ),
    ];
    for (family, ipv6, ip) in families {
        if !f.contains(family) {
            continue;
        }
        for (proto, l4, ports) in protocols {
            if f.contains(proto) {
                out.push(HashQp {
                    proto: FlowProto {
                        ipv6: Some(ipv6),
                        l4: Some(l4),
                    },
                    fields: ip | ports,
                    priority: 0,
                });
            }
        }
        out.push(HashQp {
            proto: FlowProto {
                ipv6: Some(ipv6),
                l4: None,
            },
            fields: ip,
            priority: 1,
        });
    }
    out.push(HashQp {
        proto: FlowProto::default(),
        fields: 0,
        priority: 2,
    });
    out
}

/// Link speed in Mb/s from the IB port's active width and speed codes (`ibv_port_attr`).
fn speed_mbps(width: u8, speed: u8) -> u32 {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    let lane = match speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => 0,
    };
    lanes * lane
}

impl Provider for Mlx5Provider {
    fn set_allocator(&mut self, alloc: Arc<dyn crate::sys::mem::QueueAllocator>) {
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
        match self.ctx.query_port(self.port) {
            Ok(a) => Link {
                up: a.state == rdma_sys::ibv_port_state::IBV_PORT_ACTIVE,
                speed_mbps: speed_mbps(a.active_width, a.active_speed),
                full_duplex: true,
            },
            Err(_) => Link {
                up: false,
                speed_mbps: 0,
                full_duplex: true,
            },
        }
    }

    fn max_queues(&self) -> u16 {
        let mut m = self.limits.max_qp.max(1);
        if self.limits.max_ind_table > 0 {
            m = m.min(self.limits.max_ind_table);
        }
        let m = u16::try_from(m.min(64)).unwrap_or(64);
        1 << (15 - m.leading_zeros())
    }

    fn max_desc(&self) -> u32 {
        self.limits.max_wr.min(self.limits.max_cqe)
    }

    fn promiscuous(&self) -> bool {
        true
    }

    fn max_mtu(&self) -> Option<u16> {
        let max = super::netdev_max_mtu(&self.netdev.as_ref()?.name)?;
        Some(u16::try_from(max).unwrap_or(u16::MAX))
    }

    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError> {
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

    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError> {
        let mr = Mr::register(&self.pd, chunk.addr, chunk.len).map_err(verbs)?;
        Ok(Registration::with_guard(mempool::Lkey(mr.lkey()), mr))
    }

    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawSq>, SetupError> {
        self.check(n, nb_desc)?;
        let domain = Domain::from(&self.pd);
        let tso = if self.limits.max_tso > 0 {
            MAX_TSO_HEADER
        } else {
            0
        };
        let mut out = Vec::new();
        for q in 0..n {
            let what = format!("tx queue {q} of {}", self.name());
            let cq = Cq::create(
                &self.ctx,
                nb_desc.saturating_sub(1).max(1),
                format!("{what}: CQ"),
            )
            .map_err(verbs)?;
            let qp = Qp::raw_packet_ex(&domain, &cq, nb_desc, 1, tso, format!("{what}: QP"))
                .map_err(verbs)?;
            to_rts(&qp, self.port)?;
            self.objects.insert(cq.as_ptr() as usize, QueueRef::Tx(q));
            self.objects.insert(qp.as_ptr() as usize, QueueRef::Tx(q));
            let objs = Arc::new(TxObjects {
                qp: Arc::clone(&qp),
                _cq: Arc::clone(&cq),
                parked: crate::ethdev::Parked::new(),
            });
            let owner: QueueOwner = Arc::clone(&objs) as QueueOwner;
            let m = mlx5dv::init_sq(&objs.qp, &cq, &owner, &what).map_err(verbs)?;
            out.push(RawSq {
                buf: self.alloc.in_shared_file(m.buf, &owner),
                wqe_cnt: m.wqe_cnt,
                sqn: m.sqn,
                dbrec: self.alloc.in_shared_file(m.dbrec, &owner),
                bf_reg: crate::sys::Mmio::new(m.bf_reg),
                bf_size: m.bf_size,
                min_inline: self.min_inline,
                cq: self.shared_cq(m.cq, &owner),
                owner: Arc::clone(&owner),
                parked: Arc::clone(&objs.parked),
                kick: self.kick(false, qp.number()),
                state: Arc::new(QpState {
                    qp,
                    port: self.port,
                }),
            });
            self.tx.push(owner);
        }
        Ok(out)
    }

    fn create_rx_queues(&mut self, req: &RxQueueRequest) -> Result<Vec<RawRq>, SetupError> {
        let (n, nb_desc, rss) = (req.n, req.nb_desc, &req.rss);
        if req.mprq.is_some() {
            // Striding WQs (mlx5dv_create_wq with striding_rq_attrs) are not created here
            // yet; `mprq_caps` says None, so the driver does not ask.
            return Err(SetupError::Unsupported {
                what: "a multi-packet (striding) RQ",
                why: "the rdma-core provider creates cyclic WQs only; use mprq=0".into(),
            });
        }
        self.check(n, nb_desc)?;
        if !n.is_power_of_two() {
            return Err(SetupError::Limit {
                what: "rx queues (a power of two: the indirection table holds each once)",
                requested: u32::from(n),
                max: u32::from(self.max_queues()),
            });
        }
        let domain = Domain::from(&self.pd);
        // Compressed as the driver asks, where the device can (HASH minis, §1.4).
        let compress = req.cqe_compression && self.can_compress();
        // With compression a CQE slot may hold mini CQEs of several packets, but a session
        // is written only when the device has room: twice the ring, as DPDK's scalar path
        // sizes it (§1.4).
        let cqe = if compress { nb_desc * 2 } else { nb_desc };
        let mut queues = Vec::new();
        for q in 0..n {
            let what = format!("rx queue {q} of {}", self.name());
            let cq = mlx5dv::create_cq(
                &self.ctx,
                cqe.saturating_sub(1).max(1),
                compress,
                format!("{what}: CQ"),
            )
            .map_err(verbs)?;
            let wq = Wq::create(&domain, &cq, nb_desc, 1, format!("{what}: WQ")).map_err(verbs)?;
            wq.modify_state(ibv_wq_state::IBV_WQS_RDY).map_err(verbs)?;
            self.objects.insert(cq.as_ptr() as usize, QueueRef::Rx(q));
            self.objects.insert(wq.as_ptr() as usize, QueueRef::Rx(q));
            queues.push((what, wq, cq));
        }
        let table = IndTable::create(&self.ctx, queues.iter().map(|w| Arc::clone(&w.1)).collect())
            .map_err(verbs)?;
        // The QP that hashes nothing needs a one-entry table: the first queue.
        let first = IndTable::create(&self.ctx, vec![Arc::clone(&queues[0].1)]).map_err(verbs)?;
        let mut hash = Vec::new();
        let mut flows = Vec::new();
        for q in hash_qps(rss.fields) {
            let qp = Qp::rss(
                &domain,
                if q.fields == 0 { &first } else { &table },
                &rss.key,
                q.fields,
                format!("hashing QP {:#x} of {}", q.fields, self.name()),
            )
            .map_err(verbs)?;
            self.objects.insert(qp.as_ptr() as usize, QueueRef::RxAll);
            for m in self.rules(req.promiscuous) {
                flows.push(Flow::new(&qp, self.port, m, q.proto, q.priority).map_err(verbs)?);
            }
            hash.push(qp);
        }
        // Rules first, then their QPs (a QP with rules is busy).
        let parked = crate::ethdev::Parked::new();
        let owner: QueueOwner = Arc::new(RxObjects {
            _flows: flows,
            _hash: hash,
            _parked: Arc::clone(&parked),
        });
        let mut out = Vec::new();
        for (what, wq, cq) in &queues {
            let m = mlx5dv::init_rq(wq, cq, &owner, what).map_err(verbs)?;
            out.push(RawRq {
                buf: self.alloc.in_shared_file(m.buf, &owner),
                wqe_cnt: m.wqe_cnt,
                stride: m.stride,
                rqn: wq.number(),
                dbrec: self.alloc.in_shared_file(m.dbrec, &owner),
                cq: self.shared_cq(m.cq, &owner),
                mprq: None,
                cqe_compression: compress,
                owner: Arc::clone(&owner),
                parked: Arc::clone(&parked),
                state: Arc::new(WqState { wq: Arc::clone(wq) }),
                kick: self.kick(true, wq.number()),
            });
        }
        tracing::debug!(target: "pmd::verbs", port = %self.name(), queues = n, compress, promiscuous = req.promiscuous, "rx queues steered");
        self.rx = Some(owner);
        Ok(out)
    }

    fn destroy_queues(&mut self) {
        self.tx.clear();
        self.rx = None;
        self.objects.clear();
    }

    fn xstats(&self) -> Vec<crate::ethdev::Xstat> {
        Vec::new()
    }

    fn event_fd(&self) -> Option<RawFd> {
        self.events_live.then(|| self.ctx.async_fd())
    }

    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        let name = self.name();
        let objects = &self.objects;
        events::drain(
            &self.ctx,
            u32::from(self.port),
            &name,
            &mut self.events_live,
            |a| objects.get(&a).copied(),
            out,
        );
    }
}

impl Drop for Mlx5Provider {
    fn drop(&mut self) {
        self.destroy_queues();
        let (a, f) = self.alloc.counts();
        let n = self.alloc.null_frees();
        tracing::debug!(target: "pmd::verbs", port = %self.name(), allocs = a, frees = f, null_frees = n, "queue-buffer allocator at close (queues still held by the datapath free later)");
    }
}
