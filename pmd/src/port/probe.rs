//! The composition root: the one place that names port kinds. It turns a [`PortSpec`] into a
//! driver over its provider (like ixy's single probe), so neither the port layer, nor the
//! drivers, nor the providers know each other's kinds.
//!
//! A MANA port over any provider, the same way the hardware (verbs) provider is used:
//!
//! ```
//! use pmd::{emu::testing, mana, port::{probe, PortConfig}};
//! let (model, handle) = testing::mana("none", 0)?;
//! let mut port = probe::mana(0, "my-model".into(), Box::new(model), mana::Options::default());
//! let pool = mempool::MbufPool::new(mempool::MbufPoolConfig::new("doc-probe", 1024))?;
//! port.configure(&PortConfig::default().with_ring_sizes(64, 64), &pool)?;
//! assert_eq!(handle.tx_queues().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

use super::devargs::{PortKind, PortSpec};
use super::Port;
use crate::ethdev::{PortDriver, PortError};

/// Builds the driver (and its provider) for `spec`, as port `id`.
///
/// # Errors
/// [`PortError::NoDevice`] when nothing matches, or the provider's open error.
pub(crate) fn probe(id: u16, spec: &PortSpec) -> Result<Box<dyn PortDriver>, PortError> {
    match &spec.kind {
        PortKind::Null { size, mac } => Ok(Box::new(crate::null::Driver::new(*size, *mac, id))),
        #[cfg(feature = "emu")]
        PortKind::EmuMana {
            wire,
            mac,
            engine,
            coalesce,
            faults,
        } => {
            let model_spec = crate::emu::mana::ModelSpec {
                wire: wire.clone(),
                mac: *mac,
                pcap: spec.pcap.as_ref().map(std::path::PathBuf::from),
                netdev: spec.netdev.clone(),
                vp_offset: None,
                engine: emu_engine(*engine),
                rx_coalesce: *coalesce,
            };
            let model =
                crate::emu::mana::Model::open(&model_spec, id).map_err(|e| PortError::Setup {
                    what: spec.to_string(),
                    source: Box::new(e),
                })?;
            cycle_faults(spec, faults.as_ref(), |p| model.handle().cycle_faults(p))?;
            Ok(Box::new(crate::mana::Driver::new(
                Box::new(model),
                mana_options(spec),
            )))
        }
        #[cfg(feature = "emu")]
        PortKind::EmuMlx5 {
            wire,
            mac,
            inline,
            rx,
            engine,
            faults,
        } => {
            let provider = crate::emu::mlx5::port::ModelPort::open(
                wire,
                *mac,
                spec.pcap.as_deref().map(std::path::Path::new),
                id,
                *inline,
                emu_engine(*engine),
            )
            .map_err(|source| PortError::Setup {
                what: spec.to_string(),
                source,
            })?;
            cycle_faults(spec, faults.as_ref(), |p| provider.handle().cycle_faults(p))?;
            Ok(Box::new(crate::mlx5::Driver::with_options(
                Box::new(provider),
                *rx,
            )))
        }
        #[cfg(feature = "verbs")]
        PortKind::Mana { mac, dev, port } => {
            let sel = crate::devices::PortSelector {
                dev: dev.clone(),
                port: *port,
                mac: *mac,
                netdev: spec.netdev.clone(),
            };
            let provider = crate::verbs::mana::ManaProvider::open(&sel).map_err(|e| match e {
                crate::mana::SetupError::NoPort(why) => PortError::NoDevice {
                    spec: spec.to_string(),
                    why,
                },
                other => PortError::Setup {
                    what: format!("opening {spec}"),
                    source: Box::new(other),
                },
            })?;
            Ok(Box::new(crate::mana::Driver::new(
                Box::new(provider),
                mana_options(spec),
            )))
        }
        #[cfg(feature = "verbs")]
        PortKind::Mlx5 {
            mac,
            dev,
            port,
            inline,
            cqe_comp,
        } => {
            let sel = crate::devices::PortSelector {
                dev: dev.clone(),
                port: *port,
                mac: *mac,
                netdev: spec.netdev.clone(),
            };
            let opts = crate::verbs::mlx5::Options {
                min_inline: *inline,
            };
            let provider =
                crate::verbs::mlx5::Mlx5Provider::open(&sel, opts).map_err(|e| match e {
                    crate::mlx5::SetupError::NoPort(why) => PortError::NoDevice {
                        spec: spec.to_string(),
                        why,
                    },
                    other => PortError::Setup {
                        what: format!("opening {spec}"),
                        source: Box::new(other),
                    },
                })?;
            // The driver asks for compressed CQEs as cqe-comp says; the provider grants them
            // where the device has them.
            let rx = crate::mlx5::Options {
                mprq: None,
                cqe_compression: *cqe_comp,
            };
            Ok(Box::new(crate::mlx5::Driver::with_options(
                Box::new(provider),
                rx,
            )))
        }
        #[cfg(not(feature = "verbs"))]
        PortKind::Mana { .. } | PortKind::Mlx5 { .. } => Err(hardware_unavailable(spec)),
    }
}

