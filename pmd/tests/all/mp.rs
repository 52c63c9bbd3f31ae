//! Multi-process control across real processes: this test binary runs itself again as the
//! other process (the ignored `child` test, which does nothing unless told its role), and
//! kills it with SIGKILL mid-run.

use pmd::ethdev::Burst;
use pmd::mp::{MpConfig, MpError, MpEvent, Owner, Primary, ReleaseWhy, Secondary, SOCKET_NAME};
use pmd::port::attach::AttachedPair;
use pmd::port::{Port, PortConfig};
use pmd::sys::net::{send_signal, SIGKILL};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROLE: &str = "PMD_MP_TEST_ROLE";
const DIR: &str = "PMD_MP_TEST_DIR";

/// The other process: `secondary` claims port 0 queue 1, checks the shared memory (the
/// primary's word at offset 0 read at the primary's address; its own written at 8), and
/// waits for its primary to go;
/// `primary` publishes port 0 with 4 queues and waits to be killed.
#[test]
#[ignore = "run by the tests below as their second process"]
fn child() {
    let (Ok(role), Ok(dir)) = (std::env::var(ROLE), std::env::var(DIR)) else {
        return;
    };
    let dir = Path::new(&dir);
    match role.as_str() {
        "secondary" => {
            let mut s = Secondary::attach_at(&dir.join(SOCKET_NAME), "t", "child").unwrap();
            for (m, r) in s.memory() {
                assert_eq!(r.addr() as u64, m.addr, "mapped where the primary maps it");
                let p = r.as_ptr().cast::<u64>();
                // SAFETY: offsets 0 and 8 are inside the mapping, which lives until the end;
                // the primary writes 0 before publishing and reads 8 after this line.
                unsafe {
                    println!("memory {} {:#x}", m.name, p.read_volatile());
                    p.add(1).write_volatile(0xfeed);
                }
            }
            let q = s.claim(0, Some(1)).unwrap();
            println!("claimed {q}");
            while s.primary_gone().is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("gone: {}", s.primary_gone().unwrap());
        }
        "pool-user" => {
            let s = Secondary::attach_at(&dir.join(SOCKET_NAME), "t", "child").unwrap();
            let pool = s.pool("mp-pool").expect("the primary shares its pool");
            let mut cache = pool.cache();
            let mut burst = [mempool::RawMbuf::default(); 40];
            assert!(pool.alloc_bulk(&mut cache, &mut burst));
            // SAFETY: just allocated; the first 30 are not used again, the last 10 are held.
            unsafe { pool.free_bulk(&mut cache, &burst[..30]) };
            println!("holding {} 10", cache.len());
            std::thread::sleep(Duration::from_secs(60));
        }
        "pool-exit" => {
            let s = Secondary::attach_at(&dir.join(SOCKET_NAME), "t", "child").unwrap();
            let pool = Arc::clone(s.pool("mp-pool").expect("the primary shares its pool"));
            // Mbufs freed through this thread's cache stay in it: `_exit` runs no destructor
            // (as a process that aborts), so nothing flushes it.
            let ms: Vec<_> = (0..12).map(|_| pool.alloc().unwrap()).collect();
            mempool::lcache::with_cache(&pool, |c| ms.into_iter().for_each(|m| m.free_to(c)));
            let cached = mempool::lcache::with_cache(&pool, |c| c.len());
            println!("cached {cached}");
            drop(s); // a goodbye
                     // SAFETY: ends the process at once; nothing after it runs.
            unsafe { libc::_exit(0) };
        }
        "datapath" => {
            let mut s = Secondary::attach_at(&dir.join(SOCKET_NAME), "t", "child").unwrap();
            let pool = Arc::clone(s.pool("mp-dp").expect("the primary shares its pool"));
            let q = s.claim(0, Some(1)).unwrap();
            let mut pair = AttachedPair::open(dir, 0, q, &pool, None).unwrap();
            println!("attached {q}");
            let mut burst = Burst::with_capacity(32);
            let mut sent = 0u32;
            while sent < 100 {
                while burst.len() < 32 && sent + (burst.len() as u32) < 100 {
                    let seq = 1000 + sent + burst.len() as u32;
                    let f = frame(1, 2, seq, 7);
                    let mut m = mempool::lcache::alloc(&pool).unwrap();
                    m.extend_from_slice(&f).unwrap();
                    burst.push(m).unwrap();
                }
                sent += pair.tx.tx_burst(&mut burst) as u32;
            }
            println!("sent {sent}");
            let mut got = 0usize;
            let mut rx = Burst::with_capacity(32);
            let mut idle = Burst::with_capacity(1);
            let stop = dir.join("stop");
            while s.primary_gone().is_none() && !stop.exists() {
                got += pair.rx.rx_burst(&mut rx);
                mempool::lcache::with_cache(&pool, |c| rx.free_all(c));
                pair.tx.tx_burst(&mut idle); // reclaims what was sent
            }
            let (r, t) = pair.stats();
            println!("received {got} {} {}", r.packets, t.packets);
            if s.primary_gone().is_none() {
                // A clean exit: give the pair back, and free what it posted once the
                // primary has destroyed its rings.
                s.release(0, q).unwrap();
                println!("rebuilt {}", pair.wait_rebuilt(Duration::from_secs(10)));
                drop(pair);
                mempool::lcache::flush();
            }
        }
        "primary" => {
            let p = Primary::start(&MpConfig::new("t").with_dir(dir)).unwrap();
            p.publish(0, "emu-mana:wire=none", 4, &[0]);
            println!("ready");
            std::thread::sleep(Duration::from_secs(60));
        }
        r => panic!("unknown role {r}"),
    }
}

