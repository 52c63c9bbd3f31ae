//! What the tools share, by role: [`ports`] (pool and port set-up, links), [`events`] (port
//! events), [`accounting`] (loss counters, statistics lines and JSON); here the small things
//! (a single-writer counter, idle back-off, SI formatting).
#![deny(unsafe_code)]

pub mod accounting;
pub mod events;
pub mod ports;

pub use accounting::*;
pub use events::*;
pub use ports::*;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A counter with one writer (a polling core) and any number of readers.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (single writer: a relaxed load and store, no locked instruction).
    #[inline]
    pub fn add(&self, n: u64) {
        if n != 0 {
            self.0
                .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        }
    }
    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Back-off for a polling loop that found nothing to do, so that on a small machine other
/// processes (and device-model engine threads, `engine=thread`) get the CPU when there is no
/// traffic. A loop that moves packets keeps its CPU, as DPDK's lcores do: the device models'
/// default inline engines do their work on this very core, and giving it away (a yield hands
/// a loaded machine's core to whoever else is runnable, for a whole time slice) only lets the
/// cables fill. Busy mode never yields.
#[derive(Debug, Clone)]
pub struct Idle {
    busy: bool,
    empty: u32,
}

impl Idle {
    /// `busy`: spin forever (benchmarks on dedicated cores).
    pub fn new(busy: bool) -> Self {
        Self { busy, empty: 0 }
    }

    /// Call after each loop iteration with whether it moved any packet.
    #[inline]
    pub fn after(&mut self, did_work: bool) {
        if self.busy {
            return;
        }
        if did_work {
            self.empty = 0;
            return;
        }
        self.empty = self.empty.saturating_add(1);
        if self.empty < 256 {
            std::hint::spin_loop();
        } else if self.empty < 512 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(u64::from(
                (self.empty - 511).min(100),
            )));
        }
    }
}

/// `1234567.0` -> `"1.23 M"`.
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} k", v / 1e3)
    } else {
        format!("{v:.0} ")
    }
}
