//! The `mana:` port on rdma-core, run by the unchanged apps on the fake rdma-core: the
//! bring-up in DPDK net/mana's order, a clear error and nothing left alive when any step
//! fails, in both rdma-core profiles, port selection, and a port held by its netdev.

use crate::common;
use crate::common::serial;
use crate::common::{bin, live_at_exit, text, Fake};
use std::process::{Command, Output};

const PORT1: &str = "mana:dev=mana_0,port=1";
const PORT2: &str = "mana:dev=mana_0,port=2";

/// The default world's ports (MACs, netdev names) without wires: the tests that carry no
/// traffic need no 20 MiB shared-memory cable per port, which is slow to create on some
/// filesystems (overlay in containers).
const NO_WIRES: &str =
    "mana_0/1:mac=02:00:00:00:10:01,wire=none;mana_0/2:mac=02:00:00:00:10:02,wire=none";

/// l2fwd between two `mana:` ports for a moment, on `fake`, with `env`.
fn l2fwd(fake: &Fake, ports: [&str; 2], env: &[(&str, &str)]) -> Output {
    let _one = serial();
    let mut c: Command = fake.cmd(&bin("l2fwd"));
    c.args(["--port", ports[0], "--port", ports[1]]).args([
        "--duration",
        "0.3",
        "--stats-interval",
        "0",
    ]);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run l2fwd")
}

/// Every verbs call the bring-up makes, one run per call and per profile, fails the way the
/// kernel would fail it: l2fwd exits 1 with a message naming the call, the object and the
/// errno, and every object created before the failure is destroyed again.
#[test]
fn a_failure_at_each_bringup_step_is_clear_and_leaves_nothing_alive() {
    let fake = Fake::new(Some(NO_WIRES));
    // (injected call, what the message must name)
    let steps = [
        ("ibv_open_device", "device mana_0"),
        ("ibv_query_device_ex", "device mana_0"),
        ("ibv_query_port", "mana_0 port 1"),
        ("ibv_alloc_pd", "protection domain"),
        ("ibv_alloc_parent_domain", "parent domain (port 1)"),
        ("ibv_reg_mr", "registering the mbuf pool"),
        ("ibv_create_cq", "tx queue 0 of mana_0 port 1: CQ"),
        ("ibv_create_qp", "tx queue 0 of mana_0 port 1: QP"),
        ("ibv_create_cq#2", "rx queue 0 of mana_0 port 1: CQ"),
        ("ibv_create_wq", "rx queue 0 of mana_0 port 1: WQ"),
        ("ibv_create_rwq_ind_table", "indirection table"),
        ("ibv_create_qp_ex", "RSS QP of mana_0 port 1"),
        // The second port's context: the first port is torn down as well.
        ("ibv_create_qp#2", "tx queue 0 of mana_0 port 2: QP"),
    ];
    for profile in ["v44", "main"] {
        for (call, names) in steps {
            let o = l2fwd(
                &fake,
                [PORT1, PORT2],
                &[
                    ("FAKE_RDMA_PROFILE", profile),
                    ("FAKE_RDMA_FAIL", &format!("{call}:ENOMEM")),
                ],
            );
            let err = String::from_utf8_lossy(&o.stderr);
            let bare = call.split('#').next().unwrap();
            assert_eq!(o.status.code(), Some(1), "{profile} {call}: {}", text(&o));
            assert!(
                err.contains(&format!("{bare} failed")) && err.contains(names),
                "{profile} {call}: the message names the call and {names:?}: {}",
                text(&o)
            );
            assert!(
                err.contains("Cannot allocate memory (os error 12)"),
                "{profile} {call}: the errno: {}",
                text(&o)
            );
            assert_eq!(
                live_at_exit(&o),
                Some(0),
                "{profile} {call}: objects left alive: {}",
                text(&o)
            );
        }
    }
}

