//! Live capture through the port layer: what a queue receives and sends reaches the rings
//! byte for byte, the filter runs before the copy, a capture that ends is let go at the next
//! burst, and the control socket refuses bad requests and ends the capture when its client
//! goes away.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::capture::bpf::{Insn, Program};
use pmd::capture::ring::{Direction, Frame, Layout, RingId, RingReader};
use pmd::capture::server::{CaptureServer, SOCKET_NAME};
use pmd::capture::Session;
use pmd::port::{Burst, Port, PortConfig};
use pmd::sys::seqpacket::SeqConn;
use pmd::sys::DevMem;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn started_null(size: u16) -> (Arc<MbufPool>, Port, pmd::port::RxQueue, pmd::port::TxQueue) {
    let pool = MbufPool::new(MbufPoolConfig::new("cap", 4096)).unwrap();
    let spec = format!("null:size={size}").parse().unwrap();
    let (port, rx, tx) = Port::open_started(0, &spec, &PortConfig::default(), &pool).unwrap();
    (pool, port, rx, tx)
}

fn rings() -> Vec<RingId> {
    vec![
        RingId {
            port: 0,
            queue: 0,
            dir: Direction::Rx,
        },
        RingId {
            port: 0,
            queue: 0,
            dir: Direction::Tx,
        },
    ]
}

fn drain_all(file: &std::fs::File) -> Vec<Vec<Frame>> {
    let mem = DevMem::map_file(file, file.metadata().unwrap().len() as usize).unwrap();
    let (layout, ids) = Layout::read(&mem).unwrap();
    (0..ids.len())
        .map(|r| {
            let mut out = Vec::new();
            RingReader::new(&mem, &layout, r)
                .drain(&mem, usize::MAX, &mut out)
                .unwrap();
            out
        })
        .collect()
}

