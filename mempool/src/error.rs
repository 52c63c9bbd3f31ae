//! The crate's error type: every variant carries the numbers needed to act on it.
#![deny(unsafe_code)]

use std::io;
use std::path::PathBuf;

use crate::region::{PageSize, NO_HUGEPAGES_ENV};

/// Boxed error returned by a chunk-registration hook (for example an `ibv_reg_mr` failure).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors from creating regions, pools and mbuf pools. The datapath never returns these: a
/// bulk get that cannot be served returns `false` / `None`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A region of zero bytes was requested.
    #[error("a memory region of 0 bytes was requested")]
    ZeroLength,

    /// `mmap` itself failed (out of address space, or of memory for 4 KiB pages).
    #[error("mmap of {bytes} bytes ({mib} MiB) with {page_size} pages failed: {source}")]
    Map {
        /// Bytes requested, rounded up to the page size.
        bytes: usize,
        /// Bytes in MiB, rounded up, for the message.
        mib: usize,
        /// Page size that was tried.
        page_size: PageSize,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },

    /// `PagePolicy::Require` asked for hugepages that could not be mapped.
    #[error(
        "{page_size} hugepages required for {bytes} bytes, but mapping them failed ({free} free \
         {page_size} pages): {source}; reserve more with `echo N > \
         /sys/kernel/mm/hugepages/hugepages-{kib}kB/nr_hugepages`"
    )]
    HugepagesUnavailable {
        /// Page size that was required.
        page_size: PageSize,
        /// Page size in KiB, for the sysfs path in the message.
        kib: usize,
        /// Bytes requested, rounded up to the page size.
        bytes: usize,
        /// Free pages of that size when the mapping failed (0 when unknown).
        free: u64,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },

    /// `PagePolicy::Require` asked for hugepages but the environment forbids them.
    #[error("{page_size} hugepages are required but {NO_HUGEPAGES_ENV} is set; unset it or use PagePolicy::Auto")]
    HugepagesDisabled {
        /// Page size that was required.
        page_size: PageSize,
    },

    /// Creating, sizing, inspecting or mapping a shared-memory file failed.
    #[error("shared memory file {}: {what} failed: {source}", path.display())]
    SharedFile {
        /// The file.
        path: PathBuf,
        /// The step that failed (`open`, `fstatfs`, `set_len`, `mmap`).
        what: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },

    /// A shared-memory file lives on a filesystem with the wrong page size.
    #[error(
        "shared memory file {} is backed by {actual} pages but {required} pages are required; \
         put it on a hugetlbfs mount (mount -t hugetlbfs nodev /dev/hugepages)",
        path.display()
    )]
    SharedFilePageSize {
        /// The file.
        path: PathBuf,
        /// Page size of the filesystem that holds it.
        actual: PageSize,
        /// Page size that `PagePolicy::Require` asked for.
        required: PageSize,
    },

    /// Another process's shared memory cannot be mapped at the address that process maps it
    /// at, because this process uses part of that range already.
    #[error(
        "cannot map {} at {addr:#x}..{:#x} (where its owner maps it, as addresses in it must \
         match): this process already uses that range ({taken_by}); start this process before \
         it maps much, or have the owner map its memory elsewhere",
        path.display(),
        addr + len
    )]
    AddressTaken {
        /// The file.
        path: PathBuf,
        /// Where it must be mapped.
        addr: usize,
        /// Its length.
        len: usize,
        /// What is there now (from `/proc/self/maps`).
        taken_by: String,
    },

    /// An existing shared-memory file to attach to is empty.
    #[error("shared memory file {} is empty: the process that owns it has not created the pool yet", path.display())]
    SharedFileEmpty {
        /// The file.
        path: PathBuf,
    },

    /// The pool's memory could not be mapped.
    #[error("pool '{pool}': {objects} objects of {obj_bytes} bytes need {mib} MiB: {source}")]
    PoolMemory {
        /// Pool name.
        pool: String,
        /// Objects requested.
        objects: u32,
        /// Bytes per object after alignment.
        obj_bytes: usize,
        /// Total in MiB, rounded up.
        mib: usize,
        /// The region error.
        #[source]
        source: Box<Error>,
    },

    /// Zero objects, or zero-byte objects.
    #[error(
        "pool '{pool}': {objects} objects of {obj_bytes} bytes requested; both must be at least 1"
    )]
    EmptyPool {
        /// Pool name.
        pool: String,
        /// Objects requested.
        objects: u32,
        /// Bytes per object requested.
        obj_bytes: usize,
    },

    /// More objects than a `u32` index (or the address space) can describe.
    #[error("pool '{pool}': {objects} objects of {obj_bytes} bytes is too large (at most {max} objects, and objects * size must fit in memory)")]
    TooLarge {
        /// Pool name.
        pool: String,
        /// Objects requested.
        objects: u64,
        /// Bytes per object.
        obj_bytes: usize,
        /// Largest object count supported.
        max: u32,
    },

    /// Object alignment is not a power of two.
    #[error("pool '{pool}': object alignment {align} is not a power of two")]
    BadAlign {
        /// Pool name.
        pool: String,
        /// Alignment requested.
        align: usize,
    },

    /// The per-core cache would hold too large a share of the pool.
    #[error(
        "pool '{pool}': cache size {cache_size} is too large for {objects} objects; at most \
         {max} (objects / 1.5, and never above {limit})"
    )]
    CacheTooLarge {
        /// Pool name.
        pool: String,
        /// Cache size requested.
        cache_size: u32,
        /// Objects in the pool.
        objects: u32,
        /// Largest cache size allowed for this pool.
        max: u32,
        /// Absolute limit on cache sizes.
        limit: u32,
    },

    /// `max_chunk_bytes` cannot hold even one object.
    #[error("pool '{pool}': max_chunk_bytes {max_chunk_bytes} is smaller than one {obj_bytes}-byte object")]
    ChunkTooSmall {
        /// Pool name.
        pool: String,
        /// The configured chunk cap.
        max_chunk_bytes: usize,
        /// Bytes per object after alignment.
        obj_bytes: usize,
    },

    /// The registration hook refused a chunk.
    #[error(
        "pool '{pool}': registering chunk {chunk} ({len} bytes at {addr:#x}) failed: {source}"
    )]
    Registration {
        /// Pool name.
        pool: String,
        /// Chunk index.
        chunk: usize,
        /// Chunk start address.
        addr: usize,
        /// Chunk length in bytes.
        len: usize,
        /// The hook's error.
        #[source]
        source: BoxError,
    },

    /// Headroom plus data room do not fit an mbuf's 16-bit buffer length.
    #[error(
        "mbuf pool '{pool}': headroom {headroom} + data room {data_room} bytes exceed the \
         {max}-byte mbuf buffer limit"
    )]
    MbufLayout {
        /// Pool name.
        pool: String,
        /// Headroom requested.
        headroom: u16,
        /// Data room requested.
        data_room: u16,
        /// Largest buffer an mbuf can describe.
        max: u32,
    },

    /// A shared pool's file does not hold a pool this process can attach to (not a pool, a
    /// pool of another version, one still being built, or a control block that disagrees
    /// with itself or with the file).
    #[error("shared pool file {path}: {why}")]
    NotASharedPool {
        /// The file.
        path: PathBuf,
        /// What is wrong, and what to do.
        why: String,
    },

    /// The operation needs a shared pool (created with a shared file).
    #[error("pool '{pool}' is private to the process that made it; create it with shared_file(PATH) to {what}")]
    NotShared {
        /// Pool name.
        pool: String,
        /// What was asked.
        what: &'static str,
    },

    /// A live process's objects cannot be taken back.
    #[error("pool '{pool}': process {pid} is still running; only a dead process's objects can be reclaimed")]
    ProcessAlive {
        /// Pool name.
        pool: String,
        /// The process.
        pid: u32,
    },
}

/// Rounds a byte count up to whole MiB, for messages.
pub(crate) fn mib_ceil(bytes: usize) -> usize {
    bytes.div_ceil(1 << 20)
}
