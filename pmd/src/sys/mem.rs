//! Memory shared with a device: queue rings, doorbell pages, and (for the device model and
//! shared-memory wires) memory shared between threads or processes.
//!
//! The rule from vm-memory: never make a `&` or `&mut` into memory the other side writes.
//! [`DevMem`] hands out no references to its bytes; every access is a bulk copy of a range
//! the protocol says is stable (WQE bytes after the doorbell, CQE bytes after the owner
//! check), or an atomic load/store of an aligned word (owner dwords, doorbells, ring indices).
#![allow(unsafe_code)]

use super::barrier::udma_to_device_barrier;
use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

enum Backing {
    /// We mapped it and unmap it on drop.
    Mapped(#[allow(dead_code)] memmap2::MmapRaw),
    /// Someone else owns it (rdma-core's doorbell page, a registered buffer).
    Foreign,
    /// Someone else owns it, and the value held here keeps it mapped (the verbs objects
    /// whose queue buffer or doorbell page it is).
    Kept(#[allow(dead_code)] std::sync::Arc<dyn std::any::Any + Send + Sync>),
    /// As `Kept`, memory that lives in a shared file (a queue buffer rdma-core asked a
    /// shared-file allocator for): `path` names it for another process.
    KeptFile {
        #[allow(dead_code)]
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        path: std::path::PathBuf,
        /// Where the memory starts in the file.
        offset: u64,
    },
    /// A range of another [`DevMem`] at `offset`, which it keeps mapped (a doorbell record
    /// inside a page, a register inside a register page).
    Within {
        parent: std::sync::Arc<DevMem>,
        offset: usize,
    },
    /// As `Kept`, a page of a device's command descriptor at `offset` (the fake rdma-core's
    /// doorbell monitors): another process maps it from the descriptor it was passed.
    KeptDevice {
        #[allow(dead_code)]
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        offset: u64,
    },
    /// We mapped a shared file (other processes may map it too); `remove` says whether we
    /// made it and remove it on drop.
    File {
        #[allow(dead_code)]
        map: memmap2::MmapRaw,
        path: std::path::PathBuf,
        remove: bool,
    },
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::File {
            path, remove: true, ..
        } = self
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The system's page size (`sysconf(_SC_PAGESIZE)`, at least 4096): what `mmap` offsets
/// are multiples of, and what rdma-core maps a device page as (an mlx5 UAR).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(4096)
}

/// A range of memory shared with a device or another thread / process.
pub struct DevMem {
    ptr: *mut u8,
    len: usize,
    _backing: Backing,
}

// SAFETY: `DevMem` is a (pointer, length) pair to memory that is valid for its lifetime
// (mapped by us, or guaranteed by the `from_raw` caller). Every access goes through raw
// copies or atomics, never through Rust references, so concurrent use from several threads
// cannot create aliasing `&mut`; the protocols built on top order the accesses.
unsafe impl Send for DevMem {}
// SAFETY: as for `Send`: no method hands out references into the memory.
unsafe impl Sync for DevMem {}

impl std::fmt::Debug for DevMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevMem({:#x}, {} bytes)", self.ptr as usize, self.len)
    }
}

/// A checked range of a [`DevMem`] (see [`DevMem::window`]): stores into it check only
/// against the window's length.
#[derive(Debug)]
pub struct DevWindow<'a> {
    ptr: *mut u8,
    len: usize,
    _mem: std::marker::PhantomData<&'a DevMem>,
}

impl DevWindow<'_> {
    /// Stores the 8 bytes `v` (native byte order) at `off` of the window.
    ///
    /// # Panics
    /// If the 8 bytes are not inside the window.
    #[inline]
    pub fn write_u64(&self, off: usize, v: u64) {
        if off > self.len.wrapping_sub(8) || self.len < 8 {
            out_of_range(off, 8, self.ptr, self.len);
        }
        // SAFETY: `off..off + 8` is inside the window (checked), which is inside the memory
        // (checked by `DevMem::window`), valid for writes while the `DevMem` lives.
        unsafe { self.ptr.add(off).cast::<u64>().write_unaligned(v) }
    }

    /// [`DevMem::write_2x64`] at `off` of the window.
    ///
    /// # Panics
    /// If the 16 bytes are not inside the window.
    #[inline]
    pub fn write_2x64(&self, off: usize, lo: u64, hi: u64) {
        if off > self.len.wrapping_sub(16) || self.len < 16 {
            out_of_range(off, 16, self.ptr, self.len);
        }
        // SAFETY: `off..off + 16` is inside the window (checked), which is inside the memory
        // (checked by `DevMem::window`), valid for writes while the `DevMem` lives (the
        // window borrows it); unaligned stores need no alignment.
        unsafe {
            let p = self.ptr.add(off).cast::<u64>();
            p.write_unaligned(lo);
            p.add(1).write_unaligned(hi);
        }
    }
}

/// A checked range of a [`DevMem`] for a run of loads (see [`DevMem::view`]): a run of
/// completions whose owners are checked and fenced, read in place. Each load checks only
/// against the view's length.
#[derive(Debug)]
pub struct DevView<'a> {
    ptr: *const u8,
    len: usize,
    _mem: std::marker::PhantomData<&'a DevMem>,
}

impl DevView<'_> {
    /// Bytes in the view.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entry `k` of the view read as consecutive `N`-byte entries (a ring's slots), checked
    /// once: the entry's fields are then read at offsets checked at compile time.
    ///
    /// # Panics
    /// If the entry is not inside the view.
    #[inline]
    pub fn entry<const N: usize>(&self, k: usize) -> DevEntry<'_, N> {
        if k >= self.len / N {
            out_of_range(k * N, N, self.ptr.cast_mut(), self.len);
        }
        DevEntry {
            // (Inside the view, checked just above.)
            ptr: self.ptr.wrapping_add(k * N),
            _mem: std::marker::PhantomData,
        }
    }

    /// The view's whole `N`-byte entries, in order (a ring's slots: one length check per
    /// entry, a pointer compare).
    #[inline]
    pub fn entries<const N: usize>(&self) -> DevEntries<'_, N> {
        DevEntries {
            next: self.ptr,
            end: self.ptr.wrapping_add(self.len / N * N),
            _mem: std::marker::PhantomData,
        }
    }
}

