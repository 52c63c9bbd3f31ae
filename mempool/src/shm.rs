//! Multi-process pools: what a pool created with a shared file keeps in that file, after its
//! objects, so that other processes can attach to it ([`Mempool::attach`](crate::Mempool::attach)).
//!
//! ```text
//! file offset 0            objects (the pool's chunks; mapped at the same address everywhere)
//! round_up(span, 4 KiB)    control block:
//!     Header               magic, version, layout, name, chunk keys, mbuf layout
//!     RingCtl              producer and consumer head/tail, each on its own cache line pair
//!     ring slots           u32 object indices, a power of two of them (> objects)
//!     cache slots          CACHE_SLOTS x { owner pid, published length, objects }
//!     object states        one byte per object: 0 free, else the owner id of the process
//!                          that took it (its owners-table entry + 1), 255 untracked
//!     owners table         OWNER_IDS x owner pid (0: free entry)
//! ```
//!
//! - **The free ring** is DPDK's `rte_ring` multi-producer/multi-consumer algorithm (reserve
//!   with one compare-and-swap on the head, copy, publish by moving the tail in order) over
//!   memory in the file: `crossbeam_queue::ArrayQueue`, which private pools use, keeps its
//!   buffer on the creating process's heap and cannot live in a shared mapping. As with
//!   `rte_ring`, a process killed between its reservation and its publication stops that
//!   side of the ring for everyone; the pool's users are the dataplane processes, which are
//!   not killed inside a bulk copy of a few hundred indices except by SIGKILL, and
//!   [`Mempool::reclaim`](crate::Mempool::reclaim) says so when it finds the ring stuck.
//! - **Per-core caches live in the file**, one slot each, tagged with the owning process's
//!   pid. When a process dies its cached objects are not lost: the survivor that learns of
//!   the death (the primary, told by its control socket) returns them to the ring with
//!   [`Mempool::reclaim`](crate::Mempool::reclaim).
//! - **Every object in use is tagged with the process that took it** (its owner id, in the
//!   object's state byte, written as it leaves a cache or the ring and cleared as it comes
//!   back), so that what a dead process held outside its caches (buffers posted to device
//!   queues, frames in flight) can be found and returned once nothing can use it any more:
//!   [`Mempool::reclaim_owned`](crate::Mempool::reclaim_owned).
//! - **Every value read from the file is checked**: the header when a process attaches
//!   (magic, version, sizes that agree with the file's length), and every object index that
//!   comes out of the ring or a dead process's cache (an index outside the pool would make
//!   the pool hand out memory outside its objects).
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// Identifies a pool control block.
pub(crate) const MAGIC: [u8; 8] = *b"PMDPOOL1";
/// Layout version of the control block; a process of another version is refused.
pub(crate) const VERSION: u32 = 2;
/// Cache slots per shared pool: per-core caches of every process together.
pub const CACHE_SLOTS: usize = 128;
/// Chunk keys a shared pool can publish (64 chunks of up to 1 GiB).
pub(crate) const MAX_KEYS: usize = 64;
/// Longest pool name stored.
pub(crate) const NAME_MAX: usize = 64;
/// Owner ids per shared pool: processes that take objects from it (ids 1..=OWNER_IDS; a
/// process beyond them tags its objects [`UNTRACKED`]).
pub const OWNER_IDS: usize = 254;
/// The state of an object taken by a process without an owner id.
pub(crate) const UNTRACKED: u8 = 255;
/// Alignment of the control block inside the file.
const CTL_ALIGN: usize = 4096;

/// `kind` of a plain object pool.
pub(crate) const KIND_OBJECT: u32 = 0;
/// `kind` of an mbuf pool (headers written, `headroom` and `data_room` set).
pub(crate) const KIND_MBUF: u32 = 1;

/// The fixed part of the control block.
#[repr(C)]
pub(crate) struct Header {
    pub(crate) magic: [u8; 8],
    pub(crate) version: u32,
    /// 0 while the creator builds the pool; 1 once every object is in the ring and every
    /// header is written (stored with release, read with acquire).
    pub(crate) ready: AtomicU32,
    pub(crate) creator_pid: u32,
    pub(crate) obj_count: u32,
    pub(crate) cache_size: u32,
    pub(crate) chunk_shift: u32,
    pub(crate) nkeys: u32,
    pub(crate) kind: u32,
    pub(crate) headroom: u32,
    pub(crate) data_room: u32,
    pub(crate) obj_size: u64,
    pub(crate) chunk_bytes: u64,
    pub(crate) span: u64,
    /// Address of object 0 in the creator (every process maps the objects there).
    pub(crate) base: u64,
    /// Offset of the control block in the file.
    pub(crate) ctl_offset: u64,
    pub(crate) name_len: u32,
    pub(crate) name: [u8; NAME_MAX],
    pub(crate) keys: [u32; MAX_KEYS],
}

/// One side (producers or consumers) of the ring.
#[repr(C, align(128))]
pub(crate) struct HeadTail {
    head: AtomicU32,
    tail: AtomicU32,
}

#[repr(C)]
struct RingCtl {
    prod: HeadTail,
    cons: HeadTail,
}

/// A cache slot's owner while a survivor takes its objects back.
const RECLAIMING: u32 = u32::MAX;

