//! The mlx5 completion queue: the shared [`ring::CompletionQueue`] with the mlx5 owner rule
//! (spec §5.2): one owner bit, the lap parity of the consumer counter; opcode 15 (INVALID) is
//! never software's. The consumer counter starts at 0.
#![deny(unsafe_code)]

use crate::hw::mlx5::cqe::{sw_owned, OP_OWN};
use crate::hw::mlx5::CQE_BYTES;
use crate::ring::{self, OwnerRule, Slot};
use crate::sys::DevMem;
use std::sync::atomic::Ordering;

/// The mlx5 owner-bit rule. A one-bit owner cannot tell a lapped consumer from an empty
/// slot, so it never reports an overflow: the device itself stalls instead of overrunning
/// the consumer index it reads from the CQ doorbell record (§5.4).
#[derive(Debug)]
pub struct Mlx5Owner;

impl OwnerRule for Mlx5Owner {
    const ENTRY_BYTES: usize = CQE_BYTES;

    fn initial_head(_count: u32) -> u32 {
        0
    }

    #[inline]
    fn check(mem: &DevMem, off: usize, head: u32, count: u32) -> Slot {
        // `op_own` is byte 63, the top byte of the big-endian-stored dword at 60: read the
        // dword with one aligned load and take its last byte in memory order.
        let dw = mem.load_u32(off + OP_OWN - 3, Ordering::Acquire);
        let op_own = dw.to_ne_bytes()[3];
        if sw_owned(op_own, head, count) {
            Slot::New
        } else {
            Slot::Empty
        }
    }
}

/// An mlx5 completion queue.
pub type CompletionQueue = ring::CompletionQueue<Mlx5Owner>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::mlx5::cqe::op_own;
    use crate::ring::Polled;
    use std::sync::Arc;

    #[test]
    fn poll_follows_the_owner_bit_over_many_laps_and_skips_invalid() {
        let count = 4u32;
        let mem = Arc::new(DevMem::anon(4096).unwrap());
        // Software initialises every entry to INVALID with owner 1 (not lap 0's parity).
        for i in 0..count as usize {
            mem.write(i * 64 + 63, &[op_own(15, 0, true)]);
        }
        let mut cq = CompletionQueue::new(Arc::clone(&mem), count);
        assert_eq!(cq.poll(), Polled::Empty);
        for n in 0..count * 10 {
            let slot = (n % count) as usize * 64;
            let lap_odd = (n / count) & 1 == 1;
            mem.write(slot + 63, &[op_own(2, 0, lap_odd)]);
            assert_eq!(cq.poll(), Polled::Entry(slot));
            assert_eq!(cq.poll(), Polled::Empty);
        }
    }
}
