//! The fake world: which RDMA devices and ports exist, their MACs, wires and netdevs, and the
//! sysfs tree that shows them.
//!
//! One tree serves two readers: the PMD's own device discovery (`pmd::devices`, through
//! `PMD_SYSFS_ROOT` or libibverbs' `SYSFS_PATH`) and the fake library's device list. The
//! `fake-rdma-world` tool writes it; the library reads it back. This file is compiled into
//! both (the tool includes it by path, so it never links the library itself).
//!
//! World syntax (`FAKE_RDMA_PORTS`): a `;`-separated list of
//! `DEV/PORT:mac=MAC,wire=WIRE[,netdev=IFNAME][,vp_offset=N][,coalesce=1][,netdev_up_after_reset=1]`
//! (`rnic=1`: the MANA function's RDMA device, which newer kernels list beside the raw-packet
//! one: it reports `vendor_part_id` 3 and no raw-packet capabilities)
//! for MANA devices (`mana_N`, ports 1..8; `coalesce=1` plays a newer kernel, whose `mana_ib`
//! turns RX CQE coalescing on for RSS QPs) and
//! `DEV/1:mac=MAC,wire=WIRE[,netdev=IFNAME][,part=ID][,netdev_up_after_reset=1]` for mlx5
//! devices (`mlx5_N`: one port per device, spec mlx5.md §1.1; `part` is the PCI device id,
//! which the kernel also reports as `vendor_part_id`: 0x1017 ConnectX-5 by default, 0x1013
//! ConnectX-4). `netdev_up_after_reset=1` (with `netdev=IFNAME`): when the device comes
//! back from a servicing (`events.rs`), its port's netdev IFNAME is brought up, as
//! `hv_netvsc` opens a VF that joins a running synthetic NIC (kernel `__netvsc_vf_setup`).
//! Either family also takes `faults=KIND[+KIND...]|all` and `fault_period=SECONDS`: the
//! device model behind the port injects those faults in turn, as the `faults=` devarg of a
//! device-model port does (`pmd::emu::faults`): error completions, dropped frames, bad keys,
//! link faults that reach the wire (not the port's state or events: those are the
//! `fake_rdma_link` knob's).
//!
//! While a device is being serviced its directories are out of `class/` (under
//! [`SERVICED_DIR`]); a device that came back has a higher [`GENERATION_FILE`].
//!
//! A device's family follows from its name when the world is parsed, and from its PCI
//! vendor id (`device/vendor`) when the library reads the tree back, as `pmd::devices` and
//! the rdma-core providers' match tables do.

use pmd::emu::wire::WireSpec;
use pmd::net::MacAddr;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// PCI ids of a MANA virtual function (Microsoft, `0x00ba`).
const MANA_VENDOR: &str = "0x1414";
const MANA_DEVICE: &str = "0x00ba";
/// PCI vendor id of Mellanox / NVIDIA networking (`PCI_VENDOR_ID_MELLANOX`).
pub const MLX5_VENDOR: u16 = 0x15b3;
/// The PCI device id (= `vendor_part_id`) of a ConnectX-5, the default mlx5 part.
pub const MLX5_DEFAULT_PART: u16 = 0x1017;
/// The PCI device ids rdma-core v44's mlx5 provider matches (rdma-core v44.0
/// providers/mlx5/mlx5.c:67–93, `mlx5_hca_table`): Connect-IB, ConnectX-4 … 8 (PFs and VFs),
/// BlueField 1–4.
pub const MLX5_PARTS: &[u16] = &[
    0x1011, 0x1012, 0x1013, 0x1014, 0x1015, 0x1016, 0x1017, 0x1018, 0x1019, 0x101a, 0x101b, 0x101c,
    0x101d, 0x101e, 0x101f, 0x1021, 0x1023, 0xa2d2, 0xa2d3, 0xa2d6, 0xa2dc, 0xa2df,
];

