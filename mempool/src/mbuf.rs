//! Packet buffers: one pool object = a 128-byte header + headroom + data room.
//!
//! ```text
//! object (obj_size, 64-byte aligned)
//! +----------------------+-----------+-------------------------------+
//! | MbufHeader (128 B)   | headroom  | data room                     |
//! | line 0: RX/TX fields | (128 B)   | (2048 B)                      |
//! | line 1: user area    |           |                               |
//! +----------------------+-----------+-------------------------------+
//!                        ^ buf_addr  ^ data starts here after a reset (data_off = headroom)
//! ```
//!
//! # Handles
//!
//! - [`Mbuf`]: an owned, unique handle (one pointer, no reference count). Safe byte access
//!   (`Deref<Target = [u8]>`), length helpers with bounds checks, metadata setters. Dropping it
//!   returns every segment to the pool. Through an [`MbufCache`] ([`Mbuf::free_to`],
//!   [`MbufPool::alloc_mbufs`] / [`MbufPool::free_mbufs`]) it stays off the shared ring, so
//!   a driver that must not use `unsafe` can run its datapath on `Mbuf`s alone.
//! - [`RawMbuf`]: a `Copy` object index for DPDK-style bursts ([`MbufPool::alloc_bulk`] /
//!   [`MbufPool::free_bulk`]): a burst is a plain copy of `u32`s in and out of the per-core
//!   cache. Anything that relies on owning the buffer (`free_bulk`, `from_raw`) is `unsafe`.
//! - [`SharedMbuf`]: a read-only, reference-counted handle (`Clone` bumps the header's
//!   `refcnt`), for one packet sent to several places.
//!
//! # How a handle finds its pool
//!
//! The header stores a pointer to the pool's [`Mempool`], so an `Mbuf` is one pointer wide and
//! costs no reference-count traffic. The pool is kept alive for outstanding buffers:
//! dropping the last [`MbufPool`] handle while mbufs are still out leaks the pool (memory stays
//! mapped, with a warning) instead of freeing memory that they point into.
//!
//! # Free-state invariant
//!
//! A free mbuf has `refcnt == 1`, `nb_segs == 1`, no next segment, and `data_off + data_len <=
//! buf_len`. [`MbufPool::alloc_bulk`] (like DPDK's raw bulk get) does not reset the other
//! metadata; [`MbufCache::alloc`], [`MbufPool::alloc`] and [`MbufPool::alloc_mbufs`] do.
//!
//! Unsafe code in this module: header and buffer access through pointers into the pool's
//! region, the `u32` view of `[RawMbuf]`, and `Send`/`Sync` for the handles.
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::mem::{offset_of, ManuallyDrop};
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::sync::Arc;

use crate::cache::PoolCache;
use crate::chunk::{ChunkInfo, ChunkKeys, Registration};
use crate::error::{BoxError, Error};
use crate::offload::OffloadFlags;
use crate::pool::{Mempool, PoolConfig};
use crate::region::{PagePolicy, PageSize, RegionOptions};

const LOG: &str = "mempool";

/// Bytes of the mbuf header at the start of every object (two cache lines).
pub const MBUF_HEADER_BYTES: usize = 128;
/// Default headroom in front of the packet data.
pub const DEFAULT_HEADROOM: u16 = 128;
/// Default data room (the largest frame one segment holds).
pub const DEFAULT_DATA_ROOM: u16 = 2048;
/// Bytes of the per-mbuf user area.
pub const USER_AREA_BYTES: usize = 16;
/// `port` of an mbuf that no port has received into.
pub const PORT_INVALID: u16 = u16::MAX;

const NO_SEG: u32 = u32::MAX;

/// The mbuf header. Line 0 holds everything the datapath writes on RX and reads on TX and on
/// free; the constant fields (`index`, `buf_len`, `headroom`, `pool`) are set once at pool
/// creation. Line 1 holds the user area.
#[repr(C, align(64))]
struct MbufHeader {
    data_off: u16,
    /// Owners of the chain (only `SharedMbuf` raises it above 1; kept on the head segment).
    refcnt: AtomicU16,
    nb_segs: u16,
    port: u16,
    ol_flags: u64,
    pkt_len: u32,
    data_len: u16,
    vlan_tci: u16,
    rss_hash: u32,
    /// Object index of the next segment, or `NO_SEG`.
    next: u32,
    timestamp: u64,
    l2_len: u8,
    l4_len: u8,
    l3_len: u16,
    tso_segsz: u16,
    _pad0: u16,
    index: u32,
    buf_len: u16,
    headroom: u16,
    pool: *const Mempool,
    // ---- line 1 ----
    user: [u8; USER_AREA_BYTES],
    _reserved: [u8; 48],
}

