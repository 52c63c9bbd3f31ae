//! Memory regions backed by hugepages (2 MiB or 1 GiB), or by normal 4 KiB pages as a fallback.
//!
//! A [`Region`] is one `mmap`: anonymous (`MAP_HUGETLB` with the `MAP_HUGE_2MB` / `MAP_HUGE_1GB`
//! size flag) for memory used by one process, or a file on a hugetlbfs mount (given a path) when
//! another process must map the same memory. The memory is zero-filled, pre-faulted
//! (`MAP_POPULATE`) and locked (`mlock`) so the datapath never takes a page fault.
//!
//! When hugepages cannot be had, the region falls back to 4 KiB pages and logs **one**
//! `tracing::warn!` per process (target `mempool`) saying how to reserve them. Setting
//! `PMD_NO_HUGEPAGES=1` (or choosing [`PagePolicy::Normal`]) forces the 4 KiB path, so it is
//! exercised even on machines that have hugepages. [`Region::page_size`] reports what was used.
//!
//! Unsafe code in this module: `fstatfs` on a shared file (to learn the page size of its
//! filesystem) and reading the kernel's answer, and mapping another process's shared file at
//! the address that process uses ([`Region::attach_shared_at`]: `mmap` with
//! `MAP_FIXED_NOREPLACE`, `mlock`, `munmap`).
#![allow(unsafe_code)]

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Once;

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{mib_ceil, Error};

/// Environment variable that forces normal 4 KiB pages for anonymous regions when set to
/// anything but `0` or the empty string.
pub const NO_HUGEPAGES_ENV: &str = "PMD_NO_HUGEPAGES";

const LOG: &str = "mempool";
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// The page size that backs a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// Normal 4 KiB pages (the fallback).
    Normal4K,
    /// 2 MiB hugepages.
    Huge2M,
    /// 1 GiB hugepages.
    Huge1G,
}

impl PageSize {
    /// Page size in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            PageSize::Normal4K => 4 << 10,
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// Whether this is a hugepage size.
    pub const fn is_huge(self) -> bool {
        !matches!(self, PageSize::Normal4K)
    }

    /// The page size with this many bytes, if it is one of ours.
    pub const fn from_bytes(bytes: u64) -> Option<PageSize> {
        match bytes {
            0x1000 => Some(PageSize::Normal4K),
            0x20_0000 => Some(PageSize::Huge2M),
            0x4000_0000 => Some(PageSize::Huge1G),
            _ => None,
        }
    }

    /// log2 of the page size: the value mmap(2) wants shifted into `MAP_HUGE_SHIFT`.
    const fn log2(self) -> u8 {
        match self {
            PageSize::Normal4K => 12,
            PageSize::Huge2M => 21,
            PageSize::Huge1G => 30,
        }
    }

    /// The sysfs directory that counts pages of this size (hugepages only).
    fn sysfs_dir(self) -> String {
        format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB",
            self.bytes() >> 10
        )
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageSize::Normal4K => "4 KiB",
            PageSize::Huge2M => "2 MiB",
            PageSize::Huge1G => "1 GiB",
        })
    }
}

/// Which pages a region may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PagePolicy {
    /// Largest hugepage that suits the size (1 GiB pages for regions of 1 GiB or more, else
    /// 2 MiB), then smaller hugepages, then 4 KiB pages with a one-time warning.
    /// `PMD_NO_HUGEPAGES=1` turns this into the 4 KiB fallback.
    #[default]
    Auto,
    /// Exactly this page size, or an error.
    Require(PageSize),
    /// Normal 4 KiB pages, chosen on purpose (no warning).
    Normal,
}

/// How to create a [`Region`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RegionOptions {
    /// Which pages to use.
    pub policy: PagePolicy,
    /// Back the region with this file (on a hugetlbfs mount for hugepages, or e.g. `/dev/shm`
    /// for 4 KiB pages) so that another process can map the same memory with
    /// [`Region::attach_shared`]. The file is created (or truncated) and removed again when the
    /// region is dropped. `None`: anonymous memory, private to this process.
    pub shared_file: Option<PathBuf>,
    /// `mlock` the region (default `true`). A failure (RLIMIT_MEMLOCK) is a one-time warning.
    pub lock: bool,
    /// Pre-fault the region with `MAP_POPULATE` (default `true`).
    pub populate: bool,
}

