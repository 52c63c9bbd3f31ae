//! The fake rdma-core's mlx5 provider, from the outside: a C program built against the real
//! rdma-core headers and linked against the real libraries runs the mlx5 bring-up a
//! DPDK-like PMD does (every returned field checked), the errno table (one case per rule,
//! both profiles), frames through the queues to the port's wire and back (the device model
//! behind the fake: steering rules, SQ and RQ resets), a ConnectX-4's minimum inline
//! header, the world's mlx5 entries, and the `mlx5dv_*` exports at their real versions.

use crate::common;
use pmd::emu::wire::{Shm, Wire as _};
use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{fake_so, live_at_exit, profile_dir, text, Fake};

/// The C program, compiled once per test process with the real headers and linked against
/// the real libraries.
fn c_program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile_c("mlx5_bringup", &[], common::C_LIBS))
}

/// `allocs A frees F live L` from the program's output.
fn accounting(o: &Output) -> (u32, u32, i32) {
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = t
        .lines()
        .find(|l| l.starts_with("allocs "))
        .unwrap_or_else(|| panic!("no accounting line in:\n{}", text(o)));
    let w: Vec<&str> = line.split_whitespace().collect();
    (
        w[1].parse().unwrap(),
        w[3].parse().unwrap(),
        w[5].parse().unwrap(),
    )
}

/// The checks a run printed (`ok ...` / `FAIL ...`), in order.
fn checks(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("FAIL "))
        .map(str::to_string)
        .collect()
}

const MAC: &str = "02:00:00:00:50:01";

/// A world with a MANA device beside the mlx5 one (no wires).
fn two_families() -> Fake {
    Fake::new(Some(&format!(
        "mana_0/1:mac=02:00:00:00:10:01,wire=none;mlx5_0/1:mac={MAC},wire=none"
    )))
}

fn assert_clean(o: &Output) {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("FAIL"), "{t}");
    assert!(t.contains("\nOK\n"), "{t}");
    let (a, f, live) = accounting(o);
    assert_eq!((a, live), (f, 0), "buffers or objects left: {t}");
    assert_eq!(live_at_exit(o), Some(0), "{t}");
    assert!(t.contains("after close: engines 0 threads 0\n"), "{t}");
}

#[test]
fn the_mlx5_bringup_passes_on_the_fake_and_finds_no_device_without_it() {
    let exe = c_program();
    let real = Command::new(exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert_eq!(real.status.code(), Some(2), "{}", text(&real));
    assert!(text(&real).contains("0 device(s)"));

    let fake = two_families();
    for (profile, shut_up_bf) in [("v44", "0"), ("main", "0"), ("v44", "1")] {
        let o = fake
            .cmd(exe)
            .arg("bringup")
            .env("FAKE_RDMA_PROFILE", profile)
            .env("MLX5_SHUT_UP_BF", shut_up_bf)
            .output()
            .unwrap();
        let t = text(&o);
        assert_clean(&o);
        assert!(
            t.contains("device 0: mana_0 mlx5dv_is_supported 0\n")
                && t.contains("device 1: mlx5_0 mlx5dv_is_supported 1\n"),
            "{t}"
        );
        // rx CQ, record page, 2 WQs, rx CQ, tx CQ, 2 × (zero-byte RQ buffer, SQ buffer).
        assert_eq!(accounting(&o).0, 10, "{t}");
        assert!(
            checks(&o).len() >= 50,
            "only {} checks:\n{t}",
            checks(&o).len()
        );
    }
}

/// The checks of `mlx5_bringup errno` (tests/c/mlx5_bringup.c, `errno_table`): each prints
/// one `ok` (or `FAIL`) line.
const MLX5_ERRNO_CHECKS: usize = 140;

#[test]
fn every_errno_of_the_mlx5_table_in_both_profiles() {
    let fake = two_families();
    let mut runs = Vec::new();
    for profile in ["v44", "main"] {
        let o = fake
            .cmd(c_program())
            .arg("errno")
            .env("FAKE_RDMA_PROFILE", profile)
            .output()
            .unwrap();
        assert_clean(&o);
        let c = checks(&o);
        // Every case of the table ran: one skipped shows here.
        assert_eq!(c.len(), MLX5_ERRNO_CHECKS, "{profile}:\n{}", text(&o));
        runs.push(c);
    }
    // rdma-core main changes nothing the mlx5 provider does here (RULES.md).
    assert_eq!(runs[0], runs[1]);
    assert!(
        runs[0].iter().any(|c| c
            == "ok   ibv_fork_init after libmlx5 mapped a CQ of its own: EINVAL in v44, 0 in main"),
        "{:?}",
        runs[0]
    );
}

/// What the peer sends: to `dst` from ..:50:02, EtherType 0x88b5, `text`, padded to 60.
fn frame(dst: [u8; 6], text: &[u8]) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0x50, 2]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..14 + text.len()].copy_from_slice(text);
    f
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!(" {b:02x}")).collect()
}

