//! Owned handles for verbs objects. Each handle holds `Arc`s of the objects it was created
//! from, so rdma-core always sees children destroyed before their parents (its objects are
//! reference-counted by the kernel, which refuses an early destroy with `EBUSY`), and a
//! bring-up abandoned half-way tears down exactly what it created when its handles drop.
//!
//! A destroy that fails in `Drop` is logged with its errno; nothing else can be done there.
#![allow(unsafe_code)]

use super::{ret_errno, VerbsError};
use crate::sys::verbs as inl;
use rdma_sys::{
    ibv_close_device, ibv_context, ibv_cq, ibv_create_cq, ibv_create_qp, ibv_dealloc_pd,
    ibv_dereg_mr, ibv_destroy_cq, ibv_destroy_qp, ibv_device_attr_ex, ibv_free_device_list,
    ibv_get_device_list, ibv_get_device_name, ibv_mr, ibv_open_device, ibv_pd, ibv_port_attr,
    ibv_qp, ibv_rwq_ind_table, ibv_wq,
};
use std::any::Any;
use std::ffi::{c_void, CStr};
use std::io;
use std::ptr::{null_mut, NonNull};
use std::sync::{Arc, Mutex};

/// `errno` after a pointer-returning call failed (`EIO` when the provider left it unset).
fn errno() -> i32 {
    match io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

fn log_destroy(call: &'static str, what: &str, ret: i32) {
    if ret != 0 {
        let e = VerbsError::new(call, what, ret_errno(ret));
        tracing::error!(target: "pmd::verbs", "teardown: {e}");
    } else {
        tracing::trace!(target: "pmd::verbs", call, what, "destroyed");
    }
}

/// An open device context (`ibv_open_device`); closed (`ibv_close_device`) when the last
/// handle of it and of every object created from it has dropped.
pub struct Context {
    ptr: NonNull<ibv_context>,
    name: String,
    /// What must outlive the context (the queue-buffer allocators rdma-core calls until the
    /// last queue is destroyed): dropped after `ibv_close_device`.
    keep: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

// SAFETY: an `ibv_context` may be used from any thread (rdma-core serialises what needs it
// with the context's own mutex); this handle only passes the pointer to rdma-core calls and
// closes it once, in `Drop`, when no other handle refers to it.
unsafe impl Send for Context {}
// SAFETY: as for `Send`: shared use only passes the pointer to thread-safe rdma-core calls.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({})", self.name)
    }
}