/// Which provider drives a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Azure MANA (`providers/mana`).
    Mana,
    /// NVIDIA ConnectX (`providers/mlx5`), with its PCI device id.
    Mlx5 {
        /// PCI device id = `vendor_part_id` (0x1017 ConnectX-5, 0x1013 ConnectX-4, ...).
        part: u16,
    },
}
/// Kernel `IFF_UP | IFF_BROADCAST | IFF_MULTICAST` minus `IFF_UP`: an interface that is down.
const FLAGS_DOWN: &str = "0x1002";
/// `IFF_UP | IFF_BROADCAST | IFF_MULTICAST`: an interface that is up.
const FLAGS_UP: &str = "0x1003";
/// The file, in a port's sysfs directory, that names the wire the device model serves the
/// port's queues on. Only the fake writes it; its presence marks a device as the fake's.
pub const WIRE_FILE: &str = "fake_rdma_wire";
/// The file, in a port's sysfs directory, with the port's TX vPort offset.
pub const VP_OFFSET_FILE: &str = "fake_rdma_vp_offset";
/// Per port: `1` if its RSS QPs coalesce RX completions (a newer kernel's `mana_ib`).
pub const COALESCE_FILE: &str = "fake_rdma_coalesce";
/// Per port: the faults its device model cycles, `KINDS SECONDS` (`faults=`, `fault_period=`).
pub const FAULTS_FILE: &str = "fake_rdma_faults";
/// Per device: `1` if it is a MANA function's RDMA (RNIC) device, not its raw-packet one.
pub const RNIC_FILE: &str = "fake_rdma_rnic";
/// Per port: `1` if its netdev is brought up when the device comes back from a servicing.
pub const NETDEV_UP_FILE: &str = "fake_rdma_netdev_up_after_reset";
/// In a device's directory: how many servicings it went through (absent: none). A device
/// that comes back is a new registration for libibverbs (a new kernel device index), and a
/// context opened before it sees the number change.
pub const GENERATION_FILE: &str = "fake_rdma_generation";
/// Under the tree's root, outside `class/`: where a device's directories wait while it is
/// being serviced (`<dev>` and `uverbsN`), with `<dev>.until` saying until when.
pub const SERVICED_DIR: &str = "fake_rdma_serviced";

/// The world the tool creates when `FAKE_RDMA_PORTS` is not set.
pub const DEFAULT_WORLD: &str = "mana_0/1:mac=02:00:00:00:10:01,wire=shm:fake-mana_0-1;\
                                 mana_0/2:mac=02:00:00:00:10:02,wire=shm:fake-mana_0-2";

/// One port of the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// RDMA device name, e.g. `mana_0`.
    pub dev: String,
    /// IB port number, 1-based.
    pub port: u8,
    /// The port's MAC address.
    pub mac: MacAddr,
    /// The wire the device model serves this port on.
    pub wire: WireSpec,
    /// A real Linux interface that plays the port's kernel netdev (holds the port while up).
    pub netdev: Option<String>,
    /// The TX vPort offset the kernel reports for this port (MANA only).
    pub vp_offset: u32,
    /// Whether the kernel configures this port's RSS QPs with RX CQE coalescing, as
    /// `mana_ib` does on newer kernels (MANA only).
    pub coalesce: bool,
    /// Whether the netdev (a real one) is brought up when the device comes back from a
    /// servicing.
    pub netdev_up_after_reset: bool,
    /// `faults=` and `fault_period=`: the faults the port's device model cycles.
    pub faults: Option<pmd::emu::faults::FaultPlan>,
    /// MANA only: the device is the function's RDMA (RNIC) device, which newer kernels list
    /// beside the raw-packet one (`rnic=1`).
    pub rnic: bool,
    /// The device's family (and, for mlx5, its part).
    pub family: Family,
}

impl PortSpec {
    /// The netdev name shown in sysfs: the real interface, or a made-up one (down on MANA,
    /// up on mlx5).
    pub fn netdev_name(&self) -> String {
        self.netdev
            .clone()
            .unwrap_or_else(|| format!("eth-{}-{}", self.dev, self.port))
    }
}

/// A world description that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldError(pub String);

impl fmt::Display for WorldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FAKE_RDMA_PORTS: {}", self.0)
    }
}

impl std::error::Error for WorldError {}

fn err<T>(msg: String) -> Result<T, WorldError> {
    Err(WorldError(msg))
}

