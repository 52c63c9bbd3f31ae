//! [`AfPacket`]: an existing Linux interface as the far end of the cable, through an
//! AF_PACKET socket with memory-mapped receive and transmit rings (`TPACKET_V2`).
//!
//! * **Receive** reads the next slot of the receive ring: no system call. The ring is the
//!   port's receive FIFO ([`Wire::holds_arrivals`]): a model with no receive buffer posted
//!   leaves frames in it, and it is sized for that (8 MiB, about 5,000 frames at MTU 1500).
//!   When it is full the kernel drops the frame and counts it, and [`Wire::stats`] reports it
//!   as [`RX_DROPS`] (the port's imissed).
//! * **Transmit** copies the frame into the next free slot of the transmit ring (behind a
//!   virtio-net header that has the kernel copy the whole frame into the packet it sends:
//!   see [`PacketRings::vnet_hdr`]); one
//!   `sendto` ([`Wire::flush`], once per device-model pass, or when 64 frames wait) hands all
//!   waiting frames to the interface. A frame the interface refuses (ENOBUFS) stays in the
//!   ring and goes again; a frame that finds no free slot even after a kick is refused
//!   ([`Wire::send`] says `false`, the model counts it) and counted (`tx_ring_full`).
//! * **802.1Q tags.** The kernel takes a VLAN tag out of every frame it receives and keeps
//!   it beside the frame (`tp_vlan_tci`, `tp_vlan_tpid`, `TP_STATUS_VLAN_VALID`, the ring's
//!   form of `PACKET_AUXDATA`). The wire puts it back in front of the EtherType, so the model
//!   sees the frame as it was on the cable, tag included.
//! * **Checksums left to the device.** A frame sent by a local socket through an interface
//!   with checksum offload (a veth's default) arrives with its TCP/UDP checksum unfinished
//!   (`TP_STATUS_CSUMNOTREADY`: the field holds the pseudo-header sum). The wire finishes it,
//!   as the sender's NIC would have, so a peer's `tx` checksum offload may stay on.
//!   Segmentation offloads may not: a TSO/GSO frame is longer than a slot (see below).
//! * Frames this host sends itself are skipped (`PACKET_IGNORE_OUTGOING`, and the slot's
//!   packet type on kernels without it).
//!
//! Slots are sized from the interface's MTU when the wire opens (MTU + 98 bytes, rounded up
//! to 64): a longer frame (the interface's MTU raised later, or GRO on it) is cut by the
//! kernel, and dropped and counted here (`rx_too_long`).
#![deny(unsafe_code)]

use super::tpacket::{self, field, RxHeader};
use super::{Wire, WireError, RX_DROPS};
use crate::ethdev::{Loss, Xstat};
use crate::net::csum::{self, TxCsum};
use crate::sys::net::{if_flags, if_mtu, IFF_RUNNING, IFF_UP};
use crate::sys::packet_ring::{PacketRings, RingGeometry};
use std::cell::Cell;
use std::io;

/// Bytes per ring block (the kernel allocates a ring block by block).
const BLOCK_BYTES: u32 = 128 << 10;
/// Receive ring size.
const RX_RING_BYTES: u32 = 8 << 20;
/// Transmit ring size.
const TX_RING_BYTES: u32 = 4 << 20;
/// Frames waiting in the transmit ring that make [`Wire::send`] kick without waiting for
/// [`Wire::flush`].
const KICK_EVERY: u32 = 64;
/// Kicks one flush makes at most while the interface keeps refusing frames (each ENOBUFS
/// stops the kernel's pass over the ring at the refused frame, which stays marked).
const MAX_KICKS: u32 = 8;
/// What a frame with `TP_STATUS_CSUMNOTREADY` needs: its TCP or UDP checksum finished (the
/// IPv4 header checksum is always complete).
const PARTIAL_L4: TxCsum = TxCsum {
    ipv4: false,
    tcp: true,
    udp: true,
};
/// Ethernet header bytes before the EtherType (destination and source MAC).
const MACS: usize = 12;
/// Bytes of an 802.1Q tag.
const TAG: usize = 4;

