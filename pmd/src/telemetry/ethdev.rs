//! The answers about ports: DPDK's `/ethdev/...` commands with DPDK's shapes and names
//! (lib/ethdev/rte_ethdev_telemetry.c), and our `/pmd/ports`. They are built on the thread
//! that owns the ports, from the same single-writer counters the tools print.
#![deny(unsafe_code)]

use super::protocol::Data;
use super::AnswerError;
use crate::port::{Port, PortState, QueueStats, RxOffloads, Stats, TxOffloads};

/// Entries in each per-queue array of `/ethdev/stats` (DPDK's `RTE_ETHDEV_QUEUE_STAT_CNTRS`).
pub const QUEUE_STAT_CNTRS: usize = 16;

/// The commands answered from the ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortCommand {
    /// `/ethdev/list`
    List,
    /// `/ethdev/stats,PORT`
    Stats,
    /// `/ethdev/xstats,PORT[,hide_zero=true|false]`
    Xstats,
    /// `/ethdev/link_status,PORT`
    LinkStatus,
    /// `/ethdev/info,PORT`
    Info,
    /// `/pmd/ports`
    Ports,
}

impl PortCommand {
    /// Every one, with its name and help text.
    pub const ALL: [(PortCommand, &'static str, &'static str); 6] = [
        (
            PortCommand::List,
            "/ethdev/list",
            "The ids of the ports. No parameter.",
        ),
        (
            PortCommand::Stats,
            "/ethdev/stats",
            "A port's basic counters, summed and per queue (q_*: the first 16 queues). \
             Parameter: the port id.",
        ),
        (
            PortCommand::Xstats,
            "/ethdev/xstats",
            "A port's extended counters by name: the generic ones, then the driver's. \
             Parameters: the port id, then optionally hide_zero=true to leave out zeros.",
        ),
        (
            PortCommand::LinkStatus,
            "/ethdev/link_status",
            "A port's link: status UP or DOWN, and when up its speed in Mbit/s and duplex. \
             Parameter: the port id.",
        ),
        (
            PortCommand::Info,
            "/ethdev/info",
            "A port's set-up: name, queues, MTU, MAC address, offloads, whether it is started. \
             Parameter: the port id.",
        ),
        (
            PortCommand::Ports,
            "/pmd/ports",
            "Every port's devargs, lifecycle state, link, recoveries and failure. No parameter.",
        ),
    ];

    /// The answer to this command with `param`, from `ports`.
    ///
    /// # Errors
    /// A missing or bad port id ([`port_param`]).
    pub fn answer(self, ports: &[Port], param: Option<&str>) -> Result<Data, AnswerError> {
        match self {
            PortCommand::List => Ok(Data::Array(
                ports.iter().map(|p| Data::Int(p.id().into())).collect(),
            )),
            PortCommand::Stats => {
                let (port, _) = port_param(ports, param)?;
                Ok(stats(&port.stats()))
            }
            PortCommand::Xstats => {
                let (port, rest) = port_param(ports, param)?;
                Ok(xstats(&port.stats(), hide_zero(rest)))
            }
            PortCommand::LinkStatus => {
                let (port, _) = port_param(ports, param)?;
                let link = port.link();
                let mut d = Data::dict();
                if !link.up {
                    return Ok(d.with("status", "DOWN"));
                }
                d.add("status", "UP").add("speed", link.speed_mbps).add(
                    "duplex",
                    if link.full_duplex {
                        "full-duplex"
                    } else {
                        "half-duplex"
                    },
                );
                Ok(d)
            }
            PortCommand::Info => {
                let (port, _) = port_param(ports, param)?;
                Ok(info(port))
            }
            PortCommand::Ports => Ok(Data::Array(ports.iter().map(port_summary).collect())),
        }
    }
}