const _: () = {
    assert!(size_of::<MbufHeader>() == MBUF_HEADER_BYTES);
    assert!(align_of::<MbufHeader>() == 64);
    assert!(offset_of!(MbufHeader, ol_flags) == 8);
    assert!(offset_of!(MbufHeader, pkt_len) == 16);
    assert!(offset_of!(MbufHeader, next) == 28);
    assert!(offset_of!(MbufHeader, index) == 48);
    assert!(offset_of!(MbufHeader, pool) == 56);
    assert!(offset_of!(MbufHeader, user) == 64);
};

impl MbufHeader {
    fn reset(&mut self) {
        self.data_off = self.headroom;
        self.nb_segs = 1;
        self.port = PORT_INVALID;
        self.ol_flags = 0;
        self.pkt_len = 0;
        self.data_len = 0;
        self.vlan_tci = 0;
        self.rss_hash = 0;
        self.next = NO_SEG;
        self.timestamp = 0;
        self.l2_len = 0;
        self.l4_len = 0;
        self.l3_len = 0;
        self.tso_segsz = 0;
    }
}

/// TX offload lengths a NIC needs for checksum and segmentation offloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxOffload {
    /// L2 header length (Ethernet + VLAN tags).
    pub l2_len: u8,
    /// L3 header length (IPv4 with options, IPv6 with extension headers).
    pub l3_len: u16,
    /// L4 header length (TCP with options).
    pub l4_len: u8,
    /// TSO segment size (payload bytes per segment).
    pub tso_segsz: u16,
}

/// Why a length operation on an mbuf was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MbufError {
    /// `prepend` needs more headroom than the first segment has.
    #[error("prepend of {need} bytes: only {have} bytes of headroom")]
    NoHeadroom {
        /// Bytes asked for.
        need: usize,
        /// Headroom available.
        have: usize,
    },
    /// `append` needs more tailroom than the last segment has.
    #[error("append of {need} bytes: only {have} bytes of tailroom in the last segment")]
    NoTailroom {
        /// Bytes asked for.
        need: usize,
        /// Tailroom available.
        have: usize,
    },
    /// `adj` / `trim` asked to remove more than the segment holds.
    #[error("cannot remove {need} bytes from a segment holding {have}")]
    TooShort {
        /// Bytes asked for.
        need: usize,
        /// Bytes in the segment.
        have: usize,
    },
    /// `set_data_len` beyond the buffer.
    #[error("data length {len} does not fit: {room} bytes of buffer after the data offset")]
    TooLong {
        /// Length asked for.
        len: usize,
        /// Room after the data offset.
        room: usize,
    },
    /// `chain` with a tail from another pool.
    #[error("cannot chain mbufs from different pools")]
    DifferentPools,
    /// `chain` would overflow the segment count or packet length.
    #[error(
        "chain would have {segs} segments and {bytes} bytes; at most 65535 segments and 4 GiB"
    )]
    ChainTooLong {
        /// Segments the chain would have.
        segs: u32,
        /// Bytes the chain would have.
        bytes: u64,
    },
}

/// A refused [`Mbuf::chain`]: the reason, and the tail handed back.
pub struct ChainError {
    /// Why.
    pub error: MbufError,
    /// The tail that was not chained.
    pub tail: Mbuf,
}

impl fmt::Debug for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for ChainError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// An mbuf named by its object index: `Copy`, 4 bytes, for DPDK-style raw bursts.
///
/// It carries no ownership. [`MbufPool::alloc_bulk`] hands out indices the caller then owns;
/// everything that relies on that ownership is `unsafe`. Only meaningful with the pool that
/// produced it. `RawMbuf::default()` is index 0, a placeholder for burst arrays.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawMbuf(u32);

impl RawMbuf {
    /// From an object index (for example one stored in a work request id).
    #[inline]
    pub const fn from_index(index: u32) -> Self {
        RawMbuf(index)
    }

    /// The object index.
    #[inline]
    pub const fn index(self) -> u32 {
        self.0
    }
}

