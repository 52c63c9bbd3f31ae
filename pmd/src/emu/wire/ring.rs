//! A single-producer single-consumer ring of frames over shared memory: one direction of a
//! cable. Used in-process (loopback) and between processes (shared-memory wire).
//!
//! Frames are packed one after the other as variable-length records, so that small frames
//! cost little memory and the consumer reads memory in order (one 64-byte cache line per
//! 60-byte frame; the hardware prefetcher follows). Layout at `base` (all little-endian;
//! the two counters on cache lines of their own, so producer and consumer do not share one):
//!
//! ```text
//! +0    producer: u64   bytes written (free-running), stored with Release after the record
//! +64   consumer: u64   bytes read (free-running), stored with Release after the copy out
//! +128  data: ring_bytes bytes (a power of two, a multiple of 64)
//! ```
//!
//! A record starts on a 64-byte boundary: a 4-byte header, then the frame, then padding to
//! the next boundary (a 60-byte frame takes exactly one line):
//!
//! ```text
//! +0  header: u32   bits 0..=15 frame length in bytes; bit 31 WRAP: no frame, the next
//!                   record is at the start of the data area (the rest was too short)
//! +4  frame bytes
//! ```
//!
//! A record never wraps around the end of the data area: when it does not fit before the
//! end, the producer writes a WRAP header there and puts the record at the start; the bytes
//! skipped count as written. Both counters are bytes, so `producer - consumer` is the space
//! in use and the ring is full when a record (with its skip) would not fit in what is left.
//!
//! Each side keeps its own counter and its last view of the other's in private memory and
//! reads the shared counter of the other side only when its view says full (producer) or
//! empty (consumer): a view that lags only ever understates the room or the frames waiting,
//! so the shared lines move between the two cores about once per batch, not per frame.
//!
//! Both sides also publish their counters lazily. The producer publishes when its user says
//! a batch is complete ([`FrameRing::publish`]: a device model after serving its send
//! queues, like a NIC's burst onto the wire), when it finds the ring full, and at the latest
//! after a sixteenth of the ring: a consumer that polls an empty ring keeps the producer's
//! line in its cache, and a store to it on every frame would pull it back each time. The
//! consumer publishes when it has caught up with what it saw, or after a sixteenth of the
//! ring, so that a producer that finds the ring full (and reads the consumer's line) does
//! not pull it away on every frame. The room a producer sees is at most that much less than
//! the real room.
//!
//! Both sides prefetch the lines ahead of them: the consumer the records it is about to read
//! (written by the other core, so each is a cache miss that prefetching overlaps with the
//! work on the frames before it), the producer the lines it is about to write (for
//! ownership).
#![deny(unsafe_code)]

use crate::sys::DevMem;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const PRODUCER: usize = 0;
const CONSUMER: usize = 64;
const DATA: usize = 128;
/// Records start on this boundary.
pub const RECORD_ALIGN: usize = 64;
const HEADER: usize = 4;
/// How far ahead of its counter each side prefetches.
const PREFETCH_AHEAD: u64 = 8 * RECORD_ALIGN as u64;
/// Header bit: skip to the start of the data area.
const WRAP: u32 = 1 << 31;
const LEN_MASK: u32 = 0xffff;

/// Bytes one ring with `data_bytes` bytes of records occupies (counters included).
pub const fn ring_bytes(data_bytes: usize) -> usize {
    DATA + data_bytes
}

