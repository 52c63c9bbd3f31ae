//! NIC-independent packet arithmetic shared by the drivers and the device models: Internet
//! checksums and TX checksum offload ([`csum`]), header parsing and RX classification
//! ([`parse`]), TCP segmentation offload ([`tso`]), the Toeplitz RSS hash ([`toeplitz`]) and
//! MAC addresses ([`mac`]). Device formats (CQE fields, hash type bits) stay with the device;
//! this layer knows only Ethernet, IP, TCP and UDP.
#![deny(unsafe_code)]

pub mod csum;
pub mod mac;
pub mod parse;
pub mod toeplitz;
pub mod tso;

pub use mac::{MacAddr, MacParseError};
