//! The tools tell the truth about the devices under them: every frame pktgen sends is
//! received or counted where a device dropped it, and both tools show the same counts (text
//! summary and `--json`); pktgen's day-one options (size lists, IMIX, source MAC, tx-only,
//! L1 rate, a capture's own timing) do what they say; a capture that fails after it opened
//! (a full disk) fails the tool. Nothing here is timed: counts are exact.

use crate::support::{bin, json, spawn_with_lines};
use std::process::{Child, Command, Output};
use std::sync::mpsc;
use std::time::Duration;

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "failed: {err}");
    err
}

/// An l2fwd in the background on two shared-memory cables, its stderr lines on a channel;
/// killed and reaped if a test ends without stopping it.
struct L2fwd {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
}

impl L2fwd {
    fn start(dir: &std::path::Path, a: &str, b: &str, extra: &[&str]) -> Self {
        let mut c = bin("l2fwd");
        c.args(["--port", a, "--port", b, "--lcores", "1"])
            .args(["--ring-size", "1024"])
            .args(extra)
            .env("PMD_SHM_DIR", dir);
        let (child, lines) = spawn_with_lines(c);
        Self {
            child: Some(child),
            lines,
        }
    }

    /// Waits for a live statistics line that `pred` accepts (at most `limit`, a bound for a
    /// hung process, not a measurement).
    fn wait_line(&self, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let end = std::time::Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if pred(&l) => return l,
                Ok(_) => {}
                Err(e) => panic!("no such line from l2fwd: {e}"),
            }
        }
    }

    /// SIGINT, then its stdout.
    fn stop(mut self) -> String {
        let c = self.child.take().unwrap();
        pmd::sys::net::send_signal(c.id(), pmd::sys::net::SIGINT).unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "l2fwd failed");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for L2fwd {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The first number after `key ` in `text`.
fn number_after(text: &str, key: &str) -> u64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in {text}"));
    text[at + key.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text}"))
}

/// pktgen sends 60- and 1600-byte frames in turn through l2fwd: pktgen raises its own ports'
/// MTU to fit them, l2fwd's stays at 1500: l2fwd receives them all (they fit its buffers) and
/// its sending device drops the 1600-byte ones (over its MTU). pktgen's summary says its
/// devices dropped none and the 5,000 were lost elsewhere; l2fwd's device counted exactly
/// those 5,000 (`dev_tx_mtu_errors`: MANA completes each with TX_MTU_DROP, so its driver
/// counts them as `oerrors`, once).
#[test]
fn pktgen_and_l2fwd_agree_on_frames_a_device_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("agree{}", std::process::id());
    let (a, b) = (
        format!("emu-mana:wire=shm:{id}a"),
        format!("emu-mana:wire=shm:{id}b"),
    );
    let l2 = L2fwd::start(dir.path(), &a, &b, &["--json"]);
    let o = bin("pktgen")
        .args(["--port", &a, "--port", &b, "--lcores", "0"])
        .args(["--size", "60,1600", "--count", "10000", "--rate", "100000"])
        .args(["--link-timeout", "60", "--drain-timeout", "30"])
        .env("PMD_SHM_DIR", dir.path())
        .output()
        .unwrap();
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("device: port 0 accepted 10000, dropped 0, 10000 left it"),
        "{text}"
    );
    assert!(
        text.contains(
            "received 5000 (300000 B), lost 5000 (dropped by these ports' devices 0, elsewhere 5000)"
        ),
        "{text}"
    );
    // Zero extended counters stay out of the text summary (the JSON has them).
    for l in text.lines().filter(|l| l.contains(" xstats: ")) {
        assert!(!l.contains(" 0,") && !l.ends_with(" 0"), "{l}");
    }
    let l = json(l2.stop().as_bytes());
    assert_eq!(l["rx_packets"], 10000, "{l}");
    assert_eq!(l["tx_packets"], 10000, "{l}");
    assert_eq!(l["device_drops"], 5000, "{l}");
    assert_eq!(
        l["ports"][1]["stats"]["xstats"]["dev_tx_mtu_errors"], 5000,
        "{l}"
    );

    // In JSON: every counter, zeros too, per queue too.
    let id = format!("agreej{}", std::process::id());
    let cable = format!("emu-mana:wire=loop:{id}");
    let o = bin("pktgen")
        .args(["--port", &cable, "--port", &format!("{cable},rxq=2")])
        .args(["--size", "60,1600", "--count", "1000", "--json"])
        .args(["--flows", "8"])
        .output()
        .unwrap();
    ok(&o);
    let p = json(&o.stdout);
    assert_eq!(p["device"]["accepted"], 1000, "{p}");
    assert_eq!(p["device"]["tx_dropped"], 0, "{p}");
    assert_eq!(p["device"]["on_wire"], 1000, "{p}");
    assert_eq!(p["device"]["dropped"], 0, "{p}");
    assert_eq!(p["rx_packets"], 1000, "{p}");
    assert_eq!(p["lost"], 0, "{p}");
    let tx = &p["ports"][0];
    assert_eq!(tx["xstats"]["dev_tx_frames"], 1000, "{p}");
    assert_eq!(tx["xstats"]["dev_tx_mtu_errors"], 0, "zeros too: {p}");
    assert_eq!(tx["xstats"]["dev_tx_wire_drops"], 0, "zeros too: {p}");
    assert_eq!(tx["device_drops"]["tx"], 0, "{p}");
    let rxq = p["ports"][1]["rx_queues"].as_array().unwrap();
    assert_eq!(rxq.len(), 2, "{p}");
    let per_queue: u64 = rxq.iter().map(|q| q["packets"].as_u64().unwrap()).sum();
    assert_eq!(per_queue, 1000, "{p}");
}

