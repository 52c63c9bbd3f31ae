//! libibverbs' part: the device list, contexts laid out as `verbs_init_context` lays them
//! out, the dummy op table, and the exported wrappers with their bookkeeping. The provider
//! behind a context is the device's: `providers/mana` ([`crate::mana`]) or `providers/mlx5`
//! ([`crate::mlx5`]); exported calls reach it as libibverbs does, through the context of
//! the object they are given (`get_ops(obj->context)`).

use crate::events;
use crate::ffi::*;
use crate::mana;
use crate::mlx5;
use crate::objects::{ctx_of_obj, non_null};
use crate::state::{addr, call_int, call_ptr, die, lock, set_errno, Kind, State};
use crate::world::{self, DeviceView, Family};
use serde_json::json;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::ptr::{null_mut, NonNull};

/// A device of the list (`struct verbs_device` starts with the `ibv_device` too).
#[repr(C)]
pub struct Device {
    /// What `ibv_get_device_list` hands out.
    pub dev: ibv_device,
    /// Kernel device index: N of its `uverbsN`, which keys its device-model engines too
    /// (the same when the device comes back from a servicing).
    pub index: u32,
    /// The ports, from sysfs.
    pub view: DeviceView,
}

/// A context, laid out as `struct mana_context` / `struct mlx5_context` begin: the
/// `verbs_context` first (its last member is the `ibv_context` callers hold), then the
/// provider's fields.
#[repr(C)]
pub struct Ctx {
    /// libibverbs' part; callers hold `&vctx.context`.
    pub vctx: verbs_context,
    /// The device it was opened on.
    pub dev: *const Device,
    /// The provider behind it (the device's family).
    pub family: Family,
    /// MANA: `manadv_set_context_attr(BUF_ALLOCATORS)`; all NULL until set.
    pub alloc: manadv_ctx_allocators,
    /// MANA: the one doorbell page of the context (rdma-core v44 providers/mana/mana.c l. 388).
    pub db_page: *mut c_void,
    /// mlx5: the provider's context state (allocators, UAR pages, doorbell-record pages).
    pub mlx5: Option<Box<mlx5::Mlx5Ctx>>,
    /// libibverbs' private block (`verbs_context.priv`).
    pub private: *mut c_void,
}

impl Ctx {
    /// Number of IB ports of the device.
    pub fn nports(&self) -> u8 {
        // SAFETY: `dev` points to a device of the list, which is never freed.
        let dev = unsafe { &*self.dev };
        u8::try_from(dev.view.ports.len()).unwrap_or(u8::MAX)
    }

    /// The device behind the context.
    pub fn device(&self) -> &Device {
        // SAFETY: as in `nports`.
        unsafe { &*self.dev }
    }
}

/// The context a caller's `ibv_context` belongs to; aborts if it is not one of ours (real
/// rdma-core would read garbage through it).
pub fn ctx_of(st: &State, ctx: *mut ibv_context, call: &str) -> &'static mut Ctx {
    if st.kind_of(ctx as usize) != Some(Kind::Context) {
        die(
            call,
            &format!(
                "{:#x} is not an open ibv_context (real rdma-core would crash)",
                ctx as usize
            ),
        );
    }
    let off = offset_of!(verbs_context, context);
    // SAFETY: registered contexts are `Ctx` boxes whose `vctx.context` is at `off` from the
    // start; the box lives until `ibv_close_device`, which unregisters it first.
    unsafe { &mut *(ctx.cast::<u8>().sub(off).cast::<Ctx>()) }
}

// ---- the dummy op table (libibverbs/dummy_ops.c: every op returns EOPNOTSUPP, or NULL with
// errno = EOPNOTSUPP) -----------------------------------------------------------------------

