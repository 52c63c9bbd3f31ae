//! `pmd-dumpcap` on a running l2fwd forwarding pktgen traffic over shared-memory cables:
//!
//!   pktgen port 0 --shm A--> l2fwd port 0 -> l2fwd port 1 --shm B--> pktgen port 1
//!
//! The capture holds exactly what l2fwd forwarded (frames written plus the rings' counted
//! drops), Debian's tshark reads it, a filter keeps exactly the matching frames, and a
//! killed pmd-dumpcap leaves l2fwd forwarding with nothing lost and the port free to capture
//! again.

use crate::support::{bin, json, spawn_with_lines, stop, succeeded, Bg};
use pcap_file::pcapng::blocks::interface_statistics::InterfaceStatisticsOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

struct Setup {
    dir: tempfile::TempDir,
    prefix: String,
    a: String,
    b: String,
}

impl Setup {
    fn new(tag: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let id = format!("{tag}{}", std::process::id());
        Self {
            dir,
            prefix: format!("l2{id}"),
            a: format!("emu-mana:wire=shm:{id}a"),
            b: format!("emu-mana:wire=shm:{id}b"),
        }
    }

    fn env(&self, c: &mut Command) {
        c.env("PMD_SHM_DIR", self.dir.path())
            .env("RUNTIME_DIRECTORY", self.dir.path().join("run"));
    }