/// pktgen sends (tx-only, so nothing reads the far cable) more 1514-byte frames than that
/// cable holds: l2fwd's egress device drops the rest, and l2fwd says so, live and in its
/// summary, in numbers that add up to what it forwarded; once pktgen has gone, the frames
/// left on that cable count as stranded.
#[test]
fn l2fwd_shows_what_its_device_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("l2drop{}", std::process::id());
    let (a, b) = (
        format!("emu-mana:wire=shm:{id}a"),
        format!("emu-mana:wire=shm:{id}b"),
    );
    let l2 = L2fwd::start(dir.path(), &a, &b, &["--stats-interval", "0.1"]);
    let n: u64 = 20_000;
    let o = bin("pktgen")
        .args(["--port", &a, "--port", &b, "--lcores", "0", "--tx-only"])
        .args(["--size", "1514", "--count", &n.to_string()])
        // A rate l2fwd keeps up with, so that its far cable (5,461 frames of 1514 bytes)
        // overflows, not pktgen's.
        .args(["--rate", "20000", "--link-timeout", "60", "--json"])
        .env("PMD_SHM_DIR", dir.path())
        .output()
        .unwrap();
    ok(&o);
    let p = json(&o.stdout);
    assert_eq!(p["tx_packets"], n, "{p}");
    assert_eq!(p["tx_only"], true, "{p}");
    assert_eq!(p["lost"], serde_json::Value::Null, "{p}");
    assert_eq!(p["device"]["accepted"], n, "{p}");
    // What left pktgen's device reached l2fwd (its own cable may have filled too, if l2fwd
    // fell behind: counted by pktgen's device).
    let on_wire = p["device"]["on_wire"].as_u64().unwrap();
    assert_eq!(
        on_wire + p["device"]["tx_dropped"].as_u64().unwrap(),
        n,
        "{p}"
    );
    // Everything that left pktgen's device has reached l2fwd when its live statistics
    // say so: port 0's received total, then what port 1's device dropped.
    l2.wait_line(Duration::from_secs(120), |l| {
        l.contains(&format!(" p0 rx {on_wire} ("))
            && l.contains(&format!(" p1 rx 0 (0 pps) tx {on_wire} ("))
    });
    // The next line: l2fwd's device has done what it does with the last frames.
    let line = l2.wait_line(Duration::from_secs(120), |l| l.contains(" p1 rx "));
    let live = number_after(&line[line.find(" p1 rx ").unwrap()..], "dev-drop tx");
    let text = l2.stop();
    let port1 = text
        .lines()
        .find(|l| l.trim_start().starts_with("port 1:"))
        .unwrap_or_else(|| panic!("{text}"));
    let port0 = text
        .lines()
        .find(|l| l.trim_start().starts_with("port 0:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(number_after(port0, "rx"), on_wire, "{text}");
    assert_eq!(number_after(port1, "tx"), on_wire, "{text}");
    let dropped = number_after(port1, "device drops tx");
    let xstats = text
        .lines()
        .find(|l| l.trim_start().starts_with("port 1 xstats:"))
        .unwrap_or_else(|| panic!("{text}"));
    let (frames, wire_drops, stranded) = (
        number_after(xstats, "dev_tx_frames"),
        number_after(xstats, "dev_tx_wire_drops"),
        number_after(xstats, "wire_tx_stranded"),
    );
    assert!(wire_drops > 0, "the far cable filled up: {text}");
    assert_eq!(
        frames + wire_drops,
        on_wire,
        "forwarded = on the cable + dropped: {text}"
    );
    // pktgen has gone without reading its far cable: what waits there is lost with it.
    assert_eq!(stranded, frames, "{text}");
    assert_eq!(dropped, wire_drops + stranded, "{text}");
    // The live line shows the same counts, from before pktgen left or from after.
    assert!(
        live == wire_drops || live == dropped,
        "live {live}, final {wire_drops} + {stranded}: {text}"
    );
    assert!(
        number_after(&text, "device drops") >= dropped,
        "the summary's total: {text}"
    );
}

/// A capture that fails after it opened (the disk fills up mid-run: a 16 KiB tmpfs, in a
/// mount namespace of our own) stops the tool with status 1 and the reason. Skipped where no
/// mount namespace can be had, unless PMD_REQUIRE_PRIVILEGED is set (CI sets it where the
/// machine allows: a skip would hide a failure).
#[test]
fn a_capture_that_fails_mid_run_fails_the_tool() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let probe = Command::new("unshare")
        .args(["-Urm", "sh", "-c"])
        .arg(format!("mount -t tmpfs -o size=16k none {}", mnt.display()))
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
            "PMD_REQUIRE_PRIVILEGED is set but a_capture_that_fails_mid_run_fails_the_tool: \
             no mount namespace (unshare -Urm) to mount a small tmpfs in"
        );
        eprintln!("SKIPPED a_capture_that_fails_mid_run_fails_the_tool: no mount namespace (unshare -Urm) to mount a small tmpfs in");
        return;
    }
    let id = format!("full{}", std::process::id());
    let cap = mnt.join("c.pcap");
    let kept = dir.path().join("kept.pcap");
    // pktgen's last case records 100 frames (7.6 kB): less than the capture's write buffer,
    // more than the 4 KiB tmpfs holds; the write that fails is the one the final reading of
    // the statistics asks for, or one before it.
    for (tool, size) in [("pktgen", "16k"), ("l2fwd", "16k"), ("short", "4k")] {
        let cable = format!("emu-mana:wire=loop:{id}{tool}");
        let cmd = match tool {
            // The capture is copied out of the namespace for the accounting check below.
            "short" => format!(
                "{} --port {cable},pcap={} --port {cable} --count 100 --rate 100000 --json; \
                 rc=$?; cp {} {}; exit $rc",
                env!("CARGO_BIN_EXE_pktgen"),
                cap.display(),
                cap.display(),
                kept.display()
            ),
            "pktgen" => format!(
                "exec {} --port {cable},pcap={} --port {cable} --count 50000 --rate 50000",
                env!("CARGO_BIN_EXE_pktgen"),
                cap.display()
            ),
            // l2fwd forwards what it receives from a pktgen beside it, which ends by itself
            // and is waited for.
            _ => format!(
                "{pg} --port emu-mana:wire=shm:{id}a --port emu-mana:wire=shm:{id}b --count 20000 --rate 20000 --link-timeout 60 --file-prefix pktgen >/dev/null 2>&1 & \
                 {l2} --port emu-mana:wire=shm:{id}a,pcap={cap} --port emu-mana:wire=shm:{id}b --duration 60; rc=$?; wait; exit $rc",
                pg = env!("CARGO_BIN_EXE_pktgen"),
                l2 = env!("CARGO_BIN_EXE_l2fwd"),
                cap = cap.display(),
            ),
        };
        let o = integration_tests::own_runtime_dir(&mut Command::new("unshare"))
            .args(["-Urm", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o size={size} none {} && {cmd}",
                mnt.display()
            ))
            .env("PMD_LOG", "off")
            .env("PMD_SHM_DIR", dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{tool}: {err}");
        let prefix = match tool {
            "l2fwd" => "l2fwd: port 0 (emu-mana:wire=shm",
            _ => "pktgen: port 0 (emu-mana:wire=loop",
        };
        assert!(
            err.contains(prefix)
                && err.contains("writing the pcap capture failed (No space left on device"),
            "{tool}: {err}"
        );
        if tool == "short" {
            short_capture_accounts_for_every_frame(&o, &kept);
        }
    }
}

