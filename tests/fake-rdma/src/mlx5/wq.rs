//! Receive work queues and indirection tables: `ibv_create_wq` / `mlx5dv_create_wq`
//! (`create_wq`, v44 verbs.c:4134–4273), `ibv_modify_wq` (verbs.c:4276–4299),
//! `ibv_destroy_wq` (verbs.c:4301–4319), `ibv_create_rwq_ind_table` /
//! `ibv_destroy_rwq_ind_table` (verbs.c:4476–4511) and `mlx5dv_init_obj(RWQ)`
//! (mlx5.c:1053–1065).

use super::alloc::{self, Buf, Dbrec};
use super::cq::Cq;
use super::{caps, mctx, RES_TYPE_RWQ};
use crate::ffi::*;
use crate::objects::{ind_table_entries, mapped, non_null, obj};
use crate::pd::{real_pd, Pd};
use crate::state::{addr, call_int, call_ptr, Kind, State};
use crate::verbs::ctx_of;
use crate::world::Family;
use serde_json::json;
use std::ffi::c_int;

/// `sizeof(struct mlx5_wqe_data_seg)`.
const DATA_SEG: u32 = 16;
/// `sizeof(struct mlx5_wqe_srq_next_seg)`: a striding RQ's WQE header.
const NEXT_SEG: u32 = 16;

/// A receive work queue (`struct mlx5_rwq`).
#[repr(C)]
pub struct Wq {
    /// What callers hold.
    pub wq: ibv_wq,
    /// The ring (`pbuff` = its start).
    pub buf: Buf,
    /// The doorbell record (the RQ counter at 0).
    pub db: Dbrec,
    /// WQEs.
    pub wqe_cnt: u32,
    /// log2 of the stride.
    pub wqe_shift: u32,
    /// Scatter entries per WQE.
    pub max_gs: u32,
    /// Strip C-VLAN tags (`IBV_WQ_FLAGS_CVLAN_STRIPPING`).
    pub vlan_strip: bool,
    /// Indirection tables using it (`usecnt`).
    pub users: u32,
    /// The kernel PD it counts on.
    pub pd: *mut Pd,
    /// Its CQ.
    pub cq: *mut Cq,
    /// Served by the device model (it reached RDY once).
    pub served: bool,
    /// The device index.
    pub device: u32,
}

/// A receive indirection table.
#[repr(C)]
pub struct Ind {
    /// What callers hold.
    pub t: ibv_rwq_ind_table,
    /// Its WQs, in order.
    pub wqs: Vec<*mut Wq>,
    /// RSS QPs using it (`usecnt`).
    pub users: u32,
}

fn ilog32(v: u32) -> u32 {
    32 - v.leading_zeros()
}

/// `vctx->create_wq` = `mlx5_create_wq` (v44 verbs.c:4249–4253).
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_wq_slot(
    context: *mut ibv_context,
    attr: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    const CALL: &str = "ibv_create_wq";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &mut *non_null(attr, CALL, "wq_init_attr") };
        create(st, context, a, None, CALL)
    })
}

export!("MLX5_1.3" fn mlx5dv_create_wq(context: *mut ibv_context, attr: *mut ibv_wq_init_attr, mlx5_wq_attr: *mut mlx5dv_wq_init_attr) -> *mut ibv_wq {
    const CALL: &str = "mlx5dv_create_wq";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        // v44 verbs.c:4262–4274: no mlx5 dv ops → EOPNOTSUPP.
        if !matches!(ctx_of(st, context, CALL).family, Family::Mlx5 { .. }) {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: the caller passes its init attrs (the vendor one may be NULL).
        let a = unsafe { &mut *non_null(attr, CALL, "wq_init_attr") };
        // SAFETY: as above.
        let dv = unsafe { mlx5_wq_attr.as_ref() };
        create(st, context, a, dv, CALL)
    })
});

