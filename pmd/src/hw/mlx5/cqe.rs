//! CQE64 (§5.1), the owner rule (§5.2), error CQEs (§5.3) and mini CQEs of compressed
//! sessions (§6.1–6.2). Written by the device, read by the driver: setters exist only for the
//! device model and tests.
#![forbid(unsafe_code)]

use super::{CQE_BYTES, MINI_CQE_BYTES};
use crate::hw::bits::{be16, be32, be64};
#[cfg(any(test, feature = "emu"))]
use crate::hw::bits::{set_be16, set_be32, set_be64};

/// Offset of `op_own` (byte 63).
pub const OP_OWN: usize = 63;

crate::enum_with_unknown! {
    /// CQE opcodes (`op_own[7:4]`, §5.1).
    pub enum CqeOpcode(u8) {
        /// A send WQE completed (TX).
        Req = 0,
        /// A packet was received (every Ethernet packet).
        RespSend = 2,
        /// Requester error (TX).
        ReqErr = 13,
        /// Responder error (RX).
        RespErr = 14,
        /// Never written by the device; software poisons consumed slots with it.
        Invalid = 15,
    }
}

crate::enum_with_unknown! {
    /// CQE formats (`op_own[3:2]`, §5.1).
    pub enum CqeFormat(u8) {
        /// A normal CQE.
        Normal = 0,
        /// 32 bytes of data scattered into the CQE (not expected on Ethernet RQs).
        Scatter32 = 1,
        /// 64 bytes scattered (128-byte CQEs).
        Scatter64 = 2,
        /// The title of a compressed session (§6.2).
        Compressed = 3,
    }
}

crate::enum_with_unknown! {
    /// Error CQE syndromes (byte 55, §5.3).
    pub enum Syndrome(u8) {
        /// Local length error (a packet larger than the posted buffer).
        LocalLength = 0x01,
        /// Local QP operation error (a malformed WQE).
        LocalQpOp = 0x02,
        /// Local protection error (a bad memory key or range).
        LocalProt = 0x04,
        /// Work request flushed (the queue is in error).
        WrFlush = 0x05,
        /// Memory window bind error.
        MwBind = 0x06,
        /// Bad response.
        BadResp = 0x10,
        /// Local access error.
        LocalAccess = 0x11,
        /// Remote invalid request.
        RemoteInvalReq = 0x12,
        /// Remote access error.
        RemoteAccess = 0x13,
        /// Remote operation error.
        RemoteOp = 0x14,
        /// Transport retry counter exceeded.
        TransportRetryExc = 0x15,
        /// RNR retry counter exceeded.
        RnrRetryExc = 0x16,
        /// Remote aborted.
        RemoteAborted = 0x22,
    }
}

/// `op_own` for `opcode`, `format`, and the owner bit of lap `lap` (§5.2).
pub const fn op_own(opcode: u8, format: u8, owner: bool) -> u8 {
    (opcode << 4) | ((format & 3) << 2) | owner as u8
}

/// Whether the entry at consumer counter `ci` of a CQ of `count` entries (a power of two) is
/// software's: opcode not INVALID and owner bit equal to the lap parity of `ci` (§5.2).
#[inline]
pub const fn sw_owned(op_own: u8, ci: u32, count: u32) -> bool {
    // The lap parity, `(ci / count) & 1`, is bit log2(count) of `ci`: no division.
    (op_own >> 4) != 15 && (op_own & 1 != 0) == (ci & count != 0)
}

/// `rx_hash_type` bits (byte 16, §5.1).
pub mod hash_type {
    /// L3 hashed: IPv4.
    pub const IPV4: u8 = 0x01 << 2;
    /// L3 hashed: IPv6.
    pub const IPV6: u8 = 0x02 << 2;
    /// L4 hashed: TCP.
    pub const TCP: u8 = 0x01 << 6;
    /// L4 hashed: UDP.
    pub const UDP: u8 = 0x02 << 6;
}

