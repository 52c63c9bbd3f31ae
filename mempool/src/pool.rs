//! The shared part of an object pool: fixed-size objects in one [`Region`], free objects as
//! `u32` indices in a lock-free ring (`crossbeam_queue::ArrayQueue`s, see `ring.rs`).
//!
//! Threads normally go through a [`PoolCache`](crate::PoolCache) each, which serves bulk gets
//! and puts from a plain per-thread array and touches this ring only to refill or flush in bulk
//! (DPDK's design). The methods here work on the ring directly (a cache size of 0).
#![deny(unsafe_code)]

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::audit::Audit;
use crate::chunk::{ChunkInfo, ChunkKeys, Layout, Registration};
use crate::error::{mib_ceil, BoxError, Error};
use crate::region::{PagePolicy, PageSize, Region, RegionOptions};
use crate::ring::{Ring, PACK};
use crate::shm::{self, Ctl, CtlLayout};

const LOG: &str = "mempool";

/// Default per-core cache size (objects), as in DPDK's usual configuration.
pub const DEFAULT_CACHE_SIZE: u32 = 512;
/// Largest per-core cache size accepted.
pub const MAX_CACHE_SIZE: u32 = 1024;
/// Default cap on one chunk (one memory registration): 1 GiB.
pub const DEFAULT_MAX_CHUNK_BYTES: usize = 1 << 30;
/// Default object alignment: one cache line.
pub const DEFAULT_OBJ_ALIGN: usize = 64;
/// Largest object count (indices are `u32`, and `u32::MAX` is reserved as "no object").
pub const MAX_OBJECTS: u32 = u32::MAX - 1;

/// A registration hook: told each chunk at pool creation, returns its key (see [`ChunkInfo`]).
pub type ChunkHook = Box<dyn FnMut(&ChunkInfo) -> Result<Registration, BoxError> + Send>;

/// How to build a [`Mempool`]. Start from [`PoolConfig::new`] and adjust with the builder methods.
pub struct PoolConfig {
    name: String,
    obj_count: u32,
    obj_size: usize,
    obj_align: usize,
    cache_size: Option<u32>,
    max_chunk_bytes: usize,
    region: RegionOptions,
    on_chunk: Option<ChunkHook>,
    kind: &'static str,
}

impl fmt::Debug for PoolConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolConfig")
            .field("name", &self.name)
            .field("obj_count", &self.obj_count)
            .field("obj_size", &self.obj_size)
            .field("obj_align", &self.obj_align)
            .field("cache_size", &self.cache_size)
            .field("max_chunk_bytes", &self.max_chunk_bytes)
            .field("region", &self.region)
            .field("on_chunk", &self.on_chunk.is_some())
            .finish()
    }
}

impl PoolConfig {
    /// `obj_count` objects of `obj_size` bytes (rounded up to the alignment, 64 by default).
    /// Defaults: cache size 512 (or, for pools too small for that, two thirds of the objects),
    /// chunks of at most 1 GiB, hugepages when available, no registration hook.
    pub fn new(name: impl Into<String>, obj_count: u32, obj_size: usize) -> Self {
        PoolConfig {
            name: name.into(),
            obj_count,
            obj_size,
            obj_align: DEFAULT_OBJ_ALIGN,
            cache_size: None,
            max_chunk_bytes: DEFAULT_MAX_CHUNK_BYTES,
            region: RegionOptions::default(),
            on_chunk: None,
            kind: "object",
        }
    }

    /// Size of each per-core cache, in objects; 0 disables caching (every get and put goes to
    /// the ring). At most [`MAX_CACHE_SIZE`] and at most `obj_count / 1.5`.
    pub fn cache_size(mut self, objects: u32) -> Self {
        self.cache_size = Some(objects);
        self
    }

    /// Object alignment in bytes (a power of two; default 64).
    pub fn obj_align(mut self, bytes: usize) -> Self {
        self.obj_align = bytes;
        self
    }

    /// Largest chunk (one memory registration) in bytes; default 1 GiB.
    pub fn max_chunk_bytes(mut self, bytes: usize) -> Self {
        self.max_chunk_bytes = bytes;
        self
    }

    /// All region options at once.
    pub fn region(mut self, opts: RegionOptions) -> Self {
        self.region = opts;
        self
    }

    /// Which pages to use.
    pub fn page_policy(mut self, policy: PagePolicy) -> Self {
        self.region.policy = policy;
        self
    }

    /// Back the pool with a file (on hugetlbfs for hugepages) so other processes can attach
    /// to it ([`Mempool::attach`]): its free ring, every process's caches and its audit
    /// states are kept in the file too, after the objects. The file is replaced if it exists
    /// and removed when the pool is dropped.
    pub fn shared_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.region.shared_file = Some(path.into());
        self
    }

    /// Registration hook, called once per chunk while the pool is created, before any object
    /// is handed out. Its keys are what [`Mempool::chunk_key`] and [`Mempool::key_for_addr`]
    /// return. An error aborts the creation (earlier registrations are dropped first).
    pub fn on_chunk(
        mut self,
        hook: impl FnMut(&ChunkInfo) -> Result<Registration, BoxError> + Send + 'static,
    ) -> Self {
        self.on_chunk = Some(Box::new(hook));
        self
    }

    /// The pool name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of memory the pool maps (before rounding up to whole pages): every object at its
    /// aligned size. `None` when that overflows (creating the pool then fails with
    /// [`Error::TooLarge`]). What a preflight weighs against the locked-memory limit and the
    /// free hugepages.
    pub fn memory_bytes(&self) -> Option<usize> {
        self.memory_bytes_with(self.obj_size, self.obj_align)
    }

    /// [`PoolConfig::memory_bytes`] once objects are `obj_size` bytes aligned to at least
    /// `align` (what [`PoolConfig::set_mbuf_layout`] would make them).
    pub(crate) fn memory_bytes_with(&self, obj_size: usize, align: usize) -> Option<usize> {
        span_bytes(self.obj_count, obj_size, self.obj_align.max(align))
    }

    /// Object size and minimum alignment of an mbuf pool (set by `MbufPool::new`).
    pub(crate) fn set_mbuf_layout(&mut self, obj_size: usize, align: usize) {
        self.obj_size = obj_size;
        self.obj_align = self.obj_align.max(align);
        self.kind = "mbuf";
    }
}

