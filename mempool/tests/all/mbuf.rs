//! Mbufs: segments, raw bursts, ownership across threads, keys, audit.

use std::sync::Arc;

use mempool::{
    Mbuf, MbufError, MbufPool, MbufPoolConfig, OffloadFlags, PagePolicy, RawMbuf, Registration,
};

fn pool(name: &str, n: u32, cache: u32) -> Arc<MbufPool> {
    MbufPool::new(
        MbufPoolConfig::new(name, n)
            .cache_size(cache)
            .page_policy(PagePolicy::Normal),
    )
    .unwrap()
}

fn bytes_of(m: &Mbuf) -> Vec<u8> {
    m.segments().flatten().copied().collect()
}

#[test]
fn a_chain_frees_every_segment() {
    let p = pool("chain", 64, 0);
    let mut head = p.alloc().unwrap();
    head.extend_from_slice(b"one-").unwrap();
    for part in [&b"two-"[..], b"three-", b"four"] {
        let mut seg = p.alloc().unwrap();
        seg.extend_from_slice(part).unwrap();
        head.chain(seg).unwrap();
    }
    assert_eq!(head.nb_segs(), 4);
    assert_eq!(head.pkt_len(), 18);
    assert_eq!(bytes_of(&head), b"one-two-three-four");
    assert_eq!(head.len(), 4, "data_len is the first segment's");
    assert_eq!(p.in_use(), 4);
    drop(head);
    assert_eq!(p.in_use(), 0);
    assert_eq!(p.available(), 64);
    // Freed segments come back as fresh single-segment mbufs.
    let again: Vec<Mbuf> = (0..64).map(|_| p.alloc().unwrap()).collect();
    assert!(again.iter().all(|m| m.nb_segs() == 1 && m.pkt_len() == 0));
}

#[test]
fn chaining_a_chain_and_editing_both_ends() {
    let p = pool("chain2", 16, 0);
    let mut a = p.alloc().unwrap();
    a.extend_from_slice(b"ab").unwrap();
    let mut b = p.alloc().unwrap();
    b.extend_from_slice(b"cd").unwrap();
    let mut c = p.alloc().unwrap();
    c.extend_from_slice(b"ef").unwrap();
    b.chain(c).unwrap();
    a.chain(b).unwrap();
    assert_eq!((a.nb_segs(), a.pkt_len()), (3, 6));
    a.append(1).unwrap()[0] = b'g'; // goes to the last segment
    a.prepend(1).unwrap()[0] = b'_'; // goes to the first
    assert_eq!(bytes_of(&a), b"_abcdefg");
    a.trim(3).unwrap(); // from the last segment only
    assert_eq!(a.trim(1), Err(MbufError::TooShort { need: 1, have: 0 }));
    a.adj(1).unwrap();
    assert_eq!(bytes_of(&a), b"abcd");
    assert_eq!(a.pkt_len(), 4);
    a.reset();
    assert_eq!((a.nb_segs(), a.pkt_len()), (1, 0));
    assert_eq!(p.in_use(), 1, "reset frees the other segments");
}

#[test]
fn chaining_across_pools_is_refused_and_hands_the_tail_back() {
    let p = pool("a", 8, 0);
    let q = pool("b", 8, 0);
    let mut m = p.alloc().unwrap();
    let mut t = q.alloc().unwrap();
    t.extend_from_slice(b"x").unwrap();
    let err = m.chain(t).unwrap_err();
    assert_eq!(err.error, MbufError::DifferentPools);
    assert_eq!(&err.tail[..], b"x");
    drop(err);
    assert_eq!(q.in_use(), 0);
}

