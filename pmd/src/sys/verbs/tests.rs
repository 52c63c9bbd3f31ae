//! The header's inlines against `rdma-sys`'s ports, on a context laid out the way libibverbs
//! lays one out: a `struct verbs_context` whose `context.abi_compat` is `UINTPTR_MAX`
//! (`verbs_init_context` stores `__VERBS_ABI_IS_EXTENDED` there), `sz` its full size, and op
//! slots that point at recorders here. Each op counts its calls in the fake and returns an
//! object of the fake, so a test sees whether the call reached the provider's op and whether
//! what came back is what the op returned.
//!
//! The legacy fallback of `ibv_query_device_ex` calls the exported `ibv_query_device`, which in
//! libibverbs reads private state no fake has; this test binary defines `ibv_query_device`
//! itself (the executable's definition wins over libibverbs'), answers for fakes, and hands
//! every other context to libibverbs' own.

use super::*;
use core::ffi::{c_int, c_void};
use core::mem::{offset_of, size_of};
use core::ptr::{self, addr_of_mut};
use rdma_sys::{
    ibv_context, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_device_attr, ibv_device_attr_ex, ibv_flow,
    ibv_flow_attr, ibv_parent_domain_init_attr, ibv_pd, ibv_port_attr, ibv_port_state, ibv_qp,
    ibv_qp_init_attr_ex, ibv_qp_init_attr_mask, ibv_query_device_ex_input, ibv_rwq_ind_table,
    ibv_rwq_ind_table_init_attr, ibv_wq, ibv_wq_attr, ibv_wq_init_attr, verbs_context,
};
use std::sync::Mutex;

const EOPNOTSUPP: i32 = libc::EOPNOTSUPP;
/// What the fake `query_device_ex` op writes into `raw_packet_caps`.
const OP_RAW_PACKET_CAPS: u32 = 0x5eed_0001;
/// What the fake legacy `ibv_query_device` writes into `max_qp_wr`.
const LEGACY_MAX_QP_WR: c_int = 256;
/// The byte every attribute struct is filled with before a query, to see what was written.
const UNWRITTEN: u8 = 0xaa;

/// The calls a fake records, one counter each.
#[derive(Clone, Copy, Debug)]
enum Op {
    QueryPort,
    QueryDeviceEx,
    /// The exported `ibv_query_device` (the legacy fallback), not an op slot.
    LegacyQueryDevice,
    AllocParentDomain,
    CreateCqEx,
    CreateWq,
    ModifyWq,
    DestroyWq,
    CreateRwqIndTable,
    DestroyRwqIndTable,
    CreateQpEx,
    CreateFlow,
    DestroyFlow,
}
const OP_COUNT: usize = Op::DestroyFlow as usize + 1;

/// bindgen's plain C structs: integers, raw pointers, `Option<fn>`, opaque byte arrays.
trait CStruct {}
macro_rules! c_structs { ($($t:ty),* $(,)?) => { $(impl CStruct for $t {})* }; }
c_structs!(
    FakeContext,
    ibv_cq_init_attr_ex,
    ibv_device_attr_ex,
    ibv_flow_attr,
    ibv_parent_domain_init_attr,
    ibv_port_attr,
    ibv_qp_init_attr_ex,
    ibv_rwq_ind_table_init_attr,
    ibv_wq_attr,
    ibv_wq_init_attr,
);

fn zeroed<T: CStruct>() -> T {
    // SAFETY: `CStruct` is implemented only for C structs made of integers, raw pointers,
    // `Option` of function pointers and opaque byte arrays (pthread types), for all of which
    // the all-zero bit pattern is a valid value (0, NULL, `None`).
    unsafe { core::mem::zeroed() }
}

/// A libibverbs context as a provider allocates one: its `verbs_context` first (like
/// `struct mana_context { struct verbs_context ibv_ctx; … }`), then the provider's own data,
/// here the call counters and the objects the ops hand out.
#[repr(C)]
struct FakeContext {
    vctx: verbs_context,
    calls: [u32; OP_COUNT],
    /// The size argument of the last `query_device_ex` / `query_port` op call.
    last_len: usize,
    pd: ibv_pd,
    cq: ibv_cq_ex,
    wq: ibv_wq,
    ind_tbl: ibv_rwq_ind_table,
    qp: ibv_qp,
    flow: ibv_flow,
}

/// Addresses of the `ibv_context` of every live fake, for the `ibv_query_device` stand-in.
static FAKES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

