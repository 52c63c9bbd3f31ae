//! Device discovery: every RDMA (verbs) device the kernel exposes, which provider drives it
//! (MANA, mlx5, other), its ports, and each port's kernel netdev and MAC address.
//!
//! Everything is read from sysfs, the same tree libibverbs enumerates, under a root that
//! tests (and `pmd-devices --sysfs-root`) can point at a fake tree:
//!
//! ```text
//! <root>/class/infiniband/<ibdev>/device/vendor          PCI vendor id (0x1414 MANA, 0x15b3 mlx5)
//! <root>/class/infiniband/<ibdev>/device/device          PCI device id
//! <root>/class/infiniband/<ibdev>/device/driver          -> .../drivers/<mana|mlx5_core>
//! <root>/class/infiniband/<ibdev>/device/uevent          PCI_SLOT_NAME=dddd:bb:dd.f
//! <root>/class/infiniband/<ibdev>/ports/<p>/state        "4: ACTIVE"
//! <root>/class/infiniband/<ibdev>/ports/<p>/link_layer   "Ethernet"
//! <root>/class/infiniband/<ibdev>/device/net/<if>/dev_port  p - 1 for IB port p
//! <root>/class/infiniband/<ibdev>/device/net/<if>/address   the MAC
//! <root>/class/infiniband/<ibdev>/device/net/<if>/flags     IFF_UP is bit 0
//! ```
//!
//! The port-to-netdev rule (the netdev whose `dev_port` is `p - 1` belongs to IB port `p`) is
//! the one the MANA Ethernet driver sets up (`ndev->dev_port = port_idx`) and that DPDK's
//! net/mana uses; mlx5 has one port per PCI function and its netdev's `dev_port` is 0.
#![deny(unsafe_code)]

use crate::net::MacAddr;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// PCI vendor id of Microsoft (MANA).
pub const PCI_VENDOR_MICROSOFT: u16 = 0x1414;
/// PCI vendor id of Mellanox / NVIDIA networking (mlx5).
pub const PCI_VENDOR_MELLANOX: u16 = 0x15b3;

/// Which user-space driver of ours can run a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Family {
    /// Azure MANA (rdma-core `libmana`, `manadv`).
    Mana,
    /// NVIDIA ConnectX (rdma-core `libmlx5`, `mlx5dv`).
    Mlx5,
    /// Any other verbs device; the string is the kernel driver name when known.
    Other(String),
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Family::Mana => f.write_str("mana"),
            Family::Mlx5 => f.write_str("mlx5"),
            Family::Other(d) if d.is_empty() => f.write_str("other"),
            Family::Other(d) => write!(f, "other ({d})"),
        }
    }
}

/// The kernel network interface that shares an RDMA port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netdev {
    /// Interface name, e.g. `eth1`.
    pub name: String,
    /// Its MAC address, when sysfs has a parsable one.
    pub mac: Option<MacAddr>,
    /// Whether the interface is administratively up (IFF_UP). On MANA an up netdev holds the
    /// port, and raw-packet queue creation fails until it is brought down.
    pub up: bool,
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// IB port number, 1-based.
    pub number: u32,
    /// Port state as the kernel prints it, e.g. `ACTIVE` or `DOWN`.
    pub state: String,
    /// `Ethernet` or `InfiniBand`.
    pub link_layer: String,
    /// The kernel netdev of this port, if one is found.
    pub netdev: Option<Netdev>,
}

/// One RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// IB device name, e.g. `mana_0` or `mlx5_0`.
    pub name: String,
    /// Which driver of ours can run it.
    pub family: Family,
    /// PCI vendor id, when known.
    pub vendor_id: Option<u16>,
    /// PCI device id, when known.
    pub device_id: Option<u16>,
    /// PCI address (`PCI_SLOT_NAME`), when known.
    pub pci_addr: Option<String>,
    /// Ports in ascending order.
    pub ports: Vec<PortInfo>,
}

