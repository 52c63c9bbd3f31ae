//! Memory chunks and their registration keys.
//!
//! A pool's memory is one [`Region`](crate::Region) carved into chunks of at most
//! `max_chunk_bytes`, because a NIC caps the size of one memory registration. Each chunk holds
//! a power-of-two number of whole objects (the last one may hold fewer), laid out back to back,
//! so for object index `i`:
//!
//! ```text
//! address(i) = region_base + i * obj_size          (chunks are contiguous)
//! chunk(i)   = i >> chunk_shift                    (objects per chunk = 1 << chunk_shift)
//! key(i)     = keys[chunk(i)]                      (one array load)
//! ```
//!
//! A registration hook ([`PoolConfig::on_chunk`](crate::PoolConfig::on_chunk), or
//! [`Mempool::register_chunks`](crate::Mempool::register_chunks) later, e.g. once per device)
//! is told every chunk's address and length and returns a [`Registration`]: the 32-bit key
//! (an lkey) plus an optional guard (the MR handle) that the pool drops before it unmaps the
//! memory.
#![deny(unsafe_code)]

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::pool::Mempool;
use crate::region::PageSize;

/// One chunk of a pool's memory, as announced to a registration hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChunkInfo {
    /// Chunk number, 0-based.
    pub index: usize,
    /// Start address.
    pub addr: usize,
    /// Length in bytes (whole objects; at most the pool's `max_chunk_bytes`).
    pub len: usize,
    /// Index of the first object in the chunk.
    pub first_obj: u32,
    /// Number of objects in the chunk.
    pub obj_count: u32,
    /// Page size of the memory behind the chunk.
    pub page_size: PageSize,
}

impl ChunkInfo {
    /// Start address as a pointer (for FFI such as `ibv_reg_mr`).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Whether `addr` lies inside the chunk.
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.addr && addr - self.addr < self.len
    }
}

/// A memory key: the local key (`lkey`) of a memory region, which a device's scatter-gather
/// entries and data segments name beside an [`Iova`]. A type of its own, so that a key and a
/// length (both `u32`) cannot trade places in a descriptor setter.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lkey(pub u32);

impl fmt::Debug for Lkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lkey({:#x})", self.0)
    }
}

impl fmt::LowerHex for Lkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::Display for Lkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// An I/O virtual address: where a device reads or writes a buffer. A memory region
/// registered at its own virtual address (what the drivers do: `ibv_reg_mr`) makes it the
/// buffer's address in this process.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Iova(pub u64);

impl std::ops::Add<u64> for Iova {
    type Output = Iova;
    /// `n` bytes further.
    #[inline]
    fn add(self, n: u64) -> Iova {
        Iova(self.0.wrapping_add(n))
    }
}

impl fmt::LowerHex for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::Debug for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Iova({:#x})", self.0)
    }
}

/// What a registration hook returns for one chunk: its key and, optionally, a guard that
/// undoes the registration when dropped.
///
/// The pool (or [`ChunkKeys`]) keeps the guard until just before the memory is unmapped, so a
/// memory region handle put here is deregistered while its memory still exists.
pub struct Registration {
    key: Lkey,
    guard: Option<Box<dyn Any + Send + Sync>>,
}

impl Registration {
    /// A key with nothing to undo.
    pub fn new(key: Lkey) -> Self {
        Registration { key, guard: None }
    }

    /// A key plus a guard that is dropped before the chunk's memory is unmapped.
    pub fn with_guard(key: Lkey, guard: impl Any + Send + Sync) -> Self {
        Registration {
            key,
            guard: Some(Box::new(guard)),
        }
    }

    /// The key.
    pub fn key(&self) -> Lkey {
        self.key
    }
}

impl From<Lkey> for Registration {
    fn from(key: Lkey) -> Self {
        Registration::new(key)
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("guard", &self.guard.is_some())
            .finish()
    }
}

/// Where objects and chunks are: the arithmetic shared by the pool and [`ChunkKeys`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) base: usize,
    pub(crate) obj_size: usize,
    pub(crate) obj_count: u32,
    /// Objects per chunk is `1 << chunk_shift`; 32 means one chunk.
    pub(crate) chunk_shift: u32,
    /// Bytes per full chunk (`obj_size << chunk_shift`), or the whole span for one chunk.
    pub(crate) chunk_bytes: usize,
    /// `obj_count * obj_size`.
    pub(crate) span: usize,
}