/// Parses a world description; see the module docs for the syntax.
///
/// # Errors
/// A [`WorldError`] naming the entry and what is wrong with it.
pub fn parse(s: &str) -> Result<Vec<PortSpec>, WorldError> {
    let mut ports: Vec<PortSpec> = Vec::new();
    for entry in s.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, opts)) = entry.split_once(':') else {
            return err(format!("`{entry}`: expected DEV/PORT:mac=MAC,wire=WIRE"));
        };
        let Some((dev, port)) = name.split_once('/') else {
            return err(format!("`{name}`: expected DEV/PORT, e.g. mana_0/1"));
        };
        let mlx5 = dev.starts_with("mlx5_");
        if !(dev.starts_with("mana_") || mlx5) || dev.len() > 63 || dev.contains('/') {
            return err(format!(
                "`{dev}`: devices are MANA (mana_N) or mlx5 (mlx5_N)"
            ));
        }
        let port: u8 = match port.parse() {
            Ok(1) => 1,
            // One port per mlx5 device: each PCI function is its own IB device with
            // port 1 (spec mlx5.md §1.1).
            Ok(_) if mlx5 => {
                return err(format!(
                    "`{name}`: an mlx5 device has one port, port 1 (one IB device per PCI function)"
                ))
            }
            Ok(p @ 2..=8) => p,
            _ => return err(format!("`{name}`: port must be 1..8")),
        };
        let mut spec = PortSpec {
            dev: dev.to_string(),
            port,
            mac: MacAddr::default(),
            wire: WireSpec::None,
            netdev: None,
            vp_offset: 0,
            coalesce: false,
            rnic: false,
            netdev_up_after_reset: false,
            faults: None,
            family: if mlx5 {
                Family::Mlx5 {
                    part: MLX5_DEFAULT_PART,
                }
            } else {
                Family::Mana
            },
        };
        let mut have_mac = false;
        let mut period_given = None;
        // A MAC contains ':' but never ',', so options split on ',' then the first '='.
        for opt in opts.split(',').filter(|o| !o.is_empty()) {
            let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
            match k {
                "mac" => {
                    spec.mac = match v.parse::<MacAddr>() {
                        Ok(m) if m.0[0] & 1 == 0 && m != MacAddr::default() => m,
                        _ => return err(format!("{name}: mac={v}: not a unicast MAC")),
                    };
                    have_mac = true;
                }
                "wire" => {
                    spec.wire = v
                        .parse()
                        .map_err(|e| WorldError(format!("{name}: unknown wire: {e}")))?;
                }
                "netdev" => {
                    if v.is_empty() || v.len() > 15 || v.contains('/') {
                        return err(format!("{name}: netdev={v}: not an interface name"));
                    }
                    spec.netdev = Some(v.to_string());
                }
                "vp_offset" if !mlx5 => {
                    spec.vp_offset = v
                        .parse()
                        .map_err(|_| WorldError(format!("{name}: vp_offset={v}: not a number")))?;
                }
                "coalesce" if !mlx5 => {
                    spec.coalesce = match v {
                        "1" => true,
                        "0" => false,
                        _ => return err(format!("{name}: coalesce={v}: 1 or 0")),
                    };
                }
                "rnic" if !mlx5 => {
                    spec.rnic = match v {
                        "1" => true,
                        "0" => false,
                        _ => return err(format!("{name}: rnic={v}: 1 or 0")),
                    };
                }
                "netdev_up_after_reset" => {
                    spec.netdev_up_after_reset = match v {
                        "1" => true,
                        "0" => false,
                        _ => return err(format!("{name}: netdev_up_after_reset={v}: 1 or 0")),
                    };
                }
                "faults" => {
                    let kinds = if mlx5 {
                        pmd::emu::faults::MLX5_KINDS
                    } else {
                        pmd::emu::faults::MANA_KINDS
                    };
                    let period = spec.faults.as_ref().map_or(
                        pmd::emu::faults::DEFAULT_PERIOD,
                        |p: &pmd::emu::faults::FaultPlan| p.period,
                    );
                    spec.faults = Some(
                        pmd::emu::faults::FaultPlan::parse(v, kinds, period)
                            .map_err(|e| WorldError(format!("{name}: faults={v}: {e}")))?,
                    );
                }
                "fault_period" => {
                    let secs: f64 = v.parse().unwrap_or(f64::NAN);
                    if !(0.001..=86400.0).contains(&secs) {
                        return err(format!(
                            "{name}: fault_period={v}: seconds from 0.001 to 86400"
                        ));
                    }
                    period_given = Some(std::time::Duration::from_secs_f64(secs));
                }
                "part" if mlx5 => {
                    let part = u16::from_str_radix(v.trim_start_matches("0x"), 16)
                        .ok()
                        .filter(|p| MLX5_PARTS.contains(p));
                    let Some(part) = part else {
                        return err(format!(
                            "{name}: part={v}: not a PCI device id rdma-core's mlx5 provider matches (e.g. 0x1017 ConnectX-5, 0x1013 ConnectX-4)"
                        ));
                    };
                    spec.family = Family::Mlx5 { part };
                }
                _ if mlx5 => {
                    return err(format!(
                        "{name}: unknown option `{k}` for an mlx5 device (mac, wire, netdev, part, netdev_up_after_reset, faults, fault_period)"
                    ))
                }
                _ => {
                    return err(format!(
                        "{name}: unknown option `{k}` (mac, wire, netdev, vp_offset, coalesce, rnic, netdev_up_after_reset, faults, fault_period)"
                    ))
                }
            }
        }
        if !have_mac {
            return err(format!("{name}: mac= is required"));
        }
        match (&mut spec.faults, period_given) {
            (Some(f), Some(p)) => f.period = p,
            (None, Some(_)) => return err(format!("{name}: fault_period= needs faults=")),
            _ => {}
        }
        if spec.netdev_up_after_reset && spec.netdev.is_none() {
            return err(format!(
                "{name}: netdev_up_after_reset=1 needs netdev=IFNAME (a real interface)"
            ));
        }
        if ports
            .iter()
            .any(|p| p.dev == spec.dev && p.port == spec.port)
        {
            return err(format!("{name}: listed twice"));
        }
        // A MANA function's RDMA device shares the MAC of its raw-packet device.
        if ports
            .iter()
            .any(|p| p.mac == spec.mac && p.rnic == spec.rnic)
        {
            return err(format!("{name}: mac {} used twice", spec.mac));
        }
        ports.push(spec);
    }
    if ports.is_empty() {
        return err("no ports".into());
    }
    ports.sort_by(|a, b| (&a.dev, a.port).cmp(&(&b.dev, b.port)));
    // IB ports are numbered 1..=n without gaps.
    let mut devs: Vec<&str> = ports.iter().map(|p| p.dev.as_str()).collect();
    devs.dedup();
    for d in devs {
        let nums: Vec<u8> = ports
            .iter()
            .filter(|p| p.dev == d)
            .map(|p| p.port)
            .collect();
        if nums
            .iter()
            .enumerate()
            .any(|(i, &n)| usize::from(n) != i + 1)
        {
            return err(format!("{d}: ports must be numbered 1..n without gaps"));
        }
    }
    Ok(ports)
}

