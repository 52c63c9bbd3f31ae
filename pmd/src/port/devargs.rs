//! `PortSpec`: which port to open, parsed once from a devargs string at the command-line edge.
//!
//! Grammar: `KIND[:KEY=VALUE[,KEY=VALUE]...]`. Values may themselves contain `:` (a wire such
//! as `shm:demo0`) but not `,`.
//!
//! | kind | keys |
//! |---|---|
//! | `mana` | `mac=MAC`, `dev=IBDEV`, `port=N` (IB port, 1-based), `netdev=IFNAME` (the port's kernel netdev), `busy=...` (below), `recover-timeout=SECONDS` (below) |
//! | `mlx5` | `mac=MAC`, `dev=IBDEV`, `port=N`, `netdev=IFNAME`, `inline=N`, `cqe-comp=0\|1`, `recover-timeout=SECONDS` (below) |
//! | `emu-mana` | `wire=loop:NAME\|shm:NAME\|afpacket:IFACE\|none`, `mac=MAC`, `pcap=FILE` (capture), `netdev=IFNAME` (the modelled kernel netdev), `busy=...` (below), `engine=inline\|thread` (below), `cqe-coalesce=0\|1` (RX_COALESCED_4 completions, as newer kernels set up; default 0), `faults=...`, `fault-period=SECONDS` (below) |
//! | `emu-mlx5` | `wire=...`, `mac=MAC`, `pcap=FILE`, `netdev=IFNAME`, `inline=N` (bytes the modelled device needs inline: 0, or 18 for a ConnectX-4), `mprq=0\|1` (multi-packet RQs), `mprq-log-stride=N` (log2 stride bytes, default 11), `mprq-log-strides=N` (log2 strides per WQE, default 6), `cqe-comp=0\|1` (compressed RX CQEs, default 1), `engine=inline\|thread`, `faults=...`, `fault-period=SECONDS` (below) |
//! | `null` | `size=BYTES` (frame size, 14..=9600, default 64), `mac=MAC` |
//!
//! Every kind also takes `rxq=N` and `txq=N` (queue counts, 1..=64), which override the
//! application's defaults for that port.
//!
//! How a device-model port's engine gets its CPU (`engine=`, see `emu::thread`): `inline`
//! (the default) does the device's work on the threads that poll the port's queues, so a
//! process needs no thread beyond its polling cores and the model costs no CPU of its own;
//! `thread` gives the model its own busy-polling thread, which works whether or not anyone
//! polls (the device then completes and receives on its own, like a NIC). Without `engine=`,
//! the environment variable `PMD_EMU_ENGINE=inline|thread` decides, else inline.
//!
//! Faults on purpose (device-model kinds, see `emu::faults`): `faults=KIND[+KIND...]` or
//! `faults=all` makes the model inject each kind in turn for `fault-period=SECONDS` (default
//! 1, at least 0.001), with a clean period between two, for as long as the port is open: what
//! a soak run (`bench/soak.sh`) uses. The kinds: `link` (the link down), `rx-drop` (frames
//! dropped on arrival), `tx-error` (TX WQEs failing); `emu-mana` also `rx-error` (frames
//! truncated) and `slow-completions`; `emu-mlx5` also `rx-bad-key`, `tx-bad-key` (a DMA
//! meeting an unknown memory key, which puts the queue in error) and `state-change` (TX
//! errors whose first queue recovery step fails). Every frame a fault costs is counted in the
//! port's device counters.
//!
//! What a MANA port does when the kernel's netdev holds it ([`BusyPolicy`], see
//! [`crate::takeover`]):
//!
//! | keys | policy |
//! |---|---|
//! | `busy=fail` (default) | fail at once, naming the netdev, its master and the command that frees the port |
//! | `busy=wait`, `busy-timeout=SECONDS` | retry queue creation until the port is free, at most SECONDS (default 30, up to 86400, millisecond precision) |
//! | `busy=takeover`, or `takeover=1` | bring the netdev and its master down now, up again when the port closes |
//!
//! A `mana:` or `mlx5:` port whose device fails or goes away (a device reset during Azure
//! host servicing, a VF hot removal) recovers by itself when the device comes back (see
//! `crate::port`): `recover-timeout=SECONDS` (default 120, up to 86400, millisecond
//! precision) is how long it waits before it gives up.
//!
//! `takeover=0|1` is the older spelling: `takeover=1` with `busy=fail|wait`, or `takeover=0`
//! with `busy=takeover`, is refused as a contradiction; `busy-timeout` without `busy=wait`
//! too.
#![deny(unsafe_code)]

#[cfg(feature = "emu")]
use crate::emu::wire::{WireSpec, WireSpecError};
#[cfg(feature = "emu")]
use crate::emu::EngineMode;
use crate::net::MacAddr;
use crate::takeover::{BusyPolicy, DEFAULT_BUSY_TIMEOUT, MAX_BUSY_TIMEOUT};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Frame size a `null` port hands out when `size=` is not given.
pub const NULL_DEFAULT_SIZE: u16 = 64;
/// Largest queue count a spec may ask for.
pub const MAX_QUEUES: u16 = 64;

/// A port to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The device and its kind-specific settings.
    pub kind: PortKind,
    /// `rxq=`: RX queue count for this port, if given.
    pub rxq: Option<u16>,
    /// `txq=`: TX queue count for this port, if given.
    pub txq: Option<u16>,
    /// `pcap=FILE` (device-model kinds): record every frame the port sends and receives.
    pub pcap: Option<String>,
    /// `netdev=IFNAME`: for `mana`, select the port whose kernel netdev this is; for the
    /// device-model kinds, a Linux interface that plays the kernel's netdev of the modelled
    /// port: while it is up, it holds the port (as on MANA).
    pub netdev: Option<String>,
    /// `busy=` (mana, emu-mana): what to do when the kernel's netdev holds the port.
    pub busy: BusyPolicy,
    /// `recover-timeout=SECONDS` (mana, mlx5): how long a port whose device failed or went
    /// away waits for it to come back before it gives up (`None`: [`DEFAULT_RECOVER_TIMEOUT`]).
    pub recover_timeout: Option<Duration>,
}

/// How long a `mana:`/`mlx5:` port waits for its device to come back after a reset or a hot
/// removal, unless `recover-timeout=` says otherwise. Azure host servicing takes the device
/// away for about 10 s; this leaves room for slow ones.
pub const DEFAULT_RECOVER_TIMEOUT: Duration = Duration::from_secs(120);

