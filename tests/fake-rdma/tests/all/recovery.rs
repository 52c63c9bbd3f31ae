//! Azure host servicing, end to end, on the fake rdma-core: the unchanged l2fwd forwards
//! between two `mana:` ports (on two devices) while pktgen sends through them from
//! device-model ports on the far ends of their wires; one device goes through a service
//! reset (`service SECONDS` on its fatal knob: DEVICE_FATAL, the contexts disassociated, the
//! device gone from the device list and sysfs, then back). l2fwd recovers the port by itself
//! and goes on forwarding; every frame is received or counted as lost; nothing is left alive.
//! And a device that does not come back fails the port after `recover-timeout`.

use crate::common;
use crate::common::serial;
use crate::common::{bin, live_at_exit, text, Fake};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The fatal knob of device `dev` in `fake`'s world.
fn knob(fake: &Fake, dev: &str) -> PathBuf {
    fake.dir
        .path()
        .join(format!("sys/class/infiniband/{dev}/fake_rdma_fatal"))
}

fn json_of(o: &Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON report: {}", text(o)));
    serde_json::from_str(line).unwrap()
}

/// Starts `c` (a tool run with `--json`, stdout and stderr piped) and waits until it says
/// it is ready (its `{"event":"ready",..}` line on stderr): its ports are set up, so a knob
/// written from now on never lands in the middle of a bring-up. Returns the child and the
/// stderr lines (the rest arrive in [`finish`]).
fn spawn_ready(c: &mut Command) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = c.spawn().expect("start the tool");
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(err)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let (fwd_tx, fwd_rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => {
                let ready = l.contains("\"event\":\"ready\"");
                fwd_tx.send(l).unwrap();
                if ready {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => panic!("the tool ended before it was ready"),
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not ready in 30 s");
    }
    // The lines after it: forwarded by a second thread, so the first keeps draining stderr.
    std::thread::spawn(move || {
        for l in rx {
            if fwd_tx.send(l).is_err() {
                break;
            }
        }
    });
    (child, fwd_rx)
}

/// Waits for `child` and puts together its output (stderr from `lines`).
fn finish(child: std::process::Child, lines: std::sync::mpsc::Receiver<String>) -> Output {
    let mut o = child.wait_with_output().expect("wait");
    let err: Vec<String> = lines.iter().collect();
    o.stderr = (err.join("\n") + "\n").into_bytes();
    o
}

/// What one serviced run showed.
struct Run {
    l2fwd: Output,
    pktgen: Output,
}

/// The production path at rate: the device model behind the fake's queues runs on the
/// polling thread (the verbs provider's kicks, `sys::fake_kick`), so the unchanged l2fwd
/// forwards every one of 200,000 frames at 100 kpps on `FAMILY:` ports over the fake, with
/// no engine thread of the fake left running.
fn at_rate(family: &str) {
    let r = serviced_run(family, 200_000, 100_000, 0.0, Duration::ZERO);
    let ctx = format!(
        "--- pktgen\n{}\n--- l2fwd\n{}",
        text(&r.pktgen),
        text(&r.l2fwd)
    );
    assert_eq!(r.l2fwd.status.code(), Some(0), "{ctx}");
    let (lj, pj) = (json_of(&r.l2fwd), json_of(&r.pktgen));
    assert_eq!(pj["tx_packets"], 200_000, "{ctx}");
    assert_eq!(pj["rx_packets"], 200_000, "{ctx}");
    assert_eq!(pj["lost"], 0, "{ctx}");
    assert_eq!(lj["dropped"], 0, "{ctx}");
    assert_eq!(lj["pool_in_use"], 0, "{ctx}");
    assert_eq!(live_at_exit(&r.l2fwd), Some(0), "{ctx}");
}

#[test]
fn l2fwd_on_mana_ports_over_the_fake_forwards_every_frame_at_100_kpps() {
    at_rate("mana");
}

#[test]
fn l2fwd_on_mlx5_ports_over_the_fake_forwards_every_frame_at_100_kpps() {
    at_rate("mlx5");
}

/// pktgen (device-model ports, `emu-FAMILY`) sends `frames` at `rate` through l2fwd on two
/// `FAMILY:` ports over the fake, one per device (`FAMILY_0`, `FAMILY_1`), each on a shm
/// wire to pktgen; `after` the traffic starts, `FAMILY_0` is serviced for `service_s` (0: not).
fn serviced_run(family: &str, frames: u64, rate: u64, service_s: f64, after: Duration) -> Run {
    let tag = format!("rv{family}{}", std::process::id());
    let world = format!(
        "{family}_0/1:mac=02:00:00:00:10:01,wire=shm:{tag}-1;{family}_1/1:mac=02:00:00:00:10:02,wire=shm:{tag}-2"
    );
    let ports = [
        format!("{family}:dev={family}_0"),
        format!("{family}:dev={family}_1"),
    ];
    let emu = [
        format!("emu-{family}:wire=shm:{tag}-1"),
        format!("emu-{family}:wire=shm:{tag}-2"),
    ];
    let dev = format!("{family}_0");
    let value = format!("service {service_s}");
    let _one = serial();
    let fake = Fake::new(Some(&world));
    let shm = fake.shm_dir();
    let mut l2 = fake.cmd(&bin("l2fwd"));
    l2.args(["--port", &ports[0], "--port", &ports[1]])
        .args(["--duration", "120", "--stats-interval", "0", "--json"])
        .env("PMD_LOG", "pmd::verbs=debug,pmd::port=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (l2, l2_err) = spawn_ready(&mut l2);
    let mut pg = Command::new(bin("pktgen"));
    integration_tests::own_runtime_dir(&mut pg);
    pg.args(["--port", &emu[0], "--port", &emu[1]])
        .args(["--count", &frames.to_string(), "--rate", &rate.to_string()])
        .args(["--json", "--link-timeout", "30", "--drain-timeout", "3"])
        .env("PMD_SHM_DIR", &shm)
        .env_remove("PMD_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (pg, pg_err) = spawn_ready(&mut pg);
    // The traffic starts now; the reset comes `after` that.
    let t0 = Instant::now();
    if service_s > 0.0 {
        std::thread::sleep(after);
        std::fs::write(knob(&fake, &dev), format!("{value}\n")).unwrap();
    }
    let p = finish(pg, pg_err);
    common::interrupt(l2.id());
    let l = finish(l2, l2_err);
    assert!(
        t0.elapsed() < Duration::from_secs(100),
        "runs ended in time"
    );
    Run {
        l2fwd: l,
        pktgen: p,
    }
}

fn check_recovered(r: &Run, frames: u64, rate: u64, service_s: f64) {
    let ctx = format!(
        "--- pktgen\n{}\n--- l2fwd\n{}",
        text(&r.pktgen),
        text(&r.l2fwd)
    );
    assert_eq!(
        r.l2fwd.status.code(),
        Some(0),
        "l2fwd recovered and exits 0: {ctx}"
    );
    let lj = json_of(&r.l2fwd);
    let pj = json_of(&r.pktgen);
    // The port went through the whole cycle, and told when.
    let ev: Vec<(u64, &str)> = lj["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["port"].as_u64().unwrap(), e["event"].as_str().unwrap()))
        .filter(|(_, e)| *e != "link_down" && *e != "link_up")
        .collect();
    // The kernel raises DEVICE_FATAL, then closes the context's event channel (removed).
    assert_eq!(
        ev,
        [
            (0, "device_fatal"),
            (0, "device_removed"),
            (0, "recovering"),
            (0, "recovered")
        ],
        "{ctx}"
    );
    let downtime = lj["events"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["downtime_s"].as_f64())
        .expect("downtime");
    assert!(
        downtime >= service_s * 0.9 && downtime < service_s + 5.0,
        "downtime {downtime} for a {service_s} s service: {ctx}"
    );
    assert_eq!(lj["ports"][0]["recoveries"], 1, "{ctx}");
    assert_eq!(lj["pool_in_use"], 0, "{ctx}");
    // Every frame pktgen sent came back or is counted lost; the loss is the gap's, no more.
    let (tx, rx, lost) = (
        pj["tx_packets"].as_u64().unwrap(),
        pj["rx_packets"].as_u64().unwrap(),
        pj["lost"].as_u64().unwrap(),
    );
    assert_eq!(tx, frames, "{ctx}");
    assert_eq!(rx + lost, tx, "{ctx}");
    let gap_frames = ((service_s + 2.0) * rate as f64) as u64;
    assert!(
        lost > 0 && lost <= gap_frames,
        "lost {lost} (at most {gap_frames}): {ctx}"
    );
    // pktgen puts the loss in one gap, as long as the port was down.
    let gap = &pj["longest_gap"];
    assert_eq!(gap["lost"], lost, "every lost frame is the outage's: {ctx}");
    let gap_s = gap["seconds"].as_f64().unwrap();
    assert!(
        (gap_s - downtime).abs() < 0.5,
        "gap {gap_s} s against downtime {downtime} s: {ctx}"
    );
    // pktgen sends port 0 -> port 1: l2fwd never had a frame for the recovering port (its
    // down_drops would count those); the loss is on the wire into it, during the gap.
    assert!(lj["down_drops"].as_u64().unwrap() <= lost, "{ctx}");
    // Traffic after the recovery: more came back than was sent before the reset.
    assert!(rx > frames / 2, "{ctx}");
    assert_eq!(live_at_exit(&r.l2fwd), Some(0), "{ctx}");
    let err = String::from_utf8_lossy(&r.l2fwd.stderr);
    // Every context (two before the reset, one after) gave every queue buffer back.
    assert_eq!(
        err.matches("queue-buffer allocators: every buffer given back")
            .count(),
        3,
        "{ctx}"
    );
}

#[test]
fn l2fwd_on_mana_ports_survives_a_service_reset() {
    let (frames, rate) = (12_000, 2_000);
    let r = serviced_run("mana", frames, rate, 2.0, Duration::from_millis(1500));
    check_recovered(&r, frames, rate, 2.0);
}

#[test]
fn l2fwd_on_mlx5_ports_survives_a_service_reset() {
    let (frames, rate) = (12_000, 2_000);
    let r = serviced_run("mlx5", frames, rate, 2.0, Duration::from_millis(1500));
    check_recovered(&r, frames, rate, 2.0);
}

/// A device that is removed for good: the port fails after its recover-timeout, l2fwd says
/// what it waited for, exits 1, and leaves nothing behind.
#[test]
fn a_device_removed_for_good_fails_the_port_after_its_timeout() {
    let _one = serial();
    let world = "mana_0/1:mac=02:00:00:00:10:01,wire=none;mana_1/1:mac=02:00:00:00:10:02,wire=none";
    let fake = Fake::new(Some(world));
    let mut l2 = fake.cmd(&bin("l2fwd"));
    l2.args(["--port", "mana:dev=mana_0,port=1,recover-timeout=1"])
        .args(["--port", "mana:dev=mana_1,port=1"])
        .args(["--duration", "30", "--stats-interval", "0", "--json"])
        .args(["--link-timeout", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (l2, lines) = spawn_ready(&mut l2);
    let t0 = Instant::now();
    std::fs::write(knob(&fake, "mana_0"), "removed\n").unwrap();
    let o = finish(l2, lines);
    let waited = t0.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
        "failed after the 1 s timeout, not at --duration: {waited:?}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("recovery failed")
            && err.contains("did not come back within")
            && err.contains("02:00:00:00:10:01"),
        "{}",
        text(&o)
    );
    let lj = json_of(&o);
    assert_eq!(lj["ports"][0]["state"], "failed", "{lj}");
    assert!(lj["ports"][0]["failure"]
        .as_str()
        .unwrap()
        .contains("recover-timeout"));
    assert_eq!(lj["pool_in_use"], 0);
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

/// l2fwd on `mana_0` / `mana_1` (no wires), serviced once for 0.2 s; `env` for l2fwd.
/// Returns its output once it recovered (or gave up) and was stopped.
fn quick_service(env: &[(&str, &str)]) -> Output {
    let world = "mana_0/1:mac=02:00:00:00:10:01,wire=none;mana_1/1:mac=02:00:00:00:10:02,wire=none";
    let fake = Fake::new(Some(world));
    let mut l2 = fake.cmd(&bin("l2fwd"));
    l2.args(["--port", "mana:dev=mana_0,recover-timeout=5"])
        .args(["--port", "mana:dev=mana_1"])
        .args(["--duration", "30", "--stats-interval", "0", "--json"])
        .args(["--link-timeout", "0"])
        .env("PMD_LOG", "pmd::port=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        l2.env(k, v);
    }
    let (l2, lines) = spawn_ready(&mut l2);
    std::fs::write(knob(&fake, "mana_0"), "service 0.2\n").unwrap();
    // Collect stderr until the port is back (or failed), then stop l2fwd.
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(50)) {
            let done = l.contains("recovered after") || l.contains("recovery failed");
            seen.push(l);
            if done {
                break;
            }
        }
    }
    common::interrupt(l2.id());
    let mut o = finish(l2, lines);
    let rest = std::mem::take(&mut o.stderr);
    o.stderr = (seen.join("\n") + "\n").into_bytes();
    o.stderr.extend(rest);
    o
}

/// Every bring-up call of the recovery fails once in turn (`FAKE_RDMA_FAIL=CALL#N`, N the
/// first call of the recovery): the attempt says which call failed, leaves nothing alive,
/// and the next attempt brings the port back.
#[test]
fn a_failure_at_each_step_of_the_reprobe_is_retried() {
    let _one = serial();
    // Where the recovery's calls start: a run with a trace.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let o = quick_service(&[("FAKE_RDMA_TRACE", trace.to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let calls: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["call"].as_str().unwrap().to_string()
        })
        .collect();
    // Two devices opened at start; the third open is the recovery's.
    let start = calls
        .iter()
        .enumerate()
        .filter(|(_, c)| *c == "ibv_open_device")
        .nth(2)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("no reopen in the trace: {calls:?}"));
    let steps = [
        "ibv_open_device",
        "ibv_query_device_ex",
        "ibv_alloc_pd",
        "ibv_alloc_parent_domain",
        "ibv_reg_mr",
        "ibv_create_cq",
        "ibv_create_qp",
        "ibv_create_wq",
        "ibv_create_rwq_ind_table",
        "ibv_create_qp_ex",
    ];
    for call in steps {
        assert!(
            calls[start..].iter().any(|c| c == call),
            "the recovery makes no {call}: {:?}",
            &calls[start..]
        );
        let n = calls[..start].iter().filter(|c| *c == call).count() + 1;
        let o = quick_service(&[("FAKE_RDMA_FAIL", &format!("{call}#{n}:ENOMEM"))]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{call}#{n}: {}", text(&o));
        assert!(
            err.contains("not back yet") && err.contains(&format!("{call} failed")),
            "{call}#{n}: the failed attempt is reported: {}",
            text(&o)
        );
        assert!(err.contains("recovered after"), "{call}#{n}: {}", text(&o));
        assert_eq!(live_at_exit(&o), Some(0), "{call}#{n}: {}", text(&o));
    }
}

/// A re-probe that fails at every attempt (every RSS QP of the recovery refused) fails the
/// port at its recover-timeout, with the last error, and leaves nothing alive.
#[test]
fn a_reprobe_that_keeps_failing_fails_the_port_cleanly() {
    let _one = serial();
    // The start makes two RSS QPs (one per port); every later one fails. An attempt every
    // 10 ms or so for 5 s: a few hundred (more with inline engines, no engine thread beside
    // the retries); 3000 entries stay well under the kernel's 128 KiB for one variable.
    let fail: Vec<String> = (3..3000)
        .map(|n| format!("ibv_create_qp_ex#{n}:ENOMEM"))
        .collect();
    let t0 = Instant::now();
    let o = quick_service(&[("FAKE_RDMA_FAIL", &fail.join(","))]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(
        err.contains("recovery failed")
            && err.contains("recover-timeout")
            && err.contains("ibv_create_qp_ex failed"),
        "{}",
        text(&o)
    );
    assert_eq!(json_of(&o)["ports"][0]["state"], "failed");
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

fn proc_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Resident anonymous memory (heap, stacks; not the cable files, whose pages become
/// resident as traffic moves through their rings).
fn proc_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A hundred short service resets in a row under traffic: every one recovered, and nothing
/// grows in l2fwd beyond a small bound (open descriptors, resident memory); at exit the
/// pool is whole and the fake has no live object.
#[test]
fn a_hundred_service_resets_in_a_row_leave_nothing_behind() {
    let _one = serial();
    let tag = format!("rh{}", std::process::id());
    let fake = Fake::new(Some(&format!(
        "mana_0/1:mac=02:00:00:00:10:01,wire=shm:{tag}-1;mana_1/1:mac=02:00:00:00:10:02,wire=shm:{tag}-2"
    )));
    let mut l2 = fake.cmd(&bin("l2fwd"));
    l2.args(["--port", "mana:dev=mana_0", "--port", "mana:dev=mana_1"])
        .args(["--duration", "300", "--stats-interval", "0", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (l2, lines) = spawn_ready(&mut l2);
    let mut pg = Command::new(bin("pktgen"));
    integration_tests::own_runtime_dir(&mut pg);
    pg.args(["--port", &format!("emu-mana:wire=shm:{tag}-1")])
        .args(["--port", &format!("emu-mana:wire=shm:{tag}-2")])
        .args(["--rate", "5000", "--duration", "120", "--json"])
        .env("PMD_SHM_DIR", fake.shm_dir())
        .env_remove("PMD_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut pg, pg_lines) = spawn_ready(&mut pg);
    let mut seen = Vec::new();
    let mut recovered = 0;
    let mut at_first = (0, 0);
    let dir = fake.dir.path().join("sys/class/infiniband/mana_0");
    for i in 1..=100 {
        // The knob is there again once the device is.
        let t0 = Instant::now();
        while !dir.is_dir() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "reset {i}: device not back"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::fs::write(dir.join("fake_rdma_fatal"), "service 0.02\n").unwrap();
        let t0 = Instant::now();
        while recovered < i {
            let l = lines
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("reset {i}: no recovery within 10 s: {seen:?}"));
            // l2fwd's event line (the log's warning says it too).
            recovered +=
                usize::from(l.starts_with("l2fwd: port 0") && l.contains("recovered after"));
            seen.push(l);
            assert!(t0.elapsed() < Duration::from_secs(10), "reset {i}");
        }
        if i == 1 {
            at_first = (proc_fds(l2.id()), proc_rss_kib(l2.id()));
        }
    }
    let at_last = (proc_fds(l2.id()), proc_rss_kib(l2.id()));
    eprintln!(
        "l2fwd after the first and the 100th reset: {} / {} descriptors, {} / {} KiB resident anonymous",
        at_first.0, at_last.0, at_first.1, at_last.1
    );
    common::interrupt(pg.id());
    let _ = pg.wait();
    drop(pg_lines);
    common::interrupt(l2.id());
    let o = finish(l2, lines);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        at_last.0 <= at_first.0 + 2,
        "descriptors {} after the first reset, {} after the last",
        at_first.0,
        at_last.0
    );
    assert!(
        at_last.1 <= at_first.1 + 2 * 1024,
        "resident anonymous KiB {} after the first reset, {} after the last",
        at_first.1,
        at_last.1
    );
    let lj = json_of(&o);
    assert_eq!(lj["recoveries"], 100, "{}", text(&o));
    assert_eq!(lj["pool_in_use"], 0, "{}", text(&o));
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}
