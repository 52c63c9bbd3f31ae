//! What the fake's integration tests share: the fake installed in a temporary directory with
//! a world, and the binaries cargo built beside the tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `f` (a use of a build output: the fake's cdylib, a tool) until it does not fail for
/// want of the file, for up to a minute. Another cargo command on the same target directory
/// may be relinking it: cargo releases its lock before it runs the tests, and `cargo build`
/// and `cargo test` link the fake with different features of pmd, so each relinks it, and
/// the file is missing for a second or two meanwhile.
pub fn while_relinked<T>(what: &str, mut f: impl FnMut() -> std::io::Result<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// The cdylib cargo built next to this test (`target/<profile>/deps/libfake_rdma.so`), once
/// it is there (see [`while_relinked`]).
pub fn fake_so() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let so = deps.join("libfake_rdma.so");
    let what = format!("{}: cargo test builds the cdylib", so.display());
    while_relinked(&what, || so.metadata());
    so
}

/// `target/<profile>`.
pub fn profile_dir() -> PathBuf {
    fake_so()
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// Compiles `tests/c/NAME.c` against the real rdma-core headers and links it against the
/// real libraries with `cflags` and `libs` (once per test process: call it from a
/// `OnceLock`); returns the executable.
pub fn compile_c(name: &str, cflags: &[&str], libs: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fake-rdma-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror"])
        .args(cflags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {name}.c (needs libibverbs-dev): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The libraries the bring-up programs link.
pub const C_LIBS: &[&str] = &["-libverbs", "-lmana", "-lmlx5", "-ldl"];

/// A binary of the workspace (`l2fwd`, `pktgen`, `pmd-devices`), built by
/// `cargo test --workspace`.
pub fn bin(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} missing: run the workspace's tests (cargo test --workspace) so that cargo builds it",
        p.display()
    );
    p
}

/// The fake installed under its three library names, with a world.
pub struct Fake {
    pub dir: tempfile::TempDir,
}

impl Fake {
    /// A fake world: the default one, or `FAKE_RDMA_PORTS = ports`.
    pub fn new(ports: Option<&str>) -> Fake {
        Self::new_in(ports, None)
    }

    /// A fake world written from inside `ns` (where its `netdev=` interfaces live).
    pub fn new_in(ports: Option<&str>, ns: Option<&integration_tests::Netns>) -> Fake {
        let dir = tempfile::tempdir().expect("temp dir");
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        std::fs::create_dir(dir.path().join("shm")).unwrap();
        while_relinked("copying the fake", || {
            std::fs::copy(fake_so(), lib.join("libibverbs.so.1"))
        });
        std::os::unix::fs::symlink("libibverbs.so.1", lib.join("libmana.so.1")).unwrap();
        std::os::unix::fs::symlink("libibverbs.so.1", lib.join("libmlx5.so.1")).unwrap();
        let tool = Path::new(env!("CARGO_BIN_EXE_fake-rdma-world"));
        let mut world = ns.map_or_else(|| Command::new(tool), |n| n.exec(tool));
        world.arg("--sysfs").arg(dir.path().join("sys"));
        match ports {
            Some(p) => world.env("FAKE_RDMA_PORTS", p),
            None => world.env_remove("FAKE_RDMA_PORTS"),
        };
        let out = while_relinked("run fake-rdma-world", || world.output());
        assert!(
            out.status.success(),
            "fake-rdma-world: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Fake { dir }
    }

    /// Where this world's shared-memory wires live (`PMD_SHM_DIR`).
    pub fn shm_dir(&self) -> PathBuf {
        self.dir.path().join("shm")
    }

    /// `prog` with the fake in place (and no fake knobs from the caller's environment).
    pub fn cmd(&self, prog: &Path) -> Command {
        let mut c = Command::new(prog);
        self.place(&mut c);
        c
    }

    /// Puts the fake in place for `c`.
    pub fn place(&self, c: &mut Command) {
        let sys = self.dir.path().join("sys");
        c.env("LD_LIBRARY_PATH", self.dir.path().join("lib"))
            .env("SYSFS_PATH", &sys)
            .env("PMD_SYSFS_ROOT", &sys)
            // Each world's shm wires in its own directory: tests running side by side (and
            // anything else on the machine) use the same wire names.
            .env("PMD_SHM_DIR", self.shm_dir());
        // Each tool's telemetry socket in a runtime directory of its own.
        integration_tests::own_runtime_dir(c);
        for k in [
            "FAKE_RDMA_PROFILE",
            "FAKE_RDMA_FAIL",
            "FAKE_RDMA_TRACE",
            "PMD_LOG",
        ] {
            c.env_remove(k);
        }
    }
}

/// stdout and stderr of a finished process, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The number in the fake's exit line (`fake-rdma: at exit: N live objects`).
pub fn live_at_exit(o: &Output) -> Option<u32> {
    let err = String::from_utf8_lossy(&o.stderr);
    err.lines()
        .find_map(|l| l.strip_prefix("fake-rdma: at exit: "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// A pair of l2fwd ports on the fake, and pktgen's model ports on the far ends of their
/// wires `{tag}-1` and `{tag}-2`.
pub struct Pair {
    /// The fake's world (`FAKE_RDMA_PORTS`).
    pub world: String,
    /// l2fwd's ports (`mana:`, `mlx5:`), without queue counts.
    pub l2fwd: [&'static str; 2],
    /// pktgen's ports (`emu-mana:`, `emu-mlx5:`).
    pub pktgen: [String; 2],
}

impl Pair {
    /// `mana_0` ports 1 and 2: both ports' queues on one device, each port a context of its
    /// own (one doorbell page each).
    pub fn mana(tag: &str) -> Self {
        Pair {
            world: format!(
                "mana_0/1:mac=02:00:00:00:10:01,wire=shm:{tag}-1;\
                 mana_0/2:mac=02:00:00:00:10:02,wire=shm:{tag}-2"
            ),
            l2fwd: ["mana:dev=mana_0,port=1", "mana:dev=mana_0,port=2"],
            pktgen: [
                format!("emu-mana:wire=shm:{tag}-1"),
                format!("emu-mana:wire=shm:{tag}-2"),
            ],
        }
    }

    /// Devices `mlx5_0` and `mlx5_1`.
    pub fn mlx5(tag: &str) -> Self {
        Pair {
            world: format!(
                "mlx5_0/1:mac=02:00:00:00:20:01,wire=shm:{tag}-1;\
                 mlx5_1/1:mac=02:00:00:00:20:02,wire=shm:{tag}-2"
            ),
            l2fwd: ["mlx5:dev=mlx5_0", "mlx5:dev=mlx5_1"],
            pktgen: [
                format!("emu-mlx5:wire=shm:{tag}-1"),
                format!("emu-mlx5:wire=shm:{tag}-2"),
            ],
        }
    }
}

/// Sends SIGINT to `pid` (a tool's Ctrl-C), as a syscall: a fresh machine has no `kill`
/// program (procps is not in a minimal Debian), and a test that shelled out to it and
/// ignored the failure waited for the tool's `--duration` instead. A process that is gone
/// already is fine.
pub fn interrupt(pid: u32) {
    match pmd::sys::net::send_signal(pid, pmd::sys::net::SIGINT) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(e) => panic!("SIGINT to {pid}: {e}"),
    }
}

/// One traffic run at a time in this test binary: on a 2-core machine, a run beside another
/// (six processes and their engine threads) starves l2fwd's rings (256 TX descriptors, the v44
/// maximum), which then drop what they cannot take, and count it. Every test that runs
/// l2fwd or pktgen with traffic holds this.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}
