//! Typed port configuration, capabilities, link status and statistics.
#![deny(unsafe_code)]

use bitflags::bitflags;

bitflags! {
    /// RX offloads a port can perform (capabilities) or is asked to (configuration).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct RxOffloads: u32 {
        /// Validate the IPv4 header checksum and report good/bad in the mbuf flags.
        const IPV4_CKSUM = 1 << 0;
        /// Validate TCP/UDP checksums and report good/bad in the mbuf flags.
        const L4_CKSUM = 1 << 1;
        /// Report the RSS hash in the mbuf.
        const RSS_HASH = 1 << 2;
        /// Strip the VLAN tag into the mbuf.
        const VLAN_STRIP = 1 << 3;
        /// Accept frames that span several mbufs.
        const SCATTER = 1 << 4;
        /// Timestamp frames on arrival.
        const TIMESTAMP = 1 << 5;
    }
}

bitflags! {
    /// TX offloads a port can perform (capabilities) or is asked to (configuration).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct TxOffloads: u32 {
        /// Fill in the IPv4 header checksum when the mbuf asks for it.
        const IPV4_CKSUM = 1 << 0;
        /// Fill in the UDP checksum when the mbuf asks for it.
        const UDP_CKSUM = 1 << 1;
        /// Fill in the TCP checksum when the mbuf asks for it.
        const TCP_CKSUM = 1 << 2;
        /// Segment TCP (TSO) when the mbuf asks for it.
        const TCP_TSO = 1 << 3;
        /// Insert the mbuf's VLAN tag.
        const VLAN_INSERT = 1 << 4;
        /// Send frames that span several mbufs.
        const MULTI_SEGS = 1 << 5;
    }
}

bitflags! {
    /// Header fields the RSS hash covers.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct RssFields: u32 {
        /// IPv4 source and destination addresses.
        const IPV4 = 1 << 0;
        /// IPv6 source and destination addresses.
        const IPV6 = 1 << 1;
        /// TCP ports (with the addresses).
        const TCP = 1 << 2;
        /// UDP ports (with the addresses).
        const UDP = 1 << 3;
    }
}

/// Length of a Toeplitz RSS key (MANA accepts exactly this; mlx5 too).
pub const RSS_KEY_LEN: usize = 40;

/// The Toeplitz key DPDK's net/mana uses when none is given.
pub const DEFAULT_RSS_KEY: [u8; RSS_KEY_LEN] = [
    0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2, 0x83, 0x19, 0xdb, 0x1a, 0x3e, 0x94,
    0x6b, 0x9e, 0x38, 0xd9, 0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56, 0x3d, 0x59,
    0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a,
];

/// Receive-side scaling: how frames are spread over RX queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssConfig {
    /// The Toeplitz key.
    pub key: [u8; RSS_KEY_LEN],
    /// The header fields hashed.
    pub fields: RssFields,
}

impl Default for RssConfig {
    fn default() -> Self {
        Self {
            key: DEFAULT_RSS_KEY,
            fields: RssFields::IPV4 | RssFields::TCP | RssFields::UDP,
        }
    }
}

/// Bytes a received frame carries beyond its MTU: the Ethernet header and one VLAN tag (the
/// FCS is never delivered). A 1500-byte MTU means frames of up to 1518 bytes; 9000 (jumbo
/// frames), 9018.
pub const L2_OVERHEAD: u16 = 14 + 4;

/// The longest frame a port with `mtu` receives ([`L2_OVERHEAD`] added): what every RX
/// buffer, that is the pool's data room, must hold.
pub const fn max_frame_bytes(mtu: u16) -> u32 {
    mtu as u32 + L2_OVERHEAD as u32
}

/// A driver's largest MTU `driver_max`, capped by what the device reports (`device_max`,
/// from the provider), never below the 68 bytes every port takes.
pub fn cap_mtu(driver_max: u16, device_max: Option<u16>) -> u16 {
    device_max.map_or(driver_max, |d| d.clamp(68, driver_max))
}

