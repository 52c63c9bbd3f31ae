//! The MANA NIC's side of the queues: consumes SQ WQEs after doorbells, reads frames through
//! memory keys, applies TX offloads, puts frames on the wire; takes frames off the wire into
//! posted RQ buffers; writes CQEs with owner bits. Written from the spec as the device's
//! behaviour (§10 "What a faithful device model must reproduce"), not from the driver's code.
//!
//! This file holds the engine's state and its step loop; the roles live beside it:
//! `tx.rs` (SQ WQEs, TX offloads, TSO, TX CQEs), `rx.rs` (wire to RQ buffers, classification,
//! coalescing, RX CQEs) and `cq.rs` (writing CQEs, slow completions). The L3/L4 arithmetic is
//! NIC-independent and lives in [`crate::net`]; wire faults are a [`FaultyWire`] around the
//! port's wire.
#![deny(unsafe_code)]

mod cq;
mod doorbell;
mod rx;
mod tx;

pub use doorbell::DoorbellPage;

use crate::emu::faults::{FaultCycle, FaultKind, FaultPlan};
use crate::emu::mr::MrTable;
use crate::emu::wire::faults::FaultyWire;
use crate::emu::wire::{Wire, MAX_FRAME};
use crate::hw::mana::doorbell::DoorbellKind;
use crate::hw::mana::{CQE_BYTES, MIN_QUEUE_BYTES, RSS_TABLE_ENTRIES};
use crate::sys::DevMem;
use std::sync::Arc;

/// `vendor_err` the model puts in a TX CQE whose SGE is outside registered memory.
pub const VENDOR_ERR_BAD_MKEY: u32 = 0x4d4b; // "MK"
/// `vendor_err` for a WQE whose header or OOB is malformed.
pub const VENDOR_ERR_BAD_WQE: u32 = 0x5751; // "WQ"
/// `vendor_err` for an error injected on purpose.
pub const VENDOR_ERR_INJECTED: u32 = 0x464c; // "FL"

/// Faults on demand; all deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every n-th TX WQE completes with TX_VPORT_DISABLED instead of being sent (0: off).
    pub tx_error_every: u32,
    /// Every n-th frame from the wire is dropped before reaching an RQ (0: off). A wire
    /// fault: the engine forwards it to its [`FaultyWire`].
    pub rx_drop_every: u32,
    /// Every n-th RX frame completes as RX_TRUNCATED (0: off).
    pub rx_error_every: u32,
    /// Link down: frames in both directions are dropped (TX still completes, as on a NIC
    /// whose cable is out). A wire fault: the engine forwards it to its [`FaultyWire`].
    pub link_down: bool,
    /// Completions are held back for this many engine steps (slow completions).
    pub completion_delay_steps: u32,
    /// RX CQE coalescing (newer kernels enable it for RSS QPs): up to four packets per
    /// RX_COALESCED_4 CQE. On as well while the vPort setting
    /// ([`Engine::set_rx_coalesce`], the `cqe-coalesce=1` devarg) is.
    pub rx_coalesce: bool,
}

/// Device-side counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Frames put on the wire.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// TX WQEs completed with an error.
    pub tx_errors: u64,
    /// Frames the wire refused: the cable full (the receiver not keeping up), the link down,
    /// a frame larger than the wire carries. Every frame the device took and did not put on
    /// the wire is counted here or in `tx_errors` (those the driver sees fail).
    pub tx_wire_drops: u64,
    /// Frames delivered into RQ buffers.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames dropped because no RX WQE was posted (the NIC's "discarded, no WQE").
    pub rx_no_wqe: u64,
    /// Frames larger than the posted buffer (RX_TRUNCATED).
    pub rx_truncated: u64,
    /// Frames dropped by faults or link down.
    pub rx_fault_drops: u64,
    /// Frames whose completions were still held back (`completion_delay_steps`) when the
    /// RQ was destroyed: lost with the queue, and never seen by the driver (those delivered
    /// into its buffers, and those an RX error completion was to report).
    pub rx_destroyed_drops: u64,
    /// TX frames over the MTU, completed with TX_MTU_DROP: error completions, so also in
    /// `tx_errors` (the driver sees them fail; unlike mlx5's `tx_mtu_drops`, which complete
    /// normally).
    pub tx_mtu_errors: u64,
    /// Doorbell values whose queue id matches no queue on their page (each value counted
    /// once; a doorbell of a sibling queue on a shared page is not bad).
    pub bad_doorbells: u64,
    /// RX CQEs written (fewer than frames when coalescing).
    pub rx_cqes: u64,
    /// TX CQEs written (one per unsuppressed WQE and one per failed WQE, §8.2).
    pub tx_cqes: u64,
}

