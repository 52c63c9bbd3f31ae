//! Completion queues: `ibv_create_cq` through the provider's allocator hooks, and their
//! destruction.

use super::*;

/// `mana_create_cq` (v44 mana.c:192–255; main cq.c:124–193) behind the exported
/// `ibv_create_cq`.
pub fn create_cq(
    st: &mut State,
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut ibv_cq, c_int> {
    let ctx = ctx_of(st, context, "ibv_create_cq");
    let main = st.cfg.profile == Profile::Main;
    let cqe_u = u32::try_from(cqe).unwrap_or(0);
    // v44 mana.c:203: cqe > 256 → EINVAL (main: the kernel checks max_qp_wr).
    if !main && cqe_u > MAX_WR {
        return Err(libc::EINVAL);
    }
    // v44 mana.c:210: allocators unset → EINVAL (main: the provider maps its own).
    let internal = !allocators_set(ctx);
    if internal && !main {
        return Err(libc::EINVAL);
    }
    // v44 mana.c:225–227: size = align(roundup_pow_of_two(cqe * 64), 4096)
    // (cqe = 0 is undefined there; the fake gives one page).
    let size = ((cqe_u as usize * CQE_SIZE).max(1).next_power_of_two()).div_ceil(PAGE) * PAGE;
    let buf = if internal {
        // SAFETY: anonymous zeroed mapping, checked below.
        let m = unsafe {
            libc::mmap(
                null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        m
    } else {
        user_alloc(ctx, size as u64)? // v44 mana.c:229–233: NULL → ENOMEM
    };
    let release = |ctx: &Ctx| {
        if internal {
            // SAFETY: mapped above with `size`.
            unsafe { libc::munmap(buf, size) };
        } else {
            user_free(ctx, buf);
        }
    };
    // The uverbs core, before the driver (uverbs_cmd.c `create_cq`, uverbs_std_types_cq.c
    // `UVERBS_METHOD_CQ_CREATE`): comp_vector (a u32 on the wire, ibv_cmd_create_cq) ≥
    // the device's num_comp_vectors (1 for mana_ib, `mana_ib_probe`) → EINVAL. Then the
    // kernel (mana_ib_create_cq): cqe ≤ max_qp_wr, then pins cqe * 64 bytes from a
    // page-aligned start.
    let vectors = ctx.vctx.context.num_comp_vectors as u32;
    let k = st.kernel(context, "ibv_create_cq").and_then(|()| {
        if comp_vector as u32 >= vectors {
            return Err(libc::EINVAL);
        }
        if cqe_u == 0 || cqe_u > KERNEL_MAX_QP_WR {
            return Err(libc::EINVAL);
        }
        kernel_pin(buf, cqe_u as usize * CQE_SIZE)
    });
    if let Err(e) = k {
        release(ctx);
        return Err(e);
    }
    if !internal && !zeroed(buf, size) {
        eprintln!(
                "fake-rdma: ibv_create_cq: warning: the allocator returned CQ memory that is not zeroed; \
                 the NIC would read stale entries as completions"
            );
    }
    let cqid = if main { st.next_id() } else { 0 };
    let handle = st.next_id();
    // SAFETY: zeroed `ibv_cq` is valid (NULL pointers, initializer mutex/cond).
    let mut pubcq: ibv_cq = unsafe { std::mem::zeroed() };
    // verbs_init_cq (v44 device.c:160–178) and ibv_cmd_create_cq (cmd_cq.c:49, 89–90).
    pubcq.context = context;
    pubcq.channel = channel;
    pubcq.cq_context = cq_context;
    pubcq.handle = handle;
    pubcq.cqe = cqe;
    if !channel.is_null() {
        // SAFETY: a channel from ibv_create_comp_channel.
        unsafe { (*channel).refcnt += 1 };
    }
    let c = Box::into_raw(Box::new(Cq {
        cq: pubcq,
        cqe: cqe_u,
        buf,
        buf_size: size,
        cqid,
        users: 0,
        installed: false,
        internal,
    }));
    st.register(c as usize, Kind::Cq, context as usize);
    Ok(c.cast::<ibv_cq>())
}

pub(super) fn zeroed(buf: *mut c_void, len: usize) -> bool {
    // SAFETY: the allocator handed out `len` bytes at `buf` (checked mapped by kernel_pin
    // for the part the NIC reads; the rest belongs to the same allocation).
    unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
        .iter()
        .all(|&b| b == 0)
}

/// `mana_destroy_cq` (v44 mana.c:257–284) behind the exported `ibv_destroy_cq`.
pub fn destroy_cq(st: &mut State, cq: *mut ibv_cq) -> Result<c_int, c_int> {
    let c = obj(st, cq.cast::<Cq>(), &[Kind::Cq], "ibv_destroy_cq");
    let ctx = ctx_of(st, c.cq.context, "ibv_destroy_cq");
    // v44 mana.c:263–271: free unset → -EINVAL, before the kernel (main: no check).
    if st.cfg.profile == Profile::V44 && ctx.alloc.free.is_none() {
        return Ok(-libc::EINVAL);
    }
    // A disassociated context: the kernel destroyed the CQ already and lets the command
    // through (State::disassociated); only the user-space part is left.
    if !st.disassociated(c.cq.context) {
        // ib_destroy_cq_user: EBUSY while a QP or WQ uses it.
        if c.users > 0 {
            return Err(libc::EBUSY);
        }
        st.kernel(c.cq.context, "ibv_destroy_cq")?;
    }
    if c.internal {
        // SAFETY: mapped by ibv_create_cq with `buf_size`.
        unsafe { libc::munmap(c.buf, c.buf_size) };
    } else {
        user_free(ctx, c.buf);
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

// ---- WQs and indirection tables ------------------------------------------------------------