/// What the failed capture of the "short" case left: a file a reader takes to its end (no
/// record cut in half), whose records and the port's `wire_pcap_unrecorded` add up to every
/// frame port 0's device sent and received.
fn short_capture_accounts_for_every_frame(o: &Output, kept: &std::path::Path) {
    let data = std::fs::read(kept).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
    let mut records = 0u64;
    while let Some(p) = r.next_packet() {
        let p = p.unwrap_or_else(|e| panic!("record {records} of the kept capture: {e}"));
        assert_eq!(p.data.len(), 60);
        records += 1;
    }
    let report = json(&o.stdout);
    let port = &report["ports"][0];
    let x = |name: &str| {
        port["xstats"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {port}"))
    };
    // The tap sees every frame the device offers its wire and every frame it takes off it,
    // whatever becomes of them.
    let tx = x("dev_tx_frames") + x("dev_tx_wire_drops");
    let rx = x("dev_rx_frames") + x("dev_rx_no_wqe") + x("dev_rx_truncated");
    let unrecorded = x("wire_pcap_unrecorded");
    assert!(
        records > 0 && unrecorded > 0,
        "records {records}, unrecorded {unrecorded}"
    );
    assert_eq!(records + unrecorded, tx + rx, "{port}");
}

fn write_pcap(path: &std::path::Path, times_ms: &[u64]) {
    let mut w = pcap_file::pcap::PcapWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for (i, t) in times_ms.iter().enumerate() {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14] = i as u8;
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            Duration::from_millis(1_700_000_000_000 + t),
            60,
            &f,
        ))
        .unwrap();
    }
}

