//! The mlx5 NIC's side of the queues, written from the spec (mlx5.md §2–6, and §8 "What a
//! faithful emulator must reproduce") as the device's behaviour, not from any driver's code.
//!
//! This file holds the engine's state, its queue table and its step; the roles live beside
//! it: `uar.rs` (the SQ doorbell: sampling the UAR registers, checking each write against
//! the record and the ring), `tx.rs` (SQ WQEs, offloads, TSO, eMPW, requester CQEs), `rx.rs`
//! (wire to RQ buffers, steering by RSS, responder CQEs) and `cq.rs` (writing CQEs, the owner
//! rule, overrun, compressed sessions). Memory keys are the shared [`MrTable`]; L3/L4
//! arithmetic is [`crate::net`]; wire faults are a [`FaultyWire`] around the port's wire.
#![deny(unsafe_code)]

mod cq;
mod rx;
mod tx;
mod uar;

use crate::emu::faults::{FaultCycle, FaultKind, FaultPlan};
use crate::emu::mr::MrTable;
use crate::emu::wire::faults::FaultyWire;
use crate::emu::wire::Wire;
use crate::hw::mlx5::cqe::MiniCqeFormat;
use crate::mlx5::{Mprq, MprqCaps, RawCq, RawRq, RawSq};
use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

pub(crate) use cq::Cq;

/// `vendor_err_synd` the model puts in an error CQE it injected on purpose
/// ([`Faults::tx_error_every`]); real devices use vendor syndromes for their own causes.
pub const VENDOR_ERR_INJECTED: u8 = 0xfe;

/// Largest packet a TSO WQE may describe (the IPv4 total length limit plus headers).
pub const LSO_MAX_BYTES: usize = 65536 + 256;

/// Most WQEBBs one queue may have: the 16-bit WQE counters (§2.1, §4.1) must tell a full
/// ring from an empty one.
pub const MAX_WQE_CNT: u32 = 1 << 15;

/// The striding-RQ geometries the model accepts (its `striding_rq_caps`, §1.2, §4.2): strides
/// of 64 bytes to 8 KiB, 8 to 65536 strides per WQE (fewer than 512 strides is what the
/// spec calls the "ext" capability, which the model has).
pub const MPRQ_CAPS: MprqCaps = MprqCaps {
    min_single_stride_log_num_of_bytes: 6,
    max_single_stride_log_num_of_bytes: 13,
    min_single_wqe_log_num_of_strides: 3,
    max_single_wqe_log_num_of_strides: 16,
};

/// WQEs or frames handled per queue per step, so one busy queue cannot starve the others.
const BUDGET: usize = 64;

/// Faults on demand; all deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every n-th executed TX WQE completes with a LOCAL_QP_OP error CQE (vendor syndrome
    /// [`VENDOR_ERR_INJECTED`]) instead of being sent, which puts its SQ in error (0: off).
    pub tx_error_every: u32,
    /// Every n-th frame from the wire is dropped before reaching an RQ (0: off). A wire fault:
    /// forwarded to the engine's [`FaultyWire`].
    pub rx_drop_every: u32,
    /// Link down: frames in both directions are dropped (TX still completes, as on a NIC
    /// whose cable is out). A wire fault.
    pub link_down: bool,
    /// Every n-th pointer data segment an SQ gathers is looked up as if its memory key were
    /// unknown: the WQE fails with LOCAL_PROT and its SQ goes to error, exactly as for a
    /// driver that wrote a bad key (0: off).
    pub tx_bad_key_every: u32,
    /// Every n-th frame that reaches a posted RQ WQE is scattered as if the WQE's memory key
    /// were unknown: RESP_ERR LOCAL_PROT, the WQE consumed and the RQ in error, exactly as
    /// for a driver that posted a bad key (0: off).
    pub rx_bad_key_every: u32,
    /// The next n queue state changes (to RESET, or back to RTS / RDY, of any queue) fail,
    /// as `ibv_modify_qp` / `ibv_modify_wq` can; the queue keeps its state (0: off).
    pub fail_state_changes: u32,
}

/// Device-side counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Send WQEs consumed (NOPs and failed ones included).
    pub tx_wqes: u64,
    /// Of those, SEND WQEs (one frame each) the device acted on, failed ones included,
    /// flushed ones not: a device that needs an inline header (`min_inline`) gets these
    /// instead of eMPW WQEs (§1.9).
    pub tx_send_wqes: u64,
    /// Frames put on the wire (one per TSO segment, one per eMPW packet).
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Send WQEs completed with an error CQE (not counting flushes).
    pub tx_errors: u64,
    /// Send WQEs flushed (WR_FLUSH_ERR) because their SQ was in error.
    pub tx_flushed: u64,
    /// Steps in which an SQ waited because its CQ had no free entry (overrun avoided).
    pub tx_cq_stalls: u64,
    /// UAR doorbell writes refused (`uar.rs`): for no SQ of their register, naming a WQE the
    /// SQ's doorbell record does not announce (or one consumed already), or unlike the first
    /// 8 bytes of the WQE they name. Each starts nothing.
    pub tx_bad_doorbells: u64,
    /// Frames the wire refused: the cable full (the receiver not keeping up), the link down,
    /// a frame larger than the wire carries.
    pub tx_wire_drops: u64,
    /// Frames with more L3 bytes than the MTU, dropped (their WQE completes normally).
    pub tx_mtu_drops: u64,
    /// Frames delivered into RQ buffers.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames dropped because their RQ had no posted WQE (the NIC's out-of-buffer counter,
    /// DPDK's `imissed`), or because no RQ exists.
    pub rx_no_wqe: u64,
    /// Frames a hashing TIR received whose L3 family or L4 protocol is not the one it hashes
    /// (given hash 0 and table entry 0; see [`Engine::set_tirs`]).
    pub rx_hash_wrong_type: u64,
    /// Frames the port's steering sent to no TIR (its rules changed meanwhile): dropped.
    pub rx_unsteered_drops: u64,
    /// Frames larger than the posted WQE (RESP_ERR LOCAL_LENGTH, WQE consumed; striding RQ:
    /// larger than a whole WQE, the rest of the WQE consumed).
    pub rx_oversize: u64,
    /// Striding RQ: filler CQEs written (a frame did not fit the strides left in a WQE,
    /// §4.2).
    pub rx_fillers: u64,
    /// Frames whose scatter list names a bad key or range (RESP_ERR LOCAL_PROT; the RQ goes
    /// to error).
    pub rx_prot_errors: u64,
    /// RQ WQEs flushed (RESP_ERR WR_FLUSH) because their RQ was in error.
    pub rx_flushed: u64,
    /// SQs moved to RESET (error recovery).
    pub sq_resets: u64,
    /// RQs moved to RESET (error recovery).
    pub rq_resets: u64,
    /// Queue state changes refused by the `fail_state_changes` fault.
    pub state_change_failures: u64,
    /// Frames dropped because their RQ's CQ had no free entry (a real device raises a CQ
    /// error; the model counts and drops).
    pub rx_cq_full: u64,
    /// Frames dropped by wire faults (rx_drop_every, link down).
    pub rx_fault_drops: u64,
    /// RX CQEs and compressed-session slots written.
    pub rx_cqes: u64,
    /// Compressed sessions written (§6.2).
    pub rx_compressed_sessions: u64,
}