/// Counters of frames the wire or the kernel dropped; see [`AfPacket`]'s [`Wire::stats`].
#[derive(Debug, Default)]
struct Counters {
    /// Kernel: receive ring full (PACKET_STATISTICS `tp_drops`, accumulated).
    rx_drops: Cell<u64>,
    /// Kernel: frames its socket filter took, dropped ones included (`tp_packets`).
    rx_socket_frames: Cell<u64>,
    rx_too_long: u64,
    rx_csum_completed: u64,
    tx_ring_full: u64,
    tx_too_long: u64,
    tx_kernel_busy: u64,
    tx_kick_errors: u64,
    tx_kicks: u64,
}

/// A Linux interface as the far end.
#[derive(Debug)]
pub struct AfPacket {
    rings: PacketRings,
    rx: RingGeometry,
    tx: RingGeometry,
    tx_base: usize,
    /// Next receive slot to look at.
    rx_head: u32,
    /// Next transmit slot to fill.
    tx_head: u32,
    /// Frames marked for sending since the last kick.
    tx_pending: u32,
    /// Longest frame the interface takes for sending (MTU + Ethernet header + one tag).
    tx_max: usize,
    counters: Counters,
}

/// The frame slot for an interface of `mtu`: room for the kernel's receive offset (the
/// frame starts 76 bytes into a slot with a virtio-net header before it, 66 without), an
/// Ethernet header, two tags and `mtu` bytes; 64-byte aligned.
fn frame_bytes(mtu: u32) -> u32 {
    (mtu.clamp(576, super::MAX_FRAME as u32) + 98).next_multiple_of(64)
}

/// A ring of about `bytes` in [`BLOCK_BYTES`] blocks of `frame` bytes frames.
fn geometry(bytes: u32, frame: u32) -> RingGeometry {
    let block_bytes = BLOCK_BYTES.max(frame.next_power_of_two());
    RingGeometry {
        block_bytes,
        blocks: (bytes / block_bytes).max(1),
        frame_bytes: frame,
    }
}

impl AfPacket {
    /// Attaches to `ifname`.
    ///
    /// # Errors
    /// [`WireError::AfPacket`] when the interface is missing, the socket is not allowed, or
    /// its rings cannot be made.
    pub fn open(ifname: &str) -> Result<Self, WireError> {
        let err = |source: io::Error| WireError::AfPacket {
            ifname: ifname.into(),
            source,
        };
        let mtu = if_mtu(ifname).map_err(err)?;
        let frame = frame_bytes(mtu);
        let rings = PacketRings::open(
            ifname,
            geometry(RX_RING_BYTES, frame),
            geometry(TX_RING_BYTES, frame),
        )
        .map_err(err)?;
        let rx = rings.rx_geometry();
        let tx = rings.tx_geometry();
        tracing::debug!(target: "pmd::emu::wire", ifname, mtu, frame_bytes = frame, rx_frames = rx.frames(), tx_frames = tx.frames(), "afpacket rings mapped");
        Ok(Self {
            tx_base: rings.tx_base(),
            rings,
            rx,
            tx,
            rx_head: 0,
            tx_head: 0,
            tx_pending: 0,
            tx_max: (mtu as usize + 14 + TAG)
                .min(frame as usize - field::TX_DATA - tpacket::VNET_HDR_BYTES),
            counters: Counters::default(),
        })
    }

    /// Hands every marked transmit frame to the kernel.
    fn kick(&mut self) {
        if self.tx_pending == 0 {
            return;
        }
        for _ in 0..MAX_KICKS {
            self.counters.tx_kicks += 1;
            match self.rings.kick_tx() {
                Ok(_) => {
                    self.tx_pending = 0;
                    return;
                }
                // The interface refused a frame (a veth whose peer's backlog is full): the
                // kernel marked it for sending again and stopped there. Go on from it.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.counters.tx_kernel_busy += 1;
                }
                // The send buffer is full: the marked frames go at the next kick.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // The interface is down or gone: the frames stay marked; once the ring is
                // full, sends are refused (and counted).
                Err(_) => {
                    self.counters.tx_kick_errors += 1;
                    return;
                }
            }
        }
    }

    /// Copies the frame in receive slot `slot` (header `h`) into `buf`, with the tag the
    /// kernel took out put back after the MAC addresses; the frame's full length.
    fn copy_out(&self, slot: usize, h: &RxHeader, buf: &mut [u8]) -> usize {
        let mem = self.rings.mem();
        let start = slot + usize::from(h.mac);
        let len = h.len as usize;
        let Some((tpid, tci)) = h.vlan.filter(|_| len >= MACS) else {
            let n = len.min(buf.len());
            mem.read(start, &mut buf[..n]);
            return len;
        };
        let mut tag = [0u8; TAG];
        tag[..2].copy_from_slice(&tpid.to_be_bytes());
        tag[2..].copy_from_slice(&tci.to_be_bytes());
        let total = len + TAG;
        let n = total.min(buf.len());
        let head = MACS.min(n);
        mem.read(start, &mut buf[..head]);
        let t = (n - head).min(TAG);
        buf[head..head + t].copy_from_slice(&tag[..t]);
        let rest = n - head - t;
        if rest > 0 {
            mem.read(start + MACS, &mut buf[MACS + TAG..MACS + TAG + rest]);
        }
        total
    }
}

