//! The counters of exported queue pairs, shared between the primary's port and the secondary
//! that polls the pair ([`crate::ethdev::export`]).
#![deny(unsafe_code)]

use std::path::Path;

/// The counters of an exported queue pair, in a small shared file the primary makes and the
/// secondary that polls the pair writes ([`SharedQueueStats::publish`], from its control
/// loop): the primary's port statistics then count what its secondaries receive and send.
///
/// A sequence lock: the writer makes the sequence odd, stores the ten counters, makes it
/// even; a reader retries while it is odd or moved. The values are the secondary's word: a
/// misbehaving one can only make its own queue's counts wrong.
#[derive(Debug, Clone)]
pub struct SharedQueueStats {
    mem: std::sync::Arc<crate::sys::DevMem>,
}

/// Bytes of a stats file.
pub const STATS_BYTES: usize = 4096;
const STATS_MAGIC: u64 = u64::from_le_bytes(*b"PMDQSTAT");

impl SharedQueueStats {
    /// A new stats file at `path` (zeroed, removed when dropped).
    ///
    /// # Errors
    /// Creating or mapping it failed.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let mem = crate::sys::DevMem::create_shared_file(path, STATS_BYTES)?;
        mem.store_u64(0, STATS_MAGIC, std::sync::atomic::Ordering::Release);
        Ok(Self {
            mem: std::sync::Arc::new(mem),
        })
    }

    /// Maps the stats file another process made.
    ///
    /// # Errors
    /// Missing, short, or not a stats file.
    pub fn open(path: &Path) -> Result<Self, String> {
        let mem = crate::sys::DevMem::shared_file(path, STATS_BYTES, false)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if mem.load_u64(0, std::sync::atomic::Ordering::Acquire) != STATS_MAGIC {
            return Err(format!("{} is not a queue stats file", path.display()));
        }
        Ok(Self {
            mem: std::sync::Arc::new(mem),
        })
    }

    fn fields(s: &crate::ethdev::QueueStats) -> [u64; 5] {
        [s.packets, s.bytes, s.errors, s.missed, s.nombuf]
    }

    /// Writes the pair's counters (one writer: the process that polls the pair).
    pub fn publish(&self, rx: &crate::ethdev::QueueStats, tx: &crate::ethdev::QueueStats) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let seq = self.mem.load_u64(8, Relaxed);
        self.mem.store_u64(8, seq | 1, Release);
        std::sync::atomic::fence(Release);
        for (k, v) in Self::fields(rx)
            .into_iter()
            .chain(Self::fields(tx))
            .enumerate()
        {
            self.mem.store_u64(16 + 8 * k, v, Relaxed);
        }
        self.mem.store_u64(8, (seq | 1).wrapping_add(1), Release);
    }

    /// The counters last written: (RX, TX). A writer that died in the middle of a write
    /// leaves the sequence odd: after a thousand tries the values are taken as they are.
    pub fn read(&self) -> (crate::ethdev::QueueStats, crate::ethdev::QueueStats) {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        for tries in 0.. {
            let before = self.mem.load_u64(8, Acquire);
            let mut v = [0u64; 10];
            for (k, x) in v.iter_mut().enumerate() {
                *x = self.mem.load_u64(16 + 8 * k, Relaxed);
            }
            std::sync::atomic::fence(Acquire);
            if tries >= 1000 || (before & 1 == 0 && self.mem.load_u64(8, Relaxed) == before) {
                let q = |f: &[u64]| crate::ethdev::QueueStats {
                    packets: f[0],
                    bytes: f[1],
                    errors: f[2],
                    missed: f[3],
                    nombuf: f[4],
                };
                return (q(&v[..5]), q(&v[5..]));
            }
            std::hint::spin_loop();
        }
        unreachable!("the loop returns")
    }

    /// The file.
    pub fn path(&self) -> Option<&Path> {
        self.mem.shared_path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethdev::QueueStats;

    #[test]
    fn what_the_writer_publishes_the_reader_reads_and_a_torn_write_does_not_hang_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.stats");
        let mine = SharedQueueStats::create(&path).unwrap();
        let theirs = SharedQueueStats::open(&path).unwrap();
        assert_eq!(mine.read(), (QueueStats::default(), QueueStats::default()));
        let rx = QueueStats {
            packets: 5,
            bytes: 300,
            errors: 1,
            missed: 2,
            nombuf: 3,
        };
        let tx = QueueStats {
            packets: 7,
            ..QueueStats::default()
        };
        theirs.publish(&rx, &tx);
        assert_eq!(mine.read(), (rx, tx));
        // A writer that died mid-write leaves the sequence odd: the reader still returns.
        mine.mem
            .store_u64(8, 3, std::sync::atomic::Ordering::Release);
        assert_eq!(mine.read(), (rx, tx));
        // Not a stats file.
        std::fs::write(dir.path().join("junk"), vec![0u8; STATS_BYTES]).unwrap();
        assert!(SharedQueueStats::open(&dir.path().join("junk")).is_err());
        drop(theirs);
        drop(mine);
        assert!(!path.exists(), "the creator removes it");
    }
}