/// A completion queue handed to the engine (what `mlx5dv_init_obj(CQ)` describes).
#[derive(Debug, Clone)]
pub struct CqSpec {
    /// The ring: `cqe_cnt` × 64 bytes.
    pub buf: Arc<DevMem>,
    /// Entries, a power of two.
    pub cqe_cnt: u32,
    /// The doorbell record (`SET_CI` at byte 0).
    pub dbrec: Arc<DevMem>,
    /// CQ number.
    pub cqn: u32,
}

impl From<&RawCq> for CqSpec {
    fn from(c: &RawCq) -> Self {
        Self {
            buf: Arc::clone(&c.buf),
            cqe_cnt: c.cqe_cnt,
            dbrec: Arc::clone(&c.dbrec),
            cqn: c.cqn,
        }
    }
}

/// A send queue handed to the engine, with its CQ.
#[derive(Debug, Clone)]
pub struct SqSpec {
    /// The ring: `wqe_cnt` WQEBBs.
    pub buf: Arc<DevMem>,
    /// WQEBBs, a power of two.
    pub wqe_cnt: u32,
    /// SQ number: every control segment must carry it.
    pub sqn: u32,
    /// The doorbell record; the engine reads the SQ counter at byte 4 when a doorbell
    /// arrives.
    pub dbrec: Arc<DevMem>,
    /// The UAR (BlueFlame) register the driver's 8-byte doorbell write goes to (`bf.reg`,
    /// §1.7): the engine samples the first 8 bytes of each half (`uar.rs`). Several SQs may
    /// share one.
    pub uar: Arc<DevMem>,
    /// Bytes of one BlueFlame half (`bf.size`): the second half starts there; 0 for a
    /// doorbell-only register (one 8-byte slot).
    pub bf_size: u32,
    /// Inline header bytes every SEND/TSO WQE must carry (§1.9).
    pub min_inline: u16,
    /// Its completion queue.
    pub cq: CqSpec,
}

impl SqSpec {
    /// The spec of `q`, whose UAR register the engine reads through `uar` (the same page as
    /// `q.bf_reg`, which the driver can only write).
    pub fn of(q: &RawSq, uar: Arc<DevMem>) -> Self {
        Self {
            buf: Arc::clone(&q.buf),
            wqe_cnt: q.wqe_cnt,
            sqn: q.sqn,
            dbrec: Arc::clone(&q.dbrec),
            uar,
            bf_size: q.bf_size,
            min_inline: q.min_inline,
            cq: CqSpec::from(&q.cq),
        }
    }
}

/// A receive queue handed to the engine, with its CQ: cyclic (§4.1) through
/// [`Engine::add_rq`], or striding (§4.2) through [`Engine::add_striding_rq`], which takes
/// the geometry.
#[derive(Debug, Clone)]
pub struct RqSpec {
    /// The ring: `wqe_cnt` WQEs of `stride` bytes.
    pub buf: Arc<DevMem>,
    /// WQEs, a power of two.
    pub wqe_cnt: u32,
    /// Bytes per WQE: a power of two, at least 16 (one scatter entry); a striding RQ's WQE
    /// is 32 bytes (its data segment at byte 16).
    pub stride: u32,
    /// RQ number.
    pub rqn: u32,
    /// The doorbell record; the engine reads the RQ counter at byte 0.
    pub dbrec: Arc<DevMem>,
    /// Strip the first C-VLAN tag and report it in the CQE (`CVLAN_STRIPPING`, §1.6).
    pub vlan_strip: bool,
    /// Its completion queue.
    pub cq: CqSpec,
}

impl RqSpec {
    /// The spec of a raw RQ, with or without VLAN stripping (a striding RQ's geometry,
    /// `q.mprq`, goes to [`Engine::add_striding_rq`]).
    pub fn from_raw(q: &RawRq, vlan_strip: bool) -> Self {
        Self {
            buf: Arc::clone(&q.buf),
            wqe_cnt: q.wqe_cnt,
            stride: q.stride,
            rqn: q.rqn,
            dbrec: Arc::clone(&q.dbrec),
            vlan_strip,
            cq: CqSpec::from(&q.cq),
        }
    }
}

bitflags::bitflags! {
    /// The fields an RSS TIR hashes (`ibv_rx_hash_conf.rx_hash_fields_mask`, §1.6 step 5).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct RxHashFields: u32 {
        /// IPv4 source address.
        const SRC_IPV4 = 1 << 0;
        /// IPv4 destination address.
        const DST_IPV4 = 1 << 1;
        /// IPv6 source address.
        const SRC_IPV6 = 1 << 2;
        /// IPv6 destination address.
        const DST_IPV6 = 1 << 3;
        /// TCP source port.
        const SRC_PORT_TCP = 1 << 4;
        /// TCP destination port.
        const DST_PORT_TCP = 1 << 5;
        /// UDP source port.
        const SRC_PORT_UDP = 1 << 6;
        /// UDP destination port.
        const DST_PORT_UDP = 1 << 7;
    }
}

