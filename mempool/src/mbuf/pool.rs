//! [`MbufPool`]: a [`Mempool`] of mbufs with every header written at creation, its
//! configuration ([`MbufPoolConfig`]) and its per-core cache ([`MbufCache`]).
#![allow(unsafe_code)]

use std::fmt;
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::handle::{raw_as_u32, raw_as_u32_mut, Mbuf, RawMbuf};
use super::header::{
    free_chain, MbufHeader, DEFAULT_DATA_ROOM, DEFAULT_HEADROOM, MBUF_HEADER_BYTES, NO_SEG,
};
use crate::cache::PoolCache;
use crate::chunk::{ChunkInfo, ChunkKeys, Registration};
use crate::error::{BoxError, Error};
use crate::pool::{Mempool, PoolConfig};
use crate::region::{PagePolicy, PageSize, RegionOptions};

const LOG: &str = "mempool";

/// How to build an [`MbufPool`].
#[derive(Debug)]
pub struct MbufPoolConfig {
    pool: PoolConfig,
    headroom: u16,
    data_room: u16,
}

impl MbufPoolConfig {
    /// `count` mbufs with 128 bytes of headroom and 2048 bytes of data room (2304-byte
    /// objects), hugepages when available, per-core caches of 512 (or 2/3 of a small pool).
    pub fn new(name: impl Into<String>, count: u32) -> Self {
        MbufPoolConfig {
            pool: PoolConfig::new(name, count, 1),
            headroom: DEFAULT_HEADROOM,
            data_room: DEFAULT_DATA_ROOM,
        }
    }

    /// Headroom in bytes.
    pub fn headroom(mut self, bytes: u16) -> Self {
        self.headroom = bytes;
        self
    }

    /// Data room in bytes.
    pub fn data_room(mut self, bytes: u16) -> Self {
        self.data_room = bytes;
        self
    }

    /// Per-core cache size (see [`PoolConfig::cache_size`]).
    pub fn cache_size(mut self, objects: u32) -> Self {
        self.pool = self.pool.cache_size(objects);
        self
    }

    /// Largest chunk in bytes (see [`PoolConfig::max_chunk_bytes`]).
    pub fn max_chunk_bytes(mut self, bytes: usize) -> Self {
        self.pool = self.pool.max_chunk_bytes(bytes);
        self
    }

    /// Which pages to use.
    pub fn page_policy(mut self, policy: PagePolicy) -> Self {
        self.pool = self.pool.page_policy(policy);
        self
    }

    /// All region options at once.
    pub fn region(mut self, opts: RegionOptions) -> Self {
        self.pool = self.pool.region(opts);
        self
    }

    /// Back the pool with a shared file (see [`PoolConfig::shared_file`]): other processes
    /// attach to it with [`MbufPool::attach`] and allocate and free its mbufs as this one
    /// does.
    pub fn shared_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.pool = self.pool.shared_file(path);
        self
    }

    /// Bytes of memory the pool will map (before rounding up to whole pages), or `None` when
    /// the layout cannot be made (creating the pool then fails and says why): what the
    /// locked-memory limit and the free hugepages must hold.
    pub fn memory_bytes(&self) -> Option<usize> {
        let buf_len = u16::try_from(u32::from(self.headroom) + u32::from(self.data_room)).ok()?;
        let (obj_size, align) = mbuf_object(buf_len);
        self.pool.memory_bytes_with(obj_size, align)
    }

    /// Registration hook (see [`PoolConfig::on_chunk`]).
    pub fn on_chunk(
        mut self,
        hook: impl FnMut(&ChunkInfo) -> Result<Registration, BoxError> + Send + 'static,
    ) -> Self {
        self.pool = self.pool.on_chunk(hook);
        self
    }
}

/// Size and minimum alignment of an mbuf object whose buffer (headroom and data room) is
/// `buf_len` bytes: the header, then the buffer.
fn mbuf_object(buf_len: u16) -> (usize, usize) {
    (
        MBUF_HEADER_BYTES + usize::from(buf_len),
        align_of::<MbufHeader>(),
    )
}

/// A pool of mbufs, shared between threads behind an `Arc`.
pub struct MbufPool {
    mp: Arc<Mempool>,
    /// What the headers' `pool` field holds for this pool (see `header::pool_of`).
    tag: usize,
    headroom: u16,
    data_room: u16,
}

impl fmt::Debug for MbufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MbufPool")
            .field("mempool", &self.mp)
            .field("headroom", &self.headroom)
            .field("data_room", &self.data_room)
            .finish()
    }
}

