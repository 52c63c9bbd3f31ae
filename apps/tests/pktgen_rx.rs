//! pktgen's receive side: every RX queue of the receiving port is polled, and reordering is
//! counted per flow.

use std::process::Command;

/// 10,000 frames of 64 flows into a receiving port with two RX queues (RSS spreads the flows
/// over both): every frame is counted, none lost, none reordered within its flow.
#[test]
fn every_rx_queue_is_polled() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("rxq{}", std::process::id());
    let o = Command::new(env!("CARGO_BIN_EXE_pktgen"))
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
}
