//! The receive-side sequence tracker: frames received, lost, duplicated and reordered by
//! their stamped sequence numbers.
#![deny(unsafe_code)]

use super::cycle_index;

/// Sequence numbers seen on the receive side: received, duplicates, reordering and gaps,
/// over a sliding window of the last [`SeqTracker::WINDOW`] numbers.
#[derive(Debug, Clone)]
pub struct SeqTracker {
    next: u64,
    bits: Vec<u64>,
    /// Distinct frames received.
    pub unique: u64,
    /// Frames received again.
    pub duplicates: u64,
    /// Frames that arrived after a later frame of the same flow (flow = sequence number
    /// modulo the flow count, as the generator assigns them). Frames of different flows may
    /// pass each other (RSS puts them on different queues) without counting.
    pub reordered: u64,
    /// Sequence numbers skipped so far (lost unless they turn up late).
    pub gaps: u64,
    /// The longest run of sequence numbers skipped at once (an outage: a link down, a port
    /// recovering from a device reset), and its first number.
    pub longest_gap: u64,
    /// First sequence number of [`SeqTracker::longest_gap`].
    pub longest_gap_first: u64,
    /// Per flow, one past the highest sequence number seen (0: none yet).
    last: Vec<u64>,
}

impl Default for SeqTracker {
    fn default() -> Self {
        Self::with_flows(1)
    }
}

impl SeqTracker {
    /// How far back a late frame is still told apart from a duplicate.
    pub const WINDOW: u64 = 1 << 20;

    /// A tracker for frames of `flows` flows (at least 1).
    pub fn with_flows(flows: u32) -> Self {
        Self {
            next: 0,
            bits: vec![0; (Self::WINDOW / 64) as usize],
            unique: 0,
            duplicates: 0,
            reordered: 0,
            gaps: 0,
            longest_gap: 0,
            longest_gap_first: 0,
            last: vec![0; flows.max(1) as usize],
        }
    }

    /// Counts `s` as reordered if a later frame of its flow came first.
    #[inline]
    fn order(&mut self, s: u64) {
        let f = cycle_index(s, self.last.len());
        if s < self.last[f] {
            self.reordered += 1;
        } else {
            self.last[f] = s + 1;
        }
    }

    #[inline]
    fn bit(&mut self, s: u64) -> (&mut u64, u64) {
        let i = (s % Self::WINDOW) as usize;
        (&mut self.bits[i / 64], 1u64 << (i % 64))
    }

    /// Records sequence number `s`.
    #[inline]
    pub fn record(&mut self, s: u64) {
        if s >= self.next {
            let gap = s - self.next;
            if gap >= Self::WINDOW {
                self.bits.iter_mut().for_each(|w| *w = 0);
            } else {
                for missing in self.next..s {
                    let (w, m) = self.bit(missing);
                    *w &= !m;
                }
            }
            self.gaps += gap;
            if gap > self.longest_gap {
                self.longest_gap = gap;
                self.longest_gap_first = self.next;
            }
            let (w, m) = self.bit(s);
            *w |= m;
            self.next = s + 1;
            self.unique += 1;
            self.order(s);
        } else if self.next - s >= Self::WINDOW {
            self.gaps = self.gaps.saturating_sub(1);
            self.unique += 1;
            self.order(s);
        } else {
            let (w, m) = self.bit(s);
            if *w & m != 0 {
                self.duplicates += 1;
            } else {
                *w |= m;
                self.gaps = self.gaps.saturating_sub(1);
                self.unique += 1;
                self.order(s);
            }
        }
    }
}

impl SeqTracker {
    /// How many numbers of the longest gap never arrived (some may have turned up late).
    /// Exact while the gap is within the last [`SeqTracker::WINDOW`] numbers; older gaps
    /// are counted whole.
    pub fn longest_gap_missing(&self) -> u64 {
        let (first, len) = (self.longest_gap_first, self.longest_gap);
        if len == 0 || self.next - first > Self::WINDOW {
            return len;
        }
        (first..first + len)
            .filter(|&q| {
                let i = (q % Self::WINDOW) as usize;
                self.bits[i / 64] & (1u64 << (i % 64)) == 0
            })
            .count() as u64
    }
}