fn spawn(role: &str, dir: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "mp::child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--quiet",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

/// The child's next line that starts with `prefix`.
fn line(out: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(out.read_line(&mut l).unwrap() > 0, "no '{prefix}' line");
        if l.starts_with(prefix) {
            return l.trim_end().to_string();
        }
    }
}

/// A shared mbuf pool of `n` mbufs (caches of `cache`) in `dir/mbufs`.
fn shared_pool(dir: &Path, name: &str, n: u32, cache: u32) -> Arc<mempool::MbufPool> {
    mempool::MbufPool::new(
        mempool::MbufPoolConfig::new(name, n)
            .cache_size(cache)
            .page_policy(mempool::PagePolicy::Normal)
            .shared_file(dir.join("mbufs")),
    )
    .unwrap()
}

/// A 64-byte UDP frame from `02:00:00:00:00:0{from}` to `..:0{to}`, numbered `seq`.
fn frame(from: u8, to: u8, seq: u32, src_port: u16) -> Vec<u8> {
    let mut payload = [0u8; 22];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, from], [2, 0, 0, 0, 0, to])
        .ipv4([169, 254, 1, from], [169, 254, 1, to], 64)
        .udp(src_port, 9000)
        .write(&mut out, &payload)
        .unwrap();
    out
}

fn seq_of(m: &mempool::Mbuf) -> u32 {
    u32::from_be_bytes(m[42..46].try_into().unwrap())
}

fn wait_event(p: &Primary, want: impl Fn(&MpEvent) -> bool) -> MpEvent {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(e) = p.next_event(Duration::from_millis(50)) {
            if want(&e) {
                return e;
            }
        }
    }
    panic!("no such event within 10 s");
}

#[test]
fn a_killed_secondary_s_cached_mbufs_come_back_to_the_shared_pool() {
    let dir = tempfile::tempdir().unwrap();
    let p = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap();
    let pool = shared_pool(dir.path(), "mp-pool", 1024, 64);
    p.share_pool(&pool).unwrap();
    let (mut c, mut out) = spawn("pool-user", dir.path());
    let holding = line(&mut out, "holding");
    let (cached, held) = holding
        .trim_start_matches("holding ")
        .split_once(' ')
        .unwrap();
    let (cached, held): (u32, u32) = (cached.parse().unwrap(), held.parse().unwrap());
    assert!(cached >= 30, "{holding}");
    assert_eq!(
        pool.in_use(),
        held,
        "the secondary's cache counts as free here too"
    );
    send_signal(c.id(), SIGKILL).unwrap();
    c.wait().unwrap();
    let e = wait_event(&p, |e| matches!(e, MpEvent::Reclaimed { .. }));
    assert_eq!(
        e,
        MpEvent::Reclaimed {
            pid: c.id(),
            pool: "mp-pool".into(),
            mbufs: cached
        }
    );
    assert!(pool.mempool().cache_owners().is_empty());
    assert_eq!(
        pool.in_use(),
        held,
        "what it held outside its cache is still out: its queues' rebuild returns those"
    );
    // A private pool cannot be shared.
    let private = mempool::MbufPool::new(
        mempool::MbufPoolConfig::new("private", 64).page_policy(mempool::PagePolicy::Normal),
    )
    .unwrap();
    let err = p.share_pool(&private).unwrap_err();
    assert!(err.to_string().contains("shared_file"), "{err}");
}

