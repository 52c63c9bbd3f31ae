//! Send and receive WQE segments (§2.2–2.4, §4): the 16-byte control segment, the Ethernet
//! segment with its inline header, pointer ("gather") data segments and inline data segments.
//! Written by the driver, read by the device.
#![forbid(unsafe_code)]

use super::{Opcode, DS_BYTES};
use crate::hw::bits::{be16, be32, be64, set_be16, set_be32, set_be64};
use mempool::{Iova, Lkey};

/// Size of a control, Ethernet (without its inline tail) or data segment.
pub const SEG_BYTES: usize = DS_BYTES;
/// `fm_ce_se` CE value "CQE only on error" (§2.2).
pub const CE_ERROR_ONLY: u8 = 0;
/// CE "CQE only on first error": DPDK's choice for WQEs that need no completion (byte 0x04).
pub const CE_FIRST_ERROR: u8 = 1;
/// CE "always generate a CQE" (`MLX5_WQE_CTRL_CQ_UPDATE`, byte 0x08).
pub const CE_ALWAYS: u8 = 2;
/// `cs_flags`: L3 (IPv4 header) checksum (§2.3).
pub const CS_L3: u8 = 0x40;
/// `cs_flags`: L4 (TCP/UDP) checksum, also for TSO.
pub const CS_L4: u8 = 0x80;
/// `cs_flags`: inner L3 checksum (tunnels).
pub const CS_INNER_L3: u8 = 0x10;
/// `cs_flags`: inner L4 checksum (tunnels).
pub const CS_INNER_L4: u8 = 0x20;
/// `inline_hdr_sz` value that makes bytes 14–15 of the Ethernet segment a VLAN TCI to insert
/// (§2.3).
pub const VLAN_INSERT_CMD: u16 = 0x8000;
/// Inline data segment marker in its first dword (`MLX5_INLINE_SEG`, §2.4).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// The lkey of unused trailing RX scatter entries (§4.1).
pub const INVALID_LKEY: Lkey = Lkey(0x100);

mod ctrl {
    use crate::hw::bits::Bits32;
    pub const OPMOD: Bits32 = Bits32::be(0, 31, 24);
    pub const WQE_INDEX: Bits32 = Bits32::be(0, 23, 8);
    pub const OPCODE: Bits32 = Bits32::be(0, 7, 0);
    pub const QPN: Bits32 = Bits32::be(4, 31, 8);
    pub const DS: Bits32 = Bits32::be(4, 5, 0);
    pub const FENCE: Bits32 = Bits32::be(8, 7, 5);
    pub const CE: Bits32 = Bits32::be(8, 3, 2);
    pub const SE: Bits32 = Bits32::be(8, 1, 1);
}