/// The calls of one clean run, in order, from the fake's trace.
fn traced_calls(fake: &Fake, profile: &str) -> Vec<String> {
    let trace = fake.dir.path().join(format!("trace-{profile}.jsonl"));
    let o = l2fwd(
        fake,
        [PORT1, PORT2],
        &[
            ("FAKE_RDMA_PROFILE", profile),
            ("FAKE_RDMA_TRACE", trace.to_str().unwrap()),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
    std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["errno"], 0, "a call failed in a clean run: {l}");
            v["call"].as_str().unwrap().to_string()
        })
        .collect()
}

/// A clean bring-up makes DPDK net/mana's calls in its order (allocators before any queue;
/// `manadv_init_obj` only after the QPs exist), and tears everything down children first.
#[test]
fn bringup_and_teardown_follow_rdma_cores_order_in_both_profiles() {
    let fake = Fake::new(Some(NO_WIRES));
    for profile in ["v44", "main"] {
        let calls = traced_calls(&fake, profile);
        let port = [
            "ibv_get_device_list",
            "ibv_open_device",
            "ibv_query_device_ex",
            "ibv_query_port",
            "manadv_set_context_attr",
            "ibv_alloc_pd",
            "ibv_alloc_parent_domain",
            "ibv_reg_mr",
            "ibv_create_cq",
            "ibv_create_qp",
            "manadv_init_obj",
            "ibv_create_cq",
            "ibv_create_wq",
            "ibv_create_rwq_ind_table",
            "ibv_create_qp_ex",
            "manadv_init_obj",
        ];
        // The tools open every port first (device, PD, parent domain: DPDK's probe), size
        // their mbuf pool from what the ports will get, then configure each (the pool's MR,
        // the queues: DPDK's queue set-up).
        let (open, configure) = port.split_at(7);
        let expected: Vec<&str> = [open, open, configure, configure].concat();
        let bringup: Vec<&str> = calls
            .iter()
            .take(2 * port.len())
            .map(String::as_str)
            .collect();
        assert_eq!(bringup, expected, "{profile}: {calls:?}");
        let teardown = [
            "ibv_destroy_qp",
            "ibv_destroy_cq",
            "ibv_destroy_qp",
            "ibv_destroy_rwq_ind_table",
            "ibv_destroy_wq",
            "ibv_destroy_cq",
            "ibv_dealloc_pd",
            "ibv_dereg_mr",
            "ibv_dealloc_pd",
            "ibv_close_device",
        ];
        let down: Vec<&str> = calls
            .iter()
            .map(String::as_str)
            .filter(|c| teardown.contains(c))
            .collect();
        assert_eq!(down[..teardown.len()], teardown, "{profile}: {calls:?}");
        assert_eq!(down[teardown.len()..], teardown, "{profile}: {calls:?}");
    }
}

