//! Completion queues: `ibv_create_cq`, `ibv_create_cq_ex`, `mlx5dv_create_cq` (one
//! `create_cq` in v44 verbs.c:947–1157 behind all three), `ibv_destroy_cq`, and
//! `mlx5dv_init_obj(CQ)`.

use super::alloc::{self, Buf, Dbrec};
use super::{caps, mctx, RES_TYPE_CQ};
use crate::ffi::*;
use crate::objects::{mapped, non_null, obj};
use crate::pd::Pd;
use crate::state::{addr, call_ptr, die, Kind, State};
use crate::verbs::{ctx_of, Ctx};
use crate::world::Family;
use serde_json::json;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// `MLX5_CQE_INVALID << 4`: the `op_own` every entry starts with (v44 cq.c:1963–1967, the store at l. 1966).
const OP_OWN_INVALID: u8 = 0xf0;
/// Offset of `op_own` in a 64-byte CQE.
const OP_OWN: usize = 63;

/// A completion queue (`struct mlx5_cq`): `ibv_cq_ex` first, whose head is the `ibv_cq`
/// (`ibv_cq_ex_to_cq` is a cast).
#[repr(C)]
pub struct Cq {
    /// What callers hold.
    pub cq: ibv_cq_ex,
    /// Entries (`ncqe`, a power of two): `mlx5dv_cq.cqe_cnt`.
    pub ncqe: u32,
    /// Bytes per entry (64 or 128).
    pub cqe_sz: u32,
    /// The ring.
    pub buf: Buf,
    /// The doorbell record (SET_CI, ARM).
    pub dbrec: Dbrec,
    /// CQ number.
    pub cqn: u32,
    /// Created with compressed CQEs (HASH minis): sessions of this many at most.
    pub comp: Option<u32>,
    /// Kernel users (`usecnt`): QPs (as send and as receive CQ) and WQs.
    pub users: u32,
    /// `mlx5dv_init_obj` took it over (`MLX5_CQ_FLAGS_DV_OWNED`).
    pub dv_owned: bool,
    /// The parent domain it was created with (`IBV_CQ_INIT_ATTR_MASK_PD`), or NULL.
    pub parent: *mut Pd,
}

/// `CREATE_CQ_SUPPORTED_WC_FLAGS` (v44 verbs.c:920–927) = libibverbs'
/// `IBV_CREATE_CQ_SUP_WC_FLAGS` (verbs.h:567–574).
fn supported_wc_flags() -> u64 {
    u64::from(IBV_CREATE_CQ_SUP_WC_FLAGS)
}

/// The poll entry points of an extended CQ: libmlx5 fills them with its CQE parser
/// (`mlx5_cq_fill_pfns`, v44 cq.c:1671–1720); the fake has none.
unsafe extern "C" fn start_poll(_: *mut ibv_cq_ex, _: *mut ibv_poll_cq_attr) -> c_int {
    die(
        "ibv_start_poll",
        "libmlx5's own CQE parsing (ibv_start_poll) is not modelled by the fake: read CQEs through mlx5dv_init_obj",
    )
}
unsafe extern "C" fn next_poll(_: *mut ibv_cq_ex) -> c_int {
    die(
        "ibv_next_poll",
        "libmlx5's own CQE parsing is not modelled by the fake",
    )
}
unsafe extern "C" fn end_poll(_: *mut ibv_cq_ex) {
    die(
        "ibv_end_poll",
        "libmlx5's own CQE parsing is not modelled by the fake",
    )
}