#[test]
fn a_secondary_that_exits_without_flushing_its_cache_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let p = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap();
    let pool = shared_pool(dir.path(), "mp-pool", 256, 32);
    p.share_pool(&pool).unwrap();
    let (mut c, mut out) = spawn("pool-exit", dir.path());
    let cached: u32 = line(&mut out, "cached")
        .trim_start_matches("cached ")
        .parse()
        .unwrap();
    assert!(cached >= 12, "{cached}");
    assert!(c.wait().unwrap().success());
    let e = wait_event(&p, |e| matches!(e, MpEvent::Reclaimed { .. }));
    assert_eq!(
        e,
        MpEvent::Reclaimed {
            pid: c.id(),
            pool: "mp-pool".into(),
            mbufs: cached
        }
    );
    assert_eq!(pool.in_use(), 0, "the pool is whole");
}

#[test]
fn secondaries_send_and_receive_on_a_queue_pair_the_primary_exports_and_rebuilds() {
    exported_pair_round_trips("emu-mana");
}

/// The same on the mlx5 model: rings, CQs, doorbell records and the BlueFlame register in
/// shared files.
#[test]
fn secondaries_send_and_receive_on_an_mlx5_queue_pair_the_primary_exports_and_rebuilds() {
    exported_pair_round_trips("emu-mlx5");
}

