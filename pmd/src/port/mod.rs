//! The generic port API between apps and drivers.
#![deny(unsafe_code)]

pub mod config;
pub mod counters;
pub mod devargs;

pub use devargs::{DevargsError, PortKind, PortSpec, WireSpec};
