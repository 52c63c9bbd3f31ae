//! The 64-byte completion-queue entry (§7.1), its owner bits (§7.2), the common completion
//! header (§7.3) and the RX / TX completion OOBs (§7.4, §7.5).
//!
//! The device writes CQEs; the driver only reads them. Setters exist for the device model
//! (`emu` feature) and tests only.
#![forbid(unsafe_code)]

use super::CQE_BYTES;
use crate::enum_with_unknown;
use crate::hw::bits::{le32, Bits32};

enum_with_unknown! {
    /// `cqe_type` (§7.3).
    pub enum CqeType(u8) {
        /// Not a completion.
        Invalid = 0,
        /// One received packet in `ppi[0]`.
        RxOkay = 1,
        /// Up to four received packets.
        RxCoalesced4 = 2,
        /// Kernel-issued RQ fence; never expected on user RQs.
        RxObjectFence = 3,
        /// The frame did not fit in the posted buffer; the WQE is consumed.
        RxTruncated = 4,
        /// TX success.
        TxOkay = 32,
        /// Source-MAC enforcement drop.
        TxSaDrop = 33,
        /// Frame exceeds the MTU.
        TxMtuDrop = 34,
        /// Malformed TX OOB.
        TxInvalidOob = 35,
        /// EtherType enforcement drop.
        TxInvalidEthType = 36,
        /// Header parsing failed.
        TxHdrProcessingError = 37,
        /// VF disabled.
        TxVfDisabled = 38,
        /// Bad vPort offset.
        TxVportIdxOutOfRange = 39,
        /// vPort disabled.
        TxVportDisabled = 40,
        /// VLAN enforcement drop.
        TxVlanTaggingViolation = 41,
    }
}

/// `client_type` of a normal completion (§7.3).
pub const CLIENT_TYPE_COMPLETION: u8 = 1;
/// Number of owner-bit generations: 3 bits (§7.2).
pub const OWNER_GENERATIONS: u32 = 8;

mod field {
    use crate::hw::bits::Bits32;
    // Common header, client data dword 0 (§7.3).
    pub const CQE_TYPE: Bits32 = Bits32::le(0, 5, 0);
    pub const CLIENT_TYPE: Bits32 = Bits32::le(0, 7, 6);
    pub const VENDOR_ERR: Bits32 = Bits32::le(0, 31, 8);
    // Info dword at byte 60 (§7.1).
    pub const WQ_NUM: Bits32 = Bits32::le(60, 23, 0);
    pub const IS_SQ: Bits32 = Bits32::le(60, 24, 24);
    pub const OWNER_BITS: Bits32 = Bits32::le(60, 31, 29);
    // RX flags dword at byte 4 (§7.4).
    pub const RX_VLAN_ID: Bits32 = Bits32::le(4, 11, 0);
    pub const RX_VLAN_TAGGED: Bits32 = Bits32::le(4, 12, 12);
    pub const RX_OUTER_IPHDR_CSUM_SUCCEED: Bits32 = Bits32::le(4, 13, 13);
    pub const RX_OUTER_IPHDR_CSUM_FAIL: Bits32 = Bits32::le(4, 14, 14);
    pub const RX_HASH_TYPE: Bits32 = Bits32::le(4, 24, 16);
    pub const RX_IPHDR_CSUM_SUCCEED: Bits32 = Bits32::le(4, 25, 25);
    pub const RX_IPHDR_CSUM_FAIL: Bits32 = Bits32::le(4, 26, 26);
    pub const RX_TCP_CSUM_SUCCEED: Bits32 = Bits32::le(4, 27, 27);
    pub const RX_TCP_CSUM_FAIL: Bits32 = Bits32::le(4, 28, 28);
    pub const RX_UDP_CSUM_SUCCEED: Bits32 = Bits32::le(4, 29, 29);
    pub const RX_UDP_CSUM_FAIL: Bits32 = Bits32::le(4, 30, 30);
    // ppi[k] at 8 + 12k: packet length [15:0] of the first dword, hash in the third (§7.4).
    pub const PPI_BASE: usize = 8;
    pub const PPI_STRIDE: usize = 12;
    pub const PPI_HASH: usize = 8;
    pub const RX_WQE_OFFSET: usize = 56;
    // TX completion OOB (§7.5).
    pub const TX_DATA_OFFSET: usize = 4;
    pub const TX_SGL_OFFSET: Bits32 = Bits32::le(8, 4, 0);
    pub const TX_WQE_OFFSET: Bits32 = Bits32::le(8, 31, 5);
}

