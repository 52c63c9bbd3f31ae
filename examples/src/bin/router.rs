//! An IPv4 router (DPDK's `l3fwd` with longest-prefix match, without ARP): each frame that
//! arrives for a port's MAC is checked (an IPv4 header whose version, length and checksum
//! hold), looked up in a static routing table by its destination (longest prefix wins), its
//! TTL decremented with the header checksum updated in place (RFC 1624), its MACs rewritten
//! (the out port's as source, the route's next hop as destination), and sent out of the
//! route's port. Every frame that is not forwarded is counted by why; at the end the program
//! prints those counts and each port's device drops, and checks that every buffer went back
//! to the pool.
//!
//! With ports on veth ends through the afpacket wire, the Linux kernel in two network
//! namespaces is a real peer on each side (see `examples/tests/all/netns.rs`):
//!
//! ```text
//! router --port emu-mana:wire=afpacket:veth0 --port emu-mana:wire=afpacket:veth1 \
//!        --route 169.254.20.0/24,1,02:00:00:00:00:22 --route 169.254.10.0/24,0,02:00:00:00:00:11
//! ```

use examples::Cli;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::net::mac::MacAddr;
use pmd::port::{Burst, Port, PortConfig, RxQueue, TxQueue};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELP: &str =
    "router: an IPv4 router with a static routing table (longest-prefix match), no ARP.

Each frame that arrives for a port's MAC address is checked (IPv4, a header whose version,
length and checksum hold), routed by its destination address (the longest matching prefix
wins), its TTL decremented (the header checksum updated in place), its MAC addresses rewritten
(the out port's MAC as source, the route's next hop as destination) and sent out of the
route's port. Frames for other MACs, non-IPv4 frames, bad headers, an expired TTL and
destinations without a route are dropped and counted. It runs until SIGINT/SIGTERM or
--duration, printing the ports' MACs when ready and the counts at the end (exit status 1 if a
buffer is missing from the pool).

The hosts on each side need the router's MAC for their gateway address (a static neighbour
entry, as there is no ARP): `ip neigh add GATEWAY lladdr MAC dev IFACE`.

Usage: router --port SPEC --port SPEC [--port SPEC ...] --route NET/LEN,PORT,MAC [--route ...]
              [--duration SECONDS] [--help]
  --port SPEC        a port (as l2fwd takes them, e.g. emu-mana:wire=afpacket:veth0 or
                     mana:dev=mana_0); ports are numbered 0, 1, ... in order
  --route NET/LEN,PORT,MAC
                     frames to NET/LEN go out of port PORT to next hop MAC (e.g.
                     169.254.20.0/24,1,02:00:00:00:00:22); 0.0.0.0/0 is a default route
  --duration SECONDS stop after this long (default: until SIGINT/SIGTERM)";

const BURST: usize = 32;

/// One route: a prefix, the port it goes out of and the next hop's MAC address.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    net: u32,
    len: u8,
    port: usize,
    next_hop: MacAddr,
}

/// The mask of a prefix of `len` bits.
fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

impl std::str::FromStr for Route {
    type Err = String;

    /// `NET/LEN,PORT,MAC`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let (Some(prefix), Some(port), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{s:?}: expected NET/LEN,PORT,MAC"));
        };
        let (net, len) = prefix
            .split_once('/')
            .ok_or_else(|| format!("{prefix:?}: expected NET/LEN, e.g. 169.254.20.0/24"))?;
        let net: Ipv4Addr = net
            .parse()
            .map_err(|_| format!("{net:?} is not an IPv4 address"))?;
        let len: u8 = match len.parse() {
            Ok(n) if n <= 32 => n,
            _ => return Err(format!("prefix length {len:?}: expected 0 to 32")),
        };
        let net = u32::from(net);
        if net & !mask(len) != 0 {
            return Err(format!(
                "{prefix}: host bits are set (did you mean {}/{len}?)",
                Ipv4Addr::from(net & mask(len))
            ));
        }
        let port = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port number"))?;
        let next_hop = mac.parse().map_err(|e| format!("next hop {mac:?}: {e}"))?;
        Ok(Route {
            net,
            len,
            port,
            next_hop,
        })
    }
}