/// Why the engine refused a queue, memory region or RSS setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A queue (or CQ) of that kind and number is already served.
    #[error("{kind} {id:#x} is already served by this engine")]
    DuplicateQueue {
        /// `SQ`, `RQ` or `CQ`.
        kind: &'static str,
        /// Its number.
        id: u32,
    },
    /// No queue of that kind and number is served.
    #[error("{kind} {id:#x} is not served by this engine")]
    NoSuchQueue {
        /// `SQ`, `RQ` or `CQ`.
        kind: &'static str,
        /// Its number.
        id: u32,
    },
    /// A ring whose entry count is not a power of two in range, or that does not fit its
    /// buffer.
    #[error("{kind} {id:#x}: {entries} entries of {entry_bytes} bytes: need a power of two up to {max}, within the {bytes}-byte buffer")]
    RingSize {
        /// `SQ`, `RQ` or `CQ`.
        kind: &'static str,
        /// Its number.
        id: u32,
        /// Entries asked for.
        entries: u32,
        /// Bytes per entry.
        entry_bytes: u32,
        /// Most entries allowed.
        max: u32,
        /// The buffer's length.
        bytes: usize,
    },
    /// A UAR register whose doorbell slots (8 bytes at the start of each half) are not all
    /// inside it and 8-byte aligned.
    #[error("SQ {id:#x}: UAR register at {addr:#x} of {bytes} bytes with halves of {half}: need 8-byte aligned 8-byte slots at 0 and at the half")]
    UarRegister {
        /// The SQ.
        id: u32,
        /// The register's address.
        addr: usize,
        /// Its length.
        bytes: usize,
        /// The half size given (`bf.size`).
        half: usize,
    },
    /// A doorbell record shorter than 8 bytes or not 4-byte aligned.
    #[error("{kind} {id:#x}: doorbell record at {addr:#x} of {bytes} bytes: need 8 bytes, 4-byte aligned")]
    Dbrec {
        /// `SQ`, `RQ` or `CQ`.
        kind: &'static str,
        /// Its number.
        id: u32,
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
    /// A striding-RQ geometry outside [`MPRQ_CAPS`], or a WQE stride shorter than 32 bytes.
    #[error("RQ {id:#x}: striding geometry of 2^{log_strides} strides of 2^{log_stride_bytes} bytes in {stride}-byte WQEs: the model takes 2^6..=2^13-byte strides, 2^3..=2^16 strides per WQE, WQEs of at least 32 bytes")]
    Mprq {
        /// The RQ.
        id: u32,
        /// log2 of the stride size asked for.
        log_stride_bytes: u8,
        /// log2 of the strides per WQE asked for.
        log_strides: u8,
        /// The WQE stride.
        stride: u32,
    },
    /// A state change the queue's state does not allow (§1.5): only RESET may go back to
    /// RTS (an SQ) or RDY (an RQ).
    #[error("{kind} {id:#x}: cannot go from {from} to {to}")]
    BadTransition {
        /// `SQ` or `RQ`.
        kind: &'static str,
        /// Its number.
        id: u32,
        /// The queue's state.
        from: &'static str,
        /// The state asked for.
        to: &'static str,
    },
    /// A state change refused on purpose ([`Faults::fail_state_changes`]).
    #[error("{kind} {id:#x}: moving to {to} failed (injected fault)")]
    StateChangeFailed {
        /// `SQ` or `RQ`.
        kind: &'static str,
        /// Its number.
        id: u32,
        /// The state asked for.
        to: &'static str,
    },
    /// An indirection table whose size is not a power of two (`log_ind_tbl_size`, §1.6).
    #[error("RSS indirection table of {entries} entries: need a power of two, 1 to 65536")]
    RssTable {
        /// Entries given.
        entries: usize,
    },
    /// Hash fields no TIR takes (`create_rss_raw_qp_tir`): both address families, both L4
    /// protocols, or none over a table of more than one entry.
    #[error("RSS hash fields {fields:#x}: a TIR hashes one address family and one L4 protocol, and no fields only over a one-entry table")]
    TirFields {
        /// `IBV_RX_HASH_*` bits.
        fields: u32,
    },
}

/// Reads the big-endian dword at `off` of a doorbell record, with acquire ordering: what the
/// driver wrote before its record store is visible after it.
fn record(mem: &DevMem, off: usize) -> u32 {
    u32::from_be(mem.load_u32(off, Ordering::Acquire))
}

/// Where a queue is in its state machine (§1.5), as far as the device's datapath cares: a
/// raw QP's SQ runs in RTS, a WQ in RDY; both go to error on a failed WQE and only leave it
/// through RESET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HwQueueState {
    /// RTS (SQ) or RDY (RQ): the device serves the queue.
    Ready,
    /// After a failed WQE: SQ WQEs complete with WR_FLUSH, posted RQ WQEs are flushed with
    /// WR_FLUSH and frames for the RQ are dropped.
    Error,
    /// The device does not touch the queue; its counter is 0.
    Reset,
}

impl HwQueueState {
    fn name(self, sq: bool) -> &'static str {
        match (self, sq) {
            (Self::Ready, true) => "RTS",
            (Self::Ready, false) => "RDY",
            (Self::Error, _) => "ERR",
            (Self::Reset, _) => "RESET",
        }
    }
}

pub(crate) struct Sq {
    pub buf: Arc<DevMem>,
    pub wqe_cnt: u32,
    pub sqn: u32,
    pub dbrec: Arc<DevMem>,
    /// The UAR register its doorbells come through.
    pub uar: uar::UarReg,
    pub min_inline: u16,
    pub cq: Cq,
    /// The device's consumer counter in WQEBBs (16 bits, §2.1).
    pub ci: u16,
    /// Where the last accepted doorbell's WQE ends (WQEBBs, 16 bits): the device consumes
    /// WQEs up to here (`uar.rs`).
    pub db_tail: u16,
    /// RTS, error (after a failed WQE: the rest are flushed) or RESET.
    pub state: HwQueueState,
}

