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
//! +64   pid_a       u64      process holding end A, 0 when free (claimed by compare-and-swap);
//!                            bit 63 set: that process is removing the file (last end out);
//!                            bit 62 set: it is taking the end (attached once it is clear)
//! +72   pid_b       u64      process holding end B, 0 when free
//! +80   generation  u64      1 when the file is made, plus one for every end attached later
//! +88   reserved, zero
//! +128  ring A->B            ring::ring_bytes(ring_bytes) = 128 + ring_bytes
//! +256 + ring_bytes          ring B->A
//! ```
//!
//! Version history: 1.0 had rings of fixed slots (`slots`, `slot_bytes` at +20, +24); 2.0
//! packs variable-length records (see [`super::ring`]): a 60-byte frame takes one cache line
//! instead of a 9216-byte slot, and a ring of 8 MiB holds 131,072 of them. A 1.x peer is
//! refused by the major version. 2.1 adds `generation` and the closing and attaching bits (a
//! 2.0 peer sees such an end as live: it keeps it from taking that end, and may let it see
//! the link up a moment early).
//!
//! The file is rounded up to whole 2 MiB pages so that it can live on hugetlbfs.
//!
//! Life of a file (all of it on the control path; the bursts only touch the rings):
//!
//! * Made whole, then named: the first end builds it under a temporary name
//!   (`.pmd-wire-NAME.PID.N.tmp`), allocates all its memory (fallocate(2): a hugetlbfs without
//!   pages for it says so here, not with a SIGBUS later), writes the header and links it in
//!   under `pmd-wire-NAME`; a process that loses that race joins the winner's file. A file
//!   under the wire's name always has its header; one without (an older build's, or not
//!   ours) is refused with an error that names it and says how to remove it.
//! * Hugepages, else normal pages: when the hugetlbfs directory cannot take the file (too
//!   few free pages, a hugetlb cgroup limit, no permission), it goes to `/dev/shm`, with one
//!   warning per process. Both ends look in both places.
//! * Ends are held by pid: an end whose process is gone (SIGKILL, a panic that aborts) is
//!   free to take, so is a file whose two holders are both gone (a stale file). Taking an
//!   end starts a new generation: the frames waiting for it were sent to the previous
//!   holder, or to nobody, and are discarded unread, counted as `rx_stale`.
//! * The last end out removes the file: when the other end is free or its process is gone.
#![deny(unsafe_code)]

use super::ring::{ring_bytes, FrameRing};
use super::{Wire, WireError, MAX_FRAME};
use crate::ethdev::{Loss, Xstat};
use crate::sys::net::{pid, process_alive};
use crate::sys::DevMem;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Signature at the start of a shared-memory wire file.
pub const SHM_SIGNATURE: [u8; 8] = *b"PMDWIRE\0";
/// Major version: a peer with another major is refused (2: packed records, see the module
/// docs).
pub const SHM_MAJOR: u16 = 2;
/// Minor version: compatible additions (1: the generation word and the closing bit).
pub const SHM_MINOR: u16 = 1;
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
    pub const GENERATION: Field = 80..88;
    // 88..128 reserved.
    /// Where the first ring starts: the header's length.
    pub const RINGS: usize = 128;
}

// The words accessed atomically are 8-byte aligned (the mapping is page-aligned), every field
// lies inside the header, and the rings start on a cache line as `FrameRing` requires.
const _: () = assert!(
    field::SIGNATURE.start.is_multiple_of(8)
        && field::PID_A.start.is_multiple_of(8)
        && field::PID_B.start.is_multiple_of(8)
        && field::GENERATION.start.is_multiple_of(8)
        && field::GENERATION.end <= field::RINGS
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

    /// How many times an end was attached (1 when the file is made; each end taken later
    /// adds one).
    fn generation(&self, order: Ordering) -> u64 {
        self.mem.load_u64(field::GENERATION.start, order)
    }

    fn set_generation(&self, v: u64, order: Ordering) {
        self.mem.store_u64(field::GENERATION.start, v, order);
    }

    /// Adds one to the generation (compare-and-swap); the new value.
    fn next_generation(&self) -> u64 {
        let mut g = self.generation(Ordering::Acquire);
        loop {
            match self
                .mem
                .compare_exchange_u64(field::GENERATION.start, g, g.wrapping_add(1))
            {
                Ok(_) => return g.wrapping_add(1),
                Err(now) => g = now,
            }
        }
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

/// Where normal shared memory is: the fallback of a hugetlbfs directory.
const DEV_SHM: &str = "/dev/shm";
/// Where hugetlbfs is usually mounted.
const DEV_HUGEPAGES: &str = "/dev/hugepages";

/// Whether `dir` lies on a hugetlbfs mount (the longest mount point of /proc/mounts that
/// contains it is one).
fn on_hugetlbfs(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return false;
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let at = Path::new(f.nth(1)?);
            Some((at, f.next()?))
        })
        .filter(|(at, _)| dir.starts_with(at))
        .max_by_key(|(at, _)| at.as_os_str().len())
        .is_some_and(|(_, fs)| fs == "hugetlbfs")
}