/// A failure to read the sysfs tree.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A sysfs directory or file exists but could not be read.
    #[error("cannot read {path}: {source} (is sysfs mounted, and readable by this user?)")]
    Sysfs {
        /// What could not be read.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// The sysfs root of this machine.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// The environment variable that points sysfs look-ups at another tree (tests, the fake
/// rdma-core's world); `pmd-devices --sysfs-root` reads it too.
pub const SYSFS_ROOT_ENV: &str = "PMD_SYSFS_ROOT";

/// The sysfs root to read: `$PMD_SYSFS_ROOT` when set and not empty, else libibverbs' own
/// `$SYSFS_PATH` (so both see the same tree), else [`DEFAULT_SYSFS_ROOT`].
pub fn sysfs_root() -> PathBuf {
    [SYSFS_ROOT_ENV, "SYSFS_PATH"]
        .iter()
        .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map_or_else(|| PathBuf::from(DEFAULT_SYSFS_ROOT), PathBuf::from)
}

/// Which port to open: by MAC, by netdev name, or by device and port (any may be combined;
/// all given must match).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSelector {
    /// IB device name (`mana_0`).
    pub dev: Option<String>,
    /// IB port number (1-based).
    pub port: Option<u32>,
    /// The MAC of the port's netdev.
    pub mac: Option<MacAddr>,
    /// The port's kernel netdev (`eth1`).
    pub netdev: Option<String>,
}

impl PortSelector {
    /// The keys given, or "the first `family` port" when none is.
    pub fn describe(&self, family: &str) -> String {
        let mut parts = Vec::new();
        parts.extend(self.dev.as_ref().map(|d| format!("dev={d}")));
        parts.extend(self.port.map(|p| format!("port={p}")));
        parts.extend(self.mac.map(|m| format!("mac={m}")));
        parts.extend(self.netdev.as_ref().map(|n| format!("netdev={n}")));
        if parts.is_empty() {
            format!("the first {family} port")
        } else {
            parts.join(",")
        }
    }
}

impl fmt::Display for PortSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe("MANA"))
    }
}

/// The MANA port `sel` names under `root` (devices by name, ports ascending; the first that
/// matches every key given): (device, port, netdev). What the `mana:` provider opens and
/// what the port lock is keyed on.
///
/// # Errors
/// No MANA port matches (the message lists what there is), or sysfs cannot be read.
pub fn resolve_mana_port(
    root: &Path,
    sel: &PortSelector,
) -> Result<(String, u32, Option<Netdev>), String> {
    resolve_port(root, Family::Mana, sel)
}

/// The port of `family` that `sel` names under `root`, as [`resolve_mana_port`] does for
/// MANA: (device, port, netdev).
///
/// # Errors
/// No port of the family matches (the message lists what there is), or sysfs cannot be
/// read.
pub fn resolve_port(
    root: &Path,
    family: Family,
    sel: &PortSelector,
) -> Result<(String, u32, Option<Netdev>), String> {
    resolve_ports(root, family, sel).map(|mut v| v.swap_remove(0))
}

/// Every port of `family` that `sel` names under `root`, in [`resolve_port`]'s order (at
/// least one). More than one: the selection is ambiguous, or (MANA on newer kernels) one
/// function is listed as two RDMA devices, its raw-packet device and its RDMA (RNIC) one,
/// which share the netdev and MAC; the provider tells them apart when it opens them.
///
/// # Errors
/// As [`resolve_port`].
pub fn resolve_ports(
    root: &Path,
    family: Family,
    sel: &PortSelector,
) -> Result<Vec<(String, u32, Option<Netdev>)>, String> {
    let devs = list(root).map_err(|e| format!("reading {}: {e}", root.display()))?;
    let mut seen = Vec::new();
    let mut found = Vec::new();
    for d in devs.iter().filter(|d| d.family == family) {
        for p in &d.ports {
            let nd = p.netdev.as_ref();
            seen.push(format!(
                "{} port {}{}",
                d.name,
                p.number,
                nd.map(|n| {
                    format!(
                        " ({}{})",
                        n.name,
                        n.mac.map(|m| format!(", {m}")).unwrap_or_default()
                    )
                })
                .unwrap_or_default()
            ));
            let ok = sel.dev.as_ref().is_none_or(|x| *x == d.name)
                && sel.port.is_none_or(|x| x == p.number)
                && sel.mac.is_none_or(|m| nd.and_then(|n| n.mac) == Some(m))
                && sel
                    .netdev
                    .as_ref()
                    .is_none_or(|x| nd.is_some_and(|n| n.name == *x));
            if ok {
                found.push((d.name.clone(), p.number, p.netdev.clone()));
            }
        }
    }
    if !found.is_empty() {
        return Ok(found);
    }
    let (name, modules, model) = match family {
        Family::Mana => ("MANA", "mana_ib and ib_uverbs", "emu-mana:wire=shm:demo0"),
        _ => ("mlx5", "mlx5_ib and ib_uverbs", "emu-mlx5:wire=shm:demo0"),
    };
    Err(if seen.is_empty() {
        format!(
            "no {name} RDMA device under {} (load {modules}; pmd-devices lists \
             what there is); without hardware use the device model, e.g. \
             --port {model}",
            root.display()
        )
    } else {
        format!(
            "no {name} port matches {}; there is {}",
            sel.describe(name),
            seen.join("; ")
        )
    })
}

