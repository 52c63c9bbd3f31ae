//! Value parsers for the tools' numeric options, shared by every binary: each number has a
//! range, and anything outside it (including NaN, infinities and values whose conversion to
//! a `Duration` or a count would overflow) is a usage error naming the option and the range,
//! instead of a panic later. clap turns a parser's error into exit status 2.
#![deny(unsafe_code)]

/// The longest duration any option takes: one year, far below what `Duration` can hold.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;
/// The highest packet rate: 1 Gpps, several times a 100 Gbit/s link of minimal frames.
pub const MAX_PPS: f64 = 1e9;
/// The lowest packet rate: one packet in 1000 s.
pub const MIN_PPS: f64 = 1e-3;
/// The highest bit rate, Gbit/s.
pub const MAX_GBPS: f64 = 1000.0;
/// The lowest bit rate, Gbit/s (1 kbit/s).
pub const MIN_GBPS: f64 = 1e-6;

fn number(what: &str, s: &str, lo: f64, hi: f64, lo_open: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number ({what})"))?;
    let above_lo = if lo_open { v > lo } else { v >= lo };
    if v.is_finite() && above_lo && v <= hi {
        Ok(v)
    } else {
        let from = if lo_open {
            format!("more than {lo}")
        } else {
            format!("{lo}")
        };
        Err(format!("'{s}': expected {what} from {from} to {hi}"))
    }
}

/// Seconds, more than 0, at most [`MAX_SECONDS`] (durations, timeouts).
///
/// # Errors
/// Not a number, or out of range.
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    number("a number of seconds", s, 0.0, MAX_SECONDS, true)
}

/// Seconds, 0 or more, at most [`MAX_SECONDS`] (intervals where 0 means "none", timeouts
/// where 0 means "do not wait").
///
/// # Errors
/// Not a number, or out of range.
pub fn seconds(s: &str) -> Result<f64, String> {
    number("a number of seconds", s, 0.0, MAX_SECONDS, false)
}

/// Packets per second, [`MIN_PPS`] to [`MAX_PPS`].
///
/// # Errors
/// Not a number, or out of range.
pub fn pps(s: &str) -> Result<f64, String> {
    number("packets per second", s, MIN_PPS, MAX_PPS, false)
}

/// Gbit/s, [`MIN_GBPS`] to [`MAX_GBPS`].
///
/// # Errors
/// Not a number, or out of range.
pub fn gbps(s: &str) -> Result<f64, String> {
    number("Gbit/s", s, MIN_GBPS, MAX_GBPS, false)
}

/// A percentage, 0 to 100.
///
/// # Errors
/// Not a number, or out of range.
pub fn percent(s: &str) -> Result<f64, String> {
    number("a percentage", s, 0.0, 100.0, false)
}

/// The lowest replay speed multiplier.
pub const MIN_SPEED: f64 = 1e-3;
/// The highest replay speed multiplier.
pub const MAX_SPEED: f64 = 1e3;

/// A speed multiplier (`--pcap-speed`: 2 replays twice as fast), [`MIN_SPEED`] to
/// [`MAX_SPEED`].
///
/// # Errors
/// Not a number, or out of range.
pub fn speed(s: &str) -> Result<f64, String> {
    number("a speed multiplier", s, MIN_SPEED, MAX_SPEED, false)
}

/// Frame sizes, bytes without FCS: a comma-separated list (`64,128,1518`) of 1 to 64
/// sizes, each from [`MIN_FRAME_SIZE`] to [`MAX_FRAME_SIZE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSizes(pub Vec<u16>);

/// Parses [`FrameSizes`].
///
/// # Errors
/// An empty list, more than 64 sizes, or a size that is not a number or out of range.
pub fn frame_sizes(s: &str) -> Result<FrameSizes, String> {
    let bad = |one: &str| {
        format!(
            "'{one}' in '{s}': expected frame sizes in bytes without FCS, each from {MIN_FRAME_SIZE} to {MAX_FRAME_SIZE}, separated by commas"
        )
    };
    let mut v = Vec::new();
    for one in s.split(',') {
        let n: u16 = one.trim().parse().map_err(|_| bad(one))?;
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&n) {
            return Err(bad(one));
        }
        v.push(n);
    }
    if v.len() > 64 {
        return Err(format!("'{s}': at most 64 frame sizes"));
    }
    Ok(FrameSizes(v))
}

/// The most descriptors per queue a tool asks for (mlx5's `max_qp_wr`; the port layer
/// reduces it to what a device takes, with a warning).
pub const MAX_RING: u16 = 32768;
/// The fewest descriptors per queue.
pub const MIN_RING: u16 = 64;