impl Default for RegionOptions {
    fn default() -> Self {
        RegionOptions {
            policy: PagePolicy::Auto,
            shared_file: None,
            lock: true,
            populate: true,
        }
    }
}

impl RegionOptions {
    /// Options with this page policy and the defaults otherwise.
    pub fn with_policy(policy: PagePolicy) -> Self {
        RegionOptions {
            policy,
            ..RegionOptions::default()
        }
    }

    /// The same options, backed by a shared file at `path`.
    pub fn shared_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.shared_file = Some(path.into());
        self
    }

    /// The same options with `mlock` on or off.
    pub fn lock(mut self, lock: bool) -> Self {
        self.lock = lock;
        self
    }

    /// The same options with pre-faulting on or off.
    pub fn populate(mut self, populate: bool) -> Self {
        self.populate = populate;
        self
    }
}

/// One mapping of zero-filled, pre-faulted, locked memory.
///
/// The mapping is released when the region is dropped. The region never hands out references
/// to its bytes, only [`Region::as_ptr`]: the users (the pool, the NIC) access them as raw memory.
pub struct Region {
    map: Mapping,
    page_size: PageSize,
    locked: bool,
    /// The shared file we created and remove on drop.
    owned_file: Option<PathBuf>,
    shared_path: Option<PathBuf>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("page_size", &self.page_size)
            .field("locked", &self.locked)
            .field("shared_path", &self.shared_path)
            .finish()
    }
}

impl Region {
    /// Maps at least `len` bytes (rounded up to the page size) as `opts` says.
    ///
    /// # Errors
    /// [`Error::ZeroLength`]; [`Error::Map`] when even 4 KiB pages cannot be mapped;
    /// [`Error::HugepagesUnavailable`] / [`Error::HugepagesDisabled`] for
    /// [`PagePolicy::Require`]; [`Error::SharedFile`] / [`Error::SharedFilePageSize`] for a
    /// shared file.
    pub fn new(len: usize, opts: &RegionOptions) -> Result<Region, Error> {
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        let region = match &opts.shared_file {
            Some(path) => Region::create_shared(len, path, opts)?,
            None => Region::map_anonymous(len, opts)?,
        };
        let region = region.lock_if(opts.lock);
        tracing::debug!(
            target: LOG,
            addr = format_args!("{:#x}", region.addr()),
            bytes = region.len(),
            page_size = %region.page_size,
            locked = region.locked,
            shared = ?region.shared_path,
            "mapped region"
        );
        Ok(region)
    }

    /// Maps a shared-memory file that another process created with
    /// [`RegionOptions::shared_file`], whole. The memory is what that process wrote; the file is
    /// left in place when this region is dropped.
    ///
    /// # Errors
    /// [`Error::SharedFile`] when the file cannot be opened, inspected or mapped;
    /// [`Error::SharedFileEmpty`] when it has no pages yet.
    pub fn attach_shared(path: &Path, opts: &RegionOptions) -> Result<Region, Error> {
        let (file, len, page_size) = open_shared(path)?;
        let file_err = |what| shared_file_err(path, what);
        let mut mo = MmapOptions::new();
        mo.len(len);
        if opts.populate {
            mo.populate();
        }
        let map = mo.map_raw(&file).map_err(file_err("mmap"))?;
        let region = Region {
            map: Mapping::Map(map),
            page_size,
            locked: false,
            owned_file: None,
            shared_path: Some(path.to_owned()),
        };
        Ok(region.lock_if(opts.lock))
    }