/// Lists every RDMA device under `<sysfs_root>/class/infiniband`, sorted by name.
///
/// A missing `class/infiniband` directory means "no devices" (an empty list), not an error.
///
/// # Errors
/// [`DeviceError::Sysfs`] if a directory that exists cannot be listed.
pub fn list(sysfs_root: &Path) -> Result<Vec<DeviceInfo>, DeviceError> {
    let class = sysfs_root.join("class/infiniband");
    let entries = match fs::read_dir(&class) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DeviceError::Sysfs {
                path: class,
                source,
            })
        }
    };
    let mut devices = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DeviceError::Sysfs {
            path: class.clone(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        devices.push(read_device(&entry.path(), name)?);
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(devices)
}

/// Whether netdev `netdev` of RDMA device `ibdev` is up (IFF_UP) now, read from the same
/// sysfs file discovery reads (`None`: no such file): an error path re-reads it rather than
/// trust what discovery saw when the port opened.
pub fn netdev_up_now(ibdev: &str, netdev: &str) -> Option<bool> {
    let p = sysfs_root()
        .join("class/infiniband")
        .join(ibdev)
        .join("device/net")
        .join(netdev)
        .join("flags");
    let flags = read_trimmed(&p)?;
    let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).ok()?;
    Some(flags & 1 != 0)
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn read_hex_u16(path: &Path) -> Option<u16> {
    let s = read_trimmed(path)?;
    u16::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn read_device(dir: &Path, name: String) -> Result<DeviceInfo, DeviceError> {
    let pci = dir.join("device");
    let vendor_id = read_hex_u16(&pci.join("vendor"));
    let device_id = read_hex_u16(&pci.join("device"));
    let driver = fs::read_link(pci.join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let family = match (vendor_id, driver.as_str()) {
        (Some(PCI_VENDOR_MICROSOFT), _) | (_, "mana") => Family::Mana,
        (Some(PCI_VENDOR_MELLANOX), _) | (_, "mlx5_core") => Family::Mlx5,
        _ if name.starts_with("mana_") => Family::Mana,
        _ if name.starts_with("mlx5_") => Family::Mlx5,
        _ => Family::Other(driver),
    };
    let pci_addr = read_trimmed(&pci.join("uevent")).and_then(|u| {
        u.lines()
            .find_map(|l| l.strip_prefix("PCI_SLOT_NAME=").map(str::to_string))
    });
    let netdevs = read_netdevs(&pci.join("net"))?;

    let ports_dir = dir.join("ports");
    let mut ports = Vec::new();
    match fs::read_dir(&ports_dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.map_err(|source| DeviceError::Sysfs {
                    path: ports_dir.clone(),
                    source,
                })?;
                let Ok(number) = entry.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let p = entry.path();
                let state = read_trimmed(&p.join("state"))
                    .map(|s| {
                        s.split_once(": ")
                            .map_or(s.clone(), |(_, st)| st.to_string())
                    })
                    .unwrap_or_else(|| "unknown".into());
                let link_layer =
                    read_trimmed(&p.join("link_layer")).unwrap_or_else(|| "unknown".into());
                let netdev = netdevs
                    .iter()
                    .find(|(dev_port, _)| Some(*dev_port) == number.checked_sub(1))
                    .map(|(_, n)| n.clone());
                ports.push(PortInfo {
                    number,
                    state,
                    link_layer,
                    netdev,
                });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(DeviceError::Sysfs {
                path: ports_dir,
                source,
            })
        }
    }
    ports.sort_by_key(|p| p.number);
    Ok(DeviceInfo {
        name,
        family,
        vendor_id,
        device_id,
        pci_addr,
        ports,
    })
}

/// `(dev_port, netdev)` for every interface under a PCI device's `net/` directory.
fn read_netdevs(net_dir: &Path) -> Result<Vec<(u32, Netdev)>, DeviceError> {
    let entries = match fs::read_dir(net_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DeviceError::Sysfs {
                path: net_dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DeviceError::Sysfs {
            path: net_dir.to_path_buf(),
            source,
        })?;
        let p = entry.path();
        let dev_port = read_trimmed(&p.join("dev_port"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mac = read_trimmed(&p.join("address")).and_then(|s| s.parse().ok());
        let flags = read_trimmed(&p.join("flags"))
            .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        let name = entry.file_name().to_string_lossy().into_owned();
        out.push((
            dev_port,
            Netdev {
                name,
                mac,
                up: flags & 1 != 0,
            },
        ));
    }
    out.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    Ok(out)
}

/// The device model ports that are always available, whatever the hardware.
pub const MODEL_PORTS: &[(&str, &str)] = &[
    (
        "emu-mana",
        "MANA device model (software NIC playing the hardware's side of the queues)",
    ),
    (
        "emu-mlx5",
        "mlx5 device model (ConnectX-5-like: SEND/TSO/eMPW, RSS, compressed CQEs)",
    ),
    ("null", "no-device port for measuring framework overhead"),
];

/// Human-readable report of `devices` plus the always-present device model, as printed by
/// `pmd-devices`.
pub fn report(devices: &[DeviceInfo]) -> String {
    use fmt::Write;
    let mut s = String::new();
    if devices.is_empty() {
        s.push_str(
            "No RDMA devices found (nothing under /sys/class/infiniband).\n\
             Real MANA or mlx5 ports need the kernel modules (mana_ib or mlx5_ib, and ib_uverbs)\n\
             and rdma-core's providers. Without hardware, use the device model below, e.g.\n\
             --port emu-mana:wire=shm:demo0\n",
        );
    } else {
        let _ = writeln!(s, "RDMA devices:");
        for d in devices {
            let ids = match (d.vendor_id, d.device_id) {
                (Some(v), Some(i)) => format!(" [{v:04x}:{i:04x}]"),
                _ => String::new(),
            };
            let pci = d
                .pci_addr
                .as_deref()
                .map(|a| format!(" pci {a}"))
                .unwrap_or_default();
            let _ = writeln!(s, "  {}  provider {}{}{}", d.name, d.family, ids, pci);
            if d.ports.is_empty() {
                let _ = writeln!(s, "    (no ports)");
            }
            for p in &d.ports {
                let nd = match &p.netdev {
                    Some(n) => format!(
                        "netdev {} mac {} ({})",
                        n.name,
                        n.mac.map_or_else(|| "unknown".into(), |m| m.to_string()),
                        match (n.up, &d.family) {
                            (true, Family::Mana) => "up: holds the port",
                            // mlx5 is bifurcated: the netdev keeps running beside us.
                            (true, _) => "up",
                            (false, _) => "down",
                        }
                    ),
                    None => "no netdev".into(),
                };
                let _ = writeln!(
                    s,
                    "    port {}  {} {}  {}",
                    p.number, p.link_layer, p.state, nd
                );
                match &d.family {
                    Family::Mana => {
                        let _ = writeln!(s, "      --port mana:dev={},port={}", d.name, p.number);
                    }
                    Family::Mlx5 => {
                        let _ = writeln!(s, "      --port mlx5:dev={},port={}", d.name, p.number);
                    }
                    Family::Other(_) => {}
                }
            }
        }
    }
    let _ = writeln!(s, "Device model (always available):");
    for (kind, what) in MODEL_PORTS {
        let _ = writeln!(s, "  {kind:<9} {what}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_and_prints() {
        let m: MacAddr = "00:15:5D:01:02:0a".parse().unwrap();
        assert_eq!(m.0, [0x00, 0x15, 0x5d, 0x01, 0x02, 0x0a]);
        assert_eq!(m.to_string(), "00:15:5d:01:02:0a");
        for bad in [
            "",
            "00:15:5d:01:02",
            "00:15:5d:01:02:03:04",
            "0:15:5d:01:02:03",
            "zz:15:5d:01:02:03",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(e.to_string().contains("not a MAC address"), "{bad}: {e}");
        }
    }

    #[test]
    fn missing_sysfs_class_means_no_devices() {
        let dir = tempfile::tempdir().unwrap();
        assert!(list(dir.path()).unwrap().is_empty());
        let r = report(&[]);
        assert!(r.contains("No RDMA devices found"));
        assert!(r.contains("emu-mana"));
    }
}