impl Context {
    /// Opens the RDMA device named `name` (as `ibv_devices` and `pmd-devices` list it).
    ///
    /// # Errors
    /// `ibv_get_device_list` or `ibv_open_device` failed, or no device has that name (`ENODEV`,
    /// listing the names there are).
    pub fn open(name: &str) -> Result<Arc<Self>, VerbsError> {
        let mut n: i32 = 0;
        // SAFETY: `ibv_get_device_list` writes the count through the valid `&mut n` and
        // returns NULL or an array of `n` device pointers, valid until freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::new(
                "ibv_get_device_list",
                "the RDMA device list",
                errno(),
            ));
        }
        let mut names = Vec::new();
        let mut found = null_mut();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: `i < n`: inside the array; each entry is a live `ibv_device` whose name
            // is a NUL-terminated string owned by it, copied before the list is freed.
            let dev_name = unsafe {
                let dev = *list.add(i);
                let p = ibv_get_device_name(dev);
                let s = if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                };
                if s == name {
                    found = dev;
                }
                s
            };
            names.push(dev_name);
        }
        let ctx = if found.is_null() {
            null_mut()
        } else {
            // SAFETY: `found` is a device of the list, which is still allocated.
            unsafe { ibv_open_device(found) }
        };
        let open_errno = errno();
        // SAFETY: `list` came from `ibv_get_device_list` and is freed once; the context
        // (if any) stays valid after the list goes, as libibverbs documents.
        unsafe { ibv_free_device_list(list) };
        if found.is_null() {
            let mut e = VerbsError::new(
                "ibv_get_device_list",
                format!("device {name}"),
                libc::ENODEV,
            );
            e.hint = if names.is_empty() {
                "libibverbs sees no RDMA device: load mana_ib and ib_uverbs (modprobe mana_ib), \
                 and check pmd-devices"
                    .into()
            } else {
                format!(
                    "libibverbs has {}; pmd-devices shows which port is which",
                    names.join(", ")
                )
            };
            return Err(e);
        }
        let ptr = NonNull::new(ctx).ok_or_else(|| {
            VerbsError::new("ibv_open_device", format!("device {name}"), open_errno)
        })?;
        tracing::debug!(target: "pmd::verbs", device = name, "context opened");
        Ok(Arc::new(Self {
            ptr,
            name: name.to_string(),
            keep: Mutex::new(Vec::new()),
        }))
    }

    /// The raw context.
    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kick of queue `queue_id` of this context (a send queue's id, or with `is_rx` a
    /// receive queue's) when the loaded libibverbs is the project's fake rdma-core, whose
    /// device model then runs on the polling thread (`sys::fake_kick`); `None` on real
    /// rdma-core, where the NIC needs no CPU.
    pub fn fake_kick(&self, is_rx: bool, queue_id: u32) -> crate::ethdev::Kick {
        // SAFETY: the context is open while `self` exists; the handle does not need it to
        // stay open (the fake keeps what the kick needs itself).
        let h = unsafe { crate::sys::fake_kick::open(self.as_ptr().cast(), is_rx, queue_id) }?;
        Some(Arc::new(FakeKick(h)))
    }

    /// The fake rdma-core's doorbell monitor for a queue of this (MANA) context
    /// (`sys::fake_kick::db_monitor`), viewed with `keep` (the queue's objects) held;
    /// `None` on real rdma-core.
    ///
    /// # Errors
    /// The fake could not make one (its errno).
    pub fn fake_db_monitor(
        &self,
        is_rx: bool,
        queue_id: u32,
        keep: &crate::ethdev::QueueOwner,
    ) -> Option<Result<Arc<crate::sys::DevMem>, VerbsError>> {
        // SAFETY: the context is open while `self` exists.
        let r =
            unsafe { crate::sys::fake_kick::db_monitor(self.as_ptr().cast(), is_rx, queue_id) }?;
        Some(match r {
            // SAFETY: the fake keeps the page mapped until the context is closed, which
            // `keep` (the queue's verbs objects, which hold the context) prevents while the
            // view lives; it is read and written only through `DevMem`'s atomics.
            Ok((p, offset)) => Ok(Arc::new(unsafe {
                crate::sys::DevMem::from_raw_kept_in_device(
                    p.as_ptr(),
                    crate::hw::mana::doorbell::PAGE_BYTES,
                    Arc::clone(keep),
                    offset,
                )
            })),
            Err(errno) => Err(VerbsError::new(
                "fake_rdma_db_monitor",
                format!("queue {queue_id} of device {}", self.name),
                errno,
            )),
        })
    }

    /// The context's command descriptor (the uverbs file): another process maps a MANA
    /// context's doorbell page from it.
    pub fn cmd_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the context is open while `self` exists and `cmd_fd` is set at open and
        // closed only by `ibv_close_device`, after `self` (the borrow's lifetime) is gone.
        unsafe { std::os::fd::BorrowedFd::borrow_raw((*self.ptr.as_ptr()).cmd_fd) }
    }

    /// The context's asynchronous event file descriptor.
    pub fn async_fd(&self) -> i32 {
        // SAFETY: the context is open while `self` exists; `async_fd` is set at open.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }

    /// Keeps `v` alive until after the context is closed.
    pub fn keep(&self, v: Arc<dyn Any + Send + Sync>) {
        self.keep.lock().unwrap_or_else(|p| p.into_inner()).push(v);
    }

    /// The device's attributes (`ibv_query_device_ex`).
    ///
    /// # Errors
    /// The call failed.
    pub fn query_device_ex(&self) -> Result<ibv_device_attr_ex, VerbsError> {
        // SAFETY: all-zero is a valid `ibv_device_attr_ex` (integers and arrays only).
        let mut attr: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; NULL input is allowed; `attr` is a writable struct of
        // the header's layout.
        let ret = unsafe { inl::ibv_query_device_ex(self.as_ptr(), std::ptr::null(), &mut attr) };
        if ret != 0 {
            return Err(VerbsError::new(
                "ibv_query_device_ex",
                format!("device {}", self.name),
                ret_errno(ret),
            ));
        }
        Ok(attr)
    }

    /// A port's attributes (`ibv_query_port`).
    ///
    /// # Errors
    /// The call failed (`EINVAL` for a port the device does not have).
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr, VerbsError> {
        // SAFETY: all-zero is a valid `ibv_port_attr`.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `attr` is a writable struct of the header's layout.
        let ret = unsafe { inl::ibv_query_port(self.as_ptr(), port, &mut attr) };
        if ret != 0 {
            return Err(VerbsError::new(
                "ibv_query_port",
                format!("{} port {port}", self.name),
                ret_errno(ret),
            ));
        }
        Ok(attr)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object created from this context holds an `Arc` of it, so none is
        // left; the pointer is closed exactly once.
        let ret = unsafe { ibv_close_device(self.ptr.as_ptr()) };
        log_destroy("ibv_close_device", &self.name, ret);
    }
}

