//! The capture control socket: `<runtime dir>/pmd_capture.v1` beside the telemetry socket,
//! where `pmd-dumpcap` asks a running app to mirror ports into rings it then drains.
//!
//! Protocol (one JSON message each way per step, `SOCK_SEQPACKET`):
//! 0. `{"list": null}` answers `{"ports": [...]}` (what can be captured); the tool may go on.
//! 1. The tool sends `{"start": {"ports": [0, 1], "rx": true, "tx": true, "snaplen": 65535,
//!    "ring_bytes": 4194304, "filter": [[code, jt, jf, k], ...] | null, "filter_text": "..."}}`.
//! 2. The app answers `{"ok": {"rings": [{"port", "queue", "dir"}], "ports": [{"port",
//!    "name", "mac", "speed_mbps", "rx_queues", "tx_queues"}], "ring_bytes", "snaplen"}}`
//!    with the rings' memfd attached (`SCM_RIGHTS`), or `{"error": "..."}`.
//! 3. The capture runs until the tool sends `{"stop": null}` (the app answers `{"stopped":
//!    {"released": true}}` once no queue writes any more, so the tool can drain the rest),
//!    or until the connection closes: a tool that dies or is killed stops the capture.
//!
//! Every request is checked (ports, sizes, the filter program: see [`super::bpf`]); a
//! malformed one gets an error answer and costs nothing else. A port is captured by one
//! tool at a time; a second is refused with the first one's pid.
#![deny(unsafe_code)]

use super::bpf::{Insn, Program};
use super::ring::{Direction, RingId};
use super::{Session, Tap};
use crate::sys::seqpacket::{BindError, SeqConn, SeqListener};
use serde_json::{json, Value};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The socket's file name in the runtime directory.
pub const SOCKET_NAME: &str = "pmd_capture.v1";
/// Most capture tools served at once.
pub const MAX_CLIENTS: usize = 4;
/// Largest request (a filter of 4096 instructions fits).
const MAX_REQUEST: usize = 256 << 10;
/// How long `stop` waits for the queues to let go of the rings.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// A port that can be captured.
#[derive(Debug, Clone)]
pub struct Target {
    /// Port id.
    pub port: u16,
    /// Its devargs (the interface name in the capture file).
    pub name: String,
    /// Its MAC address.
    pub mac: [u8; 6],
    /// Link speed, Mbit/s (0: unknown).
    pub speed_mbps: u32,
    /// RX queues.
    pub rx_queues: u16,
    /// TX queues.
    pub tx_queues: u16,
    /// Its capture switch.
    pub tap: Arc<Tap>,
}

/// The captures running now, for a look from outside (telemetry's `/pmd/capture`).
#[derive(Debug, Default)]
pub struct Captures(Mutex<Vec<Running>>);

#[derive(Debug)]
struct Running {
    session: Arc<Session>,
    ports: Vec<u16>,
    rx: bool,
    tx: bool,
    filter: String,
    since: std::time::SystemTime,
}

impl Captures {
    /// Each capture: the tool's pid, ports, directions, filter, start time (Unix seconds) and,
    /// per port, the frames seen, filtered out and dropped for want of room so far.
    pub fn json(&self) -> Value {
        let list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Value::Array(list.iter().map(Running::json).collect())
    }

    fn add(&self, r: Running) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    fn remove(&self, session: &Arc<Session>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| !Arc::ptr_eq(&r.session, session));
    }
}

impl Running {
    fn json(&self) -> Value {
        let counters = self.session.counters();
        let per_port: Vec<Value> = self
            .ports
            .iter()
            .map(|&p| {
                let (mut seen, mut filtered, mut dropped) = (0, 0, 0);
                for (_, c) in counters.iter().filter(|(id, _)| id.port == p) {
                    seen += c.seen;
                    filtered += c.filtered;
                    dropped += c.dropped;
                }
                json!({"port": p, "seen": seen, "filtered": filtered, "dropped": dropped})
            })
            .collect();
        let since = self
            .since
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        json!({"pid": self.session.owner_pid(), "rx": self.rx, "tx": self.tx,
               "filter": self.filter, "since": since, "ports": per_port})
    }
}

