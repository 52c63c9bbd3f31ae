//! The examples that talk to the Linux kernel through veth pairs into network namespaces.
//!
//! The `router` example between two network namespaces: the Linux kernel on each side is a
//! real host (a veth pair per side, the namespace's end addressed 169.254.{10,20}.2/24, the
//! router's ports on the other ends through the afpacket wire). A ping from one namespace to
//! the other crosses the router both ways (the far kernel answers); a ping with TTL 1 does
//! not, and the router counts it; every buffer goes back to the pool. The `tcp_echo` example
//! (smoltcp on a pmd port) serves the kernel's TCP in a namespace.
//!
//! Needs root (network namespaces, veth, AF_PACKET) and `ip`, `ping`, `python3`; skipped with a message
//! otherwise (a failure where PMD_REQUIRE_PRIVILEGED is set).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The router's port MACs (given as devargs: the hosts need them for their gateway, there
/// is no ARP).
const ROUTER_MACS: [&str; 2] = ["02:00:00:77:10:01", "02:00:00:77:20:01"];

fn ip(args: &[&str]) -> Result<String, String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// A network namespace with a veth pair: its end addressed `addr`, the other end left here
/// for a program's port; removed on drop.
struct Side {
    ns: String,
    host_if: String,
    ns_if: String,
}

impl Side {
    fn create(tag: &str, addr: &str) -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let side = Side {
            ns: format!("pmd{tag}{id}"),
            host_if: format!("pmd{tag}h{id}"),
            ns_if: format!("pmd{tag}n{id}"),
        };
        let (ns, host, nsif) = (&side.ns, &side.host_if, &side.ns_if);
        ip(&["netns", "add", ns])?;
        ip(&["link", "add", host, "type", "veth", "peer", "name", nsif])?;
        ip(&["link", "set", nsif, "netns", ns])?;
        ip(&["link", "set", host, "up"])?;
        ip(&["-n", ns, "addr", "add", addr, "dev", nsif])?;
        // One segment per frame: a TSO/GSO frame is longer than the afpacket wire's slots
        // (they are sized from the MTU), and would be dropped as too long.
        ip(&["-n", ns, "link", "set", nsif, "gso_max_segs", "1"])?;
        ip(&["-n", ns, "link", "set", nsif, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(side)
    }

    /// The MAC address of the namespace's end.
    fn ns_mac(&self) -> String {
        let out = ip(&["-n", &self.ns, "-o", "link", "show", &self.ns_if]).unwrap();
        out.split("link/ether ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no MAC in {out}"))
            .to_string()
    }

    /// `prog` run in the namespace.
    fn exec(&self, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, prog]);
        c
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// The sides `(tag, address)`, or `None` (after saying why) where this machine cannot make
/// them, unless PMD_REQUIRE_PRIVILEGED is set.
fn sides(test: &str, want: &[(&str, &str)]) -> Option<Vec<Side>> {
    let made: Result<Vec<Side>, String> = want.iter().map(|(t, a)| Side::create(t, a)).collect();
    match made {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(
                std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
                "PMD_REQUIRE_PRIVILEGED is set but {test} cannot build its namespaces: {e}"
            );
            eprintln!("SKIPPED {test}: cannot build its namespaces here ({e})");
            None
        }
    }
}

/// A program started by a test, and what it printed so far.
struct Running {
    child: Child,
    out: BufReader<ChildStdout>,
    text: String,
}

/// Starts `bin` with `args` and waits for its `ready` line.
fn start(bin: &str, args: &[String]) -> Running {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    let t0 = Instant::now();
    while !text.contains("ready\n") && t0.elapsed() < Duration::from_secs(30) {
        if out.read_line(&mut text).unwrap() == 0 {
            break;
        }
    }
    assert!(text.contains("ready\n"), "{bin} did not start: {text}");
    Running { child, out, text }
}

/// Stops `r` with SIGINT and returns all it printed; it must exit 0.
fn stop(mut r: Running) -> String {
    let _ = Command::new("kill")
        .args(["-INT", &r.child.id().to_string()])
        .status();
    let status = r.child.wait().unwrap();
    r.out.read_to_string(&mut r.text).unwrap();
    let mut err = String::new();
    r.child
        .stderr
        .as_mut()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // What it said (shown with --nocapture).
    eprintln!("{}", r.text);
    assert!(status.success(), "{status}: {}\n{err}", r.text);
    r.text
}

/// The number after `label` in `text`.
fn number_after(text: &str, label: &str) -> u64 {
    text.split(label)
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in {text}"))
}

