//! Loss accounting as the tools print it: the counters that count lost frames, the device
//! lines, the JSON statistics and a failed capture's cause, all from `Port::stats()`.
#![deny(unsafe_code)]

use pmd::port::Stats;
use serde_json::{json, Value};

/// The counters of a port that count frames lost or refused somewhere on its way, those that
/// are not zero, by name: the extended counters its driver, device and wire declare as losses
/// ([`pmd::ethdev::Loss`]: `dev_tx_wire_drops`, a full cable; `dev_rx_no_wqe`, no buffer;
/// `wire_rx_stale`, frames sent on a cable before this end was attached; error
/// completions, ...), then the basic counters'. With them a tool says where frames went that
/// did not arrive.
pub fn loss_counters(stats: &Stats) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = stats
        .losses
        .iter()
        .map(|x| (x.name.clone(), x.value))
        .collect();
    for (name, v) in [
        ("imissed", stats.imissed),
        ("ierrors", stats.ierrors),
        ("oerrors", stats.oerrors),
        ("rx_nombuf", stats.rx_nombuf),
    ] {
        if v > 0 {
            out.push((name.to_string(), v));
        }
    }
    out
}

/// A port's statistics for a `--json` report: the basic counters, the frames its device
/// dropped (`Stats::device_drops`), every queue's counters and every extended counter by name
/// (zeros included).
pub fn stats_json(stats: &Stats) -> Value {
    let x: serde_json::Map<String, Value> = stats
        .xstats
        .iter()
        .map(|(n, v)| (n.clone(), json!(v)))
        .collect();
    let queues = |qs: &[pmd::port::QueueStats]| -> Vec<Value> {
        qs.iter()
            .enumerate()
            .map(|(i, q)| {
                json!({"queue": i, "packets": q.packets, "bytes": q.bytes, "errors": q.errors,
                    "missed": q.missed, "nombuf": q.nombuf})
            })
            .collect()
    };
    let d = stats.device_drops;
    json!({
        "ipackets": stats.ipackets, "opackets": stats.opackets, "ibytes": stats.ibytes,
        "obytes": stats.obytes, "imissed": stats.imissed, "ierrors": stats.ierrors,
        "oerrors": stats.oerrors, "rx_nombuf": stats.rx_nombuf,
        "device_drops": {"tx": d.tx, "rx": d.rx},
        "rx_queues": queues(&stats.rx_queues), "tx_queues": queues(&stats.tx_queues),
        "xstats": x,
    })
}

/// One line per port with loss counters (nothing for a port without losses), for a text
/// summary: `  port 1 losses: dev_tx_wire_drops 4630`.
pub fn loss_lines(stats: &[Stats]) -> Vec<String> {
    stats
        .iter()
        .enumerate()
        .filter_map(|(p, s)| {
            let l = loss_counters(s);
            (!l.is_empty()).then(|| {
                let list: Vec<String> = l.iter().map(|(n, v)| format!("{n} {v}")).collect();
                format!("  port {p} losses: {}", list.join(", "))
            })
        })
        .collect()
}

/// The device counters of every port for a text summary, readable: per port its basic
/// counters and the frames its device dropped, the queues of a port with more than one
/// (those with any count), and its extended counters that are not zero (`--json` has all):
///
/// ```text
///   port 0 device: ipackets 0 opackets 1000 imissed 0 rx_nombuf 0, dropped tx 500 rx 0
///   port 0 rxq 1: packets 10 missed 3
///   port 0 xstats: dev_tx_frames 500, dev_tx_errors 500, dev_tx_mtu_errors 500
/// ```
pub fn device_lines(stats: &[Stats]) -> Vec<String> {
    let mut out = Vec::new();
    for (p, s) in stats.iter().enumerate() {
        let d = s.device_drops;
        out.push(format!(
            "  port {p} device: ipackets {} opackets {} imissed {} ierrors {} oerrors {} rx_nombuf {}, dropped tx {} rx {}",
            s.ipackets, s.opackets, s.imissed, s.ierrors, s.oerrors, s.rx_nombuf, d.tx, d.rx
        ));
        for (dir, qs) in [("rxq", &s.rx_queues), ("txq", &s.tx_queues)] {
            if qs.len() < 2 {
                continue;
            }
            for (i, q) in qs.iter().enumerate() {
                let mut parts = Vec::new();
                for (n, v) in [
                    ("packets", q.packets),
                    ("errors", q.errors),
                    ("missed", q.missed),
                    ("nombuf", q.nombuf),
                ] {
                    if v > 0 {
                        parts.push(format!("{n} {v}"));
                    }
                }
                if !parts.is_empty() {
                    out.push(format!("  port {p} {dir} {i}: {}", parts.join(" ")));
                }
            }
        }
        let x: Vec<String> = s
            .xstats
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        if !x.is_empty() {
            out.push(format!("  port {p} xstats: {}", x.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The losses a tool lists are the counters declared as losses that are not zero, then
    /// the basic counters'; the device drops add the declared device drops to the basic
    /// counters once.
    #[test]
    fn loss_counters_and_device_drops_follow_the_declared_kinds() {
        use pmd::ethdev::{DeviceDrops, Loss, Xstat};
        let mut s = Stats::default();
        (s.imissed, s.ierrors, s.oerrors) = (7, 1, 500);
        let s = s.with_xstats(vec![
            Xstat::new("tx_cqe_errors", 500, Loss::Counted),
            Xstat::new("dev_tx_frames", 10, Loss::None),
            Xstat::new("dev_tx_wire_drops", 20, Loss::Tx),
            Xstat::new("dev_rx_fault_drops", 2, Loss::Rx),
            Xstat::new("dev_rx_no_wqe", 7, Loss::Counted),
            Xstat::new("wire_rx_drops", 0, Loss::Counted),
            Xstat::new("wire_tx_stranded", 30, Loss::Tx),
        ]);
        assert_eq!(s.device_drops, DeviceDrops { tx: 550, rx: 10 });
        let l = loss_counters(&s);
        let names: Vec<&str> = l.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "tx_cqe_errors",
                "dev_tx_wire_drops",
                "dev_rx_fault_drops",
                "dev_rx_no_wqe",
                "wire_tx_stranded",
                "imissed",
                "ierrors",
                "oerrors"
            ]
        );
        assert_eq!(s.xstat("dev_tx_frames"), Some(10));
    }
}