/// Whether `/dev/hugepages` is a hugetlbfs mount with room for a wire and headroom (2 MiB
/// pages: fewer TLB misses per frame) and `PMD_NO_HUGEPAGES` is not set.
fn hugepages_usable() -> bool {
    if std::env::var_os("PMD_NO_HUGEPAGES").is_some() || !on_hugetlbfs(Path::new(DEV_HUGEPAGES)) {
        return false;
    }
    let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(0);
    free >= shm_file_bytes(SHM_RING_BYTES) / (2 << 20) + 128
}

/// One place a wire file may be: where a peer looks for it, and whether a new one may be
/// made there.
#[derive(Debug, Clone)]
struct Place {
    path: PathBuf,
    create: bool,
}

/// The places of wire `name`'s file, in order. Both ends look in all of them, so they meet
/// whichever one the first end could use:
///
/// * `PMD_SHM_DIR=DIR`: `DIR`; when `DIR` is on hugetlbfs, `/dev/shm` after it (the fallback
///   when its huge pages cannot be had). A directory that is not on hugetlbfs has no
///   fallback: the user chose it, an error says what is wrong with it.
/// * otherwise `/dev/hugepages` (new files only when [`hugepages_usable`]), then `/dev/shm`.
fn places(name: &str) -> Vec<Place> {
    let file = format!("pmd-wire-{name}");
    let mut out = Vec::new();
    if let Some(d) = std::env::var_os("PMD_SHM_DIR") {
        let d = PathBuf::from(d);
        let fallback = on_hugetlbfs(&d) && d != Path::new(DEV_SHM);
        out.push(Place {
            path: d.join(&file),
            create: true,
        });
        if fallback {
            out.push(Place {
                path: Path::new(DEV_SHM).join(&file),
                create: true,
            });
        }
    } else {
        out.push(Place {
            path: Path::new(DEV_HUGEPAGES).join(&file),
            create: hugepages_usable(),
        });
        out.push(Place {
            path: Path::new(DEV_SHM).join(&file),
            create: true,
        });
    }
    out
}

/// Directory where a new shared-memory wire file goes first: `PMD_SHM_DIR` if set; else
/// `/dev/hugepages` when it is a hugetlbfs mount with room for a wire and headroom; else
/// `/dev/shm`. (When the file cannot be made on hugepages after all, it goes to `/dev/shm`:
/// see [`Shm::open`].)
pub fn shm_dir() -> PathBuf {
    let p = places("x");
    let first = p.iter().find(|p| p.create).unwrap_or(&p[0]);
    first
        .path
        .parent()
        .map_or_else(|| PathBuf::from(DEV_SHM), Path::to_path_buf)
}

/// Path of the file behind shared-memory wire `name`: an existing one (the other end's),
/// wherever [`Shm::open`] looks; else where a new one would go first.
pub fn shm_path(name: &str) -> PathBuf {
    let p = places(name);
    if let Some(found) = p.iter().find(|p| p.path.exists()) {
        return found.path.clone();
    }
    p.iter().find(|p| p.create).unwrap_or(&p[0]).path.clone()
}

/// Bit 63 of a pid slot: the process in the low bits is removing the file (it was the last
/// end out). A newcomer that sees it while that process lives steps back and starts over.
const CLOSING: u64 = 1 << 63;

/// Bit 62 of a pid slot: the process in the low bits is taking the end and discarding what
/// waits for it; its peer sees the link up only once the plain pid is stored, so that no
/// frame sent after the link came up is taken for a stale one.
const ATTACHING: u64 = 1 << 62;

/// Who holds an end, from its pid slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// Nobody (0).
    Free,
    /// A live process.
    Live,
    /// A live process that is removing the file.
    Closing,
    /// A live process that is taking the end (not attached yet).
    Attaching,
    /// A process that is gone (or a slot that holds no pid of this machine).
    Dead,
}

fn holder(slot: u64) -> Holder {
    let alive = |p: u64| u32::try_from(p).is_ok_and(process_alive);
    if slot == 0 {
        Holder::Free
    } else if slot & CLOSING != 0 {
        if alive(slot & !CLOSING) {
            Holder::Closing
        } else {
            Holder::Dead
        }
    } else if slot & ATTACHING != 0 {
        if alive(slot & !ATTACHING) {
            Holder::Attaching
        } else {
            Holder::Dead
        }
    } else if alive(slot) {
        Holder::Live
    } else {
        Holder::Dead
    }
}

