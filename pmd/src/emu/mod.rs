//! The device model: the NIC's side of the very same queue memory, doorbells and completions
//! the drivers use on hardware, plus the wires its frames travel on. A provider: it
//! implements a driver's provider trait ([`mana::Model`] implements `mana::Provider`) and
//! names no port type. [`mlx5::Model`] serves the raw queues of the mlx5 driver.
//!
//! What every NIC model shares lives here: [`mr`] (the memory-key table every DMA goes
//! through), [`thread`] (an engine on its own thread, generic over [`thread::Nic`]) and
//! [`wire`].
#![deny(unsafe_code)]

pub mod mana;
pub mod mlx5;
pub mod mr;
pub mod testing;
pub mod thread;
pub mod wire;
