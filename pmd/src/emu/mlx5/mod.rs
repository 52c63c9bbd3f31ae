//! The mlx5 device model: a software ConnectX that serves the raw queues `mlx5dv_init_obj`
//! describes ([`RawSq`], [`RawRq`], [`RawCq`]), written from the spec (mlx5.md §2–6, §8) as
//! the NIC's side of the queue memory.
//!
//! [`Model`] is a small provider-like API for tests and, later, for the mlx5 driver's
//! provider: it creates CQs, SQs and RQs in memory it allocates (page-aligned, zero-filled,
//! CQEs poisoned with `op_own = 0xF0` as rdma-core leaves them, §1.4), registers memory
//! regions, sets RSS, and runs an [`Engine`] on its own thread (the generic
//! [`EngineThread`]: busy-polls with back-off), inline (no thread: every raw queue carries a
//! kick, [`RawSq::kick`], with which the thread that polls it does the device's work, see
//! [`crate::emu::thread`]), or step by step through a [`ModelHandle`]. [`Model::new`] runs
//! the thread; [`Model::with_mode`] picks.
//!
//! What the engine does, in short (details in its modules):
//! * TX is triggered by the 8-byte UAR write (§3.1 step 5): the model samples each SQ's
//!   UAR register (`bf_reg`, the start of each BlueFlame half) every pass and on the SQ's
//!   kick, and takes a value it has not seen as a doorbell naming a WQE (index and SQ number
//!   from the control segment's first 8 bytes). It acts on it only if the SQ counter in the
//!   doorbell record (`dbrec + 4`, 16 bits, written before the UAR, read after it) announces
//!   that WQE and the ring holds the same 8 bytes at its index; then WQEs are consumed up to
//!   the end of that WQE. Anything else is counted (`tx_bad_doorbells`) and starts nothing;
//!   a record store without a UAR write starts nothing either. Sampling sees the last value
//!   only: of two doorbells between samples the last, which covers the earlier for one SQ;
//!   on a register shared by SQs a sibling's write can hide an SQ's doorbell until its next
//!   one (a deviation, like the MANA model's shared doorbell page; see `engine/uar.rs`).
//! * WQEs are checked strictly: the WQE index must equal the device's counter and the QPN
//!   the SQ's, else REQ_ERR LOCAL_QP_OP; a SEND/TSO with fewer inline bytes than the SQ's
//!   `min_inline` is LOCAL_QP_OP too; a bad key or range LOCAL_PROT. A failed WQE puts the SQ
//!   in error: every later WQE completes with WR_FLUSH (one error CQE per WQE, whatever its
//!   CE; §9 item 5 leaves open whether hardware flushes per WQE or per signalled WQE).
//! * Queue state machines (§1.5, §8 item 7), moved by each queue's [`RawSq::state`] /
//!   [`RawRq::state`] ([`port::ModelQueueState`], through the [`ModelHandle`]) or by
//!   [`Engine::sq_to_reset`] and friends: RESET from any state stops the device using the
//!   queue and restarts its counter at 0 (the CQ is not reset); RTS (SQ) or RDY (RQ) only
//!   from RESET. An SQ in RESET is not read and ignores doorbells; back in RTS it is served
//!   from counter 0 as new UAR doorbells name WQEs (a stale record starts nothing). At RESET
//!   the model clears the SQ's last doorbell value from its register, so that the first
//!   doorbell after RTS is seen even when it repeats that value byte for byte.
//! * An RQ WQE whose key or range is bad fails the frame with RESP_ERR LOCAL_PROT (the WQE
//!   consumed) and puts the RQ in error, as the IB rules have it for a receive queue whose
//!   WQE failed: every WQE posted then or later completes with RESP_ERR WR_FLUSH, in order
//!   (`rx_flushed`), and frames for it are dropped as no-WQE drops, until RESET; then, once
//!   RDY with the record rewritten (0, then the new postings), frames land from WQE 0. An
//!   RQ in RESET drops its frames as no-WQE drops too. A frame larger than its WQE
//!   (LOCAL_LENGTH) does not put the RQ in error.
//! * A CQE is written for WQEs with CE = 2 or 3 and for every error; the device never gets
//!   more than `cqe_cnt` entries ahead of `SET_CI` — an SQ waits (`tx_cq_stalls`), an RX
//!   frame is dropped (`rx_cq_full`).
//! * RX takes one WQE per frame from the cyclic RQ chosen by RSS (or the first RQ); no posted
//!   WQE counts `rx_no_wqe` (imissed); a frame larger than the WQE completes with RESP_ERR
//!   LOCAL_LENGTH and consumes it.
//! * Multi-packet (striding) RQs ([`Model::create_mprq`], geometries within [`MPRQ_CAPS`]):
//!   frames at stride boundaries, over as many strides as they need; a filler CQE for the
//!   strides left when a frame does not fit them; `byte_cnt` packing filler / strides /
//!   length, `wqe_counter` = stride index, `wqe_id` = WQE counter (§4.2); the record counts
//!   WQEs, a WQE is done when its last stride is used. No two-byte shift.
//! * Optional per RQ: compressed CQEs, basic layout, HASH minis on cyclic RQs and
//!   CSUM_STRIDX minis (stride index, packed `byte_cnt`; checksum 0) on striding RQs
//!   ([`Model::set_rx_compression`]).
//! * Faults ([`Faults`]): a TX WQE failed every n-th (LOCAL_QP_OP, `tx_error_every`), a
//!   pointer segment read as if its key were unknown every n-th (`tx_bad_key_every`), an RX
//!   WQE likewise (`rx_bad_key_every`), the next n state changes refused
//!   (`fail_state_changes`), and the wire's dropped frames and link down; or faults that
//!   take turns ([`crate::emu::handle::EngineHandle::cycle_faults`], the `faults=` devarg, see
//!   [`crate::emu::faults`]).
//! * Port events ([`port::ModelPort`]): a link-down or link-up event per change of the link
//!   (the far end of the wire attaching or going away, the link-down fault), as the port's
//!   asynchronous events `IBV_EVENT_PORT_ERR` / `IBV_EVENT_PORT_ACTIVE` on hardware.
//!
//! Not modelled: the enhanced compression layout (§6.3), CQ arming and events (§5.5), flow
//! steering rules (every frame is accepted), tunnel offloads (inner checksum flags are
//! ignored), LRO, scatter-to-CQE, 128-byte CQEs, the striding RQ's two-byte shift.
#![deny(unsafe_code)]

