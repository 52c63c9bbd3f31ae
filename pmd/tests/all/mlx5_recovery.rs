//! mlx5 error recovery end to end: two `emu-mlx5` ports on an in-process cable, the model
//! told to fail TX WQEs or RX WQEs now and then (as a bad memory key or a malformed WQE
//! would), the driver recovering its queues (spec §2.8, §5.3) while traffic flows, over many
//! laps of the rings, with the engines stepped by the test and on their own threads.
//!
//! What must hold: every frame that arrives is byte for byte what was sent, in order; every
//! frame handed to `tx_burst` is either received or counted as lost somewhere (the sender's
//! errors, the wire, the receiver's missed frames and errors), exactly; the driver's error
//! and recovery counters agree with the device's; every buffer comes back.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::emu::mlx5::{Faults, ModelHandle};
use pmd::emu::testing;
use pmd::ethdev::Burst;
use pmd::mlx5::{Mprq, Options};
use pmd::port::{probe, Port, PortConfig, RxQueue, TxQueue};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static CABLE: AtomicU32 = AtomicU32::new(0);

/// Frames in flight the sender allows (lost ones not counted): half the receive ring.
const WINDOW: u64 = 128;
/// Frames per test run: about 80 laps of the 256-entry rings.
const FRAMES: u32 = 20_000;

fn frame(seq: u32) -> Vec<u8> {
    let len = 60 + (seq % 1400) as usize;
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental EtherType
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (seq as usize + i) as u8;
    }
    f
}

/// Port 0 sends on `tx`, port 1 receives on `rx`.
struct Pair {
    p0: Port,
    p1: Port,
    h0: ModelHandle,
    h1: ModelHandle,
    tx: TxQueue,
    rx: RxQueue,
    stepped: bool,
}

fn pair(pool: &Arc<MbufPool>, stepped: bool, min_inline: u16) -> Pair {
    pair_with(pool, stepped, min_inline, Options::default())
}

/// [`pair`] with the receiver's driver options `rx` (striding RQs, CQE compression).
fn pair_with(pool: &Arc<MbufPool>, stepped: bool, min_inline: u16, rx: Options) -> Pair {
    let wire = format!(
        "loop:mlx5-recover-{}-{}",
        std::process::id(),
        CABLE.fetch_add(1, Ordering::SeqCst)
    );
    let (m0, h0) = testing::mlx5(&wire, 0, min_inline).unwrap();
    let (m1, h1) = testing::mlx5(&wire, 1, min_inline).unwrap();
    if stepped {
        h0.pause();
        h1.pause();
    }
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    let mut p0 = probe::mlx5(0, "tx".into(), Box::new(m0));
    let mut p1 = probe::mlx5_with(1, "rx".into(), Box::new(m1), rx);
    p0.configure(&cfg, pool).unwrap();
    p1.configure(&cfg, pool).unwrap();
    let tx = p0.tx_queue(0).unwrap();
    let rx = p1.rx_queue(0).unwrap();
    p0.start().unwrap();
    p1.start().unwrap();
    Pair {
        p0,
        p1,
        h0,
        h1,
        tx,
        rx,
        stepped,
    }
}

fn xstat(p: &Port, name: &str) -> u64 {
    let x = p.stats().xstats;
    x.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no xstat {name} in {x:?}"))
        .1
}

/// Frames lost on the way, each counted once somewhere: the sender's errors (build drops and
/// recovery drops), the sending device (wire refused, MTU), the receiving device (no WQE,
/// CQ full, wire faults: `imissed` and the device counters), the receiver's errors (error
/// CQEs with a frame, frames dropped by a recovery).
fn losses(p: &Pair) -> u64 {
    let (s0, s1) = (p.p0.stats(), p.p1.stats());
    let (d0, d1) = (p.h0.stats(), p.h1.stats());
    s0.oerrors
        + d0.tx_wire_drops
        + d0.tx_mtu_drops
        + s1.imissed
        + s1.ierrors
        + d1.rx_cq_full
        + d1.rx_fault_drops
}