/// The control segment at offset 0 of every send WQE (§2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlSeg<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> CtrlSeg<T> {
    /// A view over at least [`SEG_BYTES`] bytes; `None` if `buf` is shorter.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= SEG_BYTES).then_some(Self(buf))
    }
    /// The bytes under the view.
    pub fn into_inner(self) -> T {
        self.0
    }
    /// Opcode modifier (`[31:24]` of dword 0).
    pub fn opmod(&self) -> u8 {
        ctrl::OPMOD.get(self.0.as_ref()) as u8
    }
    /// WQE index: the producer counter of the WQE's first WQEBB (16 bits, unmasked).
    pub fn wqe_index(&self) -> u16 {
        ctrl::WQE_INDEX.get(self.0.as_ref()) as u16
    }
    /// Opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from(ctrl::OPCODE.get(self.0.as_ref()) as u8)
    }
    /// SQ (QP) number, 24 bits.
    pub fn qpn(&self) -> u32 {
        ctrl::QPN.get(self.0.as_ref())
    }
    /// Size of the WQE in 16-byte units, this segment included.
    pub fn ds(&self) -> u8 {
        ctrl::DS.get(self.0.as_ref()) as u8
    }
    /// Fence mode (`fm_ce_se[7:5]`).
    pub fn fence(&self) -> u8 {
        ctrl::FENCE.get(self.0.as_ref()) as u8
    }
    /// Completion mode (`fm_ce_se[3:2]`): [`CE_ALWAYS`] asks for a CQE.
    pub fn ce(&self) -> u8 {
        ctrl::CE.get(self.0.as_ref()) as u8
    }
    /// Solicited event (`fm_ce_se[1]`).
    pub fn se(&self) -> bool {
        ctrl::SE.get(self.0.as_ref()) != 0
    }
    /// The immediate dword (0 for Ethernet).
    pub fn imm(&self) -> u32 {
        be32(self.0.as_ref(), 12)
    }
    /// The first 8 bytes, as the UAR doorbell write copies them (§3.1 step 5).
    pub fn doorbell_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0.as_ref()[..8]);
        b
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CtrlSeg<T> {
    /// Writes the whole segment: `opcode` with `opmod`, the WQE index, the SQ number, `ds`
    /// units and the completion mode `ce`; fence, SE, signature and immediate 0.
    #[inline]
    pub fn write(&mut self, opcode: Opcode, opmod: u8, wqe_index: u16, qpn: u32, ds: u8, ce: u8) {
        let dw0 = ctrl::OPCODE.insert(
            ctrl::WQE_INDEX.insert(
                ctrl::OPMOD.insert(0, u32::from(opmod)),
                u32::from(wqe_index),
            ),
            u32::from(u8::from(opcode)),
        );
        let dw1 = ctrl::DS.insert(ctrl::QPN.insert(0, qpn), u32::from(ds));
        let b = self.0.as_mut();
        set_be32(b, 0, dw0);
        set_be32(b, 4, dw1);
        set_be32(b, 8, ctrl::CE.insert(0, u32::from(ce)));
        set_be32(b, 12, 0);
    }
    /// Sets `ds`.
    pub fn set_ds(&mut self, ds: u8) {
        ctrl::DS.set(self.0.as_mut(), u32::from(ds));
    }
    /// Sets the completion mode.
    pub fn set_ce(&mut self, ce: u8) {
        ctrl::CE.set(self.0.as_mut(), u32::from(ce));
    }
}

/// Units an Ethernet segment with `inline_hdr_sz` inline header bytes occupies: 1 up to 2
/// bytes (they fit `inline_hdr_start`), then one more per started 16 bytes (§2.3).
pub const fn eth_seg_units(inline_hdr_sz: usize) -> usize {
    if inline_hdr_sz <= 2 {
        1
    } else {
        1 + (inline_hdr_sz - 2).div_ceil(DS_BYTES)
    }
}

/// Units of an inline data segment carrying `len` bytes (§2.4).
pub const fn inline_seg_units(len: usize) -> usize {
    (4 + len).div_ceil(DS_BYTES)
}

const ES_CS_FLAGS: usize = 4;
const ES_MSS: usize = 6;
const ES_METADATA: usize = 8;
const ES_INLINE_SZ: usize = 12;
/// Offset of the inline header's first two bytes in the Ethernet segment.
pub const ES_INLINE_START: usize = 14;