/// The port a parameter names, and what follows its number (`,hide_zero=true`), as DPDK's
/// `eth_dev_parse_port_params` reads it (rte_ethdev_telemetry.c): the parameter must start
/// with a digit; the number is read as `strtoul(.., 0)` does (`0x` hex, a leading `0` octal,
/// else decimal) as far as it goes; it must be below 65535 and a port's id.
///
/// # Errors
/// [`AnswerError::BadParameter`] or [`AnswerError::NoSuchPort`].
pub fn port_param<'p, 'a>(
    ports: &'p [Port],
    param: Option<&'a str>,
) -> Result<(&'p Port, &'a str), AnswerError> {
    let (id, rest) = parse_port_id(param)?;
    let port = ports
        .iter()
        .find(|p| u64::from(p.id()) == id)
        .ok_or(AnswerError::NoSuchPort(id))?;
    if !rest.is_empty() && !rest.starts_with(',') {
        tracing::debug!(target: "pmd::telemetry", "extra characters after the port id ignored: {rest:?}");
    }
    Ok((port, rest))
}

/// The port id at the start of `param` and the rest (see [`port_param`]).
///
/// # Errors
/// [`AnswerError::BadParameter`] when `param` does not start with a digit or names an id of
/// 65535 or more.
pub fn parse_port_id(param: Option<&str>) -> Result<(u64, &str), AnswerError> {
    let bad = |why: &'static str| AnswerError::BadParameter {
        param: param.unwrap_or("").to_string(),
        why,
    };
    let p = param.unwrap_or("");
    if !p.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad("a port id (a number) is needed"));
    }
    let (value, rest) = strtoul0(p);
    if value >= u64::from(u16::MAX) {
        return Err(bad("a port id is below 65535"));
    }
    Ok((value, rest))
}

/// `strtoul(s, &end, 0)` for an `s` that starts with a digit: the value (saturated at
/// `u64::MAX` on overflow, as `strtoul` returns `ULONG_MAX`) and the text after it.
fn strtoul0(s: &str) -> (u64, &str) {
    let b = s.as_bytes();
    let (radix, start) =
        if b.len() > 2 && b[0] == b'0' && (b[1] | 0x20) == b'x' && b[2].is_ascii_hexdigit() {
            (16, 2)
        } else if b.first() == Some(&b'0') {
            (8, 0)
        } else {
            (10, 0)
        };
    let digits = s[start..]
        .bytes()
        .take_while(|c| (*c as char).is_digit(radix))
        .count();
    let end = start + digits;
    // At least one digit (`s` starts with one): the only error left is an overflow.
    let value = u64::from_str_radix(&s[start..end], radix).unwrap_or(u64::MAX);
    (value, &s[end..])
}

/// `hide_zero=true` among the `,`-separated `key=value` pairs of `rest`; anything else is
/// ignored (and logged), as DPDK's `eth_dev_handle_port_xstats` does.
fn hide_zero(rest: &str) -> bool {
    let mut hide = false;
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        match kv.split_once('=') {
            Some(("hide_zero", "true")) => hide = true,
            Some(("hide_zero", "false")) => hide = false,
            _ => {
                tracing::debug!(target: "pmd::telemetry", "unknown xstats parameter ignored: {kv:?}")
            }
        }
    }
    hide
}

/// The basic counters of `/ethdev/stats`, in DPDK's order (`rte_ethdev_telemetry.c`,
/// `eth_dev_handle_port_stats`).
pub const STATS: [&str; 8] = [
    "ipackets",
    "opackets",
    "ibytes",
    "obytes",
    "imissed",
    "ierrors",
    "oerrors",
    "rx_nombuf",
];

/// The per-queue arrays of `/ethdev/stats` DPDK had until 23.11, each of
/// [`QUEUE_STAT_CNTRS`] entries.
pub const QUEUE_STATS: [&str; 5] = [
    "q_ipackets",
    "q_opackets",
    "q_ibytes",
    "q_obytes",
    "q_errors",
];

