//! pktgen's receive side: every RX queue of the receiving port is polled, and reordering is
//! counted per flow.

use std::process::Command;

/// pktgen, with a runtime directory (telemetry socket) of its own.
fn pktgen() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pktgen"));
    integration_tests::own_runtime_dir(&mut c);
    c
}

/// 10,000 frames of 64 flows into a receiving port with two RX queues (RSS spreads the flows
/// over both): every frame is counted, none lost, none reordered within its flow, and each
/// queue received its share.
#[test]
fn every_rx_queue_is_polled() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("rxq{}", std::process::id());
    let o = pktgen()
        .args(["--port", &format!("emu-mana:wire=loop:{id}")])
        .args(["--port", &format!("emu-mana:wire=loop:{id},rxq=2")])
        .args([
            "--flows", "64", "--count", "10000", "--rate", "20000", "--json",
        ])
        .env("PMD_SHM_DIR", dir.path())
        .env("PMD_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["tx_packets"], 10000, "{j}");
    assert_eq!(j["rx_packets"], 10000, "{j}");
    assert_eq!(j["lost"], 0, "{j}");
    assert_eq!(j["reordered"], 0, "{j}");
    let queues = j["ports"][1]["rx_queues"]
        .as_array()
        .unwrap_or_else(|| panic!("no rx_queues: {j}"));
    assert_eq!(queues.len(), 2, "{j}");
    let per_queue: Vec<u64> = queues
        .iter()
        .map(|q| q["packets"].as_u64().unwrap())
        .collect();
    assert!(per_queue.iter().all(|&n| n > 0), "{per_queue:?}: {j}");
    assert_eq!(per_queue.iter().sum::<u64>(), 10000, "{j}");
}

/// At a very low rate pktgen still stops at its deadline (not at the next frame's time) and
/// on a signal within moments, and the duration it reports is the send period.
#[test]
fn pacing_honours_the_deadline_and_signals_at_any_rate() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("slow{}", std::process::id());
    let port = format!("emu-mana:wire=loop:{id}");
    let t0 = std::time::Instant::now();
    let o = pktgen()
        .args(["--port", &port, "--port", &port])
        .args(["--rate", "0.1", "--duration", "2", "--json"])
        .env("PMD_SHM_DIR", dir.path())
        .output()
        .unwrap();
    let took = t0.elapsed();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = j["duration_s"].as_f64().unwrap();
    assert!((1.9..2.5).contains(&d), "reported {d} s: {j}");
    // The next frame was due 10 s after the first; the run ends at its 2 s deadline.
    assert!(took < std::time::Duration::from_secs(9), "ran {took:?}");
    assert_eq!(j["tx_packets"], 1, "{j}");

    // 0.05 pps: the next frame is 20 s away; SIGINT ends the run at once.
    let mut child = pktgen()
        .args(["--port", &port, "--port", &port])
        .args(["--rate", "0.05", "--duration", "60", "--json"])
        .env("PMD_SHM_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let t1 = std::time::Instant::now();
    pmd::sys::net::send_signal(child.id(), pmd::sys::net::SIGINT).unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            t1.elapsed() < std::time::Duration::from_secs(8),
            "SIGINT ignored while waiting for the next frame"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(child.wait().unwrap().success());
}

/// Ctrl-C stops the sending, lets the frames in flight arrive, and reports the send period:
/// nothing counted lost, the duration that of the sending.
#[test]
fn ctrl_c_drains_and_measures_the_send_period() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("cc{}", std::process::id());
    let port = format!("emu-mana:wire=loop:{id}");
    let child = pktgen()
        .args(["--port", &port, "--port", &port])
        .args(["--rate", "20000", "--duration", "60", "--json"])
        .env("PMD_SHM_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    pmd::sys::net::send_signal(child.id(), pmd::sys::net::SIGINT).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tx = j["tx_packets"].as_u64().unwrap();
    assert!(tx > 0, "{j}");
    assert_eq!(j["rx_packets"], tx, "every frame sent arrives: {j}");
    assert_eq!(j["lost"], 0, "{j}");
    // The send period (the signal came 1.5 s after the start), not the send period plus the
    // drain and the shutdown.
    let secs = j["duration_s"].as_f64().unwrap();
    assert!(secs > 0.3 && secs < 2.5, "{tx} frames over {secs} s: {j}");
}

/// `--max-loss PCT`: loss above it exits 1 after the report; at or below it, 0.
#[test]
fn max_loss_fails_a_lossy_run() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("ml{}", std::process::id());
    let run = |max: &str| {
        pktgen()
            .args(["--port", &format!("emu-mana:wire=loop:{id}")])
            .args(["--port", &format!("emu-mana:wire=loop:{id}")])
            .args([
                "--count",
                "200",
                "--rate",
                "10000",
                "--drain-timeout",
                "0.2",
            ])
            .args(["--max-loss", max])
            .env("PMD_SHM_DIR", dir.path())
            .output()
            .unwrap()
    };
    // Nothing is lost on a loop cable: 0% passes.
    let o = run("0");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A model port whose frames go nowhere: every frame sent is lost.
    let o = pktgen()
        .args([
            "--port",
            "emu-mana:wire=none",
            "--count",
            "100",
            "--max-loss",
            "10",
        ])
        .args(["--drain-timeout", "0.1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("lost 100 of 100 frames (100.000%), more than --max-loss 10%"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("lost"),
        "the report comes first"
    );
    let o = pktgen()
        .args(["--port", "null", "--max-loss", "150"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "a percentage above 100 is a usage error"
    );
}
