//! The capture rings: one shared-memory file (a sealed memfd the app creates and passes to
//! the capture tool) holding one single-producer single-consumer byte ring per mirrored queue.
//!
//! The app's polling core that owns a queue is the only writer of that queue's ring
//! ([`RingWriter`]); the capture tool is the only reader ([`RingReader`]). Each side treats
//! what the other writes as untrusted: the writer checks the reader's consumer index before
//! trusting the space it implies, the reader checks every record before it copies a byte.
//!
//! Layout (little-endian, offsets in bytes):
//!
//! | where | what |
//! |---|---|
//! | 0 | magic `PMDCAP01` |
//! | 8 | version (u32, 1) |
//! | 12 | ring count (u32) |
//! | 16 | bytes of each ring's data area (u64, a power of two) |
//! | 24 | snap length (u32) |
//! | 4096 + i × (256 + ring bytes) | ring i: its control block, then its data area |
//!
//! A ring's control block: producer index (u64, bytes written, +0), frames seen by the hook
//! (+8), frames the filter rejected (+16), frames dropped for want of room (+24), the queue
//! it mirrors (+32: port u16, queue u16, direction u8), and on its own cache line the
//! consumer index (+128). Indices only grow; the data offset is the index modulo the ring
//! size.
//!
//! A record is 8-byte aligned and never wraps: `len` u32 (the whole record, padded to 8),
//! `caplen` u32, `origlen` u32 (the frame on the wire), `flags` u32 (bit 0: padding to the
//! end of the ring, skip it), `ts` u64 (ns since the Unix epoch), then `caplen` bytes. Where
//! fewer than 24 bytes remain before the end of the ring, the reader skips them without a
//! header.
#![deny(unsafe_code)]

use crate::sys::DevMem;
use std::sync::atomic::Ordering;

/// The file's magic.
pub const MAGIC: [u8; 8] = *b"PMDCAP01";
/// The layout version.
pub const VERSION: u32 = 1;
/// Bytes before ring 0.
pub const HEADER_BYTES: usize = 4096;
/// Bytes of a ring's control block.
pub const CTRL_BYTES: usize = 256;
/// Bytes of a record's header.
pub const RECORD_HEADER: usize = 24;
/// The smallest and largest ring data areas.
pub const MIN_RING_BYTES: u64 = 64 << 10;
/// See [`MIN_RING_BYTES`].
pub const MAX_RING_BYTES: u64 = 256 << 20;
/// Most rings in one file.
pub const MAX_RINGS: u32 = 1024;
/// Largest snap length.
pub const MAX_SNAPLEN: u32 = 65535;
/// Record flag: padding to the end of the ring.
pub const FLAG_PAD: u32 = 1;

const H_VERSION: usize = 8;
const H_RINGS: usize = 12;
const H_RING_BYTES: usize = 16;
const H_SNAPLEN: usize = 24;
const C_PROD: usize = 0;
const C_SEEN: usize = 8;
const C_FILTERED: usize = 16;
const C_DROPPED: usize = 24;
const C_ID: usize = 32;
const C_CONS: usize = 128;

/// Which way a mirrored frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received by the app.
    Rx,
    /// Sent by the app.
    Tx,
}

impl Direction {
    /// `"rx"` or `"tx"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rx => "rx",
            Self::Tx => "tx",
        }
    }
}

/// The queue a ring mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RingId {
    /// Port id.
    pub port: u16,
    /// Queue index.
    pub queue: u16,
    /// Received or sent frames.
    pub dir: Direction,
}

impl RingId {
    fn encode(self) -> u64 {
        u64::from(self.port)
            | u64::from(self.queue) << 16
            | u64::from(self.dir == Direction::Tx) << 32
    }

    fn decode(v: u64) -> Option<Self> {
        let dir = match v >> 32 {
            0 => Direction::Rx,
            1 => Direction::Tx,
            _ => return None,
        };
        Some(Self {
            port: v as u16,
            queue: (v >> 16) as u16,
            dir,
        })
    }
}

/// Why a capture file cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// The header does not describe a capture file of this version.
    #[error("not a capture ring file: {0}")]
    BadHeader(String),
    /// A ring's indices or a record broke the layout: the other side is broken or hostile.
    #[error("ring {ring}: {what}")]
    Corrupt {
        /// The ring.
        ring: usize,
        /// What was wrong.
        what: String,
    },
}