/// What a shared pool's file says of the pool ([`Mempool::inspect_shared`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPoolInfo {
    /// The pool's name.
    pub name: String,
    /// Objects (mbufs) in it.
    pub objects: u32,
    /// Bytes per object.
    pub obj_bytes: usize,
    /// Where the creator maps the objects (every process that attaches maps them there).
    pub addr: usize,
    /// The creator's pid.
    pub creator_pid: u32,
    /// Per-core cache size.
    pub cache_size: u32,
    /// Whether it is an mbuf pool (else a plain object pool).
    pub mbufs: bool,
    /// An mbuf pool's headroom (0 for an object pool).
    pub headroom: u16,
    /// An mbuf pool's data room (0 for an object pool).
    pub data_room: u16,
}

/// `count` objects of `obj_size` bytes rounded up to `align`: the span [`Mempool::new`] maps.
pub(crate) fn span_bytes(count: u32, obj_size: usize, align: usize) -> Option<usize> {
    obj_size
        .checked_next_multiple_of(align)?
        .checked_mul(count as usize)
        .filter(|&s| s <= isize::MAX as usize)
}

/// A cache's published length, read by the accounting methods.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct CacheSlot {
    pub(crate) len: AtomicU32,
}

/// Where a pool's free objects are.
// One per pool, and boxing the ring would add a load to every refill and flush.
#[allow(clippy::large_enum_variant)]
enum FreeList {
    /// A private pool: crossbeam queues on this process's heap.
    Local(Ring),
    /// A shared pool: the ring and the caches in the control block of its file.
    Shared(Ctl),
}

/// A fixed-size object pool shared between threads (use it behind an `Arc`).
///
/// Objects are named by `u32` index; [`Mempool::obj_ptr`] turns an index into its address with
/// one multiply-add. Free indices live in a lock-free ring; per-thread
/// [`PoolCache`](crate::PoolCache)s sit in front of it.
///
/// A pool created with a shared file ([`PoolConfig::shared_file`]) is shared between
/// processes: others attach to it with [`Mempool::attach`] and map its objects at the same
/// address; its free ring and every process's caches are in the file (see `shm.rs`).
///
/// Dropping the pool unmaps its memory; objects still in use at that point are reported in a
/// warning (an [`MbufPool`](crate::MbufPool) instead keeps the memory alive for them).
pub struct Mempool {
    ring: FreeList,
    layout: Layout,
    keys: Box<[crate::Lkey]>,
    default_cache_size: u32,
    audit: Audit,
    caches: Mutex<Vec<Arc<CacheSlot>>>,
    chunks: Box<[ChunkInfo]>,
    name: String,
    kind: &'static str,
    /// Whether this process made the pool (else it attached to another's shared pool).
    creator: bool,
    // Field order is drop order: registrations (kept only for their guards) are undone before
    // the region is unmapped.
    _registrations: Vec<Registration>,
    region: Region,
}

impl fmt::Debug for Mempool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mempool")
            .field("name", &self.name)
            .field("capacity", &self.capacity())
            .field("obj_size", &self.layout.obj_size)
            .field("available", &self.available())
            .field("chunks", &self.chunks.len())
            .field("region", &self.region)
            .finish()
    }
}

