//! [`Mbuf`], the owned packet handle: its data and metadata access, length helpers, chains
//! ([`Segments`]); [`RawMbuf`], the `Copy` index for raw bursts; [`TxOffload`].
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};
use std::slice;

use super::error::{ChainError, MbufError};
use super::header::{
    buf_ptr, data_ptr, free_chain, seg_ptr, MbufHeader, MBUF_HEADER_BYTES, NO_SEG, USER_AREA_BYTES,
};
use super::pool::MbufCache;
use crate::offload::OffloadFlags;
use crate::pool::Mempool;

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

/// An mbuf named by its object index: `Copy`, 4 bytes, for DPDK-style raw bursts.
///
/// It carries no ownership. [`MbufPool::alloc_bulk`](super::MbufPool::alloc_bulk) hands out
/// indices the caller then owns; everything that relies on that ownership is `unsafe`. Only
/// meaningful with the pool that produced it. `RawMbuf::default()` is index 0, a placeholder
/// for burst arrays.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawMbuf(pub(super) u32);

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

/// `raws` as the object indices they are, for the pool's bulk calls.
pub(super) fn raw_as_u32(raws: &[RawMbuf]) -> &[u32] {
    // SAFETY: `RawMbuf` is `repr(transparent)` over `u32`: same size, alignment and validity,
    // so the slice can be viewed as `u32`s for the same length and lifetime.
    unsafe { slice::from_raw_parts(raws.as_ptr().cast::<u32>(), raws.len()) }
}

/// As [`raw_as_u32`], writable.
pub(super) fn raw_as_u32_mut(raws: &mut [RawMbuf]) -> &mut [u32] {
    // SAFETY: as in `raw_as_u32`; every `u32` is a valid `RawMbuf`, and the borrow is unique.
    unsafe { slice::from_raw_parts_mut(raws.as_mut_ptr().cast::<u32>(), raws.len()) }
}

/// An owned packet buffer (possibly a chain of segments). One pointer wide; dropping it
/// returns every segment to the pool's shared ring (use [`Mbuf::free_to`] to go through a
/// cache instead).
pub struct Mbuf {
    pub(super) hdr: NonNull<MbufHeader>,
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
    pub(super) fn h(&self) -> &MbufHeader {
        // SAFETY: `hdr` points at a live, initialized header in the pool's region (kept mapped
        // while any mbuf is out); we own it or share it read-only (see the `Sync` impl).
        unsafe { self.hdr.as_ref() }
    }

    #[inline]
    pub(super) fn h_mut(&mut self) -> &mut MbufHeader {
        // SAFETY: as in `h`, and `&mut self` means we own the mbuf exclusively (an `Mbuf`
        // inside a `SharedMbuf` is never reachable mutably).
        unsafe { self.hdr.as_mut() }
    }

    #[inline]
    fn pool(&self) -> &Mempool {
        super::header::pool_of(self.h().pool)
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
    pub fn chunk_key(&self) -> Option<crate::Lkey> {
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

    /// Gives up ownership, returning the raw index (see
    /// [`MbufPool::from_raw`](super::MbufPool::from_raw)).
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
}

impl Drop for Mbuf {
    /// Frees the chain through this thread's cache for its pool when the thread has one
    /// (made by `lcache::with_cache`, `lcache::alloc`, or a driver's burst on this thread),
    /// else to the pool's shared ring: the obvious code (`drop(m)`, a burst cleared) is the
    /// fast path on a polling core.
    fn drop(&mut self) {
        // SAFETY: the header is live and ours; its pool outlives it.
        let pool = unsafe { (*self.hdr.as_ptr()).pool };
        let hdr = self.hdr;
        // SAFETY: we own the chain and this is its last use; a cache given is one of this
        // thread's, not lent out (`with_existing`).
        crate::lcache::with_existing(pool, |cache| unsafe { free_chain(hdr, cache) });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mbuf::test_pool as pool;
    use crate::mbuf::PORT_INVALID;

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
}
