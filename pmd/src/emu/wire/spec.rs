//! [`WireSpec`]: which wire a device-model port is plugged into, as written in a devargs
//! string (`wire=shm:demo0`).
#![deny(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// Where a device model's frames go.
///
/// Parsed from `loop:NAME`, `shm:NAME`, `afpacket:IFACE` or `none`; [`Display`](fmt::Display)
/// writes the same form back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireSpec {
    /// Nowhere: sent frames are counted and dropped, nothing arrives.
    None,
    /// In-process cable: two ports with the same name are its two ends.
    Loopback(String),
    /// Shared-memory cable between processes: two ports with the same name are its two ends.
    Shm(String),
    /// AF_PACKET socket on an existing Linux interface (e.g. one end of a veth pair).
    AfPacket(String),
}

impl WireSpec {
    /// The forms a wire spec takes, for error messages.
    pub const EXPECTED: &'static str = "loop:NAME, shm:NAME, afpacket:IFACE or none";
}

/// A string that does not name a wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad wire '{value}': expected {}", WireSpec::EXPECTED)]
pub struct WireSpecError {
    /// What was given.
    pub value: String,
}

impl WireSpecError {
    /// The forms that would have been accepted ([`WireSpec::EXPECTED`]).
    pub fn expected(&self) -> &'static str {
        WireSpec::EXPECTED
    }
}

impl FromStr for WireSpec {
    type Err = WireSpecError;

    /// Names are 1 to 64 bytes without `/` or NUL (a shared-memory wire's name becomes part
    /// of a file name); an interface name is at most 15 bytes (Linux's IFNAMSIZ - 1).
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = || WireSpecError {
            value: value.to_string(),
        };
        if value == "none" {
            return Ok(WireSpec::None);
        }
        let (kind, name) = value.split_once(':').ok_or_else(bad)?;
        if name.is_empty() || name.contains(['/', '\0']) || name.len() > 64 {
            return Err(bad());
        }
        match kind {
            "loop" => Ok(WireSpec::Loopback(name.to_string())),
            "shm" => Ok(WireSpec::Shm(name.to_string())),
            // Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
            "afpacket" if name.len() <= 15 => Ok(WireSpec::AfPacket(name.to_string())),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for WireSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireSpec::None => f.write_str("none"),
            WireSpec::Loopback(n) => write!(f, "loop:{n}"),
            WireSpec::Shm(n) => write!(f, "shm:{n}"),
            WireSpec::AfPacket(n) => write!(f, "afpacket:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_form_parses() {
        let p = |s: &str| s.parse::<WireSpec>();
        assert_eq!(p("none"), Ok(WireSpec::None));
        assert_eq!(p("loop:a"), Ok(WireSpec::Loopback("a".into())));
        assert_eq!(p("shm:demo0"), Ok(WireSpec::Shm("demo0".into())));
        assert_eq!(p("shm:a:b"), Ok(WireSpec::Shm("a:b".into())));
        assert_eq!(p("afpacket:veth1"), Ok(WireSpec::AfPacket("veth1".into())));
        assert_eq!(
            p("afpacket:fifteen-bytes-1"),
            Ok(WireSpec::AfPacket("fifteen-bytes-1".into()))
        );
    }

    #[test]
    fn bad_strings_are_refused_with_the_expected_forms() {
        let too_long = format!("shm:{}", "x".repeat(65));
        for bad in [
            "",
            "None",
            "shm",
            "shm:",
            "tcp:x",
            "shm:a/b",
            "loop:a\0",
            "afpacket:sixteen-bytes-12",
            too_long.as_str(),
        ] {
            let e = bad.parse::<WireSpec>().expect_err(bad);
            assert_eq!(e.value, bad);
            assert_eq!(e.expected(), WireSpec::EXPECTED);
            assert_eq!(
                e.to_string(),
                format!("bad wire '{bad}': expected loop:NAME, shm:NAME, afpacket:IFACE or none")
            );
        }
    }

    proptest! {
        #[test]
        fn display_parses_back(name in "[a-z][a-z0-9_:.-]{0,14}", kind in 0..4u8) {
            let spec = match kind {
                0 => WireSpec::None,
                1 => WireSpec::Loopback(name),
                2 => WireSpec::Shm(name),
                _ => WireSpec::AfPacket(name),
            };
            prop_assert_eq!(spec.to_string().parse::<WireSpec>(), Ok(spec));
        }
    }
}