/// The running control socket; dropping it stops every capture and removes the socket.
#[derive(Debug)]
pub struct CaptureServer {
    path: PathBuf,
    captures: Arc<Captures>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CaptureServer {
    /// Listens at `dir/pmd_capture.v1` for capture tools, offering `targets`.
    ///
    /// # Errors
    /// The directory cannot be made, or another live process listens there.
    pub fn start(dir: &Path, targets: Vec<Target>) -> Result<Self, BindError> {
        let path = dir.join(SOCKET_NAME);
        if let Err(err) = std::fs::create_dir_all(dir) {
            return Err(BindError::Io { path, err });
        }
        let listener = SeqListener::bind(&path, 4)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let targets = Arc::new(targets);
        let captures = Arc::new(Captures::default());
        let running = Arc::clone(&captures);
        let thread = std::thread::Builder::new()
            .name("pmd-capture".into())
            .spawn(move || accept_loop(&listener, &targets, &running, &stop2))
            .map_err(|err| BindError::Io {
                path: path.clone(),
                err,
            })?;
        Ok(Self {
            path,
            captures,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The captures running now.
    pub fn captures(&self) -> Arc<Captures> {
        Arc::clone(&self.captures)
    }
}

impl Drop for CaptureServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: &SeqListener,
    targets: &Arc<Vec<Target>>,
    captures: &Arc<Captures>,
    stop: &Arc<AtomicBool>,
) {
    let clients = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let conn = match listener.accept_timeout(Duration::from_millis(100)) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(target: "pmd::capture", "accept on {}: {e}", listener.path().display());
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
            let _ = conn.set_timeouts(None, Some(Duration::from_millis(100)));
            let _ = conn.send(
                json!({"error": format!("too many capture clients (at most {MAX_CLIENTS})")})
                    .to_string()
                    .as_bytes(),
            );
            continue;
        }
        clients.fetch_add(1, Ordering::Relaxed);
        let (t, s, c) = (Arc::clone(targets), Arc::clone(stop), Arc::clone(&clients));
        let running = Arc::clone(captures);
        let spawned = std::thread::Builder::new()
            .name("pmd-capture-client".into())
            .spawn(move || {
                serve(&conn, &t, &running, &s);
                c.fetch_sub(1, Ordering::Relaxed);
            });
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => {
                clients.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(target: "pmd::capture", "capture client thread: {e}");
            }
        }
        threads.retain(|h| !h.is_finished());
    }
    for h in threads {
        let _ = h.join();
    }
}

/// A checked capture request.
#[derive(Debug)]
struct Request {
    ports: Vec<u16>,
    rx: bool,
    tx: bool,
    snaplen: u32,
    ring_bytes: u64,
    filter: Program,
    filter_text: String,
}