macro_rules! dummy_ptr {
    ($($name:ident($($t:ty),*) -> $r:ty;)*) => {$(
        extern "C" fn $name($(_: $t),*) -> *mut $r {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    )*};
}
macro_rules! dummy_int {
    ($($name:ident($($t:ty),*);)*) => {$(
        extern "C" fn $name($(_: $t),*) -> c_int {
            libc::EOPNOTSUPP
        }
    )*};
}

dummy_ptr! {
    d_alloc_null_mr(*mut ibv_pd) -> ibv_mr;
    d_create_counters(*mut ibv_context, *mut ibv_counters_init_attr) -> ibv_counters;
    d_reg_dm_mr(*mut ibv_pd, *mut ibv_dm, u64, usize, u32) -> ibv_mr;
    d_alloc_dm(*mut ibv_context, *mut ibv_alloc_dm_attr) -> ibv_dm;
    d_create_flow_action_esp(*mut ibv_context, *mut ibv_flow_action_esp_attr) -> ibv_flow_action;
    d_alloc_td(*mut ibv_context, *mut ibv_td_init_attr) -> ibv_td;
    d_create_cq_ex(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> ibv_cq_ex;
    d_create_flow(*mut ibv_qp, *mut ibv_flow_attr) -> ibv_flow;
    d_open_qp(*mut ibv_context, *mut ibv_qp_open_attr) -> ibv_qp;
    d_create_srq_ex(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> ibv_srq;
    d_open_xrcd(*mut ibv_context, *mut ibv_xrcd_init_attr) -> ibv_xrcd;
    d_alloc_mw(*mut ibv_pd, ibv_mw_type) -> ibv_mw;
    d_compat() -> c_void;
    d_alloc_parent_domain(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> ibv_pd;
    d_create_rwq_ind_table(*mut ibv_context, *mut ibv_rwq_ind_table_init_attr) -> ibv_rwq_ind_table;
    d_create_wq(*mut ibv_context, *mut ibv_wq_init_attr) -> ibv_wq;
    d_create_qp_ex(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> ibv_qp;
}
dummy_int! {
    d_advise_mr(*mut ibv_pd, ib_uverbs_advise_mr_advice, u32, *mut ibv_sge, u32);
    d_read_counters(*mut ibv_counters, *mut u64, u32, u32);
    d_attach_counters_point_flow(*mut ibv_counters, *mut ibv_counter_attach_attr, *mut ibv_flow);
    d_destroy_counters(*mut ibv_counters);
    d_free_dm(*mut ibv_dm);
    d_modify_flow_action_esp(*mut ibv_flow_action, *mut ibv_flow_action_esp_attr);
    d_destroy_flow_action(*mut ibv_flow_action);
    d_modify_qp_rate_limit(*mut ibv_qp, *mut ibv_qp_rate_limit_attr);
    d_dealloc_td(*mut ibv_td);
    d_modify_cq(*mut ibv_cq, *mut ibv_modify_cq_attr);
    d_post_srq_ops(*mut ibv_srq, *mut ibv_ops_wr, *mut *mut ibv_ops_wr);
    d_query_rt_values(*mut ibv_context, *mut ibv_values_ex);
    d_destroy_flow(*mut ibv_flow);
    d_get_srq_num(*mut ibv_srq, *mut u32);
    d_close_xrcd(*mut ibv_xrcd);
    d_bind_mw(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind);
    d_dealloc_mw(*mut ibv_mw);
    d_poll_cq(*mut ibv_cq, c_int, *mut ibv_wc);
    d_req_notify_cq(*mut ibv_cq, c_int);
    d_post_srq_recv(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr);
    d_post_send(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr);
    d_post_recv(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr);
    d_compat_query_device(*mut ibv_context, *mut ibv_device_attr);
    d_compat_query_port(*mut ibv_context, u8, *mut _compat_ibv_port_attr);
    d_destroy_rwq_ind_table(*mut ibv_rwq_ind_table);
    d_destroy_wq(*mut ibv_wq);
    d_modify_wq(*mut ibv_wq, *mut ibv_wq_attr);
    d_query_device_ex(*mut ibv_context, *const ibv_query_device_ex_input, *mut ibv_device_attr_ex, usize);
}
extern "C" fn d_placeholder() {}

/// Fills every op slot as `verbs_init_context` + `verbs_set_ops(&verbs_dummy_ops)` +
/// `verbs_set_ops(&<provider>_ctx_ops)` + `set_lib_ops` leave them (rdma-core v44.0
/// libibverbs/device.c l. 230–320, libibverbs/dummy_ops.c, providers/mana/mana.c l. 321–344,
/// providers/mlx5/mlx5.c l. 97–175).
fn fill_ops(v: &mut verbs_context, family: Family) {
    fill_dummy_ops(v);
    match family {
        Family::Mana => mana_ops(v),
        Family::Mlx5 { .. } => mlx5::set_ops(v),
    }
    // set_lib_ops: the public query_port slot is libibverbs' __lib_query_port over the
    // provider's op (with the port reported down while the world's link knob says so).
    v.query_port = Some(events::query_port_slot);
}

/// The slots `mana_ctx_ops` sets (v44 providers/mana/mana.c l. 321–344).
fn mana_ops(v: &mut verbs_context) {
    v.alloc_parent_domain = Some(mana::alloc_parent_domain);
    v.destroy_rwq_ind_table = Some(mana::destroy_rwq_ind_table);
    v.create_rwq_ind_table = Some(mana::create_rwq_ind_table);
    v.destroy_wq = Some(mana::destroy_wq);
    v.modify_wq = Some(mana::modify_wq);
    v.create_wq = Some(mana::create_wq);
    v.query_device_ex = Some(mana::query_device_ex);
    v.create_qp_ex = Some(mana::create_qp_ex);
    // set_lib_ops: __lib_ibv_create_cq_ex calls the provider's private create_cq_ex, which
    // MANA v44 does not have, so the dummy answers (EOPNOTSUPP). MANA has no create_flow:
    // the slots keep the dummies. MANA v44 sets poll_cq, post_recv and post_send to stubs
    // that return EOPNOTSUPP, as the dummies do.
}

/// Every slot as `verbs_set_ops(&verbs_dummy_ops)` leaves it (libibverbs/dummy_ops.c).
fn fill_dummy_ops(v: &mut verbs_context) {
    v.advise_mr = Some(d_advise_mr);
    v.alloc_null_mr = Some(d_alloc_null_mr);
    v.read_counters = Some(d_read_counters);
    v.attach_counters_point_flow = Some(d_attach_counters_point_flow);
    v.create_counters = Some(d_create_counters);
    v.destroy_counters = Some(d_destroy_counters);
    v.reg_dm_mr = Some(d_reg_dm_mr);
    v.alloc_dm = Some(d_alloc_dm);
    v.free_dm = Some(d_free_dm);
    v.modify_flow_action_esp = Some(d_modify_flow_action_esp);
    v.destroy_flow_action = Some(d_destroy_flow_action);
    v.create_flow_action_esp = Some(d_create_flow_action_esp);
    v.modify_qp_rate_limit = Some(d_modify_qp_rate_limit);
    v.alloc_parent_domain = Some(d_alloc_parent_domain);
    v.dealloc_td = Some(d_dealloc_td);
    v.alloc_td = Some(d_alloc_td);
    v.modify_cq = Some(d_modify_cq);
    v.post_srq_ops = Some(d_post_srq_ops);
    v.destroy_rwq_ind_table = Some(d_destroy_rwq_ind_table);
    v.create_rwq_ind_table = Some(d_create_rwq_ind_table);
    v.destroy_wq = Some(d_destroy_wq);
    v.modify_wq = Some(d_modify_wq);
    v.create_wq = Some(d_create_wq);
    v.query_rt_values = Some(d_query_rt_values);
    v.create_cq_ex = Some(d_create_cq_ex);
    v.query_device_ex = Some(d_query_device_ex);
    v.ibv_destroy_flow = Some(d_destroy_flow);
    v.ABI_placeholder2 = Some(d_placeholder);
    v.ibv_create_flow = Some(d_create_flow);
    v.ABI_placeholder1 = Some(d_placeholder);
    v.open_qp = Some(d_open_qp);
    v.create_qp_ex = Some(d_create_qp_ex);
    v.get_srq_num = Some(d_get_srq_num);
    v.create_srq_ex = Some(d_create_srq_ex);
    v.open_xrcd = Some(d_open_xrcd);
    v.close_xrcd = Some(d_close_xrcd);

    let o = &mut v.context.ops;
    o._compat_query_device = Some(d_compat_query_device);
    o._compat_query_port = Some(d_compat_query_port);
    o._compat_alloc_pd = Some(d_compat);
    o._compat_dealloc_pd = Some(d_compat);
    o._compat_reg_mr = Some(d_compat);
    o._compat_rereg_mr = Some(d_compat);
    o._compat_dereg_mr = Some(d_compat);
    o.alloc_mw = Some(d_alloc_mw);
    o.bind_mw = Some(d_bind_mw);
    o.dealloc_mw = Some(d_dealloc_mw);
    o._compat_create_cq = Some(d_compat);
    o.poll_cq = Some(d_poll_cq);
    o.req_notify_cq = Some(d_req_notify_cq);
    o._compat_cq_event = Some(d_compat);
    o._compat_resize_cq = Some(d_compat);
    o._compat_destroy_cq = Some(d_compat);
    o._compat_create_srq = Some(d_compat);
    o._compat_modify_srq = Some(d_compat);
    o._compat_query_srq = Some(d_compat);
    o._compat_destroy_srq = Some(d_compat);
    o.post_srq_recv = Some(d_post_srq_recv);
    o._compat_create_qp = Some(d_compat);
    o._compat_query_qp = Some(d_compat);
    o._compat_modify_qp = Some(d_compat);
    o._compat_destroy_qp = Some(d_compat);
    o.post_send = Some(d_post_send);
    o.post_recv = Some(d_post_recv);
    o._compat_create_ah = Some(d_compat);
    o._compat_destroy_ah = Some(d_compat);
    o._compat_attach_mcast = Some(d_compat);
    o._compat_detach_mcast = Some(d_compat);
    o._compat_async_event = Some(d_compat);
}

// ---- devices ------------------------------------------------------------------------------

fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// Looks at the tree again, as every `ibv_get_device_list` does (v44
/// libibverbs/device.c:54–96 → `ibverbs_get_device_list`, init.c:551–609): a device still
/// there as it was keeps its `ibv_device`; one gone leaves the list (its `ibv_device` stays
/// valid for whoever holds it); one that came back from a servicing is a new registration
/// (`same_sysfs_dev`, init.c:511–525: the kernel gave it a new index) and gets a new
/// `ibv_device`. Returns the listed devices (addresses of leaked `Device` boxes).
pub(crate) fn rescan(st: &mut State) -> Vec<usize> {
    events::start(&st.cfg.sysfs);
    let mut list = Vec::new();
    for view in world::read_sysfs(&st.cfg.sysfs) {
        let same = st.devices.iter().copied().find(|&d| {
            // SAFETY: `st.devices` holds leaked `Device` boxes, never freed.
            let d = unsafe { &*(d as *const Device) };
            d.view.name == view.name && d.view.generation == view.generation
        });
        if let Some(d) = same {
            list.push(d);
            continue;
        }
        let i = view.uverbs;
        let mut dev = ibv_device {
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            ..Default::default()
        };
        copy_str(&mut dev.name, &view.name);
        copy_str(&mut dev.dev_name, &format!("uverbs{i}"));
        copy_str(
            &mut dev.dev_path,
            &st.cfg
                .sysfs
                .join(format!("class/infiniband_verbs/uverbs{i}"))
                .to_string_lossy(),
        );
        copy_str(&mut dev.ibdev_path, &view.ibdev_path.to_string_lossy());
        // The device model's engines are keyed by the uverbs number, the same for a device
        // that comes back (so its wire is served by the engine that kept it open).
        let b = Box::new(Device {
            dev,
            index: i,
            view,
        });
        let a = Box::into_raw(b) as usize;
        st.devices.push(a);
        list.push(a);
    }
    st.listed = Some(list.clone());
    list
}

/// The device of the list `dev` is (one listed now or earlier); aborts on anything else.
pub fn device_of(st: &mut State, dev: *mut ibv_device, call: &str) -> &'static Device {
    if st.listed.is_none() {
        rescan(st);
    }
    if !st.devices.contains(&(dev as usize)) {
        die(
            call,
            &format!("{:#x} is not a device of ibv_get_device_list", dev as usize),
        );
    }
    // SAFETY: the address is one of the leaked `Device` boxes (repr(C), `dev` first).
    unsafe { &*dev.cast::<Device>() }
}

export!("IBVERBS_1.1" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    call_ptr("ibv_get_device_list", json!({}), |st| {
        // The first call runs ibverbs_init (v44 device.c:68–72): RDMAV_FORK_SAFE.
        crate::fork::init_from_env(st.cfg.profile);
        let list = rescan(st);
        if !num_devices.is_null() {
            // SAFETY: the caller passes a writable int (or NULL, handled above).
            unsafe { *num_devices = c_int::try_from(list.len()).unwrap_or(c_int::MAX) };
        }
        // A NULL-terminated array the caller frees with ibv_free_device_list.
        // SAFETY: calloc of (n + 1) pointers; checked for NULL below.
        let arr = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if arr.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, d) in list.iter().enumerate() {
            // SAFETY: `i < n` and the array holds n + 1 entries.
            unsafe { *arr.add(i) = *d as *mut ibv_device };
        }
        Ok(arr)
    })
});

export!("IBVERBS_1.1" fn ibv_free_device_list(list: *mut *mut ibv_device) -> () {
    // SAFETY: `list` came from ibv_get_device_list's calloc (or is NULL, which free accepts).
    unsafe { libc::free(list.cast()) }
});

export!("IBVERBS_1.1" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    device_of(st, device, "ibv_get_device_name").dev.name.as_ptr()
});

export!("IBVERBS_1.1" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    // MANA reports no node GUID through sysfs for raw Ethernet ports; 0 as there.
    let _ = device_of(st, device, "ibv_get_device_guid");
    0
});