pub(crate) struct Rq {
    pub buf: Arc<DevMem>,
    pub wqe_cnt: u32,
    pub stride: u32,
    pub rqn: u32,
    pub dbrec: Arc<DevMem>,
    pub vlan_strip: bool,
    pub cq: Cq,
    /// The device's consumer counter in WQEs (16 bits, §4.1).
    pub ci: u16,
    /// RDY, error (after a failed WQE: posted WQEs are flushed, frames dropped) or RESET.
    pub state: HwQueueState,
    /// Striding geometry (`None`: cyclic).
    pub mprq: Option<Mprq>,
    /// Striding RQ: strides of WQE `ci` used so far.
    pub stride_ci: u32,
}

/// One hashing TIR (an RSS QP, §1.6 (B) step 5): key, hashed fields and the indirection
/// table by RQ number, with the table resolved into indices of `Engine::rqs`.
///
/// The fields select one L3 family and at most one L4 protocol, as the kernel programs a TIR
/// (Linux `drivers/infiniband/hw/mlx5/qp.c`, `create_rss_raw_qp_tir`: IPv4 with IPv6 fields,
/// or TCP with UDP ports, is `EINVAL`; the IP fields set the selector's `l3_prot_type`, the
/// port fields its `l4_prot_type`, "if none ... was set - this bit field is ignored"; no
/// fields at all is allowed only over a one-entry table, "steering entry without hashing").
pub(crate) struct Tir {
    /// The Toeplitz hash under the key, precomputed.
    pub hasher: crate::net::toeplitz::Table,
    pub fields: RxHashFields,
    pub rqns: Vec<u32>,
    /// `rqns` as indices into `Engine::rqs` (`usize::MAX` where the RQ is gone).
    pub table: Vec<usize>,
}

/// Which TIR a frame from the wire goes to (its index in the setting), decided by the port's
/// steering rules (the fake rdma-core's `ibv_create_flow` rules); `None`: no rule takes it
/// any more (the rules changed after the wire let it through), and it is dropped
/// (`rx_unsteered_drops`).
pub type Steer = std::sync::Arc<dyn Fn(&[u8]) -> Option<usize> + Send + Sync>;

impl RxHashFields {
    /// The L3 family a TIR with these fields hashes (`l3_prot_type`): `Some(false)` IPv4,
    /// `Some(true)` IPv6, `None` any (no address field selected).
    pub(crate) fn l3_v6(self) -> Option<bool> {
        if self.intersects(Self::SRC_IPV4 | Self::DST_IPV4) {
            Some(false)
        } else if self.intersects(Self::SRC_IPV6 | Self::DST_IPV6) {
            Some(true)
        } else {
            None
        }
    }

    /// The L4 protocol a TIR with these fields hashes (`l4_prot_type`): 6 TCP, 17 UDP,
    /// `None` any (no port field selected).
    pub(crate) fn l4_proto(self) -> Option<u8> {
        if self.intersects(Self::SRC_PORT_TCP | Self::DST_PORT_TCP) {
            Some(6)
        } else if self.intersects(Self::SRC_PORT_UDP | Self::DST_PORT_UDP) {
            Some(17)
        } else {
            None
        }
    }

    /// Whether a TIR may select these fields (one L3 family, one L4 protocol:
    /// `create_rss_raw_qp_tir`'s two `EINVAL` checks).
    pub fn valid_for_one_tir(self) -> bool {
        let v4 = self.intersects(Self::SRC_IPV4 | Self::DST_IPV4);
        let v6 = self.intersects(Self::SRC_IPV6 | Self::DST_IPV6);
        let tcp = self.intersects(Self::SRC_PORT_TCP | Self::DST_PORT_TCP);
        let udp = self.intersects(Self::SRC_PORT_UDP | Self::DST_PORT_UDP);
        !((v4 && v6) || (tcp && udp))
    }

    /// The per-traffic-type TIRs a port hashing `self` needs, most specific first: for each
    /// selected family, one per selected L4 protocol, then the family alone; then no fields
    /// (frames of no hashed type), as the Linux mlx5e netdev programs its indirect TIRs
    /// (`drivers/net/ethernet/mellanox/mlx5/core/en/rss.c`, `rss_default_config`: IPV4_TCP,
    /// IPV4_UDP, IPV4, IPV6_TCP, …, each TIR fed by the traffic-type table only with its
    /// type) and as DPDK's mlx5 PMD expands an RSS action into one hash RX queue per
    /// (L3, L4) pattern.
    pub fn per_traffic_type(self) -> Vec<RxHashFields> {
        let mut out = Vec::new();
        let l4s = [
            Self::SRC_PORT_TCP | Self::DST_PORT_TCP,
            Self::SRC_PORT_UDP | Self::DST_PORT_UDP,
        ];
        for l3 in [
            Self::SRC_IPV4 | Self::DST_IPV4,
            Self::SRC_IPV6 | Self::DST_IPV6,
        ] {
            if !self.intersects(l3) {
                continue;
            }
            for l4 in l4s {
                if self.intersects(l4) {
                    out.push(self & (l3 | l4));
                }
            }
            out.push(self & l3);
        }
        if out.is_empty() {
            // Ports without an address family: the L3 type is ignored.
            for l4 in l4s {
                if self.intersects(l4) {
                    out.push(self & l4);
                }
            }
        }
        out.push(Self::empty());
        out
    }
}

/// The engine: every queue, memory region and the wire of one modelled port.
pub struct Engine {
    pub(crate) sqs: Vec<Sq>,
    pub(crate) rqs: Vec<Rq>,
    /// The UAR doorbell slots the SQs use, sampled every pass.
    pub(crate) uars: Vec<uar::UarSlot>,
    pub(crate) mrs: MrTable,
    /// The hashing TIRs (empty: no RSS, every frame to the first RQ), and the steering
    /// that picks one per frame (`None`: by the frame's traffic type, see
    /// [`Engine::set_rss`]).
    pub(crate) rss: Vec<Tir>,
    pub(crate) steer: Option<Steer>,
    pub(crate) wire: FaultyWire,
    pub(crate) faults: Faults,
    /// Faults taking turns ([`Engine::cycle_faults`]): each phase sets `faults`.
    cycle: Option<FaultCycle<Faults>>,
    pub(crate) stats: ModelStats,
    pub(crate) mtu: u16,
    /// Timestamps count nanoseconds from here (a free-running clock, §5.1 bytes 48–55).
    epoch: Instant,
    frame: Vec<u8>,
    seg: Vec<u8>,
    /// Scratch for receive WQEs of more than four scatter entries.
    rx_wqe: Vec<u8>,
    /// The time of this pass (see [`Engine::now_ns`]).
    now: u64,
    tx_executed: u64,
    /// Pointer data segments gathered (the `tx_bad_key_every` fault counts them).
    pub(crate) tx_gathers: u64,
    /// Frames that reached a posted RQ WQE (the `rx_bad_key_every` fault counts them).
    pub(crate) rx_scatters: u64,
}

