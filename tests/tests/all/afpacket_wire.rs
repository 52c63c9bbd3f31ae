//! The afpacket wire (memory-mapped AF_PACKET rings) against real Linux interfaces:
//!
//! * VLAN tags: a peer in a namespace sends 20 tagged frames (802.1Q and 802.1ad) on its
//!   veth end; all 20 arrive with their tag, at the wire and at `emu-mana` and `emu-mlx5`
//!   ports (the receiving kernel takes the tag out of every frame; the wire puts it back).
//!   The peer sends with the `wire_send` helper, not a VLAN subinterface, so that the test
//!   runs where the kernel has no 802.1Q module.
//! * Drops are counted where they happen: frames the kernel could not put on a full receive
//!   ring are the port's imissed (and its `wire_rx_drops` xstat), and every frame sent is
//!   either received or counted; a full transmit ring is counted by the wire
//!   (`wire_tx_ring_full`) and by the model that sent (`dev_tx_wire_drops`).
//!
//! Needs root (CAP_NET_ADMIN, CAP_NET_RAW) and `ip`; skipped with a message otherwise
//! (unless PMD_REQUIRE_PRIVILEGED is set). The namespace is made and removed by
//! [`integration_tests::Netns`]; veth ends this process must open live in its own namespace
//! under pid-unique names and are deleted on drop.

use integration_tests::{eventually, ip, Netns};
use mempool::{MbufPool, MbufPoolConfig};
use pmd::emu::testing;
use pmd::emu::wire::{AfPacket, Wire};
use pmd::port::{probe, Burst, Port, PortConfig, Stats};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OUR_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x42, 0x00, 0x01];
const NS_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x42, 0x00, 0x02];
const VID: u16 = 42;
const FRAMES: u16 = 20;

fn skip(test: &str, why: &str) {
    assert!(
        std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
        "PMD_REQUIRE_PRIVILEGED is set but {test}: {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// A veth pair in this process's network namespace, deleted on drop: `.0` is the end the
/// wire under test opens.
struct Veth(String, String);

impl Veth {
    fn create(tag: &str) -> Option<Self> {
        let id = std::process::id() % 100_000;
        let v = Veth(format!("pmd{tag}{id}a"), format!("pmd{tag}{id}b"));
        if !ip(&["link", "add", &v.0, "type", "veth", "peer", "name", &v.1]) {
            return None;
        }
        for end in [&v.0, &v.1] {
            // No IPv6 link-local address, so no frame but the test's crosses the pair.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{end}/disable_ipv6"), "1");
        }
        Some(v)
    }

    fn set(&self, end: &str, state: &str) {
        assert!(
            ip(&["link", "set", end, state]),
            "ip link set {end} {state}"
        );
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.0]);
    }
}

/// A namespace whose veth end `pmdvn0` (MAC [`NS_MAC`]) sends frames with
/// [`Peer::send`]; the other end, in this process's namespace, is `.host_if` (up). No IPv6
/// anywhere, so nothing else crosses the pair.
struct Peer {
    ns: Netns,
    host_if: String,
}

