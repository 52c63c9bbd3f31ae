//! The shared free list: two lock-free `crossbeam_queue::ArrayQueue`s of `u32` indices.
//!
//! An `ArrayQueue` moves one element per compare-and-swap, so moving `n` indices one by one costs
//! `n` CASes on shared cache lines. Most traffic is in bulk (cache refills and flushes, bulk gets
//! and puts), so whole groups of [`PACK`] indices travel as **one** element of `packs`; only the
//! remainders travel one by one through `singles`:
//!
//! - put `n`: `n / PACK` pushes to `packs`, `n % PACK` pushes to `singles`;
//! - get `n` (all-or-nothing): packs while `PACK` or more are still wanted, then singles; if the
//!   singles run out, one more pack is split and its unused part goes back as singles. When
//!   the free list cannot supply `n`, everything taken is put back and the get fails;
//! - a cache refill takes whole packs even if that overshoots by up to `PACK - 1` (the cache has
//!   room for that), and a cache flush gives back whole packs, so caches keep the free list in
//!   packs and a 512-object refill is 32 CASes instead of 512.
//!
//! Capacities: `singles` holds every object (the worst case is all of them put one by one) and
//! `packs` holds `capacity / PACK` packs (as many as there can be), so a put never fails unless
//! more objects come back than exist.
#![deny(unsafe_code)]

use crossbeam_queue::ArrayQueue;

/// Indices per pack (one 64-byte element).
pub(crate) const PACK: usize = 16;

type Pack = [u32; PACK];

pub(crate) struct Ring {
    packs: ArrayQueue<Pack>,
    singles: ArrayQueue<u32>,
}

impl Ring {
    /// An empty ring for `capacity` objects.
    pub(crate) fn new(capacity: u32) -> Ring {
        let capacity = capacity as usize;
        Ring {
            packs: ArrayQueue::new((capacity / PACK).max(1)),
            singles: ArrayQueue::new(capacity.max(1)),
        }
    }

    /// Objects in the ring (a snapshot; exact when no operation is in flight).
    pub(crate) fn len(&self) -> usize {
        self.packs.len() * PACK + self.singles.len()
    }

    /// Puts objects back: whole packs, then singles. `Err(idx)` names an object that did not fit
    /// (only possible when more objects come back than the pool holds).
    #[inline]
    pub(crate) fn put(&self, objs: &[u32]) -> Result<(), u32> {
        if objs.len() < PACK {
            for &i in objs {
                self.put_one(i)?;
            }
            return Ok(());
        }
        let mut chunks = objs.chunks_exact(PACK);
        for chunk in &mut chunks {
            let mut pack: Pack = [0; PACK];
            pack.copy_from_slice(chunk);
            if let Err(pack) = self.packs.push(pack) {
                // Cannot happen with unique objects (there are at most capacity / PACK whole
                // packs); fall back to singles so the overflow is reported for the right object.
                for &i in &pack {
                    self.put_one(i)?;
                }
            }
        }
        for &i in chunks.remainder() {
            self.put_one(i)?;
        }
        Ok(())
    }

    /// Pops a pack, checking emptiness first: `ArrayQueue::pop` on an empty queue issues a
    /// SeqCst fence, while an emptiness check is two plain loads. Packs are often absent when
    /// traffic is in small bulks, so the check pays for itself here.
    #[inline]
    fn pop_pack(&self) -> Option<Pack> {
        if self.packs.is_empty() {
            None
        } else {
            self.packs.pop()
        }
    }

    /// Pops a single index. Usually there are some, so no emptiness check first (it measured
    /// slower: one more shared cache line to read).
    #[inline]
    fn pop_single(&self) -> Option<u32> {
        self.singles.pop()
    }

    /// Puts one object back.
    #[inline]
    pub(crate) fn put_one(&self, idx: u32) -> Result<(), u32> {
        self.singles.push(idx).map_err(|_| idx)
    }

