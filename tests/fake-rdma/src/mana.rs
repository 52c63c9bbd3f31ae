//! rdma-core's `providers/mana` (v44.0, or main with `FAKE_RDMA_PROFILE=main`), the
//! libibverbs command helpers it calls, and the `mana_ib` kernel checks behind them.
//!
//! Citations: `v44 FILE:LINE` is rdma-core tag v44.0 (`providers/mana/*`, `libibverbs/*`);
//! `main` is rdma-core 691953d8d502; kernel rules name the function in
//! `drivers/infiniband/hw/mana` or `drivers/infiniband/core` they copy.

use crate::ffi::*;
use crate::nic::{CqRing, Ring};
use crate::objects::{has_cap_net_raw, mapped, new_qp, non_null, obj, UVERBS_MAX_LOG_IND_TABLE};
use crate::pd::{real_pd, Pd};
use crate::state::{addr, call_int, call_ptr, die, Kind, Profile, State};
use crate::verbs::{ctx_of, device_name, Ctx};
use crate::world;
use serde_json::json;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::ptr::null_mut;
use std::sync::Mutex;

/// `MAX_SEND_BUFFERS_PER_QUEUE` (v44 providers/mana/mana.h:11).
const MAX_WR: u32 = 256;
/// `COMP_ENTRY_SIZE` (v44 mana.h:12).
const CQE_SIZE: usize = 64;
/// Toeplitz key length (v44 mana.h:13).
const TOEPLITZ_KEY_LEN: u8 = 40;
/// `MAX_TX_WQE_SIZE` / `MAX_RX_WQE_SIZE` (v44 mana.h:21–22).
const MAX_TX_WQE: u32 = 512;
const MAX_RX_WQE: u32 = 256;
/// `MANA_PAGE_SIZE` (v44 mana.h:28).
const PAGE: usize = 4096;
/// Kernel: `MAX_TX_WQE_SGL_ENTRIES` = (512 - 16 - 8) / 16 (mana_ib.h), and the adapter's
/// `max_qp_wr`.
const KERNEL_MAX_SEND_SGE: u32 = 30;
const KERNEL_MAX_QP_WR: u32 = 256;
/// Kernel: `MANA_INDIRECT_TABLE_DEF_SIZE` (64 entries).
const KERNEL_MAX_IND_TABLE: u32 = 64;
/// GID table length reported for a port.
pub const GID_TABLE_LEN: c_int = 16;

/// `get_wqe_size(sge) = align(16 * sge + 8 + 8, 32)` (v44 mana.h:46–51).
fn wqe_size(sge: u32) -> u64 {
    (16 * u64::from(sge) + 16).div_ceil(32) * 32
}

/// `align_hw_size(x) = next_pow2(align(x, 4096))`, where v44's `align_next_power2(0)` is 1
/// (v44 mana.h:30–44).
fn hw_size(x: u64) -> u64 {
    let a = x.div_ceil(PAGE as u64) * PAGE as u64;
    if a == 0 {
        1
    } else {
        a.next_power_of_two()
    }
}

/// A completion queue (`struct mana_cq`, v44 mana.h:89–94).
#[repr(C)]
pub struct Cq {
    cq: ibv_cq,
    /// The requested size (what `manadv_init_obj` reports as `count`).
    cqe: u32,
    buf: *mut c_void,
    buf_size: usize,
    cqid: u32,
    /// Kernel users: QPs and WQs created on it.
    users: u32,
    /// Installed in the kernel's CQ table by a QP (one queue per CQ).
    installed: bool,
    /// Main profile without allocators: memory the provider mapped itself.
    internal: bool,
}

/// A receive work queue (`struct mana_wq`, v44 mana.h:80–87).
#[repr(C)]
pub struct Wq {
    wq: ibv_wq,
    buf: *mut c_void,
    buf_size: usize,
    wqe: u32,
    sge: u32,
    wqid: u32,
    /// Kernel users: indirection tables.
    users: u32,
    pd: *mut Pd,
    cq: *mut Cq,
}

/// A receive indirection table.
#[repr(C)]
pub struct Ind {
    t: ibv_rwq_ind_table,
    wqs: Vec<*mut Wq>,
    users: u32,
}

/// A raw-packet QP: a send queue, or an RSS QP over an indirection table
/// (`struct mana_qp`, v44 mana.h:68–78).
#[repr(C)]
pub struct Qp {
    qp: ibv_qp,
    rss: Option<*mut Ind>,
    send_buf: *mut c_void,
    send_buf_size: u32,
    send_wqe_count: u32,
    sqid: u32,
    tx_vp_offset: u32,
    port: u32,
    pd: *mut Pd,
    cqs: Vec<*mut Cq>,
    device: u32,
}