fn check_ring(
    kind: &'static str,
    id: u32,
    buf: &DevMem,
    entries: u32,
    entry_bytes: u32,
    max: u32,
) -> Result<(), EngineError> {
    let fits = (entries as usize)
        .checked_mul(entry_bytes as usize)
        .is_some_and(|n| n <= buf.len());
    if !entries.is_power_of_two() || entries > max || !fits {
        return Err(EngineError::RingSize {
            kind,
            id,
            entries,
            entry_bytes,
            max,
            bytes: buf.len(),
        });
    }
    Ok(())
}

fn check_dbrec(kind: &'static str, id: u32, mem: &DevMem) -> Result<(), EngineError> {
    if mem.len() < 8 || !mem.addr().is_multiple_of(4) {
        return Err(EngineError::Dbrec {
            kind,
            id,
            addr: mem.addr(),
            bytes: mem.len(),
        });
    }
    Ok(())
}

impl Engine {
    /// An engine with no queues on `wire`: MTU 1500, no RSS, no faults. Give it queues and
    /// memory regions, then [`step`](Engine::step) it or run it on an
    /// [`EngineThread`](crate::emu::thread::EngineThread).
    pub fn new(wire: Box<dyn Wire>) -> Self {
        Self {
            sqs: Vec::new(),
            rqs: Vec::new(),
            uars: Vec::new(),
            mrs: MrTable::new(),
            rss: Vec::new(),
            steer: None,
            wire: FaultyWire::new(wire),
            faults: Faults::default(),
            cycle: None,
            stats: ModelStats::default(),
            mtu: 1500,
            epoch: Instant::now(),
            frame: vec![0; tx::GATHER_BYTES],
            seg: Vec::with_capacity(crate::emu::wire::MAX_FRAME + 4),
            rx_wqe: Vec::with_capacity(4096),
            now: 0,
            tx_executed: 0,
            tx_gathers: 0,
            rx_scatters: 0,
        }
    }

    fn cq_in_use(&self, cqn: u32) -> bool {
        self.sqs.iter().any(|q| q.cq.cqn == cqn) || self.rqs.iter().any(|q| q.cq.cqn == cqn)
    }

    fn new_cq(&self, spec: CqSpec) -> Result<Cq, EngineError> {
        check_ring(
            "CQ",
            spec.cqn,
            &spec.buf,
            spec.cqe_cnt,
            crate::hw::mlx5::CQE_BYTES as u32,
            1 << 24,
        )?;
        check_dbrec("CQ", spec.cqn, &spec.dbrec)?;
        if self.cq_in_use(spec.cqn) {
            // The model serves one queue per CQ (as DPDK uses them).
            return Err(EngineError::DuplicateQueue {
                kind: "CQ",
                id: spec.cqn,
            });
        }
        Ok(Cq::new(spec))
    }

    /// Serves a send queue and its CQ from now on (the QP reached RTS): from the device's
    /// counter 0, its WQEs are consumed as UAR doorbells name them and its doorbell record
    /// announces them (`uar.rs`).
    ///
    /// # Errors
    /// A duplicate SQ or CQ number, a bad ring size, doorbell record or UAR register.
    pub fn add_sq(&mut self, sq: SqSpec) -> Result<(), EngineError> {
        check_ring(
            "SQ",
            sq.sqn,
            &sq.buf,
            sq.wqe_cnt,
            crate::hw::mlx5::WQEBB_BYTES as u32,
            MAX_WQE_CNT,
        )?;
        check_dbrec("SQ", sq.sqn, &sq.dbrec)?;
        let uar = uar::UarReg {
            mem: sq.uar,
            half: sq.bf_size as usize,
        };
        uar.check(sq.sqn)?;
        if self.sqs.iter().any(|q| q.sqn == sq.sqn) {
            return Err(EngineError::DuplicateQueue {
                kind: "SQ",
                id: sq.sqn,
            });
        }
        let cq = self.new_cq(sq.cq)?;
        self.watch_uar(&uar);
        self.sqs.push(Sq {
            buf: sq.buf,
            wqe_cnt: sq.wqe_cnt,
            sqn: sq.sqn,
            dbrec: sq.dbrec,
            uar,
            min_inline: sq.min_inline,
            cq,
            ci: 0,
            db_tail: 0,
            state: HwQueueState::Ready,
        });
        Ok(())
    }

    /// Moves send queue `sqn` through RESET back to RTS (what DPDK does after an error CQE,
    /// §2.8): [`sq_to_reset`](Engine::sq_to_reset) then [`sq_to_rts`](Engine::sq_to_rts).
    ///
    /// # Errors
    /// No SQ of that number, or a state change failed.
    pub fn reset_sq(&mut self, sqn: u32) -> Result<(), EngineError> {
        self.sq_to_reset(sqn)?;
        self.sq_to_rts(sqn)
    }

    /// Counts a state change and fails it if the `fail_state_changes` fault says so.
    fn state_change(
        &mut self,
        kind: &'static str,
        id: u32,
        to: &'static str,
    ) -> Result<(), EngineError> {
        if self.faults.fail_state_changes > 0 {
            self.faults.fail_state_changes -= 1;
            self.stats.state_change_failures += 1;
            return Err(EngineError::StateChangeFailed { kind, id, to });
        }
        Ok(())
    }

    fn sq_index(&self, sqn: u32) -> Result<usize, EngineError> {
        self.sqs
            .iter()
            .position(|q| q.sqn == sqn)
            .ok_or(EngineError::NoSuchQueue {
                kind: "SQ",
                id: sqn,
            })
    }

    fn rq_index(&self, rqn: u32) -> Result<usize, EngineError> {
        self.rqs
            .iter()
            .position(|q| q.rqn == rqn)
            .ok_or(EngineError::NoSuchQueue {
                kind: "RQ",
                id: rqn,
            })
    }