    /// Fills `out` completely, or takes nothing and returns `false`.
    #[inline]
    pub(crate) fn get_exact(&self, out: &mut [u32]) -> Result<bool, u32> {
        let n = out.len();
        let mut got = 0;
        while n - got >= PACK {
            match self.pop_pack() {
                Some(p) => {
                    out[got..got + PACK].copy_from_slice(&p);
                    got += PACK;
                }
                None => break,
            }
        }
        while got < n {
            match self.pop_single() {
                Some(i) => {
                    out[got] = i;
                    got += 1;
                }
                None => break,
            }
        }
        while got < n {
            // Out of singles: split a pack, return what we do not need.
            match self.pop_pack() {
                Some(p) => {
                    let take = (n - got).min(PACK);
                    out[got..got + take].copy_from_slice(&p[..take]);
                    got += take;
                    self.put(&p[take..])?;
                }
                None => {
                    self.put(&out[..got])?;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Takes up to `want` objects into `buf` for a cache refill, as whole packs where `buf` has
    /// room for them (so it may take up to `PACK - 1` more than `want`), then singles. Returns
    /// how many it took (`<= buf.len()`).
    #[inline]
    pub(crate) fn get_upto(&self, buf: &mut [u32], want: usize) -> usize {
        let mut got = 0;
        while got < want && got + PACK <= buf.len() {
            match self.pop_pack() {
                Some(p) => {
                    buf[got..got + PACK].copy_from_slice(&p);
                    got += PACK;
                }
                None => break,
            }
        }
        let want = want.min(buf.len());
        while got < want {
            match self.pop_single() {
                Some(i) => {
                    buf[got] = i;
                    got += 1;
                }
                None => break,
            }
        }
        if got < want && got + PACK <= buf.len() {
            // Packs may have come back while we took singles.
            if let Some(p) = self.pop_pack() {
                buf[got..got + PACK].copy_from_slice(&p);
                got += PACK;
            }
        }
        got
    }

    /// Takes everything out (waiting for pushes in flight), for exact counting.
    pub(crate) fn drain(&self) -> Vec<u32> {
        let mut all = Vec::with_capacity(self.len());
        // `pop` returns `None` only when a queue is truly empty: a push that has claimed a slot
        // but not yet published it makes `pop` wait for it.
        while let Some(p) = self.packs.pop() {
            all.extend_from_slice(&p);
        }
        while let Some(i) = self.singles.pop() {
            all.push(i);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(n: u32) -> Ring {
        let r = Ring::new(n);
        r.put(&(0..n).collect::<Vec<_>>()).unwrap();
        r
    }

    #[test]
    fn put_splits_into_packs_and_singles() {
        let r = full(40);
        assert_eq!(r.packs.len(), 2);
        assert_eq!(r.singles.len(), 8);
        assert_eq!(r.len(), 40);
    }

    #[test]
    fn get_exact_splits_a_pack_when_singles_run_out() {
        let r = full(32); // two packs, no singles
        let mut out = [0u32; 3];
        assert!(r.get_exact(&mut out).unwrap());
        assert_eq!(r.len(), 29);
        assert_eq!(r.singles.len(), 13, "the unused part of the split pack");
        let mut rest = [0u32; 29];
        assert!(r.get_exact(&mut rest).unwrap());
        let mut seen: Vec<u32> = out.iter().chain(&rest).copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..32).collect::<Vec<_>>());
        assert!(!r.get_exact(&mut [0u32; 1]).unwrap());
    }

    #[test]
    fn failed_get_exact_puts_everything_back() {
        let r = full(40);
        let mut out = [0u32; 41];
        assert!(!r.get_exact(&mut out).unwrap());
        assert_eq!(r.len(), 40);
        assert_eq!(r.drain().len(), 40);
    }

    #[test]
    fn get_upto_takes_whole_packs_where_there_is_room() {
        let r = full(64);
        let mut buf = [0u32; 48];
        assert_eq!(
            r.get_upto(&mut buf, 20),
            32,
            "two whole packs for 20 wanted"
        );
        // No singles, and no room for a pack: nothing (callers leave PACK - 1 slots of room).
        assert_eq!(r.get_upto(&mut buf[..10], 10), 0);
        r.put(&[100, 101, 102]).unwrap();
        assert_eq!(r.get_upto(&mut buf[..10], 10), 3, "singles fit anywhere");
        assert_eq!(r.len(), 32);
    }

    #[test]
    fn overflow_names_the_object() {
        let r = full(16);
        assert_eq!(r.put(&[7]), Ok(()), "singles hold every object");
        let r = full(1);
        assert_eq!(r.put(&[9]), Err(9));
    }
}
