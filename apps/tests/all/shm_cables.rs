//! The tools on shared-memory cables whose far end is missing, late or replaced: a port
//! whose link is down is reported at once, pairing later brings the link up and traffic
//! flows, and frames sent while nobody was at the far end are discarded by the end that
//! attaches later and counted there (`wire_rx_stale`), never delivered. Nothing here is
//! timed: each step waits for what the tools print.

use crate::support;
use crate::support::{json, succeeded};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The tool `name` with its cable files in `dir`.
fn bin(name: &str, dir: &std::path::Path) -> Command {
    let mut c = support::bin(name);
    c.env("PMD_SHM_DIR", dir);
    c
}

/// A tool in the background whose stderr is read as it comes: killed and reaped if the test
/// ends without stopping it.
struct Bg {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Bg {
    fn spawn(c: Command) -> Self {
        let (child, lines) = support::spawn_with_lines(c);
        Self {
            child: Some(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most a minute) for a stderr line that contains `what`.
    fn wait_for(&mut self, what: &str) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push(l);
                if self.seen.last().unwrap().contains(what) {
                    return;
                }
            }
        }
        panic!("no '{what}' on stderr: {:#?}", self.seen);
    }

    /// Stops it with SIGINT (as Ctrl-C); its exit status, stdout and all of its stderr.
    fn stop(mut self) -> (std::process::ExitStatus, Vec<u8>, String) {
        let child = self.child.take().unwrap();
        pmd::sys::net::send_signal(child.id(), pmd::sys::net::SIGINT).unwrap();
        let out = child.wait_with_output().unwrap();
        self.seen.extend(self.lines.try_iter());
        // The reader thread ends with the pipe: take what it still had.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        (out.status, out.stdout, self.seen.join("\n"))
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// l2fwd on two cables nobody is at the far end of: it says at once that each port's link
/// is down, and after `--link-wait` that it forwards anyway; a pktgen that attaches later
/// brings both links up and every frame makes the round trip.
#[test]
fn l2fwd_on_unpaired_ports_warns_then_forwards_once_paired() {
    let dir = tempfile::tempdir().unwrap();
    let id = std::process::id();
    let (a, b) = (
        format!("emu-mana:wire=shm:late{id}a"),
        format!("emu-mana:wire=shm:late{id}b"),
    );
    let mut l2 = bin("l2fwd", dir.path());
    l2.args(["--port", &a, "--port", &b, "--lcores", "1", "--json"])
        .args(["--link-wait", "0.3"]);
    let mut l2 = Bg::spawn(l2);
    l2.wait_for("forwarding with a link down");
    for (p, spec) in [(0, &a), (1, &b)] {
        let want = format!(
            "l2fwd: warning: port {p} ({spec}): link down; waiting up to 0.3 s for it (--link-timeout)"
        );
        assert!(l2.seen.iter().any(|l| l == &want), "{:#?}", l2.seen);
    }
    let out = bin("pktgen", dir.path())
        .args(["--port", &a, "--port", &b, "--lcores", "0", "--json"])
        .args(["--count", "2000", "--rate", "20000", "--link-timeout", "60"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pktgen: {err}");
    assert!(!err.contains("link down"), "l2fwd is there: {err}");
    let p = json(&out.stdout);
    assert_eq!(p["rx_packets"], 2000, "{p}");
    assert_eq!(p["lost"], 0, "{p}");
    let (status, stdout, err) = l2.stop();
    assert!(status.success(), "{err}");
    let j = json(&stdout);
    assert_eq!(j["rx_packets"], 2000, "{j}");
    for port in 0..2 {
        let ups = j["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["port"] == port && e["event"] == "link_up")
            .count();
        assert_eq!(
            ups, 1,
            "port {port}'s link came up when pktgen attached: {j}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no cable file left"
    );
}

/// pktgen told not to wait (`--link-timeout 0`) warns and sends 200 frames into a cable
/// nobody is at; a receiver that attaches afterwards gets none of them and counts all 200
/// as `wire_rx_stale`, which its report lists with the losses.
#[test]
fn frames_sent_before_the_peer_attached_are_discarded_and_counted_there() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("emu-mana:wire=shm:stale{}", std::process::id());
    let mut tx = bin("pktgen", dir.path());
    tx.args(["--port", &spec, "--lcores", "0", "--link-timeout", "0"])
        .args([
            "--count",
            "200",
            "--rate",
            "100000",
            "--stats-interval",
            "0.1",
        ])
        .args(["--drain-timeout", "600"]);
    let mut tx = Bg::spawn(tx);
    tx.wait_for("sent 200 ");
    let want =
        format!("pktgen: warning: port 0 ({spec}): link down; not waiting (--link-timeout 0)");
    assert!(tx.seen.iter().any(|l| l == &want), "{:#?}", tx.seen);
    let out = bin("pktgen", dir.path())
        .args([
            "--port",
            &spec,
            "--lcores",
            "0",
            "--rx-only",
            "--duration",
            "0.5",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("received 0 "), "{text}");
    assert!(text.contains("port 0 losses: wire_rx_stale 200"), "{text}");
    // The sender is killed (it would wait for its frames to come back): its cable file
    // stays, with a dead owner.
    let mut sender = tx.child.take().unwrap();
    sender.kill().unwrap();
    sender.wait().unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // The next run takes the stale file over (nothing stale is left in it: the first
    // receiver discarded it all) and, the last end out, removes it.
    let out = bin("pktgen", dir.path())
        .args(["--port", &spec, "--lcores", "0", "--rx-only"])
        .args(["--duration", "0.5", "--json", "--link-timeout", "0"])
        .output()
        .unwrap();
    let j = succeeded(&out);
    assert_eq!(j["rx_packets"], 0, "{j}");
    assert_eq!(j["ports"][0]["xstats"]["wire_rx_stale"], 0, "{j}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no cable file left"
    );
}