    /// Moves send queue `sqn` to RESET (from any state, §1.5): the device stops reading it
    /// and its WQE counter restarts at 0 (§8 item 7). CQEs already written stay in the CQ,
    /// which is not reset. The SQ's last doorbell is cleared from its UAR register (the
    /// model's sampling needs it, see `uar.rs`).
    ///
    /// # Errors
    /// No SQ of that number, or the `fail_state_changes` fault.
    pub fn sq_to_reset(&mut self, sqn: u32) -> Result<(), EngineError> {
        let i = self.sq_index(sqn)?;
        self.state_change("SQ", sqn, "RESET")?;
        self.forget_uar(i);
        let q = &mut self.sqs[i];
        q.state = HwQueueState::Reset;
        q.ci = 0;
        q.db_tail = 0;
        self.stats.sq_resets += 1;
        tracing::debug!(target: "pmd::emu", sqn, "SQ to RESET");
        Ok(())
    }

    /// Moves send queue `sqn` from RESET through INIT and RTR to RTS (§1.5): the device
    /// serves it again from WQE counter 0, as the next UAR doorbells name WQEs and the
    /// doorbell record announces them (`uar.rs`). The record is read only when a doorbell
    /// arrives, so a stale record left from before the RESET starts nothing (DPDK leaves it
    /// until its next doorbell, §8 item 7; ours writes it 0 while the SQ is in RESET).
    ///
    /// # Errors
    /// No SQ of that number, an SQ not in RESET, or the `fail_state_changes` fault.
    pub fn sq_to_rts(&mut self, sqn: u32) -> Result<(), EngineError> {
        let i = self.sq_index(sqn)?;
        let from = self.sqs[i].state;
        if from != HwQueueState::Reset {
            return Err(EngineError::BadTransition {
                kind: "SQ",
                id: sqn,
                from: from.name(true),
                to: "RTS",
            });
        }
        self.state_change("SQ", sqn, "RTS")?;
        self.sqs[i].state = HwQueueState::Ready;
        Ok(())
    }

    /// Moves receive queue `rqn` to RESET (from any state, §5.3): the device stops using it,
    /// its consumer counter restarts at 0 (a striding RQ's stride position too), and frames
    /// for it count as no-WQE drops until it is RDY again. A compressed session being
    /// gathered is written first; the CQ is not reset.
    ///
    /// # Errors
    /// No RQ of that number, or the `fail_state_changes` fault.
    pub fn rq_to_reset(&mut self, rqn: u32) -> Result<(), EngineError> {
        let i = self.rq_index(rqn)?;
        self.state_change("RQ", rqn, "RESET")?;
        let q = &mut self.rqs[i];
        self.stats.rx_cqes += q.cq.flush() as u64;
        q.state = HwQueueState::Reset;
        q.ci = 0;
        q.stride_ci = 0;
        self.stats.rq_resets += 1;
        tracing::debug!(target: "pmd::emu", rqn, "RQ to RESET");
        Ok(())
    }

    /// Moves receive queue `rqn` from RESET to RDY: the device takes WQEs again from its
    /// counter 0 up to the RQ doorbell record, which the driver writes 0 before this and
    /// reposts after (§4.1, §5.3).
    ///
    /// # Errors
    /// No RQ of that number, an RQ not in RESET, or the `fail_state_changes` fault.
    pub fn rq_to_rdy(&mut self, rqn: u32) -> Result<(), EngineError> {
        let i = self.rq_index(rqn)?;
        let from = self.rqs[i].state;
        if from != HwQueueState::Reset {
            return Err(EngineError::BadTransition {
                kind: "RQ",
                id: rqn,
                from: from.name(false),
                to: "RDY",
            });
        }
        self.state_change("RQ", rqn, "RDY")?;
        self.rqs[i].state = HwQueueState::Ready;
        Ok(())
    }

    /// Stops serving send queue `sqn` and its CQ. When this returns the engine holds no
    /// reference to their memory.
    ///
    /// # Errors
    /// No SQ of that number.
    pub fn remove_sq(&mut self, sqn: u32) -> Result<(), EngineError> {
        let i = self
            .sqs
            .iter()
            .position(|q| q.sqn == sqn)
            .ok_or(EngineError::NoSuchQueue {
                kind: "SQ",
                id: sqn,
            })?;
        let q = self.sqs.remove(i);
        self.unwatch_uar(&q.uar);
        Ok(())
    }

    /// Serves a cyclic receive queue and its CQ from now on (the WQ reached RDY). Frames
    /// reach it when it is the only RQ, or when the RSS table names it.
    ///
    /// # Errors
    /// A duplicate RQ or CQ number, a bad ring size, stride or doorbell record.
    pub fn add_rq(&mut self, rq: RqSpec) -> Result<(), EngineError> {
        self.add_rq_with(rq, None)
    }

    /// Serves a striding receive queue of geometry `geo` (within [`MPRQ_CAPS`], WQEs of at
    /// least 32 bytes, §4.2) and its CQ from now on, as [`add_rq`](Engine::add_rq) does.
    ///
    /// # Errors
    /// As `add_rq`; a geometry outside the caps.
    pub fn add_striding_rq(&mut self, rq: RqSpec, geo: Mprq) -> Result<(), EngineError> {
        self.add_rq_with(rq, Some(geo))
    }