    /// Maps the whole shared-memory file at `path` (made by another process with
    /// [`RegionOptions::shared_file`]) at `addr`, the address that process maps it at:
    /// memory whose contents name addresses (an mbuf pool's headers, memory registered with
    /// a NIC by address) reads the same in both processes only there. Never replaces what
    /// this process has mapped: a range in use is refused, naming what uses it.
    ///
    /// # Errors
    /// [`Error::AddressTaken`]; [`Error::SharedFile`] (open, stat, fstatfs, mmap; `addr` not
    /// page-aligned is `EINVAL`); [`Error::SharedFileEmpty`].
    pub fn attach_shared_at(
        path: &Path,
        addr: usize,
        opts: &RegionOptions,
    ) -> Result<Region, Error> {
        let (file, len, page_size) = open_shared(path)?;
        let file_err = |what| shared_file_err(path, what);
        let mut flags = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE;
        if opts.populate {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping (the kernel fails
        // with EEXIST instead), so no memory this process uses changes; the file descriptor
        // is open for reading and writing; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EEXIST) {
                return Err(Error::AddressTaken {
                    path: path.to_owned(),
                    addr,
                    len,
                    taken_by: maps_overlapping(addr, len),
                });
            }
            return Err(file_err("mmap")(e));
        }
        if ptr as usize != addr {
            // A kernel older than 4.17 takes the flag as a hint and may map elsewhere.
            // SAFETY: `ptr`..`ptr + len` is the mapping just made, used by nothing yet.
            unsafe { libc::munmap(ptr, len) };
            return Err(Error::AddressTaken {
                path: path.to_owned(),
                addr,
                len,
                taken_by: format!(
                    "the kernel mapped it at {:#x} instead: MAP_FIXED_NOREPLACE needs Linux 4.17",
                    ptr as usize
                ),
            });
        }
        let region = Region {
            map: Mapping::Fixed {
                ptr: ptr.cast(),
                len,
            },
            page_size,
            locked: false,
            owned_file: None,
            shared_path: Some(path.to_owned()),
        };
        Ok(region.lock_if(opts.lock))
    }

