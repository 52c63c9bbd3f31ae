//! [`RxBufs`]: the buffers an RX queue has posted to a device, in posting order.
//!
//! Refilling takes free objects from the per-core cache in one bulk copy of their indices,
//! without touching their headers (free objects already hold the free-state invariant: one
//! segment, refcnt 1); the driver reads each one's data address to post it. When the device
//! has filled the oldest, [`RxBufs::pop_received`] writes the header once, with what the
//! completion said, instead of a reset followed by the driver's own stores (what DPDK's
//! vector RX paths do with their raw bulk allocation and one rearm store).
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::Arc;

use super::handle::{Mbuf, RawMbuf};
use super::header::{MbufHeader, MBUF_HEADER_BYTES, NO_SEG};
use super::index_ring::IndexRing;
use super::pool::{MbufCache, MbufPool};
use crate::offload::OffloadFlags;

/// What a completion says of a received packet, written into its header by
/// [`RxBufs::pop_received`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxFields {
    /// Offload flags (checksum status, hash and VLAN flags).
    pub ol_flags: OffloadFlags,
    /// RSS hash (meaningful with `RX_RSS_HASH`).
    pub rss_hash: u32,
    /// VLAN TCI (meaningful with `RX_VLAN`).
    pub vlan_tci: u16,
    /// Receiving port.
    pub port: u16,
}

/// What a completion says of one received packet, for [`RxBufs::pop_run`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxDesc {
    /// The packet's length.
    pub len: u32,
    /// Offload flags (checksum status, hash and VLAN flags).
    pub ol_flags: OffloadFlags,
    /// RSS hash (meaningful with `RX_RSS_HASH`).
    pub rss_hash: u32,
    /// VLAN TCI (meaningful with `RX_VLAN`).
    pub vlan_tci: u16,
}

/// Most buffers one [`RxBufs::pop_run`] takes.
pub const RX_RUN_MAX: u32 = 64;

/// What one [`RxBufs::pop_run`] appended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxRun {
    /// Packets whose length exceeded the data room (in the output, cut to the room).
    pub too_long: u32,
    /// The packets' lengths, summed (those too long counted as the room).
    pub bytes: u64,
}

/// A bounded FIFO of posted receive buffers (a power-of-two number of slots), each a free
/// object of one pool that the fifo owns until it is popped.
pub struct RxBufs {
    pool: Arc<MbufPool>,
    /// The posted buffers' object indices, oldest at `tail`.
    ring: IndexRing,
    /// Data room of every buffer (from the data offset at the headroom to the end).
    room: u32,
    /// The data address of object 0, and the distance between objects.
    addr0: usize,
    obj_size: usize,
    /// The header address of object 0 (the pool's region base, never null).
    hdr0: usize,
    /// Objects in the pool (every slot's index is below it).
    count: u32,
    /// The pool's headroom (every object's data offset when it is received into).
    headroom: u16,
}

impl std::fmt::Debug for RxBufs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxBufs({} of {})", self.len(), self.capacity())
    }
}

impl RxBufs {
    /// Room for `n` buffers of `pool`.
    ///
    /// # Panics
    /// If `n` is not a power of two.
    pub fn new(pool: &Arc<MbufPool>, n: u32) -> Self {
        Self {
            pool: Arc::clone(pool),
            ring: IndexRing::new(n, "rx buffer ring"),
            room: u32::from(pool.data_room()),
            addr0: pool.rx_data_addr(RawMbuf(0)),
            obj_size: pool.obj_size(),
            hdr0: pool.buf_addr(RawMbuf(0)) - MBUF_HEADER_BYTES,
            count: pool.capacity(),
            headroom: pool.headroom(),
        }
    }

    /// Slots.
    pub fn capacity(&self) -> u32 {
        self.ring.capacity()
    }

    /// Buffers held.
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

    /// Buffers added so far (free-running): the position the next one takes.
    #[inline]
    pub fn pushed(&self) -> u32 {
        self.ring.head
    }

