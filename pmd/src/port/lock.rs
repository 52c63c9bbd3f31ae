//! One process per port: a lock file per port, taken by [`Port::open`](super::Port::open)
//! before the device is touched, so a second process of ours on the same port is refused
//! with the holder's pid instead of failing somewhere in queue creation (or, worse, bringing
//! down a netdev the first one took over).
//!
//! The lock is `flock(2)` on `<dir>/<key>.lock` ([`crate::sys::lockfile`]): the kernel releases
//! it when the holder exits, however it exits, so a file left by a dead process is reused
//! silently. `<dir>` is the first usable of `$PMD_LOCK_DIR`, `/run/pmd`,
//! `$XDG_RUNTIME_DIR/pmd` and `<tmp>/pmd-<uid>` (see [`lock_dirs`]).
//!
//! The key names the port, not the way the spec reached it ([`key_for`]):
//! * `mana`: the RDMA device and IB port the spec selects in sysfs ([`mana_key`]), so
//!   `mana:mac=..` and `mana:dev=mana_0,port=1` for the same port share one lock. Under a
//!   sysfs root other than `/sys` (`PMD_SYSFS_ROOT`: a fake rdma-core's world) the devices
//!   are that tree's, so the key also names the tree.
//! * `emu-mana` with `netdev=IF`: the modelled port is the one whose kernel netdev is `IF`, in
//!   this network namespace. The wire is no port identity: the two ends of a `shm:NAME` cable
//!   are two ports in two processes with the same wire spec.
//! * Other kinds, and `emu-mana` without a netdev, model nothing exclusive: no lock.
#![deny(unsafe_code)]

use super::devargs::{PortKind, PortSpec};
use crate::devices;
use crate::ethdev::PortError;
use crate::sys::lockfile::{self, LockFile, TryLock};
use std::path::{Path, PathBuf};

/// The environment variable that names the lock directory (tests point it at a temporary
/// one; processes that must see each other's locks need the same value).
pub const LOCK_DIR_ENV: &str = "PMD_LOCK_DIR";
/// The system-wide lock directory (for root).
pub const SYSTEM_LOCK_DIR: &str = "/run/pmd";

/// A held port lock; the port keeps it until it is dropped (after its driver, so a netdev
/// taken over is back up before another process may open the port).
#[derive(Debug)]
pub struct PortLock {
    file: LockFile,
    key: String,
}

impl PortLock {
    /// Locks the port `key` (see [`key_for`], [`mana_key`]); `spec` names the port in errors.
    ///
    /// # Errors
    /// [`PortError::InUse`] with the holder's pid when another process (or another open in
    /// this one) holds it; [`PortError::Setup`] when no lock directory is usable.
    pub fn acquire(key: &str, spec: &str) -> Result<Self, PortError> {
        Self::acquire_in(&lock_dirs(), key, spec)
    }

    /// As [`PortLock::acquire`], in the first usable directory of `dirs`.
    ///
    /// # Errors
    /// As [`PortLock::acquire`].
    pub fn acquire_in(dirs: &[PathBuf], key: &str, spec: &str) -> Result<Self, PortError> {
        let name = format!("{}.lock", file_name(key));
        let mut failures = Vec::new();
        for dir in dirs {
            if let Err(e) = create_dir(dir) {
                failures.push(format!("{}: {e}", dir.display()));
                continue;
            }
            let path = dir.join(&name);
            match lockfile::try_lock(&path) {
                Ok(TryLock::Acquired(file)) => {
                    tracing::debug!(target: "pmd::port", key, path = %path.display(), "port lock taken");
                    return Ok(Self {
                        file,
                        key: key.to_string(),
                    });
                }
                Ok(TryLock::Held { pid }) => {
                    return Err(PortError::InUse {
                        spec: spec.to_string(),
                        pid,
                        lock: path,
                    })
                }
                Err(e) => failures.push(format!("{}: {e}", path.display())),
            }
        }
        Err(PortError::Setup {
            what: format!("{spec}: taking the port lock"),
            source: format!(
                "no usable lock directory ({}); set {LOCK_DIR_ENV} to a writable directory",
                failures.join("; ")
            )
            .into(),
        })
    }

    /// The port key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
}

/// The lock directories to try, in order: `$PMD_LOCK_DIR` alone when set; otherwise
/// `/run/pmd`, `$XDG_RUNTIME_DIR/pmd` and `<tmp>/pmd-<uid>`.
pub fn lock_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os(LOCK_DIR_ENV).filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(d)];
    }
    let mut dirs = vec![PathBuf::from(SYSTEM_LOCK_DIR)];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(x).join("pmd"));
    }
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
    };
    dirs.push(std::env::temp_dir().join(format!("pmd-{uid}")));
    dirs
}

