//! The `mlx5:` port on rdma-core, run by the unchanged apps on the fake rdma-core (with its
//! `providers/mlx5` and the mlx5 device model behind the queues): the bring-up in DPDK
//! net/mlx5's Verbs order, a clear error and nothing left alive when any step fails, port
//! selection, the minimum inline header by device, and every frame forwarded.

use crate::common;
use crate::common::serial;
use crate::common::{bin, live_at_exit, text, Fake};
use std::process::{Command, Output};

const PORT1: &str = "mlx5:dev=mlx5_0";
const PORT2: &str = "mlx5:dev=mlx5_1";

/// Two ConnectX-5 functions without wires (no traffic, no shared-memory cables to create).
const NO_WIRES: &str =
    "mlx5_0/1:mac=02:00:00:00:20:01,wire=none;mlx5_1/1:mac=02:00:00:00:20:02,wire=none";

/// l2fwd between two ports for a moment, on `fake`, with `env`, receiving only the ports'
/// own MACs and broadcast (two steering rules per port).
fn l2fwd(fake: &Fake, ports: [&str; 2], env: &[(&str, &str)]) -> Output {
    l2fwd_args(fake, ports, env, &["--no-promiscuous"])
}

/// As [`l2fwd`], with `args` instead of `--no-promiscuous`.
fn l2fwd_args(fake: &Fake, ports: [&str; 2], env: &[(&str, &str)], args: &[&str]) -> Output {
    let _one = serial();
    let mut c: Command = fake.cmd(&bin("l2fwd"));
    c.args(["--port", ports[0], "--port", ports[1]])
        .args(["--duration", "0.3", "--stats-interval", "0"])
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run l2fwd")
}

