//! [`MbufFifo`]: the mbufs a TX queue has handed to a device, in posting order, freed in bulk
//! when their completion arrives.
//!
//! A transmit completion frees a run of packets at once. Freeing each through its chain walk
//! costs a call, a header read and a cache put per mbuf; DPDK returns a completion's mbufs with
//! one bulk put. The fifo does the same safely: when a packet is pushed it looks at the header
//! once (one segment of the fifo's own pool?) and keeps only the object index for those, so the
//! completion hands a run of indices to the per-core cache in one copy, without touching the
//! headers again (their free-state invariant already holds: one segment, refcnt 1). Anything
//! else (chains, mbufs of another pool) keeps its header pointer and goes back through the
//! chain walk.
#![allow(unsafe_code)]

use std::mem::ManuallyDrop;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::handle::Mbuf;
use super::header::{free_chain, MbufHeader, NO_SEG};
use super::index_ring::IndexRing;
use super::pool::{MbufCache, MbufPool};

/// Tag of a slot whose mbuf is not a single segment of the fifo's pool: its header pointer
/// is in `chains` at the same position. Object indices stay below it (pools hold fewer than
/// 2^31 objects).
const CHAIN: u32 = 1 << 31;

/// A bounded FIFO of owned mbufs (a power-of-two number of slots), for a TX queue's packets in
/// flight. Every mbuf in it is owned by it: popped, freed in bulk, or freed when it drops.
pub struct MbufFifo {
    pool: Arc<MbufPool>,
    /// The object index of a single segment of `pool`, else [`CHAIN`].
    ring: IndexRing,
    /// Header pointers of the [`CHAIN`] slots, by position.
    chains: Box<[usize]>,
    /// [`CHAIN`] slots held: while 0, a run is freed without looking at its slots.
    held_chains: u32,
}

// SAFETY: the fifo owns the mbufs its slots name exclusively (as `Mbuf` does, which is Send);
// moving it moves that ownership.
unsafe impl Send for MbufFifo {}

impl std::fmt::Debug for MbufFifo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MbufFifo({} of {})", self.len(), self.capacity())
    }
}

impl MbufFifo {
    /// A fifo of `n` slots whose fast path is for mbufs of `pool`.
    ///
    /// # Panics
    /// If `n` is not a power of two.
    pub fn new(pool: &Arc<MbufPool>, n: u32) -> Self {
        assert!(pool.capacity() < CHAIN, "pool too large for an mbuf fifo");
        Self {
            pool: Arc::clone(pool),
            ring: IndexRing::new(n, "mbuf fifo"),
            chains: vec![0; n as usize].into_boxed_slice(),
            held_chains: 0,
        }
    }

    /// Slots.
    pub fn capacity(&self) -> u32 {
        self.ring.capacity()
    }

    /// Mbufs held.
    #[inline]
    pub fn len(&self) -> u32 {
        self.ring.len()
    }

    /// Whether it holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Free slots.
    #[inline]
    pub fn free(&self) -> u32 {
        self.ring.free()
    }

    /// Mbufs pushed so far (free-running): the position the next push takes.
    #[inline]
    pub fn pushed(&self) -> u32 {
        self.ring.head
    }

    /// Mbufs taken out so far (free-running): the position of the oldest.
    #[inline]
    pub fn popped(&self) -> u32 {
        self.ring.tail
    }

