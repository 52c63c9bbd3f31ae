//! [`NoWire`]: a port with no cable attached.
#![deny(unsafe_code)]

use super::Wire;

/// A wire to nowhere: sends are dropped, nothing arrives.
#[derive(Debug)]
pub struct NoWire;

impl Wire for NoWire {
    fn send(&mut self, _frame: &[u8]) -> bool {
        false
    }
    /// Nothing was sent.
    fn flush(&mut self) {}
    fn recv(&mut self, _buf: &mut [u8]) -> Option<usize> {
        None
    }
    /// Always: a port with no wire is 'up', but the frames it sends go nowhere.
    fn peer_attached(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "none".into()
    }
}