/// `hds_ip_ext` bits (byte 28).
pub mod csum_ok {
    /// L2 OK.
    pub const L2: u8 = 1 << 0;
    /// L3 (IPv4 header checksum) OK.
    pub const L3: u8 = 1 << 1;
    /// L4 checksum OK.
    pub const L4: u8 = 1 << 2;
}

/// `l4_l3_hdr_type` fields (byte 29).
pub mod hdr_type {
    /// A C-VLAN tag was present (and stripped: `vlan_info` holds it).
    pub const CVLAN: u8 = 1 << 0;
    /// L3 type `[3:2]`: IPv6.
    pub const L3_IPV6: u8 = 1 << 2;
    /// L3 type `[3:2]`: IPv4.
    pub const L3_IPV4: u8 = 2 << 2;
    /// L4 type `[6:4]`: TCP (no ACK).
    pub const L4_TCP: u8 = 1 << 4;
    /// L4 type: UDP.
    pub const L4_UDP: u8 = 2 << 4;
    /// L4 type: TCP ACK without data.
    pub const L4_TCP_ACK_NO_DATA: u8 = 3 << 4;
    /// L4 type: TCP ACK with data.
    pub const L4_TCP_ACK_DATA: u8 = 4 << 4;
    /// IP fragment.
    pub const FRAG: u8 = 1 << 7;
}

/// Offset of `rx_hash_res` (big-endian 32 bits).
pub const RX_HASH_RES: usize = 12;
/// Offset of `rx_hash_type` ([`hash_type`]).
pub const RX_HASH_TYPE: usize = 16;
const CSUM: usize = 20;
/// Offset of `hds_ip_ext` ([`csum_ok`]); `l4_l3_hdr_type` and `vlan_info` (big-endian) follow it in the same dword.
pub const HDS_IP_EXT: usize = 28;
const L4_L3_HDR_TYPE: usize = 29;
const VLAN_INFO: usize = 30;
const LRO_NUM_SEG: usize = 32;
const METADATA: usize = 36;
/// Offset of `byte_cnt` (big-endian 32 bits).
pub const BYTE_CNT: usize = 44;
const TIMESTAMP: usize = 48;
const SOP_DROP_QPN: usize = 56;
const WQE_COUNTER: usize = 60;
const WQE_ID: usize = 2;
const VENDOR_ERR_SYND: usize = 54;
const SYNDROME: usize = 55;

