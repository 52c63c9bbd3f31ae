//! MANA direct verbs: the queue-buffer allocators (`manadv_set_context_attr`) and the raw
//! queue descriptions (`manadv_init_obj`), turned into [`DevMem`] views the datapath uses.
#![allow(unsafe_code)]

use super::objects::{Context, Cq, Qp, Wq};
use super::{ret_errno, VerbsError};
use crate::hw::mana::CQE_BYTES;
use crate::mana::{PageAllocator, QueueAllocator, QueueOwner};
use crate::sys::dv;
use crate::sys::DevMem;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The queue-buffer allocators of one context: rdma-core asks them for every CQ, SQ and RQ
/// ring (spec §1.3) and gives each buffer back when its queue is destroyed. Memory comes
/// from the [`QueueAllocator`] the driver sets (page-aligned and zeroed), and is held here
/// until rdma-core frees it.
pub struct Allocators {
    device: String,
    source: Mutex<Arc<dyn QueueAllocator>>,
    live: Mutex<HashMap<usize, Arc<DevMem>>>,
    allocs: AtomicU64,
    frees: AtomicU64,
    failed: AtomicU64,
}

impl std::fmt::Debug for Allocators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, fr) = self.counts();
        write!(f, "Allocators(allocs {a}, frees {fr})")
    }
}

impl Allocators {
    /// Installs allocators on `ctx` (`manadv_set_context_attr(.., BUF_ALLOCATORS, ..)`),
    /// drawing from [`PageAllocator`] until [`Allocators::set_source`] says otherwise. The
    /// context keeps them until it is closed.
    ///
    /// # Errors
    /// `manadv_set_context_attr` failed.
    pub fn install(ctx: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        let me = Arc::new(Self {
            device: ctx.name().to_string(),
            source: Mutex::new(Arc::new(PageAllocator)),
            live: Mutex::new(HashMap::new()),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let mut attr = dv::manadv_ctx_allocators {
            alloc: Some(alloc_cb),
            free: Some(free_cb),
            data: Arc::as_ptr(&me).cast_mut().cast::<c_void>(),
        };
        // SAFETY: the context is open; `attr` is initialised; `data` points to the
        // `Allocators`, which the context keeps (below) until after it is closed, so every
        // callback rdma-core makes finds it alive.
        let ret = unsafe {
            dv::manadv_set_context_attr(
                ctx.as_ptr().cast::<dv::ibv_context>(),
                dv::MANADV_CTX_ATTR_BUF_ALLOCATORS,
                (&mut attr as *mut dv::manadv_ctx_allocators).cast::<c_void>(),
            )
        };
        if ret != 0 {
            return Err(VerbsError::new(
                "manadv_set_context_attr",
                format!("queue-buffer allocators of {}", ctx.name()),
                ret_errno(ret),
            ));
        }
        ctx.keep(Arc::clone(&me) as Arc<dyn std::any::Any + Send + Sync>);
        Ok(me)
    }

    /// Where queue memory comes from from now on.
    pub fn set_source(&self, source: Arc<dyn QueueAllocator>) {
        *self.source.lock().unwrap_or_else(|p| p.into_inner()) = source;
    }

    /// Buffers handed out and given back so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.allocs.load(Ordering::Relaxed),
            self.frees.load(Ordering::Relaxed),
        )
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
        let gone = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(p as usize));
        if gone.is_some() {
            self.frees.fetch_add(1, Ordering::Relaxed);
        } else if !p.is_null() {
            tracing::error!(target: "pmd::verbs", addr = p as usize, "rdma-core freed a queue buffer these allocators did not hand out");
        }
    }
}

impl Drop for Allocators {
    /// After the context is closed: every buffer handed out must have come back.
    fn drop(&mut self) {
        let (a, f) = self.counts();
        let live = self.live.get_mut().map_or(0, |m| m.len());
        if a == f && live == 0 {
            tracing::debug!(target: "pmd::verbs", device = %self.device, allocs = a, frees = f, "queue-buffer allocators: every buffer given back");
        } else {
            tracing::warn!(target: "pmd::verbs", device = %self.device, allocs = a, frees = f, live, "queue-buffer allocators: buffers never given back by rdma-core");
        }
    }
}

/// `alloc` of `struct manadv_ctx_allocators`.
unsafe extern "C" fn alloc_cb(size: usize, data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the `Allocators` installed with this callback, kept alive by the
    // context until after `ibv_close_device`, and rdma-core calls allocators only on a live
    // context.
    let a = unsafe { &*data.cast::<Allocators>() };
    a.alloc(size)
}

/// `free` of `struct manadv_ctx_allocators`.
unsafe extern "C" fn free_cb(ptr: *mut c_void, data: *mut c_void) {
    // SAFETY: as for `alloc_cb`.
    let a = unsafe { &*data.cast::<Allocators>() };
    a.free(ptr);
}

/// A view of `len` bytes at `addr` that keeps `keep` (the objects owning the memory) alive.
fn view(addr: *mut c_void, len: usize, keep: &QueueOwner) -> Arc<DevMem> {
    // SAFETY: rdma-core keeps a queue's buffer (and a context its doorbell page) mapped
    // until the object is destroyed, and `keep` holds that object: the view holds `keep`,
    // so the object, and with it the memory, outlives the view. The bytes are shared with
    // the device and accessed only through `DevMem`'s copies and atomics.
    Arc::new(unsafe { DevMem::from_raw_kept(addr.cast::<u8>(), len, Arc::clone(keep)) })
}

