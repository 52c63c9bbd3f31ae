//! The mlx5 device model as an [`mlx5::Provider`](crate::mlx5::Provider): what an
//! `emu-mlx5:wire=...` port runs on. Queues come from [`Model`] (memory it allocates as
//! rdma-core would), one CQ per queue, RSS over the RX queues in order; each queue's state
//! machine for error recovery is a [`ModelQueueState`] on the model's handle.
#![deny(unsafe_code)]

use super::{Model, ModelError, ModelHandle, RxHashFields, MPRQ_CAPS};
use crate::emu::events::{LinkEvents, LINK_POLL};
use crate::emu::thread::EngineMode;
use crate::emu::wire::{self, WireSpec};
use crate::ethdev::{Link, RssFields};
use crate::ethdev::{Loss, Xstat};
use crate::mlx5::{MprqCaps, Provider, QueueState, RawRq, RawSq, RxQueueRequest, SetupError};
use crate::net::MacAddr;
use crate::sys::DevMem;
use mempool::{ChunkInfo, Registration};
use std::sync::Arc;

/// Queue limit of the model port.
pub const PORT_MAX_QUEUES: u16 = 16;
/// Descriptor limit of the model port.
pub const PORT_MAX_DESC: u32 = 8192;
/// Most completions in one compressed session (the model's `cqe_comp_caps.max_num`, §1.2).
pub const PORT_CQE_COMP_MAX: u32 = 64;

/// An mlx5 model port.
pub struct ModelPort {
    model: Model,
    /// Link changes, as the port's asynchronous events (`IBV_EVENT_PORT_ERR` /
    /// `IBV_EVENT_PORT_ACTIVE` on hardware): the far end of the wire attaching or going
    /// away, the link-down fault. The engine looks every [`LINK_POLL`].
    events: Arc<LinkEvents>,
    mac: MacAddr,
    sqs: Vec<u32>,
    rqs: Vec<u32>,
    /// The RX queues' parked buffers, kept until the model no longer serves their RQs
    /// (`destroy_queues`, or the model dropped: last field).
    rx_parked: Option<Arc<crate::ethdev::Parked>>,
    /// The same for the TX queues' frames in flight.
    tx_parked: Option<Arc<crate::ethdev::Parked>>,
}

impl std::fmt::Debug for ModelPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "emu::mlx5::ModelPort({}, {:?})", self.mac, self.model)
    }
}

fn dev(e: ModelError) -> SetupError {
    SetupError::Device(Box::new(e))
}

impl ModelPort {
    /// A model port on `wire` (and a capture to `pcap`), as port `port_id`, whose device needs
    /// `min_inline` bytes inline (0: ConnectX-5 and later; 18: ConnectX-4), its engine run as
    /// `engine` says (its own thread, or inline on the polling threads).
    ///
    /// # Errors
    /// The wire or the capture cannot be opened, or the engine thread cannot start.
    pub fn open(
        wire_spec: &WireSpec,
        mac: Option<MacAddr>,
        pcap: Option<&std::path::Path>,
        port_id: u16,
        min_inline: u16,
        engine: EngineMode,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let mut w = wire::open(wire_spec)?;
        if let Some(p) = pcap {
            w = Box::new(wire::PcapTap::new(w, p)?);
        }
        let model = Model::with_mode(w, min_inline, port_id, engine)?;
        let mac = mac.unwrap_or_else(|| crate::emu::default_mac(0x6d, port_id));
        let events = Arc::new(LinkEvents::new(model.core.lock().link_up(), port_id));
        let watched = Arc::downgrade(&events);
        model.core.set_watch(
            LINK_POLL,
            Box::new(move |e: &super::Engine| {
                if let Some(ev) = watched.upgrade() {
                    ev.note(e.link_up());
                    ev.note_capture(e.capture_error());
                }
            }),
        );
        Ok(Self {
            model,
            events,
            mac,
            sqs: Vec::new(),
            rqs: Vec::new(),
            rx_parked: None,
            tx_parked: None,
        })
    }

    /// A handle to step the model, inject faults and read its counters.
    pub fn handle(&self) -> ModelHandle {
        self.model.handle()
    }
}

fn hash_fields(f: RssFields) -> RxHashFields {
    let mut h = RxHashFields::empty();
    if f.contains(RssFields::IPV4) {
        h |= RxHashFields::SRC_IPV4 | RxHashFields::DST_IPV4;
    }
    if f.contains(RssFields::IPV6) {
        h |= RxHashFields::SRC_IPV6 | RxHashFields::DST_IPV6;
    }
    if f.contains(RssFields::TCP) {
        h |= RxHashFields::SRC_PORT_TCP | RxHashFields::DST_PORT_TCP;
    }
    if f.contains(RssFields::UDP) {
        h |= RxHashFields::SRC_PORT_UDP | RxHashFields::DST_PORT_UDP;
    }
    h
}