/// A MANA port over `provider` (the device model, rdma-core, or a test's own), as port `id`
/// named `name`.
pub fn mana(
    id: u16,
    name: String,
    provider: Box<dyn crate::mana::Provider>,
    opts: crate::mana::Options,
) -> Port {
    Port::from_driver(id, name, Box::new(crate::mana::Driver::new(provider, opts)))
}

/// An mlx5 port over `provider` (the device model, or a test's own), as port `id` named
/// `name`, with the driver's default options (cyclic RQs, compressed CQEs).
pub fn mlx5(id: u16, name: String, provider: Box<dyn crate::mlx5::Provider>) -> Port {
    mlx5_with(id, name, provider, crate::mlx5::Options::default())
}

/// [`mlx5`] with the driver's receive options `opts` (multi-packet RQs, CQE compression).
pub fn mlx5_with(
    id: u16,
    name: String,
    provider: Box<dyn crate::mlx5::Provider>,
    opts: crate::mlx5::Options,
) -> Port {
    Port::from_driver(
        id,
        name,
        Box::new(crate::mlx5::Driver::with_options(provider, opts)),
    )
}

/// The engine of a device-model port: what its devargs say, else `PMD_EMU_ENGINE`, else
/// inline. Ports from devargs are the apps' and the demo's: inline needs no thread beyond
/// their polling cores, which on a small machine is what lets the model keep up (see
/// `emu::thread`).
#[cfg(feature = "emu")]
fn emu_engine(given: Option<crate::emu::EngineMode>) -> crate::emu::EngineMode {
    given.unwrap_or_else(|| crate::emu::EngineMode::from_env_or(crate::emu::EngineMode::Inline))
}

#[cfg(any(feature = "emu", feature = "verbs"))]
fn mana_options(spec: &PortSpec) -> crate::mana::Options {
    crate::mana::Options { busy: spec.busy }
}

#[cfg(not(feature = "verbs"))]
fn hardware_unavailable(spec: &PortSpec) -> PortError {
    use crate::devices::{self, Family};
    let root = std::path::Path::new(devices::DEFAULT_SYSFS_ROOT);
    let devs = devices::list(root).unwrap_or_default();
    let (want, name) = match spec.kind {
        PortKind::Mana { .. } => (Family::Mana, "MANA"),
        _ => (Family::Mlx5, "mlx5"),
    };
    let found: Vec<_> = devs
        .iter()
        .filter(|d| d.family == want)
        .map(|d| d.name.clone())
        .collect();
    let why = if found.is_empty() {
        format!(
            "no {name} RDMA device on this machine (run pmd-devices to see what there is); \
             without hardware use the device model, e.g. --port emu-mana:wire=shm:demo0"
        )
    } else {
        format!(
            "found {} but the hardware datapath over verbs is not available in this build yet; \
             the device model (emu-mana) runs the same datapath",
            found.join(", ")
        )
    };
    PortError::NoDevice {
        spec: spec.to_string(),
        why,
    }
}

#[cfg(feature = "emu")]
/// Starts a device model's fault cycle (`faults=`), if the spec asks for one.
fn cycle_faults(
    spec: &PortSpec,
    plan: Option<&crate::emu::faults::FaultPlan>,
    start: impl FnOnce(
        Option<&crate::emu::faults::FaultPlan>,
    ) -> Result<(), crate::emu::faults::FaultKind>,
) -> Result<(), PortError> {
    if plan.is_none() {
        return Ok(());
    }
    start(plan).map_err(|kind| PortError::Setup {
        what: spec.to_string(),
        source: format!("the model has no fault '{kind}'").into(),
    })
}

/// The driver queues of an imported pair: (RX, TX).
pub(crate) type ImportedPair = (
    Box<dyn crate::ethdev::RxBurst>,
    Box<dyn crate::ethdev::TxBurst>,
);

/// Builds, in this process, the queues of a queue pair another process exported
/// ([`crate::ethdev::export`]), with the driver that made them.
///
/// # Errors
/// [`PortError::Setup`]: a driver that cannot import, or what is wrong with the description.
pub(crate) fn import_pair(
    e: &crate::ethdev::QueueExport,
    device: Option<std::os::fd::BorrowedFd<'_>>,
    pool: &std::sync::Arc<mempool::MbufPool>,
    rx: std::sync::Arc<crate::ethdev::Counters>,
    tx: std::sync::Arc<crate::ethdev::Counters>,
    parked: std::sync::Arc<crate::ethdev::Parked>,
    claim: impl FnOnce() -> Result<(), String>,
) -> Result<ImportedPair, PortError> {
    let fail = |why: String| PortError::Setup {
        what: format!(
            "attaching to port {} queue pair {} of process {}",
            e.port, e.queue, e.pid
        ),
        source: why.into(),
    };
    match e.driver.as_str() {
        "mana" => {
            let (r, t) = crate::mana::export::import(e, device, pool, rx, tx, parked, claim)
                .map_err(fail)?;
            Ok((Box::new(r), Box::new(t)))
        }
        "mlx5" => {
            let (r, t) = crate::mlx5::export::import(e, device, pool, rx, tx, parked, claim)
                .map_err(fail)?;
            Ok((Box::new(r), Box::new(t)))
        }
        other => Err(fail(format!("no driver here imports {other} queues"))),
    }
}