#[test]
fn raw_bursts_are_all_or_nothing_and_free_chains_too() {
    let p = pool("raw", 100, 32);
    let mut cache = p.cache();
    let mut burst = [RawMbuf::default(); 32];
    assert!(p.alloc_bulk(&mut cache, &mut burst));
    let mut big = [RawMbuf::default(); 69];
    assert!(!p.alloc_bulk(&mut cache, &mut big), "only 68 left");
    assert_eq!(p.in_use(), 32);

    // Make burst[0] a two-segment chain holding burst[1].
    // SAFETY: both came from alloc_bulk; ownership moves into the handles and back.
    let (head, tail) = unsafe { (p.from_raw(burst[0]), p.from_raw(burst[1])) };
    let (mut head, mut tail) = (head, tail);
    head.reset();
    tail.reset();
    head.chain(tail).unwrap();
    assert_eq!(head.into_raw(), burst[0]);
    // SAFETY: we own burst[0] (with burst[1] chained to it) and burst[2..]; each freed once.
    unsafe {
        p.free_bulk(&mut cache, &burst[..1]);
        p.free_bulk(&mut cache, &burst[2..]);
    }
    assert_eq!(p.in_use(), 0);
    drop(cache);
    assert_eq!(p.available(), 100);
}

#[test]
fn alloc_mbufs_fills_every_slot_or_none() {
    let p = pool("burst", 150, 16);
    let mut cache = p.cache();
    let mut out: Vec<Option<Mbuf>> = (0..100).map(|_| None).collect();
    assert!(p.alloc_mbufs(&mut cache, &mut out));
    assert!(out.iter().all(|m| m
        .as_ref()
        .is_some_and(|m| m.headroom() == 128 && m.is_empty())));
    let mut more: Vec<Option<Mbuf>> = (0..51).map(|_| None).collect();
    assert!(!p.alloc_mbufs(&mut cache, &mut more));
    assert!(
        more.iter().all(Option::is_none),
        "a failed burst leaves nothing behind"
    );
    assert_eq!(p.in_use(), 100);
    p.free_mbufs(&mut cache, out.into_iter().flatten());
    assert_eq!(p.in_use(), 0);
}

#[test]
fn mbufs_move_between_threads_and_free_there() {
    let p = pool("threads", 512, 64);
    let (tx, rx) = std::sync::mpsc::channel::<Mbuf>();
    let producer = {
        let p = Arc::clone(&p);
        std::thread::spawn(move || {
            let mut cache = p.cache();
            for i in 0..10_000u32 {
                let mut m = loop {
                    if let Some(m) = cache.alloc() {
                        break m;
                    }
                    std::thread::yield_now();
                };
                m.extend_from_slice(&i.to_le_bytes()).unwrap();
                m.set_rss_hash(i);
                tx.send(m).unwrap();
            }
        })
    };
    let consumer = {
        let p = Arc::clone(&p);
        std::thread::spawn(move || {
            let mut cache = p.cache();
            let mut expect = 0u32;
            for m in rx {
                assert_eq!(m[..], expect.to_le_bytes());
                assert_eq!(m.rss_hash(), expect);
                assert!(m.ol_flags().contains(OffloadFlags::RX_RSS_HASH));
                expect += 1;
                if expect & 1 == 0 {
                    m.free_to(&mut cache);
                } else {
                    drop(m);
                }
            }
            expect
        })
    };
    producer.join().unwrap();
    assert_eq!(consumer.join().unwrap(), 10_000);
    assert_eq!(p.in_use(), 0);
    assert_eq!(p.available(), 512);
}

#[test]
fn shared_mbufs_free_once_across_threads() {
    let p = pool("shared", 8, 0);
    let mut m = p.alloc().unwrap();
    m.extend_from_slice(b"broadcast").unwrap();
    let s = m.into_shared();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                assert_eq!(&s[..], b"broadcast");
                drop(s);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(s.refcnt(), 1);
    assert_eq!(p.in_use(), 1);
    drop(s);
    assert_eq!(p.in_use(), 0);
}

