//! NIC-independent packet arithmetic shared by the drivers and the device models: Internet
//! checksums and TX checksum offload ([`csum`]), header parsing and RX classification
//! ([`parse`]), TCP segmentation offload ([`tso`]) and the Toeplitz RSS hash ([`toeplitz`]).
//! Device formats (CQE fields, hash type bits) stay with the device; this layer knows only
//! Ethernet, IP, TCP and UDP.
#![deny(unsafe_code)]

pub mod csum;
pub mod parse;
pub mod toeplitz;
pub mod tso;
