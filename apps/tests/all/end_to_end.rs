//! The tools end to end, as separate processes on the device model:
//!
//!   pktgen port 0 --shm A--> l2fwd port 0 -> l2fwd port 1 --shm B--> pktgen port 1
//!
//! The ports run their models' default engine, inline (no thread beyond the tools' polling
//! cores; one test runs them on threads). Counts are exact at a high rate on a loaded
//! machine: an inline device takes a frame off its cable only when it has a buffer for it,
//! so frames wait on the cables (131,072 of 60 bytes each) while a process is not
//! scheduled, and a test sends fewer than that; nothing in these tests is timed.

use crate::support::{bin, json, stop, succeeded, Bg};
use std::io::Read;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

struct Topology {
    dir: tempfile::TempDir,
    a: String,
    b: String,
    /// pktgen's ends of the two cables (the same wires, maybe another model kind).
    pa: String,
    pb: String,
}

impl Topology {
    fn new(tag: &str) -> Self {
        Self::with_kinds(tag, "emu-mana", "", "emu-mana")
    }

    /// l2fwd's ports of kind `l2` (with devargs `l2x` after the wire), pktgen's of kind `pg`,
    /// on the same two cables.
    fn with_kinds(tag: &str, l2: &str, l2x: &str, pg: &str) -> Self {
        Self::with_devargs(tag, l2, l2x, pg, "")
    }

    /// [`with_kinds`](Self::with_kinds), pktgen's ports with devargs `pgx` too.
    fn with_devargs(tag: &str, l2: &str, l2x: &str, pg: &str, pgx: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id = format!("{tag}{}", std::process::id());
        Self {
            dir,
            a: format!("{l2}:wire=shm:{id}a{l2x}"),
            b: format!("{l2}:wire=shm:{id}b{l2x}"),
            pa: format!("{pg}:wire=shm:{id}a{pgx}"),
            pb: format!("{pg}:wire=shm:{id}b{pgx}"),
        }
    }

