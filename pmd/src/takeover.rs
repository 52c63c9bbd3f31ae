//! Port exclusivity: on MANA, a raw-packet queue cannot be created while the kernel's netdev
//! holds the port (the kernel answers EBUSY, or ENODEV on released kernels; spec §2). The
//! driver says which netdev and what to do, and, when asked (`takeover=1`), takes the port
//! over: it brings the netdev down (first its `hv_netvsc` master on Azure, which would
//! otherwise reopen it), and gives the port back, bringing them up again, when the port
//! closes. Interfaces that were already down are left alone.
#![deny(unsafe_code)]

use crate::sys::net::{if_flags, set_if_up, IFF_UP};
use std::path::Path;

/// Taking a netdev down or up failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot bring netdev {netdev} {action}: {source} (needs CAP_NET_ADMIN, e.g. root)")]
pub struct TakeoverError {
    /// The interface.
    pub netdev: String,
    /// "down" or "up".
    pub action: &'static str,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// The master of a netdev (on Azure, the `hv_netvsc` synthetic interface of a MANA VF), from
/// `<sysfs>/class/net/<netdev>/master`.
pub fn master_of(sysfs_root: &Path, netdev: &str) -> Option<String> {
    let link = std::fs::read_link(sysfs_root.join("class/net").join(netdev).join("master")).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Netdevs this port brought down; dropping it brings them back up.
#[derive(Debug)]
pub struct NetdevGuard {
    /// In the order they were brought down.
    taken: Vec<String>,
}

impl NetdevGuard {
    /// Brings `netdev` (and its master, first) down if they are up.
    ///
    /// # Errors
    /// The first interface that could not be brought down; any taken before are given back.
    pub fn take_over(netdev: &str) -> Result<Self, TakeoverError> {
        let mut order: Vec<String> =
            master_of(Path::new(crate::devices::DEFAULT_SYSFS_ROOT), netdev)
                .into_iter()
                .collect();
        order.push(netdev.to_string());
        let mut guard = NetdevGuard { taken: Vec::new() };
        for n in order {
            let up = if_flags(&n).map_err(|source| TakeoverError {
                netdev: n.clone(),
                action: "down",
                source,
            })? & IFF_UP
                != 0;
            if up {
                set_if_up(&n, false).map_err(|source| TakeoverError {
                    netdev: n.clone(),
                    action: "down",
                    source,
                })?;
                tracing::warn!(target: "pmd::port", netdev = %n, "took the port over: netdev brought down; it comes back up when the port closes");
                guard.taken.push(n);
            }
        }
        Ok(guard)
    }

    /// The interfaces brought down, in order.
    pub fn taken(&self) -> &[String] {
        &self.taken
    }

    /// Brings the interfaces back up (the netdev first, then its master).
    ///
    /// # Errors
    /// The first one that would not come up (the others are still tried).
    pub fn give_back(mut self) -> Result<(), TakeoverError> {
        self.restore()
    }

    fn restore(&mut self) -> Result<(), TakeoverError> {
        let mut first_err = None;
        while let Some(n) = self.taken.pop() {
            match set_if_up(&n, true) {
                Ok(()) => {
                    tracing::info!(target: "pmd::port", netdev = %n, "port given back: netdev up again")
                }
                Err(source) => {
                    first_err.get_or_insert(TakeoverError {
                        netdev: n,
                        action: "up",
                        source,
                    });
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for NetdevGuard {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::error!(target: "pmd::port", "giving the port back: {e}");
        }
    }
}