    /// l2fwd, forwarding frames untouched, with its capture socket up.
    fn l2fwd(&self) -> Bg {
        let mut c = bin("l2fwd");
        c.args([
            "--port", &self.a, "--port", &self.b, "--lcores", "1", "--json",
        ])
        .args([
            "--no-mac-updating",
            "--ring-size",
            "1024",
            "--file-prefix",
            &self.prefix,
        ]);
        self.env(&mut c);
        let l2 = Bg(Some(
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
        let sock = self
            .dir
            .path()
            .join("run/dpdk")
            .join(&self.prefix)
            .join("pmd_capture.v1");
        assert!(
            integration_tests::eventually(Duration::from_secs(30), || sock.exists()),
            "l2fwd's capture socket {} never appeared",
            sock.display()
        );
        l2
    }

    /// pmd-dumpcap with `args`, running once it says it captures.
    fn dumpcap(&self, args: &[&str]) -> (Bg, std::sync::mpsc::Receiver<String>) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pmd-dumpcap"));
        c.args(["--file-prefix", &self.prefix]).args(args);
        self.env(&mut c);
        let (child, lines) = spawn_with_lines(c);
        let first = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_default();
        assert!(
            first.contains("pmd-dumpcap: capturing"),
            "pmd-dumpcap did not start: {first}"
        );
        (Bg(Some(child)), lines)
    }

    fn pktgen(&self, extra: &[&str]) -> Output {
        self.pktgen_cmd(extra).output().unwrap()
    }

    /// pktgen sending `extra`'s traffic, two flows to UDP ports 9000 and 9001.
    fn pktgen_cmd(&self, extra: &[&str]) -> Command {
        let mut c = bin("pktgen");
        c.args([
            "--port", &self.a, "--port", &self.b, "--lcores", "0", "--json",
        ])
        .args(["--link-timeout", "60", "--no-telemetry", "--size", "60"])
        .args([
            "--flows",
            "2",
            "--dst-port",
            "9000-9001",
            "--drain-timeout",
            "30",
        ])
        .args(extra);
        self.env(&mut c);
        c
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A capture file: per interface, its frames (direction, bytes) and its statistics block's
/// (received, dropped, accepted by the filter).
struct Capture {
    frames: Vec<Vec<(u32, Vec<u8>)>>,
    stats: Vec<(u64, u64, u64)>,
}

fn read_capture(path: &Path) -> Capture {
    let data = std::fs::read(path).unwrap();
    let mut r = PcapNgReader::new(&data[..]).unwrap();
    let mut frames: Vec<Vec<(u32, Vec<u8>)>> = Vec::new();
    let mut stats = Vec::new();
    while let Some(b) = r.next_block() {
        match b.unwrap() {
            Block::InterfaceDescription(_) => frames.push(Vec::new()),
            Block::EnhancedPacket(p) => {
                let flags = p
                    .options
                    .iter()
                    .find_map(|o| match o {
                        pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Flags(
                            f,
                        ) => Some(*f),
                        _ => None,
                    })
                    .expect("every frame has its direction");
                frames[p.interface_id as usize].push((flags, p.data.into_owned()));
            }
            Block::InterfaceStatistics(s) => {
                let get = |want: fn(&InterfaceStatisticsOption) -> Option<u64>| {
                    s.options.iter().find_map(want).expect("statistics option")
                };
                stats.push((
                    get(|o| {
                        if let InterfaceStatisticsOption::IsbIfRecv(v) = o {
                            Some(*v)
                        } else {
                            None
                        }
                    }),
                    get(|o| {
                        if let InterfaceStatisticsOption::IsbIfDrop(v) = o {
                            Some(*v)
                        } else {
                            None
                        }
                    }),
                    get(|o| {
                        if let InterfaceStatisticsOption::IsbFilterAccept(v) = o {
                            Some(*v)
                        } else {
                            None
                        }
                    }),
                ));
            }
            _ => {}
        }
    }
    Capture { frames, stats }
}

/// pktgen's sequence number: the first 8 bytes of the UDP payload.
fn seq(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame[42..50].try_into().unwrap())
}

/// tshark's view of a file: one line of `fields` per frame; `None` when tshark is not
/// installed and the run does not require it.
fn tshark(path: &Path, fields: &[&str]) -> Option<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(path).args(["-T", "fields"]);
    for f in fields {
        c.args(["-e", f]);
    }
    match c.output() {
        Ok(o) => {
            assert!(
                o.status.success(),
                "tshark: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            Some(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::to_string)
                    .collect(),
            )
        }
        Err(e) => {
            assert!(
                std::env::var_os("PMD_REQUIRE_TOOLS").is_none(),
                "tshark: {e} (scripts/setup.sh installs it)"
            );
            eprintln!("skipping the tshark checks: tshark: {e}");
            None
        }
    }
}

/// Waits for pmd-dumpcap to end by itself (its `what` option), successfully.
fn ends_by_itself(mut dc: Bg, what: &str) {
    assert!(
        integration_tests::eventually(Duration::from_secs(30), || dc
            .child()
            .try_wait()
            .unwrap()
            .is_some()),
        "{what} did not end the capture"
    );
    assert!(dc.0.take().unwrap().wait().unwrap().success());
}

/// Stops pmd-dumpcap as Ctrl-C does; it must end well.
fn stop_dumpcap(dc: Bg) {
    let d = stop(dc);
    assert!(
        d.status.success(),
        "pmd-dumpcap: {}",
        String::from_utf8_lossy(&d.stderr)
    );
}

/// Stops l2fwd, which must have forwarded `n` frames and lost none.
fn forwarded(l2: Bg, n: u64) {
    let l = stopped_l2fwd(l2);
    assert_eq!(
        (l["rx_packets"].as_u64(), l["tx_packets"].as_u64()),
        (Some(n), Some(n)),
        "{l}"
    );
}

fn stopped_l2fwd(l2: Bg) -> serde_json::Value {
    let l = stop(l2);
    assert!(
        l.status.success(),
        "l2fwd failed: {}",
        String::from_utf8_lossy(&l.stderr)
    );
    let l = json(&l.stdout);
    assert_eq!(l["dropped"], 0, "{l}");
    assert_eq!(l["pool_in_use"], 0, "{l}");
    l
}

#[test]
fn the_capture_holds_every_forwarded_frame_and_tshark_reads_it() {
    const N: u64 = 100_000;
    let s = Setup::new("dc");
    let l2 = s.l2fwd();
    let out = s.file("all.pcapng");
    let (dc, _lines) = s.dumpcap(&["-i", "0,1", "-w", out.to_str().unwrap()]);
    let p = succeeded(&s.pktgen(&["--count", &N.to_string(), "--rate", "50000"]));
    assert_eq!(
        (p["tx_packets"].as_u64(), p["lost"].as_u64()),
        (Some(N), Some(0)),
        "{p}"
    );
    // Telemetry shows the capture running: the tool's pid, both ports, what each saw.
    let mut c = Command::new(env!("CARGO_BIN_EXE_pmd-telemetry"));
    c.args(["--file-prefix", &s.prefix, "--json", "/pmd/capture"]);
    s.env(&mut c);
    let t = c.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&t.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&t.stdout)));
    let cap = &v["/pmd/capture"][0];
    assert_eq!(cap["pid"], dc.0.as_ref().unwrap().id(), "{v}");
    assert_eq!(
        (cap["rx"].as_bool(), cap["tx"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(cap["ports"][0]["seen"], N, "{v}");
    assert_eq!(cap["ports"][1]["seen"], N, "{v}");
    // Ctrl-C ends the capture with a whole file.
    stop_dumpcap(dc);
    forwarded(l2, N);

    let c = read_capture(&out);
    assert_eq!(c.frames.len(), 2, "one interface per port");
    assert_eq!(c.stats.len(), 2, "one statistics block per interface");
    // Port 0 received every frame, port 1 sent every frame: each one either in the file or
    // counted as dropped by the rings; nothing filtered (no filter).
    for (i, dir) in [(0, 1), (1, 2)] {
        let (recv, drop, accepted) = c.stats[i];
        assert_eq!(recv, N, "interface {i}");
        assert_eq!(accepted, N, "interface {i}");
        assert_eq!(
            c.frames[i].len() as u64 + drop,
            N,
            "interface {i}: written + dropped"
        );
        assert!(c.frames[i].iter().all(|(d, f)| *d == dir && f.len() == 60));
    }
    if c.stats.iter().all(|s| s.1 == 0) {
        // Nothing dropped (the usual case): what left port 1 is byte for byte what entered
        // port 0, in order, and it is pktgen's frames: each sequence number once.
        assert!(c.frames[0]
            .iter()
            .map(|f| &f.1)
            .eq(c.frames[1].iter().map(|f| &f.1)));
        let mut seqs: Vec<u64> = c.frames[0].iter().map(|(_, f)| seq(f)).collect();
        seqs.sort_unstable();
        assert!(seqs.iter().copied().eq(0..N), "every sequence number once");
    }
    if let Some(lines) = tshark(&out, &["frame.interface_id", "udp.dstport", "frame.len"]) {
        let written: usize = c.frames.iter().map(Vec::len).sum();
        assert_eq!(lines.len(), written, "tshark reads every frame");
        assert!(
            lines.iter().all(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f[1] == "9000" || f[1] == "9001") && f[2] == "60"
            }),
            "tshark decodes pktgen's UDP frames: {:?}",
            &lines[..3.min(lines.len())]
        );
    }
}