/// The device part of a [`PortSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortKind {
    /// A real MANA port; with no keys, the first MANA port found.
    Mana {
        /// Select the port whose netdev has this MAC.
        mac: Option<MacAddr>,
        /// Select this IB device (e.g. `mana_0`).
        dev: Option<String>,
        /// Select this IB port (1-based).
        port: Option<u32>,
    },
    /// A real mlx5 port; with no keys, the first mlx5 port found.
    Mlx5 {
        /// Select the port whose netdev has this MAC.
        mac: Option<MacAddr>,
        /// Select this IB device (e.g. `mlx5_0`).
        dev: Option<String>,
        /// Select this IB port (1-based).
        port: Option<u32>,
        /// `inline=N`: inline at least N bytes of each frame (the device's own minimum, 18
        /// on ConnectX-4, is always honoured).
        inline: Option<u16>,
        /// `cqe-comp=0|1`: compressed receive CQEs where the device has them (default 1,
        /// as DPDK's `rxq_cqe_comp_en`).
        cqe_comp: bool,
    },
    /// The MANA device model.
    #[cfg(feature = "emu")]
    EmuMana {
        /// Where its frames go.
        wire: WireSpec,
        /// Its MAC address (default: a locally administered one).
        mac: Option<MacAddr>,
        /// `engine=inline|thread`; `None`: `PMD_EMU_ENGINE`, else inline.
        engine: Option<EngineMode>,
        /// `cqe-coalesce=1`: the device completes up to four received packets per
        /// RX_COALESCED_4 CQE, as `mana_ib` sets up RSS QPs on newer kernels (default: off,
        /// as on older kernels; the driver handles both).
        coalesce: bool,
        /// `faults=`, `fault-period=`: faults that take turns (see the module docs).
        faults: Option<crate::emu::faults::FaultPlan>,
    },
    /// The mlx5 device model.
    #[cfg(feature = "emu")]
    EmuMlx5 {
        /// Where its frames go.
        wire: WireSpec,
        /// Its MAC address.
        mac: Option<MacAddr>,
        /// `inline=N`: bytes of each frame the modelled device needs inline in the WQE (0:
        /// ConnectX-5 and later, the default; 18: ConnectX-4).
        inline: u16,
        /// The mlx5 driver's receive options: `mprq=1` with `mprq-log-stride=N` and
        /// `mprq-log-strides=N` (striding RQs, DPDK's `mprq_en`, `mprq_log_stride_size`,
        /// `mprq_log_stride_num`), `cqe-comp=0|1` (DPDK's `rxq_cqe_comp_en`).
        rx: crate::mlx5::Options,
        /// `engine=inline|thread`; `None`: `PMD_EMU_ENGINE`, else inline.
        engine: Option<EngineMode>,
        /// `faults=`, `fault-period=`: faults that take turns (see the module docs).
        faults: Option<crate::emu::faults::FaultPlan>,
    },
    /// No device: RX hands out `size`-byte frames, TX frees what it is given.
    Null {
        /// Frame size in bytes.
        size: u16,
        /// Its MAC address.
        mac: Option<MacAddr>,
    },
}

/// A devargs string that does not describe a port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DevargsError {
    /// Nothing to parse.
    #[error("empty port spec: expected KIND[:KEY=VALUE,...], KIND one of {}", KINDS.join(", "))]
    Empty,
    /// The part before `:` is not a port kind.
    #[error("unknown port kind '{kind}': expected one of {}", KINDS.join(", "))]
    UnknownKind {
        /// What was given.
        kind: String,
    },
    /// A key this kind does not take.
    #[error("'{kind}' ports take no key '{key}': accepted keys are {accepted}")]
    UnknownKey {
        /// The port kind.
        kind: &'static str,
        /// The offending key.
        key: String,
        /// The keys that kind accepts.
        accepted: String,
    },
    /// A control character (a tab, a newline, ...) anywhere in the string.
    #[error("devargs contain the control character {ch:?}: keys and values are printable text")]
    ControlCharacter {
        /// The character.
        ch: char,
    },
    /// `key` without `=value`, or with an empty value.
    #[error("'{key}' needs a value: write {key}=VALUE")]
    MissingValue {
        /// The key.
        key: String,
    },
    /// A key given twice.
    #[error("'{key}' given more than once")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// A value that does not parse.
    #[error("bad value '{value}' for '{key}': expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// What was given.
        value: String,
        /// What would be accepted.
        expected: &'static str,
    },
    /// A `faults=` value that names no fault of the model, or one twice.
    #[error("bad value '{value}' for 'faults': {why}")]
    BadFaults {
        /// What was given.
        value: String,
        /// Why it was refused, and what the model has.
        why: String,
    },
    /// A kind this build leaves out.
    #[error("'{kind}' ports are not in this build: rebuild pmd with feature `{feature}`")]
    NotBuilt {
        /// The port kind.
        kind: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// Two keys that contradict each other.
    #[error("'{first}' and '{second}' contradict each other: {why}")]
    Conflict {
        /// One key=value.
        first: String,
        /// The other.
        second: String,
        /// Why, and what to write instead.
        why: &'static str,
    },
    /// A key the kind cannot do without.
    #[error("'{kind}' ports need '{key}=': {hint}")]
    MissingKey {
        /// The port kind.
        kind: &'static str,
        /// The missing key.
        key: &'static str,
        /// An example.
        hint: &'static str,
    },
}

/// The port kinds a spec can name (every kind is known, even one this build leaves out, so
/// the error can say so).
pub const KINDS: &[&str] = &["mana", "mlx5", "emu-mana", "emu-mlx5", "null"];

fn accepted_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "mana" => &[
            "mac",
            "dev",
            "port",
            "netdev",
            "busy",
            "busy-timeout",
            "takeover",
            "recover-timeout",
            "rxq",
            "txq",
        ],
        "mlx5" => &[
            "mac",
            "dev",
            "port",
            "netdev",
            "inline",
            "cqe-comp",
            "recover-timeout",
            "rxq",
            "txq",
        ],
        "emu-mana" => &[
            "wire",
            "mac",
            "pcap",
            "netdev",
            "busy",
            "busy-timeout",
            "takeover",
            "engine",
            "cqe-coalesce",
            "faults",
            "fault-period",
            "rxq",
            "txq",
        ],
        "emu-mlx5" => &[
            "wire",
            "mac",
            "pcap",
            "netdev",
            "inline",
            "mprq",
            "mprq-log-stride",
            "mprq-log-strides",
            "cqe-comp",
            "engine",
            "faults",
            "fault-period",
            "rxq",
            "txq",
        ],
        _ => &["size", "mac", "rxq", "txq"],
    }
}

