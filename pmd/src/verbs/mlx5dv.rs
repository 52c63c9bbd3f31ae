//! mlx5 direct verbs: the queue-buffer allocators (`mlx5dv_set_context_attr`), the device's
//! mlx5 capabilities (`mlx5dv_query_device`), CQs with compressed CQEs (`mlx5dv_create_cq`)
//! and the raw queue descriptions (`mlx5dv_init_obj`), turned into [`DevMem`] views.
#![allow(unsafe_code)]

use super::alloc::{null_err, view, view_in_device, Allocators};
use super::objects::{Context, Cq, Qp, Wq};
use super::{ret_errno, VerbsError};
use crate::ethdev::QueueOwner;
use crate::hw::mlx5::{CQE_BYTES, WQEBB_BYTES};
use crate::mlx5::RawCq;
use crate::sys::dv;
use crate::sys::verbs as inl;
use crate::sys::DevMem;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes of a doorbell record (two big-endian words, spec §1.7).
const DBREC_BYTES: usize = 8;
/// Bytes of the UAR doorbell write.
const UAR_WRITE_BYTES: usize = 8;

/// Installs queue-buffer allocators on `ctx` (`mlx5dv_set_context_attr(..,
/// MLX5DV_CTX_ATTR_BUF_ALLOCATORS, ..)`): rdma-core then takes every QP, CQ and WQ buffer
/// and doorbell record of the context from them. The context keeps them until it is closed.
///
/// # Errors
/// `mlx5dv_set_context_attr` failed.
pub fn install_allocators(ctx: &Arc<Context>) -> Result<Arc<Allocators>, VerbsError> {
    let me = Allocators::new(ctx.name());
    let (alloc, free, data) = me.callbacks();
    let mut attr = dv::mlx5dv_ctx_allocators {
        alloc: Some(alloc),
        free: Some(free),
        data,
    };
    // SAFETY: the context is open; `attr` is initialised; `data` points to the
    // `Allocators`, which the context keeps (below) until after it is closed, so every
    // callback rdma-core makes finds it alive.
    let ret = unsafe {
        dv::mlx5dv_set_context_attr(
            ctx.as_ptr().cast::<dv::ibv_context>(),
            dv::MLX5DV_CTX_ATTR_BUF_ALLOCATORS,
            (&mut attr as *mut dv::mlx5dv_ctx_allocators).cast::<c_void>(),
        )
    };
    if ret != 0 {
        return Err(VerbsError::new(
            "mlx5dv_set_context_attr",
            format!("queue-buffer allocators of {}", ctx.name()),
            ret_errno(ret),
        ));
    }
    ctx.keep(Arc::clone(&me) as Arc<dyn std::any::Any + Send + Sync>);
    Ok(me)
}

/// Whether libmlx5 drives the context's device (`mlx5dv_is_supported`).
pub fn is_supported(ctx: &Context) -> bool {
    // SAFETY: the context is open; its `device` pointer stays valid while it is.
    unsafe {
        let dev = (*ctx.as_ptr()).device;
        !dev.is_null() && dv::mlx5dv_is_supported(dev.cast::<dv::ibv_device>())
    }
}

/// What `mlx5dv_query_device` says the device can do (spec §1.2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DvCaps {
    /// Enhanced multi-packet send (opcode 0x29).
    pub enhanced_mpw: bool,
    /// Most CQEs per compressed session (0: no compression).
    pub cqe_comp_max: u32,
    /// Mini-CQE formats (`MLX5DV_CQE_RES_FORMAT_*`).
    pub cqe_comp_formats: u32,
    /// Striding RQ: (min, max) log2 stride bytes, (min, max) log2 strides per WQE; `None`
    /// when not supported.
    pub striding_rq: Option<((u32, u32), (u32, u32))>,
}

