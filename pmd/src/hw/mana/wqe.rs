//! GDMA work-queue entry: 8-byte header, inline client OOB (8 or 24 bytes), SGL of 16-byte
//! entries, padded to a multiple of 32 bytes (§3), and the TX client OOB (§4).
#![forbid(unsafe_code)]

use super::BU_BYTES;
use crate::hw::bits::{le32, le64, set_le32, set_le64};
use mempool::{Iova, Lkey};

/// Size of the WQE header ("DMA OOB", §3.1).
pub const WQE_HEADER_BYTES: usize = 8;
/// Short inline OOB (TX short format, every RX WQE) (§3.2).
pub const SHORT_OOB_BYTES: usize = 8;
/// Long inline OOB (TX long format) (§3.2).
pub const LONG_OOB_BYTES: usize = 24;
/// Size of one SGL entry (§3.1).
pub const SGE_BYTES: usize = 16;

/// Bytes of a WQE with an inline OOB of `oob_bytes` and `num_sge` SGEs: the header, the OOB
/// and at least one SGE, rounded up to 32 (§3.2).
pub const fn wqe_bytes(oob_bytes: usize, num_sge: usize) -> usize {
    let sges = if num_sge == 0 { 1 } else { num_sge };
    (WQE_HEADER_BYTES + oob_bytes + SGE_BYTES * sges).div_ceil(BU_BYTES) * BU_BYTES
}

/// [`wqe_bytes`] in basic units.
pub const fn wqe_size_in_bu(oob_bytes: usize, num_sge: usize) -> u32 {
    (wqe_bytes(oob_bytes, num_sge) / BU_BYTES) as u32
}

mod hdr {
    use crate::hw::bits::Bits32;
    // Header dword 0 (§3.1).
    pub const LAST_VBYTES: Bits32 = Bits32::le(0, 31, 24);
    // Header dword 1 (§3.1).
    pub const NUM_SGE: Bits32 = Bits32::le(4, 7, 0);
    pub const INLINE_OOB_SIZE_DIV4: Bits32 = Bits32::le(4, 10, 8);
    pub const CLIENT_OOB_IN_SGL: Bits32 = Bits32::le(4, 11, 11);
    pub const CONSUME_CREDIT: Bits32 = Bits32::le(4, 12, 12);
    pub const FENCE: Bits32 = Bits32::le(4, 13, 13);
    pub const CLIENT_DATA_UNIT: Bits32 = Bits32::le(4, 29, 16);
    pub const CHECK_SN: Bits32 = Bits32::le(4, 30, 30);
    pub const SGL_DIRECT: Bits32 = Bits32::le(4, 31, 31);
}

