//! Wires: where a device model's frames go and come from.
//!
//! * [`NoWire`]: nowhere; sends are dropped, nothing arrives.
//! * [`Loopback`]: an in-process cable; the first two ports that open the same name are its ends.
//! * [`Shm`]: a cable between processes over a shared-memory file; same pairing rule. The file
//!   starts with a versioned header (signature, major/minor version, feature masks), and an
//!   incompatible peer is refused with an error that says what differs. A dead peer is
//!   noticed ([`Wire::peer_alive`]), never waited on.
//! * [`AfPacket`]: an existing Linux interface (e.g. one end of a veth pair in a network
//!   namespace), so the kernel's own stack, ping and tcpdump are real peers; through
//!   memory-mapped AF_PACKET rings, 802.1Q tags kept.
//! * [`PcapTap`]: wraps any wire and records every frame sent and received to a pcap file.
//!
//! A port spec names its wire as a [`WireSpec`] (`wire=shm:demo0`); [`open`] plugs it in.
//!
//! A wire never loses a frame silently: [`Wire::send`] says when it refused one (the device
//! model counts it as its `tx_wire_drops`), and a wire that drops frames on its own (a full
//! ring of the kernel's) reports them in [`Wire::stats`], which the models add to their
//! port's extended statistics (and [`RX_DROPS`] to its imissed).
#![deny(unsafe_code)]

mod afpacket;
pub mod faults;
mod loopback;
mod none;
mod pcap;
pub mod ring;
mod shm;
mod spec;
mod tpacket;

pub use afpacket::AfPacket;
pub use loopback::{Loopback, LOOPBACK_RING_BYTES};
pub use none::NoWire;
pub use pcap::PcapTap;
pub use shm::{
    shm_dir, shm_path, Shm, SHM_COMPAT, SHM_INCOMPAT_KNOWN, SHM_MAJOR, SHM_MINOR, SHM_RING_BYTES,
    SHM_SIGNATURE, TX_STRANDED,
};
pub use spec::{WireSpec, WireSpecError};

use crate::ethdev::Xstat;
use std::path::PathBuf;

/// Largest frame any wire carries: a 9000-byte MTU frame with Ethernet and VLAN headers fits.
pub const MAX_FRAME: usize = 9216 - 8;

/// The [`Wire::stats`] entry for frames that reached the wire and were lost before the
/// device model could take them (a full receive ring): the model's port adds it to its
/// imissed, as a NIC counts frames it had no room for.
pub const RX_DROPS: &str = "rx_drops";

/// The [`RX_DROPS`] entry of a wire's [`Wire::stats`] (0 if it has none).
pub fn rx_drops(stats: &[Xstat]) -> u64 {
    stats
        .iter()
        .filter(|x| x.name == RX_DROPS)
        .map(|x| x.value)
        .sum()
}

