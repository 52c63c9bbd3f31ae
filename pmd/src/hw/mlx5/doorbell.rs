//! Doorbell records and the UAR write (§3, §4.1, §5.4). A doorbell record is a small
//! host-memory array of big-endian counters the device reads by itself; the SQ additionally
//! needs an 8-byte MMIO write to the UAR (BlueFlame register) carrying the first 8 bytes of
//! the last WQE's control segment.
#![forbid(unsafe_code)]

/// Byte offset of the RQ producer counter in a QP's (or WQ's) doorbell record
/// (`MLX5_RCV_DBR` = dword 0).
pub const RCV_DBR: usize = 0;
/// Byte offset of the SQ producer counter (`MLX5_SND_DBR` = dword 1).
pub const SND_DBR: usize = 4;
/// Byte offset of a CQ's consumer index (`SET_CI`, dword 0).
pub const CQ_SET_CI: usize = 0;
/// Byte offset of a CQ's arm word (dword 1; interrupt mode only).
pub const CQ_ARM: usize = 4;
/// Offset of the first BlueFlame register in a UAR page (`MLX5_BF_OFFSET`).
pub const BF_OFFSET: usize = 0x800;

/// The SQ record value after the last WQE: the producer counter in WQEBBs, 16 bits (§3.1).
pub const fn sq_record(pi: u32) -> [u8; 4] {
    (pi & 0xffff).to_be_bytes()
}

/// The RQ record value: the count of posted WQEs (the device uses the low 16 bits, §4.1).
pub const fn rq_record(posted: u32) -> [u8; 4] {
    posted.to_be_bytes()
}

/// The CQ `SET_CI` value: the consumer counter, 24 bits (§5.4).
pub const fn cq_set_ci(ci: u32) -> [u8; 4] {
    (ci & 0x00ff_ffff).to_be_bytes()
}

/// The 8 bytes written to the UAR: the control segment's first 8 bytes, verbatim (§3.1).
pub fn uar_write(ctrl: &[u8]) -> [u8; 8] {
    let mut b = [0u8; 8];
    b.copy_from_slice(&ctrl[..8]);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_big_endian_and_masked_as_the_spec_says() {
        assert_eq!(sq_record(0x1_1234), [0, 0, 0x12, 0x34]);
        assert_eq!(rq_record(0x1_0002), [0, 1, 0, 2]);
        assert_eq!(cq_set_ci(0x0123_4567), [0, 0x23, 0x45, 0x67]);
    }
}
