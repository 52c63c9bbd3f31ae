//! The file's header: its layout (`field`), the two ends (`End`), and the view of it
//! both processes read and write (`Header`).
#![deny(unsafe_code)]

use super::*;

/// Byte ranges of the header fields (see the layout in the module docs).
pub(super) mod field {
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
pub(super) enum End {
    A,
    B,
}

impl End {
    pub(super) fn peer(self) -> Self {
        match self {
            End::A => End::B,
            End::B => End::A,
        }
    }

    pub(super) fn letter(self) -> char {
        match self {
            End::A => 'A',
            End::B => 'B',
        }
    }

    /// The header field that holds this end's owner pid.
    pub(super) fn pid_field(self) -> field::Field {
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
pub(super) struct Header<'a> {
    pub(super) mem: &'a DevMem,
}

impl<'a> Header<'a> {
    /// Bytes the header occupies; the A->B ring starts here.
    pub(super) const LEN: usize = field::RINGS;

    /// A view of the header at the start of `mem`, or `None` if `mem` is too short to hold
    /// one or not 8-byte aligned (the mappings [`DevMem::anon`] and [`DevMem::shared_file`]
    /// make are page-aligned).
    pub(super) fn new_checked(mem: &'a DevMem) -> Option<Self> {
        (mem.len() >= Self::LEN && mem.addr().is_multiple_of(8)).then_some(Self { mem })
    }

    pub(super) fn get<const N: usize>(&self, f: field::Field) -> [u8; N] {
        debug_assert_eq!(f.len(), N);
        let mut b = [0u8; N];
        self.mem.read(f.start, &mut b);
        b
    }

    pub(super) fn put(&self, f: field::Field, bytes: &[u8]) {
        debug_assert_eq!(f.len(), bytes.len());
        self.mem.write(f.start, bytes);
    }

    /// The signature (Acquire: the rest of the header is visible once it reads right).
    pub(super) fn signature(&self) -> [u8; 8] {
        self.mem
            .load_u64(field::SIGNATURE.start, Ordering::Acquire)
            .to_le_bytes()
    }

    /// Stores the signature (Release: publishes every header field written before it).
    pub(super) fn set_signature(&self, sig: [u8; 8]) {
        self.mem.store_u64(
            field::SIGNATURE.start,
            u64::from_le_bytes(sig),
            Ordering::Release,
        );
    }

    pub(super) fn major(&self) -> u16 {
        u16::from_le_bytes(self.get(field::MAJOR))
    }

    pub(super) fn set_major(&self, v: u16) {
        self.put(field::MAJOR, &v.to_le_bytes());
    }

    pub(super) fn minor(&self) -> u16 {
        u16::from_le_bytes(self.get(field::MINOR))
    }

    pub(super) fn set_minor(&self, v: u16) {
        self.put(field::MINOR, &v.to_le_bytes());
    }

    /// Compatible feature bits the creator uses.
    pub(super) fn compat(&self) -> u32 {
        u32::from_le_bytes(self.get(field::COMPAT))
    }

    pub(super) fn set_compat(&self, v: u32) {
        self.put(field::COMPAT, &v.to_le_bytes());
    }

    /// Incompatible feature bits the creator uses.
    pub(super) fn incompat(&self) -> u32 {
        u32::from_le_bytes(self.get(field::INCOMPAT))
    }

    pub(super) fn set_incompat(&self, v: u32) {
        self.put(field::INCOMPAT, &v.to_le_bytes());
    }

    /// Bytes of records per ring.
    pub(super) fn ring_bytes(&self) -> u32 {
        u32::from_le_bytes(self.get(field::RING_BYTES))
    }

    pub(super) fn set_ring_bytes(&self, v: u32) {
        self.put(field::RING_BYTES, &v.to_le_bytes());
    }

    /// Largest frame a record carries.
    pub(super) fn max_frame(&self) -> u32 {
        u32::from_le_bytes(self.get(field::MAX_FRAME))
    }

    pub(super) fn set_max_frame(&self, v: u32) {
        self.put(field::MAX_FRAME, &v.to_le_bytes());
    }

    /// The process holding `end`, 0 when the end is free.
    pub(super) fn pid(&self, end: End, order: Ordering) -> u64 {
        self.mem.load_u64(end.pid_field().start, order)
    }

    pub(super) fn set_pid(&self, end: End, pid: u64, order: Ordering) {
        self.mem.store_u64(end.pid_field().start, pid, order);
    }

    /// How many times an end was attached (1 when the file is made; each end taken later
    /// adds one).
    pub(super) fn generation(&self, order: Ordering) -> u64 {
        self.mem.load_u64(field::GENERATION.start, order)
    }

    pub(super) fn set_generation(&self, v: u64, order: Ordering) {
        self.mem.store_u64(field::GENERATION.start, v, order);
    }

    /// Adds one to the generation (compare-and-swap); the new value.
    pub(super) fn next_generation(&self) -> u64 {
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
    pub(super) fn claim(&self, end: End, current: u64, new: u64) -> Result<u64, u64> {
        self.mem
            .compare_exchange_u64(end.pid_field().start, current, new)
    }
}

/// Size of a wire file: header and two rings of `ring` bytes of records, rounded up to 2 MiB
/// so that the file can live on hugetlbfs (whose files are whole huge pages).
pub(super) fn shm_file_bytes(ring: u32) -> usize {
    (Header::LEN + 2 * ring_bytes(ring as usize)).div_ceil(2 << 20) * (2 << 20)
}