/// A completion queue handed to the engine: its ring (`count` entries of 64 bytes) and id.
#[derive(Debug, Clone)]
pub struct CqSpec {
    /// The ring.
    pub mem: Arc<DevMem>,
    /// Entries in the ring (what `manadv_init_obj` reports as `count`).
    pub count: u32,
    /// CQ id (written into each TX OOB by the driver, checked by the engine).
    pub id: u32,
}

/// A send queue handed to the engine, with the completion queue it completes on (on MANA a
/// CQ serves exactly one queue).
#[derive(Debug, Clone)]
pub struct SqSpec {
    /// The ring (a power of two bytes).
    pub mem: Arc<DevMem>,
    /// SQ id: the id its doorbells carry.
    pub id: u32,
    /// The page its doorbells are rung on (possibly shared with other queues).
    pub doorbell: Arc<DoorbellPage>,
    /// The vPort offset its TX OOBs must carry (`manadv_qp.tx_vp_offset`).
    pub vp_offset: u16,
    /// Its completion queue.
    pub cq: CqSpec,
}

/// A receive queue handed to the engine, with its completion queue.
#[derive(Debug, Clone)]
pub struct RqSpec {
    /// The ring (a power of two bytes).
    pub mem: Arc<DevMem>,
    /// RQ id: the id its doorbells carry.
    pub id: u32,
    /// The page its doorbells are rung on (possibly shared with other queues).
    pub doorbell: Arc<DoorbellPage>,
    /// Its completion queue.
    pub cq: CqSpec,
}

/// Why the engine refused a queue, memory region or RSS setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A queue of that kind and id is already served (queue ids are unique per device).
    #[error("{kind} {id:#x} is already served by this engine")]
    DuplicateQueue {
        /// `SQ` or `RQ`.
        kind: &'static str,
        /// The id.
        id: u32,
    },
    /// No queue of that kind and id is served.
    #[error("{kind} {id:#x} is not served by this engine")]
    NoSuchQueue {
        /// `SQ` or `RQ`.
        kind: &'static str,
        /// The id.
        id: u32,
    },
    /// A work queue ring whose size is not a power of two of at least one 4 KiB page.
    #[error(
        "{kind} {id:#x}: ring of {bytes} bytes: need a power of two, at least 4096 (spec §1.3)"
    )]
    RingSize {
        /// `SQ` or `RQ`.
        kind: &'static str,
        /// The queue id.
        id: u32,
        /// The ring's length.
        bytes: usize,
    },
    /// A completion queue ring too small for its entry count.
    #[error("CQ {id:#x}: {count} entries of 64 bytes do not fit in {bytes} bytes")]
    CqSize {
        /// The CQ id.
        id: u32,
        /// Entries asked for.
        count: u32,
        /// The ring's length.
        bytes: usize,
    },
    /// A doorbell page shorter than 4 KiB or not 8-byte aligned.
    #[error("doorbell page at {addr:#x} of {bytes} bytes: need 4096 bytes, 8-byte aligned")]
    DoorbellPage {
        /// Its address.
        addr: usize,
        /// Its length.
        bytes: usize,
    },
    /// A memory key registered twice.
    #[error("memory key {lkey:#x} is already registered")]
    DuplicateKey {
        /// The key.
        lkey: u32,
    },
    /// An indirection table with no entries or more than the device's 64.
    #[error("RSS indirection table of {entries} entries: need 1 to 64")]
    RssTable {
        /// Entries given.
        entries: usize,
    },
}

