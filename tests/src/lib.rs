//! Support for the cross-process tests of the workspace (this crate's `tests/`, and the
//! apps' and the fake rdma-core's tests): a network namespace with a netdev that plays a
//! MANA port's kernel interface, and helpers to wait on processes.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The port's netdev in a [`Netns`].
pub const IF: &str = "pmd0";

/// Runs `ip ARGS`; whether it succeeded.
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace with the port's netdev `pmd0` (and its master `br0`, when bridges
/// exist), and a lock directory of its own; deleted on drop.
pub struct Netns {
    /// The namespace's name.
    pub name: String,
    /// The netdev's master, when bridges exist.
    pub master: Option<&'static str>,
    /// The port-lock directory (`PMD_LOCK_DIR`) of the processes run in it.
    pub locks: tempfile::TempDir,
}

impl Netns {
    /// Creates the namespace `pmdx<tag><pid>` with its netdev; `None` (after saying why)
    /// where the machine cannot (not root, no `ip netns`), unless PMD_REQUIRE_PRIVILEGED is
    /// set.
    pub fn create(tag: &str) -> Option<Self> {
        let name = format!("pmdx{tag}{}", std::process::id());
        let skip = |why: &str| {
            assert!(
                std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
                "PMD_REQUIRE_PRIVILEGED is set but {why}"
            );
            eprintln!("SKIPPED {tag}: {why}");
        };
        if !ip(&["netns", "add", &name]) {
            skip("cannot create a network namespace here (needs root and `ip netns`)");
            return None;
        }
        let mut ns = Netns {
            name,
            master: None,
            locks: tempfile::tempdir().unwrap(),
        };
        let made = ns.ip(&["link", "add", IF, "type", "dummy"])
            || ns.ip(&[
                "link", "add", IF, "type", "veth", "peer", "name", "pmd0peer",
            ]);
        if !made {
            // A container may allow namespaces but no dummy or veth interfaces.
            skip(&format!(
                "cannot create a dummy or veth interface in namespace {}",
                ns.name
            ));
            return None;
        }
        if ns.ip(&["link", "add", "br0", "type", "bridge"])
            && ns.ip(&["link", "set", IF, "master", "br0"])
        {
            ns.master = Some("br0");
        } else {
            eprintln!("note: no bridge support here: the master half of the test is left out");
        }
        Some(ns)
    }

    /// Runs `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> bool {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Whether `ifname` is administratively up (`UP` among its flags).
    pub fn up(&self, ifname: &str) -> bool {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.name, "ip", "-o", "link", "show", "dev", ifname,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let flags = text
            .split_once('<')
            .and_then(|(_, r)| r.split_once('>'))
            .map_or("", |(f, _)| f);
        flags.split(',').any(|f| f == "UP")
    }

    /// Brings the netdev (and its master) up or down, as the kernel's own interface would be.
    pub fn set(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        for n in self.master.iter().chain(std::iter::once(&IF)) {
            assert!(
                self.ip(&["link", "set", n, state]),
                "ip link set {n} {state}"
            );
        }
    }

    /// Whether the netdev and its master are all up (`true`) or all down (`false`).
    pub fn all(&self, up: bool) -> bool {
        self.master
            .iter()
            .chain(std::iter::once(&IF))
            .all(|n| self.up(n) == up)
    }

    /// `prog` run inside the namespace (`ip netns exec`), with the namespace's lock directory.
    pub fn exec(&self, prog: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name])
            .arg(prog)
            .env("PMD_LOCK_DIR", self.locks.path());
        own_runtime_dir(&mut c);
        c
    }

    /// The lock file of the port, once a process holds it.
    pub fn lock_file(&self) -> Option<PathBuf> {
        std::fs::read_dir(self.locks.path())
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(&format!(".{IF}.lock")))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Waits for `child` to exit (at most `limit`), killing it past that; returns its output.
pub fn finish(mut child: Child, limit: Duration) -> (ExitStatus, String) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("l2fwd still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status, err)
}

/// A child's stderr, read line by line on a thread as it comes, so that a test can wait for
/// what the child says (instead of sleeping and guessing) and still have all of it at the
/// end. [`finish`] then reads no stderr of its own.
pub struct StderrLines {
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl StderrLines {
    /// Takes `child`'s stderr, which must be piped.
    pub fn take(child: &mut Child) -> Self {
        use std::io::BufRead;
        let err = child.stderr.take().expect("stderr piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Self {
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that contains `want`, at most `limit` (a bound for a hung process,
    /// not a measurement), and returns it; panics, with everything said so far, if the
    /// child's stderr ends or the limit passes first.
    #[track_caller]
    pub fn wait_for(&mut self, want: &str, limit: Duration) -> String {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(want);
                    self.seen.push(l);
                    if hit {
                        return self.seen.last().cloned().unwrap_or_default();
                    }
                }
                Err(e) => panic!("no line with {want:?} ({e}): {:#?}", self.seen),
            }
        }
    }

    /// Everything the child said, to the end of its stderr (at most `limit` for the rest).
    #[track_caller]
    pub fn all(mut self, limit: Duration) -> String {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(e) => panic!("stderr not closed ({e}): {:#?}", self.seen),
            }
        }
        self.seen.join("\n")
    }
}

/// Gives the tool `c` runs a runtime directory of its own (`RUNTIME_DIRECTORY`: where it
/// puts its telemetry socket, `dpdk/PREFIX/dpdk_telemetry.v2`, as DPDK's EAL does). Tools
/// that tests run side by side all use the default file prefix; this way their sockets
/// never meet, nor those of an app running on the machine. The directories are made in one
/// folder per test process under the temporary directory; the folders of test processes
/// that are gone are removed when the next one starts.
pub fn own_runtime_dir(c: &mut Command) -> &mut Command {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    c.env("RUNTIME_DIRECTORY", runtime_root().join(n.to_string()))
}

/// This test process's folder of runtime directories.
fn runtime_root() -> &'static std::path::Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        const PREFIX: &str = "pmd-test-run-";
        let tmp = std::env::temp_dir();
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.strip_prefix(PREFIX));
            if pid.is_some_and(|p| !std::path::Path::new("/proc").join(p).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        tmp.join(format!("{PREFIX}{}", std::process::id()))
    })
}

/// Polls `cond` every 20 ms for at most `limit`.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// A command that runs `script` with `sh -c` in a private mount namespace (`unshare
/// --mount`), where it may mount filesystems (a tiny tmpfs or hugetlbfs, over
/// `/dev/hugepages` even) that nobody else sees and that go away with it; `None` (after
/// saying why) where the machine cannot (not root, no `unshare`), unless
/// PMD_REQUIRE_PRIVILEGED is set.
pub fn private_mounts(tag: &str, script: &str) -> Option<Command> {
    let ok = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
            "PMD_REQUIRE_PRIVILEGED is set but no private mount namespace can be made here"
        );
        eprintln!(
            "SKIPPED {tag}: cannot make a private mount namespace here (needs root and `unshare`)"
        );
        return None;
    }
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c", script]);
    Some(c)
}
