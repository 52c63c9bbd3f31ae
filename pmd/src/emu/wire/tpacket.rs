//! The frame header of a `TPACKET_V2` ring (linux/if_packet.h, `struct tpacket2_hdr`, and
//! Documentation/networking/packet_mmap.rst), as the [`AfPacket`](super::AfPacket) wire reads
//! and writes it through [`DevMem`]. Host byte order (the kernel's ABI).
//!
//! ```text
//! +0   tp_status     u32   who owns the frame (see the TP_STATUS_* constants)
//! +4   tp_len        u32   frame length on the wire
//! +8   tp_snaplen    u32   bytes of it in the slot (RX)
//! +12  tp_mac        u16   where the frame starts, from the header (RX)
//! +14  tp_net        u16   where its network header starts (RX)
//! +16  tp_sec        u32   receive time
//! +20  tp_nsec       u32
//! +24  tp_vlan_tci   u16   the 802.1Q tag the kernel took out of the frame (RX)
//! +26  tp_vlan_tpid  u16   its TPID (RX)
//! +28  tp_padding    [u8; 4]
//! +32  struct sockaddr_ll  (RX: sll_pkttype at +10 of it)
//! +32  TX: the frame to send (the data of a transmit slot starts here; with
//!      PACKET_VNET_HDR, a 10-byte virtio-net header first)
//! ```
#![deny(unsafe_code)]

use crate::sys::DevMem;
use std::sync::atomic::Ordering;

/// Byte offsets of the header fields.
pub mod field {
    /// `tp_status`.
    pub const STATUS: usize = 0;
    /// `tp_len`.
    pub const LEN: usize = 4;
    /// `tp_snaplen`.
    pub const SNAPLEN: usize = 8;
    /// `tp_mac`.
    pub const MAC: usize = 12;
    /// `tp_vlan_tci`.
    pub const VLAN_TCI: usize = 24;
    /// `tp_vlan_tpid`.
    pub const VLAN_TPID: usize = 26;
    /// The `sockaddr_ll` after the header (`TPACKET_ALIGN(sizeof(struct tpacket2_hdr))`).
    pub const SOCKADDR: usize = 32;
    /// `sll_pkttype` inside the `sockaddr_ll`.
    pub const SLL_PKTTYPE: usize = SOCKADDR + 10;
    /// Where a transmit slot's frame starts: `TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`
    /// (the kernel's default without `PACKET_TX_HAS_OFF`).
    pub const TX_DATA: usize = 32;
    /// Header bytes read at once on receive (through `sll_pkttype`).
    pub const RX_HEADER: usize = 48;
}

// The receive header read at once reaches the packet type.
const _: () = assert!(field::SLL_PKTTYPE < field::RX_HEADER);

/// RX: the kernel owns the frame (it may fill it).
pub const TP_STATUS_KERNEL: u32 = 0;
/// RX: the frame is ours to read.
pub const TP_STATUS_USER: u32 = 1 << 0;
/// RX: the frame's checksum is not computed yet (its sender, a local socket, left it to the
/// device: `CHECKSUM_PARTIAL`).
pub const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
/// RX: `tp_vlan_tci` holds a tag the kernel took out of the frame.
pub const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// RX: `tp_vlan_tpid` is set (else the TPID is 0x8100).
pub const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
/// TX: the slot is free.
pub const TP_STATUS_AVAILABLE: u32 = 0;
/// TX: the frame waits for the next kick.
pub const TP_STATUS_SEND_REQUEST: u32 = 1 << 0;

/// `sll_pkttype` of a frame this host sent (`PACKET_OUTGOING`).
pub const PACKET_OUTGOING: u8 = 4;

/// The 802.1Q TPID, used when the kernel gives a tag without one.
pub const ETH_P_8021Q: u16 = 0x8100;

/// What the header of a received frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxHeader {
    /// `tp_status`.
    pub status: u32,
    /// `tp_len`: the frame's length on the wire (without a tag the kernel took out).
    pub len: u32,
    /// `tp_snaplen`: how much of it is in the slot.
    pub snaplen: u32,
    /// `tp_mac`: where it starts, from the header.
    pub mac: u16,
    /// The tag the kernel took out, as (TPID, TCI), when `TP_STATUS_VLAN_VALID`.
    pub vlan: Option<(u16, u16)>,
    /// `sll_pkttype`.
    pub pkttype: u8,
}

impl RxHeader {
    /// Parses the first [`field::RX_HEADER`] bytes of a slot.
    pub fn parse(b: &[u8; field::RX_HEADER]) -> Self {
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let status = u32_at(field::STATUS);
        let vlan = (status & TP_STATUS_VLAN_VALID != 0).then(|| {
            let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                u16_at(field::VLAN_TPID)
            } else {
                ETH_P_8021Q
            };
            (tpid, u16_at(field::VLAN_TCI))
        });
        Self {
            status,
            len: u32_at(field::LEN),
            snaplen: u32_at(field::SNAPLEN),
            mac: u16_at(field::MAC),
            vlan,
            pkttype: b[field::SLL_PKTTYPE],
        }
    }
}

/// A slot's status word (Acquire: once it reads `TP_STATUS_USER`, the kernel's writes to the
/// slot are visible).
pub fn status(mem: &DevMem, slot: usize) -> u32 {
    mem.load_u32(slot + field::STATUS, Ordering::Acquire)
}

/// Hands a slot over (Release: every write to it before this is visible to the kernel once
/// it sees the new status).
pub fn set_status(mem: &DevMem, slot: usize, status: u32) {
    mem.store_u32(slot + field::STATUS, status, Ordering::Release);
}