#[test]
fn a_filter_captures_exactly_the_matching_frames() {
    const N: u64 = 20_000;
    let s = Setup::new("df");
    let l2 = s.l2fwd();
    let out = s.file("f.pcapng");
    let (dc, _lines) = s.dumpcap(&[
        "-i",
        "0",
        "--rx",
        "-f",
        "udp dst port 9000",
        "-w",
        out.to_str().unwrap(),
    ]);
    let p = succeeded(&s.pktgen(&["--count", &N.to_string(), "--rate", "40000"]));
    assert_eq!(p["lost"], 0, "{p}");
    stop_dumpcap(dc);
    stopped_l2fwd(l2);
    let c = read_capture(&out);
    let (recv, drop, accepted) = c.stats[0];
    // pktgen's two flows alternate: half the frames go to port 9000.
    assert_eq!((recv, accepted), (N, N / 2));
    assert_eq!(c.frames[0].len() as u64 + drop, N / 2);
    assert!(c.frames[0]
        .iter()
        .all(|(_, f)| f[36..38] == 9000u16.to_be_bytes()));
    if let Some(lines) = tshark(&out, &["udp.dstport"]) {
        assert!(lines.iter().all(|l| l == "9000") && lines.len() == c.frames[0].len());
    }
}

#[test]
fn a_killed_dumpcap_stops_the_mirroring_and_l2fwd_loses_nothing() {
    const N: u64 = 60_000;
    let s = Setup::new("dk");
    let l2 = s.l2fwd();
    let out = s.file("k.pcapng");
    let (mut dc, _lines) = s.dumpcap(&["-i", "0,1", "-w", out.to_str().unwrap()]);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        let _ = dc.child().kill();
        let _ = dc.child().wait();
    });
    let p = succeeded(&s.pktgen(&["--count", &N.to_string(), "--rate", "40000"]));
    killer.join().unwrap();
    assert_eq!(
        (p["tx_packets"].as_u64(), p["lost"].as_u64()),
        (Some(N), Some(0)),
        "{p}"
    );
    // The port is free again: a new capture starts (the killed one's ended by itself).
    let out2 = s.file("k2.pcapng");
    let (dc2, _l2) = s.dumpcap(&["-i", "0,1", "-w", out2.to_str().unwrap()]);
    let mut l2 = l2;
    let pid = l2.child().id();
    assert!(capture_memory(pid) > 0, "l2fwd maps the capture's rings");
    stop_dumpcap(dc2);
    // Nothing of either capture is left in l2fwd: no mapping, no descriptor of the rings.
    assert!(
        integration_tests::eventually(Duration::from_secs(5), || capture_memory(pid) == 0),
        "l2fwd still holds capture memory"
    );
    forwarded(l2, N);
}

