//! Queue mechanics shared by every driver and device model, whatever the NIC:
//!
//! * [`write_wrapped`] / [`read_wrapped`]: the one copy into and out of a circular ring that
//!   continues at offset 0 where it passes the end (driver, model and golden tests use it);
//! * [`WorkQueue`]: a circular work queue in fixed units (MANA's 32-byte basic units, mlx5's
//!   64-byte WQEBBs) with free-running producer/consumer counters;
//! * [`DescRing`]: what each posted WQE carries, in posting order;
//! * [`CompletionQueue`]: a completion queue polled by owner bits, with the owner rule of the
//!   NIC plugged in ([`OwnerRule`]; MANA's lives in `mana::cq`).
//!
//! Counters are free-running `u32`s (`Wrapping` arithmetic): `head - tail` is the number of
//! units in flight even after the counters wrap, because ring sizes divide 2^32.
#![deny(unsafe_code)]

pub(crate) mod refill;

use crate::sys::barrier::udma_from_device_barrier;
use crate::sys::{DevMem, DevView};
use std::marker::PhantomData;
use std::sync::Arc;

/// Where a copy of `len` bytes at free-running byte position `pos` lands in a ring of `size`
/// bytes (a power of two): `(start, first)`: `first` bytes at `start`, the rest at offset 0.
#[inline]
pub fn wrap(size: usize, pos: u32, len: usize) -> (usize, usize) {
    debug_assert!(size.is_power_of_two() && len <= size);
    let start = pos as usize & (size - 1);
    (start, len.min(size - start))
}

/// Copies `data` into the ring `mem` (its whole length, a power of two) at free-running byte
/// position `pos`, continuing at offset 0 past the end (MANA spec §3.4).
#[inline]
pub fn write_wrapped(mem: &DevMem, pos: u32, data: &[u8]) {
    let (start, first) = wrap(mem.len(), pos, data.len());
    mem.write(start, &data[..first]);
    if first < data.len() {
        mem.write(0, &data[first..]);
    }
}

/// Copies `out.len()` bytes out of the ring `mem` at free-running byte position `pos`,
/// wrapping like [`write_wrapped`]. Inlined, so that a fixed-size read (a WQE's first unit)
/// is a fixed-size copy.
#[inline(always)]
pub fn read_wrapped(mem: &DevMem, pos: u32, out: &mut [u8]) {
    read_ring(mem, mem.len(), pos, out);
}

/// Like [`read_wrapped`], for a ring of `size` bytes (a power of two, at most `mem.len()`)
/// at the start of `mem`: a queue description may hand out a buffer longer than its ring.
#[inline(always)]
pub fn read_ring(mem: &DevMem, size: usize, pos: u32, out: &mut [u8]) {
    let (start, first) = wrap(size, pos, out.len());
    mem.read(start, &mut out[..first]);
    if first < out.len() {
        mem.read(0, &mut out[first..]);
    }
}

/// A work queue (SQ or RQ) as the driver sees it: it writes WQEs at `head` and the device
/// frees them, in order, up to `tail`. Positions count units of `unit_bytes`.
#[derive(Debug)]
pub struct WorkQueue {
    mem: Arc<DevMem>,
    size_bytes: u32,
    unit_bytes: u32,
    /// Producer position in units (free-running).
    head: u32,
    /// Consumer position in units (free-running), advanced as completions come back.
    tail: u32,
}

impl WorkQueue {
    /// A queue over `mem` (the whole of it is the ring) in units of `unit_bytes`.
    ///
    /// # Panics
    /// If the size is not a power of two of at least one unit, or over 2^31, or the unit is
    /// not a power of two.
    pub fn new(mem: Arc<DevMem>, unit_bytes: usize) -> Self {
        let size = mem.len();
        assert!(
            unit_bytes.is_power_of_two()
                && size.is_power_of_two()
                && (unit_bytes..=1 << 31).contains(&size),
            "bad work queue: {size} bytes in units of {unit_bytes}"
        );
        Self {
            mem,
            size_bytes: size as u32,
            unit_bytes: unit_bytes as u32,
            head: 0,
            tail: 0,
        }
    }

    /// The ring's memory.
    #[inline]
    pub fn mem(&self) -> &DevMem {
        &self.mem
    }

    /// Ring size in bytes.
    pub fn size_bytes(&self) -> u32 {
        self.size_bytes
    }

    /// Producer position in units.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Consumer position in units.
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Units free for new WQEs.
    #[inline]
    pub fn free(&self) -> u32 {
        (self.size_bytes >> self.unit_bytes.trailing_zeros()) - self.head.wrapping_sub(self.tail)
    }