/// A protection domain (`ibv_alloc_pd`).
pub struct Pd {
    ptr: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: as for `Context`: the pointer goes only to thread-safe rdma-core calls and is
// deallocated once, in `Drop`.
unsafe impl Send for Pd {}
// SAFETY: as for `Send`.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a PD on `ctx`.
    ///
    /// # Errors
    /// `ibv_alloc_pd` failed.
    pub fn alloc(ctx: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: the context is open.
        let p = unsafe { rdma_sys::ibv_alloc_pd(ctx.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(|| {
            VerbsError::new(
                "ibv_alloc_pd",
                format!("protection domain on {}", ctx.name),
                errno(),
            )
        })?;
        Ok(Arc::new(Self {
            ptr,
            ctx: Arc::clone(ctx),
        }))
    }

    /// The raw PD.
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }

    /// Its context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: children (parent domains, MRs) hold an `Arc` of this PD, so none is left.
        let ret = unsafe { ibv_dealloc_pd(self.ptr.as_ptr()) };
        log_destroy("ibv_dealloc_pd", "protection domain", ret);
    }
}

/// A parent domain (`ibv_alloc_parent_domain`) over a PD, carrying a `pd_context` value (on
/// MANA, the port number the raw queues created on it belong to).
pub struct ParentDomain {
    ptr: NonNull<ibv_pd>,
    pd: Arc<Pd>,
}

// SAFETY: as for `Pd`.
unsafe impl Send for ParentDomain {}
// SAFETY: as for `Pd`.
unsafe impl Sync for ParentDomain {}

impl ParentDomain {
    /// A parent domain over `pd` whose `pd_context` is `pd_context`.
    ///
    /// # Errors
    /// `ibv_alloc_parent_domain` failed.
    pub fn alloc(pd: &Arc<Pd>, pd_context: usize) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: all-zero is a valid init attr (NULL pointers, no callbacks).
        let mut attr: rdma_sys::ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        attr.pd = pd.as_ptr();
        attr.comp_mask =
            rdma_sys::ibv_parent_domain_init_attr_mask::IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT.0;
        attr.pd_context = pd_context as *mut c_void;
        // SAFETY: the context and the PD are live; `attr` is initialised.
        let p = unsafe { inl::ibv_alloc_parent_domain(pd.ctx.as_ptr(), &mut attr) };
        let ptr = NonNull::new(p).ok_or_else(|| {
            VerbsError::new(
                "ibv_alloc_parent_domain",
                format!("parent domain (port {pd_context}) on {}", pd.ctx.name),
                errno(),
            )
        })?;
        Ok(Arc::new(Self {
            ptr,
            pd: Arc::clone(pd),
        }))
    }

    /// The raw parent domain (an `ibv_pd`).
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }

    /// Its context.
    pub fn context(&self) -> &Arc<Context> {
        &self.pd.ctx
    }
}

impl Drop for ParentDomain {
    fn drop(&mut self) {
        // SAFETY: queues created on the domain hold an `Arc` of it, so none is left.
        let ret = unsafe { ibv_dealloc_pd(self.ptr.as_ptr()) };
        log_destroy("ibv_dealloc_pd", "parent domain", ret);
    }
}

/// The protection domain a queue is created on: a plain PD (mlx5) or a parent domain
/// (MANA, which takes the port from its `pd_context`).
#[derive(Clone)]
pub enum Domain {
    /// A plain PD.
    Pd(Arc<Pd>),
    /// A parent domain.
    Parent(Arc<ParentDomain>),
}

impl Domain {
    /// The raw `ibv_pd` (a parent domain is one too).
    pub fn as_ptr(&self) -> *mut ibv_pd {
        match self {
            Self::Pd(p) => p.as_ptr(),
            Self::Parent(p) => p.as_ptr(),
        }
    }

    /// Its context.
    pub fn context(&self) -> &Arc<Context> {
        match self {
            Self::Pd(p) => p.context(),
            Self::Parent(p) => p.context(),
        }
    }
}

impl From<&Arc<Pd>> for Domain {
    fn from(p: &Arc<Pd>) -> Self {
        Self::Pd(Arc::clone(p))
    }
}

impl From<&Arc<ParentDomain>> for Domain {
    fn from(p: &Arc<ParentDomain>) -> Self {
        Self::Parent(Arc::clone(p))
    }
}

