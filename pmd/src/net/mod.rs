//! Packet arithmetic shared by the drivers and the device model: Internet checksums, the
//! Toeplitz RSS hash, MAC addresses. Names no NIC.
#![deny(unsafe_code)]

pub mod csum;
pub mod mac;
pub mod toeplitz;

pub use mac::{MacAddr, MacParseError};