    /// The producer position in bytes, mod 2^32 (what a MANA doorbell carries, §6.1).
    #[inline]
    pub fn head_bytes(&self) -> u32 {
        self.head.wrapping_mul(self.unit_bytes)
    }

    /// Copies one WQE (a whole number of units) to the producer position, wrapping
    /// ([`write_wrapped`]), and advances `head`. Returns its size in units, or `None`
    /// (nothing written) if the ring lacks room.
    #[inline]
    pub fn post(&mut self, wqe: &[u8]) -> Option<u32> {
        debug_assert!(wqe.len().is_multiple_of(self.unit_bytes as usize) && !wqe.is_empty());
        // Units are a power of two (checked at creation): a shift.
        let units = (wqe.len() >> self.unit_bytes.trailing_zeros()) as u32;
        if units > self.free() {
            return None;
        }
        // In 4-byte pieces: the WQE was just built field by field, mostly by 4-byte stores,
        // which a wider copy would wait for (see `DevMem::write_dwords`).
        let (start, first) = wrap(self.mem.len(), self.head_bytes(), wqe.len());
        self.mem.write_dwords(start, &wqe[..first]);
        if first < wqe.len() {
            self.mem.write_dwords(0, &wqe[first..]);
        }
        self.head = self.head.wrapping_add(units);
        Some(units)
    }

    /// Advances `head` over `units` the caller wrote in place (through [`WorkQueue::mem`],
    /// at [`WorkQueue::head_bytes`]), after checking [`WorkQueue::free`].
    #[inline]
    pub fn advance(&mut self, units: u32) {
        debug_assert!(units <= self.free());
        self.head = self.head.wrapping_add(units);
    }

    /// Moves the tail to `pos` (a producer position the device has consumed up to).
    #[inline]
    pub fn complete_to(&mut self, pos: u32) {
        debug_assert!(pos.wrapping_sub(self.tail) <= self.head.wrapping_sub(self.tail));
        self.tail = pos;
    }

    /// Marks `units` at the tail as consumed by the device.
    #[inline]
    pub fn complete(&mut self, units: u32) {
        debug_assert!(units <= self.head.wrapping_sub(self.tail));
        self.tail = self.tail.wrapping_add(units);
    }

    /// Forgets every WQE: both positions back to 0, where the device's counter is after the
    /// queue went through RESET (error recovery). The ring's bytes are left as they are.
    pub fn restart(&mut self) {
        self.head = 0;
        self.tail = 0;
    }
}

/// The software side of a queue: what each posted WQE carries (its mbuf, and for TX its size),
/// in posting order. The device completes WQEs strictly in order (spec §8.1), so the oldest
/// entry always belongs to the next completion.
#[derive(Debug)]
pub struct DescRing<T> {
    slots: Box<[Option<T>]>,
    /// Pushed entries (free-running).
    head: u32,
    /// Popped entries (free-running).
    tail: u32,
    mask: u32,
}

impl<T> DescRing<T> {
    /// A ring of `n` entries.
    ///
    /// # Panics
    /// If `n` is not a power of two.
    pub fn new(n: u32) -> Self {
        assert!(n.is_power_of_two(), "descriptor ring of {n} entries");
        Self {
            slots: (0..n).map(|_| None).collect(),
            head: 0,
            tail: 0,
            mask: n - 1,
        }
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.mask + 1
    }

    /// Entries held.
    #[inline]
    pub fn len(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// Whether it holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Room left.
    #[inline]
    pub fn free(&self) -> u32 {
        self.capacity() - self.len()
    }

    /// Entries pushed so far (free-running).
    #[inline]
    pub fn pushed(&self) -> u32 {
        self.head
    }

    /// Entries popped so far (free-running).
    #[inline]
    pub fn popped(&self) -> u32 {
        self.tail
    }

    /// Appends `v`; gives it back when full.
    ///
    /// # Errors
    /// `v`, when the ring is full.
    #[inline]
    pub fn push(&mut self, v: T) -> Result<(), T> {
        if self.free() == 0 {
            return Err(v);
        }
        self.slots[(self.head & self.mask) as usize] = Some(v);
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Removes the oldest entry.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let v = self.slots[(self.tail & self.mask) as usize].take();
        self.tail = self.tail.wrapping_add(1);
        v
    }

    /// The oldest entry.
    #[inline]
    pub fn front(&self) -> Option<&T> {
        if self.is_empty() {
            return None;
        }
        self.slots[(self.tail & self.mask) as usize].as_ref()
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len()).filter_map(move |k| {
            self.slots[(self.tail.wrapping_add(k) & self.mask) as usize].as_ref()
        })
    }

