//! A wire with faults on demand: [`FaultyWire`] wraps any wire, as [`PcapTap`] does, and drops
//! frames as its knobs ([`WireFaults`]) say: every n-th arriving frame, or everything while
//! the link is down (the cable is out: nothing goes out, whatever arrives is lost). The knobs
//! are atomics behind an `Arc`, so whoever holds them (the device model's engine, a test) can
//! turn them while the wire is in use on another thread. All faults are deterministic.
//!
//! [`PcapTap`]: super::PcapTap
#![deny(unsafe_code)]

use super::Wire;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The knobs of a [`FaultyWire`], and what it dropped. All zero/false: no faults.
#[derive(Debug, Default)]
pub struct WireFaults {
    rx_drop_every: AtomicU32,
    link_down: AtomicBool,
    rx_drops: AtomicU64,
    tx_drops: AtomicU64,
}

impl WireFaults {
    /// Drops every n-th frame that arrives from the wire, counting all arrivals since the
    /// wire was wrapped (0: off).
    pub fn set_rx_drop_every(&self, n: u32) {
        self.rx_drop_every.store(n, Ordering::Relaxed);
    }

    /// See [`set_rx_drop_every`](Self::set_rx_drop_every).
    pub fn rx_drop_every(&self) -> u32 {
        self.rx_drop_every.load(Ordering::Relaxed)
    }

    /// Takes the link down (every frame is dropped, both ways) or brings it back up.
    pub fn set_link_down(&self, down: bool) {
        self.link_down.store(down, Ordering::Relaxed);
    }

    /// Whether the link is down.
    pub fn link_down(&self) -> bool {
        self.link_down.load(Ordering::Relaxed)
    }

    /// Arriving frames dropped so far.
    pub fn rx_drops(&self) -> u64 {
        self.rx_drops.load(Ordering::Relaxed)
    }

    /// Frames refused on send because the link was down.
    pub fn tx_drops(&self) -> u64 {
        self.tx_drops.load(Ordering::Relaxed)
    }
}

/// What one [`FaultyWire::recv_or_drop`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A frame of this length is in the buffer.
    Frame(usize),
    /// A frame arrived and was dropped by a fault.
    Dropped,
    /// Nothing was waiting.
    Nothing,
}

/// Most frames one [`Wire::recv`] drops before it answers `None`, so a flood on a pulled
/// cable cannot hold its caller.
const MAX_DROPS_PER_RECV: usize = 64;

/// Wraps a wire and applies the faults its [`WireFaults`] knobs ask for.
pub struct FaultyWire {
    inner: Box<dyn Wire>,
    faults: Arc<WireFaults>,
    /// Frames taken from the inner wire so far (the count `rx_drop_every` divides).
    seen: u64,
}

impl std::fmt::Debug for FaultyWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FaultyWire({}, {:?})",
            self.inner.describe(),
            self.faults
        )
    }
}

impl FaultyWire {
    /// Wraps `inner` with fresh knobs (no faults).
    pub fn new(inner: Box<dyn Wire>) -> Self {
        Self::with_faults(inner, Arc::default())
    }

    /// Wraps `inner` with knobs shared with the caller.
    pub fn with_faults(inner: Box<dyn Wire>, faults: Arc<WireFaults>) -> Self {
        Self {
            inner,
            faults,
            seen: 0,
        }
    }

    /// The knobs.
    pub fn faults(&self) -> &Arc<WireFaults> {
        &self.faults
    }

    /// Takes one frame from the inner wire into `buf`, or drops it as the faults say. Unlike
    /// [`Wire::recv`], a dropped frame is reported, so a caller can count it and spend its
    /// per-pass budget on it as on any other arrival.
    pub fn recv_or_drop(&mut self, buf: &mut [u8]) -> Arrival {
        let Some(len) = self.inner.recv(buf) else {
            return Arrival::Nothing;
        };
        self.seen += 1;
        let every = u64::from(self.faults.rx_drop_every());
        if self.faults.link_down() || (every > 0 && self.seen.is_multiple_of(every)) {
            self.faults.rx_drops.fetch_add(1, Ordering::Relaxed);
            Arrival::Dropped
        } else {
            Arrival::Frame(len)
        }
    }
}

