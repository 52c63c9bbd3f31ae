//! [`Shm`]: a cable between processes over a shared-memory file.
//!
//! The file is a header and two [frame rings](super::ring), one per direction. The header
//! (all fields little-endian) is read through [`Header`]:
//!
//! ```text
//! +0    signature   [u8; 8]  "PMDWIRE\0"; stored last by the creator (Release), so a peer
//!                            that sees it (Acquire) sees the whole header
//! +8    major       u16      wire format major version: a peer with another major is refused
//! +10   minor       u16      minor version: compatible additions
//! +12   compat      u32      compatible feature bits the creator uses (unknown ones: ignored)
//! +16   incompat    u32      incompatible feature bits the creator uses (unknown ones: refused)
//! +20   ring_bytes  u32      bytes of records per ring (a power of two, 64 KiB to 1 GiB)
//! +24   max_frame   u32      largest frame a record carries (9208)
//! +28   reserved, zero
//! +64   pid_a       u64      process holding end A, 0 when free (claimed by compare-and-swap)
//! +72   pid_b       u64      process holding end B, 0 when free
//! +80   reserved, zero
//! +128  ring A->B            ring::ring_bytes(ring_bytes) = 128 + ring_bytes
//! +256 + ring_bytes          ring B->A
//! ```
//!
//! Version history: 1.0 had rings of fixed slots (`slots`, `slot_bytes` at +20, +24); 2.0
//! packs variable-length records (see [`super::ring`]): a 60-byte frame takes one cache line
//! instead of a 9216-byte slot, and a ring of 8 MiB holds 131,072 of them. A 1.x peer is
//! refused by the major version.
//!
//! The file is rounded up to whole 2 MiB pages so that it can live on hugetlbfs.
#![deny(unsafe_code)]

use super::ring::{ring_bytes, FrameRing};
use super::{Wire, WireError, MAX_FRAME};
use crate::sys::net::{pid, process_alive};
use crate::sys::DevMem;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Signature at the start of a shared-memory wire file.
pub const SHM_SIGNATURE: [u8; 8] = *b"PMDWIRE\0";
/// Major version: a peer with another major is refused (2: packed records, see the module
/// docs).
pub const SHM_MAJOR: u16 = 2;
/// Minor version: compatible additions.
pub const SHM_MINOR: u16 = 0;
/// Incompatible feature bits this build understands (none yet).
pub const SHM_INCOMPAT_KNOWN: u32 = 0;
/// Compatible feature bits this build sets (none yet).
pub const SHM_COMPAT: u32 = 0;

/// Bytes of records per direction: 131,072 frames of 60 bytes (about 130 ms at 1 Mpps of
/// buffering when the receiving process is not scheduled), or 910 of 9000 bytes.
pub const SHM_RING_BYTES: u32 = 8 << 20;
/// Ring sizes a peer's file may have.
const SHM_RING_RANGE: std::ops::RangeInclusive<u32> = (64 << 10)..=(1 << 30);

/// Byte ranges of the header fields (see the layout in the module docs).
mod field {
    pub type Field = std::ops::Range<usize>;

    pub const SIGNATURE: Field = 0..8;
    pub const MAJOR: Field = 8..10;
    pub const MINOR: Field = 10..12;
    pub const COMPAT: Field = 12..16;
    pub const INCOMPAT: Field = 16..20;
    pub const RING_BYTES: Field = 20..24;
    pub const MAX_FRAME: Field = 24..28;
    // 28..64 reserved.
    pub const PID_A: Field = 64..72;
    pub const PID_B: Field = 72..80;
    // 80..128 reserved.
    /// Where the first ring starts: the header's length.
    pub const RINGS: usize = 128;
}

// The words accessed atomically are 8-byte aligned (the mapping is page-aligned), every field
// lies inside the header, and the rings start on a cache line as `FrameRing` requires.
const _: () = assert!(
    field::SIGNATURE.start.is_multiple_of(8)
        && field::PID_A.start.is_multiple_of(8)
        && field::PID_B.start.is_multiple_of(8)
        && field::PID_B.end <= field::RINGS
        && field::MAX_FRAME.end <= field::PID_A.start
        && field::RINGS.is_multiple_of(64)
);

/// One end of a cable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    A,
    B,
}

impl End {
    fn peer(self) -> Self {
        match self {
            End::A => End::B,
            End::B => End::A,
        }
    }

    fn letter(self) -> char {
        match self {
            End::A => 'A',
            End::B => 'B',
        }
    }