pub(crate) struct Sq {
    pub mem: Arc<DevMem>,
    pub id: u32,
    pub cq: Cq,
    pub db: Arc<DoorbellPage>,
    pub vp_offset: u16,
    /// Consumer position in bytes (free-running).
    pub consumed: u32,
    /// Producer position of the last doorbell latched for this queue.
    pub tail: u32,
}

pub(crate) struct Rq {
    pub mem: Arc<DevMem>,
    pub id: u32,
    pub cq: Cq,
    pub db: Arc<DoorbellPage>,
    pub consumed: u32,
    /// Producer position of the last doorbell latched for this queue.
    pub tail: u32,
}

pub(crate) struct Cq {
    pub mem: Arc<DevMem>,
    pub count: u32,
    pub id: u32,
    /// CQEs written since creation.
    pub written: u64,
    /// Where the next CQE goes (`written mod count`) and the owner bits it carries
    /// ([`owner_for`](crate::hw::mana::cqe::owner_for) of `written`), kept as the counter
    /// moves so that writing a CQE divides nothing.
    pub slot: u32,
    pub owner: u8,
    /// Completions waiting out `completion_delay_steps`: (due step, body, wq, is_sq).
    pub delayed: std::collections::VecDeque<(u64, [u8; CQE_BYTES], u32, bool)>,
}

impl Cq {
    fn new(spec: CqSpec) -> Result<Self, EngineError> {
        let fits = (spec.count as usize)
            .checked_mul(CQE_BYTES)
            .is_some_and(|n| n <= spec.mem.len());
        if spec.count == 0 || !fits {
            return Err(EngineError::CqSize {
                id: spec.id,
                count: spec.count,
                bytes: spec.mem.len(),
            });
        }
        Ok(Self {
            mem: spec.mem,
            count: spec.count,
            id: spec.id,
            written: 0,
            slot: 0,
            owner: crate::hw::mana::cqe::owner_for(0, spec.count),
            delayed: Default::default(),
        })
    }
}

/// Which queue's completion queue a completion goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqOf {
    /// The CQ of `sqs[i]`.
    Sq(usize),
    /// The CQ of `rqs[i]`.
    Rq(usize),
}

/// RSS state (§1.6 step 6): key, the RQ ids of the indirection table (the device's 64-entry
/// table is `entry[k] = rqs[k mod n]`) and the default RX object (the last RQ of the table).
pub(crate) struct Rss {
    pub key: [u8; 40],
    /// The Toeplitz hash under `key`, precomputed.
    pub hasher: crate::net::toeplitz::Table,
    /// The table as set, by RQ id.
    pub rq_ids: Vec<u32>,
    /// The 64 entries as indices into `Engine::rqs` (`NO_RQ` where the RQ is gone), rebuilt
    /// whenever the table or the RQs change.
    pub table: [u16; RSS_TABLE_ENTRIES],
    /// Index into `Engine::rqs` of the default RX object, if any.
    pub default: Option<usize>,
    pub enabled: bool,
}

/// An RSS table entry whose RQ is gone: frames hashed to it find no WQE.
const NO_RQ: u16 = u16::MAX;

/// The engine: every queue, memory region and the wire of one modelled port.
pub struct Engine {
    pub(crate) sqs: Vec<Sq>,
    pub(crate) rqs: Vec<Rq>,
    pub(crate) mrs: MrTable,
    pub(crate) rss: Rss,
    /// The doorbell pages of the queues, each with the last values seen on it.
    pub(crate) pages: Vec<doorbell::WatchedPage>,
    /// Scratch for the doorbell values of one page's scan.
    db_values: Vec<(usize, DoorbellKind, u64)>,
    /// The port's wire, wrapped so that the wire-level [`Faults`] apply to it.
    pub(crate) wire: FaultyWire,
    pub(crate) faults: Faults,
    /// Faults taking turns ([`Engine::cycle_faults`]): each phase sets `faults`.
    cycle: Option<FaultCycle<Faults>>,
    pub(crate) stats: ModelStats,
    /// The MTU the driver set (`Provider::set_mtu`): larger TX frames complete with
    /// TX_MTU_DROP.
    pub(crate) mtu: u16,
    /// The vPort's RX CQE coalescing ([`Engine::set_rx_coalesce`]); [`Faults::rx_coalesce`]
    /// turns it on as well.
    rx_coalesce: bool,
    frame: Vec<u8>,
    seg: Vec<u8>,
    coalescing: Option<rx::Coalescing>,
    /// Completions held back (`completion_delay_steps`) in all CQs together.
    delayed: usize,
    steps: u64,
    tx_seen: u64,
    rx_seen: u64,
}