/// Whether interface flags say the link is up: administratively up (`IFF_UP`) and with
/// carrier, i.e. operationally up (`IFF_RUNNING`; a veth has it only while its peer is up).
fn carrier(flags: u32) -> bool {
    flags & (IFF_UP | IFF_RUNNING) == IFF_UP | IFF_RUNNING
}

impl Wire for AfPacket {
    /// Copies the frame into the transmit ring; `false` (counted) when it is longer than the
    /// interface takes, or no slot is free even after a kick.
    fn send(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.tx_max {
            self.counters.tx_too_long += 1;
            return false;
        }
        let slot = self.tx_base + self.tx.frame_offset(self.tx_head);
        let mem = self.rings.mem();
        if tpacket::status(mem, slot) != tpacket::TP_STATUS_AVAILABLE {
            // Frames of ours wait for a kick, or the kernel still holds them: kick, look
            // once more.
            self.kick();
            if tpacket::status(self.rings.mem(), slot) != tpacket::TP_STATUS_AVAILABLE {
                self.counters.tx_ring_full += 1;
                return false;
            }
        }
        tpacket::post_tx(self.rings.mem(), slot, frame, self.rings.vnet_hdr());
        self.tx_head = (self.tx_head + 1) % self.tx.frames();
        self.tx_pending += 1;
        if self.tx_pending >= KICK_EVERY {
            self.kick();
        }
        true
    }

    fn flush(&mut self) {
        self.kick();
    }