export!("IBVERBS_1.9" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    let mut g = lock();
    let st = g.as_mut().expect("state initialised by lock()");
    c_int::try_from(device_of(st, device, "ibv_get_device_index").index).unwrap_or(-1)
});

/// The "uverbs file" of a context: what `open(/dev/infiniband/uverbsN)` gives libibverbs as
/// `cmd_fd`. Here a memfd named `fake-rdma-uverbs:DEV` of one page: the page is the context's
/// MANA doorbell page (the kernel's `mana_ib_mmap`: offset 0 maps the ucontext's doorbell
/// page), so a process that gets the descriptor (`SCM_RIGHTS`) and maps it rings the same
/// page. What a fake cannot be: a character device (`ibv_import_device` checks `S_ISCHR` and
/// the device number; the fake's import knows its files by name instead).
fn uverbs_file(dev: &str) -> Result<c_int, c_int> {
    let name = std::ffi::CString::new(format!("{UVERBS_MEMFD}{dev}")).map_err(|_| libc::EINVAL)?;
    // SAFETY: plain syscalls on a NUL-terminated name; the fd is closed on any failure.
    unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        if libc::ftruncate(fd, 4096) != 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            libc::close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

/// The name prefix of the fake's command files (`/proc/self/fd/N` reads
/// `/memfd:fake-rdma-uverbs:DEV (deleted)`).
pub const UVERBS_MEMFD: &str = "fake-rdma-uverbs:";

/// The mapping `mana_alloc_context` makes (`mmap(NULL, 4096, PROT_WRITE, MAP_SHARED,
/// cmd_fd, 0)`), readable too since the model's engine reads the page through it; NULL on
/// failure.
fn map_cmd_page(cmd_fd: c_int) -> *mut c_void {
    // SAFETY: a shared mapping of one page of a file of one page, checked below.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            cmd_fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        null_mut()
    } else {
        p
    }
}