/// The whole `N`-byte entries of a [`DevView`], in order (see [`DevView::entries`]).
#[derive(Debug)]
pub struct DevEntries<'a, const N: usize> {
    next: *const u8,
    /// The end of the last whole entry.
    end: *const u8,
    _mem: std::marker::PhantomData<&'a DevMem>,
}

impl<'a, const N: usize> Iterator for DevEntries<'a, N> {
    type Item = DevEntry<'a, N>;

    #[inline]
    fn next(&mut self) -> Option<DevEntry<'a, N>> {
        (self.next != self.end).then(|| {
            let ptr = self.next;
            // (`next` moves by whole entries from the view's start to `end`, inside it.)
            self.next = self.next.wrapping_add(N);
            DevEntry {
                ptr,
                _mem: std::marker::PhantomData,
            }
        })
    }
}

/// One `N`-byte entry of a [`DevView`] (see [`DevView::entry`]), read at offsets checked at
/// compile time.
#[derive(Debug, Clone, Copy)]
pub struct DevEntry<'a, const N: usize> {
    ptr: *const u8,
    _mem: std::marker::PhantomData<&'a DevMem>,
}

impl<const N: usize> DevEntry<'_, N> {
    /// The `u32` at `OFF` in memory order: a completion field, read once the owner was
    /// checked and a read barrier issued (the device no longer writes it).
    #[inline]
    pub fn u32_at<const OFF: usize>(&self) -> u32 {
        const { assert!(OFF + 4 <= N, "field outside the entry") };
        // SAFETY: `OFF..OFF + 4` is inside the entry (asserted at compile time), which is
        // inside the view (checked by `DevView::entry`) and so inside the memory, valid for
        // reads while the `DevMem` lives; an unaligned raw load makes no reference.
        unsafe { self.ptr.add(OFF).cast::<u32>().read_unaligned() }
    }

    /// Atomically loads the byte at `OFF` with relaxed ordering (an owner field the device
    /// may be writing; the caller fences before reading what it guards).
    #[inline]
    pub fn load_u8_relaxed<const OFF: usize>(&self) -> u8 {
        const { assert!(OFF < N, "field outside the entry") };
        // SAFETY: as in `u32_at`, for one byte (a byte needs no alignment); the memory lives
        // as long as the view this entry borrows, and is only accessed atomically or by raw
        // copies.
        unsafe { std::sync::atomic::AtomicU8::from_ptr(self.ptr.add(OFF).cast_mut()) }
            .load(Ordering::Relaxed)
    }

    /// The byte at `OFF` (as [`DevEntry::u32_at`]).
    #[inline]
    pub fn u8_at<const OFF: usize>(&self) -> u8 {
        const { assert!(OFF < N, "field outside the entry") };
        // SAFETY: as in `u32_at`, for one byte.
        unsafe { self.ptr.add(OFF).read() }
    }
}

/// The panic of an access outside a [`DevMem`], out of line: the hot paths' range checks then
/// cost a compare and a never-taken branch, with nothing prepared for the message.
#[cold]
#[inline(never)]
#[track_caller]
fn out_of_range(off: usize, n: usize, ptr: *mut u8, len: usize) -> ! {
    panic!("{n} bytes at offset {off} outside DevMem({ptr:p}, {len} bytes)")
}

/// The panic of an unaligned atomic access, out of line (see [`out_of_range`]).
#[cold]
#[inline(never)]
#[track_caller]
fn unaligned(bits: u32, off: usize) -> ! {
    panic!("unaligned {bits}-bit atomic at {off}")
}

impl DevMem {
    /// `len` bytes of zeroed, page-aligned anonymous memory (what the MANA queue allocator
    /// contract asks for: page-aligned, zero-filled, pinnable, §1.3 of the spec).
    ///
    /// # Errors
    /// The mmap error.
    pub fn anon(len: usize) -> io::Result<Self> {
        // Large ranges (wire rings, big queues) go on 2 MiB pages when the machine has some
        // free: fewer TLB misses on every frame. Smaller ones, or no hugepages: normal pages.
        const HUGE: usize = 2 << 20;
        if len >= HUGE && std::env::var_os("PMD_NO_HUGEPAGES").is_none() {
            let rounded = len.div_ceil(HUGE) * HUGE;
            if let Ok(map) = memmap2::MmapOptions::new()
                .len(rounded)
                .huge(Some(21))
                .populate()
                .map_anon()
            {
                let map = memmap2::MmapRaw::from(map);
                return Ok(Self {
                    ptr: map.as_mut_ptr(),
                    len,
                    _backing: Backing::Mapped(map),
                });
            }
        }
        let map = memmap2::MmapOptions::new().len(len.max(1)).map_anon()?;
        let map = memmap2::MmapRaw::from(map);
        Ok(Self {
            ptr: map.as_mut_ptr(),
            len,
            _backing: Backing::Mapped(map),
        })
    }

