//! The mlx5 driver (ConnectX-4 … ConnectX-7): our own datapath over the raw queues
//! `mlx5dv_init_obj` describes.
//!
//! * [`provider`]: the provider contract ([`Provider`], [`SetupError`]) and the raw queue
//!   descriptions a provider hands out, each with the [`QueueState`] machine the queue's
//!   error recovery moves it through.
//! * [`driver`]: the port driver over a [`Provider`] (the device model for `emu-mlx5`
//!   ports, rdma-core for `mlx5:` ports), which asks for its RX queues with one
//!   [`RxQueueRequest`] (cyclic or striding, CQE compression).
//! * [`xstats`]: the queues' extended counters, each with its loss kind.
//! * [`txq`]: SEND/TSO with the device's minimum inline header, VLAN, checksum flags,
//!   multi-segment, eMPW, completion moderation.
//! * [`rxq`]: cyclic RQ (one mbuf per WQE). [`rxq_mprq`]: multi-packet (striding) RQ, each
//!   packet copied out of its strides into an mbuf ([`Options::mprq`]). Both read their
//!   completions through one shared reader (`rx_cq`): normal CQEs and compressed sessions
//!   (HASH or CSUM_STRIDX minis, [`Options::cqe_compression`]). [`cq`]: the one-bit owner
//!   rule.
//! * [`export`]: queue pairs another process polls (a secondary, `pmd::mp`): described by
//!   the primary's port, rings and records in shared files, the UAR register mapped from
//!   the device's command descriptor.
//! * Error recovery, as DPDK's: an error CQE is counted and the queue goes through RESET
//!   and back (SQ to RTS, WQ to RDY) in the burst that finds it, its CQ drained and its
//!   counters restarted at 0 like the device's; every packet lost on the way is counted.
//!   A failed state change leaves the queue down (bursts return 0) with a retry every
//!   1024 bursts. Both RX queue kinds recover the same way.
//!
//! The formats live in [`crate::hw::mlx5`]; `DESIGN.md` beside this file has the queue
//! layout, memory ordering and sources.
#![deny(unsafe_code)]

pub mod cq;
pub mod driver;
pub mod export;
pub mod provider;
mod rx_cq;
pub mod rxq;
pub mod rxq_mprq;
pub mod txq;
pub mod xstats;

pub use driver::{check_mprq, Driver, Options};
pub use provider::{
    Mprq, MprqCaps, Provider, QueueState, RawCq, RawRq, RawSq, RxQueueRequest, SetupError,
};

pub use rxq::RxQueue;
pub use txq::TxQueue;
pub use xstats::{RxXstats, TxXstats};