#[cfg(feature = "emu")]
fn parse_wire(value: &str) -> Result<WireSpec, DevargsError> {
    value
        .parse()
        .map_err(|e: WireSpecError| DevargsError::BadValue {
            key: "wire",
            expected: e.expected(),
            value: e.value,
        })
}

#[cfg(feature = "emu")]
fn parse_engine(value: &str) -> Result<EngineMode, DevargsError> {
    value.parse().map_err(|()| DevargsError::BadValue {
        key: "engine",
        value: value.into(),
        expected: EngineMode::EXPECTED,
    })
}

fn parse_num<T: FromStr + PartialOrd + Copy>(
    key: &'static str,
    value: &str,
    range: (T, T),
    expected: &'static str,
) -> Result<T, DevargsError> {
    match value.parse::<T>() {
        Ok(v) if v >= range.0 && v <= range.1 => Ok(v),
        _ => Err(DevargsError::BadValue {
            key,
            value: value.to_string(),
            expected,
        }),
    }
}

fn parse_mac(value: &str) -> Result<MacAddr, DevargsError> {
    value.parse().map_err(|_| DevargsError::BadValue {
        key: "mac",
        value: value.to_string(),
        expected: "six hex byte pairs like 00:15:5d:01:02:03",
    })
}

/// `inline=N`: bytes of each frame inline in the WQE.
fn parse_inline(value: &str) -> Result<u16, DevargsError> {
    value
        .parse::<u16>()
        .ok()
        .filter(|n| *n <= 255)
        .ok_or_else(|| DevargsError::BadValue {
            key: "inline",
            value: value.into(),
            expected: "the bytes the device needs inline, 0 to 255 (18 for a ConnectX-4)",
        })
}

/// `busy-timeout=SECONDS`: a positive number of seconds, millisecond precision.
fn parse_timeout(value: &str) -> Result<Duration, DevargsError> {
    parse_seconds("busy-timeout", value)
}

/// `KEY=SECONDS`: a positive number of seconds, millisecond precision, at most a day.
fn parse_seconds(key: &'static str, value: &str) -> Result<Duration, DevargsError> {
    let bad = || DevargsError::BadValue {
        key,
        value: value.to_string(),
        expected: "a number of seconds from 0.001 to 86400, e.g. 30 or 2.5",
    };
    let secs: f64 = value.parse().map_err(|_| bad())?;
    if !secs.is_finite() {
        return Err(bad());
    }
    let ms = (secs * 1000.0).round();
    if ms < 1.0 || ms > MAX_BUSY_TIMEOUT.as_millis() as f64 {
        return Err(bad());
    }
    Ok(Duration::from_millis(ms as u64))
}

/// `busy=`, `busy-timeout=` and the older `takeover=` together.
fn parse_busy(
    busy: Option<&str>,
    timeout: Option<&str>,
    takeover: Option<&str>,
) -> Result<BusyPolicy, DevargsError> {
    let takeover = match takeover {
        None => None,
        Some("0" | "no" | "false") => Some(false),
        Some("1" | "yes" | "true") => Some(true),
        Some(v) => {
            return Err(DevargsError::BadValue {
                key: "takeover",
                value: v.into(),
                expected: "1 or 0 (yes/no); or write busy=takeover",
            })
        }
    };
    let wait_timeout = timeout.map(parse_timeout).transpose()?;
    let policy = match busy {
        None => None,
        Some("fail") => Some(BusyPolicy::Fail),
        Some("wait") => Some(BusyPolicy::Wait {
            timeout: wait_timeout.unwrap_or(DEFAULT_BUSY_TIMEOUT),
        }),
        Some("takeover") => Some(BusyPolicy::Takeover),
        Some(v) => {
            return Err(DevargsError::BadValue {
                key: "busy",
                value: v.into(),
                expected: "fail, wait or takeover",
            })
        }
    };
    if let (Some(t), false) = (timeout, matches!(policy, Some(BusyPolicy::Wait { .. }))) {
        return Err(DevargsError::Conflict {
            first: format!("busy-timeout={t}"),
            second: format!("busy={}", policy.map_or("fail", |p| p.name())),
            why: "busy-timeout is how long busy=wait waits; add busy=wait or drop busy-timeout",
        });
    }
    match (policy, takeover) {
        (Some(p), None) => Ok(p),
        (None, t) => Ok(if t == Some(true) {
            BusyPolicy::Takeover
        } else {
            BusyPolicy::Fail
        }),
        (Some(p), Some(t)) if (p == BusyPolicy::Takeover) == t => Ok(p),
        (Some(p), Some(t)) => Err(DevargsError::Conflict {
            first: format!("takeover={}", u8::from(t)),
            second: format!("busy={}", p.name()),
            why: "takeover=1 is the older spelling of busy=takeover; give only busy=",
        }),
    }
}

/// A `0|1` switch (also `no|yes`, `false|true`).
fn parse_switch(key: &'static str, value: &str) -> Result<bool, DevargsError> {
    match value {
        "0" | "no" | "false" => Ok(false),
        "1" | "yes" | "true" => Ok(true),
        _ => Err(DevargsError::BadValue {
            key,
            value: value.into(),
            expected: "1 or 0 (yes/no)",
        }),
    }
}