    /// Maps `len` bytes of the file at `path` shared (creating it and sizing it to `len`
    /// when `create` is set). Two processes mapping the same file see the same bytes.
    ///
    /// # Errors
    /// Opening, sizing or mapping the file failed; or the file is shorter than `len`.
    pub fn shared_file(path: &Path, len: usize, create: bool) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        if create {
            file.set_len(len as u64)?;
        } else if (file.metadata()?.len() as usize) < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} is shorter than {len} bytes", path.display()),
            ));
        }
        Self::map_path(&file, path, len, false)
    }

    /// A new shared file at `path` (it must not exist) of `len` zeroed bytes, mapped; removed
    /// again when this mapping drops. Other processes map it with [`DevMem::shared_file`]
    /// (their mappings keep the memory after the name is gone).
    ///
    /// # Errors
    /// The file exists, or creating, sizing or mapping it failed.
    pub fn create_shared_file(path: &Path, len: usize) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        let made = file
            .set_len(len as u64)
            .and_then(|()| Self::map_path(&file, path, len, true));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// `len` bytes of `file` (named `path`) mapped shared; `remove`: the file is ours, removed
    /// when the mapping drops.
    fn map_path(file: &std::fs::File, path: &Path, len: usize, remove: bool) -> io::Result<Self> {
        let map = memmap2::MmapOptions::new().len(len).map_raw(file)?;
        Ok(Self {
            ptr: map.as_mut_ptr(),
            len,
            _backing: Backing::File {
                map,
                path: path.to_owned(),
                remove,
            },
        })
    }

    /// The shared file this memory maps, if it is one ([`DevMem::shared_file`],
    /// [`DevMem::create_shared_file`]): what another process maps to share it.
    pub fn shared_path(&self) -> Option<&Path> {
        self.shared_location().map(|(p, _)| p)
    }

    /// The shared file this memory is in, and where in it the memory starts: what another
    /// process maps to share it ([`DevMem::shared_file_range`]).
    pub fn shared_location(&self) -> Option<(&Path, u64)> {
        match &self._backing {
            Backing::File { path, .. } => Some((path, 0)),
            Backing::KeptFile { path, offset, .. } => Some((path, *offset)),
            Backing::Within { parent, offset } => parent
                .shared_location()
                .map(|(p, o)| (p, o + *offset as u64)),
            _ => None,
        }
    }

    /// `len` bytes at `off` of `parent`, as memory of their own that keeps `parent` mapped;
    /// `None` when the range is not inside `parent`. Where `parent` is in a shared file or a
    /// device's command descriptor, so is the range ([`DevMem::shared_location`],
    /// [`DevMem::device_offset`]).
    pub fn within(parent: &std::sync::Arc<DevMem>, off: usize, len: usize) -> Option<Self> {
        if off.checked_add(len)? > parent.len {
            return None;
        }
        Some(Self {
            // In bounds: checked above.
            ptr: parent.ptr.wrapping_add(off),
            len,
            _backing: Backing::Within {
                parent: std::sync::Arc::clone(parent),
                offset: off,
            },
        })
    }

    /// Maps `len` bytes at byte `offset` of the shared file at `path` (which must hold
    /// them): what [`DevMem::shared_location`] said in another process.
    ///
    /// # Errors
    /// The file is missing or short, or the mmap error.
    pub fn shared_file_range(path: &Path, offset: u64, len: usize) -> io::Result<Self> {
        let off = usize::try_from(offset)
            .ok()
            .filter(|o| o.checked_add(len).is_some())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
        if off == 0 {
            return Self::shared_file(path, len, false);
        }
        let whole = std::sync::Arc::new(Self::shared_file(path, off + len, false)?);
        Ok(Self::within(&whole, off, len).expect("the mapping holds the range"))
    }

    /// Where this memory is in the device's command descriptor, if it is a page of it
    /// ([`DevMem::from_raw_kept_in_device`]): what another process maps to share it.
    pub fn device_offset(&self) -> Option<u64> {
        match &self._backing {
            Backing::KeptDevice { offset, .. } => Some(*offset),
            Backing::Within { parent, offset } => {
                parent.device_offset().map(|o| o + *offset as u64)
            }
            _ => None,
        }
    }

    /// Maps the first `len` bytes of an open `file` shared (read and write), as
    /// [`DevMem::shared_file`] does for a path: for a caller that must know which file it
    /// mapped (its inode), not just which name.
    ///
    /// # Errors
    /// The file is shorter than `len`, or the mmap error.
    pub fn map_file(file: &std::fs::File, len: usize) -> io::Result<Self> {
        if (file.metadata()?.len() as usize) < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the file is shorter than {len} bytes"),
            ));
        }
        let map = memmap2::MmapOptions::new().len(len).map_raw(file)?;
        Ok(Self {
            ptr: map.as_mut_ptr(),
            len,
            _backing: Backing::Mapped(map),
        })
    }

    /// Wraps memory owned by someone else (rdma-core's queue buffers and doorbell page, or a
    /// buffer registered with the device model).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes for as long as the returned value
    /// (and anything holding it) lives, and must not be accessed through Rust references by
    /// anyone while it is shared.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Self {
        Self {
            ptr,
            len,
            _backing: Backing::Foreign,
        }
    }

    /// Wraps memory owned by `keep` (a verbs queue's buffer, a context's doorbell page): the
    /// view holds `keep`, so the memory stays mapped as long as the view lives, whoever holds
    /// it.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes for as long as `keep` lives, and
    /// must not be accessed through Rust references by anyone while it is shared.
    pub unsafe fn from_raw_kept(
        ptr: *mut u8,
        len: usize,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            ptr,
            len,
            _backing: Backing::Kept(keep),
        }
    }

    /// [`DevMem::from_raw_kept`] for memory that lives at byte `offset` of the shared file
    /// `path` (a queue buffer a shared-file allocator made, or a doorbell record in one):
    /// [`DevMem::shared_location`] says where.
    ///
    /// # Safety
    /// As [`DevMem::from_raw_kept`].
    pub unsafe fn from_raw_kept_in_file(
        ptr: *mut u8,
        len: usize,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        path: std::path::PathBuf,
        offset: u64,
    ) -> Self {
        Self {
            ptr,
            len,
            _backing: Backing::KeptFile { keep, path, offset },
        }
    }

    /// [`DevMem::from_raw_kept`] for a page at `offset` of the device's command descriptor
    /// (a fake rdma-core doorbell monitor): [`DevMem::device_offset`] says where.
    ///
    /// # Safety
    /// As [`DevMem::from_raw_kept`].
    pub unsafe fn from_raw_kept_in_device(
        ptr: *mut u8,
        len: usize,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        offset: u64,
    ) -> Self {
        Self {
            ptr,
            len,
            _backing: Backing::KeptDevice { keep, offset },
        }
    }

    /// Maps `len` bytes at `offset` of the open descriptor `fd`, shared, read and write: a
    /// device's page another process passed (a MANA context's command fd, whose page 0 is
    /// its doorbell page: the kernel's `mana_ib_mmap`; DPDK net/mana's secondaries map it
    /// so). Unmapped on drop.
    ///
    /// # Errors
    /// The mmap error (`ENODEV` for a descriptor that cannot be mapped).
    pub fn map_fd(fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Self> {
        use std::os::fd::AsRawFd;
        let map = memmap2::MmapOptions::new()
            .offset(offset)
            .len(len)
            .map_raw(fd.as_raw_fd())?;
        Ok(Self {
            ptr: map.as_mut_ptr(),
            len,
            _backing: Backing::Mapped(map),
        })
    }

    /// Maps `len` bytes at byte `offset` of a device's command descriptor `fd` that another
    /// process passed (a doorbell page, a UAR register), checked first, since the offset
    /// comes from a description another process wrote: the page must be one the descriptor
    /// has. A regular file (the fake rdma-core's command file) must hold the whole page; a
    /// uverbs character device maps page 0 only when `page0_only` (MANA: `mana_ib_mmap`),
    /// else the page the caller checked (mlx5's UAR pages at `uar_mmap_offset`). `offset`
    /// need not be page-aligned: the system page holding it is mapped, and the range must
    /// lie within it.
    ///
    /// # Errors
    /// What is wrong with the offset, or the mmap error, as a sentence naming `what`.
    pub fn map_device_range(
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        page0_only: bool,
        what: &str,
    ) -> Result<Self, String> {
        let page_bytes = page_size() as u64;
        let (page, inner) = (offset - offset % page_bytes, (offset % page_bytes) as usize);
        let file = std::fs::File::from(
            fd.try_clone_to_owned()
                .map_err(|err| format!("the device descriptor: {err}"))?,
        );
        let meta = file
            .metadata()
            .map_err(|err| format!("the device descriptor: {err}"))?;
        let fits = if meta.is_file() {
            page.checked_add(page_bytes)
                .is_some_and(|end| end <= meta.len())
        } else {
            !page0_only || page == 0
        };
        if !fits
            || inner
                .checked_add(len)
                .is_none_or(|end| end > page_bytes as usize)
        {
            return Err(format!(
                "{what} at offset {offset}: not in a page of the device"
            ));
        }
        let whole = Self::map_fd(fd, page, page_bytes as usize)
            .map_err(|err| format!("mapping {what} from the device descriptor: {err}"))?;
        if inner == 0 && len == page_bytes as usize {
            return Ok(whole);
        }
        Ok(Self::within(&std::sync::Arc::new(whole), inner, len).expect("checked above"))
    }

    /// A device's view of a registered mempool chunk (what `ibv_reg_mr` gives the NIC): the
    /// device model reads TX frames from it and writes RX frames into it.
    ///
    /// The view must live no longer than the chunk's registration: mempool drops a
    /// registration's guard before it unmaps the chunk ([`mempool::Registration::with_guard`]),
    /// so a caller keeps this value only in a table that the guard's drop clears, exactly like
    /// a NIC whose memory region is deregistered before the memory is freed.
    ///
    /// # Safety
    /// The returned value must be dropped before the chunk is unmapped: keep it only where
    /// the registration guard's drop removes it (the device model's memory-region table),
    /// and touch the bytes only while the device owns the buffers in them (posted RX
    /// buffers, in-flight TX frames).
    pub unsafe fn for_registered_chunk(chunk: &mempool::ChunkInfo) -> Self {
        // SAFETY: `chunk` describes `len` bytes of a live pool region, mapped read/write;
        // the caller bounds this view's life by the registration's, which ends before the
        // pool unmaps the region.
        unsafe { Self::from_raw(chunk.as_ptr(), chunk.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address (what goes into a WQE as a virtual address, or `manadv_qp.sq_buf`).
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The raw pointer, for handing to rdma-core.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    #[inline]
    fn check(&self, off: usize, n: usize) {
        if !(off <= self.len && n <= self.len - off) {
            out_of_range(off, n, self.ptr, self.len);
        }
    }

    /// Copies `out.len()` bytes at `off` out of the memory.
    ///
    /// # Panics
    /// If the range is outside the memory.
    #[inline]
    pub fn read(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len());
        // SAFETY: the range is inside the memory (checked above), which is valid for reads
        // (constructor invariant); `out` is a distinct Rust buffer, so they cannot overlap.
        unsafe { copy(self.ptr.add(off), out.as_mut_ptr(), out.len()) };
    }

    /// Copies `data` into the memory at `off`.
    ///
    /// # Panics
    /// If the range is outside the memory.
    #[inline]
    pub fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        // SAFETY: in range (checked), valid for writes (constructor invariant), and `data` is
        // a Rust buffer that cannot overlap memory no reference points into.
        unsafe { copy(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    /// Copies `data` (a multiple of 4 bytes) into the memory at `off` 4 bytes at a time. For
    /// a descriptor just built in a local buffer by 4-byte stores (a completion's fields):
    /// each 4-byte load is then served from the store that wrote it, where a wider copy would
    /// wait for several of them to reach the cache first (a store-forwarding stall).
    ///
    /// # Panics
    /// If the range is outside the memory, `off` is not 4-byte aligned in it, or `data` is not
    /// a multiple of 4 bytes long.
    #[inline]
    pub fn write_dwords(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        assert!(data.len().is_multiple_of(4) && (self.ptr as usize + off).is_multiple_of(4));
        for (k, w) in data.chunks_exact(4).enumerate() {
            let v = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
            // SAFETY: `off + 4k + 4 <= off + data.len()`: inside the checked range of the
            // memory (valid for writes, constructor invariant), 4-byte aligned (checked).
            // Volatile, so that the compiler keeps the 4-byte stores (and so the 4-byte loads
            // feeding them) instead of merging them into wider moves, which would stall again.
            unsafe { std::ptr::write_volatile(self.ptr.add(off + 4 * k).cast::<u32>(), v) };
        }
    }

    /// Stores the 16 bytes `lo` (first, native byte order) then `hi` at `off`: a descriptor
    /// built in registers goes to the ring in two 8-byte stores, with one range check.
    ///
    /// # Panics
    /// If the range is outside the memory.
    #[inline]
    pub fn write_2x64(&self, off: usize, lo: u64, hi: u64) {
        self.check(off, 16);
        // SAFETY: `off..off + 16` is inside the memory (checked), valid for writes
        // (constructor invariant); unaligned stores need no alignment.
        unsafe {
            let p = self.ptr.add(off).cast::<u64>();
            p.write_unaligned(lo);
            p.add(1).write_unaligned(hi);
        }
    }

    /// A window of `len` bytes at `off`, range-checked once, for a run of stores into it
    /// ([`DevWindow::write_2x64`]); `None` if it does not fit the memory.
    #[inline]
    pub fn window(&self, off: usize, len: usize) -> Option<DevWindow<'_>> {
        (off <= self.len && len <= self.len - off).then(|| DevWindow {
            // (In range, checked just above.)
            ptr: self.ptr.wrapping_add(off),
            len,
            _mem: std::marker::PhantomData,
        })
    }

    /// A view of `len` bytes at `off`, range-checked once, for a run of loads from it
    /// ([`DevView::entries`], [`DevView::entry`]); `None` if it does not fit the memory.
    #[inline]
    pub fn view(&self, off: usize, len: usize) -> Option<DevView<'_>> {
        (off <= self.len && len <= self.len - off).then(|| DevView {
            // (In range, checked just above.)
            ptr: self.ptr.wrapping_add(off),
            len,
            _mem: std::marker::PhantomData,
        })
    }

    /// Copies `n` bytes from `src_off` of `src` to `off` of this memory (a DMA between two
    /// memories: a frame from a cable into a receive buffer, say).
    ///
    /// # Panics
    /// If either range is outside its memory.
    #[inline]
    pub fn copy_from(&self, off: usize, src: &DevMem, src_off: usize, n: usize) {
        self.check(off, n);
        src.check(src_off, n);
        // SAFETY: both ranges are in range (checked) of memories valid for reads and writes
        // (constructor invariant). They may be views of the same pages (two mappings of one
        // file), so the copy is one that allows overlap.
        unsafe { std::ptr::copy(src.ptr.add(src_off), self.ptr.add(off), n) };
    }

    /// Hints that the cache line holding byte `off` will be read soon (a no-op where the
    /// architecture has no hint, or past the end).
    #[inline]
    pub fn prefetch(&self, off: usize) {
        if off < self.len {
            super::barrier::prefetch_read(self.ptr.wrapping_add(off));
        }
    }

    /// Hints that the cache line holding byte `off` will be written soon (fetched for
    /// ownership ahead of the store, where the architecture can).
    #[inline]
    pub fn prefetch_write(&self, off: usize) {
        if off < self.len {
            super::barrier::prefetch_write(self.ptr.wrapping_add(off));
        }
    }

    /// Sets `n` bytes at `off` to `byte`.
    ///
    /// # Panics
    /// If the range is outside the memory.
    pub fn fill(&self, off: usize, n: usize, byte: u8) {
        self.check(off, n);
        // SAFETY: in range (checked) and valid for writes (constructor invariant).
        unsafe { std::ptr::write_bytes(self.ptr.add(off), byte, n) };
    }

    #[inline]
    fn atomic32(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        if !(self.ptr as usize + off).is_multiple_of(4) {
            unaligned(32, off);
        }
        // SAFETY: in range and 4-byte aligned (checked); the memory lives as long as `self`,
        // which bounds the returned reference; all other accesses to this word are atomic or
        // raw copies ordered by the queue protocol.
        unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
    }

    #[inline]
    fn atomic64(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        if !(self.ptr as usize + off).is_multiple_of(8) {
            unaligned(64, off);
        }
        // SAFETY: as in `atomic32`, with 8-byte alignment checked.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
    }

    /// Atomically loads the aligned little-endian-in-memory `u32` at `off` (host order; all
    /// supported hosts are little-endian, asserted at compile time below).
    #[inline]
    pub fn load_u32(&self, off: usize, order: Ordering) -> u32 {
        self.atomic32(off).load(order)
    }

    /// Atomically stores an aligned `u32` at `off`.
    #[inline]
    pub fn store_u32(&self, off: usize, v: u32, order: Ordering) {
        self.atomic32(off).store(v, order)
    }

    /// Atomically loads an aligned `u64` at `off`.
    #[inline]
    pub fn load_u64(&self, off: usize, order: Ordering) -> u64 {
        self.atomic64(off).load(order)
    }

    /// Atomically stores an aligned `u64` at `off`.
    #[inline]
    pub fn store_u64(&self, off: usize, v: u64, order: Ordering) {
        self.atomic64(off).store(v, order)
    }

    /// Rings a doorbell: [`udma_to_device_barrier`] (everything written to queue memory is
    /// visible first), then a volatile 64-bit store of `value` at `off`. The one doorbell
    /// routine of every queue, like DPDK's `mana_ring_doorbell` (which, like this, does not
    /// flush the write-combining buffer afterwards: the next serialising instruction or the
    /// buffer filling does; [`super::barrier::mmio_flush_writes`] is there for a caller that
    /// needs the store out at once).
    ///
    /// # Panics
    /// If `off` is out of range or not 8-byte aligned.
    #[inline]
    pub fn ring_doorbell(&self, off: usize, value: u64) {
        self.check(off, 8);
        assert!(
            (self.ptr as usize + off).is_multiple_of(8),
            "unaligned doorbell at {off}"
        );
        udma_to_device_barrier();
        // SAFETY: in range and 8-byte aligned (checked); the memory lives as long as `self`.
        // An aligned 64-bit store is single-copy atomic on x86-64 and aarch64, so a device
        // (or the model's thread, which reads doorbells with atomic loads) sees the old or
        // the new value, never a torn one.
        unsafe { std::ptr::write_volatile(self.ptr.add(off).cast::<u64>(), value) };
    }

    /// Atomic compare-and-swap of an aligned `u64` (for shared-memory link state).
    ///
    /// # Errors
    /// The current value, if it was not `current`.
    pub fn compare_exchange_u64(&self, off: usize, current: u64, new: u64) -> Result<u64, u64> {
        self.atomic64(off)
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    }
}

/// A device register the driver only writes (an mlx5 UAR / BlueFlame register): MMIO, not
/// DMA memory, so it has no reads and no copies, only [`Mmio::ring`]. Distinct from
/// [`DevMem`] so that reading a register, or writing one like queue memory, does not compile.
/// (A device model, which plays the device, keeps its own [`DevMem`] of the same page to see
/// the writes.)
#[derive(Debug, Clone)]
pub struct Mmio(std::sync::Arc<DevMem>);

impl Mmio {
    /// The register page `page` (mapped by rdma-core, or a device model's).
    pub fn new(page: std::sync::Arc<DevMem>) -> Self {
        Self(page)
    }

    /// Bytes of the register page.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the page is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Where the register page is for another process: a shared file and the offset in it
    /// (a device model's register), or an offset of the device's command descriptor
    /// (rdma-core's UAR page, which a secondary maps from the primary's descriptor as DPDK
    /// net/mlx5's secondaries do). See [`DevMem::shared_location`], [`DevMem::device_offset`].
    pub fn location(&self) -> (Option<(&Path, u64)>, Option<u64>) {
        (self.0.shared_location(), self.0.device_offset())
    }

    /// Rings the doorbell at `off` with `value` ([`DevMem::ring_doorbell`]: a barrier, then
    /// one 64-bit store).
    ///
    /// # Panics
    /// If `off` is out of range or not 8-byte aligned.
    #[inline]
    pub fn ring(&self, off: usize, value: u64) {
        self.0.ring_doorbell(off, value);
    }
}

/// A queue's doorbell: the device's doorbell page, which the driver writes, and for a device
/// model, a monitor page of this queue's own that gets a copy of every write (the model's
/// view of each doorbell as the event it is on hardware; see `emu::mana::DoorbellPage`).
/// On hardware there is no monitor: a ring is the page's store alone.
#[derive(Clone, Debug)]
pub struct Doorbell {
    page: std::sync::Arc<DevMem>,
    monitor: Option<std::sync::Arc<DevMem>>,
}

impl Doorbell {
    /// The doorbell at `page`, with the device model's `monitor` if it gave one.
    pub fn new(page: std::sync::Arc<DevMem>, monitor: Option<std::sync::Arc<DevMem>>) -> Self {
        Self { page, monitor }
    }

    /// Rings: `value` to the page at `off` ([`DevMem::ring_doorbell`]), and to the monitor.
    ///
    /// # Panics
    /// `off` outside the page or not 8-byte aligned.
    #[inline]
    pub fn ring(&self, off: usize, value: u64) {
        self.page.ring_doorbell(off, value);
        if let Some(m) = &self.monitor {
            m.ring_doorbell(off, value);
        }
    }

    /// The page.
    pub fn page(&self) -> &std::sync::Arc<DevMem> {
        &self.page
    }
}

/// Buffers a queue owns and the device writes, registered with the device: what a striding
/// RQ posts (its WQEs' big buffers, spec §4.2), which no mbuf pool provides.
///
/// `count` buffers of `bytes` each, rounded up to whole 4 KiB pages so each starts on a page,
/// in one private [`mempool::Mempool`] region (hugepages when the machine has them, pinned),
/// every chunk of which is registered through `reg` when made — `ibv_reg_mr` on hardware, the
/// device model's memory table otherwise: the same hook that registers mbuf pools. The pool
/// never hands out an object: the buffers are reached only through [`DeviceBuffers::mem`].
pub struct DeviceBuffers {
    /// The buffers, one after the other: buffer `i` starts at `i × pitch`.
    pub mem: std::sync::Arc<DevMem>,
    /// The registration's keys; buffer `i`'s is `keys.key_of(i)`. Holding them keeps the
    /// registrations, which are undone before the memory is unmapped.
    pub keys: mempool::ChunkKeys,
    /// Bytes from one buffer's start to the next.
    pub pitch: usize,
}

impl std::fmt::Debug for DeviceBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffers")
            .field("mem", &self.mem)
            .field("pitch", &self.pitch)
            .finish_non_exhaustive()
    }
}

