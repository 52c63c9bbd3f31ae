//! Cost per packet of the MANA and mlx5 datapaths (driver side) on their device models in
//! step mode: `tx_burst` (WQE building, doorbell, completion processing) and `rx_burst` (CQE
//! polling, mbuf delivery, refill, RQ doorbell). Only the driver calls are timed; the
//! models' steps run between them, untimed.
//!
//! Then the whole chain on one thread with inline engines (`<kind>_inline/chain_32x64B`):
//! a burst sent on port A (driver TX, then the model's TX in the doorbell's kick: WQEs read,
//! frames onto the cable, completions) and received on port B (the model's RX in the poll's
//! kick: frames off the cable into the posted buffers, completions; then driver RX), the
//! mbufs freed. That is what one forwarded packet costs l2fwd's core (its RX on one port,
//! its TX on the other), without the MAC rewrite.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mempool::lcache;
use mempool::{MbufPool, MbufPoolConfig};
use pmd::emu::testing;
use pmd::port::{probe, Burst, PortConfig};
use std::hint::black_box;
use std::time::{Duration, Instant};

const BURST: usize = 32;

fn bench(c: &mut Criterion) {
    let pool = MbufPool::new(MbufPoolConfig::new("bench", 4096)).unwrap();
    let name = format!("bench-{}", std::process::id());
    let wire = format!("loop:{name}");
    let (model_a, ma) = testing::mana(&wire, 0).unwrap();
    let (model_b, mb) = testing::mana(&wire, 1).unwrap();
    let opts = pmd::mana::Options::default();
    let a = probe::mana(0, "a".into(), Box::new(model_a), opts.clone());
    let b = probe::mana(1, "b".into(), Box::new(model_b), opts);
    ma.pause();
    mb.pause();
    pair(c, "mana_emu", &pool, a, b, &|| {
        ma.step();
        mb.step();
    });

    // The mlx5 driver's receive variants: cyclic RQs with compressed CQEs (the default),
    // without, and multi-packet RQs (DPDK's default geometry) with compressed CQEs.
    let variants = [
        ("mlx5_emu", pmd::mlx5::Options::default()),
        (
            "mlx5_emu_nocomp",
            pmd::mlx5::Options {
                cqe_compression: false,
                ..Default::default()
            },
        ),
        (
            "mlx5_emu_mprq",
            pmd::mlx5::Options {
                mprq: Some(pmd::mlx5::Mprq::DEFAULT),
                ..Default::default()
            },
        ),
    ];
    for (group, opts) in variants {
        let wire: pmd::emu::wire::WireSpec = format!("loop:{name}-{group}").parse().unwrap();
        let open = |id| {
            pmd::emu::mlx5::port::ModelPort::open(
                &wire,
                None,
                None,
                id,
                0,
                pmd::emu::EngineMode::Thread,
            )
            .unwrap()
        };
        let (pa, pb) = (open(0), open(1));
        let (ha, hb) = (pa.handle(), pb.handle());
        ha.pause();
        hb.pause();
        let a = probe::mlx5_with(0, "a".into(), Box::new(pa), opts);
        let b = probe::mlx5_with(1, "b".into(), Box::new(pb), opts);
        pair(c, group, &pool, a, b, &|| {
            ha.step();
            hb.step();
        });
    }
}