/// Who has configured each vPort (device index, port): the PD and its raw QPs
/// (`mana_ib_cfg_vport`: per-PD use count; the first QP configures the vPort).
static VPORTS: Mutex<BTreeMap<(u32, u32), (usize, u32)>> = Mutex::new(BTreeMap::new());

fn allocators_set(ctx: &Ctx) -> bool {
    ctx.alloc.alloc.is_some() && ctx.alloc.free.is_some()
}

/// Calls the user's allocator (v44 mana.c:229, wq.c:75, qp.c:90).
fn user_alloc(ctx: &Ctx, size: u64) -> Result<*mut c_void, c_int> {
    let alloc = ctx.alloc.alloc.ok_or(libc::EINVAL)?;
    // SAFETY: the user registered this allocator for this context with its `data`.
    let p = unsafe { alloc(size as usize, ctx.alloc.data) };
    if p.is_null() {
        Err(libc::ENOMEM)
    } else {
        Ok(p)
    }
}

/// Gives a buffer back to the user's allocator, with its *current* `data`.
fn user_free(ctx: &Ctx, p: *mut c_void) {
    if let Some(free) = ctx.alloc.free {
        // SAFETY: `p` came from this context's allocator.
        unsafe { free(p, ctx.alloc.data) };
    }
}

/// Kernel pinning of a user queue buffer: the start must be page-aligned
/// (`mana_ib_create_zero_offset_dma_region`: EINVAL) and the range mapped (`ib_umem_get`:
/// EFAULT).
fn kernel_pin(buf: *mut c_void, len: usize) -> Result<(), c_int> {
    if buf as usize & (PAGE - 1) != 0 {
        return Err(libc::EINVAL);
    }
    mapped(buf, len)
}

/// `vendor_part_id` of a MANA function's raw-packet (Ethernet) device and of its RDMA
/// device: the GDMA device type (`GDMA_DEVICE_MANA` = 2, `GDMA_DEVICE_MANA_IB` = 3, kernel
/// include/net/mana/gdma.h), which `mana_ib_query_device` reports as `vendor_part_id`.
pub const PART_RAW: u32 = 2;
/// See [`PART_RAW`].
pub const PART_RNIC: u32 = 3;

/// The device attributes the kernel reports (`mana_ib_query_device`: `vendor_id` the PCI
/// vendor, `vendor_part_id` the GDMA device type).
pub fn device_attr(ctx: &Ctx) -> ibv_device_attr {
    ibv_device_attr {
        max_mr_size: 1 << 40,
        page_size_cap: (PAGE as u64) | (2 << 20),
        vendor_id: 0x1414,
        vendor_part_id: if ctx.device().view.rnic {
            PART_RNIC
        } else {
            PART_RAW
        },
        max_qp: 64,
        max_qp_wr: KERNEL_MAX_QP_WR as c_int,
        max_sge: KERNEL_MAX_SEND_SGE as c_int,
        max_cq: 64,
        max_cqe: KERNEL_MAX_QP_WR as c_int,
        max_mr: 1024,
        max_pd: 1024,
        phys_port_cnt: ctx.nports(),
        ..Default::default()
    }
}

// ---- queries -------------------------------------------------------------------------------