/// The shape of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Rings in the file.
    pub rings: u32,
    /// Bytes of each ring's data area (a power of two).
    pub ring_bytes: u64,
    /// Most bytes kept of a frame.
    pub snaplen: u32,
}

impl Layout {
    /// Checks the numbers a request or a header gives.
    ///
    /// # Errors
    /// A value out of range, with the range.
    pub fn new(rings: u32, ring_bytes: u64, snaplen: u32) -> Result<Self, String> {
        if rings == 0 || rings > MAX_RINGS {
            return Err(format!("{rings} rings: 1..={MAX_RINGS}"));
        }
        if !ring_bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(format!(
                "ring size {ring_bytes}: a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES} bytes"
            ));
        }
        if snaplen == 0 || snaplen > MAX_SNAPLEN {
            return Err(format!("snap length {snaplen}: 1..={MAX_SNAPLEN}"));
        }
        // A record of the longest frame takes at most a quarter of the ring.
        if record_bytes(snaplen) as u64 > ring_bytes / 4 {
            return Err(format!(
                "ring size {ring_bytes} is too small for a snap length of {snaplen}: give at least {}",
                (record_bytes(snaplen) as u64 * 4).next_power_of_two()
            ));
        }
        Ok(Self {
            rings,
            ring_bytes,
            snaplen,
        })
    }

    /// Bytes of the whole file.
    pub fn file_bytes(&self) -> usize {
        HEADER_BYTES + self.rings as usize * (CTRL_BYTES + self.ring_bytes as usize)
    }

    fn ctrl(&self, ring: usize) -> usize {
        HEADER_BYTES + ring * (CTRL_BYTES + self.ring_bytes as usize)
    }

    /// Writes the header and each ring's id into a zeroed file.
    ///
    /// # Panics
    /// If `mem` is smaller than the file or `ids` has another length than the ring count.
    pub fn init(&self, mem: &DevMem, ids: &[RingId]) {
        assert!(mem.len() >= self.file_bytes() && ids.len() == self.rings as usize);
        mem.write(0, &MAGIC);
        mem.store_u32(H_VERSION, VERSION, Ordering::Relaxed);
        mem.store_u32(H_RINGS, self.rings, Ordering::Relaxed);
        mem.store_u64(H_RING_BYTES, self.ring_bytes, Ordering::Relaxed);
        mem.store_u32(H_SNAPLEN, self.snaplen, Ordering::Relaxed);
        for (i, id) in ids.iter().enumerate() {
            mem.store_u64(self.ctrl(i) + C_ID, id.encode(), Ordering::Release);
        }
    }

    /// Reads and checks the header of a file of `len` bytes mapped at `mem`, and the id of
    /// every ring.
    ///
    /// # Errors
    /// A header that is not this layout, or one that does not fit the file.
    pub fn read(mem: &DevMem) -> Result<(Self, Vec<RingId>), RingError> {
        if mem.len() < HEADER_BYTES {
            return Err(RingError::BadHeader(format!(
                "{} bytes is too short",
                mem.len()
            )));
        }
        let mut magic = [0u8; 8];
        mem.read(0, &mut magic);
        if magic != MAGIC {
            return Err(RingError::BadHeader(format!("magic {magic:02x?}")));
        }
        let version = mem.load_u32(H_VERSION, Ordering::Relaxed);
        if version != VERSION {
            return Err(RingError::BadHeader(format!(
                "version {version}, this tool reads {VERSION}"
            )));
        }
        let layout = Self::new(
            mem.load_u32(H_RINGS, Ordering::Relaxed),
            mem.load_u64(H_RING_BYTES, Ordering::Relaxed),
            mem.load_u32(H_SNAPLEN, Ordering::Relaxed),
        )
        .map_err(RingError::BadHeader)?;
        if layout.file_bytes() != mem.len() {
            return Err(RingError::BadHeader(format!(
                "the header describes {} bytes, the file has {}",
                layout.file_bytes(),
                mem.len()
            )));
        }
        let ids = (0..layout.rings as usize)
            .map(|i| {
                RingId::decode(mem.load_u64(layout.ctrl(i) + C_ID, Ordering::Acquire)).ok_or_else(
                    || RingError::Corrupt {
                        ring: i,
                        what: "bad queue id".into(),
                    },
                )
            })
            .collect::<Result<_, _>>()?;
        Ok((layout, ids))
    }
}