fn eventfd() -> Result<c_int, c_int> {
    // SAFETY: plain syscall with constant flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(fd)
    }
}

export!("IBVERBS_1.1" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    call_ptr("ibv_open_device", json!({"device": addr(device)}), |st| {
        let dev = device_of(st, device, "ibv_open_device");
        // verbs_open_device opens /dev/infiniband/uverbsN first (v44
        // libibverbs/device.c:323–340, util/open_cdev.c:47–61, 134–146): the node of a
        // device being serviced is gone (kernel `ib_uverbs_remove_one`: cdev_device_del), so
        // open(2) fails with ENOENT. (libibverbs then waits up to 5 s for udev to create
        // /dev/char/MAJ:MIN, open_cdev_robust, l. 73–132; the fake does not wait.)
        if !dev.view.ibdev_path.is_dir()
            || world::uverbs_of(&st.cfg.sysfs, &dev.view.name) != Some(dev.index)
        {
            return Err(libc::ENOENT);
        }
        // ibv_cmd_get_context: the kernel opens the uverbs file and answers with the
        // async event fd (libibverbs/cmd_device.c).
        st.fault("ibv_open_device")?;
        let cmd_fd = uverbs_file(&dev.view.name)?;
        // The async fd delivers the world's link and fatal events (events.rs).
        let async_fd = events::async_fd().inspect_err(|_| {
            // SAFETY: `cmd_fd` was opened just above and is not shared.
            unsafe { libc::close(cmd_fd) };
        })?;
        let family = dev.view.family;
        let mut db = null_mut();
        let mut mlx5_part = None;
        match family {
            Family::Mana => {
                // mana_alloc_context maps the doorbell page from the command fd (offset 0,
                // PROT_WRITE, MAP_SHARED); a failure there is ENOENT (rdma-core v44.0
                // providers/mana/mana.c l. 388–393). The kernel's `mana_ib_mmap` maps the
                // ucontext's doorbell page for offset 0, so every mapping of the same file
                // (another process's, with the fd passed by SCM_RIGHTS, as DPDK net/mana's
                // secondaries do: drivers/net/mana/mana.c,
                // `mana_map_doorbell_secondary`) is that one page. Ordinary shared
                // memory of the command file here, write-combining MMIO on hardware.
                db = map_cmd_page(cmd_fd);
                if db.is_null() {
                    // SAFETY: both fds were opened above.
                    unsafe {
                        libc::close(cmd_fd);
                        libc::close(async_fd);
                    }
                    return Err(libc::ENOENT);
                }
            }
            // mlx5_alloc_context: the context's UAR pages (mlx5::Mlx5Ctx::new).
            Family::Mlx5 { part } => mlx5_part = Some(part),
        }
        // SAFETY: zeroed `verbs_context` is its valid initial state (all pointers NULL, a
        // zero pthread mutex is PTHREAD_MUTEX_INITIALIZER on glibc).
        let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
        fill_ops(&mut vctx, family);
        // verbs_init_context (libibverbs/device.c l. 243–244).
        vctx.context.abi_compat = usize::MAX as *mut c_void;
        vctx.sz = size_of::<verbs_context>();
        vctx.context.device = device;
        vctx.context.cmd_fd = cmd_fd;
        vctx.context.async_fd = async_fd;
        vctx.context.num_comp_vectors = match family {
            Family::Mana => 1,
            Family::Mlx5 { .. } => mlx5::NUM_COMP_VECTORS,
        };
        // SAFETY: calloc of libibverbs' private block; NULL is tolerated (never read here).
        let private = unsafe { libc::calloc(1, 256) };
        vctx.priv_ = private.cast();
        let ctx = Box::into_raw(Box::new(Ctx {
            vctx,
            dev,
            family,
            alloc: manadv_ctx_allocators::default(),
            db_page: db,
            mlx5: mlx5_part.map(|part| Box::new(mlx5::Mlx5Ctx::new(part, cmd_fd))),
            private,
        }));
        // SAFETY: just allocated; the address of its `ibv_context` is what callers hold.
        let ibctx = unsafe { &raw mut (*ctx).vctx.context };
        st.register(ibctx as usize, Kind::Context, ibctx as usize);
        let nports = u8::try_from(dev.view.ports.len()).unwrap_or(u8::MAX);
        events::register(ibctx as usize, async_fd, &dev.view.ibdev_path, nports);
        Ok(ibctx)
    })
});