/// Bytes the record of a `len`-byte frame takes.
#[inline]
const fn record_bytes(len: usize) -> usize {
    (HEADER + len).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// One direction of a cable, seen from one end: use it either as the producer or as the
/// consumer (the state each side keeps is private to its copy).
#[derive(Debug, Clone)]
pub struct FrameRing {
    mem: Arc<DevMem>,
    base: usize,
    /// Bytes in the data area, a power of two.
    size: u64,
    max_frame: usize,
    /// Producer side: bytes written (ours), our counter as last published at
    /// `base + PRODUCER` (see the module docs), and the consumer's counter as last read.
    prod: u64,
    prod_published: u64,
    cons_seen: u64,
    /// Consumer side: bytes read (ours), the producer's counter as last read, and our
    /// counter as last published (see the module docs).
    cons: u64,
    prod_seen: u64,
    cons_published: u64,
    /// Times the other side's counter or a record broke the ring's rules (see
    /// [`corrupt`](Self::corrupt)).
    corrupt: u64,
    /// The other side's counter was bad when last read (counted once until it is good).
    peer_bad: bool,
}

/// Whether `x` is on a record boundary.
#[inline]
const fn on_record(x: u64) -> bool {
    x.is_multiple_of(RECORD_ALIGN as u64)
}

impl FrameRing {
    /// A ring at `base` in `mem` with `data_bytes` bytes of records, carrying frames of up
    /// to `max_frame` bytes. Takes the counters as they are in memory (a fresh ring: zero).
    ///
    /// # Panics
    /// If `data_bytes` is not a power of two of at least two largest records, `max_frame`
    /// does not fit the header's length field, `base` is not 64-byte aligned, or the ring
    /// does not fit in `mem`.
    pub fn new(mem: Arc<DevMem>, base: usize, data_bytes: usize, max_frame: usize) -> Self {
        assert!(
            data_bytes.is_power_of_two()
                && max_frame <= LEN_MASK as usize
                && data_bytes >= 2 * record_bytes(max_frame)
                && base.is_multiple_of(64)
        );
        assert!(base + ring_bytes(data_bytes) <= mem.len());
        let prod = mem.load_u64(base + PRODUCER, Ordering::Acquire);
        let cons = mem.load_u64(base + CONSUMER, Ordering::Acquire);
        Self {
            mem,
            base,
            size: data_bytes as u64,
            max_frame,
            prod,
            prod_published: prod,
            cons_seen: cons,
            cons,
            // Not `prod`: the first `pop` reads the producer's counter and checks it.
            prod_seen: cons,
            cons_published: cons,
            corrupt: 0,
            peer_bad: false,
        }
    }

    /// Times the other process broke the ring's rules as this side saw it: a counter off a
    /// record boundary, a producer more than the ring ahead of the consumer (or behind it),
    /// a record that runs past the end of the data area. The ring is shared memory another
    /// process writes (a peer that is hostile, buggy or died mid-write): such a ring is
    /// never read or written outside its data area; the consumer takes nothing until the
    /// producer's counter makes sense again (and drops what was pending when a record did
    /// not), the producer sends nothing while the consumer's counter makes none.
    pub fn corrupt(&self) -> u64 {
        self.corrupt
    }

    /// Consumer side, on a record that breaks the rules: counts it, drops what is pending
    /// (up to the producer's counter as last read) and publishes that; no frame.
    #[cold]
    fn drop_pending(&mut self) -> Option<usize> {
        self.corrupt += 1;
        self.cons = self.prod_seen;
        self.cons_published = self.cons;
        self.mem
            .store_u64(self.base + CONSUMER, self.cons, Ordering::Release);
        None
    }

    /// The other side's counter broke the rules: counted once until it is good again.
    #[cold]
    fn peer_is_bad(&mut self) {
        if !self.peer_bad {
            self.peer_bad = true;
            self.corrupt += 1;
        }
    }

    /// Largest frame the ring carries.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    #[inline]
    fn data_off(&self, pos: u64) -> usize {
        self.base + DATA + (pos & (self.size - 1)) as usize
    }

    /// Producer side: appends a frame, for the consumer to see at the next
    /// [`publish`](Self::publish) (or earlier, see the module docs). `false` if the ring is
    /// full or the frame too large (the frame is dropped, as on a real wire whose receiver is
    /// not keeping up; the caller counts it).
    #[inline]
    pub fn push(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.max_frame {
            return false;
        }
        if !on_record(self.prod) {
            // Our own counter, as a previous holder of this end left it: ours to mend.
            // (Counters are free-running: the next boundary, wrapping past the top.)
            self.prod = (self.prod | (RECORD_ALIGN as u64 - 1)).wrapping_add(1);
            self.corrupt += 1;
        }
        let need = record_bytes(frame.len()) as u64;
        let to_end = self.size - (self.prod & (self.size - 1));
        let skip = if need > to_end { to_end } else { 0 };
        if self
            .size
            .saturating_sub(self.prod.wrapping_sub(self.cons_seen))
            < skip + need
        {
            // Our view of the consumer may lag: look again before calling the ring full.
            let seen = self.mem.load_u64(self.base + CONSUMER, Ordering::Acquire);
            if !on_record(seen) || self.prod.wrapping_sub(seen) > self.size {
                // A consumer counter that makes no sense: no room, rather than overwriting
                // records it may still read.
                self.peer_is_bad();
                return false;
            }
            self.peer_bad = false;
            self.cons_seen = seen;
            if self.size - self.prod.wrapping_sub(self.cons_seen) < skip + need {
                // Whatever waits unpublished is all the consumer can make room with.
                self.publish();
                return false;
            }
        }
        let mut at = self.prod;
        // Ahead of us, but only into room we know is free: a line the consumer has still to
        // read would be pulled away from it.
        let ahead = at.wrapping_add(skip + need + PREFETCH_AHEAD);
        if ahead.wrapping_sub(self.cons_seen) <= self.size {
            self.mem.prefetch_write(self.data_off(ahead));
        }
        if skip > 0 {
            self.mem
                .store_u32(self.data_off(at), WRAP, Ordering::Relaxed);
            at = at.wrapping_add(skip);
        }
        let off = self.data_off(at);
        self.mem
            .store_u32(off, frame.len() as u32, Ordering::Relaxed);
        self.mem.write(off + HEADER, frame);
        self.prod = at.wrapping_add(need);
        if self.prod.wrapping_sub(self.prod_published) >= self.size / 16 {
            self.publish();
        }
        true
    }

    /// Producer side: makes every frame pushed so far visible to the consumer (one store to
    /// the shared counter, none if nothing was pushed since the last).
    #[inline]
    pub fn publish(&mut self) {
        if self.prod != self.prod_published {
            self.prod_published = self.prod;
            // Publishes the records (and skips) before it: the consumer's Acquire load of
            // `producer` sees their bytes.
            self.mem
                .store_u64(self.base + PRODUCER, self.prod, Ordering::Release);
        }
    }

    /// Consumer side: makes every frame taken so far known to the producer (it publishes
    /// lazily while taking them, see the module docs). For an end that closes: the far end
    /// then counts as unread ([`unread_frames`](Self::unread_frames)) only what was not taken.
    pub fn publish_consumed(&mut self) {
        if self.cons != self.cons_published {
            self.cons_published = self.cons;
            self.mem
                .store_u64(self.base + CONSUMER, self.cons, Ordering::Release);
        }
    }

    /// Consumer side: takes the oldest frame into `buf` (cut to `buf.len()`); its full
    /// length, or `None` when the ring is empty.
    #[inline]
    pub fn pop(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            if self.cons == self.prod_seen {
                let seen = self.mem.load_u64(self.base + PRODUCER, Ordering::Acquire);
                if seen == self.cons {
                    return None;
                }
                if !on_record(self.cons) {
                    // Our own counter, as a previous holder left it: start again at the
                    // producer's, once that is on a record boundary.
                    if on_record(seen) {
                        self.corrupt += 1;
                        self.cons = seen;
                        self.cons_published = seen;
                        self.mem
                            .store_u64(self.base + CONSUMER, seen, Ordering::Release);
                    }
                    self.prod_seen = self.cons;
                    return None;
                }
                if !on_record(seen) || seen.wrapping_sub(self.cons) > self.size {
                    // A producer counter that makes no sense: nothing to take until it does.
                    self.peer_is_bad();
                    self.prod_seen = self.cons;
                    return None;
                }
                self.peer_bad = false;
                self.prod_seen = seen;
                // New records: start fetching the first lines of them now.
                let mut at = self.cons.wrapping_add(RECORD_ALIGN as u64);
                while at < self.prod_seen.min(self.cons.wrapping_add(PREFETCH_AHEAD)) {
                    self.mem.prefetch(self.data_off(at));
                    at = at.wrapping_add(RECORD_ALIGN as u64);
                }
            }
            self.mem
                .prefetch(self.data_off(self.cons.wrapping_add(PREFETCH_AHEAD)));
            let off = self.data_off(self.cons);
            let hdr = self.mem.load_u32(off, Ordering::Relaxed);
            if hdr & WRAP != 0 {
                let to_end = self.size - (self.cons & (self.size - 1));
                if self.prod_seen.wrapping_sub(self.cons) < to_end {
                    // A skip past the producer.
                    return self.drop_pending();
                }
                self.cons = self.cons.wrapping_add(to_end);
                continue;
            }
            let len = ((hdr & LEN_MASK) as usize).min(self.max_frame);
            let end = (self.cons & (self.size - 1)) + record_bytes(len) as u64;
            if end > self.size || self.prod_seen.wrapping_sub(self.cons) < record_bytes(len) as u64
            {
                // A record past the data area or past the producer.
                return self.drop_pending();
            }
            let n = len.min(buf.len());
            self.mem.read(off + HEADER, &mut buf[..n]);
            self.cons = self.cons.wrapping_add(record_bytes(len) as u64);
            // Frees the records only after their bytes were copied out; lazily (module docs).
            if self.cons == self.prod_seen
                || self.cons.wrapping_sub(self.cons_published) >= self.size / 16
            {
                self.cons_published = self.cons;
                self.mem
                    .store_u64(self.base + CONSUMER, self.cons, Ordering::Release);
            }
            return Some(len);
        }
    }

    /// Consumer side: drops every frame waiting now, unread, and publishes the counter (the
    /// producer gets the room back); how many frames that was. Control path: a cable end
    /// that is taken over by a new process discards what was sent to the old one (see
    /// [`super::Shm`]). Frames the producer adds meanwhile stay for the next [`pop`](Self::pop).
    pub fn discard_all(&mut self) -> u64 {
        let prod = self.mem.load_u64(self.base + PRODUCER, Ordering::Acquire);
        let mut frames = 0;
        if on_record(prod) && on_record(self.cons) && prod.wrapping_sub(self.cons) <= self.size {
            while self.cons != prod {
                let hdr = self
                    .mem
                    .load_u32(self.data_off(self.cons), Ordering::Relaxed);
                if hdr & WRAP != 0 {
                    self.cons = self
                        .cons
                        .wrapping_add(self.size - (self.cons & (self.size - 1)));
                } else {
                    let len = ((hdr & LEN_MASK) as usize).min(self.max_frame);
                    self.cons = self.cons.wrapping_add(record_bytes(len) as u64);
                    frames += 1;
                }
                if prod.wrapping_sub(self.cons) > self.size {
                    // A record ran past the producer: the counters were not this ring's.
                    break;
                }
            }
        }
        // Counters from a producer that broke the protocol: start clean at its position.
        self.cons = prod;
        self.prod_seen = prod;
        self.cons_published = prod;
        self.mem
            .store_u64(self.base + CONSUMER, prod, Ordering::Release);
        frames
    }

    /// Producer side: frames pushed (published or not) that the consumer has not read yet,
    /// as its shared counter says now. Slow path: walks the records.
    pub fn unread_frames(&self) -> u64 {
        let mut at = self.mem.load_u64(self.base + CONSUMER, Ordering::Acquire);
        let mut frames = 0;
        if !on_record(at) || !on_record(self.prod) {
            return 0;
        }
        while at != self.prod && self.prod.wrapping_sub(at) <= self.size {
            let hdr = self.mem.load_u32(self.data_off(at), Ordering::Relaxed);
            if hdr & WRAP != 0 {
                at = at.wrapping_add(self.size - (at & (self.size - 1)));
            } else {
                let len = ((hdr & LEN_MASK) as usize).min(self.max_frame);
                at = at.wrapping_add(record_bytes(len) as u64);
                frames += 1;
            }
        }
        frames
    }

    /// Bytes of records waiting (as the shared counters say now).
    pub fn pending_bytes(&self) -> u64 {
        let prod = self.mem.load_u64(self.base + PRODUCER, Ordering::Acquire);
        let cons = self.mem.load_u64(self.base + CONSUMER, Ordering::Acquire);
        prod.wrapping_sub(cons)
    }

    /// Whether no frame is waiting.
    pub fn is_empty(&self) -> bool {
        self.pending_bytes() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(data_bytes: usize, max_frame: usize) -> (FrameRing, FrameRing) {
        let mem = Arc::new(DevMem::anon(ring_bytes(data_bytes)).unwrap());
        let tx = FrameRing::new(Arc::clone(&mem), 0, data_bytes, max_frame);
        let rx = tx.clone();
        (tx, rx)
    }

    /// Found by the `shm_ring` fuzz target: counters the other process wrote off a record
    /// boundary made the consumer read a record header at an unaligned offset (a panic in
    /// `DevMem`), and a producer counter more than a ring ahead had it hand out records
    /// forever. Now such counters are counted as corruption, nothing is read or written
    /// outside the data area, and the ring works again once the counters make sense.
    #[test]
    fn counters_that_break_the_rules_are_counted_not_followed() {
        let (mut tx, mut rx) = ring(4096, 256);
        let mem = Arc::clone(&tx.mem);
        let mut buf = [0u8; 256];
        // A producer counter off a record boundary.
        mem.store_u64(PRODUCER, 100, Ordering::Release);
        assert_eq!(rx.pop(&mut buf), None);
        // More than the ring ahead.
        mem.store_u64(PRODUCER, 64 * 1000, Ordering::Release);
        assert_eq!(rx.pop(&mut buf), None);
        assert_eq!(rx.pop(&mut buf), None);
        assert_eq!(rx.corrupt(), 1, "one episode of bad counters, counted once");
        // A consumer counter that makes no sense to the producer: no room.
        mem.store_u64(PRODUCER, 0, Ordering::Release);
        mem.store_u64(CONSUMER, 8, Ordering::Release);
        let mut blocked = FrameRing::new(Arc::clone(&mem), 0, 4096, 256);
        blocked.prod = 4096;
        assert!(!blocked.push(&[1; 60]));
        assert_eq!(blocked.corrupt(), 1);
        // Our own counter off a boundary at the very top: mended by wrapping, no overflow
        // (found by `shm_ring` on a fresh machine).
        let mut top = FrameRing::new(Arc::clone(&mem), 0, 4096, 256);
        top.prod = u64::MAX - 3;
        top.cons_seen = u64::MAX - 3;
        assert!(top.push(&[1; 60]));
        assert_eq!(top.prod, 64);
        assert_eq!(top.corrupt(), 1);
        // Sane counters again: frames flow.
        mem.store_u64(CONSUMER, 0, Ordering::Release);
        let mut rx = FrameRing::new(Arc::clone(&mem), 0, 4096, 256);
        assert!(tx.push(&[7; 60]));
        tx.publish();
        assert_eq!(rx.pop(&mut buf), Some(60));
        assert_eq!(buf[..60], [7; 60]);
        // A record that claims to run past the producer: what is pending is dropped.
        mem.store_u32(DATA + 64, 200, Ordering::Relaxed);
        mem.store_u64(PRODUCER, 128, Ordering::Release);
        assert_eq!(rx.pop(&mut buf), None);
        assert_eq!(rx.corrupt(), 1);
    }

    #[test]
    fn record_sizes() {
        assert_eq!(record_bytes(0), 64);
        assert_eq!(
            record_bytes(60),
            64,
            "a 64-byte frame on the wire fills one line"
        );
        assert_eq!(record_bytes(61), 128);
        assert_eq!(record_bytes(9208), 9216);
    }

    #[test]
    fn fifo_full_and_wrap() {
        // 512 bytes: eight 60-byte frames, or two of 252 bytes.
        let (mut tx, mut rx) = ring(512, 252);
        let mut buf = [0u8; 256];
        assert_eq!(rx.pop(&mut buf), None);
        for lap in 0..10u8 {
            for i in 0..8u8 {
                assert!(tx.push(&[lap, i, 0xaa]), "lap {lap} frame {i}");
            }
            assert!(!tx.push(&[9]), "a ninth record must not fit");
            for i in 0..8u8 {
                assert_eq!(rx.pop(&mut buf), Some(3));
                assert_eq!(&buf[..3], &[lap, i, 0xaa]);
            }
            assert_eq!(rx.pop(&mut buf), None);
        }
        assert!(!tx.push(&[0u8; 253]), "larger than the largest frame");
        assert!(tx.push(&[7u8; 252]));
        assert_eq!(tx.pending_bytes(), 256);
        assert_eq!(rx.pop(&mut buf), Some(252));
        assert_eq!(buf[..252], [7u8; 252]);
        assert!(rx.is_empty());
    }

    #[test]
    fn a_record_that_does_not_fit_before_the_end_skips_to_the_start() {
        let (mut tx, mut rx) = ring(512, 252);
        let mut buf = [0u8; 256];
        // Six one-line records: 128 bytes left before the end.
        for i in 0..6u8 {
            assert!(tx.push(&[i; 60]));
        }
        for i in 0..6u8 {
            assert_eq!(rx.pop(&mut buf), Some(60));
            assert_eq!(buf[0], i);
        }
        // 192 bytes: does not fit in the last 128, so they are skipped.
        assert!(tx.push(&[0xee; 180]));
        assert_eq!(tx.pending_bytes(), 128 + 192);
        // 512 - 320 = 192 bytes free: one more 192-byte record, not two.
        assert!(tx.push(&[0xdd; 180]));
        assert!(!tx.push(&[0xcc; 1]));
        assert_eq!(rx.pop(&mut buf), Some(180));
        assert_eq!(buf[..180], [0xee; 180]);
        assert_eq!(rx.pop(&mut buf), Some(180));
        assert_eq!(buf[..180], [0xdd; 180]);
        assert_eq!(rx.pop(&mut buf), None);
        // A short buffer gets the frame's start and its full length.
        assert!(tx.push(&[1, 2, 3, 4, 5]));
        let mut short = [0u8; 2];
        assert_eq!(rx.pop(&mut short), Some(5));
        assert_eq!(short, [1, 2]);
    }

    /// The producer counts what the consumer has not read, published or not, across wrap
    /// records, and only that.
    #[test]
    fn unread_frames_are_those_pushed_and_not_popped() {
        // 1 KiB: sixteen 60-byte records, or five of 160 bytes (192-byte records) then a wrap.
        let (mut tx, mut rx) = ring(1024, 252);
        let mut buf = [0u8; 256];
        assert_eq!(tx.unread_frames(), 0);
        for round in 0..4 {
            for _ in 0..5 {
                assert!(tx.push(&[round; 160]));
            }
            assert_eq!(
                tx.unread_frames(),
                5,
                "round {round}: unpublished count too"
            );
            tx.publish();
            for left in (0..5).rev() {
                assert_eq!(rx.pop(&mut buf), Some(160));
                assert_eq!(tx.unread_frames(), left, "round {round}");
            }
        }
        assert!(tx.push(&[9; 60]) && tx.push(&[9; 60]));
        assert_eq!(tx.unread_frames(), 2, "after the wraps");
    }

    /// Both sides publish lazily (a sixteenth of a 64 KiB ring is 64 one-line records): the
    /// producer counts frames it has not published yet, and frames the consumer took without
    /// publishing count until it publishes them ([`FrameRing::publish_consumed`], what a
    /// closing end does).
    #[test]
    fn unread_frames_follow_lazy_publishing_on_both_sides() {
        let (mut tx, mut rx) = ring(1 << 16, 252);
        let mut buf = [0u8; 256];
        for _ in 0..40 {
            assert!(tx.push(&[5; 60]));
        }
        assert_eq!(tx.pending_bytes(), 0, "nothing published yet");
        assert_eq!(tx.unread_frames(), 40);
        tx.publish();
        for _ in 0..10 {
            assert_eq!(rx.pop(&mut buf), Some(60));
        }
        assert_eq!(tx.unread_frames(), 40, "taken, not yet published");
        rx.publish_consumed();
        assert_eq!(tx.unread_frames(), 30);
        rx.publish_consumed();
        assert_eq!(tx.unread_frames(), 30, "nothing new to publish");
    }

    #[test]
    fn frames_are_seen_once_published_or_when_the_ring_fills() {
        // 64 KiB: a sixteenth is 64 records of 60 bytes.
        let (mut tx, mut rx) = ring(1 << 16, 252);
        let mut buf = [0u8; 256];
        for i in 0..10u8 {
            assert!(tx.push(&[i; 60]));
        }
        assert_eq!(rx.pop(&mut buf), None, "not published yet");
        assert!(rx.is_empty());
        tx.publish();
        for i in 0..10u8 {
            assert_eq!(rx.pop(&mut buf), Some(60));
            assert_eq!(buf[0], i);
        }
        assert_eq!(rx.pop(&mut buf), None);
        // A long batch is published every sixteenth of the ring without being asked.
        for _ in 0..64 {
            assert!(tx.push(&[1; 60]));
        }
        assert_eq!(tx.pending_bytes(), 64 * 64);
        assert!(tx.push(&[2; 60]));
        assert_eq!(
            tx.pending_bytes(),
            64 * 64,
            "the 65th waits for the next publish"
        );
        // Filling the ring: the push that finds it full publishes everything before it.
        let mut pushed = 65;
        while tx.push(&[3; 60]) {
            pushed += 1;
        }
        assert_eq!(pushed, (1 << 16) / 64, "the whole ring");
        assert_eq!(tx.pending_bytes(), 1 << 16);
        let mut got = 0;
        while rx.pop(&mut buf).is_some() {
            got += 1;
        }
        assert_eq!(got, pushed);
    }

    #[test]
    fn discard_all_drops_what_waits_counts_it_and_frees_the_room() {
        let (mut tx, mut rx) = ring(512, 252);
        let mut buf = [0u8; 256];
        assert_eq!(rx.discard_all(), 0, "an empty ring");
        // Five frames of 60 bytes, four read, then one of 200 that does not fit before the
        // end: the walk follows its WRAP record.
        for i in 0..5u8 {
            assert!(tx.push(&[i; 60]));
        }
        for _ in 0..4 {
            assert_eq!(rx.pop(&mut buf), Some(60));
        }
        assert!(tx.push(&[9; 200]));
        assert_eq!(rx.discard_all(), 2);
        assert_eq!(rx.pop(&mut buf), None);
        assert!(rx.is_empty(), "the producer sees the room again");
        assert!(tx.push(&[7; 60]), "frames sent after the discard arrive");
        assert_eq!(rx.pop(&mut buf), Some(60));
        assert_eq!(buf[0], 7);
    }

    #[test]
    fn a_ring_opened_again_continues_where_the_counters_are() {
        let mem = Arc::new(DevMem::anon(ring_bytes(1024)).unwrap());
        let mut tx = FrameRing::new(Arc::clone(&mem), 0, 1024, 252);
        assert!(tx.push(b"one") && tx.push(b"two"));
        // A consumer that comes later (the other end of a cable opened after frames were
        // sent), and a producer that reopens its end.
        let mut rx = FrameRing::new(Arc::clone(&mem), 0, 1024, 252);
        let mut tx2 = FrameRing::new(Arc::clone(&mem), 0, 1024, 252);
        assert!(tx2.push(b"three"));
        let mut buf = [0u8; 8];
        for want in [&b"one"[..], b"two", b"three"] {
            let n = rx.pop(&mut buf).unwrap();
            assert_eq!(&buf[..n], want);
        }
    }

    #[test]
    fn two_threads_lose_nothing() {
        let (mut tx, mut rx) = ring(4096, 252);
        const N: u32 = 200_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                // Sizes vary so that records wrap at every offset.
                let len = 4 + (i % 97) as usize;
                let mut f = [0u8; 101];
                f[..4].copy_from_slice(&i.to_le_bytes());
                while !tx.push(&f[..len]) {
                    std::hint::spin_loop();
                }
                if i % 5 == 0 {
                    tx.publish();
                }
            }
            tx.publish();
        });
        let mut buf = [0u8; 256];
        let mut next = 0u32;
        while next < N {
            if let Some(n) = rx.pop(&mut buf) {
                assert_eq!(n, 4 + (next % 97) as usize);
                assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), next);
                next += 1;
            }
        }
        t.join().unwrap();
    }

    proptest::proptest! {
        /// Any sequence of pushes and pops behaves like a FIFO of bounded bytes: what goes
        /// in comes out, in order, and a push fails only when its record (and skip) would
        /// not fit.
        #[test]
        fn behaves_like_a_bounded_fifo(ops in proptest::collection::vec((proptest::bool::ANY, 0usize..=252), 1..400)) {
            let (mut tx, mut rx) = ring(1024, 252);
            let mut model = std::collections::VecDeque::new();
            let mut used = 0u64;
            let mut seq = 0u8;
            let mut buf = [0u8; 256];
            for (push, len) in ops {
                if push {
                    let f = vec![seq; len];
                    let to_end = 1024 - (tx.prod & 1023);
                    let need = record_bytes(len) as u64;
                    let skip = if need > to_end { to_end } else { 0 };
                    let fits = 1024 - used >= skip + need;
                    proptest::prop_assert_eq!(tx.push(&f), fits);
                    if fits {
                        used += skip + need;
                        model.push_back((f, skip + need));
                        seq = seq.wrapping_add(1);
                    }
                } else {
                    match model.pop_front() {
                        Some((f, bytes)) => {
                            proptest::prop_assert_eq!(rx.pop(&mut buf), Some(f.len()));
                            proptest::prop_assert_eq!(&buf[..f.len()], &f[..]);
                            used -= bytes;
                        }
                        None => proptest::prop_assert_eq!(rx.pop(&mut buf), None),
                    }
                }
            }
        }
    }
}