fn parse_request(v: &Value, targets: &[Target]) -> Result<Request, String> {
    let s = v
        .get("start")
        .and_then(Value::as_object)
        .ok_or("expected {\"start\": {...}}")?;
    let ports: Vec<u16> = s
        .get("ports")
        .and_then(Value::as_array)
        .ok_or("\"ports\": an array of port ids")?
        .iter()
        .map(|p| {
            p.as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| targets.iter().any(|t| t.port == *p))
                .ok_or_else(|| {
                    format!(
                        "no port {p} (ports: {})",
                        targets
                            .iter()
                            .map(|t| t.port.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    if ports.is_empty() {
        return Err("no port to capture".into());
    }
    let flag = |k: &str| {
        s.get(k).map_or(Ok(true), |v| {
            v.as_bool().ok_or(format!("\"{k}\": true or false"))
        })
    };
    let (rx, tx) = (flag("rx")?, flag("tx")?);
    if !rx && !tx {
        return Err("neither rx nor tx asked for".into());
    }
    let num = |k: &str, d: u64| {
        s.get(k)
            .map_or(Ok(d), |v| v.as_u64().ok_or(format!("\"{k}\": a number")))
    };
    let snaplen =
        u32::try_from(num("snaplen", 65535)?).map_err(|_| "snaplen too large".to_string())?;
    let ring_bytes = num("ring_bytes", 4 << 20)?;
    let filter = match s.get("filter") {
        None | Some(Value::Null) => Program::accept_all(),
        Some(Value::Array(insns)) => {
            let insns: Vec<Insn> = insns
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let f = x
                        .as_array()
                        .filter(|a| a.len() == 4)
                        .ok_or(format!("filter instruction {i}: [code, jt, jf, k]"))?;
                    let n = |j: usize, max: u64| {
                        f[j].as_u64()
                            .filter(|v| *v <= max)
                            .ok_or(format!("filter instruction {i}: field {j} out of range"))
                    };
                    Ok(Insn {
                        code: n(0, u64::from(u16::MAX))? as u16,
                        jt: n(1, u64::from(u8::MAX))? as u8,
                        jf: n(2, u64::from(u8::MAX))? as u8,
                        k: n(3, u64::from(u32::MAX))? as u32,
                    })
                })
                .collect::<Result<_, String>>()?;
            Program::new(&insns).map_err(|e| format!("filter: {e}"))?
        }
        Some(_) => return Err("\"filter\": an array of [code, jt, jf, k] or null".into()),
    };
    let filter_text = s
        .get("filter_text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .chars()
        .take(1024)
        .collect();
    Ok(Request {
        ports,
        rx,
        tx,
        snaplen,
        ring_bytes,
        filter,
        filter_text,
    })
}

fn port_json(t: &Target) -> Value {
    json!({"port": t.port, "name": t.name, "mac": t.mac, "speed_mbps": t.speed_mbps,
           "rx_queues": t.rx_queues, "tx_queues": t.tx_queues})
}

fn send_json(conn: &SeqConn, v: &Value) -> bool {
    conn.send(v.to_string().as_bytes()).is_ok()
}

/// Serves one capture tool until it stops the capture, disconnects, or the app stops.
fn serve(conn: &SeqConn, targets: &[Target], captures: &Captures, stop: &AtomicBool) {
    let pid = conn.peer_pid().unwrap_or(0);
    // Short timeouts: a tool that never reads or never writes cannot hold this thread.
    if conn
        .set_timeouts(
            Some(Duration::from_millis(100)),
            Some(Duration::from_secs(1)),
        )
        .is_err()
    {
        return;
    }
    let mut buf = vec![0u8; MAX_REQUEST];
    let t0 = Instant::now();
    let req = loop {
        if stop.load(Ordering::Relaxed) || t0.elapsed() > Duration::from_secs(10) {
            return;
        }
        match conn.recv(&mut buf) {
            Ok((0, _)) => return,
            Ok((_, true)) => {
                send_json(
                    conn,
                    &json!({"error": format!("request longer than {MAX_REQUEST} bytes")}),
                );
                return;
            }
            Ok((n, false)) => {
                let parsed = serde_json::from_slice::<Value>(&buf[..n])
                    .map_err(|e| format!("not JSON: {e}"));
                if parsed.as_ref().is_ok_and(|v| v.get("list").is_some()) {
                    let ports: Vec<Value> = targets.iter().map(port_json).collect();
                    send_json(conn, &json!({ "ports": ports }));
                    continue;
                }
                let parsed = parsed.and_then(|v| parse_request(&v, targets));
                match parsed {
                    Ok(r) => break r,
                    Err(e) => {
                        send_json(conn, &json!({ "error": e }));
                        return;
                    }
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    };
    let chosen: Vec<&Target> = targets
        .iter()
        .filter(|t| req.ports.contains(&t.port))
        .collect();
    let mut rings = Vec::new();
    for t in &chosen {
        let mut add = |n: u16, dir| {
            rings.extend((0..n).map(|queue| RingId {
                port: t.port,
                queue,
                dir,
            }))
        };
        if req.rx {
            add(t.rx_queues, Direction::Rx);
        }
        if req.tx {
            add(t.tx_queues, Direction::Tx);
        }
    }
    let (session, file) = match Session::new(rings, req.ring_bytes, req.snaplen, req.filter, pid) {
        Ok(x) => x,
        Err(e) => {
            send_json(conn, &json!({ "error": e }));
            return;
        }
    };
    let mut attached: Vec<&Target> = Vec::new();
    for t in &chosen {
        if let Err(other) = t.tap.attach(&session) {
            for a in &attached {
                a.tap.detach(&session);
            }
            send_json(
                conn,
                &json!({"error": format!("port {} is already being captured (by pid {})", t.port, other.owner_pid())}),
            );
            return;
        }
        attached.push(t);
    }
    let ports: Vec<Value> = chosen.iter().map(|t| port_json(t)).collect();
    let rings: Vec<Value> = session
        .rings()
        .iter()
        .map(|r| json!({"port": r.port, "queue": r.queue, "dir": r.dir.name()}))
        .collect();
    let ok = json!({"ok": {"rings": rings, "ports": ports, "ring_bytes": req.ring_bytes, "snaplen": req.snaplen}});
    tracing::info!(target: "pmd::capture", pid, ports = ?req.ports, filter = %req.filter_text, "capture started");
    if conn
        .send_with_fd(ok.to_string().as_bytes(), file.as_fd())
        .is_ok()
    {
        drop(file);
        captures.add(Running {
            session: Arc::clone(&session),
            ports: req.ports.clone(),
            rx: req.rx,
            tx: req.tx,
            filter: req.filter_text.clone(),
            since: std::time::SystemTime::now(),
        });
        wait_for_stop(conn, stop, &mut buf);
        captures.remove(&session);
    }
    for t in &attached {
        t.tap.detach(&session);
    }
    // The queue handles let go at their next burst; wait for them so the tool's last drain
    // sees every frame.
    let t0 = Instant::now();
    while Arc::strong_count(&session) > 1
        && t0.elapsed() < RELEASE_WAIT
        && !stop.load(Ordering::Relaxed)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let released = Arc::strong_count(&session) == 1;
    tracing::info!(target: "pmd::capture", pid, released, "capture stopped");
    send_json(conn, &json!({"stopped": {"released": released}}));
}

/// Waits for `{"stop": null}`, the peer closing, or the app stopping.
fn wait_for_stop(conn: &SeqConn, stop: &AtomicBool, buf: &mut [u8]) {
    while !stop.load(Ordering::Relaxed) {
        match conn.recv(buf) {
            Ok((0, _)) => return,
            Ok((n, _)) => {
                if serde_json::from_slice::<Value>(&buf[..n]).is_ok_and(|v| v.get("stop").is_some())
                {
                    return;
                }
                send_json(conn, &json!({"error": "expected {\"stop\": null}"}));
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