/// Packets an RX CQE can carry (`ppi[0..4]`, §7.4).
pub const RX_PPI_COUNT: usize = 4;

/// NDIS hash-type bits of the RX flags dword (§7.4).
pub mod hash_type {
    /// IPv4 2-tuple.
    pub const IPV4: u16 = 0x001;
    /// TCP over IPv4.
    pub const TCP_IPV4: u16 = 0x002;
    /// UDP over IPv4.
    pub const UDP_IPV4: u16 = 0x004;
    /// IPv6 2-tuple.
    pub const IPV6: u16 = 0x008;
    /// TCP over IPv6.
    pub const TCP_IPV6: u16 = 0x010;
    /// UDP over IPv6.
    pub const UDP_IPV6: u16 = 0x020;
    /// IPv6 with extension headers.
    pub const IPV6_EX: u16 = 0x040;
    /// TCP over IPv6 with extension headers.
    pub const TCP_IPV6_EX: u16 = 0x080;
    /// UDP over IPv6 with extension headers.
    pub const UDP_IPV6_EX: u16 = 0x100;
    /// The L3 group (what DPDK compares against).
    pub const L3_GROUP: u16 = IPV4 | IPV6 | IPV6_EX;
    /// The L4 group.
    pub const L4_GROUP: u16 = TCP_IPV4 | UDP_IPV4 | TCP_IPV6 | UDP_IPV6 | TCP_IPV6_EX | UDP_IPV6_EX;
}

/// Owner value the device writes into the `n`-th CQE of a CQ with `count` entries (§7.2).
pub const fn owner_for(n: u64, count: u32) -> u8 {
    ((n / count as u64 + 1) % OWNER_GENERATIONS as u64) as u8
}

/// What a consumer at free-running position `head` (starting at `count`) sees in its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerCheck {
    /// The slot holds a new completion for this lap.
    New,
    /// The slot still holds last lap's entry: nothing new.
    Empty,
    /// The device lapped the consumer: the CQ overflowed.
    Overflow,
}

/// Classifies a slot's owner bits for a consumer at `head` (§7.2): `expected` is
/// `(head / count) mod 8`, `previous` one less.
pub const fn check_owner(owner: u8, head: u32, count: u32) -> OwnerCheck {
    // Queue sizes are powers of two (§1.3): a shift, not a division, on the hot path.
    let lap = if count.is_power_of_two() {
        head >> count.trailing_zeros()
    } else {
        head / count
    };
    let expected = (lap % OWNER_GENERATIONS) as u8;
    let previous = (lap.wrapping_sub(1) % OWNER_GENERATIONS) as u8;
    if owner == expected {
        OwnerCheck::New
    } else if owner == previous {
        OwnerCheck::Empty
    } else {
        OwnerCheck::Overflow
    }
}

/// Byte offset of the info dword (WQ number, is_sq, owner bits) in a CQE (§7.1): what a
/// consumer loads first, as one aligned 32-bit read, before its read barrier.
pub const INFO_OFFSET: usize = 60;

/// Owner bits of an info dword loaded on its own (§7.1: bits `[31:29]` of byte 60).
pub fn info_owner_bits(info: u32) -> u8 {
    let mut b = [0u8; CQE_BYTES];
    b[INFO_OFFSET..].copy_from_slice(&info.to_le_bytes());
    field::OWNER_BITS.get(&b) as u8
}

/// The common completion header alone (client data dword 0, §7.3): enough for a consumer
/// that only needs the type, e.g. a TX completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqeHeader<T: AsRef<[u8]>>(T);

/// Bytes of [`CqeHeader`].
pub const CQE_HEADER_BYTES: usize = 4;

impl<T: AsRef<[u8]>> CqeHeader<T> {
    /// A view over at least 4 bytes; `None` if `buf` is shorter.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= CQE_HEADER_BYTES).then_some(Self(buf))
    }
    /// `cqe_type`.
    pub fn cqe_type(&self) -> CqeType {
        CqeType::from(field::CQE_TYPE.get(self.0.as_ref()) as u8)
    }
    /// `vendor_err` (24 bits).
    pub fn vendor_err(&self) -> u32 {
        field::VENDOR_ERR.get(self.0.as_ref())
    }
}

