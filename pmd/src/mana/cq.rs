//! The MANA completion queue: the shared [`ring::CompletionQueue`] with GDMA's owner rule
//! (spec §7.2): 3 owner bits in the info dword, 8 generations, consumer head starting at
//! `count`.
#![deny(unsafe_code)]

use crate::hw::mana::cqe::{check_owner, info_owner_bits, OwnerCheck, INFO_OFFSET};
use crate::hw::mana::CQE_BYTES;
use crate::ring::{self, OwnerRule, Slot};
use crate::sys::DevMem;
use std::sync::atomic::Ordering;

/// GDMA's owner-bit rule.
#[derive(Debug)]
pub struct GdmaOwner;

impl OwnerRule for GdmaOwner {
    const ENTRY_BYTES: usize = CQE_BYTES;

    fn initial_head(count: u32) -> u32 {
        // DPDK starts at `count`; Linux and rdma-core at `1 << log2(count)`: the same.
        count
    }

    #[inline]
    fn check(mem: &DevMem, off: usize, head: u32, count: u32) -> Slot {
        // The info dword (owner bits in [31:29]) is read first, as one aligned load.
        let info = mem.load_u32(off + INFO_OFFSET, Ordering::Acquire);
        match check_owner(info_owner_bits(info), head, count) {
            OwnerCheck::New => Slot::New,
            OwnerCheck::Empty => Slot::Empty,
            OwnerCheck::Overflow => Slot::Overflow,
        }
    }
}

/// A MANA completion queue.
pub type CompletionQueue = ring::CompletionQueue<GdmaOwner>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::mana::cqe::owner_for;
    use crate::ring::Polled;
    use std::sync::Arc;

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