impl Peer {
    /// `tag` (one letter) tells apart the peers of tests running at the same time.
    fn create(test: &str, tag: &str) -> Option<Self> {
        let ns = Netns::create(&format!("vlan{tag}"))?;
        let host_if = format!("pmdv{tag}{}", std::process::id() % 100_000);
        let made = ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", "pmdvn0", "netns", &ns.name,
        ]);
        if !made {
            skip(test, "cannot create a veth pair into a namespace here");
            return None;
        }
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6"),
            "1",
        );
        let sysctl = |key: &str| {
            std::process::Command::new("ip")
                .args(["netns", "exec", &ns.name, "sh", "-c"])
                .arg(format!(
                    "echo 1 > /proc/sys/net/ipv6/conf/{key}/disable_ipv6"
                ))
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(
            sysctl("all") && sysctl("default"),
            "disable IPv6 in {}",
            ns.name
        );
        let mac = NS_MAC.map(|b| format!("{b:02x}")).join(":");
        assert!(ns.ip(&["link", "set", "pmdvn0", "address", &mac, "up"]));
        assert!(ip(&["link", "set", &host_if, "up"]));
        Some(Self { ns, host_if })
    }

    /// Sends `frames` from the namespace's end, as they are (the `wire_send` helper, run
    /// in the namespace).
    fn send(&self, frames: &[Vec<u8>]) {
        let hex: Vec<String> = frames
            .iter()
            .map(|f| f.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        let out = self
            .ns
            .exec(std::path::Path::new(env!("CARGO_BIN_EXE_wire_send")))
            .arg("pmdvn0")
            .args(&hex)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "wire_send in {}: {}",
            self.ns.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Frame `i` of the [`FRAMES`] the peer sends: to [`OUR_MAC`], behind an 802.1Q tag (or,
/// when `qinq`, an 802.1ad one for odd `i`) with VID 42 and PCP `i % 8`, then an EtherType
/// from the local experimental range and the frame's number.
fn tagged(i: u16, qinq: bool) -> Vec<u8> {
    let tpid: u16 = if qinq && i % 2 == 1 { 0x88a8 } else { 0x8100 };
    let tci = ((i % 8) << 13) | VID;
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&OUR_MAC);
    f.extend_from_slice(&NS_MAC);
    f.extend_from_slice(&tpid.to_be_bytes());
    f.extend_from_slice(&tci.to_be_bytes());
    f.extend_from_slice(&[0x88, 0xb5]);
    f.extend_from_slice(&i.to_be_bytes());
    f.resize(64, 0xa5);
    f
}

/// The number of a frame of ours (see [`tagged`]), wherever its tag is (or is not).
fn number(frame: &[u8]) -> Option<u16> {
    let at = (12..frame.len().saturating_sub(3))
        .step_by(4)
        .find(|&k| frame[k..k + 2] == [0x88, 0xb5])?;
    Some(u16::from_be_bytes([frame[at + 2], frame[at + 3]]))
}

/// Collects frames of ours until all [`FRAMES`] came (or 5 s passed), in number order.
fn collect(mut next: impl FnMut(&mut Vec<Vec<u8>>)) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < usize::from(FRAMES) && t0.elapsed() < Duration::from_secs(5) {
        next(&mut got);
        std::thread::sleep(Duration::from_millis(1));
    }
    got.sort_by_key(|f| number(f));
    got
}

#[test]
fn tagged_frames_keep_their_tag_through_the_wire() {
    let test = "tagged_frames_keep_their_tag_through_the_wire";
    let Some(peer) = Peer::create(test, "w") else {
        return;
    };
    let mut wire = AfPacket::open(&peer.host_if).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || wire.peer_attached()),
        "the veth has carrier"
    );
    // The receiving kernel takes every tag out of the frame (802.1Q and 802.1ad alike):
    // the wire must put each back, TPID, PCP and VID.
    let sent: Vec<Vec<u8>> = (0..FRAMES).map(|i| tagged(i, true)).collect();
    peer.send(&sent);
    let mut buf = vec![0u8; 2048];
    let got = collect(|got| {
        while let Some(n) = wire.recv(&mut buf) {
            if number(&buf[..n]).is_some() {
                got.push(buf[..n].to_vec());
            }
        }
    });
    assert_eq!(
        got, sent,
        "all {FRAMES} frames, each as it was sent, tag in place"
    );
    assert_eq!(pmd::emu::wire::rx_drops(&wire.stats()), 0);
}

/// A port over a model of `kind` (`mana` or `mlx5`) on `afpacket:ifname`, started, with its
/// queues: what l2fwd opens for `emu-mana:wire=afpacket:IF` / `emu-mlx5:...`.
fn afpacket_port(
    kind: &str,
    ifname: &str,
    pool: &Arc<MbufPool>,
) -> (Port, pmd::port::RxQueue, pmd::port::TxQueue) {
    let spec = format!("emu-{kind}:wire=afpacket:{ifname},mac=02:00:00:42:00:01")
        .parse()
        .unwrap();
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    Port::open_started(0, &spec, &cfg, pool).unwrap()
}

#[test]
fn tagged_frames_reach_both_models_with_their_tag() {
    let test = "tagged_frames_reach_both_models_with_their_tag";
    for kind in ["mana", "mlx5"] {
        let Some(peer) = Peer::create(test, &kind[1..2]) else {
            return;
        };
        let pool = MbufPool::new(MbufPoolConfig::new("vlan", 1024)).unwrap();
        let (port, mut rx, tx) = afpacket_port(kind, &peer.host_if, &pool);
        assert!(
            eventually(Duration::from_secs(5), || port.link().up),
            "{kind}: link up"
        );
        let sent: Vec<Vec<u8>> = (0..FRAMES).map(|i| tagged(i, false)).collect();
        peer.send(&sent);
        let mut b = Burst::with_capacity(32);
        let got = collect(|got| {
            rx.rx_burst(&mut b);
            while let Some(m) = b.pop() {
                if number(m.data()).is_some() {
                    got.push(m.data().to_vec());
                }
                mempool::lcache::free(&pool, m);
            }
        });
        // Without VLAN stripping a port hands a frame over with its tag in place; a MANA
        // device reports only the VID of the tag it took out, so its priority comes back 0.
        let vid_only = |f: &Vec<u8>| {
            let mut f = f.clone();
            f[14] &= 0x0f;
            f
        };
        assert_eq!(
            got.iter().map(vid_only).collect::<Vec<_>>(),
            sent.iter().map(vid_only).collect::<Vec<_>>(),
            "{kind}: all {FRAMES} frames arrived at the port with VLAN {VID}"
        );
        drop((rx, tx));
        mempool::lcache::flush();
        drop(port);
        assert_eq!(pool.in_use(), 0);
    }
}