/// A 64-byte CQE (§5.1; error CQEs share it, §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Cqe<T> {
    /// A view over at least [`CQE_BYTES`] bytes.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= CQE_BYTES).then_some(Self(buf))
    }
    /// The bytes under the view.
    pub fn into_inner(self) -> T {
        self.0
    }
    /// `op_own`.
    #[inline]
    pub fn op_own(&self) -> u8 {
        self.0.as_ref()[OP_OWN]
    }
    /// Opcode.
    #[inline]
    pub fn opcode(&self) -> CqeOpcode {
        CqeOpcode::from(self.op_own() >> 4)
    }
    /// Format.
    #[inline]
    pub fn format(&self) -> CqeFormat {
        CqeFormat::from((self.op_own() >> 2) & 3)
    }
    /// Owner bit.
    #[inline]
    pub fn owner(&self) -> bool {
        self.op_own() & 1 != 0
    }
    /// `wqe_id` (MPRQ: the WQE counter).
    #[inline]
    pub fn wqe_id(&self) -> u16 {
        be16(self.0.as_ref(), WQE_ID)
    }
    /// RSS hash result.
    #[inline]
    pub fn rx_hash_res(&self) -> u32 {
        be32(self.0.as_ref(), RX_HASH_RES)
    }
    /// RSS hash type ([`hash_type`]).
    #[inline]
    pub fn rx_hash_type(&self) -> u8 {
        self.0.as_ref()[RX_HASH_TYPE]
    }
    /// Raw L4 checksum the device computed.
    #[inline]
    pub fn csum(&self) -> u16 {
        be16(self.0.as_ref(), CSUM)
    }
    /// Checksum-OK bits ([`csum_ok`]).
    #[inline]
    pub fn hds_ip_ext(&self) -> u8 {
        self.0.as_ref()[HDS_IP_EXT]
    }
    /// Header types and the VLAN-present bit ([`hdr_type`]).
    #[inline]
    pub fn l4_l3_hdr_type(&self) -> u8 {
        self.0.as_ref()[L4_L3_HDR_TYPE]
    }
    /// The VLAN info field whole (the stripped TCI where [`hdr_type::CVLAN`] is set).
    #[inline]
    pub fn vlan_info(&self) -> u16 {
        be16(self.0.as_ref(), VLAN_INFO)
    }
    /// The stripped VLAN TCI, when a C-VLAN was present.
    #[inline]
    pub fn vlan(&self) -> Option<u16> {
        (self.l4_l3_hdr_type() & hdr_type::CVLAN != 0).then(|| be16(self.0.as_ref(), VLAN_INFO))
    }
    /// LRO segments (0 without LRO).
    #[inline]
    pub fn lro_num_seg(&self) -> u8 {
        self.0.as_ref()[LRO_NUM_SEG]
    }
    /// RX flow metadata.
    #[inline]
    pub fn metadata(&self) -> u32 {
        be32(self.0.as_ref(), METADATA)
    }
    /// `byte_cnt`: RX packet length; MPRQ packed (see `wqe::mprq_byte_cnt`); compressed
    /// title: the session's completion count.
    #[inline]
    pub fn byte_cnt(&self) -> u32 {
        be32(self.0.as_ref(), BYTE_CNT)
    }
    /// Timestamp.
    #[inline]
    pub fn timestamp(&self) -> u64 {
        be64(self.0.as_ref(), TIMESTAMP)
    }
    /// TX: the completed WQE's opcode (byte 56).
    #[inline]
    pub fn sop(&self) -> u8 {
        self.0.as_ref()[SOP_DROP_QPN]
    }
    /// TX: the SQ number; RX: the flow tag (24 bits).
    #[inline]
    pub fn qpn_or_flow_tag(&self) -> u32 {
        be32(self.0.as_ref(), SOP_DROP_QPN) & 0x00ff_ffff
    }
    /// TX: the WQE index of the completed WQE; RX: the RQ WQE counter; MPRQ: stride index.
    #[inline]
    pub fn wqe_counter(&self) -> u16 {
        be16(self.0.as_ref(), WQE_COUNTER)
    }
    /// Error CQE: the syndrome.
    #[inline]
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from(self.0.as_ref()[SYNDROME])
    }
    /// Error CQE: the vendor syndrome.
    #[inline]
    pub fn vendor_err_synd(&self) -> u8 {
        self.0.as_ref()[VENDOR_ERR_SYND]
    }
    /// The mini CQE `i` (0..8) of this slot, read as a mini-CQE array (§6.2).
    pub fn mini(&self, i: usize) -> MiniCqe<&[u8]> {
        let o = (i % super::MINIS_PER_ARRAY) * MINI_CQE_BYTES;
        MiniCqe(&self.0.as_ref()[o..o + MINI_CQE_BYTES])
    }
}

/// What a CQE written by the device model says (every other byte 0).
#[cfg(any(test, feature = "emu"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CqeFields {
    /// Opcode (`CqeOpcode` value).
    pub opcode: u8,
    /// Format (`CqeFormat` value).
    pub format: u8,
    /// Owner bit.
    pub owner: bool,
    /// RSS hash result.
    pub rx_hash_res: u32,
    /// RSS hash type.
    pub rx_hash_type: u8,
    /// Checksum-OK bits.
    pub hds_ip_ext: u8,
    /// Header types and VLAN bit.
    pub l4_l3_hdr_type: u8,
    /// Stripped VLAN TCI.
    pub vlan_info: u16,
    /// `byte_cnt`.
    pub byte_cnt: u32,
    /// Timestamp.
    pub timestamp: u64,
    /// Byte 56 (TX: WQE opcode).
    pub sop: u8,
    /// Bytes 57–59 (TX: SQ number; RX: flow tag).
    pub qpn: u32,
    /// WQE counter (MPRQ: the stride index where the packet starts).
    pub wqe_counter: u16,
    /// `wqe_id` (bytes 2–3; MPRQ: the WQE counter, §4.2).
    pub wqe_id: u16,
    /// Error CQE: syndrome.
    pub syndrome: u8,
    /// Error CQE: vendor syndrome.
    pub vendor_err_synd: u8,
}