/// A port is found by device and port, by its netdev's MAC, or by its netdev's name; a
/// selector that matches nothing lists the ports there are.
#[test]
fn ports_are_found_by_device_mac_or_netdev_and_a_miss_lists_the_ports() {
    let fake = Fake::new(Some(NO_WIRES));
    let o = l2fwd(
        &fake,
        ["mana:mac=02:00:00:00:10:01", "mana:netdev=eth-mana_0-2"],
        &[("PMD_LOG", "pmd::verbs=info")],
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "port=1 mac=02:00:00:00:10:01",
        "port=2 mac=02:00:00:00:10:02",
    ] {
        assert!(err.contains(want), "{want}: {}", text(&o));
    }
    let o = l2fwd(&fake, [PORT1, "mana:dev=mana_0,port=3"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        err.contains("no MANA port matches dev=mana_0,port=3")
            && err.contains("mana_0 port 1 (eth-mana_0-1, 02:00:00:00:10:01)")
            && err.contains("mana_0 port 2 (eth-mana_0-2, 02:00:00:00:10:02)"),
        "{}",
        text(&o)
    );
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

/// Ring sizes above what the device takes (rdma-core v44: 256) are reduced, and the log says
/// so, requested and effective.
#[test]
fn ring_sizes_above_the_device_limit_are_reduced_and_said() {
    let fake = Fake::new(Some(NO_WIRES));
    let o = l2fwd(&fake, [PORT1, PORT2], &[("PMD_LOG", "pmd::port=warn")]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rx ring size 512 requested, the device takes at most 256: using 256")
            && err.contains("tx ring size 512 requested, the device takes at most 256: using 256"),
        "{}",
        text(&o)
    );
}

/// While the port's netdev is up the raw QP is refused (ENODEV on released kernels): the
/// port is busy, and the message names the netdev and the command that frees it.
#[test]
fn a_port_held_by_its_netdev_is_busy_naming_the_netdev_and_the_command() {
    // `lo` is always up: it plays a netdev that holds port 1.
    let fake = Fake::new(Some(
        "mana_0/1:mac=02:00:00:00:10:01,wire=none,netdev=lo;\
         mana_0/2:mac=02:00:00:00:10:02,wire=none",
    ));
    for errno in ["ENODEV", "EBUSY"] {
        for profile in ["v44", "main"] {
            let o = l2fwd(
                &fake,
                [PORT1, PORT2],
                &[
                    ("FAKE_RDMA_BUSY_ERRNO", errno),
                    ("FAKE_RDMA_PROFILE", profile),
                ],
            );
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{errno} {profile}: {}", text(&o));
            assert!(
                err.contains("kernel netdev lo holds it")
                    && err.contains("ip link set lo down")
                    && err.contains(&format!("failed with {errno}")),
                "{errno} {profile}: {}",
                text(&o)
            );
            assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
        }
    }
}

/// Which process holds the `mana:` ports (on the fake); the other runs device-model ports
/// on the far ends of the same wires.
#[derive(Clone, Copy, PartialEq)]
enum ManaSide {
    /// pktgen (emu) → wire → mana 1 → l2fwd → mana 2 → wire → pktgen.
    L2fwd,
    /// pktgen → mana 1 → wire → l2fwd (emu) → wire → mana 2 → pktgen.
    Pktgen,
}

/// `frames` UDP frames from pktgen through l2fwd and back, one of them on `mana:` ports over
/// the fake: every frame arrives, nothing is lost or dropped, pools are whole, the fake has no
/// live object left and every queue buffer its allocators handed out came back. `run` is
/// pktgen's `--run` (a child forked and exec'd while traffic flows). With `coalesce` the fake
/// plays a newer kernel, whose RSS QPs coalesce RX completions: the `mana:` ports then count
/// RX_COALESCED_4 CQEs, and none otherwise. Returns the fake's trace of the process with the
/// `mana:` ports.
fn forward(
    profile: &str,
    frames: u64,
    side: ManaSide,
    run: Option<&str>,
    coalesce: bool,
) -> Vec<String> {
    let _one = serial();
    let tag = format!("fm{}-{profile}", std::process::id());
    let c = if coalesce { ",coalesce=1" } else { "" };
    let fake = Fake::new(Some(&format!(
        "mana_0/1:mac=02:00:00:00:10:01,wire=shm:{tag}-1{c};mana_0/2:mac=02:00:00:00:10:02,wire=shm:{tag}-2{c}"
    )));
    let shm = fake.shm_dir();
    let trace = fake.dir.path().join("trace.jsonl");
    let emu = [
        format!("emu-mana:wire=shm:{tag}-1"),
        format!("emu-mana:wire=shm:{tag}-2"),
    ];
    let mana = [PORT1.to_string(), PORT2.to_string()];
    let (l2_ports, pg_ports) = match side {
        ManaSide::L2fwd => (&mana, &emu),
        ManaSide::Pktgen => (&emu, &mana),
    };
    let on_fake = |c: &mut Command, here: bool| {
        if here {
            fake.place(c);
            c.env("FAKE_RDMA_PROFILE", profile)
                .env("FAKE_RDMA_TRACE", &trace)
                .env("PMD_LOG", "pmd::verbs=debug");
        } else {
            c.env_remove("PMD_LOG");
        }
        c.env("PMD_SHM_DIR", &shm);
        integration_tests::own_runtime_dir(c);
    };
    let mut l2 = Command::new(bin("l2fwd"));
    l2.args(["--port", &l2_ports[0], "--port", &l2_ports[1]])
        .args(["--duration", "60", "--stats-interval", "0", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    on_fake(&mut l2, side == ManaSide::L2fwd);
    let l2 = l2.spawn().expect("start l2fwd");
    let mut pg = Command::new(bin("pktgen"));
    pg.args(["--port", &pg_ports[0], "--port", &pg_ports[1]])
        // 2 kpps: the 256-descriptor rings (the v44 maximum) hold 128 ms of traffic, so the
        // six threads of the two processes and their device models may share 2 busy cores
        // without a ring running over (lost frames are counted, never hidden).
        .args(["--count", &frames.to_string(), "--rate", "2000", "--json"])
        .args(["--link-timeout", "30", "--drain-timeout", "5"]);
    if let Some(cmd) = run {
        pg.args(["--run", cmd]);
    }
    on_fake(&mut pg, side == ManaSide::Pktgen);
    let p = pg.output().expect("run pktgen");
    common::interrupt(l2.id());
    let l = l2.wait_with_output().expect("l2fwd");
    let ctx = format!("--- pktgen\n{}\n--- l2fwd\n{}", text(&p), text(&l));
    assert!(p.status.success() && l.status.success(), "{ctx}");
    let pj: serde_json::Value = serde_json::from_slice(&p.stdout).expect("pktgen json");
    assert_eq!(pj["tx_packets"], frames, "{ctx}");
    assert_eq!(pj["rx_packets"], frames, "{ctx}");
    assert_eq!(pj["lost"], 0, "{ctx}");
    let lj: serde_json::Value = serde_json::from_slice(&l.stdout).expect("l2fwd json");
    assert_eq!(lj["dropped"], 0, "{ctx}");
    assert_eq!(lj["tx_packets"], frames, "{ctx}");
    let m = if side == ManaSide::L2fwd { &l } else { &p };
    let mana_ports: Vec<&serde_json::Value> = match side {
        ManaSide::L2fwd => (0..2).map(|i| &lj["ports"][i]["stats"]).collect(),
        ManaSide::Pktgen => (0..2).map(|i| &pj["ports"][i]).collect(),
    };
    let coalesced: u64 = mana_ports
        .iter()
        .map(|s| {
            s["xstats"]["rx_coalesced_cqes"]
                .as_u64()
                .unwrap_or_else(|| panic!("rx_coalesced_cqes: {s}"))
        })
        .sum();
    assert_eq!(coalesced > 0, coalesce, "{coalesced} coalesced CQEs: {ctx}");
    let err = String::from_utf8_lossy(&m.stderr);
    assert_eq!(live_at_exit(m), Some(0), "{ctx}");
    let given_back: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("queue-buffer allocators: every buffer given back"))
        .collect();
    assert_eq!(given_back.len(), 2, "{ctx}");
    // Each port's RSS QP gives back its send buffer, which is NULL (rdma-core v44
    // providers/mana/qp.c:169): the driver's allocator takes free(NULL) and counts it apart.
    for l in given_back {
        assert!(l.contains("null_frees=1"), "{l}\n{ctx}");
    }
    std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["call"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn l2fwd_forwards_every_frame_between_mana_ports_v44() {
    forward("v44", 4_000, ManaSide::L2fwd, None, false);
}

#[test]
fn l2fwd_forwards_every_frame_between_mana_ports_main() {
    forward("main", 4_000, ManaSide::L2fwd, None, false);
}

/// A newer kernel's `mana_ib` turns RX CQE coalescing on for RSS QPs: the driver takes the
/// RX_COALESCED_4 completions apart and forwards every frame.
#[test]
fn l2fwd_forwards_every_frame_between_mana_ports_on_a_coalescing_kernel() {
    forward("main", 4_000, ManaSide::L2fwd, None, true);
}

/// pktgen on `mana:` ports forks and execs a child five times while traffic runs (`--run`):
/// it calls `ibv_fork_init` before its first registration, and nothing is lost or corrupted
/// (pktgen checks every sequence number; l2fwd forwards untouched frames only if their
/// headers parse).
#[test]
fn fork_and_exec_during_traffic_loses_nothing() {
    let calls = forward(
        "v44",
        4_000,
        ManaSide::Pktgen,
        Some("for i in 1 2 3 4 5; do /bin/true; sleep 0.05; done"),
        false,
    );
    let fork = calls.iter().position(|c| c == "ibv_fork_init");
    let reg = calls.iter().position(|c| c == "ibv_reg_mr");
    assert!(
        matches!((fork, reg), (Some(f), Some(r)) if f < r),
        "ibv_fork_init must come before the first ibv_reg_mr: {calls:?}"
    );
}

/// Newer kernels list a MANA function twice: its RDMA (RNIC) device, `vendor_part_id` 3
/// without raw-packet capabilities, and its raw-packet device, with the same MAC. A port
/// named by MAC opens the raw-packet one and says which it skipped; naming only the RDMA
/// device is refused with why.
#[test]
fn the_raw_packet_device_of_a_function_listed_twice_is_chosen() {
    let fake = Fake::new(Some(
        "mana_0/1:mac=02:00:00:00:10:01,wire=none,rnic=1;\
         mana_1/1:mac=02:00:00:00:10:01,wire=none;\
         mana_2/1:mac=02:00:00:00:10:02,wire=none",
    ));
    let run = |a: &str, b: &str| {
        let _one = serial();
        fake.cmd(&bin("l2fwd"))
            .args(["--port", a, "--port", b])
            .args(["--duration", "0.3", "--stats-interval", "0"])
            .env("PMD_LOG", "pmd::verbs=info")
            .output()
            .expect("run l2fwd")
    };
    let o = run("mana:mac=02:00:00:00:10:01", "mana:mac=02:00:00:00:10:02");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        err.contains("skipping mana_0: vendor part id 3"),
        "{}",
        text(&o)
    );
    let opened: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("MANA port opened"))
        .collect();
    assert!(
        opened.iter().any(|l| l.contains("device=mana_1"))
            && !opened.iter().any(|l| l.contains("device=mana_0")),
        "{}",
        text(&o)
    );
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
    let o = run("mana:dev=mana_0", "mana:dev=mana_2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        err.contains("matches no raw-packet MANA device: mana_0 (vendor part id 3"),
        "{}",
        text(&o)
    );
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

/// The vPort is held by the kernel for the process whose raw QPs configured it, against every
/// other process (mana_cfg_vport's `vport_use_count`), not only by pmd's own port lock: a
/// second l2fwd that does not share the first one's lock directory (as another program
/// would not) fails at the raw QP and says the port is busy; once the first one is killed,
/// the kernel lets the port go and the second one runs.
#[test]
fn a_vport_held_by_another_process_is_refused_until_that_process_dies() {
    let fake = Fake::new(Some(NO_WIRES));
    let locks = tempfile::tempdir().unwrap();
    let l2fwd = |lock_dir: &str| {
        let mut c = fake.cmd(&bin("l2fwd"));
        c.args(["--port", PORT1, "--port", PORT2])
            .args(["--stats-interval", "0", "--link-timeout", "0"])
            .env("PMD_LOCK_DIR", locks.path().join(lock_dir));
        c
    };
    let mut first = l2fwd("a")
        .args(["--duration", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Ready once its ports are up (its queues exist): l2fwd says so on stderr.
    let err = first.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("l2fwd: 2 ports"));
    assert!(ready, "the first l2fwd did not start");
    // Keep reading so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    assert!(fake
        .dir
        .path()
        .join("sys/fake-kernel/mana_0.1.vport")
        .exists());
    let o = l2fwd("b").args(["--duration", "0.2"]).output().unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let second = text(&o);
    assert!(
        second.contains("mana_0 port 1 is configured by another process: ENODEV"),
        "{second}"
    );
    // pmd's error names the other process, not the (down) netdev, and says what to do.
    assert!(
        second.contains("another process (the port's kernel netdev eth-mana_0-1 is down"),
        "{second}"
    );
    assert!(second.contains("busy=wait"), "{second}");
    pmd::sys::net::send_signal(first.id(), pmd::sys::net::SIGKILL).unwrap();
    first.wait().unwrap();
    let o = l2fwd("b").args(["--duration", "0.2"]).output().unwrap();
    assert!(o.status.success(), "after the holder died: {}", text(&o));
}