fn raw_as_u32(raws: &[RawMbuf]) -> &[u32] {
    // SAFETY: `RawMbuf` is `repr(transparent)` over `u32`: same size, alignment and validity,
    // so the slice can be viewed as `u32`s for the same length and lifetime.
    unsafe { slice::from_raw_parts(raws.as_ptr().cast::<u32>(), raws.len()) }
}

fn raw_as_u32_mut(raws: &mut [RawMbuf]) -> &mut [u32] {
    // SAFETY: as in `raw_as_u32`; every `u32` is a valid `RawMbuf`, and the borrow is unique.
    unsafe { slice::from_raw_parts_mut(raws.as_mut_ptr().cast::<u32>(), raws.len()) }
}

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

    /// Back the buffers with a shared file (see [`PoolConfig::shared_file`]). Another process
    /// can then read and write the packet bytes; the headers' pool pointers are meaningful only
    /// in this process.
    pub fn shared_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.pool = self.pool.shared_file(path);
        self
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

/// A pool of mbufs, shared between threads behind an `Arc`.
pub struct MbufPool {
    mp: Arc<Mempool>,
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
        pool.set_mbuf_layout(
            MBUF_HEADER_BYTES + usize::from(buf_len),
            align_of::<MbufHeader>(),
        );
        let mp = Mempool::new(pool)?;
        let pool_ptr = Arc::as_ptr(&mp);
        for index in 0..mp.capacity() {
            let h = mp.obj_ptr(index).cast::<MbufHeader>();
            let header = MbufHeader {
                data_off: headroom,
                refcnt: AtomicU16::new(1),
                nb_segs: 1,
                port: PORT_INVALID,
                ol_flags: 0,
                pkt_len: 0,
                data_len: 0,
                vlan_tci: 0,
                rss_hash: 0,
                next: NO_SEG,
                timestamp: 0,
                l2_len: 0,
                l4_len: 0,
                l3_len: 0,
                tso_segsz: 0,
                _pad0: 0,
                index,
                buf_len,
                headroom,
                pool: pool_ptr,
                user: [0; USER_AREA_BYTES],
                _reserved: [0; 48],
            };
            // SAFETY: `h` is object `index`, inside the region (checked by `obj_ptr`), 64-byte
            // aligned (page-aligned base, object size a multiple of 64) and at least
            // `MBUF_HEADER_BYTES` long. The pool is not shared yet, so nothing else accesses it.
            unsafe { h.write(header) };
        }
        Ok(Arc::new(MbufPool {
            mp,
            headroom,
            data_room,
        }))
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
    pub fn chunk_key(&self, m: RawMbuf) -> Option<u32> {
        self.mp.chunk_key(m.0)
    }

    /// Creation-time key of the chunk holding `addr`.
    #[inline]
    pub fn key_for_addr(&self, addr: usize) -> Option<u32> {
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
            if h.next == NO_SEG && ptr::eq(h.pool, Arc::as_ptr(&self.mp)) {
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
        if outstanding > 0 {
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
    inner: PoolCache,
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

/// An owned packet buffer (possibly a chain of segments). One pointer wide; dropping it
/// returns every segment to the pool's shared ring (use [`Mbuf::free_to`] to go through a
/// cache instead).
pub struct Mbuf {
    hdr: NonNull<MbufHeader>,
}

// SAFETY: an `Mbuf` owns its buffer and chain exclusively (or, inside a `SharedMbuf`, shares
// them read-only with an atomic `refcnt`); the `Mempool` its header points to is `Sync` and
// outlives it (see `MbufPool`'s `Drop`). Moving it to another thread moves that ownership.
unsafe impl Send for Mbuf {}
// SAFETY: `&Mbuf` only reads the header and bytes; nothing writes them while a shared
// reference exists (writes need `&mut Mbuf`, and a `SharedMbuf` only hands out `&Mbuf`).
unsafe impl Sync for Mbuf {}

impl Mbuf {
    #[inline]
    fn h(&self) -> &MbufHeader {
        // SAFETY: `hdr` points at a live, initialized header in the pool's region (kept mapped
        // while any mbuf is out); we own it or share it read-only (see the `Sync` impl).
        unsafe { self.hdr.as_ref() }
    }

    #[inline]
    fn h_mut(&mut self) -> &mut MbufHeader {
        // SAFETY: as in `h`, and `&mut self` means we own the mbuf exclusively (an `Mbuf`
        // inside a `SharedMbuf` is never reachable mutably).
        unsafe { self.hdr.as_mut() }
    }

    #[inline]
    fn pool(&self) -> &Mempool {
        // SAFETY: set at pool creation to the `Mempool` that holds this object, which stays
        // alive while any of its mbufs is out (`MbufPool`'s `Drop` leaks it otherwise).
        unsafe { &*self.h().pool }
    }

    /// Header of the last segment.
    fn last_seg(&self) -> NonNull<MbufHeader> {
        let mut p = self.hdr;
        loop {
            // SAFETY: `p` is this chain's head or a segment reached through `next`, all owned
            // by this handle and live.
            let next = unsafe { p.as_ref().next };
            if next == NO_SEG {
                return p;
            }
            p = seg_ptr(self.pool(), next);
        }
    }

    /// The first segment's data.
    #[inline]
    pub fn data(&self) -> &[u8] {
        let h = self.h();
        // SAFETY: `data_off + data_len <= buf_len` (kept by every setter), so the range lies in
        // this object's buffer; the bytes are initialized (the region is zero-filled) and only
        // written through `&mut self`.
        unsafe { slice::from_raw_parts(data_ptr(self.hdr, h.data_off), usize::from(h.data_len)) }
    }

    /// The first segment's data, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (off, len) = (self.h().data_off, self.h().data_len);
        // SAFETY: as in `data`, and `&mut self` makes the access exclusive.
        unsafe { slice::from_raw_parts_mut(data_ptr(self.hdr, off), usize::from(len)) }
    }

    /// Bytes in the first segment (`data_len`).
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.h().data_len)
    }

    /// Whether the first segment is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.h().data_len == 0
    }

