//! [`Shm`]: a cable between processes over a shared-memory file.
#![deny(unsafe_code)]

use super::ring::{ring_bytes, FrameRing};
use super::{Wire, WireError, SLOT_BYTES};
use crate::sys::net::{pid, process_alive};
use crate::sys::DevMem;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Signature at the start of a shared-memory wire file.
pub const SHM_SIGNATURE: [u8; 8] = *b"PMDWIRE\0";
/// Major version: a peer with another major is refused.
pub const SHM_MAJOR: u16 = 1;
/// Minor version: compatible additions.
pub const SHM_MINOR: u16 = 0;
/// Incompatible feature bits this build understands (none yet).
pub const SHM_INCOMPAT_KNOWN: u32 = 0;
/// Compatible feature bits this build sets (none yet).
pub const SHM_COMPAT: u32 = 0;

mod hdr {
    pub const SIGNATURE: usize = 0;
    pub const MAJOR: usize = 8;
    pub const MINOR: usize = 10;
    pub const COMPAT: usize = 12;
    pub const INCOMPAT: usize = 16;
    pub const SLOTS: usize = 20;
    pub const SLOT_BYTES: usize = 24;
    pub const PID_A: usize = 64;
    pub const PID_B: usize = 72;
    pub const RINGS: usize = 128;
}

const SHM_SLOTS: u32 = 1024;
const SHM_SLOT_BYTES: u32 = SLOT_BYTES;

/// Size of a wire file: header and two rings, rounded up to 2 MiB so that the file can live on
/// hugetlbfs (whose files are whole huge pages).
fn shm_file_bytes(slots: u32, slot_bytes: u32) -> usize {
    (hdr::RINGS + 2 * ring_bytes(slots, slot_bytes)).div_ceil(2 << 20) * (2 << 20)
}

/// Directory for shared-memory wire files: `PMD_SHM_DIR` if set; else `/dev/hugepages` when it
/// is a hugetlbfs mount with room for a wire and headroom (2 MiB pages: fewer TLB misses per
/// frame); else `/dev/shm`. Both ends must agree: they find each other by path.
pub fn shm_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PMD_SHM_DIR") {
        return PathBuf::from(d);
    }
    let hugetlbfs = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.nth(1) == Some("/dev/hugepages") && f.next() == Some("hugetlbfs")
        })
    });
    let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let need = shm_file_bytes(SHM_SLOTS, SHM_SLOT_BYTES) / (2 << 20);
    if hugetlbfs && free >= need + 128 && std::env::var_os("PMD_NO_HUGEPAGES").is_none() {
        PathBuf::from("/dev/hugepages")
    } else {
        PathBuf::from("/dev/shm")
    }
}

/// Path of the file behind shared-memory wire `name`. An existing file (the other end's) is
/// found in either directory, so both ends meet even if hugepage availability changed between
/// their starts; a new one goes where [`shm_dir`] says.
pub fn shm_path(name: &str) -> PathBuf {
    let file = format!("pmd-wire-{name}");
    if std::env::var_os("PMD_SHM_DIR").is_none() {
        for dir in ["/dev/hugepages", "/dev/shm"] {
            let p = Path::new(dir).join(&file);
            if p.exists() {
                return p;
            }
        }
    }
    shm_dir().join(file)
}

/// A shared-memory cable end.
#[derive(Debug)]
pub struct Shm {
    name: String,
    path: PathBuf,
    mem: Arc<DevMem>,
    end_b: bool,
    tx: FrameRing,
    rx: FrameRing,
}

impl Shm {
    /// Opens end A (creating the file) or end B (of a file another process created).
    ///
    /// # Errors
    /// See [`WireError`]: a third live end, a foreign or incompatible file, I/O errors.
    pub fn open(name: &str) -> Result<Self, WireError> {
        Self::open_at(name, &shm_path(name))
    }

