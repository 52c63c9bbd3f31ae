//! [`Loopback`]: an in-process cable between two ports of the same process.
#![deny(unsafe_code)]

use super::ring::{ring_bytes, FrameRing};
use super::{Wire, WireError, MAX_FRAME};
use crate::sys::DevMem;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of records per direction of a [`Loopback`] cable: 16,384 frames of 60 bytes, or 113
/// of 9000 bytes (a frame takes `4 + len` bytes rounded up to 64, see [`super::ring`]).
pub const LOOPBACK_RING_BYTES: usize = 1 << 20;
const LOOP_RING_BYTES: usize = LOOPBACK_RING_BYTES;

/// Which ends of a cable are open right now, `[A, B]`; shared by both ends.
type OpenEnds = Arc<[AtomicBool; 2]>;

/// The two directions of an in-process cable waiting for its second end.
struct PendingCable {
    a_to_b: FrameRing,
    b_to_a: FrameRing,
    open: OpenEnds,
}

fn loopback_registry() -> &'static Mutex<HashMap<String, PendingCable>> {
    static REG: std::sync::OnceLock<Mutex<HashMap<String, PendingCable>>> =
        std::sync::OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

/// An in-process cable end.
#[derive(Debug)]
pub struct Loopback {
    name: String,
    end_b: bool,
    tx: FrameRing,
    rx: FrameRing,
    open: OpenEnds,
}

impl Loopback {
    /// The first call with a name creates the cable and returns end A; the second returns
    /// end B and forgets the name (a third call starts a new cable). An end A closed before
    /// its end B arrived takes the name with it.
    ///
    /// # Errors
    /// Allocating the rings failed.
    pub fn open(name: &str) -> Result<Self, WireError> {
        let mut reg = loopback_registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = reg.remove(name) {
            c.open[1].store(true, Ordering::Release);
            return Ok(Self {
                name: name.into(),
                end_b: true,
                tx: c.b_to_a,
                rx: c.a_to_b,
                open: c.open,
            });
        }
        let bytes = ring_bytes(LOOP_RING_BYTES);
        let alloc = || {
            DevMem::anon(bytes)
                .map(Arc::new)
                .map_err(|source| WireError::Shm {
                    name: name.into(),
                    path: PathBuf::from("(anonymous)"),
                    source,
                })
        };
        let a_to_b = FrameRing::new(alloc()?, 0, LOOP_RING_BYTES, MAX_FRAME);
        let b_to_a = FrameRing::new(alloc()?, 0, LOOP_RING_BYTES, MAX_FRAME);
        let open: OpenEnds = Arc::new([AtomicBool::new(true), AtomicBool::new(false)]);
        reg.insert(
            name.into(),
            PendingCable {
                a_to_b: a_to_b.clone(),
                b_to_a: b_to_a.clone(),
                open: Arc::clone(&open),
            },
        );
        Ok(Self {
            name: name.into(),
            end_b: false,
            tx: a_to_b,
            rx: b_to_a,
            open,
        })
    }

    fn mine(&self) -> usize {
        usize::from(self.end_b)
    }

    fn peer(&self) -> usize {
        usize::from(!self.end_b)
    }
}

impl Wire for Loopback {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.tx.push(frame)
    }
    /// Publishes what was sent since the last flush: one store the peer sees, per burst.
    fn flush(&mut self) {
        self.tx.publish();
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.rx.pop(buf)
    }
    /// In-process, an open end is a live one: the same as [`Wire::peer_attached`].
    fn peer_alive(&self) -> bool {
        self.peer_attached()
    }
    /// False from the moment end A opens until end B does, and again once the other end is
    /// dropped.
    fn peer_attached(&self) -> bool {
        self.open[self.peer()].load(Ordering::Acquire)
    }
    fn describe(&self) -> String {
        format!(
            "loop:{} (end {})",
            self.name,
            if self.end_b { 'B' } else { 'A' }
        )
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        // Frames sent and not yet flushed still go; frames taken are known as taken.
        self.tx.publish();
        self.rx.publish_consumed();
        let mut reg = loopback_registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // An end A whose end B never came: forget the name (the registry holds the rings).
        if reg
            .get(&self.name)
            .is_some_and(|c| Arc::ptr_eq(&c.open, &self.open))
        {
            reg.remove(&self.name);
        }
        self.open[self.mine()].store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_pairs_by_name_and_carries_both_ways() {
        let mut a = Loopback::open("t-pair").unwrap();
        let mut b = Loopback::open("t-pair").unwrap();
        let mut c = Loopback::open("t-pair").unwrap(); // a new cable
        let mut buf = [0u8; 64];
        assert!(a.send(b"ping"));
        a.flush();
        assert_eq!(b.recv(&mut buf), Some(4));
        assert_eq!(&buf[..4], b"ping");
        assert!(b.send(b"pong!"));
        b.flush();
        assert_eq!(a.recv(&mut buf), Some(5));
        assert_eq!(c.recv(&mut buf), None);
        assert!(a.describe().contains("end A") && b.describe().contains("end B"));
    }

    #[test]
    fn peer_attached_once_the_second_end_opens_and_until_it_closes() {
        let a = Loopback::open("t-attach").unwrap();
        assert!(!a.peer_attached(), "no end B yet");
        assert!(!a.peer_alive());
        let b = Loopback::open("t-attach").unwrap();
        assert!(a.peer_attached() && b.peer_attached());
        assert!(a.peer_alive() && b.peer_alive());
        drop(b);
        assert!(!a.peer_attached(), "end B closed");
        assert!(!a.peer_alive());
        let a2 = Loopback::open("t-attach").unwrap();
        assert!(a2.describe().contains("end A"), "the name was free again");
        let b2 = Loopback::open("t-attach").unwrap();
        drop(a2);
        assert!(!b2.peer_attached(), "end A closed");
        assert!(!a.peer_attached(), "cables do not mix");
    }

    #[test]
    fn an_end_a_closed_before_its_peer_came_frees_the_name() {
        let a = Loopback::open("t-early").unwrap();
        drop(a);
        let again = Loopback::open("t-early").unwrap();
        assert!(again.describe().contains("end A"));
        assert!(!again.peer_attached());
    }
}