/// `create_wq` (v44 verbs.c:4134–4247) with `ibv_cmd_create_wq` (libibverbs/cmd_wq.c:
/// 36–139) and the kernel. `Err(0)` is NULL with errno untouched.
fn create(
    st: &mut State,
    context: *mut ibv_context,
    a: &mut ibv_wq_init_attr,
    dv: Option<&mlx5dv_wq_init_attr>,
    call: &'static str,
) -> Result<*mut ibv_wq, c_int> {
    let ctx = ctx_of(st, context, call);
    let device = ctx.device().index;
    // l. 4147–4148: only RQs → NULL, errno untouched.
    if a.wq_type != IBV_WQT_RQ {
        return Err(0);
    }
    // mlx5_calc_rwq_size (l. 1698–1742): max_wr 0 → EINVAL; vendor comp_mask ⊄
    // STRIDING_RQ → EINVAL; stride = roundup_pow2(16 · max(max_sge, 1) [+ 16 striding]),
    // at most max_rq_desc_sz (EINVAL); ring = roundup_pow2(max_wr) · stride, at least 64.
    if a.max_wr == 0 {
        return Err(libc::EINVAL);
    }
    let striding = u64::from(MLX5DV_WQ_INIT_ATTR_MASK_STRIDING_RQ);
    if dv.is_some_and(|d| d.comp_mask & !striding != 0) {
        return Err(libc::EINVAL);
    }
    let mprq = dv.is_some_and(|d| d.comp_mask & striding != 0);
    let wqe = DATA_SEG * a.max_sge.max(1) + if mprq { NEXT_SEG } else { 0 };
    if wqe > caps::MAX_RQ_DESC_SZ {
        return Err(libc::EINVAL);
    }
    let wqe_size = wqe.next_power_of_two();
    let wq_size = u64::from(a.max_wr.next_power_of_two()) * u64::from(wqe_size);
    let Ok(wq_size) = u32::try_from(wq_size.max(super::SEND_WQE_BB as u64)) else {
        return Err(libc::EINVAL);
    };
    let wqe_cnt = wq_size / wqe_size;
    let wqe_shift = ilog32(wqe_size - 1);
    let max_gs = (wqe_size - if mprq { NEXT_SEG } else { 0 }) / DATA_SEG;
    let pd = non_null(a.pd, call, "wq_init_attr.pd").cast::<Pd>();
    let p = obj(st, pd, &[Kind::Pd, Kind::ParentDomain], call);
    let m = mctx(ctx);
    // mlx5_alloc_rwq_buf (l. 4095–4132): align(ring, page); not zeroed; a failure sets
    // ENOMEM.
    let Some(buf) = alloc::alloc_buf(
        m,
        pd,
        alloc::align(wq_size as usize, super::PAGE),
        super::PAGE,
        RES_TYPE_RWQ,
    ) else {
        return Err(libc::ENOMEM);
    };
    // l. 4176–4183: the record, zeroed unless a parent domain gave it.
    let Some(db) = alloc::alloc_dbrec(m, pd) else {
        alloc::free_buf(m, buf, call);
        return Err(0);
    };
    if db.custom.is_none() {
        // SAFETY: 8 writable bytes.
        unsafe {
            db.ptr.write_volatile(0);
            db.ptr.add(1).write_volatile(0);
        }
    }
    let release = |m: &mut super::Mlx5Ctx| {
        alloc::free_dbrec(m, db, call);
        alloc::free_buf(m, buf, call);
    };
    let checked = (|| {
        // l. 4199–4224: striding parameters outside the device's striding caps → EINVAL
        // (the device reports none: every cap is 0).
        if mprq {
            let s = dv.expect("mprq").striding_rq_attrs;
            if s.single_stride_log_num_of_bytes != 0 || s.single_wqe_log_num_of_strides != 0 {
                return Err(libc::EINVAL);
            }
        }
        // ibv_cmd_create_wq: comp_mask ≥ RESERVED → EINVAL; pd and cq are dereferenced;
        // create_flags beyond the known ones → EOPNOTSUPP (cmd_wq.c:50–67, 133–136).
        if a.comp_mask >= IBV_WQ_INIT_ATTR_RESERVED {
            return Err(libc::EINVAL);
        }
        let cq = obj(
            st,
            non_null(a.cq, call, "wq_init_attr.cq").cast::<Cq>(),
            &[Kind::Cq],
            call,
        );
        let flags = if a.comp_mask & IBV_WQ_INIT_ATTR_FLAGS != 0 {
            a.create_flags
        } else {
            0
        };
        if flags & !(IBV_WQ_FLAGS_RESERVED - 1) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        st.kernel(context, call)?;
        // The kernel (mlx5_ib_create_wq, create_user_rq): a striding RQ needs the
        // striding capability (EOPNOTSUPP); more WRs than log_max_wq_sz → EINVAL; scatter
        // FCS, delay drop and end padding need capabilities the device does not report
        // (EOPNOTSUPP); the ring and the record are pinned (EFAULT).
        if mprq {
            return Err(libc::EOPNOTSUPP);
        }
        if a.max_wr > caps::MAX_QP_WR {
            return Err(libc::EINVAL);
        }
        if flags & !IBV_WQ_FLAGS_CVLAN_STRIPPING != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        mapped(buf.ptr, wq_size as usize)?;
        mapped(db.ptr.cast(), 8)?;
        Ok((cq as *mut Cq, flags & IBV_WQ_FLAGS_CVLAN_STRIPPING != 0))
    })();
    let (cq, vlan_strip) = match checked {
        Ok(c) => c,
        Err(e) => {
            release(mctx(ctx_of(st, context, call)));
            return Err(e);
        }
    };
    let real = real_pd(p);
    real.users += 1;
    // SAFETY: a live CQ (checked above).
    unsafe { (*cq).users += 1 };
    // SAFETY: zeroed `ibv_wq` is valid (the header inline initialises mutex/cond).
    let mut w: ibv_wq = unsafe { std::mem::zeroed() };
    // ibv_icmd_create_wq (cmd_wq.c:50–53, 113–116): context, cq, pd, type, handle, the
    // kernel's RQ number; max_wr and max_sge come back unchanged. The inline
    // ibv_create_wq sets wq_context (verbs.h:3242–3247). The state stays 0 (RESET).
    w.context = context;
    w.wq_context = a.wq_context;
    w.pd = a.pd;
    w.cq = a.cq;
    w.wq_type = a.wq_type;
    w.handle = st.next_id();
    w.wq_num = st.next_id();
    let wq = Box::into_raw(Box::new(Wq {
        wq: w,
        buf,
        db,
        wqe_cnt,
        wqe_shift,
        max_gs,
        vlan_strip,
        users: 0,
        pd: real,
        cq,
        served: false,
        device,
    }));
    st.register(wq as usize, Kind::Wq, context as usize);
    Ok(wq.cast())
}