/// A record's header.
fn header(len: u32, caplen: u32, origlen: u32, flags: u32, ts_ns: u64) -> [u8; RECORD_HEADER] {
    let mut h = [0u8; RECORD_HEADER];
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&caplen.to_le_bytes());
    h[8..12].copy_from_slice(&origlen.to_le_bytes());
    h[12..16].copy_from_slice(&flags.to_le_bytes());
    h[16..24].copy_from_slice(&ts_ns.to_le_bytes());
    h
}

/// Bytes a record of `caplen` captured bytes takes.
pub fn record_bytes(caplen: u32) -> usize {
    (RECORD_HEADER + caplen as usize + 7) & !7
}

/// What became of one frame offered to a [`RingWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written.
    Written,
    /// The filter rejected it.
    Filtered,
    /// No room (or the ring is broken): counted as dropped.
    Dropped,
}

/// The producer side of one ring: owned by the core that polls the queue.
#[derive(Debug)]
pub struct RingWriter {
    ctrl: usize,
    data: usize,
    ring_bytes: u64,
    snaplen: u32,
    /// Bytes written, published or not.
    prod: u64,
    /// Bytes published (the producer index in the file).
    published: u64,
    /// The reader's index as last read: the room it implies is known free without a look
    /// at the shared cache line (refreshed when a frame does not fit).
    cons: u64,
    seen: u64,
    filtered: u64,
    dropped: u64,
    /// The reader's index was impossible: write nothing more.
    broken: bool,
}

impl RingWriter {
    /// The writer of ring `ring` of a file laid out as `layout`, starting from what the file
    /// says (zero for a new file).
    pub fn new(mem: &DevMem, layout: &Layout, ring: usize) -> Self {
        let ctrl = layout.ctrl(ring);
        let prod = mem.load_u64(ctrl + C_PROD, Ordering::Relaxed);
        Self {
            ctrl,
            data: ctrl + CTRL_BYTES,
            ring_bytes: layout.ring_bytes,
            snaplen: layout.snaplen,
            prod,
            published: prod,
            cons: prod,
            seen: mem.load_u64(ctrl + C_SEEN, Ordering::Relaxed),
            filtered: mem.load_u64(ctrl + C_FILTERED, Ordering::Relaxed),
            dropped: mem.load_u64(ctrl + C_DROPPED, Ordering::Relaxed),
            broken: false,
        }
    }

    /// Bytes kept of a frame of `len` bytes.
    #[inline]
    pub fn caplen(&self, len: u32) -> u32 {
        len.min(self.snaplen)
    }

    /// Writes (without publishing) one frame of `origlen` bytes whose first bytes are the
    /// concatenation of `parts` (at least [`Self::caplen`] of them are used, fewer when the
    /// parts are shorter). Returns the outcome; [`Outcome::Dropped`] when it does not fit.
    pub fn write(&mut self, mem: &DevMem, parts: &[&[u8]], origlen: u32, ts_ns: u64) -> Outcome {
        if self.broken {
            return Outcome::Dropped;
        }
        let avail: usize = parts.iter().map(|p| p.len()).sum();
        let caplen = self.caplen(origlen).min(avail as u32);
        let need = record_bytes(caplen) as u64;
        let pos = self.prod & (self.ring_bytes - 1);
        let to_end = self.ring_bytes - pos;
        let pad = if to_end < need { to_end } else { 0 };
        if (self.prod - self.cons) + pad + need > self.ring_bytes {
            // Look at where the reader is: never ahead of what we published, never more
            // than a ring behind.
            let cons = mem.load_u64(self.ctrl + C_CONS, Ordering::Acquire);
            if cons < self.cons || cons > self.published || self.published - cons > self.ring_bytes
            {
                self.broken = true;
                return Outcome::Dropped;
            }
            self.cons = cons;
            if (self.prod - cons) + pad + need > self.ring_bytes {
                return Outcome::Dropped;
            }
        }
        if pad >= RECORD_HEADER as u64 {
            let off = self.data + pos as usize;
            mem.write(off, &header(pad as u32, 0, 0, FLAG_PAD, 0));
        }
        self.prod += pad;
        let off = self.data + (self.prod & (self.ring_bytes - 1)) as usize;
        mem.write(off, &header(need as u32, caplen, origlen, 0, ts_ns));
        let mut at = off + RECORD_HEADER;
        let mut left = caplen as usize;
        for p in parts {
            if left == 0 {
                break;
            }
            let n = p.len().min(left);
            mem.write(at, &p[..n]);
            at += n;
            left -= n;
        }
        self.prod += need;
        Outcome::Written
    }

