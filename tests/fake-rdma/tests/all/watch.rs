//! Watching the unchanged l2fwd on `mana:` and `mlx5:` ports over the fake rdma-core, as a
//! user would: `pmd-telemetry` and Debian's `dpdk-telemetry.py` read its telemetry socket,
//! and `pmd-dumpcap` captures both ports, while pktgen sends frames through it from
//! device-model ports at the far ends of the wires:
//!
//!   pktgen (emu) --wire 1--> l2fwd port 0 (fake) -> l2fwd port 1 (fake) --wire 2--> pktgen
//!
//! Both telemetry clients count every frame pktgen sent, and agree with l2fwd's final report;
//! the capture holds each frame twice (received on port 0, sent on port 1), byte for byte the
//! same, or counts it as dropped; and l2fwd still forwards everything, its pool whole, the
//! fake with no live object left.
//!
//! l2fwd and the tools share one runtime directory (`RUNTIME_DIRECTORY`) in a temporary
//! folder, and one file prefix; pktgen has a runtime directory of its own.

use crate::common::serial;
use crate::common::{bin, live_at_exit, text, Fake, Pair};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::blocks::interface_statistics::InterfaceStatisticsOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pmd::sys::net::{send_signal, SIGINT};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Debian's DPDK telemetry client (package `dpdk-dev`).
const DPDK_TELEMETRY_PY: &str = "/usr/bin/dpdk-telemetry.py";

/// The basic counters `/ethdev/stats` and l2fwd's report share.
const BASIC: [&str; 8] = pmd::telemetry::ethdev::STATS;

/// Frames pktgen sends through l2fwd.
const FRAMES: u64 = 20_000;

/// pktgen's rate: 2 kpps, as in `mana_port.rs` and `mlx5_port.rs`. The 256-descriptor rings
/// (rdma-core v44's maximum for MANA) hold 128 ms of traffic, so l2fwd, pktgen, pmd-dumpcap
/// and the device models may share 2 busy cores without a ring running over.
const RATE: u64 = 2_000;

/// A tool running in the background: killed and reaped if the test ends without stopping it
/// (an assertion failed), so that no process outlives its test.
struct Bg(Option<Child>);

impl Bg {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }

    /// Whether it has exited.
    fn exited(&mut self) -> bool {
        self.child().try_wait().expect("try_wait").is_some()
    }

    /// Stops it with SIGINT (a user's Ctrl-C) and returns its output; fails the test if it
    /// still runs 30 s later.
    fn stop(mut self, what: &str) -> Output {
        send_signal(self.child().id(), SIGINT).unwrap_or_else(|e| panic!("SIGINT {what}: {e}"));
        assert!(
            integration_tests::eventually(Duration::from_secs(30), || self.exited()),
            "{what} did not stop on SIGINT"
        );
        self.0.take().expect("running").wait_with_output().unwrap()
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The runtime directory and file prefix that l2fwd and the tools share.
struct Watch {
    run: PathBuf,
    prefix: String,
}

impl Watch {
    /// Puts `c` in the shared runtime directory.
    fn place(&self, c: &mut Command) {
        c.env("RUNTIME_DIRECTORY", &self.run);
    }

    /// `<RUNTIME_DIRECTORY>/dpdk/<prefix>/<name>`.
    fn socket(&self, name: &str) -> PathBuf {
        self.run.join("dpdk").join(&self.prefix).join(name)
    }

    /// pmd-dumpcap with `args`, once it says it captures; its stderr lines, as they come.
    fn dumpcap(&self, args: &[&str]) -> (Bg, Receiver<String>) {
        let mut c = Command::new(bin("pmd-dumpcap"));
        c.args(["--file-prefix", &self.prefix])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.place(&mut c);
        let mut child = c.spawn().expect("start pmd-dumpcap");
        let err = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut dc = Bg(Some(child));
        let mut said = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(l) if l.starts_with("pmd-dumpcap: capturing") => break,
                Ok(l) => said.push(l),
                Err(_) => {
                    let exited = dc.exited();
                    panic!(
                        "pmd-dumpcap did not start capturing (exited: {exited}): {}",
                        said.join("\n")
                    );
                }
            }
        }
        (dc, lines)
    }

    /// `pmd-telemetry --json /ethdev/stats PORT`: the port's counters.
    fn pmd_telemetry_stats(&self, port: u16) -> serde_json::Value {
        let mut c = Command::new(bin("pmd-telemetry"));
        c.args(["--file-prefix", &self.prefix, "--json", "/ethdev/stats"])
            .arg(port.to_string());
        self.place(&mut c);
        let o = c.output().expect("run pmd-telemetry");
        assert!(o.status.success(), "pmd-telemetry: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let line = out.lines().next().unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("pmd-telemetry printed {line:?}: {e}: {}", text(&o)));
        stats_of(&v)
    }

    /// `printf '/ethdev/stats,0\n/ethdev/stats,1\n' | dpdk-telemetry.py -f PREFIX`: both ports'
    /// counters; `None` when Debian's client is not installed and the run does not require it
    /// (PMD_REQUIRE_TOOLS).
    fn dpdk_telemetry_py_stats(&self) -> Option<[serde_json::Value; 2]> {
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
        let mut c = Command::new(DPDK_TELEMETRY_PY);
        c.args(["-f", &self.prefix])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.place(&mut c);
        let mut child = c.spawn().expect("start dpdk-telemetry.py");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"/ethdev/stats,0\n/ethdev/stats,1\n")
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "dpdk-telemetry.py: {}", text(&o));
        let answers: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("dpdk-telemetry.py printed {l:?}: {e}"))
            })
            .collect();
        assert_eq!(answers.len(), 2, "dpdk-telemetry.py: {}", text(&o));
        Some([stats_of(&answers[0]), stats_of(&answers[1])])
    }
}