impl DeviceBuffers {
    /// Page size the buffers are aligned to.
    pub const ALIGN: usize = 4096;

    /// Maps and registers `count` buffers of `bytes` (see the type's docs), named `name` in
    /// the logs.
    ///
    /// # Errors
    /// The memory could not be mapped, or a registration failed.
    pub fn new(
        name: &str,
        count: u32,
        bytes: usize,
        reg: impl FnMut(&mempool::ChunkInfo) -> Result<mempool::Registration, mempool::BoxError>,
    ) -> Result<Self, mempool::Error> {
        let pool = mempool::Mempool::new(
            mempool::PoolConfig::new(name, count, bytes)
                .obj_align(Self::ALIGN)
                .cache_size(0),
        )?;
        let keys = pool.register_chunks(reg)?;
        let pitch = pool.obj_size();
        let len = pitch * count as usize;
        let base = pool.obj_ptr(0);
        // SAFETY: `base..base + len` is the pool's whole object span (`count` objects of
        // `pitch` bytes from object 0), mapped read/write for as long as the pool lives; the
        // view keeps the pool alive (it is the `keep`). The pool was made here and stays
        // private: only this view and `keys` (which exposes keys, not the pool) hold it, so
        // no object is ever handed out and nobody makes a Rust reference into the memory;
        // every access goes through this `DevMem` (raw copies) or the device.
        let mem = unsafe { DevMem::from_raw_kept(base, len, pool) };
        Ok(Self {
            mem: std::sync::Arc::new(mem),
            keys,
            pitch,
        })
    }
}

