//! The busy policies of a `mana:` port on the fake rdma-core, whose port 1 has a real kernel
//! netdev: `pmd0` (under a bridge `br0`, playing `hv_netvsc`) in a network namespace each
//! test creates and deletes. While `pmd0` is up the fake refuses raw QPs (ENODEV, or EBUSY
//! for newer kernels), as the kernel does. Needs root and `ip netns`; each test prints
//! SKIPPED otherwise (unless PMD_REQUIRE_PRIVILEGED is set).

use crate::common::{bin, Fake};
use integration_tests::{eventually, finish, Netns, StderrLines, IF};
use pmd::sys::net::{send_signal, SIGINT, SIGTERM};
use std::process::{Command, Stdio};
use std::time::Duration;

fn fake(ns: &Netns) -> Fake {
    Fake::new_in(
        Some(&format!(
            "mana_0/1:mac=02:00:00:00:10:01,wire=none,netdev={IF};\
             mana_0/2:mac=02:00:00:00:10:02,wire=none"
        )),
        Some(ns),
    )
}

/// l2fwd in the namespace on `mana:` ports 1 (with `policy`) and 2, on the fake.
fn l2fwd(ns: &Netns, fake: &Fake, policy: &str, extra: &[&str]) -> Command {
    let mut c = ns.exec(&bin("l2fwd"));
    fake.place(&mut c);
    let port1 = format!("mana:dev=mana_0,port=1{policy}");
    c.args(["--port", &port1, "--port", "mana:dev=mana_0,port=2"])
        .args(["--stats-interval", "0", "--link-timeout", "2"])
        .args(extra)
        .env("PMD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn busy_fail_names_the_netdev_and_the_command_in_both_errnos() {
    let Some(ns) = Netns::create("mfail") else {
        return;
    };
    let fake = fake(&ns);
    ns.set(true);
    for errno in ["ENODEV", "EBUSY"] {
        let out = l2fwd(&ns, &fake, "", &["--duration", "0.3"])
            .env("FAKE_RDMA_BUSY_ERRNO", errno)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{errno}: {err}");
        let command = match ns.master {
            Some(m) => format!("ip link set {m} down && ip link set {IF} down"),
            None => format!("ip link set {IF} down"),
        };
        for want in [
            format!("kernel netdev {IF}"),
            command,
            format!("failed with {errno}"),
        ] {
            assert!(err.contains(&want), "{errno}: lacks {want:?}: {err}");
        }
        assert!(err.contains("at exit: 0 live objects"), "{err}");
        assert!(ns.all(true), "busy=fail touches nothing");
    }
}

/// busy=wait: l2fwd says it waits (once) and does, while the netdev is up; once it goes down,
/// l2fwd gets the port, runs and exits successfully.
#[test]
fn busy_wait_succeeds_when_the_netdev_goes_down() {
    let Some(ns) = Netns::create("mwait") else {
        return;
    };
    let fake = fake(&ns);
    ns.set(true);
    let mut child = l2fwd(
        &ns,
        &fake,
        ",busy=wait,busy-timeout=20",
        &["--duration", "0.3"],
    )
    .spawn()
    .unwrap();
    let mut lines = StderrLines::take(&mut child);
    // The port was found busy: the wait has begun (20 s here bounds a hung process).
    let line = lines.wait_for(
        "holds the port; waiting up to 20 s for it to be free",
        Duration::from_secs(20),
    );
    assert!(line.contains(&format!("kernel netdev {IF}")), "{line}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "waits while {IF} is up"
    );
    ns.set(false);
    let (status, _) = finish(child, Duration::from_secs(20));
    let err = lines.all(Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert_eq!(err.matches("waiting up to").count(), 1, "{err}");
    assert!(err.contains("at exit: 0 live objects"), "{err}");
    assert!(ns.all(false), "busy=wait brings nothing up or down");
}

#[test]
fn busy_takeover_brings_the_netdev_down_and_back_on_exit_and_on_signals() {
    let Some(ns) = Netns::create("mtake") else {
        return;
    };
    let fake = fake(&ns);
    for (how, sig) in [
        ("exit", None),
        ("SIGINT", Some(SIGINT)),
        ("SIGTERM", Some(SIGTERM)),
    ] {
        ns.set(true);
        let extra: &[&str] = if sig.is_none() {
            &["--duration", "1.5"]
        } else {
            &[]
        };
        let child = l2fwd(&ns, &fake, ",busy=takeover", extra).spawn().unwrap();
        assert!(
            eventually(Duration::from_secs(10), || ns.all(false)),
            "{how}: {IF} (and its master) taken down"
        );
        if let Some(s) = sig {
            std::thread::sleep(Duration::from_millis(300));
            send_signal(child.id(), s).unwrap();
        }
        let (status, err) = finish(child, Duration::from_secs(20));
        assert!(status.success(), "{how}: {err}");
        assert!(ns.all(true), "{how}: given back: {err}");
        assert!(err.contains("took the port over"), "{how}: {err}");
        assert!(err.contains("at exit: 0 live objects"), "{how}: {err}");
    }
}

/// The world of [`fake`], whose port-1 netdev comes back up when the device returns from a
/// servicing (as hv_netvsc brings a re-added VF up).
fn fake_up_after_reset(ns: &Netns) -> Fake {
    Fake::new_in(
        Some(&format!(
            "mana_0/1:mac=02:00:00:00:10:01,wire=none,netdev={IF},netdev_up_after_reset=1;\
             mana_0/2:mac=02:00:00:00:10:02,wire=none"
        )),
        Some(ns),
    )
}

fn service(fake: &Fake, secs: &str) {
    let knob = fake
        .dir
        .path()
        .join("sys/class/infiniband/mana_0/fake_rdma_fatal");
    std::fs::write(knob, format!("service {secs}\n")).unwrap();
}

/// After a servicing the kernel's netdev is up again: busy=takeover takes it down again and
/// still gives it back at exit; busy=wait waits (within recover-timeout) until it goes
/// down; busy=fail fails the recovery at once with the busy message.
#[test]
fn busy_policies_hold_after_a_service_reset() {
    let Some(ns) = Netns::create("mreset") else {
        return;
    };
    let fake = fake_up_after_reset(&ns);

    // takeover: down at start, up with the device, down again, up at exit.
    ns.set(true);
    let child = l2fwd(&ns, &fake, ",busy=takeover", &["--duration", "4"])
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || ns.all(false)),
        "{IF} taken down at start"
    );
    std::thread::sleep(Duration::from_millis(300));
    service(&fake, "0.3");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(ns.all(false), "{IF} taken down again after the reset");
    let (status, err) = finish(child, Duration::from_secs(20));
    assert!(status.success(), "takeover: {err}");
    assert!(err.contains("recovered after"), "takeover: {err}");
    assert!(ns.all(true), "takeover: given back at exit: {err}");
    assert!(err.contains("at exit: 0 live objects"), "takeover: {err}");

    // wait: the port comes back once the netdev goes down. The master (the synthetic NIC)
    // stays up, as on Azure; the VF's netdev starts down.
    let vf_down = |ns: &Netns| {
        ns.set(true);
        assert!(ns.ip(&["link", "set", IF, "down"]));
    };
    vf_down(&ns);
    let child = l2fwd(
        &ns,
        &fake,
        ",busy=wait,recover-timeout=20",
        &["--duration", "4"],
    )
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    service(&fake, "0.3");
    assert!(
        eventually(Duration::from_secs(10), || ns.up(IF)),
        "{IF} up again with the device"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(ns.ip(&["link", "set", IF, "down"]));
    let (status, err) = finish(child, Duration::from_secs(20));
    assert!(status.success(), "wait: {err}");
    assert!(err.contains("recovered after"), "wait: {err}");
    assert!(err.contains("at exit: 0 live objects"), "wait: {err}");

    // fail: the recovery fails at once, naming the netdev.
    vf_down(&ns);
    let child = l2fwd(&ns, &fake, "", &["--duration", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let t0 = std::time::Instant::now();
    service(&fake, "0.3");
    let (status, err) = finish(child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "fail: {err}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "fail: at once: {err}"
    );
    assert!(
        err.contains("recovery failed")
            && err.contains("busy=fail")
            && err.contains(&format!("kernel netdev {IF}")),
        "fail: {err}"
    );
    assert!(err.contains("at exit: 0 live objects"), "fail: {err}");
}
