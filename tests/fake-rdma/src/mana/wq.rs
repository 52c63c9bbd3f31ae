//! Receive work queues and their indirection tables (`ibv_create_wq`, `ibv_modify_wq`,
//! `ibv_create_rwq_ind_table`), what an RSS QP spreads frames over.

use super::*;

/// `mana_create_wq` (v44 wq.c:34–103) then `ibv_cmd_create_wq` (cmd_wq.c:36–139).
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_wq(
    context: *mut ibv_context,
    attr: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    call_ptr("ibv_create_wq", json!({"context": addr(context)}), |st| {
        let ctx = ctx_of(st, context, "ibv_create_wq");
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &mut *non_null(attr, "ibv_create_wq", "wq_init_attr") };
        let v44 = st.cfg.profile == Profile::V44;
        if v44 && a.max_wr > MAX_WR {
            return Err(libc::EINVAL); // v44 wq.c:44
        }
        if v44 && wqe_size(a.max_sge) > u64::from(MAX_RX_WQE) {
            return Err(libc::EINVAL); // v44 wq.c:52
        }
        if !allocators_set(ctx) {
            return Err(libc::EINVAL); // v44 wq.c:60
        }
        let size = hw_size(u64::from(a.max_wr) * wqe_size(a.max_sge)); // v44 wq.c:72–73
        let buf = user_alloc(ctx, size)?; // NULL → ENOMEM
        let fail = |e: c_int| {
            user_free(ctx, buf);
            Err(e)
        };
        // ibv_cmd_create_wq: comp_mask ≥ RESERVED → EINVAL (cmd_wq.c:133–136); create_flags
        // beyond the known ones (≥ IBV_WQ_FLAGS_RESERVED) → EOPNOTSUPP (l. 63–67); it
        // dereferences pd and cq (l. 57–58). The known flags pass the uverbs core
        // (`UVERBS_METHOD_WQ_CREATE` accepts the four) and mana_ib_create_wq never reads
        // them.
        if a.comp_mask >= IBV_WQ_INIT_ATTR_RESERVED {
            return fail(libc::EINVAL);
        }
        if a.comp_mask & IBV_WQ_INIT_ATTR_FLAGS != 0
            && a.create_flags & !(IBV_WQ_FLAGS_RESERVED - 1) != 0
        {
            return fail(libc::EOPNOTSUPP);
        }
        let pd = obj(
            st,
            non_null(a.pd, "ibv_create_wq", "wq_init_attr.pd").cast::<Pd>(),
            &[Kind::Pd, Kind::ParentDomain],
            "ibv_create_wq",
        );
        let cq = obj(
            st,
            non_null(a.cq, "ibv_create_wq", "wq_init_attr.cq").cast::<Cq>(),
            &[Kind::Cq],
            "ibv_create_wq",
        );
        if let Err(e) = st.kernel(context, "ibv_create_wq") {
            return fail(e);
        }
        // mana_ib_create_wq pins the buffer from a page-aligned start.
        if a.wq_type != IBV_WQT_RQ {
            return fail(libc::EINVAL);
        }
        if let Err(e) = kernel_pin(buf, size as usize) {
            return fail(e);
        }
        let real = real_pd(pd);
        real.users += 1;
        cq.users += 1;
        // SAFETY: zeroed `ibv_wq` is valid (the header inline initialises mutex/cond).
        let mut w: ibv_wq = unsafe { std::mem::zeroed() };
        w.context = context;
        w.wq_context = a.wq_context;
        w.pd = a.pd;
        w.cq = a.cq;
        w.wq_type = a.wq_type;
        w.handle = st.next_id();
        w.wq_num = w.handle;
        let wq = Box::into_raw(Box::new(Wq {
            wq: w,
            buf,
            buf_size: size as usize,
            wqe: a.max_wr,
            sge: a.max_sge,
            wqid: 0,
            users: 0,
            pd: real,
            cq,
        }));
        st.register(wq as usize, Kind::Wq, context as usize);
        Ok(wq.cast::<ibv_wq>())
    })
}

/// `mana_modify_wq`: always EOPNOTSUPP (v44 wq.c:29–32).
///
/// # Safety
/// Any arguments.
pub unsafe extern "C" fn modify_wq(wq: *mut ibv_wq, attr: *mut ibv_wq_attr) -> c_int {
    let _ = attr;
    call_int("ibv_modify_wq", json!({"wq": addr(wq)}), |_| {
        Err(libc::EOPNOTSUPP)
    })
}