/// One end of a cable.
pub trait Wire: Send {
    /// Puts a frame on the wire; `false` if it was dropped (receiver full, too large, link gone).
    /// The far end may not see it before the next [`flush`](Wire::flush).
    fn send(&mut self, frame: &[u8]) -> bool;
    /// Hands every frame [`send`](Wire::send) accepted to the far end: a wire sends in
    /// bursts, as a NIC puts a batch of descriptors on the wire ([`AfPacket`]: one system
    /// call per burst; [`Loopback`] and [`Shm`]: one store of the ring's counter that the
    /// other core sees). A device model calls it once per pass, after serving its send
    /// queues. No default: a wrapper that forgot to pass it on would strand frames.
    fn flush(&mut self);
    /// Takes one arrived frame into `buf`; its length, or `None` if nothing is waiting.
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize>;
    /// Whether frames that arrived wait on the wire until the device model takes them (a
    /// kernel ring: [`AfPacket`]). A model then leaves them there while it has no receive
    /// buffer posted, as a NIC's receive FIFO holds frames while the host refills, and frames
    /// are lost only when that ring overflows (counted as [`RX_DROPS`]). A cable
    /// ([`Loopback`], [`Shm`]) says no: its model takes every frame as it comes and drops
    /// what it has no buffer for.
    fn holds_arrivals(&self) -> bool {
        false
    }
    /// Whether the far end exists and is alive (always true for wires without a notion of it).
    fn peer_alive(&self) -> bool {
        true
    }
    /// Whether the far end of the cable exists right now: the wire's link state, which a
    /// device model can report as its port's link. A cable ([`Loopback`], [`Shm`]) is attached from
    /// the moment its second end opens until one end goes away (closed, or its process
    /// died); [`AfPacket`] follows the interface's carrier; [`NoWire`] is always attached.
    ///
    /// Slow path: it may cost a system call (kill(2) for [`Shm`], an ioctl for [`AfPacket`]),
    /// so ask it when the link state is wanted, not per frame.
    fn peer_attached(&self) -> bool {
        true
    }
    /// A short description for logs and errors, e.g. `shm:demo0 (end B)`.
    fn describe(&self) -> String;
    /// Wire-level counters by name: frames the wire (or the kernel under it) dropped, and why,
    /// that [`Wire::send`]'s answer does not already tell. [`RX_DROPS`] is the one a port
    /// counts as imissed. Empty for wires that drop nothing on their own.
    ///
    /// Slow path: it may cost a system call (a getsockopt for [`AfPacket`]).
    fn stats(&self) -> Vec<Xstat> {
        Vec::new()
    }
    /// A capture on this wire (`pcap=FILE`) that stopped recording: the OS error of the
    /// write that failed (0 if there was none, e.g. a short write), or `None` while it
    /// records (or nothing captures). A device model reports it once, as
    /// [`PortEvent::CaptureFailed`](crate::ethdev::PortEvent::CaptureFailed). Wrappers pass
    /// it on. Slow path, like [`Wire::stats`].
    fn capture_error(&self) -> Option<i32> {
        None
    }
}

/// Errors opening a wire.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The cable already has two ends.
    #[error("wire '{name}' already has two live ends (pids {a} and {b}): pick another name")]
    CableFull {
        /// Wire name.
        name: String,
        /// Owner of end A.
        a: u64,
        /// Owner of end B.
        b: u64,
    },
    /// A shared-memory file could not be created, opened or mapped.
    #[error("shared-memory wire '{name}' ({path}): {source}")]
    Shm {
        /// Wire name.
        name: String,
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a wire of ours.
    #[error(
        "{path} is not a pmd shared-memory wire (bad signature): remove it (`rm -f {path}`) or pick another name"
    )]
    NotAWire {
        /// The file.
        path: PathBuf,
    },
    /// The peer speaks another major version of the wire format.
    #[error("wire {path}: peer uses wire format {theirs_major}.{theirs_minor}, this build speaks {ours_major}.x: run the same version on both ends (a file an older build left behind: `rm -f {path}`)")]
    IncompatibleVersion {
        /// The file.
        path: PathBuf,
        /// Peer's major version.
        theirs_major: u16,
        /// Peer's minor version.
        theirs_minor: u16,
        /// Our major version.
        ours_major: u16,
    },
    /// The peer requires features this build does not know.
    #[error("wire {path}: peer requires wire features {unknown:#x} that this build does not know: upgrade this side")]
    IncompatibleFeatures {
        /// The file.
        path: PathBuf,
        /// The unknown incompatible feature bits.
        unknown: u32,
    },
    /// A file under the wire's name without a header: left by a run that crashed while
    /// making it (an older build made files in place), or being made by an older build.
    #[error("wire '{name}': {path} has no header (a run that crashed while creating it, or an older build, left it behind): if no process uses wire '{name}', remove it with `rm -f {path}`")]
    HalfMade {
        /// Wire name.
        name: String,
        /// The file.
        path: PathBuf,
    },
    /// The AF_PACKET socket could not be opened.
    #[error("afpacket wire on '{ifname}': {source} (needs CAP_NET_RAW and an existing interface)")]
    AfPacket {
        /// Interface.
        ifname: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The pcap file could not be written.
    #[error("pcap capture {path}: {source}")]
    Pcap {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// Opens the wire a port spec names.
///
/// # Errors
/// See [`WireError`].
pub fn open(spec: &WireSpec) -> Result<Box<dyn Wire>, WireError> {
    Ok(match spec {
        WireSpec::None => Box::new(NoWire),
        WireSpec::Loopback(name) => Box::new(Loopback::open(name)?),
        WireSpec::Shm(name) => Box::new(Shm::open(name)?),
        WireSpec::AfPacket(ifname) => Box::new(AfPacket::open(ifname)?),
    })
}