    /// Start of the mapping.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.map {
            Mapping::Map(m) => m.as_mut_ptr(),
            Mapping::Fixed { ptr, .. } => *ptr,
        }
    }

    /// Start of the mapping as an address.
    #[inline]
    pub fn addr(&self) -> usize {
        self.as_ptr() as usize
    }

    /// Length of the mapping in bytes (a whole number of pages).
    #[inline]
    pub fn len(&self) -> usize {
        match &self.map {
            Mapping::Map(m) => m.len(),
            Mapping::Fixed { len, .. } => *len,
        }
    }

    /// Always `false`: regions have at least one page.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The page size actually used.
    #[inline]
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Whether `mlock` succeeded.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The shared file backing this region, if any.
    pub fn shared_path(&self) -> Option<&Path> {
        self.shared_path.as_deref()
    }

    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr() && addr.saturating_add(len) <= self.addr() + self.len()
    }

    fn map_anonymous(len: usize, opts: &RegionOptions) -> Result<Region, Error> {
        let forced_off = hugepages_disabled_by_env();
        let candidates: &[PageSize] = match opts.policy {
            PagePolicy::Require(p) => {
                if forced_off && p.is_huge() {
                    return Err(Error::HugepagesDisabled { page_size: p });
                }
                return Region::map_anon_exact(len, p, opts.populate).map_err(|source| {
                    if p.is_huge() {
                        Error::HugepagesUnavailable {
                            page_size: p,
                            kib: p.bytes() >> 10,
                            bytes: round_up(len, p),
                            free: hugepages_free(p).unwrap_or(0),
                            source,
                        }
                    } else {
                        map_error(len, p, source)
                    }
                });
            }
            PagePolicy::Normal => &[],
            PagePolicy::Auto if forced_off => {
                warn_fallback(len, &format!("{NO_HUGEPAGES_ENV} is set"));
                &[]
            }
            PagePolicy::Auto if len >= PageSize::Huge1G.bytes() => {
                &[PageSize::Huge1G, PageSize::Huge2M]
            }
            PagePolicy::Auto => &[PageSize::Huge2M],
        };
        let mut last_err = None;
        for &p in candidates {
            match Region::map_anon_exact(len, p, opts.populate) {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(target: LOG, bytes = len, page_size = %p, error = %e, "hugepage mmap failed");
                    last_err = Some((p, e));
                }
            }
        }
        if let Some((p, e)) = last_err {
            let free = hugepages_free(p).unwrap_or(0);
            warn_fallback(
                len,
                &format!("mapping {p} hugepages failed ({free} free): {e}"),
            );
        }
        Region::map_anon_exact(len, PageSize::Normal4K, opts.populate)
            .map_err(|source| map_error(len, PageSize::Normal4K, source))
    }

    fn map_anon_exact(len: usize, page_size: PageSize, populate: bool) -> io::Result<Region> {
        let bytes = round_up(len, page_size);
        let mut mo = MmapOptions::new();
        mo.len(bytes);
        if page_size.is_huge() {
            mo.huge(Some(page_size.log2()));
        }
        if populate {
            mo.populate();
        }
        let map = MmapRaw::from(mo.map_anon()?);
        Ok(Region {
            map: Mapping::Map(map),
            page_size,
            locked: false,
            owned_file: None,
            shared_path: None,
        })
    }

    fn create_shared(len: usize, path: &Path, opts: &RegionOptions) -> Result<Region, Error> {
        let file_err = |what| {
            move |source| Error::SharedFile {
                path: path.to_owned(),
                what,
                source,
            }
        };
        // A file already there (a pool of a process that died, or of one still running) is
        // unlinked, not truncated: whoever still maps it keeps its memory, instead of getting
        // SIGBUS or sharing a pool rebuilt under it.
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(file_err("remove the old")(e));
            }
            _ => {}
        }
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(file_err("open"))?;
        // From here on the file is ours: remove it again if anything below fails.
        let cleanup = RemoveOnDrop(Some(path.to_owned()));
        let page_size = fs_page_size(&file).map_err(file_err("fstatfs"))?;
        match opts.policy {
            PagePolicy::Require(required) if required != page_size => {
                return Err(Error::SharedFilePageSize {
                    path: path.to_owned(),
                    actual: page_size,
                    required,
                });
            }
            PagePolicy::Auto if !page_size.is_huge() => warn_fallback(
                len,
                &format!("shared file {} is not on a hugetlbfs mount", path.display()),
            ),
            _ => {}
        }
        let bytes = round_up(len, page_size);
        // A fresh (truncated) file reads as zeros, on tmpfs and hugetlbfs alike.
        file.set_len(bytes as u64).map_err(file_err("set_len"))?;
        let mut mo = MmapOptions::new();
        mo.len(bytes);
        if opts.populate {
            mo.populate();
        }
        let map = mo.map_raw(&file).map_err(|source| {
            if page_size.is_huge() {
                Error::HugepagesUnavailable {
                    page_size,
                    kib: page_size.bytes() >> 10,
                    bytes,
                    free: hugepages_free(page_size).unwrap_or(0),
                    source,
                }
            } else {
                Error::SharedFile {
                    path: path.to_owned(),
                    what: "mmap",
                    source,
                }
            }
        })?;
        Ok(Region {
            map: Mapping::Map(map),
            page_size,
            locked: false,
            owned_file: cleanup.disarm(),
            shared_path: Some(path.to_owned()),
        })
    }

    fn lock_if(mut self, lock: bool) -> Region {
        if !lock {
            return self;
        }
        match self.map.lock() {
            Ok(()) => self.locked = true,
            Err(e) => {
                static MLOCK_WARNED: Once = Once::new();
                let bytes = self.len();
                let mut first = false;
                MLOCK_WARNED.call_once(|| {
                    first = true;
                    tracing::warn!(
                        target: LOG,
                        "mlock of {bytes} bytes failed ({e}): packet memory may be swapped out. \
                         Raise RLIMIT_MEMLOCK (`ulimit -l unlimited`, or LimitMEMLOCK=infinity for \
                         a systemd service). Continuing unlocked; this is reported once."
                    );
                });
                if !first {
                    tracing::debug!(target: LOG, bytes, error = %e, "mlock failed");
                }
            }
        }
        self
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Mapping::Fixed { ptr, len } = self.map {
            // SAFETY: the mapping is this region's alone and nothing borrows it past the
            // region's life (the region hands out raw pointers only, whose users keep the
            // region alive).
            unsafe { libc::munmap(ptr.cast(), len) };
        }
        if let Some(path) = self.owned_file.take() {
            if let Err(e) = fs::remove_file(&path) {
                tracing::debug!(target: LOG, path = %path.display(), error = %e, "could not remove shared file");
            }
        }
    }
}