impl Wire for FaultyWire {
    /// Refused (`false`) while the link is down; otherwise the inner wire's answer.
    fn send(&mut self, frame: &[u8]) -> bool {
        if self.faults.link_down() {
            self.faults.tx_drops.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.inner.send(frame)
    }

    fn flush(&mut self) {
        self.inner.flush();
    }

    fn holds_arrivals(&self) -> bool {
        self.inner.holds_arrivals()
    }

    /// The next frame that survives the faults; `None` when nothing is waiting, or after
    /// dropping 64 frames in this call.
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        for _ in 0..MAX_DROPS_PER_RECV {
            match self.recv_or_drop(buf) {
                Arrival::Frame(len) => return Some(len),
                Arrival::Nothing => return None,
                Arrival::Dropped => {}
            }
        }
        None
    }

    fn peer_alive(&self) -> bool {
        self.inner.peer_alive()
    }

    fn peer_attached(&self) -> bool {
        self.inner.peer_attached()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    /// The inner wire's (this wrapper's own drops are the model's `rx_fault_drops`).
    fn stats(&self) -> Vec<crate::ethdev::Xstat> {
        self.inner.stats()
    }

    fn capture_error(&self) -> Option<i32> {
        self.inner.capture_error()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Loopback;
    use super::*;

    fn cable(name: &str) -> (FaultyWire, Loopback) {
        let a = Loopback::open(name).unwrap();
        let b = Loopback::open(name).unwrap();
        (FaultyWire::new(Box::new(a)), b)
    }

    #[test]
    fn no_faults_passes_everything_both_ways() {
        let (mut w, mut peer) = cable("t-faults-none");
        let mut buf = [0u8; 16];
        assert!(w.send(b"out"));
        w.flush();
        assert_eq!(peer.recv(&mut buf), Some(3));
        assert!(peer.send(b"in!!"));
        peer.flush();
        assert_eq!(w.recv_or_drop(&mut buf), Arrival::Frame(4));
        assert_eq!(w.recv_or_drop(&mut buf), Arrival::Nothing);
        assert!(w.describe().starts_with("loop:t-faults-none"));
    }

    #[test]
    fn every_nth_arrival_is_dropped_and_counted() {
        let (mut w, mut peer) = cable("t-faults-nth");
        w.faults().set_rx_drop_every(3);
        let mut buf = [0u8; 16];
        for i in 0..7u8 {
            assert!(peer.send(&[i]));
            peer.flush();
        }
        let got: Vec<Arrival> = (0..8).map(|_| w.recv_or_drop(&mut buf)).collect();
        use Arrival::{Dropped, Frame, Nothing};
        assert_eq!(
            got,
            [
                Frame(1),
                Frame(1),
                Dropped,
                Frame(1),
                Frame(1),
                Dropped,
                Frame(1),
                Nothing
            ]
        );
        assert_eq!(w.faults().rx_drops(), 2);
    }

    #[test]
    fn link_down_drops_both_ways_until_it_comes_back() {
        let (mut w, mut peer) = cable("t-faults-link");
        let knobs = Arc::clone(w.faults());
        knobs.set_link_down(true);
        let mut buf = [0u8; 16];
        assert!(!w.send(b"lost"));
        w.flush();
        assert_eq!(peer.recv(&mut buf), None);
        for _ in 0..100 {
            assert!(peer.send(b"x"));
            peer.flush();
        }
        // recv drops at most 64 per call, then says nothing is there.
        assert_eq!(w.recv(&mut buf), None);
        assert_eq!(w.recv(&mut buf), None);
        assert_eq!((knobs.rx_drops(), knobs.tx_drops()), (100, 1));
        knobs.set_link_down(false);
        assert!(w.send(b"back"));
        w.flush();
        assert_eq!(peer.recv(&mut buf), Some(4));
        assert!(peer.send(b"hi"));
        peer.flush();
        assert_eq!(w.recv(&mut buf), Some(2));
    }
}