export!("IBVERBS_1.1" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    call_int("ibv_close_device", json!({"context": addr(context)}), |st| {
        let ctx = ctx_of(st, context, "ibv_close_device");
        // The kernel destroys whatever the process left on this context; libmana's
        // free_context only unmaps the doorbell page (rdma-core v44.0 providers/mana/mana.c,
        // mana_free_context). Queue buffers from the user's allocator are not freed.
        let left: Vec<usize> = st
            .objects
            .iter()
            .filter(|(_, e)| e.ctx == context as usize)
            .map(|(&a, _)| a)
            .collect();
        // A disassociated context's objects were torn down by the kernel already
        // (`disassociate`); the file's close finds nothing left to destroy.
        let dead = st.dead.remove(&(context as usize));
        for a in left {
            if !dead {
                match ctx.family {
                    Family::Mana => mana::forget(st, a),
                    Family::Mlx5 { .. } => mlx5::forget(st, a),
                }
            }
            st.unregister(a);
        }
        // The NIC forgets the context's memory regions and doorbell page before it goes.
        st.nics.close_context(context as usize);
        st.mlx5_nics.close_context(context as usize);
        if matches!(ctx.family, Family::Mlx5 { .. }) {
            // Rules of other contexts of the device stay; the context's are gone.
            mlx5::flow::sync(st, ctx.device().index);
            mlx5::close(ctx);
        }
        // No more events for this context; its async fd is closed below.
        events::unregister(context as usize);
        // SAFETY: the doorbell page and the fds were created by ibv_open_device and are
        // released once, here; the context box is freed after it was unregistered.
        unsafe {
            if !ctx.db_page.is_null() {
                libc::munmap(ctx.db_page, 4096);
            }
            libc::close(ctx.vctx.context.cmd_fd);
            libc::close(ctx.vctx.context.async_fd);
            libc::free(ctx.private);
            drop(Box::from_raw(ctx as *mut Ctx));
        }
        Ok(0)
    })
});

