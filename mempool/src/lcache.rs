//! Per-core mbuf caches, found by the polling thread (DPDK's per-lcore `rte_mempool_cache`).
//!
//! A port's queue does not own a cache: a core that receives on one port and sends on another must
//! free into the same cache it allocates from, or every buffer would travel through the
//! pool's shared ring (measured: two thirds of the time of null-port forwarding). So each
//! thread keeps one cache per pool it uses, created on first use and flushed back to the pool
//! when the thread ends (or on [`flush`]).
#![deny(unsafe_code)]

use crate::{Mbuf, MbufCache, MbufPool, Mempool, PoolCache};
use std::cell::RefCell;
use std::sync::Arc;

/// Caches by the address of their `MbufPool`.
type Caches = RefCell<Vec<(*const MbufPool, MbufCache)>>;

thread_local! {
    /// The caches `with_cache` lends, one per pool.
    static CACHES: Caches = const { RefCell::new(Vec::new()) };
    /// The caches nested `with_cache` calls get while `CACHES` is lent, one per pool, made on
    /// the first nested call.
    static SPARES: Caches = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's cache for `pool`. Creating a thread's first cache for a pool
/// allocates once; every later call is a thread-local lookup in a list of one or two entries.
///
/// Re-entrant: an `f` that calls `with_cache` again (an application that wraps its polling
/// loop in it, around bursts that use it themselves) gets the thread's spare cache for the
/// pool, made once (it holds up to a cache's worth of the pool's objects from then on, as
/// the first does); a third level of nesting gets a fresh cache each time.
#[inline]
pub fn with_cache<R>(pool: &Arc<MbufPool>, f: impl FnOnce(&mut MbufCache) -> R) -> R {
    CACHES.with(|c| {
        if let Ok(mut caches) = c.try_borrow_mut() {
            let i = slot(&mut caches, pool);
            return f(&mut caches[i].1);
        }
        nested(pool, f)
    })
}

/// The index of `pool`'s cache in `caches`, made if it has none.
#[inline]
fn slot(caches: &mut Vec<(*const MbufPool, MbufCache)>, pool: &Arc<MbufPool>) -> usize {
    let key = Arc::as_ptr(pool);
    match caches.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            caches.push((key, pool.cache()));
            caches.len() - 1
        }
    }
}

/// A nested `with_cache`: the thread's spare cache for `pool`, or (nested deeper) a fresh one.
#[cold]
fn nested<R>(pool: &Arc<MbufPool>, f: impl FnOnce(&mut MbufCache) -> R) -> R {
    SPARES.with(|c| {
        if let Ok(mut spares) = c.try_borrow_mut() {
            let i = slot(&mut spares, pool);
            return f(&mut spares[i].1);
        }
        f(&mut pool.cache())
    })
}

/// Runs `f` with this thread's cache of the pool at `key`, if the thread has one that is not
/// lent out (the main one, else the spare), else with `None`. What dropping an [`Mbuf`]
/// uses: never makes a cache, never waits; `None` also once the thread's storage is gone (a
/// drop in another thread-local's destructor).
pub(crate) fn with_existing<R>(
    key: *const Mempool,
    f: impl FnOnce(Option<&mut PoolCache>) -> R,
) -> R {
    let mut f = Some(f);
    for caches in [&CACHES, &SPARES] {
        let r = caches.try_with(|c| {
            let mut caches = c.try_borrow_mut().ok()?;
            let (_, cache) = caches
                .iter_mut()
                .find(|(_, c)| std::ptr::eq(Arc::as_ptr(c.inner.pool()), key))?;
            let f = f.take().expect("called once");
            Some(f(Some(&mut cache.inner)))
        });
        if let Ok(Some(r)) = r {
            return r;
        }
    }
    (f.take().expect("not called yet"))(None)
}

/// Allocates one reset mbuf through this thread's cache (what an application should use on
/// a polling core, so buffers the queues free on this core are reused at once).
#[inline]
pub fn alloc(pool: &Arc<MbufPool>) -> Option<Mbuf> {
    with_cache(pool, |c| c.alloc())
}