/// The RQ state machine the firmware accepts (MODIFY_RQ: RST→RDY, RDY→RDY, RDY→ERR,
/// RDY→RST, ERR→RST).
fn rq_transition_ok(cur: ibv_wq_state, new: ibv_wq_state) -> bool {
    matches!(
        (cur, new),
        (IBV_WQS_RESET, IBV_WQS_RDY)
            | (IBV_WQS_RDY, IBV_WQS_RDY | IBV_WQS_ERR | IBV_WQS_RESET)
            | (IBV_WQS_ERR, IBV_WQS_RESET)
    )
}

/// `mlx5_modify_wq` (v44 verbs.c:4276–4299), `ibv_cmd_modify_wq` (libibverbs/cmd.c:
/// 1128–1158) and the kernel (`ib_uverbs_ex_modify_wq`, `mlx5_ib_modify_wq`).
///
/// # Safety
/// `attr` is the caller's attr.
pub unsafe extern "C" fn modify_wq_slot(wq: *mut ibv_wq, attr: *mut ibv_wq_attr) -> c_int {
    const CALL: &str = "ibv_modify_wq";
    call_int(CALL, json!({"wq": addr(wq)}), |st| {
        let w = obj(st, wq.cast::<Wq>(), &[Kind::Wq], CALL);
        // SAFETY: the caller passes its attr.
        let a = unsafe { &*non_null(attr, CALL, "wq_attr") };
        let to_rdy = a.attr_mask & IBV_WQ_ATTR_STATE != 0 && a.wq_state == IBV_WQS_RDY;
        if to_rdy {
            // l. 4283–4285: a current state that is not the WQ's → -EINVAL (negative, as
            // the return value).
            if a.attr_mask & IBV_WQ_ATTR_CURR_STATE != 0 && a.curr_wq_state != w.wq.state {
                return Ok(-libc::EINVAL);
            }
            // l. 4287–4295: from RESET, libmlx5 zeroes the record before the command.
            if w.wq.state == IBV_WQS_RESET {
                // SAFETY: 8 writable bytes.
                unsafe {
                    w.db.ptr.write_volatile(0);
                    w.db.ptr.add(1).write_volatile(0);
                }
            }
        }
        // ibv_cmd_modify_wq: attr_mask ≥ RESERVED → EINVAL; flags beyond the known ones →
        // EOPNOTSUPP (both returned, errno untouched by libibverbs).
        if a.attr_mask >= IBV_WQ_ATTR_RESERVED {
            return Err(libc::EINVAL);
        }
        if a.attr_mask & IBV_WQ_ATTR_FLAGS != 0 && a.flags_mask & !(IBV_WQ_FLAGS_RESERVED - 1) != 0
        {
            return Err(libc::EOPNOTSUPP);
        }
        st.kernel(w.wq.context, CALL)?;
        // ib_uverbs_ex_modify_wq: an empty mask → EINVAL. mlx5_ib_modify_wq: the current
        // state is the given one or the WQ's; the firmware refuses a current state that is
        // not the RQ's, and transitions outside its state machine (EINVAL).
        if a.attr_mask == 0 {
            return Err(libc::EINVAL);
        }
        let cur = if a.attr_mask & IBV_WQ_ATTR_CURR_STATE != 0 {
            a.curr_wq_state
        } else {
            w.wq.state
        };
        let new = if a.attr_mask & IBV_WQ_ATTR_STATE != 0 {
            a.wq_state
        } else {
            cur
        };
        if cur != w.wq.state || !rq_transition_ok(cur, new) {
            return Err(libc::EINVAL);
        }
        if a.attr_mask & IBV_WQ_ATTR_FLAGS != 0 && a.flags_mask & IBV_WQ_FLAGS_CVLAN_STRIPPING != 0
        {
            w.vlan_strip = a.flags & IBV_WQ_FLAGS_CVLAN_STRIPPING != 0;
        }
        let old = w.wq.state;
        if a.attr_mask & IBV_WQ_ATTR_STATE != 0 {
            w.wq.state = new;
        }
        // The device model: the RQ is served from its first RDY; RESET stops it (and takes
        // it out of an error), a later RDY restarts its counter at 0 (the record was zeroed
        // above); steering follows the states of the table's RQs.
        if new == IBV_WQS_RESET && old != IBV_WQS_RESET && w.served {
            st.mlx5_nics.rq_state(w.device, w.wq.wq_num, true);
        }
        if new == IBV_WQS_RDY && old != IBV_WQS_RDY {
            if w.served {
                st.mlx5_nics.rq_state(w.device, w.wq.wq_num, false);
            } else {
                serve_rq(st, w)?;
            }
        }
        super::flow::sync(st, w.device);
        Ok(0)
    })
}

