//! Asynchronous events on the fake rdma-core: the world's knobs (`ports/N/fake_rdma_link`,
//! `fake_rdma_fatal`) raise `IBV_EVENT_PORT_ERR` / `PORT_ACTIVE` / `DEVICE_FATAL` (and close
//! the channel on a removal) on every context of the device, seen by a C program through
//! the real libibverbs API and by the unchanged l2fwd on two `mana:` ports: it logs a link
//! flap and keeps going, recovers from a device failure, and stops (after the ports'
//! recover timeout) on a removal.

use crate::common;
use crate::common::{bin, live_at_exit, text, Fake};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const PORT1: &str = "mana:dev=mana_0,port=1";
const PORT2: &str = "mana:dev=mana_0,port=2";

/// `async_events.c`, compiled once per test process against the real headers and libraries.
fn c_program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile_c("async_events", &["-pthread"], &["-libverbs"]))
}

/// The sysfs directory of `mana_0` in `fake`'s world (where the knobs live).
fn ibdev(fake: &Fake) -> PathBuf {
    fake.dir.path().join("sys/class/infiniband/mana_0")
}

#[test]
fn knobs_raise_async_events_as_libibverbs_delivers_them() {
    let fake = Fake::new(None);
    let o = fake
        .cmd(c_program())
        .arg(ibdev(&fake))
        .output()
        .expect("run async_events");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", text(&o));
    let lines: Vec<&str> = out.lines().collect();
    // IBV_EVENT_PORT_ACTIVE = 9, PORT_ERR = 10, DEVICE_FATAL = 8 (verbs.h); IBV_PORT_DOWN = 1,
    // IBV_PORT_ACTIVE = 4; physical state 3 = disabled, 5 = link up.
    assert_eq!(
        lines,
        [
            "idle: ret -1 Resource temporarily unavailable readable 0",
            "p1 down: event 10 port 1",
            "after fetch: readable 0",
            "port 1 state 1 phys 3",
            "port 2 state 4 phys 5",
            "p1 up: event 9 port 1",
            "port 1 state 4 phys 5",
            "p2 down: event 10 port 2",
            "fatal: event 8 port 0",
            "blocking: event 9 port 2",
            "other: 10/1 9/1 10/2 8/0 9/2 (then Resource temporarily unavailable)",
            "removed: readable 1, ret -1 Input/output error, still readable 1, again -1",
            "removed other: ret -1 Input/output error",
            "done",
        ],
        "{}",
        text(&o)
    );
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

#[test]
fn a_port_already_down_at_open_raises_no_event_and_queries_down() {
    let fake = Fake::new(None);
    std::fs::write(ibdev(&fake).join("ports/2/fake_rdma_link"), "down\n").unwrap();
    let o = fake
        .cmd(c_program())
        .arg(ibdev(&fake))
        .output()
        .expect("run async_events");
    // Port 2 starts down: taking it "down" again is no change, so the program's own
    // `p2 down` step finds no event.
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("port 2 state 1 phys 3"), "{}", text(&o));
    assert!(out.contains("p2 down: no event within 2 s"), "{}", text(&o));
}

/// Starts l2fwd on both ports of `mana_0` with `args`, returns the child and a channel of
/// its stderr lines, once both ports are set up (the fake's trace shows two
/// `ibv_create_qp_ex`, the RSS QPs, the last step): knob changes from then on are events for
/// both, and none lands in the middle of a bring-up. `--link-timeout 0`:
/// a link the test takes down while l2fwd is still starting must not hold it in its
/// wait for the links (it warns and forwards; the events are queued either way).
fn start_l2fwd(
    fake: &Fake,
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    start_l2fwd_on(fake, [PORT1, PORT2], args)
}