    /// Buffers taken out so far (free-running): the position of the oldest.
    #[inline]
    pub fn popped(&self) -> u32 {
        self.ring.tail
    }

    /// The data room of every buffer: the most a packet can be.
    pub fn room(&self) -> u32 {
        self.room
    }

    /// Adds `n` buffers from `cache` (at most the free slots) in one bulk get, or nothing
    /// and returns `false` when the pool cannot supply them. Their headers are not touched.
    ///
    /// # Panics
    /// When `cache` belongs to another pool, or `n` exceeds the free slots.
    #[inline]
    pub fn refill(&mut self, cache: &mut MbufCache, n: u32) -> bool {
        assert!(
            std::ptr::eq(Arc::as_ptr(cache.pool()), Arc::as_ptr(&self.pool)),
            "mbuf cache of pool '{}' used with rx buffers of pool '{}'",
            cache.pool().name(),
            self.pool.name()
        );
        assert!(
            n <= self.free(),
            "{n} rx buffers into {} free slots",
            self.free()
        );
        let at = self.ring.at(self.ring.head);
        let first = (n as usize).min(self.ring.slots.len() - at);
        let rest = n as usize - first;
        if rest == 0 {
            if !cache.inner.get_bulk(&mut self.ring.slots[at..at + first]) {
                return false;
            }
        } else {
            let mut tmp = [0u32; 64];
            let mut done = 0;
            // Across the wrap: through a small buffer, in pieces, all or nothing.
            while done < n as usize {
                let k = (n as usize - done).min(tmp.len());
                if !cache.inner.get_bulk(&mut tmp[..k]) {
                    for i in 0..done {
                        let at = self.ring.at(self.ring.head.wrapping_add(i as u32));
                        cache.inner.put(self.ring.slots[at]);
                    }
                    return false;
                }
                for (i, &v) in tmp[..k].iter().enumerate() {
                    let at = self.ring.at(self.ring.head.wrapping_add((done + i) as u32));
                    self.ring.slots[at] = v;
                }
                done += k;
            }
        }
        self.ring.head = self.ring.head.wrapping_add(n);
        true
    }

    /// The object index of the buffer at free-running position `pos` (one held: from
    /// [`RxBufs::popped`] to [`RxBufs::pushed`]), for its chunk's memory key.
    #[inline]
    pub fn index_at(&self, pos: u32) -> u32 {
        debug_assert!(pos.wrapping_sub(self.ring.tail) < self.len());
        self.ring.slots[self.ring.at(pos)]
    }

    /// Where the device writes the packet in the buffer at position `pos`: its data room,
    /// after the headroom.
    #[inline]
    pub fn data_addr(&self, pos: u32) -> usize {
        self.addr0 + self.index_at(pos) as usize * self.obj_size
    }

    /// Calls `f(k, addr)` with the data address of each of the `n` buffers from position
    /// `from` on (held ones, oldest first), `k` counting from 0: to post them.
    ///
    /// # Panics
    /// If `n` exceeds the capacity.
    #[inline]
    pub fn for_each_data_addr(&self, from: u32, n: u32, mut f: impl FnMut(usize, usize)) {
        let (a, b) = self.ring.run(from, n);
        let (addr0, obj_size) = (self.addr0, self.obj_size);
        for (k, &idx) in a.iter().enumerate() {
            f(k, addr0 + idx as usize * obj_size);
        }
        for (k, &idx) in b.iter().enumerate() {
            f(a.len() + k, addr0 + idx as usize * obj_size);
        }
    }

    /// Removes the buffers added last, from position `from` on (a refill that could not post
    /// them all), back into `cache`.
    pub fn give_back_from(&mut self, from: u32, cache: &mut MbufCache) {
        while self.ring.head != from && self.ring.head != self.ring.tail {
            self.ring.head = self.ring.head.wrapping_sub(1);
            cache
                .inner
                .put(self.ring.slots[self.ring.at(self.ring.head)]);
        }
    }