/// Largest packet a TSO WQE may describe (the IPv4 total length limit plus headers).
pub const LSO_MAX_BYTES: usize = 65536 + 256;

/// A work queue ring the engine can wrap around in: a power of two, at least one page.
fn check_ring(kind: &'static str, id: u32, mem: &DevMem) -> Result<(), EngineError> {
    let bytes = mem.len();
    if !bytes.is_power_of_two() || bytes < MIN_QUEUE_BYTES {
        return Err(EngineError::RingSize { kind, id, bytes });
    }
    Ok(())
}

/// Frames or WQEs handled per queue per step, so one busy queue cannot starve the others.
const BUDGET: usize = 64;

impl Engine {
    /// An engine with no queues on `wire`: MTU 1500 (the kernel netdev's default on MANA),
    /// no RSS, no faults. Give it queues and memory regions, then [`step`](Engine::step) it
    /// or run it on an [`EngineThread`](crate::emu::mana::EngineThread).
    pub fn new(wire: Box<dyn Wire>) -> Self {
        Self {
            sqs: Vec::new(),
            rqs: Vec::new(),
            mrs: MrTable::new(),
            rss: Rss {
                key: [0; 40],
                hasher: crate::net::toeplitz::Table::new(&[0; 40]),
                rq_ids: Vec::new(),
                table: [NO_RQ; RSS_TABLE_ENTRIES],
                default: None,
                enabled: false,
            },
            pages: Vec::new(),
            db_values: Vec::new(),
            wire: FaultyWire::new(wire),
            faults: Faults::default(),
            cycle: None,
            stats: ModelStats::default(),
            frame: vec![0; LSO_MAX_BYTES + 4],
            seg: Vec::with_capacity(MAX_FRAME + 4),
            coalescing: None,
            delayed: 0,
            mtu: 1500,
            rx_coalesce: false,
            steps: 0,
            tx_seen: 0,
            rx_seen: 0,
        }
    }

    /// Serves a send queue and its CQ from now on (what the kernel's QP creation does on the
    /// NIC). Its doorbells are latched from `sq.doorbell`, which it may share with other
    /// queues (see [`DoorbellPage`]).
    ///
    /// # Errors
    /// A duplicate SQ id, or a ring of the wrong size.
    pub fn add_sq(&mut self, sq: SqSpec) -> Result<(), EngineError> {
        check_ring("SQ", sq.id, &sq.mem)?;
        if self.sqs.iter().any(|q| q.id == sq.id) {
            return Err(EngineError::DuplicateQueue {
                kind: "SQ",
                id: sq.id,
            });
        }
        let cq = Cq::new(sq.cq)?;
        if !sq.doorbell.register(DoorbellKind::Sq, sq.id) {
            return Err(EngineError::DuplicateQueue {
                kind: "SQ",
                id: sq.id,
            });
        }
        self.watch(&sq.doorbell);
        self.sqs.push(Sq {
            mem: sq.mem,
            id: sq.id,
            cq,
            db: sq.doorbell,
            vp_offset: sq.vp_offset,
            consumed: 0,
            tail: 0,
        });
        Ok(())
    }

    /// Stops serving send queue `id` and its CQ (completions still held back are dropped).
    /// When this returns the engine holds no reference to their memory.
    ///
    /// # Errors
    /// No SQ of that id.
    pub fn remove_sq(&mut self, id: u32) -> Result<(), EngineError> {
        let i = self
            .sqs
            .iter()
            .position(|q| q.id == id)
            .ok_or(EngineError::NoSuchQueue { kind: "SQ", id })?;
        let q = self.sqs.remove(i);
        self.delayed -= q.cq.delayed.len();
        q.db.unregister(DoorbellKind::Sq, id);
        self.unwatch(&q.db);
        Ok(())
    }