/// The shared `create_cq` of v44 verbs.c:947–1157. `Err(0)` is NULL with errno untouched
/// (the allocation failures, where libmlx5 sets none).
fn create(
    st: &mut State,
    context: *mut ibv_context,
    a: &ibv_cq_init_attr_ex,
    extended: bool,
    dv: Option<&mlx5dv_cq_init_attr>,
    call: &'static str,
) -> Result<*mut Cq, c_int> {
    let ctx = ctx_of(st, context, call);
    // l. 964–968: cqe 0 → EINVAL.
    if a.cqe == 0 {
        return Err(libc::EINVAL);
    }
    // l. 970–975: comp_mask ⊄ {FLAGS, PD} → EINVAL.
    if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
        return Err(libc::EINVAL);
    }
    // l. 977–983: unsupported creation flags → EINVAL.
    let flags_ok = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !flags_ok != 0 {
        return Err(libc::EINVAL);
    }
    // l. 985–989: wc_flags ⊄ supported → ENOTSUP.
    if a.wc_flags & !supported_wc_flags() != 0 {
        return Err(libc::ENOTSUP);
    }
    // l. 991–998: vendor comp_mask ⊄ {COMPRESSED_CQE, FLAGS, CQE_SIZE} → EINVAL.
    let dv_known = u64::from(
        MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE
            | MLX5DV_CQ_INIT_ATTR_MASK_FLAGS
            | MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE,
    );
    if dv.is_some_and(|d| d.comp_mask & !dv_known != 0) {
        return Err(libc::EINVAL);
    }
    // l. 1011–1017: a PD in the attr must be a parent domain (EINVAL).
    let mut parent: *mut Pd = null_mut();
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
        let p = a.parent_domain.cast::<Pd>();
        match st.kind_of(p as usize) {
            Some(Kind::ParentDomain) => parent = p,
            _ => return Err(libc::EINVAL),
        }
    }
    // l. 1034–1039: ncqe = roundup_pow_of_two(cqe + 1), at most 2^24.
    let want = u64::from(a.cqe) + 1;
    let ncqe = want.next_power_of_two();
    if ncqe > 1 << 24 {
        return Err(libc::EINVAL);
    }
    let ncqe = ncqe as u32;
    // get_cqe_size (l. 863–885): the vendor attr's size, else MLX5_CQE_SIZE, else 64; only
    // 64 and 128 are valid (EINVAL).
    let cqe_sz: i64 = match dv {
        Some(d) if d.comp_mask & u64::from(MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE) != 0 => {
            i64::from(d.cqe_size)
        }
        _ => std::env::var("MLX5_CQE_SIZE")
            .ok()
            .map_or(64, |v| v.trim().parse().unwrap_or(0)),
    };
    if cqe_sz != 64 && cqe_sz != 128 {
        return Err(libc::EINVAL);
    }
    let cqe_sz = cqe_sz as usize;
    let m = mctx(ctx);
    // mlx5_alloc_cq_buf (v44 cq.c:1929–1970): align(ncqe * cqe_sz, page), page-aligned for
    // a parent domain; zeroed unless a parent domain's allocator gave it; op_own = 0xF0 in
    // every entry (in the second half of a 128-byte entry).
    let ring = ncqe as usize * cqe_sz;
    let Some(buf) = alloc::alloc_buf(
        m,
        parent,
        alloc::align(ring, super::PAGE),
        super::PAGE,
        RES_TYPE_CQ,
    ) else {
        return Err(0);
    };
    // SAFETY: the allocator handed out at least `ring` bytes at `buf.ptr` (the contract of
    // the allocators, as libmlx5 writes them without a check).
    unsafe {
        if !matches!(buf.kind, alloc::BufKind::Custom { .. }) {
            std::ptr::write_bytes(buf.ptr.cast::<u8>(), 0, ring);
        }
        for i in 0..ncqe as usize {
            let at = i * cqe_sz + if cqe_sz == 128 { 64 } else { 0 } + OP_OWN;
            *buf.ptr.cast::<u8>().add(at) = OP_OWN_INVALID;
        }
    }
    let Some(db) = alloc::alloc_dbrec(m, parent) else {
        alloc::free_buf(m, buf, call);
        return Err(0);
    };
    let release = |m: &mut super::Mlx5Ctx| {
        alloc::free_dbrec(m, db, call);
        alloc::free_buf(m, buf, call);
    };
    // l. 1060–1061: SET_CI and ARM start at 0.
    // SAFETY: a doorbell record has 8 writable bytes (a cache-line slot, or 8 bytes from a
    // parent domain's allocator).
    unsafe {
        db.ptr.write_volatile(0);
        db.ptr.add(1).write_volatile(0);
    }
    let mut comp = None;
    if let Some(d) = dv {
        // l. 1071–1082: compression needs max_num and an overlap with the supported
        // formats (EINVAL).
        if d.comp_mask & u64::from(MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE) != 0 {
            let fmt = u32::from(d.cqe_comp_res_format);
            if caps::CQE_COMP_MAX_NUM == 0 || fmt & MLX5DV_CQE_RES_FORMAT_HASH == 0 {
                release(m);
                return Err(libc::EINVAL);
            }
            comp = Some(fmt);
        }
        // l. 1084–1103: flags beyond CQE_PAD → EINVAL; CQE_PAD needs the 128-byte padding
        // capability (not reported) and 128-byte CQEs → EINVAL.
        if d.comp_mask & u64::from(MLX5DV_CQ_INIT_ATTR_MASK_FLAGS) != 0
            && (d.flags & !(MLX5DV_CQ_INIT_ATTR_FLAGS_RESERVED - 1) != 0
                || d.flags & MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD != 0)
        {
            release(m);
            return Err(libc::EINVAL);
        }
    }
    // The kernel (mlx5_ib_create_cq): the command names ncqe - 1 entries (l. 1121);
    // comp_vector must name a completion EQ; compression needs the 64-byte capability
    // (EOPNOTSUPP for 128-byte CQEs) and exactly one mini format it knows (HASH; CSUM is
    // not reported, several bits → EINVAL, mini_cqe_res_format_to_hw); the ring and the
    // record are pinned (EFAULT).
    let kernel = st.kernel(context, call).and_then(|()| {
        if a.comp_vector >= ctx.vctx.context.num_comp_vectors as u32 {
            return Err(libc::EINVAL);
        }
        if ncqe - 1 > caps::MAX_CQ_ENTRIES {
            return Err(libc::EINVAL);
        }
        if let Some(fmt) = comp {
            if cqe_sz != 64 {
                return Err(libc::EOPNOTSUPP);
            }
            if fmt != MLX5DV_CQE_RES_FORMAT_HASH {
                return Err(if fmt.count_ones() > 1 {
                    libc::EINVAL
                } else {
                    libc::EOPNOTSUPP
                });
            }
        }
        mapped(buf.ptr, ring)?;
        mapped(db.ptr.cast(), 8)
    });
    if let Err(e) = kernel {
        release(mctx(ctx));
        return Err(e);
    }
    if !parent.is_null() {
        // SAFETY: a registered parent domain (checked above).
        unsafe { (*parent).refs += 1 };
    }
    let handle = st.next_id();
    let cqn = st.next_id();
    // SAFETY: zeroed `ibv_cq_ex` is valid (NULL pointers, initializer mutex/cond).
    let mut pubcq: ibv_cq_ex = unsafe { std::mem::zeroed() };
    // ibv_cmd_create_cq_ex: context, handle, and the kernel's cqe = ncqe - 1 (cmd_cq.c).
    pubcq.context = context;
    pubcq.handle = handle;
    pubcq.cqe = (ncqe - 1) as c_int;
    if extended {
        pubcq.start_poll = Some(start_poll);
        pubcq.next_poll = Some(next_poll);
        pubcq.end_poll = Some(end_poll);
    }
    let c = Box::into_raw(Box::new(Cq {
        cq: pubcq,
        ncqe,
        cqe_sz: cqe_sz as u32,
        buf,
        dbrec: db,
        cqn,
        comp: comp.map(|_| caps::CQE_COMP_MAX_NUM),
        users: 0,
        dv_owned: false,
        parent,
    }));
    st.register(c as usize, Kind::Cq, context as usize);
    Ok(c)
}

