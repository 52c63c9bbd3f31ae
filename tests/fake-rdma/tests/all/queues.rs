//! Several queues per context under traffic, through the fake rdma-core: the unchanged l2fwd
//! on two `mana:` (then `mlx5:`) ports with 4 RX and 4 TX queues each, pktgen sending 64
//! flows from device-model ports at the far ends of the wires:
//!
//!   pktgen (emu) --wire 1--> l2fwd port 0 (fake, 4 RQs) -> l2fwd port 1 (fake, 4 SQs)
//!                                                          --wire 2--> pktgen
//!
//! Every frame arrives and is counted once on each side, nothing is lost or dropped, the
//! pool is whole; RSS spreads the flows over all 4 RX queues of port 0 (each receives, the
//! queues' counts add up to the frames sent), and every TX queue of port 1 that a polling
//! core owns sends.
//!
//! How the fake hands out doorbells for the queues of one context:
//! * MANA: one doorbell page per context, as libmana's `mana_alloc_context` maps it:
//!   `ibv_open_device` maps the page and `manadv_init_obj` hands the same `db_page` to every
//!   send QP and every WQ of the context. The device model watches that one page for all of
//!   them (`pmd::emu::mana::DoorbellPage`): every SQ rings the page's SQ slot and every RQ
//!   its RQ slot, each value carrying the queue id and its absolute producer position. Here
//!   the 4 RQs of port 0 ring one RQ slot (their first rings back to back, when the port is
//!   configured), and the SQs of port 1 one SQ slot, from as many polling threads as l2fwd
//!   has lcores. The model samples the page rather than taking each write as an event, so a
//!   doorbell a sibling overwrote before the model looked is missed until its queue rings
//!   again. An RQ whose first doorbell is missed never rings again (it receives nothing to
//!   refill), and the inline model then takes no frame off the wire at all: the driver
//!   kicks the device after each queue's first fill so that the model latches it at once.
//!   This test shows that no frame is lost or stuck through a shared page, at this rate.
//! * mlx5: each queue has its own doorbell record (libmlx5's `dbrec.c` allocator puts
//!   several records on one page), and the device model watches the records, so siblings
//!   never overwrite each other's doorbell; the QPs' BlueFlame registers (two per UAR page,
//!   pages allocated on demand) are plain memory the model does not read.
//!
//! TX queues: l2fwd sends from each lcore on that lcore's TX queue of the egress port, so
//! only as many TX queues send as l2fwd has lcores, and its lcores are distinct CPUs
//! (`CoreList` refuses a CPU twice). The ports are asked for 4 TX queues (`txq=4`) and
//! l2fwd polls on up to 4 of the CPUs this process may use: on a 2-CPU machine 2 of the 4
//! TX queues send, and the other 2 exist on the page and stay idle.

use crate::common;
use crate::common::serial;
use crate::common::{bin, live_at_exit, text, Fake, Pair};
use std::process::{Command, Stdio};

/// Frames pktgen sends through l2fwd.
const FRAMES: u64 = 20_000;

/// pktgen's rate, as in `mana_port.rs` and `watch.rs`: the 256-descriptor rings (rdma-core
/// v44's maximum for MANA) hold 128 ms of traffic, so l2fwd's lcores, pktgen and the device
/// models may share 2 busy cores without a ring running over.
const RATE: u64 = 2_000;

/// RX queues of every l2fwd port, and TX queues asked for in the devargs.
const QUEUES: usize = 4;

/// Distinct 5-tuples pktgen sends.
const FLOWS: u32 = 64;

/// Up to [`QUEUES`] of the CPUs this process may run on, as an `--lcores` list: l2fwd's
/// polling cores, one TX queue each.
fn lcores() -> Vec<usize> {
    let mut cpus = pmd::lcore::available_cores();
    cpus.truncate(QUEUES);
    assert!(!cpus.is_empty(), "no CPU to poll on");
    cpus
}

/// The `packets` of each queue in a port's `rx_queues` or `tx_queues` (l2fwd's report).
fn per_queue(stats: &serde_json::Value, dir: &str) -> Vec<u64> {
    stats[dir]
        .as_array()
        .unwrap_or_else(|| panic!("no {dir} in {stats}"))
        .iter()
        .map(|q| q["packets"].as_u64().expect("packets"))
        .collect()
}