/// `/ethdev/stats`: the basic counters ([`STATS`]), then the per-queue arrays
/// ([`QUEUE_STATS`], always 16 entries; `q_errors` is a receive queue's error count).
pub fn stats(s: &Stats) -> Data {
    let mut d = Data::dict();
    let basic = [
        s.ipackets,
        s.opackets,
        s.ibytes,
        s.obytes,
        s.imissed,
        s.ierrors,
        s.oerrors,
        s.rx_nombuf,
    ];
    for (name, v) in STATS.iter().zip(basic) {
        d.add(name, v);
    }
    type Field = fn(&QueueStats) -> u64;
    let queues: [(&[QueueStats], Field); 5] = [
        (&s.rx_queues, |q| q.packets),
        (&s.tx_queues, |q| q.packets),
        (&s.rx_queues, |q| q.bytes),
        (&s.tx_queues, |q| q.bytes),
        (&s.rx_queues, |q| q.errors),
    ];
    for (name, (qs, f)) in QUEUE_STATS.iter().zip(queues) {
        let per_queue = (0..QUEUE_STAT_CNTRS).map(|i| Data::Uint(qs.get(i).map_or(0, f)));
        d.add(name, Data::Array(per_queue.collect()));
    }
    d
}

/// `/ethdev/xstats`: the generic extended counters every DPDK port has (`rx_good_packets`,
/// .., `rx_q0_packets`, ..), then the driver's own, by name.
pub fn xstats(s: &Stats, hide_zero: bool) -> Data {
    let mut all: Vec<(String, u64)> = vec![
        ("rx_good_packets".into(), s.ipackets),
        ("tx_good_packets".into(), s.opackets),
        ("rx_good_bytes".into(), s.ibytes),
        ("tx_good_bytes".into(), s.obytes),
        ("rx_missed_errors".into(), s.imissed),
        ("rx_errors".into(), s.ierrors),
        ("tx_errors".into(), s.oerrors),
        ("rx_mbuf_allocation_errors".into(), s.rx_nombuf),
    ];
    for (i, q) in s.rx_queues.iter().enumerate() {
        all.push((format!("rx_q{i}_packets"), q.packets));
        all.push((format!("rx_q{i}_bytes"), q.bytes));
        all.push((format!("rx_q{i}_errors"), q.errors));
    }
    for (i, q) in s.tx_queues.iter().enumerate() {
        all.push((format!("tx_q{i}_packets"), q.packets));
        all.push((format!("tx_q{i}_bytes"), q.bytes));
    }
    all.extend(s.xstats.iter().cloned());
    Data::Dict(
        all.into_iter()
            .filter(|(_, v)| !hide_zero || *v != 0)
            .map(|(n, v)| (n, Data::Uint(v)))
            .collect(),
    )
}

/// DPDK's `rte_eth_dev_state`: `RTE_ETH_DEV_ATTACHED` (1) while the port has its device,
/// `RTE_ETH_DEV_REMOVED` (3) while it waits for it or gave up.
fn dev_state(state: PortState) -> i64 {
    match state {
        PortState::Recovering | PortState::Failed => 3,
        _ => 1,
    }
}

/// The names `rte_eth_dev_rx_offload_name` gives our receive offloads.
fn rx_offload_names(o: RxOffloads) -> Vec<&'static str> {
    let mut v = Vec::new();
    for (flag, names) in [
        (RxOffloads::VLAN_STRIP, &["VLAN_STRIP"][..]),
        (RxOffloads::IPV4_CKSUM, &["IPV4_CKSUM"]),
        (RxOffloads::L4_CKSUM, &["UDP_CKSUM", "TCP_CKSUM"]),
        (RxOffloads::SCATTER, &["SCATTER"]),
        (RxOffloads::TIMESTAMP, &["TIMESTAMP"]),
        (RxOffloads::RSS_HASH, &["RSS_HASH"]),
    ] {
        if o.contains(flag) {
            v.extend_from_slice(names);
        }
    }
    v
}

/// The names `rte_eth_dev_tx_offload_name` gives our transmit offloads.
fn tx_offload_names(o: TxOffloads) -> Vec<&'static str> {
    [
        (TxOffloads::VLAN_INSERT, "VLAN_INSERT"),
        (TxOffloads::IPV4_CKSUM, "IPV4_CKSUM"),
        (TxOffloads::UDP_CKSUM, "UDP_CKSUM"),
        (TxOffloads::TCP_CKSUM, "TCP_CKSUM"),
        (TxOffloads::TCP_TSO, "TCP_TSO"),
        (TxOffloads::MULTI_SEGS, "MULTI_SEGS"),
    ]
    .into_iter()
    .filter(|(f, _)| o.contains(*f))
    .map(|(_, n)| n)
    .collect()
}