impl Mempool {
    /// Maps the memory, carves it into chunks and objects, registers the chunks with the hook
    /// (if any) and puts every object in the ring.
    ///
    /// # Errors
    /// Configuration errors ([`Error::EmptyPool`], [`Error::TooLarge`], [`Error::BadAlign`],
    /// [`Error::CacheTooLarge`], [`Error::ChunkTooSmall`]), [`Error::PoolMemory`] when the
    /// memory cannot be mapped, [`Error::Registration`] when the hook fails.
    pub fn new(mut cfg: PoolConfig) -> Result<Arc<Mempool>, Error> {
        let name = cfg.name.clone();
        if cfg.obj_count == 0 || cfg.obj_size == 0 {
            return Err(Error::EmptyPool {
                pool: name,
                objects: cfg.obj_count,
                obj_bytes: cfg.obj_size,
            });
        }
        if !cfg.obj_align.is_power_of_two() {
            return Err(Error::BadAlign {
                pool: name,
                align: cfg.obj_align,
            });
        }
        let too_large = |obj_bytes| Error::TooLarge {
            pool: name.clone(),
            objects: u64::from(cfg.obj_count),
            obj_bytes,
            max: MAX_OBJECTS,
        };
        let obj_size = cfg
            .obj_size
            .checked_next_multiple_of(cfg.obj_align)
            .ok_or_else(|| too_large(cfg.obj_size))?;
        if cfg.obj_count > MAX_OBJECTS {
            return Err(too_large(obj_size));
        }
        let span = span_bytes(cfg.obj_count, obj_size, cfg.obj_align)
            .ok_or_else(|| too_large(obj_size))?;
        let shared = cfg.region.shared_file.is_some();

        let max_cache = max_cache_size(cfg.obj_count);
        let cache_size = match cfg.cache_size {
            Some(c) if c > max_cache => {
                return Err(Error::CacheTooLarge {
                    pool: name,
                    cache_size: c,
                    objects: cfg.obj_count,
                    max: max_cache,
                    limit: MAX_CACHE_SIZE,
                });
            }
            Some(c) => c,
            None => DEFAULT_CACHE_SIZE.min(max_cache),
        };

        let per_chunk = cfg.max_chunk_bytes / obj_size;
        if per_chunk == 0 {
            return Err(Error::ChunkTooSmall {
                pool: name,
                max_chunk_bytes: cfg.max_chunk_bytes,
                obj_bytes: obj_size,
            });
        }
        // Objects per chunk is a power of two so that chunk(i) is a shift; one chunk when
        // everything fits.
        let chunk_shift = if per_chunk >= cfg.obj_count as usize {
            32
        } else {
            per_chunk.ilog2()
        };
        let chunk_bytes = if chunk_shift >= 32 {
            span
        } else {
            obj_size << chunk_shift
        };

        // A shared pool's file holds its control block after the objects.
        let ctl_layout = if shared {
            if name.len() > shm::NAME_MAX {
                return Err(Error::NotASharedPool {
                    path: cfg.region.shared_file.clone().unwrap_or_default(),
                    why: format!("pool name '{name}' is longer than {} bytes", shm::NAME_MAX),
                });
            }
            Some(
                CtlLayout::new(span, cfg.obj_count, cache_size)
                    .ok_or_else(|| too_large(obj_size))?,
            )
        } else {
            None
        };
        let map_len = ctl_layout.map_or(span, |l| l.file_bytes());
        let region = Region::new(map_len, &cfg.region).map_err(|e| Error::PoolMemory {
            pool: name.clone(),
            objects: cfg.obj_count,
            obj_bytes: obj_size,
            mib: mib_ceil(map_len),
            source: Box::new(e),
        })?;
        let layout = Layout {
            base: region.addr(),
            obj_size,
            obj_count: cfg.obj_count,
            chunk_shift,
            chunk_bytes,
            span,
        };
        let chunks = build_chunks(&layout, region.page_size());
        if shared && chunks.len() > shm::MAX_KEYS {
            return Err(Error::NotASharedPool {
                path: cfg.region.shared_file.clone().unwrap_or_default(),
                why: format!(
                    "{} chunks, a shared pool publishes at most {} chunk keys; raise \
                     max_chunk_bytes",
                    chunks.len(),
                    shm::MAX_KEYS
                ),
            });
        }

        let registrations = match cfg.on_chunk.as_mut() {
            Some(hook) => register_all(&name, &chunks, hook)?,
            None => Vec::new(),
        };
        let keys: Box<[crate::Lkey]> = registrations.iter().map(Registration::key).collect();

        let ring = match ctl_layout {
            None => FreeList::Local(Ring::new(cfg.obj_count)),
            Some(l) => {
                let ctl = shm_view(&region, l, cfg.obj_count, true);
                // The file is fresh and only this process has it mapped.
                shm::write_header(&ctl, &name, &layout, cache_size, &keys);
                FreeList::Shared(ctl)
            }
        };
        let mut pack = [0u32; PACK];
        for first in (0..cfg.obj_count).step_by(PACK) {
            let n = PACK.min((cfg.obj_count - first) as usize);
            for (k, slot) in pack[..n].iter_mut().enumerate() {
                *slot = first + k as u32;
            }
            if let Err(idx) = ring.put(&pack[..n]) {
                ring_overflow(&name, cfg.kind, idx);
            }
        }

        tracing::info!(
            target: LOG,
            pool = %name,
            objects = cfg.obj_count,
            obj_bytes = obj_size,
            mib = mib_ceil(span),
            page_size = %region.page_size(),
            locked = region.is_locked(),
            chunks = chunks.len(),
            registered = !registrations.is_empty(),
            cache_size,
            "created pool"
        );

        let audit = match &ring {
            FreeList::Local(_) => Audit::new(cfg.obj_count),
            FreeList::Shared(ctl) => {
                Audit::shared(ctl.audit_states_view(), ctl.claim_owner(shm::this_pid()))
            }
        };
        let pool = Arc::new(Mempool {
            ring,
            layout,
            keys,
            default_cache_size: cache_size,
            audit,
            caches: Mutex::new(Vec::new()),
            chunks,
            name,
            kind: cfg.kind,
            creator: true,
            _registrations: registrations,
            region,
        });
        if shared {
            if !crate::mbuf::register_shared(&pool) {
                return Err(too_many_shared(pool.region.shared_path()));
            }
            if cfg.kind != "mbuf" {
                pool.publish_shared(shm::KIND_OBJECT, 0, 0);
            }
        }
        Ok(pool)
    }

    /// Attaches to a pool another process created with [`PoolConfig::shared_file`]: maps the
    /// file with the objects at the creator's address (DMA addresses and registrations are
    /// the creator's) and uses the free ring and caches in it. The creator's chunk keys come
    /// with it ([`Mempool::chunk_key`]); [`Mempool::register_chunks`] registers the chunks
    /// again, with this process's device.
    ///
    /// # Errors
    /// [`Error::NotASharedPool`] when the file is not a finished pool of this version (every
    /// field of its control block is checked against the others and the file's length);
    /// what [`Region::attach_shared_at`] returns, notably [`Error::AddressTaken`] when this
    /// process already uses the creator's address range.
    pub fn attach(path: &std::path::Path, opts: &RegionOptions) -> Result<Arc<Mempool>, Error> {
        Mempool::attach_kind(path, opts, shm::KIND_OBJECT).map(|(p, _)| p)
    }

