//! 64-bit doorbells: one little-endian 64-bit store into the context's doorbell page (§6.1).
#![forbid(unsafe_code)]

/// Byte offset of the SQ doorbell in the doorbell page.
pub const SQ_OFFSET: usize = 0x000;
/// Byte offset of the RQ doorbell.
pub const RQ_OFFSET: usize = 0x400;
/// Byte offset of the CQ doorbell.
pub const CQ_OFFSET: usize = 0x800;
/// Byte offset of the EQ doorbell (kernel-owned; listed for completeness).
pub const EQ_OFFSET: usize = 0xff8;
/// Size of the doorbell page user space maps (§1.2, §11 item 13).
pub const PAGE_BYTES: usize = 4096;

const ID_MASK: u64 = 0x00ff_ffff;

/// Which queue a doorbell is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorbellKind {
    /// Send queue.
    Sq,
    /// Receive queue.
    Rq,
    /// Completion queue.
    Cq,
}

impl DoorbellKind {
    /// The page offset this kind of doorbell is written to.
    pub const fn offset(self) -> usize {
        match self {
            DoorbellKind::Sq => SQ_OFFSET,
            DoorbellKind::Rq => RQ_OFFSET,
            DoorbellKind::Cq => CQ_OFFSET,
        }
    }

    /// The kind whose doorbell lives at `offset`, if any.
    pub const fn from_offset(offset: usize) -> Option<Self> {
        match offset {
            SQ_OFFSET => Some(DoorbellKind::Sq),
            RQ_OFFSET => Some(DoorbellKind::Rq),
            CQ_OFFSET => Some(DoorbellKind::Cq),
            _ => None,
        }
    }
}

/// SQ doorbell value: `[23:0]` SQ id, `[31:24]` 0, `[63:32]` producer position in bytes
/// (`head_in_bu * 32`, free-running, truncated to 32 bits).
pub const fn sq(sq_id: u32, tail_bytes: u32) -> u64 {
    (sq_id as u64 & ID_MASK) | ((tail_bytes as u64) << 32)
}

/// RQ doorbell value: `[23:0]` RQ id, `[31:24]` `wqe_cnt` = 0 (required for RQs),
/// `[63:32]` producer position in bytes.
pub const fn rq(rq_id: u32, tail_bytes: u32) -> u64 {
    (rq_id as u64 & ID_MASK) | ((tail_bytes as u64) << 32)
}

/// CQ doorbell value: `[23:0]` CQ id, `[62:32]` consumer index `head mod (8 * count)`
/// (31 bits), `[63]` arm.
pub const fn cq(cq_id: u32, consumer_index: u32, arm: bool) -> u64 {
    (cq_id as u64 & ID_MASK)
        | (((consumer_index & 0x7fff_ffff) as u64) << 32)
        | ((arm as u64) << 63)
}

/// A doorbell value taken apart (what the device model sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// Queue id (24 bits).
    pub id: u32,
    /// Bits `[31:24]` (`wqe_cnt` for RQs; must be 0).
    pub wqe_cnt: u8,
    /// SQ/RQ: producer position in bytes; CQ: consumer index (31 bits).
    pub index: u32,
    /// CQ arm bit.
    pub arm: bool,
}

/// Takes a doorbell value of `kind` apart.
pub const fn decode(kind: DoorbellKind, value: u64) -> Decoded {
    let id = (value & ID_MASK) as u32;
    let wqe_cnt = ((value >> 24) & 0xff) as u8;
    match kind {
        DoorbellKind::Cq => Decoded {
            id,
            wqe_cnt,
            index: ((value >> 32) & 0x7fff_ffff) as u32,
            arm: value >> 63 != 0,
        },
        _ => Decoded {
            id,
            wqe_cnt,
            index: (value >> 32) as u32,
            arm: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three worked examples of §6.1.
    #[test]
    fn spec_examples() {
        // SQ id 0x012345 after one 1-BU WQE from head 0.
        assert_eq!(sq(0x01_2345, 32), 0x0000_0020_0001_2345);
        assert_eq!(
            sq(0x01_2345, 32).to_le_bytes(),
            [0x45, 0x23, 0x01, 0x00, 0x20, 0, 0, 0]
        );
        // RQ id 0x054321 after the initial 64 one-BU WQEs.
        assert_eq!(rq(0x05_4321, 64 * 32), 0x0000_0800_0005_4321);
        // CQ id 0x098765 armed, consumer head 600, 64 entries: 600 mod 512 = 88 = 0x58.
        assert_eq!(cq(0x09_8765, 600 % (8 * 64), true), 0x8000_0058_0009_8765);
        assert_eq!(DoorbellKind::from_offset(0x400), Some(DoorbellKind::Rq));
    }

    #[test]
    fn fields_truncate_like_c_bitfields() {
        assert_eq!(sq(0x1ff_ffff, 0) & 0xffff_ffff, 0x00ff_ffff);
        assert_eq!(cq(1, 0xffff_ffff, false) >> 32, 0x7fff_ffff);
        let d = decode(DoorbellKind::Cq, cq(0x09_8765, 88, true));
        assert_eq!(
            d,
            Decoded {
                id: 0x09_8765,
                wqe_cnt: 0,
                index: 88,
                arm: true
            }
        );
        let d = decode(DoorbellKind::Sq, sq(7, u32::MAX));
        assert_eq!((d.id, d.index, d.arm), (7, u32::MAX, false));
    }
}