// Hardware formats are little-endian and we store host-order words into queue memory.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "pmd supports little-endian hosts only"
);

/// Copies `n` bytes from `src` to `dst`. Packets, descriptors and completions are mostly
/// short (8 to 64 bytes): those are copied with two overlapping fixed-size moves, inline,
/// instead of a call into the C library's `memcpy`, which costs more than the copy itself at
/// these sizes; longer ones go to `copy_nonoverlapping`.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `n` bytes, and the ranges do not overlap.
#[inline(always)]
unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    /// Moves `N` bytes at the start and `N` at the end of the `n` bytes (`N <= n <= 2N`):
    /// together they cover all of them.
    #[inline(always)]
    unsafe fn ends<const N: usize>(src: *const u8, dst: *mut u8, n: usize) {
        // SAFETY: `N <= n`, so both moves stay inside the `n` valid bytes of each range
        // (the caller's contract); both reads happen before the writes, and the ranges do
        // not overlap, so the overlap of the two moves within one range is harmless.
        unsafe {
            let a = std::ptr::read_unaligned(src.cast::<[u8; N]>());
            let b = std::ptr::read_unaligned(src.add(n - N).cast::<[u8; N]>());
            std::ptr::write_unaligned(dst.cast::<[u8; N]>(), a);
            std::ptr::write_unaligned(dst.add(n - N).cast::<[u8; N]>(), b);
        }
    }
    // SAFETY: each branch stays within `n` bytes (see `ends`), as the caller guarantees.
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                *dst = *src;
                *dst.add(n / 2) = *src.add(n / 2);
                *dst.add(n - 1) = *src.add(n - 1);
            }
            4..=7 => ends::<4>(src, dst, n),
            8..=15 => ends::<8>(src, dst, n),
            16..=31 => ends::<16>(src, dst, n),
            32..=64 => ends::<32>(src, dst, n),
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

