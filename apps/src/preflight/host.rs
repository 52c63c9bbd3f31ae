//! The facts of this machine a preflight weighs, each read from a file under a root that a
//! test can move: sysfs (`--sysfs-root` / `PMD_SYSFS_ROOT`), procfs ([`PROC_ROOT_ENV`]) and
//! the device nodes ([`DEV_ROOT_ENV`]).
#![deny(unsafe_code)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Test hook: read `modules`, `self/status`, `self/limits` and `self/mounts` under this
/// directory instead of `/proc`.
pub const PROC_ROOT_ENV: &str = "PMD_PROC_ROOT";
/// Test hook: look for `infiniband/uverbsN` under this directory instead of `/dev`.
pub const DEV_ROOT_ENV: &str = "PMD_DEV_ROOT";

/// `CAP_NET_ADMIN` (linux/capability.h): bring interfaces up and down (`busy=takeover`).
pub const CAP_NET_ADMIN: u32 = 12;
/// `CAP_NET_RAW`: raw-packet QPs and AF_PACKET sockets.
pub const CAP_NET_RAW: u32 = 13;
/// `CAP_IPC_LOCK`: lock and pin memory beyond `RLIMIT_MEMLOCK`.
pub const CAP_IPC_LOCK: u32 = 14;

/// A resource limit as `/proc/self/limits` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// No limit.
    Unlimited,
    /// At most this many bytes.
    Bytes(u64),
}

/// The 2 MiB hugepage pool of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hugepages {
    /// Pages reserved (`nr_hugepages`).
    pub total: u64,
    /// Pages nobody has mapped yet (`free_hugepages`).
    pub free: u64,
}

/// Where a preflight reads this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The sysfs root (`/sys`).
    pub sysfs: PathBuf,
    /// The procfs root (`/proc`).
    pub proc: PathBuf,
    /// The device-node root (`/dev`).
    pub dev: PathBuf,
}

fn env_dir(key: &str, default: &str) -> PathBuf {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

impl Host {
    /// This machine, its sysfs read under `sysfs`, procfs and the device nodes where
    /// [`PROC_ROOT_ENV`] and [`DEV_ROOT_ENV`] say (else `/proc`, `/dev`).
    pub fn new(sysfs: PathBuf) -> Self {
        Host {
            sysfs,
            proc: env_dir(PROC_ROOT_ENV, "/proc"),
            dev: env_dir(DEV_ROOT_ENV, "/dev"),
        }
    }

    /// Whether sysfs is this machine's own (`/sys`), not a copied or fake tree.
    pub fn real_sysfs(&self) -> bool {
        self.sysfs == Path::new(pmd::devices::DEFAULT_SYSFS_ROOT)
    }

    /// Whether kernel module `name` is loaded: `<sysfs>/module/NAME` (loaded modules, and
    /// built-in ones with parameters) or a line of `<proc>/modules`.
    pub fn module_loaded(&self, name: &str) -> bool {
        self.sysfs.join("module").join(name).is_dir()
            || fs::read_to_string(self.proc.join("modules"))
                .is_ok_and(|m| m.lines().any(|l| l.split_whitespace().next() == Some(name)))
    }

    /// The effective capability set (`CapEff` of `<proc>/self/status`).
    pub fn effective_caps(&self) -> Option<u64> {
        let status = fs::read_to_string(self.proc.join("self/status")).ok()?;
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
        u64::from_str_radix(hex.trim(), 16).ok()
    }

    /// Whether capability `cap` is in the effective set; `None` when that cannot be read.
    pub fn has_cap(&self, cap: u32) -> Option<bool> {
        self.effective_caps().map(|c| c & (1 << cap) != 0)
    }

    /// The soft `RLIMIT_MEMLOCK` (`Max locked memory` of `<proc>/self/limits`).
    pub fn memlock_limit(&self) -> Option<Limit> {
        let limits = fs::read_to_string(self.proc.join("self/limits")).ok()?;
        let rest = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max locked memory"))?;
        match rest.split_whitespace().next()? {
            "unlimited" => Some(Limit::Unlimited),
            n => n.parse().ok().map(Limit::Bytes),
        }
    }

    /// The directory that counts 2 MiB hugepages: under the sysfs root when the tree has it,
    /// else this machine's (a copied or fake device tree usually has no `kernel/`).
    pub fn hugepages_dir(&self) -> PathBuf {
        const DIR: &str = "kernel/mm/hugepages/hugepages-2048kB";
        let under = self.sysfs.join(DIR);
        if under.is_dir() {
            under
        } else {
            Path::new(pmd::devices::DEFAULT_SYSFS_ROOT).join(DIR)
        }
    }

    /// The 2 MiB hugepages reserved and free; `None` when the kernel has none to offer (no
    /// hugetlb support, or the directory cannot be read).
    pub fn hugepages(&self) -> Option<Hugepages> {
        let dir = self.hugepages_dir();
        let num = |f: &str| read_trimmed(&dir.join(f)).and_then(|s| s.parse().ok());
        Some(Hugepages {
            total: num("nr_hugepages")?,
            free: num("free_hugepages")?,
        })
    }

    /// Mount points of hugetlbfs (`<proc>/self/mounts`).
    pub fn hugetlbfs_mounts(&self) -> Vec<PathBuf> {
        fs::read_to_string(self.proc.join("self/mounts"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let at = f.nth(1)?;
                (f.next()? == "hugetlbfs").then(|| PathBuf::from(at))
            })
            .collect()
    }

    /// The uverbs device of RDMA device `ibdev` (`uverbs0`): the
    /// `<sysfs>/class/infiniband_verbs/uverbsN` whose `ibdev` names it.
    pub fn uverbs_of(&self, ibdev: &str) -> Option<String> {
        let dir = self.sysfs.join("class/infiniband_verbs");
        let mut found: Vec<String> = fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with("uverbs")
                    && read_trimmed(&e.path().join("ibdev")).as_deref() == Some(ibdev);
                ours.then_some(name)
            })
            .collect();
        found.sort();
        found.into_iter().next()
    }

    /// The device node of uverbs device `uverbs` (`/dev/infiniband/uverbs0`).
    pub fn uverbs_node(&self, uverbs: &str) -> PathBuf {
        self.dev.join("infiniband").join(uverbs)
    }

    /// The MTU sysfs shows for netdev `netdev` of RDMA device `ibdev`.
    pub fn netdev_mtu(&self, ibdev: &str, netdev: &str) -> Option<u32> {
        let p = self
            .sysfs
            .join("class/infiniband")
            .join(ibdev)
            .join("device/net")
            .join(netdev)
            .join("mtu");
        read_trimmed(&p).and_then(|s| s.parse().ok())
    }
}

