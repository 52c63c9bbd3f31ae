//! Test fixtures: a device model and the handle that drives it, for tests and benches that
//! act on the model directly (step it, inject faults, read the raw queues it handed out),
//! like virtio-queue's `MockSplitQueue`. Tests never reach the model through the port API:
//! they take the model here and open a port over it with `port::probe::mana`.
//!
//! ```
//! use pmd::emu::testing;
//! let (model, handle) = testing::mana("none", 0)?;
//! handle.pause();
//! assert_eq!(handle.step(), 0);
//! drop(model);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

use super::mana::{Model, ModelHandle, ModelSpec, OpenError};
use super::wire::WireSpec;

/// Errors of the fixtures.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// The wire string does not parse.
    #[error("{0}")]
    Wire(#[from] super::wire::WireSpecError),
    /// The model could not be opened.
    #[error("{0}")]
    Open(#[from] OpenError),
    /// The mlx5 model port could not be opened.
    #[error("{0}")]
    Mlx5(Box<dyn std::error::Error + Send + Sync>),
}

/// A MANA model on `wire` (`none`, `loop:NAME`, `shm:NAME`, `afpacket:IFACE`) as port
/// `port_id`, with its handle.
///
/// # Errors
/// A bad wire string, or a wire that cannot be opened.
pub fn mana(wire: &str, port_id: u16) -> Result<(Model, ModelHandle), FixtureError> {
    mana_with(&ModelSpec::new(wire.parse::<WireSpec>()?), port_id)
}

/// A MANA model as `spec` describes it, with its handle.
///
/// # Errors
/// The wire or capture cannot be opened.
pub fn mana_with(spec: &ModelSpec, port_id: u16) -> Result<(Model, ModelHandle), FixtureError> {
    let model = Model::open(spec, port_id)?;
    let handle = model.handle();
    Ok((model, handle))
}

/// An mlx5 model port on `wire` as port `port_id`, whose device needs `min_inline` bytes
/// inline (0: ConnectX-5 and later, 18: ConnectX-4), with its handle. Open a port over it
/// with `port::probe::mlx5`.
///
/// # Errors
/// A bad wire string, or a wire that cannot be opened.
pub fn mlx5(
    wire: &str,
    port_id: u16,
    min_inline: u16,
) -> Result<(super::mlx5::port::ModelPort, super::mlx5::ModelHandle), FixtureError> {
    let spec = wire.parse::<WireSpec>()?;
    let port = super::mlx5::port::ModelPort::open(
        &spec,
        None,
        None,
        port_id,
        min_inline,
        super::EngineMode::Thread,
    )
    .map_err(FixtureError::Mlx5)?;
    let handle = port.handle();
    Ok((port, handle))
}
