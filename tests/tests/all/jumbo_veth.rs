//! Jumbo frames with the Linux kernel as the peer: a veth pair at MTU 9000 whose far end
//! lives in a network namespace (link-local address); `emu-mana` and `emu-mlx5` ports at MTU
//! 9000 attach to the near end through the afpacket wire. An echo request of 9014 bytes (a
//! 9000-byte IPv4 packet) that we send is answered by the namespace's kernel with a reply of
//! the same size, unfragmented: jumbo frames cross the wire both ways, byte for byte.
//!
//! Needs root (CAP_NET_ADMIN, CAP_NET_RAW) and `ip`; skipped with a message otherwise
//! (unless PMD_REQUIRE_PRIVILEGED is set). The namespace is made and removed by
//! [`integration_tests::Netns`]; the veth end in this process's namespace has a pid-unique
//! name and goes with the namespace.

use integration_tests::{ip, Netns};
use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig};
use std::time::{Duration, Instant};

const OUR_IP: [u8; 4] = [169, 254, 79, 1];
const NS_IP: [u8; 4] = [169, 254, 79, 2];
const OUR_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x79, 0x00, 0x01];
const NS_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x79, 0x00, 0x02];
const MTU: u16 = 9000;
/// ICMP payload of a 9000-byte IPv4 packet: 9000 - 20 (IPv4) - 8 (ICMP).
const PAYLOAD: usize = 8972;

fn mac_text(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// A namespace whose veth end `pmdjn0` ([`NS_MAC`], [`NS_IP`], MTU 9000) knows our MAC;
/// the other end, `.host_if`, is in this process's namespace, up, at MTU 9000.
struct Peer {
    _ns: Netns,
    host_if: String,
}

impl Peer {
    fn create(test: &str) -> Option<Self> {
        let ns = Netns::create("jumbo")?;
        let host_if = format!("pmdj{}", std::process::id() % 100_000);
        let made = ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", "pmdjn0", "netns", &ns.name,
        ]);
        if !made {
            assert!(
                std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
                "PMD_REQUIRE_PRIVILEGED is set but {test}: cannot create a veth pair"
            );
            eprintln!("SKIPPED {test}: cannot create a veth pair into a namespace here");
            return None;
        }
        // No IPv6 on our end: only the test's frames cross the pair.
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6"),
            "1",
        );
        let mtu = MTU.to_string();
        let our = format!("{}.{}.{}.{}", OUR_IP[0], OUR_IP[1], OUR_IP[2], OUR_IP[3]);
        let theirs = format!("{}.{}.{}.{}/24", NS_IP[0], NS_IP[1], NS_IP[2], NS_IP[3]);
        let ns_mac = mac_text(NS_MAC);
        let our_mac = mac_text(OUR_MAC);
        let steps: [&[&str]; 4] = [
            &[
                "link", "set", "pmdjn0", "address", &ns_mac, "mtu", &mtu, "up",
            ],
            &["addr", "add", &theirs, "dev", "pmdjn0"],
            // The namespace knows our MAC: it needs no ARP answer from us.
            &[
                "neigh",
                "add",
                &our,
                "lladdr",
                &our_mac,
                "nud",
                "permanent",
                "dev",
                "pmdjn0",
            ],
            &["link", "set", "lo", "up"],
        ];
        for s in steps {
            assert!(ns.ip(s), "ip {s:?} in {}", ns.name);
        }
        // The wire sizes its ring slots from the interface's MTU when it opens: set it first.
        assert!(ip(&["link", "set", &host_if, "mtu", &mtu, "up"]));
        Some(Self { _ns: ns, host_if })
    }
}

/// Sends a 9014-byte echo request on a `kind` port at MTU 9000 until the namespace's 9014-byte
/// reply arrives (at most 10 s); checks the reply byte for byte and that every buffer is back.
fn jumbo_ping(peer: &Peer, kind: &str) {
    let pool =
        MbufPool::new(MbufPoolConfig::new(format!("jumbo-veth-{kind}"), 1023).data_room(9024))
            .unwrap();
    let spec = format!(
        "{kind}:wire=afpacket:{},mac={}",
        peer.host_if,
        mac_text(OUR_MAC)
    )
    .parse()
    .unwrap();
    let cfg = PortConfig::default()
        .with_ring_sizes(256, 256)
        .with_mtu(MTU);
    let (port, mut rx, mut tx) = Port::open_started(0, &spec, &cfg, &pool).unwrap();
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i * 7 + 3) as u8).collect();
    let mut request = Vec::new();
    etherparse::PacketBuilder::ethernet2(OUR_MAC, NS_MAC)
        .ipv4(OUR_IP, NS_IP, 64)
        .icmpv4_echo_request(0x4a4a, 1)
        .write(&mut request, &payload)
        .unwrap();
    assert_eq!(request.len(), 9014);
    let mut reply = None;
    let mut b = Burst::with_capacity(32);
    let t0 = Instant::now();
    let mut last_send: Option<Instant> = None;
    while reply.is_none() && t0.elapsed() < Duration::from_secs(10) {
        if last_send.is_none_or(|t| t.elapsed() > Duration::from_millis(500)) {
            let mut out = Burst::with_capacity(1);
            let mut m = mempool::lcache::alloc(&pool).unwrap();
            m.extend_from_slice(&request).unwrap();
            out.push(m).unwrap();
            assert_eq!(
                tx.tx_burst(&mut out),
                1,
                "{kind}: the queue takes the request"
            );
            last_send = Some(Instant::now());
        }
        rx.rx_burst(&mut b);
        while let Some(m) = b.pop() {
            let f = m.data().to_vec();
            mempool::lcache::free(&pool, m);
            let Ok(p) = etherparse::SlicedPacket::from_ethernet(&f) else {
                continue;
            };
            if let (
                Some(etherparse::NetSlice::Ipv4(ip)),
                Some(etherparse::TransportSlice::Icmpv4(icmp)),
            ) = (&p.net, &p.transport)
            {
                if ip.header().source() == NS_IP
                    && matches!(icmp.icmp_type(), etherparse::Icmpv4Type::EchoReply(h) if h.id == 0x4a4a)
                {
                    reply = Some((f.len(), ip.header().total_len(), icmp.payload() == payload));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = port.stats();
    assert_eq!(
        reply,
        Some((9014, 9000, true)),
        "{kind}: the namespace's kernel answers with a 9014-byte frame carrying our payload \
         ({stats:?})"
    );
    assert_eq!((stats.ierrors, stats.oerrors), (0, 0), "{kind}: {stats:?}");
    tx.tx_burst(&mut Burst::with_capacity(1));
    drop((rx, tx));
    mempool::lcache::flush();
    drop(port);
    assert_eq!(pool.in_use(), 0, "{kind}: every buffer is back");
}

#[test]
fn jumbo_frames_cross_a_veth_at_mtu_9000_both_ways() {
    let Some(peer) = Peer::create("jumbo_frames_cross_a_veth_at_mtu_9000_both_ways") else {
        return;
    };
    for kind in ["emu-mana", "emu-mlx5"] {
        jumbo_ping(&peer, kind);
    }
}