#[cfg(any(test, feature = "emu"))]
impl<T: AsRef<[u8]> + AsMut<[u8]>> Cqe<T> {
    /// Writes a whole CQE from `f`, `op_own` last (the device makes it visible last; the
    /// caller orders the store with a release barrier).
    pub fn write(&mut self, f: &CqeFields) {
        let b = self.0.as_mut();
        b[..CQE_BYTES].fill(0);
        set_be16(b, WQE_ID, f.wqe_id);
        set_be32(b, RX_HASH_RES, f.rx_hash_res);
        b[RX_HASH_TYPE] = f.rx_hash_type;
        b[HDS_IP_EXT] = f.hds_ip_ext;
        b[L4_L3_HDR_TYPE] = f.l4_l3_hdr_type;
        set_be16(b, VLAN_INFO, f.vlan_info);
        set_be32(b, BYTE_CNT, f.byte_cnt);
        set_be64(b, TIMESTAMP, f.timestamp);
        set_be32(
            b,
            SOP_DROP_QPN,
            (u32::from(f.sop) << 24) | (f.qpn & 0x00ff_ffff),
        );
        set_be16(b, WQE_COUNTER, f.wqe_counter);
        b[VENDOR_ERR_SYND] = f.vendor_err_synd;
        b[SYNDROME] = f.syndrome;
        b[OP_OWN] = op_own(f.opcode, f.format, f.owner);
    }
    /// Writes mini CQE `i` (0..8) of this slot as a mini-CQE array: `word0` is bytes 0–3
    /// (HASH: the hash; CSUM_STRIDX: checksum << 16 | stride index, see [`MiniCqe::stridx_word`]).
    pub fn set_mini(&mut self, i: usize, word0: u32, byte_cnt: u32) {
        let o = (i % super::MINIS_PER_ARRAY) * MINI_CQE_BYTES;
        let b = self.0.as_mut();
        set_be32(b, o, word0);
        set_be32(b, o + 4, byte_cnt);
    }
    /// Sets `op_own` (software poisons consumed slots with opcode 15, §6.2).
    pub fn set_op_own(&mut self, v: u8) {
        self.0.as_mut()[OP_OWN] = v;
    }
}

crate::enum_with_unknown! {
    /// Mini CQE formats (`mini_cqe_res_format`, PRM values, §6.1), chosen per CQ at creation
    /// (`mlx5dv_create_cq`'s `cqe_comp_res_format` HASH / CSUM / CSUM_STRIDX map to 0 / 1 / 3,
    /// §1.4).
    pub enum MiniCqeFormat(u8) {
        /// Bytes 0–3 the RSS hash result, 4–7 the byte count.
        Hash = 0,
        /// Bytes 0–1 the checksum, 4–7 the byte count.
        Csum = 1,
        /// Bytes 0–1 the flow tag's low 16 bits, 2–3 the stride index, 4 the tag's high 8
        /// bits, 5–7 the byte count (DevX only).
        FtagStridx = 2,
        /// Bytes 0–1 the checksum, 2–3 the stride index, 4–7 the (MPRQ packed) byte count.
        CsumStridx = 3,
    }
}