/// What `mana_query_port` → `ibv_cmd_query_port` reports for a port (v44 mana.c:60–66;
/// kernel `mana_ib_query_port`); libibverbs' part is [`crate::verbs::query_port_slot`].
pub fn port_attr() -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_4096,
        gid_tbl_len: GID_TABLE_LEN,
        max_msg_sz: 0x4000_0000,
        pkey_tbl_len: 1,
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// `mana_query_device_ex` → `ibv_cmd_query_device_any` (v44 mana.c:41–58,
/// libibverbs/cmd_device.c:521–600): EINVAL for an input comp_mask or a size below
/// `ibv_device_attr`; the attr is zeroed, then filled.
///
/// # Safety
/// `attr` points to `attr_size` writable bytes.
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    call_int(
        "ibv_query_device_ex",
        json!({"context": addr(context), "attr_size": attr_size}),
        |st| {
            let ctx = ctx_of(st, context, "ibv_query_device_ex");
            // SAFETY: `input` is NULL or the caller's input struct.
            if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
                return Err(libc::EINVAL);
            }
            if attr_size < size_of::<ibv_device_attr>() {
                return Err(libc::EINVAL);
            }
            non_null(attr, "ibv_query_device_ex", "attr");
            st.kernel(context, "ibv_query_device_ex")?;
            let mut ex = ibv_device_attr_ex {
                orig_attr: device_attr(ctx),
                max_wq_type_rq: 64,
                phys_port_cnt_ex: u32::from(ctx.nports()),
                ..Default::default()
            };
            // Only the raw-packet device has raw-packet capabilities (`mana_ib_query_device`:
            // `raw_packet_caps = IB_RAW_PACKET_CAP_IP_CSUM` unless `mana_ib_is_rnic`).
            if !ctx.device().view.rnic {
                ex.raw_packet_caps = IBV_RAW_PACKET_CAP_IP_CSUM;
            }
            ex.rss_caps.supported_qpts = 1 << IBV_QPT_RAW_PACKET;
            ex.rss_caps.max_rwq_indirection_tables = 64;
            ex.rss_caps.max_rwq_indirection_table_size = KERNEL_MAX_IND_TABLE;
            ex.rss_caps.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ as u8;
            ex.rss_caps.rx_hash_fields_mask = u64::from(
                IBV_RX_HASH_SRC_IPV4
                    | IBV_RX_HASH_DST_IPV4
                    | IBV_RX_HASH_SRC_IPV6
                    | IBV_RX_HASH_DST_IPV6
                    | IBV_RX_HASH_SRC_PORT_TCP
                    | IBV_RX_HASH_DST_PORT_TCP
                    | IBV_RX_HASH_SRC_PORT_UDP
                    | IBV_RX_HASH_DST_PORT_UDP,
            );
            let n = attr_size.min(size_of::<ibv_device_attr_ex>());
            // SAFETY: `attr` has `attr_size` writable bytes; `n <= attr_size`.
            unsafe {
                std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
                std::ptr::copy_nonoverlapping(
                    (&ex as *const ibv_device_attr_ex).cast::<u8>(),
                    attr.cast::<u8>(),
                    n,
                );
            }
            Ok(0)
        },
    )
}

// ---- PDs and MRs ---------------------------------------------------------------------------

/// `mana_alloc_parent_domain` (v44 mana.c:91–125): NULL pd → EINVAL
/// (`ibv_check_alloc_parent_domain`, driver.h:727–737); a comp_mask other than
/// `PD_CONTEXT` → EINVAL (main: EOPNOTSUPP). User space only.
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    call_ptr(
        "ibv_alloc_parent_domain",
        json!({"context": addr(context)}),
        |st| {
            let _ = ctx_of(st, context, "ibv_alloc_parent_domain");
            // SAFETY: the caller passes its init attr.
            let a = unsafe { &*non_null(attr, "ibv_alloc_parent_domain", "attr") };
            if a.pd.is_null() {
                return Err(libc::EINVAL);
            }
            if a.comp_mask & !IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
                return Err(match st.cfg.profile {
                    Profile::V44 => libc::EINVAL,
                    Profile::Main => libc::EOPNOTSUPP,
                });
            }
            // User space only (calloc): nothing for the kernel to refuse, even on a
            // disassociated context.
            st.fault("ibv_alloc_parent_domain")?;
            let of = obj(
                st,
                a.pd.cast::<Pd>(),
                &[Kind::Pd],
                "ibv_alloc_parent_domain",
            );
            let pd_context = if a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
                a.pd_context
            } else {
                null_mut()
            };
            // ibv_initialize_parent_domain copies context and handle (driver.h:744–749).
            let p = Box::into_raw(Box::new(Pd::new(of.pd, of, pd_context)));
            st.register(p as usize, Kind::ParentDomain, context as usize);
            Ok(p.cast::<ibv_pd>())
        },
    )
}

// ---- CQs -----------------------------------------------------------------------------------

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

