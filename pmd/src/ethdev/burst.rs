//! `Burst`: a fixed-capacity array of owned packets, the unit of every datapath call.
#![deny(unsafe_code)]

use mempool::{Mbuf, MbufCache};

/// Up to `capacity` owned packets. Allocated once at setup; pushing within capacity never
/// allocates, so a burst can live on a polling core's hot path.
#[derive(Default)]
pub struct Burst {
    pkts: Vec<Mbuf>,
}

impl std::fmt::Debug for Burst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Burst({}/{})", self.pkts.len(), self.pkts.capacity())
    }
}

impl Burst {
    /// An empty burst that holds up to `capacity` packets.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            pkts: Vec::with_capacity(capacity),
        }
    }

    /// Packets held.
    #[inline]
    pub fn len(&self) -> usize {
        self.pkts.len()
    }

    /// Whether it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pkts.is_empty()
    }

    /// Most packets it can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.pkts.capacity()
    }

    /// Room left.
    #[inline]
    pub fn spare(&self) -> usize {
        self.pkts.capacity() - self.pkts.len()
    }

    /// Adds a packet; gives it back when the burst is full.
    ///
    /// # Errors
    /// The packet, when there is no room.
    #[inline]
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.pkts.len() == self.pkts.capacity() {
            return Err(m);
        }
        self.pkts.push(m);
        Ok(())
    }

    /// The packets' vector, for a driver that appends a run in place (within the capacity:
    /// a push beyond it would allocate).
    #[inline]
    pub(crate) fn vec_mut(&mut self) -> &mut Vec<Mbuf> {
        &mut self.pkts
    }

    /// Removes the last packet.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        self.pkts.pop()
    }

    /// The packets.
    #[inline]
    pub fn as_slice(&self) -> &[Mbuf] {
        &self.pkts
    }

    /// The packets, mutably (to rewrite headers in place).
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        &mut self.pkts
    }

    /// Iterates over the packets.
    pub fn iter(&self) -> std::slice::Iter<'_, Mbuf> {
        self.pkts.iter()
    }

    /// Iterates over the packets mutably.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Mbuf> {
        self.pkts.iter_mut()
    }

    /// Takes the first `n` packets out, in order; the rest move to the front.
    #[inline]
    pub fn drain_front(&mut self, n: usize) -> std::vec::Drain<'_, Mbuf> {
        self.pkts.drain(..n.min(self.pkts.len()))
    }

    /// Frees every packet: each goes to this thread's cache for its pool when the thread
    /// has one (a polling core whose bursts have run has one), else to its pool's shared
    /// ring (see `mempool::lcache`). The capacity stays.
    #[inline]
    pub fn clear(&mut self) {
        self.pkts.clear();
    }

    /// Frees every packet through `cache`.
    #[inline]
    pub fn free_all(&mut self, cache: &mut MbufCache) {
        for m in self.pkts.drain(..) {
            m.free_to(cache);
        }
    }
}

impl Extend<Mbuf> for Burst {
    /// Adds packets up to the capacity; any beyond it are dropped (freed to their pool).
    fn extend<I: IntoIterator<Item = Mbuf>>(&mut self, iter: I) {
        for m in iter {
            if self.push(m).is_err() {
                break;
            }
        }
    }
}
