//! The machine's monotonic clock (`CLOCK_MONOTONIC`) in nanoseconds: one clock for every
//! process of the machine, so a time stamp written by one process (a sender's TX stamp) can
//! be compared with the clock of another (a receiver measuring latency). `Instant` reads the
//! same clock but does not show its value. Read through the vDSO: no system call.
#![allow(unsafe_code)]

/// Nanoseconds of `CLOCK_MONOTONIC` (time since an arbitrary point, the same in every process
/// of the machine, never going back).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes only the `timespec` it is given, which lives on this
    // stack frame; CLOCK_MONOTONIC exists on every Linux, so it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_monotonic_clock_advances_with_instant() {
        let (a, i) = (super::monotonic_ns(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (b, d) = (super::monotonic_ns(), i.elapsed());
        assert!(b > a);
        // Both read the same clock: the two intervals agree closely.
        let diff = (b - a).abs_diff(d.as_nanos() as u64);
        assert!(diff < 5_000_000, "{} ns vs {:?}", b - a, d);
    }
}
