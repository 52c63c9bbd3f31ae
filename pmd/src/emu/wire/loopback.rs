//! [`Loopback`]: an in-process cable between two ports of the same process.
#![deny(unsafe_code)]

use super::ring::{ring_bytes, FrameRing};
use super::{Wire, WireError, SLOT_BYTES};
use crate::sys::DevMem;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

const LOOP_SLOTS: u32 = 1024;
const LOOP_SLOT_BYTES: u32 = SLOT_BYTES;

/// The two directions of an in-process cable waiting for its second end.
struct PendingCable {
    a_to_b: FrameRing,
    b_to_a: FrameRing,
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
}

impl Loopback {
    /// The first call with a name creates the cable and returns end A; the second returns
    /// end B and forgets the name (a third call starts a new cable).
    ///
    /// # Errors
    /// Allocating the rings failed.
    pub fn open(name: &str) -> Result<Self, WireError> {
        let mut reg = loopback_registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = reg.remove(name) {
            return Ok(Self {
                name: name.into(),
                end_b: true,
                tx: c.b_to_a,
                rx: c.a_to_b,
            });
        }
        let bytes = ring_bytes(LOOP_SLOTS, LOOP_SLOT_BYTES);
        let alloc = || {
            DevMem::anon(bytes)
                .map(Arc::new)
                .map_err(|source| WireError::Shm {
                    name: name.into(),
                    path: PathBuf::from("(anonymous)"),
                    source,
                })
        };
        let a_to_b = FrameRing::new(alloc()?, 0, LOOP_SLOTS, LOOP_SLOT_BYTES);
        let b_to_a = FrameRing::new(alloc()?, 0, LOOP_SLOTS, LOOP_SLOT_BYTES);
        reg.insert(
            name.into(),
            PendingCable {
                a_to_b: a_to_b.clone(),
                b_to_a: b_to_a.clone(),
            },
        );
        Ok(Self {
            name: name.into(),
            end_b: false,
            tx: a_to_b,
            rx: b_to_a,
        })
    }
}

impl Wire for Loopback {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.tx.push(frame)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.rx.pop(buf)
    }
    fn describe(&self) -> String {
        format!(
            "loop:{} (end {})",
            self.name,
            if self.end_b { 'B' } else { 'A' }
        )
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
        assert_eq!(b.recv(&mut buf), Some(4));
        assert_eq!(&buf[..4], b"ping");
        assert!(b.send(b"pong!"));
        assert_eq!(a.recv(&mut buf), Some(5));
        assert_eq!(c.recv(&mut buf), None);
        assert!(a.describe().contains("end A") && b.describe().contains("end B"));
    }
}