/// The file's identity (device, inode), to tell whether a name still refers to the file we
/// mapped.
fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// Where a new file is built before it is linked in under its name, complete: in the same
/// directory, named after the wire, this process and the attempt
/// (`.pmd-wire-NAME.PID.N.tmp`), so that two threads of one process building the same wire
/// never share a temporary file.
fn temp_path(path: &Path, pid: u32) -> PathBuf {
    static ATTEMPT: AtomicU64 = AtomicU64::new(0);
    let n = ATTEMPT.fetch_add(1, Ordering::Relaxed);
    let file = path
        .file_name()
        .map_or_else(|| "pmd-wire".into(), |f| f.to_string_lossy().into_owned());
    path.with_file_name(format!(".{file}.{pid}.{n}.tmp"))
}

/// Removes the temporary files of `path` (see [`temp_path`]) left by processes that died
/// while building one.
fn sweep_temps(path: &Path) {
    let (Some(dir), Some(file)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!(".{}.", file.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = n
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
            .and_then(|r| r.split('.').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the temporary name of a wire file when dropped, whether the file was linked in
/// under its real name (which keeps it) or the attempt failed half-way (which frees it): a
/// half-built wire file never outlives the attempt that built it.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What one attempt to open a cable end came to.
enum Attempt {
    Done(Box<Shm>),
    /// The file changed under us (removed, being removed, or another process made it
    /// first): look again.
    Again,
}

/// Once per process: the warning that wires fell back from hugepages to normal memory.
static FALLBACK_WARNED: std::sync::Once = std::sync::Once::new();

/// A shared-memory cable end.
#[derive(Debug)]
pub struct Shm {
    name: String,
    path: PathBuf,
    /// (device, inode) of the file mapped, to check the name before removing it.
    file_id: (u64, u64),
    mem: Arc<DevMem>,
    end: End,
    tx: FrameRing,
    rx: FrameRing,
    /// Frames discarded unread when this end was attached (sent before it was: a stale
    /// generation); reported as `rx_stale`.
    rx_stale: u64,
}

impl Shm {
    /// Opens end A (creating the file) or end B (of a file another process created).
    ///
    /// The file is looked for where [`shm_path`] says; a new one is built under a temporary
    /// name and linked in once its header is complete, so a file under the wire's name is
    /// always whole. When a hugetlbfs directory has no huge pages for it (too few reserved,
    /// a hugetlb cgroup limit, no permission), it goes to `/dev/shm` instead, with one
    /// warning per process. A file whose ends both belong to processes that are gone is
    /// taken over. An end taken over (its holder died) starts a new generation: the frames
    /// sent to the old holder are discarded unread and counted (`rx_stale`).
    ///
    /// # Errors
    /// See [`WireError`]: a third live end, a foreign, incompatible or half-made file (the
    /// error names it and says how to remove it), I/O errors.
    pub fn open(name: &str) -> Result<Self, WireError> {
        Self::open_places(name, &places(name))
    }

    /// As [`Shm::open`], with an explicit file path (no fallback).
    ///
    /// # Errors
    /// See [`Shm::open`].
    pub fn open_at(name: &str, path: &Path) -> Result<Self, WireError> {
        Self::open_places(
            name,
            &[Place {
                path: path.into(),
                create: true,
            }],
        )
    }

    fn open_places(name: &str, places: &[Place]) -> Result<Self, WireError> {
        let me = pid();
        for _attempt in 0..64 {
            let attempt = match places.iter().find(|p| p.path.exists()) {
                Some(found) => Self::join(name, &found.path, me)?,
                None => Self::create_first(name, places, me)?,
            };
            match attempt {
                Attempt::Done(shm) => return Ok(*shm),
                Attempt::Again => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        Err(WireError::Shm {
            name: name.into(),
            path: places[0].path.clone(),
            source: std::io::Error::other("the wire file kept changing under us"),
        })
    }

    /// Makes a new file in the first place that takes one, falling back from a hugetlbfs
    /// place to the next with one warning.
    fn create_first(name: &str, places: &[Place], me: u32) -> Result<Attempt, WireError> {
        let creatable: Vec<&Place> = places.iter().filter(|p| p.create).collect();
        let mut last = None;
        for (i, place) in creatable.iter().enumerate() {
            match Self::create(name, &place.path, me) {
                // Made in a fallback place: if meanwhile another process made the file in a
                // place before it (it took the hugepages this one found gone), the two would
                // never meet: give ours up and join that one.
                Ok(Attempt::Done(shm))
                    if i > 0 && creatable[..i].iter().any(|p| p.path.exists()) =>
                {
                    drop(shm);
                    return Ok(Attempt::Again);
                }
                Ok(a) => return Ok(a),
                Err(e) => {
                    if let Some(next) = creatable.get(i + 1) {
                        let (from, to) = (place.path.display(), next.path.display());
                        let why = match &e {
                            WireError::Shm { source, .. } => source.to_string(),
                            other => other.to_string(),
                        };
                        let mut first = false;
                        FALLBACK_WARNED.call_once(|| {
                            first = true;
                            tracing::warn!(target: "pmd::emu::wire",
                                "shared-memory wire '{name}': no hugepages for {from} ({why}); \
                                 using {to} (normal pages) instead. Reserve hugepages \
                                 (vm.nr_hugepages) or set PMD_NO_HUGEPAGES=1 to go there \
                                 directly; this is reported once.");
                        });
                        if !first {
                            tracing::debug!(target: "pmd::emu::wire", name, from = %from, to = %to, error = %e, "wire file falls back to normal pages");
                        }
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| WireError::Shm {
            name: name.into(),
            path: places[0].path.clone(),
            source: std::io::Error::other("no directory to create the wire file in"),
        }))
    }

    /// Builds a new file (end A held by us) under a temporary name, with all its memory
    /// allocated and its header complete, then links it in under `path`. `Again` when
    /// another process linked its own first.
    fn create(name: &str, path: &Path, me: u32) -> Result<Attempt, WireError> {
        let io_err = |source| WireError::Shm {
            name: name.into(),
            path: path.into(),
            source,
        };
        sweep_temps(path);
        let tmp = temp_path(path, me);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err)?;
        let guard = RemoveOnDrop(Some(tmp.clone()));
        let bytes = shm_file_bytes(SHM_RING_BYTES);
        crate::sys::mem::allocate_file(&file, bytes).map_err(io_err)?;
        let mem = DevMem::map_file(&file, bytes).map_err(io_err)?;
        let hdr = Header::new_checked(&mem).expect("a wire file holds its header");
        hdr.set_major(SHM_MAJOR);
        hdr.set_minor(SHM_MINOR);
        hdr.set_compat(SHM_COMPAT);
        // This build uses no incompatible feature.
        hdr.set_incompat(0);
        hdr.set_ring_bytes(SHM_RING_BYTES);
        hdr.set_max_frame(MAX_FRAME as u32);
        hdr.set_pid(End::A, u64::from(me), Ordering::Relaxed);
        hdr.set_generation(1, Ordering::Relaxed);
        // The signature goes last: a peer that sees it sees the whole header.
        hdr.set_signature(SHM_SIGNATURE);
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(Attempt::Again),
            Err(e) => return Err(io_err(e)),
        }
        drop(guard);
        let id = identity(&file.metadata().map_err(io_err)?);
        Ok(Attempt::Done(Box::new(Self::ends(
            name,
            path,
            id,
            Arc::new(mem),
            End::A,
            SHM_RING_BYTES,
        ))))
    }

    /// Maps an existing file, checks its header and takes a free end (or one whose holder
    /// is gone).
    fn join(name: &str, path: &Path, me: u32) -> Result<Attempt, WireError> {
        let io_err = |source| WireError::Shm {
            name: name.into(),
            path: path.into(),
            source,
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Attempt::Again),
            Err(e) => return Err(io_err(e)),
        };
        let id = identity(&file.metadata().map_err(io_err)?);
        let ring = Self::check_header(name, path, &file)?;
        let mem = Arc::new(DevMem::map_file(&file, shm_file_bytes(ring)).map_err(io_err)?);
        let hdr = Header::new_checked(&mem).expect("join maps the whole file");
        let me = u64::from(me);
        let (a, b) = (
            hdr.pid(End::A, Ordering::Acquire),
            hdr.pid(End::B, Ordering::Acquire),
        );
        let (ha, hb) = (holder(a), holder(b));
        if ha == Holder::Closing || hb == Holder::Closing {
            // Its last end is removing it: wait for that and make a new one.
            return Ok(Attempt::Again);
        }
        let mut mine = None;
        for (end, slot, h) in [(End::B, b, hb), (End::A, a, ha)] {
            if matches!(h, Holder::Free | Holder::Dead)
                && hdr.claim(end, slot, ATTACHING | me).is_ok()
            {
                mine = Some(end);
                break;
            }
        }
        let Some(end) = mine else {
            let held = |h| matches!(h, Holder::Live | Holder::Attaching);
            if held(ha) && held(hb) {
                // The pids, without the state bits of a slot being claimed.
                return Err(WireError::CableFull {
                    name: name.into(),
                    a: a & !(CLOSING | ATTACHING),
                    b: b & !(CLOSING | ATTACHING),
                });
            }
            // A slot changed between reading and claiming it.
            return Ok(Attempt::Again);
        };
        // Claim, then look at the other end (a closing end does the reverse: whichever goes
        // second sees the other; SeqCst orders each side's store before its load).
        std::sync::atomic::fence(Ordering::SeqCst);
        let other = hdr.pid(end.peer(), Ordering::SeqCst);
        let renamed = std::fs::metadata(path).map_or(true, |m| identity(&m) != id);
        if holder(other) == Holder::Closing || renamed {
            let _ = hdr.claim(end, ATTACHING | me, 0);
            return Ok(Attempt::Again);
        }
        let generation = hdr.next_generation();
        let mut shm = Self::ends(name, path, id, mem, end, ring);
        // Whatever waits for this end was sent to its previous holder (dead, or gone with
        // its frames unread) or before anyone held it: a stale generation, not ours. The
        // peer sees the link up (our plain pid) only after that.
        shm.rx_stale = shm.rx.discard_all();
        shm.header().set_pid(end, me, Ordering::Release);
        if shm.rx_stale > 0 {
            tracing::info!(target: "pmd::emu::wire", name, end = %end.letter(), generation, discarded = shm.rx_stale,
                "shared-memory wire: frames sent before this end was attached discarded (rx_stale)");
        }
        Ok(Attempt::Done(Box::new(shm)))
    }

    /// Checks the header of an existing file; the size of its rings.
    fn check_header(name: &str, path: &Path, file: &std::fs::File) -> Result<u32, WireError> {
        let io_err = |source| WireError::Shm {
            name: name.into(),
            path: path.into(),
            source,
        };
        // Files of this build are linked in whole; an older build's creator may still be
        // writing its header: give it a moment before calling the file half-made.
        let deadline = Duration::from_millis(500);
        let t0 = Instant::now();
        loop {
            let len = file.metadata().map_err(io_err)?.len() as usize;
            if len >= Header::LEN {
                // A copy of the header, read (not mapped: on hugetlbfs a 128-byte mapping
                // covers a whole huge page that memmap2 cannot unmap with the length it
                // asked for, and would keep the file's pages alive).
                let mut bytes = [0u8; Header::LEN];
                std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, 0).map_err(io_err)?;
                let mem = DevMem::anon(Header::LEN).map_err(io_err)?;
                mem.write(0, &bytes);
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
                    return Ok(ring);
                } else if sig != [0; 8] {
                    return Err(WireError::NotAWire { path: path.into() });
                }
            }
            if t0.elapsed() > deadline {
                return Err(WireError::HalfMade {
                    name: name.into(),
                    path: path.into(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The two directions of a mapped file whose header was written (end A) or checked
    /// (end B).
    /// `ring`: the ring size the header was written with (end A) or checked to hold (end
    /// B), never read again from memory the peer can write.
    fn ends(
        name: &str,
        path: &Path,
        file_id: (u64, u64),
        mem: Arc<DevMem>,
        end: End,
        ring: u32,
    ) -> Self {
        let ring = ring as usize;
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
            file_id,
            mem,
            end,
            tx,
            rx,
            rx_stale: 0,
        }
    }

    fn header(&self) -> Header<'_> {
        Header::new_checked(&self.mem).expect("checked when the file was mapped")
    }

    /// The file behind this end.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Wire for Shm {
    fn send(&mut self, frame: &[u8]) -> bool {
        self.tx.push(frame)
    }
    /// Publishes what was sent since the last flush: one store the peer sees, per burst.
    fn flush(&mut self) {
        self.tx.publish();
    }
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        self.rx.pop(buf)
    }
    fn peer_alive(&self) -> bool {
        holder(self.header().pid(self.end.peer(), Ordering::Acquire)) == Holder::Live
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
    /// `rx_ring_corrupt`, `tx_ring_corrupt`: times the peer broke a ring's rules
    /// ([`FrameRing::corrupt`]). `rx_stale`: frames discarded unread when this end was attached, because they were
    /// sent before it was (to a previous holder that died, or to nobody). `tx_stranded`:
    /// frames this end sent that wait on the cable while no far end is attached (it went
    /// away, or never came): nobody reads them (a new far end discards them as its
    /// `rx_stale`), so they are lost with the cable; 0 while the far end is attached.
    fn stats(&self) -> Vec<Xstat> {
        let stranded = if self.peer_attached() {
            0
        } else {
            self.tx.unread_frames()
        };
        vec![
            // The far end's `tx_stranded` when it went away: counted there.
            Xstat::new("rx_stale", self.rx_stale, Loss::Counted),
            Xstat::new(TX_STRANDED, stranded, Loss::Tx),
            // The peer broke the rings' rules (see `FrameRing::corrupt`): events, not frames.
            Xstat::new("rx_ring_corrupt", self.rx.corrupt(), Loss::None),
            Xstat::new("tx_ring_corrupt", self.tx.corrupt(), Loss::None),
        ]
    }
}

/// The [`Wire::stats`] entry of a cable end for frames sent that no far end will read.
pub const TX_STRANDED: &str = "tx_stranded";

impl Drop for Shm {
    /// Gives the end up; the last end out (the other one free, closing too, or its process
    /// gone) removes the file.
    fn drop(&mut self) {
        // Frames sent and not yet flushed still go; frames taken are known as taken.
        self.tx.publish();
        self.rx.publish_consumed();
        let hdr = self.header();
        let me = u64::from(pid());
        let peer_end = self.end.peer();
        // Mark this end as going first, then look at the other: of two ends closing at once
        // each sees the other closing (SeqCst orders each side's store before its load), so
        // one of them removes the file; a newcomer claims and then looks, so either it sees
        // us closing (and starts over) or we see it attaching (and leave the file to it).
        hdr.set_pid(self.end, CLOSING | me, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let peer = hdr.pid(peer_end, Ordering::SeqCst);
        let last = match holder(peer) {
            Holder::Live | Holder::Attaching => false,
            // Free it, unless a newcomer takes it this very moment.
            Holder::Dead => hdr.claim(peer_end, peer, 0).is_ok(),
            Holder::Closing | Holder::Free => true,
        };
        if last && std::fs::metadata(&self.path).is_ok_and(|m| identity(&m) == self.file_id) {
            match std::fs::remove_file(&self.path) {
                Ok(()) => return,
                // The other closing end removed it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) => tracing::warn!(target: "pmd::emu::wire",
                    "shared-memory wire '{}': could not remove {} ({e}); remove it by hand \
                     (rm -f {})", self.name, self.path.display(), self.path.display()),
            }
        }
        // The file stays (the peer holds it, or it could not be removed): our end is free.
        hdr.set_pid(self.end, 0, Ordering::Release);
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
            a.flush();
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

    /// Frames the far end took before it closed are not stranded, even those it had not
    /// published as taken yet (it publishes lazily); those it never took are.
    #[test]
    fn frames_the_closing_end_took_are_not_stranded() {
        with_shm_dir(|d| {
            let p = d.join("strand");
            let mut a = Shm::open_at("strand", &p).unwrap();
            let mut b = Shm::open_at("strand", &p).unwrap();
            let stranded = |a: &Shm| {
                a.stats()
                    .into_iter()
                    .find(|x| x.name == TX_STRANDED)
                    .map(|x| x.value)
            };
            for i in 0..10u8 {
                assert!(a.send(&[i; 60]));
            }
            a.flush();
            assert_eq!(stranded(&a), Some(0), "a far end is attached");
            let mut buf = [0u8; 64];
            for _ in 0..4 {
                assert_eq!(b.recv(&mut buf), Some(60));
            }
            drop(b);
            assert_eq!(stranded(&a), Some(6), "the 6 end B never took");
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
            a.header().set_pid(End::B, DEAD, Ordering::Release);
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
            a.header().set_minor(0);
            let e = Shm::open_at("v1", &p).unwrap_err();
            assert!(
                e.to_string()
                    .contains("peer uses wire format 1.0, this build speaks 2.x"),
                "{e}"
            );
            assert!(
                e.to_string().contains(&format!("rm -f {}", p.display())),
                "{e}"
            );
            a.header().set_major(SHM_MAJOR);
            a.header().set_minor(SHM_MINOR);
            a.header().set_ring_bytes(3 << 20);
            let e = Shm::open_at("v1", &p).unwrap_err();
            assert!(e.to_string().contains("wire format 2.1"), "{e}");
            a.header().set_ring_bytes(SHM_RING_BYTES);
            a.header().set_incompat(0x8);
            let e = Shm::open_at("v1", &p).unwrap_err();
            assert!(e.to_string().contains("requires wire features 0x8"), "{e}");
        });
    }

    /// A pid no process has (pids stop well below it).
    const DEAD: u64 = u32::MAX as u64 - 1;

    fn stale(w: &Shm) -> u64 {
        w.stats()
            .iter()
            .find(|x| x.name == "rx_stale")
            .map(|x| x.value)
            .expect("rx_stale is always reported")
    }

    #[test]
    fn shm_stale_file_from_dead_processes_is_taken_over_without_its_frames() {
        with_shm_dir(|d| {
            let p = d.join("stale");
            let mut a = Shm::open_at("stale", &p).unwrap();
            // Pretend both ends belonged to processes that died.
            let hdr = a.header();
            hdr.set_pid(End::A, DEAD, Ordering::Release);
            hdr.set_pid(End::B, DEAD - 1, Ordering::Release);
            assert!(a.tx.push(b"stale frame"));
            a.tx.publish();
            std::mem::forget(a);
            let mut fresh = Shm::open_at("stale", &p).unwrap();
            let mut buf = [0u8; 32];
            assert_eq!(fresh.recv(&mut buf), None);
            assert_eq!(stale(&fresh), 1, "the old frame is counted, not delivered");
            let mut other = Shm::open_at("stale", &p).unwrap();
            assert!(fresh.peer_attached() && other.peer_attached());
            assert_eq!(stale(&other), 0);
            assert!(other.send(b"new"));
            other.flush();
            assert_eq!(fresh.recv(&mut buf), Some(3));
            drop((fresh, other));
            assert!(!p.exists(), "the last end out removes the taken-over file");
        });
    }

    #[test]
    fn a_new_attachment_starts_a_new_generation_without_the_old_frames() {
        with_shm_dir(|d| {
            let p = d.join("gen");
            let mut a = Shm::open_at("gen", &p).unwrap();
            assert_eq!(a.header().generation(Ordering::Acquire), 1);
            // Sent before anyone is at the other end.
            for _ in 0..3 {
                assert!(a.send(&[1u8; 60]));
                a.flush();
            }
            let mut b = Shm::open_at("gen", &p).unwrap();
            let mut buf = [0u8; 64];
            assert_eq!(b.recv(&mut buf), None, "frames sent to nobody are stale");
            assert_eq!(stale(&b), 3);
            assert_eq!(a.header().generation(Ordering::Acquire), 2);
            assert!(a.send(&[2u8; 60]));
            a.flush();
            assert_eq!(b.recv(&mut buf), Some(60));
            assert_eq!(buf[0], 2, "frames sent while attached arrive");
            // End B's process dies without closing (SIGKILL): its pid stays in the slot.
            b.header().set_pid(End::B, DEAD, Ordering::Release);
            std::mem::forget(b);
            assert!(!a.peer_attached());
            for _ in 0..2 {
                assert!(a.send(&[3u8; 60]));
                a.flush();
            }
            let mut b2 = Shm::open_at("gen", &p).unwrap();
            assert!(b2.describe().contains("end B"), "{}", b2.describe());
            assert_eq!(
                b2.recv(&mut buf),
                None,
                "frames sent to the dead holder are stale"
            );
            assert_eq!(stale(&b2), 2);
            assert_eq!(a.header().generation(Ordering::Acquire), 3);
            assert!(a.send(&[4u8; 60]));
            a.flush();
            assert_eq!(b2.recv(&mut buf), Some(60));
            assert_eq!(buf[0], 4);
            // What the dead holder sent while it lived still reaches the live end.
            assert!(b2.send(&[5u8; 60]));
            b2.flush();
            assert_eq!(a.recv(&mut buf), Some(60));
            assert_eq!(stale(&a), 0);
        });
    }

    #[test]
    fn the_last_end_out_removes_the_file_also_when_the_other_died() {
        with_shm_dir(|d| {
            let p = d.join("last");
            let a = Shm::open_at("last", &p).unwrap();
            let b = Shm::open_at("last", &p).unwrap();
            b.header().set_pid(End::B, DEAD, Ordering::Release);
            std::mem::forget(b);
            drop(a);
            assert!(!p.exists(), "a dead peer does not keep the file");
            assert_eq!(
                std::fs::read_dir(d).unwrap().count(),
                0,
                "no temporary file left either"
            );
        });
    }

    #[test]
    fn of_two_ends_closing_at_once_one_removes_the_file() {
        with_shm_dir(|d| {
            let p = d.join("both");
            let a = Shm::open_at("both", &p).unwrap();
            let b = Shm::open_at("both", &p).unwrap();
            // B has marked itself closing and is about to look at A: A, closing now, must
            // not leave the file to B (which may have seen A still live and backed off).
            b.header()
                .set_pid(End::B, CLOSING | u64::from(pid()), Ordering::SeqCst);
            std::mem::forget(b);
            drop(a);
            assert!(!p.exists(), "a closing peer does not keep the file");
            // A live peer does.
            let a = Shm::open_at("both", &p).unwrap();
            let b = Shm::open_at("both", &p).unwrap();
            drop(a);
            assert!(p.exists(), "the live end keeps it");
            drop(b);
            assert!(!p.exists(), "the last end out removes it");
        });
    }

    #[test]
    fn a_half_made_file_is_refused_with_its_name_and_how_to_remove_it() {
        with_shm_dir(|d| {
            // What a run of an older build that died while creating the file left: the
            // full size, no header.
            let p = d.join("pmd-wire-half");
            std::fs::write(&p, vec![0u8; 4 << 20]).unwrap();
            let e = Shm::open_at("half", &p).unwrap_err();
            assert!(matches!(e, WireError::HalfMade { .. }), "{e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("rm -f {}", p.display())), "{msg}");
            assert!(msg.contains("has no header"), "{msg}");
            std::fs::remove_file(&p).unwrap();
            let a = Shm::open_at("half", &p).unwrap();
            assert!(a.describe().contains("end A"), "works once removed");
        });
    }

    #[test]
    fn a_file_that_cannot_be_made_leaves_nothing_and_falls_back_to_the_next_place() {
        with_shm_dir(|d| {
            // The first place cannot take a file (its directory is a regular file), the
            // second can.
            std::fs::write(d.join("notadir"), b"").unwrap();
            let bad = d.join("notadir").join("pmd-wire-fb");
            let good = d.join("pmd-wire-fb");
            let places = [
                Place {
                    path: bad.clone(),
                    create: true,
                },
                Place {
                    path: good.clone(),
                    create: true,
                },
            ];
            let a = Shm::open_places("fb", &places).unwrap();
            assert_eq!(a.path(), good);
            // The other end finds it there too.
            let b = Shm::open_places("fb", &places).unwrap();
            assert!(b.describe().contains("end B"));
            drop((a, b));
            // With no place left to fall back to, the error names the file.
            let e = Shm::open_places("fb", &places[..1]).unwrap_err();
            assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
            let left: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                left,
                vec![std::ffi::OsString::from("notadir")],
                "nothing half-made"
            );
        });
    }

    #[test]
    fn a_temporary_file_of_a_dead_creator_is_swept() {
        with_shm_dir(|d| {
            let p = d.join("pmd-wire-sweep");
            let dead = temp_path(&p, DEAD as u32);
            std::fs::write(&dead, b"").unwrap();
            let a = Shm::open_at("sweep", &p).unwrap();
            assert!(!dead.exists(), "the dead creator's temporary file is gone");
            let left: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                left,
                vec![std::ffi::OsString::from("pmd-wire-sweep")],
                "ours was linked in and its temporary name removed"
            );
            drop(a);
        });
    }

    #[test]
    fn holders_by_pid_slot() {
        let me = u64::from(pid());
        assert_eq!(holder(0), Holder::Free);
        assert_eq!(holder(me), Holder::Live);
        assert_eq!(holder(DEAD), Holder::Dead);
        assert_eq!(holder(CLOSING | me), Holder::Closing);
        assert_eq!(holder(CLOSING | DEAD), Holder::Dead);
        assert_eq!(holder(ATTACHING | me), Holder::Attaching);
        assert_eq!(holder(ATTACHING | DEAD), Holder::Dead);
        assert_eq!(holder(1 << 40), Holder::Dead, "not a pid");
    }

    /// A header written out by hand from the layout table in the module docs, with a distinct
    /// value in every field: signature "PMDWIRE\0", major 0x0102, minor 0x0304, compat
    /// 0x0a0b0c0d, incompat 0x1a1b1c1d, ring_bytes 1024 (0x400), max_frame 9216 (0x2400),
    /// pid_a 0x1122334455667788, pid_b 0x99aabbccddeeff00, generation 0x0123456789abcdef.
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
        // +80 generation
        0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01,
        // +88 reserved
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
        h.set_generation(0x0123_4567_89ab_cdef, Ordering::Relaxed);
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
        assert_eq!(h.generation(Ordering::Relaxed), 0x0123_4567_89ab_cdef);
    }

    #[test]
    fn header_needs_a_whole_header() {
        let short = DevMem::anon(Header::LEN - 1).unwrap();
        assert!(Header::new_checked(&short).is_none());
    }

    #[test]
    fn a_new_wire_file_starts_with_the_version_2_1_header() {
        with_shm_dir(|d| {
            let p = d.join("golden");
            let a = Shm::open_at("golden", &p).unwrap();
            let file = std::fs::read(&p).unwrap();
            // Written by hand from the layout table: version 2.1, no features, rings of
            // 8 MiB (0x00800000) of records, frames up to 9208 bytes (0x23f8), end A held by
            // this process, end B free, generation 1, reserved bytes zero.
            let mut want = [0u8; 128];
            want[0..8].copy_from_slice(b"PMDWIRE\0");
            want[8..10].copy_from_slice(&[0x02, 0x00]);
            want[10..12].copy_from_slice(&[0x01, 0x00]);
            want[20..24].copy_from_slice(&[0x00, 0x00, 0x80, 0x00]);
            want[24..28].copy_from_slice(&[0xf8, 0x23, 0x00, 0x00]);
            want[64..72].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
            want[80..88].copy_from_slice(&[0x01, 0, 0, 0, 0, 0, 0, 0]);
            assert_eq!(file[..128], want);
            assert_eq!(file.len() % (2 << 20), 0, "whole 2 MiB pages");
            drop(a);
        });
    }

    proptest::proptest! {
        #[test]
        fn header_fields_round_trip_without_touching_their_neighbours(
            major: u16, minor: u16, compat: u32, incompat: u32,
            ring: u32, max_frame: u32, pid_a: u64, pid_b: u64, generation: u64, sig: [u8; 8],
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
            h.set_generation(generation, Ordering::Relaxed);
            proptest::prop_assert_eq!(h.signature(), sig);
            proptest::prop_assert_eq!((h.major(), h.minor()), (major, minor));
            proptest::prop_assert_eq!((h.compat(), h.incompat()), (compat, incompat));
            proptest::prop_assert_eq!((h.ring_bytes(), h.max_frame()), (ring, max_frame));
            proptest::prop_assert_eq!(h.pid(End::A, Ordering::Relaxed), pid_a);
            proptest::prop_assert_eq!(h.pid(End::B, Ordering::Relaxed), pid_b);
            proptest::prop_assert_eq!(h.generation(Ordering::Relaxed), generation);
            let bytes = header_bytes(&mem);
            proptest::prop_assert!(bytes[28..64].iter().chain(&bytes[88..128]).all(|b| *b == 0xa5),
                "reserved bytes untouched");
        }
    }
}
