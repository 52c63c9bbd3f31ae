//! The tools' telemetry socket from the outside, as separate processes on the device model:
//! DPDK's own `dpdk-telemetry.py` (Debian's `dpdk-dev`) and our `pmd-telemetry` read a
//! running l2fwd under pktgen's traffic, and their counters agree with l2fwd's final report;
//! malformed requests and misbehaving clients get `null` answers or are closed while l2fwd
//! forwards every frame; a live file prefix is refused with its pid, a killed one's socket
//! taken over.
//!
//! Every process of a test shares one runtime directory (`RUNTIME_DIRECTORY`) in a
//! temporary folder, each with a file prefix of its own.

use crate::support::{bin, json, stop, succeeded, Bg};
use pmd::telemetry::{Client, ClientError, SOCKET_NAME};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Debian's DPDK telemetry client.
const DPDK_TELEMETRY_PY: &str = "/usr/bin/dpdk-telemetry.py";

/// The basic counters `/ethdev/stats` and l2fwd's report share.
const BASIC: [&str; 8] = pmd::telemetry::ethdev::STATS;

/// Two cables, a runtime directory, and the tools on them.
struct Setup {
    dir: tempfile::TempDir,
    id: String,
}

impl Setup {
    fn new(tag: &str) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            id: format!("tel{tag}{}", std::process::id()),
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The file prefix of this test's tool `who`.
    fn prefix(&self, who: &str) -> String {
        format!("{}-{who}", self.id)
    }

    fn socket(&self, who: &str) -> PathBuf {
        self.run_dir()
            .join("dpdk")
            .join(self.prefix(who))
            .join(SOCKET_NAME)
    }

    /// `tool` with this test's runtime directory and cables' directory.
    fn cmd(&self, tool: &str) -> Command {
        let mut c = bin(tool);
        c.env("RUNTIME_DIRECTORY", self.run_dir())
            .env("PMD_SHM_DIR", self.dir.path());
        c
    }

    fn cables(&self, set: &str) -> [String; 2] {
        [
            format!("emu-mana:wire=shm:{}{set}a", self.id),
            format!("emu-mana:wire=shm:{}{set}b", self.id),
        ]
    }