/// Frees an mbuf through this thread's cache (dropping it does the same once the thread has
/// a cache for its pool).
#[inline]
pub fn free(pool: &Arc<MbufPool>, m: Mbuf) {
    with_cache(pool, |c| m.free_to(c));
}

/// Returns everything this thread's caches hold to their pools and forgets the caches (so the
/// pools can be dropped). Call it when a polling loop ends on a thread that lives on. Inside
/// `with_cache`, the cache it lends (and those of outer calls) stay; the rest go.
pub fn flush() {
    for caches in [&CACHES, &SPARES] {
        // Taken out first: dropping a cache flushes it, which must not run under the borrow.
        let taken = caches.with(|c| c.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)));
        drop(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MbufPoolConfig;

    #[test]
    fn one_cache_per_pool_per_thread_and_flush_returns_everything() {
        let a = MbufPool::new(MbufPoolConfig::new("lc-a", 256)).unwrap();
        let b = MbufPool::new(MbufPoolConfig::new("lc-b", 256)).unwrap();
        let m = with_cache(&a, |c| c.alloc()).unwrap();
        with_cache(&a, |c| m.free_to(c));
        let n = with_cache(&b, |c| c.alloc()).unwrap();
        drop(n);
        // The freed mbuf sits in this thread's cache of `a`, still counted as available.
        assert_eq!(a.in_use(), 0);
        flush();
        assert_eq!(a.cached(), 0);
        std::thread::spawn({
            let a = Arc::clone(&a);
            move || {
                let m = with_cache(&a, |c| c.alloc()).unwrap();
                with_cache(&a, |c| m.free_to(c));
            }
        })
        .join()
        .unwrap();
        assert_eq!(a.cached(), 0, "a thread's caches flush when it ends");
        assert_eq!(a.in_use(), 0);
    }

    #[test]
    fn a_dropped_mbuf_goes_to_this_thread_s_cache_once_it_has_one() {
        let p = MbufPool::new(MbufPoolConfig::new("lc-drop", 256)).unwrap();
        // No cache on this thread yet: to the ring.
        drop(p.alloc().unwrap());
        assert_eq!((p.in_use(), p.cached()), (0, 0));
        // With one (made by any with_cache, as a driver's burst makes it): to the cache.
        let ms: Vec<Mbuf> = (0..10).map(|_| alloc(&p).unwrap()).collect();
        let cached = p.cached();
        drop(ms);
        assert_eq!(p.in_use(), 0);
        assert_eq!(
            p.cached(),
            cached + 10,
            "dropped into the cache, not the ring"
        );
        // Another thread without a cache of its own: to the ring.
        let m = alloc(&p).unwrap();
        let before = p.cached();
        std::thread::spawn(move || drop(m)).join().unwrap();
        assert_eq!((p.in_use(), p.cached()), (0, before));
        flush();
        assert_eq!(p.cached(), 0);
    }

    #[test]
    fn with_cache_is_re_entrant() {
        let p = MbufPool::new(MbufPoolConfig::new("lc-nest", 4096)).unwrap();
        let q = MbufPool::new(MbufPoolConfig::new("lc-nest-other", 4096)).unwrap();
        // An application's loop wrapped in with_cache, around calls that use it too (a
        // driver's burst): no panic, every buffer accounted for.
        let held = with_cache(&p, |outer| {
            let a = outer.alloc().unwrap();
            let (b, c) = with_cache(&p, |inner| {
                let b = inner.alloc().unwrap();
                // A third level makes a cache of its own for the call.
                let c = with_cache(&p, |third| third.alloc().unwrap());
                (b, c)
            });
            // Dropped while the main cache is lent: through the spare.
            drop(b);
            let d = with_cache(&q, |other| other.alloc().unwrap());
            drop(c);
            (a, d)
        });
        assert_eq!((p.in_use(), q.in_use()), (1, 1));
        drop(held);
        assert_eq!((p.in_use(), q.in_use()), (0, 0));
        // flush inside with_cache forgets the caches it can (not the lent one).
        with_cache(&p, |c| {
            let m = c.alloc().unwrap();
            flush();
            m.free_to(c);
        });
        assert_eq!(p.in_use(), 0);
        flush();
        assert_eq!((p.cached(), q.cached()), (0, 0));
    }
}
