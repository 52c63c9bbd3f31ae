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
