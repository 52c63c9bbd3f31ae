//! Taking netdevs down and giving them back: [`NetdevGuard`] for one port, and the
//! process-wide registry of every netdev this process has taken down and not yet given back,
//! which [`restore_all`] empties on the exit paths that skip destructors (a second stop
//! signal, a panic that aborts).
//!
//! The registry is the one record of what is down: a guard gives back only the entries still
//! registered, so a netdev brought up by [`restore_all`] is never touched again by its guard.
//! Bringing an interface down and recording it happen under the registry's lock, so an exit
//! path that runs in between cannot miss it.
#![deny(unsafe_code)]

use super::Holder;
use crate::sys::net::{if_flags, set_if_up, IFF_UP};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

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

/// One netdev this process brought down.
#[derive(Debug)]
struct Entry {
    token: u64,
    netdev: String,
}

struct Registry {
    next_token: u64,
    /// In the order they were brought down.
    down: Vec<Entry>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next_token: 1,
    down: Vec::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// The netdevs this process has taken down and not given back yet, in the order they went
/// down.
pub fn taken_now() -> Vec<String> {
    registry().down.iter().map(|e| e.netdev.clone()).collect()
}

fn bring_up(netdev: &str, why: &str) -> Result<(), TakeoverError> {
    match set_if_up(netdev, true) {
        Ok(()) => {
            tracing::info!(target: "pmd::port", netdev, "port given back ({why}): netdev up again");
            Ok(())
        }
        Err(source) => Err(TakeoverError {
            netdev: netdev.to_string(),
            action: "up",
            source,
        }),
    }
}

/// Brings every netdev in the registry back up, the last taken first, and empties it; returns
/// how many came up. `why` goes into the log ("signal SIGTERM", "panic").
///
/// Safe to call from any thread at any time, also while guards exist (they then find nothing
/// left to give back). Failures are logged (with the command to run by hand) and written to
/// stderr, because the process is usually on its way out. On a real MANA port, bringing the
/// netdev up fails with EBUSY while the dying process still has raw queues; the log says so.
pub fn restore_all(why: &str) -> usize {
    restore_with(registry(), why)
}

/// As [`restore_all`], but gives up after `patience` when the registry is locked (a panic
/// hook may run on the thread that holds it); returns `None` then.
pub fn try_restore_all(why: &str, patience: Duration) -> Option<usize> {
    let t0 = Instant::now();
    loop {
        match REGISTRY.try_lock() {
            Ok(g) => return Some(restore_with(g, why)),
            Err(TryLockError::Poisoned(p)) => return Some(restore_with(p.into_inner(), why)),
            Err(TryLockError::WouldBlock) if t0.elapsed() < patience => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

fn restore_with(mut reg: MutexGuard<'_, Registry>, why: &str) -> usize {
    let mut n = 0;
    while let Some(e) = reg.down.pop() {
        match bring_up(&e.netdev, why) {
            Ok(()) => n += 1,
            Err(err) => {
                tracing::error!(target: "pmd::port", "giving the port back ({why}): {err}; run `ip link set {} up` by hand", e.netdev);
                eprintln!(
                    "pmd: could not give {} back to the kernel ({why}): {err}; run `ip link set {} up`",
                    e.netdev, e.netdev
                );
            }
        }
    }
    n
}

/// Netdevs one port brought down; dropping it (or [`NetdevGuard::give_back`]) brings them back
/// up, unless an exit path already did.
#[derive(Debug)]
pub struct NetdevGuard {
    /// Registry tokens and names, in the order they were brought down.
    taken: Vec<(u64, String)>,
}

impl NetdevGuard {
    /// Brings `netdev` (and its master, first) down if they are up, the master read under
    /// [`crate::devices::sysfs_root`]. Interfaces already down are left alone and not given
    /// back later.
    ///
    /// # Errors
    /// The first interface that could not be brought down; any taken before are given back.
    pub fn take_over(netdev: &str) -> Result<Self, TakeoverError> {
        Self::take_over_holder(&Holder::find(netdev))
    }

    /// As [`NetdevGuard::take_over`], for a holder already looked up.
    ///
    /// # Errors
    /// As [`NetdevGuard::take_over`].
    pub fn take_over_holder(holder: &Holder) -> Result<Self, TakeoverError> {
        super::exit::install_panic_hook();
        if !super::exit::signals_guarded() {
            tracing::warn!(target: "pmd::port", "no stop-signal handler is installed (pmd::lcore::StopFlag::on_signals or pmd::takeover::exit::guard_signals): a SIGINT or SIGTERM now would leave the netdev down");
        }
        let mut guard = NetdevGuard { taken: Vec::new() };
        for n in holder.down_order() {
            let down = |source| TakeoverError {
                netdev: n.to_string(),
                action: "down",
                source,
            };
            // Down and registered under one lock: an exit path never misses this interface.
            let mut reg = registry();
            let up = if_flags(n).map_err(down)? & IFF_UP != 0;
            if !up {
                continue;
            }
            set_if_up(n, false).map_err(down)?;
            let token = reg.next_token;
            reg.next_token += 1;
            reg.down.push(Entry {
                token,
                netdev: n.to_string(),
            });
            drop(reg);
            tracing::warn!(target: "pmd::port", netdev = n, "took the port over: netdev brought down; it comes back up when the port closes (by hand: `{}`)", holder.restore_command());
            guard.taken.push((token, n.to_string()));
        }
        Ok(guard)
    }

    /// The interfaces this guard brought down, in order.
    pub fn taken(&self) -> Vec<&str> {
        self.taken.iter().map(|(_, n)| n.as_str()).collect()
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
        let mut reg = registry();
        while let Some((token, n)) = self.taken.pop() {
            // Still ours to give back? An exit path may have done it already.
            let Some(at) = reg.down.iter().position(|e| e.token == token) else {
                continue;
            };
            reg.down.remove(at);
            if let Err(e) = bring_up(&n, "port closed") {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for NetdevGuard {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::error!(target: "pmd::port", "giving the port back: {e}; run `ip link set {} up` by hand", e.netdev);
        }
    }
}
