//! Queue mechanics shared by the drivers: a circular work queue of 32-byte basic units with
//! free-running producer/consumer counters, and a completion queue polled by owner bits.
//!
//! Counters are free-running `u32`s (`Wrapping` arithmetic): `head - tail` is the number of
//! units in flight even after the counters wrap, because ring sizes divide 2^32.
#![deny(unsafe_code)]

use crate::hw::mana::cqe::{check_owner, OwnerCheck};
use crate::hw::mana::{BU_BYTES, CQE_BYTES};
use crate::sys::mem::fence_after_owner_check;
use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A GDMA work queue (SQ or RQ) as the driver sees it: it writes WQEs at `head` and the
/// device frees them, in order, up to `tail`.
#[derive(Debug)]
pub struct WorkQueue {
    mem: Arc<DevMem>,
    size_bytes: u32,
    /// Producer position in BUs (free-running).
    head_bu: u32,
    /// Consumer position in BUs (free-running), advanced as completions come back.
    tail_bu: u32,
}

impl WorkQueue {
    /// A queue over `mem` (the whole of it is the ring).
    ///
    /// # Panics
    /// If the size is not a power of two of at least 32 bytes, or over 2^31.
    pub fn new(mem: Arc<DevMem>) -> Self {
        let size = mem.len();
        assert!(
            size.is_power_of_two() && (BU_BYTES..=1 << 31).contains(&size),
            "bad work queue size {size}"
        );
        Self {
            mem,
            size_bytes: size as u32,
            head_bu: 0,
            tail_bu: 0,
        }
    }

    /// Ring size in bytes.
    pub fn size_bytes(&self) -> u32 {
        self.size_bytes
    }

    /// Producer position in BUs.
    pub fn head_bu(&self) -> u32 {
        self.head_bu
    }

    /// Consumer position in BUs.
    pub fn tail_bu(&self) -> u32 {
        self.tail_bu
    }

    /// BUs free for new WQEs.
    #[inline]
    pub fn free_bu(&self) -> u32 {
        self.size_bytes / BU_BYTES as u32 - self.head_bu.wrapping_sub(self.tail_bu)
    }

    /// The value a doorbell carries: the producer position in bytes, mod 2^32 (§6.1).
    #[inline]
    pub fn doorbell_position(&self) -> u32 {
        self.head_bu.wrapping_mul(BU_BYTES as u32)
    }

    /// Copies one WQE (a multiple of 32 bytes) to the producer position, continuing at
    /// offset 0 where it passes the end (§3.4), and advances `head`. Returns its size in BUs,
    /// or `None` (nothing written) if the ring lacks room.
    #[inline]
    pub fn post(&mut self, wqe: &[u8]) -> Option<u32> {
        debug_assert!(wqe.len().is_multiple_of(BU_BYTES) && !wqe.is_empty());
        let bu = (wqe.len() / BU_BYTES) as u32;
        if bu > self.free_bu() {
            return None;
        }
        let pos = (self.doorbell_position() & (self.size_bytes - 1)) as usize;
        let first = wqe.len().min(self.size_bytes as usize - pos);
        self.mem.write(pos, &wqe[..first]);
        if first < wqe.len() {
            self.mem.write(0, &wqe[first..]);
        }
        self.head_bu = self.head_bu.wrapping_add(bu);
        Some(bu)
    }

    /// Marks `bu` units at the tail as consumed by the device.
    #[inline]
    pub fn complete(&mut self, bu: u32) {
        debug_assert!(bu <= self.head_bu.wrapping_sub(self.tail_bu));
        self.tail_bu = self.tail_bu.wrapping_add(bu);
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

    /// Removes every entry, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.pop())
    }
}

/// What one poll of a completion queue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// A new CQE at this byte offset of the CQ ring; its owner was checked and a read barrier
    /// issued, so its body can be read.
    Entry(usize),
    /// Nothing new.
    Empty,
    /// The device lapped the consumer: entries were lost. The head is not advanced.
    Overflow,
}

