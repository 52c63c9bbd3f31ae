//! A port that recovers from a lost device by itself (`port::recovery`): the queues of the
//! dead device go (and every buffer they held comes back to the pool), the handles return 0
//! meanwhile and leave TX packets with the caller, the device is opened again and rebuilt
//! with the same configuration, the handles swap to the new queues between bursts, and the
//! counters go on from where they were. The device here is the MANA model (inline engine,
//! deterministic) behind a driver that raises `DeviceFatal` when the test says so; the
//! verbs path (`mana:` and `mlx5:` over the fake rdma-core) is tested in `apps/tests`.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::emu::mana::ModelSpec;
use pmd::emu::{testing, EngineMode};
use pmd::ethdev::{
    Burst, Caps, Link, PortConfig, PortDriver, PortError, PortEvent, PortState, QueueSetup, Queues,
};
use pmd::net::MacAddr;
use pmd::port::{probe, Port, RxQueue, TxQueue};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static CABLE: AtomicU32 = AtomicU32::new(0);

const MAC_A: &str = "02:00:00:00:0a:01";

/// A driver that loses its device when `fatal` is set: `DeviceFatal` from its events.
struct Flaky {
    inner: Box<dyn PortDriver>,
    fatal: Arc<AtomicBool>,
    said: bool,
}

impl PortDriver for Flaky {
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }
    fn link(&self) -> Link {
        self.inner.link()
    }
    fn configure(
        &mut self,
        cfg: &PortConfig,
        pool: &Arc<MbufPool>,
        q: &QueueSetup,
    ) -> Result<Queues, PortError> {
        self.inner.configure(cfg, pool, q)
    }
    fn start(&mut self) -> Result<(), PortError> {
        self.inner.start()
    }
    fn stop(&mut self) {
        self.inner.stop()
    }
    fn xstats(&self) -> Vec<pmd::ethdev::Xstat> {
        self.inner.xstats()
    }
    fn imissed(&self) -> u64 {
        self.inner.imissed()
    }
    fn take_events(&mut self, out: &mut Vec<PortEvent>) {
        self.inner.take_events(out);
        if self.fatal.load(Ordering::SeqCst) && !self.said {
            self.said = true;
            out.push(PortEvent::DeviceFatal);
        }
    }
}

/// A MANA model driver on `wire` (inline engine), as port `id` with MAC `mac`.
fn model_driver(wire: &str, id: u16, mac: &str) -> Box<dyn PortDriver> {
    let mut spec = ModelSpec::new(wire.parse().unwrap());
    spec.mac = Some(mac.parse().unwrap());
    spec.engine = EngineMode::Inline;
    let (model, _h) = testing::mana_with(&spec, id).unwrap();
    Box::new(pmd::mana::Driver::new(
        Box::new(model),
        pmd::mana::Options::default(),
    ))
}

struct Rig {
    pool: Arc<MbufPool>,
    /// The port under test (A) and its handles.
    a: Port,
    rx_a: RxQueue,
    tx_a: TxQueue,
    /// The peer (B) on the other end of the cable.
    _b: Port,
    rx_b: RxQueue,
    tx_b: TxQueue,
    /// Set: A's device fails.
    fatal: Arc<AtomicBool>,
    /// Reopen attempts that fail before one succeeds (`u32::MAX`: never).
    failures_left: Arc<AtomicU32>,
    reopens: Arc<AtomicU32>,
}

fn cfg() -> PortConfig {
    PortConfig::default().with_ring_sizes(64, 64)
}

