//! Port exclusivity on MANA (spec §2): a raw-packet queue cannot be created while the kernel's
//! netdev holds the vPort. Released kernels answer ENODEV, newer ones EBUSY; both mean "the
//! port is busy". What a port does then is its [`BusyPolicy`] (`busy=` in the devargs):
//!
//! * [`BusyPolicy::Fail`] (default): fail at once with an error that names the netdev, its
//!   master (the `hv_netvsc` interface on Azure) and the exact command that frees the port
//!   ([`busy`]).
//! * [`BusyPolicy::Wait`]: retry queue creation with back-off until the port is free or the
//!   timeout passes (a stop signal ends the wait early).
//! * [`BusyPolicy::Takeover`]: bring the master and the netdev down, remember that we did, and
//!   bring them up again when the port closes ([`NetdevGuard`]).
//!
//! A taken-over netdev must come back on every way out of the process, not only on a normal
//! close, so every take-over is also written into a process-wide registry ([`guard`]).
//! [`exit`] empties it on a second stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) and from a
//! panic hook before the process aborts. A process killed with SIGKILL cannot give anything
//! back; the warning logged at take-over time carries the command that does it by hand.
//!
//! Interfaces are brought down and up with the `SIOCSIFFLAGS` ioctl
//! ([`crate::sys::net::set_if_up`]), which needs CAP_NET_ADMIN; masters are read from
//! `<sysfs>/class/net/<netdev>/master` under [`crate::devices::sysfs_root`].
#![deny(unsafe_code)]

pub mod busy;
pub mod exit;
pub mod guard;

pub use busy::{is_port_busy_errno, Holder};
pub use guard::{master_of, restore_all, NetdevGuard, TakeoverError};

use std::fmt;
use std::time::Duration;

/// How long `busy=wait` waits when `busy-timeout=` is not given.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `busy-timeout=` a spec may ask for (one day).
pub const MAX_BUSY_TIMEOUT: Duration = Duration::from_secs(86_400);

/// What a port does when the kernel's netdev holds it (`busy=` in the devargs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BusyPolicy {
    /// `busy=fail`: report who holds the port and how to free it.
    #[default]
    Fail,
    /// `busy=wait[,busy-timeout=SECONDS]`: retry until the port is free, at most `timeout`.
    Wait {
        /// The longest wait.
        timeout: Duration,
    },
    /// `busy=takeover` (or `takeover=1`): bring the netdev and its master down now, up again
    /// when the port closes.
    Takeover,
}

impl BusyPolicy {
    /// The `busy=` value that names this policy.
    pub fn name(&self) -> &'static str {
        match self {
            BusyPolicy::Fail => "fail",
            BusyPolicy::Wait { .. } => "wait",
            BusyPolicy::Takeover => "takeover",
        }
    }
}

impl fmt::Display for BusyPolicy {
    /// The devargs form: `busy=fail`, `busy=wait,busy-timeout=2.5`, `busy=takeover`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "busy={}", self.name())?;
        if let BusyPolicy::Wait { timeout } = self {
            write!(f, ",busy-timeout={}", Seconds(*timeout))?;
        }
        Ok(())
    }
}

/// A duration printed as seconds with at most millisecond precision and no trailing zeros
/// (`30`, `2.5`, `0.125`): the form `busy-timeout=` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(pub Duration);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        let (s, frac) = (ms / 1000, ms % 1000);
        if frac == 0 {
            write!(f, "{s}")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{s}.{}", digits.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_print_as_devargs() {
        assert_eq!(BusyPolicy::default().to_string(), "busy=fail");
        assert_eq!(BusyPolicy::Takeover.to_string(), "busy=takeover");
        let w = BusyPolicy::Wait {
            timeout: Duration::from_millis(2500),
        };
        assert_eq!(w.to_string(), "busy=wait,busy-timeout=2.5");
        assert_eq!(Seconds(Duration::from_secs(30)).to_string(), "30");
        assert_eq!(Seconds(Duration::from_millis(125)).to_string(), "0.125");
        assert_eq!(Seconds(Duration::from_millis(1010)).to_string(), "1.01");
    }
}