pub mod engine;
pub mod port;

pub use engine::{
    CqSpec, Engine, EngineError, Faults, ModelStats, RqSpec, RxHashFields, SqSpec, Steer,
    MPRQ_CAPS, VENDOR_ERR_INJECTED,
};

use crate::emu::thread::{EngineCore, EngineMode, EngineThread, QueueId, QueueKick};
use crate::emu::wire::Wire;
use crate::ethdev::{Kick, QueueOwner};
use crate::hw::mlx5::cqe::{op_own, CqeOpcode, OP_OWN};
use crate::hw::mlx5::wqe::MPRQ_WQE_BYTES;
use crate::hw::mlx5::{CQE_BYTES, WQEBB_BYTES};
use crate::mlx5::{Mprq, RawCq, RawRq, RawSq};
use crate::sys::{DevMem, Mmio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Bytes of one BlueFlame half the model reports (`bf.size`, §1.7, §3.2).
pub const BF_SIZE: u32 = 256;

/// Why the model could not create something.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Queue memory could not be mapped.
    #[error("mapping {object} memory: {source}")]
    Alloc {
        /// What it was for.
        object: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The engine refused it.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A size out of range.
    #[error("{what}: {requested} requested, the model allows 1 to {max}")]
    Limit {
        /// What was asked for.
        what: &'static str,
        /// How many.
        requested: u32,
        /// The most allowed.
        max: u32,
    },
}

/// A handle on a running model: step it, inject faults, read its counters (the handle both
/// models share).
pub type ModelHandle = crate::emu::handle::EngineHandle<Engine>;

/// The mlx5 device model.
pub struct Model {
    core: Arc<EngineCore<Engine>>,
    /// The engine's thread in thread mode (stopped and joined when the model drops).
    _thread: Option<EngineThread<Engine>>,
    mode: EngineMode,
    next_id: AtomicU32,
    next_lkey: AtomicU32,
    min_inline: u16,
    /// Where queue memory comes from (rings, records, registers): anonymous pages, or shared
    /// files for queues another process polls ([`Model::set_allocator`]).
    allocator: std::sync::Mutex<Arc<dyn crate::sys::mem::QueueAllocator>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mlx5::Model({:?})", self.core)
    }
}

