//! A single-producer single-consumer ring of frames over shared memory: one direction of a
//! cable. Used in-process (loopback) and between processes (shared-memory wire).
//!
//! Layout at `base` (all little-endian, 64-byte aligned counters to avoid false sharing):
//!
//! ```text
//! +0    producer: u64   frames written (free-running)
//! +64   consumer: u64   frames read (free-running)
//! +128  slot[0..slots], each slot_bytes: { len: u32, reserved: u32, data[slot_bytes - 8] }
//! ```
#![deny(unsafe_code)]

use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const PRODUCER: usize = 0;
const CONSUMER: usize = 64;
const SLOTS: usize = 128;
const SLOT_HDR: usize = 8;

/// Bytes one ring of `slots` slots of `slot_bytes` occupies.
pub const fn ring_bytes(slots: u32, slot_bytes: u32) -> usize {
    SLOTS + slots as usize * slot_bytes as usize
}

/// One direction of a cable, seen from one end (either the producer or the consumer side).
#[derive(Debug, Clone)]
pub struct FrameRing {
    mem: Arc<DevMem>,
    base: usize,
    slots: u32,
    slot_bytes: u32,
}

impl FrameRing {
    /// A ring at `base` in `mem`.
    ///
    /// # Panics
    /// If `slots` is not a power of two, a slot cannot hold a header and a minimal frame, or
    /// the ring does not fit in `mem`.
    pub fn new(mem: Arc<DevMem>, base: usize, slots: u32, slot_bytes: u32) -> Self {
        assert!(
            slots.is_power_of_two()
                && slot_bytes >= 64
                && slot_bytes.is_multiple_of(8)
                && base.is_multiple_of(64)
        );
        assert!(base + ring_bytes(slots, slot_bytes) <= mem.len());
        Self {
            mem,
            base,
            slots,
            slot_bytes,
        }
    }

    /// Largest frame a slot carries.
    pub fn max_frame(&self) -> usize {
        self.slot_bytes as usize - SLOT_HDR
    }

    fn slot_off(&self, n: u64) -> usize {
        self.base + SLOTS + (n & u64::from(self.slots - 1)) as usize * self.slot_bytes as usize
    }

    /// Producer side: appends a frame. `false` if the ring is full or the frame too large
    /// (the frame is dropped, as on a real wire whose receiver is not keeping up).
    pub fn push(&self, frame: &[u8]) -> bool {
        if frame.len() > self.max_frame() {
            return false;
        }
        let prod = self.mem.load_u64(self.base + PRODUCER, Ordering::Relaxed);
        let cons = self.mem.load_u64(self.base + CONSUMER, Ordering::Acquire);
        if prod.wrapping_sub(cons) >= u64::from(self.slots) {
            return false;
        }
        let off = self.slot_off(prod);
        self.mem
            .store_u32(off, frame.len() as u32, Ordering::Relaxed);
        self.mem.write(off + SLOT_HDR, frame);
        // Publishes the slot: the consumer's Acquire load of `producer` sees its bytes.
        self.mem.store_u64(
            self.base + PRODUCER,
            prod.wrapping_add(1),
            Ordering::Release,
        );
        true
    }

    /// Consumer side: takes the oldest frame into `buf` (cut to `buf.len()`); its full
    /// length, or `None` when the ring is empty.
    pub fn pop(&self, buf: &mut [u8]) -> Option<usize> {
        let cons = self.mem.load_u64(self.base + CONSUMER, Ordering::Relaxed);
        let prod = self.mem.load_u64(self.base + PRODUCER, Ordering::Acquire);
        if cons == prod {
            return None;
        }
        let off = self.slot_off(cons);
        let len = (self.mem.load_u32(off, Ordering::Relaxed) as usize).min(self.max_frame());
        let n = len.min(buf.len());
        self.mem.read(off + SLOT_HDR, &mut buf[..n]);
        // Frees the slot only after its bytes were copied out.
        self.mem.store_u64(
            self.base + CONSUMER,
            cons.wrapping_add(1),
            Ordering::Release,
        );
        Some(len)
    }

    /// Frames waiting.
    pub fn len(&self) -> u64 {
        let prod = self.mem.load_u64(self.base + PRODUCER, Ordering::Acquire);
        let cons = self.mem.load_u64(self.base + CONSUMER, Ordering::Acquire);
        prod.wrapping_sub(cons)
    }

    /// Whether no frame is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_full_and_wrap() {
        let mem = Arc::new(DevMem::anon(ring_bytes(4, 128)).unwrap());
        let r = FrameRing::new(mem, 0, 4, 128);
        let mut buf = [0u8; 256];
        assert_eq!(r.pop(&mut buf), None);
        for lap in 0..10u8 {
            for i in 0..4u8 {
                assert!(r.push(&[lap, i, 0xaa]));
            }
            assert!(!r.push(&[9]), "fifth frame must not fit");
            for i in 0..4u8 {
                assert_eq!(r.pop(&mut buf), Some(3));
                assert_eq!(&buf[..3], &[lap, i, 0xaa]);
            }
        }
        assert!(!r.push(&[0u8; 121]), "larger than a slot");
        assert!(r.push(&[0u8; 120]));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn two_threads_lose_nothing() {
        let mem = Arc::new(DevMem::anon(ring_bytes(64, 128)).unwrap());
        let tx = FrameRing::new(Arc::clone(&mem), 0, 64, 128);
        let rx = tx.clone();
        const N: u32 = 100_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                while !tx.push(&i.to_le_bytes()) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut buf = [0u8; 128];
        let mut next = 0u32;
        while next < N {
            if let Some(n) = rx.pop(&mut buf) {
                assert_eq!(n, 4);
                assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), next);
                next += 1;
            }
        }
        t.join().unwrap();
    }
}
