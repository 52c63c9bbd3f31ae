//! Two processes exchange packets over the shared-memory wire: this test's port sends
//! numbered frames, a child process (`shm_echo`) echoes them back.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::port::{Burst, Port, PortConfig};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn frames_cross_between_processes_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("it-{}", std::process::id());
    let spec = format!("emu-mana:wire=shm:{name}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shm_echo"))
        .args([&spec, "500", "30"])
        .env("PMD_SHM_DIR", dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    std::env::set_var("PMD_SHM_DIR", dir.path());
    let pool = MbufPool::new(MbufPoolConfig::new("it", 1024)).unwrap();
    let cfg = PortConfig {
        rx_ring_size: 256,
        tx_ring_size: 256,
        ..Default::default()
    };
    let (port, mut rx, mut tx) =
        Port::open_started(0, &spec.parse().unwrap(), &cfg, &pool).unwrap();

    let mut sent = 0u32;
    let mut seen = vec![false; 500];
    let mut got = 0;
    let mut b_in = Burst::with_capacity(32);
    let t0 = Instant::now();
    while got < 500 && t0.elapsed() < Duration::from_secs(30) {
        // Paced so the echo side never runs out of receive buffers.
        if sent < 500 && sent - got < 64 {
            let mut b = Burst::with_capacity(16);
            while b.spare() > 0 && sent + (b.len() as u32) < 500 {
                let mut m = mempool::lcache::alloc(&pool).unwrap();
                let seq = sent + b.len() as u32;
                let mut f = vec![0u8; 64];
                f[..6].copy_from_slice(&[0xff; 6]);
                f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental EtherType
                f[14..18].copy_from_slice(&seq.to_be_bytes());
                m.extend_from_slice(&f).unwrap();
                b.push(m).unwrap();
            }
            sent += tx.tx_burst(&mut b) as u32;
        }
        rx.rx_burst(&mut b_in);
        while let Some(m) = b_in.pop() {
            let seq = u32::from_be_bytes(m.data()[14..18].try_into().unwrap()) as usize;
            assert!(!seen[seq], "duplicate {seq}");
            seen[seq] = true;
            got += 1;
            mempool::lcache::free(&pool, m);
        }
    }
    assert_eq!(got, 500, "every frame came back");
    let mut rest = String::new();
    for l in out.lines() {
        rest = l.unwrap();
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(
        rest, "echoed 500 in_use 0",
        "the echo process ends with all its buffers back"
    );
    drop((rx, tx));
    mempool::lcache::flush();
    drop(port);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_dead_peer_is_noticed_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pmd-wire-dead");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shm_echo"))
        .args(["emu-mana:wire=shm:dead", "1000000", "60"])
        .env("PMD_SHM_DIR", dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let mut end = pmd::emu::wire::Shm::open_at("dead", &path).unwrap();
    use pmd::emu::wire::Wire;
    assert!(end.peer_alive());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!end.peer_alive(), "a killed peer is seen as gone");
    // Sending to a dead peer does not block.
    let t0 = Instant::now();
    for _ in 0..5000 {
        end.send(&[0u8; 60]);
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
}
