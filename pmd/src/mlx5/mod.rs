//! The mlx5 driver (ConnectX-4 … ConnectX-7): our own datapath over the raw queues
//! `mlx5dv_init_obj` describes. Being built ([09]): today the provider contract
//! ([`provider`]); the formats live in [`crate::hw::mlx5`].
#![deny(unsafe_code)]

pub mod provider;

pub use provider::{RawCq, RawRq, RawSq};