/// Descriptors per queue: a power of two from [`MIN_RING`] to [`MAX_RING`], checked before
/// any memory is allocated for it.
///
/// # Errors
/// Not a number, out of range, or not a power of two.
pub fn ring_size(s: &str) -> Result<u16, String> {
    let bad = || {
        format!(
            "'{s}': expected descriptors per queue, a power of two from {MIN_RING} to {MAX_RING}"
        )
    };
    let v: u16 = s.trim().parse().map_err(|_| bad())?;
    if (MIN_RING..=MAX_RING).contains(&v) && v.is_power_of_two() {
        Ok(v)
    } else {
        Err(bad())
    }
}

/// The most mbufs `--pool-size` takes (about 37 GiB of 2,304-byte buffers).
pub const MAX_POOL: u32 = 1 << 24;
/// The fewest.
pub const MIN_POOL: u32 = 256;

/// Mbufs in a tool's pool (`--pool-size`): a count from [`MIN_POOL`] to [`MAX_POOL`]. Whether
/// it holds the rings the ports ask for is checked once the ports are open, before the pool
/// is allocated.
///
/// # Errors
/// Not a whole number, or out of range.
pub fn pool_size(s: &str) -> Result<u32, String> {
    let v: u64 = s.trim().parse().map_err(|_| {
        format!("'{s}': expected a whole number of mbufs from {MIN_POOL} to {MAX_POOL}")
    })?;
    if (u64::from(MIN_POOL)..=u64::from(MAX_POOL)).contains(&v) {
        Ok(v as u32)
    } else {
        Err(format!(
            "'{s}': expected a whole number of mbufs from {MIN_POOL} to {MAX_POOL}"
        ))
    }
}

/// The smallest MTU (IPv4's minimum datagram, 68 bytes; every device takes it).
pub const MIN_MTU: u16 = 68;
/// The largest MTU the tools set: 9000 (jumbo frames; Azure MANA's maximum, and what every
/// device model carries).
pub const MAX_MTU: u16 = 9000;
/// The smallest frame the tools send, bytes without FCS (Ethernet's 64-byte minimum less the
/// 4-byte FCS).
pub const MIN_FRAME_SIZE: u16 = 60;
/// The largest frame the tools send, without FCS: a [`MAX_MTU`] frame with its Ethernet
/// header and one VLAN tag (9018 bytes).
pub const MAX_FRAME_SIZE: u16 = MAX_MTU + pmd::port::L2_OVERHEAD;

/// An MTU in bytes, [`MIN_MTU`] to [`MAX_MTU`] (a port's device may allow less: it says so
/// when the port is configured).
///
/// # Errors
/// Not a number, or out of range.
pub fn mtu(s: &str) -> Result<u16, String> {
    integer("an MTU in bytes", s, MIN_MTU, MAX_MTU)
}

fn integer(what: &str, s: &str, lo: u16, hi: u16) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("'{s}': expected {what} from {lo} to {hi}")),
    }
}

/// Data room (bytes) for the mbufs of a tool whose ports run at `mtu`: the longest frame of
/// that MTU ([`pmd::port::max_frame_bytes`]) rounded up to 64 bytes, and never less than the
/// default 2048 (so the default MTU keeps the default pool layout).
pub fn data_room_for(mtu: u16) -> u16 {
    let frame = pmd::port::max_frame_bytes(mtu).next_multiple_of(64);
    // At most MAX_MTU + 18 rounded up: far below u16::MAX.
    (frame as u16).max(mempool::mbuf::DEFAULT_DATA_ROOM)
}

/// Why a tool failed, and so its exit status: 2 for a usage error (what the user typed cannot
/// work; clap's own errors exit 2 too), 1 for a failure while running (a port that does not
/// open, a link that stays down, a device that fails). Every tool uses the same codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The command line cannot work.
    Usage(String),
    /// Something failed while running.
    Runtime(String),
}

impl Failure {
    /// The process exit status for it.
    pub fn exit_code(&self) -> std::process::ExitCode {
        std::process::ExitCode::from(match self {
            Self::Usage(_) => 2,
            Self::Runtime(_) => 1,
        })
    }

    /// Prints `tool: message` on stderr and returns the exit status.
    pub fn report(&self, tool: &str) -> std::process::ExitCode {
        match self {
            Self::Usage(m) | Self::Runtime(m) => eprintln!("{tool}: {m}"),
        }
        self.exit_code()
    }
}

/// A failure while running, from any error message.
impl From<String> for Failure {
    fn from(m: String) -> Self {
        Self::Runtime(m)
    }
}

/// A failure while running, from a message.
impl From<&str> for Failure {
    fn from(m: &str) -> Self {
        Self::Runtime(m.to_string())
    }
}

