//! The tools run by a user without privileges (uid and gid 65534, no supplementary groups):
//! `/dev/hugepages` is root's and the locked-memory limit is the default, so the cables go
//! to normal pages in `/dev/shm` and packet memory stays unlocked, each said once in a
//! warning, and the demo's topology still forwards every frame and leaves nothing behind.
//! Needs root (to drop to that user) and `setpriv`; skipped otherwise, unless
//! PMD_REQUIRE_PRIVILEGED is set.

use crate::support;
use crate::support::{json, stop, succeeded, Bg};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

const NOBODY: &str = "65534";

/// `setpriv` running `tool` (copied to `dir`, which that user can reach) as the unprivileged
/// user; `None` where this machine cannot.
fn as_nobody(dir: &Path, tool: &str) -> Option<Command> {
    // The effective uid, from the kernel's own account of this process.
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(root && setpriv) {
        assert!(
            std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
            "PMD_REQUIRE_PRIVILEGED is set but this test cannot drop to an unprivileged user (root {root}, setpriv {setpriv})"
        );
        eprintln!("SKIPPED: needs root and setpriv to run the tools as an unprivileged user");
        return None;
    }
    let src = support::bin(tool).get_program().to_owned();
    let dst = dir.join(tool);
    if !dst.exists() {
        std::fs::copy(&src, &dst).unwrap();
    }
    // A runtime directory (telemetry socket) of its own that this user may write in.
    let run = dir.join(format!("run-{tool}"));
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = Command::new("setpriv");
    c.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .arg(&dst)
        .env("PMD_LOG", "warn")
        // The default places: /dev/hugepages, where this user may not create files.
        .env_remove("PMD_SHM_DIR")
        .env("RUNTIME_DIRECTORY", &run)
        .current_dir(dir);
    Some(c)
}

#[test]
fn the_demo_topology_runs_unprivileged_on_normal_pages_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let Some(mut l2) = as_nobody(dir.path(), "l2fwd") else {
        return;
    };
    let mut pg = as_nobody(dir.path(), "pktgen").expect("checked above");
    let id = format!("unpriv{}", std::process::id());
    let (a, b) = (
        format!("emu-mana:wire=shm:{id}a"),
        format!("emu-mana:wire=shm:{id}b"),
    );
    let n: u64 = 20_000;
    l2.args(["--port", &a, "--port", &b, "--lcores", "1", "--json"])
        .args(["--stats-interval", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let l2 = Bg(Some(l2.spawn().unwrap()));
    let out = pg
        .args(["--port", &a, "--port", &b, "--lcores", "0", "--json"])
        .args(["--count", &n.to_string(), "--rate", "100000"])
        .args(["--link-timeout", "60", "--drain-timeout", "30"])
        .output()
        .unwrap();
    let p = succeeded(&out);
    assert_eq!(p["tx_packets"], n, "{p}");
    assert_eq!(p["rx_packets"], n, "{p}");
    assert_eq!(p["lost"], 0, "{p}");
    assert_eq!(p["pool_in_use"], 0, "{p}");
    let l = stop(l2);
    let l_err = String::from_utf8_lossy(&l.stderr).into_owned();
    assert!(l.status.success(), "l2fwd: {l_err}");
    let lj = json(&l.stdout);
    assert_eq!(
        (lj["rx_packets"].as_u64(), lj["dropped"].as_u64()),
        (Some(n), Some(0))
    );
    assert_eq!(lj["pool_in_use"], 0, "{lj}");
    // Where root's cables would go to hugepages, the tool that made a cable file (whichever
    // got there first: the other joins the file without a fallback of its own) says, once,
    // that this user's cables go to normal pages instead, and how to change that.
    let hugepages = pmd::emu::wire::shm_dir() == Path::new("/dev/hugepages");
    let p_err = String::from_utf8_lossy(&out.stderr);
    let mut said = 0;
    for err in [p_err.as_ref(), l_err.as_str()] {
        let cables = err.matches("using /dev/shm/pmd-wire-").count();
        assert!(cables <= 1, "reported once: {err}");
        assert_eq!(err.contains("Reserve hugepages"), cables == 1, "{err}");
        said += cables;
        assert!(!err.contains("ERROR"), "{err}");
    }
    assert_eq!(
        said > 0,
        hugepages,
        "the cables' fallback:\npktgen: {p_err}\nl2fwd: {l_err}"
    );
    // The last end out removed each cable file.
    for d in ["/dev/shm", "/dev/hugepages"] {
        if let Ok(entries) = std::fs::read_dir(d) {
            let left: Vec<_> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(&id))
                .collect();
            assert!(left.is_empty(), "left in {d}: {left:?}");
        }
    }
}