    /// Removes every entry, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.pop())
    }
}

/// What one look at a completion-queue slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A new entry for the consumer's lap.
    New,
    /// Nothing new.
    Empty,
    /// The device lapped the consumer.
    Overflow,
}

/// A NIC's owner-bit rule: how a consumer tells a new completion from an old one.
pub trait OwnerRule {
    /// Bytes per entry.
    const ENTRY_BYTES: usize;
    /// The consumer's starting position for a ring of `count` entries.
    fn initial_head(count: u32) -> u32;
    /// Classifies the entry at byte offset `off` for a consumer at free-running `head`.
    /// Reads only the owner field (one aligned atomic load), never the body.
    fn check(mem: &DevMem, off: usize, head: u32, count: u32) -> Slot;
}

/// What one poll of a completion queue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// A new entry at this byte offset of the ring; its owner was checked and a read barrier
    /// issued, so its body can be read.
    Entry(usize),
    /// Nothing new.
    Empty,
    /// The device lapped the consumer: entries were lost. The head is not advanced.
    Overflow,
}

/// Most entries one owner scan looks at before its read barrier.
const SCAN_MAX: u32 = 32;

/// A completion queue as the consumer sees it, with the owner rule `R`.
///
/// Polling checks the owner fields of up to 32 consecutive entries, stopping at the first
/// that is not new, then issues one read barrier for all of them (the barrier orders every
/// owner read before every body read that follows, as the per-entry barrier of DPDK and
/// rdma-core does), and hands the entries out one poll at a time.
#[derive(Debug)]
pub struct CompletionQueue<R: OwnerRule> {
    mem: Arc<DevMem>,
    count: u32,
    head: u32,
    /// Entries from `head` on whose owner was checked and fenced, not yet handed out.
    ready: u32,
    rule: PhantomData<R>,
}

impl<R: OwnerRule> CompletionQueue<R> {
    /// A CQ of `count` entries over `mem`.
    ///
    /// # Panics
    /// If `count` is not a power of two or `mem` is smaller than `count` entries.
    pub fn new(mem: Arc<DevMem>, count: u32) -> Self {
        assert!(
            count.is_power_of_two() && mem.len() >= count as usize * R::ENTRY_BYTES,
            "bad CQ: {count} entries in {mem:?}"
        );
        Self {
            mem,
            count,
            head: R::initial_head(count),
            ready: 0,
            rule: PhantomData,
        }
    }

    /// Entries in the ring.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The consumer position (free-running).
    pub fn head(&self) -> u32 {
        self.head
    }

    #[inline]
    fn offset(&self, pos: u32) -> usize {
        (pos & (self.count - 1)) as usize * R::ENTRY_BYTES
    }

    /// Looks at the next slot; on a new entry, consumes it (advances `head`).
    #[inline]
    pub fn poll(&mut self) -> Polled {
        if self.ready == 0 {
            let mut n = 0;
            let mut overflow = false;
            while n < SCAN_MAX.min(self.count) {
                let pos = self.head.wrapping_add(n);
                match R::check(&self.mem, self.offset(pos), pos, self.count) {
                    Slot::New => n += 1,
                    Slot::Empty => break,
                    Slot::Overflow => {
                        overflow = true;
                        break;
                    }
                }
            }
            if n == 0 {
                return if overflow {
                    Polled::Overflow
                } else {
                    Polled::Empty
                };
            }
            // The owner fields were read first; no body may be read before them.
            udma_from_device_barrier();
            self.ready = n;
        }
        self.ready -= 1;
        let off = self.offset(self.head);
        self.head = self.head.wrapping_add(1);
        Polled::Entry(off)
    }

    /// Moves the consumer `n` entries on without looking at them (the rest of an mlx5
    /// compressed session, whose slots carry no owner), forgetting any entries already
    /// checked ahead.
    pub fn skip(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
        self.ready = 0;
    }

    /// A view of the entries from the consumer on, up to `max` of them and not past the end
    /// of the ring (so they are contiguous), and how many it holds; for a consumer that
    /// checks the owners of a run itself, fences once ([`udma_from_device_barrier`]) and
    /// reads the bodies in place, then calls [`CompletionQueue::consume`].
    #[inline]
    pub fn run_view(&self, max: u32) -> (DevView<'_>, u32) {
        let first = self.head & (self.count - 1);
        let n = max.min(self.count - first);
        let view = self
            .mem
            .view(first as usize * R::ENTRY_BYTES, n as usize * R::ENTRY_BYTES)
            .expect("entries of the ring are inside its memory (checked at creation)");
        (view, n)
    }

