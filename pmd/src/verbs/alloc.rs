//! Queue-buffer allocators backed by our memory, as rdma-core's providers call them
//! (`manadv_set_context_attr` and `mlx5dv_set_context_attr` take the same `alloc(size, data)`
//! / `free(ptr, data)` pair), and the views the datapath gets of provider memory.
#![allow(unsafe_code)]

use super::VerbsError;
use crate::ethdev::QueueOwner;
use crate::sys::mem::{PageAllocator, QueueAllocator};
use crate::sys::DevMem;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `alloc` of the allocator structs.
pub(super) type AllocFn = unsafe extern "C" fn(usize, *mut c_void) -> *mut c_void;
/// `free` of the allocator structs.
pub(super) type FreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void);

/// The queue-buffer allocators of one context: rdma-core asks them for every CQ, SQ and RQ
/// ring (spec §1.3) and gives each buffer back when its queue is destroyed. Memory comes
/// from the [`QueueAllocator`] the driver sets (page-aligned and zeroed), and is held here
/// until rdma-core frees it.
///
/// `free(NULL)` is tolerated and counted apart ([`Allocators::null_frees`]): libmana gives
/// back an RSS QP's send buffer, which it never allocated, as NULL (rdma-core v44
/// providers/mana/qp.c:169; main qp.c:459).
pub struct Allocators {
    device: String,
    source: Mutex<Arc<dyn QueueAllocator>>,
    live: Mutex<BTreeMap<usize, Arc<DevMem>>>,
    allocs: AtomicU64,
    frees: AtomicU64,
    null_frees: AtomicU64,
    failed: AtomicU64,
}

impl std::fmt::Debug for Allocators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, fr) = self.counts();
        let n = self.null_frees();
        write!(f, "Allocators(allocs {a}, frees {fr}, null_frees {n})")
    }
}

impl Allocators {
    /// Allocators for the contexts of device `device`, drawing from [`PageAllocator`] until
    /// [`Allocators::set_source`] says otherwise. The provider installs [`Self::callbacks`]
    /// and makes the context keep the `Arc` until after it is closed.
    pub(super) fn new(device: &str) -> Arc<Self> {
        Arc::new(Self {
            device: device.to_string(),
            source: Mutex::new(Arc::new(PageAllocator)),
            live: Mutex::new(BTreeMap::new()),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            null_frees: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// The C callbacks and their `data` argument (the same shape for
    /// `manadv_ctx_allocators` and `mlx5dv_ctx_allocators`). `data` is valid while `self`
    /// lives: the context must keep the `Arc` until after it is closed.
    pub(super) fn callbacks(self: &Arc<Self>) -> (AllocFn, FreeFn, *mut c_void) {
        (
            alloc_cb,
            free_cb,
            Arc::as_ptr(self).cast_mut().cast::<c_void>(),
        )
    }

    /// Where queue memory comes from from now on.
    pub fn set_source(&self, source: Arc<dyn QueueAllocator>) {
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = source;
    }

    /// Buffers handed out and given back so far (`free(NULL)` calls not included).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.allocs.load(Ordering::Relaxed),
            self.frees.load(Ordering::Relaxed),
        )
    }

    /// `free(NULL)` calls so far: buffers rdma-core never asked for (an RSS QP's send
    /// buffer in libmana), given back all the same; nothing to release.
    pub fn null_frees(&self) -> u64 {
        self.null_frees.load(Ordering::Relaxed)
    }

    /// Requests the source could not satisfy.
    pub fn failures(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    fn alloc(&self, size: usize) -> *mut c_void {
        let source = Arc::clone(&self.source.lock().unwrap_or_else(|p| p.into_inner()));
        match source.alloc(size) {
            Ok(mem) if mem.addr() % 4096 == 0 && mem.len() >= size => {
                let p = mem.as_ptr();
                self.live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(p as usize, mem);
                self.allocs.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(target: "pmd::verbs", size, addr = p as usize, "queue buffer allocated");
                p.cast::<c_void>()
            }
            Ok(mem) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(target: "pmd::verbs", size, got = mem.len(), addr = mem.addr(), "queue-buffer allocator returned memory that is not page-aligned or too small");
                std::ptr::null_mut()
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(target: "pmd::verbs", size, "queue-buffer allocation failed: {e}");
                std::ptr::null_mut()
            }
        }
    }

    fn free(&self, p: *mut c_void) {
        if p.is_null() {
            self.null_frees.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(target: "pmd::verbs", "queue buffer freed: NULL (nothing to release)");
            return;
        }
        let gone = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(p as usize));
        if gone.is_some() {
            self.frees.fetch_add(1, Ordering::Relaxed);
        } else {
            tracing::error!(target: "pmd::verbs", addr = p as usize, "rdma-core freed a queue buffer these allocators did not hand out");
        }
    }
}