/// Disassociates context `context` from its device, as the kernel does with every open
/// uverbs file of a device being removed (`ib_uverbs_remove_one` →
/// `ib_uverbs_free_hw_resources` → `uverbs_destroy_ufile_hw`, reason
/// `RDMA_REMOVE_DRIVER_REMOVE`): every hardware object of the context is destroyed now
/// (queues leave the device model, regions leave its engines, a MANA vPort is released, mlx5
/// flow rules stop steering), while the user-space objects stay until the program destroys
/// them. From now on commands fail with `EIO` and destroys succeed ([`State::kernel`],
/// [`State::disassociated`]). The engines of the device keep running (and their wires
/// open) with no queue: frames that arrive are dropped as for a queue with no WQE posted.
pub fn disassociate(st: &mut State, context: usize) {
    if st.dead.contains(&context) || st.kind_of(context) != Some(Kind::Context) {
        return;
    }
    let ctx = ctx_of(st, context as *mut ibv_context, "disassociate");
    let dev = ctx.device().index;
    st.nics.hold(dev);
    st.mlx5_nics.hold(dev);
    let objs: Vec<usize> = st
        .objects
        .iter()
        .filter(|(&a, e)| e.ctx == context && a != context)
        .map(|(&a, _)| a)
        .collect();
    for a in objs {
        match ctx.family {
            Family::Mana => mana::forget(st, a),
            Family::Mlx5 { .. } => mlx5::forget(st, a),
        }
    }
    st.dead.insert(context);
    st.nics.close_context(context);
    st.mlx5_nics.close_context(context);
    if matches!(ctx.family, Family::Mlx5 { .. }) {
        // The context's rules no longer steer (flow::sync skips disassociated contexts).
        mlx5::flow::sync(st, dev);
    }
}

export!("IBVERBS_1.1" fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int {
    call_int("ibv_query_device", json!({"context": addr(context)}), |st| {
        let ctx = ctx_of(st, context, "ibv_query_device");
        st.kernel(context, "ibv_query_device")?;
        let Some(out) = NonNull::new(device_attr) else {
            die("ibv_query_device", "device_attr is NULL (real rdma-core would crash)");
        };
        let attr = match ctx.family {
            Family::Mana => mana::device_attr(ctx),
            Family::Mlx5 { .. } => mlx5::device_attr(ctx),
        };
        // SAFETY: the caller passes a writable `ibv_device_attr`.
        unsafe { out.as_ptr().write(attr) };
        Ok(0)
    })
});

export!("IBVERBS_1.1" fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut _compat_ibv_port_attr) -> c_int {
    // The exported form copies the compat struct: `ibv_port_attr` up to `flags`
    // (rdma-core v44.0 libibverbs/verbs.c l. 197–219).
    let len = offset_of!(ibv_port_attr, port_cap_flags2);
    // SAFETY: same contract as the slot; `len` bytes of the caller's struct are written.
    unsafe { events::query_port_slot(context, port_num, port_attr.cast(), len) }
});

export!("IBVERBS_1.1" fn ibv_query_gid(context: *mut ibv_context, port_num: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    call_int("ibv_query_gid", json!({"context": addr(context), "port": port_num, "index": index}), |st| {
        let ctx = ctx_of(st, context, "ibv_query_gid");
        // v44 ibv_query_gid asks the kernel first (UVERBS_METHOD_QUERY_GID_ENTRY,
        // libibverbs/cmd_device.c:436–471) and turns its error into -1 (verbs.c:231–251): a
        // disassociated context's EIO.
        if st.disassociated(context) {
            return Ok(-1);
        }
        let gids = match ctx.family {
            Family::Mana => mana::GID_TABLE_LEN,
            Family::Mlx5 { .. } => mlx5::GID_TABLE_LEN,
        };
        if port_num == 0 || port_num > ctx.nports() || !(0..gids).contains(&index) {
            // Returns -1 through the sysfs read failing (libibverbs/verbs.c ibv_query_gid).
            return Ok(-1);
        }
        let mac = ctx.device().view.ports[usize::from(port_num - 1)].mac.unwrap_or_default().0;
        // fe80::/64 with the EUI-64 of the port's MAC.
        let mut raw = [0u8; 16];
        raw[0] = 0xfe;
        raw[1] = 0x80;
        raw[8..16].copy_from_slice(&[mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]);
        // SAFETY: the caller passes a writable `ibv_gid` (16 bytes).
        unsafe { gid.cast::<[u8; 16]>().write_unaligned(raw) };
        Ok(0)
    })
});

export!("IBVERBS_1.1" fn ibv_fork_init() -> c_int {
    // v44 libibverbs/memory.c:125–176: EINVAL once a range was registered before it, else
    // later registrations are marked MADV_DONTFORK; main (v51+) l. 137–138: 0 and nothing
    // marked on a kernel that copies pinned pages on fork (src/fork.rs).
    call_int("ibv_fork_init", json!({}), |st| match crate::fork::fork_init(st.cfg.profile) {
        0 => Ok(0),
        e => Err(e),
    })
});

export!("IBVERBS_1.13" fn ibv_is_fork_initialized() -> ibv_fork_status {
    call_int("ibv_is_fork_initialized", json!({}), |_| Ok(crate::fork::status() as c_int)) as ibv_fork_status
});