impl MbufPool {
    /// Creates the pool and writes every header.
    ///
    /// # Errors
    /// [`Error::MbufLayout`] when headroom + data room exceed 65535 bytes, and everything
    /// [`Mempool::new`] returns.
    pub fn new(cfg: MbufPoolConfig) -> Result<Arc<MbufPool>, Error> {
        let MbufPoolConfig {
            mut pool,
            headroom,
            data_room,
        } = cfg;
        let buf_len = u32::from(headroom) + u32::from(data_room);
        let Ok(buf_len) = u16::try_from(buf_len) else {
            return Err(Error::MbufLayout {
                pool: pool.name().to_owned(),
                headroom,
                data_room,
                max: u32::from(u16::MAX),
            });
        };
        let (obj_size, align) = mbuf_object(buf_len);
        pool.set_mbuf_layout(obj_size, align);
        let mp = Mempool::new(pool)?;
        let pool_ptr = match mp.shared_tag() {
            Some(t) => t as *const Mempool,
            None => Arc::as_ptr(&mp),
        };
        let tag = pool_ptr as usize;
        for index in 0..mp.capacity() {
            let h = mp.obj_ptr(index).cast::<MbufHeader>();
            let header = MbufHeader::new(index, buf_len, headroom, pool_ptr);
            // SAFETY: `h` is object `index`, inside the region (checked by `obj_ptr`), 64-byte
            // aligned (page-aligned base, object size a multiple of 64) and at least
            // `MBUF_HEADER_BYTES` long. The pool is not shared yet, so nothing else accesses it.
            unsafe { h.write(header) };
        }
        mp.publish_shared(crate::shm::KIND_MBUF, headroom, data_room);
        Ok(Arc::new(MbufPool {
            mp,
            tag,
            headroom,
            data_room,
        }))
    }

    /// Attaches to an mbuf pool another process created with
    /// [`MbufPoolConfig::shared_file`]: its mbufs at the same addresses, its free ring and its
    /// caches shared with every other process attached. Mbufs move freely between the
    /// processes (an mbuf allocated in one may be freed in another). See
    /// [`Mempool::attach`].
    ///
    /// # Errors
    /// As [`Mempool::attach`]; [`Error::NotASharedPool`] also when the file holds an object
    /// pool, not an mbuf pool.
    pub fn attach(path: &std::path::Path, opts: &RegionOptions) -> Result<Arc<MbufPool>, Error> {
        let (mp, (headroom, data_room)) = Mempool::attach_kind(path, opts, crate::shm::KIND_MBUF)?;
        let tag = mp.shared_tag().expect("an attached pool is shared");
        Ok(Arc::new(MbufPool {
            mp,
            tag,
            headroom,
            data_room,
        }))
    }

    /// Whether other processes can attach to this pool.
    pub fn is_shared(&self) -> bool {
        self.mp.is_shared()
    }

    /// The pool's object store (ring, caches, memory).
    pub fn mempool(&self) -> &Arc<Mempool> {
        &self.mp
    }

    /// Returns a dead process's cached mbufs to the pool; see [`Mempool::reclaim`].
    ///
    /// # Errors
    /// [`Error::NotShared`] for a private pool.
    pub fn reclaim(&self, pid: u32) -> Result<u32, Error> {
        self.mp.reclaim(pid)
    }

    /// Returns the mbufs a dead process held outside its caches (posted to device queues,
    /// in flight, in hand) to the pool, once its queues are destroyed; see
    /// [`Mempool::reclaim_owned`].
    ///
    /// # Errors
    /// As [`Mempool::reclaim_owned`].
    pub fn reclaim_owned(&self, pid: u32) -> Result<u32, Error> {
        self.mp.reclaim_owned(pid)
    }

    /// A per-core cache of the pool's configured size.
    pub fn cache(self: &Arc<Self>) -> MbufCache {
        MbufCache {
            inner: PoolCache::new(&self.mp),
            pool: Arc::clone(self),
        }
    }

    /// A per-core cache of `size` mbufs (at most the configured size).
    ///
    /// # Panics
    /// When `size` exceeds the pool's configured cache size.
    pub fn cache_with_size(self: &Arc<Self>, size: u32) -> MbufCache {
        MbufCache {
            inner: PoolCache::with_size(&self.mp, size),
            pool: Arc::clone(self),
        }
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        self.mp.name()
    }

