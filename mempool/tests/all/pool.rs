//! The object pool: bulk semantics, caches, accounting, threads, chunks and keys.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use mempool::{
    ChunkInfo, Error, Mempool, PagePolicy, PageSize, PoolCache, PoolConfig, Registration,
    AUDIT_ENABLED,
};
use proptest::prelude::*;

fn pool(n: u32, obj_size: usize, cache: u32) -> Arc<Mempool> {
    Mempool::new(
        PoolConfig::new("test", n, obj_size)
            .cache_size(cache)
            .page_policy(PagePolicy::Normal),
    )
    .unwrap()
}

fn all_free(p: &Mempool) {
    assert_eq!(p.in_use(), 0);
    assert_eq!(p.available(), p.capacity());
    assert_eq!(p.ring_count(), p.capacity(), "everything back in the ring");
    assert_eq!(p.cached(), 0);
}

#[test]
fn cached_bulk_get_is_all_or_nothing() {
    let p = pool(100, 64, 32);
    let mut c = PoolCache::new(&p);
    let mut a = vec![0u32; 90];
    assert!(
        c.get_bulk(&mut a),
        "larger than the cache: straight from the ring"
    );
    let mut b = [u32::MAX; 11];
    assert!(!c.get_bulk(&mut b), "only 10 left");
    assert_eq!(b, [u32::MAX; 11], "a failed get writes nothing");
    assert_eq!(p.in_use(), 90);
    let mut b = [0u32; 10];
    assert!(c.get_bulk(&mut b));
    assert_eq!(p.in_use(), 100);
    c.put_bulk(&a);
    c.put_bulk(&b);
    drop(c);
    all_free(&p);
}

#[test]
fn uncached_bulk_get_is_all_or_nothing() {
    let p = pool(50, 64, 0);
    let mut a = [0u32; 33];
    assert!(p.get_bulk(&mut a));
    let mut b = [0u32; 18];
    assert!(!p.get_bulk(&mut b));
    assert_eq!(p.available(), 17);
    p.put_bulk(&a);
    all_free(&p);
}

#[test]
fn empty_pool_answers_none_without_blocking() {
    let p = pool(40, 64, 8);
    let mut c = PoolCache::new(&p);
    let mut held = Vec::new();
    while let Some(i) = c.get() {
        held.push(i);
    }
    assert_eq!(held.len(), 40);
    assert_eq!(p.available(), 0);
    assert_eq!(c.get(), None);
    assert!(!c.get_bulk(&mut [0u32; 4]));
    assert!(p.get().is_none());
    assert!(!p.get_bulk(&mut [0u32; 1]));
    let unique: HashSet<_> = held.iter().copied().collect();
    assert_eq!(unique.len(), 40, "every object handed out once");
    for i in held {
        c.put(i);
    }
    drop(c);
    all_free(&p);
}

#[test]
fn zero_cache_size_works_on_the_ring() {
    let p = pool(64, 64, 0);
    let mut c = PoolCache::new(&p);
    assert_eq!(c.size(), 0);
    let mut a = [0u32; 5];
    assert!(c.get_bulk(&mut a));
    assert_eq!(c.len(), 0);
    assert_eq!(p.ring_count(), 59);
    c.put_bulk(&a);
    assert_eq!(c.len(), 0);
    all_free(&p);
}

#[test]
fn dropping_a_cache_flushes_it() {
    let p = pool(1000, 64, 256);
    let mut c = PoolCache::new(&p);
    let mut a = [0u32; 8];
    assert!(c.get_bulk(&mut a));
    c.put_bulk(&a);
    assert!(c.len() >= 256);
    assert_eq!(p.cached() as usize, c.len());
    assert_eq!(p.available(), 1000, "cached objects count as available");
    drop(c);
    all_free(&p);
}

#[test]
fn cache_on_another_thread_flushes_when_the_thread_ends() {
    let p = pool(1000, 64, 64);
    let p2 = Arc::clone(&p);
    std::thread::spawn(move || {
        let mut c = PoolCache::new(&p2);
        let mut a = [0u32; 16];
        assert!(c.get_bulk(&mut a));
        c.put_bulk(&a);
    })
    .join()
    .unwrap();
    all_free(&p);
}