    /// Consumes the next `n` entries, whose owners the caller checked and fenced (see
    /// [`CompletionQueue::run_view`]).
    #[inline]
    pub fn consume(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
        self.ready = self.ready.saturating_sub(n);
    }

    /// The byte offset of free-running position `pos` in the ring.
    pub fn offset_of(&self, pos: u32) -> usize {
        self.offset(pos)
    }

    /// The ring memory.
    pub fn mem(&self) -> &DevMem {
        &self.mem
    }

    /// Copies the first `out.len()` bytes of the entry at `off` (from [`Polled::Entry`]).
    #[inline]
    pub fn read(&self, off: usize, out: &mut [u8]) {
        debug_assert!(out.len() <= R::ENTRY_BYTES);
        self.mem.read(off, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn post_wraps_between_sges_and_refuses_when_full() {
        let mem = Arc::new(DevMem::anon(4096).unwrap());
        let mut wq = WorkQueue::new(Arc::clone(&mem), 32);
        // Fill 127 BUs, complete them, so the next WQE starts at the last slot.
        for _ in 0..127 {
            assert_eq!(wq.post(&[0u8; 32]), Some(1));
        }
        wq.complete(127);
        let wqe: Vec<u8> = (0..64u8).collect();
        assert_eq!(wq.post(&wqe), Some(2));
        let mut end = [0u8; 32];
        mem.read(4064, &mut end);
        assert_eq!(&end[..], &wqe[..32]);
        let mut start = [0u8; 32];
        mem.read(0, &mut start);
        assert_eq!(&start[..], &wqe[32..]);
        assert_eq!(wq.head_bytes(), 129 * 32);
        assert_eq!(wq.free(), 126);
        for _ in 0..126 {
            assert!(wq.post(&[0u8; 32]).is_some());
        }
        assert_eq!(wq.post(&[0u8; 32]), None, "full ring refuses");
    }

    proptest! {
        /// Counters stay consistent across the u32 wrap.
        #[test]
        fn counters_survive_u32_wrap(start in any::<u32>(), ops in proptest::collection::vec(1u32..4, 1..200)) {
            let mem = Arc::new(DevMem::anon(4096).unwrap());
            let mut wq = WorkQueue::new(mem, 32);
            wq.head = start;
            wq.tail = start;
            let mut in_flight = std::collections::VecDeque::new();
            for bu in ops {
                let wqe = vec![0u8; bu as usize * 32];
                match wq.post(&wqe) {
                    Some(n) => in_flight.push_back(n),
                    None => { let n = in_flight.pop_front().unwrap(); wq.complete(n); }
                }
                prop_assert_eq!(wq.free() + in_flight.iter().sum::<u32>(), 128);
            }
        }
    }

    #[test]
    fn desc_ring_is_a_bounded_fifo_across_counter_wrap() {
        let mut r = DescRing::new(4);
        r.head = u32::MAX - 1;
        r.tail = u32::MAX - 1;
        for i in 0..4 {
            r.push(i).unwrap();
        }
        assert_eq!(r.push(9), Err(9));
        assert_eq!((r.pop(), r.pop()), (Some(0), Some(1)));
        r.push(4).unwrap();
        assert_eq!(r.drain().collect::<Vec<_>>(), [2, 3, 4]);
        assert!(r.is_empty() && r.pop().is_none());
    }

    proptest! {
        /// Whatever the position and length, a wrapped write reads back the same bytes and
        /// touches nothing outside the copy.
        #[test]
        fn wrapped_write_reads_back_and_touches_nothing_else(size_log in 5u32..10, pos in any::<u32>(), len in 1usize..64) {
            let size = 1usize << size_log;
            let len = len.min(size);
            let ring = DevMem::anon(size).unwrap();
            let data: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a | 1).collect();
            write_wrapped(&ring, pos, &data);
            let mut back = vec![0u8; len];
            read_wrapped(&ring, pos, &mut back);
            prop_assert_eq!(&back, &data);
            let mut all = vec![0u8; size];
            ring.read(0, &mut all);
            prop_assert_eq!(all.iter().filter(|&&b| b != 0).count(), len);
            let (start, first) = wrap(size, pos, len);
            prop_assert!(start < size && first <= len && start + first <= size);
            prop_assert!(first == len || start + first == size);
        }
    }
}