/// A 64-byte CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Cqe<T> {
    /// A view over at least 64 bytes; `None` if `buf` is shorter.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= CQE_BYTES).then_some(Self(buf))
    }
    /// The bytes under the view.
    pub fn into_inner(self) -> T {
        self.0
    }
    /// `cqe_type`.
    pub fn cqe_type(&self) -> CqeType {
        CqeType::from(field::CQE_TYPE.get(self.0.as_ref()) as u8)
    }
    /// `client_type` (1 for completions).
    pub fn client_type(&self) -> u8 {
        field::CLIENT_TYPE.get(self.0.as_ref()) as u8
    }
    /// `vendor_err` (24 bits).
    pub fn vendor_err(&self) -> u32 {
        field::VENDOR_ERR.get(self.0.as_ref())
    }
    /// The SQ or RQ id this completion is for.
    pub fn wq_num(&self) -> u32 {
        field::WQ_NUM.get(self.0.as_ref())
    }
    /// Whether the completion is for a send queue.
    pub fn is_sq(&self) -> bool {
        field::IS_SQ.get(self.0.as_ref()) != 0
    }
    /// Owner bits (3 bits) of this slot.
    pub fn owner_bits(&self) -> u8 {
        field::OWNER_BITS.get(self.0.as_ref()) as u8
    }
    /// The info dword whole (byte 60): what a consumer reads first, before a read barrier.
    pub fn info(&self) -> u32 {
        le32(self.0.as_ref(), 60)
    }

    // --- RX completion OOB (§7.4) ---

    /// RX: VLAN id, if the frame had a tag (which the device stripped).
    pub fn rx_vlan(&self) -> Option<u16> {
        let b = self.0.as_ref();
        (field::RX_VLAN_TAGGED.get(b) != 0).then(|| field::RX_VLAN_ID.get(b) as u16)
    }
    /// RX: the seven checksum bits that carry a verdict, packed: bit 0 outer IP failed, then
    /// IP ok, IP failed, TCP ok, TCP failed, UDP ok, UDP failed (see [`RxCsum::from_bits`]).
    #[inline]
    pub fn rx_csum_bits(&self) -> u8 {
        RxFlagsWord(le32(self.0.as_ref(), 4)).csum_bits()
    }
    /// RX: the checksum result flags.
    pub fn rx_csum(&self) -> RxCsum {
        let b = self.0.as_ref();
        let f = |x: Bits32| x.get(b) != 0;
        RxCsum {
            outer_ip_ok: f(field::RX_OUTER_IPHDR_CSUM_SUCCEED),
            outer_ip_bad: f(field::RX_OUTER_IPHDR_CSUM_FAIL),
            ip_ok: f(field::RX_IPHDR_CSUM_SUCCEED),
            ip_bad: f(field::RX_IPHDR_CSUM_FAIL),
            tcp_ok: f(field::RX_TCP_CSUM_SUCCEED),
            tcp_bad: f(field::RX_TCP_CSUM_FAIL),
            udp_ok: f(field::RX_UDP_CSUM_SUCCEED),
            udp_bad: f(field::RX_UDP_CSUM_FAIL),
        }
    }
    /// RX: the flags dword (OOB dword 1) whole, see [`RxFlagsWord`].
    #[inline]
    pub fn rx_flags_dword(&self) -> u32 {
        le32(self.0.as_ref(), 4)
    }
    /// RX: the 9-bit NDIS hash type ([`hash_type`]).
    pub fn rx_hash_type(&self) -> u16 {
        field::RX_HASH_TYPE.get(self.0.as_ref()) as u16
    }
    /// RX: length of packet `k` (0..4); 0 ends the list.
    pub fn rx_pkt_len(&self, k: usize) -> u16 {
        debug_assert!(k < RX_PPI_COUNT);
        let off = field::PPI_BASE + field::PPI_STRIDE * (k % RX_PPI_COUNT);
        Bits32::le(0, 15, 0).get(&self.0.as_ref()[off..]) as u16
    }
    /// RX: the packets this completion delivers from packet `first` on (RX_OKAY: one;
    /// RX_COALESCED_4: up to four, the list ending at a zero length); none for any other
    /// type (an error completion delivers nothing).
    pub fn rx_packets(&self, first: usize) -> u64 {
        match self.cqe_type() {
            CqeType::RxOkay | CqeType::RxCoalesced4 => (first..RX_PPI_COUNT)
                .take_while(|&k| self.rx_pkt_len(k) != 0)
                .count() as u64,
            _ => 0,
        }
    }
    /// RX: the frames this completion accounts for from packet `first` on, delivered or
    /// not: an RX_OKAY or RX_COALESCED_4 completion's packets ([`Cqe::rx_packets`]); any
    /// other completion (an error, RX_TRUNCATED among them) consumed one receive WQE for a
    /// frame it did not deliver: one, counted at `first == 0` only. What a queue that goes
    /// away with completions unread counts as lost, so that none is lost uncounted.
    pub fn rx_frames(&self, first: usize) -> u64 {
        match self.cqe_type() {
            CqeType::RxOkay | CqeType::RxCoalesced4 => self.rx_packets(first),
            _ => u64::from(first == 0),
        }
    }
    /// RX: Toeplitz hash of packet `k`.
    pub fn rx_pkt_hash(&self, k: usize) -> u32 {
        debug_assert!(k < RX_PPI_COUNT);
        le32(
            self.0.as_ref(),
            field::PPI_BASE + field::PPI_STRIDE * (k % RX_PPI_COUNT) + field::PPI_HASH,
        )
    }
    /// RX: `rx_wqe_offset` (semantics unconfirmed, §11 item 9).
    pub fn rx_wqe_offset(&self) -> u32 {
        le32(self.0.as_ref(), field::RX_WQE_OFFSET)
    }

    // --- TX completion OOB (§7.5) ---

    /// TX: `tx_data_offset`.
    pub fn tx_data_offset(&self) -> u32 {
        le32(self.0.as_ref(), field::TX_DATA_OFFSET)
    }
    /// TX: SGL offset (`[4:0]`).
    pub fn tx_sgl_offset(&self) -> u8 {
        field::TX_SGL_OFFSET.get(self.0.as_ref()) as u8
    }
    /// TX: WQE offset (`[31:5]`, 27 bits).
    pub fn tx_wqe_offset(&self) -> u32 {
        field::TX_WQE_OFFSET.get(self.0.as_ref())
    }
}