/// Bytes of a `struct virtio_net_hdr` (linux/virtio_net.h): `flags` u8, `gso_type` u8,
/// then `hdr_len`, `gso_size`, `csum_start`, `csum_offset`, each a 16-bit word in the
/// device's byte order, which for a packet socket is little-endian (`vio_le()`, legacy
/// virtio on a little-endian host).
pub const VNET_HDR_BYTES: usize = 10;

/// Copies a frame into a transmit slot and marks it for the next kick. With `vnet`, a
/// virtio-net header goes first: no offload asked (`flags` 0, `GSO_NONE`), and `hdr_len`
/// the whole frame, so that the kernel copies all of it into the packet it sends. The
/// caller checked that the slot is free and that the frame (and header) fit.
pub fn post_tx(mem: &DevMem, slot: usize, frame: &[u8], vnet: bool) {
    let mut at = slot + field::TX_DATA;
    if vnet {
        let mut h = [0u8; VNET_HDR_BYTES];
        h[2..4].copy_from_slice(&(frame.len() as u16).to_le_bytes());
        mem.write(at, &h);
        at += VNET_HDR_BYTES;
    }
    mem.write(at, frame);
    let len = frame.len() + if vnet { VNET_HDR_BYTES } else { 0 };
    mem.store_u32(slot + field::LEN, len as u32, Ordering::Relaxed);
    set_status(mem, slot, TP_STATUS_SEND_REQUEST);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets are the kernel's: checked against the `libc` crate's copy of
    /// linux/if_packet.h and linux/if_packet.h's own constants.
    #[test]
    fn offsets_match_linux_if_packet_h() {
        use libc::tpacket2_hdr as H;
        assert_eq!(offset_of!(H, tp_status), field::STATUS);
        assert_eq!(offset_of!(H, tp_len), field::LEN);
        assert_eq!(offset_of!(H, tp_snaplen), field::SNAPLEN);
        assert_eq!(offset_of!(H, tp_mac), field::MAC);
        assert_eq!(offset_of!(H, tp_vlan_tci), field::VLAN_TCI);
        assert_eq!(offset_of!(H, tp_vlan_tpid), field::VLAN_TPID);
        assert_eq!(size_of::<H>(), field::SOCKADDR);
        assert_eq!(
            libc::TPACKET2_HDRLEN - size_of::<libc::sockaddr_ll>(),
            field::TX_DATA
        );
        assert_eq!(
            field::SOCKADDR + offset_of!(libc::sockaddr_ll, sll_pkttype),
            field::SLL_PKTTYPE
        );
        assert_eq!(libc::TP_STATUS_USER, TP_STATUS_USER);
        assert_eq!(libc::TP_STATUS_CSUMNOTREADY, TP_STATUS_CSUMNOTREADY);
        assert_eq!(libc::TP_STATUS_VLAN_VALID, TP_STATUS_VLAN_VALID);
        assert_eq!(libc::TP_STATUS_VLAN_TPID_VALID, TP_STATUS_VLAN_TPID_VALID);
        assert_eq!(libc::TP_STATUS_SEND_REQUEST, TP_STATUS_SEND_REQUEST);
        assert_eq!(libc::PACKET_OUTGOING, PACKET_OUTGOING);
        // linux/virtio_net.h: struct virtio_net_hdr is 10 bytes (no libc binding; the
        // header's six fields: u8, u8, and four 16-bit words).
        assert_eq!(VNET_HDR_BYTES, 1 + 1 + 4 * 2);
    }

    /// A header as the kernel writes it for a tagged frame (bytes laid out by hand from the
    /// table in the module docs, little-endian host).
    #[cfg(target_endian = "little")]
    #[test]
    fn a_tagged_frame_header_parses() {
        const RX_TAGGED_BYTES: [u8; field::RX_HEADER] = [
            0x51, 0x00, 0x00, 0x00, // tp_status: USER | VLAN_VALID | VLAN_TPID_VALID
            0x62, 0x00, 0x00, 0x00, // tp_len 98
            0x62, 0x00, 0x00, 0x00, // tp_snaplen 98
            0x42, 0x00, // tp_mac 66
            0x50, 0x00, // tp_net 80
            0, 0, 0, 0, 0, 0, 0, 0, // tp_sec, tp_nsec
            0x2a, 0x60, // tp_vlan_tci 0x602a: PCP 3, VID 42
            0xa8, 0x88, // tp_vlan_tpid 0x88a8
            0, 0, 0, 0, // padding
            0x11, 0x00, 0x08, 0x00, 0x05, 0, 0, 0, // sll_family, sll_protocol, sll_ifindex
            0x01, 0x00, 0x00, 0x06, // sll_hatype, sll_pkttype HOST, sll_halen
            0, 0, 0, 0, // sll_addr (first bytes)
        ];
        let h = RxHeader::parse(&RX_TAGGED_BYTES);
        assert_eq!(h.len, 98);
        assert_eq!(h.snaplen, 98);
        assert_eq!(h.mac, 66);
        assert_eq!(h.vlan, Some((0x88a8, 0x602a)));
        assert_eq!(h.pkttype, 0);
        let mut b = RX_TAGGED_BYTES;
        b[0] = 0x11; // no TPID: 802.1Q
        assert_eq!(RxHeader::parse(&b).vlan, Some((ETH_P_8021Q, 0x602a)));
        b[0] = 0x01; // no tag
        assert_eq!(RxHeader::parse(&b).vlan, None);
    }
}
