//! rdma-core's `providers/mana` (v44.0, or main with `FAKE_RDMA_PROFILE=main`), the
//! libibverbs command helpers it calls, and the `mana_ib` kernel checks behind them.
//!
//! Citations: `v44 FILE:LINE` is rdma-core tag v44.0 (`providers/mana/*`, `libibverbs/*`);
//! `main` is rdma-core 691953d8d502; kernel rules name the function in
//! `drivers/infiniband/hw/mana` or `drivers/infiniband/core` they copy.

mod cq;
mod qp;
mod wq;

pub use cq::*;
pub use qp::*;
pub use wq::*;

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

/// Who has configured each vPort (device index, port) in this process: the PD, its raw QPs
/// (`mana_ib_cfg_vport`: per-PD use count; the first QP configures the vPort) and the lock
/// that holds the vPort against other processes.
static VPORTS: Mutex<BTreeMap<(u32, u32), VportUse>> = Mutex::new(BTreeMap::new());

/// This process's use of a vPort.
struct VportUse {
    /// The PD that configured it.
    pd: usize,
    /// Its raw QPs.
    qps: u32,
    /// The kernel's `vport_use_count` as every process of the world sees it: an exclusive
    /// `flock` on the vPort's file under `SYSFS_PATH/fake-kernel`, released when the last
    /// raw QP goes or the process dies (as the kernel tears a dead process's QPs down).
    _held: Option<std::fs::File>,
}

/// Takes the vPort for this process, or fails as `mana_cfg_vport` does while another
/// process's PD has it configured (drivers/net/ethernet/microsoft/mana/mana_en.c,
/// `mana_cfg_vport`: `vport_use_count > 0` → `-EBUSY`, which released kernels'
/// `mana_ib_create_qp_raw` turn into `ENODEV`: `busy_errno`).
/// `None` when the tree is not writable (the real `/sys`, no world): the vPort is then
/// held against this process's other PDs only, and that is said once.
fn take_vport(st: &State, dev: &str, port: u32) -> Result<Option<std::fs::File>, c_int> {
    use std::os::fd::AsRawFd;
    let dir = st.cfg.sysfs.join("fake-kernel");
    let path = dir.join(format!("{dev}.{port}.vport"));
    let opened = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
    });
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "fake-rdma: {}: {e}: vPorts are not held against other processes",
                    path.display()
                );
            });
            return Ok(None);
        }
    };
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        let errno = st.cfg.busy_errno;
        eprintln!(
            "fake-rdma: ibv_create_qp: {dev} port {port} is configured by another process: {}",
            if errno == libc::EBUSY {
                "EBUSY"
            } else {
                "ENODEV"
            }
        );
        return Err(errno);
    }
    eprintln!("fake-rdma: flock {}: {e}", path.display());
    Err(libc::EIO)
}

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