    /// The header field that holds this end's owner pid.
    fn pid_field(self) -> field::Field {
        match self {
            End::A => field::PID_A,
            End::B => field::PID_B,
        }
    }
}

/// A typed view of the header at the start of a mapped wire file.
///
/// Like [`DevMem`] itself it hands out no references into the shared bytes: the version and
/// geometry fields are copied in and out (the creator writes them before it stores the
/// signature with Release, a peer reads them after loading the signature with Acquire), the
/// signature and the owner pids are atomic words. Once [`Header::new_checked`] has accepted
/// the mapping, no accessor can panic.
#[derive(Debug, Clone, Copy)]
struct Header<'a> {
    mem: &'a DevMem,
}

impl<'a> Header<'a> {
    /// Bytes the header occupies; the A->B ring starts here.
    const LEN: usize = field::RINGS;

    /// A view of the header at the start of `mem`, or `None` if `mem` is too short to hold
    /// one or not 8-byte aligned (the mappings [`DevMem::anon`] and [`DevMem::shared_file`]
    /// make are page-aligned).
    fn new_checked(mem: &'a DevMem) -> Option<Self> {
        (mem.len() >= Self::LEN && mem.addr().is_multiple_of(8)).then_some(Self { mem })
    }

    fn get<const N: usize>(&self, f: field::Field) -> [u8; N] {
        debug_assert_eq!(f.len(), N);
        let mut b = [0u8; N];
        self.mem.read(f.start, &mut b);
        b
    }

    fn put(&self, f: field::Field, bytes: &[u8]) {
        debug_assert_eq!(f.len(), bytes.len());
        self.mem.write(f.start, bytes);
    }

    /// The signature (Acquire: the rest of the header is visible once it reads right).
    fn signature(&self) -> [u8; 8] {
        self.mem
            .load_u64(field::SIGNATURE.start, Ordering::Acquire)
            .to_le_bytes()
    }

    /// Stores the signature (Release: publishes every header field written before it).
    fn set_signature(&self, sig: [u8; 8]) {
        self.mem.store_u64(
            field::SIGNATURE.start,
            u64::from_le_bytes(sig),
            Ordering::Release,
        );
    }

    fn major(&self) -> u16 {
        u16::from_le_bytes(self.get(field::MAJOR))
    }

    fn set_major(&self, v: u16) {
        self.put(field::MAJOR, &v.to_le_bytes());
    }

    fn minor(&self) -> u16 {
        u16::from_le_bytes(self.get(field::MINOR))
    }

    fn set_minor(&self, v: u16) {
        self.put(field::MINOR, &v.to_le_bytes());
    }

    /// Compatible feature bits the creator uses.
    fn compat(&self) -> u32 {
        u32::from_le_bytes(self.get(field::COMPAT))
    }

    fn set_compat(&self, v: u32) {
        self.put(field::COMPAT, &v.to_le_bytes());
    }

    /// Incompatible feature bits the creator uses.
    fn incompat(&self) -> u32 {
        u32::from_le_bytes(self.get(field::INCOMPAT))
    }

    fn set_incompat(&self, v: u32) {
        self.put(field::INCOMPAT, &v.to_le_bytes());
    }

    /// Bytes of records per ring.
    fn ring_bytes(&self) -> u32 {
        u32::from_le_bytes(self.get(field::RING_BYTES))
    }

    fn set_ring_bytes(&self, v: u32) {
        self.put(field::RING_BYTES, &v.to_le_bytes());
    }

    /// Largest frame a record carries.
    fn max_frame(&self) -> u32 {
        u32::from_le_bytes(self.get(field::MAX_FRAME))
    }

    fn set_max_frame(&self, v: u32) {
        self.put(field::MAX_FRAME, &v.to_le_bytes());
    }

    /// The process holding `end`, 0 when the end is free.
    fn pid(&self, end: End, order: Ordering) -> u64 {
        self.mem.load_u64(end.pid_field().start, order)
    }

    fn set_pid(&self, end: End, pid: u64, order: Ordering) {
        self.mem.store_u64(end.pid_field().start, pid, order);
    }

    /// Takes `end` for process `new` if its holder is still `current` (AcqRel).
    ///
    /// # Errors
    /// The holder found instead.
    fn claim(&self, end: End, current: u64, new: u64) -> Result<u64, u64> {
        self.mem
            .compare_exchange_u64(end.pid_field().start, current, new)
    }
}