/// `verbs_init_cq` (v44 libibverbs/device.c:160–178): channel (its count rises) and
/// `cq_context`.
fn init_cq(c: &mut Cq, channel: *mut ibv_comp_channel, cq_context: *mut c_void) {
    c.cq.channel = channel;
    c.cq.cq_context = cq_context;
    if !channel.is_null() {
        // SAFETY: a channel from ibv_create_comp_channel.
        unsafe { (*channel).refcnt += 1 };
    }
}

/// `mlx5_create_cq` (v44 verbs.c:1159–1175) behind the exported `ibv_create_cq`:
/// `cqe <= 0` → EINVAL, then `create_cq` with the standard completion fields.
pub fn create_cq(
    st: &mut State,
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, c_int> {
    if cqe <= 0 {
        return Err(libc::EINVAL);
    }
    let a = ibv_cq_init_attr_ex {
        cqe: cqe as u32,
        channel,
        comp_vector: comp_vector as u32,
        wc_flags: u64::from(IBV_WC_STANDARD_FLAGS),
        ..Default::default()
    };
    let c = create(st, context, &a, false, None, "ibv_create_cq")?;
    // SAFETY: just created.
    init_cq(unsafe { &mut *c }, channel, cq_context);
    Ok(c.cast())
}

/// `vctx->create_cq_ex` = libibverbs' `__lib_ibv_create_cq_ex` (v44 libibverbs/device.c:
/// 180–198: `wc_flags` ⊄ `IBV_CREATE_CQ_SUP_WC_FLAGS` → EOPNOTSUPP, then the provider,
/// then `verbs_init_cq`) over `mlx5_create_cq_ex` (verbs.c:1177–1181).
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_cq_ex_slot(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    const CALL: &str = "ibv_create_cq_ex";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &*non_null(attr, CALL, "cq_init_attr_ex") };
        if a.wc_flags & !u64::from(IBV_CREATE_CQ_SUP_WC_FLAGS) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let c = create(st, context, a, true, None, CALL)?;
        // SAFETY: just created.
        init_cq(unsafe { &mut *c }, a.channel, a.cq_context);
        Ok(c.cast())
    })
}