/// [`start_l2fwd`] on `ports`.
fn start_l2fwd_on(
    fake: &Fake,
    ports: [&str; 2],
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let trace = fake.dir.path().join(format!(
        "trace-{}.jsonl",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut c = fake.cmd(&bin("l2fwd"));
    c.args([
        "--port",
        ports[0],
        "--port",
        ports[1],
        "--stats-interval",
        "0",
    ])
    .args(["--link-timeout", "0"])
    .args(args)
    .env("FAKE_RDMA_TRACE", &trace)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run l2fwd");
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let t0 = Instant::now();
    loop {
        let opened = std::fs::read_to_string(&trace)
            .unwrap_or_default()
            .matches("\"call\":\"ibv_create_qp_ex\"")
            .count();
        if opened >= 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "l2fwd did not set up both ports"
        );
        if let Ok(Some(s)) = child.try_wait() {
            panic!("l2fwd exited early: {s}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, rx)
}

/// Waits for a stderr line ending with `what` (at most 5 s); all lines seen go to `seen`.
/// (The port events' lines end with the event; the start-up warning about a link found down,
/// `...): link down; not waiting ...`, does not.)
fn wait_line(rx: &std::sync::mpsc::Receiver<String>, what: &str, seen: &mut Vec<String>) {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(50)) {
            let hit = l.ends_with(what);
            seen.push(l);
            if hit {
                return;
            }
        }
    }
    panic!(
        "no stderr line with {what:?} within 5 s; saw:\n{}",
        seen.join("\n")
    );
}

/// Collects the rest of stderr and the exit status.
fn finish(
    mut child: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
    mut seen: Vec<String>,
) -> (Output, Vec<String>) {
    let status = child.wait().unwrap();
    let mut stdout = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    seen.extend(rx.iter());
    let o = Output {
        status,
        stdout,
        stderr: seen.join("\n").into_bytes(),
    };
    (o, seen)
}

#[test]
fn l2fwd_logs_a_link_flap_and_keeps_forwarding() {
    let fake = Fake::new(None);
    let (child, rx) = start_l2fwd(&fake, &["--duration", "2", "--json"]);
    let knob = ibdev(&fake).join("ports/1/fake_rdma_link");
    let mut seen = Vec::new();
    std::fs::write(&knob, "down\n").unwrap();
    wait_line(&rx, "): link down", &mut seen);
    std::fs::write(&knob, "up\n").unwrap();
    wait_line(&rx, "): link up", &mut seen);
    let t_flap = Instant::now();
    let (o, lines) = finish(child, rx, seen);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        t_flap.elapsed() > Duration::from_millis(100),
        "l2fwd ran on after the flap (until --duration)"
    );
    let events: Vec<&String> = lines
        .iter()
        .filter(|l| l.ends_with("): link down") || l.ends_with("): link up"))
        .collect();
    assert_eq!(
        events,
        [
            &format!("l2fwd: port 0 ({PORT1}): link down"),
            &format!("l2fwd: port 0 ({PORT1}): link up"),
        ],
        "only port 1 of the device flapped: {}",
        text(&o)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let report: serde_json::Value = serde_json::from_str(
        stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .expect("JSON report"),
    )
    .unwrap();
    let ev = report["events"].as_array().expect("events in the report");
    let got: Vec<(u64, &str)> = ev
        .iter()
        .map(|e| (e["port"].as_u64().unwrap(), e["event"].as_str().unwrap()))
        .collect();
    assert_eq!(got, [(0, "link_down"), (0, "link_up")], "{report}");
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

/// A fatal error the device comes back from at once (`1`: the device stays listed and new
/// contexts work): both ports of the device recover by themselves, l2fwd logs it and runs
/// to its end, exit 0, nothing left alive.
#[test]
fn l2fwd_recovers_both_ports_of_a_device_that_failed() {
    let fake = Fake::new(None);
    let (child, rx) = start_l2fwd(&fake, &["--duration", "3", "--json"]);
    std::fs::write(ibdev(&fake).join("fake_rdma_fatal"), "1\n").unwrap();
    let mut seen = Vec::new();
    wait_line(&rx, "): device fatal error", &mut seen);
    let (o, lines) = finish(child, rx, seen);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for (i, spec) in [PORT1, PORT2].iter().enumerate() {
        let at = |what: &str| {
            lines
                .iter()
                .position(|l| l.starts_with(&format!("l2fwd: port {i} ({spec}): {what}")))
                .unwrap_or_else(|| panic!("port {i}: no {what:?}: {}", text(&o)))
        };
        assert!(
            at("device fatal error") < at("recovering") && at("recovering") < at("recovered after"),
            "{}",
            text(&o)
        );
    }
    let report: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .expect("JSON report"),
    )
    .unwrap();
    assert_eq!(report["recoveries"], 2, "{report}");
    assert_eq!(report["pool_in_use"], 0, "{report}");
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

/// A device removed for good: both ports wait their recover-timeout (0.5 s), then l2fwd
/// stops, exit 1, saying what it waited for, and leaves nothing alive.
#[test]
fn l2fwd_stops_with_an_error_when_the_device_is_removed() {
    let fake = Fake::new(None);
    let ports = [
        format!("{PORT1},recover-timeout=0.5"),
        format!("{PORT2},recover-timeout=0.5"),
    ];
    let (child, rx) = start_l2fwd_on(&fake, [&ports[0], &ports[1]], &["--duration", "20"]);
    let t0 = Instant::now();
    std::fs::write(ibdev(&fake).join("fake_rdma_fatal"), "removed\n").unwrap();
    let (o, _) = finish(child, rx, Vec::new());
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "l2fwd stopped after the recover timeout, not at --duration: {:?}",
        t0.elapsed()
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    // DEVICE_FATAL, then the closed channel (EIO), then the recovery, in that order.
    let both = ports.iter().enumerate().any(|(i, spec)| {
        let fatal = err.find(&format!("l2fwd: port {i} ({spec}): device fatal error\n"));
        let removed = err.find(&format!("l2fwd: port {i} ({spec}): device removed\n"));
        let recovering = err.find(&format!("l2fwd: port {i} ({spec}): recovering"));
        fatal.is_some() && fatal < removed && removed < recovering
    });
    assert!(both, "{err}");
    assert!(
        err.contains("recovery failed")
            && err.contains("did not come back within")
            && err.contains(": stopping"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("l2fwd summary"),
        "the run still reports: {}",
        text(&o)
    );
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}