    fn add_rq_with(&mut self, rq: RqSpec, mprq: Option<Mprq>) -> Result<(), EngineError> {
        if !rq.stride.is_power_of_two() || rq.stride < 16 {
            return Err(EngineError::RingSize {
                kind: "RQ",
                id: rq.rqn,
                entries: rq.wqe_cnt,
                entry_bytes: rq.stride,
                max: MAX_WQE_CNT,
                bytes: rq.buf.len(),
            });
        }
        if let Some(m) = mprq {
            if !MPRQ_CAPS.allows(m) || rq.stride < 32 {
                return Err(EngineError::Mprq {
                    id: rq.rqn,
                    log_stride_bytes: m.log_stride_bytes,
                    log_strides: m.log_strides,
                    stride: rq.stride,
                });
            }
        }
        check_ring("RQ", rq.rqn, &rq.buf, rq.wqe_cnt, rq.stride, MAX_WQE_CNT)?;
        check_dbrec("RQ", rq.rqn, &rq.dbrec)?;
        if self.rqs.iter().any(|q| q.rqn == rq.rqn) {
            return Err(EngineError::DuplicateQueue {
                kind: "RQ",
                id: rq.rqn,
            });
        }
        let cq = self.new_cq(rq.cq)?;
        self.rqs.push(Rq {
            buf: rq.buf,
            wqe_cnt: rq.wqe_cnt,
            stride: rq.stride,
            rqn: rq.rqn,
            dbrec: rq.dbrec,
            vlan_strip: rq.vlan_strip,
            cq,
            ci: 0,
            state: HwQueueState::Ready,
            mprq,
            stride_ci: 0,
        });
        self.rebuild_rss();
        Ok(())
    }

    /// Moves receive queue `rqn` through RESET back to RDY (a WQ's RDY → RESET → RDY, what
    /// DPDK does after an RX error CQE, §4.1): the device's consumer counter restarts at 0.
    /// The driver zeroes the doorbell record before RDY, so nothing is posted then.
    ///
    /// # Errors
    /// As [`Self::rq_to_reset`] and [`Self::rq_to_rdy`].
    pub fn reset_rq(&mut self, rqn: u32) -> Result<(), EngineError> {
        self.rq_to_reset(rqn)?;
        self.rq_to_rdy(rqn)
    }

    /// Stops serving receive queue `rqn` and its CQ; RSS entries naming it drop their
    /// frames from now on.
    ///
    /// # Errors
    /// No RQ of that number.
    pub fn remove_rq(&mut self, rqn: u32) -> Result<(), EngineError> {
        let i = self
            .rqs
            .iter()
            .position(|q| q.rqn == rqn)
            .ok_or(EngineError::NoSuchQueue {
                kind: "RQ",
                id: rqn,
            })?;
        let q = self.rqs.remove(i);
        self.stats.rx_compressed_sessions += q.cq.sessions;
        self.rebuild_rss();
        Ok(())
    }

    /// Sets RSS the way a port with one hashing TIR per traffic type does (§1.6 (B)): for
    /// `fields`, the TIRs of [`RxHashFields::per_traffic_type`], each over `table` (the last,
    /// with no fields, over its first entry), and every frame goes to the most specific TIR
    /// of its type: a frame hashes the selected fields of its own family and protocol under
    /// `key`, and goes to `table[hash & (len - 1)]` (§8 item 8); a frame of no selected type
    /// goes to entry 0. The fake rdma-core's ports, whose steering comes from their rules,
    /// use [`Engine::set_tirs`].
    ///
    /// # Errors
    /// A table whose length is not a power of two, or naming an RQ this engine lacks.
    pub fn set_rss(
        &mut self,
        key: [u8; 40],
        fields: RxHashFields,
        table: &[u32],
    ) -> Result<(), EngineError> {
        let first = table.first().copied().into_iter().collect::<Vec<_>>();
        let tirs = fields
            .per_traffic_type()
            .into_iter()
            .map(|f| {
                (
                    key,
                    f,
                    if f.is_empty() {
                        first.clone()
                    } else {
                        table.to_vec()
                    },
                )
            })
            .collect();
        self.install(tirs, None)
    }

    /// Sets hashing TIRs (key, fields, table by RQ number each) and the steering that picks
    /// the TIR of each frame (the port's flow rules). A frame of another type than its TIR
    /// hashes (an IPv6 frame on an IPv4 TIR, UDP on a TCP one) gets hash 0 and entry 0 and
    /// counts as `rx_hash_wrong_type`: what the device does there is in no public source (spec
    /// §9), and a driver never lets it happen (its rules match each TIR's type).
    ///
    /// # Errors
    /// A table whose length is not a power of two, naming an RQ this engine lacks, or fields
    /// no TIR takes (both families, both protocols, or none over more than one entry).
    pub fn set_tirs(
        &mut self,
        tirs: Vec<([u8; 40], RxHashFields, Vec<u32>)>,
        steer: Steer,
    ) -> Result<(), EngineError> {
        self.install(tirs, Some(steer))
    }

    fn install(
        &mut self,
        tirs: Vec<([u8; 40], RxHashFields, Vec<u32>)>,
        steer: Option<Steer>,
    ) -> Result<(), EngineError> {
        for (_, fields, table) in &tirs {
            if table.is_empty() || !table.len().is_power_of_two() || table.len() > 1 << 16 {
                return Err(EngineError::RssTable {
                    entries: table.len(),
                });
            }
            if !fields.valid_for_one_tir() || (fields.is_empty() && table.len() > 1) {
                return Err(EngineError::TirFields {
                    fields: fields.bits(),
                });
            }
            if let Some(&id) = table
                .iter()
                .find(|&&id| !self.rqs.iter().any(|q| q.rqn == id))
            {
                return Err(EngineError::NoSuchQueue { kind: "RQ", id });
            }
        }
        self.rss = tirs
            .into_iter()
            .map(|(key, fields, rqns)| Tir {
                hasher: crate::net::toeplitz::Table::new(&key),
                fields,
                rqns,
                table: Vec::new(),
            })
            .collect();
        self.steer = steer;
        self.rebuild_rss();
        Ok(())
    }

    /// Forgets the RSS setting: frames go to the first RQ.
    pub fn clear_rss(&mut self) {
        self.rss.clear();
        self.steer = None;
    }

    fn rebuild_rss(&mut self) {
        let rqs = &self.rqs;
        for r in &mut self.rss {
            r.table = r
                .rqns
                .iter()
                .map(|&id| rqs.iter().position(|q| q.rqn == id).unwrap_or(usize::MAX))
                .collect();
        }
    }