/// The routing table: routes by prefix length, longest first, so the first match is the
/// longest prefix.
#[derive(Debug, Default)]
struct Table {
    routes: Vec<Route>,
}

impl Table {
    /// The table of `routes`; a prefix given twice is an error.
    fn new(mut routes: Vec<Route>) -> Result<Self, String> {
        routes.sort_by(|a, b| b.len.cmp(&a.len).then(a.net.cmp(&b.net)));
        if let Some(w) = routes
            .windows(2)
            .find(|w| (w[0].net, w[0].len) == (w[1].net, w[1].len))
        {
            return Err(format!(
                "{}/{} has two routes",
                Ipv4Addr::from(w[0].net),
                w[0].len
            ));
        }
        Ok(Self { routes })
    }

    /// The route of the longest prefix that holds `dst`.
    fn lookup(&self, dst: u32) -> Option<&Route> {
        self.routes.iter().find(|r| dst & mask(r.len) == r.net)
    }
}

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Rewritten, to go out of this port.
    Forward(usize),
    /// Addressed to another MAC (a veth end sees its neighbours' broadcasts and multicasts).
    NotForUs,
    /// Not IPv4 (ARP, IPv6, a VLAN tag).
    NotIpv4,
    /// An IPv4 header whose version, length or checksum does not hold.
    BadHeader,
    /// TTL 0 or 1: it may not be forwarded.
    TtlExceeded,
    /// No route to the destination.
    NoRoute,
}

/// Checks and rewrites one frame that arrived on a port whose MAC is `mine`; `macs` are the
/// ports' MACs (the out port's is the new source).
fn route(frame: &mut [u8], mine: MacAddr, macs: &[MacAddr], table: &Table) -> Verdict {
    const ETH: usize = 14;
    if frame.len() < ETH || frame[..6] != mine.0 {
        return Verdict::NotForUs;
    }
    if frame[12..14] != [0x08, 0x00] {
        return Verdict::NotIpv4;
    }
    let ip = &frame[ETH..];
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Verdict::BadHeader;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < 20 || total < ihl || total > ip.len() || pmd::net::csum::checksum(&ip[..ihl]) != 0 {
        return Verdict::BadHeader;
    }
    let (ttl, proto) = (ip[8], ip[9]);
    if ttl <= 1 {
        return Verdict::TtlExceeded;
    }
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let Some(r) = table.lookup(dst) else {
        return Verdict::NoRoute;
    };
    let ip = &mut frame[ETH..];
    ip[8] = ttl - 1;
    let sum = u16::from_be_bytes([ip[10], ip[11]]);
    let sum = checksum_update(
        sum,
        u16::from_be_bytes([ttl, proto]),
        u16::from_be_bytes([ttl - 1, proto]),
    );
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    frame[..6].copy_from_slice(&r.next_hop.0);
    frame[6..12].copy_from_slice(&macs[r.port].0);
    Verdict::Forward(r.port)
}

