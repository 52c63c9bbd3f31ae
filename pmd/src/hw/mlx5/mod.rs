//! mlx5 (ConnectX-4 … ConnectX-7) raw-packet formats, big-endian as the PRM lays them out:
//! send WQEs (control, Ethernet, data and inline segments in 64-byte WQEBBs of 16-byte units,
//! §2), the doorbell records and the UAR write (§3), receive WQEs (§4), CQE64 and error CQEs
//! (§5), and the 8-byte mini CQEs of compressed sessions (§6). Section numbers are those of
//! the mlx5 spec.
#![forbid(unsafe_code)]

pub mod cqe;
pub mod doorbell;
pub mod wqe;

/// A send WQE basic block: the ring unit of SQs (§2.1).
pub const WQEBB_BYTES: usize = 64;
/// The unit WQE sizes are counted in (`ds`, §2.1).
pub const DS_BYTES: usize = 16;
/// Units per WQEBB.
pub const DS_PER_WQEBB: usize = WQEBB_BYTES / DS_BYTES;
/// Most units one WQE may hold (`ds` is 6 bits, §2.1).
pub const MAX_DS: usize = 63;
/// Units DPDK lets a WQE use (`MLX5_WQE_SIZE_MAX` = 960 bytes, §2.1).
pub const DPDK_MAX_DS: usize = 60;
/// The CQE size of raw-packet CQs.
pub const CQE_BYTES: usize = 64;
/// A mini CQE (§6.1).
pub const MINI_CQE_BYTES: usize = 8;
/// Mini CQEs in one array (one CQ slot, §6.2).
pub const MINIS_PER_ARRAY: usize = CQE_BYTES / MINI_CQE_BYTES;

/// WQEBBs a WQE of `ds` units occupies (§2.1).
pub const fn wqebbs(ds: usize) -> usize {
    ds.div_ceil(DS_PER_WQEBB)
}

crate::enum_with_unknown! {
    /// Send WQE opcodes (control segment byte 3, §2.5).
    pub enum Opcode(u8) {
        /// No packet; HW skips the WQE's WQEBBs.
        Nop = 0x00,
        /// One packet: Ethernet segment, then gather or inline data.
        Send = 0x0a,
        /// TSO (LSO): the header inline, `mss` in the Ethernet segment.
        Tso = 0x0e,
        /// Enhanced multi-packet send: one descriptor per packet.
        Empw = 0x29,
    }
}