    /// What the shared pool file at `path` holds, read without attaching (nothing is mapped
    /// at the creator's address; the file is mapped anywhere, read and unmapped): for tools
    /// that list pools, and to check a file before attaching.
    ///
    /// # Errors
    /// [`Error::NotASharedPool`] (every field is checked as [`Mempool::attach`] checks it);
    /// [`Error::SharedFile`] / [`Error::SharedFileEmpty`] when the file cannot be mapped.
    pub fn inspect_shared(path: &std::path::Path) -> Result<SharedPoolInfo, Error> {
        let probe =
            Region::attach_shared(path, &RegionOptions::default().lock(false).populate(false))?;
        let bad = |why: String| Error::NotASharedPool {
            path: path.to_owned(),
            why,
        };
        // An mbuf pool, else (if it says it is one) an object pool.
        let (kind, found) = match shm::read_header(&probe, shm::KIND_MBUF) {
            Err(why) if why.contains("an object pool, not an mbuf pool") => {
                (shm::KIND_OBJECT, shm::read_header(&probe, shm::KIND_OBJECT))
            }
            other => (shm::KIND_MBUF, other),
        };
        {
            match found {
                Ok(info) => Ok(SharedPoolInfo {
                    name: info.name,
                    objects: info.layout.obj_count,
                    obj_bytes: info.layout.obj_size,
                    addr: info.base,
                    creator_pid: info.creator_pid,
                    cache_size: info.cache_size,
                    mbufs: kind == shm::KIND_MBUF,
                    headroom: info.mbuf.0,
                    data_room: info.mbuf.1,
                }),
                Err(why) => Err(bad(why)),
            }
        }
    }

    /// [`Mempool::attach`] for a pool of `kind`; also returns the mbuf layout (headroom, data
    /// room) the creator stored.
    pub(crate) fn attach_kind(
        path: &std::path::Path,
        opts: &RegionOptions,
        kind: u32,
    ) -> Result<(Arc<Mempool>, (u16, u16)), Error> {
        let bad = |why: String| Error::NotASharedPool {
            path: path.to_owned(),
            why,
        };
        // A first look anywhere, for the address and the layout.
        let probe =
            Region::attach_shared(path, &RegionOptions::default().lock(false).populate(false))?;
        let info = shm::read_header(&probe, kind).map_err(bad)?;
        drop(probe);
        let region = Region::attach_shared_at(path, info.base, opts)?;
        if region.len() < info.ctl.file_bytes() {
            return Err(bad(format!(
                "the file shrank to {} bytes while attaching (the pool needs {})",
                region.len(),
                info.ctl.file_bytes()
            )));
        }
        let ctl = shm_view(&region, info.ctl, info.layout.obj_count, false);
        // Read again from the mapping we keep: the file may have been replaced meanwhile.
        let again = shm::header_info(&ctl, kind, region.len()).map_err(bad)?;
        if again != info {
            return Err(bad(
                "the pool was re-created while attaching; try again".into()
            ));
        }
        let chunks = build_chunks(&info.layout, region.page_size());
        let keys: Box<[crate::Lkey]> = info.keys.iter().map(|&k| crate::Lkey(k)).collect();
        tracing::info!(
            target: LOG,
            pool = %info.name,
            objects = info.layout.obj_count,
            addr = format_args!("{:#x}", info.base),
            creator = info.creator_pid,
            "attached to shared pool"
        );
        let audit = Audit::shared(ctl.audit_states_view(), ctl.claim_owner(shm::this_pid()));
        let pool = Arc::new(Mempool {
            ring: FreeList::Shared(ctl),
            layout: info.layout,
            keys,
            default_cache_size: info.cache_size,
            audit,
            caches: Mutex::new(Vec::new()),
            chunks,
            name: info.name,
            kind: if kind == shm::KIND_MBUF {
                "mbuf"
            } else {
                "object"
            },
            creator: false,
            _registrations: Vec::new(),
            region,
        });
        if !crate::mbuf::register_shared(&pool) {
            return Err(too_many_shared(Some(path)));
        }
        Ok((pool, info.mbuf))
    }

    /// Marks a shared pool's file as finished, so that other processes may attach.
    pub(crate) fn publish_shared(&self, kind: u32, headroom: u16, data_room: u16) {
        if let FreeList::Shared(ctl) = &self.ring {
            shm::publish(ctl, kind, headroom, data_room);
        }
    }

    /// Whether this process made the pool, rather than attached to another's.
    pub fn is_creator(&self) -> bool {
        self.creator
    }

    /// Whether other processes can attach to this pool (it was made with a shared file).
    pub fn is_shared(&self) -> bool {
        matches!(self.ring, FreeList::Shared(_))
    }

    /// The value every mbuf header of a shared pool holds in place of a pointer to its pool:
    /// the same in every process (the objects' address, low bit set). `None` for a private
    /// pool.
    pub(crate) fn shared_tag(&self) -> Option<usize> {
        self.is_shared().then_some(self.layout.base | 1)
    }