/// A model queue's state machine, as a queue handle moves it for error recovery (what
/// `ibv_modify_qp` / `ibv_modify_wq` do on hardware): through the model handle, so from any
/// thread. When a call returns, the engine is between two passes and already sees the new
/// state.
pub struct ModelQueueState {
    handle: ModelHandle,
    queue: Queue,
}

#[derive(Debug, Clone, Copy)]
enum Queue {
    Sq(u32),
    Rq(u32),
}

impl ModelQueueState {
    /// The state machine of SQ (raw QP) `sqn`.
    pub fn sq(handle: ModelHandle, sqn: u32) -> Self {
        Self {
            handle,
            queue: Queue::Sq(sqn),
        }
    }

    /// The state machine of RQ (WQ) `rqn`.
    pub fn rq(handle: ModelHandle, rqn: u32) -> Self {
        Self {
            handle,
            queue: Queue::Rq(rqn),
        }
    }
}

impl std::fmt::Debug for ModelQueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelQueueState({:?})", self.queue)
    }
}

impl QueueState for ModelQueueState {
    fn reset(&self) -> Result<(), SetupError> {
        let mut e = self.handle.engine();
        let r = match self.queue {
            Queue::Sq(n) => e.sq_to_reset(n),
            Queue::Rq(n) => e.rq_to_reset(n),
        };
        r.map_err(|e| dev(e.into()))
    }

    fn ready(&self) -> Result<(), SetupError> {
        let mut e = self.handle.engine();
        let r = match self.queue {
            Queue::Sq(n) => e.sq_to_rts(n),
            Queue::Rq(n) => e.rq_to_rdy(n),
        };
        r.map_err(|e| dev(e.into()))
    }
}

impl Provider for ModelPort {
    fn set_allocator(&mut self, alloc: Arc<dyn crate::sys::mem::QueueAllocator>) {
        self.model.set_allocator(alloc);
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn link(&self) -> Link {
        let up = self.model.handle().engine().link_up();
        // Whoever asks sees the same state the port's events report.
        self.events.note(up);
        Link {
            up,
            speed_mbps: 100_000,
            full_duplex: true,
        }
    }

    fn max_queues(&self) -> u16 {
        PORT_MAX_QUEUES
    }

    fn max_desc(&self) -> u32 {
        PORT_MAX_DESC
    }

    fn promiscuous(&self) -> bool {
        // The model takes every frame off its wire (no steering rules).
        true
    }

    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError> {
        self.model.set_mtu(mtu);
        Ok(())
    }

    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError> {
        // The model is the DMA device: it reads and writes the application's buffers.
        #[allow(unsafe_code)]
        // SAFETY: the view goes into the engine's memory-region table only, and the guard
        // returned below (which mempool drops before unmapping the chunk) removes it; the
        // engine touches the bytes only for posted RX buffers and in-flight TX frames.
        let mem = Arc::new(unsafe { DevMem::for_registered_chunk(chunk) });
        let lkey = self.model.reg_mr(&mem).map_err(dev)?;
        Ok(Registration::with_guard(
            mempool::Lkey(lkey),
            self.model.handle().mr_guard(lkey),
        ))
    }

    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawSq>, SetupError> {
        let mut out = Vec::new();
        for _ in 0..n {
            let cq = self.model.create_cq(nb_desc).map_err(dev)?;
            let mut sq = self.model.create_sq(nb_desc, &cq).map_err(dev)?;
            sq.parked = Arc::clone(
                self.tx_parked
                    .get_or_insert_with(crate::ethdev::Parked::new),
            );
            self.sqs.push(sq.sqn);
            out.push(sq);
        }
        Ok(out)
    }

    fn create_rx_queues(&mut self, req: &RxQueueRequest) -> Result<Vec<RawRq>, SetupError> {
        // One completion per packet the ring holds, twice that when compressed (§1.4, §4.2).
        let (wqes, per_wqe) = match req.mprq {
            Some(m) => {
                if !MPRQ_CAPS.allows(m) {
                    return Err(SetupError::Unsupported {
                        what: "this striding RQ geometry",
                        why: format!(
                            "2^{} strides of 2^{} bytes: the model takes {MPRQ_CAPS:?}",
                            m.log_strides, m.log_stride_bytes
                        ),
                    });
                }
                ((req.nb_desc >> m.log_strides).max(1), m.strides())
            }
            None => (req.nb_desc, 1),
        };
        let wqes = wqes.checked_next_power_of_two().unwrap_or(u32::MAX);
        let cqes = wqes
            .saturating_mul(per_wqe)
            .saturating_mul(if req.cqe_compression { 2 } else { 1 });
        let mut out = Vec::new();
        let parked = crate::ethdev::Parked::new();
        for _ in 0..req.n {
            let cq = self.model.create_cq(cqes - 1).map_err(dev)?;
            let mut rq = match req.mprq {
                Some(m) => self.model.create_mprq(wqes, m, &cq, false),
                None => self.model.create_rq(wqes, 1, &cq, false),
            }
            .map_err(dev)?;
            self.rqs.push(rq.rqn);
            rq.parked = Arc::clone(&parked);
            if req.cqe_compression {
                self.model
                    .set_rx_compression(rq.rqn, Some(PORT_CQE_COMP_MAX))
                    .map_err(dev)?;
                rq.cqe_compression = true;
            }
            out.push(rq);
        }
        self.rx_parked = Some(parked);
        let table: Vec<u32> = out.iter().map(|q| q.rqn).collect();
        self.model
            .set_rss(req.rss.key, hash_fields(req.rss.fields), &table)
            .map_err(dev)?;
        Ok(out)
    }

    fn mprq_caps(&self) -> Option<MprqCaps> {
        Some(MPRQ_CAPS)
    }

    fn destroy_queues(&mut self) {
        for sqn in self.sqs.drain(..) {
            let _ = self.model.destroy_sq(sqn);
        }
        for rqn in self.rqs.drain(..) {
            let _ = self.model.destroy_rq(rqn);
        }
        // The model serves none of their queues now: the buffers they left may go.
        self.rx_parked = None;
        self.tx_parked = None;
    }

    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.events.fd()
    }

