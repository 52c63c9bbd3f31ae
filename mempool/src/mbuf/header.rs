//! The in-buffer mbuf header: its layout (pinned by const asserts), its reset, the pointer
//! arithmetic from a header to its buffer, and freeing a chain segment by segment.
#![allow(unsafe_code)]

use std::mem::offset_of;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cache::PoolCache;
use crate::pool::Mempool;

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

/// `next` of the last segment of a chain.
pub(super) const NO_SEG: u32 = u32::MAX;

/// The mbuf header. Line 0 holds everything the datapath writes on RX and reads on TX and on
/// free; the constant fields (`index`, `buf_len`, `headroom`, `pool`) are set once at pool
/// creation. Line 1 holds the user area.
#[repr(C, align(64))]
pub(super) struct MbufHeader {
    pub(super) data_off: u16,
    /// Owners of the chain (only `SharedMbuf` raises it above 1; kept on the head segment).
    pub(super) refcnt: AtomicU16,
    pub(super) nb_segs: u16,
    pub(super) port: u16,
    pub(super) ol_flags: u64,
    pub(super) pkt_len: u32,
    pub(super) data_len: u16,
    pub(super) vlan_tci: u16,
    pub(super) rss_hash: u32,
    /// Object index of the next segment, or `NO_SEG`.
    pub(super) next: u32,
    pub(super) timestamp: u64,
    pub(super) l2_len: u8,
    pub(super) l4_len: u8,
    pub(super) l3_len: u16,
    pub(super) tso_segsz: u16,
    _pad0: u16,
    pub(super) index: u32,
    pub(super) buf_len: u16,
    pub(super) headroom: u16,
    /// The pool: a pointer to its `Mempool` for a private pool; for a shared pool, a tag that
    /// is the same in every process (its objects' address with the low bit set), which
    /// [`pool_of`] turns into this process's `Mempool`.
    pub(super) pool: *const Mempool,
    // ---- line 1 ----
    pub(super) user: [u8; USER_AREA_BYTES],
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
    /// The header of a free object `index` of `pool`, as the pool writes it at creation:
    /// reset metadata, refcnt 1, one segment, cleared user area.
    pub(super) fn new(index: u32, buf_len: u16, headroom: u16, pool: *const Mempool) -> Self {
        MbufHeader {
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
            pool,
            user: [0; USER_AREA_BYTES],
            _reserved: [0; 48],
        }
    }

    pub(super) fn reset(&mut self) {
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

/// Shared pools this process has, by tag: a tag in a header of a shared pool's mbuf cannot
/// point at a `Mempool` (each process has its own), so it is looked up here.
const MAX_SHARED_POOLS: usize = 64;
static SHARED_TAGS: [AtomicUsize; MAX_SHARED_POOLS] =
    [const { AtomicUsize::new(0) }; MAX_SHARED_POOLS];
static SHARED_POOLS: [AtomicPtr<Mempool>; MAX_SHARED_POOLS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_SHARED_POOLS];

/// Records this process's `Mempool` of a shared pool. `false` when the process already has
/// [`MAX_SHARED_POOLS`] of them.
pub(crate) fn register_shared(pool: &Arc<Mempool>) -> bool {
    let Some(tag) = pool.shared_tag() else {
        return true;
    };
    for (t, p) in SHARED_TAGS.iter().zip(&SHARED_POOLS) {
        // Claim an entry: the pointer first, then the tag that makes it findable.
        if t.load(Ordering::Acquire) == 0
            && p.compare_exchange(
                ptr::null_mut(),
                Arc::as_ptr(pool).cast_mut(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            t.store(tag, Ordering::Release);
            return true;
        }
    }
    false
}

/// Forgets a shared pool's `Mempool` (it is being dropped).
pub(crate) fn unregister_shared(pool: &Mempool) {
    for (t, p) in SHARED_TAGS.iter().zip(&SHARED_POOLS) {
        if ptr::eq(p.load(Ordering::Acquire), pool) {
            t.store(0, Ordering::Release);
            p.store(ptr::null_mut(), Ordering::Release);
        }
    }
}

/// The pool a header names: its `pool` pointer, or for a shared pool's tag, this process's
/// `Mempool` of that pool.
///
/// # Panics
/// When the tag names a shared pool this process does not have (the mbuf outlived the
/// process's handle on its pool, or the header was overwritten).
#[inline]
pub(super) fn pool_of<'a>(tag: *const Mempool) -> &'a Mempool {
    if (tag as usize) & 1 == 0 {
        // SAFETY: an even value is the pointer the pool wrote at creation, to the `Mempool`
        // that stays alive while any of its mbufs is out (`MbufPool`'s `Drop` leaks it
        // otherwise).
        return unsafe { &*tag };
    }
    shared_pool(tag as usize)
}

#[cold]
#[inline(never)]
fn shared_pool<'a>(tag: usize) -> &'a Mempool {
    for (t, p) in SHARED_TAGS.iter().zip(&SHARED_POOLS) {
        if t.load(Ordering::Acquire) == tag {
            let p = p.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: registered by `register_shared` from a live `Arc<Mempool>` and removed
                // by that pool's `Drop` before it goes; a pool dropped with mbufs out is leaked
                // instead (`MbufPool`'s `Drop`).
                return unsafe { &*p };
            }
        }
    }
    panic!(
        "mbuf of the shared pool at {:#x} used in a process that has no handle on that pool \
         (attach to it with MbufPool::attach, and keep the handle while its mbufs are out)",
        tag & !1
    )
}

#[inline]
pub(super) fn seg_ptr(pool: &Mempool, idx: u32) -> NonNull<MbufHeader> {
    let p = pool.obj_ptr(idx).cast::<MbufHeader>();
    // SAFETY: `obj_ptr` checked the index, and an address inside the region is non-null.
    unsafe { NonNull::new_unchecked(p) }
}

#[inline]
pub(super) fn buf_ptr(hdr: NonNull<MbufHeader>) -> *mut u8 {
    hdr.as_ptr().cast::<u8>().wrapping_add(MBUF_HEADER_BYTES)
}

#[inline]
pub(super) fn data_ptr(hdr: NonNull<MbufHeader>, data_off: u16) -> *mut u8 {
    buf_ptr(hdr).wrapping_add(usize::from(data_off))
}

/// Frees a chain segment by segment, restoring the free-state invariant on each.
///
/// # Safety
/// The caller owns the chain starting at `head` and gives it up.
pub(super) unsafe fn free_chain(head: NonNull<MbufHeader>, mut cache: Option<&mut PoolCache>) {
    let mut p = head.as_ptr();
    loop {
        // SAFETY: `p` is a segment of the chain we own (caller contract), live and initialized;
        // its pool outlives it. Everything is read and reset *before* the object goes back:
        // after that another thread may own it, and the pool may be released once the last
        // outstanding object is home.
        let (pool, idx, next) = unsafe {
            let h = &mut *p;
            let pool = pool_of(h.pool);
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
    use crate::mbuf::test_pool as pool;

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
}