/// Gives `file` `len` bytes of real storage now (fallocate(2), mode 0), so that running out
/// shows here as an error rather than later as a SIGBUS on first touch of the mapping: a
/// hugetlbfs mount with too few pages (or a hugetlb cgroup limit) answers ENOSPC or ENOMEM,
/// a full tmpfs ENOSPC. A filesystem without fallocate gets `set_len` instead.
///
/// # Errors
/// The fallocate(2) error.
pub fn allocate_file(file: &std::fs::File, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let Ok(len_off) = libc::off_t::try_from(len) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: fallocate only reads its integer arguments; the descriptor is open for
        // writing for the duration of the call (borrowed from `file`).
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_off) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // A signal arrived while hugetlbfs was reserving pages: not a lack of them.
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) => return file.set_len(len as u64),
            _ => return Err(e),
        }
    }
}

/// The queue-buffer allocator contract of `manadv_set_context_attr(ctx,
/// MANADV_CTX_ATTR_BUF_ALLOCATORS, ..)` (mana spec §1.3) and of
/// `mlx5dv_set_context_attr(ctx, MLX5DV_CTX_ATTR_BUF_ALLOCATORS, ..)` (rdma-core v44
/// providers/mlx5 `buf.c`, and `dbrec.c:50–85` for the doorbell-record pages): CQ, SQ and RQ rings live in memory the
/// application provides, page-aligned and zero-filled (a zero owner field means "empty"), and
/// mapped until the queue is destroyed.
pub trait QueueAllocator: Send + Sync {
    /// `size` bytes of page-aligned, zeroed memory.
    ///
    /// # Errors
    /// The memory could not be had.
    fn alloc(&self, size: usize) -> std::io::Result<std::sync::Arc<DevMem>>;