    /// Yes: the receive ring is the port's receive FIFO.
    fn holds_arrivals(&self) -> bool {
        true
    }

    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        let frame_bytes = self.rx.frame_bytes as usize;
        loop {
            let slot = self.rx.frame_offset(self.rx_head);
            let mem = self.rings.mem();
            if tpacket::status(mem, slot) & tpacket::TP_STATUS_USER == 0 {
                return None;
            }
            let mut hb = [0u8; field::RX_HEADER];
            mem.read(slot, &mut hb);
            let h = RxHeader::parse(&hb);
            let fits = usize::from(h.mac) >= field::RX_HEADER
                && usize::from(h.mac) + h.len as usize <= frame_bytes;
            let got = if h.pkttype == tpacket::PACKET_OUTGOING {
                None
            } else if h.snaplen < h.len || !fits {
                self.counters.rx_too_long += 1;
                None
            } else {
                let n = self.copy_out(slot, &h, buf);
                if h.status & tpacket::TP_STATUS_CSUMNOTREADY != 0 && n <= buf.len() {
                    // A local sender left the TCP/UDP checksum to the device, with the
                    // pseudo-header sum in its field: finish it as that device would have.
                    self.counters.rx_csum_completed += 1;
                    csum::apply_tx(&mut buf[..n], PARTIAL_L4);
                }
                Some(n)
            };
            // The slot goes back to the kernel once its bytes are copied out.
            tpacket::set_status(self.rings.mem(), slot, tpacket::TP_STATUS_KERNEL);
            self.rx_head = (self.rx_head + 1) % self.rx.frames();
            if got.is_some() {
                return got;
            }
        }
    }

    /// The interface is up and running (`IFF_UP` and `IFF_RUNNING`, read with SIOCGIFFLAGS in
    /// this process's network namespace); false if it has gone away.
    fn peer_attached(&self) -> bool {
        if_flags(self.rings.ifname()).is_ok_and(carrier)
    }

    fn describe(&self) -> String {
        format!("afpacket:{}", self.rings.ifname())
    }

    /// `rx_drops` (the kernel's PACKET_STATISTICS `tp_drops`: the receive ring was full),
    /// `rx_socket_frames` (`tp_packets`: frames the socket took, dropped ones included),
    /// `rx_too_long` (longer than a ring slot: cut by the kernel, dropped here),
    /// `rx_csum_completed` (frames whose TCP/UDP checksum the wire finished),
    /// `tx_ring_full` (no free transmit slot), `tx_too_long` (longer than the interface's
    /// MTU allows), `tx_kernel_busy` (the interface refused a frame when kicked, ENOBUFS: it
    /// goes again at the next kick),
    /// `tx_kick_errors` (a kick failed otherwise: the interface is down or gone; its frames
    /// stay in the ring until it is back), `tx_kicks` (system calls made to send). Reading costs one
    /// getsockopt.
    fn stats(&self) -> Vec<Xstat> {
        let c = &self.counters;
        if let Ok(s) = self.rings.statistics() {
            c.rx_drops.set(c.rx_drops.get() + u64::from(s.drops));
            c.rx_socket_frames
                .set(c.rx_socket_frames.get() + u64::from(s.packets));
        }
        vec![
            // The port's imissed.
            Xstat::new(RX_DROPS, c.rx_drops.get(), Loss::Counted),
            Xstat::new("rx_socket_frames", c.rx_socket_frames.get(), Loss::None),
            // Lost before the device model saw them, counted nowhere else.
            Xstat::new("rx_too_long", c.rx_too_long, Loss::Rx),
            Xstat::new("rx_csum_completed", c.rx_csum_completed, Loss::None),
            // Refused by `send`: the device model counts them (`dev_tx_wire_drops`).
            Xstat::new("tx_ring_full", c.tx_ring_full, Loss::Counted),
            Xstat::new("tx_too_long", c.tx_too_long, Loss::Counted),
            // Sent again at the next kick; a failed kick's frames stay in the ring.
            Xstat::new("tx_kernel_busy", c.tx_kernel_busy, Loss::None),
            Xstat::new("tx_kick_errors", c.tx_kick_errors, Loss::None),
            Xstat::new("tx_kicks", c.tx_kicks, Loss::None),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carrier_needs_up_and_running() {
        assert!(carrier(IFF_UP | IFF_RUNNING));
        assert!(carrier(IFF_UP | IFF_RUNNING | 0x1000));
        assert!(
            !carrier(IFF_UP),
            "up without carrier (a veth whose peer is down)"
        );
        assert!(!carrier(IFF_RUNNING));
        assert!(!carrier(0));
    }

    #[test]
    fn slots_hold_a_full_frame_after_the_kernels_offset() {
        // The kernel puts a received frame at TPACKET_ALIGN(TPACKET2_HDRLEN + 16) - 14 = 66,
        // plus the virtio-net header when there is one.
        let rx_offset =
            (libc::TPACKET2_HDRLEN + 16).next_multiple_of(16) - 14 + tpacket::VNET_HDR_BYTES;
        assert_eq!(rx_offset, 76);
        for mtu in [576, 1280, 1500, 4000, 9000] {
            let f = frame_bytes(mtu) as usize;
            assert!(rx_offset + 14 + 2 * TAG + mtu as usize <= f, "mtu {mtu}");
            assert!(f.is_multiple_of(64));
            let g = geometry(RX_RING_BYTES, f as u32);
            assert!(g.frames_per_block() >= 1 && g.block_bytes.is_power_of_two());
        }
        assert_eq!(frame_bytes(1500), 1600);
        assert_eq!(geometry(RX_RING_BYTES, 1600).frames(), 64 * 81);
    }

    #[test]
    fn the_loopback_interface_is_attached() {
        // Opening the socket needs CAP_NET_RAW.
        match AfPacket::open("lo") {
            Ok(w) => {
                assert!(w.peer_attached(), "lo is up and running");
                assert!(w.stats().iter().any(|x| x.name == RX_DROPS));
            }
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}