fn zeroed(buf: *mut c_void, len: usize) -> bool {
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

/// `mana_create_qp` → `mana_create_qp_raw` (v44 qp.c:29–140), `ibv_cmd_create_qp`
/// (cmd_qp.c:373–399) and `mana_ib_create_qp_raw` in the kernel, behind the exported
/// `ibv_create_qp`.
pub fn create_qp(
    st: &mut State,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, c_int> {
    const CALL: &str = "ibv_create_qp";
    let p = obj(
        st,
        non_null(pd, CALL, "pd").cast::<Pd>(),
        &[Kind::Pd, Kind::ParentDomain],
        CALL,
    );
    let context = p.pd.context;
    let ctx = ctx_of(st, context, CALL);
    // SAFETY: the caller passes its init attr.
    let a = unsafe { &mut *non_null(attr, CALL, "qp_init_attr") };
    let v44 = st.cfg.profile == Profile::V44;
    if a.qp_type != IBV_QPT_RAW_PACKET {
        // v44 qp.c:130–137 (main: EOPNOTSUPP, qp.c:353).
        return Err(if v44 { libc::EINVAL } else { libc::EOPNOTSUPP });
    }
    if p.of.is_null() {
        return Err(libc::EINVAL); // not a parent domain, v44 qp.c:47–52
    }
    let port = p.pd_context as usize as u32; // v44 qp.c:55
    if v44 && a.cap.max_send_wr > MAX_WR {
        return Err(libc::EINVAL); // v44 qp.c:59
    }
    if v44 && wqe_size(a.cap.max_send_sge) > u64::from(MAX_TX_WQE) {
        return Err(libc::EINVAL); // v44 qp.c:67
    }
    if !allocators_set(ctx) {
        return Err(libc::EINVAL); // v44 qp.c:75
    }
    let size = hw_size(u64::from(a.cap.max_send_wr) * wqe_size(a.cap.max_send_sge)); // l. 86–88
    let buf = user_alloc(ctx, size)?;
    let fail = |e: c_int| {
        user_free(ctx, buf);
        Err(e)
    };
    // ibv_icmd_create_qp dereferences send_cq and recv_cq (cmd_qp.c:135–143).
    let scq = obj(
        st,
        non_null(a.send_cq, CALL, "send_cq").cast::<Cq>(),
        &[Kind::Cq],
        CALL,
    );
    let rcq = obj(
        st,
        non_null(a.recv_cq, CALL, "recv_cq").cast::<Cq>(),
        &[Kind::Cq],
        CALL,
    );
    if let Err(e) = st.kernel(context, CALL) {
        return fail(e);
    }
    // Kernel, in order: CAP_NET_RAW (uverbs create_qp) → EPERM; max_send_wr > max_qp_wr,
    // max_send_sge > 30, bad port → EINVAL; vPort configuration → ENODEV; pinning.
    if !has_cap_net_raw() {
        return fail(libc::EPERM);
    }
    if a.cap.max_send_wr > KERNEL_MAX_QP_WR || a.cap.max_send_sge > KERNEL_MAX_SEND_SGE {
        return fail(libc::EINVAL);
    }
    if port == 0 || port > u32::from(ctx.nports()) {
        return fail(libc::EINVAL);
    }
    if scq.installed {
        return fail(libc::EINVAL); // mana_ib_install_cq_cb: one queue per CQ
    }
    let dev = ctx.device();
    let real = real_pd(p);
    let key = (dev.index, port);
    let (sqid, cqid);
    {
        let mut vports = VPORTS.lock().unwrap_or_else(|e| e.into_inner());
        match vports.get(&key) {
            Some(&(owner, _)) if owner != real as *mut Pd as usize => return fail(libc::ENODEV),
            Some(_) => {}
            None => {
                // mana_cfg_vport refuses (EBUSY) while the Ethernet driver uses the vPort;
                // released kernels' mana_ib_create_qp_raw turn any error into ENODEV, newer
                // ones pass EBUSY through (FAKE_RDMA_BUSY_ERRNO).
                let netdev = &dev.view.ports[port as usize - 1].netdev;
                if let Some((name, flags)) = netdev {
                    if world::netdev_up(flags) {
                        let e = st.cfg.busy_errno;
                        eprintln!(
                            "fake-rdma: {CALL}: {} port {port} is held by its netdev {name} (up): {}",
                            device_name(dev),
                            if e == libc::EBUSY { "EBUSY" } else { "ENODEV" }
                        );
                        return fail(e);
                    }
                }
            }
        }
        if let Err(e) = kernel_pin(buf, size as usize) {
            return fail(e);
        }
        sqid = st.next_id();
        cqid = st.next_id();
        // mana_ib_create_qp_raw creates the SQ and its CQ on the NIC: the device model
        // serves them from now on.
        let vp_offset = dev.view.ports[port as usize - 1].vp_offset;
        // SAFETY: `buf` is this QP's send buffer, given back to the allocator only by
        // ibv_destroy_qp after `remove_tx`; the send CQ cannot be destroyed before the QP.
        let added = unsafe {
            st.nics.add_tx(
                dev,
                port,
                context as usize,
                ctx.db_page,
                Ring {
                    buf,
                    len: size as usize,
                    id: sqid,
                },
                u16::try_from(vp_offset).unwrap_or(u16::MAX),
                CqRing {
                    ring: Ring {
                        buf: scq.buf,
                        len: scq.buf_size,
                        id: cqid,
                    },
                    count: scq.cqe,
                },
                CALL,
            )
        };
        if let Err(e) = added {
            return fail(e);
        }
        vports.entry(key).or_insert((real as *mut Pd as usize, 0)).1 += 1;
    }
    scq.cqid = cqid; // v44 qp.c:118: send_cq->cqid = resp.cqid
    scq.installed = true;
    scq.users += 1;
    rcq.users += 1;
    real.users += 1;
    let handle = st.next_id();
    let q = Box::into_raw(Box::new(Qp {
        qp: new_qp(context, pd, a.send_cq, a.recv_cq, a.qp_context, handle),
        rss: None,
        send_buf: buf,
        send_buf_size: size as u32,
        send_wqe_count: a.cap.max_send_wr, // after the cap write-back, v44 qp.c:116
        sqid,
        tx_vp_offset: dev.view.ports[port as usize - 1].vp_offset,
        port,
        pd: real,
        cqs: vec![scq as *mut Cq, rcq as *mut Cq],
        device: dev.index,
    }));
    st.register(q as usize, Kind::Qp, context as usize);
    Ok(q.cast::<ibv_qp>())
}

/// `vctx->create_qp_ex` = `mana_create_qp_ex` (v44 qp.c:175–262), the RSS QP.
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const CALL: &str = "ibv_create_qp_ex";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        let ctx = ctx_of(st, context, CALL);
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &mut *non_null(attr, CALL, "qp_init_attr_ex") };
        let v44 = st.cfg.profile == Profile::V44;
        if a.qp_type != IBV_QPT_RAW_PACKET {
            return Err(if v44 { libc::EINVAL } else { libc::EOPNOTSUPP }); // l. 252–259
        }
        // l. 192: dereferences attr->pd whatever the comp_mask.
        let p = obj(
            st,
            non_null(a.pd, CALL, "qp_init_attr_ex.pd").cast::<Pd>(),
            &[Kind::Pd, Kind::ParentDomain],
            CALL,
        );
        if p.of.is_null() {
            return Err(libc::EINVAL);
        }
        if a.rx_hash_conf.rx_hash_key_len != TOEPLITZ_KEY_LEN {
            return Err(libc::EINVAL); // l. 199–205
        }
        let port = p.pd_context as usize as u32;
        // ibv_cmd_create_qp_ex2: unknown comp_mask bits → EINVAL (cmd_qp.c:434–444);
        // ibv_icmd_create_qp: PD bit required (l. 109–112); with IND_TABLE, recv caps,
        // recv_cq and srq must be empty (l. 117–122).
        let known = IBV_QP_INIT_ATTR_PD
            | IBV_QP_INIT_ATTR_XRCD
            | IBV_QP_INIT_ATTR_CREATE_FLAGS
            | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
            | IBV_QP_INIT_ATTR_IND_TABLE
            | IBV_QP_INIT_ATTR_RX_HASH
            | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 || a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE == 0 {
            // Without a table this is a send QP through the extended call; MANA's RSS path
            // needs the table (the kernel finds no WQs).
            return Err(libc::EINVAL);
        }
        if a.cap.max_recv_wr != 0
            || a.cap.max_recv_sge != 0
            || !a.recv_cq.is_null()
            || !a.srq.is_null()
        {
            return Err(libc::EINVAL);
        }
        let t = obj(
            st,
            non_null(a.rwq_ind_tbl, CALL, "rwq_ind_tbl").cast::<Ind>(),
            &[Kind::IndTable],
            CALL,
        );
        st.kernel(context, CALL)?;
        // Kernel mana_ib_create_qp_rss: CAP_NET_RAW, Toeplitz only, table ≤ 64, port range,
        // one WQ per CQ.
        if !has_cap_net_raw() {
            return Err(libc::EPERM);
        }
        if u32::from(a.rx_hash_conf.rx_hash_function) != IBV_RX_HASH_FUNC_TOEPLITZ {
            return Err(libc::EINVAL);
        }
        if t.wqs.len() > KERNEL_MAX_IND_TABLE as usize {
            return Err(libc::EINVAL);
        }
        if port == 0 || port > u32::from(ctx.nports()) {
            return Err(libc::EINVAL);
        }
        let mut cqs: Vec<*mut Cq> = Vec::new();
        for &w in &t.wqs {
            // SAFETY: the table's WQs are live (they cannot be destroyed while it exists).
            let cq = unsafe { (*w).cq };
            // SAFETY: a WQ's CQ is live while the WQ is.
            if unsafe { (*cq).installed } || cqs.contains(&cq) {
                return Err(libc::EINVAL); // mana_ib_install_cq_cb
            }
            cqs.push(cq);
        }
        // Response entries: wq->wqid and wq->cq->cqid (v44 qp.c:236–243).
        let ids: Vec<(u32, u32)> = t.wqs.iter().map(|_| (st.next_id(), st.next_id())).collect();
        // mana_ib_create_qp_rss creates each WQ's RQ and CQ on the NIC and configures the
        // vPort's steering: the device model serves them from now on.
        // SAFETY: the table's WQs and their CQs are live and cannot be destroyed while this
        // QP exists; ibv_destroy_qp calls `remove_rss` first.
        let rqs: Vec<(Ring, CqRing)> = t
            .wqs
            .iter()
            .zip(&ids)
            .map(|(&w, &(wqid, cqid))| unsafe {
                let cq = &*(*w).cq;
                (
                    Ring {
                        buf: (*w).buf,
                        len: (*w).buf_size,
                        id: wqid,
                    },
                    CqRing {
                        ring: Ring {
                            buf: cq.buf,
                            len: cq.buf_size,
                            id: cqid,
                        },
                        count: cq.cqe,
                    },
                )
            })
            .collect();
        let key_ptr = non_null(a.rx_hash_conf.rx_hash_key, CALL, "rx_hash_key");
        let mut rss_key = [0u8; TOEPLITZ_KEY_LEN as usize];
        // SAFETY: the caller's key has rx_hash_key_len = 40 bytes (checked above).
        unsafe { std::ptr::copy_nonoverlapping(key_ptr, rss_key.as_mut_ptr(), rss_key.len()) };
        // SAFETY: as above: the buffers outlive the QP, whose destruction removes them.
        unsafe {
            st.nics.add_rss(
                ctx.device(),
                port,
                context as usize,
                ctx.db_page,
                &rqs,
                rss_key,
                CALL,
            )
        }?;
        for (&w, &(wqid, cqid)) in t.wqs.iter().zip(&ids) {
            // SAFETY: as above.
            unsafe {
                (*w).wqid = wqid;
                (*(*w).cq).cqid = cqid;
                (*(*w).cq).installed = true;
            }
        }
        t.users += 1;
        let real = real_pd(p);
        real.users += 1;
        let handle = st.next_id();
        let dev = ctx.device().index;
        let q = Box::into_raw(Box::new(Qp {
            qp: new_qp(context, a.pd, a.send_cq, a.recv_cq, a.qp_context, handle),
            rss: Some(t),
            send_buf: null_mut(),
            send_buf_size: 0,
            send_wqe_count: 0,
            sqid: 0,
            tx_vp_offset: 0,
            port,
            pd: real,
            cqs,
            device: dev,
        }));
        st.register(q as usize, Kind::Qp, context as usize);
        Ok(q.cast::<ibv_qp>())
    })
}

