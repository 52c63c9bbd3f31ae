//! MANA (GDMA) formats: work-queue entries, TX client OOBs, SGEs, doorbells and completions.
//!
//! Source: the project's MANA spec (`spec/mana.md` in the steering docs), itself restated from
//! the Linux kernel (`include/net/mana/gdma.h`, `mana.h`), rdma-core `providers/mana` and
//! DPDK `drivers/net/mana`. All multi-byte fields are little-endian; bit positions are
//! `[hi:lo]` inside a little-endian dword. Section numbers (§) refer to that spec.
#![forbid(unsafe_code)]

pub mod cqe;
pub mod doorbell;
pub mod wqe;

/// GDMA basic unit: WQE sizes and ring positions are counted in 32-byte units (§0.1).
pub const BU_BYTES: usize = 32;
/// Largest SQ WQE (kernel `GDMA_MAX_SQE_SIZE`, §1.11).
pub const MAX_SQ_WQE_BYTES: usize = 512;
/// Largest RQ WQE (kernel `GDMA_MAX_RQE_SIZE`, §1.11).
pub const MAX_RQ_WQE_BYTES: usize = 256;
/// Most SGEs in one TX WQE: (512 - 8 - 24) / 16 (§1.11).
pub const MAX_TX_SGES: usize = 30;
/// Most SGEs in one RX WQE: (256 - 8 - 8) / 16 (§1.11).
pub const MAX_RX_SGES: usize = 15;
/// Smallest queue buffer (kernel `MANA_MIN_QSIZE`, §1.11).
pub const MIN_QUEUE_BYTES: usize = 4096;
/// Size of a CQE (§7.1).
pub const CQE_BYTES: usize = 64;
/// Length of the RSS Toeplitz key (§1.6).
pub const RSS_KEY_BYTES: usize = 40;
/// Entries of the hardware RSS indirection table (§1.6).
pub const RSS_TABLE_ENTRIES: usize = 64;