    /// Returns the objects that the caches of process `pid` held to the free ring, and frees
    /// the cache slots. Call it when a process that used this shared pool has died (its
    /// control connection closed); calling it for a live process takes its caches away from
    /// under it. Returns how many objects came back.
    ///
    /// Objects the dead process held outside its caches (in queues, in flight) are not
    /// found here: whoever rebuilds its queues returns those.
    ///
    /// # Errors
    /// [`Error::NotShared`] for a private pool.
    pub fn reclaim(&self, pid: u32) -> Result<u32, Error> {
        let FreeList::Shared(ctl) = &self.ring else {
            return Err(Error::NotShared {
                pool: self.name.clone(),
                what: "reclaim a process's caches",
            });
        };
        let (back, bad) = ctl.reclaim_slots(pid);
        // Their objects are free again: so says the audit.
        if bad > 0 {
            tracing::warn!(
                target: LOG,
                pool = %self.name,
                "process {pid}'s caches held {bad} entries that are not objects of the pool; \
                 dropped"
            );
        }
        let (prod, cons) = ctl.ring_stuck();
        if prod || cons {
            tracing::warn!(
                target: LOG,
                pool = %self.name,
                "the pool's free ring has an unfinished {} (a process died inside one); \
                 the pool's users wait on it until the pool is re-created",
                if prod { "put" } else { "get" }
            );
        }
        tracing::info!(target: LOG, pool = %self.name, pid, objects = back, "reclaimed a dead process's caches");
        Ok(back)
    }

    /// Returns to the pool every object dead process `pid` had taken and not given back
    /// outside its caches (which [`Mempool::reclaim`] returns): buffers it had posted to
    /// device queues, frames it had in flight or in hand. Each object in use carries the
    /// owner id of the process that took it, so these are found exactly.
    ///
    /// Call it only once nothing can use those objects any more: the process is gone, and
    /// the device queues it polled are destroyed (a primary rebuilt the queue pairs the
    /// process had attached to); a device could otherwise still write into a buffer the
    /// pool hands out again. Objects the process passed to another process (by index,
    /// through shared memory) are counted as its own: a pool whose objects cross processes
    /// that way must not use this. Returns how many objects came back.
    ///
    /// # Errors
    /// [`Error::NotShared`] for a private pool; [`Error::ProcessAlive`] when `pid` still runs.
    pub fn reclaim_owned(&self, pid: u32) -> Result<u32, Error> {
        let FreeList::Shared(ctl) = &self.ring else {
            return Err(Error::NotShared {
                pool: self.name.clone(),
                what: "reclaim a dead process's objects",
            });
        };
        if !shm::pid_gone(pid) {
            return Err(Error::ProcessAlive {
                pool: self.name.clone(),
                pid,
            });
        }
        let (back, bad) = ctl.reclaim_owned(pid);
        if bad > 0 {
            tracing::warn!(target: LOG, pool = %self.name, pid, bad, "the free ring refused objects of a dead process (it is full: the pool's accounting is corrupt); they stay out, tagged");
        }
        tracing::info!(target: LOG, pool = %self.name, pid, objects = back, "reclaimed a dead process's objects in use");
        Ok(back)
    }

    /// Gives this process's owner id back if nothing carries it (a process detaching from a
    /// shared pool it keeps mapped). Done at drop too.
    pub(crate) fn release_owner_if_unused(&self) {
        if let FreeList::Shared(ctl) = &self.ring {
            let id = self.audit.tag();
            if id != 0 && id != shm::UNTRACKED && ctl.owned_by(id) == 0 {
                ctl.release_owner(id, shm::this_pid());
            }
        }
    }

    /// Objects in use by process `pid` (those tagged with its owner ids; a scan of the
    /// pool's states). 0 for a private pool.
    pub fn owned_by(&self, pid: u32) -> u32 {
        match &self.ring {
            FreeList::Shared(ctl) => ctl.owned_by_pid(pid),
            FreeList::Local(_) => 0,
        }
    }

    /// The processes whose caches hold slots of this shared pool (each pid once); empty for
    /// a private pool.
    pub fn cache_owners(&self) -> Vec<u32> {
        match &self.ring {
            FreeList::Shared(ctl) => ctl.slot_owners(),
            FreeList::Local(_) => Vec::new(),
        }
    }

    /// [`Mempool::reclaim`] if process `pid` is gone (no such process, or a zombie), else
    /// `None`.
    ///
    /// # Errors
    /// [`Error::NotShared`] for a private pool.
    pub fn reclaim_if_gone(&self, pid: u32) -> Result<Option<u32>, Error> {
        if self.is_shared() && !shm::pid_gone(pid) {
            return Ok(None);
        }
        self.reclaim(pid).map(Some)
    }

    /// [`Mempool::reclaim`] for every process that holds cache slots but no longer exists
    /// (`kill(pid, 0)` answers ESRCH, or it is a zombie). For a primary that missed a secondary's exit. Returns
    /// the pids reclaimed and the objects that came back.
    ///
    /// # Errors
    /// [`Error::NotShared`] for a private pool.
    pub fn reclaim_dead(&self) -> Result<(Vec<u32>, u32), Error> {
        let mut pids = Vec::new();
        let mut total = 0;
        for pid in self.cache_owners() {
            if shm::pid_gone(pid) {
                total += self.reclaim(pid)?;
                pids.push(pid);
            }
        }
        Ok((pids, total))
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of objects.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.layout.obj_count
    }

    /// Bytes per object (after alignment).
    #[inline]
    pub fn obj_size(&self) -> usize {
        self.layout.obj_size
    }

    /// Cache size that [`PoolCache::new`](crate::PoolCache::new) uses.
    pub fn cache_size(&self) -> u32 {
        self.default_cache_size
    }

    /// The memory region behind the pool.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Page size actually used for the pool's memory.
    pub fn page_size(&self) -> PageSize {
        self.region.page_size()
    }

    /// Address of object `idx`: base + `idx` * size.
    ///
    /// # Panics
    /// When `idx >= capacity()`.
    #[inline]
    pub fn obj_ptr(&self, idx: u32) -> *mut u8 {
        assert!(
            idx < self.layout.obj_count,
            "object index {idx} out of range"
        );
        self.region
            .as_ptr()
            .wrapping_add(idx as usize * self.layout.obj_size)
    }

