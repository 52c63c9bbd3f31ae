//! [`DeviceKick`]: the device's work for one queue, done on the thread that polls the queue.
//!
//! A NIC works on its own: it notices a doorbell, fetches WQEs, sends, receives, writes
//! completions, while the driver's core does something else. A device that is software (a
//! device model) needs a CPU to do that work. It can have its own thread, or it can borrow
//! the one that polls the queue: right after the driver rang a TX doorbell, and right before
//! the driver looks at an RX completion queue, the driver calls the queue's kick and the
//! device does, there and then, what a NIC would have done by itself meanwhile. A process then
//! needs no thread beyond its polling cores.
//!
//! The kick is device-neutral and optional: a provider may put one into the raw queue
//! descriptions it hands a driver (`None` on hardware, where the NIC needs no CPU). What the
//! device does in a kick it does only through the queue's memory, doorbells and completions,
//! exactly as it would on its own; the driver learns nothing new from it and does nothing
//! differently, except that it calls it.
//!
//! Where a driver calls it (each driver's datapath, both MANA and mlx5):
//!
//! * TX queue: at the start of every `tx_burst` (before reclaiming completions, so work the
//!   device deferred is done), and after ringing the doorbell.
//! * RX queue: at the start of every `rx_burst`, before polling the completion queue.
//!
//! A kick never blocks, allocates or logs, and costs a few nanoseconds when there is nothing
//! to do. It may do nothing at all (another thread holds the device, or the device is paused
//! for a test); the next burst kicks again.
#![deny(unsafe_code)]

use std::sync::Arc;

/// The device's work for one queue, run on the calling (polling) thread. See the module docs.
pub trait DeviceKick: Send + Sync {
    /// Does the device's pending work for the queue this kick belongs to: for a TX queue,
    /// consume the posted WQEs (send, complete); for an RX queue, take arrived frames into the
    /// posted buffers and complete them.
    fn kick(&self);
}

/// A queue's kick as a raw queue description carries it: `None` on hardware.
pub type Kick = Option<Arc<dyn DeviceKick>>;

/// Calls `k`'s kick, if there is one.
#[inline]
pub fn run(k: &Kick) {
    if let Some(k) = k {
        k.kick();
    }
}