/// Side `k` of the router test reaches the other side's subnet through the router (a
/// static neighbour entry for the gateway: there is no ARP).
fn route_through_router(side: &Side, k: usize) {
    let gw = format!("169.254.{}.1", 10 + 10 * k);
    let other = format!("169.254.{}.0/24", 10 + 10 * (1 - k));
    let (ns, nsif) = (side.ns.as_str(), side.ns_if.as_str());
    let neigh = [
        "-n",
        ns,
        "neigh",
        "add",
        &gw,
        "lladdr",
        ROUTER_MACS[k],
        "dev",
        nsif,
    ];
    ip(&[&neigh[..], &["nud", "permanent"]].concat()).unwrap();
    ip(&["-n", ns, "route", "add", &other, "via", &gw]).unwrap();
}

/// `ping` from `side` to 169.254.20.2: whether every echo was answered.
fn ping(side: &Side, count: u32, ttl: u32) -> bool {
    side.exec("ping")
        .args(["-n", "-q", "-c", &count.to_string(), "-i", "0.2", "-W", "2"])
        .args(["-t", &ttl.to_string(), "169.254.20.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn the_router_forwards_between_two_kernels_and_counts_what_it_drops() {
    let want = [("r0", "169.254.10.2/24"), ("r1", "169.254.20.2/24")];
    let Some(lab) = sides("the router test", &want) else {
        return;
    };
    let mut argv = Vec::new();
    for (k, side) in lab.iter().enumerate() {
        argv.push("--port".to_string());
        argv.push(format!(
            "emu-mana:wire=afpacket:{},mac={}",
            side.host_if, ROUTER_MACS[k]
        ));
    }
    for (k, side) in lab.iter().enumerate() {
        argv.push("--route".to_string());
        argv.push(format!(
            "169.254.{}.0/24,{k},{}",
            10 + 10 * k,
            side.ns_mac()
        ));
    }
    argv.extend(["--duration".to_string(), "60".to_string()]);
    let router = start(env!("CARGO_BIN_EXE_router"), &argv);
    route_through_router(&lab[0], 0);
    route_through_router(&lab[1], 1);

    // Both ways through the router: the echo requests out of port 1, the replies out of 0.
    assert!(
        ping(&lab[0], 3, 64),
        "no answer through the router: {}",
        router.text
    );
    // TTL 1 may not be forwarded: no answer, and the router says why.
    assert!(!ping(&lab[0], 2, 1), "a TTL-1 ping was answered");

    let text = stop(router);
    assert!(number_after(&text, "forwarded ") >= 6, "{text}");
    assert!(number_after(&text, "TTL exceeded ") >= 2, "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
}

/// The client: two connections, each sending 200 KB of random bytes and reading back
/// until the server closes; exits 0 when every byte came back in order.
const ECHO_CLIENT: &str = r#"
import os, socket, sys
for i in range(2):
    s = socket.create_connection(("169.254.30.1", 7), timeout=10)
    data = os.urandom(200_000)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    if bytes(got) != data:
        sys.exit(f"connection {i}: sent {len(data)} bytes, got {len(got)} back, not the same")
print("echoed")
"#;

/// smoltcp on a pmd port serves the Linux kernel's TCP: ARP, the handshake, 400 KB both
/// ways over two connections, the closes.
#[test]
fn the_tcp_echo_server_answers_the_kernel() {
    let Some(lab) = sides("the tcp_echo test", &[("t0", "169.254.30.2/24")]) else {
        return;
    };
    let argv = [
        "--port".to_string(),
        format!("emu-mana:wire=afpacket:{}", lab[0].host_if),
        "--ip".to_string(),
        "169.254.30.1/24".to_string(),
        "--duration".to_string(),
        "60".to_string(),
    ];
    let server = start(env!("CARGO_BIN_EXE_tcp_echo"), &argv);
    let client = lab[0]
        .exec("python3")
        .args(["-c", ECHO_CLIENT])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    let text = stop(server);
    assert!(
        client.status.success() && said.contains("echoed"),
        "{said}\n{text}"
    );
    assert_eq!(number_after(&text, "connections "), 2, "{text}");
    assert_eq!(number_after(&text, "bytes echoed "), 400_000, "{text}");
    // Every frame the kernel sent fitted the port: none dropped on the way in.
    assert_eq!(number_after(&text, "device drops rx "), 0, "{text}");
    assert!(text.contains("mbufs still in use: 0"), "{text}");
}