    /// Address of object `idx` without the range check (for callers that hold a valid index).
    #[inline]
    pub(crate) fn obj_ptr_unchecked(&self, idx: u32) -> *mut u8 {
        debug_assert!(idx < self.layout.obj_count);
        self.region
            .as_ptr()
            .wrapping_add(idx as usize * self.layout.obj_size)
    }

    /// Index of the object that contains `addr`, if any.
    pub fn obj_index(&self, addr: usize) -> Option<u32> {
        let off = addr.wrapping_sub(self.layout.base);
        (off < self.layout.span).then(|| (off / self.layout.obj_size) as u32)
    }

    /// The chunks the pool is built on, in address order.
    pub fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }

    /// Chunk holding object `idx` (a shift).
    #[inline]
    pub fn chunk_of(&self, idx: u32) -> usize {
        self.layout.chunk_of(idx)
    }

    /// Key the creation-time hook returned for the chunk holding object `idx` (a shift and an
    /// array load); `None` without a hook or for an index outside the pool.
    #[inline]
    pub fn chunk_key(&self, idx: u32) -> Option<crate::Lkey> {
        if idx >= self.layout.obj_count {
            return None;
        }
        self.keys.get(self.layout.chunk_of(idx)).copied()
    }

    /// Key of the chunk holding `addr`; `None` without a hook or outside the pool.
    #[inline]
    pub fn key_for_addr(&self, addr: usize) -> Option<crate::Lkey> {
        self.layout
            .chunk_of_addr(addr)
            .and_then(|c| self.keys.get(c).copied())
    }

    /// Registers every chunk with `hook` now (for example with a second device's protection
    /// domain) and returns the keys. The returned [`ChunkKeys`] keeps the memory mapped and drops
    /// the registrations before the memory goes away.
    ///
    /// # Errors
    /// [`Error::Registration`] when the hook fails; registrations made so far are dropped.
    pub fn register_chunks(
        self: &Arc<Self>,
        mut hook: impl FnMut(&ChunkInfo) -> Result<Registration, BoxError>,
    ) -> Result<ChunkKeys, Error> {
        let regs = register_all(&self.name, &self.chunks, &mut hook)?;
        Ok(ChunkKeys::new(Arc::clone(self), self.layout, regs))
    }

    /// Keys another process registered the chunks with (one per chunk, in order), for a
    /// process that uses that registration without holding it: a secondary posting buffers
    /// of a shared pool to queues its primary created. Nothing is registered or held.
    ///
    /// # Errors
    /// [`Error::Registration`] when `keys` does not have one key per chunk.
    pub fn keys_from(self: &Arc<Self>, keys: &[crate::Lkey]) -> Result<ChunkKeys, Error> {
        if keys.len() != self.chunks.len() {
            return Err(Error::Registration {
                pool: self.name.clone(),
                chunk: keys.len().min(self.chunks.len()),
                addr: self.layout.base,
                len: self.layout.span,
                source: format!(
                    "{} keys given for the pool's {} chunks",
                    keys.len(),
                    self.chunks.len()
                )
                .into(),
            });
        }
        let regs = keys.iter().map(|&k| Registration::new(k)).collect();
        Ok(ChunkKeys::new(Arc::clone(self), self.layout, regs))
    }

    /// Objects in the shared ring (not counting caches).
    pub fn ring_count(&self) -> u32 {
        match &self.ring {
            FreeList::Local(r) => r.len() as u32,
            FreeList::Shared(ctl) => ctl.ring_len(),
        }
    }

    /// Objects held in per-core caches (of every process, for a shared pool). A snapshot:
    /// exact when no thread is using the pool.
    pub fn cached(&self) -> u32 {
        match &self.ring {
            FreeList::Shared(ctl) => ctl.cached(),
            FreeList::Local(_) => self
                .lock_caches()
                .iter()
                .map(|s| s.len.load(Ordering::Relaxed))
                .sum(),
        }
    }

    /// Free objects: in the ring plus in caches. A snapshot: exact when no thread is using the
    /// pool.
    pub fn available(&self) -> u32 {
        (self.ring_count() + self.cached()).min(self.capacity())
    }

    /// Objects handed out: `capacity() - available()`.
    pub fn in_use(&self) -> u32 {
        self.capacity() - self.available()
    }

    /// Takes `out.len()` objects from the ring, or none (returns `false`) when the ring holds
    /// fewer. Never blocks.
    pub fn get_bulk(&self, out: &mut [u32]) -> bool {
        if !self.ring_get(out) {
            return false;
        }
        self.audit_get(out);
        true
    }

    /// Returns objects to the ring. Never fails.
    ///
    /// # Panics
    /// In audit builds, on a double free or a foreign index; in all builds when more objects
    /// come back than the pool holds (which only a double free can cause).
    pub fn put_bulk(&self, objs: &[u32]) {
        self.audit_put(objs);
        self.ring_put(objs);
    }

    /// Takes one object from the ring.
    pub fn get(&self) -> Option<u32> {
        let mut one = [0u32];
        if !self.ring_get(&mut one) {
            return None;
        }
        self.audit.on_get(&self.name, self.kind, one[0]);
        Some(one[0])
    }

    /// Returns one object to the ring.
    ///
    /// # Panics
    /// As [`Mempool::put_bulk`].
    pub fn put(&self, idx: u32) {
        self.audit.on_put(&self.name, self.kind, idx);
        self.ring_put_one(idx);
    }

    // ---- crate-internal pieces used by caches and mbufs ----

    #[inline]
    pub(crate) fn audit_get(&self, objs: &[u32]) {
        if self.audit.tracks() {
            for &i in objs {
                self.audit.on_get(&self.name, self.kind, i);
            }
        }
    }

    #[inline]
    pub(crate) fn audit_put(&self, objs: &[u32]) {
        if self.audit.tracks() {
            for &i in objs {
                self.audit.on_put(&self.name, self.kind, i);
            }
        }
    }

    #[inline]
    pub(crate) fn audit_check_free(&self, idx: u32) {
        self.audit.check_before_free(&self.name, self.kind, idx);
    }

    #[inline]
    pub(crate) fn audit_check(&self, idx: u32, what: &str) {
        self.audit.check_in_use(&self.name, self.kind, idx, what);
    }

    /// All-or-nothing ring dequeue, no audit.
    #[inline]
    pub(crate) fn ring_get(&self, out: &mut [u32]) -> bool {
        match &self.ring {
            FreeList::Local(r) => match r.get_exact(out) {
                Ok(done) => done,
                Err(idx) => ring_overflow(&self.name, self.kind, idx),
            },
            FreeList::Shared(ctl) => ctl.get_exact(out),
        }
    }

    /// Dequeues up to `want` (possibly up to `PACK - 1` more, within `buf`); no audit.
    #[inline]
    pub(crate) fn ring_get_upto(&self, buf: &mut [u32], want: usize) -> usize {
        match &self.ring {
            FreeList::Local(r) => r.get_upto(buf, want),
            FreeList::Shared(ctl) => ctl.get(buf, 1, want.min(u32::MAX as usize) as u32) as usize,
        }
    }

    /// Enqueue; no audit.
    #[inline]
    pub(crate) fn ring_put(&self, objs: &[u32]) {
        if let Err(idx) = self.ring.put(objs) {
            ring_overflow(&self.name, self.kind, idx);
        }
    }

    #[inline]
    pub(crate) fn ring_put_one(&self, idx: u32) {
        let r = match &self.ring {
            FreeList::Local(r) => r.put_one(idx),
            FreeList::Shared(ctl) => ctl.put(&[idx]),
        };
        if let Err(idx) = r {
            ring_overflow(&self.name, self.kind, idx);
        }
    }

    /// Storage for a cache of `cap` objects: on the heap for a private pool, in a free cache
    /// slot of the file for a shared one. `None` when every slot of a shared pool is taken.
    pub(crate) fn cache_store(&self, cap: usize) -> Option<shm::CacheStore> {
        match &self.ring {
            FreeList::Local(_) => {
                let slot = Arc::new(CacheSlot {
                    len: AtomicU32::new(0),
                });
                self.lock_caches().push(Arc::clone(&slot));
                Some(shm::CacheStore::heap(cap, slot))
            }
            FreeList::Shared(ctl) => {
                let i = ctl.claim_slot(shm::this_pid())?;
                Some(shm::CacheStore::shared(ctl, i, cap))
            }
        }
    }

    /// Gives back a cache's storage (its objects flushed first).
    pub(crate) fn release_store(&self, store: &shm::CacheStore) {
        if let Some(slot) = store.heap_slot() {
            self.lock_caches()
                .retain(|s| !std::ptr::eq(Arc::as_ptr(s), slot));
        }
        if let (Some(i), FreeList::Shared(ctl)) = (store.shared_slot(), &self.ring) {
            ctl.release_slot(i);
        }
    }

    fn lock_caches(&self) -> MutexGuard<'_, Vec<Arc<CacheSlot>>> {
        self.caches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts the objects in the ring exactly, waiting out pushes that are in flight, and puts
    /// them back. Returns how many objects are outside the ring. Only meaningful when no cache
    /// or other getter exists (the caller holds the last handle).
    pub(crate) fn settle_outstanding(&self) -> u32 {
        let r = match &self.ring {
            FreeList::Local(r) => r,
            // Other processes may be using it: a snapshot of what is out, everywhere.
            FreeList::Shared(_) => return self.in_use(),
        };
        // After the drain every finished free is counted, and no free that we counted is still
        // touching the ring (see `Ring::drain`).
        let held = r.drain();
        let outstanding = self.capacity() - held.len() as u32;
        self.ring_put(&held);
        outstanding
    }
}