/// Hands a WQ's RQ and its CQ to the device model, with compressed CQEs if its CQ asked
/// for them.
fn serve_rq(st: &mut State, w: &mut Wq) -> Result<(), c_int> {
    let ctx = ctx_of(st, w.wq.context, "ibv_modify_wq");
    let dev = ctx.device();
    // SAFETY: the CQ cannot be destroyed while the WQ uses it (EBUSY).
    let cq = unsafe { &*w.cq };
    let rq = crate::nic_mlx5::RqRing {
        buf: w.buf.ptr,
        wqe_cnt: w.wqe_cnt,
        stride: 1 << w.wqe_shift,
        rqn: w.wq.wq_num,
        dbrec: w.db.ptr,
        vlan_strip: w.vlan_strip,
    };
    // SAFETY: the ring and record are freed by ibv_destroy_wq only after `remove_rq`; the
    // CQ outlives the WQ.
    unsafe {
        st.mlx5_nics.add_rq(
            dev,
            rq,
            crate::nic_mlx5::cq_ring(cq),
            cq.comp,
            "ibv_modify_wq",
        )
    }?;
    w.served = true;
    Ok(())
}

/// `mlx5_destroy_wq` (v44 verbs.c:4301–4319): the kernel first (EBUSY while a table uses
/// it), then the record, then the ring.
///
/// # Safety
/// `wq` came from `create_wq`.
pub unsafe extern "C" fn destroy_wq_slot(wq: *mut ibv_wq) -> c_int {
    const CALL: &str = "ibv_destroy_wq";
    call_int(CALL, json!({"wq": addr(wq)}), |st| {
        let w = obj(st, wq.cast::<Wq>(), &[Kind::Wq], CALL);
        // A disassociated context: the kernel destroyed the WQ already (`disassociate`) and
        // lets the command through; libmlx5 frees its part.
        if !st.disassociated(w.wq.context) {
            if w.users > 0 {
                return Err(libc::EBUSY);
            }
            st.kernel(w.wq.context, CALL)?;
            release(st, w);
        }
        let ctx = ctx_of(st, w.wq.context, CALL);
        let m = mctx(ctx);
        alloc::free_dbrec(m, w.db, CALL);
        alloc::free_buf(m, w.buf, CALL);
        st.unregister(wq as usize);
        // SAFETY: unregistered above; freed once.
        drop(unsafe { Box::from_raw(w as *mut Wq) });
        Ok(0)
    })
}