/// l2fwd on `pair`'s ports ([`QUEUES`] RX and TX queues each) forwarding what pktgen,
/// run with `traffic`, sends: `frames` frames, each arriving and counted once. Returns
/// l2fwd's report, its output and the context for messages.
fn forward(
    pair: &Pair,
    cores: &[usize],
    frames: u64,
    traffic: &[&str],
) -> (serde_json::Value, std::process::Output, String) {
    let fake = Fake::new(Some(&pair.world));
    let shm = fake.shm_dir();
    let list: Vec<String> = cores.iter().map(usize::to_string).collect();
    let ports = pair.l2fwd.map(|p| format!("{p},rxq={QUEUES},txq={QUEUES}"));

    let mut l2 = fake.cmd(&bin("l2fwd"));
    l2.args(["--port", &ports[0], "--port", &ports[1]])
        .args(["--lcores", &list.join(",")])
        .args(["--duration", "120", "--stats-interval", "0", "--json"])
        .env("PMD_LOG", "pmd::verbs=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let l2 = l2.spawn().expect("start l2fwd");
    let p = integration_tests::own_runtime_dir(&mut Command::new(bin("pktgen")))
        .args(["--port", &pair.pktgen[0], "--port", &pair.pktgen[1]])
        .args(["--count", &frames.to_string(), "--rate", &RATE.to_string()])
        .args(traffic)
        .args(["--json", "--no-telemetry", "--link-timeout", "30"])
        .args(["--drain-timeout", "5"])
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
    assert_eq!(lj["rx_packets"], frames, "{ctx}");
    assert_eq!(lj["tx_packets"], frames, "{ctx}");
    assert_eq!(lj["dropped"], 0, "{ctx}");
    assert_eq!(lj["pool_in_use"], 0, "the pool is whole: {ctx}");
    assert_eq!(live_at_exit(&l), Some(0), "{ctx}");
    assert_eq!(
        String::from_utf8_lossy(&l.stderr)
            .matches("queue-buffer allocators: every buffer given back")
            .count(),
        2,
        "{ctx}"
    );
    (lj, l, ctx)
}

/// [`FRAMES`] frames of [`FLOWS`] flows from pktgen through l2fwd on `pair`, whose ports
/// have [`QUEUES`] RX and TX queues each.
fn spread(nic: &str, pair: impl Fn(&str) -> Pair) {
    let _one = serial();
    let tag = format!("q{nic}{}", std::process::id());
    let pair = pair(&tag);
    let cores = lcores();
    let list: Vec<String> = cores.iter().map(usize::to_string).collect();
    // The flows differ only in their UDP source port: spread over the queues, they show
    // that the ports hash UDP ports (an `mlx5:` port with one hashing QP, which a TIR
    // limits to one L4 protocol, hashed UDP frames by their addresses only: one queue).
    let (lj, _, ctx) = forward(&pair, &cores, FRAMES, &["--flows", &FLOWS.to_string()]);

    let stats = [&lj["ports"][0]["stats"], &lj["ports"][1]["stats"]];
    let rx = per_queue(stats[0], "rx_queues");
    let tx = per_queue(stats[1], "tx_queues");
    eprintln!("{nic}: lcores {list:?}; port 0 rx per queue {rx:?}; port 1 tx per queue {tx:?}");
    // RSS: every RX queue of the receiving port took frames, and they add up.
    assert_eq!(rx.len(), QUEUES, "port 0's RX queues: {ctx}");
    assert!(
        rx.iter().all(|&n| n > 0),
        "an RX queue of port 0 received nothing: {rx:?}: {ctx}"
    );
    assert_eq!(rx.iter().sum::<u64>(), FRAMES, "port 0 rx {rx:?}: {ctx}");
    // Every lcore forwarded on its own TX queue of port 1; the queues no lcore owns are idle.
    assert_eq!(tx.len(), QUEUES, "port 1's TX queues (txq={QUEUES}): {ctx}");
    let (used, idle) = tx.split_at(cores.len());
    assert!(
        used.iter().all(|&n| n > 0) && idle.iter().all(|&n| n == 0),
        "port 1 tx per queue {tx:?} with {} lcores: {ctx}",
        cores.len()
    );
    assert_eq!(tx.iter().sum::<u64>(), FRAMES, "port 1 tx {tx:?}: {ctx}");
    // Nothing the other way.
    assert_eq!(per_queue(stats[1], "rx_queues").iter().sum::<u64>(), 0);
    assert_eq!(per_queue(stats[0], "tx_queues").iter().sum::<u64>(), 0);
}

/// 4 RQs of `mana_0` port 1 ring one doorbell page (their context's), its SQs another's:
/// every frame arrives, spread over every RX queue.
#[test]
fn four_queues_per_mana_port_share_the_traffic_and_lose_nothing() {
    spread("mana", Pair::mana);
}

/// 4 RQs and SQs per `mlx5:` port, each with its own doorbell record.
#[test]
fn four_queues_per_mlx5_port_share_the_traffic_and_lose_nothing() {
    spread("mlx5", Pair::mlx5);
}

/// Microsoft's RSS verification tuples (source, destination), sent as TCP, UDP and ICMP.
type Endpoint = ([u8; 4], u16);
const TUPLES: [(Endpoint, Endpoint); 5] = [
    (([66, 9, 149, 187], 2794), ([161, 142, 100, 80], 1766)),
    (([199, 92, 111, 2], 14230), ([65, 69, 140, 83], 4739)),
    (([24, 19, 198, 95], 12898), ([12, 22, 207, 184], 38024)),
    (([38, 27, 205, 30], 48228), ([209, 142, 163, 6], 2217)),
    (([153, 39, 163, 191], 44251), ([202, 188, 127, 2], 1303)),
];

/// Their Toeplitz hashes under DPDK's default key (pmd's default), over the addresses and
/// over the addresses and ports: golden data computed outside this project, by DPDK's own
/// `rte_softrss` (`rte_thash.h` of Debian's dpdk-dev 22.11) on the tuples in host order.
const GOLDEN: [(u32, u32); 5] = [
    (0x27cc_1570, 0x85d3_6feb),
    (0x4ad6_a48c, 0xaaef_97ac),
    (0xa709_f56d, 0x8b7d_dcf5),
    (0x502f_c7e3, 0x4514_1288),
    (0xf67a_7ce1, 0x1dea_abe7),
];

/// Each traffic type on an `mlx5:` port hashes its own fields, on its own hashing QP: TCP
/// and UDP frames their 4-tuple, ICMP its addresses, ARP and IPv6 (a family the port does
/// not hash) nothing (the first queue). The queue of each frame is the golden hash's low
/// bits over the 4-entry table, and l2fwd's per-queue counts must equal those exactly.
/// One hashing QP (TCP and IPv4, the old driver) put the UDP frames where their addresses
/// hash.
#[test]
fn mlx5_queues_follow_dpdks_hashes_of_each_traffic_type() {
    let _one = serial();
    let tag = format!("qg{}", std::process::id());
    let pair = Pair::mlx5(&tag);
    let dst_mac = [2, 0, 0, 0, 0x20, 1];
    let src_mac = [2, 0, 0, 0, 0x30, 1];
    let mut frames: Vec<(Vec<u8>, usize)> = Vec::new();
    let eth = || etherparse::PacketBuilder::ethernet2(src_mac, dst_mac);
    for (((src, sport), (dst, dport)), (ip_hash, l4_hash)) in TUPLES.into_iter().zip(GOLDEN) {
        let l4 = (l4_hash & 3) as usize;
        let mut f = Vec::new();
        eth()
            .ipv4(src, dst, 64)
            .tcp(sport, dport, 1, 1000)
            .write(&mut f, &[0; 8])
            .unwrap();
        frames.push((f, l4));
        let mut f = Vec::new();
        eth()
            .ipv4(src, dst, 64)
            .udp(sport, dport)
            .write(&mut f, &[0; 8])
            .unwrap();
        frames.push((f, l4));
        let mut f = Vec::new();
        eth()
            .ipv4(src, dst, 64)
            .icmpv4_echo_request(1, 1)
            .write(&mut f, &[0; 8])
            .unwrap();
        frames.push((f, (ip_hash & 3) as usize));
    }
    let mut f = Vec::new();
    eth()
        .ipv6(
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            64,
        )
        .udp(1000, 2000)
        .write(&mut f, &[0; 8])
        .unwrap();
    frames.push((f, 0));
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&src_mac);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.resize(60, 0);
    frames.push((arp, 0));

    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("types.pcap");
    let mut w = pcap_file::pcap::PcapWriter::new(std::fs::File::create(&pcap).unwrap()).unwrap();
    for (f, _) in &frames {
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            std::time::Duration::ZERO,
            f.len() as u32,
            f,
        ))
        .unwrap();
    }
    drop(w);
    const ROUNDS: u64 = 20;
    let mut want = [0u64; QUEUES];
    for (_, q) in &frames {
        want[*q] += ROUNDS;
    }
    let total = ROUNDS * frames.len() as u64;
    let (lj, _, ctx) = forward(&pair, &lcores(), total, &["--pcap", pcap.to_str().unwrap()]);
    let rx = per_queue(&lj["ports"][0]["stats"], "rx_queues");
    eprintln!("port 0 rx per queue {rx:?}, want {want:?}");
    assert_eq!(rx, want, "{ctx}");
}