export!("MLX5_1.1" fn mlx5dv_create_cq(context: *mut ibv_context, cq_attr: *mut ibv_cq_init_attr_ex, mlx5_cq_attr: *mut mlx5dv_cq_init_attr) -> *mut ibv_cq_ex {
    const CALL: &str = "mlx5dv_create_cq";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        // v44 verbs.c:1198–1210: no mlx5 dv ops → EOPNOTSUPP.
        if !matches!(ctx_of(st, context, CALL).family, Family::Mlx5 { .. }) {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: the caller passes its init attrs (the vendor one may be NULL).
        let a = unsafe { &*non_null(cq_attr, CALL, "cq_attr") };
        // SAFETY: as above.
        let dv = unsafe { mlx5_cq_attr.as_ref() };
        // _mlx5dv_create_cq (l. 1183–1196): create_cq, then verbs_init_cq.
        let c = create(st, context, a, true, dv, CALL)?;
        // SAFETY: just created.
        init_cq(unsafe { &mut *c }, a.channel, a.cq_context);
        Ok(c.cast())
    })
});

/// `mlx5_destroy_cq` (v44 verbs.c:1280–1297) behind the exported `ibv_destroy_cq`: the
/// kernel first (EBUSY while a QP or WQ uses it, `ib_destroy_cq_user`), then the doorbell
/// record, then the ring; libibverbs drops the channel's count on success (verbs.c:
/// 567–585).
pub fn destroy_cq(st: &mut State, cq: *mut ibv_cq) -> Result<c_int, c_int> {
    const CALL: &str = "ibv_destroy_cq";
    let c = obj(st, cq.cast::<Cq>(), &[Kind::Cq], CALL);
    let ctx: &mut Ctx = ctx_of(st, c.cq.context, CALL);
    // A disassociated context: the kernel destroyed the CQ already and lets the command
    // through (State::disassociated); libmlx5 frees its part.
    if !st.disassociated(c.cq.context) {
        if c.users > 0 {
            return Err(libc::EBUSY);
        }
        st.kernel(c.cq.context, CALL)?;
    }
    let m = mctx(ctx);
    alloc::free_dbrec(m, c.dbrec, CALL);
    alloc::free_buf(m, c.buf, CALL);
    if !c.parent.is_null() {
        // SAFETY: the parent domain cannot go while the CQ counts on it (EBUSY).
        unsafe { (*c.parent).refs -= 1 };
    }
    if !c.cq.channel.is_null() {
        // SAFETY: the channel outlives its CQs (destroy_comp_channel refuses otherwise).
        unsafe { (*c.cq.channel).refcnt -= 1 };
    }
    st.unregister(cq as usize);
    // SAFETY: unregistered above; freed once.
    drop(unsafe { Box::from_raw(c as *mut Cq) });
    Ok(0)
}

/// `mlx5dv_get_cq` (v44 mlx5.c:1034–1051): number, `cqe + 1` entries, entry size, ring,
/// record, the context's CQ UAR; the CQ becomes DV-owned.
pub fn init_obj(st: &mut State, cq: *mut ibv_cq, out: *mut mlx5dv_cq) {
    let c = obj(st, cq.cast::<Cq>(), &[Kind::Cq], "mlx5dv_init_obj(cq)");
    let ctx = ctx_of(st, c.cq.context, "mlx5dv_init_obj");
    let uar = mctx(ctx).cq_uar();
    c.dv_owned = true;
    // SAFETY: the caller's output struct.
    unsafe {
        *out = mlx5dv_cq {
            buf: c.buf.ptr,
            dbrec: c.dbrec.ptr,
            cqe_cnt: (c.cq.cqe + 1) as u32,
            cqe_size: c.cqe_sz,
            cq_uar: uar,
            cqn: c.cqn,
            comp_mask: 0,
        }
    };
}