    /// Removes the oldest buffer as a received packet of `len` bytes at the start of its data
    /// room, its header written once: data offset at the headroom, one segment, lengths
    /// `len`, `fields`, timestamp and TX offload lengths cleared. `None` when empty.
    ///
    /// # Errors
    /// `Err(mbuf)` (reset, length 0) when `len` exceeds the data room: the caller counts
    /// and frees it.
    #[inline]
    pub fn pop_received(&mut self, len: u32, fields: &RxFields) -> Option<Result<Mbuf, Mbuf>> {
        if self.is_empty() {
            return None;
        }
        let idx = self.ring.slots[self.ring.at(self.ring.tail)];
        self.ring.tail = self.ring.tail.wrapping_add(1);
        debug_assert!(idx < self.count);
        self.pool.audit_in_use(idx, "RxBufs::pop_received");
        let hdr = (self.hdr0 + idx as usize * self.obj_size) as *mut MbufHeader;
        // `idx` is a free object of `pool` the fifo owned since `refill` took it from the
        // cache; its slot was just consumed, so ownership passes to this handle once. Its
        // header is at the region base plus `idx` objects (the pool's own arithmetic, with the
        // base and size read once at creation).
        let mut m = Mbuf {
            // SAFETY: the region base is not null and `idx` is below the object count, so the
            // address is inside the region and not null.
            hdr: unsafe { NonNull::new_unchecked(hdr) },
        };
        let ok = len <= self.room;
        let d = RxDesc {
            len: if ok { len } else { 0 },
            ol_flags: if ok {
                fields.ol_flags
            } else {
                OffloadFlags::empty()
            },
            rss_hash: fields.rss_hash,
            vlan_tci: fields.vlan_tci,
        };
        write_received(m.h_mut(), self.rearm(fields.port), &d);
        Some(if ok { Ok(m) } else { Err(m) })
    }

    /// Removes the `n` oldest buffers (at most [`RX_RUN_MAX`]) as received packets, oldest
    /// first, and appends them to `out`: for the `k`-th, `desc(k)` says what the completion
    /// said. Each header is written as [`RxBufs::pop_received`] writes it, in six 8-byte
    /// stores (the layout is pinned below). A packet whose length exceeds the data room is
    /// appended too, its length cut to the room, and counted in the returned
    /// [`RxRun::too_long`] (and its cut length in [`RxRun::bytes`]): the caller takes it out,
    /// frees and counts it.
    ///
    /// # Panics
    /// If fewer than `n` buffers are held, `n` exceeds [`RX_RUN_MAX`] or `out`'s spare capacity.
    #[inline]
    pub fn pop_run(
        &mut self,
        n: u32,
        port: u16,
        out: &mut Vec<Mbuf>,
        mut desc: impl FnMut(usize) -> RxDesc,
    ) -> RxRun {
        assert!(
            n <= self.len() && n <= RX_RUN_MAX && n as usize <= out.capacity() - out.len(),
            "{n} rx buffers popped of {} into {} free",
            self.len(),
            out.capacity() - out.len()
        );
        let rearm = self.rearm(port);
        let tail = self.ring.tail;
        // (Taken first: should `desc` panic, the buffers not yet handed out leak, none is
        // owned twice.)
        self.ring.tail = tail.wrapping_add(n);
        let (a, b) = self.ring.run(tail, n);
        let (room, hdr0, obj_size, count) = (self.room, self.hdr0, self.obj_size, self.count);
        let pool = &self.pool;
        let mut run = RxRun::default();
        let mut k = 0usize;
        let mut one = |idx: u32| {
            debug_assert!(idx < count);
            pool.audit_in_use(idx, "RxBufs::pop_run");
            let hdr = (hdr0 + idx as usize * obj_size) as *mut MbufHeader;
            let d = desc(k);
            k += 1;
            // A length over the room is cut to it (the caller frees that packet).
            let len = d.len.min(room);
            run.too_long += u32::from(d.len > room);
            run.bytes += u64::from(len);
            let d = RxDesc { len, ..d };
            // SAFETY: `idx` is a free object of `pool` the fifo owned since `refill` took it
            // from the cache (as in `pop_received`); its slot was consumed above, so no one
            // else reads or writes its header, which is inside the region (an index below
            // the object count from the region base).
            write_received(unsafe { &mut *hdr }, rearm, &d);
            Mbuf {
                // SAFETY: the region base is not null and `idx` is below the object count.
                hdr: unsafe { NonNull::new_unchecked(hdr) },
            }
        };
        out.extend(a.iter().map(|&idx| one(idx)));
        out.extend(b.iter().map(|&idx| one(idx)));
        run
    }