    /// Serves a receive queue and its CQ from now on. It receives frames once an RSS
    /// setting names it ([`set_rss`](Engine::set_rss)).
    ///
    /// # Errors
    /// A duplicate RQ id, or a ring of the wrong size.
    pub fn add_rq(&mut self, rq: RqSpec) -> Result<(), EngineError> {
        check_ring("RQ", rq.id, &rq.mem)?;
        if self.rqs.iter().any(|q| q.id == rq.id) {
            return Err(EngineError::DuplicateQueue {
                kind: "RQ",
                id: rq.id,
            });
        }
        let cq = Cq::new(rq.cq)?;
        if !rq.doorbell.register(DoorbellKind::Rq, rq.id) {
            return Err(EngineError::DuplicateQueue {
                kind: "RQ",
                id: rq.id,
            });
        }
        self.watch(&rq.doorbell);
        self.rqs.push(Rq {
            mem: rq.mem,
            id: rq.id,
            cq,
            db: rq.doorbell,
            consumed: 0,
            tail: 0,
        });
        self.rebuild_rss();
        Ok(())
    }

    /// Stops serving receive queue `id` and its CQ; RSS entries naming it find no WQE from
    /// now on. When this returns the engine holds no reference to their memory.
    ///
    /// # Errors
    /// No RQ of that id.
    pub fn remove_rq(&mut self, id: u32) -> Result<(), EngineError> {
        let i = self
            .rqs
            .iter()
            .position(|q| q.id == id)
            .ok_or(EngineError::NoSuchQueue { kind: "RQ", id })?;
        let q = self.rqs.remove(i);
        self.delayed -= q.cq.delayed.len();
        // Frames whose completions were held back die with the queue, as on a device whose
        // queue is destroyed before it completes them: those in the RQ's buffers, and those
        // an error completion (RX_TRUNCATED) was to report, which no driver will see either.
        self.stats.rx_destroyed_drops +=
            q.cq.delayed
                .iter()
                .map(|(_, body, _, _)| {
                    crate::hw::mana::cqe::Cqe::new_checked(&body[..]).map_or(0, |c| c.rx_frames(0))
                })
                .sum::<u64>();
        q.db.unregister(DoorbellKind::Rq, id);
        self.unwatch(&q.db);
        self.rebuild_rss();
        Ok(())
    }

    /// Sets the Toeplitz key and the indirection table (RQ ids, in order; the device's 64
    /// entries are `rqs[k mod n]`), and makes the table's last RQ the default RX object, for
    /// frames without a hash (what the kernel does when it creates an RSS QP, §1.6 step 6).
    ///
    /// # Errors
    /// A table of 0 or more than 64 entries, or an id no RQ of this engine has.
    pub fn set_rss(&mut self, key: [u8; 40], rqs: &[u32]) -> Result<(), EngineError> {
        if rqs.is_empty() || rqs.len() > RSS_TABLE_ENTRIES {
            return Err(EngineError::RssTable { entries: rqs.len() });
        }
        if let Some(&id) = rqs.iter().find(|&&id| !self.rqs.iter().any(|q| q.id == id)) {
            return Err(EngineError::NoSuchQueue { kind: "RQ", id });
        }
        if self.rss.key != key {
            self.rss.hasher = crate::net::toeplitz::Table::new(&key);
        }
        self.rss.key = key;
        self.rss.rq_ids = rqs.to_vec();
        self.rss.enabled = rqs.len() > 1;
        self.rebuild_rss();
        Ok(())
    }

    /// Forgets the RSS setting: frames from the wire find no RQ (and count as `rx_no_wqe`).
    pub fn clear_rss(&mut self) {
        self.rss.rq_ids.clear();
        self.rss.enabled = false;
        self.rebuild_rss();
    }

    /// Recomputes the table's indices into `rqs` after the table or the RQs changed.
    fn rebuild_rss(&mut self) {
        let index = |id: u32| self.rqs.iter().position(|q| q.id == id);
        let n = self.rss.rq_ids.len();
        for (k, e) in self.rss.table.iter_mut().enumerate() {
            *e = if n == 0 {
                NO_RQ
            } else {
                index(self.rss.rq_ids[k % n]).map_or(NO_RQ, |i| i as u16)
            };
        }
        self.rss.default = self.rss.rq_ids.last().and_then(|&id| index(id));
    }