/// `--pcap-timing` sends a capture's frames at their own times: frames at 0, 0.2 and 10 s
/// give 2 frames in a 1-second run; 20 times as fast (a loop of 0.75 s: frames at 0, 0.01,
/// 0.5, 0.75, 0.76, then 1.25 s), 5. A capture without a span has no timing to replay.
#[test]
fn pcap_timing_replays_the_capture_s_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.pcap");
    write_pcap(&input, &[0, 200, 10_000]);
    let id = format!("timing{}", std::process::id());
    for (speed, want) in [("1", 2), ("20", 5)] {
        let cable = format!("emu-mana:wire=loop:{id}{speed}");
        let o = bin("pktgen")
            .args(["--port", &cable, "--port", &cable, "--json"])
            .args(["--pcap", input.to_str().unwrap(), "--pcap-timing"])
            .args(["--pcap-speed", speed, "--duration", "1"])
            .output()
            .unwrap();
        ok(&o);
        let p = json(&o.stdout);
        assert_eq!(p["tx_packets"], want, "x{speed}: {p}");
        assert_eq!(p["rx_packets"], want, "x{speed}: {p}");
    }
    let one = dir.path().join("one.pcap");
    write_pcap(&one, &[5, 5]);
    let o = bin("pktgen")
        .args([
            "--port",
            "null",
            "--pcap",
            one.to_str().unwrap(),
            "--pcap-timing",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--pcap-timing: the capture spans no time"),
        "{err}"
    );
}