/// A port of `kind` exports queue pair 1 to a secondary, which sends and receives on it
/// (twice: once leaving cleanly, once left running when this process stops).
fn exported_pair_round_trips(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let pool = shared_pool(dir.path(), "mp-dp", 4096, 64);
    let cable = format!("mp-dp-{kind}-{}", std::process::id());
    let spec = |n: u8| {
        format!("{kind}:wire=loop:{cable},engine=thread,mac=02:00:00:00:00:0{n}")
            .parse()
            .unwrap()
    };
    let (mut a, mut b) = (
        Port::open(0, &spec(1)).unwrap(),
        Port::open(1, &spec(2)).unwrap(),
    );
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    a.configure(
        &cfg.clone()
            .with_queues(2, 2)
            .with_export(vec![1], dir.path()),
        &pool,
    )
    .unwrap();
    b.configure(&cfg, &pool).unwrap();
    let err = a.rx_queue(1).unwrap_err().to_string();
    assert!(err.contains("exported to another process"), "{err}");
    let (mut a_rx, mut b_rx, mut b_tx) = (
        a.rx_queue(0).unwrap(),
        b.rx_queue(0).unwrap(),
        b.tx_queue(0).unwrap(),
    );
    a.start().unwrap();
    b.start().unwrap();

    // Round 0: the secondary leaves cleanly (it releases the pair, this process rebuilds
    // the port's queues, and it frees what it had posted). Round 1: this process stops
    // while the secondary runs; what that one had posted stays out.
    for round in 0..2 {
        let missed = a.stats().imissed;
        let _ = std::fs::remove_file(dir.path().join("stop"));
        let p = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap();
        p.publish(0, kind, 2, &[0]);
        p.share_pool(&pool).unwrap();

        let (mut c, mut out) = spawn("datapath", dir.path());
        assert_eq!(line(&mut out, "attached"), "attached 1");
        // What the secondary sends arrives at B, every frame.
        let mut seqs = Vec::new();
        let mut burst = Burst::with_capacity(32);
        let t0 = Instant::now();
        while seqs.len() < 100 && t0.elapsed() < Duration::from_secs(10) {
            b_rx.rx_burst(&mut burst);
            seqs.extend(burst.iter().map(seq_of));
            burst.free_all(&mut pool.cache());
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1000..1100).collect::<Vec<_>>(), "round {round}");
        assert_eq!(line(&mut out, "sent"), "sent 100");

        // What B sends to A spreads over queue 0 (here) and queue 1 (the secondary) by RSS.
        let (mut here, mut sent) = (0usize, 0u32);
        let mut rx = Burst::with_capacity(32);
        while sent < 400 {
            for k in 0..16 {
                let mut m = mempool::lcache::alloc(&pool).unwrap();
                m.extend_from_slice(&frame(2, 1, sent + k, 5000 + (sent + k) as u16))
                    .unwrap();
                burst.push(m).unwrap();
            }
            while !burst.is_empty() {
                sent += b_tx.tx_burst(&mut burst) as u32;
            }
            std::thread::sleep(Duration::from_millis(2));
            here += a_rx.rx_burst(&mut rx);
            mempool::lcache::with_cache(&pool, |c| rx.free_all(c));
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(500) {
            here += a_rx.rx_burst(&mut rx);
            mempool::lcache::with_cache(&pool, |c| rx.free_all(c));
            b_tx.tx_burst(&mut burst);
        }
        let rec = if round == 0 {
            std::fs::write(dir.path().join("stop"), b"").unwrap();
            let rec = line(&mut out, "received");
            let e = wait_event(&p, |e| matches!(e, MpEvent::Released { .. }));
            assert!(
                matches!(
                    e,
                    MpEvent::Released {
                        port: 0,
                        queue: 1,
                        why: ReleaseWhy::Asked,
                        ..
                    }
                ),
                "{e:?}"
            );
            // Its own handles carry on over the rebuild.
            a.rebuild_queues().unwrap();
            assert_eq!(line(&mut out, "rebuilt"), "rebuilt true");
            assert!(c.wait().unwrap().success());
            p.shutdown("done");
            rec
        } else {
            p.shutdown("done");
            let rec = line(&mut out, "received");
            assert!(c.wait().unwrap().success());
            rec
        };
        let counts: Vec<u64> = rec.split(' ').skip(1).map(|n| n.parse().unwrap()).collect();
        assert!(c.wait().unwrap().success());
        let there = counts[0] as usize;
        assert_eq!(counts[1], there as u64, "its counters say what it got");
        assert_eq!(counts[2], 100, "and what it sent");
        assert!(
            here > 0 && there > 0,
            "round {round}: RSS spreads the flows: {here} here, {there} there"
        );
        assert_eq!(
            here + there + (a.stats().imissed - missed) as usize,
            400,
            "round {round}: every frame B sent is received by one of the processes, or \
             counted missed"
        );
    }
    // The pair's rings hold the last secondary's state: nobody attaches again until this
    // process rebuilds it.
    let err = AttachedPair::open(dir.path(), 0, 1, &pool, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rebuilds the pair"), "{err}");
    // Everything this process holds goes back with its ports, and the first secondary's
    // buffers came back; the second one's posted buffers stay out (the device, here, could
    // still write into them until its queue was destroyed): its ring of 256, less what it
    // had taken and not yet replaced (a MANA queue refills in batches of 32, an mlx5 one
    // at a quarter of the ring, at most 64).
    drop((a_rx, b_rx, b_tx));
    drop((a, b));
    let out = pool.in_use();
    let batch = if kind == "emu-mlx5" { 64 } else { 32 };
    assert!((256 - batch..=256).contains(&out), "{out} mbufs out");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("port"))
        .collect();
    assert!(
        left.is_empty(),
        "rings and descriptions removed with the port: {left:?}"
    );
}