/// Times `tx_burst` on `a` and `rx_burst` on `b` (joined by a cable), with `step` running
/// the devices between the timed calls.
fn pair(
    c: &mut Criterion,
    group: &str,
    pool: &std::sync::Arc<MbufPool>,
    mut a: pmd::port::Port,
    mut b: pmd::port::Port,
    step: &dyn Fn(),
) {
    let cfg = PortConfig::default().with_ring_sizes(256, 256);
    a.configure(&cfg, pool).unwrap();
    b.configure(&cfg, pool).unwrap();
    let mut tx = a.tx_queue(0).unwrap();
    let mut rx = b.rx_queue(0).unwrap();
    a.start().unwrap();
    b.start().unwrap();
    let frame = [0x5au8; 64];
    let fill = |out: &mut Burst| {
        while out.spare() > 0 {
            let mut m = lcache::alloc(pool).unwrap();
            m.extend_from_slice(&frame).unwrap();
            out.push(m).unwrap();
        }
    };

    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(BURST as u64));
    g.bench_function("tx_burst_32x64B", |bencher| {
        bencher.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut out = Burst::with_capacity(BURST);
            let mut inb = Burst::with_capacity(BURST);
            for _ in 0..iters {
                fill(&mut out);
                let t = Instant::now();
                black_box(tx.tx_burst(&mut out));
                spent += t.elapsed();
                step();
                rx.rx_burst(&mut inb);
                lcache::with_cache(pool, |cache| {
                    inb.free_all(cache);
                    out.free_all(cache);
                });
            }
            spent
        })
    });
    g.bench_function("rx_burst_32x64B", |bencher| {
        bencher.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut out = Burst::with_capacity(BURST);
            let mut inb = Burst::with_capacity(BURST);
            for _ in 0..iters {
                fill(&mut out);
                tx.tx_burst(&mut out);
                step();
                let t = Instant::now();
                black_box(rx.rx_burst(&mut inb));
                spent += t.elapsed();
                lcache::with_cache(pool, |cache| {
                    inb.free_all(cache);
                    out.free_all(cache);
                });
            }
            spent
        })
    });
    g.finish();
}

/// A 60-byte UDP/IPv4 frame with right checksums (64 bytes on the wire with the FCS), as
/// pktgen sends: the models parse it, verify both checksums and hash it for RSS.
fn udp_frame() -> [u8; 60] {
    use pmd::net::csum;
    let mut f = [0u8; 60];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0xaa, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let (src, dst) = ([169, 254, 1, 1], [169, 254, 1, 2]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&46u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let c = csum::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f[34..36].copy_from_slice(&1024u16.to_be_bytes());
    f[36..38].copy_from_slice(&9000u16.to_be_bytes());
    f[38..40].copy_from_slice(&26u16.to_be_bytes());
    for (k, b) in f[42..].iter_mut().enumerate() {
        *b = k as u8;
    }
    let pseudo = csum::ipv4_pseudo(src, dst, 17, 26);
    let c = !csum::fold(csum::add(u32::from(pseudo), &f[34..]));
    f[40..42].copy_from_slice(&c.to_be_bytes());
    f
}

/// The whole chain, inline engines, on an in-process cable (see the module docs).
fn chain(c: &mut Criterion) {
    let pool = MbufPool::new(MbufPoolConfig::new("bench-chain", 4096)).unwrap();
    for kind in ["emu-mana", "emu-mlx5"] {
        let wire = format!("loop:chain-{kind}-{}", std::process::id());
        let spec = || -> pmd::port::PortSpec {
            format!("{kind}:wire={wire},engine=inline").parse().unwrap()
        };
        let cfg = PortConfig::default().with_ring_sizes(1024, 1024);
        let mut a = pmd::port::Port::open(0, &spec()).unwrap();
        let mut b = pmd::port::Port::open(1, &spec()).unwrap();
        a.configure(&cfg, &pool).unwrap();
        b.configure(&cfg, &pool).unwrap();
        let mut tx = a.tx_queue(0).unwrap();
        let mut rx = b.rx_queue(0).unwrap();
        a.start().unwrap();
        b.start().unwrap();
        let frame = udp_frame();
        let mut g = c.benchmark_group(format!("{}_inline", kind.trim_start_matches("emu-")));
        g.throughput(Throughput::Elements(BURST as u64));
        // Thread CPU time, not wall time: on a shared machine the wall clock also counts
        // the time other processes had the core.
        g.bench_function("chain_32x64B", |bencher| {
            let mut out = Burst::with_capacity(BURST);
            let mut inb = Burst::with_capacity(BURST);
            bencher.iter_custom(|iters| {
                let t0 = pmd::sys::thread_cpu_time();
                for _ in 0..iters {
                    while out.spare() > 0 {
                        let mut m = lcache::alloc(&pool).unwrap();
                        m.extend_from_slice(&frame).unwrap();
                        out.push(m).unwrap();
                    }
                    black_box(tx.tx_burst(&mut out));
                    black_box(rx.rx_burst(&mut inb));
                    lcache::with_cache(&pool, |cache| {
                        inb.free_all(cache);
                        out.free_all(cache);
                    });
                }
                pmd::sys::thread_cpu_time() - t0
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench, chain);
criterion_main!(benches);
