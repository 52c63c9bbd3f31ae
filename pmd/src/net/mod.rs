//! Packet arithmetic shared by the drivers and the device model: Internet checksums and the
//! Toeplitz RSS hash.
#![deny(unsafe_code)]

pub mod csum;
pub mod toeplitz;