    fn l2fwd(&self, extra: &[&str]) -> Bg {
        let child = bin("l2fwd")
            .args([
                "--port",
                &self.a,
                "--port",
                &self.b,
                "--lcores",
                "1",
                "--json",
                "--ring-size",
                "1024",
            ])
            .args(extra)
            .env("PMD_SHM_DIR", self.dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Bg(Some(child))
    }

    fn pktgen(&self, extra: &[&str]) -> Output {
        bin("pktgen")
            .args([
                "--port",
                &self.pa,
                "--port",
                &self.pb,
                "--lcores",
                "0",
                "--json",
                // l2fwd may be slow to start on a loaded machine.
                "--link-timeout",
                "60",
            ])
            .args(extra)
            .env("PMD_SHM_DIR", self.dir.path())
            .output()
            .unwrap()
    }
}

#[test]
fn demo_topology_loses_nothing_and_every_count_agrees() {
    demo(&Topology::new("e2e"));
}

/// The same with every model on its own thread (`engine=thread`): a device then works
/// whether or not its process is scheduled, and drops (and counts) what finds no buffer or no
/// room on its cable, as a NIC does. Whether that happens depends on the machine's load, so
/// this test does not ask for zero loss: it asks that every frame be accounted for exactly,
/// received or counted by the device that lost it.
#[test]
fn demo_topology_with_engine_threads_accounts_for_every_frame() {
    let t = Topology::with_devargs(
        "thr",
        "emu-mana",
        ",engine=thread",
        "emu-mana",
        ",engine=thread",
    );
    let l2 = t.l2fwd(&[]);
    let out = t.pktgen(&[
        "--count",
        "50000",
        "--rate",
        "50000",
        "--drain-timeout",
        "30",
    ]);
    let p = succeeded(&out);
    let l = stop(l2);
    assert!(l.status.success(), "{}", String::from_utf8_lossy(&l.stderr));
    let l = json(&l.stdout);
    // Where a frame can be lost on its way, each counted by the device or tool there (a
    // MANA TX error completion, a frame over the MTU included, is one frame lost).
    const LOSSES: [&str; 4] = [
        "dev_tx_wire_drops",
        "dev_rx_no_wqe",
        "dev_rx_fault_drops",
        "dev_tx_errors",
    ];
    let counted = |xstats: &serde_json::Value| -> u64 {
        LOSSES.iter().map(|k| xstats[k].as_u64().unwrap()).sum()
    };
    let pktgen_losses: u64 = (0..2).map(|i| counted(&p["ports"][i]["xstats"])).sum();
    let l2fwd_losses: u64 = (0..2)
        .map(|i| counted(&l["ports"][i]["stats"]["xstats"]))
        .sum::<u64>()
        + l["dropped"].as_u64().unwrap();
    let (tx, rx) = (
        p["tx_packets"].as_u64().unwrap(),
        p["rx_packets"].as_u64().unwrap(),
    );
    assert_eq!(tx, 50000);
    assert_eq!(
        tx,
        rx + pktgen_losses + l2fwd_losses,
        "every frame received or counted where it was lost:\npktgen {p}\nl2fwd {l}"
    );
    assert_eq!(p["lost"].as_u64().unwrap(), tx - rx);
    assert_eq!(p["duplicates"], 0);
    assert_eq!(
        (p["pool_in_use"].clone(), l["pool_in_use"].clone()),
        (0.into(), 0.into())
    );
}

/// The demo with the mlx5 model on both sides, mixed (pktgen on MANA models, l2fwd on mlx5
/// models, over the same shared-memory cables), with l2fwd's ports modelling a ConnectX-4
/// (18 bytes inline: SEND WQEs instead of eMPW), and with l2fwd receiving through
/// multi-packet RQs (DPDK's default geometry; then 64-byte strides, two per 100-byte frame,
/// with uncompressed CQEs). Each variant's device shows that its mode was in effect: the
/// WQEs it was sent, the striding WQEs l2fwd's driver retired.
#[test]
fn demo_topology_on_mlx5_models_and_mixed_loses_nothing() {
    const N: u64 = 100_000;
    // l2fwd's port 0 receives, its port 1 sends; every frame is eMPW-eligible (one segment,
    // no VLAN or TSO), so where no inline header is needed no SEND WQE is sent.
    let (_, l) = demo(&Topology::with_kinds("mlx", "emu-mlx5", "", "emu-mlx5"));
    assert_eq!(xstat(&l, 1, "dev_tx_send_wqes"), 0, "eMPW: {l}");
    assert_eq!(xstat(&l, 0, "rx_mprq_wqes_retired"), 0, "cyclic RQ: {l}");
    demo(&Topology::with_kinds("mix", "emu-mlx5", "", "emu-mana"));
    // One SEND WQE a frame (the model fails any with fewer than 18 bytes inline).
    let (_, l) = demo(&Topology::with_kinds(
        "cx4",
        "emu-mlx5",
        ",inline=18",
        "emu-mana",
    ));
    assert_eq!(xstat(&l, 1, "dev_tx_send_wqes"), N, "SEND WQEs: {l}");
    // 64 strides of 2 KiB a WQE, one stride a frame: the driver retired every full WQE.
    let (_, l) = demo(&Topology::with_kinds(
        "mprq", "emu-mlx5", ",mprq=1", "emu-mlx5",
    ));
    assert_eq!(xstat(&l, 0, "rx_mprq_wqes_retired"), N / 64, "{l}");
    assert_eq!(xstat(&l, 0, "dev_rx_fillers"), 0, "{l}");
    // 64 strides of 64 bytes: a 100-byte frame takes two, so a WQE holds 32 frames (of
    // 2 KiB strides, 64). 50,000 frames: their 128-byte records fit a cable (8 MiB).
    let n = 50_000;
    let (p, l) = demo_of(
        &Topology::with_kinds(
            "strides",
            "emu-mlx5",
            ",mprq=1,mprq-log-stride=6,cqe-comp=0",
            "emu-mana",
        ),
        n,
        100,
    );
    assert_eq!(p["rx_bytes"], n * 100, "{p}");
    assert_eq!(xstat(&l, 0, "rx_mprq_wqes_retired"), n * 2 / 64, "{l}");
    assert_eq!(xstat(&l, 0, "dev_rx_fillers"), 0, "{l}");
    assert_eq!(xstat(&l, 0, "dev_rx_compressed_sessions"), 0, "{l}");
}

/// The counter `name` of l2fwd's port `port` in its JSON report `l`.
fn xstat(l: &serde_json::Value, port: usize, name: &str) -> u64 {
    l["ports"][port]["stats"]["xstats"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} on port {port}: {l}"))
}

/// The same with every MANA model coalescing RX completions (`cqe-coalesce=1`, as
/// `mana_ib` sets up RSS QPs on newer kernels): up to four packets per RX_COALESCED_4 CQE,
/// which both tools' drivers take apart with nothing lost; the devices wrote fewer
/// completions than they received frames.
#[test]
fn demo_topology_with_coalesced_rx_completions_loses_nothing() {
    let t = Topology::with_devargs(
        "coal",
        "emu-mana",
        ",cqe-coalesce=1",
        "emu-mana",
        ",cqe-coalesce=1",
    );
    let (out, l2) = run_demo(&t, 100_000, 60);
    let p = succeeded(&out);
    let rx_port = &p["ports"][1]["xstats"];
    let (frames, cqes) = (
        rx_port["dev_rx_frames"].as_u64().unwrap(),
        rx_port["dev_rx_cqes"].as_u64().unwrap(),
    );
    assert_eq!(frames, 100_000, "{p}");
    assert!(cqes < frames, "coalesced: {cqes} CQEs for {frames} frames");
    // The driver saw them as such.
    assert!(rx_port["rx_coalesced_cqes"].as_u64().unwrap() > 0, "{p}");
    check_demo(out, l2, 100_000);
}

/// 100,000 frames of 60 bytes at 1 Mpps through l2fwd and back: every one arrives, once, and
/// every count of both tools and their devices agrees. Returns the reports of pktgen and
/// l2fwd.
fn demo(t: &Topology) -> (serde_json::Value, serde_json::Value) {
    demo_of(t, 100_000, 60)
}

/// [`demo`] with `n` frames of `size` bytes.
fn demo_of(t: &Topology, n: u64, size: u32) -> (serde_json::Value, serde_json::Value) {
    let (out, l2) = run_demo(t, n, size);
    check_demo(out, l2, n)
}

/// [`demo_of`]'s run: pktgen's output and l2fwd, still running.
fn run_demo(t: &Topology, n: u64, size: u32) -> (Output, Bg) {
    // No sleep: pktgen waits for its links, which come up when l2fwd has opened the cables.
    let l2 = t.l2fwd(&[]);
    let out = t.pktgen(&[
        "--count",
        &n.to_string(),
        "--rate",
        "1000000",
        "--flows",
        "16",
        "--size",
        &size.to_string(),
        "--drain-timeout",
        "60",
    ]);
    (out, l2)
}

/// Checks the run of [`run_demo`]; returns the reports of pktgen and l2fwd.
fn check_demo(out: Output, l2: Bg, n: u64) -> (serde_json::Value, serde_json::Value) {
    let p = succeeded(&out);
    assert_eq!(p["tx_packets"], n);
    assert_eq!(p["rx_packets"], n, "{p}");
    assert_eq!(p["lost"], 0);
    assert_eq!(p["duplicates"], 0);
    assert_eq!(p["pool_in_use"], 0);
    assert!(p["latency_ns"]["p50"].as_u64().unwrap() > 0);
    // Nothing lost anywhere: no port counted a loss.
    for port in p["ports"].as_array().expect("ports in the report") {
        assert_eq!(port["xstats"]["dev_tx_wire_drops"], 0, "{p}");
        assert_eq!(port["imissed"], 0, "{p}");
    }
    let l = stop(l2);
    assert!(
        l.status.success(),
        "l2fwd failed: {}",
        String::from_utf8_lossy(&l.stderr)
    );
    let l = json(&l.stdout);
    assert_eq!(l["rx_packets"], n, "{l}");
    assert_eq!(l["tx_packets"], n);
    assert_eq!(l["dropped"], 0);
    assert_eq!(l["ports"][0]["rx_packets"], n);
    assert_eq!(l["ports"][1]["tx_packets"], n);
    assert_eq!(l["ports"][1]["stats"]["xstats"]["dev_tx_frames"], n, "{l}");
    assert_eq!(l["ports"][1]["stats"]["xstats"]["dev_tx_wire_drops"], 0);
    assert_eq!(l["ports"][0]["stats"]["imissed"], 0);
    assert_eq!(l["pool_in_use"], 0);
    (p, l)
}

/// The far end of both cables goes away and comes back (pktgen exits, a second pktgen
/// starts): l2fwd logs each port's link going down and up again, keeps running, and
/// forwards the second run as completely as the first.
#[test]
fn l2fwd_keeps_forwarding_across_a_link_flap() {
    let t = Topology::new("flap");
    let l2 = t.l2fwd(&[]);
    for run in 1..=2 {
        let out = t.pktgen(&["--count", "3000", "--rate", "20000"]);
        let p = succeeded(&out);
        assert_eq!(p["rx_packets"], 3000, "run {run}: {p}");
        assert_eq!(p["lost"], 0, "run {run}: {p}");
        // l2fwd sees the far ends go (the model looks every 10 ms) before the next run.
        std::thread::sleep(Duration::from_millis(200));
    }
    let l = stop(l2);
    let err = String::from_utf8_lossy(&l.stderr).into_owned();
    assert!(l.status.success(), "l2fwd failed: {err}");
    let j = json(&l.stdout);
    assert_eq!(j["rx_packets"], 6000, "{j}");
    assert_eq!(j["tx_packets"], 6000, "{j}");
    for port in 0..2u64 {
        let mut seen: Vec<&str> = j["events"]
            .as_array()
            .expect("events in the report")
            .iter()
            .filter(|e| e["port"] == port)
            .map(|e| e["event"].as_str().unwrap())
            .collect();
        // The first pktgen may attach before l2fwd opens the port: then the port starts up
        // and there is no first link_up.
        if seen.first() == Some(&"link_up") {
            seen.remove(0);
        }
        assert_eq!(
            seen,
            ["link_down", "link_up", "link_down"],
            "port {port}: the peer went, came again and went: {j}"
        );
        assert!(
            err.contains(&format!(
                "l2fwd: port {port} ({}): link down",
                [&t.a, &t.b][port as usize]
            )),
            "{err}"
        );
    }
}

#[test]
fn l2fwd_killed_midway_pktgen_reports_loss_and_exits() {
    let t = Topology::new("kill");
    let mut l2 = t.l2fwd(&[]);
    // Killed and reaped at once, as a shell reaps its children: a zombie still counts as a
    // live holder of its cable end.
    let mut l2_err = l2.child().stderr.take();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let _ = pmd::sys::net::send_signal(l2.child().id(), pmd::sys::net::SIGKILL);
        assert!(
            integration_tests::eventually(Duration::from_secs(10), || l2
                .child()
                .try_wait()
                .unwrap()
                .is_some()),
            "l2fwd survived SIGKILL?"
        );
    });
    let t0 = Instant::now();
    let out = t.pktgen(&["--rate", "10000", "--duration", "4", "--drain-timeout", "1"]);
    killer.join().unwrap();
    let mut err = String::new();
    if let Some(e) = l2_err.as_mut() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        out.status.success(),
        "pktgen must exit cleanly: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "nothing hangs");
    let p = json(&out.stdout);
    let tx = p["tx_packets"].as_u64().unwrap();
    let rx = p["rx_packets"].as_u64().unwrap();
    let lost = p["lost"].as_u64().unwrap();
    assert!(tx >= 35_000, "{p}");
    assert!(rx > 0 && rx < tx, "{p}");
    assert_eq!(lost, tx - rx, "{p}");
    assert_eq!(p["pool_in_use"], 0);
}