    /// As [`Shm::open`], with an explicit file path.
    ///
    /// # Errors
    /// See [`Shm::open`].
    pub fn open_at(name: &str, path: &Path) -> Result<Self, WireError> {
        let io_err = |source| WireError::Shm {
            name: name.into(),
            path: path.into(),
            source,
        };
        let bytes = shm_file_bytes(SHM_SLOTS, SHM_SLOT_BYTES);
        let me = u64::from(pid());
        for _attempt in 0..4 {
            // Creator: O_EXCL decides who is end A.
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
            {
                Ok(_) => {
                    let mem = DevMem::shared_file(path, bytes, true).map_err(io_err)?;
                    mem.write(hdr::MAJOR, &SHM_MAJOR.to_le_bytes());
                    mem.write(hdr::MINOR, &SHM_MINOR.to_le_bytes());
                    mem.write(hdr::COMPAT, &SHM_COMPAT.to_le_bytes());
                    mem.write(hdr::INCOMPAT, &0u32.to_le_bytes());
                    mem.write(hdr::SLOTS, &SHM_SLOTS.to_le_bytes());
                    mem.write(hdr::SLOT_BYTES, &SHM_SLOT_BYTES.to_le_bytes());
                    mem.store_u64(hdr::PID_A, me, Ordering::Relaxed);
                    // The signature goes last: a peer that sees it sees the whole header.
                    mem.store_u64(
                        hdr::SIGNATURE,
                        u64::from_le_bytes(SHM_SIGNATURE),
                        Ordering::Release,
                    );
                    return Ok(Self::ends(name, path, Arc::new(mem), false));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(e)),
            }
            let mem = Arc::new(Self::attach(name, path)?);
            let a = mem.load_u64(hdr::PID_A, Ordering::Acquire);
            let b = mem.load_u64(hdr::PID_B, Ordering::Acquire);
            let live = |p: u64| p != 0 && process_alive(p as u32);
            if !live(a) && !live(b) {
                // A stale file from runs that are gone: start over with a fresh cable.
                let _ = std::fs::remove_file(path);
                continue;
            }
            for (slot, holder, end_b) in [(hdr::PID_B, b, true), (hdr::PID_A, a, false)] {
                if !live(holder) && mem.compare_exchange_u64(slot, holder, me).is_ok() {
                    return Ok(Self::ends(name, path, mem, end_b));
                }
            }
            return Err(WireError::CableFull {
                name: name.into(),
                a,
                b,
            });
        }
        Err(io_err(std::io::Error::other(
            "the wire file kept changing under us",
        )))
    }