/// Where each thread of process `pid` is (name, state, kernel wait channel): for a program
/// that stopped sending.
fn threads_of(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return String::from("(its threads cannot be read)\n");
    };
    let mut out = String::new();
    for t in tasks.flatten() {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let stat = read("stat");
        // `pid (comm) S ...`: the state follows the last parenthesis.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.get(..1))
            .unwrap_or("?");
        out += &format!(
            "  thread {} {:?}: state {state}, waiting in {:?}\n",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan")
        );
    }
    out
}

/// The next frame on the peer's end (`what`: which one, for the message). If it never comes,
/// the panic says why: the program exited first (with its status), or it still ran after 30 s
/// (with where its threads were); then its output.
fn next_frame(peer: &mut Shm, child: &mut std::process::Child, what: &str) -> Vec<u8> {
    let mut buf = [0u8; 2048];
    let start = Instant::now();
    loop {
        if let Some(n) = peer.recv(&mut buf) {
            return buf[..n].to_vec();
        }
        let exited = child.try_wait().unwrap();
        // A frame sent just before the program exited is on the wire now.
        if exited.is_some() {
            if let Some(n) = peer.recv(&mut buf) {
                return buf[..n].to_vec();
            }
        }
        if exited.is_some() || start.elapsed() > Duration::from_secs(30) {
            let why = match exited {
                Some(status) => {
                    format!("the program exited ({status}) after {:?}", start.elapsed())
                }
                None => format!(
                    "the program still runs after {:?}:\n{}",
                    start.elapsed(),
                    threads_of(child.id())
                ),
            };
            let _ = child.kill();
            let _ = child.wait();
            let mut out = String::new();
            for pipe in [
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read>),
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read>),
            ]
            .into_iter()
            .flatten()
            {
                let mut p = pipe;
                let _ = p.read_to_string(&mut out);
            }
            panic!("no frame on the wire for {what}: {why}\n{out}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The exchange of `mlx5_bringup traffic` with a peer on port 1's wire (see the C file):
/// the TX frames reach the wire; of the peer's frames, the one for another MAC is steered
/// away and ours and the broadcast land in the posted buffers of RQ 0; the SQ goes through
/// RESET and starts again at WQE 0; the WQ goes through RESET and its next frame lands in
/// WQE 0 again; with only an ALL_DEFAULT rule left, a frame for another MAC is taken.
/// Nothing is left at the end. `mode`: `traffic` (the engine on its thread) or `kicked`
/// (inline: the program's kick handles drive it); returns the program's output.
fn traffic(part: Option<&str>, mode: &str) -> String {
    let wire = format!("fake-mlx5-{}", part.unwrap_or("cx5"));
    let fake = Fake::new(Some(&format!(
        "mlx5_0/1:mac={MAC},wire=shm:{wire}{}",
        part.map(|p| format!(",part={p}")).unwrap_or_default()
    )));
    let mut peer = Shm::open_at(&wire, &fake.shm_dir().join(format!("pmd-wire-{wire}")))
        .expect("the peer end of port 1's wire");
    let mut child = fake
        .cmd(c_program())
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sent = |n: u8| {
        let mut f = frame([2, 0, 0, 0, 0x50, 2], b"from the C program #0");
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0x50, 1]);
        f[34] = b'0' + n;
        f
    };
    assert_eq!(
        next_frame(&mut peer, &mut child, "tx #1"),
        sent(1),
        "tx #1 on the wire"
    );
    let stranger = frame([2, 0, 0, 0, 0x50, 0x99], b"for someone else");
    let ours = frame([2, 0, 0, 0, 0x50, 1], b"from the peer #1");
    let bcast = frame([0xff; 6], b"to everyone");
    assert!(peer.send(&stranger) && peer.send(&ours) && peer.send(&bcast));
    peer.flush();
    assert_eq!(
        next_frame(&mut peer, &mut child, "tx #2"),
        sent(2),
        "tx #2 (after the SQ's reset)"
    );
    assert_eq!(
        next_frame(&mut peer, &mut child, "tx #3"),
        sent(3),
        "tx #3 (after the WQ's reset)"
    );
    let ours2 = frame([2, 0, 0, 0, 0x50, 1], b"from the peer #2");
    assert!(peer.send(&ours2));
    peer.flush();
    assert_eq!(
        next_frame(&mut peer, &mut child, "tx #4"),
        sent(4),
        "tx #4 (ALL_DEFAULT rule)"
    );
    let other = frame([2, 0, 0, 0, 0x50, 0x77], b"for anyone left");
    assert!(peer.send(&other));
    peer.flush();
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    assert_clean(&o);
    assert!(
        t.contains(&format!("rx0: 60 bytes:{}\n", hex(&ours))),
        "{t}"
    );
    assert!(
        t.contains(&format!("rx1: 60 bytes:{}\n", hex(&bcast))),
        "{t}"
    );
    assert!(
        t.contains(&format!("rx2: 60 bytes:{}\n", hex(&ours2))),
        "{t}"
    );
    assert!(
        t.contains(&format!("rx3: 60 bytes:{}\n", hex(&other))),
        "{t}"
    );
    assert!(t.contains("engines 0 threads 0\n"), "{t}");
    t
}