/// `mana_modify_qp`: always EOPNOTSUPP, as the return value (v44 qp.c:142–145); libibverbs
/// stores qp->state only on success (verbs.c:708–723).
pub fn modify_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    let _ = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "ibv_modify_qp");
    Err(libc::EOPNOTSUPP)
}

/// MANA v44 has no query_qp op: the libibverbs dummy answers EOPNOTSUPP.
pub fn query_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    let _ = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "ibv_query_qp");
    Err(libc::EOPNOTSUPP)
}

/// Releases what a QP holds in the kernel (its queues on the NIC, CQ slots, table, PD,
/// vPort). The NIC lets go of the queues first, so their memory may be freed afterwards.
fn release_qp(st: &mut State, q: &mut Qp) {
    match q.rss {
        None => st.nics.remove_tx(q.device, q.port, q.sqid),
        Some(t) => {
            // SAFETY: the table and its WQs cannot be destroyed while the QP uses them.
            let ids: Vec<u32> = unsafe { (*t).wqs.iter().map(|&w| (*w).wqid).collect() };
            st.nics.remove_rss(q.device, q.port, &ids);
        }
    }
    // A send QP counts as a user of its send and receive CQs and installed only the send
    // CQ (the first); an RSS QP installed every CQ of its table's WQs, whose users they are.
    for (i, &c) in q.cqs.iter().enumerate() {
        // SAFETY: CQs cannot be destroyed while the QP or its table's WQs use them.
        unsafe {
            if q.rss.is_none() {
                (*c).users -= 1;
            }
            if q.rss.is_some() || i == 0 {
                (*c).installed = false;
            }
        }
    }
    if let Some(t) = q.rss {
        // SAFETY: the table cannot be destroyed while the QP uses it.
        unsafe { (*t).users -= 1 };
    }
    // SAFETY: the PD cannot be deallocated while the QP uses it.
    unsafe { (*q.pd).users -= 1 };
    if q.rss.is_none() {
        let mut vports = VPORTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = vports.get_mut(&(q.device, q.port)) {
            v.1 -= 1;
            if v.1 == 0 {
                vports.remove(&(q.device, q.port)); // mana_ib_uncfg_vport
            }
        }
    }
}