fn write(path: &Path, contents: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, format!("{contents}\n"))
}

fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    if let Some(dir) = link.parent() {
        fs::create_dir_all(dir)?;
    }
    std::os::unix::fs::symlink(target, link)
}

/// Writes the sysfs tree for `ports` under `root` (which must not hold one already), with
/// the files `pmd::devices` and libibverbs read. A real netdev's `flags` is a link to the
/// live `/sys/class/net/IF/flags`, so bringing the interface up or down is seen at once.
///
/// # Errors
/// An I/O error, or `NotFound` when a `netdev=` names no interface of this machine.
pub fn write_sysfs(root: &Path, ports: &[PortSpec]) -> io::Result<()> {
    write(&root.join("class/infiniband_verbs/abi_version"), "6")?;
    let mut devs: Vec<&str> = ports.iter().map(|p| p.dev.as_str()).collect();
    devs.dedup();
    for (i, dev) in devs.iter().enumerate() {
        let family = ports
            .iter()
            .find(|p| p.dev == *dev)
            .map_or(Family::Mana, |p| p.family);
        let ib = root.join("class/infiniband").join(dev);
        let uverbs = root.join(format!("class/infiniband_verbs/uverbs{i}"));
        write(&uverbs.join("ibdev"), dev)?;
        write(&uverbs.join("dev"), &format!("231:{}", 192 + i))?;
        write(&ib.join("node_type"), "1: CA")?;
        match family {
            Family::Mana => {
                write(&uverbs.join("abi_version"), "1")?;
                write(&ib.join("device/vendor"), MANA_VENDOR)?;
                write(&ib.join("device/device"), MANA_DEVICE)?;
                write(
                    &ib.join("device/uevent"),
                    &format!("DRIVER=mana\nPCI_SLOT_NAME=7870:00:{i:02x}.0"),
                )?;
                let driver = root.join("bus/pci/drivers/mana");
                fs::create_dir_all(&driver)?;
                symlink(&driver, &ib.join("device/driver"))?;
            }
            Family::Mlx5 { part } => {
                // The mlx5 uverbs ABI is 1 (rdma-core providers/mlx5: MLX5_UVERBS_MIN/MAX_ABI_VERSION);
                // the PCI function is bound to mlx5_core, and libibverbs can also match it by
                // its modalias (rdma-core v44.0 providers/mlx5/mlx5.c:67–93).
                write(&uverbs.join("abi_version"), "1")?;
                write(&ib.join("device/vendor"), &format!("{MLX5_VENDOR:#06x}"))?;
                write(&ib.join("device/device"), &format!("{part:#06x}"))?;
                write(
                    &ib.join("device/uevent"),
                    &format!(
                        "DRIVER=mlx5_core\nPCI_ID=15B3:{part:04X}\nPCI_SLOT_NAME=0000:{:02x}:00.0",
                        0x30 + i
                    ),
                )?;
                write(
                    &ib.join("device/modalias"),
                    &format!("pci:v000015B3d0000{part:04X}sv000015B3sd00000001bc02sc00i00"),
                )?;
                let driver = root.join("bus/pci/drivers/mlx5_core");
                fs::create_dir_all(&driver)?;
                symlink(&driver, &ib.join("device/driver"))?;
            }
        }
        if ports.iter().any(|p| p.dev == *dev && p.rnic) {
            write(&ib.join(RNIC_FILE), "1")?;
        }
        for p in ports.iter().filter(|p| p.dev == *dev) {
            let pdir = ib.join(format!("ports/{}", p.port));
            write(&pdir.join("state"), "4: ACTIVE")?;
            write(&pdir.join("phys_state"), "5: LinkUp")?;
            write(&pdir.join("link_layer"), "Ethernet")?;
            write(&pdir.join(WIRE_FILE), &p.wire.to_string())?;
            write(&pdir.join(VP_OFFSET_FILE), &p.vp_offset.to_string())?;
            write(
                &pdir.join(COALESCE_FILE),
                if p.coalesce { "1" } else { "0" },
            )?;
            if p.netdev_up_after_reset {
                write(&pdir.join(NETDEV_UP_FILE), "1")?;
            }
            if let Some(f) = &p.faults {
                write(
                    &pdir.join(FAULTS_FILE),
                    &format!("{} {}", f.kinds_text(), f.period.as_secs_f64()),
                )?;
            }
            let ndir = ib.join("device/net").join(p.netdev_name());
            write(&ndir.join("dev_port"), &(p.port - 1).to_string())?;
            write(&ndir.join("address"), &p.mac.to_string())?;
            match &p.netdev {
                Some(real) => {
                    let live = Path::new("/sys/class/net").join(real).join("flags");
                    if !live.exists() {
                        return Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "{}/{}: netdev={real}: no such interface on this machine (see `ip link`)",
                                p.dev, p.port
                            ),
                        ));
                    }
                    symlink(&live, &ndir.join("flags"))?;
                    // Its master (a bridge here, `hv_netvsc` on Azure), as the kernel shows
                    // it: the same link text, so the name it ends in is the master's.
                    let master = Path::new("/sys/class/net").join(real).join("master");
                    if let Ok(target) = fs::read_link(&master) {
                        symlink(&target, &ndir.join("master"))?;
                    }
                    // `class/net/IF`, where the take-over looks for the master.
                    let class = root.join("class/net");
                    fs::create_dir_all(&class)?;
                    symlink(&ndir, &class.join(real))?;
                }
                // A made-up netdev: down on MANA (where an up netdev holds the port), up on
                // mlx5 (the netdev and the raw queues share the port, and the RoCE port is
                // ACTIVE only while its netdev is up).
                None => write(
                    &ndir.join("flags"),
                    match p.family {
                        Family::Mana => FLAGS_DOWN,
                        Family::Mlx5 { .. } => FLAGS_UP,
                    },
                )?,
            }
        }
    }
    Ok(())
}

