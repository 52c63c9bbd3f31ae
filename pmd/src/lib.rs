//! Poll-mode drivers for Azure MANA and NVIDIA mlx5 NICs over rdma-core direct verbs.
//!
//! ```text
//! apps (l2fwd, pktgen, pmd-devices)
//!   pmd::devices   discovery: RDMA devices, providers, ports, netdevs (sysfs)
//!   pmd::sys       the only FFI: verbs (rdma-sys) + manadv / mlx5dv (bindgen)
//!   pmd::log       tracing set-up (PMD_LOG)
//! mempool          hugepage regions, object pool, Mbuf
//! ```
//!
//! List the devices of this machine (real ones, if any) and the always-present device model:
//!
//! ```
//! let devices = pmd::devices::list(std::path::Path::new(pmd::devices::DEFAULT_SYSFS_ROOT))?;
//! print!("{}", pmd::devices::report(&devices));
//! # Ok::<(), pmd::devices::DeviceError>(())
//! ```
#![deny(unsafe_code)]

pub mod devices;
#[cfg(feature = "emu")]
pub mod emu;
pub mod hw;
pub mod lcore;
pub mod log;
pub mod mana;
pub mod net;
pub mod null;
pub mod port;
pub mod ring;
pub mod sys;

pub use devices::MacAddr;