/// A usage error.
pub fn usage(m: impl Into<String>) -> Failure {
    Failure::Usage(m.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn the_reported_crashes_are_usage_errors() {
        for bad in ["1e30", "inf", "-inf", "NaN", "-1", "0", "abc", ""] {
            assert!(positive_seconds(bad).is_err(), "{bad}");
        }
        for bad in ["1e-30", "1e30", "0", "inf"] {
            assert!(pps(bad).is_err(), "{bad}");
        }
        for bad in ["1e-25", "1e4", "NaN"] {
            assert!(gbps(bad).is_err(), "{bad}");
        }
        for bad in ["65535", "0", "63", "100", "65536", "x"] {
            assert!(ring_size(bad).is_err(), "{bad}");
        }
        for bad in ["", "59", "64,", "64,,128", "9019", "64;128", "-64", "1e3"] {
            assert!(frame_sizes(bad).is_err(), "{bad}");
        }
        assert_eq!(
            frame_sizes("64, 128,1518"),
            Ok(FrameSizes(vec![64, 128, 1518]))
        );
        for bad in ["0", "1e-4", "1001", "inf", "NaN"] {
            assert!(speed(bad).is_err(), "{bad}");
        }
        assert_eq!(ring_size("1024"), Ok(1024));
        for bad in [
            "0",
            "255",
            "16777217",
            "1e6",
            "-5",
            "99999999999999999999",
            "",
        ] {
            assert!(pool_size(bad).is_err(), "{bad}");
        }
        assert_eq!(pool_size("65535"), Ok(65535));
        for bad in ["67", "9001", "65536", "-1", "1500.5", "x", ""] {
            assert!(mtu(bad).is_err(), "{bad}");
        }
        assert_eq!(mtu(" 9000"), Ok(9000));
        assert!(mtu("9001")
            .unwrap_err()
            .contains("expected an MTU in bytes from 68 to 9000"));
        for bad in ["59", "9019", "0", "x", "60,9019"] {
            assert!(frame_sizes(bad).is_err(), "{bad}");
        }
        assert_eq!(frame_sizes("9018,60"), Ok(FrameSizes(vec![9018, 60])));
        assert_eq!(data_room_for(1500), 2048);
        assert_eq!(data_room_for(2030), 2048);
        assert_eq!(data_room_for(2031), 2112);
        assert_eq!(data_room_for(9000), 9024);
        assert_eq!(seconds("0"), Ok(0.0));
        assert_eq!(positive_seconds("2.5"), Ok(2.5));
        assert_eq!(pps("1000000"), Ok(1e6));
        assert!(positive_seconds("1e30")
            .unwrap_err()
            .contains("expected a number of seconds from more than 0 to 31536000"));
    }

    proptest! {
        /// A size list is refused, or every size in it is in range.
        #[test]
        fn frame_size_lists_are_in_range(s in "[0-9, ]{0,20}") {
            if let Ok(FrameSizes(v)) = frame_sizes(&s) {
                prop_assert!(!v.is_empty() && v.len() <= 64);
                prop_assert!(v.iter().all(|n| (MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(n)));
            }
        }

        /// Whatever the text, a parser either refuses it or returns a value in its range that
        /// the tools can use without panicking (as a `Duration`, as a rate).
        #[test]
        fn accepted_values_are_usable(s in prop_oneof![
            any::<f64>().prop_map(|v| v.to_string()),
            any::<f64>().prop_map(|v| format!("{v:e}")),
            "[-+0-9.eEinfNa]{0,12}",
        ]) {
            if let Ok(v) = positive_seconds(&s) {
                prop_assert!(v > 0.0 && v <= MAX_SECONDS);
                let _ = Duration::from_secs_f64(v);
            }
            if let Ok(v) = seconds(&s) {
                prop_assert!((0.0..=MAX_SECONDS).contains(&v));
                let _ = Duration::from_secs_f64(v);
            }
            if let Ok(v) = pps(&s) {
                prop_assert!((MIN_PPS..=MAX_PPS).contains(&v));
                // The pacing interval of one packet, and a year of packets as a count.
                let _ = Duration::from_secs_f64(1.0 / v);
                prop_assert!((v * MAX_SECONDS) < u64::MAX as f64);
            }
            if let Ok(v) = pool_size(&s) {
                prop_assert!((MIN_POOL..=MAX_POOL).contains(&v));
            }
            if let Ok(v) = speed(&s) {
                prop_assert!((MIN_SPEED..=MAX_SPEED).contains(&v));
                // A year of capture time at the slowest speed stays a usable Duration.
                let _ = Duration::from_secs_f64(MAX_SECONDS / v);
            }
            if let Ok(v) = gbps(&s) {
                prop_assert!((MIN_GBPS..=MAX_GBPS).contains(&v));
                // As packets per second of the smallest and largest frames.
                for bytes in [60.0, 9018.0] {
                    let p = v * 1e9 / (bytes * 8.0);
                    prop_assert!(p.is_finite() && p > 0.0);
                }
            }
        }
    }
}