/// A MANA completion queue as the consumer sees it (§7.2): `head` starts at `count`.
#[derive(Debug)]
pub struct CompletionQueue {
    mem: Arc<DevMem>,
    count: u32,
    head: u32,
}

impl CompletionQueue {
    /// A CQ of `count` 64-byte entries over `mem`.
    ///
    /// # Panics
    /// If `count` is not a power of two or `mem` is smaller than `count` entries.
    pub fn new(mem: Arc<DevMem>, count: u32) -> Self {
        assert!(
            count.is_power_of_two() && mem.len() >= count as usize * CQE_BYTES,
            "bad CQ: {count} entries in {mem:?}"
        );
        Self {
            mem,
            count,
            head: count,
        }
    }

    /// Entries in the ring.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The consumer position (free-running, started at `count`).
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The memory of the ring (to read a polled entry).
    pub fn mem(&self) -> &DevMem {
        &self.mem
    }

    /// Looks at the next slot; on a new entry, consumes it (advances `head`).
    #[inline]
    pub fn poll(&mut self) -> Polled {
        let off = (self.head & (self.count - 1)) as usize * CQE_BYTES;
        // The info dword (owner bits in [31:29]) is read first, as one aligned load.
        let info = self.mem.load_u32(off + 60, Ordering::Acquire);
        match check_owner((info >> 29) as u8, self.head, self.count) {
            OwnerCheck::New => {
                fence_after_owner_check();
                self.head = self.head.wrapping_add(1);
                Polled::Entry(off)
            }
            OwnerCheck::Empty => Polled::Empty,
            OwnerCheck::Overflow => Polled::Overflow,
        }
    }

    /// Copies the 64 bytes of the entry at `off` (from [`Polled::Entry`]).
    #[inline]
    pub fn read(&self, off: usize, out: &mut [u8; CQE_BYTES]) {
        self.mem.read(off, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::mana::cqe::owner_for;
    use proptest::prelude::*;

    #[test]
    fn post_wraps_between_sges_and_refuses_when_full() {
        let mem = Arc::new(DevMem::anon(4096).unwrap());
        let mut wq = WorkQueue::new(Arc::clone(&mem));
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
        assert_eq!(wq.doorbell_position(), 129 * 32);
        assert_eq!(wq.free_bu(), 126);
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
            let mut wq = WorkQueue::new(mem);
            wq.head_bu = start;
            wq.tail_bu = start;
            let mut in_flight = std::collections::VecDeque::new();
            for bu in ops {
                let wqe = vec![0u8; bu as usize * 32];
                match wq.post(&wqe) {
                    Some(n) => in_flight.push_back(n),
                    None => { let n = in_flight.pop_front().unwrap(); wq.complete(n); }
                }
                prop_assert_eq!(wq.free_bu() + in_flight.iter().sum::<u32>(), 128);
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

    #[test]
    fn cq_poll_follows_owner_generations_over_many_laps() {
        let count = 4u32;
        let mem = Arc::new(DevMem::anon(4096).unwrap());
        let mut cq = CompletionQueue::new(Arc::clone(&mem), count);
        assert_eq!(cq.poll(), Polled::Empty);
        for n in 0..(count as u64 * 20) {
            let slot = (n % u64::from(count)) as usize * 64;
            mem.store_u32(
                slot + 60,
                u32::from(owner_for(n, count)) << 29,
                Ordering::Release,
            );
            assert!(matches!(cq.poll(), Polled::Entry(off) if off == slot));
            assert_eq!(cq.poll(), Polled::Empty);
        }
        // The device laps the consumer: write two laps ahead into the next slot.
        let n = count as u64 * 21;
        mem.store_u32(
            ((n % 4) as usize) * 64 + 60,
            u32::from(owner_for(n + 4, count)) << 29,
            Ordering::Release,
        );
        assert_eq!(cq.poll(), Polled::Overflow);
    }
}