/// A header checksum `sum` after one of its 16-bit words went from `old` to `new`
/// (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
fn checksum_update(sum: u16, old: u16, new: u16) -> u16 {
    let mut s = u32::from(!sum) + u32::from(!old) + u32::from(new);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// Frames not forwarded, by why, and those forwarded.
#[derive(Debug, Default)]
struct Counts {
    rx: u64,
    forwarded: u64,
    not_for_us: u64,
    not_ipv4: u64,
    bad_header: u64,
    ttl_exceeded: u64,
    no_route: u64,
    /// The out port's TX ring had no room.
    tx_full: u64,
}

impl Counts {
    fn count(&mut self, v: Verdict) {
        match v {
            Verdict::Forward(_) => {}
            Verdict::NotForUs => self.not_for_us += 1,
            Verdict::NotIpv4 => self.not_ipv4 += 1,
            Verdict::BadHeader => self.bad_header += 1,
            Verdict::TtlExceeded => self.ttl_exceeded += 1,
            Verdict::NoRoute => self.no_route += 1,
        }
    }
}

struct Args {
    ports: Vec<String>,
    table: Table,
    duration: Option<Duration>,
}

fn parse_args() -> Args {
    let mut cli = Cli::new("router", HELP);
    let (mut ports, mut routes, mut duration) = (Vec::new(), Vec::new(), None);
    while let Some(arg) = cli.next_option() {
        match arg.as_str() {
            "--port" => ports.push(cli.text("--port", "a port spec")),
            "--route" => match cli.text("--route", "NET/LEN,PORT,MAC").parse::<Route>() {
                Ok(r) => routes.push(r),
                Err(e) => cli.usage(&format!("--route {e}")),
            },
            "--duration" => {
                let s: f64 = cli.value("--duration", "a positive number of seconds", |s| {
                    *s > 0.0 && f64::is_finite(*s)
                });
                duration = Some(Duration::from_secs_f64(s));
            }
            other => cli.unexpected(other),
        }
    }
    if ports.len() < 2 {
        cli.usage("at least two --port are needed");
    }
    if routes.is_empty() {
        cli.usage("no --route: nothing could be forwarded");
    }
    if let Some(r) = routes.iter().find(|r| r.port >= ports.len()) {
        cli.usage(&format!(
            "a route goes out of port {}, but there are {} ports (0 to {})",
            r.port,
            ports.len(),
            ports.len() - 1
        ));
    }
    let table = Table::new(routes).unwrap_or_else(|e| cli.usage(&e));
    Args {
        ports,
        table,
        duration,
    }
}

/// Sends what `out` holds on `tx`; frees and counts what the ring had no room for.
fn flush(tx: &mut TxQueue, out: &mut Burst, counts: &mut Counts) {
    if out.is_empty() {
        return;
    }
    counts.forwarded += tx.tx_burst(out) as u64;
    counts.tx_full += out.len() as u64;
    out.clear();
}

/// One pass over every port: route what arrived, send it out in bursts per port.
fn poll(
    rxqs: &mut [RxQueue],
    txqs: &mut [TxQueue],
    outs: &mut [Burst],
    b: &mut Burst,
    macs: &[MacAddr],
    table: &Table,
    counts: &mut Counts,
) -> usize {
    let mut seen = 0;
    for (p, rx) in rxqs.iter_mut().enumerate() {
        let n = rx.rx_burst(b);
        seen += n;
        counts.rx += n as u64;
        for mut m in b.drain_front(n) {
            let v = route(m.data_mut(), macs[p], macs, table);
            let Verdict::Forward(to) = v else {
                // Dropped here: the buffer goes back to this thread's cache.
                counts.count(v);
                continue;
            };
            if outs[to].spare() == 0 {
                flush(&mut txqs[to], &mut outs[to], counts);
            }
            // Room was made just above.
            let _ = outs[to].push(m);
        }
    }
    for (tx, out) in txqs.iter_mut().zip(outs.iter_mut()) {
        flush(tx, out, counts);
    }
    seen
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args();
    pmd::log::init("warn");
    let table = &args.table;
    let pool = MbufPool::new(MbufPoolConfig::new("router", 8192))?;
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    let mut ports = Vec::new();
    for (id, spec) in args.ports.iter().enumerate() {
        let mut p = Port::open(id as u16, &spec.parse()?)?;
        p.configure(&cfg, &pool)?;
        ports.push(p);
    }
    let mut rxqs = Vec::new();
    let mut txqs = Vec::new();
    for p in &mut ports {
        rxqs.push(p.rx_queue(0)?);
        txqs.push(p.tx_queue(0)?);
        p.start()?;
    }
    let macs: Vec<MacAddr> = ports.iter().map(Port::mac).collect();
    for (id, (p, spec)) in ports.iter().zip(&args.ports).enumerate() {
        let link = p.wait_link_up(Duration::from_secs(10))?;
        println!(
            "port {id}: {spec}, mac {}, link up at {} Mbit/s",
            macs[id], link.speed_mbps
        );
    }
    for r in &table.routes {
        println!(
            "route {}/{} -> port {} via {}",
            Ipv4Addr::from(r.net),
            r.len,
            r.port,
            r.next_hop
        );
    }
    println!("ready");

    let stop = Arc::new(AtomicBool::new(false));
    pmd::takeover::exit::on_stop_signal(Arc::clone(&stop))?;
    let mut counts = Counts::default();
    let mut outs: Vec<Burst> = (0..ports.len())
        .map(|_| Burst::with_capacity(BURST))
        .collect();
    let mut b = Burst::with_capacity(BURST);
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && args.duration.is_none_or(|d| t0.elapsed() < d) {
        let n = poll(
            &mut rxqs,
            &mut txqs,
            &mut outs,
            &mut b,
            &macs,
            table,
            &mut counts,
        );
        if n == 0 {
            // Nothing arrived: a short nap instead of spinning (a dataplane would spin).
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    // An empty burst completes what the TX queues still hold.
    for tx in &mut txqs {
        tx.tx_burst(&mut b);
    }
    std::thread::sleep(Duration::from_millis(20));
    for tx in &mut txqs {
        tx.tx_burst(&mut b);
    }

    let c = &counts;
    let dropped =
        c.not_for_us + c.not_ipv4 + c.bad_header + c.ttl_exceeded + c.no_route + c.tx_full;
    println!(
        "received {}, forwarded {}, dropped {dropped}: not for us {}, not IPv4 {}, bad header {}, \
         TTL exceeded {}, no route {}, TX ring full {}",
        c.rx,
        c.forwarded,
        c.not_for_us,
        c.not_ipv4,
        c.bad_header,
        c.ttl_exceeded,
        c.no_route,
        c.tx_full
    );
    for p in &ports {
        let s = p.stats();
        println!(
            "port {}: rx {} tx {}, device drops rx {} tx {}",
            p.id(),
            s.ipackets,
            s.opackets,
            s.device_drops.rx,
            s.device_drops.tx
        );
    }
    drop((rxqs, txqs, outs, b));
    for p in ports {
        p.close();
    }
    mempool::lcache::flush();
    let in_use = pool.in_use();
    println!("mbufs still in use: {in_use}");
    if in_use != 0 || c.rx != c.forwarded + dropped {
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(routes: &[&str]) -> Table {
        Table::new(routes.iter().map(|r| r.parse().unwrap()).collect()).unwrap()
    }

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    #[test]
    fn the_longest_prefix_wins() {
        let t = table(&[
            "0.0.0.0/0,0,02:00:00:00:00:01",
            "10.0.0.0/8,1,02:00:00:00:00:02",
            "10.1.0.0/16,2,02:00:00:00:00:03",
            "10.1.2.3/32,3,02:00:00:00:00:04",
        ]);
        let port = |a| t.lookup(ip(a)).map(|r| r.port);
        assert_eq!(port("10.1.2.3"), Some(3));
        assert_eq!(port("10.1.2.4"), Some(2));
        assert_eq!(port("10.2.0.1"), Some(1));
        assert_eq!(port("192.0.2.1"), Some(0));
        let no_default = table(&["10.0.0.0/8,1,02:00:00:00:00:02"]);
        assert_eq!(no_default.lookup(ip("11.0.0.1")), None);
    }

    #[test]
    fn bad_routes_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Route>().unwrap_err();
        assert!(err("10.0.0.1/8,0,02:00:00:00:00:01").contains("did you mean 10.0.0.0/8"));
        assert!(err("10.0.0.0/33,0,02:00:00:00:00:01").contains("0 to 32"));
        assert!(err("10.0.0.0/8,x,02:00:00:00:00:01").contains("not a port number"));
        assert!(err("10.0.0.0/8,0").contains("NET/LEN,PORT,MAC"));
        assert!(err("10.0.0.0,0,02:00:00:00:00:01").contains("NET/LEN"));
        assert!(err("10.0.0.0/8,0,zz").contains("next hop"));
        let twice = Table::new(vec![
            "10.0.0.0/8,0,02:00:00:00:00:01".parse().unwrap(),
            "10.0.0.0/8,1,02:00:00:00:00:02".parse().unwrap(),
        ]);
        assert!(twice.unwrap_err().contains("two routes"));
    }

    /// Two ports' MACs and a table with one route out of port 1.
    fn two_ports() -> (Vec<MacAddr>, Table) {
        let macs = ["02:00:00:00:00:a0", "02:00:00:00:00:a1"]
            .iter()
            .map(|m| m.parse().unwrap())
            .collect();
        (macs, table(&["169.254.20.0/24,1,02:00:00:00:00:22"]))
    }

    /// An Ethernet/IPv4/UDP frame to `dst` with `ttl`, from etherparse.
    fn frame(to: MacAddr, dst: [u8; 4], ttl: u8) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 9], to.0)
            .ipv4([169, 254, 10, 2], dst, ttl)
            .udp(1000, 2000);
        let mut out = Vec::new();
        b.write(&mut out, &[7u8; 18]).unwrap();
        out
    }

    #[test]
    fn a_routed_frame_has_its_ttl_checksum_and_macs_rewritten() {
        let (macs, t) = two_ports();
        for ttl in [2u8, 64, 255] {
            let mut f = frame(macs[0], [169, 254, 20, 2], ttl);
            assert_eq!(route(&mut f, macs[0], &macs, &t), Verdict::Forward(1));
            assert_eq!(f[..6], [2, 0, 0, 0, 0, 0x22]);
            assert_eq!(f[6..12], macs[1].0);
            let h = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
            assert_eq!(h.ttl(), ttl - 1);
            // The incrementally updated checksum is the one computed from scratch.
            assert_eq!(h.header_checksum(), h.to_header().calc_header_checksum());
        }
    }

    #[test]
    fn frames_that_cannot_be_forwarded_are_told_apart() {
        let (macs, t) = two_ports();
        let check = |mut f: Vec<u8>, want: Verdict| {
            let before = f.clone();
            assert_eq!(route(&mut f, macs[0], &macs, &t), want);
            assert_eq!(f, before, "a dropped frame is left as it was");
        };
        check(frame(macs[1], [169, 254, 20, 2], 64), Verdict::NotForUs);
        check(frame(macs[0], [169, 254, 30, 2], 64), Verdict::NoRoute);
        check(frame(macs[0], [169, 254, 20, 2], 1), Verdict::TtlExceeded);
        check(frame(macs[0], [169, 254, 20, 2], 0), Verdict::TtlExceeded);
        let mut arp = frame(macs[0], [169, 254, 20, 2], 64);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        check(arp, Verdict::NotIpv4);
        let mut bad_sum = frame(macs[0], [169, 254, 20, 2], 64);
        bad_sum[14 + 10] ^= 1;
        check(bad_sum, Verdict::BadHeader);
        let mut long = frame(macs[0], [169, 254, 20, 2], 64);
        let n = long.len() as u16 - 14 + 1;
        long[16..18].copy_from_slice(&n.to_be_bytes());
        check(long, Verdict::BadHeader);
        check(
            frame(macs[0], [169, 254, 20, 2], 64)[..30].to_vec(),
            Verdict::BadHeader,
        );
        let mut v6 = frame(macs[0], [169, 254, 20, 2], 64);
        v6[14] = 0x65;
        check(v6, Verdict::BadHeader);
    }

    #[test]
    fn the_checksum_update_matches_a_recomputation_for_every_ttl() {
        for ttl in 1..=255u8 {
            for proto in [1u8, 6, 17] {
                let hdr = etherparse::Ipv4Header::new(
                    40,
                    ttl,
                    proto.into(),
                    [10, 0, 0, 1],
                    [10, 0, 0, 2],
                )
                .unwrap();
                let before = hdr.calc_header_checksum();
                let mut after = hdr.clone();
                after.time_to_live = ttl - 1;
                assert_eq!(
                    checksum_update(
                        before,
                        u16::from_be_bytes([ttl, proto]),
                        u16::from_be_bytes([ttl - 1, proto])
                    ),
                    after.calc_header_checksum(),
                    "ttl {ttl} proto {proto}"
                );
            }
        }
    }
}