    /// Removes the oldest buffer, reset (length 0): to drop it or post it again.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        self.pop_received(0, &RxFields::default()).map(|r| match r {
            Ok(m) | Err(m) => m,
        })
    }
}

impl RxBufs {
    /// The first header word of a received packet of port `port`: data offset at the
    /// headroom, refcnt 1, one segment, the port.
    #[inline]
    fn rearm(&self, port: u16) -> u64 {
        u64::from(self.headroom) | 1 << 16 | 1 << 32 | u64::from(port) << 48
    }
}

/// Writes the header of a received packet: `rearm` ([`RxBufs::rearm`]), then `d`'s length,
/// flags, tag and hash, with the timestamp and TX offload lengths cleared, in six 8-byte
/// stores (the layout is pinned below). `d.len` fits 16 bits (at most the data room). Free
/// objects keep next = none, one segment and refcnt 1, which the words restate.
#[inline(always)]
fn write_received(h: &mut MbufHeader, rearm: u64, d: &RxDesc) {
    let w = std::ptr::from_mut(h).cast::<u64>();
    // SAFETY: `h` is an exclusive reference to a 128-byte, 64-byte aligned header; the six
    // stores cover its bytes 0..48, the fields the layout asserts below place there.
    unsafe {
        w.write(rearm);
        w.add(1).write(d.ol_flags.bits());
        // pkt_len and data_len, then the VLAN TCI.
        w.add(2)
            .write((u64::from(d.len) * 0x1_0000_0001) | (u64::from(d.vlan_tci) << 48));
        w.add(3)
            .write(u64::from(d.rss_hash) | u64::from(NO_SEG) << 32);
        w.add(4).write(0);
        w.add(5).write(0);
    }
}

impl Drop for RxBufs {
    fn drop(&mut self) {
        while let Some(m) = self.pop() {
            drop(m);
        }
    }
}