    /// l2fwd on cable set `set`, file prefix `who`.
    fn l2fwd(&self, set: &str, who: &str, extra: &[&str]) -> Command {
        let [a, b] = self.cables(set);
        let mut c = self.cmd("l2fwd");
        c.args(["--port", &a, "--port", &b, "--lcores", "1", "--json"])
            .args(["--stats-interval", "0", "--ring-size", "1024"])
            .args(["--file-prefix", &self.prefix(who)])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// pktgen on cable set `set` sending `count` frames at `rate`, file prefix `pktgen`.
    fn pktgen(&self, set: &str, count: u64, rate: u64) -> Command {
        let [a, b] = self.cables(set);
        let mut c = self.cmd("pktgen");
        c.args(["--port", &a, "--port", &b, "--lcores", "0", "--json"])
            .args(["--count", &count.to_string(), "--rate", &rate.to_string()])
            .args(["--link-timeout", "60", "--drain-timeout", "30"])
            .args(["--file-prefix", &self.prefix("pktgen")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Waits until `who`'s telemetry socket answers (the tool has started).
    fn client(&self, who: &str) -> Client {
        let path = self.socket(who);
        let t0 = Instant::now();
        loop {
            match Client::connect(&path) {
                Ok(c) => return c,
                Err(e) => assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "{who}'s telemetry socket: {e}"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs DPDK's client with `lines` on stdin; its answers, one JSON document a line.
    fn dpdk_telemetry_py(&self, who: &str, lines: &str) -> Option<Vec<serde_json::Value>> {
        if !Path::new(DPDK_TELEMETRY_PY).exists() {
            assert!(
                std::env::var_os("PMD_REQUIRE_TOOLS").is_none(),
                "PMD_REQUIRE_TOOLS is set but {DPDK_TELEMETRY_PY} is missing (Debian's \
                 dpdk-dev; scripts/setup.sh installs it)"
            );
            eprintln!(
                "SKIPPED the dpdk-telemetry.py part: {DPDK_TELEMETRY_PY} is missing (apt-get \
                 install dpdk-dev)"
            );
            return None;
        }
        let mut c = Command::new(DPDK_TELEMETRY_PY)
            .args(["-f", &self.prefix(who)])
            .env("RUNTIME_DIRECTORY", self.run_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
        let o = c.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "dpdk-telemetry.py: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        Some(
            out.lines()
                .map(|l| {
                    serde_json::from_str(l)
                        .unwrap_or_else(|e| panic!("dpdk-telemetry.py printed {l:?}: {e}"))
                })
                .collect(),
        )
    }

    /// `pmd-telemetry --json ARGS` against `who`: its answers, one a line.
    fn pmd_telemetry(&self, who: &str, args: &[&str]) -> Vec<serde_json::Value> {
        let o = self
            .cmd("pmd-telemetry")
            .args(["--file-prefix", &self.prefix(who), "--json"])
            .args(args)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "pmd-telemetry {args:?}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The value under the answer's command.
fn data<'a>(answer: &'a serde_json::Value, cmd: &str) -> &'a serde_json::Value {
    answer
        .get(cmd)
        .unwrap_or_else(|| panic!("no {cmd} in {answer}"))
}

/// pktgen's run succeeded and lost nothing.
fn all_back(out: &Output, count: u64) -> serde_json::Value {
    let p = succeeded(out);
    assert_eq!(p["tx_packets"], count, "{p}");
    assert_eq!(p["rx_packets"], count, "{p}");
    assert_eq!(p["lost"], 0, "{p}");
    assert_eq!(p["pool_in_use"], 0, "{p}");
    p
}

/// l2fwd's final report after a run that lost nothing: every frame received was sent,
/// none dropped, the pool whole.
/// Waits for pktgen (in the background) to end, and checks that every frame came back.
fn pktgen_done(mut pg: Bg, count: u64) {
    let t0 = Instant::now();
    while pg.child().try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "pktgen still running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    all_back(&pg.0.take().unwrap().wait_with_output().unwrap(), count);
}

fn forwarded_everything(out: &Output, count: u64) -> serde_json::Value {
    assert!(
        out.status.success(),
        "l2fwd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l = json(&out.stdout);
    assert_eq!(l["rx_packets"], count, "{l}");
    assert_eq!(l["tx_packets"], count, "{l}");
    assert_eq!(l["dropped"], 0, "{l}");
    assert_eq!(l["device_drops"], 0, "{l}");
    assert_eq!(l["pool_in_use"], 0, "{l}");
    l
}

#[test]
fn dpdk_telemetry_py_and_pmd_telemetry_read_l2fwd_under_traffic() {
    let s = Setup::new("read");
    let l2 = Bg(Some(s.l2fwd("", "l2fwd", &[]).spawn().unwrap()));
    s.client("l2fwd");
    let count = 150_000;
    let pg = Bg(Some(s.pktgen("", count, 50_000).spawn().unwrap()));
    // Under traffic: counters that move.
    let c = s.client("l2fwd");
    let t0 = Instant::now();
    while c.request("/ethdev/stats,0").unwrap()["ipackets"].as_u64() < Some(1000) {
        assert!(t0.elapsed() < Duration::from_secs(60), "no traffic");
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(a) = s.dpdk_telemetry_py("l2fwd", "/ethdev/list\n/ethdev/stats,0\n") {
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(data(&a[0], "/ethdev/list"), &serde_json::json!([0, 1]));
        let st = data(&a[1], "/ethdev/stats");
        assert!(st["ipackets"].as_u64() > Some(0), "{st}");
        for k in BASIC {
            assert!(st[k].is_u64(), "{k} in {st}");
        }
        assert_eq!(st["q_ipackets"].as_array().unwrap().len(), 16);
    }
    let a = s.pmd_telemetry("l2fwd", &["/ethdev/stats", "1"]);
    assert!(data(&a[0], "/ethdev/stats")["opackets"].as_u64() > Some(0));
    // pktgen answers too, on its own prefix: what its cores counted.
    let lc = s.pmd_telemetry("pktgen", &["/pmd/lcores"]);
    let cores = data(&lc[0], "/pmd/lcores").as_array().unwrap().clone();
    assert_eq!(cores[0]["role"], "tx+rx", "{cores:?}");
    assert!(cores[0]["tx_packets"].as_u64() > Some(0), "{cores:?}");
    let l2_lcores = c.request("/pmd/lcores").unwrap();
    assert!(
        l2_lcores[0]["ports"][0]["rx"].as_u64() > Some(0),
        "{l2_lcores}"
    );
    // The traffic ends: the counters stand still, and are what l2fwd reports at the end.
    pktgen_done(pg, count);
    let ours: Vec<serde_json::Value> = (0..2)
        .map(|p| {
            let a = s.pmd_telemetry("l2fwd", &[&format!("/ethdev/stats,{p}")]);
            data(&a[0], "/ethdev/stats").clone()
        })
        .collect();
    let theirs = s.dpdk_telemetry_py("l2fwd", "/ethdev/stats,0\n/ethdev/stats,1\n");
    let pool = c.request("/pmd/pool").unwrap();
    let drops = c.request("/pmd/drops").unwrap();
    let ports = c.request("/pmd/ports").unwrap();
    drop(c);
    let l = forwarded_everything(&stop(l2), count);
    for p in 0..2 {
        let report = &l["ports"][p]["stats"];
        for k in BASIC {
            assert_eq!(
                ours[p][k], report[k],
                "port {p} {k}: {} vs {report}",
                ours[p]
            );
            if let Some(t) = &theirs {
                assert_eq!(data(&t[p], "/ethdev/stats")[k], report[k], "port {p} {k}");
            }
        }
        assert_eq!(
            ours[p]["q_ipackets"][0], report["rx_queues"][0]["packets"],
            "port {p}"
        );
        assert_eq!(drops[p]["tx"], 0, "{drops}");
        assert_eq!(ports[p]["state"], "started", "{ports}");
    }
    assert_eq!(ours[0]["ipackets"], count);
    assert_eq!(ours[1]["opackets"], count);
    assert_eq!(pool["name"], "l2fwd", "{pool}");
}

#[test]
fn malformed_requests_and_misbehaving_clients_leave_l2fwd_forwarding_everything() {
    let s = Setup::new("bad");
    let l2 = Bg(Some(s.l2fwd("", "l2fwd", &[]).spawn().unwrap()));
    let c = s.client("l2fwd");
    let count = 100_000;
    let pg = Bg(Some(s.pktgen("", count, 25_000).spawn().unwrap()));
    // A client that connects and never says or reads anything holds a slot, nothing more.
    let idle = s.client("l2fwd");
    let null = |req: &str, cmd: &str| {
        assert_eq!(
            c.request_raw(req).unwrap(),
            format!("{{\"{cmd}\":null}}"),
            "{req}"
        );
    };
    null("/nope", "/nope");
    null("/ethdev/stats,x", "/ethdev/stats");
    null("/ethdev/stats,99", "/ethdev/stats");
    null("/ethdev/stats,-1", "/ethdev/stats");
    null("/ethdev/stats", "/ethdev/stats");
    null("/ethdev/xstats,65535", "/ethdev/xstats");
    null("/help,/nope", "/help");
    null("/pmd/events,many", "/pmd/events");
    // Oversized input: the first 1023 bytes are read, the command is unknown.
    c.send_raw("a".repeat(2000).as_bytes()).unwrap();
    assert_eq!(
        c.recv_raw(16384).unwrap(),
        format!("{{\"{}\":null}}", "a".repeat(56))
    );
    c.send_raw(format!("/ethdev/stats,{}", "9".repeat(3000)).as_bytes())
        .unwrap();
    assert_eq!(c.recv_raw(16384).unwrap(), r#"{"/ethdev/stats":null}"#);
    // Garbage bytes: answered, as valid JSON.
    c.send_raw(&[0xff, b'"', b'\\', 0x01, b',']).unwrap();
    let odd = c.recv_raw(16384).unwrap();
    let v: serde_json::Value = serde_json::from_str(&odd).unwrap();
    assert!(
        v.as_object().unwrap().values().all(|x| x.is_null()),
        "{odd}"
    );
    assert_eq!(
        c.request("/ethdev/list").unwrap(),
        serde_json::json!([0, 1])
    );

    // A client that sends without ever reading its answers: closed once its answers fill
    // the socket and one waits a second, while others are answered meanwhile.
    let greedy = s.client("l2fwd");
    let t0 = Instant::now();
    let mut sent = 0u64;
    loop {
        match greedy.send_raw(b"/") {
            Ok(()) => sent += 1,
            Err(ClientError::Timeout { .. }) => {}
            Err(_) => break,
        }
        if sent.is_multiple_of(100) {
            let t = Instant::now();
            assert_eq!(
                c.request("/ethdev/list").unwrap(),
                serde_json::json!([0, 1])
            );
            assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "a client that does not read is still open after {sent} requests"
        );
    }
    drop(greedy);

    // 100 clients at once: as many as there are free slots (10 in all) are served, the
    // others closed at once; every slot comes back when they go.
    let mut served = Vec::new();
    let mut closed = 0;
    for _ in 0..100 {
        match Client::connect(&s.socket("l2fwd")) {
            Ok(x) => served.push(x),
            Err(ClientError::Closed { .. }) => closed += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        (1..=8).contains(&served.len()),
        "{} served, {closed} closed",
        served.len()
    );
    assert_eq!(served.len() + closed, 100);
    for x in &served {
        assert_eq!(x.request("/info").unwrap()["max_output_len"], 16384);
    }
    drop(served);
    drop(idle);
    let t0 = Instant::now();
    let many: Vec<Client> = loop {
        let got: Vec<Client> = (0..9)
            .filter_map(|_| Client::connect(&s.socket("l2fwd")).ok())
            .collect();
        if got.len() == 9 {
            break got;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "slots did not come back"
        );
        drop(got);
        std::thread::sleep(Duration::from_millis(100));
    };
    for x in &many {
        assert!(x.request("/ethdev/stats,0").unwrap()["ipackets"].is_u64());
    }
    drop(many);
    drop(c);

    pktgen_done(pg, count);
    forwarded_everything(&stop(l2), count);
}

#[test]
fn a_live_prefix_is_refused_with_its_pid_and_a_killed_ones_socket_is_taken_over() {
    let s = Setup::new("own");
    let mut first = Bg(Some(
        s.l2fwd("1", "x", &["--link-timeout", "0"]).spawn().unwrap(),
    ));
    let pid = first.child().id();
    s.client("x");
    // The same prefix again: refused before any port opens, naming the owner.
    let o = s
        .l2fwd("2", "x", &["--link-timeout", "0", "--duration", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in [
        format!("pid {pid} (l2fwd)"),
        "--file-prefix".into(),
        "--no-telemetry".into(),
    ] {
        assert!(err.contains(&want), "{want:?} in {err}");
    }
    // --no-telemetry runs beside it.
    let o = s
        .l2fwd(
            "2",
            "x",
            &["--link-timeout", "0", "--duration", "0.5", "--no-telemetry"],
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // pmd-telemetry lists it, with its pid and program.
    let o = s.cmd("pmd-telemetry").arg("--list").output().unwrap();
    let list = String::from_utf8_lossy(&o.stdout);
    let line = list
        .lines()
        .find(|l| l.starts_with(&s.prefix("x")))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        line.contains(&pid.to_string()) && line.contains("l2fwd"),
        "{list}"
    );
    // Killed: its socket file stays behind, nobody listening.
    first.child().kill().unwrap();
    first.child().wait().unwrap();
    first.0 = None;
    assert!(s.socket("x").exists());
    let o = s
        .cmd("pmd-telemetry")
        .args(["--file-prefix", &s.prefix("x"), "/info"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("nothing listens there"), "{err}");
    // The next one with that prefix takes the file over.
    let mut next = Bg(Some(
        s.l2fwd("3", "x", &["--link-timeout", "0"]).spawn().unwrap(),
    ));
    let c = s.client("x");
    assert_eq!(c.greeting().pid, next.child().id());
    drop(c);
    let o = stop(next);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!s.socket("x").exists(), "removed at exit");
}

#[test]
fn pmd_telemetry_says_what_is_wrong_and_what_runs() {
    let s = Setup::new("cli");
    let o = s
        .cmd("pmd-telemetry")
        .args(["--file-prefix", "nobody-here", "/info"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no instance with file prefix \"nobody-here\""),
        "{err}"
    );
    assert!(err.contains("no instance is running"), "{err}");
    let l2 = Bg(Some(
        s.l2fwd("", "l2fwd", &["--link-timeout", "0"])
            .spawn()
            .unwrap(),
    ));
    s.client("l2fwd");
    let o = s
        .cmd("pmd-telemetry")
        .args(["--file-prefix", "nobody-here", "/info"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("--file-prefix {}", s.prefix("l2fwd"))),
        "{err}"
    );
    // A null answer: status 1 and why.
    let o = s
        .cmd("pmd-telemetry")
        .args(["--file-prefix", &s.prefix("l2fwd"), "/ethdev/stats", "7"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad parameter"));
    // Interactive: commands from stdin, human output; the stats as a table.
    let mut c = s
        .cmd("pmd-telemetry")
        .args(["--file-prefix", &s.prefix("l2fwd")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(b"/ethdev/stats,0\nethdev/link_status 1\n/help /pmd/events\nquit\n/info\n")
        .unwrap();
    let o = c.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("ipackets") && out.contains("q_ipackets"),
        "{out}"
    );
    // No peer on the cables: the link is down.
    assert!(out.contains("\"status\": \"DOWN\""), "{out}");
    assert!(out.contains("\"/pmd/events\": \"The port events"), "{out}");
    assert!(!out.contains("max_output_len"), "stopped at quit: {out}");
    // --watch: the same answer again, one JSON line each with --json.
    let t0 = Instant::now();
    let mut w = s
        .cmd("pmd-telemetry")
        .args([
            "--file-prefix",
            &s.prefix("l2fwd"),
            "--json",
            "--watch",
            "0.2",
        ])
        .arg("/ethdev/list")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(900));
    let o = stop(l2);
    assert!(o.status.success());
    let t = Instant::now();
    while w.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "--watch did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = w.wait_with_output().unwrap();
    assert!(out.status.success(), "the instance went away: a normal end");
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert!(lines.len() >= 3, "{lines:?} in {:?}", t0.elapsed());
    // The last may have come as l2fwd stopped answering (null).
    let (last, before) = lines.split_last().unwrap();
    assert!(
        before.iter().all(|l| *l == r#"{"/ethdev/list":[0,1]}"#),
        "{lines:?}"
    );
    assert!(last.starts_with(r#"{"/ethdev/list":"#), "{lines:?}");
}
