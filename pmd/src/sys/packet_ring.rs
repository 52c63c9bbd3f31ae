//! AF_PACKET sockets with memory-mapped receive and transmit rings (`TPACKET_V2`, see the
//! kernel's Documentation/networking/packet_mmap.rst), for the device model's afpacket wire.
//!
//! This module only makes the socket and its mapping and wraps the three system calls the
//! wire needs afterwards: the transmit kick (`sendto` with no data: "send every frame marked
//! `TP_STATUS_SEND_REQUEST`"), `PACKET_STATISTICS`, and nothing else: the frames themselves
//! are read and written through [`DevMem`], by the wire, without system calls.
//!
//! The mapping is the receive ring followed by the transmit ring; each ring is `blocks`
//! blocks of `block_bytes`, each block holding `block_bytes / frame_bytes` frames (a frame
//! never straddles a block). Nothing here is on a driver's datapath.
#![allow(unsafe_code)]

use super::DevMem;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// `TPACKET_V2` (linux/if_packet.h `enum tpacket_versions`).
const TPACKET_V2: libc::c_int = 1;

/// The shape of one ring: `blocks` blocks of `block_bytes`, frames of `frame_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes per block: a multiple of the page size (the kernel allocates rings by block).
    pub block_bytes: u32,
    /// Number of blocks.
    pub blocks: u32,
    /// Bytes per frame slot, header included: a multiple of 16 (`TPACKET_ALIGNMENT`), at most
    /// `block_bytes`.
    pub frame_bytes: u32,
}

impl RingGeometry {
    /// Frames in one block.
    pub fn frames_per_block(&self) -> u32 {
        self.block_bytes / self.frame_bytes
    }

    /// Frames in the ring.
    pub fn frames(&self) -> u32 {
        self.frames_per_block() * self.blocks
    }

    /// Bytes the ring occupies in the mapping.
    pub fn bytes(&self) -> usize {
        self.block_bytes as usize * self.blocks as usize
    }

    /// Offset of frame `i` (`i < frames()`) from the ring's start.
    pub fn frame_offset(&self, i: u32) -> usize {
        let fpb = self.frames_per_block();
        (i / fpb) as usize * self.block_bytes as usize
            + (i % fpb) as usize * self.frame_bytes as usize
    }

    fn req(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block_bytes,
            tp_block_nr: self.blocks,
            tp_frame_size: self.frame_bytes,
            tp_frame_nr: self.frames(),
        }
    }

    fn check(&self) -> io::Result<()> {
        let page = super::mem::page_size() as u32;
        let ok = self.blocks > 0
            && self.block_bytes > 0
            && self.block_bytes.is_multiple_of(page)
            && self.frame_bytes >= libc::TPACKET2_HDRLEN as u32
            && self
                .frame_bytes
                .is_multiple_of(libc::TPACKET_ALIGNMENT as u32)
            && self.frame_bytes <= self.block_bytes
            && self.bytes() <= 1 << 30;
        if ok {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad packet ring geometry {self:?}"),
            ))
        }
    }
}

/// What `PACKET_STATISTICS` reported since the previous call (the kernel clears its counters
/// on every read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStatistics {
    /// Frames the socket's filter accepted, dropped ones included.
    pub packets: u32,
    /// Of those, frames dropped because the receive ring had no free frame.
    pub drops: u32,
}

/// A non-blocking AF_PACKET socket bound to one interface, every EtherType, with a
/// receive and a transmit ring mapped into this process ([`PacketRings::mem`]).
///
/// Frames carry a virtio-net header where the kernel allows it ([`PacketRings::vnet_hdr`]).
/// Frames this host sends on the interface (our own, among them) are not put on the receive
/// ring (`PACKET_IGNORE_OUTGOING`, Linux 4.20 and later; the ring's `sll_pkttype` tells
/// them apart on older kernels). Transmission bypasses the interface's qdisc
/// (`PACKET_QDISC_BYPASS`, as a NIC's own queue would), and a malformed transmit frame is
/// skipped rather than stopping the ring (`PACKET_LOSS`).
#[derive(Debug)]
pub struct PacketRings {
    // Field order is drop order: the mapping goes before the socket that backs it.
    mem: DevMem,
    fd: OwnedFd,
    ifname: String,
    rx: RingGeometry,
    tx: RingGeometry,
    vnet_hdr: bool,
}

/// Sets an `int`-valued (or struct-valued) socket option.
fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a valid, initialised `T` that outlives the call, and its exact size
    // is passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The interface index of `ifname`.
///
/// # Errors
/// No interface of that name (in this process's network namespace).
pub fn if_index(ifname: &str) -> io::Result<u32> {
    let cname = CString::new(ifname).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL byte")
    })?;
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no network interface named '{ifname}'"),
        ));
    }
    Ok(ifindex)
}