#[derive(Clone, Copy, PartialEq)]
enum Abi {
    /// `abi_compat = __VERBS_ABI_IS_EXTENDED`, as `verbs_init_context` stores it.
    Extended,
    /// `abi_compat = NULL`: a context without the extended op table.
    Legacy,
}

/// Owns one heap-allocated [`FakeContext`]; all access goes through the raw pointer, since
/// the C side holds pointers into it too.
struct Fake(*mut FakeContext);

impl Fake {
    fn new(abi: Abi) -> Fake {
        let raw = Box::into_raw(Box::new(zeroed::<FakeContext>()));
        // SAFETY: `raw` is the unique pointer to the fake just allocated; the reference lives
        // only for this block, before any pointer into the fake is handed out.
        unsafe {
            let ctx = addr_of_mut!((*raw).vctx.context);
            let f = &mut *raw;
            let v = &mut f.vctx;
            v.sz = size_of::<verbs_context>();
            v.context.abi_compat = match abi {
                Abi::Extended => usize::MAX as *mut c_void,
                Abi::Legacy => ptr::null_mut(),
            };
            v.context.async_fd = -1;
            v.query_port = Some(op_query_port);
            v.query_device_ex = Some(op_query_device_ex);
            v.alloc_parent_domain = Some(op_alloc_parent_domain);
            v.create_cq_ex = Some(op_create_cq_ex);
            v.create_wq = Some(op_create_wq);
            v.modify_wq = Some(op_modify_wq);
            v.destroy_wq = Some(op_destroy_wq);
            v.create_rwq_ind_table = Some(op_create_rwq_ind_table);
            v.destroy_rwq_ind_table = Some(op_destroy_rwq_ind_table);
            v.create_qp_ex = Some(op_create_qp_ex);
            v.ibv_create_flow = Some(op_create_flow);
            v.ibv_destroy_flow = Some(op_destroy_flow);
            f.wq.context = ctx;
            f.ind_tbl.context = ctx;
            f.qp.context = ctx;
            f.flow.context = ctx;
        }
        let fake = Fake(raw);
        FAKES.lock().unwrap().push(fake.ctx() as usize);
        fake
    }

    /// The `ibv_context` an application would hold.
    fn ctx(&self) -> *mut ibv_context {
        // SAFETY: `self.0` is live until drop; `addr_of_mut!` makes no reference.
        unsafe { addr_of_mut!((*self.0).vctx.context) }
    }

    fn calls(&self, op: Op) -> u32 {
        // SAFETY: live fake; the ops run on this thread and have returned.
        unsafe { (*self.0).calls[op as usize] }
    }

    /// Calls of every op slot (the legacy fallback is not one).
    fn op_calls(&self) -> u32 {
        // SAFETY: as in `calls`.
        let calls = unsafe { (*self.0).calls };
        calls.iter().sum::<u32>() - calls[Op::LegacyQueryDevice as usize]
    }

    fn last_len(&self) -> usize {
        // SAFETY: as in `calls`.
        unsafe { (*self.0).last_len }
    }

    fn set_sz(&self, sz: usize) {
        // SAFETY: live fake, no op running.
        unsafe { (*self.0).vctx.sz = sz }
    }
}

macro_rules! object {
    ($name:ident, $field:ident, $t:ty) => {
        impl Fake {
            fn $name(&self) -> *mut $t {
                // SAFETY: `self.0` is live until drop; `addr_of_mut!` makes no reference.
                unsafe { addr_of_mut!((*self.0).$field) }
            }
        }
    };
}
object!(pd, pd, ibv_pd);
object!(cq, cq, ibv_cq_ex);
object!(wq, wq, ibv_wq);
object!(ind_tbl, ind_tbl, ibv_rwq_ind_table);
object!(qp, qp, ibv_qp);
object!(flow, flow, ibv_flow);