/// Opens `path` for reading and writing, as libibverbs opens a uverbs node, and closes it.
///
/// # Errors
/// The open's error (`NotFound`, `PermissionDenied`, ...).
pub fn open_read_write(path: &Path) -> io::Result<()> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(drop)
}

/// Whether a new file can be made in `dir` (made and removed again).
///
/// # Errors
/// Why not.
pub fn can_create_in(dir: &Path) -> io::Result<()> {
    let probe = dir.join(format!(".pmd-check.{}", std::process::id()));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(dir: &Path) -> Host {
        Host {
            sysfs: dir.join("sys"),
            proc: dir.join("proc"),
            dev: dir.join("dev"),
        }
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn proc_files_are_parsed_as_the_kernel_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(dir.path());
        assert_eq!(h.effective_caps(), None);
        assert_eq!(h.memlock_limit(), None);
        write(
            &h.proc.join("self/status"),
            "Name:\tx\nCapPrm:\t0000000000000000\nCapEff:\t0000000000003000\n",
        );
        assert_eq!(h.has_cap(CAP_NET_RAW), Some(true));
        assert_eq!(h.has_cap(CAP_NET_ADMIN), Some(true));
        assert_eq!(h.has_cap(CAP_IPC_LOCK), Some(false));
        write(
            &h.proc.join("self/limits"),
            "Limit                     Soft Limit           Hard Limit           Units     \n\
             Max locked memory         8388608              unlimited            bytes     \n",
        );
        assert_eq!(h.memlock_limit(), Some(Limit::Bytes(8 << 20)));
        write(
            &h.proc.join("self/limits"),
            "Max locked memory         unlimited            unlimited            bytes\n",
        );
        assert_eq!(h.memlock_limit(), Some(Limit::Unlimited));
        write(
            &h.proc.join("modules"),
            "ib_uverbs 184320 2 mana_ib, Live 0x0\nmana_ib 45056 0 - Live 0x0\n",
        );
        assert!(h.module_loaded("mana_ib") && h.module_loaded("ib_uverbs"));
        assert!(!h.module_loaded("mlx5_ib") && !h.module_loaded("mana"));
        fs::create_dir_all(h.sysfs.join("module/mlx5_ib")).unwrap();
        assert!(h.module_loaded("mlx5_ib"));
        write(
            &h.proc.join("self/mounts"),
            "proc /proc proc rw 0 0\nnodev /dev/hugepages hugetlbfs rw,pagesize=2M 0 0\n",
        );
        assert_eq!(h.hugetlbfs_mounts(), vec![PathBuf::from("/dev/hugepages")]);
    }

    #[test]
    fn uverbs_and_hugepages_come_from_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(dir.path());
        write(
            &h.sysfs.join("class/infiniband_verbs/uverbs3/ibdev"),
            "mana_0\n",
        );
        write(
            &h.sysfs.join("class/infiniband_verbs/uverbs1/ibdev"),
            "mlx5_0\n",
        );
        assert_eq!(h.uverbs_of("mana_0").as_deref(), Some("uverbs3"));
        assert_eq!(h.uverbs_of("mana_9"), None);
        assert_eq!(
            h.uverbs_node("uverbs3"),
            dir.path().join("dev/infiniband/uverbs3")
        );
        let hp = h.sysfs.join("kernel/mm/hugepages/hugepages-2048kB");
        write(&hp.join("nr_hugepages"), "64\n");
        write(&hp.join("free_hugepages"), "10\n");
        assert_eq!(
            h.hugepages(),
            Some(Hugepages {
                total: 64,
                free: 10
            })
        );
        assert!(!h.real_sysfs());
        assert!(can_create_in(dir.path()).is_ok());
        assert!(can_create_in(&dir.path().join("nonexistent")).is_err());
        assert!(open_read_write(&h.uverbs_node("uverbs3")).is_err());
    }
}