/// RX checksum results of a CQE (§7.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxCsum {
    /// Outer IP header checksum verified good.
    pub outer_ip_ok: bool,
    /// Outer IP header checksum bad.
    pub outer_ip_bad: bool,
    /// IP header checksum verified good.
    pub ip_ok: bool,
    /// IP header checksum bad.
    pub ip_bad: bool,
    /// TCP checksum good.
    pub tcp_ok: bool,
    /// TCP checksum bad.
    pub tcp_bad: bool,
    /// UDP checksum good.
    pub udp_ok: bool,
    /// UDP checksum bad.
    pub udp_bad: bool,
}

/// Bytes of an RX CQE that describe a single packet: header, flags and PPIs 0 and 1 (§7.4).
pub const RX_HEAD_BYTES: usize = 32;

/// An RX CQE's flags dword (OOB dword 1, §7.4): VLAN, checksum results, hash type, read
/// once for all of the CQE's packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxFlagsWord(pub u32);

impl RxFlagsWord {
    /// The checksum verdict bits, packed as [`Cqe::rx_csum_bits`].
    #[inline]
    pub fn csum_bits(self) -> u8 {
        (((self.0 >> 14) & 1) | (((self.0 >> 25) & 0x3f) << 1)) as u8
    }
    /// The 9-bit NDIS hash type.
    #[inline]
    pub fn hash_type(self) -> u16 {
        ((self.0 >> 16) & 0x1ff) as u16
    }
    /// The VLAN id, if the frame had a tag (which the device stripped).
    #[inline]
    pub fn vlan(self) -> Option<u16> {
        (self.0 & (1 << 12) != 0).then_some((self.0 & 0xfff) as u16)
    }
}

/// An RX_OKAY CQE that carries one packet (PPI 1 empty), read from its first
/// [`RX_HEAD_BYTES`]: the common completion, decoded without reading the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxSingle {
    /// The flags dword.
    pub flags: RxFlagsWord,
    /// The packet's length (not 0).
    pub len: u16,
    /// Its Toeplitz hash.
    pub hash: u32,
}