#[test]
fn frames_cross_the_wire_through_an_mlx5_port_with_steering_and_queue_resets() {
    let t = traffic(None, "traffic");
    assert!(
        t.contains("ok   one device-model engine for mlx5_0, on its thread (1, 1)"),
        "{t}"
    );
}

/// The same with the engine inline (`fake_rdma_kick_open` on the SQ by `qp_num` and the
/// RQs by `wq_num`): its thread stops at the first handle, queues it does not serve get
/// none, the handles keep working through the queues' resets, and closed after the
/// context they leave nothing alive.
#[test]
fn an_inline_mlx5_engine_moves_frames_on_the_programs_kicks() {
    let t = traffic(None, "kicked");
    for want in [
        "ok   the fake exports the kick symbols",
        "ok   before any handle the engine runs on its thread (1)",
        "ok   no handle, no switch: the engine keeps its thread",
        "ok   a TX handle: the engine runs inline, its thread gone (1, 0, 0)",
        "ok   handles count as live objects",
        "ok   one device-model engine for mlx5_0, inline (1, 0, 0)",
        "ok   handles closed after the context: nothing alive (0)",
        "fake-rdma: at exit: 0 live objects",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    assert_eq!(
        t.matches("errno 2 (want NULL errno 2)").count(),
        4,
        "four queues without a handle: {t}"
    );
}

#[test]
fn a_connectx4_takes_sends_with_the_18_byte_inline_header() {
    traffic(Some("0x1013"), "traffic");
}

/// A ConnectX-4 needs an 18-byte inline header in every SEND (its `eth_min_inline` is L2):
/// without one the WQE fails with LOCAL_QP_OP (requester error CQE, opcode 13, syndrome
/// 0x02); a ConnectX-5 sends it.
#[test]
fn a_send_without_an_inline_header_fails_on_a_connectx4_only() {
    for (part, want) in [
        ("0x1017", "tx cqe opcode 0 syndrome"),
        ("0x1013", "tx cqe opcode 13 syndrome 0x02"),
    ] {
        let fake = Fake::new(Some(&format!("mlx5_0/1:mac={MAC},wire=none,part={part}")));
        let o = fake.cmd(c_program()).arg("inline0").output().unwrap();
        let t = text(&o);
        assert_clean(&o);
        assert!(t.contains(want), "{part}: {t}");
    }
}

#[test]
fn manadv_on_an_mlx5_context_stops_where_libmana_would_corrupt_it() {
    let fake = two_families();
    let o = fake.cmd(c_program()).arg("manadv").output().unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("manadv_set_context_attr: the context is not a MANA context"),
        "{t}"
    );
}

#[test]
fn the_trace_shows_the_mlx5_bringup_in_dpdk_order() {
    let fake = two_families();
    let trace = fake.dir.path().join("trace.jsonl");
    let o = fake
        .cmd(c_program())
        .arg("bringup")
        .env("FAKE_RDMA_TRACE", &trace)
        .output()
        .unwrap();
    assert_clean(&o);
    let calls: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["call"].as_str().unwrap().to_string()
        })
        .collect();
    let order = [
        "ibv_open_device",
        "ibv_query_device_ex",
        "mlx5dv_query_device",
        "mlx5dv_set_context_attr",
        "ibv_alloc_pd",
        "ibv_reg_mr",
        "mlx5dv_create_cq",
        "ibv_create_wq",
        "ibv_modify_wq",
        "mlx5dv_init_obj",
        "ibv_create_rwq_ind_table",
        "ibv_create_qp_ex",
        "ibv_create_flow",
        "ibv_create_cq",
        "ibv_create_qp_ex",
        "ibv_modify_qp",
        "mlx5dv_init_obj",
        "ibv_destroy_flow",
        "ibv_destroy_qp",
        "ibv_destroy_rwq_ind_table",
        "ibv_destroy_wq",
        "ibv_destroy_cq",
        "ibv_dereg_mr",
        "ibv_dealloc_pd",
        "ibv_close_device",
    ];
    let mut at = 0;
    for want in order {
        at += calls[at..]
            .iter()
            .position(|c| c == want)
            .unwrap_or_else(|| panic!("{want} missing or out of order in {calls:?}"));
    }
}