    /// Number of mbufs.
    pub fn capacity(&self) -> u32 {
        self.mp.capacity()
    }

    /// Free mbufs (ring plus caches); a snapshot, exact when the pool is idle.
    pub fn available(&self) -> u32 {
        self.mp.available()
    }

    /// Mbufs handed out; a snapshot, exact when the pool is idle.
    pub fn in_use(&self) -> u32 {
        self.mp.in_use()
    }

    /// Free mbufs held in per-core caches.
    pub fn cached(&self) -> u32 {
        self.mp.cached()
    }

    /// Bytes per object (header + headroom + data room, 64-byte aligned).
    pub fn obj_size(&self) -> usize {
        self.mp.obj_size()
    }

    /// Page size of the pool's memory.
    pub fn page_size(&self) -> PageSize {
        self.mp.page_size()
    }

    /// Headroom of a freshly reset mbuf.
    pub fn headroom(&self) -> u16 {
        self.headroom
    }

    /// Data room: bytes from the reset data offset to the end of the buffer (what an RX
    /// descriptor can receive).
    pub fn data_room(&self) -> u16 {
        self.data_room
    }

    /// The chunks the pool is built on.
    pub fn chunks(&self) -> &[ChunkInfo] {
        self.mp.chunks()
    }

    /// Chunk holding `m`.
    #[inline]
    pub fn chunk_of(&self, m: RawMbuf) -> usize {
        self.mp.chunk_of(m.0)
    }

    /// Creation-time key (lkey) of the chunk holding `m`: a shift and an array load.
    #[inline]
    pub fn chunk_key(&self, m: RawMbuf) -> Option<crate::Lkey> {
        self.mp.chunk_key(m.0)
    }

    /// Creation-time key of the chunk holding `addr`.
    #[inline]
    pub fn key_for_addr(&self, addr: usize) -> Option<crate::Lkey> {
        self.mp.key_for_addr(addr)
    }

    /// Registers every chunk now (e.g. with one device) and returns the keys; see
    /// [`Mempool::register_chunks`].
    ///
    /// # Errors
    /// [`Error::Registration`] when the hook fails.
    pub fn register_chunks(
        &self,
        hook: impl FnMut(&ChunkInfo) -> Result<Registration, BoxError>,
    ) -> Result<ChunkKeys, Error> {
        self.mp.register_chunks(hook)
    }

    /// Keys another process registered the chunks with; see [`Mempool::keys_from`].
    ///
    /// # Errors
    /// [`Error::Registration`] when `keys` does not have one key per chunk.
    pub fn keys_from(&self, keys: &[crate::Lkey]) -> Result<ChunkKeys, Error> {
        self.mp.keys_from(keys)
    }

    /// Start of `m`'s buffer (its headroom), as an address.
    #[inline]
    pub fn buf_addr(&self, m: RawMbuf) -> usize {
        self.hdr_ptr(m) as usize + MBUF_HEADER_BYTES
    }

    /// Where a reset mbuf's data starts (`buf_addr + headroom`): the address to post in an RX
    /// descriptor, for [`MbufPool::data_room`] bytes.
    #[inline]
    pub fn rx_data_addr(&self, m: RawMbuf) -> usize {
        self.buf_addr(m) + usize::from(self.headroom)
    }

    /// Takes one mbuf from the shared ring, reset. For slow paths; the datapath uses a cache.
    pub fn alloc(&self) -> Option<Mbuf> {
        let idx = self.mp.get()?;
        // SAFETY: `idx` was just taken from the pool, so we own it exclusively.
        Some(unsafe { self.mbuf_reset(idx) })
    }

    /// Fills `out` with raw mbufs from the cache (refilled from the ring in bulk), or takes
    /// nothing and returns `false`. Metadata is not reset (see the module docs): set
    /// `data_off`/`data_len`/flags before use, e.g. with [`Mbuf::reset`].
    ///
    /// # Panics
    /// When `cache` belongs to another pool.
    #[inline]
    pub fn alloc_bulk(&self, cache: &mut MbufCache, out: &mut [RawMbuf]) -> bool {
        self.check_cache(cache);
        cache.inner.get_bulk(raw_as_u32_mut(out))
    }