/// `mana_destroy_qp` (v44 qp.c:147–173) behind the exported `ibv_destroy_qp`.
pub fn destroy_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "ibv_destroy_qp");
    let ctx = ctx_of(st, q.qp.context, "ibv_destroy_qp");
    // v44 qp.c:153–161: free unset → -EINVAL before the kernel (main: no check).
    if st.cfg.profile == Profile::V44 && ctx.alloc.free.is_none() {
        return Ok(-libc::EINVAL);
    }
    // A disassociated context: the kernel released the QP already (`disassociate`).
    if !st.disassociated(q.qp.context) {
        st.kernel(q.qp.context, "ibv_destroy_qp")?;
        release_qp(st, q);
    }
    // v44 qp.c:169 (main qp.c:457–460, RAW_PACKET): the send buffer goes back, for every
    // raw QP: an RSS QP's is NULL (its `struct mana_qp` is calloc'd, qp.c:210, and
    // send_buf never set), so the user's free gets NULL. A free reset to NULL is called
    // all the same in main (no check there): a crash.
    let Some(free) = ctx.alloc.free else {
        die(
            "ibv_destroy_qp",
            "the context's free callback was reset to NULL: real libmana (main) calls it for the QP's send buffer (qp.c:459) and crashes",
        );
    };
    // SAFETY: the user's callback, with a buffer from its allocator (or NULL for an RSS
    // QP, as libmana passes it) and its current `data`.
    unsafe { free(q.send_buf, ctx.alloc.data) };
    st.unregister(qp as usize);
    // SAFETY: unregistered above; freed once.
    drop(unsafe { Box::from_raw(q as *mut Qp) });
    Ok(0)
}