/// A mini CQE (8 bytes, §6.1): bytes 0–3 depend on the CQ's mini format (HASH: the RSS hash;
/// CSUM: the checksum in bytes 0–1; *_STRIDX: bytes 2–3 the stride index), bytes 4–7 the byte
/// count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MiniCqe<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> MiniCqe<T> {
    /// A view over at least [`MINI_CQE_BYTES`] bytes.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= MINI_CQE_BYTES).then_some(Self(buf))
    }
    /// HASH format: the RSS hash result.
    pub fn rx_hash_result(&self) -> u32 {
        be32(self.0.as_ref(), 0)
    }
    /// CSUM formats: the checksum.
    pub fn checksum(&self) -> u16 {
        be16(self.0.as_ref(), 0)
    }
    /// *_STRIDX formats: the stride index.
    pub fn stride_idx(&self) -> u16 {
        be16(self.0.as_ref(), 2)
    }
    /// The byte count.
    #[inline]
    pub fn byte_cnt(&self) -> u32 {
        be32(self.0.as_ref(), 4)
    }
    /// Bytes 0–3 as one big-endian word (the HASH format's hash).
    pub fn word0(&self) -> u32 {
        be32(self.0.as_ref(), 0)
    }
    /// Bytes 0–3 of a CSUM_STRIDX mini: `checksum` in bytes 0–1, `stride_idx` in bytes 2–3.
    pub const fn stridx_word(checksum: u16, stride_idx: u16) -> u32 {
        ((checksum as u32) << 16) | stride_idx as u32
    }
}

/// Where mini CQE `i` of a basic-layout session whose title is at slot `t` lives: (slot, entry)
/// — array 0 at `t + 1`, array `k ≥ 1` at `t + 8k` (§6.2).
pub const fn mini_slot(t: u32, i: u32) -> (u32, usize) {
    let k = i / super::MINIS_PER_ARRAY as u32;
    let slot = if k == 0 { t + 1 } else { t + 8 * k };
    (slot, (i % super::MINIS_PER_ARRAY as u32) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_follows_the_lap_parity_and_invalid_is_never_software_s() {
        // A CQ of 8: lap 0 wants owner 0, lap 1 owner 1.
        assert!(sw_owned(op_own(2, 0, false), 3, 8));
        assert!(!sw_owned(op_own(2, 0, true), 3, 8));
        assert!(sw_owned(op_own(0, 0, true), 8 + 3, 8));
        assert!(!sw_owned(op_own(15, 0, false), 3, 8));
        assert_eq!(op_own(2, 3, true), 0x2d);
    }

    #[test]
    fn mini_arrays_sit_at_title_plus_one_then_every_eighth_slot() {
        assert_eq!(mini_slot(100, 0), (101, 0));
        assert_eq!(mini_slot(100, 7), (101, 7));
        assert_eq!(mini_slot(100, 8), (108, 0));
        assert_eq!(mini_slot(100, 17), (116, 1));
    }

    #[test]
    fn a_written_cqe_reads_back() {
        let mut b = [0xaau8; 64];
        let f = CqeFields {
            opcode: 2,
            owner: true,
            rx_hash_res: 0xdead_beef,
            rx_hash_type: hash_type::IPV4 | hash_type::UDP,
            hds_ip_ext: csum_ok::L3 | csum_ok::L4,
            l4_l3_hdr_type: hdr_type::CVLAN | hdr_type::L3_IPV4 | hdr_type::L4_UDP,
            vlan_info: 100,
            byte_cnt: 60,
            qpn: 0x12_3456,
            wqe_counter: 0x0102,
            ..Default::default()
        };
        let mut c = Cqe::new_checked(&mut b[..]).unwrap();
        c.write(&f);
        let c = Cqe::new_checked(&b[..]).unwrap();
        assert_eq!(c.opcode(), CqeOpcode::RespSend);
        assert_eq!(c.format(), CqeFormat::Normal);
        assert!(c.owner());
        assert_eq!(c.rx_hash_res(), 0xdead_beef);
        assert_eq!(c.vlan(), Some(100));
        assert_eq!(c.byte_cnt(), 60);
        assert_eq!(c.qpn_or_flow_tag(), 0x12_3456);
        assert_eq!(c.wqe_counter(), 0x0102);
        assert_eq!(b[63], 0x21);
    }
}