    /// Returns raw mbufs (with all their segments) through the cache.
    ///
    /// # Safety
    /// The caller owns every mbuf in `raws` (it came from this pool's [`MbufPool::alloc_bulk`]
    /// or [`Mbuf::into_raw`]), each appears once, and none of them (nor any copy of the
    /// `RawMbuf`) is used after this call.
    ///
    /// # Panics
    /// When `cache` belongs to another pool; in audit builds, on a double free.
    #[inline]
    pub unsafe fn free_bulk(&self, cache: &mut MbufCache, raws: &[RawMbuf]) {
        self.check_cache(cache);
        let mut single = true;
        for &r in raws {
            self.mp.audit_check_free(r.0);
            // SAFETY: the caller owns `r` (contract above), so its header is ours to read.
            let next = unsafe { (*self.hdr_ptr(r)).next };
            single &= next == NO_SEG;
        }
        if single {
            // Every mbuf is one segment with refcnt 1 (free-state invariant): the burst is
            // just indices for the cache.
            cache.inner.put_bulk(raw_as_u32(raws));
        } else {
            for &r in raws {
                // SAFETY: as above; each chain is freed once, through its head.
                unsafe { free_chain(self.hdr_nn(r), Some(&mut cache.inner)) };
            }
        }
    }

    /// Turns a raw mbuf back into an owned handle.
    ///
    /// # Safety
    /// The caller owns `m` (see [`MbufPool::free_bulk`]) and gives that ownership to the
    /// returned `Mbuf`: no other copy of `m` is used while it lives.
    ///
    /// # Panics
    /// In audit builds, when `m` is free (use after free).
    #[inline]
    pub unsafe fn from_raw(&self, m: RawMbuf) -> Mbuf {
        self.mp.audit_check(m.0, "from_raw");
        Mbuf {
            hdr: self.hdr_nn(m),
        }
    }

    /// Fills every slot of `out` with a reset mbuf from the cache, or takes nothing and
    /// returns `false` (slots it had filled are emptied again). Mbufs already in `out` are
    /// dropped (freed) when overwritten.
    ///
    /// # Panics
    /// When `cache` belongs to another pool.
    pub fn alloc_mbufs(&self, cache: &mut MbufCache, out: &mut [Option<Mbuf>]) -> bool {
        const STEP: usize = 64;
        self.check_cache(cache);
        let mut idx = [0u32; STEP];
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(STEP);
            if !cache.inner.get_bulk(&mut idx[..n]) {
                for slot in &mut out[..done] {
                    if let Some(m) = slot.take() {
                        m.free_to(cache);
                    }
                }
                return false;
            }
            for (slot, &i) in out[done..done + n].iter_mut().zip(&idx[..n]) {
                // SAFETY: `i` was just taken from the pool, so we own it exclusively.
                *slot = Some(unsafe { self.mbuf_reset(i) });
            }
            done += n;
        }
        true
    }

    /// Returns mbufs (all segments) through the cache.
    ///
    /// # Panics
    /// When `cache` belongs to another pool.
    pub fn free_mbufs(&self, cache: &mut MbufCache, mbufs: impl IntoIterator<Item = Mbuf>) {
        const STEP: usize = 64;
        self.check_cache(cache);
        let mut idx = [0u32; STEP];
        let mut n = 0;
        for m in mbufs {
            let h = m.h();
            if h.next == NO_SEG && h.pool as usize == self.tag {
                // One segment of this pool (refcnt 1, the free-state invariant holds): just
                // its index goes back, in one bulk put per 64.
                idx[n] = m.into_raw().0;
                n += 1;
                if n == STEP {
                    cache.inner.put_bulk(&idx);
                    n = 0;
                }
            } else {
                m.free_to(cache);
            }
        }
        cache.inner.put_bulk(&idx[..n]);
    }

    /// In audit builds, panics unless object `idx` is in use (owned by someone).
    #[inline]
    pub(super) fn audit_in_use(&self, idx: u32, what: &str) {
        self.mp.audit_check(idx, what);
    }

    /// What this pool's mbuf headers hold in `pool`, to tell its mbufs from others'.
    #[inline]
    pub(crate) fn mempool_ptr(&self) -> *const Mempool {
        self.tag as *const Mempool
    }

    #[inline]
    fn check_cache(&self, cache: &MbufCache) {
        assert!(
            ptr::eq(Arc::as_ptr(&cache.pool), self),
            "mbuf cache of pool '{}' used with pool '{}'",
            cache.pool.name(),
            self.name()
        );
    }

    #[inline]
    fn hdr_ptr(&self, m: RawMbuf) -> *mut MbufHeader {
        self.mp.obj_ptr_unchecked(m.0).cast()
    }

    #[inline]
    fn hdr_nn(&self, m: RawMbuf) -> NonNull<MbufHeader> {
        debug_assert!(m.0 < self.mp.capacity(), "mbuf index {} out of range", m.0);
        // SAFETY: the region base is non-null and the offset stays inside the region for a
        // valid index (the callers' contract), so the result is non-null.
        unsafe { NonNull::new_unchecked(self.hdr_ptr(m)) }
    }

    /// # Safety
    /// The caller owns object `idx` exclusively.
    #[inline]
    unsafe fn mbuf_reset(&self, idx: u32) -> Mbuf {
        let mut m = Mbuf {
            hdr: self.hdr_nn(RawMbuf(idx)),
        };
        m.h_mut().reset();
        m
    }
}

