//! Driver-side extended counters, one set per queue: each is written by the one core that
//! owns the queue (a relaxed load + store, no locked read-modify-write) and summed when read.
//! Each declares what it says about lost frames ([`crate::ethdev::Loss`]).
#![deny(unsafe_code)]

crate::queue_xstats! {
    /// Extended counters of one MANA queue.
    pub struct Xstats {
        /// RX CQEs with a type other than RX_OKAY / RX_COALESCED_4 (in `ierrors`).
        rx_cqe_errors: "rx_cqe_errors", Counted;
        /// RX_TRUNCATED CQEs (among `rx_cqe_errors`).
        rx_cqe_truncated: "rx_cqe_truncated", Counted;
        /// RX_COALESCED_4 CQEs: not zero where the kernel turned RX CQE coalescing on for the
        /// port's RSS QP (`mana_ib` of newer kernels).
        rx_coalesced_cqes: "rx_coalesced_cqes", None;
        /// RX buffers not posted because they lay outside registered memory (no memory key;
        /// in `ierrors`, a buffer, not a frame).
        rx_no_mkey: "rx_no_mkey", None;
        /// TX CQEs with an error type (their packets in `oerrors`).
        tx_cqe_errors: "tx_cqe_errors", Counted;
        /// TX_OKAY CQEs with no completion request in flight (ignored).
        tx_unexpected_cqes: "tx_unexpected_cqes", None;
        /// Times a CQ was found lapped by the device.
        cq_overflows: "cq_overflows", Counted;
        /// Packets dropped at TX because they had more segments than a WQE holds (in
        /// `oerrors`).
        tx_too_many_segs: "tx_too_many_segs", Counted;
        /// Packets dropped at TX because a segment was outside any registered memory (in
        /// `oerrors`).
        tx_no_mkey: "tx_no_mkey", Counted;
        /// Packets dropped at TX because their checksum-offload headers were not where the
        /// mbuf's lengths said (in `oerrors`).
        tx_bad_offload: "tx_bad_offload", Counted;
        /// Packets dropped at TX because their TSO request was unusable (MSS 0 or above
        /// 16383, headers over 255 bytes or not in the first segment; in `oerrors`).
        tx_bad_tso: "tx_bad_tso", Counted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethdev::Loss;
    use std::sync::Arc;

    #[test]
    fn sums_every_queue_and_reports_every_counter() {
        let a = Arc::new(Xstats::default());
        let b = Arc::new(Xstats::default());
        Xstats::bump(&a.tx_bad_tso);
        Xstats::bump(&b.tx_bad_tso);
        Xstats::bump(&b.tx_bad_offload);
        let v = Xstats::sum(&[a, b]);
        let get = |n: &str| v.iter().find(|x| x.name == n).map(|x| (x.value, x.loss));
        assert_eq!(get("tx_bad_tso"), Some((2, Loss::Counted)));
        assert_eq!(get("tx_bad_offload"), Some((1, Loss::Counted)));
        assert_eq!(get("rx_no_mkey"), Some((0, Loss::None)));
        assert_eq!(v.len(), 11);
    }
}