/// Size of a wire file: header and two rings of `ring` bytes of records, rounded up to 2 MiB
/// so that the file can live on hugetlbfs (whose files are whole huge pages).
fn shm_file_bytes(ring: u32) -> usize {
    (Header::LEN + 2 * ring_bytes(ring as usize)).div_ceil(2 << 20) * (2 << 20)
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
    let need = shm_file_bytes(SHM_RING_BYTES) / (2 << 20);
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
    end: End,
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
        let bytes = shm_file_bytes(SHM_RING_BYTES);
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
                    let hdr = Header::new_checked(&mem).expect("a wire file holds its header");
                    hdr.set_major(SHM_MAJOR);
                    hdr.set_minor(SHM_MINOR);
                    hdr.set_compat(SHM_COMPAT);
                    // This build uses no incompatible feature.
                    hdr.set_incompat(0);
                    hdr.set_ring_bytes(SHM_RING_BYTES);
                    hdr.set_max_frame(MAX_FRAME as u32);
                    hdr.set_pid(End::A, me, Ordering::Relaxed);
                    // The signature goes last: a peer that sees it sees the whole header.
                    hdr.set_signature(SHM_SIGNATURE);
                    return Ok(Self::ends(name, path, Arc::new(mem), End::A));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(e)),
            }
            let mem = Arc::new(Self::attach(name, path)?);
            let hdr = Header::new_checked(&mem).expect("attach maps the whole file");
            let a = hdr.pid(End::A, Ordering::Acquire);
            let b = hdr.pid(End::B, Ordering::Acquire);
            let live = |p: u64| p != 0 && process_alive(p as u32);
            if !live(a) && !live(b) {
                // A stale file from runs that are gone: start over with a fresh cable.
                let _ = std::fs::remove_file(path);
                continue;
            }
            for (end, holder) in [(End::B, b), (End::A, a)] {
                if !live(holder) && hdr.claim(end, holder, me).is_ok() {
                    return Ok(Self::ends(name, path, mem, end));
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
            if len >= Header::LEN {
                let mem = DevMem::shared_file(path, Header::LEN, false).map_err(io_err)?;
                let hdr = Header::new_checked(&mem).expect("mapped a whole header");
                let sig = hdr.signature();
                if sig == SHM_SIGNATURE {
                    let (major, minor) = (hdr.major(), hdr.minor());
                    let incompatible_version = || WireError::IncompatibleVersion {
                        path: path.into(),
                        theirs_major: major,
                        theirs_minor: minor,
                        ours_major: SHM_MAJOR,
                    };
                    if major != SHM_MAJOR {
                        return Err(incompatible_version());
                    }
                    let unknown = hdr.incompat() & !SHM_INCOMPAT_KNOWN;
                    if unknown != 0 {
                        return Err(WireError::IncompatibleFeatures {
                            path: path.into(),
                            unknown,
                        });
                    }
                    let (ring, max_frame) = (hdr.ring_bytes(), hdr.max_frame());
                    if !ring.is_power_of_two()
                        || !SHM_RING_RANGE.contains(&ring)
                        || max_frame != MAX_FRAME as u32
                    {
                        return Err(incompatible_version());
                    }
                    let ignored = hdr.compat() & !SHM_COMPAT;
                    if ignored != 0 {
                        tracing::debug!(target: "pmd::emu::wire", path = %path.display(), ignored, "peer uses compatible wire features this build ignores");
                    }
                    let bytes = shm_file_bytes(ring);
                    return DevMem::shared_file(path, bytes, false).map_err(io_err);
                } else if sig != [0; 8] {
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

    /// The two directions of a mapped file whose header was written (end A) or checked
    /// (end B).
    fn ends(name: &str, path: &Path, mem: Arc<DevMem>, end: End) -> Self {
        let hdr = Header::new_checked(&mem).expect("a mapped wire file holds its header");
        let ring = hdr.ring_bytes() as usize;
        let a_to_b = FrameRing::new(Arc::clone(&mem), Header::LEN, ring, MAX_FRAME);
        let b_to_a = FrameRing::new(
            Arc::clone(&mem),
            Header::LEN + ring_bytes(ring),
            ring,
            MAX_FRAME,
        );
        let (tx, rx) = match end {
            End::A => (a_to_b, b_to_a),
            End::B => (b_to_a, a_to_b),
        };
        tracing::debug!(target: "pmd::emu::wire", name, end = %end.letter(), path = %path.display(), "shared-memory wire attached");
        Self {
            name: name.into(),
            path: path.into(),
            mem,
            end,
            tx,
            rx,
        }
    }

    fn header(&self) -> Header<'_> {
        Header::new_checked(&self.mem).expect("checked when the file was mapped")
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
        let p = self.header().pid(self.end.peer(), Ordering::Acquire);
        p != 0 && process_alive(p as u32)
    }
    /// The other end's pid slot holds a live process: false from the moment end A creates
    /// the file until end B claims its slot, and again once the peer closed its end or died.
    /// (For a cable between processes that is exactly [`Wire::peer_alive`].)
    fn peer_attached(&self) -> bool {
        self.peer_alive()
    }
    fn describe(&self) -> String {
        format!("shm:{} (end {})", self.name, self.end.letter())
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let hdr = self.header();
        hdr.set_pid(self.end, 0, Ordering::Release);
        // The last end out removes the file.
        if hdr.pid(self.end.peer(), Ordering::Acquire) == 0 {
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
    fn shm_peer_attached_once_the_second_end_opens_and_until_it_goes() {
        with_shm_dir(|d| {
            let p = d.join("attach");
            let a = Shm::open_at("attach", &p).unwrap();
            assert!(!a.peer_attached(), "no end B yet");
            let b = Shm::open_at("attach", &p).unwrap();
            assert!(a.peer_attached() && b.peer_attached());
            drop(b);
            assert!(!a.peer_attached(), "end B closed");
            let b = Shm::open_at("attach", &p).unwrap();
            assert!(a.peer_attached() && b.peer_attached(), "end B again");
            std::mem::forget(b);
            // End B's process dies without closing: its pid stays in the slot.
            a.header()
                .set_pid(End::B, u64::from(u32::MAX - 1), Ordering::Release);
            assert!(!a.peer_attached(), "end B's process is gone");
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

            let p = d.join("v1");
            let a = Shm::open_at("v1", &p).unwrap();
            // A 1.x peer (fixed slots) is refused by its major version.
            a.header().set_major(1);
            let e = Shm::open_at("v1", &p).unwrap_err();
            assert!(
                e.to_string()
                    .contains("peer uses wire format 1.0, this build speaks 2.x"),
                "{e}"
            );
            a.header().set_major(SHM_MAJOR);
            a.header().set_ring_bytes(3 << 20);
            let e = Shm::open_at("v1", &p).unwrap_err();
            assert!(e.to_string().contains("wire format 2.0"), "{e}");
            a.header().set_ring_bytes(SHM_RING_BYTES);
            a.header().set_incompat(0x8);
            let e = Shm::open_at("v1", &p).unwrap_err();
            assert!(e.to_string().contains("requires wire features 0x8"), "{e}");
        });
    }

    #[test]
    fn shm_stale_file_from_dead_processes_is_replaced() {
        with_shm_dir(|d| {
            let p = d.join("stale");
            let mut a = Shm::open_at("stale", &p).unwrap();
            // Pretend both ends belonged to processes that died.
            let hdr = a.header();
            hdr.set_pid(End::A, u64::from(u32::MAX - 1), Ordering::Release);
            hdr.set_pid(End::B, u64::from(u32::MAX - 2), Ordering::Release);
            a.tx.push(b"stale frame");
            std::mem::forget(a);
            let mut fresh = Shm::open_at("stale", &p).unwrap();
            assert!(fresh.describe().contains("end A"));
            let mut buf = [0u8; 32];
            assert_eq!(fresh.recv(&mut buf), None);
        });
    }

    /// A header written out by hand from the layout table in the module docs, with a distinct
    /// value in every field: signature "PMDWIRE\0", major 0x0102, minor 0x0304, compat
    /// 0x0a0b0c0d, incompat 0x1a1b1c1d, ring_bytes 1024 (0x400), max_frame 9216 (0x2400),
    /// pid_a 0x1122334455667788, pid_b 0x99aabbccddeeff00.
    #[rustfmt::skip]
    const HEADER_BYTES: [u8; 128] = [
        // +0 signature
        b'P', b'M', b'D', b'W', b'I', b'R', b'E', 0x00,
        // +8 major, +10 minor
        0x02, 0x01, 0x04, 0x03,
        // +12 compat
        0x0d, 0x0c, 0x0b, 0x0a,
        // +16 incompat
        0x1d, 0x1c, 0x1b, 0x1a,
        // +20 ring_bytes
        0x00, 0x04, 0x00, 0x00,
        // +24 max_frame
        0x00, 0x24, 0x00, 0x00,
        // +28 reserved
                                0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // +64 pid_a
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
        // +72 pid_b
        0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99,
        // +80 reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    fn header_mem() -> DevMem {
        DevMem::anon(Header::LEN).unwrap()
    }

    fn header_bytes(mem: &DevMem) -> [u8; 128] {
        let mut b = [0u8; 128];
        mem.read(0, &mut b);
        b
    }

    #[test]
    fn header_setters_write_the_documented_layout() {
        let mem = header_mem();
        let h = Header::new_checked(&mem).unwrap();
        h.set_major(0x0102);
        h.set_minor(0x0304);
        h.set_compat(0x0a0b_0c0d);
        h.set_incompat(0x1a1b_1c1d);
        h.set_ring_bytes(1024);
        h.set_max_frame(9216);
        h.set_pid(End::A, 0x1122_3344_5566_7788, Ordering::Relaxed);
        h.set_pid(End::B, 0x99aa_bbcc_ddee_ff00, Ordering::Relaxed);
        h.set_signature(SHM_SIGNATURE);
        assert_eq!(header_bytes(&mem), HEADER_BYTES);
    }

    #[test]
    fn header_getters_read_the_documented_layout() {
        let mem = header_mem();
        mem.write(0, &HEADER_BYTES);
        let h = Header::new_checked(&mem).unwrap();
        assert_eq!(h.signature(), *b"PMDWIRE\0");
        assert_eq!((h.major(), h.minor()), (0x0102, 0x0304));
        assert_eq!((h.compat(), h.incompat()), (0x0a0b_0c0d, 0x1a1b_1c1d));
        assert_eq!((h.ring_bytes(), h.max_frame()), (1024, 9216));
        assert_eq!(h.pid(End::A, Ordering::Relaxed), 0x1122_3344_5566_7788);
        assert_eq!(h.pid(End::B, Ordering::Relaxed), 0x99aa_bbcc_ddee_ff00);
    }

    #[test]
    fn header_needs_a_whole_header() {
        let short = DevMem::anon(Header::LEN - 1).unwrap();
        assert!(Header::new_checked(&short).is_none());
    }

    #[test]
    fn a_new_wire_file_starts_with_the_version_2_0_header() {
        with_shm_dir(|d| {
            let p = d.join("golden");
            let a = Shm::open_at("golden", &p).unwrap();
            let file = std::fs::read(&p).unwrap();
            // Written by hand from the layout table: version 2.0, no features, rings of
            // 8 MiB (0x00800000) of records, frames up to 9208 bytes (0x23f8), end A held by
            // this process, end B free, reserved bytes zero.
            let mut want = [0u8; 128];
            want[0..8].copy_from_slice(b"PMDWIRE\0");
            want[8..10].copy_from_slice(&[0x02, 0x00]);
            want[10..12].copy_from_slice(&[0x00, 0x00]);
            want[20..24].copy_from_slice(&[0x00, 0x00, 0x80, 0x00]);
            want[24..28].copy_from_slice(&[0xf8, 0x23, 0x00, 0x00]);
            want[64..72].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
            assert_eq!(file[..128], want);
            assert_eq!(file.len() % (2 << 20), 0, "whole 2 MiB pages");
            drop(a);
        });
    }

    proptest::proptest! {
        #[test]
        fn header_fields_round_trip_without_touching_their_neighbours(
            major: u16, minor: u16, compat: u32, incompat: u32,
            ring: u32, max_frame: u32, pid_a: u64, pid_b: u64, sig: [u8; 8],
        ) {
            let mem = header_mem();
            mem.fill(0, Header::LEN, 0xa5);
            let h = Header::new_checked(&mem).unwrap();
            h.set_signature(sig);
            h.set_major(major);
            h.set_minor(minor);
            h.set_compat(compat);
            h.set_incompat(incompat);
            h.set_ring_bytes(ring);
            h.set_max_frame(max_frame);
            h.set_pid(End::A, pid_a, Ordering::Relaxed);
            h.set_pid(End::B, pid_b, Ordering::Relaxed);
            proptest::prop_assert_eq!(h.signature(), sig);
            proptest::prop_assert_eq!((h.major(), h.minor()), (major, minor));
            proptest::prop_assert_eq!((h.compat(), h.incompat()), (compat, incompat));
            proptest::prop_assert_eq!((h.ring_bytes(), h.max_frame()), (ring, max_frame));
            proptest::prop_assert_eq!(h.pid(End::A, Ordering::Relaxed), pid_a);
            proptest::prop_assert_eq!(h.pid(End::B, Ordering::Relaxed), pid_b);
            let bytes = header_bytes(&mem);
            proptest::prop_assert!(bytes[28..64].iter().chain(&bytes[80..128]).all(|b| *b == 0xa5),
                "reserved bytes untouched");
        }
    }
}