/// Every verbs call of the bring-up, failed in turn as the kernel would fail it: l2fwd exits
/// 1 with a message naming the call, the object and the errno, and every object created
/// before the failure is destroyed again.
#[test]
fn a_failure_at_each_bringup_step_is_clear_and_leaves_nothing_alive() {
    let fake = Fake::new(Some(NO_WIRES));
    // (injected call, what the message must name)
    let steps = [
        ("ibv_open_device", "device mlx5_0"),
        ("ibv_query_device_ex", "device mlx5_0"),
        ("ibv_query_port", "mlx5_0 port 1"),
        ("ibv_alloc_pd", "protection domain"),
        ("ibv_reg_mr", "registering the mbuf pool"),
        ("ibv_create_cq", "tx queue 0 of mlx5_0 port 1: CQ"),
        ("ibv_create_qp_ex", "tx queue 0 of mlx5_0 port 1: QP"),
        (
            "ibv_modify_qp",
            "tx queue 0 of mlx5_0 port 1: QP to state 1",
        ),
        (
            "ibv_modify_qp#3",
            "tx queue 0 of mlx5_0 port 1: QP to state 3",
        ),
        ("mlx5dv_create_cq", "rx queue 0 of mlx5_0 port 1: CQ"),
        ("ibv_create_wq", "rx queue 0 of mlx5_0 port 1: WQ"),
        (
            "ibv_modify_wq",
            "rx queue 0 of mlx5_0 port 1: WQ to state 1",
        ),
        ("ibv_create_rwq_ind_table", "indirection table"),
        ("ibv_create_rwq_ind_table#2", "indirection table"),
        // One hashing QP per traffic type (IPv4/TCP, IPv4/UDP, IPv4, the rest), each with
        // its rules.
        ("ibv_create_qp_ex#2", "hashing QP 0x33 of mlx5_0 port 1"),
        (
            "ibv_create_flow",
            "flow rule dst 02:00:00:00:20:01 / ff:ff:ff:ff:ff:ff ipv4 tcp",
        ),
        (
            "ibv_create_flow#2",
            "flow rule dst ff:ff:ff:ff:ff:ff / ff:ff:ff:ff:ff:ff ipv4 tcp",
        ),
        ("ibv_create_qp_ex#3", "hashing QP 0xc3 of mlx5_0 port 1"),
        ("ibv_create_flow#4", "ff:ff:ff:ff:ff:ff ipv4 udp"),
        ("ibv_create_qp_ex#5", "hashing QP 0x0 of mlx5_0 port 1"),
        (
            "ibv_create_flow#8",
            "flow rule dst ff:ff:ff:ff:ff:ff / ff:ff:ff:ff:ff:ff on hashing QP 0x0",
        ),
        // The second port: the first is torn down as well.
        ("ibv_create_qp_ex#6", "tx queue 0 of mlx5_1 port 1: QP"),
    ];
    // Calls that only touch user-space state (mlx5dv_query_device,
    // mlx5dv_set_context_attr, mlx5dv_init_obj) cannot fail this way and are not listed.
    let mut wrong = Vec::new();
    for (call, names) in steps {
        let o = l2fwd(
            &fake,
            [PORT1, PORT2],
            &[("FAKE_RDMA_FAIL", &format!("{call}:ENOMEM"))],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        let bare = call.split('#').next().unwrap();
        if o.status.code() != Some(1)
            || !err.contains(&format!("{bare} failed"))
            || !err.contains(names)
            || !err.contains("Cannot allocate memory (os error 12)")
            || live_at_exit(&o) != Some(0)
        {
            wrong.push(format!(
                "{call}: want exit 1, the call, {names:?}, the errno and 0 live objects:\n{}",
                text(&o)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The calls of one clean run with l2fwd's `args`, in order, from the fake's trace.
fn traced_calls(fake: &Fake, args: &[&str]) -> (Output, Vec<String>) {
    let trace = fake.dir.path().join("trace.jsonl");
    let _ = std::fs::remove_file(&trace);
    let env = [("FAKE_RDMA_TRACE", trace.to_str().unwrap())];
    let o = l2fwd_args(fake, [PORT1, PORT2], &env, args);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
    let calls = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["errno"], 0, "a call failed in a clean run: {l}");
            v["call"].as_str().unwrap().to_string()
        })
        .collect();
    (o, calls)
}

/// A clean bring-up makes DPDK net/mlx5's Verbs calls in its order (allocators before any
/// queue, the QP taken to RTS and the WQ to RDY before `mlx5dv_init_obj`, the steering rules
/// last), and tears everything down children first.
#[test]
fn bringup_and_teardown_follow_dpdks_order() {
    let fake = Fake::new(Some(NO_WIRES));
    let (_, calls) = traced_calls(&fake, &["--no-promiscuous"]);
    let port = [
        "ibv_get_device_list",
        "ibv_open_device",
        "mlx5dv_is_supported",
        "ibv_query_device_ex",
        "mlx5dv_query_device",
        "ibv_query_port",
        "mlx5dv_set_context_attr",
        "ibv_alloc_pd",
        "ibv_reg_mr",
        "ibv_create_cq",
        "ibv_create_qp_ex",
        "ibv_modify_qp",
        "ibv_modify_qp",
        "ibv_modify_qp",
        "mlx5dv_init_obj",
        "mlx5dv_create_cq",
        "ibv_create_wq",
        "ibv_modify_wq",
        "ibv_create_rwq_ind_table",
        "ibv_create_rwq_ind_table",
        "ibv_create_qp_ex",
        "ibv_create_flow",
        "ibv_create_flow",
        "ibv_create_qp_ex",
        "ibv_create_flow",
        "ibv_create_flow",
        "ibv_create_qp_ex",
        "ibv_create_flow",
        "ibv_create_flow",
        "ibv_create_qp_ex",
        "ibv_create_flow",
        "ibv_create_flow",
        "mlx5dv_init_obj",
    ];
    let seen: Vec<&str> = calls
        .iter()
        .map(String::as_str)
        .filter(|c| port.contains(c))
        .collect();
    // The tools open every port first (device, PD: DPDK's probe), size their mbuf pool from
    // what the ports will get, then configure each (the pool's MR, the queues, the rules).
    let (open, configure) = port.split_at(8);
    let expected: Vec<&str> = [open, open, configure, configure].concat();
    assert_eq!(seen[..2 * port.len()], expected[..], "{calls:?}");
    let teardown = [
        "ibv_destroy_qp",
        "ibv_destroy_cq",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        "ibv_destroy_flow",
        // The three hashing QPs over the port's table, which goes with the last of them;
        // then the one over the first queue's table.
        "ibv_destroy_qp",
        "ibv_destroy_qp",
        "ibv_destroy_qp",
        "ibv_destroy_rwq_ind_table",
        "ibv_destroy_qp",
        "ibv_destroy_rwq_ind_table",
        "ibv_destroy_wq",
        "ibv_destroy_cq",
        "ibv_dereg_mr",
        "ibv_dealloc_pd",
        "ibv_close_device",
    ];
    let down: Vec<&str> = calls
        .iter()
        .map(String::as_str)
        .filter(|c| teardown.contains(c))
        .collect();
    assert_eq!(down[..teardown.len()], teardown, "{calls:?}");
    assert_eq!(down[teardown.len()..], teardown, "{calls:?}");
}

/// l2fwd asks for promiscuous mode by default (as DPDK's l2fwd): one rule per hashing QP
/// (4 per port: IPv4/TCP, IPv4/UDP, IPv4, the rest) that matches every frame of its type
/// instead of the port's MAC and broadcast.
#[test]
fn promiscuous_mode_is_one_catch_all_rule() {
    let fake = Fake::new(Some(NO_WIRES));
    let flows = |args: &[&str]| {
        let (o, calls) = traced_calls(&fake, args);
        let n = calls.iter().filter(|c| *c == "ibv_create_flow").count();
        (n, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (n, _) = flows(&[]);
    assert_eq!(n, 8, "one rule per hashing QP");
    let (n, _) = flows(&["--no-promiscuous"]);
    assert_eq!(n, 16, "MAC and broadcast per hashing QP");
}

/// A port is found by device, by its netdev's MAC or by its netdev's name; a selector that
/// matches nothing lists the ports there are; a MANA device is not an mlx5 port.
#[test]
fn ports_are_found_by_device_mac_or_netdev_and_a_miss_lists_the_ports() {
    let fake = Fake::new(Some(NO_WIRES));
    let o = l2fwd(
        &fake,
        ["mlx5:mac=02:00:00:00:20:01", "mlx5:netdev=eth-mlx5_1-1"],
        &[("PMD_LOG", "pmd::verbs=info")],
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in ["device=mlx5_0", "device=mlx5_1", "mac=02:00:00:00:20:02"] {
        assert!(err.contains(want), "{want}: {}", text(&o));
    }
    let o = l2fwd(&fake, [PORT1, "mlx5:dev=mlx5_7"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        err.contains("no mlx5 port matches dev=mlx5_7")
            && err.contains("mlx5_0 port 1 (eth-mlx5_0-1, 02:00:00:00:20:01)")
            && err.contains("mlx5_1 port 1 (eth-mlx5_1-1, 02:00:00:00:20:02)"),
        "{}",
        text(&o)
    );
    assert_eq!(live_at_exit(&o), Some(0), "{}", text(&o));
}

/// A ConnectX-4 (PCI id 0x1013) needs 18 bytes inline and gets no eMPW; a ConnectX-5 needs
/// none; `inline=N` raises the minimum.
#[test]
fn the_minimum_inline_header_follows_the_device() {
    let fake = Fake::new(Some(
        "mlx5_0/1:mac=02:00:00:00:20:01,wire=none,part=0x1013;\
         mlx5_1/1:mac=02:00:00:00:20:02,wire=none",
    ));
    let o = l2fwd(&fake, [PORT1, PORT2], &[("PMD_LOG", "pmd::verbs=info")]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let opened: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("mlx5 port opened"))
        .collect();
    assert_eq!(opened.len(), 2, "{}", text(&o));
    assert!(
        opened[0].contains("device=mlx5_0")
            && opened[0].contains("part_id=0x1013")
            && opened[0].contains("min_inline=18"),
        "{}",
        text(&o)
    );
    assert!(
        opened[1].contains("device=mlx5_1")
            && opened[1].contains("min_inline=0")
            && opened[1].contains("empw=true"),
        "{}",
        text(&o)
    );
    let o = l2fwd(
        &fake,
        [PORT1, "mlx5:dev=mlx5_1,inline=42"],
        &[("PMD_LOG", "pmd::verbs=info")],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .any(|l| l.contains("device=mlx5_1") && l.contains("min_inline=42")),
        "{}",
        text(&o)
    );
}

/// `frames` UDP frames from pktgen (on `pg_kind` model ports) through l2fwd on two `mlx5:`
/// ports over the fake and back: every frame arrives, nothing lost or dropped, pools whole,
/// no live object left in the fake, every queue buffer its allocators handed out back.
fn forward(frames: u64, pg_kind: &str, extra: &str) {
    let _one = serial();
    let tag = format!("fx{}-{pg_kind}", std::process::id());
    let fake = Fake::new(Some(&format!(
        "mlx5_0/1:mac=02:00:00:00:20:01,wire=shm:{tag}-1;mlx5_1/1:mac=02:00:00:00:20:02,wire=shm:{tag}-2"
    )));
    let shm = fake.shm_dir();
    let mut l2 = fake.cmd(&bin("l2fwd"));
    l2.args([
        "--port",
        &format!("{PORT1}{extra}"),
        "--port",
        &format!("{PORT2}{extra}"),
    ])
    .args(["--duration", "60", "--stats-interval", "0", "--json"])
    .env("PMD_LOG", "pmd::verbs=debug")
    .env("PMD_SHM_DIR", &shm)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let l2 = l2.spawn().expect("start l2fwd");
    let p = integration_tests::own_runtime_dir(&mut Command::new(bin("pktgen")))
        .args(["--port", &format!("{pg_kind}:wire=shm:{tag}-1")])
        .args(["--port", &format!("{pg_kind}:wire=shm:{tag}-2")])
        .args(["--count", &frames.to_string(), "--rate", "2000", "--json"])
        .args(["--link-timeout", "30", "--drain-timeout", "5"])
        .env_remove("PMD_LOG")
        .env("PMD_SHM_DIR", &shm)
        .output()
        .expect("run pktgen");
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
    assert_eq!(live_at_exit(&l), Some(0), "{ctx}");
    assert_eq!(
        String::from_utf8_lossy(&l.stderr)
            .matches("queue-buffer allocators: every buffer given back")
            .count(),
        2,
        "{ctx}"
    );
}

#[test]
fn l2fwd_forwards_every_frame_between_mlx5_ports() {
    forward(4_000, "emu-mlx5", "");
}

/// The mixed topology: pktgen on MANA models, l2fwd on `mlx5:` ports without compressed CQEs.
#[test]
fn l2fwd_on_mlx5_ports_forwards_every_frame_from_mana_models() {
    forward(4_000, "emu-mana", ",cqe-comp=0");
}