export!("IBVERBS_1.1" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    // A read of the async fd, as libibverbs does (rdma-core v44.0 libibverbs/device.c:452–496):
    // it blocks until an event is queued, or fails with EAGAIN when the application made the
    // descriptor non-blocking; the events come from the world's knobs (events.rs). Not
    // traced: a program polls it, and the trace shows the bring-up.
    let fd = {
        let mut g = lock();
        let st = g.as_mut().expect("state initialised by lock()");
        ctx_of(st, context, "ibv_get_async_event").vctx.context.async_fd
    };
    if event.is_null() {
        die("ibv_get_async_event", "event is NULL (real rdma-core would crash)");
    }
    // SAFETY: `event` is non-NULL and, per the API, points to a writable ibv_async_event.
    unsafe { events::get(context as usize, fd, event) }
});

export!("IBVERBS_1.1" fn ibv_ack_async_event(event: *mut ibv_async_event) -> () {
    // libibverbs counts acknowledgements of CQ, QP, SRQ and WQ events (their destroy waits
    // for them) and does nothing for port and device events (rdma-core v44.0
    // libibverbs/device.c:498–562), the only ones the fake raises.
    if event.is_null() {
        die("ibv_ack_async_event", "event is NULL (real rdma-core would crash)");
    }
});

export!("IBVERBS_1.0" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    call_ptr("ibv_create_comp_channel", json!({"context": addr(context)}), |st| {
        let _ = ctx_of(st, context, "ibv_create_comp_channel");
        st.kernel(context, "ibv_create_comp_channel")?;
        let fd = eventfd()?;
        Ok(Box::into_raw(Box::new(ibv_comp_channel { context, fd, refcnt: 0 })))
    })
});

export!("IBVERBS_1.0" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    call_int("ibv_destroy_comp_channel", json!({"channel": addr(channel)}), |_| {
        // SAFETY: the caller passes a channel from ibv_create_comp_channel.
        let ch = unsafe { &mut *channel };
        // libibverbs/verbs.c ibv_destroy_comp_channel: EBUSY while a CQ uses it.
        if ch.refcnt > 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: the fd and the box were created by ibv_create_comp_channel.
        unsafe {
            libc::close(ch.fd);
            drop(Box::from_raw(channel));
        }
        Ok(0)
    })
});

/// Live objects (contexts, PDs, parent domains, MRs, CQs, WQs, tables, QPs) of this
/// process; unversioned, so a test can find it with `dlsym(RTLD_DEFAULT, ...)` and tell the
/// fake from the real library (which has no such symbol).
#[no_mangle]
pub extern "C" fn fake_rdma_live_objects() -> c_int {
    let g = lock();
    c_int::try_from(g.as_ref().map_or(0, |s| s.objects.len())).unwrap_or(c_int::MAX)
}

/// Device-model engines running in this process (one per MANA vPort, one per mlx5 device,
/// with queues, or kept through a servicing); unversioned, for tests.
#[no_mangle]
pub extern "C" fn fake_rdma_engines() -> c_int {
    let g = lock();
    c_int::try_from(
        g.as_ref()
            .map_or(0, |s| s.nics.running() + s.mlx5_nics.running()),
    )
    .unwrap_or(c_int::MAX)
}

/// Device-model engines of this process that run on a thread of the fake (`fakenic-D-P`):
/// [`fake_rdma_engines`] less the inline ones (`crate::kick`); unversioned, for tests.
#[no_mangle]
pub extern "C" fn fake_rdma_engine_threads() -> c_int {
    let g = lock();
    c_int::try_from(
        g.as_ref()
            .map_or(0, |s| s.nics.threads() + s.mlx5_nics.threads()),
    )
    .unwrap_or(c_int::MAX)
}

/// Writes a JSON object with the live objects by kind (`{"cq":1,...}`) to stderr; for
/// humans debugging a leak.
#[no_mangle]
pub extern "C" fn fake_rdma_dump_live() {
    let g = lock();
    if let Some(s) = g.as_ref() {
        eprintln!("fake-rdma: live objects {}", json!(s.live_by_kind()));
    }
}

/// The line printed at exit: `fake-rdma: at exit: N live objects` and, when N > 0, which;
/// then, when the device models dropped frames their drivers cannot see (see
/// [`crate::nic::DeviceDrops`]), `fake-rdma: device drops at exit: {"rx_no_wqe":N,...}`.
pub fn report_at_exit() {
    let g = lock();
    let n = g.as_ref().map_or(0, |s| s.objects.len());
    match g.as_ref() {
        Some(s) if n > 0 => eprintln!(
            "fake-rdma: at exit: {n} live objects {} (not destroyed by the program)",
            json!(s.live_by_kind())
        ),
        _ => eprintln!("fake-rdma: at exit: 0 live objects"),
    }
    if let Some(s) = g.as_ref() {
        let mut d = s.nics.device_drops();
        d.add(&s.mlx5_nics.device_drops().0.into_iter().collect::<Vec<_>>());
        if d.0.values().any(|&v| v > 0) {
            eprintln!("fake-rdma: device drops at exit: {}", json!(d.0));
        }
    }
}