fn null_err(call: &'static str, what: &str, field: &str) -> VerbsError {
    let mut e = VerbsError::new(call, what, libc::EINVAL);
    e.hint = format!("the provider returned no {field}: rdma-core and the kernel disagree");
    e
}

/// What `manadv_init_obj(QP | CQ)` says of a send queue, as views.
pub struct TxQueueMem {
    /// SQ ring.
    pub sq: Arc<DevMem>,
    /// SQ id.
    pub sq_id: u32,
    /// vPort offset for TX OOBs.
    pub tx_vp_offset: u16,
    /// The doorbell page.
    pub db_page: Arc<DevMem>,
    /// CQ ring.
    pub cq: Arc<DevMem>,
    /// CQ entries.
    pub cq_count: u32,
    /// CQ id.
    pub cq_id: u32,
}

/// What `manadv_init_obj(RWQ | CQ)` says of a receive queue, as views.
pub struct RxQueueMem {
    /// RQ ring.
    pub rq: Arc<DevMem>,
    /// RQ id.
    pub rq_id: u32,
    /// The doorbell page.
    pub db_page: Arc<DevMem>,
    /// CQ ring.
    pub cq: Arc<DevMem>,
    /// CQ entries.
    pub cq_count: u32,
    /// CQ id.
    pub cq_id: u32,
}

/// `manadv_init_obj(QP | CQ)` for a send QP and its CQ; views keep `owner` (which must hold
/// `qp`, `cq` and their context) alive.
///
/// # Errors
/// The call failed or described no buffer.
pub fn init_tx(qp: &Qp, cq: &Cq, owner: &QueueOwner, what: &str) -> Result<TxQueueMem, VerbsError> {
    // SAFETY: all-zero is valid for these plain C structs.
    let (mut q, mut c, mut o): (dv::manadv_qp, dv::manadv_cq, dv::manadv_obj) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    o.qp.in_ = qp.as_ptr().cast::<dv::ibv_qp>();
    o.qp.out = &mut q;
    o.cq.in_ = cq.as_ptr().cast::<dv::ibv_cq>();
    o.cq.out = &mut c;
    // SAFETY: QP and CQ are live; the outputs are writable and outlive the call.
    let ret =
        unsafe { dv::manadv_init_obj(&mut o, u64::from(dv::MANADV_OBJ_QP | dv::MANADV_OBJ_CQ)) };
    if ret != 0 {
        return Err(VerbsError::new("manadv_init_obj", what, ret_errno(ret)));
    }
    if q.sq_buf.is_null() || q.db_page.is_null() || c.buf.is_null() {
        return Err(null_err(
            "manadv_init_obj",
            what,
            "queue buffer or doorbell page",
        ));
    }
    Ok(TxQueueMem {
        sq: view(q.sq_buf, q.sq_size as usize, owner),
        sq_id: q.sq_id,
        tx_vp_offset: q.tx_vp_offset as u16,
        db_page: view(q.db_page, crate::hw::mana::doorbell::PAGE_BYTES, owner),
        cq: view(c.buf, c.count as usize * CQE_BYTES, owner),
        cq_count: c.count,
        cq_id: c.cq_id,
    })
}

/// `manadv_init_obj(RWQ | CQ)` for a receive WQ and its CQ; views keep `owner` alive.
///
/// # Errors
/// The call failed or described no buffer.
pub fn init_rx(wq: &Wq, cq: &Cq, owner: &QueueOwner, what: &str) -> Result<RxQueueMem, VerbsError> {
    // SAFETY: all-zero is valid for these plain C structs.
    let (mut w, mut c, mut o): (dv::manadv_rwq, dv::manadv_cq, dv::manadv_obj) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    o.rwq.in_ = wq.as_ptr().cast::<dv::ibv_wq>();
    o.rwq.out = &mut w;
    o.cq.in_ = cq.as_ptr().cast::<dv::ibv_cq>();
    o.cq.out = &mut c;
    // SAFETY: WQ and CQ are live; the outputs are writable and outlive the call.
    let ret =
        unsafe { dv::manadv_init_obj(&mut o, u64::from(dv::MANADV_OBJ_RWQ | dv::MANADV_OBJ_CQ)) };
    if ret != 0 {
        return Err(VerbsError::new("manadv_init_obj", what, ret_errno(ret)));
    }
    if w.buf.is_null() || w.db_page.is_null() || c.buf.is_null() {
        return Err(null_err(
            "manadv_init_obj",
            what,
            "queue buffer or doorbell page",
        ));
    }
    Ok(RxQueueMem {
        rq: view(w.buf, w.size as usize, owner),
        rq_id: w.wq_id,
        db_page: view(w.db_page, crate::hw::mana::doorbell::PAGE_BYTES, owner),
        cq: view(c.buf, c.count as usize * CQE_BYTES, owner),
        cq_count: c.count,
        cq_id: c.cq_id,
    })
}
