//! What a "port busy" error says: who holds the port (the netdev and its master), the exact
//! command that frees it, and the `busy=` policies that would have handled it.
//!
//! Providers build the error through `mana::SetupError::port_busy`, which uses [`Holder`] and
//! [`hint`]; a raw-QP creation errno is classified with [`is_port_busy_errno`].
#![deny(unsafe_code)]

use std::path::Path;

/// Whether an errno from raw-packet QP creation means "someone else holds the vPort" (§2.1):
/// EBUSY on newer kernels (and in rdma-core's `manadv(7)`), ENODEV on released kernels, whose
/// `mana_ib_create_qp_raw` replaces every vPort-configuration failure with ENODEV.
pub fn is_port_busy_errno(errno: i32) -> bool {
    errno == libc::EBUSY || errno == libc::ENODEV
}

/// The errno's symbolic name, for messages (`EBUSY`, `ENODEV`, else `errno N`).
pub fn errno_name(errno: i32) -> String {
    match errno {
        libc::EBUSY => "EBUSY".into(),
        libc::ENODEV => "ENODEV".into(),
        n => format!("errno {n}"),
    }
}

/// The kernel interfaces that hold a port: its netdev and, when it has one, the netdev's
/// master (on Azure the `hv_netvsc` synthetic interface, which reopens its VF while it is
/// itself up, so it must go down first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The port's netdev, e.g. `enP30832s1`.
    pub netdev: String,
    /// Its master, e.g. `eth1`, read from `<sysfs>/class/net/<netdev>/master`.
    pub master: Option<String>,
}

impl Holder {
    /// The holder of `netdev`, its master read under `sysfs_root`.
    pub fn find_in(sysfs_root: &Path, netdev: &str) -> Self {
        Self {
            netdev: netdev.to_string(),
            master: super::guard::master_of(sysfs_root, netdev),
        }
    }

    /// The holder of `netdev`, its master read under [`crate::devices::sysfs_root`].
    pub fn find(netdev: &str) -> Self {
        Self::find_in(&crate::devices::sysfs_root(), netdev)
    }

    /// The interfaces in the order a take-over brings them down: the master first.
    pub fn down_order(&self) -> Vec<&str> {
        self.master
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.netdev.as_str()))
            .collect()
    }

    /// Who holds the port, for messages: `kernel netdev eth1` or
    /// `kernel netdev enP1s1 (master eth1)`.
    pub fn describe(&self) -> String {
        match &self.master {
            Some(m) => format!("kernel netdev {} (master {m})", self.netdev),
            None => format!("kernel netdev {}", self.netdev),
        }
    }

    /// The command that frees the port: `ip link set MASTER down && ip link set IF down`, or
    /// only the second part when there is no master.
    pub fn command(&self) -> String {
        self.down_order()
            .iter()
            .map(|n| format!("ip link set {n} down"))
            .collect::<Vec<_>>()
            .join(" && ")
    }

    /// The command that gives the port back to the kernel (the reverse of [`Holder::command`]).
    pub fn restore_command(&self) -> String {
        let mut order = self.down_order();
        order.reverse();
        order
            .iter()
            .map(|n| format!("ip link set {n} up"))
            .collect::<Vec<_>>()
            .join(" && ")
    }
}

/// What to do about a busy port: the command that frees it, and the policies that would have
/// handled it. `errno` is what raw-QP creation returned.
pub fn hint(holder: Option<&Holder>, errno: i32) -> String {
    let why = format!(
        "raw-packet queue creation failed with {} (EBUSY on newer kernels, ENODEV on released \
         ones: the vPort has another user)",
        errno_name(errno)
    );
    match holder {
        Some(h) => format!(
            "{why}; free the port with `{}`, or add busy=wait to the port spec to wait until \
             it is free (busy-timeout=SECONDS, default {} s), or busy=takeover to have {} \
             brought down now and up again when the port closes",
            h.command(),
            super::DEFAULT_BUSY_TIMEOUT.as_secs(),
            if h.master.is_some() { "both" } else { "it" },
        ),
        None => format!(
            "{why}; find the port's netdev (pmd-devices lists it) and bring it down, its \
             hv_netvsc master first (`ip link set MASTER down && ip link set IF down`), or add \
             busy=wait to the port spec to wait until it is free; busy=takeover needs the \
             netdev to be known"
        ),
    }
}

