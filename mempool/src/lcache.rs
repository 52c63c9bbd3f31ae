//! Per-core mbuf caches, found by the polling thread (DPDK's per-lcore `rte_mempool_cache`).
//!
//! A port's queue does not own a cache: a core that receives on one port and sends on another must
//! free into the same cache it allocates from, or every buffer would travel through the
//! pool's shared ring (measured: two thirds of the time of null-port forwarding). So each
//! thread keeps one cache per pool it uses, created on first use and flushed back to the pool
//! when the thread ends (or on [`flush`]).
#![deny(unsafe_code)]

use crate::{Mbuf, MbufCache, MbufPool};
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    static CACHES: RefCell<Vec<(usize, MbufCache)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's cache for `pool`. Creating a thread's first cache for a pool
/// allocates once; every later call is a thread-local lookup in a list of one or two entries.
///
/// # Panics
/// If `f` calls `with_cache` again (the cache is borrowed for the duration of `f`).
#[inline]
pub fn with_cache<R>(pool: &Arc<MbufPool>, f: impl FnOnce(&mut MbufCache) -> R) -> R {
    let key = Arc::as_ptr(pool) as usize;
    CACHES.with(|c| {
        let mut caches = c.borrow_mut();
        let i = match caches.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                caches.push((key, pool.cache()));
                caches.len() - 1
            }
        };
        f(&mut caches[i].1)
    })
}

/// Allocates one reset mbuf through this thread's cache (what an application should use on
/// a polling core, so buffers the queues free on this core are reused at once).
#[inline]
pub fn alloc(pool: &Arc<MbufPool>) -> Option<Mbuf> {
    with_cache(pool, |c| c.alloc())
}

/// Frees an mbuf through this thread's cache.
#[inline]
pub fn free(pool: &Arc<MbufPool>, m: Mbuf) {
    with_cache(pool, |c| m.free_to(c));
}

/// Returns everything this thread's caches hold to their pools and forgets the caches (so the
/// pools can be dropped). Call it when a polling loop ends on a thread that lives on.
pub fn flush() {
    CACHES.with(|c| c.borrow_mut().clear());
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
}
