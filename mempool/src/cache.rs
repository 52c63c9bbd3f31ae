//! Per-core object caches in front of the shared ring (DPDK's `rte_mempool_cache`).
//!
//! A [`PoolCache`] belongs to one thread at a time (`Send`, not `Sync`): its fast path is a plain
//! array copy with no atomic read-modify-write, no lock and no allocation.
//!
//! - `get_bulk(n)`: served from the top of the cache when it holds `n`; otherwise refilled from
//!   the ring with enough objects to serve `n` and leave `size` behind (rounded up to whole
//!   packs of 16, so up to 15 more), and if the cache and the ring together cannot supply `n`,
//!   nothing is taken (all-or-nothing). A request larger than the cache goes to the ring
//!   directly.
//! - `put_bulk(n)`: appended to the cache while it stays at or below the flush threshold
//!   (1.5 x size, as in DPDK); above it, the excess over `size` is flushed to the ring in whole
//!   packs. Never fails.
//! - The published length: after each operation the cache stores its length in a slot the pool
//!   can read (a plain store, not a read-modify-write), so [`Mempool::available`] counts what
//!   sits in caches.
//! - Dropping the cache flushes everything it holds back to the ring.
#![deny(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::pool::Mempool;
use crate::ring::PACK;
use crate::shm::CacheStore;

/// Indices a cache of `size` objects may hold at once: a refill leaves up to
/// `size + n + PACK - 1` objects (n <= size) before serving, since the ring hands out whole
/// packs; a put keeps at most the threshold.
pub(crate) fn slot_capacity(size: usize) -> usize {
    if size == 0 {
        0
    } else {
        2 * size + PACK
    }
}

/// A per-thread cache of free objects for one [`Mempool`].
pub struct PoolCache {
    len: usize,
    flush_threshold: usize,
    size: usize,
    /// The objects held and the published length: on the heap, or in a shared pool's file
    /// (where a survivor can take them back if this process dies).
    objs: CacheStore,
    pool: Arc<Mempool>,
    /// `Send` but not `Sync`: one thread owns the cache.
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for PoolCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCache")
            .field("pool", &self.pool.name())
            .field("len", &self.len)
            .field("size", &self.size)
            .field("flush_threshold", &self.flush_threshold)
            .finish()
    }
}

impl PoolCache {
    /// A cache of the pool's configured size.
    pub fn new(pool: &Arc<Mempool>) -> PoolCache {
        PoolCache::with_size(pool, pool.cache_size())
    }

    /// A cache of `size` objects (0: every call goes straight to the ring).
    ///
    /// For a shared pool the cache takes one of the pool's [`CACHE_SLOTS`](crate::CACHE_SLOTS)
    /// slots in its file. When every slot is taken, the cache gets size 0 (every call goes to
    /// the ring: correct, slower) and a warning says so.
    ///
    /// # Panics
    /// When `size` is larger than the pool's configured cache size, which was checked against
    /// the pool's capacity when the pool was created.
    pub fn with_size(pool: &Arc<Mempool>, size: u32) -> PoolCache {
        assert!(
            size <= pool.cache_size(),
            "pool '{}': cache of {size} objects requested, the pool allows at most {}",
            pool.name(),
            pool.cache_size()
        );
        let mut size = size as usize;
        let objs = match pool.cache_store(slot_capacity(size)) {
            Some(store) => store,
            None => {
                tracing::warn!(
                    target: "mempool",
                    pool = %pool.name(),
                    "shared pool '{}': all {} cache slots are taken; this cache has size 0 \
                     (every get and put goes to the shared ring)",
                    pool.name(),
                    crate::CACHE_SLOTS
                );
                size = 0;
                pool.cache_store(0)
                    .unwrap_or_else(|| CacheStore::heap(0, std::sync::Arc::default()))
            }
        };
        PoolCache {
            len: 0,
            flush_threshold: size + size / 2,
            size,
            objs,
            pool: Arc::clone(pool),
            _not_sync: PhantomData,
        }
    }