    fn take_events(&mut self, out: &mut Vec<crate::ethdev::PortEvent>) {
        self.events.take(out);
    }

    /// The model's counters (`dev_*`), then its wire's (`wire_*`, see [`wire::Wire::stats`]).
    /// Each with what it says about lost frames (see the MANA model's): error and flush
    /// completions are the driver's (`ierrors`, `oerrors`), frames with no WQE its
    /// `imissed`; a receive flush gives a posted buffer back, no frame.
    fn xstats(&self) -> Vec<Xstat> {
        let h = self.model.handle();
        let s = h.stats();
        let mut v = vec![
            Xstat::new("dev_tx_frames", s.tx_frames, Loss::None),
            Xstat::new("dev_tx_send_wqes", s.tx_send_wqes, Loss::None),
            Xstat::new("dev_tx_bytes", s.tx_bytes, Loss::None),
            Xstat::new("dev_tx_errors", s.tx_errors, Loss::Counted),
            Xstat::new("dev_tx_flushed", s.tx_flushed, Loss::Counted),
            Xstat::new("dev_tx_wire_drops", s.tx_wire_drops, Loss::Tx),
            Xstat::new("dev_tx_mtu_drops", s.tx_mtu_drops, Loss::Tx),
            Xstat::new("dev_rx_frames", s.rx_frames, Loss::None),
            Xstat::new("dev_rx_bytes", s.rx_bytes, Loss::None),
            Xstat::new("dev_rx_no_wqe", s.rx_no_wqe, Loss::Counted),
            Xstat::new("dev_rx_oversize", s.rx_oversize, Loss::Counted),
            Xstat::new("dev_rx_prot_errors", s.rx_prot_errors, Loss::Counted),
            Xstat::new("dev_rx_flushed", s.rx_flushed, Loss::None),
            Xstat::new("dev_rx_fillers", s.rx_fillers, Loss::None),
            Xstat::new(
                "dev_rx_compressed_sessions",
                s.rx_compressed_sessions,
                Loss::None,
            ),
            Xstat::new("dev_rx_cq_full", s.rx_cq_full, Loss::Rx),
            Xstat::new("dev_rx_fault_drops", s.rx_fault_drops, Loss::Rx),
            Xstat::new("dev_rx_hash_wrong_type", s.rx_hash_wrong_type, Loss::None),
            Xstat::new("dev_tx_cq_stalls", s.tx_cq_stalls, Loss::None),
            Xstat::new("dev_tx_bad_doorbells", s.tx_bad_doorbells, Loss::None),
            Xstat::new("dev_sq_resets", s.sq_resets, Loss::None),
            Xstat::new("dev_rq_resets", s.rq_resets, Loss::None),
        ];
        v.extend(h.wire_stats().into_iter().map(|x| x.prefixed("wire_")));
        // Reading the wire's counters wrote out what a capture buffered: a failure there is
        // reported now, not at the next look.
        self.events.note_capture(h.engine().capture_error());
        v
    }

    /// Frames with no RX WQE to go to, and frames the wire lost before the model saw them
    /// ([`wire::RX_DROPS`]: a full receive ring of an afpacket wire).
    fn rx_missed(&self) -> u64 {
        let h = self.model.handle();
        h.stats().rx_no_wqe + wire::rx_drops(&h.wire_stats())
    }
}

impl Drop for ModelPort {
    fn drop(&mut self) {
        self.destroy_queues();
    }
}