/// How many mappings and descriptors of capture rings (`memfd:pmd-capture`) process `pid`
/// holds.
fn capture_memory(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|l| l.to_string_lossy().contains("memfd:pmd-capture"))
                .count()
        })
        .unwrap_or(0);
    maps.lines()
        .filter(|l| l.contains("memfd:pmd-capture"))
        .count()
        + fds
}

/// `-c COUNT` and `-a duration:S` end a capture by themselves, with a whole file: exactly
/// COUNT frames; for a duration, pmd-dumpcap exits about then.
#[test]
fn a_count_or_a_duration_ends_the_capture() {
    // Six seconds of traffic: both captures start and end while it flows.
    const N: u64 = 60_000;
    let s = Setup::new("dn");
    let l2 = s.l2fwd();
    let mut c = s.pktgen_cmd(&["--count", &N.to_string(), "--rate", "10000"]);
    let pg = std::thread::spawn(move || c.output().unwrap());
    let counted = s.file("c.pcapng");
    let (dc, _lines) = s.dumpcap(&[
        "-i",
        "0",
        "--rx",
        "-c",
        "1000",
        "-w",
        counted.to_str().unwrap(),
    ]);
    ends_by_itself(dc, "-c 1000");
    let c = read_capture(&counted);
    assert_eq!(c.frames[0].len(), 1000, "exactly the count");
    let timed = s.file("a.pcapng");
    let t0 = std::time::Instant::now();
    let (dc, _lines) = s.dumpcap(&[
        "-i",
        "0",
        "-a",
        "duration:0.5",
        "-w",
        timed.to_str().unwrap(),
    ]);
    ends_by_itself(dc, "-a duration:0.5");
    assert!(t0.elapsed() >= Duration::from_millis(500));
    let c = read_capture(&timed);
    assert_eq!(c.stats.len(), 1, "a whole file, with its statistics");
    assert!(
        !c.frames[0].is_empty(),
        "frames flowed during the half second"
    );
    let p = pg.join().unwrap();
    assert_eq!(succeeded(&p)["lost"], 0);
    forwarded(l2, N);
}

#[test]
fn clear_errors_for_a_missing_app_a_bad_filter_and_a_busy_port() {
    let s = Setup::new("de");
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pmd-dumpcap"));
        c.args(["--file-prefix", &s.prefix]).args(args);
        s.env(&mut c);
        c.output().unwrap()
    };
    let o = run(&["-w", "/dev/null"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no running app with --file-prefix"),
        "{o:?}"
    );
    let o = run(&["-f", "udp dst port banana", "-w", "/dev/null"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a bad filter is a usage error: {o:?}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("bad capture filter"),
        "{o:?}"
    );

    let l2 = s.l2fwd();
    let o = run(&["-D"]);
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains(&s.a) && listed.contains(&s.b), "{listed}");
    let o = run(&["-i", "5", "-w", "/dev/null"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no port 5"),
        "{o:?}"
    );
    let out = s.file("b.pcapng");
    let (dc, _lines) = s.dumpcap(&["-i", "0", "-w", out.to_str().unwrap()]);
    let o = run(&["-i", "0", "-w", "/dev/null"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already being captured"),
        "{o:?}"
    );
    let d = stop(dc);
    assert!(d.status.success());
    stopped_l2fwd(l2);
}