    /// Whether its memory is in shared files another process maps (the rings of exported
    /// queue pairs): the device must then serve the queues without the polling threads'
    /// help (no inline device model).
    fn is_shared(&self) -> bool {
        false
    }
}

/// Queue memory from anonymous page mappings (page-aligned and zeroed by the kernel).
#[derive(Debug, Default, Clone, Copy)]
pub struct PageAllocator;

impl QueueAllocator for PageAllocator {
    fn alloc(&self, size: usize) -> std::io::Result<std::sync::Arc<DevMem>> {
        DevMem::anon(size).map(std::sync::Arc::new)
    }
}

/// Queue memory in shared files, one per ring, so that another process can map the rings
/// of a queue it polls (a secondary, see `pmd::mp`): `DIR/TAG.N` (made new: an existing file
/// is an error, so give each process its own tag), zero-filled by the kernel, removed when
/// the ring's memory is dropped. Use a tmpfs or hugetlbfs directory.
#[derive(Debug)]
pub struct SharedFileAllocator {
    dir: std::path::PathBuf,
    tag: String,
    next: std::sync::atomic::AtomicU32,
}

impl SharedFileAllocator {
    /// Rings as files `dir/tag.N`.
    pub fn new(dir: impl Into<std::path::PathBuf>, tag: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            tag: tag.into(),
            next: std::sync::atomic::AtomicU32::new(0),
        }
    }
}