/// The counters in an `/ethdev/stats` answer.
fn stats_of(answer: &serde_json::Value) -> serde_json::Value {
    let s = answer
        .get("/ethdev/stats")
        .unwrap_or_else(|| panic!("no /ethdev/stats in {answer}"));
    assert!(s.is_object(), "a null answer: {answer}");
    s.clone()
}

/// A capture file: per interface, its name, its frames (EPB flags, bytes) and its statistics
/// block's (received, dropped, accepted by the filter).
struct Capture {
    names: Vec<String>,
    frames: Vec<Vec<(u32, Vec<u8>)>>,
    stats: Vec<(u64, u64, u64)>,
}

fn read_capture(path: &Path) -> Capture {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = PcapNgReader::new(&data[..]).expect("a pcapng section header");
    let mut c = Capture {
        names: Vec::new(),
        frames: Vec::new(),
        stats: Vec::new(),
    };
    while let Some(b) = r.next_block() {
        match b.expect("a whole block") {
            Block::InterfaceDescription(d) => {
                c.names.push(
                    d.options
                        .iter()
                        .find_map(|o| match o {
                            InterfaceDescriptionOption::IfName(n) => Some(n.to_string()),
                            _ => None,
                        })
                        .unwrap_or_default(),
                );
                c.frames.push(Vec::new());
            }
            Block::EnhancedPacket(p) => {
                let flags = p
                    .options
                    .iter()
                    .find_map(|o| match o {
                        EnhancedPacketOption::Flags(f) => Some(*f),
                        _ => None,
                    })
                    .expect("every frame has its direction");
                c.frames[p.interface_id as usize].push((flags, p.data.into_owned()));
            }
            Block::InterfaceStatistics(s) => {
                let get = |want: fn(&InterfaceStatisticsOption) -> Option<u64>| {
                    s.options.iter().find_map(want).expect("statistics option")
                };
                c.stats.push((
                    get(|o| match o {
                        InterfaceStatisticsOption::IsbIfRecv(v) => Some(*v),
                        _ => None,
                    }),
                    get(|o| match o {
                        InterfaceStatisticsOption::IsbIfDrop(v) => Some(*v),
                        _ => None,
                    }),
                    get(|o| match o {
                        InterfaceStatisticsOption::IsbFilterAccept(v) => Some(*v),
                        _ => None,
                    }),
                ));
            }
            _ => {}
        }
    }
    c
}

/// pktgen's sequence number: the first 8 bytes of the UDP payload.
fn seq(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame[42..50].try_into().unwrap())
}