/// One port as the library reads it back from a tree.
#[derive(Debug, Clone)]
pub struct PortView {
    /// IB port number.
    pub number: u8,
    /// The wire spec for the device model.
    pub wire: WireSpec,
    /// The TX vPort offset.
    pub vp_offset: u32,
    /// RX CQE coalescing on its RSS QPs.
    pub coalesce: bool,
    /// The faults its device model cycles, as written (`KINDS SECONDS`, [`FAULTS_FILE`]);
    /// see [`PortView::fault_plan`].
    pub faults: Option<String>,
    /// The netdev's name, and the `flags` file that says whether it is up.
    pub netdev: Option<(String, PathBuf)>,
    /// The port's MAC, from its netdev.
    pub mac: Option<MacAddr>,
}

impl PortView {
    /// The faults its device model cycles ([`FAULTS_FILE`]), against the kinds the model of
    /// that family has; `None` when none are set (or the file does not parse).
    pub fn fault_plan(
        &self,
        kinds: &'static [pmd::emu::faults::FaultKind],
    ) -> Option<pmd::emu::faults::FaultPlan> {
        let (names, secs) = self.faults.as_deref()?.split_once(' ')?;
        let secs: f64 = secs.parse().ok()?;
        let period = std::time::Duration::try_from_secs_f64(secs).ok()?;
        pmd::emu::faults::FaultPlan::parse(names, kinds, period).ok()
    }
}

