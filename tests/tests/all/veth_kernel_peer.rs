//! The Linux kernel as a real peer: a veth pair whose far end lives in a network namespace
//! this test creates (and removes), with a link-local address. Our `emu-mana` port attaches
//! to the near end through AF_PACKET. The model answers nothing itself: the test proves that
//! frames cross both ways (a ping from the namespace reaches our RX; an echo request we send
//! is answered by the namespace's kernel).
//!
//! Needs root (CAP_NET_ADMIN, CAP_NET_RAW) and `ip`; skipped with a message otherwise.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig};
use std::process::Command;
use std::time::{Duration, Instant};

const OUR_IP: [u8; 4] = [169, 254, 77, 1];
const NS_IP: [u8; 4] = [169, 254, 77, 2];
const OUR_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x77, 0x00, 0x01];

struct Netns {
    ns: String,
    host_if: String,
}

impl Netns {
    fn ip(args: &[&str]) -> Result<(), String> {
        let o = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    }

    fn create() -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let ns = format!("pmdt{id}");
        let host_if = format!("pmdh{id}");
        let ns_if = format!("pmdn{id}");
        Self::ip(&["netns", "add", &ns])?;
        let me = Netns {
            ns: ns.clone(),
            host_if: host_if.clone(),
        };
        Self::ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ])?;
        Self::ip(&["link", "set", &ns_if, "netns", &ns])?;
        Self::ip(&["link", "set", &host_if, "up"])?;
        let ns_ip = "169.254.77.2/24";
        Self::ip(&["-n", &ns, "addr", "add", ns_ip, "dev", &ns_if])?;
        Self::ip(&["-n", &ns, "link", "set", &ns_if, "up"])?;
        Self::ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // The namespace knows our MAC, so it needs no ARP answer from us.
        Self::ip(&[
            "-n",
            &ns,
            "neigh",
            "add",
            "169.254.77.1",
            "lladdr",
            "02:00:00:77:00:01",
            "dev",
            &ns_if,
        ])?;
        Ok(me)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Self::ip(&["link", "del", &self.host_if]);
        let _ = Self::ip(&["netns", "del", &self.ns]);
    }
}

#[test]
fn kernel_stack_is_a_real_peer_both_ways() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(e) => {
            // Where the machine allows it, CI sets PMD_REQUIRE_PRIVILEGED: a skip would hide a failure.
            assert!(
                std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
                "PMD_REQUIRE_PRIVILEGED is set but kernel_stack_is_a_real_peer_both_ways: cannot create a network namespace here ({e})"
            );
            eprintln!("SKIPPED kernel_stack_is_a_real_peer_both_ways: cannot create a network namespace here ({e})");
            return;
        }
    };
    let pool = MbufPool::new(MbufPoolConfig::new("veth", 1024)).unwrap();
    let spec = format!(
        "emu-mana:wire=afpacket:{},mac=02:00:00:77:00:01",
        ns.host_if
    )
    .parse()
    .unwrap();
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    let (port, mut rx, mut tx) = Port::open_started(0, &spec, &cfg, &pool).unwrap();

    // 1. A ping from the namespace arrives at our RX.
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.ns,
            "ping",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            "169.254.77.1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut saw_request = false;
    let mut b = Burst::with_capacity(32);
    let t0 = Instant::now();
    if let Ok(mut ping) = ping {
        while !saw_request && t0.elapsed() < Duration::from_secs(5) {
            rx.rx_burst(&mut b);
            while let Some(m) = b.pop() {
                if let Ok(p) = etherparse::SlicedPacket::from_ethernet(m.data()) {
                    if let (
                        Some(etherparse::NetSlice::Ipv4(ip)),
                        Some(etherparse::TransportSlice::Icmpv4(icmp)),
                    ) = (&p.net, &p.transport)
                    {
                        if ip.header().source() == NS_IP
                            && matches!(icmp.icmp_type(), etherparse::Icmpv4Type::EchoRequest(_))
                        {
                            saw_request = true;
                        }
                    }
                }
                mempool::lcache::free(&pool, m);
            }
        }
        let _ = ping.kill();
        let _ = ping.wait();
        assert!(
            saw_request,
            "an echo request from the namespace's kernel reached our RX"
        );
    } else {
        eprintln!("note: no `ping` here; checking only our echo request and the kernel's reply");
    }

    // 2. An echo request we send is answered by the namespace's kernel.
    let ns_mac = {
        let out = Command::new("ip")
            .args(["-n", &ns.ns, "-o", "link", "show"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .find(|l| l.contains("pmdn"))
            .expect("ns link")
            .to_string();
        let mac = line
            .split("link/ether ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        let v: Vec<u8> = mac
            .split(':')
            .map(|x| u8::from_str_radix(x, 16).unwrap())
            .collect();
        [v[0], v[1], v[2], v[3], v[4], v[5]]
    };
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2(OUR_MAC, ns_mac)
        .ipv4(OUR_IP, NS_IP, 64)
        .icmpv4_echo_request(0x7777, 1)
        .write(&mut frame, b"pmd says hello")
        .unwrap();
    let mut got_reply = false;
    let t0 = Instant::now();
    let mut last_send = None;
    while !got_reply && t0.elapsed() < Duration::from_secs(5) {
        if last_send.is_none_or(|t: Instant| t.elapsed() > Duration::from_millis(500)) {
            let mut out = Burst::with_capacity(1);
            let mut m = mempool::lcache::alloc(&pool).unwrap();
            m.extend_from_slice(&frame).unwrap();
            out.push(m).unwrap();
            assert_eq!(tx.tx_burst(&mut out), 1);
            last_send = Some(Instant::now());
        }
        rx.rx_burst(&mut b);
        while let Some(m) = b.pop() {
            if let Ok(p) = etherparse::SlicedPacket::from_ethernet(m.data()) {
                if let (
                    Some(etherparse::NetSlice::Ipv4(ip)),
                    Some(etherparse::TransportSlice::Icmpv4(icmp)),
                ) = (&p.net, &p.transport)
                {
                    if ip.header().source() == NS_IP && ip.header().destination() == OUR_IP {
                        if let etherparse::Icmpv4Type::EchoReply(h) = icmp.icmp_type() {
                            got_reply = h.id == 0x7777 && icmp.payload() == b"pmd says hello";
                        }
                    }
                }
            }
            mempool::lcache::free(&pool, m);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        got_reply,
        "the namespace's kernel answered our echo request"
    );
    tx.tx_burst(&mut Burst::with_capacity(1));
    drop((rx, tx));
    mempool::lcache::flush();
    drop(port);
    assert_eq!(pool.in_use(), 0);
}