#[test]
fn buffer_keys_come_from_the_registration_hook() {
    let p = MbufPool::new(
        MbufPoolConfig::new("lkeys", 1000)
            .page_policy(PagePolicy::Normal)
            .max_chunk_bytes(128 * 2304)
            .on_chunk(|c| Ok(Registration::new(mempool::Lkey(0xabc0 + c.index as u32)))),
    )
    .unwrap();
    assert_eq!(p.obj_size(), 2304);
    assert_eq!(p.chunks().len(), 8);
    assert!(p.chunks().iter().all(|c| c.len <= 128 * 2304));
    let mut cache = p.cache();
    let mut burst = [RawMbuf::default(); 64];
    for _ in 0..10 {
        assert!(p.alloc_bulk(&mut cache, &mut burst));
        for &r in &burst {
            let key = Some(mempool::Lkey(0xabc0 + r.index() / 128));
            assert_eq!(p.chunk_key(r), key);
            assert_eq!(p.key_for_addr(p.rx_data_addr(r)), key);
            assert_eq!(
                p.key_for_addr(p.rx_data_addr(r) + usize::from(p.data_room()) - 1),
                key
            );
        }
        // SAFETY: the burst came from alloc_bulk above and is not used afterwards.
        unsafe { p.free_bulk(&mut cache, &burst) };
    }
    let m = cache.alloc().unwrap();
    assert_eq!(m.chunk_key(), p.chunk_key(m.raw()));
}

#[test]
fn dropping_the_pool_with_mbufs_out_keeps_them_valid() {
    let p = pool("leak", 8, 0);
    let mut m = p.alloc().unwrap();
    m.extend_from_slice(b"still here").unwrap();
    drop(p);
    assert_eq!(&m[..], b"still here");
    m.extend_from_slice(b"!").unwrap();
    drop(m); // returns to the leaked pool: no crash, no use of freed memory
}

#[test]
fn dropping_an_idle_pool_releases_it() {
    let p = pool("idle", 8, 4);
    let weak = Arc::downgrade(&p);
    let mut cache = p.cache();
    let m = cache.alloc().unwrap();
    m.free_to(&mut cache);
    drop(cache);
    drop(p);
    assert!(weak.upgrade().is_none());
}

#[test]
#[should_panic(expected = "mbuf cache of pool 'one' used with pool 'two'")]
fn a_cache_of_another_pool_is_refused() {
    let one = pool("one", 8, 4);
    let two = pool("two", 8, 4);
    let mut cache = one.cache();
    let mut burst = [RawMbuf::default(); 2];
    two.alloc_bulk(&mut cache, &mut burst);
}

#[test]
fn layout_errors_carry_the_numbers() {
    let err = MbufPool::new(
        MbufPoolConfig::new("big", 8)
            .headroom(1024)
            .data_room(65_000),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "mbuf pool 'big': headroom 1024 + data room 65000 bytes exceed the 65535-byte mbuf \
         buffer limit"
    );
}

#[cfg(any(debug_assertions, feature = "audit"))]
#[test]
#[should_panic(expected = "mempool 'audit': double free of mbuf index 5")]
fn audit_catches_a_double_free_of_a_raw_mbuf() {
    let p = pool("audit", 8, 0);
    let mut cache = p.cache();
    let mut burst = [RawMbuf::default(); 8];
    assert!(p.alloc_bulk(&mut cache, &mut burst));
    let five = *burst.iter().find(|r| r.index() == 5).unwrap();
    // SAFETY: deliberately wrong: the audit must catch the second free before any harm.
    unsafe {
        p.free_bulk(&mut cache, &[five]);
        p.free_bulk(&mut cache, &[five]);
    }
}

#[cfg(any(debug_assertions, feature = "audit"))]
#[test]
#[should_panic(expected = "mempool 'uaf': use after free of mbuf index 2 (from_raw")]
fn audit_catches_a_use_after_free_of_a_raw_mbuf() {
    let p = pool("uaf", 8, 0);
    let mut cache = p.cache();
    let mut burst = [RawMbuf::default(); 8];
    assert!(p.alloc_bulk(&mut cache, &mut burst));
    let two = *burst.iter().find(|r| r.index() == 2).unwrap();
    // SAFETY: deliberately wrong: the audit must catch the use of a freed mbuf.
    unsafe {
        p.free_bulk(&mut cache, &burst);
        let _m = p.from_raw(two);
    }
}