#[test]
fn the_world_tool_and_pmd_devices_show_mlx5_devices() {
    let fake = Fake::new(Some(&format!(
        "mlx5_0/1:mac={MAC},wire=none;mlx5_1/1:mac=02:00:00:00:50:11,wire=none,part=0x1013"
    )));
    let sys = fake.dir.path().join("sys/class/infiniband/mlx5_1");
    let read = |p: &str| std::fs::read_to_string(sys.join(p)).unwrap();
    assert_eq!(read("device/vendor").trim(), "0x15b3");
    assert_eq!(read("device/device").trim(), "0x1013");
    assert!(read("device/uevent").contains("DRIVER=mlx5_core"));
    assert!(std::fs::read_link(sys.join("device/driver"))
        .unwrap()
        .ends_with("mlx5_core"));
    assert_eq!(read("device/net/eth-mlx5_1-1/dev_port").trim(), "0");
    let bin = profile_dir().join("pmd-devices");
    assert!(
        bin.exists(),
        "{} missing: run the workspace's tests",
        bin.display()
    );
    let o = fake.cmd(&bin).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("mlx5_0  provider mlx5 [15b3:1017]"), "{t}");
    assert!(t.contains("mlx5_1  provider mlx5 [15b3:1013]"), "{t}");
    assert!(
        t.contains("port 1  Ethernet ACTIVE  netdev eth-mlx5_0-1 mac 02:00:00:00:50:01 (up"),
        "{t}"
    );
    assert!(t.contains("libibverbs sees 2 device(s)"), "{t}");
}

/// `objdump -T` of an ELF file: the (symbol, version) pairs it defines by default.
fn defined(file: &Path) -> BTreeSet<(String, String)> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .expect("objdump (binutils)");
    assert!(o.status.success(), "objdump -T {}", file.display());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(" DF ") && !l.contains("*UND*"))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (name, ver) = (w.last()?, w.get(w.len().checked_sub(2)?)?);
            // A hidden (compat) version is printed in parentheses.
            (!ver.starts_with('(')).then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}

#[test]
fn the_mlx5dv_entry_points_are_exported_at_the_real_libmlx5s_versions() {
    let o = Command::new("cc")
        .arg("-print-file-name=libmlx5.so.1")
        .output()
        .unwrap();
    let real = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    assert!(
        real.is_absolute() && real.exists(),
        "libmlx5.so.1 not installed"
    );
    let real = defined(&real);
    let fake = defined(&fake_so());
    for (sym, ver) in [
        ("mlx5dv_create_cq", "MLX5_1.1"),
        ("mlx5dv_create_wq", "MLX5_1.3"),
        ("mlx5dv_query_device", "MLX5_1.0"),
        ("mlx5dv_set_context_attr", "MLX5_1.2"),
        ("mlx5dv_init_obj", "MLX5_1.2"),
        ("mlx5dv_is_supported", "MLX5_1.8"),
    ] {
        let s = (sym.to_string(), ver.to_string());
        assert!(
            real.contains(&s),
            "the installed libmlx5 has no {sym}@@{ver}"
        );
        assert!(fake.contains(&s), "the fake does not export {sym}@@{ver}");
    }
}

/// A kernel failure at each creating call fails it cleanly: the program stops there with
/// the injected errno, and its teardown gives every buffer and record page back.
#[test]
fn injected_kernel_failures_give_every_buffer_back() {
    let fake = two_families();
    for (fault, step, errno) in [
        (
            "mlx5dv_create_cq:ENOMEM",
            "mlx5dv_create_cq(rx, compressed)",
            12,
        ),
        ("ibv_create_wq#2:ENOSPC", "ibv_create_wq", 28),
        ("ibv_create_cq#2:EIO", "ibv_create_cq(tx)", 5),
        ("ibv_create_qp_ex#2:EIO", "ibv_create_qp_ex(tx)", 5),
        ("ibv_create_flow#2:ENOMEM", "ibv_create_flow(broadcast)", 12),
    ] {
        let o = fake
            .cmd(c_program())
            .arg("bringup")
            .env("FAKE_RDMA_FAIL", fault)
            .output()
            .unwrap();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{fault}: {t}");
        assert!(
            t.contains(&format!("FAILED at {step}: errno {errno} ")),
            "{fault}: expected a failure at {step} with errno {errno}:\n{t}"
        );
        let (a, f, live) = accounting(&o);
        assert_eq!((a, live), (f, 0), "{fault}: {t}");
    }
}