impl FreeList {
    #[inline]
    fn put(&self, objs: &[u32]) -> Result<(), u32> {
        match self {
            FreeList::Local(r) => r.put(objs),
            FreeList::Shared(ctl) => ctl.put(objs),
        }
    }
}

/// A view of the control block of a shared pool's `region` (`create`: a new pool's, whose
/// locator this writes).
fn shm_view(region: &Region, layout: CtlLayout, obj_count: u32, create: bool) -> Ctl {
    let base = std::ptr::NonNull::new(region.as_ptr()).expect("a mapping is never at address 0");
    shm::ctl_over(base, layout, obj_count, region, create)
}

impl Drop for Mempool {
    fn drop(&mut self) {
        if self.is_shared() {
            crate::mbuf::unregister_shared(self);
        }
        // This process's owner id goes back unless objects still carry it (left in a
        // device's queues: a survivor returns them with `reclaim_owned` once it can).
        self.release_owner_if_unused();
        let out = self.in_use();
        if out > 0 {
            tracing::warn!(
                target: LOG,
                pool = %self.name,
                "pool '{}' dropped while {out} of its {} objects are still in use; their memory \
                 is unmapped now",
                self.name,
                self.capacity()
            );
        }
    }
}

fn too_many_shared(path: Option<&std::path::Path>) -> Error {
    Error::NotASharedPool {
        path: path.map(ToOwned::to_owned).unwrap_or_default(),
        why: "this process already has 64 shared pools".into(),
    }
}

