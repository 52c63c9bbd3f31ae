//! How the tools stop: `--json` runs say when they are ready (so scripts need no sleep), and
//! a second stop signal never skips the cleanup: the report is printed, the exit status is 0
//! and no cable file is left behind.

use crate::support;
use crate::support::spawn_with_lines as spawn;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The tool `name`, logging warnings too.
fn bin(name: &str) -> Command {
    let mut c = support::bin(name);
    c.env("PMD_LOG", "warn");
    c
}

/// Lines until one contains `want` (returned with everything before it), or panics after
/// `limit`.
fn wait_for(rx: &mpsc::Receiver<String>, want: &str, limit: Duration) -> Vec<String> {
    let end = Instant::now() + limit;
    let mut seen = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = l.contains(want);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!("no line with {want:?} within {limit:?}: {seen:#?}");
}

/// Waits for `child` (at most 30 s) and returns its status, stdout and the rest of stderr,
/// read to its end (the pipe closes when the tool, and whatever it started, has gone).
fn finish(
    mut child: Child,
    rx: &mpsc::Receiver<String>,
) -> (std::process::ExitStatus, String, String) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => err.push(l),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("stderr still open 30 s after the tool exited: {err:#?}")
            }
        }
    }
    (status, out, err.join("\n"))
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn signal(child: &Child, sig: i32) {
    pmd::sys::net::send_signal(child.id(), sig).unwrap();
}

/// l2fwd announces readiness once its ports are up, and two quick stop signals still end it
/// cleanly: exit 0, its summary on stdout, the second signal said, no cable file left.
#[test]
fn l2fwd_ready_then_two_signals_still_clean_up() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("sig{}", std::process::id());
    let mut c = bin("l2fwd");
    c.args(["--port", &format!("emu-mana:wire=shm:{id}a")])
        .args(["--port", &format!("emu-mana:wire=shm:{id}b")])
        .args(["--lcores", "0", "--json", "--link-timeout", "0.1"])
        .env("PMD_SHM_DIR", dir.path());
    let (child, rx) = spawn(c);
    let before = wait_for(&rx, r#""event":"ready""#, Duration::from_secs(20));
    let ready: serde_json::Value = serde_json::from_str(before.last().unwrap()).unwrap();
    assert_eq!(ready["tool"], "l2fwd");
    assert_eq!(ready["pid"], child.id());
    assert_eq!(ready["ports"].as_array().unwrap().len(), 2);
    assert_eq!(
        ready["ports"][0]["spec"],
        format!("emu-mana:wire=shm:{id}a")
    );
    assert!(
        !files_in(dir.path()).is_empty(),
        "the cables exist while it runs"
    );
    signal(&child, pmd::sys::net::SIGINT);
    signal(&child, pmd::sys::net::SIGTERM);
    let (status, out, err) = finish(child, &rx);
    assert!(status.success(), "{status}: {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["dropped"], 0, "{out}");
    assert_eq!(files_in(dir.path()), Vec::<String>::new(), "{err}");
}

/// pktgen too: ready, then two signals while it waits for its `--run` child (up to
/// `--drain-timeout` 60 s after the first): the second kills the child at once, and pktgen
/// still reports and exits 0.
#[test]
fn pktgen_ready_then_two_signals_still_report() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("sgp{}", std::process::id());
    let mut c = bin("pktgen");
    c.args(["--port", &format!("emu-mana:wire=loop:{id}")])
        .args(["--port", &format!("emu-mana:wire=loop:{id}")])
        .args([
            "--lcores",
            "0",
            "--json",
            "--rate",
            "1000",
            "--duration",
            "60",
        ])
        .args(["--run", "exec sleep 60", "--drain-timeout", "60"])
        .env("PMD_SHM_DIR", dir.path());
    let (child, rx) = spawn(c);
    wait_for(&rx, r#""event":"ready""#, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, pmd::sys::net::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, pmd::sys::net::SIGINT);
    let (status, out, err) = finish(child, &rx);
    assert!(status.success(), "{status}: {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(summary["tx_packets"].as_u64().unwrap() > 0, "{out}");
    assert!(err.contains("second stop signal (SIGINT)"), "{err}");
    assert!(err.contains("still running: killed"), "{err}");
}

/// Latency across processes: a receiving pktgen started 2 s before the sender measures the
/// frames' flight time, not the time between the two processes' starts (both stamp and read
/// the machine's monotonic clock).
#[test]
fn latency_across_processes_uses_one_clock() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("lat{}", std::process::id());
    let a = format!("emu-mana:wire=shm:{id}");
    let mut rx = bin("pktgen");
    rx.args(["--port", &a, "--rx-only", "--duration", "6", "--json"])
        .args(["--lcores", "0", "--link-timeout", "20"])
        .env("PMD_SHM_DIR", dir.path());
    let (rx_child, rx_lines) = spawn(rx);
    std::thread::sleep(Duration::from_secs(2));
    let tx = bin("pktgen")
        .args(["--port", &a, "--count", "2000", "--rate", "2000", "--json"])
        .args([
            "--lcores",
            "0",
            "--link-timeout",
            "20",
            "--drain-timeout",
            "0",
        ])
        .env("PMD_SHM_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        tx.status.success(),
        "{}",
        String::from_utf8_lossy(&tx.stderr)
    );
    let (status, out, err) = finish(rx_child, &rx_lines);
    assert!(status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["rx_packets"], 2000, "{out}");
    let p50 = j["latency_ns"]["p50"].as_u64().unwrap();
    // With a clock per process the p50 would be the 2 s between the starts.
    assert!(p50 > 0 && p50 < 1_000_000_000, "p50 {p50} ns: {out}");
}

/// A stop signal during the drain (sending is over, pktgen waits for frames that will never
/// come back) ends the wait at once: the report comes, the missing frames counted lost.
#[test]
fn pktgen_signal_during_the_drain_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let id = format!("sgd{}", std::process::id());
    let mut c = bin("pktgen");
    // Nobody at the far end of the cable: nothing comes back, and with a drain timeout of
    // 400 s pktgen would wait 100 s for progress.
    c.args(["--port", &format!("emu-mana:wire=shm:{id}")])
        .args(["--lcores", "0", "--json", "--link-timeout", "0"])
        .args(["--count", "100", "--drain-timeout", "400"])
        .env("PMD_SHM_DIR", dir.path());
    let (child, rx) = spawn(c);
    wait_for(&rx, r#""event":"ready""#, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, pmd::sys::net::SIGINT);
    let (status, out, err) = finish(child, &rx);
    assert!(status.success(), "{status}: {err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["tx_packets"], 100, "{out}");
    assert_eq!(summary["lost"], 100, "{out}");
    assert_eq!(files_in(dir.path()), Vec::<String>::new(), "{err}");
}
