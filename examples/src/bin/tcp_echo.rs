//! A TCP/IP stack on a pmd port: a `smoltcp` `phy::Device` over one RX/TX queue pair, and a
//! TCP echo server on it. smoltcp does ARP, IPv4 and TCP; the port moves the frames (on MANA
//! and mlx5 hardware, or a device model). With the port on a veth end through the afpacket
//! wire, the Linux kernel in a network namespace is the client (see
//! `examples/tests/all/netns.rs`):
//!
//! ```text
//! tcp_echo --port emu-mana:wire=afpacket:veth0 --ip 169.254.30.1/24
//! ip netns exec NS nc 169.254.30.1 7
//! ```

use examples::Cli;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig, RxQueue, TxQueue};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELP: &str = "tcp_echo: a TCP echo server on a pmd port, through the smoltcp TCP/IP stack.

smoltcp (ARP, IPv4, TCP) runs over one RX/TX queue pair of the port: what arrives goes to the
stack, what the stack sends goes out of the port. The server answers on --ip, port --listen,
sending back every byte a client sends until the client closes; then it takes the next client.
It runs until SIGINT/SIGTERM or --duration and prints the connections served, the bytes
echoed and the port's frame counts at the end (exit status 1 if a buffer is missing from the
pool).

Usage: tcp_echo --port SPEC [--ip ADDR/LEN] [--listen PORT] [--duration SECONDS] [--help]
  --port SPEC        the port (e.g. emu-mana:wire=afpacket:veth0, mana:dev=mana_0)
  --ip ADDR/LEN      the server's address (default 169.254.30.1/24)
  --listen PORT      the TCP port (default 7, echo)
  --duration SECONDS stop after this long (default: until SIGINT/SIGTERM)";

const BURST: usize = 32;
/// Sockets listening on the port at once (each serves one connection at a time).
const LISTENERS: usize = 4;
/// The largest frame smoltcp is given to build (Ethernet header and 1500 bytes of IP).
const MAX_FRAME: usize = 1514;

/// smoltcp's device: one RX/TX queue pair of a port. Received frames wait in `inb` until
/// the stack takes them; frames the stack builds wait in `out` until [`PmdDevice::flush`].
struct PmdDevice {
    rx: RxQueue,
    tx: TxQueue,
    pool: Arc<MbufPool>,
    inb: Burst,
    out: Burst,
    counts: Counts,
}

#[derive(Debug, Default)]
struct Counts {
    rx: u64,
    tx: u64,
    /// Frames the TX ring had no room for (TCP sends them again).
    tx_full: u64,
    /// Frames the stack wanted to send when the pool had no buffer.
    no_mbuf: u64,
}

impl PmdDevice {
    /// Sends what the stack built; frees and counts what the TX ring had no room for.
    fn flush(&mut self) {
        if self.out.is_empty() {
            // An empty burst still completes what was sent.
            self.tx.tx_burst(&mut self.out);
            return;
        }
        self.counts.tx += self.tx.tx_burst(&mut self.out) as u64;
        self.counts.tx_full += self.out.len() as u64;
        self.out.clear();
    }
}

/// A received frame for the stack.
struct Rx(mempool::Mbuf);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        // The buffer goes back to this thread's cache when `self` drops.
        f(self.0.data())
    }
}

/// Room for one frame the stack builds: a buffer from the pool, queued on `out`.
struct Tx<'a> {
    out: &'a mut Burst,
    pool: &'a Arc<MbufPool>,
    counts: &'a mut Counts,
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        if self.out.spare() == 0 {
            // `transmit` hands out a token only while there is room; a receive's token
            // may come after the burst filled up: the frame is built and dropped (TCP
            // sends it again).
            self.counts.tx_full += 1;
            return f(&mut vec![0; len]);
        }
        let Some(mut m) = mempool::lcache::alloc(self.pool) else {
            self.counts.no_mbuf += 1;
            return f(&mut vec![0; len]);
        };
        let r = match m.append(len) {
            Ok(buf) => f(buf),
            // Longer than a buffer: the capabilities say MAX_FRAME, so this is a bug.
            Err(e) => panic!("a {len}-byte frame does not fit a buffer: {e}"),
        };
        // Room was checked above.
        let _ = self.out.push(m);
        r
    }
}