/// A memory registration (`ibv_reg_mr`); deregistered on drop.
pub struct Mr {
    ptr: NonNull<ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: as for `Pd`.
unsafe impl Send for Mr {}
// SAFETY: as for `Pd`.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr` for local access by the device.
    ///
    /// # Errors
    /// `ibv_reg_mr` failed.
    pub fn register(pd: &Arc<Pd>, addr: usize, len: usize) -> Result<Self, VerbsError> {
        let access = rdma_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the PD is live; the caller keeps `addr..addr+len` mapped until this
        // registration drops (the mempool drops registrations before unmapping a chunk).
        let p = unsafe { rdma_sys::ibv_reg_mr(pd.as_ptr(), addr as *mut c_void, len, access) };
        let ptr = NonNull::new(p).ok_or_else(|| {
            VerbsError::new(
                "ibv_reg_mr",
                format!("{len} bytes at {addr:#x} on {}", pd.ctx.name),
                errno(),
            )
        })?;
        Ok(Self {
            ptr,
            _pd: Arc::clone(pd),
        })
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` exists.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once.
        let ret = unsafe { ibv_dereg_mr(self.ptr.as_ptr()) };
        log_destroy("ibv_dereg_mr", "memory region", ret);
    }
}

/// A completion queue (`ibv_create_cq`).
pub struct Cq {
    ptr: NonNull<ibv_cq>,
    ctx: Arc<Context>,
    what: String,
}

// SAFETY: as for `Pd`.
unsafe impl Send for Cq {}
// SAFETY: as for `Pd`.
unsafe impl Sync for Cq {}

impl Cq {
    /// A CQ of at least `cqe` entries; `what` names it in errors.
    ///
    /// # Errors
    /// `ibv_create_cq` failed.
    pub fn create(ctx: &Arc<Context>, cqe: u32, what: String) -> Result<Arc<Self>, VerbsError> {
        let n = i32::try_from(cqe).unwrap_or(i32::MAX);
        // SAFETY: the context is live; no channel, no user context.
        let p = unsafe { ibv_create_cq(ctx.as_ptr(), n, null_mut(), null_mut(), 0) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_cq", what.clone(), errno()))?;
        Ok(Arc::new(Self {
            ptr,
            ctx: Arc::clone(ctx),
            what,
        }))
    }

    /// Takes ownership of a CQ another creation call made (`mlx5dv_create_cq`).
    ///
    /// # Safety
    /// `ptr` is a live CQ of `ctx` that nothing else destroys.
    pub(super) unsafe fn from_raw(
        ptr: NonNull<ibv_cq>,
        ctx: &Arc<Context>,
        what: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            ptr,
            ctx: Arc::clone(ctx),
            what,
        })
    }

    /// The raw CQ.
    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.ptr.as_ptr()
    }

    /// Its context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: QPs and WQs using the CQ hold an `Arc` of it, so none is left.
        let ret = unsafe { ibv_destroy_cq(self.ptr.as_ptr()) };
        log_destroy("ibv_destroy_cq", &self.what, ret);
    }
}

/// A receive work queue (`ibv_create_wq`).
pub struct Wq {
    ptr: NonNull<ibv_wq>,
    _domain: Domain,
    _cq: Arc<Cq>,
    what: String,
}

// SAFETY: as for `Pd`.
unsafe impl Send for Wq {}
// SAFETY: as for `Pd`.
unsafe impl Sync for Wq {}

impl Wq {
    /// A receive WQ of `max_wr` WQEs of `max_sge` SGEs on `domain`, completing on `cq`.
    ///
    /// # Errors
    /// `ibv_create_wq` failed.
    pub fn create(
        domain: &Domain,
        cq: &Arc<Cq>,
        max_wr: u32,
        max_sge: u32,
        what: String,
    ) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: all-zero is a valid init attr.
        let mut attr: rdma_sys::ibv_wq_init_attr = unsafe { std::mem::zeroed() };
        attr.wq_type = rdma_sys::ibv_wq_type::IBV_WQT_RQ;
        attr.max_wr = max_wr;
        attr.max_sge = max_sge;
        attr.pd = domain.as_ptr();
        attr.cq = cq.as_ptr();
        // SAFETY: context, domain and CQ are live; `attr` is initialised.
        let p = unsafe { inl::ibv_create_wq(domain.context().as_ptr(), &mut attr) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_wq", what.clone(), errno()))?;
        Ok(Arc::new(Self {
            ptr,
            _domain: domain.clone(),
            _cq: Arc::clone(cq),
            what,
        }))
    }

    /// The raw WQ.
    pub fn as_ptr(&self) -> *mut ibv_wq {
        self.ptr.as_ptr()
    }

    /// The WQ number the kernel assigned (the RQ number of its CQEs).
    pub fn number(&self) -> u32 {
        // SAFETY: the WQ is live while `self` exists.
        unsafe { (*self.ptr.as_ptr()).wq_num }
    }

    /// Moves the WQ to `state` (`ibv_modify_wq`): `IBV_WQS_RDY` after creation, `RESET` and
    /// back for error recovery.
    ///
    /// # Errors
    /// The call failed (MANA v44 refuses every modification with `EOPNOTSUPP`).
    pub fn modify_state(&self, state: rdma_sys::ibv_wq_state::Type) -> Result<(), VerbsError> {
        // SAFETY: all-zero is a valid attr.
        let mut attr: rdma_sys::ibv_wq_attr = unsafe { std::mem::zeroed() };
        attr.attr_mask = rdma_sys::ibv_wq_attr_mask::IBV_WQ_ATTR_STATE.0;
        attr.wq_state = state;
        // SAFETY: the WQ is live; `attr` is initialised.
        let ret = unsafe { inl::ibv_modify_wq(self.ptr.as_ptr(), &mut attr) };
        if ret != 0 {
            return Err(VerbsError::new(
                "ibv_modify_wq",
                format!("{} to state {state}", self.what),
                ret_errno(ret),
            ));
        }
        Ok(())
    }
}

impl Drop for Wq {
    fn drop(&mut self) {
        // SAFETY: indirection tables using the WQ hold an `Arc` of it, so none is left.
        let ret = unsafe { inl::ibv_destroy_wq(self.ptr.as_ptr()) };
        log_destroy("ibv_destroy_wq", &self.what, ret);
    }
}

/// An RSS indirection table (`ibv_create_rwq_ind_table`) over receive WQs.
pub struct IndTable {
    ptr: NonNull<ibv_rwq_ind_table>,
    _wqs: Vec<Arc<Wq>>,
}

// SAFETY: as for `Pd`.
unsafe impl Send for IndTable {}
// SAFETY: as for `Pd`.
unsafe impl Sync for IndTable {}

impl IndTable {
    /// A table of `wqs.len()` entries (a power of two), in order.
    ///
    /// # Errors
    /// `ibv_create_rwq_ind_table` failed (`EINVAL` when the length is not a power of two).
    pub fn create(ctx: &Arc<Context>, wqs: Vec<Arc<Wq>>) -> Result<Arc<Self>, VerbsError> {
        let what = format!("indirection table of {} entries on {}", wqs.len(), ctx.name);
        if !wqs.len().is_power_of_two() {
            return Err(VerbsError::new(
                "ibv_create_rwq_ind_table",
                what,
                libc::EINVAL,
            ));
        }
        let mut table: Vec<*mut ibv_wq> = wqs.iter().map(|w| w.as_ptr()).collect();
        // SAFETY: all-zero is a valid init attr.
        let mut attr: rdma_sys::ibv_rwq_ind_table_init_attr = unsafe { std::mem::zeroed() };
        attr.log_ind_tbl_size = wqs.len().trailing_zeros();
        attr.ind_tbl = table.as_mut_ptr();
        // SAFETY: context and WQs are live; `table` has `1 << log_ind_tbl_size` entries and
        // outlives the call (the provider copies what it needs).
        let p = unsafe { inl::ibv_create_rwq_ind_table(ctx.as_ptr(), &mut attr) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_rwq_ind_table", what, errno()))?;
        Ok(Arc::new(Self { ptr, _wqs: wqs }))
    }
}

impl Drop for IndTable {
    fn drop(&mut self) {
        // SAFETY: the RSS QP using the table holds an `Arc` of it, so it is gone.
        let ret = unsafe { inl::ibv_destroy_rwq_ind_table(self.ptr.as_ptr()) };
        log_destroy("ibv_destroy_rwq_ind_table", "indirection table", ret);
    }
}

/// A queue pair: a raw-packet send QP, or an RSS receive QP over an indirection table.
pub struct Qp {
    ptr: NonNull<ibv_qp>,
    _domain: Domain,
    _cq: Option<Arc<Cq>>,
    _table: Option<Arc<IndTable>>,
    what: String,
}

// SAFETY: as for `Pd`.
unsafe impl Send for Qp {}
// SAFETY: as for `Pd`.
unsafe impl Sync for Qp {}

impl Qp {
    /// A raw-packet QP sending up to `max_send_wr` WQEs of `max_send_sge` SGEs, completing on
    /// `cq`.
    ///
    /// # Errors
    /// `ibv_create_qp` failed (on MANA `ENODEV`/`EBUSY` while the kernel holds the vPort).
    pub fn raw_packet(
        domain: &Domain,
        cq: &Arc<Cq>,
        max_send_wr: u32,
        max_send_sge: u32,
        what: String,
    ) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: all-zero is a valid init attr.
        let mut attr: rdma_sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.as_ptr();
        attr.recv_cq = cq.as_ptr();
        attr.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RAW_PACKET;
        attr.cap.max_send_wr = max_send_wr;
        attr.cap.max_send_sge = max_send_sge;
        // SAFETY: domain and CQ are live; `attr` is initialised.
        let p = unsafe { ibv_create_qp(domain.as_ptr(), &mut attr) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_qp", what.clone(), errno()))?;
        Ok(Arc::new(Self {
            ptr,
            _domain: domain.clone(),
            _cq: Some(Arc::clone(cq)),
            _table: None,
            what,
        }))
    }

    /// A raw-packet RSS QP spreading received frames over `table` by the Toeplitz hash of
    /// `fields` (`IBV_RX_HASH_*`) with `key`.
    ///
    /// # Errors
    /// `ibv_create_qp_ex` failed.
    pub fn rss(
        domain: &Domain,
        table: &Arc<IndTable>,
        key: &[u8; 40],
        fields: u64,
        what: String,
    ) -> Result<Arc<Self>, VerbsError> {
        use rdma_sys::ibv_qp_init_attr_mask as m;
        let mut key = *key;
        // SAFETY: all-zero is a valid init attr.
        let mut attr: rdma_sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RAW_PACKET;
        attr.comp_mask =
            (m::IBV_QP_INIT_ATTR_PD | m::IBV_QP_INIT_ATTR_IND_TABLE | m::IBV_QP_INIT_ATTR_RX_HASH)
                .0;
        attr.pd = domain.as_ptr();
        attr.rwq_ind_tbl = table.ptr.as_ptr();
        attr.rx_hash_conf.rx_hash_function =
            rdma_sys::ibv_rx_hash_function_flags::IBV_RX_HASH_FUNC_TOEPLITZ.0 as u8;
        attr.rx_hash_conf.rx_hash_key_len = key.len() as u8;
        attr.rx_hash_conf.rx_hash_key = key.as_mut_ptr();
        attr.rx_hash_conf.rx_hash_fields_mask = fields;
        // SAFETY: context, domain and table are live; `attr` and the key it points to are
        // initialised and outlive the call (the provider copies the key).
        let p = unsafe { inl::ibv_create_qp_ex(domain.context().as_ptr(), &mut attr) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_qp_ex", what.clone(), errno()))?;
        Ok(Arc::new(Self {
            ptr,
            _domain: domain.clone(),
            _cq: None,
            _table: Some(Arc::clone(table)),
            what,
        }))
    }

    /// A raw-packet send QP created with `ibv_create_qp_ex` (what mlx5 needs for TSO):
    /// `max_send_wr` WQEs of `max_send_sge` SGEs, room for `max_tso_header` header bytes
    /// (0: no TSO), no receive side, completing on `cq`.
    ///
    /// # Errors
    /// `ibv_create_qp_ex` failed.
    pub fn raw_packet_ex(
        domain: &Domain,
        cq: &Arc<Cq>,
        max_send_wr: u32,
        max_send_sge: u32,
        max_tso_header: u16,
        what: String,
    ) -> Result<Arc<Self>, VerbsError> {
        use rdma_sys::ibv_qp_init_attr_mask as m;
        // SAFETY: all-zero is a valid init attr.
        let mut attr: rdma_sys::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RAW_PACKET;
        attr.send_cq = cq.as_ptr();
        attr.recv_cq = cq.as_ptr();
        attr.cap.max_send_wr = max_send_wr;
        attr.cap.max_send_sge = max_send_sge;
        attr.pd = domain.as_ptr();
        attr.comp_mask = m::IBV_QP_INIT_ATTR_PD.0;
        if max_tso_header > 0 {
            attr.comp_mask |= m::IBV_QP_INIT_ATTR_MAX_TSO_HEADER.0;
            attr.max_tso_header = max_tso_header;
        }
        // SAFETY: context, domain and CQ are live; `attr` is initialised.
        let p = unsafe { inl::ibv_create_qp_ex(domain.context().as_ptr(), &mut attr) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_qp_ex", what.clone(), errno()))?;
        Ok(Arc::new(Self {
            ptr,
            _domain: domain.clone(),
            _cq: Some(Arc::clone(cq)),
            _table: None,
            what,
        }))
    }

    /// The QP number the kernel assigned.
    pub fn number(&self) -> u32 {
        // SAFETY: the QP is live while `self` exists.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// The raw QP.
    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.ptr.as_ptr()
    }

    /// What the QP is, for messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Moves the QP to `state` (`ibv_modify_qp` with `IBV_QP_STATE`, plus `IBV_QP_PORT` with
    /// `port` when going to INIT), as a raw-packet QP needs: RESET→INIT→RTR→RTS, and any
    /// state→RESET for error recovery.
    ///
    /// # Errors
    /// The call failed (MANA v44 refuses every modification with `EOPNOTSUPP`).
    pub fn modify_state(
        &self,
        state: rdma_sys::ibv_qp_state::Type,
        port: u8,
    ) -> Result<(), VerbsError> {
        use rdma_sys::ibv_qp_attr_mask as m;
        // SAFETY: all-zero is a valid attr.
        let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = m::IBV_QP_STATE;
        if state == rdma_sys::ibv_qp_state::IBV_QPS_INIT {
            attr.port_num = port;
            mask |= m::IBV_QP_PORT;
        }
        // SAFETY: the QP is live; `attr` is initialised and the mask names what is set.
        let ret = unsafe { rdma_sys::ibv_modify_qp(self.ptr.as_ptr(), &mut attr, mask.0 as i32) };
        if ret != 0 {
            return Err(VerbsError::new(
                "ibv_modify_qp",
                format!("{} to state {state}", self.what),
                ret_errno(ret),
            ));
        }
        Ok(())
    }
}

/// A steering rule (`ibv_create_flow`) sending matching frames to a QP; removed on drop.
pub struct Flow {
    ptr: NonNull<rdma_sys::ibv_flow>,
    _qp: Arc<Qp>,
    what: String,
}

// SAFETY: as for `Pd`.
unsafe impl Send for Flow {}
// SAFETY: as for `Pd`.
unsafe impl Sync for Flow {}

/// What a steering rule matches on the destination MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowMatch {
    /// Frames whose destination MAC equals these bytes (masked by `mask`).
    Dst {
        /// Value.
        mac: [u8; 6],
        /// Mask.
        mask: [u8; 6],
    },
}

/// The traffic type a steering rule matches beyond the MAC: an IP family (any addresses)
/// and an L4 protocol (any ports), each `None` for any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowProto {
    /// `Some(false)` IPv4 (an `ibv_flow_spec_ipv4`), `Some(true)` IPv6 (`ibv_flow_spec_ipv6`).
    pub ipv6: Option<bool>,
    /// 6 TCP, 17 UDP (an `ibv_flow_spec_tcp_udp` of that type).
    pub l4: Option<u8>,
}

impl Flow {
    /// A rule on port `port` of `qp` for the frames `m` selects (one `ibv_flow_spec_eth`,
    /// priority 0, normal rule; all-zero value and mask is promiscuous, as DPDK does).
    ///
    /// # Errors
    /// `ibv_create_flow` failed.
    pub fn eth(qp: &Arc<Qp>, port: u8, m: FlowMatch) -> Result<Self, VerbsError> {
        Self::new(qp, port, m, FlowProto::default(), 0)
    }

    /// A normal rule on port `port` of `qp` at `priority` (lower is matched first) for the
    /// frames `m` selects that are also of traffic type `proto`: an `ibv_flow_spec_eth`,
    /// then, as `proto` asks, an all-zero-mask IPv4 or IPv6 spec (the frame is of that
    /// family) and an all-zero-mask TCP or UDP spec (of that protocol).
    ///
    /// # Errors
    /// `ibv_create_flow` failed.
    pub fn new(
        qp: &Arc<Qp>,
        port: u8,
        m: FlowMatch,
        proto: FlowProto,
        priority: u16,
    ) -> Result<Self, VerbsError> {
        use rdma_sys::ibv_flow_spec_type as t;
        use std::mem::size_of;
        let FlowMatch::Dst { mac, mask } = m;
        let what = format!(
            "flow rule dst {} / {}{}{} on {}",
            fmt_mac(&mac),
            fmt_mac(&mask),
            match proto.ipv6 {
                Some(false) => " ipv4",
                Some(true) => " ipv6",
                None => "",
            },
            match proto.l4 {
                Some(6) => " tcp",
                Some(17) => " udp",
                _ => "",
            },
            qp.what
        );
        // The attribute and its specs back to back, as `ibv_create_flow` walks them (each
        // spec by its own `size`), in 8-byte aligned storage.
        let mut buf = [0u64; 32];
        let mut at = size_of::<rdma_sys::ibv_flow_attr>();
        let mut specs = 0u8;
        let base = buf.as_mut_ptr().cast::<u8>();
        let cap = std::mem::size_of_val(&buf);
        let mut push = |at: &mut usize, spec: Spec| {
            let n = match spec {
                Spec::Eth(_) => size_of::<rdma_sys::ibv_flow_spec_eth>(),
                Spec::V4(_) => size_of::<rdma_sys::ibv_flow_spec_ipv4>(),
                Spec::V6(_) => size_of::<rdma_sys::ibv_flow_spec_ipv6>(),
                Spec::L4(_) => size_of::<rdma_sys::ibv_flow_spec_tcp_udp>(),
            };
            assert!(*at + n <= cap, "flow rule too long");
            // SAFETY: in bounds of `buf` (asserted); an unaligned typed write of a
            // plain-data spec (its padding is never read here).
            unsafe {
                let p = base.add(*at);
                match spec {
                    Spec::Eth(v) => p.cast::<rdma_sys::ibv_flow_spec_eth>().write_unaligned(v),
                    Spec::V4(v) => p.cast::<rdma_sys::ibv_flow_spec_ipv4>().write_unaligned(v),
                    Spec::V6(v) => p.cast::<rdma_sys::ibv_flow_spec_ipv6>().write_unaligned(v),
                    Spec::L4(v) => p
                        .cast::<rdma_sys::ibv_flow_spec_tcp_udp>()
                        .write_unaligned(v),
                }
            }
            *at += n;
            specs += 1;
        };
        // SAFETY: all-zero is a valid spec of each of these plain-data types.
        let mut eth: rdma_sys::ibv_flow_spec_eth = unsafe { std::mem::zeroed() };
        eth.type_ = t::IBV_FLOW_SPEC_ETH;
        eth.size = size_of::<rdma_sys::ibv_flow_spec_eth>() as u16;
        eth.val.dst_mac = mac;
        eth.mask.dst_mac = mask;
        push(&mut at, Spec::Eth(eth));
        match proto.ipv6 {
            Some(false) => {
                // SAFETY: as above.
                let mut ip: rdma_sys::ibv_flow_spec_ipv4 = unsafe { std::mem::zeroed() };
                ip.type_ = t::IBV_FLOW_SPEC_IPV4;
                ip.size = size_of::<rdma_sys::ibv_flow_spec_ipv4>() as u16;
                push(&mut at, Spec::V4(ip));
            }
            Some(true) => {
                // SAFETY: as above.
                let mut ip: rdma_sys::ibv_flow_spec_ipv6 = unsafe { std::mem::zeroed() };
                ip.type_ = t::IBV_FLOW_SPEC_IPV6;
                ip.size = size_of::<rdma_sys::ibv_flow_spec_ipv6>() as u16;
                push(&mut at, Spec::V6(ip));
            }
            None => {}
        }
        if let Some(p) = proto.l4 {
            // SAFETY: as above.
            let mut l4: rdma_sys::ibv_flow_spec_tcp_udp = unsafe { std::mem::zeroed() };
            l4.type_ = if p == 6 {
                t::IBV_FLOW_SPEC_TCP
            } else {
                t::IBV_FLOW_SPEC_UDP
            };
            l4.size = size_of::<rdma_sys::ibv_flow_spec_tcp_udp>() as u16;
            push(&mut at, Spec::L4(l4));
        }
        // SAFETY: all-zero is a valid attribute.
        let mut attr: rdma_sys::ibv_flow_attr = unsafe { std::mem::zeroed() };
        attr.type_ = rdma_sys::ibv_flow_attr_type::IBV_FLOW_ATTR_NORMAL;
        attr.size = at as u16;
        attr.priority = priority;
        attr.num_of_specs = specs;
        attr.port = port;
        // SAFETY: the attribute at offset 0 of the 8-byte aligned buffer, which it fits.
        unsafe { base.cast::<rdma_sys::ibv_flow_attr>().write(attr) };
        // SAFETY: the QP is live; the attribute and its specs lie back to back in `buf` as
        // `ibv_create_flow` reads them (`attr.size` covers them all).
        let p = unsafe { inl::ibv_create_flow(qp.as_ptr(), base.cast()) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| VerbsError::new("ibv_create_flow", what.clone(), errno()))?;
        Ok(Self {
            ptr,
            _qp: Arc::clone(qp),
            what,
        })
    }
}

/// One spec of a flow rule being laid out.
enum Spec {
    Eth(rdma_sys::ibv_flow_spec_eth),
    V4(rdma_sys::ibv_flow_spec_ipv4),
    V6(rdma_sys::ibv_flow_spec_ipv6),
    L4(rdma_sys::ibv_flow_spec_tcp_udp),
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl Drop for Flow {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once, before the QP it holds.
        let ret = unsafe { inl::ibv_destroy_flow(self.ptr.as_ptr()) };
        log_destroy("ibv_destroy_flow", &self.what, ret);
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; nothing is created on a QP.
        let ret = unsafe { ibv_destroy_qp(self.ptr.as_ptr()) };
        log_destroy("ibv_destroy_qp", &self.what, ret);
    }
}

/// `ibv_fork_init()`: 0 or an errno value.
pub(crate) fn fork_init() -> i32 {
    // SAFETY: no arguments; rdma-core serialises it internally.
    unsafe { rdma_sys::ibv_fork_init() }
}

/// `ibv_is_fork_initialized()`.
pub(crate) fn fork_status() -> rdma_sys::ibv_fork_status {
    // SAFETY: no arguments; reads rdma-core's process state.
    unsafe { rdma_sys::ibv_is_fork_initialized() }
}

/// Whether the process can resolve `name` (a NUL-terminated symbol) in the libraries loaded,
/// as `dlsym(RTLD_DEFAULT, ..)` sees them.
pub(crate) fn has_symbol(name: &CStr) -> bool {
    // SAFETY: `name` is NUL-terminated; `dlsym` only looks the symbol up.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }.is_null()
}

/// A queue's kick through the fake rdma-core ([`Context::fake_kick`]).
struct FakeKick(crate::sys::fake_kick::Handle);

impl crate::ethdev::DeviceKick for FakeKick {
    #[inline]
    fn kick(&self) {
        self.0.kick();
    }
}