fn pow2(n: u32, what: &'static str, max: u32) -> Result<u32, ModelError> {
    let p = n.checked_next_power_of_two().filter(|&p| n > 0 && p <= max);
    p.ok_or(ModelError::Limit {
        what,
        requested: n,
        max,
    })
}

impl Model {
    /// A model port on `wire` whose SQs require `min_inline` inline header bytes in every
    /// SEND/TSO WQE (18 models a ConnectX-4 / 4 Lx, 0 a ConnectX-5 or later, §1.9). Its
    /// engine thread, named `emu-mlx5-<port>`, starts at once.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn new(wire: Box<dyn Wire>, min_inline: u16, port: u16) -> std::io::Result<Self> {
        Self::with_mode(wire, min_inline, port, EngineMode::Thread)
    }

    /// [`Model::new`] with the engine run as `mode` says: on its thread, or inline (no
    /// thread; the queues' kicks).
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn with_mode(
        wire: Box<dyn Wire>,
        min_inline: u16,
        port: u16,
        mode: EngineMode,
    ) -> std::io::Result<Self> {
        let core = EngineCore::new(Engine::new(wire));
        let thread = match mode {
            EngineMode::Thread => Some(EngineThread::start(
                Arc::clone(&core),
                &format!("emu-mlx5-{port}"),
            )?),
            EngineMode::Inline => None,
        };
        Ok(Self {
            core,
            _thread: thread,
            mode,
            // Distinct 24-bit numbers per port, so a driver mixing them up is caught.
            next_id: AtomicU32::new(0x20_0000 + (u32::from(port) << 12)),
            next_lkey: AtomicU32::new(0x1000 + (u32::from(port) << 16)),
            min_inline,
            allocator: std::sync::Mutex::new(Arc::new(crate::sys::mem::PageAllocator)),
        })
    }

    /// Where the memory of queues created from now on comes from (as rdma-core's context
    /// allocators, which libmlx5 asks for rings and doorbell-record pages alike): a
    /// shared-file allocator puts rings, records and BlueFlame registers in files another
    /// process maps. Each piece is an allocation of its own here.
    pub fn set_allocator(&self, alloc: Arc<dyn crate::sys::mem::QueueAllocator>) {
        *self.allocator.lock().unwrap_or_else(|p| p.into_inner()) = alloc;
    }

    /// `bytes` of zeroed, page-aligned memory from the allocator, exactly `bytes` long.
    fn alloc(&self, bytes: usize, object: &'static str) -> Result<Arc<DevMem>, ModelError> {
        let a = Arc::clone(&self.allocator.lock().unwrap_or_else(|p| p.into_inner()));
        let mem = a
            .alloc(bytes)
            .map_err(|source| ModelError::Alloc { object, source })?;
        if mem.len() == bytes {
            return Ok(mem);
        }
        DevMem::within(&mem, 0, bytes)
            .map(Arc::new)
            .ok_or_else(|| ModelError::Alloc {
                object,
                source: std::io::Error::other(format!(
                    "the allocator gave {} bytes for {bytes}",
                    mem.len()
                )),
            })
    }

    /// A handle to step the model, inject faults and read counters.
    pub fn handle(&self) -> ModelHandle {
        ModelHandle::new(Arc::clone(&self.core))
    }

    fn id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff
    }

    /// The kick a queue's description carries: the device's work on the polling thread in
    /// inline mode, none with an engine thread.
    fn kick(&self, queue: QueueId) -> Kick {
        (self.mode == EngineMode::Inline)
            .then(|| Arc::new(QueueKick::new(Arc::clone(&self.core), queue)) as _)
    }

    /// What each queue description holds: the engine (as a QP holds its context).
    fn owner(&self) -> QueueOwner {
        Arc::clone(&self.core) as QueueOwner
    }

    /// A completion queue for at least `cqe` completions: `roundup_pow2(cqe + 1)` entries,
    /// as rdma-core sizes it (ask for N − 1 to get N, §1.4), every entry `op_own = 0xF0`.
    /// It serves the one queue it is given to.
    ///
    /// # Errors
    /// A size out of range, or no memory.
    pub fn create_cq(&self, cqe: u32) -> Result<RawCq, ModelError> {
        let cqe_cnt = pow2(cqe.saturating_add(1), "CQ entries", 1 << 22)?;
        let buf = self.alloc(cqe_cnt as usize * CQE_BYTES, "CQ")?;
        let invalid = op_own(u8::from(CqeOpcode::Invalid), 0, false);
        for k in 0..cqe_cnt as usize {
            buf.write(k * CQE_BYTES + OP_OWN, &[invalid]);
        }
        Ok(RawCq {
            buf,
            cqe_cnt,
            dbrec: self.alloc(8, "CQ doorbell record")?,
            cqn: self.id(),
        })
    }

    /// A send queue of `wqe_cnt` WQEBBs (rounded up to a power of two) completing on `cq`,
    /// served from now on (the QP in RTS). Its `bf_reg` is a BlueFlame register of two halves
    /// the engine samples for doorbells (see the module docs).
    ///
    /// # Errors
    /// A size out of range, no memory, or a CQ already in use.
    pub fn create_sq(&self, wqe_cnt: u32, cq: &RawCq) -> Result<RawSq, ModelError> {
        let wqe_cnt = pow2(wqe_cnt, "SQ WQEBBs", engine::MAX_WQE_CNT)?;
        let sqn = self.id();
        // The engine sees the register's writes through its own view of the page.
        let bf = self.alloc(2 * BF_SIZE as usize, "BlueFlame register")?;
        let sq = RawSq {
            buf: self.alloc(wqe_cnt as usize * WQEBB_BYTES, "SQ")?,
            wqe_cnt,
            sqn,
            dbrec: self.alloc(8, "QP doorbell record")?,
            bf_reg: Mmio::new(Arc::clone(&bf)),
            bf_size: BF_SIZE,
            min_inline: self.min_inline,
            cq: cq.clone(),
            owner: self.owner(),
            // Whoever destroys the SQ keeps a handle until then (the port does).
            parked: crate::ethdev::Parked::new(),
            state: Arc::new(port::ModelQueueState::sq(self.handle(), sqn)),
            kick: self.kick(QueueId::Sq(sqn)),
        };
        self.core.lock().add_sq(SqSpec::of(&sq, bf))?;
        Ok(sq)
    }

    /// A cyclic receive queue of `wqe_cnt` WQEs (rounded up to a power of two) with
    /// `max_sge` scatter entries each (stride `roundup_pow2(16 · max_sge)`, ring at least
    /// 64 bytes, §1.6), completing on `cq`, stripping C-VLAN tags if `vlan_strip`; served
    /// from now on (the WQ in RDY). With several RQs, frames go where [`set_rss`] says,
    /// else to the first RQ.
    ///
    /// [`set_rss`]: Model::set_rss
    ///
    /// # Errors
    /// A size out of range, no memory, or a CQ already in use.
    pub fn create_rq(
        &self,
        wqe_cnt: u32,
        max_sge: u32,
        cq: &RawCq,
        vlan_strip: bool,
    ) -> Result<RawRq, ModelError> {
        let wqe_cnt = pow2(wqe_cnt, "RQ WQEs", engine::MAX_WQE_CNT)?;
        let stride = pow2(max_sge, "RQ scatter entries", 64)? * 16;
        let bytes = (wqe_cnt as usize * stride as usize).max(64);
        let rqn = self.id();
        let rq = RawRq {
            buf: self.alloc(bytes, "RQ")?,
            wqe_cnt: (bytes / stride as usize) as u32,
            stride,
            rqn,
            dbrec: self.alloc(8, "RQ doorbell record")?,
            cq: cq.clone(),
            mprq: None,
            cqe_compression: false,
            owner: self.owner(),
            // Whoever destroys the RQ keeps a handle until then (the port does).
            parked: crate::ethdev::Parked::new(),
            state: Arc::new(port::ModelQueueState::rq(self.handle(), rqn)),
            kick: self.kick(QueueId::Rq(rqn)),
        };
        self.core.lock().add_rq(RqSpec::from_raw(&rq, vlan_strip))?;
        Ok(rq)
    }

    /// A multi-packet (striding) receive queue of `wqe_cnt` WQEs (rounded up to a power of
    /// two, ring at least 64 bytes as rdma-core sizes it, §1.6) of `geo` (within
    /// [`MPRQ_CAPS`]), 32-byte WQEs (one data segment after the 16-byte "next" segment,
    /// §4.2), completing on `cq`, stripping C-VLAN tags if `vlan_strip`; served from now on.
    ///
    /// # Errors
    /// A size or geometry out of range, no memory, or a CQ already in use.
    pub fn create_mprq(
        &self,
        wqe_cnt: u32,
        geo: Mprq,
        cq: &RawCq,
        vlan_strip: bool,
    ) -> Result<RawRq, ModelError> {
        let wqe_cnt = pow2(wqe_cnt, "striding RQ WQEs", engine::MAX_WQE_CNT)?;
        let stride = MPRQ_WQE_BYTES;
        let bytes = (wqe_cnt as usize * stride).max(64);
        let rqn = self.id();
        let rq = RawRq {
            buf: self.alloc(bytes, "RQ")?,
            wqe_cnt: (bytes / stride) as u32,
            stride: stride as u32,
            rqn,
            dbrec: self.alloc(8, "RQ doorbell record")?,
            cq: cq.clone(),
            mprq: Some(geo),
            cqe_compression: false,
            owner: self.owner(),
            parked: crate::ethdev::Parked::new(),
            state: Arc::new(port::ModelQueueState::rq(self.handle(), rqn)),
            kick: self.kick(QueueId::Rq(rqn)),
        };
        self.core
            .lock()
            .add_striding_rq(RqSpec::from_raw(&rq, vlan_strip), geo)?;
        Ok(rq)
    }

    /// Sets RSS over the RQs of `table` (RQ numbers; a power of two of them, §1.6 (B)).
    ///
    /// # Errors
    /// A bad table size or an unknown RQ.
    pub fn set_rss(
        &self,
        key: [u8; 40],
        fields: RxHashFields,
        table: &[u32],
    ) -> Result<(), ModelError> {
        Ok(self.core.lock().set_rss(key, fields, table)?)
    }

    /// Turns compressed CQEs on (`Some(max_num)`) or off for the CQ of RQ `rqn` (§6.2): HASH
    /// minis for a cyclic RQ, CSUM_STRIDX minis for a striding one (§1.4).
    ///
    /// # Errors
    /// No such RQ.
    pub fn set_rx_compression(&self, rqn: u32, max_num: Option<u32>) -> Result<(), ModelError> {
        Ok(self.core.lock().set_rx_compression(rqn, max_num)?)
    }

    /// Moves SQ `sqn` through RESET back to RTS: the device's counter restarts at 0 and its
    /// error state is cleared (§2.8). The queue's [`RawSq::state`] does the same in two
    /// steps.
    ///
    /// # Errors
    /// No such SQ, or an injected state-change failure.
    pub fn reset_sq(&self, sqn: u32) -> Result<(), ModelError> {
        Ok(self.core.lock().reset_sq(sqn)?)
    }

    /// Stops serving SQ `sqn` (the QP destroyed).
    ///
    /// # Errors
    /// No such SQ.
    pub fn destroy_sq(&self, sqn: u32) -> Result<(), ModelError> {
        Ok(self.core.lock().remove_sq(sqn)?)
    }

    /// Stops serving RQ `rqn` (the WQ destroyed).
    ///
    /// # Errors
    /// No such RQ.
    pub fn destroy_rq(&self, rqn: u32) -> Result<(), ModelError> {
        Ok(self.core.lock().remove_rq(rqn)?)
    }

    /// Registers `mem` at its own address (`ibv_reg_mr` with the virtual address, §1.3);
    /// returns the lkey.
    ///
    /// # Errors
    /// Never in practice (keys are fresh).
    pub fn reg_mr(&self, mem: &Arc<DevMem>) -> Result<u32, ModelError> {
        let lkey = self.next_lkey.fetch_add(1, Ordering::Relaxed);
        self.core
            .lock()
            .add_mr(lkey, mem.addr() as u64, Arc::clone(mem))?;
        Ok(lkey)
    }

    /// Deregisters `lkey`; `false` if it was not registered.
    pub fn dereg_mr(&self, lkey: u32) -> bool {
        self.core.lock().remove_mr(lkey)
    }

    /// Sets the port MTU (TX frames with more L3 bytes are dropped).
    pub fn set_mtu(&self, mtu: u16) {
        self.core.lock().set_mtu(mtu);
    }
}
