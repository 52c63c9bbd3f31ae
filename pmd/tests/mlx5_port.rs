//! Two `emu-mlx5` ports joined by an in-process cable: the mlx5 driver (TX and RX queues)
//! over the mlx5 device model, through the port API an application uses. Every frame arrives
//! once, in order, byte for byte, over many laps of the rings, and every buffer comes back.

use mempool::{MbufPool, MbufPoolConfig};
use pmd::ethdev::Burst;
use pmd::port::{Port, PortConfig};
use std::time::{Duration, Instant};

fn frame(seq: u32, len: usize) -> Vec<u8> {
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

#[test]
fn frames_cross_an_emu_mlx5_cable_in_order_byte_for_byte() {
    let pool = MbufPool::new(MbufPoolConfig::new("mlx5-port", 4096)).unwrap();
    let cfg = PortConfig {
        rx_ring_size: 256,
        tx_ring_size: 256,
        ..Default::default()
    };
    let spec = |_: u16| "emu-mlx5:wire=loop:mlx5-port-test".parse().unwrap();
    let (p0, _rx0, mut tx0) = Port::open_started(0, &spec(0), &cfg, &pool).unwrap();
    let (p1, mut rx1, _tx1) = Port::open_started(1, &spec(1), &cfg, &pool).unwrap();
    assert!(p0.link().up && p1.link().up, "both ends attached");
    const N: u32 = 5000;
    let (mut sent, mut got) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < N && Instant::now() < deadline {
        if sent < N && sent - got < 128 {
            let mut b = Burst::with_capacity(16);
            while b.spare() > 0 && sent + (b.len() as u32) < N {
                let seq = sent + b.len() as u32;
                let mut m = mempool::lcache::alloc(&pool).unwrap();
                m.extend_from_slice(&frame(seq, 60 + (seq % 1400) as usize))
                    .unwrap();
                b.push(m).unwrap();
            }
            sent += tx0.tx_burst(&mut b) as u32;
        }
        let mut b = Burst::with_capacity(32);
        rx1.rx_burst(&mut b);
        for m in b.drain_front(b.len()) {
            let want = frame(got, 60 + (got % 1400) as usize);
            assert_eq!(m.data(), &want[..], "frame {got}");
            got += 1;
        }
    }
    assert_eq!(got, N, "sent {sent}");
    drop((rx1, tx0, _rx0, _tx1));
    drop((p0, p1));
    assert_eq!(pool.in_use(), 0);
}