/// `mlx5dv_query_device` with the compression and striding-RQ groups requested.
///
/// # Errors
/// The call failed (`EOPNOTSUPP` on a device libmlx5 does not drive).
pub fn query(ctx: &Context) -> Result<DvCaps, VerbsError> {
    // SAFETY: all-zero is valid for this plain C struct.
    let mut a: dv::mlx5dv_context = unsafe { std::mem::zeroed() };
    a.comp_mask =
        u64::from(dv::MLX5DV_CONTEXT_MASK_CQE_COMPRESION | dv::MLX5DV_CONTEXT_MASK_STRIDING_RQ);
    // SAFETY: the context is open; `a` is writable and its `comp_mask` says which groups the
    // caller has room for (all of the struct).
    let ret = unsafe { dv::mlx5dv_query_device(ctx.as_ptr().cast::<dv::ibv_context>(), &mut a) };
    if ret != 0 {
        return Err(VerbsError::new(
            "mlx5dv_query_device",
            format!("device {}", ctx.name()),
            ret_errno(ret),
        ));
    }
    // The call clears the bits of the groups it did not fill.
    let got = |bit: u32| a.comp_mask & u64::from(bit) != 0;
    let comp = got(dv::MLX5DV_CONTEXT_MASK_CQE_COMPRESION);
    let s = a.striding_rq_caps;
    Ok(DvCaps {
        enhanced_mpw: a.flags & u64::from(dv::MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW) != 0,
        cqe_comp_max: if comp { a.cqe_comp_caps.max_num } else { 0 },
        cqe_comp_formats: if comp {
            a.cqe_comp_caps.supported_format
        } else {
            0
        },
        striding_rq: got(dv::MLX5DV_CONTEXT_MASK_STRIDING_RQ)
            .then_some((
                (
                    s.min_single_stride_log_num_of_bytes,
                    s.max_single_stride_log_num_of_bytes,
                ),
                (
                    s.min_single_wqe_log_num_of_strides,
                    s.max_single_wqe_log_num_of_strides,
                ),
            ))
            .filter(|&((lo, hi), _)| lo > 0 && hi >= lo),
    })
}

/// A CQ of at least `cqe` entries made by `mlx5dv_create_cq`, compressed (basic layout, HASH
/// mini CQEs, spec §1.4, §6.2) when `compress` says so, else a plain one.
///
/// # Errors
/// `mlx5dv_create_cq` failed (`EINVAL` when the device does not compress in that format).
pub fn create_cq(
    ctx: &Arc<Context>,
    cqe: u32,
    compress: bool,
    what: String,
) -> Result<Arc<Cq>, VerbsError> {
    // SAFETY: all-zero is a valid init attr (no channel, no flags).
    let mut attr: rdma_sys::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.cqe = cqe;
    // SAFETY: all-zero is valid for this plain C struct.
    let mut dv_attr: dv::mlx5dv_cq_init_attr = unsafe { std::mem::zeroed() };
    if compress {
        dv_attr.comp_mask = u64::from(dv::MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE);
        dv_attr.cqe_comp_res_format = dv::MLX5DV_CQE_RES_FORMAT_HASH as u8;
    }
    // SAFETY: the context is open; both attrs are initialised and outlive the call; the
    // `ibv_cq_init_attr_ex` is the header's struct (rdma-sys and the dv bindings name the same
    // type, the latter opaque).
    let p = unsafe {
        dv::mlx5dv_create_cq(
            ctx.as_ptr().cast::<dv::ibv_context>(),
            (&mut attr as *mut rdma_sys::ibv_cq_init_attr_ex).cast::<dv::ibv_cq_init_attr_ex>(),
            &mut dv_attr,
        )
    };
    if p.is_null() {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Err(VerbsError::new(
            "mlx5dv_create_cq",
            what,
            if e == 0 { libc::EIO } else { e },
        ));
    }
    // SAFETY: `p` is the live extended CQ just created; the inline returns its `ibv_cq`.
    let cq = unsafe { inl::ibv_cq_ex_to_cq(p.cast::<rdma_sys::ibv_cq_ex>()) };
    let ptr = NonNull::new(cq)
        .ok_or_else(|| VerbsError::new("ibv_cq_ex_to_cq", what.clone(), libc::EINVAL))?;
    // SAFETY: the CQ was created on `ctx` above and nothing else owns it.
    Ok(unsafe { Cq::from_raw(ptr, ctx, what) })
}