#[cfg(feature = "emu")]
/// The mlx5 receive options: `mprq=`, `mprq-log-stride=`, `mprq-log-strides=`, `cqe-comp=`.
/// The geometry is checked against the device (and the MTU, the ring) when the port is
/// configured; here only against what the format can hold.
fn parse_mlx5_rx<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<crate::mlx5::Options, DevargsError> {
    let mprq = get("mprq")
        .map(|v| parse_switch("mprq", v))
        .transpose()?
        .unwrap_or(false);
    let log_stride = get("mprq-log-stride")
        .map(|v| {
            parse_num(
                "mprq-log-stride",
                v,
                (6u8, 15),
                "log2 of the stride size in bytes, 6 to 15 (11: 2048-byte strides)",
            )
        })
        .transpose()?;
    let log_strides = get("mprq-log-strides")
        .map(|v| {
            parse_num(
                "mprq-log-strides",
                v,
                (1u8, 16),
                "log2 of the strides per WQE, 1 to 16 (6: 64 strides)",
            )
        })
        .transpose()?;
    if !mprq {
        let given = [
            ("mprq-log-stride", log_stride),
            ("mprq-log-strides", log_strides),
        ];
        if let Some((key, Some(v))) = given.into_iter().find(|(_, v)| v.is_some()) {
            return Err(DevargsError::Conflict {
                first: format!("{key}={v}"),
                second: format!("mprq={}", get("mprq").unwrap_or("0")),
                why: "the stride geometry applies to multi-packet RQs only: add mprq=1",
            });
        }
    }
    let d = crate::mlx5::Mprq::DEFAULT;
    Ok(crate::mlx5::Options {
        mprq: mprq.then(|| crate::mlx5::Mprq {
            log_stride_bytes: log_stride.unwrap_or(d.log_stride_bytes),
            log_strides: log_strides.unwrap_or(d.log_strides),
        }),
        cqe_compression: get("cqe-comp")
            .map(|v| parse_switch("cqe-comp", v))
            .transpose()?
            .unwrap_or(true),
    })
}

#[cfg(feature = "emu")]
/// `faults=` and `fault-period=` against the kinds a model has.
fn parse_faults<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    model: &'static [crate::emu::faults::FaultKind],
) -> Result<Option<crate::emu::faults::FaultPlan>, DevargsError> {
    use crate::emu::faults::{FaultPlan, DEFAULT_PERIOD};
    let period = get("fault-period")
        .map(|v| parse_seconds("fault-period", v))
        .transpose()?;
    let Some(text) = get("faults") else {
        return match (period, get("fault-period")) {
            (Some(_), Some(v)) => Err(DevargsError::Conflict {
                first: format!("fault-period={v}"),
                second: "no faults=".into(),
                why: "fault-period is how long each of the faults= lasts: add faults=KIND or faults=all",
            }),
            _ => Ok(None),
        };
    };
    FaultPlan::parse(text, model, period.unwrap_or(DEFAULT_PERIOD))
        .map(Some)
        .map_err(|e| DevargsError::BadFaults {
            value: text.into(),
            why: e.to_string(),
        })
}

fn parse_dev(value: &str) -> Result<String, DevargsError> {
    if value.len() > 64 || value.contains(['/', '\0']) {
        return Err(DevargsError::BadValue {
            key: "dev",
            value: value.into(),
            expected: "an IB device name like mana_0",
        });
    }
    Ok(value.to_string())
}

impl FromStr for PortSpec {
    type Err = DevargsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(DevargsError::Empty);
        }
        let (kind_str, rest) = s.split_once(':').unwrap_or((s, ""));
        let kind: &'static str =
            KINDS
                .iter()
                .copied()
                .find(|k| *k == kind_str)
                .ok_or_else(|| DevargsError::UnknownKind {
                    kind: kind_str.to_string(),
                })?;
        let accepted = accepted_keys(kind);

        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(DevargsError::ControlCharacter { ch: c });
        }
        let mut pairs: Vec<(&'static str, &str)> = Vec::new();
        // Spaces around a key or value are not part of it (as around the whole string).
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').unwrap_or((item, ""));
            let (key, value) = (key.trim(), value.trim());
            let key: &'static str =
                accepted
                    .iter()
                    .copied()
                    .find(|k| *k == key)
                    .ok_or_else(|| DevargsError::UnknownKey {
                        kind,
                        key: key.to_string(),
                        accepted: accepted.join(", "),
                    })?;
            if value.is_empty() {
                return Err(DevargsError::MissingValue {
                    key: key.to_string(),
                });
            }
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(DevargsError::Duplicate {
                    key: key.to_string(),
                });
            }
            pairs.push((key, value));
        }
        let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let queues = |key: &'static str| {
            get(key)
                .map(|v| parse_num(key, v, (1u16, MAX_QUEUES), "a queue count from 1 to 64"))
                .transpose()
        };
        let mac = get("mac").map(parse_mac).transpose()?;
        let dev = get("dev").map(parse_dev).transpose()?;
        let port = get("port")
            .map(|v| parse_num("port", v, (1u32, 256), "an IB port number from 1 to 256"))
            .transpose()?;
        #[cfg(feature = "emu")]
        let wire = || match get("wire") {
            Some(w) => parse_wire(w),
            None => Err(DevargsError::MissingKey {
                kind,
                key: "wire",
                hint: "e.g. emu-mana:wire=shm:demo0 (or wire=none)",
            }),
        };
        let kind = match kind {
            "mana" => PortKind::Mana { mac, dev, port },
            "mlx5" => PortKind::Mlx5 {
                mac,
                dev,
                port,
                inline: get("inline").map(parse_inline).transpose()?,
                cqe_comp: get("cqe-comp")
                    .map(|v| parse_switch("cqe-comp", v))
                    .transpose()?
                    .unwrap_or(true),
            },
            #[cfg(feature = "emu")]
            "emu-mana" => PortKind::EmuMana {
                wire: wire()?,
                mac,
                engine: get("engine").map(parse_engine).transpose()?,
                coalesce: get("cqe-coalesce")
                    .map(|v| parse_switch("cqe-coalesce", v))
                    .transpose()?
                    .unwrap_or(false),
                faults: parse_faults(get, crate::emu::faults::MANA_KINDS)?,
            },
            #[cfg(feature = "emu")]
            "emu-mlx5" => PortKind::EmuMlx5 {
                wire: wire()?,
                mac,
                inline: get("inline").map(parse_inline).transpose()?.unwrap_or(0),
                rx: parse_mlx5_rx(get)?,
                engine: get("engine").map(parse_engine).transpose()?,
                faults: parse_faults(get, crate::emu::faults::MLX5_KINDS)?,
            },
            #[cfg(not(feature = "emu"))]
            "emu-mana" | "emu-mlx5" => {
                return Err(DevargsError::NotBuilt {
                    kind,
                    feature: "emu",
                })
            }
            _ => PortKind::Null {
                size: get("size")
                    .map(|v| {
                        parse_num(
                            "size",
                            v,
                            (14u16, 9600),
                            "a frame size from 14 to 9600 bytes",
                        )
                    })
                    .transpose()?
                    .unwrap_or(NULL_DEFAULT_SIZE),
                mac,
            },
        };
        let pcap = get("pcap").map(str::to_string);
        let netdev = get("netdev")
            .map(|v| {
                if v.len() < 16 && !v.contains(['/', '\0', ' ']) {
                    Ok(v.to_string())
                } else {
                    Err(DevargsError::BadValue {
                        key: "netdev",
                        value: v.into(),
                        expected: "a Linux interface name (at most 15 bytes)",
                    })
                }
            })
            .transpose()?;
        let busy = parse_busy(get("busy"), get("busy-timeout"), get("takeover"))?;
        let recover_timeout = get("recover-timeout")
            .map(|v| parse_seconds("recover-timeout", v))
            .transpose()?;
        Ok(PortSpec {
            kind,
            rxq: queues("rxq")?,
            txq: queues("txq")?,
            pcap,
            netdev,
            busy,
            recover_timeout,
        })
    }
}

