//! Protection domains, parent domains and memory regions, for every provider: the
//! exported `ibv_alloc_pd`, `ibv_dealloc_pd`, `ibv_reg_mr*` and `ibv_dereg_mr` with
//! libibverbs' bookkeeping, the uverbs core's use counts (`EBUSY`), and what differs by
//! provider (MANA's and mlx5's parent domains, their MR access checks).
//!
//! Citations: `v44 FILE:LINE` is rdma-core tag v44.0; kernel rules name the function of
//! `drivers/infiniband/core` or the provider's kernel driver they copy.

use crate::ffi::*;
use crate::objects::{ctx_of_obj, mapped, obj};
use crate::state::{addr, call_int, call_ptr, Kind, State};
use crate::verbs::ctx_of;
use crate::world::Family;
use serde_json::json;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

/// `IBV_ACCESS_OPTIONAL_RANGE` = `IB_UVERBS_ACCESS_OPTIONAL_RANGE`: bits 20..29
/// (ib_user_ioctl_verbs.h:44, 62–64).
const ACCESS_OPTIONAL_RANGE: u32 = ((1 << 30) - 1) & !((1 << 20) - 1);

/// A parent domain's buffer allocator (`ibv_parent_domain_init_attr.alloc`).
pub type PdAlloc = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
/// A parent domain's buffer release (`ibv_parent_domain_init_attr.free`).
pub type PdFree = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

/// A protection domain or a parent domain (`struct mana_pd` / `mana_parent_domain`, v44
/// providers/mana/mana.h:96–110; `struct mlx5_pd` / `mlx5_parent_domain`, v44
/// providers/mlx5/mlx5.h).
#[repr(C)]
pub struct Pd {
    /// What callers hold.
    pub pd: ibv_pd,
    /// For a parent domain, the PD it was made from (`mprotection_domain`); NULL for a PD.
    pub of: *mut Pd,
    /// The parent domain's `pd_context` (MANA reads it as the IB port; mlx5 hands it to the
    /// parent domain's allocator).
    pub pd_context: *mut c_void,
    /// Kernel users (MRs, QPs, WQs) of a PD.
    pub users: u32,
    /// mlx5's user-space reference count above the first (`mpd.refcount - 1`): parent
    /// domains made from a PD; queues created with a parent domain.
    pub refs: u32,
    /// mlx5 parent domain allocators (`IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`): used only
    /// when both are set (v44 providers/mlx5/buf.c:392–397, `mlx5_is_custom_alloc`).
    pub alloc: Option<PdAlloc>,
    /// See [`Pd::alloc`].
    pub free: Option<PdFree>,
}

impl Pd {
    /// A PD (`of` NULL) or a parent domain of `of`.
    pub fn new(pd: ibv_pd, of: *mut Pd, pd_context: *mut c_void) -> Self {
        Pd {
            pd,
            of,
            pd_context,
            users: 0,
            refs: 0,
            alloc: None,
            free: None,
        }
    }

    /// Whether this is a parent domain.
    pub fn is_parent(&self) -> bool {
        !self.of.is_null()
    }
}

/// A memory region.
#[repr(C)]
pub struct Mr {
    /// What callers hold.
    pub mr: ibv_mr,
    /// The kernel PD it counts on.
    pub pd: *mut Pd,
    /// Registered with `IBV_ACCESS_ON_DEMAND`: libibverbs leaves its range's fork marking
    /// alone (v44 verbs.c:314, 492).
    pub odp: bool,
}

/// The kernel PD behind a PD or parent domain.
pub fn real_pd(p: &mut Pd) -> &'static mut Pd {
    let raw: *mut Pd = if p.of.is_null() { p } else { p.of };
    // SAFETY: `p` is live, and a parent domain's `of` is a PD, which cannot be deallocated
    // while the parent exists on mlx5 (EBUSY) and which the caller keeps on MANA (as
    // rdma-core does not check it either).
    unsafe { &mut *raw }
}