impl PacketRings {
    /// Opens a socket on `ifname` (needs CAP_NET_RAW) with rings of the given shapes.
    ///
    /// The socket is created for no protocol and bound to every EtherType only once the rings
    /// exist, so no frame is queued outside them. Its send buffer is raised to hold the whole
    /// transmit ring (`SO_SNDBUFFORCE`, which needs CAP_NET_ADMIN; else `SO_SNDBUF`, which
    /// `net.core.wmem_max` caps): a frame in flight is charged to it until the kernel frees it.
    ///
    /// # Errors
    /// The interface does not exist, the geometry is bad, or a socket call failed (typically
    /// EPERM without CAP_NET_RAW, ENOMEM for rings too large).
    pub fn open(ifname: &str, rx: RingGeometry, tx: RingGeometry) -> io::Result<Self> {
        rx.check()?;
        tx.check()?;
        let ifindex = if_index(ifname)?;
        // SAFETY: plain socket(2) call with constant arguments; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2)?;
        let one: libc::c_int = 1;
        // Each of these is an improvement the ring works without: ignore their failure on
        // older kernels (outgoing frames are also recognised by their packet type).
        let _ = setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one);
        let _ = setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one);
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_LOSS, &one)?;
        // A virtio-net header in front of every frame (before the rings exist, or EBUSY):
        // its `hdr_len` tells the kernel how much of a transmit frame to copy into the
        // packet's own buffer, the rest being lent from the ring. See `vnet_hdr`.
        let vnet_hdr = setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VNET_HDR, &one).is_ok();
        let sndbuf = libc::c_int::try_from(tx.bytes() + (1 << 20)).unwrap_or(libc::c_int::MAX);
        if setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &sndbuf).is_err() {
            let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &sndbuf);
        }
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &rx.req())?;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_TX_RING, &tx.req())?;
        let len = rx.bytes() + tx.bytes();
        let map = memmap2::MmapOptions::new()
            .len(len)
            .populate()
            .map_raw(fd.as_raw_fd())?;
        let ptr = map.as_mut_ptr();
        // SAFETY: `map` is a shared read/write mapping of `len` bytes of the socket's rings;
        // the view keeps it (and so the mapping) alive. The kernel writes the ring memory
        // concurrently, which is what `DevMem` is for: it hands out no references into it,
        // every access is a copy or an atomic word access.
        let mem = unsafe { DevMem::from_raw_kept(ptr, len, Arc::new(map)) };
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and its exact size is passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            mem,
            fd,
            ifname: ifname.to_string(),
            rx,
            tx,
            vnet_hdr,
        })
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The rings: the receive ring at offset 0, the transmit ring at [`PacketRings::tx_base`].
    pub fn mem(&self) -> &DevMem {
        &self.mem
    }

    /// The receive ring's shape.
    pub fn rx_geometry(&self) -> RingGeometry {
        self.rx
    }

    /// Whether every frame of both rings has a `struct virtio_net_hdr` (10 bytes,
    /// linux/virtio_net.h) in front of it (`PACKET_VNET_HDR`): on receive before `tp_mac`,
    /// on transmit at the start of the data, counted in `tp_len`. The kernel copies a
    /// transmit frame's first `hdr_len` bytes into the packet and lends it the rest as pages
    /// of the ring, which a veth must then copy again (and which hold the slot until the
    /// packet is freed); with `hdr_len` the whole frame, the packet is one plain buffer.
    pub fn vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    /// The transmit ring's shape.
    pub fn tx_geometry(&self) -> RingGeometry {
        self.tx
    }

    /// Where the transmit ring starts in [`PacketRings::mem`].
    pub fn tx_base(&self) -> usize {
        self.rx.bytes()
    }

    /// Asks the kernel to send every transmit frame marked `TP_STATUS_SEND_REQUEST`, from its
    /// position on (one system call for the whole batch; the kernel hands each frame to the
    /// interface before this returns). `Ok(bytes)` sent.
    ///
    /// # Errors
    /// `EAGAIN`/`ENOBUFS`-class errors (the send buffer is full: frames stay marked and go at
    /// the next kick; or the interface dropped one frame), or anything else (the interface is
    /// gone or down).
    pub fn kick_tx(&self) -> io::Result<usize> {
        // SAFETY: a zero-length send with no buffer and no address: the kernel reads the
        // transmit ring it owns a mapping of; no user memory is passed.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// `PACKET_STATISTICS` since the previous call (reading clears the kernel's counters).
    ///
    /// # Errors
    /// The getsockopt error.
    pub fn statistics(&self) -> io::Result<RingStatistics> {
        let mut st = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `st` is a writable tpacket_stats and `len` its size; the kernel writes at
        // most `len` bytes and updates `len`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RingStatistics {
            packets: st.tp_packets,
            drops: st.tp_drops,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_places_frames_inside_blocks() {
        let g = RingGeometry {
            block_bytes: 8192,
            blocks: 3,
            frame_bytes: 3072,
        };
        assert_eq!(g.frames_per_block(), 2);
        assert_eq!(g.frames(), 6);
        assert_eq!(g.bytes(), 24576);
        assert_eq!(g.frame_offset(0), 0);
        assert_eq!(g.frame_offset(1), 3072);
        assert_eq!(
            g.frame_offset(2),
            8192,
            "the third frame starts the second block"
        );
        assert_eq!(g.frame_offset(5), 2 * 8192 + 3072);
        assert!(g.check().is_ok());
        let bad = RingGeometry {
            frame_bytes: 3000,
            ..g
        };
        assert!(bad.check().is_err(), "frames are 16-byte aligned");
        let bad = RingGeometry {
            block_bytes: 5000,
            ..g
        };
        assert!(bad.check().is_err(), "blocks are whole pages");
    }

    #[test]
    fn missing_interface_is_a_clear_error() {
        let g = RingGeometry {
            block_bytes: 4096,
            blocks: 1,
            frame_bytes: 2048,
        };
        let e = PacketRings::open("nosuchif0", g, g).unwrap_err();
        assert!(
            e.to_string()
                .contains("no network interface named 'nosuchif0'"),
            "{e}"
        );
    }
}
