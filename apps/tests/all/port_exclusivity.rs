//! Port exclusivity end to end: l2fwd on a device-model MANA port whose kernel netdev is a
//! real Linux interface (`emu-mana:...,netdev=pmd0`), in a network namespace each test
//! creates and deletes itself. The netdev is a dummy interface (a veth pair where the kernel
//! has no dummy driver), enslaved to a bridge `br0` where bridges exist, so the messages and
//! the take-over also cover a master (as `hv_netvsc` is on Azure). No addresses, no traffic
//! leaves the namespace.
//!
//! Needs root and `ip netns`; each test prints SKIPPED and passes otherwise (unless
//! PMD_REQUIRE_PRIVILEGED is set, where a skip would hide a failure).

use integration_tests::{eventually, finish, Netns, StderrLines, IF};
use pmd::sys::net::{send_signal, SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// l2fwd inside the namespace: port 0 is the model port with netdev pmd0 and `policy`
/// (e.g. `busy=takeover`), port 1 its in-process cable peer.
fn l2fwd(ns: &Netns, policy: &str, extra: &[&str]) -> Command {
    let port0 = if policy.is_empty() {
        format!("emu-mana:wire=loop:x,netdev={IF}")
    } else {
        format!("emu-mana:wire=loop:x,netdev={IF},{policy}")
    };
    let mut c = ns.exec(std::path::Path::new(env!("CARGO_BIN_EXE_l2fwd")));
    c.args(["--port", &port0, "--port", "emu-mana:wire=loop:x"])
        .args([
            "--lcores",
            "0",
            "--ring-size",
            "256",
            "--stats-interval",
            "0",
        ])
        .args(["--link-timeout", "2"])
        .args(extra)
        .env("PMD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn busy_fail_names_the_netdev_its_master_and_the_command() {
    let Some(ns) = Netns::create("fail") else {
        return;
    };
    ns.set(true);
    let out = l2fwd(&ns, "", &["--duration", "0.5"]).output().unwrap();
    let err = stderr_of(&out);
    assert!(!out.status.success(), "must fail while pmd0 is up: {err}");
    let (holder, command) = match ns.master {
        Some(m) => (
            format!("kernel netdev {IF} (master {m}) holds it"),
            format!("`ip link set {m} down && ip link set {IF} down`"),
        ),
        None => (
            format!("kernel netdev {IF} holds it"),
            format!("`ip link set {IF} down`"),
        ),
    };
    for needle in [&holder, &command, "busy=wait", "busy=takeover", "EBUSY"] {
        assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
    }
    assert!(ns.all(true), "busy=fail touches nothing");

    // Explicit busy=fail is the same; and the command it printed does free the port.
    let out = l2fwd(&ns, "busy=fail", &["--duration", "0.5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    ns.set(false);
    let out = l2fwd(&ns, "", &["--duration", "0.3"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn busy_wait_succeeds_once_the_netdev_goes_down_and_gives_up_at_its_timeout() {
    let Some(ns) = Netns::create("wait") else {
        return;
    };
    ns.set(true);
    let out = l2fwd(&ns, "busy=wait,busy-timeout=0.3", &["--duration", "0.3"])
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("still held after waiting 0.3") && err.contains(&format!("{IF} down`")),
        "{err}"
    );

    let mut child = l2fwd(&ns, "busy=wait,busy-timeout=20", &["--duration", "0.3"])
        .spawn()
        .unwrap();
    let mut lines = StderrLines::take(&mut child);
    // The port was found busy: the wait has begun (20 s here bounds a hung process).
    let line = lines.wait_for(
        "holds the port; waiting up to 20 s for it to be free",
        Duration::from_secs(20),
    );
    assert!(
        line.contains("busy=wait") && line.contains(&format!("kernel netdev {IF}")),
        "{line}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "l2fwd must wait while pmd0 is up"
    );
    ns.set(false);
    let (status, _) = finish(child, Duration::from_secs(20));
    let err = lines.all(Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert_eq!(
        err.matches("waiting up to").count(),
        1,
        "the wait is logged once: {err}"
    );
    assert!(ns.all(false), "busy=wait brings nothing up or down");
}

#[test]
fn busy_takeover_gives_the_netdev_back_on_every_way_out() {
    let Some(ns) = Netns::create("take") else {
        return;
    };
    ns.set(true);

    // Normal end (--duration): down while running, up again after.
    let child = l2fwd(&ns, "busy=takeover", &["--duration", "1.5"])
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || ns.all(false)),
        "l2fwd took the netdev (and master) down"
    );
    let (status, err) = finish(child, Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert!(ns.all(true), "given back at exit: {err}");
    assert!(err.contains("took the port over"), "{err}");

    // takeover=1, the older spelling, and every stop signal.
    for (policy, sig) in [
        ("busy=takeover", SIGINT),
        ("takeover=1", SIGTERM),
        ("busy=takeover", SIGHUP),
        ("busy=takeover", SIGQUIT),
    ] {
        let child = l2fwd(&ns, policy, &[]).spawn().unwrap();
        assert!(
            eventually(Duration::from_secs(10), || ns.all(false)),
            "{policy}: netdev taken down"
        );
        send_signal(child.id(), sig).unwrap();
        let (status, err) = finish(child, Duration::from_secs(20));
        assert!(status.success(), "signal {sig}: {err}");
        assert!(ns.all(true), "signal {sig}: netdev given back: {err}");
    }

    // A second signal ends the process at once, but never before giving the netdev back.
    let child = l2fwd(&ns, "busy=takeover", &[]).spawn().unwrap();
    assert!(eventually(Duration::from_secs(10), || ns.all(false)));
    send_signal(child.id(), SIGINT).unwrap();
    send_signal(child.id(), SIGTERM).unwrap();
    let (_status, err) = finish(child, Duration::from_secs(20));
    assert!(ns.all(true), "second signal: netdev given back: {err}");
}

/// A stop signal that arrives during start-up (here: while l2fwd waits for a link that never
/// comes up, the netdev already taken) ends the wait at once and gives the netdev back.
#[test]
fn stop_signal_during_start_up_gives_the_netdev_back() {
    let Some(ns) = Netns::create("early") else {
        return;
    };
    ns.set(true);
    for sig in [SIGINT, SIGHUP] {
        // The far end of the cable never attaches: the link stays down for --link-timeout.
        let port0 = format!(
            "emu-mana:wire=shm:early{}x{sig},netdev={IF},busy=takeover",
            std::process::id()
        );
        let child = ns
            .exec(std::path::Path::new(env!("CARGO_BIN_EXE_l2fwd")))
            .args(["--port", &port0, "--port", "null", "--lcores", "0"])
            .args(["--ring-size", "256", "--link-timeout", "600"])
            .env("PMD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            eventually(Duration::from_secs(10), || ns.all(false)),
            "signal {sig}: netdev taken down"
        );
        send_signal(child.id(), sig).unwrap();
        // Far less than the 600 s link wait: the signal ended it.
        let (status, err) = finish(child, Duration::from_secs(30));
        assert!(status.success(), "signal {sig}: {err}");
        assert!(ns.all(true), "signal {sig}: netdev given back: {err}");
        assert!(!err.contains("link still down"), "signal {sig}: {err}");
    }
}

#[test]
fn second_l2fwd_on_the_same_port_is_refused_naming_the_pid() {
    let Some(ns) = Netns::create("lock") else {
        return;
    };
    ns.set(false);
    let first = l2fwd(&ns, "", &[]).spawn().unwrap();
    let pid = first.id();
    assert!(
        eventually(Duration::from_secs(10), || ns
            .lock_file()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .is_some_and(|s| s.trim() == pid.to_string())),
        "the first l2fwd holds the port lock"
    );
    // The kernel netdev comes back while the first runs (its queues exist already). A second
    // process that would take the port over must be refused before it touches anything.
    ns.set(true);
    let out = l2fwd(&ns, "busy=takeover", &["--duration", "0.3"])
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("in use by process pid {pid}")),
        "names the holder: {err}"
    );
    assert!(!err.contains("took the port over"), "{err}");
    assert!(ns.all(true), "the refused process touched nothing");

    // The holder dies without a chance to clean up: its lock goes with it, and the next
    // process takes the stale file silently.
    send_signal(pid, SIGKILL).unwrap();
    let _ = finish(first, Duration::from_secs(10));
    assert!(ns.lock_file().is_some(), "SIGKILL leaves the file behind");
    ns.set(false);
    let out = l2fwd(&ns, "", &["--duration", "0.3"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        ns.lock_file().is_none(),
        "a clean exit removes its lock file"
    );
}