/// The 8-byte WQE header (§3.1). Written by the driver, read by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqeHeader<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> WqeHeader<T> {
    /// A view over at least [`WQE_HEADER_BYTES`] bytes; `None` if `buf` is shorter.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= WQE_HEADER_BYTES).then_some(Self(buf))
    }
    /// The bytes under the view.
    pub fn into_inner(self) -> T {
        self.0
    }
    /// `last_vbytes` (dword 0 `[31:24]`): LSO header bytes in SGE 0; 0 for raw Ethernet.
    pub fn last_vbytes(&self) -> u8 {
        hdr::LAST_VBYTES.get(self.0.as_ref()) as u8
    }
    /// `num_sge` (dword 1 `[7:0]`).
    pub fn num_sge(&self) -> u8 {
        hdr::NUM_SGE.get(self.0.as_ref()) as u8
    }
    /// Inline OOB size in bytes (dword 1 `[10:8]` counts dwords).
    pub fn inline_oob_bytes(&self) -> usize {
        hdr::INLINE_OOB_SIZE_DIV4.get(self.0.as_ref()) as usize * 4
    }
    /// `client_oob_in_sgl` (dword 1 `[11]`).
    pub fn client_oob_in_sgl(&self) -> bool {
        hdr::CLIENT_OOB_IN_SGL.get(self.0.as_ref()) != 0
    }
    /// `consume_credit` (dword 1 `[12]`).
    pub fn consume_credit(&self) -> bool {
        hdr::CONSUME_CREDIT.get(self.0.as_ref()) != 0
    }
    /// `fence` (dword 1 `[13]`).
    pub fn fence(&self) -> bool {
        hdr::FENCE.get(self.0.as_ref()) != 0
    }
    /// `client_data_unit` (dword 1 `[29:16]`): the MSS for LSO, else 0.
    pub fn client_data_unit(&self) -> u16 {
        hdr::CLIENT_DATA_UNIT.get(self.0.as_ref()) as u16
    }
    /// `check_sn` (dword 1 `[30]`), RC only.
    pub fn check_sn(&self) -> bool {
        hdr::CHECK_SN.get(self.0.as_ref()) != 0
    }
    /// `sgl_direct` (dword 1 `[31]`).
    pub fn sgl_direct(&self) -> bool {
        hdr::SGL_DIRECT.get(self.0.as_ref()) != 0
    }
    /// Size of the whole WQE this header describes, in bytes (§10 item 4).
    pub fn wqe_bytes(&self) -> usize {
        wqe_bytes(self.inline_oob_bytes(), self.num_sge() as usize)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> WqeHeader<T> {
    /// Writes a raw-Ethernet header: `num_sge` entries after an inline OOB of `oob_bytes`
    /// (8 or 24); every other field 0 (§3.1 "raw-Ethernet use").
    #[inline]
    pub fn init(&mut self, oob_bytes: usize, num_sge: u8) {
        let dw1 = hdr::INLINE_OOB_SIZE_DIV4.insert(
            hdr::NUM_SGE.insert(0, u32::from(num_sge)),
            (oob_bytes / 4) as u32,
        );
        let b = self.0.as_mut();
        set_le32(b, 0, 0);
        set_le32(b, 4, dw1);
    }
    /// Sets `last_vbytes`.
    pub fn set_last_vbytes(&mut self, v: u8) {
        hdr::LAST_VBYTES.set(self.0.as_mut(), u32::from(v));
    }
    /// Sets `client_oob_in_sgl`.
    pub fn set_client_oob_in_sgl(&mut self, v: bool) {
        hdr::CLIENT_OOB_IN_SGL.set(self.0.as_mut(), u32::from(v));
    }
    /// Sets `client_data_unit` (14 bits).
    pub fn set_client_data_unit(&mut self, v: u16) {
        hdr::CLIENT_DATA_UNIT.set(self.0.as_mut(), u32::from(v));
    }
}

/// One SGL entry (§3.1): `{address u64, mem_key u32, size u32}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Sge<T> {
    /// A view over at least [`SGE_BYTES`] bytes; `None` if `buf` is shorter.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= SGE_BYTES).then_some(Self(buf))
    }
    /// Process virtual address of the data (user MR: IOVA = VA, §1.9).
    pub fn address(&self) -> Iova {
        Iova(le64(self.0.as_ref(), 0))
    }
    /// Memory key (the MR's lkey).
    pub fn mem_key(&self) -> Lkey {
        Lkey(le32(self.0.as_ref(), 8))
    }
    /// Length in bytes.
    pub fn size(&self) -> u32 {
        le32(self.0.as_ref(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Sge<T> {
    /// Writes all three fields.
    #[inline]
    pub fn set(&mut self, address: Iova, mem_key: Lkey, size: u32) {
        let b = self.0.as_mut();
        set_le64(b, 0, address.0);
        set_le32(b, 8, mem_key.0);
        set_le32(b, 12, size);
    }
}

/// An SGE's second 8-byte word in native order (a ring store writes it `to_le()`, as the
/// device reads it): the key, then the size.
#[inline]
pub fn sge_key_size(mem_key: Lkey, size: u32) -> u64 {
    u64::from(mem_key.0) | (u64::from(size) << 32)
}

/// `packet_format` of a TX OOB (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxPacketFormat {
    /// 8-byte OOB.
    Short = 0,
    /// 24-byte OOB (VLAN insertion, 12-bit vPort offset).
    Long = 1,
}

mod txo {
    use crate::hw::bits::Bits32;
    // Dword 0 (§4.1).
    pub const PACKET_FORMAT: Bits32 = Bits32::le(0, 1, 0);
    pub const IS_OUTER_IPV4: Bits32 = Bits32::le(0, 2, 2);
    pub const IS_OUTER_IPV6: Bits32 = Bits32::le(0, 3, 3);
    pub const COMP_IPHDR_CSUM: Bits32 = Bits32::le(0, 4, 4);
    pub const COMP_TCP_CSUM: Bits32 = Bits32::le(0, 5, 5);
    pub const COMP_UDP_CSUM: Bits32 = Bits32::le(0, 6, 6);
    pub const SUPPRESS_TXCQE_GEN: Bits32 = Bits32::le(0, 7, 7);
    pub const VCQ_NUM: Bits32 = Bits32::le(0, 31, 8);
    // Dword 1 (§4.1).
    pub const TRANS_OFF: Bits32 = Bits32::le(4, 9, 0);
    pub const VSQ_FRAME: Bits32 = Bits32::le(4, 23, 10);
    pub const SHORT_VP_OFFSET: Bits32 = Bits32::le(4, 31, 24);
    // Dword 2, long format only (§4.2).
    pub const IS_ENCAP: Bits32 = Bits32::le(8, 0, 0);
    pub const INNER_IS_IPV6: Bits32 = Bits32::le(8, 1, 1);
    pub const INNER_TCP_OPT: Bits32 = Bits32::le(8, 2, 2);
    pub const INJECT_VLAN_PRI_TAG: Bits32 = Bits32::le(8, 3, 3);
    pub const PCP: Bits32 = Bits32::le(8, 18, 16);
    pub const DEI: Bits32 = Bits32::le(8, 19, 19);
    pub const VLAN_ID: Bits32 = Bits32::le(8, 31, 20);
    // Dword 3, long format only (§4.2).
    pub const INNER_FRAME_OFFSET: Bits32 = Bits32::le(12, 9, 0);
    pub const INNER_IP_REL_OFFSET: Bits32 = Bits32::le(12, 15, 10);
    pub const LONG_VP_OFFSET: Bits32 = Bits32::le(12, 27, 16);
}

/// `VSQ_frame` of a TX OOB: bits `[23:10]` of the SQ id (§4.1).
pub const fn vsq_frame(sq_id: u32) -> u32 {
    (sq_id >> 10) & 0x3fff
}

/// The TX client OOB (§4.1 short, §4.2 long). Dwords 2..5 exist only in the long format; the
/// long-only accessors return 0 / do nothing on an 8-byte view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxOob<T: AsRef<[u8]>>(T);

macro_rules! tx_flag {
    ($get:ident, $f:ident, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> bool {
            txo::$f.get(self.0.as_ref()) != 0
        }
    };
}

impl<T: AsRef<[u8]>> TxOob<T> {
    /// A view over an 8-byte (short) or 24-byte (long) OOB; `None` if `buf` is shorter than 8.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= super::wqe::SHORT_OOB_BYTES).then_some(Self(buf))
    }
    fn is_long_view(&self) -> bool {
        self.0.as_ref().len() >= LONG_OOB_BYTES
    }
    /// `packet_format` (dword 0 `[1:0]`).
    pub fn packet_format(&self) -> TxPacketFormat {
        if txo::PACKET_FORMAT.get(self.0.as_ref()) == 1 {
            TxPacketFormat::Long
        } else {
            TxPacketFormat::Short
        }
    }
    tx_flag!(
        is_outer_ipv4,
        IS_OUTER_IPV4,
        "`is_outer_ipv4` (dword 0 `[2]`)."
    );
    tx_flag!(
        is_outer_ipv6,
        IS_OUTER_IPV6,
        "`is_outer_ipv6` (dword 0 `[3]`)."
    );
    tx_flag!(
        comp_iphdr_csum,
        COMP_IPHDR_CSUM,
        "Compute the IPv4 header checksum (dword 0 `[4]`)."
    );
    tx_flag!(
        comp_tcp_csum,
        COMP_TCP_CSUM,
        "Compute the TCP checksum (dword 0 `[5]`)."
    );
    tx_flag!(
        comp_udp_csum,
        COMP_UDP_CSUM,
        "Compute the UDP checksum (dword 0 `[6]`)."
    );
    tx_flag!(
        suppress_txcqe_gen,
        SUPPRESS_TXCQE_GEN,
        "Suppress the TX CQE on success (dword 0 `[7]`)."
    );
    /// `VCQ_number`: the CQ id of this SQ (dword 0 `[31:8]`).
    pub fn vcq_num(&self) -> u32 {
        txo::VCQ_NUM.get(self.0.as_ref())
    }
    /// Transport header offset from the frame start (dword 1 `[9:0]`).
    pub fn trans_off(&self) -> u16 {
        txo::TRANS_OFF.get(self.0.as_ref()) as u16
    }
    /// `VSQ_frame` (dword 1 `[23:10]`), see [`vsq_frame`].
    pub fn vsq_frame(&self) -> u32 {
        txo::VSQ_FRAME.get(self.0.as_ref())
    }
    /// Short vPort offset (dword 1 `[31:24]`).
    pub fn short_vp_offset(&self) -> u8 {
        txo::SHORT_VP_OFFSET.get(self.0.as_ref()) as u8
    }
    /// Long format: inject an 802.1Q tag (dword 2 `[3]`).
    pub fn inject_vlan_pri_tag(&self) -> bool {
        self.is_long_view() && txo::INJECT_VLAN_PRI_TAG.get(self.0.as_ref()) != 0
    }
    /// Long format: `is_encapsulated` (dword 2 `[0]`).
    pub fn is_encap(&self) -> bool {
        self.is_long_view() && txo::IS_ENCAP.get(self.0.as_ref()) != 0
    }
    /// Long format: `inner_is_ipv6` (dword 2 `[1]`).
    pub fn inner_is_ipv6(&self) -> bool {
        self.is_long_view() && txo::INNER_IS_IPV6.get(self.0.as_ref()) != 0
    }
    /// Long format: `inner_tcp_options_present` (dword 2 `[2]`).
    pub fn inner_tcp_opt(&self) -> bool {
        self.is_long_view() && txo::INNER_TCP_OPT.get(self.0.as_ref()) != 0
    }
    /// Long format: the 802.1Q TCI to insert, `(pcp, dei, vlan_id)` (dword 2 `[18:16]`,
    /// `[19]`, `[31:20]`).
    pub fn vlan(&self) -> (u8, bool, u16) {
        if !self.is_long_view() {
            return (0, false, 0);
        }
        let b = self.0.as_ref();
        (
            txo::PCP.get(b) as u8,
            txo::DEI.get(b) != 0,
            txo::VLAN_ID.get(b) as u16,
        )
    }
    /// Long format: inner frame offset (dword 3 `[9:0]`).
    pub fn inner_frame_offset(&self) -> u16 {
        if self.is_long_view() {
            txo::INNER_FRAME_OFFSET.get(self.0.as_ref()) as u16
        } else {
            0
        }
    }
    /// Long format: inner IP header relative offset (dword 3 `[15:10]`).
    pub fn inner_ip_rel_offset(&self) -> u8 {
        if self.is_long_view() {
            txo::INNER_IP_REL_OFFSET.get(self.0.as_ref()) as u8
        } else {
            0
        }
    }
    /// Long format: 12-bit vPort offset (dword 3 `[27:16]`).
    pub fn long_vp_offset(&self) -> u16 {
        if self.is_long_view() {
            txo::LONG_VP_OFFSET.get(self.0.as_ref()) as u16
        } else {
            0
        }
    }
}

/// What to put in a TX OOB; [`TxOob::write`] turns it into bytes. Fields of the long format
/// are used only when `vlan` is set (then the OOB is 24 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxOobFields {
    /// `is_outer_ipv4`.
    pub outer_ipv4: bool,
    /// `is_outer_ipv6`.
    pub outer_ipv6: bool,
    /// Compute the IPv4 header checksum.
    pub ip_csum: bool,
    /// Compute the TCP checksum (the field holds the pseudo-header sum).
    pub tcp_csum: bool,
    /// Compute the UDP checksum (the field holds the pseudo-header sum).
    pub udp_csum: bool,
    /// Suppress the TX CQE on success.
    pub suppress_cqe: bool,
    /// CQ id of the SQ.
    pub vcq_num: u32,
    /// SQ id (its bits `[23:10]` go into `VSQ_frame`).
    pub sq_id: u32,
    /// vPort offset (`tx_vp_offset` from `manadv_init_obj`).
    pub vp_offset: u16,
    /// Transport header offset (for TCP checksum / TSO).
    pub trans_off: u16,
    /// 802.1Q tag to insert: `(pcp, dei, vlan_id)`; selects the long format.
    pub vlan: Option<(u8, bool, u16)>,
}