#[test]
fn threads_with_their_own_caches_return_every_object() {
    const THREADS: usize = 4;
    let p = pool(4096, 64, 128);
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let p = Arc::clone(&p);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut c = PoolCache::new(&p);
                let mut held: Vec<u32> = Vec::new();
                let mut buf = [0u32; 200];
                let mut rng = 0x9e37_79b9_u32.wrapping_mul(t as u32 + 1);
                let mut failed = 0u32;
                barrier.wait();
                for _ in 0..20_000 {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    let n = (rng % 200) as usize + 1;
                    if rng & 0x100 != 0 && held.len() < 900 {
                        if c.get_bulk(&mut buf[..n]) {
                            held.extend_from_slice(&buf[..n]);
                        } else {
                            failed += 1;
                        }
                    } else {
                        let n = n.min(held.len());
                        let at = held.len() - n;
                        c.put_bulk(&held[at..]);
                        held.truncate(at);
                    }
                }
                let unique: HashSet<_> = held.iter().collect();
                assert_eq!(unique.len(), held.len(), "an object was handed out twice");
                c.put_bulk(&held);
                failed
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    all_free(&p);
    // And the objects are still exactly 0..capacity.
    let mut everything = vec![0u32; 4096];
    assert!(p.get_bulk(&mut everything));
    everything.sort_unstable();
    assert_eq!(everything, (0..4096).collect::<Vec<_>>());
    p.put_bulk(&everything);
}

#[test]
fn threads_racing_on_the_ring_near_exhaustion_lose_nothing() {
    // No caches, and bulks large enough that gets often fail half-way and roll back.
    const THREADS: usize = 3;
    let p = pool(300, 64, 0);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut buf = [0u32; 120];
                let mut rng = 0x2545_f491_u32.wrapping_mul(t as u32 + 7);
                let (mut ok, mut failed) = (0u32, 0u32);
                for _ in 0..20_000 {
                    rng ^= rng << 13;
                    rng ^= rng >> 17;
                    rng ^= rng << 5;
                    let n = (rng % 120) as usize + 1;
                    if p.get_bulk(&mut buf[..n]) {
                        ok += 1;
                        let unique: HashSet<_> = buf[..n].iter().collect();
                        assert_eq!(unique.len(), n);
                        p.put_bulk(&buf[..n]);
                    } else {
                        failed += 1;
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    for h in handles {
        let (ok, _failed) = h.join().unwrap();
        assert!(ok > 0);
    }
    all_free(&p);
    let mut everything = vec![0u32; 300];
    assert!(p.get_bulk(&mut everything));
    everything.sort_unstable();
    assert_eq!(everything, (0..300).collect::<Vec<_>>());
    p.put_bulk(&everything);
}

#[test]
fn chunks_are_capped_and_keys_found_by_index_and_address() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<ChunkInfo>::new()));
    let seen2 = Arc::clone(&seen);
    let p = Mempool::new(
        PoolConfig::new("keys", 1000, 2000) // 2048-byte objects after alignment
            .max_chunk_bytes(300_000) // 146 fit, rounded down to 128 per chunk
            .page_policy(PagePolicy::Normal)
            .on_chunk(move |c| {
                seen2.lock().unwrap().push(*c);
                Ok(Registration::new(mempool::Lkey(0x100 + c.index as u32)))
            }),
    )
    .unwrap();
    let chunks = p.chunks();
    assert_eq!(
        *seen.lock().unwrap(),
        chunks,
        "every chunk announced once, in order"
    );
    assert_eq!(chunks.len(), 8);
    for c in chunks {
        assert!(c.len <= 300_000, "chunk {} is {} bytes", c.index, c.len);
        assert_eq!(c.page_size, PageSize::Normal4K);
    }
    for i in 0..1000u32 {
        let chunk = p.chunk_of(i);
        assert_eq!(chunk, i as usize / 128);
        assert!(chunks[chunk].contains(p.obj_ptr(i) as usize));
        assert_eq!(p.chunk_key(i), Some(mempool::Lkey(0x100 + chunk as u32)));
        let addr = p.obj_ptr(i) as usize + 2047;
        assert_eq!(
            p.key_for_addr(addr),
            Some(mempool::Lkey(0x100 + chunk as u32))
        );
    }
    assert_eq!(p.chunk_key(1000), None);
    assert_eq!(p.key_for_addr(p.region().addr() - 1), None);
    assert_eq!(p.key_for_addr(p.obj_ptr(999) as usize + 2048), None);

    // A second registration (e.g. another device) has its own keys.
    let keys = p
        .register_chunks(|c: &ChunkInfo| {
            Ok(Registration::new(mempool::Lkey(0x9000 + c.index as u32)))
        })
        .unwrap();
    assert_eq!(keys.keys().len(), 8);
    assert_eq!(keys.key_of(130), Some(mempool::Lkey(0x9001)));
    assert_eq!(
        keys.key_for_addr(p.obj_ptr(999) as usize),
        Some(mempool::Lkey(0x9007))
    );
    assert_eq!(keys.key_of(1000), None);
    assert_eq!(
        p.chunk_key(130),
        Some(mempool::Lkey(0x101)),
        "creation-time keys unchanged"
    );
}