fn xstat(s: &Stats, name: &str) -> u64 {
    s.xstats
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no xstat {name} in {:?}", s.xstats))
        .1
}

/// A frame of ours, numbered `i` (an EtherType from the local experimental range).
fn marked(i: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..6].copy_from_slice(&OUR_MAC);
    f[6..12].copy_from_slice(&NS_MAC);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14..18].copy_from_slice(&i.to_be_bytes());
    f
}

#[test]
fn frames_the_kernel_could_not_ring_are_the_ports_imissed() {
    let test = "frames_the_kernel_could_not_ring_are_the_ports_imissed";
    let Some(veth) = Veth::create("rd") else {
        skip(test, "cannot create a veth pair here (needs root)");
        return;
    };
    veth.set(&veth.0, "up");
    veth.set(&veth.1, "up");
    let pool = MbufPool::new(MbufPoolConfig::new("rd", 2048)).unwrap();
    let (port, mut rx, _tx, step) = paused_model_port("mana", &veth.0, &pool, 256, 64);

    // The model does not run: what the sender puts on the cable fills the kernel's
    // receive ring (about 5,000 frames at MTU 1500), and the rest is dropped there.
    let mut sender = AfPacket::open(&veth.1).unwrap();
    const SENT: u32 = 8000;
    for i in 0..SENT {
        // A transmit ring full for a moment (the kernel still holds its frames) is no loss
        // here: go again.
        let t0 = Instant::now();
        while !sender.send(&marked(i)) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "frame {i} never went"
            );
            sender.flush();
            std::thread::yield_now();
        }
    }
    sender.flush();

    let s = port.stats();
    let ring_drops = xstat(&s, "wire_rx_drops");
    assert!(
        ring_drops > 0 && ring_drops < u64::from(SENT),
        "{ring_drops} of {SENT} dropped by the kernel"
    );
    assert_eq!(s.imissed, ring_drops, "imissed is what the ring dropped");
    assert_eq!(xstat(&s, "wire_rx_socket_frames"), u64::from(SENT));

    // Step the model and drain: every frame is either received or counted as missed.
    let mut received = 0u64;
    let mut next = 0u32;
    let mut b = Burst::with_capacity(64);
    let t0 = Instant::now();
    while received + port.stats().imissed < u64::from(SENT)
        && t0.elapsed() < Duration::from_secs(20)
    {
        step();
        rx.rx_burst(&mut b);
        let n = b.len();
        for m in b.drain_front(n) {
            let i = u32::from_be_bytes(m.data()[14..18].try_into().unwrap());
            assert_eq!(i, next, "the ring keeps the order of the cable");
            next += 1;
            received += 1;
            mempool::lcache::free(&pool, m);
        }
    }
    let s = port.stats();
    assert_eq!(received + s.imissed, u64::from(SENT), "{:?}", s.xstats);
    assert_eq!(s.imissed, ring_drops, "stepping in time lost nothing more");
    assert_eq!(xstat(&s, "dev_rx_no_wqe"), 0);
    drop(rx);
    mempool::lcache::flush();
}

#[test]
fn a_full_transmit_ring_is_counted_by_the_wire_and_the_sending_model() {
    let test = "a_full_transmit_ring_is_counted_by_the_wire_and_the_sending_model";
    let Some(veth) = Veth::create("tf") else {
        skip(test, "cannot create a veth pair here (needs root)");
        return;
    };
    // The interface stays down: the kernel refuses every kick, so the transmit ring fills.
    let pool = MbufPool::new(MbufPoolConfig::new("tf", 1024)).unwrap();
    let (port, _rx, mut tx, step) = paused_model_port("mana", &veth.0, &pool, 64, 256);
    const SENT: u64 = 4000; // more than the 4 MiB transmit ring holds (2,592 slots)
    let mut b = Burst::with_capacity(64);
    let mut sent = 0u64; // frames the port took: SENT and up to a burst more
    while sent < SENT {
        while b.len() < 64 {
            let mut m = mempool::lcache::alloc(&pool).unwrap();
            m.extend_from_slice(&marked(sent as u32 + b.len() as u32))
                .unwrap();
            b.push(m).unwrap();
        }
        sent += tx.tx_burst(&mut b) as u64;
        while step() > 0 {}
    }
    mempool::lcache::with_cache(&pool, |c| b.free_all(c));
    while step() > 0 {}
    let s = port.stats();
    let full = xstat(&s, "wire_tx_ring_full");
    assert!(full > 0, "{:?}", s.xstats);
    assert_eq!(
        xstat(&s, "dev_tx_wire_drops"),
        full,
        "the model counts every frame its wire refused"
    );
    assert_eq!(xstat(&s, "dev_tx_frames") + full, sent);
    assert!(
        xstat(&s, "wire_tx_kick_errors") > 0,
        "the kernel refused the kicks"
    );
    drop(tx);
    mempool::lcache::flush();
}