/// The Ethernet segment (§2.3): checksum flags, TSO `mss`, metadata, and the inline header
/// (its first two bytes here, the rest in the units that follow, through [`EthSeg::inline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthSeg<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> EthSeg<T> {
    /// A view over at least [`SEG_BYTES`] bytes (more when an inline header follows).
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= SEG_BYTES).then_some(Self(buf))
    }
    /// The bytes under the view.
    pub fn into_inner(self) -> T {
        self.0
    }
    /// Software-parser offsets (0 unless SWP is used).
    pub fn swp_offs(&self) -> u32 {
        be32(self.0.as_ref(), 0)
    }
    /// Checksum flags ([`CS_L3`], [`CS_L4`], ...).
    pub fn cs_flags(&self) -> u8 {
        self.0.as_ref()[ES_CS_FLAGS]
    }
    /// TSO segment payload size (0 when not TSO).
    pub fn mss(&self) -> u16 {
        be16(self.0.as_ref(), ES_MSS)
    }
    /// TX flow-table metadata.
    pub fn metadata(&self) -> u32 {
        be32(self.0.as_ref(), ES_METADATA)
    }
    /// `inline_hdr_sz`: inline header bytes, or [`VLAN_INSERT_CMD`].
    pub fn inline_hdr_sz(&self) -> u16 {
        be16(self.0.as_ref(), ES_INLINE_SZ)
    }
    /// The TCI to insert when `inline_hdr_sz` is [`VLAN_INSERT_CMD`].
    pub fn vlan_insert(&self) -> Option<u16> {
        (self.inline_hdr_sz() == VLAN_INSERT_CMD).then(|| be16(self.0.as_ref(), ES_INLINE_START))
    }
    /// The inline header bytes present in the view (`inline_hdr_sz` of them, or fewer when the
    /// view ends first: a WQE that wraps the ring continues at its start).
    pub fn inline(&self) -> &[u8] {
        let b = self.0.as_ref();
        let n = match self.inline_hdr_sz() {
            VLAN_INSERT_CMD => 0,
            n => usize::from(n),
        };
        let end = (ES_INLINE_START + n).min(b.len());
        &b[ES_INLINE_START..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthSeg<T> {
    /// Writes the segment's 16 bytes: checksum flags, `mss` (0 unless TSO), no metadata, and
    /// `inline_hdr_sz` = `hdr.len()` with the header's first two bytes; the caller copies
    /// `hdr[2..]` into the units that follow (they may wrap the ring).
    #[inline]
    pub fn write(&mut self, cs_flags: u8, mss: u16, hdr: &[u8]) {
        let b = self.0.as_mut();
        set_be32(b, 0, 0);
        b[ES_CS_FLAGS] = cs_flags;
        b[ES_CS_FLAGS + 1] = 0;
        set_be16(b, ES_MSS, mss);
        set_be32(b, ES_METADATA, 0);
        set_be16(b, ES_INLINE_SZ, hdr.len() as u16);
        let first = hdr.len().min(2);
        b[ES_INLINE_START..ES_INLINE_START + 2].fill(0);
        b[ES_INLINE_START..ES_INLINE_START + first].copy_from_slice(&hdr[..first]);
    }
    /// Writes the segment with hardware VLAN insertion of `tci` and nothing inlined.
    pub fn write_vlan_insert(&mut self, cs_flags: u8, tci: u16) {
        self.write(cs_flags, 0, &[]);
        let b = self.0.as_mut();
        set_be16(b, ES_INLINE_SZ, VLAN_INSERT_CMD);
        set_be16(b, ES_INLINE_START, tci);
    }
}

/// A pointer ("gather" / RX scatter) data segment (§2.4, §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSeg<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> DataSeg<T> {
    /// A view over at least [`SEG_BYTES`] bytes.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= SEG_BYTES).then_some(Self(buf))
    }
    /// `byte_count` (bit 31 set means this is an inline segment, see [`InlineSeg`]).
    pub fn byte_count(&self) -> u32 {
        be32(self.0.as_ref(), 0)
    }
    /// Whether the first dword carries the inline marker.
    pub fn is_inline(&self) -> bool {
        self.byte_count() & INLINE_SEG != 0
    }
    /// Memory key.
    pub fn lkey(&self) -> Lkey {
        Lkey(be32(self.0.as_ref(), 4))
    }
    /// Virtual address.
    pub fn addr(&self) -> Iova {
        Iova(be64(self.0.as_ref(), 8))
    }
}

/// A pointer segment as the two 8-byte words [`crate::sys::DevMem::write_2x64`] stores: the
/// byte count and key (first word, native order, bytes big-endian as the device reads them),
/// then the address.
#[inline]
pub fn data_seg_words(addr: Iova, lkey: Lkey, len: u32) -> (u64, u64) {
    (data_seg_head(lkey, len), addr.0.to_be())
}

