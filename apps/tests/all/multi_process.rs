//! l2fwd as a multi-process dataplane on device-model ports: a primary that polls queue pair
//! 0 of each port and exports pair 1, a secondary (`--proc-type secondary`) that forwards on
//! it, and pktgen on the far ends of the cables. Every frame is forwarded by one of them;
//! the pool ends whole when the secondary leaves cleanly; a secondary killed mid-run is
//! replaced by a new one, which the primary's rebuilt queues serve, and what it had posted
//! comes back to the pool once they are rebuilt.

use crate::support::{self, json, succeeded, Bg};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// `tool` with its cables in `dir` and its runtime directory (control socket, pool, queue
/// descriptions) `dir/run`, which primary and secondary share.
fn tool(name: &str, dir: &Path) -> Command {
    let mut c = support::bin(name);
    c.env("PMD_SHM_DIR", dir)
        .env("RUNTIME_DIRECTORY", dir.join("run"));
    c
}

fn primary(dir: &Path, extra: &[&str]) -> Command {
    let mut c = tool("l2fwd", dir);
    c.args([
        "--proc-type",
        "primary",
        "--file-prefix",
        "mp",
        "--port",
        "emu-mana:wire=shm:c0,engine=thread",
        "--port",
        "emu-mana:wire=shm:c1,engine=thread",
        "--lcores",
        "0",
        "--stats-interval",
        "0",
        "--link-timeout",
        "0",
        "--ring-size",
        "256",
        "--json",
    ])
    .args(extra);
    c
}

fn secondary(dir: &Path) -> Command {
    let mut c = tool("l2fwd", dir);
    c.args([
        "--proc-type",
        "secondary",
        "--file-prefix",
        "mp",
        "--lcores",
        "1",
        "--json",
    ]);
    c
}

/// pktgen on the cables' far ends: `count` frames of 64 flows at `rate` per second.
fn pktgen(dir: &Path, count: u32, rate: u32) -> Command {
    let mut c = tool("pktgen", dir);
    c.args([
        "--port",
        "emu-mana:wire=shm:c0",
        "--port",
        "emu-mana:wire=shm:c1",
        "--flows",
        "64",
        "--lcores",
        "0",
        "--json",
        "--link-timeout",
        "10",
    ])
    .args(["--count", &count.to_string(), "--rate", &rate.to_string()]);
    c
}

/// A background tool and its stderr lines.
fn spawn(c: Command) -> (Bg, Receiver<String>) {
    let (child, lines) = support::spawn_with_lines(c);
    (Bg(Some(child)), lines)
}

/// Waits (at most a minute) for a stderr line containing `what`; returns it.
fn wait_for(lines: &Receiver<String>, what: &str) -> String {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(100)) {
            if l.contains(what) {
                return l;
            }
            seen.push(l);
        }
    }
    panic!("no '{what}' on stderr: {seen:#?}");
}

