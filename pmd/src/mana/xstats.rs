//! Driver-side extended counters, one set per queue: each is written by the one core that
//! owns the queue (a relaxed load + store, no locked read-modify-write) and summed when read.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Extended counters of one MANA queue.
#[derive(Debug, Default)]
pub struct Xstats {
    /// RX CQEs with a type other than RX_OKAY / RX_COALESCED_4.
    pub rx_cqe_errors: AtomicU64,
    /// RX_TRUNCATED CQEs.
    pub rx_cqe_truncated: AtomicU64,
    /// RX_COALESCED_4 CQEs: not zero where the kernel turned RX CQE coalescing on for the
    /// port's RSS QP (`mana_ib` of newer kernels).
    pub rx_coalesced_cqes: AtomicU64,
    /// RX buffers not posted because they lay outside registered memory (no memory key).
    pub rx_no_mkey: AtomicU64,
    /// TX CQEs with an error type.
    pub tx_cqe_errors: AtomicU64,
    /// TX_OKAY CQEs with no completion request in flight (ignored).
    pub tx_unexpected_cqes: AtomicU64,
    /// Times a CQ was found lapped by the device.
    pub cq_overflows: AtomicU64,
    /// Packets dropped at TX because they had more segments than a WQE holds.
    pub tx_too_many_segs: AtomicU64,
    /// Packets dropped at TX because a segment was outside any registered memory.
    pub tx_no_mkey: AtomicU64,
    /// Packets dropped at TX because their checksum-offload headers were not where the
    /// mbuf's lengths said.
    pub tx_bad_offload: AtomicU64,
    /// Packets dropped at TX because their TSO request was unusable (MSS 0 or above 16383,
    /// headers over 255 bytes or not in the first segment).
    pub tx_bad_tso: AtomicU64,
}

impl Xstats {
    /// Adds one. Only the queue's owning core calls this.
    #[inline]
    pub(crate) fn bump(c: &AtomicU64) {
        Self::add(c, 1);
    }

    /// Adds `n`. Only the queue's owning core calls this.
    #[inline]
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    fn fields(&self) -> [(&'static str, &AtomicU64); 11] {
        [
            ("rx_cqe_errors", &self.rx_cqe_errors),
            ("rx_cqe_truncated", &self.rx_cqe_truncated),
            ("rx_coalesced_cqes", &self.rx_coalesced_cqes),
            ("rx_no_mkey", &self.rx_no_mkey),
            ("tx_cqe_errors", &self.tx_cqe_errors),
            ("tx_unexpected_cqes", &self.tx_unexpected_cqes),
            ("cq_overflows", &self.cq_overflows),
            ("tx_too_many_segs", &self.tx_too_many_segs),
            ("tx_no_mkey", &self.tx_no_mkey),
            ("tx_bad_offload", &self.tx_bad_offload),
            ("tx_bad_tso", &self.tx_bad_tso),
        ]
    }

    /// Every counter by name, summed over `queues`.
    pub fn sum(queues: &[Arc<Xstats>]) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = Xstats::default()
            .fields()
            .iter()
            .map(|(n, _)| (n.to_string(), 0))
            .collect();
        for q in queues {
            for (slot, (_, c)) in out.iter_mut().zip(q.fields()) {
                slot.1 += c.load(Ordering::Relaxed);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_queue_and_reports_every_counter() {
        let a = Arc::new(Xstats::default());
        let b = Arc::new(Xstats::default());
        Xstats::bump(&a.tx_bad_tso);
        Xstats::bump(&b.tx_bad_tso);
        Xstats::bump(&b.tx_bad_offload);
        let v = Xstats::sum(&[a, b]);
        let get = |n: &str| v.iter().find(|(k, _)| k == n).map(|(_, c)| *c);
        assert_eq!(get("tx_bad_tso"), Some(2));
        assert_eq!(get("tx_bad_offload"), Some(1));
        assert_eq!(get("rx_no_mkey"), Some(0));
        assert_eq!(v.len(), 11);
    }
}