/// How to set a port up: queue counts, ring sizes, offloads, RSS, MTU.
///
/// Built from [`PortConfig::default`] with the `with_*` setters (the type is
/// `#[non_exhaustive]`, so that a new setting is not a breaking change), and readable field
/// by field:
///
/// ```
/// use pmd::port::{PortConfig, RxOffloads};
/// let cfg = PortConfig::default()
///     .with_queues(4, 4)
///     .with_ring_sizes(1024, 1024)
///     .with_rx_offloads(RxOffloads::RSS_HASH);
/// assert_eq!((cfg.rx_queues, cfg.tx_ring_size), (4, 1024));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortConfig {
    /// Number of RX queues (each owned by one core).
    pub rx_queues: u16,
    /// Number of TX queues (each owned by one core).
    pub tx_queues: u16,
    /// Descriptors per RX queue.
    pub rx_ring_size: u16,
    /// Descriptors per TX queue.
    pub tx_ring_size: u16,
    /// RX offloads requested (must be within [`Caps::rx_offloads`]).
    pub rx_offloads: RxOffloads,
    /// TX offloads requested (must be within [`Caps::tx_offloads`]).
    pub tx_offloads: TxOffloads,
    /// RSS settings (used when `rx_queues > 1` or RSS_HASH is requested).
    pub rss: RssConfig,
    /// MTU in bytes (L3 payload of a frame): frames up to [`max_frame_bytes`] are received
    /// and sent. Every frame is received into one mbuf, so the pool's data room must hold
    /// [`max_frame_bytes`]`(mtu)`: the default 2048 bytes take an MTU up to 2030; jumbo
    /// frames (9000) need a pool built with a larger data room
    /// ([`mempool::MbufPoolConfig::data_room`]).
    pub mtu: u16,
    /// Receive frames for any destination MAC (only where [`Caps::promiscuous`] says the
    /// device can; MANA cannot).
    pub promiscuous: bool,
    /// Make memory registration safe for a process that forks (`ibv_fork_init` before the
    /// first registration, on hardware ports): a child then never shares pages the device
    /// writes. Also on when `RDMAV_FORK_SAFE` or `IBV_FORK_SAFE` is set. Not needed on
    /// kernels that copy pinned pages on fork (5.13 and later), which rdma-core detects.
    pub fork_safe: bool,
    /// Queue pairs another process polls ([`crate::ethdev::export`]): made in shared files,
    /// not built or filled here, described in the directory given. `None`: every queue is
    /// this process's.
    pub export: Option<super::ExportConfig>,
}

impl Default for PortConfig {
    fn default() -> Self {
        Self {
            rx_queues: 1,
            tx_queues: 1,
            rx_ring_size: 512,
            tx_ring_size: 512,
            rx_offloads: RxOffloads::empty(),
            tx_offloads: TxOffloads::empty(),
            rss: RssConfig::default(),
            mtu: 1500,
            promiscuous: false,
            fork_safe: false,
            export: None,
        }
    }
}

impl PortConfig {
    /// Queue pairs `queues` go to other processes, described in `dir` (see
    /// [`PortConfig::export`]).
    #[must_use]
    pub fn with_export(mut self, queues: Vec<u16>, dir: impl Into<std::path::PathBuf>) -> Self {
        self.export = Some(super::ExportConfig {
            queues,
            dir: dir.into(),
        });
        self
    }

    /// `rx` RX queues and `tx` TX queues.
    #[must_use]
    pub fn with_queues(mut self, rx: u16, tx: u16) -> Self {
        (self.rx_queues, self.tx_queues) = (rx, tx);
        self
    }
    /// `n` RX queues.
    #[must_use]
    pub fn with_rx_queues(mut self, n: u16) -> Self {
        self.rx_queues = n;
        self
    }
    /// `n` TX queues.
    #[must_use]
    pub fn with_tx_queues(mut self, n: u16) -> Self {
        self.tx_queues = n;
        self
    }
    /// `rx` descriptors per RX queue and `tx` per TX queue.
    #[must_use]
    pub fn with_ring_sizes(mut self, rx: u16, tx: u16) -> Self {
        (self.rx_ring_size, self.tx_ring_size) = (rx, tx);
        self
    }
    /// `n` descriptors per RX queue.
    #[must_use]
    pub fn with_rx_ring_size(mut self, n: u16) -> Self {
        self.rx_ring_size = n;
        self
    }
    /// `n` descriptors per TX queue.
    #[must_use]
    pub fn with_tx_ring_size(mut self, n: u16) -> Self {
        self.tx_ring_size = n;
        self
    }
    /// The RX offloads requested.
    #[must_use]
    pub fn with_rx_offloads(mut self, o: RxOffloads) -> Self {
        self.rx_offloads = o;
        self
    }
    /// The TX offloads requested.
    #[must_use]
    pub fn with_tx_offloads(mut self, o: TxOffloads) -> Self {
        self.tx_offloads = o;
        self
    }
    /// The RSS settings.
    #[must_use]
    pub fn with_rss(mut self, rss: RssConfig) -> Self {
        self.rss = rss;
        self
    }
    /// The MTU (see [`PortConfig::mtu`]).
    #[must_use]
    pub fn with_mtu(mut self, mtu: u16) -> Self {
        self.mtu = mtu;
        self
    }
    /// Promiscuous mode (see [`PortConfig::promiscuous`]).
    #[must_use]
    pub fn with_promiscuous(mut self, on: bool) -> Self {
        self.promiscuous = on;
        self
    }
    /// Fork-safe memory registration (see [`PortConfig::fork_safe`]).
    #[must_use]
    pub fn with_fork_safe(mut self, on: bool) -> Self {
        self.fork_safe = on;
        self
    }
}

