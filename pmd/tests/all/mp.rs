//! Multi-process control across real processes: this test binary runs itself again as the
//! other process (the ignored `child` test, which does nothing unless told its role), and
//! kills it with SIGKILL mid-run.

use pmd::mp::{MpConfig, MpError, MpEvent, Owner, Primary, ReleaseWhy, Secondary, SOCKET_NAME};
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
    let pool = mempool::MbufPool::new(
        mempool::MbufPoolConfig::new("mp-pool", 1024)
            .cache_size(64)
            .page_policy(mempool::PagePolicy::Normal)
            .shared_file(dir.path().join("mbufs")),
    )
    .unwrap();
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
    let pool = mempool::MbufPool::new(
        mempool::MbufPoolConfig::new("mp-pool", 256)
            .cache_size(32)
            .page_policy(mempool::PagePolicy::Normal)
            .shared_file(dir.path().join("mbufs")),
    )
    .unwrap();
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