impl RxSingle {
    /// The CQE words a [`RxSingle`] is read from, as offsets: the type dword, the flags
    /// dword, the first PPI's length and hash, and the second PPI's length (0 for a single
    /// packet), each little-endian (§7.3).
    pub const WORDS: [usize; 5] = [
        0,
        4,
        field::PPI_BASE,
        field::PPI_BASE + field::PPI_HASH,
        field::PPI_BASE + field::PPI_STRIDE,
    ];

    /// [`RxSingle::parse`] from the words at [`RxSingle::WORDS`] (host order), read in place.
    #[inline]
    pub fn from_words(ty: u32, flags: u32, len: u32, hash: u32, next: u32) -> Option<Self> {
        let (len, next) = (len as u16, next as u16);
        (ty & 0x3f == u32::from(u8::from(CqeType::RxOkay)) && len != 0 && next == 0).then_some(
            Self {
                flags: RxFlagsWord(flags),
                len,
                hash,
            },
        )
    }

    /// The single packet of `head` (a CQE's first bytes), or `None` when it is another type,
    /// carries no packet or more than one.
    #[inline]
    pub fn parse(head: &[u8; RX_HEAD_BYTES]) -> Option<Self> {
        let ty = le32(head, 0) & 0x3f;
        let len = le32(head, field::PPI_BASE) as u16;
        let next = le32(head, field::PPI_BASE + field::PPI_STRIDE) as u16;
        (ty == u32::from(u8::from(CqeType::RxOkay)) && len != 0 && next == 0).then(|| Self {
            flags: RxFlagsWord(le32(head, 4)),
            len,
            hash: le32(head, field::PPI_BASE + field::PPI_HASH),
        })
    }
}

impl RxCsum {
    /// The results [`Cqe::rx_csum_bits`] packed (the outer-IP-good bit, which no flag
    /// depends on, is not among them and reads false).
    pub fn from_bits(b: u8) -> Self {
        let f = |i: u8| b & (1 << i) != 0;
        Self {
            outer_ip_ok: false,
            outer_ip_bad: f(0),
            ip_ok: f(1),
            ip_bad: f(2),
            tcp_ok: f(3),
            tcp_bad: f(4),
            udp_ok: f(5),
            udp_bad: f(6),
        }
    }
}

#[cfg(any(test, feature = "emu"))]
impl<T: AsRef<[u8]> + AsMut<[u8]>> Cqe<T> {
    /// Device side: writes the common header (dword 0).
    pub fn set_header(&mut self, t: CqeType, client_type: u8, vendor_err: u32) {
        let b = self.0.as_mut();
        field::CQE_TYPE.set(b, u32::from(u8::from(t)));
        field::CLIENT_TYPE.set(b, u32::from(client_type));
        field::VENDOR_ERR.set(b, vendor_err);
    }
    /// Device side: the info dword value for `wq_num`, `is_sq`, `owner` (reserved bits 0).
    pub fn info_value(wq_num: u32, is_sq: bool, owner: u8) -> u32 {
        let mut b = [0u8; 64];
        field::WQ_NUM.set(&mut b, wq_num);
        field::IS_SQ.set(&mut b, u32::from(is_sq));
        field::OWNER_BITS.set(&mut b, u32::from(owner));
        le32(&b, INFO_OFFSET)
    }
    /// Device side: writes the info dword (owner last, §10 item 12).
    pub fn set_info(&mut self, wq_num: u32, is_sq: bool, owner: u8) {
        let v = Self::info_value(wq_num, is_sq, owner);
        self.0.as_mut()[60..64].copy_from_slice(&v.to_le_bytes());
    }
    /// Device side: RX VLAN (tag stripped) or none.
    pub fn set_rx_vlan(&mut self, vlan: Option<u16>) {
        let b = self.0.as_mut();
        field::RX_VLAN_TAGGED.set(b, u32::from(vlan.is_some()));
        field::RX_VLAN_ID.set(b, u32::from(vlan.unwrap_or(0)));
    }
    /// Device side: RX checksum flags.
    pub fn set_rx_csum(&mut self, c: RxCsum) {
        let b = self.0.as_mut();
        field::RX_OUTER_IPHDR_CSUM_SUCCEED.set(b, u32::from(c.outer_ip_ok));
        field::RX_OUTER_IPHDR_CSUM_FAIL.set(b, u32::from(c.outer_ip_bad));
        field::RX_IPHDR_CSUM_SUCCEED.set(b, u32::from(c.ip_ok));
        field::RX_IPHDR_CSUM_FAIL.set(b, u32::from(c.ip_bad));
        field::RX_TCP_CSUM_SUCCEED.set(b, u32::from(c.tcp_ok));
        field::RX_TCP_CSUM_FAIL.set(b, u32::from(c.tcp_bad));
        field::RX_UDP_CSUM_SUCCEED.set(b, u32::from(c.udp_ok));
        field::RX_UDP_CSUM_FAIL.set(b, u32::from(c.udp_bad));
    }
    /// Device side: RX hash type.
    pub fn set_rx_hash_type(&mut self, t: u16) {
        field::RX_HASH_TYPE.set(self.0.as_mut(), u32::from(t));
    }
    /// Device side: packet `k`'s length and hash.
    pub fn set_rx_pkt(&mut self, k: usize, len: u16, hash: u32) {
        let off = field::PPI_BASE + field::PPI_STRIDE * (k % RX_PPI_COUNT);
        let b = self.0.as_mut();
        Bits32::le(off, 15, 0).set(b, u32::from(len));
        crate::hw::bits::set_le32(b, off + field::PPI_HASH, hash);
    }
    /// Device side: `rx_wqe_offset`.
    pub fn set_rx_wqe_offset(&mut self, v: u32) {
        crate::hw::bits::set_le32(self.0.as_mut(), field::RX_WQE_OFFSET, v);
    }
    /// Device side: TX completion OOB fields.
    pub fn set_tx(&mut self, data_offset: u32, sgl_offset: u8, wqe_offset: u32) {
        let b = self.0.as_mut();
        crate::hw::bits::set_le32(b, field::TX_DATA_OFFSET, data_offset);
        field::TX_SGL_OFFSET.set(b, u32::from(sgl_offset));
        field::TX_WQE_OFFSET.set(b, wqe_offset);
    }
}