impl Drop for Fake {
    fn drop(&mut self) {
        let ctx = self.ctx() as usize;
        FAKES.lock().unwrap().retain(|&c| c != ctx);
        // SAFETY: `self.0` came from `Box::into_raw` in `new` and is freed once, here; it is
        // no longer registered, and no call into it is running.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// The fake that embeds `ctx`, found the way a provider finds its context (`container_of`),
/// with the call to `op` counted.
///
/// # Safety
///
/// `ctx` must be the context of a live [`Fake`].
unsafe fn record(ctx: *mut ibv_context, op: Op) -> *mut FakeContext {
    // SAFETY: per the contract, `ctx` is `vctx.context` of a `FakeContext`, whose first field
    // is `vctx` (`repr(C)`), so stepping back by the offset of `context` in `verbs_context`
    // stays inside that allocation and lands on the `FakeContext`.
    let fake = unsafe { ctx.byte_sub(offset_of!(verbs_context, context)) }.cast::<FakeContext>();
    // SAFETY: `fake` is live (contract); nothing else accesses it during the op call.
    unsafe { (*fake).calls[op as usize] += 1 };
    fake
}

unsafe extern "C" fn op_query_port(
    ctx: *mut ibv_context,
    _port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    // SAFETY: only installed in fakes, so `ctx` is a fake's; `attr` is the caller's struct.
    unsafe {
        let f = record(ctx, Op::QueryPort);
        (*f).last_len = attr_len;
        (*attr).state = ibv_port_state::IBV_PORT_ACTIVE;
    }
    0
}

unsafe extern "C" fn op_query_device_ex(
    ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: only installed in fakes, so `ctx` is a fake's; `attr` is the caller's struct.
    unsafe {
        let f = record(ctx, Op::QueryDeviceEx);
        (*f).last_len = attr_size;
        (*attr).raw_packet_caps = OP_RAW_PACKET_CAPS;
    }
    0
}

unsafe extern "C" fn op_alloc_parent_domain(
    ctx: *mut ibv_context,
    _attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    // SAFETY: only installed in fakes, so `ctx` is a fake's.
    unsafe { addr_of_mut!((*record(ctx, Op::AllocParentDomain)).pd) }
}

unsafe extern "C" fn op_create_cq_ex(
    ctx: *mut ibv_context,
    _attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: only installed in fakes, so `ctx` is a fake's.
    unsafe { addr_of_mut!((*record(ctx, Op::CreateCqEx)).cq) }
}

unsafe extern "C" fn op_create_wq(
    ctx: *mut ibv_context,
    _attr: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    // SAFETY: only installed in fakes, so `ctx` is a fake's.
    unsafe { addr_of_mut!((*record(ctx, Op::CreateWq)).wq) }
}

unsafe extern "C" fn op_modify_wq(wq: *mut ibv_wq, _attr: *mut ibv_wq_attr) -> c_int {
    // SAFETY: reached only through a fake's table, with a WQ whose context is that fake's.
    unsafe { record((*wq).context, Op::ModifyWq) };
    0
}

unsafe extern "C" fn op_destroy_wq(wq: *mut ibv_wq) -> c_int {
    // SAFETY: as in `op_modify_wq`.
    unsafe { record((*wq).context, Op::DestroyWq) };
    0
}

unsafe extern "C" fn op_create_rwq_ind_table(
    ctx: *mut ibv_context,
    _attr: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    // SAFETY: only installed in fakes, so `ctx` is a fake's.
    unsafe { addr_of_mut!((*record(ctx, Op::CreateRwqIndTable)).ind_tbl) }
}

unsafe extern "C" fn op_destroy_rwq_ind_table(tbl: *mut ibv_rwq_ind_table) -> c_int {
    // SAFETY: reached only through a fake's table, with a table whose context is that fake's.
    unsafe { record((*tbl).context, Op::DestroyRwqIndTable) };
    0
}

unsafe extern "C" fn op_create_qp_ex(
    ctx: *mut ibv_context,
    _attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: only installed in fakes, so `ctx` is a fake's.
    unsafe { addr_of_mut!((*record(ctx, Op::CreateQpEx)).qp) }
}

unsafe extern "C" fn op_create_flow(qp: *mut ibv_qp, _attr: *mut ibv_flow_attr) -> *mut ibv_flow {
    // SAFETY: reached only through a fake's table, with a QP whose context is that fake's.
    unsafe { addr_of_mut!((*record((*qp).context, Op::CreateFlow)).flow) }
}

unsafe extern "C" fn op_destroy_flow(flow: *mut ibv_flow) -> c_int {
    // SAFETY: reached only through a fake's table, with a flow whose context is that fake's.
    unsafe { record((*flow).context, Op::DestroyFlow) };
    0
}

/// Stands in for libibverbs' exported `ibv_query_device` in this test binary (the legacy
/// fallback of `ibv_query_device_ex`): for a fake it counts the call and fills `max_qp_wr`;
/// any other context goes to libibverbs' own definition.
#[no_mangle]
unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    let is_fake = FAKES.lock().unwrap().contains(&(ctx as usize));
    if is_fake {
        // SAFETY: `ctx` is registered, so it is a live fake's; `attr` is the caller's struct.
        unsafe {
            record(ctx, Op::LegacyQueryDevice);
            (*attr).max_qp_wr = LEGACY_MAX_QP_WR;
        }
        return 0;
    }
    type QueryDevice = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    // SAFETY: looks up libibverbs' versioned definition with NUL-terminated names.
    let real = unsafe {
        libc::dlvsym(
            libc::RTLD_NEXT,
            c"ibv_query_device".as_ptr(),
            c"IBVERBS_1.1".as_ptr(),
        )
    };
    assert!(!real.is_null(), "libibverbs' ibv_query_device not found");
    // SAFETY: a non-NULL `ibv_query_device@IBVERBS_1.1` has this prototype (verbs.h).
    let real: QueryDevice = unsafe { core::mem::transmute::<*mut c_void, QueryDevice>(real) };
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real(ctx, attr) }
}