/// A model port (`mana` or `mlx5`) on `afpacket:ifname` whose engine only runs when
/// stepped, started, with its queues and a stepper.
fn paused_model_port(
    kind: &str,
    ifname: &str,
    pool: &Arc<MbufPool>,
    rx_ring_size: u16,
    tx_ring_size: u16,
) -> (
    Port,
    pmd::port::RxQueue,
    pmd::port::TxQueue,
    Box<dyn Fn() -> usize>,
) {
    let wire = format!("afpacket:{ifname}");
    let (mut port, step): (Port, Box<dyn Fn() -> usize>) = match kind {
        "mana" => {
            let (model, h) = testing::mana(&wire, 0).unwrap();
            h.pause();
            let port = probe::mana(0, wire.clone(), Box::new(model), Default::default());
            (port, Box::new(move || h.step()))
        }
        _ => {
            let (model, h) = testing::mlx5(&wire, 0, 0).unwrap();
            h.pause();
            let port = probe::mlx5(0, wire.clone(), Box::new(model));
            (port, Box::new(move || h.step()))
        }
    };
    let cfg = PortConfig::default()
        .with_ring_sizes(rx_ring_size, tx_ring_size)
        // The test's frames are for another MAC: an mlx5 port takes them in promiscuous
        // mode (a MANA port has none, and its model does not filter).
        .with_promiscuous(kind == "mlx5");
    port.configure(&cfg, pool).unwrap();
    let rx = port.rx_queue(0).unwrap();
    let tx = port.tx_queue(0).unwrap();
    port.start().unwrap();
    (port, rx, tx, step)
}

#[test]
fn a_model_with_no_buffer_posted_leaves_frames_in_the_kernel_ring() {
    let test = "a_model_with_no_buffer_posted_leaves_frames_in_the_kernel_ring";
    for kind in ["mana", "mlx5"] {
        let Some(veth) = Veth::create(&format!("h{}", &kind[1..2])) else {
            skip(test, "cannot create a veth pair here (needs root)");
            return;
        };
        veth.set(&veth.0, "up");
        veth.set(&veth.1, "up");
        let pool = MbufPool::new(MbufPoolConfig::new("hold", 1024)).unwrap();
        let (port, mut rx, _tx, step) = paused_model_port(kind, &veth.0, &pool, 64, 64);
        let mut sender = AfPacket::open(&veth.1).unwrap();
        const SENT: u32 = 1000; // far less than the kernel ring holds
        for i in 0..SENT {
            assert!(sender.send(&marked(i)));
        }
        sender.flush();
        // Nobody polls: the model fills its 64 RX buffers and leaves the rest on the wire.
        for _ in 0..100 {
            step();
        }
        let s = port.stats();
        assert_eq!(
            s.imissed, 0,
            "{kind}: nothing lost while the host did not poll"
        );
        assert_eq!(xstat(&s, "dev_rx_no_wqe"), 0, "{kind}");
        let delivered = xstat(&s, "dev_rx_frames");
        assert!(
            (1..=64).contains(&delivered),
            "{kind}: {delivered} frames taken with 64 buffers posted"
        );
        // The host polls: every frame comes, in order.
        let mut next = 0u32;
        let mut b = Burst::with_capacity(64);
        let t0 = Instant::now();
        while next < SENT && t0.elapsed() < Duration::from_secs(20) {
            step();
            rx.rx_burst(&mut b);
            let n = b.len();
            for m in b.drain_front(n) {
                let i = u32::from_be_bytes(m.data()[14..18].try_into().unwrap());
                assert_eq!(i, next, "{kind}: in order, none lost");
                next += 1;
                mempool::lcache::free(&pool, m);
            }
        }
        assert_eq!(next, SENT, "{kind}");
        assert_eq!(port.stats().imissed, 0, "{kind}");
        drop(rx);
        mempool::lcache::flush();
        drop(port);
        assert_eq!(pool.in_use(), 0, "{kind}");
    }
}
