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