/// Called for each object left on a context at `ibv_close_device`: the kernel tears it
/// down (the vPort is released), user-space memory stays with its owner.
pub fn forget(st: &mut State, a: usize) {
    match st.kind_of(a) {
        Some(Kind::Qp) => {
            // SAFETY: a registered QP.
            let q = unsafe { &mut *(a as *mut Qp) };
            release_qp(st, q);
        }
        Some(Kind::Mr) => {
            // SAFETY: a registered MR.
            let m = unsafe { &*(a as *const crate::pd::Mr) };
            crate::pd::forget_mr(st, m);
        }
        _ => {}
    }
}

/// The queue of context `ctx` that a kick handle names (`crate::kick`): for TX the send QP
/// whose `sq_id` is `id`, for RX a WQ of an RSS QP's table whose `wq_id` is `id` (the ids
/// `manadv_init_obj` reports); its vPort `(device, port)` and the engine's queue. `None`
/// if the context has no such queue on the NIC.
pub fn kick_target(
    st: &State,
    ctx: usize,
    rx: bool,
    id: u32,
) -> Option<(u32, u32, pmd::emu::thread::QueueId)> {
    use pmd::emu::thread::QueueId;
    st.objects
        .iter()
        .filter(|(_, e)| e.ctx == ctx && e.kind == Kind::Qp)
        .find_map(|(&a, _)| {
            // SAFETY: a registered QP of a MANA context is a live `Qp` box.
            let q = unsafe { &*(a as *const Qp) };
            let queue = match (rx, q.rss) {
                (false, None) => (q.sqid == id).then_some(QueueId::Sq(id)),
                (true, Some(t)) => {
                    // SAFETY: the table and its WQs cannot be destroyed while the QP uses
                    // them.
                    let has = unsafe { (*t).wqs.iter().any(|&w| (*w).wqid == id) };
                    has.then_some(QueueId::Rq(id))
                }
                _ => None,
            };
            queue.map(|queue| (q.device, q.port, queue))
        })
}

// ---- manadv --------------------------------------------------------------------------------

