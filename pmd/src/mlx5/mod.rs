//! The mlx5 driver (ConnectX-4 … ConnectX-7): our own datapath over the raw queues
//! `mlx5dv_init_obj` describes. Being built ([09]): the provider contract ([`provider`]),
//! the CQ owner rule ([`cq`]) and the TX queue ([`txq`]: SEND/TSO, minimum inline, VLAN,
//! checksum flags, multi-segment, completion moderation) and the RX queue ([`rxq`]: cyclic RQ,
//! compressed sessions). Not yet: eMPW, MPRQ, error recovery, the driver and its port kinds. The formats live in [`crate::hw::mlx5`].
#![deny(unsafe_code)]

pub mod cq;
pub mod provider;
pub mod rxq;
pub mod txq;

pub use provider::{RawCq, RawRq, RawSq};

pub use rxq::{RxQueue, RxXstats};
pub use txq::{TxQueue, TxXstats};