#[test]
fn a_secondary_forwards_its_queue_pairs_and_the_pool_ends_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (pri, pri_err) = spawn(primary(dir.path(), &[]));
    wait_for(&pri_err, "queue pair(s) of every port for secondaries");
    // Pair 0 is the primary's own; a list for three ports when there are two is refused.
    for (queues, why) in [
        ("0", "the primary polls that queue itself"),
        ("1,1,1", "one for each of the 2 ports"),
    ] {
        let out = secondary(dir.path())
            .args(["--queues", queues])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "--queues {queues}: {err}");
    }
    // The pair named, of both ports.
    let mut named = secondary(dir.path());
    named.args(["--queues", "1"]);
    let (sec, _sec_err) = spawn(named);
    wait_for(&pri_err, "polls port 1 queue pair 1");

    let gen = succeeded(&pktgen(dir.path(), 20_000, 20_000).output().unwrap());
    assert_eq!(gen["rx_packets"], gen["tx_packets"], "nothing lost: {gen}");

    // The secondary leaves cleanly: it gives its pairs back, the primary rebuilds them,
    // and what it had posted comes back to the pool.
    let s = succeeded(&support::stop(sec));
    assert_eq!(s["buffers_returned"], true, "{s}");
    wait_for(&pri_err, "gave back port 1 queue pair 1");
    let p = succeeded(&support::stop(pri));
    assert_eq!(p["pool_in_use"], 0, "{p}");
    // The two refused attempts attached (and left) before they asked for their pairs.
    assert_eq!(p["secondaries"]["attached"], 3, "{p}");
    assert_eq!(p["secondaries"]["killed"], 0, "{p}");
    let there: u64 = s["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["rx_packets"].as_u64().unwrap())
        .sum();
    let here = p["rx_packets"].as_u64().unwrap();
    assert!(
        there > 0 && here > 0,
        "RSS spreads the flows: {here} here, {there} there"
    );
    assert_eq!(
        here + there,
        gen["tx_packets"].as_u64().unwrap(),
        "every frame forwarded by one of the two processes"
    );
    // The primary's port counters count the secondary's queue pair too.
    for (k, port) in p["ports"].as_array().unwrap().iter().enumerate() {
        let st = &port["stats"];
        let theirs = &s["ports"][k];
        assert_eq!(
            st["rx_queues"][1]["packets"], theirs["rx_packets"],
            "port {k}: {st}"
        );
        assert_eq!(
            st["tx_queues"][1]["packets"], theirs["tx_packets"],
            "port {k}: {st}"
        );
        assert_eq!(
            st["ipackets"].as_u64().unwrap(),
            st["rx_queues"][0]["packets"].as_u64().unwrap()
                + theirs["rx_packets"].as_u64().unwrap(),
            "port {k}: {st}"
        );
    }
}

#[test]
fn a_killed_secondary_is_replaced_by_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let (pri, pri_err) = spawn(primary(dir.path(), &[]));
    wait_for(&pri_err, "queue pair(s) of every port for secondaries");
    let (mut first, _) = spawn(secondary(dir.path()));
    wait_for(&pri_err, "polls port 1 queue pair 1");
    let (mut gen, _) = spawn(pktgen(dir.path(), 1_000_000, 5_000));
    std::thread::sleep(Duration::from_secs(1));
    first.child().kill().unwrap();
    first.child().wait().unwrap();
    wait_for(&pri_err, "without a goodbye");

    // A new worker takes the pairs over, once the primary has rebuilt them.
    let (second, second_err) = spawn(secondary(dir.path()));
    wait_for(&second_err, "port 1 queue pair 1");
    std::thread::sleep(Duration::from_secs(1));
    let s = succeeded(&support::stop(second));
    let forwarded: u64 = s["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["tx_packets"].as_u64().unwrap())
        .sum();
    assert!(forwarded > 0, "the new secondary forwards: {s}");
    assert_eq!(s["buffers_returned"], true, "{s}");
    gen.child().kill().unwrap();
    drop(gen);

    let out = support::stop(pri);
    let p = json(&out.stdout);
    assert_eq!(p["secondaries"]["attached"], 2, "{p}");
    assert_eq!(p["secondaries"]["killed"], 1, "{p}");
    // The killed one's posted buffers (its two RX rings of 256, and what it had in
    // flight) come back once the primary rebuilt its pairs: each mbuf in use is tagged
    // with the process that took it. The pool ends whole.
    let held = p["secondaries"]["reclaimed_held_mbufs"].as_u64().unwrap();
    // Its two RX rings, less what it had taken and not replaced yet (refills go in 32s).
    assert!(held >= 2 * (256 - 32), "{p}");
    assert_eq!(p["pool_in_use"], 0, "{p}");
    assert!(out.status.success(), "{p}");
    wait_for(&pri_err, "had posted or in flight back to pool");
}

#[test]
fn bad_multi_process_command_lines_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    // No primary with that prefix.
    let out = secondary(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("start the primary first"), "{err}");
    // A secondary with ports.
    let out = secondary(dir.path())
        .args(["--port", "null"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("leave --port out"), "{err}");
    // A device model on the polling threads cannot serve another process.
    let out = tool("l2fwd", dir.path())
        .args([
            "--proc-type",
            "primary",
            "--file-prefix",
            "mp2",
            "--port",
            "emu-mana:wire=none,engine=inline",
            "--port",
            "emu-mana:wire=none,engine=inline",
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("engine=thread"), "{err}");
    // --queues is a secondary's.
    let out = primary(dir.path(), &["--queues", "1"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--queues is for --proc-type secondary"),
        "{err}"
    );
}