/// What `mlx5dv_init_obj(QP | CQ)` says of a send queue, as views.
pub struct SqMem {
    /// SQ ring.
    pub buf: Arc<DevMem>,
    /// WQEBBs.
    pub wqe_cnt: u32,
    /// SQ number.
    pub sqn: u32,
    /// The QP's doorbell record.
    pub dbrec: Arc<DevMem>,
    /// The UAR doorbell register.
    pub bf_reg: Arc<DevMem>,
    /// BlueFlame size (0: doorbell only).
    pub bf_size: u32,
    /// The send CQ.
    pub cq: RawCq,
}

/// What `mlx5dv_init_obj(RWQ | CQ)` says of a receive WQ, as views.
pub struct RqMem {
    /// RQ ring.
    pub buf: Arc<DevMem>,
    /// WQEs.
    pub wqe_cnt: u32,
    /// Bytes per WQE.
    pub stride: u32,
    /// The WQ's doorbell record.
    pub dbrec: Arc<DevMem>,
    /// The receive CQ.
    pub cq: RawCq,
}

fn raw_cq(c: &dv::mlx5dv_cq, owner: &QueueOwner, what: &str) -> Result<RawCq, VerbsError> {
    if c.buf.is_null() || c.dbrec.is_null() || c.cqe_cnt == 0 {
        return Err(null_err(
            "mlx5dv_init_obj",
            what,
            "CQ buffer or doorbell record",
        ));
    }
    if c.cqe_size as usize != CQE_BYTES {
        let mut e = VerbsError::new("mlx5dv_init_obj", what, libc::EINVAL);
        e.hint = format!(
            "the CQ has {}-byte CQEs; the driver reads 64-byte CQEs (unset MLX5_CQE_SIZE)",
            c.cqe_size
        );
        return Err(e);
    }
    Ok(RawCq {
        buf: view(c.buf, c.cqe_cnt as usize * CQE_BYTES, owner),
        cqe_cnt: c.cqe_cnt,
        dbrec: view(c.dbrec.cast::<c_void>(), DBREC_BYTES, owner),
        cqn: c.cqn,
    })
}

/// `mlx5dv_init_obj(QP | CQ)` for a raw send QP and its CQ; the views keep `owner` (which
/// must hold `qp`, `cq` and their context) alive.
///
/// # Errors
/// The call failed or described no buffer.
pub fn init_sq(qp: &Qp, cq: &Cq, owner: &QueueOwner, what: &str) -> Result<SqMem, VerbsError> {
    // SAFETY: all-zero is valid for these plain C structs.
    let (mut q, mut c, mut o): (dv::mlx5dv_qp, dv::mlx5dv_cq, dv::mlx5dv_obj) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    // Where the UAR page is in the command descriptor: what another process maps to ring
    // this QP's doorbell (DPDK net/mlx5's secondaries, `txq_uar_init_secondary`).
    q.comp_mask = u64::from(dv::MLX5DV_QP_MASK_UAR_MMAP_OFFSET);
    o.qp.in_ = qp.as_ptr().cast::<dv::ibv_qp>();
    o.qp.out = &mut q;
    o.cq.in_ = cq.as_ptr().cast::<dv::ibv_cq>();
    o.cq.out = &mut c;
    // SAFETY: QP and CQ are live; the outputs are writable and outlive the call.
    let ret =
        unsafe { dv::mlx5dv_init_obj(&mut o, u64::from(dv::MLX5DV_OBJ_QP | dv::MLX5DV_OBJ_CQ)) };
    if ret != 0 {
        return Err(VerbsError::new("mlx5dv_init_obj", what, ret_errno(ret)));
    }
    if q.sq.buf.is_null() || q.dbrec.is_null() || q.bf.reg.is_null() || q.sq.wqe_cnt == 0 {
        return Err(null_err(
            "mlx5dv_init_obj",
            what,
            "SQ buffer, doorbell record or UAR register",
        ));
    }
    if q.sq.stride as usize != WQEBB_BYTES {
        let mut e = VerbsError::new("mlx5dv_init_obj", what, libc::EINVAL);
        e.hint = format!(
            "SQ stride {} (the driver builds 64-byte WQEBBs)",
            q.sq.stride
        );
        return Err(e);
    }
    // The SQ number goes into every WQE: for a raw QP without a receive side the QP number
    // is the SQ number (spec §1.7), which is what DPDK's Verbs path uses; asking
    // `MLX5DV_QP_MASK_RAW_QP_HANDLES` would cost a device command for the same value.
    // SAFETY: the QP is live.
    let sqn = unsafe { (*qp.as_ptr()).qp_num };
    Ok(SqMem {
        buf: view(q.sq.buf, q.sq.wqe_cnt as usize * WQEBB_BYTES, owner),
        wqe_cnt: q.sq.wqe_cnt,
        sqn,
        dbrec: view(q.dbrec.cast::<c_void>(), DBREC_BYTES, owner),
        bf_reg: uar_view(&q, owner),
        bf_size: q.bf.size,
        cq: raw_cq(&c, owner, what)?,
    })
}

