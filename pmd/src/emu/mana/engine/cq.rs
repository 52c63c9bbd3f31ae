//! Writing CQEs: body first, then the owner bits (§10 items 10-12), and holding completions
//! back for `completion_delay_steps` (slow completions).
#![deny(unsafe_code)]

use super::{Cq, CqOf, Engine};
use crate::hw::mana::cqe::{owner_for, Cqe};
use crate::hw::mana::CQE_BYTES;
use crate::sys::barrier::fence_before_owner_write;
use std::sync::atomic::Ordering;

impl Engine {
    /// Writes the delayed completions that are due; returns how many.
    pub(super) fn release_delayed(&mut self) -> usize {
        let mut n = 0;
        let steps = self.steps;
        let cqs = self
            .sqs
            .iter_mut()
            .map(|q| &mut q.cq)
            .chain(self.rqs.iter_mut().map(|q| &mut q.cq));
        for cq in cqs {
            while cq.delayed.front().is_some_and(|d| d.0 <= steps) {
                if let Some((_, body, wq, is_sq)) = cq.delayed.pop_front() {
                    write_cqe_now(cq, &body, wq, is_sq);
                    n += 1;
                }
            }
        }
        self.delayed -= n;
        n
    }

    /// Completes work queue `wq` on CQ `cq` with `body`: now, or after the configured delay
    /// (and never ahead of completions already waiting, so a CQ stays in order).
    /// The body is passed by reference: a by-value copy would load it in wide pieces right
    /// after the field setters' 4-byte stores (a store-forwarding stall per completion).
    #[inline]
    pub(super) fn complete(&mut self, cq: CqOf, body: &[u8; CQE_BYTES], wq: u32, is_sq: bool) {
        if is_sq {
            self.stats.tx_cqes += 1;
        } else {
            self.stats.rx_cqes += 1;
        }
        let delay = u64::from(self.faults.completion_delay_steps);
        let steps = self.steps;
        let cq = self.cq_mut(cq);
        if delay > 0 || !cq.delayed.is_empty() {
            cq.delayed.push_back((steps + delay, *body, wq, is_sq));
            self.delayed += 1;
        } else {
            write_cqe_now(cq, body, wq, is_sq);
        }
    }
}

/// Writes a CQE: body first, then (after a release fence) the info dword with the owner
/// bits as one aligned 32-bit store (§10 items 10-12).
#[inline]
fn write_cqe_now(cq: &mut Cq, body: &[u8; CQE_BYTES], wq: u32, is_sq: bool) {
    debug_assert_eq!(u64::from(cq.slot), cq.written % u64::from(cq.count));
    debug_assert_eq!(cq.owner, owner_for(cq.written, cq.count));
    let (slot, owner) = (cq.slot as usize * CQE_BYTES, cq.owner);
    cq.mem.write_dwords(slot, &body[..60]);
    fence_before_owner_write();
    cq.mem.store_u32(
        slot + 60,
        Cqe::<[u8; 64]>::info_value(wq, is_sq, owner),
        Ordering::Release,
    );
    cq.written += 1;
    cq.slot += 1;
    if cq.slot == cq.count {
        // A new lap: the next generation of owner bits.
        cq.slot = 0;
        cq.owner = owner_for(cq.written, cq.count);
    }
}