fn rig(timeout: Duration) -> Rig {
    let pool = MbufPool::new(MbufPoolConfig::new("recovery", 2048)).unwrap();
    let wire = format!(
        "shm:pmdtest-recover-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let fatal = Arc::new(AtomicBool::new(false));
    let failures_left = Arc::new(AtomicU32::new(0));
    let reopens = Arc::new(AtomicU32::new(0));
    let flaky = |fatal: &Arc<AtomicBool>| -> Box<dyn PortDriver> {
        Box::new(Flaky {
            inner: model_driver(&wire, 0, MAC_A),
            fatal: Arc::clone(fatal),
            said: false,
        })
    };
    let reopen = {
        let (fatal, left, reopens, wire) = (
            Arc::clone(&fatal),
            Arc::clone(&failures_left),
            Arc::clone(&reopens),
            wire.clone(),
        );
        move || -> Result<Box<dyn PortDriver>, PortError> {
            reopens.fetch_add(1, Ordering::SeqCst);
            if left.load(Ordering::SeqCst) > 0 {
                left.fetch_sub(1, Ordering::SeqCst);
                return Err(PortError::NoDevice {
                    spec: "model".into(),
                    why: "not back yet".into(),
                });
            }
            // The new device is healthy until the test fails it again.
            fatal.store(false, Ordering::SeqCst);
            Ok(Box::new(Flaky {
                inner: model_driver(&wire, 0, MAC_A),
                fatal: Arc::clone(&fatal),
                said: false,
            }))
        }
    };
    let mut a =
        Port::from_driver(0, "A".into(), flaky(&fatal)).with_recovery(Box::new(reopen), timeout);
    a.configure(&cfg(), &pool).unwrap();
    let (rx_a, tx_a) = (a.rx_queue(0).unwrap(), a.tx_queue(0).unwrap());
    a.start().unwrap();
    let mut b = probe::mana(0, "B".into(), Box::new(model(&wire)), Default::default());
    b.configure(&cfg(), &pool).unwrap();
    let (rx_b, tx_b) = (b.rx_queue(0).unwrap(), b.tx_queue(0).unwrap());
    b.start().unwrap();
    Rig {
        pool,
        a,
        rx_a,
        tx_a,
        _b: b,
        rx_b,
        tx_b,
        fatal,
        failures_left,
        reopens,
    }
}

fn model(wire: &str) -> pmd::emu::mana::Model {
    let mut spec = ModelSpec::new(wire.parse().unwrap());
    spec.mac = Some("02:00:00:00:0b:01".parse().unwrap());
    spec.engine = EngineMode::Inline;
    testing::mana_with(&spec, 1).unwrap().0
}

/// A burst of `n` 60-byte frames for A's MAC.
fn frames(pool: &Arc<MbufPool>, n: usize) -> Burst {
    let mut b = Burst::with_capacity(32);
    for i in 0..n {
        let mut m = mempool::lcache::alloc(pool).unwrap();
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&MAC_A.parse::<MacAddr>().unwrap().0);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0x0b, 1]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14] = i as u8;
        m.extend_from_slice(&f).unwrap();
        b.push(m).unwrap();
    }
    b
}

/// Receives on `rx` until `n` frames arrived or 2 s passed; frees them; returns the count.
fn receive(rx: &mut RxQueue, n: usize) -> usize {
    let t0 = Instant::now();
    let mut got = 0;
    let mut b = Burst::with_capacity(32);
    while got < n && t0.elapsed() < Duration::from_secs(2) {
        got += rx.rx_burst(&mut b);
        drop(b.drain_front(b.len()));
    }
    got
}

/// Takes A's events until `want` shows up, at most 2 s, the way an event-driven app does:
/// waiting on the port's one descriptor (the same one all along: it wakes the waiter every
/// retry interval while the port recovers, which is what drives the recovery) and taking the
/// events when it is readable.
fn events_until(a: &mut Port, want: fn(&PortEvent) -> bool) -> Vec<PortEvent> {
    let fd = a
        .event_fd()
        .expect("a recovering port has an event descriptor");
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < Duration::from_secs(2) {
        if pmd::sys::event::poll_readable(&[fd], Duration::from_millis(500)).unwrap()[0] {
            seen.extend(a.take_events());
        }
        assert_eq!(
            a.event_fd(),
            Some(fd),
            "the port's descriptor stays the same"
        );
        if seen.iter().any(want) {
            return seen;
        }
    }
    panic!("no such event within 2 s; saw {seen:?}");
}