    /// Bytes in the whole chain.
    #[inline]
    pub fn pkt_len(&self) -> u32 {
        self.h().pkt_len
    }

    /// Segments in the chain.
    #[inline]
    pub fn nb_segs(&self) -> u16 {
        self.h().nb_segs
    }

    /// Headroom of the first segment (the data offset in its buffer).
    #[inline]
    pub fn headroom(&self) -> usize {
        usize::from(self.h().data_off)
    }

    /// Room after the first segment's data.
    #[inline]
    pub fn tailroom(&self) -> usize {
        let h = self.h();
        usize::from(h.buf_len - h.data_off - h.data_len)
    }

    /// Buffer length (headroom + data room).
    #[inline]
    pub fn buf_len(&self) -> usize {
        usize::from(self.h().buf_len)
    }

    /// Address of the start of the buffer.
    #[inline]
    pub fn buf_addr(&self) -> usize {
        self.hdr.as_ptr() as usize + MBUF_HEADER_BYTES
    }

    /// Address of the first data byte (for a TX descriptor).
    #[inline]
    pub fn data_addr(&self) -> usize {
        self.buf_addr() + usize::from(self.h().data_off)
    }

    /// The object index, as a raw mbuf, without giving up ownership.
    #[inline]
    pub fn raw(&self) -> RawMbuf {
        RawMbuf(self.h().index)
    }

    /// Creation-time key (lkey) of the chunk holding this buffer.
    #[inline]
    pub fn chunk_key(&self) -> Option<u32> {
        self.pool().chunk_key(self.h().index)
    }

    /// Receive port.
    #[inline]
    pub fn port(&self) -> u16 {
        self.h().port
    }

    /// Sets the receive port.
    #[inline]
    pub fn set_port(&mut self, port: u16) {
        self.h_mut().port = port;
    }

    /// Offload flags.
    #[inline]
    pub fn ol_flags(&self) -> OffloadFlags {
        OffloadFlags::from_bits_retain(self.h().ol_flags)
    }

    /// Sets the offload flags.
    #[inline]
    pub fn set_ol_flags(&mut self, flags: OffloadFlags) {
        self.h_mut().ol_flags = flags.bits();
    }

    /// RSS hash (meaningful with `OffloadFlags::RX_RSS_HASH`).
    #[inline]
    pub fn rss_hash(&self) -> u32 {
        self.h().rss_hash
    }

    /// Sets the RSS hash and the `RX_RSS_HASH` flag.
    #[inline]
    pub fn set_rss_hash(&mut self, hash: u32) {
        let h = self.h_mut();
        h.rss_hash = hash;
        h.ol_flags |= OffloadFlags::RX_RSS_HASH.bits();
    }

    /// VLAN TCI (meaningful with `RX_VLAN` on receive, `TX_VLAN` on transmit).
    #[inline]
    pub fn vlan_tci(&self) -> u16 {
        self.h().vlan_tci
    }