    /// Appends `m`; gives it back when full.
    ///
    /// # Errors
    /// `m`, when the fifo is full.
    #[inline]
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.free() == 0 {
            return Err(m);
        }
        let mp = self.pool.mempool_ptr();
        self.store(self.ring.head, m, mp);
        self.ring.head = self.ring.head.wrapping_add(1);
        Ok(())
    }

    /// Appends every mbuf of `ms`, in order: [`MbufFifo::push`] for a run, with the pool
    /// identity and the room checked once.
    ///
    /// # Panics
    /// If `ms` holds more mbufs than the fifo has free slots (nothing is taken then).
    #[inline]
    pub fn push_all(&mut self, ms: impl ExactSizeIterator<Item = Mbuf>) {
        assert!(
            ms.len() <= self.free() as usize,
            "{} mbufs into a fifo with {} free slots",
            ms.len(),
            self.free()
        );
        let mp = self.pool.mempool_ptr();
        let mut head = self.ring.head;
        for m in ms {
            self.store(head, m, mp);
            head = head.wrapping_add(1);
        }
        self.ring.head = head;
    }

    /// Takes `m` into the slot of position `pos` (a free one; the caller moves `head`): its
    /// index when it is one segment of the pool `mp`, else [`CHAIN`] and its header pointer.
    #[inline]
    fn store(&mut self, pos: u32, m: Mbuf, mp: *const crate::pool::Mempool) {
        let h = m.h();
        let at = self.ring.at(pos);
        self.ring.slots[at] = if h.next == NO_SEG && ptr::eq(h.pool, mp) {
            h.index
        } else {
            self.chains[at] = m.hdr.as_ptr() as usize;
            self.held_chains += 1;
            CHAIN
        };
        // The fifo owns it now.
        let _ = ManuallyDrop::new(m);
    }

    /// Removes the oldest mbuf.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.is_empty() {
            return None;
        }
        let at = self.ring.at(self.ring.tail);
        self.ring.tail = self.ring.tail.wrapping_add(1);
        Some(self.take(at))
    }

    /// Frees the `n` oldest mbufs (all of them if fewer) through `cache`: a run of single
    /// segments of the fifo's pool in one bulk put, others one chain at a time.
    ///
    /// # Panics
    /// When `cache` belongs to another pool.
    #[inline]
    pub fn free_front(&mut self, n: u32, cache: &mut MbufCache) {
        assert!(
            ptr::eq(Arc::as_ptr(cache.pool()), Arc::as_ptr(&self.pool)),
            "mbuf cache of pool '{}' used with a fifo of pool '{}'",
            cache.pool().name(),
            self.pool.name()
        );
        let n = n.min(self.len());
        let at = self.ring.at(self.ring.tail);
        let first = (n as usize).min(self.ring.slots.len() - at);
        self.free_run(at, first, cache);
        self.free_run(0, n as usize - first, cache);
        self.ring.tail = self.ring.tail.wrapping_add(n);
    }

    /// Frees slots `at..at + n` (not wrapping): in one bulk put when they are all single
    /// segments of the pool (the common case), else one by one.
    #[inline]
    fn free_run(&mut self, at: usize, n: usize, cache: &mut MbufCache) {
        let run = &self.ring.slots[at..at + n];
        if self.held_chains == 0 {
            cache.inner.put_bulk(run);
            return;
        }
        for k in at..at + n {
            if self.ring.slots[k] == CHAIN {
                self.held_chains -= 1;
                // SAFETY: a CHAIN slot's pointer is the header of a chain the fifo owns
                // (`push`); the slot is being consumed (the caller moves `tail` past it), so
                // the chain is freed once.
                unsafe { free_chain(Self::ptr_of(self.chains[k]), Some(&mut cache.inner)) };
            } else {
                cache.inner.put(self.ring.slots[k]);
            }
        }
    }

    /// The header pointer of a pointer slot.
    #[inline]
    fn ptr_of(p: usize) -> NonNull<MbufHeader> {
        debug_assert!(p != 0);
        // SAFETY: `chains` holds the non-null header pointer of an owned `Mbuf` (`push`).
        unsafe { NonNull::new_unchecked(p as *mut MbufHeader) }
    }

    /// The owned mbuf a consumed slot names.
    #[inline]
    fn take(&mut self, at: usize) -> Mbuf {
        let slot = self.ring.slots[at];
        if slot == CHAIN {
            self.held_chains -= 1;
            Mbuf {
                hdr: Self::ptr_of(self.chains[at]),
            }
        } else {
            // SAFETY: an index slot names a single segment of `pool` the fifo owned (`push`);
            // the slot was just consumed, so ownership passes to the returned handle once.
            unsafe { self.pool.from_raw(super::RawMbuf(slot)) }
        }
    }
}