#[test]
fn pool_without_hook_has_no_keys() {
    let p = pool(10, 64, 0);
    assert_eq!(p.chunks().len(), 1);
    assert_eq!(p.chunk_key(0), None);
    assert_eq!(p.key_for_addr(p.obj_ptr(0) as usize), None);
}

struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn registration_guards_are_released_with_the_pool() {
    let released = Arc::new(AtomicUsize::new(0));
    let r2 = Arc::clone(&released);
    let p = Mempool::new(
        PoolConfig::new("guards", 100, 1024)
            .max_chunk_bytes(16 * 1024)
            .page_policy(PagePolicy::Normal)
            .on_chunk(move |c| {
                Ok(Registration::with_guard(
                    mempool::Lkey(c.index as u32),
                    Guard(Arc::clone(&r2)),
                ))
            }),
    )
    .unwrap();
    assert_eq!(p.chunks().len(), 7); // 16 objects per chunk
    assert_eq!(released.load(Ordering::SeqCst), 0);
    let keys = p
        .register_chunks(|_: &ChunkInfo| {
            Ok(Registration::with_guard(
                mempool::Lkey(7),
                Guard(Arc::clone(&released)),
            ))
        })
        .unwrap();
    let copy = keys.clone();
    assert_eq!(copy.keys(), keys.keys());
    drop(p);
    assert_eq!(
        released.load(Ordering::SeqCst),
        0,
        "ChunkKeys keeps the pool alive"
    );
    drop(keys);
    assert_eq!(
        released.load(Ordering::SeqCst),
        0,
        "a copy keeps everything registered"
    );
    assert_eq!(copy.key_of(99), Some(mempool::Lkey(7)));
    drop(copy);
    assert_eq!(released.load(Ordering::SeqCst), 14);
}

#[test]
fn failed_registration_undoes_earlier_chunks_and_names_the_chunk() {
    let released = Arc::new(AtomicUsize::new(0));
    let r2 = Arc::clone(&released);
    let err = Mempool::new(
        PoolConfig::new("regfail", 100, 1024)
            .max_chunk_bytes(16 * 1024)
            .page_policy(PagePolicy::Normal)
            .on_chunk(move |c| {
                if c.index == 3 {
                    Err("device refused".into())
                } else {
                    Ok(Registration::with_guard(
                        mempool::Lkey(1),
                        Guard(Arc::clone(&r2)),
                    ))
                }
            }),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Registration { chunk: 3, .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("pool 'regfail': registering chunk 3 (16384 bytes at 0x"),
        "{msg}"
    );
    assert!(msg.contains("device refused"), "{msg}");
    assert_eq!(released.load(Ordering::SeqCst), 3);
}

#[test]
fn memory_error_names_the_pool_and_sizes() {
    // 2^31 objects of 2^20 bytes cannot be described: a size error with the numbers.
    let err = Mempool::new(PoolConfig::new("huge", u32::MAX - 1, 1 << 40)).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("pool 'huge'"), "{err}");
    // 2 PiB: more than the user address space, so mmap fails whatever the overcommit policy,
    // and the error carries the pool's numbers.
    let err =
        Mempool::new(PoolConfig::new("big", 1 << 31, 1 << 20).page_policy(PagePolicy::Normal))
            .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "pool 'big': 2147483648 objects of 1048576 bytes need 2147483648 MiB: mmap of"
        ),
        "{msg}"
    );
}