export!("IBVERBS_1.1" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    call_ptr("ibv_alloc_pd", json!({"context": addr(context)}), |st| {
        let _ = ctx_of(st, context, "ibv_alloc_pd");
        // mana_alloc_pd / mlx5_alloc_pd: kernel error → errno (v44 providers/mana/mana.c:68–89,
        // providers/mlx5/verbs.c:140–161); libibverbs sets pd->context (v44 verbs.c:290–301).
        st.kernel(context, "ibv_alloc_pd")?;
        let handle = st.next_id();
        let p = Box::into_raw(Box::new(Pd::new(ibv_pd { context, handle }, null_mut(), null_mut())));
        st.register(p as usize, Kind::Pd, context as usize);
        Ok(p.cast::<ibv_pd>())
    })
});

export!("IBVERBS_1.1" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    call_int("ibv_dealloc_pd", json!({"pd": addr(pd)}), |st| {
        let family = ctx_of_obj(st, pd, &[Kind::Pd, Kind::ParentDomain], "ibv_dealloc_pd").family;
        let p = obj(st, pd.cast::<Pd>(), &[Kind::Pd, Kind::ParentDomain], "ibv_dealloc_pd");
        let mlx5 = matches!(family, Family::Mlx5 { .. });
        if p.is_parent() {
            // MANA: freed in user space, 0 (v44 providers/mana/mana.c:127–150). mlx5: EBUSY
            // while a queue uses it, then its PD's count drops (v44 providers/mlx5/verbs.c:
            // 562–574, mlx5_dealloc_parent_domain).
            if mlx5 {
                if p.refs > 0 {
                    return Err(libc::EBUSY);
                }
                // SAFETY: the PD outlives its parent domains on mlx5 (EBUSY below).
                unsafe { (*p.of).refs -= 1 };
            }
            st.unregister(pd as usize);
            // SAFETY: unregistered above; freed once.
            drop(unsafe { Box::from_raw(p as *mut Pd) });
            return Ok(0);
        }
        // mlx5_free_pd: EBUSY from user space while parent domains hold it (v44
        // providers/mlx5/verbs.c:589–590).
        if mlx5 && p.refs > 0 {
            return Err(libc::EBUSY);
        }
        // A disassociated context: the kernel deallocated the PD already and lets the
        // command through (State::disassociated).
        if !st.disassociated(p.pd.context) {
            // uverbs_free_pd: EBUSY while an MR, QP or WQ uses it.
            if p.users > 0 {
                return Err(libc::EBUSY);
            }
            st.kernel(p.pd.context, "ibv_dealloc_pd")?;
        }
        st.unregister(pd as usize);
        // SAFETY: as above.
        drop(unsafe { Box::from_raw(p as *mut Pd) });
        Ok(0)
    })
});

