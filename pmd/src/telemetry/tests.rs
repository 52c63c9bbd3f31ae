//! The server in-process: real sockets in a temporary directory, clients on this thread,
//! the "main loop" answering on another.
#![deny(unsafe_code)]

use super::*;
use crate::port::PortConfig;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn config(dir: &Path, prefix: &str) -> TelemetryConfig {
    let mut cfg = TelemetryConfig::new(prefix);
    cfg.dir = Some(dir.join(prefix));
    cfg
}

/// A server with two null ports whose main loop runs on a thread until dropped.
struct Running {
    telemetry: Arc<Telemetry>,
    stop: Arc<AtomicBool>,
    main: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(tag: &str, tweak: impl FnOnce(&mut TelemetryConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), tag);
        tweak(&mut cfg);
        let telemetry = Arc::new(Telemetry::start(&cfg).unwrap());
        telemetry
            .register_app("/test/app", "Answered by the main loop.")
            .unwrap();
        telemetry
            .register("/test/local", "Answered on the client's thread.", |p| {
                Ok(Data::dict().with("param", p))
            })
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (Arc::clone(&telemetry), Arc::clone(&stop));
        // Registered before the test asks anything (`/` lists it).
        let pool = mempool::MbufPool::new(mempool::MbufPoolConfig::new("tele-srv", 1023)).unwrap();
        telemetry.watch_pool(&pool).unwrap();
        let main = std::thread::spawn(move || {
            let mut ports = Vec::new();
            for id in 0..2 {
                let mut p = Port::open(id, &"null:size=64".parse().unwrap()).unwrap();
                p.configure(&PortConfig::default(), &pool).unwrap();
                ports.push(p);
            }
            while !s.load(Ordering::Acquire) {
                t.serve_with(&ports, |cmd, param| match cmd {
                    "/test/app" => Ok(Data::from(param.unwrap_or("none"))),
                    _ => Err(AnswerError::Unknown),
                });
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            telemetry,
            stop,
            main: Some(main),
            _dir: dir,
        }
    }

    fn path(&self) -> PathBuf {
        self.telemetry.socket_path().to_path_buf()
    }

    fn client(&self) -> Client {
        Client::connect(&self.path()).unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(m) = self.main.take() {
            m.join().unwrap();
        }
    }
}

/// What a killed process leaves: a socket file bound, never unlinked, nobody listening.
fn stale_socket(path: &Path) {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
}

#[test]
fn the_greeting_and_the_builtin_commands_answer_as_dpdks() {
    let r = Running::start("builtin", |_| {});
    let c = r.client();
    assert_eq!(c.greeting().pid, std::process::id());
    assert_eq!(c.greeting().max_output_len, MAX_OUTPUT_LEN);
    assert!(c.greeting().version.starts_with("pmd "));
    let cmds = c.commands().unwrap();
    let mut sorted = cmds.clone();
    sorted.sort();
    assert_eq!(cmds, sorted);
    for want in [
        "/",
        "/info",
        "/help",
        "/ethdev/list",
        "/ethdev/stats",
        "/ethdev/xstats",
        "/ethdev/link_status",
        "/ethdev/info",
        "/pmd/ports",
        "/pmd/pool",
        "/test/app",
    ] {
        assert!(cmds.iter().any(|c| c == want), "{want} in {cmds:?}");
    }
    assert_eq!(
        c.request_raw("/info").unwrap(),
        format!(
            r#"{{"/info":{{"version":"pmd {}","pid":{},"max_output_len":16384}}}}"#,
            env!("CARGO_PKG_VERSION"),
            std::process::id()
        )
    );
    let help = c.request("/help,/ethdev/stats").unwrap();
    assert!(help["/ethdev/stats"].as_str().unwrap().contains("port id"));
    assert!(c
        .request("/help")
        .unwrap()
        .as_str()
        .unwrap()
        .contains("help text"));
    assert_eq!(c.request_raw("/help,/nope").unwrap(), r#"{"/help":null}"#);
    assert_eq!(c.request_raw("/nope").unwrap(), r#"{"/nope":null}"#);
    assert_eq!(c.request_raw(",,,").unwrap(), r#"{"none":null}"#);
}

#[test]
fn port_commands_are_answered_by_the_main_loop() {
    let r = Running::start("ports", |_| {});
    let c = r.client();
    assert_eq!(
        c.request_raw("/ethdev/list").unwrap(),
        r#"{"/ethdev/list":[0,1]}"#
    );
    let s = c.request("/ethdev/stats,1").unwrap();
    assert_eq!(s["ipackets"], 0);
    assert_eq!(s["q_opackets"].as_array().unwrap().len(), 16);
    for bad in [
        "/ethdev/stats",
        "/ethdev/stats,x",
        "/ethdev/stats,99",
        "/ethdev/stats,-1",
    ] {
        assert_eq!(
            c.request_raw(bad).unwrap(),
            r#"{"/ethdev/stats":null}"#,
            "{bad}"
        );
    }
    assert_eq!(c.request("/ethdev/link_status,0").unwrap()["status"], "UP");
    assert_eq!(c.request("/test/app,hello").unwrap(), "hello");
    assert_eq!(c.request("/test/local,x").unwrap()["param"], "x");
    let pool = c.request("/pmd/pool").unwrap();
    assert_eq!(pool["capacity"], 1023);
    assert_eq!(c.request("/pmd/ports").unwrap()[1]["state"], "configured");
}

#[test]
fn without_a_main_loop_port_commands_get_null_after_the_reply_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "nomain");
    cfg.reply_timeout = Duration::from_millis(100);
    let t = Telemetry::start(&cfg).unwrap();
    let c = Client::connect(t.socket_path()).unwrap();
    let t0 = Instant::now();
    assert_eq!(
        c.request_raw("/ethdev/list").unwrap(),
        r#"{"/ethdev/list":null}"#
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
    // The commands that need no port still answer.
    assert_eq!(c.request("/info").unwrap()["pid"], std::process::id());
}

#[test]
fn oversized_and_odd_requests_get_null_answers() {
    let r = Running::start("odd", |_| {});
    let c = r.client();
    let long = "a".repeat(2000);
    c.send_raw(long.as_bytes()).unwrap();
    assert_eq!(
        c.recv_raw(MAX_OUTPUT_LEN).unwrap(),
        format!("{{\"{}\":null}}", "a".repeat(MAX_CMD_LEN))
    );
    // A known command followed by a parameter past the 1023 bytes read: still answered.
    let padded = format!("/ethdev/stats,0{}", " ".repeat(3000));
    assert_eq!(
        c.request("/ethdev/list").unwrap().as_array().unwrap().len(),
        2
    );
    c.send_raw(padded.as_bytes()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&c.recv_raw(MAX_OUTPUT_LEN).unwrap()).unwrap();
    assert_eq!(v["/ethdev/stats"]["ipackets"], 0);
    c.send_raw(&[0xff, 0xfe, b'/']).unwrap();
    let odd = c.recv_raw(MAX_OUTPUT_LEN).unwrap();
    let v: serde_json::Value = serde_json::from_str(&odd).unwrap();
    assert!(
        v.as_object().unwrap().values().all(|v| v.is_null()),
        "{odd}"
    );
    assert_eq!(c.request("/info").unwrap()["max_output_len"], 16384);
}

#[test]
fn clients_past_the_limit_are_closed_at_once_and_slots_come_back() {
    let r = Running::start("limit", |cfg| cfg.max_clients = 3);
    let held: Vec<Client> = (0..3).map(|_| r.client()).collect();
    match Client::connect(&r.path()) {
        Err(ClientError::Closed { .. }) => {}
        other => panic!("{other:?}"),
    }
    for c in &held {
        assert_eq!(c.request("/info").unwrap()["max_output_len"], 16384);
    }
    drop(held);
    // The threads notice the closed clients within a poll.
    let t0 = Instant::now();
    loop {
        match Client::connect(&r.path()) {
            Ok(c) => {
                assert!(c.request("/ethdev/list").is_ok());
                break;
            }
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(5), "{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_that_never_reads_is_closed_and_others_are_served_meanwhile() {
    let r = Running::start("noread", |cfg| {
        cfg.send_timeout = Duration::from_millis(200);
    });
    let greedy = r.client();
    let other = r.client();
    // Send requests for big answers and read none: the socket buffers fill, the server's
    // send times out, and it closes the connection.
    let t0 = Instant::now();
    let mut sent = 0;
    let closed = loop {
        match greedy.send_raw(b"/") {
            Ok(()) => sent += 1,
            Err(_) => break true,
        }
        if sent % 200 == 0 {
            // Meanwhile another client is answered promptly.
            let t = Instant::now();
            assert!(other.request("/ethdev/list").is_ok());
            assert!(t.elapsed() < Duration::from_secs(2));
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break false;
        }
    };
    assert!(closed, "still open after {sent} unread requests");
    assert!(other.request("/info").is_ok());
}

#[test]
fn a_live_socket_is_refused_with_its_pid_and_a_stale_one_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "live");
    let first = Telemetry::start(&cfg).unwrap();
    match Telemetry::start(&cfg) {
        Err(e @ TelemetryError::InUse { pid, .. }) => {
            assert_eq!(pid, Some(std::process::id()));
            assert!(
                e.to_string()
                    .contains(&format!("pid {}", std::process::id())),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    let path = first.socket_path().to_path_buf();
    drop(first);
    assert!(!path.exists(), "the socket goes with the server");
    // A file left by a process that was killed: a socket nobody listens on.
    stale_socket(&path);
    assert!(path.exists());
    let again = Telemetry::start(&cfg).unwrap();
    assert!(Client::connect(again.socket_path()).is_ok());
}

#[test]
fn dropping_the_server_is_quick_even_with_clients_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let t = Telemetry::start(&config(dir.path(), "drop")).unwrap();
    let c = Client::connect(t.socket_path()).unwrap();
    // A request for the main loop that nobody serves, waiting on the client's thread.
    c.send_raw(b"/ethdev/list").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    drop(t);
    assert!(
        t0.elapsed() < Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn prefixes_name_one_directory_and_paths_follow_dpdk() {
    assert!(check_prefix("rte").is_ok());
    assert!(check_prefix("l2fwd-1").is_ok());
    for bad in ["", ".", "..", "a/b", "a\0b"] {
        assert!(check_prefix(bad).is_err(), "{bad:?}");
    }
    let p = socket_path("rte");
    assert!(p.ends_with("dpdk/rte/dpdk_telemetry.v2"), "{}", p.display());
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Telemetry::start(&config(dir.path(), "a/b")),
        Err(TelemetryError::BadPrefix(_))
    ));
    let t = Telemetry::start(&config(dir.path(), "cmds")).unwrap();
    assert!(matches!(
        t.register_app("bad", ""),
        Err(TelemetryError::BadCommand(_))
    ));
    assert!(matches!(
        t.register_app("/ethdev/stats", ""),
        Err(TelemetryError::Duplicate(_))
    ));
}

#[test]
fn instances_lists_live_and_stale_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("dpdk");
    let mut cfg = TelemetryConfig::new("one");
    cfg.dir = Some(base.join("one"));
    let t = Telemetry::start(&cfg).unwrap();
    std::fs::create_dir_all(base.join("gone")).unwrap();
    stale_socket(&base.join("gone").join(SOCKET_NAME));
    let found = instances(&base);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].prefix, "gone");
    assert_eq!(found[0].state, InstanceState::Stale);
    assert_eq!(found[1].prefix, "one");
    match &found[1].state {
        InstanceState::Live { greeting, .. } => assert_eq!(greeting.pid, std::process::id()),
        other => panic!("{other:?}"),
    }
    drop(t);
    assert!(instances(&base).iter().all(|i| i.prefix != "one"));
}