#[test]
fn pcap_replay_is_byte_exact_at_the_far_side() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let capture = dir.path().join("out.pcap");
    let mut frames = Vec::new();
    for i in 0..50u32 {
        let mut f = vec![0u8; 60 + (i as usize * 37) % 900];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x09]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x08]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        for (k, b) in f[14..].iter_mut().enumerate() {
            *b = (k as u32 * 7 + i) as u8;
        }
        frames.push(f);
    }
    let mut w = pcap_file::pcap::PcapWriter::new(std::fs::File::create(&input).unwrap()).unwrap();
    for f in &frames {
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            Duration::ZERO,
            f.len() as u32,
            f,
        ))
        .unwrap();
    }
    drop(w);
    let cable = format!("emu-mana:wire=loop:replay{}", std::process::id());
    let out = bin("pktgen")
        .args([
            "--port",
            &cable,
            "--port",
            &format!("{cable},pcap={}", capture.display()),
        ])
        .args([
            "--lcores",
            "0",
            "--json",
            "--pcap",
            input.to_str().unwrap(),
            "--count",
            "100",
            "--rate",
            "5000",
        ])
        .output()
        .unwrap();
    let p = succeeded(&out);
    assert_eq!(p["tx_packets"], 100);
    assert_eq!(p["rx_packets"], 100);
    let data = std::fs::read(&capture).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(&data[..]).unwrap();
    let mut got = Vec::new();
    while let Some(pkt) = r.next_packet() {
        got.push(pkt.unwrap().data.into_owned());
    }
    let want: Vec<Vec<u8>> = frames.iter().chain(frames.iter()).cloned().collect();
    assert_eq!(
        got, want,
        "the capture on the far side equals the replayed file twice over, in order"
    );
}

