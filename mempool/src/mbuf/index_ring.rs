//! [`IndexRing`]: the ring of object indices under [`super::MbufFifo`] and [`super::RxBufs`],
//! with free-running positions (`head - tail` is the count even after they wrap, because the
//! size divides 2^32).

/// A power-of-two ring of `u32` slots, filled at `head`, emptied at `tail`.
#[derive(Debug)]
pub(super) struct IndexRing {
    pub(super) slots: Box<[u32]>,
    /// Slots filled so far (free-running).
    pub(super) head: u32,
    /// Slots emptied so far (free-running).
    pub(super) tail: u32,
    pub(super) mask: u32,
}

impl IndexRing {
    /// `n` slots.
    ///
    /// # Panics
    /// If `n` is not a power of two.
    pub(super) fn new(n: u32, what: &str) -> Self {
        assert!(n.is_power_of_two(), "{what} of {n} slots");
        Self {
            slots: vec![0; n as usize].into_boxed_slice(),
            head: 0,
            tail: 0,
            mask: n - 1,
        }
    }

    #[inline]
    pub(super) fn capacity(&self) -> u32 {
        self.mask + 1
    }

    #[inline]
    pub(super) fn len(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    #[inline]
    pub(super) fn free(&self) -> u32 {
        self.capacity() - self.len()
    }

    /// The slot of free-running position `pos`.
    #[inline]
    pub(super) fn at(&self, pos: u32) -> usize {
        (pos & self.mask) as usize
    }

    /// The `n` slots from free-running position `pos` on, as the part up to the end of the
    /// ring and the part wrapped to its start (empty when they do not wrap).
    ///
    /// # Panics
    /// If `n` exceeds the capacity.
    #[inline]
    pub(super) fn run(&self, pos: u32, n: u32) -> (&[u32], &[u32]) {
        assert!(
            n <= self.capacity(),
            "a run of {n} in a ring of {}",
            self.capacity()
        );
        let at = self.at(pos);
        let first = (n as usize).min(self.slots.len() - at);
        (
            &self.slots[at..at + first],
            &self.slots[..n as usize - first],
        )
    }
}