#[test]
fn a_killed_secondary_gives_its_queue_back_and_a_new_one_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = Primary::start(&MpConfig::new("t").with_dir(dir.path())).unwrap();
    p.publish(0, "emu-mana:wire=none", 4, &[0]);
    // Memory the secondary maps where this process maps it.
    let region = mempool::Region::new(
        1 << 16,
        &mempool::RegionOptions::with_policy(mempool::PagePolicy::Normal)
            .shared_file(dir.path().join("pool")),
    )
    .unwrap();
    let word = region.as_ptr().cast::<u64>();
    // SAFETY: offsets 0 and 8 are inside the region, alive until the end of the test.
    unsafe { word.write_volatile(0x1234_5678) };
    p.share_memory("pool0", &region).unwrap();
    let (mut c, mut out) = spawn("secondary", dir.path());
    assert_eq!(line(&mut out, "memory"), "memory pool0 0x12345678");
    assert_eq!(line(&mut out, "claimed"), "claimed 1");
    // SAFETY: as above; the child wrote before it claimed.
    assert_eq!(unsafe { word.add(1).read_volatile() }, 0xfeed);
    assert_eq!(p.owners(0).unwrap()[1], Owner::Secondary(c.id()));
    send_signal(c.id(), SIGKILL).unwrap();
    c.wait().unwrap();
    let e = wait_event(&p, |e| matches!(e, MpEvent::Released { .. }));
    assert_eq!(
        e,
        MpEvent::Released {
            pid: c.id(),
            port: 0,
            queue: 1,
            why: ReleaseWhy::Exited
        }
    );
    assert_eq!(p.owners(0).unwrap()[1], Owner::Free);
    let (mut c2, mut out2) = spawn("secondary", dir.path());
    assert_eq!(line(&mut out2, "claimed"), "claimed 1");
    assert_eq!(p.owners(0).unwrap()[1], Owner::Secondary(c2.id()));
    // The primary stopping tells it why, and it ends cleanly.
    p.shutdown("SIGTERM");
    assert_eq!(line(&mut out2, "gone"), "gone: SIGTERM");
    assert!(c2.wait().unwrap().success());
}

#[test]
fn a_killed_primary_is_noticed_and_its_socket_refuses_new_secondaries() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, mut out) = spawn("primary", dir.path());
    line(&mut out, "ready");
    let path = dir.path().join(SOCKET_NAME);
    let mut s = Secondary::attach_at(&path, "t", "me").unwrap();
    assert_eq!(s.primary_pid(), Some(c.id()));
    assert_eq!(s.claim(0, None).unwrap(), 1);
    send_signal(c.id(), SIGKILL).unwrap();
    c.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.primary_gone().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let why = s.primary_gone().expect("the secondary noticed");
    assert!(why.contains("exited or was killed"), "{why}");
    let err = Secondary::attach_at(&path, "t", "late").unwrap_err();
    assert!(matches!(err, MpError::PrimaryGone { .. }), "{err}");
    assert!(err.to_string().contains("is gone"), "{err}");
}

/// A port of `kind` (engine thread) exporting pair 1 of two, its description as written,
/// and a stand-in for a device's command file of two pages.
struct Exported {
    dir: tempfile::TempDir,
    pool: Arc<mempool::MbufPool>,
    _port: Port,
    desc: std::path::PathBuf,
    original: String,
    file: std::fs::File,
}

fn exported(kind: &str, tag: &str) -> Exported {
    let dir = tempfile::tempdir().unwrap();
    let pool = shared_pool(dir.path(), tag, 2048, 0);
    let spec = format!(
        "{kind}:wire=loop:{tag}-{},engine=thread",
        std::process::id()
    )
    .parse()
    .unwrap();
    let mut port = Port::open(0, &spec).unwrap();
    port.configure(
        &PortConfig::default()
            .with_ring_sizes(256, 256)
            .with_queues(2, 2)
            .with_export(vec![1], dir.path()),
        &pool,
    )
    .unwrap();
    let desc = dir.path().join("port0.queue1.export");
    let original = std::fs::read_to_string(&desc).unwrap();
    let file = tempfile::tempfile().unwrap();
    file.set_len(8192).unwrap();
    Exported {
        dir,
        pool,
        _port: port,
        desc,
        original,
        file,
    }
}

