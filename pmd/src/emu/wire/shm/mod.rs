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

mod header;
mod ownership;
mod placement;
#[cfg(test)]
mod tests;

use header::*;
use ownership::*;
use placement::*;
pub use placement::{shm_dir, shm_path};

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
