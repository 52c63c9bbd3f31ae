//! A host servicing on the fake rdma-core (`service SECONDS` in a device's
//! `fake_rdma_fatal`), seen by a C program through the real libibverbs API (`c/service.c`),
//! on a MANA and on an mlx5 device: `DEVICE_FATAL` on the open context, `EIO` for every
//! command, destroys that succeed (out of order too) and give every buffer back, the device
//! gone from the list and the tree for the time given, then back under a new `ibv_device`,
//! with queues that work (frames cross the MANA port's wire, whose far end stayed attached
//! through the servicing) and a second servicing that works too.

use crate::common;
use crate::common::{live_at_exit, text, Fake};
use integration_tests::{Netns, IF};
use pmd::emu::wire::{Shm, Wire as _};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `service.c`, compiled once per test process against the real headers and libraries.
fn c_program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::compile_c("service", &[], common::C_LIBS))
}

fn ibdev(fake: &Fake, dev: &str) -> PathBuf {
    fake.dir.path().join("sys/class/infiniband").join(dev)
}

/// Waits (at most `secs`) until `cond` holds.
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A clean run: every check passed, every buffer went back, nothing left alive, and the
/// tree whole again (no servicing left over).
fn assert_clean(fake: &Fake, dev: &str, o: &Output) {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("FAIL"), "{t}");
    assert!(t.contains("\nOK\n"), "{t}");
    assert_eq!(live_at_exit(o), Some(0), "{t}");
    assert!(ibdev(fake, dev).is_dir(), "the device is back in the tree");
    let parked = fake.dir.path().join("sys/fake_rdma_serviced");
    let left: Vec<_> = std::fs::read_dir(&parked)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", parked.display());
}

#[test]
fn a_mana_device_serviced_disassociates_its_context_and_comes_back() {
    mana_service("traffic");
}