impl Drop for Allocators {
    /// After the context is closed: every buffer handed out must have come back.
    fn drop(&mut self) {
        let (a, f) = self.counts();
        let n = self.null_frees();
        let live = self.live.get_mut().map_or(0, |m| m.len());
        if a == f && live == 0 {
            tracing::debug!(target: "pmd::verbs", device = %self.device, allocs = a, frees = f, null_frees = n, "queue-buffer allocators: every buffer given back");
        } else {
            tracing::warn!(target: "pmd::verbs", device = %self.device, allocs = a, frees = f, null_frees = n, live, "queue-buffer allocators: buffers never given back by rdma-core");
        }
    }
}

/// `alloc` of the allocator structs.
unsafe extern "C" fn alloc_cb(size: usize, data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the `Allocators` installed with this callback, kept alive by the
    // context until after `ibv_close_device`, and rdma-core calls allocators only on a live
    // context.
    let a = unsafe { &*data.cast::<Allocators>() };
    a.alloc(size)
}

/// `free` of the allocator structs.
unsafe extern "C" fn free_cb(ptr: *mut c_void, data: *mut c_void) {
    // SAFETY: as for `alloc_cb`.
    let a = unsafe { &*data.cast::<Allocators>() };
    a.free(ptr);
}

impl Allocators {
    /// `mem`, a view of (part of) a buffer these allocators handed out, named by the shared
    /// file it lives in, and its offset there, when the source made one
    /// ([`crate::sys::mem::SharedFileAllocator`]): another process maps that file to poll
    /// the queue. A ring starts its buffer; a doorbell record is 8 bytes of a page of them
    /// (libmlx5's `dbrec.c`). Any other view comes back as is.
    pub(super) fn in_shared_file(&self, mem: Arc<DevMem>, keep: &QueueOwner) -> Arc<DevMem> {
        let at = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            live.range(..=mem.addr())
                .next_back()
                .filter(|(&start, b)| mem.addr() + mem.len() <= start + b.len())
                .and_then(|(&start, b)| {
                    b.shared_location()
                        .map(|(p, o)| (p.to_owned(), o + (mem.addr() - start) as u64))
                })
        };
        match at {
            // SAFETY: as for `view`: `mem` is a view of a live queue's buffer and `keep`
            // holds the verbs object that owns it.
            Some((path, offset)) => Arc::new(unsafe {
                DevMem::from_raw_kept_in_file(
                    mem.as_ptr(),
                    mem.len(),
                    Arc::clone(keep),
                    path,
                    offset,
                )
            }),
            None => mem,
        }
    }
}

/// A view of `len` bytes at `addr` that keeps `keep` (the objects owning the memory) alive.
pub(super) fn view(addr: *mut c_void, len: usize, keep: &QueueOwner) -> Arc<DevMem> {
    // SAFETY: rdma-core keeps a queue's buffer (and a context its doorbell page) mapped
    // until the object is destroyed, and `keep` holds that object: the view holds `keep`,
    // so the object, and with it the memory, outlives the view. The bytes are shared with
    // the device and accessed only through `DevMem`'s copies and atomics.
    Arc::new(unsafe { DevMem::from_raw_kept(addr.cast::<u8>(), len, Arc::clone(keep)) })
}

/// [`view`] of memory at `offset` of the context's command descriptor (a UAR register):
/// [`DevMem::device_offset`] says where, for another process to map it.
pub(super) fn view_in_device(
    addr: *mut c_void,
    len: usize,
    keep: &QueueOwner,
    offset: u64,
) -> Arc<DevMem> {
    // SAFETY: as for `view`: rdma-core keeps the UAR page mapped while the QP (held by
    // `keep`) lives; the view is written only through `Mmio`.
    Arc::new(unsafe {
        DevMem::from_raw_kept_in_device(addr.cast::<u8>(), len, Arc::clone(keep), offset)
    })
}

pub(super) fn null_err(call: &'static str, what: &str, field: &str) -> VerbsError {
    let mut e = VerbsError::new(call, what, libc::EINVAL);
    e.hint = format!("the provider returned no {field}: rdma-core and the kernel disagree");
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libmana frees an RSS QP's send buffer, which it never allocated, as NULL: tolerated,
    /// counted apart, and the buffers really handed out still balance.
    #[test]
    fn free_null_is_counted_apart_from_real_frees() {
        let a = Allocators::new("test");
        let (alloc, free, data) = a.callbacks();
        // SAFETY: `data` is `a`, alive for the whole test; the callbacks are the ones
        // rdma-core would be given.
        let p = unsafe { alloc(4096, data) };
        assert!(!p.is_null());
        // SAFETY: as above; NULL is what libmana passes for an RSS QP.
        unsafe { free(std::ptr::null_mut(), data) };
        assert_eq!((a.counts(), a.null_frees()), ((1, 0), 1));
        // SAFETY: `p` came from `alloc` above.
        unsafe { free(p, data) };
        assert_eq!((a.counts(), a.null_frees()), ((1, 1), 1));
        assert_eq!(
            format!("{a:?}"),
            "Allocators(allocs 1, frees 1, null_frees 1)"
        );
    }
}