/// `ibv_reg_mr_iova2` (v44 verbs.c:310–336): libibverbs first puts a non-ODP range through
/// `ibv_dontfork_range` (after `ibv_fork_init`: `MADV_DONTFORK`; before it: `ibv_fork_init`
/// fails from now on), and a failure there is NULL with its errno (l. 320–321); a
/// failure of the provider gives the range back (`ibv_dofork_range`, l. 329–331).
fn reg_mr(
    st: &mut State,
    pd: *mut ibv_pd,
    a: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<*mut ibv_mr, c_int> {
    let odp = access & IBV_ACCESS_ON_DEMAND != 0;
    if !odp {
        crate::fork::dontfork_range(a, length)?;
    }
    let r = provider_reg_mr(st, pd, a, length, iova, access);
    if r.is_err() && !odp {
        crate::fork::dofork_range(a, length);
    }
    r
}

/// The provider's `reg_mr` and the kernel's checks, behind [`reg_mr`].
fn provider_reg_mr(
    st: &mut State,
    pd: *mut ibv_pd,
    a: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<*mut ibv_mr, c_int> {
    let ctx = ctx_of_obj(st, pd, &[Kind::Pd, Kind::ParentDomain], "ibv_reg_mr");
    let family = ctx.family;
    let dev = ctx.device().index;
    let p = obj(
        st,
        pd.cast::<Pd>(),
        &[Kind::Pd, Kind::ParentDomain],
        "ibv_reg_mr",
    );
    let context = p.pd.context;
    st.kernel(context, "ibv_reg_mr")?;
    // The uverbs core (ib_check_mr_access): remote write or atomic access needs local write
    // (EINVAL).
    let remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if access & remote != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return Err(libc::EINVAL);
    }
    let valid = match family {
        // mana_ib_reg_user_mr: access ⊄ VALID_MR_FLAGS → EINVAL.
        Family::Mana => {
            IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_ATOMIC
                | IBV_ACCESS_MW_BIND
                | IBV_ACCESS_ZERO_BASED
        }
        // ib_check_mr_access: access ⊄ IB_ACCESS_SUPPORTED (the flags up to HUGETLB, and
        // the optional range) → EINVAL.
        Family::Mlx5 { .. } => 0xff | ACCESS_OPTIONAL_RANGE,
    };
    if access & !valid != 0 || length == 0 {
        return Err(libc::EINVAL);
    }
    // ib_umem_get: the range must be mapped (EFAULT).
    mapped(a, length)?;
    let real = real_pd(p);
    real.users += 1;
    let key = 0x300 + st.next_id();
    // libibverbs sets context, pd, addr, length (v44 verbs.c:324–328); the command sets
    // handle, lkey, rkey (cmd.c:130–135).
    let m = Box::into_raw(Box::new(Mr {
        mr: ibv_mr {
            context,
            pd,
            addr: a,
            length,
            handle: key,
            lkey: key,
            rkey: key,
        },
        pd: real,
        odp: access & IBV_ACCESS_ON_DEMAND != 0,
    }));
    // The NIC can now reach the region through WQE addresses iova.. under the key.
    match family {
        Family::Mana => st
            .nics
            .add_mr(dev, context as usize, key, iova, a as usize, length),
        Family::Mlx5 { .. } => {
            st.mlx5_nics
                .add_mr(dev, context as usize, key, iova, a as usize, length)
        }
    }
    st.register(m as usize, Kind::Mr, context as usize);
    Ok(m.cast::<ibv_mr>())
}

export!("IBVERBS_1.1" fn ibv_reg_mr(pd: *mut ibv_pd, a: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    call_ptr("ibv_reg_mr", json!({"pd": addr(pd), "addr": addr(a), "length": length, "access": access}), |st| {
        reg_mr(st, pd, a, length, a as u64, access as u32)
    })
});

export!("IBVERBS_1.7" fn ibv_reg_mr_iova(pd: *mut ibv_pd, a: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
    call_ptr("ibv_reg_mr_iova", json!({"pd": addr(pd), "addr": addr(a), "length": length, "iova": iova, "access": access}), |st| {
        reg_mr(st, pd, a, length, iova, access as u32)
    })
});

export!("IBVERBS_1.8" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, a: *mut c_void, length: usize, iova: u64, access: u32) -> *mut ibv_mr {
    call_ptr("ibv_reg_mr_iova2", json!({"pd": addr(pd), "addr": addr(a), "length": length, "iova": iova, "access": access}), |st| {
        reg_mr(st, pd, a, length, iova, access)
    })
});

/// Takes an MR off the NIC of its device (at `ibv_dereg_mr`, or when its context closes).
pub fn forget_mr(st: &mut State, m: &Mr) {
    st.nics.remove_mr(m.mr.lkey);
    st.mlx5_nics.remove_mr(m.mr.lkey);
}

export!("IBVERBS_1.1" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    call_int("ibv_dereg_mr", json!({"mr": addr(mr)}), |st| {
        let m = obj(st, mr.cast::<Mr>(), &[Kind::Mr], "ibv_dereg_mr");
        // A disassociated context: the kernel deregistered the region already (the NIC let
        // go of it), and its PD may be gone.
        if !st.disassociated(m.mr.context) {
            st.kernel(m.mr.context, "ibv_dereg_mr")?;
            // The NIC loses the region before ibv_dereg_mr returns (and the memory may go).
            forget_mr(st, m);
            // SAFETY: `m.pd` is the live PD counted at registration.
            unsafe { (*m.pd).users -= 1 };
        }
        // libibverbs after the provider's success (v44 verbs.c:492–493): a non-ODP range
        // goes through ibv_dofork_range.
        if !m.odp {
            crate::fork::dofork_range(m.mr.addr, m.mr.length);
        }
        st.unregister(mr as usize);
        // SAFETY: unregistered above; freed once.
        drop(unsafe { Box::from_raw(m as *mut Mr) });
        Ok(0)
    })
});
