//! Packet-buffer memory: hugepage regions, a lock-free object pool with per-core caches, and
//! `Mbuf`.
//!
//! # Layers
//!
//! ```text
//! Mbuf / RawMbuf / SharedMbuf   packet handles (mbuf)          header + headroom + data room
//!         |
//! lcache::{alloc, free, ..}     this thread's MbufCache per pool, found on demand (lcache)
//!         |
//! MbufPool + MbufCache          mbuf init, bulk alloc/free, lkey lookup (mbuf)
//!         |
//! PoolCache (per core)          plain array, no atomics on the fast path (cache)
//!         |
//! Mempool                       u32 indices in a lock-free ring, chunks, keys, audit (pool)
//!         |
//! Region                        hugepages (2 MiB / 1 GiB) or 4 KiB fallback, mlock (region)
//! ```
//!
//! - [`Region`]: one `mmap`, zero-filled, pre-faulted and locked. Hugepages when available; a
//!   single `tracing::warn!` per process when it falls back to 4 KiB pages.
//!   `PMD_NO_HUGEPAGES=1` forces the fallback.
//! - [`Mempool`]: `capacity()` fixed-size objects named by `u32` index; address = base +
//!   index x size. Free indices live in `crossbeam_queue::ArrayQueue`s: whole packs of 16
//!   indices travel as one element (one compare-and-swap), remainders one by one. Bulk gets are
//!   all-or-nothing; bulk puts never fail; an empty pool answers `false`/`None`, never blocks.
//! - [`PoolCache`]: DPDK's per-lcore cache. Each thread owns one (`Send`, not `Sync`); a bulk
//!   get or put is an inline copy of `u32`s, refilled from / flushed to the ring in whole packs
//!   (flush threshold 1.5 x size, as in DPDK). Dropping it returns what it holds.
//! - [`lcache`]: one [`MbufCache`] per pool per thread, kept in thread-local storage, so a
//!   polling core that receives on one port and sends on another frees into the cache it
//!   allocates from; flushed when the thread ends or on [`lcache::flush`]. Dropping an
//!   [`Mbuf`] frees it through that cache when the thread has one (else to the pool's
//!   ring), so the obvious code is the fast code; [`lcache::with_cache`] is re-entrant.
//! - Mbufs ([`mbuf`]): [`Mbuf`] is an owned, one-pointer handle (no reference counting; its
//!   header points back to the pool, and a pool dropped while mbufs are out is kept alive for
//!   them); [`RawMbuf`] is a `Copy` index for DPDK-style raw bursts.
//! - Pools shared between processes: a pool made with a shared file
//!   ([`PoolConfig::shared_file`], [`MbufPoolConfig::shared_file`]) keeps its free ring (DPDK's
//!   `rte_ring` algorithm), every process's cache slots and its audit states in that file,
//!   after the objects; other processes attach with [`Mempool::attach`] /
//!   [`MbufPool::attach`] at the same address, and a dead process's cached objects come back
//!   with [`Mempool::reclaim`]. See `shm.rs`.
//! - Memory registration: every chunk (at most `max_chunk_bytes`, because a NIC caps one
//!   registration) is announced to a hook that returns its key (lkey); the key of any object is a
//!   shift and an array load ([`Mempool::chunk_key`], [`MbufPool::chunk_key`]), and of any address
//!   a subtraction, a division and a load ([`Mempool::key_for_addr`]). See [`chunk`].
//! - Accounting: [`Mempool::in_use`] + [`Mempool::available`] == [`Mempool::capacity`] whenever
//!   the pool is idle (caches included). In debug builds and with the `audit` feature, every
//!   object's state is tracked and a double free or use after free panics naming the object.
//!
//! Logging uses `tracing` with target `mempool`. The datapath never logs, allocates, locks or
//! makes a system call; the per-core cache touches the shared ring only to refill or flush in
//! bulk.
//!
//! `unsafe` lives in three modules only: `region` (the `fstatfs` call), `shm` (views of a
//! shared pool's control block) and `mbuf` (raw views of headers and buffers). Every other module is `#![deny(unsafe_code)]`.
//!
//! # Example
//!
//! ```
//! use mempool::{Lkey, MbufPool, MbufPoolConfig, OffloadFlags, Registration, RawMbuf};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 4096 mbufs of 2048 data bytes; hugepages when the machine has them, else 4 KiB pages.
//! // Every chunk is registered, e.g. with ibv_reg_mr on a real NIC; here the key is made up.
//! let pool = MbufPool::new(
//!     MbufPoolConfig::new("rx0", 4096)
//!         .cache_size(256)
//!         .on_chunk(|chunk| Ok(Registration::new(Lkey(0x1000 + chunk.index as u32)))),
//! )?;
//! println!("pool on {} pages", pool.page_size());
//!
//! // Each polling thread owns a cache in front of the shared ring.
//! let mut cache = pool.cache();
//!
//! // Application path: owned handles with bounds-checked helpers.
//! let mut m = cache.alloc().expect("a fresh pool has free mbufs");
//! m.extend_from_slice(b"payload")?;
//! m.prepend(4)?.copy_from_slice(b"hdr:");
//! m.set_ol_flags(OffloadFlags::TX_IPV4 | OffloadFlags::TX_IP_CKSUM);
//! assert_eq!(&m[..], b"hdr:payload");
//! assert_eq!(m.chunk_key(), Some(Lkey(0x1000)));
//! m.free_to(&mut cache);
//!
//! // Driver path: raw bursts, a copy of 32 indices in and out of the cache.
//! let mut burst = [RawMbuf::default(); 32];
//! assert!(pool.alloc_bulk(&mut cache, &mut burst));
//! for &raw in &burst {
//!     let _post = (pool.rx_data_addr(raw), pool.data_room(), pool.chunk_key(raw));
//! }
//! assert_eq!(pool.in_use(), 32);
//! // SAFETY: the burst came from alloc_bulk above and is not used afterwards.
//! unsafe { pool.free_bulk(&mut cache, &burst) };
//!
//! drop(cache); // flushes the cache back to the ring
//! assert_eq!(pool.in_use(), 0);
//! assert_eq!(pool.available(), pool.capacity());
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod audit;
mod cache;
pub mod chunk;
mod error;
pub mod lcache;
pub mod mbuf;
mod offload;
mod pool;
pub mod region;
mod ring;
mod shm;

pub use audit::AUDIT_ENABLED;
pub use cache::PoolCache;
pub use chunk::{ChunkInfo, ChunkKeys, Iova, Lkey, Registration};
pub use error::{BoxError, Error};
pub use mbuf::{
    ChainError, Mbuf, MbufCache, MbufError, MbufFifo, MbufPool, MbufPoolConfig, RawMbuf, RxBufs,
    RxDesc, RxFields, RxRun, Segments, SharedMbuf, TxOffload, RX_RUN_MAX,
};
pub use offload::{CksumStatus, OffloadFlags};
pub use pool::{
    ChunkHook, Mempool, PoolConfig, SharedPoolInfo, DEFAULT_CACHE_SIZE, DEFAULT_MAX_CHUNK_BYTES,
    DEFAULT_OBJ_ALIGN, MAX_CACHE_SIZE, MAX_OBJECTS,
};
pub use region::{PagePolicy, PageSize, Region, RegionOptions, NO_HUGEPAGES_ENV};
pub use shm::CACHE_SLOTS;