/// `len > 100 ? accept : reject`.
fn longer_than_100() -> Program {
    Program::new(&[
        Insn {
            code: 0x80,
            jt: 0,
            jf: 0,
            k: 0,
        },
        Insn {
            code: 0x25,
            jt: 0,
            jf: 1,
            k: 100,
        },
        Insn {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 65535,
        },
        Insn {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ])
    .unwrap()
}

#[test]
fn received_and_sent_frames_reach_the_rings_and_the_capture_is_let_go() {
    let (pool, port, mut rx, mut tx) = started_null(200);
    let (session, file) = Session::new(rings(), 1 << 20, 65535, Program::accept_all(), 1).unwrap();
    let target = port.capture_target();
    assert_eq!((target.rx_queues, target.tx_queues), (1, 1));
    target.tap.attach(&session).unwrap();
    let mut b = Burst::with_capacity(32);
    let mut sent_bytes = Vec::new();
    for _ in 0..3 {
        assert_eq!(rx.rx_burst(&mut b), 32);
        for (i, m) in b.iter_mut().enumerate() {
            m.data_mut()[20] = i as u8;
            sent_bytes.push(m.data().to_vec());
        }
        assert_eq!(tx.tx_burst(&mut b), 32);
    }
    // The switch and both handles hold the session while it is on.
    assert_eq!(Arc::strong_count(&session), 4);
    let frames = drain_all(&file);
    assert_eq!(frames[0].len(), 96, "rx");
    assert_eq!(frames[1].len(), 96, "tx");
    for (f, want) in frames[1].iter().zip(&sent_bytes) {
        assert_eq!(&f.data, want);
        assert_eq!(f.origlen, 200);
    }
    assert!(frames[0].iter().all(|f| f.data.len() == 200 && f.ts_ns > 0));

    target.tap.detach(&session);
    rx.rx_burst(&mut b);
    tx.tx_burst(&mut b);
    assert_eq!(
        Arc::strong_count(&session),
        1,
        "the handles let go at their next burst"
    );
    assert!(
        drain_all(&file).iter().all(|r| r.len() <= 1),
        "at most the detaching rx burst's frames"
    );
    drop((rx, tx, port));
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn the_filter_runs_before_the_copy_and_counts() {
    let (_pool, port, mut rx, mut tx) = started_null(64);
    let (session, file) = Session::new(rings(), 1 << 20, 65535, longer_than_100(), 1).unwrap();
    port.capture_target().tap.attach(&session).unwrap();
    let mut b = Burst::with_capacity(16);
    rx.rx_burst(&mut b);
    tx.tx_burst(&mut b);
    let frames = drain_all(&file);
    assert!(
        frames.iter().all(Vec::is_empty),
        "64-byte frames are not longer than 100"
    );
    let mem = DevMem::map_file(&file, file.metadata().unwrap().len() as usize).unwrap();
    let (layout, _) = Layout::read(&mem).unwrap();
    for r in 0..2 {
        let c = RingReader::new(&mem, &layout, r).counters(&mem);
        assert_eq!((c.seen, c.filtered, c.dropped), (16, 16, 0));
    }
}

#[test]
fn a_second_capture_of_a_port_is_refused() {
    let (_pool, port, _rx, _tx) = started_null(64);
    let (a, _fa) = Session::new(rings(), 1 << 20, 65535, Program::accept_all(), 11).unwrap();
    let (b, _fb) = Session::new(rings(), 1 << 20, 65535, Program::accept_all(), 22).unwrap();
    let tap = port.capture_target().tap;
    tap.attach(&a).unwrap();
    assert_eq!(tap.attach(&b).unwrap_err().owner_pid(), 11);
    tap.detach(&b); // not the one on: nothing happens
    assert_eq!(tap.attach(&b).unwrap_err().owner_pid(), 11);
}

fn ask(c: &SeqConn, v: &Value) -> (Value, Option<std::os::fd::OwnedFd>) {
    c.send(v.to_string().as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    let (n, fd) = c.recv_with_fd(&mut buf).unwrap();
    (serde_json::from_slice(&buf[..n]).unwrap(), fd)
}

#[test]
fn the_control_socket_checks_requests_and_a_vanished_client_ends_its_capture() {
    let (_pool, port, mut rx, _tx) = started_null(64);
    let dir = tempfile::tempdir().unwrap();
    let server = CaptureServer::start(dir.path(), vec![port.capture_target()]).unwrap();
    let path = dir.path().join(SOCKET_NAME);
    assert_eq!(server.path(), path);
    let connect = || {
        let c = SeqConn::connect(&path).unwrap();
        c.set_timeouts(Some(Duration::from_secs(5)), None).unwrap();
        c
    };
    let bad = [
        (json!("garbage"), "start"),
        (json!({"start": {"ports": [7]}}), "no port 7"),
        (json!({"start": {"ports": []}}), "no port to capture"),
        (
            json!({"start": {"ports": [0], "rx": false, "tx": false}}),
            "neither",
        ),
        (
            json!({"start": {"ports": [0], "ring_bytes": 100000}}),
            "power of two",
        ),
        (
            json!({"start": {"ports": [0], "snaplen": 0}}),
            "snap length",
        ),
        // A jump backwards (a loop) and a program with no return.
        (
            json!({"start": {"ports": [0], "filter": [[0x05, 0, 0, 0xffff_ffffu32]]}}),
            "filter",
        ),
        (
            json!({"start": {"ports": [0], "filter": [[0x80, 0, 0, 0]]}}),
            "filter",
        ),
        (
            json!({"start": {"ports": [0], "filter": [[0x80, 0, 0]]}}),
            "filter instruction 0",
        ),
    ];
    for (req, want) in bad {
        let (v, fd) = ask(&connect(), &req);
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{req}: {v}"));
        assert!(e.contains(want), "{req}: {e}");
        assert!(fd.is_none());
    }
    let (v, _) = ask(&connect(), &json!({"list": null}));
    assert_eq!(v["ports"][0]["name"], "null:size=64");

    // A capture whose client vanishes: mirroring stops by itself.
    let tap = port.capture_target().tap;
    let c = connect();
    let (v, fd) = ask(
        &c,
        &json!({"start": {"ports": [0], "rx": true, "tx": false}}),
    );
    assert_eq!(v["ok"]["rings"].as_array().unwrap().len(), 1, "{v}");
    let file = std::fs::File::from(fd.unwrap());
    let mut b = Burst::with_capacity(8);
    rx.rx_burst(&mut b);
    assert_eq!(drain_all(&file)[0].len(), 8);
    // A second tool on the same port is refused, with the first one's pid.
    let (v, _) = ask(&connect(), &json!({"start": {"ports": [0]}}));
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {}", std::process::id())),
        "{v}"
    );
    drop(c);
    // The tool is gone: its capture ends, and the port can be captured again.
    let t0 = Instant::now();
    loop {
        let (v, _) = ask(
            &connect(),
            &json!({"start": {"ports": [0], "ring_bytes": 65536, "snaplen": 100}}),
        );
        if v.get("ok").is_some() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the capture did not end: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = tap;
    drop(server);
    assert!(!path.exists(), "the socket file is removed");
}
