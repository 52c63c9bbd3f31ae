//! Jumbo frames through the tools, as separate processes on the device models:
//!
//!   pktgen port 0 --shm A--> l2fwd port 0 -> l2fwd port 1 --shm B--> pktgen port 1
//!
//! with 9014-byte frames (a 9000-byte MTU). A cable holds about 900 such frames, and an
//! inline device takes a frame off its cable only when it has a buffer for it, so a run of
//! fewer frames than that loses nothing however the processes are scheduled; nothing here is
//! timed.

use crate::support::{bin, stop, succeeded, Bg};
use std::process::Stdio;
use std::time::Duration;

/// Frames per run: fewer than a cable holds at 9014 bytes each.
const N: u64 = 800;

/// Two shared-memory cables: l2fwd's ports of `kind` on them with `l2fwd_args`, then pktgen
/// on their other ends with `pktgen_args`; returns both tools' JSON reports.
fn run(
    tag: &str,
    kind: &str,
    l2fwd_args: &[&str],
    pktgen_args: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("{tag}{}", std::process::id());
    let (a, b) = (
        format!("{kind}:wire=shm:{id}a"),
        format!("{kind}:wire=shm:{id}b"),
    );
    let l2 = Bg(Some(
        bin("l2fwd")
            .args(["--port", &a, "--port", &b, "--lcores", "1", "--json"])
            .args(["--ring-size", "1024"])
            .args(l2fwd_args)
            .env("PMD_SHM_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let out = bin("pktgen")
        .args(["--port", &a, "--port", &b, "--lcores", "0", "--json"])
        .args(["--link-timeout", "60", "--drain-timeout", "30"])
        .args(["--count", &N.to_string(), "--rate", "100000"])
        .args(pktgen_args)
        .env("PMD_SHM_DIR", dir.path())
        .output()
        .unwrap();
    let p = succeeded(&out);
    (p, succeeded(&stop(l2)))
}

/// `pktgen --size 9014` (its MTU raised to 9000 to fit) through `l2fwd --mtu 9000` and back:
/// every frame arrives once, and the counts of both tools agree, on both models.
#[test]
fn jumbo_frames_cross_l2fwd_over_shm_cables_with_nothing_lost() {
    for kind in ["emu-mana", "emu-mlx5"] {
        let (p, l) = run(
            "jumbo",
            kind,
            &["--mtu", "9000"],
            &["--size", "9014", "--flows", "4"],
        );
        assert_eq!(p["tx_packets"], N, "{kind}: {p}");
        assert_eq!(p["rx_packets"], N, "{kind}: {p}");
        assert_eq!(p["lost"], 0, "{kind}: {p}");
        assert_eq!(p["duplicates"], 0, "{kind}: {p}");
        assert_eq!(p["pool_in_use"], 0, "{kind}: {p}");
        for port in p["ports"].as_array().expect("ports in the report") {
            assert_eq!((&port["ierrors"], &port["imissed"]), (&0.into(), &0.into()));
            let mtu = if kind == "emu-mana" {
                "dev_tx_mtu_errors"
            } else {
                "dev_tx_mtu_drops"
            };
            assert_eq!(port["xstats"][mtu], 0, "{kind}: {p}");
        }
        assert_eq!(p["ports"][0]["xstats"]["dev_tx_bytes"], N * 9014, "{kind}");
        assert_eq!((&l["rx_packets"], &l["tx_packets"]), (&N.into(), &N.into()));
        assert_eq!(l["dropped"], 0, "{kind}: {l}");
        assert_eq!(l["ports"][1]["stats"]["xstats"]["dev_tx_bytes"], N * 9014);
        assert_eq!(l["ports"][0]["stats"]["ierrors"], 0, "{kind}: {l}");
        assert_eq!(l["pool_in_use"], 0, "{kind}: {l}");
    }
}

/// The same frames into an l2fwd left at the default MTU (2048-byte buffers): its device
/// drops every one, and each is counted as a receive error where it happened, not lost
/// silently; pktgen reports them all lost.
#[test]
fn jumbo_frames_into_a_port_at_mtu_1500_are_counted_as_receive_errors() {
    let (p, l) = run("short", "emu-mana", &[], &["--size", "9014"]);
    assert_eq!((&p["tx_packets"], &p["rx_packets"]), (&N.into(), &0.into()));
    assert_eq!(p["lost"], N, "{p}");
    let rx = &l["ports"][0]["stats"];
    assert_eq!(rx["ierrors"], N, "{l}");
    assert_eq!(rx["xstats"]["rx_cqe_truncated"], N, "{l}");
    assert_eq!(rx["xstats"]["dev_rx_truncated"], N, "{l}");
    assert_eq!((&l["rx_packets"], &l["tx_packets"]), (&0.into(), &0.into()));
    assert_eq!(l["pool_in_use"], 0, "{l}");
}

/// Writes `frames` as a classic pcap file at `path`.
fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let mut w = pcap_file::pcap::PcapWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for f in frames {
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            Duration::ZERO,
            f.len() as u32,
            f,
        ))
        .unwrap();
    }
}

/// A capture of frames from 60 to 9018 bytes (the longest tagged) replays byte-exact: pktgen
/// raises its MTU to fit the largest, and the capture on the far side of the cable equals the
/// file. With `--mtu 1500` the file is refused, naming the frame and the option.
#[test]
fn pcap_frames_over_2048_bytes_replay_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("jumbo.pcap");
    let capture = dir.path().join("far.pcap");
    let frames: Vec<Vec<u8>> = [60usize, 2048, 2049, 4000, 9014, 9018]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let mut f = vec![0u8; len];
            f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x09]);
            f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x08]);
            let at = if len == 9018 {
                // 802.1Q, VID 7: 9000 bytes after the tag.
                f[12..16].copy_from_slice(&[0x81, 0x00, 0x00, 0x07]);
                16
            } else {
                12
            };
            f[at..at + 2].copy_from_slice(&[0x88, 0xb5]);
            for (k, b) in f[at + 2..].iter_mut().enumerate() {
                *b = (k * 13 + i) as u8;
            }
            f
        })
        .collect();
    write_pcap(&input, &frames);
    let cable = format!("emu-mana:wire=loop:jumbopcap{}", std::process::id());
    let pktgen = |extra: &[&str]| {
        bin("pktgen")
            .args(["--port", &cable])
            .args(["--port", &format!("{cable},pcap={}", capture.display())])
            .args(["--lcores", "0", "--json", "--pcap", input.to_str().unwrap()])
            .args(["--count", "12", "--rate", "5000"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = pktgen(&[]);
    let p = succeeded(&out);
    assert_eq!(
        (&p["tx_packets"], &p["rx_packets"]),
        (&12.into(), &12.into())
    );
    let data = std::fs::read(&capture).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
    let mut got = Vec::new();
    while let Some(pkt) = r.next_packet() {
        got.push(pkt.unwrap().data.into_owned());
    }
    let want: Vec<Vec<u8>> = frames.iter().chain(frames.iter()).cloned().collect();
    assert!(got == want, "the far side's capture is the file twice over");
    // The MTU given does not carry the file's frames: refused before anything is sent.
    let out = pktgen(&["--mtu", "1500"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("packet 2 has 2048 bytes, more than the 1518") && err.contains("--mtu"),
        "{err}"
    );
}