/// Head of a cache slot; the slot's objects follow it.
#[repr(C, align(64))]
pub(crate) struct SlotHead {
    /// 0: free; else the pid of the process whose cache uses the slot.
    pub(crate) owner: AtomicU32,
    /// The cache's published length (a plain store after every operation).
    pub(crate) len: AtomicU32,
}

/// Where each part of the control block is, computed from the object count and cache size
/// alone, so that a process that attaches finds what the creator made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CtlLayout {
    pub(crate) ctl_offset: usize,
    ring_ctl: usize,
    ring_slots: usize,
    ring_size: u32,
    cache_slots: usize,
    slot_stride: usize,
    pub(crate) slot_cap: usize,
    audit: usize,
    owners: usize,
    pub(crate) end: usize,
}

fn up(x: usize, a: usize) -> Option<usize> {
    x.checked_next_multiple_of(a)
}

impl CtlLayout {
    /// The layout for `obj_count` objects spanning `span` bytes with caches of `cache_size`;
    /// `None` when it overflows.
    pub(crate) fn new(span: usize, obj_count: u32, cache_size: u32) -> Option<CtlLayout> {
        let ctl_offset = up(span, CTL_ALIGN)?;
        let ring_ctl = up(ctl_offset.checked_add(size_of::<Header>())?, 128)?;
        let ring_slots = ring_ctl.checked_add(size_of::<RingCtl>())?;
        // More slots than objects, so the free count never wraps to "empty".
        let ring_size = (obj_count.checked_add(1)?).checked_next_power_of_two()?;
        let cache_slots = up(ring_slots.checked_add(4 * ring_size as usize)?, 64)?;
        let slot_cap = crate::cache::slot_capacity(cache_size as usize);
        let slot_stride = up(size_of::<SlotHead>() + 4 * slot_cap, 64)?;
        let audit = cache_slots.checked_add(CACHE_SLOTS.checked_mul(slot_stride)?)?;
        let owners = up(audit.checked_add(obj_count as usize)?, 64)?;
        let end = owners.checked_add(4 * OWNER_IDS)?;
        Some(CtlLayout {
            ctl_offset,
            ring_ctl,
            ring_slots,
            ring_size,
            cache_slots,
            slot_stride,
            slot_cap,
            audit,
            owners,
            end,
        })
    }
}

/// A view of a control block in a mapping this process holds. Every pointer stays valid as
/// long as the mapping does: the pool that owns the view owns the mapping and drops the view
/// first.
pub(crate) struct Ctl {
    base: NonNull<u8>,
    layout: CtlLayout,
    obj_count: u32,
}

// SAFETY: the control block is shared memory that processes and threads access only through
// atomics (heads, tails, slot owners and lengths, ring slots, audit states) or, for a cache
// slot's objects, from the one thread whose cache owns the slot; the header is written once
// before `ready` is published and read only after.
unsafe impl Send for Ctl {}
// SAFETY: as above.
unsafe impl Sync for Ctl {}