impl Layout {
    #[inline]
    pub(crate) fn chunk_of(&self, obj: u32) -> usize {
        (u64::from(obj) >> self.chunk_shift) as usize
    }

    #[inline]
    pub(crate) fn chunk_of_addr(&self, addr: usize) -> Option<usize> {
        let off = addr.wrapping_sub(self.base);
        if off >= self.span {
            None
        } else if self.chunk_shift >= 32 {
            Some(0)
        } else {
            Some(off / self.chunk_bytes)
        }
    }

    pub(crate) fn chunk_count(&self) -> usize {
        self.chunk_of(self.obj_count - 1) + 1
    }
}

/// Keys for every chunk of a pool, from a registration made after the pool was created
/// ([`Mempool::register_chunks`](crate::Mempool::register_chunks)), for example one set per
/// device that uses the pool.
///
/// Holds the registrations' guards and keeps the pool's memory mapped until they are dropped.
/// Cloning is cheap (two reference counts): every queue of a device can hold its own copy;
/// the registrations are undone when the last copy goes.
#[derive(Clone)]
pub struct ChunkKeys {
    keys: Arc<[Lkey]>,
    layout: Layout,
    _owner: Arc<KeysOwner>,
}

/// What the last `ChunkKeys` copy releases.
struct KeysOwner {
    // Dropped before `_pool`: registrations are undone while the memory is still mapped.
    _guards: Vec<Registration>,
    _pool: Arc<Mempool>,
}

impl ChunkKeys {
    pub(crate) fn new(pool: Arc<Mempool>, layout: Layout, regs: Vec<Registration>) -> Self {
        let keys = regs.iter().map(Registration::key).collect();
        ChunkKeys {
            keys,
            layout,
            _owner: Arc::new(KeysOwner {
                _guards: regs,
                _pool: pool,
            }),
        }
    }

    /// Key of the chunk that holds object `obj` (a shift and an array load); `None` when the
    /// index is outside the pool.
    #[inline]
    pub fn key_of(&self, obj: u32) -> Option<Lkey> {
        if obj >= self.layout.obj_count {
            return None;
        }
        self.keys.get(self.layout.chunk_of(obj)).copied()
    }

    /// Key of the chunk that holds `addr`; `None` when the address is not in the pool.
    #[inline]
    pub fn key_for_addr(&self, addr: usize) -> Option<Lkey> {
        // A pool in one chunk (the usual case): one compare.
        if let [key] = self.keys[..] {
            return (addr.wrapping_sub(self.layout.base) < self.layout.span).then_some(key);
        }
        self.layout
            .chunk_of_addr(addr)
            .and_then(|c| self.keys.get(c).copied())
    }

    /// The keys, one per chunk, in chunk order.
    pub fn keys(&self) -> &[Lkey] {
        &self.keys
    }
}

impl fmt::Debug for ChunkKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkKeys")
            .field("keys", &self.keys)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(obj_size: usize, obj_count: u32, chunk_shift: u32) -> Layout {
        let span = obj_size * obj_count as usize;
        let chunk_bytes = if chunk_shift >= 32 {
            span
        } else {
            obj_size << chunk_shift
        };
        Layout {
            base: 0x10_0000,
            obj_size,
            obj_count,
            chunk_shift,
            chunk_bytes,
            span,
        }
    }

    #[test]
    fn chunk_of_index_and_address_agree() {
        let l = layout(2304, 1000, 7);
        assert_eq!(l.chunk_count(), 8);
        for obj in 0..1000u32 {
            let addr = l.base + obj as usize * l.obj_size;
            assert_eq!(l.chunk_of(obj), obj as usize / 128);
            assert_eq!(l.chunk_of_addr(addr), Some(l.chunk_of(obj)));
            assert_eq!(
                l.chunk_of_addr(addr + l.obj_size - 1),
                Some(l.chunk_of(obj))
            );
        }
        assert_eq!(l.chunk_of_addr(l.base - 1), None);
        assert_eq!(l.chunk_of_addr(l.base + l.span), None);
    }

    #[test]
    fn single_chunk_layout() {
        let l = layout(64, 10, 32);
        assert_eq!(l.chunk_count(), 1);
        assert_eq!(l.chunk_of(9), 0);
        assert_eq!(l.chunk_of_addr(l.base + 639), Some(0));
        assert_eq!(l.chunk_of_addr(l.base + 640), None);
    }
}
