//! Errors of the mbuf length and chain operations.
#![deny(unsafe_code)]

use std::fmt;

use super::Mbuf;

/// Why a length operation on an mbuf was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MbufError {
    /// `prepend` needs more headroom than the first segment has.
    #[error("prepend of {need} bytes: only {have} bytes of headroom")]
    NoHeadroom {
        /// Bytes asked for.
        need: usize,
        /// Headroom available.
        have: usize,
    },
    /// `append` needs more tailroom than the last segment has.
    #[error("append of {need} bytes: only {have} bytes of tailroom in the last segment")]
    NoTailroom {
        /// Bytes asked for.
        need: usize,
        /// Tailroom available.
        have: usize,
    },
    /// `adj` / `trim` asked to remove more than the segment holds.
    #[error("cannot remove {need} bytes from a segment holding {have}")]
    TooShort {
        /// Bytes asked for.
        need: usize,
        /// Bytes in the segment.
        have: usize,
    },
    /// `set_data_len` beyond the buffer.
    #[error("data length {len} does not fit: {room} bytes of buffer after the data offset")]
    TooLong {
        /// Length asked for.
        len: usize,
        /// Room after the data offset.
        room: usize,
    },
    /// `chain` with a tail from another pool.
    #[error("cannot chain mbufs from different pools")]
    DifferentPools,
    /// `chain` would overflow the segment count or packet length.
    #[error(
        "chain would have {segs} segments and {bytes} bytes; at most 65535 segments and 4 GiB"
    )]
    ChainTooLong {
        /// Segments the chain would have.
        segs: u32,
        /// Bytes the chain would have.
        bytes: u64,
    },
}

/// A refused [`Mbuf::chain`]: the reason, and the tail handed back.
pub struct ChainError {
    /// Why.
    pub error: MbufError,
    /// The tail that was not chained.
    pub tail: Mbuf,
}

impl fmt::Debug for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for ChainError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