    /// Maps an existing file and checks its header.
    fn attach(name: &str, path: &Path) -> Result<DevMem, WireError> {
        let io_err = |source| WireError::Shm {
            name: name.into(),
            path: path.into(),
            source,
        };
        let deadline = Duration::from_secs(2);
        let t0 = Instant::now();
        // The creator sizes the file right after creating it; wait for that and the signature.
        loop {
            let len = std::fs::metadata(path).map_err(io_err)?.len() as usize;
            if len >= hdr::RINGS {
                let mem = DevMem::shared_file(path, hdr::RINGS, false).map_err(io_err)?;
                let sig = mem.load_u64(hdr::SIGNATURE, Ordering::Acquire);
                if sig == u64::from_le_bytes(SHM_SIGNATURE) {
                    let mut b = [0u8; 20];
                    mem.read(hdr::MAJOR, &mut b);
                    let major = u16::from_le_bytes([b[0], b[1]]);
                    let minor = u16::from_le_bytes([b[2], b[3]]);
                    let incompat = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
                    let slots = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
                    let slot_bytes = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
                    if major != SHM_MAJOR {
                        return Err(WireError::IncompatibleVersion {
                            path: path.into(),
                            theirs_major: major,
                            theirs_minor: minor,
                            ours_major: SHM_MAJOR,
                        });
                    }
                    if incompat & !SHM_INCOMPAT_KNOWN != 0 {
                        return Err(WireError::IncompatibleFeatures {
                            path: path.into(),
                            unknown: incompat & !SHM_INCOMPAT_KNOWN,
                        });
                    }
                    if slots != SHM_SLOTS || slot_bytes != SHM_SLOT_BYTES {
                        return Err(WireError::IncompatibleVersion {
                            path: path.into(),
                            theirs_major: major,
                            theirs_minor: minor,
                            ours_major: SHM_MAJOR,
                        });
                    }
                    let bytes = shm_file_bytes(slots, slot_bytes);
                    return DevMem::shared_file(path, bytes, false).map_err(io_err);
                } else if sig != 0 {
                    return Err(WireError::NotAWire { path: path.into() });
                }
            }
            if t0.elapsed() > deadline {
                return Err(WireError::Timeout {
                    path: path.into(),
                    waited: deadline,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn ends(name: &str, path: &Path, mem: Arc<DevMem>, end_b: bool) -> Self {
        let rb = ring_bytes(SHM_SLOTS, SHM_SLOT_BYTES);
        let a_to_b = FrameRing::new(Arc::clone(&mem), hdr::RINGS, SHM_SLOTS, SHM_SLOT_BYTES);
        let b_to_a = FrameRing::new(Arc::clone(&mem), hdr::RINGS + rb, SHM_SLOTS, SHM_SLOT_BYTES);
        let (tx, rx) = if end_b {
            (b_to_a, a_to_b)
        } else {
            (a_to_b, b_to_a)
        };
        tracing::debug!(target: "pmd::emu::wire", name, end_b, path = %path.display(), "shared-memory wire attached");
        Self {
            name: name.into(),
            path: path.into(),
            mem,
            end_b,
            tx,
            rx,
        }
    }

    fn peer_slot(&self) -> usize {
        if self.end_b {
            hdr::PID_A
        } else {
            hdr::PID_B
        }
    }
}

impl Wire for Shm {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.tx.push(frame)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.rx.pop(buf)
    }
    fn peer_alive(&self) -> bool {
        let p = self.mem.load_u64(self.peer_slot(), Ordering::Acquire);
        p != 0 && process_alive(p as u32)
    }
    fn describe(&self) -> String {
        format!(
            "shm:{} (end {})",
            self.name,
            if self.end_b { 'B' } else { 'A' }
        )
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let mine = if self.end_b { hdr::PID_B } else { hdr::PID_A };
        self.mem.store_u64(mine, 0, Ordering::Release);
        // The last end out removes the file.
        if self.mem.load_u64(self.peer_slot(), Ordering::Acquire) == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_shm_dir<R>(f: impl FnOnce(&Path) -> R) -> R {
        let d = tempfile::tempdir().unwrap();
        f(d.path())
    }

    #[test]
    fn shm_pairs_and_refuses_a_third_end() {
        with_shm_dir(|d| {
            let p = d.join("w");
            let mut a = Shm::open_at("w", &p).unwrap();
            // The second end comes from the same process here; liveness is by pid, and a
            // live holder of end A keeps it. End B is free, so we get it.
            let mut b = Shm::open_at("w", &p).unwrap();
            assert!(a.describe().contains("end A") && b.describe().contains("end B"));
            let mut buf = [0u8; 16];
            assert!(a.send(b"x"));
            assert_eq!(b.recv(&mut buf), Some(1));
            assert!(a.peer_alive() && b.peer_alive());
            let e = Shm::open_at("w", &p).unwrap_err();
            assert!(matches!(e, WireError::CableFull { .. }), "{e}");
            drop(b);
            assert!(!a.peer_alive(), "peer gone");
            drop(a);
            assert!(!p.exists(), "last end removes the file");
        });
    }

    #[test]
    fn shm_refuses_foreign_and_incompatible_files() {
        with_shm_dir(|d| {
            let p = d.join("foreign");
            std::fs::write(&p, vec![0xffu8; 4096]).unwrap();
            let e = Shm::open_at("foreign", &p).unwrap_err();
            assert!(
                e.to_string().contains("not a pmd shared-memory wire"),
                "{e}"
            );

            let p = d.join("v2");
            let a = Shm::open_at("v2", &p).unwrap();
            a.mem.write(hdr::MAJOR, &2u16.to_le_bytes());
            let e = Shm::open_at("v2", &p).unwrap_err();
            assert!(
                e.to_string()
                    .contains("peer uses wire format 2.0, this build speaks 1.x"),
                "{e}"
            );
            a.mem.write(hdr::MAJOR, &SHM_MAJOR.to_le_bytes());
            a.mem.write(hdr::INCOMPAT, &0x8u32.to_le_bytes());
            let e = Shm::open_at("v2", &p).unwrap_err();
            assert!(e.to_string().contains("requires wire features 0x8"), "{e}");
        });
    }

    #[test]
    fn shm_stale_file_from_dead_processes_is_replaced() {
        with_shm_dir(|d| {
            let p = d.join("stale");
            let a = Shm::open_at("stale", &p).unwrap();
            // Pretend both ends belonged to processes that died.
            a.mem
                .store_u64(hdr::PID_A, u64::from(u32::MAX - 1), Ordering::Release);
            a.mem
                .store_u64(hdr::PID_B, u64::from(u32::MAX - 2), Ordering::Release);
            a.tx.push(b"stale frame");
            std::mem::forget(a);
            let mut fresh = Shm::open_at("stale", &p).unwrap();
            assert!(fresh.describe().contains("end A"));
            let mut buf = [0u8; 32];
            assert_eq!(fresh.recv(&mut buf), None);
        });
    }
}
