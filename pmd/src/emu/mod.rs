//! The device model: the NIC's side of the very same queue memory, doorbells and completions
//! the drivers use on hardware, plus the wires its frames travel on.
#![deny(unsafe_code)]

pub mod mana;
pub mod wire;