/// What a port can do: plain data, so apps can adapt without asking the driver twice.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caps {
    /// Most RX queues.
    pub max_rx_queues: u16,
    /// Most TX queues.
    pub max_tx_queues: u16,
    /// Smallest ring (descriptors).
    pub min_ring_size: u16,
    /// Largest ring (descriptors).
    pub max_ring_size: u16,
    /// Ring sizes must be a power of two.
    pub ring_size_pow2: bool,
    /// RX offloads available.
    pub rx_offloads: RxOffloads,
    /// TX offloads available.
    pub tx_offloads: TxOffloads,
    /// Most packets a single burst call moves.
    pub max_burst: u16,
    /// Smallest and largest MTU.
    pub mtu_range: (u16, u16),
    /// Whether the device can receive frames for any destination MAC.
    pub promiscuous: bool,
}

/// Link state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Carrier present.
    pub up: bool,
    /// Speed in Mbit/s (0 when unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Packets received (RX) or sent (TX).
    pub packets: u64,
    /// Bytes received or sent.
    pub bytes: u64,
    /// Errors (bad completions, malformed packets).
    pub errors: u64,
    /// RX: frames dropped because no buffer was posted or the pool was empty.
    pub missed: u64,
    /// RX: refills that found the pool empty.
    pub nombuf: u64,
}

/// Port statistics, summed over queues, plus the per-queue counters. Fields may be added:
/// build one from `Stats::default()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Frames the device dropped for lack of RX buffers.
    pub imissed: u64,
    /// Receive errors.
    pub ierrors: u64,
    /// Transmit errors.
    pub oerrors: u64,
    /// RX refills that found the pool empty.
    pub rx_nombuf: u64,
    /// Per RX queue.
    pub rx_queues: Vec<QueueStats>,
    /// Per TX queue.
    pub tx_queues: Vec<QueueStats>,
    /// Driver-specific counters by name (`rx_cqe_truncated`, `tx_cqe_error`, ...).
    pub xstats: Vec<(String, u64)>,
    /// The frames the port's device dropped, by direction: the basic counters' losses plus
    /// the extended counters declared as device drops ([`super::Loss`]).
    pub device_drops: super::DeviceDrops,
    /// The extended counters that count lost frames and are not zero, with their kind.
    pub losses: Vec<super::Xstat>,
}

impl Stats {
    /// These statistics with the extended counters `x`: their names and values, the device
    /// drops from the basic counters and `x`'s kinds, and the losses among them.
    pub fn with_xstats(mut self, x: Vec<super::Xstat>) -> Self {
        self.device_drops = super::DeviceDrops::of(self.imissed, self.ierrors, self.oerrors, &x);
        self.losses = x
            .iter()
            .filter(|x| x.loss.is_loss() && x.value > 0)
            .cloned()
            .collect();
        self.xstats = x.into_iter().map(|x| (x.name, x.value)).collect();
        self
    }

    /// The extended counter `name`, if the port has one.
    pub fn xstat(&self, name: &str) -> Option<u64> {
        self.xstats.iter().find(|(n, _)| n == name).map(|x| x.1)
    }
}