#[cfg(feature = "emu")]
/// `faults=` and `fault-period=` as they parse back (the period only when not the default).
fn faults_parts(plan: Option<&crate::emu::faults::FaultPlan>) -> Vec<String> {
    let Some(p) = plan else {
        return Vec::new();
    };
    let mut v = vec![format!("faults={}", p.kinds_text())];
    if p.period != crate::emu::faults::DEFAULT_PERIOD {
        v.push(format!("fault-period={}", p.period.as_secs_f64()));
    }
    v
}

impl fmt::Display for PortSpec {
    /// The canonical devargs string; it parses back to the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let kind = match &self.kind {
            PortKind::Mana { mac, dev, port } => {
                parts.extend(mac.map(|m| format!("mac={m}")));
                parts.extend(dev.as_ref().map(|d| format!("dev={d}")));
                parts.extend(port.map(|p| format!("port={p}")));
                "mana"
            }
            PortKind::Mlx5 {
                mac,
                dev,
                port,
                inline,
                cqe_comp,
            } => {
                parts.extend(mac.map(|m| format!("mac={m}")));
                parts.extend(dev.as_ref().map(|d| format!("dev={d}")));
                parts.extend(port.map(|p| format!("port={p}")));
                parts.extend(inline.map(|n| format!("inline={n}")));
                if !cqe_comp {
                    parts.push("cqe-comp=0".into());
                }
                "mlx5"
            }
            #[cfg(feature = "emu")]
            PortKind::EmuMana {
                wire,
                mac,
                engine,
                coalesce,
                faults,
            } => {
                parts.push(format!("wire={wire}"));
                parts.extend(mac.map(|m| format!("mac={m}")));
                parts.extend(engine.map(|e| format!("engine={e}")));
                if *coalesce {
                    parts.push("cqe-coalesce=1".into());
                }
                parts.extend(faults_parts(faults.as_ref()));
                "emu-mana"
            }
            #[cfg(feature = "emu")]
            PortKind::EmuMlx5 {
                wire,
                mac,
                inline,
                rx,
                engine,
                faults,
            } => {
                parts.push(format!("wire={wire}"));
                parts.extend(mac.map(|m| format!("mac={m}")));
                if *inline > 0 {
                    parts.push(format!("inline={inline}"));
                }
                if let Some(m) = rx.mprq {
                    parts.push("mprq=1".into());
                    let d = crate::mlx5::Mprq::DEFAULT;
                    if m.log_stride_bytes != d.log_stride_bytes {
                        parts.push(format!("mprq-log-stride={}", m.log_stride_bytes));
                    }
                    if m.log_strides != d.log_strides {
                        parts.push(format!("mprq-log-strides={}", m.log_strides));
                    }
                }
                if !rx.cqe_compression {
                    parts.push("cqe-comp=0".into());
                }
                parts.extend(engine.map(|e| format!("engine={e}")));
                parts.extend(faults_parts(faults.as_ref()));
                "emu-mlx5"
            }
            PortKind::Null { size, mac } => {
                parts.push(format!("size={size}"));
                parts.extend(mac.map(|m| format!("mac={m}")));
                "null"
            }
        };
        parts.extend(self.pcap.as_ref().map(|p| format!("pcap={p}")));
        parts.extend(self.netdev.as_ref().map(|n| format!("netdev={n}")));
        if self.busy != BusyPolicy::Fail {
            parts.push(self.busy.to_string());
        }
        parts.extend(
            self.recover_timeout
                .map(|t| format!("recover-timeout={}", t.as_secs_f64())),
        );
        parts.extend(self.rxq.map(|q| format!("rxq={q}")));
        parts.extend(self.txq.map(|q| format!("txq={q}")));
        if parts.is_empty() {
            f.write_str(kind)
        } else {
            write!(f, "{kind}:{}", parts.join(","))
        }
    }
}

