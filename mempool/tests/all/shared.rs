//! Shared mbuf pools across real processes: this test binary runs itself again as the other
//! process (the ignored `child` test, which does nothing unless told its role), which
//! attaches to the pool, moves mbufs both ways, and in one test is killed with SIGKILL while
//! its cache holds mbufs.

use mempool::{
    Error, MbufPool, MbufPoolConfig, Mempool, PagePolicy, PoolConfig, RawMbuf, RegionOptions,
};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;

const ROLE: &str = "MEMPOOL_SHARED_TEST_ROLE";
const FILE: &str = "MEMPOOL_SHARED_TEST_FILE";
const INDEX: &str = "MEMPOOL_SHARED_TEST_INDEX";

/// The other process. `worker`: attaches, reads and frees the mbuf the creator left for it,
/// leaves one of its own for the creator, and exits normally (its cache flushed).
/// `hoarder`: attaches, leaves 30 mbufs in its cache and holds 10 more, then waits to be
/// killed.
#[test]
#[ignore = "run by the tests below as their second process"]
fn child() {
    let (Ok(role), Ok(file)) = (std::env::var(ROLE), std::env::var(FILE)) else {
        return;
    };
    let pool = MbufPool::attach(Path::new(&file), &RegionOptions::default()).unwrap();
    println!(
        "attached {} {} {} {}",
        pool.name(),
        pool.capacity(),
        pool.headroom(),
        pool.data_room()
    );
    match role.as_str() {
        "worker" => {
            let idx: u32 = std::env::var(INDEX).unwrap().parse().unwrap();
            // SAFETY: the creator gave this mbuf up to us (it does not touch it again).
            let m = unsafe { pool.from_raw(RawMbuf::from_index(idx)) };
            println!("read {}", String::from_utf8_lossy(&m));
            drop(m);
            let mut cache = pool.cache();
            let mut mine = cache.alloc().unwrap();
            mine.extend_from_slice(b"from the secondary").unwrap();
            let mut burst = [RawMbuf::default(); 20];
            assert!(pool.alloc_bulk(&mut cache, &mut burst));
            // SAFETY: just allocated, not used again.
            unsafe { pool.free_bulk(&mut cache, &burst) };
            println!("kept {}", mine.into_raw().index());
        }
        "hoarder" => {
            let mut cache = pool.cache();
            let mut burst = [RawMbuf::default(); 40];
            assert!(pool.alloc_bulk(&mut cache, &mut burst));
            // SAFETY: just allocated; the first 30 are not used again, the last 10 are held.
            unsafe { pool.free_bulk(&mut cache, &burst[..30]) };
            println!("holding {} 10", cache.len());
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        r => panic!("unknown role {r}"),
    }
}

fn spawn(role: &str, file: &Path, index: Option<u32>) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "shared::child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--quiet",
    ])
    .env(ROLE, role)
    .env(FILE, file)
    .stdout(Stdio::piped());
    if let Some(i) = index {
        cmd.env(INDEX, i.to_string());
    }
    let mut c = cmd.spawn().unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

/// The child's next line that starts with `word`, without it.
fn line(out: &mut BufReader<ChildStdout>, word: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(
            out.read_line(&mut l).unwrap() > 0,
            "child ended before saying '{word}'"
        );
        if let Some(rest) = l.trim().strip_prefix(word) {
            return rest.trim().to_owned();
        }
    }
}

fn pool_file(tag: &str) -> PathBuf {
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_owned()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("mempool-shared-{tag}-{}", std::process::id()))
}

fn shared_pool(tag: &str, n: u32) -> Arc<MbufPool> {
    MbufPool::new(
        MbufPoolConfig::new(format!("sh-{tag}"), n)
            .cache_size(32)
            .page_policy(PagePolicy::Normal)
            .shared_file(pool_file(tag)),
    )
    .unwrap()
}

fn file_of(pool: &MbufPool) -> PathBuf {
    pool.mempool().region().shared_path().unwrap().to_owned()
}

#[test]
fn mbufs_move_both_ways_between_processes_and_the_pool_ends_whole() {
    let pool = shared_pool("worker", 256);
    assert!(pool.is_shared());
    let mut m = pool.alloc().unwrap();
    m.extend_from_slice(b"from the primary").unwrap();
    let idx = m.into_raw().index();
    assert_eq!(pool.in_use(), 1);

    let (mut c, mut out) = spawn("worker", &file_of(&pool), Some(idx));
    assert_eq!(
        line(&mut out, "attached"),
        format!("sh-worker 256 {} {}", pool.headroom(), pool.data_room())
    );
    assert_eq!(line(&mut out, "read"), "from the primary");
    let kept: u32 = line(&mut out, "kept").parse().unwrap();
    assert!(c.wait().unwrap().success());

    // SAFETY: the child gave this mbuf up when it exited.
    let theirs = unsafe { pool.from_raw(RawMbuf::from_index(kept)) };
    assert_eq!(&theirs[..], b"from the secondary");
    drop(theirs);
    assert_eq!(pool.in_use(), 0, "everything back, across both processes");
    assert_eq!(pool.available(), 256);
    assert!(
        pool.mempool().cache_owners().is_empty(),
        "the child's cache slot is free"
    );
}