/// What a run saw.
#[derive(Debug, Default)]
struct Seen {
    sent: u64,
    got: u64,
    /// Places where the sequence jumped (frames lost between two received ones).
    gaps: u64,
    /// Frames received after the first gap.
    after_first_gap: u64,
}

/// Sends `FRAMES` frames from port 0 to port 1 and receives them, checking each one, until
/// every frame is received or counted as lost.
fn run(p: &mut Pair, pool: &Arc<MbufPool>) -> Seen {
    let mut seen = Seen::default();
    let mut next = 0u32;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut idle = 0u32;
    loop {
        let mut moved = false;
        if seen.sent < u64::from(FRAMES) {
            let room = seen.sent - seen.got < WINDOW || seen.sent - seen.got - losses(p) < WINDOW;
            let mut b = Burst::with_capacity(16);
            if room {
                while b.spare() > 0 && seen.sent + (b.len() as u64) < u64::from(FRAMES) {
                    let mut m = mempool::lcache::alloc(pool).unwrap();
                    m.extend_from_slice(&frame(seen.sent as u32 + b.len() as u32))
                        .unwrap();
                    b.push(m).unwrap();
                }
            }
            // An empty burst still reclaims completions (and recovers after an error).
            let n = p.tx.tx_burst(&mut b) as u64;
            seen.sent += n;
            moved |= n > 0;
        } else {
            p.tx.tx_burst(&mut Burst::with_capacity(1));
        }
        if p.stepped {
            p.h0.run_until_idle(8);
            p.h1.run_until_idle(8);
        }
        let mut b = Burst::with_capacity(32);
        p.rx.rx_burst(&mut b);
        for m in b.drain_front(b.len()) {
            let seq = u32::from_be_bytes(m.data()[14..18].try_into().unwrap());
            assert!(
                seq >= next,
                "frame {seq} after {next}: out of order or twice"
            );
            if seq > next {
                seen.gaps += 1;
            }
            if seen.gaps > 0 {
                seen.after_first_gap += 1;
            }
            assert_eq!(m.data(), &frame(seq)[..], "frame {seq}");
            next = seq + 1;
            seen.got += 1;
            moved = true;
        }
        if seen.sent == u64::from(FRAMES) && !moved {
            idle += 1;
            if idle.is_multiple_of(64) {
                let lost = losses(p);
                assert!(
                    seen.got + lost <= seen.sent,
                    "counted twice: {seen:?}, lost {lost}"
                );
                if seen.got + lost == seen.sent {
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(
            Instant::now() < deadline,
            "stuck: {seen:?}, lost {}, tx {:?}, rx {:?}",
            losses(p),
            p.p0.stats(),
            p.p1.stats()
        );
    }
}

/// Stops both ports, drops every queue, and checks every buffer came back.
fn finish(p: Pair, pool: &Arc<MbufPool>) {
    let Pair {
        mut p0,
        mut p1,
        tx,
        rx,
        ..
    } = p;
    drop((tx, rx));
    p0.stop();
    p1.stop();
    drop((p0, p1));
    assert_eq!(pool.in_use(), 0, "buffers leaked");
}

/// TX errors mid-stream (a bad key in a pointer segment: LOCAL_PROT, or a malformed WQE:
/// LOCAL_QP_OP), eMPW and SEND WQEs, stepped and threaded engines: each error is counted,
/// the queue recovers (one RESET per error), later frames arrive byte for byte, and
/// sent = received + counted losses, with all of the losses the sender's recovery drops.
#[test]
fn tx_errors_mid_stream_are_recovered_and_every_frame_accounted_for() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-recover-tx", 4096)).unwrap();
    for (stepped, min_inline, faults) in [
        (
            true,
            0,
            Faults {
                tx_bad_key_every: 997,
                ..Faults::default()
            },
        ),
        (
            true,
            18,
            Faults {
                tx_error_every: 613,
                ..Faults::default()
            },
        ),
        (
            false,
            0,
            Faults {
                tx_error_every: 89,
                ..Faults::default()
            },
        ),
        (
            false,
            18,
            Faults {
                tx_bad_key_every: 1201,
                ..Faults::default()
            },
        ),
    ] {
        let what = format!("stepped {stepped}, min_inline {min_inline}, {faults:?}");
        let mut p = pair(&pool, stepped, min_inline);
        p.h0.set_faults(faults.clone());
        let seen = run(&mut p, &pool);
        let errors = xstat(&p.p0, "tx_cqe_errors");
        let dev = p.h0.stats();
        assert!(errors >= 3, "{what}: {errors} errors");
        assert_eq!(errors, dev.tx_errors, "{what}");
        assert_eq!(xstat(&p.p0, "tx_recoveries"), errors, "{what}");
        assert_eq!(dev.sq_resets, errors, "{what}");
        assert_eq!(xstat(&p.p0, "tx_flushed"), dev.tx_flushed, "{what}");
        assert_eq!(xstat(&p.p0, "tx_recovery_failures"), 0, "{what}");
        let s0 = p.p0.stats();
        assert_eq!(s0.oerrors, xstat(&p.p0, "tx_error_drops"), "{what}");
        assert_eq!(seen.sent, seen.got + s0.oerrors, "{what}: {seen:?}");
        assert_eq!(
            losses(&p),
            s0.oerrors,
            "{what}: only the sender lost frames"
        );
        assert!(
            seen.gaps > 0 && seen.after_first_gap > 0,
            "{what}: {seen:?}"
        );
        let syndrome = if faults.tx_bad_key_every > 0 {
            "tx_err_local_prot"
        } else {
            "tx_err_local_qp_op"
        };
        assert_eq!(xstat(&p.p0, syndrome), errors, "{what}");
        finish(p, &pool);
    }
}

/// RX WQEs failing with LOCAL_PROT mid-stream (the model's bad-key fault), cyclic and
/// striding RQs, with and without compressed CQEs, stepped and threaded: each error is
/// counted and recovered (RESET, drain, RDY, repost), frames keep arriving byte for byte,
/// and the receiver's losses (error CQEs, frames dropped while its WQ was not ready) account
/// for every frame sent.
#[test]
fn rx_errors_mid_stream_are_recovered_and_every_frame_accounted_for() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-recover-rx", 4096)).unwrap();
    let small = Mprq {
        log_stride_bytes: 8,
        log_strides: 4,
    };
    for (stepped, every, compress, mprq) in [
        (true, 487, false, None),
        (true, 211, true, None),
        (false, 487, false, None),
        (false, 97, true, None),
        (true, 307, true, Some(Mprq::DEFAULT)),
        (true, 131, false, Some(small)),
        (false, 229, true, Some(small)),
        (false, 401, false, Some(Mprq::DEFAULT)),
    ] {
        let what = format!("stepped {stepped}, every {every}, compression {compress}, {mprq:?}");
        let rx = Options {
            mprq,
            cqe_compression: compress,
        };
        let mut p = pair_with(&pool, stepped, 0, rx);
        p.h1.set_faults(Faults {
            rx_bad_key_every: every,
            ..Faults::default()
        });
        let seen = run(&mut p, &pool);
        let dev = p.h1.stats();
        let critical = xstat(&p.p1, "rx_critical_errors");
        assert!(critical >= 3, "{what}: {critical}");
        assert_eq!(critical, dev.rx_prot_errors, "{what}");
        assert_eq!(xstat(&p.p1, "rx_recoveries"), critical, "{what}");
        assert_eq!(dev.rq_resets, critical, "{what}");
        assert_eq!(xstat(&p.p1, "rx_flushed"), dev.rx_flushed, "{what}");
        assert_eq!(xstat(&p.p1, "rx_recovery_failures"), 0, "{what}");
        let s1 = p.p1.stats();
        assert_eq!(
            s1.ierrors,
            dev.rx_prot_errors + xstat(&p.p1, "rx_recovery_drops"),
            "{what}"
        );
        assert_eq!(s1.ipackets, seen.got, "{what}");
        assert_eq!(
            dev.rx_frames, seen.got,
            "{what}: every frame in a buffer delivered"
        );
        assert_eq!(p.p0.stats().oerrors, 0, "{what}");
        assert!(
            seen.gaps > 0 && seen.after_first_gap > 0,
            "{what}: {seen:?}"
        );
        if compress {
            assert!(dev.rx_compressed_sessions > 0, "{what}");
        } else {
            assert_eq!(dev.rx_compressed_sessions, 0, "{what}");
        }
        if mprq.is_some() {
            assert!(xstat(&p.p1, "rx_mprq_wqes_retired") > 0, "{what}");
            assert_eq!(xstat(&p.p1, "rx_mprq_fillers"), dev.rx_fillers, "{what}");
            if mprq == Some(small) {
                assert!(dev.rx_fillers > 0, "{what}");
            }
        }
        finish(p, &pool);
    }
}

/// A recovery whose RESET fails once: counted, the queue takes nothing for a while (no
/// spinning, no crash), then a retry works and traffic goes on; every frame is accounted
/// for. Then a device that refuses every state change: the queues stay down, bursts return
/// at once, the failures are counted, and every buffer still comes back.
#[test]
fn failing_resets_are_counted_and_never_hang_a_queue() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-recover-fail", 4096)).unwrap();
    for stepped in [true, false] {
        let what = format!("stepped {stepped}");
        let mut p = pair(&pool, stepped, 0);
        p.h0.set_faults(Faults {
            tx_error_every: 151,
            fail_state_changes: 1,
            ..Faults::default()
        });
        p.h1.set_faults(Faults {
            rx_bad_key_every: 733,
            fail_state_changes: 1,
            ..Faults::default()
        });
        let seen = run(&mut p, &pool);
        assert_eq!(xstat(&p.p0, "tx_recovery_failures"), 1, "{what}");
        assert_eq!(xstat(&p.p1, "rx_recovery_failures"), 1, "{what}");
        assert_eq!(p.h0.stats().state_change_failures, 1, "{what}");
        let tx_err = xstat(&p.p0, "tx_cqe_errors");
        assert_eq!(xstat(&p.p0, "tx_recoveries"), tx_err, "{what}");
        let rx_err = xstat(&p.p1, "rx_critical_errors");
        assert_eq!(xstat(&p.p1, "rx_recoveries"), rx_err, "{what}");
        assert!(tx_err >= 2 && rx_err >= 2, "{what}: {tx_err} {rx_err}");
        assert!(seen.after_first_gap > 0, "{what}: {seen:?}");

        // Now nothing recovers.
        p.h0.set_faults(Faults {
            tx_error_every: 1,
            fail_state_changes: u32::MAX,
            ..Faults::default()
        });
        let failures = xstat(&p.p0, "tx_recovery_failures");
        let t = Instant::now();
        let mut refused = 0;
        for k in 0..20 * 1024 {
            if p.stepped {
                p.h0.step();
            }
            let mut b = Burst::with_capacity(1);
            let mut m = mempool::lcache::alloc(&pool).unwrap();
            m.extend_from_slice(&frame(k)).unwrap();
            b.push(m).unwrap();
            if p.tx.tx_burst(&mut b) == 0 {
                refused += 1;
            }
        }
        assert!(
            refused > 19 * 1024,
            "{what}: the queue went down ({refused})"
        );
        // The first failure, then one retry every 1024 bursts (the engine thread may take
        // a while to fail the first WQE: bursts meanwhile fill the ring and take nothing).
        let more = xstat(&p.p0, "tx_recovery_failures") - failures;
        let least = if stepped { 19 } else { 1 };
        assert!((least..=21).contains(&more), "{what}: {more} failures");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: bursts return at once"
        );
        finish(p, &pool);
    }
}