/// The first word of [`data_seg_words`] (constant for a queue's RX buffers).
#[inline]
pub fn data_seg_head(lkey: Lkey, len: u32) -> u64 {
    u64::from((len & !INLINE_SEG).to_be()) | (u64::from(lkey.0.to_be()) << 32)
}

impl DataSeg<[u8; SEG_BYTES]> {
    /// The 16 bytes of a pointer segment for `len` bytes at `addr` through `lkey`, to store
    /// into a ring in one piece.
    #[inline]
    pub fn bytes(addr: Iova, lkey: Lkey, len: u32) -> [u8; SEG_BYTES] {
        let mut b = [0u8; SEG_BYTES];
        b[..4].copy_from_slice(&(len & !INLINE_SEG).to_be_bytes());
        b[4..8].copy_from_slice(&lkey.0.to_be_bytes());
        b[8..].copy_from_slice(&addr.0.to_be_bytes());
        b
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataSeg<T> {
    /// Writes `len` bytes at `addr` through `lkey`.
    #[inline]
    pub fn set(&mut self, addr: Iova, lkey: Lkey, len: u32) {
        let b = self.0.as_mut();
        set_be32(b, 0, len & !INLINE_SEG);
        set_be32(b, 4, lkey.0);
        set_be64(b, 8, addr.0);
    }
}

/// The first dword of an inline data segment: [`INLINE_SEG`] | length (§2.4); the data follows.
pub struct InlineSeg;

impl InlineSeg {
    /// The header dword for `len` inline bytes.
    pub const fn header(len: u32) -> u32 {
        INLINE_SEG | len
    }
    /// The length an inline header dword announces, or `None` if it is not one.
    pub const fn len(header: u32) -> Option<u32> {
        if header & INLINE_SEG != 0 {
            Some(header & !INLINE_SEG)
        } else {
            None
        }
    }
}

/// The 32-byte WQE of a multi-packet (striding) RQ: bytes 0–15 unused, bytes 16–31 one pointer
/// segment over the whole strided buffer (§4.2).
pub const MPRQ_WQE_BYTES: usize = 32;
/// Where the data segment of a striding-RQ WQE starts (bytes 0–15 are the unused "next"
/// segment, left zero, §4.2).
pub const MPRQ_DSEG_OFFSET: usize = 16;

/// A striding-RQ WQE (§4.2): 16 unused bytes, then one pointer segment whose `byte_count` is
/// the whole buffer (`stride_bytes × strides`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MprqWqe<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> MprqWqe<T> {
    /// A view over at least [`MPRQ_WQE_BYTES`] bytes.
    pub fn new_checked(buf: T) -> Option<Self> {
        (buf.as_ref().len() >= MPRQ_WQE_BYTES).then_some(Self(buf))
    }
    /// The buffer's data segment.
    pub fn dseg(&self) -> DataSeg<&[u8]> {
        DataSeg(&self.0.as_ref()[MPRQ_DSEG_OFFSET..MPRQ_WQE_BYTES])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MprqWqe<T> {
    /// Writes the whole WQE: the first 16 bytes zero, then `addr`, `lkey` and the buffer's
    /// `bytes`.
    pub fn write(&mut self, addr: Iova, lkey: Lkey, bytes: u32) {
        let b = self.0.as_mut();
        b[..MPRQ_DSEG_OFFSET].fill(0);
        DataSeg(&mut b[MPRQ_DSEG_OFFSET..MPRQ_WQE_BYTES]).set(addr, lkey, bytes);
    }
}

/// What the packed `byte_cnt` of a striding-RQ CQE (or of its mini CQE) says (§4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MprqByteCnt {
    /// A filler: the strides hold no packet (the packet did not fit the WQE's rest).
    pub filler: bool,
    /// Strides consumed.
    pub strides: u16,
    /// Packet length (0 for a filler).
    pub len: u16,
}

impl MprqByteCnt {
    /// Decodes a `byte_cnt` word.
    pub const fn from_word(w: u32) -> Self {
        Self {
            filler: mprq_byte_cnt::FILLER.extract(w) != 0,
            strides: mprq_byte_cnt::STRIDES.extract(w) as u16,
            len: mprq_byte_cnt::LEN.extract(w) as u16,
        }
    }
    /// The `byte_cnt` word (strides above 14 bits dropped).
    pub const fn word(&self) -> u32 {
        let w = mprq_byte_cnt::FILLER.insert(0, self.filler as u32);
        let w = mprq_byte_cnt::STRIDES.insert(w, self.strides as u32);
        mprq_byte_cnt::LEN.insert(w, self.len as u32)
    }
}

/// `Bits32` of the MPRQ `byte_cnt` (§4.2): filler flag, consumed strides, packet length.
pub mod mprq_byte_cnt {
    use crate::hw::bits::Bits32;
    /// Filler CQE: the strides consumed hold no packet.
    pub const FILLER: Bits32 = Bits32::be(0, 31, 31);
    /// Strides the packet (or filler) consumed.
    pub const STRIDES: Bits32 = Bits32::be(0, 29, 16);
    /// Packet length.
    pub const LEN: Bits32 = Bits32::be(0, 15, 0);
}

#[cfg(test)]
mod seg_word_tests {
    use super::*;

    #[test]
    fn the_two_words_are_the_segment_bytes() {
        let (lo, hi) = data_seg_words(Iova(0x1122_3344_5566_7788), Lkey(0xabcdef), 60);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&lo.to_ne_bytes());
        b[8..].copy_from_slice(&hi.to_ne_bytes());
        assert_eq!(
            b,
            DataSeg::bytes(Iova(0x1122_3344_5566_7788), Lkey(0xabcdef), 60)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mprq_byte_cnt_packs_filler_strides_and_length_as_section_4_2_says() {
        // Bit 31 filler, bits 29:16 strides, bits 15:0 length.
        let w = MprqByteCnt {
            filler: false,
            strides: 3,
            len: 5000,
        }
        .word();
        assert_eq!(w, 0x0003_1388);
        let f = MprqByteCnt {
            filler: true,
            strides: 0x3fff,
            len: 0,
        };
        assert_eq!(f.word(), 0xbfff_0000);
        // Bit 30 belongs to no field (the kernel's 15-bit mask would read it as a stride).
        assert_eq!(MprqByteCnt::from_word(0x4001_0040).strides, 1);
    }

    #[test]
    fn mprq_wqe_leaves_the_next_segment_zero_and_puts_the_buffer_at_byte_16() {
        let mut w = [0xaau8; MPRQ_WQE_BYTES];
        MprqWqe::new_checked(&mut w[..]).unwrap().write(
            Iova(0x7f00_1234_0000),
            Lkey(0x55),
            64 * 2048,
        );
        assert_eq!(&w[..16], &[0u8; 16]);
        assert_eq!(&w[16..20], &(64u32 * 2048).to_be_bytes());
        assert_eq!(&w[20..24], &0x55u32.to_be_bytes());
        assert_eq!(&w[24..32], &0x7f00_1234_0000u64.to_be_bytes());
        let d = MprqWqe::new_checked(&w[..]).unwrap();
        assert_eq!(d.dseg().addr(), Iova(0x7f00_1234_0000));
        assert!(MprqWqe::new_checked(&w[..31]).is_none());
    }

    proptest! {
        #[test]
        fn mprq_byte_cnt_round_trips(filler in any::<bool>(), strides in 0u16..0x4000, len in any::<u16>()) {
            let v = MprqByteCnt { filler, strides, len };
            prop_assert_eq!(MprqByteCnt::from_word(v.word()), v);
        }
    }
}