/// The QP's UAR register as a view; one that knows its place in the command descriptor
/// (the UAR page's `uar_mmap_offset` plus the register's offset in its page) when
/// `mlx5dv_init_obj` said where the page is.
fn uar_view(q: &dv::mlx5dv_qp, owner: &QueueOwner) -> Arc<DevMem> {
    let got = q.comp_mask & u64::from(dv::MLX5DV_QP_MASK_UAR_MMAP_OFFSET) != 0;
    // libmlx5 maps each UAR as one system page (`mlx5_map_uar`, `get_uar_mmap_offset` with
    // the page size), and the register is at its offset within that page.
    let page_size = crate::sys::page_size() as u64;
    match u64::try_from(q.uar_mmap_offset) {
        Ok(page) if got => {
            let at = page + (q.bf.reg as u64 % page_size);
            view_in_device(q.bf.reg, UAR_WRITE_BYTES, owner, at)
        }
        _ => view(q.bf.reg, UAR_WRITE_BYTES, owner),
    }
}

/// `mlx5dv_init_obj(RWQ | CQ)` for a receive WQ and its CQ; the views keep `owner` alive.
///
/// # Errors
/// The call failed or described no buffer.
pub fn init_rq(wq: &Wq, cq: &Cq, owner: &QueueOwner, what: &str) -> Result<RqMem, VerbsError> {
    // SAFETY: all-zero is valid for these plain C structs.
    let (mut w, mut c, mut o): (dv::mlx5dv_rwq, dv::mlx5dv_cq, dv::mlx5dv_obj) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    o.rwq.in_ = wq.as_ptr().cast::<dv::ibv_wq>();
    o.rwq.out = &mut w;
    o.cq.in_ = cq.as_ptr().cast::<dv::ibv_cq>();
    o.cq.out = &mut c;
    // SAFETY: WQ and CQ are live; the outputs are writable and outlive the call.
    let ret =
        unsafe { dv::mlx5dv_init_obj(&mut o, u64::from(dv::MLX5DV_OBJ_RWQ | dv::MLX5DV_OBJ_CQ)) };
    if ret != 0 {
        return Err(VerbsError::new("mlx5dv_init_obj", what, ret_errno(ret)));
    }
    if w.buf.is_null() || w.dbrec.is_null() || w.wqe_cnt == 0 || w.stride == 0 {
        return Err(null_err(
            "mlx5dv_init_obj",
            what,
            "RQ buffer or doorbell record",
        ));
    }
    Ok(RqMem {
        buf: view(w.buf, w.wqe_cnt as usize * w.stride as usize, owner),
        wqe_cnt: w.wqe_cnt,
        stride: w.stride,
        dbrec: view(w.dbrec.cast::<c_void>(), DBREC_BYTES, owner),
        cq: raw_cq(&c, owner, what)?,
    })
}