/// The same with the engine inline (kick handles on the queues, `fake_rdma_kick_open`):
/// the servicing leaves it with no queue and a thread of its own, which drops the frame
/// that arrives meanwhile; the new queues get it inline again, and the program's kicks
/// move the frames.
#[test]
fn an_inline_mana_engine_survives_a_servicing() {
    let o = mana_service("traffic-inline");
    let t = text(&o);
    for want in [
        "ok   kick handles on the queues: the engine runs inline (0 engine threads)",
        "ok   during the service the queueless inline engine has a thread (1)",
        "ok   new queues: the engine is inline again (0 threads)",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
}

/// `service mana DIR MODE` (traffic or traffic-inline) with the peer end of port 1's wire:
/// a frame sent during the servicing is lost, the frames after it cross.
fn mana_service(mode: &str) -> Output {
    let fake = Fake::new(Some(
        "mana_0/1:mac=02:00:00:00:10:01,wire=shm:fake-mana_0-1",
    ));
    let sys = fake.dir.path().join("sys");
    let mut peer = Shm::open_at(
        "fake-mana_0-1",
        &fake.shm_dir().join("pmd-wire-fake-mana_0-1"),
    )
    .expect("the peer end of port 1's wire");
    let mut child = fake
        .cmd(c_program())
        .arg("mana")
        .arg(ibdev(&fake, "mana_0"))
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The engine opens the wire with the first queue; the servicing takes the device out
    // of the tree (pmd's discovery no longer lists it) but leaves the wire attached.
    wait_for(20, "the device model on the wire", || peer.peer_attached());
    wait_for(10, "the servicing", || !ibdev(&fake, "mana_0").exists());
    let listed = pmd::devices::list(&sys).unwrap();
    assert!(
        listed.iter().all(|d| d.name != "mana_0"),
        "pmd::devices lists a device being serviced: {listed:?}"
    );
    assert!(
        peer.peer_attached(),
        "the wire's far end left during the servicing"
    );
    // A frame that arrives meanwhile finds no queue: lost.
    let mut lost = [0u8; 60];
    lost[..14].copy_from_slice(&[2, 0, 0, 0, 0x10, 1, 2, 0, 0, 0, 0x10, 2, 0x88, 0xb5]);
    lost[14..18].copy_from_slice(b"lost");
    assert!(peer.send(&lost));
    peer.flush();
    wait_for(10, "the device back", || ibdev(&fake, "mana_0").exists());
    let listed = pmd::devices::list(&sys).unwrap();
    assert!(listed.iter().any(|d| d.name == "mana_0"), "{listed:?}");
    // After it: the frame the new queues send reaches the peer, and the peer's answer
    // lands in their RX buffers (not the frame lost during the servicing).
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(30);
    let n = loop {
        if let Some(n) = peer.recv(&mut buf) {
            break n;
        }
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("no frame on the wire after the servicing:\n{}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(&buf[14..31], b"after the service", "{:?}", &buf[..n]);
    let mut answer = [0u8; 60];
    answer[..14].copy_from_slice(&[2, 0, 0, 0, 0x10, 1, 2, 0, 0, 0, 0x10, 2, 0x88, 0xb5]);
    answer[14..20].copy_from_slice(b"answer");
    assert!(peer.send(&answer));
    peer.flush();
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    let hex: String = answer.iter().map(|b| format!(" {b:02x}")).collect();
    assert!(t.contains(&format!("rx: 60 bytes:{hex}\n")), "{t}");
    assert_clean(&fake, "mana_0", &o);
    o
}

#[test]
fn an_mlx5_device_serviced_disassociates_its_context_and_comes_back() {
    let fake = Fake::new(Some("mlx5_0/1:mac=02:00:00:00:50:01,wire=none"));
    let o = fake
        .cmd(c_program())
        .arg("mlx5")
        .arg(ibdev(&fake, "mlx5_0"))
        .output()
        .unwrap();
    assert_clean(&fake, "mlx5_0", &o);
}

#[test]
fn a_device_beside_the_serviced_one_is_untouched() {
    // Two MANA devices: servicing mana_1 leaves mana_0 listed and its contexts alone.
    let fake = Fake::new(Some(
        "mana_0/1:mac=02:00:00:00:10:01,wire=none;mana_1/1:mac=02:00:00:00:11:01,wire=none",
    ));
    let o = fake
        .cmd(c_program())
        .arg("mana")
        .arg(ibdev(&fake, "mana_1"))
        .output()
        .unwrap();
    assert_clean(&fake, "mana_1", &o);
    assert!(ibdev(&fake, "mana_0").is_dir());
}

#[test]
fn a_process_that_exits_during_its_servicing_puts_the_device_back() {
    let fake = Fake::new(Some("mana_0/1:mac=02:00:00:00:10:01,wire=none"));
    let t0 = Instant::now();
    let o = fake
        .cmd(c_program())
        .arg("mana")
        .arg(ibdev(&fake, "mana_0"))
        .arg("quit")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("quitting during the service"), "{t}");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "it did not wait for the 60 s"
    );
    let dir = ibdev(&fake, "mana_0");
    assert!(dir.is_dir(), "the device is back once the process is gone");
    assert!(!dir.join("fake_rdma_fatal").exists(), "the knob is reset");
    assert_eq!(
        std::fs::read_to_string(dir.join("fake_rdma_generation")).unwrap(),
        "1\n"
    );
    let uverbs = fake
        .dir
        .path()
        .join("sys/class/infiniband_verbs/uverbs0/ibdev");
    assert_eq!(std::fs::read_to_string(uverbs).unwrap().trim(), "mana_0");
}

/// A port whose world says `netdev_up_after_reset=1`: its real netdev (down, so that the
/// raw queues could be created) is up again when the device comes back, as `hv_netvsc`
/// opens a returning VF; without the option it stays down. Needs root and `ip netns`
/// (SKIPPED otherwise).
#[test]
fn netdev_up_after_reset_brings_the_ports_netdev_up_when_the_device_returns() {
    let Some(ns) = Netns::create("svc") else {
        return;
    };
    for (option, want_up) in [(",netdev_up_after_reset=1", true), ("", false)] {
        let fake = Fake::new_in(
            Some(&format!(
                "mana_0/1:mac=02:00:00:00:10:01,wire=none,netdev={IF}{option}"
            )),
            Some(&ns),
        );
        ns.set(false);
        let mut c = ns.exec(c_program());
        fake.place(&mut c);
        let o = c
            .arg("mana")
            .arg(ibdev(&fake, "mana_0"))
            .arg("once")
            .output()
            .unwrap();
        assert_clean(&fake, "mana_0", &o);
        assert_eq!(ns.up(IF), want_up, "{option:?}: {}", text(&o));
    }
}