/// `/ethdev/info`: DPDK's fields where the port has a counterpart, in DPDK's order.
pub fn info(port: &Port) -> Data {
    let cfg = port.config();
    let started = port.state() == PortState::Started;
    let (nrx, ntx) = cfg.map_or((0, 0), |c| (c.rx_queues, c.tx_queues));
    let m = port.mac().0;
    // rte_ether_format_addr: "%02X:%02X:..".
    let mac = format!(
        "{:02X}:{:02X}:{:02X}:{:02X}:{:02X}:{:02X}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    );
    // RTE_ETH_QUEUE_STATE_STARTED (1) / _STOPPED (0).
    let queue_states = |n: u16| Data::Array(vec![Data::Int(started.into()); n.into()]);
    let mut d = Data::dict();
    d.add("name", port.name())
        .add("state", dev_state(port.state()))
        .add("nb_rx_queues", i64::from(nrx))
        .add("nb_tx_queues", i64::from(ntx))
        .add("port_id", i64::from(port.id()))
        .add("mtu", i64::from(cfg.map_or(1500, |c| c.mtu)))
        .add("mac_addr", mac)
        .add("promiscuous", i64::from(cfg.is_some_and(|c| c.promiscuous)))
        .add("dev_started", i64::from(started))
        .add("dev_configured", i64::from(cfg.is_some()))
        .add("rxq_state", queue_states(nrx))
        .add("txq_state", queue_states(ntx))
        .add(
            "rx_offloads",
            rx_offload_names(cfg.map_or(RxOffloads::empty(), |c| c.rx_offloads)),
        )
        .add(
            "tx_offloads",
            tx_offload_names(cfg.map_or(TxOffloads::empty(), |c| c.tx_offloads)),
        );
    d
}

/// One port in `/pmd/ports`.
fn port_summary(p: &Port) -> Data {
    let link = p.link();
    let mut d = Data::dict();
    d.add("port", p.id())
        .add("spec", p.name())
        .add("state", format!("{:?}", p.state()).to_lowercase())
        .add("mac", p.mac().to_string())
        .add("link_up", link.up)
        .add("speed_mbps", link.speed_mbps)
        .add("recovers", p.recovers())
        .add("recoveries", p.recoveries())
        .add("failure", p.failure());
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::PortConfig;

    #[test]
    fn port_ids_read_as_strtoul_with_base_0_does() {
        assert_eq!(parse_port_id(Some("0")).unwrap(), (0, ""));
        assert_eq!(parse_port_id(Some("12")).unwrap(), (12, ""));
        assert_eq!(parse_port_id(Some("0x1f")).unwrap(), (31, ""));
        assert_eq!(parse_port_id(Some("010")).unwrap(), (8, ""));
        // strtoul stops at the first character that is not a digit of the base.
        assert_eq!(parse_port_id(Some("08")).unwrap(), (0, "8"));
        assert_eq!(parse_port_id(Some("0x")).unwrap(), (0, "x"));
        assert_eq!(parse_port_id(Some("1abc")).unwrap(), (1, "abc"));
        assert_eq!(
            parse_port_id(Some("1,hide_zero=true")).unwrap(),
            (1, ",hide_zero=true")
        );
        for bad in [
            None,
            Some(""),
            Some("x"),
            Some("-1"),
            Some(" 1"),
            Some("+1"),
        ] {
            assert!(
                matches!(parse_port_id(bad), Err(AnswerError::BadParameter { .. })),
                "{bad:?}"
            );
        }
        assert!(parse_port_id(Some("65534")).is_ok());
        assert!(parse_port_id(Some("65535")).is_err());
        assert!(parse_port_id(Some("99999999999999999999999")).is_err());
    }

    #[test]
    fn hide_zero_takes_true_or_false_and_ignores_the_rest() {
        assert!(hide_zero(",hide_zero=true"));
        assert!(!hide_zero(",hide_zero=false"));
        assert!(!hide_zero(",hide_zero=yes"));
        assert!(hide_zero(",x=1,hide_zero=true"));
        assert!(!hide_zero(""));
    }

    fn null_ports() -> (std::sync::Arc<mempool::MbufPool>, Vec<Port>) {
        let pool = mempool::MbufPool::new(mempool::MbufPoolConfig::new("tele-eth", 2047)).unwrap();
        let mut ports = Vec::new();
        for id in 0..2 {
            let mut p = Port::open(id, &"null:size=64".parse().unwrap()).unwrap();
            let cfg = PortConfig {
                rx_queues: 2,
                ..Default::default()
            };
            p.configure(&cfg, &pool).unwrap();
            ports.push(p);
        }
        ports[0].start().unwrap();
        (pool, ports)
    }

    #[test]
    fn ethdev_answers_have_dpdks_shapes() {
        let (_pool, ports) = null_ports();
        let list = PortCommand::List.answer(&ports, None).unwrap();
        assert_eq!(list.to_json(), "[0,1]");
        let s = PortCommand::Stats.answer(&ports, Some("0")).unwrap();
        let names: Vec<&str> = match &s {
            Data::Dict(e) => e.iter().map(|(n, _)| n.as_str()).collect(),
            _ => panic!("{s:?}"),
        };
        assert_eq!(
            names,
            [
                "ipackets",
                "opackets",
                "ibytes",
                "obytes",
                "imissed",
                "ierrors",
                "oerrors",
                "rx_nombuf",
                "q_ipackets",
                "q_opackets",
                "q_ibytes",
                "q_obytes",
                "q_errors"
            ]
        );
        match s.get("q_ipackets") {
            Some(Data::Array(a)) => assert_eq!(a.len(), QUEUE_STAT_CNTRS),
            other => panic!("{other:?}"),
        }
        let x = PortCommand::Xstats.answer(&ports, Some("1")).unwrap();
        assert!(x.get("rx_good_packets").is_some() && x.get("rx_q1_errors").is_some());
        let x = PortCommand::Xstats
            .answer(&ports, Some("1,hide_zero=true"))
            .unwrap();
        assert!(x.get("rx_good_packets").is_none(), "{x:?}");
        let link = PortCommand::LinkStatus.answer(&ports, Some("0")).unwrap();
        assert_eq!(link.get("status"), Some(&Data::from("UP")));
        let info = PortCommand::Info.answer(&ports, Some("0")).unwrap();
        assert_eq!(info.get("nb_rx_queues"), Some(&Data::Int(2)));
        assert_eq!(info.get("dev_started"), Some(&Data::Int(1)));
        assert_eq!(info.get("rxq_state").unwrap().to_json(), "[1,1]");
        let mac = match info.get("mac_addr") {
            Some(Data::Str(m)) => m.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(mac, ports[0].mac().to_string().to_uppercase());
        let stopped = PortCommand::Info.answer(&ports, Some("1")).unwrap();
        assert_eq!(stopped.get("dev_started"), Some(&Data::Int(0)));
        assert_eq!(stopped.get("txq_state").unwrap().to_json(), "[0]");
        let all = PortCommand::Ports.answer(&ports, None).unwrap();
        assert!(
            all.to_json().contains(r#""state":"started""#),
            "{}",
            all.to_json()
        );
    }

    #[test]
    fn bad_port_parameters_are_errors() {
        let (_pool, ports) = null_ports();
        for p in [None, Some("x"), Some("-1"), Some("65535")] {
            assert!(matches!(
                PortCommand::Stats.answer(&ports, p),
                Err(AnswerError::BadParameter { .. })
            ));
        }
        assert_eq!(
            PortCommand::Stats.answer(&ports, Some("99")),
            Err(AnswerError::NoSuchPort(99))
        );
        assert!(PortCommand::LinkStatus.answer(&ports, Some("2")).is_err());
    }
}
