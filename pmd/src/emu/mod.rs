//! The device model: the NIC's side of the very same queue memory, doorbells and completions
//! the drivers use on hardware, plus the wires its frames travel on. A provider: it
//! implements a driver's provider trait ([`mana::Model`] implements `mana::Provider`) and
//! names no port type.
#![deny(unsafe_code)]

pub mod mana;
pub mod mlx5;
pub mod mr;
pub mod testing;
pub mod thread;
pub mod wire;