impl Drop for MbufFifo {
    fn drop(&mut self) {
        while let Some(m) = self.pop() {
            drop(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mbuf::test_pool as pool;
    use crate::{MbufPoolConfig, PagePolicy};

    #[test]
    fn single_segments_go_back_in_bulk_and_chains_one_by_one() {
        let p = pool(64);
        let other = pool(8);
        let mut c = p.cache();
        let mut f = MbufFifo::new(&p, 16);
        for k in 0..10u8 {
            let mut m = c.alloc().unwrap();
            m.extend_from_slice(&[k; 60]).unwrap();
            if k == 3 {
                m.chain(c.alloc().unwrap()).unwrap();
            }
            f.push(if k == 5 { other.alloc().unwrap() } else { m })
                .unwrap();
        }
        // Nine of `p` (one a chain of two; the fifth was dropped for one of `other`).
        assert_eq!((f.len(), p.in_use(), other.in_use()), (10, 10, 1));
        let m = f.pop().unwrap();
        assert_eq!(m.data()[0], 0, "oldest first, data intact");
        m.free_to(&mut c);
        f.free_front(4, &mut c);
        assert_eq!(p.in_use(), 10 - 1 - 5, "the chain of two went too");
        f.free_front(100, &mut c);
        assert!(f.is_empty());
        assert_eq!((p.in_use(), other.in_use()), (0, 0));
    }

    #[test]
    fn push_all_takes_a_run_in_order() {
        let p = pool(64);
        let mut c = p.cache();
        let mut f = MbufFifo::new(&p, 8);
        let mut v = Vec::new();
        for k in 0..6u8 {
            let mut m = c.alloc().unwrap();
            m.extend_from_slice(&[k; 10]).unwrap();
            if k == 2 {
                m.chain(c.alloc().unwrap()).unwrap();
            }
            v.push(m);
        }
        f.push_all(v.drain(..));
        assert_eq!(f.len(), 6);
        for k in 0..6u8 {
            assert_eq!(f.pop().unwrap().data()[0], k);
        }
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn a_full_fifo_refuses_and_a_dropped_one_frees_everything() {
        let p =
            MbufPool::new(MbufPoolConfig::new("fifo", 16).page_policy(PagePolicy::Normal)).unwrap();
        let mut f = MbufFifo::new(&p, 4);
        for _ in 0..4 {
            f.push(p.alloc().unwrap()).unwrap();
        }
        let extra = f.push(p.alloc().unwrap()).unwrap_err();
        drop(extra);
        assert_eq!(f.pushed().wrapping_sub(f.popped()), 4);
        drop(f);
        assert_eq!(p.in_use(), 0);
    }
}

#[cfg(test)]
mod model_tests {
    use super::*;
    use crate::mbuf::test_pool as pool;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone)]
    enum Op {
        /// Push one mbuf: 0 single segment, 1 a chain of two, 2 from another pool.
        Push(u8),
        /// Push a run of single segments.
        PushAll(u8),
        Pop,
        FreeFront(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3).prop_map(Op::Push),
            (1u8..6).prop_map(Op::PushAll),
            Just(Op::Pop),
            (0u8..8).prop_map(Op::FreeFront),
        ]
    }

    proptest! {
        /// Against a plain queue of tags: every mbuf comes out in order with its data (pop) or
        /// goes back to its own pool (free_front, drop), whatever mix of single segments,
        /// chains and foreign mbufs; both pools end whole.
        #[test]
        fn the_fifo_behaves_as_a_queue_and_loses_nothing(ops in proptest::collection::vec(op(), 1..80)) {
            let p = pool(256);
            let other = pool(64);
            let mut c = p.cache();
            let mut f = MbufFifo::new(&p, 16);
            let mut model: VecDeque<u8> = VecDeque::new();
            let mut tag = 0u8;
            let mut make = |kind: u8, c: &mut MbufCache| {
                tag = tag.wrapping_add(1);
                let mut m = if kind == 2 { other.alloc().unwrap() } else { c.alloc().unwrap() };
                m.extend_from_slice(&[tag; 8]).unwrap();
                if kind == 1 {
                    m.chain(c.alloc().unwrap()).unwrap();
                }
                (tag, m)
            };
            for o in ops {
                match o {
                    Op::Push(kind) => {
                        let (t, m) = make(kind, &mut c);
                        match f.push(m) {
                            Ok(()) => model.push_back(t),
                            Err(m) => { prop_assert_eq!(model.len(), 16); drop(m); }
                        }
                    }
                    Op::PushAll(n) => {
                        let room = (f.free() as usize).min(usize::from(n));
                        let run: Vec<_> = (0..room).map(|_| make(0, &mut c)).collect();
                        model.extend(run.iter().map(|(t, _)| *t));
                        f.push_all(run.into_iter().map(|(_, m)| m));
                    }
                    Op::Pop => match (f.pop(), model.pop_front()) {
                        (Some(m), Some(t)) => { prop_assert_eq!(m.data()[0], t); m.free_to(&mut c); }
                        (None, None) => {}
                        (a, b) => prop_assert!(false, "fifo {:?} model {:?}", a.is_some(), b),
                    },
                    Op::FreeFront(n) => {
                        f.free_front(u32::from(n), &mut c);
                        for _ in 0..usize::from(n).min(model.len()) {
                            model.pop_front();
                        }
                    }
                }
                prop_assert_eq!(f.len() as usize, model.len());
            }
            drop(f);
            drop(c);
            prop_assert_eq!((p.in_use(), other.in_use()), (0, 0));
        }
    }
}