    /// Turns compressed CQEs (basic layout, §6.2) on or off for the CQ of receive queue
    /// `rqn`, with sessions of at most `max_num` completions (at least 2). The mini format is
    /// the one DPDK's scalar datapath asks for (§1.4): HASH for a cyclic RQ, CSUM_STRIDX for
    /// a striding RQ.
    ///
    /// # Errors
    /// No RQ of that number.
    pub fn set_rx_compression(
        &mut self,
        rqn: u32,
        max_num: Option<u32>,
    ) -> Result<(), EngineError> {
        let q = self
            .rqs
            .iter_mut()
            .find(|q| q.rqn == rqn)
            .ok_or(EngineError::NoSuchQueue {
                kind: "RQ",
                id: rqn,
            })?;
        let mini = if q.mprq.is_some() {
            MiniCqeFormat::CsumStridx
        } else {
            MiniCqeFormat::Hash
        };
        q.cq.set_compression(max_num.map(|n| n.max(2)), mini);
        Ok(())
    }

    /// Registers a memory region: data-segment addresses `iova..iova + mem.len()` under key
    /// `lkey` reach `mem` (what `ibv_reg_mr` makes the NIC able to do, §1.3).
    ///
    /// # Errors
    /// The key is registered already.
    pub fn add_mr(&mut self, lkey: u32, iova: u64, mem: Arc<DevMem>) -> Result<(), EngineError> {
        self.mrs
            .add(lkey, iova, mem)
            .map_err(|e| EngineError::DuplicateKey { lkey: e.lkey })
    }

    /// Deregisters `lkey`; `false` if there was none.
    pub fn remove_mr(&mut self, lkey: u32) -> bool {
        self.mrs.remove(lkey)
    }

    /// Sets the port's MTU: TX frames (or TSO segments) with more L3 bytes are dropped.
    pub fn set_mtu(&mut self, mtu: u16) {
        self.mtu = mtu;
    }

    /// Sets the faults (the wire-level ones take effect at the next step).
    pub fn set_faults(&mut self, f: Faults) {
        self.faults = f;
    }

    /// The faults set.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Has the faults of `plan` take turns from now on (see [`crate::emu::faults`]),
    /// replacing any faults set; `None` stops the cycle and clears them. Kinds the mlx5 model
    /// does not have ([`crate::emu::faults::MLX5_KINDS`]) are refused.
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
            FaultKind::TxError => Faults {
                tx_error_every: f::TX_ERROR_EVERY,
                ..none
            },
            FaultKind::RxBadKey => Faults {
                rx_bad_key_every: f::BAD_KEY_EVERY,
                ..none
            },
            FaultKind::TxBadKey => Faults {
                tx_bad_key_every: f::BAD_KEY_EVERY,
                ..none
            },
            FaultKind::StateChange => Faults {
                tx_error_every: f::TX_ERROR_EVERY,
                fail_state_changes: 1,
                ..none
            },
            FaultKind::RxError | FaultKind::SlowCompletions => return None,
        })
    }

    /// Device-side counters.
    pub fn stats(&self) -> ModelStats {
        let mut s = self.stats;
        s.rx_compressed_sessions += self.rqs.iter().map(|q| q.cq.sessions).sum::<u64>();
        s
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

    /// The numbers of the receive queues served, oldest first.
    pub fn rq_numbers(&self) -> Vec<u32> {
        self.rqs.iter().map(|q| q.rqn).collect()
    }

    /// How many send and receive queues the engine serves.
    pub fn queue_counts(&self) -> (usize, usize) {
        (self.sqs.len(), self.rqs.len())
    }

    /// The wire's link: up while the far end is attached and no link-down fault is set.
    pub fn link_up(&self) -> bool {
        !self.faults.link_down && self.wire.peer_attached()
    }

    /// One pass: the UAR doorbells written since the last pass, every SQ up to its latest
    /// doorbell, then frames from the wire; returns the work done (WQEs + frames).
    pub fn step(&mut self) -> usize {
        self.apply_faults();
        self.tick();
        self.scan_uars();
        let mut work = 0;
        for i in 0..self.sqs.len() {
            work += self.process_sq(i);
        }
        // What this pass sent leaves now (one system call for a wire that batches).
        self.wire.flush();
        for i in 0..self.rqs.len() {
            if self.rqs[i].state == HwQueueState::Error {
                work += self.flush_rq(i);
            }
        }
        work += self.process_wire(false);
        work
    }

    /// Hands the wire-level fields of [`Faults`] to the wire's knobs (they are set from
    /// outside between passes).
    fn apply_faults(&mut self) {
        if let Some(f) = self.cycle.as_mut().and_then(FaultCycle::poll) {
            self.faults = f;
        }
        let knobs = self.wire.faults();
        knobs.set_rx_drop_every(self.faults.rx_drop_every);
        knobs.set_link_down(self.faults.link_down);
    }

    /// Reads the clock for this pass (a step, or a kick).
    fn tick(&mut self) {
        self.now = self.epoch.elapsed().as_nanos() as u64;
    }

    /// Nanoseconds since the engine started, as of the start of this pass: the CQE
    /// timestamp. Every completion of one pass carries the same time (a clock read per
    /// completion would cost more than the rest of the completion); a pass lasts
    /// microseconds, and timestamps never go backwards.
    fn now_ns(&self) -> u64 {
        self.now
    }
}

impl crate::emu::thread::Nic for Engine {
    fn step(&mut self) -> usize {
        Engine::step(self)
    }

    /// An SQ's kick samples its UAR register and consumes every WQE up to its latest
    /// doorbell (while its CQ has room); an RQ's kick flushes the RQs in error and takes
    /// frames off the wire (at most `BUDGET`, into whichever RQ RSS picks for each, as the
    /// device would).
    fn kick(&mut self, queue: crate::emu::thread::QueueId) -> usize {
        use crate::emu::thread::QueueId;
        self.apply_faults();
        self.tick();
        match queue {
            QueueId::Sq(sqn) => match self.sqs.iter().position(|q| q.sqn == sqn) {
                Some(i) => {
                    self.scan_uar_of(i);
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
                let mut work = 0;
                for i in 0..self.rqs.len() {
                    if self.rqs[i].state == HwQueueState::Error {
                        work += self.flush_rq(i);
                    }
                }
                work + self.process_wire(true)
            }
        }
    }

    fn describe(&self) -> String {
        let (sqs, rqs) = self.queue_counts();
        format!("mlx5 {}, {sqs} SQs, {rqs} RQs", self.wire.describe())
    }
}

crate::emu::handle::device_model!(Engine, Faults, ModelStats);