#[cfg(test)]
mod tests {
    /// The single-packet head decode agrees with the full accessors, and declines every CQE
    /// it cannot describe (other types, two packets, no packet).
    #[test]
    fn rx_single_agrees_with_the_full_cqe() {
        use super::*;
        for (t, lens, vlan, hash_type) in [
            (CqeType::RxOkay, [60u16, 0], Some(7u16), 0x1b6u16),
            (CqeType::RxOkay, [1514, 0], None, 0),
            (CqeType::RxOkay, [60, 64], None, 0x1b6),
            (CqeType::RxOkay, [0, 0], None, 0),
            (CqeType::RxCoalesced4, [60, 0], None, 0x1b6),
            (CqeType::RxTruncated, [60, 0], None, 0),
        ] {
            let mut b = [0u8; CQE_BYTES];
            let mut c = Cqe::new_checked(&mut b[..]).unwrap();
            c.set_header(t, CLIENT_TYPE_COMPLETION, 0);
            c.set_rx_vlan(vlan);
            c.set_rx_csum(RxCsum {
                ip_ok: true,
                udp_ok: true,
                ..Default::default()
            });
            c.set_rx_hash_type(hash_type);
            c.set_rx_pkt(0, lens[0], 0x9e37_79b9);
            c.set_rx_pkt(1, lens[1], 5);
            let head: [u8; RX_HEAD_BYTES] = b[..RX_HEAD_BYTES].try_into().unwrap();
            let c = Cqe::new_checked(&b[..]).unwrap();
            match RxSingle::parse(&head) {
                Some(p) => {
                    assert!(t == CqeType::RxOkay && lens[0] != 0 && lens[1] == 0);
                    assert_eq!((p.len, p.hash), (c.rx_pkt_len(0), c.rx_pkt_hash(0)));
                    assert_eq!(p.flags.vlan(), c.rx_vlan());
                    assert_eq!(p.flags.hash_type(), c.rx_hash_type());
                    assert_eq!(p.flags.csum_bits(), c.rx_csum_bits());
                }
                None => assert!(t != CqeType::RxOkay || lens[0] == 0 || lens[1] != 0),
            }
        }
    }

    use super::*;
    use proptest::prelude::*;

    const _: () = assert!(CQE_BYTES == 64);