#[test]
fn bad_command_lines_fail_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pcap");
    std::fs::write(&junk, b"not a capture at all").unwrap();
    let junk = junk.to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("l2fwd", vec!["--port", "null"], "give an even number"),
        (
            "l2fwd",
            vec!["--port", "null", "--port", "nope"],
            "unknown port kind 'nope'",
        ),
        (
            "l2fwd",
            vec!["--port", "null", "--port", "null", "--lcores", "777"],
            "core 777 does not exist",
        ),
        (
            "l2fwd",
            vec!["--port", "null", "--port", "null", "--lcores", "0-"],
            "bad core list",
        ),
        (
            "l2fwd",
            vec!["--port", "null", "--port", "null", "--duration=-1"],
            "--duration",
        ),
        (
            "l2fwd",
            vec!["--port", "emu-mana:wire=tcp:x", "--port", "null"],
            "bad value 'tcp:x' for 'wire'",
        ),
        (
            "l2fwd",
            vec!["--port", "null", "--port", "null", "--frobnicate"],
            "unexpected argument",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--size", "20"],
            "invalid value '20' for '--size",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--rate", "0"],
            "--rate <PPS>",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--rate", "5", "--max"],
            "cannot be used with",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--rx-only", "--count", "5"],
            "--rx-only",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--pcap", &junk],
            "not a pcap or pcapng file",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--src-ip", "1.2.3"],
            "not an IPv4 address",
        ),
        (
            "pktgen",
            vec!["--port", "null", "--port", "null", "--port", "null"],
            "3 ports given",
        ),
        (
            "pktgen",
            vec!["--port", "mana:dev=mana_0"],
            "no MANA RDMA device",
        ),
    ];
    for (tool, args, needle) in cases {
        let out = bin(tool).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{tool} {args:?} should fail");
        assert!(
            err.contains(needle),
            "{tool} {args:?}: stderr lacks {needle:?}:\n{err}"
        );
    }
}

#[test]
fn help_explains_the_tools() {
    for tool in ["l2fwd", "pktgen"] {
        let out = bin(tool).arg("--help").output().unwrap();
        assert!(out.status.success());
        let h = String::from_utf8_lossy(&out.stdout);
        assert!(
            h.contains("--port <SPEC>") && h.contains("--lcores") && h.contains("--json"),
            "{h}"
        );
    }
}
