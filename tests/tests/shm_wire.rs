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
    let (mut child, out) = echo(&spec, "500", dir.path());

    std::env::set_var("PMD_SHM_DIR", dir.path());
    let pool = MbufPool::new(MbufPoolConfig::new("it", 1024)).unwrap();
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
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
        rest, "echoed 500 in_use 0 stale 0",
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
        end.flush();
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
}

/// A 64-byte broadcast frame of the local experimental EtherType carrying `tag` and `seq`.
fn tagged(tag: u8, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]);
    f[14] = tag;
    f[15..19].copy_from_slice(&seq.to_be_bytes());
    f
}

/// Starts `shm_echo` on `spec` (echo `count` frames, 60 s at most) and waits for its `ready`;
/// the child and the rest of its stdout.
fn echo(
    spec: &str,
    count: &str,
    dir: &std::path::Path,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shm_echo"))
        .args([spec, count, "60"])
        .env("PMD_SHM_DIR", dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    (child, out)
}

/// Process B is killed (SIGKILL: no clean-up) while A keeps sending; a new process takes
/// end B. It starts a new generation: the 100 frames sent to the dead one are discarded and
/// counted (`wire_rx_stale`), never delivered, and only what A sends afterwards arrives.
#[test]
fn a_peer_that_replaces_a_killed_one_gets_none_of_the_frames_sent_meanwhile() {
    // The sender's `tx_stranded` counts them while no far end is attached.
    use pmd::emu::wire::{Shm, Wire};
    let dir = tempfile::tempdir().unwrap();
    let name = format!("gen-{}", std::process::id());
    let path = dir.path().join(format!("pmd-wire-{name}"));
    let spec = format!("emu-mana:wire=shm:{name}");
    let mut a = Shm::open_at(&name, &path).unwrap();
    let mut buf = [0u8; 128];
    let (mut b1, _) = echo(&spec, "1000000", dir.path());
    assert!(a.peer_attached());
    assert!(a.send(&tagged(0, 0)));
    a.flush();
    assert!(
        integration_tests::eventually(Duration::from_secs(30), || a.recv(&mut buf).is_some()),
        "the first peer echoes"
    );
    b1.kill().unwrap();
    b1.wait().unwrap();
    assert!(!a.peer_attached(), "a killed peer is seen as gone");
    assert!(path.exists(), "the cable stays for the next process");
    let stranded = |a: &Shm| {
        a.stats()
            .into_iter()
            .find(|x| x.name == "tx_stranded")
            .map(|x| x.value)
    };
    for seq in 0..100 {
        assert!(a.send(&tagged(1, seq)), "the cable holds what nobody reads");
        a.flush();
    }
    assert_eq!(stranded(&a), Some(100), "sent with no far end: counted");
    let (b2, mut out) = echo(&spec, "50", dir.path());
    assert!(a.peer_attached());
    assert_eq!(stranded(&a), Some(0), "the new far end counts them (stale)");
    for seq in 0..50 {
        assert!(a.send(&tagged(2, seq)));
        a.flush();
    }
    let mut back = Vec::new();
    let done = integration_tests::eventually(Duration::from_secs(30), || {
        while let Some(n) = a.recv(&mut buf) {
            assert_eq!(n, 64);
            back.push((buf[14], u32::from_be_bytes(buf[15..19].try_into().unwrap())));
        }
        back.len() >= 50
    });
    assert!(done, "only {} of 50 came back", back.len());
    let want: Vec<(u8, u32)> = (0..50).map(|s| (2, s)).collect();
    assert_eq!(
        back, want,
        "only the frames sent after the new peer attached"
    );
    let mut last = String::new();
    out.read_line(&mut last).unwrap();
    let status = integration_tests::finish(b2, Duration::from_secs(30)).0;
    assert!(status.success());
    assert_eq!(last.trim(), "echoed 50 in_use 0 stale 100");
    assert_eq!(
        a.recv(&mut buf),
        None,
        "nothing more: the old frames never come back"
    );
    drop(a);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the last end out removed the file"
    );
}

/// A command that runs `script` in a private mount namespace with `ECHO` (the shm_echo
/// binary) and `env` in its environment (`None` where that cannot be done).
fn in_private_mounts(tag: &str, script: &str, env: &[(&str, &str)]) -> Option<Command> {
    let mut c = integration_tests::private_mounts(tag, script)?;
    c.env_remove("PMD_SHM_DIR")
        .env_remove("PMD_NO_HUGEPAGES")
        .env("ECHO", env!("CARGO_BIN_EXE_shm_echo"))
        .envs(env.iter().copied());
    Some(c)
}