impl phy::Device for PmdDevice {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(Rx, Tx<'_>)> {
        if self.inb.is_empty() {
            let n = self.rx.rx_burst(&mut self.inb);
            self.counts.rx += n as u64;
            // Oldest last, so that `pop` hands them out in the order they arrived.
            self.inb.as_mut_slice().reverse();
        }
        let m = self.inb.pop()?;
        let tx = Tx {
            out: &mut self.out,
            pool: &self.pool,
            counts: &mut self.counts,
        };
        Some((Rx(m), tx))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Tx<'_>> {
        if self.out.spare() == 0 {
            self.flush();
        }
        if self.out.spare() == 0 {
            return None;
        }
        Some(Tx {
            out: &mut self.out,
            pool: &self.pool,
            counts: &mut self.counts,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = MAX_FRAME;
        c.max_burst_size = Some(BURST);
        c
    }
}

struct Args {
    port: String,
    ip: IpCidr,
    listen: u16,
    duration: Option<Duration>,
}

fn parse_args() -> Args {
    let mut cli = Cli::new("tcp_echo", HELP);
    let mut port = None;
    let mut ip = "169.254.30.1/24"
        .parse::<IpCidr>()
        .expect("a valid default");
    let mut listen = 7u16;
    let mut duration = None;
    while let Some(a) = cli.next_option() {
        match a.as_str() {
            "--port" => port = Some(cli.text("--port", "a spec")),
            "--ip" => {
                ip = cli.value(
                    "--ip",
                    "a unicast ADDR/LEN, e.g. 169.254.30.1/24",
                    |c: &IpCidr| c.address().is_unicast(),
                );
            }
            "--listen" => listen = cli.value("--listen", "a TCP port (1 to 65535)", |p| *p > 0),
            "--duration" => {
                let s: f64 = cli.value("--duration", "a positive number of seconds", |s| {
                    *s > 0.0 && f64::is_finite(*s)
                });
                duration = Some(Duration::from_secs_f64(s));
            }
            other => cli.unexpected(other),
        }
    }
    let port = port.unwrap_or_else(|| cli.usage("--port is needed"));
    Args {
        port,
        ip,
        listen,
        duration,
    }
}

/// One socket's turn: listens again once closed, counts a connection when one starts, echoes
/// what arrived (as much as the send buffer has room for) and closes once the client closed
/// its side and everything went back. Returns the bytes echoed.
fn serve(
    s: &mut tcp::Socket<'_>,
    port: u16,
    serving: &mut bool,
    connections: &mut u64,
    scratch: &mut [u8],
) -> Result<u64, Box<dyn std::error::Error>> {
    if !s.is_open() {
        s.listen(port)?;
        *serving = false;
    }
    if s.is_active() && !*serving {
        *connections += 1;
        *serving = true;
    }
    let mut echoed = 0;
    if s.can_recv() && s.can_send() {
        let room = (s.send_capacity() - s.send_queue()).min(scratch.len());
        let n = s.recv(|b| {
            let n = b.len().min(room);
            scratch[..n].copy_from_slice(&b[..n]);
            (n, n)
        })?;
        let sent = s.send_slice(&scratch[..n])?;
        debug_assert_eq!(sent, n);
        echoed = n as u64;
    }
    if !s.may_recv() && s.may_send() && s.send_queue() == 0 {
        s.close();
    }
    Ok(echoed)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args();
    pmd::log::init("warn");
    let pool = MbufPool::new(MbufPoolConfig::new("tcp-echo", 4096))?;
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    let mut port = Port::open(0, &args.port.parse()?)?;
    port.configure(&cfg, &pool)?;
    let (rx, tx) = (port.rx_queue(0)?, port.tx_queue(0)?);
    port.start()?;
    port.wait_link_up(Duration::from_secs(10))?;
    let mac = port.mac();
    let mut dev = PmdDevice {
        rx,
        tx,
        pool: Arc::clone(&pool),
        inb: Burst::with_capacity(BURST),
        out: Burst::with_capacity(BURST),
        counts: Counts::default(),
    };

    let t0 = Instant::now();
    // smoltcp's clock: milliseconds since the start.
    let now = || smoltcp::time::Instant::from_micros(t0.elapsed().as_micros() as i64);
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac.0)));
    config.random_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut iface = Interface::new(config, &mut dev, now());
    iface.update_ip_addrs(|a| {
        a.push(args.ip).expect("room for one address");
    });
    let mut sockets = SocketSet::new(Vec::new());
    // A few sockets listen at once (smoltcp has no listen backlog: a socket serves one
    // connection), so that a client's next connection finds one listening while another
    // is still closing the last.
    let handles: Vec<_> = (0..LISTENERS)
        .map(|_| {
            sockets.add(tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; 64 * 1024]),
                tcp::SocketBuffer::new(vec![0; 64 * 1024]),
            ))
        })
        .collect();
    println!(
        "port 0: {}, mac {mac}; listening on {}:{}",
        args.port,
        args.ip.address(),
        args.listen
    );
    println!("ready");

    let stop = Arc::new(AtomicBool::new(false));
    pmd::takeover::exit::on_stop_signal(Arc::clone(&stop))?;
    let (mut connections, mut echoed) = (0u64, 0u64);
    let mut serving = [false; LISTENERS];
    let mut scratch = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) && args.duration.is_none_or(|d| t0.elapsed() < d) {
        iface.poll(now(), &mut dev, &mut sockets);
        for (&h, serving) in handles.iter().zip(serving.iter_mut()) {
            let s = sockets.get_mut::<tcp::Socket>(h);
            echoed += serve(s, args.listen, serving, &mut connections, &mut scratch)?;
        }
        iface.poll(now(), &mut dev, &mut sockets);
        dev.flush();
        if dev.inb.is_empty() {
            // Nothing waiting: a short nap instead of spinning (a dataplane would spin).
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    dev.flush();
    let c = &dev.counts;
    println!(
        "connections {connections}, bytes echoed {echoed}; frames received {}, sent {}, \
         dropped: TX ring full {}, no buffer {}",
        c.rx, c.tx, c.tx_full, c.no_mbuf
    );
    let s = port.stats();
    println!(
        "port 0: rx {} tx {}, device drops rx {} tx {}",
        s.ipackets, s.opackets, s.device_drops.rx, s.device_drops.tx
    );
    drop((dev, iface, sockets));
    port.close();
    mempool::lcache::flush();
    let in_use = pool.in_use();
    println!("mbufs still in use: {in_use}");
    if in_use != 0 {
        std::process::exit(1);
    }
    Ok(())
}
