//! Offload flags carried in an mbuf header: what the NIC verified on receive, and what the
//! NIC is asked to do on transmit.
#![deny(unsafe_code)]

use std::fmt;
use std::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, Not};

/// A set of offload flags (a `u64` bit set, `bitflags`-style).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OffloadFlags(u64);

/// Result of a checksum check the NIC reported on receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CksumStatus {
    /// The NIC did not check (or could not parse the header).
    Unknown,
    /// The checksum is correct.
    Good,
    /// The checksum is wrong.
    Bad,
}

macro_rules! flags {
    ($($(#[$doc:meta])* $name:ident = $bit:expr;)*) => {
        impl OffloadFlags {
            $($(#[$doc])* pub const $name: OffloadFlags = OffloadFlags(1 << $bit);)*
            const NAMES: &'static [(&'static str, OffloadFlags)] = &[$((stringify!($name), OffloadFlags::$name)),*];
        }
    };
}

flags! {
    /// RX: the IPv4 header checksum was verified and is correct.
    RX_IP_CKSUM_GOOD = 0;
    /// RX: the IPv4 header checksum was verified and is wrong.
    RX_IP_CKSUM_BAD = 1;
    /// RX: the TCP/UDP checksum was verified and is correct.
    RX_L4_CKSUM_GOOD = 2;
    /// RX: the TCP/UDP checksum was verified and is wrong.
    RX_L4_CKSUM_BAD = 3;
    /// RX: the frame had a VLAN tag; the TCI is in the header's `vlan_tci`.
    RX_VLAN = 4;
    /// RX: the NIC removed the VLAN tag from the packet data (implies `RX_VLAN`).
    RX_VLAN_STRIPPED = 5;
    /// RX: the header's `rss_hash` holds the NIC's RSS hash.
    RX_RSS_HASH = 6;
    /// RX: the header's `timestamp` holds a NIC timestamp.
    RX_TIMESTAMP = 7;
    /// RX: the packet is tunnelled and the NIC found its outer IPv4 header checksum wrong
    /// (DPDK's `RTE_MBUF_F_RX_OUTER_IP_CKSUM_BAD`). Independent of the inner checksum flags:
    /// `RX_IP_CKSUM_*` and `RX_L4_CKSUM_*` describe the inner headers of such a packet.
    RX_OUTER_IP_CKSUM_BAD = 8;
    /// TX: the packet is IPv4 (needed with the checksum and TSO requests).
    TX_IPV4 = 40;
    /// TX: the packet is IPv6.
    TX_IPV6 = 41;
    /// TX: compute the IPv4 header checksum.
    TX_IP_CKSUM = 42;
    /// TX: compute the UDP checksum.
    TX_UDP_CKSUM = 43;
    /// TX: compute the TCP checksum.
    TX_TCP_CKSUM = 44;
    /// TX: TCP segmentation offload, segments of the header's `tso_segsz` bytes.
    TX_TCP_SEG = 45;
    /// TX: insert the header's `vlan_tci` as a VLAN tag.
    TX_VLAN = 46;
}

impl OffloadFlags {
    /// No flags.
    pub const fn empty() -> Self {
        OffloadFlags(0)
    }

    /// The raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Flags from raw bits, unknown bits included.
    pub const fn from_bits_retain(bits: u64) -> Self {
        OffloadFlags(bits)
    }

    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every flag in `other` is set.
    pub const fn contains(self, other: OffloadFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag in `other` is set.
    pub const fn intersects(self, other: OffloadFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// Sets the flags in `other`.
    pub fn insert(&mut self, other: OffloadFlags) {
        self.0 |= other.0;
    }

    /// Clears the flags in `other`.
    pub fn remove(&mut self, other: OffloadFlags) {
        self.0 &= !other.0;
    }

    /// Sets or clears the flags in `other`.
    pub fn set(&mut self, other: OffloadFlags, on: bool) {
        if on {
            self.insert(other)
        } else {
            self.remove(other)
        }
    }

    /// The IPv4 header checksum status on receive (both bits set reads as `Unknown`).
    pub const fn rx_ip_cksum(self) -> CksumStatus {
        status(
            self,
            OffloadFlags::RX_IP_CKSUM_GOOD,
            OffloadFlags::RX_IP_CKSUM_BAD,
        )
    }

    /// The L4 checksum status on receive (both bits set reads as `Unknown`).
    pub const fn rx_l4_cksum(self) -> CksumStatus {
        status(
            self,
            OffloadFlags::RX_L4_CKSUM_GOOD,
            OffloadFlags::RX_L4_CKSUM_BAD,
        )
    }

    /// Records the IPv4 header checksum status (for drivers on receive).
    pub fn set_rx_ip_cksum(&mut self, s: CksumStatus) {
        set_status(
            self,
            OffloadFlags::RX_IP_CKSUM_GOOD,
            OffloadFlags::RX_IP_CKSUM_BAD,
            s,
        )
    }

    /// Records the L4 checksum status (for drivers on receive).
    pub fn set_rx_l4_cksum(&mut self, s: CksumStatus) {
        set_status(
            self,
            OffloadFlags::RX_L4_CKSUM_GOOD,
            OffloadFlags::RX_L4_CKSUM_BAD,
            s,
        )
    }
}

const fn status(f: OffloadFlags, good: OffloadFlags, bad: OffloadFlags) -> CksumStatus {
    match (f.contains(good), f.contains(bad)) {
        (true, false) => CksumStatus::Good,
        (false, true) => CksumStatus::Bad,
        _ => CksumStatus::Unknown,
    }
}

fn set_status(f: &mut OffloadFlags, good: OffloadFlags, bad: OffloadFlags, s: CksumStatus) {
    f.remove(good | bad);
    match s {
        CksumStatus::Good => f.insert(good),
        CksumStatus::Bad => f.insert(bad),
        CksumStatus::Unknown => {}
    }
}

impl BitOr for OffloadFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        OffloadFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for OffloadFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for OffloadFlags {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        OffloadFlags(self.0 & rhs.0)
    }
}

impl BitAndAssign for OffloadFlags {
    fn bitand_assign(&mut self, rhs: Self) {
        self.0 &= rhs.0;
    }
}

impl Not for OffloadFlags {
    type Output = Self;
    fn not(self) -> Self {
        OffloadFlags(!self.0)
    }
}

impl fmt::Debug for OffloadFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        let mut first = true;
        f.write_str("OffloadFlags(")?;
        for (name, flag) in OffloadFlags::NAMES {
            if self.contains(*flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
                rest &= !flag.0;
            }
        }
        if rest != 0 {
            if !first {
                f.write_str(" | ")?;
            }
            write!(f, "{rest:#x}")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_status_round_trips_and_leaves_other_bits() {
        for s in [CksumStatus::Unknown, CksumStatus::Good, CksumStatus::Bad] {
            let mut f = OffloadFlags::RX_RSS_HASH | OffloadFlags::RX_L4_CKSUM_BAD;
            f.set_rx_ip_cksum(s);
            assert_eq!(f.rx_ip_cksum(), s);
            assert_eq!(f.rx_l4_cksum(), CksumStatus::Bad);
            assert!(f.contains(OffloadFlags::RX_RSS_HASH));
        }
        let both = OffloadFlags::RX_IP_CKSUM_GOOD | OffloadFlags::RX_IP_CKSUM_BAD;
        assert_eq!(both.rx_ip_cksum(), CksumStatus::Unknown);
    }

    #[test]
    fn outer_ip_cksum_bad_is_separate_from_the_inner_status() {
        let mut f = OffloadFlags::RX_OUTER_IP_CKSUM_BAD;
        assert_eq!(f.rx_ip_cksum(), CksumStatus::Unknown);
        f.set_rx_ip_cksum(CksumStatus::Good);
        f.set_rx_l4_cksum(CksumStatus::Bad);
        assert!(f.contains(OffloadFlags::RX_OUTER_IP_CKSUM_BAD));
        assert_eq!(f.rx_ip_cksum(), CksumStatus::Good);
        f.set_rx_ip_cksum(CksumStatus::Unknown);
        assert_eq!(
            format!("{f:?}"),
            "OffloadFlags(RX_L4_CKSUM_BAD | RX_OUTER_IP_CKSUM_BAD)"
        );
    }

    #[test]
    fn flags_are_distinct_and_debug_names_them() {
        let all = OffloadFlags::NAMES.iter().fold(0u64, |acc, (_, f)| {
            assert_eq!(acc & f.bits(), 0, "overlapping flag");
            acc | f.bits()
        });
        assert_eq!(all.count_ones() as usize, OffloadFlags::NAMES.len());
        let f = OffloadFlags::TX_TCP_SEG | OffloadFlags::from_bits_retain(1 << 60);
        assert_eq!(
            format!("{f:?}"),
            "OffloadFlags(TX_TCP_SEG | 0x1000000000000000)"
        );
        let mut g = f;
        g.remove(OffloadFlags::TX_TCP_SEG);
        assert!(!g.intersects(OffloadFlags::TX_TCP_SEG));
    }
}