const _: () = {
    use std::mem::offset_of;
    assert!(MBUF_HEADER_BYTES == 128);
    // The words `pop_run` stores, on a little-endian host.
    assert!(cfg!(target_endian = "little"));
    assert!(offset_of!(MbufHeader, data_off) == 0);
    assert!(offset_of!(MbufHeader, refcnt) == 2);
    assert!(offset_of!(MbufHeader, nb_segs) == 4);
    assert!(offset_of!(MbufHeader, port) == 6);
    assert!(offset_of!(MbufHeader, ol_flags) == 8);
    assert!(offset_of!(MbufHeader, pkt_len) == 16);
    assert!(offset_of!(MbufHeader, data_len) == 20);
    assert!(offset_of!(MbufHeader, vlan_tci) == 22);
    assert!(offset_of!(MbufHeader, rss_hash) == 24);
    assert!(offset_of!(MbufHeader, next) == 28);
    assert!(offset_of!(MbufHeader, timestamp) == 32);
    assert!(offset_of!(MbufHeader, l2_len) == 40);
    assert!(offset_of!(MbufHeader, l4_len) == 41);
    assert!(offset_of!(MbufHeader, l3_len) == 42);
    assert!(offset_of!(MbufHeader, tso_segsz) == 44);
    assert!(offset_of!(MbufHeader, index) == 48);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mbuf::test_pool as pool;
    use crate::{CksumStatus, MbufPoolConfig, PagePolicy};

    /// Gives `n` objects of `c`'s pool a previous life (offsets, flags, a timestamp, TX
    /// lengths) and frees them back into `c`.
    fn dirty(c: &mut MbufCache, n: usize) {
        let ms: Vec<Mbuf> = (0..n)
            .map(|_| {
                let mut m = c.alloc().unwrap();
                m.extend_from_slice(&[1; 100]).unwrap();
                m.adj(10).unwrap();
                m.set_ol_flags(OffloadFlags::TX_TCP_SEG);
                m.set_timestamp(7);
                m.set_tx_offload(crate::TxOffload {
                    l2_len: 14,
                    l3_len: 20,
                    l4_len: 20,
                    tso_segsz: 1000,
                });
                m
            })
            .collect();
        for m in ms {
            m.free_to(c);
        }
    }

    #[test]
    fn buffers_come_back_as_packets_with_their_fields_and_nothing_stale() {
        let p = pool(64);
        let mut c = p.cache();
        dirty(&mut c, 8);
        let mut r = RxBufs::new(&p, 8);
        assert!(r.refill(&mut c, 6));
        assert_eq!((r.len(), p.in_use()), (6, 6));
        let addr = r.data_addr(r.popped());
        let mut fl = OffloadFlags::RX_RSS_HASH;
        fl.set_rx_ip_cksum(CksumStatus::Good);
        let f = RxFields {
            ol_flags: fl,
            rss_hash: 0x1234,
            vlan_tci: 5,
            port: 3,
        };
        let m = r.pop_received(60, &f).unwrap().unwrap();
        assert_eq!(m.data_addr(), addr);
        assert_eq!((m.len(), m.pkt_len(), m.nb_segs()), (60, 60, 1));
        assert_eq!((m.ol_flags(), m.rss_hash(), m.port()), (fl, 0x1234, 3));
        assert_eq!(
            (m.timestamp(), m.tx_offload()),
            (0, crate::TxOffload::default())
        );
        assert_eq!(m.headroom(), usize::from(p.headroom()));
        let too_long = r.pop_received(r.room() + 1, &f).unwrap().unwrap_err();
        assert_eq!(
            (too_long.len(), too_long.ol_flags()),
            (0, OffloadFlags::empty())
        );
        drop((m, too_long));
        // Wrap: 4 held, 6 more in a ring of 8 is too many; 4 is fine and wraps.
        assert!(r.refill(&mut c, 4));
        let from = r.pushed().wrapping_sub(2);
        r.give_back_from(from, &mut c);
        assert_eq!(r.len(), 6);
        drop(r);
        drop(c);
        assert_eq!(p.in_use(), 0);
    }

    /// `pop_run` writes what `pop_received` writes (from dirty objects, across the ring's
    /// wrap), cuts a length over the room and counts it, and sums the lengths.
    #[test]
    fn a_run_pops_in_order_with_the_headers_pop_received_writes() {
        let p = pool(64);
        let mut c = p.cache();
        dirty(&mut c, 16);
        let (mut a, mut b) = (RxBufs::new(&p, 8), RxBufs::new(&p, 8));
        // Move both rings' positions near the end so that the run wraps.
        for r in [&mut a, &mut b] {
            assert!(r.refill(&mut c, 6));
            while r.pop().is_some() {}
            assert!(r.refill(&mut c, 8));
        }
        let fields = |k: usize| {
            let mut fl = OffloadFlags::RX_RSS_HASH;
            fl.set_rx_ip_cksum(CksumStatus::Good);
            RxDesc {
                len: if k == 3 { a.room() + 5 } else { 60 + k as u32 },
                ol_flags: fl,
                rss_hash: 0x1000 + k as u32,
                vlan_tci: k as u16,
            }
        };
        let want: Vec<_> = (0..8).map(fields).collect();
        let addrs: Vec<usize> = (0..8)
            .map(|k| a.data_addr(a.popped().wrapping_add(k)))
            .collect();
        let mut out = Vec::with_capacity(8);
        let run = a.pop_run(8, 9, &mut out, |k| want[k]);
        assert_eq!(run.too_long, 1);
        assert_eq!(
            run.bytes,
            (0..8)
                .map(|k| u64::from(want[k].len.min(a.room())))
                .sum::<u64>()
        );
        for (k, m) in out.iter().enumerate() {
            let d = want[k];
            let f = RxFields {
                ol_flags: d.ol_flags,
                rss_hash: d.rss_hash,
                vlan_tci: d.vlan_tci,
                port: 9,
            };
            let r = b.pop_received(d.len.min(a.room()), &f).unwrap().unwrap();
            assert_eq!(m.data_addr(), addrs[k]);
            let view = |m: &Mbuf| {
                (
                    m.headroom(),
                    m.len(),
                    m.pkt_len(),
                    m.nb_segs(),
                    m.port(),
                    m.ol_flags(),
                    m.rss_hash(),
                    m.vlan_tci(),
                    m.timestamp(),
                    m.tx_offload(),
                )
            };
            assert_eq!(view(m), view(&r), "packet {k}");
        }
        assert_eq!(a.len(), 0);
        drop((out, a, b, c));
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn a_refill_the_pool_cannot_supply_takes_nothing() {
        let p = MbufPool::new(
            MbufPoolConfig::new("rxbufs", 8)
                .cache_size(0)
                .page_policy(PagePolicy::Normal),
        )
        .unwrap();
        let mut c = p.cache();
        let mut r = RxBufs::new(&p, 16);
        assert!(r.refill(&mut c, 6));
        assert!(!r.refill(&mut c, 4));
        assert_eq!((r.len(), p.in_use()), (6, 6));
        drop(r);
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
        Refill(u8),
        Receive(u16),
        Pop,
        GiveBack(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..12).prop_map(Op::Refill),
            (0u16..2200).prop_map(Op::Receive),
            Just(Op::Pop),
            (0u8..4).prop_map(Op::GiveBack),
        ]
    }

    proptest! {
        /// Against a plain queue of the data addresses handed out at refill: buffers come back
        /// in posting order at the address the device was told, a length over the data room
        /// comes back as an error with nothing set, and the pool ends whole.
        #[test]
        fn posted_buffers_come_back_in_order_where_they_were_posted(
            ops in proptest::collection::vec(op(), 1..80)
        ) {
            let p = pool(64);
            let mut c = p.cache();
            let mut r = RxBufs::new(&p, 16);
            let mut model: VecDeque<usize> = VecDeque::new();
            let fields = RxFields { port: 1, ..Default::default() };
            for o in ops {
                match o {
                    Op::Refill(n) => {
                        let n = u32::from(n).min(r.free());
                        let from = r.pushed();
                        if r.refill(&mut c, n) {
                            for k in 0..n {
                                model.push_back(r.data_addr(from.wrapping_add(k)));
                            }
                        }
                    }
                    Op::Receive(len) => match (r.pop_received(u32::from(len), &fields), model.pop_front()) {
                        (Some(Ok(m)), Some(a)) => {
                            prop_assert!(u32::from(len) <= r.room());
                            prop_assert_eq!((m.data_addr(), m.len(), m.port()), (a, usize::from(len), 1));
                        }
                        (Some(Err(m)), Some(a)) => {
                            prop_assert!(u32::from(len) > r.room());
                            prop_assert_eq!((m.data_addr(), m.len()), (a, 0));
                        }
                        (None, None) => {}
                        (a, b) => prop_assert!(false, "rx {:?} model {:?}", a.is_some(), b),
                    },
                    Op::Pop => {
                        prop_assert_eq!(r.pop().map(|m| m.data_addr()), model.pop_front());
                    }
                    Op::GiveBack(n) => {
                        let n = u32::from(n).min(r.len());
                        r.give_back_from(r.pushed().wrapping_sub(n), &mut c);
                        for _ in 0..n {
                            model.pop_back();
                        }
                    }
                }
                prop_assert_eq!(r.len() as usize, model.len());
            }
            drop(r);
            drop(c);
            prop_assert_eq!(p.in_use(), 0);
        }
    }
}