/// The C name of a device, for messages.
pub fn device_name(dev: &Device) -> String {
    // SAFETY: `name` is NUL-terminated (copy_str leaves the last byte 0).
    unsafe { CStr::from_ptr(dev.dev.name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// One page of the command file `cmd_fd` at byte `offset`, mapped shared (read and write),
/// the file grown to hold it first (a memfd is sparse: an mlx5 UAR's offset, 2.4 GB in, costs
/// nothing): what the kernel maps for that offset of a uverbs file (mlx5's UAR pages,
/// `mlx5_ib_mmap`), so every process holding the descriptor maps the same page. NULL on
/// failure.
pub fn map_cmd_file_page(cmd_fd: c_int, offset: u64) -> *mut c_void {
    let Ok(off) = libc::off_t::try_from(offset) else {
        return null_mut();
    };
    // SAFETY: fstat/ftruncate on the context's own command file, then a shared mapping of
    // one page inside it, checked below.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(cmd_fd, &mut st) != 0 {
            return null_mut();
        }
        if st.st_size < off + 4096 && libc::ftruncate(cmd_fd, off + 4096) != 0 {
            return null_mut();
        }
        let p = libc::mmap(
            null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            cmd_fd,
            off,
        );
        if p == libc::MAP_FAILED {
            null_mut()
        } else {
            p
        }
    }
}

// ---- exported calls that reach the provider through an object's context -------------------

/// `vctx->query_port` = libibverbs' `__lib_query_port` (v44 libibverbs/verbs.c:174–195) over
/// the provider's `query_port` → `ibv_cmd_query_port` (v44 providers/mana/mana.c:60–66,
/// providers/mlx5/verbs.c:117–123).
///
/// # Safety
/// `attr` points to `len` writable bytes.
pub unsafe extern "C" fn query_port_slot(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    call_int(
        "ibv_query_port",
        json!({"context": addr(context), "port": port_num, "len": len}),
        |st| {
            let ctx = ctx_of(st, context, "ibv_query_port");
            non_null(attr, "ibv_query_port", "port_attr");
            st.kernel(context, "ibv_query_port")?;
            // uverbs core: rdma_is_port_valid → EINVAL.
            if port_num == 0 || port_num > ctx.nports() {
                return Err(libc::EINVAL);
            }
            let a = match ctx.family {
                Family::Mana => mana::port_attr(),
                Family::Mlx5 { .. } => {
                    let netdev = &ctx.device().view.ports[usize::from(port_num) - 1].netdev;
                    mlx5::port_attr(netdev.as_ref().is_none_or(|(_, f)| world::netdev_up(f)))
                }
            };
            let n = len.min(size_of::<ibv_port_attr>());
            // SAFETY: the caller's struct has `len` writable bytes; we write `n <= len`
            // (the rest was zeroed, as __lib_query_port memsets it first).
            unsafe {
                std::ptr::write_bytes(attr.cast::<u8>(), 0, len);
                std::ptr::copy_nonoverlapping(
                    (&a as *const ibv_port_attr).cast::<u8>(),
                    attr.cast::<u8>(),
                    n,
                );
            }
            Ok(0)
        },
    )
}

export!("IBVERBS_1.1" fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq {
    call_ptr("ibv_create_cq", json!({"context": addr(context), "cqe": cqe, "comp_vector": comp_vector}), |st| {
        match ctx_of(st, context, "ibv_create_cq").family {
            Family::Mana => mana::create_cq(st, context, cqe, cq_context, channel, comp_vector),
            Family::Mlx5 { .. } => mlx5::cq::create_cq(st, context, cqe, cq_context, channel, comp_vector),
        }
    })
});

export!("IBVERBS_1.1" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    call_int("ibv_destroy_cq", json!({"cq": addr(cq)}), |st| {
        match ctx_of_obj(st, cq, &[Kind::Cq], "ibv_destroy_cq").family {
            Family::Mana => mana::destroy_cq(st, cq),
            Family::Mlx5 { .. } => mlx5::cq::destroy_cq(st, cq),
        }
    })
});

export!("IBVERBS_1.1" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    call_ptr("ibv_create_qp", json!({"pd": addr(pd)}), |st| {
        let pd = non_null(pd, "ibv_create_qp", "pd");
        match ctx_of_obj(st, pd, &[Kind::Pd, Kind::ParentDomain], "ibv_create_qp").family {
            Family::Mana => mana::create_qp(st, pd, attr),
            Family::Mlx5 { .. } => mlx5::qp::create_qp(st, pd, attr),
        }
    })
});

export!("IBVERBS_1.1" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    call_int("ibv_modify_qp", json!({"qp": addr(qp), "attr_mask": attr_mask}), |st| {
        match ctx_of_obj(st, qp, &[Kind::Qp], "ibv_modify_qp").family {
            Family::Mana => mana::modify_qp(st, qp),
            Family::Mlx5 { .. } => mlx5::qp::modify_qp(st, qp, attr, attr_mask),
        }
    })
});

export!("IBVERBS_1.1" fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int {
    call_int("ibv_query_qp", json!({"qp": addr(qp), "attr_mask": attr_mask}), |st| {
        match ctx_of_obj(st, qp, &[Kind::Qp], "ibv_query_qp").family {
            Family::Mana => mana::query_qp(st, qp),
            Family::Mlx5 { .. } => mlx5::qp::query_qp(st, qp, attr, attr_mask, init_attr),
        }
    })
});

export!("IBVERBS_1.1" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    call_int("ibv_destroy_qp", json!({"qp": addr(qp)}), |st| {
        match ctx_of_obj(st, qp, &[Kind::Qp], "ibv_destroy_qp").family {
            Family::Mana => mana::destroy_qp(st, qp),
            Family::Mlx5 { .. } => mlx5::qp::destroy_qp(st, qp),
        }
    })
});
