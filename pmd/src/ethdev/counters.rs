//! Per-queue counters: written by the one core that owns the queue, read by anyone.
#![deny(unsafe_code)]

use super::config::QueueStats;
use std::sync::atomic::{AtomicU64, Ordering};

/// One queue's counters. The owning core adds with a relaxed load + store (no locked
/// read-modify-write: there is exactly one writer); the main core reads relaxed snapshots.
#[derive(Debug, Default)]
pub struct Counters {
    packets: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    missed: AtomicU64,
    nombuf: AtomicU64,
}

/// Adds `n` to a counter that only the calling core writes (a relaxed load and store, no
/// locked read-modify-write); readers on other cores see the old or the new value.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    if n != 0 {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

impl Counters {
    /// Adds `packets` packets of `bytes` bytes in total. Only the owning core calls this.
    #[inline]
    pub fn add(&self, packets: u64, bytes: u64) {
        bump(&self.packets, packets);
        bump(&self.bytes, bytes);
    }
    /// Adds errors.
    #[inline]
    pub fn add_errors(&self, n: u64) {
        bump(&self.errors, n);
    }
    /// Adds frames missed for lack of RX buffers.
    #[inline]
    pub fn add_missed(&self, n: u64) {
        bump(&self.missed, n);
    }
    /// Adds failed refills.
    #[inline]
    pub fn add_nombuf(&self, n: u64) {
        bump(&self.nombuf, n);
    }
    /// A snapshot.
    pub fn snapshot(&self) -> QueueStats {
        QueueStats {
            packets: self.packets.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            nombuf: self.nombuf.load(Ordering::Relaxed),
        }
    }
}