/// Frames of `--imix` and of a size list: their bytes add up to the cycle's, on both sides;
/// frames carry `--src-mac`, or the sending port's MAC by default (seen in a capture).
#[test]
fn imix_size_lists_and_source_macs() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("imix{}", std::process::id());
    let cases: [(&[&str], u64, u64); 2] = [
        // 100 cycles of 7 x 60, 4 x 590, 1 x 1514.
        (&["--imix"], 1200, 100 * (7 * 60 + 4 * 590 + 1514)),
        (&["--size", "64,128,1514"], 300, 100 * (64 + 128 + 1514)),
    ];
    for (i, (opts, count, bytes)) in cases.iter().enumerate() {
        let cable = format!("emu-mana:wire=loop:{id}{i}");
        let o = bin("pktgen")
            .args(["--port", &cable, "--port", &cable, "--json"])
            .args(*opts)
            .args(["--count", &count.to_string(), "--rate", "20000"])
            .output()
            .unwrap();
        ok(&o);
        let p = json(&o.stdout);
        assert_eq!(p["tx_packets"], *count, "{p}");
        assert_eq!(p["rx_packets"], *count, "{p}");
        assert_eq!(p["tx_bytes"], *bytes, "{p}");
        assert_eq!(p["rx_bytes"], *bytes, "{p}");
        assert_eq!(p["lost"], 0, "{p}");
    }
    for (src, want) in [
        (None, [0x02, 0x11, 0x22, 0x33, 0x44, 0x55]),
        (
            Some("02:aa:bb:cc:dd:ee"),
            [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee],
        ),
    ] {
        let cap = dir.path().join("mac.pcap");
        let cable = format!("emu-mana:wire=loop:{id}mac");
        let mut c = bin("pktgen");
        c.args([
            "--port",
            &format!("{cable},mac=02:11:22:33:44:55,pcap={}", cap.display()),
            "--port",
            &cable,
            "--count",
            "3",
            "--json",
        ]);
        if let Some(m) = src {
            c.args(["--src-mac", m]);
        }
        ok(&c.output().unwrap());
        let data = std::fs::read(&cap).unwrap();
        let mut r = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
        let mut n = 0;
        while let Some(pkt) = r.next_packet() {
            assert_eq!(pkt.unwrap().data[6..12], want, "--src-mac {src:?}");
            n += 1;
        }
        assert_eq!(n, 3);
    }
}

/// The rate options convert as they say: `--rate-gbps` counts frame bytes without FCS,
/// `--rate-gbps-l1` adds FCS, preamble, delimiter and gap (20 + 4 bytes a frame): 10 Mbit/s
/// of 60-byte frames is 20.83 kpps at L2, 14.88 kpps at L1 (what a 10G link's 14.88 Mpps
/// is, scaled). The banner says the rate it will send at.
#[test]
fn l1_and_l2_rates_convert_as_documented() {
    for (opt, want) in [
        ("--rate-gbps", "20.83 kpps"),
        ("--rate-gbps-l1", "14.88 kpps"),
    ] {
        let id = format!("l1{}{}", std::process::id(), opt.len());
        let cable = format!("emu-mana:wire=loop:{id}");
        let o = bin("pktgen")
            .args(["--port", &cable, "--port", &cable, opt, "0.01"])
            .args(["--count", "10", "--stats-interval", "0"])
            .output()
            .unwrap();
        let err = ok(&o);
        assert!(err.contains(&format!("pktgen: {want} on")), "{opt}: {err}");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("Gbit/s L1)"), "{text}");
    }
}
