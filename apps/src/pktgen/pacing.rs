//! Pacing: when the next burst may go, for a rate in packets or bits per second.
#![deny(unsafe_code)]

/// When each frame is due, counted from the start of sending.
#[derive(Debug, Clone, PartialEq)]
pub enum Pacing {
    /// A fixed rate, packets per second: frame `k` at `k / rate` s.
    Rate(f64),
    /// A capture's own timing, looping, `speed` times as fast: frame `k` of a capture of `n`
    /// frames at `((k / n) * period + times[k % n]) / speed`; a loop lasts the capture's span
    /// plus its mean gap between frames.
    Capture {
        /// Each frame's time after the first, ns (never decreasing).
        times_ns: Vec<u64>,
        /// One loop, ns.
        period_ns: u64,
        /// The speed multiplier (more than 0).
        speed: f64,
    },
}

impl Pacing {
    /// The timing of a capture's frames ([`super::Capture::times_ns`]), replayed `speed` times as
    /// fast.
    ///
    /// # Errors
    /// A capture that spans no time (one frame, or every frame at one timestamp): it has no
    /// timing to replay.
    pub fn capture(times_ns: &[u64], speed: f64) -> Result<Self, String> {
        let n = times_ns.len() as u64;
        let span = times_ns.last().copied().unwrap_or(0);
        if n < 2 || span == 0 {
            return Err(format!(
                "the capture spans no time ({n} frames, all at one timestamp): it has no timing to replay; give a rate instead"
            ));
        }
        Ok(Self::Capture {
            times_ns: times_ns.to_vec(),
            period_ns: span + span / (n - 1),
            speed,
        })
    }

    /// How many frames are due `elapsed` after the start (the first is due at once).
    #[inline]
    pub fn due(&self, elapsed: std::time::Duration) -> u64 {
        match self {
            Self::Rate(r) => (elapsed.as_secs_f64() * r) as u64 + 1,
            Self::Capture {
                times_ns,
                period_ns,
                speed,
            } => {
                let t = (elapsed.as_nanos() as f64 * speed).min(u64::MAX as f64 / 2.0) as u64;
                let loops = t / period_ns;
                let within = t % period_ns;
                let idx = times_ns.partition_point(|&x| x <= within) as u64;
                loops
                    .saturating_mul(times_ns.len() as u64)
                    .saturating_add(idx)
            }
        }
    }

    /// When frame `k` (from 0) is due, after the start.
    #[inline]
    pub fn due_at(&self, k: u64) -> std::time::Duration {
        match self {
            Self::Rate(r) => std::time::Duration::from_secs_f64(k as f64 / r),
            Self::Capture {
                times_ns,
                period_ns,
                speed,
            } => {
                let n = times_ns.len() as u64;
                let ns = (k / n) as f64 * *period_ns as f64 + times_ns[(k % n) as usize] as f64;
                std::time::Duration::from_secs_f64((ns / speed / 1e9).min(crate::cli::MAX_SECONDS))
            }
        }
    }
}