#[cfg(any(debug_assertions, feature = "audit"))]
#[test]
#[should_panic(expected = "mempool 'test': double free of object index 3")]
fn audit_catches_a_double_free_through_a_cache() {
    let p = pool(10, 64, 4);
    let mut c = PoolCache::new(&p);
    let mut a = [0u32; 10];
    assert!(c.get_bulk(&mut a));
    let three = a.iter().position(|&i| i == 3).unwrap();
    c.put(a[three]);
    c.put(a[three]);
}

#[cfg(any(debug_assertions, feature = "audit"))]
#[test]
#[should_panic(expected = "object index 77 does not belong to this pool")]
fn audit_catches_a_foreign_index() {
    let p = pool(10, 64, 0);
    p.put(77);
}

#[test]
fn audit_flag_matches_the_build() {
    assert_eq!(
        AUDIT_ENABLED,
        cfg!(any(debug_assertions, feature = "audit"))
    );
}

#[derive(Clone, Debug)]
enum Op {
    CacheGet(usize, usize),
    CachePut(usize, usize),
    RingGet(usize),
    RingPut(usize),
    Flush(usize),
    Recreate(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 1..80usize).prop_map(|(c, n)| Op::CacheGet(c, n)),
        (0..3usize, 1..80usize).prop_map(|(c, n)| Op::CachePut(c, n)),
        (1..40usize).prop_map(Op::RingGet),
        (1..40usize).prop_map(Op::RingPut),
        (0..3usize).prop_map(Op::Flush),
        (0..3usize).prop_map(Op::Recreate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// After any sequence of gets, puts, flushes and cache replacements, free + in use ==
    /// capacity, and the objects held are distinct.
    #[test]
    fn free_plus_in_use_is_capacity(cap in 40u32..400, cache in 0u32..24, ops in proptest::collection::vec(op(), 1..120)) {
        let p = pool(cap, 64, cache.min(cap * 2 / 3));
        let mut caches: Vec<PoolCache> = (0..3).map(|_| PoolCache::new(&p)).collect();
        let mut held: Vec<u32> = Vec::new();
        let mut buf = vec![0u32; 80];
        for op in ops {
            match op {
                Op::CacheGet(c, n) => {
                    // A cache serves from what it holds, else refills from the ring (or, for a
                    // bulk larger than the cache, uses the ring alone); never other caches'.
                    let (ring, own) = (p.ring_count() as usize, caches[c].len());
                    let reachable = if n <= own {
                        own
                    } else if n > caches[c].size() {
                        ring
                    } else {
                        ring + own
                    };
                    let ok = caches[c].get_bulk(&mut buf[..n]);
                    prop_assert_eq!(ok, n <= reachable, "get {} with {} reachable", n, reachable);
                    if ok { held.extend_from_slice(&buf[..n]); }
                }
                Op::CachePut(c, n) => {
                    let at = held.len() - n.min(held.len());
                    caches[c].put_bulk(&held[at..]);
                    held.truncate(at);
                }
                Op::RingGet(n) => {
                    let before = p.ring_count() as usize;
                    let ok = p.get_bulk(&mut buf[..n]);
                    prop_assert_eq!(ok, n <= before);
                    if ok { held.extend_from_slice(&buf[..n]); }
                }
                Op::RingPut(n) => {
                    let at = held.len() - n.min(held.len());
                    p.put_bulk(&held[at..]);
                    held.truncate(at);
                }
                Op::Flush(c) => caches[c].flush(),
                Op::Recreate(c) => caches[c] = PoolCache::new(&p),
            }
            prop_assert_eq!(p.available() as usize + held.len(), cap as usize);
            prop_assert_eq!(p.in_use() as usize, held.len());
            let cached: usize = caches.iter().map(PoolCache::len).sum();
            prop_assert_eq!(p.cached() as usize, cached);
            let unique: HashSet<_> = held.iter().collect();
            prop_assert_eq!(unique.len(), held.len());
        }
        p.put_bulk(&held);
        drop(caches);
        prop_assert_eq!(p.ring_count(), cap);
    }
}
