//! The examples run and succeed.

#[test]
fn loopback_example_runs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loopback"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("port 0 sent 8 frames"), "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
}

#[test]
fn loopback_help_describes_it_and_bad_arguments_are_usage_errors() {
    let bin = env!("CARGO_BIN_EXE_loopback");
    let out = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("smallest complete program") && text.contains("Usage: loopback"),
        "{text}"
    );
    let out = std::process::Command::new(bin)
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument"));
}

/// The forwarder moves the frames across, accounts for every one that did not arrive, and
/// every buffer goes back to the pool.
#[test]
fn skeleton_forwards_and_accounts_for_every_frame() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_skeleton"))
        .args(["--frames", "20000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("every frame accounted for"), "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
    let received: u64 = text
        .split("received ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no received count in {text}"));
    assert!(received > 0, "{text}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_skeleton"))
        .args(["--frames", "x"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--frames needs a positive number"));
}

/// Four workers, one per RX queue: every frame arrives with its flow's Toeplitz hash, no flow
/// is split over two queues, every queue gets some, every buffer goes back.
#[test]
fn rss_spreads_flows_over_queues_with_their_hash() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rss"))
        .args(["--queues", "4", "--flows", "64", "--frames", "5000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("frames with a wrong hash: 0; flows seen on two queues: 0"),
        "{text}"
    );
    for q in 0..4 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("queue {q}: ")))
            .unwrap_or_else(|| panic!("no queue {q} in {text}"));
        assert!(!line.starts_with(&format!("queue {q}: 0 frames")), "{text}");
    }
    assert!(text.contains("mbufs still in use: 0"), "{text}");
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_rss"))
        .args(["--queues", "99"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--queues needs a number from 1 to 16"));
}