/// A key as a file name: letters, digits, `.`, `-` and `_` kept, anything else `_`.
fn file_name(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The key of a MANA port: RDMA device and IB port.
pub fn mana_key(ibdev: &str, port: u32) -> String {
    format!("mana.{ibdev}.port{port}")
}

/// FNV-1a of a path: a short, stable name for a sysfs tree.
fn fnv1a(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The inode of this process's network namespace (what tells two `eth0`s apart).
#[cfg(feature = "emu")]
fn netns_id() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

/// The lock key of the port `spec` selects, or `None` when the kind has nothing exclusive
/// (see the module docs). For `mana`, the device and port are looked up under
/// [`devices::sysfs_root`]; a spec that matches nothing has no key (opening it fails anyway).
pub fn key_for(spec: &PortSpec) -> Option<String> {
    match &spec.kind {
        PortKind::Mana { mac, dev, port } => {
            let root = devices::sysfs_root();
            let sel = devices::PortSelector {
                dev: dev.clone(),
                port: *port,
                mac: *mac,
                netdev: spec.netdev.clone(),
            };
            let (d, p, _) = devices::resolve_mana_port(&root, &sel).ok()?;
            Some(if root == Path::new(devices::DEFAULT_SYSFS_ROOT) {
                mana_key(&d, p)
            } else {
                format!("{}.sysfs-{:016x}", mana_key(&d, p), fnv1a(&root))
            })
        }
        #[cfg(feature = "emu")]
        PortKind::EmuMana { .. } => spec.netdev.as_ref().map(|n| {
            let ns = netns_id().map_or_else(|| "unknown".to_string(), |i| i.to_string());
            format!("emu-mana.netns-{ns}.{n}")
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The port the selection keys pick, as the lock sees it.
    fn mana_port(
        root: &Path,
        mac: Option<&crate::net::MacAddr>,
        dev: Option<&str>,
        port: Option<u32>,
    ) -> Option<(String, u32)> {
        let sel = devices::PortSelector {
            dev: dev.map(str::to_string),
            port,
            mac: mac.copied(),
            netdev: None,
        };
        devices::resolve_mana_port(root, &sel)
            .ok()
            .map(|(d, p, _)| (d, p))
    }

    fn fake_mana(root: &Path, ibdev: &str, ports: &[(u32, &str, &str)]) {
        let d = root.join("class/infiniband").join(ibdev);
        std::fs::create_dir_all(d.join("device")).unwrap();
        std::fs::write(d.join("device/vendor"), "0x1414\n").unwrap();
        for (p, ifname, mac) in ports {
            std::fs::create_dir_all(d.join(format!("ports/{p}"))).unwrap();
            let n = d.join("device/net").join(ifname);
            std::fs::create_dir_all(&n).unwrap();
            std::fs::write(n.join("dev_port"), format!("{}\n", p - 1)).unwrap();
            std::fs::write(n.join("address"), format!("{mac}\n")).unwrap();
        }
    }

    #[test]
    fn mana_specs_for_one_port_share_one_key() {
        let root = tempfile::tempdir().unwrap();
        fake_mana(
            root.path(),
            "mana_0",
            &[
                (1, "enP1s1", "00:15:5d:00:00:01"),
                (2, "enP1s2", "00:15:5d:00:00:02"),
            ],
        );
        let r = root.path();
        let mac2: crate::net::MacAddr = "00:15:5d:00:00:02".parse().unwrap();
        assert_eq!(mana_port(r, None, None, None), Some(("mana_0".into(), 1)));
        assert_eq!(
            mana_port(r, Some(&mac2), None, None),
            Some(("mana_0".into(), 2))
        );
        assert_eq!(
            mana_port(r, None, Some("mana_0"), Some(2)),
            Some(("mana_0".into(), 2))
        );
        // Nothing in sysfs, nothing to lock: opening it fails with NoDevice anyway.
        assert_eq!(mana_port(r, None, Some("mana_9"), None), None);
        assert_eq!(mana_port(r, None, Some("mana_0"), Some(3)), None);
        let other: crate::net::MacAddr = "00:15:5d:00:00:09".parse().unwrap();
        assert_eq!(mana_port(r, Some(&other), None, None), None);
        assert_eq!(mana_key("mana_0", 2), "mana.mana_0.port2");
        assert_ne!(fnv1a(Path::new("/tmp/a")), fnv1a(Path::new("/tmp/b")));
    }

    #[cfg(feature = "emu")]
    #[test]
    fn model_ports_lock_on_their_netdev_only() {
        let with: PortSpec = "emu-mana:wire=shm:a,netdev=eth7".parse().unwrap();
        let k = key_for(&with).unwrap();
        assert!(
            k.starts_with("emu-mana.netns-") && k.ends_with(".eth7"),
            "{k}"
        );
        let without: PortSpec = "emu-mana:wire=shm:a".parse().unwrap();
        assert_eq!(key_for(&without), None);
        assert_eq!(key_for(&"null".parse().unwrap()), None);
        assert_eq!(file_name("a/b:c.d-e_f"), "a_b_c.d-e_f");
    }

    #[test]
    fn second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        // A directory that cannot be created is skipped for the next one.
        let dirs = [
            PathBuf::from("/proc/no-such-dir/pmd"),
            dir.path().to_path_buf(),
        ];
        let a = PortLock::acquire_in(&dirs, "unit.port", "spec-a").unwrap();
        assert!(a.path().starts_with(dir.path()));
        assert_eq!(a.key(), "unit.port");
        let e = PortLock::acquire_in(&dirs, "unit.port", "spec-b").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())) && msg.contains("spec-b"),
            "{msg}"
        );
        drop(a);
        PortLock::acquire_in(&dirs, "unit.port", "spec-c").unwrap();
        let e = PortLock::acquire_in(&dirs[..1], "unit.port", "spec-d").unwrap_err();
        assert!(e.to_string().contains(LOCK_DIR_ENV), "{e}");
    }
}