impl TxOobFields {
    /// OOB size these fields need: 24 with a VLAN tag or a vPort offset above 255, else 8.
    pub fn oob_bytes(&self) -> usize {
        if self.vlan.is_some() || self.vp_offset > 0xff {
            LONG_OOB_BYTES
        } else {
            SHORT_OOB_BYTES
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TxOob<T> {
    /// Writes `f` into the OOB, zeroing every bit it does not set (unlike DPDK, which leaves
    /// stale stack bytes in unused fields, §4.3). The view must be [`TxOobFields::oob_bytes`]
    /// long. A vPort offset above 255 goes into the 12-bit long field (Linux's rule, §4.4);
    /// otherwise into the short field.
    ///
    /// # Panics
    /// If the view is shorter than `f.oob_bytes()`.
    #[inline]
    pub fn write(&mut self, f: &TxOobFields) {
        let long = f.oob_bytes() == LONG_OOB_BYTES;
        let [dw0, dw1] = f.first_dwords();
        let b = self.0.as_mut();
        set_le32(b, 0, dw0);
        set_le32(b, 4, dw1);
        if long {
            let mut dw2 = 0;
            if let Some((pcp, dei, vid)) = f.vlan {
                dw2 = txo::INJECT_VLAN_PRI_TAG.insert(dw2, 1);
                dw2 = txo::PCP.insert(dw2, u32::from(pcp));
                dw2 = txo::DEI.insert(dw2, u32::from(dei));
                dw2 = txo::VLAN_ID.insert(dw2, u32::from(vid));
            }
            let dw3 = if f.vp_offset > 0xff {
                txo::LONG_VP_OFFSET.insert(0, u32::from(f.vp_offset))
            } else {
                0
            };
            set_le32(b, 8, dw2);
            set_le32(b, 12, dw3);
            set_le32(b, 16, 0);
            set_le32(b, 20, 0);
        }
    }
}

impl TxOobFields {
    /// Dwords 0 and 1 of the OOB (the whole short format, §4.1), assembled in registers.
    #[inline]
    pub fn first_dwords(&self) -> [u32; 2] {
        let f = self;
        let long = f.oob_bytes() == LONG_OOB_BYTES;
        let mut dw0 = txo::PACKET_FORMAT.insert(0, u32::from(long));
        dw0 = txo::IS_OUTER_IPV4.insert(dw0, u32::from(f.outer_ipv4));
        dw0 = txo::IS_OUTER_IPV6.insert(dw0, u32::from(f.outer_ipv6));
        dw0 = txo::COMP_IPHDR_CSUM.insert(dw0, u32::from(f.ip_csum));
        dw0 = txo::COMP_TCP_CSUM.insert(dw0, u32::from(f.tcp_csum));
        dw0 = txo::COMP_UDP_CSUM.insert(dw0, u32::from(f.udp_csum));
        dw0 = txo::SUPPRESS_TXCQE_GEN.insert(dw0, u32::from(f.suppress_cqe));
        dw0 = txo::VCQ_NUM.insert(dw0, f.vcq_num);
        let mut dw1 = txo::TRANS_OFF.insert(0, u32::from(f.trans_off));
        dw1 = txo::VSQ_FRAME.insert(dw1, vsq_frame(f.sq_id));
        if f.vp_offset <= 0xff {
            dw1 = txo::SHORT_VP_OFFSET.insert(dw1, u32::from(f.vp_offset));
        }
        [dw0, dw1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const _: () = assert!(wqe_bytes(SHORT_OOB_BYTES, 1) == 32);
    const _: () = assert!(wqe_bytes(SHORT_OOB_BYTES, 2) == 64);
    const _: () = assert!(wqe_bytes(SHORT_OOB_BYTES, 3) == 64);
    const _: () = assert!(wqe_bytes(LONG_OOB_BYTES, 1) == 64);
    const _: () = assert!(wqe_bytes(LONG_OOB_BYTES, 2) == 64);
    const _: () = assert!(wqe_bytes(SHORT_OOB_BYTES, 0) == 32);
    const _: () = assert!(
        wqe_bytes(LONG_OOB_BYTES, super::super::MAX_TX_SGES) == super::super::MAX_SQ_WQE_BYTES
    );
    const _: () = assert!(
        wqe_bytes(SHORT_OOB_BYTES, super::super::MAX_RX_SGES) == super::super::MAX_RQ_WQE_BYTES
    );

    /// Header dword 1 values the spec lists (§3.1 "Typical values").
    #[test]
    fn header_typical_values_from_spec() {
        let mut b = [0xffu8; 8];
        WqeHeader::new_checked(&mut b[..])
            .unwrap()
            .init(SHORT_OOB_BYTES, 1);
        assert_eq!(b, [0, 0, 0, 0, 0x01, 0x02, 0, 0]);
        WqeHeader::new_checked(&mut b[..])
            .unwrap()
            .init(LONG_OOB_BYTES, 1);
        assert_eq!(b, [0, 0, 0, 0, 0x01, 0x06, 0, 0]);
        let h = WqeHeader::new_checked(&b[..]).unwrap();
        assert_eq!(
            (h.num_sge(), h.inline_oob_bytes(), h.wqe_bytes()),
            (1, 24, 64)
        );
    }

    #[test]
    fn sge_layout_from_spec_table() {
        let mut b = [0u8; 16];
        Sge::new_checked(&mut b[..]).unwrap().set(
            Iova(0x1122_3344_5566_7788),
            Lkey(0xaabb_ccdd),
            60,
        );
        assert_eq!(
            b,
            [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xdd, 0xcc, 0xbb, 0xaa, 60, 0, 0, 0]
        );
    }

    /// Short OOB, hand-assembled from the §4.1 table: format 0, ipv4 (bit 2), ip csum (bit 4),
    /// udp csum (bit 6) = 0x54; VCQ 0x098765 in [31:8]; VSQ_frame = 0x012345 >> 10 = 0x48 in
    /// [23:10] = 0x12000; short vPort offset 5 in [31:24].
    #[test]
    fn short_oob_bytes_from_spec_table() {
        let mut b = [0xeeu8; 8];
        let f = TxOobFields {
            outer_ipv4: true,
            ip_csum: true,
            udp_csum: true,
            vcq_num: 0x09_8765,
            sq_id: 0x01_2345,
            vp_offset: 5,
            ..Default::default()
        };
        assert_eq!(f.oob_bytes(), 8);
        TxOob::new_checked(&mut b[..]).unwrap().write(&f);
        assert_eq!(b, [0x54, 0x65, 0x87, 0x09, 0x00, 0x20, 0x01, 0x05]);
    }

    proptest! {
        #[test]
        fn tx_oob_round_trips(
            v4 in any::<bool>(), v6 in any::<bool>(), ip in any::<bool>(), tcp in any::<bool>(), udp in any::<bool>(),
            sup in any::<bool>(), vcq in 0u32..(1 << 24), sq in 0u32..(1 << 24), vp in 0u16..4096, toff in 0u16..1024,
            vlan in proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
        ) {
            let f = TxOobFields { outer_ipv4: v4, outer_ipv6: v6, ip_csum: ip, tcp_csum: tcp, udp_csum: udp,
                suppress_cqe: sup, vcq_num: vcq, sq_id: sq, vp_offset: vp, trans_off: toff, vlan };
            let mut b = [0xa5u8; 24];
            let n = f.oob_bytes();
            TxOob::new_checked(&mut b[..n]).unwrap().write(&f);
            let o = TxOob::new_checked(&b[..n]).unwrap();
            prop_assert_eq!(o.packet_format() == TxPacketFormat::Long, n == 24);
            prop_assert_eq!((o.is_outer_ipv4(), o.is_outer_ipv6(), o.comp_iphdr_csum(), o.comp_tcp_csum(), o.comp_udp_csum()), (v4, v6, ip, tcp, udp));
            prop_assert_eq!(o.suppress_txcqe_gen(), sup);
            prop_assert_eq!(o.vcq_num(), vcq);
            prop_assert_eq!(o.vsq_frame(), vsq_frame(sq));
            prop_assert_eq!(o.trans_off(), toff);
            if vp <= 0xff { prop_assert_eq!(u16::from(o.short_vp_offset()), vp); } else { prop_assert_eq!(o.long_vp_offset(), vp); }
            prop_assert_eq!(o.inject_vlan_pri_tag(), vlan.is_some());
            if let Some(v) = vlan { prop_assert_eq!(o.vlan(), v); }
            // Bytes past the OOB are untouched.
            prop_assert!(b[n..].iter().all(|&x| x == 0xa5));
        }
    }
}