    /// Registers a memory region: WQE addresses `iova..iova + mem.len()` under key `lkey`
    /// reach `mem` (what `ibv_reg_mr` makes the NIC able to do).
    ///
    /// # Errors
    /// The key is registered already.
    pub fn add_mr(&mut self, lkey: u32, iova: u64, mem: DevMem) -> Result<(), EngineError> {
        self.mrs
            .add(lkey, iova, Arc::new(mem))
            .map_err(|e| EngineError::DuplicateKey { lkey: e.lkey })
    }

    /// Deregisters the memory region of `lkey`; `false` if there was none. When this returns
    /// the engine holds no view of that memory.
    pub fn remove_mr(&mut self, lkey: u32) -> bool {
        self.mrs.remove(lkey)
    }

    /// Sets the vPort's MTU: TX frames (or TSO segments) with more L3 bytes complete with
    /// TX_MTU_DROP.
    pub fn set_mtu(&mut self, mtu: u16) {
        self.mtu = mtu;
    }

    /// The vPort's RX CQE coalescing (`cqe_coalescing_enable` of its RX configuration, which
    /// `mana_ib` sets for RSS QPs on newer kernels): up to four packets per RX_COALESCED_4
    /// CQE. Kept apart from the faults: [`Engine::set_faults`] leaves it as it is (the fault
    /// knob [`Faults::rx_coalesce`] turns coalescing on too).
    pub fn set_rx_coalesce(&mut self, on: bool) {
        self.rx_coalesce = on;
    }

    /// Sets the faults.
    pub fn set_faults(&mut self, f: Faults) {
        self.faults = f;
    }

    /// Has the faults of `plan` take turns from now on (see [`crate::emu::faults`]),
    /// replacing any faults set; `None` stops the cycle and clears them. Kinds the MANA model
    /// does not have ([`crate::emu::faults::MANA_KINDS`]) are refused.
    ///
    /// # Errors
    /// The first kind of `plan` the model does not have.
    pub fn cycle_faults(&mut self, plan: Option<&FaultPlan>) -> Result<(), FaultKind> {
        FaultCycle::restart(&mut self.cycle, &mut self.faults, plan, Self::phase)
    }

    /// The faults of one phase of a cycle.
    fn phase(kind: FaultKind) -> Option<Faults> {
        use crate::emu::faults as f;
        let none = Faults::default();
        Some(match kind {
            FaultKind::Link => Faults {
                link_down: true,
                ..none
            },
            FaultKind::RxDrop => Faults {
                rx_drop_every: f::RX_DROP_EVERY,
                ..none
            },
            FaultKind::RxError => Faults {
                rx_error_every: f::RX_ERROR_EVERY,
                ..none
            },
            FaultKind::TxError => Faults {
                tx_error_every: f::TX_ERROR_EVERY,
                ..none
            },
            FaultKind::SlowCompletions => Faults {
                completion_delay_steps: f::SLOW_COMPLETION_STEPS,
                ..none
            },
            FaultKind::RxBadKey | FaultKind::TxBadKey | FaultKind::StateChange => return None,
        })
    }

    /// Device-side counters.
    pub fn stats(&self) -> ModelStats {
        self.stats
    }

    /// The wire's own counters ([`Wire::stats`]: frames it or the kernel under it dropped).
    /// Slow path: may cost a system call.
    pub fn wire_stats(&self) -> Vec<crate::ethdev::Xstat> {
        self.wire.stats()
    }

    /// The failure of a capture on the wire ([`Wire::capture_error`]), if it stopped.
    pub fn capture_error(&self) -> Option<i32> {
        self.wire.capture_error()
    }

    /// How many send and receive queues the engine serves.
    pub fn queue_counts(&self) -> (usize, usize) {
        (self.sqs.len(), self.rqs.len())
    }

    /// One pass over every queue and the wire; returns the work done (WQEs + frames + CQEs).
    pub fn step(&mut self) -> usize {
        self.steps += 1;
        self.apply_faults();
        self.scan_doorbells();
        let mut work = 0;
        for i in 0..self.sqs.len() {
            work += self.process_sq(i);
        }
        // What this pass sent leaves now (one system call for a wire that batches).
        self.wire.flush();
        work += self.process_wire(false);
        work += self.release_delayed();
        work
    }

