//! The mlx5 provider contract: the raw queues `mlx5dv_init_obj` describes (spec §1.7), which
//! the datapath drives and the device model (or the NIC) serves. Names no provider.
#![deny(unsafe_code)]

use super::driver::SetupError;
use crate::ethdev::QueueOwner;
use crate::sys::DevMem;
use std::sync::Arc;

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
    /// The BlueFlame / doorbell register the 8-byte UAR write goes to.
    pub bf_reg: Arc<DevMem>,
    /// Size of one BlueFlame half (0: a doorbell-only register).
    pub bf_size: u32,
    /// Bytes of each frame the device needs inline in the Ethernet segment (0 on ConnectX-5
    /// and later, 18 on ConnectX-4; spec §1.9).
    pub min_inline: u16,
    /// The send CQ.
    pub cq: RawCq,
    /// What keeps the queue's objects alive while a handle exists.
    pub owner: QueueOwner,
    /// The QP's state machine: the TX queue's error recovery moves it RESET then RTS.
    pub state: Arc<dyn QueueState>,
}

/// A cyclic receive queue (a WQ, or the RQ of a raw QP) as `mlx5dv_init_obj(RWQ | CQ)`
/// describes it.
#[derive(Clone)]
pub struct RawRq {
    /// RQ ring: `wqe_cnt` WQEs of `stride` bytes (`stride / 16` scatter entries each).
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
    /// What keeps the queue's objects alive while a handle exists.
    pub owner: QueueOwner,
    /// The WQ's state machine: the RX queue's error recovery moves it RESET then RDY.
    pub state: Arc<dyn QueueState>,
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
debug_raw!(RawRq, buf, wqe_cnt, stride, rqn, cq);

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
