//! The mlx5 queues' extended counters, one set per queue, each declared with what it says
//! about lost frames ([`crate::ethdev::Loss`]): written by the queue's core, summed by the
//! driver.
#![deny(unsafe_code)]

use crate::hw::mlx5::cqe::Syndrome;

crate::queue_xstats! {
    /// RX counters (both RX queue kinds), each with what it says about lost frames.
    pub struct RxXstats {
        /// Error CQEs a burst found (not those a recovery consumes: see `flushed`,
        /// `recovery_drops`; in `ierrors`).
        cqe_errors: "rx_cqe_errors", Counted;
        /// ... of which with a syndrome that needs the WQ reset (each starts a recovery).
        critical_errors: "rx_critical_errors", Counted;
        /// Flush CQEs (WR_FLUSH) consumed by recoveries: posted buffers the device gave back
        /// unused (no frame lost with them).
        flushed: "rx_flushed", None;
        /// Other completions consumed by recoveries: frames dropped (also counted in
        /// errors).
        recovery_drops: "rx_recovery_drops", Counted;
        /// Recoveries done: the WQ went through RESET back to RDY and was reposted.
        recoveries: "rx_recoveries", None;
        /// Recovery attempts that failed (a state change refused).
        recovery_failures: "rx_recovery_failures", None;
        /// Buffers outside every registered chunk (in `ierrors`: a buffer, not a frame).
        no_mkey: "rx_no_mkey", None;
        /// Compressed sessions decompressed.
        compressed_sessions: "rx_compressed_sessions", None;
        /// Striding RQ: filler completions (strides left unused at the end of a WQE, §4.2).
        mprq_fillers: "rx_mprq_fillers", None;
        /// Striding RQ: WQEs whose every stride was consumed and that were posted again.
        mprq_wqes_retired: "rx_mprq_wqes_retired", None;
        /// Striding RQ: completions naming strides outside their WQE (dropped, in
        /// `ierrors`).
        mprq_bad_strides: "rx_mprq_bad_strides", Counted;
        /// Packets longer than an mbuf's data room (dropped, in `ierrors`).
        too_long: "rx_too_long", Counted;
    }
}

impl RxXstats {
    /// Counts what a completion poll found wrong.
    pub(super) fn bad(&self, critical: bool) {
        Self::bump(&self.cqe_errors);
        if critical {
            Self::bump(&self.critical_errors);
        }
    }
}

crate::queue_xstats! {
    /// Device-side reasons a TX packet was dropped or failed, each with what it says about
    /// lost frames.
    pub struct TxXstats {
        /// Error CQEs other than flushes: WQEs the device failed (each starts a recovery).
        cqe_errors: "tx_cqe_errors", Counted;
        /// ... of which LOCAL_LENGTH.
        err_local_length: "tx_err_local_length", Counted;
        /// ... of which LOCAL_QP_OP (a malformed WQE).
        err_local_qp_op: "tx_err_local_qp_op", Counted;
        /// ... of which LOCAL_PROT (a bad memory key or range).
        err_local_prot: "tx_err_local_prot", Counted;
        /// ... of which any other syndrome.
        err_other: "tx_err_other", Counted;
        /// Flush CQEs (WR_FLUSH): WQEs after a failed one that the device did not execute
        /// (their packets among `error_drops`).
        flushed: "tx_flushed", Counted;
        /// Packets freed unsent by error recovery: those of the failed WQE and of every WQE
        /// after it (also counted in the queue's errors).
        error_drops: "tx_error_drops", Counted;
        /// Recoveries done: the SQ went through RESET back to RTS.
        recoveries: "tx_recoveries", None;
        /// Recovery attempts that failed (a state change refused).
        recovery_failures: "tx_recovery_failures", None;
        /// Requester CQEs for a WQE that asked for no completion (ignored).
        unexpected_cqes: "tx_unexpected_cqes", None;
        /// Packets whose buffer is in no registered chunk (dropped, in `oerrors`).
        no_mkey: "tx_no_mkey", Counted;
        /// Packets needing more units than a WQE holds (dropped, in `oerrors`).
        too_many_segs: "tx_too_many_segs", Counted;
        /// Packets whose first segment is shorter than the inline header they need
        /// (dropped, in `oerrors`).
        short_header: "tx_short_header", Counted;
        /// TSO packets with headers or MSS out of range (dropped, in `oerrors`).
        bad_tso: "tx_bad_tso", Counted;
    }
}

impl TxXstats {
    /// Counts an error CQE by its syndrome (a flush apart).
    pub(super) fn count_error(&self, s: Syndrome) {
        let c = match s {
            Syndrome::WrFlush => return Self::bump(&self.flushed),
            Syndrome::LocalLength => &self.err_local_length,
            Syndrome::LocalQpOp => &self.err_local_qp_op,
            Syndrome::LocalProt => &self.err_local_prot,
            _ => &self.err_other,
        };
        Self::bump(&self.cqe_errors);
        Self::bump(c);
    }
}