impl Ctl {
    /// A view of the control block at `mapping + layout.ctl_offset`.
    ///
    /// # Safety
    /// `mapping` is the start of a live, writable mapping of at least `layout.end` bytes that
    /// outlives the view, and `layout` is the one its `Header` describes.
    pub(crate) unsafe fn new(mapping: NonNull<u8>, layout: CtlLayout, obj_count: u32) -> Ctl {
        Ctl {
            base: mapping,
            layout,
            obj_count,
        }
    }

    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + size_of::<T>() <= self.layout.end);
        debug_assert!(off.is_multiple_of(align_of::<T>()));
        // SAFETY: `off` is one of the layout's offsets, inside the mapping (`Ctl::new`'s
        // contract) and aligned (mapping page-aligned, offsets rounded to the type's
        // alignment); every type placed there is valid for any bit pattern (integers and
        // atomics), and shared access goes through atomics.
        unsafe { &*self.base.as_ptr().add(off).cast::<T>() }
    }

    /// The header, to read.
    pub(crate) fn header(&self) -> &Header {
        self.at(self.layout.ctl_offset)
    }

    /// The header, to fill in while the pool is created (before anyone else can map it).
    ///
    /// # Safety
    /// Only the creator calls this, before publishing `ready`, and holds no other reference
    /// into the header meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn header_mut(&self) -> &mut Header {
        // SAFETY: the caller's contract: nobody else reads or writes the header yet.
        unsafe {
            &mut *self
                .base
                .as_ptr()
                .add(self.layout.ctl_offset)
                .cast::<Header>()
        }
    }

    fn ring(&self) -> &RingCtl {
        self.at(self.layout.ring_ctl)
    }

    #[inline]
    fn slot(&self, pos: u32) -> &AtomicU32 {
        let i = (pos & (self.layout.ring_size - 1)) as usize;
        self.at(self.layout.ring_slots + 4 * i)
    }

    /// Slot `i`'s head.
    pub(crate) fn cache_slot(&self, i: usize) -> &SlotHead {
        assert!(i < CACHE_SLOTS);
        self.at(self.layout.cache_slots + i * self.layout.slot_stride)
    }

    /// Slot `i`'s objects, as a pointer to `slot_cap` indices.
    pub(crate) fn cache_objs(&self, i: usize) -> NonNull<u32> {
        assert!(i < CACHE_SLOTS);
        let off = self.layout.cache_slots + i * self.layout.slot_stride + size_of::<SlotHead>();
        // SAFETY: inside the mapping (layout), so non-null.
        unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off).cast::<u32>()) }
    }

    /// One audit state byte per object.
    pub(crate) fn audit_states(&self) -> &[AtomicU8] {
        // SAFETY: `obj_count` bytes at the audit offset are inside the mapping (layout);
        // `AtomicU8` has no alignment requirement beyond 1 and is valid for any byte.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.layout.audit).cast::<AtomicU8>(),
                self.obj_count as usize,
            )
        }
    }

    /// Owners-table entry `k` (owner id `k + 1`): the pid that uses the id, or 0.
    fn owner_entry(&self, k: usize) -> &AtomicU32 {
        assert!(k < OWNER_IDS);
        self.at(self.layout.owners + 4 * k)
    }

    /// An owner id for process `pid` (1..=OWNER_IDS): a free entry, else one of a dead
    /// process that holds no object any more; [`UNTRACKED`] when every id is taken.
    pub(crate) fn claim_owner(&self, pid: u32) -> u8 {
        for k in 0..OWNER_IDS {
            if self
                .owner_entry(k)
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return (k + 1) as u8;
            }
        }
        for k in 0..OWNER_IDS {
            let old = self.owner_entry(k).load(Ordering::Acquire);
            let id = (k + 1) as u8;
            // An entry being reclaimed is the reclaimer's until it frees it.
            if old != pid
                && old != 0
                && old != RECLAIMING
                && pid_gone(old)
                && self.owned_by(id) == 0
                && self
                    .owner_entry(k)
                    .compare_exchange(old, pid, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return id;
            }
        }
        UNTRACKED
    }

    /// Gives owner id `id` of process `pid` back (nothing is tagged with it any more); an
    /// entry that is no longer `pid`'s (taken over, or being reclaimed) is left alone.
    pub(crate) fn release_owner(&self, id: u8, pid: u32) {
        if (1..=OWNER_IDS).contains(&usize::from(id)) {
            let _ = self.owner_entry(usize::from(id) - 1).compare_exchange(
                pid,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Objects tagged with owner id `id` (a scan of the states).
    pub(crate) fn owned_by(&self, id: u8) -> u32 {
        self.audit_states()
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) == id)
            .count() as u32
    }

    /// Objects in use by process `pid` (tagged with any of its owner ids).
    pub(crate) fn owned_by_pid(&self, pid: u32) -> u32 {
        self.ids_of(pid)
            .into_iter()
            .map(|id| self.owned_by(id))
            .sum()
    }

    /// The owner ids process `pid` holds.
    fn ids_of(&self, pid: u32) -> Vec<u8> {
        (0..OWNER_IDS)
            .filter(|&k| self.owner_entry(k).load(Ordering::Acquire) == pid)
            .map(|k| (k + 1) as u8)
            .collect()
    }

    /// Returns to the ring every object tagged with an owner id of process `pid` (which must
    /// be dead, and its objects out of every device's reach), and frees its ids. Each entry
    /// is taken first (`pid` → a reclaiming mark), so that neither a process taking over a
    /// dead process's id nor a second reclaimer can meet this one: an id is scanned by one
    /// reclaimer, and handed out again only once it is free. Returns how many objects came
    /// back and how many could not (the ring refused them: full, which only a corrupt pool
    /// can be; those keep their tag, and the id stays the dead process's).
    pub(crate) fn reclaim_owned(&self, pid: u32) -> (u32, u32) {
        let (mut back, mut bad) = (0, 0);
        for k in 0..OWNER_IDS {
            let entry = self.owner_entry(k);
            if entry
                .compare_exchange(pid, RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let id = (k + 1) as u8;
            let mut objs = Vec::new();
            for (idx, st) in self.audit_states().iter().enumerate() {
                if st.load(Ordering::Acquire) == id {
                    objs.push(idx as u32);
                }
            }
            let mut refused = 0;
            for chunk in objs.chunks(256) {
                // Free before they go back: a process that takes one tags it anew.
                for &idx in chunk {
                    self.audit_states()[idx as usize].store(0, Ordering::Release);
                }
                if self.put(chunk).is_ok() {
                    back += chunk.len() as u32;
                    continue;
                }
                for &idx in chunk {
                    if self.put(&[idx]).is_ok() {
                        back += 1;
                    } else {
                        self.audit_states()[idx as usize].store(id, Ordering::Release);
                        refused += 1;
                    }
                }
            }
            bad += refused;
            entry.store(if refused == 0 { 0 } else { pid }, Ordering::Release);
        }
        (back, bad)
    }

    /// Claims a free cache slot for `pid`.
    pub(crate) fn claim_slot(&self, pid: u32) -> Option<usize> {
        (0..CACHE_SLOTS).find(|&i| {
            let s = self.cache_slot(i);
            s.owner
                .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
                && {
                    s.len.store(0, Ordering::Relaxed);
                    true
                }
        })
    }

    /// Gives a slot back (its cache flushed first).
    pub(crate) fn release_slot(&self, i: usize) {
        let s = self.cache_slot(i);
        s.len.store(0, Ordering::Relaxed);
        s.owner.store(0, Ordering::Release);
    }

    /// Objects in all caches of all processes.
    pub(crate) fn cached(&self) -> u32 {
        (0..CACHE_SLOTS)
            .map(|i| self.cache_slot(i))
            .filter(|s| s.owner.load(Ordering::Acquire) != 0)
            .map(|s| s.len.load(Ordering::Relaxed))
            .sum()
    }

    /// The pids that own cache slots, each once.
    pub(crate) fn slot_owners(&self) -> Vec<u32> {
        let mut v: Vec<u32> = (0..CACHE_SLOTS)
            .map(|i| self.cache_slot(i).owner.load(Ordering::Acquire))
            .filter(|&p| p != 0 && p != RECLAIMING)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Takes `pid`'s cache slots back: their objects (checked) are put in the ring. Returns
    /// how many objects came back and how many of the slots' entries were not objects of the
    /// pool (a corrupt or torn slot; those are dropped).
    pub(crate) fn reclaim_slots(&self, pid: u32) -> (u32, u32) {
        let (mut back, mut bad) = (0, 0);
        let mut buf = vec![0u32; self.layout.slot_cap];
        for i in 0..CACHE_SLOTS {
            let s = self.cache_slot(i);
            // Take the slot first: a second reclaimer of the same pid finds it taken.
            if s.owner
                .compare_exchange(pid, RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            let len = (s.len.load(Ordering::Acquire) as usize).min(self.layout.slot_cap);
            let objs = self.cache_objs(i);
            let mut n = 0;
            for k in 0..len {
                // SAFETY: `k < slot_cap`, inside the slot; its owner is dead, so nothing writes
                // it. A volatile read: another process wrote it.
                let idx = unsafe { objs.as_ptr().add(k).read_volatile() };
                if idx < self.obj_count {
                    buf[n] = idx;
                    n += 1;
                } else {
                    bad += 1;
                }
            }
            // One by one past the first that does not fit: an object that is already back
            // (a torn slot) must not take the others with it.
            match self.put(&buf[..n]) {
                Ok(()) => back += n as u32,
                Err(_) => {
                    for &idx in &buf[..n] {
                        match self.put(&[idx]) {
                            Ok(()) => back += 1,
                            Err(_) => bad += 1,
                        }
                    }
                }
            }
            s.len.store(0, Ordering::Relaxed);
            s.owner.store(0, Ordering::Release);
        }
        (back, bad)
    }

    // ---- the ring: rte_ring's MP/MC algorithm over u32 slots ----

    /// Objects in the ring (a snapshot).
    pub(crate) fn ring_len(&self) -> u32 {
        let r = self.ring();
        let n = r
            .prod
            .tail
            .load(Ordering::Acquire)
            .wrapping_sub(r.cons.tail.load(Ordering::Acquire));
        n.min(self.obj_count)
    }

    /// Whether a side of the ring has a reservation that was never published (a process died
    /// inside a put or get): `(producers, consumers)`.
    pub(crate) fn ring_stuck(&self) -> (bool, bool) {
        let r = self.ring();
        (
            r.prod.head.load(Ordering::Acquire) != r.prod.tail.load(Ordering::Acquire),
            r.cons.head.load(Ordering::Acquire) != r.cons.tail.load(Ordering::Acquire),
        )
    }

    /// Puts `objs` in the ring. `Err(idx)` names an object that did not fit (more objects
    /// came back than the pool holds: a double free). Never inlined: it runs once per cache
    /// refill or flush, and inlined into a driver's burst its loops would cost the burst
    /// registers.
    #[inline(never)]
    pub(crate) fn put(&self, objs: &[u32]) -> Result<(), u32> {
        let n = objs.len() as u32;
        if n == 0 {
            return Ok(());
        }
        let r = self.ring();
        // The head is read before the other side's tail (acquire, as DPDK's fence "ensure
        // the head is read before tail"): a tail older than the head would miscount.
        let mut head = r.prod.head.load(Ordering::Acquire);
        loop {
            let cons_tail = r.cons.tail.load(Ordering::Acquire);
            let free = self.obj_count.wrapping_add(cons_tail).wrapping_sub(head);
            if n > free {
                return Err(objs[free.min(n - 1) as usize]);
            }
            match r.prod.head.compare_exchange_weak(
                head,
                head.wrapping_add(n),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        for (k, &o) in objs.iter().enumerate() {
            self.slot(head.wrapping_add(k as u32))
                .store(o, Ordering::Relaxed);
        }
        // Publish in reservation order.
        while r.prod.tail.load(Ordering::Acquire) != head {
            std::hint::spin_loop();
        }
        r.prod.tail.store(head.wrapping_add(n), Ordering::Release);
        Ok(())
    }

    /// Takes exactly `out.len()` objects, or none (`false`).
    pub(crate) fn get_exact(&self, out: &mut [u32]) -> bool {
        let n = out.len() as u32;
        self.get(out, n, n) == n
    }

    /// Takes between `min` and `want` objects (as many as there are, up to `want`) into
    /// `out`, or none when fewer than `min` are there. Returns how many. Never inlined (see
    /// [`Ctl::put`]).
    #[inline(never)]
    pub(crate) fn get(&self, out: &mut [u32], min: u32, want: u32) -> u32 {
        let want = want.min(out.len() as u32);
        if want == 0 {
            return 0;
        }
        let r = self.ring();
        // As in `put`: the head before the other side's tail.
        let mut head = r.cons.head.load(Ordering::Acquire);
        let mut torn = 0u32;
        let n = loop {
            let prod_tail = r.prod.tail.load(Ordering::Acquire);
            let entries = prod_tail.wrapping_sub(head);
            if entries > self.obj_count {
                // The two were read at different moments (the head moved on meanwhile):
                // read again. Forever only if another process wrote nonsense into them.
                torn += 1;
                if torn > 1 << 24 {
                    corrupt_ring(entries, self.obj_count);
                }
                std::hint::spin_loop();
                head = r.cons.head.load(Ordering::Acquire);
                continue;
            }
            let n = want.min(entries);
            if n < min.max(1) {
                return 0;
            }
            match r.cons.head.compare_exchange_weak(
                head,
                head.wrapping_add(n),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break n,
                Err(h) => head = h,
            }
        };
        let mut bad = None;
        for (k, o) in out[..n as usize].iter_mut().enumerate() {
            *o = self
                .slot(head.wrapping_add(k as u32))
                .load(Ordering::Relaxed);
            if *o >= self.obj_count {
                bad = Some(*o);
            }
        }
        while r.cons.tail.load(Ordering::Acquire) != head {
            std::hint::spin_loop();
        }
        r.cons.tail.store(head.wrapping_add(n), Ordering::Release);
        if let Some(idx) = bad {
            corrupt_ring(idx, self.obj_count);
        }
        n
    }
}

#[cold]
#[inline(never)]
fn corrupt_ring(idx: u32, count: u32) -> ! {
    panic!(
        "shared pool: the free ring in the shared file handed out index {idx}, but the pool has \
         {count} objects: another process wrote over the pool's control block"
    )
}

/// The current process's id.
pub(crate) fn this_pid() -> u32 {
    std::process::id()
}

/// Whether process `pid` is gone: `kill(pid, 0)` answers ESRCH, or `/proc/PID/stat` says it
/// is a zombie (dead, not yet reaped by its parent: it runs no code and its memory is gone).
/// A pid the kernel has reused for another process reads as alive.
pub(crate) fn pid_gone(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let rc = unsafe { libc::kill(p, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    // The state is the first field after the command, which is in parentheses and may hold
    // anything, so look after the last ')'.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = &s[s.rfind(')')? + 1..];
            after
                .split_whitespace()
                .next()
                .map(|st| st == "Z" || st == "X")
        })
        .unwrap_or(false)
}

/// A cache's storage: `cap` indices and the cell its length is published in. For a private
/// pool both are on this process's heap; for a shared pool both are in a cache slot of the
/// control block. Three words, as the `Box<[u32]>` and `Arc` it replaces: the cache sits in
/// every burst's working set.
pub(crate) struct CacheStore {
    objs: NonNull<u32>,
    /// The heap record's `len` (an `Arc<CacheSlot>` made raw, `len` at offset 0), or a
    /// shared slot's.
    len_cell: NonNull<AtomicU32>,
    cap: u32,
    /// The shared slot's index, or `HEAP`.
    slot: u32,
}

/// `CacheStore::slot` of heap storage.
const HEAP: u32 = u32::MAX;

const _: () = assert!(std::mem::offset_of!(crate::pool::CacheSlot, len) == 0);

// SAFETY: the storage belongs to one cache, which one thread owns at a time (`PoolCache` is
// `Send`, not `Sync`); the length cell is an atomic.
unsafe impl Send for CacheStore {}

impl CacheStore {
    /// Heap storage for `cap` indices, publishing its length in `slot`.
    pub(crate) fn heap(cap: usize, slot: std::sync::Arc<crate::pool::CacheSlot>) -> CacheStore {
        let cap = u32::try_from(cap).expect("a cache holds at most a few thousand objects");
        let objs: Box<[u32]> = vec![0; cap.max(1) as usize].into_boxed_slice();
        let objs = NonNull::new(Box::into_raw(objs).cast::<u32>()).expect("Box is non-null");
        let raw = std::sync::Arc::into_raw(slot).cast_mut();
        let len_cell = NonNull::new(raw.cast::<AtomicU32>()).expect("Arc is non-null");
        CacheStore {
            objs,
            len_cell,
            cap,
            slot: HEAP,
        }
    }

    /// Storage in slot `i` of `ctl`, which the caller has claimed.
    pub(crate) fn shared(ctl: &Ctl, i: usize, cap: usize) -> CacheStore {
        assert!(cap <= ctl.layout.slot_cap && i < CACHE_SLOTS);
        CacheStore {
            objs: ctl.cache_objs(i),
            cap: cap as u32,
            len_cell: NonNull::from(&ctl.cache_slot(i).len),
            slot: i as u32,
        }
    }

    /// The shared slot this storage is, if any.
    pub(crate) fn shared_slot(&self) -> Option<usize> {
        (self.slot != HEAP).then_some(self.slot as usize)
    }

    /// The heap record (to tell it among the pool's), if any.
    pub(crate) fn heap_slot(&self) -> Option<*const crate::pool::CacheSlot> {
        (self.slot == HEAP).then_some(self.len_cell.as_ptr().cast_const().cast())
    }

    /// Publishes the cache's length (a plain store).
    #[inline]
    pub(crate) fn publish_len(&self, len: usize) {
        // SAFETY: the cell is in the heap record we hold (a raw `Arc`, released in `drop`) or
        // in a slot of a control block whose mapping the pool (held by the cache) keeps
        // alive.
        unsafe { self.len_cell.as_ref() }.store(len as u32, Ordering::Relaxed);
    }
}

impl std::ops::Deref for CacheStore {
    type Target = [u32];
    #[inline]
    fn deref(&self) -> &[u32] {
        // SAFETY: `objs` points to `cap` indices this store alone uses (see the type's docs),
        // alive as long as the store (heap) or the pool's mapping (shared).
        unsafe { std::slice::from_raw_parts(self.objs.as_ptr(), self.cap as usize) }
    }
}

impl std::ops::DerefMut for CacheStore {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u32] {
        // SAFETY: as `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.objs.as_ptr(), self.cap as usize) }
    }
}

impl Drop for CacheStore {
    fn drop(&mut self) {
        if self.slot == HEAP {
            let n = (self.cap as usize).max(1);
            let raw = std::ptr::slice_from_raw_parts_mut(self.objs.as_ptr(), n);
            // SAFETY: made by `Box::into_raw` of a slice of `cap.max(1)` in `heap`, freed once.
            drop(unsafe { Box::from_raw(raw) });
            // SAFETY: made by `Arc::into_raw` in `heap` (`len` is at offset 0, so the cell's
            // pointer is the record's), given back once.
            drop(unsafe {
                std::sync::Arc::from_raw(
                    self.len_cell
                        .as_ptr()
                        .cast_const()
                        .cast::<crate::pool::CacheSlot>(),
                )
            });
        }
    }
}

/// Bytes at the very end of a shared pool's file that say where its control block is (the
/// objects come first, so a process that attaches cannot know before it reads this).
const LOCATOR_BYTES: usize = 64;

#[repr(C)]
struct Locator {
    magic: [u8; 8],
    ctl_offset: u64,
    end: u64,
}

/// A view over the control block of `region` (a shared pool's mapping).
///
/// The caller keeps `region` mapped for as long as the view lives (a `Mempool` holds both, the
/// view in a field dropped before the region's).
pub(crate) fn ctl_over(
    base: NonNull<u8>,
    layout: CtlLayout,
    obj_count: u32,
    region: &crate::Region,
    create: bool,
) -> Ctl {
    assert!(region.len() >= layout.file_bytes());
    assert_eq!(base.as_ptr(), region.as_ptr());
    // SAFETY: `base` is the start of `region`'s mapping, writable, at least `layout.end` bytes
    // long (asserted), and the caller keeps the region for the view's life (above).
    let ctl = unsafe { Ctl::new(base, layout, obj_count) };
    if create {
        // The locator, at the end of the mapping (the whole file).
        let at = region.len() - LOCATOR_BYTES;
        // SAFETY: inside the mapping, 64-byte aligned (page-sized length); written only here,
        // by the creator, before anyone can attach (the file is new).
        let loc = unsafe { &mut *region.as_ptr().add(at).cast::<Locator>() };
        loc.ctl_offset = layout.ctl_offset as u64;
        loc.end = layout.end as u64;
        loc.magic = MAGIC;
    }
    ctl
}

impl CtlLayout {
    /// Bytes a shared pool's file needs: the control block and the locator after it.
    pub(crate) fn file_bytes(&self) -> usize {
        self.end.saturating_add(LOCATOR_BYTES)
    }
}

/// Fills in a fresh shared pool's header. `ready` stays 0 until [`publish`].
pub(crate) fn write_header(
    ctl: &Ctl,
    name: &str,
    layout: &crate::chunk::Layout,
    cache_size: u32,
    keys: &[crate::Lkey],
) {
    // SAFETY: the creator, before `ready`; no other reference into the header is held.
    let h = unsafe { ctl.header_mut() };
    h.magic = MAGIC;
    h.version = VERSION;
    h.creator_pid = this_pid();
    h.obj_count = layout.obj_count;
    h.cache_size = cache_size;
    h.chunk_shift = layout.chunk_shift;
    h.nkeys = keys.len() as u32;
    h.obj_size = layout.obj_size as u64;
    h.chunk_bytes = layout.chunk_bytes as u64;
    h.span = layout.span as u64;
    h.base = layout.base as u64;
    h.ctl_offset = ctl.layout.ctl_offset as u64;
    h.name_len = name.len() as u32;
    h.name[..name.len()].copy_from_slice(name.as_bytes());
    for (d, k) in h.keys.iter_mut().zip(keys) {
        *d = k.0;
    }
}

/// Marks the pool finished: others may attach from now on.
pub(crate) fn publish(ctl: &Ctl, kind: u32, headroom: u16, data_room: u16) {
    {
        // SAFETY: still the creator before `ready`.
        let h = unsafe { ctl.header_mut() };
        h.kind = kind;
        h.headroom = u32::from(headroom);
        h.data_room = u32::from(data_room);
    }
    ctl.header().ready.store(1, Ordering::Release);
}

/// What a process that attaches learns from the control block, every field checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderInfo {
    pub(crate) name: String,
    pub(crate) base: usize,
    pub(crate) layout: crate::chunk::Layout,
    pub(crate) cache_size: u32,
    pub(crate) keys: Vec<u32>,
    pub(crate) ctl: CtlLayout,
    pub(crate) mbuf: (u16, u16),
    pub(crate) creator_pid: u32,
}

/// Reads and checks the control block of `probe` (a mapping of a whole shared pool file).
pub(crate) fn read_header(probe: &crate::Region, kind: u32) -> Result<HeaderInfo, String> {
    let len = probe.len();
    if len < LOCATOR_BYTES + size_of::<Header>() {
        return Err(format!("{len} bytes is too short for a pool"));
    }
    if !len.is_multiple_of(CTL_ALIGN) {
        return Err(format!(
            "{len} bytes is not a whole number of pages (a pool's file always is)"
        ));
    }
    // SAFETY: inside the mapping (length checked above), aligned (a whole number of pages).
    let loc = unsafe { &*probe.as_ptr().add(len - LOCATOR_BYTES).cast::<Locator>() };
    if loc.magic != MAGIC {
        return Err(format!(
            "not a shared pool of this version (no pool marker at its end); it has {len} bytes"
        ));
    }
    let ctl_offset = usize::try_from(loc.ctl_offset).unwrap_or(usize::MAX);
    let end = usize::try_from(loc.end).unwrap_or(usize::MAX);
    if !ctl_offset.is_multiple_of(CTL_ALIGN)
        || ctl_offset
            .checked_add(size_of::<Header>())
            .is_none_or(|e| e > len - LOCATOR_BYTES)
        || end > len - LOCATOR_BYTES
    {
        return Err(format!(
            "its marker places the control block at {ctl_offset}..{end}, outside its {len} bytes"
        ));
    }
    // SAFETY: `ctl_offset + size_of::<Header>()` is inside the mapping (checked above), aligned
    // (CTL_ALIGN); a header is valid for any bytes.
    let h = unsafe { &*probe.as_ptr().add(ctl_offset).cast::<Header>() };
    if h.magic != MAGIC || h.version != VERSION {
        return Err(format!(
            "its control block is of layout version {}, this build's is {VERSION} (attach with \
             a build of the same version)",
            h.version
        ));
    }
    let l = CtlLayout::new(h.span as usize, h.obj_count, h.cache_size)
        .filter(|l| l.ctl_offset == ctl_offset && l.end == end)
        .ok_or_else(|| {
            format!(
                "its control block does not match its own sizes ({} objects, span {}, cache {})",
                h.obj_count, h.span, h.cache_size
            )
        })?;
    let base = NonNull::new(probe.as_ptr()).expect("mapped");
    // SAFETY: `probe` maps at least `l.end` bytes (checked above) and outlives the view,
    // which is dropped at the end of this function.
    let ctl = unsafe { Ctl::new(base, l, h.obj_count) };
    header_info(&ctl, kind, len)
}

/// Checks every field of `ctl`'s header against the others and the file's `len`.
pub(crate) fn header_info(ctl: &Ctl, kind: u32, len: usize) -> Result<HeaderInfo, String> {
    let h = ctl.header();
    if h.magic != MAGIC {
        return Err("not a shared pool (bad magic in its control block)".into());
    }
    if h.version != VERSION {
        return Err(format!(
            "made by a build whose pool layout is version {}; this build reads version \
             {VERSION}: run the same build in every process",
            h.version
        ));
    }
    if h.ready.load(Ordering::Acquire) != 1 {
        return Err(format!(
            "process {} has not finished creating it (or died while creating it); attach \
             once its creator is up",
            h.creator_pid
        ));
    }
    if h.kind != kind {
        let what = |k| {
            if k == KIND_MBUF {
                "an mbuf pool"
            } else {
                "an object pool"
            }
        };
        return Err(format!("it is {}, not {}", what(h.kind), what(kind)));
    }
    let count = h.obj_count;
    if count == 0 || count > crate::MAX_OBJECTS {
        return Err(format!("it says it has {count} objects"));
    }
    let obj_size = usize::try_from(h.obj_size).unwrap_or(0);
    if obj_size == 0 || !obj_size.is_multiple_of(64) {
        return Err(format!(
            "its objects are {} bytes (not a multiple of 64)",
            h.obj_size
        ));
    }
    let span = obj_size.checked_mul(count as usize);
    if span != Some(h.span as usize) {
        return Err(format!(
            "{count} objects of {obj_size} bytes do not make its span of {} bytes",
            h.span
        ));
    }
    let span = h.span as usize;
    if h.cache_size > crate::MAX_CACHE_SIZE {
        return Err(format!(
            "its cache size {} is above {}",
            h.cache_size,
            crate::MAX_CACHE_SIZE
        ));
    }
    if h.chunk_shift > 32 {
        return Err(format!("its chunk shift {} is above 32", h.chunk_shift));
    }
    let chunk_bytes = if h.chunk_shift >= 32 {
        span
    } else {
        obj_size
            .checked_shl(h.chunk_shift)
            .filter(|b| b >> h.chunk_shift == obj_size)
            .ok_or_else(|| format!("its chunk shift {} overflows", h.chunk_shift))?
    };
    if chunk_bytes as u64 != h.chunk_bytes {
        return Err(format!(
            "its chunk size {} disagrees with its shift {}",
            h.chunk_bytes, h.chunk_shift
        ));
    }
    let layout = crate::chunk::Layout {
        base: h.base as usize,
        obj_size,
        obj_count: count,
        chunk_shift: h.chunk_shift,
        chunk_bytes,
        span,
    };
    let nkeys = h.nkeys as usize;
    if nkeys > MAX_KEYS || (nkeys != 0 && nkeys != layout.chunk_count()) {
        return Err(format!(
            "it has {nkeys} chunk keys for {} chunks",
            layout.chunk_count()
        ));
    }
    let name_len = h.name_len as usize;
    let name = h
        .name
        .get(..name_len)
        .and_then(|b| std::str::from_utf8(b).ok())
        .filter(|n| !n.is_empty() && !n.chars().any(char::is_control))
        .ok_or_else(|| "its name is not printable UTF-8 of at most 64 bytes".to_string())?
        .to_owned();
    let base = layout.base;
    if base == 0 || !base.is_multiple_of(CTL_ALIGN) || base.checked_add(len).is_none() {
        return Err(format!(
            "its objects' address {base:#x} is not page-aligned"
        ));
    }
    let l = CtlLayout::new(span, count, h.cache_size)
        .filter(|l| l.ctl_offset as u64 == h.ctl_offset && l.file_bytes() <= len)
        .ok_or_else(|| {
            format!(
                "its control block does not fit its {len} bytes (the file was truncated or \
                 is not a pool)"
            )
        })?;
    let mbuf = if kind == KIND_MBUF {
        let (hr, dr) = (h.headroom, h.data_room);
        let buf = hr as usize + dr as usize;
        if buf > usize::from(u16::MAX) || 128 + buf > obj_size {
            return Err(format!(
                "headroom {hr} + data room {dr} do not fit its {obj_size}-byte mbufs"
            ));
        }
        (hr as u16, dr as u16)
    } else {
        (0, 0)
    };
    Ok(HeaderInfo {
        name,
        base,
        layout,
        cache_size: h.cache_size,
        keys: h.keys[..nkeys].to_vec(),
        ctl: l,
        mbuf,
        creator_pid: h.creator_pid,
    })
}

/// A shared pool's audit states: one byte per object in the control block.
pub(crate) struct SharedStates {
    ptr: NonNull<AtomicU8>,
    len: usize,
}

// SAFETY: atomics in shared memory that the owning pool keeps mapped.
unsafe impl Send for SharedStates {}
// SAFETY: as above.
unsafe impl Sync for SharedStates {}

impl std::ops::Deref for SharedStates {
    type Target = [AtomicU8];
    fn deref(&self) -> &[AtomicU8] {
        // SAFETY: `len` state bytes inside the control block's mapping, which the pool holding
        // this view keeps (the audit is dropped before the region).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Ctl {
    /// The audit states, as a view the pool's `Audit` keeps.
    pub(crate) fn audit_states_view(&self) -> SharedStates {
        let s = self.audit_states();
        SharedStates {
            ptr: NonNull::from(s).cast(),
            len: s.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Mempool, PagePolicy, PoolCache, PoolConfig};
    use std::sync::Arc;

    fn shared(tag: &str, n: u32, cache: u32) -> Arc<Mempool> {
        let path = std::env::temp_dir().join(format!("shm-unit-{tag}-{}", std::process::id()));
        Mempool::new(
            PoolConfig::new(tag, n, 64)
                .cache_size(cache)
                .page_policy(PagePolicy::Normal)
                .shared_file(path),
        )
        .unwrap()
    }

    #[test]
    fn threads_churning_through_caches_leave_every_object_once() {
        let p = shared("churn", 1000, 64);
        std::thread::scope(|s| {
            for t in 0..4usize {
                let p = &p;
                s.spawn(move || {
                    let mut c = PoolCache::new(p);
                    let mut held = Vec::new();
                    let mut buf = [0u32; 37];
                    for i in 0..20_000usize {
                        let n = i % 37 + 1;
                        if (i + t) % 3 != 0 && c.get_bulk(&mut buf[..n]) {
                            held.extend_from_slice(&buf[..n]);
                        } else if !held.is_empty() {
                            let tail = held.split_off(held.len() - held.len().min(29));
                            c.put_bulk(&tail);
                        }
                    }
                    c.put_bulk(&held);
                });
            }
        });
        assert_eq!(p.cached(), 0, "every cache flushed on drop");
        assert_eq!(p.available(), 1000);
        let mut all = vec![0u32; 1000];
        assert!(p.get_bulk(&mut all));
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert!(!p.get_bulk(&mut [0u32; 1]), "empty");
        p.put_bulk(&all);
        assert!(p.cache_owners().is_empty());
    }

    #[test]
    #[should_panic(expected = "more objects returned than the pool holds")]
    fn returning_more_than_the_pool_holds_panics() {
        let p = shared("over", 16, 0);
        p.ring_put(&[3]);
    }

    #[test]
    fn caches_beyond_the_slots_run_without_a_cache() {
        let p = shared("slots", 4096, 16);
        let caches: Vec<PoolCache> = (0..super::CACHE_SLOTS)
            .map(|_| PoolCache::new(&p))
            .collect();
        assert!(caches.iter().all(|c| c.size() == 16));
        let mut extra = PoolCache::new(&p);
        assert_eq!(extra.size(), 0, "no slot left");
        let mut two = [0u32; 2];
        assert!(extra.get_bulk(&mut two));
        extra.put_bulk(&two);
        assert_eq!(extra.len(), 0);
        drop(caches);
        assert_eq!(
            PoolCache::new(&p).size(),
            16,
            "slots come back with their caches"
        );
        assert_eq!(p.available(), 4096);
    }
}