    /// The pool this cache serves.
    pub fn pool(&self) -> &Arc<Mempool> {
        &self.pool
    }

    /// Objects currently held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the cache holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Configured size (0: no caching).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Fills `out` with free objects and returns `true`, or takes nothing and returns `false`
    /// when the cache and the ring together cannot supply `out.len()`.
    #[inline]
    pub fn get_bulk(&mut self, out: &mut [u32]) -> bool {
        let n = out.len();
        if n <= self.len {
            let start = self.len - n;
            copy_objs(out, &self.objs[start..self.len]);
            self.set_len(start);
            self.pool.audit_get(out);
            return true;
        }
        self.get_bulk_slow(out)
    }

    /// Returns objects to the pool (cache first). Never fails.
    ///
    /// # Panics
    /// In audit builds, on a double free or a foreign index (see [`Mempool::put_bulk`]).
    #[inline]
    pub fn put_bulk(&mut self, objs: &[u32]) {
        self.pool.audit_put(objs);
        let end = self.len + objs.len();
        if end <= self.flush_threshold {
            copy_objs(&mut self.objs[self.len..end], objs);
            self.set_len(end);
            return;
        }
        self.put_bulk_slow(objs);
    }

    /// Takes one object.
    #[inline]
    pub fn get(&mut self) -> Option<u32> {
        let mut one = [0u32];
        self.get_bulk(&mut one).then_some(one[0])
    }

    /// Returns one object.
    #[inline]
    pub fn put(&mut self, idx: u32) {
        self.put_bulk(&[idx]);
    }

    /// Returns everything the cache holds to the ring.
    pub fn flush(&mut self) {
        // The shorter length is published before the objects go: a process killed in
        // between leaks them (a survivor's reclaim does not see them) rather than have them
        // returned twice.
        let n = self.len;
        self.set_len(0);
        self.pool.ring_put(&self.objs[..n]);
    }

    #[inline]
    fn set_len(&mut self, len: usize) {
        self.len = len;
        // A plain store (no read-modify-write): the accounting methods read it.
        self.objs.publish_len(len);
    }

    #[cold]
    #[inline(never)]
    fn get_bulk_slow(&mut self, out: &mut [u32]) -> bool {
        let n = out.len();
        if n > self.size {
            // Larger than the cache (or no cache): straight from the ring.
            if !self.pool.ring_get(out) {
                return false;
            }
            self.pool.audit_get(out);
            return true;
        }
        // Refill so that after serving `n` the cache holds `size`.
        let want = self.size + n - self.len;
        let start = self.len;
        // The room after `start` is at least `want + PACK`, so whole packs always fit.
        let got = self.pool.ring_get_upto(&mut self.objs[start..], want);
        if start + got < n {
            // Not enough free objects anywhere we can reach: give back what we took.
            self.pool.ring_put(&self.objs[start..start + got]);
            return false;
        }
        let top = start + got - n;
        copy_objs(out, &self.objs[top..top + n]);
        self.set_len(top);
        self.pool.audit_get(out);
        true
    }

    #[cold]
    #[inline(never)]
    fn put_bulk_slow(&mut self, objs: &[u32]) {
        let n = objs.len();
        if n > self.size {
            self.pool.ring_put(objs);
            return;
        }
        // Flush the excess over `size - n` (in whole packs when there is at least one), then
        // append: the cache ends up with `size` to `size + PACK - 1` objects.
        let excess = self.len - (self.size - n);
        let flush = if excess >= PACK {
            excess - excess % PACK
        } else {
            excess
        };
        let (keep, had) = (self.len - flush, self.len);
        // Shorter first, as in `flush`.
        self.set_len(keep);
        self.pool.ring_put(&self.objs[keep..had]);
        copy_objs(&mut self.objs[keep..keep + n], objs);
        self.set_len(keep + n);
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        self.flush();
        self.pool.release_store(&self.objs);
    }
}

