//! Raw-packet QPs (a send queue, and a receive queue if asked for) and RSS ("hash") QPs:
//! `ibv_create_qp`, `ibv_create_qp_ex` (`create_qp`, v44 verbs.c:2271–2694),
//! `ibv_modify_qp` (verbs.c:2952–3067 and the kernel's state machine), `ibv_query_qp`,
//! `ibv_destroy_qp` (verbs.c:2740–2802) and `mlx5dv_init_obj(QP)` (mlx5.c:984–1032).

use super::alloc::{self, Buf, Dbrec};
use super::cq::Cq;
use super::{caps, mctx, Bf, RES_TYPE_QP, SEND_WQE_BB};
use crate::ffi::*;
use crate::objects::{
    has_cap_net_raw, icmd_create_qp_checks, mapped, new_qp, non_null, obj, CREATE_QP_EX2_MASK,
};
use crate::pd::{real_pd, Pd};
use crate::state::{addr, call_ptr, die, Kind, State};
use crate::verbs::ctx_of;
use serde_json::json;
use std::ffi::c_int;

/// `sizeof(struct mlx5_wqe_ctrl_seg)` + `sizeof(struct mlx5_wqe_eth_seg)`: a raw-packet
/// send WQE's fixed part (`sq_overhead`, v44 verbs.c:1463–1581).
const SQ_OVERHEAD_RAW: u32 = 16 + 32;
/// `sizeof(struct mlx5_wqe_data_seg)`.
const DATA_SEG: u32 = 16;
/// `sizeof(struct mlx5_wqe_inl_data_seg)`.
const INL_SEG: u32 = 4;
/// `sizeof(cmd_ex_rss.rx_hash_key)` (`struct mlx5_ib_create_qp_rss`): 128 bytes.
const RSS_CMD_KEY_MAX: u8 = 128;
/// The Toeplitz key of a TIR (`MLX5_FLD_SZ_BYTES(tirc, rx_hash_toeplitz_key)`).
const TIR_KEY_LEN: u8 = 40;

/// What the RSS hash QP remembers for steering.
#[derive(Debug, Clone)]
pub struct Rss {
    /// The indirection table.
    pub table: *mut super::wq::Ind,
    /// Toeplitz key.
    pub key: [u8; 40],
    /// `rx_hash_fields_mask`.
    pub fields: u64,
}

/// A QP (`struct mlx5_qp`).
#[repr(C)]
pub struct Qp {
    /// What callers hold.
    pub qp: ibv_qp,
    /// An RSS hash QP (a TIR over an indirection table); `None` for a raw QP.
    pub rss: Option<Rss>,
    /// The main buffer (the RQ of a raw QP; its SQ has its own).
    pub buf: Option<Buf>,
    /// `sq_buf_size`: the separate SQ buffer of a raw QP.
    pub sq_buf: Option<Buf>,
    /// Bytes of the SQ ring.
    pub sq_buf_size: usize,
    /// Bytes of the main buffer as `qp->buf_size` (the RQ ring).
    pub buf_size: usize,
    /// The doorbell record (RCV at 0, SND at 1).
    pub db: Option<Dbrec>,
    /// SQ WQEBBs.
    pub sq_wqe_cnt: u32,
    /// `sq.max_post`.
    pub sq_max_post: u32,
    /// `sq.max_gs`.
    pub sq_max_gs: u32,
    /// `max_inline_data`.
    pub max_inline: u32,
    /// RQ WQEs.
    pub rq_wqe_cnt: u32,
    /// log2 of the RQ stride.
    pub rq_wqe_shift: u32,
    /// `rq.max_gs`.
    pub rq_max_gs: u32,
    /// SQ, TIS, RQ, TIR numbers (0 where the QP has none).
    pub sqn: u32,
    /// TIS number.
    pub tisn: u32,
    /// RQ number.
    pub rqn: u32,
    /// TIR number of a raw QP with an RQ.
    pub tirn: u32,
    /// The BlueFlame register (`qp->bf`); none for an RSS QP.
    pub bf: Option<Bf>,
    /// The kernel PD it counts on.
    pub pd: *mut Pd,
    /// The parent domain it was created with, or NULL.
    pub parent: *mut Pd,
    /// Flow rules attached (`usecnt`).
    pub flows: u32,
    /// Its SQ is served by the device model (it reached RTS once).
    pub served: bool,
    /// The device index.
    pub device: u32,
}

fn ilog32(v: u32) -> u32 {
    32 - v.leading_zeros()
}