#[cfg(all(test, feature = "emu"))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Result<PortSpec, DevargsError> {
        s.parse()
    }

    /// Found by the `devargs` fuzz target: a form feed ended a value in the middle of the
    /// string but was trimmed at its end, so a spec printed as a string that parsed to
    /// another spec. Control characters are refused; spaces around keys and values are not
    /// part of them, wherever they are.
    #[test]
    fn control_characters_are_refused_and_spaces_around_values_dropped() {
        assert_eq!(
            p("mlx5:dev=i\u{c},"),
            Err(DevargsError::ControlCharacter { ch: '\u{c}' })
        );
        assert!(matches!(
            p("mana:dev=mana_0\t,port=1"),
            Err(DevargsError::ControlCharacter { .. })
        ));
        let spaced = p("mlx5: dev = mlx5_0 , inline = 18 ").unwrap();
        assert_eq!(spaced, p("mlx5:dev=mlx5_0,inline=18").unwrap());
        assert_eq!(p(&spaced.to_string()).unwrap(), spaced);
    }

    #[test]
    fn good_strings() {
        let s = p("mana:mac=00:15:5d:01:02:03").unwrap();
        assert_eq!(
            s.kind,
            PortKind::Mana {
                mac: Some(MacAddr([0, 0x15, 0x5d, 1, 2, 3])),
                dev: None,
                port: None
            }
        );
        assert_eq!(
            p("mana:dev=mana_0,port=1").unwrap().kind,
            PortKind::Mana {
                mac: None,
                dev: Some("mana_0".into()),
                port: Some(1)
            }
        );
        assert_eq!(
            p("mlx5:dev=mlx5_0").unwrap().kind,
            PortKind::Mlx5 {
                mac: None,
                dev: Some("mlx5_0".into()),
                port: None,
                inline: None,
                cqe_comp: true,
            }
        );
        assert_eq!(
            p("emu-mana:wire=shm:demo0").unwrap().kind,
            PortKind::EmuMana {
                wire: WireSpec::Shm("demo0".into()),
                mac: None,
                engine: None,
                coalesce: false,
                faults: None,
            }
        );
        assert_eq!(
            p("emu-mlx5:wire=afpacket:veth1").unwrap().kind,
            PortKind::EmuMlx5 {
                wire: WireSpec::AfPacket("veth1".into()),
                mac: None,
                inline: 0,
                rx: crate::mlx5::Options::default(),
                engine: None,
                faults: None,
            }
        );
        for (text, want) in [
            ("emu-mana:wire=none,engine=inline", EngineMode::Inline),
            ("emu-mlx5:wire=none,engine=thread", EngineMode::Thread),
        ] {
            let s = p(text).unwrap();
            let engine = match s.kind {
                PortKind::EmuMana { engine, .. } | PortKind::EmuMlx5 { engine, .. } => engine,
                _ => None,
            };
            assert_eq!(engine, Some(want), "{text}");
            assert_eq!(s.to_string(), text);
        }
        assert_eq!(
            p("null").unwrap().kind,
            PortKind::Null {
                size: 64,
                mac: None
            }
        );
        assert_eq!(
            p("null:size=1500").unwrap().kind,
            PortKind::Null {
                size: 1500,
                mac: None
            }
        );
        let coal = p("emu-mana:wire=none,cqe-coalesce=1").unwrap();
        assert!(matches!(
            coal.kind,
            PortKind::EmuMana { coalesce: true, .. }
        ));
        assert_eq!(coal.to_string(), "emu-mana:wire=none,cqe-coalesce=1");
        assert!(matches!(
            p("emu-mana:wire=none,cqe-coalesce=no").unwrap().kind,
            PortKind::EmuMana {
                coalesce: false,
                ..
            }
        ));
        let e = p("emu-mana:wire=none,cqe-coalesce=4")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'cqe-coalesce'") && e.contains("1 or 0"), "{e}");
        let c = p("emu-mana:wire=shm:x,pcap=/tmp/cap.pcap").unwrap();
        assert_eq!(c.pcap.as_deref(), Some("/tmp/cap.pcap"));
        assert_eq!(c.to_string(), "emu-mana:wire=shm:x,pcap=/tmp/cap.pcap");
        let t = p("emu-mana:wire=none,netdev=eth1,takeover=yes").unwrap();
        assert_eq!(
            (t.netdev.as_deref(), t.busy),
            (Some("eth1"), BusyPolicy::Takeover)
        );
        assert_eq!(
            t.to_string(),
            "emu-mana:wire=none,netdev=eth1,busy=takeover"
        );
        assert!(p("mana:takeover=maybe")
            .unwrap_err()
            .to_string()
            .contains("1 or 0"));
        assert!(p("null:takeover=1").is_err());
        let q = p("emu-mana:wire=loop:a,rxq=4,txq=2").unwrap();
        assert_eq!((q.rxq, q.txq), (Some(4), Some(2)));
        assert_eq!(
            p("  mana  ").unwrap().kind,
            PortKind::Mana {
                mac: None,
                dev: None,
                port: None
            }
        );
    }

    #[test]
    fn bad_strings_name_the_offending_part() {
        let cases: &[(&str, &[&str])] = &[
            ("", &["empty port spec", "mana, mlx5"]),
            ("e1000", &["unknown port kind 'e1000'", "emu-mana"]),
            ("mana:speed=10", &["no key 'speed'", "mac, dev, port"]),
            (
                "mana:mac=00:15:5d:01:02",
                &["'00:15:5d:01:02'", "'mac'", "six hex byte pairs"],
            ),
            ("mana:mac", &["'mac' needs a value"]),
            ("mana:mac=", &["'mac' needs a value"]),
            ("mana:port=0", &["'0'", "1 to 256"]),
            ("mana:dev=a,dev=b", &["'dev' given more than once"]),
            ("emu-mana", &["need 'wire='", "shm:demo0"]),
            ("emu-mana:wire=tcp:x", &["'tcp:x'", "shm:NAME"]),
            ("emu-mana:wire=shm:", &["'shm:'"]),
            (
                "emu-mlx5:wire=afpacket:averyveryverylongname",
                &["afpacket:IFACE"],
            ),
            ("null:size=10", &["'10'", "14 to 9600"]),
            ("null:size=abc", &["'abc'"]),
            ("null:rxq=65", &["'65'", "1 to 64"]),
            ("mlx5:busy=wait", &["'mlx5' ports take no key 'busy'"]),
            ("mlx5:cqe-comp=2", &["'2'", "1 or 0"]),
        ];
        for (input, needles) in cases {
            let e = p(input).expect_err(input).to_string();
            for n in *needles {
                assert!(e.contains(n), "{input:?}: error {e:?} lacks {n:?}");
            }
        }
    }

    #[test]
    fn mlx5_receive_options_parse_print_and_refuse_bad_values() {
        let rx = |s: &str| match p(s).map(|s| s.kind) {
            Ok(PortKind::EmuMlx5 { rx, .. }) => Ok(rx),
            Ok(k) => panic!("{s}: {k:?}"),
            Err(e) => Err(e.to_string()),
        };
        use crate::mlx5::{Mprq, Options};
        assert_eq!(rx("emu-mlx5:wire=none"), Ok(Options::default()));
        assert!(Options::default().cqe_compression);
        assert_eq!(
            rx("emu-mlx5:wire=none,mprq=1"),
            Ok(Options {
                mprq: Some(Mprq {
                    log_stride_bytes: 11,
                    log_strides: 6
                }),
                cqe_compression: true
            })
        );
        assert_eq!(
            rx("emu-mlx5:wire=none,mprq=1,mprq-log-stride=8,mprq-log-strides=3,cqe-comp=0"),
            Ok(Options {
                mprq: Some(Mprq {
                    log_stride_bytes: 8,
                    log_strides: 3
                }),
                cqe_compression: false
            })
        );
        assert_eq!(rx("emu-mlx5:wire=none,mprq=0").map(|o| o.mprq), Ok(None));
        let text = |s: &str| p(s).unwrap().to_string();
        assert_eq!(
            text("emu-mlx5:wire=none,mprq=1"),
            "emu-mlx5:wire=none,mprq=1"
        );
        assert_eq!(
            text("emu-mlx5:wire=none,cqe-comp=1,mprq=yes,mprq-log-strides=4"),
            "emu-mlx5:wire=none,mprq=1,mprq-log-strides=4"
        );
        assert_eq!(
            text("emu-mlx5:wire=none,cqe-comp=0,mprq=0"),
            "emu-mlx5:wire=none,cqe-comp=0"
        );
        let cases: &[(&str, &[&str])] = &[
            ("emu-mlx5:wire=none,mprq=2", &["'2'", "'mprq'", "1 or 0"]),
            ("emu-mlx5:wire=none,cqe-comp=on", &["'on'", "'cqe-comp'"]),
            (
                "emu-mlx5:wire=none,mprq=1,mprq-log-stride=5",
                &["'5'", "'mprq-log-stride'", "6 to 15"],
            ),
            (
                "emu-mlx5:wire=none,mprq=1,mprq-log-strides=17",
                &["'17'", "'mprq-log-strides'", "1 to 16"],
            ),
            (
                "emu-mlx5:wire=none,mprq-log-strides=4",
                &["'mprq-log-strides=4' and 'mprq=0'", "add mprq=1"],
            ),
            (
                "emu-mlx5:wire=none,mprq=0,mprq-log-stride=9",
                &["'mprq-log-stride=9' and 'mprq=0'"],
            ),
            (
                "emu-mana:wire=none,mprq=1",
                &["'emu-mana' ports take no key 'mprq'"],
            ),
            (
                "emu-mana:wire=none,engine=fast",
                &["bad value 'fast' for 'engine'", "inline or thread"],
            ),
            ("null:engine=inline", &["'null' ports take no key 'engine'"]),
        ];
        for (input, needles) in cases {
            let e = p(input).expect_err(input).to_string();
            for n in *needles {
                assert!(e.contains(n), "{input:?}: error {e:?} lacks {n:?}");
            }
        }
    }

    #[test]
    fn busy_policies_parse_print_and_conflict() {
        let busy = |s: &str| p(s).map(|s| s.busy);
        assert_eq!(busy("mana"), Ok(BusyPolicy::Fail));
        assert_eq!(busy("mana:busy=fail"), Ok(BusyPolicy::Fail));
        assert_eq!(busy("mana:busy=takeover"), Ok(BusyPolicy::Takeover));
        assert_eq!(busy("mana:takeover=1"), Ok(BusyPolicy::Takeover));
        assert_eq!(busy("mana:takeover=0"), Ok(BusyPolicy::Fail));
        assert_eq!(
            busy("mana:busy=takeover,takeover=1"),
            Ok(BusyPolicy::Takeover)
        );
        assert_eq!(
            busy("mana:busy=wait,takeover=0").map(|b| b.name()),
            Ok("wait")
        );
        assert_eq!(
            busy("emu-mana:wire=none,busy=wait"),
            Ok(BusyPolicy::Wait {
                timeout: DEFAULT_BUSY_TIMEOUT
            })
        );
        assert_eq!(
            busy("emu-mana:wire=none,busy=wait,busy-timeout=2.5"),
            Ok(BusyPolicy::Wait {
                timeout: Duration::from_millis(2500)
            })
        );
        assert_eq!(
            p("emu-mana:wire=none,netdev=eth1,busy=wait,busy-timeout=0.25")
                .unwrap()
                .to_string(),
            "emu-mana:wire=none,netdev=eth1,busy=wait,busy-timeout=0.25"
        );
        assert_eq!(
            p("mana:dev=mana_0,busy=wait").unwrap().to_string(),
            "mana:dev=mana_0,busy=wait,busy-timeout=30"
        );
        assert_eq!(p("mana:busy=fail").unwrap().to_string(), "mana");
    }

    #[test]
    fn bad_busy_values_say_what_is_expected() {
        let cases: &[(&str, &[&str])] = &[
            (
                "mana:busy=maybe",
                &["'maybe'", "'busy'", "fail, wait or takeover"],
            ),
            (
                "mana:busy-timeout=abc,busy=wait",
                &["'abc'", "0.001 to 86400"],
            ),
            ("mana:busy=wait,busy-timeout=0", &["'0'", "0.001 to 86400"]),
            ("mana:busy=wait,busy-timeout=-1", &["'-1'"]),
            ("mana:busy=wait,busy-timeout=86401", &["'86401'"]),
            ("mana:busy=wait,busy-timeout=inf", &["'inf'"]),
            ("mana:busy=wait,busy-timeout=NaN", &["'NaN'"]),
            (
                "mana:busy-timeout=5",
                &[
                    "'busy-timeout=5' and 'busy=fail' contradict",
                    "add busy=wait",
                ],
            ),
            (
                "mana:busy=takeover,busy-timeout=5",
                &["'busy-timeout=5' and 'busy=takeover'"],
            ),
            (
                "mana:takeover=1,busy=wait",
                &["'takeover=1' and 'busy=wait' contradict", "older spelling"],
            ),
            (
                "mana:takeover=1,busy=fail",
                &["'takeover=1' and 'busy=fail'"],
            ),
            (
                "emu-mana:wire=none,takeover=0,busy=takeover",
                &["'takeover=0' and 'busy=takeover'"],
            ),
            ("mlx5:busy=wait", &["'mlx5' ports take no key 'busy'"]),
            ("null:busy=fail", &["no key 'busy'"]),
            ("emu-mlx5:wire=none,takeover=1", &["no key 'takeover'"]),
            ("mana:busy=wait,busy=fail", &["'busy' given more than once"]),
        ];
        for (input, needles) in cases {
            let e = p(input).expect_err(input).to_string();
            for n in *needles {
                assert!(e.contains(n), "{input:?}: error {e:?} lacks {n:?}");
            }
        }
    }

    fn arb_name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9_]{0,14}"
    }

    /// A fault plan of some of `model`'s kinds in some order, with a millisecond period.
    fn arb_faults(
        model: &'static [crate::emu::faults::FaultKind],
    ) -> impl Strategy<Value = Option<crate::emu::faults::FaultPlan>> {
        proptest::option::of(
            (
                Just(model.to_vec()).prop_shuffle(),
                1..=model.len(),
                1u64..=86_400_000,
            )
                .prop_map(|(mut kinds, n, ms)| {
                    kinds.truncate(n);
                    crate::emu::faults::FaultPlan {
                        kinds,
                        period: Duration::from_millis(ms),
                    }
                }),
        )
    }

    #[test]
    fn faults_name_the_model_s_kinds() {
        let p = |s: &str| s.parse::<PortSpec>();
        let s = p("emu-mlx5:wire=none,faults=all,fault-period=0.25").unwrap();
        let PortKind::EmuMlx5 {
            faults: Some(plan), ..
        } = &s.kind
        else {
            panic!("{s:?}");
        };
        assert_eq!(plan.kinds, crate::emu::faults::MLX5_KINDS);
        assert_eq!(plan.period, Duration::from_millis(250));
        assert_eq!(
            s.to_string(),
            "emu-mlx5:wire=none,faults=link+rx-drop+tx-error+rx-bad-key+tx-bad-key+state-change,\
             fault-period=0.25"
        );
        assert_eq!(
            p("emu-mana:wire=none,faults=link+tx-error")
                .unwrap()
                .to_string(),
            "emu-mana:wire=none,faults=link+tx-error"
        );
        let e = p("emu-mana:wire=none,faults=rx-bad-key").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad value 'rx-bad-key' for 'faults': 'rx-bad-key' is no fault of this model: it has \
             link, rx-drop, rx-error, tx-error, slow-completions, or all"
        );
        let e = p("emu-mlx5:wire=none,fault-period=2").unwrap_err();
        assert!(matches!(e, DevargsError::Conflict { .. }), "{e}");
        let e = p("emu-mana:wire=none,faults=all,fault-period=0").unwrap_err();
        assert!(e.to_string().contains("'fault-period'"), "{e}");
        let e = p("mana:faults=all").unwrap_err();
        assert!(matches!(e, DevargsError::UnknownKey { .. }), "{e}");
    }

    fn arb_spec() -> impl Strategy<Value = PortSpec> {
        let mac = proptest::option::of(any::<[u8; 6]>().prop_map(MacAddr));
        let q = proptest::option::of(1u16..=64);
        let wire = prop_oneof![
            Just(WireSpec::None),
            arb_name().prop_map(WireSpec::Loopback),
            arb_name().prop_map(WireSpec::Shm),
            arb_name().prop_map(WireSpec::AfPacket),
        ];
        let engine = proptest::option::of(prop_oneof![
            Just(EngineMode::Inline),
            Just(EngineMode::Thread)
        ]);
        let kind = prop_oneof![
            (
                mac.clone(),
                proptest::option::of(arb_name()),
                proptest::option::of(1u32..=256)
            )
                .prop_map(|(mac, dev, port)| PortKind::Mana { mac, dev, port }),
            (
                mac.clone(),
                proptest::option::of(arb_name()),
                proptest::option::of(1u32..=256),
                proptest::option::of(0u16..=255),
                any::<bool>()
            )
                .prop_map(|(mac, dev, port, inline, cqe_comp)| PortKind::Mlx5 {
                    mac,
                    dev,
                    port,
                    inline,
                    cqe_comp
                }),
            (
                wire.clone(),
                mac.clone(),
                engine.clone(),
                any::<bool>(),
                arb_faults(crate::emu::faults::MANA_KINDS)
            )
                .prop_map(|(wire, mac, engine, coalesce, faults)| PortKind::EmuMana {
                    wire,
                    mac,
                    engine,
                    coalesce,
                    faults
                }),
            (
                wire,
                mac.clone(),
                prop_oneof![Just(0u16), Just(18), 0u16..=255],
                proptest::option::of((6u8..=15, 1u8..=16)),
                any::<bool>(),
                engine,
                arb_faults(crate::emu::faults::MLX5_KINDS),
            )
                .prop_map(
                    |(wire, mac, inline, mprq, cqe_compression, engine, faults)| {
                        PortKind::EmuMlx5 {
                            wire,
                            mac,
                            inline,
                            engine,
                            faults,
                            rx: crate::mlx5::Options {
                                mprq: mprq.map(|(log_stride_bytes, log_strides)| {
                                    crate::mlx5::Mprq {
                                        log_stride_bytes,
                                        log_strides,
                                    }
                                }),
                                cqe_compression,
                            },
                        }
                    }
                ),
            (14u16..=9600, mac).prop_map(|(size, mac)| PortKind::Null { size, mac }),
        ];
        let busy = prop_oneof![
            Just(BusyPolicy::Fail),
            Just(BusyPolicy::Takeover),
            (1u64..=MAX_BUSY_TIMEOUT.as_millis() as u64).prop_map(|ms| BusyPolicy::Wait {
                timeout: Duration::from_millis(ms)
            }),
        ];
        let recover = proptest::option::of(1u64..=86_400_000);
        (kind, q.clone(), q, any::<bool>(), busy, recover).prop_map(
            |(kind, rxq, txq, t, busy, r)| {
                // busy and netdev only where the kind takes them.
                let emu = matches!(kind, PortKind::EmuMana { .. } | PortKind::EmuMlx5 { .. });
                let mana = matches!(kind, PortKind::EmuMana { .. } | PortKind::Mana { .. });
                let mlx5 = matches!(kind, PortKind::Mlx5 { .. });
                let kind_hw = matches!(kind, PortKind::Mana { .. } | PortKind::Mlx5 { .. });
                let netdev = (t && (mana || emu || mlx5)).then(|| "veth9".to_string());
                PortSpec {
                    kind,
                    rxq,
                    txq,
                    pcap: None,
                    netdev,
                    busy: if mana { busy } else { BusyPolicy::Fail },
                    recover_timeout: r.filter(|_| kind_hw).map(Duration::from_millis),
                }
            },
        )
    }

    proptest! {
        #[test]
        fn display_parses_back(spec in arb_spec()) {
            let text = spec.to_string();
            prop_assert_eq!(text.parse::<PortSpec>(), Ok(spec));
        }

        #[test]
        fn any_string_parses_or_errs_without_panic(s in "\\PC{0,40}") {
            let _ = s.parse::<PortSpec>();
        }

        #[test]
        fn kind_with_garbage_keys_is_refused(key in "[a-z]{1,8}", value in "[a-z0-9]{1,8}") {
            prop_assume!(
                !["mac", "dev", "port", "busy", "takeover", "rxq", "txq"].contains(&key.as_str())
                    && !key.starts_with("recover")
            );
            let r = format!("mana:{key}={value}").parse::<PortSpec>();
            let is_unknown_key = matches!(r, Err(DevargsError::UnknownKey { .. }));
            prop_assert!(is_unknown_key);
        }
    }
}