    /// The completion queue a completion goes to.
    pub(crate) fn cq_mut(&mut self, of: CqOf) -> &mut Cq {
        match of {
            CqOf::Sq(i) => &mut self.sqs[i].cq,
            CqOf::Rq(i) => &mut self.rqs[i].cq,
        }
    }

    /// Starts the phase of the fault cycle that is due, if any, then hands the wire-level
    /// fields of [`Faults`] to the wire's knobs. `faults` is set from outside between steps,
    /// so each step starts by forwarding it.
    fn apply_faults(&mut self) {
        if let Some(f) = self.cycle.as_mut().and_then(FaultCycle::poll) {
            self.faults = f;
        }
        let knobs = self.wire.faults();
        knobs.set_rx_drop_every(self.faults.rx_drop_every);
        knobs.set_link_down(self.faults.link_down);
    }
}

impl crate::emu::thread::Nic for Engine {
    fn step(&mut self) -> usize {
        Engine::step(self)
    }

    /// An SQ's kick consumes every WQE its doorbells announced; an RQ's kick takes frames off
    /// the wire (at most `BUDGET`, into whichever RQ each frame's RSS hash picks, as the
    /// device would). A kick counts as a step for `completion_delay_steps`.
    fn kick(&mut self, queue: crate::emu::thread::QueueId) -> usize {
        use crate::emu::thread::QueueId;
        self.steps += 1;
        self.apply_faults();
        let mut work = match queue {
            QueueId::Sq(id) => match self.sqs.iter().position(|q| q.id == id) {
                Some(i) => {
                    self.latch_sq(i);
                    let mut n = 0;
                    loop {
                        let k = self.process_sq(i);
                        n += k;
                        if k < BUDGET {
                            // What the kick sent leaves now (a batching wire's kick).
                            self.wire.flush();
                            break n;
                        }
                    }
                }
                None => 0,
            },
            QueueId::Rq(_) => {
                self.latch_rqs();
                self.process_wire(true)
            }
        };
        if self.delayed > 0 {
            work += self.release_delayed();
        }
        work
    }

    fn describe(&self) -> String {
        let (sqs, rqs) = self.queue_counts();
        format!("mana {}, {sqs} SQs, {rqs} RQs", self.wire.describe())
    }
}

crate::emu::handle::device_model!(Engine, Faults, ModelStats);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::wire::Loopback;

    /// The wire-level faults set through [`Faults`] reach the wrapped wire at the next step,
    /// and the engine counts and budgets dropped frames like any other arrival.
    #[test]
    fn wire_faults_are_forwarded_counted_and_budgeted() {
        let mut e = Engine::new(Box::new(Loopback::open("t-engine-faults").unwrap()));
        let mut peer = Loopback::open("t-engine-faults").unwrap();
        e.faults = Faults {
            rx_drop_every: 3,
            ..Faults::default()
        };
        for _ in 0..7 {
            assert!(peer.send(&[0u8; 60]));
            peer.flush();
        }
        assert_eq!(e.step(), 7);
        // No RQ: what the faults let through finds no WQE.
        assert_eq!((e.stats.rx_fault_drops, e.stats.rx_no_wqe), (2, 5));

        e.faults = Faults {
            link_down: true,
            ..Faults::default()
        };
        for _ in 0..100 {
            assert!(peer.send(&[0u8; 60]));
            peer.flush();
        }
        assert_eq!(e.step(), BUDGET);
        assert_eq!(e.step(), 100 - BUDGET);
        assert_eq!(e.step(), 0);
        assert_eq!((e.stats.rx_fault_drops, e.stats.rx_no_wqe), (102, 5));
        assert!(e.wire.faults().link_down());

        e.faults = Faults::default();
        assert!(peer.send(&[0u8; 60]));
        peer.flush();
        assert_eq!(e.step(), 1);
        assert_eq!((e.stats.rx_fault_drops, e.stats.rx_no_wqe), (102, 6));
    }
}
