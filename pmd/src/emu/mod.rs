//! The device model: the NIC's side of the very same queue memory, doorbells and completions
//! the drivers use on hardware, plus the wires its frames travel on. A provider: it
//! implements a driver's provider trait ([`mana::Model`] implements `mana::Provider`) and
//! names no port type. [`mlx5::Model`] serves the raw queues of the mlx5 driver.
//!
//! What every NIC model shares lives here: [`mr`] (the memory-key table every DMA goes
//! through), [`thread`] (how an engine gets a CPU, generic over [`thread::Nic`]: its own
//! thread, or inline on the threads that poll its queues, see [`EngineMode`]) and [`wire`].
#![deny(unsafe_code)]

pub mod mana;
pub mod mlx5;
pub mod mr;
pub mod testing;
pub mod thread;
pub mod wire;

pub use thread::EngineMode;
