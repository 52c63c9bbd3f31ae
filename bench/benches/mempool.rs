//! Criterion benches for the mempool datapath: cached and uncached bulk get/put, and mbuf
//! alloc + free (one at a time, and in bursts of 32, raw and owned).
//!
//! Run with `cargo bench -p bench --bench mempool`. Times are per iteration; throughput is in
//! objects (or mbufs) per iteration, so criterion also reports elements per second.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mempool::{Mbuf, MbufPool, MbufPoolConfig, Mempool, PoolCache, PoolConfig, RawMbuf};

const OBJECTS: u32 = 8191;

fn pool_bulk(c: &mut Criterion) {
    let pool = Mempool::new(PoolConfig::new("crit", OBJECTS, 2048).cache_size(512))
        .expect("pool of 8191 x 2048 bytes");
    let mut cache = PoolCache::new(&pool);
    let mut objs = [0u32; 32];

    let mut group = c.benchmark_group("mempool_cached_get_put");
    for n in [1usize, 4, 32] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                let got = cache.get_bulk(black_box(&mut objs[..n]));
                assert!(got);
                cache.put_bulk(black_box(&objs[..n]));
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("mempool_ring_get_put");
    for n in [1usize, 4, 32] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                let got = pool.get_bulk(black_box(&mut objs[..n]));
                assert!(got);
                pool.put_bulk(black_box(&objs[..n]));
            })
        });
    }
    group.finish();
}

fn mbuf_alloc_free(c: &mut Criterion) {
    let pool = MbufPool::new(MbufPoolConfig::new("crit-mbuf", OBJECTS).cache_size(512))
        .expect("mbuf pool of 8191");
    let mut cache = pool.cache();

    let mut group = c.benchmark_group("mbuf_alloc_free");
    group.throughput(Throughput::Elements(1));
    group.bench_function("single", |b| {
        b.iter(|| {
            let m = cache.alloc().expect("free mbuf");
            black_box(&m).data_addr();
            m.free_to(&mut cache);
        })
    });

    group.throughput(Throughput::Elements(32));
    let mut raws = [RawMbuf::default(); 32];
    group.bench_function("bulk32_raw", |b| {
        b.iter(|| {
            let got = pool.alloc_bulk(&mut cache, black_box(&mut raws));
            assert!(got);
            // SAFETY: the burst came from alloc_bulk just above and is freed once.
            unsafe { pool.free_bulk(&mut cache, black_box(&raws)) };
        })
    });

    let mut owned: Vec<Option<Mbuf>> = (0..32).map(|_| None).collect();
    group.bench_function("bulk32_owned", |b| {
        b.iter(|| {
            let got = pool.alloc_mbufs(&mut cache, black_box(&mut owned));
            assert!(got);
            pool.free_mbufs(&mut cache, owned.iter_mut().filter_map(Option::take));
        })
    });
    group.finish();
}

criterion_group!(benches, pool_bulk, mbuf_alloc_free);
criterion_main!(benches);