/// One device as the library reads it back from a tree.
#[derive(Debug, Clone)]
pub struct DeviceView {
    /// RDMA device name.
    pub name: String,
    /// Its family, from its PCI vendor id (`device/vendor`) and device id.
    pub family: Family,
    /// `<root>/class/infiniband/<name>`.
    pub ibdev_path: PathBuf,
    /// Its ports, by number.
    pub ports: Vec<PortView>,
    /// N of its `class/infiniband_verbs/uverbsN` (the kernel's uverbs device number).
    pub uverbs: u32,
    /// Servicings it went through ([`GENERATION_FILE`]).
    pub generation: u64,
    /// A MANA function's RDMA (RNIC) device ([`RNIC_FILE`]).
    pub rnic: bool,
}

/// The servicings the device at `ibdev` went through ([`GENERATION_FILE`], 0 if absent).
pub fn generation(ibdev: &Path) -> u64 {
    fs::read_to_string(ibdev.join(GENERATION_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// N of the `class/infiniband_verbs/uverbsN` whose `ibdev` names `name`, if one is there.
pub fn uverbs_of(root: &Path, name: &str) -> Option<u32> {
    let dir = root.join("class/infiniband_verbs");
    fs::read_dir(&dir).ok()?.flatten().find_map(|e| {
        let n: u32 = e
            .file_name()
            .to_str()?
            .strip_prefix("uverbs")?
            .parse()
            .ok()?;
        let ibdev = fs::read_to_string(e.path().join("ibdev")).ok()?;
        (ibdev.trim() == name).then_some(n)
    })
}

/// Reads the fake's devices under `root`: those whose ports carry [`WIRE_FILE`] and that
/// have their `class/infiniband_verbs/uverbsN` (libibverbs finds a device through both).
/// Devices of a real tree (no such file) are not the fake's and are left out, and so is a
/// device in the middle of a servicing (its directories are moved out of `class/`).
pub fn read_sysfs(root: &Path) -> Vec<DeviceView> {
    let class = root.join("class/infiniband");
    let Ok(entries) = fs::read_dir(&class) else {
        return Vec::new();
    };
    let mut devices = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let dir = e.path();
        let mut ports = Vec::new();
        for n in 1u8..=8 {
            let pdir = dir.join(format!("ports/{n}"));
            let Some(wire) = fs::read_to_string(pdir.join(WIRE_FILE))
                .ok()
                .and_then(|w| w.trim().parse().ok())
            else {
                break;
            };
            let vp_offset = fs::read_to_string(pdir.join(VP_OFFSET_FILE))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            let coalesce =
                fs::read_to_string(pdir.join(COALESCE_FILE)).is_ok_and(|s| s.trim() == "1");
            let faults = fs::read_to_string(pdir.join(FAULTS_FILE))
                .ok()
                .map(|s| s.trim().to_string());
            let mut netdev = None;
            let mut mac = None;
            if let Ok(nets) = fs::read_dir(dir.join("device/net")) {
                for ne in nets.flatten() {
                    let dev_port = fs::read_to_string(ne.path().join("dev_port")).ok();
                    if dev_port.and_then(|s| s.trim().parse::<u8>().ok()) == Some(n - 1) {
                        netdev = Some((
                            ne.file_name().to_string_lossy().into_owned(),
                            ne.path().join("flags"),
                        ));
                        mac = fs::read_to_string(ne.path().join("address"))
                            .ok()
                            .and_then(|s| s.trim().parse().ok());
                    }
                }
            }
            ports.push(PortView {
                number: n,
                wire,
                vp_offset,
                coalesce,
                faults,
                netdev,
                mac,
            });
        }
        let Some(uverbs) = uverbs_of(root, &name) else {
            continue;
        };
        if !ports.is_empty() {
            let hex = |f: &str| {
                fs::read_to_string(dir.join("device").join(f))
                    .ok()
                    .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
            };
            let family = match (hex("vendor"), hex("device")) {
                (Some(MLX5_VENDOR), part) => Family::Mlx5 {
                    part: part.unwrap_or(MLX5_DEFAULT_PART),
                },
                _ => Family::Mana,
            };
            let generation = generation(&dir);
            let rnic = fs::read_to_string(dir.join(RNIC_FILE)).is_ok_and(|s| s.trim() == "1");
            devices.push(DeviceView {
                name,
                family,
                ibdev_path: dir,
                ports,
                uverbs,
                generation,
                rnic,
            });
        }
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices
}

/// The real netdevs (their `flags` files, links to `/sys/class/net/IF/flags`) of the ports
/// of the device at `ibdev` whose world says `netdev_up_after_reset=1`.
pub fn netdevs_up_after_reset(ibdev: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for n in 1u8..=8 {
        let on = fs::read_to_string(ibdev.join(format!("ports/{n}/{NETDEV_UP_FILE}")))
            .is_ok_and(|s| s.trim() == "1");
        if !on {
            continue;
        }
        let Ok(nets) = fs::read_dir(ibdev.join("device/net")) else {
            continue;
        };
        for ne in nets.flatten() {
            let dev_port = fs::read_to_string(ne.path().join("dev_port")).ok();
            let flags = ne.path().join("flags");
            let real = fs::symlink_metadata(&flags).is_ok_and(|m| m.file_type().is_symlink());
            if real && dev_port.and_then(|s| s.trim().parse::<u8>().ok()) == Some(n - 1) {
                out.push(flags);
            }
        }
    }
    out
}

/// Brings the netdev whose `flags` file is `flags` up (writes its flags with `IFF_UP`, as
/// the kernel's `flags` attribute takes them: `dev_change_flags`; needs `CAP_NET_ADMIN`).
///
/// # Errors
/// The file cannot be read or written.
pub fn set_netdev_up(flags: &Path) -> io::Result<()> {
    let now = fs::read_to_string(flags)?;
    let f = u32::from_str_radix(now.trim().trim_start_matches("0x"), 16)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if f & 1 == 0 {
        fs::write(flags, format!("{:#x}\n", f | 1))?;
    }
    Ok(())
}

/// Whether the netdev whose `flags` file is `flags` is up (`IFF_UP`), i.e. holds its port.
pub fn netdev_up(flags: &Path) -> bool {
    fs::read_to_string(flags)
        .ok()
        .and_then(|s| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|f| f & 1 != 0)
}