/// `vctx->create_qp_ex` = `mlx5_create_qp_ex` (v44 verbs.c:3327–3331).
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_qp_ex_slot(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const CALL: &str = "ibv_create_qp_ex";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &mut *non_null(attr, CALL, "qp_init_attr_ex") };
        create(st, context, a, CALL)
    })
}

/// `mlx5_create_qp` (v44 verbs.c:2679–2694) behind the exported `ibv_create_qp`: the
/// attr as an extended one with the PD bit, and on success the kernel's caps back into
/// the caller's.
pub fn create_qp(
    st: &mut State,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, c_int> {
    const CALL: &str = "ibv_create_qp";
    // SAFETY: the caller passes its init attr.
    let a = unsafe { &mut *non_null(attr, CALL, "qp_init_attr") };
    // SAFETY: `pd` is a live PD (checked by the dispatch).
    let context = unsafe { (*pd).context };
    let mut x = ibv_qp_init_attr_ex {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
        comp_mask: IBV_QP_INIT_ATTR_PD,
        pd,
        ..Default::default()
    };
    let q = create(st, context, &mut x, CALL)?;
    a.cap = x.cap;
    Ok(q)
}

/// The SQ geometry (`mlx5_calc_sq_size`, v44 verbs.c:1583–1696): WQE size, ring bytes,
/// WQEBBs, `max_post`, `max_inline_data` (written back at once). `Ok(None)` for no SQ.
fn sq_size(a: &mut ibv_qp_init_attr_ex) -> Result<Option<(u32, u32, u32, u32)>, c_int> {
    if a.cap.max_send_wr == 0 {
        return Ok(None);
    }
    // mlx5_calc_send_wqe (l. 1583–1619).
    let mut size = SQ_OVERHEAD_RAW;
    let inl = if a.cap.max_inline_data != 0 {
        size + (INL_SEG + a.cap.max_inline_data).div_ceil(16) * 16
    } else {
        0
    };
    if a.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 {
        size += u32::from(a.max_tso_header).div_ceil(16) * 16;
    }
    let max_gather = caps::MAX_SQ_DESC_SZ.saturating_sub(size) / DATA_SEG;
    if a.cap.max_send_sge > max_gather {
        return Err(libc::EINVAL);
    }
    size += a.cap.max_send_sge * DATA_SEG;
    let tot = size.max(inl);
    if tot > caps::MAX_SQ_DESC_SZ {
        return Err(libc::EINVAL);
    }
    let wqe_size = tot.div_ceil(SEND_WQE_BB as u32) * SEND_WQE_BB as u32;
    // l. 1667–1669: max_inline_data = wqe_size − overhead − inline segment header.
    let max_inline = wqe_size - SQ_OVERHEAD_RAW - INL_SEG;
    a.cap.max_inline_data = max_inline;
    // l. 1675–1678: max_send_wr above 0x7fffffff / max_sq_desc_sz → EINVAL.
    if a.cap.max_send_wr > 0x7fff_ffff / caps::MAX_SQ_DESC_SZ {
        return Err(libc::EINVAL);
    }
    let wq_size = (a.cap.max_send_wr * wqe_size).next_power_of_two();
    let wqe_cnt = wq_size / SEND_WQE_BB as u32;
    if wqe_cnt > caps::MAX_QP_WR {
        return Err(libc::EINVAL);
    }
    Ok(Some((wq_size, wqe_cnt, wq_size / wqe_size, max_inline)))
}

/// The RQ geometry of a raw QP (`mlx5_calc_rq_size`, v44 verbs.c:1744–1783): ring
/// bytes, WQEs, log2 stride, scatter entries. `Ok(None)` for no RQ.
fn rq_size(a: &ibv_qp_init_attr_ex) -> Result<Option<(u32, u32, u32, u32)>, c_int> {
    if a.cap.max_recv_wr == 0 {
        return Ok(None);
    }
    if a.cap.max_recv_wr > caps::MAX_QP_WR {
        return Err(libc::EINVAL);
    }
    if !a.srq.is_null() {
        die(
            "ibv_create_qp",
            "shared receive queues are not modelled by the fake",
        );
    }
    // mlx5_calc_rcv_wqe (l. 1621–1642).
    let size = DATA_SEG * a.cap.max_recv_sge.max(1);
    if size > caps::MAX_RQ_DESC_SZ {
        return Err(libc::EINVAL);
    }
    let wqe_size = size.next_power_of_two();
    let wq_size = (a.cap.max_recv_wr.next_power_of_two() * wqe_size).max(SEND_WQE_BB as u32);
    let wqe_cnt = wq_size / wqe_size;
    Ok(Some((
        wq_size,
        wqe_cnt,
        ilog32(wqe_size - 1),
        wqe_size / DATA_SEG,
    )))
}

/// `create_qp` (v44 verbs.c:2271–2677), for raw-packet QPs and RSS QPs. `Err(0)` is NULL
/// with errno untouched.
fn create(
    st: &mut State,
    context: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
    call: &'static str,
) -> Result<*mut ibv_qp, c_int> {
    let ctx = ctx_of(st, context, call);
    let device = ctx.device().index;
    // l. 2289–2294: unknown comp_mask bits, or a TSO header on another type → NULL, errno
    // untouched.
    let sup = CREATE_QP_EX2_MASK;
    if a.comp_mask & !sup != 0 {
        return Err(0);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 && a.qp_type != IBV_QPT_RAW_PACKET {
        return Err(0);
    }
    // l. 2296–2303: send ops flags on an RSS QP → EINVAL.
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
        && a.comp_mask & IBV_QP_INIT_ATTR_RX_HASH != 0
    {
        return Err(libc::EINVAL);
    }
    // l. 2315–2323: SOURCE_QPN only on UD → EINVAL.
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0
        && a.create_flags & IBV_QP_CREATE_SOURCE_QPN != 0
        && a.qp_type != IBV_QPT_UD
    {
        return Err(libc::EINVAL);
    }
    // l. 2441–2442: a DRIVER QP needs the vendor attr → NULL, errno untouched.
    if a.qp_type == IBV_QPT_DRIVER {
        return Err(0);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_RX_HASH != 0 {
        return create_rss(st, context, a, call);
    }
    if a.qp_type != IBV_QPT_RAW_PACKET {
        die(
            call,
            &format!(
                "QP type {} is not modelled by the fake (raw-packet QPs only)",
                a.qp_type
            ),
        );
    }
    // l. 2494–2498: the geometry.
    let sq = sq_size(a)?;
    let rq = rq_size(a)?;
    let (sq_bytes, sq_wqe_cnt, sq_max_post, max_inline) = sq.unwrap_or((0, 0, 0, 0));
    let (rq_bytes, rq_wqe_cnt, rq_wqe_shift, rq_max_gs) = rq.unwrap_or((0, 0, 0, 0));
    // l. 2500–2508: a raw QP's main buffer is the RQ; the SQ has its own.
    let buf_size = rq_bytes as usize;
    let sq_buf_size = sq_bytes as usize;
    let pd = non_null(a.pd, call, "pd").cast::<Pd>();
    let p = obj(st, pd, &[Kind::Pd, Kind::ParentDomain], call);
    let parent: *mut Pd = if p.is_parent() {
        p
    } else {
        std::ptr::null_mut()
    };
    let m = mctx(ctx);
    // mlx5_alloc_qp_buf (l. 1852–1968): the main buffer (align(buf_size, page): zero bytes
    // for a send-only QP, still asked for), then the SQ buffer (align(sq_buf_size, page));
    // each zeroed unless a parent domain's allocator gave it.
    let Some(buf) = alloc::alloc_buf(
        m,
        pd,
        alloc::align(buf_size, super::PAGE),
        super::PAGE,
        RES_TYPE_QP,
    ) else {
        return Err(0);
    };
    let sq_aligned = alloc::align(sq_buf_size, super::PAGE);
    let Some(sq_buf) = alloc::alloc_buf(m, pd, sq_aligned, super::PAGE, RES_TYPE_QP) else {
        alloc::free_buf(m, buf, call);
        return Err(0);
    };
    // SAFETY: the allocators handed out the asked sizes.
    unsafe {
        if !matches!(buf.kind, alloc::BufKind::Custom { .. }) && buf_size > 0 {
            std::ptr::write_bytes(buf.ptr.cast::<u8>(), 0, buf_size);
        }
        if !matches!(sq_buf.kind, alloc::BufKind::Custom { .. }) && sq_aligned > 0 {
            std::ptr::write_bytes(sq_buf.ptr.cast::<u8>(), 0, sq_aligned);
        }
    }
    // l. 2532–2541: the doorbell record, zeroed unless a parent domain gave it.
    let Some(db) = alloc::alloc_dbrec(m, pd) else {
        alloc::free_buf(m, buf, call);
        alloc::free_buf(m, sq_buf, call);
        return Err(0);
    };
    if db.custom.is_none() {
        // SAFETY: 8 writable bytes.
        unsafe {
            db.ptr.write_volatile(0);
            db.ptr.add(1).write_volatile(0);
        }
    }
    // l. 2566–2573: a BlueFlame register (mlx5_get_qp_uar).
    let bf = m.get_qp_uar();
    let release = |m: &mut super::Mlx5Ctx, bf: Option<Bf>| {
        if let Some(bf) = bf {
            m.put_qp_uar(bf);
        }
        alloc::free_dbrec(m, db, call);
        alloc::free_buf(m, buf, call);
        alloc::free_buf(m, sq_buf, call);
    };
    let Some(bf) = bf else {
        release(m, None);
        return Err(libc::ENOMEM);
    };
    // libibverbs (ibv_cmd_create_qp_ex2 / ibv_icmd_create_qp, cmd_qp.c:109–155,
    // 434–444), then the kernel.
    let checked = (|| {
        if a.comp_mask & !CREATE_QP_EX2_MASK != 0 {
            return Err(libc::EINVAL);
        }
        icmd_create_qp_checks(a)?;
        // cmd_qp.c:135–143: send_cq and recv_cq are dereferenced.
        let scq = obj(
            st,
            non_null(a.send_cq, call, "send_cq").cast::<Cq>(),
            &[Kind::Cq],
            call,
        );
        let rcq = obj(
            st,
            non_null(a.recv_cq, call, "recv_cq").cast::<Cq>(),
            &[Kind::Cq],
            call,
        );
        st.kernel(context, call)?;
        // uverbs create_qp: a raw-packet QP needs CAP_NET_RAW (EPERM); mlx5_ib pins the
        // buffers and the record (ib_umem_get: EFAULT).
        if !has_cap_net_raw() {
            return Err(libc::EPERM);
        }
        if buf_size > 0 {
            mapped(buf.ptr, buf_size)?;
        }
        if sq_buf_size > 0 {
            mapped(sq_buf.ptr, sq_buf_size)?;
        }
        mapped(db.ptr.cast(), 8)?;
        Ok((scq as *mut Cq, rcq as *mut Cq))
    })();
    let (scq, rcq) = match checked {
        Ok(c) => c,
        Err(e) => {
            release(mctx(ctx_of(st, context, call)), Some(bf));
            return Err(e);
        }
    };
    // Success: the numbers (a raw QP's number is its SQ's, else its RQ's: mlx5_ib
    // create_raw_packet_qp), the caps written back (l. 2623–2625).
    let sqn = if sq.is_some() { st.next_id() } else { 0 };
    let tisn = if sq.is_some() { st.next_id() } else { 0 };
    let rqn = if rq.is_some() { st.next_id() } else { 0 };
    let tirn = if rq.is_some() { st.next_id() } else { 0 };
    a.cap.max_send_wr = sq_max_post;
    a.cap.max_recv_wr = rq_wqe_cnt;
    a.cap.max_recv_sge = rq_max_gs;
    // SAFETY: live CQs (checked above) and PD.
    unsafe {
        (*scq).users += 1;
        (*rcq).users += 1;
        if !parent.is_null() {
            (*parent).refs += 1;
        }
    }
    let real = real_pd(p);
    real.users += 1;
    let handle = st.next_id();
    let mut q = new_qp(context, a.pd, a.send_cq, a.recv_cq, a.qp_context, handle);
    q.qp_num = if sqn != 0 { sqn } else { rqn };
    let qp = Box::into_raw(Box::new(Qp {
        qp: q,
        rss: None,
        buf: Some(buf),
        sq_buf: Some(sq_buf),
        sq_buf_size,
        buf_size,
        db: Some(db),
        sq_wqe_cnt,
        sq_max_post,
        sq_max_gs: a.cap.max_send_sge,
        max_inline,
        rq_wqe_cnt,
        rq_wqe_shift,
        rq_max_gs,
        sqn,
        tisn,
        rqn,
        tirn,
        bf: Some(bf),
        pd: real,
        parent,
        flows: 0,
        served: false,
        device,
    }));
    st.register(qp as usize, Kind::Qp, context as usize);
    Ok(qp.cast())
}

/// An RSS QP (`mlx5_cmd_create_rss_qp`, v44 verbs.c:2026–2065; kernel
/// `create_rss_raw_qp_tir`): no buffer, no record, no BlueFlame register.
fn create_rss(
    st: &mut State,
    context: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
    call: &'static str,
) -> Result<*mut ibv_qp, c_int> {
    let device = ctx_of(st, context, call).device().index;
    // l. 2036–2039: a key longer than the command's → EINVAL.
    if a.rx_hash_conf.rx_hash_key_len > RSS_CMD_KEY_MAX {
        return Err(libc::EINVAL);
    }
    // ibv_cmd_create_qp_ex2 and ibv_icmd_create_qp (cmd_qp.c:109–155, 434–444).
    if a.comp_mask & !CREATE_QP_EX2_MASK != 0 {
        return Err(libc::EINVAL);
    }
    if a.qp_type != IBV_QPT_RAW_PACKET {
        die(
            call,
            "RSS QPs of types other than RAW_PACKET are not modelled by the fake",
        );
    }
    icmd_create_qp_checks(a)?;
    if a.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE == 0 {
        // Without a table the command dereferences the CQs (cmd_qp.c:135–143) and the
        // kernel builds a raw QP from an RSS command: not modelled.
        die(
            call,
            "RX_HASH without an indirection table is not modelled by the fake",
        );
    }
    let pd = non_null(a.pd, call, "pd").cast::<Pd>();
    let p = obj(st, pd, &[Kind::Pd, Kind::ParentDomain], call);
    let t = obj(
        st,
        non_null(a.rwq_ind_tbl, call, "rwq_ind_tbl").cast::<super::wq::Ind>(),
        &[Kind::IndTable],
        call,
    );
    st.kernel(context, call)?;
    // The kernel, in order: CAP_NET_RAW (uverbs create_qp, EPERM); create_rss_raw_qp_tir:
    // INNER without tunnel offloads → EOPNOTSUPP; a function other than Toeplitz →
    // EOPNOTSUPP; a key other than the TIR's 40 bytes → EINVAL; no fields over a table of
    // more than one entry → EINVAL; IPv4 and IPv6 fields together, or TCP and UDP ports
    // together → EINVAL.
    if !has_cap_net_raw() {
        return Err(libc::EPERM);
    }
    let f = a.rx_hash_conf.rx_hash_fields_mask;
    if f & u64::from(IBV_RX_HASH_INNER) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if u32::from(a.rx_hash_conf.rx_hash_function) != IBV_RX_HASH_FUNC_TOEPLITZ {
        return Err(libc::EOPNOTSUPP);
    }
    if a.rx_hash_conf.rx_hash_key_len != TIR_KEY_LEN {
        return Err(libc::EINVAL);
    }
    if f == 0 && t.wqs.len() > 1 {
        return Err(libc::EINVAL);
    }
    let v4 = u64::from(IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4);
    let v6 = u64::from(IBV_RX_HASH_SRC_IPV6 | IBV_RX_HASH_DST_IPV6);
    let tcp = u64::from(IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP);
    let udp = u64::from(IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP);
    if (f & v4 != 0 && f & v6 != 0) || (f & tcp != 0 && f & udp != 0) {
        return Err(libc::EINVAL);
    }
    let key_ptr = non_null(a.rx_hash_conf.rx_hash_key, call, "rx_hash_key");
    let mut key = [0u8; 40];
    // SAFETY: the caller's key has rx_hash_key_len = 40 bytes (checked above).
    unsafe { std::ptr::copy_nonoverlapping(key_ptr, key.as_mut_ptr(), key.len()) };
    t.users += 1;
    let parent: *mut Pd = if p.is_parent() {
        p
    } else {
        std::ptr::null_mut()
    };
    if !parent.is_null() {
        // SAFETY: a live parent domain.
        unsafe { (*parent).refs += 1 };
    }
    let real = real_pd(p);
    real.users += 1;
    let tirn = st.next_id();
    let handle = st.next_id();
    let mut q = new_qp(context, a.pd, a.send_cq, a.recv_cq, a.qp_context, handle);
    // A TIR has no QP number of its own.
    q.qp_num = 0;
    let qp = Box::into_raw(Box::new(Qp {
        qp: q,
        rss: Some(Rss {
            table: t,
            key,
            fields: f,
        }),
        buf: None,
        sq_buf: None,
        sq_buf_size: 0,
        buf_size: 0,
        db: None,
        sq_wqe_cnt: 0,
        sq_max_post: 0,
        sq_max_gs: 0,
        max_inline: 0,
        rq_wqe_cnt: 0,
        rq_wqe_shift: 0,
        rq_max_gs: 0,
        sqn: 0,
        tisn: 0,
        rqn: 0,
        tirn,
        bf: None,
        pd: real,
        parent,
        flows: 0,
        served: false,
        device,
    }));
    st.register(qp as usize, Kind::Qp, context as usize);
    Ok(qp.cast())
}

/// The kernel's state table for a raw-packet QP (core/verbs.c `qp_state_table` through
/// `ib_modify_qp_is_ok`, and what mlx5_ib's `modify_raw_packet_qp` carries out):
/// `Some(required, optional)` for a valid transition.
fn raw_transition(cur: ibv_qp_state, new: ibv_qp_state) -> Option<(u32, u32)> {
    let port = IBV_QP_PORT;
    let rate = IBV_QP_RATE_LIMIT;
    let t = match (cur, new) {
        (IBV_QPS_RESET, IBV_QPS_RESET) => (0, 0),
        (IBV_QPS_RESET, IBV_QPS_INIT) => (port, 0),
        (IBV_QPS_INIT, IBV_QPS_RESET | IBV_QPS_ERR | IBV_QPS_INIT | IBV_QPS_RTR) => (0, 0),
        (IBV_QPS_RTR, IBV_QPS_RESET | IBV_QPS_ERR) => (0, 0),
        (IBV_QPS_RTR, IBV_QPS_RTS) => (0, rate),
        (IBV_QPS_RTS, IBV_QPS_RESET | IBV_QPS_ERR) => (0, 0),
        (IBV_QPS_RTS, IBV_QPS_RTS) => (0, rate),
        (IBV_QPS_SQE | IBV_QPS_SQD, IBV_QPS_RESET | IBV_QPS_ERR) => (0, 0),
        (IBV_QPS_ERR, IBV_QPS_RESET | IBV_QPS_ERR) => (0, 0),
        _ => return None,
    };
    Some(t)
}

/// `mlx5_modify_qp` (v44 verbs.c:2952–3067) with `ibv_cmd_modify_qp` and the kernel,
/// behind the exported `ibv_modify_qp`: an RSS QP → EOPNOTSUPP; the kernel checks the
/// port and the transition (EINVAL); on success libmlx5 zeroes both doorbell records at
/// RESET (l. 3017–3032) and writes the RQ record at RTR (l. 3042–3050), and libibverbs
/// stores the new state (verbs.c:708–723). The device model follows the SQ: served from
/// its first RTS, reset (counter 0) at RESET and again at the next RTS.
pub fn modify_qp(
    st: &mut State,
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> Result<c_int, c_int> {
    const CALL: &str = "ibv_modify_qp";
    let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], CALL);
    if q.rss.is_some() {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller passes its attr.
    let a = unsafe { &*non_null(attr, CALL, "attr") };
    let ctx = ctx_of(st, q.qp.context, CALL);
    let nports = ctx.nports();
    st.kernel(q.qp.context, CALL)?;
    let mask = mask as u32;
    // uverbs modify_qp: a port outside the device → EINVAL.
    if mask & IBV_QP_PORT != 0 && (a.port_num == 0 || a.port_num > nports) {
        return Err(libc::EINVAL);
    }
    let cur = if mask & IBV_QP_CUR_STATE != 0 {
        a.cur_qp_state
    } else {
        q.qp.state
    };
    let new = if mask & IBV_QP_STATE != 0 {
        a.qp_state
    } else {
        cur
    };
    // ib_modify_qp_is_ok: CUR_STATE is never among a raw QP's parameters; the transition
    // must be in the table with its required parameters and no others.
    let ok = mask & IBV_QP_CUR_STATE == 0
        && raw_transition(cur, new)
            .is_some_and(|(req, opt)| mask & req == req && mask & !(req | opt | IBV_QP_STATE) == 0);
    if !ok {
        return Err(libc::EINVAL);
    }
    if mask & IBV_QP_RATE_LIMIT != 0 {
        die(
            CALL,
            "packet pacing (IBV_QP_RATE_LIMIT) is not modelled by the fake",
        );
    }
    let db = q.db.expect("a raw QP has a doorbell record");
    let dev = q.device;
    if mask & IBV_QP_STATE != 0 {
        match new {
            IBV_QPS_RESET => {
                // The device's SQ goes to RST (its counter restarts at 0) and libmlx5 zeroes
                // both records; under the engine's lock, so it never sees the old record
                // with the new counter.
                if q.served {
                    st.mlx5_nics.sq_state(dev, q.sqn, true, Some(db.ptr));
                } else {
                    zero_dbrec(db);
                }
            }
            IBV_QPS_RTR => {
                // rq.head is 0 for a QP whose RQ only DV posts to.
                // SAFETY: the record has 8 writable bytes.
                unsafe { db.ptr.write_volatile(0) };
            }
            IBV_QPS_RTS if cur == IBV_QPS_RTR && q.sq_wqe_cnt > 0 => {
                // modify_raw_packet_qp: RTR2RTS makes the SQ ready.
                if q.served {
                    st.mlx5_nics.sq_state(dev, q.sqn, false, None);
                } else {
                    serve_sq(st, q)?;
                }
            }
            _ => {}
        }
        q.qp.state = new;
    }
    Ok(0)
}

fn zero_dbrec(db: Dbrec) {
    // SAFETY: a doorbell record has 8 writable bytes.
    unsafe {
        db.ptr.write_volatile(0);
        db.ptr.add(1).write_volatile(0);
    }
}

/// Hands the QP's SQ and send CQ to the device model.
fn serve_sq(st: &mut State, q: &mut Qp) -> Result<(), c_int> {
    let ctx = ctx_of(st, q.qp.context, "ibv_modify_qp");
    let min_inline = mctx(ctx).min_inline();
    let dev = ctx.device();
    // SAFETY: the send CQ is live while the QP uses it (EBUSY).
    let cq = unsafe { &*q.qp.send_cq.cast::<Cq>() };
    let bf = q.bf.expect("a raw QP has a BlueFlame register");
    let sq = crate::nic_mlx5::SqRing {
        buf: q.sq_buf.expect("a raw QP").ptr,
        wqe_cnt: q.sq_wqe_cnt,
        sqn: q.sqn,
        dbrec: q.db.expect("a raw QP").ptr,
        bf_reg: bf.reg,
        // What `mlx5dv_init_obj` reports as `bf.size` (0: the doorbell-only register).
        bf_size: if bf.uuarn > 0 { bf.buf_size } else { 0 },
        min_inline,
    };
    // SAFETY: the SQ buffer and the record are freed by ibv_destroy_qp only after
    // `remove_sq`; the BlueFlame register's UAR page is unmapped only at the context's
    // close, after its QPs left the device (`release`); the CQ cannot be destroyed while
    // the QP exists.
    unsafe {
        st.mlx5_nics
            .add_sq(dev, sq, crate::nic_mlx5::cq_ring(cq), "ibv_modify_qp")
    }?;
    q.served = true;
    Ok(())
}

/// `mlx5_query_qp` (v44 verbs.c:2848–2873): an RSS QP → EOPNOTSUPP; else the state and
/// the caps libmlx5 keeps.
pub fn query_qp(
    st: &mut State,
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> Result<c_int, c_int> {
    const CALL: &str = "ibv_query_qp";
    let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], CALL);
    if q.rss.is_some() {
        return Err(libc::EOPNOTSUPP);
    }
    st.kernel(q.qp.context, CALL)?;
    // SAFETY: the caller passes its structs.
    let (a, i) = unsafe {
        (
            &mut *non_null(attr, CALL, "attr"),
            &mut *non_null(init_attr, CALL, "init_attr"),
        )
    };
    // SAFETY: zeroed structs are valid.
    *a = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    *i = unsafe { std::mem::zeroed() };
    a.qp_state = q.qp.state;
    a.cur_qp_state = q.qp.state;
    a.port_num = 1;
    i.qp_context = q.qp.qp_context;
    i.send_cq = q.qp.send_cq;
    i.recv_cq = q.qp.recv_cq;
    i.qp_type = q.qp.qp_type;
    i.cap.max_send_wr = q.sq_max_post;
    i.cap.max_send_sge = q.sq_max_gs;
    i.cap.max_inline_data = q.max_inline;
    i.cap.max_recv_wr = q.rq_wqe_cnt;
    i.cap.max_recv_sge = q.rq_max_gs;
    a.cap = i.cap;
    Ok(0)
}

/// What the kernel does with a QP being destroyed (or left at close): its SQ leaves the
/// device model, the CQs, table, PD and parent domain counts drop.
fn release(st: &mut State, q: &mut Qp) {
    if q.served {
        st.mlx5_nics.remove_sq(q.device, q.sqn);
        q.served = false;
    }
    if let Some(r) = &q.rss {
        // SAFETY: the table cannot be destroyed while the QP uses it.
        unsafe { (*r.table).users -= 1 };
    } else {
        // SAFETY: CQs cannot be destroyed while the QP uses them.
        unsafe {
            (*q.qp.send_cq.cast::<Cq>()).users -= 1;
            (*q.qp.recv_cq.cast::<Cq>()).users -= 1;
        }
    }
    // SAFETY: the PD cannot be deallocated while the QP uses it.
    unsafe { (*q.pd).users -= 1 };
}

/// `mlx5_destroy_qp` (v44 verbs.c:2740–2802) behind the exported `ibv_destroy_qp`: the
/// kernel first (EBUSY while flow rules use it, `ib_destroy_qp_user`), then the record,
/// the buffers (main, then SQ) and the BlueFlame register.
pub fn destroy_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    const CALL: &str = "ibv_destroy_qp";
    let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], CALL);
    // A disassociated context: the kernel destroyed the QP already (`disassociate`) and
    // lets the command through; libmlx5 frees its part.
    if !st.disassociated(q.qp.context) {
        if q.flows > 0 {
            return Err(libc::EBUSY);
        }
        st.kernel(q.qp.context, CALL)?;
        release(st, q);
        if q.rss.is_some() {
            super::flow::sync(st, q.device);
        }
    }
    if !q.parent.is_null() {
        // libmlx5's count of the parent domain's users (user space): the parent domain
        // cannot be deallocated while the QP counts on it (EBUSY).
        // SAFETY: hence live.
        unsafe { (*q.parent).refs -= 1 };
    }
    let ctx = ctx_of(st, q.qp.context, CALL);
    let m = mctx(ctx);
    if let Some(db) = q.db {
        alloc::free_dbrec(m, db, CALL);
    }
    if let Some(b) = q.buf {
        alloc::free_buf(m, b, CALL);
    }
    if let Some(b) = q.sq_buf {
        alloc::free_buf(m, b, CALL);
    }
    if let Some(bf) = q.bf {
        m.put_qp_uar(bf);
    }
    st.unregister(qp as usize);
    // SAFETY: unregistered above; freed once.
    drop(unsafe { Box::from_raw(q as *mut Qp) });
    Ok(0)
}