/// The `Error::SharedFile` of `path` for a failed step (`open`, `stat`, `mmap`, ...).
fn shared_file_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::SharedFile {
        path: path.to_owned(),
        what,
        source,
    }
}

/// Opens another process's shared-memory file for mapping whole: the file, its length and the
/// page size of its filesystem.
fn open_shared(path: &Path) -> Result<(File, usize, PageSize), Error> {
    let file_err = |what| shared_file_err(path, what);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(file_err("open"))?;
    let len = file.metadata().map_err(file_err("stat"))?.len();
    if len == 0 {
        return Err(Error::SharedFileEmpty {
            path: path.to_owned(),
        });
    }
    let len =
        usize::try_from(len).map_err(|_| file_err("stat")(io::ErrorKind::InvalidData.into()))?;
    let page_size = fs_page_size(&file).map_err(file_err("fstatfs"))?;
    Ok((file, len, page_size))
}

/// A region's mapping: made by memmap2, or by mmap(2) itself where the address is chosen
/// (memmap2 cannot place a mapping).
enum Mapping {
    Map(MmapRaw),
    Fixed { ptr: *mut u8, len: usize },
}

// SAFETY: a `Fixed` mapping is plain shared memory owned by its region, like the `MmapRaw`
// one (which is Send and Sync); the region hands out raw pointers only.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn lock(&self) -> io::Result<()> {
        match self {
            Mapping::Map(m) => m.lock(),
            Mapping::Fixed { ptr, len } => {
                // SAFETY: mlock only pins the pages of this mapping; it reads no memory.
                let rc = unsafe { libc::mlock(ptr.cast(), *len) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
        }
    }
}