/// Runs `c`; whether it succeeded, its stdout and stderr.
fn output(mut c: Command) -> (bool, String, String) {
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A hugetlbfs with no room for a wire (2 MiB, a wire takes 20): the first end makes its
/// file in /dev/shm instead, says so once, and the peer finds it there; nothing is left on
/// the hugetlbfs. Once through `PMD_SHM_DIR` pointing at such a mount, and once (where the
/// machine has free hugepages, so that /dev/hugepages is chosen) with the mount over
/// /dev/hugepages itself.
#[test]
fn a_wire_falls_back_to_normal_pages_when_hugepages_cannot_be_had() {
    let free: usize =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
    let mnt = tempfile::tempdir().unwrap();
    let mnt_s = mnt.path().to_str().unwrap().to_string();
    let mut modes = vec![(mnt_s.clone(), true)];
    if free >= 10 + 128 && std::path::Path::new("/dev/hugepages").is_dir() {
        modes.push(("/dev/hugepages".to_string(), false));
    } else {
        eprintln!("note: too few free hugepages for the /dev/hugepages half of the test");
    }
    for (at, via_env) in modes {
        use pmd::emu::wire::{Shm, Wire};
        let name = format!("fb-{}-{}", std::process::id(), via_env);
        let shm_path = std::path::Path::new("/dev/shm").join(format!("pmd-wire-{name}"));
        let script = format!(
            "mount -t hugetlbfs -o size=2M none {at} || exit 9; \
             $ECHO emu-mana:wire=shm:{name} 1 60; rc=$?; echo \"rc $rc left: $(ls -A {at})\"; exit $rc"
        );
        let env: Vec<(&str, &str)> = if via_env {
            vec![("PMD_SHM_DIR", at.as_str())]
        } else {
            vec![]
        };
        let Some(c) = in_private_mounts("shm-fallback", &script, &env) else {
            return;
        };
        // The echo process runs in the namespace; this side is end B, from outside it.
        let peer = std::thread::spawn({
            let name = name.clone();
            let shm_path = shm_path.clone();
            move || {
                assert!(
                    integration_tests::eventually(Duration::from_secs(60), || shm_path.exists()),
                    "the wire file appears in /dev/shm"
                );
                let mut b = Shm::open_at(&name, &shm_path).unwrap();
                assert!(b.send(&tagged(7, 1)));
                b.flush();
                let mut buf = [0u8; 128];
                let back = integration_tests::eventually(Duration::from_secs(30), || {
                    b.recv(&mut buf).is_some()
                });
                assert!(back, "the echo came back");
                // Wait for the echo process to give its end up, then leave last.
                integration_tests::eventually(Duration::from_secs(30), || !b.peer_attached());
            }
        });
        let (ok, out, err) = output(c);
        peer.join().unwrap();
        assert!(ok, "{at}: {out}\n{err}");
        assert!(out.contains("echoed 1 in_use 0 stale 0"), "{out}\n{err}");
        assert!(
            out.contains("rc 0 left: \n"),
            "nothing left on the hugetlbfs: {out}"
        );
        let warnings: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("no hugepages for"))
            .collect();
        assert_eq!(warnings.len(), 1, "one warning: {err}");
        assert!(
            warnings[0].contains(&format!("{at}/pmd-wire-{name}"))
                && warnings[0].contains("using /dev/shm/"),
            "{}",
            warnings[0]
        );
        assert!(!shm_path.exists(), "the last end out removed the file");
    }
}

/// `PMD_SHM_DIR` on a tmpfs too small for a wire: a directory the user chose has no
/// fallback; the error names the file and the cause, and no half-made file is left.
#[test]
fn a_full_shm_dir_is_an_error_that_names_the_file_and_leaves_nothing() {
    let mnt = tempfile::tempdir().unwrap();
    let at = mnt.path().to_str().unwrap().to_string();
    let name = format!("full-{}", std::process::id());
    let script = format!(
        "mount -t tmpfs -o size=4M none {at} || exit 9; \
         $ECHO emu-mana:wire=shm:{name} 1 5; rc=$?; echo \"rc $rc left: $(ls -A {at})\"; exit 0"
    );
    let Some(c) = in_private_mounts("shm-full", &script, &[("PMD_SHM_DIR", at.as_str())]) else {
        return;
    };
    let (ok, out, err) = output(c);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("rc 1 left: \n"),
        "exit 1, nothing left: {out}\n{err}"
    );
    assert!(
        err.contains(&format!("{at}/pmd-wire-{name}")) && err.contains("No space left on device"),
        "{err}"
    );
}
