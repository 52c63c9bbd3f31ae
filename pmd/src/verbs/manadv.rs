//! MANA direct verbs: the queue-buffer allocators (`manadv_set_context_attr`) and the raw
//! queue descriptions (`manadv_init_obj`), turned into [`DevMem`] views the datapath uses.
#![allow(unsafe_code)]

pub use super::alloc::Allocators;
use super::alloc::{null_err, view};
use super::objects::{Context, Cq, Qp, Wq};
use super::{ret_errno, VerbsError};
use crate::hw::mana::CQE_BYTES;
use crate::mana::QueueOwner;
use crate::sys::dv;
use crate::sys::DevMem;
use std::ffi::c_void;
use std::sync::Arc;

/// Installs queue-buffer allocators on `ctx` (`manadv_set_context_attr(.., BUF_ALLOCATORS,
/// ..)`); the context keeps them until it is closed.
///
/// # Errors
/// `manadv_set_context_attr` failed.
pub fn install_allocators(ctx: &Arc<Context>) -> Result<Arc<Allocators>, VerbsError> {
    let me = Allocators::new(ctx.name());
    let (alloc, free, data) = me.callbacks();
    let mut attr = dv::manadv_ctx_allocators {
        alloc: Some(alloc),
        free: Some(free),
        data,
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
