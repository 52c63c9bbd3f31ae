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
//! The header stores a pointer to the pool's [`Mempool`](crate::Mempool), so an `Mbuf` is one
//! pointer wide and costs no reference-count traffic. The pool is kept alive for outstanding
//! buffers: dropping the last [`MbufPool`] handle while mbufs are still out leaks the pool
//! (memory stays mapped, with a warning) instead of freeing memory that they point into.
//!
//! # Free-state invariant
//!
//! A free mbuf has `refcnt == 1`, `nb_segs == 1`, no next segment, and `data_off + data_len <=
//! buf_len`. [`MbufPool::alloc_bulk`] (like DPDK's raw bulk get) does not reset the other
//! metadata; [`MbufCache::alloc`], [`MbufPool::alloc`] and [`MbufPool::alloc_mbufs`] do.
//!
//! # Files
//!
//! - `header.rs`: the in-buffer header layout (pinned by const asserts), its reset, pointer
//!   arithmetic from a header to its buffer, and freeing a chain segment by segment;
//! - `pool.rs`: [`MbufPoolConfig`], [`MbufPool`] (header init, bulk alloc/free, keys) and
//!   [`MbufCache`];
//! - `handle.rs`: [`Mbuf`] and its data and metadata access, [`Segments`], [`RawMbuf`],
//!   [`TxOffload`];
//! - `shared.rs`: [`SharedMbuf`], the reference-counted read-only handle;
//! - `error.rs`: [`MbufError`] and [`ChainError`].
//!
//! Unsafe code (only in `header.rs`, `pool.rs`, `handle.rs` and `shared.rs`): header and
//! buffer access through pointers into the pool's region, the `u32` view of `[RawMbuf]`, and
//! `Send`/`Sync` for the handles.
#![deny(unsafe_code)]

mod error;
mod fifo;
mod handle;
mod header;
mod index_ring;
mod pool;
mod rxbufs;
mod shared;

pub use error::{ChainError, MbufError};
pub use fifo::MbufFifo;
pub use handle::{Mbuf, RawMbuf, Segments, TxOffload};
pub(crate) use header::{register_shared, unregister_shared};
pub use header::{
    DEFAULT_DATA_ROOM, DEFAULT_HEADROOM, MBUF_HEADER_BYTES, PORT_INVALID, USER_AREA_BYTES,
};
pub use pool::{MbufCache, MbufPool, MbufPoolConfig};
pub use rxbufs::{RxBufs, RxDesc, RxFields, RxRun, RX_RUN_MAX};
pub use shared::SharedMbuf;

/// A small pool on 4 KiB pages for the unit tests of this module.
#[cfg(test)]
fn test_pool(n: u32) -> std::sync::Arc<MbufPool> {
    MbufPool::new(
        MbufPoolConfig::new("m", n)
            .cache_size((n * 2 / 3).min(8))
            .page_policy(crate::PagePolicy::Normal),
    )
    .unwrap()
}