    /// Sets the VLAN TCI (flags are left to the caller: `RX_VLAN`, `RX_VLAN_STRIPPED` or
    /// `TX_VLAN`).
    #[inline]
    pub fn set_vlan_tci(&mut self, tci: u16) {
        self.h_mut().vlan_tci = tci;
    }

    /// Timestamp (in the units the driver documents).
    #[inline]
    pub fn timestamp(&self) -> u64 {
        self.h().timestamp
    }

    /// Sets the timestamp.
    #[inline]
    pub fn set_timestamp(&mut self, ts: u64) {
        self.h_mut().timestamp = ts;
    }

    /// TX offload lengths.
    #[inline]
    pub fn tx_offload(&self) -> TxOffload {
        let h = self.h();
        TxOffload {
            l2_len: h.l2_len,
            l3_len: h.l3_len,
            l4_len: h.l4_len,
            tso_segsz: h.tso_segsz,
        }
    }

    /// Sets the TX offload lengths.
    #[inline]
    pub fn set_tx_offload(&mut self, o: TxOffload) {
        let h = self.h_mut();
        h.l2_len = o.l2_len;
        h.l3_len = o.l3_len;
        h.l4_len = o.l4_len;
        h.tso_segsz = o.tso_segsz;
    }

    /// The user area (not cleared on allocation).
    #[inline]
    pub fn user_area(&self) -> &[u8; USER_AREA_BYTES] {
        &self.h().user
    }

    /// The user area, writable.
    #[inline]
    pub fn user_area_mut(&mut self) -> &mut [u8; USER_AREA_BYTES] {
        &mut self.h_mut().user
    }

    /// Sets the first segment's length (e.g. from an RX completion), adjusting `pkt_len` by the
    /// same amount.
    ///
    /// # Errors
    /// [`MbufError::TooLong`] when `len` exceeds the room after the data offset.
    #[inline]
    pub fn set_data_len(&mut self, len: usize) -> Result<(), MbufError> {
        let h = self.h_mut();
        let room = usize::from(h.buf_len - h.data_off);
        if len > room {
            return Err(MbufError::TooLong { len, room });
        }
        h.pkt_len = h.pkt_len - u32::from(h.data_len) + len as u32;
        h.data_len = len as u16;
        Ok(())
    }

    /// Resets the metadata (data offset to the headroom, lengths 0, flags 0, port invalid) and
    /// frees any further segments.
    pub fn reset(&mut self) {
        let next = self.h().next;
        if next != NO_SEG {
            let tail = seg_ptr(self.pool(), next);
            // SAFETY: the segments after the head are owned by this chain; unlinking them
            // below hands their ownership to `free_chain`, which frees each once.
            unsafe { free_chain(tail, None) };
        }
        self.h_mut().reset();
    }

    /// Grows the data at the front by `n` bytes and returns them.
    ///
    /// # Errors
    /// [`MbufError::NoHeadroom`] when the first segment has less than `n` bytes of headroom.
    pub fn prepend(&mut self, n: usize) -> Result<&mut [u8], MbufError> {
        let have = self.headroom();
        if n > have || self.h().pkt_len as u64 + n as u64 > u64::from(u32::MAX) {
            return Err(MbufError::NoHeadroom { need: n, have });
        }
        let h = self.h_mut();
        h.data_off -= n as u16;
        h.data_len += n as u16;
        h.pkt_len += n as u32;
        Ok(&mut self.data_mut()[..n])
    }

    /// Grows the data at the end of the last segment by `n` bytes and returns them.
    ///
    /// # Errors
    /// [`MbufError::NoTailroom`] when the last segment has less than `n` bytes of room.
    pub fn append(&mut self, n: usize) -> Result<&mut [u8], MbufError> {
        let mut last = self.last_seg();
        // SAFETY: `last` is a segment of this chain, owned exclusively through `&mut self`, and
        // distinct from the head unless it is the head (in which case no other reference to
        // the head is live here).
        let l = unsafe { last.as_mut() };
        let have = usize::from(l.buf_len - l.data_off - l.data_len);
        if n > have || self.h().pkt_len as u64 + n as u64 > u64::from(u32::MAX) {
            return Err(MbufError::NoTailroom { need: n, have });
        }
        // SAFETY: as above.
        let l = unsafe { last.as_mut() };
        let start = usize::from(l.data_off) + usize::from(l.data_len);
        l.data_len += n as u16;
        self.h_mut().pkt_len += n as u32;
        // SAFETY: `start + n <= buf_len` (checked above), so the range is inside the last
        // segment's buffer, which this chain owns exclusively.
        Ok(unsafe { slice::from_raw_parts_mut(buf_ptr(last).add(start), n) })
    }