#[test]
fn a_killed_process_s_cached_mbufs_are_reclaimed_and_what_it_held_is_counted() {
    let pool = shared_pool("hoarder", 512);
    let (mut c, mut out) = spawn("hoarder", &file_of(&pool), None);
    let holding = line(&mut out, "holding");
    let (cached, held) = holding.split_once(' ').unwrap();
    let (cached, held): (u32, u32) = (cached.parse().unwrap(), held.parse().unwrap());
    assert!(cached >= 30, "{holding}");
    let pid = c.id();
    assert_eq!(pool.mempool().cache_owners(), vec![pid]);
    assert_eq!(
        pool.cached(),
        cached,
        "its cache is counted from this process"
    );
    assert_eq!(pool.in_use(), held);
    assert_eq!(
        pool.mempool().owned_by(pid),
        held,
        "tagged with its owner id"
    );
    // A live process's objects are its own.
    let err = pool.reclaim_owned(pid).unwrap_err();
    assert!(matches!(err, Error::ProcessAlive { .. }), "{err}");
    // One of this process's own, which no reclaim of the other's touches.
    let mine = pool.alloc().unwrap();

    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(pool.reclaim(pid).unwrap(), cached);
    assert_eq!(pool.cached(), 0);
    assert!(pool.mempool().cache_owners().is_empty());
    assert_eq!(
        pool.in_use(),
        held + 1,
        "the mbufs it held outside its cache are still out (its queues' owner returns those)"
    );
    assert_eq!(
        pool.reclaim(pid).unwrap(),
        0,
        "a second reclaim finds nothing"
    );
    // Once nothing can use them (here: the process is gone and had no queues), what it held
    // comes back, exactly that.
    assert_eq!(pool.reclaim_owned(pid).unwrap(), held);
    assert_eq!(pool.in_use(), 1);
    assert_eq!(pool.mempool().owned_by(pid), 0);
    assert_eq!(pool.reclaim_owned(pid).unwrap(), 0, "once");
    drop(mine);
    assert_eq!(pool.in_use(), 0, "the pool is whole");
}

#[test]
fn reclaim_dead_finds_a_process_that_died_unnoticed() {
    let pool = shared_pool("dead", 512);
    let (mut c, mut out) = spawn("hoarder", &file_of(&pool), None);
    let cached: u32 = line(&mut out, "holding")
        .split_once(' ')
        .unwrap()
        .0
        .parse()
        .unwrap();
    let pid = c.id();
    assert_eq!(pool.mempool().reclaim_dead().unwrap(), (vec![], 0), "alive");
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(pool.mempool().reclaim_dead().unwrap(), (vec![pid], cached));
}

#[test]
fn attaching_is_refused_with_the_reason() {
    // Same process: the creator's address range is its own.
    let pool = shared_pool("self", 64);
    let err = MbufPool::attach(&file_of(&pool), &RegionOptions::default()).unwrap_err();
    assert!(matches!(err, Error::AddressTaken { .. }), "{err}");

    // Not a pool at all.
    let junk = pool_file("junk");
    std::fs::write(&junk, vec![7u8; 8192]).unwrap();
    let err = MbufPool::attach(&junk, &RegionOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not a shared pool"), "{err}");
    std::fs::remove_file(&junk).unwrap();

    // An object pool is not an mbuf pool.
    let objects = Mempool::new(
        PoolConfig::new("objs", 64, 100)
            .page_policy(PagePolicy::Normal)
            .shared_file(pool_file("objs")),
    )
    .unwrap();
    let path = objects.region().shared_path().unwrap().to_owned();
    let err = MbufPool::attach(&path, &RegionOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("an object pool, not an mbuf pool"),
        "{err}"
    );

    // A private pool has no caches of other processes to reclaim.
    let private =
        Mempool::new(PoolConfig::new("p", 64, 64).page_policy(PagePolicy::Normal)).unwrap();
    let err = private.reclaim(1).unwrap_err();
    assert!(matches!(err, Error::NotShared { .. }), "{err}");
}

#[test]
fn a_control_block_that_disagrees_with_itself_is_refused() {
    let pool = shared_pool("corrupt", 64);
    let path = file_of(&pool);
    // A copy of the file (the original stays intact for its creator), with the object size
    // changed in its header: the control block no longer fits its own numbers.
    let copy = pool_file("corrupt-copy");
    let mut bytes = std::fs::read(&path).unwrap();
    let len = bytes.len();
    let ctl = u64::from_ne_bytes(bytes[len - 56..len - 48].try_into().unwrap()) as usize;
    // Header: magic 8, version 4, ready 4, creator 4, count 4, cache 4, shift 4, nkeys 4,
    // kind 4, headroom 4, data room 4, then obj_size (u64) at 48.
    bytes[ctl + 48..ctl + 56].copy_from_slice(&4096u64.to_ne_bytes());
    std::fs::write(&copy, &bytes).unwrap();
    let err = MbufPool::attach(&copy, &RegionOptions::default()).unwrap_err();
    assert!(err.to_string().contains("span"), "{err}");
    // Another layout version.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[ctl + 8..ctl + 12].copy_from_slice(&9u32.to_ne_bytes());
    std::fs::write(&copy, &bytes).unwrap();
    let err = MbufPool::attach(&copy, &RegionOptions::default()).unwrap_err();
    assert!(err.to_string().contains("version 9"), "{err}");
    std::fs::remove_file(&copy).unwrap();
}