/// `mana_destroy_wq` (v44 wq.c:105–128).
///
/// # Safety
/// `wq` came from `create_wq`.
pub unsafe extern "C" fn destroy_wq(wq: *mut ibv_wq) -> c_int {
    call_int("ibv_destroy_wq", json!({"wq": addr(wq)}), |st| {
        let w = obj(st, wq.cast::<Wq>(), &[Kind::Wq], "ibv_destroy_wq");
        let ctx = ctx_of(st, w.wq.context, "ibv_destroy_wq");
        // v44 wq.c:111–115: free unset → EINVAL (positive), before the kernel.
        if ctx.alloc.free.is_none() {
            return Err(libc::EINVAL);
        }
        // A disassociated context: the kernel destroyed the WQ already (its PD and CQ may be
        // gone too); only the user-space part is left.
        if !st.disassociated(w.wq.context) {
            // ib_destroy_wq_user: EBUSY while an indirection table uses it.
            if w.users > 0 {
                return Err(libc::EBUSY);
            }
            st.kernel(w.wq.context, "ibv_destroy_wq")?;
            // SAFETY: the PD and CQ were counted at creation and cannot be destroyed before.
            unsafe {
                (*w.pd).users -= 1;
                (*w.cq).users -= 1;
            }
        }
        user_free(ctx, w.buf);
        st.unregister(wq as usize);
        // SAFETY: unregistered above; freed once.
        drop(unsafe { Box::from_raw(w as *mut Wq) });
        Ok(0)
    })
}

/// `mana_create_rwq_ind_table` (v44 wq.c:130–168), `ibv_cmd_create_rwq_ind_table`
/// (cmd.c:1160–1203) and the uverbs limit on the table size.
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_rwq_ind_table(
    context: *mut ibv_context,
    attr: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    call_ptr(
        "ibv_create_rwq_ind_table",
        json!({"context": addr(context)}),
        |st| {
            let _ = ctx_of(st, context, "ibv_create_rwq_ind_table");
            // SAFETY: the caller passes its init attr.
            let a = unsafe { &*non_null(attr, "ibv_create_rwq_ind_table", "init_attr") };
            if a.comp_mask >= IBV_CREATE_IND_TABLE_RESERVED {
                return Err(libc::EINVAL); // cmd.c:1172–1173
            }
            if a.log_ind_tbl_size > UVERBS_MAX_LOG_IND_TABLE {
                return Err(libc::EINVAL); // ib_uverbs_ex_create_rwq_ind_table
            }
            let n = 1usize << a.log_ind_tbl_size;
            non_null(a.ind_tbl, "ibv_create_rwq_ind_table", "ind_tbl");
            let mut wqs = Vec::with_capacity(n);
            for i in 0..n {
                // SAFETY: the caller's table has 1 << log_ind_tbl_size entries
                // (libibverbs reads each one's handle, cmd.c:1183–1184).
                let w = unsafe { *a.ind_tbl.add(i) };
                wqs.push(
                    obj(st, w.cast::<Wq>(), &[Kind::Wq], "ibv_create_rwq_ind_table") as *mut Wq,
                );
            }
            st.kernel(context, "ibv_create_rwq_ind_table")?;
            for &w in &wqs {
                // SAFETY: live WQs (checked above).
                unsafe { (*w).users += 1 };
            }
            let handle = st.next_id();
            let t = Box::into_raw(Box::new(Ind {
                t: ibv_rwq_ind_table {
                    context,
                    ind_tbl_handle: handle as c_int,
                    ind_tbl_num: handle as c_int,
                    comp_mask: 0,
                },
                wqs,
                users: 0,
            }));
            st.register(t as usize, Kind::IndTable, context as usize);
            Ok(t.cast::<ibv_rwq_ind_table>())
        },
    )
}

/// `mana_destroy_rwq_ind_table` (v44 wq.c:170–189); EBUSY while a QP uses it
/// (uverbs_free_rwq_ind_tbl).
///
/// # Safety
/// `table` came from `create_rwq_ind_table`.
pub unsafe extern "C" fn destroy_rwq_ind_table(table: *mut ibv_rwq_ind_table) -> c_int {
    call_int(
        "ibv_destroy_rwq_ind_table",
        json!({"table": addr(table)}),
        |st| {
            let t = obj(
                st,
                table.cast::<Ind>(),
                &[Kind::IndTable],
                "ibv_destroy_rwq_ind_table",
            );
            // A disassociated context: the kernel destroyed the table already (its WQs may
            // be gone too).
            if !st.disassociated(t.t.context) {
                if t.users > 0 {
                    return Err(libc::EBUSY);
                }
                st.kernel(t.t.context, "ibv_destroy_rwq_ind_table")?;
                for &w in &t.wqs {
                    // SAFETY: the table's WQs cannot be destroyed while it exists.
                    unsafe { (*w).users -= 1 };
                }
            }
            st.unregister(table as usize);
            // SAFETY: unregistered above; freed once.
            drop(unsafe { Box::from_raw(t as *mut Ind) });
            Ok(0)
        },
    )
}

// ---- QPs -----------------------------------------------------------------------------------