    /// The write position (to publish later with [`Self::publish_to`]).
    #[inline]
    pub fn position(&self) -> u64 {
        self.prod
    }

    /// Forgets what was written after `pos` (frames the device did not take) and publishes
    /// up to it.
    pub fn publish_to(&mut self, mem: &DevMem, pos: u64) {
        debug_assert!(pos >= self.published && pos <= self.prod);
        self.prod = pos;
        self.publish(mem);
    }

    /// Publishes everything written, and the counters.
    pub fn publish(&mut self, mem: &DevMem) {
        if self.prod != self.published {
            self.published = self.prod;
            mem.store_u64(self.ctrl + C_PROD, self.prod, Ordering::Release);
        }
    }

    /// Counts frames that went past the hook: `seen` in all, `filtered` of them rejected,
    /// `dropped` of them without room (single writer: plain stores).
    pub fn count(&mut self, mem: &DevMem, seen: u64, filtered: u64, dropped: u64) {
        if seen != 0 {
            self.seen += seen;
            mem.store_u64(self.ctrl + C_SEEN, self.seen, Ordering::Relaxed);
        }
        if filtered != 0 {
            self.filtered += filtered;
            mem.store_u64(self.ctrl + C_FILTERED, self.filtered, Ordering::Relaxed);
        }
        if dropped != 0 {
            self.dropped += dropped;
            mem.store_u64(self.ctrl + C_DROPPED, self.dropped, Ordering::Relaxed);
        }
    }
}

/// A frame read from a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The frame's length on the wire.
    pub origlen: u32,
    /// The bytes kept (at most the snap length).
    pub data: Vec<u8>,
}

/// A ring's counters as its writer published them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingCounters {
    /// Frames that went past the hook.
    pub seen: u64,
    /// Frames the filter rejected.
    pub filtered: u64,
    /// Frames dropped for want of room in the ring.
    pub dropped: u64,
}

/// The consumer side of one ring: the capture tool.
#[derive(Debug)]
pub struct RingReader {
    ring: usize,
    ctrl: usize,
    data: usize,
    ring_bytes: u64,
    snaplen: u32,
    cons: u64,
}

impl RingReader {
    /// The reader of ring `ring` of a file laid out as `layout`.
    pub fn new(mem: &DevMem, layout: &Layout, ring: usize) -> Self {
        let ctrl = layout.ctrl(ring);
        Self {
            ring,
            ctrl,
            data: ctrl + CTRL_BYTES,
            ring_bytes: layout.ring_bytes,
            snaplen: layout.snaplen,
            cons: mem.load_u64(ctrl + C_CONS, Ordering::Relaxed),
        }
    }

    fn corrupt(&self, what: String) -> RingError {
        RingError::Corrupt {
            ring: self.ring,
            what,
        }
    }