#[cold]
#[inline(never)]
fn ring_overflow(pool: &str, kind: &str, idx: u32) -> ! {
    panic!(
        "mempool '{pool}': more objects returned than the pool holds (returning {kind} index {idx}): \
         an object was freed twice, or the index belongs to another pool"
    )
}

/// Largest cache for `objects` objects: a cache may hold at most 2/3 of the pool (DPDK's
/// `cache_size * 1.5 <= n` rule), and never more than [`MAX_CACHE_SIZE`].
fn max_cache_size(objects: u32) -> u32 {
    ((u64::from(objects) * 2 / 3) as u32).min(MAX_CACHE_SIZE)
}

fn build_chunks(layout: &Layout, page_size: PageSize) -> Box<[ChunkInfo]> {
    (0..layout.chunk_count())
        .map(|c| {
            let first = if layout.chunk_shift >= 32 {
                0
            } else {
                (c as u32) << layout.chunk_shift
            };
            let per_chunk = if layout.chunk_shift >= 32 {
                layout.obj_count
            } else {
                1u32 << layout.chunk_shift
            };
            let obj_count = per_chunk.min(layout.obj_count - first);
            ChunkInfo {
                index: c,
                addr: layout.base + first as usize * layout.obj_size,
                len: obj_count as usize * layout.obj_size,
                first_obj: first,
                obj_count,
                page_size,
            }
        })
        .collect()
}

fn register_all(
    pool: &str,
    chunks: &[ChunkInfo],
    hook: &mut dyn FnMut(&ChunkInfo) -> Result<Registration, BoxError>,
) -> Result<Vec<Registration>, Error> {
    let mut regs = Vec::with_capacity(chunks.len());
    for c in chunks {
        match hook(c) {
            Ok(r) => {
                tracing::debug!(
                    target: LOG,
                    pool,
                    chunk = c.index,
                    addr = format_args!("{:#x}", c.addr),
                    len = c.len,
                    key = format_args!("{:#x}", r.key()),
                    "registered chunk"
                );
                regs.push(r);
            }
            Err(source) => {
                // Undo in reverse order before reporting.
                while let Some(r) = regs.pop() {
                    drop(r);
                }
                return Err(Error::Registration {
                    pool: pool.to_owned(),
                    chunk: c.index,
                    addr: c.addr,
                    len: c.len,
                    source,
                });
            }
        }
    }
    Ok(regs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(name: &str, n: u32, size: usize) -> PoolConfig {
        PoolConfig::new(name, n, size).page_policy(PagePolicy::Normal)
    }

    #[test]
    fn objects_are_disjoint_and_aligned() {
        let p = Mempool::new(small("t", 100, 100)).unwrap();
        assert_eq!(p.obj_size(), 128);
        for i in 0..100 {
            let a = p.obj_ptr(i) as usize;
            assert_eq!(a % 64, 0);
            assert_eq!(a, p.region().addr() + i as usize * 128);
            assert_eq!(p.obj_index(a + 127), Some(i));
        }
        assert_eq!(p.obj_index(p.region().addr() + 100 * 128), None);
    }

    #[test]
    fn ring_get_is_all_or_nothing() {
        let p = Mempool::new(small("t", 10, 64).cache_size(0)).unwrap();
        let mut out = [0u32; 8];
        assert!(p.get_bulk(&mut out));
        let mut more = [0u32; 3];
        assert!(!p.get_bulk(&mut more), "only 2 left");
        assert_eq!(p.available(), 2);
        assert_eq!(p.in_use(), 8);
        p.put_bulk(&out);
        assert_eq!(p.available(), 10);
    }

    #[test]
    fn default_cache_size_shrinks_for_small_pools() {
        assert_eq!(Mempool::new(small("t", 100, 64)).unwrap().cache_size(), 66);
        assert_eq!(
            Mempool::new(small("t", 10_000, 64)).unwrap().cache_size(),
            512
        );
        let err = Mempool::new(small("t", 100, 64).cache_size(67)).unwrap_err();
        assert!(err.to_string().contains("at most 66"), "{err}");
    }

    #[test]
    fn config_errors_carry_numbers() {
        let e = Mempool::new(small("z", 0, 64)).unwrap_err();
        assert!(e.to_string().contains("0 objects of 64 bytes"), "{e}");
        let e = Mempool::new(small("c", 10, 2000).max_chunk_bytes(1000)).unwrap_err();
        assert!(e.to_string().contains("max_chunk_bytes 1000"), "{e}");
        let e = Mempool::new(small("a", 10, 64).obj_align(48)).unwrap_err();
        assert!(matches!(e, Error::BadAlign { align: 48, .. }), "{e}");
    }

    #[test]
    fn chunks_respect_the_cap_and_cover_every_object() {
        // 2304-byte objects, 100 000-byte cap: 43 fit, rounded down to 32 per chunk.
        let p = Mempool::new(small("c", 1000, 2304).max_chunk_bytes(100_000)).unwrap();
        let chunks = p.chunks();
        assert_eq!(chunks.len(), 32); // ceil(1000 / 32)
        let mut next_obj = 0;
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.index, i);
            assert!(c.len <= 100_000);
            assert_eq!(c.first_obj, next_obj);
            assert_eq!(c.addr, p.obj_ptr(c.first_obj) as usize);
            next_obj += c.obj_count;
        }
        assert_eq!(next_obj, 1000);
        assert_eq!(chunks.last().unwrap().obj_count, 1000 - 31 * 32);
    }
}
