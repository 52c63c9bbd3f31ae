//! The MANA driver: our own datapath over the raw queues `manadv_init_obj` describes.
//!
//! * [`driver`]: the port's slow path ([`Driver`]).
//! * [`provider`]: the provider contract (what verbs, or the device model, hand the
//!   datapath) and the raw-queue descriptions.
//! * [`txq`]: TX burst: WQEs straight into the SQ ring, one doorbell per burst, completions.
//! * [`rxq`]: RX burst: CQ polling by owner bits, mbuf delivery, bulk refill, one doorbell.
//! * [`xstats`]: the queues' extended counters, each with its loss kind.
//!
//! A MANA port over any provider (the device model, rdma-core, or a test's own):
//! [`crate::port::probe::mana`]. See `DESIGN.md` beside this file for the queue state
//! machine, memory ordering and sources.
#![deny(unsafe_code)]

pub mod cq;
pub mod driver;
pub mod export;
pub mod provider;
pub mod rxq;
pub mod txq;
pub mod xstats;

pub use driver::{Driver, Options, MIN_DESC};
pub use provider::{
    PageAllocator, Provider, QueueAllocator, QueueOwner, RawRxQueue, RawTxQueue, SetupError,
    SharedFileAllocator,
};
pub use rxq::RxQueue;
pub use txq::TxQueue;
pub use xstats::Xstats;