    /// Reads every published frame (at most `max`) into `out`, frees their room, and returns
    /// how many were read.
    ///
    /// # Errors
    /// A producer index or record that breaks the layout; nothing after it is read.
    pub fn drain(
        &mut self,
        mem: &DevMem,
        max: usize,
        out: &mut Vec<Frame>,
    ) -> Result<usize, RingError> {
        let prod = mem.load_u64(self.ctrl + C_PROD, Ordering::Acquire);
        if prod < self.cons || prod - self.cons > self.ring_bytes {
            return Err(self.corrupt(format!(
                "producer index {prod} against consumer index {}",
                self.cons
            )));
        }
        let mut n = 0;
        while self.cons < prod && n < max {
            let pos = self.cons & (self.ring_bytes - 1);
            let to_end = self.ring_bytes - pos;
            if to_end < RECORD_HEADER as u64 {
                self.cons += to_end;
                continue;
            }
            let off = self.data + pos as usize;
            let len = u64::from(mem.load_u32(off, Ordering::Relaxed));
            let flags = mem.load_u32(off + 12, Ordering::Relaxed);
            if len < RECORD_HEADER as u64 || len % 8 != 0 || len > to_end || len > prod - self.cons
            {
                return Err(self.corrupt(format!("record length {len} at index {}", self.cons)));
            }
            if flags & FLAG_PAD != 0 {
                if len != to_end {
                    return Err(
                        self.corrupt(format!("padding of {len} bytes with {to_end} to the end"))
                    );
                }
                self.cons += len;
                continue;
            }
            let caplen = mem.load_u32(off + 4, Ordering::Relaxed);
            let origlen = mem.load_u32(off + 8, Ordering::Relaxed);
            if caplen > self.snaplen || record_bytes(caplen) as u64 != len || origlen < caplen {
                return Err(self.corrupt(format!(
                    "record of {len} bytes with {caplen} captured of {origlen} (snap length {})",
                    self.snaplen
                )));
            }
            let ts_ns = mem.load_u64(off + 16, Ordering::Relaxed);
            let mut data = vec![0u8; caplen as usize];
            mem.read(off + RECORD_HEADER, &mut data);
            out.push(Frame {
                ts_ns,
                origlen,
                data,
            });
            self.cons += len;
            n += 1;
        }
        mem.store_u64(self.ctrl + C_CONS, self.cons, Ordering::Release);
        Ok(n)
    }

