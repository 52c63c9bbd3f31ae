//! What libibverbs and the kernel's uverbs core do the same way for every provider: finding
//! a caller's object in the registry (or stopping where real rdma-core would crash), the
//! `set_qp` bookkeeping of a new QP, pinning checks on user memory, the `CAP_NET_RAW` rule
//! for raw-packet objects, and the command-level checks of `ibv_cmd_create_qp_ex2`,
//! `ibv_icmd_create_qp` and the indirection table.
//!
//! Citations: `v44 FILE:LINE` is rdma-core tag v44.0; kernel rules name the function of
//! `drivers/infiniband/core` they copy.

use crate::ffi::*;
use crate::state::{die, Kind, State};
use crate::verbs::{ctx_of, Ctx};
use std::ffi::{c_int, c_void};

/// Kernel (uverbs core): `IB_USER_VERBS_MAX_LOG_IND_TBL_SIZE`.
pub const UVERBS_MAX_LOG_IND_TABLE: u32 = 13;

/// A registered object of the expected kind, or abort (real rdma-core would misread it).
pub fn obj<T>(st: &State, p: *mut T, kinds: &[Kind], call: &str) -> &'static mut T {
    match st.kind_of(p as usize) {
        Some(k) if kinds.contains(&k) => {
            // SAFETY: registered objects of these kinds are live boxes of `T` (repr(C) with
            // the public verbs struct first), freed only after they are unregistered.
            unsafe { &mut *p }
        }
        _ => die(
            call,
            &format!(
                "{:#x} is not a live {} (real rdma-core would crash or corrupt memory)",
                p as usize,
                kinds[0].name()
            ),
        ),
    }
}

/// `p`, or abort where real rdma-core dereferences a NULL pointer.
pub fn non_null<T>(p: *mut T, call: &str, what: &str) -> *mut T {
    if p.is_null() {
        die(
            call,
            &format!("{what} is NULL (real rdma-core dereferences it and crashes)"),
        );
    }
    p
}

/// The context of a live object of one of `kinds` (libibverbs finds the provider through
/// the object's `context`, `get_ops(obj->context)`); aborts on anything else.
pub fn ctx_of_obj<T>(st: &State, p: *mut T, kinds: &[Kind], call: &str) -> &'static mut Ctx {
    let _ = obj(st, p.cast::<u8>(), kinds, call);
    let ctx = st
        .objects
        .get(&(p as usize))
        .map(|e| e.ctx)
        .expect("registered just above");
    ctx_of(st, ctx as *mut ibv_context, call)
}

/// Kernel pinning (`ib_umem_get`): every page of the range must be mapped (EFAULT).
pub fn mapped(buf: *mut c_void, len: usize) -> Result<(), c_int> {
    const PAGE: usize = 4096;
    let start = buf as usize & !(PAGE - 1);
    let end = (buf as usize + len.max(1)).div_ceil(PAGE) * PAGE;
    let pages = (end - start) / PAGE;
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables for the range and writes `pages` bytes.
    let r = unsafe { libc::mincore(start as *mut c_void, end - start, vec.as_mut_ptr()) };
    if r != 0 {
        return Err(libc::EFAULT);
    }
    Ok(())
}

/// `CAP_NET_RAW` (linux/capability.h).
const CAP_NET_RAW: u32 = 13;

/// Kernel (uverbs core `create_qp`, `ib_uverbs_ex_create_flow`): raw-packet QPs and flow
/// rules need `CAP_NET_RAW` (EPERM).
pub fn has_cap_net_raw() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_NET_RAW) != 0)
}

/// A new QP as `set_qp` leaves it (v44 libibverbs/cmd_qp.c:45–70): context, pd, CQs, type,
/// state RESET, handle and number.
pub fn new_qp(
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    qp_context: *mut c_void,
    handle: u32,
) -> ibv_qp {
    // SAFETY: zeroed `ibv_qp` is valid; `set_qp` (cmd_qp.c:45–70) fills the rest.
    let mut q: ibv_qp = unsafe { std::mem::zeroed() };
    q.context = context;
    q.qp_context = qp_context;
    q.pd = pd;
    q.send_cq = send_cq;
    q.recv_cq = recv_cq;
    q.qp_type = IBV_QPT_RAW_PACKET;
    q.state = IBV_QPS_RESET;
    q.handle = handle;
    q.qp_num = handle;
    q
}

/// The `comp_mask` bits `ibv_cmd_create_qp_ex2` accepts (v44 libibverbs/cmd_qp.c:434–444).
pub const CREATE_QP_EX2_MASK: u32 = IBV_QP_INIT_ATTR_PD
    | IBV_QP_INIT_ATTR_XRCD
    | IBV_QP_INIT_ATTR_CREATE_FLAGS
    | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
    | IBV_QP_INIT_ATTR_IND_TABLE
    | IBV_QP_INIT_ATTR_RX_HASH
    | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// `ibv_icmd_create_qp`'s own checks (v44 libibverbs/cmd_qp.c:109–122): the PD bit is
/// required, and with an indirection table the receive caps, `recv_cq` and `srq` must be
/// empty (EINVAL).
///
/// # Errors
/// `EINVAL` as above.
pub fn icmd_create_qp_checks(a: &ibv_qp_init_attr_ex) -> Result<(), c_int> {
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE != 0
        && (a.cap.max_recv_wr != 0
            || a.cap.max_recv_sge != 0
            || !a.recv_cq.is_null()
            || !a.srq.is_null())
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The WQ handles of an indirection table's init attr, as `ibv_cmd_create_rwq_ind_table`
/// reads them (v44 libibverbs/cmd.c:1172–1184): `comp_mask ≥ RESERVED` → EINVAL (returned,
/// errno untouched), then the uverbs limit on the size (EINVAL, kernel
/// `ib_uverbs_ex_create_rwq_ind_table`), then `1 << log_ind_tbl_size` pointers (a NULL
/// table or entry is a crash in real rdma-core).
///
/// # Errors
/// `Err(Ok(EINVAL))` for the user-space check (errno untouched), `Err(Err(EINVAL))` for the
/// kernel's.
pub fn ind_table_entries(
    st: &State,
    a: &ibv_rwq_ind_table_init_attr,
    call: &str,
) -> Result<Vec<*mut ibv_wq>, Result<c_int, c_int>> {
    if a.comp_mask >= IBV_CREATE_IND_TABLE_RESERVED {
        return Err(Ok(libc::EINVAL));
    }
    if a.log_ind_tbl_size > UVERBS_MAX_LOG_IND_TABLE {
        return Err(Err(libc::EINVAL));
    }
    let n = 1usize << a.log_ind_tbl_size;
    non_null(a.ind_tbl, call, "ind_tbl");
    let mut wqs = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller's table has 1 << log_ind_tbl_size entries (libibverbs reads
        // each one's handle, cmd.c:1183–1184).
        let w = unsafe { *a.ind_tbl.add(i) };
        let _ = obj(st, w, &[Kind::Wq], call);
        wqs.push(w);
    }
    Ok(wqs)
}
