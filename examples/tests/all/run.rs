//! The examples run and succeed, and refuse bad arguments as usage errors.

/// Runs `bin` with `args`: its exit code, stdout and stderr.
fn run(bin: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(bin).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `bin` with `args`, which must succeed: its stdout.
fn run_ok(bin: &str, args: &[&str]) -> String {
    let (code, out, err) = run(bin, args);
    assert_eq!(code, Some(0), "{out}\n{err}");
    out
}

/// `bin` with `args` is a usage error (exit status 2) that says `why`.
fn assert_usage_error(bin: &str, args: &[&str], why: &str) {
    let (code, _, err) = run(bin, args);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(why), "{err}");
}

#[test]
fn loopback_example_runs() {
    let text = run_ok(env!("CARGO_BIN_EXE_loopback"), &[]);
    assert!(text.contains("port 0 sent 8 frames"), "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
}

#[test]
fn loopback_help_describes_it_and_bad_arguments_are_usage_errors() {
    let bin = env!("CARGO_BIN_EXE_loopback");
    let text = run_ok(bin, &["--help"]);
    assert!(
        text.contains("smallest complete program") && text.contains("Usage: loopback"),
        "{text}"
    );
    assert_usage_error(bin, &["--bogus"], "unexpected argument");
}

/// The forwarder moves the frames across, accounts for every one that did not arrive, and
/// every buffer goes back to the pool.
#[test]
fn skeleton_forwards_and_accounts_for_every_frame() {
    let bin = env!("CARGO_BIN_EXE_skeleton");
    let text = run_ok(bin, &["--frames", "20000"]);
    assert!(text.contains("every frame accounted for"), "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
    let received: u64 = text
        .split("received ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no received count in {text}"));
    assert!(received > 0, "{text}");
    assert_usage_error(bin, &["--frames", "x"], "--frames needs a positive number");
}

/// Four workers, one per RX queue: every frame arrives with its flow's Toeplitz hash, no flow
/// is split over two queues, every queue gets some, every buffer goes back.
#[test]
fn rss_spreads_flows_over_queues_with_their_hash() {
    let bin = env!("CARGO_BIN_EXE_rss");
    let text = run_ok(bin, &["--queues", "4", "--flows", "64", "--frames", "5000"]);
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
    assert_usage_error(
        bin,
        &["--queues", "99"],
        "--queues needs a number from 1 to 16",
    );
}

/// The router explains itself and refuses a bad command line before it opens a port.
#[test]
fn router_help_and_bad_arguments_are_usage_errors() {
    let bin = env!("CARGO_BIN_EXE_router");
    let text = run_ok(bin, &["--help"]);
    assert!(
        text.contains("longest-prefix match") && text.contains("Usage: router"),
        "{text}"
    );
    let port = "emu-mana:wire=loop:router-usage";
    assert_usage_error(bin, &["--port", port], "at least two --port");
    assert_usage_error(bin, &["--port", port, "--port", port], "no --route");
    assert_usage_error(
        bin,
        &["--route", "10.0.0.1/8,0,02:00:00:00:00:01"],
        "did you mean 10.0.0.0/8",
    );
    assert_usage_error(
        bin,
        &[
            "--port",
            port,
            "--port",
            port,
            "--route",
            "10.0.0.0/8,2,02:00:00:00:00:01",
        ],
        "out of port 2, but there are 2 ports",
    );
}

/// Three processes forward on their own queue pairs with one shared pool: every frame
/// comes out (or is counted missed), each process forwards its share, the pool ends whole.
#[test]
fn symmetric_mp_forwards_in_three_processes_with_one_pool() {
    symmetric_mp_forwards(&["--num-procs", "3"]);
    let bin = env!("CARGO_BIN_EXE_symmetric_mp");
    assert_usage_error(bin, &["--num-procs", "9"], "takes 1 to 8");
    assert_usage_error(bin, &["--device", "e1000"], "takes mana or mlx5");
    assert!(run_ok(bin, &["--help"]).contains("Usage: symmetric_mp"));
}

/// The same on mlx5 model ports.
#[test]
fn symmetric_mp_forwards_on_mlx5_ports() {
    symmetric_mp_forwards(&["--device", "mlx5", "--num-procs", "4"]);
    let bin = env!("CARGO_BIN_EXE_symmetric_mp");
    assert_usage_error(
        bin,
        &["--device", "mlx5", "--num-procs", "3"],
        "1, 2, 4 or 8",
    );
}

/// symmetric_mp with `args`: every frame out or counted, each process forwards a share,
/// the pool ends whole.
fn symmetric_mp_forwards(args: &[&str]) {
    let bin = env!("CARGO_BIN_EXE_symmetric_mp");
    let text = run_ok(bin, args);
    let procs: usize = args
        .iter()
        .skip_while(|a| **a != "--num-procs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("--num-procs given");
    assert!(text.contains(&format!("{procs} processes")), "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
    for q in 0..procs {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("queue pair {q} (")))
            .unwrap_or_else(|| panic!("no line for queue pair {q}: {text}"));
        let n: u64 = line
            .split(": ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(n > 0, "RSS gives every process a share: {line}");
    }
}