/// The lines of `/proc/self/maps` that overlap `addr..addr + len`, joined, for a message.
fn maps_overlapping(addr: usize, len: usize) -> String {
    let Ok(maps) = fs::read_to_string("/proc/self/maps") else {
        return "see /proc/self/maps".into();
    };
    let end = addr.saturating_add(len);
    let hits: Vec<String> = maps
        .lines()
        .filter(|l| {
            let Some((range, _)) = l.split_once(' ') else {
                return false;
            };
            let Some((a, b)) = range.split_once('-') else {
                return false;
            };
            let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                return false;
            };
            a < end && b > addr
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    if hits.is_empty() {
        "an address the kernel refused".into()
    } else {
        hits.join("; ")
    }
}

/// Removes a file on drop unless disarmed: cleanup for a half-created shared region.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn disarm(mut self) -> Option<PathBuf> {
        self.0.take()
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Whether `PMD_NO_HUGEPAGES` is set to something other than `0` / empty.
pub fn hugepages_disabled_by_env() -> bool {
    match std::env::var_os(NO_HUGEPAGES_ENV) {
        Some(v) => !(v.is_empty() || v == "0"),
        None => false,
    }
}

/// Free hugepages of this size according to sysfs (`None` for 4 KiB pages, or when sysfs does
/// not say).
pub fn hugepages_free(page_size: PageSize) -> Option<u64> {
    if !page_size.is_huge() {
        return None;
    }
    let text = fs::read_to_string(format!("{}/free_hugepages", page_size.sysfs_dir())).ok()?;
    text.trim().parse().ok()
}

fn round_up(len: usize, page: PageSize) -> usize {
    len.div_ceil(page.bytes()).saturating_mul(page.bytes())
}

fn map_error(len: usize, page_size: PageSize, source: io::Error) -> Error {
    let bytes = round_up(len, page_size);
    Error::Map {
        bytes,
        mib: mib_ceil(bytes),
        page_size,
        source,
    }
}

/// The one warning about running without hugepages (later fallbacks log at debug level).
fn warn_fallback(len: usize, why: &str) {
    static FALLBACK_WARNED: Once = Once::new();
    let mut first = false;
    FALLBACK_WARNED.call_once(|| {
        first = true;
        tracing::warn!(
            target: LOG,
            "no hugepages for a {len}-byte region ({why}): using normal 4 KiB pages, which cost \
             TLB misses on the datapath. Reserve 2 MiB hugepages with `echo 512 > \
             /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages` and, for pools shared \
             between processes, `mkdir -p /dev/hugepages && mount -t hugetlbfs nodev \
             /dev/hugepages`. This is reported once per process."
        );
    });
    if !first {
        tracing::debug!(target: LOG, bytes = len, reason = why, "using 4 KiB pages");
    }
}

/// Page size of the filesystem holding `file`: the hugepage size on hugetlbfs, else 4 KiB.
fn fs_page_size(file: &File) -> io::Result<PageSize> {
    // SAFETY: `statfs` is plain old data (integers only), so all-zero bytes are a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the duration of the call (borrowed from `file`), and
    // `st` is a valid, writable `statfs` that the kernel fills in.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // `f_type` is a signed word on some targets; the magic is a 32-bit value.
    #[allow(clippy::unnecessary_cast)]
    let fs_type = st.f_type as u64 & 0xffff_ffff;
    if fs_type != HUGETLBFS_MAGIC {
        return Ok(PageSize::Normal4K);
    }
    #[allow(clippy::unnecessary_cast)]
    let bsize = st.f_bsize as u64;
    PageSize::from_bytes(bsize).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("hugetlbfs page size of {bsize} bytes is neither 2 MiB nor 1 GiB"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_byte(r: &Region, off: usize) -> u8 {
        assert!(off < r.len());
        // SAFETY: `off` is inside the mapping, which lives as long as `r`; nothing else writes it.
        unsafe { r.as_ptr().add(off).read() }
    }

    #[test]
    fn normal_policy_maps_zeroed_4k_pages() {
        let r = Region::new(10_000, &RegionOptions::with_policy(PagePolicy::Normal)).unwrap();
        assert_eq!(r.page_size(), PageSize::Normal4K);
        assert_eq!(r.len(), 12_288, "rounded up to whole 4 KiB pages");
        assert!((0..r.len()).step_by(97).all(|o| read_byte(&r, o) == 0));
        assert!(r.contains(r.addr(), r.len()));
        assert!(!r.contains(r.addr() + 1, r.len()));
    }

    #[test]
    fn zero_length_is_an_error() {
        assert!(matches!(
            Region::new(0, &RegionOptions::default()),
            Err(Error::ZeroLength)
        ));
    }

    #[test]
    fn page_size_bytes_round_trip() {
        for p in [PageSize::Normal4K, PageSize::Huge2M, PageSize::Huge1G] {
            assert_eq!(PageSize::from_bytes(p.bytes() as u64), Some(p));
            assert_eq!(1usize << p.log2(), p.bytes());
        }
        assert_eq!(PageSize::from_bytes(8192), None);
        assert_eq!(PageSize::Huge2M.to_string(), "2 MiB");
    }

    #[test]
    fn shared_file_on_tmpfs_is_normal_pages_and_removed_on_drop() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("mempool-region-test-{}", std::process::id()));
        let opts = RegionOptions {
            shared_file: Some(path.clone()),
            policy: PagePolicy::Normal,
            ..RegionOptions::default()
        };
        let r = Region::new(5000, &opts).unwrap();
        assert!(path.exists());
        assert_eq!(r.shared_path(), Some(path.as_path()));
        // A second mapping of the same file sees the first one's writes.
        let other = Region::attach_shared(&path, &RegionOptions::default()).unwrap();
        assert_eq!(other.len(), r.len());
        // SAFETY: offset 100 is inside both mappings, which live until the end of the test.
        unsafe { r.as_ptr().add(100).write(0xa5) };
        assert_eq!(read_byte(&other, 100), 0xa5);
        drop(other);
        assert!(path.exists(), "attaching does not own the file");
        drop(r);
        assert!(!path.exists(), "the creator removes the file");
    }

    #[test]
    fn attach_to_missing_file_names_the_file() {
        let err = Region::attach_shared(
            Path::new("/nonexistent/mempool-x"),
            &RegionOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/mempool-x"), "{err}");
    }
}