impl Drop for MbufPool {
    fn drop(&mut self) {
        // We hold the last handle (caches hold one each), so every free mbuf is in the ring.
        let outstanding = self.mp.settle_outstanding();
        if outstanding > 0 && !self.mp.is_creator() {
            // Another process's shared pool: what is out may be any process's. Ours (if
            // any) must stay valid.
            tracing::debug!(target: LOG, pool = %self.mp.name(), outstanding, "detached from a shared pool");
            // The pool stays mapped (others' mbufs may be ours to touch still), but an owner
            // id that tags nothing goes back for the next process.
            self.mp.release_owner_if_unused();
            std::mem::forget(Arc::clone(&self.mp));
        } else if outstanding > 0 {
            // Its file goes now all the same (every mapping keeps its memory): a pool that
            // was shared must not stay behind in the directory.
            if let Some(path) = self
                .mp
                .region()
                .shared_path()
                .filter(|_| self.mp.is_shared())
            {
                let _ = std::fs::remove_file(path);
            }
            tracing::warn!(
                target: LOG,
                pool = %self.mp.name(),
                "mbuf pool '{}' dropped while {outstanding} mbufs are still in use: keeping its \
                 {} bytes mapped (leaked) so they stay valid",
                self.mp.name(),
                self.mp.region().len()
            );
            // Their headers point at the Mempool: it must never be freed.
            std::mem::forget(Arc::clone(&self.mp));
        }
    }
}

/// A per-core cache for an [`MbufPool`] (`Send`, not `Sync`). Dropping it returns what it
/// holds to the pool.
pub struct MbufCache {
    // Field order is drop order: the cache flushes before the pool handle goes.
    pub(crate) inner: PoolCache,
    pool: Arc<MbufPool>,
}

impl fmt::Debug for MbufCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MbufCache")
            .field("cache", &self.inner)
            .finish()
    }
}

impl MbufCache {
    /// One reset mbuf, or `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&mut self) -> Option<Mbuf> {
        let idx = self.inner.get()?;
        // SAFETY: `idx` was just taken from the pool, so we own it exclusively.
        Some(unsafe { self.pool.mbuf_reset(idx) })
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<MbufPool> {
        &self.pool
    }

    /// Free mbufs held.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Returns everything held to the shared ring.
    pub fn flush(&mut self) {
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mbuf::test_pool as pool;

    #[test]
    fn raw_round_trip_keeps_ownership() {
        let p = pool(8);
        let mut c = p.cache();
        let mut raws = [RawMbuf::default(); 4];
        assert!(p.alloc_bulk(&mut c, &mut raws));
        assert_eq!(p.in_use(), 4);
        // SAFETY: the raws came from alloc_bulk just above and are each used once.
        let mut m = unsafe { p.from_raw(raws[0]) };
        m.reset();
        m.extend_from_slice(b"x").unwrap();
        let r = m.into_raw();
        assert_eq!(r, raws[0]);
        // SAFETY: we own all four; none is used afterwards.
        unsafe { p.free_bulk(&mut c, &raws) };
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn memory_bytes_is_what_the_pool_maps() {
        let cfg = || {
            MbufPoolConfig::new("bytes", 100)
                .data_room(9024)
                .page_policy(PagePolicy::Normal)
        };
        let want = cfg().memory_bytes().unwrap();
        let p = MbufPool::new(cfg()).unwrap();
        assert_eq!(want, 100 * p.obj_size());
        assert_eq!(p.obj_size() % 64, 0);
        assert!(p.chunks().iter().map(|c| c.len).sum::<usize>() >= want);
        // Headroom and data room past 65535 bytes: no layout, no size.
        let big = MbufPoolConfig::new("big", 1)
            .headroom(u16::MAX)
            .data_room(2);
        assert_eq!(big.memory_bytes(), None);
    }
}