impl SharedFileAllocator {
    /// The allocator for one configuration of an exporting port: files
    /// `dir/TAG-PID-N.K`, with `N` new for every call in this process, since the last
    /// configuration's rings may still be mapped by handles that have not caught up.
    pub fn for_configuration(dir: &Path, tag: &str) -> Self {
        static CONFIGS: AtomicU32 = AtomicU32::new(0);
        let n = CONFIGS.fetch_add(1, Ordering::Relaxed);
        Self::new(dir, format!("{tag}-{}-{n}", std::process::id()))
    }
}

impl QueueAllocator for SharedFileAllocator {
    fn alloc(&self, size: usize) -> std::io::Result<std::sync::Arc<DevMem>> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!("{}.{n}", self.tag));
        let bytes = size.max(1).next_multiple_of(4096);
        DevMem::create_shared_file(&path, bytes).map(std::sync::Arc::new)
    }

    fn is_shared(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_window_takes_stores_inside_it_only() {
        let m = DevMem::anon(4096).unwrap();
        assert!(m.window(4096 - 32, 33).is_none());
        assert!(m.window(4097, 0).is_none());
        let w = m.window(64, 48).unwrap();
        w.write_2x64(32, 1, 2);
        let mut b = [0u8; 16];
        m.read(96, &mut b);
        assert_eq!(b[..8], 1u64.to_ne_bytes());
        assert_eq!(b[8..], 2u64.to_ne_bytes());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.write_2x64(33, 0, 0)));
        assert!(r.is_err(), "a store past the window's end");
        let tiny = m.window(0, 8).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tiny.write_2x64(0, 0, 0)));
        assert!(r.is_err(), "a window shorter than one store");
    }
    use super::*;

    #[test]
    fn copies_of_every_short_length_move_exactly_their_bytes() {
        let m = DevMem::anon(4096).unwrap();
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..=130 {
            for at in [0usize, 1, 7, 63, 1000] {
                m.fill(0, 2048, 0xee);
                m.write(at + 8, &src[..n]);
                let mut out = vec![0x55u8; n + 16];
                m.read(at, &mut out);
                assert!(out[..8].iter().all(|&b| b == 0xee), "n {n} at {at}: before");
                assert_eq!(&out[8..8 + n], &src[..n], "n {n} at {at}");
                assert!(
                    out[8 + n..].iter().all(|&b| b == 0xee),
                    "n {n} at {at}: after"
                );
                let other = DevMem::anon(4096).unwrap();
                other.copy_from(at, &m, at + 8, n);
                let mut back = vec![0u8; n];
                other.read(at, &mut back);
                assert_eq!(back, &src[..n]);
            }
        }
        m.prefetch(64);
        m.prefetch_write(4095);
        m.prefetch(1 << 40);
    }

    #[test]
    fn anon_is_zeroed_page_aligned_and_round_trips() {
        let m = DevMem::anon(8192).unwrap();
        assert_eq!(m.addr() % 4096, 0);
        let mut buf = [1u8; 64];
        m.read(8192 - 64, &mut buf);
        assert!(buf.iter().all(|&b| b == 0));
        m.write(100, b"hello");
        let mut out = [0u8; 5];
        m.read(100, &mut out);
        assert_eq!(&out, b"hello");
        m.store_u64(8, 0x1122_3344_5566_7788, Ordering::Release);
        let mut le = [0u8; 8];
        m.read(8, &mut le);
        assert_eq!(u64::from_le_bytes(le), 0x1122_3344_5566_7788);
        assert_eq!(m.load_u32(12, Ordering::Acquire), 0x1122_3344);
    }

    #[test]
    fn device_buffers_are_page_aligned_registered_and_writable() {
        let mut seen = Vec::new();
        let b = DeviceBuffers::new("devbuf-test", 3, 5000, |c| {
            seen.push((c.addr, c.len));
            Ok(mempool::Registration::new(mempool::Lkey(0x77)))
        })
        .unwrap();
        assert_eq!(b.pitch, 8192);
        assert_eq!(b.mem.len(), 3 * 8192);
        assert_eq!(b.mem.addr() % DeviceBuffers::ALIGN, 0);
        assert_eq!(seen, vec![(b.mem.addr(), 3 * 8192)]);
        assert_eq!(
            (0..3).map(|i| b.keys.key_of(i)).collect::<Vec<_>>(),
            [Some(mempool::Lkey(0x77)); 3]
        );
        b.mem.write(2 * 8192 + 4999, &[9]);
        let mut x = [0u8];
        b.mem.read(2 * 8192 + 4999, &mut x);
        assert_eq!(x, [9]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_range_panics_instead_of_corrupting() {
        let m = DevMem::anon(4096).unwrap();
        m.write(4090, &[0u8; 8]);
    }

    #[test]
    fn shared_file_is_seen_by_a_second_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shm");
        let a = DevMem::shared_file(&p, 4096, true).unwrap();
        let b = DevMem::shared_file(&p, 4096, false).unwrap();
        a.store_u64(64, 42, Ordering::Release);
        assert_eq!(b.load_u64(64, Ordering::Acquire), 42);
        assert!(DevMem::shared_file(&p, 8192, false).is_err());
    }
}