fn clear_errno() {
    // SAFETY: `__errno_location` returns this thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = 0 };
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// An RSS QP's mask: anything but exactly `IBV_QP_INIT_ATTR_PD` goes to the op.
fn rss_qp_attr() -> ibv_qp_init_attr_ex {
    let mut attr: ibv_qp_init_attr_ex = zeroed();
    attr.comp_mask = (ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
        | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_RX_HASH)
        .0;
    attr
}

fn unwritten_device_attr() -> ibv_device_attr_ex {
    let mut attr: ibv_device_attr_ex = zeroed();
    // SAFETY: writes exactly the bytes of `attr`; any byte pattern is a valid C struct of
    // integers (no pointers or enums are read from it).
    unsafe { ptr::write_bytes(addr_of_mut!(attr), UNWRITTEN, 1) };
    attr
}

const UNWRITTEN_U32: u32 = u32::from_ne_bytes([UNWRITTEN; 4]);

/// The attribute structs one round of calls passes (zeroed, except the RSS QP's, and the
/// device attributes, filled with a pattern that shows what nobody wrote).
struct Attrs {
    pd: ibv_parent_domain_init_attr,
    cq: ibv_cq_init_attr_ex,
    wq: ibv_wq_init_attr,
    wq_mod: ibv_wq_attr,
    tbl: ibv_rwq_ind_table_init_attr,
    qp: ibv_qp_init_attr_ex,
    flow: ibv_flow_attr,
    port: ibv_port_attr,
    dev: ibv_device_attr_ex,
}

impl Attrs {
    fn new() -> Self {
        Attrs {
            pd: zeroed(),
            cq: zeroed(),
            wq: zeroed(),
            wq_mod: zeroed(),
            tbl: zeroed(),
            qp: rss_qp_attr(),
            flow: zeroed(),
            port: zeroed(),
            dev: unwritten_device_attr(),
        }
    }
}

/// What a call of one of the `ibv_create_*` / `ibv_alloc_*` inlines left: its result and errno.
fn call<T>(f: impl FnOnce() -> T) -> (T, i32) {
    clear_errno();
    let r = f();
    (r, errno())
}

#[test]
fn rdma_sys_ports_never_reach_the_ops_of_a_libibverbs_context() {
    let fake = Fake::new(Abi::Extended);
    let ctx = fake.ctx();
    let mut a = Attrs::new();

    // SAFETY: every pointer passed is the live fake's context or one of its objects (laid out
    // like libibverbs', with valid op slots), or an initialised local attribute struct.
    unsafe {
        let pd = call(|| rdma_sys::ibv_alloc_parent_domain(ctx, &mut a.pd));
        assert_eq!(pd, (None, EOPNOTSUPP), "ibv_alloc_parent_domain");
        let wq = call(|| rdma_sys::ibv_create_wq(ctx, &mut a.wq));
        assert_eq!(wq, (None, EOPNOTSUPP), "ibv_create_wq");
        let cq = call(|| rdma_sys::ibv_create_cq_ex(ctx, &mut a.cq));
        assert_eq!(cq, (None, EOPNOTSUPP), "ibv_create_cq_ex");
        let tbl = call(|| rdma_sys::ibv_create_rwq_ind_table(ctx, &mut a.tbl));
        assert_eq!(tbl, (None, EOPNOTSUPP), "ibv_create_rwq_ind_table");
        let qp = call(|| rdma_sys::ibv_create_qp_ex(ctx, &mut a.qp));
        assert_eq!(qp, (None, EOPNOTSUPP), "ibv_create_qp_ex (RSS)");
        let flow = call(|| rdma_sys::ibv_create_flow(fake.qp(), &mut a.flow));
        assert_eq!(flow, (None, EOPNOTSUPP), "ibv_create_flow");
        let rc = rdma_sys::ibv_modify_wq(fake.wq(), &mut a.wq_mod);
        assert_eq!(rc, EOPNOTSUPP, "ibv_modify_wq");

        // Extended attributes: the op is skipped, only the legacy call fills `orig_attr`,
        // and the extension keeps whatever was in memory (rdma-sys has no memset there).
        assert_eq!(
            rdma_sys::ibv_query_device_ex(ctx, ptr::null(), &mut a.dev),
            0
        );
    }
    assert_eq!(fake.calls(Op::LegacyQueryDevice), 1);
    assert_eq!(a.dev.orig_attr.max_qp_wr, LEGACY_MAX_QP_WR);
    assert_eq!(a.dev.raw_packet_caps, UNWRITTEN_U32);

    assert_eq!(fake.op_calls(), 0, "rdma-sys reached an op");
}

#[test]
fn header_inlines_reach_the_ops_and_return_what_they_return() {
    let fake = Fake::new(Abi::Extended);
    let ctx = fake.ctx();
    let mut a = Attrs::new();
    let mut wq_owner = 0u8;
    a.wq.wq_context = addr_of_mut!(wq_owner).cast();

    // SAFETY: every pointer passed or read is the live fake's context or one of its objects
    // (laid out like libibverbs', with valid op slots), or an initialised local struct.
    unsafe {
        let pd = ibv_alloc_parent_domain(ctx, &mut a.pd);
        assert_eq!(pd, fake.pd());
        assert_eq!(fake.calls(Op::AllocParentDomain), 1);

        let cq = ibv_create_cq_ex(ctx, &mut a.cq);
        assert_eq!(cq, fake.cq());
        assert_eq!(fake.calls(Op::CreateCqEx), 1);
        assert_eq!(ibv_cq_ex_to_cq(cq), cq.cast());

        // The header finishes the new WQ itself: wq_context from the init attr, counter reset.
        (*fake.wq()).events_completed = 7;
        let wq = ibv_create_wq(ctx, &mut a.wq);
        assert_eq!(wq, fake.wq());
        assert_eq!(fake.calls(Op::CreateWq), 1);
        assert_eq!((*wq).wq_context, a.wq.wq_context);
        assert_eq!((*wq).events_completed, 0);
        assert_eq!(ibv_modify_wq(wq, &mut a.wq_mod), 0);
        assert_eq!(fake.calls(Op::ModifyWq), 1);

        let tbl = ibv_create_rwq_ind_table(ctx, &mut a.tbl);
        assert_eq!(tbl, fake.ind_tbl());
        assert_eq!(fake.calls(Op::CreateRwqIndTable), 1);

        let qp = ibv_create_qp_ex(ctx, &mut a.qp);
        assert_eq!(qp, fake.qp());
        assert_eq!(fake.calls(Op::CreateQpEx), 1);

        let flow = ibv_create_flow(qp, &mut a.flow);
        assert_eq!(flow, fake.flow());
        assert_eq!(fake.calls(Op::CreateFlow), 1);

        assert_eq!(ibv_destroy_flow(flow), 0);
        assert_eq!(ibv_destroy_rwq_ind_table(tbl), 0);
        assert_eq!(ibv_destroy_wq(wq), 0);
        assert_eq!(fake.calls(Op::DestroyFlow), 1);
        assert_eq!(fake.calls(Op::DestroyRwqIndTable), 1);
        assert_eq!(fake.calls(Op::DestroyWq), 1);

        assert_eq!(ibv_query_device_ex(ctx, ptr::null(), &mut a.dev), 0);
        assert_eq!(ibv_query_port(ctx, 1, &mut a.port), 0);
    }
    assert_eq!(fake.calls(Op::QueryDeviceEx), 1);
    assert_eq!(a.dev.raw_packet_caps, OP_RAW_PACKET_CAPS);
    assert_eq!(fake.calls(Op::LegacyQueryDevice), 0);
    assert_eq!(fake.calls(Op::QueryPort), 1);
    assert_eq!(fake.last_len(), size_of::<ibv_port_attr>());
    assert_eq!(a.port.state, ibv_port_state::IBV_PORT_ACTIVE);

    assert_eq!(fake.op_calls(), 12, "each of the 12 op slots exactly once");
}

#[test]
fn header_query_device_ex_passes_the_size_of_the_attributes() {
    let fake = Fake::new(Abi::Extended);
    let mut attr = unwritten_device_attr();
    // SAFETY: the live fake's context and an initialised local struct.
    let rc = unsafe { ibv_query_device_ex(fake.ctx(), ptr::null(), &mut attr) };
    assert_eq!(rc, 0);
    assert_eq!(fake.last_len(), size_of::<ibv_device_attr_ex>());
}

#[test]
fn header_inlines_refuse_a_context_without_the_extended_abi() {
    let fake = Fake::new(Abi::Legacy);
    let ctx = fake.ctx();
    let mut a = Attrs::new();

    // SAFETY: every pointer passed is the live fake's context or one of its objects, or an
    // initialised local attribute struct.
    unsafe {
        let pd = call(|| ibv_alloc_parent_domain(ctx, &mut a.pd));
        assert_eq!(pd, (ptr::null_mut(), EOPNOTSUPP), "ibv_alloc_parent_domain");
        let wq = call(|| ibv_create_wq(ctx, &mut a.wq));
        assert_eq!(wq, (ptr::null_mut(), EOPNOTSUPP), "ibv_create_wq");
        let cq = call(|| ibv_create_cq_ex(ctx, &mut a.cq));
        assert_eq!(cq, (ptr::null_mut(), EOPNOTSUPP), "ibv_create_cq_ex");
        let tbl = call(|| ibv_create_rwq_ind_table(ctx, &mut a.tbl));
        assert_eq!(
            tbl,
            (ptr::null_mut(), EOPNOTSUPP),
            "ibv_create_rwq_ind_table"
        );
        let qp = call(|| ibv_create_qp_ex(ctx, &mut a.qp));
        assert_eq!(qp, (ptr::null_mut(), EOPNOTSUPP), "ibv_create_qp_ex (RSS)");
        let flow = call(|| ibv_create_flow(fake.qp(), &mut a.flow));
        assert_eq!(flow, (ptr::null_mut(), EOPNOTSUPP), "ibv_create_flow");
        assert_eq!(ibv_modify_wq(fake.wq(), &mut a.wq_mod), EOPNOTSUPP);
        assert_eq!(ibv_destroy_wq(fake.wq()), EOPNOTSUPP);
        assert_eq!(ibv_destroy_rwq_ind_table(fake.ind_tbl()), EOPNOTSUPP);
        assert_eq!(ibv_destroy_flow(fake.flow()), EOPNOTSUPP);

        // The legacy path of ibv_query_device_ex: zero the whole struct, then the exported
        // ibv_query_device for `orig_attr`.
        assert_eq!(ibv_query_device_ex(ctx, ptr::null(), &mut a.dev), 0);
    }
    assert_eq!(fake.calls(Op::LegacyQueryDevice), 1);
    assert_eq!(a.dev.orig_attr.max_qp_wr, LEGACY_MAX_QP_WR);
    assert_eq!(a.dev.raw_packet_caps, 0);

    assert_eq!(
        fake.op_calls(),
        0,
        "an op of a non-extended context was called"
    );
}

#[test]
fn header_inlines_see_only_the_ops_inside_sz() {
    // A table that ends just short of `alloc_parent_domain`, as one from a libibverbs older
    // than the header would: that newer slot is out of reach, the older `create_wq` is not.
    let fake = Fake::new(Abi::Extended);
    let ctx = fake.ctx();
    let pd_offset = offset_of!(verbs_context, alloc_parent_domain);
    assert!(pd_offset < offset_of!(verbs_context, create_wq));
    fake.set_sz(size_of::<verbs_context>() - pd_offset - 1);
    let mut pd_attr: ibv_parent_domain_init_attr = zeroed();
    let mut wq_attr: ibv_wq_init_attr = zeroed();

    // SAFETY: the live fake's context and initialised local attribute structs.
    let (pd, wq) = unsafe {
        let pd = call(|| ibv_alloc_parent_domain(ctx, &mut pd_attr));
        (pd, ibv_create_wq(ctx, &mut wq_attr))
    };
    assert_eq!(pd, (ptr::null_mut(), EOPNOTSUPP));
    assert_eq!(fake.calls(Op::AllocParentDomain), 0);
    assert_eq!(wq, fake.wq());
    assert_eq!(fake.calls(Op::CreateWq), 1);
}
