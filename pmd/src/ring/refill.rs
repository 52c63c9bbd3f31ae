//! The RX refill loop both drivers run: buffers from the pool into the ring of posted
//! buffers in bulks, each bulk's WQEs written by the driver, what it could not post given
//! back. The WQE format and the doorbell stay the driver's ([`PostRx`]).
#![deny(unsafe_code)]

use mempool::lcache::with_cache;
use mempool::{MbufPool, RxBufs};
use std::sync::Arc;

/// What an RX queue gives the refill loop.
pub(crate) trait PostRx {
    /// Its posted buffers and the pool they come from.
    fn bufs_and_pool(&mut self) -> (&mut RxBufs, &Arc<MbufPool>);
    /// Writes the WQEs of the `n` buffers from position `from` of its buffers and advances
    /// the ring; returns how many it wrote (fewer when a buffer lies in no registered chunk).
    fn post_wqes(&mut self, from: u32, n: u32) -> u32;
    /// Counts a buffer that lay in no registered chunk (an error: it and the ones after it
    /// go back to the pool).
    fn count_unkeyed(&mut self);
}

/// Posts up to `n` buffers (no more than the ring has free) in bulks of `bulk`: each bulk
/// taken from the calling thread's cache of the pool, its WQEs written by the queue. Stops
/// when the pool runs dry or a buffer has no key (that one and the rest of its bulk go
/// back). Returns the buffers not posted and whether any were (the caller rings the
/// doorbell once).
#[inline]
pub(crate) fn refill<Q: PostRx>(q: &mut Q, n: u32, bulk: u32) -> (u32, bool) {
    let mut left = n.min(q.bufs_and_pool().0.free());
    let mut posted = false;
    while left > 0 {
        let k = left.min(bulk);
        let (bufs, pool) = q.bufs_and_pool();
        let from = bufs.pushed();
        if !with_cache(pool, |cache| bufs.refill(cache, k)) {
            break;
        }
        let done = q.post_wqes(from, k);
        posted |= done > 0;
        if done < k {
            q.count_unkeyed();
            let (bufs, pool) = q.bufs_and_pool();
            with_cache(pool, |cache| {
                bufs.give_back_from(from.wrapping_add(done), cache)
            });
            break;
        }
        left -= k;
    }
    (left, posted)
}