    /// The ring's counters.
    pub fn counters(&self, mem: &DevMem) -> RingCounters {
        RingCounters {
            seen: mem.load_u64(self.ctrl + C_SEEN, Ordering::Relaxed),
            filtered: mem.load_u64(self.ctrl + C_FILTERED, Ordering::Relaxed),
            dropped: mem.load_u64(self.ctrl + C_DROPPED, Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rings: u32) -> (DevMem, Layout) {
        let l = Layout::new(rings, MIN_RING_BYTES, 1500).unwrap();
        let mem = DevMem::anon(l.file_bytes()).unwrap();
        let ids: Vec<RingId> = (0..rings)
            .map(|q| RingId {
                port: 3,
                queue: q as u16,
                dir: Direction::Tx,
            })
            .collect();
        l.init(&mem, &ids);
        (mem, l)
    }

    #[test]
    fn frames_come_out_in_order_across_many_wraps_with_counters() {
        let (mem, l) = file(2);
        let (layout, ids) = Layout::read(&mem).unwrap();
        assert_eq!(layout, l);
        assert_eq!(
            ids[1],
            RingId {
                port: 3,
                queue: 1,
                dir: Direction::Tx
            }
        );
        let mut w = RingWriter::new(&mem, &l, 1);
        let mut r = RingReader::new(&mem, &l, 1);
        let mut out = Vec::new();
        let mut next_read = 0u32;
        for i in 0..20_000u32 {
            let len = 60 + (i * 37) % 2000;
            let frame: Vec<u8> = (0..len).map(|b| (b ^ i) as u8).collect();
            // Two parts, to check the copy of a chain.
            let (a, b) = frame.split_at(len as usize / 3);
            if w.write(&mem, &[a, b], len, u64::from(i)) == Outcome::Dropped {
                w.publish(&mem);
                r.drain(&mem, usize::MAX, &mut out).unwrap();
                assert_eq!(w.write(&mem, &[a, b], len, u64::from(i)), Outcome::Written);
            }
            w.publish(&mem);
            if i % 7 == 0 {
                r.drain(&mem, usize::MAX, &mut out).unwrap();
            }
            for f in out.drain(..) {
                let want_len = 60 + (next_read * 37) % 2000;
                assert_eq!(f.origlen, want_len);
                assert_eq!(f.ts_ns, u64::from(next_read));
                assert_eq!(f.data.len() as u32, want_len.min(1500));
                assert!(f
                    .data
                    .iter()
                    .enumerate()
                    .all(|(b, &v)| v == (b as u32 ^ next_read) as u8));
                next_read += 1;
            }
        }
        r.drain(&mem, usize::MAX, &mut out).unwrap();
        next_read += out.len() as u32;
        assert_eq!(next_read, 20_000);
        w.count(&mem, 10, 2, 3);
        assert_eq!(
            r.counters(&mem),
            RingCounters {
                seen: 10,
                filtered: 2,
                dropped: 3
            }
        );
    }

    #[test]
    fn a_full_ring_drops_and_unpublished_frames_can_be_taken_back() {
        let (mem, l) = file(1);
        let mut w = RingWriter::new(&mem, &l, 0);
        let frame = [7u8; 1000];
        let mut written = 0;
        while w.write(&mem, &[&frame], 1000, 0) == Outcome::Written {
            written += 1;
        }
        assert_eq!(written, MIN_RING_BYTES as usize / record_bytes(1000));
        // Take back all but the first five (the device did not take them).
        let five = 5 * record_bytes(1000) as u64;
        w.publish_to(&mem, five);
        let mut r = RingReader::new(&mem, &l, 0);
        let mut out = Vec::new();
        assert_eq!(r.drain(&mem, usize::MAX, &mut out).unwrap(), 5);
    }

    #[test]
    fn a_hostile_peer_costs_an_error_never_a_bad_access() {
        let one = |w: &mut RingWriter, mem: &DevMem| w.write(mem, &[&[1u8; 64]], 64, 0);
        let full = |w: &mut RingWriter, mem: &DevMem| {
            while one(w, mem) == Outcome::Written {}
            w.publish(mem);
        };
        // Reader indices that cannot be (ahead of the producer, or gone backwards), each
        // given once the ring is full (when the writer looks at it): nothing more is written,
        // even once the index looks sane again.
        for bad in [1u64 << 40, 8] {
            let (mem, l) = file(1);
            let mut w = RingWriter::new(&mem, &l, 0);
            full(&mut w, &mem);
            mem.store_u64(l.ctrl(0) + C_CONS, 4096, Ordering::Relaxed);
            assert_eq!(one(&mut w, &mem), Outcome::Written, "room after a read");
            full(&mut w, &mem);
            mem.store_u64(l.ctrl(0) + C_CONS, bad, Ordering::Relaxed);
            assert_eq!(one(&mut w, &mem), Outcome::Dropped);
            mem.store_u64(l.ctrl(0) + C_CONS, w.position(), Ordering::Relaxed);
            assert_eq!(one(&mut w, &mem), Outcome::Dropped, "stays broken");
        }

        // A producer index past the ring, then records with impossible lengths.
        let (mem, l) = file(1);
        let mut r = RingReader::new(&mem, &l, 0);
        let mut out = Vec::new();
        mem.store_u64(l.ctrl(0) + C_PROD, MIN_RING_BYTES + 8, Ordering::Relaxed);
        assert!(r.drain(&mem, usize::MAX, &mut out).is_err());
        let data = l.ctrl(0) + CTRL_BYTES;
        for (len, caplen, origlen) in [
            (0u32, 0u32, 0u32),
            (12, 0, 0),
            (4096, 100, 100),
            (32, 9, 9),
            (40, 16, 8),
            (1600, 1570, 1600),
        ] {
            mem.store_u64(l.ctrl(0) + C_PROD, 4096, Ordering::Relaxed);
            mem.store_u32(data, len, Ordering::Relaxed);
            mem.store_u32(data + 4, caplen, Ordering::Relaxed);
            mem.store_u32(data + 8, origlen, Ordering::Relaxed);
            let mut r = RingReader::new(&mem, &l, 0);
            let e = r.drain(&mem, usize::MAX, &mut out);
            assert!(
                e.is_err(),
                "len {len} caplen {caplen} origlen {origlen} accepted"
            );
        }
        assert!(out.is_empty());

        // A header that lies about the file's size.
        mem.store_u32(H_RINGS, 2, Ordering::Relaxed);
        assert!(matches!(Layout::read(&mem), Err(RingError::BadHeader(_))));
    }
}