/// A QP left on a closing context: the kernel destroys it.
pub fn forget(st: &mut State, a: usize) {
    // SAFETY: a registered QP of an mlx5 context.
    let q = unsafe { &mut *(a as *mut Qp) };
    q.flows = 0;
    release(st, q);
}

/// `mlx5dv_get_qp` (v44 mlx5.c:984–1032): record, SQ (the separate buffer of a raw QP),
/// RQ (main buffer + offset 0), BlueFlame register; on request the UAR's mmap offset, the
/// raw QP's object numbers and the TIR's ICM address; `comp_mask` = what was filled; the
/// BlueFlame size is 0 for a register without BlueFlame (`uuarn` 0). An RSS QP has no
/// register: real libmlx5 dereferences NULL there.
pub fn init_obj(st: &mut State, qp: *mut ibv_qp, out: *mut mlx5dv_qp) {
    let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "mlx5dv_init_obj(qp)");
    let Some(bf) = q.bf else {
        die(
            "mlx5dv_init_obj",
            "an RSS QP has no BlueFlame register: real libmlx5 reads qp->bf->reg through NULL and crashes (mlx5.c:1006)",
        );
    };
    // SAFETY: the caller's output struct.
    let o = unsafe { &mut *out };
    let asked = o.comp_mask;
    let mut filled = 0u64;
    let main = q.buf.map_or(std::ptr::null_mut(), |b| b.ptr);
    o.dbrec = q.db.map_or(std::ptr::null_mut(), |d| d.ptr);
    o.sq.buf = if q.sq_buf_size != 0 {
        q.sq_buf.map_or(std::ptr::null_mut(), |b| b.ptr)
    } else {
        main
    };
    o.sq.wqe_cnt = q.sq_wqe_cnt;
    o.sq.stride = SEND_WQE_BB as u32;
    o.rq.buf = main;
    o.rq.wqe_cnt = q.rq_wqe_cnt;
    o.rq.stride = 1 << q.rq_wqe_shift;
    o.bf.reg = bf.reg;
    if asked & u64::from(MLX5DV_QP_MASK_UAR_MMAP_OFFSET) != 0 {
        o.uar_mmap_offset = bf.uar_mmap_offset as _;
        filled |= u64::from(MLX5DV_QP_MASK_UAR_MMAP_OFFSET);
    }
    if asked & u64::from(MLX5DV_QP_MASK_RAW_QP_HANDLES) != 0 {
        o.tirn = q.tirn;
        o.tisn = q.tisn;
        o.rqn = q.rqn;
        o.sqn = q.sqn;
        filled |= u64::from(MLX5DV_QP_MASK_RAW_QP_HANDLES);
    }
    if asked & u64::from(MLX5DV_QP_MASK_RAW_QP_TIR_ADDR) != 0 {
        o.tir_icm_addr = 0;
        filled |= u64::from(MLX5DV_QP_MASK_RAW_QP_TIR_ADDR);
    }
    o.bf.size = if bf.uuarn > 0 { bf.buf_size } else { 0 };
    o.comp_mask = filled;
}