    /// Appends a copy of `bytes` to the last segment.
    ///
    /// # Errors
    /// As [`Mbuf::append`].
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> Result<(), MbufError> {
        self.append(bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    /// Removes `n` bytes from the front of the first segment.
    ///
    /// # Errors
    /// [`MbufError::TooShort`] when the first segment holds less than `n` bytes.
    pub fn adj(&mut self, n: usize) -> Result<(), MbufError> {
        let have = self.len();
        if n > have {
            return Err(MbufError::TooShort { need: n, have });
        }
        let h = self.h_mut();
        h.data_off += n as u16;
        h.data_len -= n as u16;
        h.pkt_len -= n as u32;
        Ok(())
    }

    /// Removes `n` bytes from the end of the last segment.
    ///
    /// # Errors
    /// [`MbufError::TooShort`] when the last segment holds less than `n` bytes.
    pub fn trim(&mut self, n: usize) -> Result<(), MbufError> {
        let mut last = self.last_seg();
        // SAFETY: `last` is owned by this chain, exclusively through `&mut self`; no other
        // reference to it is live.
        let l = unsafe { last.as_mut() };
        let have = usize::from(l.data_len);
        if n > have {
            return Err(MbufError::TooShort { need: n, have });
        }
        l.data_len -= n as u16;
        self.h_mut().pkt_len -= n as u32;
        Ok(())
    }

    /// Appends `tail`'s segments to this chain.
    ///
    /// # Errors
    /// [`MbufError::DifferentPools`] or [`MbufError::ChainTooLong`], with `tail` handed back.
    pub fn chain(&mut self, tail: Mbuf) -> Result<(), ChainError> {
        if !ptr::eq(self.h().pool, tail.h().pool) {
            return Err(ChainError {
                error: MbufError::DifferentPools,
                tail,
            });
        }
        let segs = u32::from(self.nb_segs()) + u32::from(tail.nb_segs());
        let bytes = u64::from(self.pkt_len()) + u64::from(tail.pkt_len());
        if segs > u32::from(u16::MAX) || bytes > u64::from(u32::MAX) {
            return Err(ChainError {
                error: MbufError::ChainTooLong { segs, bytes },
                tail,
            });
        }
        let mut last = self.last_seg();
        let tail = ManuallyDrop::new(tail);
        // SAFETY: `last` is owned by this chain (exclusive through `&mut self`); from here on
        // the tail's segments are owned by this chain too (`tail` is not dropped).
        unsafe { last.as_mut().next = tail.h().index };
        let h = self.h_mut();
        h.nb_segs = segs as u16;
        h.pkt_len = bytes as u32;
        Ok(())
    }

    /// The data of every segment, in order.
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            next: Some(self.hdr),
            pool: self.pool(),
            _m: PhantomData,
        }
    }

    /// Gives up ownership, returning the raw index (see [`MbufPool::from_raw`]).
    #[inline]
    pub fn into_raw(self) -> RawMbuf {
        let me = ManuallyDrop::new(self);
        me.raw()
    }

    /// Frees the chain through `cache` (no shared-ring traffic unless the cache flushes).
    /// An mbuf of another pool goes back to its own pool's ring.
    #[inline]
    pub fn free_to(self, cache: &mut MbufCache) {
        let me = ManuallyDrop::new(self);
        // SAFETY: we own the chain and give it up here (`me` is never dropped).
        unsafe { free_chain(me.hdr, Some(&mut cache.inner)) };
    }

    /// Turns this handle into a shared, read-only one.
    pub fn into_shared(self) -> SharedMbuf {
        SharedMbuf(ManuallyDrop::new(self))
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the chain and this is its last use.
        unsafe { free_chain(self.hdr, None) };
    }
}

impl Deref for Mbuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.data()
    }
}

impl DerefMut for Mbuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.data_mut()
    }
}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = self.h();
        f.debug_struct("Mbuf")
            .field("index", &h.index)
            .field("data_off", &h.data_off)
            .field("data_len", &h.data_len)
            .field("pkt_len", &h.pkt_len)
            .field("nb_segs", &h.nb_segs)
            .field("port", &h.port)
            .field("ol_flags", &self.ol_flags())
            .finish()
    }
}

