//! The mlx5 driver (ConnectX-4 … ConnectX-7): our own datapath over the raw queues
//! `mlx5dv_init_obj` describes. Work in progress: the provider contract ([`provider`]),
//! the CQ owner rule ([`cq`]) and the TX queue ([`txq`]: SEND/TSO, minimum inline, VLAN,
//! checksum flags, multi-segment, eMPW, completion moderation) and the RX queue ([`rxq`]: cyclic RQ,
//! compressed sessions). The [`Driver`] over a [`Provider`]. Not yet: a provider (device model or verbs), the port
//! kinds, MPRQ, error recovery. The formats live in [`crate::hw::mlx5`]; `DESIGN.md` beside
//! this file has the queue layout, memory ordering and sources.
#![deny(unsafe_code)]

pub mod cq;
pub mod driver;
pub mod provider;
pub mod rxq;
pub mod txq;

pub use driver::{Driver, Provider, SetupError};
pub use provider::{RawCq, RawRq, RawSq};

pub use rxq::{RxQueue, RxXstats};
pub use txq::{TxQueue, TxXstats};