/// What to do about a port another process's queues hold (its netdev is down).
pub fn hint_elsewhere(errno: i32) -> String {
    format!(
        "raw-packet queue creation failed with {} while the netdev is down: another process \
         (another pmd or DPDK application, or a secondary of one) has queues on this vPort; \
         stop it, or add busy=wait to the port spec to wait until it exits \
         (busy-timeout=SECONDS, default {} s)",
        errno_name(errno),
        super::DEFAULT_BUSY_TIMEOUT.as_secs()
    )
}

/// What to do about a port still busy when `busy=wait` gave up after `waited`.
pub fn hint_after_wait(holder: Option<&Holder>, errno: i32, waited: std::time::Duration) -> String {
    let waited = super::Seconds(waited);
    let cmd = holder.map_or_else(
        || "`ip link set MASTER down && ip link set IF down`".to_string(),
        |h| format!("`{}`", h.command()),
    );
    format!(
        "still held after waiting {waited} s (busy=wait): raw-packet queue creation kept \
         failing with {}; free the port with {cmd}, raise busy-timeout=SECONDS, or use \
         busy=takeover",
        errno_name(errno)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_errnos_of_raw_qp_creation_mean_busy() {
        assert!(is_port_busy_errno(libc::EBUSY));
        assert!(is_port_busy_errno(libc::ENODEV));
        assert!(!is_port_busy_errno(libc::EINVAL));
        assert!(!is_port_busy_errno(libc::ENOMEM));
        assert_eq!(errno_name(libc::ENODEV), "ENODEV");
        assert_eq!(errno_name(libc::EPERM), format!("errno {}", libc::EPERM));
    }

    #[test]
    fn master_is_read_from_sysfs_and_goes_down_first() {
        let root = tempfile::tempdir().unwrap();
        let net = root.path().join("class/net");
        std::fs::create_dir_all(net.join("enP7s1")).unwrap();
        std::fs::create_dir_all(net.join("eth1")).unwrap();
        std::os::unix::fs::symlink("../eth1", net.join("enP7s1/master")).unwrap();
        let h = Holder::find_in(root.path(), "enP7s1");
        assert_eq!(h.master.as_deref(), Some("eth1"));
        assert_eq!(h.describe(), "kernel netdev enP7s1 (master eth1)");
        assert_eq!(
            h.command(),
            "ip link set eth1 down && ip link set enP7s1 down"
        );
        assert_eq!(
            h.restore_command(),
            "ip link set enP7s1 up && ip link set eth1 up"
        );
        let alone = Holder::find_in(root.path(), "eth1");
        assert_eq!(alone.master, None);
        assert_eq!(alone.command(), "ip link set eth1 down");
    }

    #[test]
    fn hint_names_the_command_and_the_policies() {
        let h = Holder {
            netdev: "enP7s1".into(),
            master: Some("eth1".into()),
        };
        let t = hint(Some(&h), libc::ENODEV);
        for needle in [
            "ENODEV",
            "`ip link set eth1 down && ip link set enP7s1 down`",
            "busy=wait",
            "busy-timeout=SECONDS",
            "busy=takeover",
            "both",
        ] {
            assert!(t.contains(needle), "{t:?} lacks {needle:?}");
        }
        let t = hint_after_wait(Some(&h), libc::EBUSY, std::time::Duration::from_millis(300));
        assert!(t.starts_with("still held after waiting 0.3 s"), "{t}");
        assert!(
            t.contains("ip link set eth1 down && ip link set enP7s1 down"),
            "{t}"
        );
        assert!(!t.contains("busy=wait to"), "already waiting: {t}");
        let t = hint(None, libc::EBUSY);
        assert!(t.contains("EBUSY") && t.contains("pmd-devices"), "{t}");
        assert!(t.contains("busy=wait"), "{t}");
    }
}