export!("MANA_1.0" fn manadv_set_context_attr(ibv_ctx: *mut ibv_context, type_: manadv_set_ctx_attr_type, attr: *mut c_void) -> c_int {
    call_int("manadv_set_context_attr", json!({"context": addr(ibv_ctx), "type": type_}), |st| {
        let ctx = ctx_of(st, ibv_ctx, "manadv_set_context_attr");
        // v44 manadv.c:23–41: type ≠ BUF_ALLOCATORS → EOPNOTSUPP; else a plain copy.
        if type_ != MANADV_CTX_ATTR_BUF_ALLOCATORS {
            return Err(libc::EOPNOTSUPP);
        }
        // libmana does not check the provider (to_mctx is a cast, manadv.c:26): on an mlx5
        // context the copy lands in the mlx5 context's own fields.
        if ctx.family != world::Family::Mana {
            crate::state::die(
                "manadv_set_context_attr",
                "the context is not a MANA context: real libmana would write the allocators into the mlx5 context's memory",
            );
        }
        let a = non_null(attr.cast::<manadv_ctx_allocators>(), "manadv_set_context_attr", "attr");
        // SAFETY: the caller passes a `struct manadv_ctx_allocators`.
        ctx.alloc = unsafe { *a };
        Ok(0)
    })
});

export!("MANA_1.0" fn manadv_init_obj(o: *mut manadv_obj, obj_type: u64) -> c_int {
    call_int("manadv_init_obj", json!({"obj_type": obj_type}), |st| {
        // v44 manadv.c:45–46: unknown type bits → EINVAL.
        let known = u64::from(MANADV_OBJ_QP | MANADV_OBJ_CQ | MANADV_OBJ_RWQ);
        if obj_type & !known != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes its `struct manadv_obj`.
        let o = unsafe { &mut *non_null(o, "manadv_init_obj", "obj") };
        // libmana casts whatever it is given (container_of, manadv.c:48–85): an mlx5 object
        // would be read as a MANA one.
        let objs: [(u32, *mut c_void); 3] = [
            (MANADV_OBJ_QP, o.qp.in_.cast()),
            (MANADV_OBJ_CQ, o.cq.in_.cast()),
            (MANADV_OBJ_RWQ, o.rwq.in_.cast()),
        ];
        for (bit, p) in objs {
            if obj_type & u64::from(bit) != 0
                && crate::objects::ctx_of_obj(st, p, &[Kind::Qp, Kind::Cq, Kind::Wq], "manadv_init_obj").family
                    != world::Family::Mana
            {
                crate::state::die(
                    "manadv_init_obj",
                    "the object belongs to an mlx5 context: real libmana would read an mlx5 object as a MANA one",
                );
            }
        }
        if obj_type & u64::from(MANADV_OBJ_QP) != 0 {
            let q = obj(st, o.qp.in_.cast::<Qp>(), &[Kind::Qp], "manadv_init_obj(qp)");
            let ctx = ctx_of(st, q.qp.context, "manadv_init_obj");
            let out = non_null(o.qp.out, "manadv_init_obj", "qp.out");
            // SAFETY: the caller's output struct (v44 manadv.c:48–62).
            unsafe {
                *out = manadv_qp {
                    sq_buf: q.send_buf,
                    sq_count: q.send_wqe_count,
                    sq_size: q.send_buf_size,
                    sq_id: q.sqid,
                    tx_vp_offset: q.tx_vp_offset,
                    db_page: ctx.db_page,
                }
            };
        }
        if obj_type & u64::from(MANADV_OBJ_CQ) != 0 {
            let c = obj(st, o.cq.in_.cast::<Cq>(), &[Kind::Cq], "manadv_init_obj(cq)");
            let out = non_null(o.cq.out, "manadv_init_obj", "cq.out");
            // SAFETY: the caller's output struct (v44 manadv.c:64–71).
            unsafe {
                *out = manadv_cq {
                    buf: c.buf,
                    count: c.cqe,
                    cq_id: c.cqid,
                }
            };
        }
        if obj_type & u64::from(MANADV_OBJ_RWQ) != 0 {
            let w = obj(st, o.rwq.in_.cast::<Wq>(), &[Kind::Wq], "manadv_init_obj(rwq)");
            let ctx = ctx_of(st, w.wq.context, "manadv_init_obj");
            let out = non_null(o.rwq.out, "manadv_init_obj", "rwq.out");
            // SAFETY: the caller's output struct (v44 manadv.c:73–85).
            unsafe {
                *out = manadv_rwq {
                    buf: w.buf,
                    count: w.wqe,
                    size: w.buf_size as u32,
                    wq_id: w.wqid,
                    db_page: ctx.db_page,
                }
            };
        }
        Ok(0)
    })
});