    #[test]
    fn owner_generations_per_spec() {
        // First pass 1, second 2, ..., eighth pass 0, then 1 again.
        assert_eq!(owner_for(0, 4), 1);
        assert_eq!(owner_for(3, 4), 1);
        assert_eq!(owner_for(4, 4), 2);
        assert_eq!(owner_for(4 * 7, 4), 0);
        assert_eq!(owner_for(4 * 8, 4), 1);
        // Consumer starts at head = count: expects 1, previous 0 (a zeroed ring is empty).
        assert_eq!(check_owner(0, 4, 4), OwnerCheck::Empty);
        assert_eq!(check_owner(1, 4, 4), OwnerCheck::New);
        assert_eq!(check_owner(2, 4, 4), OwnerCheck::Overflow);
    }

    #[test]
    fn info_dword_from_spec_table() {
        // wq 0x054321, RQ, owner 1: 0x054321 | 0 << 24 | 1 << 29.
        let mut b = [0u8; 64];
        Cqe::new_checked(&mut b[..])
            .unwrap()
            .set_info(0x05_4321, false, 1);
        assert_eq!(&b[60..], &[0x21, 0x43, 0x05, 0x20]);
        Cqe::new_checked(&mut b[..])
            .unwrap()
            .set_info(0x01_2345, true, 7);
        assert_eq!(&b[60..], &[0x45, 0x23, 0x01, 0xe1]);
    }

    proptest! {
        /// A consumer following a producer that never laps it sees every entry exactly once,
        /// across many laps of a small ring and across the u32 wrap of `head`.
        #[test]
        fn consumer_sees_each_entry_once_over_many_laps(count_log in 0u32..4, laps in 1u32..40, start_lap in any::<u32>()) {
            let count = 1u32 << count_log;
            // Start near an arbitrary lap (as after a long run); the device's n and the
            // consumer's head advance together.
            let base = u64::from(start_lap % 1024) * u64::from(count);
            let mut ring = vec![0u8; count as usize];
            // Pre-fill as the previous lap would have left it.
            for s in 0..count { ring[s as usize] = if base == 0 { 0 } else { owner_for(base - u64::from(count) + u64::from(s), count) }; }
            let mut head = (count as u64 + base) as u32;
            for n in base..base + u64::from(laps * count) {
                let slot = (head % count) as usize;
                prop_assert_eq!(check_owner(ring[slot], head, count), OwnerCheck::Empty);
                ring[(n % u64::from(count)) as usize] = owner_for(n, count);
                prop_assert_eq!(check_owner(ring[slot], head, count), OwnerCheck::New);
                head = head.wrapping_add(1);
            }
        }

        #[test]
        fn rx_fields_round_trip(vlan in proptest::option::of(0u16..4096), ht in 0u16..512, lens in any::<[u16; 4]>(), hashes in any::<[u32; 4]>(),
                                csum in any::<[bool; 8]>(), wq in 0u32..(1 << 24), owner in 0u8..8, t in any::<u8>()) {
            let t = t & 0x3f;
            let mut b = [0u8; 64];
            let mut c = Cqe::new_checked(&mut b[..]).unwrap();
            let cs = RxCsum { outer_ip_ok: csum[0], outer_ip_bad: csum[1], ip_ok: csum[2], ip_bad: csum[3], tcp_ok: csum[4], tcp_bad: csum[5], udp_ok: csum[6], udp_bad: csum[7] };
            c.set_header(CqeType::from(t), 1, 0);
            c.set_rx_vlan(vlan);
            c.set_rx_csum(cs);
            c.set_rx_hash_type(ht);
            for k in 0..4 { c.set_rx_pkt(k, lens[k], hashes[k]); }
            c.set_info(wq, false, owner);
            let c = Cqe::new_checked(&b[..]).unwrap();
            prop_assert_eq!(u8::from(c.cqe_type()), t);
            prop_assert_eq!(c.client_type(), 1);
            prop_assert_eq!(c.rx_vlan(), vlan);
            prop_assert_eq!(c.rx_csum(), cs);
            prop_assert_eq!(c.rx_hash_type(), ht);
            for k in 0..4 { prop_assert_eq!((c.rx_pkt_len(k), c.rx_pkt_hash(k)), (lens[k], hashes[k])); }
            prop_assert_eq!((c.wq_num(), c.is_sq(), c.owner_bits()), (wq, false, owner));
        }
    }
}
