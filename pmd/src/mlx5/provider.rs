//! The mlx5 provider contract: the [`Provider`] trait (what the datapath needs from below) and
//! the raw queues `mlx5dv_init_obj` describes (spec §1.7), which the datapath drives and the
//! device model (or the NIC) serves; [`SetupError`]. Names no provider.
#![deny(unsafe_code)]

use crate::ethdev::{Kick, Link, PortEvent, QueueOwner, RssConfig};
use crate::net::MacAddr;
use crate::sys::{DevMem, Mmio};
use mempool::{ChunkInfo, Registration};
use std::os::fd::RawFd;
use std::sync::Arc;

pub use crate::ethdev::SetupError;

/// What the mlx5 datapath needs from below (spec §1).
pub trait Provider: Send {
    /// Sets the queue-buffer allocator (`mlx5dv_set_context_attr(BUF_ALLOCATORS)`, which
    /// libmlx5 also asks for doorbell-record pages): rings of exported queue pairs come from
    /// a shared-file one. Must come before the queues it is for are created. A provider
    /// that keeps its own memory ignores it (its queues then cannot be exported).
    fn set_allocator(&mut self, _alloc: Arc<dyn crate::sys::mem::QueueAllocator>) {}
    /// The device's command descriptor, from which another process maps the UAR pages of
    /// exported queues (`None`: their registers are in shared files, or nowhere to map).
    fn device_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
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
    /// The largest MTU the device takes, where the provider can tell (on hardware: the
    /// kernel netdev's `maxmtu`, e.g. 1500 on a host without jumbo frames); the port's MTU
    /// range is the driver's, capped by it.
    fn max_mtu(&self) -> Option<u16> {
        None
    }
    /// Sets the port's MTU.
    ///
    /// # Errors
    /// The device refused the value.
    fn set_mtu(&mut self, mtu: u16) -> Result<(), SetupError>;
    /// Registers one chunk of memory (`ibv_reg_mr`); the registration lasts until the guard
    /// drops. Chunks of mbuf pools, and of the page-aligned buffers a striding RQ posts
    /// ([`crate::sys::mem::DeviceBuffers`]).
    ///
    /// # Errors
    /// The registration failed.
    fn reg_mr(&mut self, chunk: &ChunkInfo) -> Result<Registration, SetupError>;
    /// Creates `n` send queues (raw-packet QP + CQ each) with room for `nb_desc` WQEBBs.
    ///
    /// # Errors
    /// Limits; device failures.
    fn create_tx_queues(&mut self, n: u16, nb_desc: u32) -> Result<Vec<RawSq>, SetupError>;
    /// Creates `req.n` receive queues (WQ + CQ each), spread by RSS over `req.rss`: cyclic
    /// RQs of `req.nb_desc` WQEs, or, with `req.mprq`, striding RQs of `req.nb_desc / strides`
    /// WQEs of that geometry; each CQ compressed when `req.cqe_compression` asks and the
    /// device can (see [`RxQueueRequest`] for the CQ size and mini formats). Each [`RawRq`]
    /// says what the queue got (`mprq`, `cqe_compression`).
    ///
    /// # Errors
    /// As `create_tx_queues`; [`SetupError::Unsupported`] or [`SetupError::Limit`] when the
    /// device refuses the striding geometry (the driver checks it against
    /// [`Provider::mprq_caps`] first).
    fn create_rx_queues(&mut self, req: &RxQueueRequest) -> Result<Vec<RawRq>, SetupError>;
    /// What the device allows for striding RQs (`striding_rq_caps`, §1.2), `None` when it has
    /// none.
    fn mprq_caps(&self) -> Option<MprqCaps> {
        None
    }
    /// Destroys all queues; objects a queue handle still holds go when it drops.
    fn destroy_queues(&mut self);
    /// Device-side counters, each with what it says about lost frames.
    fn xstats(&self) -> Vec<crate::ethdev::Xstat> {
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

/// Striding-RQ geometry (spec §4.2): every WQE is one buffer of `2^log_strides` strides of
/// `2^log_stride_bytes` bytes (`mlx5dv_wq_init_attr.striding_rq_attrs`'
/// `single_stride_log_num_of_bytes` and `single_wqe_log_num_of_strides`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mprq {
    /// log2 of the stride size in bytes.
    pub log_stride_bytes: u8,
    /// log2 of the strides per WQE.
    pub log_strides: u8,
}

impl Mprq {
    /// DPDK's default: 64 strides of 2048 bytes (`MLX5_MPRQ_DEFAULT_LOG_STRIDE_*`, §4.2).
    pub const DEFAULT: Mprq = Mprq {
        log_stride_bytes: 11,
        log_strides: 6,
    };
    /// Bytes per stride.
    pub const fn stride_bytes(&self) -> u32 {
        1 << self.log_stride_bytes
    }
    /// Strides per WQE.
    pub const fn strides(&self) -> u32 {
        1 << self.log_strides
    }
    /// Bytes of one WQE's buffer (`stride_bytes × strides`, the data segment's `byte_count`).
    pub const fn wqe_bytes(&self) -> u64 {
        1u64 << (self.log_stride_bytes as u32 + self.log_strides as u32)
    }
}

impl Default for Mprq {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a device allows for striding RQs (`mlx5dv_query_device`'s `striding_rq_caps`, §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MprqCaps {
    /// Smallest `log_stride_bytes`.
    pub min_single_stride_log_num_of_bytes: u8,
    /// Largest `log_stride_bytes`.
    pub max_single_stride_log_num_of_bytes: u8,
    /// Smallest `log_strides`.
    pub min_single_wqe_log_num_of_strides: u8,
    /// Largest `log_strides`.
    pub max_single_wqe_log_num_of_strides: u8,
}

impl MprqCaps {
    /// Whether `m` is within these limits.
    pub fn allows(&self, m: Mprq) -> bool {
        (self.min_single_stride_log_num_of_bytes..=self.max_single_stride_log_num_of_bytes)
            .contains(&m.log_stride_bytes)
            && (self.min_single_wqe_log_num_of_strides..=self.max_single_wqe_log_num_of_strides)
                .contains(&m.log_strides)
    }
}

/// How the driver wants its receive queues (spec §1.4, §1.6, §4.2).
///
/// Compressed CQEs, when asked for and granted, use the basic layout (§6.2, the only one
/// `mlx5dv_create_cq` reaches) with the mini format DPDK's scalar datapath picks (§1.4): HASH
/// minis for a cyclic RQ (each mini carries the packet's RSS hash and length), CSUM_STRIDX
/// minis for a striding RQ (each mini carries the stride index and the packed `byte_cnt`; the
/// hash then comes from the session's title, so the device only compresses completions with
/// equal hashes). The CQ is sized for one completion per packet (cyclic: WQEs; striding:
/// WQEs × strides), doubled when compressed, as DPDK sizes it (§1.4, §4.2).
#[derive(Debug, Clone)]
pub struct RxQueueRequest {
    /// Queues.
    pub n: u16,
    /// Packets the ring must hold (cyclic: WQEs; striding: WQEs × strides).
    pub nb_desc: u32,
    /// How frames are spread over the queues.
    pub rss: RssConfig,
    /// Striding RQ geometry; `None` asks for cyclic RQs.
    pub mprq: Option<Mprq>,
    /// Ask for compressed CQEs.
    pub cqe_compression: bool,
    /// Receive every frame of the port, not only those for its MAC and broadcast (steering
    /// rules on hardware).
    pub promiscuous: bool,
}

/// Moves a queue through its state machine for error recovery (spec §1.5, §5.3).
pub trait QueueState: Send + Sync {
    /// QP/SQ or WQ to RESET: the device stops using the queue.
    fn reset(&self) -> Result<(), SetupError>;
    /// From RESET back to ready: RESET→INIT→RTR→RTS for a raw QP, RESET→RDY for a WQ.
    fn ready(&self) -> Result<(), SetupError>;
}

/// A completion queue as `mlx5dv_init_obj(CQ)` describes it.
#[derive(Clone)]
pub struct RawCq {
    /// CQE ring (`cqe_cnt` × 64 bytes).
    pub buf: Arc<DevMem>,
    /// Entries, a power of two.
    pub cqe_cnt: u32,
    /// The doorbell record: `SET_CI` at byte 0, the arm word at byte 4 (8 bytes).
    pub dbrec: Arc<DevMem>,
    /// CQ number.
    pub cqn: u32,
}

/// A raw-packet send queue as `mlx5dv_init_obj(QP | CQ)` describes it.
#[derive(Clone)]
pub struct RawSq {
    /// SQ ring: `wqe_cnt` WQEBBs of 64 bytes.
    pub buf: Arc<DevMem>,
    /// WQEBBs in the ring, a power of two.
    pub wqe_cnt: u32,
    /// SQ number (the QP number of a raw TX QP).
    pub sqn: u32,
    /// The QP's doorbell record (8 bytes; the SQ counter at byte 4, `MLX5_SND_DBR`).
    pub dbrec: Arc<DevMem>,
    /// The BlueFlame / doorbell register the 8-byte UAR write goes to (write-only MMIO).
    pub bf_reg: Mmio,
    /// Size of one BlueFlame half (0: a doorbell-only register).
    pub bf_size: u32,
    /// Bytes of each frame the device needs inline in the Ethernet segment (0 on ConnectX-5
    /// and later, 18 on ConnectX-4; spec §1.9).
    pub min_inline: u16,
    /// The send CQ.
    pub cq: RawCq,
    /// What keeps the queue's objects alive while a handle exists.
    pub owner: QueueOwner,
    /// Where the queue leaves the frames still in flight when dropped, freed once the device
    /// objects that can read them are gone (see [`Parked`](crate::ethdev::Parked)).
    pub parked: Arc<crate::ethdev::Parked>,
    /// The QP's state machine: the TX queue's error recovery moves it RESET then RTS.
    pub state: Arc<dyn QueueState>,
    /// The device's work for this queue on the polling thread (a device model's inline
    /// engine); `None` on hardware. See [`crate::ethdev::kick`].
    pub kick: Kick,
}

/// A receive queue (a WQ, or the RQ of a raw QP) as `mlx5dv_init_obj(RWQ | CQ)` describes it:
/// cyclic (§4.1) or striding (§4.2).
#[derive(Clone)]
pub struct RawRq {
    /// RQ ring: `wqe_cnt` WQEs of `stride` bytes (cyclic: `stride / 16` scatter entries each;
    /// striding: 32-byte WQEs, one data segment at byte 16).
    pub buf: Arc<DevMem>,
    /// WQEs in the ring, a power of two.
    pub wqe_cnt: u32,
    /// Bytes per WQE.
    pub stride: u32,
    /// RQ number.
    pub rqn: u32,
    /// The RQ's doorbell record (the producer counter at byte 0).
    pub dbrec: Arc<DevMem>,
    /// The receive CQ.
    pub cq: RawCq,
    /// The striding geometry the queue got (`None`: a cyclic RQ).
    pub mprq: Option<Mprq>,
    /// Whether the CQ writes compressed sessions (mini format: see [`RxQueueRequest`]).
    pub cqe_compression: bool,
    /// What keeps the queue's objects alive while a handle exists.
    pub owner: QueueOwner,
    /// Where the queue leaves its posted buffers when dropped, freed once the device objects
    /// that can write into them are gone (see [`Parked`](crate::ethdev::Parked)).
    pub parked: Arc<crate::ethdev::Parked>,
    /// The WQ's state machine: the RX queue's error recovery moves it RESET then RDY.
    pub state: Arc<dyn QueueState>,
    /// The device's work for this queue on the polling thread; `None` on hardware.
    pub kick: Kick,
}

macro_rules! debug_raw {
    ($t:ty, $($f:ident),+) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    $(.field(stringify!($f), &self.$f))+
                    .finish_non_exhaustive()
            }
        }
    };
}

debug_raw!(RawCq, buf, cqe_cnt, dbrec, cqn);
debug_raw!(RawSq, buf, wqe_cnt, sqn, bf_size, min_inline, cq);
debug_raw!(RawRq, buf, wqe_cnt, stride, rqn, cq, mprq, cqe_compression);

/// A state machine for unit tests: counts the calls, and fails while `fail` is above 0.
#[cfg(test)]
pub(crate) mod testing {
    use super::{QueueState, SetupError};
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Debug, Default)]
    pub(crate) struct TestState {
        pub resets: AtomicU64,
        pub readies: AtomicU64,
        pub fail: AtomicU64,
    }

    impl TestState {
        fn call(&self, c: &AtomicU64) -> Result<(), SetupError> {
            if self.fail.load(Ordering::Relaxed) > 0 {
                self.fail.fetch_sub(1, Ordering::Relaxed);
                return Err(SetupError::Device("refused (test)".into()));
            }
            c.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    impl QueueState for TestState {
        fn reset(&self) -> Result<(), SetupError> {
            self.call(&self.resets)
        }
        fn ready(&self) -> Result<(), SetupError> {
            self.call(&self.readies)
        }
    }
}