/// Copies object indices. Bursts are short and their length is only known at run time, where
/// a `memcpy` call costs more than the copy itself: small lengths are done with two overlapping
/// fixed-size moves, longer ones 8 indices (one 32-byte vector) at a time.
#[inline(always)]
fn copy_objs(dst: &mut [u32], src: &[u32]) {
    let n = src.len();
    assert_eq!(dst.len(), n);
    match n {
        0 => {}
        1 => dst[0] = src[0],
        2..=3 => {
            dst[..2].copy_from_slice(&src[..2]);
            dst[n - 2..].copy_from_slice(&src[n - 2..]);
        }
        4..=8 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..].copy_from_slice(&src[n - 4..]);
        }
        _ => {
            let (mut d, mut s) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
            for (d8, s8) in (&mut d).zip(&mut s) {
                d8.copy_from_slice(s8);
            }
            if !s.remainder().is_empty() {
                dst[n - 8..].copy_from_slice(&src[n - 8..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PagePolicy, PoolConfig};

    fn pool(n: u32, cache: u32) -> Arc<Mempool> {
        Mempool::new(
            PoolConfig::new("c", n, 64)
                .cache_size(cache)
                .page_policy(PagePolicy::Normal),
        )
        .unwrap()
    }

    #[test]
    fn copy_objs_copies_every_length() {
        for n in 0..=70usize {
            let src: Vec<u32> = (0..n as u32).map(|i| i * 7 + 1).collect();
            let mut dst = vec![0u32; n];
            copy_objs(&mut dst, &src);
            assert_eq!(dst, src, "length {n}");
        }
    }

    #[test]
    fn refill_leaves_at_least_size_objects_after_serving() {
        let p = pool(1000, 16);
        let mut c = PoolCache::new(&p);
        let mut out = [0u32; 4];
        assert!(c.get_bulk(&mut out));
        // 20 wanted, taken as two whole packs of 16: 28 left after serving 4.
        assert!((16..16 + PACK).contains(&c.len()), "{}", c.len());
        assert_eq!(p.ring_count() as usize, 1000 - 4 - c.len());
        assert_eq!(p.available(), 996);
        // 28 + 4 is above the threshold (24): one whole pack goes back to the ring.
        c.put_bulk(&out);
        assert_eq!(c.len(), 16);
        assert_eq!(p.ring_count(), 1000 - 16);
    }

    #[test]
    fn put_flushes_above_one_and_a_half_size() {
        let p = pool(1000, 16);
        let mut c = PoolCache::new(&p);
        let mut held = vec![0u32; 30];
        assert!(p.get_bulk(&mut held));
        c.put_bulk(&held[..24]); // exactly the threshold: stays
        assert_eq!(c.len(), 24);
        c.put_bulk(&held[24..26]); // over: flush down so that len == size after the append
        assert_eq!(c.len(), 16);
        assert_eq!(p.in_use(), 4);
    }

    #[test]
    fn bulk_larger_than_cache_goes_to_the_ring() {
        let p = pool(100, 8);
        let mut c = PoolCache::new(&p);
        let mut big = [0u32; 20];
        assert!(c.get_bulk(&mut big));
        assert_eq!(c.len(), 0);
        c.put_bulk(&big);
        assert_eq!(c.len(), 0);
        assert_eq!(p.ring_count(), 100);
    }

    #[test]
    fn failed_refill_takes_nothing() {
        let p = pool(30, 16);
        let mut c = PoolCache::new(&p);
        let mut a = [0u32; 16];
        assert!(c.get_bulk(&mut a)); // cache refilled with 32 -> only 30: serves 16, keeps 14
        assert_eq!(c.len(), 14);
        let mut b = [0u32; 15];
        assert!(!c.get_bulk(&mut b), "14 in cache, 0 in ring");
        assert_eq!(c.len(), 14);
        assert_eq!(p.available(), 14);
        c.put_bulk(&a);
        drop(c);
        assert_eq!(p.ring_count(), 30);
        assert_eq!(p.cached(), 0);
    }
}