/// What the kernel does with a WQ being destroyed (or left at close).
fn release(st: &mut State, w: &mut Wq) {
    if w.served {
        st.mlx5_nics.remove_rq(w.device, w.wq.wq_num);
        w.served = false;
    }
    // SAFETY: the PD and CQ were counted at creation and cannot be destroyed before.
    unsafe {
        (*w.pd).users -= 1;
        (*w.cq).users -= 1;
    }
}

/// A WQ left on a closing context.
pub fn forget(st: &mut State, a: usize) {
    // SAFETY: a registered WQ of an mlx5 context.
    let w = unsafe { &mut *(a as *mut Wq) };
    release(st, w);
}

/// `mlx5_create_rwq_ind_table` (v44 verbs.c:4476–4498) over
/// `ibv_cmd_create_rwq_ind_table` (cmd.c:1160–1203): its error is returned, errno untouched
/// for the user-space check; the kernel's limit on the table size (EINVAL).
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_rwq_ind_table_slot(
    context: *mut ibv_context,
    attr: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    const CALL: &str = "ibv_create_rwq_ind_table";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        let _ = ctx_of(st, context, CALL);
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &*non_null(attr, CALL, "init_attr") };
        let wqs = match ind_table_entries(st, a, CALL) {
            Ok(w) => w,
            Err(Ok(_)) => return Err(0),
            Err(Err(e)) => return Err(e),
        };
        st.kernel(context, CALL)?;
        // mlx5_ib_create_rwq_ind_table: more entries than log_max_rqt_size → EINVAL.
        if wqs.len() > caps::MAX_RWQ_IND_TABLE_SIZE as usize {
            return Err(libc::EINVAL);
        }
        let wqs: Vec<*mut Wq> = wqs.into_iter().map(|w| w.cast::<Wq>()).collect();
        for &w in &wqs {
            // SAFETY: live WQs (checked by ind_table_entries).
            unsafe { (*w).users += 1 };
        }
        let handle = st.next_id();
        let t = Box::into_raw(Box::new(Ind {
            t: ibv_rwq_ind_table {
                context,
                ind_tbl_handle: handle as c_int,
                ind_tbl_num: st.next_id() as c_int,
                comp_mask: 0,
            },
            wqs,
            users: 0,
        }));
        st.register(t as usize, Kind::IndTable, context as usize);
        Ok(t.cast::<ibv_rwq_ind_table>())
    })
}

/// `mlx5_destroy_rwq_ind_table` (v44 verbs.c:4500–4511): EBUSY while an RSS QP uses it
/// (kernel `uverbs_free_rwq_ind_tbl`).
///
/// # Safety
/// `table` came from `create_rwq_ind_table`.
pub unsafe extern "C" fn destroy_rwq_ind_table_slot(table: *mut ibv_rwq_ind_table) -> c_int {
    const CALL: &str = "ibv_destroy_rwq_ind_table";
    call_int(CALL, json!({"table": addr(table)}), |st| {
        let t = obj(st, table.cast::<Ind>(), &[Kind::IndTable], CALL);
        // A disassociated context: the kernel destroyed the table already (its WQs may be
        // gone too).
        if !st.disassociated(t.t.context) {
            if t.users > 0 {
                return Err(libc::EBUSY);
            }
            st.kernel(t.t.context, CALL)?;
            for &w in &t.wqs {
                // SAFETY: the table's WQs cannot be destroyed while it exists.
                unsafe { (*w).users -= 1 };
            }
        }
        st.unregister(table as usize);
        // SAFETY: unregistered above; freed once.
        drop(unsafe { Box::from_raw(t as *mut Ind) });
        Ok(0)
    })
}

/// `mlx5dv_get_rwq` (v44 mlx5.c:1053–1065): ring, the RQ counter's record, WQEs, stride.
pub fn init_obj(st: &mut State, wq: *mut ibv_wq, out: *mut mlx5dv_rwq) {
    let w = obj(st, wq.cast::<Wq>(), &[Kind::Wq], "mlx5dv_init_obj(rwq)");
    // SAFETY: the caller's output struct.
    unsafe {
        *out = mlx5dv_rwq {
            buf: w.buf.ptr,
            dbrec: w.db.ptr,
            wqe_cnt: w.wqe_cnt,
            stride: 1 << w.wqe_shift,
            comp_mask: 0,
        }
    };
}