/// [`FRAMES`] frames from pktgen through l2fwd on `pair` over the fake, watched by both
/// telemetry clients and captured on both ports by pmd-dumpcap.
fn watch(nic: &str, pair: impl Fn(&str) -> Pair) {
    let _one = serial();
    let tag = format!("w{nic}{}", std::process::id());
    let pair = pair(&tag);
    let fake = Fake::new(Some(&pair.world));
    let shm = fake.shm_dir();
    let dir = tempfile::tempdir().expect("temp dir");
    let w = Watch {
        run: dir.path().join("run"),
        prefix: format!("l2{tag}"),
    };
    let pcap = dir.path().join("watch.pcapng");

    // 1. l2fwd on the fake, forwarding frames untouched (so that what port 1 sends is byte
    // for byte what port 0 received), with its sockets in the shared runtime directory.
    let mut c = fake.cmd(&bin("l2fwd"));
    c.args(["--port", pair.l2fwd[0], "--port", pair.l2fwd[1]])
        .args(["--duration", "300", "--stats-interval", "0", "--json"])
        .args(["--no-mac-updating", "--file-prefix", &w.prefix])
        .env("PMD_LOG", "pmd::verbs=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // After `place`, which gave it a runtime directory of its own.
    w.place(&mut c);
    let mut l2 = Bg(Some(c.spawn().expect("start l2fwd")));
    let sock = w.socket("pmd_capture.v1");
    assert!(
        integration_tests::eventually(Duration::from_secs(60), || sock.exists() || l2.exited()),
        "l2fwd's capture socket {} never appeared",
        sock.display()
    );
    if l2.exited() {
        let o = l2.0.take().unwrap().wait_with_output().unwrap();
        panic!(
            "l2fwd exited before its capture socket appeared: {}",
            text(&o)
        );
    }

    // 2. pmd-dumpcap on both ports.
    let (dc, dc_lines) = w.dumpcap(&["-i", "0,1", "-w", pcap.to_str().unwrap()]);

    // 3. pktgen on the model ports at the far ends of the wires.
    let p = integration_tests::own_runtime_dir(&mut Command::new(bin("pktgen")))
        .args(["--port", &pair.pktgen[0], "--port", &pair.pktgen[1]])
        .args(["--count", &FRAMES.to_string(), "--rate", &RATE.to_string()])
        .args(["--json", "--no-telemetry", "--link-timeout", "30"])
        .args(["--drain-timeout", "5"])
        .env_remove("PMD_LOG")
        .env("PMD_SHM_DIR", &shm)
        .output()
        .expect("run pktgen");

    // 4. Both telemetry clients, after the traffic: every frame in, every frame out.
    let ours = [w.pmd_telemetry_stats(0), w.pmd_telemetry_stats(1)];
    let theirs = w.dpdk_telemetry_py_stats();

    // 5. pmd-dumpcap stops first, with a whole file; then l2fwd.
    let d = dc.stop("pmd-dumpcap");
    let dc_said: Vec<String> = dc_lines.try_iter().collect();
    let l = l2.stop("l2fwd");
    let ctx = format!(
        "--- pktgen\n{}\n--- l2fwd\n{}\n--- pmd-dumpcap\n{}\n{}",
        text(&p),
        text(&l),
        text(&d),
        dc_said.join("\n")
    );
    assert!(p.status.success(), "pktgen: {ctx}");
    assert!(l.status.success(), "l2fwd: {ctx}");
    assert!(d.status.success(), "pmd-dumpcap: {ctx}");
    let pj: serde_json::Value = serde_json::from_slice(&p.stdout).expect("pktgen json");
    assert_eq!(pj["tx_packets"], FRAMES, "{ctx}");
    assert_eq!(pj["rx_packets"], FRAMES, "{ctx}");
    assert_eq!(pj["lost"], 0, "{ctx}");

    let lj: serde_json::Value = serde_json::from_slice(&l.stdout).expect("l2fwd json");
    assert_eq!(lj["rx_packets"], FRAMES, "{ctx}");
    assert_eq!(lj["tx_packets"], FRAMES, "{ctx}");
    assert_eq!(lj["dropped"], 0, "{ctx}");
    assert_eq!(lj["pool_in_use"], 0, "the pool is whole: {ctx}");

    assert_eq!(ours[0]["ipackets"], FRAMES, "pmd-telemetry port 0: {ctx}");
    if let Some(t) = &theirs {
        assert_eq!(t[0]["ipackets"], FRAMES, "dpdk-telemetry.py port 0: {ctx}");
    }
    // Every frame sent counts as sent once the queue is idle (an idle mlx5 queue asks for
    // the completion of what it has in flight).
    assert_eq!(ours[1]["opackets"], FRAMES, "pmd-telemetry port 1: {ctx}");
    // The traffic had ended when the clients asked: what they read is the final count.
    for port in 0..2 {
        let report = &lj["ports"][port]["stats"];
        for k in BASIC {
            assert_eq!(
                ours[port][k], report[k],
                "port {port} {k}: pmd-telemetry {} vs l2fwd's report {report}",
                ours[port]
            );
            if let Some(t) = &theirs {
                assert_eq!(
                    t[port][k], report[k],
                    "port {port} {k}: dpdk-telemetry.py {} vs l2fwd's report {report}",
                    t[port]
                );
            }
        }
    }
    assert_eq!(live_at_exit(&l), Some(0), "{ctx}");
    assert_eq!(
        String::from_utf8_lossy(&l.stderr)
            .matches("queue-buffer allocators: every buffer given back")
            .count(),
        2,
        "{ctx}"
    );

    let cap = read_capture(&pcap);
    assert_eq!(cap.frames.len(), 2, "one interface per port: {ctx}");
    assert_eq!(
        cap.stats.len(),
        2,
        "one statistics block per interface: {ctx}"
    );
    for (i, (dir, spec)) in [(1, &pair.l2fwd[0]), (2, &pair.l2fwd[1])]
        .into_iter()
        .enumerate()
    {
        // Named by the port's devargs: the fake's device and port.
        let dev = spec.split_once(':').map_or("", |(_, a)| a);
        assert!(
            cap.names[i].contains(dev),
            "interface {i} is named {:?}, the port is {spec}",
            cap.names[i]
        );
        // Port 0 received every frame, port 1 sent every frame: each one either in the file
        // (inbound, outbound) or counted as dropped by the capture's rings; nothing filtered.
        let (recv, drop, accepted) = cap.stats[i];
        assert_eq!(
            (recv, accepted),
            (FRAMES, FRAMES),
            "interface {i}: {:?}: {ctx}",
            cap.stats
        );
        assert_eq!(
            cap.frames[i].len() as u64 + drop,
            FRAMES,
            "interface {i}: written + dropped: {ctx}"
        );
        assert!(
            cap.frames[i]
                .iter()
                .all(|(d, f)| *d == dir && f.len() == 60),
            "interface {i}: every frame {dir} (1 in, 2 out), 60 bytes"
        );
    }
    if cap.stats.iter().all(|s| s.1 == 0) {
        // Nothing dropped: what left port 1 is byte for byte what entered port 0, in order,
        // and it is pktgen's frames, each sequence number once.
        assert!(
            cap.frames[0]
                .iter()
                .map(|f| &f.1)
                .eq(cap.frames[1].iter().map(|f| &f.1)),
            "port 1 sent what port 0 received"
        );
        let mut seqs: Vec<u64> = cap.frames[0].iter().map(|(_, f)| seq(f)).collect();
        seqs.sort_unstable();
        assert!(
            seqs.iter().copied().eq(0..FRAMES),
            "every sequence number once"
        );
    } else {
        eprintln!("note: the capture's rings dropped frames: {:?}", cap.stats);
    }
}

/// l2fwd on `mana_0` ports 1 and 2 over the fake.
#[test]
fn telemetry_and_capture_see_every_frame_l2fwd_forwards_on_mana_ports() {
    watch("mana", Pair::mana);
}

/// l2fwd on `mlx5_0` and `mlx5_1` over the fake.
#[test]
fn telemetry_and_capture_see_every_frame_l2fwd_forwards_on_mlx5_ports() {
    watch("mlx5", Pair::mlx5);
}
