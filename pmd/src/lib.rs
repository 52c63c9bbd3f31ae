//! Poll-mode drivers for Azure MANA and NVIDIA mlx5 NICs over rdma-core direct verbs.
//!
//! The driver owns the datapath: it writes work-queue entries into queue memory, rings
//! doorbells and parses completions itself. The same datapath code runs on a real NIC and on
//! the device model ([`emu`]), which plays the NIC's side of the very same queue memory.
//!
//! ```text
//! apps (l2fwd, pktgen, pmd-devices, pmd-telemetry, pmd-dumpcap), examples, bench, tests
//!   port        Port, RxQueue/TxQueue (one indirect call per burst), PortSpec devargs,
//!     probe     the composition root: the ONE place that names kinds and pairs a driver
//!               with a provider
//!   drivers     mana, mlx5 (each: its own Provider trait + raw queues), null
//!   providers   emu::mana, emu::mlx5 (device models + wires, feature `emu`);
//!               verbs::mana, verbs::mlx5 (rdma-core: manadv/mlx5dv, feature `verbs`)
//!   ethdev      the contract: PortDriver, RxBurst/TxBurst, Burst, Counters, Caps,
//!               PortConfig, PortError; names no driver
//!   capture     live capture: a per-port switch the queue handles watch (one relaxed
//!               load per burst when off), shared-memory rings, classic BPF, and the
//!               control socket pmd-dumpcap talks to
//!   lcore       pinned worker threads, main core, stop on SIGINT/SIGTERM/SIGHUP/SIGQUIT
//!   takeover    port exclusivity: busy=fail|wait|takeover, the netdevs taken down and
//!               given back on every way out (close, signals, panic)
//!   telemetry   DPDK telemetry v2 socket: answers about ports, pool and app from its
//!               own threads (dpdk-telemetry.py works unchanged)
//!   devices     discovery: RDMA devices, families, ports, netdevs (sysfs)
//!   ring        queue mechanics shared by every NIC: wrap copy, work queue, owner-bit CQ
//!   hw          hardware formats as byte views (MANA GDMA), pinned by golden vectors
//!   net         NIC-independent packet arithmetic: checksums, Toeplitz, MAC addresses
//!   sys         raw memory and the system: DevMem, barriers, doorbells, event fds,
//!               netlink; rdma-core's symbols (feature `verbs`), whose RAII handles live
//!               in `verbs` (the other module with unsafe code)
//! mempool       hugepage regions, object pool, Mbuf, per-thread mbuf caches (lcache)
//! ```
//!
//! Arrows point down only; `tests/layering.rs` reads every module's `use crate::` lines and
//! fails when one points the wrong way.
//!
//! Two device-model ports on an in-process cable, one frame across:
//!
//! ```
//! use mempool::lcache;
//! use pmd::port::{Burst, Port, PortConfig};
//! let pool = mempool::MbufPool::new(mempool::MbufPoolConfig::new("doc-lib", 1024))?;
//! let cfg = PortConfig::default().with_ring_sizes(64, 64);
//! let mut a = Port::open(0, &"emu-mana:wire=loop:doc-lib".parse()?)?;
//! let mut b = Port::open(1, &"emu-mana:wire=loop:doc-lib".parse()?)?;
//! a.configure(&cfg, &pool)?;
//! b.configure(&cfg, &pool)?;
//! let (mut tx, mut rx) = (a.tx_queue(0)?, b.rx_queue(0)?);
//! a.start()?;
//! b.start()?;
//! let mut m = lcache::alloc(&pool).unwrap(); // from this thread's cache
//! m.extend_from_slice(&[0xff; 60])?;
//! let mut out = Burst::with_capacity(1);
//! out.push(m).unwrap();
//! assert_eq!(tx.tx_burst(&mut out), 1);
//! let mut got = Burst::with_capacity(8);
//! let t0 = std::time::Instant::now();
//! while rx.rx_burst(&mut got) == 0 && t0.elapsed().as_secs() < 5 {}
//! assert_eq!(got.as_slice()[0].data(), &[0xff; 60][..]);
//! got.clear(); // dropped mbufs go back to this thread's cache
//! # Ok::<(), Box<dyn std::error::Error>>(())
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

/// Datapath trace: a `tracing::trace!` that exists only with the `dp-trace` feature, so the
/// burst functions log nothing (and cost nothing) in normal builds (DPDK's `DP_LOG`).
#[macro_export]
macro_rules! dp_trace {
    ($($arg:tt)*) => {
        #[cfg(feature = "dp-trace")]
        {
            tracing::trace!(target: "pmd::dp", $($arg)*);
        }
    };
}

pub mod capture;
pub mod devices;
#[cfg(feature = "emu")]
pub mod emu;
pub mod ethdev;
pub mod hw;
pub mod lcore;
pub mod log;
pub mod mana;
pub mod mlx5;
pub mod mp;
pub mod net;
pub mod null;
pub mod port;
pub mod ring;
pub mod sys;
pub mod takeover;
pub mod telemetry;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use net::MacAddr;