/// Iterator over the data of a chain's segments.
pub struct Segments<'a> {
    next: Option<NonNull<MbufHeader>>,
    pool: &'a Mempool,
    _m: PhantomData<&'a Mbuf>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let p = self.next?;
        // SAFETY: `p` is a segment of the chain borrowed for `'a`; nothing writes it while the
        // borrow lives, and `data_off + data_len <= buf_len`.
        let (data, next) = unsafe {
            let h = p.as_ref();
            (
                slice::from_raw_parts(data_ptr(p, h.data_off), usize::from(h.data_len)),
                h.next,
            )
        };
        self.next = (next != NO_SEG).then(|| seg_ptr(self.pool, next));
        Some(data)
    }
}

/// A shared, read-only mbuf: `Clone` adds an owner (atomic `refcnt` on the header), the last
/// drop frees the chain. Derefs to [`Mbuf`] for reading.
pub struct SharedMbuf(ManuallyDrop<Mbuf>);

impl SharedMbuf {
    /// Owners of the buffer.
    pub fn refcnt(&self) -> u16 {
        self.0.h().refcnt.load(Ordering::Acquire)
    }

    /// The owned `Mbuf` back when this is the only owner, else `self`.
    pub fn try_unwrap(self) -> Result<Mbuf, SharedMbuf> {
        if self.refcnt() != 1 {
            return Err(self);
        }
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the `Mbuf` inside is moved out exactly once; as
        // the only owner (refcnt 1, and only a `SharedMbuf` can add owners) it is unique.
        Ok(unsafe { ManuallyDrop::take(&mut me.0) })
    }
}

impl Clone for SharedMbuf {
    fn clone(&self) -> Self {
        let old = self.0.h().refcnt.fetch_add(1, Ordering::Relaxed);
        if old == u16::MAX {
            // Wrapped to 0: the count is meaningless now; like `Arc`, give up loudly.
            std::process::abort();
        }
        SharedMbuf(ManuallyDrop::new(Mbuf { hdr: self.0.hdr }))
    }
}

impl Drop for SharedMbuf {
    fn drop(&mut self) {
        if self.0.h().refcnt.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Pairs with the other owners' Release decrements: their reads happen before the free.
        fence(Ordering::Acquire);
        self.0.h().refcnt.store(1, Ordering::Relaxed);
        // SAFETY: we were the last owner, and `self.0` is not used after this.
        unsafe { ManuallyDrop::drop(&mut self.0) };
    }
}

impl Deref for SharedMbuf {
    type Target = Mbuf;
    fn deref(&self) -> &Mbuf {
        &self.0
    }
}

impl fmt::Debug for SharedMbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedMbuf").field(&*self.0).finish()
    }
}

#[inline]
fn seg_ptr(pool: &Mempool, idx: u32) -> NonNull<MbufHeader> {
    let p = pool.obj_ptr(idx).cast::<MbufHeader>();
    // SAFETY: `obj_ptr` checked the index, and an address inside the region is non-null.
    unsafe { NonNull::new_unchecked(p) }
}

#[inline]
fn buf_ptr(hdr: NonNull<MbufHeader>) -> *mut u8 {
    hdr.as_ptr().cast::<u8>().wrapping_add(MBUF_HEADER_BYTES)
}

#[inline]
fn data_ptr(hdr: NonNull<MbufHeader>, data_off: u16) -> *mut u8 {
    buf_ptr(hdr).wrapping_add(usize::from(data_off))
}