#[test]
fn a_lost_device_is_rebuilt_and_the_handles_carry_on() {
    let mut r = rig(Duration::from_secs(10));
    // Traffic before: B -> A.
    let mut b = frames(&r.pool, 8);
    assert_eq!(r.tx_b.tx_burst(&mut b), 8);
    assert_eq!(receive(&mut r.rx_a, 8), 8);
    assert_eq!(r.a.stats().ipackets, 8);
    let frames_before = xstat(&r.a, "dev_rx_frames");
    assert_eq!(frames_before, 8);

    // The device fails; the next reopen attempts find nothing twice.
    r.failures_left.store(2, Ordering::SeqCst);
    r.fatal.store(true, Ordering::SeqCst);
    let ev = r.a.take_events();
    assert_eq!(ev, [PortEvent::DeviceFatal, PortEvent::Recovering]);
    assert_eq!(r.a.state(), PortState::Recovering);
    assert!(!r.a.link().up, "no device, no link");

    // Bursts return 0 and TX leaves the packets with the caller.
    let mut out = frames(&r.pool, 4);
    assert_eq!(r.tx_a.tx_burst(&mut out), 0);
    assert_eq!(out.len(), 4, "the caller keeps what was not sent");
    drop(out);
    let mut rxb = Burst::with_capacity(32);
    assert_eq!(r.rx_a.rx_burst(&mut rxb), 0);
    // Those bursts dropped the dead queues: every buffer A had posted is back. What is out
    // now is B's posted RX ring only (once B reclaimed what it sent).
    assert_eq!(r.tx_b.tx_burst(&mut Burst::with_capacity(1)), 0);
    let b_ring = 64;
    assert_eq!(
        r.pool.in_use(),
        b_ring,
        "A's dead queues gave everything back"
    );

    // The recovery retries until the device is back.
    let ev = events_until(&mut r.a, |e| matches!(e, PortEvent::Recovered { .. }));
    let Some(PortEvent::Recovered { downtime }) = ev.last() else {
        panic!("{ev:?}")
    };
    assert!(*downtime >= Duration::from_millis(20), "{downtime:?}");
    assert_eq!(
        r.reopens.load(Ordering::SeqCst),
        3,
        "two failures, one success"
    );
    assert_eq!(r.a.state(), PortState::Started);
    assert_eq!(r.a.recoveries(), 1);

    // Traffic after, through the same handles.
    let mut b = frames(&r.pool, 16);
    assert_eq!(r.tx_b.tx_burst(&mut b), 16);
    assert_eq!(receive(&mut r.rx_a, 16), 16);
    let mut out = frames(&r.pool, 5);
    assert_eq!(r.tx_a.tx_burst(&mut out), 5, "A sends again");
    assert_eq!(receive(&mut r.rx_b, 5), 5);
    // Sent frames are counted when their completions are reclaimed.
    assert_eq!(r.tx_a.tx_burst(&mut Burst::with_capacity(1)), 0);
    let s = r.a.stats();
    assert_eq!(
        (s.ipackets, s.opackets),
        (24, 5),
        "counted across both devices"
    );
    assert_eq!(
        xstat(&r.a, "dev_rx_frames"),
        24,
        "the device's counters are summed"
    );

    // Everything comes back when the port and its handles go.
    let pool = Arc::clone(&r.pool);
    drop(r);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_device_that_stays_away_fails_the_port_with_a_reason() {
    let mut r = rig(Duration::from_millis(150));
    r.failures_left.store(u32::MAX, Ordering::SeqCst);
    r.fatal.store(true, Ordering::SeqCst);
    // (The test driver says so when asked; a device's descriptor would wake the waiter.)
    assert_eq!(
        r.a.take_events(),
        [PortEvent::DeviceFatal, PortEvent::Recovering]
    );
    let ev = events_until(&mut r.a, |e| *e == PortEvent::RecoveryFailed);
    assert_eq!(ev, [PortEvent::RecoveryFailed]);
    assert_eq!(r.a.state(), PortState::Failed);
    let why = r.a.failure().expect("a reason").to_string();
    assert!(
        why.contains("did not come back within") && why.contains("not back yet"),
        "{why}"
    );
    assert!(why.contains(MAC_A), "{why}");
    let mut out = frames(&r.pool, 3);
    assert_eq!(r.tx_a.tx_burst(&mut out), 0);
    assert!(matches!(
        r.a.start(),
        Err(PortError::State {
            state: PortState::Failed,
            ..
        })
    ));
    drop(out);
    let pool = Arc::clone(&r.pool);
    drop(r);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_port_without_recovery_reports_the_loss_and_stops_there() {
    let pool = MbufPool::new(MbufPoolConfig::new("norecover", 512)).unwrap();
    let fatal = Arc::new(AtomicBool::new(true));
    let mut p = Port::from_driver(
        0,
        "plain".into(),
        Box::new(Flaky {
            inner: model_driver("none", 0, MAC_A),
            fatal,
            said: false,
        }),
    );
    p.configure(&cfg(), &pool).unwrap();
    p.start().unwrap();
    assert!(!p.recovers());
    assert_eq!(p.take_events(), [PortEvent::DeviceFatal]);
    assert_eq!(p.state(), PortState::Started);
}

fn xstat(p: &Port, name: &str) -> u64 {
    p.stats()
        .xstats
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no xstat {name}"))
        .1
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A hundred resets in a row under traffic: nothing grows (pool in use, descriptors), the
/// counters add up over every generation, and the handles keep working.
#[test]
fn a_hundred_resets_in_a_row_leave_nothing_behind() {
    let mut r = rig(Duration::from_secs(10));
    let run = |r: &mut Rig| {
        let mut b = frames(&r.pool, 4);
        assert_eq!(r.tx_b.tx_burst(&mut b), 4);
        assert_eq!(receive(&mut r.rx_a, 4), 4);
        assert_eq!(r.tx_b.tx_burst(&mut Burst::with_capacity(1)), 0);
    };
    run(&mut r);
    let (in_use, fds) = (r.pool.in_use(), open_fds());
    for i in 1..=100u64 {
        r.fatal.store(true, Ordering::SeqCst);
        assert!(r.a.take_events().contains(&PortEvent::Recovering));
        // The handles let go of the dead queues at their next burst.
        assert_eq!(r.rx_a.rx_burst(&mut Burst::with_capacity(1)), 0);
        assert_eq!(r.tx_a.tx_burst(&mut Burst::with_capacity(1)), 0);
        events_until(&mut r.a, |e| matches!(e, PortEvent::Recovered { .. }));
        run(&mut r);
        assert_eq!(r.a.recoveries(), i);
        assert_eq!(r.pool.in_use(), in_use, "reset {i}: the pool is whole");
    }
    assert!(
        open_fds() <= fds + 2,
        "{} descriptors, {fds} before",
        open_fds()
    );
    assert_eq!(r.a.stats().ipackets, 4 * 101);
    assert_eq!(xstat(&r.a, "dev_rx_frames"), 4 * 101);
}