/// What another process wrote about where a pair's doorbell page is (the primary's
/// description: a device page, monitor offsets, a device generation) is checked before the
/// pair is claimed: a pair that needs the device's descriptor and got none, a descriptor of
/// another device generation (a recovered port), a monitor offset that is not a page of the
/// descriptor's file (which would fault at the first doorbell) are refused, with what to
/// do; the pair is still free afterwards.
#[test]
fn a_description_of_device_pages_is_checked_before_the_pair_is_claimed() {
    use std::os::fd::AsFd;
    let Exported {
        dir,
        pool,
        _port,
        desc,
        original,
        file,
    } = exported("emu-mana", "mp-dev");
    let dev = |generation| pmd::sys::DeviceFd {
        fd: file.as_fd(),
        generation,
    };
    let attempt = |extra: &str, device: Option<pmd::sys::DeviceFd<'_>>| {
        std::fs::write(&desc, format!("{original}{extra}")).unwrap();
        AttachedPair::open(dir.path(), 0, 1, &pool, device)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let cases = [
        (
            "value db_device 1\n",
            None,
            "pass the primary's device descriptor",
        ),
        (
            "value device_gen 2\n",
            Some(dev(1)),
            "not the one these rings are on",
        ),
        (
            "value db_device 1\nvalue tx_db_monitor_offset 8192\n",
            Some(dev(1)),
            "tx_db_monitor at offset 8192: not in a page of the device",
        ),
        (
            "value db_device 1\nvalue rx_db_monitor_offset 100\n",
            Some(dev(1)),
            "rx_db_monitor at offset 100: not a page of the device",
        ),
    ];
    for (extra, device, want) in cases {
        let err = attempt(extra, device);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // Nothing was claimed: the pair, described as it was, attaches.
    std::fs::write(&desc, &original).unwrap();
    let pair = AttachedPair::open(dir.path(), 0, 1, &pool, None).unwrap();
    pair.stop();
}

/// An mlx5 description (another process wrote it) is checked before the pair is claimed:
/// ring sizes, record offsets, the UAR register's place, the CQE format. Every refusal says
/// why, and the pair described as it was still attaches afterwards.
#[test]
fn a_bad_mlx5_description_is_refused_before_the_pair_is_claimed() {
    use std::os::fd::AsFd;
    let Exported {
        dir,
        pool,
        _port,
        desc,
        original,
        file,
    } = exported("emu-mlx5", "mp-mlx5");
    assert!(original.contains("driver mlx5\n"), "{original}");
    let dev = pmd::sys::DeviceFd {
        fd: file.as_fd(),
        generation: 1,
    };
    // `value NAME N` set to `v` (added when missing).
    let with = |name: &str, v: &str| {
        let prefix = format!("value {name} ");
        let mut out: Vec<String> = original
            .lines()
            .filter(|l| !l.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        out.push(format!("{prefix}{v}"));
        out.join("\n") + "\n"
    };
    // The area line of `role` rewritten by `f`.
    let area = |role: &str, f: &dyn Fn(&str) -> String| {
        let prefix = format!("area {role} ");
        original
            .lines()
            .map(|l| {
                if l.starts_with(&prefix) {
                    f(l)
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    };
    let cases: Vec<(String, Option<pmd::sys::DeviceFd<'_>>, &str)> = vec![
        (
            with("tx_uar_device_offset", "4096"),
            None,
            "pass the primary's device descriptor",
        ),
        (
            with("tx_uar_device_offset", "8192"),
            Some(dev),
            "not in a page of the device",
        ),
        (
            with("tx_uar_device_offset", "4100"),
            Some(dev),
            "is not aligned",
        ),
        (
            // Page 0x500: command 5 (the core clock), no UAR.
            with("tx_uar_device_offset", &(0x500u64 * 4096).to_string()),
            Some(dev),
            "not a UAR page of the device",
        ),
        (with("tx_wqe_cnt", "100"), None, "tx_wqe_cnt 100"),
        (with("rx_cqe_cnt", "64"), None, "rx_cqe_cnt 64"),
        (with("rx_stride", "8"), None, "rx_stride 8"),
        (with("tx_min_inline", "7"), None, "neither 0 nor 18"),
        (
            with("rx_cqe_compression", "2"),
            None,
            "rx_cqe_compression 2",
        ),
        (
            area("tx_dbrec", &|l| l.replacen(" 8 ", " 8@3 ", 1)),
            None,
            "aligned to 8",
        ),
        (
            area("rx_rq", &|l| {
                let f: Vec<&str> = l.splitn(4, ' ').collect();
                format!("area rx_rq 64 {}", f[3])
            }),
            None,
            "does not hold",
        ),
    ];
    for (text, device, want) in cases {
        std::fs::write(&desc, &text).unwrap();
        let err = AttachedPair::open(dir.path(), 0, 1, &pool, device)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{want}: {err}\n{text}");
    }
    // Nothing was claimed: the pair, described as it was, attaches.
    std::fs::write(&desc, &original).unwrap();
    let pair = AttachedPair::open(dir.path(), 0, 1, &pool, None).unwrap();
    pair.stop();
}