/// Frees a chain segment by segment, restoring the free-state invariant on each.
///
/// # Safety
/// The caller owns the chain starting at `head` and gives it up.
unsafe fn free_chain(head: NonNull<MbufHeader>, mut cache: Option<&mut PoolCache>) {
    let mut p = head.as_ptr();
    loop {
        // SAFETY: `p` is a segment of the chain we own (caller contract), live and initialized;
        // its pool outlives it. Everything is read and reset *before* the object goes back:
        // after that another thread may own it, and the pool may be released once the last
        // outstanding object is home.
        let (pool, idx, next) = unsafe {
            let h = &mut *p;
            let pool = &*h.pool;
            let (idx, next) = (h.index, h.next);
            h.next = NO_SEG;
            h.nb_segs = 1;
            *h.refcnt.get_mut() = 1;
            (pool, idx, next)
        };
        let next_ptr = (next != NO_SEG).then(|| seg_ptr(pool, next));
        match cache.as_deref_mut() {
            Some(c) if ptr::eq(Arc::as_ptr(c.pool()), pool) => c.put(idx),
            _ => pool.put(idx),
        }
        match next_ptr {
            Some(n) => p = n.as_ptr(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: u32) -> Arc<MbufPool> {
        MbufPool::new(
            MbufPoolConfig::new("m", n)
                .cache_size((n * 2 / 3).min(8))
                .page_policy(PagePolicy::Normal),
        )
        .unwrap()
    }

    #[test]
    fn layout_is_header_headroom_dataroom() {
        let p = pool(16);
        assert_eq!(p.obj_size(), 128 + 128 + 2048);
        let m = p.alloc().unwrap();
        assert_eq!(m.headroom(), 128);
        assert_eq!(m.tailroom(), 2048);
        assert_eq!(m.buf_len(), 2176);
        assert_eq!(m.data_addr(), p.rx_data_addr(m.raw()));
        assert_eq!(m.buf_addr() % 64, 0);
    }

    #[test]
    fn length_helpers_check_bounds() {
        let p = pool(16);
        let mut m = p.alloc().unwrap();
        m.extend_from_slice(b"payload").unwrap();
        m.prepend(4).unwrap().copy_from_slice(b"hdr:");
        assert_eq!(&m[..], b"hdr:payload");
        assert_eq!(m.pkt_len(), 11);
        assert_eq!(
            m.prepend(125),
            Err(MbufError::NoHeadroom {
                need: 125,
                have: 124
            })
        );
        assert_eq!(
            m.append(2048 - 7 + 1),
            Err(MbufError::NoTailroom {
                need: 2042,
                have: 2041
            })
        );
        m.adj(4).unwrap();
        m.trim(3).unwrap();
        assert_eq!(&m[..], b"payl");
        assert_eq!(m.adj(5), Err(MbufError::TooShort { need: 5, have: 4 }));
        assert_eq!(m.trim(5), Err(MbufError::TooShort { need: 5, have: 4 }));
        assert_eq!(
            m.set_data_len(2049),
            Err(MbufError::TooLong {
                len: 2049,
                room: 2048
            })
        );
        m.set_data_len(2048).unwrap();
        assert_eq!(m.pkt_len(), 2048);
        assert_eq!(m.tailroom(), 0);
    }

    #[test]
    fn reset_restores_defaults() {
        let p = pool(4);
        let mut m = p.alloc().unwrap();
        m.extend_from_slice(&[1, 2, 3]).unwrap();
        m.set_port(3);
        m.set_rss_hash(0xdead);
        m.reset();
        assert_eq!(
            (m.len(), m.pkt_len(), m.headroom(), m.port()),
            (0, 0, 128, PORT_INVALID)
        );
        assert!(m.ol_flags().is_empty());
    }

    #[test]
    fn metadata_round_trips() {
        let p = pool(4);
        let mut m = p.alloc().unwrap();
        m.set_port(7);
        m.set_vlan_tci(0x0123);
        m.set_timestamp(99);
        m.set_ol_flags(OffloadFlags::RX_VLAN | OffloadFlags::RX_IP_CKSUM_GOOD);
        m.set_rss_hash(0xabcd);
        let o = TxOffload {
            l2_len: 14,
            l3_len: 20,
            l4_len: 20,
            tso_segsz: 1448,
        };
        m.set_tx_offload(o);
        m.user_area_mut()[15] = 0x5a;
        assert_eq!(m.port(), 7);
        assert_eq!(m.vlan_tci(), 0x0123);
        assert_eq!(m.timestamp(), 99);
        assert_eq!(m.rss_hash(), 0xabcd);
        assert!(m
            .ol_flags()
            .contains(OffloadFlags::RX_RSS_HASH | OffloadFlags::RX_VLAN));
        assert_eq!(m.tx_offload(), o);
        assert_eq!(m.user_area()[15], 0x5a);
    }

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
    fn shared_mbuf_frees_on_last_drop() {
        let p = pool(4);
        let mut m = p.alloc().unwrap();
        m.extend_from_slice(b"abc").unwrap();
        let s = m.into_shared();
        let s2 = s.clone();
        assert_eq!(s.refcnt(), 2);
        assert_eq!(&s2[..], b"abc");
        let s = s.try_unwrap().unwrap_err();
        drop(s2);
        assert_eq!(p.in_use(), 1);
        let m = s.try_unwrap().unwrap();
        drop(m);
        assert_eq!(p.in_use(), 0);
    }
}
